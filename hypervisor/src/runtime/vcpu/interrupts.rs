//! Interrupts around the run loop: refilling the list registers before an
//! entry, the timers' and the emulated UART's lines, kicks to other vCPUs,
//! and the host interrupts taken while the guest ran (or while the vCPU is
//! off).

use super::{Vcpu, VcpuMachine};
use crate::devices::timer::timer_line;
use crate::devices::vgic::VcpuSet;
use crate::drivers::gic::HostIrq;
use crate::exit::flow::{ListRegisterOp, StopReason};
use crate::runtime::Hardware;
use crate::runtime::passed_devices;
use crate::vm::exit_profile::{ExitClass, Work};
use crate::vm::run_state::Requested;
use crate::vocabulary::timers::TimerId;

impl<M: VcpuMachine> Vcpu<M> {
    /// Before an entry: re-samples the timer lines that need it (the vgic
    /// hears of a line only when it moved; a low line with its PPI unmasked
    /// needs no sampling, `TimerForward::needs_sample`), refills the list registers when something
    /// could have changed what they should hold, then kicks the vCPUs the
    /// exit made something deliverable to.
    ///
    /// A refill is needed after an IRQ exit (a kick, the maintenance
    /// interrupt, the timer), a GIC register access, a vgic change that named
    /// this vCPU, and a load. Otherwise the list registers still hold the
    /// best interrupts: whatever the guest did with them since the last fill
    /// (acknowledge, EOI) is folded back at the next fill, a level interrupt's
    /// EOI raises the maintenance interrupt, and another vCPU that pends
    /// something here kicks this CPU.
    pub(crate) fn prepare_entry(&mut self) -> Result<(), StopReason> {
        if self.lrs.is_none() {
            return Ok(());
        }
        for timer in TimerId::ALL {
            if !self.timers[timer.index()].needs_sample() {
                continue;
            }
            let line = timer_line(self.machine.timer_ctl(timer));
            if let Some(level) = self.timers[timer.index()].sample(line) {
                self.set_timer_line(timer, level)?;
                // The refill settles whether its host PPI, if active, is
                // still the guest's to deactivate.
                self.needs_fill = true;
            }
        }
        if self.needs_fill
            && let Some(lrs) = self.lrs.as_mut()
        {
            self.vm.exit_profiles[self.index].work(Work::ListRegisterFill);
            let mut vgic = self.vm.vgic.lock();
            let result = vgic.fill(self.index, lrs);
            let completed = vgic.take_hardware_completions(self.index);
            let idle = TimerId::ALL.map(|t| vgic.hardware_ppi_idle(self.index, t.guest_intid()));
            let idle_spis = vgic.take_hardware_spi_deactivations();
            let released = vgic.take_released();
            drop(vgic);
            self.absorb(released);
            passed_devices::deactivate_idle(self.vm, &idle_spis);
            if let Err(error) = result {
                return Err(StopReason::ListRegisters {
                    op: ListRegisterOp::Fill,
                    error,
                });
            }
            self.needs_fill = false;
            for timer in TimerId::ALL {
                let done = completed & (1 << timer.guest_intid()) != 0;
                if self.timers[timer.index()].after_fill(done, idle[timer.index()]) {
                    self.machine.deactivate_timer(timer);
                }
            }
        }
        self.send_kicks();
        Ok(())
    }

    /// Gives the vgic `timer`'s line level (its PPI on this vCPU).
    pub(super) fn set_timer_line(&mut self, timer: TimerId, level: bool) -> Result<(), StopReason> {
        let result = self
            .vm
            .vgic
            .lock()
            .set_ppi_level(self.index, timer.guest_intid(), level);
        match result {
            Ok(kicks) => {
                self.absorb(kicks);
                Ok(())
            }
            Err(error) => Err(StopReason::TimerLine { timer, error }),
        }
    }

    /// Folds and empties the list registers ([`VgicState::unload`]) for a
    /// vCPU that stops running here, and kicks the vCPUs that can now list
    /// an interrupt it held; `op` names the step in an error.
    ///
    /// [`VgicState::unload`]: crate::devices::vgic::VgicState::unload
    pub(super) fn unload(&mut self, op: ListRegisterOp) -> Result<(), StopReason> {
        let Some(lrs) = self.lrs.as_mut() else {
            return Ok(());
        };
        let mut vgic = self.vm.vgic.lock();
        let result = vgic.unload(self.index, lrs);
        let released = vgic.take_released();
        drop(vgic);
        self.absorb(released);
        self.send_kicks();
        result.map_err(|error| StopReason::ListRegisters { op, error })
    }

