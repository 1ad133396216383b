//! End-to-end: Debian's arm64 Linux kernel with the runner's busybox
//! initramfs (test `/init`), booted under the hypervisor with 2 vCPUs and
//! 512 MiB of guest RAM, and booted by QEMU directly at EL1 (the baseline,
//! which proves the kernel and the initramfs on their own).
//!
//! The init prints `LINUX-INIT: started`, checks that both CPUs are online
//! (`/proc/cpuinfo` and `/sys/devices/system/cpu/online`), writes 128 MiB
//! through tmpfs and verifies it, prints `RESULT: PASS` and powers off through
//! PSCI. Both kernels find an ITS in their device tree (the hypervisor's
//! virtual one, QEMU's own when booted directly) and probe it cleanly: the
//! init copies the kernel's ITS and LPI messages, which must show the
//! device and collection tables allocated, the LPI property table and a
//! pending table per CPU, and no complaint (a command that timed out or
//! failed, a table that did not stick). A run passes only on `RESULT: PASS` followed by QEMU exiting 0; a
//! kernel oops, `WARNING:`, panic or `BUG:` line, a `RESULT: FAIL`, or a hang
//! (300 s limit) fails it. The kernel and busybox are fetched with apt on the
//! first run and cached in `target/linux/`; no apt (or no root to set up
//! arm64 packages) fails the tests, they never skip.

use qemu_runner::initramfs::{INIT_MARKER, KERNEL_GIC_PREFIX};
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::{Boot, RunConfig, RunReport};
use tests::e2e;

fn run(boot: Boot) -> RunReport {
    let config = RunConfig::linux(boot, LinuxBoot::debian(BusyboxInit::Test));
    assert_eq!(config.guest_cpus(), 2);
    e2e::run(&config)
}

fn check_linux_run(report: &RunReport) {
    e2e::assert_passed(report);
    assert!(
        report.qemu_status.success(),
        "QEMU did not exit 0\n{}",
        report.explain()
    );
    let marker = report
        .time_to(INIT_MARKER)
        .unwrap_or_else(|| panic!("no `{INIT_MARKER}` line\n{}", report.explain()));
    let result = report
        .time_to("RESULT: PASS")
        .unwrap_or_else(|| panic!("no RESULT line\n{}", report.explain()));
    assert!(marker <= result, "{}", report.explain());
    check_its_probe(report);
    for line in [
        "LINUX-INIT: 2 CPUs online (0-1)",
        "LINUX-INIT: 128 MiB written through tmpfs and verified",
    ] {
        assert!(
            e2e::has_line_where(report, |l| l.trim() == line),
            "no `{line}`\n{}",
            report.explain()
        );
    }
}

/// The kernel's GICv3 driver probed the ITS at QEMU `virt`'s address and
/// set up LPIs on both CPUs, and said nothing went wrong.
fn check_its_probe(report: &RunReport) {
    let kernel: Vec<&str> = report
        .console()
        .lines()
        .filter_map(|line| line.trim().strip_prefix(KERNEL_GIC_PREFIX))
        .collect();
    let has = |what: &[&str]| kernel.iter().any(|l| what.iter().all(|w| l.contains(w)));
    for expected in [
        &["ITS@0x0000000008080000: allocated", "Devices"][..],
        &["ITS@0x0000000008080000: allocated", "Interrupt Collections"],
        &["using LPI property table"],
        &["CPU0: using allocated LPI pending table"],
        &["CPU1: using allocated LPI pending table"],
    ] {
        assert!(
            has(expected),
            "no kernel line with {expected:?}: {kernel:#?}"
        );
    }
    for line in &kernel {
        let lower = line.to_lowercase();
        for complaint in [
            "fail",
            "timeout",
            "unable",
            "error",
            "stall",
            "doesn't stick",
        ] {
            assert!(!lower.contains(complaint), "the kernel says `{line}`");
        }
    }
}

#[test]
fn linux_boots_under_the_hypervisor_with_2_vcpus_and_512_mib() {
    let report = run(Boot::Hypervisor);
    check_linux_run(&report);
    e2e::assert_powered_off(&report);
    assert!(
        report.command_line.contains("virtualization=on"),
        "{}",
        report.command_line
    );
    // Two vCPUs sending each other IPIs meet on the vgic's lock; its
    // waits are counted and timed (`devices::vgic::sleeping_lock`).
    let contended = e2e::counter(&report, 0, "vgic_lock_contended");
    let waited = e2e::counter(&report, 0, "vgic_lock_wait_ticks");
    e2e::counter(&report, 0, "vgic_lock_sleeps");
    assert!(contended > 0 && waited > 0, "{}", report.explain());
}

#[test]
fn linux_boots_directly_at_el1() {
    let report = run(Boot::Direct);
    check_linux_run(&report);
    assert!(
        report.hypervisor_log().is_empty(),
        "no hypervisor here\n{}",
        report.explain()
    );
    assert!(
        !report.command_line.contains("virtualization=on"),
        "{}",
        report.command_line
    );
}
