//! End-to-end: dirty logging in the hypervisor, checked like KVM's
//! `dirty_log_test`.
//!
//! Two VMs of the test guest: `ctl` (`control=1`, CPU 0) runs the
//! `dirty-log` scenario against `peer` (CPU 1), which runs `dirty-writer`:
//! it writes and reads random pages of a 4 MiB region of its RAM while the
//! control VM turns dirty logging on for the peer's RAM slot and, round
//! after round, harvests the log and reads the region: a page whose content
//! changed and that was not reported (in that round, or in the next one when
//! the change followed the harvest) fails the run; a last round with the
//! peer paused must report every change. Then logging goes off and the
//! peer's later write faults collapse its page tables back into blocks.
//!
//! Variants: three writer vCPUs, each on its own share of the region,
//! writing it in passes the control VM starts (manual protection, eager
//! split), harvest-and-clear, manual protection with eager splitting in
//! 2 MiB chunks, manual protection with bitmaps that start all set and 64 KiB
//! chunks, on `-cpu max` (range TLBI); and on `cortex-a57` (no range TLBI:
//! whole-VMID invalidations). The peer's counters show what the engine did:
//! pages mapped one by one while logging, pages marked dirty by faults,
//! tables collapsed afterwards, and the TLBI kind of the CPU.

use qemu_runner::RunReport;
use tests::control_pair::{ControlPair, peer_counter};

fn run(cpu: &str, args: &str) -> RunReport {
    run_with_writers(cpu, args, 1)
}

/// A run whose writer has `writers` vCPUs, on CPUs `1..=writers`.
fn run_with_writers(cpu: &str, args: &str, writers: u32) -> RunReport {
    ControlPair {
        cpu,
        args,
        peer_vcpus: writers,
        ..ControlPair::new("dirty-log", "dirty-writer")
    }
    .boot()
}

/// The split figures of the enable line: (blocks split, chunks).
fn split(report: &RunReport) -> (u64, u64) {
    let line = report
        .hypervisor_log()
        .iter()
        .find(|line| line.contains("dirty logging on for slot 0"))
        .unwrap_or_else(|| panic!("no enable line\n{}", report.explain()));
    let number = |before: &str| -> u64 {
        line.split(before)
            .next()
            .unwrap_or_default()
            .rsplit(' ')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (number(" blocks split"), number(" chunks"))
}

fn check(report: &RunReport, eager: bool) {
    let explain = report.explain();
    assert!(report.passed(), "{explain}");
    assert!(
        report
            .console()
            .contains("dirty-log: every changed page was reported"),
        "{explain}"
    );
    assert!(report.console().contains("(peer paused)"), "{explain}");
    // While logging, writes mark pages; without eager splitting a write
    // into a write-protected block maps that page alone.
    assert!(peer_counter(report, "dirty_pages_marked") > 0, "{explain}");
    if !eager {
        assert!(peer_counter(report, "mapped_pages_4k") > 0, "{explain}");
    }
    // After logging, write faults map blocks over the page tables again.
    assert!(peer_counter(report, "stage2_collapses") > 0, "{explain}");
    let (blocks, chunks) = split(report);
    if eager {
        assert!(blocks >= 2 && chunks >= 1, "{explain}");
    } else {
        assert_eq!((blocks, chunks), (0, 0), "{explain}");
    }
}

#[test]
fn harvest_and_clear_on_cpu_max() {
    let report = run("max", "dirty-mode=plain eager-split=0");
    check(&report, false);
    // Enabling and every harvest flush with range invalidations.
    assert!(
        peer_counter(&report, "tlbi_range") > 0,
        "{}",
        report.explain()
    );
}

#[test]
fn manual_protect_with_eager_split_on_cpu_max() {
    let report = run("max", "dirty-mode=manual eager-split=0x200000");
    check(&report, true);
}

#[test]
fn initially_all_set_with_small_chunks_on_cpu_max() {
    let report = run("max", "dirty-mode=all-set eager-split=0x10000");
    check(&report, true);
}

#[test]
fn eager_split_on_cortex_a57() {
    let report = run("cortex-a57", "dirty-mode=plain eager-split=0x200000");
    check(&report, true);
    // No range instructions: whole-VMID invalidations.
    assert!(
        peer_counter(&report, "tlbi_vmalls12") > 0,
        "{}",
        report.explain()
    );
}

#[test]
fn three_writer_vcpus_with_manual_protect_on_cpu_max() {
    let report = run_with_writers(
        "max",
        "dirty-pattern=passes dirty-mode=manual eager-split=0x200000",
        3,
    );
    check(&report, true);
    assert!(
        report
            .console()
            .contains("dirty-log: the peer's 3 vCPUs populated 1024 pages"),
        "{}",
        report.explain()
    );
}
