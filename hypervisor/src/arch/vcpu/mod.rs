//! The machine side of a vCPU: [`El2Vcpu`] implements
//! `runtime::vcpu::VcpuMachine` at EL2 (the guest's EL1 registers, the
//! EL2 registers the exit handling writes, the host GIC's CPU interface and
//! list registers, the guest entry through `boot::exceptions`), and
//! [`Vcpu`] is the portable vCPU (`runtime::vcpu`: run loop and exit
//! handling) on it.
//!
//! # Files
//!
//! This file holds the trait's implementation; `load` (the EL2
//! configuration and EL1 reset when the vCPU starts), `state` (the
//! registers of a vCPU's state captured and restored for a live migration),
//! `vector_regs` (the FP/SIMD, SVE and SME register files: stored, loaded,
//! reset).

mod load;
mod state;
mod vector_regs;
pub use vector_regs::{measure_lengths, vector_lengths};

use crate::arch::boot::exceptions::{ExitKind, GuestRegs, enter_guest};
use crate::arch::control_target;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::gic;
use crate::arch::hardware::{EL2, El2, HOST_CONSOLE, Vm};
use crate::devices::timer::PhysicalTimerReg;
use crate::exit::flow::StopReason;
use crate::exit::inject::InjectedException;
use crate::runtime::vcpu::VcpuMachine;
use crate::stage2::cache_maint::VmReg;
use crate::vm::vcpu_state::VcpuState;
use crate::vocabulary::timers::TimerId;
use crate::{read_sysreg, write_sysreg};
use crossbeam_epoch::LocalHandle;

/// The CPU a vCPU runs on, at EL2: every register it reaches is this
/// CPU's own (the vCPU never leaves it).
pub struct El2Vcpu;

/// A vCPU on this machine.
pub type Vcpu = crate::runtime::vcpu::Vcpu<El2Vcpu>;

impl VcpuMachine for El2Vcpu {
    type Hw = El2;
    type ListRegisters = gic::HostListRegisters;
    type Acknowledged = gic::Acknowledged;

    fn list_registers(&self, vm: &Vm) -> Option<gic::HostListRegisters> {
        gic::list_registers(vm.gic_sysregs)
    }

    fn load(&mut self, vm: &Vm, index: usize, hcr: u64, lrs: Option<&gic::HostListRegisters>) {
        load::load_registers(vm, index, hcr, lrs);
    }

    fn guards_binary_point(&self, lrs: &gic::HostListRegisters) -> bool {
        matches!(lrs, gic::HostListRegisters::V3(_)) && gic::HOST_GIC.guards_binary_point()
    }

    fn migrates_cpu_interface(&self, lrs: Option<&gic::HostListRegisters>) -> bool {
        matches!(lrs, Some(gic::HostListRegisters::V3(_)))
    }

    fn capture_registers(&self, vm: &Vm, lrs: Option<&gic::HostListRegisters>) -> VcpuState {
        state::capture_registers(vm, lrs)
    }

    fn restore_registers(
        &mut self,
        vm: &Vm,
        index: usize,
        lrs: Option<&gic::HostListRegisters>,
        state: &VcpuState,
    ) -> Result<(), StopReason> {
        state::restore_registers(vm, index, lrs, state)
    }

    unsafe fn enter(&mut self, regs: &mut GuestRegs) -> ExitKind {
        // SAFETY: the caller's contract: `load` set this CPU's stage-2
        // translation and traps for the vCPU's VM, and the vectors are
        // installed at boot.
        unsafe { enter_guest(regs) }
    }

    fn write_hcr(&mut self, value: u64) {
        // SAFETY: the configuration `load` wrote, with or without the trap
        // of the guest's virtual-memory control registers; the guest is not
        // running (the write takes effect by the ERET).
        unsafe { write_sysreg!(hcr_el2, value) };
    }

    fn vbar_el1(&self) -> u64 {
        read_sysreg!(vbar_el1)
    }

    fn sctlr_el1(&self) -> u64 {
        read_sysreg!(sctlr_el1)
    }

    fn deliver_exception(&mut self, exception: &InjectedException) {
        // SAFETY: the EL1 exception registers belong to the guest running on
        // this CPU; writing them is how the exception is delivered.
        unsafe {
            write_sysreg!(esr_el1, exception.esr);
            if let Some(far) = exception.far {
                write_sysreg!(far_el1, far);
            }
            write_sysreg!(elr_el1, exception.elr);
            write_sysreg!(spsr_el1, exception.spsr);
        }
    }

    fn write_vm_reg(&mut self, reg: VmReg, value: u64) {
        // SAFETY: these EL1 registers belong to the guest running on this
        // CPU; the trap only delayed the guest's own write, done here.
        unsafe {
            match reg {
                VmReg::Sctlr => write_sysreg!(sctlr_el1, value),
                VmReg::Ttbr0 => write_sysreg!(ttbr0_el1, value),
                VmReg::Ttbr1 => write_sysreg!(ttbr1_el1, value),
                VmReg::Tcr => write_sysreg!(tcr_el1, value),
                VmReg::Esr => write_sysreg!(esr_el1, value),
                VmReg::Far => write_sysreg!(far_el1, value),
                VmReg::Afsr0 => write_sysreg!(afsr0_el1, value),
                VmReg::Afsr1 => write_sysreg!(afsr1_el1, value),
                VmReg::Mair => write_sysreg!(mair_el1, value),
                VmReg::Amair => write_sysreg!(amair_el1, value),
                VmReg::Contextidr => write_sysreg!(contextidr_el1, value),
            }
        }
    }

