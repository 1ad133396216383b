//! Why a memslot operation was refused.
//!
//! Every management call validates its whole request before touching either
//! set, so an error always means that nothing changed. Each variant names the
//! rule that was broken and carries the values that broke it.

use core::fmt;

use crate::slot::{Gfn, HostPhysAddr, SlotId};

/// A refused memslot operation. Nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemslotError {
    /// A slot id outside `0..MAX_SLOTS`.
    IdOutOfRange(u32),
    /// A slot of zero pages.
    ZeroSize,
    /// A slot larger than `MAX_SLOT_PAGES` pages.
    TooManyPages(u64),
    /// A backing address that is not page-aligned.
    MisalignedBacking(HostPhysAddr),
    /// The guest range `[base_gfn, base_gfn + npages)` goes past `GFN_LIMIT`.
    GfnRangeOutOfBounds {
        /// First guest frame of the requested range.
        base_gfn: Gfn,
        /// Length of the requested range in pages.
        npages: u64,
    },
    /// The backing range `[backing, backing + npages pages)` wraps around the address space.
    BackingRangeOverflow {
        /// Start of the requested backing range.
        backing: HostPhysAddr,
        /// Length of the requested range in pages.
        npages: u64,
    },
    /// Flag bits this crate does not know.
    UnknownFlags(u32),
    /// Dirty logging asked for on a read-only slot, which the guest can never write.
    DirtyLogOnReadOnly(SlotId),
    /// A create for an id that already names a slot.
    IdInUse(SlotId),
    /// An operation on an id that names no slot.
    NoSuchSlot(SlotId),
    /// A move of a slot to the guest frame it already starts at.
    NotAMove(SlotId),
    /// The guest range of `id` would overlap the guest range of `other`.
    GuestOverlap {
        /// The slot being created or moved.
        id: SlotId,
        /// The live slot it would overlap.
        other: SlotId,
    },
    /// An attempt to change the size of a live slot (delete and re-create it instead).
    SizeChange {
        /// The live slot.
        id: SlotId,
        /// Its size in pages.
        current: u64,
        /// The size asked for.
        requested: u64,
    },
    /// An attempt to change the backing address of a live slot.
    BackingChange(SlotId),
    /// An attempt to toggle the read-only flag of a live slot.
    ReadOnlyChange(SlotId),
    /// A dirty-log call on a slot that is not logging.
    NotLogging(SlotId),
    /// A dirty-log clear on a VM that does not use manual protection.
    ManualProtectDisabled,
    /// `initially_all_set` asked for without manual protection (as KVM, it needs it).
    InitiallySetNeedsManualProtect,
    /// The dirty-log mode cannot change while a slot logs.
    LoggingActive(SlotId),
    /// The caller's dirty-log buffer holds fewer words than the bitmap.
    DirtyBufferTooSmall {
        /// Words the bitmap has.
        needed: usize,
        /// Words the buffer has.
        given: usize,
    },
    /// A dirty-log clear whose first page is not a multiple of 64.
    DirtyClearUnaligned(u64),
    /// A dirty-log clear that reaches past the end of the slot.
    DirtyClearOutOfRange {
        /// First page of the clear, relative to the slot.
        first_page: u64,
        /// Pages the mask covers.
        npages: u64,
    },
    /// A guard or handle that belongs to another epoch collector than the one
    /// this VM's memslots were created with (it would not protect the sets).
    ForeignCollector,
    /// A writer called while its own handle is pinned: waiting for readers to
    /// leave the old set would then wait for itself forever.
    WriterPinned,
}

impl fmt::Display for MemslotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::IdOutOfRange(id) => {
                write!(f, "slot id {id} is out of range 0..{}", crate::MAX_SLOTS)
            }
            Self::ZeroSize => write!(f, "a slot needs at least one page"),
            Self::TooManyPages(n) => {
                write!(
                    f,
                    "{n} pages is more than the {} a slot may have",
                    crate::MAX_SLOT_PAGES
                )
            }
            Self::MisalignedBacking(a) => write!(f, "backing address {a} is not page-aligned"),
            Self::GfnRangeOutOfBounds { base_gfn, npages } => {
                write!(
                    f,
                    "guest range {base_gfn} + {npages} pages passes the guest frame limit"
                )
            }
            Self::BackingRangeOverflow { backing, npages } => {
                write!(f, "backing range {backing} + {npages} pages wraps around")
            }
            Self::UnknownFlags(bits) => write!(f, "unknown slot flag bits {bits:#x}"),
            Self::DirtyLogOnReadOnly(id) => {
                write!(f, "slot {id} is read-only and cannot log dirty pages")
            }
            Self::IdInUse(id) => write!(f, "slot {id} already exists"),
            Self::NoSuchSlot(id) => write!(f, "slot {id} does not exist"),
            Self::NotAMove(id) => write!(f, "slot {id} already starts at that guest frame"),
            Self::GuestOverlap { id, other } => {
                write!(f, "slot {id} would overlap slot {other} in guest space")
            }
            Self::SizeChange {
                id,
                current,
                requested,
            } => write!(
                f,
                "slot {id} has {current} pages and cannot be resized to {requested} while live"
            ),
            Self::BackingChange(id) => {
                write!(f, "the backing address of live slot {id} cannot change")
            }
            Self::ReadOnlyChange(id) => {
                write!(f, "the read-only flag of live slot {id} cannot change")
            }
            Self::NotLogging(id) => write!(f, "slot {id} is not logging dirty pages"),
            Self::LoggingActive(id) => write!(
                f,
                "slot {id} is logging dirty pages: the dirty-log mode cannot change"
            ),
            Self::ManualProtectDisabled => {
                write!(f, "clearing the dirty log needs manual protection")
            }
            Self::InitiallySetNeedsManualProtect => {
                write!(f, "initially-all-set dirty bitmaps need manual protection")
            }
            Self::DirtyBufferTooSmall { needed, given } => {
                write!(
                    f,
                    "dirty-log buffer has {given} words, the bitmap has {needed}"
                )
            }
            Self::DirtyClearUnaligned(p) => write!(
                f,
                "dirty-log clear starts at page {p}, not a multiple of 64"
            ),
            Self::DirtyClearOutOfRange { first_page, npages } => {
                write!(
                    f,
                    "dirty-log clear of {npages} pages from page {first_page} passes the slot end"
                )
            }
            Self::ForeignCollector => {
                write!(f, "guard or handle belongs to another epoch collector")
            }
            Self::WriterPinned => write!(
                f,
                "the writer's handle is pinned; unpin before changing slots"
            ),
        }
    }
}

impl core::error::Error for MemslotError {}
