//! End-to-end: the `qemu-runner` binary on a real pseudo-terminal, typed at
//! as a person types (`tests::pty`: keys one at a time into the terminal,
//! its screen read back; not a pipe, not a console script).
//!
//! - Two echo VMs (the README's `--smp 2 --vm echo,cpus=0,name=a --vm
//!   echo,cpus=1,name=b`): the terminal is in raw mode while QEMU runs;
//!   Ctrl-] (0x1d) opens the hypervisor's monitor, `vms` lists both
//!   running, `focus b` and `exit` send typed lines to b only (b echoes,
//!   a does not), Ctrl-] `poweroff` ends the run, which passes, and the
//!   terminal's mode is the one it had before.
//! - `--guest echo` alone: a typed line reaches the guest; Ctrl-] opens the
//!   monitor in a one-VM run too; `poweroff`.
//! - The live-migration walkthrough: `migrate src dst` typed at the monitor
//!   while the source writes; the destination's `RESULT: PASS`, and the run
//!   ends on its verdicts by itself (nobody leaves the monitor).
//! - A run with verdicts ends on them with a terminal too; with `--stay` it
//!   stays open past them until `poweroff` is typed.
//! - The guest-devices walkthrough of `docs/devices.md`: two Linux shells
//!   on one network, `a` with a disk and its console on virtio-console
//!   (`hvc0`). Commands typed into `a`'s `hvc0` and `b`'s PL011 shell bring
//!   `eth0` up on both, `b` pings `a`, `a` writes a file on its disk;
//!   `devices a` at the monitor lists the three devices; after `poweroff`
//!   the file is in the image on the host.
//! - The terminal's mode comes back after SIGINT to the foreground process
//!   group (what Ctrl-C does in a cooked terminal; in raw mode Ctrl-C is a
//!   byte for the guest) and after the time limit.
//!
//! The runner binary is built first, then the boot files once (`--emit`),
//! so every wait below is for QEMU, not for a build, and each has a limit:
//! a test that fails ends within seconds of its step, with the screen.
//! The tests take turns (one QEMU at a time). They fail, never skip, when
//! QEMU, the build or the boot fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use std::os::unix::process::ExitStatusExt;

use tests::linux_virtio::disk_image;
use tests::pty::{Mode, Terminal};

/// Ctrl-], the hypervisor console's escape key.
const ESCAPE: u8 = 0x1d;
/// From start to the first console line a test waits for.
const BOOT: Duration = Duration::from_secs(60);
/// For a reply to what was typed, or the next tick.
const REPLY: Duration = Duration::from_secs(20);
/// For the run to end once it should.
const END: Duration = Duration::from_secs(30);

/// One QEMU at a time: the tests share two or so CPUs with the build.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The runner binary, built (release, like the test) before the first use,
/// with the hypervisor and test guest built too.
fn runner() -> &'static Path {
    static RUNNER: OnceLock<PathBuf> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .current_dir(workspace)
            .args(["build", "--release", "-q", "-p", "qemu-runner"])
            .output()
            .expect("cargo runs");
        assert!(
            built.status.success(),
            "building qemu-runner failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        // This test runs from <target>/release/deps/.
        let exe = std::env::current_exe().unwrap();
        let runner = exe.parent().unwrap().parent().unwrap().join("qemu-runner");
        assert!(runner.is_file(), "no runner at {}", runner.display());
        let emit = std::env::temp_dir().join(format!("e2e-terminal-{}", std::process::id()));
        let emitted = Command::new(&runner)
            .args(["--emit", emit.to_str().unwrap()])
            .output()
            .expect("the runner starts");
        let _ = std::fs::remove_dir_all(&emit);
        assert!(
            emitted.status.success(),
            "building the hypervisor and the test guest failed:\n{}",
            String::from_utf8_lossy(&emitted.stderr)
        );
        runner
    })
}

/// `qemu-runner ARGS` on a new pseudo-terminal, with the mode the terminal
/// had before it started.
fn start(args: &[&str]) -> (Terminal, Mode) {
    let runner = runner();
    let terminal = Terminal::spawn(runner, args).expect("the runner starts on a terminal");
    let before = terminal.mode();
    assert!(!before.is_raw(), "a new terminal is cooked: {before:?}");
    (terminal, before)
}

/// The rows of the `vms` table in `text`, as words.
/// Types `vms` in the open monitor and returns what came up to the prompt
/// after its table. The table's header is waited for first: a VM's console
/// line that comes while the monitor is open is followed by the prompt
/// again, which must not pass for the end of the answer.
fn vms_table(terminal: &mut Terminal) -> String {
    terminal.type_keys(b"vms\r");
    let header = terminal.expect("FOCUS", REPLY);
    header + &terminal.expect("hv> ", REPLY)
}

fn vms_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|line| line.trim_matches(['\r', ' ']))
        .skip_while(|line| !(line.starts_with("ID ") && line.contains("FOCUS")))
        .skip(1)
        .filter(|line| !line.is_empty() && !line.starts_with('[') && !line.starts_with("hv>"))
        .map(|line| line.split_whitespace().map(String::from).collect())
        .collect()
}

