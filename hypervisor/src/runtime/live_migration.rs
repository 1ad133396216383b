//! Live migration of a running VM into a waiting one (`start=0` in its
//! `vm.conf`), with the algorithm of `vm::migration_plan`: pre-copy with dirty
//! logging (`runtime::dirty_log`) until the rest fits the downtime limit at
//! the measured copy rate, throttling a source that dirties faster than
//! that (`Vm::migration_throttle`, which its vCPUs obey between exits);
//! stop-and-copy with the vCPUs' whole state (`vm::vcpu_state`, captured by
//! the source's parked vCPUs on their own CPUs, asked before the pause so
//! that one kick brings each vCPU out of its guest to park and capture),
//! which then help copy the last dirty pages when that copy is long
//! (`Vm::stop_copy`, [`help_stop_copy`]); a byte-for-byte
//! check of the destination's memory when asked
//! ([`MigrationOptions::verify`]); then the destination starts and the
//! source ends. Before the first copy, both VMs' boot RAM is zeroed where
//! their guests have not used it yet (`vm::lazy_zero`), so the copies and
//! the check see what the guests see.
//!
//! # The source's end, after the start
//!
//! The CPU that runs a migration is the destination's vCPU 0, which
//! starts only when [`run`] returns, and the source's end means console
//! lines (its counters, the reason) that take milliseconds at a UART. So
//! the source is only marked ending (`Vm::end_migrated`), the
//! destination's vCPUs are released, then the source's are kicked and
//! halt (`Vm::wake_to_end`), and the first
//! source vCPU to halt turns the migration's dirty logging off and prints
//! the report line [`run`] left with it and the source's end
//! (`Vm::report_end_left_to_vcpus`). The downtime runs from the pause
//! until this CPU returns to start the destination's vCPU 0, the last of
//! its vCPUs to be released.
//!
//! # Devices
//!
//! The VMs must have the same virtio devices (kinds, order, disk size and
//! read-only setting), checked when the migration is requested. Once the
//! source is paused and its vCPUs parked, each device's output is drained
//! and its state taken (features, status, queue addresses and indices,
//! the model's backlog and counters; a blk request never spans accesses),
//! before the last dirty pages are harvested; frames and keys for the
//! paused source are dropped or kept in the backlog, never written into
//! its memory. The destination's devices take those states before it
//! runs, its net device gets the source's switch port (learned MACs stay),
//! and a device whose interrupt status was pending gets its SPI latched
//! once.
//!
//! # Where it runs
//!
//! [`request`] (the console monitor's `migrate`, from interrupt context with
//! the console lock held, or the control interface) only checks and posts
//! the job to the destination; the destination's vCPU 0 carries it out on
//! its own CPU ([`run`], from `runtime::vcpu_cycle` while that vCPU waits for its
//! start), so the copies never hold the console and the source runs on its
//! CPUs meanwhile.

use crate::devices::vgic::VcpuSet;
use crate::devices::virtio::mmio_transport::{Effects, SnapshotError};
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::device_hub::DeviceHub;
use crate::runtime::dirty_log;
use crate::runtime::virtio_devices::{DeviceSnapshot, Transport, VirtioDevice};
use crate::runtime::virtio_io;
use crate::runtime::vm_instance::Vm;
use crate::runtime::vm_ops::{self, VmOpError};
use crate::runtime::{Hardware, micros_since};
use crate::vm::migration_plan::{
    CopyChunk, CopyJob, MigrationOptions, MigrationReport, Next, PrecopyPlan, RoundFigures,
    SPINS_PER_CLOCK_READ,
};
use crate::vm::power::{BootRequest, PowerState};
use crate::vm::run_state::RunStateError;
use crate::vm::vcpu_state::MigrationBlocker;
use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::Ordering;
use memslot::{PAGE_SHIFT, SlotFlags, SlotId, SlotSpec};

/// Why a migration was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrateError {
    /// Source and destination are the same VM.
    SameVm,
    /// The destination is not a waiting destination (`start=0`, not
    /// migrated into yet).
    NotWaiting,
    /// A migration into the destination is posted already.
    Busy,
    /// The source is ending, restarting, or itself a waiting destination.
    SourceNotRunning,
    /// The VMs differ in vCPUs or RAM.
    Shape(&'static str),
    /// Something of the source's state cannot be carried.
    Blocked(MigrationBlocker),
    /// A memslot or dirty-log operation failed.
    Op(VmOpError),
    /// The source could not be paused.
    Pause(RunStateError),
    /// vCPU `.0` of the source did not hand over its state in time.
    CaptureTimeout(usize),
    /// Pages of the destination differ from the source after the copy.
    Differences(u64),
    /// The destination's virtio device `.0` refused the source's state.
    Device(usize, SnapshotError),
}

