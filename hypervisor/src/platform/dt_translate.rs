//! Device-tree address translation: a bus address in a node's `reg` to the
//! CPU physical address the hypervisor maps.
//!
//! A node's `reg` is in the address space of its parent bus. Each bus node
//! says how its children's addresses appear to its own parent with `ranges`,
//! a list of `(child-bus-address, parent-bus-address, length)` entries whose
//! cells are counted by the bus's `#address-cells` (child address), its
//! parent's `#address-cells` (parent address) and the bus's `#size-cells`
//! (length). The walk ([`translate`]) starts at the node's parent and goes up
//! to the root, one [`Bus`] at a time: the entry whose child window holds the
//! whole `[address, address + size)` moves the address by
//! `parent - child`; an empty `ranges` (`ranges;`) is the identity; a bus
//! without `ranges` does not map its children into its parent at all, so the
//! address is not translatable; an address that no entry holds is an error.
//! The root's address space is the CPU's physical one.
//!
//! On a Raspberry Pi 4 `/soc` has `#address-cells = <1>` and maps
//! `0x7e00_0000` (the VideoCore's view of the peripherals) to `0xfe00_0000`,
//! so the PL011 at `reg = <0x7e201000 0x200>` is at `0xfe20_1000`.

use alloc::string::String;

/// One bus between a node and the root, as [`translate`] needs it.
#[derive(Clone, Copy, Debug)]
pub struct Bus<'a> {
    /// The bus node's name (for errors).
    pub name: &'a str,
    /// Its `ranges` property's value; `None` when it has none.
    pub ranges: Option<&'a [u8]>,
    /// The bus's own `#address-cells`: child addresses in `ranges`.
    pub child_address_cells: usize,
    /// The bus's own `#size-cells`: lengths in `ranges`.
    pub child_size_cells: usize,
    /// The `#address-cells` of the bus's parent: parent addresses in `ranges`.
    pub parent_address_cells: usize,
}

/// Why an address could not be translated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TranslateError {
    /// The bus has no `ranges`: its children are not visible to the CPU.
    NoRanges(String),
    /// No `ranges` entry of the bus holds the whole region.
    OutsideRanges {
        /// The bus.
        bus: String,
        /// The region's start in the bus's child address space.
        address: u64,
    },
    /// The bus's `ranges` is not a whole number of entries, or uses cell
    /// counts other than 1 or 2 for addresses (or 0 to 2 for sizes).
    BadRanges(String),
}

impl core::fmt::Display for TranslateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoRanges(bus) => write!(f, "bus {bus} has no ranges (not translatable)"),
            Self::OutsideRanges { bus, address } => {
                write!(f, "{address:#x} is outside every range of bus {bus}")
            }
            Self::BadRanges(bus) => write!(f, "malformed ranges in {bus}"),
        }
    }
}

impl core::error::Error for TranslateError {}

/// Reads a big-endian number of `cells` (0 to 2) cells from the front of
/// `bytes`.
fn cells_at(bytes: &[u8], cells: usize) -> Option<u64> {
    match cells {
        0 => Some(0),
        1 => Some(u64::from(u32::from_be_bytes(
            bytes.get(..4)?.try_into().ok()?,
        ))),
        2 => Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?)),
        _ => None,
    }
}

