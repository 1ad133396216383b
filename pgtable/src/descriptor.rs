//! Stage-2 descriptors (4 KiB granule, 48-bit output addresses).
//!
//! A [`Descriptor`] is the raw 64-bit value of one table slot. It is valid
//! (bit 0) or not; a valid one at levels 0-2 is a table when bit 1 is set and a
//! block otherwise, and at level 3 it is a page (bit 1 set). Leaves carry the
//! memory type (MemAttr, bits 5:2, whose encoding depends on `HCR_EL2.FWB`),
//! the access permissions (S2AP bits 7:6 and XN bit 54), inner shareability
//! and the access flag. Invalid descriptors are ignored by the hardware walker;
//! the engine gives exactly two of them a meaning: all zeroes (empty) and the
//! locked marker (bit 10 alone) that break-before-make parks in a slot while
//! it invalidates the TLB. Software bits 58:55 are reserved for the engine.

use crate::addr::PhysAddr;

/// The 4 KiB granule, defined once by the `tlb` crate (the root of the
/// library dependency graph) and re-exported here.
pub use tlb::{PAGE_SHIFT, PAGE_SIZE};
/// Entries in one table page.
pub const ENTRIES_PER_TABLE: usize = 512;
/// The deepest level (pages).
pub const LAST_LEVEL: u8 = 3;

/// Sizes a leaf can have, smallest first: a page, a 2 MiB block, a 1 GiB
/// block. Callers that want the largest first iterate it in reverse.
pub const LEAF_SIZES: [u64; 3] = [PAGE_SIZE, 2 << 20, 1 << 30];

/// Bytes covered by one entry at `level` (0..=3).
pub const fn level_size(level: u8) -> u64 {
    1 << level_shift(level)
}

/// Address shift of the entries at `level` (0..=3).
pub const fn level_shift(level: u8) -> u32 {
    PAGE_SHIFT + 9 * (LAST_LEVEL - level) as u32
}

/// Access permissions of a leaf: any combination of read, write and execute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Perms(u8);

impl Perms {
    /// No access.
    pub const NONE: Self = Self(0);
    /// Reads allowed.
    pub const READ: Self = Self(1);
    /// Writes allowed.
    pub const WRITE: Self = Self(2);
    /// Instruction fetches allowed.
    pub const EXEC: Self = Self(4);
    /// Read and write.
    pub const RW: Self = Self(1 | 2);
    /// Read, write and execute.
    pub const RWX: Self = Self(1 | 2 | 4);

    /// Whether every permission of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// `self` without the permissions of `other`.
    pub const fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The raw bits (read 1, write 2, execute 4).
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl core::ops::BitOr for Perms {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// Memory type of a leaf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemType {
    /// Normal memory, inner and outer write-back cacheable.
    #[default]
    Normal,
    /// Normal memory, non-cacheable.
    NormalNonCacheable,
    /// Device-nGnRE memory.
    Device,
}

/// Permissions and memory type of a leaf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// Access permissions.
    pub perms: Perms,
    /// Memory type.
    pub mem: MemType,
}

impl Attributes {
    /// Normal write-back memory with `perms`.
    pub const fn normal(perms: Perms) -> Self {
        Self {
            perms,
            mem: MemType::Normal,
        }
    }
}

/// One stage-2 descriptor: the raw value of a table slot.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Descriptor(u64);

impl core::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Descriptor({:#018x})", self.0)
    }
}

const VALID: u64 = 1 << 0;
const TABLE_OR_PAGE: u64 = 1 << 1;
const MEMATTR_SHIFT: u32 = 2;
const MEMATTR_MASK: u64 = 0b1111 << MEMATTR_SHIFT;
const S2AP_READ: u64 = 1 << 6;
const S2AP_WRITE: u64 = 1 << 7;
const SH_INNER: u64 = 0b11 << 8;
const ACCESS_FLAG: u64 = 1 << 10;
const OUTPUT_MASK: u64 = 0x0000_ffff_ffff_f000;
const XN: u64 = 1 << 54;
/// Software bits 58:55, ignored by the hardware and reserved for the engine.
pub const SOFTWARE_BITS: u64 = 0b1111 << 55;

const MEMATTR_NORMAL: u64 = 0b1111;
const MEMATTR_NORMAL_FWB: u64 = 0b0110;
const MEMATTR_NC: u64 = 0b0101;
const MEMATTR_DEVICE: u64 = 0b0001;

