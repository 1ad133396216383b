//! Splitting blocks down to 4 KiB pages, with skip hints.
//!
//! Dirty logging needs page-granular write protection, so every block in the
//! range is replaced by page tables before logging starts (eager splitting).
//! For each valid block the visitor builds the whole replacement subtree
//! unpublished (one table for a 2 MiB block, 513 for a 1 GiB block), checking
//! first that the cache holds enough pages, so a split that runs out of memory
//! leaves that block untouched and every table already split complete. It
//! then swaps the block for the subtree with break-before-make.
//!
//! With [`SkipHints::On`] the visitor tells the walker what cannot need work:
//! a level-3 entry means its whole table is pages already (skip siblings),
//! and a block just split has nothing left to split below it (skip children).
//! With [`SkipHints::Off`] the walker visits every entry, as a walker without
//! hints must; benchmarks compare both.

use crate::bbm::{Env, Reclaim, pages_to_split_to_pages};
use crate::cache::PageCache;
use crate::descriptor::{Descriptor, LAST_LEVEL};
use crate::mm::PageTableMemory;
use crate::table::{Error, Stage2PageTable};
use crate::walk::{Step, VisitContext, VisitKind, Visitor, WalkError, WalkFlags};
use tlb::TlbInvalidate;

/// Whether the split visitor answers with skip hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipHints {
    /// Skip siblings at level 3 and the children of a block just split.
    On,
    /// Visit everything.
    Off,
}

/// What a split did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitStats {
    /// Visitor calls made.
    pub visits: u64,
    /// Blocks replaced by page tables.
    pub blocks_split: u64,
}

struct SplitVisitor<'a, M: PageTableMemory, T: TlbInvalidate> {
    env: Env<'a, M, T>,
    cache: &'a mut PageCache,
    hints: SkipHints,
    stats: SplitStats,
}

impl<M: PageTableMemory, T: TlbInvalidate> Visitor for SplitVisitor<'_, M, T> {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, _: VisitKind) -> Result<Step, WalkError> {
        self.stats.visits += 1;
        let hints = self.hints == SkipHints::On;
        if ctx.level == LAST_LEVEL {
            return Ok(if hints {
                Step::SkipSiblings
            } else {
                Step::Continue
            });
        }
        if !ctx.old.is_valid() {
            return Ok(Step::Continue);
        }
        let block = ctx.old;
        if self.cache.len() < pages_to_split_to_pages(ctx.level) {
            return Err(WalkError::NoMemory);
        }
        ctx.try_lock()?;
        let subtree = self
            .env
            .page_subtree(self.cache, block, ctx.level)
            .expect("the cache holds enough pages");
        self.env.flush_entry(ctx.base(), ctx.level, block);
        ctx.publish(Descriptor::table(subtree));
        self.stats.blocks_split += 1;
        Ok(if hints {
            Step::SkipChildren
        } else {
            Step::Continue
        })
    }
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// Table pages [`split_to_pages`](Self::split_to_pages) would take.
    pub fn pages_needed_to_split(&self, ipa: u64, size: u64) -> Result<usize, Error> {
        let end = self.check_range(ipa, size)?;
        let mut pages = 0;
        let mut counter = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            if ctx.level == LAST_LEVEL {
                return Ok(Step::SkipSiblings);
            }
            if ctx.old.is_valid() {
                pages += pages_to_split_to_pages(ctx.level);
            }
            Ok(Step::Continue)
        };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut counter)?;
        Ok(pages)
    }

    /// Splits every block touching `[ipa, ipa + size)` into 4 KiB pages with
    /// the same translation. Exclusive. Each block is split whole or not at
    /// all: with too few pages in `cache` the split stops with `NoMemory`,
    /// the blocks not yet reached untouched; top up and call again (already
    /// split parts cost little with hints on).
    pub fn split_to_pages(
        &mut self,
        ipa: u64,
        size: u64,
        cache: &mut PageCache,
        hints: SkipHints,
        tlb: &impl TlbInvalidate,
    ) -> Result<SplitStats, Error> {
        let end = self.check_range(ipa, size)?;
        let env = Env {
            mm: &self.mm,
            tlb,
            target: &self.target,
            fwb: self.config.fwb(),
            reclaim: Reclaim::Now,
        };
        let mut visitor = SplitVisitor {
            env,
            cache,
            hints,
            stats: SplitStats::default(),
        };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut visitor)?;
        Ok(visitor.stats)
    }
}
