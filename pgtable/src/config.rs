//! Stage-2 table configuration and the control registers it implies.
//!
//! The IPA size (32..=48 bits, 4 KiB granule) decides where the walk starts and
//! how many root pages are concatenated: the deepest start level whose root,
//! of at most 16 concatenated pages, still covers the IPA space. One page
//! covers 30 bits at level 2, 39 at level 1 and 48 at level 0, and each
//! doubling of the root page count adds one bit, so 32 bits start at level 2
//! with 4 pages, 40 bits at level 1 with 2 pages, 44 bits at level 0 with 1.
//! From that follow `VTCR_EL2` (T0SZ, SL0, cacheability, shareability,
//! granule, physical size, VMID width) and `VTTBR_EL2` (root and VMID).

use crate::addr::PhysAddr;
use crate::descriptor::{ENTRIES_PER_TABLE, PAGE_SIZE, level_shift};

/// Why a configuration or register value cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The IPA size is outside 32..=48 bits.
    IpaBits(u32),
    /// `ID_AA64MMFR0_EL1.PARange` holds a value the architecture does not define.
    PaRange(u8),
    /// The IPA space is larger than the physical address size the CPU supports.
    IpaLargerThanPa {
        /// Requested IPA bits.
        ipa_bits: u32,
        /// Physical address bits of the CPU.
        pa_bits: u32,
    },
    /// The VMID does not fit the VMID width.
    Vmid(u16),
    /// The root is not aligned to the size of its concatenated pages.
    RootAlignment(PhysAddr),
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::IpaBits(bits) => write!(f, "IPA size of {bits} bits is outside 32..=48"),
            Self::PaRange(v) => write!(f, "PARange value {v} is not defined"),
            Self::IpaLargerThanPa { ipa_bits, pa_bits } => {
                write!(
                    f,
                    "{ipa_bits}-bit IPA space exceeds the {pa_bits}-bit physical address size"
                )
            }
            Self::Vmid(v) => write!(f, "VMID {v} does not fit the VMID width"),
            Self::RootAlignment(pa) => write!(f, "root table {pa} is not aligned to its size"),
        }
    }
}

impl core::error::Error for ConfigError {}

/// A stage-2 table configuration (4 KiB granule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage2Config {
    ipa_bits: u32,
    start_level: u8,
    root_pages: usize,
    fwb: bool,
}

impl Stage2Config {
    /// The configuration of an `ipa_bits`-bit IPA space, without FWB.
    pub const fn new(ipa_bits: u32) -> Result<Self, ConfigError> {
        if ipa_bits < 32 || ipa_bits > 48 {
            return Err(ConfigError::IpaBits(ipa_bits));
        }
        // Deepest start level whose root covers the space with <= 16 pages.
        let mut start_level = 2u8;
        loop {
            let page_bits = level_shift(start_level) + 9;
            if ipa_bits <= page_bits + 4 {
                let root_pages = if ipa_bits > page_bits {
                    1usize << (ipa_bits - page_bits)
                } else {
                    1
                };
                return Ok(Self {
                    ipa_bits,
                    start_level,
                    root_pages,
                    fwb: false,
                });
            }
            start_level -= 1;
        }
    }

    /// The same configuration with `HCR_EL2.FWB` set or not (it changes the
    /// MemAttr encoding of normal memory).
    pub const fn with_fwb(mut self, fwb: bool) -> Self {
        self.fwb = fwb;
        self
    }

    /// IPA bits.
    pub const fn ipa_bits(&self) -> u32 {
        self.ipa_bits
    }

    /// Bytes of IPA space: every IPA is below this.
    pub const fn ipa_limit(&self) -> u64 {
        1 << self.ipa_bits
    }

    /// Level of the root table.
    pub const fn start_level(&self) -> u8 {
        self.start_level
    }

    /// Number of concatenated root pages (1..=16).
    pub const fn root_pages(&self) -> usize {
        self.root_pages
    }

    /// Entries in the (concatenated) root table.
    pub const fn root_entries(&self) -> usize {
        self.root_pages * ENTRIES_PER_TABLE
    }

    /// Whether leaves use the FWB MemAttr encoding.
    pub const fn fwb(&self) -> bool {
        self.fwb
    }

