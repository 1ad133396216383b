//! A budget for the log lines a guest can cause at will.
//!
//! Every injected abort and every emulated-device access the hypervisor
//! cannot honour (an unknown register, an access without an instruction
//! syndrome) is worth a log line the first times, but a guest can repeat
//! them millions of times, and the console is synchronous: an unbounded log
//! would let a guest bury the host's console and slow its own CPU to the
//! console's pace. Each vCPU therefore keeps one [`LogBudget`] per kind of
//! event: the first [`LINES_PER_KIND`] events are logged, the last of them
//! saying that further ones are not; the counters (`injected_aborts`, ...)
//! still count every event.

/// Lines one vCPU logs for one kind of guest-caused event.
pub const LINES_PER_KIND: u32 = 16;

/// Whether to log an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogDecision {
    /// Log it.
    Log,
    /// Log it and say that further events of its kind are not logged.
    LogLast,
    /// Do not log it.
    Quiet,
}

/// Events of one kind seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBudget {
    seen: u32,
}

impl LogBudget {
    /// A budget nothing has used.
    pub const fn new() -> Self {
        Self { seen: 0 }
    }

    /// Counts one event and says whether to log it.
    pub fn take(&mut self) -> LogDecision {
        self.seen = self.seen.saturating_add(1);
        match self.seen {
            n if n < LINES_PER_KIND => LogDecision::Log,
            LINES_PER_KIND => LogDecision::LogLast,
            _ => LogDecision::Quiet,
        }
    }

    /// The suffix a line gets under `decision`.
    pub fn suffix(decision: LogDecision) -> &'static str {
        match decision {
            LogDecision::LogLast => " (further such events of this vCPU are not logged)",
            _ => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_lines_then_goes_quiet() {
        let mut budget = LogBudget::new();
        let decisions: Vec<LogDecision> = (0..LINES_PER_KIND + 5).map(|_| budget.take()).collect();
        let logged = decisions
            .iter()
            .filter(|d| **d != LogDecision::Quiet)
            .count();
        assert_eq!(logged, LINES_PER_KIND as usize);
        assert_eq!(decisions[LINES_PER_KIND as usize - 1], LogDecision::LogLast);
        assert!(
            decisions[..LINES_PER_KIND as usize - 1]
                .iter()
                .all(|d| *d == LogDecision::Log)
        );
        assert!(LogBudget::suffix(LogDecision::LogLast).contains("not logged"));
        assert_eq!(LogBudget::suffix(LogDecision::Log), "");
        let mut worn = LogBudget { seen: u32::MAX };
        assert_eq!(worn.take(), LogDecision::Quiet, "saturates");
    }
}
