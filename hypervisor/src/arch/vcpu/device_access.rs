//! Emulated device accesses: a data abort in the UART's or the virtual GIC's
//! window, completed on the device model and stepped over.

use super::Vcpu;
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::exit::mmio;
use crate::runtime::vm_instance::GuestUart;
use crate::vm::event_log::Event;

impl Vcpu {
    pub(super) fn uart_access(
        &mut self,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        if write {
            let value = mmio::store_value(access, self.reg(access.register)) as u32;
            let result = self.vm.uart.lock().device.write(offset, value);
            match result {
                Ok(Some(byte)) => self.vm.console_byte(byte),
                Ok(None) => {}
                Err(e) => self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("UART write ignored: {e:?}"),
                ),
            }
        } else {
            let result = {
                let mut uart = self.vm.uart.lock();
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
                    self.log_event(
                        Event::DeviceAccess,
                        log::Level::Warn,
                        format_args!("UART read as zero: {e:?}"),
                    );
                    0
                }
            };
            if let Some(value) = mmio::load_result(access, raw) {
                self.set_reg(access.register, value);
            }
        }
        self.update_uart_line()?;
        self.skip_trapped_instruction();
        Ok(Flow::Resume)
    }

    /// A guest access to the virtual GIC's distributor or redistributors.
    pub(super) fn gic_access(
        &mut self,
        write: bool,
        access: DataAccess,
        ipa: u64,
    ) -> Result<Flow, StopReason> {
        self.fold()?;
        self.needs_fill = true;
        if write {
            let value = mmio::store_value(access, self.reg(access.register));
            let result = self
                .vm
                .vgic
                .lock()
                .mmio_write_from(self.index, ipa, access.size, value);
            match result {
                Ok(kicks) => self.absorb(kicks),
                Err(e) => self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("GIC write of {value:#x} at IPA {ipa:#x} ignored: {e:?}"),
                ),
            }
        } else {
            let result = self
                .vm
                .vgic
                .lock()
                .mmio_read_from(self.index, ipa, access.size);
            let raw = result.unwrap_or_else(|e| {
                self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("GIC read at IPA {ipa:#x} as zero: {e:?}"),
                );
                0
            });
            if let Some(value) = mmio::load_result(access, raw) {
                self.set_reg(access.register, value);
            }
        }
        self.skip_trapped_instruction();
        Ok(Flow::Resume)
    }
}
