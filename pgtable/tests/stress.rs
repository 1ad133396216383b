//! Multi-threaded stress of the fault path against the write side.
//!
//! N vCPU threads (2, 4 and 8) fault random pages of a 1 GiB space in through
//! `MmuReader` (4 KiB pages and 2 MiB blocks, permission and access-flag
//! faults), each with its own epoch handle and page cache topped up outside
//! the lock, while one more thread takes the write side for unmap,
//! write-protect (plus the flush it owes) and split. Every mapping ever
//! installed is the "backing" translation `ipa -> BACKING + (ipa - BASE)`.
//! During the run each vCPU checks, under the same read lock, that what it
//! just mapped translates to its backing; afterwards every leaf must agree
//! with its backing, and once the MMU, its epoch collector and the caches are
//! gone no page may be live: the host memory panics on a double free and
//! counts writes to freed (poisoned) pages, which must be none.
//!
//! Every thread runs as its own CPU of a per-CPU model TLB: the model checks
//! the break / flush / make order of every entry any thread replaces, as it
//! happens, and each vCPU caches in its own TLB the translation it just
//! faulted in (as its retry would). Afterwards no CPU may cache a
//! translation of an unmapped page, or a writable one of a read-only page:
//! unmap and write-protect flush on every CPU.
//!
//! The two sides are paced to one write-side operation per 100 faults, so
//! each run has about 1,200 write-side operations beside its 120,000 faults.
//!
//! A thread that panics raises the test's failure flag, and every thread
//! that waits for another one checks it ([`thread_failure`]), so a failed
//! check fails the run at once instead of leaving the others waiting.
//!
//! Run it optimised (as CI does): `cargo test --release -p pgtable --test stress`.

mod thread_failure;

use pgtable::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache, Perms,
    PhysAddr, SkipHints, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use thread_failure::FailureFlag;
use tlb::{ModelTlb, TlbCaps};

const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
/// The faulted space: [BASE, BASE + 1 GiB).
const BASE: u64 = 4 * GIB;
/// The contended corner of the space.
const HOT: u64 = 8 << 20;
/// Output of BASE; 1 GiB-aligned so 2 MiB blocks are possible everywhere.
const BACKING: u64 = 0x40_0000_0000;
/// Faults per run (the write-side operations come on top).
const OPS: u64 = 120_000;
/// The write side runs one operation per this many faults.
const FAULTS_PER_WRITE: u64 = 100;
const CAPS: TlbCaps = TlbCaps::ALL;

type Memory = Arc<HostMemory>;

fn backing(ipa: u64) -> PhysAddr {
    PhysAddr::new(BACKING + (ipa - BASE))
}

/// xorshift64*: a small deterministic generator per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Where the next operation lands: half of them in a hot 8 MiB corner
    /// of the space, where vCPUs collide with each other and with the write
    /// side, the rest anywhere in the 1 GiB.
    fn span(&mut self) -> u64 {
        if self.next() & 1 == 0 { HOT } else { GIB }
    }
}

/// What the threads of a run share to pace each other and to stop.
#[derive(Default)]
struct Pace {
    /// Faults begun.
    ops: AtomicU64,
    /// Write-side operations done.
    writes: AtomicU64,
    /// The vCPUs are done: the write side stops.
    done: AtomicBool,
    failure: FailureFlag,
}

