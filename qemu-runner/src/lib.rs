//! Boots the hypervisor (or a guest alone) under QEMU and judges the result.
//!
//! [`run`] is the whole pipeline, used by the `qemu-runner` binary and by the
//! end-to-end tests: check the prerequisites ([`prereq`]), build the
//! hypervisor and the test guest for aarch64 with a nested cargo
//! ([`artifacts`]), turn their ELF files into raw arm64 `Image`s ([`image`]),
//! pack the guest into the boot payload (a newc cpio archive written with the
//! `boot-payload` crate, which the hypervisor reads it with),
//! start `qemu-system-aarch64` and follow its console ([`qemu`]), and read the
//! verdict, the `STAT` counters and the hypervisor's log from it
//! ([`console`]). A run passes only on the guest's `RESULT: PASS` followed by
//! QEMU exiting 0, with no hypervisor panic and no guest kernel failure
//! report (oops, `WARNING:`, panic, `BUG:`); an interactive Linux session
//! passes when QEMU exits 0 with no such report.
//!
//! The guest is the test guest (`tests/guest`), or a Linux kernel with an
//! initrd ([`RunConfig::linux`], [`linux`]): Debian's arm64 kernel and a
//! busybox initramfs ([`debian`], [`initramfs`]), or any files.
//!
//! A run may hold several VMs in one payload ([`RunConfig::vms`], `--vm`,
//! [`vmspec`]): each VM's console lines carry its `[<name>] ` prefix and the
//! run is judged VM by VM ([`vm_verdict`]). Console input can be a script
//! of "wait for this text, send these bytes" steps ([`console_script`]).
//! When standard input is a terminal, every run reads it in raw mode
//! ([`terminal`]: the hypervisor's console and its monitor get every key,
//! and the terminal's mode comes back however the run ends); a run whose
//! guests have verdicts still ends on them unless [`RunConfig::stay`].
//!
//! [`Boot::Direct`] boots the guest kernel by itself at EL1 (no
//! `virtualization=on`, no hypervisor), which shakes out a guest and gives the
//! baseline for hypervisor-overhead figures.
//!
//! [`Firmware::UBoot`] has U-Boot load and `booti` the hypervisor, as on a
//! board ([`uboot`]), instead of QEMU entering it; such a run also fails when
//! U-Boot did not run the runner's boot command or reported it failed.

pub mod artifacts;
pub mod console;
pub mod console_script;
pub mod debian;
pub mod disk_image;
pub mod image;
pub mod initramfs;
pub mod kernel_modules;
pub mod linux;
pub mod prereq;
pub mod qemu;
pub mod scratch;
pub mod terminal;
pub mod uboot;
pub mod vm_verdict;
pub mod vmspec;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

/// The payload format the runner writes, for tests that read it back.
pub use boot_payload;

use artifacts::{BuildError, HYPERVISOR, TEST_GUEST};
use boot_payload::vmconf::{DeviceList, DevicePath, DiskConf, VmConf};
use boot_payload::vmname::VmName;
use boot_payload::{MAX_VMS, NamedPayload, Payload};
use console::{Counters, GuestResult, Transcript};
use console_script::ConsoleScript;
use image::ImageError;
use linux::{LinuxBoot, LinuxError};
use prereq::PrereqError;
use qemu::{Ending, Machine, PassedDevice, QemuSetup, QemuStdin, Watch};
use vm_verdict::VmsVerdict;
use vmspec::{VmExpect, VmGuest, VmSpec};

/// What runs on the emulated machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// The hypervisor at EL2, the guest in its payload at EL1.
    Hypervisor,
    /// The guest kernel alone at EL1, booted by QEMU directly.
    Direct,
}

/// What starts the hypervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// QEMU itself (`-kernel`): it loads the Image, the initrd and its
    /// device tree and enters the Image.
    None,
    /// U-Boot (`-bios`), which loads both files from QEMU's fw_cfg and
    /// `booti`s the hypervisor, as a board's U-Boot does ([`uboot`]).
    UBoot,
}

impl Firmware {
    /// Every choice, for help texts.
    pub const ALL: [Firmware; 2] = [Firmware::None, Firmware::UBoot];

    /// The name on the command line (`--firmware`).
    pub fn name(self) -> &'static str {
        match self {
            Firmware::None => "none",
            Firmware::UBoot => "u-boot",
        }
    }

    /// The firmware called `name`.
    pub fn from_name(name: &str) -> Option<Firmware> {
        Firmware::ALL.into_iter().find(|f| f.name() == name)
    }
}

pub use test_scenarios::Scenario;

/// Every scenario's name, comma-separated (for help and error texts).
pub fn scenario_names() -> String {
    Scenario::ALL
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Hypervisor or direct boot.
    pub boot: Boot,
    /// What starts the hypervisor (hypervisor boot only).
    pub firmware: Firmware,
    /// Test guest scenario (unused when `linux` is set).
    pub scenario: Scenario,
    /// Extra words for the test guest's bootargs, after `test=<scenario>`
    /// (e.g. `seed=5 seeds=10 ops=400` for the fuzz scenario).
    pub guest_args: String,
    /// Boot this Linux guest instead of the test guest.
    pub linux: Option<LinuxBoot>,
    /// Emulated CPUs (`-smp`).
    pub smp: u32,
    /// Machine RAM in MiB (`-m`).
    pub mem_mib: u32,
    /// Guest RAM in MiB (`vm.conf` `mem_mib=`; the hypervisor's default when
    /// `None`). Hypervisor boot only.
    pub guest_mem_mib: Option<u32>,
    /// vCPUs of the VM (`vm.conf` `vcpus=`; every CPU when `None`).
    /// Hypervisor boot only.
    pub vcpus: Option<u32>,
    /// `-cpu` model and properties.
    pub cpu: String,
    /// The machine's GIC (`gic-version=`).
    pub gic: qemu::GicVersion,
    /// The machine has memory tagging (`--mte`: QEMU's `mte=on`, a `-cpu
    /// max`); without `--vm` the one VM gets it too (`mte=on` in its
    /// `vm.conf`), with `--vm` each VM that asks (`mte=on`).
    pub mte: bool,
    /// Overall time limit of an unattended run; ignored (no limit) with
    /// `gdb`.
    pub timeout: Duration,
    /// Progress lines an unattended run must keep printing, each within a
    /// time of the one before (`None`: only the overall limit); ignored with
    /// `gdb`.
    pub progress: Option<qemu::Progress>,
    /// Time limit of an interactive session ([`RunConfig::is_interactive`]);
    /// `None`: none, the person at the terminal ends it.
    pub session_timeout: Option<Duration>,
    /// Where the guest's console input comes from.
    pub input: ConsoleInput,
    /// Keep a run read from a terminal open until QEMU exits (`--stay`):
    /// the VMs' verdicts do not end it, and only
    /// [`RunConfig::session_timeout`] limits it. No effect without a
    /// terminal.
    pub stay: bool,
    /// Start QEMU halted, waiting for gdb.
    pub gdb: bool,
    /// Extra QEMU arguments, appended last.
    pub extra_qemu_args: Vec<String>,
    /// Copy the console to stdout while it runs.
    pub echo: bool,
    /// The VMs of the payload (`--vm`); empty: the one VM that `scenario`,
    /// `guest_args`, `linux`, `vcpus` and `guest_mem_mib` describe.
    /// Hypervisor boot only.
    pub vms: Vec<VmSpec>,
    /// Raw image files QEMU serves as its own virtio-blk disks (`--disk`),
    /// for the one guest of a run without `--vm`: a direct boot's guest sees
    /// them itself; under the hypervisor (one disk at most) its VM gets host
    /// disk 0 as its virtio-blk (`disk=0` in `vm.conf`). With `--vm`, each
    /// VM's `disk=` adds its own ([`RunConfig::host_disks`]).
    pub disks: Vec<qemu::HostDisk>,
    /// QEMU's own virtio-net for a direct boot (`--net`).
    pub net: Option<qemu::QemuNet>,
}

/// The default `-cpu`: every feature but pointer authentication, whose
/// emulation makes TCG about four times slower.
pub const DEFAULT_CPU: &str = "max,pauth=off";

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            boot: Boot::Hypervisor,
            firmware: Firmware::None,
            scenario: Scenario::Memory,
            guest_args: String::new(),
            linux: None,
            smp: 4,
            mem_mib: 1024,
            guest_mem_mib: None,
            vcpus: None,
            cpu: DEFAULT_CPU.to_string(),
            gic: qemu::GicVersion::V3,
            mte: false,
            timeout: Duration::from_secs(120),
            progress: None,
            session_timeout: None,
            input: ConsoleInput::Closed,
            stay: false,
            gdb: false,
            extra_qemu_args: Vec::new(),
            echo: true,
            vms: Vec::new(),
            disks: Vec::new(),
            net: None,
        }
    }
}

/// Where the guest's console input comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleInput {
    /// Nothing: QEMU's stdin is closed (scripts, tests, CI).
    Closed,
    /// The terminal the runner was started from: an interactive guest (a
    /// shell) reads what is typed there.
    Terminal,
    /// Bytes sent when text appears on the console ([`console_script`]);
    /// the run fails with [`Verdict::ScriptUnfinished`] when a step's text
    /// never appeared.
    Script(ConsoleScript),
}

/// Most CPUs the hypervisor drives (its per-CPU arrays).
pub const HYPERVISOR_MAX_CPUS: u32 = 32;
/// Most CPUs of QEMU's `virt` machine with a GICv3.
pub const VIRT_MAX_CPUS: u32 = 512;
/// Least machine RAM accepted, in MiB.
pub const MIN_MEM_MIB: u32 = 64;

/// A Linux guest's defaults: 2 CPUs, 512 MiB guest RAM (the machine gets
/// 1024 MiB under the hypervisor), a 300 s limit.
pub const LINUX_SMP: u32 = 2;
/// Guest RAM of a Linux guest, in MiB.
pub const LINUX_GUEST_MEM_MIB: u32 = 512;
/// Machine RAM of a Linux guest under the hypervisor, in MiB.
pub const LINUX_HOST_MEM_MIB: u32 = 1024;
/// How long a direct boot with `--net connect:PORT` waits for the QEMU that
/// listens on PORT.
pub const NET_LISTENER_WAIT: Duration = Duration::from_secs(60);
/// Time limit of an unattended Linux run.
pub const LINUX_TIMEOUT: Duration = Duration::from_secs(300);

impl RunConfig {
    /// Settings for booting `linux` with `boot`: [`LINUX_SMP`] CPUs,
    /// [`LINUX_GUEST_MEM_MIB`] of guest RAM (under the hypervisor in a machine
    /// of [`LINUX_HOST_MEM_MIB`]), [`LINUX_TIMEOUT`].
    pub fn linux(boot: Boot, linux: LinuxBoot) -> RunConfig {
        let (mem_mib, guest_mem_mib) = match boot {
            Boot::Hypervisor => (LINUX_HOST_MEM_MIB, Some(LINUX_GUEST_MEM_MIB)),
            Boot::Direct => (LINUX_GUEST_MEM_MIB, None),
        };
        RunConfig {
            boot,
            linux: Some(linux),
            smp: LINUX_SMP,
            mem_mib,
            guest_mem_mib,
            timeout: LINUX_TIMEOUT,
            ..RunConfig::default()
        }
    }

    /// Whether no guest has a test verdict of its own (a shell, kernel and
    /// initrd given as files, the `echo` test guest; with `--vm`s, every VM
    /// expected to keep running): the run passes when QEMU exits 0 with no
    /// failure report, rather than on `RESULT: PASS`.
    pub fn guest_is_free_running(&self) -> bool {
        match self.vms.as_slice() {
            [] => match &self.linux {
                Some(linux) => !linux.reports_result(),
                None => !self.scenario.reports_result(),
            },
            vms => vms.iter().all(|vm| vm.expect == VmExpect::Running),
        }
    }

