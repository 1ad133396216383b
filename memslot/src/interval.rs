//! The interval tree over backing ranges: a treap in an arena, augmented with
//! the largest range end of each subtree.
//!
//! Nodes live in a `Vec` indexed by the owning set's slot index (so a node
//! never moves and needs no allocation of its own), ordered as a binary search
//! tree by `(start, index)` and as a max-heap by a random priority, which keeps
//! the expected depth at about `2 ln n` whatever the insertion order. Insert is
//! a split at the new key and two merges; remove replaces the node by the merge
//! of its children; both are expected O(log n) and refresh `max_end` on the way
//! back up.
//!
//! A query for the ranges overlapping `[qs, qe)` walks the tree in key order,
//! skipping every subtree whose `max_end <= qs` (nothing in it reaches the
//! query) and stopping at the first node with `start >= qe` (nothing after it
//! starts early enough). It costs O(log n + k) when the k answers are adjacent
//! in start order, which is the case whenever no reported range lies inside
//! another one; a range nested in a long alias can add up to O(log n) for each
//! answer it separates from the others.

use alloc::vec::Vec;

/// No node.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    start: u64,
    end: u64,
    max_end: u64,
    left: u32,
    right: u32,
    priority: u64,
}

impl Node {
    const VACANT: Node = Node {
        start: 0,
        end: 0,
        max_end: 0,
        left: NIL,
        right: NIL,
        priority: 0,
    };
}

/// Ranges `[start, end)` keyed by a caller-chosen index.
#[derive(Debug)]
pub(crate) struct BackingTree {
    nodes: Vec<Node>,
    root: u32,
    /// State of the priority generator (splitmix64).
    seed: u64,
}

impl BackingTree {
    /// An empty tree.
    pub(crate) const fn new() -> Self {
        Self {
            nodes: Vec::new(),
            root: NIL,
            seed: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn next_priority(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn key(&self, t: u32) -> (u64, u32) {
        (self.nodes[t as usize].start, t)
    }

    fn max_end(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].max_end
        }
    }

    fn pull(&mut self, t: u32) {
        let node = self.nodes[t as usize];
        let max_end = node
            .end
            .max(self.max_end(node.left))
            .max(self.max_end(node.right));
        self.nodes[t as usize].max_end = max_end;
    }

    /// Splits subtree `t` into the keys below `key` and the keys from `key` on.
    fn split(&mut self, t: u32, key: (u64, u32)) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.key(t) < key {
            let (low, high) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = low;
            self.pull(t);
            (t, high)
        } else {
            let (low, high) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = high;
            self.pull(t);
            (low, t)
        }
    }

    /// Joins two subtrees whose keys are all smaller in `a` than in `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority > self.nodes[b as usize].priority {
            let right = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = right;
            self.pull(a);
            a
        } else {
            let left = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = left;
            self.pull(b);
            b
        }
    }

    /// Adds range `[start, end)` under `index`, which must not be in the tree.
    pub(crate) fn insert(&mut self, index: u32, start: u64, end: u64) {
        if self.nodes.len() <= index as usize {
            self.nodes.resize(index as usize + 1, Node::VACANT);
        }
        let priority = self.next_priority();
        self.nodes[index as usize] = Node {
            start,
            end,
            max_end: end,
            left: NIL,
            right: NIL,
            priority,
        };
        let (low, high) = self.split(self.root, (start, index));
        let low = self.merge(low, index);
        self.root = self.merge(low, high);
    }

    /// Removes the range under `index`, which must be in the tree.
    pub(crate) fn remove(&mut self, index: u32) {
        let key = self.key(index);
        self.root = self.erase(self.root, key);
    }

    fn erase(&mut self, t: u32, key: (u64, u32)) -> u32 {
        debug_assert_ne!(t, NIL, "removing a range that is not in the tree");
        if t == NIL {
            return NIL;
        }
        let here = self.key(t);
        if here == key {
            let node = self.nodes[t as usize];
            return self.merge(node.left, node.right);
        }
        if key < here {
            let left = self.erase(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = left;
        } else {
            let right = self.erase(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = right;
        }
        self.pull(t);
        t
    }

    /// The indices of ranges overlapping `[start, end)`, in order of range
    /// start; none when the query is empty.
    pub(crate) fn overlapping(&self, start: u64, end: u64) -> Overlaps<'_> {
        let mut iter = Overlaps {
            tree: self,
            stack: Vec::new(),
            start,
            end,
        };
        if start < end {
            iter.descend_left(self.root);
        }
        iter
    }

    /// Checks the search-tree, heap and `max_end` invariants; returns the node count.
    #[cfg(test)]
    pub(crate) fn check(&self) -> usize {
        fn walk(
            tree: &BackingTree,
            t: u32,
            low: Option<(u64, u32)>,
            high: Option<(u64, u32)>,
        ) -> usize {
            if t == NIL {
                return 0;
            }
            let node = tree.nodes[t as usize];
            let key = tree.key(t);
            assert!(
                low.is_none_or(|l| l < key) && high.is_none_or(|h| key < h),
                "search order broken"
            );
            for child in [node.left, node.right] {
                if child != NIL {
                    assert!(
                        tree.nodes[child as usize].priority <= node.priority,
                        "heap order broken"
                    );
                }
            }
            let expected = node
                .end
                .max(tree.max_end(node.left))
                .max(tree.max_end(node.right));
            assert_eq!(node.max_end, expected, "max_end stale");
            1 + walk(tree, node.left, low, Some(key)) + walk(tree, node.right, Some(key), high)
        }
        walk(self, self.root, None, None)
    }
}

