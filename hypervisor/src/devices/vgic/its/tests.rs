//! The virtual ITS against a guest RAM in a vector: registers, every
//! command, delivery through model list registers, command errors and
//! stalls, and a randomised run against a model of the translation.

use super::*;
use crate::devices::guest_memory::{GuestMemoryError, HostSpan};
use crate::devices::vgic::list_regs::ModelListRegisters;
use crate::devices::vgic::{VgicConfig, VgicState};
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::collections::BTreeMap;

/// Guest RAM: 4 MiB at 0x4000_0000.
const RAM: u64 = 0x4000_0000;
const RAM_SIZE: u64 = 0x40_0000;
/// Where the test puts the tables.
const DEVICE_TABLE: u64 = RAM;
const COLLECTION_TABLE: u64 = RAM + 0x1_0000;
const QUEUE: u64 = RAM + 0x2_0000;
const PROPERTIES: u64 = RAM + 0x3_0000;
const PENDING: u64 = RAM + 0x5_0000;
const ITT: u64 = RAM + 0x10_0000;
/// `GITS_*` offsets.
const CTLR: u64 = 0x0;
const TYPER_OFFSET: u64 = 0x8;
const CBASER: u64 = 0x80;
const CWRITER: u64 = 0x88;
const CREADR: u64 = 0x90;
const BASER0: u64 = 0x100;
/// `GICR_*` offsets.
const GICR_CTLR: u64 = 0x0;
const GICR_TYPER: u64 = 0x8;
const GICR_PROPBASER: u64 = 0x70;
const GICR_PENDBASER: u64 = 0x78;

struct VecMemory {
    bytes: RefCell<Vec<u8>>,
}

impl VecMemory {
    fn new() -> Self {
        Self {
            bytes: RefCell::new(vec![0; RAM_SIZE as usize]),
        }
    }

    fn range(&self, ipa: u64, len: usize) -> Result<core::ops::Range<usize>, GuestMemoryError> {
        let start = ipa
            .checked_sub(RAM)
            .ok_or(GuestMemoryError::NotRam { ipa })?;
        let end = start + len as u64;
        if end > RAM_SIZE {
            return Err(GuestMemoryError::NotRam { ipa });
        }
        Ok(start as usize..end as usize)
    }

    fn put_u64(&self, ipa: u64, value: u64) {
        self.write(ipa, &value.to_le_bytes()).unwrap();
    }

    fn get_u64(&self, ipa: u64) -> u64 {
        self.read_u64(ipa).unwrap()
    }
}

impl GuestMemory for VecMemory {
    fn read(&self, ipa: u64, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let range = self.range(ipa, buf.len())?;
        buf.copy_from_slice(&self.bytes.borrow()[range]);
        Ok(())
    }

    fn write(&self, ipa: u64, buf: &[u8]) -> Result<(), GuestMemoryError> {
        let range = self.range(ipa, buf.len())?;
        self.bytes.borrow_mut()[range].copy_from_slice(buf);
        Ok(())
    }

    fn host_spans(
        &self,
        _ipa: u64,
        _len: u64,
        _device_writes: bool,
        _out: &mut Vec<HostSpan>,
    ) -> Result<(), GuestMemoryError> {
        unimplemented!("the ITS reads and writes entries only")
    }
}

/// A guest driving the ITS: the GIC, its RAM and its queue position.
struct Driver {
    gic: VgicState,
    memory: VecMemory,
    /// Next free slot in the queue.
    next: u64,
    lrs: Vec<ModelListRegisters>,
}

const QUEUE_PAGES: u64 = 1;

fn gic(vcpus: usize) -> VgicState {
    let mut gic = VgicState::new(VgicConfig {
        distributor_base: 0x0800_0000,
        redistributor_base: 0x080a_0000,
        spi_count: 64,
        vcpu_mpidrs: (0..vcpus as u64).collect(),
    })
    .unwrap();
    gic.enable_its(0x0808_0000).unwrap();
    gic
}

