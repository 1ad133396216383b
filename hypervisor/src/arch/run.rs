//! What each CPU does after boot: the boot CPU creates the VMs from the boot
//! payload and starts each VM's vCPU 0 on its CPU; every CPU a VM names runs
//! its vCPU whenever the guest starts it with PSCI `CPU_ON`, and waits again
//! after `CPU_OFF`. CPUs no VM names stay the hypervisor's and idle.
//!
//! The one place where the boot sequence reaches the VM and vCPU layers, and
//! the one place that ends a VM: a vCPU's run returns a `Flow` or a
//! `StopReason` (`crate::exit::flow`), and `run_cpu` stops the VM or powers it
//! off (the machine powers off with its last VM, `runtime::vm_table`), resets
//! the machine when its only VM asks, or restarts the VM alone when it is one
//! of several.
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
//! # Starting the VMs
//!
//! The boot CPU parses the payload, checks its CPU lists against the online
//! CPUs, creates every VM (any error: it says why and powers off), publishes
//! the [`VmTable`] and kicks every other CPU out of its wait for it. Each
//! VM's vCPU 0 is then started: on the boot CPU directly if it is the boot
//! CPU's, else by a `CPU_ON`-like request in the VM's power states and a kick
//! of its CPU, so a VM whose vCPU 0 is not on the boot CPU boots too.

use crate::arch::boot::firmware;
use crate::arch::control_target;
use crate::arch::cpu::percpu;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::gic;
use crate::arch::hardware::VmTable;
use crate::arch::hardware::{EL2, Vm};
use crate::arch::host_console;
use crate::arch::monitor_target;
use crate::arch::vcpu::Vcpu;
use crate::exit::flow::{Flow, StopReason};
use crate::runtime::boot_info::BootInfo;
use crate::runtime::live_migration;
use crate::runtime::restart;
use crate::runtime::vm_instance::create_vm;
use crate::vm::lifecycle::AfterRebuild;
use crate::vm::power::BootRequest;
use crate::vm::run_state::Requested;
use alloc::vec::Vec;
use boot_payload::VmsRef;
use spin::Once;

/// The machine, once the boot CPU created its VMs.
static MACHINE: Once<VmTable> = Once::new();

/// The EL2 physical timer's PPI when the device tree has no timer node (the
/// architecture's recommended INTID).
const DEFAULT_EL2_TIMER_INTID: u32 = 26;

/// Says why the VMs cannot start and powers the machine off.
fn cannot_start(why: &dyn core::fmt::Display) -> ! {
    log::error!("cannot start a guest: {why}");
    log::info!("system off");
    firmware::system_off()
}

/// After boot, on the boot CPU: creates the VMs and starts each one's vCPU 0.
pub fn run_boot_cpu(info: &BootInfo) -> ! {
    let Some(payload) = info.payload else {
        log::info!("no guest payload found (pass a cpio archive with -initrd); nothing to run");
        log::info!("system off");
        firmware::system_off();
    };
    // SAFETY: the boot loader placed the payload there; it was excluded from
    // the frame allocator and is covered by the identity map.
    // It stays there for good: VMs keep their kernels in it for restarts.
    let bytes: &'static [u8] =
        unsafe { core::slice::from_raw_parts(payload.start as *const u8, payload.size() as usize) };
    let vms = VmsRef::parse(bytes).unwrap_or_else(|e| cannot_start(&e));
    if let Err(e) = vms.check_cpus(info.cpus_online as u32) {
        cannot_start(&e);
    }
    let mut created = Vec::with_capacity(vms.len());
    let mut boots = Vec::with_capacity(vms.len());
    for (index, vm) in vms.as_slice().iter().enumerate() {
        let (vm, boot) = create_vm(&EL2, info, index, vm)
            .unwrap_or_else(|e| cannot_start(&format_args!("vm{index} ({}): {e}", vm.name)));
        created.push(vm);
        boots.push(boot);
    }
    let machine =
        VmTable::new(&EL2, created, info.cpus_online).unwrap_or_else(|e| cannot_start(&e));
    let machine = MACHINE.call_once(|| machine);
    // The console CPU is this one: the host UART's interrupt comes here.
    let poll_intid = info
        .platform
        .timer
        .map_or(DEFAULT_EL2_TIMER_INTID, |timer| timer.hyp_phys);
    if let Err(e) = monitor_target::start(machine, poll_intid) {
        cannot_start(&e);
    }
    control_target::start(machine);
    sysreg::send_event();
    let this_cpu = percpu::current().index();
    for cpu in (0..info.cpus_online).filter(|&cpu| cpu != this_cpu) {
        gic::kick(cpu);
    }
    let mut here = None;
    for (vm, boot) in machine.vms().iter().zip(boots) {
        if !vm.start {
            log::info!(
                "vm{} ({}): not started (start=0): waiting as a migration destination",
                vm.index,
                vm.name
            );
            continue;
        }
        if vm.cpu_of(0) == this_cpu {
            vm.power.mark_on(0);
            here = Some((*vm, boot));
        } else if vm.power.request_on(0, boot).is_ok() {
            sysreg::send_event();
            vm.kick(0);
        }
    }
    match (here, machine.assignment(this_cpu)) {
        (Some((vm, boot)), _) => run_cpu(machine, vm, 0, Some(boot)),
        (None, Some((vm, vcpu))) => run_cpu(machine, vm, vcpu, None),
        (None, None) => host_console::park(),
    }
}

