//! The test scenarios and the failures they report.
//!
//! `memory`: the boot vCPU checks the PSCI basics, divides the largest free
//! RAM range into one page-aligned share per vCPU, starts the secondaries and
//! works on share 0 itself. Each vCPU writes two words per 4 KiB page of its
//! share (a pattern of the address at the start, its complement at the end),
//! waits until every vCPU has written, then verifies the share of the next
//! vCPU, so every page is checked by a vCPU that did not write it: a wrong or
//! missing stage-2 mapping, or two IPAs backed by the same frame, shows up as
//! a mismatch. The boot vCPU then reads an IPA outside RAM and must catch the
//! abort, and waits until PSCI reports the secondaries off.
//!
//! `bad-guest`: reads and writes 0x0a00_0000 (no RAM, no device in the guest
//! memory map) and must catch two aborts with the right FAR and direction,
//! then issues the unknown hypercall 0xC600_00FF, which must return
//! `NOT_SUPPORTED`.
//!
//! `timers`: see [`crate::timers`].

use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::boot::MAX_CPUS;
use crate::bootargs::Scenario;
use crate::exceptions::{self, Access, DFSC_EXTERNAL_ABORT, EC_DATA_ABORT_SAME_EL};
use crate::gic::GicError;
use crate::memory_map::{MemRange, PAGE};
use crate::platform::Platform;
use crate::println;
use crate::psci::{self, function};
use crate::smp::{self, Barrier, Deadline};
use crate::timer_regs::{CounterError, Timer, TimerNodeError};
use crate::timers;

/// `TEST_REPORT` code of a panic.
pub const PANIC_CODE: u64 = 0xbad2_0001;
/// `TEST_REPORT` code of an exception the guest did not provoke.
pub const UNEXPECTED_EXCEPTION_CODE: u64 = 0xbad2_0002;

/// Address the bad-guest scenario touches: neither RAM nor an emulated device.
const UNMAPPED_DEVICE_ADDRESS: u64 = 0x0a00_0000;
/// Preferred address outside RAM for the memory scenario's abort probe.
const OUTSIDE_RAM_ADDRESS: u64 = 0x1_0000_0000;

