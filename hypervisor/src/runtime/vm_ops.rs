//! Changes to a running VM made from outside it: pause / resume / stop,
//! memslot create / delete / move / flags and copies of its guest memory. The control interface
//! (`arch::control_target`) and the console monitor call these; both run them on a
//! CPU that is not running one of the target VM's vCPUs and that holds no
//! pin of the target's memslots nor a reader of its stage-2 MMU.
//!
//! # Memslots
//!
//! - Create: the backing is fresh host frames ([`Hardware::alloc_frames`]),
//!   zeroed before the slot is published, so no data of an earlier owner
//!   reaches the guest. Nothing is mapped: the VM's faults map the slot
//!   lazily, and its stage-2 page provider cleans each page to the point of
//!   coherency as it is mapped when FEAT_S2FWB is absent.
//! - Delete and move: `pgtable::delete_slot` / `pgtable::move_slot` (begin
//!   an invalidation, publish and wait for the memslot readers, unmap the old
//!   IPA range with one deferred range flush, end the invalidation): when
//!   they return no vCPU translates through the old slot and no fault in
//!   flight can map it. A deleted slot's backing then goes back to the frame
//!   allocator; if the unmap failed, leaves may remain, so the backing is
//!   kept (leaked) and the error reported. Before the unmap, whatever of
//!   the slot's backing the VM's boot RAM has not zeroed yet on first use
//!   (`vm::lazy_zero`) is zeroed, so the record never zeroes those frames
//!   again under a later owner or a reloaded kernel.
//! - Every slot's backing is allocated and freed with the alignment
//!   [`backing_align`] gives its size, so the frame allocator gets back the
//!   block it handed out.
//!
//! # Guest memory copies
//!
//! [`read_guest`] and [`write_guest`] translate the whole target range
//! through the target's memslots under one epoch guard (refusing a page in
//! no slot, or in a read-only slot for a write, before anything is copied),
//! then copy between the target's backing and the host spans given (the
//! caller's translated buffer), page piece by page piece, each piece's
//! chunk of the boot RAM zeroed first if the guest has not used it yet
//! (`vm::lazy_zero`). Without FEAT_S2FWB
//! a guest may access its memory non-cacheable (MMU or caches off), so guest
//! memory is cleaned and invalidated to the point of coherency before the
//! hypervisor reads it and after it writes it, on both sides; a write to the
//! target also invalidates the instruction cache for it and marks its pages
//! in the target's dirty log.

use crate::runtime::Hardware;
use crate::runtime::vm_instance::Vm;
use crate::vm::run_state::{Requested, RunStateError};
use alloc::vec::Vec;
use core::fmt;
use memslot::{Gfn, HostPhysAddr, MemslotError, PAGE_SHIFT, SlotFlags, SlotId, SlotSpec};
use pgtable::{PAGE_SIZE, PageCache, SLOT_UNMAP_CACHE_PAGES, SlotSyncError};

/// The host frame size.
pub const FRAME_SIZE: u64 = 4096;

/// The largest alignment of a slot's backing: 2 MiB, so that 2 MiB blocks
/// line up.
pub const MAX_BACKING_ALIGN: u64 = 2 << 20;

/// The alignment of the backing of a slot of `size` bytes: the size rounded
/// up to a power of two, at least a frame and at most [`MAX_BACKING_ALIGN`].
pub fn backing_align(size: u64) -> u64 {
    size.checked_next_power_of_two()
        .unwrap_or(MAX_BACKING_ALIGN)
        .clamp(FRAME_SIZE, MAX_BACKING_ALIGN)
}

/// Why a change to a VM or a copy of its memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmOpError {
    /// The memslots refused the change; nothing changed.
    Memslot(MemslotError),
    /// No host memory for a new slot's backing or for page tables.
    NoMemory,
    /// The slot was removed but its stage-2 unmap failed; its backing is
    /// kept, never reused.
    Unmap(pgtable::Error),
    /// A page of the guest range is in no slot (or, for a write, in a
    /// read-only slot); nothing was copied.
    NotMapped {
        /// The first such guest address.
        ipa: u64,
    },
    /// The guest range wraps or is longer than the host spans given.
    BadRange,
    /// A stage-2 operation (write-protect, split) failed.
    Stage2(pgtable::Error),
    /// An eager split chunk size that is not a multiple of 4 KiB.
    BadChunk(u64),
}

