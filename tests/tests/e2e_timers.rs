//! End-to-end: both EL1 timers interrupt the guest under the hypervisor, on
//! `-cpu max,pauth=off` and on `-cpu cortex-a57` (no FEAT_ECV), with 1 and 4
//! vCPUs.
//!
//! The test guest's `timers` scenario has every vCPU arm the EL1 physical
//! timer (`CNTP_TVAL_EL0`/`CNTP_CVAL_EL0`, `CTL.ENABLE`) and wait in `WFI`
//! until PPI 30 arrives through the virtual GIC, six times, then both the
//! physical and the virtual timer at once, six times, then leaves a stale
//! interrupt behind four times (a timer's interrupt pending while `PSTATE.I`
//! masks it, the timer disabled, the other timer armed for 1 ms: the first
//! interrupt taken must be the other timer's, alternately 27 and 30); it
//! checks that
//! `CNTPCT_EL0` and `CNTVCT_EL0` read the same clock and never go backwards.
//! A timer interrupt that never arrives makes the guest report
//! `RESULT: FAIL` after 10 s (its virtual timer is a watchdog meanwhile).
//! Passing needs `RESULT: PASS`, each vCPU's interrupt counts, the IRQ exits
//! that carried them, and `[hv] system off`.

use std::time::Duration;

use qemu_runner::{RunReport, Scenario};
use tests::e2e;

/// Rounds of each phase in the guest (`timers::ROUNDS`).
const ROUNDS: u64 = 6;
/// Rounds of the stale-interrupt phase (`timers::STALE_ROUNDS`): half take
/// the physical timer's interrupt, half the virtual one's.
const STALE_ROUNDS: u64 = 4;

fn run(cpu: &str, smp: u32) -> RunReport {
    e2e::run(&e2e::guest(
        Scenario::Timers,
        cpu,
        smp,
        Duration::from_secs(180),
    ))
}

/// The guest's count line for `vcpu`: (physical, virtual) interrupts.
fn interrupt_counts(report: &RunReport, vcpu: u32) -> Option<(u64, u64)> {
    let prefix = format!("test-guest: timers: vcpu{vcpu}: ");
    let line = report
        .console()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        [physical, "physical", "and", virtual_, "virtual", ..] => {
            Some((physical.parse().ok()?, virtual_.parse().ok()?))
        }
        _ => None,
    }
}

fn check_timers_run(report: &RunReport, smp: u32) {
    e2e::assert_powered_off(report);
    let explain = report.explain();
    let console = report.console();
    assert!(
        console
            .lines()
            .any(|l| l.starts_with("test-guest: scenario timers")
                && l.contains(&format!("{smp} vCPUs"))),
        "the guest did not run the timers scenario with {smp} vCPUs\n{explain}"
    );
    assert!(
        console.contains("physical timer INTID 30, virtual timer INTID 27"),
        "the guest's device tree does not name PPIs 30 and 27 for the timers\n{explain}"
    );
    for vcpu in 0..smp {
        let (physical, virtual_) = interrupt_counts(report, vcpu)
            .unwrap_or_else(|| panic!("no interrupt counts for vcpu{vcpu}\n{explain}"));
        assert_eq!(
            physical,
            2 * ROUNDS + STALE_ROUNDS / 2,
            "vcpu{vcpu}: physical timer interrupts\n{explain}"
        );
        assert!(
            virtual_ >= ROUNDS + STALE_ROUNDS / 2,
            "vcpu{vcpu}: {virtual_} virtual timer interrupts\n{explain}"
        );
    }
    assert!(
        console.contains("CNTPCT_EL0 and CNTVCT_EL0 equal and monotonic on every vCPU"),
        "{explain}"
    );
    let irq_exits = e2e::counter(report, 0, "exits_irq");
    // Each physical timer interrupt comes from its own host PPI (masked
    // between two), so from its own IRQ exit.
    assert!(
        irq_exits >= u64::from(smp) * 2 * ROUNDS,
        "only {irq_exits} IRQ exits\n{explain}"
    );
}

#[test]
fn timers_interrupt_on_max_with_1_vcpu() {
    check_timers_run(&run(qemu_runner::DEFAULT_CPU, 1), 1);
}

#[test]
fn timers_interrupt_on_max_with_4_vcpus() {
    check_timers_run(&run(qemu_runner::DEFAULT_CPU, 4), 4);
}

#[test]
fn timers_interrupt_on_cortex_a57_with_1_vcpu() {
    check_timers_run(&run("cortex-a57", 1), 1);
}

#[test]
fn timers_interrupt_on_cortex_a57_with_4_vcpus() {
    check_timers_run(&run("cortex-a57", 4), 4);
}
