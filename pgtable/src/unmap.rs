//! Unmapping, with one deferred range flush and late freeing of empty tables.
//!
//! The visitor clears every leaf the range covers. A block the range covers
//! only in part is first split (break-before-make), so the rest of it stays
//! mapped; the pages such splits take are counted beforehand, and the unmap
//! fails with `NoMemory` before changing anything when the cache is short.
//! After a table's children, a table left empty is unlinked. On a CPU with
//! `FEAT_TLBIRANGE` every cleared leaf and unlinked table is recorded in a
//! `FlushBatch` and flushed once at the end (1 GiB of pages: one range
//! operation plus the trailing `VMALLE1IS`). Without it, an unmap of at most
//! [`PER_ENTRY_FLUSH_PAGES`] pages flushes each leaf as it is cleared (as KVM
//! does), and a larger one is batched too: its flush becomes one whole-VMID
//! invalidation (the rule Linux applies to its own range flushes without
//! range instructions), instead of one `TLBI IPAS2E1IS` and `VMALLE1IS` per
//! leaf: deleting a 64 MiB slot of pages took 1,000 ms per entry against
//! 12 ms under QEMU on `cortex-a57` (`bench -- page_table`). Unlinked tables are threaded on an intrusive list (their
//! slot 0, an invalid descriptor, holds the next one) and freed only after the
//! flush that makes them unreachable to the hardware walker, whose walk
//! caches may still point at them until then.
//!
//! Without FWB the memory of every Normal leaf cleared is cleaned and
//! invalidated to the point of coherency (KVM's unmap walker does the same),
//! so whoever owns it next sees what the guest wrote. The cleaning waits for
//! the TLB flush, deferred or per entry: until then a vCPU may still write
//! through a stale translation and dirty the cache again. The leaves' output
//! ranges are gathered (neighbours merged) and cleaned after the flush.

use crate::addr::PhysAddr;
use crate::bbm::{Env, Reclaim};
use crate::cache::PageCache;
use crate::descriptor::{Descriptor, level_size};
use crate::map::{MapVisitor, fresh_tables};
use crate::mm::PageTableMemory;
use crate::sync_primitives::{owned_slots, read_owned, write_owned};
use crate::table::{Error, Stage2PageTable, table_is_empty};
use crate::walk::{Step, VisitContext, VisitKind, Visitor, WalkError, WalkFlags};
use alloc::vec::Vec;
use tlb::{FlushBatch, Scope, TlbInvalidate};

/// Without `FEAT_TLBIRANGE`, unmaps of at most this many pages flush entry by
/// entry; larger ones flush the whole VMID once at the end.
pub const PER_ENTRY_FLUSH_PAGES: u64 = 512;

/// Unlinked table pages waiting for the TLB flush, linked through slot 0.
struct PendingFree {
    head: Option<PhysAddr>,
}

/// Slot-0 link encoding: the next page with bit 1 set (bit 0 clear keeps it
/// invalid to the hardware walker); zero ends the list.
const LINK: u64 = 1 << 1;

impl PendingFree {
    fn push<M: PageTableMemory>(&mut self, mm: &M, page: PhysAddr) {
        let link = self.head.map_or(0, |next| next.as_u64() | LINK);
        // SAFETY: `page` is an unlinked, empty table page owned by this walk.
        let slots = unsafe { owned_slots(mm, page) };
        write_owned(&mut slots[0], link);
        self.head = Some(page);
    }

    /// Frees every page.
    ///
    /// # Safety
    ///
    /// The TLB must have been invalidated for every page's span.
    unsafe fn free_all<M: PageTableMemory>(&mut self, mm: &M) {
        while let Some(page) = self.head {
            // SAFETY: the page is on the list, so live and owned by it.
            let link = read_owned(&mut unsafe { owned_slots(mm, page) }[0]);
            self.head = (link != 0).then(|| PhysAddr::new(link & !LINK));
            // SAFETY: unreachable since the flush (caller's guarantee).
            unsafe { mm.free_pages(page, 1) };
        }
    }
}

/// Counts the pages the splits of partly covered blocks take.
struct UnmapPlan {
    tables: usize,
}

impl Visitor for UnmapPlan {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, _: VisitKind) -> Result<Step, WalkError> {
        if ctx.old.is_valid() && !ctx.covers_entry() {
            self.tables += fresh_tables(ctx.level, ctx.addr, ctx.range_end(), &|_, _| true);
        }
        Ok(Step::Continue)
    }
}

struct UnmapVisitor<'a, M: PageTableMemory, T: TlbInvalidate> {
    env: Env<'a, M, T>,
    cache: &'a mut PageCache,
    /// `Some` when flushes are deferred to one range flush at the end.
    batch: Option<FlushBatch>,
    /// Contiguous removals with one level hint not yet in the batch:
    /// `(start, end, hint)`. Merging here keeps the batch's insertion off the
    /// per-page path.
    run: Option<(u64, u64, Option<u8>)>,
    pending: PendingFree,
    /// Output ranges of cleared leaves to clean after the flush (no FWB).
    cleans: Vec<(PhysAddr, u64)>,
}

