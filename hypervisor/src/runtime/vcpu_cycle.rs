//! The life of one vCPU on its CPU, from boot to the end of the machine:
//! it runs whenever the guest starts it with PSCI `CPU_ON`, waits again
//! after `CPU_OFF`, and acts on how each run ended. The one place that ends
//! a VM: a vCPU's run returns a `Flow` or a `StopReason`
//! (`crate::exit::flow`), and [`run_vcpu`] stops the VM or powers it off
//! (the machine powers off with its last VM, `runtime::vm_table`), resets
//! the machine when its only VM asks, or restarts the VM alone when it is
//! one of several.
//!
//! # Halting and restarting
//!
//! A vCPU whose VM is ending or restarting leaves the guest (or its wait)
//! and *halts* here: its guest timers off, counted halted in the VM's
//! `vm::lifecycle`, waiting on its CPU (still serving this CPU's host
//! interrupts, so the console CPU keeps serving the console). The halted
//! vCPU that finds every vCPU halted and a restart requested rebuilds the
//! VM (`runtime::restart`) and hands vCPU 0 its boot request; every halted
//! vCPU then waits for `CPU_ON` again, as at boot.
//!
//! The vCPU itself (entering the guest, its interrupts, its timers) is the
//! machine's: [`CpuVcpu`], which `arch` implements and the host tests fake.

use crate::exit::flow::{Flow, StopReason};
use crate::runtime::Hardware;
use crate::runtime::live_migration;
use crate::runtime::restart;
use crate::runtime::vm_instance::Vm;
use crate::runtime::vm_table::VmTable;
use crate::vm::lifecycle::AfterRebuild;
use crate::vm::power::BootRequest;
use crate::vm::run_state::Requested;

/// What the cycle needs of a vCPU on its CPU.
pub trait CpuVcpu {
    /// Runs the guest from `boot` until the vCPU turns off, halts or its VM
    /// ends.
    fn run(&mut self, boot: BootRequest) -> Result<Flow, StopReason>;
    /// Handles this CPU's pending host interrupts while the vCPU is off.
    fn handle_interrupts_while_off(&mut self) -> Result<(), StopReason>;
    /// Turns the vCPU's guest timers off for a halt.
    fn quiesce_for_halt(&mut self);
    /// Leaves the halt: the vCPU is off and waits for `CPU_ON`.
    fn end_halt(&mut self);
}

/// Runs vCPU `index` of `vm` on this CPU: from `first` if given, then
/// whenever the guest starts it with CPU_ON, forever; halts while its VM
/// ends or restarts. The one place that acts on how a vCPU's run ended: it
/// stops the VM with the vCPU's [`StopReason`], powers the VM off, resets
/// the machine when its only VM asked, or restarts the VM.
pub fn run_vcpu<H: Hardware>(
    machine: &'static VmTable<H>,
    vm: &'static Vm<H>,
    index: usize,
    vcpu: &mut impl CpuVcpu,
    first: Option<BootRequest>,
) -> ! {
    let mut next = first;
    loop {
        if let Some(request) = next.take() {
            after_run(machine, vm, index, vcpu.run(request));
        }
        if vm.is_stopping() {
            halt(machine, vm, vcpu);
            continue;
        }
        if vm.run_state.get() == Requested::StopRequested {
            stop(machine, vm, index, &StopReason::StopRequested);
            continue;
        }
        // Handle first, then look for a request, then wait: a CPU_ON that
        // lands after the look leaves its kick pending, which ends the wait.
        if let Err(reason) = vcpu.handle_interrupts_while_off() {
            stop(machine, vm, index, &reason);
            continue;
        }
        // A migration into this VM runs on its vCPU 0's CPU while the
        // vCPU waits for its start (`runtime::live_migration`).
        if index == 0 {
            let job = vm.migration_job.lock().take();
            if let Some((source, options)) = job {
                live_migration::run(source, vm, options);
                continue;
            }
        }
        match vm.power.take_pending(index) {
            Some(request) => next = Some(request),
            None => vm.hw.wait_for_wakeup(),
        }
    }
}

