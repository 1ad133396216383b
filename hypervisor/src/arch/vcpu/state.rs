//! Capturing and restoring a vCPU's whole state for a live migration
//! (`crate::vm::vcpu_state` says what and why; `runtime::live_migration` drives it).
//! Both run on the vCPU's own CPU, where the state is live: the capture
//! while the vCPU is parked for a pause (its list registers first unloaded
//! into the vgic model, which travels separately), the restore right after
//! the load reset the CPU for a start. What is not in the CPU (the
//! general-purpose registers, the guest's `CBPR`) `runtime::vcpu` adds.

use super::vector_regs::{self, vector_lengths};
use crate::arch::cpu::features::local_features;
use crate::arch::cpu::memory_tagging;
use crate::arch::drivers::gic::HostListRegisters;
use crate::arch::hardware::Vm;
use crate::exit::flow::StopReason;
use crate::vm::vcpu_state::{CpuInterfaceState, EL1_SYSREGS, SmeState, TimerState, VcpuState};
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

/// Active-priority registers per group for the CPU interface's preemption
/// bits (`ICH_VTR_EL2.PREbits` + 1: 5, 6 or 7).
fn apr_count() -> usize {
    let vtr = read_sysreg!(ich_vtr_el2);
    match ((vtr >> 26) & 7) + 1 {
        7 => 4,
        6 => 2,
        _ => 1,
    }
}

/// The guest's view of the virtual CPU interface on this CPU (its
/// `guest_cbpr` left false for the caller to fill in).
pub(super) fn read_cpu_interface() -> CpuInterfaceState {
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

/// The state of a parked vCPU of `vm` that lives in this CPU (its EL1
/// registers, timers, FP/SIMD, SVE and SME registers, tag registers, and
/// with GICv3 list registers `lrs` its virtual CPU interface); the
/// general-purpose registers and the list registers are the caller's.
pub(super) fn capture_registers(vm: &Vm, lrs: Option<&HostListRegisters>) -> VcpuState {
    let mut state = VcpuState {
        sysregs: read_el1(),
        ..VcpuState::default()
    };
    let (fpcr, fpsr) = vector_regs::read_fpcr_fpsr();
    state.fpcr = fpcr;
    state.fpsr = fpsr;
    state.timers = TimerState {
        vctl: read_sysreg!(cntv_ctl_el0),
        vcval: read_sysreg!(cntv_cval_el0),
        pctl: read_sysreg!(cntp_ctl_el0),
        pcval: read_sysreg!(cntp_cval_el0),
    };
    if matches!(lrs, Some(HostListRegisters::V3(_))) {
        state.cpu_interface = read_cpu_interface();
    }
    if vm.mte {
        state.tags = Some(memory_tagging::read_tag_registers());
    }
    let lengths = vector_lengths();
    if let Some(svl) = lengths.sme {
        state.sme = Some(vector_regs::read_sme(svl));
    }
    // In streaming mode the `z` registers are the streaming ones (their
    // low bits the `q` registers), and `q` must not be stored directly.
    match (&state.sme, lengths.sve) {
        (Some(sme), _) if sme.streaming() => {
            let sve = vector_regs::read_streaming(sme.svl);
            for (n, q) in state.fp.iter_mut().enumerate() {
                *q = sve.q(n);
            }
            state.sve = Some(sve);
        }
        (_, vl) => {
            vector_regs::read_q(&mut state.fp);
            state.sve = vl.map(vector_regs::read_sve);
        }
    }
    state
}

/// Restores the part of `state` that lives in this CPU (as
/// [`capture_registers`] took it) for vCPU `index` of `vm`, after
/// [`load_registers`](super::load::load_registers) reset this CPU for its
/// start (streaming mode and ZA off, every vector register zero). Vector
/// state is restored only at the lengths it was captured at:
/// `runtime::live_migration` compared them with the migrating CPU's, and a
/// CPU of the destination that differs stops the VM rather than drop the
/// registers.
pub(super) fn restore_registers(
    vm: &Vm,
    index: usize,
    lrs: Option<&HostListRegisters>,
    state: &VcpuState,
) -> Result<(), StopReason> {
    let features = local_features();
    state
        .check(index, vector_lengths())
        .map_err(StopReason::MigratedVectorLength)?;
    let streaming = state.sme.as_ref().is_some_and(SmeState::streaming);
    // SAFETY: called from `load`, before the first entry: no guest runs
    // here, and every value is the migrated guest's own. `check` found
    // the captured vector lengths here (SME state with live bits only
    // where the CPU has SME).
    unsafe {
        write_el1(&state.sysregs);
        // The mode first: entering it zeroes the registers loaded next.
        if let Some(sme) = &state.sme
            && features.sme
        {
            vector_regs::enter_mode(sme.svcr);
        }
        if !streaming {
            vector_regs::write_q(&state.fp);
        }
        // The `z` registers hold the `q` registers in their low bits:
        // loaded after them, they keep the bits above.
        if let Some(sve) = &state.sve {
            vector_regs::write_sve(sve);
        }
        vector_regs::write_fpcr_fpsr(state.fpcr, state.fpsr);
        if let Some(sme) = &state.sme
            && features.sme
        {
            vector_regs::write_sme(sme);
        }
        write_sysreg!(cntv_cval_el0, state.timers.vcval);
        write_sysreg!(cntv_ctl_el0, state.timers.vctl);
        write_sysreg!(cntp_cval_el0, state.timers.pcval);
        write_sysreg!(cntp_ctl_el0, state.timers.pctl);
        if matches!(lrs, Some(HostListRegisters::V3(_))) {
            write_cpu_interface(&state.cpu_interface);
        }
        // Both VMs have memory tagging (`live_migration::request`), so
        // this CPU has the registers.
        if let Some(tags) = &state.tags
            && vm.mte
        {
            memory_tagging::write_tag_registers(tags);
        }
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    Ok(())
}
