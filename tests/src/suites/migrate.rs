//! `migrate`: live migration inside QEMU, of the test guest and of Linux.
//!
//! Each run boots the hypervisor with a running `src` and a waiting `dst`
//! (`start=0`) and types `migrate src dst` on the console monitor at a
//! marker line (as `tests/tests/e2e_migrate.rs` does): the test guest's
//! `migrate` scenario (128 MiB, writing an 8 MiB region continuously,
//! `-cpu max`), and Debian's Linux (2 vCPUs, 512 MiB, in its tmpfs md5
//! check, `-cpu max,pauth=off`: SVE and SME state travel too). The
//! figures come from the hypervisor's report: total time, downtime and the
//! part of it spent on the byte-for-byte check, pre-copy iterations and
//! pages copied; three runs per guest, medians.

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, ConsoleInput, RunConfig};
use std::time::Duration;

use crate::measure::{config, hypervisor_features, median, report};

/// Runs per guest.
const RUNS: usize = 3;

/// A guest to migrate.
struct Case {
    name: &'static str,
    smp: u32,
    cpu: &'static str,
    mem_mib: u32,
    marker: &'static str,
    src: &'static str,
    dst: &'static str,
}

const CASES: [Case; 2] = [
    Case {
        name: "test_guest",
        smp: 2,
        cpu: qemu_runner::DEFAULT_CPU,
        mem_mib: 1024,
        marker: "[src] migrate: 1 vCPUs writing",
        src: "guest=migrate,cpus=0,name=src,expect=stopped",
        dst: "guest=migrate,cpus=1,name=dst,start=0",
    },
    Case {
        name: "linux_512m",
        smp: 4,
        cpu: "max,pauth=off",
        mem_mib: 2048,
        marker: "[src] LINUX-INIT: 2 CPUs online",
        src: "linux,cpus=0-1,mem=512,name=src,expect=stopped",
        dst: "linux,cpus=2-3,mem=512,name=dst,start=0",
    },
];

/// The stage-2 features the hypervisor found: `(fwb, range_tlbi)`.
type Features = (&'static str, &'static str);

/// The report's numbers: total, downtime, verify (us), iterations, pages;
/// and the features of the run.
fn migrate_once(case: &Case) -> Result<([f64; 5], Features), String> {
    let script = ConsoleScript::new()
        .then(case.marker, "\x1dmigrate src dst\r")
        .then("ok: migrating src to dst", "exit\r");
    let config = RunConfig {
        boot: Boot::Hypervisor,
        smp: case.smp,
        cpu: case.cpu.to_string(),
        mem_mib: case.mem_mib,
        timeout: Duration::from_secs(300),
        echo: false,
        input: ConsoleInput::Script(script),
        vms: vec![
            VmSpec::parse(case.src, 0).map_err(|e| e.to_string())?,
            VmSpec::parse(case.dst, 1).map_err(|e| e.to_string())?,
        ],
        ..RunConfig::default()
    };
    let run = qemu_runner::run(&config).map_err(|e| format!("could not run: {e}"))?;
    if !run.passed() {
        return Err(run.explain());
    }
    let line = run
        .hypervisor_log()
        .iter()
        .find(|l| l.contains(": migrated: "))
        .ok_or("no migration report")?
        .clone();
    let before = |unit: &str| -> Option<f64> {
        let head = line.split(unit).next()?;
        head.rsplit([' ', '(']).next()?.parse().ok()
    };
    let total = before(" us, downtime").ok_or("no total")?;
    let downtime = before(" us (verify").ok_or("no downtime")?;
    let verify = before(" us), ").ok_or("no verify time")?;
    let iterations = before(" pre-copy iterations").ok_or("no iterations")?;
    let pages = before(" pages copied").ok_or("no pages")?;
    Ok((
        [total, downtime, verify, iterations, pages],
        hypervisor_features(run.hypervisor_log()),
    ))
}

/// Prints the figures; exits with status 1 when a run fails.
pub fn run() {
    for case in &CASES {
        let name = case.name;
        let mut samples: [Vec<f64>; 5] = Default::default();
        for round in 1..=RUNS {
            eprintln!("migrate: {name} run {round}/{RUNS}");
            let (figures, (fwb, range_tlbi)) = migrate_once(case).unwrap_or_else(|why| {
                eprintln!("migrate: {name}: the run failed: {why}");
                std::process::exit(1);
            });
            if round == 1 {
                config(
                    &format!("migrate/{name}"),
                    &[
                        ("engine", &"qemu"),
                        ("cpu", &case.cpu),
                        ("fwb", &fwb),
                        ("range_tlbi", &range_tlbi),
                        ("smp", &case.smp),
                        ("machine_mem_mib", &case.mem_mib),
                        ("src", &case.src),
                        ("dst", &case.dst),
                        ("runs", &RUNS),
                    ],
                );
            }
            for (sample, value) in samples.iter_mut().zip(figures) {
                sample.push(value);
            }
        }
        let [total, downtime, verify, iterations, pages] = &mut samples;
        report(
            &format!("migrate/{name}/total"),
            median(total) / 1000.0,
            "ms",
        );
        report(
            &format!("migrate/{name}/downtime"),
            median(downtime) / 1000.0,
            "ms",
        );
        report(
            &format!("migrate/{name}/verify"),
            median(verify) / 1000.0,
            "ms",
        );
        report(
            &format!("migrate/{name}/iterations"),
            median(iterations),
            "count",
        );
        report(
            &format!("migrate/{name}/pages_copied"),
            median(pages),
            "pages",
        );
    }
}
