//! Linux guests with virtio devices, for the end-to-end tests and the
//! `virtio` benchmarks: disk images, command lines with a test init's role,
//! Linux booted directly on QEMU with QEMU's own virtio devices (the guest
//! side proven without the hypervisor, and the benchmarks' baseline), and
//! two such QEMUs on one Ethernet segment.
//!
//! - [`disk_image`]: a fresh raw image with ext4 on its first
//!   [`DISK_FS_MIB`] MiB and [`DISK_BENCH_MIB`] MiB of raw space after it
//!   ([`disk_image_with_raw`]: as much raw space as asked).
//! - [`role_cmdline`]: the test init's default command line with a role's
//!   words ([`Role`]); [`role_args`] the same words for a `--vm` spec's
//!   `args=`.
//! - [`direct`]: a [`RunConfig`] that boots the test init on QEMU alone
//!   with a role, disks and a network.
//! - [`run_net_pair`]: the net server and client on two direct QEMUs joined
//!   by a socket on `127.0.0.1` (the listener starts first; the runner
//!   waits for it before starting the other).
//! - [`disk_file`]: the file the disk roles wrote, read from the image on
//!   the host ([`qemu_runner::disk_image::read_ext4_file`]).
//! - [`figure`]: a `BENCH:` figure a role printed.
//! - [`linux_vm_spec`]: a `--vm` spec of a Linux VM running a role under the
//!   hypervisor (for [`crate::e2e::vms`]).
//! - [`direct_blk_baseline`]: the sequential write and read MiB/s of Linux
//!   directly on QEMU's virtio-blk over an image (the `virtio/blk/*_ratio`
//!   baseline).

use std::path::{Path, PathBuf};

use qemu_runner::initramfs::{DISK_CHECK_PATH, DISK_ROUNDS_PATH, Role, bench_figures};
use qemu_runner::linux::{BusyboxInit, InitrdSource, LinuxBoot, default_cmdline};
use qemu_runner::qemu::{HostDisk, QemuNet};
use qemu_runner::{Boot, RunConfig, RunReport};

/// Size of the ext4 file system on a [`disk_image`], in MiB.
pub const DISK_FS_MIB: u32 = 64;
/// Raw space after the file system, for the timed sequential I/O, in MiB.
pub const DISK_BENCH_MIB: u32 = 128;
/// Guest address of the net server.
pub const SERVER_IP: &str = "10.0.0.1";
/// Guest address of the net client.
pub const CLIENT_IP: &str = "10.0.0.2";

/// The disk write role on a [`disk_image`]: the file, then (with `bench`)
/// [`DISK_BENCH_MIB`] MiB timed past the file system.
pub fn disk_write_role(bench: bool) -> Role {
    Role::DiskWrite {
        bench_mib: if bench { DISK_BENCH_MIB } else { 0 },
        bench_skip_mib: DISK_FS_MIB,
        rewrite_seconds: 0,
    }
}

/// The disk write role on a [`disk_image`] that first rewrites
/// [`DISK_ROUNDS_PATH`] in rounds for `seconds` (each round synced, its
/// page cache dropped and the file read back from the disk).
pub fn disk_rewrite_role(seconds: u32) -> Role {
    Role::DiskWrite {
        bench_mib: 0,
        bench_skip_mib: DISK_FS_MIB,
        rewrite_seconds: seconds,
    }
}

/// The disk check role on a [`disk_image`] (see [`disk_write_role`]).
pub fn disk_check_role(bench: bool) -> Role {
    Role::DiskCheck {
        bench_mib: if bench { DISK_BENCH_MIB } else { 0 },
        bench_skip_mib: DISK_FS_MIB,
    }
}

/// The net server's role, at [`SERVER_IP`], its peer at [`CLIENT_IP`].
pub fn net_server_role() -> Role {
    Role::NetServer {
        ip: SERVER_IP.into(),
        peer: CLIENT_IP.into(),
    }
}

/// The net client's role, at [`CLIENT_IP`], its peer at [`SERVER_IP`].
pub fn net_client_role() -> Role {
    Role::NetClient {
        ip: CLIENT_IP.into(),
        peer: SERVER_IP.into(),
    }
}

/// A fresh image `target/tmp/<name>.img` (replacing an old one): ext4 on
/// its first [`DISK_FS_MIB`] MiB, [`DISK_BENCH_MIB`] MiB of raw space
/// after. Panics when e2fsprogs is missing or fails.
pub fn disk_image(name: &str) -> PathBuf {
    disk_image_with_raw(name, DISK_BENCH_MIB)
}

/// [`disk_image`] with `raw_mib` MiB of raw space after the file system.
pub fn disk_image_with_raw(name: &str, raw_mib: u32) -> PathBuf {
    let dir = qemu_runner::artifacts::workspace_root()
        .join("target")
        .join("tmp");
    std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    let path = dir.join(format!("{name}.img"));
    qemu_runner::disk_image::make_ext4(&path, DISK_FS_MIB + raw_mib, DISK_FS_MIB)
        .unwrap_or_else(|error| panic!("making {}: {error}", path.display()));
    path
}

/// The file the disk roles write ([`DISK_CHECK_PATH`]), read from `image`
/// on the host. Panics when it cannot be read.
pub fn disk_file(image: &Path) -> String {
    ext4_file(image, DISK_CHECK_PATH)
}

