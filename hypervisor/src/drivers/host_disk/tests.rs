//! The host-disk driver against a fake virtio-blk device: a `Transport`
//! whose `notify` runs the device side of the split virtqueue (descriptor
//! chains read from host memory, the disk a vector) and a `Hal` over host
//! allocations, so that `BlkIo`, the disk table and the boot checks run as
//! they do at EL2.

use super::blk_io::{BlkIo, SUPPORTED_FEATURES};
use super::disks::{
    DEVICE_ID_BLOCK, DEVICE_ID_OFFSET, DiskMachine, MAGIC, MAGIC_OFFSET, WRITE_CHECK_SECTOR,
    start_disks, write_check_byte,
};
use super::request_plan::SegmentIo;
use crate::devices::guest_memory::HostSpan;
use crate::devices::virtio::blk::{
    F_FLUSH, F_RO, F_SEG_MAX, S_IOERR, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN, T_OUT,
};
use crate::devices::virtio::block_backend::{BlockBackend, BlockError, SECTOR_SIZE};
use crate::devices::virtio::mmio_transport::{F_RING_EVENT_IDX, F_VERSION_1};
use crate::platform::ranges::PhysRange;
use crate::platform::virtio_mmio::VirtioMmioWindow;
use core::ptr::NonNull;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::{Arc, Mutex};
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{BufferDirection, Error, Hal, PAGE_SIZE, PhysAddr};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// DMA memory from the host allocator; a buffer's address is its pointer.
struct HostHal;

// SAFETY: `dma_alloc` hands out zeroed, page-aligned allocations that no one
// else uses until `dma_dealloc` frees them with the same layout; addresses
// are the pointers themselves, valid in this process.
unsafe impl Hal for HostHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let layout = Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE).unwrap();
        // SAFETY: the layout has a non-zero size (the crate asks for whole
        // pages, at least one).
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        (ptr.as_ptr() as PhysAddr, ptr)
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        let layout = Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE).unwrap();
        // SAFETY: the caller gives back an allocation of `dma_alloc` with
        // the same page count, so the same layout.
        unsafe { dealloc(vaddr.as_ptr(), layout) };
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).unwrap()
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// One request the fake device served: type, sector, data buffer lengths.
type Served = (u32, u64, Vec<usize>);

/// The fake virtio-blk device behind a [`FakeTransport`].
struct Device {
    offered: u64,
    max_queue_size: u32,
    /// capacity (le64) and seg_max (le32 at 12), as the config space.
    config: [u32; 4],
    disk: Vec<u8>,
    /// The `GET_ID` answer, `None`: answered `UNSUPP`.
    id: Option<[u8; 20]>,
    /// Answer every data request with `IOERR`.
    failing: bool,
    status: DeviceStatus,
    driver_features: u64,
    /// Queue 0: size, descriptor table, driver area, device area.
    queue: Option<(u32, u64, u64, u64)>,
    queue_unsets: usize,
    /// The next available-ring index to serve.
    next_avail: u16,
    served: Vec<Served>,
}

impl Device {
    fn new(sectors: usize, offered: u64, max_queue_size: u32, seg_max: u32) -> Self {
        let capacity = sectors as u64;
        Self {
            offered,
            max_queue_size,
            config: [capacity as u32, (capacity >> 32) as u32, 0, seg_max],
            disk: (0..sectors * SECTOR_SIZE as usize)
                .map(|i| (i * 3 + i / 509) as u8)
                .collect(),
            id: None,
            failing: false,
            status: DeviceStatus::empty(),
            driver_features: 0,
            queue: None,
            queue_unsets: 0,
            next_avail: 0,
            served: Vec::new(),
        }
    }

