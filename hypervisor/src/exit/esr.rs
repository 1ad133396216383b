//! Decoding of `ESR_EL2`, the syndrome of an exception taken to EL2.
//!
//! The exception class (EC, bits 31:26) says why the guest exited; the
//! instruction-specific syndrome (ISS, bits 24:0) carries the details. For data
//! and instruction aborts this module decodes the fault status code into a kind
//! and a level, and for data aborts the access description (size, register,
//! direction, sign extension) that MMIO emulation needs when `ISV` is set. For
//! trapped `MSR`/`MRS` it decodes the system-register encoding.

use crate::vocabulary::sysreg_encoding::SysRegEncoding;

/// The exception classes the hypervisor handles, plus `Other` for the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionClass {
    /// 0x00: unknown reason (for example an undefined instruction).
    Unknown,
    /// 0x01: trapped WFI or WFE.
    WfiWfe,
    /// 0x16: HVC from AArch64.
    Hvc64,
    /// 0x17: SMC from AArch64.
    Smc64,
    /// 0x18: trapped MSR, MRS or system instruction from AArch64.
    SysReg64,
    /// 0x20: instruction abort from a lower exception level.
    InstructionAbortLower,
    /// 0x21: instruction abort taken without a change of exception level.
    InstructionAbortSame,
    /// 0x24: data abort from a lower exception level.
    DataAbortLower,
    /// 0x25: data abort taken without a change of exception level.
    DataAbortSame,
    /// 0x2F: SError interrupt.
    SError,
    /// Any other class, with its raw value.
    Other(u8),
}

impl ExceptionClass {
    /// The class of a raw `ESR_ELx` value.
    pub fn from_esr(esr: u64) -> Self {
        match ((esr >> 26) & 0x3f) as u8 {
            0x00 => Self::Unknown,
            0x01 => Self::WfiWfe,
            0x16 => Self::Hvc64,
            0x17 => Self::Smc64,
            0x18 => Self::SysReg64,
            0x20 => Self::InstructionAbortLower,
            0x21 => Self::InstructionAbortSame,
            0x24 => Self::DataAbortLower,
            0x25 => Self::DataAbortSame,
            0x2f => Self::SError,
            other => Self::Other(other),
        }
    }

    /// Whether the class reports an instruction the guest executed that
    /// trapped to EL2 and that the hypervisor does not emulate, so that the
    /// guest gets an undefined instruction for it (as KVM answers exception
    /// classes it does not handle): unknown reason (0x00), the AArch32
    /// coprocessor and system-register traps (0x03..=0x06, 0x0C), FP/SIMD
    /// (0x07), `VMRS` of an ID register (0x08), the `HCRX_EL2` instruction
    /// traps (0x0A), SVE (0x19) and SME (0x1D).
    pub fn is_unemulated_instruction(self) -> bool {
        matches!(
            self,
            Self::Unknown | Self::Other(0x03..=0x08 | 0x0a | 0x0c | 0x19 | 0x1d)
        )
    }

    /// The raw 6-bit class value.
    pub fn code(self) -> u8 {
        match self {
            Self::Unknown => 0x00,
            Self::WfiWfe => 0x01,
            Self::Hvc64 => 0x16,
            Self::Smc64 => 0x17,
            Self::SysReg64 => 0x18,
            Self::InstructionAbortLower => 0x20,
            Self::InstructionAbortSame => 0x21,
            Self::DataAbortLower => 0x24,
            Self::DataAbortSame => 0x25,
            Self::SError => 0x2f,
            Self::Other(code) => code,
        }
    }
}

/// Bit 25 of `ESR_ELx`: the trapped instruction was 32 bits long.
pub const ESR_IL: u64 = 1 << 25;

/// Bytes to step over a trapped instruction: 4, or 2 for a 16-bit T32
/// instruction (`ESR_ELx.IL` clear) from a guest's AArch32 code.
pub fn trapped_instruction_len(esr: u64) -> u64 {
    if esr & ESR_IL != 0 { 4 } else { 2 }
}

/// The instruction-specific syndrome of a raw `ESR_ELx`.
pub fn iss(esr: u64) -> u32 {
    (esr & 0x1ff_ffff) as u32
}

/// What an abort's fault status code (`DFSC`/`IFSC`, bits 5:0) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// No valid translation at the given level.
    Translation,
    /// The access flag was clear.
    AccessFlag,
    /// The permissions do not allow the access.
    Permission,
    /// An address-size fault.
    AddressSize,
    /// A synchronous external abort, an alignment fault, a TLB conflict or any
    /// other code, with its raw value.
    Other(u8),
}

