//! `faults` suite: fault-in throughput of a fresh stage-2 space, parallel
//! shared walks against one write lock, with FWB and without.
//!
//! Every 4 KiB page of a fresh, empty space (1 GiB, or `BENCH_FAULTS_GIB`)
//! is faulted in once by 1, 2 (and 4, 8, ... up to the machine's cores, or
//! the list in `BENCH_FAULTS_THREADS`, e.g. `1,2,4,8,16`) threads, each a
//! vCPU with its own epoch handle and page cache (topped up outside the lock)
//! taking the pages of every n-th 2 MiB chunk. `shared`: each fault is a
//! shared walk under the read side of the MMU lock (compare-and-swap
//! installs, `Again` retried). `writelock`: the same fault walk, exclusive,
//! under the write side, as a hypervisor without parallel faults runs it.
//!
//! Both stage-2 configurations are measured, `faults/fwb/...` (FEAT_S2FWB:
//! an empty slot takes the leaf by compare-and-swap) and `faults/no_fwb/...`
//! (every Normal leaf's memory is cleaned to PoC before it is published:
//! the fault locks the empty slot, has `HostMemory` clean, then publishes).
//! The host provider only counts the cleans, in a counter of the calling
//! thread ([`CacheOpLog::PerThreadCount`]), so the vCPUs share nothing there
//! but its allocator (one table page per 2 MiB); the count per fault is
//! printed and checked (1 without FWB, 0 with), so neither path can silently
//! turn into the other.
//!
//! Printed per configuration: a `config` line, faults per second for each
//! locking (median of several runs; the wall time of a run is from the
//! moment all its vCPUs are released together to the last one's finish, so
//! thread start-up is not timed) and `scaling_*` = throughput with n threads
//! / throughput with 1, after the machine's core count and load average
//! (wall-clock scaling needs idle cores to mean anything). Because a shared
//! build machine rarely has them, the CPU time per fault is printed too, and
//! `idle_core_scaling_*` = n x (CPU time per fault with 1 thread / with n):
//! the scaling the same work would reach with one idle core per thread.
//! Contention shows up in it (cache-line transfers, spinning on the lock
//! burn CPU time); time spent waiting for a core does not.

use crate::measure::{config, median, on_off, report};
use pgtable::{
    Attributes, CacheOpLog, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache,
    Perms, PhysAddr, Stage2Config, Stage2PageTable,
};
use std::sync::{Arc, Barrier};
use std::time::Instant;
use tlb::{RecordingTlb, TlbCaps};

const PAGE: u64 = 4096;
const CHUNK: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
const BASE: u64 = 4 * GIB;
const BACKING: u64 = 0x40_0000_0000;
const RUNS: usize = 7;
const CAPS: TlbCaps = TlbCaps::ALL;

type Memory = Arc<HostMemory>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Locking {
    Shared,
    WriteLock,
}

/// What one measurement runs: the space, the table's configuration and the
/// locking.
#[derive(Clone, Copy)]
struct Setup {
    bytes: u64,
    config: Stage2Config,
    locking: Locking,
}

fn fresh_mmu(mem: &Memory, config: Stage2Config, cpus: u64) -> Mmu<Memory> {
    let table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
    Mmu::new(table, cpus as usize).expect("CPU count")
}

/// What one vCPU reports: when it started and ended its faults, the CPU
/// time it ran (nanoseconds, where the system says) and the cache
/// maintenance calls it made.
struct VcpuRun {
    start: Instant,
    end: Instant,
    cpu_ns: Option<u64>,
    cache_ops: u64,
}

