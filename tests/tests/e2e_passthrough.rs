//! End-to-end: device passthrough. A VM owns a device of the host: the
//! runner's `pass-disk=` and `pass-net=` items give QEMU a virtio-blk or a
//! virtio-net on a virtio-mmio transport after the host disks and write the
//! transport's node (`device=/virtio_mmio@a003e00`) and `ram=identity` to
//! the VM's `vm.conf`; `pass-pcie=` gives QEMU a `virtio-blk-pci` and
//! writes the PCIe host bridge's node (`device=/pcie@10000000`). The
//! hypervisor maps the node's register windows into the VM at the same
//! addresses, routes its interrupts (same INTIDs), copies the node into the
//! VM's device tree and places the VM's RAM at guest-physical ==
//! host-physical addresses, so the device's DMA reaches it; the VM's own
//! Linux drives the device, and the hypervisor leaves it alone (it is not a
//! host disk).
//!
//! - Disk (`a_linux_vm_owns_a_virtio_mmio_disk`, and the same on a GICv2
//!   host): VM `a`, Debian's Linux with an ext4 image the host made as its
//!   passed disk, mounts it as `/dev/vda`, writes `/hv/check.txt`, syncs
//!   and powers off, beside VM `b`, the test guest's `memory` scenario. Both
//!   pass; the host reads the file back from the image (`debugfs`) and finds
//!   it whole; `a` counted the device's interrupts (`passthrough_irqs` > 0),
//!   `b` none; `a` has no virtio-blk of the hypervisor's (no `virtio_blk_*`
//!   counters) and the hypervisor drove no host disk; the hypervisor says
//!   `a` owns the transport's node, and `a`'s init that `/dev/vda` is on
//!   that transport (`/dev/vda is on a003e00.virtio_mmio`).
//! - PCIe (`a_linux_vm_owns_the_pcie_host_bridge`, and the same on a GICv2
//!   host): the same with the image as a `virtio-blk-pci` on QEMU's PCIe
//!   root bus (`pass-pcie=`): `a` owns the host bridge `/pcie@10000000`
//!   (its ECAM and MMIO windows mapped, the SPIs of INTA..INTD routed); its
//!   Linux (Debian's `virtio_pci` modules loaded by the init) enumerates the
//!   bus and assigns the BARs itself, finds QEMU's transitional virtio-blk
//!   at `0000:00:01.0` (`[1af4:1001]`). On the GICv3 host its tree's bridge
//!   has `msi-parent` = the virtual ITS and it drives the disk by MSI-X: the
//!   init's line says `MSI (V vectors, interrupts so far: M)` with M > 0,
//!   the hypervisor says the bus gets MSIs and maps DeviceID 0x8 on the
//!   host ITS, and `a`'s `passthrough_msis` counts them. On the GICv2 host
//!   (no ITS) it drives it by INTx: the line says `INTx`, the hypervisor
//!   `INTx only`, and `a`'s `passthrough_irqs` counts the SPIs.
//! - Network (`a_linux_vm_owns_the_user_network`): VM `a` owns a virtio-net
//!   on QEMU's restricted user-mode network with a free TCP port of the
//!   host's `127.0.0.1` forwarded to it; its init takes a DHCP lease
//!   (10.0.2.15) and serves a fixed reply (108,910 bytes) on that port
//!   (`net-serve` role, `expect=running`). While the run goes the test
//!   connects to `127.0.0.1:PORT` until the guest has answered one
//!   connection whole (each connection is held until it ends: one made
//!   before the guest listens waits in QEMU or is reset), sends a token
//!   line and reads the reply; the guest's `served connection N, got:
//!   <token>` line ends the console script, and the run ends once `b`'s
//!   `memory` scenario has passed too. The reply must be the whole fixed
//!   text, after the guest's `10.0.2.15 ready` line.
//! - Refusals (`refusals`, test guests only: they never run): a VM given
//!   the console UART (`/pl011@9000000`), the GIC (`/intc@8000000`), a node
//!   the host's device tree does not have, a node another VM already owns,
//!   or the transport under its own emulated virtio-console's window
//!   (`/virtio_mmio@a000000` with `console=virtio`) stops the machine
//!   before any guest runs, with `[hv] ERROR: cannot start a guest:
//!   vm<I> (<name>): device <path>: <why>`.
//!
//! Every run needs QEMU (installed when missing and root, else the run
//! panics naming the command), the Linux runs Debian's kernel and busybox
//! (`apt-get download`) and e2fsprogs: a missing prerequisite fails the
//! test, it never skips.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::initramfs::{DISK_BUS_PREFIX, Role, disk_check_contents, net_serve_reply};
use qemu_runner::qemu::GicVersion;
use qemu_runner::{RunConfig, RunReport, Verdict};
use tests::e2e;
use tests::linux_virtio::{disk_file, disk_image, disk_write_role, free_port, linux_vm_spec};

