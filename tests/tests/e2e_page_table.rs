//! End-to-end: the `page-table` and `memslot-perf` scenarios, the stage-2
//! work the `page_table` and `memslot_perf` benchmarks time, checked.
//!
//! Two VMs of the test guest: `ctl` (`control=1`, CPU 0) drives `peer`
//! (CPU 1), which runs `toucher` and stores into guest pages on command.
//!
//! - `page-table` (on `-cpu max` with range TLBI, and on `cortex-a57`
//!   without): a 64 MiB slot is mapped page by page while logging, every
//!   page write-protected by a harvest and relaxed by a write, collapsed
//!   back into 2 MiB blocks after logging, split eagerly, and unmapped. The
//!   peer's counters must show each stage: 16,384 pages mapped at 4 KiB, 32
//!   collapses, 32 blocks split, and the TLBI kind of the CPU.
//! - `memslot-perf` with 64 slots: the slots are created, faulted in, moved
//!   while touched and not, and churned (moved away and back, deleted and
//!   re-created) while the peer stores into them; after each change the
//!   control VM reads the slot and checks which address and round wrote
//!   each page: a store through an address a slot has left, or a page that
//!   misses the stores after a change, fails the run.

use qemu_runner::RunReport;
use tests::control_pair::{ControlPair, peer_counter};

fn run(cpu: &str, control: &str, args: &str) -> RunReport {
    ControlPair {
        cpu,
        args,
        ..ControlPair::new(control, "toucher")
    }
    .boot()
}

fn check_page_table(report: &RunReport) {
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    for stage in [
        "create_4k",
        "write_protect",
        "update_4k",
        "collapse",
        "split",
        "unmap",
    ] {
        assert!(
            report.console().contains(&format!("page-table: {stage} ")),
            "no {stage} figure\n{explain}"
        );
    }
    // Stage 1 maps every page of the 64 MiB slot alone; stage 4 maps a
    // block over each of its 32 tables of pages.
    assert!(
        peer_counter(report, "mapped_pages_4k") >= 16384,
        "{explain}"
    );
    assert!(peer_counter(report, "stage2_collapses") >= 32, "{explain}");
    // Writes mark pages dirty in stages 1, 3 and after the split: three
    // times every page.
    assert!(
        peer_counter(report, "dirty_pages_marked") >= 3 * 16384,
        "{explain}"
    );
    // The second enable (stage 5) splits the 32 blocks stage 4 made.
    let split = report
        .hypervisor_log()
        .iter()
        .rfind(|line| line.contains("dirty logging on for slot 1"))
        .cloned()
        .unwrap_or_default();
    assert!(split.contains(" 32 blocks split"), "{split}\n{explain}");
}

#[test]
fn page_table_stages_on_cpu_max() {
    let report = run("max", "page-table", "");
    check_page_table(&report);
    assert!(
        peer_counter(&report, "tlbi_range") > 0,
        "{}",
        report.explain()
    );
}

#[test]
fn page_table_stages_on_cortex_a57() {
    let report = run("cortex-a57", "page-table", "");
    check_page_table(&report);
    assert_eq!(
        peer_counter(&report, "tlbi_range"),
        0,
        "{}",
        report.explain()
    );
    assert!(
        peer_counter(&report, "tlbi_vmalls12") > 0,
        "{}",
        report.explain()
    );
}

#[test]
fn memslots_churn_under_a_touching_vcpu() {
    let report = run("max", "memslot-perf", "slots=64");
    assert!(
        peer_counter(&report, "injected_aborts") > 0,
        "{}",
        report.explain()
    );
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    assert!(
        report
            .console()
            .contains("memslot-perf: 12 churn rounds checked"),
        "{explain}"
    );
    for figure in [
        "setup",
        "map",
        "touch",
        "move_inactive",
        "move_active",
        "delete",
    ] {
        assert!(
            report
                .console()
                .contains(&format!("memslot-perf: {figure} ")),
            "no {figure} figure\n{explain}"
        );
    }
}
