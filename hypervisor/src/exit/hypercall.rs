//! The guest's calls into the hypervisor over `HVC` (SMCCC conventions).
//!
//! The function id is in `w0`, arguments in `x1..x3`, results go back in
//! `x0..x3`. [`GuestCall::decode`] sorts a call into PSCI, the SMCCC version
//! query, the vendor-specific hypervisor services this hypervisor offers
//! (`TEST_REPORT`), or unknown (answered with `NOT_SUPPORTED`).

use crate::exit::psci::PsciCall;

/// SMCCC_VERSION.
pub const SMCCC_VERSION: u32 = 0x8000_0000;
/// The SMCCC version offered: 1.1.
pub const SMCCC_VERSION_1_1: u64 = 0x0001_0001;
/// Vendor hypervisor service TEST_REPORT: `x1` = 0 pass, nonzero failure code.
pub const HV_TEST_REPORT: u32 = 0xC600_0001;
/// SMCCC `NOT_SUPPORTED`, as written to `x0`.
pub const NOT_SUPPORTED: u64 = u64::MAX;

/// A decoded guest call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestCall {
    /// A PSCI function.
    Psci(PsciCall),
    /// SMCCC_VERSION.
    SmcccVersion,
    /// TEST_REPORT with the guest's result code (0 = pass).
    TestReport {
        /// 0 for pass, anything else is the guest's failure code.
        code: u64,
    },
    /// Anything else: the raw 64-bit `x0`.
    Unknown(u64),
}

impl GuestCall {
    /// Decodes the registers `x0..x3` of an `HVC #0`.
    pub fn decode(regs: [u64; 4]) -> Self {
        let [x0, x1, x2, x3] = regs;
        // SMCCC: bits [63:32] of the function id must be zero.
        if x0 >> 32 != 0 {
            return Self::Unknown(x0);
        }
        let function_id = x0 as u32;
        if let Some(call) = PsciCall::decode(function_id, [x1, x2, x3]) {
            return Self::Psci(call);
        }
        match function_id {
            SMCCC_VERSION => Self::SmcccVersion,
            HV_TEST_REPORT => Self::TestReport { code: x1 },
            _ => Self::Unknown(x0),
        }
    }

    /// True when PSCI_FEATURES should report `function_id` as implemented.
    pub fn is_implemented(function_id: u32) -> bool {
        PsciCall::IMPLEMENTED.contains(&function_id)
            || function_id == SMCCC_VERSION
            || function_id == HV_TEST_REPORT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode() {
        assert_eq!(
            GuestCall::decode([0x8000_0000, 0, 0, 0]),
            GuestCall::SmcccVersion
        );
        assert_eq!(
            GuestCall::decode([0xC600_0001, 3, 0, 0]),
            GuestCall::TestReport { code: 3 }
        );
        assert_eq!(
            GuestCall::decode([0xC600_00FF, 0, 0, 0]),
            GuestCall::Unknown(0xC600_00FF)
        );
        assert_eq!(
            GuestCall::decode([0x1_8400_0000, 0, 0, 0]),
            GuestCall::Unknown(0x1_8400_0000),
            "upper bits set is not PSCI_VERSION"
        );
        assert_eq!(
            GuestCall::decode([0x8400_0008, 0, 0, 0]),
            GuestCall::Psci(PsciCall::SystemOff)
        );
    }

    #[test]
    fn features() {
        assert!(GuestCall::is_implemented(0xC400_0003));
        assert!(GuestCall::is_implemented(SMCCC_VERSION));
        assert!(!GuestCall::is_implemented(0x8400_0001));
        assert_eq!(NOT_SUPPORTED as i64, -1);
    }
}