/// Translates the region `[address, address + size)` of a node whose
/// ancestors are `buses` (innermost first; the root is not one of them) into
/// a CPU physical address (see the module documentation).
pub fn translate(mut address: u64, size: u64, buses: &[Bus<'_>]) -> Result<u64, TranslateError> {
    for bus in buses {
        let name = || String::from(bus.name);
        let Some(ranges) = bus.ranges else {
            return Err(TranslateError::NoRanges(name()));
        };
        if ranges.is_empty() {
            continue;
        }
        let (ca, pa, cs) = (
            bus.child_address_cells,
            bus.parent_address_cells,
            bus.child_size_cells,
        );
        let entry = 4 * (ca + pa + cs);
        if !(1..=2).contains(&ca) || !(1..=2).contains(&pa) || cs > 2 || ranges.len() % entry != 0 {
            return Err(TranslateError::BadRanges(name()));
        }
        let mut found = None;
        for chunk in ranges.chunks(entry) {
            let bad = || TranslateError::BadRanges(name());
            let child = cells_at(chunk, ca).ok_or_else(bad)?;
            let parent = cells_at(&chunk[4 * ca..], pa).ok_or_else(bad)?;
            let length = cells_at(&chunk[4 * (ca + pa)..], cs).ok_or_else(bad)?;
            let offset = address.wrapping_sub(child);
            let inside = address >= child && offset < length && size <= length - offset;
            if inside {
                found = Some(parent.checked_add(offset).ok_or_else(bad)?);
                break;
            }
        }
        address = found.ok_or_else(|| TranslateError::OutsideRanges {
            bus: name(),
            address,
        })?;
    }
    Ok(address)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn cells(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_be_bytes()).collect()
    }

    /// The Pi 4's `/soc` ranges (bcm2711.dtsi): child 1 cell, parent 2, size
    /// 1 (also the platform tests' Pi 4 tree).
    pub(crate) const PI4_SOC_RANGES: [u32; 12] = [
        0x7e00_0000,
        0x0,
        0xfe00_0000,
        0x0180_0000, //
        0x7c00_0000,
        0x0,
        0xfc00_0000,
        0x0200_0000, //
        0x4000_0000,
        0x0,
        0xff80_0000,
        0x0080_0000,
    ];

    fn pi4_soc_ranges() -> Vec<u8> {
        cells(&PI4_SOC_RANGES)
    }

    fn soc(ranges: &[u8]) -> Bus<'_> {
        Bus {
            name: "soc",
            ranges: Some(ranges),
            child_address_cells: 1,
            child_size_cells: 1,
            parent_address_cells: 2,
        }
    }

    #[test]
    fn pi4_soc_entries() {
        let ranges = pi4_soc_ranges();
        let buses = [soc(&ranges)];
        assert_eq!(translate(0x7e20_1000, 0x200, &buses), Ok(0xfe20_1000));
        assert_eq!(translate(0x7e21_5040, 0x40, &buses), Ok(0xfe21_5040));
        assert_eq!(translate(0x7c00_0000, 0x10, &buses), Ok(0xfc00_0000));
        assert_eq!(translate(0x4004_1000, 0x1000, &buses), Ok(0xff84_1000));
        assert_eq!(translate(0x4000_6000, 0x2000, &buses), Ok(0xff80_6000));
    }

    #[test]
    fn regions_outside_or_straddling_a_window_are_errors() {
        let ranges = pi4_soc_ranges();
        let buses = [soc(&ranges)];
        let outside = |address| TranslateError::OutsideRanges {
            bus: "soc".into(),
            address,
        };
        assert_eq!(translate(0x1000, 0x10, &buses), Err(outside(0x1000)));
        // The first window ends at 0x7f80_0000.
        assert_eq!(
            translate(0x7f7f_f000, 0x2000, &buses),
            Err(outside(0x7f7f_f000))
        );
        assert_eq!(translate(0x7f7f_f000, 0x1000, &buses), Ok(0xff7f_f000));
    }

    #[test]
    fn empty_ranges_is_identity_and_missing_ranges_is_not_translatable() {
        let identity = Bus {
            name: "bus",
            ranges: Some(&[]),
            child_address_cells: 2,
            child_size_cells: 2,
            parent_address_cells: 2,
        };
        assert_eq!(translate(0x0900_0000, 0x1000, &[identity]), Ok(0x0900_0000));
        let closed = Bus {
            ranges: None,
            ..identity
        };
        assert_eq!(
            translate(0x0900_0000, 0x1000, &[identity, closed]),
            Err(TranslateError::NoRanges("bus".into()))
        );
        assert_eq!(translate(0x1234, 0x10, &[]), Ok(0x1234), "at the root");
    }

    #[test]
    fn nested_buses_apply_innermost_first() {
        // An inner bus maps its 0x0 to the soc's 0x7e21_5000, the soc maps
        // that to 0xfe21_5000.
        let inner_ranges = cells(&[0x0, 0x7e21_5000, 0x100]);
        let inner = Bus {
            name: "aux",
            ranges: Some(&inner_ranges),
            child_address_cells: 1,
            child_size_cells: 1,
            parent_address_cells: 1,
        };
        let soc_ranges = pi4_soc_ranges();
        let buses = [inner, soc(&soc_ranges)];
        assert_eq!(translate(0x40, 0x40, &buses), Ok(0xfe21_5040));
        assert_eq!(
            translate(0x200, 0x4, &buses),
            Err(TranslateError::OutsideRanges {
                bus: "aux".into(),
                address: 0x200
            })
        );
    }

    #[test]
    fn two_cell_child_addresses_and_malformed_ranges() {
        let ranges = cells(&[0x1, 0x0, 0x0, 0x2000_0000, 0x1000_0000]);
        let bus = Bus {
            name: "bus",
            ranges: Some(&ranges),
            child_address_cells: 2,
            child_size_cells: 1,
            parent_address_cells: 2,
        };
        assert_eq!(translate(0x1_0000_0010, 0x10, &[bus]), Ok(0x2000_0010));
        let short = &ranges[..16];
        assert_eq!(
            translate(
                0x1_0000_0010,
                0x10,
                &[Bus {
                    ranges: Some(short),
                    ..bus
                }]
            ),
            Err(TranslateError::BadRanges("bus".into()))
        );
        let pci = Bus {
            child_address_cells: 3,
            ..bus
        };
        assert_eq!(
            translate(0x10, 0x10, &[pci]),
            Err(TranslateError::BadRanges("bus".into()))
        );
    }
}
