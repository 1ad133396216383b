//! End-to-end: U-Boot boots the hypervisor, as on a board (`--firmware
//! u-boot`).
//!
//! QEMU starts Debian's U-Boot for `virt` (`-bios`, package `u-boot-qemu`,
//! installed by the runner when missing and root) at EL2. U-Boot reads the
//! runner's environment from flash and runs its `bootcmd`: `qfw load` copies
//! the hypervisor `Image` and the boot payload from QEMU's fw_cfg to
//! `kernel_addr_r` / `ramdisk_addr_r`, and `booti` enters the hypervisor with
//! the device tree, to which it has added the payload's
//! `/chosen/linux,initrd-start`/`-end`. Each test requires the guest's
//! `RESULT: PASS`, `[hv] system off`, and proof that this path ran: U-Boot's
//! banner, the boot command's first line and `Starting kernel ...` before the
//! hypervisor's first line, and the hypervisor running at `kernel_addr_r`.
//!
//! Two guests: the SMP test guest (memory scenario, 2 vCPUs) and Debian's
//! Linux kernel with the test `/init` (`--linux-test`: 2 vCPUs, 512 MiB).

use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::uboot::{KERNEL_ADDR, START_MARKER};
use qemu_runner::{Boot, Firmware, RunConfig, RunReport, Scenario};
use tests::e2e::{self, line_index};

fn run(config: RunConfig) -> RunReport {
    e2e::run(&RunConfig {
        firmware: Firmware::UBoot,
        ..config
    })
}

fn check_uboot_boot(report: &RunReport) {
    e2e::assert_powered_off(report);
    for part in [" -bios ", "u-boot.bin", " -nic none ", "virtualization=on"] {
        assert!(
            report.command_line.contains(part),
            "`{part}` missing from {}",
            report.command_line
        );
    }
    let banner = line_index(report, "U-Boot banner", |l| l.starts_with("U-Boot 20"));
    let command = line_index(report, "boot command", |l| l.starts_with(START_MARKER));
    let starting = line_index(report, "`Starting kernel ...`", |l| {
        l == "Starting kernel ..."
    });
    let hypervisor = line_index(report, "hypervisor", |l| l.starts_with("[hv] "));
    assert!(
        banner < command && command < starting && starting < hypervisor,
        "U-Boot did not come first\n{}",
        report.explain()
    );
    let loaded_at = format!("starting at EL2, loaded at {KERNEL_ADDR:#x}");
    assert_eq!(
        report.transcript.log_lines_containing(&loaded_at).count(),
        1,
        "booti did not run the hypervisor at kernel_addr_r\n{}",
        report.explain()
    );
    assert_eq!(
        report
            .transcript
            .log_lines_containing("vm0: ")
            .filter(|line| line.contains(" vCPU(s), "))
            .count(),
        1,
        "the hypervisor did not start the payload's guest\n{}",
        report.explain()
    );
}

#[test]
fn u_boot_boots_the_hypervisor_and_the_test_guest() {
    let report = run(RunConfig {
        boot: Boot::Hypervisor,
        scenario: Scenario::Memory,
        smp: 2,
        ..RunConfig::default()
    });
    check_uboot_boot(&report);
    assert!(
        report
            .console()
            .lines()
            .any(|l| l.starts_with("test-guest:") && l.contains("2 vCPUs")),
        "{}",
        report.explain()
    );
}

#[test]
fn u_boot_boots_the_hypervisor_and_linux() {
    let report = run(RunConfig::linux(
        Boot::Hypervisor,
        LinuxBoot::debian(BusyboxInit::Test),
    ));
    check_uboot_boot(&report);
    for line in [
        "LINUX-INIT: 2 CPUs online (0-1)",
        "LINUX-INIT: 128 MiB written through tmpfs and verified",
    ] {
        assert!(
            e2e::has_line_where(&report, |l| l.trim() == line),
            "no `{line}`\n{}",
            report.explain()
        );
    }
}
