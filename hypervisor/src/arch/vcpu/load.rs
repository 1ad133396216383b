//! Loading a vCPU onto its CPU: the VM's EL2 configuration (stage 2, traps,
//! timers, vector lengths, fine-grained traps) and the guest's EL1 state as
//! after a reset; and `HCR_EL2` as the set/way tracking changes it.

use super::Vcpu;
use crate::arch::boot::exceptions::GuestRegs;
use crate::arch::cpu::features::local_features;
use crate::arch::drivers::gic;
use crate::devices::timer::{TimerForward, TimerId};
use crate::exit::flow::{ListRegisterOp, StopReason};
use crate::exit::inject;
use crate::exit::psci::BootRequest;
use crate::stage2::cache_maint::{self, SetWayTracker};
use crate::vm::layout::vcpu_mpidr;
use crate::{read_sysreg, write_sysreg};

/// `HCR_EL2` for a non-VHE hypervisor running AArch64 EL1 guests: stage 2
/// (VM), set/way invalidation as clean+invalidate (SWIO), physical FIQ/IRQ/
/// SError to EL2 (FMO/IMO/AMO), trap the ID registers (TID3: the guest sees
/// them through `crate::exit::sysreg::guest_id_value`), trap SMC (TSC), EL1 is
/// AArch64 (RW), do not
/// trap pointer authentication (APK/API). WFI/WFE run natively (see the
/// module docs). The guest's local TLB and cache maintenance and barriers
/// stay local (no FB, no BSU upgrade): a vCPU never leaves its CPU, so what
/// it cached elsewhere cannot exist, exactly as on real hardware.
pub(super) const HCR_EL2_GUEST: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 18)
    | (1 << 19)
    | (1 << 31)
    | (1 << 40)
    | (1 << 41);
/// `HCR_EL2.FWB`: stage 2 forces the memory type (FEAT_S2FWB).
const HCR_EL2_FWB: u64 = 1 << 46;
// Without FWB, `HCR_EL2.TSW` traps set/way maintenance and `HCR_EL2.TVM` the
// virtual-memory control registers while set/way is tracked (`cache_maint`).
/// `CPTR_EL2` (non-VHE): RES1 bits only, so FP/SIMD and SVE are not trapped.
const CPTR_EL2_NO_TRAPS: u64 = 0x32ff;
/// `CPTR_EL2.TSM` (bit 12, RES1 without FEAT_SME): trap SME.
const CPTR_EL2_TSM: u64 = 1 << 12;
/// `HFGRTR_EL2`/`HFGWTR_EL2` nSMPRI_EL1 (54) and nTPIDR2_EL0 (55): set means
/// not trapped.
const FGT_SME_NEGATIVE: u64 = (1 << 54) | (1 << 55);
/// `ZCR_EL2`/`SMCR_EL2` `LEN` asking for the longest vector the CPU has.
const VECTOR_LEN_MAX: u64 = 0xf;
/// `CNTHCTL_EL2.EL1PCTEN` (non-VHE): EL1 and EL0 reads of `CNTPCT_EL0` are
/// not trapped.
const CNTHCTL_EL2_EL1PCTEN: u64 = 1 << 0;
/// `CNTHCTL_EL2.EL1PCEN` (non-VHE): EL1 and EL0 accesses to the EL1 physical
/// timer (`CNTP_*_EL0`) are not trapped.
const CNTHCTL_EL2_EL1PCEN: u64 = 1 << 1;
/// `CNTHCTL_EL2` while a guest runs: both timers and both counters belong to
/// the guest, untrapped (see `crate::devices::timer`). Every other field is clear:
/// no event stream, and `ECV` (bit 12) clear so that `CNTPOFF_EL2` is not
/// applied on a CPU with FEAT_ECV: the physical offset is zero, like
/// `CNTVOFF_EL2`, and the guest's two counters read the same value.
const CNTHCTL_EL2_GUEST: u64 = CNTHCTL_EL2_EL1PCTEN | CNTHCTL_EL2_EL1PCEN;
/// `SCTLR_EL1` reset value: RES1 bits, MMU and caches off.
const SCTLR_EL1_RESET: u64 = 0x30d0_0800;

