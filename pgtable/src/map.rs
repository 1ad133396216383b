//! Mapping: install the largest aligned leaves that fit.
//!
//! For each entry the walk meets, the visitor installs a leaf when the range
//! covers the entry and the output address is aligned to its size (a block at
//! level 1 or 2, a page at level 3). A table met where a block fits is
//! collapsed: break-before-make swaps it for the block, the TLB is flushed for
//! exactly the block's span, and the old subtree is reclaimed. A block met
//! where only a smaller mapping fits is split: a table replicating the block
//! replaces it (break-before-make) and the walk, re-reading the entry,
//! descends into it. An existing leaf is replaced with break-before-make when
//! its output changes, updated in place when only its permissions grow, and
//! left alone when it already maps the range identically.
//!
//! Every leaf installed with a new output gets its cache maintenance before
//! it becomes visible (see `bbm`): an empty slot is locked, maintained and
//! then published, as KVM does, so only the walker that wins the slot does
//! the work. A leaf whose permissions grow to include execute gets its
//! instruction cache invalidated before the update.
//!
//! An exclusive map first counts, in a read-only pass over the same range,
//! the table pages it will take, and fails with `NoMemory` before changing
//! anything when the cache holds fewer: a map never stops half-done.

use crate::addr::PhysAddr;
use crate::bbm::{Env, Reclaim};
use crate::cache::PageCache;
use crate::descriptor::{Attributes, Descriptor, LAST_LEVEL, PAGE_SIZE, Perms, level_size};
use crate::mm::PageTableMemory;
use crate::table::{Error, Stage2PageTable};
use crate::walk::{Step, VisitContext, VisitKind, Visitor, WalkError, WalkFlags};
use tlb::TlbInvalidate;

/// Highest output address (exclusive) a descriptor can hold.
const OUTPUT_LIMIT: u64 = 1 << 48;

/// Where a mapping goes: `[ipa, ..)` to `[pa, ..)` with `attrs`.
#[derive(Clone, Copy)]
pub(crate) struct Placement {
    pub(crate) ipa: u64,
    pub(crate) pa: PhysAddr,
    pub(crate) attrs: Attributes,
    pub(crate) fwb: bool,
}

impl Placement {
    fn output_at(&self, addr: u64) -> PhysAddr {
        self.pa.add(addr - self.ipa)
    }

    /// The leaf at `level` that maps the entry starting at `base`.
    pub(crate) fn leaf(&self, level: u8, base: u64) -> Descriptor {
        Descriptor::leaf(level, self.output_at(base), self.attrs, self.fwb)
    }

    /// Whether one leaf at `level` maps `[cursor, end)`'s part of the entry
    /// at `base`: the range covers it and the output is aligned.
    fn fits(&self, level: u8, base: u64, cursor: u64, end: u64) -> bool {
        let size = level_size(level);
        level >= 1 && cursor == base && base + size <= end && self.output_at(base).is_aligned(size)
    }

    /// Whether the visited entry is a leaf that already maps the visited
    /// part of the range exactly as this placement would.
    fn already_mapped(&self, ctx: &VisitContext<'_>) -> bool {
        let attrs_only = Descriptor::leaf(ctx.level, PhysAddr::new(0), self.attrs, self.fwb);
        ctx.old.is_leaf(ctx.level)
            && ctx.old.output().add(ctx.addr - ctx.base()) == self.output_at(ctx.addr)
            && ctx.old.with_young(true).same_leaf_bits(attrs_only)
    }

    /// Levels below `level` until a leaf fits at `cursor`: the pages one
    /// descent from an entry at `level` takes.
    fn depth_at(&self, level: u8, cursor: u64, end: u64) -> usize {
        let mut l = level + 1;
        while l < LAST_LEVEL && !self.fits(l, cursor & !(level_size(l) - 1), cursor, end) {
            l += 1;
        }
        (l - level) as usize
    }
}

