//! End-to-end: the test guest booted by QEMU directly at EL1, without the
//! hypervisor (`--direct`). This checks the guest and the runner on their own
//! (the guest's SMP bring-up, memory test and abort handling against QEMU's
//! own PSCI and bus errors), and is the baseline boot mode of the
//! hypervisor-overhead benchmarks. A scenario that needs the hypervisor must
//! fail there, so the runner's failure path is exercised too.

use std::time::Duration;

use qemu_runner::{Boot, RunConfig, Scenario, Verdict};
use tests::e2e;

fn direct(scenario: Scenario, cpu: &str, smp: u32) -> RunConfig {
    RunConfig {
        boot: Boot::Direct,
        scenario,
        smp,
        mem_mib: 256,
        cpu: cpu.to_string(),
        timeout: Duration::from_secs(120),
        ..RunConfig::default()
    }
}

#[test]
fn guest_passes_alone_at_el1_on_max_and_cortex_a57() {
    for (cpu, smp) in [(qemu_runner::DEFAULT_CPU, 4), ("cortex-a57", 2)] {
        let report = e2e::run(&direct(Scenario::Memory, cpu, smp));
        assert!(
            report.passed(),
            "{cpu} x{smp}: {}\n{}",
            report.verdict,
            report.console()
        );
        assert!(
            report.hypervisor_log().is_empty(),
            "no hypervisor here\n{}",
            report.console()
        );
        assert!(
            report
                .console()
                .contains(&format!("test-guest: vcpu{} up", smp - 1)),
            "secondaries not started\n{}",
            report.console()
        );
        assert!(
            report
                .console()
                .contains("caught abort reading 0x100000000"),
            "{}",
            report.console()
        );
        assert!(
            report.qemu_status.success(),
            "QEMU did not power off by itself: {}",
            report.qemu_status
        );
    }
}

#[test]
fn bad_guest_scenario_fails_without_the_hypervisor() {
    let report = e2e::run(&direct(Scenario::BadGuest, qemu_runner::DEFAULT_CPU, 1));
    assert!(!report.passed());
    assert_eq!(
        report.verdict,
        Verdict::GuestFailed("this scenario needs the hypervisor".into()),
        "{}",
        report.console()
    );
}
