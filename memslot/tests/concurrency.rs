//! Readers against a writer: every answer a lock-free reader gets is correct
//! for a generation that was live during its lookup, and readers never wait
//! for the writer (the writer waits for readers instead).
//!
//! A reader that panics raises the test's failure flag, which the writer's
//! wait for lookups checks ([`thread_failure`]): a failed check fails the
//! test instead of leaving the writer waiting.

mod thread_failure;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use crossbeam_epoch::Collector;
use memslot::{
    DirtyLogMode, Gfn, HostPhysAddr, MemslotError, Memslots, SlotFlags, SlotId, SlotSpec,
    VcpuSlotCache,
};
use thread_failure::FailureFlag;

const IDS: u32 = 24;
const GFNS: u64 = 2048;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn containing(state: &[SlotSpec], gfn: u64) -> Option<SlotSpec> {
    state
        .iter()
        .copied()
        .find(|s| s.base_gfn.0 <= gfn && gfn < s.base_gfn.0 + s.npages)
}

fn overlaps(state: &[SlotSpec], spec: &SlotSpec) -> bool {
    state.iter().any(|s| {
        s.id != spec.id
            && s.base_gfn.0 < spec.base_gfn.0 + spec.npages
            && spec.base_gfn.0 < s.base_gfn.0 + s.npages
    })
}

/// One reader observation.
struct Seen {
    finished_before: u64,
    generation: u64,
    started_after: u64,
    gfn: u64,
    answer: Option<SlotSpec>,
    len: usize,
}

#[test]
fn every_answer_is_right_for_a_generation_live_during_the_lookup() {
    let collector = Collector::new();
    let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).unwrap());
    let started = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Lookups made so far: the writer waits for the readers to run, so the
    // test checks concurrent lookups even when the machine is loaded.
    let lookups = Arc::new(AtomicU64::new(0));
    const READERS: u64 = 3;
    let ready = Arc::new(std::sync::Barrier::new(READERS as usize + 1));
    let failure = Arc::new(FailureFlag::default());

    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (vm, collector, started, finished, stop, lookups, ready, failure) = (
                vm.clone(),
                collector.clone(),
                started.clone(),
                finished.clone(),
                stop.clone(),
                lookups.clone(),
                ready.clone(),
                failure.clone(),
            );
            thread::spawn(move || {
                let _watch = failure.watch();
                let handle = collector.register();
                let mut rng = Rng(0x1234_5678 + r);
                let mut cache = VcpuSlotCache::new();
                let mut seen = Vec::new();
                ready.wait();
                while !stop.load(Ordering::Acquire) {
                    let finished_before = finished.load(Ordering::SeqCst);
                    let guard = handle.pin();
                    let set = vm.slots(&guard).unwrap();
                    let gfn = rng.below(GFNS);
                    let answer = if r == 0 {
                        set.find_cached(Gfn(gfn), &mut cache)
                    } else {
                        set.find(Gfn(gfn))
                    };
                    let answer = answer.map(|s| s.spec());
                    let (generation, len) = (set.generation(), set.len());
                    drop(guard);
                    let started_after = started.load(Ordering::SeqCst);
                    lookups.fetch_add(1, Ordering::Relaxed);
                    seen.push(Seen {
                        finished_before,
                        generation,
                        started_after,
                        gfn,
                        answer,
                        len,
                    });
                }
                seen
            })
        })
        .collect();

    // The writer: random valid changes, recording the state of every generation.
    let handle = collector.register();
    let mut rng = Rng(0xDEAD_BEEF);
    let mut state: Vec<SlotSpec> = Vec::new();
    let mut history: Vec<Vec<SlotSpec>> = vec![Vec::new()];
    ready.wait();
    while history.len() < 3000 {
        // Let the readers in between changes, even on a single free core.
        if history.len().is_multiple_of(16) {
            thread::yield_now();
        }
        let id = SlotId::new(rng.below(u64::from(IDS)) as u32).unwrap();
        let current = state.iter().copied().find(|s| s.id == id);
        let next_generation = history.len() as u64;
        let request = match (current, rng.below(3)) {
            (None, _) => SlotSpec {
                id,
                base_gfn: Gfn(rng.below(GFNS - 64)),
                npages: 1 + rng.below(64),
                backing: HostPhysAddr(rng.below(1 << 20) << 12),
                flags: if rng.below(2) == 0 {
                    SlotFlags::NONE
                } else {
                    SlotFlags::LOG_DIRTY
                },
            },
            (Some(s), 0) => SlotSpec { npages: 0, ..s },
            (Some(s), 1) => SlotSpec {
                base_gfn: Gfn(rng.below(GFNS - s.npages)),
                ..s
            },
            (Some(s), _) => SlotSpec {
                flags: SlotFlags::from_bits(s.flags.bits() ^ 1).unwrap(),
                ..s
            },
        };
        if request.npages != 0 && overlaps(&state, &request) {
            continue;
        }
        started.store(next_generation, Ordering::SeqCst);
        let (_, generation) = vm.set_region(&handle, request).unwrap();
        assert_eq!(generation, next_generation);
        finished.store(generation, Ordering::SeqCst);
        state.retain(|s| s.id != id);
        if request.npages != 0 {
            state.push(request);
        }
        history.push(state.clone());
    }
    while lookups.load(Ordering::Relaxed) < 2000 {
        failure.check();
        thread::yield_now();
    }
    stop.store(true, Ordering::Release);

    let mut checked = 0;
    for reader in readers {
        for seen in reader.join().unwrap() {
            assert!(
                seen.finished_before <= seen.generation && seen.generation <= seen.started_after,
                "generation {} was not live between {} and {}",
                seen.generation,
                seen.finished_before,
                seen.started_after
            );
            let state = &history[seen.generation as usize];
            assert_eq!(
                seen.answer,
                containing(state, seen.gfn),
                "wrong answer for gfn {} in generation {}",
                seen.gfn,
                seen.generation
            );
            assert_eq!(seen.len, state.len());
            checked += 1;
        }
    }
    assert!(checked > 1000, "readers made only {checked} lookups");
}

