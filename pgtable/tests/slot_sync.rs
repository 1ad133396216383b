//! Run-time memslot delete and move against stage-2 faults in flight.
//!
//! Three vCPU threads fault random 4 KiB pages of two adjacent 2 MiB guest
//! windows, `A` and `B`, as the hypervisor's fault path does: take a
//! [`FaultTicket`](pgtable::FaultTicket), pin the memslots' epoch, look the
//! slot up and translate, "use" the slot's backing for a while (as a vCPU
//! reading guest memory or marking it dirty would), unpin, wait a while, and
//! install the leaf with `map_checked`. The waits are random, so lookups and
//! installs straddle the control thread's changes.
//!
//! The control thread repeats, for hundreds of rounds: create slot 0 at `A`
//! with a backing never used before, let faults map it, move it to `B`, let
//! faults map it, delete it. After each move and delete returns, and again
//! after faults have run on, it checks under the MMU write lock that every
//! leaf in the windows lies inside the live slot and maps its backing at the
//! right offset: no leaf of a deleted slot or of a moved slot's old place
//! survives, and no later fault installs one. After each delete it marks the
//! round's backing freed; a vCPU that finds its backing freed while still
//! using it (pinned) records a use-after-free.
//!
//! Without the grace-period wait in `Memslots::delete_synced` the
//! use-after-free count is not zero; without the recheck in
//! `MmuReader::map_checked` stale leaves survive.
//!
//! A second test checks that a delete and a move each invalidate the TLB with
//! exactly one range operation (plus the trailing `VMALLE1IS`) and no
//! per-page `TLBI`.
//!
//! A failed check ends every thread ([`thread_failure`]): the control thread
//! stops the vCPUs whatever happens, and stops waiting for their faults once
//! one of them has panicked.

mod thread_failure;

use crossbeam_epoch::{Collector, LocalHandle};
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec};
use pgtable::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache, Perms,
    PhysAddr, SLOT_UNMAP_CACHE_PAGES, Stage2Config, Stage2PageTable, delete_slot, move_slot,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use thread_failure::FailureFlag;
use tlb::{RecordingTlb, TlbCaps};

const PAGE: u64 = 4096;
const SLOT_PAGES: u64 = 512;
const SLOT_BYTES: u64 = SLOT_PAGES * PAGE;
/// The two guest windows the slot lives in, in turn.
const A: u64 = 1 << 30;
const B: u64 = A + SLOT_BYTES;
/// Backing of round `r`: `BACKING + r * SLOT_BYTES`.
const BACKING: u64 = 0x40_0000_0000;
const ROUNDS: u64 = 300;
const VCPUS: usize = 3;
/// Fault attempts the control thread lets happen between two changes.
const FAULTS_BETWEEN: u64 = 150;
const CAPS: TlbCaps = TlbCaps {
    range: true,
    ttl: true,
    vmid_bits: 16,
};

type Memory = Arc<HostMemory>;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    /// Busy-waits up to `max` spins.
    fn stall(&mut self, max: u64) {
        for _ in 0..self.below(max) {
            std::hint::spin_loop();
        }
        if self.below(8) == 0 {
            std::thread::yield_now();
        }
    }
}

fn slot_id() -> SlotId {
    SlotId::new(0).expect("id 0")
}

fn round_backing(round: u64) -> u64 {
    BACKING + round * SLOT_BYTES
}

struct Shared {
    memslots: Memslots,
    mmu: Mmu<Memory>,
    mem: Memory,
    tlb: RecordingTlb,
    /// `freed[r]`: round `r`'s backing was given back (its delete returned).
    freed: Vec<AtomicBool>,
    faults: AtomicU64,
    use_after_free: AtomicU64,
    stop: AtomicBool,
    failure: FailureFlag,
}

/// One vCPU: fault until told to stop. Returns (installed, retried).
fn vcpu(shared: &Shared, handle: &LocalHandle, seed: u64) -> (u64, u64) {
    let _watch = shared.failure.watch();
    let cpu = shared.mmu.register().expect("a CPU slot");
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    let mut rng = Rng(seed);
    let (mut installed, mut again) = (0, 0);
    while !shared.stop.load(Ordering::Relaxed) {
        shared.faults.fetch_add(1, Ordering::Relaxed);
        let ipa = A + rng.below(2 * SLOT_PAGES) * PAGE;
        let ticket = shared.mmu.fault_ticket();
        let guard = handle.pin();
        let slots = shared.memslots.slots(&guard).expect("own collector");
        let Some(slot) = slots.find(Gfn::from_ipa(ipa)) else {
            continue;
        };
        let pa = slot.translate(Gfn::from_ipa(ipa)).expect("inside its slot");
        let round = (pa.0 - BACKING) / SLOT_BYTES;
        // Use the backing while pinned: it must not have been given back.
        rng.stall(400);
        if shared.freed[round as usize].load(Ordering::Acquire) {
            shared.use_after_free.fetch_add(1, Ordering::Relaxed);
        }
        drop(guard);
        rng.stall(400);
        cache
            .top_up(&*shared.mem, FAULT_CACHE_PAGES)
            .expect("host memory");
        let leaf = FaultMapping {
            ipa,
            size: PAGE,
            pa: PhysAddr::new(pa.0),
            attrs: Attributes::normal(Perms::RW),
        };
        let reader = shared.mmu.read(&cpu).expect("own handle");
        match reader.map_checked(ticket, leaf, &mut cache, &shared.tlb) {
            Ok(()) => installed += 1,
            Err(Error::Again) => again += 1,
            Err(e) => panic!("fault at {ipa:#x}: {e}"),
        }
    }
    cache.release(&*shared.mem);
    (installed, again)
}

