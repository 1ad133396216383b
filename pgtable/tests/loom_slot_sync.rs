//! Loom models of the MMU lock and of the invalidation ticket: the write
//! side excludes every CPU's read side, and a fault that looked a slot up
//! before a run-time delete never leaves a leaf of it behind.
//!
//! Built with `--cfg loom --cfg crossbeam_loom`: the MMU's per-CPU locks,
//! its table cell and its invalidation counters, the memslots' atomics and
//! cells, and the epoch collectors are loom's, so loom explores every
//! interleaving (and weak-memory outcome) of a fault against the write side
//! and against `delete_slot`, and fails a model on a table access that the
//! lock does not order (a write side that skips a CPU's lock) or on a stale
//! leaf (`map_checked` without its recheck).
//!
//! Run: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom-epoch cargo test --release -p pgtable --test loom_slot_sync`
#![cfg(loom)]

use crossbeam_epoch::Collector;
use loom::sync::Arc;
use loom::thread;
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache, Perms,
    PhysAddr, SLOT_UNMAP_CACHE_PAGES, Stage2Config, Stage2PageTable, delete_slot,
};
use tlb::{RecordingTlb, TlbCaps};

const PAGE: u64 = 4096;
/// Backing of the slot's page.
const OUT: u64 = 0x4000_0000;

type Memory = std::sync::Arc<HostMemory>;

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

fn new_mmu(mem: &Memory) -> Mmu<Memory> {
    let config = Stage2Config::new(39).expect("39-bit IPA");
    let table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
    Mmu::new(table, 2).expect("CPU count")
}

/// A reader on CPU 1 inside its read section and a writer changing the
/// table: the lock orders the two accesses to the table, whichever comes
/// first.
#[test]
fn the_write_side_excludes_a_reader_on_another_cpu() {
    model(|| {
        let mem: Memory = std::sync::Arc::new(HostMemory::new());
        let mmu = Arc::new(new_mmu(&mem));
        // CPU 0 is this thread's; the reader is CPU 1.
        let _cpu0 = mmu.register().expect("CPU slot");
        let reader = {
            let mmu = mmu.clone();
            thread::spawn(move || {
                let cpu = mmu.register().expect("CPU slot");
                let reader = mmu.read(&cpu).expect("own handle");
                assert_eq!(reader.lookup(0), None);
            })
        };
        let flush = mmu.write().write_protect(0, PAGE).expect("write-protect");
        assert_eq!(flush.size, 0);
        reader.join().expect("reader");
    });
}

/// A vCPU faults on the slot's page (ticket, lookup, `map_checked`) while
/// the control thread deletes the slot: afterwards no leaf maps the page.
#[test]
fn a_fault_racing_a_delete_leaves_no_stale_leaf() {
    model(|| {
        let mem: Memory = std::sync::Arc::new(HostMemory::new());
        let mmu = Arc::new(new_mmu(&mem));
        let tlb = Arc::new(RecordingTlb::new(TlbCaps::ALL));
        let collector = Collector::new();
        let memslots =
            Arc::new(Memslots::new(&collector, DirtyLogMode::default()).expect("memslots"));
        let id = SlotId::new(0).expect("slot id");
        let handle = collector.register();
        memslots
            .create(
                &handle,
                SlotSpec {
                    id,
                    base_gfn: Gfn(0),
                    npages: 1,
                    backing: HostPhysAddr(OUT),
                    flags: SlotFlags::NONE,
                },
            )
            .expect("create");
        memslots.synchronize(&handle).expect("synchronize");
        let vcpu = {
            let (mmu, tlb, memslots, collector, mem) = (
                mmu.clone(),
                tlb.clone(),
                memslots.clone(),
                collector.clone(),
                mem.clone(),
            );
            thread::spawn(move || {
                let cpu = mmu.register().expect("CPU slot");
                let epoch = collector.register();
                let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
                cache.top_up(&*mem, FAULT_CACHE_PAGES).expect("host memory");
                let ticket = mmu.fault_ticket();
                let pa = {
                    let guard = epoch.pin();
                    let slots = memslots.slots(&guard).expect("own collector");
                    slots.find(Gfn(0)).and_then(|slot| slot.translate(Gfn(0)))
                };
                if let Some(pa) = pa {
                    let leaf = FaultMapping {
                        ipa: 0,
                        size: PAGE,
                        pa: PhysAddr::new(pa.0),
                        attrs: Attributes::normal(Perms::RW),
                    };
                    let reader = mmu.read(&cpu).expect("own handle");
                    match reader.map_checked(ticket, leaf, &mut cache, &*tlb) {
                        Ok(()) | Err(Error::Again) => {}
                        Err(e) => panic!("fault: {e}"),
                    }
                }
                cache.release(&*mem);
            })
        };
        let mut cache = PageCache::with_capacity(SLOT_UNMAP_CACHE_PAGES);
        cache
            .top_up(&*mem, SLOT_UNMAP_CACHE_PAGES)
            .expect("host memory");
        delete_slot(&memslots, &handle, &mmu, id, &mut cache, &*tlb).expect("delete");
        cache.release(&*mem);
        vcpu.join().expect("vCPU");
        let mmu = Arc::try_unwrap(mmu).ok().expect("threads joined");
        let table = mmu.into_inner();
        assert_eq!(table.lookup(0), None, "a leaf of the deleted slot survived");
    });
}
