//! A VM's boot RAM zeroed on first use, 2 MiB at a time, instead of all
//! of it before the guest starts.
//!
//! No byte of an earlier owner of a frame may reach a guest, so guest RAM
//! must be zeroed before the guest (or a device acting for it) can read
//! it. Zeroing all of it while the VM is built costs time in proportion to
//! its size before the first instruction runs (about 1.2 s for 512 MiB
//! under QEMU's TCG, where Linux boots in 3-4 s), and a guest touches far
//! less than all of its RAM while it boots. [`LazyZeroedRam`] records, per
//! 2 MiB chunk ([`CHUNK`]) of the RAM's host range, whether it has been
//! zeroed; whoever is about to hand the guest a chunk zeroes it first.
//!
//! # Who zeroes
//!
//! Every way a guest reaches its RAM passes through [`LazyZeroedRam::ensure`]
//! before the bytes are reachable:
//! - a stage-2 fault, before the leaf is mapped (`exit::ram_fault`): a leaf
//!   larger than a chunk is mapped only once every chunk under it is zeroed,
//!   otherwise the fault maps the 2 MiB around the address and zeroes that
//!   (as KVM does with transparent huge pages: the host zeroes each 2 MiB
//!   page when the guest first touches it);
//! - the VM's devices and the ITS through its [`GuestMemory`] (reads, writes
//!   and spans handed out for direct writes, `runtime::slot_memory`);
//! - the monitor's and the control interface's copies (`runtime::vm_ops`);
//! - the boot image's copy when the VM is built (its chunks are zeroed
//!   first, then the kernel, initrd and device tree written into them).
//!
//! Everything that changes the RAM's slot or compares or copies it whole
//! first finishes the job ([`LazyZeroedRam::finish`]): a slot deleted,
//! moved, unmapped or recreated (restart), a live migration (both ends,
//! before the first round, so pre-copy and the byte-for-byte check see the
//! guest's view), and a VM with passed-through devices, whose DMA bypasses
//! stage 2, zeroes everything when it is built. After `finish` the record
//! is spent: every check is one load of [`LazyZeroedRam::is_finished`].
//!
//! # The protocol of a chunk
//!
//! Each chunk is one byte: `PENDING` (not zeroed), `ZEROING` (one CPU is
//! zeroing it) or `READY`. [`LazyZeroedRam::ensure`] claims a pending chunk
//! with a compare-and-swap to `ZEROING`, zeroes it and publishes `READY`
//! with a release store; a CPU that finds `ZEROING` waits (spins, with an
//! acquire load) until it reads `READY`, so no caller returns before every
//! chunk it named is zeroed and the zeroes are visible to it. Two vCPUs
//! faulting in the same chunk zero it once; a device access racing a fault
//! waits for it. A count of the chunks not yet ready makes the common case,
//! everything zeroed, a single acquire load.
//!
//! [`GuestMemory`]: crate::devices::guest_memory::GuestMemory

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The bytes zeroed at once: a 2 MiB block, the size a fault maps while
/// the 1 GiB around it is not zeroed whole.
pub const CHUNK: u64 = 2 << 20;

const PENDING: u8 = 0;
const ZEROING: u8 = 1;
const READY: u8 = 2;

/// The zeroing state of one host range of guest RAM (see the module doc).
pub struct LazyZeroedRam {
    /// Host address of the first byte (a multiple of [`CHUNK`]).
    base: u64,
    /// Bytes in the range.
    size: u64,
    /// One state per chunk, the last one possibly partial.
    chunks: Box<[AtomicU8]>,
    /// Chunks not `READY`.
    pending: AtomicUsize,
}

impl LazyZeroedRam {
    /// `size` bytes at host address `base`, none of them zeroed yet.
    ///
    /// # Panics
    ///
    /// If `base` is not a multiple of [`CHUNK`].
    pub fn new(base: u64, size: u64) -> Self {
        assert!(
            base.is_multiple_of(CHUNK),
            "lazily zeroed RAM at {base:#x} is not 2 MiB aligned"
        );
        let count = size.div_ceil(CHUNK) as usize;
        let chunks: Vec<AtomicU8> = (0..count).map(|_| AtomicU8::new(PENDING)).collect();
        Self {
            base,
            size,
            chunks: chunks.into_boxed_slice(),
            pending: AtomicUsize::new(count),
        }
    }

    /// A record with nothing left to zero (RAM zeroed when it was made).
    pub fn finished() -> Self {
        Self {
            base: 0,
            size: 0,
            chunks: Box::new([]),
            pending: AtomicUsize::new(0),
        }
    }

