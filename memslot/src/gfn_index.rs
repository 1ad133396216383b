//! The gfn index: slots ordered by `base_gfn`, as a two-level B+tree.
//!
//! Leaves are sorted blocks of at most [`BLOCK_MAX`] entries; the top level is
//! the sorted array of each block's first key. A lookup finds the block (with
//! one block, up to 128 slots, there is nothing to find; up to 16 blocks the
//! first keys at or below the key are counted, compares the CPU runs side by
//! side; beyond, a binary search of the top array, small enough to stay in
//! cache), then searches the block: several times faster than a
//! pointer-based tree at 32,767 slots. An insert shifts at most one block and
//! splits a full block in two (in half, or, for a new largest key, leaving the
//! full block full: slots are mostly created in address order, and full blocks
//! mean fewer of them to search); a remove shifts one block and merges a block
//! that fell below [`BLOCK_MIN`] into a neighbour when they fit together. With
//! the slot limit of 32,767 the two levels never need a third: the top holds
//! at most `n / BLOCK_MIN + 1` keys, so a change moves at most a few KiB.
//!
//! # The block search
//!
//! A block keeps its keys in a fixed array of their own (1 KiB), the slots
//! past its length holding `u64::MAX`, above every gfn. The search for the
//! last key at or below the lookup's is then a binary search of fixed steps,
//! 64, 32, ... 1 (8, 4, 2, 1 in a block of at most 16 keys), each a compare
//! and a conditional add with no branch and no bound but the array's: the
//! compiler unrolls it, and nothing waits on the block's length. Measured
//! against a search of the block's used keys (`partition_point`), it is what
//! made lookups at 509 and 8,194 slots clearly faster than the sorted array's
//! rather than even (`bench -- memslots`).
//!
//! The entries are the slots themselves, stored by value (a [`Memslot`] is a
//! few words: range, backing, flags and a shared pointer to the dirty bitmap),
//! so a lookup tests containment and returns the slot from the one cache line
//! it reads after the searches, with no pointer to follow. A sorted array of
//! slots needs about `log2 n` probes spread over the whole array; here the top
//! array is small enough to stay cached, and the block search reads one 1 KiB
//! key array.
//!
//! # Positions
//!
//! A `Position` names an entry (block, index in block) packed in a `u32`.
//! It is valid only for the index it came from, until the next change: a
//! vCPU's cache carries the generation of the set it was filled from.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::slot::Memslot;

/// Most entries a block holds; a full block splits in two.
pub const BLOCK_MAX: usize = 128;
/// Top-level sizes up to this are counted, not binary-searched.
const LINEAR_TOP: usize = 16;
/// A block with fewer entries merges into a neighbour when they fit in one.
pub const BLOCK_MIN: usize = 32;

/// Bits of a packed [`Position`] that hold the index within the block.
const AT_BITS: u32 = 8;
const _: () = assert!(BLOCK_MAX < 1 << AT_BITS);

/// An entry's place in one index: block and index within it, packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position(u32);

impl Position {
    /// No entry: never returned by a lookup, never found by [`GfnIndex::at`].
    pub(crate) const NONE: Self = Self(u32::MAX);

    fn new(block: usize, at: usize) -> Self {
        Self(((block as u32) << AT_BITS) | at as u32)
    }

    fn block(self) -> usize {
        (self.0 >> AT_BITS) as usize
    }

    fn at(self) -> usize {
        (self.0 & ((1 << AT_BITS) - 1)) as usize
    }
}

/// Key slots in a block: one more than [`BLOCK_MAX`], for the moment
/// between an insert into a full block and its split.
const KEY_SLOTS: usize = BLOCK_MAX + 1;
/// What a block's key slots hold past its entries: above every key, so the
/// block search needs no length.
const NO_KEY: u64 = u64::MAX;

/// A leaf: the keys alone, in a fixed array (so the search touches few
/// cache lines and runs the same seven steps whatever the block's length),
/// and the slots, in the same order.
#[derive(Debug)]
struct Block {
    /// `keys[..len]` in order, [`NO_KEY`] after.
    keys: Box<[u64; KEY_SLOTS]>,
    entries: Vec<Memslot>,
}

/// Blocks up to this long are searched in four steps.
const SMALL_BLOCK: usize = 16;

