//! The rules the `timers` scenario checks, as pure code tested on the host.
//!
//! - [`TimerPpis::from_cells`]: the INTIDs of the EL1 physical and virtual
//!   timers from the device tree's `arm,armv8-timer` node, whose
//!   `interrupts` are four `<type number flags>` triples in the order Linux
//!   expects: secure physical, non-secure physical, virtual, hypervisor. Each
//!   must be a PPI (type 1) with a level trigger.
//! - [`ctl`] fields and [`fired_in_time`]: an interrupt handler may only see
//!   its timer with `ISTATUS` set and the counter at or past `CVAL`.
//! - [`CounterCheck`]: `CNTPCT_EL0` read between two reads of `CNTVCT_EL0`
//!   must lie between them (the hypervisor's offsets are both zero, so the
//!   two counters are the same clock), and neither may go backwards.
//! - [`Quiesce::for_count`]: how the handler silences a timer that fired,
//!   rotating through the three ways a guest does it (disable, mask, move
//!   `CVAL` into the future), each of which must drop the interrupt line.

use core::fmt;

/// `CNTP_CTL_EL0` / `CNTV_CTL_EL0` fields.
pub mod ctl {
    /// `ENABLE`.
    pub const ENABLE: u64 = 1 << 0;
    /// `IMASK`: interrupt output masked.
    pub const IMASK: u64 = 1 << 1;
    /// `ISTATUS` (read-only): the timer condition is met.
    pub const ISTATUS: u64 = 1 << 2;
}

/// One of the guest's two EL1 timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// `CNTP_*_EL0`, counting `CNTPCT_EL0`.
    Physical,
    /// `CNTV_*_EL0`, counting `CNTVCT_EL0`.
    Virtual,
}

impl Timer {
    /// Both, in per-timer array order.
    pub const ALL: [Timer; 2] = [Timer::Physical, Timer::Virtual];

    /// Position in per-timer arrays.
    pub fn index(self) -> usize {
        match self {
            Timer::Physical => 0,
            Timer::Virtual => 1,
        }
    }
}

impl fmt::Display for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Timer::Physical => "physical",
            Timer::Virtual => "virtual",
        })
    }
}

/// GIC interrupt specifier type of a PPI.
const GIC_PPI: u32 = 1;
/// Trigger bits of a GIC interrupt specifier's flags.
const FLAGS_TRIGGER_MASK: u32 = 0xf;
/// Level-high and level-low trigger flags.
const FLAGS_LEVEL_HIGH: u32 = 4;
const FLAGS_LEVEL_LOW: u32 = 8;
/// First PPI INTID.
const FIRST_PPI: u32 = 16;
/// Number of PPIs.
const PPI_COUNT: u32 = 16;

/// What is wrong with the timer node's `interrupts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerNodeError {
    /// Fewer than the three entries up to the virtual timer's.
    TooFew {
        /// Cells found.
        cells: usize,
    },
    /// Entry `index` is not a level-triggered PPI.
    NotALevelPpi {
        /// 0 secure physical, 1 non-secure physical, 2 virtual, 3 hypervisor.
        index: usize,
        /// Its three cells.
        cells: [u32; 3],
    },
}

impl fmt::Display for TimerNodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimerNodeError::TooFew { cells } => write!(
                f,
                "the timer node has {cells} interrupt cells, expected 3 per timer \
                 (secure, non-secure physical, virtual, hypervisor)"
            ),
            TimerNodeError::NotALevelPpi { index, cells } => write!(
                f,
                "timer interrupt {index} is <{} {} {:#x}>, not a level-triggered PPI",
                cells[0], cells[1], cells[2]
            ),
        }
    }
}

/// The timer PPIs (as INTIDs) a guest uses at EL1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerPpis {
    /// Non-secure EL1 physical timer (PPI 14 = INTID 30 on QEMU `virt`).
    pub physical: u32,
    /// Virtual timer (PPI 11 = INTID 27).
    pub virtual_: u32,
}