    /// The `VTCR_EL2` value for this configuration on a CPU whose
    /// `ID_AA64MMFR0_EL1.PARange` is `pa_range`, with 16-bit VMIDs when
    /// `vmid16`. PS is capped at 48 bits (the descriptor format used).
    pub const fn vtcr(&self, pa_range: u8, vmid16: bool) -> Result<u64, ConfigError> {
        let pa_bits = match pa_range {
            0 => 32,
            1 => 36,
            2 => 40,
            3 => 42,
            4 => 44,
            5 | 6 => 48,
            _ => return Err(ConfigError::PaRange(pa_range)),
        };
        if self.ipa_bits > pa_bits {
            return Err(ConfigError::IpaLargerThanPa {
                ipa_bits: self.ipa_bits,
                pa_bits,
            });
        }
        let ps = if pa_range > 5 { 5 } else { pa_range as u64 };
        let t0sz = 64 - self.ipa_bits as u64;
        let sl0 = (2 - self.start_level) as u64;
        let mut vtcr =
            t0sz | (sl0 << 6) | (1 << 8) | (1 << 10) | (0b11 << 12) | (ps << 16) | (1 << 31);
        if vmid16 {
            vtcr |= 1 << 19;
        }
        Ok(vtcr)
    }

    /// The `VTTBR_EL2` value for a root at `root` and `vmid` (`vmid16`: the
    /// VMID may use 16 bits, else 8).
    pub const fn vttbr(&self, root: PhysAddr, vmid: u16, vmid16: bool) -> Result<u64, ConfigError> {
        if !vmid16 && vmid > 0xff {
            return Err(ConfigError::Vmid(vmid));
        }
        if !root.is_aligned(self.root_pages as u64 * PAGE_SIZE) {
            return Err(ConfigError::RootAlignment(root));
        }
        Ok(root.as_u64() | ((vmid as u64) << 48))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_levels_and_concatenation_follow_the_reference() {
        let cases = [
            (32, 2, 4),
            (33, 2, 8),
            (34, 2, 16),
            (35, 1, 1),
            (36, 1, 1),
            (39, 1, 1),
            (40, 1, 2),
            (42, 1, 8),
            (43, 1, 16),
            (44, 0, 1),
            (48, 0, 1),
        ];
        for (bits, level, pages) in cases {
            let c = Stage2Config::new(bits).unwrap();
            assert_eq!(
                (c.start_level(), c.root_pages()),
                (level, pages),
                "{bits} bits"
            );
            // The root covers exactly the IPA space or more, never less.
            let covered = c.root_entries() as u64 * crate::descriptor::level_size(c.start_level());
            assert!(covered >= c.ipa_limit(), "{bits} bits");
        }
        assert_eq!(Stage2Config::new(31), Err(ConfigError::IpaBits(31)));
        assert_eq!(Stage2Config::new(49), Err(ConfigError::IpaBits(49)));
    }

    #[test]
    fn vtcr_fields() {
        let c = Stage2Config::new(40).unwrap();
        let vtcr = c.vtcr(2, true).unwrap();
        assert_eq!(vtcr & 0x3f, 24, "T0SZ");
        assert_eq!((vtcr >> 6) & 3, 1, "SL0 = start level 1");
        assert_eq!((vtcr >> 8) & 0xf, 0b0101, "IRGN0/ORGN0 write-back");
        assert_eq!((vtcr >> 12) & 3, 3, "SH0 inner");
        assert_eq!((vtcr >> 14) & 3, 0, "TG0 4 KiB");
        assert_eq!((vtcr >> 16) & 7, 2, "PS 40 bits");
        assert_eq!((vtcr >> 19) & 1, 1, "VS");
        assert_eq!(vtcr >> 31, 1, "RES1");
        assert_eq!(
            Stage2Config::new(48).unwrap().vtcr(6, false).unwrap() >> 16 & 7,
            5,
            "PS capped at 48 bits"
        );
        assert_eq!(
            (Stage2Config::new(48).unwrap().vtcr(5, false).unwrap() >> 6) & 3,
            2,
            "SL0 level 0"
        );
        assert_eq!(
            (Stage2Config::new(32).unwrap().vtcr(0, false).unwrap() >> 6) & 3,
            0,
            "SL0 level 2"
        );
        assert_eq!(
            Stage2Config::new(44).unwrap().vtcr(2, false),
            Err(ConfigError::IpaLargerThanPa {
                ipa_bits: 44,
                pa_bits: 40
            })
        );
        assert_eq!(c.vtcr(7, false), Err(ConfigError::PaRange(7)));
    }

    #[test]
    fn vttbr_checks_alignment_and_vmid() {
        let c = Stage2Config::new(40).unwrap();
        assert_eq!(
            c.vttbr(PhysAddr::new(0x8000_2000), 5, true).unwrap(),
            0x0005_0000_8000_2000
        );
        assert_eq!(
            c.vttbr(PhysAddr::new(0x8000_1000), 5, true),
            Err(ConfigError::RootAlignment(PhysAddr::new(0x8000_1000)))
        );
        assert_eq!(
            c.vttbr(PhysAddr::new(0x8000_2000), 256, false),
            Err(ConfigError::Vmid(256))
        );
    }
}
