//! The machine side of emulated device accesses (the UART's, the virtual
//! GIC's and the virtio-mmio devices' windows), handled by
//! `runtime::device_access`: the accessing vCPU's registers, list
//! registers and interrupt lines.

use super::Vcpu;
use crate::arch::hardware::{El2, Vm};
use crate::devices::vgic::VcpuSet;
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::device_access::{self, AccessingVcpu};

impl Vcpu {
    pub(super) fn uart_access(
        &mut self,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::uart_access(self, write, access, offset)
    }

    /// A guest access to the VM's virtio-mmio device `device`.
    pub(super) fn virtio_access(
        &mut self,
        device: u8,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::virtio_access(self, device, write, access, offset)
    }

    /// A guest access to a passed-through device's forwarded window.
    pub(super) fn passed_access(
        &mut self,
        write: bool,
        access: DataAccess,
        ipa: u64,
    ) -> Result<Flow, StopReason> {
        crate::runtime::passed_devices::forwarded_access(self, write, access, ipa)
    }

    /// A guest access to the virtual GIC's distributor or redistributors.
    pub(super) fn gic_access(
        &mut self,
        write: bool,
        access: DataAccess,
        ipa: u64,
    ) -> Result<Flow, StopReason> {
        device_access::gic_access(self, write, access, ipa)
    }

    /// A guest access to the virtual GIC's ITS, at `offset` in its frames.
    pub(super) fn its_access(
        &mut self,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::its_access(self, write, access, offset)
    }
}

impl AccessingVcpu<El2> for Vcpu {
    fn vm(&self) -> &'static Vm {
        self.vm
    }

    fn index(&self) -> usize {
        self.index
    }

    fn epoch(&self) -> &crossbeam_epoch::LocalHandle {
        &self.epoch
    }

    fn collector_handles(&self) -> &CollectorHandles {
        &self.collector_handles
    }

    fn reg(&self, r: u8) -> u64 {
        Vcpu::reg(self, r)
    }

    fn set_reg(&mut self, r: u8, value: u64) {
        Vcpu::set_reg(self, r, value);
    }

    fn fold_for_refill(&mut self) -> Result<(), StopReason> {
        self.fold()?;
        self.needs_fill = true;
        Ok(())
    }

    fn absorb(&mut self, kicks: VcpuSet) {
        Vcpu::absorb(self, kicks);
    }

    fn update_uart_line(&mut self) -> Result<(), StopReason> {
        Vcpu::update_uart_line(self)
    }

    fn skip_trapped_instruction(&mut self) {
        Vcpu::skip_trapped_instruction(self);
    }
}