impl fmt::Display for MigrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SameVm => f.write_str("source and destination are the same VM"),
            Self::NotWaiting => f.write_str(
                "the destination is not waiting for a migration (start=0 in its vm.conf, not migrated into yet)",
            ),
            Self::Busy => f.write_str("a migration into the destination is under way"),
            Self::SourceNotRunning => f.write_str("the source is not running"),
            Self::Shape(what) => write!(f, "the VMs differ: {what}"),
            Self::Blocked(e) => write!(f, "{e}"),
            Self::Op(e) => write!(f, "{e}"),
            Self::Pause(e) => write!(f, "pausing the source: {e}"),
            Self::CaptureTimeout(vcpu) => {
                write!(f, "vcpu{vcpu} of the source did not hand over its state")
            }
            Self::Differences(pages) => write!(
                f,
                "{pages} pages of the destination differ from the source after the copy"
            ),
            Self::Device(index, e) => write!(
                f,
                "virtio device {index} of the destination refused the source's state: {e}"
            ),
        }
    }
}

impl core::error::Error for MigrateError {}

impl From<VmOpError> for MigrateError {
    fn from(e: VmOpError) -> Self {
        Self::Op(e)
    }
}

/// How long the source's vCPUs have to hand over their state, in seconds.
const CAPTURE_WAIT_SECONDS: u64 = 5;

/// Checks a migration of `src` into `dst` with `options` and posts it to
/// `dst`'s vCPU 0 (see the module doc). Returns at once.
pub fn request<H: Hardware>(
    src: &'static Vm<H>,
    dst: &'static Vm<H>,
    options: MigrationOptions,
) -> Result<(), MigrateError> {
    if core::ptr::eq(src, dst) {
        return Err(MigrateError::SameVm);
    }
    if !dst.awaiting_migration.load(Ordering::Acquire) || dst.is_stopping() {
        return Err(MigrateError::NotWaiting);
    }
    if src.is_stopping() || src.awaiting_migration.load(Ordering::Acquire) {
        return Err(MigrateError::SourceNotRunning);
    }
    if src.vcpus != dst.vcpus {
        return Err(MigrateError::Shape("vCPU count"));
    }
    if src.ram != dst.ram {
        return Err(MigrateError::Shape("RAM size"));
    }
    if src.mte != dst.mte {
        return Err(MigrateError::Shape(
            "memory tagging (both VMs need the same mte= setting)",
        ));
    }
    if src.hw.gic_is_v2() {
        return Err(MigrateError::Blocked(MigrationBlocker::Gicv2));
    }
    if !src.passthrough.is_empty() || !dst.passthrough.is_empty() {
        return Err(MigrateError::Blocked(MigrationBlocker::Passthrough));
    }
    check_devices(src, dst)?;
    let mut job = dst.migration_job.lock();
    if job.is_some() {
        return Err(MigrateError::Busy);
    }
    *job = Some((src, options));
    drop(job);
    log::info!(
        "vm{} ({}) -> vm{} ({}): migration requested ({}, downtime limit {} us)",
        src.index,
        src.name,
        dst.index,
        dst.name,
        if options.verify {
            "verified"
        } else {
            "not verified"
        },
        options.downtime_limit_us
    );
    src.hw.send_event();
    dst.kick(0);
    Ok(())
}

/// Checks that `dst` has the virtio devices of `src` (its own `vm.conf`
/// must ask for the same kinds in the same order, and a disk of the same
/// size and read-only setting): a device's state fits only its own kind.
fn check_devices<H: Hardware>(src: &Vm<H>, dst: &Vm<H>) -> Result<(), MigrateError> {
    let roles = |vm: &Vm<H>| vm.virtio.iter().map(|d| d.role).collect::<Vec<_>>();
    if roles(src) != roles(dst) {
        return Err(MigrateError::Shape(
            "virtio devices (the destination's vm.conf must ask for the same console, net and disk devices)",
        ));
    }
    for (from, to) in src.virtio.iter().zip(dst.virtio.iter()) {
        let shape = |device: &VirtioDevice| match &*device.transport.lock() {
            Transport::Blk(t) => {
                let state = t.snapshot().device;
                Some((state.capacity, state.read_only))
            }
            _ => None,
        };
        if shape(from) != shape(to) {
            return Err(MigrateError::Shape(
                "virtio-blk disk size or read-only setting",
            ));
        }
    }
    Ok(())
}

