//! The host's disks: QEMU's own virtio-mmio block devices (or a board's),
//! driven at EL2 with the `virtio-drivers` crate, each a [`BlockBackend`]
//! the VMs' virtio-blk devices are served from.
//!
//! # Finding them
//!
//! `platform::virtio_mmio::windows` lists the device tree's virtio-mmio
//! windows, highest address first; boot maps them as device memory at EL2
//! (`boot::memory::init`). [`probe`] then reads each window's magic value
//! and DeviceID (register `0x008`): the N-th window holding a block device
//! (DeviceID 2) is host disk N, so host disk 0 is the first
//! `-device virtio-blk-device` of QEMU's command line (QEMU plugs it into
//! the highest transport). Each disk gets a small virtio-blk request
//! layer of its own (`BlkIo`) over the crate's `MmioTransport` (which
//! handles the legacy (version 1, QEMU 7.2's default) and the modern
//! (version 2) register layouts) and `VirtQueue`: the crate's `VirtIOBlk`
//! sends one data buffer per request, and a guest request over scattered
//! pages would cost one host request per page. The start is
//! `VirtIOBlk::new`'s (reset, features, configuration, queue 0, ready);
//! the features taken are `RO`, `FLUSH`, `SEG_MAX`, `EVENT_IDX` and
//! `VERSION_1`; the queue has 256 descriptors where the device allows
//! (else 16). The windows stay the hypervisor's: guests get generated
//! device trees and never see them.
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
//! request) is `drivers::host_disk`: a Linux request of up to 254 pages is
//! one host request. A device error is logged with the disk, the sector,
//! the length and the number of buffers, and returned as
//! [`BlockError::Device`]; nothing panics. A device that never completes a
//! request stalls its caller (the crate's polling has no timeout).
//!
//! # Memory: the `Hal`
//!
//! The EL2 stage-1 map is an identity map of all RAM (`boot::memory`), and
//! there is no IOMMU, so a buffer's address is the address the device's
//! DMA uses: `share` returns the buffer's own address and `unshare` does
//! nothing, whether the buffer is a guest page (a `HostSpan`), the stack or
//! the heap. Queue memory comes from the frame allocator, zeroed. This
//! relies on **coherent DMA**: the device reads and writes memory through
//! the CPUs' caches (QEMU's virtio devices do; the tree says
//! `dma-coherent`). On a board whose disk DMA does not snoop the caches,
//! `share` must clean the buffer to the point of coherency and `unshare`
//! invalidate it after a device write, and the virtqueue itself must be
//! mapped non-cacheable; a window without `dma-coherent` is logged.

use crate::arch::boot::memory::{FRAME_SIZE, alloc_frames, free_frames};
use crate::devices::guest_memory::HostSpan;
use crate::devices::virtio::blk::{
    F_FLUSH, F_RO, F_SEG_MAX, REQUEST_HEADER_LEN, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN, T_OUT,
};
use crate::devices::virtio::block_backend::{
    BlockBackend, BlockError, SECTOR_SIZE, check_transfer,
};
use crate::devices::virtio::mmio_transport::{F_RING_EVENT_IDX, F_VERSION_1};
use crate::drivers::host_disk::{self, Limits, MAX_REQUEST_BYTES, SegmentIo};
use crate::platform::virtio_mmio::VirtioMmioWindow;
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr::NonNull;
use spin::{Mutex, Once};
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::mmio::{MmioTransport, MmioVersion, VirtIOHeader};
use virtio_drivers::transport::{DeviceStatus, Transport};
use virtio_drivers::{BufferDirection, Error, Hal, PAGE_SIZE, PhysAddr};

/// The magic value at offset 0 of a virtio-mmio window ("virt").
const MAGIC: u32 = 0x7472_6976;
/// The DeviceID of a block device.
const DEVICE_ID_BLOCK: u32 = 2;
/// Offsets of the MagicValue and DeviceID registers.
const MAGIC_OFFSET: u64 = 0x000;
const DEVICE_ID_OFFSET: u64 = 0x008;

/// The `virtio-drivers` platform layer at EL2: frames for queues, the
/// identity map for everything else (see the module documentation).
pub struct El2Hal;

