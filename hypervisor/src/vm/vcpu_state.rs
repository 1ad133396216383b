//! Everything a vCPU needs to continue on another VM's vCPU: the state a
//! live migration carries (`runtime::live_migration`).
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
//! loads them first and the `z` registers over them.
//!
//! # SME
//!
//! On a CPU with SME, [`SmeState`] carries `SVCR`, `SMCR_EL1`, `TPIDR2_EL0`
//! and, while `SVCR.ZA` is set, the ZA array: `SVL` rows of `SVL` bytes at
//! the CPU's longest streaming vector length `SVL` (which `SMCR_EL2` gives the
//! guest; a guest that asks for less sees the low bytes of the low rows).
//! There is one set of `z`/`p` registers: in streaming mode (`SVCR.SM`) they
//! are the streaming ones, `SVL` bytes long, and [`SveState`] holds them at
//! that length, without `FFR`, which streaming mode has only with FEAT_SME_FA64
//! (the hypervisor leaves `SMCR_EL2.FA64` clear, so a guest never has it).
//! `ZT0` (SME2) needs `SMCR_EL2.EZT0`, also left clear: a guest has none.
//!
//! # Memory tagging
//!
//! A VM with `mte=on` carries [`TagState`]: `GCR_EL1`, `RGSR_EL1`,
//! `TFSR_EL1` and `TFSRE0_EL1` (PSTATE.TCO travels in PSTATE and
//! `SCTLR_EL1`'s tag fields with the other system registers). The pages'
//! allocation tags travel with the pages (`runtime::live_migration`).
//!
//! What is not carried is refused rather than lost: vector state at a length
//! the destination CPU lacks, or a host whose virtual CPU interface is a
//! GICv2 frame, makes the migration fail before the source stops
//! ([`MigrationBlocker`]).

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
    /// The guest's `ICC_CTLR_EL1.CBPR` where the hypervisor guards the
    /// binary point (`crate::devices::vgic::cpu_interface`: `vmcr` then
    /// has `VCBPR` set whatever the guest wrote).
    pub guest_cbpr: bool,
}

/// The scalable vector state, at the vector length `vl` (bytes) the CPU
/// gives EL2 and the guest: the SVE length, or in streaming mode the
/// streaming one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SveState {
    /// Vector length in bytes (`RDVL #1`).
    pub vl: usize,
    /// `z0..z31`, `vl` bytes each.
    pub z: Vec<u8>,
    /// `p0..p15`, `vl / 8` bytes each.
    pub p: Vec<u8>,
    /// `FFR`, `vl / 8` bytes; empty in streaming mode, which has none.
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

    /// Zeroed buffers for the streaming registers at `svl` bytes: no `FFR`.
    pub fn streaming(svl: usize) -> Self {
        Self {
            ffr: Vec::new(),
            ..Self::with_vl(svl)
        }
    }

    /// The low 128 bits of `z<n>`: FP/SIMD register `q<n>`.
    pub fn q(&self, n: usize) -> u128 {
        let start = n * self.vl;
        let mut bytes = [0; 16];
        bytes.copy_from_slice(&self.z[start..start + 16]);
        u128::from_le_bytes(bytes)
    }
}

/// The SME state (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmeState {
    /// `SVCR`: `SM` (bit 0) and `ZA` (bit 1).
    pub svcr: u64,
    /// `SMCR_EL1`.
    pub smcr_el1: u64,
    /// `TPIDR2_EL0`.
    pub tpidr2_el0: u64,
    /// The streaming vector length in bytes (`RDSVL #1`) at capture.
    pub svl: usize,
    /// The ZA array, `svl` rows of `svl` bytes, while `SVCR.ZA` is set;
    /// empty otherwise.
    pub za: Vec<u8>,
}

impl SmeState {
    /// In streaming mode.
    pub fn streaming(&self) -> bool {
        self.svcr & SVCR_SM != 0
    }

    /// With the ZA array live.
    pub fn za_live(&self) -> bool {
        self.svcr & SVCR_ZA != 0
    }
}

/// A CPU's vector lengths in bytes, as the hypervisor's `ZCR_EL2` and
/// `SMCR_EL2` give them to a guest: `None` without SVE or SME.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VectorLengths {
    /// The SVE vector length.
    pub sve: Option<usize>,
    /// The SME streaming vector length.
    pub sme: Option<usize>,
}

/// A VM with memory tagging: the tag registers of one vCPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagState {
    /// `GCR_EL1`: the tags `IRG` may generate.
    pub gcr_el1: u64,
    /// `RGSR_EL1`: the random tag seed.
    pub rgsr_el1: u64,
    /// `TFSR_EL1`: asynchronous tag check faults at EL1.
    pub tfsr_el1: u64,
    /// `TFSRE0_EL1`: asynchronous tag check faults at EL0.
    pub tfsre0_el1: u64,
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
    /// The SVE state, on a CPU with SVE; in streaming mode, the streaming
    /// registers.
    pub sve: Option<SveState>,
    /// The SME state, on a CPU with SME.
    pub sme: Option<SmeState>,
    /// The tag registers, for a VM with memory tagging.
    pub tags: Option<TagState>,
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
            tags: None,
        }
    }
}

