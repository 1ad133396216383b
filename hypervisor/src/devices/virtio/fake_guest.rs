//! Test doubles for the virtio models: a guest RAM over host vectors
//! ([`FakeMemory`]), the driver side of a split ring ([`DriverQueue`]), a
//! disk in a vector ([`VecDisk`]) and the driver's bring-up sequence over
//! the transport's registers ([`bring_up`]).
//!
//! # The fake RAM
//!
//! Two RAM slots back to back ([`SLOT_A`], then [`SLOT_B`] right at its
//! end), each its own host vector, so a buffer across the boundary is two
//! pieces with unrelated "host" addresses; everything else (the device
//! windows at 0x0a000000 included) is not RAM. Host spans are synthetic
//! addresses (`HOST_BASE * (slot + 1) + offset`) that [`FakeMemory`]
//! resolves again for [`VecDisk`], so the disk moves bytes into guest RAM
//! without a pointer. Every write and every `device_writes` span marks its
//! pages dirty; every access is logged for the tests' "only where allowed"
//! checks.

use super::block_backend::{BlockBackend, BlockError, SECTOR_SIZE, check_transfer};
use super::mmio_transport::{
    Effects, MmioTransport, REG_DRIVER_FEATURES, REG_DRIVER_FEATURES_SEL, REG_QUEUE_DESC_HIGH,
    REG_QUEUE_DESC_LOW, REG_QUEUE_DEVICE_HIGH, REG_QUEUE_DEVICE_LOW, REG_QUEUE_DRIVER_HIGH,
    REG_QUEUE_DRIVER_LOW, REG_QUEUE_NUM, REG_QUEUE_READY, REG_QUEUE_SEL, REG_STATUS, VirtioDevice,
};
use super::virtqueue::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use crate::devices::guest_memory::{GuestMemory, GuestMemoryError, HostSpan};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::vec::Vec;

/// First RAM slot: (IPA, size).
pub const SLOT_A: (u64, u64) = (0x4000_0000, 0x10_0000);
/// Second RAM slot, right after the first.
pub const SLOT_B: (u64, u64) = (0x4010_0000, 0x10_0000);
/// A device window (not RAM).
pub const DEVICE_WINDOW: u64 = 0x0a00_0000;
/// Synthetic host address stride between slots.
pub const HOST_BASE: u64 = 0x1_0000_0000_0000;
/// Dirty-log granule.
pub const PAGE: u64 = 4096;

/// One logged access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Its first IPA.
    pub ipa: u64,
    /// Its length.
    pub len: u64,
    /// Whether it wrote.
    pub write: bool,
}

/// Guest RAM over host vectors (see the module doc).
pub struct FakeMemory {
    slots: Vec<(u64, Mutex<Vec<u8>>)>,
    dirty: Mutex<BTreeSet<u64>>,
    log: Mutex<Vec<Access>>,
    device_wrote: Mutex<Vec<HostSpan>>,
}

impl Default for FakeMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeMemory {
    /// Both slots, zeroed.
    pub fn new() -> Self {
        Self {
            slots: [SLOT_A, SLOT_B]
                .iter()
                .map(|&(ipa, size)| (ipa, Mutex::new(vec![0u8; size as usize])))
                .collect(),
            dirty: Mutex::new(BTreeSet::new()),
            log: Mutex::new(Vec::new()),
            device_wrote: Mutex::new(Vec::new()),
        }
    }

    /// The slot and offset of `ipa`, and the bytes left in that slot.
    fn locate(&self, ipa: u64) -> Option<(usize, u64, u64)> {
        self.slots.iter().enumerate().find_map(|(i, (base, data))| {
            let size = data.lock().unwrap().len() as u64;
            (ipa >= *base && ipa - base < size).then(|| (i, ipa - base, size - (ipa - base)))
        })
    }

    /// Checks the whole range, then calls `f(slot, offset, piece_len)` per
    /// slot piece.
    fn pieces(
        &self,
        ipa: u64,
        len: u64,
        mut f: impl FnMut(usize, u64, u64),
    ) -> Result<(), GuestMemoryError> {
        ipa.checked_add(len)
            .ok_or(GuestMemoryError::Wraps { ipa, len })?;
        let mut plan = Vec::new();
        let mut at = 0;
        while at < len {
            let here = ipa + at;
            let (slot, off, left) = self
                .locate(here)
                .ok_or(GuestMemoryError::NotRam { ipa: here })?;
            let piece = left.min(len - at);
            plan.push((slot, off, piece));
            at += piece;
        }
        for (slot, off, piece) in plan {
            f(slot, off, piece);
        }
        Ok(())
    }

