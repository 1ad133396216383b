//! The host's physical ITS: its driver's sequences ([`driver`]) and, here,
//! the register encodings of the ITS and of the redistributors' LPI
//! registers as pure functions the driver uses: the `GITS_BASER<n>`,
//! `GITS_CBASER`, `GICR_PROPBASER` and `GICR_PENDBASER` values it writes,
//! what it reads from `GITS_TYPER` and `GICR_TYPER`, and the 32-byte
//! commands it queues (`MAPD`, `MAPC`, `MAPTI`, `SYNC`). The machine side
//! (volatile accesses, the frame allocator, cache maintenance, the statics)
//! is `arch::drivers::its`.
//!
//! # The setup these values describe
//!
//! Flat tables in 4 KiB pages, write-back cacheable and inner shareable;
//! the device table covers every DeviceID of `GITS_TYPER.Devbits` (up to
//! [`MAX_TABLE_PAGES`] pages), the collection table one page (a collection
//! per host CPU). The host's LPIs are [`HOST_LPI_ID_BITS`] bits of INTID:
//! a property table of 2^bits - 8192 bytes shared by every redistributor
//! and a pending table of 2^bits bits per redistributor (64 KiB aligned).
//! A command names its target redistributor by processor number
//! (`GITS_TYPER.PTA` 0) or by physical address (`PTA` 1).

pub mod driver;
#[cfg(test)]
mod driver_tests;
#[cfg(test)]
mod mock;

use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// `GITS_TYPER`.
    TYPER [
        /// Target addresses are physical addresses (else processor numbers).
        PTA OFFSET(19) NUMBITS(1) [],
        /// DeviceID bits minus one.
        Devbits OFFSET(13) NUMBITS(5) [],
        /// Bytes per ITT entry minus one.
        ITT_entry_size OFFSET(4) NUMBITS(4) [],
        /// The ITS takes physical LPIs.
        Physical OFFSET(0) NUMBITS(1) []
    ],
    /// `GITS_BASER<n>`.
    BASER [
        /// The table or queue is valid.
        Valid OFFSET(63) NUMBITS(1) [],
        /// Two-level table.
        Indirect OFFSET(62) NUMBITS(1) [],
        /// Inner cacheability.
        InnerCache OFFSET(59) NUMBITS(3) [],
        /// What the table holds (read-only).
        Type OFFSET(56) NUMBITS(3) [],
        /// Outer cacheability.
        OuterCache OFFSET(53) NUMBITS(3) [],
        /// Bytes per entry minus one.
        Entry_Size OFFSET(48) NUMBITS(5) [],
        /// The table's address \[47:12\] (4 KiB pages).
        Physical_Address OFFSET(12) NUMBITS(36) [],
        /// Shareability.
        Shareability OFFSET(10) NUMBITS(2) [],
        /// 0: 4 KiB pages.
        Page_Size OFFSET(8) NUMBITS(2) [],
        /// Pages minus one.
        Size OFFSET(0) NUMBITS(8) []
    ],
    /// `GITS_CBASER`.
    CBASER [
        /// The table or queue is valid.
        Valid OFFSET(63) NUMBITS(1) [],
        /// Inner cacheability.
        InnerCache OFFSET(59) NUMBITS(3) [],
        /// Outer cacheability.
        OuterCache OFFSET(53) NUMBITS(3) [],
        /// The queue's address \[51:12\].
        Physical_Address OFFSET(12) NUMBITS(40) [],
        /// Shareability.
        Shareability OFFSET(10) NUMBITS(2) [],
        /// 4 KiB pages minus one.
        Size OFFSET(0) NUMBITS(8) []
    ],
    /// `GICR_PROPBASER`.
    PROPBASER [
        /// Outer cacheability.
        OuterCache OFFSET(56) NUMBITS(3) [],
        /// The property table's address \[51:12\].
        Physical_Address OFFSET(12) NUMBITS(40) [],
        /// Shareability.
        Shareability OFFSET(10) NUMBITS(2) [],
        /// Inner cacheability.
        InnerCache OFFSET(7) NUMBITS(3) [],
        /// INTID bits minus one.
        IDbits OFFSET(0) NUMBITS(5) []
    ],
    /// `GICR_PENDBASER`.
    PENDBASER [
        /// The pending table is zero.
        PTZ OFFSET(62) NUMBITS(1) [],
        /// Outer cacheability.
        OuterCache OFFSET(56) NUMBITS(3) [],
        /// The pending table's address \[51:16\].
        Physical_Address OFFSET(16) NUMBITS(36) [],
        /// Shareability.
        Shareability OFFSET(10) NUMBITS(2) [],
        /// Inner cacheability.
        InnerCache OFFSET(7) NUMBITS(3) []
    ],
    /// `GICR_TYPER`.
    GICR_TYPER [
        /// The redistributor's processor number.
        Processor_Number OFFSET(8) NUMBITS(16) [],
        /// The redistributor has physical LPIs.
        PLPIS OFFSET(0) NUMBITS(1) []
    ]
}

