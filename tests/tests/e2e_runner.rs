//! End-to-end: the runner's own contract, with tiny hand-made kernels.
//!
//! - No QEMU command line gets a default NIC (`-nic none`): QEMU's `virt`
//!   would otherwise add a virtio NIC whose option ROM a minimal QEMU install
//!   lacks, and refuse to start.
//! - A `--kernel` guest with no test verdict of its own runs unattended when
//!   standard input is not a terminal: the binary, started with a stdin pipe
//!   that stays open and silent, honours `--timeout` instead of waiting for
//!   input for ever, and a kernel that powers off passes.
//! - A run in which the hypervisor could not start a guest fails, naming the
//!   hypervisor's reason.
//! - A raw binary (no `Image` header) boots like QEMU boots it, directly and
//!   under the hypervisor: loaded 512 KiB into RAM and entered with the
//!   device tree's address in `x0` (the kernel checks the device tree magic
//!   there before it powers off).
//!
//! - A console script drives QEMU's console: its monitor (Ctrl-A c) answers
//!   `info status` and `quit` sent when the prompt and the answer appear,
//!   and a step whose text never appears fails the run naming that text.
//! - `--vm`s emit one payload holding each VM under its name, with its
//!   CPUs, RAM and control flag.
//!
//! The kernels are arm64 `Image`s of a few instructions: one spins for ever
//! (`b .`), the other calls PSCI `SYSTEM_OFF` with `hvc #0` (the conduit of
//! QEMU's own PSCI and of the hypervisor's).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qemu_runner::console::GuestResult;
use qemu_runner::console_script::ConsoleScript;
use qemu_runner::linux::{InitrdSource, KernelSource, LinuxBoot};
use qemu_runner::qemu::{Machine, QemuSetup, QemuStdin, Watch};
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, RunConfig, Verdict};
use tests::e2e;

/// `b .`
const SPIN: u32 = 0x1400_0000;
/// `movz w0, #0x0008`
const MOVZ_W0_8: u32 = 0x5280_0100;
/// `movk w0, #0x8400, lsl #16` (w0 = PSCI SYSTEM_OFF, 0x8400_0008)
const MOVK_W0_8400_LSL16: u32 = 0x72b0_8000;
/// `hvc #0`
const HVC_0: u32 = 0xd400_0002;

/// A raw binary that powers off only when `x0` points at a device tree
/// (magic `0xd00dfeed`, big-endian), and spins otherwise.
const RAW_CHECKS_DTB_THEN_POWERS_OFF: [u32; 9] = [
    0xb940_0001, // ldr w1, [x0]
    0x5281_ba02, // movz w2, #0x0dd0
    0x72bd_bfc2, // movk w2, #0xedfe, lsl #16 (the magic as a little-endian load reads it)
    0x6b02_003f, // cmp w1, w2
    0x5400_0081, // b.ne +16 (to the spin)
    MOVZ_W0_8,
    MOVK_W0_8400_LSL16,
    HVC_0,
    SPIN,
];

