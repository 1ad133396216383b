//! What each CPU does after boot: the boot CPU creates the VMs from the boot
//! payload and starts each VM's vCPU 0 on its CPU; every CPU a VM names runs
//! its vCPU whenever the guest starts it with PSCI `CPU_ON`, and waits again
//! after `CPU_OFF`. CPUs no VM names stay the hypervisor's and idle.
//!
//! The one place where the boot sequence reaches the VM and vCPU layers,
//! over the machine's [`Hardware`] and the few things more a CPU's start
//! needs of it ([`CpuStart`]). What a vCPU does on its CPU, how its runs
//! end, and the halting and restarting of VMs are `runtime::vcpu_cycle`.
//! The machine layer keeps what only it can do: reading the payload from
//! the memory the boot loader put it in, the static that publishes the VM
//! table, and making the vCPU of its CPU.
//!
//! # Starting the VMs
//!
//! The boot CPU ([`start_vms`]) parses the payload, checks its CPU lists
//! against the online CPUs, creates every VM (any error: the caller says why
//! and powers off), publishes the [`VmTable`], starts the console and the
//! control interface over it and kicks every other CPU out of its wait for
//! it. Each VM's vCPU 0 is then started: on the boot CPU directly if it is
//! the boot CPU's, else by a `CPU_ON`-like request in the VM's power states
//! and a kick of its CPU, so a VM whose vCPU 0 is not on the boot CPU boots
//! too. A secondary CPU waits for the table ([`wait_for_machine`]) and runs
//! the vCPU it assigns it ([`run_cpu`]) or idles.

use super::Hardware;
use super::boot_info::BootInfo;
use super::device_hub::DeviceHub;
use super::vcpu::{Vcpu, VcpuMachine};
use super::vcpu_cycle;
use super::vm_instance::{Vm, create_vm};
use super::vm_table::VmTable;
use crate::control::console_mux::ConsoleError;
use crate::vm::power::BootRequest;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use boot_payload::VmsRef;
use spin::Once;

/// The EL2 physical timer's PPI when the device tree has no timer node (the
/// architecture's recommended INTID).
pub const DEFAULT_EL2_TIMER_INTID: u32 = 26;

/// What a CPU's start needs of the machine besides [`Hardware`].
pub trait CpuStart: Hardware + Sized {
    /// The running CPU's logical number.
    fn current_cpu(&self) -> usize;
    /// Acknowledges and finishes every interrupt pending for this CPU,
    /// handling none (a CPU that waits and only needs to be woken).
    fn discard_pending(&self);
    /// Starts the host console (this CPU serves it, its poll timer on PPI
    /// `poll_intid`) and the control interface over `machine`.
    fn start_services(
        &self,
        machine: &'static VmTable<Self>,
        poll_intid: u32,
    ) -> Result<(), ConsoleError>;
}

/// Why the VMs cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError(String);

impl core::fmt::Display for StartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The VMs started by the boot CPU.
pub struct Started<H: Hardware> {
    /// The published VM table.
    pub machine: &'static VmTable<H>,
    /// The vCPU the boot CPU runs (its VM, its index, the boot request of a
    /// vCPU 0 it starts), if any.
    pub here: Option<(&'static Vm<H>, usize, Option<BootRequest>)>,
}

/// After boot, on the boot CPU: creates the VMs of `payload`, publishes
/// their table in `table` and starts each one's vCPU 0 (see the module
/// doc). Returns what the boot CPU runs.
pub fn start_vms<H: CpuStart>(
    hw: &'static H,
    info: &BootInfo,
    payload: &'static [u8],
    table: &'static Once<VmTable<H>>,
) -> Result<Started<H>, StartError> {
    let error = |e: &dyn core::fmt::Display| StartError(e.to_string());
    let vms = VmsRef::parse(payload).map_err(|e| error(&e))?;
    vms.check_cpus(info.cpus_online as u32)
        .map_err(|e| error(&e))?;
    // The machine's network switch and the VMs its ports reach: made
    // before the VMs (each attaches its port), kept for the machine's life.
    let hub: &'static DeviceHub<H> = Box::leak(Box::new(DeviceHub::new()));
    let mut created = Vec::with_capacity(vms.len());
    let mut boots = Vec::with_capacity(vms.len());
    for (index, vm) in vms.as_slice().iter().enumerate() {
        let (vm, boot) = create_vm(hw, info, index, vm, hub)
            .map_err(|e| StartError(format!("vm{index} ({}): {e}", vm.name)))?;
        created.push(vm);
        boots.push(boot);
    }
    let machine = VmTable::new(hw, created, info.cpus_online).map_err(|e| error(&e))?;
    let machine = table.call_once(|| machine);
    // The console CPU is this one: the host UART's interrupt comes here.
    let poll_intid = info
        .platform
        .timer
        .map_or(DEFAULT_EL2_TIMER_INTID, |timer| timer.hyp_phys);
    hw.start_services(machine, poll_intid)
        .map_err(|e| error(&e))?;
    hw.send_event();
    let this_cpu = hw.current_cpu();
    for cpu in (0..info.cpus_online).filter(|&cpu| cpu != this_cpu) {
        hw.kick(cpu);
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
            here = Some((*vm, 0, Some(boot)));
        } else if vm.power.request_on(0, boot).is_ok() {
            hw.send_event();
            vm.kick(0);
        }
    }
    let here = here.or_else(|| {
        machine
            .assignment(this_cpu)
            .map(|(vm, vcpu)| (vm, vcpu, None))
    });
    Ok(Started { machine, here })
}

/// After boot, on a secondary CPU: waits until the boot CPU published the
/// VM table in `table`, discarding the interrupts (kicks) that wake it.
pub fn wait_for_machine<H: CpuStart>(
    hw: &H,
    table: &'static Once<VmTable<H>>,
) -> &'static VmTable<H> {
    loop {
        if let Some(machine) = table.get() {
            return machine;
        }
        hw.discard_pending();
        if table.get().is_none() {
            hw.wait_for_wakeup();
        }
    }
}

/// Runs vCPU `index` of `vm` on this CPU, made over `cpu`
/// (`runtime::vcpu_cycle`): from `first` if given, then whenever the guest
/// starts it with CPU_ON, forever. Without its vCPU this CPU can take no
/// part in the VM, nor in a restart of it: the VM stops and the CPU parks.
pub fn run_cpu<M: VcpuMachine>(
    cpu: M,
    machine: &'static VmTable<M::Hw>,
    vm: &'static Vm<M::Hw>,
    index: usize,
    first: Option<BootRequest>,
) -> ! {
    let mut vcpu = match Vcpu::new(cpu, vm, index) {
        Ok(vcpu) => vcpu,
        Err(reason) => {
            vcpu_cycle::stop(machine, vm, index, &reason);
            vm.hw.park()
        }
    };
    vcpu_cycle::run_vcpu(machine, vm, index, &mut vcpu, first)
}