    /// Serves every chain the driver made available (virtio 1.2, 2.7).
    fn serve(&mut self) {
        let (size, desc, avail, used) = self.queue.expect("notified without a queue");
        let size = size as u16;
        // SAFETY: the areas are the live virtqueue of `HostHal` memory the
        // driver set up with this size (`queue_set`); the driver polls and
        // does not touch the used ring meanwhile (one thread).
        unsafe {
            let avail_idx = core::ptr::read_volatile((avail + 2) as *const u16);
            while self.next_avail != avail_idx {
                let slot = u64::from(self.next_avail % size);
                let head = core::ptr::read_volatile((avail + 4 + 2 * slot) as *const u16);
                let written = self.serve_chain(desc, head);
                let used_idx = core::ptr::read_volatile((used + 2) as *const u16);
                let entry = used + 4 + 8 * u64::from(used_idx % size);
                core::ptr::write_volatile(entry as *mut u32, u32::from(head));
                core::ptr::write_volatile((entry + 4) as *mut u32, written);
                core::ptr::write_volatile((used + 2) as *mut u16, used_idx.wrapping_add(1));
                self.next_avail = self.next_avail.wrapping_add(1);
            }
            // `avail_event`, after the used ring.
            let avail_event = used + 4 + 8 * u64::from(size);
            core::ptr::write_volatile(avail_event as *mut u16, self.next_avail);
        }
    }

    /// Serves the chain starting at descriptor `head`; the bytes written.
    ///
    /// # Safety
    ///
    /// `desc` is the live descriptor table and every buffer it names is
    /// lent to the device until the chain is used.
    unsafe fn serve_chain(&mut self, desc: u64, head: u16) -> u32 {
        let mut buffers: Vec<(u64, usize)> = Vec::new();
        let mut at = head;
        loop {
            let d = desc + 16 * u64::from(at);
            // SAFETY: a descriptor of the table (caller).
            let (addr, len, flags, next) = unsafe {
                (
                    core::ptr::read_volatile(d as *const u64),
                    core::ptr::read_volatile((d + 8) as *const u32),
                    core::ptr::read_volatile((d + 12) as *const u16),
                    core::ptr::read_volatile((d + 14) as *const u16),
                )
            };
            buffers.push((addr, len as usize));
            if flags & 1 == 0 {
                break;
            }
            at = next;
        }
        let (header, len) = buffers[0];
        assert_eq!(len, 16);
        // SAFETY: the header buffer, lent (caller).
        let header = unsafe { core::slice::from_raw_parts(header as *const u8, 16) };
        let kind = u32::from_le_bytes(header[..4].try_into().unwrap());
        let sector = u64::from_le_bytes(header[8..].try_into().unwrap());
        let (status, len) = buffers[buffers.len() - 1];
        assert_eq!(len, 1);
        let data = &buffers[1..buffers.len() - 1];
        self.served
            .push((kind, sector, data.iter().map(|&(_, len)| len).collect()));
        let mut offset = sector as usize * SECTOR_SIZE as usize;
        let mut written = 1;
        let answer = match kind {
            T_IN | T_OUT if self.failing => S_IOERR,
            T_IN => {
                for &(addr, len) in data {
                    // SAFETY: a device-writable data buffer, lent (caller).
                    let buffer = unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, len) };
                    buffer.copy_from_slice(&self.disk[offset..offset + len]);
                    offset += len;
                    written += len as u32;
                }
                S_OK
            }
            T_OUT => {
                for &(addr, len) in data {
                    // SAFETY: a device-readable data buffer, lent (caller).
                    let buffer = unsafe { core::slice::from_raw_parts(addr as *const u8, len) };
                    self.disk[offset..offset + len].copy_from_slice(buffer);
                    offset += len;
                }
                S_OK
            }
            T_FLUSH => S_OK,
            T_GET_ID => match self.id {
                Some(id) => {
                    let (addr, len) = data[0];
                    // SAFETY: the 20-byte writable buffer of the request,
                    // lent (caller).
                    let buffer = unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, len) };
                    buffer.copy_from_slice(&id[..len]);
                    written += len as u32;
                    S_OK
                }
                None => S_UNSUPP,
            },
            _ => S_UNSUPP,
        };
        // SAFETY: the status byte, device-writable, lent (caller).
        unsafe { core::ptr::write_volatile(status as *mut u8, answer) };
        written
    }
}

/// A transport to a shared [`Device`]; `notify` serves the queue at once.
struct FakeTransport(Arc<Mutex<Device>>);

impl Transport for FakeTransport {
    fn device_type(&self) -> DeviceType {
        DeviceType::Block
    }

    fn read_device_features(&mut self) -> u64 {
        self.0.lock().unwrap().offered
    }

    fn write_driver_features(&mut self, driver_features: u64) {
        self.0.lock().unwrap().driver_features = driver_features;
    }

