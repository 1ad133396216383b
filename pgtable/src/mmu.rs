//! The MMU object: a VM's stage-2 table behind a reader-writer lock, with
//! the lock's two sides as two types.
//!
//! [`Mmu::read`] takes the read side and returns an [`MmuReader`], which
//! offers only the fault path (shared walks: map, relax permissions, set the
//! access flag) and pinned lookups and walks; it never hands out the table
//! itself, so no exclusive operation, and no unpinned read, can run beside a
//! shared walk. [`Mmu::write`] takes the write side and returns an
//! [`MmuWriter`], which dereferences to `&mut Stage2PageTable`: the range
//! operations (unmap, write-protect, split, map of a region, destroy) need
//! `&mut` and so are only reachable there.
//!
//! The lock is a per-CPU reader-writer lock built from `spin` locks: each
//! registered CPU ([`Mmu::register`] returns its [`MmuCpu`]) has its own
//! `spin::RwLock` on its own cache line and read-locks only that one, so
//! vCPUs faulting at the same time share no written cache line; a writer
//! write-locks every CPU's lock, in order. (Under `--cfg loom --cfg crossbeam_loom`
//! the locks and the table cell are loom's, `crate::sync_primitives`, so that the
//! models check the exclusion.) While a writer waits, new readers
//! hold back, so faults cannot starve the write side. The same handle
//! carries the CPU's epoch registration: shared walks pin it, and the tables
//! they unlink are retired to the MMU's collector.
//!
//! The MMU also holds the VM's invalidation sequence ([`crate::invalidate`]):
//! [`MmuReader::map_checked`] installs a fault's leaf,
//! [`MmuReader::relax_perms_checked`] widens one and
//! [`MmuReader::set_young_checked`] sets its access flag only if no
//! invalidation began or ended since the fault took its ticket.

use crate::cache::PageCache;
use crate::descriptor::Perms;
use crate::fault::FaultMapping;
use crate::invalidate::{FaultTicket, Invalidation};
use crate::mm::PageTableMemory;
use crate::sync_primitives::{
    AtomicUsize, CpuReadGuard, CpuRwLock, CpuWriteGuard, Ordering, TableCell, read_lock, spin_wait,
    write_lock,
};
use crate::table::{Error, Mapping, Stage2PageTable};
use crate::walk::{Visitor, WalkFlags};
use alloc::boxed::Box;
use crossbeam_epoch::{Collector, LocalHandle};
use tlb::{TlbInvalidate, TlbTarget};

/// Most CPUs one MMU serves.
pub const MAX_MMU_CPUS: usize = 64;

/// One CPU's reader lock, alone on its cache line(s).
#[repr(align(128))]
struct ReaderLock(CpuRwLock);

/// A VM's stage-2 MMU: the table, its lock, and its epoch collector.
pub struct Mmu<M: PageTableMemory> {
    table: TableCell<Stage2PageTable<M>>,
    readers: Box<[ReaderLock]>,
    registered: AtomicUsize,
    /// Writers waiting for the lock: new readers hold back while nonzero.
    writers_waiting: AtomicUsize,
    collector: Collector,
    invalidation: Invalidation,
}

// SAFETY: the table is reached as `&` only through an `MmuReader`, which
// holds one CPU's read lock, and as `&mut` only through an `MmuWriter`,
// which holds every CPU's write lock; so `&mut` never coexists with any
// other reference. Sharing the MMU shares the table, hence `Send + Sync`.
unsafe impl<M: PageTableMemory + Send> Sync for Mmu<M> {}

/// A CPU registered with an [`Mmu`]: its reader lock and its epoch handle.
/// Like the epoch handle it holds, it stays on its CPU (neither `Send` nor
/// `Sync`).
pub struct MmuCpu {
    epoch: LocalHandle,
    slot: usize,
}

impl MmuCpu {
    /// The CPU's epoch handle (registered with the MMU's collector).
    pub fn epoch(&self) -> &LocalHandle {
        &self.epoch
    }
}

