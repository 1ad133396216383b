//! `dirty_log`: dirty logging inside QEMU, with eager splitting off and on
//! in the same run (KVM's `dirty_log_perf_test` is the model).
//!
//! Each run boots the hypervisor with two VMs of the test guest on
//! `-cpu max`: `dirty-writer` (1 vCPU, writing pseudo-random pages of a
//! 4 MiB region it mapped with 2 MiB blocks) and the control VM running
//! `dirty-log`, which enables logging on the writer's RAM slot (128 MiB),
//! then harvests round after round (`tests/guest/src/dirty_log.rs`). The
//! figures come from the run's lines: the hypervisor's enable time
//! (write-protect, and the eager split when on), the writer's write rate in
//! round 1 (the writes right after enabling: each first write to a page
//! faults, and without eager splitting the first write into a 2 MiB block
//! also splits it), the harvest time (`DIRTY_LOG_GET` as the control VM
//! times it, with the re-protect and its range flush), and the writer's TLB
//! invalidations by kind. Three runs per setting, medians;
//! `iter1_speedup_eager` is the round-1 write rate with eager splitting over
//! the rate without.

use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, RunConfig, RunReport};
use std::time::Duration;

use crate::measure::{median, report};

/// Runs per setting.
const RUNS: usize = 3;

/// The settings compared: name and the control VM's bootargs.
const SETTINGS: [(&str, &str); 2] = [
    ("eager_off", "dirty-mode=plain eager-split=0"),
    ("eager_on", "dirty-mode=plain eager-split=0x200000"),
];

/// One run's figures.
#[derive(Default)]
struct Figures {
    enable_us: f64,
    round1_writes_per_ms: f64,
    get_us: Vec<f64>,
    tlbi: Vec<(&'static str, u64)>,
}

fn boot(args: &str) -> Result<RunReport, String> {
    let config = RunConfig {
        boot: Boot::Hypervisor,
        smp: 2,
        timeout: Duration::from_secs(300),
        echo: false,
        vms: vec![
            VmSpec::parse(
                &format!("guest=dirty-log,cpus=0,control=1,name=ctl,args={args}"),
                0,
            )
            .map_err(|e| e.to_string())?,
            VmSpec::parse("guest=dirty-writer,cpus=1,name=peer,expect=stopped", 1)
                .map_err(|e| e.to_string())?,
        ],
        ..RunConfig::default()
    };
    let run = qemu_runner::run(&config).map_err(|e| format!("could not run: {e}"))?;
    if run.passed() {
        Ok(run)
    } else {
        Err(run.explain())
    }
}

/// The number after `key` and before the next space in `line`.
fn number_after(line: &str, key: &str) -> Option<f64> {
    line.split(key)
        .nth(1)?
        .split([' ', ',', ')'])
        .next()?
        .parse()
        .ok()
}

/// The number just before ` <unit>` in `line`, after `after`.
fn number_before(line: &str, after: &str, unit: &str) -> Option<f64> {
    let rest = line.split(after).nth(1)?;
    let head = rest.split(unit).next()?;
    head.rsplit(' ').next()?.parse().ok()
}

fn figures(run: &RunReport) -> Result<Figures, String> {
    let enable = run
        .hypervisor_log()
        .iter()
        .find(|l| l.contains("dirty logging on for slot 0"))
        .ok_or("no enable line")?;
    let enable_us = number_before(enable, " chunks in ", " us").ok_or("no enable time")?;
    let mut figures = Figures {
        enable_us,
        ..Figures::default()
    };
    for line in run
        .console()
        .lines()
        .filter(|l| l.starts_with("[ctl] dirty-log: round "))
    {
        let Some(get) = number_before(line, "; harvest ", " us") else {
            continue;
        };
        figures.get_us.push(get);
        if line.starts_with("[ctl] dirty-log: round 1:") {
            let writes = number_after(line, "; peer ").ok_or("no round-1 writes")?;
            let us = number_before(line, " writes in ", " us").ok_or("no round-1 time")?;
            figures.round1_writes_per_ms = writes / (us / 1000.0);
        }
    }
    if figures.get_us.is_empty() {
        return Err("no round lines".into());
    }
    for kind in ["tlbi_range", "tlbi_ipa", "tlbi_vmalle1", "tlbi_vmalls12"] {
        figures
            .tlbi
            .push((kind, run.counters().get(1, kind).unwrap_or(0)));
    }
    Ok(figures)
}

/// Prints the figures; exits with status 1 when a run fails.
pub fn run() {
    let mut rates = Vec::new();
    for (name, args) in SETTINGS {
        let mut enable = Vec::new();
        let mut rate = Vec::new();
        let mut get = Vec::new();
        let mut tlbi = Vec::new();
        for round in 1..=RUNS {
            eprintln!("dirty_log: {name} run {round}/{RUNS}");
            let run = boot(args).unwrap_or_else(|why| {
                eprintln!("dirty_log: {name}: the run failed: {why}");
                std::process::exit(1);
            });
            let f = figures(&run).unwrap_or_else(|why| {
                eprintln!("dirty_log: {name}: {why}\n{}", run.explain());
                std::process::exit(1);
            });
            enable.push(f.enable_us);
            rate.push(f.round1_writes_per_ms);
            get.extend(f.get_us);
            tlbi = f.tlbi;
        }
        report(
            &format!("dirty_log/1vcpus/enable/{name}"),
            median(&mut enable),
            "us",
        );
        let r = median(&mut rate);
        report(
            &format!("dirty_log/1vcpus/iter1_writes/{name}"),
            r,
            "per_ms",
        );
        report(
            &format!("dirty_log/1vcpus/get/{name}"),
            median(&mut get),
            "us",
        );
        for (kind, count) in tlbi {
            report(
                &format!("dirty_log/1vcpus/{kind}/{name}"),
                count as f64,
                "ops",
            );
        }
        rates.push(r);
    }
    report(
        "dirty_log/1vcpus/iter1_speedup_eager",
        rates[1] / rates[0],
        "ratio",
    );
}