/// Every leaf in the windows lies inside `live` (base IPA, backing) and maps
/// its backing at the right offset. Returns the number of leaves.
fn check_leaves(shared: &Shared, live: Option<(u64, u64)>, when: &str) -> u64 {
    let mut leaves = 0;
    let mut check = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        if ctx.old.is_valid() {
            let ipa = ctx.base();
            let out = ctx.old.output().as_u64();
            match live {
                Some((base, backing)) if (base..base + SLOT_BYTES).contains(&ipa) => assert_eq!(
                    out,
                    backing + (ipa - base),
                    "{when}: leaf at {ipa:#x} maps {out:#x}"
                ),
                _ => panic!("{when}: leaf at {ipa:#x} -> {out:#x} outside the live slot {live:x?}"),
            }
            leaves += 1;
        }
        Ok(Step::Continue)
    };
    shared
        .mmu
        .write()
        .walk(A, 2 * SLOT_BYTES, WalkFlags::LEAF, &mut check)
        .expect("exclusive walk");
    leaves
}

fn let_faults_run(shared: &Shared) {
    let start = shared.faults.load(Ordering::Relaxed);
    while shared.faults.load(Ordering::Relaxed) < start + FAULTS_BETWEEN {
        shared.failure.check();
        std::thread::yield_now();
    }
}

fn control(shared: &Shared, handle: &LocalHandle) -> u64 {
    let mut cache = PageCache::with_capacity(SLOT_UNMAP_CACHE_PAGES);
    let mut leaves = 0;
    for round in 0..ROUNDS {
        let backing = round_backing(round);
        let spec = SlotSpec {
            id: slot_id(),
            base_gfn: Gfn::from_ipa(A),
            npages: SLOT_PAGES,
            backing: HostPhysAddr(backing),
            flags: SlotFlags::NONE,
        };
        shared.memslots.create(handle, spec).expect("create");
        let_faults_run(shared);
        cache
            .top_up(&*shared.mem, SLOT_UNMAP_CACHE_PAGES)
            .expect("host memory");
        let old = move_slot(
            &shared.memslots,
            handle,
            &shared.mmu,
            slot_id(),
            Gfn::from_ipa(B),
            &mut cache,
            &shared.tlb,
        )
        .expect("move");
        assert_eq!(old.base_gfn, Gfn::from_ipa(A));
        leaves += check_leaves(shared, Some((B, backing)), "after the move");
        let_faults_run(shared);
        leaves += check_leaves(shared, Some((B, backing)), "faults after the move");
        cache
            .top_up(&*shared.mem, SLOT_UNMAP_CACHE_PAGES)
            .expect("host memory");
        delete_slot(
            &shared.memslots,
            handle,
            &shared.mmu,
            slot_id(),
            &mut cache,
            &shared.tlb,
        )
        .expect("delete");
        check_leaves(shared, None, "after the delete");
        shared.freed[round as usize].store(true, Ordering::Release);
        let_faults_run(shared);
        check_leaves(shared, None, "faults after the delete");
    }
    cache.release(&*shared.mem);
    leaves
}

fn new_mmu(mem: &Memory, cpus: usize) -> Mmu<Memory> {
    let table = Stage2PageTable::new(Stage2Config::new(40).unwrap(), mem.clone(), 1, true).unwrap();
    Mmu::new(table, cpus).expect("CPU count")
}

