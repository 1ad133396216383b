//! A VM's memslots: two sets, one published to readers, changed without ever
//! blocking them.
//!
//! Readers (vCPUs in the fault path) pin an epoch of the VM's
//! `crossbeam_epoch::Collector`, load the index of the active set and read it;
//! no lock, no write to shared memory (each vCPU keeps its own last-slot
//! cache).
//!
//! A writer (serialized by a spin lock) changes the slots like KVM's scalable
//! memslots, with both sets kept current incrementally:
//! 1. validate the request against the active set (nothing changes on error);
//! 2. wait until no reader can still see the inactive set: it was unpublished
//!    by the previous change, which deferred a "retired" mark to the epoch
//!    collector; usually that has run long before;
//! 3. replay the previous change on the inactive set, which was one change
//!    behind, then apply the new change to it and give it the next generation;
//! 4. publish it with one atomic store of the active index, and defer the
//!    "retired" mark for the set just unpublished.
//!
//! Each change is thus two O(log n) set updates plus one epoch hand-off,
//! instead of copying n slots; the writer waits only when changes come faster
//! than readers leave their epochs. Slots removed by the replay are freed then,
//! after the epoch, so a reader's `&Memslot` never dangles. A reader sees the
//! old set or the new one, each consistent, and generations only grow.
//!
//! # Grace period (delete and move)
//!
//! Publishing alone does not end the old set's life: a reader that pinned
//! before the store may still be translating through a slot the change
//! removed. [`Memslots::delete_synced`] and [`Memslots::move_synced`] (KVM's
//! `synchronize_srcu` after the memslot swap) publish and then wait, still
//! under the writer lock, until the deferred "retired" mark of the set they
//! unpublished has run: the epoch collector runs it only once every guard
//! pinned before the store has been dropped, and a guard pinned after the
//! store loads the new index. When they return, no reader holds, or can
//! obtain, a reference to the removed slot, so its backing may be unmapped
//! from stage 2 and then freed or reused. [`Memslots::synchronize`] is the
//! same wait on its own.
//!
//! The wait costs the fault path nothing: readers only pin and unpin, as
//! before. It costs the writer one epoch advance (every CPU pinned at the
//! store must unpin once), which it would otherwise pay at the next change.
//! It covers only what readers do while pinned; a fault that drops its guard
//! before installing a stage-2 leaf is covered by the MMU's invalidation
//! sequence instead (see `pgtable`'s memslot synchronisation).

use alloc::sync::Arc;
use core::sync::atomic::{AtomicU8, Ordering};

use crossbeam_epoch::{Collector, Guard, LocalHandle};

use crate::dirty::DirtyBitmap;
use crate::error::MemslotError;
use crate::set::MemslotSet;
use crate::slot::{Gfn, Memslot, SlotFlags, SlotId, SlotSpec};
use crate::sync_primitives::{AtomicU64, AtomicUsize, ProtocolCell, spin_wait};

/// How dirty logging behaves for a VM (KVM's manual-protect capability).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtyLogMode {
    /// `get_dirty_log` only copies; pages are cleaned (and re-protected by the
    /// caller) through `clear_dirty_log`.
    pub manual_protect: bool,
    /// Bitmaps start all-set when logging is enabled (needs `manual_protect`).
    pub initially_all_set: bool,
}

impl DirtyLogMode {
    /// Bit 0 `manual_protect`, bit 1 `initially_all_set` (as the control
    /// interface passes them).
    pub const fn bits(self) -> u8 {
        self.manual_protect as u8 | (self.initially_all_set as u8) << 1
    }

    /// The mode of [`bits`](Self::bits); other bits are ignored.
    pub const fn from_bits(bits: u8) -> Self {
        Self {
            manual_protect: bits & 1 != 0,
            initially_all_set: bits & 2 != 0,
        }
    }
}

/// What a [`Memslots::set_region`] call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// A new slot.
    Create,
    /// A slot removed.
    Delete,
    /// A slot moved in guest space (flags may have changed too).
    Move,
    /// Only the flags changed.
    FlagsOnly,
    /// The request matched the live slot: nothing was published.
    Unchanged,
}

