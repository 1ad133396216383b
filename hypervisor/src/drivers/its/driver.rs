//! The host's physical ITS driver: the sequences that bring it up, turn on
//! each CPU's LPIs and map passed PCIe devices' MSIs to host LPIs
//! (`crate::vm::msi_shadow` says why the hypervisor needs it).
//!
//! The driver touches nothing itself: it reaches the ITS's frame and each
//! redistributor's `RD_base` frame through a [`GicFrame`], the memory of
//! its tables and command queue through [`ItsMemory`] (frames from the
//! host allocator, zeroing, command writes, cleans to the point of
//! coherency and the `DSB` that orders them), and the host LPIs it hands
//! out through [`LpiRuns`]. On the machine those are volatile accesses,
//! the boot frame allocator, `DC CIVAC` and `LpiPool`
//! (`arch::drivers::its`, which also holds the driver in a static and each
//! CPU's target); host tests give it a mock that records every access in
//! one log (`mock`).
//!
//! # Sequences
//!
//! [`HostIts::init`] (boot CPU, once, after the GIC): reads `GITS_TYPER`,
//! disables the ITS and waits for `GITS_CTLR.Quiescent`, gives it a flat
//! device table covering its DeviceIDs and a collection table (the
//! `GITS_BASER<n>` of those types; the others stay invalid), a one-page
//! command queue (`GITS_CBASER`, `GITS_CWRITER` 0), and enables it; it
//! also makes the host's LPI property table (every LPI of the pool enabled
//! at the host priority, written once and never changed, so no `INV` is
//! ever needed). [`HostIts::init_cpu`] (every CPU, after its GIC part):
//! points its redistributor at the property table and a zeroed pending
//! table of its own, sets `GICR_CTLR.EnableLPIs`, and maps collection
//! `index` (the CPU's logical number) to it with `MAPC` and `SYNC`,
//! returning the CPU's target (`RDbase` in commands).
//!
//! [`HostIts::map_device`] maps a DeviceID with an ITT of its own and each
//! of its events to a run of host LPIs, in the collection of one CPU
//! (`MAPD`, `MAPTI` each, `SYNC`); [`HostIts::unmap_device`] undoes it
//! (`MAPD` with V = 0) and gives the run and the ITT back.
//!
//! # The command queue
//!
//! Commands are written to the ring under one lock, in batches of at most
//! one slot less than the ring holds (a full ring would have `GITS_CWRITER`
//! equal to `GITS_CREADR`, which reads as empty). Each command is written
//! and cleaned, then, after a `DSB`, the batch is published through
//! `GITS_CWRITER` (wrapping at the ring's end) and waited for until
//! `GITS_CREADR` meets it, at most the poll bound given to
//! [`HostIts::init`] reads; `GITS_CREADR.Stalled` or the bound end the wait
//! with [`ItsError::Stalled`]. Every table and command is cleaned to the
//! point of coherency before the ITS may read it, for an ITS that does not
//! snoop the caches.

use super::{
    self as regs, COMMAND_BYTES, ItsFeatures, LPI_PROPERTY, PENDING_TABLE_ALIGN,
    PENDING_TABLE_BYTES, PROPERTY_TABLE_BYTES, QUEUE_BYTES, TYPE_COLLECTIONS, TYPE_DEVICES,
    gicr_lpi, gits,
};
use crate::drivers::gic::driver::GicFrame;
use alloc::vec::Vec;
use spin::Mutex;

/// Polls of `GITS_CTLR` or `GITS_CREADR` on the machine before a wait is
/// given up on.
pub const WAIT_POLLS: u32 = 10_000_000;

/// The host frame allocator as the boot sequence hands it over
/// (`arch::boot::memory` comes after the drivers in the dependency order);
/// the machine's [`ItsMemory`] allocates through it.
#[derive(Clone, Copy)]
pub struct Frames {
    /// Allocates `size` bytes aligned to `align`.
    pub alloc: fn(u64, u64) -> Option<u64>,
    /// Frees what `alloc` gave, with the same size and alignment.
    pub free: fn(u64, u64, u64),
}

/// Why the ITS could not be brought up or used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsError {
    /// No frames for its tables.
    NoMemory,
    /// `GITS_TYPER` reports no physical LPIs.
    NotPhysical,
    /// `init_cpu` before `init` or without a redistributor.
    NotReady,
    /// This CPU's redistributor has no LPIs, or has them enabled already
    /// (its tables cannot be changed then).
    RedistributorLpis,
    /// The ITS did not become quiescent, or its command queue did not
    /// advance.
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