/// Why a scenario failed; printed after `RESULT: FAIL`.
#[derive(Clone, Copy, Debug)]
pub enum Failure {
    /// PSCI `CPU_ON` refused a CPU.
    CpuOn {
        /// CPU index.
        cpu: usize,
        /// Its MPIDR.
        mpidr: u64,
        /// PSCI status returned.
        status: i64,
    },
    /// A started CPU never reached Rust.
    CpuNeverArrived {
        /// CPU index.
        cpu: usize,
    },
    /// A CPU did not finish its part in time.
    CpuTimedOut {
        /// How many of the expected CPUs arrived at the barrier.
        arrived: usize,
        /// How many were expected.
        expected: usize,
    },
    /// `AFFINITY_INFO` failed.
    AffinityInfo {
        /// CPU index.
        cpu: usize,
        /// PSCI status returned.
        status: i64,
    },
    /// A secondary did not power off.
    CpuStillOn {
        /// CPU index.
        cpu: usize,
    },
    /// A PSCI or SMCCC call answered something else than the contract says.
    Hypercall {
        /// The function id.
        function: u32,
        /// What came back in `x0`.
        returned: i64,
    },
    /// No free RAM to test.
    NoFreeRam,
    /// A verified word differs from what was written.
    Mismatch {
        /// The vCPU that found it.
        cpu: usize,
        /// Address of the word.
        address: u64,
        /// The value written.
        expected: u64,
        /// The value read.
        found: u64,
    },
    /// An access that must abort did not.
    NoAbort {
        /// The address accessed.
        address: u64,
    },
    /// An abort was taken but its syndrome is not the expected one.
    WrongAbort {
        /// The address accessed.
        address: u64,
        /// `ESR_EL1` seen.
        esr: u64,
        /// `FAR_EL1` seen.
        far: u64,
    },
    /// The scenario needs the hypervisor's services (booted directly).
    NeedsHypervisor,
    /// `test=` in the bootargs names no scenario.
    UnknownScenario(&'static str),
    /// The device tree lists more CPUs than the guest has stacks for.
    TooManyCpus {
        /// CPUs in the device tree.
        found: usize,
    },
    /// The device tree has no usable GICv3.
    NoGic,
    /// The device tree has no `arm,armv8-timer` node with `interrupts`.
    NoTimerNode,
    /// The timer node's `interrupts` are not what Linux expects.
    TimerNode(TimerNodeError),
    /// The GIC could not be set up.
    Gic {
        /// The vCPU.
        cpu: usize,
        /// What went wrong.
        error: GicError,
    },
    /// A timer was armed and its interrupt never came.
    TimerSilent {
        /// The vCPU.
        cpu: usize,
        /// Which timer.
        timer: Timer,
        /// Its INTID.
        intid: u32,
        /// How long the vCPU waited.
        seconds: u64,
    },
    /// A timer interrupt was taken while its timer had not fired.
    TimerEarly {
        /// The vCPU.
        cpu: usize,
        /// Which timer.
        timer: Timer,
        /// Its `CTL` in the handler.
        ctl: u64,
        /// Its counter in the handler.
        count: u64,
        /// Its `CVAL`.
        cval: u64,
    },
    /// The counters disagree or went backwards.
    Counter {
        /// The vCPU.
        cpu: usize,
        /// What was seen.
        error: CounterError,
    },
    /// An interrupt the scenario never enabled.
    UnexpectedInterrupt {
        /// The vCPU.
        cpu: usize,
        /// Its INTID.
        intid: u32,
    },
}

impl Failure {
    /// Code for `TEST_REPORT` (nonzero).
    pub fn code(&self) -> u64 {
        0xbad3_0000
            + match self {
                Failure::CpuOn { .. } => 1,
                Failure::CpuNeverArrived { .. } => 2,
                Failure::CpuTimedOut { .. } => 3,
                Failure::AffinityInfo { .. } => 4,
                Failure::CpuStillOn { .. } => 5,
                Failure::Hypercall { .. } => 6,
                Failure::NoFreeRam => 7,
                Failure::Mismatch { .. } => 8,
                Failure::NoAbort { .. } => 9,
                Failure::WrongAbort { .. } => 10,
                Failure::NeedsHypervisor => 11,
                Failure::UnknownScenario(_) => 12,
                Failure::TooManyCpus { .. } => 13,
                Failure::NoGic => 14,
                Failure::NoTimerNode => 15,
                Failure::TimerNode(_) => 16,
                Failure::Gic { .. } => 17,
                Failure::TimerSilent { .. } => 18,
                Failure::TimerEarly { .. } => 19,
                Failure::Counter { .. } => 20,
                Failure::UnexpectedInterrupt { .. } => 21,
            }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Failure::CpuOn { cpu, mpidr, status } => {
                write!(
                    f,
                    "PSCI CPU_ON of vcpu{cpu} (mpidr {mpidr:#x}) returned {status}"
                )
            }
            Failure::CpuNeverArrived { cpu } => write!(f, "vcpu{cpu} started but never arrived"),
            Failure::CpuTimedOut { arrived, expected } => {
                write!(f, "only {arrived} of {expected} vCPUs finished in time")
            }
            Failure::AffinityInfo { cpu, status } => {
                write!(f, "PSCI AFFINITY_INFO of vcpu{cpu} returned {status}")
            }
            Failure::CpuStillOn { cpu } => write!(f, "vcpu{cpu} did not power off"),
            Failure::Hypercall { function, returned } => {
                write!(f, "hypercall {function:#x} returned {returned:#x}")
            }
            Failure::NoFreeRam => write!(f, "no free RAM to test"),
            Failure::Mismatch {
                cpu,
                address,
                expected,
                found,
            } => write!(
                f,
                "vcpu{cpu} read {found:#x} at {address:#x}, expected {expected:#x}"
            ),
            Failure::NoAbort { address } => write!(f, "access to {address:#x} did not abort"),
            Failure::WrongAbort { address, esr, far } => write!(
                f,
                "access to {address:#x} aborted with ESR {esr:#x} FAR {far:#x}, expected a \
                 synchronous external data abort at that address"
            ),
            Failure::NeedsHypervisor => write!(f, "this scenario needs the hypervisor"),
            Failure::TooManyCpus { found } => {
                write!(
                    f,
                    "{found} CPUs in the device tree; the guest drives at most {MAX_CPUS}"
                )
            }
            Failure::UnknownScenario(name) => {
                write!(
                    f,
                    "unknown scenario `test={name}` (known: memory, bad-guest, timers)"
                )
            }
            Failure::NoGic => write!(
                f,
                "the device tree has no GICv3 (arm,gic-v3 with distributor and redistributors)"
            ),
            Failure::NoTimerNode => write!(
                f,
                "the device tree has no arm,armv8-timer node with interrupts"
            ),
            Failure::TimerNode(error) => write!(f, "{error}"),
            Failure::Gic { cpu, error } => match error {
                GicError::NoRedistributor { mpidr } => {
                    write!(f, "vcpu{cpu}: no redistributor for mpidr {mpidr:#x}")
                }
                GicError::Stuck { register } => {
                    write!(f, "vcpu{cpu}: {register} never cleared")
                }
            },
            Failure::TimerSilent {
                cpu,
                timer,
                intid,
                seconds,
            } => write!(
                f,
                "vcpu{cpu}: the {timer} timer fired but its interrupt (INTID {intid}) did not \
                 arrive within {seconds} s"
            ),
            Failure::TimerEarly {
                cpu,
                timer,
                ctl,
                count,
                cval,
            } => write!(
                f,
                "vcpu{cpu}: {timer} timer interrupt taken with CTL {ctl:#x}, count {count:#x}, \
                 CVAL {cval:#x}: the timer had not fired"
            ),
            Failure::Counter { cpu, error } => match error {
                CounterError::Mismatch {
                    virt_before,
                    phys,
                    virt_after,
                } => write!(
                    f,
                    "vcpu{cpu}: CNTPCT_EL0 {phys:#x} not between CNTVCT_EL0 reads {virt_before:#x} \
                     and {virt_after:#x} (offsets must be zero)"
                ),
                CounterError::Backwards { earlier, later } => write!(
                    f,
                    "vcpu{cpu}: counter went backwards from {earlier:#x} to {later:#x}"
                ),
            },
            Failure::UnexpectedInterrupt { cpu, intid } => {
                write!(f, "vcpu{cpu}: unexpected interrupt INTID {intid}")
            }
        }
    }
}