impl Driver {
    /// A GIC with `vcpus` vCPUs and an ITS, set up as a guest's driver
    /// does it: tables, queue, property table (every LPI enabled at
    /// priority 0xa0), LPIs enabled on every redistributor, group 1 on.
    fn new(vcpus: usize) -> Self {
        let mut driver = Self {
            gic: gic(vcpus),
            memory: VecMemory::new(),
            next: 0,
            lrs: (0..vcpus).map(|_| ModelListRegisters::new(4)).collect(),
        };
        for intid in 8192..8192 + 1024u64 {
            driver
                .memory
                .write(PROPERTIES + intid - 8192, &[0xa0 | 1])
                .unwrap();
        }
        driver.write(BASER0, 8, 1 << 63 | DEVICE_TABLE | 15);
        driver.write(BASER0 + 8, 8, 1 << 63 | COLLECTION_TABLE);
        driver.write(CBASER, 8, 1 << 63 | QUEUE | (QUEUE_PAGES - 1));
        driver.write(CWRITER, 8, 0);
        for vcpu in 0..vcpus {
            // PROPBASER: 16 ID bits.
            driver.rd_write(vcpu, GICR_PROPBASER, PROPERTIES | 15);
            driver.rd_write(vcpu, GICR_PENDBASER, PENDING + vcpu as u64 * 0x1_0000);
            driver.rd_write(vcpu, GICR_CTLR, 1);
        }
        driver.gic.distributor_write(0, 4, 0x2 | 0x10).unwrap();
        driver.write(CTLR, 4, 1);
        driver
    }

    fn write(&mut self, offset: u64, size: u8, value: u64) -> ItsWriteOutcome {
        self.gic
            .its_write(offset, size, value, &self.memory)
            .unwrap()
    }

    fn read(&self, offset: u64) -> u64 {
        self.gic.its_read(offset, 8).unwrap()
    }

    fn rd_write(&mut self, vcpu: usize, offset: u64, value: u64) {
        let size = if offset == GICR_CTLR { 4 } else { 8 };
        self.gic.rd_base_write(vcpu, offset, size, value).unwrap();
    }

    /// Queues `commands` and runs them.
    fn run(&mut self, commands: &[[u64; 4]]) -> ItsWriteOutcome {
        let size = QUEUE_PAGES * 4096;
        for command in commands {
            for (i, dw) in command.iter().enumerate() {
                self.memory.put_u64(QUEUE + self.next + 8 * i as u64, *dw);
            }
            self.next = (self.next + 32) % size;
        }
        let outcome = self.write(CWRITER, 8, self.next);
        assert_eq!(self.read(CREADR), self.next, "every command ran");
        outcome
    }

    /// Fills `vcpu`'s list registers and lets the guest acknowledge and
    /// complete what they signal; returns the INTIDs taken, in order.
    fn take(&mut self, vcpu: usize) -> Vec<u32> {
        let mut taken = Vec::new();
        for _ in 0..16 {
            self.gic.fill(vcpu, &mut self.lrs[vcpu]).unwrap();
            let Some(intid) = self.lrs[vcpu].acknowledge() else {
                break;
            };
            self.lrs[vcpu].end_of_interrupt(intid);
            taken.push(intid);
        }
        self.gic.fold(vcpu, &mut self.lrs[vcpu]).unwrap();
        taken
    }
}

fn mapd(device: u32, bits: u8, itt: u64, valid: bool) -> [u64; 4] {
    [
        u64::from(device) << 32 | 0x08,
        u64::from(bits - 1),
        u64::from(valid) << 63 | itt,
        0,
    ]
}

fn mapc(collection: u16, target: u64) -> [u64; 4] {
    [0x09, 0, 1 << 63 | target << 16 | u64::from(collection), 0]
}

fn mapti(device: u32, event: u32, intid: u32, collection: u16) -> [u64; 4] {
    [
        u64::from(device) << 32 | 0x0a,
        u64::from(intid) << 32 | u64::from(event),
        u64::from(collection),
        0,
    ]
}

fn event_command(number: u64, device: u32, event: u32) -> [u64; 4] {
    [u64::from(device) << 32 | number, u64::from(event), 0, 0]
}

fn int(device: u32, event: u32) -> [u64; 4] {
    event_command(0x03, device, event)
}

fn movi(device: u32, event: u32, collection: u16) -> [u64; 4] {
    [
        u64::from(device) << 32 | 0x01,
        u64::from(event),
        u64::from(collection),
        0,
    ]
}

