//! What each CPU does after boot: the boot CPU creates the VM from the boot
//! payload and runs vCPU 0; every other CPU waits for the VM, then runs its
//! vCPU whenever the guest starts it with PSCI `CPU_ON`, and waits again
//! after `CPU_OFF`. CPUs beyond the VM's vCPUs halt.
//!
//! The one place where the boot sequence reaches the VM and vCPU layers.

use crate::arch::boot::firmware;
use crate::arch::boot::info::BootInfo;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::gic;
use crate::arch::vcpu::Vcpu;
use crate::arch::vm::{Vm, create_vm};
use crate::exit::flow::{Flow, StopReason};
use crate::exit::psci::BootRequest;
use spin::Once;

/// The VM, once the boot CPU created it.
static VM: Once<&'static Vm> = Once::new();

/// After boot, on the boot CPU: creates the VM and runs its vCPU 0.
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
    let (vm, boot) = match create_vm(info, bytes) {
        Ok(v) => v,
        Err(e) => {
            log::error!("cannot start a guest: {e}");
            log::info!("system off");
            firmware::system_off();
        }
    };
    VM.call_once(|| vm);
    sysreg::send_event();
    for cpu in 1..info.cpus_online {
        gic::kick(cpu);
    }
    vm.power.mark_on(0);
    run_cpu(vm, 0, Some(boot))
}

/// After boot, on a secondary CPU: waits for its vCPU to be started.
pub fn run_secondary_cpu(index: usize) -> ! {
    let vm = loop {
        if let Some(vm) = VM.get() {
            break *vm;
        }
        gic::discard_pending();
        if VM.get().is_none() {
            gic::wait_for_wakeup();
        }
    };
    if index >= vm.vcpus {
        firmware::halt();
    }
    run_cpu(vm, index, None)
}

/// Runs vCPU `index` on this CPU: from `first` if given, then whenever the
/// guest starts it with CPU_ON, forever. The one place that acts on how a
/// vCPU's run ended: it stops the VM with the vCPU's [`StopReason`], or
/// powers the machine off or resets it when the guest asked.
fn run_cpu(vm: &'static Vm, index: usize, first: Option<BootRequest>) -> ! {
    let mut vcpu = match Vcpu::new(vm, index) {
        Ok(vcpu) => vcpu,
        Err(reason) => vm.stop(index, &reason),
    };
    if let Some(request) = first {
        after_run(vm, index, vcpu.run(request));
    }
    loop {
        if vm.is_stopping() {
            firmware::halt();
        }
        // Handle first, then look for a request, then wait: a CPU_ON that
        // lands after the look leaves its kick pending, which ends the wait.
        if let Err(reason) = vcpu.handle_interrupts_while_off() {
            vm.stop(index, &reason);
        }
        match vm.power.take_pending(index) {
            Some(request) => after_run(vm, index, vcpu.run(request)),
            None => gic::wait_for_wakeup(),
        }
    }
}

/// Acts on how a run of vCPU `index` ended: a vCPU that turned off waits for
/// the next `CPU_ON`; the rest ends the VM.
fn after_run(vm: &'static Vm, index: usize, end: Result<Flow, StopReason>) {
    match end {
        Ok(Flow::Resume | Flow::Off) => {}
        Ok(Flow::SystemOff) => vm.system_off(index),
        Ok(Flow::SystemReset) => vm.system_reset(index),
        Err(reason) => vm.stop(index, &reason),
    }
}
