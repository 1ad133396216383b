//! One memory slot and the small types that describe it.
//!
//! A slot maps `npages` guest frames from `base_gfn` onto a page-aligned,
//! physically contiguous backing range. Slots are immutable once built: a move
//! or a flags change makes a new `Memslot` that replaces the old one in both
//! sets, so readers can hold `&Memslot` without locks. Only the dirty bitmap
//! changes in place, with atomic word operations.

use alloc::sync::Arc;
use core::fmt;

use crate::dirty::DirtyBitmap;
use crate::error::MemslotError;

/// Everything here counts 4 KiB pages: the granule is defined once by the
/// `tlb` crate (the root of the library dependency graph) and re-exported here.
pub use tlb::{PAGE_SHIFT, PAGE_SIZE};
/// Slot ids run from 0 to `MAX_SLOTS - 1` (KVM's 32,767 user slots).
pub const MAX_SLOTS: u32 = 32767;
/// A slot holds fewer than 2^31 pages.
pub const MAX_SLOT_PAGES: u64 = (1 << 31) - 1;
/// Guest frames lie below 2^40 (52-bit intermediate physical addresses).
pub const GFN_LIMIT: u64 = 1 << 40;

/// A guest frame number: an intermediate physical address shifted right by [`PAGE_SHIFT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gfn(pub u64);

impl Gfn {
    /// The frame that holds intermediate physical address `ipa`.
    pub const fn from_ipa(ipa: u64) -> Self {
        Self(ipa >> PAGE_SHIFT)
    }

    /// The address of the first byte of this frame.
    pub const fn ipa(self) -> u64 {
        self.0 << PAGE_SHIFT
    }
}

impl fmt::Display for Gfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gfn {:#x}", self.0)
    }
}

/// A host physical address (the memory behind a slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPhysAddr(pub u64);

impl HostPhysAddr {
    /// Whether the address is page-aligned.
    pub const fn is_page_aligned(self) -> bool {
        self.0 & (PAGE_SIZE - 1) == 0
    }
}

impl fmt::Display for HostPhysAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pa {:#x}", self.0)
    }
}

/// A slot id, checked to lie in `0..MAX_SLOTS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId(u16);

impl SlotId {
    /// Checks `id` against [`MAX_SLOTS`].
    pub const fn new(id: u32) -> Result<Self, MemslotError> {
        if id < MAX_SLOTS {
            Ok(Self(id as u16))
        } else {
            Err(MemslotError::IdOutOfRange(id))
        }
    }

