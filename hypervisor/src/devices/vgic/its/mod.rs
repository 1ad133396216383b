//! The virtual ITS: a GICv3 Interrupt Translation Service that turns a
//! (DeviceID, EventID) message into an LPI on a vCPU.
//!
//! # What the guest sees
//!
//! Two 64 KiB frames at the base the device tree names (an
//! `arm,gic-v3-its` node with `msi-controller`): the control frame
//! (`GITS_CTLR`, `IIDR`, `TYPER`, `CBASER`, `CWRITER`, `CREADR`,
//! `BASER0..7` and the ID block, `PIDR2.ArchRev` 3) and the translation
//! frame with `GITS_TRANSLATER`. `GITS_TYPER` says: physical LPIs only,
//! 8-byte ITT entries, 16 EventID and 16 DeviceID bits (LPIs are
//! 8192..16384: `GICD_TYPER.IDbits`, module `lpi`),
//! `PTA` 0 (a target redistributor is named by its processor number, the
//! vCPU index), no hardware collections, no SEIs. The tables sit in guest
//! memory where the guest's `GITS_BASER<n>` put them (module [`tables`]).
//!
//! # The command queue
//!
//! The guest writes 32-byte commands ([`command`]) to the ring `CBASER`
//! describes and advances `GITS_CWRITER`. The ITS runs them at once, in
//! the trapped write, under the GIC's lock, until `CREADR` meets `CWRITER`;
//! a guest that then polls `CREADR` finds every command complete (`SYNC`
//! has nothing left to wait for) and `GITS_CTLR.Quiescent` always reads 1.
//! Commands run only while `GITS_CTLR.Enabled` is set; enabling the ITS
//! runs what was queued meanwhile.
//!
//! # Errors
//!
//! The architecture lets an ITS without SEIs either drop a command it
//! cannot perform or stall the queue. This one:
//!
//! - *drops* a command whose arguments are wrong (a DeviceID, EventID, ICID
//!   or LPI out of range, a processor number of no vCPU, an unmapped
//!   device, event or collection, an event mapped twice, a table entry
//!   outside the table or outside RAM, an unknown command): `CREADR` moves
//!   past it and nothing changes;
//! - *stalls* when the queue itself is wrong: `CWRITER` at or past the end
//!   of the ring, or a command that cannot be read from RAM. `CREADR.Stalled`
//!   is set and stays set until the guest writes `CWRITER` with `Retry` set
//!   (which retries the command) or disables the ITS and writes `CBASER`
//!   (which empties the queue).
//!
//! Every dropped command and every stall is reported to the caller
//! ([`ItsWriteOutcome`]), which logs it. No guest value reaches an address
//! outside the VM's RAM: every table access goes through the memslots
//! ([`GuestMemory`]), like a device's.
//!
//! # Translation requests
//!
//! A guest store to `GITS_TRANSLATER` carries EventID = the value stored and
//! DeviceID 0 (a CPU has no requester ID; QEMU's ITS does the same). The
//! lookup is the architecture's: the device table entry gives the ITT,
//! the ITT entry the LPI and collection, and the LPI becomes pending on
//! the collection's vCPU (module `lpi`). A request that finds no mapping
//! is ignored.

pub mod command;
pub mod tables;
#[cfg(test)]
mod tests;

use super::lpi::LpiError;
use super::regs::{self, IIDR};
use super::{Frame, VcpuSet, VgicError, VgicState};
use crate::devices::guest_memory::GuestMemory;
use command::ItsCommand;
use tables::{
    BASER_VALID, BASER_WRITABLE, DeviceEntry, Table, TranslationEntry, decode_collection,
    encode_collection,
};

/// Size of the ITS's two frames together.
pub const ITS_SIZE: u64 = 0x2_0000;
/// Offset of `GITS_TRANSLATER` from the ITS base.
pub const TRANSLATER_OFFSET: u64 = 0x1_0040;
/// DeviceID bits (`GITS_TYPER.Devbits` + 1).
pub const DEVICE_ID_BITS: u32 = 16;
/// EventID bits an ITT may have at most (`MAPD`'s size + 1).
pub const EVENT_ID_BITS: u32 = 16;

