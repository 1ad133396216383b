//! Running QEMU: the command line, console streaming, and when to stop.
//!
//! QEMU's serial console (`-nographic`) arrives on its stdout. A reader thread
//! echoes the raw bytes as they come (when asked) and hands complete lines to
//! the caller, which feeds them to a [`Transcript`]. The run stops when QEMU
//! exits (the hypervisor's or the guest's PSCI `SYSTEM_OFF` makes it exit 0).
//! Some lines end a run early: each kind of line has a grace period
//! ([`grace_after`]) after which QEMU is stopped if it has not exited: the
//! guest's `RESULT:` line or the hypervisor stopping the VM (time for the
//! `STAT` lines and `[hv] system off`),
//! `[hv] system off` or a hypervisor panic (time to exit), a guest kernel
//! failure report (time for the backtrace that follows; a panicked kernel
//! never exits), U-Boot's report that its boot command failed (it then waits
//! at its prompt). The earliest such stop wins; the overall timeout kills QEMU
//! in any case. A session a person drives ([`Watch::follow_to_exit`]) ignores
//! the stop lines. QEMU is stopped with SIGTERM first, then SIGKILL. When
//! standard input is a terminal ([`QemuStdin::Terminal`]) QEMU reads a pipe
//! that [`crate::terminal`] feeds with the keys typed, and the terminal is
//! back in its own mode before [`run_with`] returns.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::console::{Line, Transcript};
use crate::console_script::{ConsoleScript, ConsoleStep, ScriptProgress};
use crate::terminal::TerminalSession;
use crate::uboot::UBootFiles;

/// How long after a line of this kind QEMU may still run before it is
/// stopped (`None`: the line does not end the run).
pub fn grace_after(line: &Line) -> Option<Duration> {
    match line {
        Line::Result(_) | Line::VmStopped(_) => Some(RESULT_GRACE),
        Line::SystemOff | Line::HypervisorPanic(_) => Some(EXIT_GRACE),
        Line::KernelFault(_) => Some(FAULT_GRACE),
        Line::FirmwareFailed(_) => Some(FIRMWARE_GRACE),
        Line::GuestNotStarted(_)
        | Line::Stat { .. }
        | Line::HypervisorLog
        | Line::FirmwareLog
        | Line::Other => None,
    }
}

/// How long to wait for the `STAT` tail after the guest's `RESULT:` line.
pub const RESULT_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for QEMU to exit after `[hv] system off` or a panic.
pub const EXIT_GRACE: Duration = Duration::from_secs(3);
/// How long to keep reading after a guest kernel failure report (the
/// backtrace and register dump that follow it).
pub const FAULT_GRACE: Duration = Duration::from_secs(5);
/// How long to keep reading after U-Boot reported that its boot command
/// failed (its own error lines come before; nothing useful comes after).
pub const FIRMWARE_GRACE: Duration = Duration::from_secs(1);
/// The gdb stub port QEMU's `-s` opens.
pub const GDB_PORT: u16 = 1234;

/// Which exception level the kernel QEMU loads runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// `virtualization=on`: the kernel (the hypervisor) starts at EL2.
    WithEl2,
    /// No EL2: the kernel (a guest booted directly) starts at EL1.
    El1Only,
}

/// Which GIC the `virt` machine gets (`gic-version=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GicVersion {
    /// GICv2 with the virtualization extensions (`GICH`/`GICV`); at most 8 CPUs.
    V2,
    /// GICv3 (the default).
    #[default]
    V3,
}

impl GicVersion {
    /// Most CPUs `virt` gives this GIC (GICv2 has 8 CPU interfaces).
    pub const fn max_cpus(self) -> u32 {
        match self {
            Self::V2 => 8,
            Self::V3 => 512,
        }
    }

    /// The `gic-version=` value.
    pub const fn number(self) -> u32 {
        match self {
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }

    /// `2` or `3` as a command-line word.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "2" => Some(Self::V2),
            "3" => Some(Self::V3),
            _ => None,
        }
    }
}

/// A raw image file QEMU serves as its own virtio-blk device on a
/// virtio-mmio transport (`PATH` or `PATH:ro` on the runner's command line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDisk {
    /// The image file.
    pub path: PathBuf,
    /// Read-only (`readonly=on`: QEMU refuses the guest's writes).
    pub read_only: bool,
}

impl HostDisk {
    /// Reads `PATH` or `PATH:ro`.
    pub fn parse(text: &str) -> Result<HostDisk, String> {
        let (path, read_only) = match text.strip_suffix(":ro") {
            Some(path) => (path, true),
            None => (text, false),
        };
        if path.is_empty() {
            return Err(format!("{text}: a disk is PATH or PATH:ro"));
        }
        if path.contains(',') {
            return Err(format!(
                "{text}: QEMU's -drive takes no commas in a file name"
            ));
        }
        Ok(HostDisk {
            path: PathBuf::from(path),
            read_only,
        })
    }

    /// Refuses a path that is not a file (before QEMU starts).
    pub fn check_exists(&self) -> Result<(), String> {
        if self.path.is_file() {
            Ok(())
        } else {
            Err(format!(
                "disk image {}: no such file (make one, e.g. truncate -s 64M IMG && mkfs.ext4 IMG)",
                self.path.display()
            ))
        }
    }

    /// Its QEMU arguments as the `index`-th disk: a `-drive` without an
    /// interface (`if=none`, raw, `diskN`) and the `virtio-blk-device` on it.
    pub fn qemu_args(&self, index: usize) -> [String; 4] {
        let read_only = if self.read_only { ",readonly=on" } else { "" };
        [
            "-drive".into(),
            format!(
                "file={},if=none,format=raw,id=disk{index}{read_only}",
                self.path.display()
            ),
            "-device".into(),
            format!("virtio-blk-device,drive=disk{index}"),
        ]
    }
}

/// Base address of QEMU `virt`'s virtio-mmio transports.
pub const VIRTIO_MMIO_BASE: u64 = 0x0a00_0000;
/// Size of one virtio-mmio transport's register window (the stride between
/// transports).
pub const VIRTIO_MMIO_STRIDE: u64 = 0x200;
/// How many virtio-mmio transports `virt` has.
pub const VIRTIO_MMIO_TRANSPORTS: usize = 32;