/// Stops `vm` (vCPU `index` found `reason`) and tells the machine, unless
/// the VM was ending already.
pub fn stop<H: Hardware>(machine: &VmTable<H>, vm: &Vm<H>, index: usize, reason: &StopReason) {
    if vm.stop(index, reason) {
        machine.vm_ended();
    }
}

/// Acts on how a run of vCPU `index` ended: a vCPU that turned off waits for
/// the next `CPU_ON`; a halt waits for a restart; `SYSTEM_OFF` and a
/// [`StopReason`] end the VM; `SYSTEM_RESET` resets the machine when the VM
/// is its only one, else restarts the VM.
pub(super) fn after_run<H: Hardware>(
    machine: &VmTable<H>,
    vm: &'static Vm<H>,
    index: usize,
    end: Result<Flow, StopReason>,
) {
    match end {
        Ok(Flow::Resume | Flow::Off | Flow::Halt) => {}
        Ok(Flow::SystemOff) => {
            if vm.system_off(index) {
                machine.vm_ended();
            }
        }
        Ok(Flow::SystemReset) if machine.vms().len() == 1 => vm.system_reset(index),
        Ok(Flow::SystemReset) => {
            // Refused only while a restart is under way: this reset joins it.
            let _ = vm.request_restart(&format_args!("PSCI SYSTEM_RESET from vcpu{index}"));
        }
        Err(reason) => stop(machine, vm, index, &reason),
    }
}

/// Halts vCPU `vcpu` while its VM ends or restarts (see the module doc);
/// returns once the VM was rebuilt, the vCPU off and waiting for `CPU_ON`.
pub(super) fn halt<H: Hardware>(machine: &VmTable<H>, vm: &Vm<H>, vcpu: &mut impl CpuVcpu) {
    // A migration out of the VM left its end to be reported here, once
    // the destination runs.
    if vm.report_end_left_to_vcpus() {
        machine.vm_ended();
    }
    vcpu.quiesce_for_halt();
    let generation = vm.lifecycle.arrive();
    while vm.lifecycle.generation() == generation {
        if vm.lifecycle.claim_rebuild(vm.vcpus) {
            rebuild(machine, vm);
            continue;
        }
        // On the console CPU this serves the console; a halted vCPU has
        // nothing of its own pending (its timers are off).
        let _ = vcpu.handle_interrupts_while_off();
        if vm.lifecycle.generation() == generation {
            vm.hw.wait_for_wakeup();
        }
    }
    vcpu.end_halt();
}

/// Rebuilds `vm` (the caller claimed it, every vCPU halted) and starts it
/// again, or says why it cannot.
fn rebuild<H: Hardware>(machine: &VmTable<H>, vm: &Vm<H>) {
    let was_ended = vm.has_ended();
    match restart::rebuild(vm) {
        Ok(boot) => {
            if was_ended {
                machine.vm_restarted();
            }
            log::info!("vm{} ({}): restarted", vm.index, vm.name);
            match vm.lifecycle.finish() {
                AfterRebuild::Boot => {
                    if vm.power.request_on(0, boot).is_err() {
                        log::error!("vm{}: vcpu0 is not off after a restart", vm.index);
                    }
                }
                AfterRebuild::Stop => {
                    // A stop arrived during the restart: the fresh VM stops
                    // at its vCPUs' next look at the run state.
                    let _ = vm.run_state.request_stop();
                }
            }
            vm.hw.send_event();
            for other in 0..vm.vcpus {
                vm.kick(other);
            }
        }
        Err(e) => {
            log::error!("vm{} ({}): restart failed: {e}", vm.index, vm.name);
            vm.lifecycle.abandon();
            if !was_ended {
                // It halted for the restart without reporting an end: the
                // failed restart is its end.
                vm.report_end(&format_args!("restart failed: {e}"));
                machine.vm_ended();
            }
        }
    }
}