#[test]
fn readers_never_wait_for_a_writer() {
    let collector = Collector::new();
    let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).unwrap());
    let writer = collector.register();
    let spec = |id: u32, base: u64| SlotSpec {
        id: SlotId::new(id).unwrap(),
        base_gfn: Gfn(base),
        npages: 16,
        backing: HostPhysAddr(0x1000_0000),
        flags: SlotFlags::NONE,
    };
    // Reader A pins generation 0 and holds it.
    let reader_a = collector.register();
    let guard_a = reader_a.pin();
    let set_a = vm.slots(&guard_a).unwrap();
    assert_eq!(set_a.generation(), 0);
    // Change 1 publishes without waiting: its inactive set was never visible.
    assert_eq!(vm.create(&writer, spec(0, 0)), Ok(1));
    // Change 2 must wait for reader A to leave generation 0's set.
    let (tx, rx) = mpsc::channel();
    let second = {
        let vm = vm.clone();
        let collector = collector.clone();
        thread::spawn(move || {
            let writer = collector.register();
            let result = vm.create(&writer, spec(1, 100));
            tx.send(result).unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the writer did not wait for the reader"
    );
    // Meanwhile another reader looks up freely and sees generation 1 ...
    thread::scope(|scope| {
        scope.spawn(|| {
            let handle = collector.register();
            for _ in 0..1000 {
                let guard = handle.pin();
                let set = vm.slots(&guard).unwrap();
                assert_eq!(set.generation(), 1);
                assert_eq!(set.find(Gfn(5)).map(|s| s.id().get()), Some(0));
            }
        });
    });
    // ... and reader A's set was not touched by the waiting writer.
    assert_eq!(set_a.generation(), 0);
    assert!(set_a.find(Gfn(5)).is_none());
    assert!(set_a.is_empty());
    drop(guard_a);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the writer finishes once the reader leaves"),
        Ok(2)
    );
    second.join().unwrap();
}