    fn mark_dirty(&self, ipa: u64, len: u64) {
        let mut dirty = self.dirty.lock().unwrap();
        let mut page = ipa / PAGE;
        while page * PAGE < ipa + len {
            dirty.insert(page);
            page += 1;
        }
    }

    /// Pages marked dirty so far (page numbers: IPA / 4096).
    pub fn dirty_pages(&self) -> BTreeSet<u64> {
        self.dirty.lock().unwrap().clone()
    }

    /// Forgets the dirty pages and the access log.
    pub fn clear_logs(&self) {
        self.dirty.lock().unwrap().clear();
        self.log.lock().unwrap().clear();
        self.device_wrote.lock().unwrap().clear();
    }

    /// The accesses so far.
    pub fn accesses(&self) -> Vec<Access> {
        self.log.lock().unwrap().clone()
    }

    /// The spans reported through `device_wrote`.
    pub fn device_wrote_spans(&self) -> Vec<HostSpan> {
        self.device_wrote.lock().unwrap().clone()
    }

    /// Test-side write (not logged, not dirty): the driver's own stores.
    pub fn poke(&self, ipa: u64, data: &[u8]) {
        let mut at = 0usize;
        self.pieces(ipa, data.len() as u64, |slot, off, piece| {
            let mut d = self.slots[slot].1.lock().unwrap();
            d[off as usize..(off + piece) as usize].copy_from_slice(&data[at..at + piece as usize]);
            at += piece as usize;
        })
        .expect("test pokes RAM");
    }

    /// Test-side read (not logged).
    pub fn peek(&self, ipa: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.pieces(ipa, len as u64, |slot, off, piece| {
            let d = self.slots[slot].1.lock().unwrap();
            out.extend_from_slice(&d[off as usize..(off + piece) as usize]);
        })
        .expect("test peeks RAM");
        out
    }

    /// Test-side u16 store.
    pub fn poke_u16(&self, ipa: u64, v: u16) {
        self.poke(ipa, &v.to_le_bytes());
    }

    /// Test-side u16 load.
    pub fn peek_u16(&self, ipa: u64) -> u16 {
        u16::from_le_bytes(self.peek(ipa, 2).try_into().unwrap())
    }

    /// Test-side u32 load.
    pub fn peek_u32(&self, ipa: u64) -> u32 {
        u32::from_le_bytes(self.peek(ipa, 4).try_into().unwrap())
    }

    /// Resolves a synthetic host span back to (slot, offset).
    fn host(&self, addr: u64, len: u64) -> Option<(usize, usize)> {
        let slot = (addr / HOST_BASE).checked_sub(1)? as usize;
        let off = addr % HOST_BASE;
        let (_, data) = self.slots.get(slot)?;
        (off + len <= data.lock().unwrap().len() as u64).then_some((slot, off as usize))
    }

    /// Writes `data` at a host span address (the disk's side).
    pub fn host_write(&self, addr: u64, data: &[u8]) {
        let (slot, off) = self.host(addr, data.len() as u64).expect("span in RAM");
        self.slots[slot].1.lock().unwrap()[off..off + data.len()].copy_from_slice(data);
    }

    /// Reads at a host span address (the disk's side).
    pub fn host_read(&self, addr: u64, out: &mut [u8]) {
        let (slot, off) = self.host(addr, out.len() as u64).expect("span in RAM");
        out.copy_from_slice(&self.slots[slot].1.lock().unwrap()[off..off + out.len()]);
    }
}

impl GuestMemory for FakeMemory {
    fn read(&self, ipa: u64, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let mut at = 0usize;
        self.pieces(ipa, buf.len() as u64, |slot, off, piece| {
            let d = self.slots[slot].1.lock().unwrap();
            buf[at..at + piece as usize].copy_from_slice(&d[off as usize..(off + piece) as usize]);
            at += piece as usize;
        })?;
        self.log.lock().unwrap().push(Access {
            ipa,
            len: buf.len() as u64,
            write: false,
        });
        Ok(())
    }

    fn write(&self, ipa: u64, buf: &[u8]) -> Result<(), GuestMemoryError> {
        self.pieces(ipa, buf.len() as u64, |_, _, _| {})?;
        self.poke(ipa, buf);
        self.mark_dirty(ipa, buf.len() as u64);
        self.log.lock().unwrap().push(Access {
            ipa,
            len: buf.len() as u64,
            write: true,
        });
        Ok(())
    }