/// Time for a run with one Linux VM under TCG.
const LINUX_TIMEOUT: Duration = Duration::from_secs(300);
/// Time for a run the hypervisor refuses before any guest runs.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);
/// The test guest VM beside the Linux one.
const MEMORY_VM: &str = "memory,name=b,cpus=2-3";

/// Checks that VM `b` (the `memory` scenario) passed and owned nothing.
fn assert_memory_vm_passed_alone(report: &RunReport) {
    let explain = report.explain();
    assert!(report.console().contains("[b] RESULT: PASS"), "{explain}");
    assert_eq!(
        e2e::counter(report, 1, "passthrough_irqs"),
        0,
        "b owns no device\n{explain}"
    );
}

/// How VM `a` owns the disk it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassedDisk {
    /// On a virtio-mmio transport (`pass-disk=`).
    VirtioMmio,
    /// As a PCI function behind QEMU's PCIe host bridge, which `a` owns
    /// (`pass-pcie=`).
    Pcie,
}

impl PassedDisk {
    /// The `--vm` item key.
    fn item(self) -> &'static str {
        match self {
            PassedDisk::VirtioMmio => "pass-disk",
            PassedDisk::Pcie => "pass-pcie",
        }
    }

    /// The QEMU device the runner adds for it (the only virtio device of
    /// the run), and the one it must not add.
    fn qemu_devices(self) -> (&'static str, &'static str) {
        match self {
            PassedDisk::VirtioMmio => (
                "-device virtio-blk-device,drive=pdisk0",
                "-device virtio-blk-pci",
            ),
            PassedDisk::Pcie => (
                "-device virtio-blk-pci,drive=ppci0",
                "-device virtio-blk-device",
            ),
        }
    }

    /// The node the hypervisor says `a` owns.
    fn node(self) -> &'static str {
        match self {
            PassedDisk::VirtioMmio => "/virtio_mmio@a003e00",
            PassedDisk::Pcie => "/pcie@10000000",
        }
    }

    /// Whether `a` drives it by MSIs: a PCI function on a GICv3 host,
    /// whose ITS carries them (the virtio-mmio transport has only its SPI,
    /// and a GICv2 host no ITS).
    fn by_msi(self, gic: GicVersion) -> bool {
        matches!(self, PassedDisk::Pcie) && gic == GicVersion::V3
    }

    /// How `a`'s line on where `/dev/vda` sits starts: the transport, or
    /// QEMU's virtio-blk found on the bus at slot 1 and driven by MSI (a
    /// GICv3 host) or INTx (a GICv2 host).
    fn bus_line(self, gic: GicVersion) -> String {
        match self {
            PassedDisk::VirtioMmio => format!("[a] {DISK_BUS_PREFIX}on a003e00.virtio_mmio"),
            PassedDisk::Pcie => format!(
                "[a] {DISK_BUS_PREFIX}PCI device 0000:00:01.0 [1af4:1001], {}",
                if self.by_msi(gic) { "MSI (" } else { "INTx (" }
            ),
        }
    }
}

