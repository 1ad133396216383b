//! End-to-end: the control interface, driven by a control VM against a
//! second VM while it runs.
//!
//! Two VMs of the test guest: `ctl` runs the `control` scenario with
//! `control=1` on CPU 0, `peer` the `control-peer` scenario on CPU 1. The
//! control VM reads the peer's memory, creates a memslot in it, moves it and
//! deletes it while the peer stores into it, pauses and resumes the peer,
//! checks that bogus calls are refused with the documented errors, stops the
//! peer and passes. The peer, which has no `control=1`, must have been
//! refused `VERSION` with `NOT_SUPPORTED`, and it must have been stopped.
//! The peer's `STAT vm1` counters show the TLB invalidation of the delete
//! and move: range invalidations on `-cpu max` (FEAT_TLBIRANGE), whole-VMID
//! invalidations on `cortex-a57` (no range instructions).

use qemu_runner::RunReport;
use tests::control_pair::{ControlPair, peer_counter};
use tests::e2e::has_line;

fn run(cpu: &str) -> RunReport {
    ControlPair {
        cpu,
        ..ControlPair::new("control", "control-peer")
    }
    .boot()
}

/// The control scenario's steps all showed up and the peer was refused.
fn check_scenario(report: &RunReport) {
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    for line in [
        "control-peer: VERSION refused: NOT_SUPPORTED",
        "control: read the peer's pattern",
        "control: slot 7 created at 0x50000000",
        "control: slot moved to 0x58000000, marker kept, the peer writes it",
        "control: slot deleted; the peer runs on",
        "control: paused the peer",
        "MEMORY_READ into a buffer outside the caller's RAM: BAD_ADDRESS as expected",
        "MEMORY_READ into a buffer that runs off the caller's RAM: BAD_ADDRESS as expected",
        "VM_PAUSE of the caller: DENIED as expected",
        "control: stopped the peer",
        "RESULT: PASS",
    ] {
        assert!(has_line(report, line), "no line `{line}`\n{explain}");
    }
}

#[test]
fn control_vm_drives_a_peer_on_cpu_max() {
    let report = run(qemu_runner::DEFAULT_CPU);
    check_scenario(&report);
    let range = peer_counter(&report, "tlbi_range");
    assert!(
        range > 0,
        "the delete and move issued no range TLBI on -cpu max\n{}",
        report.explain()
    );
}

#[test]
fn control_vm_drives_a_peer_on_cortex_a57() {
    let report = run("cortex-a57");
    check_scenario(&report);
    assert_eq!(
        peer_counter(&report, "tlbi_range"),
        0,
        "cortex-a57 has no range TLBI"
    );
    let whole = peer_counter(&report, "tlbi_vmalls12");
    assert!(
        whole > 0,
        "the delete and move invalidated nothing on cortex-a57\n{}",
        report.explain()
    );
}
