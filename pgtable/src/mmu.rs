//! The MMU object: a VM's stage-2 table behind a reader-writer lock, with
//! the lock's two sides as two types.
//!
//! [`Mmu::read`] takes the read side and returns an [`MmuReader`], which
//! offers only the fault path (shared walks: map, relax permissions, set the
//! access flag) and pinned lookups; it never hands out the table itself, so
//! no exclusive operation, and no unpinned read, can run beside a shared walk.
//! [`Mmu::write`] takes the write side and returns an [`MmuWriter`], which
//! dereferences to `&mut Stage2PageTable`: the range operations (unmap,
//! write-protect, split, map of a whole region, destroy) need `&mut` and so
//! are only reachable there. Shared walks pin the caller's per-CPU epoch
//! handle ([`Mmu::register`]) for their duration; the tables they unlink are
//! retired to the MMU's collector. The lock prefers writers: while one
//! waits, new readers hold back, so faults cannot starve the write side.

use crate::cache::PageCache;
use crate::descriptor::Perms;
use crate::fault::FaultMapping;
use crate::mm::PageTableMemory;
use crate::table::{Error, Mapping, Stage2PageTable};
use crate::walk::{Visitor, WalkFlags};
use core::sync::atomic::{AtomicUsize, Ordering};
use crossbeam_epoch::{Collector, LocalHandle};
use spin::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use tlb::{TlbInvalidate, TlbTarget};

/// A VM's stage-2 MMU: the table, its lock, and its epoch collector.
pub struct Mmu<M: PageTableMemory> {
    table: RwLock<Stage2PageTable<M>>,
    /// Writers waiting for the lock: new readers hold back while nonzero,
    /// so a stream of faults cannot starve the write side.
    writers_waiting: AtomicUsize,
    collector: Collector,
}

impl<M: PageTableMemory + Clone + Send + 'static> Mmu<M> {
    /// Wraps `table`.
    pub fn new(table: Stage2PageTable<M>) -> Self {
        Self {
            table: RwLock::new(table),
            writers_waiting: AtomicUsize::new(0),
            collector: Collector::new(),
        }
    }

    /// Registers one CPU with the MMU's epoch collector. Keep one handle per
    /// CPU and pass it to every shared operation on that CPU.
    pub fn register(&self) -> LocalHandle {
        self.collector.register()
    }

    /// Takes the read side: fault handling. Waits while a writer waits.
    pub fn read(&self) -> MmuReader<'_, M> {
        while self.writers_waiting.load(Ordering::Acquire) != 0 {
            core::hint::spin_loop();
        }
        MmuReader {
            table: self.table.read(),
            collector: &self.collector,
        }
    }

    /// Takes the write side: range operations. Readers arriving meanwhile
    /// wait, so the writer gets the lock once the current readers leave.
    pub fn write(&self) -> MmuWriter<'_, M> {
        self.writers_waiting.fetch_add(1, Ordering::AcqRel);
        let table = self.table.write();
        self.writers_waiting.fetch_sub(1, Ordering::Release);
        MmuWriter { table }
    }

    /// Tries to free retired tables whose readers have all unpinned.
    pub fn collect(&self, cpu: &LocalHandle) {
        cpu.pin().flush();
    }

    /// The table, once every other user is gone. Tables retired earlier are
    /// freed when the last epoch handle is dropped.
    pub fn into_inner(self) -> Stage2PageTable<M> {
        self.table.into_inner()
    }
}

/// The read side of an [`Mmu`]: shared walks only.
pub struct MmuReader<'a, M: PageTableMemory> {
    table: RwLockReadGuard<'a, Stage2PageTable<M>>,
    collector: &'a Collector,
}

impl<M: PageTableMemory + Clone + Send + 'static> MmuReader<'_, M> {
    fn check(&self, cpu: &LocalHandle) -> Result<(), Error> {
        if cpu.collector() == self.collector {
            Ok(())
        } else {
            Err(Error::ForeignHandle)
        }
    }

    /// Fixes a translation fault by installing `leaf`, taking at most
    /// [`FAULT_CACHE_PAGES`](crate::FAULT_CACHE_PAGES) pages from `cache`
    /// (splitting a block or collapsing a table on the way as needed).
    /// `Err(Again)`: another vCPU is changing this entry; re-enter the guest.
    pub fn map(
        &self,
        cpu: &LocalHandle,
        leaf: FaultMapping,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        self.check(cpu)?;
        let guard = cpu.pin();
        self.table.map_shared(&guard, leaf, cache, tlb)
    }

    /// Fixes a permission fault: adds `perms` to the leaf mapping `ipa` and
    /// invalidates it on this CPU. `Err(Again)` when no leaf maps it now.
    pub fn relax_perms(
        &self,
        cpu: &LocalHandle,
        ipa: u64,
        perms: Perms,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        self.check(cpu)?;
        let _guard = cpu.pin();
        self.table.relax_shared(ipa, perms, tlb)
    }

    /// Fixes an access-flag fault: sets the flag of the leaf mapping `ipa`;
    /// returns whether it was clear. `Err(Again)` when no leaf maps it now.
    pub fn set_young(&self, cpu: &LocalHandle, ipa: u64) -> Result<bool, Error> {
        self.check(cpu)?;
        let _guard = cpu.pin();
        self.table.set_young_shared(ipa)
    }

    /// Runs `visitor` over `[ipa, ipa + size)` in a shared walk, pinned:
    /// [`WalkFlags::SHARED`] is forced, so every change the visitor makes
    /// is a compare-and-swap, and an `Again` it returns skips that entry.
    pub fn walk<V: Visitor>(
        &self,
        cpu: &LocalHandle,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<(), Error> {
        self.check(cpu)?;
        let end = self.table.check_range(ipa, size)?;
        let _guard = cpu.pin();
        Ok(self
            .table
            .walk_range(ipa, end, flags | WalkFlags::SHARED, visitor)?)
    }

    /// The leaf mapping `ipa`, read while pinned.
    pub fn lookup(&self, cpu: &LocalHandle, ipa: u64) -> Result<Option<Mapping>, Error> {
        self.check(cpu)?;
        let _guard = cpu.pin();
        Ok(self.table.lookup(ipa))
    }

    /// The VM these operations invalidate TLB entries of.
    pub fn tlb_target(&self) -> TlbTarget {
        *self.table.tlb_target()
    }

    /// The page-table memory provider (to top up caches outside the lock).
    pub fn memory(&self) -> &M {
        self.table.memory()
    }
}

/// The write side of an [`Mmu`]: exclusive access to the table.
pub struct MmuWriter<'a, M: PageTableMemory> {
    table: RwLockWriteGuard<'a, Stage2PageTable<M>>,
}

impl<M: PageTableMemory> core::ops::Deref for MmuWriter<'_, M> {
    type Target = Stage2PageTable<M>;
    fn deref(&self) -> &Stage2PageTable<M> {
        &self.table
    }
}

impl<M: PageTableMemory> core::ops::DerefMut for MmuWriter<'_, M> {
    fn deref_mut(&mut self) -> &mut Stage2PageTable<M> {
        &mut self.table
    }
}
