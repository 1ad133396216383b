//! A model TLB that caches translations and forgets them exactly as the
//! architecture allows.
//!
//! Tests fill it from the page table (as a hardware walk would), run an
//! operation, and then ask it whether a translation the page table no longer
//! allows is still cached. Each cached translation belongs to a VMID and comes
//! from a leaf at a level, so it covers that leaf's whole span (4 KiB, 2 MiB or
//! 1 GiB). An operation removes an entry when its pages intersect the entry's
//! span and, if the operation carries a level hint, when the levels match: the
//! architecture lets hardware keep an entry whose level differs from the hint,
//! so the model keeps it too and a wrong hint shows up as a stale entry.

use crate::{PAGE_SHIFT, Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::vec::Vec;

/// One cached translation: the leaf's whole span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTranslation {
    /// First IPA of the leaf's span.
    pub ipa: u64,
    /// Output address of the span's first byte.
    pub out_pa: u64,
    /// Level of the leaf (1, 2 or 3).
    pub level: u8,
    /// Whether the translation allowed writes.
    pub writable: bool,
}

impl CachedTranslation {
    /// Bytes the leaf spans.
    pub const fn size(&self) -> u64 {
        1 << (PAGE_SHIFT + 9 * (3 - self.level as u32))
    }
}

/// A TLB model: `(vmid, span start page)` -> cached translation.
#[derive(Debug)]
pub struct ModelTlb {
    caps: TlbCaps,
    entries: Mutex<BTreeMap<(u16, u64), CachedTranslation>>,
}

fn span_pages(level: u8) -> u64 {
    1 << (9 * (3 - level as u32))
}

