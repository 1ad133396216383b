//! A small driver for a GICv3 Interrupt Translation Service (ITS) and the
//! redistributors' LPI tables, reusable by any scenario (no heap, fixed
//! memory): the `its` scenario drives it, a fuzz family may reuse it.
//!
//! Memory: the caller gives one [`REGION_SIZE`] region of free guest RAM
//! (aligned to 64 KiB); [`Layout`] cuts it into the ITS device table (flat,
//! up to [`DEVICE_TABLE_MAX`]), the collection table, the command queue
//! ([`QUEUE_SIZE`]), the LPI property table, the interrupt translation
//! tables (ITTs, 256-byte aligned) and one pending table per CPU (64 KiB
//! aligned), all zeroed by [`Its::init`] and cleaned to the point of
//! coherency, so the ITS may read them with any cacheability.
//!
//! Setting up, following IHI 0069 (GICv3 architecture):
//! 1. [`Its::init`] (one CPU, the ITS disabled): reads `GITS_TYPER`, each
//!    `GITS_BASER<n>`'s Type and Entry_Size, gives the device table and the
//!    collection table their memory (4 KiB pages, flat, Valid) and checks
//!    each value stuck; points `GITS_CBASER` at the queue, zeroes
//!    `GITS_CWRITER` and sets `GITS_CTLR.Enabled`.
//! 2. [`enable_lpis`] (each CPU, on its own redistributor, after
//!    `gic::init_cpu`): checks `GICD_TYPER.LPIS` and `GICR_TYPER.PLPIS`,
//!    writes `GICR_PROPBASER` (the shared property table, [`LPI_ID_BITS`]
//!    bits of INTID) and `GICR_PENDBASER` (its own pending table), then sets
//!    `GICR_CTLR.EnableLPIs`.
//!
//! Commands are 32-byte [`Command`]s built by typed constructors (`MAPD`,
//! `MAPC`, `MAPTI`, `MAPI`, `MOVI`, `DISCARD`, `INV`, `INVALL`, `INT`,
//! `CLEAR`, `SYNC`, `MOVALL`); [`Its::submit`] copies them into the queue at
//! `GITS_CWRITER` (wrapping), cleans them to the point of coherency,
//! advances `GITS_CWRITER` and polls `GITS_CREADR` until it catches up,
//! within [`COMMAND_TIMEOUT_MS`], failing when `GITS_CREADR.Stalled` is set.
//! A command that names a redistributor takes an RDbase from
//! [`Its::rdbase`]: the redistributor's physical address when
//! `GITS_TYPER.PTA` is 1, its `GICR_TYPER.Processor_Number` when 0.

use core::arch::asm;
use core::fmt;
use core::ptr::write_volatile;

use crate::gic::{read32, read64, write32, write64};
use crate::smp::Deadline;

/// The first LPI INTID.
pub const LPI_BASE: u32 = 8192;
/// Bits of INTID the property table covers (INTIDs below 16384).
pub const LPI_ID_BITS: u32 = 14;
/// Bytes of the property table: one byte per LPI.
const PROP_TABLE_SIZE: u64 = (1 << LPI_ID_BITS) - LPI_BASE as u64;
/// Bytes of a pending table: one bit per INTID (the first 1 KiB is for
/// the INTIDs below 8192 and stays zero).
const PEND_TABLE_SIZE: u64 = (1 << LPI_ID_BITS) / 8;
/// The page size given to every `GITS_BASER<n>` (Page_Size 0b00).
const PAGE: u64 = 4096;
/// The largest flat device table the driver gives (256 pages, the most a
/// `GITS_BASER` Size field describes with 4 KiB pages).
pub const DEVICE_TABLE_MAX: u64 = 256 * PAGE;
/// Bytes of the collection table.
const COLLECTION_TABLE_SIZE: u64 = 16 * PAGE;
/// Bytes of the command queue (512 commands).
pub const QUEUE_SIZE: u64 = 4 * PAGE;
/// Bytes of one command.
const COMMAND_SIZE: u64 = 32;
/// Bytes given to each small ITT ([`Layout::itt`]).
pub const SMALL_ITT_SIZE: u64 = 4096;
/// How many small ITTs the layout holds.
pub const SMALL_ITTS: u64 = 16;
/// Bytes of the large ITT ([`Layout::large_itt`]): 2^14 events of up to 16
/// bytes, enough for `MAPI` with EventIDs that are LPI INTIDs.
pub const LARGE_ITT_SIZE: u64 = (1 << LPI_ID_BITS) * 16;
/// Bytes of the whole region the driver needs.
pub const REGION_SIZE: u64 = 4 << 20;
/// How long one batch of commands may take.
pub const COMMAND_TIMEOUT_MS: u64 = 1000;

