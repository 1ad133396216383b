//! Live migration's plan and report (the machine side is
//! `runtime::live_migration`).
//!
//! # Algorithm
//!
//! Pre-copy, then stop-and-copy, as KVM's users (QEMU) migrate, with a
//! downtime limit (QEMU's `downtime-limit`) and auto-converge:
//!
//! 1. Dirty logging is turned on for every memslot of the source, and every
//!    page is copied to the destination (round 0) while the source runs.
//! 2. Each further round harvests the dirty log and asks
//!    [`PrecopyPlan::next`] with what the last round measured
//!    ([`RoundFigures`]): the copy rate (pages copied / time copying) and the
//!    pages harvested after it (dirtied meanwhile). When the
//!    harvested pages, copied at the measured copy rate, fit a quarter of
//!    the [`MigrationOptions::downtime_limit_us`]
//!    ([`PrecopyPlan::copy_budget_us`]; the rest is for the pause, the
//!    state hand-over and the start, and their spread), pre-copy ends. Otherwise the
//!    pages are copied while the source runs and the next round follows; a
//!    source that dirtied more than half as many pages as the round copied
//!    (QEMU's threshold: the rounds shrink by less than half) is throttled
//!    one step
//!    further ([`PrecopyPlan::throttle_first`], then
//!    [`PrecopyPlan::throttle_step`] more each round, up to
//!    [`PrecopyPlan::throttle_max`] percent): its vCPUs are held out of the
//!    guest for that share of their time ([`throttle_hold_ticks`]) until
//!    the rest fits. After [`PrecopyPlan::max_rounds`] rounds pre-copy ends
//!    anyway, and the report says the limit was not expected to hold.
//! 3. Stop-and-copy: the source is paused, its vCPUs capture their whole
//!    state (`vm::vcpu_state`) and then help copy the last harvest (every
//!    CPU of the source copies in parallel) when one CPU alone would take
//!    longer than the pause took to bring them out of their guest
//!    ([`RoundFigures::copy_us_for`]): waking them again costs about that. With
//!    [`MigrationOptions::verify`] (the tests) the destination's memory is
//!    then compared with the source's byte for byte, and any difference
//!    aborts the migration (the source resumes).
//! 4. The vgic state, the vCPU states and the PSCI power states go to the
//!    destination, whose vCPUs start from them; the source ends
//!    (`migrated to ...`; its first vCPU to halt turns the migration's
//!    dirty logging off). Downtime runs from the pause until the
//!    destination's last vCPU is released (with the check, when one was
//!    asked for).

use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The downtime limit when the request names none, microseconds (30 ms:
/// QEMU's 300 ms is sized for a network; here the copy is memory to memory).
pub const DEFAULT_DOWNTIME_LIMIT_US: u64 = 30_000;

/// How a migration is asked for (the console monitor's `migrate SRC DST
/// [verify] [limit=MS]`, the control interface's `VM_MIGRATE` `x3`/`x4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationOptions {
    /// Compare the destination's memory with the source's byte for byte
    /// while both stand still (the tests); off by default.
    pub verify: bool,
    /// The downtime pre-copy aims for, microseconds.
    pub downtime_limit_us: u64,
}

impl Default for MigrationOptions {
    fn default() -> Self {
        Self {
            verify: false,
            downtime_limit_us: DEFAULT_DOWNTIME_LIMIT_US,
        }
    }
}

/// When pre-copy stops and how hard a fast writer is throttled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrecopyPlan {
    /// The downtime to fit, microseconds.
    pub downtime_limit_us: u64,
    /// Rounds after the first full copy, at most.
    pub max_rounds: u32,
    /// The first throttle, percent of the vCPUs' time held out of the guest.
    pub throttle_first: u8,
    /// How much more each further round that dirties too fast.
    pub throttle_step: u8,
    /// The throttle at most, percent.
    pub throttle_max: u8,
}

/// What a pre-copy round measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundFigures {
    /// Pages the round copied.
    pub copied_pages: u64,
    /// Microseconds it spent copying them.
    pub copy_us: u64,
    /// Pages harvested after it (dirtied while it ran).
    pub dirty_pages: u64,
    /// Microseconds in which they were dirtied (since the harvest before).
    pub dirty_us: u64,
}

