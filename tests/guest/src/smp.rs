//! Multi-vCPU plumbing: the current CPU index, bounded waits on the virtual
//! counter, bringing secondaries up with PSCI `CPU_ON` and waiting for them to
//! power off, a counting barrier, and the end of the run.
//!
//! The boot vCPU is index 0; secondaries get indices 1.. in device-tree order,
//! passed as the PSCI context id and kept in `TPIDR_EL1`. The boot vCPU never
//! waits without a deadline, so a vCPU that fails to start or to finish turns
//! into a `RESULT: FAIL` line instead of a hang.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::boot::{self, MAX_CPUS};
use crate::platform::Platform;
use crate::scenarios::{self, Failure};
use crate::{println, psci};

/// How long the boot vCPU waits for the others at any one step.
const STEP_TIMEOUT_SECONDS: u64 = 60;

static ARRIVED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// Index of the vCPU running this code.
pub fn current_cpu() -> usize {
    let index: u64;
    // SAFETY: reading TPIDR_EL1, which the entry code set to the CPU index.
    unsafe { asm!("mrs {}, tpidr_el1", out(reg) index, options(nomem, nostack)) };
    index as usize
}

/// The virtual counter now and its frequency (ticks per second).
pub fn virtual_counter() -> (u64, u64) {
    let (now, frequency): (u64, u64);
    // SAFETY: reading the virtual counter and its frequency.
    unsafe {
        asm!("isb", "mrs {}, cntvct_el0", "mrs {}, cntfrq_el0", out(reg) now,
             out(reg) frequency, options(nomem, nostack));
    }
    (now, frequency)
}

/// The virtual counter in microseconds.
pub fn micros() -> u64 {
    let (now, frequency) = virtual_counter();
    (u128::from(now) * 1_000_000 / u128::from(frequency.max(1))) as u64
}

/// A point in time on the virtual counter.
#[derive(Clone, Copy)]
pub struct Deadline(u64);

impl Deadline {
    /// `seconds` from now.
    pub fn after_seconds(seconds: u64) -> Deadline {
        let (now, frequency) = virtual_counter();
        Deadline(now + seconds * frequency)
    }

    /// `millis` milliseconds from now.
    pub fn after_millis(millis: u64) -> Deadline {
        let (now, frequency) = virtual_counter();
        Deadline(now + millis * frequency / 1000)
    }

    /// The default deadline for one step of the boot vCPU.
    pub fn step() -> Deadline {
        Deadline::after_seconds(STEP_TIMEOUT_SECONDS)
    }

    /// Whether the deadline has passed.
    pub fn passed(self) -> bool {
        let now: u64;
        // SAFETY: reading the virtual counter.
        unsafe { asm!("isb", "mrs {}, cntvct_el0", out(reg) now, options(nomem, nostack)) };
        now >= self.0
    }
}

/// Starts every secondary in `platform` at the guest's secondary entry and
/// waits until each has arrived in Rust.
pub fn start_secondaries(platform: &Platform) -> Result<(), Failure> {
    start_cpus(platform, 1..platform.cpus().len())
}

/// Starts the secondaries `cpus` (indices into `platform.cpus()`, never 0) at
/// the guest's secondary entry and waits until each has arrived in Rust.
pub fn start_cpus(platform: &Platform, cpus: core::ops::Range<usize>) -> Result<(), Failure> {
    let entry = boot::secondary_entry_address();
    let mpidrs = &platform.cpus()[cpus.clone()];
    for (cpu, &mpidr) in cpus.clone().zip(mpidrs) {
        let status = psci::cpu_on(mpidr, entry, cpu as u64);
        if status != 0 {
            return Err(Failure::CpuOn { cpu, mpidr, status });
        }
    }
    let deadline = Deadline::step();
    for (cpu, &mpidr) in cpus.zip(mpidrs) {
        while !ARRIVED[cpu].load(Ordering::Acquire) {
            if deadline.passed() {
                return Err(Failure::CpuNeverArrived { cpu });
            }
            core::hint::spin_loop();
        }
        println!("test-guest: vcpu{cpu} up (mpidr {mpidr:#x})");
    }
    Ok(())
}

/// Waits until PSCI reports every secondary off.
pub fn wait_secondaries_off(platform: &Platform) -> Result<(), Failure> {
    wait_secondaries_off_up_to(platform, platform.cpus().len())
}

/// Waits until PSCI reports the secondaries among the first `count` CPUs off.
pub fn wait_secondaries_off_up_to(platform: &Platform, count: usize) -> Result<(), Failure> {
    let deadline = Deadline::step();
    let cpus = &platform.cpus()[..count.min(platform.cpus().len())];
    for (cpu, &mpidr) in cpus.iter().enumerate().skip(1) {
        loop {
            let state = psci::affinity_info(mpidr);
            if state == psci::AFFINITY_OFF {
                break;
            }
            if state < 0 {
                return Err(Failure::AffinityInfo { cpu, status: state });
            }
            if deadline.passed() {
                return Err(Failure::CpuStillOn { cpu });
            }
            core::hint::spin_loop();
        }
    }
    Ok(())
}

/// Runs on a secondary once its MMU and vectors are on.
pub fn secondary_work(cpu: usize) {
    ARRIVED[cpu].store(true, Ordering::Release);
    scenarios::secondary(cpu);
}

/// A counting barrier for one use: every participant arrives once.
pub struct Barrier {
    arrived: AtomicUsize,
}

impl Barrier {
    /// A barrier nobody has reached yet.
    pub const fn new() -> Barrier {
        Barrier {
            arrived: AtomicUsize::new(0),
        }
    }

    /// Arrives without waiting.
    pub fn arrive(&self) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
    }

    /// Waits until `participants` have arrived, or until `deadline` (when
    /// given) passes; returns how many had arrived.
    pub fn wait(&self, participants: usize, deadline: Option<Deadline>) -> usize {
        loop {
            let arrived = self.arrived.load(Ordering::Acquire);
            if arrived >= participants || deadline.is_some_and(Deadline::passed) {
                return arrived;
            }
            core::hint::spin_loop();
        }
    }
}

/// Prints the result line, reports it to the hypervisor and powers off.
pub fn finish(outcome: Result<(), Failure>) -> ! {
    match outcome {
        Ok(()) => {
            println!("RESULT: PASS");
            psci::test_report(0);
        }
        Err(failure) => {
            println!("RESULT: FAIL {failure}");
            psci::test_report(failure.code());
        }
    }
    psci::system_off()
}
