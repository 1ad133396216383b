//! Eager split in chunks (`Mmu::split_in_chunks`): one barrier sequence per
//! chunk, the page cache topped up outside the lock, translations unchanged
//! and every replaced block flushed on every CPU of the per-CPU model TLB,
//! and vCPU faults running between chunks.
//!
//! Run it optimised: `cargo test --release -p pgtable --test split_chunks`.

mod thread_failure;

use pgtable::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, OutOfMemory, PageCache,
    Perms, PhysAddr, SkipHints, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thread_failure::FailureFlag;
use tlb::{ModelTlb, RecordingTlb, TlbCaps, TlbiCounts};

const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
/// The split space: [BASE, BASE + 1 GiB).
const BASE: u64 = 4 * GIB;
/// Output of BASE, 1 GiB-aligned.
const BACKING: u64 = 0x40_0000_0000;

type Memory = Arc<HostMemory>;

fn backing(ipa: u64) -> PhysAddr {
    PhysAddr::new(BACKING + (ipa - BASE))
}

/// An MMU whose [BASE, BASE + 1 GiB) is mapped read-write with 2 MiB blocks
/// (or one 1 GiB block when `gib_block`).
fn mapped(mem: &Memory, gib_block: bool) -> Mmu<Memory> {
    let config = Stage2Config::new(40).expect("40-bit IPA");
    let mut table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
    let pa = if gib_block {
        backing(BASE)
    } else {
        // 2 MiB-aligned but not 1 GiB-aligned: blocks of 2 MiB.
        PhysAddr::new(BACKING + GIB + MIB2)
    };
    let mut cache = PageCache::with_capacity(8);
    let needed = table.pages_needed_to_map(BASE, GIB, pa).unwrap();
    cache.top_up(&**mem, needed).unwrap();
    let rw = Attributes::normal(Perms::RW);
    table
        .map(
            BASE,
            GIB,
            pa,
            rw,
            &mut cache,
            &RecordingTlb::new(TlbCaps::ALL),
        )
        .unwrap();
    cache.release(&**mem);
    Mmu::new(table, 8).expect("CPU count")
}

/// Every leaf in the space: `(base, level, output)`.
fn leaves(table: &mut Stage2PageTable<Memory>) -> Vec<(u64, u8, u64)> {
    let mut found = Vec::new();
    let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        assert!(!ctx.old.is_locked(), "a locked entry outlived the split");
        if ctx.old.is_valid() {
            found.push((ctx.base(), ctx.level, ctx.old.output().as_u64()));
        }
        Ok(Step::Continue)
    };
    table
        .walk(BASE, GIB, WalkFlags::LEAF, &mut visitor)
        .unwrap();
    found
}

fn top_up(mem: &Memory) -> impl FnMut(&mut PageCache, usize) -> Result<(), OutOfMemory> + '_ {
    move |cache, pages| cache.top_up(&**mem, pages)
}

/// One barrier sequence per chunk: 1 GiB of 2 MiB blocks in chunks of
/// 2 MiB, 64 MiB and 1 GiB, with and without range instructions, against
/// the per-block split's 512 sequences.
#[test]
fn one_barrier_sequence_per_chunk() {
    let mem: Memory = Arc::new(HostMemory::new());
    for caps in [TlbCaps::ALL, TlbCaps::NO_RANGE] {
        let baseline = {
            let mmu = mapped(&mem, false);
            let tlb = RecordingTlb::new(caps);
            let mut cache = PageCache::with_capacity(512);
            let mut table = mmu.write();
            let needed = table.pages_needed_to_split(BASE, GIB).unwrap();
            cache.top_up(&*mem, needed).unwrap();
            table
                .split_to_pages(BASE, GIB, &mut cache, SkipHints::On, &tlb)
                .unwrap();
            tlb.counts()
        };
        assert_eq!(baseline.sequences, 512, "{caps:?}: per block");
        for chunk in [MIB2, 64 << 20, GIB] {
            let mmu = mapped(&mem, false);
            let tlb = RecordingTlb::new(caps);
            let mut cache = PageCache::with_capacity(512);
            let stats = mmu
                .split_in_chunks(BASE, GIB, chunk, &mut cache, &tlb, top_up(&mem))
                .unwrap();
            let chunks = GIB / chunk;
            assert_eq!((stats.chunks, stats.blocks_split), (chunks, 512));
            let per_sequence = if caps.range {
                // One range operation (level hint 2) and the VMALLE1IS.
                TlbiCounts {
                    range: 1,
                    vmalle1: 1,
                    dsb: 3,
                    sequences: 1,
                    ..Default::default()
                }
            } else {
                // Without range instructions: one VMALLS12E1IS.
                TlbiCounts {
                    vmalls12: 1,
                    dsb: 2,
                    sequences: 1,
                    ..Default::default()
                }
            };
            let want = TlbiCounts {
                ipa: per_sequence.ipa * chunks,
                range: per_sequence.range * chunks,
                vmalle1: per_sequence.vmalle1 * chunks,
                vmalls12: per_sequence.vmalls12 * chunks,
                dsb: per_sequence.dsb * chunks,
                sequences: chunks,
            };
            assert_eq!(tlb.counts(), want, "{caps:?}, chunk {chunk:#x}");
            let mut table = mmu.into_inner();
            let found = leaves(&mut table);
            assert_eq!(found.len(), 512 * 512);
            assert!(found.iter().all(|&(_, level, _)| level == 3));
            cache.release(&*mem);
        }
    }
    assert_eq!(mem.check_quarantine(), 0);
}

