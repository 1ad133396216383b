//! End-to-end: a bounded fuzz campaign in CI. The test guest's `fuzz`
//! scenario runs a fixed set of seeds on every vCPU under the hypervisor, on
//! `-cpu max,pauth=off` (LSE atomics, FEAT_TLBIRANGE) and `-cpu cortex-a57`
//! (neither), and the campaign must end with no hypervisor panic, no VM stop
//! and no violation of the answers a guest may rely on. The guest must also
//! have exercised what it claims to: aborts injected, hypercalls, SMCs and
//! system-register traps taken, interrupts delivered.
//!
//! The hypervisor's log stays bounded although the guest causes thousands of
//! injected aborts and refused device accesses: each vCPU logs the first
//! [`LINES_PER_KIND`] of each kind only.
//!
//! A failure prints each failing seed with the command that replays it.

use tests::fuzz::{self, Campaign};

const SEEDS: u64 = 60;
const OPS: u64 = 1000;
/// `hypervisor::log_budget::LINES_PER_KIND`.
const LINES_PER_KIND: usize = 16;

fn campaign(cpu: &str, first_seed: u64) {
    let campaign = Campaign {
        first_seed,
        seeds: SEEDS,
        ops: OPS,
        per_boot: SEEDS,
        cpus: vec![cpu.to_string()],
        allow: String::new(),
        smp: 4,
    };
    let boot = fuzz::boot(&campaign, cpu, first_seed, SEEDS);
    let mut tally = fuzz::Tally::default();
    fuzz::tally_boot(&campaign, &mut tally, &boot);
    let console = boot.report.as_ref().map_or("", |r| r.console());
    let failures: String = tally
        .failures
        .iter()
        .map(|f| format!("seed {}: {}\n  rerun: {}\n", f.seed, f.what, f.rerun))
        .collect();
    let explain = format!(
        "{failures}{}--- console (last 80 lines) ---\n{}",
        tally.figures(),
        console
            .lines()
            .rev()
            .take(80)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(tally.hv_panics, 0, "{explain}");
    assert_eq!(tally.vm_stops, 0, "{explain}");
    assert_eq!(tally.violations, 0, "{explain}");
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, SEEDS, "{explain}");
    assert_eq!(tally.ops, SEEDS * OPS * 4, "{explain}");
    assert!(tally.interrupts > 0, "no interrupt delivered\n{explain}");
    let report = boot.report.as_ref().expect("a report");
    assert!(report.transcript.system_off, "{explain}");
    let counter = |name: &str| report.counters().get(0, name).unwrap_or(0);
    for name in [
        "injected_aborts",
        "exits_hvc",
        "exits_smc",
        "exits_sysreg",
        "exits_dabt",
        "unknown_hypercalls",
    ] {
        assert!(counter(name) > 0, "STAT vm0 {name} is 0\n{explain}");
    }
    let log = &report.transcript.hypervisor_log;
    let injected = log.iter().filter(|l| l.contains("injected")).count();
    let device = log
        .iter()
        .filter(|l| l.contains("WARNING") && (l.contains("GIC") || l.contains("UART")))
        .count();
    assert!(
        injected <= 4 * LINES_PER_KIND && device <= 4 * LINES_PER_KIND,
        "{injected} injected-abort and {device} device lines for {} aborts\n{explain}",
        counter("injected_aborts")
    );
}

#[test]
fn fuzz_campaign_on_max() {
    campaign(qemu_runner::DEFAULT_CPU, 1);
}

#[test]
fn fuzz_campaign_on_cortex_a57() {
    campaign("cortex-a57", 1001);
}
