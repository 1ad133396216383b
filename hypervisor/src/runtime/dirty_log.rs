//! Dirty logging of a VM's memslot, driven from outside the VM (the control
//! interface and the console monitor), with KVM arm64's behaviour as the
//! reference. The fault side is `stage2::fault` ("Dirty logging"): while a
//! slot logs, faults map 4 KiB pages, reads map read-only, and a write marks
//! its page dirty inside the read-side section that made it writable.
//!
//! # Enabling
//!
//! [`enable`] begins an invalidation (`pgtable::invalidate`: a fault that
//! looked the slot up before the change retries instead of mapping a
//! writable block), publishes the slot's `LOG_DIRTY` flag (which gives it a
//! bitmap), write-protects the slot's IPA range under the MMU's write side
//! and flushes it with **one** range invalidation scoped to the slot, then
//! ends the invalidation. With eager splitting on ([`configure`]: a chunk
//! size, as KVM's `KVM_CAP_ARM_EAGER_SPLIT_CHUNK_SIZE`), it then splits the
//! slot's blocks into pages ahead of the guest's writes,
//! `Mmu::split_in_chunks`: one chunk at a time under the write side, one
//! barrier sequence per chunk, the page cache topped up outside the lock
//! between chunks, so vCPU faults run between chunks.
//!
//! # Collecting
//!
//! Without manual protection [`get`] takes the bitmap (bits cleared) and
//! write-protects exactly the reported pages under the write side, with one
//! range flush over their span. With manual protection [`get`] only copies
//! and [`clear`] clears the pages of a mask and write-protects exactly
//! those, again with one flush. [`collect`] (the console's) does either
//! whole, so every collection it makes starts the next interval. Taking the
//! bits before the write side is what makes the fault side's mark-inside-the-read-section enough (see
//! `stage2::fault`).
//!
//! # Disabling
//!
//! [`disable`] clears the flag (the bitmap goes). Nothing is remapped at
//! once: later permission faults on pages where a block fits map the block
//! again, collapsing the table (`stage2_collapses` counts them), with the
//! engine's flush of the collapsed span.

use alloc::vec::Vec;

use crate::runtime::vm_instance::Vm;
use crate::runtime::vm_ops::{self, VmOpError};
use crate::runtime::{Hardware, micros_since};
use core::sync::atomic::Ordering;
use memslot::{DirtyLogMode, MemslotError, PAGE_SHIFT, SlotFlags, SlotId, SlotSpec};
use pgtable::{PAGE_SIZE, PageCache, SplitStats};
use tlb::{Scope, TlbInvalidate};

/// What [`enable`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnableReport {
    /// Bytes of leaves write-protected (their span).
    pub protected: u64,
    /// The eager split's figures (zero with eager splitting off).
    pub split: SplitStats,
}

/// The live spec of slot `id` of `vm`.
fn live_spec<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<SlotSpec, VmOpError> {
    vm_ops::slot_spec(vm, id)?.ok_or(VmOpError::Memslot(MemslotError::NoSuchSlot(id)))
}

/// The IPA range of a slot.
fn ipa_range(spec: &SlotSpec) -> (u64, u64) {
    (spec.base_gfn.0 << PAGE_SHIFT, spec.npages << PAGE_SHIFT)
}

/// Sets the VM's dirty-log mode and eager split chunk size (0: off; else a
/// multiple of 4 KiB). The mode is refused while a slot logs.
pub fn configure<H: Hardware>(
    vm: &Vm<H>,
    mode: DirtyLogMode,
    eager_chunk: u64,
) -> Result<(), VmOpError> {
    if !eager_chunk.is_multiple_of(PAGE_SIZE) {
        return Err(VmOpError::BadChunk(eager_chunk));
    }
    let handle = vm.collector.register();
    vm.memslots
        .set_dirty_log_mode(&handle, mode)
        .map_err(VmOpError::Memslot)?;
    vm.eager_split_chunk.store(eager_chunk, Ordering::Release);
    Ok(())
}

