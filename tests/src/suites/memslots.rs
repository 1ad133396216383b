//! `memslots` suite: the scalable memslot map against the sorted-array design
//! it replaces, at 10, 100, 509, 8194 and 32767 slots.
//!
//! The baseline is the pre-series KVM design: one array of slots (by value)
//! sorted by guest frame plus an id-to-index table, copied whole for every
//! change and published by swapping a pointer (the old copy is freed through
//! the epoch collector; unlike KVM it does not wait for readers, which only
//! flatters it); lookups binary-search the array and backing queries scan it.
//!
//! Slot `i` maps 32 pages at gfn `64 * i` (32-page gaps between slots) onto
//! its own 32 backing pages. Figures: `setup` (create all slots from empty),
//! `lookup_median` (one gfn lookup inside a random slot, uncached, from
//! batches run under one epoch guard as a fault handler would; the two
//! designs take turns on the same batches), `delete` and `move` (one change
//! at full size), `backing_query` (the slots overlapping one backing page),
//! each with a `baseline_` twin; `lookup_speedup` (baseline / new) at every
//! size, and at 32767 slots the other speedups.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_epoch::{self as epoch, Atomic, Collector, LocalHandle, Owned};
use memslot::{
    DirtyLogMode, Gfn, HostPhysAddr, MAX_SLOTS, Memslots, PAGE_SIZE, SlotFlags, SlotId, SlotSpec,
};

use crate::measure::{config, median, median_time, report};

const SIZES: [u32; 5] = [10, 100, 509, 8194, 32767];
const SLOT_PAGES: u64 = 32;
const STRIDE: u64 = 64;
const BACKING_BASE: u64 = 0x1_0000_0000;
const LOOKUPS_PER_BATCH: usize = 1000;
const BATCHES: usize = 101;

fn spec(i: u32) -> SlotSpec {
    SlotSpec {
        id: SlotId::new(i).expect("bench ids are below MAX_SLOTS"),
        base_gfn: Gfn(u64::from(i) * STRIDE),
        npages: SLOT_PAGES,
        backing: HostPhysAddr(BACKING_BASE + u64::from(i) * SLOT_PAGES * PAGE_SIZE),
        flags: SlotFlags::NONE,
    }
}

/// xorshift64*: the same pseudo-random inputs for both designs.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// One slot of the baseline, stored by value as the old `kvm_memory_slot` was.
#[derive(Clone)]
struct ArraySlot {
    id: u16,
    base_gfn: u64,
    npages: u64,
    backing: u64,
    #[expect(
        dead_code,
        reason = "carried so that every copy moves a whole slot, as the old design did"
    )]
    flags: u32,
    #[expect(
        dead_code,
        reason = "carried so that every copy moves a whole slot, as the old design did"
    )]
    dirty: Option<Arc<memslot::DirtyBitmap>>,
}

/// One published version of the baseline.
#[derive(Clone)]
struct ArraySet {
    generation: u64,
    /// Sorted by `base_gfn`.
    slots: Vec<ArraySlot>,
    /// `MAX_SLOTS` entries: index in `slots`, or `u32::MAX`.
    id_to_index: Vec<u32>,
}

/// The baseline: copy the whole array on each change.
struct SortedArrayMemslots {
    active: Atomic<ArraySet>,
    writer: std::sync::Mutex<()>,
}

impl SortedArrayMemslots {
    fn new() -> Self {
        let empty = ArraySet {
            generation: 0,
            slots: Vec::new(),
            id_to_index: vec![u32::MAX; MAX_SLOTS as usize],
        };
        Self {
            active: Atomic::new(empty),
            writer: std::sync::Mutex::new(()),
        }
    }