// ITS registers (offsets from the ITS base).
const GITS_CTLR: u64 = 0x0000;
const GITS_CTLR_ENABLED: u32 = 1 << 0;
/// `GITS_CTLR.Quiescent`.
pub const GITS_CTLR_QUIESCENT: u32 = 1 << 31;
const GITS_TYPER: u64 = 0x0008;
const GITS_CBASER: u64 = 0x0080;
const GITS_CWRITER: u64 = 0x0088;
const GITS_CREADR: u64 = 0x0090;
const GITS_CREADR_STALLED: u64 = 1 << 0;
const GITS_BASER: u64 = 0x0100;
const GITS_PIDR2: u64 = 0xffe8;
/// `GITS_TRANSLATER`, in the second 64 KiB frame.
pub const GITS_TRANSLATER: u64 = 0x1_0040;

// Distributor and redistributor registers.
const GICD_TYPER: u64 = 0x0004;
const GICD_TYPER_LPIS: u32 = 1 << 17;
const GICR_CTLR: u64 = 0x0000;
const GICR_CTLR_ENABLE_LPIS: u32 = 1 << 0;
const GICR_TYPER: u64 = 0x0008;
const GICR_TYPER_PLPIS: u64 = 1 << 0;
const GICR_PROPBASER: u64 = 0x0070;
const GICR_PENDBASER: u64 = 0x0078;

/// Cacheability (inner, read- and write-allocate write-back) and
/// shareability (inner shareable) the driver asks for: `GITS_BASER` and
/// `GITS_CBASER` fields.
const BASER_CACHE: u64 = (0b111 << 59) | (0b01 << 10);
/// The same for `GICR_PROPBASER` and `GICR_PENDBASER` (InnerCache 9:7).
const GICR_CACHE: u64 = (0b111 << 7) | (0b01 << 10);
/// `GITS_BASER.Valid` and `GITS_CBASER.Valid`.
const VALID: u64 = 1 << 63;
/// `GITS_BASER` physical address bits 47:12.
const BASER_PA: u64 = 0x0000_ffff_ffff_f000;

/// The `GITS_BASER<n>.Type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableType {
    /// 0: not implemented.
    None,
    /// 1: devices.
    Devices,
    /// 2: vPEs (GICv4).
    Vpes,
    /// 4: interrupt collections.
    Collections,
    /// Another (reserved) value.
    Other(u8),
}

impl TableType {
    fn from_field(field: u64) -> TableType {
        match field {
            0 => TableType::None,
            1 => TableType::Devices,
            2 => TableType::Vpes,
            4 => TableType::Collections,
            other => TableType::Other(other as u8),
        }
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            TableType::None => "none",
            TableType::Devices => "devices",
            TableType::Vpes => "vPEs",
            TableType::Collections => "collections",
            TableType::Other(_) => "reserved",
        }
    }
}

/// One `GITS_BASER<n>` as the driver found and set it.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// Its type.
    pub kind: TableType,
    /// Bytes per entry (Entry_Size + 1).
    pub entry_size: u64,
    /// The value read back after the driver wrote it (0: left alone).
    pub value: u64,
    /// Bytes given (0: none).
    pub size: u64,
}

