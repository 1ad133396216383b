//! End-to-end: several VMs on partitioned CPUs, each judged on its own
//! `[<name>] `-prefixed console lines (`qemu_runner::vm_verdict`).
//!
//! * Two test guests run the `memory` scenario at once, each on its own
//!   CPUs: both pass, each under its own VMID and backing.
//!
//! Each VM powers itself off (`[hv] vm<i> (<name>): powered off`); the
//! machine powers off after the last (`[hv] no VM left to run`).

use std::time::Duration;

use qemu_runner::vmspec::VmSpec;
use qemu_runner::{RunConfig, RunReport};

fn run(smp: u32, specs: &[&str], timeout: Duration) -> RunReport {
    let config = RunConfig {
        smp,
        echo: false,
        timeout,
        vms: specs
            .iter()
            .enumerate()
            .map(|(i, spec)| VmSpec::parse(spec, i).expect("valid spec"))
            .collect(),
        ..RunConfig::default()
    };
    qemu_runner::run(&config).unwrap_or_else(|error| panic!("could not run QEMU: {error}"))
}

/// The hypervisor's creation line of VM `vm`.
fn creation_line(report: &RunReport, vm: usize) -> String {
    let prefix = format!("vm{vm}: ");
    report
        .hypervisor_log()
        .iter()
        .find(|line| line.contains(&prefix) && line.contains(" vCPU(s), "))
        .unwrap_or_else(|| panic!("no creation line of vm{vm}\n{}", report.explain()))
        .clone()
}

/// The host address that backs VM `vm`'s RAM, from its creation line.
fn backing(report: &RunReport, vm: usize) -> u64 {
    let line = creation_line(report, vm);
    let hex = line
        .split("backed by 0x")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no backing in `{line}`"));
    u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad backing in `{line}`"))
}

fn log_has(report: &RunReport, text: &str) -> bool {
    report
        .hypervisor_log()
        .iter()
        .any(|line| line.contains(text))
}

#[test]
fn two_memory_guests_pass_side_by_side() {
    let report = run(
        4,
        &["memory,cpus=0-1,name=a", "memory,cpus=2-3,name=b"],
        Duration::from_secs(240),
    );
    assert!(report.passed(), "{}", report.explain());
    assert!(creation_line(&report, 0).contains("VMID 1"));
    assert!(creation_line(&report, 1).contains("VMID 2"));
    assert!(creation_line(&report, 1).contains("CPUs [2, 3]"));
    assert_ne!(backing(&report, 0), backing(&report, 1));
    for vm in [
        "vm0 (a): powered off",
        "vm1 (b): powered off",
        "no VM left to run",
    ] {
        assert!(log_has(&report, vm), "no `{vm}`\n{}", report.explain());
    }
    assert!(report.transcript.system_off, "{}", report.explain());
    // Both VMs' counters are reported.
    assert!(report.counters().get(0, "stage2_faults").is_some());
    assert!(report.counters().get(1, "stage2_faults").is_some());
}
