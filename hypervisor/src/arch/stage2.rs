//! Glue between the page-table engine and the hypervisor's memory.
//!
//! [`FrameMemory`] gives `pgtable` its table pages from the frame allocator:
//! zeroed, naturally aligned runs, reached through the identity map (the
//! hypervisor's stage-1 maps all RAM at its physical address). A VM's
//! provider also runs the guest cache maintenance `pgtable` asks for when
//! stage 2 cannot force write-back (no FEAT_S2FWB): `DC CIVAC` over a leaf's
//! memory (through the identity map) before it is published or after it is
//! unmapped, and the instruction cache maintenance `CTR_EL0` calls for
//! before an executable leaf is published (`DC CVAU` unless `IDC`, `IC IVAU`
//! or `IC IALLUIS` unless `DIC`). Each is counted in the VM's counters.

use crate::arch::boot::memory::{self, FRAME_SIZE};
use crate::arch::cpu::sysreg;
use crate::stage2::cache_maint::{CacheCaps, IcacheInval};
use crate::vm::counters::{Counter, VmCounters};
use core::ptr::NonNull;
use pgtable::{PAGE_SIZE, PageTableMemory, PhysAddr};

/// Table pages from the frame allocator, and a VM's guest cache maintenance.
#[derive(Clone, Copy)]
pub struct FrameMemory {
    guest: Option<GuestCmo>,
}

/// What a VM's provider needs for cache maintenance.
#[derive(Clone, Copy)]
struct GuestCmo {
    caps: CacheCaps,
    counters: &'static VmCounters,
}

impl FrameMemory {
    /// Table pages only: no cache maintenance (to fill page caches).
    pub const TABLES: Self = Self { guest: None };

    /// The provider of a VM's stage 2: maintenance as `caps` requires,
    /// counted in `counters`.
    pub const fn for_guest(caps: CacheCaps, counters: &'static VmCounters) -> Self {
        Self {
            guest: Some(GuestCmo { caps, counters }),
        }
    }
}

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

    fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
        let Some(GuestCmo { caps, counters }) = self.guest else {
            return;
        };
        sysreg::clean_inval_dcache_to_poc(pa.as_u64() as usize, size as usize, caps.dline);
        counters.add(Counter::CmoDcacheCleanPages, size.div_ceil(PAGE_SIZE));
    }

    fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
        let Some(GuestCmo { caps, counters }) = self.guest else {
            return;
        };
        let plan = caps.icache_plan();
        if !plan.is_needed() {
            return;
        }
        let (addr, len) = (pa.as_u64() as usize, size as usize);
        if plan.clean_to_pou {
            sysreg::clean_dcache_to_pou(addr, len, caps.dline);
        }
        match plan.invalidate {
            IcacheInval::None => {}
            IcacheInval::ByAddress => sysreg::invalidate_icache_range(addr, len, caps.iline),
            IcacheInval::All => sysreg::invalidate_icache_all(),
        }
        counters.bump(Counter::CmoIcacheInval);
    }
}
