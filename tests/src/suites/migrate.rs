//! `migrate`: live migration inside QEMU, of the test guest and of Linux.
//!
//! Each run boots the hypervisor with a running `src` and a waiting `dst`
//! (`start=0`) and types `migrate src dst limit=MS` on the console monitor
//! at a marker line (as `tests/tests/e2e_migrate.rs` does): the test
//! guest's `migrate` scenario (128 MiB, writing an 8 MiB region
//! continuously, `-cpu max`, a 30 ms downtime limit), and Debian's Linux
//! (2 vCPUs, 512 MiB, in its tmpfs md5 check, `-cpu max,pauth=off`: SVE and
//! SME state travel too; a 10 ms limit); and the test guest with memory
//! tagging (`--mte`, both VMs `mte=on`, `migrate-tags`: every page written
//! also gets tags, and every page copied carries them). The figures come from the
//! hypervisor's report: total time, downtime, pre-copy iterations, pages
//! copied and the throttle reached, three runs per guest without the
//! byte-for-byte check, medians, and how many runs exceeded the limit;
//! then one run with the check (`verify`): `downtime_verified` and its
//! `verify` part.

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, ConsoleInput, RunConfig};
use std::time::Duration;

use crate::measure::{config, hypervisor_features, median, report};

/// Runs per guest without the byte-for-byte check.
const RUNS: usize = 3;
/// Runs per guest with it.
const VERIFIED_RUNS: usize = 1;

/// A guest to migrate.
struct Case {
    name: &'static str,
    smp: u32,
    cpu: &'static str,
    mem_mib: u32,
    marker: &'static str,
    src: &'static str,
    dst: &'static str,
    /// The downtime limit, milliseconds.
    limit_ms: u32,
    /// Memory tagging on the machine and in both VMs (`--mte`, `mte=on`).
    mte: bool,
}

const CASES: [Case; 3] = [
    Case {
        name: "test_guest",
        smp: 2,
        cpu: qemu_runner::DEFAULT_CPU,
        mem_mib: 1024,
        marker: "[src] migrate: 1 vCPUs writing",
        src: "guest=migrate,cpus=0,name=src,expect=stopped",
        dst: "guest=migrate,cpus=1,name=dst,start=0",
        limit_ms: 30,
        mte: false,
    },
    Case {
        name: "test_guest_tagged",
        smp: 2,
        cpu: qemu_runner::DEFAULT_CPU,
        mem_mib: 1024,
        marker: "[src] migrate: 1 vCPUs writing",
        src: "guest=migrate,mte=on,cpus=0,name=src,expect=stopped,args=migrate-tags",
        dst: "guest=migrate,mte=on,cpus=1,name=dst,start=0",
        limit_ms: 30,
        mte: true,
    },
    Case {
        name: "linux_512m",
        smp: 4,
        cpu: "max,pauth=off",
        mem_mib: 2048,
        marker: "[src] LINUX-INIT: 2 CPUs online",
        src: "linux,cpus=0-1,mem=512,name=src,expect=stopped",
        dst: "linux,cpus=2-3,mem=512,name=dst,start=0",
        limit_ms: 10,
        mte: false,
    },
];

/// What one migration's report says.
struct Figures {
    total_us: f64,
    downtime_us: f64,
    /// `None` without the check.
    verify_us: Option<f64>,
    limit_us: f64,
    iterations: f64,
    pages: f64,
    throttle_percent: f64,
    /// The stage-2 features the hypervisor found: `(fwb, range_tlbi)`.
    features: (&'static str, &'static str),
}

