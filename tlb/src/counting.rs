//! A backend adaptor that counts every instruction a backend issues, by kind.
//!
//! [`CountingTlb`] sits between a caller (the page-table engine) and any
//! [`TlbInvalidate`] backend: it forwards each sequence unchanged and adds the
//! instructions the sequence issues to per-kind atomic counters. The hypervisor
//! wraps its real backend in it to report per-VM counts; benchmarks and tests
//! wrap a backend that issues nothing (`RecordingTlb`, with the `model`
//! feature).
//!
//! # Algorithm
//!
//! The adaptor hands the backend an iterator over the caller's operations that
//! bumps the `TLBI IPAS2E1(IS)`, `RIPAS2E1(IS)` or `VMALLS12E1(IS)` counter as
//! each operation passes and records it in a [`SequenceShape`]. When the
//! backend returns, the shape says what the backend issued around the
//! operations: the trailing `TLBI VMALLE1(IS)` (the rule lives in
//! [`SequenceShape::needs_vmalle1`], which the real backend obeys too) and the
//! `DSB` barriers. Counting what the backend pulled, not what the caller
//! offered, keeps the counts exact even for a backend that stops early.
//! Counters use relaxed atomics: concurrent walks on several CPUs may share
//! one adaptor, and only the totals matter.

use crate::{Scope, SequenceShape, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};
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
    /// `DSB` barriers of the sequences (`ISHST`/`NSHST` before, `ISH`/`NSH`
    /// after the operations and after `VMALLE1(IS)`).
    pub dsb: u64,
    /// Barrier sequences (calls of `execute` with at least one operation).
    pub sequences: u64,
}

impl TlbiCounts {
    /// Every `TLBI` instruction (barriers excluded).
    pub const fn total(&self) -> u64 {
        self.ipa + self.range + self.vmalle1 + self.vmalls12
    }
}

/// Counts the instructions `B` issues; otherwise behaves exactly as `B`.
#[derive(Debug)]
pub struct CountingTlb<B> {
    inner: B,
    ipa: AtomicU64,
    range: AtomicU64,
    vmalle1: AtomicU64,
    vmalls12: AtomicU64,
    dsb: AtomicU64,
    sequences: AtomicU64,
}

impl<B> CountingTlb<B> {
    /// Wraps `inner` with every counter at zero.
    pub const fn new(inner: B) -> Self {
        Self {
            inner,
            ipa: AtomicU64::new(0),
            range: AtomicU64::new(0),
            vmalle1: AtomicU64::new(0),
            vmalls12: AtomicU64::new(0),
            dsb: AtomicU64::new(0),
            sequences: AtomicU64::new(0),
        }
    }

    /// The wrapped backend.
    pub const fn inner(&self) -> &B {
        &self.inner
    }

    /// The counts so far.
    pub fn counts(&self) -> TlbiCounts {
        TlbiCounts {
            ipa: self.ipa.load(Relaxed),
            range: self.range.load(Relaxed),
            vmalle1: self.vmalle1.load(Relaxed),
            vmalls12: self.vmalls12.load(Relaxed),
            dsb: self.dsb.load(Relaxed),
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
            &self.dsb,
            &self.sequences,
        ] {
            c.store(0, Relaxed);
        }
    }
}

/// The caller's operations as the backend pulls them, counted on the way.
struct Counted<'a, 'c, B> {
    ops: &'a mut dyn Iterator<Item = TlbiOp>,
    counting: &'c CountingTlb<B>,
    shape: SequenceShape,
}

impl<B> Iterator for Counted<'_, '_, B> {
    type Item = TlbiOp;

    fn next(&mut self) -> Option<TlbiOp> {
        let op = self.ops.next()?;
        self.shape.record(&op);
        let counter = match op {
            TlbiOp::Ipa(_) => &self.counting.ipa,
            TlbiOp::Range(_) => &self.counting.range,
            TlbiOp::WholeVmid => &self.counting.vmalls12,
        };
        counter.fetch_add(1, Relaxed);
        Some(op)
    }
}

impl<B: TlbInvalidate> TlbInvalidate for CountingTlb<B> {
    fn caps(&self) -> TlbCaps {
        self.inner.caps()
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        let mut counted = Counted {
            ops,
            counting: self,
            shape: SequenceShape::new(),
        };
        self.inner.execute(target, &mut counted, scope);
        let shape = counted.shape;
        if shape.is_empty() {
            return;
        }
        if shape.needs_vmalle1() {
            self.vmalle1.fetch_add(1, Relaxed);
        }
        self.dsb.fetch_add(shape.dsb_count(), Relaxed);
        self.sequences.fetch_add(1, Relaxed);
    }

    fn on_break(&self, target: &TlbTarget, ipa: u64, size: u64, level: Option<u8>) {
        self.inner.on_break(target, ipa, size, level);
    }

