//! Capturing and restoring a vCPU's whole state for a live migration
//! (`crate::vm::vcpu_state` says what and why; `arch::migrate` drives it).
//! Both run on the vCPU's own CPU, where the state is live: the capture
//! while the vCPU is parked for a pause (its list registers first unloaded
//! into the vgic model, which travels separately), the restore right after
//! [`Vcpu::load`](super::Vcpu) reset the CPU for a start.

use super::Vcpu;
use crate::arch::cpu::features::local_features;
use crate::arch::drivers::gic::HostListRegisters;
use crate::exit::flow::{ListRegisterOp, StopReason};
use crate::vm::vcpu_state::{
    CpuInterfaceState, EL1_SYSREGS, SVCR_SM, SmeState, SveState, TimerState, VcpuState,
};
use crate::{read_sysreg, sysreg_values, write_sysreg};

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

/// The SVE vector length in bytes at EL2 (`ZCR_EL2` asks for the CPU's
/// longest, the length the guest gets too).
fn sve_vl() -> usize {
    let vl: u64;
    // SAFETY: reads the vector length; SVE is not trapped at EL2 (`CPTR_EL2.TZ`
    // clear while a vCPU is loaded).
    unsafe {
        core::arch::asm!(
            ".arch_extension sve",
            "rdvl {vl}, #1",
            vl = out(reg) vl,
            options(nomem, nostack, preserves_flags)
        );
    }
    vl as usize
}

