//! Splitting blocks down to 4 KiB pages, with skip hints, per block or in
//! chunks with one barrier sequence each.
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
//!
//! # Batched split: one barrier sequence per range
//!
//! [`split_to_pages`](Stage2PageTable::split_to_pages) flushes each block as
//! it replaces it: a 1 GiB range of 2 MiB blocks costs 512 complete
//! `DSB`/`TLBI`/`DSB`/`VMALLE1IS` sequences.
//! [`split_to_pages_batched`](Stage2PageTable::split_to_pages_batched) keeps
//! break-before-make but batches the middle step, in three passes over the
//! range:
//! 1. break: lock every valid block (each reported to the backend's
//!    [`on_break`](tlb::TlbInvalidate::on_break)) and build its subtree,
//!    unpublished, recording `(base, level, subtree)` and the block's span in
//!    a [`FlushBatch`];
//! 2. flush: one inner-shareable sequence for the whole batch (contiguous
//!    blocks merge, so with `FEAT_TLBIRANGE` a run of 2 MiB blocks is one
//!    range operation with a level-2 hint);
//! 3. make: walk the range again and publish each recorded subtree in the
//!    slot it locked.
//!
//! The locked entries are invisible to other walkers only because the caller
//! holds the write side: no shared walk can meet them between the passes.
//!
//! # Eager split in chunks
//!
//! [`Mmu::split_in_chunks`] splits a large range chunk by chunk, as KVM's
//! eager split does with its chunk size: for each chunk it takes the write
//! side, counts the pages the chunk needs, and if the cache is short releases
//! the lock, tops the cache up through the caller's function (outside any
//! lock) and tries again; then it splits the chunk with one barrier sequence
//! and releases the write side, so the vCPUs' faults run between chunks.
//! Blocks that faults install in a chunk already split are not split again;
//! a caller that logs dirty pages maps only pages meanwhile.

use crate::addr::PhysAddr;
use crate::bbm::{Env, Reclaim, pages_to_split_to_pages};
use crate::cache::{OutOfMemory, PageCache};
use crate::descriptor::{Descriptor, LAST_LEVEL, PAGE_SIZE};
use crate::mm::PageTableMemory;
use crate::mmu::Mmu;
use crate::table::{Error, Stage2PageTable};
use crate::walk::{Step, VisitContext, VisitKind, Visitor, WalkError, WalkFlags};
use alloc::vec::Vec;
use tlb::{FlushBatch, Scope, TlbInvalidate};

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
    /// Chunks split with the write side held (one barrier sequence each at
    /// most); zero for a split that is not chunked.
    pub chunks: u64,
}

impl core::ops::AddAssign for SplitStats {
    fn add_assign(&mut self, other: Self) {
        self.visits += other.visits;
        self.blocks_split += other.blocks_split;
        self.chunks += other.chunks;
    }
}

/// The step past an entry a split leaves alone: a page (with skip hints on,
/// its siblings are pages too) or an invalid entry; `None` for a block.
fn step_past(ctx: &VisitContext<'_>, hints: SkipHints) -> Option<Step> {
    if ctx.level == LAST_LEVEL {
        return Some(if hints == SkipHints::On {
            Step::SkipSiblings
        } else {
            Step::Continue
        });
    }
    (!ctx.old.is_valid()).then_some(Step::Continue)
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
        if let Some(step) = step_past(ctx, self.hints) {
            return Ok(step);
        }
        let block = ctx.old;
        if self.cache.len() < pages_to_split_to_pages(ctx.level) {
            return Err(WalkError::NoMemory);
        }
        self.env.break_entry(ctx)?;
        let subtree = self
            .env
            .page_subtree(self.cache, block, ctx.level)
            .expect("the cache holds enough pages");
        self.env.flush_entry(ctx.base(), ctx.level, block);
        self.env.make_entry(ctx, block, Descriptor::table(subtree));
        self.stats.blocks_split += 1;
        Ok(if self.hints == SkipHints::On {
            Step::SkipChildren
        } else {
            Step::Continue
        })
    }
}

/// A block broken by the first pass of a batched split, its subtree built.
struct BrokenBlock {
    base: u64,
    level: u8,
    block: Descriptor,
    subtree: PhysAddr,
}

/// Pass 1 of a batched split: break every block, build its subtree, and
/// gather the spans to flush.
struct BreakVisitor<'a, M: PageTableMemory, T: TlbInvalidate> {
    env: Env<'a, M, T>,
    cache: &'a mut PageCache,
    hints: SkipHints,
    stats: SplitStats,
    broken: Vec<BrokenBlock>,
    batch: FlushBatch,
}

