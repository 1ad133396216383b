//! The fuzzer's `its` family: random ITS commands, `GITS_*` register
//! accesses and `GITS_TRANSLATER` writes against a model of the mappings,
//! and LPIs left pending behind a closed priority mask while they are moved,
//! cleared, discarded or re-enabled.
//!
//! Set-up (boot vCPU, before the others start): the `gic_its` driver's
//! tables in the largest free RAM range, every redistributor's LPIs on, the
//! ITS enabled. Only the boot vCPU (vCPU 0) writes the command queue
//! ([`ItsFuzz`]); the other vCPUs add noise that cannot change a mapping
//! ([`noise`]): reads of any `GITS_*` offset of both frames, writes to the
//! read-only and reserved offsets (never `CTLR`, `CBASER`, `CWRITER`,
//! `BASER<n>`), and `GITS_TRANSLATER` writes of EventIDs beyond any ITT the
//! family gives DeviceID 0.
//!
//! The model ([`Model`]) mirrors the hypervisor's documented rules
//! (`hypervisor/src/devices/vgic/its`): devices 0..[`NDEV`] with their ITT
//! size, events 0..[`NEV`] mapped to (LPI, collection), collections
//! 0..[`NCOLL`] mapped to vCPUs, and per LPI ([`NLPI`] LPIs from 8192) its
//! target vCPU, its cached enable bit (read from the property table on
//! `MAPTI`/`MAPI`/`INV`/`INVALL` only) and its pending state. A command
//! with a wrong argument (DeviceID beyond Devbits, EventID beyond the ITT,
//! pINTID below 8192 or beyond the property table, ICID beyond the table,
//! RDbase of no vCPU, unknown command numbers with random doublewords, an
//! ITT too large) must be dropped: the model changes nothing.
//!
//! Choices: so that most LPIs can be checked, collections, `MOVALL`
//! targets and the set-up's mappings name vCPU 0 two times in three;
//! `MAPD` (which unmaps every event of its device) is rarer than the other
//! commands; half the `MAPTI`s map a free event to a free LPI, and half the
//! event-based commands (`INT`, `MOVI`, `CLEAR`, `INV`) name an event the
//! model has mapped; property bytes are set enabled three times in four.
//! The masked operation pends a few events, then works mostly on those
//! (moved, cleared, discarded, discarded and mapped again at once, or
//! re-read) while vCPU 0's list registers may hold them.
//!
//! Checks (violations): every batch completes (`GITS_CREADR` reaches
//! `GITS_CWRITER`, never `Stalled`: no command of the family reads outside
//! RAM); `GITS_TYPER` and `GITS_PIDR2` read the same every time; after each
//! batch vCPU 0 opens its CPU interface and takes what is pending: each LPI
//! the model says is pending, enabled and targeted at vCPU 0 must arrive
//! exactly once (within a second: one moved here from another vCPU's list
//! registers waits for that vCPU's exit and a kick back, tens of
//! milliseconds under emulation), and no other LPI may arrive there. With a
//! priority mask of 0 and IRQs unmasked, nothing may arrive at all. In the
//! mixed campaign vCPU 0's other operations may take LPIs between the
//! family's operations: before each one, those deliveries are checked
//! against the model as it stood (an LPI pending or maybe pending on vCPU
//! 0, at most once). The
//! run's line `FUZZ: its lpis=<all> vcpu0=<checked> required=<exact>`
//! counts the LPIs delivered on any vCPU, those delivered on vCPU 0 (each
//! one checked against the model) and those the model required there.
//!
//! Left out, and why: deliveries on the other vCPUs are counted but not
//! checked (in the mixed campaign they take interrupts only when their own
//! operations unmask IRQs, so the model cannot say when); an LPI made
//! pending while it targets another vCPU is "elsewhere" (delivery on vCPU
//! 0 is then a violation). Moved back to vCPU 0 it is pending there again
//! with `its-only`, where the other vCPUs never unmask IRQs, but only
//! "maybe" (zero or one delivery) in the mixed campaign, where the other
//! vCPU may have taken it first. When something active at priority 0
//! blocks every LPI on vCPU 0 (random operations may leave one), the
//! delivery check of that batch is skipped and its pending LPIs become
//! "maybe". A stale pending state that lives only until another vCPU's
//! next exit (an LPI discarded while that vCPU lists it) is seen only when
//! the LPI is mapped again in that window, which the masked operation
//! tries.

use core::arch::asm;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, Ordering};

use crate::fuzz::FUZZ_CPUS;
use crate::fuzz_model::Rng;
use crate::gic_its::{self, Command, Its, LPI_BASE, Layout, RdBase};
use crate::platform::Platform;
use crate::smp::Deadline;

