//! Sets of physical CPUs, written as CPU lists: `0-1`, `2,3`, `0,2-5`.
//!
//! A VM's `cpus` setting ([`crate::vmconf`]) names the physical CPUs that run
//! its vCPUs, one vCPU per CPU: vCPU `i` runs on the `i`-th CPU of the set in
//! ascending order.
//!
//! # Format
//!
//! A list is comma-separated items, each a CPU number (`3`) or an inclusive
//! range (`2-5`); spaces around items are ignored. Numbers are decimal and
//! below [`MAX_CPUS`]. Items may come in any order but may not repeat a CPU,
//! and a range may not run backwards: a list that reads two ways is a typo.
//! [`CpuSet`]'s `Display` writes the canonical form (ascending, runs of two
//! or more as ranges), which [`CpuSet::parse`] reads back.

/// CPU numbers a set can hold: `0..MAX_CPUS`.
pub const MAX_CPUS: u32 = 64;

/// A non-empty set of CPU numbers below [`MAX_CPUS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuSet(u64);

/// Why a CPU list was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuListError {
    /// The list names no CPU.
    Empty,
    /// An item is not a decimal number or a `first-last` range.
    NotANumber,
    /// A CPU number is [`MAX_CPUS`] or more.
    TooLarge(u64),
    /// A range's last CPU is below its first.
    Backwards {
        /// The range's first CPU.
        first: u32,
        /// The range's last CPU.
        last: u32,
    },
    /// A CPU is named twice.
    Repeated(u32),
}

impl core::fmt::Display for CpuListError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Empty => write!(f, "the CPU list names no CPU"),
            Self::NotANumber => write!(
                f,
                "a CPU list is comma-separated CPU numbers and first-last ranges (e.g. 0-1,3)"
            ),
            Self::TooLarge(cpu) => write!(f, "CPU {cpu}: CPU numbers are below {MAX_CPUS}"),
            Self::Backwards { first, last } => {
                write!(f, "CPU range {first}-{last} runs backwards")
            }
            Self::Repeated(cpu) => write!(f, "CPU {cpu} is named twice"),
        }
    }
}

impl core::error::Error for CpuListError {}

impl CpuSet {
    /// The set of the CPUs whose bits are set in `mask`; `None` for 0.
    pub const fn from_mask(mask: u64) -> Option<CpuSet> {
        if mask == 0 { None } else { Some(CpuSet(mask)) }
    }

    /// CPUs `0..count`; `None` when `count` is 0 or above [`MAX_CPUS`].
    pub const fn first(count: u32) -> Option<CpuSet> {
        match count {
            0 => None,
            MAX_CPUS => Some(CpuSet(u64::MAX)),
            n if n < MAX_CPUS => Some(CpuSet((1 << n) - 1)),
            _ => None,
        }
    }

    /// Bit `n` set for CPU `n`.
    pub const fn mask(self) -> u64 {
        self.0
    }

    /// How many CPUs (the VM's vCPU count).
    pub const fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Always false: a set names at least one CPU (for clippy's `len` rule).
    pub const fn is_empty(self) -> bool {
        false
    }

    /// The highest CPU.
    pub const fn highest(self) -> u32 {
        63 - self.0.leading_zeros()
    }

    /// Whether the set holds `cpu`.
    pub const fn contains(self, cpu: u32) -> bool {
        cpu < MAX_CPUS && self.0 & (1 << cpu) != 0
    }

    /// The lowest CPU both sets hold, if any.
    pub const fn first_shared(self, other: CpuSet) -> Option<u32> {
        let both = self.0 & other.0;
        if both == 0 {
            None
        } else {
            Some(both.trailing_zeros())
        }
    }

    /// The CPUs in ascending order (vCPU `i` runs on the `i`-th).
    pub fn iter(self) -> impl Iterator<Item = u32> {
        (0..MAX_CPUS).filter(move |&cpu| self.contains(cpu))
    }

    /// Reads a CPU list (see the module doc for the format).
    pub fn parse(text: &str) -> Result<CpuSet, CpuListError> {
        let number = |text: &str| -> Result<u32, CpuListError> {
            let text = text.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(CpuListError::NotANumber);
            }
            let value: u64 = text.parse().map_err(|_| CpuListError::TooLarge(u64::MAX))?;
            if value >= u64::from(MAX_CPUS) {
                return Err(CpuListError::TooLarge(value));
            }
            Ok(value as u32)
        };
        if text.trim().is_empty() {
            return Err(CpuListError::Empty);
        }
        let mut mask = 0u64;
        for item in text.split(',') {
            let (first, last) = match item.split_once('-') {
                Some((first, last)) => (number(first)?, number(last)?),
                None => {
                    let cpu = number(item)?;
                    (cpu, cpu)
                }
            };
            if last < first {
                return Err(CpuListError::Backwards { first, last });
            }
            for cpu in first..=last {
                if mask & (1 << cpu) != 0 {
                    return Err(CpuListError::Repeated(cpu));
                }
                mask |= 1 << cpu;
            }
        }
        Ok(CpuSet(mask))
    }
}

