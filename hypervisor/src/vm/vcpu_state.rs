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
//! What is not carried is refused rather than lost: a guest that enabled
//! SVE or SME (`CPACR_EL1.ZEN`/`SMEN`, whose vector state is not saved) or a
//! host whose virtual CPU interface is a GICv2 frame cannot be migrated
//! ([`MigrationBlocker`]).

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
        }
    }
}

/// Why a VM cannot be migrated as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationBlocker {
    /// vCPU `.0` enabled SVE or SME, whose vector state is not carried.
    VectorState(usize),
    /// The host's virtual CPU interface is a GICv2 frame.
    Gicv2,
}

impl fmt::Display for MigrationBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::VectorState(vcpu) => write!(
                f,
                "vcpu{vcpu} enabled SVE or SME, whose vector registers are not migrated"
            ),
            Self::Gicv2 => f.write_str("a GICv2 host's virtual CPU interface is not migrated"),
        }
    }
}

impl core::error::Error for MigrationBlocker {}

impl VcpuState {
    /// Refuses a state whose vector registers would be lost: `CPACR_EL1`
    /// `ZEN` (bits 17:16) or `SMEN` (bits 25:24) not trapping.
    pub fn check(&self, vcpu: usize) -> Result<(), MigrationBlocker> {
        let cpacr = self.sysregs[CPACR_INDEX];
        let zen = (cpacr >> 16) & 3;
        let smen = (cpacr >> 24) & 3;
        if zen != 0 || smen != 0 {
            return Err(MigrationBlocker::VectorState(vcpu));
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
    fn vector_state_blocks_migration() {
        let mut state = VcpuState::default();
        assert_eq!(state.check(0), Ok(()));
        // FPEN on (bits 21:20): FP/SIMD state is carried.
        state.sysregs[CPACR_INDEX] = 3 << 20;
        assert_eq!(state.check(0), Ok(()));
        state.sysregs[CPACR_INDEX] |= 1 << 16;
        assert_eq!(state.check(1), Err(MigrationBlocker::VectorState(1)));
        state.sysregs[CPACR_INDEX] = 1 << 24;
        assert_eq!(state.check(2), Err(MigrationBlocker::VectorState(2)));
    }
}