    fn find<'g>(&self, guard: &'g epoch::Guard, gfn: u64) -> Option<&'g ArraySlot> {
        // SAFETY: the set was published fully built, and is freed only after
        // every guard that could load it (such as `guard`) is gone.
        let set = unsafe {
            self.active
                .load(std::sync::atomic::Ordering::Acquire, guard)
                .deref()
        };
        let after = set.slots.partition_point(|s| s.base_gfn <= gfn);
        let slot = set.slots.get(after.checked_sub(1)?)?;
        (gfn - slot.base_gfn < slot.npages).then_some(slot)
    }

    fn backing_overlaps(&self, guard: &epoch::Guard, start: u64, end: u64) -> usize {
        // SAFETY: as in `find`.
        let set = unsafe {
            self.active
                .load(std::sync::atomic::Ordering::Acquire, guard)
                .deref()
        };
        set.slots
            .iter()
            .filter(|s| s.backing < end && start < s.backing + s.npages * PAGE_SIZE)
            .count()
    }

    /// Copies the active set, lets `change` edit the copy (refusing it with
    /// `false`), then publishes the copy and retires the old one.
    fn update(&self, handle: &LocalHandle, change: impl FnOnce(&mut ArraySet) -> bool) -> bool {
        let _writer = self.writer.lock().expect("baseline writer lock");
        let guard = handle.pin();
        let old = self
            .active
            .load(std::sync::atomic::Ordering::Acquire, &guard);
        // SAFETY: writers are serialized, so `old` is the live set and cannot be retired under us.
        let mut copy = unsafe { old.deref() }.clone();
        if !change(&mut copy) {
            return false;
        }
        copy.generation += 1;
        let old = self.active.swap(
            Owned::new(copy),
            std::sync::atomic::Ordering::AcqRel,
            &guard,
        );
        // SAFETY: `old` is unreachable for readers pinned from now on.
        unsafe { guard.defer_destroy(old) };
        true
    }

    fn reindex(set: &mut ArraySet) {
        for (index, slot) in set.slots.iter().enumerate() {
            set.id_to_index[usize::from(slot.id)] = index as u32;
        }
    }

    fn create(&self, handle: &LocalHandle, spec: SlotSpec) -> bool {
        self.update(handle, |set| {
            if set.id_to_index[spec.id.get() as usize] != u32::MAX {
                return false;
            }
            let at = set.slots.partition_point(|s| s.base_gfn < spec.base_gfn.0);
            let end = spec.base_gfn.0 + spec.npages;
            let clash_before =
                at > 0 && set.slots[at - 1].base_gfn + set.slots[at - 1].npages > spec.base_gfn.0;
            let clash_after = set.slots.get(at).is_some_and(|s| s.base_gfn < end);
            if clash_before || clash_after {
                return false;
            }
            let slot = ArraySlot {
                id: spec.id.get() as u16,
                base_gfn: spec.base_gfn.0,
                npages: spec.npages,
                backing: spec.backing.0,
                flags: spec.flags.bits(),
                dirty: None,
            };
            set.slots.insert(at, slot);
            Self::reindex(set);
            true
        })
    }

    fn delete(&self, handle: &LocalHandle, id: SlotId) -> bool {
        self.update(handle, |set| {
            let index = std::mem::replace(&mut set.id_to_index[id.get() as usize], u32::MAX);
            if index == u32::MAX {
                return false;
            }
            set.slots.remove(index as usize);
            Self::reindex(set);
            true
        })
    }

    fn move_slot(&self, handle: &LocalHandle, id: SlotId, base_gfn: u64) -> bool {
        self.update(handle, |set| {
            let index = set.id_to_index[id.get() as usize];
            if index == u32::MAX {
                return false;
            }
            let mut slot = set.slots.remove(index as usize);
            slot.base_gfn = base_gfn;
            let at = set.slots.partition_point(|s| s.base_gfn < base_gfn);
            let clash_before =
                at > 0 && set.slots[at - 1].base_gfn + set.slots[at - 1].npages > base_gfn;
            let clash_after = set
                .slots
                .get(at)
                .is_some_and(|s| s.base_gfn < base_gfn + slot.npages);
            if clash_before || clash_after {
                return false;
            }
            set.slots.insert(at, slot);
            Self::reindex(set);
            true
        })
    }
}

/// What both designs offer the benchmark.
trait Design {
    fn build(handle: &LocalHandle, collector: &Collector, n: u32) -> Self;
    fn lookup_batch(&self, handle: &LocalHandle, gfns: &[u64]) -> u64;
    fn delete(&self, handle: &LocalHandle, i: u32);
    fn create(&self, handle: &LocalHandle, i: u32);
    fn move_to(&self, handle: &LocalHandle, i: u32, base_gfn: u64);
    fn backing_query(&self, handle: &LocalHandle, start: u64) -> usize;
}

