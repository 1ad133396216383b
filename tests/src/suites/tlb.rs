//! `tlb` suite: how many `TLBI` operations a stage-2 flush costs.
//!
//! For each case the planner's operation count is printed three ways: with
//! `FEAT_TLBIRANGE` (`ops_range`), one `IPAS2E1IS` per page as a per-entry
//! flush would issue (`ops_per_page`), and on a CPU without range instructions
//! (`ops_no_tlbirange`, one whole-VMID invalidation for more than a page). The
//! median time to plan and count the range plan is printed too.

use crate::measure::{config, median_time, on_off, report};
use tlb::{PAGE_SHIFT, TlbCaps, plan_flush};

const RANGE: TlbCaps = TlbCaps::ALL;
const NO_RANGE: TlbCaps = TlbCaps::NO_RANGE;

/// Prints the suite's figures.
pub fn run() {
    for (figure, caps) in [("ops_range", RANGE), ("ops_no_tlbirange", NO_RANGE)] {
        config(
            &format!("tlb/*/{figure}"),
            &[
                ("engine", &"host"),
                ("cpu", &"host"),
                ("fwb", &"none"),
                ("range_tlbi", &on_off(caps.range)),
                ("planner", &"tlb::plan_flush"),
            ],
        );
    }
    const GIB_PAGES: u64 = 1 << 18;
    let cases: [(&str, u64, u64); 5] = [
        ("1GiB", 0x4000_0000, GIB_PAGES),
        ("8GiB_plus_1", 0x4000_0000, 8 * GIB_PAGES + 1),
        ("100GiB", 0x40_0000_0000, 100 * GIB_PAGES),
        (
            "nonaligned_1000pages",
            0x4000_0000 + (3 << PAGE_SHIFT),
            1000,
        ),
        ("2MiB", 0x4020_0000, 512),
    ];
    for (name, ipa, pages) in cases {
        let plan = plan_flush(ipa, pages, None, RANGE);
        assert!(
            !plan.is_whole_vmid(),
            "{name}: range plan fell back to a whole-VMID flush"
        );
        report(&format!("tlb/{name}/ops_range"), plan.len() as f64, "ops");
        report(&format!("tlb/{name}/ops_per_page"), pages as f64, "ops");
        report(
            &format!("tlb/{name}/ops_no_tlbirange"),
            plan_flush(ipa, pages, None, NO_RANGE).len() as f64,
            "ops",
        );
        let time = median_time(
            101,
            || (),
            |()| plan_flush(std::hint::black_box(ipa), pages, None, RANGE).count(),
        );
        report(
            &format!("tlb/{name}/plan_time"),
            time.as_nanos() as f64,
            "ns",
        );
    }
}
