//! Loom models of the shared-walk protocol: compare-and-swap installs,
//! break-before-make with the locked marker, and epoch reclamation.
//!
//! Run (bounded to a few minutes) with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p pgtable --test loom_bbm`
//!
//! Each model builds a small table (39-bit IPA, one root page), races two
//! threads through the fault path, and asserts the final translations and the
//! live/freed page sets: live pages == table pages reachable from the root,
//! every retired table freed once nobody is pinned, nothing freed twice (the
//! host memory panics) or written after its free (the poison check).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pgtable::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use pgtable::{
    Attributes, Error, FaultMapping, HostMemory, Mmu, PageCache, Perms, PhysAddr, Stage2Config,
    Stage2PageTable,
};
use tlb::{RecordingTlb, TlbCaps};

const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;
const CAPS: TlbCaps = TlbCaps::ALL;
const RW: Attributes = Attributes::normal(Perms::RW);
/// Output of IPA 0 in every model: mappings are linear from here.
const OUT: u64 = 0x4000_0000;

type Memory = std::sync::Arc<HostMemory>;

/// Runs `f` under loom. Whole-table walks after the threads join (accounting,
/// teardown) read hundreds of slots, so the branch limit is raised; the
/// preemption bound stays at `LOOM_MAX_PREEMPTIONS` (2 when unset).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

struct World {
    mem: Memory,
    mmu: Arc<Mmu<Memory>>,
    tlb: Arc<RecordingTlb>,
}

/// A 39-bit table (level-1 root) prepared by `setup` with exclusive maps.
fn world(setup: impl FnOnce(&mut Stage2PageTable<Memory>, &mut PageCache, &RecordingTlb)) -> World {
    let mem: Memory = std::sync::Arc::new(HostMemory::new());
    let tlb = RecordingTlb::new(CAPS);
    let config = Stage2Config::new(39).expect("39-bit IPA");
    let mut table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
    let mut cache = PageCache::with_capacity(4);
    setup(&mut table, &mut cache, &tlb);
    cache.release(&*mem);
    World {
        mem,
        mmu: Arc::new(Mmu::new(table, 3).expect("CPU count")),
        tlb: Arc::new(tlb),
    }
}

/// A vCPU faulting: retries on `Again` (re-entering the guest), with its own
/// cache of `pages` pages, released afterwards.
fn fault(world: &World, ipa: u64, size: u64, pa: u64, pages: usize) -> thread::JoinHandle<()> {
    let (mem, mmu, tlb) = (world.mem.clone(), world.mmu.clone(), world.tlb.clone());
    thread::spawn(move || {
        let cpu = mmu.register().unwrap();
        let mut cache = PageCache::with_capacity(pages);
        cache.top_up(&*mem, pages).expect("host memory");
        loop {
            match mmu.read(&cpu).unwrap().map(
                FaultMapping {
                    ipa,
                    size,
                    pa: PhysAddr::new(pa),
                    attrs: RW,
                },
                &mut cache,
                &*tlb,
            ) {
                Err(Error::Again) => thread::yield_now(),
                result => break result.expect("fault fixed"),
            }
        }
        cache.release(&*mem);
    })
}

/// Tears the world down: the MMU (and with it the epoch collector, running
/// every deferred free) goes first; returns the table for final checks.
fn finish(world: World) -> (Stage2PageTable<Memory>, Memory) {
    let mmu = Arc::try_unwrap(world.mmu).ok().expect("threads joined");
    (mmu.into_inner(), world.mem)
}

fn assert_accounting(table: &Stage2PageTable<Memory>, mem: &HostMemory, table_pages: usize) {
    assert_eq!(table.table_pages(), table_pages);
    assert_eq!(
        mem.live_pages(),
        table_pages,
        "live pages != reachable table pages"
    );
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
}

#[test]
fn two_faults_race_on_one_empty_entry() {
    model(|| {
        let world = world(|_, _, _| {});
        // Both need the level-2 and level-3 tables below the same root entry.
        let a = fault(&world, 0, PAGE, OUT, 2);
        let b = fault(&world, PAGE, PAGE, OUT + PAGE, 2);
        a.join().unwrap();
        b.join().unwrap();
        let (table, mem) = finish(world);
        for page in [0, PAGE] {
            let m = table.lookup(page).expect("mapped");
            assert_eq!((m.level, m.output), (3, PhysAddr::new(OUT + page)));
        }
        assert_eq!(table.lookup(2 * PAGE), None);
        assert_accounting(&table, &mem, 3);
    });
}