    /// Whether the console's input is the terminal the runner was started
    /// from: QEMU then reads what is typed there, in raw mode, in every run
    /// (Ctrl-] reaches the hypervisor's monitor, Ctrl-A x quits QEMU).
    pub fn reads_terminal(&self) -> bool {
        self.input == ConsoleInput::Terminal
    }

    /// Whether a person drives the run to its end: the console reads a
    /// terminal and no guest has a verdict of its own
    /// ([`RunConfig::guest_is_free_running`]), or `--stay`
    /// ([`RunConfig::stay`]) asked to keep the run open. The time limit is
    /// then [`RunConfig::session_timeout`] and the run follows QEMU to its
    /// exit. Otherwise a run reading a terminal still ends on its verdicts
    /// and [`RunConfig::timeout`]; without a terminal QEMU's stdin is
    /// closed.
    pub fn is_interactive(&self) -> bool {
        self.reads_terminal() && (self.guest_is_free_running() || self.stay)
    }

    /// Checks the settings before anything is built or started, so a bad
    /// option costs nothing: CPU and memory counts in range, VM settings only
    /// for a hypervisor boot, vCPUs no more than CPUs, guest RAM smaller than
    /// the machine's, a time limit of at least a second; and for `--vm`s
    /// ([`RunConfig::validate_vms`]).
    pub fn validate(&self) -> Result<(), RunnerError> {
        let fail = |why: String| Err(RunnerError::Config(why));
        let max_cpus = match self.boot {
            Boot::Hypervisor => HYPERVISOR_MAX_CPUS,
            Boot::Direct => VIRT_MAX_CPUS,
        };
        if !(1..=max_cpus).contains(&self.smp) {
            return fail(format!(
                "--smp {}: between 1 and {max_cpus} CPUs{}",
                self.smp,
                match self.boot {
                    Boot::Hypervisor => " (the hypervisor drives at most 32)",
                    Boot::Direct => " (QEMU virt with GICv3)",
                }
            ));
        }
        if self.smp > self.gic.max_cpus() {
            return fail(format!(
                "--smp {}: a GICv{} machine has at most {} CPUs (--gic)",
                self.smp,
                self.gic.number(),
                self.gic.max_cpus()
            ));
        }
        if self.mem_mib < MIN_MEM_MIB {
            return fail(format!(
                "--mem {}: the machine needs at least {MIN_MEM_MIB} MiB",
                self.mem_mib
            ));
        }
        if self.boot == Boot::Direct && self.firmware != Firmware::None {
            return fail(format!(
                "--firmware {}: the firmware boots the hypervisor; --direct boots the guest \
                 without it",
                self.firmware.name()
            ));
        }
        if self.boot == Boot::Direct && (self.guest_mem_mib.is_some() || self.vcpus.is_some()) {
            return fail(
                "--guest-mem and --vcpus configure the hypervisor's VM; a direct boot uses --mem \
                 and --smp"
                    .into(),
            );
        }
        if let Some(vcpus) = self.vcpus
            && !(1..=self.smp).contains(&vcpus)
        {
            return fail(format!(
                "--vcpus {vcpus}: between 1 and the {} CPUs of --smp (vCPUs are pinned one to \
                 a CPU)",
                self.smp
            ));
        }
        if let Some(guest_mem) = self.guest_mem_mib
            && !(1..self.mem_mib).contains(&guest_mem)
        {
            return fail(format!(
                "--guest-mem {guest_mem}: at least 1 and less than --mem ({} MiB; the \
                 hypervisor keeps the rest)",
                self.mem_mib
            ));
        }
        if self.mte && self.cpu.split(',').next() != Some("max") {
            return fail(format!(
                "--mte: QEMU's memory tagging needs --cpu max (its other models lack \
                 FEAT_MTE2), not `{}`",
                self.cpu
            ));
        }
        if self.timeout.is_zero() || self.session_timeout.is_some_and(|t| t.is_zero()) {
            return fail("--timeout: at least 1 second".into());
        }
        self.validate_vms()?;
        self.validate_devices()
    }

    /// Checks the `--vm`s: a hypervisor boot, at most [`MAX_VMS`], no
    /// one-VM options beside them, distinct names, beside other VMs each
    /// names its CPUs, no CPU twice, every CPU within `--smp`, and their RAM
    /// together less than the machine's.
    pub fn validate_vms(&self) -> Result<(), RunnerError> {
        let fail = |why: String| Err(RunnerError::Config(why));
        if self.vms.is_empty() {
            return Ok(());
        }
        if self.boot == Boot::Direct {
            return fail("--vm configures the hypervisor's VMs; --direct boots one guest".into());
        }
        if self.linux.is_some()
            || self.vcpus.is_some()
            || self.guest_mem_mib.is_some()
            || !self.guest_args.is_empty()
        {
            return fail(
                "--vm describes every VM; --guest, --guest-args, --vcpus, --guest-mem and the \
                 Linux options describe the one VM of a run without --vm"
                    .into(),
            );
        }
        if self.vms.len() > MAX_VMS {
            return fail(format!(
                "--vm given {} times: a payload holds at most {MAX_VMS} VMs",
                self.vms.len()
            ));
        }
        let several = self.vms.len() > 1;
        for (i, vm) in self.vms.iter().enumerate() {
            if self.vms[..i].iter().any(|other| other.name == vm.name) {
                return fail(format!("--vm: two VMs are called `{}`", vm.name));
            }
            let Some(cpus) = vm.cpus else {
                if several {
                    return fail(format!(
                        "--vm: VM `{}` needs cpus= beside other VMs (each VM runs on its own \
                         CPUs)",
                        vm.name
                    ));
                }
                continue;
            };
            if cpus.highest() >= self.smp {
                return fail(format!(
                    "--vm: VM `{}` names CPU {}, but --smp {} gives CPUs 0-{}",
                    vm.name,
                    cpus.highest(),
                    self.smp,
                    self.smp - 1
                ));
            }
            for other in &self.vms[..i] {
                if let Some(cpu) = other.cpus.and_then(|o| o.first_shared(cpus)) {
                    return fail(format!(
                        "--vm: VMs `{}` and `{}` both name CPU {cpu}; a CPU runs one VM",
                        other.name, vm.name
                    ));
                }
            }
        }
        let total: u64 = self
            .vms
            .iter()
            .map(|vm| u64::from(vm.mem_mib_or_default()))
            .sum();
        if total >= u64::from(self.mem_mib) {
            return fail(format!(
                "--vm: the VMs' RAM adds up to {total} MiB, not less than --mem ({} MiB; the \
                 hypervisor keeps the rest)",
                self.mem_mib
            ));
        }
        Ok(())
    }

    /// The disks QEMU serves, in order (disk N is the N-th): `--disk`s,
    /// then each `--vm`'s `disk=` in the order of the `--vm`s, an image
    /// that several `--vm`s name once ([`vm_disks`]).
    pub fn host_disks(&self) -> Vec<qemu::HostDisk> {
        self.disks
            .iter()
            .cloned()
            .chain(vm_disks(&self.vms))
            .collect()
    }

    /// The devices QEMU serves for the `--vm`s to own, in command-line
    /// order after [`RunConfig::host_disks`] ([`passed_devices`]).
    pub fn passed(&self) -> Result<Vec<PassedDevice>, RunnerError> {
        Ok(passed_devices(&self.vms)?
            .into_iter()
            .map(|placement| placement.device)
            .collect())
    }

    /// Checks the disks and the network: image files exist, `--disk` not
    /// beside `--vm` and at most one under the hypervisor, `--net` for a
    /// direct boot only.
    pub fn validate_devices(&self) -> Result<(), RunnerError> {
        let fail = |why: String| Err(RunnerError::Config(why));
        if !self.disks.is_empty() && !self.vms.is_empty() {
            return fail(
                "--disk gives the one VM of a run without --vm its disk; with --vm, give each \
                 VM its own (disk=PATH)"
                    .into(),
            );
        }
        if self.boot == Boot::Hypervisor && self.disks.len() > 1 {
            return fail(
                "--disk: the one VM under the hypervisor gets one disk; --direct takes more".into(),
            );
        }
        if self.net.is_some() && self.boot != Boot::Direct {
            return fail(
                "--net gives a direct boot QEMU's own virtio-net; under the hypervisor, VMs \
                 name their network with --vm net=NAME"
                    .into(),
            );
        }
        for disk in self.host_disks() {
            disk.check_exists().map_err(RunnerError::Config)?;
        }
        self.validate_passed()
    }

    /// Checks the `--vm`s' passed devices (`pass-disk=`, `pass-net=`,
    /// `pass-pcie=`): enough virtio-mmio transports for them after the host
    /// disks, each image file there and given once (QEMU locks an image it
    /// opens, and a disk two VMs drove at once would be ruined), no image
    /// both a host disk and passed, each forwarded port once, the PCIe host
    /// bridge to one VM (its `pass-pcie=` devices; no other VM names the
    /// bridge with `device=`).
    pub fn validate_passed(&self) -> Result<(), RunnerError> {
        let fail = |why: String| Err(RunnerError::Config(why));
        let placed = passed_devices(&self.vms)?;
        let host_disks = vm_disks(&self.vms);
        let bridge_owner = placed
            .iter()
            .find(|placement| !placement.device.on_virtio_mmio());
        for (i, placement) in placed.iter().enumerate() {
            let vm = &self.vms[placement.vm].name;
            let item = placement.device.item();
            if let Some(owner) = bridge_owner
                && owner.vm != placement.vm
                && !placement.device.on_virtio_mmio()
            {
                return fail(format!(
                    "--vm: VM `{vm}`'s {item}: VM `{}` already has QEMU's PCIe host bridge \
                     ({}); the bridge is one device-tree node ({}), so one VM has every \
                     pass-pcie=",
                    self.vms[owner.vm].name,
                    owner.device.item(),
                    qemu::PCIE_HOST_BRIDGE_NODE
                ));
            }
            let earlier = placed[..i]
                .iter()
                .find(|other| other.device.clashes_with(&placement.device));
            if let Some(other) = earlier {
                return fail(format!(
                    "--vm: VM `{vm}`'s {item} is also VM `{}`'s {} (QEMU serves a passed \
                     device to one VM)",
                    self.vms[other.vm].name,
                    other.device.item()
                ));
            }
            let Some(disk) = placement.device.disk() else {
                continue;
            };
            if host_disks.iter().any(|host| host.path == disk.path) {
                return fail(format!(
                    "--vm: VM `{vm}`'s {item}: the image is also a host disk (disk=); QEMU \
                     opens an image once"
                ));
            }
            disk.check_exists()
                .map_err(|why| RunnerError::Config(format!("--vm: VM `{vm}`'s {item}: {why}")))?;
        }
        if let Some(owner) = bridge_owner {
            let named = self.vms.iter().enumerate().find(|(index, vm)| {
                *index != owner.vm
                    && vm
                        .devices
                        .iter()
                        .any(|path| path.as_str() == qemu::PCIE_HOST_BRIDGE_NODE)
            });
            if let Some((_, vm)) = named {
                return fail(format!(
                    "--vm: VM `{}`'s device={}: VM `{}` has the PCIe host bridge ({})",
                    vm.name,
                    qemu::PCIE_HOST_BRIDGE_NODE,
                    self.vms[owner.vm].name,
                    owner.device.item()
                ));
            }
        }
        Ok(())
    }

    /// The time limit of the run (`None`: none).
    pub fn time_limit(&self) -> Option<Duration> {
        if self.gdb {
            None
        } else if self.is_interactive() {
            self.session_timeout
        } else {
            Some(self.timeout)
        }
    }