    fn max_queue_size(&mut self, _queue: u16) -> u32 {
        self.0.lock().unwrap().max_queue_size
    }

    fn notify(&mut self, queue: u16) {
        assert_eq!(queue, 0);
        self.0.lock().unwrap().serve();
    }

    fn get_status(&self) -> DeviceStatus {
        self.0.lock().unwrap().status
    }

    fn set_status(&mut self, status: DeviceStatus) {
        self.0.lock().unwrap().status = status;
    }

    fn set_guest_page_size(&mut self, _guest_page_size: u32) {}

    fn requires_legacy_layout(&self) -> bool {
        false
    }

    fn queue_set(&mut self, queue: u16, size: u32, desc: PhysAddr, driver: PhysAddr, dev: u64) {
        assert_eq!(queue, 0);
        self.0.lock().unwrap().queue = Some((size, desc, driver, dev));
    }

    fn queue_unset(&mut self, _queue: u16) {
        let mut device = self.0.lock().unwrap();
        device.queue = None;
        device.queue_unsets += 1;
    }

    fn queue_used(&mut self, _queue: u16) -> bool {
        self.0.lock().unwrap().queue.is_some()
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        InterruptStatus::empty()
    }

    fn read_config_generation(&self) -> u32 {
        0
    }

    fn read_config_space<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, Error> {
        let device = self.0.lock().unwrap();
        let bytes = device.config.as_bytes();
        bytes
            .get(offset..offset + size_of::<T>())
            .and_then(|b| T::read_from_bytes(b).ok())
            .ok_or(Error::ConfigSpaceTooSmall)
    }

    fn write_config_space<T: IntoBytes + Immutable>(
        &mut self,
        _offset: usize,
        _value: T,
    ) -> Result<(), Error> {
        Err(Error::Unsupported)
    }
}

/// Features QEMU's virtio-blk offers (besides others the driver ignores).
const QEMU_FEATURES: u64 = F_SEG_MAX | F_FLUSH | F_RING_EVENT_IDX | F_VERSION_1 | (1 << 28);

fn started(device: &Arc<Mutex<Device>>) -> BlkIo<HostHal, FakeTransport> {
    BlkIo::start(0, FakeTransport(device.clone())).unwrap()
}

#[test]
fn start_negotiates_the_supported_features_and_reads_the_configuration() {
    let device = Arc::new(Mutex::new(Device::new(
        2048,
        QEMU_FEATURES | F_RO,
        256,
        254,
    )));
    let io = started(&device);
    {
        let device = device.lock().unwrap();
        assert_eq!(
            device.driver_features,
            (QEMU_FEATURES | F_RO) & SUPPORTED_FEATURES
        );
        assert!(device.status.contains(DeviceStatus::DRIVER_OK));
        assert_eq!(device.queue.unwrap().0, 256);
    }
    assert_eq!(io.capacity(), 2048);
    assert!(io.read_only());
    // 256 descriptors less the header and the status byte, and seg_max.
    assert_eq!(io.limits().max_segments, 254);
    drop(io);
    let device = device.lock().unwrap();
    assert_eq!((device.queue, device.queue_unsets), (None, 1));
}

#[test]
fn a_small_queue_and_no_seg_max_limit_requests_to_the_free_descriptors() {
    let device = Arc::new(Mutex::new(Device::new(64, F_VERSION_1, 64, 0)));
    let io = started(&device);
    assert_eq!(device.lock().unwrap().queue.unwrap().0, 16);
    assert_eq!(io.limits().max_segments, 14);
    assert!(!io.read_only());
}

#[test]
fn flush_and_get_id_are_sent_only_as_negotiated() {
    let device = Arc::new(Mutex::new(Device::new(64, F_VERSION_1, 256, 0)));
    let mut io = started(&device);
    io.flush().unwrap();
    assert_eq!(io.device_id(), None);
    assert_eq!(device.lock().unwrap().served, [(T_GET_ID, 0, vec![20])]);

    let device = Arc::new(Mutex::new(Device::new(64, QEMU_FEATURES, 256, 8)));
    device.lock().unwrap().id = Some(*b"serial-number\0\0\0\0\0\0\0");
    let mut io = started(&device);
    io.flush().unwrap();
    assert_eq!(io.device_id(), Some(*b"serial-number\0\0\0\0\0\0\0"));
    assert_eq!(
        device.lock().unwrap().served,
        [(T_FLUSH, 0, vec![]), (T_GET_ID, 0, vec![20])]
    );
    assert_eq!(io.requests(), 2);
}