/// Why the ITS could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsError {
    /// The device tree has no `arm,gic-v3-its` node.
    NoIts,
    /// `GICD_TYPER.LPIS` is 0: the distributor supports no LPIs.
    NoLpis,
    /// `GICD_TYPER.IDbits` is below [`LPI_ID_BITS`].
    FewIdBits(u32),
    /// This redistributor's `GICR_TYPER.PLPIS` is 0.
    NoPhysicalLpis(u64),
    /// `GICR_CTLR.EnableLPIs` did not read back set.
    LpisNotEnabled(u64),
    /// A register did not keep what was written.
    NotStuck {
        /// The register.
        register: &'static str,
        /// What was written.
        wrote: u64,
        /// What it read back.
        read: u64,
    },
    /// No `GITS_BASER<n>` of this type.
    NoTable(TableType),
    /// The command queue stalled (`GITS_CREADR.Stalled`).
    Stalled {
        /// `GITS_CREADR`.
        creadr: u64,
    },
    /// The ITS did not consume the commands in time.
    Timeout {
        /// `GITS_CREADR`.
        creadr: u64,
        /// `GITS_CWRITER`.
        cwriter: u64,
    },
}

impl fmt::Display for ItsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ItsError::NoIts => write!(f, "no arm,gic-v3-its node in the device tree"),
            ItsError::NoLpis => write!(f, "GICD_TYPER.LPIS is 0"),
            ItsError::FewIdBits(bits) => write!(
                f,
                "GICD_TYPER.IDbits gives {bits} bits, {LPI_ID_BITS} needed"
            ),
            ItsError::NoPhysicalLpis(rd) => {
                write!(f, "GICR_TYPER.PLPIS is 0 at redistributor {rd:#x}")
            }
            ItsError::LpisNotEnabled(rd) => {
                write!(f, "GICR_CTLR.EnableLPIs did not stick at {rd:#x}")
            }
            ItsError::NotStuck {
                register,
                wrote,
                read,
            } => write!(f, "{register} reads {read:#x} after writing {wrote:#x}"),
            ItsError::NoTable(kind) => write!(f, "no GITS_BASER of type {}", kind.name()),
            ItsError::Stalled { creadr } => {
                write!(f, "the command queue stalled (GITS_CREADR {creadr:#x})")
            }
            ItsError::Timeout { creadr, cwriter } => write!(
                f,
                "commands not consumed within {COMMAND_TIMEOUT_MS} ms (GITS_CREADR {creadr:#x}, \
                 GITS_CWRITER {cwriter:#x})"
            ),
        }
    }
}

/// Smallest data cache line (`CTR_EL0.DminLine`).
fn cache_line() -> u64 {
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack)) };
    4 << ((ctr >> 16) & 0xf)
}

/// Cleans and invalidates `[start, start + len)` to the point of coherency
/// and waits for it (`DC CIVAC`, `DSB SY`): an ITS or redistributor that
/// reads memory without snooping the caches sees what the CPU wrote.
pub fn clean(start: u64, len: u64) {
    let line = cache_line();
    let mut at = start & !(line - 1);
    while at < start + len {
        // SAFETY: cache maintenance by address of guest RAM the driver owns;
        // it changes no data.
        unsafe { asm!("dc civac, {}", in(reg) at, options(nostack)) };
        at += line;
    }
    // SAFETY: a barrier only.
    unsafe { asm!("dsb sy", options(nostack)) };
}

/// Zeroes `[start, start + len)` (guest RAM the driver owns) and cleans it.
fn zero(start: u64, len: u64) {
    for at in (start..start + len).step_by(8) {
        // SAFETY: the caller's region is free guest RAM, identity mapped as
        // normal memory, given to this driver alone.
        unsafe { write_volatile(at as *mut u64, 0) };
    }
    clean(start, len);
}

/// Where the driver's tables lie in its region.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// The region's start (64 KiB aligned).
    pub start: u64,
}