impl RoundFigures {
    /// How long copying the harvested pages takes at the round's copy rate,
    /// microseconds (rounded up).
    pub fn expected_copy_us(&self) -> u64 {
        self.copy_us_for(self.dirty_pages)
    }

    /// How long one CPU copies `pages` pages at the round's copy rate,
    /// microseconds (rounded up; unknown, so the most, when the round
    /// copied nothing).
    pub fn copy_us_for(&self, pages: u64) -> u64 {
        if pages == 0 {
            0
        } else if self.copied_pages == 0 {
            u64::MAX
        } else {
            let us = u128::from(pages) * u128::from(self.copy_us);
            u64::try_from(us.div_ceil(u128::from(self.copied_pages))).unwrap_or(u64::MAX)
        }
    }

    /// The source dirtied more than half as many pages as the round copied
    /// (QEMU's auto-converge threshold, counted over the round as QEMU
    /// does, so a slow harvest does not hide a fast writer): each round then
    /// leaves more than half as much to copy as the one before, and a
    /// writer whose working set is dirtied faster than a round copies it
    /// (the rounds stop shrinking at all) is caught too.
    pub fn dirties_too_fast(&self) -> bool {
        2 * u128::from(self.dirty_pages) > u128::from(self.copied_pages)
    }
}

/// What to do after a harvest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Copy the harvest while the source runs with its vCPUs held out of
    /// the guest for `throttle` percent of their time, and harvest again.
    Iterate {
        /// Percent, 0: not throttled.
        throttle: u8,
    },
    /// Pause the source and copy the rest.
    StopAndCopy {
        /// The expected copy time of the rest, microseconds.
        expected_us: u64,
        /// It fits the limit (else the rounds ran out).
        within_limit: bool,
    },
}

impl PrecopyPlan {
    /// The plan for `options`: at most 12 rounds, throttle 30 % first, 20
    /// more each step, 99 % at most (QEMU's auto-converge, with larger
    /// steps: under QEMU TCG on a busy host a round of the test guest takes
    /// a few hundred milliseconds, and QEMU's 20 + 10 % steps let its 8 s
    /// of writing end before pre-copy does).
    pub fn new(options: &MigrationOptions) -> Self {
        Self {
            downtime_limit_us: options.downtime_limit_us,
            max_rounds: 12,
            throttle_first: 30,
            throttle_step: 20,
            throttle_max: 99,
        }
    }

    /// The part of the limit the stop's copy may take, microseconds: a
    /// quarter; the rest is for the pause, the vCPUs' hand-over, the last
    /// harvest and the destination's start, which the rounds cannot
    /// measure, and for their spread: under QEMU on a 2-core host those
    /// took 3-4 ms together, and one step of them (a single kick) up to
    /// 4 ms more when its thread lost its host core.
    pub fn copy_budget_us(&self) -> u64 {
        self.downtime_limit_us / 4
    }

    /// After round `round` (1 for the first harvest) measured `figures`,
    /// the source throttled by `throttle` percent.
    pub fn next(&self, round: u32, figures: &RoundFigures, throttle: u8) -> Next {
        let expected_us = figures.expected_copy_us();
        if expected_us <= self.copy_budget_us() {
            return Next::StopAndCopy {
                expected_us,
                within_limit: true,
            };
        }
        if round >= self.max_rounds {
            return Next::StopAndCopy {
                expected_us,
                within_limit: false,
            };
        }
        let throttle = if figures.dirties_too_fast() {
            if throttle == 0 {
                self.throttle_first
            } else {
                throttle.saturating_add(self.throttle_step)
            }
            .min(self.throttle_max)
        } else {
            throttle
        };
        Next::Iterate { throttle }
    }
}

/// A migration's spin-waits (for the vCPUs' captured states, a throttled
/// vCPU's hold) read the clock once per this many spins, not on every one:
/// under emulation each counter read takes a lock that the CPUs they wait
/// for need too.
pub const SPINS_PER_CLOCK_READ: u32 = 256;

/// Guest time a throttled vCPU runs between holds, microseconds (checked
/// at its exits; QEMU's auto-converge slices 10 ms).
pub const THROTTLE_SLICE_US: u64 = 1_000;