/// The device-tree path of the virtio-mmio transport that QEMU's
/// `position`-th `-device virtio-*-device` (0: the first on the command
/// line, of any kind) lands on: QEMU fills the transports from the highest
/// address down, so the first is `/virtio_mmio@a003e00`, the second
/// `/virtio_mmio@a003c00`. `None` past the last transport.
pub fn virtio_mmio_node(position: usize) -> Option<String> {
    let transport = VIRTIO_MMIO_TRANSPORTS.checked_sub(position + 1)?;
    let address = VIRTIO_MMIO_BASE + transport as u64 * VIRTIO_MMIO_STRIDE;
    Some(format!("/virtio_mmio@{address:x}"))
}

/// The device-tree path of `virt`'s PCIe host bridge (a generic ECAM host
/// controller, `pci-host-ecam-generic`): the node is named after the base
/// of its 32-bit MMIO window, its `reg` is the ECAM (at `0x4010000000` with
/// the high memory map), its `ranges` the I/O and MMIO windows and its
/// `interrupt-map` INTA..INTD of each slot to SPIs 3..6.
pub const PCIE_HOST_BRIDGE_NODE: &str = "/pcie@10000000";

/// A device QEMU serves that the hypervisor gives whole to one VM
/// (passthrough: the VM's own driver runs it, the hypervisor only maps its
/// windows and routes its interrupts): on a virtio-mmio transport
/// (`pass-disk=`, `pass-net=`), or on `virt`'s PCIe host bridge
/// (`pass-pcie=`), which the VM then owns whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassedDevice {
    /// A raw image file as a virtio-blk on a virtio-mmio transport
    /// (`pass-disk=`).
    Disk(HostDisk),
    /// A virtio-net on QEMU's user-mode network, restricted (nothing leaves
    /// QEMU), with TCP `127.0.0.1:PORT` on the host forwarded to the
    /// guest's port PORT (`pass-net=`).
    Net {
        /// The TCP port, the same on both sides.
        port: u16,
    },
    /// A raw image file as a virtio-blk PCI function on `virt`'s PCIe root
    /// bus (`pass-pcie=`): the VM owns the host bridge
    /// ([`PCIE_HOST_BRIDGE_NODE`]) and finds the device by enumerating it.
    PcieDisk(HostDisk),
}

impl PassedDevice {
    /// Reads a `pass-net=` port: a TCP port number above 0.
    pub fn parse_port(text: &str) -> Result<u16, String> {
        text.parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("{text}: a TCP port number (1 to 65535)"))
    }

    /// Its QEMU arguments as the `index`-th passed device of its kind: a
    /// `-drive` (`pdiskN`) and the `virtio-blk-device` on it, a restricted
    /// user-mode `-netdev` (`pnetN`) forwarding the port and the
    /// `virtio-net-device` on it, or a `-drive` (`ppciN`) and the
    /// `virtio-blk-pci` on it. None has an option ROM (of QEMU's virtio
    /// devices only the PCI virtio-net loads one; `virtio-blk-pci` has no
    /// default `romfile`).
    pub fn qemu_args(&self, index: usize) -> [String; 4] {
        let drive = |disk: &HostDisk, id: &str| {
            let read_only = if disk.read_only { ",readonly=on" } else { "" };
            format!(
                "file={},if=none,format=raw,id={id}{index}{read_only}",
                disk.path.display()
            )
        };
        match self {
            PassedDevice::Disk(disk) => [
                "-drive".into(),
                drive(disk, "pdisk"),
                "-device".into(),
                format!("virtio-blk-device,drive=pdisk{index}"),
            ],
            PassedDevice::Net { port } => [
                "-netdev".into(),
                format!("user,id=pnet{index},restrict=on,hostfwd=tcp:127.0.0.1:{port}-:{port}"),
                "-device".into(),
                format!("virtio-net-device,netdev=pnet{index}"),
            ],
            PassedDevice::PcieDisk(disk) => [
                "-drive".into(),
                drive(disk, "ppci"),
                "-device".into(),
                format!("virtio-blk-pci,drive=ppci{index}"),
            ],
        }
    }

    /// Whether QEMU plugs it into a virtio-mmio transport (it then takes
    /// one of the 32); a PCI device does not.
    pub fn on_virtio_mmio(&self) -> bool {
        !matches!(self, PassedDevice::PcieDisk(_))
    }

    /// Its image file, for a disk.
    pub fn disk(&self) -> Option<&HostDisk> {
        match self {
            PassedDevice::Disk(disk) | PassedDevice::PcieDisk(disk) => Some(disk),
            PassedDevice::Net { .. } => None,
        }
    }

    /// Whether it and `other` cannot both be served: the same image file,
    /// or the same forwarded port.
    pub fn clashes_with(&self, other: &PassedDevice) -> bool {
        match (self, other) {
            (PassedDevice::Net { port: a }, PassedDevice::Net { port: b }) => a == b,
            _ => match (self.disk(), other.disk()) {
                (Some(a), Some(b)) => a.path == b.path,
                _ => false,
            },
        }
    }

    /// The spec item that asks for it (`pass-disk=PATH[:ro]`,
    /// `pass-net=PORT`, `pass-pcie=PATH[:ro]`), for messages.
    pub fn item(&self) -> String {
        let image = |disk: &HostDisk| {
            format!(
                "{}{}",
                disk.path.display(),
                if disk.read_only { ":ro" } else { "" }
            )
        };
        match self {
            PassedDevice::Disk(disk) => format!("pass-disk={}", image(disk)),
            PassedDevice::Net { port } => format!("pass-net={port}"),
            PassedDevice::PcieDisk(disk) => format!("pass-pcie={}", image(disk)),
        }
    }
}

/// The QEMU arguments of `passed`, in order: each device numbered among the
/// passed devices of its kind (virtio-mmio disks, networks, PCI disks).
pub fn passed_qemu_args(passed: &[PassedDevice]) -> Vec<String> {
    let (mut disks, mut nets, mut pci) = (0, 0, 0);
    let mut args = Vec::new();
    for device in passed {
        let counter = match device {
            PassedDevice::Disk(_) => &mut disks,
            PassedDevice::Net { .. } => &mut nets,
            PassedDevice::PcieDisk(_) => &mut pci,
        };
        args.extend(device.qemu_args(*counter));
        *counter += 1;
    }
    args
}

