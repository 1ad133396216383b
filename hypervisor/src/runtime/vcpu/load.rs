//! Loading a vCPU onto its CPU for a start, and capturing its whole state
//! for a live migration (`crate::vm::vcpu_state` says what and why;
//! `runtime::live_migration` drives it): the machine writes and reads the
//! registers that live in the CPU (`VcpuMachine::load`,
//! `VcpuMachine::capture_registers`, `VcpuMachine::restore_registers`);
//! this side resets the vCPU's own records (`HCR_EL2` and the set/way
//! tracking, the list registers, the timers' forwarding, the guest's
//! `CBPR`) and carries the general-purpose registers.

use super::{GuestRegs, Vcpu, VcpuMachine};
use crate::devices::timer::TimerForward;
use crate::devices::vgic::{ListRegisters, cpu_interface};
use crate::exit::flow::{ListRegisterOp, StopReason};
use crate::exit::inject;
use crate::stage2::cache_maint::SetWayTracker;
use crate::sysreg_values;
use crate::vm::power::BootRequest;
use crate::vm::vcpu_state::VcpuState;
use crate::vocabulary::timers::TimerId;

impl<M: VcpuMachine> Vcpu<M> {
    /// Loads the VM's EL2 configuration and resets the guest's EL1 state
    /// to start at `boot`, or restores a migrated state.
    pub(crate) fn load(&mut self, boot: BootRequest) -> Result<(), StopReason> {
        let vm = self.vm;
        let hcr = sysreg_values::hcr_el2_guest(vm.fwb, vm.mte);
        self.hcr = hcr;
        self.set_way = SetWayTracker::new();
        self.machine.load(vm, self.index, hcr, self.lrs.as_ref());
        // A previous run of this vCPU unloaded on CPU_OFF; this empties
        // the list registers once more (nothing is listed).
        self.unload(ListRegisterOp::Reset)?;
        if let Some(lrs) = self.lrs.as_mut() {
            // The common CPU interface registers trap where the binary
            // point is guarded (`crate::devices::vgic::cpu_interface`); the
            // fills keep the bit.
            if self.machine.guards_binary_point(lrs) {
                lrs.write_hcr(cpu_interface::ICH_HCR_TC);
            }
        }
        self.guest_cbpr = false;
        // A timer's PPI may have been left active (fired while the vCPU was
        // off) or masked (halted); CNTV_CTL_EL0 and CNTP_CTL_EL0 were just
        // cleared, so both lines are low.
        for timer in TimerId::ALL {
            self.machine.deactivate_timer(timer);
            self.machine.set_timer_masked(timer, false);
        }
        self.timers = [TimerForward::new(); 2];
        self.needs_fill = true;
        self.regs = GuestRegs {
            pc: boot.entry,
            pstate: inject::PSTATE_EL1H_MASKED,
            ..GuestRegs::default()
        };
        self.regs.x[0] = boot.context_id;
        // A migrated vCPU continues where its source stopped.
        let migrated = self.vm.vcpu_states[self.index].lock().take();
        if let Some(state) = migrated {
            self.restore_state(&state)?;
        }
        Ok(())
    }

    /// Captures this parked vCPU's whole state: its list registers go back
    /// into the vgic model first (they are refilled when it runs again).
    pub(super) fn capture_state(&mut self) -> Result<VcpuState, StopReason> {
        self.unload(ListRegisterOp::Unload)?;
        self.needs_fill = true;
        let mut state = self.machine.capture_registers(self.vm, self.lrs.as_ref());
        state.x = self.regs.x;
        state.pc = self.regs.pc;
        state.pstate = self.regs.pstate;
        if self.machine.migrates_cpu_interface(self.lrs.as_ref()) {
            state.cpu_interface.guest_cbpr = self.guest_cbpr;
        }
        Ok(state)
    }

    /// Restores `state` right after the load reset this CPU for the vCPU's
    /// start.
    fn restore_state(&mut self, state: &VcpuState) -> Result<(), StopReason> {
        self.machine
            .restore_registers(self.vm, self.index, self.lrs.as_ref(), state)?;
        if self.machine.migrates_cpu_interface(self.lrs.as_ref()) {
            self.guest_cbpr = state.cpu_interface.guest_cbpr;
        }
        self.regs.x = state.x;
        self.regs.pc = state.pc;
        self.regs.pstate = state.pstate;
        self.needs_fill = true;
        Ok(())
    }
}
