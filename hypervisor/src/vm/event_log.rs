//! Bounded logging of the events a guest drives: what is logged and what is
//! remembered for it takes bounded memory and bounded time, whatever the
//! guest does.
//!
//! A guest decides how often it issues an unknown hypercall, touches an
//! address without memory or device, or pokes a register the hypervisor does
//! not emulate; each such event used to log a line, and the "log once per id"
//! rule remembered every id in a list that grew with each new one. A guest
//! issuing hundreds of thousands of distinct ids then made every hypercall a
//! linear search, grew the heap until an allocation failed (which ends every
//! VM) and flooded the console. Every guest-driven log line of a VM now goes
//! through one [`EventLog`]:
//!
//! * Rate limit: each [`EventKind`] has a token bucket of [`RatePolicy::burst`]
//!   lines, refilled by one line per [`RatePolicy::refill_ticks`] of the
//!   system counter. A line that finds the bucket empty is suppressed and
//!   counted; the next line of that kind that is logged carries the count of
//!   lines suppressed before it, and [`EventLog::take_suppressed`] hands out
//!   what is still unreported (for a summary at power-off). A flood of one
//!   kind never silences another kind.
//! * Once per id: unknown hypercall ids and unknown system registers are
//!   logged once per VM. The ids already logged are kept in a
//!   [`BoundedSet`] of fixed capacity (a sorted array: lookup by binary
//!   search, no heap). When it is full, a new id is simply not remembered:
//!   its line still goes through the rate limit, so the console stays bounded.
//!
//! The events themselves are counted elsewhere (the VM's counters), every one
//! of them; only what is printed and remembered is bounded.

/// The kinds of guest-driven log lines, each rate-limited on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum EventKind {
    /// A hypercall answered `NOT_SUPPORTED`.
    UnknownHypercall,
    /// An abort injected into the guest.
    InjectedAbort,
    /// An undefined instruction injected into the guest.
    InjectedUndefined,
    /// An emulated device refused or could not emulate an access.
    DeviceAccess,
    /// A trapped access to a system register the hypervisor does not know.
    UnknownSysReg,
    /// The guest's `TEST_REPORT` hypercall.
    TestReport,
}

impl EventKind {
    /// Every kind, in index order.
    pub const ALL: [EventKind; 6] = [
        EventKind::UnknownHypercall,
        EventKind::InjectedAbort,
        EventKind::InjectedUndefined,
        EventKind::DeviceAccess,
        EventKind::UnknownSysReg,
        EventKind::TestReport,
    ];

    /// How the kind is named in the suppression summary.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::UnknownHypercall => "unknown hypercall",
            EventKind::InjectedAbort => "injected abort",
            EventKind::InjectedUndefined => "injected undefined instruction",
            EventKind::DeviceAccess => "device access",
            EventKind::UnknownSysReg => "unknown system register",
            EventKind::TestReport => "test report",
        }
    }
}

/// One guest-driven event that may be logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Hypercall function id (the whole `x0`) answered `NOT_SUPPORTED`.
    UnknownHypercall(u64),
    /// An abort injected into the guest.
    InjectedAbort,
    /// An undefined instruction injected into the guest.
    InjectedUndefined,
    /// A device access refused or not emulated.
    DeviceAccess,
    /// A trapped access to a system register the hypervisor does not know.
    UnknownSysReg(crate::vocabulary::sysreg_encoding::SysRegEncoding),
    /// A `TEST_REPORT` hypercall.
    TestReport,
}

impl Event {
    /// The kind whose rate limit the event's line counts against.
    pub fn kind(self) -> EventKind {
        match self {
            Event::UnknownHypercall(_) => EventKind::UnknownHypercall,
            Event::InjectedAbort => EventKind::InjectedAbort,
            Event::InjectedUndefined => EventKind::InjectedUndefined,
            Event::DeviceAccess => EventKind::DeviceAccess,
            Event::UnknownSysReg(_) => EventKind::UnknownSysReg,
            Event::TestReport => EventKind::TestReport,
        }
    }
}

