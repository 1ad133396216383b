//! Glue between the page-table engine and the hypervisor's memory.
//!
//! [`FrameMemory`] gives `pgtable` its table pages from the frame allocator:
//! zeroed, naturally aligned runs, reached through the identity map (the
//! hypervisor's stage-1 maps all RAM at its physical address).

use super::memory::{self, FRAME_SIZE};
use core::ptr::NonNull;
use pgtable::{PageTableMemory, PhysAddr};

/// Table pages from the frame allocator.
#[derive(Clone, Copy, Debug)]
pub struct FrameMemory;

// SAFETY: pages come zeroed from the frame allocator, aligned to their size
// (buddy allocation), owned by the engine until freed, and identity mapped.
unsafe impl PageTableMemory for FrameMemory {
    fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr> {
        let size = count as u64 * FRAME_SIZE;
        let pa = memory::alloc_frames(size, size)?;
        // SAFETY: the frames were just allocated for us and are identity mapped.
        unsafe { core::ptr::write_bytes(pa as *mut u8, 0, size as usize) };
        Some(PhysAddr::new(pa))
    }

    unsafe fn free_pages(&self, pa: PhysAddr, count: usize) {
        let size = count as u64 * FRAME_SIZE;
        memory::free_frames(pa.as_u64(), size, size);
    }

    fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64> {
        NonNull::new(pa.as_u64() as *mut u64).expect("page-table pages are never at address 0")
    }
}
