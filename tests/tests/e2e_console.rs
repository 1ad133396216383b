//! End-to-end: the hypervisor console monitor, driven by keystrokes.
//!
//! Two test-guest VMs run the `echo` scenario (a tick line twice a second,
//! and an echo of every line typed to it), one vCPU each. A console script
//! (`qemu_runner::console_script`) types into the host console: the escape
//! key Ctrl-] alone (the monitor opens at the next console poll), `vms`,
//! `counters`, `pause` of one VM while the other keeps ticking, `resume`,
//! `focus` on the second VM and a line typed into it, `stop` of the first
//! and `poweroff`. Every step's reply is checked in the transcript, and the
//! ticks show that the pause and the stop took effect while the other VM
//! ran on. A second test boots Linux with the busybox shell as the only VM
//! and types a command into it: with one VM every typed byte goes to it.
//! A third pastes 32 lines at once into one echo VM and checks every line
//! comes back whole: the host UART hands bytes over one at a time, and a
//! receive interrupt lost between two of them strands the rest of a paste.
//! The tests fail (never skip) when QEMU, the build or the boot fails.

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::initramfs::INIT_MARKER;
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, ConsoleInput, RunConfig, RunReport};

/// Ctrl-], the console's escape key.
const ESCAPE: &str = "\x1d";

fn script() -> ConsoleScript {
    ConsoleScript::new()
        // Both VMs are up and ticking.
        .then("[alpha] echo: tick 2", "")
        .then("[beta] echo: tick", "")
        // A lone escape: the monitor opens at the next poll.
        .then("", ESCAPE)
        .then("hv> ", "vms\r")
        .then("hv> ", "counters beta\r")
        .then("console_rx_dropped", "pause alpha\r")
        .then("ok: alpha paused", "")
        // Three ticks of beta while alpha is paused.
        .then("[beta] echo: tick", "")
        .then("[beta] echo: tick", "")
        .then("[beta] echo: tick", "vms\r")
        .then("hv> ", "resume alpha\r")
        .then("ok: alpha resumed", "")
        .then("[alpha] echo: tick", "focus beta\r")
        .then("ok: input goes to beta", "exit\r")
        .then("-- console: input goes to beta --", "hello beta\r")
        .then("[beta] echo: got hello beta", "")
        // An escape and a key at once: the key is the monitor's first.
        .then("", format!("{ESCAPE}stop alpha\r"))
        .then("ok: alpha stopped", "")
        .then("[beta] echo: tick", "")
        .then("[beta] echo: tick", "vms\r")
        .then("hv> ", "poweroff\r")
}

fn run() -> RunReport {
    let config = RunConfig {
        smp: 2,
        mem_mib: 512,
        timeout: Duration::from_secs(240),
        echo: false,
        vms: vec![
            VmSpec::parse("echo,cpus=0,mem=64,name=alpha,expect=stopped", 0).unwrap(),
            VmSpec::parse("echo,cpus=1,mem=64,name=beta", 1).unwrap(),
        ],
        input: ConsoleInput::Script(script()),
        ..RunConfig::default()
    };
    qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"))
}

/// The console lines from the first one containing `from` (after `after`)
/// up to the first one after it containing `to`.
fn between<'a>(lines: &[&'a str], after: usize, from: &str, to: &str) -> (usize, Vec<&'a str>) {
    let start = after
        + lines[after..]
            .iter()
            .position(|l| l.contains(from))
            .unwrap_or_else(|| panic!("no line with {from:?}"));
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.contains(to))
            .unwrap_or_else(|| panic!("no line with {to:?} after {from:?}"));
    (end, lines[start..=end].to_vec())
}

/// The rows of the first `vms` table at or after line `after`, as words.
fn vms_table(lines: &[&str], after: usize) -> (usize, Vec<Vec<String>>) {
    let header = after
        + lines[after..]
            .iter()
            .position(|l| l.starts_with("ID ") && l.contains("FOCUS"))
            .expect("a vms table");
    let rows = lines[header + 1..]
        .iter()
        .filter(|l| !l.starts_with('['))
        .take(2)
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    (header, rows)
}

fn ticks(lines: &[&str], vm: &str) -> usize {
    let prefix = format!("[{vm}] echo: tick");
    lines.iter().filter(|l| l.starts_with(&prefix)).count()
}