    /// CPUs the guest sees: the VM's vCPUs under the hypervisor, the
    /// machine's CPUs in a direct boot.
    pub fn guest_cpus(&self) -> u32 {
        match self.boot {
            Boot::Hypervisor => self.vcpus.unwrap_or(self.smp),
            Boot::Direct => self.smp,
        }
    }

    /// The console script of the run, if its input is one.
    pub fn script(&self) -> Option<&ConsoleScript> {
        match &self.input {
            ConsoleInput::Script(script) => Some(script),
            ConsoleInput::Closed | ConsoleInput::Terminal => None,
        }
    }
}

/// Why a run could not be carried out (as opposed to a guest that failed).
#[derive(Debug)]
pub enum RunnerError {
    /// Settings that contradict each other.
    Config(String),
    /// A missing prerequisite.
    Prereq(PrereqError),
    /// Building the hypervisor or the guest failed.
    Build(BuildError),
    /// An ELF could not be turned into an Image.
    Image {
        /// The ELF file.
        elf: PathBuf,
        /// What was wrong.
        error: ImageError,
    },
    /// The Linux guest's kernel or initrd could not be had.
    Linux(LinuxError),
    /// A file could not be read or written, or QEMU could not be started.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        error: std::io::Error,
    },
}

impl fmt::Display for RunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnerError::Config(why) => write!(f, "{why}"),
            RunnerError::Prereq(error) => write!(f, "{error}"),
            RunnerError::Build(error) => write!(f, "{error}"),
            RunnerError::Image { elf, error } => {
                write!(f, "cannot make an Image of {}: {error}", elf.display())
            }
            RunnerError::Linux(error) => write!(f, "{error}"),
            RunnerError::Io { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for RunnerError {}

impl From<PrereqError> for RunnerError {
    fn from(error: PrereqError) -> RunnerError {
        RunnerError::Prereq(error)
    }
}

impl From<BuildError> for RunnerError {
    fn from(error: BuildError) -> RunnerError {
        RunnerError::Build(error)
    }
}

/// What a run must show to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// The guest's `RESULT: PASS`, then QEMU exiting 0 by itself.
    ResultThenExit,
    /// QEMU exiting 0 by itself (an interactive session powered off).
    CleanExit,
    /// The hypervisor stopping the VM, then QEMU exiting 0 by itself (a
    /// lone `--vm` with `expect=stopped`).
    StoppedThenExit,
}

/// The judgement of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// What was expected, with no hypervisor panic and no guest kernel
    /// failure report.
    Pass,
    /// The guest printed `RESULT: FAIL <why>`.
    GuestFailed(String),
    /// The guest printed a `RESULT:` line that is neither PASS nor FAIL.
    MalformedResult(String),
    /// The hypervisor panicked.
    HypervisorPanic(String),
    /// The guest kernel reported an oops, warning, panic or `BUG:` (the line).
    KernelFault(String),
    /// The guest passed, but QEMU did not then exit 0 by itself.
    NoCleanExit(String),
    /// The time limit ran out before a result.
    TimedOut(Duration),
    /// A progress line was late ([`RunConfig::progress`]): the guest hangs.
    Stalled(qemu::Progress),
    /// The hypervisor could not start a guest (the reason it gave).
    GuestNotStarted(String),
    /// The hypervisor stopped the VM (its error line).
    VmStopped(String),
    /// U-Boot did not boot the hypervisor (why).
    FirmwareFailed(String),
    /// QEMU ended without a result line.
    NoResult,
    /// These VMs of a run of several (name, why) did not do what was
    /// expected of them ([`vm_verdict`]).
    VmsFailed(Vec<(String, String)>),
    /// The VM was expected to be stopped by the hypervisor (`expect=stopped`),
    /// and was not.
    VmNotStopped,
    /// The console never showed the text a step of the console script waited
    /// for (that text).
    ScriptUnfinished(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass => write!(f, "PASS"),
            Verdict::GuestFailed(why) => write!(f, "FAIL: the guest reported: {why}"),
            Verdict::MalformedResult(line) => write!(f, "FAIL: unreadable result line `{line}`"),
            Verdict::HypervisorPanic(message) => {
                write!(f, "FAIL: the hypervisor panicked: {message}")
            }
            Verdict::KernelFault(line) => {
                write!(f, "FAIL: the guest kernel reported `{line}`")
            }
            Verdict::NoCleanExit(how) => {
                write!(f, "FAIL: QEMU did not power off cleanly: {how}")
            }
            Verdict::TimedOut(limit) => write!(
                f,
                "FAIL: no result within {} s; QEMU was killed (raise --timeout, or debug with --gdb)",
                limit.as_secs()
            ),
            Verdict::Stalled(progress) => write!(
                f,
                "FAIL: hang: no `{}` line within {} s of the last one; QEMU was killed",
                progress.marker,
                progress.within.as_secs()
            ),
            Verdict::NoResult => write!(f, "FAIL: QEMU exited without a RESULT line"),
            Verdict::GuestNotStarted(why) => {
                write!(f, "FAIL: the hypervisor could not start a guest: {why}")
            }
            Verdict::VmStopped(line) => write!(f, "FAIL: the hypervisor stopped the VM: {line}"),
            Verdict::FirmwareFailed(why) => {
                write!(f, "FAIL: U-Boot did not boot the hypervisor: {why}")
            }
            Verdict::VmsFailed(failed) => {
                write!(f, "FAIL: ")?;
                for (i, (vm, why)) in failed.iter().enumerate() {
                    let separator = if i == 0 { "" } else { "; " };
                    write!(f, "{separator}VM `{vm}`: {why}")?;
                }
                Ok(())
            }
            Verdict::VmNotStopped => write!(
                f,
                "FAIL: the VM was expected to be stopped by the hypervisor, and was not"
            ),
            Verdict::ScriptUnfinished(text) => write!(
                f,
                "FAIL: the console never showed {text:?}, which the console script waited for"
            ),
        }
    }
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The judgement.
    pub verdict: Verdict,
    /// Console, verdict line, counters and hypervisor log.
    pub transcript: Transcript,
    /// QEMU's exit status.
    pub qemu_status: ExitStatus,
    /// What QEMU wrote to stderr.
    pub qemu_stderr: String,
    /// The QEMU command line.
    pub command_line: String,
    /// Wall time of the QEMU run.
    pub elapsed: Duration,
}

impl RunReport {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Pass
    }

    /// The whole console output.
    pub fn console(&self) -> &str {
        &self.transcript.text
    }

    /// The `STAT` counters.
    pub fn counters(&self) -> &Counters {
        &self.transcript.counters
    }

    /// Everything a failed test needs to show: the verdict, the QEMU
    /// command line, the whole console and QEMU's stderr.
    pub fn explain(&self) -> String {
        format!(
            "verdict: {}\ncommand: {}\n--- console ---\n{}--- QEMU stderr ---\n{}",
            self.verdict,
            self.command_line,
            self.console(),
            self.qemu_stderr
        )
    }

    /// The hypervisor's log lines (`[hv] ...`).
    pub fn hypervisor_log(&self) -> &[String] {
        &self.transcript.hypervisor_log
    }

    /// Time from QEMU's start to the first console line starting with
    /// `prefix` (e.g. [`initramfs::INIT_MARKER`]).
    pub fn time_to(&self, prefix: &str) -> Option<Duration> {
        self.transcript.arrival_of(prefix)
    }
}

/// How QEMU's end reads: whether it exited 0 by itself, or what happened.
fn clean_exit(ending: &Ending, exited_zero: bool, status: &str) -> Result<(), String> {
    match ending {
        Ending::Exited if exited_zero => Ok(()),
        Ending::Exited => Err(format!("QEMU exited with {status}")),
        Ending::StoppedAfterGrace => Err(format!(
            "QEMU was still running after the last expected line and was stopped ({status})"
        )),
        Ending::TimedOut => Err(format!("QEMU was killed at the time limit ({status})")),
        Ending::Stalled(_) => Err(format!("QEMU was killed as hung ({status})")),
    }
}

/// The verdict of a run started by `firmware`: U-Boot's failure to run its
/// boot command comes first (nothing after it is the runner's boot), then
/// [`judge`].
fn judge_run(
    transcript: &Transcript,
    ending: &Ending,
    status: &ExitStatus,
    timeout: Duration,
    expectation: Expectation,
    firmware: Firmware,
) -> Verdict {
    judge_firmware(transcript, ending, firmware)
        .unwrap_or_else(|| judge(transcript, ending, status, timeout, expectation))
}

/// The verdict of a run of several VMs: U-Boot's failure, a hypervisor
/// panic, a payload the hypervisor refused, then each VM against its
/// expectation and QEMU's end ([`vm_verdict::judge_vms`]).
fn judge_several(
    transcript: &Transcript,
    ending: &Ending,
    status: &ExitStatus,
    firmware: Firmware,
    vms: &[(&str, VmExpect)],
) -> Verdict {
    if let Some(verdict) = judge_firmware(transcript, ending, firmware) {
        return verdict;
    }
    if let Some(message) = &transcript.panic {
        return Verdict::HypervisorPanic(message.clone());
    }
    if let Some(why) = &transcript.guest_not_started {
        return Verdict::GuestNotStarted(why.clone());
    }
    let exit = clean_exit(ending, status.success(), &status.to_string());
    match vm_verdict::judge_vms(transcript, ending, exit, vms) {
        Ok(()) => Verdict::Pass,
        Err(VmsVerdict::VmsFailed(failed)) => Verdict::VmsFailed(failed),
        Err(VmsVerdict::NoCleanExit(how)) => Verdict::NoCleanExit(how),
    }
}

/// With U-Boot: a failure when it reported that the boot command failed, or
/// started (printed its banner) but never printed the command's first line
/// (it did not load the runner's environment, or stopped before it got to
/// its boot command). A U-Boot that never started is left to [`judge`]
/// (QEMU itself failed, or timed out).
fn judge_firmware(transcript: &Transcript, ending: &Ending, firmware: Firmware) -> Option<Verdict> {
    if firmware == Firmware::None {
        return None;
    }
    if let Some(why) = &transcript.firmware_failure {
        return Some(Verdict::FirmwareFailed(why.clone()));
    }
    let banner = transcript
        .text
        .lines()
        .any(|line| line.starts_with(uboot::BANNER_PREFIX));
    if transcript.firmware_boot_started() || !banner {
        return None;
    }
    let end = match ending {
        Ending::Exited => "exited",
        Ending::StoppedAfterGrace => "was stopped",
        Ending::TimedOut => "was killed at the time limit",
        Ending::Stalled(_) => "was killed as hung",
    };
    Some(Verdict::FirmwareFailed(format!(
        "U-Boot never ran the runner's boot command (no `{}` line before QEMU {end}); did it \
         load its environment from flash?",
        uboot::START_MARKER
    )))
}