/// What to do with an event's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogDecision {
    /// Log it; `suppressed` lines of its kind were dropped since the last
    /// one logged (say so with the line).
    Log {
        /// Lines of this kind suppressed before this one.
        suppressed: u64,
    },
    /// Drop it: the kind's rate limit is exhausted (counted as suppressed).
    Suppress,
    /// Drop it: this id was logged before (a repeat, not counted).
    Repeat,
}

/// Outcome of [`BoundedSet::insert`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insertion {
    /// The value is now in the set.
    Added,
    /// The value was already in the set.
    Present,
    /// The set is full; the value was not added.
    Full,
}

/// A set of at most `N` values in a sorted inline array: no heap, lookup by
/// binary search, insertion moves at most `N - 1` values.
#[derive(Clone, Debug)]
pub struct BoundedSet<T, const N: usize> {
    values: [T; N],
    len: usize,
}

impl<T: Ord + Copy, const N: usize> BoundedSet<T, N> {
    /// An empty set; `filler` only initialises the unused slots.
    pub const fn new(filler: T) -> Self {
        Self {
            values: [filler; N],
            len: 0,
        }
    }

    /// How many values the set holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set holds no value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the set holds `N` values.
    pub fn is_full(&self) -> bool {
        self.len == N
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: &T) -> bool {
        self.values[..self.len].binary_search(value).is_ok()
    }

    /// Adds `value` unless it is there or the set is full.
    pub fn insert(&mut self, value: T) -> Insertion {
        match self.values[..self.len].binary_search(&value) {
            Ok(_) => Insertion::Present,
            Err(_) if self.len == N => Insertion::Full,
            Err(at) => {
                self.values.copy_within(at..self.len, at + 1);
                self.values[at] = value;
                self.len += 1;
                Insertion::Added
            }
        }
    }
}

/// How many lines of one kind may be logged: a burst, then one more per
/// refill period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RatePolicy {
    /// Lines that may be logged back to back (the bucket's size, nonzero).
    pub burst: u32,
    /// System-counter ticks per line added back to the bucket (nonzero).
    pub refill_ticks: u64,
}

impl RatePolicy {
    /// Lines of one kind logged back to back before the limit applies.
    pub const BURST: u32 = 10;
    /// Seconds per further line of one kind once the burst is spent.
    pub const REFILL_SECONDS: u64 = 5;

    /// The hypervisor's policy for a system counter of `frequency` Hz:
    /// [`Self::BURST`] lines, then one per [`Self::REFILL_SECONDS`].
    pub fn for_counter_frequency(frequency: u64) -> Self {
        Self {
            burst: Self::BURST,
            refill_ticks: frequency.saturating_mul(Self::REFILL_SECONDS).max(1),
        }
    }
}

/// A token bucket for one kind, with the count of lines it suppressed.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    /// Counter value up to which refills have been credited.
    refilled_at: Option<u64>,
    /// Lines suppressed since the last one logged or handed out.
    suppressed: u64,
}

impl Bucket {
    const fn full(policy: RatePolicy) -> Self {
        Self {
            tokens: policy.burst,
            refilled_at: None,
            suppressed: 0,
        }
    }

    fn refill(&mut self, policy: RatePolicy, now: u64) {
        let Some(since) = self.refilled_at else {
            self.refilled_at = Some(now);
            return;
        };
        // A counter that went backwards (another CPU's, slightly behind)
        // credits nothing.
        let periods = now.saturating_sub(since) / policy.refill_ticks;
        if periods == 0 {
            return;
        }
        let added = u32::try_from(periods).unwrap_or(u32::MAX);
        self.tokens = self.tokens.saturating_add(added).min(policy.burst);
        self.refilled_at = Some(if self.tokens == policy.burst {
            now
        } else {
            since + periods * policy.refill_ticks
        });
    }

    fn admit(&mut self, policy: RatePolicy, now: u64) -> LogDecision {
        self.refill(policy, now);
        if self.tokens == 0 {
            self.suppressed = self.suppressed.saturating_add(1);
            return LogDecision::Suppress;
        }
        self.tokens -= 1;
        LogDecision::Log {
            suppressed: core::mem::take(&mut self.suppressed),
        }
    }
}

/// Unknown hypercall ids remembered (each logged once) per VM.
pub const REMEMBERED_HYPERCALLS: usize = 64;
/// Unknown system registers remembered (each logged once) per VM.
pub const REMEMBERED_SYSREGS: usize = 64;

