//! The `its` scenario: a GICv3 ITS translates events into LPIs, checked
//! through the commands a driver uses, on every vCPU (1 or more).
//!
//! The boot vCPU checks the ITS registers, takes [`gic_its::REGION_SIZE`] at
//! the top of the largest free RAM range (64 KiB aligned) for the driver's
//! tables (`gic_its`), sets the ITS up and starts the secondaries; every vCPU
//! wakes its redistributor (`gic::init_cpu`) and enables LPIs on it
//! (`gic_its::enable_lpis`). The secondaries then only take interrupts: they
//! poll `ICC_IAR1_EL1` with `PSTATE.I` set, count each INTID per vCPU and
//! finish it with `ICC_EOIR1_EL1`, and mask or unmask themselves (priority
//! mask 0 / 0xff) when the boot vCPU asks. The boot vCPU issues every
//! command, polls its own `ICC_IAR1_EL1` the same way, and after each step
//! compares the counts of all vCPUs with what the step must deliver: each
//! expected LPI exactly once, on the vCPU its collection names, and nothing
//! else (it waits [`SETTLE_MS`] more for an extra or a late one).
//! Interrupts are never taken as exceptions (`PSTATE.I` stays set); "masked"
//! below means a priority mask of 0, which holds an LPI pending.
//!
//! Devices: DeviceIDs 0, 1 and the highest the device table holds, each with
//! an ITT of 32 events, and DeviceID 2 with 2^14 events (for `MAPI`).
//! Collections: ICID `c` on vCPU `c`, and a spare ICID on vCPU 0. Events
//! 0..4 of the first three devices go to LPIs `8192 + 8 * device + event` in
//! collection `event % vCPUs`; event 4 to collection 0. The checks, each
//! printing one `test-guest: its: ...` line:
//!
//! 1. registers: `GITS_TYPER` (Physical, ITT entry size, Devbits, ID_bits of
//!    at least 14 for `MAPI`), `GITS_PIDR2.ArchRev` 3 or 4,
//!    `GITS_CTLR.Quiescent` while disabled, the `GITS_BASER` types;
//! 2. `MAPD`, `MAPC`, `MAPTI`, then `INT` of each event: delivered once, on
//!    its collection's vCPU;
//! 3. a CPU write of EventID 4 to `GITS_TRANSLATER`: the LPI shows which
//!    DeviceID the write carries, which must be 0;
//! 4. `MAPI` of EventID 8292 of DeviceID 2: `INT` delivers LPI 8292;
//! 5. `MOVI` of an event to the next vCPU's collection (the spare one on 1
//!    vCPU): the next `INT` arrives there;
//! 6. `MOVALL`: an LPI pending (masked) at vCPU 1's redistributor, its
//!    collection remapped (`MAPC`) to vCPU 2 (vCPU 0 with 2 vCPUs, the same
//!    one with 1), `MOVALL` + `SYNC`: taken once, on the new vCPU; the
//!    collection mapped back delivers on vCPU 1 again;
//! 7. `DISCARD`: an `INT` after it delivers nothing, and a pending (masked)
//!    LPI discarded is never taken;
//! 8. `CLEAR` of a pending (masked) LPI: nothing arrives after unmasking,
//!    the next `INT` does;
//! 9. `INV`: an LPI disabled in the property table and `INV`ed stays pending
//!    on `INT`; enabled and `INV`ed, it arrives; `INVALL` the same for one
//!    LPI of every collection;
//! 10. priorities from the property table: two LPIs pending on a masked vCPU
//!     are acknowledged the more urgent first, in both orders of `INT`;
//! 11. command errors: `MAPTI` with a DeviceID past the device table, an
//!     EventID past the ITT, a pINTID below 8192, and a `MAPC` to an RDbase
//!     of no CPU are dropped: `GITS_CREADR` moves past them without
//!     `Stalled`, they map nothing, and later commands work.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::boot::MAX_CPUS;
use crate::gic_its::{
    self, Command, GITS_CTLR_QUIESCENT, Its, LPI_BASE, Layout, RdBase, TableType,
};
use crate::memory_map::MemRange;
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{self, Barrier, Deadline};
use crate::{gic, gic_regs};