impl core::fmt::Display for CpuSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut separator = "";
        let mut cpu = 0;
        while cpu < MAX_CPUS {
            if !self.contains(cpu) {
                cpu += 1;
                continue;
            }
            let first = cpu;
            while cpu + 1 < MAX_CPUS && self.contains(cpu + 1) {
                cpu += 1;
            }
            if cpu == first {
                write!(f, "{separator}{first}")?;
            } else {
                write!(f, "{separator}{first}-{cpu}")?;
            }
            separator = ",";
            cpu += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    #[test]
    fn lists_read_as_written() {
        assert_eq!(CpuSet::parse("0-1").unwrap().mask(), 0b11);
        assert_eq!(CpuSet::parse("2,3").unwrap().mask(), 0b1100);
        assert_eq!(CpuSet::parse(" 5 , 0-2 ").unwrap().mask(), 0b100111);
        assert_eq!(CpuSet::parse("63").unwrap().highest(), 63);
        let set = CpuSet::parse("4,1-2").unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!((set.len(), set.highest()), (3, 4));
        assert_eq!(set.to_string(), "1-2,4");
        assert_eq!(CpuSet::first(3).unwrap().to_string(), "0-2");
        assert_eq!(CpuSet::first(64).unwrap().len(), 64);
        assert_eq!(CpuSet::first(0), None);
        assert_eq!(CpuSet::first(65), None);
    }

    #[test]
    fn bad_lists_are_refused() {
        assert_eq!(CpuSet::parse(""), Err(CpuListError::Empty));
        assert_eq!(CpuSet::parse("a"), Err(CpuListError::NotANumber));
        assert_eq!(CpuSet::parse("1,"), Err(CpuListError::NotANumber));
        assert_eq!(CpuSet::parse("-1"), Err(CpuListError::NotANumber));
        assert_eq!(CpuSet::parse("+1"), Err(CpuListError::NotANumber));
        assert_eq!(CpuSet::parse("64"), Err(CpuListError::TooLarge(64)));
        assert_eq!(
            CpuSet::parse("99999999999999999999999"),
            Err(CpuListError::TooLarge(u64::MAX))
        );
        assert_eq!(
            CpuSet::parse("3-1"),
            Err(CpuListError::Backwards { first: 3, last: 1 })
        );
        assert_eq!(CpuSet::parse("0-2,2"), Err(CpuListError::Repeated(2)));
    }

    #[test]
    fn shared_cpus_are_found() {
        let a = CpuSet::parse("0-3").unwrap();
        assert_eq!(a.first_shared(CpuSet::parse("3-5").unwrap()), Some(3));
        assert_eq!(a.first_shared(CpuSet::parse("4-5").unwrap()), None);
    }

    proptest! {
        #[test]
        fn every_set_reads_back_from_its_list(mask in 1u64..) {
            let set = CpuSet::from_mask(mask).unwrap();
            prop_assert_eq!(CpuSet::parse(&set.to_string()), Ok(set));
        }
    }
}