/// The SVE vector length in bytes a vCPU gets on this CPU, `None` without
/// SVE. Sets `CPTR_EL2` and `ZCR_EL2` as [`Vcpu::load`](super::Vcpu) does
/// (the migrating CPU may not have loaded a vCPU yet, and both reset to
/// unknown values): SVE untrapped, the longest vectors.
pub fn sve_vector_length() -> Option<usize> {
    let features = local_features();
    if !features.sve {
        return None;
    }
    // SAFETY: the values `load` writes before every guest entry on this CPU;
    // no guest runs here while the migration runs, and the hypervisor is
    // soft-float, so untrapping FP/SVE changes nothing of its own.
    unsafe {
        write_sysreg!(cptr_el2, sysreg_values::cptr_el2_guest(features.sme));
        write_sysreg!(s3_4_c1_c2_0, sysreg_values::VECTOR_LEN_MAX); // ZCR_EL2
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    Some(sve_vl())
}

/// Stores `z0..z31`, `p0..p15`, `FFR` and `ZCR_EL1` (ZCR_EL1 is
/// `S3_0_C1_C2_0`).
fn read_sve() -> SveState {
    let mut sve = SveState::with_vl(sve_vl());
    let (z, p, ffr) = (sve.z.as_mut_ptr(), sve.p.as_mut_ptr(), sve.ffr.as_mut_ptr());
    // SAFETY: the buffers hold 32 vectors, 16 predicates and one predicate
    // of this vector length (`SveState::with_vl`); `p0` is stored before it
    // carries FFR and restored after; SVE is not trapped at EL2.
    unsafe {
        core::arch::asm!(
            ".arch_extension sve",
            "str z0, [{z}, #0, MUL VL]", "str z1, [{z}, #1, MUL VL]",
            "str z2, [{z}, #2, MUL VL]", "str z3, [{z}, #3, MUL VL]",
            "str z4, [{z}, #4, MUL VL]", "str z5, [{z}, #5, MUL VL]",
            "str z6, [{z}, #6, MUL VL]", "str z7, [{z}, #7, MUL VL]",
            "str z8, [{z}, #8, MUL VL]", "str z9, [{z}, #9, MUL VL]",
            "str z10, [{z}, #10, MUL VL]", "str z11, [{z}, #11, MUL VL]",
            "str z12, [{z}, #12, MUL VL]", "str z13, [{z}, #13, MUL VL]",
            "str z14, [{z}, #14, MUL VL]", "str z15, [{z}, #15, MUL VL]",
            "str z16, [{z}, #16, MUL VL]", "str z17, [{z}, #17, MUL VL]",
            "str z18, [{z}, #18, MUL VL]", "str z19, [{z}, #19, MUL VL]",
            "str z20, [{z}, #20, MUL VL]", "str z21, [{z}, #21, MUL VL]",
            "str z22, [{z}, #22, MUL VL]", "str z23, [{z}, #23, MUL VL]",
            "str z24, [{z}, #24, MUL VL]", "str z25, [{z}, #25, MUL VL]",
            "str z26, [{z}, #26, MUL VL]", "str z27, [{z}, #27, MUL VL]",
            "str z28, [{z}, #28, MUL VL]", "str z29, [{z}, #29, MUL VL]",
            "str z30, [{z}, #30, MUL VL]", "str z31, [{z}, #31, MUL VL]",
            "str p0, [{p}, #0, MUL VL]", "str p1, [{p}, #1, MUL VL]",
            "str p2, [{p}, #2, MUL VL]", "str p3, [{p}, #3, MUL VL]",
            "str p4, [{p}, #4, MUL VL]", "str p5, [{p}, #5, MUL VL]",
            "str p6, [{p}, #6, MUL VL]", "str p7, [{p}, #7, MUL VL]",
            "str p8, [{p}, #8, MUL VL]", "str p9, [{p}, #9, MUL VL]",
            "str p10, [{p}, #10, MUL VL]", "str p11, [{p}, #11, MUL VL]",
            "str p12, [{p}, #12, MUL VL]", "str p13, [{p}, #13, MUL VL]",
            "str p14, [{p}, #14, MUL VL]", "str p15, [{p}, #15, MUL VL]",
            "rdffr p0.b",
            "str p0, [{ffr}]",
            "ldr p0, [{p}, #0, MUL VL]",
            z = in(reg) z,
            p = in(reg) p,
            ffr = in(reg) ffr,
            options(nostack, preserves_flags)
        );
    }
    sve.zcr_el1 = read_sysreg!(s3_0_c1_c2_0);
    sve
}

/// Loads `FFR`, `p0..p15`, `z0..z31` and `ZCR_EL1` from `sve`.
///
/// # Safety
///
/// No guest runs on this CPU; the hypervisor is soft-float, so nothing of
/// its own lives in these registers. `sve` was captured at this CPU's
/// vector length.
unsafe fn write_sve(sve: &SveState) {
    let (z, p, ffr) = (sve.z.as_ptr(), sve.p.as_ptr(), sve.ffr.as_ptr());
    // SAFETY: reads the buffers `read_sve` filled at this vector length (the
    // caller checked it); the caller's contract covers the registers.
    unsafe {
        write_sysreg!(s3_0_c1_c2_0, sve.zcr_el1);
        core::arch::asm!(
            ".arch_extension sve",
            "ldr p0, [{ffr}]",
            "wrffr p0.b",
            "ldr p0, [{p}, #0, MUL VL]", "ldr p1, [{p}, #1, MUL VL]",
            "ldr p2, [{p}, #2, MUL VL]", "ldr p3, [{p}, #3, MUL VL]",
            "ldr p4, [{p}, #4, MUL VL]", "ldr p5, [{p}, #5, MUL VL]",
            "ldr p6, [{p}, #6, MUL VL]", "ldr p7, [{p}, #7, MUL VL]",
            "ldr p8, [{p}, #8, MUL VL]", "ldr p9, [{p}, #9, MUL VL]",
            "ldr p10, [{p}, #10, MUL VL]", "ldr p11, [{p}, #11, MUL VL]",
            "ldr p12, [{p}, #12, MUL VL]", "ldr p13, [{p}, #13, MUL VL]",
            "ldr p14, [{p}, #14, MUL VL]", "ldr p15, [{p}, #15, MUL VL]",
            "ldr z0, [{z}, #0, MUL VL]", "ldr z1, [{z}, #1, MUL VL]",
            "ldr z2, [{z}, #2, MUL VL]", "ldr z3, [{z}, #3, MUL VL]",
            "ldr z4, [{z}, #4, MUL VL]", "ldr z5, [{z}, #5, MUL VL]",
            "ldr z6, [{z}, #6, MUL VL]", "ldr z7, [{z}, #7, MUL VL]",
            "ldr z8, [{z}, #8, MUL VL]", "ldr z9, [{z}, #9, MUL VL]",
            "ldr z10, [{z}, #10, MUL VL]", "ldr z11, [{z}, #11, MUL VL]",
            "ldr z12, [{z}, #12, MUL VL]", "ldr z13, [{z}, #13, MUL VL]",
            "ldr z14, [{z}, #14, MUL VL]", "ldr z15, [{z}, #15, MUL VL]",
            "ldr z16, [{z}, #16, MUL VL]", "ldr z17, [{z}, #17, MUL VL]",
            "ldr z18, [{z}, #18, MUL VL]", "ldr z19, [{z}, #19, MUL VL]",
            "ldr z20, [{z}, #20, MUL VL]", "ldr z21, [{z}, #21, MUL VL]",
            "ldr z22, [{z}, #22, MUL VL]", "ldr z23, [{z}, #23, MUL VL]",
            "ldr z24, [{z}, #24, MUL VL]", "ldr z25, [{z}, #25, MUL VL]",
            "ldr z26, [{z}, #26, MUL VL]", "ldr z27, [{z}, #27, MUL VL]",
            "ldr z28, [{z}, #28, MUL VL]", "ldr z29, [{z}, #29, MUL VL]",
            "ldr z30, [{z}, #30, MUL VL]", "ldr z31, [{z}, #31, MUL VL]",
            z = in(reg) z,
            p = in(reg) p,
            ffr = in(reg) ffr,
            options(nostack, preserves_flags)
        );
    }
}

/// `SVCR` (`S3_3_C4_C2_2`), `SMCR_EL1` (`S3_0_C1_C2_6`), `TPIDR2_EL0`
/// (`S3_3_C13_C0_5`).
fn read_sme() -> SmeState {
    SmeState {
        svcr: read_sysreg!(s3_3_c4_c2_2),
        smcr_el1: read_sysreg!(s3_0_c1_c2_6),
        tpidr2_el0: read_sysreg!(s3_3_c13_c0_5),
    }
}

/// # Safety
///
/// No guest runs on this CPU; `sme` is a guest's state outside streaming
/// mode (the capture refused any other).
unsafe fn write_sme(sme: &SmeState) {
    // SAFETY: the caller's contract: the guest's EL1/EL0 SME controls, no
    // guest running; `SVCR` has `SM` and `ZA` clear, as after `load`.
    unsafe {
        write_sysreg!(s3_0_c1_c2_6, sme.smcr_el1);
        write_sysreg!(s3_3_c13_c0_5, sme.tpidr2_el0);
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
        let features = local_features();
        if features.sme {
            state.sme = Some(read_sme());
        }
        // In streaming mode the `z` registers are the streaming ones and
        // `FFR` does not exist: such a state is refused (`VcpuState::check`)
        // and its SVE registers are not read.
        let streaming = state.sme.is_some_and(|sme| sme.svcr & SVCR_SM != 0);
        if features.sve && !streaming {
            state.sve = Some(read_sve());
        }
        Ok(state)
    }

    /// Restores `state` after `load` reset this CPU for the vCPU's start.
    /// SVE state is restored only at the vector length it was captured at:
    /// `arch::migrate` compared it with the migrating CPU's, and a CPU of the
    /// destination that differs stops the VM rather than drop the registers.
    pub(super) fn restore_state(&mut self, state: &VcpuState) -> Result<(), StopReason> {
        let features = local_features();
        if let Some(sve) = &state.sve {
            let here = features.sve.then(sve_vl);
            if here != Some(sve.vl) {
                return Err(StopReason::MigratedVectorLength {
                    captured: sve.vl,
                    here,
                });
            }
        }
        // SAFETY: called from `load`, before the first entry: no guest runs
        // here, and every value is the migrated guest's own.
        unsafe {
            write_el1(&state.sysregs);
            write_fp(&state.fp, state.fpcr, state.fpsr);
            // The `z` registers hold the `q` registers in their low bits:
            // loaded after them, they keep the bits above.
            if let Some(sve) = &state.sve {
                write_sve(sve);
            }
            if let Some(sme) = &state.sme
                && features.sme
            {
                write_sme(sme);
            }
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
        Ok(())
    }
}
