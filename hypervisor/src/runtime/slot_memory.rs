//! A VM's RAM for its virtio devices: [`GuestMemory`] over one published
//! view of the VM's memslots.
//!
//! # Translation
//!
//! Every guest-physical address a device is handed is looked up in the
//! memslot set, page by page run: the slot that holds the first byte
//! translates the stretch up to the slot's end (a slot's backing is
//! host-contiguous), the next slot the rest. A byte in no slot (a hole, a
//! device window, past the end of RAM) refuses the whole access before any
//! byte moves, and so does a write into a read-only slot. The host address
//! of a translated byte is a pointer of the hypervisor's identity map at
//! EL2 (of a host allocation on the host tests' fake machine).
//!
//! # Lifetime and dirty pages
//!
//! The set is borrowed under an epoch guard the caller holds for the whole
//! device operation: a slot deleted meanwhile keeps its backing until the
//! guard drops, so a copy never lands in freed memory. Each page a write
//! touches (and each page of a span handed out for a device's direct write)
//! is marked in the slot's dirty bitmap when the slot logs, so dirty
//! logging and live migration see device writes like vCPU writes.
//!
//! # Never an earlier owner's bytes
//!
//! Each host stretch goes through the caller's `ensure_zeroed` before a
//! byte of it is read, written or handed out for a direct write: the VM's
//! boot RAM is zeroed 2 MiB at a time on first use (`vm::lazy_zero`), and a
//! device may be the first to touch a chunk (a receive buffer the guest
//! never wrote, a disk read landing in pages it never touched).
//!
//! # Ring indices are single accesses
//!
//! The guest's driver updates a ring's index (`avail.idx`) while a device
//! reads it on another CPU, and reads `used.idx` while a device writes it.
//! A byte-wise copy could see half of an old and half of a new index (the
//! low byte before a carry, the high byte after), so the `u16`, `u32` and
//! `u64` accessors of [`GuestMemory`] are overridden: an aligned one is one
//! volatile load or store of that width, which the architecture makes
//! single-copy atomic. (An unaligned one cannot be an index the spec
//! defines; it falls back to a copy.)
//!
//! # Caches
//!
//! The devices are described to the guest as `dma-coherent`: its driver
//! maps rings and buffers cacheable, as the hypervisor does, so copies need
//! no cache maintenance (unlike the monitor's copies into a guest whose MMU
//! may be off, see `vm_ops`).

use crate::devices::guest_memory::{GuestMemory, GuestMemoryError, HostSpan};
use alloc::vec::Vec;
use memslot::{Gfn, Memslot, MemslotSet, PAGE_SHIFT};

/// The VM's RAM through one view of its memslots.
pub struct SlotMemory<'g> {
    slots: &'g MemslotSet,
    /// Zeroes the host bytes `(addr, len)` if the VM has not used them
    /// yet (`vm::lazy_zero`), before any access reaches them.
    ensure_zeroed: &'g dyn Fn(u64, u64),
}

/// A stretch of one slot: `len` bytes at host address `host`, starting at
/// guest address `ipa`.
struct Stretch<'g> {
    slot: &'g Memslot,
    ipa: u64,
    host: u64,
    len: u64,
}

impl<'g> SlotMemory<'g> {
    /// The memory of the slots in `slots` (a view the caller's guard pins),
    /// each host stretch passed to `ensure_zeroed(addr, len)` before it is
    /// read, written or handed out.
    pub fn new(slots: &'g MemslotSet, ensure_zeroed: &'g dyn Fn(u64, u64)) -> Self {
        Self {
            slots,
            ensure_zeroed,
        }
    }

