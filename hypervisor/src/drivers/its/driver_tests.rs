//! Host tests of the ITS driver's sequences (`driver`), against the
//! recording mock (`mock`): each sequence is checked access by access, the
//! commands it queues are decoded field by field, and every log is checked
//! for the cleans and barriers that must come before the ITS may read
//! memory ([`check_published_clean`]).

use super::driver::{HostIts, ItsError};
use super::mock::{Access, Access::*, ITS, MockFrame, MockIts, MockMemory, MockPool, RAM};
use super::{
    COMMAND_BYTES, LPI_PROPERTY, PAGE, PENDING_TABLE_ALIGN, PENDING_TABLE_BYTES,
    PROPERTY_TABLE_BYTES, QUEUE_BYTES, TYPE_COLLECTIONS, TYPE_DEVICES, baser_value, cbaser_value,
    gicr_lpi, gits, pendbaser_value, propbaser_value,
};

type Driver = HostIts<MockFrame, MockMemory, MockPool>;

/// A redistributor's `RD_base`.
const GICR: usize = 0x080a_0000;
/// Polls of a wait in the tests.
const POLLS: u32 = 5;
/// CPUs (collections).
const CPUS: u64 = 4;
/// `GITS_TYPER`: Physical, 8-byte ITT entries, 16 DeviceID bits.
const TYPER: u64 = 1 | 7 << 4 | 15 << 13;
/// `GITS_TYPER.PTA`.
const PTA: u64 = 1 << 19;
/// `GITS_BASER<n>` as read: devices and collections, 8-byte entries, and a
/// vPE table (type 2).
const BASER_DEVICES: u64 = TYPE_DEVICES << 56 | 7 << 48;
const BASER_COLLECTIONS: u64 = TYPE_COLLECTIONS << 56 | 7 << 48;
const BASER_VPES: u64 = 2 << 56 | 7 << 48;
/// `GICR_TYPER`: physical LPIs, processor number 3.
const GICR_TYPER: u64 = 1 | 3 << 8;

/// A command, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    Mapd {
        device: u32,
        size: u64,
        itt: u64,
        valid: bool,
    },
    Mapc {
        icid: u16,
        rdbase: u64,
        valid: bool,
    },
    Mapti {
        device: u32,
        event: u32,
        intid: u32,
        icid: u16,
    },
    Sync {
        rdbase: u64,
    },
}

fn decode(command: [u64; 4]) -> Command {
    let rdbase = command[2] & 0x000f_ffff_ffff_0000;
    match command[0] & 0xff {
        0x08 => Command::Mapd {
            device: (command[0] >> 32) as u32,
            size: command[1] & 0x1f,
            itt: command[2] & 0x000f_ffff_ffff_ff00,
            valid: command[2] >> 63 != 0,
        },
        0x09 => Command::Mapc {
            icid: command[2] as u16,
            rdbase,
            valid: command[2] >> 63 != 0,
        },
        0x0a => Command::Mapti {
            device: (command[0] >> 32) as u32,
            event: command[1] as u32,
            intid: (command[1] >> 32) as u32,
            icid: command[2] as u16,
        },
        0x05 => Command::Sync { rdbase },
        op => panic!("unexpected command {op:#x}"),
    }
}

/// The commands in `log`, decoded, with the slot address each was written
/// at.
fn commands(log: &[Access]) -> Vec<(u64, Command)> {
    log.iter()
        .filter_map(|a| match *a {
            Command(pa, c) => Some((pa, decode(c))),
            _ => None,
        })
        .collect()
}

