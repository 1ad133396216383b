//! The host's physical ITS, driven at EL2, for the MSIs of passed PCIe
//! devices (`crate::vm::msi_shadow` says why the hypervisor needs it).
//!
//! [`init`] (boot CPU, once, after the GIC): reads `GITS_TYPER`, disables
//! the ITS, gives it a flat device table covering its DeviceIDs and a
//! one-page collection table (the `GITS_BASER<n>` of those types; the
//! others stay invalid), a one-page command queue, and enables it; it also
//! makes the host's LPI property table (every LPI of the hypervisor's pool
//! enabled at the host priority, written once and never changed, so no
//! `INV` is ever needed). [`init_cpu`] (every CPU, after its GIC part):
//! points its redistributor at the property table and a zeroed pending
//! table of its own, sets `GICR_CTLR.EnableLPIs`, and maps collection
//! `index` (the CPU's logical number) to it with `MAPC` and `SYNC`.
//!
//! [`map_device`] maps a DeviceID with an ITT of its own and each of its
//! events to a run of host LPIs from the pool, in the collection of one
//! CPU (`MAPD`, `MAPTI` each, `SYNC`); [`unmap_device`] undoes it (`MAPD`
//! with V = 0) and gives the run and the ITT back. Commands are written to
//! the ring under one lock, in batches that leave a slot free, each batch
//! published through `GITS_CWRITER` and waited for until `GITS_CREADR`
//! meets it. Every table and command is cleaned to the point of coherency
//! before the ITS may read it, for an ITS that does not snoop the caches.
//!
//! A host LPI fires as an ordinary group 1 interrupt on its CPU; the run
//! loop acknowledges it and drops its priority (an LPI has no active
//! state) and the runtime replays it into the VM
//! (`crate::runtime::passed_devices::deliver_lpi`).

use crate::arch::cpu::percpu::MAX_CPUS;
use crate::arch::cpu::sysreg;
use crate::drivers::its::{
    self as regs, COMMAND_BYTES, ItsFeatures, LPI_PROPERTY, PENDING_TABLE_ALIGN,
    PENDING_TABLE_BYTES, PROPERTY_TABLE_BYTES, QUEUE_BYTES, TYPE_COLLECTIONS, TYPE_DEVICES,
    gicr_lpi, gits,
};
use crate::platform::ranges::PhysRange;
use crate::read_sysreg;
use crate::stage2::cache_maint::CacheCaps;
use crate::vm::msi_shadow::LpiPool;
use alloc::vec::Vec;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU64, Ordering};
use spin::{Mutex, Once};

/// Polls of `GITS_CREADR` before a batch is given up on.
const WAIT_POLLS: u32 = 10_000_000;
/// No target yet (`TARGETS`).
const NO_TARGET: u64 = u64::MAX;

/// Why the ITS could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsError {
    /// No frames for its tables.
    NoMemory,
    /// `GITS_TYPER` reports no physical LPIs.
    NotPhysical,
    /// `init_cpu` before [`init`] or without a redistributor.
    NotReady,
    /// This CPU's redistributor has no LPIs, or has them enabled already
    /// (its tables cannot be changed then).
    RedistributorLpis,
    /// The command queue did not advance.
    Stalled,
}

impl core::fmt::Display for ItsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::NoMemory => "no memory for its tables",
            Self::NotPhysical => "it has no physical LPIs",
            Self::NotReady => "not set up",
            Self::RedistributorLpis => "the redistributor has no LPIs, or has them enabled already",
            Self::Stalled => "its command queue stalled",
        })
    }
}

/// A device mapped by [`map_device`]: its ITT.
struct MappedDevice {
    device: u32,
    itt: u64,
    itt_bytes: u64,
}

/// The command ring and what is mapped through it.
struct Queue {
    /// Physical address of the ring.
    base: u64,
    /// `GITS_CWRITER.Offset`.
    write: u64,
    devices: Vec<MappedDevice>,
}

/// The host frame allocator (`arch::boot::memory`, which comes after the
/// drivers in the dependency order, so the boot sequence hands it over).
#[derive(Clone, Copy)]
pub struct Frames {
    /// Allocates `size` bytes aligned to `align`.
    pub alloc: fn(u64, u64) -> Option<u64>,
    /// Frees what `alloc` gave, with the same size and alignment.
    pub free: fn(u64, u64, u64),
}

/// What [`init`] set up.
struct HostIts {
    base: usize,
    frames: Frames,
    features: ItsFeatures,
    properties: u64,
    queue: Mutex<Queue>,
    pool: Mutex<LpiPool>,
}

static ITS: Once<HostIts> = Once::new();
/// Each CPU's `RDbase` in commands, once its LPIs are on.
static TARGETS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(NO_TARGET) }; MAX_CPUS];