/// QEMU's own virtio-net for a guest booted directly (`--net`): the
/// hypervisor's VMs get theirs from the hypervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QemuNet {
    /// User-mode networking, restricted (`restrict=on`: no way out to the
    /// host's network).
    User,
    /// A socket on `127.0.0.1:PORT` another QEMU connects to: the two
    /// guests share one Ethernet segment.
    Listen(u16),
    /// Connects to the QEMU listening on `127.0.0.1:PORT`; the runner waits
    /// for that listener before it starts QEMU ([`wait_for_listener`]).
    Connect(u16),
}

impl QemuNet {
    /// Reads `user`, `listen:PORT` or `connect:PORT`.
    pub fn parse(text: &str) -> Result<QemuNet, String> {
        let port = |port: &str| {
            port.parse::<u16>()
                .ok()
                .filter(|port| *port > 0)
                .ok_or_else(|| format!("{text}: PORT is a TCP port number"))
        };
        match text.split_once(':') {
            None if text == "user" => Ok(QemuNet::User),
            Some(("listen", number)) => Ok(QemuNet::Listen(port(number)?)),
            Some(("connect", number)) => Ok(QemuNet::Connect(port(number)?)),
            _ => Err(format!(
                "{text}: the network is user, listen:PORT or connect:PORT"
            )),
        }
    }

    /// Its QEMU arguments: the `-netdev` and the `virtio-net-device` on it.
    pub fn qemu_args(self) -> [String; 4] {
        let netdev = match self {
            QemuNet::User => "user,id=net0,restrict=on".to_string(),
            QemuNet::Listen(port) => format!("socket,id=net0,listen=127.0.0.1:{port}"),
            QemuNet::Connect(port) => format!("socket,id=net0,connect=127.0.0.1:{port}"),
        };
        [
            "-netdev".into(),
            netdev,
            "-device".into(),
            "virtio-net-device,netdev=net0".into(),
        ]
    }
}

/// The property that makes QEMU's virtio-mmio transports version 2 (virtio
/// 1.x, as the hypervisor's own devices are): QEMU 7.2's `virt` defaults to
/// the legacy version-1 transport (`force-legacy=true`). Linux's
/// `virtio_mmio` and the `virtio-drivers` crate drive both.
pub const VIRTIO_MMIO_MODERN: &str = "virtio-mmio.force-legacy=false";

/// Waits until something listens on TCP `127.0.0.1:port` (read from
/// `/proc/net/tcp`, so no connection is spent on asking), at most `limit`.
pub fn wait_for_listener(port: u16, limit: Duration) -> Result<(), String> {
    let wanted = format!("0100007F:{port:04X}");
    let start = Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp")
            .map_err(|error| format!("reading /proc/net/tcp: {error}"))?;
        let listening = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&wanted.as_str()) && fields.get(3) == Some(&"0A")
        });
        if listening {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "nothing listens on 127.0.0.1:{port} after {} s (start the QEMU with \
                 --net listen:{port} first)",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Everything QEMU is started with.
#[derive(Clone, Debug)]
pub struct QemuSetup {
    /// The `qemu-system-aarch64` binary.
    pub program: PathBuf,
    /// Machine flavour.
    pub machine: Machine,
    /// The interrupt controller (`gic-version=`).
    pub gic: GicVersion,
    /// Memory tagging with tag storage (`mte=on`; needs a `-cpu` with
    /// FEAT_MTE2, `max`).
    pub mte: bool,
    /// `-cpu` model and properties.
    pub cpu: String,
    /// `-smp`.
    pub smp: u32,
    /// `-m`, in MiB.
    pub mem_mib: u32,
    /// Firmware QEMU starts instead of entering `-kernel` itself: U-Boot
    /// (`-bios`, its environment on the second flash bank), which finds
    /// `-kernel` and `-initrd` in QEMU's fw_cfg device. `None`: QEMU loads
    /// the kernel, initrd and device tree and enters the kernel.
    pub firmware: Option<UBootFiles>,
    /// `-kernel`: a raw arm64 Image.
    pub kernel: PathBuf,
    /// `-initrd`.
    pub initrd: Option<PathBuf>,
    /// `-append` (the kernel command line; QEMU puts it in `/chosen/bootargs`).
    pub append: Option<String>,
    /// Wait for gdb on port 1234 before the first instruction (`-s -S`).
    pub gdb: bool,
    /// Disks QEMU serves itself (virtio-blk on virtio-mmio), in order: the
    /// first sits at the highest virtio-mmio address.
    pub disks: Vec<HostDisk>,
    /// Devices QEMU serves for the hypervisor to give to a VM whole, after
    /// the disks, in order ([`passed_qemu_args`]).
    pub passed: Vec<PassedDevice>,
    /// QEMU's own virtio-net (a direct boot only), after the disks.
    pub net: Option<QemuNet>,
    /// Extra arguments, appended last.
    pub extra_args: Vec<String>,
}

impl QemuSetup {
    /// The arguments after the program name.
    pub fn args(&self) -> Vec<String> {
        let el2 = match self.machine {
            Machine::WithEl2 => "virtualization=on,",
            Machine::El1Only => "",
        };
        let mte = if self.mte { "mte=on," } else { "" };
        let machine = format!("virt,{el2}{mte}gic-version={}", self.gic.number());
        let mut args: Vec<String> = [
            "-machine",
            &machine,
            "-cpu",
            &self.cpu,
            "-smp",
            &self.smp.to_string(),
            "-m",
            &format!("{}M", self.mem_mib),
            "-nographic",
            "-nic",
            "none",
            "-no-reboot",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(uboot) = &self.firmware {
            args.push("-bios".into());
            args.push(uboot.bios.display().to_string());
            args.push("-drive".into());
            args.push(crate::uboot::pflash_drive(&uboot.environment));
        }
        args.push("-kernel".into());
        args.push(self.kernel.display().to_string());
        if let Some(initrd) = &self.initrd {
            args.push("-initrd".into());
            args.push(initrd.display().to_string());
        }
        if let Some(append) = &self.append {
            args.push("-append".into());
            args.push(append.clone());
        }
        let passed_mmio = self.passed.iter().any(PassedDevice::on_virtio_mmio);
        if !self.disks.is_empty() || passed_mmio || self.net.is_some() {
            args.push("-global".into());
            args.push(VIRTIO_MMIO_MODERN.into());
        }
        for (index, disk) in self.disks.iter().enumerate() {
            args.extend(disk.qemu_args(index));
        }
        args.extend(passed_qemu_args(&self.passed));
        if let Some(net) = self.net {
            args.extend(net.qemu_args());
        }
        if self.gdb {
            args.push("-s".into());
            args.push("-S".into());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The command line as one shell-quoted string (for logs and reports).
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args())
            .map(|word| shell_quote(&word))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Quotes `word` for a POSIX shell when it needs it.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How the run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// QEMU exited by itself.
    Exited,
    /// The grace period after the result (or system off, or panic) ran out and
    /// QEMU was stopped.
    StoppedAfterGrace,
    /// The overall timeout ran out and QEMU was stopped.
    TimedOut,
    /// No progress line came in time ([`Watch::progress`]) and QEMU was
    /// stopped: the guest hangs.
    Stalled(Progress),
}

/// A run that must keep printing progress lines: each one, the first counted
/// from QEMU's start, must come within `within` of the one before, or the run
/// is stopped as hung (long before an overall time limit sized for the whole
/// run would say so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Text every progress line contains.
    pub marker: &'static str,
    /// Longest wait for the next progress line.
    pub within: Duration,
}

/// What a QEMU run produced.
#[derive(Debug)]
pub struct QemuRun {
    /// The console, classified.
    pub transcript: Transcript,
    /// How it ended.
    pub ending: Ending,
    /// QEMU's exit status.
    pub status: ExitStatus,
    /// What QEMU wrote to stderr.
    pub stderr: String,
    /// Wall time from start to exit.
    pub elapsed: Duration,
    /// The step of the console script the run ended waiting at (`None`:
    /// no script, or it finished).
    pub script_waiting_at: Option<ConsoleStep>,
}

enum Event {
    /// A whole console line, without its newline.
    Line(String),
    /// Console text as it was read (only for a console script).
    Text(String),
    Closed,
}

/// What a run does beyond [`Watch`]: feed a console script, follow several
/// VMs.
#[derive(Clone, Copy, Default)]
pub struct Follow<'a> {
    /// Bytes to send to QEMU's stdin as text appears ([`crate::console_script`]);
    /// stdin is a pipe for it (and closed without one, unless interactive).
    pub script: Option<&'a ConsoleScript>,
    /// Several VMs share the console: one VM's result, stop or kernel
    /// failure report does not end the run; [`Follow::finished`] does.
    pub several_vms: bool,
    /// Whether the transcript shows everything the run waits for; QEMU is
    /// stopped [`RESULT_GRACE`] after it first does once the console script,
    /// if any, has sent its last step.
    pub finished: Option<&'a dyn Fn(&Transcript) -> bool>,
    /// Whether every VM has come to its end, whatever the last line: asked
    /// once, when the console script sends its last step.
    pub settled: Option<&'a dyn Fn(&Transcript) -> bool>,
}

impl std::fmt::Debug for Follow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("script", &self.script)
            .field("several_vms", &self.several_vms)
            .field("finished", &self.finished.is_some())
            .finish()
    }
}

