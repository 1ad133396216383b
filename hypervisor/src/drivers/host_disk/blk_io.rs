//! virtio-blk requests to one host disk over `virtio-drivers`' transport
//! and virtqueue, generic over both (the machine gives an MMIO transport
//! and its `Hal`; the host tests a fake device).
//!
//! # The algorithm
//!
//! [`BlkIo::start`] starts the device as the crate's `VirtIOBlk::new` does
//! (reset, acknowledge, the features of [`SUPPORTED_FEATURES`] the device
//! offers, guest page size), reads `capacity` and `seg_max` from the
//! configuration space in one consistent read, sets up queue 0 with 256
//! descriptors where the device allows (else 16) and marks the driver
//! ready. A request ([`BlkIo::request`]) is one chain: a 16-byte header
//! (type, sector), any number of data buffers, a status byte preset to a
//! value no device writes; it is added, notified, polled to completion
//! and taken back. The crate's `VirtIOBlk` sends one data buffer per
//! request; a chain of several lets a guest request over scattered pages
//! be one host request ([`SegmentIo`], planned by `request_plan`).

use super::request_plan::{Limits, MAX_REQUEST_BYTES, SegmentIo};
use crate::devices::virtio::blk::{
    F_FLUSH, F_RO, F_SEG_MAX, REQUEST_HEADER_LEN, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN, T_OUT,
};
use crate::devices::virtio::block_backend::BlockError;
use crate::devices::virtio::mmio_transport::{F_RING_EVENT_IDX, F_VERSION_1};
use alloc::boxed::Box;
use alloc::vec::Vec;
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, Transport};
use virtio_drivers::{Error, Hal, PAGE_SIZE};

/// The request queue (virtio-blk has one, number 0).
pub const QUEUE: u16 = 0;

/// Features the driver takes when the device offers them: `RO`, `FLUSH`,
/// `SEG_MAX` (the most data buffers per request), `EVENT_IDX` and
/// `VERSION_1` (the modern interface); no `SIZE_MAX` (a buffer may be any
/// length) and no indirect descriptors (the crate needs its `alloc`
/// feature for those).
pub const SUPPORTED_FEATURES: u64 = F_RO | F_FLUSH | F_SEG_MAX | F_RING_EVENT_IDX | F_VERSION_1;

/// Offsets in the block device's configuration space: `capacity` (le64,
/// read as two le32) and `seg_max` (le32).
pub const CONFIG_CAPACITY_LOW: usize = 0;
/// See [`CONFIG_CAPACITY_LOW`].
pub const CONFIG_CAPACITY_HIGH: usize = 4;
/// See [`CONFIG_CAPACITY_LOW`].
pub const CONFIG_SEG_MAX: usize = 12;

/// A status byte no device writes, so that an unanswered request reads as
/// failed.
const STATUS_UNSET: u8 = 0xff;

/// The virtqueue, as large as the device allows: 256 descriptors (a
/// request of up to 254 data buffers, what QEMU's `seg_max` allows) where
/// the device takes that many, otherwise 16 (the size `VirtIOBlk` uses).
/// Boxed: the queue keeps a shadow of its descriptors inline.
enum RequestQueue<H: Hal> {
    Large(Box<VirtQueue<H, 256>>),
    Small(Box<VirtQueue<H, 16>>),
}

impl<H: Hal> RequestQueue<H> {
    fn new(transport: &mut impl Transport, event_idx: bool) -> Result<Self, Error> {
        Ok(if transport.max_queue_size(QUEUE) >= 256 {
            Self::Large(Box::new(VirtQueue::new(
                transport, QUEUE, false, event_idx,
            )?))
        } else {
            Self::Small(Box::new(VirtQueue::new(
                transport, QUEUE, false, event_idx,
            )?))
        })
    }

    /// Descriptors free now.
    fn available_desc(&self) -> usize {
        match self {
            Self::Large(queue) => queue.available_desc(),
            Self::Small(queue) => queue.available_desc(),
        }
    }

    /// Adds one chain (`inputs` device-readable, then `outputs`
    /// device-writable), notifies, polls until the device used it and
    /// takes it back.
    fn add_notify_wait_pop<'a>(
        &mut self,
        inputs: &'a [&'a [u8]],
        outputs: &'a mut [&'a mut [u8]],
        transport: &mut impl Transport,
    ) -> Result<u32, Error> {
        match self {
            Self::Large(queue) => queue.add_notify_wait_pop(inputs, outputs, transport),
            Self::Small(queue) => queue.add_notify_wait_pop(inputs, outputs, transport),
        }
    }
}

/// virtio-blk requests to one device over the crate's transport and
/// virtqueue: a request is a chain of a 16-byte header, any number of
/// data buffers and a status byte, so a whole transfer over scattered
/// buffers is one request (`VirtIOBlk` takes one data buffer per request).
pub struct BlkIo<H: Hal, T: Transport> {
    /// The disk's number, for log lines.
    index: usize,
    transport: T,
    queue: RequestQueue<H>,
    /// Whether `FLUSH` was negotiated (without it, writes are durable when
    /// they complete).
    flush: bool,
    /// The device's `seg_max`, when it offers one.
    seg_max: Option<usize>,
    capacity: u64,
    read_only: bool,
    /// Requests sent so far.
    requests: u64,
}

