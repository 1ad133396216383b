//! End-to-end: the test guest's `its` scenario, which drives a GICv3 ITS
//! (Interrupt Translation Service) and takes the LPIs it translates, on 1
//! and 4 CPUs.
//!
//! The guest finds the ITS in its device tree (`arm,gic-v3-its`, QEMU
//! `virt`'s at 0x0808_0000), checks `GITS_TYPER` (Physical, ITT entry size,
//! DeviceID and EventID bits), `GITS_PIDR2.ArchRev` 3 or 4 and
//! `GITS_CTLR.Quiescent`, gives the device and collection tables
//! (`GITS_BASER<n>`, 4 KiB pages, flat) and a command queue
//! (`GITS_CBASER`) memory, and enables LPIs on every redistributor (property
//! table, one pending table per CPU). Then, every LPI counted per CPU and
//! checked to arrive exactly once on the CPU its collection names, and
//! nowhere else: `MAPD`/`MAPC`/`MAPTI` and `INT` for DeviceIDs 0, 1 and
//! 65535; a CPU store to `GITS_TRANSLATER` (it carries DeviceID 0 on QEMU);
//! `MAPI`; `MOVI` to another CPU's collection; `MOVALL` of a pending LPI to
//! another redistributor; `DISCARD` (no translation, pending state gone);
//! `CLEAR` of a pending LPI; `INV`/`INVALL` after changing the property
//! table's enable bits; property-table priorities (the more urgent of two
//! pending LPIs acknowledged first); and `MAPTI`/`MAPC` with bad arguments
//! dropped without stalling the queue. Each check prints one
//! `test-guest: its: ...` line ([`ITS_CHECKS`]).
//!
//! * On QEMU alone (`Boot::Direct`, QEMU's own ITS): the reference, which
//!   passes.
//! * Under the hypervisor: the same scenario in a VM, against the
//!   hypervisor's virtual ITS. These tests FAIL until the hypervisor has a
//!   virtual ITS (the guest then finds no `arm,gic-v3-its` node and reports
//!   `RESULT: FAIL its: no arm,gic-v3-its node in the device tree`).

use std::time::Duration;

use qemu_runner::{Boot, RunConfig, RunReport, Scenario};
use tests::e2e;

/// The start of the line each check of the `its` scenario prints.
const ITS_CHECKS: [&str; 16] = [
    "test-guest: its: GITS_TYPER ",
    "test-guest: its: GITS_PIDR2.ArchRev ",
    "test-guest: its: tables in ",
    "test-guest: its: LPIs enabled on ",
    "test-guest: its: INT: 12 events of DeviceIDs 0, 1 and ",
    "test-guest: its: GITS_TRANSLATER: a CPU write of EventID 4 delivered LPI 8196: the write \
     carries DeviceID 0",
    "test-guest: its: MAPI: EventID 8292 of DeviceID 2 delivered as LPI 8292",
    "test-guest: its: MOVI: ",
    "test-guest: its: MOVALL: ",
    "test-guest: its: DISCARD: ",
    "test-guest: its: CLEAR: ",
    "test-guest: its: INV: ",
    "test-guest: its: INVALL: ",
    "test-guest: its: priorities: ",
    "test-guest: its: command errors: 4 MAPTI/MAPC with bad arguments dropped",
    "RESULT: PASS",
];

/// The `its` scenario on `smp` CPUs, booted as `boot` says.
fn run(boot: Boot, smp: u32) -> RunReport {
    e2e::run(&RunConfig {
        boot,
        ..e2e::guest(
            Scenario::Its,
            "max,pauth=off",
            smp,
            Duration::from_secs(120),
        )
    })
}

/// Asserts the run passed with every check's line once, on `smp` CPUs.
fn assert_every_check(report: &RunReport, smp: u32) {
    e2e::assert_passed(report);
    let explain = report.explain();
    let console = report.console();
    for check in ITS_CHECKS {
        let times = console.lines().filter(|l| l.contains(check)).count();
        assert_eq!(times, 1, "`{check}`\n{explain}");
    }
    assert!(
        console.contains(&format!(
            "test-guest: its: LPIs enabled on {smp} redistributors"
        )),
        "{explain}"
    );
    let invall = format!("test-guest: its: INVALL: one LPI in each of {smp} collections");
    assert!(console.contains(&invall), "{explain}");
    if smp > 1 {
        assert!(
            console.contains(
                "test-guest: its: MOVI: event 1 of DeviceID 0 moved from vcpu1 to \
                              collection 2: INT delivered on vcpu2"
            ),
            "{explain}"
        );
        assert!(
            console.contains(
                "test-guest: its: MOVALL: LPI 8201 pending at vcpu1's \
                              redistributor moved to vcpu2's and taken there once"
            ),
            "{explain}"
        );
    }
}

/// The reference: QEMU's own ITS, the guest at EL1 without the hypervisor.
#[test]
fn the_its_scenario_passes_on_qemu_alone_with_1_cpu() {
    assert_every_check(&run(Boot::Direct, 1), 1);
}

/// The reference on 4 CPUs: collections on every CPU, `MOVI` and `MOVALL`
/// between CPUs.
#[test]
fn the_its_scenario_passes_on_qemu_alone_with_4_cpus() {
    assert_every_check(&run(Boot::Direct, 4), 4);
}

/// Under the hypervisor, 1 vCPU. FAILS until the hypervisor has a virtual
/// ITS.
#[test]
fn the_its_scenario_passes_under_the_hypervisor_with_1_vcpu() {
    let report = run(Boot::Hypervisor, 1);
    assert_every_check(&report, 1);
    e2e::assert_powered_off(&report);
}

/// Under the hypervisor, 4 vCPUs. FAILS until the hypervisor has a virtual
/// ITS.
#[test]
fn the_its_scenario_passes_under_the_hypervisor_with_4_vcpus() {
    let report = run(Boot::Hypervisor, 4);
    assert_every_check(&report, 4);
    e2e::assert_powered_off(&report);
}