/// The last index below `2 * FIRST_STEP` whose key is `<= key`, given
/// `keys[0] <= key` and every key from `2 * FIRST_STEP` on above it: steps
/// `FIRST_STEP`, half that, ... 1, each adding itself where the key there
/// is not above `key` (a conditional move, not a branch).
#[inline(always)]
fn floor_in<const FIRST_STEP: usize>(keys: &[u64; KEY_SLOTS], key: u64) -> usize {
    const { assert!(2 * FIRST_STEP <= KEY_SLOTS) };
    let mut at = 0;
    let mut step = FIRST_STEP;
    while step > 0 {
        // `at + step < 2 * FIRST_STEP`: within the key slots.
        at += step * usize::from(keys[at + step] <= key);
        step /= 2;
    }
    at
}

impl Block {
    fn with(entry: Memslot) -> Self {
        let mut keys = Box::new([NO_KEY; KEY_SLOTS]);
        keys[0] = entry.base_gfn().0;
        Self {
            keys,
            entries: alloc::vec![entry],
        }
    }

    /// The keys in use.
    fn keys(&self) -> &[u64] {
        &self.keys[..self.len()]
    }

    /// The index of the last key `<= key`; the first key must be `<= key`,
    /// and `key` below [`NO_KEY`]. A binary search with fixed steps (four in
    /// a block of up to [`SMALL_BLOCK`] keys, else seven) and no branch on
    /// the compares.
    #[inline]
    fn floor(&self, key: u64) -> usize {
        if self.len() <= SMALL_BLOCK {
            floor_in::<{ SMALL_BLOCK / 2 }>(&self.keys, key)
        } else {
            floor_in::<{ BLOCK_MAX / 2 }>(&self.keys, key)
        }
    }

    fn insert(&mut self, at: usize, entry: Memslot) {
        let len = self.len();
        self.keys.copy_within(at..len, at + 1);
        self.keys[at] = entry.base_gfn().0;
        self.entries.insert(at, entry);
    }

    fn remove(&mut self, at: usize) -> Memslot {
        let len = self.len();
        self.keys.copy_within(at + 1..len, at);
        self.keys[len - 1] = NO_KEY;
        self.entries.remove(at)
    }

    fn split_off(&mut self, at: usize) -> Block {
        let len = self.len();
        let mut keys = Box::new([NO_KEY; KEY_SLOTS]);
        keys[..len - at].copy_from_slice(&self.keys[at..len]);
        self.keys[at..len].fill(NO_KEY);
        Block {
            keys,
            entries: self.entries.split_off(at),
        }
    }

