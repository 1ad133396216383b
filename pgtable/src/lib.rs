//! Stage-2 page-table engine for arm64 guests.
//!
//! The engine owns a VM's stage-2 translation tables (4 KiB granule): the
//! descriptors ([`Descriptor`], [`Attributes`]), the configuration and the
//! `VTCR_EL2`/`VTTBR_EL2` values it implies ([`Stage2Config`]), one generic
//! walker whose visitors can skip children or siblings ([`walk`]), and the
//! operations built on it. TLB maintenance goes through the `tlb` crate's
//! [`TlbInvalidate`](tlb::TlbInvalidate) backend.
//!
//! - Exclusive operations take `&mut Stage2PageTable` (the write side of the
//!   MMU lock): [`map`](Stage2PageTable::map) (largest aligned blocks,
//!   collapsing tables and splitting blocks with break-before-make),
//!   [`unmap`](Stage2PageTable::unmap) (one deferred range flush with
//!   `FEAT_TLBIRANGE`, empty tables freed after it),
//!   [`write_protect`](Stage2PageTable::write_protect) (no TLBI inside; the
//!   caller flushes the returned span once),
//!   [`relax_perms`](Stage2PageTable::relax_perms), access-flag ageing,
//!   [`split_to_pages`](Stage2PageTable::split_to_pages) with [`SkipHints`]
//!   (per block, or [batched](Stage2PageTable::split_to_pages_batched) with
//!   one barrier sequence per range, and [`Mmu::split_in_chunks`] for eager
//!   splitting chunk by chunk with the write side released between chunks),
//!   [`map_leaf`](Stage2PageTable::map_leaf),
//!   [`flush_dcache`](Stage2PageTable::flush_dcache) and
//!   [`destroy`](Stage2PageTable::destroy).
//! - Shared operations run on the fault path of every vCPU at once, through
//!   an [`MmuReader`] (the read side of [`Mmu`]'s lock): install a leaf,
//!   relax permissions, set the access flag, pinned lookups and walks. Every
//!   change is a compare-and-swap; break-before-make parks a locked marker in
//!   the slot; a lost race answers [`Error::Again`] ("re-enter the guest").
//!   Tables such a walk unlinks are retired to a `crossbeam-epoch` collector
//!   and freed when no CPU that could still see them is pinned.
//! - Memslot changes at run time ([`slot_sync`]): a fault takes a
//!   [`FaultTicket`] before its memslot lookup and installs with
//!   [`MmuReader::map_checked`], which answers `Again` if an invalidation
//!   began or ended since ([`invalidate`]); [`delete_slot`] and [`move_slot`]
//!   publish the change, wait for the memslots' readers, and unmap the old
//!   range with one range flush, so that no leaf of a removed slot survives
//!   or is installed later.
//!
//! Table pages come from the caller through [`PageTableMemory`] (allocate a
//! zeroed page, free it, physical address to pointer); walks take them from a
//! [`PageCache`] topped up beforehand outside any lock, and fail with
//! `NoMemory` rather than allocate. Exclusive map, unmap and split check the
//! cache first, so running out never leaves an operation half-done.
//!
//! Cache maintenance for configurations without FWB (stage 2 cannot force
//! write-back) goes through the same [`PageTableMemory`] provider, as KVM's
//! memory ops do: a leaf's memory is cleaned to the point of coherency after
//! the break and before the make, the instruction cache is invalidated before
//! an executable leaf is published or a leaf gains execute, and unmapped
//! memory is cleaned after its TLB flush.
//!
//! `no_std` + `alloc`. The `host` feature adds `HostMemory`, a checking
//! page provider for tests and benchmarks (live-page count, double-free
//! panic, poisoned quarantine).
//!
//! # Example: map, handle a fault, flush
//!
//! ```
//! use pgtable::{
//!     Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, MemType, Mmu, PageCache,
//!     Perms, PhysAddr, Stage2Config, Stage2PageTable,
//! };
//! use std::sync::Arc;
//! use tlb::{RecordingTlb, TlbCaps};
//!
//! # fn main() -> Result<(), Box<dyn core::error::Error>> {
//! // At EL2: a `PageTableMemory` over the frame allocator, and
//! // `tlb::Aarch64Tlb::new(caps)` with the capabilities every CPU has. On
//! // the host: checked memory and a backend that counts TLBI instructions.
//! let memory = Arc::new(HostMemory::new());
//! let tlb = RecordingTlb::new(TlbCaps::ALL);
//!
//! // A 40-bit IPA space for VMID 1: program VTCR_EL2 and VTTBR_EL2 from it.
//! let config = Stage2Config::new(40)?;
//! let vtcr = config.vtcr(2 /* ID_AA64MMFR0_EL1.PARange: 40 bits */, true)?;
//! let table = Stage2PageTable::new(config, memory.clone(), 1, true)?;
//! let vttbr = table.vttbr();
//! assert_eq!((vtcr & 0x3f, vttbr >> 48), (24, 1));
//!
//! // The MMU object: the table behind its lock; one handle per physical CPU.
//! let mmu = Mmu::new(table, 4)?;
//! let cpu0 = mmu.register()?;
//!
//! // Write side: map a device region up front (topping the cache up first,
//! // outside the lock).
//! let mut cache = PageCache::with_capacity(16);
//! let uart = Attributes { perms: Perms::RW, mem: MemType::Device };
//! let uart_pa = PhysAddr::new(0x0900_0000);
//! let needed = mmu.write().pages_needed_to_map(0x0900_0000, 0x1000, uart_pa)?;
//! cache.top_up(&*memory, needed)?;
//! mmu.write().map(0x0900_0000, 0x1000, uart_pa, uart, &mut cache, &tlb)?;
//!
//! // Read side: a vCPU's translation fault at IPA 0x4012_3456, inside a
//! // memslot whose backing allows a 2 MiB block.
//! cache.top_up(&*memory, FAULT_CACHE_PAGES)?;
//! let leaf = FaultMapping {
//!     ipa: 0x4012_3456 & !0x1f_ffff,
//!     size: 2 << 20,
//!     pa: PhysAddr::new(0x8000_0000),
//!     attrs: Attributes::normal(Perms::RWX),
//! };
//! match mmu.read(&cpu0)?.map(leaf, &mut cache, &tlb) {
//!     // `Again`: another vCPU is changing this entry; re-enter the guest,
//!     // which faults again if the mapping is still missing.
//!     Ok(()) | Err(Error::Again) => {}
//!     Err(e) => return Err(e.into()),
//! }
//! let mapping = mmu.read(&cpu0)?.lookup(0x4012_3456).expect("mapped");
//! assert_eq!((mapping.output, mapping.level), (PhysAddr::new(0x8012_3456), 2));
//!
//! // Dirty logging starts: write-protect the memslot (no TLBI inside the
//! // walk) and flush the span it reports, once.
//! let owed = mmu.write().write_protect(0x4000_0000, 1 << 30)?;
//! owed.flush(&tlb);
//!
//! // Unmapping flushes by itself: one range TLBI plus VMALLE1IS here.
//! tlb.reset();
//! mmu.write().unmap(0x4000_0000, 1 << 30, &mut cache, &tlb)?;
//! assert_eq!(tlb.counts().total(), 2);
//! cache.release(&*memory);
//! # Ok(())
//! # }
//! ```
//!
//! # Tests
//!
//! - `cargo test -p pgtable`: unit tests, the model-based property test and
//!   the stress test (also optimised: `cargo test --release -p pgtable --test
//!   stress`, as CI runs it).
//! - Eager split in chunks (barrier counts, the per-CPU model TLB, faults
//!   between chunks): `cargo test --release -p pgtable --test split_chunks`.
//! - Run-time slot delete and move against faults in flight (stress) and
//!   interleaved with faults (model): `cargo test --release -p pgtable --test
//!   slot_sync --test slot_sync_model`.
//! - The MMU writer waits for a reader inside its read section on every CPU:
//!   `cargo test --release -p pgtable --test mmu_lock`.
//! - Loom models of the shared-walk protocol, bounded to seconds:
//!   `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p pgtable --test loom_bbm`.
//! - Loom models of the MMU lock and of the invalidation ticket against a
//!   run-time slot delete, with the epoch collectors on loom too:
//!   `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom-epoch cargo test --release -p pgtable --test loom_slot_sync`.
#![no_std]

