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
//!    An identity-RAM VM (`ram=identity`) keeps its frames, zeroed: its
//!    RAM's guest address is their host address.
//! 4. The kernel, initrd and device tree are copied in again from the boot
//!    image the VM kept ([`BootImage`]), cleaned to the point of coherency
//!    without FEAT_S2FWB (the guest starts with its MMU off), and the
//!    instruction cache is invalidated.
//! 5. The virtual GIC, the PL011 (and its receive backlog), the virtio
//!    devices (their transports reset; a net device leaves the switch
//!    while the VM is rebuilt and joins again with a fresh port), the power
//!    states, the run state and the parked registers go back to their state
//!    at creation; a passed device's physical interrupts are deactivated
//!    and routed to vCPU 0's CPU again (`runtime::passed_devices`), and the
//!    rebooted guest resets the device. The counters keep counting across restarts
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
use core::fmt;
use memslot::{Gfn, PAGE_SHIFT, SlotFlags, SlotId, SlotSpec};

/// Why a VM could not be rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildError {
    /// A slot could not be deleted, or the RAM slot created again.
    Slots(VmOpError),
    /// The virtual GIC refused its own configuration.
    Vgic(VgicError),
    /// The switch refused the net device's port.
    Switch(SwitchError),
    /// An identity-RAM VM's RAM slot was deleted or changed at run time:
    /// its frames are gone, and other frames would sit at other addresses.
    IdentityRamGone,
}

impl fmt::Display for RebuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Slots(e) => write!(f, "guest memory: {e}"),
            Self::Vgic(e) => write!(f, "virtual GIC: {e}"),
            Self::Switch(e) => write!(f, "network switch: {e}"),
            Self::IdentityRamGone => f.write_str(
                "its identity-mapped RAM slot was deleted or changed at run time, so its RAM cannot be placed at its host address again",
            ),
        }
    }
}

impl core::error::Error for RebuildError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Slots(e) => Some(e),
            Self::Vgic(e) => Some(e),
            Self::Switch(e) => Some(e),
            Self::IdentityRamGone => None,
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
    let specs = vm_ops::slot_specs(vm).map_err(RebuildError::Slots)?;
    let ram_slot = SlotId::new(RAM_SLOT).map_err(|e| RebuildError::Slots(VmOpError::Memslot(e)))?;
    let base_gfn = Gfn::from_ipa(vm.ram.start);
    let npages = vm.ram.size() >> PAGE_SHIFT;
    // Identity RAM stays on its frames (its IPA is their address).
    let mut identity_frames = None;
    for spec in specs {
        if vm.identity_ram && spec.backing.0 == vm.ram.start && spec.npages == npages {
            vm_ops::unmap_slot(vm, spec.id).map_err(RebuildError::Slots)?;
            identity_frames = Some(spec);
        } else {
            vm_ops::delete_slot(vm, spec.id).map_err(RebuildError::Slots)?;
        }
    }
    if vm.identity_ram {
        let spec = identity_frames.ok_or(RebuildError::IdentityRamGone)?;
        vm_ops::recreate_slot(
            vm,
            SlotSpec {
                id: ram_slot,
                base_gfn,
                npages,
                backing: spec.backing,
                flags: SlotFlags::NONE,
            },
        )
        .map_err(RebuildError::Slots)?;
    } else {
        vm_ops::create_slot(vm, ram_slot, base_gfn, npages, SlotFlags::NONE)
            .map_err(RebuildError::Slots)?;
    }
    let backing = ram_backing(vm, ram_slot)?;
    load_boot_image(vm, &vm.boot, backing);
    vm.vgic.reset().map_err(RebuildError::Vgic)?;
    crate::runtime::passed_devices::reset(vm);
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
