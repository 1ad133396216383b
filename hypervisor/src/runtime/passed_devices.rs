//! The running side of passthrough (`vm::passthrough` is the plan): the
//! physical SPIs of the devices a VM owns, and the accesses to their
//! forwarded windows.
//!
//! # An interrupt's way
//!
//! The physical SPI is routed to the CPU of the vCPU the guest routes the
//! virtual one to ([`sync_routes`], after every guest write to its
//! distributor; vCPU 0's CPU at creation). When it fires, the CPU takes an
//! IRQ exit, acknowledges it and only drops its priority (the host runs
//! with `EOImode` 1): the physical interrupt stays active, so it cannot
//! fire again. [`deliver`] latches the linked virtual SPI pending and kicks
//! its target; the vgic lists it as a hardware interrupt, so the guest's
//! deactivation deactivates the physical one, which fires again if the
//! device still asserts it. When the guest will not deactivate it (its
//! pending state cleared, or listed as a software interrupt for EOI
//! maintenance), the fill says so and [`deactivate_idle`] does it.
//!
//! # Forwarded windows
//!
//! A window that shares its page with other devices is not mapped; each
//! access traps and [`forwarded_access`] performs exactly that access on
//! the device (the VM's MMIO bus only routes accesses that lie wholly
//! inside the window).
//!
//! # The VM's end and restart
//!
//! When the VM ends its SPIs are disabled and deactivated (`Vm::report_end`);
//! a restart deactivates them and routes them to vCPU 0's CPU again
//! ([`reset`]), and the rebooted guest resets its devices.

use crate::devices::vgic::VcpuSet;
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::exit::mmio;
use crate::runtime::Hardware;
use crate::runtime::device_access::AccessingVcpu;
use crate::runtime::vm_instance::Vm;
use crate::vm::counters::Counter;

/// Whether `intid` is a physical SPI of a device `vm` owns.
pub fn owns<H: Hardware>(vm: &Vm<H>, intid: u32) -> bool {
    !vm.passthrough.is_empty() && vm.passthrough.interrupts().any(|i| i.intid == intid)
}

/// Physical SPI `intid` of `vm`'s device fired (its priority dropped, left
/// active): latches the linked virtual SPI. Returns the vCPUs to kick.
pub fn deliver<H: Hardware>(vm: &Vm<H>, intid: u32) -> Result<VcpuSet, StopReason> {
    vm.counters.bump(Counter::PassthroughIrqs);
    vm.vgic
        .lock()
        .inject_hardware_spi(intid)
        .map_err(StopReason::PassthroughLine)
}

/// Deactivates the physical SPIs the last fill found left active for a
/// guest that will no longer deactivate them.
pub fn deactivate_idle<H: Hardware>(vm: &Vm<H>, idle: &[u32]) {
    for &intid in idle {
        vm.hw.passthrough_spi_deactivate(intid);
    }
}

/// Routes each physical SPI to the CPU of the vCPU the guest routes its
/// virtual SPI to (unchanged while the guest routes it to no vCPU).
pub fn sync_routes<H: Hardware>(vm: &Vm<H>) {
    if vm.passthrough.is_empty() {
        return;
    }
    let targets: alloc::vec::Vec<(u32, Option<usize>)> = {
        let vgic = vm.vgic.lock();
        vm.passthrough
            .interrupts()
            .map(|i| (i.intid, vgic.spi_target_of(i.intid)))
            .collect()
    };
    let mut routes = vm.passthrough_routes.lock();
    for (intid, target) in targets {
        let Some(cpu) = target.map(|vcpu| vm.cpu_of(vcpu)) else {
            continue;
        };
        if let Some(route) = routes.iter_mut().find(|(i, _)| *i == intid)
            && route.1 != cpu
        {
            route.1 = cpu;
            vm.hw.passthrough_spi_route(intid, cpu);
        }
    }
}

/// A guest access to a forwarded window at `ipa` (== the device's physical
/// address), performed on the device.
pub fn forwarded_access<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    write: bool,
    access: DataAccess,
    ipa: u64,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    if write {
        let value = mmio::store_value(access, vcpu.reg(access.register));
        vm.hw.device_write(ipa, access.size, value);
    } else {
        let raw = vm.hw.device_read(ipa, access.size);
        if let Some(value) = mmio::load_result(access, raw) {
            vcpu.set_reg(access.register, value);
        }
    }
    vcpu.skip_trapped_instruction();
    Ok(Flow::Resume)
}

/// The VM restarts (its vgic was reset): every physical SPI inactive and
/// routed to vCPU 0's CPU again, still enabled.
pub fn reset<H: Hardware>(vm: &Vm<H>) {
    let cpu = vm.cpu_of(0);
    let mut routes = vm.passthrough_routes.lock();
    for (intid, route) in routes.iter_mut() {
        vm.hw.passthrough_spi_deactivate(*intid);
        vm.hw.passthrough_spi_route(*intid, cpu);
        *route = cpu;
    }
}
