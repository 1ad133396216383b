//! Planning a stage-2 flush as a short list of `TLBI` operations.
//!
//! With `FEAT_TLBIRANGE` the request is cut into chunks of at most
//! [`MAX_TLBI_RANGE_PAGES`] pages. Each chunk is covered the way Linux does it:
//! SCALE runs from 3 down to 0, and at each scale one range operation takes as
//! many whole `2^(5 * SCALE + 1)`-page units as fit, so a chunk needs at most
//! four range operations, plus one per-IPA operation for a single leftover
//! page. No operation reaches outside the request.
//!
//! Without `FEAT_TLBIRANGE` one page is one `IPAS2E1IS`, and anything larger is
//! one whole-VMID invalidation rather than a loop of per-page operations. A plan
//! longer than [`MAX_PLAN_OPS`] (the same bound Linux uses) also becomes one
//! whole-VMID invalidation, as does a request whose pages cannot be encoded
//! (beyond the operand fields): invalidating more than asked is always safe.
//!
//! The planner is a pure function and [`Plan`] is an allocation-free iterator,
//! so it runs inside locked regions and can be tested exhaustively.

use crate::{IpaOperand, RangeOperand, TlbCaps, TlbiOp};

/// Page shift of the 4 KiB granule. The one definition in the workspace:
/// `pgtable` and `memslot` re-export it.
pub const PAGE_SHIFT: u32 = 12;
/// Bytes in a 4 KiB page (re-exported by `pgtable` and `memslot`).
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// Most pages one range operation covers: NUM 31, SCALE 3 = 32 * 2^16 pages (8 GiB).
pub const MAX_TLBI_RANGE_PAGES: u64 = 32 << 16;
/// Longest plan emitted as individual operations; a longer one becomes a
/// single whole-VMID invalidation. Linux uses 512 (`MAX_DVM_OPS`).
pub const MAX_PLAN_OPS: usize = 512;

/// Units of pages covered per NUM step at `scale`.
const fn scale_unit(scale: u8) -> u64 {
    1 << (5 * scale as u64 + 1)
}

/// The operations of one flush, in order. An iterator that allocates nothing.
#[derive(Clone, Debug)]
pub struct Plan {
    kind: PlanKind,
    len: usize,
}

#[derive(Clone, Debug)]
enum PlanKind {
    Empty,
    WholeVmid { emitted: bool },
    Pages(RangeCursor),
}

/// Walks a request chunk by chunk, scale by scale.
#[derive(Clone, Debug)]
struct RangeCursor {
    /// Next page to cover.
    page: u64,
    /// Pages left in the whole request.
    left: u64,
    /// Pages left in the current chunk (at most `MAX_TLBI_RANGE_PAGES`).
    chunk_left: u64,
    /// Scale to try next within the chunk.
    scale: u8,
    /// Level hint for range operations.
    range_level: Option<u8>,
    /// Level hint for per-IPA operations (only with FEAT_TTL).
    ipa_level: Option<u8>,
}

impl RangeCursor {
    fn next_op(&mut self) -> Option<TlbiOp> {
        if self.chunk_left == 0 {
            if self.left == 0 {
                return None;
            }
            self.chunk_left = self.left.min(MAX_TLBI_RANGE_PAGES);
            self.scale = 3;
        }
        let op = if self.chunk_left == 1 {
            // Validated by `plan_flush`: every page of the request is encodable.
            TlbiOp::Ipa(IpaOperand::new(self.page, self.ipa_level).ok()?)
        } else {
            loop {
                let unit = scale_unit(self.scale);
                let units = self.chunk_left.min(32 * unit) / unit;
                if units > 0 {
                    let op = RangeOperand::new(
                        self.page,
                        (units - 1) as u8,
                        self.scale,
                        self.range_level,
                    )
                    .ok()?;
                    self.scale = self.scale.saturating_sub(1);
                    break TlbiOp::Range(op);
                }
                // The chunk holds at least two pages, so scale 0 always takes some.
                self.scale -= 1;
            }
        };
        let covered = match op {
            TlbiOp::Range(r) => r.pages(),
            _ => 1,
        };
        self.page += covered;
        self.left -= covered;
        self.chunk_left -= covered;
        Some(op)
    }
}

impl Plan {
    /// A plan with no operations.
    pub const fn empty() -> Self {
        Self {
            kind: PlanKind::Empty,
            len: 0,
        }
    }

    /// A plan of one whole-VMID invalidation.
    pub const fn whole_vmid() -> Self {
        Self {
            kind: PlanKind::WholeVmid { emitted: false },
            len: 1,
        }
    }

    /// Number of operations left in the plan.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether no operation is left.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the plan is one whole-VMID invalidation.
    pub const fn is_whole_vmid(&self) -> bool {
        matches!(self.kind, PlanKind::WholeVmid { .. })
    }
}

impl Iterator for Plan {
    type Item = TlbiOp;