    fn on_make(&self, target: &TlbTarget, ipa: u64, size: u64) {
        self.inner.on_make(target, ipa, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelTlb, RecordingTlb};
    use proptest::prelude::*;
    use std::vec::Vec;

    const T: TlbTarget = TlbTarget {
        vmid: 1,
        vttbr: 1 << 48,
    };

    #[test]
    fn a_range_flush_ends_with_one_vmalle1_and_three_dsbs() {
        let tlb = CountingTlb::new(ModelTlb::new(TlbCaps::ALL));
        tlb.flush_range(&T, 0x4000_0000, 1 << 30, Some(3), Scope::InnerShareable);
        assert_eq!(
            tlb.counts(),
            TlbiCounts {
                range: 1,
                vmalle1: 1,
                dsb: 3,
                sequences: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_single_page_flush_ends_with_one_vmalle1() {
        for caps in [TlbCaps::ALL, TlbCaps::NO_RANGE, TlbCaps::BASELINE] {
            let tlb = CountingTlb::new(ModelTlb::new(caps));
            tlb.flush_range(&T, 0x4000_0000, 4096, Some(3), Scope::Local);
            assert_eq!(
                tlb.counts(),
                TlbiCounts {
                    ipa: 1,
                    vmalle1: 1,
                    dsb: 3,
                    sequences: 1,
                    ..Default::default()
                },
                "{caps:?}"
            );
        }
    }

    #[test]
    fn a_whole_vmid_flush_needs_no_vmalle1() {
        let tlb = CountingTlb::new(ModelTlb::new(TlbCaps::ALL));
        tlb.flush_vmid(&T);
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

    #[test]
    fn an_empty_sequence_counts_nothing() {
        let tlb = CountingTlb::new(ModelTlb::new(TlbCaps::ALL));
        tlb.execute(&T, &mut core::iter::empty(), Scope::InnerShareable);
        tlb.flush_range(&T, 0x4000_0000, 0, None, Scope::InnerShareable);
        assert_eq!(tlb.counts(), TlbiCounts::default());
    }

    #[test]
    fn the_wrapped_backend_sees_every_operation() {
        let tlb = CountingTlb::new(ModelTlb::new(TlbCaps::ALL));
        tlb.inner().fill(T.vmid, 0x4000_0000, 0x8000_0000, 3, true);
        tlb.inner().fill(T.vmid, 0x4020_0000, 0x8020_0000, 2, true);
        tlb.flush_range(&T, 0x4000_0000, 4096, Some(3), Scope::InnerShareable);
        assert_eq!(tlb.inner().lookup(T.vmid, 0x4000_0000), None);
        assert!(tlb.inner().lookup(T.vmid, 0x4020_0000).is_some());
    }

    /// One request: `(first page, pages, level, whole VMID)`.
    fn request() -> impl Strategy<Value = (u64, u64, Option<u8>, bool)> {
        (
            0u64..(1 << 28),
            0u64..(1 << 20),
            prop::option::of(1u8..=3),
            any::<bool>(),
        )
    }

    proptest! {
        /// Every sequence: one VMALLE1 exactly when it had an IPA-based
        /// operation, and the same counts as the recording backend.
        #[test]
        fn vmalle1_follows_every_ipa_based_sequence(
            range in any::<bool>(),
            requests in prop::collection::vec(request(), 1..20),
        ) {
            let caps = if range { TlbCaps::ALL } else { TlbCaps::NO_RANGE };
            let tlb = CountingTlb::new(ModelTlb::new(caps));
            let recording = RecordingTlb::new(caps);
            let mut ipa_based_sequences = 0;
            for &(first, pages, level, whole) in &requests {
                let before = tlb.counts();
                if whole {
                    tlb.flush_vmid(&T);
                    recording.flush_vmid(&T);
                } else {
                    tlb.flush_range(&T, first << 12, pages << 12, level, Scope::InnerShareable);
                    recording.flush_range(&T, first << 12, pages << 12, level, Scope::InnerShareable);
                }
                let after = tlb.counts();
                let ops = (after.ipa - before.ipa) + (after.range - before.range);
                prop_assert_eq!(after.vmalle1 - before.vmalle1, u64::from(ops > 0));
                ipa_based_sequences += u64::from(ops > 0);
            }
            prop_assert_eq!(tlb.counts().vmalle1, ipa_based_sequences);
            prop_assert_eq!(tlb.counts(), recording.counts());
        }

        /// The operations the backend received are the ones counted.
        #[test]
        fn counts_match_the_operations_passed_through(
            requests in prop::collection::vec(request(), 1..20),
        ) {
            let tlb = CountingTlb::new(ModelTlb::new(TlbCaps::ALL));
            let mut seen = Vec::new();
            for &(first, pages, level, _) in &requests {
                let mut plan = crate::plan_flush(first << 12, pages, level, TlbCaps::ALL);
                let ops: Vec<TlbiOp> = plan.by_ref().collect();
                tlb.execute(&T, &mut ops.iter().copied(), Scope::InnerShareable);
                seen.extend(ops);
            }
            let counts = tlb.counts();
            let count = |f: fn(&TlbiOp) -> bool| seen.iter().filter(|op| f(op)).count() as u64;
            prop_assert_eq!(counts.ipa, count(|op| matches!(op, TlbiOp::Ipa(_))));
            prop_assert_eq!(counts.range, count(|op| matches!(op, TlbiOp::Range(_))));
            prop_assert_eq!(counts.vmalls12, count(|op| matches!(op, TlbiOp::WholeVmid)));
        }
    }
}
