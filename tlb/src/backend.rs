//! The one interface through which stage-2 TLB invalidations are issued.
//!
//! A backend executes a sequence of [`TlbiOp`]s for one VM with the barrier
//! sequence of a [`Scope`]: inner-shareable (every CPU) after anything that
//! removes or restricts a translation, local after relaxing permissions, where
//! a stale stricter entry on another CPU only costs a spurious fault. Callers
//! plan with the backend's own [`TlbCaps`], so the capabilities read at boot are
//! the only ones that count.
//!
//! # The sequence
//!
//! Every backend issues one sequence per `execute` call with at least one
//! operation: a store barrier (`DSB ISHST`/`NSHST`), the operations, a
//! completion barrier (`DSB ISH`/`NSH`), then, where [`SequenceShape`] says so,
//! `TLBI VMALLE1(IS)` and another completion barrier, and finally `ISB`. The
//! rule for the trailing `VMALLE1(IS)` is written once, in
//! [`SequenceShape::needs_vmalle1`]: the real backend issues by it and
//! [`CountingTlb`](crate::CountingTlb) counts by it.

use crate::{PAGE_SHIFT, PAGE_SIZE, Plan, TlbCaps, TlbiOp, plan_flush};

/// Which CPUs must stop using the stale entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every CPU in the inner-shareable domain (`...IS` instructions, `DSB ISH`).
    InnerShareable,
    /// Only this CPU (non-shareable instructions, `DSB NSH`).
    Local,
}

/// The VM whose translations are invalidated.
///
/// `TLBI` by IPA or VMID acts on the VMID in the current `VTTBR_EL2`, so the
/// real backend loads `vttbr` for the duration of the operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbTarget {
    /// The VM's VMID.
    pub vmid: u16,
    /// The VM's full `VTTBR_EL2` value (root table address and VMID).
    pub vttbr: u64,
}

/// What one sequence issues around its operations, built from the operations
/// as they are issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceShape {
    ops: u64,
    by_ipa: bool,
}

impl SequenceShape {
    /// The shape of a sequence with no operations yet.
    pub const fn new() -> Self {
        Self {
            ops: 0,
            by_ipa: false,
        }
    }

    /// Adds `op` to the sequence.
    pub fn record(&mut self, op: &TlbiOp) {
        self.ops += 1;
        self.by_ipa |= matches!(op, TlbiOp::Ipa(_) | TlbiOp::Range(_));
    }

    /// Operations recorded so far.
    pub const fn ops(&self) -> u64 {
        self.ops
    }

    /// Whether the sequence has no operation (and issues nothing at all).
    pub const fn is_empty(&self) -> bool {
        self.ops == 0
    }

    /// Whether the sequence must end with `TLBI VMALLE1(IS)` (and a `DSB`).
    ///
    /// `IPAS2E1(IS)` and `RIPAS2E1(IS)` remove stage-2 entries by IPA, but an
    /// implementation may cache combined stage-1+2 entries tagged by VA, which
    /// an IPA cannot name (QEMU's TLB does exactly this), so after any
    /// IPA-based operation the VMID's stage-1 entries go too.
    /// `VMALLS12E1(IS)` removes both stages itself.
    pub const fn needs_vmalle1(&self) -> bool {
        self.by_ipa
    }

    /// `DSB` barriers the sequence issues: none when empty, else the store
    /// barrier, the completion barrier, and one more after `VMALLE1(IS)`.
    pub const fn dsb_count(&self) -> u64 {
        if self.is_empty() {
            0
        } else if self.needs_vmalle1() {
            3
        } else {
            2
        }
    }
}

/// A TLB invalidation backend.
pub trait TlbInvalidate: Sync {
    /// The capabilities plans for this backend must respect.
    fn caps(&self) -> TlbCaps;

