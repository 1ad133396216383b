//! Break-before-make and table construction, shared by every operation.
//!
//! Replacing a valid entry by one with another output or another size goes
//! through [`replace`]: lock the slot (the "break"; in a shared walk a
//! compare-and-swap only one walker wins), invalidate the TLB for what the old
//! entry covered (one page with the leaf's level hint for a block or page,
//! which drops the whole leaf; the whole span without a hint for a table),
//! publish the new entry with a release store (the "make"), and hand an
//! unlinked subtree to the [`Reclaim`] policy: freed at once in an exclusive
//! walk, retired to the epoch collector in a shared one. New tables are fully
//! written before they are published.
//!
//! A new leaf gets its cache maintenance between the break and the make, as
//! KVM's `stage2_map_walker_try_leaf` does ([`Env::prepare_leaf`]): without
//! FWB its memory is cleaned and invalidated to the point of coherency when
//! it is Normal memory, and the instruction cache is invalidated when it is
//! executable, so no vCPU can use the translation before the maintenance is
//! done.

use crate::addr::PhysAddr;
use crate::cache::PageCache;
use crate::descriptor::{
    Descriptor, ENTRIES_PER_TABLE, LAST_LEVEL, MemType, PAGE_SIZE, Perms, level_size,
};
use crate::mm::PageTableMemory;
use crate::sync_primitives::{owned_slots, read_owned, write_owned};
use crate::table::free_subtree;
use crate::walk::{VisitContext, WalkError};
use tlb::{Scope, TlbInvalidate, TlbTarget};

/// What happens to a table unlinked by a walk.
pub(crate) enum Reclaim<'g> {
    /// Freed as soon as the TLB no longer references it (exclusive walks:
    /// no other walker exists).
    Now,
    /// Retired: the function defers freeing the subtree `(table, level)`
    /// until every walker that could still see it has unpinned (shared walks).
    Epoch(&'g dyn Fn(PhysAddr, u8)),
}

/// Everything an updating visitor needs besides the slot.
pub(crate) struct Env<'a, M: PageTableMemory, T: TlbInvalidate> {
    pub(crate) mm: &'a M,
    pub(crate) tlb: &'a T,
    pub(crate) target: &'a TlbTarget,
    pub(crate) fwb: bool,
    pub(crate) reclaim: Reclaim<'a>,
}