    fn id_register(&self, crm: u8, op2: u8) -> Option<u64> {
        sysreg::read_id_register(crm, op2)
    }

    fn timer_ctl(&self, timer: TimerId) -> u64 {
        match timer {
            TimerId::Virtual => read_sysreg!(cntv_ctl_el0),
            TimerId::Physical => read_sysreg!(cntp_ctl_el0),
        }
    }

    fn physical_timer_read(&self, reg: PhysicalTimerReg) -> u64 {
        match reg {
            PhysicalTimerReg::Tval => read_sysreg!(cntp_tval_el0),
            PhysicalTimerReg::Ctl => read_sysreg!(cntp_ctl_el0),
            PhysicalTimerReg::Cval => read_sysreg!(cntp_cval_el0),
        }
    }

    fn physical_timer_write(&mut self, reg: PhysicalTimerReg, value: u64) {
        // SAFETY: the EL1 physical timer belongs to the guest running on
        // this CPU; the trap only delayed the guest's own write, done here.
        // Its interrupt reaches the guest through the vgic only.
        unsafe {
            match reg {
                PhysicalTimerReg::Tval => write_sysreg!(cntp_tval_el0, value),
                PhysicalTimerReg::Ctl => write_sysreg!(cntp_ctl_el0, value),
                PhysicalTimerReg::Cval => write_sysreg!(cntp_cval_el0, value),
            }
            core::arch::asm!("isb", options(nomem, nostack));
        }
    }

    fn stop_guest_timers(&mut self) {
        // SAFETY: turning the guest's timers off only stops their
        // interrupts; the guest does not run on this CPU until its next
        // load, which resets them.
        unsafe {
            write_sysreg!(cntv_ctl_el0, 0);
            write_sysreg!(cntp_ctl_el0, 0);
        }
    }

    fn ich_vtr(&self) -> u64 {
        read_sysreg!(ich_vtr_el2)
    }

    fn ich_vmcr(&self) -> u64 {
        read_sysreg!(ich_vmcr_el2)
    }

    fn write_ich_vmcr(&mut self, value: u64) {
        // SAFETY: ICH_VMCR_EL2 holds this guest's view of its virtual CPU
        // interface, which the trapped access changes.
        unsafe { write_sysreg!(ich_vmcr_el2, value) };
    }

    fn active_priorities(&self) -> ([u32; 4], usize) {
        let state = state::read_cpu_interface();
        let aprs = core::array::from_fn(|n| (state.ap0r[n] | state.ap1r[n]) as u32);
        (aprs, state.apr_count)
    }

    fn gic_is_up(&self) -> bool {
        gic::HOST_GIC.is_up()
    }

    fn maintenance_intid(&self) -> u32 {
        gic::HOST_GIC.maintenance_intid()
    }

    fn timer_intids(&self) -> [u32; 2] {
        gic::HOST_GIC.timer_intids()
    }

    fn acknowledge(&mut self) -> (u32, gic::Acknowledged) {
        let ack = gic::HOST_GIC.acknowledge();
        (ack.intid, ack)
    }

    fn end_of_interrupt(&mut self, ack: gic::Acknowledged) {
        gic::HOST_GIC.end_of_interrupt(ack);
    }

    fn drop_priority(&mut self, ack: gic::Acknowledged) {
        gic::HOST_GIC.drop_priority(ack);
    }

    fn clear_ppi_active(&mut self, intid: u32) {
        gic::HOST_GIC.clear_ppi_active(gic::this_cpu(), intid);
    }

    fn deactivate_timer(&mut self, timer: TimerId) {
        gic::HOST_GIC.deactivate_timer(gic::this_cpu(), timer);
    }

    fn set_timer_masked(&mut self, timer: TimerId, masked: bool) {
        gic::HOST_GIC.set_timer_masked(gic::this_cpu(), timer, masked);
    }

    fn set_ppi_enabled(&mut self, intid: u32, enabled: bool) {
        gic::HOST_GIC.set_ppi_enabled(gic::this_cpu(), intid, enabled);
    }

    fn console_input(&mut self) {
        HOST_CONSOLE.host_input(&EL2);
    }

    fn is_console_poll_timer(&self, intid: u32) -> bool {
        HOST_CONSOLE.is_poll_timer(intid)
    }

    fn console_poll_tick(&mut self) {
        HOST_CONSOLE.poll_tick(&EL2);
    }

    fn control_call(&mut self, vm: &'static Vm, epoch: &LocalHandle, regs: &[u64; 8]) -> [u64; 4] {
        control_target::handle_call(vm, epoch, regs)
    }
}