/// The verdict: a hypervisor panic, then a guest the hypervisor could not
/// start or had to stop, then a guest kernel failure report, then the
/// guest's result, then how QEMU ended.
fn judge(
    transcript: &Transcript,
    ending: &Ending,
    status: &ExitStatus,
    timeout: Duration,
    expectation: Expectation,
) -> Verdict {
    if let Some(message) = &transcript.panic {
        return Verdict::HypervisorPanic(message.clone());
    }
    if let Some(why) = &transcript.guest_not_started {
        return Verdict::GuestNotStarted(why.clone());
    }
    let exit = clean_exit(ending, status.success(), &status.to_string());
    match (transcript.vm_stops.first(), expectation) {
        (Some(_), Expectation::StoppedThenExit) => {
            return exit.map_or_else(Verdict::NoCleanExit, |()| Verdict::Pass);
        }
        (Some(line), _) => return Verdict::VmStopped(line.clone()),
        (None, Expectation::StoppedThenExit) => return Verdict::VmNotStopped,
        (None, _) => {}
    }
    if let Some(line) = &transcript.kernel_fault {
        return Verdict::KernelFault(line.clone());
    }
    match (&transcript.result, expectation) {
        (Some(GuestResult::Pass), _) => exit.map_or_else(Verdict::NoCleanExit, |()| Verdict::Pass),
        (Some(GuestResult::Fail(why)), _) => Verdict::GuestFailed(why.clone()),
        (Some(GuestResult::Malformed(line)), _) => Verdict::MalformedResult(line.clone()),
        (None, _) if *ending == Ending::TimedOut => Verdict::TimedOut(timeout),
        (None, _) if let Ending::Stalled(progress) = ending => Verdict::Stalled(*progress),
        (None, Expectation::CleanExit) => {
            exit.map_or_else(Verdict::NoCleanExit, |()| Verdict::Pass)
        }
        (None, Expectation::ResultThenExit) => Verdict::NoResult,
        (None, Expectation::StoppedThenExit) => Verdict::VmNotStopped,
    }
}

/// The test guest's kernel command line for `scenario`; a guest booted
/// directly is told that only PSCI answers hypercalls.
pub fn guest_cmdline(scenario: Scenario, boot: Boot) -> String {
    match boot {
        Boot::Hypervisor => format!("test={}", scenario.name()),
        Boot::Direct => format!("test={} hypercalls=psci", scenario.name()),
    }
}

/// The files a run boots, built and converted.
#[derive(Clone, Debug)]
pub struct BootFiles {
    /// Symbols for gdb: the hypervisor (when booted) then the guest, each with
    /// the offset between where it runs and where it is linked.
    pub symbols: Vec<qemu::Symbols>,
    /// The hypervisor ELF (symbols for gdb); `None` for a direct boot.
    pub hypervisor_elf: Option<PathBuf>,
    /// The test guest ELF.
    pub guest_elf: PathBuf,
    /// The hypervisor Image; `None` for a direct boot.
    pub hypervisor_image: Option<Vec<u8>>,
    /// The guest Image.
    pub guest_image: Vec<u8>,
}

/// Converts `elf` into an Image; also returns the symbols' offset when the
/// Image is loaded where QEMU `virt` (and the hypervisor, for a guest) puts it.
fn elf_image(elf: &Path) -> Result<(Vec<u8>, qemu::Symbols), RunnerError> {
    let bytes = std::fs::read(elf).map_err(|error| RunnerError::Io {
        what: format!("reading {}", elf.display()),
        error,
    })?;
    let image_error = |error| RunnerError::Image {
        elf: elf.to_path_buf(),
        error,
    };
    let image = image::elf_to_image(&bytes).map_err(image_error)?;
    let header = image::built_image_header(&image).map_err(image_error)?;
    let link_base = image::elf_link_base(&bytes).map_err(image_error)?;
    let offset = qemu::virt_load_address(header.text_offset).wrapping_sub(link_base);
    Ok((
        image,
        qemu::Symbols {
            elf: elf.to_path_buf(),
            offset,
        },
    ))
}

/// Builds what `boot` needs and converts it to Images (`quiet`: no cargo
/// progress lines).
pub fn build_boot_files(boot: Boot, quiet: bool) -> Result<BootFiles, RunnerError> {
    prereq::ensure_rust_target()?;
    let packages: &[&str] = match boot {
        Boot::Hypervisor => &[HYPERVISOR, TEST_GUEST],
        Boot::Direct => &[TEST_GUEST],
    };
    let built = artifacts::build(packages, quiet)?;
    let guest_elf = built[TEST_GUEST].clone();
    let (guest_image, guest_symbols) = elf_image(&guest_elf)?;
    let mut symbols = Vec::new();
    let (hypervisor_elf, hypervisor_image) = match built.get(HYPERVISOR) {
        Some(elf) => {
            let (image, hypervisor_symbols) = elf_image(elf)?;
            symbols.push(hypervisor_symbols);
            (Some(elf.clone()), Some(image))
        }
        None => (None, None),
    };
    symbols.push(guest_symbols);
    Ok(BootFiles {
        symbols,
        hypervisor_elf,
        guest_elf,
        hypervisor_image,
        guest_image,
    })
}

/// A directory for one run's boot files, removed when dropped; creating it
/// sweeps the directories of runs that were killed ([`scratch`]).
struct RunDir(scratch::ScratchDir);

impl RunDir {
    fn create() -> Result<RunDir, RunnerError> {
        let parent = artifacts::cross_target_dir().join("qemu-runner");
        scratch::ScratchDir::create(&parent, "run")
            .map(RunDir)
            .map_err(|error| RunnerError::Io {
                what: format!("creating a run directory in {}", parent.display()),
                error,
            })
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, RunnerError> {
        let path = self.0.path().join(name);
        std::fs::write(&path, bytes).map_err(|error| RunnerError::Io {
            what: format!("writing {}", path.display()),
            error,
        })?;
        Ok(path)
    }
}

/// The hypervisor, built and converted: its ELF, Image and gdb symbols.
fn build_hypervisor(quiet: bool) -> Result<(Vec<u8>, qemu::Symbols), RunnerError> {
    prereq::ensure_rust_target()?;
    let built = artifacts::build(&[HYPERVISOR], quiet)?;
    elf_image(&built[HYPERVISOR])
}

/// What the run boots as its guest, and the gdb symbols of everything booted.
struct Guest {
    /// The guest kernel, an arm64 Image.
    kernel: Vec<u8>,
    /// Its initrd.
    initrd: Option<Vec<u8>>,
    /// Its command line.
    cmdline: String,
    /// The hypervisor Image (hypervisor boot only).
    hypervisor_image: Option<Vec<u8>>,
    /// gdb symbols.
    symbols: Vec<qemu::Symbols>,
    /// The files of each `--vm` (empty without them; then `kernel`,
    /// `initrd` and `cmdline` are the one VM's).
    vm_files: Vec<VmFiles>,
}

/// One VM's files for the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmFiles {
    /// Its kernel, an arm64 Image.
    pub kernel: Vec<u8>,
    /// Its initrd.
    pub initrd: Option<Vec<u8>>,
    /// Its command line.
    pub cmdline: String,
}

/// The boot payload of the `--vm`s `vms` with their `files` (in the same
/// order), in the several-VM layout: each VM's name, its CPUs (and as many
/// vCPUs), its RAM and whether it may use the control interface. A VM
/// without `mem=` gets its guest's default RAM written out.
pub fn vms_payload(vms: &[VmSpec], files: Vec<VmFiles>) -> Result<Vec<u8>, RunnerError> {
    if vms.len() != files.len() {
        return Err(RunnerError::Config(format!(
            "{} VMs but files for {}",
            vms.len(),
            files.len()
        )));
    }
    let disks = vm_disks(vms);
    let placed = passed_devices(vms)?;
    let mut named = Vec::new();
    for (index, (vm, files)) in vms.iter().zip(files).enumerate() {
        let net = vm
            .net
            .as_deref()
            .map(VmName::new)
            .transpose()
            .map_err(|error| RunnerError::Config(format!("VM `{}`: net=: {error}", vm.name)))?;
        let mut devices = DeviceList::default();
        let passed = placed
            .iter()
            .filter(|placement| placement.vm == index)
            .map(|placement| placement.node.as_str());
        let paths = vm.devices.iter().map(DevicePath::as_str).chain(passed);
        for path in paths {
            let path = DevicePath::new(path).map_err(|why| {
                RunnerError::Config(format!("VM `{}`: device {path}: {why}", vm.name))
            })?;
            // Every `pass-pcie=` is the one bridge node.
            if path.as_str() == qemu::PCIE_HOST_BRIDGE_NODE && devices.iter().any(|k| *k == path) {
                continue;
            }
            if !devices.push(path) {
                return Err(RunnerError::Config(format!(
                    "VM `{}`: more than {} devices",
                    vm.name,
                    boot_payload::vmconf::MAX_DEVICES
                )));
            }
        }
        let disk = vm.disk.as_ref().map(|disk| DiskConf {
            host: disks
                .iter()
                .position(|known| known.path == disk.path)
                .unwrap_or_default() as u32,
            read_only: disk.read_only,
            ..DiskConf::default()
        });
        named.push(NamedPayload {
            name: vm.name.clone(),
            payload: Payload {
                kernel: files.kernel,
                initrd: files.initrd,
                cmdline: Some(files.cmdline),
                conf: VmConf {
                    vcpus: vm.cpus.map(|cpus| cpus.len()),
                    mem_mib: Some(u64::from(vm.mem_mib_or_default())),
                    cpus: vm.cpus,
                    control: vm.control.then_some(true),
                    start: (!vm.start).then_some(false),
                    net,
                    mac: vm.mac,
                    disk,
                    console: vm.console,
                    devices,
                    ram: vm.ram_placement(),
                    mte: vm.mte.then_some(true),
                },
            },
        });
    }
    boot_payload::write_several(&named)
        .map_err(|error| RunnerError::Config(format!("the boot payload: {error}")))
}

/// The host disks of the `--vm`s' `disk=` items, in the order of the
/// `--vm`s: an image file several VMs name is one disk (QEMU locks an image
/// it opens, and a live migration's source and destination serve the same
/// disk), read-only only when every VM naming it asks so.
pub fn vm_disks(vms: &[VmSpec]) -> Vec<qemu::HostDisk> {
    let mut disks: Vec<qemu::HostDisk> = Vec::new();
    for disk in vms.iter().filter_map(|vm| vm.disk.as_ref()) {
        match disks.iter_mut().find(|known| known.path == disk.path) {
            Some(known) => known.read_only &= disk.read_only,
            None => disks.push(disk.clone()),
        }
    }
    disks
}

/// Where one `--vm`'s passed device (`pass-disk=`, `pass-net=`,
/// `pass-pcie=`) lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassedPlacement {
    /// The VM that owns it (its place among the `--vm`s).
    pub vm: usize,
    /// The device.
    pub device: PassedDevice,
    /// The device-tree node the VM owns for it (`device=` in its
    /// `vm.conf`): the virtio-mmio transport QEMU plugs it into, or the
    /// PCIe host bridge ([`qemu::PCIE_HOST_BRIDGE_NODE`]) for a PCI device.
    pub node: String,
}

/// The `--vm`s' passed devices in QEMU command-line order (the order of
/// the `--vm`s, then of their items), each with the node it lands on: QEMU
/// fills the virtio-mmio transports from the highest down, the host disks
/// ([`vm_disks`]) first, so the `k`-th passed virtio-mmio device is the
/// `(disks + k)`-th virtio device ([`qemu::virtio_mmio_node`]); a PCI
/// device (`pass-pcie=`) takes no transport and lands on the PCIe host
/// bridge. Fails when there are more virtio-mmio devices than transports.
pub fn passed_devices(vms: &[VmSpec]) -> Result<Vec<PassedPlacement>, RunnerError> {
    let first = vm_disks(vms).len();
    let mut placed = Vec::new();
    let mut on_mmio = 0;
    for (vm, spec) in vms.iter().enumerate() {
        for device in &spec.passed {
            if !device.on_virtio_mmio() {
                placed.push(PassedPlacement {
                    vm,
                    device: device.clone(),
                    node: qemu::PCIE_HOST_BRIDGE_NODE.to_string(),
                });
                continue;
            }
            let position = first + on_mmio;
            on_mmio += 1;
            let node = qemu::virtio_mmio_node(position).ok_or_else(|| {
                RunnerError::Config(format!(
                    "--vm: VM `{}`'s {} would be virtio device {} of QEMU's command line; \
                     `virt` has {} virtio-mmio transports",
                    spec.name,
                    device.item(),
                    position + 1,
                    qemu::VIRTIO_MMIO_TRANSPORTS
                ))
            })?;
            placed.push(PassedPlacement {
                vm,
                device: device.clone(),
                node,
            });
        }
    }
    Ok(placed)
}