/// Two devices of 4 events each, collection n on vCPU n, and events mapped
/// to LPIs 8192 + 4 * device + event on collection `event % vcpus`.
fn mapped(vcpus: usize) -> Driver {
    let mut d = Driver::new(vcpus);
    let mut commands = vec![mapd(0, 2, ITT, true), mapd(1, 2, ITT + 0x100, true)];
    for c in 0..vcpus {
        commands.push(mapc(c as u16, c as u64));
    }
    for device in 0..2 {
        for event in 0..4 {
            commands.push(mapti(
                device,
                event,
                8192 + 4 * device + event,
                (event as usize % vcpus) as u16,
            ));
        }
    }
    let outcome = d.run(&commands);
    assert_eq!(outcome.dropped, 0, "{outcome:?}");
    d
}

#[test]
fn registers_describe_the_its() {
    let d = Driver::new(1);
    let typer = d.read(TYPER_OFFSET);
    assert_eq!(typer & 1, 1, "physical LPIs");
    assert_eq!((typer >> 4) & 0xf, 7, "8-byte ITT entries");
    assert_eq!((typer >> 8) & 0x1f, 15, "16 EventID bits");
    assert_eq!((typer >> 13) & 0x1f, 15, "16 DeviceID bits");
    assert_eq!((typer >> 19) & 1, 0, "PTA 0");
    assert_eq!(d.gic.its_read(0xffe8, 4).unwrap() & 0xf0, 0x30, "ArchRev 3");
    assert_eq!(d.gic.its_read(CTLR, 4).unwrap(), 1 << 31 | 1);
    let baser0 = d.read(BASER0);
    assert_eq!((baser0 >> 56) & 7, 1, "device table");
    assert_eq!((baser0 >> 48) & 0x1f, 7, "8-byte entries");
    assert_eq!((d.read(BASER0 + 8) >> 56) & 7, 4, "collection table");
    assert_eq!(d.read(BASER0 + 16), 0, "no third table");
    // GICD_TYPER: LPIs, 14 ID bits; GICR_TYPER.PLPIS; EnableLPIs.
    let gicd_typer = d.gic.distributor_read(4, 4).unwrap();
    assert_eq!((gicd_typer >> 17) & 1, 1);
    assert_eq!((gicd_typer >> 19) & 0x1f, 13);
    assert_eq!(d.gic.rd_base_read(0, GICR_TYPER, 8).unwrap() & 1, 1);
    assert_eq!(d.gic.rd_base_read(0, GICR_CTLR, 4).unwrap(), 1);
}

#[test]
fn table_registers_keep_what_sticks_and_ignore_writes_while_enabled() {
    let mut gic = gic(1);
    let memory = VecMemory::new();
    // Indirect (62) and a 64 KiB page size (9:8 = 2) do not stick;
    // cacheability and shareability do.
    let written = 1 << 63 | 1 << 62 | 7 << 59 | DEVICE_TABLE | 0x2 << 8 | 0x400 | 3;
    gic.its_write(BASER0, 8, written, &memory).unwrap();
    let read = gic.its_read(BASER0, 8).unwrap();
    assert_eq!(
        read & !(0x1f << 48 | 7 << 56),
        written & !(1 << 62 | 0x3 << 8)
    );
    gic.its_write(CBASER, 8, 1 << 63 | QUEUE, &memory).unwrap();
    gic.its_write(CTLR, 4, 1, &memory).unwrap();
    gic.its_write(BASER0, 8, 0, &memory).unwrap();
    gic.its_write(CBASER, 8, 0, &memory).unwrap();
    assert_eq!(gic.its_read(BASER0, 8).unwrap(), read);
    assert_eq!(gic.its_read(CBASER, 8).unwrap(), 1 << 63 | QUEUE);
    // Once set, EnableLPIs stays, and PROPBASER no longer changes.
    gic.rd_base_write(0, GICR_PROPBASER, 8, PROPERTIES | 15)
        .unwrap();
    gic.rd_base_write(0, GICR_CTLR, 4, 1).unwrap();
    gic.rd_base_write(0, GICR_CTLR, 4, 0).unwrap();
    gic.rd_base_write(0, GICR_PROPBASER, 8, 0).unwrap();
    assert_eq!(gic.rd_base_read(0, GICR_CTLR, 4).unwrap(), 1);
    assert_eq!(
        gic.rd_base_read(0, GICR_PROPBASER, 8).unwrap(),
        PROPERTIES | 15
    );
}