/// Against the per-CPU model: the blocks every CPU cached are gone from
/// every CPU, the break / flush / make order held for each block (the model
/// checks it at every make), and every page translates as before; a 1 GiB
/// block is split whole even by a chunk that covers part of it.
#[test]
fn chunked_split_is_correct_on_the_per_cpu_model() {
    let mem: Memory = Arc::new(HostMemory::new());
    for gib_block in [false, true] {
        let mmu = mapped(&mem, gib_block);
        let tlb = ModelTlb::with_cpus(TlbCaps::ALL, 3);
        let before = leaves(&mut mmu.write());
        for (i, &(base, level, out)) in before.iter().enumerate() {
            tlb.fill_on(i % 3, 1, base, out, level, true);
        }
        ModelTlb::set_cpu(2);
        let mut cache = PageCache::with_capacity(600);
        let stats = mmu
            .split_in_chunks(BASE, GIB, 16 << 20, &mut cache, &tlb, top_up(&mem))
            .unwrap();
        ModelTlb::set_cpu(0);
        assert_eq!(stats.blocks_split, before.len() as u64);
        assert!(tlb.is_empty(), "a replaced block survived on some CPU");
        assert!(tlb.pending_breaks().is_empty());
        let after = leaves(&mut mmu.write());
        assert_eq!(after.len(), 512 * 512);
        for (base, level, out) in after {
            assert_eq!(level, 3);
            let old = before
                .iter()
                .rfind(|&&(b, _, _)| b <= base)
                .expect("a block covered the page");
            assert_eq!(out, old.2 + (base - old.0), "page {base:#x} moved");
        }
        cache.release(&*mem);
    }
    assert_eq!(mem.check_quarantine(), 0);
}

/// The cache is topped up outside the lock: the top-up function can take
/// the read side and fault a page in, which would deadlock under the write
/// side. A failing top-up ends the split with `NoMemory`, earlier chunks
/// complete; bad chunk sizes are refused.
#[test]
fn top_up_runs_outside_the_lock_and_its_failure_is_reported() {
    let mem: Memory = Arc::new(HostMemory::new());
    let mmu = mapped(&mem, false);
    let cpu = mmu.register().unwrap();
    let tlb = RecordingTlb::new(TlbCaps::ALL);
    let mut fault_cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    let mut calls = 0;
    let mut cache = PageCache::with_capacity(8);
    let result = mmu.split_in_chunks(BASE, GIB, 8 << 20, &mut cache, &tlb, |cache, pages| {
        calls += 1;
        fault_cache.top_up(&*mem, FAULT_CACHE_PAGES)?;
        let ipa = BASE + GIB - calls * MIB2;
        let page = FaultMapping {
            ipa,
            size: PAGE,
            pa: backing(ipa),
            attrs: Attributes::normal(Perms::RW),
        };
        // Not under the write side: the read side is free.
        match mmu.read(&cpu).unwrap().map(page, &mut fault_cache, &tlb) {
            Ok(()) | Err(Error::Again) => {}
            Err(e) => panic!("fault between chunks: {e}"),
        }
        if calls == 5 {
            return Err(OutOfMemory);
        }
        cache.top_up(&*mem, pages)
    });
    assert_eq!(result, Err(Error::NoMemory));
    assert_eq!(calls, 5);
    let mut table = mmu.write();
    let split = leaves(&mut table)
        .iter()
        .filter(|&&(b, l, _)| l == 3 && b < BASE + (32 << 20))
        .count();
    assert_eq!(split, 32 << 20 >> 12, "the first four chunks are split");
    drop(table);
    for chunk in [0, PAGE + 1] {
        assert_eq!(
            mmu.split_in_chunks(BASE, GIB, chunk, &mut cache, &tlb, top_up(&mem)),
            Err(Error::Unaligned)
        );
    }
    cache.release(&*mem);
    fault_cache.release(&*mem);
}