impl<M: PageTableMemory, T: TlbInvalidate> Visitor for BreakVisitor<'_, M, T> {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, _: VisitKind) -> Result<Step, WalkError> {
        self.stats.visits += 1;
        if let Some(step) = step_past(ctx, self.hints) {
            return Ok(step);
        }
        if self.cache.len() < pages_to_split_to_pages(ctx.level) {
            return Err(WalkError::NoMemory);
        }
        let block = self.env.break_entry(ctx)?;
        let subtree = self
            .env
            .page_subtree(self.cache, block, ctx.level)
            .expect("the cache holds enough pages");
        self.batch.add(ctx.base(), ctx.size(), Some(ctx.level));
        self.broken.push(BrokenBlock {
            base: ctx.base(),
            level: ctx.level,
            block,
            subtree,
        });
        // The entry now holds the locked marker: nothing to descend into.
        Ok(Step::SkipChildren)
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

    /// [`split_to_pages`](Self::split_to_pages) with one barrier sequence
    /// for the whole range instead of one per block (see the module's
    /// "Batched split"). Exclusive. Fails with `NoMemory`, changing nothing,
    /// when `cache` holds fewer pages than
    /// [`pages_needed_to_split`](Self::pages_needed_to_split).
    pub fn split_to_pages_batched(
        &mut self,
        ipa: u64,
        size: u64,
        cache: &mut PageCache,
        hints: SkipHints,
        tlb: &impl TlbInvalidate,
    ) -> Result<SplitStats, Error> {
        let end = self.check_range(ipa, size)?;
        if cache.len() < self.pages_needed_to_split(ipa, size)? {
            return Err(Error::NoMemory);
        }
        let env = Env {
            mm: &self.mm,
            tlb,
            target: &self.target,
            fwb: self.config.fwb(),
            reclaim: Reclaim::Now,
        };
        let mut breaker = BreakVisitor {
            env,
            cache,
            hints,
            stats: SplitStats::default(),
            broken: Vec::new(),
            batch: FlushBatch::new(),
        };
        // Exclusive, with the pages counted: the pass is not expected to
        // fail, but whatever it broke before an error is still flushed and
        // made below, so no entry stays locked.
        let walked = self.walk_range(ipa, end, WalkFlags::LEAF, &mut breaker);
        let BreakVisitor {
            env,
            mut stats,
            broken,
            mut batch,
            ..
        } = breaker;
        batch.flush(tlb, &self.target, Scope::InnerShareable);
        let mut pending = broken.iter().peekable();
        let mut make = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            match pending.peek() {
                Some(b) if ctx.old.is_locked() && b.base == ctx.base() && b.level == ctx.level => {
                    env.make_entry(ctx, b.block, Descriptor::table(b.subtree));
                    pending.next();
                    Ok(Step::SkipChildren)
                }
                Some(b) if b.base >= ctx.base() + ctx.size() => Ok(Step::SkipChildren),
                Some(_) => Ok(Step::Continue),
                None => Ok(Step::SkipSiblings),
            }
        };
        let first = broken.first().map_or(end, |b| b.base.max(ipa));
        self.walk_range(
            first,
            end,
            WalkFlags::LEAF | WalkFlags::TABLE_PRE,
            &mut make,
        )
        .expect("a read-and-publish walk cannot fail");
        assert!(
            pending.peek().is_none(),
            "a block broken by the split was not found again to publish"
        );
        stats.blocks_split = broken.len() as u64;
        walked?;
        Ok(stats)
    }
}

impl<M: PageTableMemory + Clone + Send + 'static> Mmu<M> {
    /// Eager split in chunks: splits every block touching
    /// `[ipa, ipa + size)` into pages, `chunk` bytes at a time (chunk
    /// boundaries are multiples of `chunk`), each chunk under the write side
    /// with one barrier sequence, releasing the write side between chunks so
    /// faults run. Before a chunk whose pages the cache lacks, the write
    /// side is released and `top_up(cache, pages)` must bring the cache to
    /// at least `pages` (it runs outside any lock); its failure ends the
    /// split with `NoMemory`, every chunk before complete. `Unaligned` when
    /// `chunk` is zero or not a multiple of 4 KiB.
    pub fn split_in_chunks(
        &self,
        ipa: u64,
        size: u64,
        chunk: u64,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
        mut top_up: impl FnMut(&mut PageCache, usize) -> Result<(), OutOfMemory>,
    ) -> Result<SplitStats, Error> {
        if chunk == 0 || !chunk.is_multiple_of(PAGE_SIZE) {
            return Err(Error::Unaligned);
        }
        let end = self.write().check_range(ipa, size)?;
        let mut stats = SplitStats::default();
        let mut addr = ipa;
        while addr < end {
            let next = (addr / chunk + 1).saturating_mul(chunk).min(end);
            loop {
                let mut table = self.write();
                let needed = table.pages_needed_to_split(addr, next - addr)?;
                if cache.len() >= needed {
                    let done = table.split_to_pages_batched(
                        addr,
                        next - addr,
                        cache,
                        SkipHints::On,
                        tlb,
                    )?;
                    stats += done;
                    stats.chunks += 1;
                    break;
                }
                drop(table);
                top_up(cache, needed).map_err(|OutOfMemory| Error::NoMemory)?;
            }
            addr = next;
        }
        Ok(stats)
    }
}