/// LPIs counted: 8192 + 0..LPIS.
const LPIS: usize = 128;
/// How long an expected LPI may take to arrive.
const ARRIVE_MS: u64 = 2000;
/// How long the vCPUs keep taking interrupts after a step, to catch an
/// extra or late one.
const SETTLE_MS: u64 = 30;
/// Bits of EventID of the small ITTs.
const EVENT_BITS: u32 = 5;
/// Events 0..EVENTS of each device go to collection `event % vCPUs`.
const EVENTS: u32 = 4;
/// The event every device maps in collection 0 (`GITS_TRANSLATER`).
const TRANSLATED_EVENT: u32 = 4;
/// The device with the large ITT (`MAPI`).
const MAPI_DEVICE: u32 = 2;
/// The EventID (and LPI) `MAPI` maps.
const MAPI_EVENT: u32 = LPI_BASE + 100;
/// A collection on vCPU 0 besides ICID 0.
const SPARE_ICID: u16 = MAX_CPUS as u16;
/// A collection the bad `MAPC` names.
const BAD_ICID: u16 = MAX_CPUS as u16 + 1;
/// The default LPI priority.
const DEFAULT_PRIORITY: u8 = 0xa0;

/// Deliveries per vCPU and LPI.
static COUNTS: [[AtomicU32; LPIS]; MAX_CPUS] =
    [const { [const { AtomicU32::new(0) }; LPIS] }; MAX_CPUS];
/// What the boot vCPU expects in [`COUNTS`].
static EXPECTED: [[AtomicU32; LPIS]; MAX_CPUS] =
    [const { [const { AtomicU32::new(0) }; LPIS] }; MAX_CPUS];
/// INTIDs taken outside the counted LPIs, per vCPU, and the last one.
static STRAY: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
static LAST_STRAY: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
/// Priority mask requested of each secondary (true: masked) and applied.
static MASK_REQUEST: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
static MASK_APPLIED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
/// The driver's region, for the secondaries.
static LAYOUT_START: AtomicU64 = AtomicU64::new(0);
/// A secondary could not enable LPIs.
static SECONDARY_FAILED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
/// Secondaries with LPIs enabled (or failed).
static READY: Barrier = Barrier::new();
/// The boot vCPU is done: secondaries return (and power off).
static STOP: AtomicBool = AtomicBool::new(false);

fn fail(check: &'static str, value: u64) -> Failure {
    Failure::Its { check, value }
}

/// Acknowledges one interrupt on this vCPU, if one is pending, counts and
/// finishes it; returns its INTID.
fn poll(cpu: usize) -> Option<u32> {
    let intid = gic::acknowledge();
    // 1020..=1023 are special (nothing pending); LPIs lie above them.
    if (gic_regs::SPURIOUS_FIRST..LPI_BASE).contains(&intid) {
        return None;
    }
    match intid.checked_sub(LPI_BASE).filter(|&i| (i as usize) < LPIS) {
        Some(index) => {
            COUNTS[cpu][index as usize].fetch_add(1, Ordering::AcqRel);
        }
        None => {
            LAST_STRAY[cpu].store(intid, Ordering::Relaxed);
            STRAY[cpu].fetch_add(1, Ordering::AcqRel);
        }
    }
    gic::end_of_interrupt(intid);
    Some(intid)
}

/// A secondary's part: LPIs on, then take interrupts until [`STOP`].
pub fn secondary(cpu: usize) {
    let layout = Layout {
        start: LAYOUT_START.load(Ordering::Acquire),
    };
    let outcome = enable_cpu(layout, cpu);
    if let Err(failure) = outcome {
        println!("test-guest: its: vcpu{cpu}: {failure}");
        SECONDARY_FAILED[cpu].store(true, Ordering::Release);
    }
    READY.arrive();
    while !STOP.load(Ordering::Acquire) {
        let wanted = MASK_REQUEST[cpu].load(Ordering::Acquire);
        if wanted != MASK_APPLIED[cpu].load(Ordering::Relaxed) {
            gic::set_priority_mask(if wanted { 0 } else { 0xff });
            MASK_APPLIED[cpu].store(wanted, Ordering::Release);
        }
        poll(cpu);
    }
}

