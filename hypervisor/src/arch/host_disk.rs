//! The host's disks at EL2: the machine side of `drivers::host_disk`
//! (which finds, starts, checks and drives them): [`El2Hal`], the
//! `virtio-drivers` platform layer (DMA memory and addresses), the raw
//! reads of a virtio-mmio window's header registers and its
//! `MmioTransport`, and the table of disks the VMs are served from
//! ([`host_disk()`]).
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
use crate::devices::virtio::block_backend::BlockBackend;
use crate::drivers::host_disk::disks::{DiskMachine, HostDisks, start_disks};
use crate::platform::virtio_mmio::VirtioMmioWindow;
use core::ptr::NonNull;
use spin::Once;
use virtio_drivers::transport::mmio::{MmioError, MmioTransport, MmioVersion, VirtIOHeader};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

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

/// The machine at EL2 as `drivers::host_disk` needs it.
struct El2Disks;

impl DiskMachine for El2Disks {
    type Transport = MmioTransport<'static>;
    type OpenError = MmioError;

    fn read_register(&self, window: &VirtioMmioWindow, offset: u64) -> u32 {
        // SAFETY: boot mapped every window of the list as device memory
        // (`boot::memory::init`); the header's registers are 32-bit and
        // 4-byte aligned, and reading them has no side effect.
        unsafe { core::ptr::read_volatile((window.regs.start + offset) as *const u32) }
    }

    fn open(
        &self,
        window: &VirtioMmioWindow,
    ) -> Result<(Self::Transport, &'static str), MmioError> {
        // Address 0 holds no window on any machine the hypervisor runs on;
        // were it one, it would be refused like a window without the magic.
        let header =
            NonNull::new(window.regs.start as *mut VirtIOHeader).ok_or(MmioError::BadMagic(0))?;
        // SAFETY: the window is a virtio-mmio register window (its magic
        // value says so) of `regs.size()` bytes, mapped as device memory at
        // EL2 for the hypervisor's whole life, and handed to this one
        // transport only (`probe` runs once and opens each window once).
        let transport = unsafe { MmioTransport::new(header, window.regs.size() as usize) }?;
        let version = match transport.version() {
            MmioVersion::Legacy => "legacy (version 1)",
            MmioVersion::Modern => "version 2",
        };
        Ok((transport, version))
    }

    fn alloc_buffer(&self, size: u64) -> Option<u64> {
        alloc_frames(size, FRAME_SIZE)
    }

    fn free_buffer(&self, addr: u64, size: u64) {
        free_frames(addr, size, FRAME_SIZE);
    }

    fn counter_ticks(&self) -> u64 {
        crate::read_sysreg!(cntpct_el0)
    }

    fn counter_frequency(&self) -> u64 {
        crate::read_sysreg!(cntfrq_el0)
    }
}

static HOST_DISKS: Once<HostDisks<El2Hal, MmioTransport<'static>>> = Once::new();

/// Host disk `n` (0: the first disk QEMU was given), for a VM's virtio-blk
/// (whole, or through a `devices::virtio::disk_window::DiskWindow`);
/// `None` when there is no such disk, its driver did not start, or
/// [`probe`] has not run.
pub fn host_disk(n: usize) -> Option<&'static dyn BlockBackend> {
    HOST_DISKS
        .get()
        .and_then(|table| table.get(n))
        .map(|d| d as &'static dyn BlockBackend)
}

/// Finds the host disks among `windows` (highest address first, mapped as
/// device memory by `boot::memory::init`), starts a driver on each, logs
/// one line per disk and a self-check read of its first sectors, and keeps
/// them for [`host_disk()`] (`drivers::host_disk::disks::start_disks`).
/// Runs once, on the boot CPU; a later call does nothing and returns the
/// same count.
pub fn probe(windows: &[VirtioMmioWindow]) -> usize {
    HOST_DISKS
        .call_once(|| start_disks(&El2Disks, windows))
        .found()
}