impl Design for Memslots {
    fn build(handle: &LocalHandle, collector: &Collector, n: u32) -> Self {
        let vm = Memslots::new(collector, DirtyLogMode::default()).expect("valid mode");
        for i in 0..n {
            vm.create(handle, spec(i)).expect("bench slots are valid");
        }
        vm
    }

    fn lookup_batch(&self, handle: &LocalHandle, gfns: &[u64]) -> u64 {
        let guard = handle.pin();
        let set = self.slots(&guard).expect("own collector");
        gfns.iter()
            .map(|&g| set.find(Gfn(g)).map_or(0, |s| s.backing().0))
            .fold(0, u64::wrapping_add)
    }

    fn delete(&self, handle: &LocalHandle, i: u32) {
        self.delete(handle, spec(i).id).expect("live slot");
    }

    fn create(&self, handle: &LocalHandle, i: u32) {
        Memslots::create(self, handle, spec(i)).expect("free slot");
    }

    fn move_to(&self, handle: &LocalHandle, i: u32, base_gfn: u64) {
        self.move_slot(handle, spec(i).id, Gfn(base_gfn))
            .expect("free range");
    }

    fn backing_query(&self, handle: &LocalHandle, start: u64) -> usize {
        let guard = handle.pin();
        let set = self.slots(&guard).expect("own collector");
        set.overlapping_backing(HostPhysAddr(start), HostPhysAddr(start + PAGE_SIZE))
            .count()
    }
}

impl Design for SortedArrayMemslots {
    fn build(handle: &LocalHandle, _collector: &Collector, n: u32) -> Self {
        let vm = SortedArrayMemslots::new();
        for i in 0..n {
            assert!(vm.create(handle, spec(i)), "bench slots are valid");
        }
        vm
    }

    fn lookup_batch(&self, handle: &LocalHandle, gfns: &[u64]) -> u64 {
        let guard = handle.pin();
        gfns.iter()
            .map(|&g| self.find(&guard, g).map_or(0, |s| s.backing))
            .fold(0, u64::wrapping_add)
    }

    fn delete(&self, handle: &LocalHandle, i: u32) {
        assert!(
            SortedArrayMemslots::delete(self, handle, spec(i).id),
            "live slot"
        );
    }

    fn create(&self, handle: &LocalHandle, i: u32) {
        assert!(
            SortedArrayMemslots::create(self, handle, spec(i)),
            "free slot"
        );
    }

    fn move_to(&self, handle: &LocalHandle, i: u32, base_gfn: u64) {
        assert!(self.move_slot(handle, spec(i).id, base_gfn), "free range");
    }

    fn backing_query(&self, handle: &LocalHandle, start: u64) -> usize {
        let guard = handle.pin();
        self.backing_overlaps(&guard, start, start + PAGE_SIZE)
    }
}

/// The figures of one design at one size, in nanoseconds.
struct Figures {
    setup: f64,
    delete: f64,
    moved: f64,
    backing_query: f64,
}

fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

fn measure<D: Design>(n: u32) -> Figures {
    let collector = Collector::new();
    let handle = collector.register();
    let setup_runs = match n {
        0..=509 => 21,
        510..=8194 => 5,
        _ => 3,
    };
    let setup = median_time(setup_runs, || (), |()| D::build(&handle, &collector, n));
    let vm = D::build(&handle, &collector, n);
    let mut rng = Rng(0x5EED_0000 + u64::from(n));

    // Delete a random slot (timed), re-create it before the next run (untimed).
    let runs = 31;
    let mut deleted = None;
    let delete = median_time(
        runs,
        || {
            if let Some(i) = deleted.take() {
                vm.create(&handle, i);
            }
            let i = rng.below(u64::from(n)) as u32;
            deleted = Some(i);
            i
        },
        |i| vm.delete(&handle, i),
    );
    if let Some(i) = deleted.take() {
        vm.create(&handle, i);
    }

    // Move a random slot above all others (timed), move it back (untimed).
    let free_base = u64::from(n) * STRIDE;
    let mut moved_slot = None;
    let moved = median_time(
        runs,
        || {
            if let Some(i) = moved_slot.take() {
                vm.move_to(&handle, i, u64::from(i) * STRIDE);
            }
            let i = rng.below(u64::from(n)) as u32;
            moved_slot = Some(i);
            i
        },
        |i| vm.move_to(&handle, i, free_base),
    );
    if let Some(i) = moved_slot.take() {
        vm.move_to(&handle, i, u64::from(i) * STRIDE);
    }

    let mut per_query = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let starts: Vec<u64> = (0..100)
            .map(|_| {
                BACKING_BASE
                    + (rng.below(u64::from(n)) * SLOT_PAGES + rng.below(SLOT_PAGES)) * PAGE_SIZE
            })
            .collect();
        let start = Instant::now();
        for &s in &starts {
            assert_eq!(
                vm.backing_query(&handle, black_box(s)),
                1,
                "one slot backs each page"
            );
        }
        per_query.push(ns(start.elapsed()) / starts.len() as f64);
    }
    let backing_query = median(&mut per_query);

    Figures {
        setup: ns(setup),
        delete: ns(delete),
        moved: ns(moved),
        backing_query,
    }
}