impl fmt::Display for VmOpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memslot(e) => write!(f, "memslots refused: {e}"),
            Self::NoMemory => write!(f, "no host memory left"),
            Self::Unmap(e) => write!(
                f,
                "slot removed but its stage-2 unmap failed ({e}); its backing is kept"
            ),
            Self::NotMapped { ipa } => write!(f, "guest address {ipa:#x} is not RAM of the VM"),
            Self::BadRange => write!(f, "the guest range wraps or does not match the buffer"),
            Self::Stage2(e) => write!(f, "stage 2: {e}"),
            Self::BadChunk(chunk) => {
                write!(f, "eager split chunk {chunk:#x} is not a multiple of 4 KiB")
            }
        }
    }
}

impl core::error::Error for VmOpError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Memslot(e) => Some(e),
            Self::Unmap(e) | Self::Stage2(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SlotSyncError> for VmOpError {
    fn from(e: SlotSyncError) -> Self {
        match e {
            SlotSyncError::Memslot(e) => Self::Memslot(e),
            // The cache is topped up to the size the call needs first.
            SlotSyncError::CacheTooSmall { .. } => Self::NoMemory,
            SlotSyncError::Unmap(e) => Self::Unmap(e),
        }
    }
}

/// Creates slot `id` of `npages` pages at `base_gfn` in `vm`, backed by
/// fresh zeroed host frames. The VM maps it on first touch.
pub fn create_slot<H: Hardware>(
    vm: &Vm<H>,
    id: SlotId,
    base_gfn: Gfn,
    npages: u64,
    flags: SlotFlags,
) -> Result<(), VmOpError> {
    let size = npages
        .checked_mul(FRAME_SIZE)
        .ok_or(VmOpError::Memslot(MemslotError::TooManyPages(npages)))?;
    let align = backing_align(size);
    let backing = vm.hw.alloc_frames(size, align).ok_or(VmOpError::NoMemory)?;
    // No data of an earlier owner may reach the guest.
    vm.hw.zero_memory(backing as usize, size as usize);
    let spec = SlotSpec {
        id,
        base_gfn,
        npages,
        backing: HostPhysAddr(backing),
        flags,
    };
    let handle = vm.collector.register();
    match vm.memslots.create(&handle, spec) {
        Ok(_) => Ok(()),
        Err(e) => {
            vm.hw.free_frames(backing, size, align);
            Err(VmOpError::Memslot(e))
        }
    }
}

/// A page cache holding what a slot unmap may need.
fn unmap_cache<H: Hardware>(hw: &H) -> Result<PageCache, VmOpError> {
    let mut cache = PageCache::with_capacity(SLOT_UNMAP_CACHE_PAGES);
    cache
        .top_up(&hw.table_memory(), SLOT_UNMAP_CACHE_PAGES)
        .map_err(|_| VmOpError::NoMemory)?;
    Ok(cache)
}

/// Deletes slot `id` of `vm` at run time and frees its backing (see the
/// module doc). Returns the deleted slot's spec.
pub fn delete_slot<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<SlotSpec, VmOpError> {
    let spec = unmap_slot(vm, id)?;
    let size = spec.npages << PAGE_SHIFT;
    vm.hw.free_frames(spec.backing.0, size, backing_align(size));
    Ok(spec)
}

/// Deletes slot `id` of `vm` as [`delete_slot`] does, but keeps its host
/// frames: the caller reuses them ([`recreate_slot`]).
pub fn unmap_slot<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<SlotSpec, VmOpError> {
    // Its frames leave the boot RAM's first-use zeroing (`vm::lazy_zero`)
    // zeroed: a later owner, or the same slot recreated and loaded with a
    // kernel again, finds nothing left to zero there.
    if let Some(spec) = slot_spec(vm, id)? {
        vm.ensure_zeroed(spec.backing.0, spec.npages << PAGE_SHIFT);
    }
    let mut cache = unmap_cache(vm.hw)?;
    let handle = vm.collector.register();
    let result = pgtable::delete_slot(&vm.memslots, &handle, &vm.stage2, id, &mut cache, &vm.tlb);
    cache.release(&vm.hw.table_memory());
    Ok(result?)
}

/// Creates a slot again over the frames [`unmap_slot`] kept (`spec`),
/// zeroed first: for a VM whose RAM must stay at its host address
/// (`ram=identity`).
pub fn recreate_slot<H: Hardware>(vm: &Vm<H>, spec: SlotSpec) -> Result<(), VmOpError> {
    let size = spec.npages << PAGE_SHIFT;
    vm.hw.zero_memory(spec.backing.0 as usize, size as usize);
    let handle = vm.collector.register();
    vm.memslots
        .create(&handle, spec)
        .map(|_| ())
        .map_err(VmOpError::Memslot)
}

/// Moves slot `id` of `vm` to `base_gfn` at run time (see the module doc).
/// Returns the spec the slot had before.
pub fn move_slot<H: Hardware>(
    vm: &Vm<H>,
    id: SlotId,
    base_gfn: Gfn,
) -> Result<SlotSpec, VmOpError> {
    let mut cache = unmap_cache(vm.hw)?;
    let handle = vm.collector.register();
    let result = pgtable::move_slot(
        &vm.memslots,
        &handle,
        &vm.stage2,
        id,
        base_gfn,
        &mut cache,
        &vm.tlb,
    );
    cache.release(&vm.hw.table_memory());
    Ok(result?)
}

/// A piece of host memory: `len` bytes at `host` (identity mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPiece {
    /// Its first byte.
    pub host: HostPhysAddr,
    /// Its length in bytes.
    pub len: u64,
}

