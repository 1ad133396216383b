//! End-to-end: memory tagging (FEAT_MTE2) for guests (`mte=on`,
//! `arch::cpu::memory_tagging`), on QEMU's `-machine virt,mte=on` (the
//! runner's `--mte`).
//!
//! * Linux: of two Debian kernels on one tagged machine, the one in an
//!   `mte=on` VM finds `mte` in `/proc/cpuinfo` and the other does not (the
//!   hypervisor hides the feature from a VM that did not ask for it), and
//!   both pass their tmpfs check.
//! * A VM that asks for tagging on a machine without it is refused, naming
//!   the reason, before anything runs.

use std::time::Duration;

use qemu_runner::initramfs::MTE_LINE;
use qemu_runner::{RunConfig, Verdict};
use tests::e2e;

/// A payload of `specs` on a machine with memory tagging.
fn tagged(smp: u32, specs: &[&str], timeout: Duration) -> RunConfig {
    RunConfig {
        mte: true,
        ..e2e::vms(smp, specs, timeout)
    }
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