/// Median nanoseconds per lookup of both designs at `n` slots: batches of
/// the same random gfns, each design in turn, so that a noisy neighbour
/// slows both alike.
fn lookups(n: u32) -> (f64, f64) {
    let collector = Collector::new();
    let handle = collector.register();
    let new = <Memslots as Design>::build(&handle, &collector, n);
    let old = SortedArrayMemslots::build(&handle, &collector, n);
    let mut rng = Rng(0x5EED_0000 + u64::from(n));
    let mut per_lookup = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    let time = |design: &dyn Fn(&[u64]) -> u64, gfns: &[u64]| {
        let start = Instant::now();
        black_box(design(black_box(gfns)));
        ns(start.elapsed()) / LOOKUPS_PER_BATCH as f64
    };
    for batch in 0..BATCHES {
        let gfns: Vec<u64> = (0..LOOKUPS_PER_BATCH)
            .map(|_| rng.below(u64::from(n)) * STRIDE + rng.below(SLOT_PAGES))
            .collect();
        let new_lookup = |g: &[u64]| new.lookup_batch(&handle, g);
        let old_lookup = |g: &[u64]| old.lookup_batch(&handle, g);
        // Alternate which design goes first.
        if batch % 2 == 0 {
            per_lookup.0.push(time(&new_lookup, &gfns));
            per_lookup.1.push(time(&old_lookup, &gfns));
        } else {
            per_lookup.1.push(time(&old_lookup, &gfns));
            per_lookup.0.push(time(&new_lookup, &gfns));
        }
    }
    (median(&mut per_lookup.0), median(&mut per_lookup.1))
}

/// Prints the suite's figures.
pub fn run() {
    let sizes = SIZES.map(|n| n.to_string()).join(",");
    config(
        "memslots",
        &[
            ("engine", &"host"),
            ("cpu", &"host"),
            ("fwb", &"none"),
            ("range_tlbi", &"none"),
            ("threads", &1),
            ("slots", &sizes),
            ("slot_pages", &SLOT_PAGES),
            ("lookups_per_batch", &LOOKUPS_PER_BATCH),
            ("batches", &BATCHES),
        ],
    );
    for n in SIZES {
        let new = measure::<Memslots>(n);
        let old = measure::<SortedArrayMemslots>(n);
        let lookup = lookups(n);
        for (prefix, f, lookup) in [("", &new, lookup.0), ("baseline_", &old, lookup.1)] {
            report(&format!("memslots/{n}/{prefix}setup"), f.setup / 1e3, "us");
            report(&format!("memslots/{n}/{prefix}lookup_median"), lookup, "ns");
            report(
                &format!("memslots/{n}/{prefix}delete"),
                f.delete / 1e3,
                "us",
            );
            report(&format!("memslots/{n}/{prefix}move"), f.moved / 1e3, "us");
            report(
                &format!("memslots/{n}/{prefix}backing_query"),
                f.backing_query,
                "ns",
            );
        }
        report(
            &format!("memslots/{n}/lookup_speedup"),
            lookup.1 / lookup.0,
            "x",
        );
        if n == 32767 {
            report("memslots/32767/setup_speedup", old.setup / new.setup, "x");
            report(
                "memslots/32767/backing_query_speedup",
                old.backing_query / new.backing_query,
                "x",
            );
        }
    }
}