/// Wakes this vCPU's redistributor and CPU interface and enables LPIs.
fn enable_cpu(layout: Layout, cpu: usize) -> Result<(), Failure> {
    gic::init_cpu(&[]).map_err(|error| Failure::Gic { cpu, error })?;
    let rd = gic::redistributor(cpu).ok_or(Failure::NoGic)?;
    gic_its::enable_lpis(layout, rd, cpu).map_err(Failure::ItsSetup)
}

/// The boot vCPU's view of the run.
struct Run {
    its: Its,
    cpus: usize,
    rd: [RdBase; MAX_CPUS],
    /// DeviceIDs 0, 1 and the highest.
    devices: [u32; 3],
}

impl Run {
    /// LPI of `event` of device index `device` (into `devices`).
    fn lpi(device: usize, event: u32) -> u32 {
        LPI_BASE + 8 * device as u32 + event
    }

    /// The vCPU (and ICID) of the collection `event` is first mapped to.
    fn cpu_of(&self, event: u32) -> usize {
        if event == TRANSLATED_EVENT {
            0
        } else {
            event as usize % self.cpus
        }
    }

    fn submit(&mut self, commands: &[Command]) -> Result<(), Failure> {
        self.its.submit(commands).map_err(Failure::ItsSetup)
    }

    /// `commands`, then a `SYNC` of every redistributor.
    fn submit_synced(&mut self, commands: &[Command]) -> Result<(), Failure> {
        self.submit(commands)?;
        for cpu in 0..self.cpus {
            let rd = self.rd[cpu];
            self.submit(&[Command::sync(rd)])?;
        }
        Ok(())
    }

