//! The `timers` scenario: both EL1 timers deliver their interrupts through
//! the GIC on every vCPU, and the two counters agree.
//!
//! The boot vCPU reads the timer node of the device tree (the non-secure
//! physical timer's PPI, 30 on QEMU `virt`, and the virtual timer's, 27; both
//! must be level-triggered PPIs), turns the distributor on and starts the
//! secondaries. Every vCPU then, on its own:
//!
//! 1. wakes its redistributor, enables both PPIs and its CPU interface;
//! 2. reads `CNTVCT_EL0`, `CNTPCT_EL0`, `CNTVCT_EL0` many times: the physical
//!    count must lie between the two virtual ones (the hypervisor's offsets
//!    are zero: one clock) and nothing may go backwards, also against the
//!    largest value any vCPU has seen before;
//! 3. arms the physical timer alone ([`ROUNDS`] times, alternately through
//!    `CNTP_TVAL_EL0` and `CNTP_CVAL_EL0`, then `CTL.ENABLE`) and waits in
//!    `WFI` until its interrupt has been taken;
//! 4. arms both timers at once ([`ROUNDS`] times, either one first or both
//!    together) and waits until both interrupts have been taken;
//! 5. leaves a stale interrupt behind ([`STALE_ROUNDS`] times, alternately
//!    the physical and the virtual timer's): with `PSTATE.I` set it arms the
//!    timer for 10 us and spins until `ISR_EL1.I` shows its interrupt pending
//!    at the virtual CPU interface, then disables the timer (`CTL = 0`, the
//!    physical one's then the virtual one's, as a guest switching timers
//!    would), arms the other timer for 1 ms and unmasks without a `WFI`: the
//!    first interrupt taken must be the other timer's, at or after its
//!    compare value. A level-sensitive interrupt follows its line, so the
//!    disabled timer's interrupt must be gone (the handler rejects a timer
//!    interrupt taken while its timer is disabled);
//! 6. checks the counters again.
//!
//! The IRQ vector hands the scenario its interrupts through
//! `gic::take_interrupts`, which acknowledges from `ICC_IAR1_EL1` until
//! nothing is pending and writes `ICC_EOIR1_EL1` after each. For a timer's
//! INTID, [`interrupt`] checks that the timer is enabled with `ISTATUS` set
//! and its counter at or past `CVAL` (no early or phantom interrupt),
//! silences it (masks, disables or defers it, in turn:
//! [`Quiesce::for_count`]) and counts it; anything else is recorded as
//! unexpected.
//!
//! Waiting is race-free: with `PSTATE.I` set the vCPU checks its counts,
//! executes `WFI` (which a pending interrupt ends even while masked), and
//! only then unmasks to take the interrupt. A timer whose interrupt never
//! comes would leave the vCPU asleep for good, so while the virtual timer is
//! not under test it is armed as a watchdog at the round's deadline
//! ([`ROUND_TIMEOUT_SECONDS`]): the vCPU wakes up and reports the silent timer
//! as `RESULT: FAIL` instead of hanging (should the virtual timer be broken
//! too, the run's time limit ends it). An interrupt taken only at the
//! deadline counts as silent too: it was delivered on the watchdog's account
//! (a hypervisor that samples the line only on other exits), not its own.

use core::arch::asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::boot::MAX_CPUS;
use crate::bootargs::Scenario;
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{self, Barrier, Deadline};
use crate::timer_regs::{CounterCheck, Quiesce, Timer, TimerPpis, ctl, fired_in_time};
use crate::{exceptions, gic};

/// Rounds of each phase.
pub const ROUNDS: u64 = 6;
/// Rounds of the stale-interrupt phase (half of them each timer's).
pub const STALE_ROUNDS: u64 = 4;
/// How long one round may take before its missing interrupt is reported.
pub const ROUND_TIMEOUT_SECONDS: u64 = 10;
/// Counter triples read in each counter check.
const COUNTER_READS: usize = 2000;

/// The timers' INTIDs (set before the IRQ vector hands interrupts here).
static PPIS: [AtomicU32; 2] = [const { AtomicU32::new(0) }; 2];
/// Interrupts taken, per vCPU and timer.
static FIRED: [[AtomicU64; 2]; MAX_CPUS] = [const { [const { AtomicU64::new(0) }; 2] }; MAX_CPUS];
/// The timer's counter when its last interrupt was taken, per vCPU and timer.
static TAKEN_AT: [[AtomicU64; 2]; MAX_CPUS] =
    [const { [const { AtomicU64::new(0) }; 2] }; MAX_CPUS];
