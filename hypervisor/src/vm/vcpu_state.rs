//! Everything a vCPU needs to continue on another VM's vCPU: the state a
//! live migration carries (`arch::migrate`).
//!
//! The general registers, PC and PSTATE travel through the hypervisor's
//! register frame; the guest's EL1 system registers, FP/SIMD registers,
//! timers and virtual CPU interface stay live in the physical CPU (vCPUs
//! are pinned), so the source vCPU reads them on its own CPU when the
//! migration asks (parked, out of the guest, its list registers unloaded
//! into the vgic model) and the destination vCPU writes them on its own CPU
//! when it starts. [`EL1_SYSREGS`] names the system registers in the order
//! [`VcpuState::sysregs`] holds them.
//!
//! On a CPU with SVE the scalable vector state travels too ([`SveState`]:
//! `z0..z31` at the CPU's longest vector length, which the hypervisor's
//! `ZCR_EL2` gives the guest, `p0..p15`, `FFR` and `ZCR_EL1`); the FP/SIMD
//! `q` registers are the low 128 bits of the `z` registers, so the restore
//! loads them first and the `z` registers over them. On a CPU with SME the
//! non-streaming state travels ([`SmeState`]: `SVCR`, `SMCR_EL1`,
//! `TPIDR2_EL0`); a vCPU caught in streaming mode or with its ZA array live
//! (`SVCR.SM`/`ZA`) is refused: the ZA array and the streaming vector state
//! are not carried.
//!
//! What is not carried is refused rather than lost: that SME state, or a
//! host whose virtual CPU interface is a GICv2 frame, makes the migration
//! fail before the source stops ([`MigrationBlocker`]).

use alloc::vec::Vec;
use core::fmt;

/// The EL1 (and EL0) system registers a migration carries, in
/// [`VcpuState::sysregs`] order.
pub const EL1_SYSREGS: [&str; 23] = [
    "sctlr_el1",
    "ttbr0_el1",
    "ttbr1_el1",
    "tcr_el1",
    "mair_el1",
    "amair_el1",
    "vbar_el1",
    "contextidr_el1",
    "tpidr_el1",
    "tpidr_el0",
    "tpidrro_el0",
    "esr_el1",
    "far_el1",
    "afsr0_el1",
    "afsr1_el1",
    "par_el1",
    "cpacr_el1",
    "cntkctl_el1",
    "mdscr_el1",
    "sp_el0",
    "sp_el1",
    "elr_el1",
    "spsr_el1",
];

/// Index of `CPACR_EL1` in [`EL1_SYSREGS`].
pub const CPACR_INDEX: usize = 16;

/// The guest's EL1 timers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerState {
    /// `CNTV_CTL_EL0`.
    pub vctl: u64,
    /// `CNTV_CVAL_EL0`.
    pub vcval: u64,
    /// `CNTP_CTL_EL0`.
    pub pctl: u64,
    /// `CNTP_CVAL_EL0`.
    pub pcval: u64,
}

/// The guest's view of its virtual CPU interface (GICv3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuInterfaceState {
    /// `ICH_VMCR_EL2`: priority mask, binary points, group enables.
    pub vmcr: u64,
    /// `ICH_AP0R<n>_EL2`, the first `apr_count`.
    pub ap0r: [u64; 4],
    /// `ICH_AP1R<n>_EL2`, the first `apr_count`.
    pub ap1r: [u64; 4],
    /// Active-priority registers per group (1, 2 or 4).
    pub apr_count: usize,
}

/// The scalable vector state, at the vector length `vl` (bytes) the CPU
/// gives EL2 and the guest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SveState {
    /// Vector length in bytes (`RDVL #1`).
    pub vl: usize,
    /// `z0..z31`, `vl` bytes each.
    pub z: Vec<u8>,
    /// `p0..p15`, `vl / 8` bytes each.
    pub p: Vec<u8>,
    /// `FFR`, `vl / 8` bytes.
    pub ffr: Vec<u8>,
    /// `ZCR_EL1`.
    pub zcr_el1: u64,
}

impl SveState {
    /// Zeroed buffers for vector length `vl` bytes.
    pub fn with_vl(vl: usize) -> Self {
        Self {
            vl,
            z: alloc::vec![0; 32 * vl],
            p: alloc::vec![0; 16 * (vl / 8)],
            ffr: alloc::vec![0; vl / 8],
            zcr_el1: 0,
        }
    }
}

/// The SME state outside streaming mode and ZA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmeState {
    /// `SVCR`: `SM` (bit 0) and `ZA` (bit 1).
    pub svcr: u64,
    /// `SMCR_EL1`.
    pub smcr_el1: u64,
    /// `TPIDR2_EL0`.
    pub tpidr2_el0: u64,
}

/// `SVCR.SM`: streaming SVE mode.
pub const SVCR_SM: u64 = 1 << 0;
/// `SVCR.ZA`: the ZA array is live.
pub const SVCR_ZA: u64 = 1 << 1;