/// Why a VM cannot be migrated as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationBlocker {
    /// The host's virtual CPU interface is a GICv2 frame.
    Gicv2,
    /// The VM owns host devices (passthrough): their state is in the
    /// hardware, and they cannot follow the VM to other addresses.
    Passthrough,
    /// vCPU `vcpu`'s vector state was captured at a vector length (bytes) the
    /// destination's CPU does not have (`here`: `None` without SVE, or
    /// without SME for streaming state).
    VectorLength {
        /// The vCPU.
        vcpu: usize,
        /// Streaming-mode registers or the ZA array (the SME streaming
        /// length), or SVE registers (the SVE length).
        streaming: bool,
        /// The length captured.
        captured: usize,
        /// The destination CPU's length.
        here: Option<usize>,
    },
}

impl fmt::Display for MigrationBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gicv2 => f.write_str("a GICv2 host's virtual CPU interface is not migrated"),
            Self::Passthrough => {
                f.write_str("a VM that owns host devices (device= in its vm.conf) is not migrated")
            }
            Self::VectorLength {
                vcpu,
                streaming,
                captured,
                here,
            } => {
                let (what, extension) = if *streaming {
                    ("SME streaming", "SME")
                } else {
                    ("SVE", "SVE")
                };
                write!(
                    f,
                    "vcpu{vcpu}'s {what} state has {captured}-byte vectors, the destination {}",
                    match here {
                        Some(vl) => alloc::format!("has {vl}-byte vectors"),
                        None => alloc::format!("has no {extension}"),
                    }
                )
            }
        }
    }
}

impl core::error::Error for MigrationBlocker {}

impl VcpuState {
    /// Refuses a state whose vector registers would be lost on a CPU with
    /// vector lengths `here`: the `z`/`p` registers need the length they were
    /// captured at (the streaming one in streaming mode), a live ZA array the
    /// streaming length it was captured at.
    pub fn check(&self, vcpu: usize, here: VectorLengths) -> Result<(), MigrationBlocker> {
        let streaming = self.sme.as_ref().is_some_and(SmeState::streaming);
        if let Some(sve) = &self.sve {
            let wanted = if streaming { here.sme } else { here.sve };
            if wanted != Some(sve.vl) {
                return Err(MigrationBlocker::VectorLength {
                    vcpu,
                    streaming,
                    captured: sve.vl,
                    here: wanted,
                });
            }
        }
        if let Some(sme) = &self.sme
            && sme.za_live()
            && here.sme != Some(sme.svl)
        {
            return Err(MigrationBlocker::VectorLength {
                vcpu,
                streaming: true,
                captured: sme.svl,
                here: here.sme,
            });
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

    const MAX: VectorLengths = VectorLengths {
        sve: Some(256),
        sme: Some(64),
    };

    #[test]
    fn streaming_state_and_za_are_carried_at_the_streaming_length() {
        let mut state = VcpuState::default();
        assert_eq!(state.check(0, VectorLengths::default()), Ok(()));
        state.sve = Some(SveState::with_vl(256));
        state.sme = Some(SmeState {
            svl: 64,
            ..SmeState::default()
        });
        assert_eq!(state.check(0, MAX), Ok(()));
        // Streaming: the registers are 64 bytes long, the SVE length no
        // longer matters.
        state.sve = Some(SveState::streaming(64));
        state.sme = Some(SmeState {
            svcr: SVCR_SM | SVCR_ZA,
            svl: 64,
            za: alloc::vec![0; 64 * 64],
            ..SmeState::default()
        });
        assert_eq!(state.check(1, MAX), Ok(()));
        assert_eq!(state.check(1, VectorLengths { sve: None, ..MAX }), Ok(()));
        assert_eq!(
            state.check(
                1,
                VectorLengths {
                    sme: Some(32),
                    ..MAX
                }
            ),
            Err(MigrationBlocker::VectorLength {
                vcpu: 1,
                streaming: true,
                captured: 64,
                here: Some(32)
            })
        );
        // ZA live outside streaming mode: SVE registers at the SVE length,
        // ZA at the streaming one.
        state.sve = Some(SveState::with_vl(256));
        state.sme.as_mut().unwrap().svcr = SVCR_ZA;
        assert_eq!(state.check(2, MAX), Ok(()));
        assert_eq!(
            state.check(2, VectorLengths { sme: None, ..MAX }),
            Err(MigrationBlocker::VectorLength {
                vcpu: 2,
                streaming: true,
                captured: 64,
                here: None
            })
        );
    }

    #[test]
    fn sve_state_needs_the_same_vector_length() {
        let state = VcpuState {
            sve: Some(SveState::with_vl(64)),
            ..VcpuState::default()
        };
        assert_eq!(
            state.check(
                0,
                VectorLengths {
                    sve: Some(64),
                    sme: None
                }
            ),
            Ok(())
        );
        for here in [None, Some(32), Some(256)] {
            assert_eq!(
                state.check(
                    3,
                    VectorLengths {
                        sve: here,
                        sme: Some(64)
                    }
                ),
                Err(MigrationBlocker::VectorLength {
                    vcpu: 3,
                    streaming: false,
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
        let streaming = SveState::streaming(32);
        assert_eq!(
            (streaming.z.len(), streaming.p.len(), streaming.ffr.len()),
            (1024, 64, 0)
        );
    }

    #[test]
    fn q_registers_are_the_low_bytes_of_z() {
        let mut sve = SveState::with_vl(32);
        sve.z[32..48].copy_from_slice(&7u128.to_le_bytes());
        assert_eq!((sve.q(0), sve.q(1)), (0, 7));
    }
}
