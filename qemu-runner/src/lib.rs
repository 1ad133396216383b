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
//! [`Boot::Direct`] boots the guest kernel by itself at EL1 (no
//! `virtualization=on`, no hypervisor), which shakes out a guest and gives the
//! baseline for hypervisor-overhead figures.
//!
//! [`Firmware::UBoot`] has U-Boot load and `booti` the hypervisor, as on a
//! board ([`uboot`]), instead of QEMU entering it; such a run also fails when
//! U-Boot did not run the runner's boot command or reported it failed.

pub mod artifacts;
pub mod console;
pub mod debian;
pub mod image;
pub mod initramfs;
pub mod linux;
pub mod prereq;
pub mod qemu;
pub mod scratch;
pub mod uboot;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use artifacts::{BuildError, HYPERVISOR, TEST_GUEST};
use boot_payload::Payload;
use boot_payload::vmconf::VmConf;
use console::{Counters, GuestResult, Transcript};
use image::ImageError;
use linux::{LinuxBoot, LinuxError};
use prereq::PrereqError;
use qemu::{Ending, Machine, QemuSetup, Watch};

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

/// The test guest's scenario (`test=` in its bootargs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// SMP memory test with demand-faulted stage-2 memory and a caught abort.
    Memory,
    /// Unmapped device access, device-window straddling loads and an unknown
    /// hypercall; the hypervisor must survive and report them.
    BadGuest,
    /// Aborts and undefined instructions from AArch64 and AArch32 EL0; the
    /// hypervisor must inject the aborts as the architecture takes them.
    Aarch32El0,
    /// Both EL1 timers (physical and virtual) interrupt every vCPU through
    /// the GIC; `CNTPCT_EL0` and `CNTVCT_EL0` agree and are monotonic.
    Timers,
    /// Several vCPUs race PSCI `CPU_ON` for the same target, round after
    /// round: exactly one `SUCCESS`, `ALREADY_ON` for the others.
    CpuOnRace,
    /// 200 000 distinct unknown hypercalls, 20 000 injected aborts and 5 000
    /// refused device accesses: the hypervisor's log stays short.
    Flood,
    /// Interrupt delivery while more SPIs are active (made so through the
    /// distributor) than the CPU interface has list registers.
    VgicScarce,
    /// The hostile-guest fuzzer (seed and counts in [`RunConfig::guest_args`]).
    Fuzz,
}

impl Scenario {
    /// Every scenario, for help texts.
    pub const ALL: &[Scenario] = &[
        Scenario::Memory,
        Scenario::BadGuest,
        Scenario::Aarch32El0,
        Scenario::Timers,
        Scenario::CpuOnRace,
        Scenario::Flood,
        Scenario::VgicScarce,
        Scenario::Fuzz,
    ];

    /// The scenario's name on the command line and in `test=`.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Memory => "memory",
            Scenario::BadGuest => "bad-guest",
            Scenario::Aarch32El0 => "aarch32-el0",
            Scenario::Timers => "timers",
            Scenario::CpuOnRace => "cpu-on-race",
            Scenario::Flood => "flood",
            Scenario::VgicScarce => "vgic-scarce",
            Scenario::Fuzz => "fuzz",
        }
    }

    /// The scenario called `name`.
    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.iter().copied().find(|s| s.name() == name)
    }

    /// Every scenario's name, comma-separated (for help and error texts).
    pub fn names() -> String {
        Scenario::ALL
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
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
    /// Start QEMU halted, waiting for gdb.
    pub gdb: bool,
    /// Extra QEMU arguments, appended last.
    pub extra_qemu_args: Vec<String>,
    /// Copy the console to stdout while it runs.
    pub echo: bool,
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
            timeout: Duration::from_secs(120),
            progress: None,
            session_timeout: None,
            input: ConsoleInput::Closed,
            gdb: false,
            extra_qemu_args: Vec::new(),
            echo: true,
        }
    }
}

