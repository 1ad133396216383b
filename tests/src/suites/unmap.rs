//! `unmap` suite: TLB maintenance and time of unmapping 1 GiB.
//!
//! 1 GiB mapped with 4 KiB pages (`4k_1GiB`) or with 2 MiB blocks
//! (`2m_1GiB`) is unmapped on a CPU with `FEAT_TLBIRANGE`, where the walk
//! gathers every removed leaf and emptied table in one `FlushBatch` and
//! flushes once (`deferred`), and on one without (`no_range`), where an
//! unmap this large is flushed once as a whole VMID (at most
//! `pgtable::PER_ENTRY_FLUSH_PAGES` pages are flushed entry by entry), and
//! with each leaf invalidated as it is removed (`per_entry`: the same 1 GiB
//! unmapped in 512-page pieces, each small enough to flush entry by entry).
//! Every `TLBI` instruction is
//! counted by the recording backend, the trailing `VMALLE1IS` included; the
//! median time of the unmap is printed for both. Building the mapping is not
//! timed.

use crate::measure::{config, median_time, on_off, report};
use pgtable::PER_ENTRY_FLUSH_PAGES;
use pgtable::{
    Attributes, CacheOpLog, HostMemory, PageCache, Perms, PhysAddr, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
use tlb::{PAGE_SIZE, RecordingTlb, TlbCaps};

const GIB: u64 = 1 << 30;
const IPA: u64 = 4 * GIB;
const RUNS: usize = 11;
const RANGE: TlbCaps = TlbCaps::ALL;
const NO_RANGE: TlbCaps = TlbCaps::ALL.without_range();
/// The ways compared: name, the CPU's TLB capabilities, the bytes unmapped
/// per call.
const WAYS: [(&str, TlbCaps, u64); 3] = [
    ("deferred", RANGE, GIB),
    ("no_range", NO_RANGE, GIB),
    ("per_entry", NO_RANGE, PER_ENTRY_FLUSH_PAGES * PAGE_SIZE),
];

type Table = Stage2PageTable<Arc<HostMemory>>;

/// The table configuration every case uses: without FWB, so every removed
/// Normal leaf is also cleaned (counted by the host memory, per thread).
fn table_config() -> Stage2Config {
    Stage2Config::new(40).expect("40-bit IPA")
}

fn prepare(pa: PhysAddr, mem: &Arc<HostMemory>, tlb: &RecordingTlb) -> (Table, PageCache) {
    let mut table = Stage2PageTable::new(table_config(), mem.clone(), 1, true).expect("root");
    let mut cache = PageCache::with_capacity(600);
    let needed = table.pages_needed_to_map(IPA, GIB, pa).expect("in range");
    cache.top_up(&**mem, needed).expect("host memory");
    let attrs = Attributes::normal(Perms::RW);
    table
        .map(IPA, GIB, pa, attrs, &mut cache, tlb)
        .expect("map");
    tlb.reset();
    (table, cache)
}

/// Prints the suite's figures.
pub fn run() {
    let mem = Arc::new(HostMemory::with_cache_op_log(CacheOpLog::PerThreadCount));
    let table = table_config();
    for (label, caps, piece) in WAYS {
        config(
            &format!("unmap/*/*_{label}"),
            &[
                ("engine", &"host"),
                ("cpu", &"host"),
                ("fwb", &on_off(table.fwb())),
                ("range_tlbi", &on_off(caps.range)),
                ("threads", &1),
                ("ipa_bits", &table.ipa_bits()),
                ("unmap_piece_bytes", &piece),
                ("runs", &RUNS),
            ],
        );
    }
    let cases = [
        ("4k_1GiB", PhysAddr::new(0x40_0000_1000)),
        ("2m_1GiB", PhysAddr::new(0x40_0020_0000)),
    ];
    for (case, pa) in cases {
        for (label, caps, piece) in WAYS {
            let tlb = RecordingTlb::new(caps);
            let mut ops = 0;
            let time = median_time(
                RUNS,
                || prepare(pa, &mem, &tlb),
                |(mut table, mut cache)| {
                    for at in (IPA..IPA + GIB).step_by(piece as usize) {
                        table.unmap(at, piece, &mut cache, &tlb).expect("unmap");
                    }
                    ops = tlb.counts().total();
                    (table, cache)
                },
            );
            report(&format!("unmap/{case}/tlbi_ops_{label}"), ops as f64, "ops");
            report(
                &format!("unmap/{case}/time_{label}"),
                time.as_secs_f64() * 1e6,
                "us",
            );
        }
    }
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
}