/// `GITS_CTLR.Enabled`.
const CTLR_ENABLED: u64 = 1 << 0;
/// `GITS_CTLR.Quiescent`.
const CTLR_QUIESCENT: u64 = 1 << 31;
/// `GITS_TYPER`: Physical, ITT_entry_size 7 (8 bytes), ID_bits (EventID
/// bits), Devbits; SEIS, PTA, HCC, CIL and the virtual features 0.
const TYPER: u64 = 1
    | (tables::ENTRY_SIZE - 1) << 4
    | ((EVENT_ID_BITS - 1) as u64) << 8
    | ((DEVICE_ID_BITS - 1) as u64) << 13;
/// The `GITS_CBASER` bits that keep what the guest writes: Valid,
/// InnerCache, OuterCache, the address \[51:12\], Shareability, Size.
const CBASER_WRITABLE: u64 =
    1 << 63 | 0x3800_0000_0000_0000 | 0x00e0_0000_0000_0000 | CBASER_ADDRESS | 0xc00 | 0xff;
/// `GITS_CBASER.Physical_Address`.
const CBASER_ADDRESS: u64 = 0x000f_ffff_ffff_f000;
/// `GITS_CWRITER.Offset` / `GITS_CREADR.Offset`.
const QUEUE_OFFSET: u64 = 0xf_ffe0;
/// `GITS_CWRITER.Retry`.
const CWRITER_RETRY: u64 = 1 << 0;
/// `GITS_CREADR.Stalled`.
const CREADR_STALLED: u64 = 1 << 0;

/// The ITS's registers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ItsState {
    /// Guest physical address of the control frame.
    pub(crate) base: u64,
    /// `GITS_CTLR.Enabled`.
    enabled: bool,
    /// `GITS_CBASER`'s stored bits.
    cbaser: u64,
    /// `GITS_CWRITER.Offset`.
    cwriter: u64,
    /// `GITS_CREADR.Offset`.
    creadr: u64,
    /// `GITS_CREADR.Stalled`.
    stalled: bool,
    /// The stored bits of `GITS_BASER0` (devices) and `GITS_BASER1`
    /// (collections).
    baser: [u64; 2],
}

impl ItsState {
    /// An ITS in its reset state (disabled, no queue, no tables) at `base`.
    pub fn new(base: u64) -> Self {
        Self {
            base,
            ..Self::default()
        }
    }

    /// The ring's size in bytes (0 when `CBASER` is not valid).
    fn queue_size(&self) -> u64 {
        if self.cbaser & BASER_VALID == 0 {
            0
        } else {
            ((self.cbaser & 0xff) + 1) * 4096
        }
    }
}