/// An arm64 `Image` whose code (after the 64-byte header) is `code`.
fn image(code: &[u32]) -> Vec<u8> {
    let mut bytes = vec![0u8; 64];
    // code0: `b #64`, over the header to the code.
    bytes[0..4].copy_from_slice(&0x1400_0010u32.to_le_bytes());
    bytes[8..16].copy_from_slice(&0x8_0000u64.to_le_bytes()); // text_offset
    let size = (64 + 4 * code.len()) as u64;
    bytes[16..24].copy_from_slice(&size.to_le_bytes()); // image_size
    bytes[24..32].copy_from_slice(&0b1010u64.to_le_bytes()); // LE, 4 KiB pages, anywhere
    bytes[56..60].copy_from_slice(b"ARM\x64");
    for word in code {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes
}

/// Writes `name` into a directory of this test process and returns its path.
fn kernel_file(name: &str, code: &[u32]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("e2e-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, image(code)).unwrap();
    path
}

fn kernel_run(boot: Boot, kernel: &Path, timeout: u64) -> RunConfig {
    let linux = LinuxBoot {
        kernel: KernelSource::File(kernel.to_path_buf()),
        initrd: InitrdSource::None,
        cmdline: Some("quiet".into()),
    };
    RunConfig {
        timeout: Duration::from_secs(timeout),
        smp: 1,
        ..RunConfig::linux(boot, linux)
    }
}

#[test]
fn every_run_has_no_default_nic_and_a_powered_off_kernel_passes() {
    let off = kernel_file("off.img", &[MOVZ_W0_8, MOVK_W0_8400_LSL16, HVC_0, SPIN]);
    for boot in [Boot::Direct, Boot::Hypervisor] {
        let report = e2e::run(&kernel_run(boot, &off, 120));
        let explain = format!("{boot:?}: {}", report.explain());
        assert!(report.command_line.contains(" -nic none "), "{explain}");
        assert!(report.passed(), "{explain}");
    }
}

#[test]
fn a_raw_binary_boots_like_qemu_boots_it() {
    let dir = std::env::temp_dir().join(format!("e2e-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = dir.join("raw.bin");
    let code: Vec<u8> = RAW_CHECKS_DTB_THEN_POWERS_OFF
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect();
    std::fs::write(&raw, code).unwrap();
    for boot in [Boot::Direct, Boot::Hypervisor] {
        let report = e2e::run(&kernel_run(boot, &raw, 60));
        let explain = format!(
            "{boot:?}: {}\n--- console ---\n{}",
            report.verdict,
            report.console()
        );
        assert!(report.passed(), "{explain}");
        if boot == Boot::Hypervisor {
            assert!(
                report
                    .transcript
                    .log_lines_containing("kernel 0x40080000 (36 bytes, raw binary")
                    .count()
                    == 1,
                "{explain}"
            );
        }
    }
}

#[test]
fn a_run_whose_guest_never_started_fails_with_the_reason() {
    let off = kernel_file(
        "off-too-big.img",
        &[MOVZ_W0_8, MOVK_W0_8400_LSL16, HVC_0, SPIN],
    );
    let config = RunConfig {
        mem_mib: 256,
        guest_mem_mib: Some(255),
        ..kernel_run(Boot::Hypervisor, &off, 120)
    };
    let report = e2e::run(&config);
    match &report.verdict {
        Verdict::GuestNotStarted(why) => assert!(why.contains("MiB"), "{why}"),
        other => panic!(
            "expected the run to fail for want of a guest, got {other}\n{}",
            report.console()
        ),
    }
    assert!(!report.passed());
}

/// Runs the `qemu-runner` binary with a stdin pipe that stays open and
/// silent (a script that neither types nor closes), and returns its exit
/// code, its stderr and how long it took.
fn runner_with_open_silent_stdin(
    args: &[&str],
    limit: Duration,
) -> (Option<i32>, String, Duration) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(workspace)
        .args(["run", "--release", "-q", "-p", "qemu-runner", "--"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cargo runs");
    let _open_stdin = child.stdin.take();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            return (status.code(), stderr, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("qemu-runner {args:?} still running after {limit:?}: it ignores --timeout");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_kernel_run_without_a_terminal_honours_the_timeout_and_reads_no_input() {
    let spin = kernel_file("spin.img", &[SPIN]);
    let spin = spin.to_str().unwrap();
    let (code, stderr, took) = runner_with_open_silent_stdin(
        &["--kernel", spin, "--direct", "--smp", "1", "--timeout", "3"],
        Duration::from_secs(240),
    );
    assert_eq!(
        code,
        Some(1),
        "a spinning kernel fails at the limit\n{stderr}"
    );
    assert!(stderr.contains("no result within 3 s"), "{stderr}");
    assert!(
        stderr.contains("standard input is not a terminal"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(200), "took {took:?}");

    let off = kernel_file(
        "off-binary.img",
        &[MOVZ_W0_8, MOVK_W0_8400_LSL16, HVC_0, SPIN],
    );
    let (code, stderr, _) = runner_with_open_silent_stdin(
        &[
            "--kernel",
            off.to_str().unwrap(),
            "--direct",
            "--smp",
            "1",
            "--timeout",
            "60",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("qemu-runner: PASS"), "{stderr}");
}

#[test]
fn emitted_boot_files_boot_by_hand_as_the_readme_says() {
    let dir = std::env::temp_dir().join(format!("e2e-runner-emit-{}", std::process::id()));
    let config = RunConfig {
        echo: false,
        ..RunConfig::default()
    };
    let [image, payload] = qemu_runner::emit_boot_files(&config, &dir).expect("files written");
    // hypervisor/README.md's by-hand command, as the runner's one builder writes it.
    let setup = QemuSetup {
        program: qemu_runner::prereq::ensure_qemu().expect("QEMU"),
        machine: Machine::WithEl2,
        cpu: qemu_runner::DEFAULT_CPU.into(),
        smp: 4,
        mem_mib: 1024,
        firmware: None,
        gic: qemu_runner::qemu::GicVersion::V3,
        mte: false,
        kernel: image,
        initrd: Some(payload),
        append: None,
        gdb: false,
        disks: Vec::new(),
        passed: Vec::new(),
        net: None,
        extra_args: Vec::new(),
    };
    let watch = Watch {
        timeout: Some(Duration::from_secs(120)),
        progress: None,
        echo: false,
        stdin: QemuStdin::Closed,
        follow_to_exit: false,
    };
    let run = qemu_runner::qemu::run(&setup, watch).expect("QEMU runs");
    assert_eq!(
        run.transcript.result,
        Some(GuestResult::Pass),
        "{}\n{}",
        setup.command_line(),
        run.transcript.text
    );
    assert!(run.transcript.system_off, "{}", run.transcript.text);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_are_refused_before_anything_is_built() {
    let (code, stderr, took) =
        runner_with_open_silent_stdin(&["--smp", "0"], Duration::from_secs(240));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--smp 0"), "{stderr}");
    assert!(
        !stderr.contains("building"),
        "refused only after a build\n{stderr}"
    );
    assert!(took < Duration::from_secs(200));
}

#[test]
fn a_console_script_drives_the_console() {
    let spin = kernel_file("spin-script.img", &[SPIN]);
    // QEMU's console multiplexer: Ctrl-A c switches to its monitor.
    let monitor = ConsoleScript::new()
        .then("", b"\x01c")
        .then("(qemu) ", "info status\n")
        .then("VM status: running", "quit\n");
    let report = e2e::run(&e2e::with_script(
        kernel_run(Boot::Direct, &spin, 60),
        monitor.clone(),
    ));
    e2e::assert_passed(&report);
    assert!(
        report.elapsed < Duration::from_secs(50),
        "quit by the script, not at the time limit: {}",
        report.explain()
    );
    let unfinished = e2e::run(&e2e::with_script(
        kernel_run(Boot::Direct, &spin, 60),
        monitor.then("never printed", "x"),
    ));
    assert_eq!(
        unfinished.verdict,
        Verdict::ScriptUnfinished("never printed".into()),
        "{}",
        unfinished.explain()
    );
}

#[test]
fn several_vms_are_emitted_in_one_payload() {
    let dir = std::env::temp_dir().join(format!("e2e-runner-vms-{}", std::process::id()));
    let config = RunConfig {
        echo: false,
        smp: 4,
        vms: vec![
            VmSpec::parse("guest=memory,cpus=0-1,mem=64", 0).unwrap(),
            VmSpec::parse("bad-guest,cpus=3,name=bad,expect=stopped,control=1", 1).unwrap(),
        ],
        ..RunConfig::default()
    };
    let [_, payload] = qemu_runner::emit_boot_files(&config, &dir).expect("files written");
    let archive = std::fs::read(&payload).unwrap();
    let vms = qemu_runner::boot_payload::VmsRef::parse(&archive).expect("the payload reads back");
    assert_eq!(vms.check_cpus(4), Ok(()));
    let [memory, bad] = vms.as_slice() else {
        panic!("two VMs")
    };
    assert_eq!(memory.name.as_str(), "vm0");
    assert_eq!(memory.payload.cmdline, Some("test=memory"));
    assert_eq!(memory.payload.conf.cpus.unwrap().to_string(), "0-1");
    assert_eq!(memory.payload.conf.mem_mib, Some(64));
    assert_eq!(bad.name.as_str(), "bad");
    assert_eq!(bad.payload.cmdline, Some("test=bad-guest"));
    assert_eq!(bad.payload.conf.control, Some(true));
    assert_eq!(memory.payload.kernel, bad.payload.kernel, "one test guest");
    std::fs::remove_dir_all(&dir).unwrap();
}
