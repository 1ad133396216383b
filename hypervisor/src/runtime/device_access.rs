//! Emulated device accesses: a data abort in the UART's, the virtual GIC's
//! or a virtio-mmio device's window, completed on the device model and
//! stepped over. A virtio access runs under that device's lock with the
//! VM's RAM pinned by the vCPU's epoch handle, then its effects are acted
//! on (`runtime::virtio_io::settle`: the SPI, output drained) and a control
//! port's complete command lines run (`runtime::control_port`).
//!
//! The running vCPU's registers, list registers and interrupt lines are
//! reached through [`AccessingVcpu`], which the vCPU (`runtime::vcpu`)
//! implements over its CPU.

use crate::devices::vgic::{VcpuSet, VgicError};
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::exit::mmio;
use crate::runtime::Hardware;
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::control_port;
use crate::runtime::passed_devices;
use crate::runtime::virtio_devices::DeviceRole;
use crate::runtime::virtio_io;
use crate::runtime::vm_instance::{GuestUart, Vm};
use crate::vm::event_log::Event;
use crossbeam_epoch::LocalHandle;

/// What an emulated device access needs of the vCPU that made it.
pub trait AccessingVcpu<H: Hardware> {
    /// The vCPU's VM.
    fn vm(&self) -> &'static Vm<H>;
    /// The vCPU's index in its VM.
    fn index(&self) -> usize;
    /// The vCPU's handle on its VM's epoch collector (pins the memslots
    /// while a device reads or writes guest memory).
    fn epoch(&self) -> &LocalHandle;
    /// The vCPU's handles on the collectors of the VMs its devices write
    /// into (frames it sends, a control port's answers), kept for its life.
    fn collector_handles(&self) -> &CollectorHandles;
    /// The guest's general-purpose register `r` (31: the zero register).
    fn reg(&self, r: u8) -> u64;
    /// Sets the guest's general-purpose register `r` (31: discarded).
    fn set_reg(&mut self, r: u8, value: u64);
    /// Folds the list registers back into the vgic and marks them for a
    /// refill before the next entry.
    fn fold_for_refill(&mut self) -> Result<(), StopReason>;
    /// Takes the vCPUs the vgic asked to kick.
    fn absorb(&mut self, kicks: VcpuSet);
    /// Brings the UART's interrupt line to the vgic.
    fn update_uart_line(&mut self) -> Result<(), StopReason>;
    /// Steps the guest over the instruction that trapped.
    fn skip_trapped_instruction(&mut self);
}

/// Logs a line about a guest-driven device access through the VM's rate
/// limit.
fn warn<H: Hardware>(vcpu: &impl AccessingVcpu<H>, args: core::fmt::Arguments<'_>) {
    vcpu.vm()
        .log_event(vcpu.index(), Event::DeviceAccess, log::Level::Warn, args);
}

/// A guest access to the UART at `offset` in its window.
pub fn uart_access<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    write: bool,
    access: DataAccess,
    offset: u64,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    if write {
        let value = mmio::store_value(access, vcpu.reg(access.register)) as u32;
        let result = vm.uart.lock().device.write(offset, value);
        match result {
            Ok(Some(byte)) => vm.console_byte(byte),
            Ok(None) => {}
            Err(e) => warn(vcpu, format_args!("UART write ignored: {e:?}")),
        }
    } else {
        let result = {
            let mut uart = vm.uart.lock();
            let GuestUart {
                device, backlog, ..
            } = &mut *uart;
            let result = device.read(offset);
            backlog.drain_into(device);
            result
        };
        let raw = match result {
            Ok(v) => u64::from(v),
            Err(e) => {
                warn(vcpu, format_args!("UART read as zero: {e:?}"));
                0
            }
        };
        if let Some(value) = mmio::load_result(access, raw) {
            vcpu.set_reg(access.register, value);
        }
    }
    vcpu.update_uart_line()?;
    vcpu.skip_trapped_instruction();
    Ok(Flow::Resume)
}

