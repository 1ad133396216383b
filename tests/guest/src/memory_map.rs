//! Address ranges of the guest's memory map, and the search for free RAM.
//!
//! Free RAM is RAM minus the reserved ranges (the guest image, the device
//! tree, the initrd, `/memreserve/` entries). The memory test uses the
//! largest page-aligned free range: a free range starts at a RAM start or at
//! the end of a reservation, and ends at the next reservation start or the
//! RAM end, so checking those candidates finds the largest one. Pure code,
//! tested on the host.

use core::fmt;

/// Bytes per page.
pub const PAGE: u64 = 4096;

/// A half-open physical (= intermediate physical) address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRange {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
}

impl MemRange {
    /// Bytes covered.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether `address` lies in the range.
    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

impl fmt::Display for MemRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}-{:#x}", self.start, self.end)
    }
}

/// The largest page-aligned range inside one of `ram` that overlaps none of
/// `reserved` (the first of equal ones), or `None` when no page is free.
pub fn largest_free_range(ram: &[MemRange], reserved: &[MemRange]) -> Option<MemRange> {
    let mut best: Option<MemRange> = None;
    for bank in ram {
        let starts = core::iter::once(bank.start).chain(reserved.iter().map(|r| r.end));
        for start in starts {
            let Some(start) = start.checked_next_multiple_of(PAGE) else {
                continue;
            };
            if !bank.contains(start) || reserved.iter().any(|r| r.contains(start)) {
                continue;
            }
            let end = reserved
                .iter()
                .filter(|r| r.start >= start)
                .map(|r| r.start)
                .fold(bank.end, u64::min)
                & !(PAGE - 1);
            if end > start && best.is_none_or(|b| end - start > b.len()) {
                best = Some(MemRange { start, end });
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(start: u64, end: u64) -> MemRange {
        MemRange { start, end }
    }

    #[test]
    fn image_and_device_tree_split_ram() {
        let ram = [range(0x4000_0000, 0x4800_0000)];
        let reserved = [
            range(0x4008_0000, 0x400c_d123),
            range(0x4400_0000, 0x4401_0000),
        ];
        assert_eq!(
            largest_free_range(&ram, &reserved),
            Some(range(0x4401_0000, 0x4800_0000))
        );
        let dtb_at_top = [reserved[0], range(0x47ff_0000, 0x4800_0000)];
        assert_eq!(
            largest_free_range(&ram, &dtb_at_top),
            Some(range(0x400c_e000, 0x47ff_0000))
        );
        assert_eq!(largest_free_range(&ram, &[]), Some(ram[0]));
        assert_eq!(largest_free_range(&ram, &[range(0, u64::MAX)]), None);
    }

    /// Page-granular model: a page is free when it is entirely inside one RAM
    /// bank and touches no reservation; the answer must be a run of free pages
    /// inside one bank, as long as the longest such run.
    fn longest_free_run(ram: &[MemRange], reserved: &[MemRange], pages: u64) -> u64 {
        let free = |page: u64, bank: &MemRange| {
            let (start, end) = (page * PAGE, (page + 1) * PAGE);
            bank.start <= start
                && end <= bank.end
                && !reserved.iter().any(|r| r.start < end && start < r.end)
        };
        let mut best = 0;
        for bank in ram {
            let mut run = 0;
            for page in 0..pages {
                run = if free(page, bank) { run + 1 } else { 0 };
                best = best.max(run);
            }
        }
        best
    }

    fn ranges(count: usize) -> impl Strategy<Value = Vec<MemRange>> {
        proptest::collection::vec((0u64..64 * PAGE, 1u64..24 * PAGE), 0..count).prop_map(|v| {
            v.into_iter()
                .map(|(start, len)| range(start, start + len))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn largest_free_range_matches_the_page_model(ram in ranges(3), reserved in ranges(5)) {
            let found = largest_free_range(&ram, &reserved);
            let expected = longest_free_run(&ram, &reserved, 96);
            match found {
                None => prop_assert_eq!(expected, 0),
                Some(free) => {
                    prop_assert_eq!(free.start % PAGE, 0);
                    prop_assert_eq!(free.end % PAGE, 0);
                    prop_assert!(ram.iter().any(|b| b.start <= free.start && free.end <= b.end));
                    prop_assert!(!reserved.iter().any(|r| r.start < free.end && free.start < r.end));
                    prop_assert_eq!(free.len() / PAGE, expected);
                }
            }
        }
    }
}