    /// Copies the list registers back into the vgic (before a GIC register
    /// access reads or changes the model).
    pub(super) fn fold(&mut self) -> Result<(), StopReason> {
        let Some(lrs) = self.lrs.as_mut() else {
            return Ok(());
        };
        let mut vgic = self.vm.vgic.lock();
        let result = vgic.fold(self.index, lrs);
        let released = vgic.take_released();
        drop(vgic);
        self.absorb(released);
        result.map_err(|error| StopReason::ListRegisters {
            op: ListRegisterOp::Fold,
            error,
        })
    }

    /// Takes the vCPUs a vgic operation says to kick; this vCPU among them
    /// means its own list registers need a refill.
    pub(super) fn absorb(&mut self, kicks: VcpuSet) {
        if kicks.contains(self.index) {
            self.needs_fill = true;
        }
        self.kicks = self.kicks.union(kicks);
    }

    /// Kicks every CPU whose vCPU has something new (not this one: it
    /// refills before its next entry anyway).
    pub(crate) fn send_kicks(&mut self) {
        let kicks = core::mem::take(&mut self.kicks).without(self.index);
        for vcpu in kicks.iter() {
            self.vm.kick(vcpu);
        }
    }

    /// Drives the emulated PL011's interrupt line from its state; the vgic
    /// hears of it only when the level moved (the UART lock is held across,
    /// so vCPUs cannot reorder their updates; the vgic lock nests inside it).
    pub(super) fn update_uart_line(&mut self) -> Result<(), StopReason> {
        let mut uart = self.vm.uart.lock();
        let level = uart.device.interrupt_pending();
        if uart.irq_level == level {
            return Ok(());
        }
        uart.irq_level = level;
        let result = self
            .vm
            .vgic
            .lock()
            .set_spi_level(self.vm.uart_intid(), level);
        drop(uart);
        match result {
            Ok(kicks) => {
                self.absorb(kicks);
                Ok(())
            }
            Err(error) => Err(StopReason::UartLine(error)),
        }
    }

    /// While the vCPU is off: handles what is pending for this CPU (the
    /// console's bytes still reach the PL011; a fired timer's PPI stays
    /// active until the next load), so that waiting for a wake-up does not
    /// end at once.
    pub fn handle_interrupts_while_off(&mut self) -> Result<(), StopReason> {
        if self.machine.gic_is_up() {
            self.host_interrupts(true)?;
        }
        Ok(())
    }

    /// Acknowledges and handles the pending host interrupts: all of them
    /// with `drain` (the vCPU is not about to enter), else one: the common
    /// IRQ exit has one interrupt pending, and a second one still pending
    /// exits again right after the entry, so an exit saves the acknowledge
    /// that would only read "spurious" (each acknowledge is a CPU-interface
    /// access, serialising under emulation). The maintenance interrupt is a
    /// level that stays high until the list registers are refilled, so it
    /// ends the loop either way: the refill comes before the next entry. A
    /// timer's PPI only has its priority dropped (see `crate::devices::timer`);
    /// every other interrupt is finished (dropped and deactivated).
    pub(super) fn host_interrupts(&mut self, drain: bool) -> Result<(), StopReason> {
        let maintenance = self.machine.maintenance_intid();
        let timers = self.machine.timer_intids();
        let uart = self.vm.host_uart_intid;
        loop {
            let (intid, ack) = self.machine.acknowledge();
            let irq = HostIrq::classify(intid, maintenance, timers, uart);
            if self.exit_class == ExitClass::IrqOther {
                let passed = matches!(irq, HostIrq::Unexpected(intid) if passed_devices::owns(self.vm, intid));
                self.exit_class = ExitClass::of_host_irq(irq, passed);
            }
            match irq {
                HostIrq::Spurious => return Ok(()),
                HostIrq::Maintenance => {
                    self.machine.end_of_interrupt(ack);
                    return Ok(());
                }
                // The refill before the next entry is all it needs.
                HostIrq::Kick => {}
                HostIrq::Timer(timer) => {
                    self.machine.drop_priority(ack);
                    if self.timers[timer.index()].fired() {
                        self.set_timer_line(timer, true)?;
                    }
                    if !drain {
                        return Ok(());
                    }
                    continue;
                }
                HostIrq::UartReceive => self.machine.console_input(),
                // A passed device's: left active for the guest to
                // deactivate (`runtime::passed_devices`).
                HostIrq::Unexpected(intid) if passed_devices::owns(self.vm, intid) => {
                    self.machine.drop_priority(ack);
                    let kicks = passed_devices::deliver(self.vm, intid)?;
                    self.absorb(kicks);
                    if !drain {
                        return Ok(());
                    }
                    continue;
                }
                // A passed PCIe device's MSI: an LPI has no active state,
                // the priority drop ends it.
                HostIrq::Lpi(intid) => {
                    self.machine.drop_priority(ack);
                    let kicks = passed_devices::deliver_lpi(self.vm, intid, &self.epoch);
                    self.absorb(kicks);
                    if !drain {
                        return Ok(());
                    }
                    continue;
                }
                HostIrq::Unexpected(intid) if self.machine.is_console_poll_timer(intid) => {
                    self.machine.console_poll_tick();
                }
                HostIrq::Unexpected(other) => log::warn!(
                    "vm{} vcpu{}: unexpected host interrupt {other}",
                    self.vm.index,
                    self.index
                ),
            }
            self.machine.end_of_interrupt(ack);
            if !drain {
                return Ok(());
            }
        }
    }