/// How long a vCPU throttled by `percent` percent is held out of the guest
/// after it ran for `ran_ticks`: `ran * percent / (100 - percent)`, so that
/// holding is `percent` percent of the time (99 % at most).
pub fn throttle_hold_ticks(percent: u8, ran_ticks: u64) -> u64 {
    let percent = u64::from(percent.min(99));
    let hold = u128::from(ran_ticks) * u128::from(percent) / u128::from(100 - percent);
    u64::try_from(hold).unwrap_or(u64::MAX)
}

/// One word of a harvested dirty bitmap: page `i` (bit `i` of `pages`)
/// is copied from host address `from + i * page` to `to + i * page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyChunk {
    /// The source's host address of the word's first page.
    pub from: usize,
    /// The destination's host address of the word's first page.
    pub to: usize,
    /// The pages to copy, one bit each.
    pub pages: u64,
}

/// The stop's copy, shared out a chunk at a time among every CPU that
/// helps (an atomic cursor over the chunks).
#[derive(Debug, Default)]
pub struct CopyJob {
    chunks: Vec<CopyChunk>,
    next: AtomicUsize,
}

impl CopyJob {
    /// A job over `chunks`.
    pub fn new(chunks: Vec<CopyChunk>) -> Self {
        Self {
            chunks,
            next: AtomicUsize::new(0),
        }
    }

    /// Pages in all.
    pub fn pages(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| u64::from(c.pages.count_ones()))
            .sum()
    }

    /// Takes chunks and hands each to `copy` until none is left; returns
    /// how many pages this caller copied.
    pub fn work(&self, copy: &mut dyn FnMut(&CopyChunk)) -> u64 {
        let mut pages = 0;
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = self.chunks.get(index) else {
                return pages;
            };
            copy(chunk);
            pages += u64::from(chunk.pages.count_ones());
        }
    }
}

/// Where a migration posts its stop's [`CopyJob`] for the source's paused
/// vCPUs to help with, on their own CPUs.
///
/// The poster publishes the job, works on it itself, withdraws it, and
/// waits until no helper is inside; a helper counts itself in before it
/// looks for the job and out after its work. With every access
/// sequentially consistent, a helper either counted in before the poster
/// checked the count (and is waited for) or finds the job withdrawn, so
/// the job (on the poster's stack) outlives every use.
#[derive(Debug, Default)]
pub struct CopyBoard {
    job: AtomicPtr<CopyJob>,
    helpers: AtomicUsize,
}

impl CopyBoard {
    /// An empty board.
    pub const fn new() -> Self {
        Self {
            job: AtomicPtr::new(core::ptr::null_mut()),
            helpers: AtomicUsize::new(0),
        }
    }

    /// Posts `job`, calls `wake` (to call the helpers), works on it with
    /// `copy` and returns once every helper is done with it; returns the
    /// pages this caller copied.
    pub fn post_and_work(
        &self,
        job: &CopyJob,
        wake: impl FnOnce(),
        copy: &mut dyn FnMut(&CopyChunk),
    ) -> u64 {
        self.job
            .store(core::ptr::from_ref(job).cast_mut(), Ordering::SeqCst);
        wake();
        let mine = job.work(copy);
        self.job.store(core::ptr::null_mut(), Ordering::SeqCst);
        while self.helpers.load(Ordering::SeqCst) != 0 {
            core::hint::spin_loop();
        }
        mine
    }

    /// Helps with the posted job, if one is posted; returns the pages
    /// copied here.
    pub fn help(&self, copy: &mut dyn FnMut(&CopyChunk)) -> u64 {
        self.helpers.fetch_add(1, Ordering::SeqCst);
        let job = self.job.load(Ordering::SeqCst);
        // SAFETY: a non-null pointer is a job its poster keeps alive until
        // `helpers` is zero (see the type's doc); this helper is counted.
        let pages = unsafe { job.as_ref() }.map_or(0, |job| job.work(copy));
        self.helpers.fetch_sub(1, Ordering::SeqCst);
        pages
    }
}

