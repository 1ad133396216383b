//! The fault path: shared walks that fix one stage-2 fault.
//!
//! Every vCPU handles its faults at the same time, under the read side of the
//! MMU lock ([`crate::MmuReader`]). Each fix is a walk with
//! [`WalkFlags::SHARED`] and [`WalkFlags::HANDLE_FAULT`]: every slot change is
//! a compare-and-swap against the value the walker read, break-before-make
//! parks the locked marker in the slot (exactly one walker wins), and a walker
//! that meets a locked entry or loses a swap stops with `Again`, which the
//! vCPU turns into "re-enter the guest" (the fault recurs if still needed).
//!
//! - [`Stage2PageTable::map_shared`] installs a leaf of the size the caller
//!   allows (4 KiB, or a 2 MiB / 1 GiB block where the memslot and alignment
//!   permit), splitting a block or collapsing a table on the way with
//!   break-before-make, exactly as the exclusive map does;
//! - [`Stage2PageTable::relax_shared`] adds permissions to the leaf (the
//!   instruction cache invalidated first when it gains execute) and flushes
//!   the faulting page on this CPU only, also when the leaf was relaxed
//!   already or the race to relax it was lost (a spurious fault: this CPU's
//!   TLB holds the stricter entry, and only a local flush drops it);
//! - [`Stage2PageTable::set_young_shared`] sets the access flag.
//!
//! Tables unlinked by a shared walk are retired to the epoch collector with
//! the walk's guard and freed, subtree and all, once every walker that could
//! still see them has unpinned.

use crate::addr::PhysAddr;
use crate::bbm::{Env, Reclaim};
use crate::cache::PageCache;
use crate::descriptor::{Attributes, LEAF_SIZES, PAGE_SIZE, Perms};
use crate::map::{MapVisitor, Placement};
use crate::mm::PageTableMemory;
use crate::table::{Error, Stage2PageTable, free_subtree};
use crate::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use crossbeam_epoch::Guard;
use tlb::{Scope, TlbInvalidate};

/// Table pages one fault can take at most: a table at each of levels 1-3.
pub const FAULT_CACHE_PAGES: usize = 3;

/// The leaf a translation fault installs: `[ipa, ipa + size)` to `pa` with
/// `attrs`, where `size` (4 KiB, 2 MiB or 1 GiB) is the largest leaf the
/// memslot allows and both addresses are aligned to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultMapping {
    /// First IPA of the leaf.
    pub ipa: u64,
    /// Size of the leaf.
    pub size: u64,
    /// Output address of `ipa`.
    pub pa: PhysAddr,
    /// Permissions and memory type.
    pub attrs: Attributes,
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// Checks a fault's leaf and returns its end.
    fn check_leaf(&self, leaf: &FaultMapping) -> Result<u64, Error> {
        let FaultMapping { ipa, size, pa, .. } = *leaf;
        if !LEAF_SIZES.contains(&size) || !ipa.is_multiple_of(size) || !pa.is_aligned(size) {
            return Err(Error::Unaligned);
        }
        self.check_output(size, pa)?;
        self.check_range(ipa, size)
    }

    /// Installs `leaf` in an exclusive walk: the fault fix of a hypervisor
    /// that handles faults under the write side of the MMU lock (one vCPU at
    /// a time), and the baseline the shared path is measured against. Takes
    /// at most [`FAULT_CACHE_PAGES`] pages; on `NoMemory` nothing changed.
    pub fn map_leaf(
        &mut self,
        leaf: FaultMapping,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let end = self.check_leaf(&leaf)?;
        let FaultMapping { ipa, pa, attrs, .. } = leaf;
        let flags = WalkFlags::HANDLE_FAULT | WalkFlags::LEAF | WalkFlags::TABLE_PRE;
        self.exclusive_map_walk(ipa, end, pa, attrs, cache, tlb, flags)
    }
}

const FAULT_WALK: WalkFlags = WalkFlags::SHARED.union(WalkFlags::HANDLE_FAULT);

