//! A backend that counts the instructions it would issue.
//!
//! Benchmarks and tests use it to compare invalidation strategies by the
//! number of `TLBI` instructions, the trailing `VMALLE1IS` included, exactly as
//! the real backend would issue them. Counters are atomic, so shared walks on
//! several threads can use one recorder.

use crate::{Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Instructions issued, by kind (inner-shareable and local variants together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbiCounts {
    /// `TLBI IPAS2E1(IS)`.
    pub ipa: u64,
    /// `TLBI RIPAS2E1(IS)`.
    pub range: u64,
    /// `TLBI VMALLE1(IS)` issued after IPA-based operations.
    pub vmalle1: u64,
    /// `TLBI VMALLS12E1(IS)`.
    pub vmalls12: u64,
    /// Barrier sequences (calls of `execute` with at least one operation).
    pub sequences: u64,
}

impl TlbiCounts {
    /// Every `TLBI` instruction.
    pub const fn total(&self) -> u64 {
        self.ipa + self.range + self.vmalle1 + self.vmalls12
    }
}

/// Counts `TLBI` instructions instead of issuing them.
#[derive(Debug)]
pub struct RecordingTlb {
    caps: TlbCaps,
    ipa: AtomicU64,
    range: AtomicU64,
    vmalle1: AtomicU64,
    vmalls12: AtomicU64,
    sequences: AtomicU64,
}

impl RecordingTlb {
    /// A recorder that plans as a CPU with `caps` would.
    pub const fn new(caps: TlbCaps) -> Self {
        Self {
            caps,
            ipa: AtomicU64::new(0),
            range: AtomicU64::new(0),
            vmalle1: AtomicU64::new(0),
            vmalls12: AtomicU64::new(0),
            sequences: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> TlbiCounts {
        TlbiCounts {
            ipa: self.ipa.load(Relaxed),
            range: self.range.load(Relaxed),
            vmalle1: self.vmalle1.load(Relaxed),
            vmalls12: self.vmalls12.load(Relaxed),
            sequences: self.sequences.load(Relaxed),
        }
    }

    /// Sets every counter back to zero.
    pub fn reset(&self) {
        for c in [
            &self.ipa,
            &self.range,
            &self.vmalle1,
            &self.vmalls12,
            &self.sequences,
        ] {
            c.store(0, Relaxed);
        }
    }
}

impl TlbInvalidate for RecordingTlb {
    fn caps(&self) -> TlbCaps {
        self.caps
    }

    fn execute(&self, _target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, _scope: Scope) {
        let mut by_ipa = false;
        let mut any = false;
        for op in ops {
            any = true;
            match op {
                TlbiOp::Ipa(_) => {
                    by_ipa = true;
                    self.ipa.fetch_add(1, Relaxed);
                }
                TlbiOp::Range(_) => {
                    by_ipa = true;
                    self.range.fetch_add(1, Relaxed);
                }
                TlbiOp::WholeVmid => {
                    self.vmalls12.fetch_add(1, Relaxed);
                }
            }
        }
        if by_ipa {
            self.vmalle1.fetch_add(1, Relaxed);
        }
        if any {
            self.sequences.fetch_add(1, Relaxed);
        }
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
                sequences: 1,
                ..Default::default()
            }
        );
        tlb.reset();
        assert_eq!(tlb.counts(), TlbiCounts::default());
    }
}