/// The memory of the ITS's tables and command queue, by physical address.
pub trait ItsMemory {
    /// Allocates `size` bytes aligned to `align` (contents undefined).
    fn alloc(&self, size: u64, align: u64) -> Option<u64>;
    /// Frees what `alloc` gave, with the same size and alignment.
    fn free(&self, pa: u64, size: u64, align: u64);
    /// Zeroes `[pa, pa + len)`.
    ///
    /// # Safety
    /// The range is inside memory `alloc` gave and that is not freed.
    unsafe fn zero(&self, pa: u64, len: u64);
    /// Sets every byte of `[pa, pa + len)` to `byte`.
    ///
    /// # Safety
    /// As for [`ItsMemory::zero`].
    unsafe fn fill(&self, pa: u64, len: u64, byte: u8);
    /// Writes the 32-byte `command` at `pa`.
    ///
    /// # Safety
    /// As for [`ItsMemory::zero`], 32 bytes from `pa`.
    unsafe fn write_command(&self, pa: u64, command: &[u64; 4]);
    /// Cleans `[pa, pa + len)` to the point of coherency.
    fn clean(&self, pa: u64, len: u64);
    /// `DSB ISH`: the memory writes before it are seen before the register
    /// accesses after it.
    fn dsb_ish(&self);
}

/// The host LPIs the driver hands to devices' events, as contiguous runs.
pub trait LpiRuns {
    /// A pool of `size` LPIs, all free.
    fn with_size(size: u32) -> Self;
    /// Takes `count` contiguous LPIs: the first one's INTID, or `None`.
    fn take(&mut self, count: u32) -> Option<u32>;
    /// Gives back the run of `count` LPIs from `first`.
    fn give_back(&mut self, first: u32, count: u32);
}

/// A device mapped by [`HostIts::map_device`]: its ITT.
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

/// The ITS once [`HostIts::init`] set it up.
pub struct HostIts<F, M, P> {
    frame: F,
    memory: M,
    features: ItsFeatures,
    properties: u64,
    wait_polls: u32,
    queue: Mutex<Queue>,
    pool: Mutex<P>,
}

impl<F: GicFrame, M: ItsMemory, P: LpiRuns> HostIts<F, M, P> {
    /// Sets up the ITS at `frame` and the host LPI property table for a
    /// pool of `lpis` LPIs (module doc), with a collection table for
    /// `collections` CPUs, its memory from `memory`; every wait gives up
    /// after `wait_polls` reads.
    pub fn init(
        frame: F,
        memory: M,
        lpis: u32,
        collections: u64,
        wait_polls: u32,
    ) -> Result<Self, ItsError> {
        let features = ItsFeatures::from_typer(frame.read64(gits::TYPER));
        if !features.physical {
            return Err(ItsError::NotPhysical);
        }
        frame.write32(gits::CTLR, 0);
        let mut polls = 0;
        while frame.read32(gits::CTLR) & gits::CTLR_QUIESCENT == 0 {
            polls += 1;
            if polls > wait_polls {
                return Err(ItsError::Stalled);
            }
            core::hint::spin_loop();
        }
        for n in 0..8 {
            let at = gits::BASER0 + 8 * n;
            let read = frame.read64(at);
            let (kind, entry_size) = regs::baser_kind(read);
            let entries = match kind {
                TYPE_DEVICES => 1u64 << features.device_bits,
                TYPE_COLLECTIONS => collections,
                _ => continue,
            };
            let pages = regs::table_pages(entries, entry_size);
            let table = zeroed_frames(&memory, pages * regs::PAGE, regs::PAGE)?;
            frame.write64(at, regs::baser_value(read, table, pages));
        }
        let queue = zeroed_frames(&memory, QUEUE_BYTES, regs::PAGE)?;
        frame.write64(gits::CBASER, regs::cbaser_value(queue));
        frame.write64(gits::CWRITER, 0);
        let properties = memory
            .alloc(PROPERTY_TABLE_BYTES, regs::PAGE)
            .ok_or(ItsError::NoMemory)?;
        // SAFETY: `alloc` just gave these `PROPERTY_TABLE_BYTES`; the pool's
        // bytes are a prefix of them (`lpis` is at most that many).
        unsafe {
            memory.fill(properties, PROPERTY_TABLE_BYTES, 0);
            memory.fill(
                properties,
                u64::from(lpis).min(PROPERTY_TABLE_BYTES),
                LPI_PROPERTY,
            );
        }
        memory.clean(properties, PROPERTY_TABLE_BYTES);
        frame.write32(gits::CTLR, gits::CTLR_ENABLED);
        Ok(Self {
            frame,
            memory,
            features,
            properties,
            wait_polls,
            queue: Mutex::new(Queue {
                base: queue,
                write: 0,
                devices: Vec::new(),
            }),
            pool: Mutex::new(P::with_size(lpis)),
        })
    }

    /// The ITS's frame.
    pub fn frame(&self) -> &F {
        &self.frame
    }

    /// DeviceID bits the ITS covers.
    pub fn device_bits(&self) -> u32 {
        self.features.device_bits
    }