/// `GITS_*` register offsets.
pub mod gits {
    /// `GITS_CTLR`.
    pub const CTLR: usize = 0x0000;
    /// `GITS_CTLR.Enabled`.
    pub const CTLR_ENABLED: u32 = 1 << 0;
    /// `GITS_CTLR.Quiescent`.
    pub const CTLR_QUIESCENT: u32 = 1 << 31;
    /// `GITS_TYPER`.
    pub const TYPER: usize = 0x0008;
    /// `GITS_CBASER`.
    pub const CBASER: usize = 0x0080;
    /// `GITS_CWRITER`.
    pub const CWRITER: usize = 0x0088;
    /// `GITS_CREADR`.
    pub const CREADR: usize = 0x0090;
    /// `GITS_CREADR.Stalled`.
    pub const CREADR_STALLED: u64 = 1 << 0;
    /// `GITS_BASER0`; `GITS_BASER<n>` at `BASER0 + 8 n`, n < 8.
    pub const BASER0: usize = 0x0100;
    /// `GITS_CWRITER.Offset` / `GITS_CREADR.Offset`.
    pub const QUEUE_OFFSET: u64 = 0xf_ffe0;
}

/// `GICR_*` LPI register offsets (in `RD_base`).
pub mod gicr_lpi {
    /// `GICR_CTLR`.
    pub const CTLR: usize = 0x0000;
    /// `GICR_CTLR.EnableLPIs`.
    pub const CTLR_ENABLE_LPIS: u32 = 1 << 0;
    /// `GICR_TYPER`.
    pub const TYPER: usize = 0x0008;
    /// `GICR_PROPBASER`.
    pub const PROPBASER: usize = 0x0070;
    /// `GICR_PENDBASER`.
    pub const PENDBASER: usize = 0x0078;
}

/// INTID bits of the host's LPIs: LPIs 8192..16384.
pub const HOST_LPI_ID_BITS: u32 = 14;
/// Bytes of the property table (one per LPI).
pub const PROPERTY_TABLE_BYTES: u64 = (1 << HOST_LPI_ID_BITS) - 8192;
/// Bytes of a pending table (one bit per INTID).
pub const PENDING_TABLE_BYTES: u64 = (1 << HOST_LPI_ID_BITS) / 8;
/// Alignment of a pending table.
pub const PENDING_TABLE_ALIGN: u64 = 0x1_0000;
/// An LPI's property byte: priority 0xa0 (the host's), group 1 (RES1) and
/// enabled.
pub const LPI_PROPERTY: u8 = 0xa0 | 1 << 1 | 1;
/// Table page size.
pub const PAGE: u64 = 4096;
/// Pages of one table at most (`GITS_BASER<n>.Size`).
pub const MAX_TABLE_PAGES: u64 = 256;
/// Bytes of the command queue (128 commands).
pub const QUEUE_BYTES: u64 = PAGE;
/// Bytes of one command.
pub const COMMAND_BYTES: u64 = 32;
/// `GITS_BASER<n>.Type`: devices.
pub const TYPE_DEVICES: u64 = 1;
/// `GITS_BASER<n>.Type`: collections.
pub const TYPE_COLLECTIONS: u64 = 4;

/// Write-back read/write-allocate, for `InnerCache` fields.
const CACHE_WB: u64 = 0b111;
/// Inner shareable, for `Shareability` fields.
const INNER_SHAREABLE: u64 = 0b01;

/// What the driver reads from `GITS_TYPER`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItsFeatures {
    /// It takes physical LPIs.
    pub physical: bool,
    /// Commands name a redistributor by physical address.
    pub pta: bool,
    /// DeviceID bits.
    pub device_bits: u32,
    /// Bytes per ITT entry.
    pub itt_entry_size: u64,
}

impl ItsFeatures {
    /// Decodes `GITS_TYPER`.
    pub fn from_typer(typer: u64) -> Self {
        let typer = LocalRegisterCopy::<u64, TYPER::Register>::new(typer);
        Self {
            physical: typer.is_set(TYPER::Physical),
            pta: typer.is_set(TYPER::PTA),
            device_bits: typer.read(TYPER::Devbits) as u32 + 1,
            itt_entry_size: typer.read(TYPER::ITT_entry_size) + 1,
        }
    }