/// What QEMU's stdin is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QemuStdin {
    /// Closed (scripts, tests, CI); a console script gets a pipe regardless.
    Closed,
    /// Our stdin as it is (under gdb without a terminal).
    Inherited,
    /// A pipe fed with what is typed at our terminal, held in raw mode for
    /// the run ([`crate::terminal`]).
    Terminal,
}

/// Options of a run that are not QEMU's.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    /// Overall time limit (`None`: wait for ever, as under gdb).
    pub timeout: Option<Duration>,
    /// Progress lines the run must keep printing (`None`: none).
    pub progress: Option<Progress>,
    /// Copy the console to our stdout as it arrives.
    pub echo: bool,
    /// What QEMU reads: with [`QemuStdin::Terminal`] typing reaches the
    /// console (Ctrl-] the hypervisor's monitor, Ctrl-A x quits QEMU).
    pub stdin: QemuStdin,
    /// Ignore the lines that end a run early ([`grace_after`]) and follow
    /// QEMU until it exits (a person drives the guest).
    pub follow_to_exit: bool,
}

/// Starts QEMU and follows its console until one of the stop conditions.
pub fn run(setup: &QemuSetup, watch: Watch) -> std::io::Result<QemuRun> {
    run_with(setup, watch, Follow::default())
}