/// Iterator over the ranges that overlap a query; see the module doc for its cost.
pub(crate) struct Overlaps<'a> {
    tree: &'a BackingTree,
    /// Nodes whose left subtree is done or pending on top of them, in key order from the top.
    stack: Vec<u32>,
    start: u64,
    end: u64,
}

impl Overlaps<'_> {
    fn descend_left(&mut self, mut t: u32) {
        while t != NIL && self.tree.nodes[t as usize].max_end > self.start {
            self.stack.push(t);
            t = self.tree.nodes[t as usize].left;
        }
    }
}

impl Iterator for Overlaps<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        while let Some(t) = self.stack.pop() {
            let node = self.tree.nodes[t as usize];
            if node.start >= self.end {
                // Every node still on the stack and every right subtree starts later.
                self.stack.clear();
                return None;
            }
            self.descend_left(node.right);
            if node.end > self.start {
                return Some(t);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::vec::Vec;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u64, u64),
        Remove(u32),
        Query(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..64, 0u64..200, 1u64..60).prop_map(|(i, s, len)| Op::Insert(i, s, s + len)),
            (0u32..64).prop_map(Op::Remove),
            (0u64..260, 0u64..80).prop_map(|(s, len)| Op::Query(s, s + len)),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_brute_force_list(ops in proptest::collection::vec(op(), 1..300)) {
            let mut tree = BackingTree::new();
            let mut model: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(i, s, e) => {
                        if let std::collections::btree_map::Entry::Vacant(v) = model.entry(i) {
                            v.insert((s, e));
                            tree.insert(i, s, e);
                        }
                    }
                    Op::Remove(i) => {
                        if model.remove(&i).is_some() {
                            tree.remove(i);
                        }
                    }
                    Op::Query(s, e) => {
                        let got: Vec<u32> = tree.overlapping(s, e).collect();
                        let mut want: Vec<(u64, u32)> =
                            model.iter().filter(|(_, r)| s < e && r.0 < e && r.1 > s).map(|(i, r)| (r.0, *i)).collect();
                        want.sort();
                        let want: Vec<u32> = want.into_iter().map(|(_, i)| i).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(tree.check(), model.len());
            }
        }
    }

    #[test]
    fn sorted_inserts_stay_shallow() {
        let mut tree = BackingTree::new();
        for i in 0..32767u32 {
            tree.insert(i, u64::from(i) * 10, u64::from(i) * 10 + 5);
        }
        fn depth(tree: &BackingTree, t: u32) -> usize {
            if t == NIL {
                0
            } else {
                let n = tree.nodes[t as usize];
                1 + depth(tree, n.left).max(depth(tree, n.right))
            }
        }
        let d = depth(&tree, tree.root);
        assert!(d < 60, "depth {d} for 32767 sorted inserts");
        assert_eq!(tree.overlapping(100, 101).collect::<Vec<_>>(), [10]);
    }
}