    /// Bytes of an ITT of `events` entries (256-byte aligned, as `MAPD`
    /// needs, and at least one entry's).
    pub fn itt_bytes(&self, events: u32) -> u64 {
        (u64::from(events.max(1)) * self.itt_entry_size).next_multiple_of(256)
    }
}

/// The table a `GITS_BASER<n>` value describes (its `Type`) and its entry
/// size in bytes.
pub fn baser_kind(baser: u64) -> (u64, u64) {
    let baser = LocalRegisterCopy::<u64, BASER::Register>::new(baser);
    (baser.read(BASER::Type), baser.read(BASER::Entry_Size) + 1)
}

/// Pages of a table of `entries` entries of `entry_size` bytes, capped at
/// [`MAX_TABLE_PAGES`].
pub fn table_pages(entries: u64, entry_size: u64) -> u64 {
    (entries * entry_size)
        .div_ceil(PAGE)
        .clamp(1, MAX_TABLE_PAGES)
}

/// The `GITS_BASER<n>` value of a valid flat table of `pages` 4 KiB pages
/// at `address`, keeping the read-only `Type` and `Entry_Size` of `read`.
pub fn baser_value(read: u64, address: u64, pages: u64) -> u64 {
    let mut value = LocalRegisterCopy::<u64, BASER::Register>::new(read);
    value.modify(
        BASER::Valid::SET
            + BASER::Indirect::CLEAR
            + BASER::InnerCache.val(CACHE_WB)
            + BASER::OuterCache.val(0)
            + BASER::Physical_Address.val(address >> 12)
            + BASER::Shareability.val(INNER_SHAREABLE)
            + BASER::Page_Size.val(0)
            + BASER::Size.val(pages - 1),
    );
    value.get()
}

/// The `GITS_CBASER` value of a queue of [`QUEUE_BYTES`] at `address`.
pub fn cbaser_value(address: u64) -> u64 {
    let mut value = LocalRegisterCopy::<u64, CBASER::Register>::new(0);
    value.write(
        CBASER::Valid::SET
            + CBASER::InnerCache.val(CACHE_WB)
            + CBASER::Physical_Address.val(address >> 12)
            + CBASER::Shareability.val(INNER_SHAREABLE)
            + CBASER::Size.val(QUEUE_BYTES / PAGE - 1),
    );
    value.get()
}

/// The `GICR_PROPBASER` value of the property table at `address`.
pub fn propbaser_value(address: u64) -> u64 {
    let mut value = LocalRegisterCopy::<u64, PROPBASER::Register>::new(0);
    value.write(
        PROPBASER::Physical_Address.val(address >> 12)
            + PROPBASER::Shareability.val(INNER_SHAREABLE)
            + PROPBASER::InnerCache.val(CACHE_WB)
            + PROPBASER::IDbits.val(u64::from(HOST_LPI_ID_BITS - 1)),
    );
    value.get()
}

/// The `GICR_PENDBASER` value of a zeroed pending table at `address`.
pub fn pendbaser_value(address: u64) -> u64 {
    let mut value = LocalRegisterCopy::<u64, PENDBASER::Register>::new(0);
    value.write(
        PENDBASER::PTZ::SET
            + PENDBASER::Physical_Address.val(address >> 16)
            + PENDBASER::Shareability.val(INNER_SHAREABLE)
            + PENDBASER::InnerCache.val(CACHE_WB),
    );
    value.get()
}

/// Whether a redistributor with this `GICR_TYPER` has physical LPIs.
pub fn has_lpis(gicr_typer: u64) -> bool {
    LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(gicr_typer).is_set(GICR_TYPER::PLPIS)
}

/// A redistributor's `RDbase` in commands: its processor number (from
/// `GICR_TYPER`) or, with `pta`, its physical address `rd`.
pub fn target_of(pta: bool, rd: u64, gicr_typer: u64) -> u64 {
    if pta {
        rd
    } else {
        LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(gicr_typer)
            .read(GICR_TYPER::Processor_Number)
            << 16
    }
}

/// The `RDbase` field of a command (DW2\[51:16\]) holding `target`
/// ([`target_of`]: a processor number already shifted, or a 64 KiB aligned
/// address).
const fn rdbase(target: u64) -> u64 {
    target & 0x000f_ffff_ffff_0000
}