impl<M: PageTableMemory + Clone + Send + 'static> Stage2PageTable<M> {
    /// Defers freeing an unlinked subtree past every walker pinned now.
    fn retire<'g>(&'g self, guard: &'g Guard) -> impl Fn(PhysAddr, u8) + 'g {
        move |table, level| {
            let mm = self.mm.clone();
            guard.defer(move || {
                // SAFETY: the subtree was unlinked and its span flushed before
                // it was retired, and the epoch runs this only after every
                // walker that was pinned then (and so could still see it)
                // has unpinned: nothing can reach it any more.
                unsafe { free_subtree(&mm, table, level) }
            });
        }
    }

    /// Installs `leaf` in a shared walk. The caller holds the read side of
    /// the MMU lock and `guard` pins this CPU.
    pub(crate) fn map_shared(
        &self,
        guard: &Guard,
        leaf: FaultMapping,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let FaultMapping {
            ipa,
            size,
            pa,
            attrs,
        } = leaf;
        if !LEAF_SIZES.contains(&size) || !ipa.is_multiple_of(size) || !pa.is_aligned(size) {
            return Err(Error::Unaligned);
        }
        let end = self.check_range(ipa, size)?;
        self.check_output(size, pa)?;
        let retire = self.retire(guard);
        let env = Env {
            mm: &self.mm,
            tlb,
            target: &self.target,
            fwb: self.config.fwb(),
            reclaim: Reclaim::Epoch(&retire),
        };
        let placement = Placement {
            ipa,
            pa,
            attrs,
            fwb: self.config.fwb(),
        };
        let mut visitor = MapVisitor {
            env,
            cache,
            placement,
        };
        let flags = FAULT_WALK | WalkFlags::LEAF | WalkFlags::TABLE_PRE;
        Ok(self.walk_range(ipa, end, flags, &mut visitor)?)
    }

    /// Applies `update` to the leaf mapping the page of `ipa` in a shared
    /// walk. Returns the leaf it found, `(base, level)`, with whether it
    /// changed it; the walk's own result is `Again` when no valid leaf maps
    /// the page (unmapped or locked) or when another walker changed the leaf
    /// first (the compare-and-swap was lost), and then the leaf found, if
    /// any, is still returned.
    fn update_leaf_shared(
        &self,
        ipa: u64,
        update: impl Fn(crate::Descriptor) -> crate::Descriptor,
    ) -> (Option<(u64, u8)>, Result<bool, Error>) {
        let ipa = ipa & !(PAGE_SIZE - 1);
        let end = match self.check_range(ipa, PAGE_SIZE) {
            Ok(end) => end,
            Err(e) => return (None, Err(e)),
        };
        let mut found = None;
        let mut changed = false;
        let mm = &self.mm;
        let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            if !ctx.old.is_valid() {
                return Err(WalkError::Again);
            }
            found = Some((ctx.base(), ctx.level));
            let new = update(ctx.old);
            if new != ctx.old {
                crate::attrs::gains_exec(mm, ctx.level, ctx.old, new);
                ctx.try_set(new)?;
                changed = true;
            }
            Ok(Step::Continue)
        };
        let walked = self.walk_range(ipa, end, FAULT_WALK | WalkFlags::LEAF, &mut visitor);
        (found, walked.map(|()| changed).map_err(Error::from))
    }

    /// Adds `perms` to the leaf mapping `ipa` (a permission fault), then
    /// invalidates the faulting page on this CPU only. Shared.
    ///
    /// The local invalidation is issued whenever a valid leaf was found,
    /// also when it already had `perms` (another vCPU relaxed it first) or
    /// when the compare-and-swap was lost (`Again`): the fault proves this
    /// CPU's TLB holds a stricter entry than the table, and only this CPU
    /// can drop it, or the vCPU would fault on it forever. KVM does the same
    /// in `kvm_pgtable_stage2_relax_perms`.
    pub(crate) fn relax_shared(
        &self,
        ipa: u64,
        perms: Perms,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let (found, result) =
            self.update_leaf_shared(ipa, |d| d.with_perms(d.perms().union(perms)));
        if let Some((_, level)) = found {
            let page = ipa & !(PAGE_SIZE - 1);
            tlb.flush_range(&self.target, page, PAGE_SIZE, Some(level), Scope::Local);
        }
        result.map(|_| ())
    }

    /// Sets the access flag of the leaf mapping `ipa` (an access-flag
    /// fault); returns whether it was clear. Shared; no TLBI.
    pub(crate) fn set_young_shared(&self, ipa: u64) -> Result<bool, Error> {
        self.update_leaf_shared(ipa, |d| d.with_young(true)).1
    }
}
