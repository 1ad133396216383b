//! The machine-wide side of the VMs' virtio devices: one `NetSwitch` for
//! every VM of the machine, and the VMs by index (the owners of its ports,
//! and the machine a control VM's monitor port acts on,
//! `runtime::control_port`).
//!
//! A port's owner (opaque to the switch) is the owning VM's index; the hub
//! keeps the VMs by index, so its [`PortSink`] ([`HubDelivery`]: the hub
//! and the sending context's collector handles) finds the receiving VM of
//! a frame and delivers it there (`runtime::virtio_io::deliver_frame`:
//! under that VM's device lock, into that VM's memory, its SPI injected).
//! A migration moves a port to the destination's index; a stop or restart
//! detaches it.
//!
//! The hub is made before the VMs (each VM attaches its port when it is
//! created) and lives as long as the machine: `runtime::cpu_start` leaks one, the
//! host tests make one per fake machine.

use crate::devices::virtio::net_switch::{NetSwitch, PortId, PortSink};
use crate::runtime::Hardware;
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::virtio_io;
use crate::runtime::vm_instance::Vm;
use alloc::vec::Vec;
use spin::RwLock;

/// The switch and the VMs on it.
pub struct DeviceHub<H: Hardware> {
    switch: NetSwitch,
    vms: RwLock<Vec<Option<&'static Vm<H>>>>,
}

impl<H: Hardware> Default for DeviceHub<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: Hardware> DeviceHub<H> {
    /// A hub with no network and no VM.
    pub fn new() -> Self {
        Self {
            switch: NetSwitch::new(),
            vms: RwLock::new(Vec::new()),
        }
    }

    /// The switch.
    pub fn switch(&self) -> &NetSwitch {
        &self.switch
    }

    /// Records `vm` as the owner its index names.
    pub fn register(&self, vm: &'static Vm<H>) {
        let mut vms = self.vms.write();
        if vms.len() <= vm.index {
            vms.resize(vm.index + 1, None);
        }
        vms[vm.index] = Some(vm);
    }

    /// The owner value of `vm`'s ports.
    pub const fn owner_of(vm: &Vm<H>) -> u64 {
        vm.index as u64
    }

    /// Every VM registered, by index.
    pub fn vms(&self) -> Vec<&'static Vm<H>> {
        self.vms.read().iter().flatten().copied().collect()
    }

    /// The VM `owner` names.
    pub fn vm(&self, owner: u64) -> Option<&'static Vm<H>> {
        let index = usize::try_from(owner).ok()?;
        self.vms.read().get(index).copied().flatten()
    }
}

/// Where the switch hands the frames a context sends: the hub's VMs,
/// written into with that context's handles on their collectors.
pub struct HubDelivery<'a, H: Hardware> {
    /// The hub whose VMs own the ports.
    pub hub: &'a DeviceHub<H>,
    /// The sending context's handles (a vCPU's, kept across frames).
    pub handles: &'a CollectorHandles,
}

impl<H: Hardware> PortSink for HubDelivery<'_, H> {
    fn deliver(&self, _port: PortId, owner: u64, frame: &[u8]) -> bool {
        self.hub
            .vm(owner)
            .is_some_and(|vm| virtio_io::deliver_frame(vm, frame, self.handles))
    }
}
