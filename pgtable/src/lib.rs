//! Stage-2 page-table engine for arm64 guests.
//!
//! The engine owns a VM's stage-2 translation tables (4 KiB granule): the
//! descriptors ([`Descriptor`], [`Attributes`]), the configuration and the
//! `VTCR_EL2`/`VTTBR_EL2` values it implies ([`Stage2Config`]), one generic
//! walker whose visitors can skip children or siblings ([`walk`]), and the
//! operations built on it: [`map`](Stage2PageTable::map) with block
//! collapse and split, [`unmap`](Stage2PageTable::unmap) with one deferred
//! range flush, [`write_protect`](Stage2PageTable::write_protect),
//! [`relax_perms`](Stage2PageTable::relax_perms), access-flag ageing,
//! [`split_to_pages`](Stage2PageTable::split_to_pages) with [`SkipHints`],
//! [`lookup`](Stage2PageTable::lookup) and
//! [`destroy`](Stage2PageTable::destroy). TLB maintenance goes through the
//! `tlb` crate's [`TlbInvalidate`](tlb::TlbInvalidate) backend.
//!
//! Table pages come from the caller through [`PageTableMemory`]; walks take
//! them from a [`PageCache`] topped up beforehand, never from the allocator.
//! Operations that take `&mut self` are exclusive (the write side of the MMU
//! lock); entries are `AtomicU64` slots and every change goes through one
//! place ([`walk::VisitContext`]), so shared walks can use compare-and-swap.
//!
//! `no_std` + `alloc`; the `host` feature adds [`HostMemory`], a checking
//! page provider for tests and benchmarks.
#![no_std]

extern crate alloc;

mod addr;
mod attrs;
mod bbm;
mod cache;
mod config;
mod descriptor;
mod fault;
mod map;
mod mm;
mod mmu;
mod split;
mod sync;
mod table;
mod unmap;
pub mod walk;

#[cfg(test)]
mod tests;

pub use addr::PhysAddr;
pub use attrs::FlushNeeded;
pub use cache::{OutOfMemory, PageCache};
pub use config::{ConfigError, Stage2Config};
pub use crossbeam_epoch::LocalHandle;
pub use descriptor::{
    Attributes, Descriptor, ENTRIES_PER_TABLE, LAST_LEVEL, LEAF_SIZES, MemType, PAGE_SHIFT,
    PAGE_SIZE, Perms, SOFTWARE_BITS, level_shift, level_size,
};
pub use fault::{FAULT_CACHE_PAGES, FaultMapping};
pub use mm::PageTableMemory;
#[cfg(any(test, feature = "host"))]
pub use mm::{HostMemory, POISON};
pub use mmu::{Mmu, MmuReader, MmuWriter};
pub use split::{SkipHints, SplitStats};
pub use table::{Error, Mapping, Stage2PageTable};