#[test]
fn int_and_translater_deliver_the_mapped_lpi_on_its_collection() {
    let mut d = mapped(2);
    // The tables hold the mappings, in guest RAM.
    assert_ne!(d.memory.get_u64(DEVICE_TABLE + 8), 0, "device 1's entry");
    assert_ne!(d.memory.get_u64(COLLECTION_TABLE + 8), 0, "collection 1");
    assert_ne!(d.memory.get_u64(ITT + 0x100 + 3 * 8), 0, "device 1 event 3");
    let outcome = d.run(&[int(1, 3)]);
    assert!(outcome.kicks.contains(1), "{outcome:?}");
    assert_eq!(d.take(0), Vec::<u32>::new());
    assert_eq!(d.take(1), vec![8192 + 7]);
    // A CPU's store to GITS_TRANSLATER is DeviceID 0.
    let outcome = d.write(TRANSLATER_OFFSET, 4, 2);
    assert!(outcome.kicks.contains(0));
    assert_eq!(d.take(0), vec![8192 + 2]);
    assert!(!d.gic.has_deliverable(0) && !d.gic.has_deliverable(1));
    // Two pending: the more urgent (property table) is taken first.
    d.memory.write(PROPERTIES + 4, &[0x20 | 1]).unwrap();
    d.run(&[event_command(0x0c, 1, 0)]); // INV
    d.run(&[int(0, 0), int(1, 0)]);
    assert_eq!(d.take(0), vec![8192 + 4, 8192]);
}

#[test]
fn movi_and_movall_move_pending_lpis() {
    let mut d = mapped(4);
    // Event 1 of device 0 is on collection 1; pend it, move it to 3.
    d.run(&[int(0, 1)]);
    let outcome = d.run(&[movi(0, 1, 3)]);
    assert!(outcome.kicks.contains(3), "{outcome:?}");
    assert_eq!(d.take(1), Vec::<u32>::new());
    assert_eq!(d.take(3), vec![8193]);
    // The ITT entry names the new collection; the next INT goes to 3.
    d.run(&[int(0, 1)]);
    assert_eq!(d.take(3), vec![8193]);
    // MOVALL 3 -> 2: everything targeting vCPU 3 (events 1 and 3 of both
    // devices now: event 3 was on collection 3 from the start).
    d.run(&[int(0, 3), int(1, 3)]);
    d.run(&[[0x0e, 0, 3 << 16, 2 << 16]]);
    assert_eq!(d.take(3), Vec::<u32>::new());
    assert_eq!(d.take(2), vec![8192 + 3, 8192 + 7]);
    // MAPC of collection 3 to vCPU 0 retargets its LPIs.
    d.run(&[mapc(3, 0), int(1, 3)]);
    assert_eq!(d.take(0), vec![8192 + 7]);
}

#[test]
fn an_lpi_moved_while_listed_is_released_to_its_new_target() {
    let mut d = mapped(3);
    // Listed pending on vCPU 1 (which has not taken it), then its
    // collection is mapped to vCPU 2.
    d.run(&[int(0, 1)]);
    d.gic.fill(1, &mut d.lrs[1]).unwrap();
    let outcome = d.run(&[mapc(1, 2)]);
    assert!(outcome.kicks.contains(1) && outcome.kicks.contains(2));
    // vCPU 2 fills first: still vCPU 1's.
    d.gic.fill(2, &mut d.lrs[2]).unwrap();
    assert_eq!(d.lrs[2].acknowledge(), None);
    // vCPU 1 lets it go, and says vCPU 2 must fill again.
    d.gic.fill(1, &mut d.lrs[1]).unwrap();
    assert_eq!(d.lrs[1].acknowledge(), None);
    assert_eq!(d.gic.take_released().iter().collect::<Vec<_>>(), vec![2]);
    assert_eq!(d.take(2), vec![8193]);
}

