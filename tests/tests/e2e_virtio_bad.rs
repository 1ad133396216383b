//! End-to-end: a hostile driver of a VM's virtio-console leaves the
//! hypervisor and the VM running, and the device working after a reset.
//!
//! * `virtio-bad` (the test guest's scenario, one VM with
//!   `console=virtio`), on `-cpu max` and on `cortex-a57`: the guest sends
//!   `virtio-console: hello` through the transmit queue (the line must
//!   reach the console), then descriptor loops, chains longer than the
//!   queue, buffers and rings outside RAM and in device windows, huge
//!   lengths, nested and malformed indirect tables, an available index a
//!   queue ahead, notify storms, register abuse and resets in the middle of
//!   a request. Every broken chain and refused ring must end in
//!   `DEVICE_NEEDS_RESET` (the hypervisor's device models are strict: the
//!   guest itself accepts a used chain too, as a laxer device may), every
//!   case must be followed by a good request after a reset (its
//!   `virtio-bad: recovered after ...` line on the console), the VM must
//!   never be stopped, and the hypervisor must count each entry into
//!   `DEVICE_NEEDS_RESET` and log the ring errors through the VM's
//!   rate-limited log: each entry, and the first refused register access
//!   (once per device), logged once or counted in the power-off summary
//!   of what the rate limit suppressed.
//! * A short fuzz campaign of the `virtqueue` family (random chains, broken
//!   chains, rings, registers, notify storms, resets against the
//!   virtio-console) on one vCPU: no hypervisor panic, no VM stop, no
//!   violation, and every `VQ` line the device brought out intact. With
//!   more vCPUs (`cargo run --release -p tests --bin fuzz -- --allow
//!   virtqueue --smp 2 ...`) a `VQ` line can come out split by a PL011 byte
//!   another vCPU stored at the same moment: the runtime passes the
//!   console's output to the VM's console line one byte at a time, not as
//!   one piece.

use std::time::Duration;

use qemu_runner::{RunConfig, RunReport};
use tests::e2e;
use tests::fuzz::{self, Campaign};

/// Cases whose chain or rings the device must refuse with
/// `DEVICE_NEEDS_RESET` (the names the guest prints).
const MUST_RESET: [&str; 30] = [
    "descriptor loop",
    "descriptor pointing at itself",
    "chain longer than the queue",
    "next outside the table",
    "head outside the table",
    "buffer outside RAM",
    "buffer in the GIC distributor",
    "buffer in the PL011",
    "buffer in the device's own window",
    "0xffffffff bytes at the end of RAM",
    "0xffffffff bytes outside RAM",
    "two 0xffffffff-byte buffers",
    "indirect table inside an indirect table",
    "loop inside an indirect table",
    "indirect table of length 0",
    "indirect table of 24 bytes",
    "indirect table longer than the queue",
    "indirect table outside RAM",
    "indirect table in the GIC distributor",
    "indirect descriptor with NEXT",
    "readable buffer after a writable one",
    "available index more than a queue ahead",
    "descriptor table in the GIC distributor",
    "available ring in the PL011",
    "used ring in the device's own window",
    "used ring outside RAM",
    "misaligned descriptor table",
    "queue size 0",
    "queue size 12",
    "queue size above QueueNumMax",
];

/// `hypervisor::vm::event_log::RatePolicy::BURST`.
const BURST: usize = 10;
/// `hypervisor::vm::event_log::RatePolicy::REFILL_SECONDS`.
const REFILL_SECONDS: u64 = 5;

fn run_virtio_bad(cpu: &str) -> RunReport {
    let config = RunConfig {
        cpu: cpu.to_string(),
        ..e2e::vms(2, &["virtio-bad,console=virtio"], Duration::from_secs(240))
    };
    e2e::run(&config)
}

/// The number after `word` in `line` (`... 42 word ...`).
fn number_before(line: &str, word: &str) -> Option<u64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .find(|pair| pair[1] == word)
        .and_then(|pair| pair[0].parse().ok())
}

