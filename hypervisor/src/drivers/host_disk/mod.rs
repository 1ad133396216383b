//! The host's disks: QEMU's own virtio-mmio block devices (or a board's),
//! driven with the `virtio-drivers` crate, each a
//! [`BlockBackend`](crate::devices::virtio::block_backend::BlockBackend)
//! the VMs' virtio-blk devices are served from. Generic over the crate's
//! `Transport` and `Hal`: `arch::host_disk` gives the MMIO transport, the
//! raw register reads and the DMA memory at EL2; the host tests a fake
//! device (`tests`).
//!
//! # Finding them
//!
//! `platform::virtio_mmio::windows` lists the device tree's virtio-mmio
//! windows, highest address first; boot maps them as device memory at EL2.
//! [`disks::start_disks`] then reads each window's magic value and DeviceID
//! (register `0x008`): the N-th window holding a block device (DeviceID 2)
//! is host disk N, so host disk 0 is the first `-device virtio-blk-device`
//! of QEMU's command line (QEMU plugs it into the highest transport). Each
//! disk gets a small virtio-blk request layer of its own
//! ([`blk_io::BlkIo`]) over the crate's `MmioTransport` (which handles the
//! legacy (version 1, QEMU 7.2's default) and the modern (version 2)
//! register layouts) and `VirtQueue`: the crate's `VirtIOBlk` sends one
//! data buffer per request, and a guest request over scattered pages would
//! cost one host request per page. The start is `VirtIOBlk::new`'s (reset,
//! features, configuration, queue 0, ready); the features taken are `RO`,
//! `FLUSH`, `SEG_MAX`, `EVENT_IDX` and `VERSION_1`; the queue has 256
//! descriptors where the device allows (else 16). The windows stay the
//! hypervisor's: guests get generated device trees and never see them.
//!
//! # Requests
//!
//! One request at a time per disk, under the disk's `spin::Mutex`, polled
//! to completion (the device's interrupt is not used): the driver adds the
//! request's chain (a 16-byte header, the data buffers, a status byte) to
//! the virtqueue, notifies and spins on the used ring. How a transfer over
//! guest buffers becomes requests (one data buffer per run of whole
//! sectors, straight from the guest's pages; one sector of bounce buffer
//! where a sector straddles two buffers; at most the device's `seg_max`
//! and the queue's free descriptors less two buffers, and 1 MiB, per
//! request) is [`request_plan`]: a Linux request of up to 254 pages is one
//! host request. A device error is logged with the disk, the sector, the
//! length and the number of buffers, and returned as `BlockError::Device`;
//! nothing panics. A device that never completes a request stalls its
//! caller (the crate's polling has no timeout).
//!
//! # Memory
//!
//! Buffers are handed to the device at their own address: the machine's
//! `Hal` (`arch::host_disk::El2Hal`) relies on the EL2 identity map, no
//! IOMMU and coherent DMA (see there).
//!
//! # Files
//!
//! [`request_plan`] (spans to requests), [`blk_io`] (requests to the
//! device), [`disks`] (finding, starting and checking the disks; a disk as a
//! block backend).

pub mod blk_io;
pub mod disks;
pub mod request_plan;

#[cfg(test)]
mod tests;