/// Tables needed below an entry at `level` that becomes a fresh table for
/// `[start, end)` (inside the entry): that table, plus those of every child
/// that cannot be handled whole (`whole(child_level, child_base)`).
pub(crate) fn fresh_tables(
    level: u8,
    start: u64,
    end: u64,
    whole: &impl Fn(u8, u64) -> bool,
) -> usize {
    let child = level + 1;
    if child == LAST_LEVEL {
        return 1;
    }
    let size = level_size(child);
    let mut tables = 1;
    let mut base = start & !(size - 1);
    while base < end {
        let (s, e) = (start.max(base), end.min(base + size));
        if !(s == base && e == base + size && whole(child, base)) {
            tables += fresh_tables(child, s, e, whole);
        }
        base += size;
    }
    tables
}

/// Counts the table pages a map will take, without changing anything.
struct MapPlan {
    placement: Placement,
    tables: usize,
}

impl Visitor for MapPlan {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, kind: VisitKind) -> Result<Step, WalkError> {
        let p = self.placement;
        let fits = p.fits(ctx.level, ctx.base(), ctx.addr, ctx.end);
        match kind {
            VisitKind::TablePre if fits => Ok(Step::SkipChildren),
            VisitKind::Leaf if !fits && !p.already_mapped(ctx) => {
                let whole = |level: u8, base: u64| p.output_at(base).is_aligned(level_size(level));
                self.tables += fresh_tables(ctx.level, ctx.addr, ctx.range_end(), &whole);
                Ok(Step::SkipChildren)
            }
            _ => Ok(Step::Continue),
        }
    }
}

/// Installs a mapping (exclusive or shared walk).
pub(crate) struct MapVisitor<'a, M: PageTableMemory, T: TlbInvalidate> {
    pub(crate) env: Env<'a, M, T>,
    pub(crate) cache: &'a mut PageCache,
    pub(crate) placement: Placement,
}

impl<M: PageTableMemory, T: TlbInvalidate> MapVisitor<'_, M, T> {
    /// Replaces the block in the visited entry by a table replicating it.
    pub(crate) fn split_block(
        env: &Env<'_, M, T>,
        cache: &mut PageCache,
        ctx: &mut VisitContext<'_>,
    ) -> Result<(), WalkError> {
        if cache.is_empty() {
            return Err(WalkError::NoMemory);
        }
        let old = env.break_entry(ctx)?;
        let table = env
            .block_children(cache, old, ctx.level)
            .expect("the cache is not empty");
        env.flush_entry(ctx.base(), ctx.level, old);
        env.make_entry(ctx, old, Descriptor::table(table));
        Ok(())
    }

    fn install_leaf(&mut self, ctx: &mut VisitContext<'_>) -> Result<(), WalkError> {
        let new = self.placement.leaf(ctx.level, ctx.base());
        let old = ctx.old;
        if old == new {
            return Ok(());
        }
        if !old.is_valid() {
            if !self.env.leaf_needs_cmo(new) {
                return ctx.try_set(new);
            }
            // Break the empty slot so only this walker maintains the memory,
            // then make: nothing can translate through `new` before the
            // maintenance is done.
            let old = self.env.break_entry(ctx)?;
            self.env.prepare_leaf(ctx.level, new);
            self.env.make_entry(ctx, old, new);
            return Ok(());
        }
        let same_target = old.output() == new.output()
            && old.mem_type(self.env.fwb) == new.mem_type(self.env.fwb);
        if same_target && new.perms().contains(old.perms()) {
            // Same output, permissions only grow: no break needed, and a stale
            // stricter TLB entry costs at most a spurious fault. Gaining
            // execute needs the instruction cache invalidated first.
            if new.perms().contains(Perms::EXEC) && !old.perms().contains(Perms::EXEC) {
                self.env
                    .mm
                    .invalidate_icache(new.output(), level_size(ctx.level));
            }
            return ctx.try_set(new);
        }
        self.env.replace(ctx, new)
    }
}