/// Starts logging slot `id` of `vm` (see the module doc). Enabling a slot
/// that logs already changes nothing.
pub fn enable<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<EnableReport, VmOpError> {
    let spec = live_spec(vm, id)?;
    if spec.flags.contains(SlotFlags::LOG_DIRTY) {
        return Ok(EnableReport::default());
    }
    let started = vm.hw.counter_ticks();
    let handle = vm.collector.register();
    let token = vm.stage2.begin_invalidate();
    if let Err(e) = vm
        .memslots
        .set_flags(&handle, id, spec.flags.union(SlotFlags::LOG_DIRTY))
    {
        vm.stage2.cancel_invalidate(token);
        return Err(VmOpError::Memslot(e));
    }
    let (ipa, size) = ipa_range(&spec);
    let protected = {
        let mut writer = vm.stage2.write();
        let result = writer.write_protect(ipa, size);
        let protected = result.as_ref().map_or(0, |flush| flush.size);
        if let Ok(flush) = result {
            flush.flush(&vm.tlb);
        }
        writer.end_invalidate(token);
        if let Err(e) = result {
            return Err(VmOpError::Stage2(e));
        }
        protected
    };
    let chunk = vm.eager_split_chunk.load(Ordering::Acquire);
    let split = if chunk == 0 {
        SplitStats::default()
    } else {
        let mut cache = PageCache::with_capacity(0);
        let result =
            vm.stage2
                .split_in_chunks(ipa, size, chunk, &mut cache, &vm.tlb, |cache, pages| {
                    cache.top_up(&vm.hw.table_memory(), pages)
                });
        cache.release(&vm.hw.table_memory());
        result.map_err(VmOpError::Stage2)?
    };
    let micros = micros_since(vm.hw, started);
    log::info!(
        "vm{} ({}): dirty logging on for slot {}: {protected:#x} bytes write-protected, {} blocks split in {} chunks in {micros} us",
        vm.index,
        vm.name,
        id.get(),
        split.blocks_split,
        split.chunks
    );
    Ok(EnableReport { protected, split })
}

/// Stops logging slot `id` of `vm` (see the module doc). Disabling a slot
/// that does not log changes nothing.
pub fn disable<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<(), VmOpError> {
    let spec = live_spec(vm, id)?;
    if !spec.flags.contains(SlotFlags::LOG_DIRTY) {
        return Ok(());
    }
    let handle = vm.collector.register();
    vm.memslots
        .set_flags(&handle, id, spec.flags.difference(SlotFlags::LOG_DIRTY))
        .map(|_| ())
        .map_err(VmOpError::Memslot)
}

/// Turns off the dirty logging of each slot in `ids` (a migration's, at
/// its end); a slot that cannot be changed keeps logging, with a warning.
pub fn disable_slots<H: Hardware>(vm: &Vm<H>, ids: &[SlotId]) {
    for &id in ids {
        if let Err(e) = disable(vm, id) {
            log::warn!(
                "vm{}: dirty logging of slot {} stays on: {e}",
                vm.index,
                id.get()
            );
        }
    }
}

/// Write-protects the pages whose bits are set in `bits` (bit `i` is page
/// `first_page + i` of the slot) with one range flush over their span.
fn protect_pages<H: Hardware>(
    vm: &Vm<H>,
    spec: &SlotSpec,
    first_page: u64,
    bits: &[u64],
) -> Result<(), VmOpError> {
    let (base, _) = ipa_range(spec);
    let mut writer = vm.stage2.write();
    let mut span: Option<(u64, u64)> = None;
    let mut result = Ok(());
    for (word_index, &word) in bits.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            // One run of set bits at a time.
            let start = word.trailing_zeros() as u64;
            let run = (word >> start).trailing_ones() as u64;
            let taken = (((1u128 << run) - 1) << start) as u64;
            word &= !taken;
            let page = first_page + word_index as u64 * 64 + start;
            let ipa = base + (page << PAGE_SHIFT);
            match writer.write_protect(ipa, run << PAGE_SHIFT) {
                Ok(flush) if flush.size != 0 => {
                    let (lo, hi) = span.unwrap_or((flush.ipa, flush.ipa + flush.size));
                    span = Some((lo.min(flush.ipa), hi.max(flush.ipa + flush.size)));
                }
                Ok(_) => {}
                Err(e) => {
                    result = Err(VmOpError::Stage2(e));
                    break;
                }
            }
        }
    }
    // Whatever was protected before an error is flushed too.
    if let Some((lo, hi)) = span {
        vm.tlb.flush_range(
            writer.tlb_target(),
            lo,
            hi - lo,
            None,
            Scope::InnerShareable,
        );
    }
    result
}

