//! End-to-end: a bounded fuzz campaign in CI. The test guest's `fuzz`
//! scenario runs a fixed set of seeds on every vCPU under the hypervisor, on
//! `-cpu max,pauth=off` (LSE atomics, FEAT_TLBIRANGE) and `-cpu cortex-a57`
//! (neither), and the campaign must end with no hypervisor panic, no VM stop
//! and no violation of the answers a guest may rely on. The guest must also
//! have exercised what it claims to: aborts injected, hypercalls, SMCs and
//! system-register traps taken, interrupts delivered.
//!
//! The hypervisor's log stays bounded although the guest causes thousands of
//! injected aborts, refused device accesses and unknown hypercalls: every
//! guest-driven line goes through the VM's rate-limited event log (a burst of
//! [`BURST`] lines of each kind, then one per [`REFILL_SECONDS`]), and what it
//! suppressed is summed up at power-off.
//!
//! The default mix includes the `icc` family (random GIC CPU interface
//! values within their fields) and the `timers` family (both timers armed,
//! left to fire with IRQs masked, then disabled, masked or reprogrammed: a
//! timer interrupt taken while its timer no longer asserts it is a
//! violation).
//!
//! A short campaign runs on a GICv2 host too (`gic-version=2`): the VM gets
//! a virtual GICv2, and the guest's model checks the GICv2 distributor, the
//! memory-mapped CPU interface (`icc` over `GICC`) and the missing GICv3
//! system registers (their accesses must be UNDEFINED).
//!
//! The `its` family alone (`fuzz-allow=its-only`, 4 vCPUs on `max`) runs a
//! short campaign of its own: random ITS commands from vCPU 0 and register
//! noise from the others, with the LPIs delivered on vCPU 0 checked
//! against the family's model of the mappings; it must be clean and must
//! have checked LPIs (`FUZZ: its lpis=L vcpu0=C required=R`).
//!
//! A failure prints each failing seed with the command that replays it.

use qemu_runner::qemu::GicVersion;
use tests::fuzz::{self, Campaign};

const SEEDS: u64 = 60;
const OPS: u64 = 1000;
/// `hypervisor::vm::event_log::RatePolicy::BURST`.
const BURST: usize = 10;
/// `hypervisor::vm::event_log::RatePolicy::REFILL_SECONDS`.
const REFILL_SECONDS: u64 = 5;
/// `hypervisor::vm::event_log::EventKind::ALL.len()`.
const KINDS: usize = 6;
/// Hypervisor log lines that are not guest-driven events: boot banner, VM
/// start, test report, power-off summaries and the rest.
const FIXED_LINES: usize = 40;

fn campaign(cpu: &str, first_seed: u64) {
    let campaign = Campaign {
        first_seed,
        seeds: SEEDS,
        ops: OPS,
        per_boot: SEEDS,
        cpus: vec![cpu.to_string()],
        allow: String::new(),
        deny: String::new(),
        smp: 4,
    };
    let boot = fuzz::boot(&campaign, cpu, first_seed, SEEDS);
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
    // Every kind may log its burst, then one line per refill period.
    let bound = KINDS * (BURST + (report.elapsed.as_secs() / REFILL_SECONDS) as usize + 1);
    let log = report.hypervisor_log();
    let summaries = log
        .iter()
        .filter(|l| l.contains("suppressed by the rate limit"))
        .count();
    assert!(
        log.len() <= bound + FIXED_LINES,
        "{} hypervisor log lines in {:?} for {} injected aborts and {} unknown hypercalls \
         (rate limit: {bound} + {FIXED_LINES})\n{explain}",
        log.len(),
        report.elapsed,
        counter("injected_aborts"),
        counter("unknown_hypercalls"),
    );
    if counter("log_lines_suppressed") > 0 {
        assert!(
            summaries > 0,
            "lines were suppressed but no power-off summary says so\n{explain}"
        );
    }
}

#[test]
fn fuzz_campaign_on_max() {
    campaign(qemu_runner::DEFAULT_CPU, 1);
}

#[test]
fn fuzz_campaign_on_cortex_a57() {
    campaign("cortex-a57", 1001);
}

/// Seeds of the GICv2 campaign, on each of two CPU models.
const GICV2_SEEDS: u64 = 10;
/// Operations per seed and vCPU of the GICv2 campaign.
const GICV2_OPS: u64 = 1000;

/// Runs `campaign` on a GICv2 host; returns its tally and what explains a
/// failure: the failing seeds with their reruns, the figures, and the whole
/// console of every boot that did not end clean.
fn run_on_gicv2(campaign: &Campaign) -> (fuzz::Tally, String) {
    let mut consoles = Vec::new();
    let tally = fuzz::run_on(campaign, &[GicVersion::V2], |boot, _| match &boot.report {
        Some(report) if report.passed() && boot.summary.violation_lines.is_empty() => {}
        Some(report) => consoles.push(report.explain()),
        None => consoles.push(format!("{:?}", boot.error)),
    });
    let failures: String = tally
        .failures
        .iter()
        .map(|f| format!("seed {}: {}\n  rerun: {}\n", f.seed, f.what, f.rerun))
        .collect();
    let explain = format!("{failures}{}{}", tally.figures(), consoles.join("\n"));
    (tally, explain)
}

