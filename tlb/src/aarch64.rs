//! The real backend: `TLBI` instructions with the architecture's barriers.
//!
//! Runs at EL2. `TLBI` by IPA or VMID acts on the VMID held in `VTTBR_EL2`, so
//! the target VM's `VTTBR_EL2` is loaded for the duration of the sequence and
//! the previous value restored afterwards (interrupts are masked at EL2, so
//! nothing observes the temporary value). The sequences:
//!
//! - by IPA or range: `DSB ISHST`, the operations, `DSB ISH`, `TLBI VMALLE1IS`
//!   (stage-2-only operations leave combined stage-1+2 entries: the rule is
//!   [`SequenceShape::needs_vmalle1`]), `DSB ISH`, `ISB`;
//! - whole VMID: `DSB ISHST`, `TLBI VMALLS12E1IS`, `DSB ISH`, `ISB`;
//! - [`Scope::Local`] uses the non-shareable instructions and `DSB NSH(ST)`.

use crate::{Scope, SequenceShape, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};
use core::arch::asm;

/// Issues stage-2 TLB invalidations on the running CPU.
#[derive(Clone, Copy, Debug)]
pub struct Aarch64Tlb {
    caps: TlbCaps,
}

impl Aarch64Tlb {
    /// A backend for a CPU with `caps` (decode them with [`TlbCaps::from_id_registers`]
    /// and keep what every CPU has).
    pub const fn new(caps: TlbCaps) -> Self {
        Self { caps }
    }
}

fn read_vttbr() -> u64 {
    let value;
    // SAFETY: reading VTTBR_EL2 has no side effects; this backend runs at EL2.
    unsafe { asm!("mrs {}, VTTBR_EL2", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

fn write_vttbr(value: u64) {
    // SAFETY: VTTBR_EL2 only affects EL1/EL0 stage-2 translation, which is not
    // in use while the hypervisor runs at EL2; the ISB makes the new VMID
    // visible to the TLBI instructions that follow.
    unsafe { asm!("msr VTTBR_EL2, {}", "isb", in(reg) value, options(nostack, preserves_flags)) };
}

/// Issues one operation. Barriers are the caller's job.
fn issue(op: TlbiOp, scope: Scope) {
    // SAFETY: TLB maintenance only removes cached translations; it never
    // changes memory or the page tables, and the operands are well-formed
    // encodings built by `tlb::operand`. RIPAS2E1(IS) is only reached when the
    // CPU reported FEAT_TLBIRANGE, which `execute` checks.
    unsafe {
        match (op, scope) {
            (TlbiOp::Ipa(o), Scope::InnerShareable) => {
                asm!("tlbi ipas2e1is, {}", in(reg) o.encode(), options(nostack, preserves_flags))
            }
            (TlbiOp::Ipa(o), Scope::Local) => {
                asm!("tlbi ipas2e1, {}", in(reg) o.encode(), options(nostack, preserves_flags))
            }
            (TlbiOp::Range(o), Scope::InnerShareable) => asm!(
                ".arch_extension tlb-rmi",
                "tlbi ripas2e1is, {}",
                in(reg) o.encode(),
                options(nostack, preserves_flags)
            ),
            (TlbiOp::Range(o), Scope::Local) => asm!(
                ".arch_extension tlb-rmi",
                "tlbi ripas2e1, {}",
                in(reg) o.encode(),
                options(nostack, preserves_flags)
            ),
            (TlbiOp::WholeVmid, Scope::InnerShareable) => {
                asm!("tlbi vmalls12e1is", options(nostack, preserves_flags))
            }
            (TlbiOp::WholeVmid, Scope::Local) => {
                asm!("tlbi vmalls12e1", options(nostack, preserves_flags))
            }
        }
    }
}

impl TlbInvalidate for Aarch64Tlb {
    fn caps(&self) -> TlbCaps {
        self.caps
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        let mut ops = ops.peekable();
        if ops.peek().is_none() {
            return;
        }
        let previous = read_vttbr();
        if previous != target.vttbr {
            write_vttbr(target.vttbr);
        }
        // SAFETY: barriers have no effect beyond ordering memory accesses.
        unsafe {
            match scope {
                Scope::InnerShareable => asm!("dsb ishst", options(nostack, preserves_flags)),
                Scope::Local => asm!("dsb nshst", options(nostack, preserves_flags)),
            }
        }
        let mut shape = SequenceShape::new();
        for op in ops {
            if let TlbiOp::Range(_) = op {
                assert!(
                    self.caps.range,
                    "range TLBI planned for a CPU without FEAT_TLBIRANGE"
                );
            }
            shape.record(&op);
            issue(op, scope);
        }
        // SAFETY: barriers and TLB maintenance of the current VMID's stage-1
        // entries only drop cached translations.
        unsafe {
            match (scope, shape.needs_vmalle1()) {
                (Scope::InnerShareable, true) => {
                    asm!(
                        "dsb ish",
                        "tlbi vmalle1is",
                        "dsb ish",
                        "isb",
                        options(nostack, preserves_flags)
                    )
                }
                (Scope::Local, true) => asm!(
                    "dsb nsh",
                    "tlbi vmalle1",
                    "dsb nsh",
                    "isb",
                    options(nostack, preserves_flags)
                ),
                (Scope::InnerShareable, false) => {
                    asm!("dsb ish", "isb", options(nostack, preserves_flags))
                }
                (Scope::Local, false) => asm!("dsb nsh", "isb", options(nostack, preserves_flags)),
            }
        }
        if previous != target.vttbr {
            write_vttbr(previous);
        }
    }
}
