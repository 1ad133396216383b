//! `split` suite: eager splitting of 1 GiB down to 4 KiB pages, with and
//! without skip hints.
//!
//! Three starting points: already split (every visit finds nothing to do),
//! 2 MiB blocks (512 blocks to split) and one 1 GiB block. For each, the
//! median time of `split_to_pages` and its number of visitor calls are printed
//! with hints on and off, and `speedup` = time with hints off / time with
//! hints on, all measured in the same run. Building the starting table and
//! filling the page cache are not timed.

use crate::measure::{median_time, report};
use pgtable::{
    Attributes, HostMemory, PageCache, Perms, PhysAddr, SkipHints, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
use tlb::{RecordingTlb, TlbCaps};

const GIB: u64 = 1 << 30;
const IPA: u64 = 4 * GIB;
const RUNS: usize = 15;
const CAPS: TlbCaps = TlbCaps::ALL;

type Table = Stage2PageTable<Arc<HostMemory>>;

/// A table holding 1 GiB at `IPA` as `case` says, and a cache with the pages
/// a split of it needs.
fn prepare(case: &str, mem: &Arc<HostMemory>, tlb: &RecordingTlb) -> (Table, PageCache) {
    let config = Stage2Config::new(40).expect("40-bit IPA");
    let mut table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
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

/// Prints the suite's figures.
pub fn run() {
    let mem = Arc::new(HostMemory::new());
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
}