/// One VM's guest-driven log state: a rate limit per kind and the ids already
/// logged, all of fixed size.
#[derive(Clone, Debug)]
pub struct EventLog {
    policy: RatePolicy,
    buckets: [Bucket; EventKind::ALL.len()],
    reported_calls: BoundedSet<u64, REMEMBERED_HYPERCALLS>,
    reported_sysregs:
        BoundedSet<crate::vocabulary::sysreg_encoding::SysRegEncoding, REMEMBERED_SYSREGS>,
}

impl EventLog {
    /// Nothing logged yet, every bucket full.
    pub const fn new(policy: RatePolicy) -> Self {
        Self {
            policy,
            buckets: [Bucket::full(policy); EventKind::ALL.len()],
            reported_calls: BoundedSet::new(0),
            reported_sysregs: BoundedSet::new(crate::vocabulary::sysreg_encoding::SysRegEncoding {
                op0: 0,
                op1: 0,
                crn: 0,
                crm: 0,
                op2: 0,
            }),
        }
    }

    /// Decides whether `event`'s line is logged, at system-counter value
    /// `now`. An id-carrying event already logged is a [`LogDecision::Repeat`];
    /// otherwise the line spends a token of its kind, and an id whose line is
    /// logged is remembered while there is room.
    pub fn admit(&mut self, event: Event, now: u64) -> LogDecision {
        let repeat = match event {
            Event::UnknownHypercall(id) => self.reported_calls.contains(&id),
            Event::UnknownSysReg(reg) => self.reported_sysregs.contains(&reg),
            _ => false,
        };
        if repeat {
            return LogDecision::Repeat;
        }
        let decision = self.buckets[event.kind() as usize].admit(self.policy, now);
        if let LogDecision::Log { .. } = decision {
            // A full set leaves the id unremembered: its later lines are
            // rate-limited instead of deduplicated.
            match event {
                Event::UnknownHypercall(id) => {
                    self.reported_calls.insert(id);
                }
                Event::UnknownSysReg(reg) => {
                    self.reported_sysregs.insert(reg);
                }
                _ => {}
            }
        }
        decision
    }