// SAFETY: `dma_alloc` hands out zeroed, page-aligned frames that the frame
// allocator gives to no one else until `dma_dealloc` returns them; their
// address is valid to dereference at EL2 (identity map of RAM).
// `mmio_phys_to_virt` returns the identity-mapped address (only used by the
// PCI transport). `share` returns the buffer's own address, which is what
// the device's DMA uses on an identity-mapped machine without an IOMMU.
unsafe impl Hal for El2Hal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let size = pages as u64 * FRAME_SIZE;
        match alloc_frames(size, FRAME_SIZE) {
            Some(addr) => {
                // SAFETY: the frames were just taken from the allocator, so
                // nothing else uses them; RAM is mapped read-write at its
                // own address.
                unsafe { core::ptr::write_bytes(addr as *mut u8, 0, size as usize) };
                // The allocator never hands out frame 0 as RAM on QEMU virt,
                // but a null address is reported as a failure all the same.
                match NonNull::new(addr as *mut u8) {
                    Some(ptr) => (addr, ptr),
                    None => (0, NonNull::dangling()),
                }
            }
            None => {
                log::error!("host disk: no frames left for {pages} page(s) of virtqueue");
                (0, NonNull::dangling())
            }
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, _vaddr: NonNull<u8>, pages: usize) -> i32 {
        free_frames(paddr, pages as u64 * FRAME_SIZE, FRAME_SIZE);
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).unwrap_or(NonNull::dangling())
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// The driver of one disk and what it needs per request.
struct Driver {
    io: BlkIo,
    /// The one sector through which straddling sectors go.
    bounce: [u8; SECTOR_SIZE as usize],
}

/// The request queue (virtio-blk has one, number 0).
const QUEUE: u16 = 0;

/// Features the driver takes when the device offers them: `RO`, `FLUSH`,
/// `SEG_MAX` (the most data buffers per request), `EVENT_IDX` and
/// `VERSION_1` (the modern interface); no `SIZE_MAX` (a buffer may be any
/// length) and no indirect descriptors (the crate needs its `alloc`
/// feature for those).
const SUPPORTED_FEATURES: u64 = F_RO | F_FLUSH | F_SEG_MAX | F_RING_EVENT_IDX | F_VERSION_1;

/// Offsets in the block device's configuration space: `capacity` (le64,
/// read as two le32) and `seg_max` (le32).
const CONFIG_CAPACITY_LOW: usize = 0;
const CONFIG_CAPACITY_HIGH: usize = 4;
const CONFIG_SEG_MAX: usize = 12;

/// A status byte no device writes, so that an unanswered request reads as
/// failed.
const STATUS_UNSET: u8 = 0xff;

/// The virtqueue, as large as the device allows: 256 descriptors (a
/// request of up to 254 data buffers, what QEMU's `seg_max` allows) where
/// the device takes that many, otherwise 16 (the size `VirtIOBlk` uses).
/// Boxed: the queue keeps a shadow of its descriptors inline.
enum RequestQueue {
    Large(Box<VirtQueue<El2Hal, 256>>),
    Small(Box<VirtQueue<El2Hal, 16>>),
}