/// What a migration did, as the hypervisor reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Pages copied in each round: the full copy first, the last one
    /// during the stop.
    pub pages_per_iteration: Vec<u64>,
    /// Total time, microseconds.
    pub total_us: u64,
    /// From the pause until the destination's last vCPU is released,
    /// microseconds (the check included, when one was asked for).
    pub downtime_us: u64,
    /// The part of the downtime from the pause until every vCPU handed over
    /// its state, microseconds.
    pub pause_us: u64,
    /// The part spent on the stop's harvest and copy, microseconds.
    pub stop_copy_us: u64,
    /// The source's vCPUs helped with the stop's copy (else this CPU
    /// alone was expected to be done sooner than waking them takes).
    pub stop_copy_helped: bool,
    /// The rest of the downtime: the devices' and vCPUs' states handed
    /// over, the destination's vCPUs released, the source marked ending and
    /// woken, microseconds.
    pub finish_us: u64,
    /// The downtime limit, microseconds.
    pub downtime_limit_us: u64,
    /// The stop's copy time expected when pre-copy ended, microseconds.
    pub expected_stop_copy_us: u64,
    /// The throttle the source's vCPUs reached, percent.
    pub throttle_percent: u8,
    /// The destination's memory was compared with the source's.
    pub verified: bool,
    /// The part of the downtime spent comparing, microseconds (0 without
    /// the check).
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
            "total {} us, downtime {} us (pause {} us, copy {} us{}, finish {} us, ",
            self.total_us,
            self.downtime_us,
            self.pause_us,
            self.stop_copy_us,
            if self.stop_copy_helped { "" } else { " alone" },
            self.finish_us
        )?;
        if self.verified {
            write!(f, "verify {} us", self.verify_us)?;
        } else {
            f.write_str("not verified")?;
        }
        write!(
            f,
            ", limit {} us, expected copy {} us, throttle {} %), {} pre-copy iterations, pages per iteration",
            self.downtime_limit_us,
            self.expected_stop_copy_us,
            self.throttle_percent,
            self.iterations()
        )?;
        for (i, pages) in self.pages_per_iteration.iter().enumerate() {
            write!(f, "{}{pages}", if i == 0 { " " } else { "/" })?;
        }
        write!(f, ", {} pages copied", self.pages_copied())?;
        if self.verified {
            write!(f, ", {} differences", self.differences)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    fn plan(limit_us: u64) -> PrecopyPlan {
        PrecopyPlan::new(&MigrationOptions {
            verify: false,
            downtime_limit_us: limit_us,
        })
    }

    /// 1000 pages copied in 10 ms (100 pages per ms); `dirty` pages
    /// dirtied in `dirty_us`.
    fn figures(dirty: u64, dirty_us: u64) -> RoundFigures {
        RoundFigures {
            copied_pages: 1000,
            copy_us: 10_000,
            dirty_pages: dirty,
            dirty_us,
        }
    }

    #[test]
    fn precopy_stops_when_the_harvest_fits_the_limit_at_the_measured_rate() {
        let plan = plan(120_000);
        // 3000 pages at 100 per ms: 30 ms, just fits a quarter of the limit.
        assert_eq!(
            plan.next(1, &figures(3000, 40_000), 0),
            Next::StopAndCopy {
                expected_us: 30_000,
                within_limit: true
            }
        );
        // One more page does not fit.
        assert!(matches!(
            plan.next(1, &figures(3001, 40_000), 0),
            Next::Iterate { .. }
        ));
        // The same harvest fits a slower limit only at a faster copy.
        let faster = RoundFigures {
            copy_us: 5_000,
            ..figures(3001, 40_000)
        };
        assert!(matches!(plan.next(1, &faster, 0), Next::StopAndCopy { .. }));
        assert_eq!(figures(0, 1).expected_copy_us(), 0);
        assert_eq!(figures(0, 1).copy_us_for(250), 2_500);
        assert_eq!(figures(0, 1).copy_us_for(1), 10);
        assert_eq!(
            RoundFigures {
                copied_pages: 0,
                ..figures(1, 1)
            }
            .expected_copy_us(),
            u64::MAX
        );
    }

    #[test]
    fn a_writer_faster_than_the_copy_is_throttled_step_by_step() {
        let plan = plan(1_000);
        // 5000 pages dirtied in 10 ms: 500 per ms, faster than 100 per ms.
        let fast = figures(5000, 10_000);
        assert!(fast.dirties_too_fast());
        // As fast as the copy (the rounds do not shrink): too fast still.
        assert!(figures(1000, 10_000).dirties_too_fast());
        assert_eq!(plan.next(1, &fast, 0), Next::Iterate { throttle: 30 });
        assert_eq!(plan.next(2, &fast, 30), Next::Iterate { throttle: 50 });
        assert_eq!(plan.next(3, &fast, 90), Next::Iterate { throttle: 99 });
        assert_eq!(plan.next(4, &fast, 99), Next::Iterate { throttle: 99 });
        // At half the copy rate: the throttle stays where it is.
        let slow = figures(500, 10_000);
        assert!(!slow.dirties_too_fast());
        assert_eq!(plan.next(5, &slow, 0), Next::Iterate { throttle: 0 });
        assert_eq!(plan.next(5, &slow, 40), Next::Iterate { throttle: 40 });
    }

    #[test]
    fn precopy_ends_after_the_last_round_and_says_the_limit_may_not_hold() {
        let plan = plan(1_000);
        assert_eq!(
            plan.next(plan.max_rounds, &figures(5000, 10_000), 99),
            Next::StopAndCopy {
                expected_us: 50_000,
                within_limit: false
            }
        );
        assert!(matches!(
            plan.next(plan.max_rounds - 1, &figures(5000, 10_000), 99),
            Next::Iterate { .. }
        ));
    }

    #[test]
    fn a_throttled_vcpu_is_held_for_its_share_of_the_time() {
        assert_eq!(throttle_hold_ticks(0, 1000), 0);
        assert_eq!(throttle_hold_ticks(20, 800), 200);
        assert_eq!(throttle_hold_ticks(50, 1000), 1000);
        assert_eq!(throttle_hold_ticks(99, 10), 990);
        // Never all of it.
        assert_eq!(throttle_hold_ticks(100, 10), 990);
    }

    #[test]
    fn the_stop_copy_is_shared_out_and_every_page_copied_once() {
        extern crate std;
        use std::sync::{Arc, Mutex};
        let chunks: Vec<CopyChunk> = (0..200)
            .map(|i| CopyChunk {
                from: i * 64,
                to: 0x10_0000 + i * 64,
                pages: (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            })
            .collect();
        let job = CopyJob::new(chunks.clone());
        let board = Arc::new(CopyBoard::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(core::sync::atomic::AtomicBool::new(false));
        let helper = {
            let (board, seen, done) = (board.clone(), seen.clone(), done.clone());
            std::thread::spawn(move || {
                // Helps (a paused vCPU waking up) until the job is over.
                let mut mine = 0;
                while !done.load(Ordering::SeqCst) {
                    mine += board.help(&mut |c| seen.lock().unwrap().push(*c));
                    std::thread::yield_now();
                }
                mine
            })
        };
        let mine = board.post_and_work(&job, || {}, &mut |c| {
            seen.lock().unwrap().push(*c);
            // Slow enough that the helper takes chunks too.
            std::thread::sleep(std::time::Duration::from_micros(200));
        });
        done.store(true, Ordering::SeqCst);
        let helped = helper.join().unwrap();
        assert!(helped > 0, "the helper copied nothing");
        assert_eq!(mine + helped, job.pages());
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|c| c.from);
        assert_eq!(seen, chunks, "a chunk was copied twice or not at all");
        // Withdrawn: a late helper finds nothing.
        assert_eq!(board.help(&mut |_| panic!("copied after the end")), 0);
    }

    #[test]
    fn report_text() {
        let mut report = MigrationReport {
            pages_per_iteration: vec![32768, 900, 120, 7],
            total_us: 1500,
            downtime_us: 300,
            pause_us: 40,
            stop_copy_us: 50,
            stop_copy_helped: true,
            finish_us: 10,
            downtime_limit_us: 30_000,
            expected_stop_copy_us: 250,
            throttle_percent: 20,
            verified: true,
            verify_us: 200,
            differences: 0,
        };
        assert_eq!(report.iterations(), 2);
        assert_eq!(report.pages_copied(), 33795);
        assert_eq!(
            report.to_string(),
            "total 1500 us, downtime 300 us (pause 40 us, copy 50 us, finish 10 us, verify 200 us, limit 30000 us, expected copy 250 us, throttle 20 %), 2 pre-copy iterations, pages per iteration 32768/900/120/7, 33795 pages copied, 0 differences"
        );
        report.verified = false;
        report.verify_us = 0;
        report.stop_copy_helped = false;
        assert_eq!(
            report.to_string(),
            "total 1500 us, downtime 300 us (pause 40 us, copy 50 us alone, finish 10 us, not verified, limit 30000 us, expected copy 250 us, throttle 20 %), 2 pre-copy iterations, pages per iteration 32768/900/120/7, 33795 pages copied"
        );
    }
}
