//! What the hypervisor does with a trapped `MSR`/`MRS`.
//!
//! The hypervisor traps no system register on purpose today, but the
//! architecture traps a few to EL2 regardless of configuration on some CPUs
//! (for example the OS lock and debug registers when debug is not owned by the
//! guest). [`policy`] names each trapped register the hypervisor knows and says
//! how to emulate it; a register it does not know reads as zero and ignores
//! writes, which the run loop logs once per register so it never goes unnoticed.
//!
//! The ID registers (`op0 = 3, op1 = 0, CRn = 0, CRm = 1..=7`, trapped with
//! `HCR_EL2.TID3`) read as the CPU's own values with the features the
//! hypervisor does not give guests removed ([`guest_id_value`]): MTE unless
//! the VM has `mte=on` (without it the guest's allocation-tag accesses are
//! disabled, `HCR_EL2.ATA` clear). Writes to them are ignored.
//!
//! Before any of that, [`classify`] sorts a trapped access by who answers
//! it, in this order: a set/way cache maintenance instruction or a write to a
//! virtual-memory control register (both trapped only without FEAT_S2FWB, see
//! `crate::stage2::cache_maint`), the virtual GIC's SGI generation registers
//! (`ICC_SGI1R_EL1` and the group 0 ones), the EL1 physical timer's
//! registers (trapped with `CNTHCTL_EL2.EL1PCEN` clear, see
//! `crate::devices::timer`), the ID registers, then [`policy`].

use crate::devices::timer::PhysicalTimerReg;
use crate::devices::vgic::SgiGroup;
use crate::devices::vgic::cpu_interface::CommonRegister;
use crate::exit::esr::SysRegAccess;
use crate::stage2::cache_maint::{self, VmReg};
use crate::vm::exit_profile::ExitClass;
use crate::vocabulary::sysreg_encoding::SysRegEncoding;

/// How to emulate a trapped register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysRegPolicy {
    /// A known register whose guest view is "reads as zero, writes ignored".
    ReadAsZeroWriteIgnored(&'static str),
    /// Not known: reads as zero, writes ignored, and reported.
    Unknown,
}

const fn enc(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> SysRegEncoding {
    SysRegEncoding {
        op0,
        op1,
        crn,
        crm,
        op2,
    }
}

const KNOWN: [(SysRegEncoding, &str); 5] = [
    (enc(2, 0, 1, 0, 4), "OSLAR_EL1"),
    (enc(2, 0, 1, 1, 4), "OSLSR_EL1"),
    (enc(2, 0, 1, 3, 4), "OSDLR_EL1"),
    (enc(2, 0, 0, 2, 2), "MDSCR_EL1"),
    (enc(2, 0, 0, 0, 2), "OSDTRRX_EL1"),
];

/// Whether `reg` is in the ID register space trapped by `HCR_EL2.TID3`.
pub const fn is_id_register(reg: SysRegEncoding) -> bool {
    reg.op0 == 3 && reg.op1 == 0 && reg.crn == 0 && reg.crm >= 1 && reg.crm <= 7
}

/// `ID_AA64PFR1_EL1`.
pub const ID_AA64PFR1_EL1: SysRegEncoding = enc(3, 0, 0, 4, 1);
/// `ID_AA64PFR1_EL1.MTE` \[11:8\] and `MTE_frac` \[43:40\].
const PFR1_MTE_FIELDS: u64 = (0xf << 8) | (0xf << 40);

/// The value a guest reads from ID register `reg` whose value on the CPU
/// is `host`: the same, minus the features guests do not get (memory
/// tagging unless `mte`).
pub const fn guest_id_value(reg: SysRegEncoding, host: u64, mte: bool) -> u64 {
    if !mte
        && reg.op0 == ID_AA64PFR1_EL1.op0
        && reg.op1 == ID_AA64PFR1_EL1.op1
        && reg.crn == ID_AA64PFR1_EL1.crn
        && reg.crm == ID_AA64PFR1_EL1.crm
        && reg.op2 == ID_AA64PFR1_EL1.op2
    {
        host & !PFR1_MTE_FIELDS
    } else {
        host
    }
}

/// Who answers a trapped system register access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysRegTrap {
    /// A set/way cache maintenance instruction (`DC ISW`/`CSW`/`CISW`).
    SetWay,
    /// A write to a virtual-memory control register.
    VmRegWrite(VmReg),
    /// An access to an SGI generation register of this group.
    Sgi(SgiGroup),
    /// An EL1 physical timer register (`CNTP_CTL/CVAL/TVAL_EL0`).
    PhysicalTimer(PhysicalTimerReg),
    /// A common virtual CPU interface register (trapped with
    /// `ICH_HCR_EL2.TC` where the hypervisor guards the binary point,
    /// `crate::devices::vgic::cpu_interface`).
    CpuInterface(CommonRegister),
    /// An ID register.
    IdRegister,
    /// Any other register, emulated as the policy says.
    Other(SysRegPolicy),
}

impl SysRegTrap {
    /// The exit's class in the VM's exit profile.
    pub const fn exit_class(&self) -> ExitClass {
        match self {
            Self::SetWay => ExitClass::SysregSetWay,
            Self::VmRegWrite(_) => ExitClass::SysregVmReg,
            Self::Sgi(_) => ExitClass::SysregSgi,
            Self::IdRegister => ExitClass::SysregId,
            Self::PhysicalTimer(_) => ExitClass::SysregTimer,
            Self::CpuInterface(_) | Self::Other(_) => ExitClass::SysregOther,
        }
    }
}