    /// Every CPU (after its GIC part): LPIs on at its redistributor `rd`
    /// (at physical address `rd_address`), and collection `index` mapped to
    /// it. Returns the CPU's target, for [`HostIts::map_device`].
    pub fn init_cpu(&self, index: u16, rd: &F, rd_address: u64) -> Result<u64, ItsError> {
        let typer = rd.read64(gicr_lpi::TYPER);
        if !regs::has_lpis(typer) || rd.read32(gicr_lpi::CTLR) & gicr_lpi::CTLR_ENABLE_LPIS != 0 {
            return Err(ItsError::RedistributorLpis);
        }
        let pending = zeroed_frames(&self.memory, PENDING_TABLE_BYTES, PENDING_TABLE_ALIGN)?;
        rd.write64(gicr_lpi::PROPBASER, regs::propbaser_value(self.properties));
        rd.write64(gicr_lpi::PENDBASER, regs::pendbaser_value(pending));
        self.memory.dsb_ish();
        let ctlr = rd.read32(gicr_lpi::CTLR);
        rd.write32(gicr_lpi::CTLR, ctlr | gicr_lpi::CTLR_ENABLE_LPIS);
        self.memory.dsb_ish();
        let target = regs::target_of(self.features.pta, rd_address, typer);
        self.submit(&[regs::mapc(index, target), regs::sync(target)])?;
        Ok(target)
    }

    /// Queues `commands` and waits until the ITS has run them (module doc).
    fn submit(&self, commands: &[[u64; 4]]) -> Result<(), ItsError> {
        let mut queue = self.queue.lock();
        let slots = (QUEUE_BYTES / COMMAND_BYTES) as usize - 1;
        for batch in commands.chunks(slots) {
            for command in batch {
                let at = queue.base + queue.write;
                // SAFETY: `at` is a 32-byte slot of the ring `init` took;
                // the ITS reads only slots between CREADR and CWRITER, and
                // this one is not yet published.
                unsafe { self.memory.write_command(at, command) };
                self.memory.clean(at, COMMAND_BYTES);
                queue.write = (queue.write + COMMAND_BYTES) % QUEUE_BYTES;
            }
            self.memory.dsb_ish();
            self.frame.write64(gits::CWRITER, queue.write);
            let mut polls = 0;
            loop {
                let creadr = self.frame.read64(gits::CREADR);
                if creadr & gits::QUEUE_OFFSET == queue.write {
                    break;
                }
                polls += 1;
                if creadr & gits::CREADR_STALLED != 0 || polls > self.wait_polls {
                    return Err(ItsError::Stalled);
                }
                core::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// Maps DeviceID `device` with `events` (a power of two) events, event
    /// `e` to host LPI `first + e`, in collection `cpu`, whose target
    /// [`HostIts::init_cpu`] returned. Returns `first`, or `None` when the
    /// DeviceID is out of range, the pool has no run that long, memory is
    /// short or the commands fail.
    pub fn map_device(&self, device: u32, events: u32, cpu: u16, target: u64) -> Option<u32> {
        if u64::from(device) >= 1 << self.features.device_bits {
            return None;
        }
        let first = self.pool.lock().take(events)?;
        let itt_bytes = self.features.itt_bytes(events);
        let Ok(itt) = zeroed_frames(&self.memory, itt_bytes, regs::PAGE) else {
            self.pool.lock().give_back(first, events);
            return None;
        };
        let mut commands = Vec::with_capacity(events as usize + 2);
        commands.push(regs::mapd(device, events, itt, true));
        commands.extend((0..events).map(|e| regs::mapti(device, e, first + e, cpu)));
        commands.push(regs::sync(target));
        if let Err(e) = self.submit(&commands) {
            log::warn!("host ITS: mapping DeviceID {device:#x}: {e}");
            self.memory.free(itt, itt_bytes, regs::PAGE);
            self.pool.lock().give_back(first, events);
            return None;
        }
        self.queue.lock().devices.push(MappedDevice {
            device,
            itt,
            itt_bytes,
        });
        Some(first)
    }

    /// Unmaps DeviceID `device` (mapped by [`HostIts::map_device`] with LPIs
    /// `first..first + events`), syncing on `target`, and gives its LPIs and
    /// ITT back.
    pub fn unmap_device(&self, device: u32, first: u32, events: u32, target: u64) {
        if let Err(e) = self.submit(&[regs::mapd(device, 2, 0, false), regs::sync(target)]) {
            log::warn!("host ITS: unmapping DeviceID {device:#x}: {e}");
        }
        let mapped = {
            let mut queue = self.queue.lock();
            let at = queue.devices.iter().position(|d| d.device == device);
            at.map(|at| queue.devices.swap_remove(at))
        };
        if let Some(mapped) = mapped {
            self.memory.free(mapped.itt, mapped.itt_bytes, regs::PAGE);
        }
        self.pool.lock().give_back(first, events);
    }
}

/// `size` bytes of zeroed, cleaned frames aligned to `align`.
fn zeroed_frames(memory: &impl ItsMemory, size: u64, align: u64) -> Result<u64, ItsError> {
    let pa = memory.alloc(size, align).ok_or(ItsError::NoMemory)?;
    // SAFETY: `alloc` just gave `size` bytes, which the allocator hands out
    // in whole pages.
    unsafe { memory.zero(pa, size.next_multiple_of(regs::PAGE)) };
    memory.clean(pa, size);
    Ok(pa)
}