    /// The id as a number.
    pub const fn get(self) -> u32 {
        self.0 as u32
    }

    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Slot flags: dirty logging and read-only (KVM's bit values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotFlags(u32);

impl SlotFlags {
    /// No flags: a writable slot without dirty logging.
    pub const NONE: Self = Self(0);
    /// Record guest writes in the slot's dirty bitmap.
    pub const LOG_DIRTY: Self = Self(1 << 0);
    /// The guest may only read the slot; writes exit to the hypervisor.
    pub const READ_ONLY: Self = Self(1 << 1);
    const KNOWN: u32 = Self::LOG_DIRTY.0 | Self::READ_ONLY.0;

    /// Flags from raw bits, refusing bits this crate does not know.
    pub const fn from_bits(bits: u32) -> Result<Self, MemslotError> {
        if bits & !Self::KNOWN == 0 {
            Ok(Self(bits))
        } else {
            Err(MemslotError::UnknownFlags(bits & !Self::KNOWN))
        }
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag in `other` is set here.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The flags of both.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// These flags without those of `other`.
    pub const fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
}

/// What a caller asks for: a slot before it is validated and built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSpec {
    /// The slot's id.
    pub id: SlotId,
    /// First guest frame.
    pub base_gfn: Gfn,
    /// Length in pages.
    pub npages: u64,
    /// Start of the backing memory (page-aligned).
    pub backing: HostPhysAddr,
    /// Dirty logging and read-only.
    pub flags: SlotFlags,
}

impl SlotSpec {
    /// Checks everything that does not depend on other slots: size, alignment,
    /// address-space bounds and flag combinations.
    pub(crate) fn validate_shape(&self) -> Result<(), MemslotError> {
        if self.npages == 0 {
            return Err(MemslotError::ZeroSize);
        }
        if self.npages > MAX_SLOT_PAGES {
            return Err(MemslotError::TooManyPages(self.npages));
        }
        if !self.backing.is_page_aligned() {
            return Err(MemslotError::MisalignedBacking(self.backing));
        }
        if self.base_gfn.0 >= GFN_LIMIT || GFN_LIMIT - self.base_gfn.0 < self.npages {
            return Err(MemslotError::GfnRangeOutOfBounds {
                base_gfn: self.base_gfn,
                npages: self.npages,
            });
        }
        let bytes = self.npages << PAGE_SHIFT;
        if self.backing.0.checked_add(bytes).is_none() {
            return Err(MemslotError::BackingRangeOverflow {
                backing: self.backing,
                npages: self.npages,
            });
        }
        if self.flags.contains(SlotFlags::LOG_DIRTY) && self.flags.contains(SlotFlags::READ_ONLY) {
            return Err(MemslotError::DirtyLogOnReadOnly(self.id));
        }
        Ok(())
    }
}

/// A live memory slot. Shared (by `Arc`) between the two sets of a VM.
#[derive(Debug)]
pub struct Memslot {
    id: SlotId,
    base_gfn: Gfn,
    npages: u64,
    backing: HostPhysAddr,
    flags: SlotFlags,
    dirty: Option<Arc<DirtyBitmap>>,
}

impl Memslot {
    /// Builds a slot from a validated spec and its bitmap (present exactly when logging).
    pub(crate) fn new(spec: &SlotSpec, dirty: Option<Arc<DirtyBitmap>>) -> Self {
        debug_assert_eq!(dirty.is_some(), spec.flags.contains(SlotFlags::LOG_DIRTY));
        Self {
            id: spec.id,
            base_gfn: spec.base_gfn,
            npages: spec.npages,
            backing: spec.backing,
            flags: spec.flags,
            dirty,
        }
    }

    /// A second copy of this slot for another index of the same set: the same
    /// range, backing and flags, and the same dirty bitmap (shared).
    pub(crate) fn duplicate(&self) -> Self {
        Self {
            dirty: self.dirty.clone(),
            ..*self
        }
    }

    /// The slot's id.
    pub fn id(&self) -> SlotId {
        self.id
    }

    /// First guest frame.
    pub fn base_gfn(&self) -> Gfn {
        self.base_gfn
    }

    /// One past the last guest frame.
    pub fn end_gfn(&self) -> Gfn {
        Gfn(self.base_gfn.0 + self.npages)
    }

    /// Length in pages.
    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// Start of the backing memory.
    pub fn backing(&self) -> HostPhysAddr {
        self.backing
    }

    /// One past the last byte of the backing memory.
    pub fn backing_end(&self) -> HostPhysAddr {
        HostPhysAddr(self.backing.0 + (self.npages << PAGE_SHIFT))
    }

    /// The slot's flags.
    pub fn flags(&self) -> SlotFlags {
        self.flags
    }

    /// Whether the guest may only read this slot.
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(SlotFlags::READ_ONLY)
    }

    /// The spec this slot was built from.
    pub fn spec(&self) -> SlotSpec {
        SlotSpec {
            id: self.id,
            base_gfn: self.base_gfn,
            npages: self.npages,
            backing: self.backing,
            flags: self.flags,
        }
    }

    /// Whether `gfn` lies in the slot.
    #[inline]
    pub fn contains(&self, gfn: Gfn) -> bool {
        gfn.0.wrapping_sub(self.base_gfn.0) < self.npages
    }

    /// The host physical address behind `gfn`, or `None` when `gfn` is outside the slot.
    #[inline]
    pub fn translate(&self, gfn: Gfn) -> Option<HostPhysAddr> {
        self.contains(gfn)
            .then(|| HostPhysAddr(self.backing.0 + ((gfn.0 - self.base_gfn.0) << PAGE_SHIFT)))
    }

    /// The dirty bitmap, present exactly while the slot logs dirty pages.
    pub fn dirty_bitmap(&self) -> Option<&DirtyBitmap> {
        self.dirty.as_deref()
    }

    pub(crate) fn dirty_bitmap_arc(&self) -> Option<&Arc<DirtyBitmap>> {
        self.dirty.as_ref()
    }

    /// Records a guest write to `gfn` (lock-free; for the fault path). Returns
    /// whether it was recorded: false when the slot is not logging or `gfn` is
    /// outside it.
    #[inline]
    pub fn mark_dirty(&self, gfn: Gfn) -> bool {
        match &self.dirty {
            Some(bitmap) if self.contains(gfn) => bitmap.mark(gfn.0 - self.base_gfn.0),
            _ => false,
        }
    }
}
