//! End-to-end: memory tagging (FEAT_MTE2) for guests (`mte=on`,
//! `arch::cpu::memory_tagging`), on QEMU's `-machine virt,mte=on` (the
//! runner's `--mte`).
//!
//! * The test guest's `mte` scenario in a tagged VM: the feature shows in
//!   `ID_AA64PFR1_EL1`, every page of a 2 MiB region first reads tag 0,
//!   tag checks pass and fault as the tags say (synchronous faults, and
//!   asynchronous ones recorded in `TFSR_EL1`), `GCR_EL1`, `RGSR_EL1`,
//!   `TFSR_EL1` and `TFSRE0_EL1` keep their values across 20000 exits, and
//!   the abort the hypervisor injects for an access outside RAM enters the
//!   handler with `PSTATE.TCO` set. The same scenario passes on QEMU alone
//!   (the reference), and fails in an untagged VM on the same machine: the
//!   feature is hidden.
//! * Restart: the scenario leaves its region tagged; restarted, it finds
//!   the tags zero again (the hypervisor zeroes tags with the data).
//! * Live migration: the `migrate` scenario with `migrate-tags` tags every
//!   page it writes while it is migrated between two tagged VMs; `verify`
//!   finds 0 differences (tags included) and the guest's check of every
//!   page's tag passes on the destination.
//! * Linux: of two Debian kernels on one tagged machine, the one in an
//!   `mte=on` VM finds `mte` in `/proc/cpuinfo` and the other does not (the
//!   hypervisor hides the feature from a VM that did not ask for it), and
//!   both pass their tmpfs check.
//! * A VM that asks for tagging on a machine without it is refused, naming
//!   the reason, before anything runs.

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::initramfs::MTE_LINE;
use qemu_runner::{Boot, RunConfig, RunReport, Scenario, Verdict};
use tests::e2e;

/// The `mte` scenario's line for each of its checks, up to the figures.
const MTE_CHECKS: [&str; 7] = [
    "test-guest: mte: ID_AA64PFR1_EL1.MTE is ",
    "test-guest: mte: tags start at zero on all 512 pages of ",
    "test-guest: mte: tag check: tag 3 accesses pass, tag 5 load and store fault",
    "test-guest: mte: asynchronous tag check: a tag 5 store completed and TFSR_EL1 recorded it (0x1), kept across 1000 exits",
    "test-guest: mte: GCR_EL1 0xa5c3, RGSR_EL1 0xbeef07, TFSR_EL1 0x3, TFSRE0_EL1 0x1 kept across",
    "test-guest: mte: injected abort at 0x100000000 (ESR 0x96000010) entered with PSTATE.TCO set",
    "test-guest: mte: left non-zero tags on all 512 pages of ",
];

/// Runs `specs` on a tagged machine of `smp` CPUs, typing `script`.
fn run_scripted(smp: u32, specs: &[&str], script: ConsoleScript) -> RunReport {
    e2e::run(&e2e::with_script(
        tagged(smp, specs, Duration::from_secs(300)),
        script,
    ))
}

/// How many console lines contain `text`.
fn times(report: &RunReport, text: &str) -> usize {
    report
        .console()
        .lines()
        .filter(|line| line.contains(text))
        .count()
}

/// Asserts that every check of the `mte` scenario printed its line `count`
/// times.
fn assert_every_check(report: &RunReport, count: usize) {
    for check in MTE_CHECKS {
        assert_eq!(
            times(report, check),
            count,
            "`{check}`\n{}",
            report.explain()
        );
    }
}

/// A payload of `specs` on a machine with memory tagging.
fn tagged(smp: u32, specs: &[&str], timeout: Duration) -> RunConfig {
    RunConfig {
        mte: true,
        ..e2e::vms(smp, specs, timeout)
    }
}

#[test]
fn the_mte_scenario_passes_in_a_tagged_vm() {
    let report = e2e::run(&RunConfig {
        mte: true,
        ..e2e::guest(Scenario::Mte, "max", 2, Duration::from_secs(120))
    });
    e2e::assert_passed(&report);
    assert_every_check(&report, 1);
    assert_eq!(
        e2e::log_count(&report, "vm0: memory tagging on"),
        1,
        "{}",
        report.explain()
    );
}

/// The reference: QEMU's own memory tagging, the guest at EL1 without the
/// hypervisor.
#[test]
fn the_mte_scenario_passes_on_qemu_alone() {
    let report = e2e::run(&RunConfig {
        boot: Boot::Direct,
        mte: true,
        ..e2e::guest(Scenario::Mte, "max", 1, Duration::from_secs(60))
    });
    e2e::assert_passed(&report);
    assert_every_check(&report, 1);
}