impl<M: PageTableMemory, T: TlbInvalidate> Env<'_, M, T> {
    /// Invalidates what `old` at `level`, translating from `base`, covered.
    pub(crate) fn flush_entry(&self, base: u64, level: u8, old: Descriptor) {
        if old.is_table(level) {
            let size = crate::descriptor::level_size(level);
            self.tlb
                .flush_range(self.target, base, size, None, Scope::InnerShareable);
        } else if old.is_valid() {
            self.tlb.flush_range(
                self.target,
                base,
                PAGE_SIZE,
                Some(level),
                Scope::InnerShareable,
            );
        }
    }

    /// Whether publishing the leaf `new` needs cache maintenance first.
    pub(crate) fn leaf_needs_cmo(&self, new: Descriptor) -> bool {
        self.dcache_due(new) || new.perms().contains(Perms::EXEC)
    }

    /// Whether the memory of the leaf `new` must be cleaned to the point of
    /// coherency: stage 2 cannot force write-back (no FWB) and the leaf is
    /// Normal (cacheable) memory.
    pub(crate) fn dcache_due(&self, new: Descriptor) -> bool {
        !self.fwb && new.mem_type(false) == Some(MemType::Normal)
    }

    /// The cache maintenance due before the leaf `new` at `level` is
    /// published: clean and invalidate its whole span to the point of
    /// coherency without FWB, invalidate the instruction cache when it is
    /// executable.
    pub(crate) fn prepare_leaf(&self, level: u8, new: Descriptor) {
        let size = level_size(level);
        if self.dcache_due(new) {
            self.mm.clean_inval_dcache(new.output(), size);
        }
        if new.perms().contains(Perms::EXEC) {
            self.mm.invalidate_icache(new.output(), size);
        }
    }

    /// The "break": locks the visited entry (see
    /// [`VisitContext::try_lock`]) and, when it was valid, tells the backend
    /// ([`TlbInvalidate::on_break`]) so a checking backend can hold the
    /// make to the order. Returns the entry it broke.
    pub(crate) fn break_entry(&self, ctx: &mut VisitContext<'_>) -> Result<Descriptor, WalkError> {
        let old = ctx.old;
        ctx.try_lock()?;
        if old.is_valid() {
            let leaf_level = (!old.is_table(ctx.level)).then_some(ctx.level);
            self.tlb
                .on_break(self.target, ctx.base(), ctx.size(), leaf_level);
        }
        Ok(old)
    }

    /// The "make": publishes `new` in the slot this walker broke, which held
    /// `old`; when `old` was valid the backend hears of it first
    /// ([`TlbInvalidate::on_make`]). The old entry's TLB flush must be done.
    pub(crate) fn make_entry(&self, ctx: &mut VisitContext<'_>, old: Descriptor, new: Descriptor) {
        if old.is_valid() {
            self.tlb.on_make(self.target, ctx.base(), ctx.size());
        }
        ctx.publish(new);
    }

    /// Break-before-make of the visited entry into `new`; a new leaf gets
    /// its cache maintenance ([`prepare_leaf`](Self::prepare_leaf)) after the
    /// break and before the make.
    pub(crate) fn replace(
        &self,
        ctx: &mut VisitContext<'_>,
        new: Descriptor,
    ) -> Result<(), WalkError> {
        let old = self.break_entry(ctx)?;
        self.flush_entry(ctx.base(), ctx.level, old);
        if new.is_leaf(ctx.level) {
            self.prepare_leaf(ctx.level, new);
        }
        self.make_entry(ctx, old, new);
        if old.is_table(ctx.level) {
            self.unlinked(old.output(), ctx.level + 1);
        }
        Ok(())
    }

    /// Disposes of the unlinked table `table` at `level` and its subtree,
    /// whose TLB entries have been invalidated.
    pub(crate) fn unlinked(&self, table: PhysAddr, level: u8) {
        match self.reclaim {
            // SAFETY: exclusive walk: the slot no longer points at the
            // subtree, the TLB was invalidated for its span, and no other
            // walker exists.
            Reclaim::Now => unsafe { free_subtree(self.mm, table, level) },
            Reclaim::Epoch(retire) => retire(table, level),
        }
    }

    /// Takes a zeroed page and fills it with the 512 children of `block`
    /// at `level`, so that it translates exactly as the block did.
    pub(crate) fn block_children(
        &self,
        cache: &mut PageCache,
        block: Descriptor,
        level: u8,
    ) -> Result<PhysAddr, WalkError> {
        let page = cache.pop().ok_or(WalkError::NoMemory)?;
        // SAFETY: the page came from the cache: ours, live and unpublished.
        let slots = unsafe { owned_slots(self.mm, page) };
        for (i, slot) in slots.iter_mut().enumerate() {
            write_owned(slot, block.child_of_block(level, i).raw());
        }
        Ok(page)
    }

    /// Builds, unpublished, the subtree that maps `block` at `level` with
    /// pages only: one table at level 2 blocks, 513 at level 1 blocks.
    /// Fails, with nothing taken, when the cache holds too few pages.
    pub(crate) fn page_subtree(
        &self,
        cache: &mut PageCache,
        block: Descriptor,
        level: u8,
    ) -> Result<PhysAddr, WalkError> {
        if cache.len() < pages_to_split_to_pages(level) {
            return Err(WalkError::NoMemory);
        }
        let table = self.block_children(cache, block, level)?;
        if level + 1 < LAST_LEVEL {
            // SAFETY: the table was just built by us and is unpublished.
            let slots = unsafe { owned_slots(self.mm, table) };
            for slot in slots {
                let child = Descriptor::from_raw(read_owned(slot));
                let sub = self.page_subtree(cache, child, level + 1)?;
                write_owned(slot, Descriptor::table(sub).raw());
            }
        }
        Ok(table)
    }
}

/// Table pages needed to split a block at `level` down to pages.
pub(crate) const fn pages_to_split_to_pages(level: u8) -> usize {
    let mut pages = 0;
    let mut l = level;
    let mut tables_at_level = 1;
    while l < LAST_LEVEL {
        pages += tables_at_level;
        tables_at_level *= ENTRIES_PER_TABLE;
        l += 1;
    }
    pages
}
