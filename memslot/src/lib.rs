//! Guest memory slots, after KVM's scalable memslots.
//!
//! A VM's guest-physical memory is a set of slots, each mapping a run of guest
//! frames onto contiguous host memory. [`Memslots`] holds them for one VM:
//! - two [`MemslotSet`]s, each indexed by guest frame (a two-level B+tree
//!   holding the slots by value), by backing range (an augmented interval
//!   treap, [`interval`]) and by id, with a generation number; each vCPU keeps
//!   its own last-slot cache ([`VcpuSlotCache`]);
//! - readers (vCPUs) look slots up lock-free, under a `crossbeam_epoch` guard
//!   of the VM's collector, and see either the old or the new set;
//! - writers (create, delete, move, flags) are serialized, change the inactive
//!   set in O(log n), publish it with one atomic store, and replay the change
//!   on the other set once the epoch shows no reader can see it any more (see
//!   [`memslots`] for the algorithm and its cost);
//! - a run-time delete or move ([`Memslots::delete_synced`],
//!   [`Memslots::move_synced`]) also waits for that grace period before it
//!   returns, so that the caller may unmap and then free the old backing;
//! - a logging slot has a [`DirtyBitmap`] that the fault path marks lock-free
//!   and the management path harvests ([`dirty`]).
//!
//! Every request is validated first and refused with a [`MemslotError`] that
//! changes nothing. The crate is `no_std` + `alloc` and knows nothing of the
//! hypervisor.
//!
//! ```
//! use crossbeam_epoch::Collector;
//! use memslot::{DirtyLogMode, Gfn, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec, VcpuSlotCache};
//!
//! let collector = Collector::new();
//! let handle = collector.register(); // one per CPU
//! let vm = Memslots::new(&collector, DirtyLogMode::default())?;
//!
//! // Management path: 16 MiB of guest RAM at IPA 0x4000_0000, logging dirty pages.
//! let id = SlotId::new(0)?;
//! let spec = SlotSpec {
//!     id,
//!     base_gfn: Gfn::from_ipa(0x4000_0000),
//!     npages: 4096,
//!     backing: HostPhysAddr(0x8_0000_0000),
//!     flags: SlotFlags::LOG_DIRTY,
//! };
//! vm.create(&handle, spec)?;
//!
//! // Fault path: pin, look up (through this vCPU's cache), translate, mark dirty.
//! let mut cache = VcpuSlotCache::new();
//! let guard = handle.pin();
//! let slot = vm.slots(&guard)?.find_cached(Gfn::from_ipa(0x4000_3000), &mut cache).expect("mapped");
//! assert_eq!(slot.translate(Gfn::from_ipa(0x4000_3000)), Some(HostPhysAddr(0x8_0000_3000)));
//! assert!(slot.mark_dirty(Gfn::from_ipa(0x4000_3000)));
//! drop(guard); // unpin before any management call on this handle
//!
//! // Management path again: harvest the dirty log.
//! let mut bits = [0u64; 64];
//! assert_eq!(vm.get_dirty_log(&handle, id, &mut bits)?, 1);
//! assert_eq!(bits[0], 1 << 3);
//! # Ok::<(), memslot::MemslotError>(())
//! ```
#![no_std]

extern crate alloc;

pub mod dirty;
mod error;
pub mod gfn_index;
pub mod interval;
pub mod memslots;
pub mod set;
mod slot;
mod sync_primitives;

pub use dirty::DirtyBitmap;
pub use error::MemslotError;
pub use memslots::{ChangeKind, DirtyLogMode, Memslots};
pub use set::{BackingOverlaps, MemslotSet, VcpuSlotCache};
pub use slot::{
    GFN_LIMIT, Gfn, HostPhysAddr, MAX_SLOT_PAGES, MAX_SLOTS, Memslot, PAGE_SHIFT, PAGE_SIZE,
    SlotFlags, SlotId, SlotSpec,
};
