//! What each CPU does after boot, on this machine: `runtime::cpu_start`
//! over [`El2`]. Here only what is the machine's: the payload read from the
//! memory the boot loader put it in, the static that publishes the VM
//! table, the vCPU made over [`El2Vcpu`], and powering off when the VMs
//! cannot start.

use crate::arch::boot::firmware;
use crate::arch::control_target;
use crate::arch::cpu::percpu;
use crate::arch::drivers::gic;
use crate::arch::hardware::VmTable;
use crate::arch::hardware::{EL2, El2, HOST_CONSOLE};
use crate::arch::host_console;
use crate::arch::vcpu::El2Vcpu;
use crate::control::console_mux::ConsoleError;
use crate::runtime::boot_info::BootInfo;
use crate::runtime::cpu_start::{self, CpuStart};
use spin::Once;

/// The machine, once the boot CPU created its VMs.
static MACHINE: Once<VmTable> = Once::new();

impl CpuStart for El2 {
    fn current_cpu(&self) -> usize {
        percpu::current().index()
    }

    fn discard_pending(&self) {
        gic::HOST_GIC.discard_pending();
    }

    fn start_services(
        &self,
        machine: &'static VmTable,
        poll_intid: u32,
    ) -> Result<(), ConsoleError> {
        host_console::start(machine, poll_intid)?;
        control_target::start(machine);
        Ok(())
    }
}

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
    let started =
        cpu_start::start_vms(&EL2, info, bytes, &MACHINE).unwrap_or_else(|e| cannot_start(&e));
    match started.here {
        Some((vm, vcpu, first)) => cpu_start::run_cpu(El2Vcpu, started.machine, vm, vcpu, first),
        None => HOST_CONSOLE.park(&EL2),
    }
}

/// After boot, on a secondary CPU: waits for the machine, then runs the vCPU
/// the machine gives this CPU, or idles if it gives none.
pub fn run_secondary_cpu(index: usize) -> ! {
    let machine = cpu_start::wait_for_machine(&EL2, &MACHINE);
    match machine.assignment(index) {
        Some((vm, vcpu)) => cpu_start::run_cpu(El2Vcpu, machine, vm, vcpu, None),
        None => HOST_CONSOLE.park(&EL2),
    }
}