#[test]
fn writers_refuse_foreign_and_pinned_handles() {
    let collector = Collector::new();
    let other = Collector::new();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let spec = SlotSpec {
        id: SlotId::new(0).unwrap(),
        base_gfn: Gfn(0),
        npages: 1,
        backing: HostPhysAddr(0),
        flags: SlotFlags::NONE,
    };
    let foreign = other.register();
    assert_eq!(
        vm.create(&foreign, spec),
        Err(MemslotError::ForeignCollector)
    );
    assert_eq!(
        vm.slots(&foreign.pin()).err(),
        Some(MemslotError::ForeignCollector)
    );
    // SAFETY: the unprotected guard is only compared, never used to read.
    let unprotected = unsafe { crossbeam_epoch::unprotected() };
    assert_eq!(
        vm.slots(unprotected).err(),
        Some(MemslotError::ForeignCollector)
    );
    let handle = collector.register();
    let guard = handle.pin();
    assert_eq!(vm.create(&handle, spec), Err(MemslotError::WriterPinned));
    drop(guard);
    assert_eq!(vm.create(&handle, spec), Ok(1));
}

/// `delete_synced` and `move_synced` return only once no reader can still see
/// the slot as it was: a reader pinned before the change holds them back.
#[test]
fn synced_delete_and_move_wait_for_readers_of_the_old_slot() {
    let collector = Collector::new();
    let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).unwrap());
    let writer = collector.register();
    let id = SlotId::new(3).unwrap();
    let spec = SlotSpec {
        id,
        base_gfn: Gfn(64),
        npages: 16,
        backing: HostPhysAddr(0x2000_0000),
        flags: SlotFlags::NONE,
    };
    vm.create(&writer, spec).unwrap();
    vm.synchronize(&writer).unwrap();
    type Change =
        fn(&Memslots, &crossbeam_epoch::LocalHandle) -> Result<(SlotSpec, u64), MemslotError>;
    let changes: [(Change, Option<u64>); 2] = [
        (
            |vm, h| vm.move_synced(h, SlotId::new(3).unwrap(), Gfn(256)),
            Some(256),
        ),
        (|vm, h| vm.delete_synced(h, SlotId::new(3).unwrap()), None),
    ];
    for (change, new_base) in changes {
        let reader = collector.register();
        let guard = reader.pin();
        let seen = vm.slots(&guard).unwrap();
        let old = seen.get(id).expect("live").spec();
        let (tx, rx) = mpsc::channel();
        let worker = {
            let (vm, collector) = (vm.clone(), collector.clone());
            thread::spawn(move || {
                let handle = collector.register();
                tx.send(change(&vm, &handle)).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the change returned while a reader could still see the old slot"
        );
        // The reader still translates through the old slot, unchanged.
        assert_eq!(seen.get(id).map(|s| s.spec()), Some(old));
        drop(guard);
        let (returned, _) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the change finishes once the reader leaves")
            .unwrap();
        assert_eq!(returned, old);
        worker.join().unwrap();
        let guard = reader.pin();
        let now = vm.slots(&guard).unwrap().get(id).map(|s| s.base_gfn().0);
        assert_eq!(now, new_base);
    }
    assert_eq!(
        vm.delete_synced(&writer, id),
        Err(MemslotError::NoSuchSlot(id))
    );
}

#[test]
fn a_move_to_the_same_place_is_refused() {
    let collector = Collector::new();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let writer = collector.register();
    let id = SlotId::new(0).unwrap();
    let spec = SlotSpec {
        id,
        base_gfn: Gfn(8),
        npages: 4,
        backing: HostPhysAddr(0),
        flags: SlotFlags::NONE,
    };
    assert_eq!(vm.create(&writer, spec), Ok(1));
    assert_eq!(
        vm.move_synced(&writer, id, Gfn(8)),
        Err(MemslotError::NotAMove(id))
    );
    assert_eq!(
        vm.move_synced(&writer, id, Gfn(12)).map(|(s, _)| s),
        Ok(spec)
    );
}
