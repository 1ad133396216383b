//! Capturing and restoring a vCPU's whole state for a live migration
//! (`crate::vm::vcpu_state` says what and why; `arch::migrate` drives it).
//! Both run on the vCPU's own CPU, where the state is live: the capture
//! while the vCPU is parked for a pause (its list registers first unloaded
//! into the vgic model, which travels separately), the restore right after
//! [`Vcpu::load`](super::Vcpu) reset the CPU for a start.

use super::Vcpu;
use crate::arch::drivers::gic::HostListRegisters;
use crate::exit::flow::{ListRegisterOp, StopReason};
use crate::vm::vcpu_state::{CpuInterfaceState, EL1_SYSREGS, TimerState, VcpuState};
use crate::{read_sysreg, write_sysreg};

/// The EL1 system registers, in [`EL1_SYSREGS`] order.
fn read_el1() -> [u64; EL1_SYSREGS.len()] {
    [
        read_sysreg!(sctlr_el1),
        read_sysreg!(ttbr0_el1),
        read_sysreg!(ttbr1_el1),
        read_sysreg!(tcr_el1),
        read_sysreg!(mair_el1),
        read_sysreg!(amair_el1),
        read_sysreg!(vbar_el1),
        read_sysreg!(contextidr_el1),
        read_sysreg!(tpidr_el1),
        read_sysreg!(tpidr_el0),
        read_sysreg!(tpidrro_el0),
        read_sysreg!(esr_el1),
        read_sysreg!(far_el1),
        read_sysreg!(afsr0_el1),
        read_sysreg!(afsr1_el1),
        read_sysreg!(par_el1),
        read_sysreg!(cpacr_el1),
        read_sysreg!(cntkctl_el1),
        read_sysreg!(mdscr_el1),
        read_sysreg!(sp_el0),
        read_sysreg!(sp_el1),
        read_sysreg!(elr_el1),
        read_sysreg!(spsr_el1),
    ]
}

/// Writes the EL1 system registers, in [`EL1_SYSREGS`] order.
///
/// # Safety
///
/// No guest runs on this CPU; the values are a guest's EL1 state.
unsafe fn write_el1(values: &[u64; EL1_SYSREGS.len()]) {
    // SAFETY: the caller's contract: these registers hold the guest's EL1
    // state only, and the guest is not running here.
    unsafe {
        write_sysreg!(sctlr_el1, values[0]);
        write_sysreg!(ttbr0_el1, values[1]);
        write_sysreg!(ttbr1_el1, values[2]);
        write_sysreg!(tcr_el1, values[3]);
        write_sysreg!(mair_el1, values[4]);
        write_sysreg!(amair_el1, values[5]);
        write_sysreg!(vbar_el1, values[6]);
        write_sysreg!(contextidr_el1, values[7]);
        write_sysreg!(tpidr_el1, values[8]);
        write_sysreg!(tpidr_el0, values[9]);
        write_sysreg!(tpidrro_el0, values[10]);
        write_sysreg!(esr_el1, values[11]);
        write_sysreg!(far_el1, values[12]);
        write_sysreg!(afsr0_el1, values[13]);
        write_sysreg!(afsr1_el1, values[14]);
        write_sysreg!(par_el1, values[15]);
        write_sysreg!(cpacr_el1, values[16]);
        write_sysreg!(cntkctl_el1, values[17]);
        write_sysreg!(mdscr_el1, values[18]);
        write_sysreg!(sp_el0, values[19]);
        write_sysreg!(sp_el1, values[20]);
        write_sysreg!(elr_el1, values[21]);
        write_sysreg!(spsr_el1, values[22]);
    }
}

