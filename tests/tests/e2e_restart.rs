//! End-to-end: restarting one VM while another runs (`vm::lifecycle`,
//! `runtime::restart`).
//!
//! * A bad guest beside a good one makes its hostile accesses (aborts are
//!   injected into it) and then asks for PSCI `SYSTEM_RESET`: with several
//!   VMs that restarts the bad VM alone, from a zeroed RAM with its kernel
//!   copied in again, so it runs the same way again and resets again. After
//!   two restarts the operator stops it from the console monitor (the stop
//!   may land during a restart: the restart then ends in the stop). The good
//!   VM passes meanwhile and the machine powers off after both.
//! * The operator restarts VMs from the monitor: `a` (the `memory`
//!   scenario) once it passed and powered off (a restart of an ended VM:
//!   the machine counts it as running again), and it passes a second time; then `b` (the
//!   `echo` guest, still running), which boots again to its prompt; then
//!   stops `b`. The restart empties the VM's stage 2 with one range flush
//!   per memslot, which the `tlbi_range` counter shows on `-cpu max`.
//! * A `vector-regs` guest checks every FP/SIMD, SVE and SME register starts
//!   at zero, leaves patterns in them (in streaming mode with the ZA array
//!   live, on `-cpu max`) and powers off; restarted on the same CPU it finds
//!   them zero again: the hypervisor clears what a guest left behind before
//!   the next one runs there. On `-cpu max` and on `cortex-a57` (FP/SIMD
//!   only).

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::{RunConfig, RunReport};
use tests::e2e::{self, counter, log_position};

fn run(smp: u32, specs: &[&str], script: ConsoleScript) -> RunReport {
    run_on("max", smp, specs, script)
}

fn run_on(cpu: &str, smp: u32, specs: &[&str], script: ConsoleScript) -> RunReport {
    let config = RunConfig {
        cpu: cpu.to_string(),
        ..e2e::vms(smp, specs, Duration::from_secs(240))
    };
    e2e::run(&e2e::with_script(config, script))
}

/// How many times `text` appears on the console.
fn times(report: &RunReport, text: &str) -> usize {
    report.console().matches(text).count()
}

#[test]
fn a_guest_reset_restarts_that_vm_alone() {
    let script = ConsoleScript::new()
        .then("vm0 (bad): restarted", "")
        .then("vm0 (bad): restarted", "\x1dstop bad\r")
        .then("ok: bad stopped", "exit\r");
    let report = run(
        2,
        &[
            "bad-guest,cpus=0,name=bad,expect=stopped,args=bad-exit=reset",
            "memory,cpus=1,mem=512,name=good",
        ],
        script,
    );
    assert!(report.passed(), "{}", report.explain());
    // Each run of the bad guest made its hostile accesses and reset again:
    // the restarted VM starts from its boot image, not where it left off.
    for line in [
        "[bad] test-guest: caught abort on Read",
        "[bad] test-guest: caught abort on Write",
        "[bad] test-guest: bad-exit=reset: PSCI SYSTEM_RESET",
    ] {
        assert!(
            times(&report, line) >= 2,
            "`{line}` not seen twice\n{}",
            report.explain()
        );
    }
    assert!(counter(&report, 0, "restarts") >= 2, "{}", report.explain());
    let stopped = log_position(&report, "vm0 (bad): stopped");
    let last = log_position(&report, "no VM left to run");
    assert!(stopped < last, "{}", report.explain());
    assert!(
        report.console().contains("[good] RESULT: PASS"),
        "{}",
        report.explain()
    );
    assert!(!report.console().contains("[bad] RESULT:"));
    assert!(report.transcript.system_off, "{}", report.explain());
}

#[test]
fn the_operator_restarts_a_finished_vm_and_a_running_one() {
    let script = ConsoleScript::new()
        .then("vm0 (a): powered off", "\x1drestart a\r")
        .then("ok: a restarting", "exit\r")
        .then("[a] RESULT: PASS", "\x1drestart b\r")
        .then("ok: b restarting", "exit\r")
        .then("[b] echo: ready", "\x1dstop b\r")
        .then("ok: b stopped", "exit\r");
    let report = run(
        2,
        &["memory,cpus=0,name=a", "echo,cpus=1,name=b,expect=stopped"],
        script,
    );
    assert!(report.passed(), "{}", report.explain());
    assert_eq!(
        times(&report, "[a] RESULT: PASS"),
        2,
        "{}",
        report.explain()
    );
    assert_eq!(times(&report, "[b] echo: ready"), 2, "{}", report.explain());
    assert_eq!(counter(&report, 0, "restarts"), 1, "{}", report.explain());
    assert_eq!(counter(&report, 1, "restarts"), 1, "{}", report.explain());
    // Emptying the stage 2 of the RAM slot: one range flush on `-cpu max`
    // (a memory guest's own run issues none).
    assert!(
        counter(&report, 0, "tlbi_range") >= 1,
        "{}",
        report.explain()
    );
    let a_restarted = log_position(&report, "vm0 (a): restarted");
    let b_stopped = log_position(&report, "vm1 (b): stopped");
    let last = log_position(&report, "no VM left to run");
    assert!(a_restarted < b_stopped && b_stopped < last);
    assert!(report.transcript.system_off, "{}", report.explain());
}

/// `a` leaves patterns in its vector registers and powers off; restarted on
/// the same CPU, it finds them zero.
fn vector_registers_are_cleared_for_the_next_guest(cpu: &str) {
    let script = ConsoleScript::new()
        .then("vm0 (a): powered off", "\x1drestart a\r")
        .then("ok: a restarting", "exit\r")
        .then("[a] RESULT: PASS", "\x1dstop b\r")
        .then("ok: b stopped", "exit\r");
    let report = run_on(
        cpu,
        2,
        &[
            "vector-regs,cpus=0,name=a",
            "echo,cpus=1,name=b,expect=stopped",
        ],
        script,
    );
    assert!(report.passed(), "{}", report.explain());
    let extensions = if cpu == "max" {
        "(SVE on, SME on)"
    } else {
        "(SVE off, SME off)"
    };
    let zero = format!("[a] vector-regs: every vector register started at zero {extensions}");
    assert_eq!(times(&report, &zero), 2, "{}", report.explain());
    assert_eq!(
        times(&report, "[a] vector-regs: patterns left in the registers"),
        2,
        "{}",
        report.explain()
    );
    assert_eq!(counter(&report, 0, "restarts"), 1, "{}", report.explain());
}

#[test]
fn vector_registers_are_cleared_for_the_next_guest_on_cpu_max() {
    vector_registers_are_cleared_for_the_next_guest("max");
}

#[test]
fn vector_registers_are_cleared_for_the_next_guest_on_cortex_a57() {
    vector_registers_are_cleared_for_the_next_guest("cortex-a57");
}