#[test]
fn scattered_buffers_are_one_chain_and_a_device_error_is_a_block_error() {
    let device = Arc::new(Mutex::new(Device::new(64, QEMU_FEATURES, 256, 254)));
    let mut io = started(&device);
    let mut a = [0u8; 1024];
    let mut b = [0u8; 512];
    io.read_segments(3, &mut [&mut a[..], &mut b[..]]).unwrap();
    {
        let device = device.lock().unwrap();
        assert_eq!(a[..], device.disk[3 * 512..5 * 512]);
        assert_eq!(b[..], device.disk[5 * 512..6 * 512]);
        assert_eq!(device.served, [(T_IN, 3, vec![1024, 512])]);
    }
    io.write_segments(10, &[&[7; 512], &[9; 1024]]).unwrap();
    {
        let device = device.lock().unwrap();
        assert!(device.disk[10 * 512..11 * 512].iter().all(|&x| x == 7));
        assert!(device.disk[11 * 512..13 * 512].iter().all(|&x| x == 9));
    }
    device.lock().unwrap().failing = true;
    assert_eq!(
        io.read_segments(0, &mut [&mut a[..]]),
        Err(BlockError::Device)
    );
    assert_eq!(io.write_segments(0, &[&a[..]]), Err(BlockError::Device));
    assert_eq!(io.requests(), 4);
}

/// A window of a fake machine: its base, magic value, DeviceID and the
/// device behind it (`None`: its transport does not open).
struct FakeWindow(u64, u32, u32, Option<Arc<Mutex<Device>>>);

/// Windows of a fake machine, each with what sits behind it.
struct FakeMachine {
    windows: Vec<FakeWindow>,
    ticks: Mutex<u64>,
}

impl DiskMachine for FakeMachine {
    type Transport = FakeTransport;
    type OpenError = &'static str;

    fn read_register(&self, window: &VirtioMmioWindow, offset: u64) -> u32 {
        let FakeWindow(_, magic, id, _) = self
            .windows
            .iter()
            .find(|w| w.0 == window.regs.start)
            .unwrap();
        match offset {
            MAGIC_OFFSET => *magic,
            DEVICE_ID_OFFSET => *id,
            _ => panic!("register {offset:#x}"),
        }
    }