/// A decoded fault status code: the kind and, where the code has one, the
/// translation level the fault happened at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultStatus {
    /// What went wrong.
    pub kind: FaultKind,
    /// The level (0..=3) for translation, access-flag, permission and
    /// address-size faults.
    pub level: Option<u8>,
}

impl FaultStatus {
    /// Decodes the 6-bit `DFSC`/`IFSC` field.
    pub fn from_code(code: u8) -> Self {
        let level = Some(code & 3);
        match code & 0x3c {
            0x00 => Self {
                kind: FaultKind::AddressSize,
                level,
            },
            0x04 => Self {
                kind: FaultKind::Translation,
                level,
            },
            0x08 => Self {
                kind: FaultKind::AccessFlag,
                level,
            },
            0x0c => Self {
                kind: FaultKind::Permission,
                level,
            },
            _ => Self {
                kind: FaultKind::Other(code & 0x3f),
                level: None,
            },
        }
    }
}

/// The syndrome of a data abort (EC 0x24/0x25).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataAbort {
    /// The fault status.
    pub status: FaultStatus,
    /// The access was a write (`WnR`).
    pub write: bool,
    /// The fault happened on a stage-2 walk for a stage-1 table access (`S1PTW`).
    pub stage1_walk: bool,
    /// The access description, present when `ISV` is set.
    pub access: Option<DataAccess>,
}

/// The access description of a data abort with a valid syndrome (`ISV` = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataAccess {
    /// Access size in bytes: 1, 2, 4 or 8 (`SAS`).
    pub size: u8,
    /// A load sign-extends the value (`SSE`).
    pub sign_extend: bool,
    /// The general-purpose register transferred (`SRT`); 31 is the zero register.
    pub register: u8,
    /// The register is 64 bits wide (`SF`); otherwise a load writes a 32-bit value.
    pub sixty_four: bool,
}

impl DataAbort {
    /// Decodes the ISS of a data abort.
    pub fn from_iss(iss: u32) -> Self {
        let valid = iss & (1 << 24) != 0;
        let access = valid.then(|| DataAccess {
            size: 1 << ((iss >> 22) & 3),
            sign_extend: iss & (1 << 21) != 0,
            register: ((iss >> 16) & 0x1f) as u8,
            sixty_four: iss & (1 << 15) != 0,
        });
        Self {
            status: FaultStatus::from_code((iss & 0x3f) as u8),
            write: iss & (1 << 6) != 0,
            stage1_walk: iss & (1 << 7) != 0,
            access,
        }
    }
}

/// The syndrome of an instruction abort (EC 0x20/0x21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstructionAbort {
    /// The fault status.
    pub status: FaultStatus,
    /// The fault happened on a stage-2 walk for a stage-1 table access.
    pub stage1_walk: bool,
}

impl InstructionAbort {
    /// Decodes the ISS of an instruction abort.
    pub fn from_iss(iss: u32) -> Self {
        Self {
            status: FaultStatus::from_code((iss & 0x3f) as u8),
            stage1_walk: iss & (1 << 7) != 0,
        }
    }
}

/// A trapped `MSR`/`MRS` (EC 0x18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysRegAccess {
    /// The register encoding.
    pub reg: SysRegEncoding,
    /// The general-purpose register transferred (`Rt`); 31 is the zero register.
    pub rt: u8,
    /// `MRS` (read into `Rt`) when true, `MSR` (write from `Rt`) when false.
    pub read: bool,
}

impl SysRegAccess {
    /// Decodes the ISS of a trapped `MSR`/`MRS`.
    pub fn from_iss(iss: u32) -> Self {
        Self {
            reg: SysRegEncoding {
                op0: ((iss >> 20) & 3) as u8,
                op2: ((iss >> 17) & 7) as u8,
                op1: ((iss >> 14) & 7) as u8,
                crn: ((iss >> 10) & 0xf) as u8,
                crm: ((iss >> 1) & 0xf) as u8,
            },
            rt: ((iss >> 5) & 0x1f) as u8,
            read: iss & 1 != 0,
        }
    }
}

/// A trapped WFI or WFE (EC 0x01).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// WFI.
    Wfi,
    /// WFE.
    Wfe,
    /// WFIT or WFET (FEAT_WFxT).
    WithTimeout,
}

impl WaitKind {
    /// Decodes the ISS of a trapped WFx.
    pub fn from_iss(iss: u32) -> Self {
        match iss & 3 {
            0 => Self::Wfi,
            1 => Self::Wfe,
            _ => Self::WithTimeout,
        }
    }
}

/// Bits [11:0] of a faulting address that `HPFAR_EL2` does not hold.
const PAGE_OFFSET_MASK: u64 = 0xfff;