    /// Before an entry: holds the vCPU at EL2 while the console monitor
    /// has its VM paused (`crate::vm::run_state`), handling its host
    /// interrupts (on the console CPU: the console's too) and waiting for a
    /// kick in between; a stop request ends the run. The maintenance
    /// interrupt is disabled meanwhile (its level stays high until a refill,
    /// which comes after the pause) and the list registers refilled after.
    pub(super) fn wait_while_paused(&mut self) -> Result<(), StopReason> {
        match self.vm.run_state.get() {
            Requested::Running => return Ok(()),
            Requested::StopRequested => return Err(StopReason::StopRequested),
            Requested::Paused => {}
        }
        let maintenance = self.machine.maintenance_intid();
        self.machine.set_ppi_enabled(maintenance, false);
        // Registers the control interface may read and write while paused.
        *self.vm.parked[self.index].lock() = Some(self.regs.parked());
        let result = loop {
            if let Err(reason) = self.handle_interrupts_while_off() {
                break Err(reason);
            }
            // Ending or restarting: the run loop halts the vCPU.
            if self.vm.is_stopping() {
                break Ok(());
            }
            // A migration asks for this vCPU's whole state (`runtime::live_migration`).
            if self.vm.capture_requested() && self.vm.vcpu_states[self.index].lock().is_none() {
                match self.capture_state() {
                    Ok(state) => {
                        *self.vm.vcpu_states[self.index].lock() =
                            Some(alloc::boxed::Box::new(state));
                    }
                    Err(reason) => break Err(reason),
                }
            }
            // Then it helps copy the migration's last dirty pages.
            if self.vm.capture_requested() {
                crate::runtime::live_migration::help_stop_copy(self.vm);
            }
            match self.vm.run_state.get() {
                Requested::Running => break Ok(()),
                Requested::StopRequested => break Err(StopReason::StopRequested),
                Requested::Paused => self.vm.hw.wait_for_wakeup(),
            }
        };
        if let Some(parked) = self.vm.parked[self.index].lock().take() {
            self.regs.unpark(&parked);
        }
        self.machine.set_ppi_enabled(maintenance, true);
        self.needs_fill = true;
        result
    }

    /// Before the vCPU halts while its VM ends or restarts (`runtime::vcpu_cycle`):
    /// the guest's timers off and their interrupts masked and inactive, the
    /// maintenance interrupt disabled, so nothing of the guest interrupts
    /// this CPU any more; the next `CPU_ON` loads everything again.
    pub fn quiesce_for_halt(&mut self) {
        self.machine.stop_guest_timers();
        for timer in TimerId::ALL {
            self.machine.set_timer_masked(timer, true);
            self.machine.deactivate_timer(timer);
        }
        self.timers = [crate::devices::timer::TimerForward::new(); 2];
        let maintenance = self.machine.maintenance_intid();
        self.machine.set_ppi_enabled(maintenance, false);
    }

    /// After a halt, the VM restarted: the maintenance interrupt back on,
    /// the list registers refilled before the next entry.
    pub fn end_halt(&mut self) {
        let maintenance = self.machine.maintenance_intid();
        self.machine.set_ppi_enabled(maintenance, true);
        self.needs_fill = true;
    }
}