impl Layout {
    /// The device table.
    pub fn device_table(self) -> u64 {
        self.start
    }
    /// The collection table.
    pub fn collection_table(self) -> u64 {
        self.start + DEVICE_TABLE_MAX
    }
    /// The command queue (64 KiB aligned).
    pub fn queue(self) -> u64 {
        self.start + DEVICE_TABLE_MAX + 0x1_0000
    }
    /// The LPI property table (64 KiB aligned).
    pub fn property_table(self) -> u64 {
        self.start + DEVICE_TABLE_MAX + 0x2_0000
    }
    /// Small ITT `index` (below [`SMALL_ITTS`]): [`SMALL_ITT_SIZE`] bytes,
    /// 4 KiB aligned.
    pub fn itt(self, index: u64) -> u64 {
        assert!(index < SMALL_ITTS);
        self.start + DEVICE_TABLE_MAX + 0x3_0000 + index * SMALL_ITT_SIZE
    }
    /// The large ITT ([`LARGE_ITT_SIZE`] bytes, 64 KiB aligned).
    pub fn large_itt(self) -> u64 {
        self.start + DEVICE_TABLE_MAX + 0x4_0000
    }
    /// CPU `cpu`'s pending table (64 KiB aligned).
    pub fn pending_table(self, cpu: usize) -> u64 {
        self.large_itt() + LARGE_ITT_SIZE + cpu as u64 * 0x1_0000
    }
    /// Bytes of the region used with `cpus` CPUs.
    pub fn used(self, cpus: usize) -> u64 {
        self.pending_table(cpus) - self.start
    }
}

/// One ITS command (four doublewords).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command(pub [u64; 4]);

/// An RDbase field value as `GITS_TYPER.PTA` wants it ([`Its::rdbase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdBase(pub u64);

impl Command {
    fn new(id: u64, device: u32) -> Command {
        Command([id | u64::from(device) << 32, 0, 0, 0])
    }
    fn event(id: u64, device: u32, event: u32) -> Command {
        let mut command = Command::new(id, device);
        command.0[1] = u64::from(event);
        command
    }
    fn rd(rd: RdBase) -> u64 {
        (rd.0 << 16) & 0x0007_ffff_ffff_0000
    }

    /// `MAPD`: maps `device` to the ITT at `itt` (256-byte aligned) for
    /// `event_bits` bits of EventID; `None` unmaps it.
    pub fn mapd(device: u32, itt: Option<(u64, u32)>) -> Command {
        let mut command = Command::new(0x08, device);
        if let Some((address, event_bits)) = itt {
            command.0[1] = u64::from(event_bits.saturating_sub(1) & 0x1f);
            command.0[2] = VALID | (address & 0x000f_ffff_ffff_ff00);
        }
        command
    }
    /// `MAPC`: maps collection `icid` to redistributor `rd`; `None` unmaps.
    pub fn mapc(icid: u16, rd: Option<RdBase>) -> Command {
        let mut command = Command::new(0x09, 0);
        command.0[2] = u64::from(icid) | rd.map_or(0, |rd| VALID | Command::rd(rd));
        command
    }
    /// `MAPTI`: maps `event` of `device` to LPI `intid` in collection `icid`.
    pub fn mapti(device: u32, event: u32, intid: u32, icid: u16) -> Command {
        let mut command = Command::event(0x0a, device, event);
        command.0[1] |= u64::from(intid) << 32;
        command.0[2] = u64::from(icid);
        command
    }
    /// `MAPI`: maps `event` of `device` to LPI `event` in collection `icid`.
    pub fn mapi(device: u32, event: u32, icid: u16) -> Command {
        let mut command = Command::event(0x0b, device, event);
        command.0[2] = u64::from(icid);
        command
    }
    /// `MOVI`: moves `event` of `device` to collection `icid`.
    pub fn movi(device: u32, event: u32, icid: u16) -> Command {
        let mut command = Command::event(0x01, device, event);
        command.0[2] = u64::from(icid);
        command
    }
    /// `DISCARD`: unmaps `event` of `device` and removes its pending state.
    pub fn discard(device: u32, event: u32) -> Command {
        Command::event(0x0f, device, event)
    }
    /// `INV`: rereads the property table entry of `event`'s LPI.
    pub fn inv(device: u32, event: u32) -> Command {
        Command::event(0x0c, device, event)
    }
    /// `INVALL`: rereads the property table entries of collection `icid`.
    pub fn invall(icid: u16) -> Command {
        let mut command = Command::new(0x0d, 0);
        command.0[2] = u64::from(icid);
        command
    }
    /// `INT`: makes `event` of `device` pending, as a write to
    /// `GITS_TRANSLATER` would.
    pub fn int(device: u32, event: u32) -> Command {
        Command::event(0x03, device, event)
    }
    /// `CLEAR`: removes the pending state of `event`'s LPI.
    pub fn clear(device: u32, event: u32) -> Command {
        Command::event(0x04, device, event)
    }
    /// `SYNC`: waits until redistributor `rd` has seen every earlier effect.
    pub fn sync(rd: RdBase) -> Command {
        let mut command = Command::new(0x05, 0);
        command.0[2] = Command::rd(rd);
        command
    }
    /// `MOVALL`: moves every LPI pending at `from` to `to`.
    pub fn movall(from: RdBase, to: RdBase) -> Command {
        let mut command = Command::new(0x0e, 0);
        command.0[2] = Command::rd(from);
        command.0[3] = Command::rd(to);
        command
    }
}

