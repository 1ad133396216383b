//! The synchronisation primitives the engine's lock-free paths are made of:
//! the table slots' atomics, the MMU lock and its spin waits, and exclusive
//! access to owned pages.
//!
//! Slots are `AtomicU64`: core's normally, loom's when the crate is built with
//! `--cfg loom`, so the loom models explore every interleaving of the
//! compare-and-swap protocol. A table page that no other walker can reach (a
//! fresh one not yet published, or an unlinked one being freed) is accessed
//! through `&mut` slots with plain reads and writes, which are not scheduling
//! points for loom and would be reported as races if another thread could in
//! fact still see the page.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};

use crate::addr::PhysAddr;
use crate::descriptor::ENTRIES_PER_TABLE;
use crate::mm::PageTableMemory;

/// Writes a slot of a page the caller owns exclusively.
pub(crate) fn write_owned(slot: &mut AtomicU64, value: u64) {
    #[cfg(loom)]
    slot.with_mut(|v| *v = value);
    #[cfg(not(loom))]
    {
        *slot.get_mut() = value;
    }
}

/// Reads a slot of a page the caller owns exclusively.
pub(crate) fn read_owned(slot: &mut AtomicU64) -> u64 {
    #[cfg(loom)]
    return slot.with_mut(|v| *v);
    #[cfg(not(loom))]
    *slot.get_mut()
}

/// The 512 slots of a table page the caller owns exclusively.
///
/// # Safety
///
/// `page` must be a live table page of `mm` that no walker (software or
/// hardware) can reach for `'a`, and no other reference to its slots may
/// exist meanwhile.
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn owned_slots<M: PageTableMemory + ?Sized>(
    mm: &M,
    page: PhysAddr,
) -> &mut [AtomicU64] {
    let ptr = mm.phys_to_virt(page).as_ptr().cast::<AtomicU64>();
    // SAFETY: a live page of 512 slots, exclusively the caller's (contract).
    unsafe { core::slice::from_raw_parts_mut(ptr, ENTRIES_PER_TABLE) }
}

// The MMU lock, its table cell and its spin waits are loom's only when the
// epoch collector is loom's too (`--cfg crossbeam_loom`, the models in
// `tests/loom_slot_sync.rs`): with a native collector (`tests/loom_bbm.rs`)
// loom cannot see the epochs' happens-before edges, and a table freed by a
// collection during the run would show as a race that is not one. There
// the lock stays `spin`'s, which those models never contend.

#[cfg(all(loom, crossbeam_loom))]
pub(crate) use loom::sync::atomic::AtomicUsize;

#[cfg(not(all(loom, crossbeam_loom)))]
pub(crate) use core::sync::atomic::AtomicUsize;

/// One pause in a spin loop; under loom (as for the lock), a yield to the model's other
/// threads (a spin on an atomic would otherwise never let them run).
#[inline]
pub(crate) fn spin_wait() {
    #[cfg(all(loom, crossbeam_loom))]
    loom::thread::yield_now();
    #[cfg(not(all(loom, crossbeam_loom)))]
    core::hint::spin_loop();
}

/// One CPU's reader-writer lock of the MMU: `spin`'s, or loom's under
/// `--cfg loom --cfg crossbeam_loom` (so that the models explore the MMU lock's exclusion and
/// its happens-before edges, and a contended lock yields to the others).
#[cfg(not(all(loom, crossbeam_loom)))]
pub(crate) type CpuRwLock = spin::RwLock<()>;
#[cfg(not(all(loom, crossbeam_loom)))]
pub(crate) type CpuReadGuard<'a> = spin::RwLockReadGuard<'a, ()>;
#[cfg(not(all(loom, crossbeam_loom)))]
pub(crate) type CpuWriteGuard<'a> = spin::RwLockWriteGuard<'a, ()>;
#[cfg(all(loom, crossbeam_loom))]
pub(crate) type CpuRwLock = loom::sync::RwLock<()>;
#[cfg(all(loom, crossbeam_loom))]
pub(crate) type CpuReadGuard<'a> = loom::sync::RwLockReadGuard<'a, ()>;
#[cfg(all(loom, crossbeam_loom))]
pub(crate) type CpuWriteGuard<'a> = loom::sync::RwLockWriteGuard<'a, ()>;

/// Takes `lock`'s read side.
pub(crate) fn read_lock(lock: &CpuRwLock) -> CpuReadGuard<'_> {
    #[cfg(all(loom, crossbeam_loom))]
    // A model that panicked while holding the lock has failed already.
    return lock.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    #[cfg(not(all(loom, crossbeam_loom)))]
    lock.read()
}

/// Takes `lock`'s write side.
pub(crate) fn write_lock(lock: &CpuRwLock) -> CpuWriteGuard<'_> {
    #[cfg(all(loom, crossbeam_loom))]
    return lock
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    #[cfg(not(all(loom, crossbeam_loom)))]
    lock.write()
}

/// The MMU's table cell: core's `UnsafeCell`, or loom's (as for the lock),
/// where every shared and exclusive access is checked for a happens-before
/// order with the others (a write side that does not exclude some CPU's read
/// side fails a model).
pub(crate) struct TableCell<T> {
    #[cfg(all(loom, crossbeam_loom))]
    inner: loom::cell::UnsafeCell<T>,
    #[cfg(not(all(loom, crossbeam_loom)))]
    inner: core::cell::UnsafeCell<T>,
}

impl<T> TableCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(all(loom, crossbeam_loom))]
            inner: loom::cell::UnsafeCell::new(value),
            #[cfg(not(all(loom, crossbeam_loom)))]
            inner: core::cell::UnsafeCell::new(value),
        }
    }

    pub(crate) fn into_inner(self) -> T {
        self.inner.into_inner()
    }

    /// A shared reference to the value.
    ///
    /// # Safety
    ///
    /// No `&mut` to the value may exist while the returned reference lives.
    pub(crate) unsafe fn get(&self) -> &T {
        #[cfg(all(loom, crossbeam_loom))]
        // SAFETY: the caller's contract.
        return self.inner.with(|ptr| unsafe { &*ptr });
        #[cfg(not(all(loom, crossbeam_loom)))]
        // SAFETY: the caller's contract.
        unsafe {
            &*self.inner.get()
        }
    }

    /// An exclusive reference to the value.
    ///
    /// # Safety
    ///
    /// No other reference to the value may exist while the returned one
    /// lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get_mut(&self) -> &mut T {
        #[cfg(all(loom, crossbeam_loom))]
        // SAFETY: the caller's contract.
        return self.inner.with_mut(|ptr| unsafe { &mut *ptr });
        #[cfg(not(all(loom, crossbeam_loom)))]
        // SAFETY: the caller's contract.
        unsafe {
            &mut *self.inner.get()
        }
    }
}