/// [`run`], feeding `follow`'s console script and following several VMs.
pub fn run_with(setup: &QemuSetup, watch: Watch, follow: Follow<'_>) -> std::io::Result<QemuRun> {
    let mut child = Command::new(&setup.program)
        .args(setup.args())
        .stdin(match watch.stdin {
            _ if follow.script.is_some() => Stdio::piped(),
            QemuStdin::Terminal => Stdio::piped(),
            QemuStdin::Inherited => Stdio::inherit(),
            QemuStdin::Closed => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    let echo_mid_line = Arc::new(AtomicBool::new(false));
    let lines = spawn_stdout_reader(
        child.stdout.take().expect("stdout is piped"),
        watch.echo.then(|| Arc::clone(&echo_mid_line)),
        follow.script.is_some(),
    );
    let mut stdin = child.stdin.take();
    // Raw mode and key forwarding until the end of this function (the drop
    // puts the terminal back, before the verdict is printed).
    let terminal = match (watch.stdin, follow.script) {
        (QemuStdin::Terminal, None) => {
            let pipe = stdin.take().expect("stdin is piped");
            match TerminalSession::start(pipe, child.id()) {
                Ok(session) => Some(session),
                Err(error) => {
                    let _ = terminate(&mut child);
                    return Err(error);
                }
            }
        }
        _ => None,
    };
    let mut progress = follow.script.map(ScriptProgress::new);
    let mut send = |progress: &mut ScriptProgress<'_>, text: &str| {
        for bytes in progress.feed(text) {
            if let Some(pipe) = stdin.as_mut() {
                // QEMU gone: the run ends on its own, the script unfinished.
                if pipe.write_all(bytes).and_then(|()| pipe.flush()).is_err() {
                    stdin = None;
                }
            }
        }
    };
    if let Some(progress) = progress.as_mut() {
        send(progress, "");
    }
    let stderr = spawn_stderr_reader(child.stderr.take().expect("stderr is piped"), watch.echo);

    let mut transcript = if setup.firmware.is_some() {
        Transcript::with_firmware()
    } else {
        Transcript::default()
    };
    let deadline = watch.timeout.map(|timeout| start + timeout);
    let mut stop_at: Option<Instant> = None;
    let mut progress_due = watch.progress.map(|p| start + p.within);
    let ending = loop {
        let now = Instant::now();
        let wake = [deadline, stop_at, progress_due]
            .into_iter()
            .flatten()
            .min();
        let event = match wake {
            Some(wake) => lines.recv_timeout(wake.saturating_duration_since(now)),
            None => lines.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Text(text)) => {
                let Some(script) = progress.as_mut() else {
                    continue;
                };
                let was_waiting = script.waiting_at().is_some();
                send(script, &text);
                // The script finished on this text after the VMs had
                // settled (a VM that keeps running answered it last): the
                // run is over too.
                let now_done = script.waiting_at().is_none();
                if was_waiting
                    && now_done
                    && stop_at.is_none()
                    && !watch.follow_to_exit
                    && follow.settled.is_some_and(|settled| settled(&transcript))
                {
                    stop_at = Some(Instant::now() + RESULT_GRACE);
                }
            }
            Ok(Event::Line(line)) => {
                let kind = transcript.push_line_at(&line, start.elapsed());
                if let Some(watched) = watch.progress.filter(|p| line.contains(p.marker)) {
                    progress_due = Some(Instant::now() + watched.within);
                }
                let one_vms_line = matches!(
                    kind,
                    Line::Result(_) | Line::VmStopped(_) | Line::KernelFault(_)
                );
                let grace = if follow.several_vms && one_vms_line {
                    None
                } else {
                    grace_after(&kind)
                };
                // A console script still running holds the run: its later
                // steps (a monitor's `poweroff`) are part of what it waits for.
                let script_done = progress.as_ref().is_none_or(|p| p.waiting_at().is_none());
                let grace = grace.or_else(|| {
                    let finished = follow.finished?;
                    (stop_at.is_none() && script_done && finished(&transcript))
                        .then_some(RESULT_GRACE)
                });
                if let Some(grace) = grace.filter(|_| !watch.follow_to_exit) {
                    let stop_by = Instant::now() + grace;
                    stop_at = Some(stop_at.map_or(stop_by, |at| at.min(stop_by)));
                }
            }
            Ok(Event::Closed) | Err(RecvTimeoutError::Disconnected) => break Ending::Exited,
            Err(RecvTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break Ending::TimedOut;
                }
                if stop_at.is_some_and(|s| Instant::now() >= s) {
                    break Ending::StoppedAfterGrace;
                }
                if let Some(watched) = watch
                    .progress
                    .filter(|_| progress_due.is_some_and(|due| Instant::now() >= due))
                {
                    // After the result only the grace period counts.
                    if stop_at.is_none() {
                        break Ending::Stalled(watched);
                    }
                    progress_due = None;
                }
            }
        }
    };
    let (status, ending) = match child.try_wait()? {
        Some(status) => (status, ending),
        None if ending == Ending::Exited => {
            // stdout closed: QEMU is exiting; give it a moment.
            match wait_timeout(&mut child, EXIT_GRACE)? {
                Some(status) => (status, ending),
                None => (terminate(&mut child)?, Ending::StoppedAfterGrace),
            }
        }
        None => (terminate(&mut child)?, ending),
    };
    // Drain what the reader threads still hold.
    loop {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Line(line)) => {
                transcript.push_line_at(&line, start.elapsed());
            }
            Ok(Event::Text(_)) => {}
            Ok(Event::Closed) | Err(_) => break,
        }
    }
    let stderr = stderr.join().unwrap_or_default();
    if terminal.is_some() && echo_mid_line.load(Ordering::Acquire) {
        // The console ended inside a line (a prompt): what the runner
        // prints next starts a line of its own.
        let _ = writeln!(std::io::stdout());
    }
    drop(terminal);
    Ok(QemuRun {
        transcript,
        ending,
        status,
        stderr,
        elapsed: start.elapsed(),
        script_waiting_at: progress.and_then(|p| p.waiting_at().cloned()),
    })
}

/// Reads QEMU's stdout into lines (and into text chunks as they come when
/// `chunks`, for a console script); copies it to our stdout when `echo` is
/// given, and says there whether the copy so far ends inside a line.
fn spawn_stdout_reader(
    mut stdout: impl Read + Send + 'static,
    echo: Option<Arc<AtomicBool>>,
    chunks: bool,
) -> Receiver<Event> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let read = match stdout.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            if let Some(mid_line) = &echo {
                let mut out = std::io::stdout().lock();
                // Echo failures (a closed pipe) do not stop the run.
                let _ = out.write_all(&chunk[..read]).and_then(|()| out.flush());
                mid_line.store(chunk[read - 1] != b'\n', Ordering::Release);
            }
            if chunks
                && sender
                    .send(Event::Text(
                        String::from_utf8_lossy(&chunk[..read]).into_owned(),
                    ))
                    .is_err()
            {
                return;
            }
            pending.extend_from_slice(&chunk[..read]);
            while let Some(newline) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=newline).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                if sender.send(Event::Line(text)).is_err() {
                    return;
                }
            }
        }
        if !pending.is_empty() {
            let _ = sender.send(Event::Line(String::from_utf8_lossy(&pending).into_owned()));
        }
        let _ = sender.send(Event::Closed);
    });
    receiver
}