/// Why the ITS dropped a command (or could not translate a request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// DeviceID at or above 2^[`DEVICE_ID_BITS`].
    DeviceOutOfRange(u32),
    /// `MAPD` asked for more EventID bits than [`EVENT_ID_BITS`].
    IttTooLarge(u8),
    /// The EventID is beyond the device's ITT.
    EventOutOfRange {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// The device has no valid device table entry.
    DeviceNotMapped(u32),
    /// The event has no valid ITT entry.
    EventNotMapped {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// `MAPTI`/`MAPI` of an event that is mapped already.
    EventMapped {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// The ICID is beyond the collection table.
    CollectionOutOfRange(u16),
    /// The collection has no valid entry.
    CollectionNotMapped(u16),
    /// A processor number of no vCPU.
    NoSuchTarget(u64),
    /// The table (`GITS_BASER<n>`) is not valid, or too small for the
    /// index.
    NoTableEntry(Table),
    /// A table entry is not in guest RAM.
    NotRam(u64),
    /// The LPI cannot be mapped.
    Lpi(LpiError),
    /// A command number this ITS does not implement.
    Unknown(u8),
}

impl core::fmt::Display for CommandError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::DeviceOutOfRange(device) => write!(
                f,
                "DeviceID {device:#x} is beyond the {DEVICE_ID_BITS} DeviceID bits"
            ),
            Self::IttTooLarge(size) => write!(
                f,
                "an ITT of {} EventID bits (at most {EVENT_ID_BITS})",
                u32::from(size) + 1
            ),
            Self::EventOutOfRange { device, event } => {
                write!(
                    f,
                    "EventID {event:#x} is beyond the ITT of DeviceID {device:#x}"
                )
            }
            Self::DeviceNotMapped(device) => write!(f, "DeviceID {device:#x} is not mapped"),
            Self::EventNotMapped { device, event } => {
                write!(
                    f,
                    "EventID {event:#x} of DeviceID {device:#x} is not mapped"
                )
            }
            Self::EventMapped { device, event } => write!(
                f,
                "EventID {event:#x} of DeviceID {device:#x} is mapped already"
            ),
            Self::CollectionOutOfRange(icid) => {
                write!(f, "ICID {icid} is beyond the collection table")
            }
            Self::CollectionNotMapped(icid) => write!(f, "ICID {icid} is not mapped"),
            Self::NoSuchTarget(target) => {
                write!(f, "no redistributor with processor number {target}")
            }
            Self::NoTableEntry(table) => write!(
                f,
                "the {} table is not valid or too small",
                match table {
                    Table::Devices => "device",
                    Table::Collections => "collection",
                }
            ),
            Self::NotRam(ipa) => write!(f, "the table entry at IPA {ipa:#x} is not guest RAM"),
            Self::Lpi(e) => write!(f, "{e}"),
            Self::Unknown(number) => write!(f, "command {number:#04x} is not implemented"),
        }
    }
}

/// Why the command queue stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallReason {
    /// `CWRITER` points at or past the end of the ring.
    WriterOutsideQueue {
        /// `GITS_CWRITER.Offset`.
        cwriter: u64,
        /// The ring's size.
        size: u64,
    },
    /// The command at this guest physical address is not in RAM.
    CommandNotRam(u64),
}

impl core::fmt::Display for StallReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::WriterOutsideQueue { cwriter, size } => write!(
                f,
                "GITS_CWRITER offset {cwriter:#x} is outside the {size:#x}-byte command queue"
            ),
            Self::CommandNotRam(ipa) => write!(f, "the command at IPA {ipa:#x} is not guest RAM"),
        }
    }
}

/// What a store to the ITS did besides changing registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItsWriteOutcome {
    /// The vCPUs to kick.
    pub kicks: VcpuSet,
    /// Commands run (dropped ones included).
    pub commands: u32,
    /// Commands dropped.
    pub dropped: u32,
    /// The first dropped command and why.
    pub first_drop: Option<(ItsCommand, CommandError)>,
    /// Why the queue stalled, when this store stalled it.
    pub stall: Option<StallReason>,
}

/// A register of the control frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ItsRegister {
    Ctlr,
    Iidr,
    Typer,
    Cbaser,
    Cwriter,
    Creadr,
    Baser(usize),
    Translater,
    Id(u32),
}

fn decode(offset: u64) -> Option<ItsRegister> {
    use ItsRegister as R;
    Some(match offset {
        0x0000 => R::Ctlr,
        0x0004 => R::Iidr,
        0x0008 | 0x000c => R::Typer,
        0x0080 | 0x0084 => R::Cbaser,
        0x0088 | 0x008c => R::Cwriter,
        0x0090 | 0x0094 => R::Creadr,
        0x0100..0x0140 => R::Baser(((offset - 0x100) / 8) as usize),
        TRANSLATER_OFFSET => R::Translater,
        _ if offset < 0x1_0000 => R::Id(regs::id_register(offset)?),
        _ => return None,
    })
}