/// Largest counter value any vCPU has checked.
static COUNTER_FLOOR: AtomicU64 = AtomicU64::new(0);
/// Every vCPU's part is over (its result published).
static DONE: Barrier = Barrier::new();
/// What each vCPU's part came to.
static RESULTS: [ResultSlot; MAX_CPUS] = [const { ResultSlot::new() }; MAX_CPUS];
/// What the IRQ handler found wrong on each vCPU (first only).
static HANDLER_FAILURES: [ResultSlot; MAX_CPUS] = [const { ResultSlot::new() }; MAX_CPUS];

/// A failure written once by one vCPU and read by others after the flag.
struct ResultSlot {
    published: AtomicBool,
    failure: UnsafeCell<Option<Failure>>,
}

// SAFETY: `failure` is written only by the owning vCPU, before `published`
// is set (release), and only once (`publish` checks the flag first, and the
// IRQ handler and its vCPU never publish into the same slot); readers read it
// only after seeing `published` set (acquire).
unsafe impl Sync for ResultSlot {}

impl ResultSlot {
    const fn new() -> ResultSlot {
        ResultSlot {
            published: AtomicBool::new(false),
            failure: UnsafeCell::new(None),
        }
    }

    /// Publishes `outcome` (the first one only).
    fn publish(&self, outcome: Result<(), Failure>) {
        if self.published.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: see the `Sync` impl: the owner writes before publishing.
        unsafe { *self.failure.get() = outcome.err() };
        self.published.store(true, Ordering::Release);
    }

    /// `None` until published; then the outcome.
    fn read(&self) -> Option<Result<(), Failure>> {
        if !self.published.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: see the `Sync` impl: published, so never written again.
        Some(match unsafe { *self.failure.get() } {
            Some(failure) => Err(failure),
            None => Ok(()),
        })
    }
}

fn counter(timer: Timer) -> u64 {
    let value: u64;
    // SAFETY: reading a counter (after an ISB, so not early) has no side
    // effects.
    unsafe {
        match timer {
            Timer::Physical => {
                asm!("isb", "mrs {}, cntpct_el0", out(reg) value, options(nomem, nostack))
            }
            Timer::Virtual => {
                asm!("isb", "mrs {}, cntvct_el0", out(reg) value, options(nomem, nostack))
            }
        }
    }
    value
}

fn frequency() -> u64 {
    let value: u64;
    // SAFETY: reading CNTFRQ_EL0 has no side effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) value, options(nomem, nostack)) };
    value
}

fn read_ctl(timer: Timer) -> u64 {
    let value: u64;
    // SAFETY: reading this vCPU's own timer control register.
    unsafe {
        match timer {
            Timer::Physical => {
                asm!("mrs {}, cntp_ctl_el0", out(reg) value, options(nomem, nostack))
            }
            Timer::Virtual => asm!("mrs {}, cntv_ctl_el0", out(reg) value, options(nomem, nostack)),
        }
    }
    value
}

fn read_cval(timer: Timer) -> u64 {
    let value: u64;
    // SAFETY: reading this vCPU's own timer compare value.
    unsafe {
        match timer {
            Timer::Physical => {
                asm!("mrs {}, cntp_cval_el0", out(reg) value, options(nomem, nostack))
            }
            Timer::Virtual => {
                asm!("mrs {}, cntv_cval_el0", out(reg) value, options(nomem, nostack))
            }
        }
    }
    value
}

fn write_ctl(timer: Timer, value: u64) {
    // SAFETY: this vCPU's own timer; the ISB makes the change take effect
    // before whatever follows.
    unsafe {
        match timer {
            Timer::Physical => asm!("msr cntp_ctl_el0, {}", "isb", in(reg) value, options(nostack)),
            Timer::Virtual => asm!("msr cntv_ctl_el0, {}", "isb", in(reg) value, options(nostack)),
        }
    }
}

fn write_cval(timer: Timer, value: u64) {
    // SAFETY: this vCPU's own timer.
    unsafe {
        match timer {
            Timer::Physical => {
                asm!("msr cntp_cval_el0, {}", "isb", in(reg) value, options(nostack))
            }
            Timer::Virtual => asm!("msr cntv_cval_el0, {}", "isb", in(reg) value, options(nostack)),
        }
    }
}