    fn host_spans(
        &self,
        ipa: u64,
        len: u64,
        device_writes: bool,
        out: &mut Vec<HostSpan>,
    ) -> Result<(), GuestMemoryError> {
        let mut spans = Vec::new();
        self.pieces(ipa, len, |slot, off, piece| {
            spans.push(HostSpan {
                addr: HOST_BASE * (slot as u64 + 1) + off,
                len: piece,
            });
        })?;
        out.extend(spans);
        if device_writes {
            self.mark_dirty(ipa, len);
        }
        self.log.lock().unwrap().push(Access {
            ipa,
            len,
            write: device_writes,
        });
        Ok(())
    }

    fn device_wrote(&self, spans: &[HostSpan]) {
        self.device_wrote.lock().unwrap().extend_from_slice(spans);
    }
}

/// The driver side of one split queue, building chains in the fake RAM.
#[derive(Clone, Debug)]
pub struct DriverQueue {
    /// Entries.
    pub size: u16,
    /// Descriptor table IPA.
    pub desc: u64,
    /// Available ring IPA.
    pub avail: u64,
    /// Used ring IPA.
    pub used: u64,
    /// Next descriptor to hand out (wraps around the table).
    pub next_desc: u16,
    /// The driver's avail.idx.
    pub avail_idx: u16,
    /// Used entries already collected.
    pub used_seen: u16,
}

impl DriverQueue {
    /// A queue of `size` with its three areas from `base` on (4 KiB apart
    /// per area for sizes up to 256).
    pub fn new(size: u16, base: u64) -> Self {
        Self {
            size,
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Writes descriptor `index` of the table at `table`.
    pub fn write_desc_at(
        mem: &FakeMemory,
        table: u64,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut raw = Vec::with_capacity(16);
        raw.extend_from_slice(&addr.to_le_bytes());
        raw.extend_from_slice(&len.to_le_bytes());
        raw.extend_from_slice(&flags.to_le_bytes());
        raw.extend_from_slice(&next.to_le_bytes());
        mem.poke(table + 16 * u64::from(index), &raw);
    }

    /// Writes descriptor `index` of the queue's table.
    pub fn write_desc(
        &self,
        mem: &FakeMemory,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        Self::write_desc_at(mem, self.desc, index, addr, len, flags, next);
    }

    /// Builds a chain of `(ipa, len, device_writable)` buffers in the next
    /// free descriptors; returns its head (not yet published).
    pub fn add_chain(&mut self, mem: &FakeMemory, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let index = self.next_desc;
            let next = (index + 1) % self.size;
            let mut flags = if writable { DESC_F_WRITE } else { 0 };
            if i + 1 < bufs.len() {
                flags |= DESC_F_NEXT;
            }
            self.write_desc(mem, index, addr, len, flags, next);
            self.next_desc = next;
        }
        head
    }

    /// Builds an indirect table at `table` holding the buffers, and one
    /// direct descriptor pointing at it; returns the head.
    pub fn add_indirect(&mut self, mem: &FakeMemory, table: u64, bufs: &[(u64, u32, bool)]) -> u16 {
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let mut flags = if writable { DESC_F_WRITE } else { 0 };
            if i + 1 < bufs.len() {
                flags |= DESC_F_NEXT;
            }
            Self::write_desc_at(mem, table, i as u16, addr, len, flags, i as u16 + 1);
        }
        let head = self.next_desc;
        self.write_desc(mem, head, table, 16 * bufs.len() as u32, DESC_F_INDIRECT, 0);
        self.next_desc = (head + 1) % self.size;
        head
    }