/// Runs the scenario the bootargs chose, on the boot vCPU.
pub fn run(platform: &Platform, scenario: Scenario) -> Result<(), Failure> {
    let ram = platform.ram()[0];
    println!(
        "test-guest: scenario {}, {} vCPUs, RAM {}{}, UART {:#x}, device tree at {:#x}",
        scenario.name(),
        platform.cpus_in_tree,
        ram,
        if platform.ram().len() > 1 {
            " (and more)"
        } else {
            ""
        },
        platform.uart_base,
        platform.dtb.start,
    );
    if platform.cpus_in_tree > MAX_CPUS {
        return Err(Failure::TooManyCpus {
            found: platform.cpus_in_tree,
        });
    }
    match scenario {
        Scenario::Memory => memory(platform),
        Scenario::BadGuest => bad_guest(),
        Scenario::Timers => {
            TIMERS_ON_SECONDARIES.store(true, Ordering::Release);
            timers::scenario(platform)
        }
    }
}

/// The secondaries run the `timers` scenario's part (else `memory`'s).
static TIMERS_ON_SECONDARIES: AtomicBool = AtomicBool::new(false);

/// Entry of a secondary's part of the scenario (`memory` and `timers` start
/// them).
pub fn secondary(cpu: usize) {
    if TIMERS_ON_SECONDARIES.load(Ordering::Acquire) {
        timers::worker(cpu);
    } else {
        memory_worker(cpu, None);
    }
}