/// Devices, events per device, collections and LPIs of the valid space.
pub const NDEV: usize = 4;
pub const NEV: usize = 8;
pub const NCOLL: usize = 4;
pub const NLPI: usize = 32;
/// LPIs counted per vCPU by the interrupt handler (the valid space and a
/// few more, so that a wrong LPI is seen too).
const COUNTED: usize = 64;
/// `GITS_TRANSLATER`'s offset and the registers the noise never writes.
const TRANSLATER: u64 = gic_its::GITS_TRANSLATER;
/// Property byte priority of the family's LPIs (the highest).
const PRIORITY: u8 = 0;
/// Commands the ITS implements (their numbers).
const IMPLEMENTED: [u8; 12] = [
    0x01, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
];

/// Per vCPU and LPI (8192 + n): deliveries the handler saw; `OTHER_LPIS`:
/// LPIs beyond those.
static LPI_SEEN: [[AtomicU32; COUNTED]; FUZZ_CPUS] =
    [const { [const { AtomicU32::new(0) }; COUNTED] }; FUZZ_CPUS];
static OTHER_LPIS: AtomicU32 = AtomicU32::new(0);
/// LPIs the model required on vCPU 0 (exactly one delivery each) in
/// [`ItsFuzz::settle`], over the whole run.
pub static REQUIRED: AtomicU32 = AtomicU32::new(0);

/// Counts an LPI the handler acknowledged on `cpu`.
pub fn count(cpu: usize, intid: u32) {
    match LPI_SEEN[cpu].get((intid - LPI_BASE) as usize) {
        Some(slot) => slot.fetch_add(1, Ordering::Relaxed),
        None => OTHER_LPIS.fetch_add(1, Ordering::Relaxed),
    };
}

/// LPIs delivered so far on every vCPU.
pub fn delivered() -> u64 {
    LPI_SEEN
        .iter()
        .flatten()
        .map(|n| u64::from(n.load(Ordering::Relaxed)))
        .sum::<u64>()
        + u64::from(OTHER_LPIS.load(Ordering::Relaxed))
}

/// LPIs delivered so far on `cpu` (within the counted range).
pub fn delivered_on(cpu: usize) -> u64 {
    LPI_SEEN[cpu]
        .iter()
        .map(|n| u64::from(n.load(Ordering::Relaxed)))
        .sum()
}

/// Pending state of an LPI, as far as vCPU 0 can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pend {
    No,
    /// Pending on its target (vCPU 0 when the model says so).
    Yes,
    /// Made pending while targeted at another vCPU: never delivered on
    /// vCPU 0 while it stays elsewhere.
    Elsewhere,
    /// Zero or one delivery on vCPU 0.
    Maybe,
}

#[derive(Clone, Copy, Debug)]
struct Lpi {
    /// Mapped by (device, event).
    by: Option<(usize, usize)>,
    collection: usize,
    vcpu: usize,
    /// Enable bit as last read by the ITS.
    cached: bool,
    /// Enable bit in the property table.
    property: bool,
    pend: Pend,
}

/// The model of the mappings (see the module docs).
struct Model {
    /// Per device: its ITT's EventID bits, when mapped.
    devices: [Option<u32>; NDEV],
    /// Per device and event: the LPI index.
    events: [[Option<usize>; NEV]; NDEV],
    collections: [Option<usize>; NCOLL],
    lpis: [Lpi; NLPI],
    vcpus: usize,
    /// The other vCPUs may take LPIs (not with `its-only`, where they
    /// never unmask IRQs: an LPI pending elsewhere stays pending).
    others_take: bool,
}

/// One command with its typed meaning for the model.
#[derive(Clone, Copy, Debug)]
enum Op {
    Mapd(u32, Option<u32>),
    Mapc(u32, Option<u64>),
    Mapti(u32, u32, u32, u32),
    Movi(u32, u32, u32),
    Int(u32, u32),
    Clear(u32, u32),
    Discard(u32, u32),
    Inv(u32, u32),
    Invall(u32),
    Movall(u64, u64),
    Sync,
    /// Dropped by any ITS (unknown number).
    Unknown,
}

impl Model {
    fn new(vcpus: usize, others_take: bool) -> Model {
        Model {
            devices: [None; NDEV],
            events: [[None; NEV]; NDEV],
            collections: [None; NCOLL],
            lpis: [Lpi {
                by: None,
                collection: 0,
                vcpu: 0,
                cached: true,
                property: true,
                pend: Pend::No,
            }; NLPI],
            vcpus,
            others_take,
        }
    }

    /// The event's LPI when the device is mapped and the event in range
    /// and mapped.
    fn lookup(&self, device: u32, event: u32) -> Option<usize> {
        let bits = (*self.devices.get(device as usize)?)?;
        if u64::from(event) >= 1 << bits {
            return None;
        }
        *self.events[device as usize].get(event as usize)?
    }

