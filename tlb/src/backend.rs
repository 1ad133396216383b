//! The one interface through which stage-2 TLB invalidations are issued.
//!
//! A backend executes a sequence of [`TlbiOp`]s for one VM with the barrier
//! sequence of a [`Scope`]: inner-shareable (every CPU) after anything that
//! removes or restricts a translation, local after relaxing permissions, where
//! a stale stricter entry on another CPU only costs a spurious fault. Callers
//! plan with the backend's own [`TlbCaps`], so the capabilities read at boot are
//! the only ones that count.

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

/// A TLB invalidation backend.
pub trait TlbInvalidate: Sync {
    /// The capabilities plans for this backend must respect.
    fn caps(&self) -> TlbCaps;

    /// Executes `ops` for `target` as one sequence: a store barrier, the
    /// operations, a completion barrier, and after IPA-based operations a
    /// `VMALLE1(IS)` so combined stage-1+2 entries go too, then `ISB`.
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
}

impl<T: TlbInvalidate + ?Sized> TlbInvalidate for &T {
    fn caps(&self) -> TlbCaps {
        (**self).caps()
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        (**self).execute(target, ops, scope)
    }
}