    /// Every chunk is zeroed: nothing is left to do, ever.
    pub fn is_finished(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Chunks not zeroed yet.
    pub fn pending_chunks(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// The chunk indices `len` bytes at host address `host` overlap inside
    /// the range (empty outside it).
    fn chunk_span(&self, host: u64, len: u64) -> core::ops::Range<usize> {
        let end = host.saturating_add(len).min(self.base + self.size);
        let start = host.max(self.base);
        if len == 0 || start >= end {
            return 0..0;
        }
        let first = ((start - self.base) / CHUNK) as usize;
        let last = ((end - 1 - self.base) / CHUNK) as usize;
        first..last + 1
    }

    /// Whether every chunk under `len` bytes at `host` is zeroed (bytes
    /// outside the range count as zeroed: they are not this record's).
    pub fn is_ready(&self, host: u64, len: u64) -> bool {
        self.is_finished()
            || self
                .chunk_span(host, len)
                .all(|i| self.chunks[i].load(Ordering::Acquire) == READY)
    }

    /// Zeroes, with `zero(addr, len)`, every chunk under `len` bytes at
    /// host address `host` that is not zeroed yet, and waits for any other
    /// CPU zeroing one of them: on return all of them read as zero to this
    /// CPU. Bytes outside the range are left alone.
    pub fn ensure(&self, host: u64, len: u64, zero: impl Fn(usize, usize)) {
        if self.is_finished() {
            return;
        }
        for i in self.chunk_span(host, len) {
            self.ensure_chunk(i, &zero);
        }
    }

    /// Zeroes every chunk not zeroed yet (see the module doc for when).
    pub fn finish(&self, zero: impl Fn(usize, usize)) {
        self.ensure(self.base, self.size, zero);
    }

    fn ensure_chunk(&self, i: usize, zero: &impl Fn(usize, usize)) {
        let state = &self.chunks[i];
        loop {
            match state.compare_exchange(PENDING, ZEROING, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => {
                    let start = self.base + i as u64 * CHUNK;
                    let end = (start + CHUNK).min(self.base + self.size);
                    zero(start as usize, (end - start) as usize);
                    state.store(READY, Ordering::Release);
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                Err(READY) => return,
                Err(_) => core::hint::spin_loop(),
            }
        }
    }
}

impl core::fmt::Debug for LazyZeroedRam {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LazyZeroedRam")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &format_args!("{:#x}", self.size))
            .field("pending_chunks", &self.pending_chunks())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::{Arc, Barrier, Mutex};
    use std::vec;
    use std::vec::Vec;

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 0x4000_0000;

    /// A record whose `zero` calls are logged instead of run.
    fn zeroed_by(ram: &LazyZeroedRam, host: u64, len: u64) -> Vec<(u64, u64)> {
        let log = Mutex::new(Vec::new());
        ram.ensure(host, len, |addr, n| {
            log.lock().unwrap().push((addr as u64, n as u64))
        });
        log.into_inner().unwrap()
    }

    #[test]
    fn each_chunk_is_zeroed_once_and_only_when_asked_for() {
        let ram = LazyZeroedRam::new(BASE, 9 * MIB);
        assert_eq!(ram.pending_chunks(), 5);
        assert!(!ram.is_ready(BASE, 1));
        // One byte in the second chunk zeroes that chunk alone.
        assert_eq!(
            zeroed_by(&ram, BASE + 3 * MIB, 1),
            [(BASE + 2 * MIB, 2 * MIB)]
        );
        assert_eq!(zeroed_by(&ram, BASE + 2 * MIB, 2 * MIB), []);
        assert!(ram.is_ready(BASE + 2 * MIB, 2 * MIB));
        assert!(!ram.is_ready(BASE + 2 * MIB, 2 * MIB + 1));
        // A span over three chunks zeroes the two not zeroed, in order; the
        // last chunk is partial.
        assert_eq!(
            zeroed_by(&ram, BASE + MIB, 8 * MIB),
            [
                (BASE, 2 * MIB),
                (BASE + 4 * MIB, 2 * MIB),
                (BASE + 6 * MIB, 2 * MIB),
                (BASE + 8 * MIB, MIB)
            ]
        );
        assert!(ram.is_finished());
        assert_eq!(zeroed_by(&ram, BASE, 9 * MIB), []);
    }

    #[test]
    fn bytes_outside_the_range_are_not_its_own() {
        let ram = LazyZeroedRam::new(BASE, 4 * MIB);
        assert_eq!(zeroed_by(&ram, BASE - 4 * MIB, 4 * MIB), []);
        assert_eq!(zeroed_by(&ram, BASE + 4 * MIB, MIB), []);
        assert_eq!(zeroed_by(&ram, BASE, 0), []);
        assert!(ram.is_ready(BASE + 4 * MIB, 4096));
        // A span that starts below the range zeroes the part inside.
        assert_eq!(zeroed_by(&ram, BASE - MIB, 2 * MIB), [(BASE, 2 * MIB)]);
        assert_eq!(ram.pending_chunks(), 1);
        let log = Mutex::new(Vec::new());
        ram.finish(|addr, n| log.lock().unwrap().push((addr as u64, n as u64)));
        assert_eq!(log.into_inner().unwrap(), [(BASE + 2 * MIB, 2 * MIB)]);
        assert!(ram.is_finished());
        assert!(LazyZeroedRam::finished().is_finished());
    }

    /// Many threads ensure overlapping spans of real memory that starts
    /// full of an earlier owner's bytes, and each writes a mark right after
    /// its call: every chunk is zeroed exactly once, and no thread's mark
    /// is wiped by a zeroing that started after its call returned.
    #[test]
    fn racing_callers_zero_each_chunk_once_and_never_after_a_caller_wrote() {
        const CHUNKS: usize = 16;
        const THREADS: usize = 4;
        let bytes = CHUNKS * CHUNK as usize;
        let memory: Arc<Vec<std::sync::atomic::AtomicU8>> = Arc::new(
            (0..bytes)
                .map(|_| std::sync::atomic::AtomicU8::new(0xa5))
                .collect(),
        );
        let ram = Arc::new(LazyZeroedRam::new(0, bytes as u64));
        let counts = Arc::new((0..CHUNKS).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (memory, ram, counts, barrier) =
                    (memory.clone(), ram.clone(), counts.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for chunk in 0..CHUNKS {
                        // All threads on the same chunk at once, each asking
                        // for pages near its end (zeroed last).
                        let at = (chunk as u64 + 1) * CHUNK - (t as u64 + 1) * 8192;
                        ram.ensure(at, 8192, |addr, n| {
                            counts[addr / CHUNK as usize].fetch_add(1, Ordering::Relaxed);
                            for b in &memory[addr..addr + n] {
                                b.store(0, Ordering::Relaxed);
                            }
                        });
                        // Every byte asked for reads zero, then this
                        // thread writes its own mark.
                        for b in &memory[at as usize..at as usize + 8192] {
                            assert_eq!(b.load(Ordering::Relaxed), 0, "a byte of the earlier owner");
                        }
                        memory[at as usize].store(t as u8 + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        for (chunk, count) in counts.iter().enumerate() {
            assert_eq!(
                count.load(Ordering::Relaxed),
                1,
                "chunk {chunk} zeroed more or less than once"
            );
        }
        for t in 0..THREADS {
            for chunk in 0..CHUNKS {
                let at = (chunk + 1) * CHUNK as usize - (t + 1) * 8192;
                assert_eq!(
                    memory[at].load(Ordering::Relaxed),
                    t as u8 + 1,
                    "a mark was zeroed"
                );
            }
        }
        assert!(ram.is_finished());
    }

    proptest! {
        /// Against a model (a set of zeroed chunks): any sequence of spans
        /// zeroes exactly the chunks it overlaps that were not zeroed, each
        /// whole (the last one up to the range's end), and `is_ready`
        /// answers as the model does.
        #[test]
        fn ensure_matches_a_set_of_zeroed_chunks(
            size_mib in 1u64..40,
            spans in proptest::collection::vec((0u64..48 * MIB, 0u64..8 * MIB), 1..20),
        ) {
            let size = size_mib * MIB;
            let ram = LazyZeroedRam::new(BASE, size);
            let mut model = vec![false; size.div_ceil(CHUNK) as usize];
            for (offset, len) in spans {
                let host = BASE - 4 * MIB + offset;
                let mut expected = Vec::new();
                for (i, zeroed) in model.iter_mut().enumerate() {
                    let start = BASE + i as u64 * CHUNK;
                    let end = (start + CHUNK).min(BASE + size);
                    if len > 0 && host < end && start < host + len && !*zeroed {
                        *zeroed = true;
                        expected.push((start, end - start));
                    }
                }
                prop_assert_eq!(zeroed_by(&ram, host, len), expected);
                let ready = model.iter().enumerate().all(|(i, z)| {
                    let start = BASE + i as u64 * CHUNK;
                    let end = (start + CHUNK).min(BASE + size);
                    *z || !(host < end && start < host + len)
                });
                prop_assert_eq!(ram.is_ready(host, len), len == 0 || ready);
                prop_assert_eq!(ram.pending_chunks(), model.iter().filter(|z| !**z).count());
            }
        }
    }
}
