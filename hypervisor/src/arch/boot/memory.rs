//! Host memory: the heap, the frame allocator and the EL2 stage-1 tables.
//!
//! The heap (a `buddy_system_allocator::Heap` behind the workspace's `spin`
//! mutex, [`LockedHeap`]) starts on a 4 MiB buffer in
//! `.bss`, enough to parse the device tree and build the frame allocator; it then
//! grows by a chunk of free RAM. The frame allocator hands out 4 KiB frames
//! (power-of-two runs, naturally aligned, so a 2 MiB request is 2 MiB aligned)
//! from RAM minus the image, the device tree, the boot payload and reserved
//! memory. The EL2 translation is an identity map built with `aarch64-paging`:
//! the image's text read-only and executable, the rest of RAM read-write and
//! execute-never (except `no-map` reserved memory, left unmapped), the UART,
//! the GIC (its ITS included) and the host's virtio-mmio windows as device
//! memory.
//!
//! Guest RAM is frames from this allocator, so every byte of it is mapped
//! read-write at its own address at EL2: a host address the memslots give
//! for guest RAM (a virtio `HostSpan`) can be dereferenced as it is, and is
//! also the address a device's DMA uses (no IOMMU).

use crate::platform::Platform;
use crate::platform::ranges::PhysRange;
use crate::runtime::host_memory_map::HostMemoryMap;
use aarch64_paging::descriptor::El23Attributes;
use aarch64_paging::idmap::IdMap;
use aarch64_paging::paging::{El2, MemoryRegion};
use alloc::vec::Vec;
use buddy_system_allocator::{FrameAllocator, Heap};
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::NonNull;
use spin::{Mutex, MutexGuard, Once};

/// The size of a frame.
pub use crate::runtime::host_memory_map::FRAME_SIZE;
const BOOT_HEAP_SIZE: usize = 4 << 20;
const HEAP_GROWTH: u64 = 32 << 20;

#[global_allocator]
static HEAP: LockedHeap = LockedHeap::new();

/// The global allocator: the buddy heap behind a spin lock. The allocator
/// crate's own locked heap would bring a second version of `spin`.
pub struct LockedHeap(Mutex<Heap<32>>);

impl LockedHeap {
    const fn new() -> Self {
        Self(Mutex::new(Heap::new()))
    }

    fn lock(&self) -> MutexGuard<'_, Heap<32>> {
        self.0.lock()
    }
}

// SAFETY: every block comes from the buddy heap under its lock, which hands
// out blocks of at least `layout.size()` bytes aligned to `layout.align()` and
// never hands out a block twice; failure is reported as null.
unsafe impl GlobalAlloc for LockedHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.lock()
            .alloc(layout)
            .map_or(core::ptr::null_mut(), NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a pointer `alloc` returned for `layout`
        // (never null) and no longer uses the block, so the heap may take it
        // back.
        unsafe { self.lock().dealloc(NonNull::new_unchecked(ptr), layout) };
    }
}

#[repr(C, align(4096))]
struct BootHeap(UnsafeCell<[u8; BOOT_HEAP_SIZE]>);

// SAFETY: handed to the heap exactly once, by the boot CPU.
unsafe impl Sync for BootHeap {}

static BOOT_HEAP: BootHeap = BootHeap(UnsafeCell::new([0; BOOT_HEAP_SIZE]));
static FRAMES: Mutex<FrameAllocator> = Mutex::new(FrameAllocator::new());
static STAGE1: Once<Mutex<IdMap<El2>>> = Once::new();

unsafe extern "C" {
    static __image_start: u8;
    static __text_end: u8;
    static __image_end: u8;
}

/// Gives the `.bss` buffer to the heap. Called once, first thing, on the boot CPU.
pub fn init_boot_heap() {
    let start = BOOT_HEAP.0.get() as usize;
    // SAFETY: the buffer is static, unused by anything else and handed over once.
    unsafe { HEAP.lock().init(start, BOOT_HEAP_SIZE) };
}

/// The hypervisor image in memory (including `.bss`).
pub fn image_range() -> PhysRange {
    PhysRange {
        start: &raw const __image_start as u64,
        end: &raw const __image_end as u64,
    }
}

/// Why host memory could not be set up.
#[derive(Debug)]
pub enum MemoryError {
    /// No free RAM is left for the heap.
    NoRamForHeap,
    /// The stage-1 table could not map a region.
    Map(aarch64_paging::MapError),
}

impl core::fmt::Display for MemoryError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoRamForHeap => write!(f, "no free RAM for the heap"),
            Self::Map(e) => write!(f, "stage-1 mapping failed: {e}"),
        }
    }
}

