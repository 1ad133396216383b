//! End-to-end: guest cache maintenance on CPUs without FEAT_S2FWB.
//!
//! QEMU's `cortex-a72` has no FEAT_S2FWB (nor `CTR_EL0.DIC`/`IDC`): the
//! hypervisor must clean every page it maps at stage 2 to the point of
//! coherency, invalidate the instruction cache for memory the guest executes,
//! and trap and convert the guest's set/way maintenance (a flush of guest
//! memory on the first set/way operation and whenever the caches go off or
//! on while it is tracked). `-cpu max` has FWB: no data cache maintenance and
//! no set/way traps at all (its `CTR_EL0.DIC` is clear, so the instruction
//! cache is still invalidated for executed memory, as KVM does).
//!
//! The test guest's memory scenario does set/way maintenance around turning
//! its MMU and caches off and on (vCPU 0): one `DC CISW` with caches on, the
//! `SCTLR_EL1` write that turns them off, a second `DC CISW`, the write that
//! turns them back on. Without FWB that is 2 set/way traps, 2 trapped
//! `SCTLR_EL1` writes and 3 flushes of guest memory. Debian's Linux kernel
//! issues no set/way operations (arm64 Linux has none since 5.x), so under
//! Linux only the clean-on-map and the instruction cache counters move.
//! Everything is read from the `STAT vm0 cmo_*` counters printed at power-off.

use std::time::Duration;

use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::{Boot, RunConfig, RunReport, Scenario};
use tests::e2e::{self, has_line};

const A72: &str = "cortex-a72";
const PAGES_PER_2M: u64 = 512;
const PAGES_PER_1G: u64 = 512 * 512;

fn run_guest(cpu: &str) -> RunReport {
    e2e::run(&e2e::guest(
        Scenario::Memory,
        cpu,
        2,
        Duration::from_secs(180),
    ))
}

fn counter(report: &RunReport, name: &str) -> u64 {
    e2e::counter(report, 0, name)
}

/// 4 KiB pages the VM's stage 2 mapped.
fn mapped_pages(report: &RunReport) -> u64 {
    counter(report, "mapped_pages_4k")
        + counter(report, "mapped_blocks_2m") * PAGES_PER_2M
        + counter(report, "mapped_blocks_1g") * PAGES_PER_1G
}

#[test]
fn guest_on_cortex_a72_cleans_mapped_pages_and_converts_set_way() {
    let report = run_guest(A72);
    e2e::assert_powered_off(&report);
    let explain = report.explain();
    assert!(has_line(&report, "no FEAT_S2FWB"), "{explain}");
    assert!(
        has_line(&report, "test-guest: set/way: caches off and on"),
        "{explain}"
    );
    let mapped = mapped_pages(&report);
    assert!(mapped > 0, "{explain}");
    // The guest's set/way round trip: 2 set/way traps, 2 trapped SCTLR_EL1
    // writes (off, on), 3 flushes (first set/way, caches off, caches on).
    assert_eq!(counter(&report, "cmo_setway_traps"), 2, "{explain}");
    assert_eq!(counter(&report, "cmo_vmreg_traps"), 2, "{explain}");
    let flushes = counter(&report, "cmo_full_flushes");
    assert_eq!(flushes, 3, "{explain}");
    // Every mapped page cleaned when it was mapped, and each flush cleans
    // at most every mapped page again.
    let cleaned = counter(&report, "cmo_dcache_clean_pages");
    assert!(
        cleaned > mapped && cleaned <= mapped * (1 + flushes),
        "cleaned {cleaned} pages for {mapped} mapped and {flushes} flushes\n{explain}"
    );
    // The guest executes from its image: at least that block's I-cache.
    let icache = counter(&report, "cmo_icache_inval");
    assert!(icache >= 1, "{explain}");
    assert!(icache <= counter(&report, "exits_iabt"), "{explain}");
}

#[test]
fn guest_on_max_with_fwb_does_no_data_cache_maintenance() {
    let report = run_guest(qemu_runner::DEFAULT_CPU);
    e2e::assert_powered_off(&report);
    let explain = report.explain();
    assert!(has_line(&report, "FEAT_S2FWB: stage 2 forces"), "{explain}");
    assert!(
        has_line(&report, "test-guest: set/way: caches off and on"),
        "{explain}"
    );
    for name in [
        "cmo_dcache_clean_pages",
        "cmo_setway_traps",
        "cmo_full_flushes",
        "cmo_vmreg_traps",
    ] {
        assert_eq!(counter(&report, name), 0, "{name}\n{explain}");
    }
    // QEMU's max has no CTR_EL0.DIC: memory the guest executes still gets
    // its instruction cache invalidated, one per instruction-abort exit at
    // most (FWB says nothing about instruction fetches).
    assert!(
        counter(&report, "cmo_icache_inval") <= counter(&report, "exits_iabt"),
        "{explain}"
    );
}

#[test]
fn linux_on_cortex_a72_boots_with_every_mapped_page_cleaned() {
    let report = e2e::run(&RunConfig {
        cpu: A72.to_string(),
        ..RunConfig::linux(Boot::Hypervisor, LinuxBoot::debian(BusyboxInit::Test))
    });
    e2e::assert_powered_off(&report);
    let explain = report.explain();
    assert!(
        report.command_line.contains("cortex-a72"),
        "{}",
        report.command_line
    );
    assert!(
        has_line(
            &report,
            "LINUX-INIT: 128 MiB written through tmpfs and verified"
        ),
        "{explain}"
    );
    let mapped = mapped_pages(&report);
    assert!(mapped > 0, "{explain}");
    // Linux issues no set/way maintenance: no flush, so each mapped page was
    // cleaned exactly once, when it was mapped.
    assert_eq!(counter(&report, "cmo_setway_traps"), 0, "{explain}");
    assert_eq!(counter(&report, "cmo_full_flushes"), 0, "{explain}");
    assert_eq!(counter(&report, "cmo_vmreg_traps"), 0, "{explain}");
    assert_eq!(
        counter(&report, "cmo_dcache_clean_pages"),
        mapped,
        "{explain}"
    );
    // The kernel and its user space execute from several blocks.
    assert!(counter(&report, "cmo_icache_inval") > 1, "{explain}");
}