/// A guest access to virtio-mmio device `device` at `offset` in its window.
pub fn virtio_access<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    device: u8,
    write: bool,
    access: DataAccess,
    offset: u64,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    let index = usize::from(device);
    let Some(virtio) = vm.virtio.get(index) else {
        // The bus names only the VM's own devices.
        warn(
            vcpu,
            format_args!("no virtio device {index}: access ignored"),
        );
        vcpu.skip_trapped_instruction();
        return Ok(Flow::Resume);
    };
    let vcpu_index = vcpu.index();
    if write {
        let value = mmio::store_value(access, vcpu.reg(access.register));
        let handles = vcpu.collector_handles();
        let kicks = virtio_io::with_memory(vm, vcpu.epoch(), |mem| {
            let effects = virtio
                .transport
                .lock()
                .write(offset, access.size, value, mem);
            virtio_io::settle(vm, index, Some(vcpu_index), mem, effects, handles)
        });
        match kicks {
            Some(kicks) => vcpu.absorb(kicks),
            None => warn(
                vcpu,
                format_args!("virtio {index}: guest memory unreadable, write ignored"),
            ),
        }
        if virtio.role == DeviceRole::ControlConsole {
            control_port::run_pending(vm, index, vcpu.collector_handles());
        }
    } else {
        let result = virtio.transport.lock().read(offset, access.size);
        let raw = result.unwrap_or_else(|error| {
            if virtio.first_access_error() {
                warn(
                    vcpu,
                    format_args!(
                        "virtio {} {index}: {error} (logged once per device)",
                        virtio.role.name()
                    ),
                );
            }
            0
        });
        if let Some(value) = mmio::load_result(access, raw) {
            vcpu.set_reg(access.register, value);
        }
    }
    vcpu.skip_trapped_instruction();
    Ok(Flow::Resume)
}

/// Completes a guest load from the virtual GIC or its ITS with `result`,
/// or with zero when the register refused the access (logged as `what`
/// `at`).
fn complete_gic_load<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    access: DataAccess,
    result: Result<u64, VgicError>,
    what: &str,
    at: u64,
) {
    let raw = result.unwrap_or_else(|e| {
        warn(vcpu, format_args!("{what} {at:#x} as zero: {e}"));
        0
    });
    if let Some(value) = mmio::load_result(access, raw) {
        vcpu.set_reg(access.register, value);
    }
}

/// A guest access to the virtual ITS at `offset` in its frames: a store may
/// run the command queue or translate a request, reading and writing the
/// ITS's tables in the VM's RAM (pinned by the vCPU's epoch handle), under
/// the GIC's lock. Dropped commands and a stalled queue are logged; the
/// `MAPD`s of passed PCIe devices are mirrored on the physical ITS.
pub fn its_access<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    write: bool,
    access: DataAccess,
    offset: u64,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    if write {
        // Commands may change LPIs this vCPU's list registers hold.
        vcpu.fold_for_refill()?;
        let value = mmio::store_value(access, vcpu.reg(access.register));
        let result = virtio_io::with_memory(vm, vcpu.epoch(), |memory| {
            vm.vgic.lock().its_write(offset, access.size, value, memory)
        });
        match result {
            Some(Ok(outcome)) => {
                vcpu.absorb(outcome.kicks);
                // Passed PCIe devices' DeviceIDs, mirrored on the physical
                // ITS (`runtime::passed_devices`).
                if !outcome.device_mappings.is_empty() {
                    passed_devices::sync_msi_devices(vm, &outcome.device_mappings);
                }
                if let Some((command, error)) = outcome.first_drop {
                    warn(
                        vcpu,
                        format_args!(
                            "ITS dropped {} of {} commands; the first, {}: {error}",
                            outcome.dropped,
                            outcome.commands,
                            command.name()
                        ),
                    );
                }
                if let Some(stall) = outcome.stall {
                    warn(vcpu, format_args!("ITS command queue stalled: {stall}"));
                }
            }
            Some(Err(e)) => warn(
                vcpu,
                format_args!("ITS write of {value:#x} at offset {offset:#x} ignored: {e}"),
            ),
            None => warn(
                vcpu,
                format_args!(
                    "ITS write at offset {offset:#x} ignored: the memslots are unreadable"
                ),
            ),
        }
    } else {
        let result = vm.vgic.lock().its_read(offset, access.size);
        complete_gic_load(vcpu, access, result, "ITS read at offset", offset);
    }
    vcpu.skip_trapped_instruction();
    Ok(Flow::Resume)
}

/// A guest access to the virtual GIC's distributor or redistributors.
pub fn gic_access<H: Hardware>(
    vcpu: &mut impl AccessingVcpu<H>,
    write: bool,
    access: DataAccess,
    ipa: u64,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    let index = vcpu.index();
    vcpu.fold_for_refill()?;
    if write {
        let value = mmio::store_value(access, vcpu.reg(access.register));
        let result = vm
            .vgic
            .lock()
            .mmio_write_from(index, ipa, access.size, value);
        match result {
            Ok(kicks) => vcpu.absorb(kicks),
            Err(e) => warn(
                vcpu,
                format_args!("GIC write of {value:#x} at IPA {ipa:#x} ignored: {e:?}"),
            ),
        }
        // The guest may have routed a passed device's SPI elsewhere.
        crate::runtime::passed_devices::sync_routes(vm);
    } else {
        let result = vm.vgic.lock().mmio_read_from(index, ipa, access.size);
        complete_gic_load(vcpu, access, result, "GIC read at IPA", ipa);
    }
    vcpu.skip_trapped_instruction();
    Ok(Flow::Resume)
}