/// Builds the hypervisor and what each `--vm` boots.
fn prepare_vms(config: &RunConfig) -> Result<Guest, RunnerError> {
    let quiet = !config.echo;
    let wants_test_guest = config
        .vms
        .iter()
        .any(|vm| matches!(vm.guest, VmGuest::Test { .. }));
    let (hypervisor_image, test_guest, symbols) = if wants_test_guest {
        let files = build_boot_files(Boot::Hypervisor, quiet)?;
        (
            files.hypervisor_image,
            Some(files.guest_image),
            files.symbols,
        )
    } else {
        let (image, symbols) = build_hypervisor(quiet)?;
        (Some(image), None, vec![symbols])
    };
    let mut vm_files = Vec::new();
    for vm in &config.vms {
        vm_files.push(match (&vm.guest, &test_guest) {
            (VmGuest::Test { .. }, Some(image)) => VmFiles {
                kernel: image.clone(),
                initrd: None,
                cmdline: vm.test_cmdline().unwrap_or_default(),
            },
            (VmGuest::Test { .. }, None) => {
                return Err(RunnerError::Config(format!(
                    "VM `{}`: the test guest was not built",
                    vm.name
                )));
            }
            (VmGuest::Linux(linux), _) => {
                let cpus = vm.cpus.map_or(config.smp, |cpus| cpus.len());
                let files = linux::resolve(linux, cpus).map_err(RunnerError::Linux)?;
                VmFiles {
                    kernel: files.kernel,
                    initrd: files.initrd,
                    cmdline: files.cmdline,
                }
            }
        });
    }
    Ok(Guest {
        kernel: Vec::new(),
        initrd: None,
        cmdline: String::new(),
        hypervisor_image,
        symbols,
        vm_files,
    })
}

fn prepare_guest(config: &RunConfig) -> Result<Guest, RunnerError> {
    let quiet = !config.echo;
    if !config.vms.is_empty() {
        return prepare_vms(config);
    }
    let Some(linux) = &config.linux else {
        let files = build_boot_files(config.boot, quiet)?;
        return Ok(Guest {
            kernel: files.guest_image,
            initrd: None,
            cmdline: match config.guest_args.trim() {
                "" => guest_cmdline(config.scenario, config.boot),
                args => format!("{} {args}", guest_cmdline(config.scenario, config.boot)),
            },
            hypervisor_image: files.hypervisor_image,
            symbols: files.symbols,
            vm_files: Vec::new(),
        });
    };
    let (hypervisor_image, symbols) = match config.boot {
        Boot::Hypervisor => {
            let (image, symbols) = build_hypervisor(quiet)?;
            (Some(image), vec![symbols])
        }
        Boot::Direct => (None, Vec::new()),
    };
    let files = linux::resolve(linux, config.guest_cpus()).map_err(RunnerError::Linux)?;
    Ok(Guest {
        kernel: files.kernel,
        initrd: files.initrd,
        cmdline: files.cmdline,
        hypervisor_image,
        symbols,
        vm_files: Vec::new(),
    })
}

/// File name of the hypervisor's raw `Image`.
pub const HYPERVISOR_IMAGE_FILE: &str = "hypervisor.img";
/// File name of the boot payload.
pub const PAYLOAD_FILE: &str = "payload.cpio";

/// The boot payload of `guest` with `config`'s VM settings: the one-VM
/// layout of before without `--vm`, else [`vms_payload`].
fn payload(config: &RunConfig, guest: Guest) -> Result<Vec<u8>, RunnerError> {
    if !config.vms.is_empty() {
        return vms_payload(&config.vms, guest.vm_files);
    }
    Ok(Payload {
        kernel: guest.kernel,
        initrd: guest.initrd,
        cmdline: Some(guest.cmdline),
        conf: VmConf {
            vcpus: config.vcpus,
            mem_mib: config.guest_mem_mib.map(u64::from),
            disk: config.disks.first().map(|disk| DiskConf {
                read_only: disk.read_only,
                ..DiskConf::default()
            }),
            mte: config.mte.then_some(true),
            ..VmConf::default()
        },
    }
    .to_cpio())
}