impl RequestQueue {
    fn new(transport: &mut MmioTransport<'static>, event_idx: bool) -> Result<Self, Error> {
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
        transport: &mut MmioTransport<'static>,
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
struct BlkIo {
    /// The disk's number, for log lines.
    index: usize,
    transport: MmioTransport<'static>,
    queue: RequestQueue,
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

impl BlkIo {
    /// Starts the device as `VirtIOBlk::new` does (the crate's
    /// `Transport::begin_init`: reset, acknowledge, negotiate features,
    /// guest page size), reads its configuration, sets up the queue and
    /// marks the driver ready.
    fn start(index: usize, mut transport: MmioTransport<'static>) -> Result<Self, Error> {
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

    /// Sends one request of type `kind` at `sector` with `readable` data
    /// (for the device to read) or `writable` data (for it to fill), waits
    /// for it and returns its status.
    fn request(
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
    fn device_id(&mut self) -> Option<[u8; 20]> {
        let mut id = [0u8; 20];
        self.request(T_GET_ID, 0, &[], &mut [&mut id[..]]).ok()?;
        (id[0] != 0).then_some(id)
    }

    fn flush(&mut self) -> Result<(), Error> {
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

impl Drop for BlkIo {
    fn drop(&mut self) {
        // The device must not use the queue's memory once it is freed.
        self.transport.queue_unset(QUEUE);
    }
}

impl SegmentIo for BlkIo {
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

/// One host disk: a virtio-mmio block device the hypervisor drives.
pub struct HostDisk {
    index: usize,
    window: u64,
    capacity: u64,
    read_only: bool,
    id: [u8; 20],
    driver: Mutex<Driver>,
}

impl HostDisk {
    /// The physical address of its register window.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Its number (host disk N).
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many requests its driver has sent to the device.
    pub fn requests(&self) -> u64 {
        self.driver.lock().io.requests
    }
}

impl BlockBackend for HostDisk {
    fn capacity_sectors(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        check_transfer(self.capacity, self.read_only, false, sector, spans)?;
        let mut driver = self.driver.lock();
        let Driver { io, bounce } = &mut *driver;
        // SAFETY: the trait's contract: the spans are guest RAM (identity
        // mapped read-write at EL2, `boot::memory`) that the caller
        // translated through the VM's memslots and lends, exclusively, for
        // this call; the device writes them by DMA before each request
        // returns.
        unsafe { host_disk::read_spans(io, bounce, sector, spans) }
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        check_transfer(self.capacity, self.read_only, true, sector, spans)?;
        let mut driver = self.driver.lock();
        let Driver { io, bounce } = &mut *driver;
        // SAFETY: as for `read`: identity-mapped guest RAM lent for the
        // call; the device only reads it.
        unsafe { host_disk::write_spans(io, bounce, sector, spans) }
    }

    fn flush(&self) -> Result<(), BlockError> {
        self.driver.lock().io.flush().map_err(|e| {
            log::error!("host disk {}: flush failed: {e}", self.index);
            BlockError::Device
        })
    }

    fn id(&self) -> [u8; 20] {
        self.id
    }
}

/// What [`probe`] found.
struct HostDisks {
    /// Block devices seen, usable or not: disk numbers stay those of QEMU's
    /// command line even when one of them fails to start.
    found: usize,
    /// The disks whose driver started.
    disks: Vec<HostDisk>,
}

static HOST_DISKS: Once<HostDisks> = Once::new();

/// Host disk `n` (0: the first disk QEMU was given), for a VM's virtio-blk
/// (whole, or through a `devices::virtio::disk_window::DiskWindow`);
/// `None` when there is no such disk, its driver did not start, or
/// [`probe`] has not run.
pub fn host_disk(n: usize) -> Option<&'static dyn BlockBackend> {
    host_disk_entry(n).map(|d| d as &'static dyn BlockBackend)
}

/// Host disk `n` with its window address and number.
pub fn host_disk_entry(n: usize) -> Option<&'static HostDisk> {
    HOST_DISKS
        .get()
        .and_then(|table| table.disks.iter().find(|d| d.index == n))
}

/// How many block devices [`probe`] found (0 before it ran); disks
/// `0..host_disk_count()` exist unless their driver failed to start.
pub fn host_disk_count() -> usize {
    HOST_DISKS.get().map_or(0, |table| table.found)
}

/// Reads a 32-bit register of a mapped virtio-mmio window.
///
/// # Safety
///
/// `window` must be a virtio-mmio window mapped as device memory at EL2
/// and `offset` one of its header registers.
unsafe fn read_register(window: u64, offset: u64) -> u32 {
    // SAFETY: the caller guarantees a mapped device window; the header's
    // registers are 32-bit and 4-byte aligned, and reading them has no side
    // effect.
    unsafe { core::ptr::read_volatile((window + offset) as *const u32) }
}

/// Finds the host disks among `windows` (highest address first, mapped as
/// device memory by `boot::memory::init`), starts a driver on each, logs
/// one line per disk and a self-check read of its first sectors, and keeps
/// them for [`host_disk()`]. Runs once, on the boot CPU; a later call does
/// nothing and returns the same count.
pub fn probe(windows: &[VirtioMmioWindow]) -> usize {
    HOST_DISKS.call_once(|| start_disks(windows)).found
}

fn start_disks(windows: &[VirtioMmioWindow]) -> HostDisks {
    let mut disks = Vec::new();
    let mut found = 0;
    for window in windows {
        let base = window.regs.start;
        // SAFETY: boot mapped every window of the list as device memory.
        let (magic, device_id) = unsafe {
            (
                read_register(base, MAGIC_OFFSET),
                read_register(base, DEVICE_ID_OFFSET),
            )
        };
        if magic != MAGIC || device_id != DEVICE_ID_BLOCK {
            continue;
        }
        let index = found;
        found += 1;
        let Some(header) = NonNull::new(base as *mut VirtIOHeader) else {
            continue;
        };
        // SAFETY: the window is a virtio-mmio register window (its magic
        // value says so) of `regs.size()` bytes, mapped as device memory at
        // EL2 for the hypervisor's whole life, and handed to this one
        // transport only (`probe` runs once and skips nothing twice).
        let transport = match unsafe { MmioTransport::new(header, window.regs.size() as usize) } {
            Ok(t) => t,
            Err(e) => {
                log::error!("host disk {index} at {base:#x}: not usable: {e}");
                continue;
            }
        };
        let version = transport.version();
        let mut io = match BlkIo::start(index, transport) {
            Ok(io) => io,
            Err(e) => {
                log::error!("host disk {index} at {base:#x}: the driver did not start: {e}");
                continue;
            }
        };
        let id = io.device_id().unwrap_or_else(|| {
            let mut id = [0u8; 20];
            let name = alloc::format!("hostdisk{index}");
            let n = name.len().min(20);
            id[..n].copy_from_slice(&name.as_bytes()[..n]);
            id
        });
        let capacity = io.capacity;
        let read_only = io.read_only;
        log::info!(
            "host disk {index}: {capacity} sectors ({} MiB){} at {base:#x}",
            (capacity * SECTOR_SIZE) >> 20,
            if read_only { ", read-only" } else { "" }
        );
        let id_text = core::str::from_utf8(&id[..id.iter().position(|&b| b == 0).unwrap_or(20)])
            .unwrap_or("(not UTF-8)");
        log::info!(
            "host disk {index}: virtio-mmio {}, id \"{id_text}\", \
             up to {} data buffers per request",
            match version {
                MmioVersion::Legacy => "legacy (version 1)",
                MmioVersion::Modern => "version 2",
            },
            io.limits().max_segments
        );
        if !window.dma_coherent {
            log::warn!(
                "host disk {index}: the device tree does not say dma-coherent; \
                 the driver assumes coherent DMA"
            );
        }
        disks.push(HostDisk {
            index,
            window: base,
            capacity,
            read_only,
            id,
            driver: Mutex::new(Driver {
                io,
                bounce: [0; SECTOR_SIZE as usize],
            }),
        });
    }
    for disk in &disks {
        self_check(disk);
        if disk.id.starts_with(WRITE_CHECK_ID)
            && disk.id[WRITE_CHECK_ID.len()..].iter().all(|&b| b == 0)
        {
            write_check(disk);
        }
    }
    HostDisks { found, disks }
}

/// The `GET_ID` (QEMU: `-device virtio-blk-device,serial=...`) of a scratch
/// disk that the boot may write: the end-to-end test's way to exercise
/// writes, flushes and the bounce buffer at EL2. No other disk is ever
/// written at boot.
pub const WRITE_CHECK_ID: &[u8] = b"hv-write-check";

/// The sector the write check writes from.
pub const WRITE_CHECK_SECTOR: u64 = 8;

/// The byte the write check writes at `offset` of its 4 KiB.
pub fn write_check_byte(offset: usize) -> u8 {
    (offset * 13 + 5 + offset / 512) as u8
}

/// On a scratch disk ([`WRITE_CHECK_ID`]): writes 4 KiB at
/// [`WRITE_CHECK_SECTOR`] from three spans that are not host-contiguous
/// (700, 324 and 3072 bytes: a sector straddles the first two and goes
/// through the bounce buffer), flushes, reads them back through two others
/// (100 and 3996 bytes) and compares; logs the outcome and how many device
/// requests the write and the read took (one each: the spans are the data
/// buffers of one request). The end-to-end test then finds the bytes in
/// the image file.
fn write_check(disk: &HostDisk) {
    const LEN: usize = 4096;
    /// Where each piece sits in its buffer: one byte apart, so that the
    /// driver cannot join them into one host-contiguous span.
    fn scatter(buffer: &mut [u8], lens: &[u64]) -> Vec<HostSpan> {
        let base = buffer.as_mut_ptr() as u64;
        let mut at = 0;
        lens.iter()
            .map(|&len| {
                let span = HostSpan {
                    addr: base + at,
                    len,
                };
                at += len + 1;
                span
            })
            .collect()
    }
    let mut source = alloc::vec![0u8; LEN + 2];
    let spans = scatter(&mut source, &[700, 324, 3072]);
    let mut offset = 0;
    for span in &spans {
        let start = (span.addr - source.as_ptr() as u64) as usize;
        for b in &mut source[start..start + span.len as usize] {
            *b = write_check_byte(offset);
            offset += 1;
        }
    }
    let mut back = alloc::vec![0u8; LEN + 1];
    let back_spans = scatter(&mut back, &[100, LEN as u64 - 100]);
    let before = disk.requests();
    let mut writes = 0;
    let outcome = disk
        .write(WRITE_CHECK_SECTOR, &spans)
        .and_then(|()| {
            writes = disk.requests() - before;
            disk.flush()
        })
        .and_then(|()| {
            let before = disk.requests();
            let read = disk.read(WRITE_CHECK_SECTOR, &back_spans);
            read.map(|()| disk.requests() - before)
        });
    let read_back = back[..100]
        .iter()
        .chain(&back[101..])
        .enumerate()
        .all(|(i, &b)| b == write_check_byte(i));
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    match outcome {
        Ok(reads) if read_back => log::info!(
            "host disk {}: write check passed: {LEN} bytes at sector {WRITE_CHECK_SECTOR} \
             written from 3 spans in {writes} request{}, flushed, \
             read back into 2 spans in {reads} request{}",
            disk.index,
            plural(writes),
            plural(reads)
        ),
        Ok(_) => log::error!(
            "host disk {}: write check read back other bytes",
            disk.index
        ),
        Err(e) => log::error!("host disk {}: write check failed: {e}", disk.index),
    }
}

/// Reads the disk's first sector and logs its first 16 bytes (compared with
/// the image by the end-to-end test), then times a 4 KiB and a 1 MiB read
/// from sector 0 where the disk is that large. Never writes.
fn self_check(disk: &HostDisk) {
    const BIG: u64 = 1 << 20;
    let size = disk.capacity * SECTOR_SIZE;
    let Some(buffer) = alloc_frames(BIG, FRAME_SIZE) else {
        log::warn!("host disk {}: no frames for the self-check", disk.index);
        return;
    };
    let read = |len: u64| -> Result<u64, BlockError> {
        let span = [HostSpan { addr: buffer, len }];
        let start = crate::read_sysreg!(cntpct_el0);
        disk.read(0, &span)?;
        Ok(crate::read_sysreg!(cntpct_el0) - start)
    };
    match read(SECTOR_SIZE) {
        Ok(_) => {
            // SAFETY: the first sector was just read into the frames, which
            // this function owns until it frees them.
            let head = unsafe { core::slice::from_raw_parts(buffer as *const u8, 16) };
            let mut hex = alloc::string::String::new();
            for b in head {
                hex.push_str(&alloc::format!("{b:02x}"));
            }
            log::info!("host disk {}: sector 0 begins {hex}", disk.index);
        }
        Err(e) => log::error!("host disk {}: self-check read failed: {e}", disk.index),
    }
    let frequency = crate::read_sysreg!(cntfrq_el0).max(1);
    let micros = |ticks: u64| ticks * 1_000_000 / frequency;
    let mut timings = alloc::string::String::new();
    for len in [4096, BIG] {
        if len > size {
            continue;
        }
        if let Ok(ticks) = read(len) {
            timings.push_str(&alloc::format!(
                " {} KiB in {ticks} ticks ({} us);",
                len >> 10,
                micros(ticks)
            ));
        }
    }
    if !timings.is_empty() {
        log::info!(
            "host disk {}: read timing at {frequency} Hz:{}",
            disk.index,
            timings.trim_end_matches(';')
        );
    }
    free_frames(buffer, BIG, FRAME_SIZE);
}
