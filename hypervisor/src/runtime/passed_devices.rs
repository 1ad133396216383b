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
//! # MSIs
//!
//! A passed PCIe device's MSI lands on the host's physical ITS
//! (`crate::vm::msi_shadow` says why). Every `MAPD` the guest's virtual ITS
//! performs for a DeviceID on a passed bus is mirrored there
//! ([`sync_msi_devices`]): the DeviceID mapped with as many events, each
//! event a host LPI of the hypervisor's pool, all on the CPU of vCPU 0; a
//! `MAPD` with V = 0 unmaps it. A host LPI that fires ([`deliver_lpi`]) is
//! looked up and replayed as a translation request with that DeviceID and
//! EventID ([`crate::devices::vgic::VgicState::its_request`]): the guest's
//! own ITS mappings decide which LPI and vCPU it becomes. Counted as
//! `passthrough_msis`.
//!
//! # The VM's end and restart
//!
//! When the VM ends its SPIs are disabled and deactivated (`Vm::report_end`);
//! a restart deactivates them and routes them to vCPU 0's CPU again
//! ([`reset`]), and the rebooted guest resets its devices. Both unmap every
//! mirrored DeviceID from the physical ITS ([`release_msis`]).

use crate::devices::vgic::VcpuSet;
use crate::devices::vgic::its::DeviceMapping;
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::exit::mmio;
use crate::runtime::Hardware;
use crate::runtime::device_access::AccessingVcpu;
use crate::runtime::virtio_io;
use crate::runtime::vm_instance::Vm;
use crate::vm::counters::Counter;
use crate::vm::msi_shadow::{MsiShadow, ShadowDevice};
use crossbeam_epoch::LocalHandle;

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

/// Mirrors the `MAPD`s the guest's virtual ITS performed for DeviceIDs on
/// a passed PCI bus on the physical ITS (module doc).
pub fn sync_msi_devices<H: Hardware>(vm: &Vm<H>, mappings: &[DeviceMapping]) {
    if !vm.msi_passthrough {
        return;
    }
    for mapping in mappings
        .iter()
        .filter(|m| vm.passthrough.owns_requester(m.device))
    {
        let mut shadow = vm.msi_shadow.lock();
        if let Some(old) = shadow.remove(mapping.device) {
            vm.hw.msi_unmap_device(old.device, old.first, old.events);
        }
        let Some(events) = mapping.events.map(MsiShadow::events_to_map) else {
            continue;
        };
        let cpu = vm.cpu_of(0);
        match vm.hw.msi_map_device(mapping.device, events, cpu) {
            Some(first) => {
                shadow.insert(ShadowDevice {
                    device: mapping.device,
                    first,
                    events,
                });
                log::info!(
                    "vm{}: MSIs of DeviceID {:#x}: {events} event(s) on host LPIs {first}..{} at CPU {cpu}",
                    vm.index,
                    mapping.device,
                    first + events - 1
                );
            }
            None => log::warn!(
                "vm{}: DeviceID {:#x}: the host ITS cannot map {events} event(s): its MSIs are lost",
                vm.index,
                mapping.device
            ),
        }
    }
}

/// Host LPI `intid` fired on the CPU of `vm`'s vCPU 0 (its priority
/// dropped): replays it through the virtual ITS. Returns the vCPUs to kick.
pub fn deliver_lpi<H: Hardware>(vm: &Vm<H>, intid: u32, epoch: &LocalHandle) -> VcpuSet {
    let Some((device, event)) = vm.msi_shadow.lock().event_of(intid) else {
        log::warn!("vm{}: host LPI {intid} is no device's event", vm.index);
        return VcpuSet::EMPTY;
    };
    vm.counters.bump(Counter::PassthroughMsis);
    virtio_io::with_memory(vm, epoch, |memory| {
        vm.vgic.lock().its_request(device, event, memory)
    })
    .unwrap_or(VcpuSet::EMPTY)
}

/// Unmaps every mirrored DeviceID of `vm` from the physical ITS.
pub fn release_msis<H: Hardware>(vm: &Vm<H>) {
    let devices = vm.msi_shadow.lock().take_all();
    for device in devices {
        vm.hw
            .msi_unmap_device(device.device, device.first, device.events);
    }
}

/// The VM restarts (its vgic was reset): every physical SPI inactive and
/// routed to vCPU 0's CPU again, still enabled; no DeviceID mirrored.
pub fn reset<H: Hardware>(vm: &Vm<H>) {
    release_msis(vm);
    let cpu = vm.cpu_of(0);
    let mut routes = vm.passthrough_routes.lock();
    for (intid, route) in routes.iter_mut() {
        vm.hw.passthrough_spi_deactivate(*intid);
        vm.hw.passthrough_spi_route(*intid, cpu);
        *route = cpu;
    }
}