/// Where the guest's console input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsoleInput {
    /// Nothing: QEMU's stdin is closed (scripts, tests, CI).
    Closed,
    /// The terminal the runner was started from: an interactive guest (a
    /// shell) reads what is typed there.
    Terminal,
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

    /// Whether the guest has no test verdict of its own (a shell, or a
    /// kernel and initrd given as files): the run passes when QEMU exits 0
    /// with no failure report, rather than on `RESULT: PASS`.
    pub fn guest_is_free_running(&self) -> bool {
        self.linux
            .as_ref()
            .is_some_and(|linux| !linux.reports_result())
    }

    /// Whether a person drives the run: a guest without a verdict of its own
    /// whose console input is a terminal. QEMU then gets our stdin, the time
    /// limit is [`RunConfig::session_timeout`], and the run follows QEMU to
    /// its exit. Without a terminal the same guest runs unattended: QEMU's
    /// stdin is closed and [`RunConfig::timeout`] applies.
    pub fn is_interactive(&self) -> bool {
        self.guest_is_free_running() && self.input == ConsoleInput::Terminal
    }

    /// Checks the settings before anything is built or started, so a bad
    /// option costs nothing: CPU and memory counts in range, VM settings only
    /// for a hypervisor boot, vCPUs no more than CPUs, guest RAM smaller than
    /// the machine's, a time limit of at least a second.
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
        if self.timeout.is_zero() || self.session_timeout.is_some_and(|t| t.is_zero()) {
            return fail("--timeout: at least 1 second".into());
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
    if let Some(line) = transcript.vm_stops.first() {
        return Verdict::VmStopped(line.clone());
    }
    if let Some(line) = &transcript.kernel_fault {
        return Verdict::KernelFault(line.clone());
    }
    let exit = clean_exit(ending, status.success(), &status.to_string());
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
}

fn prepare_guest(config: &RunConfig) -> Result<Guest, RunnerError> {
    let quiet = !config.echo;
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
    })
}

/// File name of the hypervisor's raw `Image`.
pub const HYPERVISOR_IMAGE_FILE: &str = "hypervisor.img";
/// File name of the boot payload.
pub const PAYLOAD_FILE: &str = "payload.cpio";

/// The boot payload of `guest` with `config`'s VM settings.
fn payload(config: &RunConfig, guest: Guest) -> Payload {
    Payload {
        kernel: guest.kernel,
        initrd: guest.initrd,
        cmdline: Some(guest.cmdline),
        conf: VmConf {
            vcpus: config.vcpus,
            mem_mib: config.guest_mem_mib.map(u64::from),
        },
    }
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
    std::fs::write(&cpio, payload(config, guest).to_cpio()).map_err(io(&cpio))?;
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
            let initrd = dir.write(PAYLOAD_FILE, &payload(config, guest).to_cpio())?;
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
        cpu: config.cpu.clone(),
        smp: config.smp,
        mem_mib: config.mem_mib,
        firmware,
        kernel,
        initrd,
        append,
        gdb: config.gdb,
        extra_args: config.extra_qemu_args.clone(),
    };
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
        interactive: config.gdb || interactive,
        follow_to_exit: interactive,
    };
    let expectation = if config.guest_is_free_running() {
        Expectation::CleanExit
    } else {
        Expectation::ResultThenExit
    };
    let command_line = setup.command_line();
    let outcome = qemu::run(&setup, watch).map_err(|error| RunnerError::Io {
        what: format!("running {command_line}"),
        error,
    })?;
    Ok(RunReport {
        verdict: judge_run(
            &outcome.transcript,
            &outcome.ending,
            &outcome.status,
            watch.timeout.unwrap_or_default(),
            expectation,
            config.firmware,
        ),
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
    fn scenarios_have_names_and_cmdlines() {
        for &scenario in Scenario::ALL {
            assert_eq!(Scenario::from_name(scenario.name()), Some(scenario));
        }
        assert_eq!(Scenario::from_name("nope"), None);
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
