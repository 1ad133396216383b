//! Physical address ranges and the arithmetic the boot path needs on them.
//!
//! Free RAM is the RAM the device tree describes minus everything already in
//! use (the hypervisor image, the device tree, the boot payload, reserved
//! memory). [`subtract`] computes that set difference on sorted, merged ranges
//! in O((n + m) log(n + m)).

use alloc::vec::Vec;

/// A half-open range of physical addresses `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PhysRange {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
}

impl PhysRange {
    /// `[start, start + size)`, saturating at the top of the address space.
    pub fn from_start_size(start: u64, size: u64) -> Self {
        Self {
            start,
            end: start.saturating_add(size),
        }
    }

    /// Length in bytes.
    pub fn size(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True when the range holds no address.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// True when `addr` lies in the range.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The range grown outwards to multiples of `align` (a power of two).
    pub fn align_out(&self, align: u64) -> Self {
        Self {
            start: self.start & !(align - 1),
            end: self.end.saturating_add(align - 1) & !(align - 1),
        }
    }

    /// The range shrunk inwards to multiples of `align` (a power of two); may be empty.
    pub fn align_in(&self, align: u64) -> Self {
        Self {
            start: self.start.saturating_add(align - 1) & !(align - 1),
            end: self.end & !(align - 1),
        }
    }
}

/// Sorts `ranges` and merges overlapping or touching ones; empty ones vanish.
pub fn normalize(mut ranges: Vec<PhysRange>) -> Vec<PhysRange> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort();
    let mut out: Vec<PhysRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// `from` minus `remove`: the addresses in some range of `from` and in none of `remove`.
pub fn subtract(from: Vec<PhysRange>, remove: Vec<PhysRange>) -> Vec<PhysRange> {
    let from = normalize(from);
    let remove = normalize(remove);
    let mut out = Vec::new();
    let mut holes = remove.iter().peekable();
    for r in from {
        let mut start = r.start;
        while let Some(hole) = holes.peek() {
            if hole.end <= start {
                holes.next();
                continue;
            }
            if hole.start >= r.end {
                break;
            }
            if hole.start > start {
                out.push(PhysRange {
                    start,
                    end: hole.start,
                });
            }
            start = start.max(hole.end);
            if hole.end >= r.end {
                break;
            }
            holes.next();
        }
        if start < r.end {
            out.push(PhysRange { start, end: r.end });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(start: u64, end: u64) -> PhysRange {
        PhysRange { start, end }
    }

    #[test]
    fn examples() {
        assert_eq!(
            subtract(vec![r(0, 100)], vec![r(10, 20), r(15, 30), r(90, 200)]),
            vec![r(0, 10), r(30, 90)]
        );
        assert_eq!(
            subtract(vec![r(0, 10), r(20, 30)], vec![r(5, 25)]),
            vec![r(0, 5), r(25, 30)]
        );
        assert_eq!(normalize(vec![r(5, 6), r(0, 5), r(7, 7)]), vec![r(0, 6)]);
        assert_eq!(r(0x1234, 0x5000).align_out(0x1000), r(0x1000, 0x5000));
        assert_eq!(r(0x1234, 0x5fff).align_in(0x1000), r(0x2000, 0x5000));
    }

    proptest! {
        #[test]
        fn matches_a_bitmap_model(
            from in proptest::collection::vec((0u64..256, 0u64..64), 0..6),
            remove in proptest::collection::vec((0u64..256, 0u64..64), 0..6),
        ) {
            let from: Vec<PhysRange> = from.into_iter().map(|(s, l)| r(s, s + l)).collect();
            let remove: Vec<PhysRange> = remove.into_iter().map(|(s, l)| r(s, s + l)).collect();
            let result = subtract(from.clone(), remove.clone());
            for addr in 0..400u64 {
                let expected = from.iter().any(|x| x.contains(addr)) && !remove.iter().any(|x| x.contains(addr));
                prop_assert_eq!(result.iter().any(|x| x.contains(addr)), expected, "addr {}", addr);
            }
            for pair in result.windows(2) {
                prop_assert!(pair[0].end < pair[1].start, "sorted, disjoint, not touching");
            }
        }
    }
}