#[test]
fn an_lpi_the_guest_is_handling_stays_on_its_vcpu_until_completed() {
    let mut d = mapped(2);
    // vCPU 1 takes event 1's LPI; MOVI sends the event to vCPU 0 before
    // vCPU 1's EOI.
    d.run(&[int(0, 1)]);
    d.gic.fill(1, &mut d.lrs[1]).unwrap();
    assert_eq!(d.lrs[1].acknowledge(), Some(8193));
    d.run(&[movi(0, 1, 0)]);
    d.gic.fill(1, &mut d.lrs[1]).unwrap();
    d.gic.fill(0, &mut d.lrs[0]).unwrap();
    assert_eq!(d.lrs[0].acknowledge(), None, "not vCPU 0's to take");
    assert!(
        d.lrs[1].list_registers().iter().any(|&lr| lr != 0),
        "still listed where the guest handles it"
    );
    // Completed on vCPU 1 (no stale active state anywhere): the next INT
    // goes to vCPU 0.
    d.lrs[1].end_of_interrupt(8193);
    d.gic.fold(1, &mut d.lrs[1]).unwrap();
    assert_eq!(d.gic.lpis[&8193].irq.in_service, None);
    d.run(&[int(0, 1)]);
    assert_eq!(d.take(1), Vec::<u32>::new());
    assert_eq!(d.take(0), vec![8193]);
}

#[test]
fn discard_clear_inv_and_invall() {
    let mut d = mapped(1);
    // CLEAR takes back a pending LPI.
    d.run(&[int(0, 0), event_command(0x04, 0, 0)]);
    assert_eq!(d.take(0), Vec::<u32>::new());
    // DISCARD: pending state gone, the event no longer translates.
    d.run(&[int(0, 1)]);
    let outcome = d.run(&[event_command(0x0f, 0, 1)]);
    assert_eq!(outcome.dropped, 0);
    assert_eq!(d.take(0), Vec::<u32>::new());
    let outcome = d.run(&[int(0, 1)]);
    assert_eq!(
        outcome.first_drop.map(|(_, e)| e),
        Some(CommandError::EventNotMapped {
            device: 0,
            event: 1
        })
    );
    assert!(!d.gic.lpis.contains_key(&8193), "the record is gone");
    // The event can be mapped again, to another LPI.
    let outcome = d.run(&[mapti(0, 1, 9000, 0), int(0, 1)]);
    assert_eq!(outcome.dropped, 0);
    assert_eq!(d.take(0), vec![9000]);
    // INV: a disabled LPI stays pending until enabled and invalidated.
    d.memory.write(PROPERTIES + 2, &[0xa0]).unwrap();
    d.run(&[event_command(0x0c, 0, 2), int(0, 2)]);
    assert_eq!(d.take(0), Vec::<u32>::new());
    d.memory.write(PROPERTIES + 2, &[0xa1]).unwrap();
    assert_eq!(d.take(0), Vec::<u32>::new(), "cached until INV");
    d.run(&[event_command(0x0c, 0, 2)]);
    assert_eq!(d.take(0), vec![8194]);
    // INVALL of collection 0 the same way, for two LPIs.
    d.memory.write(PROPERTIES + 3, &[0xa0]).unwrap();
    d.memory.write(PROPERTIES + 4, &[0xa0]).unwrap();
    d.run(&[[0x0d, 0, 0, 0], int(0, 3), int(1, 0)]);
    assert_eq!(d.take(0), Vec::<u32>::new());
    d.memory.write(PROPERTIES + 3, &[0xa1]).unwrap();
    d.memory.write(PROPERTIES + 4, &[0xa1]).unwrap();
    d.run(&[[0x0d, 0, 0, 0]]);
    assert_eq!(d.take(0), vec![8195, 8196]);
}

#[test]
fn a_discarded_lpi_the_guest_holds_goes_when_it_is_done() {
    let mut d = mapped(1);
    d.run(&[int(0, 0)]);
    d.gic.fill(0, &mut d.lrs[0]).unwrap();
    assert_eq!(d.lrs[0].acknowledge(), Some(8192));
    d.run(&[event_command(0x0f, 0, 0)]);
    assert!(d.gic.lpis.contains_key(&8192), "still in the guest's hands");
    d.lrs[0].end_of_interrupt(8192);
    d.gic.fold(0, &mut d.lrs[0]).unwrap();
    assert!(!d.gic.lpis.contains_key(&8192));
}