/// The source is paused and its vCPUs parked: every device's output is
/// drained (console bytes written out, frames forwarded; no frame or key
/// reaches the source's memory any more, `runtime::virtio_io`), then each
/// device's state is taken. Before the last harvest of dirty pages, so the
/// drain's writes (used rings) are copied.
fn quiesce_devices<H: Hardware>(src: &Vm<H>) -> Vec<DeviceSnapshot> {
    let handle = src.collector.register();
    // For the frames drained into other VMs: one handle each for the drain.
    let peers = CollectorHandles::new();
    (0..src.virtio.len())
        .filter_map(|index| {
            let device = src.virtio.get(index)?;
            let drain = Effects {
                output_ready: true,
                ..Effects::default()
            };
            let _ = virtio_io::with_memory(src, &handle, |mem| {
                virtio_io::settle(src, index, None, mem, drain, &peers)
            });
            Some(device.transport.lock().snapshot())
        })
        .collect()
}

/// Puts the source's device states into the destination's devices: the
/// one step of the hand-over that can fail (a state the device refuses),
/// so it comes before anything of the source is given away.
fn restore_devices<H: Hardware>(
    dst: &Vm<H>,
    snapshots: &[DeviceSnapshot],
) -> Result<(), MigrateError> {
    for (index, (device, snapshot)) in dst.virtio.iter().zip(snapshots).enumerate() {
        device
            .transport
            .lock()
            .restore(snapshot)
            .map_err(|e| MigrateError::Device(index, e))?;
    }
    Ok(())
}

/// After [`restore_devices`] and the vgic's hand-over: moves the switch
/// ports over and latches each device's SPI whose interrupt status was
/// pending.
fn hand_over_devices<H: Hardware>(src: &Vm<H>, dst: &Vm<H>, snapshots: &[DeviceSnapshot]) {
    let switch = src.device_hub.switch();
    for (from, to) in src.virtio.iter().zip(dst.virtio.iter()) {
        let (Some(from), Some(to)) = (&from.net, &to.net) else {
            continue;
        };
        let Some(port) = from.port.lock().take() else {
            continue;
        };
        if let Some(stale) = to.port.lock().replace(port) {
            let _ = switch.detach(stale);
        }
        // The port is the source's, just taken: it exists.
        let _ = switch.move_port(port, DeviceHub::<H>::owner_of(dst));
    }
    let mut kicks = VcpuSet::EMPTY;
    for (device, snapshot) in dst.virtio.iter().zip(snapshots) {
        if snapshot.interrupt_status() != 0
            && let Ok(more) = dst.vgic.lock().inject_spi_edge(device.intid())
        {
            kicks = kicks.union(more);
        }
    }
    virtio_io::kick_all(dst, kicks);
}

/// Carries out the migration of `src` into `dst` with `options` on `dst`'s
/// vCPU 0's CPU, and says how it went.
pub fn run<H: Hardware>(src: &'static Vm<H>, dst: &'static Vm<H>, options: MigrationOptions) {
    let prefix = format!(
        "vm{} ({}) -> vm{} ({})",
        src.index, src.name, dst.index, dst.name
    );
    match migrate(src, dst, options, &mut |_| {}) {
        // Printed with the source's end, by its first vCPU to halt: this
        // CPU is the destination's vCPU 0, which starts once this returns.
        Ok(report) => src.log_before_end_report(format!("{prefix}: migrated: {report}")),
        Err(e) => log::error!("{prefix}: migration failed, the source runs on: {e}"),
    }
}

/// A source slot and where its copy lives in the destination.
struct SlotPair {
    spec: SlotSpec,
    dst_backing: u64,
    /// Its dirty log is on for the migration.
    logging: bool,
}

/// How the source's pages are copied.
#[derive(Clone, Copy, Debug)]
struct PageCopy {
    /// Stage 2 forces write-back (FEAT_S2FWB): no cache maintenance.
    /// Without it the guest may run with caches off, so both sides are
    /// cleaned to the point of coherency around the copy.
    fwb: bool,
    /// The VM has memory tagging: the pages' allocation tags are copied
    /// with their data.
    tags: bool,
}