/// Stress: vCPU threads fault pages of the space (each its own CPU of the
/// model TLB, whose break / flush / make check runs on every replaced
/// entry) while the write side splits it in 2 MiB chunks, repeatedly, the
/// space collapsed back to blocks between rounds. Faults must complete
/// between chunks of a split in progress; afterwards every leaf is a page
/// and translates to its backing. A thread that fails ends the others
/// ([`thread_failure`]): the vCPUs stop when the splitting thread panics,
/// and it stops when one of them does.
#[test]
fn faults_run_between_chunks() {
    const VCPUS: usize = 3;
    const ROUNDS: u64 = 4;
    let mem: Memory = Arc::new(HostMemory::new());
    let mmu = Mmu::new(
        {
            let config = Stage2Config::new(40).unwrap();
            Stage2PageTable::new(config, mem.clone(), 1, true).unwrap()
        },
        VCPUS + 1,
    )
    .unwrap();
    let tlb = ModelTlb::with_cpus(TlbCaps::ALL, VCPUS + 1);
    let splitting = AtomicBool::new(false);
    let between = AtomicU64::new(0);
    let faults = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let failure = FailureFlag::default();
    std::thread::scope(|s| {
        let _watch = failure.watch();
        for v in 0..VCPUS {
            let (mmu, mem, tlb, failure) = (&mmu, &mem, &tlb, &failure);
            let (splitting, between, faults, done) = (&splitting, &between, &faults, &done);
            s.spawn(move || {
                let _watch = failure.watch();
                ModelTlb::set_cpu(v + 1);
                let cpu = mmu.register().unwrap();
                let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
                let mut seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(v as u64 + 1);
                while !done.load(Ordering::Relaxed) {
                    failure.check();
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let ipa = BASE + (seed % (GIB / PAGE)) * PAGE;
                    cache.top_up(&**mem, FAULT_CACHE_PAGES).unwrap();
                    let leaf = FaultMapping {
                        ipa,
                        size: PAGE,
                        pa: backing(ipa),
                        attrs: Attributes::normal(Perms::RW),
                    };
                    let reader = mmu.read(&cpu).unwrap();
                    match reader.map(leaf, &mut cache, tlb) {
                        Ok(()) => {
                            if let Some(m) = reader.lookup(ipa) {
                                assert_eq!(m.output, backing(ipa));
                            }
                            faults.fetch_add(1, Ordering::Relaxed);
                            if splitting.load(Ordering::Relaxed) {
                                between.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(Error::Again) => {}
                        Err(e) => panic!("fault at {ipa:#x}: {e}"),
                    }
                }
                cache.release(&**mem);
            });
        }
        ModelTlb::set_cpu(0);
        let mut cache = PageCache::with_capacity(600);
        for _ in 0..ROUNDS {
            // Collapse back to 2 MiB blocks, then split in chunks.
            {
                let mut table = mmu.write();
                // At most the level-2 table, when the space is empty.
                cache.top_up(&*mem, 1).unwrap();
                let rw = Attributes::normal(Perms::RW);
                let blocks = (0..GIB / MIB2).map(|i| BASE + i * MIB2);
                for ipa in blocks {
                    table
                        .map(ipa, MIB2, backing(ipa), rw, &mut cache, &tlb)
                        .unwrap();
                }
            }
            splitting.store(true, Ordering::Relaxed);
            let mut last = faults.load(Ordering::Relaxed);
            let stats = mmu
                .split_in_chunks(BASE, GIB, MIB2, &mut cache, &tlb, |cache, pages| {
                    // Between chunks: give a vCPU the chance to fault.
                    let deadline = Instant::now() + Duration::from_millis(20);
                    while faults.load(Ordering::Relaxed) == last && Instant::now() < deadline {
                        failure.check();
                        std::thread::yield_now();
                    }
                    last = faults.load(Ordering::Relaxed);
                    cache.top_up(&*mem, pages)
                })
                .unwrap();
            splitting.store(false, Ordering::Relaxed);
            assert_eq!(stats.chunks, GIB / MIB2);
        }
        done.store(true, Ordering::Relaxed);
        cache.release(&*mem);
    });
    assert!(
        between.load(Ordering::Relaxed) > 0,
        "no fault completed while a chunked split was in progress"
    );
    assert!(tlb.pending_breaks().is_empty());
    let mut table = mmu.into_inner();
    for (base, level, out) in leaves(&mut table) {
        assert_eq!(level, 3, "a block survived the last split at {base:#x}");
        assert_eq!(PhysAddr::new(out), backing(base));
    }
    drop(table);
    assert_eq!(mem.live_pages(), 0, "pages leaked");
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
    eprintln!(
        "split_chunks stress: {} faults, {} during chunked splits",
        faults.load(Ordering::Relaxed),
        between.load(Ordering::Relaxed)
    );
}