/// On a tagged machine a VM without `mte=on` does not see the feature.
#[test]
fn an_untagged_vm_on_a_tagged_machine_does_not_see_the_feature() {
    let report = e2e::run(&tagged(1, &["mte,cpus=0"], Duration::from_secs(60)));
    assert!(!report.passed(), "{}", report.explain());
    assert!(
        report
            .console()
            .contains("the CPU has no FEAT_MTE2 (ID_AA64PFR1_EL1 "),
        "{}",
        report.explain()
    );
    assert_eq!(times(&report, MTE_CHECKS[1]), 0, "{}", report.explain());
}

/// `a` leaves its region tagged and powers off; restarted, it finds every
/// page's tag zero again.
#[test]
fn a_restarted_vm_finds_its_tags_zero() {
    let script = ConsoleScript::new()
        .then("vm0 (a): powered off", "\x1drestart a\r")
        .then("ok: a restarting", "exit\r")
        .then("[a] RESULT: PASS", "\x1dstop b\r")
        .then("ok: b stopped", "exit\r");
    let report = run_scripted(
        2,
        &[
            "mte,mte=on,cpus=0,name=a",
            "echo,cpus=1,name=b,expect=stopped",
        ],
        script,
    );
    e2e::assert_passed(&report);
    assert_every_check(&report, 2);
    assert_eq!(
        times(&report, "[a] RESULT: PASS"),
        2,
        "{}",
        report.explain()
    );
    assert_eq!(
        e2e::counter(&report, 0, "restarts"),
        1,
        "{}",
        report.explain()
    );
}

/// Two vCPUs write and tag pages while the VM migrates into a waiting
/// tagged VM: no byte and no tag differs, and the guest's own check of
/// every page's tag passes on the destination.
#[test]
fn tags_travel_with_a_live_migration() {
    let script = ConsoleScript::new()
        .then(
            "[src] migrate: 2 vCPUs writing",
            "\x1dmigrate src dst verify\r",
        )
        .then("ok: migrating src to dst", "exit\r");
    let report = run_scripted(
        4,
        &[
            "guest=migrate,mte=on,cpus=0-1,name=src,expect=stopped,args=migrate-tags",
            "guest=migrate,mte=on,cpus=2-3,name=dst,start=0",
        ],
        script,
    );
    e2e::assert_passed(&report);
    let explain = report.explain();
    let migrated =
        &report.hypervisor_log()[e2e::log_position(&report, "vm0 (src) -> vm1 (dst): migrated:")];
    assert!(
        migrated.contains(", 0 differences"),
        "{migrated}\n{explain}"
    );
    let console = report.console();
    assert!(
        console.contains("each write with an allocation tag"),
        "{explain}"
    );
    assert!(
        console.contains("[dst] migrate: all 2048 written pages hold their last allocation tag"),
        "{explain}"
    );
    assert!(console.contains("[dst] RESULT: PASS"), "{explain}");
}

#[test]
fn linux_sees_memory_tagging_only_in_the_vm_that_asked_for_it() {
    let report = e2e::run(&RunConfig {
        mem_mib: 1536,
        ..tagged(
            4,
            &["linux,cpus=0-1,mte=on,name=t", "linux,cpus=2-3,name=u"],
            Duration::from_secs(300),
        )
    });
    e2e::assert_passed(&report);
    let explain = report.explain();
    let console = report.console();
    assert!(
        console.contains(&format!("[t] LINUX-INIT: {MTE_LINE}")),
        "{explain}"
    );
    assert!(
        !console.contains(&format!("[u] LINUX-INIT: {MTE_LINE}")),
        "{explain}"
    );
    assert!(
        e2e::log_count(&report, "vm0: memory tagging on") == 1
            && e2e::log_count(&report, "vm1: memory tagging on") == 0,
        "{explain}"
    );
    assert!(console.contains("[t] RESULT: PASS"), "{explain}");
    assert!(console.contains("[u] RESULT: PASS"), "{explain}");
}

#[test]
fn a_vm_asking_for_tagging_on_a_machine_without_it_is_refused() {
    let report = e2e::run(&e2e::vms(
        2,
        &["memory,cpus=0,mte=on,name=t", "memory,cpus=1,name=u"],
        Duration::from_secs(60),
    ));
    match &report.verdict {
        Verdict::GuestNotStarted(why) => assert!(
            why.contains("vm0 (t): mte=on") && why.contains("no memory tagging"),
            "{why}"
        ),
        other => panic!("expected a refusal, got {other}\n{}", report.explain()),
    }
    assert!(
        !report.console().contains("RESULT:"),
        "{}",
        report.explain()
    );
}