fn expect(function: u32, returned: i64, ok: bool) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure::Hypercall { function, returned })
    }
}

fn check_firmware() -> Result<(), Failure> {
    let version = psci::call(function::PSCI_VERSION, 0, 0, 0);
    expect(function::PSCI_VERSION, version, version >= 0x1_0000)?;
    let features = psci::call(function::PSCI_FEATURES, u64::from(function::CPU_ON), 0, 0);
    expect(function::PSCI_FEATURES, features, features >= 0)?;
    let migrate = psci::call(function::MIGRATE_INFO_TYPE, 0, 0, 0);
    expect(function::MIGRATE_INFO_TYPE, migrate, migrate == 2)?;
    println!(
        "test-guest: PSCI {}.{}, CPU_ON features {features:#x}, MIGRATE_INFO_TYPE {migrate}",
        version >> 16,
        version & 0xffff
    );
    if psci::hypervisor_services() {
        let smccc = psci::call(function::SMCCC_VERSION, 0, 0, 0);
        expect(function::SMCCC_VERSION, smccc, smccc >= 0x1_0000)?;
        println!("test-guest: SMCCC {}.{}", smccc >> 16, smccc & 0xffff);
    }
    Ok(())
}

/// Share of RAM of each vCPU: [start, end), set before the vCPUs start.
static SHARE_START: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static SHARE_END: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static WORKERS: AtomicUsize = AtomicUsize::new(0);
static WRITTEN: Barrier = Barrier::new();
static VERIFIED: Barrier = Barrier::new();
/// First mismatch each vCPU found (address 0: none).
static MISMATCH_ADDRESS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static MISMATCH_EXPECTED: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static MISMATCH_FOUND: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