impl PageCopy {
    /// How pages of `vm` are copied.
    fn of<H: Hardware>(vm: &Vm<H>) -> Self {
        Self {
            fwb: vm.fwb,
            tags: vm.mte,
        }
    }

    /// Copies `len` bytes (whole pages) at host address `from` to `to`.
    fn copy<H: Hardware>(self, hw: &H, from: usize, to: usize, len: usize) {
        if !self.fwb {
            hw.clean_inval_dcache_to_poc(from, len);
        }
        // SAFETY: both ranges are pages of slots' backings (host RAM,
        // identity mapped), distinct VMs' memory, so they do not overlap;
        // the destination's vCPUs do not run yet.
        unsafe { core::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, len) };
        if self.tags {
            hw.copy_tags(from, to, len);
        }
        if !self.fwb {
            hw.clean_inval_dcache_to_poc(to, len);
        }
    }
}

/// Copies `pages` pages from page `first` of `pair`'s source backing to the
/// destination's.
fn copy_pages<H: Hardware>(hw: &H, pair: &SlotPair, first: u64, pages: u64, how: PageCopy) {
    let offset = first << PAGE_SHIFT;
    let len = (pages << PAGE_SHIFT) as usize;
    let from = (pair.spec.backing.0 + offset) as usize;
    let to = (pair.dst_backing + offset) as usize;
    how.copy(hw, from, to, len);
}

/// Harvests `pair`'s dirty log into `pending` (ORed in, one bit a page);
/// returns how many pages the log reported.
fn harvest<H: Hardware>(
    src: &Vm<H>,
    pair: &SlotPair,
    pending: &mut [u64],
) -> Result<u64, MigrateError> {
    if !pair.logging {
        return Ok(0);
    }
    let mut bits = vec![0u64; pending.len()];
    dirty_log::get(src, pair.spec.id, &mut bits)?;
    if src.memslots.dirty_log_mode().manual_protect {
        let mut mask = bits.clone();
        dirty_log::clear(src, pair.spec.id, 0, &mut mask)?;
    }
    let mut reported = 0;
    for (index, (have, word)) in pending.iter_mut().zip(&bits).enumerate() {
        let word = word & valid_pages(pair, index);
        reported += u64::from(word.count_ones());
        *have |= word;
    }
    Ok(reported)
}

/// The bits of bitmap word `index` that name pages of `pair`.
fn valid_pages(pair: &SlotPair, index: usize) -> u64 {
    let first = index as u64 * 64;
    match pair.spec.npages.saturating_sub(first) {
        0 => 0,
        left if left >= 64 => u64::MAX,
        left => (1u64 << left) - 1,
    }
}

/// The chunks of `pending` (one per non-zero word), taking the bits.
fn take_chunks(pairs: &[SlotPair], pending: &mut [Vec<u64>]) -> Vec<CopyChunk> {
    let mut chunks = Vec::new();
    for (pair, bits) in pairs.iter().zip(pending.iter_mut()) {
        for (index, word) in bits.iter_mut().enumerate() {
            if *word != 0 {
                let offset = (index << 6) << PAGE_SHIFT;
                chunks.push(CopyChunk {
                    from: pair.spec.backing.0 as usize + offset,
                    to: pair.dst_backing as usize + offset,
                    pages: core::mem::take(word),
                });
            }
        }
    }
    chunks
}

/// Copies the pages of `chunk`, a run of consecutive pages at a time.
fn copy_chunk<H: Hardware>(hw: &H, chunk: &CopyChunk, how: PageCopy) {
    let mut word = chunk.pages;
    while word != 0 {
        let first = word.trailing_zeros();
        let run = (word >> first).trailing_ones();
        word &= !(u64::MAX >> (64 - run) << first);
        let offset = (first as usize) << PAGE_SHIFT;
        let len = (run as usize) << PAGE_SHIFT;
        how.copy(hw, chunk.from + offset, chunk.to + offset, len);
    }
}

/// A paused vCPU of `vm` (on its own CPU) helps with the stop's copy of a
/// migration out of `vm`, if one is posted; returns the pages it copied.
pub fn help_stop_copy<H: Hardware>(vm: &Vm<H>) -> u64 {
    vm.stop_copy
        .help(&mut |chunk| copy_chunk(vm.hw, chunk, PageCopy::of(vm)))
}