impl Descriptor {
    /// The empty (invalid, all-zero) descriptor.
    pub const EMPTY: Self = Self(0);
    /// The locked marker: invalid to the hardware (bit 0 clear), with bit 10
    /// set. A slot holds it while a break-before-make is in flight; only the
    /// walker that swapped it in may replace it.
    pub const LOCKED: Self = Self(ACCESS_FLAG);

    /// A descriptor from its raw value.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw value.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether the hardware walker uses this descriptor.
    pub const fn is_valid(self) -> bool {
        self.0 & VALID != 0
    }

    /// Whether this is the locked marker.
    pub const fn is_locked(self) -> bool {
        self.0 == Self::LOCKED.0
    }

    /// Whether this points to a next-level table (never at the last level).
    pub const fn is_table(self, level: u8) -> bool {
        level < LAST_LEVEL && self.0 & (VALID | TABLE_OR_PAGE) == VALID | TABLE_OR_PAGE
    }

    /// Whether this is a valid block or page.
    pub const fn is_leaf(self, level: u8) -> bool {
        self.is_valid() && !self.is_table(level)
    }

    /// A table descriptor pointing at the table page `table`.
    pub const fn table(table: PhysAddr) -> Self {
        Self((table.as_u64() & OUTPUT_MASK) | VALID | TABLE_OR_PAGE)
    }

    /// A leaf at `level` (block at 1 and 2, page at 3) mapping `output` with
    /// `attrs`, the access flag set. `fwb` selects the MemAttr encoding used
    /// when `HCR_EL2.FWB` is set.
    pub const fn leaf(level: u8, output: PhysAddr, attrs: Attributes, fwb: bool) -> Self {
        let kind = if level == LAST_LEVEL {
            VALID | TABLE_OR_PAGE
        } else {
            VALID
        };
        let memattr = match attrs.mem {
            MemType::Normal if fwb => MEMATTR_NORMAL_FWB,
            MemType::Normal => MEMATTR_NORMAL,
            MemType::NormalNonCacheable => MEMATTR_NC,
            MemType::Device => MEMATTR_DEVICE,
        };
        Self(
            (output.as_u64() & OUTPUT_MASK)
                | kind
                | (memattr << MEMATTR_SHIFT)
                | SH_INNER
                | ACCESS_FLAG
                | perms_bits(attrs.perms),
        )
    }

    /// The output address: the next table for a table, the first byte mapped
    /// for a leaf.
    pub const fn output(self) -> PhysAddr {
        PhysAddr::new(self.0 & OUTPUT_MASK)
    }

    /// The permissions of a leaf.
    pub const fn perms(self) -> Perms {
        let mut bits = 0;
        if self.0 & S2AP_READ != 0 {
            bits |= Perms::READ.0;
        }
        if self.0 & S2AP_WRITE != 0 {
            bits |= Perms::WRITE.0;
        }
        if self.0 & XN == 0 {
            bits |= Perms::EXEC.0;
        }
        Perms(bits)
    }

    /// The memory type of a leaf, decoded with the MemAttr encoding of `fwb`;
    /// `None` for an encoding the engine never writes.
    pub const fn mem_type(self, fwb: bool) -> Option<MemType> {
        match (self.0 & MEMATTR_MASK) >> MEMATTR_SHIFT {
            MEMATTR_NORMAL if !fwb => Some(MemType::Normal),
            MEMATTR_NORMAL_FWB if fwb => Some(MemType::Normal),
            MEMATTR_NC => Some(MemType::NormalNonCacheable),
            MEMATTR_DEVICE => Some(MemType::Device),
            _ => None,
        }
    }

    /// The same leaf with exactly `perms`.
    pub const fn with_perms(self, perms: Perms) -> Self {
        Self((self.0 & !(S2AP_READ | S2AP_WRITE | XN)) | perms_bits(perms))
    }

    /// Whether the access flag is set.
    pub const fn is_young(self) -> bool {
        self.0 & ACCESS_FLAG != 0
    }

    /// The same leaf with the access flag set or cleared.
    pub const fn with_young(self, young: bool) -> Self {
        if young {
            Self(self.0 | ACCESS_FLAG)
        } else {
            Self(self.0 & !ACCESS_FLAG)
        }
    }

