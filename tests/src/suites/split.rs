//! `split` suite: eager splitting of 1 GiB down to 4 KiB pages, with and
//! without skip hints.
//!
//! Three starting points: already split (every visit finds nothing to do),
//! 2 MiB blocks (512 blocks to split) and one 1 GiB block. For each, the
//! median time of `split_to_pages` and its number of visitor calls are printed
//! with hints on and off, and `speedup` = time with hints off / time with
//! hints on, all measured in the same run. Building the starting table and
//! filling the page cache are not timed.
//!
//! Then eager splitting of 1 GiB of 2 MiB blocks through the MMU, per block
//! (`split/1g_per_block`: `split_to_pages` under the write side, one barrier
//! sequence per block) against chunks (`split/1g_chunked/<chunk>`:
//! `Mmu::split_in_chunks`, the write side released and the cache topped up
//! between chunks, one barrier sequence per chunk), for chunks of 2 MiB,
//! 64 MiB and 1 GiB: barrier sequences, `TLBI` instructions and `DSB`s
//! counted by the recording backend, the median time, and the ratios per
//! block / chunked (`sequence_ratio`, `time_ratio`). The recording backend
//! issues nothing, so the times are the walks' only: on hardware every
//! sequence saved also saves its `DSB ISH` waits for every CPU to
//! acknowledge the invalidation.

use crate::measure::{config, median_time, on_off, report};
use pgtable::{
    Attributes, CacheOpLog, HostMemory, Mmu, PageCache, Perms, PhysAddr, SkipHints, Stage2Config,
    Stage2PageTable,
};
use std::sync::Arc;
use tlb::{RecordingTlb, TlbCaps};

const GIB: u64 = 1 << 30;
const IPA: u64 = 4 * GIB;
const RUNS: usize = 15;
const CAPS: TlbCaps = TlbCaps::ALL;

/// The table configuration every case uses.
fn table_config() -> Stage2Config {
    Stage2Config::new(40).expect("40-bit IPA")
}

/// Host memory that only counts cache maintenance (none is owed by a
/// split, which changes no leaf's memory).
fn host_memory() -> Arc<HostMemory> {
    Arc::new(HostMemory::with_cache_op_log(CacheOpLog::PerThreadCount))
}

type Table = Stage2PageTable<Arc<HostMemory>>;

/// A table holding 1 GiB at `IPA` as `case` says, and a cache with the pages
/// a split of it needs.
fn prepare(case: &str, mem: &Arc<HostMemory>, tlb: &RecordingTlb) -> (Table, PageCache) {
    let mut table = Stage2PageTable::new(table_config(), mem.clone(), 1, true).expect("root");
    let pa = match case {
        "block_1g" => PhysAddr::new(0x40_0000_0000),
        "blocks_2m" => PhysAddr::new(0x40_0020_0000),
        _ => PhysAddr::new(0x40_0000_1000),
    };
    let mut cache = PageCache::with_capacity(600);
    let needed = table.pages_needed_to_map(IPA, GIB, pa).expect("in range");
    cache.top_up(&**mem, needed).expect("host memory");
    let attrs = Attributes::normal(Perms::RW);
    table
        .map(IPA, GIB, pa, attrs, &mut cache, tlb)
        .expect("map");
    let needed = table.pages_needed_to_split(IPA, GIB).expect("in range");
    cache.top_up(&**mem, needed).expect("host memory");
    (table, cache)
}

/// An MMU holding 1 GiB of 2 MiB blocks at `IPA`, and an empty cache big
/// enough for the split.
fn prepare_mmu(mem: &Arc<HostMemory>, tlb: &RecordingTlb) -> (Mmu<Arc<HostMemory>>, PageCache) {
    let (table, mut cache) = prepare("blocks_2m", mem, tlb);
    cache.release(&**mem);
    tlb.reset();
    (Mmu::new(table, 1).expect("one CPU"), cache)
}

/// Per-block against chunked eager split of 1 GiB of 2 MiB blocks.
fn chunked() {
    let mem = host_memory();
    let tlb = RecordingTlb::new(CAPS);
    let mut counts = tlb.counts();
    let time = median_time(
        RUNS,
        || prepare_mmu(&mem, &tlb),
        |(mmu, mut cache)| {
            let mut table = mmu.write();
            let needed = table.pages_needed_to_split(IPA, GIB).expect("in range");
            cache.top_up(&*mem, needed).expect("host memory");
            table
                .split_to_pages(IPA, GIB, &mut cache, SkipHints::On, &tlb)
                .expect("split");
            drop(table);
            counts = tlb.counts();
            (mmu, cache)
        },
    );
    let base_us = time.as_secs_f64() * 1e6;
    let base_sequences = counts.sequences as f64;
    report("split/1g_per_block/time", base_us, "us");
    report("split/1g_per_block/sequences", base_sequences, "sequences");
    report("split/1g_per_block/tlbi", counts.total() as f64, "tlbi");
    report("split/1g_per_block/dsb", counts.dsb as f64, "dsb");
    for (label, chunk) in [("2m", 2 << 20), ("64m", 64 << 20), ("1g", GIB)] {
        let time = median_time(
            RUNS,
            || prepare_mmu(&mem, &tlb),
            |(mmu, mut cache)| {
                mmu.split_in_chunks(IPA, GIB, chunk, &mut cache, &tlb, |cache, pages| {
                    cache.top_up(&*mem, pages)
                })
                .expect("split");
                counts = tlb.counts();
                (mmu, cache)
            },
        );
        let us = time.as_secs_f64() * 1e6;
        let name = format!("split/1g_chunked/{label}");
        report(&format!("{name}/time"), us, "us");
        report(
            &format!("{name}/sequences"),
            counts.sequences as f64,
            "sequences",
        );
        report(&format!("{name}/tlbi"), counts.total() as f64, "tlbi");
        report(&format!("{name}/dsb"), counts.dsb as f64, "dsb");
        report(
            &format!("{name}/sequence_ratio"),
            base_sequences / counts.sequences as f64,
            "x",
        );
        report(&format!("{name}/time_ratio"), base_us / us, "x");
    }
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
}

/// Prints the suite's figures.
pub fn run() {
    let table = table_config();
    config(
        "split",
        &[
            ("engine", &"host"),
            ("cpu", &"host"),
            ("fwb", &on_off(table.fwb())),
            ("range_tlbi", &on_off(CAPS.range)),
            ("threads", &1),
            ("ipa_bits", &table.ipa_bits()),
            ("runs", &RUNS),
        ],
    );
    let mem = host_memory();
    let tlb = RecordingTlb::new(CAPS);
    for case in ["already_split", "blocks_2m", "block_1g"] {
        let mut times = [0.0f64; 2];
        for (i, hints) in [SkipHints::On, SkipHints::Off].into_iter().enumerate() {
            let mut visits = 0;
            let time = median_time(
                RUNS,
                || prepare(case, &mem, &tlb),
                |(mut table, mut cache)| {
                    let stats = table
                        .split_to_pages(IPA, GIB, &mut cache, hints, &tlb)
                        .expect("split");
                    visits = stats.visits;
                    (table, cache)
                },
            );
            let label = if hints == SkipHints::On {
                "hints_on"
            } else {
                "hints_off"
            };
            times[i] = time.as_secs_f64() * 1e6;
            report(&format!("split/{case}/time_{label}"), times[i], "us");
            report(
                &format!("split/{case}/visits_{label}"),
                visits as f64,
                "visits",
            );
        }
        report(&format!("split/{case}/speedup"), times[1] / times[0], "x");
    }
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
    chunked();
}