/// Builds what a hypervisor run of `config` boots and writes it into `dir`
/// instead of starting QEMU: the hypervisor's raw `Image`
/// ([`HYPERVISOR_IMAGE_FILE`]) and the boot payload ([`PAYLOAD_FILE`]), the
/// two files a board's U-Boot loads. Returns their paths.
pub fn emit_boot_files(config: &RunConfig, dir: &Path) -> Result<[PathBuf; 2], RunnerError> {
    config.validate()?;
    if config.boot != Boot::Hypervisor {
        return Err(RunnerError::Config(
            "--emit writes the hypervisor's boot files; a direct boot has none".into(),
        ));
    }
    let guest = prepare_guest(config)?;
    let hypervisor_image = guest
        .hypervisor_image
        .clone()
        .expect("a hypervisor boot builds the hypervisor");
    let io = |path: &Path| {
        let what = format!("writing {}", path.display());
        move |error| RunnerError::Io { what, error }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let image = dir.join(HYPERVISOR_IMAGE_FILE);
    std::fs::write(&image, hypervisor_image).map_err(io(&image))?;
    let cpio = dir.join(PAYLOAD_FILE);
    std::fs::write(&cpio, payload(config, guest)?).map_err(io(&cpio))?;
    Ok([image, cpio])
}

/// Builds everything, boots it under QEMU, and judges the console.
pub fn run(config: &RunConfig) -> Result<RunReport, RunnerError> {
    config.validate()?;
    let qemu_program = prereq::ensure_qemu()?;
    let uboot_bin = match config.firmware {
        Firmware::UBoot => Some(prereq::ensure_uboot()?),
        Firmware::None => None,
    };
    let mut guest = prepare_guest(config)?;
    let dir = RunDir::create()?;
    let firmware = match uboot_bin {
        Some(bios) => {
            let environment = dir.0.path().join("uboot-env.img");
            uboot::write_flash_image(&environment).map_err(|error| RunnerError::Io {
                what: format!("writing {}", environment.display()),
                error,
            })?;
            if let Some(image) = &guest.hypervisor_image {
                let header =
                    image::built_image_header(image).map_err(|error| RunnerError::Image {
                        elf: PathBuf::from(HYPERVISOR),
                        error,
                    })?;
                if !header.anywhere {
                    return Err(RunnerError::Config(
                        "the hypervisor Image header does not say it may be placed anywhere \
                         (flags bit 3): booti would move it to the base of RAM, over the device \
                         tree"
                            .into(),
                    ));
                }
                let start = uboot::load_address(header.text_offset);
                if start + header.image_size > uboot::RAMDISK_ADDR {
                    return Err(RunnerError::Config(format!(
                        "the hypervisor Image occupies {:#x}..{:#x} when U-Boot runs it, past \
                         the payload's load address {:#x}",
                        start,
                        start + header.image_size,
                        uboot::RAMDISK_ADDR
                    )));
                }
                // booti runs the hypervisor at the load address, not where
                // QEMU would put it.
                if let Some(symbols) = guest.symbols.first_mut() {
                    symbols.offset = symbols
                        .offset
                        .wrapping_add(start)
                        .wrapping_sub(qemu::virt_load_address(header.text_offset));
                }
            }
            Some(uboot::UBootFiles { bios, environment })
        }
        None => None,
    };
    let symbols = std::mem::take(&mut guest.symbols);
    let hypervisor_image = guest.hypervisor_image.take();
    let (machine, kernel, initrd, append) = match (config.boot, &hypervisor_image) {
        (Boot::Hypervisor, Some(hypervisor_image)) => {
            let kernel = dir.write(HYPERVISOR_IMAGE_FILE, hypervisor_image)?;
            let initrd = dir.write(PAYLOAD_FILE, &payload(config, guest)?)?;
            (Machine::WithEl2, kernel, Some(initrd), None)
        }
        _ => {
            let initrd = match &guest.initrd {
                Some(initrd) => Some(dir.write("initrd.img", initrd)?),
                None => None,
            };
            (
                Machine::El1Only,
                dir.write("guest.img", &guest.kernel)?,
                initrd,
                Some(guest.cmdline),
            )
        }
    };
    let setup = QemuSetup {
        program: qemu_program,
        machine,
        gic: config.gic,
        mte: config.mte,
        cpu: config.cpu.clone(),
        smp: config.smp,
        mem_mib: config.mem_mib,
        firmware,
        kernel,
        initrd,
        append,
        gdb: config.gdb,
        disks: config.host_disks(),
        passed: config.passed()?,
        net: config.net,
        extra_args: config.extra_qemu_args.clone(),
    };
    if let Some(qemu::QemuNet::Connect(port)) = config.net {
        qemu::wait_for_listener(port, NET_LISTENER_WAIT).map_err(RunnerError::Config)?;
    }
    if config.gdb {
        eprintln!(
            "qemu-runner: QEMU waits for gdb on localhost:{} before the first instruction; \
             attach from another terminal with:\n    {}\n(then `continue`; `break <symbol>` \
             and `hbreak` work before it)",
            qemu::GDB_PORT,
            qemu::gdb_command(&symbols)
        );
    }
    let interactive = config.is_interactive();
    let watch = Watch {
        timeout: config.time_limit(),
        progress: config.progress.filter(|_| !config.gdb && !interactive),
        echo: config.echo,
        stdin: if config.reads_terminal() {
            QemuStdin::Terminal
        } else if config.gdb {
            QemuStdin::Inherited
        } else {
            QemuStdin::Closed
        },
        follow_to_exit: interactive,
    };
    let expectation = match config.vms.as_slice() {
        [only] if only.expect == VmExpect::Stopped => Expectation::StoppedThenExit,
        _ if config.guest_is_free_running() => Expectation::CleanExit,
        _ => Expectation::ResultThenExit,
    };
    let several = config.vms.len() > 1;
    let names: Vec<&str> = config.vms.iter().map(|vm| vm.name.as_str()).collect();
    let expects: Vec<VmExpect> = config.vms.iter().map(|vm| vm.expect).collect();
    let settles = |transcript: &Transcript| vm_verdict::settles(transcript, &names, &expects);
    let settled = |transcript: &Transcript| vm_verdict::settled(transcript, &names, &expects);
    let follow = qemu::Follow {
        script: config.script(),
        several_vms: several,
        finished: if several { Some(&settles) } else { None },
        settled: if several { Some(&settled) } else { None },
    };
    let command_line = setup.command_line();
    let outcome = qemu::run_with(&setup, watch, follow).map_err(|error| RunnerError::Io {
        what: format!("running {command_line}"),
        error,
    })?;
    let verdict = if several {
        let vms: Vec<(&str, VmExpect)> = names.iter().copied().zip(expects).collect();
        judge_several(
            &outcome.transcript,
            &outcome.ending,
            &outcome.status,
            config.firmware,
            &vms,
        )
    } else {
        judge_run(
            &outcome.transcript,
            &outcome.ending,
            &outcome.status,
            watch.timeout.unwrap_or_default(),
            expectation,
            config.firmware,
        )
    };
    let verdict = match (verdict, &outcome.script_waiting_at) {
        (Verdict::Pass, Some(step)) => Verdict::ScriptUnfinished(step.wait_for.clone()),
        (verdict, _) => verdict,
    };
    Ok(RunReport {
        verdict,
        transcript: outcome.transcript,
        qemu_status: outcome.status,
        qemu_stderr: outcome.stderr,
        command_line,
        elapsed: outcome.elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(lines: &[&str]) -> Transcript {
        let mut transcript = Transcript::default();
        for line in lines {
            transcript.push_line(line);
        }
        transcript
    }

    use std::os::unix::process::ExitStatusExt;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn vm(spec: &str, index: usize) -> VmSpec {
        VmSpec::parse(spec, index).unwrap()
    }

    #[test]
    fn a_lone_vm_expected_to_be_stopped_passes_only_when_it_was() {
        let limit = Duration::from_secs(9);
        let expect = Expectation::StoppedThenExit;
        let stopped = transcript(&[
            "[hv] ERROR: vm0 vcpu0: stopping the VM: unhandled abort",
            "[hv] system off",
        ]);
        assert_eq!(
            judge(&stopped, &Ending::Exited, &exited(0), limit, expect),
            Verdict::Pass
        );
        assert!(matches!(
            judge(&stopped, &Ending::Exited, &exited(1), limit, expect),
            Verdict::NoCleanExit(_)
        ));
        let ran = transcript(&["RESULT: PASS", "[hv] system off"]);
        assert_eq!(
            judge(&ran, &Ending::Exited, &exited(0), limit, expect),
            Verdict::VmNotStopped
        );
        let panic = transcript(&["[hv] PANIC: boom"]);
        assert_eq!(
            judge(&panic, &Ending::Exited, &exited(0), limit, expect),
            Verdict::HypervisorPanic("boom".into())
        );
    }

    #[test]
    fn several_vms_are_judged_each_by_name_after_the_hypervisor() {
        let vms = [("a", VmExpect::Pass), ("b", VmExpect::Stopped)];
        let judge = |lines: &[&str]| {
            judge_several(
                &transcript(lines),
                &Ending::Exited,
                &exited(0),
                Firmware::None,
                &vms,
            )
        };
        assert_eq!(
            judge(&[
                "[hv] ERROR: vm1 vcpu0: stopping the VM: bad access",
                "[a] RESULT: PASS",
                "[hv] system off"
            ]),
            Verdict::Pass
        );
        assert_eq!(
            judge(&["[a] RESULT: PASS", "[hv] PANIC: boom"]),
            Verdict::HypervisorPanic("boom".into())
        );
        assert_eq!(
            judge(&["[hv] ERROR: cannot start a guest: no memory"]),
            Verdict::GuestNotStarted("no memory".into())
        );
        let failed = judge(&["[a] RESULT: FAIL lost a write", "[hv] system off"]);
        assert_eq!(
            failed.to_string(),
            "FAIL: VM `a`: it reported: lost a write; VM `b`: expected to be stopped by the \
             hypervisor, it was not"
        );
    }

    #[test]
    fn vms_payload_holds_each_vm_with_its_settings() {
        let vms = [
            vm("memory,cpus=0-1", 0),
            vm("linux,cpus=2,3,name=web,control=1,mem=256", 1),
        ];
        let files = |kernel: u8, cmdline: &str| VmFiles {
            kernel: vec![kernel],
            initrd: (kernel == 2).then(|| vec![9; 3]),
            cmdline: cmdline.into(),
        };
        let archive = vms_payload(
            &vms,
            vec![files(1, "test=memory"), files(2, "console=ttyAMA0")],
        )
        .unwrap();
        let read = boot_payload::VmsRef::parse(&archive).unwrap();
        let [memory, web] = read.as_slice() else {
            panic!("two VMs")
        };
        assert_eq!(
            (
                memory.name.as_str(),
                memory.payload.kernel,
                memory.payload.cmdline
            ),
            ("vm0", &[1u8][..], Some("test=memory"))
        );
        assert_eq!(
            memory.payload.conf,
            VmConf {
                vcpus: Some(2),
                mem_mib: Some(128),
                cpus: vms[0].cpus,
                control: None,
                start: None,
                ..VmConf::default()
            }
        );
        assert_eq!(web.name.as_str(), "web");
        assert_eq!(web.payload.initrd, Some(&[9u8; 3][..]));
        assert_eq!(web.payload.conf.mem_mib, Some(256));
        assert_eq!(web.payload.conf.control, Some(true));
        assert_eq!(read.check_cpus(4), Ok(()));
        assert!(vms_payload(&vms, vec![files(1, "x")]).is_err());
    }

    #[test]
    fn vms_with_devices_get_them_in_vm_conf_and_disks_are_numbered_in_order() {
        let vms = [
            vm(
                "linux,cpus=0,name=a,net=lan,disk=/d/a.img,console=virtio",
                0,
            ),
            vm("memory,cpus=1,name=b", 1),
            vm(
                "linux,cpus=2,name=c,net=lan,mac=52:54:00:00:00:07,disk=/d/c.img:ro",
                2,
            ),
        ];
        let files = |cmdline: &str| VmFiles {
            kernel: vec![1],
            initrd: None,
            cmdline: cmdline.into(),
        };
        let archive = vms_payload(&vms, vec![files("x"), files("y"), files("z")]).unwrap();
        let read = boot_payload::VmsRef::parse(&archive).unwrap();
        let [a, b, c] = read.as_slice() else {
            panic!("three VMs")
        };
        let (a, b, c) = (a.payload.conf, b.payload.conf, c.payload.conf);
        assert_eq!(a.net.map(|net| net.to_string()).as_deref(), Some("lan"));
        assert_eq!(
            a.disk,
            Some(DiskConf {
                host: 0,
                ..DiskConf::default()
            })
        );
        assert_eq!(a.console, Some(boot_payload::vmconf::ConsoleKind::Virtio));
        assert_eq!((a.mac, b.net, b.disk, b.console), (None, None, None, None));
        assert_eq!(
            c.disk,
            Some(DiskConf {
                host: 1,
                read_only: true,
                ..DiskConf::default()
            })
        );
        assert_eq!(c.mac, Some([0x52, 0x54, 0, 0, 0, 7]));
        let config = RunConfig {
            vms: vms.to_vec(),
            mem_mib: 2048,
            ..RunConfig::default()
        };
        let disks: Vec<_> = config.host_disks().into_iter().map(|d| d.path).collect();
        assert_eq!(
            disks,
            [PathBuf::from("/d/a.img"), PathBuf::from("/d/c.img")]
        );
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("disk image /d/a.img: no such file"),
            "{error}"
        );
    }

    #[test]
    fn passed_devices_land_after_the_host_disks_and_their_vms_own_the_nodes() {
        let vms = [
            vm("linux,cpus=0,name=a,disk=/d/host.img,pass-disk=/d/a.img", 0),
            vm("memory,cpus=1,name=b,device=/virtio_mmio@a000200", 1),
            vm(
                "linux,cpus=2,name=c,pass-net=8080,pass-disk=/d/c.img:ro,disk=/d/host2.img,\
                 device=/pcie@10000000",
                2,
            ),
        ];
        // QEMU's virtio devices in order: host.img, host2.img (the host
        // disks), then a.img, the network, c.img.
        let placed: Vec<(usize, String)> = passed_devices(&vms)
            .unwrap()
            .into_iter()
            .map(|placement| (placement.vm, placement.node))
            .collect();
        assert_eq!(
            placed,
            [
                (0, "/virtio_mmio@a003a00".to_string()),
                (2, "/virtio_mmio@a003800".to_string()),
                (2, "/virtio_mmio@a003600".to_string()),
            ]
        );
        let config = RunConfig {
            vms: vms.to_vec(),
            smp: 3,
            mem_mib: 2048,
            ..RunConfig::default()
        };
        let setup = QemuSetup {
            program: "qemu-system-aarch64".into(),
            machine: Machine::WithEl2,
            gic: qemu::GicVersion::V3,
            mte: false,
            cpu: DEFAULT_CPU.into(),
            smp: 3,
            mem_mib: 2048,
            firmware: None,
            kernel: "/t/hypervisor.img".into(),
            initrd: None,
            append: None,
            gdb: false,
            disks: config.host_disks(),
            passed: config.passed().unwrap(),
            net: None,
            extra_args: Vec::new(),
        };
        let args = setup.args();
        let devices: Vec<&str> = args
            .windows(2)
            .filter(|pair| pair[0] == "-device")
            .map(|pair| pair[1].as_str())
            .collect();
        assert_eq!(
            devices,
            [
                "virtio-blk-device,drive=disk0",
                "virtio-blk-device,drive=disk1",
                "virtio-blk-device,drive=pdisk0",
                "virtio-net-device,netdev=pnet0",
                "virtio-blk-device,drive=pdisk1",
            ]
        );
        let joined = args.join(" ");
        for (drive, file) in [
            ("disk0", "/d/host.img"),
            ("disk1", "/d/host2.img"),
            ("pdisk0", "/d/a.img"),
        ] {
            assert!(
                joined.contains(&format!(
                    "-drive file={file},if=none,format=raw,id={drive} "
                )),
                "{joined}"
            );
        }
        assert!(
            joined.contains("-drive file=/d/c.img,if=none,format=raw,id=pdisk1,readonly=on"),
            "{joined}"
        );
        assert!(
            joined.contains("-netdev user,id=pnet0,restrict=on,hostfwd=tcp:127.0.0.1:8080-:8080 "),
            "{joined}"
        );

        let files = |cmdline: &str| VmFiles {
            kernel: vec![1],
            initrd: None,
            cmdline: cmdline.into(),
        };
        let archive = vms_payload(&vms, vec![files("x"), files("y"), files("z")]).unwrap();
        let read = boot_payload::VmsRef::parse(&archive).unwrap();
        let confs: Vec<String> = read
            .as_slice()
            .iter()
            .map(|vm| vm.payload.conf.to_text())
            .collect();
        assert!(
            confs[0].ends_with("disk=0\ndevice=/virtio_mmio@a003a00\nram=identity\n"),
            "{}",
            confs[0]
        );
        assert!(
            confs[1].ends_with("cpus=1\ndevice=/virtio_mmio@a000200\n"),
            "{}",
            confs[1]
        );
        assert!(
            confs[2].ends_with(
                "disk=1\ndevice=/pcie@10000000\ndevice=/virtio_mmio@a003800\n\
                 device=/virtio_mmio@a003600\nram=identity\n"
            ),
            "{}",
            confs[2]
        );
        let explicit = vms_payload(
            &[vm("memory,device=/virtio_mmio@a003e00,ram=identity", 0)],
            vec![files("x")],
        )
        .unwrap();
        let read = boot_payload::VmsRef::parse(&explicit).unwrap();
        assert!(
            read.as_slice()[0]
                .payload
                .conf
                .to_text()
                .ends_with("device=/virtio_mmio@a003e00\nram=identity\n")
        );
    }

    #[test]
    fn a_vm_owns_the_pcie_bridge_for_its_pci_disks() {
        let vms = [
            vm(
                "linux,cpus=0,name=a,pass-pcie=/d/a.img,pass-disk=/d/b.img,pass-pcie=/d/c.img",
                0,
            ),
            vm("memory,cpus=1,name=b,pass-net=8080", 1),
        ];
        // The PCI disks take no transport: b.img is the first virtio-mmio
        // device, the network the second.
        let placed: Vec<(usize, String)> = passed_devices(&vms)
            .unwrap()
            .into_iter()
            .map(|placement| (placement.vm, placement.node))
            .collect();
        assert_eq!(
            placed,
            [
                (0, "/pcie@10000000".to_string()),
                (0, "/virtio_mmio@a003e00".to_string()),
                (0, "/pcie@10000000".to_string()),
                (1, "/virtio_mmio@a003c00".to_string()),
            ]
        );
        let files = |cmdline: &str| VmFiles {
            kernel: vec![1],
            initrd: None,
            cmdline: cmdline.into(),
        };
        let archive = vms_payload(&vms, vec![files("x"), files("y")]).unwrap();
        let read = boot_payload::VmsRef::parse(&archive).unwrap();
        let conf = read.as_slice()[0].payload.conf.to_text();
        assert!(
            conf.ends_with("device=/pcie@10000000\ndevice=/virtio_mmio@a003e00\nram=identity\n"),
            "{conf}"
        );
        // The bridge named too: still one line.
        let named = vms_payload(
            &[vm(
                "linux,cpus=0,name=a,device=/pcie@10000000,pass-pcie=/d/a.img",
                0,
            )],
            vec![files("x")],
        )
        .unwrap();
        let read = boot_payload::VmsRef::parse(&named).unwrap();
        let conf = read.as_slice()[0].payload.conf.to_text();
        assert_eq!(conf.matches("device=").count(), 1, "{conf}");
        assert!(
            conf.ends_with("device=/pcie@10000000\nram=identity\n"),
            "{conf}"
        );
    }

    #[test]
    fn one_vm_has_the_pcie_bridge() {
        let dir = std::env::temp_dir().join(format!("runner-pcie-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = |name: &str| {
            let path = dir.join(name);
            std::fs::write(&path, [0u8; 512]).unwrap();
            path.display().to_string()
        };
        let (a, b, c) = (image("a.img"), image("b.img"), image("c.img"));
        let check = |specs: &[String]| {
            RunConfig {
                vms: specs.iter().enumerate().map(|(i, s)| vm(s, i)).collect(),
                smp: 4,
                mem_mib: 2048,
                ..RunConfig::default()
            }
            .validate()
            .map_err(|error| error.to_string())
        };
        let owner = format!("memory,cpus=0,name=x,pass-pcie={a},pass-pcie={b}");
        check(&[owner.clone(), format!("memory,cpus=1,name=y,pass-disk={c}")]).unwrap();
        for (other, says) in [
            (
                format!("memory,cpus=1,name=y,pass-pcie={c}"),
                "VM `y`'s pass-pcie=",
            ),
            (
                "memory,cpus=1,name=y,device=/pcie@10000000".to_string(),
                "VM `y`'s device=/pcie@10000000: VM `x` has the PCIe host bridge",
            ),
            (
                format!("memory,cpus=1,name=y,pass-disk={a}"),
                "is also VM `x`'s pass-pcie=",
            ),
            (format!("memory,cpus=1,name=y,disk={b}"), "also a host disk"),
        ] {
            let error = check(&[owner.clone(), other.clone()]).unwrap_err();
            assert!(error.contains(says), "{other}: {error}");
        }
        let error =
            check(&[owner.clone(), format!("memory,cpus=1,name=y,pass-pcie={c}")]).unwrap_err();
        assert!(
            error.contains("VM `x` already has QEMU's PCIe host bridge")
                && error.contains("one device-tree node (/pcie@10000000)"),
            "{error}"
        );
        let missing = check(&["memory,name=x,pass-pcie=/no/such.img".to_string()]).unwrap_err();
        assert!(missing.contains("pass-pcie=/no/such.img"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn passed_devices_are_checked_before_anything_is_built() {
        let dir = std::env::temp_dir().join(format!("runner-passed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = |name: &str| {
            let path = dir.join(name);
            std::fs::write(&path, [0u8; 512]).unwrap();
            path.display().to_string()
        };
        let (a, b) = (image("a.img"), image("b.img"));
        let check = |specs: &[&str]| {
            RunConfig {
                vms: specs.iter().enumerate().map(|(i, s)| vm(s, i)).collect(),
                smp: 4,
                mem_mib: 2048,
                ..RunConfig::default()
            }
            .validate()
            .map_err(|error| error.to_string())
        };
        let good = format!("memory,cpus=0,name=x,pass-disk={a},pass-net=8080");
        let other = format!("memory,cpus=1,name=y,disk={b},pass-net=8081");
        check(&[&good, &other]).unwrap();
        for (specs, says) in [
            (
                vec!["memory,name=x,pass-disk=/no/such.img".to_string()],
                "VM `x`'s pass-disk=/no/such.img: disk image /no/such.img: no such file",
            ),
            (
                vec![
                    good.clone(),
                    format!("memory,cpus=1,name=y,pass-disk={a}:ro"),
                ],
                "VM `y`'s pass-disk=",
            ),
            (
                vec![good.clone(), format!("memory,cpus=1,name=y,disk={a}")],
                "also a host disk",
            ),
            (
                vec![
                    good.clone(),
                    "memory,cpus=1,name=y,pass-net=8080".to_string(),
                ],
                "VM `y`'s pass-net=8080 is also VM `x`'s pass-net=8080",
            ),
        ] {
            let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
            let error = check(&specs).unwrap_err();
            assert!(error.contains(says), "{specs:?}: {error}");
        }
        // 8 passed devices on each of 4 VMs, after one host disk: 33
        // virtio devices for 32 transports.
        let nets = |vm: u16| {
            (0..8)
                .map(|i| format!(",pass-net={}", 9000 + vm * 8 + i))
                .collect::<String>()
        };
        let full: Vec<String> = (0..4)
            .map(|i| {
                let disk = if i == 0 {
                    format!(",disk={b}")
                } else {
                    String::new()
                };
                format!("memory,cpus={i},name=v{i}{disk}{}", nets(i))
            })
            .collect();
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        let error = check(&full).unwrap_err();
        assert!(
            error.contains("pass-net=9031 would be virtio device 33") && error.contains("32"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_image_several_vms_name_is_one_host_disk() {
        let vms = [
            vm("linux,cpus=0,name=src,disk=/d/a.img", 0),
            vm("linux,cpus=1,name=other,disk=/d/b.img:ro", 1),
            vm("linux,cpus=2,name=dst,start=0,disk=/d/a.img:ro", 2),
        ];
        assert_eq!(
            vm_disks(&vms),
            [
                qemu::HostDisk {
                    path: PathBuf::from("/d/a.img"),
                    read_only: false,
                },
                qemu::HostDisk {
                    path: PathBuf::from("/d/b.img"),
                    read_only: true,
                },
            ],
            "one drive for a.img, writable since src writes it"
        );
        let files = |cmdline: &str| VmFiles {
            kernel: vec![1],
            initrd: None,
            cmdline: cmdline.into(),
        };
        let archive = vms_payload(&vms, vec![files("x"), files("y"), files("z")]).unwrap();
        let read = boot_payload::VmsRef::parse(&archive).unwrap();
        let hosts: Vec<_> = read
            .as_slice()
            .iter()
            .map(|vm| vm.payload.conf.disk.map(|d| (d.host, d.read_only)))
            .collect();
        assert_eq!(hosts, [Some((0, false)), Some((1, true)), Some((0, true))]);
    }

    #[test]
    fn memory_tagging_needs_the_max_cpu_and_reaches_the_one_vm() {
        let tagged = RunConfig {
            mte: true,
            ..RunConfig::default()
        };
        assert!(tagged.validate().is_ok());
        let a72 = RunConfig {
            cpu: "cortex-a72".into(),
            ..tagged.clone()
        };
        let error = a72.validate().unwrap_err().to_string();
        assert!(
            error.contains("--mte") && error.contains("cortex-a72"),
            "{error}"
        );
        let guest = Guest {
            kernel: vec![1],
            initrd: None,
            cmdline: "test=mte".into(),
            symbols: Vec::new(),
            hypervisor_image: None,
            vm_files: Vec::new(),
        };
        let cpio = payload(&tagged, guest).unwrap();
        let text = String::from_utf8_lossy(&cpio);
        assert!(
            text.contains("mte=on"),
            "the one VM's vm.conf asks for tagging"
        );
    }

    #[test]
    fn devices_for_one_guest_are_checked() {
        let image = std::env::temp_dir().join(format!("runner-disk-{}.img", std::process::id()));
        std::fs::write(&image, [0u8; 512]).unwrap();
        let disk = qemu::HostDisk {
            path: image.clone(),
            read_only: false,
        };
        let direct = RunConfig {
            boot: Boot::Direct,
            disks: vec![disk.clone(), disk.clone()],
            net: Some(qemu::QemuNet::User),
            ..RunConfig::default()
        };
        assert!(direct.validate().is_ok());
        let refused = |config: RunConfig, says: &str| {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        };
        refused(
            RunConfig {
                boot: Boot::Hypervisor,
                net: None,
                ..direct.clone()
            },
            "one disk",
        );
        refused(
            RunConfig {
                boot: Boot::Hypervisor,
                disks: vec![disk.clone()],
                ..direct.clone()
            },
            "--net gives a direct boot",
        );
        refused(
            RunConfig {
                boot: Boot::Hypervisor,
                net: None,
                disks: vec![disk],
                vms: vec![vm("memory", 0)],
                ..direct.clone()
            },
            "with --vm, give each",
        );
        std::fs::remove_file(&image).unwrap();
        refused(direct, "no such file");
    }

    #[test]
    fn vm_settings_are_validated_before_anything_is_built() {
        let config = |vms: Vec<VmSpec>| RunConfig {
            vms,
            ..RunConfig::default()
        };
        assert!(
            config(vec![vm("memory,cpus=0-1", 0), vm("timers,cpus=2-3", 1)])
                .validate()
                .is_ok()
        );
        assert!(config(vec![vm("memory", 0)]).validate().is_ok());
        for (vms, says) in [
            (vec![vm("memory,cpus=0", 0), vm("timers", 1)], "needs cpus="),
            (vec![vm("memory,cpus=4", 0)], "names CPU 4, but --smp 4"),
            (
                vec![vm("memory,cpus=0-2", 0), vm("timers,cpus=2", 1)],
                "both name CPU 2",
            ),
            (
                vec![vm("memory,cpus=0,name=a", 0), vm("timers,cpus=1,name=a", 1)],
                "called `a`",
            ),
            (vec![vm("memory,mem=1024", 0)], "adds up to 1024 MiB"),
        ] {
            let why = config(vms).validate().unwrap_err().to_string();
            assert!(why.contains(says), "{why}");
        }
        let mixed = RunConfig {
            vcpus: Some(1),
            ..config(vec![vm("memory", 0)])
        };
        assert!(
            mixed
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--vcpus")
        );
        let direct = RunConfig {
            boot: Boot::Direct,
            ..config(vec![vm("memory", 0)])
        };
        assert!(
            direct
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--direct")
        );
    }

    #[test]
    fn verdicts() {
        let limit = Duration::from_secs(9);
        let ok = exited(0);
        let judge_result = |t: &Transcript, ending: Ending| {
            judge(t, &ending, &ok, limit, Expectation::ResultThenExit)
        };
        let pass = transcript(&["RESULT: PASS", "[hv] system off"]);
        assert_eq!(judge_result(&pass, Ending::Exited), Verdict::Pass);
        let panic = transcript(&["RESULT: PASS", "[hv] PANIC: boom"]);
        assert_eq!(
            judge_result(&panic, Ending::Exited),
            Verdict::HypervisorPanic("boom".into())
        );
        let fail = transcript(&["RESULT: FAIL no abort"]);
        assert_eq!(
            judge_result(&fail, Ending::Exited),
            Verdict::GuestFailed("no abort".into())
        );
        let silent = transcript(&["[hv] hello"]);
        assert_eq!(
            judge_result(&silent, Ending::TimedOut),
            Verdict::TimedOut(limit)
        );
        assert_eq!(judge_result(&silent, Ending::Exited), Verdict::NoResult);
    }

    #[test]
    fn a_guest_that_never_started_or_was_stopped_fails_every_kind_of_run() {
        let limit = Duration::from_secs(9);
        let ok = exited(0);
        let not_started = transcript(&[
            "[hv] ERROR: cannot start a guest: no kernel in the payload",
            "[hv] system off",
        ]);
        let stopped = transcript(&[
            "[hv] ERROR: vm0 vcpu0: stopping the VM: unhandled exit",
            "[hv] system off",
        ]);
        for expectation in [Expectation::ResultThenExit, Expectation::CleanExit] {
            assert_eq!(
                judge(&not_started, &Ending::Exited, &ok, limit, expectation),
                Verdict::GuestNotStarted("no kernel in the payload".into())
            );
            assert_eq!(
                judge(&stopped, &Ending::Exited, &ok, limit, expectation),
                Verdict::VmStopped("vm0 vcpu0: stopping the VM: unhandled exit".into())
            );
        }
        let passed_then_stopped = transcript(&[
            "RESULT: PASS",
            "[hv] ERROR: vm0 vcpu1: stopping the VM: unhandled exit",
        ]);
        assert!(matches!(
            judge(
                &passed_then_stopped,
                &Ending::Exited,
                &ok,
                limit,
                Expectation::ResultThenExit
            ),
            Verdict::VmStopped(_)
        ));
    }

    #[test]
    fn a_u_boot_run_needs_the_boot_command_to_have_run_and_not_failed() {
        let limit = Duration::from_secs(9);
        let ok = exited(0);
        let expect = Expectation::ResultThenExit;
        let judged = |t: &Transcript, ending: Ending, firmware| {
            judge_run(t, &ending, &ok, limit, expect, firmware)
        };
        let booted = transcript(&[
            "U-Boot 2023.01",
            "[u-boot] loading the hypervisor to 0x40400000 and the payload to 0x44000000",
            "Starting kernel ...",
            "RESULT: PASS",
            "[hv] system off",
        ]);
        assert_eq!(
            judged(&booted, Ending::Exited, Firmware::UBoot),
            Verdict::Pass
        );
        let failed = transcript(&[
            "[u-boot] loading the hypervisor to 0x40400000 and the payload to 0x44000000",
            "Bad Linux ARM64 Image magic!",
            "[u-boot] ERROR: the boot command failed",
        ]);
        assert_eq!(
            judged(&failed, Ending::StoppedAfterGrace, Firmware::UBoot),
            Verdict::FirmwareFailed(
                "the boot command failed (U-Boot said before: `Bad Linux ARM64 Image magic!`)"
                    .into()
            )
        );
        // U-Boot's own distro boot would also boot the hypervisor, but not
        // with the runner's command: that is not the boot under test.
        let default_environment = transcript(&[
            "U-Boot 2023.01+dfsg-2+deb12u3 (Jun 22 2026 - 08:38:07 +0000)",
            "Starting kernel ...",
            "RESULT: PASS",
        ]);
        match judged(&default_environment, Ending::Exited, Firmware::UBoot) {
            Verdict::FirmwareFailed(why) => assert!(why.contains("never ran"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            judged(&default_environment, Ending::Exited, Firmware::None),
            Verdict::Pass
        );
        // QEMU that never started U-Boot gets the ordinary verdict.
        let nothing = transcript(&[]);
        assert_eq!(
            judged(&nothing, Ending::Exited, Firmware::UBoot),
            Verdict::NoResult
        );
    }

    #[test]
    fn a_pass_needs_a_clean_exit_after_it() {
        let limit = Duration::from_secs(9);
        let pass = transcript(&["LINUX-INIT: started", "RESULT: PASS"]);
        let expect = Expectation::ResultThenExit;
        assert_eq!(
            judge(&pass, &Ending::Exited, &exited(0), limit, expect),
            Verdict::Pass
        );
        assert!(matches!(
            judge(&pass, &Ending::Exited, &exited(1), limit, expect),
            Verdict::NoCleanExit(_)
        ));
        assert!(matches!(
            judge(&pass, &Ending::StoppedAfterGrace, &exited(0), limit, expect),
            Verdict::NoCleanExit(_)
        ));
    }

    #[test]
    fn kernel_failure_reports_fail_the_run_even_after_a_pass() {
        let limit = Duration::from_secs(9);
        let warned = transcript(&[
            "[    1.5] WARNING: CPU: 0 PID: 1 at kernel/x.c:9 f+0x1/0x2",
            "RESULT: PASS",
        ]);
        assert_eq!(
            judge(
                &warned,
                &Ending::Exited,
                &exited(0),
                limit,
                Expectation::ResultThenExit
            ),
            Verdict::KernelFault("WARNING: CPU: 0 PID: 1 at kernel/x.c:9 f+0x1/0x2".into())
        );
        let panicked = transcript(&["[    2.0] Kernel panic - not syncing: No init found"]);
        assert!(matches!(
            judge(
                &panicked,
                &Ending::StoppedAfterGrace,
                &exited(0),
                limit,
                Expectation::CleanExit
            ),
            Verdict::KernelFault(_)
        ));
    }

    #[test]
    fn an_interactive_session_passes_on_a_clean_power_off() {
        let limit = Duration::from_secs(9);
        let session = transcript(&["/ # poweroff -f", "reboot: Power down"]);
        let expect = Expectation::CleanExit;
        assert_eq!(
            judge(&session, &Ending::Exited, &exited(0), limit, expect),
            Verdict::Pass
        );
        assert!(matches!(
            judge(&session, &Ending::Exited, &exited(1), limit, expect),
            Verdict::NoCleanExit(_)
        ));
        assert_eq!(
            judge(
                &session,
                &Ending::Exited,
                &exited(0),
                limit,
                Expectation::ResultThenExit
            ),
            Verdict::NoResult
        );
    }

    #[test]
    fn linux_settings() {
        let linux = LinuxBoot::debian(linux::BusyboxInit::Test);
        let hosted = RunConfig::linux(Boot::Hypervisor, linux.clone());
        assert_eq!((hosted.smp, hosted.mem_mib), (2, 1024));
        assert_eq!(hosted.guest_mem_mib, Some(512));
        assert_eq!(hosted.guest_cpus(), 2);
        assert!(!hosted.is_interactive());
        assert!(!hosted.guest_is_free_running());
        assert_eq!(hosted.time_limit(), Some(LINUX_TIMEOUT));
        assert!(RunConfig::validate(&hosted).is_ok());
        let direct = RunConfig::linux(Boot::Direct, linux);
        assert_eq!(
            (direct.smp, direct.mem_mib, direct.guest_mem_mib),
            (2, 512, None)
        );
        assert!(RunConfig::validate(&direct).is_ok());
        let shell = RunConfig::linux(Boot::Direct, LinuxBoot::debian(linux::BusyboxInit::Shell));
        assert!(shell.guest_is_free_running());
        assert!(
            !shell.is_interactive(),
            "no terminal, no interactive session"
        );
        assert_eq!(shell.time_limit(), Some(LINUX_TIMEOUT));
        let typed = RunConfig {
            input: ConsoleInput::Terminal,
            ..shell.clone()
        };
        assert!(typed.is_interactive());
        assert_eq!(typed.time_limit(), None);
        let limited = RunConfig {
            session_timeout: Some(Duration::from_secs(7)),
            ..typed.clone()
        };
        assert_eq!(limited.time_limit(), Some(Duration::from_secs(7)));
        let debugged = RunConfig { gdb: true, ..shell };
        assert_eq!(debugged.time_limit(), None);
        let vcpus = RunConfig {
            vcpus: Some(1),
            ..RunConfig::default()
        };
        assert_eq!(vcpus.guest_cpus(), 1);
    }

    #[test]
    fn a_terminal_reaches_every_run_and_keeps_open_only_runs_without_verdicts_or_with_stay() {
        let typed = |vms: &[&str], scenario: Scenario| RunConfig {
            input: ConsoleInput::Terminal,
            scenario,
            vms: vms.iter().enumerate().map(|(i, s)| vm(s, i)).collect(),
            ..RunConfig::default()
        };
        let echoes = typed(
            &["echo,cpus=0,name=a", "echo,cpus=1,name=b"],
            Scenario::Memory,
        );
        assert!(echoes.guest_is_free_running(), "echo VMs keep running");
        assert!(echoes.reads_terminal());
        assert!(echoes.is_interactive(), "nothing to wait for: a session");
        assert_eq!(echoes.time_limit(), None);
        let lone_echo = typed(&[], Scenario::Echo);
        assert!(lone_echo.is_interactive(), "--guest echo alone");
        let migrate = typed(
            &[
                "guest=migrate,cpus=0-1,name=src,expect=stopped",
                "guest=migrate,cpus=2-3,name=dst,start=0",
            ],
            Scenario::Memory,
        );
        assert!(migrate.reads_terminal(), "typing reaches the monitor");
        assert!(!migrate.is_interactive(), "verdicts still end the run");
        assert_eq!(migrate.time_limit(), Some(migrate.timeout));
        let stay = RunConfig {
            stay: true,
            ..migrate.clone()
        };
        assert!(stay.is_interactive(), "--stay keeps it open");
        assert_eq!(stay.time_limit(), None);
        let memory = typed(&[], Scenario::Memory);
        assert!(memory.reads_terminal() && !memory.is_interactive());
        for unattended in [
            RunConfig {
                input: ConsoleInput::Closed,
                ..stay
            },
            RunConfig {
                input: ConsoleInput::Closed,
                ..echoes
            },
        ] {
            assert!(!unattended.reads_terminal());
            assert!(!unattended.is_interactive(), "no terminal: nothing changes");
            assert_eq!(unattended.time_limit(), Some(unattended.timeout));
        }
    }

    #[test]
    fn scenarios_have_cmdlines() {
        assert!(scenario_names().starts_with("memory, bad-guest, "));
        assert_eq!(
            guest_cmdline(Scenario::BadGuest, Boot::Hypervisor),
            "test=bad-guest"
        );
        assert_eq!(
            guest_cmdline(Scenario::Memory, Boot::Direct),
            "test=memory hypercalls=psci"
        );
    }

    #[test]
    fn direct_boot_rejects_vm_settings() {
        let config = RunConfig {
            boot: Boot::Direct,
            guest_mem_mib: Some(64),
            ..RunConfig::default()
        };
        assert!(matches!(
            RunConfig::validate(&config),
            Err(RunnerError::Config(_))
        ));
        assert!(RunConfig::validate(&RunConfig::default()).is_ok());
    }

    #[test]
    fn settings_out_of_range_are_refused_with_the_option_named() {
        let refused = |config: RunConfig, option: &str| match config.validate() {
            Err(RunnerError::Config(why)) => assert!(why.contains(option), "{why}"),
            other => panic!("{option}: expected a refusal, got {other:?}"),
        };
        let base = RunConfig::default;
        refused(RunConfig { smp: 0, ..base() }, "--smp");
        refused(RunConfig { smp: 33, ..base() }, "--smp");
        let v2 = |smp| RunConfig {
            smp,
            gic: qemu::GicVersion::V2,
            ..base()
        };
        refused(v2(9), "--smp");
        assert!(v2(8).validate().is_ok());
        refused(
            RunConfig {
                mem_mib: 0,
                ..base()
            },
            "--mem",
        );
        refused(
            RunConfig {
                vcpus: Some(0),
                ..base()
            },
            "--vcpus",
        );
        refused(
            RunConfig {
                vcpus: Some(5),
                ..base()
            },
            "--vcpus",
        );
        refused(
            RunConfig {
                guest_mem_mib: Some(0),
                ..base()
            },
            "--guest-mem",
        );
        refused(
            RunConfig {
                guest_mem_mib: Some(1024),
                ..base()
            },
            "--guest-mem",
        );
        refused(
            RunConfig {
                timeout: Duration::ZERO,
                ..base()
            },
            "--timeout",
        );
        let direct = |smp| RunConfig {
            boot: Boot::Direct,
            smp,
            ..base()
        };
        assert!(direct(64).validate().is_ok(), "QEMU alone takes more CPUs");
        refused(direct(513), "--smp");
        assert!(
            RunConfig {
                smp: 32,
                vcpus: Some(32),
                guest_mem_mib: Some(1023),
                ..base()
            }
            .validate()
            .is_ok()
        );
    }
}