/// Checks that no memory the driver wrote is still dirty (written, not
/// cleaned) when it hands memory to the ITS (a table or queue register, an
/// enable, `GITS_CWRITER`), that a `DSB` separates the last command write
/// from the `GITS_CWRITER` write publishing it, and that every slot a
/// `GITS_CWRITER` write publishes was written before it.
fn check_published_clean(its: &MockIts) {
    let log = its.log();
    let mut dirty: Vec<(u64, u64)> = Vec::new();
    let mut command_since_dsb = false;
    let mut unpublished: Vec<u64> = Vec::new();
    let mut published = its.cwriter_at_clear();
    for (i, access) in log.iter().enumerate() {
        match *access {
            Zero(pa, len) | Fill(pa, len, _) => dirty.push((pa, len)),
            Command(pa, _) => {
                dirty.push((pa, COMMAND_BYTES));
                unpublished.push(pa - QUEUE);
                command_since_dsb = true;
            }
            // A zeroed table is cleaned over its size from its start: the
            // rest of its last page is not the ITS's.
            Clean(pa, len) => dirty.retain(|&(at, _)| !(pa..pa + len).contains(&at)),
            DsbIsh => command_since_dsb = false,
            Write64(..) | Write32(..) => {
                assert!(
                    dirty.is_empty(),
                    "access {i} ({access:?}) with {dirty:x?} not cleaned"
                );
                if let Write64(addr, offset) = *access
                    && addr == ITS + gits::CWRITER
                {
                    assert!(!command_since_dsb, "access {i}: CWRITER before a DSB");
                    while published != offset {
                        assert!(
                            unpublished.contains(&published),
                            "access {i}: slot {published:#x} published unwritten"
                        );
                        published = (published + COMMAND_BYTES) % QUEUE_BYTES;
                    }
                    unpublished.clear();
                }
            }
            _ => {}
        }
    }
}

/// Zeroing covers whole pages, cleaning the table's size: both forms of
/// one zeroed table count as clean when the clean covers the size.
fn zeroed(pa: u64, size: u64) -> [Access; 2] {
    [Zero(pa, size.next_multiple_of(PAGE)), Clean(pa, size)]
}

/// The mock ITS with `typer` and the usual `GITS_BASER<n>`, quiescent at
/// the second read of `GITS_CTLR`.
fn its_with(typer: u64) -> MockIts {
    let its = MockIts::new();
    its.set(ITS + gits::TYPER, typer);
    its.queue(ITS + gits::CTLR, &[0, u64::from(gits::CTLR_QUIESCENT)]);
    its.set(ITS + gits::BASER0, BASER_DEVICES);
    its.set(ITS + gits::BASER0 + 8, BASER_COLLECTIONS);
    its.set(ITS + gits::BASER0 + 16, BASER_VPES);
    its.set(GICR + gicr_lpi::TYPER, GICR_TYPER);
    its
}

fn init(its: &MockIts, lpis: u32) -> Result<Driver, ItsError> {
    HostIts::init(its.frame(ITS), its.memory(), lpis, CPUS, POLLS)
}

/// The first allocations of `init`: device table (128 pages for 16 bits
/// of 8 bytes), collection table, queue, property table.
const DEVICE_TABLE: u64 = RAM;
const COLLECTION_TABLE: u64 = RAM + 128 * PAGE;
const QUEUE: u64 = COLLECTION_TABLE + PAGE;
const PROPERTIES: u64 = QUEUE + PAGE;

#[test]
fn init_sets_up_tables_queue_and_properties_in_order() {
    let its = its_with(TYPER);
    let driver = init(&its, 16).unwrap();
    assert_eq!(driver.device_bits(), 16);
    let log = its.log();
    let mut expected = vec![
        Read64(ITS + gits::TYPER, TYPER),
        Write32(ITS + gits::CTLR, 0),
        Read32(ITS + gits::CTLR, 0),
        Read32(ITS + gits::CTLR, gits::CTLR_QUIESCENT),
        Read64(ITS + gits::BASER0, BASER_DEVICES),
        Alloc(DEVICE_TABLE, 128 * PAGE, PAGE),
    ];
    expected.extend(zeroed(DEVICE_TABLE, 128 * PAGE));
    expected.extend([
        Write64(
            ITS + gits::BASER0,
            baser_value(BASER_DEVICES, DEVICE_TABLE, 128),
        ),
        Read64(ITS + gits::BASER0 + 8, BASER_COLLECTIONS),
        Alloc(COLLECTION_TABLE, PAGE, PAGE),
    ]);
    expected.extend(zeroed(COLLECTION_TABLE, PAGE));
    expected.extend([
        Write64(
            ITS + gits::BASER0 + 8,
            baser_value(BASER_COLLECTIONS, COLLECTION_TABLE, 1),
        ),
        Read64(ITS + gits::BASER0 + 16, BASER_VPES),
    ]);
    expected.extend((3..8).map(|n| Read64(ITS + gits::BASER0 + 8 * n, 0)));
    expected.push(Alloc(QUEUE, QUEUE_BYTES, PAGE));
    expected.extend(zeroed(QUEUE, QUEUE_BYTES));
    expected.extend([
        Write64(ITS + gits::CBASER, cbaser_value(QUEUE)),
        Write64(ITS + gits::CWRITER, 0),
        Alloc(PROPERTIES, PROPERTY_TABLE_BYTES, PAGE),
        Fill(PROPERTIES, PROPERTY_TABLE_BYTES, 0),
        Fill(PROPERTIES, 16, LPI_PROPERTY),
        Clean(PROPERTIES, PROPERTY_TABLE_BYTES),
        Write32(ITS + gits::CTLR, gits::CTLR_ENABLED),
    ]);
    assert_eq!(log, expected);
    check_published_clean(&its);
}