/// Pages of `pair` whose copy differs from the source, in data or (`tags`)
/// in allocation tags. Compared a 64-bit word at a time (the no_std
/// `memcmp` goes byte by byte).
fn differences<H: Hardware>(hw: &H, pair: &SlotPair, tags: bool) -> u64 {
    let words = (1usize << PAGE_SHIFT) / 8;
    (0..pair.spec.npages)
        .filter(|&p| {
            let offset = (p << PAGE_SHIFT) as usize;
            // SAFETY: both pages are inside their slots' backings (host RAM,
            // identity mapped, page aligned); neither VM runs (the source is
            // paused, the destination not started).
            let (a, b) = unsafe {
                (
                    core::slice::from_raw_parts(
                        (pair.spec.backing.0 as usize + offset) as *const u64,
                        words,
                    ),
                    core::slice::from_raw_parts(
                        (pair.dst_backing as usize + offset) as *const u64,
                        words,
                    ),
                )
            };
            a.iter().zip(b).any(|(x, y)| x != y)
                || (tags
                    && !hw.tags_equal(a.as_ptr() as usize, b.as_ptr() as usize, 1 << PAGE_SHIFT))
        })
        .count() as u64
}

/// The destination's slots made to match the source's: a slot the
/// destination lacks is created (fresh backing), one it has must have the
/// same place and size.
fn pair_slots<H: Hardware>(src: &Vm<H>, dst: &Vm<H>) -> Result<Vec<SlotPair>, MigrateError> {
    let specs = vm_ops::slot_specs(src)?;
    let mut pairs = Vec::with_capacity(specs.len());
    for spec in specs {
        let dst_spec = match vm_ops::slot_spec(dst, spec.id)? {
            Some(have) if have.base_gfn == spec.base_gfn && have.npages == spec.npages => have,
            Some(_) => return Err(MigrateError::Shape("a memslot's place or size")),
            None => {
                let flags = spec.flags.difference(SlotFlags::LOG_DIRTY);
                vm_ops::create_slot(dst, spec.id, spec.base_gfn, spec.npages, flags)?;
                vm_ops::slot_spec(dst, spec.id)?
                    .ok_or(MigrateError::Shape("a memslot could not be made"))?
            }
        };
        pairs.push(SlotPair {
            spec,
            dst_backing: dst_spec.backing.0,
            logging: !spec.flags.contains(SlotFlags::READ_ONLY),
        });
    }
    Ok(pairs)
}

/// The slots whose dirty logging the migration turns on (and off again):
/// the writable ones that did not log before it.
fn logged_by_migration(pairs: &[SlotPair]) -> Vec<SlotId> {
    pairs
        .iter()
        .filter(|p| p.logging && !p.spec.flags.contains(SlotFlags::LOG_DIRTY))
        .map(|p| p.spec.id)
        .collect()
}

/// Ends pre-copy after a failure: the throttle off, the migration's dirty
/// logging off again, keeping slots that logged before the migration
/// logging. (After a stop that succeeded the source's end does the
/// latter, `Vm::end_migrated`.)
fn stop_logging<H: Hardware>(src: &Vm<H>, pairs: &[SlotPair]) {
    src.migration_throttle.store(0, Ordering::Release);
    dirty_log::disable_slots(src, &logged_by_migration(pairs));
}

/// Lets the source run again after a failed stop-and-copy.
fn resume_source<H: Hardware>(src: &Vm<H>) {
    src.set_capture_requested(false);
    for state in src.vcpu_states.iter() {
        *state.lock() = None;
    }
    if let Err(e) = vm_ops::resume(src) {
        log::error!(
            "vm{}: could not resume after the failed migration: {e}",
            src.index
        );
    }
}

/// One pre-copy round is over: `round` (0 for the full copy) copied its
/// pages while the source runs. The source's guest keeps writing between
/// rounds; the host tests write for it here.
pub type RoundHook<'a> = dyn FnMut(u32) + 'a;