/// One vCPU faulting in every page of chunks `first, first + step, ...`,
/// after every vCPU of the run has reached `go`.
fn vcpu(
    mmu: &Mmu<Memory>,
    mem: &Memory,
    tlb: &RecordingTlb,
    go: &Barrier,
    setup: Setup,
    first: u64,
    step: u64,
) -> VcpuRun {
    let cpu_start = thread_cpu_ns();
    let ops_start = HostMemory::thread_cache_ops();
    let cpu = mmu.register().expect("a CPU slot");
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    let attrs = Attributes::normal(Perms::RW);
    go.wait();
    let start = Instant::now();
    let mut chunk = first;
    while chunk < setup.bytes / CHUNK {
        for page in 0..CHUNK / PAGE {
            let ipa = BASE + chunk * CHUNK + page * PAGE;
            let leaf = FaultMapping {
                ipa,
                size: PAGE,
                pa: PhysAddr::new(BACKING + (ipa - BASE)),
                attrs,
            };
            cache
                .top_up(&**mem, FAULT_CACHE_PAGES)
                .expect("host memory");
            loop {
                let result = match setup.locking {
                    Locking::Shared => mmu.read(&cpu).and_then(|r| r.map(leaf, &mut cache, tlb)),
                    Locking::WriteLock => mmu.write().map_leaf(leaf, &mut cache, tlb),
                };
                match result {
                    Ok(()) => break,
                    Err(Error::Again) => std::hint::spin_loop(),
                    Err(e) => panic!("fault at {ipa:#x}: {e}"),
                }
            }
        }
        chunk += step;
    }
    let end = Instant::now();
    cache.release(&**mem);
    VcpuRun {
        start,
        end,
        cpu_ns: thread_cpu_ns().zip(cpu_start).map(|(b, a)| b - a),
        cache_ops: HostMemory::thread_cache_ops() - ops_start,
    }
}

/// CPU time the calling thread has run, in nanoseconds, from
/// `/proc/thread-self/schedstat`; `None` where that file does not exist.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// One measurement's results.
struct Throughput {
    /// Faults per second (median over the runs).
    rate: f64,
    /// The vCPUs' CPU time per fault over all runs, in nanoseconds.
    cpu_ns: Option<f64>,
    /// Cache-maintenance calls per fault over all runs.
    cache_ops: f64,
}

/// Faults per second with `threads` vCPUs.
fn throughput(mem: &Memory, tlb: &RecordingTlb, threads: u64, setup: Setup) -> Throughput {
    let mut cpu_ns = Some(0u64);
    let mut cache_ops = 0;
    let mut rates = Vec::with_capacity(RUNS);
    let faults = (setup.bytes / PAGE) as f64;
    for _ in 0..RUNS {
        let mmu = fresh_mmu(mem, setup.config, threads);
        let go = Barrier::new(threads as usize);
        let runs: Vec<VcpuRun> = std::thread::scope(|s| {
            let vcpus: Vec<_> = (0..threads)
                .map(|t| {
                    let (mmu, go) = (&mmu, &go);
                    s.spawn(move || vcpu(mmu, mem, tlb, go, setup, t, threads))
                })
                .collect();
            vcpus
                .into_iter()
                .map(|v| v.join().expect("vCPU thread"))
                .collect()
        });
        let start = runs.iter().map(|r| r.start).min().expect("a vCPU");
        let end = runs.iter().map(|r| r.end).max().expect("a vCPU");
        rates.push(faults / (end - start).as_secs_f64());
        for run in &runs {
            cpu_ns = cpu_ns.zip(run.cpu_ns).map(|(a, b)| a + b);
            cache_ops += run.cache_ops;
        }
        drop(mmu);
    }
    let all = faults * RUNS as f64;
    Throughput {
        rate: median(&mut rates),
        cpu_ns: cpu_ns.map(|ns| ns as f64 / all),
        cache_ops: cache_ops as f64 / all,
    }
}

/// The thread counts: `BENCH_FAULTS_THREADS` (a comma-separated list), else
/// 1, 2 and doublings up to `cores`.
fn thread_counts(cores: u64) -> Result<Vec<u64>, String> {
    if let Ok(list) = std::env::var("BENCH_FAULTS_THREADS") {
        let counts = list
            .split(',')
            .map(|n| match n.trim().parse::<u64>() {
                Ok(n) if (1..=pgtable::MAX_MMU_CPUS as u64).contains(&n) => Ok(n),
                _ => Err(format!(
                    "BENCH_FAULTS_THREADS={list}: `{n}` is not a thread count in 1..={}",
                    pgtable::MAX_MMU_CPUS
                )),
            })
            .collect::<Result<Vec<u64>, String>>()?;
        if counts.first() != Some(&1) {
            return Err(format!(
                "BENCH_FAULTS_THREADS={list}: must start with 1 (the scaling's base)"
            ));
        }
        return Ok(counts);
    }
    let mut counts = vec![1, 2];
    while counts.last().is_some_and(|&n| n * 2 <= cores) {
        counts.push(counts.last().unwrap() * 2);
    }
    Ok(counts)
}

