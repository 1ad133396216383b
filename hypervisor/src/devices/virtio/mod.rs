//! virtio devices served by the hypervisor: virtio-mmio (version 2) over
//! split virtqueues, device models for virtio-net (on an in-hypervisor
//! switch), virtio-blk (over a host disk) and virtio-console.
//!
//! Everything here is pure code over two seams, so it builds and tests on
//! the host:
//!
//! - [`GuestMemory`](crate::devices::guest_memory::GuestMemory): the VM's RAM as the device sees it.
//!   Every guest-physical address a guest hands a device (a ring, a
//!   descriptor's buffer) is translated through the VM's memslots; a device
//!   never sees a host address the guest chose, and every write it makes
//!   marks the pages dirty where the slot logs.
//! - [`block_backend::BlockBackend`]: the storage behind a virtio-blk
//!   device (on QEMU, QEMU's own virtio-mmio disk, driven at EL2), or
//!   [`disk_window::DiskWindow`], a window of sectors of one.
//!
//! On top of them: [`virtqueue`] (the split ring, device side),
//! [`mmio_transport`] (the register file, status machine and the
//! [`mmio_transport::VirtioDevice`] trait), the device models [`console`],
//! [`blk`] and [`net`], and [`net_switch`] (the L2 switch between VMs'
//! virtio-net ports).

pub mod blk;
pub mod block_backend;
pub mod console;
pub mod disk_window;
pub mod mmio_transport;
pub mod net;
pub mod net_switch;
pub mod virtqueue;

#[cfg(test)]
mod fake_guest;
