//! End-to-end: the hypervisor on a GICv2 host (`-machine
//! virt,virtualization=on,gic-version=2`), which drives the GICv2 with its
//! virtualization extensions (`GICH`) and gives its guests a virtual GICv2
//! (emulated distributor, the hardware's `GICV` frame as their CPU
//! interface).
//!
//! - The test guest's `memory` scenario (no interrupts) with 2 and 4 vCPUs.
//! - The test guest's `timers` scenario (both EL1 timers' PPIs through the
//!   virtual GICv2) with 2 and 4 vCPUs, and its `vgic-scarce` scenario
//!   (more interrupts than list registers) with 2.
//! - Debian's Linux kernel with the runner's test initramfs with 2 and 4
//!   vCPUs: Linux's GICv2 driver, its SGIs (IPIs) through `GICD_SGIR`, the
//!   timer and the UART interrupt.
//!
//! Every run must print `RESULT: PASS`, and the hypervisor's banner must name
//! the GICv2 it drives. The kernel and busybox are fetched with apt on the
//! first run and cached in `target/linux/`; the tests never skip.

use std::time::Duration;

use qemu_runner::initramfs::INIT_MARKER;
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::qemu::GicVersion;
use qemu_runner::{Boot, RunConfig, RunReport, Scenario};

fn run_guest(scenario: Scenario, smp: u32) -> RunReport {
    let config = RunConfig {
        boot: Boot::Hypervisor,
        scenario,
        smp,
        gic: GicVersion::V2,
        timeout: Duration::from_secs(180),
        echo: false,
        ..RunConfig::default()
    };
    qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"))
}

fn run_linux(smp: u32) -> RunReport {
    let config = RunConfig {
        smp,
        gic: GicVersion::V2,
        echo: false,
        ..RunConfig::linux(Boot::Hypervisor, LinuxBoot::debian(BusyboxInit::Test))
    };
    assert_eq!(config.guest_cpus(), smp);
    qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"))
}

fn explain(report: &RunReport) -> String {
    format!(
        "verdict: {}\ncommand: {}\n--- console ---\n{}--- QEMU stderr ---\n{}",
        report.verdict,
        report.command_line,
        report.console(),
        report.qemu_stderr
    )
}

fn has_line(report: &RunReport, wanted: impl Fn(&str) -> bool) -> bool {
    report.console().lines().any(|l| wanted(l.trim()))
}

/// A pass on a GICv2 machine, with the hypervisor driving that GICv2.
fn check_gicv2_pass(report: &RunReport) {
    assert!(report.passed(), "{}", explain(report));
    assert!(
        report.qemu_status.success(),
        "QEMU did not exit 0\n{}",
        explain(report)
    );
    assert!(
        report
            .command_line
            .contains("virt,virtualization=on,gic-version=2"),
        "{}",
        report.command_line
    );
    assert!(
        has_line(report, |l| l.starts_with("[hv] GICv2: distributor")
            && l.contains("GICH 0x8030000")),
        "the hypervisor did not drive the GICv2\n{}",
        explain(report)
    );
    assert!(
        report.transcript.system_off,
        "no `[hv] system off`\n{}",
        explain(report)
    );
}

fn counter(report: &RunReport, name: &str) -> u64 {
    report
        .counters()
        .get(0, name)
        .unwrap_or_else(|| panic!("no `STAT vm0 {name}` line\n{}", explain(report)))
}

fn check_memory(smp: u32) {
    let report = run_guest(Scenario::Memory, smp);
    check_gicv2_pass(&report);
    let guest_cpus = format!("{smp} vCPUs");
    assert!(
        has_line(&report, |l| l.starts_with("test-guest:")
            && l.contains(&guest_cpus)),
        "the guest did not see {smp} vCPUs\n{}",
        explain(&report)
    );
    assert!(
        counter(&report, "test_reports") >= 1,
        "{}",
        explain(&report)
    );
}

#[test]
fn memory_scenario_with_2_vcpus_on_gicv2() {
    check_memory(2);
}

#[test]
fn memory_scenario_with_4_vcpus_on_gicv2() {
    check_memory(4);
}

fn check_timers(smp: u32) {
    let report = run_guest(Scenario::Timers, smp);
    check_gicv2_pass(&report);
    for vcpu in 0..smp {
        let prefix = format!("test-guest: timers: vcpu{vcpu}: ");
        assert!(
            has_line(&report, |l| l.starts_with(&prefix)),
            "no interrupt counts from vCPU {vcpu}\n{}",
            explain(&report)
        );
    }
    assert!(counter(&report, "exits_irq") > 0, "{}", explain(&report));
}

#[test]
fn timers_scenario_with_2_vcpus_on_gicv2() {
    check_timers(2);
}

#[test]
fn timers_scenario_with_4_vcpus_on_gicv2() {
    check_timers(4);
}

#[test]
fn vgic_scarce_scenario_with_2_vcpus_on_gicv2() {
    // Group 1 SPIs made active through the distributor, SGIs through
    // GICD_SGIR, the timer, with the four list registers scarce.
    let report = run_guest(Scenario::VgicScarce, 2);
    check_gicv2_pass(&report);
}

fn check_linux(smp: u32) {
    let report = run_linux(smp);
    check_gicv2_pass(&report);
    let marker = report
        .time_to(INIT_MARKER)
        .unwrap_or_else(|| panic!("no `{INIT_MARKER}` line\n{}", explain(&report)));
    let result = report
        .time_to("RESULT: PASS")
        .unwrap_or_else(|| panic!("no RESULT line\n{}", explain(&report)));
    assert!(marker <= result, "{}", explain(&report));
    for line in [
        format!("LINUX-INIT: {smp} CPUs online (0-{})", smp - 1),
        "LINUX-INIT: 128 MiB written through tmpfs and verified".to_string(),
    ] {
        assert!(
            has_line(&report, |l| l == line),
            "no `{line}`\n{}",
            explain(&report)
        );
    }
}

#[test]
fn linux_boots_with_2_vcpus_on_gicv2() {
    check_linux(2);
}

#[test]
fn linux_boots_with_4_vcpus_on_gicv2() {
    check_linux(4);
}