    /// Executes `ops` for `target` as one sequence: a store barrier, the
    /// operations, a completion barrier, and where
    /// [`SequenceShape::needs_vmalle1`] says so a `VMALLE1(IS)` so combined
    /// stage-1+2 entries go too, then `ISB`. Issues nothing when `ops` is empty.
    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope);

    /// Plans and executes the invalidation of `[ipa, ipa + size)`, where
    /// `level` is the level of every removed leaf if known.
    fn flush_range(
        &self,
        target: &TlbTarget,
        ipa: u64,
        size: u64,
        level: Option<u8>,
        scope: Scope,
    ) {
        let first = ipa >> PAGE_SHIFT;
        let end = ipa.saturating_add(size).saturating_add(PAGE_SIZE - 1) >> PAGE_SHIFT;
        let mut plan: Plan = plan_flush(ipa, end.saturating_sub(first), level, self.caps());
        if !plan.is_empty() {
            self.execute(target, &mut plan, scope);
        }
    }

    /// Invalidates every translation of `target`'s VMID on every CPU.
    fn flush_vmid(&self, target: &TlbTarget) {
        self.execute(target, &mut Plan::whole_vmid(), Scope::InnerShareable);
    }

    /// Break-before-make, step one: the valid entry translating
    /// `[ipa, ipa + size)` was just made invalid (locked). `level` is the
    /// leaf's level, or `None` for a table entry. The real backend issues
    /// nothing; a checking backend (the model TLB) records the break so that
    /// [`on_make`](Self::on_make) can check the flush in between.
    fn on_break(&self, target: &TlbTarget, ipa: u64, size: u64, level: Option<u8>) {
        let _ = (target, ipa, size, level);
    }

    /// Break-before-make, step three: a new valid entry for
    /// `[ipa, ipa + size)` is about to be published where a valid one was
    /// broken by [`on_break`](Self::on_break). Legal only once the break was
    /// followed by an inner-shareable flush of the whole span (with its
    /// `DSB`); the real backend issues nothing, a checking backend panics
    /// when the order does not hold.
    fn on_make(&self, target: &TlbTarget, ipa: u64, size: u64) {
        let _ = (target, ipa, size);
    }
}

impl<T: TlbInvalidate + ?Sized> TlbInvalidate for &T {
    fn caps(&self) -> TlbCaps {
        (**self).caps()
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        (**self).execute(target, ops, scope)
    }

    fn on_break(&self, target: &TlbTarget, ipa: u64, size: u64, level: Option<u8>) {
        (**self).on_break(target, ipa, size, level)
    }

    fn on_make(&self, target: &TlbTarget, ipa: u64, size: u64) {
        (**self).on_make(target, ipa, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IpaOperand, RangeOperand};
    use std::vec;

    fn shape(ops: &[TlbiOp]) -> SequenceShape {
        let mut shape = SequenceShape::new();
        ops.iter().for_each(|op| shape.record(op));
        shape
    }

    #[test]
    fn ipa_based_operations_need_vmalle1() {
        let ipa = TlbiOp::Ipa(IpaOperand::new(0x40000, Some(3)).expect("page operand"));
        let range = TlbiOp::Range(RangeOperand::new(0x40000, 3, 1, None).expect("range operand"));
        for ops in [vec![ipa], vec![range], vec![TlbiOp::WholeVmid, ipa]] {
            let shape = shape(&ops);
            assert!(shape.needs_vmalle1(), "{ops:?}");
            assert_eq!(shape.dsb_count(), 3);
            assert_eq!(shape.ops(), ops.len() as u64);
        }
    }

    #[test]
    fn whole_vmid_and_empty_sequences_do_not() {
        let whole = shape(&[TlbiOp::WholeVmid]);
        assert!(!whole.needs_vmalle1());
        assert_eq!(whole.dsb_count(), 2);
        let empty = shape(&[]);
        assert!(empty.is_empty() && !empty.needs_vmalle1());
        assert_eq!(empty.dsb_count(), 0);
    }
}