impl<M: PageTableMemory + Clone + Send + 'static> Mmu<M> {
    /// Wraps `table` for up to `max_cpus` (at most [`MAX_MMU_CPUS`])
    /// registered CPUs.
    pub fn new(table: Stage2PageTable<M>, max_cpus: usize) -> Result<Self, Error> {
        if max_cpus > MAX_MMU_CPUS {
            return Err(Error::TooManyCpus);
        }
        Ok(Self {
            table: TableCell::new(table),
            readers: (0..max_cpus)
                .map(|_| ReaderLock(CpuRwLock::new(())))
                .collect(),
            registered: AtomicUsize::new(0),
            writers_waiting: AtomicUsize::new(0),
            collector: Collector::new(),
            invalidation: Invalidation::default(),
        })
    }

    /// Registers one CPU; keep the handle on that CPU and use it for every
    /// read-side operation there. `TooManyCpus` past `max_cpus`.
    pub fn register(&self) -> Result<MmuCpu, Error> {
        let slot = self.registered.fetch_add(1, Ordering::Relaxed);
        if slot >= self.readers.len() {
            self.registered.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::TooManyCpus);
        }
        Ok(MmuCpu {
            epoch: self.collector.register(),
            slot,
        })
    }

    /// Takes `cpu`'s read side: fault handling. Waits while a writer waits.
    /// `ForeignHandle` when `cpu` was registered with another MMU.
    pub fn read<'a>(&'a self, cpu: &'a MmuCpu) -> Result<MmuReader<'a, M>, Error> {
        if cpu.epoch.collector() != &self.collector {
            return Err(Error::ForeignHandle);
        }
        while self.writers_waiting.load(Ordering::Acquire) != 0 {
            spin_wait();
        }
        let lock = read_lock(&self.readers[cpu.slot].0);
        // SAFETY: a read lock is held for the reader's lifetime, so no
        // `MmuWriter` (which needs every write lock) exists meanwhile.
        let table = unsafe { self.table.get() };
        Ok(MmuReader {
            table,
            cpu,
            invalidation: &self.invalidation,
            _lock: lock,
        })
    }

    /// Takes the write side: range operations. Readers arriving meanwhile
    /// wait, so the writer gets the lock once the current readers leave.
    /// Must not be called while this CPU holds an [`MmuReader`].
    pub fn write(&self) -> MmuWriter<'_, M> {
        self.writers_waiting.fetch_add(1, Ordering::AcqRel);
        // Every writer locks in the same order, so two cannot deadlock.
        let locks = core::array::from_fn(|i| self.readers.get(i).map(|r| write_lock(&r.0)));
        self.writers_waiting.fetch_sub(1, Ordering::Release);
        MmuWriter {
            mmu: self,
            _locks: locks,
        }
    }

    /// Tries to free retired tables whose readers have all unpinned.
    pub fn collect(&self, cpu: &MmuCpu) {
        cpu.epoch.pin().flush();
    }

    /// The table, once every other user is gone. Tables retired earlier are
    /// freed when the last CPU handle is dropped.
    pub fn into_inner(self) -> Stage2PageTable<M> {
        self.table.into_inner()
    }
}

impl<M: PageTableMemory> Mmu<M> {
    pub(crate) fn invalidation(&self) -> &Invalidation {
        &self.invalidation
    }
}

impl<M: PageTableMemory> MmuReader<'_, M> {
    pub(crate) fn invalidation(&self) -> &Invalidation {
        self.invalidation
    }
}

impl<M: PageTableMemory> MmuWriter<'_, M> {
    pub(crate) fn invalidation(&self) -> &Invalidation {
        &self.mmu.invalidation
    }
}

/// The read side of an [`Mmu`] on one CPU: shared walks only.
pub struct MmuReader<'a, M: PageTableMemory> {
    table: &'a Stage2PageTable<M>,
    cpu: &'a MmuCpu,
    invalidation: &'a Invalidation,
    _lock: CpuReadGuard<'a>,
}

impl<M: PageTableMemory + Clone + Send + 'static> MmuReader<'_, M> {
    /// Fixes a translation fault by installing `leaf`, taking at most
    /// [`FAULT_CACHE_PAGES`](crate::FAULT_CACHE_PAGES) pages from `cache`
    /// (splitting a block or collapsing a table on the way as needed).
    /// `Err(Again)`: another vCPU is changing this entry; re-enter the guest.
    pub fn map(
        &self,
        leaf: FaultMapping,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let guard = self.cpu.epoch.pin();
        self.table.map_shared(&guard, leaf, cache, tlb)
    }

