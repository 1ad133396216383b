//! Live migration's plan and report (the machine side is `runtime::live_migration`).
//!
//! # Algorithm
//!
//! Pre-copy, then stop-and-copy, as KVM's users (QEMU) migrate:
//!
//! 1. Dirty logging is turned on for every memslot of the source, and every
//!    page is copied to the destination (iteration 0) while the source runs.
//! 2. Each further iteration harvests the dirty log and copies the pages it
//!    reports, until an iteration reports at most [`PrecopyPlan::stop_pages`]
//!    pages or [`PrecopyPlan::max_iterations`] iterations were made
//!    ([`PrecopyPlan::next`]).
//! 3. Stop-and-copy: the source is paused, its vCPUs capture their whole
//!    state (`vm::vcpu_state`), the last harvest is copied, and the
//!    destination's memory is compared with the source's byte for byte:
//!    any difference aborts the migration (the source resumes).
//! 4. The vgic state, the vCPU states and the PSCI power states go to the
//!    destination, whose vCPUs start from them; the source ends
//!    (`migrated to ...`). Downtime runs from the pause to the destination's
//!    start.

use alloc::vec::Vec;
use core::fmt;

/// When pre-copy stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrecopyPlan {
    /// Iterations after the first full copy, at most.
    pub max_iterations: u32,
    /// An iteration reporting this many pages or fewer ends pre-copy.
    pub stop_pages: u64,
}

/// What to do after a pre-copy iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Harvest and copy again.
    Iterate,
    /// Pause the source and copy the rest.
    StopAndCopy,
}

impl PrecopyPlan {
    /// The plan the hypervisor uses: 8 iterations at most, stop at 256
    /// pages (1 MiB) or fewer.
    pub const DEFAULT: Self = Self {
        max_iterations: 8,
        stop_pages: 256,
    };

    /// After iteration `iteration` (1 for the first harvest) copied `dirty`
    /// pages.
    pub fn next(&self, iteration: u32, dirty: u64) -> Next {
        if dirty <= self.stop_pages || iteration >= self.max_iterations {
            Next::StopAndCopy
        } else {
            Next::Iterate
        }
    }
}

/// What a migration did, as the hypervisor reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Pages copied in each iteration: the full copy first, the last one
    /// during the stop.
    pub pages_per_iteration: Vec<u64>,
    /// Total time, microseconds.
    pub total_us: u64,
    /// From the pause to the destination's start, microseconds.
    pub downtime_us: u64,
    /// The part of the downtime spent comparing the destination's memory
    /// with the source's, microseconds.
    pub verify_us: u64,
    /// Pages that differed after stop-and-copy (0, or the migration failed).
    pub differences: u64,
}

impl MigrationReport {
    /// Pre-copy iterations after the full copy (the stop's copy not counted).
    pub fn iterations(&self) -> usize {
        self.pages_per_iteration.len().saturating_sub(2)
    }

    /// Pages copied in all.
    pub fn pages_copied(&self) -> u64 {
        self.pages_per_iteration.iter().sum()
    }
}

impl fmt::Display for MigrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "total {} us, downtime {} us (verify {} us), {} pre-copy iterations, pages per iteration",
            self.total_us,
            self.downtime_us,
            self.verify_us,
            self.iterations()
        )?;
        for (i, pages) in self.pages_per_iteration.iter().enumerate() {
            write!(f, "{}{pages}", if i == 0 { " " } else { "/" })?;
        }
        write!(
            f,
            ", {} pages copied, {} differences",
            self.pages_copied(),
            self.differences
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn precopy_stops_when_little_is_dirty_or_at_the_limit() {
        let plan = PrecopyPlan::DEFAULT;
        assert_eq!(plan.next(1, 10_000), Next::Iterate);
        assert_eq!(plan.next(1, 256), Next::StopAndCopy);
        assert_eq!(plan.next(8, 10_000), Next::StopAndCopy);
        assert_eq!(plan.next(7, 257), Next::Iterate);
    }

    #[test]
    fn report_text() {
        let report = MigrationReport {
            pages_per_iteration: vec![32768, 900, 120, 7],
            total_us: 1500,
            downtime_us: 300,
            verify_us: 200,
            differences: 0,
        };
        assert_eq!(report.iterations(), 2);
        assert_eq!(report.pages_copied(), 33795);
        assert_eq!(
            report.to_string(),
            "total 1500 us, downtime 300 us (verify 200 us), 2 pre-copy iterations, pages per iteration 32768/900/120/7, 33795 pages copied, 0 differences"
        );
    }
}