    /// Splits `len` bytes at `ipa` into per-slot stretches, or refuses the
    /// whole range.
    fn stretches(
        &self,
        ipa: u64,
        len: u64,
        writes: bool,
        mut each: impl FnMut(Stretch<'g>),
    ) -> Result<(), GuestMemoryError> {
        let end = ipa
            .checked_add(len)
            .ok_or(GuestMemoryError::Wraps { ipa, len })?;
        // Check the whole range first: nothing moves when any byte is refused.
        let mut at = ipa;
        while at < end {
            let slot = self.slot_at(at, writes)?;
            at = (slot.end_gfn().0 << PAGE_SHIFT).min(end);
        }
        let mut at = ipa;
        while at < end {
            let slot = self.slot_at(at, writes)?;
            let stop = (slot.end_gfn().0 << PAGE_SHIFT).min(end);
            let host = slot.backing().0 + (at - (slot.base_gfn().0 << PAGE_SHIFT));
            (self.ensure_zeroed)(host, stop - at);
            each(Stretch {
                slot,
                ipa: at,
                host,
                len: stop - at,
            });
            at = stop;
        }
        Ok(())
    }

    /// The host address of the naturally aligned `len`-byte value at `ipa`
    /// (`len` a power of two up to 8), or `None` when `ipa` is not aligned
    /// (an aligned value never crosses a page, hence never a slot).
    fn aligned_host(
        &self,
        ipa: u64,
        len: u64,
        writes: bool,
    ) -> Result<Option<(&'g Memslot, u64)>, GuestMemoryError> {
        if !ipa.is_multiple_of(len) {
            return Ok(None);
        }
        let slot = self.slot_at(ipa, writes)?;
        let host = slot.backing().0 + (ipa - (slot.base_gfn().0 << PAGE_SHIFT));
        (self.ensure_zeroed)(host, len);
        Ok(Some((slot, host)))
    }

    fn slot_at(&self, ipa: u64, writes: bool) -> Result<&'g Memslot, GuestMemoryError> {
        let slot = self
            .slots
            .find(Gfn::from_ipa(ipa))
            .ok_or(GuestMemoryError::NotRam { ipa })?;
        if writes && slot.is_read_only() {
            return Err(GuestMemoryError::ReadOnly { ipa });
        }
        Ok(slot)
    }
}

/// Marks every page of `[ipa, ipa + len)` dirty in `slot`'s log.
fn mark_dirty(slot: &Memslot, ipa: u64, len: u64) {
    if len == 0 {
        return;
    }
    let first = ipa >> PAGE_SHIFT;
    let last = (ipa + len - 1) >> PAGE_SHIFT;
    for gfn in first..=last {
        slot.mark_dirty(Gfn(gfn));
    }
}

