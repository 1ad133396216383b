//! Loading a vCPU onto its CPU: the VM's EL2 configuration (stage 2, traps,
//! timers, vector lengths, fine-grained traps) and the guest's EL1 state as
//! after a reset (`runtime::vcpu`'s load does the rest).

use crate::arch::cpu::features::local_features;
use crate::arch::cpu::memory_tagging;
use crate::arch::drivers::gic::{self, HostListRegisters};
use crate::arch::hardware::Vm;
use crate::sysreg_values;
use crate::vm::layout::vcpu_mpidr;
use crate::vm::vcpu_state::TagState;
use crate::{read_sysreg, write_sysreg};
use aarch64_cpu::registers::{ICH_VTR_EL2, ID_AA64DFR0_EL1};

/// Loads vCPU `index` of `vm`'s EL2 configuration (`HCR_EL2` = `hcr`) into
/// this CPU and resets the guest's EL1 state, timers off; with list
/// registers (`lrs`), the virtual CPU interface too.
pub(super) fn load_registers(vm: &Vm, index: usize, hcr: u64, lrs: Option<&HostListRegisters>) {
    let dfr0 = read_sysreg!(id_aa64dfr0_el1, ID_AA64DFR0_EL1);
    // PMUVer 0 is no PMU, 0xf an IMPLEMENTATION DEFINED one.
    let pmu = matches!(dfr0.read(ID_AA64DFR0_EL1::PMUVer), 1..=0xe);
    let mdcr = sysreg_values::mdcr_el2_guest(pmu.then(|| read_sysreg!(pmcr_el0)));
    let midr = read_sysreg!(midr_el1);
    // Which EL2 registers exist is this CPU's own business (a big.LITTLE
    // machine may differ), not the system-wide minimum.
    let features = local_features();
    let cptr = sysreg_values::cptr_el2_guest(features.sme);
    // ICH_VTR_EL2.PREbits + 1 preemption bits: 5 need one active-priority
    // register per group, 6 two, 7 four.
    let preemption_bits = if matches!(lrs, Some(HostListRegisters::V3(_))) {
        read_sysreg!(ich_vtr_el2, ICH_VTR_EL2).read(ICH_VTR_EL2::PREbits) + 1
    } else {
        5
    };
    // SAFETY: these EL2 registers configure how EL1/EL0 run; nothing runs
    // at EL1 on this CPU now. The stage-2 root is the VM's live table.
    unsafe {
        write_sysreg!(vtcr_el2, vm.vtcr);
        write_sysreg!(vttbr_el2, vm.vttbr);
        write_sysreg!(hcr_el2, hcr);
        write_sysreg!(vpidr_el2, midr);
        write_sysreg!(vmpidr_el2, vcpu_mpidr(index));
        write_sysreg!(cptr_el2, cptr);
        core::arch::asm!("isb", options(nostack, preserves_flags));
        // The guest may use SVE and SME at the CPU's longest vector length
        // (their registers stay in the CPU: vCPUs are pinned).
        if features.sve {
            write_sysreg!(s3_4_c1_c2_0, sysreg_values::VECTOR_LEN_MAX); // ZCR_EL2
        }
        if features.sme {
            write_sysreg!(s3_4_c1_c2_6, sysreg_values::VECTOR_LEN_MAX); // SMCR_EL2
        }
        core::arch::asm!("isb", options(nostack, preserves_flags));
        // Nothing of the CPU's last guest stays in the vector registers,
        // and the guest starts outside streaming mode with ZA off.
        super::vector_regs::reset(&features);
        // Fine-grained traps and HCRX_EL2 reset to UNKNOWN values: trap
        // nothing (the negative bits nSMPRI_EL1/nTPIDR2_EL0 trap when clear).
        if features.fgt {
            let negative = sysreg_values::fine_grained_read_write_traps_none(features.sme);
            write_sysreg!(s3_4_c1_c1_4, negative); // HFGRTR_EL2
            write_sysreg!(s3_4_c1_c1_5, negative); // HFGWTR_EL2
            write_sysreg!(s3_4_c1_c1_6, 0); // HFGITR_EL2
            write_sysreg!(s3_4_c3_c1_4, 0); // HDFGRTR_EL2
            write_sysreg!(s3_4_c3_c1_5, 0); // HDFGWTR_EL2
        }
        if features.hcx {
            write_sysreg!(s3_4_c1_c2_2, 0); // HCRX_EL2
        }
        write_sysreg!(mdcr_el2, mdcr);
        write_sysreg!(cnthctl_el2, sysreg_values::CNTHCTL_EL2_GUEST);
        write_sysreg!(cntvoff_el2, 0);
        // EL1 state as after a reset.
        write_sysreg!(sctlr_el1, sysreg_values::SCTLR_EL1_RESET);
        write_sysreg!(tcr_el1, 0);
        write_sysreg!(mair_el1, 0);
        write_sysreg!(ttbr0_el1, 0);
        write_sysreg!(ttbr1_el1, 0);
        write_sysreg!(vbar_el1, 0);
        write_sysreg!(cpacr_el1, 0);
        write_sysreg!(sp_el1, 0);
        write_sysreg!(sp_el0, 0);
        write_sysreg!(elr_el1, 0);
        write_sysreg!(spsr_el1, 0);
        write_sysreg!(esr_el1, 0);
        write_sysreg!(far_el1, 0);
        write_sysreg!(tpidr_el1, 0);
        write_sysreg!(tpidr_el0, 0);
        write_sysreg!(tpidrro_el0, 0);
        write_sysreg!(contextidr_el1, 0);
        write_sysreg!(cntkctl_el1, 0);
        write_sysreg!(cntv_ctl_el0, 0);
        write_sysreg!(cntp_ctl_el0, 0);
        if vm.mte {
            // Only a VM with memory tagging reaches them (the VM was
            // refused on a host without FEAT_MTE2).
            memory_tagging::write_tag_registers(&TagState::default());
        }
        if lrs.is_some() {
            // The virtual CPU interface as after a reset: nothing listed,
            // no active priorities, the guest's view of its own control
            // registers zero; `fill` sets the HCR's En before entry.
            gic::reset_virtual_interface(preemption_bits);
        }
        core::arch::asm!(
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            options(nostack, preserves_flags)
        );
    }
}