/// [`DISK_ROUNDS_PATH`] as the image on the host holds it.
pub fn disk_rounds_file(image: &Path) -> String {
    ext4_file(image, DISK_ROUNDS_PATH)
}

fn ext4_file(image: &Path, path: &str) -> String {
    let bytes = qemu_runner::disk_image::read_ext4_file(image, path)
        .unwrap_or_else(|error| panic!("reading {path} from the image: {error}"));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The `args=` of a `--vm linux` spec that runs `role` (its words have no
/// commas).
pub fn role_args(role: &Role) -> String {
    format!("args={}", role.cmdline_words())
}

/// The test init's default command line with `role`'s words.
pub fn role_cmdline(role: &Role) -> String {
    format!(
        "{} {}",
        default_cmdline(&InitrdSource::Busybox(BusyboxInit::Test)),
        role.cmdline_words()
    )
}

/// Debian's Linux with the test init running `role`, booted directly by
/// QEMU (2 CPUs, 512 MiB, [`qemu_runner::LINUX_TIMEOUT`]) with `disks` and
/// `net` as QEMU's own virtio devices.
pub fn direct(role: &Role, disks: &[HostDisk], net: Option<QemuNet>) -> RunConfig {
    RunConfig {
        disks: disks.to_vec(),
        net,
        echo: false,
        ..RunConfig::linux(
            Boot::Direct,
            LinuxBoot {
                cmdline: Some(role_cmdline(role)),
                ..LinuxBoot::debian(BusyboxInit::Test)
            },
        )
    }
}

/// The `--vm` spec of Debian's Linux with the test init running `role`
/// under the hypervisor: named `name`, on CPUs `cpus` (a CPU list), with
/// more spec `items` (`net=lan`, `disk=PATH`, `console=virtio`,
/// `control=1`, `mem=256`...).
pub fn linux_vm_spec(name: &str, cpus: &str, items: &[&str], role: &Role) -> String {
    let mut spec = format!("linux,name={name},cpus={cpus}");
    for item in items {
        spec.push(',');
        spec.push_str(item);
    }
    spec.push(',');
    spec.push_str(&role_args(role));
    spec
}

/// Linux directly on QEMU with QEMU's virtio-blk over `image` (a
/// [`disk_image`]), running [`disk_write_role`] with the timed I/O: its
/// sequential (write, read) MiB/s. Panics when the run fails.
pub fn direct_blk_baseline(image: &Path) -> (f64, f64) {
    let report = crate::e2e::run(&direct(
        &disk_write_role(true),
        &[HostDisk {
            path: image.to_path_buf(),
            read_only: false,
        }],
        None,
    ));
    crate::e2e::assert_passed(&report);
    (
        figure(&report, "blk_seq_write_mib_per_s"),
        figure(&report, "blk_seq_read_mib_per_s"),
    )
}

/// A TCP port on `127.0.0.1` that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|error| panic!("no free port on 127.0.0.1: {error}"));
    listener
        .local_addr()
        .unwrap_or_else(|error| panic!("{error}"))
        .port()
}

/// The net server and client, each Linux booted directly on its own QEMU,
/// joined by a socket netdev on a free port: (server's report, client's).
pub fn run_net_pair() -> (RunReport, RunReport) {
    let port = free_port();
    let server = direct(&net_server_role(), &[], Some(QemuNet::Listen(port)));
    let client = direct(&net_client_role(), &[], Some(QemuNet::Connect(port)));
    std::thread::scope(|scope| {
        let server = scope.spawn(move || crate::e2e::run(&server));
        // The runner starts the client's QEMU once the server's listens.
        let client = crate::e2e::run(&client);
        let server = server
            .join()
            .unwrap_or_else(|_| panic!("the server's run panicked"));
        (server, client)
    })
}

/// The value of the `BENCH: <name> <value> <unit>` figure in `report`;
/// panics when there is none.
pub fn figure(report: &RunReport, name: &str) -> f64 {
    bench_figures(report.console())
        .into_iter()
        .find(|(found, _, _)| found == name)
        .map(|(_, value, _)| value)
        .unwrap_or_else(|| panic!("no `BENCH: {name}` line\n{}", report.explain()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qemu_runner::vmspec::{VmGuest, VmSpec};

    #[test]
    fn a_role_vm_spec_parses_into_its_devices_and_command_line() {
        let spec = linux_vm_spec(
            "a",
            "0-1",
            &["net=lan", "disk=/d/a.img:ro", "console=virtio"],
            &net_server_role(),
        );
        let vm = VmSpec::parse(&spec, 0).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!((vm.name.as_str(), vm.net.as_deref()), ("a", Some("lan")));
        assert!(vm.disk.unwrap().read_only);
        let VmGuest::Linux(linux) = vm.guest else {
            panic!("not Linux")
        };
        assert!(
            linux
                .effective_cmdline()
                .ends_with("console=hvc0 hv.role=net-server hv.ip=10.0.0.1 hv.peer=10.0.0.2"),
            "{}",
            linux.effective_cmdline()
        );
        assert!(
            role_cmdline(&disk_check_role(true))
                .ends_with("loglevel=5 hv.role=disk-check hv.bench_mib=128 hv.bench_skip_mib=64")
        );
    }
}
