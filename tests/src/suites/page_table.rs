//! `page_table`: stage-2 page-table work inside QEMU, stage by stage, with
//! range TLBI (`-cpu max`, FEAT_TLBIRANGE) and without (`cortex-a57`) in the
//! same run (KVM's `kvm_page_table_test` is the model).
//!
//! Each run boots the hypervisor with two VMs of the test guest: the control
//! VM runs `page-table` against a `toucher` peer (`tests/guest/src/page_table.rs`
//! describes the stages on a 64 MiB slot): `create_4k` (16,384 first-touch
//! faults mapping pages while logging), `write_protect` (a harvest
//! re-protecting every page), `update_4k` (16,384 permission faults relaxed
//! on the read side), `collapse` (writes after logging map 2 MiB blocks over
//! the tables), `split` (enable with eager splitting of the 32 blocks),
//! `update_split` (the writes after it) and `unmap` (slot deletion). Guest
//! work is timed by the toucher, control calls by the control VM. Three runs
//! per CPU, medians, and the peer's TLB invalidations by kind from the last
//! run; `unmap_speedup_range` and `write_protect_speedup_range` are the
//! `cortex-a57` time over the `-cpu max` time.
//!
//! QEMU models no TLB latency and runs IPA-based TLBIs as no-ops, so the
//! times show the walks and the cost QEMU gives a whole-VMID flush (it
//! drops every cached translation, which the refaults after it pay), not
//! what a TLBI costs on hardware; the operation counts carry over.

use qemu_runner::RunReport;

use crate::control_pair::ControlPair;
use crate::measure::{median, report};

/// Runs per CPU.
const RUNS: usize = 3;
/// The CPUs compared: name in the figures, QEMU `-cpu`.
const CPUS: [(&str, &str); 2] = [("range", "max"), ("no_range", "cortex-a57")];
/// The stages the control VM prints, in order.
const STAGES: [&str; 8] = [
    "create_4k",
    "write_protect",
    "update_4k",
    "log_off",
    "collapse",
    "split",
    "update_split",
    "unmap",
];
/// TLBI kinds from the peer's counters.
const TLBI: [&str; 4] = ["tlbi_range", "tlbi_ipa", "tlbi_vmalle1", "tlbi_vmalls12"];

fn pair(cpu: &str) -> ControlPair<'_> {
    ControlPair {
        cpu,
        ..ControlPair::new("page-table", "toucher")
    }
}

/// The microseconds of `stage` from `[ctl] page-table: STAGE N us`.
fn stage_us(run: &RunReport, stage: &str) -> Option<f64> {
    let prefix = format!("[ctl] page-table: {stage} ");
    run.console().lines().find_map(|line| {
        line.strip_prefix(&prefix)?
            .strip_suffix(" us")?
            .parse()
            .ok()
    })
}

/// Prints the figures; exits with status 1 when a run fails.
pub fn run() {
    let mut medians = Vec::new();
    for (name, cpu) in CPUS {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); STAGES.len()];
        let mut tlbi = Vec::new();
        for round in 1..=RUNS {
            eprintln!("page_table: {name} run {round}/{RUNS}");
            let pair = pair(cpu);
            let run = pair.run_passed().unwrap_or_else(|why| {
                eprintln!("page_table: {name}: the run failed: {why}");
                std::process::exit(1);
            });
            if round == 1 {
                pair.print_config(&format!("page_table/{name}"), &run, &[("runs", &RUNS)]);
            }
            for (stage, times) in STAGES.iter().zip(&mut times) {
                let us = stage_us(&run, stage).unwrap_or_else(|| {
                    eprintln!("page_table: {name}: no {stage} figure\n{}", run.explain());
                    std::process::exit(1);
                });
                times.push(us);
            }
            tlbi = TLBI
                .iter()
                .map(|kind| (*kind, run.counters().get(1, kind).unwrap_or(0)))
                .collect();
        }
        let stage_medians: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
        for (stage, us) in STAGES.iter().zip(&stage_medians) {
            report(&format!("page_table/{name}/{stage}"), *us, "us");
        }
        for (kind, count) in tlbi {
            report(&format!("page_table/{name}/{kind}"), count as f64, "ops");
        }
        medians.push(stage_medians);
    }
    for stage in ["unmap", "write_protect"] {
        let i = STAGES.iter().position(|s| *s == stage).expect("a stage");
        report(
            &format!("page_table/{stage}_speedup_range"),
            medians[1][i] / medians[0][i],
            "ratio",
        );
    }
}
