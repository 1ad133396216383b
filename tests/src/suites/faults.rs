//! `faults` suite: fault-in throughput of a 1 GiB space, parallel shared
//! walks against one write lock.
//!
//! Every 4 KiB page of a fresh, empty 1 GiB space is faulted in once by 1, 2
//! (and 4, 8, ... up to the machine's cores) threads, each a vCPU with its own
//! epoch handle and page cache (topped up outside the lock) taking the pages
//! of every n-th 2 MiB chunk. `shared`: each fault is a shared walk under the
//! read side of the MMU lock (compare-and-swap installs, `Again` retried).
//! `writelock`: the same fault walk, exclusive, under the write side, as a
//! hypervisor without parallel faults runs it. Printed: faults per second for
//! each (median of several runs) and `scaling_*` = throughput with n threads
//! / throughput with 1, after the machine's core count and load average
//! (wall-clock scaling needs idle cores to mean anything). Because a shared
//! build machine rarely has them, the CPU time per fault is printed too, and
//! `idle_core_scaling_*` = n x (CPU time per fault with 1 thread / with n):
//! the scaling the same work would reach with one idle core per thread.
//! Contention shows up in it (cache-line transfers, spinning on the lock
//! burn CPU time); time spent waiting for a core does not.

use crate::measure::{median_time, report};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache, Perms,
    PhysAddr, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
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

fn fresh_mmu(mem: &Memory, cpus: u64) -> Mmu<Memory> {
    let config = Stage2Config::new(40).expect("40-bit IPA");
    let table = Stage2PageTable::new(config, mem.clone(), 1, true).expect("root");
    Mmu::new(table, cpus as usize).expect("CPU count")
}

/// One vCPU faulting in every page of chunks `first, first + step, ...`;
/// returns the CPU time it ran, in nanoseconds, where the system says.
fn vcpu(
    mmu: &Mmu<Memory>,
    mem: &Memory,
    tlb: &RecordingTlb,
    first: u64,
    step: u64,
    locking: Locking,
) -> Option<u64> {
    let cpu_start = thread_cpu_ns();
    let cpu = mmu.register().expect("a CPU slot");
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    let attrs = Attributes::normal(Perms::RW);
    let mut chunk = first;
    while chunk < GIB / CHUNK {
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
                let result = match locking {
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
    cache.release(&**mem);
    Some(thread_cpu_ns()? - cpu_start?)
}

/// CPU time the calling thread has run, in nanoseconds, from
/// `/proc/thread-self/schedstat`; `None` where that file does not exist.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// Faults per second with `threads` vCPUs (median wall time), and the
/// vCPUs' CPU time per fault over all runs, in nanoseconds.
fn throughput(
    mem: &Memory,
    tlb: &RecordingTlb,
    threads: u64,
    locking: Locking,
) -> (f64, Option<f64>) {
    let mut cpu_ns = Some(0u64);
    let time = median_time(
        RUNS,
        || fresh_mmu(mem, threads),
        |mmu| {
            std::thread::scope(|s| {
                let vcpus: Vec<_> = (0..threads)
                    .map(|t| {
                        let mmu = &mmu;
                        s.spawn(move || vcpu(mmu, mem, tlb, t, threads, locking))
                    })
                    .collect();
                for v in vcpus {
                    let ran = v.join().expect("vCPU thread");
                    cpu_ns = cpu_ns.zip(ran).map(|(a, b)| a + b);
                }
            });
            mmu
        },
    );
    let faults = (GIB / PAGE) as f64;
    let cpu = cpu_ns.map(|ns| ns as f64 / (faults * RUNS as f64));
    (faults / time.as_secs_f64(), cpu)
}

/// Prints the suite's figures.
pub fn run() {
    let mem: Memory = Arc::new(HostMemory::new());
    let tlb = RecordingTlb::new(CAPS);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    // Scaling needs idle cores: record how busy the machine was.
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        report("faults/host/loadavg_1min", load, "runnable");
    }
    report("faults/host/cores", cores as f64, "cores");
    let mut counts = vec![1, 2];
    while counts.last().is_some_and(|&n| n * 2 <= cores) {
        counts.push(counts.last().unwrap() * 2);
    }
    let mut single = [(0.0, None); 2];
    for &threads in &counts {
        for (i, (locking, label)) in [
            (Locking::Shared, "shared"),
            (Locking::WriteLock, "writelock"),
        ]
        .into_iter()
        .enumerate()
        {
            let (rate, cpu) = throughput(&mem, &tlb, threads, locking);
            report(
                &format!("faults/{threads}threads/{label}"),
                rate,
                "faults/s",
            );
            if let Some(cpu) = cpu {
                report(
                    &format!("faults/{threads}threads/cpu_ns_per_fault_{label}"),
                    cpu,
                    "ns",
                );
            }
            if threads == 1 {
                single[i] = (rate, cpu);
                continue;
            }
            report(
                &format!("faults/{threads}threads/scaling_{label}"),
                rate / single[i].0,
                "x",
            );
            if let (Some(one), Some(n)) = (single[i].1, cpu) {
                report(
                    &format!("faults/{threads}threads/idle_core_scaling_{label}"),
                    threads as f64 * one / n,
                    "x",
                );
            }
        }
    }
    assert_eq!(mem.check_quarantine(), 0, "a freed page was written");
}
