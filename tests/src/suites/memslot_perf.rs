//! `memslot_perf`: memslot changes and faults with many slots inside QEMU,
//! while a vCPU touches the slots (KVM's `memslot_perf_test` is the model).
//!
//! Each run boots the hypervisor with two VMs of the test guest on
//! `-cpu max`: the control VM runs `memslot-perf` against a `toucher` peer
//! (`tests/guest/src/memslot_perf.rs`): N slots of 2 pages side by side are
//! created (`setup`, per slot), faulted in by the peer (`map`, per page: each
//! fault looks its slot up among N), touched again mapped (`touch`), moved
//! away and back while the peer touches other slots (`move_inactive`) and
//! the same slots (`move_active`), churned with checks (see the scenario),
//! and deleted (`delete`, per slot). One run per slot count (16, 512,
//! 4096); the churn check must pass in each.

use qemu_runner::RunReport;
use std::time::Duration;

use crate::control_pair::ControlPair;
use crate::measure::report;

/// Slot counts measured.
const SLOTS: [u32; 3] = [16, 512, 4096];
/// The figures the control VM prints, with their units.
const FIGURES: [(&str, &str); 6] = [
    ("setup", "ns_per_slot"),
    ("map", "ns_per_page"),
    ("touch", "ns_per_page"),
    ("move_inactive", "us"),
    ("move_active", "us"),
    ("delete", "ns_per_slot"),
];

fn pair(args: &str) -> ControlPair<'_> {
    ControlPair {
        args,
        timeout: Duration::from_secs(600),
        ..ControlPair::new("memslot-perf", "toucher")
    }
}

/// The value of `figure` from `[ctl] memslot-perf: FIGURE N UNIT`.
fn figure(run: &RunReport, figure: &str, unit: &str) -> Option<f64> {
    let prefix = format!("[ctl] memslot-perf: {figure} ");
    let suffix = format!(" {unit}");
    run.console().lines().find_map(|line| {
        line.strip_prefix(&prefix)?
            .strip_suffix(&suffix)?
            .parse()
            .ok()
    })
}

/// Prints the figures; exits with status 1 when a run fails.
pub fn run() {
    for slots in SLOTS {
        eprintln!("memslot_perf: {slots} slots");
        let args = format!("slots={slots}");
        let pair = pair(&args);
        let run = pair.run_passed().unwrap_or_else(|why| {
            eprintln!("memslot_perf: {slots} slots: the run failed: {why}");
            std::process::exit(1);
        });
        pair.print_config(&format!("memslot_perf/{slots}"), &run, &[("runs", &1)]);
        for (name, unit) in FIGURES {
            let value = figure(&run, name, unit).unwrap_or_else(|| {
                eprintln!("memslot_perf: no {name} figure\n{}", run.explain());
                std::process::exit(1);
            });
            report(&format!("memslot_perf/{slots}/{name}"), value, unit);
        }
    }
}