/// The run ended as it should: `status`, the runner's verdict on a line of
/// its own, and the terminal's mode as it was before the run.
fn check_ended(terminal: &mut Terminal, status: ExitStatus, verdict: &str, before: Mode) {
    let screen = terminal.screen();
    assert!(
        screen.contains(&format!("qemu-runner: {verdict}")),
        "the runner's verdict is {verdict} ({status}):\n{screen}"
    );
    assert!(
        screen.contains(&format!("\nqemu-runner: {verdict}")),
        "the verdict starts a line, even after a prompt:\n{screen}"
    );
    assert_eq!(terminal.mode(), before, "the terminal's mode is restored");
}

#[test]
fn two_echo_vms_are_driven_from_the_monitor_typed_at_a_terminal() {
    let _turn = one_at_a_time();
    let (mut terminal, before) = start(&[
        "--smp",
        "2",
        "--vm",
        "echo,cpus=0,name=a",
        "--vm",
        "echo,cpus=1,name=b",
    ]);
    terminal.expect("Ctrl-] opens the hypervisor's monitor", BOOT);
    terminal.expect("[a] echo: tick", BOOT);
    terminal.expect("[b] echo: tick", REPLY);
    let running = terminal.mode();
    assert!(running.is_raw(), "raw mode while QEMU runs: {running:?}");
    assert_eq!(
        running.output & libc::OPOST,
        libc::OPOST,
        "output processing stays on"
    );

    terminal.type_keys(&[ESCAPE]);
    terminal.expect("-- monitor:", REPLY);
    terminal.expect("hv> ", REPLY);
    let table = vms_table(&mut terminal);
    let rows = vms_rows(&table);
    assert_eq!(rows.len(), 2, "two VMs in:\n{table}");
    for (row, (id, name, focus)) in rows.iter().zip([("0", "a", "*"), ("1", "b", "-")]) {
        assert_eq!(
            (row[0].as_str(), row[1].as_str(), row[2].as_str()),
            (id, name, "running"),
            "{table}"
        );
        assert_eq!(row.last().map(String::as_str), Some(focus), "{table}");
    }

    terminal.type_keys(b"focus b\r");
    terminal.expect("ok: input goes to b", REPLY);
    terminal.type_keys(b"exit\r");
    terminal.expect("-- console: input goes to b --", REPLY);
    terminal.type_keys(b"typed at the terminal\r");
    terminal.expect("[b] echo: got typed at the terminal", REPLY);
    // Both keep ticking; the line went to b alone.
    terminal.expect("[a] echo: tick", REPLY);
    terminal.expect("[b] echo: tick", REPLY);
    assert!(
        !terminal.screen().contains("[a] echo: got"),
        "a got b's line:\n{}",
        terminal.screen()
    );

    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    terminal.type_keys(b"poweroff\r");
    terminal.expect("[hv] system off", REPLY);
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);
}

#[test]
fn a_lone_echo_guest_reads_typed_lines_and_the_monitor_opens() {
    let _turn = one_at_a_time();
    let (mut terminal, before) = start(&["--guest", "echo"]);
    terminal.expect("echo: ready", BOOT);
    assert!(terminal.mode().is_raw());
    terminal.type_keys(b"hello echo\r");
    terminal.expect("echo: got hello echo", REPLY);
    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    let table = vms_table(&mut terminal);
    assert_eq!(vms_rows(&table).len(), 1, "{table}");
    terminal.type_keys(b"poweroff\r");
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);
}

#[test]
fn a_guest_is_migrated_from_the_monitor_typed_while_it_writes() {
    let _turn = one_at_a_time();
    let (mut terminal, before) = start(&[
        "--smp",
        "4",
        "--vm",
        "guest=migrate,cpus=0-1,name=src,expect=stopped,args=migrate-seconds=30",
        "--vm",
        "guest=migrate,cpus=2-3,name=dst,start=0",
    ]);
    terminal.expect("[src] migrate: 2 vCPUs writing", BOOT);
    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    terminal.type_keys(b"migrate src dst\r");
    terminal.expect("ok: migrating src to dst", REPLY);
    terminal.expect("stopped: migrated to vm1 (dst)", Duration::from_secs(60));
    // The monitor stays open; the destination's verdict still ends the run.
    terminal.expect("[dst] migrate: all", Duration::from_secs(60));
    terminal.expect("[dst] RESULT: PASS", REPLY);
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);
}

/// For two Linux shells to boot under TCG on a shared 2-core machine.
const LINUX_BOOT: Duration = Duration::from_secs(300);
/// For a command typed into a Linux shell (a ping, a mount) to answer.
const LINUX_REPLY: Duration = Duration::from_secs(60);

