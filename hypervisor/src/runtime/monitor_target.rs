//! The console monitor's machine and the VMs' console input, over the VM
//! table: [`MonitorMachine`] implements `control::monitor::MonitorTarget`
//! (list, counters, pause, resume, stop, restart, migrate, memslots, dirty
//! logging, power off), [`VmConsoleInputs`] implements
//! `control::console::GuestInput` (a typed byte into the focused VM's PL011,
//! its interrupt line into the vgic; or into its virtio-console when the
//! guest's driver runs one). The EL2 side (the host UART, the poll
//! timer, the console CPU) is `runtime::host_console`.
//!
//! # Locks
//!
//! Lock order: the console lock, then a VM's UART lock (or a virtio
//! device's lock), then its vgic lock.
//! The monitor calls the VM table with the console lock held, so nothing it
//! calls writes guest output through the console: a stop is requested, and
//! the VM's own CPU ends the VM (and flushes its line).

use crate::control::console::GuestInput;
use crate::control::console_mux::VmId;
use crate::control::monitor::{DirtyPages, MonitorTarget, SlotInfo, SlotRequest, VmInfo, VmState};
use crate::runtime::Hardware;
use crate::runtime::dirty_log;
use crate::runtime::live_migration::{self, MigrateError};
use crate::runtime::virtio_io;
use crate::runtime::virtio_report;
use crate::runtime::vm_instance::{GuestUart, Vm};
use crate::runtime::vm_ops::{self, VmOpError};
use crate::vm::lifecycle::RestartError;
use crate::vm::migration_plan::MigrationOptions;
use crate::vm::run_state::{Requested, RunStateError};
use alloc::vec::Vec;
use core::fmt;
use memslot::{DirtyLogMode, Gfn, PAGE_SHIFT, SlotFlags, SlotId};

/// The VMs' PL011 receive paths.
pub struct VmConsoleInputs<H: Hardware> {
    vms: &'static [&'static Vm<H>],
}

impl<H: Hardware> VmConsoleInputs<H> {
    /// The receive paths of `vms` (VM id = index).
    pub const fn new(vms: &'static [&'static Vm<H>]) -> Self {
        Self { vms }
    }
}

impl<H: Hardware> GuestInput for VmConsoleInputs<H> {
    fn push_rx(&mut self, vm: VmId, byte: u8) -> bool {
        let Some(vm) = self.vms.get(vm.0) else {
            return false;
        };
        // A guest that reads its virtio-console (Linux on `hvc0`) gets the
        // keys there.
        if let Some(taken) = virtio_io::console_input(vm, &[byte]) {
            return taken;
        }
        let mut uart = vm.uart.lock();
        let GuestUart {
            device, backlog, ..
        } = &mut *uart;
        let taken = backlog.push(byte);
        backlog.drain_into(device);
        drop(uart);
        update_uart_line(vm);
        taken
    }
}

/// Gives `vm`'s vgic its PL011's interrupt level when it moved, from outside
/// the VM's vCPUs, and kicks the CPUs of the vCPUs that must see it. A vgic
/// refusal (it never refuses the UART's own SPI) is logged.
fn update_uart_line<H: Hardware>(vm: &Vm<H>) {
    let mut uart = vm.uart.lock();
    let level = uart.device.interrupt_pending();
    if uart.irq_level == level {
        return;
    }
    uart.irq_level = level;
    let result = vm.vgic.lock().set_spi_level(vm.uart_intid(), level);
    drop(uart);
    match result {
        Ok(kicks) => {
            for vcpu in kicks.iter() {
                vm.kick(vcpu);
            }
        }
        Err(error) => log::warn!("vm{}: UART line not updated: {error:?}", vm.index),
    }
}

