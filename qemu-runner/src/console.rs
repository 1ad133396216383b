//! Reading the console: classifies each line of QEMU's serial output and
//! keeps the verdict, the `STAT` counters and the hypervisor's log.
//!
//! Lines (the contract between hypervisor and runner): the guest's own
//! `RESULT: PASS` / `RESULT: FAIL <why>`; hypervisor log lines starting with
//! `[hv] `, among them `[hv] PANIC: <message>`, the final `[hv] system off`,
//! and the two errors that mean the guest did not run to its end:
//! `[hv] ERROR: cannot start a guest: <why>` (no VM was created) and
//! `[hv] ERROR: vm<V> vcpu<C>: stopping the VM: <why>`; and
//! `STAT vm<V> <name> <value>` counter lines printed at power-off. When U-Boot
//! boots the hypervisor, the runner's boot command prints `[u-boot] ...` lines
//! ([`crate::uboot`]): the first before it loads anything, and
//! `[u-boot] ERROR: <why>` when loading or `booti` failed. U-Boot's other
//! output (banner, device lists, `Starting kernel ...`) is ordinary text, and
//! a transcript made for such a run ([`Transcript::with_firmware`]) takes no
//! line before U-Boot's `Starting kernel ...` for a kernel failure report
//! (U-Boot prints its own `WARNING: ...` lines).
//! Carriage returns are dropped, so `\r\n` and `\n` consoles read the same.
//! With several VMs each VM's lines start with `[<name>] `
//! (`boot_payload::vmname`); this module leaves them as they are (such a
//! line is [`Line::Other`]) and [`crate::vm_verdict`] reads them by VM.
//!
//! A guest kernel's own failure reports are recognised too: after the printk
//! timestamp (`[    1.234567] `) is stripped, a line that starts with one of
//! [`KERNEL_FAULT_PREFIXES`] (`Internal error: Oops`, `WARNING:`,
//! `Kernel panic`, `BUG:`, ...) is a [`Line::KernelFault`]. Each line is kept
//! with the time it arrived, so figures such as "time to a marker line" come
//! from the same transcript.

use std::collections::BTreeMap;
use std::time::Duration;

/// Prefix of every hypervisor log line.
pub const HV_PREFIX: &str = "[hv] ";
/// Prefix of the guest's verdict line.
pub const RESULT_PREFIX: &str = "RESULT:";
/// The hypervisor's last line before powering off.
pub const SYSTEM_OFF_LINE: &str = "[hv] system off";
/// Prefix of a hypervisor panic line.
pub const PANIC_PREFIX: &str = "[hv] PANIC:";
/// Prefix of the hypervisor's line when it could not create a VM for the
/// payload.
pub const GUEST_NOT_STARTED_PREFIX: &str = "[hv] ERROR: cannot start a guest:";
/// Prefix of the hypervisor's error lines.
pub const HV_ERROR_PREFIX: &str = "[hv] ERROR: ";
/// Prefix of the runner's U-Boot boot command's error line.
pub const UBOOT_ERROR_PREFIX: &str = "[u-boot] ERROR: ";
/// What an error line says when the hypervisor stops a VM (after
/// `vm<V> vcpu<C>`).
pub const VM_STOP_MARKER: &str = ": stopping the VM: ";

/// What the hypervisor's end line of a live migration's source contains.
pub const VM_MIGRATED_MARKER: &str = ": stopped: migrated to ";

/// How a line that reports a guest kernel failure starts (after the printk
/// timestamp): oopses, warnings, panics, `BUG:` reports and the fault report
/// that precedes an oops.
pub const KERNEL_FAULT_PREFIXES: &[&str] = &[
    "Internal error: Oops",
    "Oops",
    "WARNING:",
    "Kernel panic",
    "BUG:",
    "Unable to handle kernel",
];

/// The guest's verdict, from its `RESULT:` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestResult {
    /// `RESULT: PASS`.
    Pass,
    /// `RESULT: FAIL <why>`, with the reason.
    Fail(String),
    /// A `RESULT:` line that is neither (kept verbatim).
    Malformed(String),
}

/// Per-VM counters from the `STAT` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters(BTreeMap<(u32, String), u64>);

impl Counters {
    /// The counter `name` of VM `vm`, if it was printed.
    pub fn get(&self, vm: u32, name: &str) -> Option<u64> {
        self.0.get(&(vm, name.to_string())).copied()
    }