impl ModelTlb {
    /// An empty model TLB of a CPU with `caps`.
    pub fn new(caps: TlbCaps) -> Self {
        Self {
            caps,
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// Caches the translation of the leaf at `level` that maps `ipa` to
    /// `out_pa`, as a hardware walk would. Both addresses are aligned down to
    /// the leaf's span. Panics on a level other than 1..=3 (a test bug).
    pub fn fill(&self, vmid: u16, ipa: u64, out_pa: u64, level: u8, writable: bool) {
        assert!(
            (1..=3).contains(&level),
            "leaf level {level} does not exist"
        );
        let mask = (span_pages(level) << PAGE_SHIFT) - 1;
        let entry = CachedTranslation {
            ipa: ipa & !mask,
            out_pa: out_pa & !mask,
            level,
            writable,
        };
        let mut map = self.entries.lock().expect("model TLB lock");
        // A real TLB may hold several overlapping entries; the model keeps one per span start.
        map.insert((vmid, entry.ipa >> PAGE_SHIFT), entry);
    }

    /// The cached translation of `ipa`, if any: `(output address, level)`.
    pub fn lookup(&self, vmid: u16, ipa: u64) -> Option<(u64, u8)> {
        let map = self.entries.lock().expect("model TLB lock");
        let page = ipa >> PAGE_SHIFT;
        (1..=3u8).find_map(|level| {
            let start = page & !(span_pages(level) - 1);
            map.get(&(vmid, start))
                .filter(|e| e.level == level)
                .map(|e| (e.out_pa + (ipa - e.ipa), level))
        })
    }

    /// Every cached translation of `vmid`.
    pub fn entries(&self, vmid: u16) -> Vec<CachedTranslation> {
        let map = self.entries.lock().expect("model TLB lock");
        map.range((vmid, 0)..=(vmid, u64::MAX))
            .map(|(_, e)| *e)
            .collect()
    }

    /// Number of cached translations over all VMIDs.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("model TLB lock").len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TlbInvalidate for ModelTlb {
    fn caps(&self) -> TlbCaps {
        self.caps
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, _scope: Scope) {
        let mut map = self.entries.lock().expect("model TLB lock");
        for op in ops {
            assert!(
                !matches!(op, TlbiOp::Range(_)) || self.caps.range,
                "range TLBI issued on a CPU without FEAT_TLBIRANGE"
            );
            match op.pages() {
                None => map.retain(|&(vmid, _), _| vmid != target.vmid),
                Some((first, end)) => map.retain(|&(vmid, start), e| {
                    let span_end = start + span_pages(e.level);
                    let hit = vmid == target.vmid
                        && start < end
                        && first < span_end
                        && op.level().is_none_or(|l| l == e.level);
                    !hit
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlushBatch, PAGE_SIZE, plan_flush};

    const RANGE: TlbCaps = TlbCaps::ALL;
    const VM1: TlbTarget = TlbTarget {
        vmid: 1,
        vttbr: 1 << 48,
    };

    #[test]
    fn entry_inside_a_flushed_range_is_gone_one_outside_stays() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4000_0000, 0x8000_0000, 3, true);
        tlb.fill(1, 0x4000_1000, 0x8000_1000, 3, true);
        tlb.fill(1, 0x4000_3000, 0x8000_3000, 3, true);
        tlb.flush_range(
            &VM1,
            0x4000_1000,
            2 * PAGE_SIZE,
            None,
            Scope::InnerShareable,
        );
        assert_eq!(tlb.lookup(1, 0x4000_0010), Some((0x8000_0010, 3)));
        assert_eq!(tlb.lookup(1, 0x4000_1000), None);
        assert_eq!(tlb.lookup(1, 0x4000_3000), Some((0x8000_3000, 3)));
    }

    #[test]
    fn a_block_goes_when_any_of_its_pages_is_flushed() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4020_5000, 0x8020_5000, 2, false);
        assert_eq!(tlb.lookup(1, 0x403f_f000), Some((0x803f_f000, 2)));
        tlb.flush_range(&VM1, 0x4030_0000, PAGE_SIZE, None, Scope::InnerShareable);
        assert_eq!(tlb.lookup(1, 0x4020_0000), None);
    }

    #[test]
    fn a_wrong_level_hint_leaves_the_entry() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4020_0000, 0x8020_0000, 2, true);
        tlb.execute(
            &VM1,
            &mut plan_flush(0x4020_0000, 1, Some(3), RANGE),
            Scope::InnerShareable,
        );
        assert!(
            tlb.lookup(1, 0x4020_0000).is_some(),
            "level-3 hint must not remove a level-2 entry"
        );
        tlb.execute(
            &VM1,
            &mut plan_flush(0x4020_0000, 1, Some(2), RANGE),
            Scope::InnerShareable,
        );
        assert!(tlb.lookup(1, 0x4020_0000).is_none());
    }

    #[test]
    fn whole_vmid_flush_leaves_other_vmids_alone() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4000_0000, 0x8000_0000, 1, true);
        tlb.fill(2, 0x4000_0000, 0x9000_0000, 3, true);
        tlb.flush_vmid(&VM1);
        assert!(tlb.entries(1).is_empty());
        assert_eq!(tlb.entries(2).len(), 1);
        assert_eq!(tlb.lookup(2, 0x4000_0000), Some((0x9000_0000, 3)));
    }

    #[test]
    fn a_range_flush_leaves_other_vmids_alone() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0, 0x8000_0000, 3, true);
        tlb.fill(2, 0, 0x9000_0000, 3, true);
        let mut batch = FlushBatch::new();
        batch.add(0, 1 << 30, None);
        batch.flush(&tlb, &VM1, Scope::InnerShareable);
        assert!(tlb.lookup(1, 0).is_none());
        assert!(tlb.lookup(2, 0).is_some());
    }

    #[test]
    #[should_panic(expected = "without FEAT_TLBIRANGE")]
    fn a_range_op_on_a_cpu_without_range_is_a_bug() {
        let tlb = ModelTlb::new(TlbCaps::BASELINE);
        let mut ops = plan_flush(0, 512, None, RANGE);
        tlb.execute(&VM1, &mut ops, Scope::InnerShareable);
    }
}