/// `MAPD`: DeviceID `device` to the ITT at `itt` of `events` (a power of
/// two) entries, or unmapped.
pub fn mapd(device: u32, events: u32, itt: u64, valid: bool) -> [u64; 4] {
    let size = events.max(2).trailing_zeros().saturating_sub(1);
    [
        u64::from(device) << 32 | 0x08,
        u64::from(size),
        u64::from(valid) << 63 | (itt & 0x000f_ffff_ffff_ff00),
        0,
    ]
}

/// `MAPC`: collection `icid` to redistributor `target` ([`target_of`]).
pub fn mapc(icid: u16, target: u64) -> [u64; 4] {
    [0x09, 0, 1 << 63 | rdbase(target) | u64::from(icid), 0]
}

/// `MAPTI`: (`device`, `event`) to LPI `intid` in collection `icid`.
pub fn mapti(device: u32, event: u32, intid: u32, icid: u16) -> [u64; 4] {
    [
        u64::from(device) << 32 | 0x0a,
        u64::from(intid) << 32 | u64::from(event),
        u64::from(icid),
        0,
    ]
}

/// `SYNC` of redistributor `target`.
pub fn sync(target: u64) -> [u64; 4] {
    [0x05, 0, rdbase(target), 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typer_of_qemus_its() {
        // QEMU 7.2: Physical, 12-byte ITT entries, 16 ID and DeviceID
        // bits, PTA 0, CIDbits 15 + CIL.
        let typer = 1 | 0xb << 4 | 15 << 8 | 15 << 13 | 1 << 36 | 15 << 32;
        let features = ItsFeatures::from_typer(typer);
        assert_eq!(
            features,
            ItsFeatures {
                physical: true,
                pta: false,
                device_bits: 16,
                itt_entry_size: 12
            }
        );
        assert_eq!(features.itt_bytes(4), 256);
        assert_eq!(features.itt_bytes(32), 512);
        assert!(ItsFeatures::from_typer(1 << 19).pta);
        assert!(!ItsFeatures::from_typer(1 << 19).physical);
        assert!(has_lpis(3 << 8 | 1));
        assert!(!has_lpis(3 << 8));
    }

    #[test]
    fn table_registers() {
        // QEMU's GITS_BASER0: Type 1 (devices), Entry_Size 7.
        let read = TYPE_DEVICES << 56 | 7 << 48;
        assert_eq!(baser_kind(read), (TYPE_DEVICES, 8));
        assert_eq!(table_pages(1 << 16, 8), 128);
        assert_eq!(table_pages(1 << 20, 8), MAX_TABLE_PAGES);
        assert_eq!(table_pages(64, 8), 1);
        assert_eq!(
            baser_value(read, 0x4010_0000, 128),
            1 << 63 | 7 << 59 | read | 0x4010_0000 | 1 << 10 | 127
        );
        assert_eq!(
            cbaser_value(0x4020_0000),
            1 << 63 | 7 << 59 | 0x4020_0000 | 1 << 10
        );
        assert_eq!(
            propbaser_value(0x4030_0000),
            0x4030_0000 | 1 << 10 | 7 << 7 | 13
        );
        assert_eq!(
            pendbaser_value(0x4040_0000),
            1 << 62 | 0x4040_0000 | 1 << 10 | 7 << 7
        );
        assert_eq!(PROPERTY_TABLE_BYTES, 8192);
        assert_eq!(PENDING_TABLE_BYTES, 2048);
    }

    #[test]
    fn commands() {
        // Processor number 3 (GICR_TYPER[23:8]).
        let target = target_of(false, 0x080a_0000, 3 << 8);
        assert_eq!(target, 3 << 16);
        assert_eq!(target_of(true, 0x080e_0000, 3 << 8), 0x080e_0000);
        assert_eq!(mapc(2, target), [0x09, 0, 1 << 63 | 3 << 16 | 2, 0]);
        assert_eq!(sync(target), [0x05, 0, 3 << 16, 0]);
        // 4 events: Size 1 (2 EventID bits).
        assert_eq!(
            mapd(0x8, 4, 0x4050_0100, true),
            [0x8 << 32 | 0x08, 1, 1 << 63 | 0x4050_0100, 0]
        );
        assert_eq!(mapd(0x8, 1, 0, false), [0x8 << 32 | 0x08, 0, 0, 0]);
        assert_eq!(mapd(0x8, 1024, 0, true)[1], 9);
        assert_eq!(
            mapti(0x8, 3, 8195, 1),
            [0x8 << 32 | 0x0a, 8195 << 32 | 3, 1, 0]
        );
    }
}