#[test]
fn only_device_and_collection_tables_are_made_valid() {
    let its = its_with(TYPER);
    init(&its, 16).unwrap();
    let written: Vec<(usize, u64)> = its
        .log()
        .iter()
        .filter_map(|a| match *a {
            Write64(addr, v) if (ITS + gits::BASER0..ITS + gits::BASER0 + 64).contains(&addr) => {
                Some((addr, v))
            }
            _ => None,
        })
        .collect();
    assert_eq!(written.len(), 2, "{written:x?}");
    for (addr, value) in written {
        assert_ne!(value >> 63, 0, "Valid");
        let kind = value >> 56 & 7;
        assert_eq!(kind, if addr == ITS + gits::BASER0 { 1 } else { 4 });
    }
}

#[test]
fn init_sizes_tables_from_typer() {
    // 4 DeviceID bits: one page of device table; 12-byte ITT entries.
    let typer = 1 | 0xb << 4 | 3 << 13;
    let its = its_with(typer);
    let driver = init(&its, 64).unwrap();
    assert_eq!(driver.device_bits(), 4);
    assert!(its.log().contains(&Alloc(RAM, PAGE, PAGE)));
    // The ITT of 32 events: 32 * 12 bytes, in 256-byte steps.
    let target = driver.init_cpu(0, &its.frame(GICR), GICR as u64).unwrap();
    its.clear_log();
    driver.map_device(3, 32, 0, target).unwrap();
    assert!(matches!(its.log()[0], Alloc(_, 512, PAGE)));
    // DeviceIDs past the 4 bits are refused, with nothing done.
    its.clear_log();
    assert_eq!(driver.map_device(16, 1, 0, target), None);
    assert!(its.log().is_empty());
}

#[test]
fn init_refuses_an_its_without_physical_lpis() {
    let its = its_with(TYPER & !1);
    assert_eq!(init(&its, 16).err(), Some(ItsError::NotPhysical));
    assert_eq!(its.log(), [Read64(ITS + gits::TYPER, TYPER & !1)]);
}

#[test]
fn init_gives_up_on_an_its_that_stays_busy() {
    let its = MockIts::new();
    its.set(ITS + gits::TYPER, TYPER);
    assert_eq!(init(&its, 16).err(), Some(ItsError::Stalled));
    let reads = its
        .log()
        .iter()
        .filter(|a| matches!(a, Read32(addr, _) if *addr == ITS + gits::CTLR))
        .count();
    assert_eq!(reads, POLLS as usize + 1);
}

#[test]
fn init_without_memory_fails() {
    for allocs in 0..4 {
        let its = its_with(TYPER);
        its.set_allocs_left(allocs);
        assert_eq!(init(&its, 16).err(), Some(ItsError::NoMemory), "{allocs}");
        assert!(!its.log().contains(&Write32(ITS + gits::CTLR, 1)));
    }
}

fn init_cpu_log(typer: u64, target: u64) {
    let its = its_with(typer);
    let driver = init(&its, 16).unwrap();
    its.clear_log();
    assert_eq!(
        driver.init_cpu(2, &its.frame(GICR), GICR as u64),
        Ok(target)
    );
    let pending = (PROPERTIES + PROPERTY_TABLE_BYTES).next_multiple_of(PENDING_TABLE_ALIGN);
    let log = its.log();
    let mut expected = vec![
        Read64(GICR + gicr_lpi::TYPER, GICR_TYPER),
        Read32(GICR + gicr_lpi::CTLR, 0),
        Alloc(pending, PENDING_TABLE_BYTES, PENDING_TABLE_ALIGN),
    ];
    expected.extend(zeroed(pending, PENDING_TABLE_BYTES));
    expected.extend([
        Write64(GICR + gicr_lpi::PROPBASER, propbaser_value(PROPERTIES)),
        Write64(GICR + gicr_lpi::PENDBASER, pendbaser_value(pending)),
        DsbIsh,
        Read32(GICR + gicr_lpi::CTLR, 0),
        Write32(GICR + gicr_lpi::CTLR, gicr_lpi::CTLR_ENABLE_LPIS),
        DsbIsh,
    ]);
    assert_eq!(log[..expected.len()], expected);
    let rest = &log[expected.len()..];
    assert_eq!(
        commands(rest),
        [
            (
                QUEUE,
                Command::Mapc {
                    icid: 2,
                    rdbase: target,
                    valid: true
                }
            ),
            (QUEUE + 32, Command::Sync { rdbase: target }),
        ]
    );
    assert!(matches!(
        rest[4..],
        [
            DsbIsh,
            Write64(w, 64),
            Read64(r, 64)
        ] if w == ITS + gits::CWRITER && r == ITS + gits::CREADR
    ));
    check_published_clean(&its);
}