#[test]
fn command_errors_are_dropped_and_later_commands_run() {
    let mut d = mapped(2);
    let bad: [([u64; 4], CommandError); 9] = [
        (
            mapd(1 << 16, 2, ITT, true),
            CommandError::DeviceOutOfRange(1 << 16),
        ),
        (mapd(5, 17, ITT, true), CommandError::IttTooLarge(16)),
        (
            mapti(0, 4, 9100, 0),
            CommandError::EventOutOfRange {
                device: 0,
                event: 4,
            },
        ),
        (mapti(7, 0, 9100, 0), CommandError::DeviceNotMapped(7)),
        (
            mapti(0, 0, 9100, 0),
            CommandError::EventMapped {
                device: 0,
                event: 0,
            },
        ),
        (mapc(0, 2), CommandError::NoSuchTarget(2)),
        (mapc(600, 0), CommandError::CollectionOutOfRange(600)),
        ([0x29, 0, 0, 0], CommandError::Unknown(0x29)),
        ([0x0e, 0, 0, 9 << 16], CommandError::NoSuchTarget(9)),
    ];
    for (command, error) in bad {
        let outcome = d.run(&[command]);
        assert_eq!(outcome.dropped, 1, "{command:x?}");
        assert_eq!(outcome.first_drop.map(|(_, e)| e), Some(error));
        assert_eq!(outcome.stall, None);
    }
    // An LPI below 8192 or beyond the ID bits, and a mapping of an LPI
    // another event has.
    d.run(&[mapd(2, 2, ITT + 0x200, true)]);
    for intid in [8191, 1 << 14] {
        let outcome = d.run(&[mapti(2, 0, intid, 0)]);
        assert_eq!(
            outcome.first_drop.map(|(_, e)| e),
            Some(CommandError::Lpi(
                crate::devices::vgic::lpi::LpiError::OutOfRange(intid)
            ))
        );
    }
    let outcome = d.run(&[mapti(2, 0, 8192, 0)]);
    assert_eq!(
        outcome.first_drop.map(|(_, e)| e),
        Some(CommandError::Lpi(
            crate::devices::vgic::lpi::LpiError::AlreadyMapped(8192)
        ))
    );
    // An ITT outside RAM: the mapping is dropped, nothing is touched.
    d.run(&[mapd(3, 2, 0x1000, true)]);
    let outcome = d.run(&[mapti(3, 0, 9200, 0)]);
    assert_eq!(
        outcome.first_drop.map(|(_, e)| e),
        Some(CommandError::NotRam(0x1000))
    );
    // Everything still works.
    d.run(&[int(1, 1)]);
    assert_eq!(d.take(1), vec![8192 + 5]);
}

#[test]
fn a_wrong_queue_stalls_until_retried_or_reset() {
    let mut d = mapped(1);
    // CWRITER past the end of the one-page queue.
    let outcome = d.write(CWRITER, 8, 0x1000);
    assert_eq!(
        outcome.stall,
        Some(StallReason::WriterOutsideQueue {
            cwriter: 0x1000,
            size: 0x1000
        })
    );
    assert_eq!(d.read(CREADR) & 1, 1, "Stalled");
    // Fixed and retried: runs again.
    d.next = d.read(CREADR) & !1;
    d.memory.put_u64(QUEUE + d.next, int(0, 0)[0]);
    d.memory.put_u64(QUEUE + d.next + 8, 0);
    let outcome = d.write(CWRITER, 8, (d.next + 32) | 1);
    assert_eq!(outcome.commands, 1);
    assert_eq!(d.read(CREADR), d.next + 32);
    assert_eq!(d.take(0), vec![8192]);
    // A queue outside RAM stalls on the first command; a new CBASER
    // (with the ITS disabled) empties the queue.
    d.write(CTLR, 4, 0);
    d.write(CBASER, 8, 1 << 63 | 0x1000);
    d.write(CWRITER, 8, 0);
    d.write(CTLR, 4, 1);
    let outcome = d.write(CWRITER, 8, 32);
    assert_eq!(outcome.stall, Some(StallReason::CommandNotRam(0x1000)));
    assert_eq!(d.read(CREADR), 1);
    d.write(CTLR, 4, 0);
    d.write(CBASER, 8, 1 << 63 | QUEUE);
    assert_eq!(d.read(CREADR), 0);
}

#[test]
fn commands_wait_for_the_its_to_be_enabled() {
    let mut d = Driver::new(1);
    d.write(CTLR, 4, 0);
    d.memory.put_u64(QUEUE, mapc(0, 0)[0]);
    d.memory.put_u64(QUEUE + 16, mapc(0, 0)[2]);
    d.write(CWRITER, 8, 32);
    assert_eq!(d.read(CREADR), 0, "not run while disabled");
    let outcome = d.write(CTLR, 4, 1);
    assert_eq!(outcome.commands, 1);
    assert_eq!(d.read(CREADR), 32);
    assert_ne!(d.memory.get_u64(COLLECTION_TABLE), 0);
}