/// One change, as applied to a set: remove a slot, then insert one.
#[derive(Clone, Debug)]
struct Change {
    remove: Option<SlotId>,
    insert: Option<Arc<Memslot>>,
}

impl Change {
    fn apply(&self, set: &mut MemslotSet) {
        if let Some(id) = self.remove {
            drop(set.remove(id));
        }
        if let Some(slot) = &self.insert {
            set.insert(slot.clone());
        }
    }
}

/// State only the writer touches, under the lock.
struct Writer {
    /// The change applied to the active set but not yet to the inactive one.
    pending: Option<Change>,
    /// The generation of the active set.
    generation: u64,
}

/// The memslots of one VM.
pub struct Memslots {
    collector: Collector,
    sets: [ProtocolCell<MemslotSet>; 2],
    /// Index in `sets` of the set readers see.
    active: AtomicUsize,
    writer: spin::Mutex<Writer>,
    /// The largest generation `g` such that no reader can still see the set
    /// that generation `g` replaced. Written by deferred functions.
    retired_through: Arc<AtomicU64>,
    /// The dirty-log mode ([`DirtyLogMode::bits`]); read and changed under
    /// `writer`'s lock.
    mode: AtomicU8,
}

// SAFETY: the sets in `ProtocolCell`s are shared with readers only through
// `&MemslotSet` while published (or while an epoch guard taken before their
// unpublishing is alive), and mutated only by the writer, under `writer`'s
// lock, after the epoch collector has confirmed no reader can see them (see
// `Memslots::wait_for_readers`). All other fields are `Sync`.
unsafe impl Sync for Memslots {}

impl Memslots {
    /// Empty memslots for a VM whose readers pin epochs of `collector`.
    pub fn new(collector: &Collector, mode: DirtyLogMode) -> Result<Self, MemslotError> {
        if mode.initially_all_set && !mode.manual_protect {
            return Err(MemslotError::InitiallySetNeedsManualProtect);
        }
        Ok(Self {
            collector: collector.clone(),
            sets: [
                ProtocolCell::new(MemslotSet::new()),
                ProtocolCell::new(MemslotSet::new()),
            ],
            active: AtomicUsize::new(0),
            writer: spin::Mutex::new(Writer {
                pending: None,
                generation: 0,
            }),
            retired_through: Arc::new(AtomicU64::new(0)),
            mode: AtomicU8::new(mode.bits()),
        })
    }

    /// The dirty-log mode.
    pub fn dirty_log_mode(&self) -> DirtyLogMode {
        DirtyLogMode::from_bits(self.mode.load(Ordering::Acquire))
    }

    /// Changes the dirty-log mode (KVM enables its manual-protect
    /// capability per VM the same way); refused while a slot logs, so that
    /// every live bitmap was made and is read under one mode.
    pub fn set_dirty_log_mode(
        &self,
        handle: &LocalHandle,
        mode: DirtyLogMode,
    ) -> Result<(), MemslotError> {
        self.check_handle(handle)?;
        if mode.initially_all_set && !mode.manual_protect {
            return Err(MemslotError::InitiallySetNeedsManualProtect);
        }
        let _writer = self.writer.lock();
        if let Some(slot) = self
            .active_set()
            .iter()
            .find(|slot| slot.dirty_bitmap().is_some())
        {
            return Err(MemslotError::LoggingActive(slot.id()));
        }
        self.mode.store(mode.bits(), Ordering::Release);
        Ok(())
    }

    /// The published set, readable for as long as `guard` stays pinned.
    /// Lock-free; this is the fault path's entry point.
    #[inline]
    pub fn slots<'a>(&'a self, guard: &'a Guard) -> Result<&'a MemslotSet, MemslotError> {
        if guard.collector() != Some(&self.collector) {
            return Err(MemslotError::ForeignCollector);
        }
        let index = self.active.load(Ordering::Acquire);
        // SAFETY: `index` was published with a release store after the set was
        // fully written; the set stays unchanged until every guard pinned
        // before its unpublishing (such as `guard`, which belongs to this
        // collector) is dropped, and the returned borrow cannot outlive `guard`.
        Ok(unsafe { self.sets[index].get() })
    }

