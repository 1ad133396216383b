//! The host's disks: finding them among the virtio-mmio windows, starting
//! a driver on each, the boot-time checks, and each disk as a
//! [`BlockBackend`] the VMs' virtio-blk devices are served from.
//!
//! # The algorithm
//!
//! [`start_disks`] walks the windows (highest address first, as
//! `platform::virtio_mmio::windows` lists them) and reads each one's magic
//! value and DeviceID (register `0x008`) through the [`DiskMachine`]: the
//! N-th window holding a block device (DeviceID 2) is host disk N, also
//! when its driver then fails to start, so that numbers stay those of
//! QEMU's command line. Each started disk logs its size, transport, `GET_ID`
//! and request size, then [`self_check`] reads and times its first sectors
//! and a scratch disk ([`WRITE_CHECK_ID`]) gets the [`write_check`].
//! A transfer takes the disk's lock and runs `request_plan` over its
//! [`BlkIo`], one request at a time, with one sector of bounce buffer.

use super::blk_io::BlkIo;
use super::request_plan::{self, SegmentIo};
use crate::devices::guest_memory::HostSpan;
use crate::devices::virtio::block_backend::{
    BlockBackend, BlockError, SECTOR_SIZE, check_transfer,
};
use crate::platform::virtio_mmio::VirtioMmioWindow;
use alloc::vec::Vec;
use core::fmt::Display;
use core::marker::PhantomData;
use spin::Mutex;
use virtio_drivers::Hal;
use virtio_drivers::transport::Transport;

/// The magic value at offset 0 of a virtio-mmio window ("virt").
pub const MAGIC: u32 = 0x7472_6976;
/// The DeviceID of a block device.
pub const DEVICE_ID_BLOCK: u32 = 2;
/// Offset of the MagicValue register.
pub const MAGIC_OFFSET: u64 = 0x000;
/// Offset of the DeviceID register.
pub const DEVICE_ID_OFFSET: u64 = 0x008;

/// What finding and checking the host's disks needs of the machine.
pub trait DiskMachine {
    /// The transport over one window.
    type Transport: Transport;
    /// Why a window's transport could not be made.
    type OpenError: Display;

    /// Reads the 32-bit header register at `offset` of `window` (mapped
    /// as device memory; reading has no side effect).
    fn read_register(&self, window: &VirtioMmioWindow, offset: u64) -> u32;
    /// The transport over `window`, which holds a virtio device (its magic
    /// value says so), and the name of its register layout for the log;
    /// asked at most once per window.
    fn open(
        &self,
        window: &VirtioMmioWindow,
    ) -> Result<(Self::Transport, &'static str), Self::OpenError>;
    /// `size` bytes of memory a device can write by DMA (host frames),
    /// `None` when there are none; for the self-check.
    fn alloc_buffer(&self, size: u64) -> Option<u64>;
    /// Gives back a buffer of [`DiskMachine::alloc_buffer`].
    fn free_buffer(&self, addr: u64, size: u64);
    /// The system counter now.
    fn counter_ticks(&self) -> u64;
    /// The system counter's frequency in Hz.
    fn counter_frequency(&self) -> u64;
}

/// The driver of one disk and what it needs per request.
struct Driver<H: Hal, T: Transport> {
    io: BlkIo<H, T>,
    /// The one sector through which straddling sectors go.
    bounce: [u8; SECTOR_SIZE as usize],
}

/// One host disk: a virtio-mmio block device the hypervisor drives.
pub struct HostDisk<H: Hal, T: Transport> {
    index: usize,
    window: u64,
    capacity: u64,
    read_only: bool,
    id: [u8; 20],
    driver: Mutex<Driver<H, T>>,
}

impl<H: Hal, T: Transport> HostDisk<H, T> {
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
        self.driver.lock().io.requests()
    }
}

impl<H: Hal, T: Transport + Send> BlockBackend for HostDisk<H, T> {
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
        // SAFETY: the trait's contract: the spans are memory the caller
        // translated (guest RAM through the VM's memslots, identity mapped
        // read-write at EL2) and lends, exclusively, for this call; the
        // device writes them by DMA before each request returns.
        unsafe { request_plan::read_spans(io, bounce, sector, spans) }
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        check_transfer(self.capacity, self.read_only, true, sector, spans)?;
        let mut driver = self.driver.lock();
        let Driver { io, bounce } = &mut *driver;
        // SAFETY: as for `read`: memory lent for the call; the device only
        // reads it.
        unsafe { request_plan::write_spans(io, bounce, sector, spans) }
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

/// What [`start_disks`] found.
pub struct HostDisks<H: Hal, T: Transport> {
    /// Block devices seen, usable or not: disk numbers stay those of QEMU's
    /// command line even when one of them fails to start.
    found: usize,
    /// The disks whose driver started.
    disks: Vec<HostDisk<H, T>>,
    _hal: PhantomData<H>,
}

impl<H: Hal, T: Transport> HostDisks<H, T> {
    /// Host disk `n`, `None` when there is no such disk or its driver did
    /// not start.
    pub fn get(&self, n: usize) -> Option<&HostDisk<H, T>> {
        self.disks.iter().find(|d| d.index == n)
    }