#[test]
fn lpis_for_a_redistributor_with_lpis_disabled_are_ignored() {
    let mut d = Driver::new(2);
    // A fresh GIC whose vCPU 1 never enabled LPIs.
    d.gic = gic(2);
    d.write(BASER0, 8, 1 << 63 | DEVICE_TABLE | 15);
    d.write(BASER0 + 8, 8, 1 << 63 | COLLECTION_TABLE);
    d.write(CBASER, 8, 1 << 63 | QUEUE);
    d.next = 0;
    d.rd_write(0, GICR_PROPBASER, PROPERTIES | 15);
    d.rd_write(0, GICR_CTLR, 1);
    d.gic.distributor_write(0, 4, 0x12).unwrap();
    d.write(CTLR, 4, 1);
    d.run(&[mapd(0, 2, ITT, true), mapc(0, 1), mapti(0, 0, 8192, 0)]);
    let outcome = d.run(&[int(0, 0)]);
    assert_eq!(outcome.kicks, VcpuSet::EMPTY);
    assert_eq!(d.take(1), Vec::<u32>::new());
    assert!(!d.gic.has_deliverable(1));
}

#[test]
fn unmapping_a_device_discards_its_events() {
    let mut d = mapped(1);
    d.run(&[int(0, 0), mapd(0, 2, ITT, false)]);
    assert_eq!(d.take(0), Vec::<u32>::new());
    assert_eq!(d.memory.get_u64(DEVICE_TABLE), 0);
    // Mapped again over the same ITT: the old entries do not translate.
    let outcome = d.run(&[mapd(0, 2, ITT, true), int(0, 0)]);
    assert_eq!(
        outcome.first_drop.map(|(_, e)| e),
        Some(CommandError::EventNotMapped {
            device: 0,
            event: 0
        })
    );
    let outcome = d.run(&[mapti(0, 0, 8192, 0), int(0, 0)]);
    assert_eq!(outcome.dropped, 0);
    assert_eq!(d.take(0), vec![8192]);
}

#[test]
fn a_reset_keeps_the_its_in_its_reset_state() {
    let vgic = crate::devices::vgic::Vgic::new(VgicConfig {
        distributor_base: 0x0800_0000,
        redistributor_base: 0x080a_0000,
        spi_count: 64,
        vcpu_mpidrs: vec![0],
    })
    .unwrap();
    vgic.enable_its(0x0808_0000).unwrap();
    let memory = VecMemory::new();
    vgic.lock()
        .its_write(CBASER, 8, 1 << 63 | QUEUE, &memory)
        .unwrap();
    vgic.reset().unwrap();
    let state = vgic.lock();
    assert_eq!(state.its_base(), Some(0x0808_0000));
    assert_eq!(state.its_read(CBASER, 8).unwrap(), 0);
}

#[test]
fn the_its_must_not_overlap_the_gic() {
    let mut g = VgicState::new(VgicConfig {
        distributor_base: 0x0800_0000,
        redistributor_base: 0x080a_0000,
        spi_count: 64,
        vcpu_mpidrs: vec![0, 1],
    })
    .unwrap();
    assert_eq!(g.enable_its(0x080a_0000), Err(VgicError::Layout));
    assert_eq!(g.enable_its(0x0800_0000), Err(VgicError::Layout));
    assert_eq!(g.enable_its(0x0808_1000), Err(VgicError::Layout));
    assert_eq!(g.enable_its(0x0808_0000), Ok(()));
}

/// A model of what the ITS should translate: devices (ITT size),
/// collections (vCPU), events (LPI, collection).
#[derive(Default)]
struct Model {
    devices: BTreeMap<u32, u8>,
    collections: BTreeMap<u16, usize>,
    events: BTreeMap<(u32, u32), (u32, u16)>,
}

impl Model {
    fn lpi_taken(&self, intid: u32) -> bool {
        self.events.values().any(|&(i, _)| i == intid)
    }