    /// Expects `intid` once more on `cpu`.
    fn expect(&self, cpu: usize, intid: u32) {
        EXPECTED[cpu][(intid - LPI_BASE) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the counts are what is expected; the first difference.
    fn difference(&self) -> Option<(usize, u32, u32, u32)> {
        for cpu in 0..self.cpus {
            if STRAY[cpu].load(Ordering::Acquire) != 0 {
                return Some((cpu, LAST_STRAY[cpu].load(Ordering::Relaxed), 0, 1));
            }
            for index in 0..LPIS {
                let expected = EXPECTED[cpu][index].load(Ordering::Relaxed);
                let found = COUNTS[cpu][index].load(Ordering::Acquire);
                if expected != found {
                    return Some((cpu, LPI_BASE + index as u32, expected, found));
                }
            }
        }
        None
    }

    /// Waits until the expected deliveries arrived, then [`SETTLE_MS`]
    /// more, and checks the counts match exactly.
    fn settle(&self, step: &'static str) -> Result<(), Failure> {
        let deadline = Deadline::after_millis(ARRIVE_MS);
        while self.difference().is_some() && !deadline.passed() {
            poll(0);
        }
        self.quiet(step, SETTLE_MS)
    }

    /// Takes interrupts for `millis`, then checks the counts match.
    fn quiet(&self, step: &'static str, millis: u64) -> Result<(), Failure> {
        let deadline = Deadline::after_millis(millis);
        while !deadline.passed() {
            poll(0);
        }
        match self.difference() {
            None => Ok(()),
            Some((cpu, intid, expected, found)) => {
                println!(
                    "test-guest: its: {step}: vcpu{cpu} took INTID {intid} {found} times, \
                     expected {expected}"
                );
                Err(fail(step, (cpu as u64) << 32 | u64::from(intid)))
            }
        }
    }

    /// Masks (priority mask 0) or unmasks vCPU `cpu`.
    fn mask(&self, cpu: usize, masked: bool) -> Result<(), Failure> {
        if cpu == 0 {
            gic::set_priority_mask(if masked { 0 } else { 0xff });
            return Ok(());
        }
        MASK_REQUEST[cpu].store(masked, Ordering::Release);
        let deadline = Deadline::after_millis(ARRIVE_MS);
        while MASK_APPLIED[cpu].load(Ordering::Acquire) != masked {
            if deadline.passed() {
                return Err(fail("a vCPU did not apply its priority mask", cpu as u64));
            }
            core::hint::spin_loop();
        }
        Ok(())
    }

    /// `INT` of `event` of device index `device`, expected on `cpu`.
    fn int_expect(
        &mut self,
        device: usize,
        event: u32,
        cpu: usize,
        step: &'static str,
    ) -> Result<(), Failure> {
        self.expect(cpu, Run::lpi(device, event));
        self.submit_synced(&[Command::int(self.devices[device], event)])?;
        self.settle(step)
    }
}

fn region(platform: &Platform) -> Result<MemRange, Failure> {
    let free = platform.largest_free_range().ok_or(Failure::NoFreeRam)?;
    let start = free.end.saturating_sub(gic_its::REGION_SIZE) & !0xffff;
    if start < free.start {
        return Err(Failure::NoFreeRam);
    }
    Ok(MemRange {
        start,
        end: start + gic_its::REGION_SIZE,
    })
}

/// Check 1 before the ITS is touched.
fn registers(base: u64) -> Result<(), Failure> {
    let typer = Its::typer_at(base);
    if !typer.physical() {
        return Err(fail("GITS_TYPER.Physical is 1", typer.0));
    }
    if typer.event_bits() < gic_its::LPI_ID_BITS {
        return Err(fail("GITS_TYPER.ID_bits gives 14 bits or more", typer.0));
    }
    if typer.itt_entry_size() > 16 || typer.device_bits() < 2 {
        return Err(fail(
            "GITS_TYPER: ITT entry of 16 bytes at most, 2+ DeviceID bits",
            typer.0,
        ));
    }
    println!(
        "test-guest: its: GITS_TYPER {:#x}: Physical, ITT entry {} bytes, {} DeviceID bits, {} \
         EventID bits, PTA {}, HCC {}",
        typer.0,
        typer.itt_entry_size(),
        typer.device_bits(),
        typer.event_bits(),
        u8::from(typer.pta()),
        typer.hcc()
    );
    let rev = Its::arch_rev_at(base);
    if rev != 3 && rev != 4 {
        return Err(fail("GITS_PIDR2.ArchRev is 3 or 4", rev.into()));
    }
    let ctlr = Its::ctlr_at(base);
    if ctlr & GITS_CTLR_QUIESCENT == 0 || ctlr & 1 != 0 {
        return Err(fail(
            "GITS_CTLR: disabled and Quiescent at boot",
            ctlr.into(),
        ));
    }
    println!(
        "test-guest: its: GITS_PIDR2.ArchRev {rev}, GITS_CTLR {ctlr:#x}: disabled and Quiescent"
    );
    Ok(())
}

/// The `its` scenario (see the module doc).
pub fn run(platform: &Platform) -> Result<(), Failure> {
    let frames = platform.gic.ok_or(Failure::NoGic)?;
    if frames.cpu_interface.is_some() {
        return Err(Failure::NoGic);
    }
    let base = platform
        .its
        .ok_or(Failure::ItsSetup(gic_its::ItsError::NoIts))?;
    registers(base)?;
    let region = region(platform)?;
    let layout = Layout {
        start: region.start,
    };
    let cpus = platform.cpus().len();
    if layout.used(cpus) > gic_its::REGION_SIZE {
        return Err(Failure::NoFreeRam);
    }
    gic::init_distributor(frames).map_err(|error| Failure::Gic { cpu: 0, error })?;
    gic_its::check_distributor(frames.distributor).map_err(Failure::ItsSetup)?;
    gic_its::init_property_table(layout, gic_its::property(DEFAULT_PRIORITY, true));
    let its = Its::init(base, layout).map_err(Failure::ItsSetup)?;
    for (n, table) in its.tables.iter().enumerate() {
        if table.kind == TableType::None {
            continue;
        }
        println!(
            "test-guest: its: GITS_BASER{n}: {} table, {}-byte entries, {} bytes given (reads {:#x})",
            table.kind.name(),
            table.entry_size,
            table.size,
            table.value
        );
    }
    println!(
        "test-guest: its: tables in {region}: {} DeviceIDs, command queue of {} commands, ITS \
         enabled",
        its.device_ids,
        gic_its::QUEUE_SIZE / 32
    );

    LAYOUT_START.store(layout.start, Ordering::Release);
    crate::scenarios::run_its_secondaries();
    smp::start_secondaries(platform)?;
    enable_cpu(layout, 0)?;
    let arrived = READY.wait(cpus - 1, Some(Deadline::step()));
    if arrived < cpus - 1 {
        return Err(Failure::CpuTimedOut {
            arrived: arrived + 1,
            expected: cpus,
        });
    }
    if let Some(cpu) = (1..cpus).find(|&c| SECONDARY_FAILED[c].load(Ordering::Acquire)) {
        return Err(fail("a vCPU could not enable LPIs", cpu as u64));
    }
    let mut rd = [RdBase(0); MAX_CPUS];
    for (cpu, slot) in rd.iter_mut().enumerate().take(cpus) {
        *slot = its.rdbase(gic::redistributor(cpu).ok_or(Failure::NoGic)?);
    }
    println!(
        "test-guest: its: LPIs enabled on {cpus} redistributors (GICR_PROPBASER {} bits, RDbase \
         {})",
        gic_its::LPI_ID_BITS,
        if its.typer.pta() {
            "as physical addresses"
        } else {
            "as processor numbers"
        }
    );
    let high = (its.device_ids - 1).min(u64::from(u32::MAX)) as u32;
    let mut run = Run {
        its,
        cpus,
        rd,
        devices: [0, 1, high],
    };
    let outcome = checks(&mut run);
    STOP.store(true, Ordering::Release);
    outcome?;
    smp::wait_secondaries_off(platform)
}

fn checks(run: &mut Run) -> Result<(), Failure> {
    map_and_int(run)?;
    translater(run)?;
    mapi(run)?;
    movi(run)?;
    movall(run)?;
    discard(run)?;
    clear(run)?;
    inv(run)?;
    invall(run)?;
    priorities(run)?;
    command_errors(run)
}

/// Check 2.
fn map_and_int(run: &mut Run) -> Result<(), Failure> {
    let layout = run.its.layout;
    let devices = run.devices;
    for (index, &device) in devices.iter().enumerate() {
        let itt = layout.itt(index as u64);
        run.submit(&[Command::mapd(device, Some((itt, EVENT_BITS)))])?;
    }
    run.submit(&[Command::mapd(
        MAPI_DEVICE,
        Some((layout.large_itt(), gic_its::LPI_ID_BITS)),
    )])?;
    for cpu in 0..run.cpus {
        let rd = run.rd[cpu];
        run.submit(&[Command::mapc(cpu as u16, Some(rd))])?;
    }
    let rd0 = run.rd[0];
    run.submit(&[Command::mapc(SPARE_ICID, Some(rd0))])?;
    for (index, &device) in devices.iter().enumerate() {
        for event in 0..=TRANSLATED_EVENT {
            let icid = run.cpu_of(event) as u16;
            run.submit(&[Command::mapti(device, event, Run::lpi(index, event), icid)])?;
        }
    }
    run.submit_synced(&[])?;
    run.quiet("mapping delivers nothing", SETTLE_MS)?;
    for index in 0..run.devices.len() {
        for event in 0..EVENTS {
            let cpu = run.cpu_of(event);
            run.int_expect(
                index,
                event,
                cpu,
                "INT delivers once on the collection's vCPU",
            )?;
        }
    }
    println!(
        "test-guest: its: INT: {} events of DeviceIDs 0, 1 and {} each delivered once, on the \
         vCPU of its collection",
        run.devices.len() as u32 * EVENTS,
        run.devices[2]
    );
    Ok(())
}

/// Check 3.
fn translater(run: &mut Run) -> Result<(), Failure> {
    let before: [u32; 3] = core::array::from_fn(|index| {
        COUNTS[0][(Run::lpi(index, TRANSLATED_EVENT) - LPI_BASE) as usize].load(Ordering::Acquire)
    });
    run.its.translate(TRANSLATED_EVENT);
    let deadline = Deadline::after_millis(ARRIVE_MS);
    let mut arrived = None;
    while arrived.is_none() && !deadline.passed() {
        poll(0);
        arrived = (0..3).find(|&index| {
            COUNTS[0][(Run::lpi(index, TRANSLATED_EVENT) - LPI_BASE) as usize]
                .load(Ordering::Acquire)
                != before[index]
        });
    }
    let Some(index) = arrived else {
        return Err(fail(
            "a CPU write to GITS_TRANSLATER delivers an LPI",
            TRANSLATED_EVENT.into(),
        ));
    };
    run.expect(0, Run::lpi(index, TRANSLATED_EVENT));
    run.settle("GITS_TRANSLATER delivers once")?;
    let device = run.devices[index];
    println!(
        "test-guest: its: GITS_TRANSLATER: a CPU write of EventID {TRANSLATED_EVENT} delivered \
         LPI {}: the write carries DeviceID {device}",
        Run::lpi(index, TRANSLATED_EVENT)
    );
    if device != 0 {
        return Err(fail(
            "a CPU write to GITS_TRANSLATER carries DeviceID 0",
            device.into(),
        ));
    }
    Ok(())
}

/// Check 4.
fn mapi(run: &mut Run) -> Result<(), Failure> {
    run.submit(&[Command::mapi(MAPI_DEVICE, MAPI_EVENT, 0)])?;
    run.expect(0, MAPI_EVENT);
    run.submit_synced(&[Command::int(MAPI_DEVICE, MAPI_EVENT)])?;
    run.settle("MAPI: INT delivers LPI = EventID")?;
    println!(
        "test-guest: its: MAPI: EventID {MAPI_EVENT} of DeviceID {MAPI_DEVICE} delivered as LPI \
         {MAPI_EVENT}"
    );
    Ok(())
}

/// Check 5.
fn movi(run: &mut Run) -> Result<(), Failure> {
    let (from, event) = (run.cpu_of(1), 1);
    let (icid, to) = if run.cpus > 1 {
        let to = (from + 1) % run.cpus;
        (to as u16, to)
    } else {
        (SPARE_ICID, 0)
    };
    let device = run.devices[0];
    run.submit_synced(&[Command::movi(device, event, icid)])?;
    run.int_expect(0, event, to, "MOVI: the next INT arrives on the new vCPU")?;
    println!(
        "test-guest: its: MOVI: event {event} of DeviceID {device} moved from vcpu{from} to \
         collection {icid}: INT delivered on vcpu{to}"
    );
    Ok(())
}

/// Check 6.
fn movall(run: &mut Run) -> Result<(), Failure> {
    let (src, dst) = if run.cpus > 1 {
        (1, 2 % run.cpus)
    } else {
        (0, 0)
    };
    let event = 1;
    let device = run.devices[1];
    let lpi = Run::lpi(1, event);
    run.mask(src, true)?;
    run.submit_synced(&[Command::int(device, event)])?;
    run.quiet("MOVALL: a masked vCPU takes nothing", SETTLE_MS)?;
    let (rd_src, rd_dst) = (run.rd[src], run.rd[dst]);
    run.submit(&[
        Command::mapc(src as u16, Some(rd_dst)),
        Command::movall(rd_src, rd_dst),
        Command::sync(rd_dst),
    ])?;
    run.expect(dst, lpi);
    if dst != src {
        run.settle("MOVALL: the pending LPI arrives on the new redistributor")?;
    }
    run.mask(src, false)?;
    run.settle("MOVALL: the pending LPI arrives once, on the new redistributor")?;
    run.submit_synced(&[Command::mapc(src as u16, Some(rd_src))])?;
    run.int_expect(
        1,
        event,
        src,
        "MOVALL: the collection mapped back delivers there",
    )?;
    println!(
        "test-guest: its: MOVALL: LPI {lpi} pending at vcpu{src}'s redistributor moved to \
         vcpu{dst}'s and taken there once"
    );
    Ok(())
}

/// Check 7.
fn discard(run: &mut Run) -> Result<(), Failure> {
    let event = 3;
    let cpu = run.cpu_of(event);
    run.int_expect(0, event, cpu, "DISCARD: INT before it delivers")?;
    let (d0, d1) = (run.devices[0], run.devices[1]);
    run.submit_synced(&[Command::discard(d0, event), Command::int(d0, event)])?;
    run.quiet(
        "DISCARD: INT of a discarded event delivers nothing",
        SETTLE_MS,
    )?;
    run.mask(cpu, true)?;
    run.submit_synced(&[Command::int(d1, event)])?;
    run.quiet("DISCARD: masked", SETTLE_MS)?;
    run.submit_synced(&[Command::discard(d1, event)])?;
    run.mask(cpu, false)?;
    run.quiet("DISCARD removes the pending LPI", SETTLE_MS)?;
    println!(
        "test-guest: its: DISCARD: INT of a discarded event delivers nothing, and a pending LPI \
         discarded on masked vcpu{cpu} never arrives"
    );
    Ok(())
}

/// Check 8.
fn clear(run: &mut Run) -> Result<(), Failure> {
    let device = run.devices[2];
    run.mask(0, true)?;
    run.submit_synced(&[Command::int(device, 0)])?;
    run.quiet("CLEAR: masked", SETTLE_MS)?;
    run.submit_synced(&[Command::clear(device, 0)])?;
    run.mask(0, false)?;
    run.quiet("CLEAR removes the pending state", SETTLE_MS)?;
    run.int_expect(2, 0, 0, "CLEAR: the next INT delivers")?;
    println!(
        "test-guest: its: CLEAR: LPI {} pending on masked vcpu0, cleared, never arrived; the next \
         INT did",
        Run::lpi(2, 0)
    );
    Ok(())
}

/// Check 9, `INV`.
fn inv(run: &mut Run) -> Result<(), Failure> {
    let layout = run.its.layout;
    let device = run.devices[0];
    let lpi = Run::lpi(0, 0);
    gic_its::set_property(
        layout,
        lpi,
        gic_its::property(DEFAULT_PRIORITY, false),
        true,
    );
    run.submit_synced(&[Command::inv(device, 0), Command::int(device, 0)])?;
    run.quiet("INV: a disabled LPI is not delivered", SETTLE_MS)?;
    gic_its::set_property(layout, lpi, gic_its::property(DEFAULT_PRIORITY, true), true);
    run.expect(0, lpi);
    run.submit_synced(&[Command::inv(device, 0)])?;
    run.settle("INV: the LPI enabled again arrives")?;
    println!(
        "test-guest: its: INV: LPI {lpi} disabled in the property table held pending on INT, \
         enabled again and delivered once"
    );
    Ok(())
}

/// Check 9, `INVALL`.
fn invall(run: &mut Run) -> Result<(), Failure> {
    let layout = run.its.layout;
    let device = run.devices[2];
    let collections = run.cpus.min(EVENTS as usize);
    for event in 0..collections as u32 {
        let lpi = Run::lpi(2, event);
        gic_its::set_property(
            layout,
            lpi,
            gic_its::property(DEFAULT_PRIORITY, false),
            true,
        );
    }
    for icid in 0..collections as u16 {
        run.submit(&[Command::invall(icid)])?;
    }
    for event in 0..collections as u32 {
        run.submit(&[Command::int(device, event)])?;
    }
    run.submit_synced(&[])?;
    run.quiet("INVALL: disabled LPIs are not delivered", SETTLE_MS)?;
    for event in 0..collections as u32 {
        let lpi = Run::lpi(2, event);
        gic_its::set_property(layout, lpi, gic_its::property(DEFAULT_PRIORITY, true), true);
        run.expect(run.cpu_of(event), lpi);
    }
    for icid in 0..collections as u16 {
        run.submit(&[Command::invall(icid)])?;
    }
    run.submit_synced(&[])?;
    run.settle("INVALL: the LPIs enabled again arrive")?;
    println!(
        "test-guest: its: INVALL: one LPI in each of {collections} collections disabled, held \
         pending, enabled again and delivered once on its vCPU"
    );
    Ok(())
}

/// Check 10: takes the next two interrupts on vCPU 0 (unmasked).
fn take_two() -> [u32; 2] {
    let mut taken = [0; 2];
    let mut count = 0;
    let deadline = Deadline::after_millis(ARRIVE_MS);
    while count < 2 && !deadline.passed() {
        if let Some(intid) = poll(0) {
            taken[count] = intid;
            count += 1;
        }
    }
    taken
}

/// Check 10.
fn priorities(run: &mut Run) -> Result<(), Failure> {
    let layout = run.its.layout;
    let (a, b) = (
        (run.devices[0], Run::lpi(0, TRANSLATED_EVENT)),
        (run.devices[1], Run::lpi(1, TRANSLATED_EVENT)),
    );
    for (first_priority, second_priority) in [(0xa0u8, 0x40u8), (0x20, 0x60)] {
        gic_its::set_property(layout, a.1, gic_its::property(first_priority, true), true);
        gic_its::set_property(layout, b.1, gic_its::property(second_priority, true), true);
        run.submit_synced(&[Command::invall(0)])?;
        run.mask(0, true)?;
        // `a` first both times: once the less urgent, once the more urgent.
        run.submit_synced(&[
            Command::int(a.0, TRANSLATED_EVENT),
            Command::int(b.0, TRANSLATED_EVENT),
        ])?;
        run.expect(0, a.1);
        run.expect(0, b.1);
        run.mask(0, false)?;
        let taken = take_two();
        let urgent = if first_priority < second_priority {
            a.1
        } else {
            b.1
        };
        let other = if urgent == a.1 { b.1 } else { a.1 };
        if taken != [urgent, other] {
            println!(
                "test-guest: its: priorities: took {taken:?}, expected {urgent} (more urgent) \
                 then {other}"
            );
            return Err(fail(
                "the more urgent LPI is acknowledged first",
                taken[0].into(),
            ));
        }
        run.settle("priorities: each LPI once")?;
    }
    for lpi in [a.1, b.1] {
        gic_its::set_property(layout, lpi, gic_its::property(DEFAULT_PRIORITY, true), true);
    }
    run.submit_synced(&[Command::invall(0)])?;
    println!(
        "test-guest: its: priorities: of LPIs {} and {} pending together, the more urgent by the \
         property table was acknowledged first, in both orders",
        a.1, b.1
    );
    Ok(())
}

/// Check 11.
fn command_errors(run: &mut Run) -> Result<(), Failure> {
    let device = run.devices[0];
    let past_table = run.its.device_ids;
    let bad_rd = if run.its.typer.pta() {
        let last = gic::redistributor(run.cpus - 1).ok_or(Failure::NoGic)?;
        // The frame after the last CPU's (RD_base and SGI_base: 128 KiB).
        RdBase((last + 0x2_0000) >> 16)
    } else {
        let highest = (0..run.cpus)
            .filter_map(gic::redistributor)
            .map(gic_its::processor_number)
            .max()
            .unwrap_or(0);
        RdBase(highest + 1)
    };
    let mut bad: [(&str, Command); 4] = [
        (
            "an EventID past the ITT",
            Command::mapti(device, 1 << EVENT_BITS, LPI_BASE + 120, 0),
        ),
        (
            "a pINTID below 8192",
            Command::mapti(device, 6, LPI_BASE - 1, 0),
        ),
        ("an RDbase of no CPU", Command::mapc(BAD_ICID, Some(bad_rd))),
        (
            "a DeviceID past the device table",
            Command::mapti(past_table as u32, 0, LPI_BASE + 121, 0),
        ),
    ];
    let count = if past_table >= 1 << 32 { 3 } else { 4 };
    let start = run.its.creadr();
    for (what, command) in bad.iter_mut().take(count) {
        let rd0 = run.rd[0];
        if let Err(error) = run.its.submit(&[*command, Command::sync(rd0)]) {
            println!("test-guest: its: command errors: {what}: {error}");
            return Err(fail(
                "a command with a bad argument is dropped",
                command.0[0],
            ));
        }
    }
    let end = run.its.creadr();
    // The dropped commands mapped nothing: INT of the events delivers nothing,
    // and a MAPTI into the collection the bad MAPC named delivers nothing.
    run.submit_synced(&[
        Command::int(device, 6),
        Command::mapti(device, 7, LPI_BASE + 122, BAD_ICID),
        Command::int(device, 7),
    ])?;
    run.quiet(
        "command errors: the dropped commands mapped nothing",
        SETTLE_MS,
    )?;
    run.int_expect(0, 0, 0, "command errors: later commands work")?;
    println!(
        "test-guest: its: command errors: {count} MAPTI/MAPC with bad arguments dropped \
         (GITS_CREADR {start:#x} -> {end:#x}, not stalled), nothing mapped, later commands work"
    );
    Ok(())
}