    /// Takes the count of lines of `kind` suppressed since its last logged
    /// line (for a summary when the VM stops).
    pub fn take_suppressed(&mut self, kind: EventKind) -> u64 {
        core::mem::take(&mut self.buckets[kind as usize].suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::sysreg_encoding::SysRegEncoding;

    const POLICY: RatePolicy = RatePolicy {
        burst: 3,
        refill_ticks: 100,
    };

    fn logged(decision: LogDecision) -> bool {
        matches!(decision, LogDecision::Log { .. })
    }

    #[test]
    fn bounded_set_keeps_at_most_its_capacity_sorted() {
        let mut set: BoundedSet<u64, 4> = BoundedSet::new(0);
        assert!(set.is_empty());
        assert_eq!(set.insert(30), Insertion::Added);
        assert_eq!(set.insert(10), Insertion::Added);
        assert_eq!(set.insert(30), Insertion::Present);
        assert_eq!(set.insert(20), Insertion::Added);
        assert_eq!(
            set.insert(0),
            Insertion::Added,
            "the filler value is no member"
        );
        assert!(set.is_full());
        assert_eq!(set.insert(40), Insertion::Full);
        assert_eq!(set.insert(20), Insertion::Present);
        assert_eq!(set.len(), 4);
        for v in [0, 10, 20, 30] {
            assert!(set.contains(&v));
        }
        assert!(!set.contains(&40));
        assert!(!set.contains(&5));
    }

    #[test]
    fn token_bucket_bursts_then_refills_and_counts_what_it_drops() {
        let mut log = EventLog::new(POLICY);
        let abort = |log: &mut EventLog, now| log.admit(Event::InjectedAbort, now);
        for _ in 0..3 {
            assert_eq!(abort(&mut log, 0), LogDecision::Log { suppressed: 0 });
        }
        for _ in 0..5 {
            assert_eq!(abort(&mut log, 99), LogDecision::Suppress);
        }
        // One period later: one line, which carries the count.
        assert_eq!(abort(&mut log, 100), LogDecision::Log { suppressed: 5 });
        assert_eq!(abort(&mut log, 150), LogDecision::Suppress);
        // A long pause refills to the burst, not beyond.
        let later = 1_000_000;
        for _ in 0..3 {
            assert!(logged(abort(&mut log, later)));
        }
        assert_eq!(abort(&mut log, later), LogDecision::Suppress);
        assert_eq!(log.take_suppressed(EventKind::InjectedAbort), 1);
        assert_eq!(log.take_suppressed(EventKind::InjectedAbort), 0);
        // A counter read behind the last one credits nothing.
        assert_eq!(abort(&mut log, 5), LogDecision::Suppress);
    }

    #[test]
    fn kinds_are_limited_separately() {
        let mut log = EventLog::new(POLICY);
        for _ in 0..1000 {
            log.admit(Event::InjectedAbort, 0);
        }
        assert_eq!(
            log.admit(Event::TestReport, 0),
            LogDecision::Log { suppressed: 0 }
        );
        assert!(logged(log.admit(Event::DeviceAccess, 0)));
        assert_eq!(log.take_suppressed(EventKind::InjectedAbort), 997);
    }

    #[test]
    fn unknown_ids_are_logged_once_and_remembered_within_the_bound() {
        let mut log = EventLog::new(RatePolicy {
            burst: 1000,
            refill_ticks: 1,
        });
        assert!(logged(log.admit(Event::UnknownHypercall(0xc600_00ff), 0)));
        assert_eq!(
            log.admit(Event::UnknownHypercall(0xc600_00ff), 0),
            LogDecision::Repeat
        );
        let reg = SysRegEncoding {
            op0: 3,
            op1: 0,
            crn: 12,
            crm: 11,
            op2: 5,
        };
        assert!(logged(log.admit(Event::UnknownSysReg(reg), 0)));
        assert_eq!(log.admit(Event::UnknownSysReg(reg), 0), LogDecision::Repeat);
        // Fill the remembered ids; later new ids are not remembered, so each
        // of their calls is a line for the rate limit, never a growing list.
        for id in 1..REMEMBERED_HYPERCALLS as u64 {
            assert!(logged(log.admit(Event::UnknownHypercall(id), 0)));
        }
        assert!(log.reported_calls.is_full());
        assert!(logged(log.admit(Event::UnknownHypercall(0xdead), 0)));
        assert!(logged(log.admit(Event::UnknownHypercall(0xdead), 0)));
        assert_eq!(
            log.admit(Event::UnknownHypercall(1), 0),
            LogDecision::Repeat,
            "remembered ids stay remembered"
        );
    }

    #[test]
    fn a_flood_of_distinct_ids_logs_a_bounded_number_of_lines() {
        let mut log = EventLog::new(RatePolicy {
            burst: 10,
            refill_ticks: 1_000,
        });
        let calls = 200_000u64;
        let mut lines = 0u64;
        let mut reported_suppressed = 0u64;
        for id in 0..calls {
            // One call per tick: 200 refill periods over the flood.
            match log.admit(Event::UnknownHypercall(0xc600_0100 + id), id) {
                LogDecision::Log { suppressed } => {
                    lines += 1;
                    reported_suppressed += suppressed;
                }
                LogDecision::Suppress => {}
                LogDecision::Repeat => panic!("no id repeats"),
            }
        }
        assert!(lines <= 10 + calls / 1_000, "{lines} lines");
        let pending = log.take_suppressed(EventKind::UnknownHypercall);
        assert_eq!(
            lines + reported_suppressed + pending,
            calls,
            "every call accounted"
        );
        assert!(log.reported_calls.len() <= REMEMBERED_HYPERCALLS);
    }

    #[test]
    fn policy_from_the_counter_frequency() {
        let policy = RatePolicy::for_counter_frequency(62_500_000);
        assert_eq!(policy.burst, RatePolicy::BURST);
        assert_eq!(policy.refill_ticks, 62_500_000 * RatePolicy::REFILL_SECONDS);
        assert_eq!(RatePolicy::for_counter_frequency(0).refill_ticks, 1);
    }
}