    fn unmap(&mut self, lpi: usize) {
        if let Some((d, e)) = self.lpis[lpi].by.take() {
            self.events[d][e] = None;
        }
        self.lpis[lpi].pend = Pend::No;
    }

    fn collection(&self, icid: u32) -> Option<Option<usize>> {
        self.collections.get(icid as usize).copied()
    }

    fn target(&self, rd: u64) -> Option<usize> {
        (rd < self.vcpus as u64).then_some(rd as usize)
    }

    /// Moves LPI `lpi` to `vcpu` (its pending state goes with it).
    fn retarget(&mut self, lpi: usize, vcpu: usize) {
        let l = &mut self.lpis[lpi];
        l.pend = match (l.pend, l.vcpu == 0, vcpu == 0) {
            (Pend::Yes, true, false) => Pend::Elsewhere,
            (Pend::Elsewhere, false, true) if self.others_take => Pend::Maybe,
            (Pend::Elsewhere, false, true) => Pend::Yes,
            (p, _, _) => p,
        };
        l.vcpu = vcpu;
    }

    /// What the command does to the mappings (nothing when it is dropped).
    fn apply(&mut self, op: Op) {
        match op {
            Op::Mapd(device, itt) => {
                if device as usize >= NDEV {
                    return;
                }
                if let Some(bits) = itt
                    && bits > 16
                {
                    return;
                }
                for lpi in 0..NLPI {
                    if self.lpis[lpi].by.is_some_and(|(d, _)| d == device as usize) {
                        self.unmap(lpi);
                    }
                }
                self.devices[device as usize] = itt;
            }
            Op::Mapc(icid, rd) => {
                if icid as usize >= NCOLL {
                    return;
                }
                match rd {
                    Some(rd) => {
                        let Some(vcpu) = self.target(rd) else { return };
                        self.collections[icid as usize] = Some(vcpu);
                        for lpi in 0..NLPI {
                            if self.lpis[lpi].by.is_some()
                                && self.lpis[lpi].collection == icid as usize
                            {
                                self.retarget(lpi, vcpu);
                            }
                        }
                    }
                    None => self.collections[icid as usize] = None,
                }
            }
            Op::Mapti(device, event, intid, icid) => {
                let Some(bits) = self.devices.get(device as usize).copied().flatten() else {
                    return;
                };
                if u64::from(event) >= 1 << bits || self.lookup(device, event).is_some() {
                    return;
                }
                let Some(vcpu) = self.collection(icid) else {
                    return;
                };
                let Some(lpi) = intid.checked_sub(LPI_BASE).map(|n| n as usize) else {
                    return;
                };
                if lpi >= NLPI || self.lpis[lpi].by.is_some() || event as usize >= NEV {
                    return;
                }
                let l = &mut self.lpis[lpi];
                l.by = Some((device as usize, event as usize));
                l.collection = icid as usize;
                l.vcpu = vcpu.unwrap_or(0);
                l.cached = l.property;
                l.pend = Pend::No;
                self.events[device as usize][event as usize] = Some(lpi);
            }
            Op::Movi(device, event, icid) => {
                let Some(lpi) = self.lookup(device, event) else {
                    return;
                };
                let Some(Some(vcpu)) = self.collection(icid) else {
                    return;
                };
                self.lpis[lpi].collection = icid as usize;
                self.retarget(lpi, vcpu);
            }
            Op::Int(device, event) => {
                let Some(lpi) = self.lookup(device, event) else {
                    return;
                };
                if self.collections[self.lpis[lpi].collection].is_none() {
                    return;
                }
                let l = &mut self.lpis[lpi];
                l.pend = if l.vcpu == 0 {
                    Pend::Yes
                } else {
                    Pend::Elsewhere
                };
            }
            Op::Clear(device, event) => {
                let Some(lpi) = self.lookup(device, event) else {
                    return;
                };
                if self.collections[self.lpis[lpi].collection].is_some() {
                    self.lpis[lpi].pend = Pend::No;
                }
            }
            Op::Discard(device, event) => {
                if let Some(lpi) = self.lookup(device, event) {
                    self.unmap(lpi);
                }
            }
            Op::Inv(device, event) => {
                if let Some(lpi) = self.lookup(device, event) {
                    self.lpis[lpi].cached = self.lpis[lpi].property;
                }
            }
            Op::Invall(icid) => {
                if let Some(Some(_)) = self.collection(icid) {
                    for l in self.lpis.iter_mut() {
                        if l.by.is_some() && l.collection == icid as usize {
                            l.cached = l.property;
                        }
                    }
                }
            }
            Op::Movall(from, to) => {
                let (Some(from), Some(to)) = (self.target(from), self.target(to)) else {
                    return;
                };
                for lpi in 0..NLPI {
                    if self.lpis[lpi].by.is_some() && self.lpis[lpi].vcpu == from {
                        self.retarget(lpi, to);
                    }
                }
            }
            Op::Sync | Op::Unknown => {}
        }
    }
}

