//! The ITS's tables in guest memory: where `GITS_BASER<n>` puts them and
//! what one entry holds.
//!
//! # The registers
//!
//! `GITS_BASER0` describes the device table (Type 1) and `GITS_BASER1` the
//! collection table (Type 4; `GITS_TYPER.HCC` is 0, so every collection is
//! in memory); `GITS_BASER2..7` are RAZ/WI (Type 0, none). Both tables are
//! flat (`Indirect` is RAZ/WI, which the guest's driver reads back) with
//! 4 KiB pages (`Page_Size` reads 0 whatever is written) and 8-byte entries
//! (`Entry_Size` 7); the guest chooses the address and the size (up to 256
//! pages), and the cacheability and shareability fields keep what it
//! writes, so a driver that checks they stuck finds them.
//!
//! # The entries
//!
//! The entry formats are the ITS's own (the architecture leaves them
//! IMPLEMENTATION DEFINED); each is one little-endian doubleword with the
//! valid bit in \[63\]:
//!
//! - device table entry (index DeviceID): the ITT address in \[51:8\] (it is
//!   256-byte aligned) and the ITT's EventID bits minus one in \[4:0\];
//! - collection table entry (index ICID): the target redistributor's
//!   processor number (the vCPU index) in \[15:0\];
//! - interrupt translation table entry (index EventID, in the ITT the
//!   device entry names): the LPI in \[47:16\] and the ICID in \[15:0\].
//!
//! Every entry is read and written through the VM's memslots, like a
//! device's DMA, so an entry outside RAM is a command error, never an
//! access outside the VM, and the tables travel with the guest's RAM in a
//! live migration.

/// `GITS_BASER<n>.Valid`.
pub(crate) const BASER_VALID: u64 = 1 << 63;
/// The `GITS_BASER<n>` bits that keep what the guest writes: Valid,
/// InnerCache \[61:59\], OuterCache \[55:53\], the address \[47:12\],
/// Shareability \[11:10\] and Size \[7:0\].
pub(crate) const BASER_WRITABLE: u64 =
    BASER_VALID | 0x3800_0000_0000_0000 | 0x00e0_0000_0000_0000 | BASER_ADDRESS | 0xc00 | 0xff;
/// `GITS_BASER<n>.Physical_Address` for 4 KiB pages.
const BASER_ADDRESS: u64 = 0x0000_ffff_ffff_f000;
/// `GITS_BASER<n>.Type`: device table.
const TYPE_DEVICES: u64 = 1;
/// `GITS_BASER<n>.Type`: collection table.
const TYPE_COLLECTIONS: u64 = 4;
/// Size of every entry of every table.
pub(crate) const ENTRY_SIZE: u64 = 8;
/// Bytes in one table page.
const PAGE: u64 = 4096;

/// Entry valid bit.
const ENTRY_VALID: u64 = 1 << 63;

/// Which table a `GITS_BASER<n>` describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Device table (`GITS_BASER0`).
    Devices,
    /// Collection table (`GITS_BASER1`).
    Collections,
}

impl Table {
    /// The table `GITS_BASER<n>` describes, if any.
    pub const fn of_baser(n: usize) -> Option<Self> {
        match n {
            0 => Some(Self::Devices),
            1 => Some(Self::Collections),
            _ => None,
        }
    }

    /// Its `GITS_BASER<n>` value: the stored bits plus Type and
    /// Entry_Size.
    pub(crate) const fn baser_value(self, stored: u64) -> u64 {
        let kind = match self {
            Self::Devices => TYPE_DEVICES,
            Self::Collections => TYPE_COLLECTIONS,
        };
        stored | kind << 56 | (ENTRY_SIZE - 1) << 48
    }

    /// The guest physical address of entry `index` of the table `baser`
    /// describes, or `None` when the table is not valid or is too small.
    pub(crate) const fn entry_address(baser: u64, index: u64) -> Option<u64> {
        if baser & BASER_VALID == 0 || index >= Self::capacity(baser) {
            return None;
        }
        Some((baser & BASER_ADDRESS) + index * ENTRY_SIZE)
    }