    fn append(&mut self, mut other: Block) {
        let (len, more) = (self.len(), other.len());
        self.keys[len..len + more].copy_from_slice(other.keys());
        self.entries.append(&mut other.entries);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[derive(Debug, Default)]
pub(crate) struct GfnIndex {
    firsts: Vec<u64>,
    blocks: Vec<Block>,
    len: usize,
}

impl GfnIndex {
    pub(crate) const fn new() -> Self {
        Self {
            firsts: Vec::new(),
            blocks: Vec::new(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The block and index of the last entry with `base_gfn <= key`.
    #[inline]
    fn floor(&self, key: u64) -> Option<(usize, usize)> {
        // No slot starts at `NO_KEY` (gfns are below 2^52).
        let key = key.min(NO_KEY - 1);
        if let [only] = &self.blocks[..] {
            // One block (up to `BLOCK_MAX` slots): nothing to search above.
            return (only.keys[0] <= key).then(|| (0, only.floor(key)));
        }
        // Up to `LINEAR_TOP` blocks (a thousand slots or more), the top level
        // is counted rather than searched: independent compares the CPU
        // overlaps, where each step of a binary search waits for the last.
        let block = if self.firsts.len() <= LINEAR_TOP {
            self.firsts
                .iter()
                .map(|&first| usize::from(first <= key))
                .sum::<usize>()
        } else {
            self.firsts.partition_point(|&first| first <= key)
        }
        .checked_sub(1)?;
        // `firsts[block] <= key`, so at least the block's first entry
        // qualifies.
        let at = self.blocks[block].floor(key);
        Some((block, at))
    }

    fn get(&self, (block, at): (usize, usize)) -> Option<&Memslot> {
        self.blocks.get(block)?.entries.get(at)
    }

    /// The place after `(block, at)` (may be one past the end).
    fn next(&self, (block, at): (usize, usize)) -> (usize, usize) {
        if at + 1 < self.blocks[block].len() {
            (block, at + 1)
        } else {
            (block + 1, 0)
        }
    }

    /// The entry with the largest `base_gfn <= key`, and its position.
    #[inline]
    pub(crate) fn locate(&self, key: u64) -> Option<(Position, &Memslot)> {
        let (block, at) = self.floor(key)?;
        Some((Position::new(block, at), &self.blocks[block].entries[at]))
    }

    /// The entry at `position`, if it names one.
    #[inline]
    pub(crate) fn at(&self, position: Position) -> Option<&Memslot> {
        self.get((position.block(), position.at()))
    }

    /// The entry with the largest `base_gfn <= key`.
    #[inline]
    pub(crate) fn at_or_below(&self, key: u64) -> Option<&Memslot> {
        self.floor(key).and_then(|p| self.get(p))
    }

    /// The entry with the largest `base_gfn < key`.
    pub(crate) fn below(&self, key: u64) -> Option<&Memslot> {
        self.at_or_below(key.checked_sub(1)?)
    }

    /// Entries with `base_gfn >= key`, in order.
    pub(crate) fn from(&self, key: u64) -> Iter<'_> {
        let position = match self.floor(key) {
            Some(p) if self.get(p).is_some_and(|e| e.base_gfn().0 >= key) => p,
            Some(p) => self.next(p),
            None => (0, 0),
        };
        Iter {
            index: self,
            position,
        }
    }

    /// Adds an entry whose `base_gfn` is not in the index.
    pub(crate) fn insert(&mut self, entry: Memslot) {
        self.len += 1;
        let key = entry.base_gfn().0;
        if self.blocks.is_empty() {
            self.firsts.push(key);
            self.blocks.push(Block::with(entry));
            return;
        }
        let block = self
            .firsts
            .partition_point(|&first| first <= key)
            .saturating_sub(1);
        let entries = &mut self.blocks[block];
        let at = entries.keys().partition_point(|&k| k < key);
        debug_assert!(entries.keys().get(at) != Some(&key), "duplicate base gfn");
        entries.insert(at, entry);
        self.firsts[block] = entries.keys[0];
        if entries.len() > BLOCK_MAX {
            // A new largest key (slots created in address order) starts a
            // block of its own and leaves this one full; any other insert
            // splits in half, leaving room on both sides.
            let appended = block + 1 == self.firsts.len() && at == BLOCK_MAX;
            let upper = entries.split_off(if appended { BLOCK_MAX } else { BLOCK_MAX / 2 });
            self.firsts.insert(block + 1, upper.keys[0]);
            self.blocks.insert(block + 1, upper);
        }
    }

    /// Removes the entry with `base_gfn == key`, which must be present.
    pub(crate) fn remove(&mut self, key: u64) -> Memslot {
        let (block, at) = self.floor(key).expect("removing a present key");
        let entries = &mut self.blocks[block];
        debug_assert_eq!(entries.keys[at], key, "removing an absent key");
        let entry = entries.remove(at);
        self.len -= 1;
        if entries.len() == 0 {
            self.firsts.remove(block);
            self.blocks.remove(block);
            return entry;
        }
        self.firsts[block] = entries.keys[0];
        if entries.len() < BLOCK_MIN {
            let len = entries.len();
            if block + 1 < self.blocks.len() && len + self.blocks[block + 1].len() <= BLOCK_MAX {
                self.merge_into_previous(block + 1);
            } else if block > 0 && len + self.blocks[block - 1].len() <= BLOCK_MAX {
                self.merge_into_previous(block);
            }
        }
        entry
    }

    fn merge_into_previous(&mut self, block: usize) {
        let moved = self.blocks.remove(block);
        self.firsts.remove(block);
        self.blocks[block - 1].append(moved);
    }

    /// Checks ordering, block sizes and `firsts`; returns the entry count.
    #[cfg(test)]
    pub(crate) fn check(&self) -> usize {
        assert_eq!(self.firsts.len(), self.blocks.len());
        let mut previous = None;
        let mut count = 0;
        for (first, entries) in self.firsts.iter().zip(&self.blocks) {
            assert!(entries.len() > 0 && entries.len() <= BLOCK_MAX);
            assert!(entries.keys[entries.len()..].iter().all(|&k| k == NO_KEY));
            assert_eq!(*first, entries.keys[0]);
            for (k, e) in entries.keys().iter().zip(&entries.entries) {
                assert_eq!(*k, e.base_gfn().0);
                assert!(previous.is_none_or(|p| p < *k), "keys out of order");
                previous = Some(*k);
                count += 1;
            }
        }
        assert_eq!(count, self.len);
        count
    }
}

/// Entries in key order from a position.
pub(crate) struct Iter<'a> {
    index: &'a GfnIndex,
    position: (usize, usize),
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Memslot;

    fn next(&mut self) -> Option<&'a Memslot> {
        let entry = self.index.get(self.position)?;
        self.position = self.index.next(self.position);
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::slot::{Gfn, HostPhysAddr, SlotFlags, SlotId, SlotSpec};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::vec::Vec;

    fn entry(key: u64) -> Memslot {
        let spec = SlotSpec {
            id: SlotId::new(0).unwrap(),
            base_gfn: Gfn(key),
            npages: 1,
            backing: HostPhysAddr(0),
            flags: SlotFlags::NONE,
        };
        Memslot::new(&spec, None)
    }

    #[test]
    fn one_block_few_blocks_and_many_blocks_find_the_floor() {
        // 1, 2..=LINEAR_TOP and more blocks: each way of choosing the block.
        for count in [1u64, 100, 700, 5000] {
            let mut index = GfnIndex::new();
            for key in 0..count {
                index.insert(entry(10 + key * 4));
            }
            index.check();
            assert_eq!(index.at_or_below(9).map(|e| e.base_gfn().0), None);
            for probe in 10..10 + count * 4 + 8 {
                let want = 10 + ((probe - 10) / 4).min(count - 1) * 4;
                assert_eq!(
                    index.at_or_below(probe).map(|e| e.base_gfn().0),
                    Some(want),
                    "{count} keys, probe {probe}"
                );
            }
        }
    }

    #[test]
    fn slots_created_in_address_order_fill_their_blocks() {
        let mut index = GfnIndex::new();
        for key in 0..509 {
            index.insert(entry(key * 2));
        }
        index.check();
        let sizes: Vec<usize> = index.blocks.iter().map(Block::len).collect();
        assert_eq!(
            sizes,
            [BLOCK_MAX, BLOCK_MAX, BLOCK_MAX, 509 - 3 * BLOCK_MAX]
        );
        // An insert anywhere else splits its full block in half.
        index.insert(entry(1));
        let sizes: Vec<usize> = index.blocks.iter().map(Block::len).collect();
        assert_eq!(sizes[..2], [BLOCK_MAX / 2, BLOCK_MAX / 2 + 1]);
        index.check();
    }

    proptest! {
        #[test]
        fn matches_a_btree_set(ops in proptest::collection::vec((any::<bool>(), 0u64..1200), 1..2500), probes in proptest::collection::vec(0u64..1300, 20)) {
            let mut index = GfnIndex::new();
            let mut model = BTreeSet::new();
            for (insert, key) in ops {
                if insert && model.insert(key) {
                    index.insert(entry(key));
                } else if !insert && model.remove(&key) {
                    prop_assert_eq!(index.remove(key).base_gfn().0, key);
                }
            }
            prop_assert_eq!(index.check(), model.len());
            for p in probes {
                let floor = model.range(..=p).next_back().copied();
                prop_assert_eq!(index.at_or_below(p).map(|e| e.base_gfn().0), floor);
                let located = index.locate(p);
                prop_assert_eq!(located.map(|(_, e)| e.base_gfn().0), floor);
                if let Some((position, e)) = located {
                    prop_assert_eq!(index.at(position).map(|at| at.base_gfn()), Some(e.base_gfn()));
                }
                prop_assert_eq!(index.at(Position::NONE).map(|e| e.base_gfn()), None);
                prop_assert_eq!(index.below(p).map(|e| e.base_gfn().0), model.range(..p).next_back().copied());
                let got: Vec<u64> = index.from(p).map(|e| e.base_gfn().0).collect();
                let want: Vec<u64> = model.range(p..).copied().collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