#[test]
fn the_monitor_drives_two_vms_by_keystrokes() {
    let report = run();
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    let text = report.console();
    let lines: Vec<&str> = text.lines().collect();

    // `vms` lists both VMs, running, one vCPU on its own CPU, 64 MiB, one
    // memslot; input goes to alpha.
    let (at, rows) = vms_table(&lines, 0);
    assert_eq!(
        rows,
        [
            ["0", "alpha", "running", "1", "0", "64M", "1", "*"],
            ["1", "beta", "running", "1", "1", "64M", "1", "-"],
        ]
        .map(|row| row.map(String::from).to_vec())
        .to_vec(),
        "{explain}"
    );

    // `counters beta`: the machine's counters, then the console's own.
    let (at, counters) = between(&lines, at, "COUNTER", "console_rx_dropped");
    for name in ["exits_dabt", "stage2_faults", "tlbi_range"] {
        assert!(
            counters.iter().any(|l| l.starts_with(name)),
            "no {name} in `counters beta`\n{explain}"
        );
    }
    let dabt: u64 = counters
        .iter()
        .find_map(|l| l.strip_prefix("exits_dabt"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a number");
    assert!(dabt > 0, "beta printed through its PL011\n{explain}");

    // While alpha is paused beta ticks on and alpha does not (a tick that
    // was being written when the pause came may end).
    let (at, paused) = between(&lines, at, "ok: alpha paused", "ok: alpha resumed");
    assert!(ticks(&paused, "beta") >= 3, "{explain}");
    assert!(
        ticks(&paused, "alpha") <= 1,
        "alpha ticked while paused\n{explain}"
    );
    let (_, rows) = vms_table(&paused, 0);
    assert_eq!(rows[0][2], "paused", "{explain}");
    assert_eq!(rows[1][2], "running", "{explain}");

    // After resume alpha ticks again; the typed line went to beta only.
    let (at, resumed) = between(&lines, at, "ok: alpha resumed", "ok: alpha stopped");
    assert!(ticks(&resumed, "alpha") >= 1, "{explain}");
    assert!(
        resumed.contains(&"[beta] echo: got hello beta"),
        "{explain}"
    );
    assert!(
        !text.contains("[alpha] echo: got"),
        "alpha got input while beta had the focus\n{explain}"
    );

    // After stop alpha is stopped, beta runs on, and poweroff ends the run.
    let (_, stopped) = between(&lines, at, "ok: alpha stopped", "powering off");
    assert!(ticks(&stopped, "alpha") <= 1, "{explain}");
    assert!(ticks(&stopped, "beta") >= 2, "{explain}");
    let (_, rows) = vms_table(&stopped, 0);
    assert_eq!(rows[0][2], "stopped", "{explain}");
    assert_eq!(rows[1][2], "running", "{explain}");
    assert!(report.transcript.system_off, "{explain}");
}

#[test]
fn typed_bytes_reach_the_only_vm_a_linux_shell() {
    let script = ConsoleScript::new()
        .then(INIT_MARKER, "")
        .then("busybox shell", "echo typed-$((6*7))\r")
        // The whole output line: sent at once on `typed-42`, the command's
        // echo could land on that line.
        .then("typed-42\n", "poweroff -f\r");
    let config = RunConfig {
        echo: false,
        input: ConsoleInput::Script(script),
        ..RunConfig::linux(Boot::Hypervisor, LinuxBoot::debian(BusyboxInit::Shell))
    };
    let report =
        qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"));
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    let text = report.console();
    assert!(
        text.lines().any(|l| l.trim_end() == "typed-42"),
        "the shell ran the typed command\n{explain}"
    );
    assert!(
        !text.contains("[vm0]"),
        "one VM: its output is not prefixed\n{explain}"
    );
    assert!(report.transcript.system_off, "{explain}");
}

/// Lines in the pasted burst.
const PASTED_LINES: usize = 32;

/// Line `i` of the paste: 61 bytes (the echo takes up to 64), numbered, and
/// each different from the others all along.
fn pasted_line(i: usize) -> String {
    let fill: String = (0..52)
        .map(|j| char::from(b'a' + ((i * 7 + j) % 26) as u8))
        .collect();
    format!("paste {i:02} {fill}")
}

#[test]
fn a_pasted_burst_reaches_the_guest_whole() {
    let paste: String = (0..PASTED_LINES).map(|i| pasted_line(i) + "\r").collect();
    let last = format!("echo: got {}", pasted_line(PASTED_LINES - 1));
    let script = ConsoleScript::new()
        .then("echo: ready", paste)
        .then(&last, ESCAPE)
        .then("hv> ", "counters 0\r")
        .then("console_rx_dropped", "poweroff\r");
    let config = RunConfig {
        smp: 2,
        mem_mib: 512,
        timeout: Duration::from_secs(180),
        echo: false,
        vms: vec![VmSpec::parse("echo,cpus=1,mem=64,name=solo", 0).unwrap()],
        input: ConsoleInput::Script(script),
        ..RunConfig::default()
    };
    let report =
        qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"));
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    let text = report.console();
    let echoed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix("echo: got "))
        .collect();
    let expected: Vec<String> = (0..PASTED_LINES).map(pasted_line).collect();
    assert_eq!(
        echoed, expected,
        "every pasted line, whole and in order\n{explain}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(["console_rx_dropped", "0"])),
        "no byte dropped\n{explain}"
    );
    assert!(report.transcript.system_off, "{explain}");
}