#[test]
fn init_cpu_names_the_redistributor_by_processor_number() {
    init_cpu_log(TYPER, 3 << 16);
}

#[test]
fn init_cpu_names_the_redistributor_by_address_with_pta() {
    init_cpu_log(TYPER | PTA, GICR as u64);
}

#[test]
fn init_cpu_refuses_a_redistributor_without_lpis_or_with_them_on() {
    let its = its_with(TYPER);
    let driver = init(&its, 16).unwrap();
    its.clear_log();
    its.set(GICR + gicr_lpi::TYPER, 3 << 8);
    let rd = its.frame(GICR);
    assert_eq!(
        driver.init_cpu(0, &rd, GICR as u64),
        Err(ItsError::RedistributorLpis)
    );
    assert_eq!(its.log(), [Read64(GICR + gicr_lpi::TYPER, 3 << 8)]);
    its.set(GICR + gicr_lpi::TYPER, GICR_TYPER);
    its.set(GICR + gicr_lpi::CTLR, 1);
    assert_eq!(
        driver.init_cpu(0, &rd, GICR as u64),
        Err(ItsError::RedistributorLpis)
    );
    assert!(!its.log().iter().any(|a| matches!(a, Write64(..))));
}

/// An ITS set up with `lpis` LPIs and CPU 0's collection, the log cleared.
fn ready(lpis: u32) -> (MockIts, Driver, u64) {
    let its = its_with(TYPER);
    let driver = init(&its, lpis).unwrap();
    let target = driver.init_cpu(0, &its.frame(GICR), GICR as u64).unwrap();
    its.clear_log();
    (its, driver, target)
}

#[test]
fn map_device_maps_each_event_then_syncs() {
    let (its, driver, target) = ready(64);
    assert_eq!(driver.map_device(0x10, 4, 1, target), Some(8192));
    let log = its.log();
    let Alloc(itt, 256, PAGE) = log[0] else {
        panic!("{:?}", log[0]);
    };
    assert_eq!(log[1..3], zeroed(itt, 256));
    let mut expected = vec![Command::Mapd {
        device: 0x10,
        size: 1,
        itt,
        valid: true,
    }];
    expected.extend((0..4).map(|e| Command::Mapti {
        device: 0x10,
        event: e,
        intid: 8192 + e,
        icid: 1,
    }));
    expected.push(Command::Sync { rdbase: target });
    let written = commands(&log);
    assert_eq!(written.iter().map(|c| c.1).collect::<Vec<_>>(), expected);
    // After MAPC and SYNC of `init_cpu`, slot 2 on.
    let slots: Vec<u64> = written.iter().map(|c| c.0).collect();
    assert_eq!(slots, (2..8).map(|s| QUEUE + 32 * s).collect::<Vec<_>>());
    assert_eq!(
        log[log.len() - 2..],
        [
            Write64(ITS + gits::CWRITER, 8 * 32),
            Read64(ITS + gits::CREADR, 8 * 32)
        ]
    );
    check_published_clean(&its);
    // The next device's events come after.
    assert_eq!(driver.map_device(0x11, 2, 0, target), Some(8196));
}