impl<M: PageTableMemory, T: TlbInvalidate> Visitor for MapVisitor<'_, M, T> {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, kind: VisitKind) -> Result<Step, WalkError> {
        let p = self.placement;
        let fits = p.fits(ctx.level, ctx.base(), ctx.addr, ctx.end);
        match kind {
            VisitKind::TablePre if fits => {
                let block = p.leaf(ctx.level, ctx.base());
                self.env.replace(ctx, block)?;
                Ok(Step::Continue)
            }
            VisitKind::TablePre | VisitKind::TablePost => Ok(Step::Continue),
            VisitKind::Leaf => {
                if ctx.old.is_locked() {
                    return Err(WalkError::Again);
                }
                if fits {
                    self.install_leaf(ctx)?;
                    return Ok(Step::Continue);
                }
                if p.already_mapped(ctx) {
                    return Ok(Step::SkipChildren);
                }
                if self.cache.len() < p.depth_at(ctx.level, ctx.addr, ctx.end) {
                    return Err(WalkError::NoMemory);
                }
                if ctx.old.is_valid() {
                    Self::split_block(&self.env, self.cache, ctx)?;
                } else {
                    let table = self.cache.pop().ok_or(WalkError::NoMemory)?;
                    if let Err(e) = ctx.try_set(Descriptor::table(table)) {
                        // Still zeroed and unpublished: keep it for later.
                        let kept = self.cache.push_back(table);
                        debug_assert!(kept, "a page just taken fits back");
                        return Err(e);
                    }
                }
                Ok(Step::Continue)
            }
        }
    }
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    pub(crate) fn check_output(&self, size: u64, pa: PhysAddr) -> Result<(), Error> {
        if !pa.is_aligned(PAGE_SIZE) {
            return Err(Error::Unaligned);
        }
        match pa.as_u64().checked_add(size) {
            Some(end) if end <= OUTPUT_LIMIT => Ok(()),
            _ => Err(Error::OutOfRange {
                ipa: pa.as_u64(),
                size,
            }),
        }
    }

    /// Table pages [`map`](Self::map) would take from the cache to map
    /// `[ipa, ipa + size)` to `pa` now.
    pub fn pages_needed_to_map(&self, ipa: u64, size: u64, pa: PhysAddr) -> Result<usize, Error> {
        let end = self.check_range(ipa, size)?;
        self.check_output(size, pa)?;
        let placement = Placement {
            ipa,
            pa,
            attrs: Attributes::default(),
            fwb: self.config.fwb(),
        };
        let mut plan = MapPlan {
            placement,
            tables: 0,
        };
        self.walk_range(ipa, end, WalkFlags::LEAF | WalkFlags::TABLE_PRE, &mut plan)?;
        Ok(plan.tables)
    }

    /// Maps `[ipa, ipa + size)` to `[pa, pa + size)` with `attrs`, using the
    /// largest aligned leaves that fit. Exclusive (write side). Existing
    /// mappings in the range are replaced (break-before-make, TLB flushed);
    /// a table where a block now fits is collapsed and freed. Fails with
    /// `NoMemory`, changing nothing, when `cache` holds fewer pages than
    /// [`pages_needed_to_map`](Self::pages_needed_to_map).
    pub fn map(
        &mut self,
        ipa: u64,
        size: u64,
        pa: PhysAddr,
        attrs: Attributes,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let end = self.check_range(ipa, size)?;
        self.check_output(size, pa)?;
        if cache.len() < self.pages_needed_to_map(ipa, size, pa)? {
            return Err(Error::NoMemory);
        }
        self.exclusive_map_walk(
            ipa,
            end,
            pa,
            attrs,
            cache,
            tlb,
            WalkFlags::LEAF | WalkFlags::TABLE_PRE,
        )
    }

    /// The exclusive walk behind [`map`](Self::map) and
    /// [`map_leaf`](Self::map_leaf): places `[ipa, end)` at `pa`, freeing
    /// replaced subtrees at once (no shared walker can see them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exclusive_map_walk(
        &mut self,
        ipa: u64,
        end: u64,
        pa: PhysAddr,
        attrs: Attributes,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
        flags: WalkFlags,
    ) -> Result<(), Error> {
        let fwb = self.config.fwb();
        let env = Env {
            mm: &self.mm,
            tlb,
            target: &self.target,
            fwb,
            reclaim: Reclaim::Now,
        };
        let placement = Placement {
            ipa,
            pa,
            attrs,
            fwb,
        };
        let mut visitor = MapVisitor {
            env,
            cache,
            placement,
        };
        self.walk_range(ipa, end, flags, &mut visitor)?;
        Ok(())
    }
}