impl TimerPpis {
    /// Reads the `interrupts` cells of an `arm,armv8-timer` node (3 cells per
    /// interrupt, the GIC's `#interrupt-cells`).
    pub fn from_cells(cells: &[u32]) -> Result<TimerPpis, TimerNodeError> {
        if cells.len() < 9 {
            return Err(TimerNodeError::TooFew { cells: cells.len() });
        }
        let mut intids = [0u32; 4];
        for (index, entry) in cells.chunks_exact(3).take(4).enumerate() {
            let trigger = entry[2] & FLAGS_TRIGGER_MASK;
            let level = trigger == FLAGS_LEVEL_HIGH || trigger == FLAGS_LEVEL_LOW;
            if entry[0] != GIC_PPI || entry[1] >= PPI_COUNT || !level {
                return Err(TimerNodeError::NotALevelPpi {
                    index,
                    cells: [entry[0], entry[1], entry[2]],
                });
            }
            intids[index] = FIRST_PPI + entry[1];
        }
        Ok(TimerPpis {
            physical: intids[1],
            virtual_: intids[2],
        })
    }

    /// The INTID of `timer`.
    pub fn intid(&self, timer: Timer) -> u32 {
        match timer {
            Timer::Physical => self.physical,
            Timer::Virtual => self.virtual_,
        }
    }

    /// The timer whose interrupt `intid` is.
    pub fn timer_of(&self, intid: u32) -> Option<Timer> {
        Timer::ALL.into_iter().find(|&t| self.intid(t) == intid)
    }
}

/// Whether a handler that found `ctl_value` in its timer's control register
/// and read `count` from its counter after the interrupt was taken may have
/// been interrupted by it: enabled, condition met, `count >= cval`.
pub fn fired_in_time(ctl_value: u64, count: u64, cval: u64) -> bool {
    ctl_value & (ctl::ENABLE | ctl::ISTATUS) == ctl::ENABLE | ctl::ISTATUS && count >= cval
}

/// How the handler silences a timer that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quiesce {
    /// `CTL` = 0.
    Disable,
    /// `CTL` = `ENABLE | IMASK` (what Linux does).
    Mask,
    /// `CVAL` moved far into the future, still enabled and unmasked.
    Defer,
}

impl Quiesce {
    /// The way for the `count`-th interrupt of a timer (0-based).
    pub fn for_count(count: u64) -> Quiesce {
        match count % 3 {
            0 => Quiesce::Mask,
            1 => Quiesce::Disable,
            _ => Quiesce::Defer,
        }
    }
}

/// A counter check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterError {
    /// `CNTPCT_EL0` was not between the two `CNTVCT_EL0` reads around it.
    Mismatch {
        /// `CNTVCT_EL0` before.
        virt_before: u64,
        /// `CNTPCT_EL0`.
        phys: u64,
        /// `CNTVCT_EL0` after.
        virt_after: u64,
    },
    /// A counter read less than an earlier read.
    Backwards {
        /// The earlier value.
        earlier: u64,
        /// The later, smaller one.
        later: u64,
    },
}

/// Checks successive triples (virtual, physical, virtual) of counter reads
/// (`Default`: nothing seen yet).
#[derive(Clone, Copy, Debug, Default)]
pub struct CounterCheck {
    last: u64,
}

impl CounterCheck {
    /// Starts from `floor`: no later read may be below it (a value another
    /// vCPU read before this one started).
    pub const fn from_floor(floor: u64) -> CounterCheck {
        CounterCheck { last: floor }
    }

