//! What each CPU does after boot: the boot CPU creates the VMs from the boot
//! payload and starts each VM's vCPU 0 on its CPU; every CPU a VM names runs
//! its vCPU whenever the guest starts it with PSCI `CPU_ON`, and waits again
//! after `CPU_OFF`. CPUs no VM names stay the hypervisor's and idle.
//!
//! The one place where the boot sequence reaches the VM and vCPU layers.
//! What a vCPU does on its CPU, how its runs end, and the halting and
//! restarting of VMs are `runtime::vcpu_cycle`, over [`Vcpu`].
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
use crate::arch::hardware::{EL2, El2, Vm};
use crate::arch::host_console;
use crate::arch::monitor_target;
use crate::arch::vcpu::{El2Vcpu, Vcpu};
use crate::runtime::boot_info::BootInfo;
use crate::runtime::device_hub::DeviceHub;
use crate::runtime::vcpu_cycle;
use crate::runtime::vm_instance::create_vm;
use crate::vm::power::BootRequest;
use alloc::boxed::Box;
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
    // The machine's network switch and the VMs its ports reach: made
    // before the VMs (each attaches its port), kept for the machine's life.
    let hub: &'static DeviceHub<El2> = Box::leak(Box::new(DeviceHub::new()));
    let mut created = Vec::with_capacity(vms.len());
    let mut boots = Vec::with_capacity(vms.len());
    for (index, vm) in vms.as_slice().iter().enumerate() {
        let (vm, boot) = create_vm(&EL2, info, index, vm, hub)
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

/// Runs vCPU `index` of `vm` on this CPU (`runtime::vcpu_cycle`): from
/// `first` if given, then whenever the guest starts it with CPU_ON, forever.
fn run_cpu(
    machine: &'static VmTable,
    vm: &'static Vm,
    index: usize,
    first: Option<BootRequest>,
) -> ! {
    let mut vcpu = match Vcpu::new(El2Vcpu, vm, index) {
        Ok(vcpu) => vcpu,
        Err(reason) => {
            // Without its vCPU this CPU can take no part in the VM, nor
            // in a restart of it.
            vcpu_cycle::stop(machine, vm, index, &reason);
            host_console::park()
        }
    };
    vcpu_cycle::run_vcpu(machine, vm, index, &mut vcpu, first)
}
