//! End-to-end: Debian's arm64 Linux under the hypervisor with the
//! hypervisor's own virtio devices (virtio-mmio version 2, served at EL2).
//!
//! - Net: two Linux VMs on one network (`net=lan`) of the hypervisor's
//!   switch ping each other and move 64 MiB over TCP with busybox `nc`,
//!   checked by md5 on the receiving side.
//! - Disk: the runner gives QEMU a raw image as its own virtio-blk; the
//!   hypervisor drives it at EL2 and serves it to the VM as the VM's
//!   virtio-blk. The first boot mounts the ext4 file system the host made,
//!   writes a file, syncs and powers off; the host reads the file back from
//!   the image (`debugfs`); a second boot, with the disk read-only, reads it
//!   too. Once on `-cpu max` (FEAT_S2FWB), once on `cortex-a57` (no FWB).
//! - Control port: a `control=1` VM with `console=virtio` has a second
//!   virtio-console wired to the monitor: its Linux writes `vms` to
//!   `/dev/hvc1` and reads the monitor's answer back.
//! - Migration: the sending VM of a TCP transfer is migrated in the middle
//!   of it; the destination carries its virtio-net (rings, MAC, switch port)
//!   and the receiver's md5 still matches. A VM that rewrites a file on its
//!   disk in rounds (each synced, its page cache dropped, read back through
//!   the device) is migrated in the middle of them; the destination, on the
//!   same host disk, goes on, and the image holds the last round's file.
//!
//! Each run passes on every VM's `RESULT: PASS` (the test init prints
//! `RESULT: FAIL <why>` for a module that does not load, a missing device, a
//! wrong md5), and the hypervisor's `STAT` counters show the devices moved
//! the data.

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::initramfs::{
    NET_TRANSFER_MIB, Role, disk_check_contents, disk_rounds_contents, disk_rounds_done,
};
use qemu_runner::{RunConfig, RunReport};
use tests::e2e;
use tests::linux_virtio::{
    disk_check_role, disk_file, disk_image, disk_rewrite_role, disk_rounds_file, disk_write_role,
    figure, linux_vm_spec, net_client_role, net_server_role,
};

/// Time for a run with two Linux VMs and a 64 MiB transfer under TCG.
const NET_TIMEOUT: Duration = Duration::from_secs(900);
/// Time for one Linux VM's disk run.
const DISK_TIMEOUT: Duration = Duration::from_secs(300);

fn assert_no_module_failed(report: &RunReport) {
    assert!(
        !e2e::has_line(report, "did not load"),
        "a module did not load\n{}",
        report.explain()
    );
}

/// Two Linux VMs (2 vCPUs, 384 MiB each) on network `lan`: `a` serves,
/// `b` sends.
fn net_pair(cpu: &str) -> RunReport {
    let server = linux_vm_spec("a", "0-1", &["net=lan", "mem=384"], &net_server_role());
    let client = linux_vm_spec("b", "2-3", &["net=lan", "mem=384"], &net_client_role());
    let config = RunConfig {
        cpu: cpu.to_string(),
        mem_mib: 2048,
        ..e2e::vms(4, &[&server, &client], NET_TIMEOUT)
    };
    e2e::run(&config)
}

#[test]
fn two_linux_vms_on_one_network_ping_and_move_64_mib_over_tcp() {
    let report = net_pair("max,pauth=off");
    e2e::assert_passed(&report);
    assert_no_module_failed(&report);
    let explain = report.explain();
    assert!(
        report.console().contains(&format!(
            "[a] LINUX-INIT: received {NET_TRANSFER_MIB} MiB over TCP, md5"
        )),
        "{explain}"
    );
    assert!(figure(&report, "net_ping_us") > 0.0, "{explain}");
    assert!(figure(&report, "net_tcp_mib_per_s") > 0.0, "{explain}");
    // The frames went through the hypervisor's switch: at least 64 MiB of
    // 1500-byte frames from b to a.
    let frames = u64::from(NET_TRANSFER_MIB) * (1 << 20) / 1500;
    assert!(
        e2e::counter(&report, 1, "virtio_net_tx_frames") >= frames,
        "{explain}"
    );
    assert!(
        e2e::counter(&report, 0, "virtio_net_rx_frames") >= frames,
        "{explain}"
    );
}

