//! End-to-end: the hypervisor finds and drives the host's virtio-mmio disks.
//! Two raw images with known contents (1 MiB, then 2 MiB given read-only)
//! are attached as QEMU's own `virtio-blk-device`s; the hypervisor must
//! number them in command-line order (host disk 0 is the first, at the
//! highest virtio-mmio window), log their size, the read-only flag of the
//! second, and the first 16 bytes of each one's sector 0 as read through
//! its EL2 driver, and leave both images untouched. Run with QEMU 7.2's
//! default legacy virtio-mmio (version 1) and with version 2
//! (`-global virtio-mmio.force-legacy=false`), where the second disk's
//! `serial` must come back as its `GET_ID`. A disk whose serial is
//! `hv-write-check` is written at boot (4 KiB at sector 8, from spans that
//! straddle sectors), flushed and read back; the test finds the bytes in
//! the image file and the rest of it unchanged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use qemu_runner::{RunReport, Scenario};
use tests::e2e;

/// The byte at `offset` of image `disk`: a pattern that differs between
/// the disks and from sector to sector.
fn pattern(disk: usize, offset: usize) -> u8 {
    (offset * (3 + 2 * disk) + 1 + 6 * disk + offset / 512) as u8
}

/// Writes image `disk` of `mib` MiB under `dir` and returns its path and
/// contents.
fn image(dir: &Path, disk: usize, mib: usize) -> (PathBuf, Vec<u8>) {
    let bytes: Vec<u8> = (0..mib << 20).map(|i| pattern(disk, i)).collect();
    let path = dir.join(format!("disk{disk}.img"));
    std::fs::write(&path, &bytes).expect("writing a test image");
    (path, bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Boots the test guest with the two disks attached (and `more` QEMU
/// arguments first), checks the boot lines and that the images are
/// unchanged; returns the report for further checks.
fn boot_with_two_disks(name: &str, more: &[&str], serial: &str) -> RunReport {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let (first, first_bytes) = image(&dir, 0, 1);
    let (second, second_bytes) = image(&dir, 1, 2);
    let mut config = e2e::guest(
        Scenario::Memory,
        qemu_runner::DEFAULT_CPU,
        2,
        Duration::from_secs(120),
    );
    config.extra_qemu_args = more.iter().map(|s| s.to_string()).collect();
    config.extra_qemu_args.extend(
        [
            format!("file={},if=none,format=raw,id=hd0", first.display()),
            "virtio-blk-device,drive=hd0".to_string(),
            format!(
                "file={},if=none,format=raw,id=hd1,readonly=on",
                second.display()
            ),
            format!("virtio-blk-device,drive=hd1,serial={serial}"),
        ]
        .into_iter()
        .zip(["-drive", "-device", "-drive", "-device"])
        .flat_map(|(value, flag)| [flag.to_string(), value]),
    );
    let report = e2e::run(&config);
    e2e::assert_powered_off(&report);
    let explain = report.explain();

    let first_line = e2e::log_position(&report, "host disk 0: 2048 sectors (1 MiB) at 0xa003e00");
    let second_line = e2e::log_position(
        &report,
        "host disk 1: 4096 sectors (2 MiB), read-only at 0xa003c00",
    );
    assert!(first_line < second_line, "{explain}");
    assert_eq!(e2e::log_count(&report, "read-only"), 1, "{explain}");
    assert_eq!(e2e::log_count(&report, "host disk 2:"), 0, "{explain}");
    for (disk, bytes) in [(0, &first_bytes), (1, &second_bytes)] {
        e2e::log_position(
            &report,
            &format!("host disk {disk}: sector 0 begins {}", hex(&bytes[..16])),
        );
        e2e::log_position(&report, &format!("host disk {disk}: read timing at "));
    }
    assert_eq!(
        std::fs::read(&first).expect("the first image"),
        first_bytes,
        "the boot wrote to the first image\n{explain}"
    );
    assert_eq!(
        std::fs::read(&second).expect("the second image"),
        second_bytes,
        "the boot wrote to the second image\n{explain}"
    );
    assert_eq!(e2e::log_count(&report, "ERROR"), 0, "{explain}");
    report
}

/// The byte the hypervisor's write check writes at `offset` of its 4 KiB
/// (`drivers::host_disk::disks::write_check_byte`).
fn write_check_byte(offset: usize) -> u8 {
    (offset * 13 + 5 + offset / 512) as u8
}

#[test]
fn a_scratch_disk_is_written_flushed_and_read_back_at_el2() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("write-check");
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let (path, before) = image(&dir, 0, 1);
    let mut config = e2e::guest(
        Scenario::Memory,
        qemu_runner::DEFAULT_CPU,
        2,
        Duration::from_secs(120),
    );
    config.extra_qemu_args = [
        "-drive".to_string(),
        format!("file={},if=none,format=raw,id=hd0", path.display()),
        "-device".to_string(),
        "virtio-blk-device,drive=hd0,serial=hv-write-check".to_string(),
    ]
    .to_vec();
    let report = e2e::run(&config);
    e2e::assert_powered_off(&report);
    let explain = report.explain();
    // The three spans are the data buffers of one request, the two spans
    // read back those of another (`drivers::host_disk::request_plan`).
    e2e::log_position(
        &report,
        "host disk 0: write check passed: 4096 bytes at sector 8 written from 3 spans in \
         1 request, flushed, read back into 2 spans in 1 request",
    );
    let after = std::fs::read(&path).expect("the image");
    let at = 8 * 512;
    let expected: Vec<u8> = (0..4096).map(write_check_byte).collect();
    assert_eq!(after[at..at + 4096], expected[..], "{explain}");
    assert_eq!(after[..at], before[..at], "{explain}");
    assert_eq!(after[at + 4096..], before[at + 4096..], "{explain}");
}

#[test]
fn two_legacy_disks_are_numbered_in_command_line_order() {
    let report = boot_with_two_disks("legacy", &[], "disk-b");
    e2e::log_position(&report, "host disk 0: virtio-mmio legacy (version 1)");
    e2e::log_position(
        &report,
        "host disk 1: virtio-mmio legacy (version 1), id \"disk-b\"",
    );
}

#[test]
fn two_version_2_disks_are_numbered_in_command_line_order() {
    let report = boot_with_two_disks(
        "modern",
        &["-global", "virtio-mmio.force-legacy=false"],
        "second-disk",
    );
    e2e::log_position(
        &report,
        "host disk 0: virtio-mmio version 2, id \"hostdisk0\"",
    );
    e2e::log_position(
        &report,
        "host disk 1: virtio-mmio version 2, id \"second-disk\"",
    );
}