    fn check_handle(&self, handle: &LocalHandle) -> Result<(), MemslotError> {
        if handle.collector() != &self.collector {
            return Err(MemslotError::ForeignCollector);
        }
        if handle.is_pinned() {
            return Err(MemslotError::WriterPinned);
        }
        Ok(())
    }

    /// The active set, for the writer. Only called with the writer lock held.
    fn active_set(&self) -> &MemslotSet {
        // SAFETY: the active set is never mutated while published, and only the
        // writer (whose lock the caller holds) publishes or mutates.
        unsafe { self.sets[self.active.load(Ordering::Relaxed)].get() }
    }

    /// Spins (pinning and flushing `handle` so the collector advances) until
    /// no reader can still see the inactive set.
    fn wait_for_readers(&self, handle: &LocalHandle, active_generation: u64) {
        while self.retired_through.load(Ordering::Acquire) < active_generation {
            let guard = handle.pin();
            guard.flush();
            drop(guard);
            spin_wait();
        }
    }

    /// Waits until no reader can still see a set older than the published
    /// one: every guard pinned before the last publication has been dropped.
    /// `handle` must not be pinned.
    pub fn synchronize(&self, handle: &LocalHandle) -> Result<(), MemslotError> {
        self.check_handle(handle)?;
        let writer = self.writer.lock();
        self.wait_for_readers(handle, writer.generation);
        Ok(())
    }