fn write_tval(timer: Timer, value: u64) {
    // SAFETY: this vCPU's own timer; TVAL sets CVAL to the count plus it.
    unsafe {
        match timer {
            Timer::Physical => {
                asm!("msr cntp_tval_el0, {}", "isb", in(reg) value, options(nostack))
            }
            Timer::Virtual => asm!("msr cntv_tval_el0, {}", "isb", in(reg) value, options(nostack)),
        }
    }
}

fn mask_irqs() {
    // SAFETY: masking IRQs at EL1 only defers interrupts.
    unsafe { asm!("msr daifset, #2", options(nomem, nostack)) };
}

/// Sleeps until an interrupt is pending (`WFI` wakes on a pending interrupt
/// even with `PSTATE.I` set), takes it with IRQs briefly unmasked, and masks
/// them again. Memory is clobbered: the handler updates the counts.
fn wait_and_take_interrupts() {
    // SAFETY: WFI only suspends; the handler runs between the unmask and the
    // mask with the vectors installed, and saves everything it touches.
    unsafe {
        asm!(
            "dsb sy",
            "wfi",
            "msr daifclr, #2",
            "isb",
            "msr daifset, #2",
            options(nostack)
        )
    };
}

/// `ISR_EL1.I`: an IRQ is pending at the (virtual) CPU interface.
fn irq_signalled() -> bool {
    let value: u64;
    // SAFETY: reading ISR_EL1 has no side effects.
    unsafe { asm!("isb", "mrs {}, isr_el1", out(reg) value, options(nomem, nostack)) };
    value & (1 << 7) != 0
}

/// Unmasks IRQs and spins (no `WFI`, no trapped access) until `done` or the
/// virtual counter reaches `deadline`; masks them again.
fn take_interrupts_until(deadline: u64, done: impl Fn() -> bool) {
    // SAFETY: unmasking IRQs lets the installed handler run; it saves
    // everything it touches.
    unsafe { asm!("msr daifclr, #2", "isb", options(nostack)) };
    while !done() && counter(Timer::Virtual) < deadline {
        core::hint::spin_loop();
    }
    mask_irqs();
}

/// How a round arms a timer.
#[derive(Clone, Copy, Debug)]
enum Arm {
    /// `TVAL` = ticks from now.
    Tval(u64),
    /// `CVAL` = the counter now plus ticks.
    Cval(u64),
}

fn arm(timer: Timer, how: Arm) {
    write_ctl(timer, 0);
    match how {
        Arm::Tval(ticks) => write_tval(timer, ticks),
        Arm::Cval(ticks) => write_cval(timer, counter(timer) + ticks),
    }
    write_ctl(timer, ctl::ENABLE);
}

fn fired(cpu: usize, timer: Timer) -> u64 {
    FIRED[cpu][timer.index()].load(Ordering::Acquire)
}

fn ppis() -> TimerPpis {
    TimerPpis {
        physical: PPIS[Timer::Physical.index()].load(Ordering::Acquire),
        virtual_: PPIS[Timer::Virtual.index()].load(Ordering::Acquire),
    }
}

/// One interrupt taken while the scenario runs (from `gic::take_interrupts`,
/// which acknowledges and finishes it): a timer's, or unexpected.
pub fn interrupt(intid: u32) {
    let cpu = smp::current_cpu();
    match ppis().timer_of(intid) {
        Some(timer) => timer_interrupt(cpu, timer),
        None => HANDLER_FAILURES[cpu].publish(Err(Failure::UnexpectedInterrupt { cpu, intid })),
    }
}

fn timer_interrupt(cpu: usize, timer: Timer) {
    let ctl_value = read_ctl(timer);
    let cval = read_cval(timer);
    let count = counter(timer);
    if !fired_in_time(ctl_value, count, cval) {
        HANDLER_FAILURES[cpu].publish(Err(Failure::TimerEarly {
            cpu,
            timer,
            ctl: ctl_value,
            count,
            cval,
        }));
    }
    let n = FIRED[cpu][timer.index()].load(Ordering::Relaxed);
    match Quiesce::for_count(n) {
        Quiesce::Mask => write_ctl(timer, ctl::ENABLE | ctl::IMASK),
        Quiesce::Disable => write_ctl(timer, 0),
        Quiesce::Defer => write_cval(timer, count + frequency() * 3600),
    }
    TAKEN_AT[cpu][timer.index()].store(count, Ordering::Relaxed);
    FIRED[cpu][timer.index()].store(n + 1, Ordering::Release);
}