    /// What `command` does to the model; whether it should be accepted.
    fn apply(&mut self, command: [u64; 4], vcpus: usize) -> bool {
        match ItsCommand::decode(command) {
            ItsCommand::Mapd {
                device,
                size,
                valid,
                ..
            } => {
                if device >= 1 << 16 || (valid && size >= 16) {
                    return false;
                }
                self.events.retain(|&(d, _), _| d != device);
                if valid {
                    self.devices.insert(device, size);
                } else {
                    self.devices.remove(&device);
                }
                true
            }
            ItsCommand::Mapc {
                collection,
                target,
                valid,
            } => {
                if collection >= 512 || (valid && target >= vcpus as u64) {
                    return false;
                }
                if valid {
                    self.collections.insert(collection, target as usize);
                } else {
                    self.collections.remove(&collection);
                }
                true
            }
            ItsCommand::Mapti {
                device,
                event,
                intid,
                collection,
            } => {
                let ok = self
                    .devices
                    .get(&device)
                    .is_some_and(|&size| u64::from(event) < 1 << (size + 1))
                    && !self.events.contains_key(&(device, event))
                    && collection < 512
                    && (8192..1 << 14).contains(&intid)
                    && !self.lpi_taken(intid);
                if ok {
                    self.events.insert((device, event), (intid, collection));
                }
                ok
            }
            ItsCommand::Int { device, event } | ItsCommand::Clear { device, event } => self
                .events
                .get(&(device, event))
                .is_some_and(|(_, collection)| self.collections.contains_key(collection)),
            ItsCommand::Discard { device, event } => self.events.remove(&(device, event)).is_some(),
            ItsCommand::Movi {
                device,
                event,
                collection,
            } => {
                let ok = self.events.contains_key(&(device, event))
                    && self.collections.contains_key(&collection);
                if ok {
                    self.events.get_mut(&(device, event)).unwrap().1 = collection;
                }
                ok
            }
            _ => unreachable!(),
        }
    }
}

/// A random command over a small space of devices, events, LPIs and
/// collections, sometimes out of range.
fn random_command(rng: &mut u64) -> [u64; 4] {
    let mut next = |n: u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % n
    };
    let device = if next(20) == 0 {
        1 << 16
    } else {
        next(4) as u32
    };
    let event = next(6) as u32;
    let collection = if next(20) == 0 { 600 } else { next(3) as u16 };
    match next(7) {
        0 => mapd(
            device,
            1 + next(2) as u8,
            ITT + 0x100 * u64::from(device % 4),
            next(5) != 0,
        ),
        1 => mapc(collection, next(4)),
        2 | 3 => mapti(device, event, 8192 + next(12) as u32, collection),
        4 => int(device, event),
        5 => event_command(0x0f, device, event),
        _ => movi(device, event, collection),
    }
}

#[test]
fn random_commands_translate_as_the_model_says() {
    for seed in 1..=200u64 {
        let vcpus = 1 + (seed % 3) as usize;
        let mut d = Driver::new(vcpus);
        let mut model = Model::default();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for step in 0..150 {
            let command = random_command(&mut rng);
            let accepted = model.apply(command, vcpus);
            let outcome = d.run(&[command]);
            assert_eq!(
                outcome.dropped == 0,
                accepted,
                "seed {seed} step {step}: {:?} -> {outcome:?}",
                ItsCommand::decode(command)
            );
            // Every event the model knows translates to its LPI, targeting
            // its collection's vCPU when the collection is mapped.
            for (&(device, event), &(intid, collection)) in &model.events {
                assert_eq!(
                    d.gic.translate(device, event, &d.memory),
                    Ok((intid, collection)),
                    "seed {seed} step {step}"
                );
                if let Some(&vcpu) = model.collections.get(&collection) {
                    assert_eq!(d.gic.lpis[&intid].vcpu, vcpu, "seed {seed} step {step}");
                }
            }
            let mapped = d.gic.lpis.values().filter(|lpi| lpi.mapped).count();
            assert_eq!(mapped, model.events.len(), "seed {seed} step {step}");
        }
        // Whatever is pending is delivered to its target, once.
        for vcpu in 0..vcpus {
            let taken = d.take(vcpu);
            for intid in &taken {
                assert_eq!(d.gic.lpis.get(intid).map_or(vcpu, |l| l.vcpu), vcpu);
            }
            assert!(!d.gic.has_deliverable(vcpu), "seed {seed}");
        }
    }
}