/// Migrates `case` once, with the byte-for-byte check when `verify`.
fn migrate_once(case: &Case, verify: bool) -> Result<Figures, String> {
    let command = format!(
        "\x1dmigrate src dst limit={}{}\r",
        case.limit_ms,
        if verify { " verify" } else { "" }
    );
    let script = ConsoleScript::new()
        .then(case.marker, &command)
        .then("ok: migrating src to dst", "exit\r");
    let config = RunConfig {
        boot: Boot::Hypervisor,
        smp: case.smp,
        cpu: case.cpu.to_string(),
        mem_mib: case.mem_mib,
        mte: case.mte,
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
    eprintln!("migrate: {line}");
    let before = |unit: &str| -> Option<f64> {
        let (head, _) = line.split_once(unit)?;
        head.rsplit([' ', '(']).next()?.parse().ok()
    };
    let figures = Figures {
        total_us: before(" us, downtime").ok_or("no total")?,
        downtime_us: before(" us (").ok_or("no downtime")?,
        verify_us: before(" us, limit"),
        limit_us: before(" us, expected copy").ok_or("no limit")?,
        iterations: before(" pre-copy iterations").ok_or("no iterations")?,
        pages: before(" pages copied").ok_or("no pages")?,
        throttle_percent: before(" %)").ok_or("no throttle")?,
        features: hypervisor_features(run.hypervisor_log()),
    };
    if verify != figures.verify_us.is_some() {
        return Err(format!(
            "the check was {verify} but the report says: {line}"
        ));
    }
    Ok(figures)
}

/// Migrates `case` `runs` times; exits with status 1 when a run fails.
fn migrate_runs(case: &Case, verify: bool, runs: usize) -> Vec<Figures> {
    (1..=runs)
        .map(|round| {
            let name = case.name;
            let check = if verify { "verify" } else { "no verify" };
            eprintln!("migrate: {name} ({check}) run {round}/{runs}");
            migrate_once(case, verify).unwrap_or_else(|why| {
                eprintln!("migrate: {name}: the run failed: {why}");
                std::process::exit(1);
            })
        })
        .collect()
}

/// The median of `figure` over `runs`.
fn median_of(runs: &[Figures], figure: impl Fn(&Figures) -> f64) -> f64 {
    median(&mut runs.iter().map(figure).collect::<Vec<_>>())
}

/// Prints the figures; exits with status 1 when a run fails.
pub fn run() {
    for case in &CASES {
        let name = case.name;
        let plain = migrate_runs(case, false, RUNS);
        let verified = migrate_runs(case, true, VERIFIED_RUNS);
        let (fwb, range_tlbi) = plain[0].features;
        let limit_ms = case.limit_ms;
        config(
            &format!("migrate/{name}"),
            &[
                ("engine", &"qemu"),
                ("cpu", &case.cpu),
                ("fwb", &fwb),
                ("range_tlbi", &range_tlbi),
                ("smp", &case.smp),
                ("machine_mem_mib", &case.mem_mib),
                ("mte", &if case.mte { "on" } else { "off" }),
                ("src", &case.src),
                ("dst", &case.dst),
                ("downtime_limit_ms", &limit_ms),
                ("runs", &RUNS),
                ("verified_runs", &VERIFIED_RUNS),
            ],
        );
        let ms = |us: f64| us / 1000.0;
        report(
            &format!("migrate/{name}/total"),
            ms(median_of(&plain, |f| f.total_us)),
            "ms",
        );
        report(
            &format!("migrate/{name}/downtime"),
            ms(median_of(&plain, |f| f.downtime_us)),
            "ms",
        );
        report(
            &format!("migrate/{name}/downtime_max"),
            ms(plain.iter().map(|f| f.downtime_us).fold(0.0, f64::max)),
            "ms",
        );
        report(
            &format!("migrate/{name}/over_limit"),
            plain.iter().filter(|f| f.downtime_us > f.limit_us).count() as f64,
            "runs",
        );
        report(
            &format!("migrate/{name}/iterations"),
            median_of(&plain, |f| f.iterations),
            "count",
        );
        report(
            &format!("migrate/{name}/pages_copied"),
            median_of(&plain, |f| f.pages),
            "pages",
        );
        report(
            &format!("migrate/{name}/throttle"),
            median_of(&plain, |f| f.throttle_percent),
            "%",
        );
        report(
            &format!("migrate/{name}/downtime_verified"),
            ms(median_of(&verified, |f| f.downtime_us)),
            "ms",
        );
        report(
            &format!("migrate/{name}/verify"),
            ms(median_of(&verified, |f| f.verify_us.unwrap_or(0.0))),
            "ms",
        );
    }
}
