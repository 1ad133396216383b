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
//! the highest transport). Each disk gets a `VirtIOBlk` over an
//! `MmioTransport`, which handles the legacy (version 1, QEMU 7.2's
//! default) and the modern (version 2) register layouts. The windows stay
//! the hypervisor's: guests get generated device trees and never see them.
//!
//! # Requests
//!
//! One request at a time per disk, under the disk's `spin::Mutex`, polled
//! to completion (the device's interrupt is not used): the driver adds the
//! request to the virtqueue, notifies and spins on the used ring. How a
//! transfer over guest buffers becomes requests (zero copy for whole
//! sectors, one sector of bounce buffer where a sector straddles two
//! buffers, requests of at most 1 MiB) is `drivers::host_disk`. A device
//! error is logged with the disk, the sector and the length, and returned
//! as [`BlockError::Device`]; nothing panics. A device that never completes
//! a request stalls its caller (the crate's polling has no timeout).
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
use crate::devices::virtio::block_backend::{BlockBackend, BlockError, SECTOR_SIZE};
use crate::devices::virtio::guest_memory::HostSpan;
use crate::drivers::host_disk::{self, SectorIo};
use crate::platform::virtio_mmio::VirtioMmioWindow;
use alloc::vec::Vec;
use core::ptr::NonNull;
use spin::{Mutex, Once};
use virtio_drivers::device::blk::VirtIOBlk;
use virtio_drivers::transport::mmio::{MmioTransport, MmioVersion, VirtIOHeader};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

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

/// Whole-sector requests to one virtio block device.
struct BlkIo {
    /// The disk's number, for log lines.
    index: usize,
    blk: VirtIOBlk<El2Hal, MmioTransport<'static>>,
}

impl SectorIo for BlkIo {
    fn read_sectors(&mut self, sector: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let len = buf.len();
        self.blk.read_blocks(sector as usize, buf).map_err(|e| {
            log::error!(
                "host disk {}: reading {len} bytes at sector {sector} failed: {e}",
                self.index
            );
            BlockError::Device
        })
    }

    fn write_sectors(&mut self, sector: u64, buf: &[u8]) -> Result<(), BlockError> {
        let len = buf.len();
        self.blk.write_blocks(sector as usize, buf).map_err(|e| {
            log::error!(
                "host disk {}: writing {len} bytes at sector {sector} failed: {e}",
                self.index
            );
            BlockError::Device
        })
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
}

impl BlockBackend for HostDisk {
    fn capacity_sectors(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        host_disk::check(self.capacity, self.read_only, false, sector, spans)?;
        let mut driver = self.driver.lock();
        let Driver { io, bounce } = &mut *driver;
        // SAFETY: the trait's contract: the spans are guest RAM (identity
        // mapped read-write at EL2, `boot::memory`) that the caller
        // translated through the VM's memslots and lends, exclusively, for
        // this call; the device writes them by DMA before `read_blocks`
        // returns.
        unsafe { host_disk::read_spans(io, bounce, sector, spans) }
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        host_disk::check(self.capacity, self.read_only, true, sector, spans)?;
        let mut driver = self.driver.lock();
        let Driver { io, bounce } = &mut *driver;
        // SAFETY: as for `read`: identity-mapped guest RAM lent for the
        // call; the device only reads it.
        unsafe { host_disk::write_spans(io, bounce, sector, spans) }
    }

    fn flush(&self) -> Result<(), BlockError> {
        self.driver.lock().io.blk.flush().map_err(|e| {
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
        let mut blk = match VirtIOBlk::<El2Hal, _>::new(transport) {
            Ok(blk) => blk,
            Err(e) => {
                log::error!("host disk {index} at {base:#x}: the driver did not start: {e}");
                continue;
            }
        };
        let mut id = [0u8; 20];
        let id_len = blk.device_id(&mut id).unwrap_or(0);
        if id_len == 0 {
            id = [0; 20];
            let name = alloc::format!("hostdisk{index}");
            let n = name.len().min(20);
            id[..n].copy_from_slice(&name.as_bytes()[..n]);
        }
        let capacity = blk.capacity();
        let read_only = blk.readonly();
        log::info!(
            "host disk {index}: {capacity} sectors ({} MiB){} at {base:#x}",
            (capacity * SECTOR_SIZE) >> 20,
            if read_only { ", read-only" } else { "" }
        );
        let id_text = core::str::from_utf8(&id[..id.iter().position(|&b| b == 0).unwrap_or(20)])
            .unwrap_or("(not UTF-8)");
        log::info!(
            "host disk {index}: virtio-mmio {}, id \"{id_text}\"",
            match version {
                MmioVersion::Legacy => "legacy (version 1)",
                MmioVersion::Modern => "version 2",
            }
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
                io: BlkIo { index, blk },
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
/// (700, 324 and 3072 bytes: two sectors straddle spans and go through the
/// bounce buffer), flushes, reads them back through two others (100 and
/// 3996 bytes) and compares; logs the outcome. The end-to-end test then finds the bytes in the image file.
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
    let outcome = disk
        .write(WRITE_CHECK_SECTOR, &spans)
        .and_then(|()| disk.flush())
        .and_then(|()| disk.read(WRITE_CHECK_SECTOR, &back_spans));
    let read_back = back[..100]
        .iter()
        .chain(&back[101..])
        .enumerate()
        .all(|(i, &b)| b == write_check_byte(i));
    match outcome {
        Ok(()) if read_back => log::info!(
            "host disk {}: write check passed: {LEN} bytes at sector {WRITE_CHECK_SECTOR} \
             written from 3 spans, flushed, read back",
            disk.index
        ),
        Ok(()) => log::error!(
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