fn silent(cpu: usize, timer: Timer) -> Failure {
    Failure::TimerSilent {
        cpu,
        timer,
        intid: ppis().intid(timer),
        seconds: ROUND_TIMEOUT_SECONDS,
    }
}

/// One round: arms the requested timers, waits until each has interrupted
/// once (before the round's deadline), disables both.
fn round(cpu: usize, physical: Option<Arm>, virtual_: Option<Arm>) -> Result<(), Failure> {
    mask_irqs();
    let start = Timer::ALL.map(|t| fired(cpu, t));
    let wanted = |timer: Timer| match timer {
        Timer::Physical => physical.is_some(),
        Timer::Virtual => virtual_.is_some(),
    };
    let deadline = counter(Timer::Virtual) + ROUND_TIMEOUT_SECONDS * frequency();
    for (timer, how) in [(Timer::Physical, physical), (Timer::Virtual, virtual_)] {
        if let Some(how) = how {
            arm(timer, how);
        }
    }
    let mut watchdog = false;
    let outcome = loop {
        if let Some(Err(failure)) = HANDLER_FAILURES[cpu].read() {
            break Err(failure);
        }
        let missing = Timer::ALL
            .into_iter()
            .find(|&t| wanted(t) && fired(cpu, t) == start[t.index()]);
        let Some(missing) = missing else {
            // An interrupt taken only at the deadline came with the
            // watchdog's exit, not by itself: it counts as missing.
            let late = Timer::ALL.into_iter().find(|&t| {
                wanted(t) && TAKEN_AT[cpu][t.index()].load(Ordering::Relaxed) >= deadline
            });
            break match late {
                Some(timer) => Err(silent(cpu, timer)),
                None => Ok(()),
            };
        };
        if counter(Timer::Virtual) >= deadline {
            break Err(silent(cpu, missing));
        }
        let virtual_free =
            !wanted(Timer::Virtual) || fired(cpu, Timer::Virtual) != start[Timer::Virtual.index()];
        if virtual_free && !watchdog {
            write_ctl(Timer::Virtual, 0);
            write_cval(Timer::Virtual, deadline);
            write_ctl(Timer::Virtual, ctl::ENABLE);
            watchdog = true;
        }
        wait_and_take_interrupts();
    };
    for timer in Timer::ALL {
        write_ctl(timer, 0);
    }
    outcome
}

/// One round of the stale-interrupt phase (step 5 of the module docs):
/// `stale`'s interrupt is left pending and its timer disabled, the other
/// timer armed for 1 ms; the other's interrupt must be the first one taken.
fn stale_round(cpu: usize, stale: Timer) -> Result<(), Failure> {
    mask_irqs();
    let other = match stale {
        Timer::Physical => Timer::Virtual,
        Timer::Virtual => Timer::Physical,
    };
    let start = Timer::ALL.map(|t| fired(cpu, t));
    let deadline = counter(Timer::Virtual) + ROUND_TIMEOUT_SECONDS * frequency();
    arm(stale, Arm::Tval((frequency() / 100_000).max(1)));
    while !irq_signalled() {
        if counter(Timer::Virtual) >= deadline {
            write_ctl(stale, 0);
            return Err(silent(cpu, stale));
        }
        core::hint::spin_loop();
    }
    write_ctl(Timer::Physical, 0);
    write_ctl(Timer::Virtual, 0);
    arm(other, Arm::Tval(frequency() / 1000));
    take_interrupts_until(deadline, || {
        fired(cpu, other) != start[other.index()] || HANDLER_FAILURES[cpu].read().is_some()
    });
    for timer in Timer::ALL {
        write_ctl(timer, 0);
    }
    if let Some(Err(failure)) = HANDLER_FAILURES[cpu].read() {
        return Err(failure);
    }
    if fired(cpu, stale) != start[stale.index()] {
        return Err(Failure::TimerEarly {
            cpu,
            timer: stale,
            ctl: 0,
            count: TAKEN_AT[cpu][stale.index()].load(Ordering::Relaxed),
            cval: read_cval(stale),
        });
    }
    if fired(cpu, other) == start[other.index()] {
        return Err(silent(cpu, other));
    }
    Ok(())
}

