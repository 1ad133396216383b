//! The invalidation sequence: stale faults answer `Again` instead of
//! installing a leaf (KVM's `mmu_invalidate_seq` and
//! `mmu_invalidate_in_progress`).
//!
//! A vCPU resolves a stage-2 fault in two steps that are not atomic together:
//! it translates the IPA through a memslot (lock-free, under the memslots'
//! epoch), then installs the leaf under the read side of the MMU lock. An
//! invalidation (a memslot deleted or moved, so an IPA range loses its
//! backing) publishes the new slots and unmaps the range under the write
//! side. A fault that translated before the publication and installs after
//! the unmap would leave the guest a mapping of memory it no longer owns.
//!
//! # Algorithm
//!
//! The MMU holds two counters:
//! - `in_progress`: invalidations begun and not yet ended;
//! - `seq`: invalidations ended, ever.
//!
//! An invalidation calls [`Mmu::begin_invalidate`] (`in_progress += 1`)
//! before it publishes the change that removes the range, unmaps the range
//! under the write lock, and calls [`MmuWriter::end_invalidate`] while still
//! holding it (`seq += 1`, then `in_progress -= 1`).
//!
//! The fault path takes a [`FaultTicket`] ([`Mmu::fault_ticket`]: `seq`)
//! *before* its memslot lookup, and [`MmuReader::map_checked`] compares it
//! under the read lock, before walking: if an invalidation is in progress or
//! `seq` moved, the fault returns [`Error::Again`](crate::Error::Again) and the vCPU re-enters the
//! guest, which faults again and looks the slot up afresh.
//! [`MmuReader::relax_perms_checked`] and [`MmuReader::set_young_checked`]
//! check the same ticket before they widen a leaf or set its access flag:
//! enabling dirty logging is an invalidation too, and a fault whose slot view
//! predates it must not make a write-protected page writable unlogged.
//!
//! # Why it is enough
//!
//! Take a fault whose lookup saw the old slot, and an invalidation `I` of it.
//! - If the fault's recheck (under the read lock) precedes `I`'s unmap
//!   (under the write lock), the leaf it installs is removed by the unmap.
//! - Otherwise the recheck follows the unmap's write section. `in_progress`
//!   was raised before the section and `seq` raised inside it, so the read
//!   lock's acquire shows the recheck `seq` raised (or `in_progress` still
//!   up): `Again`. The ticket cannot already include `I`'s raise: `seq` is
//!   raised after the publication, so a ticket that includes it (acquire)
//!   orders the lookup after the publication, which cannot then see the old
//!   slot.
//!
//! # Cost
//!
//! One acquire load on the fault path before the lookup and two under the
//! read lock, on counters written only by invalidations; no shared write.
//! `in_progress` also turns faults away early while an invalidation is
//! between its publication and its unmap.

use crate::mmu::{Mmu, MmuReader, MmuWriter};
use crate::sync_primitives::{AtomicU64, Ordering};

/// A VM's invalidation counters (in [`Mmu`]).
#[derive(Debug, Default)]
pub(crate) struct Invalidation {
    in_progress: AtomicU64,
    seq: AtomicU64,
}

/// The invalidation sequence a fault read before its memslot lookup; passed
/// to [`MmuReader::map_checked`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a ticket is only useful when passed to `MmuReader::map_checked`"]
pub struct FaultTicket {
    seq: u64,
}

impl Invalidation {
    pub(crate) fn ticket(&self) -> FaultTicket {
        FaultTicket {
            seq: self.seq.load(Ordering::Acquire),
        }
    }

    /// Whether a fault holding `ticket` must retry. Called under the read lock.
    pub(crate) fn is_stale(&self, ticket: FaultTicket) -> bool {
        // `in_progress` first: an invalidation that ended raised `seq` before
        // lowering `in_progress` (both release), so reading it lowered (acquire)
        // shows `seq` raised.
        self.in_progress.load(Ordering::Acquire) != 0
            || self.seq.load(Ordering::Acquire) != ticket.seq
    }

    pub(crate) fn begin(&self) {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
    }

    /// Called under the write lock, once per `begin`.
    pub(crate) fn end(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        self.in_progress.fetch_sub(1, Ordering::Release);
    }

    /// Ends a `begin` whose change was refused: nothing was removed, so
    /// tickets stay valid.
    pub(crate) fn cancel(&self) {
        self.in_progress.fetch_sub(1, Ordering::Release);
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
}

/// An invalidation begun with [`Mmu::begin_invalidate`]; end it with
/// [`MmuWriter::end_invalidate`] once its range is unmapped, or with
/// [`Mmu::cancel_invalidate`] if its change was refused. Until then
/// every fault of the VM answers `Again`, so it must not be leaked.
#[derive(Debug)]
#[must_use = "an invalidation that never ends turns every fault away"]
pub struct InvalidationToken {
    _private: (),
}

impl<M: crate::PageTableMemory + Clone + Send + 'static> Mmu<M> {
    /// The ticket a fault takes before its memslot lookup (see
    /// [`crate::invalidate`]).
    #[inline]
    pub fn fault_ticket(&self) -> FaultTicket {
        self.invalidation().ticket()
    }

    /// Begins an invalidation: from now until its end, faults answer `Again`.
    /// Call it before publishing the memslot change that removes a range.
    pub fn begin_invalidate(&self) -> InvalidationToken {
        self.invalidation().begin();
        InvalidationToken { _private: () }
    }

    /// Ends an invalidation whose change was refused before anything was
    /// published: the sequence stays, so faults in flight stay valid.
    pub fn cancel_invalidate(&self, token: InvalidationToken) {
        let InvalidationToken { _private: () } = token;
        self.invalidation().cancel();
    }

    /// Invalidations ended so far.
    pub fn invalidation_seq(&self) -> u64 {
        self.invalidation().seq()
    }
}

impl<M: crate::PageTableMemory> MmuWriter<'_, M> {
    /// Ends an invalidation once its range is unmapped (under this write
    /// lock): faults whose ticket predates it answer `Again` from now on.
    pub fn end_invalidate(&self, token: InvalidationToken) {
        let InvalidationToken { _private: () } = token;
        self.invalidation().end();
    }
}

impl<M: crate::PageTableMemory + Clone + Send + 'static> MmuReader<'_, M> {
    /// Whether a fault holding `ticket` is stale: an invalidation began or
    /// ended since the ticket was taken.
    #[inline]
    pub fn is_stale(&self, ticket: FaultTicket) -> bool {
        self.invalidation().is_stale(ticket)
    }
}
