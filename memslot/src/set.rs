//! One memslot set: the slots of a VM at one generation, indexed three ways.
//!
//! - The gfn index ([`crate::gfn_index`], a two-level B+tree of sorted blocks
//!   holding copies of the slots by value) answers "which slot holds this
//!   frame" by finding the last slot starting at or below it (slots never
//!   overlap in guest space, so it is the only candidate), and walks guest
//!   ranges in order. Two binary searches, then one read of the slot itself.
//! - An interval tree over backing ranges ([`crate::interval`]) answers "which
//!   slots overlap this host range" (ranges may overlap: aliases, shared memory).
//! - An id map (a vector indexed by id) finds a slot by id in O(1).
//! - [`VcpuSlotCache`] is one vCPU's own memory of its last hit: a gfn index
//!   position, valid only for the generation it was filled in, so a hit reads
//!   the same slot copy a search would, with no pointer to follow.
//!
//! # No shared last-used slot
//!
//! The set keeps no "last used slot" that every lookup reads and writes (the
//! older KVM design): with several vCPUs faulting in different slots, that
//! word's cache line moves between CPUs on every miss, and for lookups
//! without locality it costs a load, a compare and a store before the search
//! (measured by `bench -- memslots`: about 4 ns of a 10 ns lookup at 10
//! slots). Locality belongs to the caller: each vCPU keeps its own
//! [`VcpuSlotCache`] and passes it to [`MemslotSet::find_cached`].
//!
//! Slots sit in an arena (`Vec<Option<Arc<Memslot>>>` with a free list); the
//! interval tree, the id map and the caches hold arena indices. A set is
//! changed only while no reader can see it (see [`crate::Memslots`]); a change
//! costs O(log n) in the interval tree and id map plus one block shift (at
//! most [`crate::gfn_index::BLOCK_MAX`] entries) in the gfn index.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::gfn_index::{GfnIndex, Position};
use crate::interval::{BackingTree, Overlaps};
use crate::slot::{Gfn, HostPhysAddr, Memslot, SlotId};

/// No slot index.
const NONE: u32 = u32::MAX;

/// The slots of a VM at one generation.
#[derive(Debug)]
pub struct MemslotSet {
    generation: u64,
    slots: Vec<Option<Arc<Memslot>>>,
    free: Vec<u32>,
    by_gfn: GfnIndex,
    by_id: Vec<u32>,
    by_backing: BackingTree,
}

/// A vCPU's memory of the slot its last lookup found, tagged with the
/// generation of the set it came from; a lookup in any other generation
/// ignores it.
#[derive(Clone, Copy, Debug)]
pub struct VcpuSlotCache {
    generation: u64,
    position: Position,
}

impl VcpuSlotCache {
    /// An empty cache.
    pub const fn new() -> Self {
        Self {
            generation: 0,
            position: Position::NONE,
        }
    }
}

impl Default for VcpuSlotCache {
    fn default() -> Self {
        Self::new()
    }
}

impl MemslotSet {
    pub(crate) const fn new() -> Self {
        Self {
            generation: 0,
            slots: Vec::new(),
            free: Vec::new(),
            by_gfn: GfnIndex::new(),
            by_id: Vec::new(),
            by_backing: BackingTree::new(),
        }
    }