/// A short campaign on a GICv2 host: `max,pauth=off` and `cortex-a57`, one
/// boot each, 4 vCPUs. Clean, every operation run, interrupts delivered.
#[test]
fn fuzz_campaign_on_gicv2() {
    let campaign = Campaign {
        first_seed: 2001,
        seeds: 2 * GICV2_SEEDS,
        ops: GICV2_OPS,
        per_boot: GICV2_SEEDS,
        cpus: vec![qemu_runner::DEFAULT_CPU.to_string(), "cortex-a57".into()],
        allow: String::new(),
        deny: String::new(),
        smp: 4,
    };
    let (tally, explain) = run_on_gicv2(&campaign);
    assert_eq!(tally.hv_panics, 0, "{explain}");
    assert_eq!(tally.vm_stops, 0, "{explain}");
    assert_eq!(tally.violations, 0, "{explain}");
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, 2 * GICV2_SEEDS, "{explain}");
    assert_eq!(tally.ops, 2 * GICV2_SEEDS * GICV2_OPS * 4, "{explain}");
    assert!(tally.interrupts > 0, "no interrupt delivered\n{explain}");
}

/// `gicv2-sgi-pend` on one vCPU of a GICv2 host (another vCPU could send
/// SGIs meanwhile): writes of the SGIs' bits in `GICD_ISPENDR0` and
/// `GICD_ICPENDR0` must be ignored. Seed 1 found the distributor setting and
/// clearing SGIs through them.
#[test]
fn gicv2_sgi_pending_bits_ignore_writes() {
    let campaign = Campaign {
        first_seed: 1,
        seeds: 3,
        ops: GICV2_OPS,
        per_boot: 3,
        cpus: vec![qemu_runner::DEFAULT_CPU.to_string()],
        allow: "gicv2-sgi-pend".into(),
        deny: String::new(),
        smp: 1,
    };
    let (tally, explain) = run_on_gicv2(&campaign);
    assert_eq!(tally.violations, 0, "{explain}");
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, 3, "{explain}");
}

/// `icc-wide`: a binary point written with bits above its 3-bit field.
/// QEMU 7.2's virtual CPU interface clamps the value to the minimum before
/// it drops the high bits (`icv_bpr_write` -> `write_vbpr`), so
/// `ICC_BPR1_EL1 = 8` would leave `ICH_VMCR_EL2.VBPR1` at 0 and the next
/// group-1 acknowledge abort QEMU (`icv_gprio_mask: Assertion 'bpr > 0'
/// failed`), taking every VM with it; seed 5 reaches it within its first
/// operations. On QEMU the hypervisor keeps `ICH_VMCR_EL2.VCBPR` set and
/// traps the common CPU interface registers so the guest cannot clear it
/// (`hypervisor::devices::vgic::cpu_interface`): the binary-point writes are
/// then harmless, and the campaign must end clean.
#[test]
fn icc_wide_binary_points_do_not_abort_the_machine() {
    let campaign = Campaign {
        first_seed: 5,
        seeds: 1,
        ops: OPS,
        per_boot: 1,
        cpus: vec![qemu_runner::DEFAULT_CPU.to_string()],
        allow: "icc-wide".into(),
        deny: String::new(),
        smp: 4,
    };
    let boot = fuzz::boot(&campaign, qemu_runner::DEFAULT_CPU, 5, 1);
    let mut tally = fuzz::Tally::default();
    fuzz::tally_boot(&campaign, &mut tally, &boot);
    let explain = match &boot.report {
        Some(report) => format!("{}{}", tally.figures(), report.explain()),
        None => format!("{}{:?}", tally.figures(), boot.error),
    };
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, 1, "{explain}");
}

/// Seeds and operations of the `its-only` campaign (one boot, ~10 s).
const ITS_SEEDS: u64 = 4;
const ITS_OPS: u64 = 400;
/// LPIs the `its-only` campaign must at least have required on vCPU 0 (it
/// requires about 350).
const ITS_REQUIRED: u64 = 100;

/// `its-only` on 4 vCPUs: the ITS commands, `GITS_*` accesses and LPIs of
/// the `its` family, with the other vCPUs adding noise. Clean, and LPIs
/// delivered on vCPU 0 and checked against the model (the check is not
/// vacuous: many were required to arrive exactly once).
#[test]
fn its_family_delivers_lpis_as_modelled() {
    let campaign = Campaign {
        first_seed: 1,
        seeds: ITS_SEEDS,
        ops: ITS_OPS,
        per_boot: ITS_SEEDS,
        cpus: vec![qemu_runner::DEFAULT_CPU.to_string()],
        allow: "its-only".into(),
        deny: String::new(),
        smp: 4,
    };
    let boot = fuzz::boot(&campaign, qemu_runner::DEFAULT_CPU, 1, ITS_SEEDS);
    let mut tally = fuzz::Tally::default();
    fuzz::tally_boot(&campaign, &mut tally, &boot);
    let failures: String = tally
        .failures
        .iter()
        .map(|f| format!("seed {}: {}\n  rerun: {}\n", f.seed, f.what, f.rerun))
        .collect();
    let explain = match &boot.report {
        Some(report) => format!(
            "{failures}{}its: {:?}\n{}",
            tally.figures(),
            boot.summary.its,
            report.explain()
        ),
        None => format!("{failures}{}{:?}", tally.figures(), boot.error),
    };
    assert_eq!(tally.violations, 0, "{explain}");
    assert!(tally.clean(), "{explain}");
    assert_eq!(tally.seeds, ITS_SEEDS, "{explain}");
    assert_eq!(tally.ops, ITS_SEEDS * ITS_OPS * 4, "{explain}");
    assert!(boot.summary.its.is_some(), "no FUZZ: its line\n{explain}");
    assert!(
        tally.its_required >= ITS_REQUIRED,
        "only {} LPIs required on vCPU 0\n{explain}",
        tally.its_required
    );
    assert!(tally.its_checked >= tally.its_required, "{explain}");
    // The other vCPUs never unmask IRQs: every LPI came to vCPU 0.
    assert_eq!(tally.its_lpis, tally.its_checked, "{explain}");
}