impl VgicState {
    /// Gives the GIC an ITS at `base` (two 64 KiB frames, 64 KiB aligned,
    /// clear of the distributor and redistributors): `GICD_TYPER` then
    /// reports LPIs and 16 INTID bits and each redistributor its LPI
    /// registers. GICv3 only.
    pub fn enable_its(&mut self, base: u64) -> Result<(), VgicError> {
        let overlaps =
            |start: u64, size: u64| base < start.saturating_add(size) && start < base + ITS_SIZE;
        if self.version != super::VgicVersion::V3
            || !base.is_multiple_of(0x1_0000)
            || base.checked_add(ITS_SIZE).is_none()
            || overlaps(self.distributor_base, super::DISTRIBUTOR_SIZE)
            || overlaps(
                self.redistributor_base,
                self.vcpus.len() as u64 * super::REDISTRIBUTOR_STRIDE,
            )
        {
            return Err(VgicError::Layout);
        }
        self.its = Some(ItsState::new(base));
        Ok(())
    }

    /// Whether the GIC has an ITS (and so LPIs).
    pub fn has_its(&self) -> bool {
        self.its.is_some()
    }

    /// The ITS's base, if it has one.
    pub fn its_base(&self) -> Option<u64> {
        self.its.as_ref().map(|its| its.base)
    }

    fn its_register(&self, offset: u64, size: u8) -> Result<ItsRegister, VgicError> {
        let register = decode(offset).ok_or(VgicError::UnknownRegister {
            frame: Frame::Its,
            offset,
        })?;
        let width = match register {
            ItsRegister::Typer
            | ItsRegister::Cbaser
            | ItsRegister::Cwriter
            | ItsRegister::Creadr
            | ItsRegister::Baser(_) => regs::Width::Double,
            _ => regs::Width::Word,
        };
        // The translation register also takes 16-bit stores.
        if register == ItsRegister::Translater && size == 2 {
            return Ok(register);
        }
        regs::check_access(Frame::Its, offset, size, width)?;
        Ok(register)
    }

    /// A guest load of `size` bytes at `offset` in the ITS's frames.
    pub fn its_read(&self, offset: u64, size: u8) -> Result<u64, VgicError> {
        let register = self.its_register(offset, size)?;
        let Some(its) = self.its.as_ref() else {
            return Ok(0);
        };
        let value = match register {
            ItsRegister::Ctlr => CTLR_QUIESCENT | u64::from(its.enabled),
            ItsRegister::Iidr => u64::from(IIDR),
            ItsRegister::Typer => TYPER,
            ItsRegister::Cbaser => its.cbaser,
            ItsRegister::Cwriter => its.cwriter,
            ItsRegister::Creadr => its.creadr | if its.stalled { CREADR_STALLED } else { 0 },
            ItsRegister::Baser(n) => Table::of_baser(n).map_or(0, |t| t.baser_value(its.baser[n])),
            ItsRegister::Translater => 0,
            ItsRegister::Id(value) => u64::from(value),
        };
        Ok(regs::read_part(value, offset, size))
    }

    /// A guest store of the low `size` bytes of `value` at `offset` in the
    /// ITS's frames: may run the command queue (through `memory`, the VM's
    /// RAM) or translate a request.
    pub fn its_write(
        &mut self,
        offset: u64,
        size: u8,
        value: u64,
        memory: &dyn GuestMemory,
    ) -> Result<ItsWriteOutcome, VgicError> {
        let register = self.its_register(offset, size)?;
        let Some(its) = self.its.as_mut() else {
            return Ok(ItsWriteOutcome::default());
        };
        match register {
            ItsRegister::Ctlr => {
                its.enabled = value & CTLR_ENABLED != 0;
                return Ok(self.run_queue(memory));
            }
            ItsRegister::Cbaser if !its.enabled => {
                its.cbaser = regs::merge_part(its.cbaser, offset, size, value) & CBASER_WRITABLE;
                its.creadr = 0;
                its.stalled = false;
            }
            ItsRegister::Cwriter => {
                let merged = regs::merge_part(its.cwriter, offset, size, value);
                its.cwriter = merged & QUEUE_OFFSET;
                if merged & CWRITER_RETRY != 0 {
                    its.stalled = false;
                }
                return Ok(self.run_queue(memory));
            }
            ItsRegister::Baser(n) if !its.enabled && n < its.baser.len() => {
                its.baser[n] = regs::merge_part(its.baser[n], offset, size, value) & BASER_WRITABLE;
            }
            ItsRegister::Translater => {
                let mut outcome = ItsWriteOutcome::default();
                if its.enabled {
                    let event = (value & if size == 2 { 0xffff } else { 0xffff_ffff }) as u32;
                    if let Ok(intid) = self.translate_to_collection(0, event, memory) {
                        outcome.kicks = self.pend_lpi(intid);
                    }
                }
                return Ok(outcome);
            }
            _ => {}
        }
        Ok(ItsWriteOutcome::default())
    }