impl Vcpu {
    /// Loads the VM's EL2 configuration and resets the guest's EL1 state.
    pub(super) fn load(&mut self, boot: BootRequest) -> Result<(), StopReason> {
        let vm = self.vm;
        let hcr = HCR_EL2_GUEST
            | if vm.fwb { HCR_EL2_FWB } else { 0 }
            | cache_maint::hcr_trap_bits(vm.fwb);
        self.hcr = hcr;
        self.set_way = SetWayTracker::new();
        let dfr0 = read_sysreg!(id_aa64dfr0_el1);
        let pmu = matches!((dfr0 >> 8) & 0xf, 1..=0xe);
        let mdcr = if pmu {
            (read_sysreg!(pmcr_el0) >> 11) & 0x1f
        } else {
            0
        };
        let midr = read_sysreg!(midr_el1);
        // Which EL2 registers exist is this CPU's own business (a big.LITTLE
        // machine may differ), not the system-wide minimum.
        let features = local_features();
        let cptr = if features.sme {
            CPTR_EL2_NO_TRAPS & !CPTR_EL2_TSM
        } else {
            CPTR_EL2_NO_TRAPS
        };
        // ICH_VTR_EL2.PREbits + 1 preemption bits: 5 need one active-priority
        // register per group, 6 two, 7 four.
        let preemption_bits = if matches!(self.lrs, Some(gic::HostListRegisters::V3(_))) {
            ((read_sysreg!(ich_vtr_el2) >> 26) & 7) + 1
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
            write_sysreg!(vmpidr_el2, vcpu_mpidr(self.index));
            write_sysreg!(cptr_el2, cptr);
            core::arch::asm!("isb", options(nostack, preserves_flags));
            // The guest may use SVE and SME at the CPU's longest vector length
            // (their registers stay in the CPU: vCPUs are pinned).
            if features.sve {
                write_sysreg!(s3_4_c1_c2_0, VECTOR_LEN_MAX); // ZCR_EL2
            }
            if features.sme {
                write_sysreg!(s3_4_c1_c2_6, VECTOR_LEN_MAX); // SMCR_EL2
            }
            // Fine-grained traps and HCRX_EL2 reset to UNKNOWN values: trap
            // nothing (the negative bits nSMPRI_EL1/nTPIDR2_EL0 trap when clear).
            if features.fgt {
                let negative = if features.sme { FGT_SME_NEGATIVE } else { 0 };
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
            write_sysreg!(cnthctl_el2, CNTHCTL_EL2_GUEST);
            write_sysreg!(cntvoff_el2, 0);
            // EL1 state as after a reset.
            write_sysreg!(sctlr_el1, SCTLR_EL1_RESET);
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
            if self.lrs.is_some() {
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
        if let Some(lrs) = self.lrs.as_mut() {
            // A previous run of this vCPU unloaded on CPU_OFF; this empties
            // the list registers once more (nothing is listed).
            let result = self.vm.vgic.lock().unload(self.index, lrs);
            if let Err(error) = result {
                return Err(StopReason::ListRegisters {
                    op: ListRegisterOp::Reset,
                    error,
                });
            }
        }
        // A timer may have been masked while the vCPU was off; CNTV_CTL_EL0
        // and CNTP_CTL_EL0 were just cleared, so both lines are low.
        for timer in TimerId::ALL {
            gic::set_timer_masked(timer, false);
        }
        self.timers = [TimerForward::new(); 2];
        self.needs_fill = true;
        self.regs = GuestRegs {
            pc: boot.entry,
            pstate: inject::PSTATE_EL1H_MASKED,
            ..GuestRegs::default()
        };
        self.regs.x[0] = boot.context_id;
        Ok(())
    }

    /// Loads `HCR_EL2` with the set/way tracking's `TVM`.
    pub(super) fn write_hcr(&self) {
        let tvm = if self.set_way.traps_vm_regs() {
            cache_maint::hcr_tvm()
        } else {
            0
        };
        // SAFETY: the same configuration as `load` wrote, with or without the
        // trap of the guest's virtual-memory control registers; the guest is
        // not running (the write takes effect by the ERET).
        unsafe { write_sysreg!(hcr_el2, self.hcr | tvm) };
    }
}