extern crate alloc;

mod addr;
mod attrs;
mod bbm;
mod cache;
mod config;
mod descriptor;
mod fault;
mod flush;
pub mod invalidate;
mod map;
mod mm;
mod mmu;
pub mod slot_sync;
mod split;
mod sync_primitives;
mod table;
mod unmap;
pub use unmap::PER_ENTRY_FLUSH_PAGES;
pub mod walk;

#[cfg(test)]
mod tests;

pub use addr::PhysAddr;
pub use attrs::FlushNeeded;
pub use cache::{OutOfMemory, PageCache};
pub use config::{ConfigError, Stage2Config};
pub use descriptor::{
    Attributes, Descriptor, ENTRIES_PER_TABLE, LAST_LEVEL, LEAF_SIZES, MemType, PAGE_SHIFT,
    PAGE_SIZE, Perms, SOFTWARE_BITS, level_shift, level_size,
};
pub use fault::{FAULT_CACHE_PAGES, FaultMapping};
pub use invalidate::{FaultTicket, InvalidationToken};
pub use mm::{CacheOp, PageTableMemory};
#[cfg(any(test, feature = "host"))]
pub use mm::{CacheOpLog, HostMemory, POISON};
pub use mmu::{MAX_MMU_CPUS, Mmu, MmuCpu, MmuReader, MmuWriter};
pub use slot_sync::{SLOT_UNMAP_CACHE_PAGES, SlotSyncError, delete_slot, move_slot};
pub use split::{SkipHints, SplitStats};
pub use table::{Error, Mapping, Stage2PageTable};
