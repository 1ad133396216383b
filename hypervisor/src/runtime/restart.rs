//! Rebuilding a VM in place for a restart (`vm::lifecycle` says who runs it
//! and when: one of the VM's own CPUs, with every vCPU of the VM halted).
//!
//! # Steps
//!
//! 1. The VM's unfinished console line is written out.
//! 2. Every memslot is deleted with `vm_ops::delete_slot`: each unmaps its
//!    IPA range at stage 2 with one deferred range flush (a VM with only its
//!    RAM slot is emptied with one flush) and frees its backing. The stage 2
//!    keeps only what is not guest RAM (a GICv2 host's `GICV` window).
//! 3. The RAM slot is created again as at boot (slot 0, the VM's RAM range,
//!    no flags): fresh host frames, zeroed, so nothing of the previous run
//!    survives, whatever the control interface did to the slots meanwhile.
//! 4. The kernel, initrd and device tree are copied in again from the boot
//!    image the VM kept ([`BootImage`]), cleaned to the point of coherency
//!    without FEAT_S2FWB (the guest starts with its MMU off), and the
//!    instruction cache is invalidated.
//! 5. The virtual GIC, the PL011 (and its receive backlog), the virtio
//!    devices (their transports reset; a net device leaves the switch
//!    while the VM is rebuilt and joins again with a fresh port), the power
//!    states, the run state and the parked registers go back to their state
//!    at creation. The counters keep counting across restarts
//!    (`restarts` counts them).
//!
//! Each vCPU's CPU state (EL1 registers, timers, list registers) is reset by
//! its next `CPU_ON`, as for every start of a vCPU.

use crate::devices::pl011::{Pl011, RxBacklog};
use crate::devices::vgic::VgicError;
use crate::devices::virtio::net_switch::SwitchError;
use crate::runtime::Hardware;
use crate::runtime::device_hub::DeviceHub;
use crate::runtime::vm_instance::{BootImage, GuestUart, Vm};
use crate::runtime::vm_ops::{self, VmOpError};
use crate::vm::counters::Counter;
use crate::vm::power::BootRequest;
use alloc::vec::Vec;
use core::fmt;
use memslot::{Gfn, PAGE_SHIFT, SlotFlags, SlotId};

/// Why a VM could not be rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildError {
    /// A slot could not be deleted, or the RAM slot created again.
    Slots(VmOpError),
    /// The virtual GIC refused its own configuration.
    Vgic(VgicError),
    /// The switch refused the net device's port.
    Switch(SwitchError),
}

impl fmt::Display for RebuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Slots(e) => write!(f, "guest memory: {e}"),
            Self::Vgic(e) => write!(f, "virtual GIC: {e}"),
            Self::Switch(e) => write!(f, "network switch: {e}"),
        }
    }
}

impl core::error::Error for RebuildError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Slots(e) => Some(e),
            Self::Vgic(e) => Some(e),
            Self::Switch(e) => Some(e),
        }
    }
}

/// The slot the VM's RAM is in at boot.
const RAM_SLOT: u32 = 0;

/// Rebuilds `vm` (see the module doc) and returns vCPU 0's boot request.
/// Only with every vCPU of `vm` halted.
pub fn rebuild<H: Hardware>(vm: &Vm<H>) -> Result<BootRequest, RebuildError> {
    vm.flush_console_line();
    let switch = vm.device_hub.switch();
    vm.virtio.detach(switch);
    let ids: Vec<SlotId> = vm_ops::slot_specs(vm)
        .map_err(RebuildError::Slots)?
        .iter()
        .map(|spec| spec.id)
        .collect();
    for id in ids {
        vm_ops::delete_slot(vm, id).map_err(RebuildError::Slots)?;
    }
    let ram_slot = SlotId::new(RAM_SLOT).map_err(|e| RebuildError::Slots(VmOpError::Memslot(e)))?;
    let base_gfn = Gfn::from_ipa(vm.ram.start);
    vm_ops::create_slot(
        vm,
        ram_slot,
        base_gfn,
        vm.ram.size() >> PAGE_SHIFT,
        SlotFlags::NONE,
    )
    .map_err(RebuildError::Slots)?;
    let backing = ram_backing(vm, ram_slot)?;
    load_boot_image(vm, &vm.boot, backing);
    vm.vgic.reset().map_err(RebuildError::Vgic)?;
    *vm.uart.lock() = GuestUart {
        device: Pl011::new(),
        backlog: RxBacklog::new(),
        irq_level: false,
    };
    vm.virtio.reset();
    vm.reset_run_flags();
    vm.virtio
        .attach(switch, DeviceHub::<H>::owner_of(vm))
        .map_err(RebuildError::Switch)?;
    vm.counters.bump(Counter::Restarts);
    Ok(vm.boot.request)
}

/// The host address backing the RAM slot's first page.
fn ram_backing<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<u64, RebuildError> {
    vm_ops::slot_spec(vm, id)
        .map_err(RebuildError::Slots)?
        .map(|spec| spec.backing.0)
        .ok_or(RebuildError::Slots(VmOpError::NotMapped {
            ipa: vm.ram.start,
        }))
}

/// Copies the kernel, initrd and device tree into the RAM backed from
/// `backing` (the VM's RAM range, zeroed), as `create_vm` placed them.
fn load_boot_image<H: Hardware>(vm: &Vm<H>, image: &BootImage, backing: u64) {
    let host = |ipa: u64| memslot::HostPhysAddr(backing + (ipa - vm.ram.start));
    vm_ops::write_host(vm.hw, host(image.kernel_ipa), image.kernel, vm.fwb);
    if let (Some(ipa), Some(initrd)) = (image.initrd_ipa, image.initrd) {
        vm_ops::write_host(vm.hw, host(ipa), initrd, vm.fwb);
    }
    vm_ops::write_host(vm.hw, host(image.dtb_ipa), &image.dtb, vm.fwb);
    vm.hw.invalidate_icache_all();
}