#[test]
fn delete_and_move_race_faults_without_stale_leaves() {
    let collector = Collector::new();
    let mem: Memory = Arc::new(HostMemory::new());
    let shared = Shared {
        memslots: Memslots::new(&collector, DirtyLogMode::default()).unwrap(),
        mmu: new_mmu(&mem, VCPUS),
        mem: mem.clone(),
        tlb: RecordingTlb::new(CAPS),
        freed: (0..ROUNDS).map(|_| AtomicBool::new(false)).collect(),
        faults: AtomicU64::new(0),
        use_after_free: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        failure: FailureFlag::default(),
    };
    let (leaves, results) = std::thread::scope(|s| {
        let cpus: Vec<_> = (0..VCPUS as u64)
            .map(|i| {
                let (shared, collector) = (&shared, &collector);
                s.spawn(move || vcpu(shared, &collector.register(), 0x9e37_79b9 * (i + 1)))
            })
            .collect();
        let handle = collector.register();
        // Stop the vCPUs whatever happens, so a failed check fails the test
        // instead of leaving them running.
        let control =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| control(&shared, &handle)));
        shared.stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = cpus.into_iter().map(|c| c.join().expect("vCPU")).collect();
        match control {
            Ok(leaves) => (leaves, results),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    });
    let installed: u64 = results.iter().map(|r| r.0).sum();
    let again: u64 = results.iter().map(|r| r.1).sum();
    eprintln!(
        "slot_sync: {ROUNDS} rounds, {installed} leaves installed, {again} stale faults retried, \
         {leaves} leaves seen live"
    );
    assert_eq!(
        shared.use_after_free.load(Ordering::Relaxed),
        0,
        "a vCPU still used a slot's backing after its delete returned"
    );
    assert!(
        installed > ROUNDS,
        "faults hardly ran: {installed} installed"
    );
    assert!(again > 0, "no fault ever raced a change");
}

#[test]
fn delete_and_move_flush_once_by_range() {
    let collector = Collector::new();
    let handle = collector.register();
    let mem: Memory = Arc::new(HostMemory::new());
    let mmu = new_mmu(&mem, 1);
    let cpu = mmu.register().unwrap();
    let memslots = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let tlb = RecordingTlb::new(CAPS);
    let spec = SlotSpec {
        id: slot_id(),
        base_gfn: Gfn::from_ipa(A),
        npages: 4 * SLOT_PAGES,
        backing: HostPhysAddr(BACKING),
        flags: SlotFlags::NONE,
    };
    memslots.create(&handle, spec).unwrap();
    let mut cache = PageCache::with_capacity(8);
    // Fault in every 17th page and one 2 MiB block, then move, then delete.
    let fault_in = |base: u64, cache: &mut PageCache| {
        for page in (0..4 * SLOT_PAGES).step_by(17) {
            cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
            let ipa = base + page * PAGE;
            let ticket = mmu.fault_ticket();
            let leaf = FaultMapping {
                ipa,
                size: PAGE,
                pa: PhysAddr::new(BACKING + page * PAGE),
                attrs: Attributes::normal(Perms::RW),
            };
            mmu.read(&cpu)
                .unwrap()
                .map_checked(ticket, leaf, cache, &tlb)
                .unwrap();
        }
        cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
        let block = FaultMapping {
            ipa: base + 3 * SLOT_BYTES,
            size: SLOT_BYTES,
            pa: PhysAddr::new(BACKING + 3 * SLOT_BYTES),
            attrs: Attributes::normal(Perms::RW),
        };
        let ticket = mmu.fault_ticket();
        mmu.read(&cpu)
            .unwrap()
            .map_checked(ticket, block, cache, &tlb)
            .unwrap();
    };
    let moved_to = A + 8 * SLOT_BYTES;
    fault_in(A, &mut cache);
    cache.top_up(&*mem, SLOT_UNMAP_CACHE_PAGES).unwrap();
    let stale = mmu.fault_ticket();
    tlb.reset();
    move_slot(
        &memslots,
        &handle,
        &mmu,
        slot_id(),
        Gfn::from_ipa(moved_to),
        &mut cache,
        &tlb,
    )
    .unwrap();
    let moved = tlb.counts();
    assert_eq!(
        (moved.range, moved.ipa, moved.vmalle1, moved.vmalls12),
        (1, 0, 1, 0),
        "move: one range TLBI plus VMALLE1IS, got {moved:?}"
    );
    assert!(mmu.read(&cpu).unwrap().lookup(A).is_none());
    // A fault that took its ticket before the move must not install.
    cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
    let leaf = FaultMapping {
        ipa: A,
        size: PAGE,
        pa: PhysAddr::new(BACKING),
        attrs: Attributes::normal(Perms::RW),
    };
    assert_eq!(
        mmu.read(&cpu)
            .unwrap()
            .map_checked(stale, leaf, &mut cache, &tlb),
        Err(Error::Again)
    );
    fault_in(moved_to, &mut cache);
    cache.top_up(&*mem, SLOT_UNMAP_CACHE_PAGES).unwrap();
    tlb.reset();
    let deleted = delete_slot(&memslots, &handle, &mmu, slot_id(), &mut cache, &tlb).unwrap();
    assert_eq!(deleted.base_gfn, Gfn::from_ipa(moved_to));
    let counts = tlb.counts();
    assert_eq!(
        (counts.range, counts.ipa, counts.vmalle1, counts.vmalls12),
        (1, 0, 1, 0),
        "delete: one range TLBI plus VMALLE1IS, got {counts:?}"
    );
    let reader = mmu.read(&cpu).unwrap();
    for page in 0..4 * SLOT_PAGES {
        assert!(reader.lookup(moved_to + page * PAGE).is_none());
    }
    drop(reader);
    assert_eq!(mmu.invalidation_seq(), 2);
    cache.release(&*mem);
}
