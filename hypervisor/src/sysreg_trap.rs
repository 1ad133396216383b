//! What the hypervisor does with a trapped `MSR`/`MRS`.
//!
//! The hypervisor traps no system register on purpose today, but the
//! architecture traps a few to EL2 regardless of configuration on some CPUs
//! (for example the OS lock and debug registers when debug is not owned by the
//! guest). [`policy`] names each trapped register the hypervisor knows and says
//! how to emulate it; a register it does not know reads as zero and ignores
//! writes, which the run loop logs once per register so it never goes unnoticed.
//! The virtual GIC's trapped SGI registers (`ICC_SGI1R_EL1` and the group 0
//! ones) never get here: the run loop recognises them first
//! (`vgic::SgiGroup::from_sysreg`).

use crate::esr::SysRegEncoding;

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
    fn known_and_unknown() {
        assert_eq!(
            policy(enc(2, 0, 1, 0, 4)),
            SysRegPolicy::ReadAsZeroWriteIgnored("OSLAR_EL1")
        );
        assert_eq!(policy(enc(3, 0, 12, 11, 5)), SysRegPolicy::Unknown);
    }
}
