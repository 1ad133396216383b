//! Loom models of the memslots' lock-free protocol: the publication of a
//! set, a reader's pin, and the grace period a change waits for.
//!
//! Built with `--cfg loom --cfg crossbeam_loom`, the set cells, the active
//! index, the retirement mark and the epoch collector itself run on loom's
//! primitives, so loom explores the interleavings and weak-memory outcomes
//! of a reader and a writer and fails a model on any access to a set (or to
//! a slot's backing) that no happens-before edge orders after the change
//! before it. Each ordering the protocol relies on fails a model when
//! weakened: the publication's release (`active`'s swap) and the reader's
//! acquire fail `a_reader_sees_a_published_set_whole`; the retirement
//! mark's release and the wait's acquire, or a change that does not wait,
//! fail `a_change_waits_for_the_readers_of_the_old_set`.
//!
//! Run (a few seconds each with `LOOM_MAX_PREEMPTIONS=2`):
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom-epoch cargo test --release -p memslot --test loom_memslots`
#![cfg(loom)]

use crossbeam_epoch::Collector;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec};

/// Runs `f` under loom, with the preemption bound `LOOM_MAX_PREEMPTIONS`
/// (2 when unset).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

fn spec(id: u32, base: u64) -> SlotSpec {
    SlotSpec {
        id: SlotId::new(id).expect("slot id"),
        base_gfn: Gfn(base),
        npages: 16,
        backing: HostPhysAddr(0x1000_0000 + u64::from(id) * 0x10_0000),
        flags: SlotFlags::NONE,
    }
}

/// A writer creates a slot while a reader looks it up: the reader sees the
/// old set or the new one, each whole.
#[test]
fn a_reader_sees_a_published_set_whole() {
    model(|| {
        let collector = Collector::new();
        let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).expect("memslots"));
        let reader = {
            let (vm, collector) = (vm.clone(), collector.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                let set = vm.slots(&guard).expect("own collector");
                match set.generation() {
                    0 => assert!(set.is_empty()),
                    1 => assert_eq!(set.find(Gfn(5)).map(|s| s.id().get()), Some(0)),
                    other => panic!("generation {other} was never published"),
                }
            })
        };
        let handle = collector.register();
        assert_eq!(vm.create(&handle, spec(0, 0)), Ok(1));
        reader.join().expect("reader");
    });
}

/// A vCPU pinned before the change translates through slot 0 and uses its
/// backing (a loom cell) while pinned, then unpins and takes part in a
/// collection, as vCPUs do; meanwhile the writer deletes the slot with
/// `delete_synced`, then frees the backing (writes the cell) and makes one
/// more change (which reuses the set the vCPU read). Both writes must
/// follow the vCPU's reads.
#[test]
fn a_change_waits_for_the_readers_of_the_old_set() {
    model(|| {
        let collector = Collector::new();
        let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).expect("memslots"));
        let backing = Arc::new(UnsafeCell::new(0x5a_u64));
        let setup = collector.register();
        vm.create(&setup, spec(0, 0)).expect("create");
        // No reader can see the set before the slot: the delete below does
        // not wait for that, only for readers of the slot.
        vm.synchronize(&setup).expect("synchronize");
        let vcpu_handle = collector.register();
        let guard = vcpu_handle.pin();
        let writer = {
            let (vm, collector, backing) = (vm.clone(), collector.clone(), backing.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let (deleted, _) = vm
                    .delete_synced(&handle, SlotId::new(0).expect("slot id"))
                    .expect("delete");
                assert_eq!(deleted, spec(0, 0));
                // The slot's backing is the caller's again: free it.
                // SAFETY: loom checks this write against every reader's access.
                backing.with_mut(|p| unsafe { *p = 0 });
                vm.create(&handle, spec(1, 0)).expect("create");
            })
        };
        let set = vm.slots(&guard).expect("own collector");
        if let Some(slot) = set.find(Gfn(3)) {
            assert_eq!(slot.id().get(), 0);
            // SAFETY: loom checks this read against the writer's free.
            let value = backing.with(|p| unsafe { *p });
            assert_eq!(value, 0x5a, "the backing was freed under a reader");
        }
        drop(guard);
        // This CPU's periodic collection: it may run the writer's deferred
        // retirement mark.
        vcpu_handle.pin().flush();
        writer.join().expect("writer");
    });
}

/// The same with the vCPU on its own thread, pinning at any point of the
/// writer's changes, and the writer's first change not yet retired: the
/// changes' own waits (before reusing a set) and the synced wait both
/// stand between the vCPU's reads and the writer's writes.
#[test]
fn a_change_waits_for_a_reader_on_another_cpu() {
    model(|| {
        let collector = Collector::new();
        let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).expect("memslots"));
        let backing = Arc::new(UnsafeCell::new(0x5a_u64));
        let handle = collector.register();
        vm.create(&handle, spec(0, 0)).expect("create");
        let vcpu = {
            let (vm, collector, backing) = (vm.clone(), collector.clone(), backing.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                let set = vm.slots(&guard).expect("own collector");
                if let Some(slot) = set.find(Gfn(3)) {
                    assert_eq!(slot.id().get(), 0);
                    // SAFETY: loom checks this read against the writer's free.
                    let value = backing.with(|p| unsafe { *p });
                    assert_eq!(value, 0x5a, "the backing was freed under a reader");
                }
                drop(guard);
                handle.pin().flush();
            })
        };
        let (deleted, _) = vm
            .delete_synced(&handle, SlotId::new(0).expect("slot id"))
            .expect("delete");
        assert_eq!(deleted, spec(0, 0));
        // SAFETY: loom checks this write against every reader's access.
        backing.with_mut(|p| unsafe { *p = 0 });
        vm.create(&handle, spec(1, 0)).expect("create");
        vcpu.join().expect("vCPU");
    });
}
