//! End-to-end: aborts the hypervisor injects into a guest's EL0, AArch64 and
//! AArch32, on `-cpu max,pauth=off` and `-cpu cortex-a57` (both run AArch32
//! at EL0).
//!
//! The test guest's `aarch32-el0` scenario runs a program at AArch64 EL0t and
//! one at AArch32 User that load from a hole (no RAM, no device: the
//! hypervisor must inject a synchronous external data abort), branch into it
//! (an instruction abort), execute `UDF`, and, in AArch32, load with a 16-bit
//! T32 instruction. The guest checks every exception it takes at EL1 (vector
//! +0x400 / +0x600, ESR class, ISS and IL, FAR, ELR, SPSR, DAIF masked) and
//! says `RESULT: PASS` only when all are right. The hypervisor must log and
//! count the five injected aborts and never stop the VM.

use std::time::Duration;

use qemu_runner::{RunReport, Scenario};
use tests::e2e;

fn run(cpu: &str) -> RunReport {
    e2e::run(&e2e::guest(
        Scenario::Aarch32El0,
        cpu,
        1,
        Duration::from_secs(180),
    ))
}

fn check(report: &RunReport) {
    e2e::assert_powered_off(report);
    let explain = report.explain();

    // Every exception the guest checked, by state and vector.
    let console = report.console();
    let checked = |state: &str, vector: &str| {
        console
            .lines()
            .filter(|l| l.starts_with(&format!("test-guest: {state} EL0: ")))
            .filter(|l| l.contains(&format!("vector {vector} ")))
            .count()
    };
    assert_eq!(checked("Aarch64", "+0x400"), 4, "{explain}");
    assert_eq!(checked("Aarch32", "+0x600"), 5, "{explain}");

    let injected = |what: &str| {
        report
            .transcript
            .log_lines_containing(&format!("injected {what} abort"))
            .filter(|line| line.contains("outside every memslot and device"))
            .count()
    };
    // AArch64: one data, one instruction; AArch32: two data (A32, T32), one
    // instruction.
    assert_eq!(injected("data"), 3, "{explain}");
    assert_eq!(injected("instruction"), 2, "{explain}");
    assert_eq!(e2e::counter(report, 0, "injected_aborts"), 5, "{explain}");
    assert_eq!(e2e::counter(report, 0, "test_reports"), 1, "{explain}");
}

#[test]
fn el0_aborts_on_max() {
    check(&run(qemu_runner::DEFAULT_CPU));
}

#[test]
fn el0_aborts_on_cortex_a57() {
    check(&run("cortex-a57"));
}