fn pattern(address: u64) -> u64 {
    (address ^ 0x5eed_c0de_0000_0000).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The two words each page carries: (offset in the page, value).
fn page_words(page: u64) -> [(u64, u64); 2] {
    [(0, pattern(page)), (PAGE - 8, !pattern(page))]
}

fn memory(platform: &Platform) -> Result<(), Failure> {
    check_firmware()?;
    let free = platform.largest_free_range().ok_or(Failure::NoFreeRam)?;
    let workers = platform.cpus().len();
    let pages = free.len() / PAGE;
    if pages < workers as u64 {
        return Err(Failure::NoFreeRam);
    }
    for cpu in 0..workers {
        let first = free.start + pages * cpu as u64 / workers as u64 * PAGE;
        let end = free.start + pages * (cpu as u64 + 1) / workers as u64 * PAGE;
        SHARE_START[cpu].store(first, Ordering::Relaxed);
        SHARE_END[cpu].store(end, Ordering::Relaxed);
    }
    WORKERS.store(workers, Ordering::Release);
    println!(
        "test-guest: memory: testing {free} ({} MiB) with {workers} vCPUs in 4 KiB strides",
        free.len() >> 20
    );
    smp::start_secondaries(platform)?;

    memory_worker(0, Some(Deadline::step()));
    let arrived = VERIFIED.wait(workers, Some(Deadline::step()));
    if arrived < workers {
        return Err(Failure::CpuTimedOut {
            arrived,
            expected: workers,
        });
    }
    for cpu in 0..workers {
        let address = MISMATCH_ADDRESS[cpu].load(Ordering::Acquire);
        if address != 0 {
            return Err(Failure::Mismatch {
                cpu,
                address,
                expected: MISMATCH_EXPECTED[cpu].load(Ordering::Relaxed),
                found: MISMATCH_FOUND[cpu].load(Ordering::Relaxed),
            });
        }
    }
    println!("test-guest: memory: {pages} pages written and verified across vCPUs");

    let outside = outside_ram(platform);
    let abort =
        exceptions::probe(outside, Access::Read).ok_or(Failure::NoAbort { address: outside })?;
    check_abort(outside, abort, Access::Read)?;
    println!(
        "test-guest: caught abort reading {outside:#x}: ESR {:#x} FAR {:#x}",
        abort.esr, abort.far
    );
    smp::wait_secondaries_off(platform)?;
    println!("test-guest: all secondary vCPUs off");
    Ok(())
}

/// An address outside RAM: 0x1_0000_0000, or the first gigabyte boundary
/// above RAM when RAM reaches that far.
fn outside_ram(platform: &Platform) -> u64 {
    if !platform.is_ram(OUTSIDE_RAM_ADDRESS) {
        return OUTSIDE_RAM_ADDRESS;
    }
    let top = platform
        .ram()
        .iter()
        .map(|r| r.end)
        .max()
        .unwrap_or(OUTSIDE_RAM_ADDRESS);
    top.next_multiple_of(1 << 30)
}

/// One vCPU's part: write its share, wait for everybody, verify the next
/// share, arrive at `VERIFIED`. The boot vCPU passes a deadline; a secondary
/// waits for as long as it takes (the boot vCPU gives up for it).
fn memory_worker(cpu: usize, deadline: Option<Deadline>) {
    let workers = WORKERS.load(Ordering::Acquire);
    let mine = MemRange {
        start: SHARE_START[cpu].load(Ordering::Relaxed),
        end: SHARE_END[cpu].load(Ordering::Relaxed),
    };
    for page in (mine.start..mine.end).step_by(PAGE as usize) {
        for (offset, value) in page_words(page) {
            // SAFETY: the share is free guest RAM (no image, device tree or
            // initrd), identity mapped as normal memory, and only this vCPU
            // writes it.
            unsafe { core::ptr::write_volatile((page + offset) as *mut u64, value) };
        }
    }
    WRITTEN.arrive();
    if WRITTEN.wait(workers, deadline) < workers {
        // The boot vCPU reports the missing vCPUs after its VERIFIED wait.
        return;
    }
    let next = (cpu + 1) % workers;
    let theirs = MemRange {
        start: SHARE_START[next].load(Ordering::Relaxed),
        end: SHARE_END[next].load(Ordering::Relaxed),
    };
    'pages: for page in (theirs.start..theirs.end).step_by(PAGE as usize) {
        for (offset, expected) in page_words(page) {
            // SAFETY: as above; every writer has passed the WRITTEN barrier.
            let found = unsafe { core::ptr::read_volatile((page + offset) as *const u64) };
            if found != expected {
                MISMATCH_EXPECTED[cpu].store(expected, Ordering::Relaxed);
                MISMATCH_FOUND[cpu].store(found, Ordering::Relaxed);
                MISMATCH_ADDRESS[cpu].store(page + offset, Ordering::Release);
                break 'pages;
            }
        }
    }
    VERIFIED.arrive();
}

fn check_abort(address: u64, abort: exceptions::Abort, access: Access) -> Result<(), Failure> {
    let ok = abort.class() == EC_DATA_ABORT_SAME_EL
        && abort.status() == DFSC_EXTERNAL_ABORT
        && abort.far == address
        && abort.is_write() == (access == Access::Write);
    if ok {
        Ok(())
    } else {
        Err(Failure::WrongAbort {
            address,
            esr: abort.esr,
            far: abort.far,
        })
    }
}

fn bad_guest() -> Result<(), Failure> {
    if !psci::hypervisor_services() {
        return Err(Failure::NeedsHypervisor);
    }
    let address = UNMAPPED_DEVICE_ADDRESS;
    for access in [Access::Read, Access::Write] {
        let abort = exceptions::probe(address, access).ok_or(Failure::NoAbort { address })?;
        check_abort(address, abort, access)?;
        println!(
            "test-guest: caught abort on {access:?} of {address:#x}: ESR {:#x} FAR {:#x}",
            abort.esr, abort.far
        );
    }
    let returned = psci::call(function::UNKNOWN, 0, 0, 0);
    expect(function::UNKNOWN, returned, returned == psci::NOT_SUPPORTED)?;
    println!(
        "test-guest: unknown hypercall {:#x} returned NOT_SUPPORTED",
        function::UNKNOWN
    );
    Ok(())
}