/// After boot, on a secondary CPU: waits for the machine, then runs the vCPU
/// the machine gives this CPU, or idles if it gives none.
pub fn run_secondary_cpu(index: usize) -> ! {
    let machine = loop {
        if let Some(machine) = MACHINE.get() {
            break machine;
        }
        gic::discard_pending();
        if MACHINE.get().is_none() {
            gic::wait_for_wakeup();
        }
    };
    match machine.assignment(index) {
        Some((vm, vcpu)) => run_cpu(machine, vm, vcpu, None),
        None => host_console::park(),
    }
}

/// Runs vCPU `index` of `vm` on this CPU: from `first` if given, then
/// whenever the guest starts it with CPU_ON, forever; halts while its VM
/// ends or restarts. The one place that acts on how a vCPU's run ended: it
/// stops the VM with the vCPU's [`StopReason`], powers the VM off, resets
/// the machine when its only VM asked, or restarts the VM.
fn run_cpu(
    machine: &'static VmTable,
    vm: &'static Vm,
    index: usize,
    first: Option<BootRequest>,
) -> ! {
    let mut vcpu = match Vcpu::new(vm, index) {
        Ok(vcpu) => vcpu,
        Err(reason) => {
            // Without its vCPU this CPU can take no part in the VM, nor
            // in a restart of it.
            stop(machine, vm, index, &reason);
            host_console::park()
        }
    };
    let mut next = first;
    loop {
        if let Some(request) = next.take() {
            after_run(machine, vm, index, vcpu.run(request));
        }
        if vm.is_stopping() {
            halt(machine, vm, &mut vcpu);
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
                live_migration::run(machine, source, vm, options);
                continue;
            }
        }
        match vm.power.take_pending(index) {
            Some(request) => next = Some(request),
            None => gic::wait_for_wakeup(),
        }
    }
}

/// Stops `vm` (vCPU `index` found `reason`) and tells the machine, unless
/// the VM was ending already.
fn stop(machine: &VmTable, vm: &Vm, index: usize, reason: &StopReason) {
    if vm.stop(index, reason) {
        machine.vm_ended();
    }
}

/// Acts on how a run of vCPU `index` ended: a vCPU that turned off waits for
/// the next `CPU_ON`; a halt waits for a restart; `SYSTEM_OFF` and a
/// [`StopReason`] end the VM; `SYSTEM_RESET` resets the machine when the VM
/// is its only one, else restarts the VM.
fn after_run(machine: &VmTable, vm: &'static Vm, index: usize, end: Result<Flow, StopReason>) {
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
fn halt(machine: &VmTable, vm: &Vm, vcpu: &mut Vcpu) {
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
            gic::wait_for_wakeup();
        }
    }
    vcpu.end_halt();
}

/// Rebuilds `vm` (the caller claimed it, every vCPU halted) and starts it
/// again, or says why it cannot.
fn rebuild(machine: &VmTable, vm: &Vm) {
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
            sysreg::send_event();
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
