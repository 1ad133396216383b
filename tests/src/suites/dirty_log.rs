//! `dirty_log`: dirty logging inside QEMU with 1, 2 and 4 writer vCPUs,
//! eager splitting off and on and the initially-all-set mode, in the same
//! run (KVM's `dirty_log_perf_test` is the model).
//!
//! Each run boots the hypervisor on `-cpu max` with two VMs of the test
//! guest: `dirty-writer` with N vCPUs on CPUs 1..=N (each owning a share of
//! a 4 MiB region, which they first populate: RAM mapped with 2 MiB blocks)
//! and the control VM on CPU 0 running `dirty-log` with
//! `dirty-pattern=passes`: it enables logging on the writer's RAM slot
//! (128 MiB), then runs iterations (each writer vCPU writes every page of
//! its share once) and harvests after each (`tests/guest/src/dirty_log.rs`).
//! The figures come from the run's lines: `populate` (the writers' first
//! touch of the region), `enable` (the hypervisor's write-protect, and eager
//! split when on), `iter1` (iteration 1, right after enabling, timed by the
//! slowest writer vCPU: each first write to a page faults, and without eager
//! splitting the first write into a block also splits it), `iter_dirty` (the
//! median of the later iterations), `get` and `clear` (`DIRTY_LOG_GET` with
//! its re-protect and range flush, and `DIRTY_LOG_CLEAR` in the all-set
//! mode, as the control VM times them), and the writer's TLB invalidations
//! by kind. Five runs per setting, medians; `iter1_speedup_eager` is the
//! iteration-1 time without eager splitting over the time with it.
//!
//! QEMU runs each vCPU on a host thread: with more writer vCPUs than the
//! host has cores beside the control VM's, the writers take turns and the
//! times grow with N instead of staying flat.

use qemu_runner::RunReport;

use crate::control_pair::ControlPair;
use crate::measure::{median, report};

/// Runs per setting.
const RUNS: usize = 5;
/// Writer vCPU counts.
const WRITERS: [usize; 3] = [1, 2, 4];

/// The settings compared: name and the control VM's bootargs.
const SETTINGS: [(&str, &str); 3] = [
    (
        "eager_off",
        "dirty-pattern=passes dirty-mode=plain eager-split=0",
    ),
    (
        "eager_on",
        "dirty-pattern=passes dirty-mode=plain eager-split=0x200000",
    ),
    (
        "all_set",
        "dirty-pattern=passes dirty-mode=all-set eager-split=0x200000",
    ),
];

/// One run's figures.
#[derive(Default)]
struct Figures {
    populate_us: f64,
    enable_us: f64,
    iter1_us: f64,
    iter_us: Vec<f64>,
    get_us: Vec<f64>,
    clear_us: Vec<f64>,
    tlbi: Vec<(&'static str, u64)>,
}

fn pair(writers: usize, args: &str) -> ControlPair<'_> {
    ControlPair {
        args,
        peer_vcpus: writers as u32,
        ..ControlPair::new("dirty-log", "dirty-writer")
    }
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
    let populate = run
        .console()
        .lines()
        .find(|l| l.contains("dirty-log: the peer's "))
        .ok_or("no populate line")?
        .to_string();
    let mut figures = Figures {
        enable_us,
        populate_us: number_before(&populate, " pages in ", " us").ok_or("no populate time")?,
        ..Figures::default()
    };
    for line in run
        .console()
        .lines()
        .filter(|l| l.starts_with("[ctl] dirty-log: round "))
    {
        let (Some(get), Some(clear)) = (
            number_before(line, "; get ", " us"),
            number_before(line, "; clear ", " us"),
        ) else {
            continue;
        };
        figures.get_us.push(get);
        figures.clear_us.push(clear);
        let us = number_before(line, " writes in ", " us").ok_or("no round time")?;
        if line.starts_with("[ctl] dirty-log: round 1:") {
            figures.iter1_us = us;
        } else if !line.contains("(peer paused)") {
            figures.iter_us.push(us);
        }
    }
    if figures.get_us.is_empty() || figures.iter_us.is_empty() {
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
    for writers in WRITERS {
        let mut rates = Vec::new();
        for (name, args) in SETTINGS {
            let mut all = Figures::default();
            let (mut populate, mut enable, mut rate) = (Vec::new(), Vec::new(), Vec::new());
            for round in 1..=RUNS {
                eprintln!("dirty_log: {writers} vCPUs, {name}, run {round}/{RUNS}");
                let pair = pair(writers, args);
                let run = pair.run_passed().unwrap_or_else(|why| {
                    eprintln!("dirty_log: {name}: the run failed: {why}");
                    std::process::exit(1);
                });
                let f = figures(&run).unwrap_or_else(|why| {
                    eprintln!("dirty_log: {name}: {why}\n{}", run.explain());
                    std::process::exit(1);
                });
                if round == 1 {
                    pair.print_config(
                        &format!("dirty_log/{writers}vcpus/*/{name}"),
                        &run,
                        &[("runs", &RUNS)],
                    );
                }
                populate.push(f.populate_us);
                enable.push(f.enable_us);
                rate.push(f.iter1_us);
                all.iter_us.extend(f.iter_us);
                all.get_us.extend(f.get_us);
                all.clear_us.extend(f.clear_us);
                all.tlbi = f.tlbi;
            }
            let prefix = format!("dirty_log/{writers}vcpus");
            report(
                &format!("{prefix}/populate/{name}"),
                median(&mut populate),
                "us",
            );
            report(
                &format!("{prefix}/enable/{name}"),
                median(&mut enable),
                "us",
            );
            let r = median(&mut rate);
            report(&format!("{prefix}/iter1/{name}"), r, "us");
            report(
                &format!("{prefix}/iter_dirty/{name}"),
                median(&mut all.iter_us),
                "us",
            );
            report(
                &format!("{prefix}/get/{name}"),
                median(&mut all.get_us),
                "us",
            );
            if name == "all_set" {
                report(
                    &format!("{prefix}/clear/{name}"),
                    median(&mut all.clear_us),
                    "us",
                );
            }
            for (kind, count) in all.tlbi {
                report(&format!("{prefix}/{kind}/{name}"), count as f64, "ops");
            }
            rates.push(r);
        }
        report(
            &format!("dirty_log/{writers}vcpus/iter1_speedup_eager"),
            rates[0] / rates[1],
            "ratio",
        );
    }
}