/// Which way a copy between guest memory and host pieces goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// Guest memory to the host pieces.
    FromGuest,
    /// The host pieces to guest memory.
    ToGuest,
}

/// Copies `vm`'s guest memory from `ipa` on into `dst`, in order (see the
/// module doc). The pieces' lengths add up to the transfer.
pub fn read_guest<H: Hardware>(vm: &Vm<H>, ipa: u64, dst: &[HostPiece]) -> Result<(), VmOpError> {
    copy_guest(vm, ipa, dst, Direction::FromGuest)
}

/// Copies `src`, in order, into `vm`'s guest memory from `ipa` on, marking
/// the pages dirty and making the bytes visible to the VM's instruction
/// fetches (see the module doc).
pub fn write_guest<H: Hardware>(vm: &Vm<H>, ipa: u64, src: &[HostPiece]) -> Result<(), VmOpError> {
    copy_guest(vm, ipa, src, Direction::ToGuest)
}

fn copy_guest<H: Hardware>(
    vm: &Vm<H>,
    ipa: u64,
    pieces: &[HostPiece],
    direction: Direction,
) -> Result<(), VmOpError> {
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    let end = ipa.checked_add(total).ok_or(VmOpError::BadRange)?;
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm.memslots.slots(&guard).map_err(VmOpError::Memslot)?;
    // The whole range first: refuse before anything is copied.
    let mut at = ipa;
    while at < end {
        let slot = slots
            .find(Gfn::from_ipa(at))
            .filter(|s| direction == Direction::FromGuest || !s.is_read_only())
            .ok_or(VmOpError::NotMapped { ipa: at })?;
        at = (slot.end_gfn().0 << PAGE_SHIFT).min(end);
    }
    let hw = vm.hw;
    let maintain = !vm.fwb;
    let mut guest_at = ipa;
    for piece in pieces {
        let mut done = 0;
        while done < piece.len {
            let gfn = Gfn::from_ipa(guest_at);
            let offset = guest_at % PAGE_SIZE;
            let slot = slots
                .find(gfn)
                .ok_or(VmOpError::NotMapped { ipa: guest_at })?;
            let page = slot
                .translate(gfn)
                .ok_or(VmOpError::NotMapped { ipa: guest_at })?;
            let chunk = (PAGE_SIZE - offset).min(piece.len - done);
            // Never an earlier owner's bytes, and never zeroed after this write.
            vm.ensure_zeroed(page.0 + offset, chunk);
            let guest = (page.0 + offset) as usize;
            let host = (piece.host.0 + done) as usize;
            let len = chunk as usize;
            match direction {
                Direction::FromGuest => {
                    if maintain {
                        hw.clean_inval_dcache_to_poc(guest, len);
                        hw.clean_inval_dcache_to_poc(host, len);
                    }
                    // SAFETY: `guest` is backing of a slot of the pinned set
                    // (the grace period keeps it from being freed until the
                    // guard drops), `host` a span of the caller's buffer the
                    // dispatcher translated; both identity mapped RAM, `len`
                    // bytes within one page each.
                    unsafe { core::ptr::copy(guest as *const u8, host as *mut u8, len) };
                    if maintain {
                        hw.clean_inval_dcache_to_poc(host, len);
                    }
                }
                Direction::ToGuest => {
                    if maintain {
                        hw.clean_inval_dcache_to_poc(host, len);
                        hw.clean_inval_dcache_to_poc(guest, len);
                    }
                    // SAFETY: as above, the other way round.
                    unsafe { core::ptr::copy(host as *const u8, guest as *mut u8, len) };
                    if maintain {
                        hw.clean_inval_dcache_to_poc(guest, len);
                    }
                    hw.make_executable(guest, len);
                    slot.mark_dirty(gfn);
                }
            }
            done += chunk;
            guest_at += chunk;
        }
    }
    Ok(())
}