impl<H: Hal, T: Transport> BlkIo<H, T> {
    /// Starts the device as `VirtIOBlk::new` does (the crate's
    /// `Transport::begin_init`: reset, acknowledge, negotiate features,
    /// guest page size), reads its configuration, sets up the queue and
    /// marks the driver ready.
    pub fn start(index: usize, mut transport: T) -> Result<Self, Error> {
        transport.set_status(DeviceStatus::empty());
        transport.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
        let features = transport.read_device_features() & SUPPORTED_FEATURES;
        transport.write_driver_features(features);
        transport.set_status(
            DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK,
        );
        transport.set_guest_page_size(PAGE_SIZE as u32);
        let (capacity, seg_max) = transport.read_consistent(|| {
            let low: u32 = transport.read_config_space(CONFIG_CAPACITY_LOW)?;
            let high: u32 = transport.read_config_space(CONFIG_CAPACITY_HIGH)?;
            let seg_max = if features & F_SEG_MAX != 0 {
                let seg_max: u32 = transport.read_config_space(CONFIG_SEG_MAX)?;
                Some(seg_max as usize).filter(|&n| n > 0)
            } else {
                None
            };
            Ok((u64::from(low) | u64::from(high) << 32, seg_max))
        })?;
        let queue = RequestQueue::new(&mut transport, features & F_RING_EVENT_IDX != 0)?;
        transport.finish_init();
        Ok(Self {
            index,
            transport,
            queue,
            flush: features & F_FLUSH != 0,
            seg_max,
            capacity,
            read_only: features & F_RO != 0,
            requests: 0,
        })
    }

    /// The disk's size in sectors, as its configuration says.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether the device offered `RO`.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Sends one request of type `kind` at `sector` with `readable` data
    /// (for the device to read) or `writable` data (for it to fill), waits
    /// for it and returns its status.
    pub fn request(
        &mut self,
        kind: u32,
        sector: u64,
        readable: &[&[u8]],
        writable: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        let mut header = [0u8; REQUEST_HEADER_LEN as usize];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        let mut status = [STATUS_UNSET];
        self.requests += 1;
        {
            let mut inputs: Vec<&[u8]> = Vec::with_capacity(1 + readable.len());
            inputs.push(&header);
            inputs.extend_from_slice(readable);
            let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(writable.len() + 1);
            outputs.extend(writable.iter_mut().map(|buffer| &mut **buffer));
            outputs.push(&mut status);
            self.queue
                .add_notify_wait_pop(&inputs, &mut outputs, &mut self.transport)?;
        }
        match status[0] {
            S_OK => Ok(()),
            S_UNSUPP => Err(Error::Unsupported),
            _ => Err(Error::IoError),
        }
    }

    /// The device's `GET_ID` answer (zero padded), or `None` when it has
    /// none.
    pub fn device_id(&mut self) -> Option<[u8; 20]> {
        let mut id = [0u8; 20];
        self.request(T_GET_ID, 0, &[], &mut [&mut id[..]]).ok()?;
        (id[0] != 0).then_some(id)
    }

    /// Flushes the device's write cache when `FLUSH` was negotiated.
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.flush {
            self.request(T_FLUSH, 0, &[], &mut [])
        } else {
            Ok(())
        }
    }

    /// Logs a failed transfer and turns it into a [`BlockError`].
    fn failed(
        &self,
        what: &str,
        sector: u64,
        lens: impl Iterator<Item = usize>,
        e: Error,
    ) -> BlockError {
        let (count, len) = lens.fold((0, 0), |(n, sum), l| (n + 1, sum + l));
        log::error!(
            "host disk {}: {what} {len} bytes in {count} buffer(s) at sector {sector} failed: {e}",
            self.index
        );
        BlockError::Device
    }
}

impl<H: Hal, T: Transport> Drop for BlkIo<H, T> {
    fn drop(&mut self) {
        // The device must not use the queue's memory once it is freed.
        self.transport.queue_unset(QUEUE);
    }
}

impl<H: Hal, T: Transport> SegmentIo for BlkIo<H, T> {
    fn limits(&self) -> Limits {
        // The header and the status byte take a descriptor each.
        let free = self.queue.available_desc().saturating_sub(2);
        let segments = self.seg_max.map_or(free, |seg_max| seg_max.min(free));
        Limits::new(segments, MAX_REQUEST_BYTES)
    }

    fn read_segments(&mut self, sector: u64, buffers: &mut [&mut [u8]]) -> Result<(), BlockError> {
        self.request(T_IN, sector, &[], buffers)
            .map_err(|e| self.failed("reading", sector, buffers.iter().map(|b| b.len()), e))
    }

    fn write_segments(&mut self, sector: u64, buffers: &[&[u8]]) -> Result<(), BlockError> {
        self.request(T_OUT, sector, buffers, &mut [])
            .map_err(|e| self.failed("writing", sector, buffers.iter().map(|b| b.len()), e))
    }
}