fn read32(addr: usize) -> u32 {
    // SAFETY: callers pass addresses in the ITS's frames or a
    // redistributor's `RD_base` frame, which the EL2 stage 1 maps as device
    // memory (`arch::boot::memory`).
    unsafe { read_volatile(addr as *const u32) }
}

fn write32(addr: usize, value: u32) {
    // SAFETY: as in `read32`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

fn read64(addr: usize) -> u64 {
    // SAFETY: as in `read32`; these registers take 64-bit accesses.
    unsafe { read_volatile(addr as *const u64) }
}

fn write64(addr: usize, value: u64) {
    // SAFETY: as in `read64`.
    unsafe { write_volatile(addr as *mut u64, value) }
}

/// Cleans `[pa, pa + len)` to the point of coherency for the ITS.
fn clean(pa: u64, len: u64) {
    let line = CacheCaps::from_ctr(read_sysreg!(ctr_el0)).dline;
    sysreg::clean_inval_dcache_to_poc(pa as usize, len as usize, line);
}

/// Zeroed, cleaned frames.
fn zeroed_frames(frames: Frames, size: u64, align: u64) -> Result<u64, ItsError> {
    let pa = (frames.alloc)(size, align).ok_or(ItsError::NoMemory)?;
    sysreg::zero_memory(pa as usize, size.next_multiple_of(regs::PAGE) as usize);
    clean(pa, size);
    Ok(pa)
}

/// Boot CPU, once: sets up the ITS at `frames` and the host LPI property
/// table for a pool of `pool` LPIs (module doc), its memory from
/// `memory`. Returns the DeviceID bits it covers.
pub fn init(frames: PhysRange, pool: u32, memory: Frames) -> Result<u32, ItsError> {
    let base = frames.start as usize;
    let features = ItsFeatures::from_typer(read64(base + gits::TYPER));
    if !features.physical {
        return Err(ItsError::NotPhysical);
    }
    write32(base + gits::CTLR, 0);
    let mut polls = 0;
    while read32(base + gits::CTLR) & gits::CTLR_QUIESCENT == 0 {
        polls += 1;
        if polls > WAIT_POLLS {
            return Err(ItsError::Stalled);
        }
        core::hint::spin_loop();
    }
    for n in 0..8 {
        let at = base + gits::BASER0 + 8 * n;
        let read = read64(at);
        let (kind, entry_size) = regs::baser_kind(read);
        let entries = match kind {
            TYPE_DEVICES => 1u64 << features.device_bits,
            TYPE_COLLECTIONS => MAX_CPUS as u64,
            _ => continue,
        };
        let pages = regs::table_pages(entries, entry_size);
        let table = zeroed_frames(memory, pages * regs::PAGE, regs::PAGE)?;
        write64(at, regs::baser_value(read, table, pages));
    }
    let queue = zeroed_frames(memory, QUEUE_BYTES, regs::PAGE)?;
    write64(base + gits::CBASER, regs::cbaser_value(queue));
    write64(base + gits::CWRITER, 0);
    let properties = (memory.alloc)(PROPERTY_TABLE_BYTES, regs::PAGE).ok_or(ItsError::NoMemory)?;
    // SAFETY: the frames were just taken from the allocator: RAM the EL2
    // map covers, owned by nothing else, `PROPERTY_TABLE_BYTES` long.
    unsafe {
        core::ptr::write_bytes(properties as *mut u8, 0, PROPERTY_TABLE_BYTES as usize);
        core::ptr::write_bytes(properties as *mut u8, LPI_PROPERTY, pool as usize);
    }
    clean(properties, PROPERTY_TABLE_BYTES);
    write32(base + gits::CTLR, gits::CTLR_ENABLED);
    ITS.call_once(|| HostIts {
        base,
        frames: memory,
        features,
        properties,
        queue: Mutex::new(Queue {
            base: queue,
            write: 0,
            devices: Vec::new(),
        }),
        pool: Mutex::new(LpiPool::new(pool)),
    });
    Ok(features.device_bits)
}

/// The ITS's base, once [`init`] succeeded.
pub fn base() -> Option<u64> {
    ITS.get().map(|its| its.base as u64)
}

/// Every CPU (after its GIC part): LPIs on at its redistributor `rd`, and
/// collection `index` mapped to it.
pub fn init_cpu(index: usize, rd: usize) -> Result<(), ItsError> {
    let its = ITS.get().ok_or(ItsError::NotReady)?;
    let typer = read64(rd + gicr_lpi::TYPER);
    if !regs::has_lpis(typer) || read32(rd + gicr_lpi::CTLR) & gicr_lpi::CTLR_ENABLE_LPIS != 0 {
        return Err(ItsError::RedistributorLpis);
    }
    let pending = zeroed_frames(its.frames, PENDING_TABLE_BYTES, PENDING_TABLE_ALIGN)?;
    write64(
        rd + gicr_lpi::PROPBASER,
        regs::propbaser_value(its.properties),
    );
    write64(rd + gicr_lpi::PENDBASER, regs::pendbaser_value(pending));
    sysreg::dsb_ish();
    let ctlr = read32(rd + gicr_lpi::CTLR);
    write32(rd + gicr_lpi::CTLR, ctlr | gicr_lpi::CTLR_ENABLE_LPIS);
    sysreg::dsb_ish();
    let target = regs::target_of(its.features.pta, rd as u64, typer);
    its.submit(&[regs::mapc(index as u16, target), regs::sync(target)])?;
    TARGETS[index].store(target, Ordering::Release);
    Ok(())
}

impl HostIts {
    /// Queues `commands` and waits until the ITS has run them.
    fn submit(&self, commands: &[[u64; 4]]) -> Result<(), ItsError> {
        let mut queue = self.queue.lock();
        let slots = (QUEUE_BYTES / COMMAND_BYTES) as usize - 1;
        for batch in commands.chunks(slots) {
            for command in batch {
                let at = queue.base + queue.write;
                for (i, dw) in command.iter().enumerate() {
                    // SAFETY: `at` is a 32-byte slot of the ring, RAM this
                    // driver owns; the ITS reads only slots between CREADR
                    // and CWRITER, and this one is not yet published.
                    unsafe { write_volatile((at + 8 * i as u64) as *mut u64, *dw) };
                }
                clean(at, COMMAND_BYTES);
                queue.write = (queue.write + COMMAND_BYTES) % QUEUE_BYTES;
            }
            sysreg::dsb_ish();
            write64(self.base + gits::CWRITER, queue.write);
            let mut polls = 0;
            loop {
                let creadr = read64(self.base + gits::CREADR);
                if creadr & gits::QUEUE_OFFSET == queue.write {
                    break;
                }
                polls += 1;
                if creadr & gits::CREADR_STALLED != 0 || polls > WAIT_POLLS {
                    return Err(ItsError::Stalled);
                }
                core::hint::spin_loop();
            }
        }
        Ok(())
    }
}

/// Maps DeviceID `device` with `events` (a power of two) events, event `e`
/// to host LPI `first + e`, in the collection of CPU `cpu`. Returns
/// `first`, or `None` when the ITS is not up, the CPU has no LPIs, the pool
/// has no run that long, or memory is short.
pub fn map_device(device: u32, events: u32, cpu: usize) -> Option<u32> {
    let its = ITS.get()?;
    if u64::from(device) >= 1 << its.features.device_bits {
        return None;
    }
    let target = TARGETS.get(cpu)?.load(Ordering::Acquire);
    if target == NO_TARGET {
        return None;
    }
    let first = its.pool.lock().take(events)?;
    let itt_bytes = its.features.itt_bytes(events);
    let Ok(itt) = zeroed_frames(its.frames, itt_bytes, regs::PAGE) else {
        its.pool.lock().give_back(first, events);
        return None;
    };
    let mut commands = Vec::with_capacity(events as usize + 2);
    commands.push(regs::mapd(device, events, itt, true));
    commands.extend((0..events).map(|e| regs::mapti(device, e, first + e, cpu as u16)));
    commands.push(regs::sync(target));
    if let Err(e) = its.submit(&commands) {
        log::warn!("host ITS: mapping DeviceID {device:#x}: {e}");
        (its.frames.free)(itt, itt_bytes, regs::PAGE);
        its.pool.lock().give_back(first, events);
        return None;
    }
    its.queue.lock().devices.push(MappedDevice {
        device,
        itt,
        itt_bytes,
    });
    Some(first)
}

/// Unmaps DeviceID `device` (mapped by [`map_device`] with LPIs `first..first
/// + events`) and gives its LPIs and ITT back.
pub fn unmap_device(device: u32, first: u32, events: u32) {
    let Some(its) = ITS.get() else {
        return;
    };
    let target = TARGETS
        .iter()
        .map(|t| t.load(Ordering::Acquire))
        .find(|&t| t != NO_TARGET)
        .unwrap_or(0);
    if let Err(e) = its.submit(&[regs::mapd(device, 2, 0, false), regs::sync(target)]) {
        log::warn!("host ITS: unmapping DeviceID {device:#x}: {e}");
    }
    let mapped = {
        let mut queue = its.queue.lock();
        let at = queue.devices.iter().position(|d| d.device == device);
        at.map(|at| queue.devices.swap_remove(at))
    };
    if let Some(mapped) = mapped {
        (its.frames.free)(mapped.itt, mapped.itt_bytes, regs::PAGE);
    }
    its.pool.lock().give_back(first, events);
}