/// Writes `bytes` to host memory at `dst` (a span of a caller's buffer the
/// dispatcher translated), cleaning it to the point of coherency when `fwb`
/// is false.
pub fn write_host<H: Hardware>(hw: &H, dst: HostPhysAddr, bytes: &[u8], fwb: bool) {
    let addr = dst.0 as usize;
    if !fwb {
        hw.clean_inval_dcache_to_poc(addr, bytes.len());
    }
    // SAFETY: `dst` is identity-mapped RAM of the caller's translated buffer,
    // at least `bytes.len()` bytes long (one span), owned by the caller's VM.
    unsafe { core::ptr::copy(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    if !fwb {
        hw.clean_inval_dcache_to_poc(addr, bytes.len());
    }
}

/// Reads `out.len()` bytes of host memory at `src` (a translated span of a
/// caller's buffer), cleaned and invalidated to the point of coherency first
/// without FEAT_S2FWB (the caller may have written it non-cacheable).
pub fn read_host<H: Hardware>(hw: &H, src: HostPhysAddr, out: &mut [u8], fwb: bool) {
    let addr = src.0 as usize;
    if !fwb {
        hw.clean_inval_dcache_to_poc(addr, out.len());
    }
    // SAFETY: `src` is identity-mapped RAM of the caller's translated buffer,
    // at least `out.len()` bytes long (one span).
    unsafe { core::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) };
}

/// The specs of every memslot of `vm`, in one view of its published set.
pub fn slot_specs<H: Hardware>(vm: &Vm<H>) -> Result<Vec<SlotSpec>, VmOpError> {
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm.memslots.slots(&guard).map_err(VmOpError::Memslot)?;
    Ok(slots.iter().map(|slot| slot.spec()).collect())
}

/// The spec of memslot `id` of `vm`, if it exists.
pub fn slot_spec<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<Option<SlotSpec>, VmOpError> {
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm.memslots.slots(&guard).map_err(VmOpError::Memslot)?;
    Ok(slots.get(id).map(|slot| slot.spec()))
}

/// Pages in all of `vm`'s memslots, and how many slots it has (one view of
/// its published set).
pub fn slot_totals<H: Hardware>(vm: &Vm<H>) -> Result<(u64, u32), VmOpError> {
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm.memslots.slots(&guard).map_err(VmOpError::Memslot)?;
    Ok((slots.iter().map(|s| s.npages()).sum(), slots.len() as u32))
}

/// Pauses `vm` and returns once none of its vCPUs runs guest code
/// (`vm::run_state`, "Waiting for a pause"); pausing a paused VM succeeds.
/// Returns early if the VM is resumed or stopped meanwhile.
pub fn pause<H: Hardware>(vm: &Vm<H>) -> Result<(), RunStateError> {
    match vm.request_pause() {
        Ok(()) | Err(RunStateError::NotRunning(Requested::Paused)) => {}
        Err(e) => return Err(e),
    }
    while vm.run_state.get() == Requested::Paused && vm.run_state.in_guest() != 0 {
        core::hint::spin_loop();
    }
    Ok(())
}

/// Lets a paused `vm` run again; resuming a running VM succeeds, a stopped
/// one is refused.
pub fn resume<H: Hardware>(vm: &Vm<H>) -> Result<(), RunStateError> {
    if vm.is_stopping() {
        return Err(RunStateError::Stopped);
    }
    match vm.resume() {
        Ok(()) | Err(RunStateError::NotPaused(Requested::Running)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long [`stop`] waits for the VM's own CPU to carry the stop out, in
/// seconds.
pub const STOP_WAIT_SECONDS: u64 = 5;

/// Stops `vm` for good: its vCPUs stop it at their next look at the run
/// state (a kick forces one); stopping a stopped VM succeeds. Returns once
/// the VM's end is reported (`Vm::has_ended`), so that no output of the
/// stopped VM follows, or after [`STOP_WAIT_SECONDS`] (the stop stays
/// requested and happens when its CPU gets to it); says which.
pub fn stop<H: Hardware>(vm: &Vm<H>) -> StopWait {
    // `Stopped`: stopping or stopped already, which is what was asked.
    let _already = vm.request_stop();
    let frequency = vm.hw.counter_frequency();
    let start = vm.hw.counter_ticks();
    while !vm.has_ended() {
        if vm.hw.counter_ticks().wrapping_sub(start) > STOP_WAIT_SECONDS * frequency {
            return StopWait::Requested;
        }
        core::hint::spin_loop();
    }
    StopWait::Ended
}

/// How far [`stop`] saw the stop go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopWait {
    /// The VM has ended and reported it.
    Ended,
    /// Requested; the VM's CPU had not carried it out in time.
    Requested,
}