/// Sorts `access` by who answers it (see the module docs).
pub fn classify(access: &SysRegAccess) -> SysRegTrap {
    let r = access.reg;
    if cache_maint::set_way_op(r).is_some() {
        return SysRegTrap::SetWay;
    }
    if !access.read
        && let Some(reg) = cache_maint::vm_reg(r)
    {
        return SysRegTrap::VmRegWrite(reg);
    }
    if let Some(group) = SgiGroup::from_sysreg(r.op0, r.op1, r.crn, r.crm, r.op2) {
        return SysRegTrap::Sgi(group);
    }
    if let Some(reg) = PhysicalTimerReg::from_encoding(r) {
        return SysRegTrap::PhysicalTimer(reg);
    }
    if let Some(reg) = CommonRegister::from_encoding(r.op0, r.op1, r.crn, r.crm, r.op2) {
        return SysRegTrap::CpuInterface(reg);
    }
    if is_id_register(r) {
        return SysRegTrap::IdRegister;
    }
    SysRegTrap::Other(policy(r))
}

/// The emulation policy for `reg`.
pub fn policy(reg: SysRegEncoding) -> SysRegPolicy {
    KNOWN
        .iter()
        .find(|(e, _)| *e == reg)
        .map_or(SysRegPolicy::Unknown, |(_, name)| {
            SysRegPolicy::ReadAsZeroWriteIgnored(name)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_trap_names_its_exit_class() {
        use crate::vm::exit_profile::ExitClass;
        let cases = [
            (SysRegTrap::SetWay, ExitClass::SysregSetWay),
            (SysRegTrap::VmRegWrite(VmReg::Sctlr), ExitClass::SysregVmReg),
            (SysRegTrap::Sgi(SgiGroup::Group1), ExitClass::SysregSgi),
            (SysRegTrap::IdRegister, ExitClass::SysregId),
            (
                SysRegTrap::PhysicalTimer(PhysicalTimerReg::Ctl),
                ExitClass::SysregTimer,
            ),
            (
                SysRegTrap::CpuInterface(CommonRegister::Pmr),
                ExitClass::SysregOther,
            ),
            (
                SysRegTrap::Other(SysRegPolicy::Unknown),
                ExitClass::SysregOther,
            ),
        ];
        for (trap, class) in cases {
            assert_eq!(trap.exit_class(), class, "{trap:?}");
        }
    }

    #[test]
    fn known_and_unknown() {
        assert_eq!(
            policy(enc(2, 0, 1, 0, 4)),
            SysRegPolicy::ReadAsZeroWriteIgnored("OSLAR_EL1")
        );
        assert_eq!(policy(enc(3, 0, 12, 11, 5)), SysRegPolicy::Unknown);
    }

    fn access(reg: SysRegEncoding, read: bool) -> SysRegAccess {
        SysRegAccess { reg, rt: 0, read }
    }

    #[test]
    fn classify_in_order() {
        // DC CISW: op0 1, op1 0, CRn 7, CRm 14, op2 2.
        assert_eq!(
            classify(&access(enc(1, 0, 7, 14, 2), false)),
            SysRegTrap::SetWay
        );
        let sctlr = enc(3, 0, 1, 0, 0);
        assert_eq!(
            classify(&access(sctlr, false)),
            SysRegTrap::VmRegWrite(VmReg::Sctlr)
        );
        // A read of a trapped VM register is not the write the trap is for.
        assert_eq!(
            classify(&access(sctlr, true)),
            SysRegTrap::Other(SysRegPolicy::Unknown)
        );
        assert_eq!(
            classify(&access(enc(3, 0, 12, 11, 5), false)),
            SysRegTrap::Sgi(SgiGroup::Group1)
        );
        for read in [false, true] {
            assert_eq!(
                classify(&access(enc(3, 3, 14, 2, 1), read)),
                SysRegTrap::PhysicalTimer(PhysicalTimerReg::Ctl)
            );
        }
        assert_eq!(
            classify(&access(ID_AA64PFR1_EL1, true)),
            SysRegTrap::IdRegister
        );
        assert_eq!(
            classify(&access(enc(2, 0, 1, 0, 4), false)),
            SysRegTrap::Other(SysRegPolicy::ReadAsZeroWriteIgnored("OSLAR_EL1"))
        );
    }

    #[test]
    fn id_registers() {
        assert!(is_id_register(ID_AA64PFR1_EL1));
        assert!(is_id_register(enc(3, 0, 0, 1, 0)), "ID_PFR0_EL1");
        assert!(
            is_id_register(enc(3, 0, 0, 7, 7)),
            "reserved, still ID space"
        );
        assert!(
            !is_id_register(enc(3, 0, 0, 0, 5)),
            "MPIDR_EL1 is not trapped"
        );
        assert!(!is_id_register(enc(3, 0, 0, 8, 0)));
        assert!(!is_id_register(enc(3, 1, 0, 1, 0)));
        // MTE2 and MTE_frac removed, SSBS/BT/SME kept.
        let pfr1 = 0x0000_0f00_0121_0211_u64 | (2 << 8);
        let guest = guest_id_value(ID_AA64PFR1_EL1, pfr1, false);
        assert_eq!((guest >> 8) & 0xf, 0);
        assert_eq!((guest >> 40) & 0xf, 0);
        assert_eq!(guest & !PFR1_MTE_FIELDS, pfr1 & !PFR1_MTE_FIELDS);
        // A VM with `mte=on` sees the host's fields.
        assert_eq!(guest_id_value(ID_AA64PFR1_EL1, pfr1, true), pfr1);
        // Other registers pass through.
        let mmfr0 = enc(3, 0, 0, 7, 0);
        assert_eq!(guest_id_value(mmfr0, 0x1234_5678, false), 0x1234_5678);
        assert_eq!(guest_id_value(mmfr0, 0x1234_5678, true), 0x1234_5678);
    }
}