#[test]
fn linux_shells_on_a_network_and_a_disk_are_typed_at_through_hvc0_and_the_pl011() {
    let _turn = one_at_a_time();
    let image = disk_image("e2e-terminal-devices");
    let a = format!(
        "linux-shell,name=a,cpus=0-1,net=lan,disk={},console=virtio",
        image.display()
    );
    let (mut terminal, before) = start(&[
        "--smp",
        "4",
        "--mem",
        "2048",
        "--vm",
        &a,
        "--vm",
        "linux-shell,name=b,cpus=2-3,net=lan",
    ]);
    // The commands print values the shell computes, so that what is
    // awaited is the answer, never the echo of the typed line.
    terminal.expect("[a] LINUX-INIT: console moved to /dev/hvc0", LINUX_BOOT);
    terminal.expect("[a] Linux ", LINUX_BOOT);
    terminal.expect("busybox shell", REPLY);
    terminal.type_keys(
        b"ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up && echo a-up-$((6*7))\r",
    );
    terminal.expect("[a] a-up-42", LINUX_REPLY);
    terminal.type_keys(
        b"mkdir -p /mnt/d && mount -t ext4 /dev/vda /mnt/d && \
          echo typed at a terminal > /mnt/d/typed.txt && umount /mnt/d && echo disk-$((3*3))\r",
    );
    terminal.expect("[a] disk-9", LINUX_REPLY);

    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    terminal.type_keys(b"devices a\r");
    let table = terminal.expect("hv> ", REPLY);
    for kind in ["console", "net", "blk"] {
        assert!(
            table.lines().any(|line| line.contains(kind)),
            "`devices a` lists no {kind} device:\n{table}"
        );
    }
    terminal.type_keys(b"focus b\r");
    terminal.expect("ok: input goes to b", REPLY);
    terminal.type_keys(b"exit\r");
    terminal.expect("-- console: input goes to b --", REPLY);
    terminal.type_keys(b"\r");
    terminal.type_keys(
        b"ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up && \
          ping -c 3 -w 30 10.0.0.1 > /tmp/ping && echo ping-$((2*3))\r",
    );
    terminal.expect("[b] ping-6", LINUX_REPLY);

    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    terminal.type_keys(b"poweroff\r");
    terminal.expect("[hv] system off", REPLY);
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);
    let typed = qemu_runner::disk_image::read_ext4_file(&image, "/typed.txt")
        .unwrap_or_else(|error| panic!("/typed.txt from the image: {error}"));
    assert_eq!(typed, b"typed at a terminal\n");
    std::fs::remove_file(&image).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn a_run_with_verdicts_ends_on_them_unless_told_to_stay() {
    let _turn = one_at_a_time();
    let vms = [
        "--smp",
        "2",
        "--vm",
        "memory,cpus=0,name=m",
        "--vm",
        "echo,cpus=1,name=e",
    ];
    let (mut terminal, before) = start(&vms);
    terminal.expect("--stay keeps it open", BOOT);
    terminal.expect("[m] RESULT: PASS", BOOT);
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);

    let (mut terminal, before) = start(&[&vms[..], &["--stay"]].concat());
    terminal.expect("[m] RESULT: PASS", BOOT);
    // Past the time the runner gives the VMs after their verdicts.
    let grace = qemu_runner::qemu::RESULT_GRACE + Duration::from_secs(3);
    let seen = terminal.try_expect("qemu-runner: ", grace);
    assert!(seen.is_err(), "the run ended despite --stay");
    assert!(terminal.is_running());
    terminal.type_keys(&[ESCAPE]);
    terminal.expect("hv> ", REPLY);
    let table = vms_table(&mut terminal);
    let rows = vms_rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(rows[1][2], "running", "e runs on: {table}");
    terminal.type_keys(b"poweroff\r");
    let status = terminal.wait(END);
    assert!(status.success(), "{status}\n{}", terminal.screen());
    check_ended(&mut terminal, status, "PASS", before);
    assert!(
        terminal.screen().contains("the run lasts until QEMU exits"),
        "the runner said the run stays open"
    );
}

#[test]
fn the_terminal_is_restored_after_an_interrupt_and_after_the_time_limit() {
    let _turn = one_at_a_time();
    let (mut terminal, before) = start(&["--guest", "echo"]);
    terminal.expect("echo: tick", BOOT);
    assert!(terminal.mode().is_raw());
    // In raw mode Ctrl-C is a byte for the guest: the run goes on.
    terminal.type_keys(&[0x03]);
    terminal.expect("echo: tick", REPLY);
    assert!(terminal.is_running());
    // A signal, as a cooked terminal sends for Ctrl-C, or `kill -INT`.
    terminal.signal_foreground(libc::SIGINT);
    let status = terminal.wait(END);
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status}");
    assert!(terminal.screen().contains("terminal restored"));
    assert_eq!(terminal.mode(), before, "the mode is restored after SIGINT");

    let (mut terminal, before) = start(&["--guest", "echo", "--timeout", "8"]);
    terminal.expect("echo: tick", BOOT);
    assert!(terminal.mode().is_raw());
    let status = terminal.wait(END);
    assert_eq!(status.code(), Some(1), "the time limit fails the run");
    check_ended(&mut terminal, status, "FAIL", before);
}
