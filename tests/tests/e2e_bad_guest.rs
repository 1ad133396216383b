//! End-to-end: a guest that reads and writes an unmapped device address and
//! issues an unknown hypercall leaves the hypervisor alive: the guest catches
//! the injected aborts and sees `NOT_SUPPORTED`, the hypervisor logs and
//! counts both, and still powers off in order (`[hv] system off`).

use std::time::Duration;

use qemu_runner::{Boot, RunConfig, Scenario};

#[test]
fn bad_guest_leaves_the_hypervisor_alive_and_reporting() {
    let config = RunConfig {
        boot: Boot::Hypervisor,
        scenario: Scenario::BadGuest,
        smp: 2,
        timeout: Duration::from_secs(180),
        echo: false,
        ..RunConfig::default()
    };
    let report =
        qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"));
    let explain = format!(
        "verdict: {}\ncommand: {}\n--- console ---\n{}--- QEMU stderr ---\n{}",
        report.verdict,
        report.command_line,
        report.console(),
        report.qemu_stderr
    );
    assert!(report.passed(), "{explain}");
    assert!(
        report.transcript.system_off,
        "no `[hv] system off`\n{explain}"
    );
    assert!(report.transcript.panic.is_none(), "{explain}");

    let injected: Vec<&str> = report
        .transcript
        .log_lines_containing("injected data abort")
        .filter(|line| line.contains("outside every memslot and device"))
        .collect();
    assert!(
        injected.len() >= 2
            && injected
                .iter()
                .all(|line| line.to_lowercase().contains("0xa000000")),
        "expected the read and the write of 0xa000000 logged as injected aborts\n{explain}"
    );
    let unknown = report
        .transcript
        .log_lines_containing("unknown hypercall")
        .filter(|line| line.to_lowercase().contains("0xc60000ff") && line.contains("NOT_SUPPORTED"))
        .count();
    assert_eq!(
        unknown, 1,
        "expected the unknown hypercall 0xc60000ff logged once\n{explain}"
    );

    let counter = |name: &str| {
        report
            .counters()
            .get(0, name)
            .unwrap_or_else(|| panic!("no `STAT vm0 {name}`\n{explain}"))
    };
    assert_eq!(counter("injected_aborts"), 2, "{explain}");
    assert_eq!(counter("unknown_hypercalls"), 1, "{explain}");
    assert!(counter("test_reports") >= 1, "{explain}");
}
