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
use tests::e2e;

fn run_guest(scenario: Scenario, smp: u32) -> RunReport {
    e2e::run(&RunConfig {
        gic: GicVersion::V2,
        ..e2e::guest(
            scenario,
            qemu_runner::DEFAULT_CPU,
            smp,
            Duration::from_secs(180),
        )
    })
}

fn run_linux(smp: u32) -> RunReport {
    let config = RunConfig {
        smp,
        gic: GicVersion::V2,
        ..RunConfig::linux(Boot::Hypervisor, LinuxBoot::debian(BusyboxInit::Test))
    };
    assert_eq!(config.guest_cpus(), smp);
    e2e::run(&config)
}

fn has_line(report: &RunReport, wanted: impl Fn(&str) -> bool) -> bool {
    e2e::has_line_where(report, |l| wanted(l.trim()))
}

/// A pass on a GICv2 machine, with the hypervisor driving that GICv2.
fn check_gicv2_pass(report: &RunReport) {
    e2e::assert_powered_off(report);
    assert!(
        report.qemu_status.success(),
        "QEMU did not exit 0\n{}",
        report.explain()
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
        report.explain()
    );
}

fn counter(report: &RunReport, name: &str) -> u64 {
    e2e::counter(report, 0, name)
}

fn check_memory(smp: u32) {
    let report = run_guest(Scenario::Memory, smp);
    check_gicv2_pass(&report);
    let guest_cpus = format!("{smp} vCPUs");
    assert!(
        has_line(&report, |l| l.starts_with("test-guest:")
            && l.contains(&guest_cpus)),
        "the guest did not see {smp} vCPUs\n{}",
        report.explain()
    );
    assert!(
        counter(&report, "test_reports") >= 1,
        "{}",
        report.explain()
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
            report.explain()
        );
    }
    assert!(counter(&report, "exits_irq") > 0, "{}", report.explain());
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
        .unwrap_or_else(|| panic!("no `{INIT_MARKER}` line\n{}", report.explain()));
    let result = report
        .time_to("RESULT: PASS")
        .unwrap_or_else(|| panic!("no RESULT line\n{}", report.explain()));
    assert!(marker <= result, "{}", report.explain());
    for line in [
        format!("LINUX-INIT: {smp} CPUs online (0-{})", smp - 1),
        "LINUX-INIT: 128 MiB written through tmpfs and verified".to_string(),
    ] {
        assert!(
            has_line(&report, |l| l == line),
            "no `{line}`\n{}",
            report.explain()
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