    /// [`MmuReader::map`] for a leaf derived from a memslot lookup made after
    /// `ticket` was taken ([`Mmu::fault_ticket`]): `Err(Again)` without
    /// touching the table when an invalidation began or ended since, so a
    /// translation through a deleted or moved slot is never installed (see
    /// [`crate::invalidate`]).
    pub fn map_checked(
        &self,
        ticket: FaultTicket,
        leaf: FaultMapping,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        if self.invalidation.is_stale(ticket) {
            return Err(Error::Again);
        }
        self.map(leaf, cache, tlb)
    }

    /// Fixes a permission fault: adds `perms` to the leaf mapping `ipa` and
    /// invalidates the page on this CPU, also when the leaf had `perms`
    /// already or another vCPU changed it first (a spurious fault: this
    /// CPU's TLB holds a stricter entry). `Err(Again)` when no leaf maps it
    /// now, or the update lost a race (re-enter the guest).
    pub fn relax_perms(
        &self,
        ipa: u64,
        perms: Perms,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let _guard = self.cpu.epoch.pin();
        self.table.relax_shared(ipa, perms, tlb)
    }

    /// Fixes an access-flag fault: sets the flag of the leaf mapping `ipa`;
    /// returns whether it was clear. `Err(Again)` when no leaf maps it now.
    pub fn set_young(&self, ipa: u64) -> Result<bool, Error> {
        let _guard = self.cpu.epoch.pin();
        self.table.set_young_shared(ipa)
    }

    /// [`MmuReader::relax_perms`] for a fault that took `ticket` before its
    /// memslot lookup: `Err(Again)` without touching the table when an
    /// invalidation began or ended since. The permissions a fault asks for
    /// come from its slot view (a write to a slot that does not log dirty
    /// pages is not marked), and enabling dirty logging is an invalidation,
    /// so a stale view must not widen a leaf the invalidation narrowed.
    pub fn relax_perms_checked(
        &self,
        ticket: FaultTicket,
        ipa: u64,
        perms: Perms,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        if self.invalidation.is_stale(ticket) {
            return Err(Error::Again);
        }
        self.relax_perms(ipa, perms, tlb)
    }

    /// [`MmuReader::set_young`] for a fault that took `ticket` before its
    /// memslot lookup: `Err(Again)` without touching the table when an
    /// invalidation began or ended since (the leaf may belong to a slot
    /// deleted or moved meanwhile).
    pub fn set_young_checked(&self, ticket: FaultTicket, ipa: u64) -> Result<bool, Error> {
        if self.invalidation.is_stale(ticket) {
            return Err(Error::Again);
        }
        self.set_young(ipa)
    }

    /// Runs `visitor` over `[ipa, ipa + size)` in a shared walk, pinned:
    /// [`WalkFlags::SHARED`] is forced, so every change the visitor makes
    /// is a compare-and-swap, and an `Again` it returns skips that entry.
    pub fn walk<V: Visitor>(
        &self,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<(), Error> {
        let end = self.table.check_range(ipa, size)?;
        let _guard = self.cpu.epoch.pin();
        Ok(self
            .table
            .walk_range(ipa, end, flags | WalkFlags::SHARED, visitor)?)
    }

    /// The leaf mapping `ipa`, read while pinned.
    pub fn lookup(&self, ipa: u64) -> Option<Mapping> {
        let _guard = self.cpu.epoch.pin();
        self.table.lookup(ipa)
    }

    /// The VM these operations invalidate TLB entries of.
    pub fn tlb_target(&self) -> TlbTarget {
        *self.table.tlb_target()
    }

    /// The page-table memory provider (to top up caches).
    pub fn memory(&self) -> &M {
        self.table.memory()
    }
}

/// The write side of an [`Mmu`]: exclusive access to the table.
pub struct MmuWriter<'a, M: PageTableMemory> {
    mmu: &'a Mmu<M>,
    _locks: [Option<CpuWriteGuard<'a>>; MAX_MMU_CPUS],
}

impl<M: PageTableMemory> core::ops::Deref for MmuWriter<'_, M> {
    type Target = Stage2PageTable<M>;
    fn deref(&self) -> &Stage2PageTable<M> {
        // SAFETY: every CPU's write lock is held: no other reference exists.
        unsafe { self.mmu.table.get() }
    }
}

impl<M: PageTableMemory> core::ops::DerefMut for MmuWriter<'_, M> {
    fn deref_mut(&mut self) -> &mut Stage2PageTable<M> {
        // SAFETY: every CPU's write lock is held, and `&mut self` makes this
        // the only reference.
        unsafe { self.mmu.table.get_mut() }
    }
}