impl GuestMemory for SlotMemory<'_> {
    fn read(&self, ipa: u64, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        self.stretches(ipa, buf.len() as u64, false, |s| {
            let len = s.len as usize;
            // SAFETY: `s.host` is the backing of a slot of the pinned view
            // (kept alive by the caller's guard), identity mapped, and
            // `len` bytes of it lie inside that slot; `buf[done..]` has at
            // least `len` bytes left because the stretches add up to
            // `buf.len()`. Guest memory may change under the copy (another
            // vCPU); the copy reads bytes, never references.
            unsafe { core::ptr::copy(s.host as *const u8, buf.as_mut_ptr().add(done), len) };
            done += len;
        })
    }

    fn write(&self, ipa: u64, buf: &[u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        self.stretches(ipa, buf.len() as u64, true, |s| {
            let len = s.len as usize;
            // SAFETY: as in `read`, the other way round; the slot is
            // writable (checked before any byte moved).
            unsafe { core::ptr::copy(buf.as_ptr().add(done), s.host as *mut u8, len) };
            mark_dirty(s.slot, s.ipa, s.len);
            done += len;
        })
    }

    fn read_u16(&self, ipa: u64) -> Result<u16, GuestMemoryError> {
        match self.aligned_host(ipa, 2, false)? {
            // SAFETY: an aligned u16 of a slot's backing (see `read`); one
            // volatile load, single-copy atomic.
            Some((_, host)) => Ok(u16::from_le(unsafe {
                core::ptr::read_volatile(host as *const u16)
            })),
            None => {
                let mut b = [0; 2];
                self.read(ipa, &mut b)?;
                Ok(u16::from_le_bytes(b))
            }
        }
    }

    fn read_u32(&self, ipa: u64) -> Result<u32, GuestMemoryError> {
        match self.aligned_host(ipa, 4, false)? {
            // SAFETY: as in `read_u16`, four bytes.
            Some((_, host)) => Ok(u32::from_le(unsafe {
                core::ptr::read_volatile(host as *const u32)
            })),
            None => {
                let mut b = [0; 4];
                self.read(ipa, &mut b)?;
                Ok(u32::from_le_bytes(b))
            }
        }
    }

    fn read_u64(&self, ipa: u64) -> Result<u64, GuestMemoryError> {
        match self.aligned_host(ipa, 8, false)? {
            // SAFETY: as in `read_u16`, eight bytes.
            Some((_, host)) => Ok(u64::from_le(unsafe {
                core::ptr::read_volatile(host as *const u64)
            })),
            None => {
                let mut b = [0; 8];
                self.read(ipa, &mut b)?;
                Ok(u64::from_le_bytes(b))
            }
        }
    }

    fn write_u16(&self, ipa: u64, value: u16) -> Result<(), GuestMemoryError> {
        match self.aligned_host(ipa, 2, true)? {
            Some((slot, host)) => {
                // SAFETY: an aligned u16 of a writable slot's backing (see
                // `write`); one volatile store, single-copy atomic.
                unsafe { core::ptr::write_volatile(host as *mut u16, value.to_le()) };
                mark_dirty(slot, ipa, 2);
                Ok(())
            }
            None => self.write(ipa, &value.to_le_bytes()),
        }
    }

    fn write_u32(&self, ipa: u64, value: u32) -> Result<(), GuestMemoryError> {
        match self.aligned_host(ipa, 4, true)? {
            Some((slot, host)) => {
                // SAFETY: as in `write_u16`, four bytes.
                unsafe { core::ptr::write_volatile(host as *mut u32, value.to_le()) };
                mark_dirty(slot, ipa, 4);
                Ok(())
            }
            None => self.write(ipa, &value.to_le_bytes()),
        }
    }

    fn host_spans(
        &self,
        ipa: u64,
        len: u64,
        device_writes: bool,
        out: &mut Vec<HostSpan>,
    ) -> Result<(), GuestMemoryError> {
        self.stretches(ipa, len, device_writes, |s| {
            if device_writes {
                mark_dirty(s.slot, s.ipa, s.len);
            }
            out.push(HostSpan {
                addr: s.host,
                len: s.len,
            });
        })
    }

    fn device_wrote(&self, spans: &[HostSpan]) {
        // Marked again after the write: a harvest of the log between
        // `host_spans` and the write must not leave the page clean.
        for span in spans {
            let end = span.addr.saturating_add(span.len);
            for slot in self.slots.iter() {
                let base = slot.backing().0;
                let top = base + (slot.npages() << PAGE_SHIFT);
                if span.addr >= base && end <= top {
                    let ipa = (slot.base_gfn().0 << PAGE_SHIFT) + (span.addr - base);
                    mark_dirty(slot, ipa, span.len);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_epoch::Collector;
    use memslot::{DirtyLogMode, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec};

    const PAGE: u64 = 1 << PAGE_SHIFT;

    /// Host memory for slots: page-aligned, leaked for the test's life.
    fn backing(pages: u64) -> u64 {
        let layout = std::alloc::Layout::from_size_align((pages * PAGE) as usize, PAGE as usize)
            .expect("layout");
        // SAFETY: a nonzero layout; the memory is leaked on purpose.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        ptr as u64
    }

    /// Slot 0: 4 pages at IPA 0x1000_0000 (logging); slot 1: 2 pages right
    /// after it on a separate backing (read-only when `ro`); a hole, then
    /// slot 2: 1 page at 0x1001_0000.
    fn memslots(ro: bool) -> (Memslots, [u64; 3], &'static Collector) {
        let collector: &'static Collector = Box::leak(Box::new(Collector::new()));
        let slots = Memslots::new(collector, DirtyLogMode::default()).expect("memslots");
        let handle = collector.register();
        let backings = [backing(4), backing(2), backing(1)];
        let specs = [
            (0, 0x1000_0000, 4, SlotFlags::LOG_DIRTY),
            (
                1,
                0x1000_4000,
                2,
                if ro {
                    SlotFlags::READ_ONLY
                } else {
                    SlotFlags::NONE
                },
            ),
            (2, 0x1001_0000, 1, SlotFlags::LOG_DIRTY),
        ];
        for ((id, ipa, npages, flags), back) in specs.into_iter().zip(backings) {
            slots
                .create(
                    &handle,
                    SlotSpec {
                        id: SlotId::new(id).expect("id"),
                        base_gfn: Gfn::from_ipa(ipa),
                        npages,
                        backing: HostPhysAddr(back),
                        flags,
                    },
                )
                .expect("create");
        }
        (slots, backings, collector)
    }

    fn dirty(slots: &MemslotSet, id: u32, page: u64) -> bool {
        let slot = slots.get(SlotId::new(id).expect("id")).expect("slot");
        slot.dirty_bitmap().expect("logging").is_dirty(page)
    }

    #[test]
    fn a_buffer_across_two_slots_is_served_piecewise() {
        let (memslots, backings, collector) = memslots(false);
        let handle = collector.register();
        let guard = handle.pin();
        let set = memslots.slots(&guard).expect("view");
        let memory = SlotMemory::new(set, &|_, _| ());
        let bytes: Vec<u8> = (0..64u8).collect();
        memory.write(0x1000_4000 - 32, &bytes).expect("write");
        let mut back = [0u8; 64];
        memory.read(0x1000_4000 - 32, &mut back).expect("read");
        assert_eq!(&back[..], &bytes[..]);
        // The two halves sit in the two slots' own backings.
        // SAFETY: both addresses lie in the leaked backings.
        unsafe {
            assert_eq!(*((backings[0] + 4 * PAGE - 32) as *const u8), 0);
            assert_eq!(*(backings[1] as *const u8), 32);
        }
        let mut spans = Vec::new();
        memory
            .host_spans(0x1000_4000 - 32, 64, false, &mut spans)
            .expect("spans");
        assert_eq!(
            spans,
            [
                HostSpan {
                    addr: backings[0] + 4 * PAGE - 32,
                    len: 32
                },
                HostSpan {
                    addr: backings[1],
                    len: 32
                }
            ]
        );
    }

    #[test]
    fn holes_read_only_slots_and_wraps_refuse_the_whole_access() {
        let (memslots, backings, collector) = memslots(true);
        let handle = collector.register();
        let guard = handle.pin();
        let set = memslots.slots(&guard).expect("view");
        let memory = SlotMemory::new(set, &|_, _| ());
        // Runs from slot 1 into the hole after it.
        let mut buf = [0u8; 16];
        assert_eq!(
            memory.read(0x1000_6000 - 8, &mut buf),
            Err(GuestMemoryError::NotRam { ipa: 0x1000_6000 })
        );
        // A device window (the PL011's) is not RAM.
        assert_eq!(
            memory.read(0x0900_0000, &mut buf),
            Err(GuestMemoryError::NotRam { ipa: 0x0900_0000 })
        );
        // A write starting in slot 0 and running into read-only slot 1
        // moves nothing, not even slot 0's part.
        assert_eq!(
            memory.write(0x1000_4000 - 8, &[0xff; 16]),
            Err(GuestMemoryError::ReadOnly { ipa: 0x1000_4000 })
        );
        // SAFETY: inside slot 0's leaked backing.
        assert_eq!(unsafe { *((backings[0] + 4 * PAGE - 8) as *const u8) }, 0);
        assert!(!dirty(set, 0, 3), "a refused write marks nothing");
        let mut spans = Vec::new();
        assert_eq!(
            memory.host_spans(0x1000_4000, 8, true, &mut spans),
            Err(GuestMemoryError::ReadOnly { ipa: 0x1000_4000 })
        );
        assert!(spans.is_empty());
        assert_eq!(
            memory.read(u64::MAX - 3, &mut buf),
            Err(GuestMemoryError::Wraps {
                ipa: u64::MAX - 3,
                len: 16
            })
        );
        // Reading a read-only slot is fine.
        memory
            .read(0x1000_4000, &mut buf)
            .expect("read-only slot reads");
    }

    #[test]
    fn ring_indices_are_read_and_written_whole_aligned_or_not() {
        let (memslots, backings, collector) = memslots(false);
        let handle = collector.register();
        let guard = handle.pin();
        let set = memslots.slots(&guard).expect("view");
        let memory = SlotMemory::new(set, &|_, _| ());
        memory.write_u16(0x1000_0002, 0x66ff).expect("aligned");
        memory.write_u32(0x1000_0004, 0x1234_5678).expect("aligned");
        assert_eq!(memory.read_u16(0x1000_0002), Ok(0x66ff));
        assert_eq!(memory.read_u32(0x1000_0004), Ok(0x1234_5678));
        assert_eq!(memory.read_u64(0x1000_0000), Ok(0x1234_5678_66ff_0000));
        // SAFETY: inside slot 0's leaked backing.
        let low = unsafe { *((backings[0] + 2) as *const u8) };
        assert_eq!(low, 0xff, "little-endian");
        assert!(dirty(set, 0, 0));
        // Unaligned: the byte copy, across the slot boundary too.
        memory
            .write_u16(0x1000_4000 - 1, 0xabcd)
            .expect("unaligned");
        assert_eq!(memory.read_u16(0x1000_4000 - 1), Ok(0xabcd));
        assert_eq!(
            memory.read_u16(0x0900_0000),
            Err(GuestMemoryError::NotRam { ipa: 0x0900_0000 })
        );
    }

    #[test]
    fn device_writes_mark_every_touched_page_dirty_and_again_after_the_write() {
        let (memslots, _, collector) = memslots(false);
        let handle = collector.register();
        let guard = handle.pin();
        let set = memslots.slots(&guard).expect("view");
        let memory = SlotMemory::new(set, &|_, _| ());
        memory
            .write(PAGE - 2 + 0x1000_0000, &[1; 4])
            .expect("write");
        assert!(dirty(set, 0, 0) && dirty(set, 0, 1));
        assert!(!dirty(set, 0, 2));
        // A disk read straight into slot 2's page: marked when handed out,
        // and marked again once the device wrote (after a harvest cleared it).
        let mut spans = Vec::new();
        memory
            .host_spans(0x1001_0000, 512, true, &mut spans)
            .expect("spans");
        assert!(dirty(set, 2, 0));
        let slot2 = set.get(SlotId::new(2).expect("id")).expect("slot");
        let mut words = [0u64; 1];
        slot2
            .dirty_bitmap()
            .expect("logging")
            .take(&mut words)
            .expect("harvest");
        assert!(!dirty(set, 2, 0));
        memory.device_wrote(&spans);
        assert!(dirty(set, 2, 0), "the page holding new data is dirty again");
        // Reads mark nothing.
        memory
            .read(0x1000_0000 + 2 * PAGE, &mut [0; 8])
            .expect("read");
        assert!(!dirty(set, 0, 2));
    }

    /// Over RAM zeroed on first use: a device's read, its aligned index
    /// access and a span handed out for its write each find zeroes where an
    /// earlier owner's bytes were, and leave the chunks nobody touched as
    /// they were.
    #[test]
    fn no_access_reaches_an_earlier_owners_bytes() {
        use crate::vm::lazy_zero::{CHUNK, LazyZeroedRam};
        let chunks = 3;
        let layout = std::alloc::Layout::from_size_align((chunks * CHUNK) as usize, CHUNK as usize)
            .expect("layout");
        // SAFETY: a nonzero layout; the memory is leaked on purpose.
        let base = unsafe { std::alloc::alloc(layout) } as u64;
        assert_ne!(base, 0);
        // SAFETY: the allocation just made, whole.
        unsafe { core::ptr::write_bytes(base as *mut u8, 0xa5, (chunks * CHUNK) as usize) };
        let collector: &'static Collector = Box::leak(Box::new(Collector::new()));
        let slots = Memslots::new(collector, DirtyLogMode::default()).expect("memslots");
        let handle = collector.register();
        let ipa = 0x4000_0000;
        slots
            .create(
                &handle,
                SlotSpec {
                    id: SlotId::new(0).expect("id"),
                    base_gfn: Gfn::from_ipa(ipa),
                    npages: chunks * CHUNK / PAGE,
                    backing: HostPhysAddr(base),
                    flags: SlotFlags::NONE,
                },
            )
            .expect("create");
        let ram = LazyZeroedRam::new(base, chunks * CHUNK);
        let ensure_zeroed = |host: u64, len: u64| {
            ram.ensure(host, len, |addr, n| {
                // SAFETY: a chunk of the allocation above.
                unsafe { core::ptr::write_bytes(addr as *mut u8, 0, n) }
            })
        };
        let guard = handle.pin();
        let memory = SlotMemory::new(slots.slots(&guard).expect("view"), &ensure_zeroed);
        let mut buf = [0xffu8; 16];
        memory.read(ipa + CHUNK + 100, &mut buf).expect("read");
        assert_eq!(buf, [0; 16]);
        assert_eq!(memory.read_u16(ipa + 2 * CHUNK + 8).expect("index"), 0);
        assert_eq!(ram.pending_chunks(), 1);
        // The untouched chunk still holds the earlier bytes: nothing zeroed it.
        // SAFETY: inside the allocation.
        assert_eq!(unsafe { *((base + 5) as *const u8) }, 0xa5);
        let mut spans = Vec::new();
        memory
            .host_spans(ipa + 4 * PAGE, PAGE, true, &mut spans)
            .expect("spans");
        assert!(ram.is_finished());
        // SAFETY: inside the allocation.
        assert_eq!(unsafe { *((base + 5) as *const u8) }, 0);
    }
}