    fn next(&mut self) -> Option<TlbiOp> {
        let op = match &mut self.kind {
            PlanKind::Empty => None,
            PlanKind::WholeVmid { emitted } => {
                if *emitted {
                    None
                } else {
                    *emitted = true;
                    Some(TlbiOp::WholeVmid)
                }
            }
            PlanKind::Pages(cursor) => cursor.next_op(),
        };
        if op.is_some() {
            self.len -= 1;
        }
        op
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }
}

impl ExactSizeIterator for Plan {}

/// Plans the invalidation of `pages` pages starting at the page that contains
/// `start_ipa`.
///
/// `level` is the translation level of every leaf being removed (1, 2 or 3),
/// or `None` when unknown or mixed; a hint that does not match the real entry
/// may leave it in the TLB, so only pass one you know. Per-IPA operations carry
/// the hint only when the CPU has `FEAT_TTL`; range operations always may.
pub fn plan_flush(start_ipa: u64, pages: u64, level: Option<u8>, caps: TlbCaps) -> Plan {
    if pages == 0 {
        return Plan::empty();
    }
    let level = level.filter(|l| (1..=3).contains(l));
    let first = start_ipa >> PAGE_SHIFT;
    let Some(last) = first.checked_add(pages - 1) else {
        return Plan::whole_vmid();
    };
    let ipa_level = if caps.ttl { level } else { None };
    if pages == 1 {
        return match IpaOperand::new(first, ipa_level) {
            Ok(op) => Plan {
                kind: PlanKind::Pages(RangeCursor {
                    page: op.page(),
                    left: 1,
                    chunk_left: 0,
                    scale: 3,
                    range_level: level,
                    ipa_level,
                }),
                len: 1,
            },
            Err(_) => Plan::whole_vmid(),
        };
    }
    if !caps.range || last > RangeOperand::MAX_BASE_PAGE {
        return Plan::whole_vmid();
    }
    let cursor = RangeCursor {
        page: first,
        left: pages,
        chunk_left: 0,
        scale: 3,
        range_level: level,
        ipa_level,
    };
    let mut counter = cursor.clone();
    let mut len = 0;
    while counter.next_op().is_some() {
        len += 1;
        if len > MAX_PLAN_OPS {
            return Plan::whole_vmid();
        }
    }
    Plan {
        kind: PlanKind::Pages(cursor),
        len,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    const RANGE: TlbCaps = TlbCaps::ALL;
    const NO_RANGE: TlbCaps = TlbCaps::BASELINE;

    /// Decodes every operation's operand from its raw register value and
    /// returns the covered page intervals, sorted.
    fn decoded_intervals(plan: Plan) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = plan
            .map(|op| match op {
                TlbiOp::Ipa(ipa) => {
                    let back = IpaOperand::decode(ipa.encode()).expect("IPA operand decodes");
                    (back.page(), back.page() + 1)
                }
                TlbiOp::Range(range) => {
                    let back = RangeOperand::decode(range.encode()).expect("range operand decodes");
                    (back.base_page(), back.base_page() + back.pages())
                }
                TlbiOp::WholeVmid => panic!("unexpected whole-VMID operation"),
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The operations tile `[first, first + pages)` exactly: no page missed,
    /// none covered twice, nothing outside.
    fn assert_exact_cover(first: u64, pages: u64, plan: Plan) {
        let intervals = decoded_intervals(plan);
        let mut next = first;
        for (start, end) in intervals {
            assert_eq!(
                start, next,
                "gap or overlap at page {next:#x} (request {first:#x}+{pages})"
            );
            assert!(end > start);
            next = end;
        }
        assert_eq!(
            next,
            first + pages,
            "request {first:#x}+{pages} not covered to its end"
        );
    }

    fn check(first: u64, pages: u64) -> usize {
        let plan = plan_flush(first << PAGE_SHIFT, pages, None, RANGE);
        let len = plan.len();
        assert!(!plan.is_whole_vmid(), "{pages} pages should plan as ranges");
        assert!(len <= 5 * pages.div_ceil(MAX_TLBI_RANGE_PAGES) as usize);
        let counted = plan.clone().count();
        assert_eq!(counted, len, "len() agrees with the iterator");
        assert_exact_cover(first, pages, plan);
        len
    }

    #[test]
    fn every_count_up_to_4096_at_several_alignments() {
        for first in [0u64, 1, 7, 511, 512, 513, 0x3ffff, 0x40000, 0x12345] {
            for pages in 1..=4096u64 {
                // Page by page: a bitmap of the request, each page hit once.
                let mut hit = std::vec![0u8; pages as usize];
                for op in plan_flush(first << PAGE_SHIFT, pages, None, RANGE) {
                    let (start, end) = op.pages().expect("no whole-VMID operation");
                    assert!(
                        start >= first && end <= first + pages,
                        "{op:?} reaches outside"
                    );
                    for p in start..end {
                        hit[(p - first) as usize] += 1;
                    }
                }
                assert!(
                    hit.iter().all(|&h| h == 1),
                    "first {first:#x} pages {pages}: {hit:?}"
                );
            }
        }
    }

    #[test]
    fn one_gib_is_one_operation_and_512_pages_is_scale_1_num_7() {
        let ops: Vec<_> = plan_flush(0x4000_0000, 1 << 18, None, RANGE).collect();
        assert_eq!(ops.len(), 1);
        let ops: Vec<_> = plan_flush(0, 512, None, RANGE).collect();
        assert_eq!(
            ops,
            std::vec![TlbiOp::Range(RangeOperand::new(0, 7, 1, None).unwrap())]
        );
    }

    #[test]
    fn edges_around_the_largest_range() {
        let max = MAX_TLBI_RANGE_PAGES;
        for pages in [
            max - 1,
            max,
            max + 1,
            2 * max,
            2 * max + 1,
            (1 << 24) - 1,
            1 << 24,
        ] {
            check(0, pages);
            check(1, pages);
        }
        // Exactly SCALE 3 / NUM 31: one operation, the largest there is.
        let ops: Vec<_> = plan_flush(0, max, None, RANGE).collect();
        assert_eq!(ops.len(), 1);
        match ops[0] {
            TlbiOp::Range(r) => {
                assert_eq!((r.scale(), r.num()), (3, 31));
                let raw = r.encode();
                assert_eq!(
                    (raw >> 39) & 31,
                    31,
                    "NUM field must not overflow into SCALE"
                );
                assert_eq!((raw >> 44) & 3, 3);
            }
            other => panic!("expected a range operation, got {other:?}"),
        }
        // One page more is split: a full range plus a single page.
        assert_eq!(plan_flush(0, max + 1, None, RANGE).len(), 2);
    }

    #[test]
    fn top_of_a_48_bit_ipa_space() {
        let top_page = (1u64 << 36) - 1;
        check(top_page, 1);
        check(top_page - 1, 2);
        check(top_page - 4095, 4096);
        check((1 << 36) - MAX_TLBI_RANGE_PAGES, MAX_TLBI_RANGE_PAGES);
        check(
            (1 << 36) - 3 * MAX_TLBI_RANGE_PAGES - 12345,
            3 * MAX_TLBI_RANGE_PAGES + 12345,
        );
    }

    #[test]
    fn unencodable_or_overflowing_requests_become_whole_vmid() {
        assert!(plan_flush(!0xfff, 2, None, RANGE).is_whole_vmid());
        assert!(plan_flush(1 << 49, 2, None, RANGE).is_whole_vmid());
        // The whole 48-bit space would take far more than MAX_PLAN_OPS ranges.
        assert!(plan_flush(0, 1 << 36, None, RANGE).is_whole_vmid());
    }

    #[test]
    fn without_range_one_page_is_one_ipa_op_and_more_is_whole_vmid() {
        let ops: Vec<_> = plan_flush(0x1234_5000, 1, Some(3), NO_RANGE).collect();
        assert_eq!(
            ops,
            std::vec![TlbiOp::Ipa(IpaOperand::new(0x12345, None).unwrap())]
        );
        for pages in [2, 3, 512, 1 << 18] {
            let plan = plan_flush(0, pages, None, NO_RANGE);
            assert!(plan.is_whole_vmid());
            assert_eq!(plan.collect::<Vec<_>>(), std::vec![TlbiOp::WholeVmid]);
        }
        assert!(plan_flush(0, 0, None, NO_RANGE).is_empty());
    }

    #[test]
    fn level_hints_follow_the_capabilities() {
        let with_ttl: Vec<_> = plan_flush(0, 1, Some(3), RANGE).collect();
        assert_eq!(with_ttl[0].level(), Some(3));
        let no_ttl = RANGE.without_ttl();
        let without: Vec<_> = plan_flush(0, 1, Some(3), no_ttl).collect();
        assert_eq!(without[0].level(), None);
        let ranged: Vec<_> = plan_flush(0, 512, Some(2), no_ttl).collect();
        assert_eq!(
            ranged[0].level(),
            Some(2),
            "range TTL is part of FEAT_TLBIRANGE"
        );
    }

    #[test]
    fn a_plan_too_long_becomes_whole_vmid() {
        // Each 8 GiB chunk of 2^21 - 1 pages needs 5 operations... but chunks
        // are full except the last, so build the length from many full chunks.
        let chunks = MAX_PLAN_OPS as u64 + 1;
        assert!(plan_flush(0, chunks * MAX_TLBI_RANGE_PAGES, None, RANGE).is_whole_vmid());
        let fits = MAX_PLAN_OPS as u64;
        assert_eq!(
            plan_flush(0, fits * MAX_TLBI_RANGE_PAGES, None, RANGE).len(),
            MAX_PLAN_OPS
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn any_request_up_to_2_pow_24_is_covered_exactly(first in 0u64..(1 << 36) - (1 << 24), pages in 1u64..=(1 << 24)) {
            check(first, pages);
        }

        #[test]
        fn requests_near_the_range_maximum(first in 0u64..(1 << 30), delta in 0u64..64, above in any::<bool>()) {
            let pages = if above { MAX_TLBI_RANGE_PAGES + delta } else { MAX_TLBI_RANGE_PAGES - delta };
            check(first, pages);
        }
    }
}