/// `GITS_TYPER` fields.
#[derive(Clone, Copy, Debug)]
pub struct Typer(pub u64);

impl Typer {
    /// `Physical`: physical LPIs supported.
    pub fn physical(self) -> bool {
        self.0 & 1 != 0
    }
    /// Bytes per ITT entry (ITT_entry_size + 1).
    pub fn itt_entry_size(self) -> u64 {
        ((self.0 >> 4) & 0xf) + 1
    }
    /// Bits of EventID (ID_bits + 1).
    pub fn event_bits(self) -> u32 {
        ((self.0 >> 8) & 0x1f) as u32 + 1
    }
    /// Bits of DeviceID (Devbits + 1).
    pub fn device_bits(self) -> u32 {
        ((self.0 >> 13) & 0x1f) as u32 + 1
    }
    /// `PTA`: RDbase is a physical address.
    pub fn pta(self) -> bool {
        self.0 & (1 << 19) != 0
    }
    /// `HCC`: collections held in the ITS.
    pub fn hcc(self) -> u64 {
        (self.0 >> 24) & 0xff
    }
}

/// An ITS set up by [`Its::init`].
pub struct Its {
    /// The ITS base.
    pub base: u64,
    /// `GITS_TYPER`.
    pub typer: Typer,
    /// Where the tables lie.
    pub layout: Layout,
    /// `GITS_BASER<n>` as found and set.
    pub tables: [Table; 8],
    /// DeviceIDs the device table holds.
    pub device_ids: u64,
    /// Offset of the next command in the queue.
    write: u64,
}

/// Checks that the distributor at `distributor` supports LPIs
/// (`GICD_TYPER.LPIS`) with at least [`LPI_ID_BITS`] bits of INTID.
pub fn check_distributor(distributor: u64) -> Result<(), ItsError> {
    let typer = read32(distributor + GICD_TYPER);
    if typer & GICD_TYPER_LPIS == 0 {
        return Err(ItsError::NoLpis);
    }
    let bits = ((typer >> 19) & 0x1f) + 1;
    if bits < LPI_ID_BITS {
        return Err(ItsError::FewIdBits(bits));
    }
    Ok(())
}

/// Zeroes the property table and sets every LPI to `config` (priority
/// bits 7:2, bit 1 RES1, bit 0 enable). Before any CPU enables LPIs.
pub fn init_property_table(layout: Layout, config: u8) {
    zero(layout.property_table(), 0x1_0000);
    for offset in 0..PROP_TABLE_SIZE {
        set_property(layout, LPI_BASE + offset as u32, config, false);
    }
    clean(layout.property_table(), PROP_TABLE_SIZE);
}

/// Writes LPI `intid`'s property byte (`clean`: and cleans it to the point
/// of coherency; an `INV` or `INVALL` makes the ITS read it again).
pub fn set_property(layout: Layout, intid: u32, config: u8, clean_it: bool) {
    let at = layout.property_table() + u64::from(intid - LPI_BASE);
    // SAFETY: a byte of the property table, in the driver's region.
    unsafe { write_volatile(at as *mut u8, config) };
    if clean_it {
        clean(at, 1);
    }
}

/// A property byte: `priority` (bits 7:2 used), RES1, `enabled`.
pub fn property(priority: u8, enabled: bool) -> u8 {
    (priority & 0xfc) | 0b10 | u8::from(enabled)
}

