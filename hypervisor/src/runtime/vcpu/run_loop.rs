//! The run loop: enter the guest, dispatch the exit by kind, enter again,
//! until the vCPU turns off, the guest powers the machine off or resets it,
//! or an exit stops the VM.
//!
//! Each exit is timed from the guest's exit to its next entry with the
//! generic timer's physical count (`Hardware::counter_ticks`) and recorded
//! under the class the handlers named (`vm::exit_profile`): two counter
//! reads and two stores to this CPU's own profile per exit.

use super::{ExitKind, Vcpu, VcpuMachine};
use crate::exit::flow::{Flow, StopReason, UnexpectedExit};
use crate::exit::sync_exit::{self, SyncExit};
use crate::runtime::Hardware;
use crate::vm::counters::Counter;
use crate::vm::exit_profile::ExitClass;
use crate::vm::migration_plan::{SPINS_PER_CLOCK_READ, THROTTLE_SLICE_US, throttle_hold_ticks};
use crate::vm::power::BootRequest;
use crate::vm::run_state::Requested;
use core::sync::atomic::Ordering;

impl<M: VcpuMachine> Vcpu<M> {
    /// Runs the vCPU from `boot` until it turns itself off, the guest
    /// powers the machine off or resets it, or the VM ends or restarts
    /// (the [`Flow`] says which), or
    /// until an exit stops the VM (the [`StopReason`] says why). The caller
    /// acts on the answer; nothing here stops the VM.
    pub fn run(&mut self, boot: BootRequest) -> Result<Flow, StopReason> {
        self.load(boot)?;
        // When the guest last exited, until the entry that ends the exit.
        let mut exited: Option<u64> = None;
        loop {
            if self.vm.is_stopping() {
                return Ok(Flow::Halt);
            }
            self.obey_throttle();
            self.wait_while_paused()?;
            self.prepare_entry()?;
            // Counted in the guest until the exit (`vm::run_state`): a pause
            // that lands meanwhile refuses the entry, and its waiter sees
            // this vCPU until it leaves.
            if !self.vm.run_state.enter() {
                continue;
            }
            let profile = &self.vm.exit_profiles[self.index];
            let entered = self.vm.hw.counter_ticks();
            if let Some(at) = exited {
                profile.exit(self.exit_class, entered.wrapping_sub(at));
            }
            // SAFETY: the load (`VcpuMachine::load`) set this CPU's stage-2
            // translation and traps for this VM, so the guest reaches only
            // its own memory.
            let kind = unsafe { self.machine.enter(&mut self.regs) };
            let at = self.vm.hw.counter_ticks();
            profile.guest(at.wrapping_sub(entered));
            exited = Some(at);
            self.exit_class = ExitClass::Other;
            self.vm.run_state.leave();
            let flow = self.handle_exit(kind)?;
            if matches!(flow, Flow::SystemOff | Flow::SystemReset) {
                return Ok(flow);
            }
            self.send_kicks();
            if flow == Flow::Off {
                return Ok(flow);
            }
        }
    }

    /// While a migration throttles the VM (`vm::migration_plan`, auto-converge):
    /// once the vCPU ran a slice since its last hold, holds it at EL2 for
    /// the throttle's share of that time; a pause, a stop or the end of the
    /// throttle ends the hold at once.
    fn obey_throttle(&mut self) {
        let percent = self.vm.migration_throttle.load(Ordering::Acquire);
        if percent == 0 {
            self.throttle_since = 0;
            return;
        }
        let now = self.vm.hw.counter_ticks();
        if self.throttle_since == 0 {
            self.throttle_since = now;
            return;
        }
        let frequency = self.vm.hw.counter_frequency();
        let ran = now.wrapping_sub(self.throttle_since);
        if u128::from(ran) * 1_000_000 < u128::from(THROTTLE_SLICE_US) * u128::from(frequency) {
            return;
        }
        let until = now.saturating_add(throttle_hold_ticks(percent, ran));
        let mut spins = 0u32;
        while self.vm.migration_throttle.load(Ordering::Acquire) != 0
            && self.vm.run_state.get() == Requested::Running
            && !self.vm.is_stopping()
        {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) && self.vm.hw.counter_ticks() >= until {
                break;
            }
            core::hint::spin_loop();
        }
        self.throttle_since = self.vm.hw.counter_ticks();
    }

    /// Handles the exit `kind` the guest just took.
    pub(crate) fn handle_exit(&mut self, kind: ExitKind) -> Result<Flow, StopReason> {
        let unexpected = match kind {
            ExitKind::Sync => return self.handle_sync(),
            ExitKind::Irq => {
                self.bump(Counter::ExitsIrq);
                // `host_interrupts` names the first interrupt it takes.
                self.exit_class = ExitClass::IrqOther;
                self.needs_fill = true;
                self.host_interrupts(false)?;
                return Ok(Flow::Resume);
            }
            ExitKind::Fiq => UnexpectedExit::Fiq,
            ExitKind::SError => UnexpectedExit::SError,
        };
        Err(StopReason::UnexpectedExit {
            kind: unexpected,
            pc: self.regs.pc,
            esr: self.regs.esr,
        })
    }

    /// Handles a synchronous exit: `exit::sync` names it, the handler for its
    /// kind answers it.
    fn handle_sync(&mut self) -> Result<Flow, StopReason> {
        let exit =
            sync_exit::classify(self.regs.esr, self.regs.pstate, self.regs.pc, self.regs.far)?;
        if let Some(counter) = exit.counter() {
            self.bump(counter);
        }
        // Aborts and system registers name their class more closely.
        self.exit_class = exit.exit_class();
        match exit {
            SyncExit::ConditionFailed => {
                self.skip_trapped_instruction();
                Ok(Flow::Resume)
            }
            SyncExit::DataAbort(abort) => self.data_abort(abort),
            SyncExit::InstructionAbort(abort) => self.instruction_abort(abort),
            // ELR_EL2 already points after the HVC.
            SyncExit::Hvc => self.guest_call(),
            SyncExit::Smc => {
                // A trapped SMC returns to the SMC itself: step over it.
                self.skip_trapped_instruction();
                self.guest_call()
            }
            SyncExit::SysReg(access) => {
                self.sysreg(access)?;
                Ok(Flow::Resume)
            }
            SyncExit::Wfx => {
                // Nothing can be pending for the guest yet: WFI completes at once.
                self.skip_trapped_instruction();
                Ok(Flow::Resume)
            }
            SyncExit::Unemulated => {
                self.inject_undefined()?;
                Ok(Flow::Resume)
            }
        }
    }
}
