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
//! A fourth collects an echo VM's dirty log from the monitor (`dirty mode`,
//! `slot flags ... log`, `dirty get`), in manual and in auto mode, two
//! intervals each: every collection reports the pages the guest's loop
//! wrote, which only happens again if the one before write-protected them.
//! The tests fail (never skip) when QEMU, the build or the boot fails.

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::initramfs::INIT_MARKER;
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::{Boot, RunConfig, RunReport};
use tests::e2e;

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
        mem_mib: 512,
        ..e2e::vms(
            2,
            &[
                "echo,cpus=0,mem=64,name=alpha,expect=stopped",
                "echo,cpus=1,mem=64,name=beta",
            ],
            Duration::from_secs(240),
        )
    };
    e2e::run(&e2e::with_script(config, script()))
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
    let config = RunConfig::linux(Boot::Hypervisor, LinuxBoot::debian(BusyboxInit::Shell));
    let report = e2e::run(&e2e::with_script(config, script));
    e2e::assert_passed(&report);
    let explain = report.explain();
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

/// One echo VM, `solo`, on CPU 1 (the console on CPU 0), driven by `script`.
fn run_solo_echo(script: ConsoleScript) -> RunReport {
    let config = RunConfig {
        mem_mib: 512,
        ..e2e::vms(
            2,
            &["echo,cpus=1,mem=64,name=solo"],
            Duration::from_secs(180),
        )
    };
    e2e::run(&e2e::with_script(config, script))
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
    let report = run_solo_echo(script);
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

/// The `ok:` lines of `dirty get` for slot 0 of `solo`: the dirty page counts.
fn dirty_counts(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("ok: solo slot 0: "))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a page count")
        })
        .collect()
}

#[test]
fn the_monitor_collects_a_vms_dirty_log() {
    let collect_twice = |script: ConsoleScript| {
        script
            .then("", "exit\r")
            .then("echo: tick", "")
            .then("echo: tick", ESCAPE)
            .then("hv> ", "dirty get solo 0\r")
            .then("write-protected again", "exit\r")
            .then("echo: tick", "")
            .then("echo: tick", ESCAPE)
            .then("hv> ", "dirty get solo 0\r")
            .then("write-protected again", "")
    };
    let script = ConsoleScript::new()
        .then("echo: tick 1", ESCAPE)
        .then("hv> ", "slots solo\r")
        .then("hv> ", "dirty get solo 0\r")
        .then("error: ", "dirty mode solo manual 2M\r")
        .then("ok: solo dirty log mode manual", "slot flags solo 0 log\r")
        .then("ok: solo slot 0 flags log", "");
    let script = collect_twice(script)
        .then("", "slot flags solo 0 rw\r")
        .then("ok: solo slot 0 flags rw", "dirty mode solo auto\r")
        .then("ok: solo dirty log mode auto", "slot flags solo 0 log\r")
        .then("ok: solo slot 0 flags log", "");
    let script = collect_twice(script)
        .then("", "counters solo\r")
        .then("console_rx_dropped", "poweroff\r");
    let report = run_solo_echo(script);
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    let text = report.console();
    assert!(
        text.contains("error: memslots refused: slot 0 is not logging dirty pages"),
        "a slot that does not log has no dirty log\n{explain}"
    );

    // The slot's range, from `slots solo`.
    let row = text
        .lines()
        .find(|l| l.starts_with("0      0x"))
        .expect("slot 0 in `slots solo`");
    let words: Vec<&str> = row.split_whitespace().collect();
    let base = u64::from_str_radix(&words[1][2..], 16).expect("an address");
    let size = monitor_size(words[2]);

    // Four collections, each with pages the loop wrote since the last.
    let counts = dirty_counts(text);
    assert_eq!(counts.len(), 4, "{explain}");
    assert!(
        counts.iter().all(|&n| n > 0),
        "every interval's writes reported (a collection that does not \
         write-protect what it reports leaves the next one empty): {counts:?}\n{explain}"
    );
    let mut rows = 0;
    for line in text.lines().filter(|l| l.starts_with("0x")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ipa = u64::from_str_radix(&words[0][2..], 16).expect("an address");
        let pages: u64 = words[1].parse().expect("a page count");
        assert!(
            ipa >= base && ipa + (pages << 12) <= base + size,
            "run {line:?} outside slot 0\n{explain}"
        );
        rows += 1;
    }
    assert!(rows >= 4, "{explain}");
    let marked: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("dirty_pages_marked"))
        .and_then(|v| v.trim().parse().ok())
        .expect("dirty_pages_marked in `counters solo`");
    assert!(
        marked >= counts.iter().sum::<u64>(),
        "each reported page was marked by a write fault: {marked} < {counts:?}\n{explain}"
    );
    assert!(report.transcript.system_off, "{explain}");
}

/// A size as the monitor prints it (`64M`, `4K`, bytes).
fn monitor_size(word: &str) -> u64 {
    let (digits, shift) = match word.as_bytes().last() {
        Some(b'G') => (&word[..word.len() - 1], 30),
        Some(b'M') => (&word[..word.len() - 1], 20),
        Some(b'K') => (&word[..word.len() - 1], 10),
        _ => (word, 0),
    };
    digits.parse::<u64>().expect("a size") << shift
}