/// One vCPU: faults until the shared operation budget is spent.
fn vcpu(
    cpu_id: usize,
    seed: u64,
    mmu: &Mmu<Memory>,
    mem: &Memory,
    tlb: &ModelTlb,
    pace: &Pace,
) -> u64 {
    let Pace {
        ops,
        writes,
        failure,
        ..
    } = pace;
    let _watch = failure.watch();
    let cpu = mmu.register().expect("a CPU slot");
    ModelTlb::set_cpu(cpu_id);
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    let mut rng = Rng(seed);
    let mut again = 0;
    loop {
        let op = ops.fetch_add(1, Ordering::Relaxed);
        if op >= OPS {
            break;
        }
        while op / FAULTS_PER_WRITE > writes.load(Ordering::Relaxed) {
            failure.check();
            std::thread::yield_now();
        }
        cache
            .top_up(&**mem, FAULT_CACHE_PAGES)
            .expect("host memory");
        let span = rng.span();
        let ipa = BASE + rng.below(span / PAGE) * PAGE;
        let reader = mmu.read(&cpu).expect("own handle");
        let result = match rng.below(10) {
            0..=6 => {
                let size = if rng.below(3) == 0 { MIB2 } else { PAGE };
                let leaf_ipa = ipa & !(size - 1);
                let perms = if rng.below(2) == 0 {
                    Perms::READ
                } else {
                    Perms::RW
                };
                let leaf = FaultMapping {
                    ipa: leaf_ipa,
                    size,
                    pa: backing(leaf_ipa),
                    attrs: Attributes::normal(perms),
                };
                reader.map(leaf, &mut cache, tlb)
            }
            7 | 8 => reader.relax_perms(ipa, Perms::WRITE, tlb),
            _ => reader.set_young(ipa).map(|_| ()),
        };
        match result {
            Ok(()) => {
                // Still under the read lock: whatever maps `ipa` now (another
                // vCPU may be breaking it: then nothing) is its backing.
                // The guest's retry: a walk that caches what it finds.
                let mut found = None;
                tlb.walk_and_fill(1, || {
                    found = reader.lookup(ipa);
                    found.map(|m| {
                        let writable = m.perms().contains(Perms::WRITE);
                        (
                            m.leaf_ipa,
                            m.output.as_u64() - (ipa - m.leaf_ipa),
                            m.level,
                            writable,
                        )
                    })
                });
                if let Some(m) = found {
                    assert_eq!(
                        m.output,
                        backing(ipa),
                        "fault at {ipa:#x} mapped the wrong frame"
                    );
                }
            }
            Err(Error::Again) => again += 1,
            Err(e) => panic!("fault at {ipa:#x}: {e}"),
        }
    }
    cache.release(&**mem);
    again
}

/// The write side: unmap, write-protect and split random ranges until the
/// vCPUs are done. Returns the number of operations.
fn writer(seed: u64, mmu: &Mmu<Memory>, mem: &Memory, tlb: &ModelTlb, pace: &Pace) -> u64 {
    let Pace {
        ops,
        writes,
        done,
        failure,
    } = pace;
    let _watch = failure.watch();
    ModelTlb::set_cpu(0);
    let mut cache = PageCache::with_capacity(64);
    let mut rng = Rng(seed);
    let mut count = 0;
    while !done.load(Ordering::Relaxed) {
        if count > ops.load(Ordering::Relaxed) / FAULTS_PER_WRITE {
            failure.check();
            std::thread::yield_now();
            continue;
        }
        // Enough for any split of 64 MiB of 2 MiB blocks and any unmap.
        cache.top_up(&**mem, 40).expect("host memory");
        let span = rng.span();
        let ipa = BASE + rng.below(span / PAGE) * PAGE;
        let size = ((1 + rng.below(4 * MIB2 / PAGE)) * PAGE).min(BASE + GIB - ipa);
        let mut table = mmu.write();
        match rng.below(3) {
            0 => table.unmap(ipa, size, &mut cache, tlb).expect("unmap"),
            1 => table
                .write_protect(ipa, size)
                .expect("write-protect")
                .flush(tlb),
            _ => {
                table
                    .split_to_pages(ipa, size, &mut cache, SkipHints::On, tlb)
                    .expect("split");
            }
        }
        drop(table);
        count += 1;
        writes.fetch_add(1, Ordering::Relaxed);
    }
    cache.release(&**mem);
    count
}