    /// Deletes slot `id`, then waits until no reader can still see it (see
    /// the module's "Grace period"). Returns the removed slot's spec and the
    /// generation without it.
    pub fn delete_synced(
        &self,
        handle: &LocalHandle,
        id: SlotId,
    ) -> Result<(SlotSpec, u64), MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        let old = self.live_spec(id)?;
        let generation = self.delete_locked(handle, &mut writer, id)?;
        self.wait_for_readers(handle, generation);
        Ok((old, generation))
    }

    /// Moves slot `id` to `base_gfn` as [`Memslots::move_slot`] does, then
    /// waits until no reader can still see it at its old place (see the
    /// module's "Grace period"). Returns the spec the slot had before and the
    /// generation that holds the move.
    pub fn move_synced(
        &self,
        handle: &LocalHandle,
        id: SlotId,
        base_gfn: Gfn,
    ) -> Result<(SlotSpec, u64), MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        let old = self.live_spec(id)?;
        if old.base_gfn == base_gfn {
            return Err(MemslotError::NotAMove(id));
        }
        let (_, generation) =
            self.update_locked(handle, &mut writer, SlotSpec { base_gfn, ..old })?;
        self.wait_for_readers(handle, generation);
        Ok((old, generation))
    }

    /// Validates and applies one change. Returns the new generation.
    fn commit(&self, handle: &LocalHandle, writer: &mut Writer, change: Change) -> u64 {
        self.wait_for_readers(handle, writer.generation);
        let inactive = 1 - self.active.load(Ordering::Relaxed);
        // SAFETY: `wait_for_readers` returned, so the deferred function that
        // runs only after every guard that could have seen this set is gone has
        // run; readers pinned since then load the other index. The writer lock
        // (held by the caller) excludes other writers.
        let set = unsafe { self.sets[inactive].get_mut() };
        if let Some(previous) = writer.pending.take() {
            previous.apply(set);
        }
        change.apply(set);
        let generation = writer.generation + 1;
        set.set_generation(generation);
        self.active.swap(inactive, Ordering::AcqRel);
        writer.generation = generation;
        writer.pending = Some(change);
        let guard = handle.pin();
        let retired = self.retired_through.clone();
        guard.defer(move || retired.fetch_max(generation, Ordering::Release));
        // Hand the deferred mark to the global queue now, so any CPU's
        // collection can run it, not only this handle's next one.
        guard.flush();
        generation
    }

    fn new_bitmap(&self, npages: u64) -> Arc<DirtyBitmap> {
        Arc::new(DirtyBitmap::new(
            npages,
            self.dirty_log_mode().initially_all_set,
        ))
    }

    fn check_guest_range(set: &MemslotSet, spec: &SlotSpec) -> Result<(), MemslotError> {
        let end = Gfn(spec.base_gfn.0 + spec.npages);
        match set
            .in_gfn_range(spec.base_gfn, end)
            .find(|s| s.id() != spec.id)
        {
            Some(other) => Err(MemslotError::GuestOverlap {
                id: spec.id,
                other: other.id(),
            }),
            None => Ok(()),
        }
    }

    /// Creates a slot. Returns the generation that holds it.
    pub fn create(&self, handle: &LocalHandle, spec: SlotSpec) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        spec.validate_shape()?;
        let mut writer = self.writer.lock();
        self.create_locked(handle, &mut writer, spec)
    }

    fn create_locked(
        &self,
        handle: &LocalHandle,
        writer: &mut Writer,
        spec: SlotSpec,
    ) -> Result<u64, MemslotError> {
        let set = self.active_set();
        if set.get(spec.id).is_some() {
            return Err(MemslotError::IdInUse(spec.id));
        }
        Self::check_guest_range(set, &spec)?;
        let bitmap = spec
            .flags
            .contains(SlotFlags::LOG_DIRTY)
            .then(|| self.new_bitmap(spec.npages));
        let slot = Arc::new(Memslot::new(&spec, bitmap));
        Ok(self.commit(
            handle,
            writer,
            Change {
                remove: None,
                insert: Some(slot),
            },
        ))
    }

    /// Deletes a slot. Returns the generation without it.
    pub fn delete(&self, handle: &LocalHandle, id: SlotId) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        self.delete_locked(handle, &mut writer, id)
    }

    fn delete_locked(
        &self,
        handle: &LocalHandle,
        writer: &mut Writer,
        id: SlotId,
    ) -> Result<u64, MemslotError> {
        if self.active_set().get(id).is_none() {
            return Err(MemslotError::NoSuchSlot(id));
        }
        Ok(self.commit(
            handle,
            writer,
            Change {
                remove: Some(id),
                insert: None,
            },
        ))
    }

    /// The current spec of slot `id` in the active set.
    fn live_spec(&self, id: SlotId) -> Result<SlotSpec, MemslotError> {
        self.active_set()
            .get(id)
            .map(|slot| slot.spec())
            .ok_or(MemslotError::NoSuchSlot(id))
    }

    /// Moves a slot to `base_gfn` in guest space (same size, backing and
    /// flags; a logging slot gets a fresh bitmap, as in KVM).
    pub fn move_slot(
        &self,
        handle: &LocalHandle,
        id: SlotId,
        base_gfn: Gfn,
    ) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        let spec = self.live_spec(id)?;
        let (_, generation) =
            self.update_locked(handle, &mut writer, SlotSpec { base_gfn, ..spec })?;
        Ok(generation)
    }

    /// Changes only the flags of a slot (dirty logging on or off; the
    /// read-only flag of a live slot cannot change).
    pub fn set_flags(
        &self,
        handle: &LocalHandle,
        id: SlotId,
        flags: SlotFlags,
    ) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        let spec = self.live_spec(id)?;
        let spec = SlotSpec { flags, ..spec };
        spec.validate_shape()?;
        let (_, generation) = self.update_locked(handle, &mut writer, spec)?;
        Ok(generation)
    }

    /// KVM's `SET_USER_MEMORY_REGION`: `npages == 0` deletes slot `spec.id`, an
    /// unknown id creates it, and for a live slot a new `base_gfn` moves it and
    /// new flags change them. Size, backing address and the read-only flag of
    /// a live slot cannot change. Returns what was done and the generation
    /// that holds the result.
    pub fn set_region(
        &self,
        handle: &LocalHandle,
        spec: SlotSpec,
    ) -> Result<(ChangeKind, u64), MemslotError> {
        self.check_handle(handle)?;
        let mut writer = self.writer.lock();
        if spec.npages == 0 {
            return Ok((
                ChangeKind::Delete,
                self.delete_locked(handle, &mut writer, spec.id)?,
            ));
        }
        spec.validate_shape()?;
        if self.active_set().get(spec.id).is_none() {
            return Ok((
                ChangeKind::Create,
                self.create_locked(handle, &mut writer, spec)?,
            ));
        }
        self.update_locked(handle, &mut writer, spec)
    }

    /// Moves and/or re-flags live slot `spec.id` (shape already validated).
    fn update_locked(
        &self,
        handle: &LocalHandle,
        writer: &mut Writer,
        spec: SlotSpec,
    ) -> Result<(ChangeKind, u64), MemslotError> {
        let set = self.active_set();
        let old = set.get(spec.id).ok_or(MemslotError::NoSuchSlot(spec.id))?;
        if old.npages() != spec.npages {
            return Err(MemslotError::SizeChange {
                id: spec.id,
                current: old.npages(),
                requested: spec.npages,
            });
        }
        if old.backing() != spec.backing {
            return Err(MemslotError::BackingChange(spec.id));
        }
        if old.is_read_only() != spec.flags.contains(SlotFlags::READ_ONLY) {
            return Err(MemslotError::ReadOnlyChange(spec.id));
        }
        let moved = old.base_gfn() != spec.base_gfn;
        if !moved && old.flags() == spec.flags {
            return Ok((ChangeKind::Unchanged, writer.generation));
        }
        if moved {
            spec.validate_shape()?;
            Self::check_guest_range(set, &spec)?;
        }
        let logging = spec.flags.contains(SlotFlags::LOG_DIRTY);
        let bitmap = match old.dirty_bitmap_arc() {
            Some(kept) if logging && !moved => Some(kept.clone()),
            _ if logging => Some(self.new_bitmap(spec.npages)),
            _ => None,
        };
        let slot = Arc::new(Memslot::new(&spec, bitmap));
        let generation = self.commit(
            handle,
            writer,
            Change {
                remove: Some(spec.id),
                insert: Some(slot),
            },
        );
        Ok((
            if moved {
                ChangeKind::Move
            } else {
                ChangeKind::FlagsOnly
            },
            generation,
        ))
    }

    /// Harvests slot `id`'s dirty log into `out` (one bit per page, from the
    /// slot's first page). Without manual protection the bits are cleared and
    /// the caller write-protects the reported pages again; with it the bits
    /// are only copied. Returns the number of dirty pages reported.
    pub fn get_dirty_log(
        &self,
        handle: &LocalHandle,
        id: SlotId,
        out: &mut [u64],
    ) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        let _writer = self.writer.lock();
        let slot = self
            .active_set()
            .get(id)
            .ok_or(MemslotError::NoSuchSlot(id))?;
        let bitmap = slot.dirty_bitmap().ok_or(MemslotError::NotLogging(id))?;
        if self.dirty_log_mode().manual_protect {
            bitmap.snapshot(out)
        } else {
            bitmap.take(out)
        }
    }

    /// Manual protection: clears the pages of `mask` from slot `id`'s dirty
    /// log (see [`DirtyBitmap::clear`]); on return `mask` holds the pages to
    /// write-protect again. Returns how many there are.
    pub fn clear_dirty_log(
        &self,
        handle: &LocalHandle,
        id: SlotId,
        first_page: u64,
        mask: &mut [u64],
    ) -> Result<u64, MemslotError> {
        self.check_handle(handle)?;
        if !self.dirty_log_mode().manual_protect {
            return Err(MemslotError::ManualProtectDisabled);
        }
        let _writer = self.writer.lock();
        let slot = self
            .active_set()
            .get(id)
            .ok_or(MemslotError::NoSuchSlot(id))?;
        let bitmap = slot.dirty_bitmap().ok_or(MemslotError::NotLogging(id))?;
        bitmap.clear(first_page, mask)
    }
}