/// `q0..q31`, `FPCR`, `FPSR`. FP/SIMD is not trapped at EL2 while a vCPU
/// is loaded (`CPTR_EL2` of the guest).
fn read_fp(fp: &mut [u128; 32]) -> (u64, u64) {
    let base = fp.as_mut_ptr();
    // SAFETY: stores 512 bytes into `fp` (32 registers of 16 bytes), which
    // it borrows mutably; FP/SIMD access is enabled at EL2 on this CPU.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            ".arch_extension simd",
            "stp q0, q1, [{base}, #0]",
            "stp q2, q3, [{base}, #32]",
            "stp q4, q5, [{base}, #64]",
            "stp q6, q7, [{base}, #96]",
            "stp q8, q9, [{base}, #128]",
            "stp q10, q11, [{base}, #160]",
            "stp q12, q13, [{base}, #192]",
            "stp q14, q15, [{base}, #224]",
            "stp q16, q17, [{base}, #256]",
            "stp q18, q19, [{base}, #288]",
            "stp q20, q21, [{base}, #320]",
            "stp q22, q23, [{base}, #352]",
            "stp q24, q25, [{base}, #384]",
            "stp q26, q27, [{base}, #416]",
            "stp q28, q29, [{base}, #448]",
            "stp q30, q31, [{base}, #480]",
            base = in(reg) base,
            options(nostack, preserves_flags)
        );
    }
    let (fpcr, fpsr): (u64, u64);
    // SAFETY: reading the FP control and status registers.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            "mrs {0}, fpcr",
            "mrs {1}, fpsr",
            out(reg) fpcr,
            out(reg) fpsr,
            options(nomem, nostack, preserves_flags)
        );
    }
    (fpcr, fpsr)
}

/// Loads `q0..q31`, `FPCR` and `FPSR`.
///
/// # Safety
///
/// No guest runs on this CPU; the hypervisor is soft-float, so nothing of
/// its own lives in these registers.
unsafe fn write_fp(fp: &[u128; 32], fpcr: u64, fpsr: u64) {
    let base = fp.as_ptr();
    // SAFETY: loads 512 bytes from `fp`; the caller's contract covers the
    // registers written.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            ".arch_extension simd",
            "ldp q0, q1, [{base}, #0]",
            "ldp q2, q3, [{base}, #32]",
            "ldp q4, q5, [{base}, #64]",
            "ldp q6, q7, [{base}, #96]",
            "ldp q8, q9, [{base}, #128]",
            "ldp q10, q11, [{base}, #160]",
            "ldp q12, q13, [{base}, #192]",
            "ldp q14, q15, [{base}, #224]",
            "ldp q16, q17, [{base}, #256]",
            "ldp q18, q19, [{base}, #288]",
            "ldp q20, q21, [{base}, #320]",
            "ldp q22, q23, [{base}, #352]",
            "ldp q24, q25, [{base}, #384]",
            "ldp q26, q27, [{base}, #416]",
            "ldp q28, q29, [{base}, #448]",
            "ldp q30, q31, [{base}, #480]",
            "msr fpcr, {fpcr}",
            "msr fpsr, {fpsr}",
            base = in(reg) base,
            fpcr = in(reg) fpcr,
            fpsr = in(reg) fpsr,
            options(nostack, preserves_flags)
        );
    }
}

/// Active-priority registers per group for `preemption_bits` (5, 6 or 7).
fn apr_count() -> usize {
    let vtr = read_sysreg!(ich_vtr_el2);
    match ((vtr >> 29) & 7) + 1 {
        7 => 4,
        6 => 2,
        _ => 1,
    }
}

fn read_cpu_interface() -> CpuInterfaceState {
    let count = apr_count();
    let mut state = CpuInterfaceState {
        vmcr: read_sysreg!(ich_vmcr_el2),
        apr_count: count,
        ..CpuInterfaceState::default()
    };
    state.ap0r[0] = read_sysreg!(ich_ap0r0_el2);
    state.ap1r[0] = read_sysreg!(ich_ap1r0_el2);
    if count >= 2 {
        state.ap0r[1] = read_sysreg!(ich_ap0r1_el2);
        state.ap1r[1] = read_sysreg!(ich_ap1r1_el2);
    }
    if count == 4 {
        state.ap0r[2] = read_sysreg!(ich_ap0r2_el2);
        state.ap1r[2] = read_sysreg!(ich_ap1r2_el2);
        state.ap0r[3] = read_sysreg!(ich_ap0r3_el2);
        state.ap1r[3] = read_sysreg!(ich_ap1r3_el2);
    }
    state
}

