//! End-to-end: Debian's arm64 Linux booted directly by QEMU (no hypervisor)
//! with QEMU's own virtio-mmio devices, which proves the guest side of the
//! virtio work on its own: the initramfs's modules (`virtio_mmio`,
//! `virtio_blk`, `virtio_net`, ext4 and what they depend on) load, and the
//! test init's disk and net roles pass. It is also the baseline of the
//! `virtio` benchmarks (the same Linux on QEMU's virtio-blk and virtio-net).
//!
//! - Disk: the host makes ext4 on a fresh image (`mkfs.ext4`), the first
//!   boot (`disk-write`) mounts it, writes `/hv/check.txt`, syncs, unmounts
//!   and times raw sequential I/O past the file system; the host reads the
//!   file back from the image (`debugfs`); a second boot (`disk-check`)
//!   mounts the image read-only (`:ro`) and checks the file.
//! - Net: two QEMUs joined by a socket on 127.0.0.1; the guests ping each
//!   other and move 64 MiB over TCP with busybox `nc`, checked by md5.
//! - Console: with `console=hvc0` and QEMU's virtconsole writing to a file,
//!   the test init moves to `hvc0`: its lines, `RESULT: PASS` included, are
//!   in the file and not on the PL011 (the initramfs is given as a file, so
//!   the runner expects no verdict on the PL011, only QEMU's clean exit).
//!
//! A run passes on each guest's `RESULT: PASS` and QEMU's clean exit; a
//! module that does not load, a missing device or a wrong md5 is a
//! `RESULT: FAIL` naming it.

use qemu_runner::initramfs::{NET_TRANSFER_MIB, disk_check_contents};
use qemu_runner::linux::{BusyboxInit, InitrdSource, LinuxBoot, default_cmdline};
use qemu_runner::qemu::HostDisk;
use qemu_runner::{Boot, RunConfig, RunReport};
use tests::e2e;
use tests::linux_virtio::{
    direct, disk_check_role, disk_file, disk_image, disk_write_role, figure, run_net_pair,
};

/// Prints the run's `BENCH:` lines (kept in the test's output).
fn print_figures(what: &str, report: &RunReport) {
    for (name, value, unit) in qemu_runner::initramfs::bench_figures(report.console()) {
        eprintln!("{what}: {name} {value} {unit}");
    }
}

fn assert_no_module_failed(report: &RunReport) {
    assert!(
        !e2e::has_line(report, "did not load"),
        "a module did not load\n{}",
        report.explain()
    );
}