    /// How many block devices were found; disks `0..found()` exist unless
    /// their driver failed to start.
    pub fn found(&self) -> usize {
        self.found
    }
}

/// Finds the host disks among `windows` (highest address first, mapped as
/// device memory), starts a driver on each, logs one line per disk, runs
/// the self-check on each and the write check on a scratch disk (see the
/// module documentation).
pub fn start_disks<H: Hal, M: DiskMachine>(
    machine: &M,
    windows: &[VirtioMmioWindow],
) -> HostDisks<H, M::Transport>
where
    M::Transport: Send,
{
    let mut disks = Vec::new();
    let mut found = 0;
    for window in windows {
        let magic = machine.read_register(window, MAGIC_OFFSET);
        let device_id = machine.read_register(window, DEVICE_ID_OFFSET);
        if magic != MAGIC || device_id != DEVICE_ID_BLOCK {
            continue;
        }
        let index = found;
        found += 1;
        if let Some(disk) = start_disk(machine, window, index) {
            disks.push(disk);
        }
    }
    for disk in &disks {
        self_check(machine, disk);
        if disk.id.starts_with(WRITE_CHECK_ID)
            && disk.id[WRITE_CHECK_ID.len()..].iter().all(|&b| b == 0)
        {
            write_check(disk);
        }
    }
    HostDisks {
        found,
        disks,
        _hal: PhantomData,
    }
}

/// Starts host disk `index` in `window` and logs what it is; `None` (logged)
/// when its transport or its driver does not start.
fn start_disk<H: Hal, M: DiskMachine>(
    machine: &M,
    window: &VirtioMmioWindow,
    index: usize,
) -> Option<HostDisk<H, M::Transport>> {
    let base = window.regs.start;
    let (transport, version) = match machine.open(window) {
        Ok(opened) => opened,
        Err(e) => {
            log::error!("host disk {index} at {base:#x}: not usable: {e}");
            return None;
        }
    };
    let mut io = match BlkIo::start(index, transport) {
        Ok(io) => io,
        Err(e) => {
            log::error!("host disk {index} at {base:#x}: the driver did not start: {e}");
            return None;
        }
    };
    let id = io.device_id().unwrap_or_else(|| {
        let mut id = [0u8; 20];
        let name = alloc::format!("hostdisk{index}");
        let n = name.len().min(20);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        id
    });
    let capacity = io.capacity();
    let read_only = io.read_only();
    log::info!(
        "host disk {index}: {capacity} sectors ({} MiB){} at {base:#x}",
        (capacity * SECTOR_SIZE) >> 20,
        if read_only { ", read-only" } else { "" }
    );
    let id_text = core::str::from_utf8(&id[..id.iter().position(|&b| b == 0).unwrap_or(20)])
        .unwrap_or("(not UTF-8)");
    log::info!(
        "host disk {index}: virtio-mmio {version}, id \"{id_text}\", \
         up to {} data buffers per request",
        io.limits().max_segments
    );
    if !window.dma_coherent {
        log::warn!(
            "host disk {index}: the device tree does not say dma-coherent; \
             the driver assumes coherent DMA"
        );
    }
    Some(HostDisk {
        index,
        window: base,
        capacity,
        read_only,
        id,
        driver: Mutex::new(Driver {
            io,
            bounce: [0; SECTOR_SIZE as usize],
        }),
    })
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
/// the image file. Returns whether it passed.
pub fn write_check<H: Hal, T: Transport + Send>(disk: &HostDisk<H, T>) -> bool {
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
        Ok(reads) if read_back => {
            log::info!(
                "host disk {}: write check passed: {LEN} bytes at sector {WRITE_CHECK_SECTOR} \
                 written from 3 spans in {writes} request{}, flushed, \
                 read back into 2 spans in {reads} request{}",
                disk.index,
                plural(writes),
                plural(reads)
            );
            return true;
        }
        Ok(_) => log::error!(
            "host disk {}: write check read back other bytes",
            disk.index
        ),
        Err(e) => log::error!("host disk {}: write check failed: {e}", disk.index),
    }
    false
}

/// Reads the disk's first sector and logs its first 16 bytes (compared with
/// the image by the end-to-end test), then times a 4 KiB and a 1 MiB read
/// from sector 0 where the disk is that large. Never writes.
pub fn self_check<H: Hal, M: DiskMachine>(machine: &M, disk: &HostDisk<H, M::Transport>)
where
    M::Transport: Send,
{
    const BIG: u64 = 1 << 20;
    let size = disk.capacity * SECTOR_SIZE;
    let Some(buffer) = machine.alloc_buffer(BIG) else {
        log::warn!("host disk {}: no frames for the self-check", disk.index);
        return;
    };
    let read = |len: u64| -> Result<u64, BlockError> {
        let span = [HostSpan { addr: buffer, len }];
        let start = machine.counter_ticks();
        disk.read(0, &span)?;
        Ok(machine.counter_ticks() - start)
    };
    match read(SECTOR_SIZE) {
        Ok(_) => {
            // SAFETY: the first sector was just read into the buffer, which
            // this function owns until it frees it.
            let head = unsafe { core::slice::from_raw_parts(buffer as *const u8, 16) };
            let mut hex = alloc::string::String::new();
            for b in head {
                hex.push_str(&alloc::format!("{b:02x}"));
            }
            log::info!("host disk {}: sector 0 begins {hex}", disk.index);
        }
        Err(e) => log::error!("host disk {}: self-check read failed: {e}", disk.index),
    }
    let frequency = machine.counter_frequency().max(1);
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
    machine.free_buffer(buffer, BIG);
}
