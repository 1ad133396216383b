//! A TLB backend wrapper that counts every invalidation instruction by kind.
//!
//! The hypervisor reports per-VM TLBI counts at power-off. [`CountingTlb`]
//! sits between the page-table engine and the real backend: it forwards each
//! operation unchanged and bumps the VM's counter for its kind, plus one
//! `TLBI VMALLE1(IS)` for every sequence that had IPA-based operations (the
//! backend issues it after them, so combined stage-1+2 entries go too).

use crate::vm::counters::{Counter, VmCounters};
use tlb::{Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};

/// Counts the operations `inner` executes into `counters`.
pub struct CountingTlb<'c, T> {
    inner: T,
    counters: &'c VmCounters,
}

impl<'c, T: TlbInvalidate> CountingTlb<'c, T> {
    /// Wraps `inner`.
    pub fn new(inner: T, counters: &'c VmCounters) -> Self {
        Self { inner, counters }
    }
}

struct Counting<'a, 'c> {
    ops: &'a mut dyn Iterator<Item = TlbiOp>,
    counters: &'c VmCounters,
    ipa_based: bool,
}

impl Iterator for Counting<'_, '_> {
    type Item = TlbiOp;

    fn next(&mut self) -> Option<TlbiOp> {
        let op = self.ops.next()?;
        match op {
            TlbiOp::Ipa(_) => {
                self.ipa_based = true;
                self.counters.bump(Counter::TlbiIpa);
            }
            TlbiOp::Range(_) => {
                self.ipa_based = true;
                self.counters.bump(Counter::TlbiRange);
            }
            TlbiOp::WholeVmid => self.counters.bump(Counter::TlbiVmalls12),
        }
        Some(op)
    }
}

impl<T: TlbInvalidate> TlbInvalidate for CountingTlb<'_, T> {
    fn caps(&self) -> TlbCaps {
        self.inner.caps()
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        let mut counting = Counting {
            ops,
            counters: self.counters,
            ipa_based: false,
        };
        self.inner.execute(target, &mut counting, scope);
        if counting.ipa_based {
            self.counters.bump(Counter::TlbiVmalle1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tlb::RecordingTlb;

    fn caps(range: bool) -> TlbCaps {
        TlbCaps {
            range,
            ttl: false,
            vmid_bits: 16,
        }
    }

    #[test]
    fn counts_match_the_recording_backend() {
        for range in [false, true] {
            let counters = VmCounters::new();
            let recording = RecordingTlb::new(caps(range));
            let tlb = CountingTlb::new(&recording, &counters);
            let target = TlbTarget {
                vmid: 1,
                vttbr: 1 << 48,
            };
            tlb.flush_range(
                &target,
                0x4000_0000,
                2 << 20,
                Some(2),
                Scope::InnerShareable,
            );
            tlb.flush_range(&target, 0x4000_0000, 4096, Some(3), Scope::InnerShareable);
            tlb.flush_vmid(&target);
            let expected = recording.counts();
            assert_eq!(
                counters.get(Counter::TlbiIpa),
                expected.ipa,
                "range={range}"
            );
            assert_eq!(
                counters.get(Counter::TlbiRange),
                expected.range,
                "range={range}"
            );
            assert_eq!(
                counters.get(Counter::TlbiVmalle1),
                expected.vmalle1,
                "range={range}"
            );
            assert_eq!(
                counters.get(Counter::TlbiVmalls12),
                expected.vmalls12,
                "range={range}"
            );
            assert!(counters.get(Counter::TlbiVmalls12) >= 1);
        }
    }
}
