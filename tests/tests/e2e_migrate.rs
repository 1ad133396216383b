//! End-to-end: live migration of a running test guest into a waiting VM.
//!
//! `src` runs the `migrate` scenario (it writes pseudo-random pages of an
//! 8 MiB region for 8 s, recording what it wrote, then checks every page);
//! `dst` is created with `start=0` and waits. As soon as `src` says it is
//! writing, the console monitor is told `migrate src dst verify`: the
//! hypervisor pre-copies with dirty logging while `src` writes (throttling
//! it until the rest fits the downtime limit), pauses it, copies the
//! last dirty pages and the vCPU state (registers, EL1 system registers,
//! FP/SIMD, SVE and SME with streaming mode and the ZA array, timers, the
//! virtual CPU interface), checks the destination's
//! memory byte for byte (`verify`: 0 differences), copies the vgic and
//! PL011 state and starts `dst`, and ends `src` (`stopped: migrated to vm1
//! (dst)`). The
//! guest then finishes on `dst`: its check of every page it wrote passes,
//! and its console lines carry `[dst]`. On `-cpu max` (FEAT_S2FWB) and on
//! `cortex-a57` (no FWB: every copy is cleaned to the point of coherency).
//!
//! With two vCPUs, both take their virtual timer's interrupt every 10 ms
//! throughout, and each checks its last tick is recent at the end: a timer
//! or interrupt lost in the switch fails it. On `-cpu max` the second runs in
//! SME streaming mode with the ZA array live, a pattern in its streaming
//! registers and every ZA row, and checks it on the destination.
//!
//! Linux too: Debian's kernel with 2 vCPUs is migrated in the middle of its
//! tmpfs md5 check and finishes it on the destination.

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::{RunConfig, RunReport};
use tests::e2e;

/// Boots `src` and a waiting `dst` and types `migrate src dst verify` (the
/// byte-for-byte check on) on the console monitor once `marker` appears.
fn migrate(cpu: &str, smp: u32, mem_mib: u32, marker: &str, src: &str, dst: &str) -> RunReport {
    let script = ConsoleScript::new()
        .then(marker, "\x1dmigrate src dst verify\r")
        .then("ok: migrating src to dst", "exit\r");
    let config = RunConfig {
        cpu: cpu.to_string(),
        mem_mib,
        ..e2e::vms(smp, &[src, dst], Duration::from_secs(300))
    };
    e2e::run(&e2e::with_script(config, script))
}

fn run(cpu: &str) -> RunReport {
    migrate(
        cpu,
        2,
        1024,
        "[src] migrate: 1 vCPUs writing",
        "guest=migrate,cpus=0,name=src,expect=stopped",
        "guest=migrate,cpus=1,name=dst,start=0",
    )
}

/// The run passed and the hypervisor reports a checked migration without
/// differences.
fn check_migrated(report: &RunReport) {
    e2e::assert_passed(report);
    let migrated =
        &report.hypervisor_log()[e2e::log_position(report, "vm0 (src) -> vm1 (dst): migrated:")];
    assert!(migrated.contains(" us, verify "), "{migrated}");
    assert!(migrated.contains(", 0 differences"), "{migrated}");
}

fn check(report: &RunReport) {
    check_migrated(report);
    let explain = report.explain();
    assert!(
        report
            .hypervisor_log()
            .iter()
            .any(|line| line.contains("vm0 (src): stopped: migrated to vm1 (dst)")),
        "{explain}"
    );
    // The guest finished on the destination.
    let console = report.console();
    assert!(console.contains("[dst] migrate: all"), "{explain}");
    assert!(console.contains("[dst] RESULT: PASS"), "{explain}");
    assert!(!console.contains("[src] RESULT:"), "{explain}");
}

/// On `-cpu max` the guest also keeps a pattern in every SVE register
/// across the switch.
#[test]
fn a_writing_guest_migrates_on_cpu_max() {
    let report = run("max");
    check(&report);
    assert!(
        report
            .console()
            .contains("[dst] migrate: the SVE registers kept their pattern"),
        "{}",
        report.explain()
    );
}

#[test]
fn a_writing_guest_migrates_on_cortex_a57() {
    check(&run("cortex-a57"));
}

/// Two vCPUs, each writing its own pages and taking its virtual timer's
/// interrupt every 10 ms: both timers tick on after the switch. vCPU 1 is
/// in streaming mode with ZA live throughout: its pattern survives.
#[test]
fn a_writing_guest_with_two_vcpus_and_ticking_timers_migrates() {
    let report = migrate(
        "max",
        4,
        1024,
        "[src] migrate: 2 vCPUs writing",
        "guest=migrate,cpus=0-1,name=src,expect=stopped",
        "guest=migrate,cpus=2-3,name=dst,start=0",
    );
    check(&report);
    for cpu in 0..2 {
        let ticked = report.console().lines().any(|line| {
            line.starts_with(&format!("[dst] migrate: vcpu{cpu}: "))
                && line.ends_with(" timer interrupts, the last one recent")
        });
        assert!(ticked, "vcpu{cpu}\n{}", report.explain());
    }
    assert!(
        report
            .console()
            .contains("[dst] migrate: vcpu1's streaming registers and ZA kept their pattern"),
        "{}",
        report.explain()
    );
}

/// Debian's Linux (2 vCPUs, 384 MiB, the unattended tmpfs md5 check) is
/// migrated as soon as it reports its CPUs online, that is while it writes
/// and checks its tmpfs file; it finishes on the destination. The CPU has
/// SVE and SME, which Linux turns on: their state travels.
#[test]
fn linux_migrates_in_the_middle_of_its_md5_check() {
    // Each VM's RAM is allocated as a power of two (512 MiB).
    let report = migrate(
        "max,pauth=off",
        4,
        2048,
        "[src] LINUX-INIT: 2 CPUs online",
        "linux,cpus=0-1,mem=384,name=src,expect=stopped",
        "linux,cpus=2-3,mem=384,name=dst,start=0",
    );
    check_migrated(&report);
    let explain = report.explain();
    let console = report.console();
    assert!(
        console.contains("[dst] LINUX-INIT: 128 MiB written through tmpfs and verified"),
        "{explain}"
    );
    assert!(console.contains("[dst] RESULT: PASS"), "{explain}");
}