/// # Safety
///
/// No guest runs on this CPU; `state` is a guest's virtual CPU interface.
unsafe fn write_cpu_interface(state: &CpuInterfaceState) {
    let count = apr_count().min(state.apr_count.max(1));
    // SAFETY: the caller's contract: the guest's view of its virtual CPU
    // interface, no guest running.
    unsafe {
        write_sysreg!(ich_vmcr_el2, state.vmcr);
        write_sysreg!(ich_ap0r0_el2, state.ap0r[0]);
        write_sysreg!(ich_ap1r0_el2, state.ap1r[0]);
        if count >= 2 {
            write_sysreg!(ich_ap0r1_el2, state.ap0r[1]);
            write_sysreg!(ich_ap1r1_el2, state.ap1r[1]);
        }
        if count == 4 {
            write_sysreg!(ich_ap0r2_el2, state.ap0r[2]);
            write_sysreg!(ich_ap1r2_el2, state.ap1r[2]);
            write_sysreg!(ich_ap0r3_el2, state.ap0r[3]);
            write_sysreg!(ich_ap1r3_el2, state.ap1r[3]);
        }
    }
}

impl Vcpu {
    /// Captures this parked vCPU's whole state: its list registers go back
    /// into the vgic model first (they are refilled when it runs again).
    pub(super) fn capture_state(&mut self) -> Result<VcpuState, StopReason> {
        if let Some(lrs) = self.lrs.as_mut() {
            let result = self.vm.vgic.lock().unload(self.index, lrs);
            if let Err(error) = result {
                return Err(StopReason::ListRegisters {
                    op: ListRegisterOp::Unload,
                    error,
                });
            }
        }
        self.needs_fill = true;
        let mut state = VcpuState {
            x: self.regs.x,
            pc: self.regs.pc,
            pstate: self.regs.pstate,
            sysregs: read_el1(),
            ..VcpuState::default()
        };
        let (fpcr, fpsr) = read_fp(&mut state.fp);
        state.fpcr = fpcr;
        state.fpsr = fpsr;
        state.timers = TimerState {
            vctl: read_sysreg!(cntv_ctl_el0),
            vcval: read_sysreg!(cntv_cval_el0),
            pctl: read_sysreg!(cntp_ctl_el0),
            pcval: read_sysreg!(cntp_cval_el0),
        };
        if matches!(self.lrs, Some(HostListRegisters::V3(_))) {
            state.cpu_interface = read_cpu_interface();
        }
        Ok(state)
    }

    /// Restores `state` after `load` reset this CPU for the vCPU's start.
    pub(super) fn restore_state(&mut self, state: &VcpuState) {
        // SAFETY: called from `load`, before the first entry: no guest runs
        // here, and every value is the migrated guest's own.
        unsafe {
            write_el1(&state.sysregs);
            write_fp(&state.fp, state.fpcr, state.fpsr);
            write_sysreg!(cntv_cval_el0, state.timers.vcval);
            write_sysreg!(cntv_ctl_el0, state.timers.vctl);
            write_sysreg!(cntp_cval_el0, state.timers.pcval);
            write_sysreg!(cntp_ctl_el0, state.timers.pctl);
            if matches!(self.lrs, Some(HostListRegisters::V3(_))) {
                write_cpu_interface(&state.cpu_interface);
            }
            core::arch::asm!("isb", options(nostack, preserves_flags));
        }
        self.regs.x = state.x;
        self.regs.pc = state.pc;
        self.regs.pstate = state.pstate;
        self.needs_fill = true;
    }
}