/// Why the machine refused a monitor command.
#[derive(Debug)]
pub enum MonitorError {
    /// No VM with this index.
    NoSuchVm(usize),
    /// The VM's run state does not allow it (`resume` of a running VM, ...).
    State(RunStateError),
    /// A restart of the VM is under way already.
    Restart(RestartError),
    /// A migration was refused.
    Migrate(MigrateError),
    /// A memslot change failed.
    Slot(VmOpError),
    /// The slot's address or size is not a whole number of pages.
    Unaligned {
        /// The address or size.
        value: u64,
    },
}

impl fmt::Display for MonitorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSuchVm(vm) => write!(f, "no VM with id {vm}"),
            Self::State(e) => write!(f, "{e}"),
            Self::Restart(e) => write!(f, "{e}"),
            Self::Migrate(e) => write!(f, "{e}"),
            Self::Slot(e) => write!(f, "{e}"),
            Self::Unaligned { value } => {
                write!(f, "{value:#x} is not a multiple of the 4 KiB page size")
            }
        }
    }
}

impl core::error::Error for MonitorError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::State(e) => Some(e),
            Self::Slot(e) => Some(e),
            Self::Restart(e) => Some(e),
            Self::Migrate(e) => Some(e),
            _ => None,
        }
    }
}

/// The VM table as the monitor drives it.
pub struct MonitorMachine<'a, H: Hardware> {
    hw: &'static H,
    vms: &'a [&'static Vm<H>],
}

impl<'a, H: Hardware> MonitorMachine<'a, H> {
    /// The monitor's machine over `vms` (VM id = index) on `hw`.
    pub const fn new(hw: &'static H, vms: &'a [&'static Vm<H>]) -> Self {
        Self { hw, vms }
    }

    fn vm_at(&self, vm: VmId) -> Result<&'static Vm<H>, MonitorError> {
        self.vms
            .get(vm.0)
            .copied()
            .ok_or(MonitorError::NoSuchVm(vm.0))
    }
}

fn pages(value: u64) -> Result<u64, MonitorError> {
    if value.is_multiple_of(1 << PAGE_SHIFT) {
        Ok(value >> PAGE_SHIFT)
    } else {
        Err(MonitorError::Unaligned { value })
    }
}

/// Calls `each` with every memslot of `vm` by ascending id.
fn each_slot<H: Hardware>(vm: &Vm<H>, each: &mut dyn FnMut(SlotInfo)) -> Result<(), MonitorError> {
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm
        .memslots
        .slots(&guard)
        .map_err(|e| MonitorError::Slot(VmOpError::Memslot(e)))?;
    let mut list: Vec<SlotInfo> = slots
        .iter()
        .map(|slot| SlotInfo {
            id: slot.id(),
            ipa: slot.base_gfn().0 << PAGE_SHIFT,
            size: slot.npages() << PAGE_SHIFT,
            backing: slot.backing().0,
            flags: slot.flags(),
        })
        .collect();
    drop(guard);
    list.sort_by_key(|slot| slot.id.get());
    list.into_iter().for_each(each);
    Ok(())
}