fn spawn_stderr_reader(
    mut stderr: impl Read + Send + 'static,
    echo: bool,
) -> thread::JoinHandle<String> {
    let collected = Arc::new(Mutex::new(Vec::new()));
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(read) = stderr.read(&mut chunk) {
            if read == 0 {
                break;
            }
            if echo {
                let _ = std::io::stderr().write_all(&chunk[..read]);
            }
            collected
                .lock()
                .expect("only this thread locks")
                .extend_from_slice(&chunk[..read]);
        }
        let bytes = collected.lock().expect("only this thread locks");
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn wait_timeout(child: &mut Child, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Stops QEMU: SIGTERM, then SIGKILL if it has not exited within a second.
fn terminate(child: &mut Child) -> std::io::Result<ExitStatus> {
    let pid = child.id() as libc::pid_t;
    // SAFETY: `pid` is our own child, not yet reaped (try_wait saw it running),
    // so the id cannot have been reused by another process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if let Some(status) = wait_timeout(child, Duration::from_secs(1))? {
        return Ok(status);
    }
    child.kill()?;
    child.wait()
}

/// Where QEMU `virt` has RAM, and so where `-kernel` Images go.
pub const VIRT_RAM_BASE: u64 = 0x4000_0000;
/// QEMU keeps the first 4 KiB of RAM for its boot stub; an Image asking for a
/// smaller `text_offset` is moved up by 2 MiB.
const QEMU_BOOT_STUB_SIZE: u64 = 0x1000;

/// The address QEMU `virt` loads a `-kernel` Image with `text_offset` at.
pub fn virt_load_address(text_offset: u64) -> u64 {
    if text_offset < QEMU_BOOT_STUB_SIZE {
        VIRT_RAM_BASE + (2 << 20) + text_offset
    } else {
        VIRT_RAM_BASE + text_offset
    }
}

/// A program whose symbols gdb should load: its ELF, and how far from its
/// link address it runs (nonzero for a position-independent program).
#[derive(Clone, Debug)]
pub struct Symbols {
    /// The ELF file.
    pub elf: PathBuf,
    /// Run address minus link address.
    pub offset: u64,
}

/// The gdb command that attaches to a QEMU started with `gdb`, loading the
/// symbols of each program (the first is gdb's main file).
pub fn gdb_command(programs: &[Symbols]) -> String {
    let mut words = vec!["gdb-multiarch".to_string(), "-q".to_string()];
    for (index, program) in programs.iter().enumerate() {
        let elf = program.elf.display().to_string();
        match (index, program.offset) {
            (0, 0) => words.push(shell_quote(&elf)),
            (0, offset) => {
                words.push("-ex".into());
                words.push(shell_quote(&format!("symbol-file -o {offset:#x} {elf}")));
            }
            (_, 0) => {
                words.push("-ex".into());
                words.push(shell_quote(&format!("add-symbol-file {elf}")));
            }
            (_, offset) => {
                words.push("-ex".into());
                words.push(shell_quote(&format!(
                    "add-symbol-file -o {offset:#x} {elf}"
                )));
            }
        }
    }
    words.push("-ex".into());
    words.push(shell_quote(&format!("target remote localhost:{GDB_PORT}")));
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> QemuSetup {
        QemuSetup {
            program: "/usr/bin/qemu-system-aarch64".into(),
            machine: Machine::WithEl2,
            gic: GicVersion::V3,
            mte: false,
            cpu: "max,pauth=off".into(),
            smp: 4,
            mem_mib: 1024,
            firmware: None,
            kernel: "/t/hypervisor.img".into(),
            initrd: Some("/t/payload.cpio".into()),
            append: None,
            gdb: false,
            disks: Vec::new(),
            passed: Vec::new(),
            net: None,
            extra_args: vec!["-d".into(), "guest_errors".into()],
        }
    }

    #[test]
    fn disks_and_the_net_become_virtio_mmio_devices_in_order() {
        let args = QemuSetup {
            disks: vec![
                HostDisk::parse("/d/a.img").unwrap(),
                HostDisk::parse("/d/b.img:ro").unwrap(),
            ],
            net: Some(QemuNet::parse("connect:4321").unwrap()),
            extra_args: Vec::new(),
            ..setup()
        }
        .args()
        .join(" ");
        assert!(
            args.ends_with(
                "-global virtio-mmio.force-legacy=false \
                 -drive file=/d/a.img,if=none,format=raw,id=disk0 \
                 -device virtio-blk-device,drive=disk0 \
                 -drive file=/d/b.img,if=none,format=raw,id=disk1,readonly=on \
                 -device virtio-blk-device,drive=disk1 \
                 -netdev socket,id=net0,connect=127.0.0.1:4321 \
                 -device virtio-net-device,netdev=net0"
            ),
            "{args}"
        );
        assert!(args.contains("-nic none"), "no default NIC: {args}");
        assert!(!setup().args().join(" ").contains("-global"));
        assert_eq!(
            QemuNet::parse("user").unwrap().qemu_args()[1],
            "user,id=net0,restrict=on"
        );
        assert_eq!(
            QemuNet::parse("listen:5555").unwrap().qemu_args()[1],
            "socket,id=net0,listen=127.0.0.1:5555"
        );
        for bad in ["", "tap", "listen:", "listen:0", "connect:70000", "user:1"] {
            assert!(QemuNet::parse(bad).is_err(), "{bad}");
        }
        for bad in ["", ":ro", "/a,b.img"] {
            assert!(HostDisk::parse(bad).is_err(), "{bad}");
        }
        let missing = HostDisk::parse("/no/such.img").unwrap().check_exists();
        assert!(missing.unwrap_err().contains("/no/such.img: no such file"));
    }

    #[test]
    fn passed_devices_follow_the_disks_each_numbered_in_its_kind() {
        let args = QemuSetup {
            disks: vec![HostDisk::parse("/d/host.img").unwrap()],
            passed: vec![
                PassedDevice::Disk(HostDisk::parse("/d/a.img").unwrap()),
                PassedDevice::Net { port: 5555 },
                PassedDevice::Disk(HostDisk::parse("/d/b.img:ro").unwrap()),
                PassedDevice::Net { port: 6000 },
            ],
            extra_args: Vec::new(),
            ..setup()
        }
        .args()
        .join(" ");
        assert!(
            args.ends_with(
                "-global virtio-mmio.force-legacy=false \
                 -drive file=/d/host.img,if=none,format=raw,id=disk0 \
                 -device virtio-blk-device,drive=disk0 \
                 -drive file=/d/a.img,if=none,format=raw,id=pdisk0 \
                 -device virtio-blk-device,drive=pdisk0 \
                 -netdev user,id=pnet0,restrict=on,hostfwd=tcp:127.0.0.1:5555-:5555 \
                 -device virtio-net-device,netdev=pnet0 \
                 -drive file=/d/b.img,if=none,format=raw,id=pdisk1,readonly=on \
                 -device virtio-blk-device,drive=pdisk1 \
                 -netdev user,id=pnet1,restrict=on,hostfwd=tcp:127.0.0.1:6000-:6000 \
                 -device virtio-net-device,netdev=pnet1"
            ),
            "{args}"
        );
        // Still no default NIC and nothing that needs an option ROM.
        assert!(args.contains("-nic none"), "{args}");
        assert!(
            !args.contains("romfile") && !args.contains("-pci"),
            "{args}"
        );
        let passed_only = QemuSetup {
            passed: vec![PassedDevice::Net { port: 7 }],
            ..setup()
        }
        .args()
        .join(" ");
        assert!(passed_only.contains("-global virtio-mmio.force-legacy=false"));
        assert_eq!(PassedDevice::parse_port("8080"), Ok(8080));
        for bad in ["", "0", "65536", "-1", "http"] {
            assert!(PassedDevice::parse_port(bad).is_err(), "{bad}");
        }
        assert_eq!(PassedDevice::Net { port: 80 }.item(), "pass-net=80");
        assert_eq!(
            PassedDevice::Disk(HostDisk::parse("/d/b.img:ro").unwrap()).item(),
            "pass-disk=/d/b.img:ro"
        );
    }

    #[test]
    fn a_passed_pci_disk_is_a_virtio_blk_pci_without_a_rom() {
        let args = QemuSetup {
            passed: vec![
                PassedDevice::PcieDisk(HostDisk::parse("/d/a.img").unwrap()),
                PassedDevice::Disk(HostDisk::parse("/d/b.img").unwrap()),
                PassedDevice::PcieDisk(HostDisk::parse("/d/c.img:ro").unwrap()),
            ],
            extra_args: Vec::new(),
            ..setup()
        }
        .args()
        .join(" ");
        assert!(
            args.ends_with(
                "-global virtio-mmio.force-legacy=false \
                 -drive file=/d/a.img,if=none,format=raw,id=ppci0 \
                 -device virtio-blk-pci,drive=ppci0 \
                 -drive file=/d/b.img,if=none,format=raw,id=pdisk0 \
                 -device virtio-blk-device,drive=pdisk0 \
                 -drive file=/d/c.img,if=none,format=raw,id=ppci1,readonly=on \
                 -device virtio-blk-pci,drive=ppci1"
            ),
            "{args}"
        );
        assert!(!args.contains("romfile"), "{args}");
        // Only PCI devices: no virtio-mmio transport in use.
        let pci_only = QemuSetup {
            passed: vec![PassedDevice::PcieDisk(HostDisk::parse("/d/a.img").unwrap())],
            ..setup()
        }
        .args()
        .join(" ");
        assert!(!pci_only.contains("virtio-mmio"), "{pci_only}");
        let pci = PassedDevice::PcieDisk(HostDisk::parse("/d/a.img").unwrap());
        let mmio = PassedDevice::Disk(HostDisk::parse("/d/a.img:ro").unwrap());
        assert!(pci.clashes_with(&mmio) && mmio.clashes_with(&pci));
        assert!(!pci.clashes_with(&PassedDevice::Net { port: 1 }));
        assert_eq!(pci.item(), "pass-pcie=/d/a.img");
        assert_eq!(PCIE_HOST_BRIDGE_NODE, "/pcie@10000000");
    }

    #[test]
    fn virtio_mmio_nodes_go_down_from_the_highest_transport() {
        assert_eq!(virtio_mmio_node(0).as_deref(), Some("/virtio_mmio@a003e00"));
        assert_eq!(virtio_mmio_node(1).as_deref(), Some("/virtio_mmio@a003c00"));
        assert_eq!(virtio_mmio_node(2).as_deref(), Some("/virtio_mmio@a003a00"));
        assert_eq!(
            virtio_mmio_node(31).as_deref(),
            Some("/virtio_mmio@a000000")
        );
        assert_eq!(virtio_mmio_node(32), None);
    }

    #[test]
    fn a_listener_is_seen_in_proc_net_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        wait_for_listener(port, Duration::from_secs(2)).unwrap();
        drop(listener);
        let error = wait_for_listener(port, Duration::from_millis(100)).unwrap_err();
        assert!(error.contains("nothing listens"), "{error}");
    }

    #[test]
    fn command_line_has_the_contract_machine() {
        let args = setup().args();
        let joined = args.join(" ");
        assert!(joined.starts_with(
            "-machine virt,virtualization=on,gic-version=3 -cpu max,pauth=off -smp 4 -m 1024M \
             -nographic -nic none"
        ));
        assert!(joined.contains("-kernel /t/hypervisor.img -initrd /t/payload.cpio"));
        assert!(joined.ends_with("-d guest_errors"));
        assert!(!args.contains(&"-S".to_string()));
    }

    #[test]
    fn gic_version_2_is_asked_for_in_the_machine_string() {
        let args = QemuSetup {
            gic: GicVersion::V2,
            ..setup()
        }
        .args();
        assert_eq!(args[1], "virt,virtualization=on,gic-version=2");
        assert!(args.windows(2).any(|w| w == ["-nic", "none"]));
        let direct = QemuSetup {
            gic: GicVersion::V2,
            machine: Machine::El1Only,
            ..setup()
        }
        .args();
        assert_eq!(direct[1], "virt,gic-version=2");
        assert_eq!(GicVersion::parse("2"), Some(GicVersion::V2));
        assert_eq!(GicVersion::parse("3"), Some(GicVersion::V3));
        assert_eq!(GicVersion::parse("4"), None);
    }

    #[test]
    fn memory_tagging_is_asked_for_in_the_machine_string() {
        let args = QemuSetup {
            mte: true,
            ..setup()
        }
        .args();
        assert_eq!(args[1], "virt,virtualization=on,mte=on,gic-version=3");
        let direct = QemuSetup {
            mte: true,
            machine: Machine::El1Only,
            ..setup()
        }
        .args();
        assert_eq!(direct[1], "virt,mte=on,gic-version=3");
    }

    #[test]
    fn direct_boot_has_no_el2_and_appends_bootargs() {
        let setup = QemuSetup {
            machine: Machine::El1Only,
            initrd: None,
            append: Some("test=memory hypercalls=psci".into()),
            gdb: true,
            ..setup()
        };
        let args = setup.args();
        assert_eq!(args[1], "virt,gic-version=3");
        let at = args.iter().position(|a| a == "-append").unwrap();
        assert_eq!(args[at + 1], "test=memory hypercalls=psci");
        assert!(args.windows(2).any(|w| w == ["-s", "-S"]));
        assert!(
            setup
                .command_line()
                .contains("-append 'test=memory hypercalls=psci'")
        );
    }

    #[test]
    fn no_command_line_gets_a_default_nic() {
        // QEMU's `virt` adds a virtio NIC unless told not to, and then needs
        // the `efi-virtio.rom` option ROM that a minimal install lacks. Only
        // U-Boot, when asked for, is firmware; nothing loads an option ROM.
        let uboot = UBootFiles {
            bios: "/usr/lib/u-boot/qemu_arm64/u-boot.bin".into(),
            environment: "/t/uboot-env.img".into(),
        };
        for machine in [Machine::WithEl2, Machine::El1Only] {
            for gdb in [false, true] {
                for append in [None, Some("console=ttyAMA0".to_string())] {
                    for firmware in [None, Some(uboot.clone())] {
                        let args = QemuSetup {
                            machine,
                            gdb,
                            append: append.clone(),
                            firmware: firmware.clone(),
                            extra_args: Vec::new(),
                            ..setup()
                        }
                        .args();
                        let nics: Vec<_> = args
                            .windows(2)
                            .filter(|pair| ["-nic", "-net", "-netdev"].contains(&pair[0].as_str()))
                            .collect();
                        assert_eq!(nics, [["-nic", "none"]], "{args:?}");
                        assert!(!args.iter().any(|a| a.contains("romfile")), "{args:?}");
                        assert_eq!(
                            args.iter().any(|a| a == "-bios"),
                            firmware.is_some(),
                            "{args:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn u_boot_gets_its_environment_flash_and_the_files_through_fw_cfg() {
        let setup = QemuSetup {
            firmware: Some(UBootFiles {
                bios: "/u/u-boot.bin".into(),
                environment: "/t/env.img".into(),
            }),
            ..setup()
        };
        let joined = setup.args().join(" ");
        assert!(joined.contains(
            "-no-reboot -bios /u/u-boot.bin -drive \
             if=pflash,unit=1,format=raw,readonly=on,file=/t/env.img -kernel /t/hypervisor.img \
             -initrd /t/payload.cpio"
        ));
        assert!(joined.starts_with("-machine virt,virtualization=on,gic-version=3 "));
    }

    #[test]
    fn quoting_is_shell_safe() {
        assert_eq!(shell_quote("plain/path-1.img"), "plain/path-1.img");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn gdb_command_attaches_with_symbols_at_their_run_addresses() {
        let command = gdb_command(&[
            Symbols {
                elf: "/x/hypervisor".into(),
                offset: 0x4020_0000,
            },
            Symbols {
                elf: "/x/test guest".into(),
                offset: 0,
            },
        ]);
        assert_eq!(
            command,
            "gdb-multiarch -q -ex 'symbol-file -o 0x40200000 /x/hypervisor' -ex \
             'add-symbol-file /x/test guest' -ex 'target remote localhost:1234'"
        );
        let direct = gdb_command(&[Symbols {
            elf: "/x/guest".into(),
            offset: 0,
        }]);
        assert_eq!(
            direct,
            "gdb-multiarch -q /x/guest -ex 'target remote localhost:1234'"
        );
    }

    #[test]
    fn stop_lines_have_grace_periods() {
        use crate::console::{GuestResult, classify};
        assert_eq!(
            grace_after(&Line::Result(GuestResult::Pass)),
            Some(RESULT_GRACE)
        );
        assert_eq!(grace_after(&classify("[hv] system off")), Some(EXIT_GRACE));
        assert_eq!(grace_after(&classify("[hv] PANIC: x")), Some(EXIT_GRACE));
        assert_eq!(
            grace_after(&classify("[    9.1] Kernel panic - not syncing: x")),
            Some(FAULT_GRACE)
        );
        assert_eq!(grace_after(&classify("STAT vm0 exits_hvc 3")), None);
        assert_eq!(
            grace_after(&classify(crate::uboot::FAILED_MARKER)),
            Some(FIRMWARE_GRACE)
        );
        assert_eq!(grace_after(&classify(crate::uboot::START_MARKER)), None);
        assert_eq!(grace_after(&classify("LINUX-INIT: started")), None);
    }

    /// Runs a shell script in QEMU's place (it ignores QEMU's arguments)
    /// with a progress watch of 1 s and an overall limit of 20 s.
    fn run_script(name: &str, script: &str) -> (QemuRun, Duration) {
        let path = std::env::temp_dir().join(format!("qemu-runner-{}-{name}", std::process::id()));
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).unwrap();
        let setup = QemuSetup {
            program: path.clone(),
            ..setup()
        };
        let watch = Watch {
            timeout: Some(Duration::from_secs(20)),
            progress: Some(Progress {
                marker: "FUZZ: seed",
                within: Duration::from_secs(1),
            }),
            echo: false,
            stdin: QemuStdin::Closed,
            follow_to_exit: false,
        };
        let started = Instant::now();
        let outcome = run(&setup, watch).unwrap();
        std::fs::remove_file(&path).unwrap();
        (outcome, started.elapsed())
    }

    #[test]
    fn a_late_progress_line_stops_the_run_as_hung() {
        let (outcome, took) = run_script(
            "stall",
            "echo 'FUZZ: seed 1'; sleep 0.5; echo 'FUZZ: seed 2'; echo other; exec sleep 30",
        );
        assert!(
            matches!(outcome.ending, Ending::Stalled(p) if p.marker == "FUZZ: seed"),
            "{:?}",
            outcome.ending
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert!(outcome.transcript.text.contains("FUZZ: seed 2"));
    }

    #[test]
    fn progress_lines_in_time_keep_the_run_going() {
        let (outcome, _) = run_script(
            "steady",
            "for s in 1 2 3 4; do echo \"FUZZ: seed $s\"; sleep 0.6; done; \
             echo 'FUZZ: seeds=4'; echo 'RESULT: PASS'; exec sleep 30",
        );
        assert_eq!(outcome.ending, Ending::StoppedAfterGrace);
        assert!(outcome.transcript.text.contains("FUZZ: seed 4"));
    }

    #[test]
    fn qemu_load_addresses() {
        assert_eq!(virt_load_address(0), 0x4020_0000);
        assert_eq!(virt_load_address(0x8_0000), 0x4008_0000);
    }
}