/// Migrates `src` into `dst` with `options` (see the module doc), calling
/// `after_round` after each pre-copy round.
pub(crate) fn migrate<H: Hardware>(
    src: &'static Vm<H>,
    dst: &'static Vm<H>,
    options: MigrationOptions,
    after_round: &mut RoundHook<'_>,
) -> Result<MigrationReport, MigrateError> {
    let hw = src.hw;
    let start = hw.counter_ticks();
    let how = PageCopy::of(src);
    let pairs = pair_slots(src, dst)?;
    // Both RAMs as their guests see them before any page is copied or
    // compared: what neither guest has used yet is zeroed now
    // (`vm::lazy_zero`); the source's vCPUs zero alongside, chunk by chunk.
    src.finish_zeroing();
    dst.finish_zeroing();
    for pair in pairs.iter().filter(|p| p.logging) {
        if let Err(e) = dirty_log::enable(src, pair.spec.id) {
            stop_logging(src, &pairs);
            return Err(e.into());
        }
    }
    let mut report = MigrationReport {
        downtime_limit_us: options.downtime_limit_us,
        verified: options.verify,
        ..MigrationReport::default()
    };
    // Round 0: everything, while the source runs.
    let mut last_harvest = hw.counter_ticks();
    for pair in &pairs {
        copy_pages(hw, pair, 0, pair.spec.npages, how);
    }
    let everything = pairs.iter().map(|p| p.spec.npages).sum();
    let mut figures = RoundFigures {
        copied_pages: everything,
        copy_us: micros_since(hw, last_harvest),
        ..RoundFigures::default()
    };
    after_round(0);
    report.pages_per_iteration.push(everything);
    let plan = PrecopyPlan::new(&options);
    let mut pending: Vec<Vec<u64>> = pairs
        .iter()
        .map(|p| vec![0u64; p.spec.npages.div_ceil(64) as usize])
        .collect();
    let mut throttle = 0;
    let mut round = 1;
    loop {
        let now = hw.counter_ticks();
        let mut dirty = 0;
        for (pair, bits) in pairs.iter().zip(pending.iter_mut()) {
            match harvest(src, pair, bits) {
                Ok(pages) => dirty += pages,
                Err(e) => {
                    stop_logging(src, &pairs);
                    return Err(e);
                }
            }
        }
        figures.dirty_pages = dirty;
        let frequency = u128::from(hw.counter_frequency().max(1));
        let ticks = u128::from(now.wrapping_sub(last_harvest));
        figures.dirty_us = (ticks * 1_000_000 / frequency) as u64;
        last_harvest = now;
        match plan.next(round, &figures, throttle) {
            Next::StopAndCopy { expected_us, .. } => {
                report.expected_stop_copy_us = expected_us;
                break;
            }
            Next::Iterate { throttle: next } => {
                throttle = next;
                report.throttle_percent = report.throttle_percent.max(next);
                src.migration_throttle.store(next, Ordering::Release);
            }
        }
        let copy_start = hw.counter_ticks();
        let chunks = take_chunks(&pairs, &mut pending);
        for chunk in &chunks {
            copy_chunk(hw, chunk, how);
        }
        figures.copied_pages = dirty;
        figures.copy_us = micros_since(hw, copy_start);
        report.pages_per_iteration.push(dirty);
        after_round(round);
        round += 1;
    }
    // Stop-and-copy (what the source's end needs made ready before).
    let end_reason = format!("migrated to vm{} ({})", dst.index, dst.name);
    let slots_to_unlog = logged_by_migration(&pairs);
    let paused_at = hw.counter_ticks();
    src.request_capture_at_pause();
    if let Err(e) = vm_ops::pause(src) {
        src.set_capture_requested(false);
        stop_logging(src, &pairs);
        return Err(MigrateError::Pause(e));
    }
    // vCPUs parked before the request (a VM the monitor had paused) wait
    // for a kick to see it.
    let missing = (0..src.vcpus).any(|vcpu| {
        src.power.state(vcpu) == PowerState::On && src.vcpu_states[vcpu].lock().is_none()
    });
    if missing {
        src.set_capture_requested(true);
    }
    let frequency = hw.counter_frequency();
    for vcpu in 0..src.vcpus {
        if src.power.state(vcpu) != PowerState::On {
            continue;
        }
        let waited = hw.counter_ticks();
        let mut spins = 0u32;
        while src.vcpu_states[vcpu].lock().is_none() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ)
                && hw.counter_ticks().wrapping_sub(waited) > CAPTURE_WAIT_SECONDS * frequency
            {
                stop_logging(src, &pairs);
                resume_source(src);
                return Err(MigrateError::CaptureTimeout(vcpu));
            }
            core::hint::spin_loop();
        }
        let blocked = src.vcpu_states[vcpu]
            .lock()
            .as_ref()
            .map_or(Ok(()), |state| state.check(vcpu, hw.vector_lengths()));
        if let Err(e) = blocked {
            stop_logging(src, &pairs);
            resume_source(src);
            return Err(MigrateError::Blocked(e));
        }
    }
    let devices = quiesce_devices(src);
    let copy_start = hw.counter_ticks();
    report.pause_us = micros_since(hw, paused_at);
    for (pair, bits) in pairs.iter().zip(pending.iter_mut()) {
        if let Err(e) = harvest(src, pair, bits) {
            stop_logging(src, &pairs);
            resume_source(src);
            return Err(e);
        }
    }
    // The source's paused vCPUs, woken, copy beside this CPU, unless this
    // CPU alone is done sooner than waking them takes (about what the
    // pause took to bring them out).
    let job = CopyJob::new(take_chunks(&pairs, &mut pending));
    report.stop_copy_helped = figures.copy_us_for(job.pages()) > report.pause_us;
    if report.stop_copy_helped {
        src.stop_copy.post_and_work(
            &job,
            || {
                hw.send_event();
                for vcpu in 0..src.vcpus {
                    src.kick(vcpu);
                }
            },
            &mut |chunk| copy_chunk(hw, chunk, how),
        );
    } else {
        job.work(&mut |chunk| copy_chunk(hw, chunk, how));
    }
    report.pages_per_iteration.push(job.pages());
    report.stop_copy_us = micros_since(hw, copy_start);
    if options.verify {
        let verify_start = hw.counter_ticks();
        report.differences = pairs
            .iter()
            .map(|pair| differences(hw, pair, how.tags))
            .sum();
        report.verify_us = micros_since(hw, verify_start);
        if report.differences != 0 {
            stop_logging(src, &pairs);
            resume_source(src);
            return Err(MigrateError::Differences(report.differences));
        }
    }
    // The devices and vCPUs: what can fail first; then the source's vgic
    // and UART backlog are moved, not copied (allocating a copy takes
    // hundreds of microseconds under emulation). Its vCPUs unloaded their
    // list registers at the capture and only halt from here on, so nothing
    // reads its vgic again; the state it gets instead is the destination's
    // reset one, with the same hardware links (both on this host's timers,
    // passed devices refused) and the same ITS, which is all a restart of
    // the source keeps.
    if let Err(e) = restore_devices(dst, &devices) {
        stop_logging(src, &pairs);
        resume_source(src);
        return Err(e);
    }
    core::mem::swap(&mut *dst.vgic.lock(), &mut *src.vgic.lock());
    hand_over_devices(src, dst, &devices);
    {
        let mut from = src.uart.lock();
        let mut to = dst.uart.lock();
        to.device = from.device.clone();
        to.backlog = core::mem::take(&mut from.backlog);
        to.irq_level = from.irq_level;
    }
    for vcpu in 0..src.vcpus {
        match src.power.state(vcpu) {
            PowerState::On => {
                let state = src.vcpu_states[vcpu].lock().take();
                if let Some(state) = state {
                    let request = BootRequest {
                        entry: state.pc,
                        context_id: state.x[0],
                    };
                    *dst.vcpu_states[vcpu].lock() = Some(state);
                    let _ = dst.power.request_on(vcpu, request);
                }
            }
            PowerState::OnPending => {
                if let Some(request) = src.power.pending_request(vcpu) {
                    let _ = dst.power.request_on(vcpu, request);
                }
            }
            PowerState::Off => {}
        }
    }
    src.set_capture_requested(false);
    src.migration_throttle.store(0, Ordering::Release);
    dst.awaiting_migration.store(false, Ordering::Release);
    hw.send_event();
    for vcpu in 1..dst.vcpus {
        dst.kick(vcpu);
    }
    // The source's end (its console line, counters, and turning its
    // migration's dirty logging off) is left to its first vCPU to halt,
    // on its own CPU: marked ending here, its parked vCPUs woken once the
    // destination's are (one woken meanwhile by its timer finds the VM
    // still paused and parks again).
    let _ = src.end_migrated(end_reason, slots_to_unlog);
    src.wake_to_end();
    // This CPU is the destination's vCPU 0: it starts when this returns.
    report.downtime_us = micros_since(hw, paused_at);
    report.finish_us = report
        .downtime_us
        .saturating_sub(report.pause_us + report.stop_copy_us + report.verify_us);
    report.total_us = micros_since(hw, start);
    Ok(report)
}