fn check_virtio_bad(report: &RunReport) {
    e2e::assert_powered_off(report);
    let explain = report.explain();
    let console = report.console();
    assert!(
        console
            .lines()
            .any(|l| l.trim_end().ends_with("virtio-console: hello") && !l.contains("test-guest")),
        "the line sent through the virtio-console did not reach the console\n{explain}"
    );
    for case in MUST_RESET {
        let line = format!("test-guest: virtio-bad: {case}: needs reset");
        assert!(
            e2e::has_line(report, &line),
            "`{case}` did not end in DEVICE_NEEDS_RESET\n{explain}"
        );
    }
    let summary = e2e::line_index(report, "virtio-bad summary", |l| {
        l.contains("test-guest: virtio-bad:") && l.contains("ended in DEVICE_NEEDS_RESET")
    });
    let summary = console.lines().nth(summary).unwrap_or_default();
    let cases = number_before(summary, "cases,").expect("case count");
    let resets = number_before(summary, "ended").expect("reset count");
    assert_eq!(resets, MUST_RESET.len() as u64, "{explain}");
    // After every case the console came back: its line reached the console.
    let recovered = console
        .lines()
        .filter(|l| l.contains("virtio-bad: recovered after ") && !l.contains("test-guest"))
        .count() as u64;
    assert_eq!(recovered, cases, "a recovery line is missing\n{explain}");
    assert!(
        !console.contains("STALE"),
        "a request published before a reset came out after it\n{explain}"
    );

    // Counted exactly, logged at most once per entry and rate limited.
    assert_eq!(
        e2e::counter(report, 0, "virtio_needs_reset"),
        resets,
        "{explain}"
    );
    assert_eq!(
        e2e::counter(report, 0, "virtio_ring_errors"),
        resets,
        "{explain}"
    );
    let logged = report
        .transcript
        .log_lines_containing("device needs reset")
        .filter(|l| !l.contains("suppressed by the rate limit"))
        .count();
    let bound = BURST + (report.elapsed.as_secs() / REFILL_SECONDS) as usize + 1;
    assert!(
        logged >= 1 && logged as u64 <= resets && logged <= bound,
        "{logged} `device needs reset` log lines for {resets} entries (rate limit {bound})\n{explain}"
    );
    // The refused register accesses are one event (logged once per
    // device); with the ring errors they share the VM's device-access
    // budget, so each event is either logged or counted in the power-off
    // summary of what the rate limit suppressed.
    let access = e2e::log_count(report, "logged once per device");
    assert!(access <= 1, "{explain}");
    let suppressed = report
        .transcript
        .log_lines_containing("device access lines suppressed by the rate limit")
        .find_map(|l| number_before(l, "more"))
        .unwrap_or(0);
    assert_eq!(
        logged as u64 + access as u64 + suppressed,
        resets + 1,
        "every ring error and the first refused access logged or counted as suppressed, once\n\
         {explain}"
    );
}

#[test]
fn virtio_bad_on_max() {
    let report = run_virtio_bad(qemu_runner::DEFAULT_CPU);
    check_virtio_bad(&report);
}

#[test]
fn virtio_bad_on_cortex_a57() {
    let report = run_virtio_bad("cortex-a57");
    check_virtio_bad(&report);
}

#[test]
fn virtqueue_fuzz_campaign() {
    const SEEDS: u64 = 10;
    const OPS: u64 = 300;
    let campaign = Campaign {
        first_seed: 1,
        seeds: SEEDS,
        ops: OPS,
        per_boot: SEEDS,
        cpus: vec![qemu_runner::DEFAULT_CPU.to_string()],
        allow: fuzz::VIRTQUEUE_FAMILY.to_string(),
        // As `e2e_fuzz`: the timers family stays out of CI.
        deny: "timers".to_string(),
        // One vCPU: the runtime hands virtio-console output to the VM's
        // console byte by byte, so another vCPU's random PL011 stores can
        // land inside a `VQ` line and split it (a finding of multi-vCPU
        // campaigns, see the module doc); with one vCPU every check is
        // exact.
        smp: 1,
    };
    let boot = fuzz::boot(&campaign, qemu_runner::DEFAULT_CPU, 1, SEEDS);
    let mut tally = fuzz::Tally::default();
    fuzz::tally_boot(&campaign, &mut tally, &boot);
    let failures: String = tally
        .failures
        .iter()
        .map(|f| format!("seed {}: {}\n  rerun: {}\n", f.seed, f.what, f.rerun))
        .collect();
    let explain = match &boot.report {
        Some(report) => format!("{failures}{}{}", tally.figures(), report.explain()),
        None => format!("{failures}{}{:?}", tally.figures(), boot.error),
    };
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, SEEDS, "{explain}");
    let (sent, guaranteed, resets) = boot
        .summary
        .virtqueue
        .unwrap_or_else(|| panic!("no `FUZZ: virtqueue` totals\n{explain}"));
    assert!(
        guaranteed > 0 && sent >= guaranteed && resets > 0,
        "the family sent {sent} lines ({guaranteed} guaranteed) and caused {resets} resets\n\
         {explain}"
    );
    assert!(tally.vq_lines >= guaranteed, "{explain}");
    let report = boot.report.as_ref().expect("a report");
    assert!(report.transcript.system_off, "{explain}");
    assert_eq!(
        e2e::counter(report, 0, "virtio_needs_reset"),
        resets,
        "every reset the guest saw is counted\n{explain}"
    );
}