/// Reports slot `id`'s dirty pages into `out` (one bit per page from the
/// slot's first; at least `npages.div_ceil(64)` words) and returns how many.
/// Without manual protection the reported pages are taken and
/// write-protected again (see the module doc).
pub fn get<H: Hardware>(vm: &Vm<H>, id: SlotId, out: &mut [u64]) -> Result<u64, VmOpError> {
    let spec = live_spec(vm, id)?;
    let handle = vm.collector.register();
    let count = vm
        .memslots
        .get_dirty_log(&handle, id, out)
        .map_err(VmOpError::Memslot)?;
    if !vm.memslots.dirty_log_mode().manual_protect && count != 0 {
        let words = spec.npages.div_ceil(64) as usize;
        protect_pages(vm, &spec, 0, &out[..words])?;
    }
    Ok(count)
}

/// Manual protection: clears the pages of `mask` (bit `i` is page
/// `first_page + i`, `first_page` a multiple of 64) from slot `id`'s log
/// and write-protects those that were dirty; returns how many.
pub fn clear<H: Hardware>(
    vm: &Vm<H>,
    id: SlotId,
    first_page: u64,
    mask: &mut [u64],
) -> Result<u64, VmOpError> {
    let spec = live_spec(vm, id)?;
    let handle = vm.collector.register();
    let count = vm
        .memslots
        .clear_dirty_log(&handle, id, first_page, mask)
        .map_err(VmOpError::Memslot)?;
    if count != 0 {
        protect_pages(vm, &spec, first_page, mask)?;
    }
    Ok(count)
}

/// A collection as a person asks for it (the console's `dirty get`): the
/// dirty pages of slot `id` since the last collection, one bit per page
/// from the slot's first, with the slot's first IPA. In either mode the
/// reported pages are taken from the log and write-protected again: [`get`],
/// and with manual protection [`clear`] of what it reported.
pub fn collect<H: Hardware>(vm: &Vm<H>, id: SlotId) -> Result<(u64, Vec<u64>), VmOpError> {
    let spec = live_spec(vm, id)?;
    let mut bitmap = alloc::vec![0u64; spec.npages.div_ceil(64) as usize];
    get(vm, id, &mut bitmap)?;
    if vm.memslots.dirty_log_mode().manual_protect {
        let mut mask = bitmap.clone();
        clear(vm, id, 0, &mut mask)?;
    }
    Ok((ipa_range(&spec).0, bitmap))
}

/// Changes the flags of slot `id` of `vm`: turning `LOG_DIRTY` on or off
/// enables or disables logging as above; other changes go to the memslots
/// as they are (which refuse toggling `READ_ONLY` on a live slot).
pub fn set_slot_flags<H: Hardware>(
    vm: &Vm<H>,
    id: SlotId,
    flags: SlotFlags,
) -> Result<(), VmOpError> {
    let spec = live_spec(vm, id)?;
    let logging = SlotFlags::LOG_DIRTY;
    match (spec.flags.contains(logging), flags.contains(logging)) {
        (false, true) if flags.difference(logging) == spec.flags => enable(vm, id).map(|_| ()),
        (true, false) if flags == spec.flags.difference(logging) => disable(vm, id),
        _ => {
            let handle = vm.collector.register();
            vm.memslots
                .set_flags(&handle, id, flags)
                .map(|_| ())
                .map_err(VmOpError::Memslot)
        }
    }
}