    /// The counters as a map from `(vm, name)` to value.
    pub fn as_map(&self) -> &BTreeMap<(u32, String), u64> {
        &self.0
    }

    /// Every counter as `((vm, name), value)`, ordered by VM then name.
    pub fn iter(&self) -> impl Iterator<Item = (&(u32, String), &u64)> {
        self.0.iter()
    }

    /// Whether no `STAT` line was seen.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What one console line is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// The guest's verdict.
    Result(GuestResult),
    /// `STAT vm<V> <name> <value>`.
    Stat {
        /// VM number.
        vm: u32,
        /// Counter name.
        name: String,
        /// Counter value.
        value: u64,
    },
    /// `[hv] PANIC: <message>`.
    HypervisorPanic(String),
    /// `[hv] system off`.
    SystemOff,
    /// `[hv] ERROR: cannot start a guest: <why>`, with the reason.
    GuestNotStarted(String),
    /// `[hv] ERROR: vm<V> vcpu<C>: stopping the VM: <why>`, the line after
    /// `[hv] ERROR: `.
    VmStopped(String),
    /// A guest kernel failure report (oops, warning, panic, `BUG:`), the line
    /// without its printk timestamp.
    KernelFault(String),
    /// Any other `[hv] ` line.
    HypervisorLog,
    /// `[u-boot] ERROR: <why>`: U-Boot could not load or boot the
    /// hypervisor (the reason).
    FirmwareFailed(String),
    /// Any other `[u-boot] ` line.
    FirmwareLog,
    /// Anything else (guest output).
    Other,
}

/// Classifies one line (without its newline).
pub fn classify(line: &str) -> Line {
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix(RESULT_PREFIX) {
        let rest = rest.trim();
        return Line::Result(if rest == "PASS" {
            GuestResult::Pass
        } else if let Some(why) = rest.strip_prefix("FAIL") {
            GuestResult::Fail(why.trim().to_string())
        } else {
            GuestResult::Malformed(line.to_string())
        });
    }
    if let Some(message) = line.strip_prefix(PANIC_PREFIX) {
        return Line::HypervisorPanic(message.trim().to_string());
    }
    if line == SYSTEM_OFF_LINE {
        return Line::SystemOff;
    }
    if let Some(why) = line.strip_prefix(GUEST_NOT_STARTED_PREFIX) {
        return Line::GuestNotStarted(why.trim().to_string());
    }
    if let Some(error) = line.strip_prefix(HV_ERROR_PREFIX)
        && error.contains(VM_STOP_MARKER)
    {
        return Line::VmStopped(error.to_string());
    }
    // A source VM that a live migration ended: `vm<V> (<name>): stopped:
    // migrated to ...`.
    if let Some(end) = line.strip_prefix(HV_PREFIX)
        && end.starts_with("vm")
        && end.contains(VM_MIGRATED_MARKER)
    {
        return Line::VmStopped(end.to_string());
    }
    if line.starts_with(HV_PREFIX) {
        return Line::HypervisorLog;
    }
    if let Some(why) = line.strip_prefix(UBOOT_ERROR_PREFIX) {
        return Line::FirmwareFailed(why.trim().to_string());
    }
    if line.starts_with(crate::uboot::UBOOT_PREFIX) {
        return Line::FirmwareLog;
    }
    if let Some(stat) = parse_stat(line) {
        return stat;
    }
    let message = strip_printk_time(line);
    if KERNEL_FAULT_PREFIXES
        .iter()
        .any(|prefix| message.starts_with(prefix))
    {
        return Line::KernelFault(message.to_string());
    }
    Line::Other
}

/// `line` without a leading printk timestamp `[ seconds.micros] `.
fn strip_printk_time(line: &str) -> &str {
    let Some(rest) = line.strip_prefix('[') else {
        return line;
    };
    match rest.split_once(']') {
        Some((stamp, message))
            if !stamp.trim().is_empty()
                && stamp.trim().chars().all(|c| c.is_ascii_digit() || c == '.') =>
        {
            message.trim_start()
        }
        _ => line,
    }
}

fn parse_stat(line: &str) -> Option<Line> {
    let mut words = line.split_ascii_whitespace();
    if words.next()? != "STAT" {
        return None;
    }
    let vm = words.next()?.strip_prefix("vm")?.parse().ok()?;
    let name = words.next()?.to_string();
    let value = parse_number(words.next()?)?;
    words
        .next()
        .is_none()
        .then_some(Line::Stat { vm, name, value })
}

fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Everything learnt from the console so far.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    /// The whole console output, lines joined with `\n`.
    pub text: String,
    /// The guest's first verdict.
    pub result: Option<GuestResult>,
    /// Counters from `STAT` lines.
    pub counters: Counters,
    /// Every `[hv] ` line, in order.
    pub hypervisor_log: Vec<String>,
    /// The message of the first hypervisor panic.
    pub panic: Option<String>,
    /// Whether `[hv] system off` was printed.
    pub system_off: bool,
    /// Why the hypervisor could not start a guest, when it said so.
    pub guest_not_started: Option<String>,
    /// Every VM the hypervisor stopped (`vm<V> vcpu<C>: stopping the VM:
    /// <why>`), in order.
    pub vm_stops: Vec<String>,
    /// The first guest kernel failure report.
    pub kernel_fault: Option<String>,
    /// Every `[u-boot] ` line of the runner's U-Boot boot command, in order.
    pub firmware_log: Vec<String>,
    /// Why U-Boot could not boot the hypervisor, when it said so.
    pub firmware_failure: Option<String>,
    /// Whether the firmware still has the console (until U-Boot's
    /// [`FIRMWARE_HANDOVER_LINE`]).
    pub firmware_running: bool,
    /// Every line with the time it arrived (since QEMU started; zero for
    /// lines given to [`Transcript::push_line`]).
    pub timed_lines: Vec<(Duration, String)>,
}

/// What U-Boot prints as it enters the kernel (the hypervisor).
pub const FIRMWARE_HANDOVER_LINE: &str = "Starting kernel ...";

impl Transcript {
    /// A transcript of a run that U-Boot starts: until its
    /// [`FIRMWARE_HANDOVER_LINE`], no line is a kernel failure report.
    pub fn with_firmware() -> Transcript {
        Transcript {
            firmware_running: true,
            ..Transcript::default()
        }
    }

    /// Takes one line of console output and returns what it was.
    pub fn push_line(&mut self, raw: &str) -> Line {
        self.push_line_at(raw, Duration::ZERO)
    }

    /// Takes one line of console output that arrived `at` after QEMU
    /// started, and returns what it was.
    pub fn push_line_at(&mut self, raw: &str, at: Duration) -> Line {
        let line = raw.trim_end_matches(['\r', '\n']).replace('\r', "");
        self.text.push_str(&line);
        self.text.push('\n');
        let kind = match classify(&line) {
            Line::KernelFault(_) if self.firmware_running => Line::Other,
            kind => kind,
        };
        if self.firmware_running && line.trim() == FIRMWARE_HANDOVER_LINE {
            self.firmware_running = false;
        }
        self.timed_lines.push((at, line.clone()));
        if line.starts_with(HV_PREFIX) {
            self.hypervisor_log.push(line.clone());
        }
        if line.starts_with(crate::uboot::UBOOT_PREFIX) {
            self.firmware_log.push(line.clone());
        }
        match &kind {
            Line::Result(result) if self.result.is_none() => self.result = Some(result.clone()),
            Line::Stat { vm, name, value } => {
                self.counters.0.insert((*vm, name.clone()), *value);
            }
            Line::HypervisorPanic(message) if self.panic.is_none() => {
                self.panic = Some(message.clone())
            }
            Line::SystemOff => self.system_off = true,
            Line::GuestNotStarted(why) if self.guest_not_started.is_none() => {
                self.guest_not_started = Some(why.clone())
            }
            Line::VmStopped(line) => self.vm_stops.push(line.clone()),
            Line::KernelFault(message) if self.kernel_fault.is_none() => {
                self.kernel_fault = Some(message.clone())
            }
            Line::FirmwareFailed(why) if self.firmware_failure.is_none() => {
                // U-Boot's own complaint is the line before ours.
                let before = self.timed_lines.iter().rev().skip(1).find_map(|(_, l)| {
                    let l = l.trim();
                    (!l.is_empty() && !l.starts_with(crate::uboot::UBOOT_PREFIX)).then_some(l)
                });
                self.firmware_failure = Some(match before {
                    Some(before) => format!("{why} (U-Boot said before: `{before}`)"),
                    None => why.clone(),
                });
            }
            _ => {}
        }
        kind
    }

    /// When the first line that starts with `prefix` (after surrounding
    /// blanks) arrived.
    pub fn arrival_of(&self, prefix: &str) -> Option<Duration> {
        self.timed_lines
            .iter()
            .find(|(_, line)| line.trim().starts_with(prefix))
            .map(|(at, _)| *at)
    }

