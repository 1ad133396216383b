//! What each CPU does after boot: the boot CPU creates the VMs from the boot
//! payload and starts each VM's vCPU 0 on its CPU; every CPU a VM names runs
//! its vCPU whenever the guest starts it with PSCI `CPU_ON`, and waits again
//! after `CPU_OFF`. CPUs no VM names stay the hypervisor's and idle.
//!
//! The one place where the boot sequence reaches the VM and vCPU layers, and
//! the one place that ends a VM: a vCPU's run returns a `Flow` or a
//! `StopReason` (`crate::exit::flow`), and `run_cpu` stops the VM or powers it
//! off (the machine powers off with its last VM, `arch::machine`), or resets
//! the machine when its only VM asks.
//!
//! # Starting the VMs
//!
//! The boot CPU parses the payload, checks its CPU lists against the online
//! CPUs, creates every VM (any error: it says why and powers off), publishes
//! the [`Machine`] and kicks every other CPU out of its wait for it. Each
//! VM's vCPU 0 is then started: on the boot CPU directly if it is the boot
//! CPU's, else by a `CPU_ON`-like request in the VM's power states and a kick
//! of its CPU, so a VM whose vCPU 0 is not on the boot CPU boots too.

use crate::arch::boot::firmware;
use crate::arch::boot::info::BootInfo;
use crate::arch::control;
use crate::arch::cpu::percpu;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::gic;
use crate::arch::host_console;
use crate::arch::machine::Machine;
use crate::arch::monitor;
use crate::arch::vcpu::Vcpu;
use crate::arch::vm::{ResetOfOneVm, Vm, create_vm};
use crate::exit::flow::{Flow, StopReason};
use crate::vm::power::BootRequest;
use crate::vm::run_state::Requested;
use alloc::vec::Vec;
use boot_payload::VmsRef;
use spin::Once;

/// The machine, once the boot CPU created its VMs.
static MACHINE: Once<Machine> = Once::new();

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
    let bytes =
        unsafe { core::slice::from_raw_parts(payload.start as *const u8, payload.size() as usize) };
    let vms = VmsRef::parse(bytes).unwrap_or_else(|e| cannot_start(&e));
    if let Err(e) = vms.check_cpus(info.cpus_online as u32) {
        cannot_start(&e);
    }
    let mut created = Vec::with_capacity(vms.len());
    let mut boots = Vec::with_capacity(vms.len());
    for (index, vm) in vms.as_slice().iter().enumerate() {
        let (vm, boot) = create_vm(info, index, vm)
            .unwrap_or_else(|e| cannot_start(&format_args!("vm{index} ({}): {e}", vm.name)));
        created.push(vm);
        boots.push(boot);
    }
    let machine = Machine::new(created, info.cpus_online).unwrap_or_else(|e| cannot_start(&e));
    let machine = MACHINE.call_once(|| machine);
    // The console CPU is this one: the host UART's interrupt comes here.
    let poll_intid = info
        .platform
        .timer
        .map_or(DEFAULT_EL2_TIMER_INTID, |timer| timer.hyp_phys);
    if let Err(e) = monitor::start(machine, poll_intid) {
        cannot_start(&e);
    }
    control::start(machine);
    sysreg::send_event();
    let this_cpu = percpu::current().index();
    for cpu in (0..info.cpus_online).filter(|&cpu| cpu != this_cpu) {
        gic::kick(cpu);
    }
    let mut here = None;
    for (vm, boot) in machine.vms().iter().zip(boots) {
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
/// whenever the guest starts it with CPU_ON, forever. The one place that
/// acts on how a vCPU's run ended: it stops the VM with the vCPU's
/// [`StopReason`], powers the VM off, or resets the machine when its only
/// VM asked.
fn run_cpu(
    machine: &'static Machine,
    vm: &'static Vm,
    index: usize,
    first: Option<BootRequest>,
) -> ! {
    let mut vcpu = match Vcpu::new(vm, index) {
        Ok(vcpu) => vcpu,
        Err(reason) => stop(machine, vm, index, &reason),
    };
    if let Some(request) = first {
        after_run(machine, vm, index, vcpu.run(request));
    }
    loop {
        if vm.is_stopping() {
            host_console::park();
        }
        if vm.run_state.get() == Requested::StopRequested {
            stop(machine, vm, index, &StopReason::StopRequested);
        }
        // Handle first, then look for a request, then wait: a CPU_ON that
        // lands after the look leaves its kick pending, which ends the wait.
        if let Err(reason) = vcpu.handle_interrupts_while_off() {
            stop(machine, vm, index, &reason);
        }
        match vm.power.take_pending(index) {
            Some(request) => after_run(machine, vm, index, vcpu.run(request)),
            None => gic::wait_for_wakeup(),
        }
    }
}

/// Stops `vm` (vCPU `index` found `reason`) and tells the machine.
fn stop(machine: &Machine, vm: &Vm, index: usize, reason: &StopReason) -> ! {
    vm.stop(index, reason);
    machine.vm_ended()
}

/// Acts on how a run of vCPU `index` ended: a vCPU that turned off waits for
/// the next `CPU_ON`; the rest ends the VM. `SYSTEM_RESET` resets the machine
/// when the VM is its only one, else stops the VM (restarting one VM alone
/// is not implemented).
fn after_run(machine: &Machine, vm: &'static Vm, index: usize, end: Result<Flow, StopReason>) {
    match end {
        Ok(Flow::Resume | Flow::Off) => {}
        Ok(Flow::SystemOff) => {
            vm.system_off(index);
            machine.vm_ended()
        }
        Ok(Flow::SystemReset) if machine.vms().len() == 1 => vm.system_reset(index),
        Ok(Flow::SystemReset) => {
            vm.stop(index, &ResetOfOneVm);
            machine.vm_ended()
        }
        Err(reason) => stop(machine, vm, index, &reason),
    }
}
