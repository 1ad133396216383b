//! The end-to-end tests' kit (`tests/tests/e2e_*.rs`): boot a configuration
//! under QEMU, find the lines a test waits for in what it printed, and
//! assert that the machine powered off cleanly.
//!
//! Every boot goes through [`run`], which silences the live console (the
//! report keeps all of it) and turns a run that could not be made (no QEMU
//! and no root to install it, a build error, a bad option) into a panic
//! naming the runner's error: an end-to-end test fails, it never skips. A
//! run that was made but failed is a report whose verdict says so; the
//! assertions here print [`RunReport::explain`] (verdict, QEMU command line,
//! whole console, QEMU's stderr) with every failure.
//!
//! Configurations: [`guest`] for the test guest alone in one VM, [`vms`] for
//! a payload of several VMs from `--vm` specs, [`with_script`] to wait for
//! lines on the console while the run goes and type into it when they come.
//! Lines, after the run: [`has_line`], [`has_line_where`] and [`line_index`]
//! over the console, [`log_position`] and [`log_count`] over the hypervisor's
//! log, [`counter`] for a `STAT` line. Endings: [`assert_passed`] and
//! [`assert_powered_off`].

use std::time::Duration;

use qemu_runner::console_script::ConsoleScript;
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, ConsoleInput, RunConfig, RunReport, Scenario};

/// Boots `config` with the live console off and returns what the run
/// produced. Panics, naming the runner's error, when the run could not be
/// made at all.
pub fn run(config: &RunConfig) -> RunReport {
    let config = RunConfig {
        echo: false,
        ..config.clone()
    };
    qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"))
}

/// The test guest running `scenario` alone under the hypervisor, one vCPU
/// per CPU of an `smp`-CPU machine of QEMU CPU model `cpu`, killed after
/// `timeout`.
pub fn guest(scenario: Scenario, cpu: &str, smp: u32, timeout: Duration) -> RunConfig {
    RunConfig {
        boot: Boot::Hypervisor,
        scenario,
        smp,
        cpu: cpu.to_string(),
        timeout,
        echo: false,
        ..RunConfig::default()
    }
}

/// A payload of several VMs on an `smp`-CPU machine, one per `--vm` spec
/// (`specs[i]` is VM `i`), killed after `timeout`. Panics on a spec that
/// does not parse: it is the test's own text.
pub fn vms(smp: u32, specs: &[&str], timeout: Duration) -> RunConfig {
    RunConfig {
        smp,
        timeout,
        echo: false,
        vms: specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                VmSpec::parse(spec, i).unwrap_or_else(|error| panic!("spec `{spec}`: {error}"))
            })
            .collect(),
        ..RunConfig::default()
    }
}

/// `config` typing into the console as `script` says: each step waits for
/// its text on the console, then sends its bytes (a run whose script never
/// saw a step's text fails, naming it).
pub fn with_script(config: RunConfig, script: ConsoleScript) -> RunConfig {
    RunConfig {
        input: ConsoleInput::Script(script),
        ..config
    }
}

/// VM `vm`'s `STAT vm<vm> <name>` counter; panics when the run printed none.
pub fn counter(report: &RunReport, vm: u32, name: &str) -> u64 {
    report
        .counters()
        .get(vm, name)
        .unwrap_or_else(|| panic!("no `STAT vm{vm} {name}` line\n{}", report.explain()))
}

/// Whether a console line contains `needle`.
pub fn has_line(report: &RunReport, needle: &str) -> bool {
    report.console().lines().any(|line| line.contains(needle))
}

/// Whether `test` accepts a console line.
pub fn has_line_where(report: &RunReport, test: impl Fn(&str) -> bool) -> bool {
    report.console().lines().any(test)
}

/// The index of the first console line that `test` accepts, trimmed of
/// surrounding whitespace; panics, saying `what` was missing, when there is
/// none.
pub fn line_index(report: &RunReport, what: &str, test: impl Fn(&str) -> bool) -> usize {
    report
        .console()
        .lines()
        .position(|line| test(line.trim()))
        .unwrap_or_else(|| panic!("no {what} line\n{}", report.explain()))
}

/// The index of the first hypervisor log line containing `text`; panics
/// when there is none.
pub fn log_position(report: &RunReport, text: &str) -> usize {
    report
        .hypervisor_log()
        .iter()
        .position(|line| line.contains(text))
        .unwrap_or_else(|| panic!("no `{text}` in the hypervisor's log\n{}", report.explain()))
}

/// How many hypervisor log lines contain `text`.
pub fn log_count(report: &RunReport, text: &str) -> usize {
    report
        .hypervisor_log()
        .iter()
        .filter(|line| line.contains(text))
        .count()
}

/// Asserts that the run passed: every guest's verdict, no hypervisor panic,
/// QEMU's clean exit.
pub fn assert_passed(report: &RunReport) {
    assert!(report.passed(), "{}", report.explain());
}

/// Asserts a clean power-off: the run passed, the hypervisor printed
/// `[hv] system off`, did not panic, and stopped no VM.
pub fn assert_powered_off(report: &RunReport) {
    assert_passed(report);
    let explain = report.explain();
    assert!(
        report.transcript.system_off,
        "no `[hv] system off`\n{explain}"
    );
    assert!(report.transcript.panic.is_none(), "{explain}");
    assert_eq!(log_count(report, "stopping the VM"), 0, "{explain}");
}