/// On the CPU whose redistributor `RD_base` is `rd`: points it at the
/// shared property table and at pending table `cpu` (zeroed here) and sets
/// `GICR_CTLR.EnableLPIs`.
pub fn enable_lpis(layout: Layout, rd: u64, cpu: usize) -> Result<(), ItsError> {
    if read64(rd + GICR_TYPER) & GICR_TYPER_PLPIS == 0 {
        return Err(ItsError::NoPhysicalLpis(rd));
    }
    let pending = layout.pending_table(cpu);
    zero(pending, PEND_TABLE_SIZE);
    let propbaser = layout.property_table() | GICR_CACHE | u64::from(LPI_ID_BITS - 1);
    write64(rd + GICR_PROPBASER, propbaser);
    let read = read64(rd + GICR_PROPBASER);
    // The address must stick; IDbits, cacheability and shareability may
    // read back as the redistributor implements them.
    if read & 0x000f_ffff_ffff_f000 != layout.property_table() {
        return Err(ItsError::NotStuck {
            register: "GICR_PROPBASER",
            wrote: propbaser,
            read,
        });
    }
    let pendbaser = pending | GICR_CACHE;
    write64(rd + GICR_PENDBASER, pendbaser);
    let read = read64(rd + GICR_PENDBASER);
    if read & 0x000f_ffff_ffff_0000 != pending {
        return Err(ItsError::NotStuck {
            register: "GICR_PENDBASER",
            wrote: pendbaser,
            read,
        });
    }
    write32(
        rd + GICR_CTLR,
        read32(rd + GICR_CTLR) | GICR_CTLR_ENABLE_LPIS,
    );
    if read32(rd + GICR_CTLR) & GICR_CTLR_ENABLE_LPIS == 0 {
        return Err(ItsError::LpisNotEnabled(rd));
    }
    Ok(())
}

/// `GICR_TYPER.Processor_Number` of the redistributor at `rd`.
pub fn processor_number(rd: u64) -> u64 {
    (read64(rd + GICR_TYPER) >> 8) & 0xffff
}

impl Its {
    /// Reads `GITS_TYPER` of the ITS at `base` without touching anything.
    pub fn typer_at(base: u64) -> Typer {
        Typer(read64(base + GITS_TYPER))
    }

    /// `GITS_CTLR`.
    pub fn ctlr_at(base: u64) -> u32 {
        read32(base + GITS_CTLR)
    }

    /// `GITS_PIDR2.ArchRev`.
    pub fn arch_rev_at(base: u64) -> u32 {
        (read32(base + GITS_PIDR2) >> 4) & 0xf
    }