/// The space faulted in per run: `BENCH_FAULTS_GIB` GiB (1 when unset).
fn space_bytes() -> Result<u64, String> {
    match std::env::var("BENCH_FAULTS_GIB") {
        Err(_) => Ok(GIB),
        Ok(gib) => match gib.trim().parse::<u64>() {
            Ok(n) if (1..=64).contains(&n) => Ok(n * GIB),
            _ => Err(format!(
                "BENCH_FAULTS_GIB={gib}: not a size in GiB in 1..=64"
            )),
        },
    }
}

/// Prints the suite's figures; exits with status 1 on a bad setting or when
/// a path did not do the cache maintenance it must.
pub fn run() {
    let fail = |why: String| -> ! {
        eprintln!("faults: {why}");
        std::process::exit(1);
    };
    let mem: Memory = Arc::new(HostMemory::with_cache_op_log(CacheOpLog::PerThreadCount));
    let tlb = RecordingTlb::new(CAPS);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    let counts = thread_counts(cores).unwrap_or_else(|why| fail(why));
    let bytes = space_bytes().unwrap_or_else(|why| fail(why));
    // Scaling needs idle cores: record how busy the machine was.
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        report("faults/host/loadavg_1min", load, "runnable");
    }
    report("faults/host/cores", cores as f64, "cores");
    let list = counts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    for fwb in [true, false] {
        let name = if fwb { "faults/fwb" } else { "faults/no_fwb" };
        let table = Stage2Config::new(40).expect("40-bit IPA").with_fwb(fwb);
        config(
            name,
            &[
                ("engine", &"host"),
                ("cpu", &"host"),
                ("fwb", &on_off(fwb)),
                ("range_tlbi", &on_off(CAPS.range)),
                ("threads", &list),
                ("host_cores", &cores),
                ("ipa_bits", &table.ipa_bits()),
                ("space_gib", &(bytes / GIB)),
                ("page", &"4KiB"),
                ("runs", &RUNS),
                ("cache_ops", &"per_thread_count"),
            ],
        );
        let mut single: [Option<Throughput>; 2] = [None, None];
        for &threads in &counts {
            for (i, (locking, label)) in [
                (Locking::Shared, "shared"),
                (Locking::WriteLock, "writelock"),
            ]
            .into_iter()
            .enumerate()
            {
                let setup = Setup {
                    bytes,
                    config: table,
                    locking,
                };
                let got = throughput(&mem, &tlb, threads, setup);
                let expected_ops = if fwb { 0.0 } else { 1.0 };
                if got.cache_ops != expected_ops {
                    fail(format!(
                        "{name}, {threads} threads, {label}: {} cache-maintenance calls per \
                         fault, expected {expected_ops}",
                        got.cache_ops
                    ));
                }
                let prefix = format!("{name}/{threads}threads");
                report(&format!("{prefix}/{label}"), got.rate, "faults/s");
                report(
                    &format!("{prefix}/cache_ops_per_fault_{label}"),
                    got.cache_ops,
                    "ops",
                );
                if let Some(cpu) = got.cpu_ns {
                    report(&format!("{prefix}/cpu_ns_per_fault_{label}"), cpu, "ns");
                }
                let Some(one) = &single[i] else {
                    single[i] = Some(got);
                    continue;
                };
                report(
                    &format!("{prefix}/scaling_{label}"),
                    got.rate / one.rate,
                    "x",
                );
                if let (Some(one), Some(n)) = (one.cpu_ns, got.cpu_ns) {
                    report(
                        &format!("{prefix}/idle_core_scaling_{label}"),
                        threads as f64 * one / n,
                        "x",
                    );
                }
            }
        }
    }
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
}
