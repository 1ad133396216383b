//! A backend that counts the instructions it would issue.
//!
//! Benchmarks and tests use it to compare invalidation strategies by the
//! number of `TLBI` instructions, the trailing `VMALLE1IS` included, exactly as
//! the real backend would issue them: it is a [`CountingTlb`] around a backend
//! that issues nothing. Counters are atomic, so shared walks on several threads
//! can use one recorder.

use crate::{CountingTlb, Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiCounts, TlbiOp};

/// A backend that issues nothing: it takes the operations and drops them.
#[derive(Clone, Copy, Debug)]
struct Discard {
    caps: TlbCaps,
}

impl TlbInvalidate for Discard {
    fn caps(&self) -> TlbCaps {
        self.caps
    }

    fn execute(&self, _target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, _scope: Scope) {
        ops.for_each(drop);
    }
}

/// Counts `TLBI` instructions instead of issuing them.
#[derive(Debug)]
pub struct RecordingTlb {
    counting: CountingTlb<Discard>,
}

impl RecordingTlb {
    /// A recorder that plans as a CPU with `caps` would.
    pub const fn new(caps: TlbCaps) -> Self {
        Self {
            counting: CountingTlb::new(Discard { caps }),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> TlbiCounts {
        self.counting.counts()
    }

    /// Sets every counter back to zero.
    pub fn reset(&self) {
        self.counting.reset();
    }
}

impl TlbInvalidate for RecordingTlb {
    fn caps(&self) -> TlbCaps {
        self.counting.caps()
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        self.counting.execute(target, ops, scope);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlushBatch, PAGE_SIZE};

    const RANGE: TlbCaps = TlbCaps::ALL;
    const T: TlbTarget = TlbTarget {
        vmid: 1,
        vttbr: 1 << 48,
    };

    #[test]
    fn one_gib_flush_costs_one_range_and_one_vmalle1() {
        let tlb = RecordingTlb::new(RANGE);
        tlb.flush_range(&T, 0x4000_0000, 1 << 30, Some(3), Scope::InnerShareable);
        assert_eq!(
            tlb.counts(),
            TlbiCounts {
                ipa: 0,
                range: 1,
                vmalle1: 1,
                vmalls12: 0,
                dsb: 3,
                sequences: 1
            }
        );
        assert_eq!(tlb.counts().total(), 2);
    }

    #[test]
    fn batch_of_a_gib_of_pages_flushes_in_one_sequence() {
        let tlb = RecordingTlb::new(RANGE);
        let mut batch = FlushBatch::new();
        for i in 0..(1u64 << 18) {
            batch.add(i * PAGE_SIZE, PAGE_SIZE, Some(3));
        }
        assert_eq!(batch.flush(&tlb, &T, Scope::InnerShareable), 1);
        assert_eq!(tlb.counts().total(), 2);
        assert!(batch.is_empty());
    }

    #[test]
    fn without_range_a_multi_page_flush_is_one_vmalls12() {
        let tlb = RecordingTlb::new(TlbCaps::BASELINE);
        tlb.flush_range(&T, 0, 8 * PAGE_SIZE, None, Scope::InnerShareable);
        assert_eq!(
            tlb.counts(),
            TlbiCounts {
                vmalls12: 1,
                dsb: 2,
                sequences: 1,
                ..Default::default()
            }
        );
        tlb.reset();
        assert_eq!(tlb.counts(), TlbiCounts::default());
    }
}