    /// Sets the ITS at `base` up in `layout` (see the module doc) and
    /// enables it.
    pub fn init(base: u64, layout: Layout) -> Result<Its, ItsError> {
        let typer = Its::typer_at(base);
        let mut its = Its {
            base,
            typer,
            layout,
            tables: [Table {
                kind: TableType::None,
                entry_size: 0,
                value: 0,
                size: 0,
            }; 8],
            device_ids: 0,
            write: 0,
        };
        // The ITS's own tables: device and collection tables, queue, ITTs
        // (the property table is [`init_property_table`]'s).
        zero(layout.start, layout.property_table() - layout.start);
        zero(layout.itt(0), layout.pending_table(0) - layout.itt(0));
        for (n, table) in its.tables.iter_mut().enumerate() {
            let register = base + GITS_BASER + 8 * n as u64;
            let found = read64(register);
            table.kind = TableType::from_field((found >> 56) & 0x7);
            table.entry_size = ((found >> 48) & 0x1f) + 1;
            let (address, size) = match table.kind {
                TableType::Devices => {
                    let wanted = (1u64 << typer.device_bits().min(32)) * table.entry_size;
                    let size = wanted.clamp(PAGE, DEVICE_TABLE_MAX).next_multiple_of(PAGE);
                    its.device_ids = (size / table.entry_size).min(1 << typer.device_bits());
                    (layout.device_table(), size)
                }
                TableType::Collections => (layout.collection_table(), COLLECTION_TABLE_SIZE),
                _ => continue,
            };
            let keep = found & (0x7 << 56 | 0x1f << 48);
            let value = VALID | BASER_CACHE | keep | address | (size / PAGE - 1);
            write64(register, value);
            let read = read64(register);
            let checked = VALID | (1 << 62) | BASER_PA | (0b11 << 8) | 0xff;
            if read & checked != value & checked {
                return Err(ItsError::NotStuck {
                    register: "GITS_BASER",
                    wrote: value,
                    read,
                });
            }
            table.value = read;
            table.size = size;
        }
        if !its.tables.iter().any(|t| t.kind == TableType::Devices) {
            return Err(ItsError::NoTable(TableType::Devices));
        }
        if typer.hcc() == 0 && !its.tables.iter().any(|t| t.kind == TableType::Collections) {
            return Err(ItsError::NoTable(TableType::Collections));
        }
        let cbaser = VALID | BASER_CACHE | layout.queue() | (QUEUE_SIZE / PAGE - 1);
        write64(base + GITS_CBASER, cbaser);
        let read = read64(base + GITS_CBASER);
        let checked = VALID | 0x000f_ffff_ffff_f000 | 0xff;
        if read & checked != cbaser & checked {
            return Err(ItsError::NotStuck {
                register: "GITS_CBASER",
                wrote: cbaser,
                read,
            });
        }
        write64(base + GITS_CWRITER, 0);
        write32(base + GITS_CTLR, GITS_CTLR_ENABLED);
        if read32(base + GITS_CTLR) & GITS_CTLR_ENABLED == 0 {
            return Err(ItsError::NotStuck {
                register: "GITS_CTLR",
                wrote: GITS_CTLR_ENABLED.into(),
                read: read32(base + GITS_CTLR).into(),
            });
        }
        Ok(its)
    }

    /// The RDbase of the redistributor whose `RD_base` frame is at `rd`.
    pub fn rdbase(&self, rd: u64) -> RdBase {
        if self.typer.pta() {
            RdBase(rd >> 16)
        } else {
            RdBase(processor_number(rd))
        }
    }

    /// `GITS_CREADR`.
    pub fn creadr(&self) -> u64 {
        read64(self.base + GITS_CREADR)
    }

    /// `GITS_CWRITER`.
    pub fn cwriter(&self) -> u64 {
        read64(self.base + GITS_CWRITER)
    }

    /// Queues `commands` and waits until the ITS has consumed them all.
    pub fn submit(&mut self, commands: &[Command]) -> Result<(), ItsError> {
        for command in commands {
            let next = (self.write + COMMAND_SIZE) % QUEUE_SIZE;
            let deadline = Deadline::after_millis(COMMAND_TIMEOUT_MS);
            // The queue is full while the next slot is the one CREADR names.
            while self.creadr() & 0xf_ffe0 == next {
                self.check_progress(deadline)?;
            }
            let at = self.layout.queue() + self.write;
            for (i, word) in command.0.iter().enumerate() {
                // SAFETY: a slot of the command queue, in the driver's region,
                // which the ITS does not read before CWRITER moves past it.
                unsafe { write_volatile((at + 8 * i as u64) as *mut u64, *word) };
            }
            clean(at, COMMAND_SIZE);
            self.write = next;
        }
        write64(self.base + GITS_CWRITER, self.write);
        let deadline = Deadline::after_millis(COMMAND_TIMEOUT_MS);
        while self.creadr() & 0xf_ffe0 != self.write {
            self.check_progress(deadline)?;
        }
        Ok(())
    }

    fn check_progress(&self, deadline: Deadline) -> Result<(), ItsError> {
        let creadr = self.creadr();
        if creadr & GITS_CREADR_STALLED != 0 {
            return Err(ItsError::Stalled { creadr });
        }
        if deadline.passed() {
            return Err(ItsError::Timeout {
                creadr,
                cwriter: self.cwriter(),
            });
        }
        core::hint::spin_loop();
        Ok(())
    }

    /// A CPU write of `event` to `GITS_TRANSLATER` (the DeviceID is the
    /// one the interconnect gives the CPU's write).
    pub fn translate(&self, event: u32) {
        write32(self.base + GITS_TRANSLATER, event);
    }
}