    fn open(
        &self,
        window: &VirtioMmioWindow,
    ) -> Result<(FakeTransport, &'static str), &'static str> {
        let FakeWindow(.., device) = self
            .windows
            .iter()
            .find(|w| w.0 == window.regs.start)
            .unwrap();
        let device = device.as_ref().ok_or("no usable header")?;
        Ok((FakeTransport(device.clone()), "fake"))
    }

    fn alloc_buffer(&self, size: u64) -> Option<u64> {
        let layout = Layout::from_size_align(size as usize, PAGE_SIZE).unwrap();
        // SAFETY: a non-zero size (the self-check asks for 1 MiB).
        Some(unsafe { alloc_zeroed(layout) } as u64)
    }

    fn free_buffer(&self, addr: u64, size: u64) {
        let layout = Layout::from_size_align(size as usize, PAGE_SIZE).unwrap();
        // SAFETY: an allocation of `alloc_buffer` with the same size.
        unsafe { dealloc(addr as *mut u8, layout) };
    }

    fn counter_ticks(&self) -> u64 {
        let mut ticks = self.ticks.lock().unwrap();
        *ticks += 100;
        *ticks
    }

    fn counter_frequency(&self) -> u64 {
        1_000_000
    }
}

fn window(base: u64) -> VirtioMmioWindow {
    VirtioMmioWindow {
        regs: PhysRange {
            start: base,
            end: base + 0x200,
        },
        intid: None,
        dma_coherent: true,
    }
}

#[test]
fn disks_are_numbered_by_window_also_past_one_that_fails_and_the_scratch_disk_is_written() {
    let first = Arc::new(Mutex::new(Device::new(
        4096,
        QEMU_FEATURES | F_RO,
        256,
        254,
    )));
    let scratch = Arc::new(Mutex::new(Device::new(64, QEMU_FEATURES, 256, 254)));
    scratch.lock().unwrap().id = Some(*b"hv-write-check\0\0\0\0\0\0");
    let machine = FakeMachine {
        windows: vec![
            FakeWindow(0xa003e00, 0, 0, None),
            FakeWindow(0xa003c00, MAGIC, 1, None),
            FakeWindow(0xa003a00, MAGIC, DEVICE_ID_BLOCK, Some(first.clone())),
            FakeWindow(0xa003800, MAGIC, DEVICE_ID_BLOCK, None),
            FakeWindow(0xa003600, MAGIC, DEVICE_ID_BLOCK, Some(scratch.clone())),
        ],
        ticks: Mutex::new(0),
    };
    let windows: Vec<_> = machine.windows.iter().map(|w| window(w.0)).collect();
    let disks = start_disks::<HostHal, _>(&machine, &windows);
    assert_eq!(disks.found(), 3);
    assert!(disks.get(1).is_none());
    let disk0 = disks.get(0).unwrap();
    assert_eq!((disk0.index(), disk0.window()), (0, 0xa003a00));
    assert_eq!(disk0.capacity_sectors(), 4096);
    assert!(disk0.read_only());
    assert_eq!(&disk0.id()[..10], b"hostdisk0\0");
    // The read-only disk: GET_ID and the self-check's three reads, nothing
    // written.
    assert_eq!(
        first.lock().unwrap().served,
        [
            (T_GET_ID, 0, vec![20]),
            (T_IN, 0, vec![512]),
            (T_IN, 0, vec![4096]),
            (T_IN, 0, vec![1 << 20]),
        ]
    );

    let disk2 = disks.get(2).unwrap();
    assert_eq!(disk2.window(), 0xa003600);
    let device = scratch.lock().unwrap();
    // After GET_ID, the self-check's reads of a sector and 4 KiB (the
    // disk is 32 KiB: no 1 MiB read), then the write check's write from
    // three spans in one request (a sector straddles the first two: the
    // bounce buffer), a flush, and a read into two spans in one request.
    assert_eq!(
        device.served[1..],
        [
            (T_IN, 0, vec![512]),
            (T_IN, 0, vec![4096]),
            (T_OUT, WRITE_CHECK_SECTOR, vec![512, 512, 3072]),
            (T_FLUSH, 0, vec![]),
            (T_IN, WRITE_CHECK_SECTOR, vec![512, 3584]),
        ]
    );
    let at = WRITE_CHECK_SECTOR as usize * 512;
    assert!(
        device.disk[at..at + 4096]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == write_check_byte(i))
    );
}

#[test]
fn a_block_backend_transfer_is_checked_then_planned_into_requests() {
    let device = Arc::new(Mutex::new(Device::new(64, QEMU_FEATURES | F_RO, 256, 254)));
    let machine = FakeMachine {
        windows: vec![FakeWindow(
            0x1000,
            MAGIC,
            DEVICE_ID_BLOCK,
            Some(device.clone()),
        )],
        ticks: Mutex::new(0),
    };
    let disks = start_disks::<HostHal, _>(&machine, &[window(0x1000)]);
    let disk = disks.get(0).unwrap();
    device.lock().unwrap().served.clear();
    let mut buffer = vec![0u8; 2048 + 1];
    let spans = [
        HostSpan {
            addr: buffer.as_mut_ptr() as u64,
            len: 1024,
        },
        HostSpan {
            addr: buffer.as_mut_ptr() as u64 + 1025,
            len: 1024,
        },
    ];
    disk.read(4, &spans).unwrap();
    assert_eq!(
        buffer[..1024],
        device.lock().unwrap().disk[4 * 512..6 * 512]
    );
    assert_eq!(
        buffer[1025..],
        device.lock().unwrap().disk[6 * 512..8 * 512]
    );
    // Refused before any request: a write to a read-only disk, a read past
    // the end.
    assert_eq!(disk.write(4, &spans), Err(BlockError::ReadOnly));
    assert!(disk.read(63, &spans).is_err());
    assert_eq!(device.lock().unwrap().served, [(T_IN, 4, vec![1024, 1024])]);
    assert_eq!(disk.requests(), 4);
}
