//! End-to-end: the virtual GIC when list registers are scarce. The test
//! guest's `vgic-scarce` scenario makes five SPIs active through
//! `GICD_ISACTIVER` (QEMU's CPU interface has four list registers), then must
//! take its virtual timer and an SGI to itself, which are more urgent; it
//! deactivates the SPIs through `GICD_ICACTIVER` and checks what the
//! registers read back, and raises a pending interrupt's priority above the
//! priority mask and must take it. Run on `-cpu max,pauth=off` with 1 and 4
//! vCPUs (the scenario runs on vCPU 0; the others stay off).

use std::time::Duration;

use qemu_runner::{RunReport, Scenario};
use tests::e2e;

fn run(smp: u32) -> RunReport {
    e2e::run(&e2e::guest(
        Scenario::VgicScarce,
        qemu_runner::DEFAULT_CPU,
        smp,
        Duration::from_secs(120),
    ))
}

fn check(report: &RunReport) {
    e2e::assert_powered_off(report);
    let explain = report.explain();
    for step in [
        "took the virtual timer and SGI 1 while 5 SPIs are active",
        "SPIs 40-44 deactivated through GICD_ICACTIVER",
        "took SPI 41 once its priority rose above the mask",
    ] {
        assert!(
            report.console().contains(step),
            "the guest did not report `{step}`\n{explain}"
        );
    }
    assert_eq!(e2e::counter(report, 0, "test_reports"), 1, "{explain}");
}

#[test]
fn scarce_list_registers_deliver_preempting_interrupts_with_1_vcpu() {
    check(&run(1));
}

#[test]
fn scarce_list_registers_deliver_preempting_interrupts_with_4_vcpus() {
    check(&run(4));
}