/// One vCPU's state (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuState {
    /// `x0..x30`.
    pub x: [u64; 31],
    /// The PC.
    pub pc: u64,
    /// PSTATE (`SPSR_EL2` layout).
    pub pstate: u64,
    /// [`EL1_SYSREGS`], in order.
    pub sysregs: [u64; EL1_SYSREGS.len()],
    /// `q0..q31`.
    pub fp: [u128; 32],
    /// `FPCR`.
    pub fpcr: u64,
    /// `FPSR`.
    pub fpsr: u64,
    /// The EL1 timers.
    pub timers: TimerState,
    /// The virtual CPU interface.
    pub cpu_interface: CpuInterfaceState,
    /// The SVE state, on a CPU with SVE.
    pub sve: Option<SveState>,
    /// The SME state, on a CPU with SME.
    pub sme: Option<SmeState>,
}

impl Default for VcpuState {
    fn default() -> Self {
        Self {
            x: [0; 31],
            pc: 0,
            pstate: 0,
            sysregs: [0; EL1_SYSREGS.len()],
            fp: [0; 32],
            fpcr: 0,
            fpsr: 0,
            timers: TimerState::default(),
            cpu_interface: CpuInterfaceState::default(),
            sve: None,
            sme: None,
        }
    }
}

/// Why a VM cannot be migrated as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationBlocker {
    /// vCPU `.0` is in SME streaming mode or has its ZA array live, state
    /// that is not carried.
    StreamingState(usize),
    /// The host's virtual CPU interface is a GICv2 frame.
    Gicv2,
    /// vCPU `vcpu`'s SVE state was captured at a vector length (bytes) the
    /// destination's CPU does not have (`here`: `None` without SVE).
    VectorLength {
        /// The vCPU.
        vcpu: usize,
        /// The length captured.
        captured: usize,
        /// The destination CPU's length.
        here: Option<usize>,
    },
}

impl fmt::Display for MigrationBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamingState(vcpu) => write!(
                f,
                "vcpu{vcpu} is in SME streaming mode or has ZA live, which is not migrated"
            ),
            Self::Gicv2 => f.write_str("a GICv2 host's virtual CPU interface is not migrated"),
            Self::VectorLength {
                vcpu,
                captured,
                here,
            } => write!(
                f,
                "vcpu{vcpu}'s SVE state has {captured}-byte vectors, the destination {}",
                match here {
                    Some(vl) => alloc::format!("has {vl}-byte vectors"),
                    None => alloc::string::String::from("has no SVE"),
                }
            ),
        }
    }
}

impl core::error::Error for MigrationBlocker {}

impl VcpuState {
    /// Refuses a state whose vector registers would be lost: SME streaming
    /// mode or a live ZA array.
    /// `here` is the vector length (bytes) of the CPU that will restore it,
    /// `None` without SVE: SVE state must find the same length.
    pub fn check(&self, vcpu: usize, here: Option<usize>) -> Result<(), MigrationBlocker> {
        if let Some(sve) = &self.sve
            && here != Some(sve.vl)
        {
            return Err(MigrationBlocker::VectorLength {
                vcpu,
                captured: sve.vl,
                here,
            });
        }
        if self
            .sme
            .is_some_and(|sme| sme.svcr & (SVCR_SM | SVCR_ZA) != 0)
        {
            return Err(MigrationBlocker::StreamingState(vcpu));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpacr_is_where_check_looks() {
        assert_eq!(EL1_SYSREGS[CPACR_INDEX], "cpacr_el1");
    }

    #[test]
    fn only_streaming_state_blocks_migration() {
        let mut state = VcpuState::default();
        assert_eq!(state.check(0, None), Ok(()));
        // FP/SIMD, SVE and SME enabled at EL1: their state is carried.
        state.sysregs[CPACR_INDEX] = 3 << 20 | 3 << 16 | 3 << 24;
        state.sve = Some(SveState::with_vl(256));
        state.sme = Some(SmeState::default());
        assert_eq!(state.check(0, Some(256)), Ok(()));
        state.sme = Some(SmeState {
            svcr: SVCR_SM,
            ..SmeState::default()
        });
        assert_eq!(
            state.check(1, Some(256)),
            Err(MigrationBlocker::StreamingState(1))
        );
        state.sme = Some(SmeState {
            svcr: SVCR_ZA,
            ..SmeState::default()
        });
        assert_eq!(
            state.check(2, Some(256)),
            Err(MigrationBlocker::StreamingState(2))
        );
    }

    #[test]
    fn sve_state_needs_the_same_vector_length() {
        let state = VcpuState {
            sve: Some(SveState::with_vl(64)),
            ..VcpuState::default()
        };
        assert_eq!(state.check(0, Some(64)), Ok(()));
        for here in [None, Some(32), Some(256)] {
            assert_eq!(
                state.check(3, here),
                Err(MigrationBlocker::VectorLength {
                    vcpu: 3,
                    captured: 64,
                    here
                })
            );
        }
    }

    #[test]
    fn sve_buffers_follow_the_vector_length() {
        let sve = SveState::with_vl(32);
        assert_eq!((sve.z.len(), sve.p.len(), sve.ffr.len()), (1024, 64, 4));
    }
}