    /// How many entries the table `baser` describes holds (0 when not
    /// valid).
    pub(crate) const fn capacity(baser: u64) -> u64 {
        if baser & BASER_VALID == 0 {
            0
        } else {
            ((baser & 0xff) + 1) * PAGE / ENTRY_SIZE
        }
    }
}

/// A device table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceEntry {
    /// The ITT's guest physical address.
    pub itt: u64,
    /// EventID bits minus one.
    pub size: u8,
}

impl DeviceEntry {
    /// The doubleword of a valid entry.
    pub const fn encode(self) -> u64 {
        ENTRY_VALID | (self.itt & 0x000f_ffff_ffff_ff00) | (self.size as u64 & 0x1f)
    }

    /// The entry a doubleword holds, `None` if it is not valid.
    pub const fn decode(raw: u64) -> Option<Self> {
        if raw & ENTRY_VALID == 0 {
            return None;
        }
        Some(Self {
            itt: raw & 0x000f_ffff_ffff_ff00,
            size: (raw & 0x1f) as u8,
        })
    }

    /// How many events the ITT holds.
    pub const fn events(self) -> u64 {
        1 << (self.size as u64 + 1)
    }
}

/// A collection table entry: the target vCPU, `None` if not valid.
pub(crate) const fn decode_collection(raw: u64) -> Option<usize> {
    if raw & ENTRY_VALID == 0 {
        None
    } else {
        Some((raw & 0xffff) as usize)
    }
}

/// The doubleword of a valid collection table entry.
pub(crate) const fn encode_collection(vcpu: usize) -> u64 {
    ENTRY_VALID | (vcpu as u64 & 0xffff)
}

/// An interrupt translation table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TranslationEntry {
    /// The LPI.
    pub intid: u32,
    /// The collection.
    pub collection: u16,
}

impl TranslationEntry {
    /// The doubleword of a valid entry.
    pub const fn encode(self) -> u64 {
        ENTRY_VALID | (self.intid as u64) << 16 | self.collection as u64
    }

    /// The entry a doubleword holds, `None` if it is not valid.
    pub const fn decode(raw: u64) -> Option<Self> {
        if raw & ENTRY_VALID == 0 {
            return None;
        }
        Some(Self {
            intid: (raw >> 16) as u32,
            collection: raw as u16,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let device = DeviceEntry {
            itt: 0x4012_3400,
            size: 15,
        };
        assert_eq!(DeviceEntry::decode(device.encode()), Some(device));
        assert_eq!(device.events(), 65536);
        let ite = TranslationEntry {
            intid: 8200,
            collection: 3,
        };
        assert_eq!(TranslationEntry::decode(ite.encode()), Some(ite));
        assert_eq!(decode_collection(encode_collection(5)), Some(5));
        for invalid in [0, 0x7fff_ffff_ffff_ffff] {
            assert_eq!(DeviceEntry::decode(invalid), None);
            assert_eq!(TranslationEntry::decode(invalid), None);
            assert_eq!(decode_collection(invalid), None);
        }
    }

    #[test]
    fn entry_addresses_stay_inside_the_table() {
        // Two pages at 0x4100_0000: 1024 entries.
        let baser = BASER_VALID | 0x4100_0000 | 1;
        assert_eq!(Table::capacity(baser), 1024);
        assert_eq!(Table::entry_address(baser, 0), Some(0x4100_0000));
        assert_eq!(Table::entry_address(baser, 1023), Some(0x4100_1ff8));
        assert_eq!(Table::entry_address(baser, 1024), None);
        assert_eq!(Table::entry_address(baser & !BASER_VALID, 0), None);
        assert_eq!(
            Table::Collections.baser_value(baser),
            baser | 4 << 56 | 7 << 48
        );
    }
}