    /// The leaf one level down that maps the `index`-th part of this leaf at
    /// `level`: same attributes, output advanced by `index` child sizes.
    pub const fn child_of_block(self, level: u8, index: usize) -> Self {
        let child_level = level + 1;
        let output = (self.0 & OUTPUT_MASK) + index as u64 * level_size(child_level);
        let kind = if child_level == LAST_LEVEL {
            VALID | TABLE_OR_PAGE
        } else {
            VALID
        };
        Self((self.0 & !(OUTPUT_MASK | TABLE_OR_PAGE)) | output | kind)
    }

    /// Whether both leaves carry the same attributes: every bit but the
    /// output address and the block/page bit agrees.
    pub const fn same_leaf_bits(self, other: Self) -> bool {
        (self.0 & !(OUTPUT_MASK | TABLE_OR_PAGE)) == (other.0 & !(OUTPUT_MASK | TABLE_OR_PAGE))
    }
}

const fn perms_bits(perms: Perms) -> u64 {
    let mut bits = 0;
    if perms.contains(Perms::READ) {
        bits |= S2AP_READ;
    }
    if perms.contains(Perms::WRITE) {
        bits |= S2AP_WRITE;
    }
    if !perms.contains(Perms::EXEC) {
        bits |= XN;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_bits_match_the_architecture() {
        let pa = PhysAddr::new(0x8020_0000);
        let block = Descriptor::leaf(2, pa, Attributes::normal(Perms::RW), false);
        assert_eq!(
            block.raw(),
            0x8020_0000 | 1 | (0b1111 << 2) | (0b11 << 6) | (0b11 << 8) | (1 << 10) | (1 << 54)
        );
        assert!(block.is_leaf(2) && !block.is_table(2));
        let page = Descriptor::leaf(
            3,
            pa,
            Attributes {
                perms: Perms::READ | Perms::EXEC,
                mem: MemType::Device,
            },
            true,
        );
        assert_eq!(
            page.raw() & 0b11,
            0b11,
            "a level-3 leaf is a page: bits 1:0 = 0b11"
        );
        assert_eq!(page.perms(), Perms::READ | Perms::EXEC);
        assert_eq!(page.mem_type(true), Some(MemType::Device));
        assert!(page.is_leaf(3) && !page.is_table(3));
        let fwb = Descriptor::leaf(
            1,
            PhysAddr::new(0x4000_0000),
            Attributes::normal(Perms::READ),
            true,
        );
        assert_eq!((fwb.raw() >> 2) & 0b1111, 0b0110);
        assert_eq!(fwb.mem_type(true), Some(MemType::Normal));
        assert_eq!(fwb.mem_type(false), None);
    }

    #[test]
    fn table_and_markers() {
        let t = Descriptor::table(PhysAddr::new(0x1234_5000));
        assert_eq!(t.raw(), 0x1234_5003);
        assert!(t.is_table(0) && t.is_table(2) && !t.is_table(3));
        assert_eq!(t.output(), PhysAddr::new(0x1234_5000));
        assert!(!Descriptor::LOCKED.is_valid() && Descriptor::LOCKED.is_locked());
        assert!(!Descriptor::EMPTY.is_valid() && !Descriptor::EMPTY.is_locked());
    }

    #[test]
    fn block_children_cover_the_block() {
        let block = Descriptor::leaf(
            1,
            PhysAddr::new(0x4000_0000),
            Attributes::normal(Perms::RWX),
            false,
        );
        let child = block.child_of_block(1, 5);
        assert!(child.is_leaf(2));
        assert_eq!(child.output().as_u64(), 0x4000_0000 + 5 * (2 << 20));
        assert!(child.same_leaf_bits(block));
        let page = child.child_of_block(2, 511);
        assert!(page.is_leaf(3) && page.raw() & 0b11 == 0b11);
        assert_eq!(
            page.output().as_u64(),
            0x4000_0000 + 5 * (2 << 20) + 511 * 4096
        );
    }

    #[test]
    fn perms_round_trip_and_edit() {
        for bits in 0..8u8 {
            let perms = Perms(bits);
            let d = Descriptor::leaf(3, PhysAddr::new(0x1000), Attributes::normal(perms), false);
            assert_eq!(d.perms(), perms);
            assert_eq!(d.with_perms(Perms::NONE).perms(), Perms::NONE);
        }
        let d = Descriptor::leaf(
            3,
            PhysAddr::new(0x1000),
            Attributes::normal(Perms::RW),
            false,
        );
        assert!(d.is_young() && !d.with_young(false).is_young());
    }
}