/// The ITS the family set up, for the boot vCPU.
pub struct ItsFuzz {
    its: Its,
    model: Model,
    typer: u64,
    pidr2: u32,
    /// RDbase of each vCPU.
    rdbase: [u64; FUZZ_CPUS],
    /// LPIs seen on vCPU 0 when the model last looked.
    seen: [u32; COUNTED],
}

/// Sets the ITS up (see the module docs) on the boot vCPU; `Err` names what
/// failed.
pub fn setup(
    platform: &Platform,
    base: u64,
    gicr: u64,
    vcpus: usize,
    others_take: bool,
) -> Result<ItsFuzz, &'static str> {
    let free = platform.largest_free_range().ok_or("no free RAM")?;
    let start = free.end.saturating_sub(gic_its::REGION_SIZE) & !0xffff;
    let layout = Layout { start };
    if start < free.start || layout.used(vcpus) > gic_its::REGION_SIZE {
        return Err("no free RAM for the ITS tables");
    }
    gic_its::init_property_table(layout, gic_its::property(PRIORITY, true));
    let its = Its::init(base, layout).map_err(|_| "ITS set-up failed")?;
    let mut rdbase = [0; FUZZ_CPUS];
    for (cpu, slot) in rdbase.iter_mut().enumerate().take(vcpus) {
        let rd = gicr + cpu as u64 * crate::fuzz_model::GICR_STRIDE;
        gic_its::enable_lpis(layout, rd, cpu).map_err(|_| "LPIs not enabled")?;
        *slot = its.rdbase(rd).0;
    }
    Ok(ItsFuzz {
        typer: read64(base + 8),
        pidr2: read32(base + 0xffe8),
        its,
        model: Model::new(vcpus, others_take),
        rdbase,
        seen: [0; COUNTED],
    })
}