    /// Whether U-Boot ran the runner's boot command (printed its first line,
    /// [`crate::uboot::START_MARKER`]).
    pub fn firmware_boot_started(&self) -> bool {
        self.firmware_log
            .iter()
            .any(|line| line.starts_with(crate::uboot::START_MARKER))
    }

    /// Hypervisor log lines containing `needle`.
    pub fn log_lines_containing<'a>(&'a self, needle: &'a str) -> impl Iterator<Item = &'a str> {
        self.hypervisor_log
            .iter()
            .map(String::as_str)
            .filter(move |l| l.contains(needle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_classified() {
        assert_eq!(classify("RESULT: PASS"), Line::Result(GuestResult::Pass));
        assert_eq!(classify("RESULT: PASS\r"), Line::Result(GuestResult::Pass));
        assert_eq!(
            classify("RESULT: FAIL vcpu1 read 0x0"),
            Line::Result(GuestResult::Fail("vcpu1 read 0x0".into()))
        );
        assert_eq!(
            classify("RESULT: maybe"),
            Line::Result(GuestResult::Malformed("RESULT: maybe".into()))
        );
        assert_eq!(
            classify("STAT vm0 stage2_faults 17"),
            Line::Stat {
                vm: 0,
                name: "stage2_faults".into(),
                value: 17
            }
        );
        assert_eq!(
            classify("STAT vm1 tlbi_ipa 0x10"),
            Line::Stat {
                vm: 1,
                name: "tlbi_ipa".into(),
                value: 16
            }
        );
        assert_eq!(classify("STAT vm0 stage2_faults"), Line::Other);
        assert_eq!(classify("STAT vmx stage2_faults 1"), Line::Other);
        assert_eq!(classify("STAT vm0 a 1 2"), Line::Other);
        assert_eq!(classify("[hv] system off"), Line::SystemOff);
        assert_eq!(
            classify("[hv] PANIC: oops at x"),
            Line::HypervisorPanic("oops at x".into())
        );
        assert_eq!(classify("[hv] 4 CPUs"), Line::HypervisorLog);
        assert_eq!(
            classify("[hv] ERROR: cannot start a guest: vm.conf line 1: bad value"),
            Line::GuestNotStarted("vm.conf line 1: bad value".into())
        );
        assert_eq!(
            classify("[hv] ERROR: vm0 vcpu1: stopping the VM: unhandled exit EC 0x3f"),
            Line::VmStopped("vm0 vcpu1: stopping the VM: unhandled exit EC 0x3f".into())
        );
        assert_eq!(
            classify("[hv] ERROR: GICv3 CPU interface missing"),
            Line::HypervisorLog
        );
        assert_eq!(classify("test-guest: hello"), Line::Other);
        assert_eq!(classify("  RESULT: PASS"), Line::Other);
    }

    #[test]
    fn kernel_failure_reports_are_recognised_with_or_without_timestamps() {
        assert_eq!(
            classify("[    2.345678] WARNING: CPU: 1 PID: 1 at mm/slub.c:1 f+0x4/0x8"),
            Line::KernelFault("WARNING: CPU: 1 PID: 1 at mm/slub.c:1 f+0x4/0x8".into())
        );
        assert_eq!(
            classify("[   10.000001] Internal error: Oops: 96000004 [#1] SMP"),
            Line::KernelFault("Internal error: Oops: 96000004 [#1] SMP".into())
        );
        assert_eq!(
            classify("Kernel panic - not syncing: Attempted to kill init!"),
            Line::KernelFault("Kernel panic - not syncing: Attempted to kill init!".into())
        );
        assert_eq!(
            classify("[ 0.5] BUG: scheduling while atomic: sh/1/0x00000002"),
            Line::KernelFault("BUG: scheduling while atomic: sh/1/0x00000002".into())
        );
        assert!(matches!(
            classify("[    1.0] Unable to handle kernel paging request at virtual address 0"),
            Line::KernelFault(_)
        ));
        assert_eq!(
            classify("[    0.000000] Booting Linux on physical CPU 0x0"),
            Line::Other
        );
        assert_eq!(classify("[x] WARNING: not a timestamp"), Line::Other);
        assert_eq!(classify("no WARNING: in the middle"), Line::Other);
        assert_eq!(classify("LINUX-INIT: started"), Line::Other);
    }

    #[test]
    fn u_boot_output_is_told_apart_and_never_a_failure_by_itself() {
        let mut transcript = Transcript::default();
        for line in [
            "U-Boot 2023.01+dfsg-2+deb12u3 (Jun 22 2026 - 08:38:07 +0000)\r",
            "Loading Environment from Flash... *** Warning - bad CRC, using default environment",
            "Hit any key to stop autoboot:  0 \x08\x08\x08 0",
            "[u-boot] loading the hypervisor to 0x40400000 and the payload to 0x44000000",
            "Bad Linux ARM64 Image magic!",
            "Starting kernel ...",
        ] {
            let kind = transcript.push_line(line);
            assert!(
                matches!(kind, Line::Other | Line::FirmwareLog),
                "{line}: {kind:?}"
            );
        }
        assert!(transcript.firmware_boot_started());
        assert_eq!(transcript.firmware_failure, None);
        assert!(transcript.kernel_fault.is_none() && transcript.hypervisor_log.is_empty());
        assert_eq!(
            transcript.push_line("[u-boot] ERROR: the boot command failed\r"),
            Line::FirmwareFailed("the boot command failed".into())
        );
        assert_eq!(
            transcript.firmware_failure.as_deref(),
            Some("the boot command failed (U-Boot said before: `Starting kernel ...`)")
        );
        assert_eq!(transcript.firmware_log.len(), 2);
        assert!(!Transcript::default().firmware_boot_started());
        let mut alone = Transcript::default();
        alone.push_line("[u-boot] ERROR: x");
        assert_eq!(alone.firmware_failure.as_deref(), Some("x"));
    }

    #[test]
    fn u_boot_warnings_are_not_kernel_failures_but_the_kernels_are() {
        let mut transcript = Transcript::with_firmware();
        let warning = "WARNING: could not set linux,initrd-start FDT_ERR_NOSPACE.";
        assert_eq!(transcript.push_line(warning), Line::Other);
        assert_eq!(transcript.kernel_fault, None);
        transcript.push_line("Starting kernel ...\r");
        assert!(!transcript.firmware_running);
        assert!(matches!(
            transcript.push_line("[    1.0] WARNING: CPU: 0 PID: 1 at x"),
            Line::KernelFault(_)
        ));
        let mut plain = Transcript::default();
        assert!(matches!(plain.push_line(warning), Line::KernelFault(_)));
    }

    #[test]
    fn arrival_times_are_kept_per_line() {
        let mut transcript = Transcript::default();
        transcript.push_line_at("[    0.1] Booting Linux", Duration::from_millis(300));
        transcript.push_line_at("LINUX-INIT: started\r", Duration::from_millis(2500));
        transcript.push_line_at("[    3.0] WARNING: at x", Duration::from_millis(2600));
        transcript.push_line_at("[    3.1] WARNING: at y", Duration::from_millis(2700));
        assert_eq!(
            transcript.arrival_of("LINUX-INIT: started"),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(transcript.arrival_of("RESULT:"), None);
        assert_eq!(transcript.kernel_fault.as_deref(), Some("WARNING: at x"));
    }

    #[test]
    fn transcript_keeps_first_result_counters_and_log() {
        let mut transcript = Transcript::default();
        for line in [
            "[hv] booting\r\n",
            "RESULT: FAIL first",
            "RESULT: PASS",
            "STAT vm0 stage2_faults 3",
            "STAT vm0 mapped_blocks_2m 2",
            "[hv] system off",
        ] {
            transcript.push_line(line);
        }
        assert_eq!(transcript.result, Some(GuestResult::Fail("first".into())));
        assert_eq!(transcript.counters.get(0, "stage2_faults"), Some(3));
        assert_eq!(transcript.counters.get(0, "mapped_blocks_2m"), Some(2));
        assert_eq!(transcript.counters.get(1, "stage2_faults"), None);
        assert_eq!(
            transcript.hypervisor_log,
            ["[hv] booting", "[hv] system off"]
        );
        assert!(transcript.system_off);
        assert!(
            transcript
                .text
                .starts_with("[hv] booting\nRESULT: FAIL first\n")
        );
        assert_eq!(transcript.log_lines_containing("boot").count(), 1);
    }

    #[test]
    fn a_migrated_source_reads_as_stopped() {
        assert!(matches!(
            classify("[hv] vm0 (src): stopped: migrated to vm1 (dst)"),
            Line::VmStopped(_)
        ));
        assert!(matches!(
            classify("[hv] vm0 (src): stopped: stop requested"),
            Line::HypervisorLog
        ));
    }
}
