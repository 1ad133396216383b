//! Deleting and moving memslots at run time, with stage-2 faults in flight.
//!
//! [`delete_slot`] and [`move_slot`] combine a VM's [`Memslots`] and its
//! [`Mmu`] so that, when they return, no stage-2 leaf maps the removed guest
//! range, no fault in flight can install one, and no vCPU still translates
//! through the old slot: the old backing may be freed or reused.
//!
//! # Algorithm
//!
//! 1. [`Mmu::begin_invalidate`]: faults answer `Again` from now on (the
//!    invalidation sequence, [`crate::invalidate`]);
//! 2. publish the new memslot set and wait until no reader can still see the
//!    old one ([`Memslots::delete_synced`] / [`Memslots::move_synced`], an
//!    epoch grace period, KVM's `synchronize_srcu`);
//! 3. under the MMU write lock, unmap the old slot's IPA range from stage 2
//!    (one deferred range flush: a `FlushBatch`, flushed once, and tables
//!    left empty freed after it), then [`MmuWriter::end_invalidate`](crate::MmuWriter::end_invalidate)
//!    (sequence raised) before releasing the lock.
//!
//! Step 3's sequence raise makes every fault that looked the old slot up
//! and has not yet installed its leaf answer `Again` (it re-enters the guest
//! and looks the slot up again, in the new set); a fault that installed
//! before the unmap has its leaf removed by it. Step 2 makes sure that no
//! vCPU is still reading the old slot (its translation, its dirty bitmap, or
//! guest memory through it) when the call returns.
//!
//! # How the hypervisor uses it
//!
//! Fault path, on each vCPU, in this order:
//! 1. `let ticket = mmu.fault_ticket();` **before** the memslot lookup;
//! 2. pin the memslots' epoch, look the slot up, translate the IPA (and
//!    mark it dirty), unpin;
//! 3. top the page cache up, then `mmu.read(cpu)?.map_checked(ticket, leaf,
//!    cache, tlb)` (or `relax_perms_checked` / `set_young_checked` for a
//!    leaf that is there already); `Err(Again)` means "re-enter the guest".
//!
//! Control path (one CPU, neither pinned in the memslots' collector nor
//! holding an `MmuReader`): top a [`PageCache`] up to at least
//! [`SLOT_UNMAP_CACHE_PAGES`], then call [`delete_slot`] or [`move_slot`];
//! after it returns, the old backing belongs to the caller again (for a
//! move, the backing stays in use at the new place).

use crate::cache::PageCache;
use crate::mm::PageTableMemory;
use crate::mmu::Mmu;
use crate::table::Error;
use core::fmt;
use crossbeam_epoch::LocalHandle;
use memslot::{Gfn, MemslotError, Memslots, PAGE_SHIFT, SlotId, SlotSpec};
use tlb::TlbInvalidate;

/// Table pages the unmap of a slot may take: splitting a block that straddles
/// each end of the range takes at most two tables per end.
pub const SLOT_UNMAP_CACHE_PAGES: usize = 4;

/// Why a run-time delete or move failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotSyncError {
    /// The memslots refused the change; nothing changed.
    Memslot(MemslotError),
    /// The cache holds fewer than [`SLOT_UNMAP_CACHE_PAGES`] pages; nothing
    /// changed.
    CacheTooSmall {
        /// Pages in the cache.
        have: usize,
    },
    /// The slot was removed but unmapping its range failed, so leaves of it
    /// may remain (the unmap needed more than [`SLOT_UNMAP_CACHE_PAGES`]
    /// pages, which splits of the range's two ends cannot).
    Unmap(Error),
}

impl fmt::Display for SlotSyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memslot(e) => write!(f, "memslot change refused: {e}"),
            Self::CacheTooSmall { have } => write!(
                f,
                "page cache holds {have} pages, a slot unmap needs {SLOT_UNMAP_CACHE_PAGES}"
            ),
            Self::Unmap(e) => write!(f, "slot removed but its stage-2 unmap failed: {e}"),
        }
    }
}

impl core::error::Error for SlotSyncError {}

/// The IPA range `[start, end)` of `spec`, clipped to the IPA space (the part
/// past it can never have been mapped).
fn ipa_range(spec: &SlotSpec, ipa_limit: u64) -> (u64, u64) {
    let start = (spec.base_gfn.0 << PAGE_SHIFT).min(ipa_limit);
    let end = ((spec.base_gfn.0 + spec.npages) << PAGE_SHIFT).min(ipa_limit);
    (start, end)
}

/// Runs one invalidating change: begin, `change` (publish and wait), unmap
/// the old range, end. Returns the old spec.
fn invalidate<M: PageTableMemory + Clone + Send + 'static>(
    mmu: &Mmu<M>,
    cache: &mut PageCache,
    tlb: &impl TlbInvalidate,
    change: impl FnOnce() -> Result<(SlotSpec, u64), MemslotError>,
) -> Result<SlotSpec, SlotSyncError> {
    if cache.len() < SLOT_UNMAP_CACHE_PAGES {
        return Err(SlotSyncError::CacheTooSmall { have: cache.len() });
    }
    let token = mmu.begin_invalidate();
    let (old, _generation) = match change() {
        Ok(changed) => changed,
        Err(e) => {
            // Refused: nothing was published, faults in flight stay valid.
            mmu.cancel_invalidate(token);
            return Err(SlotSyncError::Memslot(e));
        }
    };
    let mut writer = mmu.write();
    let (start, end) = ipa_range(&old, writer.config().ipa_limit());
    let result = writer.unmap(start, end - start, cache, tlb);
    writer.end_invalidate(token);
    result.map(|()| old).map_err(SlotSyncError::Unmap)
}

/// Deletes slot `id` at run time: publish, wait for readers, unmap its IPA
/// range with one deferred range flush (see the module doc for the order and
/// what it guarantees). `handle` is the caller's handle of the memslots'
/// collector, unpinned; the caller holds no [`crate::MmuReader`]. Returns the
/// deleted slot's spec; its backing is the caller's again.
pub fn delete_slot<M: PageTableMemory + Clone + Send + 'static>(
    memslots: &Memslots,
    handle: &LocalHandle,
    mmu: &Mmu<M>,
    id: SlotId,
    cache: &mut PageCache,
    tlb: &impl TlbInvalidate,
) -> Result<SlotSpec, SlotSyncError> {
    invalidate(mmu, cache, tlb, || memslots.delete_synced(handle, id))
}

/// Moves slot `id` to `base_gfn` at run time: publish, wait for readers,
/// unmap its old IPA range with one deferred range flush; faults map it at
/// its new place afresh. Same contract as [`delete_slot`]. Returns the spec
/// the slot had before.
pub fn move_slot<M: PageTableMemory + Clone + Send + 'static>(
    memslots: &Memslots,
    handle: &LocalHandle,
    mmu: &Mmu<M>,
    id: SlotId,
    base_gfn: Gfn,
    cache: &mut PageCache,
    tlb: &impl TlbInvalidate,
) -> Result<SlotSpec, SlotSyncError> {
    invalidate(mmu, cache, tlb, || {
        memslots.move_synced(handle, id, base_gfn)
    })
}