    /// Makes `head` available.
    pub fn publish(&mut self, mem: &FakeMemory, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        mem.poke_u16(self.avail + 4 + 2 * slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.poke_u16(self.avail + 2, self.avail_idx);
    }

    /// Sets `used_event`.
    pub fn set_used_event(&self, mem: &FakeMemory, value: u16) {
        mem.poke_u16(self.avail + 4 + 2 * u64::from(self.size), value);
    }

    /// Sets `avail.flags`.
    pub fn set_avail_flags(&self, mem: &FakeMemory, flags: u16) {
        mem.poke_u16(self.avail, flags);
    }

    /// The device's `avail_event`.
    pub fn avail_event(&self, mem: &FakeMemory) -> u16 {
        mem.peek_u16(self.used + 4 + 8 * u64::from(self.size))
    }

    /// Used elements (id, len) the driver has not collected yet.
    pub fn take_used(&mut self, mem: &FakeMemory) -> Vec<(u32, u32)> {
        let idx = mem.peek_u16(self.used + 2);
        let mut out = Vec::new();
        while self.used_seen != idx {
            let slot = u64::from(self.used_seen % self.size);
            let at = self.used + 4 + 8 * slot;
            out.push((mem.peek_u32(at), mem.peek_u32(at + 4)));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

/// Drives a transport through ACKNOWLEDGE, DRIVER, the features (the
/// whole offer when `features` is `None`), FEATURES_OK, queue set-up and
/// DRIVER_OK; returns the effects of the last step.
pub fn bring_up<D: VirtioDevice>(
    t: &mut MmioTransport<D>,
    mem: &FakeMemory,
    features: Option<u64>,
    queues: &[DriverQueue],
) -> Effects {
    let w = |t: &mut MmioTransport<D>, off: u64, v: u64| {
        let e = t.write(off, 4, v, mem);
        assert_eq!(e.access_error, None, "write {off:#x} = {v:#x}");
        e
    };
    let features = features.unwrap_or(t.offered_features());
    let _ = w(t, REG_STATUS, 1);
    let _ = w(t, REG_STATUS, 3);
    let _ = w(t, REG_DRIVER_FEATURES_SEL, 0);
    let _ = w(t, REG_DRIVER_FEATURES, features & 0xffff_ffff);
    let _ = w(t, REG_DRIVER_FEATURES_SEL, 1);
    let _ = w(t, REG_DRIVER_FEATURES, features >> 32);
    let _ = w(t, REG_STATUS, 11);
    assert_eq!(t.status() & 8, 8, "FEATURES_OK accepted");
    for (i, q) in queues.iter().enumerate() {
        let _ = w(t, REG_QUEUE_SEL, i as u64);
        let _ = w(t, REG_QUEUE_NUM, u64::from(q.size));
        for (lo, hi, addr) in [
            (REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, q.desc),
            (REG_QUEUE_DRIVER_LOW, REG_QUEUE_DRIVER_HIGH, q.avail),
            (REG_QUEUE_DEVICE_LOW, REG_QUEUE_DEVICE_HIGH, q.used),
        ] {
            let _ = w(t, lo, addr & 0xffff_ffff);
            let _ = w(t, hi, addr >> 32);
        }
        let e = w(t, REG_QUEUE_READY, 1);
        assert_eq!(e.needs_reset, None);
    }
    w(t, REG_STATUS, 15)
}

/// A disk in a vector, moving bytes through [`FakeMemory`]'s host spans.
pub struct VecDisk {
    /// Its bytes.
    pub data: Mutex<Vec<u8>>,
    /// Whether writes are refused.
    pub read_only: bool,
    /// The memory its spans point into.
    pub mem: std::sync::Arc<FakeMemory>,
    /// Flushes seen.
    pub flushes: Mutex<u32>,
}

impl VecDisk {
    /// A disk of `sectors` zeroed sectors.
    pub fn new(sectors: u64, read_only: bool, mem: std::sync::Arc<FakeMemory>) -> Self {
        Self {
            data: Mutex::new(vec![0; (sectors * SECTOR_SIZE) as usize]),
            read_only,
            mem,
            flushes: Mutex::new(0),
        }
    }

    /// The byte offset of a transfer at `sector` that passed the backends'
    /// check (`block_backend::check_transfer`).
    fn check(&self, write: bool, sector: u64, spans: &[HostSpan]) -> Result<usize, BlockError> {
        check_transfer(
            self.capacity_sectors(),
            self.read_only,
            write,
            sector,
            spans,
        )?;
        Ok((sector * SECTOR_SIZE) as usize)
    }
}

impl BlockBackend for VecDisk {
    fn capacity_sectors(&self) -> u64 {
        self.data.lock().unwrap().len() as u64 / SECTOR_SIZE
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let mut at = self.check(false, sector, spans)?;
        let data = self.data.lock().unwrap();
        for s in spans {
            self.mem.host_write(s.addr, &data[at..at + s.len as usize]);
            at += s.len as usize;
        }
        Ok(())
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let mut at = self.check(true, sector, spans)?;
        let mut data = self.data.lock().unwrap();
        for s in spans {
            self.mem
                .host_read(s.addr, &mut data[at..at + s.len as usize]);
            at += s.len as usize;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BlockError> {
        *self.flushes.lock().unwrap() += 1;
        Ok(())
    }

    fn id(&self) -> [u8; 20] {
        *b"vecdisk-0123456789ab"
    }
}