impl<H: Hardware> MonitorTarget for MonitorMachine<'_, H> {
    type Error = MonitorError;

    fn vm_info(&self, vm: VmId) -> Result<VmInfo, MonitorError> {
        let vm = self.vm_at(vm)?;
        let mut memslots = 0;
        each_slot(vm, &mut |_| memslots += 1)?;
        let cpus = vm.cpus.iter().fold(0u64, |mask, &cpu| mask | 1 << cpu);
        Ok(VmInfo {
            state: match vm.requested_state() {
                _ if vm.is_restarting() => VmState::Restarting,
                Requested::Running => VmState::Running,
                Requested::Paused => VmState::Paused,
                Requested::StopRequested => VmState::Stopped,
            },
            vcpus: vm.vcpus as u32,
            cpus,
            ram_bytes: vm.ram.size(),
            memslots,
        })
    }

    fn counters(&self, vm: VmId, each: &mut dyn FnMut(&str, u64)) -> Result<(), MonitorError> {
        let vm = self.vm_at(vm)?;
        for (name, value) in vm.counters.snapshot(&vm.tlb.counts()) {
            each(name, value);
        }
        Ok(())
    }

    fn devices(&self, vm: VmId, each: &mut dyn FnMut(&str)) -> Result<(), MonitorError> {
        let vm = self.vm_at(vm)?;
        for (index, device) in vm.virtio.iter().enumerate() {
            each(&virtio_report::device_line(vm, index, device));
        }
        Ok(())
    }

    fn pause(&mut self, vm: VmId) -> Result<(), MonitorError> {
        self.vm_at(vm)?.request_pause().map_err(MonitorError::State)
    }

    fn resume(&mut self, vm: VmId) -> Result<(), MonitorError> {
        self.vm_at(vm)?.resume().map_err(MonitorError::State)
    }

    fn stop(&mut self, vm: VmId) -> Result<(), MonitorError> {
        self.vm_at(vm)?.request_stop().map_err(MonitorError::State)
    }

    /// Requested, not waited for: the VM's own CPUs halt and rebuild it
    /// (`runtime::vcpu_cycle`), and say so on the console.
    fn restart(&mut self, vm: VmId) -> Result<(), MonitorError> {
        self.vm_at(vm)?
            .request_restart(&"monitor restart")
            .map_err(MonitorError::Restart)
    }

    /// Posted to the destination's vCPU 0 (`runtime::live_migration`), which reports.
    fn migrate(
        &mut self,
        src: VmId,
        dst: VmId,
        options: MigrationOptions,
    ) -> Result<(), MonitorError> {
        live_migration::request(self.vm_at(src)?, self.vm_at(dst)?, options)
            .map_err(MonitorError::Migrate)
    }

    fn slots(&self, vm: VmId, each: &mut dyn FnMut(SlotInfo)) -> Result<(), MonitorError> {
        each_slot(self.vm_at(vm)?, each)
    }

    fn add_slot(&mut self, vm: VmId, request: SlotRequest) -> Result<u64, MonitorError> {
        let vm = self.vm_at(vm)?;
        let base = Gfn(pages(request.ipa)?);
        let npages = pages(request.size)?;
        vm_ops::create_slot(vm, request.id, base, npages, request.flags)
            .map_err(MonitorError::Slot)?;
        let mut backing = 0;
        each_slot(vm, &mut |slot| {
            if slot.id == request.id {
                backing = slot.backing;
            }
        })?;
        Ok(backing)
    }

    fn delete_slot(&mut self, vm: VmId, slot: SlotId) -> Result<(), MonitorError> {
        vm_ops::delete_slot(self.vm_at(vm)?, slot)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn move_slot(&mut self, vm: VmId, slot: SlotId, ipa: u64) -> Result<(), MonitorError> {
        let base = Gfn(pages(ipa)?);
        vm_ops::move_slot(self.vm_at(vm)?, slot, base)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn set_slot_flags(
        &mut self,
        vm: VmId,
        slot: SlotId,
        flags: SlotFlags,
    ) -> Result<(), MonitorError> {
        dirty_log::set_slot_flags(self.vm_at(vm)?, slot, flags).map_err(MonitorError::Slot)
    }

    fn collect_dirty(&mut self, vm: VmId, slot: SlotId) -> Result<DirtyPages, MonitorError> {
        let (ipa, bitmap) =
            dirty_log::collect(self.vm_at(vm)?, slot).map_err(MonitorError::Slot)?;
        Ok(DirtyPages { ipa, bitmap })
    }

    fn set_dirty_mode(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        chunk: u64,
    ) -> Result<(), MonitorError> {
        dirty_log::configure(self.vm_at(vm)?, mode, chunk).map_err(MonitorError::Slot)
    }

    fn power_off(&mut self) -> Result<(), MonitorError> {
        log::info!("monitor: power off");
        log::info!("system off");
        self.hw.system_off();
        Ok(())
    }
}