/// Reads the counters [`COUNTER_READS`] times (see the module docs).
fn check_counters(cpu: usize) -> Result<(), Failure> {
    // SAFETY: a barrier only orders: the floor is read before the counters.
    unsafe { asm!("dsb ish", options(nostack)) };
    let mut check = CounterCheck::from_floor(COUNTER_FLOOR.load(Ordering::Acquire));
    for _ in 0..COUNTER_READS {
        let virt_before = counter(Timer::Virtual);
        let phys = counter(Timer::Physical);
        let virt_after = counter(Timer::Virtual);
        check
            .check(virt_before, phys, virt_after)
            .map_err(|error| Failure::Counter { cpu, error })?;
    }
    COUNTER_FLOOR.fetch_max(check.last(), Ordering::AcqRel);
    Ok(())
}

/// One vCPU's part (see the module docs).
fn run(cpu: usize) -> Result<(), Failure> {
    let ppis = ppis();
    gic::init_cpu(&[ppis.physical, ppis.virtual_]).map_err(|error| Failure::Gic { cpu, error })?;
    check_counters(cpu)?;
    let ms = frequency() / 1000;
    for n in 0..ROUNDS {
        let how = if n % 2 == 0 {
            Arm::Tval(ms)
        } else {
            Arm::Cval(2 * ms)
        };
        round(cpu, Some(how), None)?;
    }
    for n in 0..ROUNDS {
        let (physical, virtual_) = match n % 3 {
            0 => (Arm::Tval(ms), Arm::Cval(2 * ms)),
            1 => (Arm::Cval(2 * ms), Arm::Tval(ms)),
            _ => (Arm::Cval(ms), Arm::Cval(ms)),
        };
        round(cpu, Some(physical), Some(virtual_))?;
    }
    for n in 0..STALE_ROUNDS {
        let stale = if n % 2 == 0 {
            Timer::Physical
        } else {
            Timer::Virtual
        };
        stale_round(cpu, stale)?;
    }
    check_counters(cpu)
}

/// A vCPU's part, published for the boot vCPU.
pub fn worker(cpu: usize) {
    let outcome = run(cpu);
    RESULTS[cpu].publish(outcome);
    DONE.arrive();
}

/// The scenario, on the boot vCPU.
pub fn scenario(platform: &Platform) -> Result<(), Failure> {
    let frames = platform.gic.ok_or(Failure::NoGic)?;
    let cells = platform.timer_cells().ok_or(Failure::NoTimerNode)?;
    let ppis = TimerPpis::from_cells(cells).map_err(Failure::TimerNode)?;
    println!(
        "test-guest: timers: physical timer INTID {}, virtual timer INTID {}, counter {} Hz, \
         {ROUNDS} rounds physical, {ROUNDS} both, {STALE_ROUNDS} with a stale interrupt",
        ppis.physical,
        ppis.virtual_,
        frequency()
    );
    gic::init_distributor(frames).map_err(|error| Failure::Gic { cpu: 0, error })?;
    PPIS[Timer::Virtual.index()].store(ppis.virtual_, Ordering::Release);
    PPIS[Timer::Physical.index()].store(ppis.physical, Ordering::Release);
    exceptions::take_irqs_for(Scenario::Timers);
    let workers = platform.cpus().len();
    smp::start_secondaries(platform)?;
    worker(0);
    let deadline =
        Deadline::after_seconds((2 * ROUNDS + STALE_ROUNDS) * ROUND_TIMEOUT_SECONDS + 30);
    let arrived = DONE.wait(workers, Some(deadline));
    for slot in RESULTS.iter().take(workers) {
        if let Some(Err(failure)) = slot.read() {
            return Err(failure);
        }
    }
    if arrived < workers {
        return Err(Failure::CpuTimedOut {
            arrived,
            expected: workers,
        });
    }
    for cpu in 0..workers {
        println!(
            "test-guest: timers: vcpu{cpu}: {} physical and {} virtual timer interrupts",
            fired(cpu, Timer::Physical),
            fired(cpu, Timer::Virtual)
        );
    }
    println!("test-guest: timers: CNTPCT_EL0 and CNTVCT_EL0 equal and monotonic on every vCPU");
    smp::wait_secondaries_off(platform)?;
    println!("test-guest: all secondary vCPUs off");
    Ok(())
}
