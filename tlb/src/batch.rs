//! Gathering invalidations during a walk and flushing once.
//!
//! A walk that removes many entries records each removed span in a
//! [`FlushBatch`] instead of invalidating as it goes. Spans that touch or
//! overlap are merged on insertion (their level hints survive only when equal),
//! so unmapping 1 GiB of pages leaves one span. The batch holds at most
//! [`FLUSH_BATCH_CAPACITY`] disjoint spans and allocates nothing; when an
//! insertion would exceed that, the two spans with the smallest gap between them
//! are merged across the gap, which invalidates a little more than needed but
//! never less. At the end, [`FlushBatch::flush`] plans every span; when the
//! total exceeds [`MAX_PLAN_OPS`](crate::MAX_PLAN_OPS), or a whole-VMID flush
//! was requested, one whole-VMID operation replaces them all.

use crate::{
    MAX_PLAN_OPS, PAGE_SHIFT, PAGE_SIZE, Plan, Scope, TlbInvalidate, TlbTarget, TlbiOp, plan_flush,
};

/// Disjoint spans a [`FlushBatch`] keeps before it merges across gaps.
pub const FLUSH_BATCH_CAPACITY: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    first: u64,
    end: u64,
    level: Option<u8>,
}

/// Invalidations gathered during a walk, flushed once.
#[derive(Clone, Debug)]
pub struct FlushBatch {
    spans: [Span; FLUSH_BATCH_CAPACITY],
    len: usize,
    whole_vmid: bool,
}

impl Default for FlushBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl FlushBatch {
    /// An empty batch.
    pub const fn new() -> Self {
        Self {
            spans: [Span {
                first: 0,
                end: 0,
                level: None,
            }; FLUSH_BATCH_CAPACITY],
            len: 0,
            whole_vmid: false,
        }
    }

    /// Whether nothing needs flushing.
    pub const fn is_empty(&self) -> bool {
        self.len == 0 && !self.whole_vmid
    }

    /// Whether the batch will flush the whole VMID.
    pub const fn is_whole_vmid(&self) -> bool {
        self.whole_vmid
    }

    /// The gathered page spans `(first_page, end_page, level)`, sorted.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64, Option<u8>)> + '_ {
        self.spans[..self.len]
            .iter()
            .map(|s| (s.first, s.end, s.level))
    }

    /// Records that `[ipa, ipa + size)` must be invalidated; `level` is the
    /// level of the removed leaves, if known.
    pub fn add(&mut self, ipa: u64, size: u64, level: Option<u8>) {
        if size == 0 || self.whole_vmid {
            return;
        }
        let first = ipa >> PAGE_SHIFT;
        let end = ipa.saturating_add(size).saturating_add(PAGE_SIZE - 1) >> PAGE_SHIFT;
        let mut new = Span { first, end, level };
        loop {
            // Absorb every span that touches or overlaps the new one.
            let mut i = 0;
            while i < self.len {
                let s = self.spans[i];
                if s.first <= new.end && new.first <= s.end {
                    new = merge(new, s);
                    self.remove(i);
                } else {
                    i += 1;
                }
            }
            if self.len < FLUSH_BATCH_CAPACITY {
                break;
            }
            // Full: merging the closest pair may reach the new span, so absorb again.
            self.merge_closest_pair();
        }
        let at = self.spans[..self.len].partition_point(|s| s.first < new.first);
        self.spans.copy_within(at..self.len, at + 1);
        self.spans[at] = new;
        self.len += 1;
    }

    /// Requests one whole-VMID invalidation instead of any ranges.
    pub fn add_whole_vmid(&mut self) {
        self.whole_vmid = true;
        self.len = 0;
    }

    fn remove(&mut self, i: usize) {
        self.spans.copy_within(i + 1..self.len, i);
        self.len -= 1;
    }

    fn merge_closest_pair(&mut self) {
        let best = (0..self.len - 1)
            .min_by_key(|&i| self.spans[i + 1].first - self.spans[i].end)
            .expect("a full batch has at least two spans");
        self.spans[best] = merge(self.spans[best], self.spans[best + 1]);
        self.remove(best + 1);
    }

    fn plans(&self, backend_caps: crate::TlbCaps) -> impl Iterator<Item = Plan> + '_ {
        self.spans[..self.len].iter().map(move |s| {
            plan_flush(
                s.first << PAGE_SHIFT,
                s.end - s.first,
                s.level,
                backend_caps,
            )
        })
    }

    /// Issues the gathered invalidations as one barrier sequence and empties
    /// the batch. Returns the number of `TLBI` operations issued, not counting
    /// the trailing `VMALLE1IS` the backend adds after IPA-based operations.
    pub fn flush(&mut self, tlb: &impl TlbInvalidate, target: &TlbTarget, scope: Scope) -> usize {
        if self.is_empty() {
            return 0;
        }
        let caps = tlb.caps();
        let total: usize = self.plans(caps).map(|p| p.len()).sum();
        let whole =
            self.whole_vmid || total > MAX_PLAN_OPS || self.plans(caps).any(|p| p.is_whole_vmid());
        let issued = if whole {
            tlb.execute(target, &mut core::iter::once(TlbiOp::WholeVmid), scope);
            1
        } else {
            tlb.execute(target, &mut self.plans(caps).flatten(), scope);
            total
        };
        *self = Self::new();
        issued
    }
}