/// Writes the check file through the hypervisor's virtio-blk on a fresh
/// image, reads it back on the host, then boots again with the disk
/// read-only and checks it in the guest.
fn disk_persists(cpu: &str, image_name: &str) {
    let image = disk_image(image_name);
    let disk = format!("disk={}", image.display());
    let write = e2e::run(&RunConfig {
        cpu: cpu.to_string(),
        ..e2e::vms(
            2,
            &[&linux_vm_spec(
                "w",
                "0-1",
                &[&disk],
                &disk_write_role(false),
            )],
            DISK_TIMEOUT,
        )
    });
    e2e::assert_passed(&write);
    assert_no_module_failed(&write);
    assert!(
        e2e::has_line(&write, "LINUX-INIT: wrote /hv/check.txt on /dev/vda"),
        "{}",
        write.explain()
    );
    assert!(
        e2e::counter(&write, 0, "virtio_blk_write_bytes") > 0,
        "{}",
        write.explain()
    );
    let on_host = disk_file(&image);
    assert!(
        on_host == disk_check_contents(),
        "/hv/check.txt read from the image on the host differs ({} bytes)\n{}",
        on_host.len(),
        write.explain()
    );

    let ro = format!("disk={}:ro", image.display());
    let check = e2e::run(&RunConfig {
        cpu: cpu.to_string(),
        ..e2e::vms(
            2,
            &[&linux_vm_spec("r", "0-1", &[&ro], &disk_check_role(false))],
            DISK_TIMEOUT,
        )
    });
    e2e::assert_passed(&check);
    assert!(
        e2e::has_line(&check, "LINUX-INIT: /hv/check.txt on /dev/vda reads back"),
        "{}",
        check.explain()
    );
    assert_eq!(
        e2e::counter(&check, 0, "virtio_blk_write_bytes"),
        0,
        "a read-only disk is not written\n{}",
        check.explain()
    );
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn an_ext4_file_written_through_the_hypervisors_virtio_blk_reaches_the_image() {
    disk_persists("max,pauth=off", "e2e-virtio-disk-max");
}

#[test]
fn an_ext4_file_written_through_the_hypervisors_virtio_blk_reaches_the_image_on_cortex_a57() {
    disk_persists("cortex-a57", "e2e-virtio-disk-a57");
}

#[test]
fn a_control_vm_runs_monitor_commands_through_hvc1() {
    let control = linux_vm_spec(
        "ctl",
        "0-1",
        &["console=virtio", "control=1"],
        &Role::ConsoleControl {
            expect: "other".into(),
        },
    );
    let other = "guest=echo,cpus=2,name=other,expect=running";
    let report = e2e::run(&RunConfig {
        mem_mib: 1024,
        ..e2e::vms(3, &[&control, other], DISK_TIMEOUT)
    });
    let explain = report.explain();
    assert!(report.console().contains("[ctl] RESULT: PASS"), "{explain}");
    assert!(
        e2e::has_line(&report, "CONTROL (raw): ") && e2e::has_line(&report, "CONTROL (echo): "),
        "{explain}"
    );
    assert_no_module_failed(&report);
}

/// The sender `src` is migrated to `dst` (same MAC, same network) once the
/// transfer has started; the receiver's md5 still matches.
#[test]
fn a_linux_vm_migrates_in_the_middle_of_a_tcp_transfer() {
    let mac = "mac=52:54:00:00:00:0b";
    let server = linux_vm_spec("a", "0-1", &["net=lan", "mem=384"], &net_server_role());
    let src = format!(
        "{},expect=stopped",
        linux_vm_spec(
            "src",
            "2-3",
            &["net=lan", mac, "mem=384"],
            &net_client_role()
        )
    );
    let dst = linux_vm_spec(
        "dst",
        "4-5",
        &["net=lan", mac, "mem=384", "start=0"],
        &net_client_role(),
    );
    let script = ConsoleScript::new()
        .then("[src] BENCH: net_ping_us", "\x1dmigrate src dst verify\r")
        .then("ok: migrating src to dst", "exit\r");
    let config = RunConfig {
        mem_mib: 2560,
        ..e2e::vms(6, &[&server, &src, &dst], NET_TIMEOUT)
    };
    let report = e2e::run(&e2e::with_script(config, script));
    let explain = report.explain();
    assert!(
        e2e::has_line(&report, "vm1 (src) -> vm2 (dst): migrated:"),
        "{explain}"
    );
    assert!(
        report.console().contains(&format!(
            "[a] LINUX-INIT: received {NET_TRANSFER_MIB} MiB over TCP, md5"
        )),
        "{explain}"
    );
    assert!(report.console().contains("[a] RESULT: PASS"), "{explain}");
    assert!(report.console().contains("[dst] RESULT: PASS"), "{explain}");
}

/// How long `src` rewrites its rounds file: ten times what a 384 MiB
/// migration with `verify` took under TCG (6 s, 3 s of it the byte-for-byte
/// check), so the migration lands in the middle of the rounds.
const DISK_REWRITE_SECONDS: u32 = 60;
/// Time for the disk migration run (about 2 minutes alone on 2 cores).
const DISK_MIGRATE_TIMEOUT: Duration = Duration::from_secs(540);

/// `src` rewrites a file on its disk in rounds (each synced, its page cache
/// dropped, read back through the device and checked by md5) and is
/// migrated to `dst` in the middle of them; `dst` serves the same host disk
/// (one image, one QEMU drive) and goes on. The last round's file, and the
/// file written after the rounds, read back right from the image on the
/// host.
#[test]
fn a_linux_vm_migrates_while_it_rewrites_its_disk() {
    let image = disk_image("e2e-virtio-disk-migrate");
    let disk = format!("disk={}", image.display());
    let role = disk_rewrite_role(DISK_REWRITE_SECONDS);
    let src = format!(
        "{},expect=stopped",
        linux_vm_spec("src", "0-1", &[&disk, "mem=384"], &role)
    );
    let dst = linux_vm_spec("dst", "2-3", &[&disk, "mem=384", "start=0"], &role);
    let script = ConsoleScript::new()
        .then(
            "[src] LINUX-INIT: disk round 2",
            "\x1dmigrate src dst verify\r",
        )
        .then("ok: migrating src to dst", "exit\r");
    let config = RunConfig {
        mem_mib: 2048,
        ..e2e::vms(4, &[&src, &dst], DISK_MIGRATE_TIMEOUT)
    };
    let report = e2e::run(&e2e::with_script(config, script));
    let explain = report.explain();
    let console = report.console();
    assert!(
        report
            .command_line
            .matches("-device virtio-blk-device")
            .count()
            == 1,
        "one drive for the image both VMs name\n{}",
        report.command_line
    );
    assert!(
        e2e::has_line(&report, "vm0 (src) -> vm1 (dst): migrated:"),
        "{explain}"
    );
    assert!(console.contains("[dst] RESULT: PASS"), "{explain}");
    assert!(
        console.contains("[dst] LINUX-INIT: disk round"),
        "the migration ended after the rounds: the destination wrote none\n{explain}"
    );
    assert!(
        e2e::counter(&report, 1, "virtio_blk_write_bytes") > 0
            && e2e::counter(&report, 1, "virtio_blk_read_bytes") > 0,
        "the destination read and wrote the disk through the carried device\n{explain}"
    );
    let rounds = disk_rounds_done(console).expect("the rounds never ended");
    let on_host = disk_rounds_file(&image);
    assert!(
        on_host == disk_rounds_contents(rounds),
        "the rounds file in the image is not round {rounds}'s ({} bytes, first line {:?})\n{explain}",
        on_host.len(),
        on_host.lines().next()
    );
    assert!(
        disk_file(&image) == disk_check_contents(),
        "the file written after the rounds differs in the image\n{explain}"
    );
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}
