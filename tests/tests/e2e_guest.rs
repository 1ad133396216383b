//! End-to-end: the hypervisor boots under QEMU and runs the SMP test guest
//! with demand-faulted stage-2 memory, on `-cpu max,pauth=off` (range TLBI)
//! and on `-cpu cortex-a57` (no range TLBI), with 1 and 4 vCPUs.
//!
//! Each test builds the hypervisor and the guest through `qemu-runner` and
//! fails (never skips) when QEMU, the build or the boot fails. Passing needs
//! the guest's `RESULT: PASS`, the hypervisor's `STAT` counters showing that
//! the guest's memory was faulted in (stage-2 faults) with 2 MiB blocks, the
//! guest's `TEST_REPORT` counted, and the hypervisor's `[hv] system off`.

use std::time::Duration;

use qemu_runner::{RunConfig, RunReport, Scenario};
use tests::e2e;

fn memory(cpu: &str, smp: u32) -> RunConfig {
    e2e::guest(Scenario::Memory, cpu, smp, Duration::from_secs(180))
}

fn run(cpu: &str, smp: u32) -> RunReport {
    e2e::run(&memory(cpu, smp))
}

fn counter(report: &RunReport, name: &str) -> u64 {
    e2e::counter(report, 0, name)
}

fn check_memory_run(report: &RunReport, smp: u32) {
    e2e::assert_powered_off(report);
    let guest_cpus = format!("{smp} vCPUs");
    assert!(
        report
            .console()
            .lines()
            .any(|l| l.starts_with("test-guest:") && l.contains(&guest_cpus)),
        "the guest did not see {smp} vCPUs\n{}",
        report.explain()
    );
    assert!(
        counter(report, "stage2_faults") > 0,
        "no stage-2 fault\n{}",
        report.explain()
    );
    assert!(
        counter(report, "mapped_blocks_2m") > 0,
        "no 2 MiB block\n{}",
        report.explain()
    );
    assert!(
        counter(report, "exits_dabt") > 0,
        "no data-abort exit\n{}",
        report.explain()
    );
    assert!(
        counter(report, "exits_hvc") > 0,
        "no HVC exit\n{}",
        report.explain()
    );
    assert!(
        counter(report, "test_reports") >= 1,
        "TEST_REPORT not counted\n{}",
        report.explain()
    );
    // The memory scenario's probe outside RAM is the only injected abort.
    assert_eq!(
        counter(report, "injected_aborts"),
        1,
        "{}",
        report.explain()
    );
    assert_eq!(
        counter(report, "unknown_hypercalls"),
        0,
        "{}",
        report.explain()
    );
}

#[test]
fn memory_test_passes_on_max_with_1_vcpu() {
    check_memory_run(&run(qemu_runner::DEFAULT_CPU, 1), 1);
}

#[test]
fn memory_test_passes_on_max_with_4_vcpus() {
    check_memory_run(&run(qemu_runner::DEFAULT_CPU, 4), 4);
}

#[test]
fn memory_test_passes_on_cortex_a57_with_1_vcpu() {
    let report = run("cortex-a57", 1);
    check_memory_run(&report, 1);
    assert_eq!(
        counter(&report, "tlbi_range"),
        0,
        "range TLBI on a CPU without it"
    );
}

#[test]
fn memory_test_passes_on_cortex_a57_with_4_vcpus() {
    let report = run("cortex-a57", 4);
    check_memory_run(&report, 4);
    assert_eq!(
        counter(&report, "tlbi_range"),
        0,
        "range TLBI on a CPU without it"
    );
}

#[test]
fn vm_conf_sets_guest_vcpus_and_memory() {
    let report = e2e::run(&RunConfig {
        vcpus: Some(2),
        guest_mem_mib: Some(256),
        ..memory(qemu_runner::DEFAULT_CPU, 4)
    });
    check_memory_run(&report, 2);
    assert!(
        report.console().contains("RAM 0x40000000-0x50000000"),
        "the guest did not get 256 MiB\n{}",
        report.explain()
    );
}