fn merge(a: Span, b: Span) -> Span {
    Span {
        first: a.first.min(b.first),
        end: a.end.max(b.end),
        level: if a.level == b.level { a.level } else { None },
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn neighbours_merge_into_one_span() {
        let mut batch = FlushBatch::new();
        for page in 0..262_144u64 {
            batch.add(page << PAGE_SHIFT, PAGE_SIZE, Some(3));
        }
        assert_eq!(
            batch.spans().collect::<Vec<_>>(),
            std::vec![(0, 262_144, Some(3))]
        );
    }

    #[test]
    fn mixed_levels_lose_their_hint_and_disjoint_spans_stay_apart() {
        let mut batch = FlushBatch::new();
        batch.add(0, 2 << 20, Some(2));
        batch.add(2 << 20, 4096, Some(3));
        batch.add(1 << 30, 4096, Some(3));
        assert_eq!(
            batch.spans().collect::<Vec<_>>(),
            std::vec![(0, 513, None), (262_144, 262_145, Some(3))]
        );
    }

    #[test]
    fn an_overflowing_batch_merges_across_the_smallest_gap() {
        let mut batch = FlushBatch::new();
        for i in 0..FLUSH_BATCH_CAPACITY as u64 {
            batch.add((i * 10) << PAGE_SHIFT, PAGE_SIZE, None);
        }
        batch.add(1000 << PAGE_SHIFT, PAGE_SIZE, None);
        assert_eq!(batch.spans().count(), FLUSH_BATCH_CAPACITY);
        let spans: Vec<_> = batch.spans().collect();
        assert!(
            spans.windows(2).all(|w| w[0].1 < w[1].0),
            "sorted and disjoint: {spans:?}"
        );
    }

    proptest! {
        /// Whatever the insertions, every added page stays covered and spans
        /// stay sorted and disjoint.
        #[test]
        fn every_added_page_stays_covered(adds in proptest::collection::vec((0u64..4096, 1u64..64), 1..80)) {
            let mut batch = FlushBatch::new();
            for &(page, pages) in &adds {
                batch.add(page << PAGE_SHIFT, pages << PAGE_SHIFT, None);
            }
            let spans: Vec<_> = batch.spans().collect();
            prop_assert!(spans.len() <= FLUSH_BATCH_CAPACITY);
            prop_assert!(spans.windows(2).all(|w| w[0].1 < w[1].0));
            for &(page, pages) in &adds {
                for p in page..page + pages {
                    prop_assert!(spans.iter().any(|s| s.0 <= p && p < s.1), "page {} lost", p);
                }
            }
        }
    }
}