#[test]
fn unmap_gives_the_lpis_and_the_itt_back() {
    let (its, driver, target) = ready(16);
    let tables = its.live();
    assert_eq!(driver.map_device(1, 8, 0, target), Some(8192));
    assert_eq!(driver.map_device(2, 8, 0, target), Some(8200));
    assert_eq!(its.live(), tables + 2);
    its.clear_log();
    // Nothing is free: refused before any allocation or command.
    assert_eq!(driver.map_device(3, 4, 0, target), None);
    assert!(its.log().is_empty());
    driver.unmap_device(1, 8192, 8, target);
    let log = its.log();
    assert_eq!(
        commands(&log).iter().map(|c| c.1).collect::<Vec<_>>(),
        [
            Command::Mapd {
                device: 1,
                size: 0,
                itt: 0,
                valid: false
            },
            Command::Sync { rdbase: target }
        ]
    );
    assert!(matches!(log.last(), Some(Free(_, 256, PAGE))));
    assert_eq!(its.live(), tables + 1);
    check_published_clean(&its);
    // The run is reusable, in any split.
    assert_eq!(driver.map_device(3, 4, 0, target), Some(8192));
    assert_eq!(driver.map_device(4, 4, 0, target), Some(8196));
    assert_eq!(driver.map_device(5, 1, 0, target), None);
}

#[test]
fn map_of_more_events_than_free_is_refused() {
    let (its, driver, target) = ready(16);
    assert_eq!(driver.map_device(1, 32, 0, target), None);
    assert_eq!(driver.map_device(1, 4, 0, target), Some(8192));
    assert_eq!(driver.map_device(2, 16, 0, target), None);
    assert_eq!(driver.map_device(2, 8, 0, target), Some(8196));
    assert_eq!(commands(&its.log()).len(), 6 + 10);
}

#[test]
fn map_without_memory_gives_the_lpis_back() {
    let (its, driver, target) = ready(16);
    its.set_allocs_left(0);
    assert_eq!(driver.map_device(1, 16, 0, target), None);
    assert!(commands(&its.log()).is_empty());
    its.set_allocs_left(1);
    assert_eq!(driver.map_device(1, 16, 0, target), Some(8192));
}

#[test]
fn the_queue_wraps_in_batches_that_leave_a_slot_free() {
    // MAPD, 256 MAPTI, SYNC after the 2 commands of `init_cpu`: batches of
    // 127, 127 and 4.
    let (its, driver, target) = ready(512);
    assert_eq!(driver.map_device(7, 256, 0, target), Some(8192));
    let log = its.log();
    let mut batches = Vec::new();
    let mut in_batch = 0;
    for access in &log {
        match *access {
            Command(..) => in_batch += 1,
            Write64(addr, offset) if addr == ITS + gits::CWRITER => {
                batches.push((in_batch, offset));
                in_batch = 0;
            }
            _ => {}
        }
    }
    let slots = QUEUE_BYTES / COMMAND_BYTES;
    assert_eq!(
        batches,
        [
            (127, (2 + 127) % slots * 32),
            (127, (2 + 254) % slots * 32),
            (4, (2 + 258) % slots * 32)
        ]
    );
    // The slots go round the ring: the 126th command in its last slot, the
    // next in its first.
    let written = commands(&log);
    assert_eq!(written[125].0, QUEUE + 127 * 32);
    assert_eq!(written[126].0, QUEUE);
    assert_eq!(written[257].0, QUEUE + 3 * 32);
    check_published_clean(&its);
}

#[test]
fn a_queue_that_does_not_advance_is_an_error() {
    let its = its_with(TYPER);
    let driver = init(&its, 16).unwrap();
    its.set_follows(false);
    its.clear_log();
    assert_eq!(
        driver.init_cpu(0, &its.frame(GICR), GICR as u64),
        Err(ItsError::Stalled)
    );
    let reads = its
        .log()
        .iter()
        .filter(|a| matches!(a, Read64(addr, 0) if *addr == ITS + gits::CREADR))
        .count();
    assert_eq!(reads, POLLS as usize + 1);
}

#[test]
fn a_stalled_queue_fails_the_map_and_gives_everything_back() {
    let (its, driver, target) = ready(16);
    let tables = its.live();
    its.set_follows(false);
    its.queue(ITS + gits::CREADR, &[gits::CREADR_STALLED]);
    its.clear_log();
    assert_eq!(driver.map_device(1, 16, 0, target), None);
    let creadr_reads = its
        .log()
        .iter()
        .filter(|a| matches!(a, Read64(addr, _) if *addr == ITS + gits::CREADR))
        .count();
    assert_eq!(creadr_reads, 1, "Stalled ends the wait at once");
    assert_eq!(its.live(), tables);
    // The ITS moves on: the whole pool is free again.
    its.set_follows(true);
    assert_eq!(driver.map_device(1, 16, 0, target), Some(8192));
}