/// The faulting IPA of a stage-2 abort: `HPFAR_EL2.FIPA` (bits 43:4) gives bits
/// 51:12, `FAR_EL2` the page offset.
pub fn fault_ipa(hpfar: u64, far: u64) -> u64 {
    ((hpfar & 0x0000_0fff_ffff_fff0) << 8) | (far & PAGE_OFFSET_MASK)
}

#[cfg(test)]
mod tests {

    #[test]
    fn trapped_instruction_length_follows_il() {
        assert_eq!(trapped_instruction_len(0x24 << 26 | ESR_IL), 4);
        assert_eq!(trapped_instruction_len(0x24 << 26), 2);
    }

    use super::*;

    #[test]
    fn classes_round_trip() {
        for code in 0u8..64 {
            let esr = (code as u64) << 26 | ESR_IL | 0x1234;
            assert_eq!(ExceptionClass::from_esr(esr).code(), code);
        }
        assert_eq!(
            ExceptionClass::from_esr(0x24 << 26),
            ExceptionClass::DataAbortLower
        );
        assert_eq!(ExceptionClass::from_esr(0x16 << 26), ExceptionClass::Hvc64);
    }

    #[test]
    fn unemulated_instruction_classes() {
        let undefined: Vec<u8> = (0u8..64)
            .filter(|&code| {
                ExceptionClass::from_esr(u64::from(code) << 26).is_unemulated_instruction()
            })
            .collect();
        assert_eq!(
            undefined,
            [
                0x00, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0a, 0x0c, 0x19, 0x1d
            ]
        );
    }

    #[test]
    fn data_abort_with_valid_syndrome() {
        // str w3, [x1] hitting a translation fault at level 2:
        // ISV, SAS = 2 (word), SRT = 3, WnR, DFSC = 0b000110.
        let iss = (1 << 24) | (2 << 22) | (3 << 16) | (1 << 6) | 0b000110;
        let abort = DataAbort::from_iss(iss);
        assert!(abort.write);
        assert!(!abort.stage1_walk);
        assert_eq!(
            abort.status,
            FaultStatus {
                kind: FaultKind::Translation,
                level: Some(2)
            }
        );
        assert_eq!(
            abort.access,
            Some(DataAccess {
                size: 4,
                sign_extend: false,
                register: 3,
                sixty_four: false
            })
        );
    }

    #[test]
    fn data_abort_without_syndrome_and_sign_extension() {
        let abort = DataAbort::from_iss(0b001111 | (1 << 7));
        assert_eq!(abort.access, None);
        assert!(abort.stage1_walk);
        assert!(!abort.write);
        assert_eq!(
            abort.status,
            FaultStatus {
                kind: FaultKind::Permission,
                level: Some(3)
            }
        );

        let ldrsh = (1 << 24) | (1 << 22) | (1 << 21) | (30 << 16) | (1 << 15) | 0b000101;
        let access = DataAbort::from_iss(ldrsh).access.expect("ISV set");
        assert_eq!(access.size, 2);
        assert!(access.sign_extend && access.sixty_four);
        assert_eq!(access.register, 30);
    }

    #[test]
    fn fault_codes() {
        assert_eq!(FaultStatus::from_code(0b001001).kind, FaultKind::AccessFlag);
        assert_eq!(
            FaultStatus::from_code(0b000011).kind,
            FaultKind::AddressSize
        );
        assert_eq!(
            FaultStatus::from_code(0b010000),
            FaultStatus {
                kind: FaultKind::Other(0x10),
                level: None
            }
        );
    }

    #[test]
    fn sysreg_encoding() {
        // MRS x5, CNTPCT_EL0 (op0 3, op1 3, CRn 14, CRm 0, op2 1).
        let iss = (3 << 20) | (1 << 17) | (3 << 14) | (14 << 10) | (5 << 5) | 1;
        let access = SysRegAccess::from_iss(iss);
        assert_eq!(
            access.reg,
            SysRegEncoding {
                op0: 3,
                op1: 3,
                crn: 14,
                crm: 0,
                op2: 1
            }
        );
        assert_eq!(access.rt, 5);
        assert!(access.read);
        assert_eq!(access.reg.to_string(), "S3_3_C14_C0_1");
    }

    #[test]
    fn ipa_from_hpfar_and_far() {
        let ipa = 0x0000_1234_5678_9abc_u64;
        let hpfar = (ipa >> 12) << 4;
        assert_eq!(fault_ipa(hpfar, 0xffff_0000_0000_0abc), ipa);
        assert_eq!(WaitKind::from_iss(0), WaitKind::Wfi);
        assert_eq!(WaitKind::from_iss(1), WaitKind::Wfe);
    }
}