type Outcome = Result<(), (&'static str, u64, u64)>;

fn read32(address: u64) -> u32 {
    // SAFETY: an ITS register (both frames are device memory, identity
    // mapped); reads have no side effect.
    unsafe { read_volatile(address as *const u32) }
}

fn read64(address: u64) -> u64 {
    // SAFETY: as in `read32`.
    unsafe { read_volatile(address as *const u64) }
}

fn write32(address: u64, value: u32) {
    // SAFETY: an ITS register the caller may write (module docs).
    unsafe { write_volatile(address as *mut u32, value) }
}

fn write64(address: u64, value: u64) {
    // SAFETY: as in `write32`.
    unsafe { write_volatile(address as *mut u64, value) }
}

/// Whether the family's own set-up survives a write at `offset`.
fn writable(offset: u64) -> bool {
    !matches!(offset, 0x0..0x4 | 0x80..0x90 | 0x100..0x140)
        && !(TRANSLATER..TRANSLATER + 8).contains(&offset)
}

/// A random access to a register of either frame: a read at any offset, or
/// a write where [`writable`]; with `vcpu0`, also `GITS_TRANSLATER`.
fn register_access(rng: &mut Rng, base: u64) -> Option<u64> {
    let wide = rng.one_in(2);
    let offset = if rng.one_in(3) {
        rng.pick(&[
            0x0, 0x4, 0x8, 0x80, 0x88, 0x90, 0x100, 0x108, 0xffe8, TRANSLATER,
        ])
    } else {
        rng.below(gic_its::GITS_TRANSLATER + 0xffb0)
    } & if wide { !7 } else { !3 };
    let write = rng.one_in(2) && writable(offset) && writable(offset + 4);
    match (wide, write) {
        (true, false) => {
            read64(base + offset);
        }
        (false, false) => {
            read32(base + offset);
        }
        (true, true) => write64(base + offset, rng.next()),
        (false, true) => write32(base + offset, rng.next() as u32),
    }
    write.then_some(offset)
}

/// Noise from a vCPU other than 0: a register access, or a
/// `GITS_TRANSLATER` write of an EventID no ITT of the family has.
pub fn noise(rng: &mut Rng, base: u64) {
    if rng.one_in(3) {
        write32(base + TRANSLATER, 1 << 16 | rng.next() as u32);
    } else {
        register_access(rng, base);
    }
}

impl ItsFuzz {
    /// A random device (mostly valid), event, collection, LPI and target.
    fn device(&self, rng: &mut Rng) -> u32 {
        if rng.one_in(10) {
            (1 << 16) + rng.below(1 << 16) as u32
        } else {
            rng.below(NDEV as u64) as u32
        }
    }
    /// A (device, event) pair: half the time one the model has mapped
    /// (when there is one), otherwise [`Self::device`] and [`Self::event`].
    fn source(&self, rng: &mut Rng) -> (u32, u32) {
        if rng.one_in(2) {
            let mapped = self.model.lpis.iter().filter_map(|l| l.by);
            let n = mapped.clone().count() as u64;
            if let Some((d, e)) = mapped.clone().nth(rng.below(n.max(1)) as usize) {
                return (d as u32, e as u32);
            }
        }
        (self.device(rng), self.event(rng))
    }
    /// A random event of a mapped device that is free, and a random free
    /// LPI, when there are both.
    fn free(&self, rng: &mut Rng) -> Option<(u32, u32, u32)> {
        let m = &self.model;
        let events = (0..NDEV)
            .flat_map(|d| (0..NEV).map(move |e| (d, e)))
            .filter(|&(d, e)| {
                m.devices[d].is_some_and(|bits| e < 1 << bits) && m.events[d][e].is_none()
            });
        let lpis = (0..NLPI).filter(|&n| m.lpis[n].by.is_none());
        let (ne, nl) = (events.clone().count() as u64, lpis.clone().count() as u64);
        if ne == 0 || nl == 0 {
            return None;
        }
        let (d, e) = events.clone().nth(rng.below(ne) as usize)?;
        let lpi = lpis.clone().nth(rng.below(nl) as usize)?;
        Some((d as u32, e as u32, LPI_BASE + lpi as u32))
    }
    /// A valid (device, event) pair: half the time one the model has
    /// mapped (when there is one), otherwise any.
    fn valid_source(&self, rng: &mut Rng) -> (u32, u32) {
        let (d, e) = self.source(rng);
        if (d as usize) < NDEV && (e as usize) < NEV {
            (d, e)
        } else {
            (rng.below(NDEV as u64) as u32, rng.below(NEV as u64) as u32)
        }
    }
    fn event(&self, rng: &mut Rng) -> u32 {
        match rng.below(12) {
            0 => NEV as u32 + rng.below(1 << 16) as u32,
            1 => u32::MAX - rng.below(4) as u32,
            _ => rng.below(NEV as u64) as u32,
        }
    }
    fn icid(&self, rng: &mut Rng) -> u32 {
        if rng.one_in(10) {
            0xf000 + rng.below(0x1000) as u32
        } else {
            rng.below(NCOLL as u64) as u32
        }
    }
    fn intid(&self, rng: &mut Rng) -> u32 {
        match rng.below(12) {
            0 => rng.below(u64::from(LPI_BASE)) as u32,
            1 => (1 << gic_its::LPI_ID_BITS) + rng.below(1 << 16) as u32,
            _ => LPI_BASE + rng.below(NLPI as u64) as u32,
        }
    }
    /// A vCPU index (mostly), or a processor number of no vCPU.
    fn rd(&self, rng: &mut Rng) -> (u64, RdBase) {
        if rng.one_in(10) {
            let n = self.model.vcpus as u64 + rng.below(1000);
            (n, RdBase(n))
        } else {
            let n = self.vcpu(rng);
            (n, RdBase(self.rdbase[n as usize]))
        }
    }
    /// A vCPU index: vCPU 0 (the one whose deliveries are checked) two
    /// times in three, another one otherwise.
    fn vcpu(&self, rng: &mut Rng) -> u64 {
        let vcpus = self.model.vcpus as u64;
        if vcpus == 1 || rng.below(3) < 2 {
            0
        } else {
            1 + rng.below(vcpus - 1)
        }
    }

    /// One random command and its meaning.
    fn command(&self, rng: &mut Rng) -> (Command, Op) {
        match rng.below(15) {
            // MAPD unmaps every event of its device: rarer than the rest.
            0 if rng.one_in(4) => {
                let d = self.device(rng);
                let bits = match rng.below(8) {
                    0 => None,
                    1 => Some(17 + rng.below(15) as u32),
                    2 => Some(1 + rng.below(2) as u32),
                    _ => Some(3),
                };
                let itt = self.its.layout.itt(u64::from(d) % gic_its::SMALL_ITTS);
                (Command::mapd(d, bits.map(|b| (itt, b))), Op::Mapd(d, bits))
            }
            1 => {
                let c = self.icid(rng);
                let (n, rd) = self.rd(rng);
                if rng.one_in(10) {
                    (Command::mapc(c as u16, None), Op::Mapc(c, None))
                } else {
                    (Command::mapc(c as u16, Some(rd)), Op::Mapc(c, Some(n)))
                }
            }
            0 | 2 | 3 => {
                let (d, e, c) = (self.device(rng), self.event(rng), self.icid(rng));
                if let Some((d, e, i)) = self.free(rng).filter(|_| rng.one_in(2)) {
                    (Command::mapti(d, e, i, c as u16), Op::Mapti(d, e, i, c))
                } else if rng.one_in(4) {
                    // MAPI: the LPI is the EventID (never a valid one here).
                    (Command::mapi(d, e, c as u16), Op::Mapti(d, e, e, c))
                } else {
                    let i = self.intid(rng);
                    (Command::mapti(d, e, i, c as u16), Op::Mapti(d, e, i, c))
                }
            }
            4 => {
                let ((d, e), c) = (self.source(rng), self.icid(rng));
                (Command::movi(d, e, c as u16), Op::Movi(d, e, c))
            }
            5..=7 => {
                let (d, e) = self.source(rng);
                (Command::int(d, e), Op::Int(d, e))
            }
            8 => {
                let (d, e) = self.source(rng);
                (Command::clear(d, e), Op::Clear(d, e))
            }
            9 => {
                let (d, e) = (self.device(rng), self.event(rng));
                (Command::discard(d, e), Op::Discard(d, e))
            }
            10 => {
                let (d, e) = self.source(rng);
                (Command::inv(d, e), Op::Inv(d, e))
            }
            11 => {
                let c = self.icid(rng);
                (Command::invall(c as u16), Op::Invall(c))
            }
            12 => {
                let ((a, ra), (b, rb)) = (self.rd(rng), self.rd(rng));
                (Command::movall(ra, rb), Op::Movall(a, b))
            }
            13 => {
                let (_, rd) = self.rd(rng);
                (Command::sync(rd), Op::Sync)
            }
            _ => {
                let number = loop {
                    let n = rng.next() as u8;
                    if !IMPLEMENTED.contains(&n) {
                        break n;
                    }
                };
                let dw = [
                    rng.next() & !0xff | u64::from(number),
                    rng.next(),
                    rng.next(),
                    rng.next(),
                ];
                (Command(dw), Op::Unknown)
            }
        }
    }

    /// Sets a random LPI's enable bit in the property table: three times in
    /// four enabled (LPIs the ITS reads disabled are never delivered).
    fn flip_property(&mut self, rng: &mut Rng) {
        let lpi = rng.below(NLPI as u64) as usize;
        let enable = !rng.one_in(4);
        let l = &mut self.model.lpis[lpi];
        l.property = enable;
        gic_its::set_property(
            self.its.layout,
            LPI_BASE + lpi as u32,
            gic_its::property(PRIORITY, l.property),
            true,
        );
    }

    /// Queues `commands`; every one must complete.
    fn submit(&mut self, commands: &[(Command, Op)]) -> Outcome {
        let mut raw = [Command([0; 4]); 8];
        for (slot, (command, _)) in raw.iter_mut().zip(commands) {
            *slot = *command;
        }
        if let Err(error) = self.its.submit(&raw[..commands.len()]) {
            let (a, b) = match error {
                gic_its::ItsError::Stalled { creadr } => (creadr, 1),
                gic_its::ItsError::Timeout { creadr, cwriter } => (creadr, cwriter),
                _ => (0, 0),
            };
            // Start again from an empty queue so that later batches run.
            return Err((
                "ITS command batch did not complete (CREADR, CWRITER or stall)",
                a,
                b,
            ));
        }
        for &(_, op) in commands {
            self.model.apply(op);
        }
        Ok(())
    }

    /// LPIs vCPU 0 took since the last settle, while the other families'
    /// operations had IRQs unmasked (never with `its-only`): each may be
    /// one the model has pending (or maybe pending) on vCPU 0, taken once;
    /// no other. Called before the model changes again.
    fn absorb(&mut self) -> Outcome {
        let mut outcome = Ok(());
        for (n, seen) in LPI_SEEN[0].iter().enumerate().take(COUNTED) {
            let now = seen.load(Ordering::Relaxed);
            let got = now.wrapping_sub(self.seen[n]);
            self.seen[n] = now;
            let allowed = match self.model.lpis.get(n) {
                Some(l) if l.vcpu == 0 && matches!(l.pend, Pend::Yes | Pend::Maybe) => 0..=1,
                _ => 0..=0,
            };
            if !allowed.contains(&got) && outcome.is_ok() {
                outcome = Err((
                    "LPI delivered on vCPU 0 between operations not as the model says \
                     (INTID, deliveries)",
                    u64::from(LPI_BASE) + n as u64,
                    u64::from(got),
                ));
            }
            if let Some(l) = self.model.lpis.get_mut(n)
                && got > 0
            {
                l.pend = Pend::No;
            }
        }
        outcome
    }

    /// vCPU 0 takes what is pending (`open` has turned its CPU interface
    /// on): the LPIs the model says must come, exactly once; no other.
    fn settle(&mut self, open: &mut dyn FnMut()) -> Outcome {
        open();
        let rpr: u64;
        // SAFETY: reading the running priority has no side effect.
        unsafe { asm!("mrs {}, icc_rpr_el1", out(reg) rpr, options(nomem, nostack)) };
        let blocked = rpr & 0xff <= u64::from(PRIORITY);
        let mut must = [false; NLPI];
        for (lpi, l) in self.model.lpis.iter().enumerate() {
            must[lpi] = l.pend == Pend::Yes && l.cached && l.vcpu == 0 && !blocked;
        }
        let required = must.iter().filter(|&&m| m).count() as u32;
        REQUIRED.fetch_add(required, Ordering::Relaxed);
        // Generous: an LPI moved here from another vCPU's list registers
        // comes after that vCPU's exit and a kick back, which under
        // emulation on a busy host took up to ~80 ms.
        let deadline = Deadline::after_millis(1000);

        // SAFETY: unmasking IRQs: the fuzz handler acknowledges, counts and
        // completes every interrupt.
        unsafe { asm!("msr daifclr, #2", options(nostack)) };
        loop {
            let done = (0..NLPI)
                .all(|n| !must[n] || LPI_SEEN[0][n].load(Ordering::Relaxed) != self.seen[n]);
            if done || deadline.passed() {
                break;
            }
            core::hint::spin_loop();
        }
        // A little longer, for a second delivery that must not come.
        let grace = Deadline::after_millis(1);
        while !grace.passed() {
            core::hint::spin_loop();
        }
        // SAFETY: masking IRQs again.
        unsafe { asm!("msr daifset, #2", options(nostack)) };
        let mut outcome = Ok(());
        for (n, seen) in LPI_SEEN[0].iter().enumerate().take(COUNTED) {
            let now = seen.load(Ordering::Relaxed);
            let got = now.wrapping_sub(self.seen[n]);
            self.seen[n] = now;
            let allowed = match self.model.lpis.get(n) {
                None => 0..=0,
                Some(_) if must[n] => 1..=1,
                Some(l) if blocked && l.vcpu == 0 && matches!(l.pend, Pend::Yes | Pend::Maybe) => {
                    0..=1
                }
                Some(l) if l.pend == Pend::Maybe && l.vcpu == 0 => 0..=1,
                Some(_) => 0..=0,
            };
            if !allowed.contains(&got) && outcome.is_ok() {
                outcome = Err((
                    "LPI delivered on vCPU 0 not as the model says (INTID, deliveries)",
                    u64::from(LPI_BASE) + n as u64,
                    u64::from(got),
                ));
            }
            if let Some(l) = self.model.lpis.get_mut(n) {
                let taken = got > 0 || must[n];
                if matches!(l.pend, Pend::Yes | Pend::Maybe) && l.vcpu == 0 && taken {
                    l.pend = Pend::No;
                } else if blocked && l.pend == Pend::Yes && l.vcpu == 0 {
                    l.pend = Pend::Maybe;
                }
            }
        }
        outcome
    }

    /// Maps the family's valid space from scratch: every device unmapped
    /// and mapped again, every collection on a random vCPU, every LPI
    /// enabled, a few events mapped.
    pub fn reset(&mut self, rng: &mut Rng, open: &mut dyn FnMut()) -> Outcome {
        self.absorb()?;
        for lpi in 0..NLPI {
            if !self.model.lpis[lpi].property {
                self.model.lpis[lpi].property = true;
                gic_its::set_property(
                    self.its.layout,
                    LPI_BASE + lpi as u32,
                    gic_its::property(PRIORITY, true),
                    true,
                );
            }
        }
        let mut batch = heapless_batch();
        let mut n = 0;
        for d in 0..NDEV as u32 {
            let itt = self.its.layout.itt(u64::from(d));
            batch[n] = (Command::mapd(d, None), Op::Mapd(d, None));
            batch[n + 1] = (Command::mapd(d, Some((itt, 3))), Op::Mapd(d, Some(3)));
            n += 2;
        }
        self.submit(&batch[..n])?;
        n = 0;
        for c in 0..NCOLL as u32 {
            let v = self.vcpu(rng);
            batch[n] = (
                Command::mapc(c as u16, Some(RdBase(self.rdbase[v as usize]))),
                Op::Mapc(c, Some(v)),
            );
            n += 1;
        }
        self.submit(&batch[..n])?;
        for _ in 0..2 {
            n = 0;
            for _ in 0..8 {
                let (d, e) = self.valid_source(rng);
                let (i, c) = (
                    LPI_BASE + rng.below(NLPI as u64) as u32,
                    rng.below(NCOLL as u64) as u32,
                );
                batch[n] = (Command::mapti(d, e, i, c as u16), Op::Mapti(d, e, i, c));
                n += 1;
            }
            self.submit(&batch[..n])?;
        }
        self.settle(open)
    }

    /// One operation of the family on vCPU 0.
    pub fn op(&mut self, rng: &mut Rng, open: &mut dyn FnMut()) -> Outcome {
        self.absorb()?;
        let base = self.its.base;
        match rng.below(10) {
            0 => {
                // Registers: ID and TYPER stable, random accesses.
                let (typer, pidr2) = (read64(base + 8), read32(base + 0xffe8));
                if typer != self.typer || pidr2 != self.pidr2 {
                    return Err(("GITS_TYPER or GITS_PIDR2 changed", typer, u64::from(pidr2)));
                }
                for _ in 0..1 + rng.below(4) {
                    register_access(rng, base);
                }
                Ok(())
            }
            1 => {
                // A CPU's request: DeviceID 0.
                let event = self.event(rng);
                write32(base + TRANSLATER, event);
                self.model.apply(Op::Int(0, event));
                self.settle(open)
            }
            2..=4 => self.masked(rng, open),
            _ => {
                let mut batch = heapless_batch();
                let n = 1 + rng.below(6) as usize;
                for slot in batch.iter_mut().take(n) {
                    *slot = self.command(rng);
                }
                if rng.one_in(3) {
                    self.flip_property(rng);
                }
                self.submit(&batch[..n])?;
                self.settle(open)
            }
        }
    }

    /// LPIs pending behind `ICC_PMR_EL1` = 0 with IRQs unmasked (nothing
    /// may come), then moved, cleared, discarded or re-enabled, then the
    /// mask opened.
    fn masked(&mut self, rng: &mut Rng, open: &mut dyn FnMut()) -> Outcome {
        let mut batch = heapless_batch();
        let pended = 1 + rng.below(4) as usize;
        let mut sources = [(0, 0); 4];
        for (slot, source) in batch.iter_mut().zip(sources.iter_mut()).take(pended) {
            let (d, e) = self.valid_source(rng);
            *source = (d, e);
            *slot = (Command::int(d, e), Op::Int(d, e));
        }
        self.submit(&batch[..pended])?;
        let before = delivered();
        let before0: u32 = LPI_SEEN[0].iter().map(|n| n.load(Ordering::Relaxed)).sum();
        // SAFETY: a closed priority mask, then IRQs unmasked: nothing may be
        // taken; the handler would count it.
        unsafe {
            asm!(
                "msr icc_pmr_el1, xzr",
                "isb",
                "msr daifclr, #2",
                options(nostack)
            )
        };
        let wait = Deadline::after_millis(1);
        while !wait.passed() {
            core::hint::spin_loop();
        }
        let mut batch = heapless_batch();
        let mut n = 0;
        for _ in 0..1 + rng.below(4) {
            // Mostly an event just made pending (listed by now, when it
            // targets vCPU 0 and is enabled).
            let (d, e) = if !rng.one_in(3) {
                sources[rng.below(pended as u64) as usize]
            } else {
                self.valid_source(rng)
            };
            batch[n] = match rng.below(8) {
                0 => {
                    let c = rng.below(NCOLL as u64) as u32;
                    (Command::movi(d, e, c as u16), Op::Movi(d, e, c))
                }
                1 => {
                    let (a, b) = (self.vcpu(rng), self.vcpu(rng));
                    let (ra, rb) = (self.rdbase[a as usize], self.rdbase[b as usize]);
                    (Command::movall(RdBase(ra), RdBase(rb)), Op::Movall(a, b))
                }
                2 => (Command::clear(d, e), Op::Clear(d, e)),
                3 => (Command::discard(d, e), Op::Discard(d, e)),
                4 => {
                    // Discarded and mapped again at once (to the LPI it
                    // had when the batch was made): it must come back not
                    // pending, even while another vCPU still lists it.
                    let c = rng.below(NCOLL as u64) as u32;
                    let lpi = self.model.lookup(d, e).unwrap_or(0);
                    let i = LPI_BASE + lpi as u32;
                    batch[n] = (Command::discard(d, e), Op::Discard(d, e));
                    n += 1;
                    (Command::mapti(d, e, i, c as u16), Op::Mapti(d, e, i, c))
                }
                5 => {
                    let c = rng.below(NCOLL as u64) as u32;
                    (Command::invall(c as u16), Op::Invall(c))
                }
                _ => (Command::inv(d, e), Op::Inv(d, e)),
            };
            n += 1;
        }
        self.flip_property(rng);
        let submitted = self.submit(&batch[..n]);
        let wait = Deadline::after_millis(1);
        while !wait.passed() {
            core::hint::spin_loop();
        }
        // SAFETY: masking IRQs again.
        unsafe { asm!("msr daifset, #2", options(nostack)) };
        let after0: u32 = LPI_SEEN[0].iter().map(|n| n.load(Ordering::Relaxed)).sum();
        submitted?;
        if after0 != before0 {
            return Err((
                "LPI taken on vCPU 0 with ICC_PMR_EL1 = 0",
                u64::from(before0),
                delivered() - before,
            ));
        }
        self.settle(open)
    }
}

fn heapless_batch() -> [(Command, Op); 8] {
    [(Command([0; 4]), Op::Unknown); 8]
}