/// Every valid leaf of the space translates to its backing.
fn check_backing(table: &mut Stage2PageTable<Memory>) -> u64 {
    let mut leaves = 0;
    let mut check = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        assert!(
            !ctx.old.is_locked(),
            "a locked entry outlived its walk at {:#x}",
            ctx.base()
        );
        if ctx.old.is_valid() {
            assert_eq!(
                ctx.old.output(),
                backing(ctx.base()),
                "leaf at {:#x}",
                ctx.base()
            );
            leaves += 1;
        }
        Ok(Step::Continue)
    };
    table
        .walk(BASE, GIB, WalkFlags::LEAF, &mut check)
        .expect("exclusive walk");
    leaves
}

/// No CPU caches a translation the table no longer allows: every page of
/// each cached leaf is mapped, and writable where the entry is. (A CPU may
/// keep a read-only entry of a page since relaxed elsewhere: relaxing
/// flushes only locally, and the stale entry costs a spurious fault.)
fn check_tlb(table: &Stage2PageTable<Memory>, tlb: &ModelTlb) -> usize {
    let entries = tlb.entries(1);
    for e in &entries {
        for page in (e.ipa..e.ipa + e.size()).step_by(PAGE as usize) {
            let m = table
                .lookup(page)
                .unwrap_or_else(|| panic!("stale TLB entry {e:?}: {page:#x} unmapped"));
            assert_eq!(m.output.as_u64(), e.out_pa + (page - e.ipa), "{e:?}");
            assert!(
                !e.writable || m.perms().contains(Perms::WRITE),
                "stale writable TLB entry {e:?}: {page:#x} is read-only"
            );
        }
    }
    entries.len()
}

fn run(vcpus: u64) {
    let mem: Memory = Arc::new(HostMemory::new());
    let tlb = ModelTlb::with_cpus(CAPS, vcpus as usize + 1);
    let table = Stage2PageTable::new(Stage2Config::new(40).unwrap(), mem.clone(), 1, true).unwrap();
    let mmu = Mmu::new(table, vcpus as usize).expect("CPU count");
    let pace = Pace::default();
    let (again, writes) = std::thread::scope(|s| {
        let w = s.spawn(|| writer(0x5eed, &mmu, &mem, &tlb, &pace));
        let cpus: Vec<_> = (0..vcpus)
            .map(|i| {
                let (mmu, mem, tlb, pace) = (&mmu, &mem, &tlb, &pace);
                s.spawn(move || {
                    let seed = 0x1234_5678 + i * 0x9e37_79b9;
                    vcpu(i as usize + 1, seed, mmu, mem, tlb, pace)
                })
            })
            .collect();
        // Stop the writer before looking at the results, so a failed vCPU
        // fails the test instead of leaving the writer running forever.
        let results: Vec<_> = cpus.into_iter().map(|c| c.join()).collect();
        pace.done.store(true, Ordering::Relaxed);
        let again: u64 = results.into_iter().map(|r| r.expect("vCPU thread")).sum();
        (again, w.join().expect("writer thread"))
    });
    assert!(pace.ops.load(Ordering::Relaxed) >= OPS);
    assert!(
        writes >= OPS / FAULTS_PER_WRITE - 1,
        "the write side ran {writes} times"
    );
    let mut table = mmu.into_inner();
    let leaves = check_backing(&mut table);
    let cached = check_tlb(&table, &tlb);
    assert!(tlb.pending_breaks().is_empty(), "a break was never made");
    // The collector is gone with the MMU: every retired table is freed.
    assert_eq!(
        mem.live_pages(),
        table.table_pages(),
        "leaked or early-freed table pages"
    );
    drop(table);
    assert_eq!(mem.live_pages(), 0, "pages leaked");
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
    eprintln!(
        "stress: {vcpus} vCPUs, {writes} write-side ops, {again} retries, {leaves} leaves left, \
         {cached} cached translations checked"
    );
}

#[test]
fn two_vcpus_fault_beside_the_write_side() {
    run(2);
}

#[test]
fn four_vcpus_fault_beside_the_write_side() {
    run(4);
}

#[test]
fn eight_vcpus_fault_beside_the_write_side() {
    run(8);
}
