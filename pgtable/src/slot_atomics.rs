//! The atomics table slots are made of, and exclusive access to owned pages.
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