/// The `M` of the first console line starting with `start` and holding
/// `interrupts so far: M)`.
fn interrupts_so_far(report: &RunReport, start: &str) -> Option<u64> {
    report
        .console()
        .lines()
        .map(str::trim_end)
        .filter(|line| line.starts_with(start))
        .find_map(|line| {
            let (_, after) = line.split_once("interrupts so far: ")?;
            after.strip_suffix(')')?.parse().ok()
        })
}

/// VM `a` writes the check file on a fresh ext4 image it owns as `disk`,
/// beside the `memory` VM `b`, on a `gic` host; the host reads the file
/// back.
fn linux_owns_a_disk(gic: GicVersion, image_name: &str, disk: PassedDisk) {
    let image = disk_image(image_name);
    let pass_disk = format!("{}={}", disk.item(), image.display());
    let a = linux_vm_spec(
        "a",
        "0-1",
        &[&pass_disk, "mem=384"],
        &disk_write_role(false),
    );
    let report = e2e::run(&RunConfig {
        gic,
        ..e2e::vms(4, &[&a, MEMORY_VM], LINUX_TIMEOUT)
    });
    e2e::assert_powered_off(&report);
    let explain = report.explain();
    let (device, not_device) = disk.qemu_devices();
    assert!(
        report.command_line.contains(device)
            && !report.command_line.contains(not_device)
            && !report.command_line.contains("drive=disk0"),
        "the image is a passed disk, and the only virtio device\n{explain}"
    );
    assert_eq!(
        e2e::log_count(&report, &format!("vm0: owns {}:", disk.node())),
        1,
        "{explain}"
    );
    let bus = disk.bus_line(gic);
    assert!(
        e2e::has_line_where(&report, |line| line.starts_with(&bus)),
        "no line starting `{bus}`\n{explain}"
    );
    if disk.by_msi(gic) {
        assert!(
            interrupts_so_far(&report, &bus).is_some_and(|n| n > 0),
            "the MSI vectors took no interrupts\n{explain}"
        );
        assert_eq!(
            e2e::log_count(&report, "vm0: passed PCI bus: MSIs through the virtual ITS"),
            1,
            "{explain}"
        );
        assert!(
            e2e::log_count(&report, "vm0: MSIs of DeviceID 0x8:") >= 1,
            "the disk's DeviceID (00:01.0) is mapped on the host ITS\n{explain}"
        );
    } else if disk == PassedDisk::Pcie {
        assert_eq!(
            e2e::log_count(&report, "vm0: passed PCI bus: INTx only"),
            1,
            "{explain}"
        );
    }
    assert!(
        e2e::has_line(&report, "[a] LINUX-INIT: wrote /hv/check.txt on /dev/vda"),
        "{explain}"
    );
    assert!(report.console().contains("[a] RESULT: PASS"), "{explain}");
    assert_memory_vm_passed_alone(&report);
    let (counter, other) = if disk.by_msi(gic) {
        ("passthrough_msis", "passthrough_irqs")
    } else {
        ("passthrough_irqs", "passthrough_msis")
    };
    assert!(
        e2e::counter(&report, 0, counter) > 0,
        "the disk's interrupts reached a ({counter})\n{explain}"
    );
    if disk == PassedDisk::VirtioMmio || !disk.by_msi(gic) {
        assert_eq!(e2e::counter(&report, 0, other), 0, "{explain}");
    }
    assert!(
        report.counters().get(0, "virtio_blk_write_bytes").is_none(),
        "a has a virtio-blk of the hypervisor's: the writes did not go to the passed disk\n{explain}"
    );
    assert_eq!(
        e2e::log_count(&report, "host disk 0"),
        0,
        "the hypervisor drove the passed disk itself\n{explain}"
    );
    let on_host = disk_file(&image);
    assert!(
        on_host == disk_check_contents(),
        "/hv/check.txt read from the image on the host differs ({} bytes)\n{explain}",
        on_host.len()
    );
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn a_linux_vm_owns_a_virtio_mmio_disk() {
    linux_owns_a_disk(
        GicVersion::V3,
        "e2e-passthrough-disk",
        PassedDisk::VirtioMmio,
    );
}

#[test]
fn a_linux_vm_owns_a_virtio_mmio_disk_on_a_gicv2_host() {
    linux_owns_a_disk(
        GicVersion::V2,
        "e2e-passthrough-disk-gicv2",
        PassedDisk::VirtioMmio,
    );
}

#[test]
fn a_linux_vm_owns_the_pcie_host_bridge() {
    linux_owns_a_disk(GicVersion::V3, "e2e-passthrough-pcie", PassedDisk::Pcie);
}

#[test]
fn a_linux_vm_owns_the_pcie_host_bridge_on_a_gicv2_host() {
    linux_owns_a_disk(
        GicVersion::V2,
        "e2e-passthrough-pcie-gicv2",
        PassedDisk::Pcie,
    );
}

/// Connects to `127.0.0.1:port` until a connection brings a reply, each
/// connection held until it ends (a connection dropped while QEMU still
/// tries to reach the guest could reach it later, unread): sends `token`
/// and a newline, reads to the end. Gives up when `stop` is set (the run,
/// which has its own time limit, ended); the error holds the last failure.
fn fetch_reply(port: u16, token: &str, stop: &AtomicBool) -> Result<Vec<u8>, String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut last = String::from("no connection tried");
    let gave_up = |last: &str| {
        stop.load(Ordering::Acquire)
            .then(|| format!("the run ended first; last try: {last}"))
    };
    loop {
        if let Some(why) = gave_up(&last) {
            return Err(why);
        }
        let mut stream = match TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
            Ok(stream) => stream,
            Err(error) => {
                last = format!("connect: {error}");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let sent = stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .and_then(|()| stream.write_all(format!("{token}\n").as_bytes()));
        if let Err(error) = sent {
            last = format!("send: {error}");
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        let mut reply = Vec::new();
        let mut buffer = [0u8; 16384];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) if reply.is_empty() => {
                    last = "closed with no reply".into();
                    break;
                }
                Ok(0) => return Ok(reply),
                Ok(n) => reply.extend_from_slice(&buffer[..n]),
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    if let Some(why) = gave_up(&last) {
                        return Err(format!(
                            "{why} (a connection still waited, {} bytes read)",
                            reply.len()
                        ));
                    }
                }
                Err(error) => {
                    last = format!("read after {} bytes: {error}", reply.len());
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_linux_vm_owns_the_user_network() {
    let port = free_port();
    let token = format!("passthrough-{}-{port}", std::process::id());
    let a = format!(
        "{},expect=running",
        linux_vm_spec(
            "a",
            "0-1",
            &[&format!("pass-net={port}"), "mem=384"],
            &Role::NetServe { port }
        )
    );
    let script = ConsoleScript::new().then(&format!("got: {token}"), "");
    let config = e2e::with_script(e2e::vms(4, &[&a, MEMORY_VM], LINUX_TIMEOUT), script);
    let stop = AtomicBool::new(false);
    let (report, fetched) = std::thread::scope(|scope| {
        let client = scope.spawn(|| fetch_reply(port, &token, &stop));
        let report = e2e::run(&config);
        stop.store(true, Ordering::Release);
        let fetched = client
            .join()
            .unwrap_or_else(|_| panic!("the client thread panicked"));
        (report, fetched)
    });
    let explain = report.explain();
    assert!(
        report.command_line.contains(&format!(
            "-netdev user,id=pnet0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:{port} \
             -device virtio-net-device,netdev=pnet0"
        )),
        "{explain}"
    );
    let reply =
        fetched.unwrap_or_else(|why| panic!("no reply from a on port {port}: {why}\n{explain}"));
    assert!(
        reply == net_serve_reply().as_bytes(),
        "the reply differs ({} bytes, first line {:?})\n{explain}",
        reply.len(),
        String::from_utf8_lossy(&reply).lines().next()
    );
    e2e::assert_passed(&report);
    let ready = e2e::line_index(&report, "net-serve ready", |line| {
        line.starts_with(&format!("[a] NET-SERVE: 10.0.2.15 ready on port {port}"))
    });
    let answered = e2e::line_index(&report, "served connection", |line| {
        line.starts_with("[a] NET-SERVE: served connection")
            && line.ends_with(&format!("got: {token}"))
    });
    assert!(ready < answered, "{explain}");
    assert_memory_vm_passed_alone(&report);
    assert_eq!(e2e::log_count(&report, "stopping the VM"), 0, "{explain}");
}

/// One configuration the hypervisor must refuse: the `--vm` specs, and the
/// VM (place, name), path and reason its error line names.
struct Refusal {
    specs: Vec<String>,
    vm: usize,
    name: &'static str,
    path: &'static str,
    why: &'static str,
}

/// Whether `report` shows the refusal `case` expects: the run failed on
/// `cannot start a guest: vm<I> (<name>): device <path>: <why>` (the only
/// such line), no guest ran, and the hypervisor powered the machine off
/// without a panic.
fn refused(report: &RunReport, case: &Refusal) -> Result<(), String> {
    let named = format!("vm{} ({}): device {}: ", case.vm, case.name, case.path);
    match &report.verdict {
        Verdict::GuestNotStarted(why) if why.starts_with(&named) && why.contains(case.why) => {}
        Verdict::GuestNotStarted(why) => {
            return Err(format!("expected `{named}...{}...`, got `{why}`", case.why));
        }
        other => return Err(format!("expected the hypervisor to refuse it, got {other}")),
    }
    if e2e::log_count(report, "cannot start a guest") != 1 {
        return Err("more than one `cannot start a guest` line".into());
    }
    if e2e::has_line(report, "test-guest:") || e2e::has_line(report, "RESULT:") {
        return Err("a guest ran".into());
    }
    if !report.transcript.system_off {
        return Err("no `[hv] system off`".into());
    }
    match &report.transcript.panic {
        Some(panic) => Err(format!("the hypervisor panicked: {panic}")),
        None => Ok(()),
    }
}

#[test]
fn refusals() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("passthrough-refusals");
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let image = dir.join("passed.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).expect("a scratch image");
    let one = |items: &str| vec![format!("memory,name=a{items}")];
    let cases = [
        Refusal {
            specs: one(",device=/pl011@9000000"),
            vm: 0,
            name: "a",
            path: "/pl011@9000000",
            why: "the hypervisor uses it (its console UART: window 0x9000000+0x1000)",
        },
        Refusal {
            specs: one(",device=/intc@8000000"),
            vm: 0,
            name: "a",
            path: "/intc@8000000",
            why: "the hypervisor uses it (the GIC: window 0x8000000+0x10000)",
        },
        Refusal {
            // One past the last of `virt`'s 32 transports.
            specs: one(",device=/virtio_mmio@a004000"),
            vm: 0,
            name: "a",
            path: "/virtio_mmio@a004000",
            why: "no such node in the host device tree",
        },
        Refusal {
            specs: vec![
                format!("memory,name=a,cpus=0-1,pass-disk={}", image.display()),
                "memory,name=b,cpus=2-3,device=/virtio_mmio@a003e00".to_string(),
            ],
            vm: 1,
            name: "b",
            path: "/virtio_mmio@a003e00",
            why: "also given to vm0 (a)",
        },
        Refusal {
            specs: one(",console=virtio,device=/virtio_mmio@a000000"),
            vm: 0,
            name: "a",
            path: "/virtio_mmio@a000000",
            why: "overlaps the VM's emulated virtio-mmio devices",
        },
    ];
    // Every case runs; the failures are reported together.
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let specs: Vec<&str> = case.specs.iter().map(String::as_str).collect();
            let report = e2e::run(&e2e::vms(4, &specs, REFUSAL_TIMEOUT));
            refused(&report, case)
                .err()
                .map(|why| format!("{specs:?}: {why}\n{}", report.explain()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} refusals went wrong:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
    std::fs::remove_dir_all(&dir).unwrap_or_else(|error| panic!("{error}"));
}

/// A test guest owns a QEMU virtio-mmio transport with no device behind
/// it (its registers still read the magic value) and reads the magic.
/// Alone in its page but for empty transports, the page is mapped whole
/// (no exit); beside a host disk (`b`'s, which the hypervisor drives) only
/// the window is forwarded, and reading the disk's transport in the same
/// page aborts. The other VM's read of the owned window aborts either way.
/// On a GICv3 and a GICv2 host.
#[test]
fn a_test_guest_reads_its_window_and_no_other() {
    let image = disk_image("e2e-passthrough-neighbour");
    let host_disk = format!("disk={}", image.display());
    for gic in [GicVersion::V3, GicVersion::V2] {
        // Alone in the page: mapped.
        let a = "memory,name=a,cpus=0-1,device=/virtio_mmio@a003e00,\
                 args=passed-window=0xa003e00 passed-window=0xa003c00";
        let b = "memory,name=b,cpus=2-3,args=probe-ipa=0xa003e00";
        let report = e2e::run(&RunConfig {
            gic,
            ..e2e::vms(4, &[a, b], REFUSAL_TIMEOUT)
        });
        let explain = report.explain();
        e2e::assert_passed(&report);
        let console = report.console();
        for line in [
            "[hv] vm0: owns /virtio_mmio@a003e00: mapped [0xa003000+0x1000], forwarded [], SPIs (INTIDs) [79]",
            "[a] test-guest: passthrough: read magic 0x74726976 at 0xa003e00",
            "[b] test-guest: isolation: reading probe IPA 0xa003e00 aborted",
        ] {
            assert!(console.contains(line), "{gic:?}: no `{line}`\n{explain}");
        }
        assert_eq!(
            e2e::counter(&report, 0, "exit_mmio_passed_count"),
            0,
            "{gic:?}: a mapped window costs no exit\n{explain}"
        );

        // Beside the host disk (QEMU's first virtio device, at a003e00):
        // forwarded, and the disk's transport aborts.
        let a = "memory,name=a,cpus=0-1,device=/virtio_mmio@a003c00,\
                 args=passed-window=0xa003c00 probe-ipa=0xa003e00";
        let b = format!("memory,name=b,cpus=2-3,{host_disk},args=probe-ipa=0xa003c00");
        let report = e2e::run(&RunConfig {
            gic,
            ..e2e::vms(4, &[a, &b], REFUSAL_TIMEOUT)
        });
        let explain = report.explain();
        e2e::assert_passed(&report);
        let console = report.console();
        for line in [
            "[hv] vm0: owns /virtio_mmio@a003c00: mapped [], forwarded [0xa003c00+0x200], SPIs (INTIDs) [78]",
            "[a] test-guest: passthrough: read magic 0x74726976 at 0xa003c00",
            "[a] test-guest: isolation: reading probe IPA 0xa003e00 aborted",
            "[b] test-guest: isolation: reading probe IPA 0xa003c00 aborted",
        ] {
            assert!(console.contains(line), "{gic:?}: no `{line}`\n{explain}");
        }
        assert_eq!(
            e2e::counter(&report, 0, "exit_mmio_passed_count"),
            1,
            "{gic:?}: one forwarded read\n{explain}"
        );
    }
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}
