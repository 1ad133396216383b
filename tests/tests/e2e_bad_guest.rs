//! End-to-end: hostile and unusual guests leave the hypervisor alive and
//! answering correctly.
//!
//! * `bad-guest`: a guest that reads and writes an unmapped device address,
//!   loads 8 bytes at the last 4 bytes of the PL011's and the GIC
//!   distributor's windows and of a redistributor frame, and issues an
//!   unknown hypercall: the guest catches the injected aborts (with the right
//!   FAR) and sees `NOT_SUPPORTED`, the hypervisor logs and counts them, and
//!   still powers off in order (`[hv] system off`).
//! * `cpu-on-race`: vCPUs racing PSCI `CPU_ON` for the same target get one
//!   `SUCCESS` and `ALREADY_ON` for every other call, round after round.
//! * `flood`: 200 000 distinct unknown hypercalls, 20 000 injected aborts and
//!   5 000 refused device accesses: the hypervisor stays up, its log stays
//!   short (rate-limited), and its counters still count every event.

use std::time::Duration;

use qemu_runner::{RunReport, Scenario};
use tests::e2e;

fn run(scenario: Scenario, smp: u32) -> RunReport {
    e2e::run(&e2e::guest(
        scenario,
        qemu_runner::DEFAULT_CPU,
        smp,
        Duration::from_secs(180),
    ))
}

fn counter(report: &RunReport, name: &str) -> u64 {
    e2e::counter(report, 0, name)
}

#[test]
fn bad_guest_leaves_the_hypervisor_alive_and_reporting() {
    let report = run(Scenario::BadGuest, 2);
    e2e::assert_powered_off(&report);
    let explain = report.explain();

    let injected: Vec<&str> = report
        .transcript
        .log_lines_containing("injected data abort")
        .filter(|line| line.contains("outside every memslot and device"))
        .collect();
    assert!(
        injected.len() >= 2
            && injected
                .iter()
                .all(|line| line.to_lowercase().contains("0xa000000")),
        "expected the read and the write of 0xa000000 logged as injected aborts\n{explain}"
    );
    let unknown = report
        .transcript
        .log_lines_containing("unknown hypercall")
        .filter(|line| line.to_lowercase().contains("0xc60000ff") && line.contains("NOT_SUPPORTED"))
        .count();
    assert_eq!(
        unknown, 1,
        "expected the unknown hypercall 0xc60000ff logged once\n{explain}"
    );

    let straddles: Vec<&str> = report
        .transcript
        .log_lines_containing("runs past the end of the")
        .collect();
    assert!(
        straddles.len() == 3
            && straddles[0].contains("UART window at 0x9001000")
            && straddles[1].contains("GIC window at 0x8010000")
            && straddles[2].contains("GIC window at 0x80b0000"),
        "expected the 8-byte loads at the ends of the PL011 and GIC distributor windows and \
         of the first redistributor frame logged as injected aborts\n{explain}"
    );
    assert_eq!(counter(&report, "injected_aborts"), 5, "{explain}");
    assert_eq!(counter(&report, "unknown_hypercalls"), 1, "{explain}");
    assert!(counter(&report, "test_reports") >= 1, "{explain}");
}

#[test]
fn racing_cpu_on_calls_get_one_success_and_already_on() {
    // Three racers (vCPUs 0..2), one target (vCPU 3).
    let report = run(Scenario::CpuOnRace, 4);
    e2e::assert_powered_off(&report);
    assert!(
        report
            .console()
            .lines()
            .any(|l| l.starts_with("test-guest: cpu-on-race:") && l.contains("rounds, one SUCCESS")),
        "{}",
        report.explain()
    );
}

/// Hypervisor log lines the flood may cause, at most: the rate limit lets a
/// burst of 10 lines of each kind through, then one per 5 seconds
/// (`hypervisor::vm::event_log::RatePolicy`); three kinds flood (unknown
/// hypercalls, injected aborts, device accesses).
fn flood_line_bound(elapsed: Duration) -> usize {
    const BURST: usize = 10;
    const REFILL_SECONDS: u64 = 5;
    const FLOODING_KINDS: usize = 3;
    FLOODING_KINDS * (BURST + (elapsed.as_secs() / REFILL_SECONDS) as usize + 1)
}

#[test]
fn a_flooding_guest_gets_a_short_log_and_exact_counters() {
    let report = run(Scenario::Flood, 1);
    e2e::assert_powered_off(&report);
    let hypercalls = 200_000;
    let aborts = 20_000;
    let device_errors = 5_000;
    assert_eq!(
        counter(&report, "unknown_hypercalls"),
        hypercalls,
        "{}",
        report.explain()
    );
    assert_eq!(
        counter(&report, "injected_aborts"),
        aborts,
        "{}",
        report.explain()
    );
    // Lines about the flooded events, not the power-off summary of what the
    // rate limit dropped.
    let event_lines = |needle: &str| {
        report
            .transcript
            .log_lines_containing(needle)
            .filter(|l| !l.contains("suppressed by the rate limit"))
            .count() as u64
    };
    let logged = event_lines("unknown hypercall")
        + event_lines("injected data abort")
        + event_lines("UART read as zero");
    let bound = flood_line_bound(report.elapsed);
    assert!(
        (logged as usize) <= bound,
        "{logged} flood lines logged in {:?}, more than the rate limit allows ({bound})",
        report.elapsed,
    );
    let suppressed = counter(&report, "log_lines_suppressed");
    assert_eq!(
        logged + suppressed,
        hypercalls + aborts + device_errors,
        "every flooded event is either logged or counted as suppressed\n{}",
        report.explain()
    );
    // Boot banner, VM line, test report, power-off summaries and the rest.
    let all = report.hypervisor_log().len();
    assert!(
        all <= bound + 40,
        "{all} hypervisor log lines\n{}",
        report.explain()
    );
    assert!(
        report
            .transcript
            .log_lines_containing("suppressed by the rate limit")
            .any(|l| l.contains("unknown hypercall")),
        "no summary of the suppressed unknown-hypercall lines\n{}",
        report.explain()
    );
}