#[test]
fn a_fault_races_a_block_split() {
    model(|| {
        let world = world(|table, cache, tlb| {
            cache.top_up(table.memory(), 1).unwrap();
            table
                .map(0, MIB2, PhysAddr::new(OUT), RW, cache, tlb)
                .unwrap();
        });
        // Both want a page of the block remapped elsewhere: one splits the
        // block (break-before-make), the other meets the locked entry or
        // the new table.
        let a = fault(&world, PAGE, PAGE, 0x8000_0000, 1);
        let b = fault(&world, 3 * PAGE, PAGE, 0x9000_0000, 1);
        a.join().unwrap();
        b.join().unwrap();
        let (table, mem) = finish(world);
        assert_eq!(
            table.lookup(PAGE).unwrap().output,
            PhysAddr::new(0x8000_0000)
        );
        assert_eq!(
            table.lookup(3 * PAGE).unwrap().output,
            PhysAddr::new(0x9000_0000)
        );
        for page in [0, 2 * PAGE, MIB2 - PAGE] {
            let m = table.lookup(page).unwrap();
            assert_eq!(
                (m.level, m.output),
                (3, PhysAddr::new(OUT + page)),
                "rest of the block kept"
            );
        }
        assert_accounting(&table, &mem, 3);
    });
}

#[test]
fn a_fault_races_a_collapse() {
    model(|| {
        let world = world(|table, cache, tlb| {
            cache.top_up(table.memory(), 2).unwrap();
            table
                .map(0, 2 * PAGE, PhysAddr::new(OUT), RW, cache, tlb)
                .unwrap();
        });
        // One collapses the page table into a 2 MiB block; the other faults
        // a page of the same range in (the same linear translation).
        let a = fault(&world, 0, MIB2, OUT, 0);
        let b = fault(&world, 5 * PAGE, PAGE, OUT + 5 * PAGE, 0);
        a.join().unwrap();
        b.join().unwrap();
        let (table, mem) = finish(world);
        let m = table.lookup(5 * PAGE).unwrap();
        assert_eq!((m.level, m.output), (2, PhysAddr::new(OUT + 5 * PAGE)));
        assert_accounting(&table, &mem, 2);
    });
}

#[test]
fn a_pinned_walker_keeps_an_unlinked_table_alive() {
    model(|| {
        let world = world(|table, cache, tlb| {
            cache.top_up(table.memory(), 2).unwrap();
            table
                .map(0, PAGE, PhysAddr::new(OUT), RW, cache, tlb)
                .unwrap();
        });
        // The level-3 table: what the level-2 entry for IPA 0 points at.
        let level3 = {
            let cpu = world.mmu.register().unwrap();
            let mut table_addr = None;
            let mut find =
                |ctx: &mut VisitContext<'_>, kind: VisitKind| -> Result<Step, WalkError> {
                    if kind == VisitKind::TablePre && ctx.level == 2 {
                        table_addr = Some(ctx.old.output());
                    }
                    Ok(Step::Continue)
                };
            world
                .mmu
                .read(&cpu)
                .unwrap()
                .walk(0, PAGE, WalkFlags::TABLE_PRE, &mut find)
                .unwrap();
            table_addr.expect("a level-3 table")
        };
        let reader = {
            let (mem, mmu) = (world.mem.clone(), world.mmu.clone());
            thread::spawn(move || {
                let cpu = mmu.register().unwrap();
                let mut check =
                    |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
                        // Reading the level-3 table; let the other thread unlink it.
                        thread::yield_now();
                        assert!(mem.is_live(level3), "table freed under a pinned walker");
                        let now = ctx.reload();
                        assert_ne!(now.raw(), pgtable::POISON, "read a freed table");
                        Ok(Step::Continue)
                    };
                loop {
                    match mmu
                        .read(&cpu)
                        .unwrap()
                        .walk(0, PAGE, WalkFlags::LEAF, &mut check)
                    {
                        Err(Error::Again) => thread::yield_now(),
                        r => break r.unwrap(),
                    }
                }
            })
        };
        let unlinker = {
            let (mmu, tlb) = (world.mmu.clone(), world.tlb.clone());
            thread::spawn(move || {
                let cpu = mmu.register().unwrap();
                let mut cache = PageCache::with_capacity(0);
                loop {
                    match mmu.read(&cpu).unwrap().map(
                        FaultMapping {
                            ipa: 0,
                            size: MIB2,
                            pa: PhysAddr::new(OUT),
                            attrs: RW,
                        },
                        &mut cache,
                        &*tlb,
                    ) {
                        Err(Error::Again) => thread::yield_now(),
                        r => break r.unwrap(),
                    }
                }
                // Try hard to reclaim: only possible once the reader unpinned.
                for _ in 0..3 {
                    mmu.collect(&cpu);
                }
            })
        };
        reader.join().unwrap();
        unlinker.join().unwrap();
        let (table, mem) = finish(world);
        assert!(
            !mem.is_live(level3),
            "the unlinked table is freed once nobody is pinned"
        );
        assert_eq!(table.lookup(0).unwrap().level, 2);
        assert_accounting(&table, &mem, 2);
    });
}