    /// The generation this set was published as. Every published change gets a
    /// new, larger generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn set_generation(&mut self, generation: u64) {
        self.generation = generation;
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.by_gfn.len()
    }

    /// Whether the set has no slot.
    pub fn is_empty(&self) -> bool {
        self.by_gfn.len() == 0
    }

    fn slot(&self, index: u32) -> &Memslot {
        self.slots[index as usize]
            .as_deref()
            .expect("index names a live slot")
    }

    /// The slot with id `id`.
    pub fn get(&self, id: SlotId) -> Option<&Memslot> {
        let index = *self.by_id.get(id.index())?;
        (index != NONE).then(|| self.slot(index))
    }

    #[inline]
    fn find_position(&self, gfn: Gfn) -> Option<(Position, &Memslot)> {
        let (position, slot) = self.by_gfn.locate(gfn.0)?;
        slot.contains(gfn).then_some((position, slot))
    }

    /// The slot holding `gfn`: a search of the gfn index.
    #[inline]
    pub fn find(&self, gfn: Gfn) -> Option<&Memslot> {
        self.find_position(gfn).map(|(_, slot)| slot)
    }

    /// The slot holding `gfn`, trying `cache` first and refilling it on a miss.
    #[inline]
    pub fn find_cached(&self, gfn: Gfn, cache: &mut VcpuSlotCache) -> Option<&Memslot> {
        if cache.generation == self.generation
            && let Some(slot) = self.by_gfn.at(cache.position)
            && slot.contains(gfn)
        {
            return Some(slot);
        }
        let (position, slot) = self.find_position(gfn)?;
        *cache = VcpuSlotCache {
            generation: self.generation,
            position,
        };
        Some(slot)
    }

    /// The slot holding `gfn`, or else the nearest slot: the first one above
    /// `gfn`, or when there is none the last one below. `None` only for an
    /// empty set.
    pub fn find_approx(&self, gfn: Gfn) -> Option<&Memslot> {
        if let Some(slot) = self.find(gfn) {
            return Some(slot);
        }
        let above = self.by_gfn.from(gfn.0).next();
        above.or_else(|| self.by_gfn.below(gfn.0))
    }

    /// Every slot, in guest-frame order.
    pub fn iter(&self) -> impl Iterator<Item = &Memslot> + '_ {
        self.by_gfn.from(0)
    }

    /// Every slot holding a frame of `[start, end)`, in guest-frame order. O(log n + k).
    pub fn in_gfn_range(&self, start: Gfn, end: Gfn) -> impl Iterator<Item = &Memslot> + '_ {
        let first = if start < end {
            self.by_gfn.below(start.0).filter(|s| s.end_gfn() > start)
        } else {
            None
        };
        let rest = self
            .by_gfn
            .from(start.0)
            .take_while(move |slot| slot.base_gfn() < end);
        first.into_iter().chain(rest)
    }

    /// Every slot whose backing memory overlaps `[start, end)` (bytes), in
    /// order of backing address. See [`crate::interval`] for the cost.
    pub fn overlapping_backing(
        &self,
        start: HostPhysAddr,
        end: HostPhysAddr,
    ) -> BackingOverlaps<'_> {
        BackingOverlaps {
            set: self,
            inner: self.by_backing.overlapping(start.0, end.0),
        }
    }

    /// Adds a validated slot whose id is free and whose guest range is free.
    pub(crate) fn insert(&mut self, slot: Arc<Memslot>) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let id = slot.id().index();
        if self.by_id.len() <= id {
            self.by_id.resize(id + 1, NONE);
        }
        debug_assert_eq!(self.by_id[id], NONE, "inserting over a live id");
        self.by_id[id] = index;
        self.by_gfn.insert(slot.duplicate());
        self.by_backing
            .insert(index, slot.backing().0, slot.backing_end().0);
        self.slots[index as usize] = Some(slot);
    }

    /// Removes slot `id`, which must be live, and returns it.
    pub(crate) fn remove(&mut self, id: SlotId) -> Arc<Memslot> {
        let index = core::mem::replace(&mut self.by_id[id.index()], NONE);
        let slot = self.slots[index as usize]
            .take()
            .expect("removing a live slot");
        self.by_gfn.remove(slot.base_gfn().0);
        self.by_backing.remove(index);
        self.free.push(index);
        slot
    }
}

/// Iterator over the slots whose backing memory overlaps a range.
pub struct BackingOverlaps<'a> {
    set: &'a MemslotSet,
    inner: Overlaps<'a>,
}

impl<'a> Iterator for BackingOverlaps<'a> {
    type Item = &'a Memslot;

    fn next(&mut self) -> Option<&'a Memslot> {
        self.inner.next().map(|i| self.set.slot(i))
    }
}