    /// The largest value seen.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// One triple, read in this order: the first virtual read may not be
    /// below anything seen before, and the physical read must lie between
    /// the two virtual ones (which also orders them).
    pub fn check(
        &mut self,
        virt_before: u64,
        phys: u64,
        virt_after: u64,
    ) -> Result<(), CounterError> {
        if virt_before < self.last {
            return Err(CounterError::Backwards {
                earlier: self.last,
                later: virt_before,
            });
        }
        if phys < virt_before || phys > virt_after {
            return Err(CounterError::Mismatch {
                virt_before,
                phys,
                virt_after,
            });
        }
        self.last = virt_after;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_node_of_the_hypervisor_and_of_qemu() {
        // The hypervisor's node: level-high PPIs 13, 14, 11, 10.
        let hv = [1, 13, 4, 1, 14, 4, 1, 11, 4, 1, 10, 4];
        let ppis = TimerPpis::from_cells(&hv).unwrap();
        assert_eq!(
            ppis,
            TimerPpis {
                physical: 30,
                virtual_: 27
            }
        );
        assert_eq!(ppis.timer_of(30), Some(Timer::Physical));
        assert_eq!(ppis.timer_of(27), Some(Timer::Virtual));
        assert_eq!(ppis.timer_of(26), None);
        // QEMU's GICv2-style flags with a CPU mask: 0xf04 / 0xf08.
        let qemu = [1, 13, 0xf08, 1, 14, 0xf08, 1, 11, 0xf08, 1, 10, 0xf08];
        assert_eq!(TimerPpis::from_cells(&qemu).unwrap().physical, 30);
        // Three entries (no hypervisor timer) are enough.
        assert_eq!(TimerPpis::from_cells(&hv[..9]).unwrap().virtual_, 27);
    }

    #[test]
    fn bad_timer_nodes() {
        assert_eq!(
            TimerPpis::from_cells(&[1, 13, 4, 1, 14, 4]),
            Err(TimerNodeError::TooFew { cells: 6 })
        );
        // An SPI, an edge trigger, a PPI number out of range.
        let spi = [1, 13, 4, 0, 14, 4, 1, 11, 4];
        assert_eq!(
            TimerPpis::from_cells(&spi),
            Err(TimerNodeError::NotALevelPpi {
                index: 1,
                cells: [0, 14, 4]
            })
        );
        let edge = [1, 13, 4, 1, 14, 4, 1, 11, 1];
        assert!(matches!(
            TimerPpis::from_cells(&edge),
            Err(TimerNodeError::NotALevelPpi { index: 2, .. })
        ));
        let big = [1, 16, 4, 1, 14, 4, 1, 11, 4];
        assert!(matches!(
            TimerPpis::from_cells(&big),
            Err(TimerNodeError::NotALevelPpi { index: 0, .. })
        ));
    }

    #[test]
    fn firing_needs_status_and_the_deadline() {
        let on = ctl::ENABLE | ctl::ISTATUS;
        assert!(fired_in_time(on, 100, 100));
        assert!(fired_in_time(on | ctl::IMASK, 101, 100));
        assert!(!fired_in_time(on, 99, 100), "early");
        assert!(!fired_in_time(ctl::ENABLE, 100, 100), "no ISTATUS");
        assert!(!fired_in_time(ctl::ISTATUS, 100, 100), "disabled");
    }

    #[test]
    fn quiesce_rotates() {
        let ways: Vec<Quiesce> = (0..6).map(Quiesce::for_count).collect();
        assert_eq!(
            ways,
            [
                Quiesce::Mask,
                Quiesce::Disable,
                Quiesce::Defer,
                Quiesce::Mask,
                Quiesce::Disable,
                Quiesce::Defer
            ]
        );
    }

    #[test]
    fn counters_equal_and_monotonic() {
        let mut check = CounterCheck::default();
        assert_eq!(check.check(10, 10, 10), Ok(()));
        assert_eq!(check.check(11, 12, 13), Ok(()));
        assert_eq!(check.last(), 13);
        assert_eq!(
            check.check(14, 20, 15),
            Err(CounterError::Mismatch {
                virt_before: 14,
                phys: 20,
                virt_after: 15
            })
        );
        // A physical counter offset from the virtual one is caught.
        let mut fresh = CounterCheck::default();
        assert!(matches!(
            fresh.check(1000, 900, 1001),
            Err(CounterError::Mismatch { .. })
        ));
        let mut check = CounterCheck::from_floor(50);
        assert_eq!(
            check.check(40, 41, 42),
            Err(CounterError::Backwards {
                earlier: 50,
                later: 40
            })
        );
    }
}