#[test]
fn an_ext4_file_written_on_qemus_virtio_blk_reaches_the_image_and_a_second_boot() {
    let image = disk_image("e2e-virtio-direct-disk");
    let write = e2e::run(&direct(
        &disk_write_role(true),
        &[HostDisk {
            path: image.clone(),
            read_only: false,
        }],
        None,
    ));
    print_figures("disk-write", &write);
    e2e::assert_passed(&write);
    assert_no_module_failed(&write);
    assert!(
        write
            .command_line
            .contains("-device virtio-blk-device,drive=disk0"),
        "{}",
        write.command_line
    );
    assert!(
        e2e::has_line(&write, "LINUX-INIT: wrote /hv/check.txt on /dev/vda"),
        "{}",
        write.explain()
    );
    for name in ["blk_seq_write_mib_per_s", "blk_seq_read_mib_per_s"] {
        assert!(figure(&write, name) > 0.0, "{}", write.explain());
    }
    let on_host = disk_file(&image);
    let expected = disk_check_contents();
    assert!(
        on_host == expected,
        "/hv/check.txt read from the image on the host differs: {} bytes, expected {}; first \
         differing line: {:?}",
        on_host.len(),
        expected.len(),
        on_host
            .lines()
            .zip(expected.lines())
            .find(|(found, wanted)| found != wanted)
    );

    let check = e2e::run(&direct(
        &disk_check_role(true),
        &[HostDisk {
            path: image.clone(),
            read_only: true,
        }],
        None,
    ));
    print_figures("disk-check", &check);
    e2e::assert_passed(&check);
    assert!(
        e2e::has_line(&check, "LINUX-INIT: /hv/check.txt on /dev/vda reads back"),
        "{}",
        check.explain()
    );
    assert!(figure(&check, "blk_seq_read_mib_per_s") > 0.0);
    assert!(
        !e2e::has_line(&check, "blk_seq_write_mib_per_s"),
        "a read-only disk is not written\n{}",
        check.explain()
    );
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn two_direct_qemus_on_one_segment_ping_and_move_64_mib_over_tcp() {
    let (server, client) = run_net_pair();
    print_figures("net-server", &server);
    print_figures("net-client", &client);
    for report in [&server, &client] {
        e2e::assert_passed(report);
        assert_no_module_failed(report);
        assert!(figure(report, "net_ping_us") > 0.0, "{}", report.explain());
    }
    assert!(
        e2e::has_line(
            &server,
            &format!("LINUX-INIT: received {NET_TRANSFER_MIB} MiB over TCP, md5")
        ),
        "{}",
        server.explain()
    );
    assert!(
        figure(&client, "net_tcp_mib_per_s") > 0.0,
        "{}",
        client.explain()
    );
    assert!(
        server.command_line.contains("listen=127.0.0.1:")
            && client.command_line.contains("connect=127.0.0.1:"),
        "{}\n{}",
        server.command_line,
        client.command_line
    );
}

#[test]
fn the_test_init_moves_to_hvc0_when_the_command_line_says_so() {
    let dir = qemu_runner::artifacts::workspace_root()
        .join("target")
        .join("tmp");
    std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("{error}"));
    let hvc0 = dir.join("e2e-virtio-direct-hvc0.txt");
    let initrd = dir.join("e2e-virtio-direct-initrd.cpio");
    let _ = std::fs::remove_file(&hvc0);
    let test_init = LinuxBoot::debian(BusyboxInit::Test);
    let files = qemu_runner::linux::resolve(&test_init, qemu_runner::LINUX_SMP)
        .unwrap_or_else(|error| panic!("{error}"));
    std::fs::write(&initrd, files.initrd.expect("a busybox initramfs"))
        .unwrap_or_else(|error| panic!("{error}"));
    let config = RunConfig {
        extra_qemu_args: [
            "-chardev".to_string(),
            format!("file,id=hvc0,path={}", hvc0.display()),
            "-device".into(),
            "virtio-serial-device".into(),
            "-device".into(),
            "virtconsole,chardev=hvc0".into(),
        ]
        .to_vec(),
        ..RunConfig::linux(
            Boot::Direct,
            LinuxBoot {
                initrd: InitrdSource::File(initrd.clone()),
                cmdline: Some(format!(
                    "{} console=hvc0",
                    default_cmdline(&InitrdSource::Busybox(BusyboxInit::Test))
                )),
                ..test_init
            },
        )
    };
    let report = e2e::run(&config);
    e2e::assert_passed(&report);
    let on_hvc0 = std::fs::read_to_string(&hvc0).unwrap_or_else(|error| panic!("{error}"));
    for line in [
        "LINUX-INIT: console moved to /dev/hvc0",
        "LINUX-INIT: 2 CPUs online (0-1)",
        "RESULT: PASS",
    ] {
        assert!(
            on_hvc0.lines().any(|l| l.trim() == line),
            "no `{line}` on hvc0:\n{on_hvc0}\n{}",
            report.explain()
        );
    }
    assert!(
        !e2e::has_line(&report, "RESULT:"),
        "the init's lines went to the PL011\n{}",
        report.explain()
    );
    let _ = std::fs::remove_file(&hvc0);
    let _ = std::fs::remove_file(&initrd);
}