    /// Runs the queued commands (module docs).
    fn run_queue(&mut self, memory: &dyn GuestMemory) -> ItsWriteOutcome {
        let mut outcome = ItsWriteOutcome::default();
        loop {
            let Some(its) = self.its.as_mut() else {
                return outcome;
            };
            let size = its.queue_size();
            if !its.enabled || its.stalled || size == 0 || its.creadr == its.cwriter {
                return outcome;
            }
            if its.cwriter >= size || its.creadr >= size {
                its.stalled = true;
                outcome.stall = Some(StallReason::WriterOutsideQueue {
                    cwriter: its.cwriter,
                    size,
                });
                return outcome;
            }
            let address = (its.cbaser & CBASER_ADDRESS) + its.creadr;
            let mut raw = [0u8; ItsCommand::SIZE as usize];
            if memory.read(address, &mut raw).is_err() {
                its.stalled = true;
                outcome.stall = Some(StallReason::CommandNotRam(address));
                return outcome;
            }
            its.creadr = (its.creadr + ItsCommand::SIZE) % size;
            let mut dw = [0u64; 4];
            for (i, word) in dw.iter_mut().enumerate() {
                let bytes = raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]);
                *word = u64::from_le_bytes(bytes);
            }
            let command = ItsCommand::decode(dw);
            outcome.commands += 1;
            match self.execute(command, memory) {
                Ok(kicks) => outcome.kicks = outcome.kicks.union(kicks),
                Err(error) => {
                    outcome.dropped += 1;
                    outcome.first_drop.get_or_insert((command, error));
                }
            }
        }
    }

    /// Reads the doubleword at `ipa`.
    fn read_entry(memory: &dyn GuestMemory, ipa: u64) -> Result<u64, CommandError> {
        memory.read_u64(ipa).map_err(|_| CommandError::NotRam(ipa))
    }

    /// Writes the doubleword at `ipa`.
    fn write_entry(memory: &dyn GuestMemory, ipa: u64, value: u64) -> Result<(), CommandError> {
        memory
            .write(ipa, &value.to_le_bytes())
            .map_err(|_| CommandError::NotRam(ipa))
    }

    /// The stored `GITS_BASER<n>` of `table`.
    fn baser(&self, table: Table) -> u64 {
        self.its.as_ref().map_or(0, |its| match table {
            Table::Devices => its.baser[0],
            Table::Collections => its.baser[1],
        })
    }

    /// The address of `table`'s entry `index`.
    fn entry_address(&self, table: Table, index: u64) -> Result<u64, CommandError> {
        Table::entry_address(self.baser(table), index).ok_or(CommandError::NoTableEntry(table))
    }

    /// The device table entry of `device`.
    fn device_entry(
        &self,
        device: u32,
        memory: &dyn GuestMemory,
    ) -> Result<(u64, Option<DeviceEntry>), CommandError> {
        if u64::from(device) >= 1 << DEVICE_ID_BITS {
            return Err(CommandError::DeviceOutOfRange(device));
        }
        let address = self.entry_address(Table::Devices, u64::from(device))?;
        Ok((
            address,
            DeviceEntry::decode(Self::read_entry(memory, address)?),
        ))
    }

    /// The address of the ITT entry of (`device`, `event`), the device
    /// being mapped.
    fn itt_entry_address(
        &self,
        device: u32,
        event: u32,
        memory: &dyn GuestMemory,
    ) -> Result<u64, CommandError> {
        let entry = self
            .device_entry(device, memory)?
            .1
            .ok_or(CommandError::DeviceNotMapped(device))?;
        if u64::from(event) >= entry.events() {
            return Err(CommandError::EventOutOfRange { device, event });
        }
        entry
            .itt
            .checked_add(u64::from(event) * tables::ENTRY_SIZE)
            .ok_or(CommandError::NotRam(entry.itt))
    }

    /// The collection table entry of `collection`: its address and target.
    fn collection_entry(
        &self,
        collection: u16,
        memory: &dyn GuestMemory,
    ) -> Result<(u64, Option<usize>), CommandError> {
        let address = self
            .entry_address(Table::Collections, u64::from(collection))
            .map_err(|_| CommandError::CollectionOutOfRange(collection))?;
        let target = decode_collection(Self::read_entry(memory, address)?)
            .filter(|&vcpu| vcpu < self.vcpus.len());
        Ok((address, target))
    }

    /// The vCPU a processor number names.
    fn target(&self, target: u64) -> Result<usize, CommandError> {
        usize::try_from(target)
            .ok()
            .filter(|&vcpu| vcpu < self.vcpus.len())
            .ok_or(CommandError::NoSuchTarget(target))
    }

    /// The live ITT entry at `address` for (`device`, `event`): valid, and
    /// its LPI still mapped by that event (an entry a `MAPD` left behind in a
    /// reused ITT, or one the guest wrote itself, is not).
    fn live_entry(
        &self,
        address: u64,
        device: u32,
        event: u32,
        memory: &dyn GuestMemory,
    ) -> Result<Option<TranslationEntry>, CommandError> {
        Ok(
            TranslationEntry::decode(Self::read_entry(memory, address)?).filter(|entry| {
                self.lpis
                    .get(&entry.intid)
                    .is_some_and(|lpi| lpi.mapped && lpi.device == device && lpi.event == event)
            }),
        )
    }

    /// Looks (`device`, `event`) up: its LPI and collection.
    fn translate(
        &self,
        device: u32,
        event: u32,
        memory: &dyn GuestMemory,
    ) -> Result<(u32, u16), CommandError> {
        let address = self.itt_entry_address(device, event, memory)?;
        let entry = self
            .live_entry(address, device, event, memory)?
            .ok_or(CommandError::EventNotMapped { device, event })?;
        Ok((entry.intid, entry.collection))
    }

    /// Looks (`device`, `event`) up as a request does: its LPI, whose
    /// collection must be mapped.
    fn translate_to_collection(
        &self,
        device: u32,
        event: u32,
        memory: &dyn GuestMemory,
    ) -> Result<u32, CommandError> {
        let (intid, collection) = self.translate(device, event, memory)?;
        self.collection_entry(collection, memory)?
            .1
            .ok_or(CommandError::CollectionNotMapped(collection))?;
        Ok(intid)
    }

    /// Performs one command. Returns the vCPUs to kick.
    fn execute(
        &mut self,
        command: ItsCommand,
        memory: &dyn GuestMemory,
    ) -> Result<VcpuSet, CommandError> {
        let mut kicks = VcpuSet::EMPTY;
        match command {
            ItsCommand::Mapd {
                device,
                size,
                itt,
                valid,
            } => {
                if valid && u32::from(size) + 1 > EVENT_ID_BITS {
                    return Err(CommandError::IttTooLarge(size));
                }
                let (address, _) = self.device_entry(device, memory)?;
                let raw = if valid {
                    DeviceEntry { itt, size }.encode()
                } else {
                    0
                };
                Self::write_entry(memory, address, raw)?;
                // A remapped or unmapped device's events go with its old ITT.
                for intid in self.lpis_where(|lpi| lpi.device == device) {
                    kicks = kicks.union(self.unmap_lpi(intid));
                }
            }
            ItsCommand::Mapc {
                collection,
                target,
                valid,
            } => {
                let (address, _) = self.collection_entry(collection, memory)?;
                if valid {
                    let vcpu = self.target(target)?;
                    Self::write_entry(memory, address, encode_collection(vcpu))?;
                    for intid in self.lpis_where(|lpi| lpi.collection == collection) {
                        kicks = kicks.union(self.retarget_lpi(intid, vcpu, collection));
                    }
                } else {
                    Self::write_entry(memory, address, 0)?;
                }
            }
            ItsCommand::Mapti {
                device,
                event,
                intid,
                collection,
            } => self.map_event(device, event, intid, collection, memory)?,
            ItsCommand::Mapi {
                device,
                event,
                collection,
            } => self.map_event(device, event, event, collection, memory)?,
            ItsCommand::Int { device, event } => {
                let intid = self.translate_to_collection(device, event, memory)?;
                kicks = self.pend_lpi(intid);
            }
            ItsCommand::Clear { device, event } => {
                let intid = self.translate_to_collection(device, event, memory)?;
                kicks = self.clear_lpi(intid);
            }
            ItsCommand::Discard { device, event } => {
                let (intid, _) = self.translate(device, event, memory)?;
                let address = self.itt_entry_address(device, event, memory)?;
                Self::write_entry(memory, address, 0)?;
                kicks = self.unmap_lpi(intid);
            }
            ItsCommand::Inv { device, event } => {
                let (intid, _) = self.translate(device, event, memory)?;
                kicks = self.reload_lpi(intid, memory);
            }
            ItsCommand::Invall { collection } => {
                self.collection_entry(collection, memory)?
                    .1
                    .ok_or(CommandError::CollectionNotMapped(collection))?;
                for intid in self.lpis_where(|lpi| lpi.collection == collection) {
                    kicks = kicks.union(self.reload_lpi(intid, memory));
                }
            }
            ItsCommand::Movi {
                device,
                event,
                collection,
            } => {
                let (intid, _) = self.translate(device, event, memory)?;
                let vcpu = self
                    .collection_entry(collection, memory)?
                    .1
                    .ok_or(CommandError::CollectionNotMapped(collection))?;
                let address = self.itt_entry_address(device, event, memory)?;
                Self::write_entry(
                    memory,
                    address,
                    TranslationEntry { intid, collection }.encode(),
                )?;
                kicks = self.retarget_lpi(intid, vcpu, collection);
            }
            ItsCommand::Movall { from, to } => {
                let from = self.target(from)?;
                let to = self.target(to)?;
                for intid in self.lpis_where(|lpi| lpi.vcpu == from) {
                    let collection = self.lpis[&intid].collection;
                    kicks = kicks.union(self.retarget_lpi(intid, to, collection));
                }
            }
            ItsCommand::Sync { target } => {
                self.target(target)?;
            }
            ItsCommand::Unknown(number) => return Err(CommandError::Unknown(number)),
        }
        Ok(kicks)
    }

    /// `MAPTI` / `MAPI`: (`device`, `event`) to LPI `intid` through
    /// `collection`.
    fn map_event(
        &mut self,
        device: u32,
        event: u32,
        intid: u32,
        collection: u16,
        memory: &dyn GuestMemory,
    ) -> Result<(), CommandError> {
        let address = self.itt_entry_address(device, event, memory)?;
        if self.live_entry(address, device, event, memory)?.is_some() {
            return Err(CommandError::EventMapped { device, event });
        }
        let (_, vcpu) = self.collection_entry(collection, memory)?;
        if !Self::is_lpi(intid) {
            return Err(CommandError::Lpi(LpiError::OutOfRange(intid)));
        }
        self.map_lpi(intid, (collection, vcpu), (device, event), memory)
            .map_err(CommandError::Lpi)?;
        if let Err(error) = Self::write_entry(
            memory,
            address,
            TranslationEntry { intid, collection }.encode(),
        ) {
            self.unmap_lpi(intid);
            return Err(error);
        }
        Ok(())
    }
}