impl<M: PageTableMemory, T: TlbInvalidate> UnmapVisitor<'_, M, T> {
    /// Records the memory of the cleared leaf `old` at `level` for cleaning
    /// after the flush, when it needs it.
    fn clean_later(&mut self, level: u8, old: Descriptor) {
        if !self.env.dcache_due(old) {
            return;
        }
        let (pa, size) = (old.output(), level_size(level));
        match self.cleans.last_mut() {
            Some((start, len)) if start.add(*len) == pa => *len += size,
            _ => self.cleans.push((pa, size)),
        }
    }

    fn flush_later_or_now(&mut self, base: u64, level: u8, old: Descriptor) {
        let Some(batch) = &mut self.batch else {
            self.env.flush_entry(base, level, old);
            return;
        };
        let hint = if old.is_table(level) {
            None
        } else {
            Some(level)
        };
        let end = base + crate::descriptor::level_size(level);
        match &mut self.run {
            Some((_, run_end, run_hint)) if *run_end == base && *run_hint == hint => *run_end = end,
            Some((start, run_end, run_hint)) if *start <= base && end <= *run_end => {
                // A table emptied inside the run: its span is covered, but
                // the run now removes more than one level.
                *run_hint = None;
            }
            run => {
                if let Some((start, run_end, run_hint)) = run.take() {
                    batch.add(start, run_end - start, run_hint);
                }
                *run = Some((base, end, hint));
            }
        }
    }

    /// Moves the pending run into the batch.
    fn end_run(&mut self) {
        if let (Some(batch), Some((start, end, hint))) = (&mut self.batch, self.run.take()) {
            batch.add(start, end - start, hint);
        }
    }
}

impl<M: PageTableMemory, T: TlbInvalidate> Visitor for UnmapVisitor<'_, M, T> {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, kind: VisitKind) -> Result<Step, WalkError> {
        match kind {
            VisitKind::Leaf if !ctx.old.is_valid() => Ok(Step::Continue),
            VisitKind::Leaf if ctx.covers_entry() => {
                let old = ctx.old;
                ctx.try_set(Descriptor::EMPTY)?;
                self.flush_later_or_now(ctx.base(), ctx.level, old);
                self.clean_later(ctx.level, old);
                Ok(Step::Continue)
            }
            VisitKind::Leaf => {
                MapVisitor::split_block(&self.env, self.cache, ctx)?;
                Ok(Step::Continue)
            }
            VisitKind::TablePost => {
                let old = ctx.reload();
                if old.is_table(ctx.level) && table_is_empty(self.env.mm, old.output()) {
                    ctx.old = old;
                    ctx.try_set(Descriptor::EMPTY)?;
                    self.flush_later_or_now(ctx.base(), ctx.level, old);
                    self.pending.push(self.env.mm, old.output());
                }
                Ok(Step::Continue)
            }
            VisitKind::TablePre => Ok(Step::Continue),
        }
    }
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// Table pages [`unmap`](Self::unmap) would take from the cache to split
    /// blocks the range covers only in part.
    pub fn pages_needed_to_unmap(&self, ipa: u64, size: u64) -> Result<usize, Error> {
        let end = self.check_range(ipa, size)?;
        let mut plan = UnmapPlan { tables: 0 };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut plan)?;
        Ok(plan.tables)
    }

    /// Unmaps `[ipa, ipa + size)`. Exclusive (write side). Blocks the range
    /// covers in part are split so the rest stays mapped (fails with
    /// `NoMemory`, changing nothing, when the cache is short); tables left
    /// empty are freed after the TLB flush. With `FEAT_TLBIRANGE`, or for
    /// more than [`PER_ENTRY_FLUSH_PAGES`] pages, the TLB is flushed once at
    /// the end (without range instructions: the whole VMID), otherwise entry
    /// by entry. Without FWB the
    /// memory of the cleared Normal leaves is cleaned to the point of
    /// coherency after the flush.
    pub fn unmap(
        &mut self,
        ipa: u64,
        size: u64,
        cache: &mut PageCache,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let end = self.check_range(ipa, size)?;
        if cache.len() < self.pages_needed_to_unmap(ipa, size)? {
            return Err(Error::NoMemory);
        }
        let env = Env {
            mm: &self.mm,
            tlb,
            target: &self.target,
            fwb: self.config.fwb(),
            reclaim: Reclaim::Now,
        };
        let deferred = tlb.caps().range || size >> tlb::PAGE_SHIFT > PER_ENTRY_FLUSH_PAGES;
        let batch = deferred.then(FlushBatch::new);
        let mut visitor = UnmapVisitor {
            env,
            cache,
            batch,
            run: None,
            pending: PendingFree { head: None },
            cleans: Vec::new(),
        };
        let result = self.walk_range(
            ipa,
            end,
            WalkFlags::LEAF | WalkFlags::TABLE_POST,
            &mut visitor,
        );
        visitor.end_run();
        if let Some(batch) = &mut visitor.batch {
            batch.flush(tlb, &self.target, Scope::InnerShareable);
        }
        // SAFETY: every pending table was unlinked and its span flushed
        // (deferred: just now; per entry: when it was unlinked).
        unsafe { visitor.pending.free_all(&self.mm) };
        // No translation to the cleared leaves is left: clean what they mapped.
        for &(pa, size) in &visitor.cleans {
            self.mm.clean_inval_dcache(pa, size);
        }
        Ok(result?)
    }
}