impl core::error::Error for MemoryError {}

/// Free RAM after boot-time carving, for the banner.
pub struct MemorySummary {
    /// Bytes handed to the frame allocator.
    pub free_bytes: u64,
}

/// Builds the frame allocator from `platform` (excluding `in_use`), grows the
/// heap and switches to the final EL2 stage-1 tables, which map
/// `more_devices` (the host's virtio-mmio windows) as device memory besides
/// the UART and the GIC: as `crate::runtime::host_memory_map` plans it.
pub fn init(
    platform: &Platform,
    in_use: Vec<PhysRange>,
    more_devices: &[PhysRange],
) -> Result<MemorySummary, MemoryError> {
    let text = PhysRange {
        start: &raw const __image_start as u64,
        end: &raw const __text_end as u64,
    };
    let guards: Vec<PhysRange> = crate::arch::cpu::percpu::guard_pages().collect();
    let plan = HostMemoryMap::plan(platform, in_use, text, &guards, more_devices);
    {
        let mut frames = FRAMES.lock();
        for r in &plan.free {
            frames.add_frame(
                (r.start / FRAME_SIZE) as usize,
                (r.end / FRAME_SIZE) as usize,
            );
        }
    }
    let free_bytes = plan.free_bytes();
    let growth = HEAP_GROWTH.min(free_bytes / 8);
    let chunk = alloc_frames(growth, FRAME_SIZE).ok_or(MemoryError::NoRamForHeap)?;
    // SAFETY: the frames were just taken from the allocator and are owned by
    // the heap from now on; they are RAM covered by the early map.
    unsafe {
        HEAP.lock()
            .add_to_heap(chunk as usize, (chunk + growth) as usize)
    };

    let normal = El23Attributes::VALID
        | El23Attributes::ACCESSED
        | El23Attributes::INNER_SHAREABLE
        | El23Attributes::ATTRIBUTE_INDEX_1
        | El23Attributes::USER_RES1;
    let device = El23Attributes::VALID
        | El23Attributes::ACCESSED
        | El23Attributes::ATTRIBUTE_INDEX_0
        | El23Attributes::USER_RES1
        | El23Attributes::XN;
    let mut map = IdMap::new(0, El2);
    let region = |r: &PhysRange| MemoryRegion::new(r.start as usize, r.end as usize);
    let regions = (plan.data.iter().map(|r| (r, normal | El23Attributes::XN)))
        .chain([(&plan.text, normal | El23Attributes::READ_ONLY)])
        .chain(plan.devices.iter().map(|r| (r, device)));
    for (range, attributes) in regions {
        map.map_range(&region(range), attributes)
            .map_err(MemoryError::Map)?;
    }
    // SAFETY: the new tables map everything the hypervisor touches (its image,
    // all RAM, its devices) at the same addresses as the early map, with the
    // same MAIR/TCR; the TLB is invalidated right after the switch.
    unsafe {
        map.activate();
        core::arch::asm!(
            "dsb ish",
            "tlbi alle2",
            "dsb ish",
            "isb",
            options(nostack, preserves_flags)
        );
    }
    STAGE1.call_once(|| Mutex::new(map));
    Ok(MemorySummary { free_bytes })
}

/// The physical address of the stage-1 root table (for secondary CPUs).
pub fn stage1_root() -> u64 {
    STAGE1.get().map_or(0, |m| m.lock().root_address().0 as u64)
}

/// Allocates `size` bytes of frames aligned to `align` (both powers of two
/// multiples of the frame size are rounded up); returns the physical address.
pub fn alloc_frames(size: u64, align: u64) -> Option<u64> {
    let frames = size.div_ceil(FRAME_SIZE) as usize;
    let align_frames = (align / FRAME_SIZE).max(1) as usize;
    let layout = Layout::from_size_align(frames, align_frames.next_power_of_two()).ok()?;
    FRAMES
        .lock()
        .alloc_aligned(layout)
        .map(|f| f as u64 * FRAME_SIZE)
}

/// Returns frames from [`alloc_frames`].
pub fn free_frames(addr: u64, size: u64, align: u64) {
    let frames = size.div_ceil(FRAME_SIZE) as usize;
    let align_frames = (align / FRAME_SIZE).max(1) as usize;
    if let Ok(layout) = Layout::from_size_align(frames, align_frames.next_power_of_two()) {
        FRAMES
            .lock()
            .dealloc_aligned((addr / FRAME_SIZE) as usize, layout);
    }
}
