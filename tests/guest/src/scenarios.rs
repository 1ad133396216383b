//! The test scenarios and the failures they report.
//!
//! `memory`: the boot vCPU checks the PSCI basics, divides the largest free
//! RAM range into one page-aligned share per vCPU, starts the secondaries and
//! works on share 0 itself. Each vCPU writes two words per 4 KiB page of its
//! share (a pattern of the address at the start, its complement at the end),
//! waits until every vCPU has written, then verifies the share of the next
//! vCPU, so every page is checked by a vCPU that did not write it: a wrong or
//! missing stage-2 mapping, or two IPAs backed by the same frame, shows up as
//! a mismatch. The boot vCPU then does set/way cache maintenance around
//! turning its MMU and caches off and on (which a hypervisor without FWB
//! traps and converts), checks that `SCTLR_EL1` and its share survived,
//! reads an IPA outside RAM and must catch the abort, and waits until PSCI
//! reports the secondaries off.
//!
//! `fuzz`: see [`crate::fuzz`].
//!
//! `bad-guest`: reads and writes 0x0a00_0000 (no RAM, no device in the guest
//! memory map) and must catch two aborts with the right FAR and direction;
//! loads 8 bytes at the last 4 bytes of the PL011's and the GIC distributor's
//! windows and of a redistributor's first frame (through the normal
//! non-cacheable alias of the device gigabyte, as device memory would fault
//! the unaligned access in the guest) and must catch an abort for each at
//! that address, while a 4-byte load there still reads the device; then
//! issues the unknown hypercall 0xC600_00FF, which must return
//! `NOT_SUPPORTED`.
//!
//! `aarch32-el0`: maps an EL0 alias of the image and a hole (a gigabyte below
//! 4 GiB that is neither RAM nor a device) and runs the `el0` programs, first
//! at AArch64 EL0t, then at AArch32 User (`SPSR` 0x1d0). Each loads from the
//! hole and branches into it (the hypervisor injects a data and an
//! instruction abort), executes `UDF` (undefined at EL1 by the CPU itself),
//! and the AArch32 one also loads from the hole with a 16-bit T32
//! instruction. Every exception must arrive at the lower-EL vector of its
//! state (+0x400 / +0x600) with the exception class, ISS, `IL`, `FAR`, `ELR`
//! and `SPSR` the architecture gives it, and with D, A, I, F masked.
//!
//! `timers`: see [`crate::timers`].
//!
//! `cpu-on-race`: the last vCPU is the target, every other vCPU a racer.
//! Round after round, the racers call PSCI `CPU_ON` for the (off) target at
//! the same moment; exactly one must get `SUCCESS` and every other
//! `ALREADY_ON` (as under KVM, also while the winner's start is still in
//! flight). The target arrives, calls `CPU_OFF`, and the next round starts
//! once `AFFINITY_INFO` reports it off.
//!
//! `flood`: issues 200 000 distinct unknown hypercall ids (each must return
//! `NOT_SUPPORTED`), 20 000 loads from distinct addresses without RAM or
//! device (each must abort) and 5 000 loads of a PL011 offset with no
//! register (read as zero). The hypervisor must stay up and keep its log
//! short; its counters must still count every event.
//!
//! `vgic-scarce` (boot vCPU only): sets the GIC up through the `gic` driver
//! (frames and the virtual timer's PPI from the device tree), enables five
//! SPIs (priority 0xa0) and makes them active through `GICD_ISACTIVER`, more
//! than the four list registers QEMU's CPU interface has; an interrupt made
//! active that way is not in service and does not raise the running
//! priority. It then arms the virtual timer (priority 0x80) and sends SGI 1
//! (0x90) to itself, and must take both within a deadline. It deactivates
//! the SPIs through `GICD_ICACTIVER` and checks that the active and pending
//! bits of all of them read back clear. Last, with the priority mask at
//! 0x80, it pends SPI 41 at priority 0xa0 (masked: must not be taken),
//! raises its priority to 0x40 through `IPRIORITYR` while it is pending, and
//! must take it.

use core::arch::asm;
use core::fmt;
use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::boot::{self, MAX_CPUS};
use crate::bootargs::{Options, Scenario};
use crate::el0::{self, Event, Layout, Program, ec};
use crate::exceptions::{self, Access, DFSC_EXTERNAL_ABORT, EC_DATA_ABORT_SAME_EL};
use crate::gic::{self, Bank, GicError};
use crate::memory_map::{MemRange, PAGE};
use crate::mmu::{self, DEVICE_ALIAS_BASE, El0Access};
use crate::platform::Platform;
use crate::println;
use crate::psci::{self, function};
use crate::smp::{self, Barrier, Deadline};
use crate::timer_regs::{CounterError, Timer, TimerNodeError, TimerPpis};
use crate::timers;
use crate::virtio::{RequestError, SetupError};

/// `TEST_REPORT` code of a panic.
pub const PANIC_CODE: u64 = 0xbad2_0001;
/// `TEST_REPORT` code of an exception the guest did not provoke.
pub const UNEXPECTED_EXCEPTION_CODE: u64 = 0xbad2_0002;

/// Address the bad-guest scenario touches: neither RAM nor an emulated device.
const UNMAPPED_DEVICE_ADDRESS: u64 = 0x0a00_0000;
/// Preferred address outside RAM for the memory scenario's abort probe.
const OUTSIDE_RAM_ADDRESS: u64 = 0x1_0000_0000;
/// Size of the PL011's register window.
const UART_WINDOW_SIZE: u64 = 0x1000;
/// The hypervisor's GIC distributor window (the guest memory map puts it
/// where QEMU's `virt` has it): 64 KiB at 0x0800_0000.
const GIC_DISTRIBUTOR_WINDOW: MemRange = MemRange {
    start: 0x0800_0000,
    end: 0x0801_0000,
};
/// End of vCPU 0's redistributor RD_base frame (its SGI_base frame follows):
/// the hypervisor's redistributors start at 0x080a_0000, 64 KiB per frame.
const GIC_RD_BASE_FRAME_END: u64 = 0x080b_0000;
/// PL011 peripheral-ID register 3 (`UARTPCellID3`, the window's last word)
/// and its value.
const UART_PCELLID3: (u64, u32) = (0xffc, 0xb1);
/// Rounds of the cpu-on-race scenario.
const CPU_ON_RACE_ROUNDS: u64 = 30;
/// Distinct unknown hypercall ids the flood scenario issues.
const FLOOD_HYPERCALLS: u32 = 200_000;
/// Aborting loads the flood scenario performs (distinct addresses).
const FLOOD_ABORTS: u64 = 20_000;
/// Loads of a PL011 offset without a register the flood scenario performs.
const FLOOD_DEVICE_ERRORS: u64 = 5_000;
/// A PL011 offset without a register (between DMACR and the ID registers).
const UART_NO_REGISTER_OFFSET: u64 = 0x800;

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
    /// The isolation probe address (`probe-ipa=`) is in this VM's RAM.
    ProbeInRam {
        /// The address.
        address: u64,
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
    /// The CPU runs no AArch32 at EL0 (`ID_AA64PFR0_EL1.EL0`).
    NoAarch32El0 {
        /// `ID_AA64PFR0_EL1`.
        pfr0: u64,
    },
    /// Fewer than two gigabytes below 4 GiB are free of RAM and devices for
    /// the EL0 alias and the hole.
    NoEl0Window,
    /// An EL0 program took another exception than expected, or none.
    El0Exception {
        /// Which program.
        program: Program,
        /// What was expected.
        expected: &'static str,
        /// What came instead.
        got: Option<Event>,
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
    /// The scenario needs more vCPUs.
    TooFewCpus {
        /// CPUs in the device tree.
        found: usize,
        /// CPUs needed.
        needed: usize,
    },
    /// A round of racing `CPU_ON` calls did not get exactly one `SUCCESS`
    /// and `ALREADY_ON` for every other call.
    CpuOnRace {
        /// The round (from 1).
        round: u64,
        /// A racer whose answer was wrong, or the last racer.
        cpu: usize,
        /// That racer's answer.
        status: i64,
        /// `SUCCESS` answers in the round.
        successes: usize,
    },
    /// A load that must reach a device aborted.
    DeviceLoadAborted {
        /// The address loaded.
        address: u64,
        /// `ESR_EL1` seen.
        esr: u64,
    },
    /// A device register read something else than expected.
    DeviceValue {
        /// The address loaded.
        address: u64,
        /// The value expected.
        expected: u32,
        /// The value read.
        found: u32,
    },
    /// An interrupt that should have been taken was not, before the deadline.
    InterruptNotTaken {
        /// Its INTID.
        intid: u32,
        /// What the scenario was waiting in.
        while_doing: &'static str,
    },
    /// An interrupt was taken that the priority mask should have held back.
    TakenWhileMasked {
        /// Its INTID.
        intid: u32,
    },
    /// A GIC register read back something else than the scenario set up.
    GicState {
        /// The register and what it holds.
        what: &'static str,
        /// The value expected.
        expected: u64,
        /// The value read.
        found: u64,
    },
    /// `SCTLR_EL1` differs after turning the MMU and caches off and on.
    SctlrChanged {
        /// Before.
        before: u64,
        /// After.
        after: u64,
    },
    /// The fuzzer saw answers the architecture or the hypervisor's contract
    /// rules out.
    FuzzViolations {
        /// How many.
        violations: u64,
    },
    /// A control call answered something else than the step expects.
    Control {
        /// The step.
        step: &'static str,
        /// The status it got (0: success, else the error code), or what it
        /// checked.
        code: i64,
    },
    /// A control step waited in vain for the peer.
    ControlTimeout {
        /// The step.
        step: &'static str,
        /// The last value read.
        last: u64,
    },
    /// A vector register was not zero when the guest started.
    VectorRegs {
        /// Which register file (`q`, `z`, `p`, `FFR`, `FPCR`, ...).
        what: &'static str,
        /// The register (or the value read).
        index: u64,
    },
    /// The migrated guest found something lost.
    Migrate {
        /// What it checked.
        step: &'static str,
        /// The page that failed (0 when none).
        page: u64,
    },
    /// The device tree names no virtio-console (the VM needs
    /// `console=virtio`).
    NoVirtioConsole,
    /// A virtio device broke a rule of a `virtio-bad` case.
    Virtio {
        /// The case.
        case: &'static str,
        /// What was wrong.
        what: &'static str,
        /// The value that shows it.
        value: u64,
    },
    /// Setting the virtio-console up failed.
    VirtioSetup {
        /// The case it followed.
        case: &'static str,
        /// What went wrong.
        error: SetupError,
    },
    /// A good request to the virtio-console failed.
    VirtioRequest {
        /// The case it followed.
        case: &'static str,
        /// What went wrong.
        error: RequestError,
    },
    /// The CPU shows no FEAT_MTE2 (`ID_AA64PFR1_EL1.MTE` below 2), which
    /// the `mte` scenario and `migrate-tags` need.
    NoMte {
        /// `ID_AA64PFR1_EL1`.
        pfr1: u64,
    },
    /// The ITS or the LPIs could not be set up or driven.
    ItsSetup(crate::gic_its::ItsError),
    /// A check of the `its` scenario failed.
    Its {
        /// What it checked.
        check: &'static str,
        /// The value that shows it.
        value: u64,
    },
    /// A memory tagging check of the `mte` scenario failed.
    Mte {
        /// What it checked.
        check: &'static str,
        /// The address involved (0: none).
        address: u64,
        /// The value that shows it (a tag, a register, an ESR).
        value: u64,
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
                Failure::NoAarch32El0 { .. } => 14,
                Failure::NoEl0Window => 15,
                Failure::El0Exception { .. } => 16,
                Failure::NoGic => 17,
                Failure::NoTimerNode => 18,
                Failure::TimerNode(_) => 19,
                Failure::Gic { .. } => 20,
                Failure::TimerSilent { .. } => 21,
                Failure::TimerEarly { .. } => 22,
                Failure::Counter { .. } => 23,
                Failure::UnexpectedInterrupt { .. } => 24,
                Failure::TooFewCpus { .. } => 25,
                Failure::CpuOnRace { .. } => 26,
                Failure::DeviceLoadAborted { .. } => 27,
                Failure::DeviceValue { .. } => 28,
                Failure::InterruptNotTaken { .. } => 29,
                Failure::TakenWhileMasked { .. } => 30,
                Failure::GicState { .. } => 31,
                Failure::SctlrChanged { .. } => 32,
                Failure::FuzzViolations { .. } => 33,
                Failure::Control { .. } => 34,
                Failure::ControlTimeout { .. } => 35,
                Failure::ProbeInRam { .. } => 36,
                Failure::Migrate { .. } => 37,
                Failure::VectorRegs { .. } => 38,
                Failure::NoVirtioConsole => 39,
                Failure::Virtio { .. } => 40,
                Failure::VirtioSetup { .. } => 41,
                Failure::VirtioRequest { .. } => 42,
                Failure::NoMte { .. } => 43,
                Failure::Mte { .. } => 44,
                Failure::ItsSetup(_) => 45,
                Failure::Its { .. } => 46,
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
            Failure::ProbeInRam { address } => write!(
                f,
                "probe-ipa {address:#x} is in this VM's RAM: the isolation probe needs a hole"
            ),
            Failure::WrongAbort { address, esr, far } => write!(
                f,
                "access to {address:#x} aborted with ESR {esr:#x} FAR {far:#x}, expected a \
                 synchronous external data abort at that address"
            ),
            Failure::NeedsHypervisor => write!(f, "this scenario needs the hypervisor"),
            Failure::SctlrChanged { before, after } => write!(
                f,
                "SCTLR_EL1 was {before:#x} before the caches went off and on, {after:#x} after"
            ),
            Failure::TooManyCpus { found } => {
                write!(
                    f,
                    "{found} CPUs in the device tree; the guest drives at most {MAX_CPUS}"
                )
            }
            Failure::UnknownScenario(name) => {
                write!(f, "bad bootarg `{name}`: unknown scenario (known:")?;
                for scenario in Scenario::ALL {
                    write!(f, " {}", scenario.name())?;
                }
                write!(f, "), malformed fuzz number or unknown fuzz-allow name")
            }
            Failure::NoAarch32El0 { pfr0 } => write!(
                f,
                "the CPU has no AArch32 EL0 (ID_AA64PFR0_EL1 {pfr0:#x}); use a CPU with it"
            ),
            Failure::NoEl0Window => write!(
                f,
                "no two gigabytes below 4 GiB free of RAM and devices for the EL0 programs"
            ),
            Failure::El0Exception {
                program,
                expected,
                got: None,
            } => write!(
                f,
                "{program:?} EL0 program: expected {expected}, got no exception"
            ),
            Failure::El0Exception {
                program,
                expected,
                got: Some(e),
            } => write!(
                f,
                "{program:?} EL0 program: expected {expected}, got vector {} ESR {:#x} FAR {:#x} \
                 ELR {:#x} SPSR {:#x} DAIF {:#x}",
                e.vector, e.esr, e.far, e.elr, e.spsr, e.daif
            ),
            Failure::NoGic => write!(
                f,
                "the device tree has no GIC (arm,gic-v3 with distributor and redistributors, or \
                 arm,cortex-a15-gic with distributor and CPU interface)"
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
            Failure::TooFewCpus { found, needed } => {
                write!(f, "{found} vCPUs; the scenario needs at least {needed}")
            }
            Failure::CpuOnRace {
                round,
                cpu,
                status,
                successes,
            } => write!(
                f,
                "CPU_ON race round {round}: {successes} SUCCESS answers, vcpu{cpu} got {status} \
                 (expected one SUCCESS and ALREADY_ON (-4) for every other racer)"
            ),
            Failure::DeviceLoadAborted { address, esr } => {
                write!(
                    f,
                    "load of device register {address:#x} aborted (ESR {esr:#x})"
                )
            }
            Failure::DeviceValue {
                address,
                expected,
                found,
            } => write!(
                f,
                "device register {address:#x} read {found:#x}, expected {expected:#x}"
            ),
            Failure::InterruptNotTaken { intid, while_doing } => {
                write!(f, "INTID {intid} was not taken in time ({while_doing})")
            }
            Failure::TakenWhileMasked { intid } => {
                write!(f, "INTID {intid} was taken below the priority mask")
            }
            Failure::GicState {
                what,
                expected,
                found,
            } => write!(f, "{what} reads {found:#x}, expected {expected:#x}"),
            Failure::FuzzViolations { violations } => {
                write!(f, "fuzz: {violations} violation(s), see the FUZZ lines")
            }
            Failure::Control { step, code } => write!(f, "control: {step}: got {code}"),
            Failure::ControlTimeout { step, last } => {
                write!(f, "control: {step}: not seen in time (last read {last:#x})")
            }
            Failure::Migrate { step, page } => write!(f, "migrate: {step}: page {page:#x}"),
            Failure::NoVirtioConsole => write!(
                f,
                "no virtio-console in the device tree (run the VM with console=virtio)"
            ),
            Failure::Virtio { case, what, value } => {
                write!(f, "virtio-bad: {case}: {what} {value:#x}")
            }
            Failure::VirtioSetup { case, error } => {
                write!(f, "virtio: setup after `{case}` failed: {error:?}")
            }
            Failure::VirtioRequest { case, error } => {
                write!(f, "virtio: good request after `{case}` failed: ")?;
                crate::virtio_bad::describe(&error, f)
            }
            Failure::NoMte { pfr1 } => write!(
                f,
                "the CPU has no FEAT_MTE2 (ID_AA64PFR1_EL1 {pfr1:#x}, MTE field {}): run the VM \
                 with mte=on and QEMU with -machine mte=on",
                (pfr1 >> 8) & 0xf
            ),
            Failure::Mte {
                check,
                address,
                value,
            } => write!(f, "mte: {check}: address {address:#x}, value {value:#x}"),
            Failure::ItsSetup(error) => write!(f, "its: {error}"),
            Failure::Its { check, value } => write!(f, "its: {check}: value {value:#x}"),
            // A name ending in a space comes with the value read, else with
            // the register's number.
            Failure::VectorRegs { what, index } if what.ends_with(' ') => {
                write!(f, "vector-regs: {what}{index:#x} not zero at the start")
            }
            Failure::VectorRegs { what, index } => {
                write!(f, "vector-regs: {what}{index} not zero at the start")
            }
        }
    }
}

/// Runs the scenario the bootargs chose, on the boot vCPU.
pub fn run(platform: &Platform, options: Options) -> Result<(), Failure> {
    let scenario = options.scenario;
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
        Scenario::Memory => memory(platform, options.probe_ipa, options.passed_windows),
        Scenario::BadGuest => bad_guest(platform, options.bad_exit_reset),
        Scenario::Aarch32El0 => aarch32_el0(platform),
        Scenario::Timers => {
            SECONDARY_PART.store(SECONDARY_TIMERS, Ordering::Release);
            timers::scenario(platform)
        }
        Scenario::CpuOnRace => cpu_on_race(platform),
        Scenario::Flood => flood(platform),
        Scenario::VgicScarce => vgic_scarce(platform),
        Scenario::Fuzz => {
            if !psci::hypervisor_services() {
                return Err(Failure::NeedsHypervisor);
            }
            SECONDARY_PART.store(SECONDARY_FUZZ, Ordering::Release);
            crate::fuzz::run(platform, options.fuzz)
        }
        Scenario::Echo => crate::echo::run(),
        Scenario::Control | Scenario::ControlPeer if !psci::hypervisor_services() => {
            Err(Failure::NeedsHypervisor)
        }
        Scenario::Control => crate::control::control(platform),
        Scenario::ControlPeer => crate::control::peer(platform),
        Scenario::DirtyLog | Scenario::DirtyWriter if !psci::hypervisor_services() => {
            Err(Failure::NeedsHypervisor)
        }
        Scenario::DirtyLog => crate::dirty_log::control(options.dirty),
        Scenario::DirtyWriter => {
            SECONDARY_PART.store(SECONDARY_DIRTY_WRITER, Ordering::Release);
            crate::dirty_log::writer(platform)
        }
        Scenario::Migrate => {
            SECONDARY_PART.store(SECONDARY_MIGRATE, Ordering::Release);
            crate::migrate::run(platform, options.migrate_seconds, options.migrate_tags)
        }
        Scenario::PageTable | Scenario::MemslotPerf | Scenario::Toucher
            if !psci::hypervisor_services() =>
        {
            Err(Failure::NeedsHypervisor)
        }
        Scenario::PageTable => crate::page_table::control(),
        Scenario::MemslotPerf => crate::memslot_perf::control(options.slots),
        Scenario::Toucher => crate::toucher::run(),
        Scenario::VectorRegs => crate::vector_regs::run(),
        Scenario::VirtioBad => crate::virtio_bad::run(platform),
        Scenario::Mte => crate::mte::run(platform),
        Scenario::Its => crate::its::run(platform),
    }
}

/// What the started secondaries do: the memory worker, the timers' part or
/// the CPU_ON race or the fuzzer.
static SECONDARY_PART: AtomicUsize = AtomicUsize::new(SECONDARY_MEMORY);
const SECONDARY_MEMORY: usize = 0;
const SECONDARY_CPU_ON_RACE: usize = 1;
const SECONDARY_TIMERS: usize = 2;
const SECONDARY_FUZZ: usize = 3;
const SECONDARY_DIRTY_WRITER: usize = 4;
const SECONDARY_MIGRATE: usize = 5;
const SECONDARY_ITS: usize = 6;

/// Makes the secondaries started next run the `its` scenario's part.
pub fn run_its_secondaries() {
    SECONDARY_PART.store(SECONDARY_ITS, Ordering::Release);
}

/// Entry of a secondary's part of the scenario.
pub fn secondary(cpu: usize) {
    match SECONDARY_PART.load(Ordering::Acquire) {
        SECONDARY_CPU_ON_RACE => cpu_on_race_secondary(cpu),
        SECONDARY_TIMERS => timers::worker(cpu),
        SECONDARY_FUZZ => crate::fuzz::secondary(cpu),
        SECONDARY_DIRTY_WRITER => crate::dirty_log::writer_secondary(cpu),
        SECONDARY_MIGRATE => crate::migrate::secondary(cpu),
        SECONDARY_ITS => crate::its::secondary(cpu),
        _ => memory_worker(cpu, None),
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

fn memory(
    platform: &Platform,
    probe_ipa: Option<u64>,
    passed_windows: [Option<u64>; 4],
) -> Result<(), Failure> {
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

    let (before, after) = mmu::set_way_round_trip();
    if before != after {
        return Err(Failure::SctlrChanged { before, after });
    }
    let share = SHARE_START[0].load(Ordering::Relaxed);
    for (offset, expected) in page_words(share) {
        // SAFETY: vCPU 0's own share, written above, identity mapped.
        let found = unsafe { core::ptr::read_volatile((share + offset) as *const u64) };
        if found != expected {
            return Err(Failure::Mismatch {
                cpu: 0,
                address: share + offset,
                expected,
                found,
            });
        }
    }
    println!(
        "test-guest: set/way: caches off and on with DC CISW, SCTLR_EL1 {after:#x} and memory kept"
    );

    let outside = outside_ram(platform);
    let abort =
        exceptions::probe(outside, Access::Read).ok_or(Failure::NoAbort { address: outside })?;
    check_abort(outside, abort, Access::Read)?;
    println!(
        "test-guest: caught abort reading {outside:#x}: ESR {:#x} FAR {:#x}",
        abort.esr, abort.far
    );
    for address in passed_windows.into_iter().flatten() {
        read_passed_window(address)?;
    }
    if let Some(address) = probe_ipa {
        probe_hole(platform, address)?;
    }
    smp::wait_secondaries_off(platform)?;
    println!("test-guest: all secondary vCPUs off");
    Ok(())
}

/// The virtio-mmio magic value (`"virt"`), which every transport reads
/// back, whether a device is plugged in or not.
const VIRTIO_MMIO_MAGIC: u32 = 0x7472_6976;

/// A passed device's window (`passed-window=`): a virtio-mmio transport of
/// the host, which the hypervisor gave this VM; its magic value must read
/// back.
fn read_passed_window(address: u64) -> Result<(), Failure> {
    let found = exceptions::load_u32(address).map_err(|abort| Failure::DeviceLoadAborted {
        address,
        esr: abort.esr,
    })?;
    if found != VIRTIO_MMIO_MAGIC {
        return Err(Failure::DeviceValue {
            address,
            expected: VIRTIO_MMIO_MAGIC,
            found,
        });
    }
    println!("test-guest: passthrough: read magic {found:#x} at {address:#x}");
    Ok(())
}

/// The isolation probe (`probe-ipa=`): `address` must be outside this VM's
/// RAM (else the check proves nothing) and reading it must abort.
fn probe_hole(platform: &Platform, address: u64) -> Result<(), Failure> {
    if platform.is_ram(address) {
        return Err(Failure::ProbeInRam { address });
    }
    let abort = exceptions::probe(address, Access::Read).ok_or(Failure::NoAbort { address })?;
    check_abort(address, abort, Access::Read)?;
    println!(
        "test-guest: isolation: reading probe IPA {address:#x} aborted: ESR {:#x} FAR {:#x}",
        abort.esr, abort.far
    );
    Ok(())
}

/// An address outside RAM: 0x1_0000_0000, or the first gigabyte boundary
/// above RAM when RAM reaches that far.
pub fn outside_ram(platform: &Platform) -> u64 {
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

fn bad_guest(platform: &Platform, exit_by_reset: bool) -> Result<(), Failure> {
    if !psci::hypervisor_services() {
        return Err(Failure::NeedsHypervisor);
    }
    straddling_device_loads(platform)?;
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
    if exit_by_reset {
        println!("test-guest: bad-exit=reset: PSCI SYSTEM_RESET");
        psci::system_reset();
    }
    Ok(())
}

/// One exception an EL0 program must take.
struct Expected {
    what: &'static str,
    vector: u64,
    class: u64,
    iss: u64,
    il: bool,
    far: Option<u64>,
    elr: u64,
    spsr: u64,
}

impl Expected {
    fn matches(&self, e: &Event) -> bool {
        e.vector == self.vector
            && e.class() == self.class
            && e.esr & 0x1ff_ffff == self.iss
            && (e.esr & el0::ESR_IL != 0) == self.il
            && self.far.is_none_or(|far| e.far == far)
            && e.elr == self.elr
            && e.spsr == self.spsr
            && e.daif & el0::DAIF_ALL == el0::DAIF_ALL
    }
}

/// Runs `program` and checks the exceptions it took against `expected`.
fn check_el0_program(
    layout: &Layout,
    program: Program,
    spsr: u64,
    expected: &[Expected],
) -> Result<(), Failure> {
    let (events, count) = el0::run(layout, program, spsr);
    for (i, want) in expected.iter().enumerate() {
        let got = (i < count).then(|| events[i]);
        if !got.is_some_and(|e| want.matches(&e)) {
            return Err(Failure::El0Exception {
                program,
                expected: want.what,
                got,
            });
        }
        let e = events[i];
        println!(
            "test-guest: {program:?} EL0: {}: vector +{:#x} ESR {:#x} FAR {:#x} ELR {:#x} SPSR {:#x}",
            want.what,
            e.vector * 0x80,
            e.esr,
            e.far,
            e.elr,
            e.spsr
        );
    }
    if count > expected.len() {
        return Err(Failure::El0Exception {
            program,
            expected: "nothing after the final SVC",
            got: Some(events[expected.len()]),
        });
    }
    Ok(())
}

/// An 8-byte load at the last 4 bytes of a device window runs past the
/// window's end: it must abort at that address (the hypervisor checks the
/// whole access against the window), while a 4-byte load there reaches the
/// device. The loads go through the normal non-cacheable alias of the device
/// gigabyte: device memory would fault the unaligned load in the guest.
fn straddling_device_loads(platform: &Platform) -> Result<(), Failure> {
    let uart_end = platform.uart_base + UART_WINDOW_SIZE;
    let id_register = DEVICE_ALIAS_BASE + platform.uart_base + UART_PCELLID3.0;
    match exceptions::load_u32(id_register) {
        Ok(found) if found == UART_PCELLID3.1 => {}
        Ok(found) => {
            return Err(Failure::DeviceValue {
                address: id_register,
                expected: UART_PCELLID3.1,
                found,
            });
        }
        Err(abort) => {
            return Err(Failure::DeviceLoadAborted {
                address: id_register,
                esr: abort.esr,
            });
        }
    }
    for (device, window_end) in [
        ("PL011", uart_end),
        ("GIC distributor", GIC_DISTRIBUTOR_WINDOW.end),
        ("GIC redistributor RD_base frame", GIC_RD_BASE_FRAME_END),
    ] {
        let address = DEVICE_ALIAS_BASE + window_end - 4;
        let abort = exceptions::probe(address, Access::Read).ok_or(Failure::NoAbort { address })?;
        check_abort(address, abort, Access::Read)?;
        println!(
            "test-guest: caught abort on an 8-byte load at the end of the {device} window \
             ({address:#x}): ESR {:#x} FAR {:#x}",
            abort.esr, abort.far
        );
    }
    Ok(())
}

/// Maps the EL0 alias of the image and the hole into two free gigabytes
/// below 4 GiB (neither RAM nor the first gigabyte, where the devices are).
fn el0_layout(platform: &Platform) -> Result<Layout, Failure> {
    const GIGABYTE: u64 = 1 << 30;
    let image = boot::image_range().0;
    let image_index = mmu::block_index(image);
    let mut free = (1..4).filter(|&index| {
        let start = index as u64 * GIGABYTE;
        index != image_index
            && !platform
                .ram()
                .iter()
                .any(|r| r.start < start + GIGABYTE && start < r.end)
    });
    let (Some(alias), Some(hole)) = (free.next(), free.next()) else {
        return Err(Failure::NoEl0Window);
    };
    mmu::map_el0_block(alias, image_index, El0Access::ReadExecute);
    mmu::map_el0_block(hole, hole, El0Access::ReadWriteExecute);
    Ok(Layout {
        alias_base: alias as u64 * GIGABYTE,
        image_gigabyte: image_index as u64 * GIGABYTE,
        hole: hole as u64 * GIGABYTE,
    })
}

fn aarch32_el0(platform: &Platform) -> Result<(), Failure> {
    if !psci::hypervisor_services() {
        return Err(Failure::NeedsHypervisor);
    }
    let pfr0: u64;
    // SAFETY: reading an ID register has no side effects.
    unsafe { core::arch::asm!("mrs {}, id_aa64pfr0_el1", out(reg) pfr0, options(nomem, nostack)) };
    // ID_AA64PFR0_EL1.EL0 [3:0]: 2 = AArch64 and AArch32.
    if pfr0 & 0xf != 2 {
        return Err(Failure::NoAarch32El0 { pfr0 });
    }
    let layout = el0_layout(platform)?;
    let (a64, a32, t32) = layout.programs();
    let load = layout.hole + 0x100;
    println!(
        "test-guest: aarch32-el0: EL0 alias of the image at {:#x}, hole at {:#x}",
        layout.alias_base, layout.hole
    );

    let lower64 = el0::VECTOR_SYNC_LOWER_AARCH64;
    let spsr64 = el0::SPSR_EL0T_MASKED;
    let pfr1: u64;
    // SAFETY: reading an ID register has no side effects.
    unsafe { core::arch::asm!("mrs {}, id_aa64pfr1_el1", out(reg) pfr1, options(nomem, nostack)) };
    // With FEAT_BTI (ID_AA64PFR1_EL1.BT [3:0]) BLR leaves PSTATE.BTYPE = 0b10
    // for its target, so the abort at the target saves it in SPSR.
    let btype_after_blr = if pfr1 & 0xf != 0 {
        el0::SPSR_BTYPE_BLR
    } else {
        0
    };
    check_el0_program(
        &layout,
        Program::Aarch64,
        spsr64,
        &[
            Expected {
                what: "data abort (EC 0x24) from ldr x0, [x1] in the hole",
                vector: lower64,
                class: ec::DABT_LOWER,
                iss: DFSC_EXTERNAL_ABORT,
                il: true,
                far: Some(load),
                elr: a64,
                spsr: spsr64,
            },
            Expected {
                what: "undefined instruction (EC 0x00) from udf #0",
                vector: lower64,
                class: ec::UNKNOWN,
                iss: 0,
                il: true,
                far: None,
                elr: a64 + 4,
                spsr: spsr64,
            },
            Expected {
                what: "instruction abort (EC 0x20) from blr x2 into the hole",
                vector: lower64,
                class: ec::IABT_LOWER,
                iss: DFSC_EXTERNAL_ABORT,
                il: true,
                far: Some(layout.hole),
                elr: layout.hole,
                spsr: spsr64 | btype_after_blr,
            },
            Expected {
                what: "svc #0 (EC 0x15)",
                vector: lower64,
                class: ec::SVC64,
                iss: 0,
                il: true,
                far: None,
                elr: a64 + 16,
                spsr: spsr64,
            },
        ],
    )?;

    let lower32 = el0::VECTOR_SYNC_LOWER_AARCH32;
    let spsr32 = el0::SPSR_AARCH32_USR_MASKED;
    check_el0_program(
        &layout,
        Program::Aarch32,
        spsr32,
        &[
            Expected {
                what: "data abort (EC 0x24) from A32 ldr r0, [r1] in the hole",
                vector: lower32,
                class: ec::DABT_LOWER,
                iss: DFSC_EXTERNAL_ABORT,
                il: true,
                far: Some(load),
                elr: a32,
                spsr: spsr32,
            },
            Expected {
                what: "undefined instruction (EC 0x00) from A32 udf #0",
                vector: lower32,
                class: ec::UNKNOWN,
                iss: 0,
                il: true,
                far: None,
                elr: a32 + 4,
                spsr: spsr32,
            },
            Expected {
                what: "data abort (EC 0x24, IL 0) from T32 16-bit ldr r0, [r1] in the hole",
                vector: lower32,
                class: ec::DABT_LOWER,
                iss: DFSC_EXTERNAL_ABORT,
                il: false,
                far: Some(load),
                elr: t32,
                spsr: spsr32 | el0::SPSR_T32,
            },
            Expected {
                what: "instruction abort (EC 0x20) from A32 blx r2 into the hole",
                vector: lower32,
                class: ec::IABT_LOWER,
                iss: DFSC_EXTERNAL_ABORT,
                il: true,
                far: Some(layout.hole),
                elr: layout.hole,
                spsr: spsr32,
            },
            Expected {
                what: "svc #0 (EC 0x11)",
                vector: lower32,
                class: ec::SVC32,
                iss: 0,
                il: true,
                far: None,
                elr: a32 + 20,
                spsr: spsr32,
            },
        ],
    )?;
    Ok(())
}

/// The cpu-on-race round the racers are to run (from 1), or
/// [`RACE_STOP`] once every round is done.
static RACE_ROUND: AtomicU64 = AtomicU64::new(0);
const RACE_STOP: u64 = u64::MAX;
/// The target's MPIDR.
static RACE_TARGET_MPIDR: AtomicU64 = AtomicU64::new(0);
/// The target's index (its PSCI context id).
static RACE_TARGET: AtomicUsize = AtomicUsize::new(0);
/// `CPU_ON` calls made, over all rounds.
static RACE_CALLS: AtomicU64 = AtomicU64::new(0);
/// Each racer's answer in the latest round.
static RACE_STATUS: [AtomicI64; MAX_CPUS] = [const { AtomicI64::new(0) }; MAX_CPUS];
/// Times the target has arrived, over all rounds.
static RACE_TARGET_ARRIVALS: AtomicU64 = AtomicU64::new(0);
/// How many vCPUs race.
static RACE_RACERS: AtomicUsize = AtomicUsize::new(0);

/// One racer's `CPU_ON` of the target.
fn race_cpu_on(cpu: usize) {
    let status = psci::cpu_on(
        RACE_TARGET_MPIDR.load(Ordering::Acquire),
        crate::boot::secondary_entry_address(),
        RACE_TARGET.load(Ordering::Acquire) as u64,
    );
    RACE_STATUS[cpu].store(status, Ordering::Relaxed);
    RACE_CALLS.fetch_add(1, Ordering::AcqRel);
}

/// A secondary in the cpu-on-race scenario: the target arrives, waits until
/// every racer of the round has made its call (so that a slow racer cannot
/// find it off again and rightly win a second time) and returns (to
/// `CPU_OFF`); a racer races each round as it is announced until the boot
/// vCPU says stop.
fn cpu_on_race_secondary(cpu: usize) {
    if cpu == RACE_TARGET.load(Ordering::Acquire) {
        let round = RACE_ROUND.load(Ordering::Acquire);
        let calls = round.saturating_mul(RACE_RACERS.load(Ordering::Acquire) as u64);
        while RACE_CALLS.load(Ordering::Acquire) < calls
            && RACE_ROUND.load(Ordering::Acquire) != RACE_STOP
        {
            core::hint::spin_loop();
        }
        RACE_TARGET_ARRIVALS.fetch_add(1, Ordering::AcqRel);
        return;
    }
    let mut next = 1;
    loop {
        match RACE_ROUND.load(Ordering::Acquire) {
            RACE_STOP => return,
            round if round == next => {
                race_cpu_on(cpu);
                next += 1;
            }
            _ => core::hint::spin_loop(),
        }
    }
}

/// Waits until `done` holds or the step deadline passes.
fn wait_until(done: impl Fn() -> bool) -> bool {
    let deadline = Deadline::step();
    while !done() {
        if deadline.passed() {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

fn cpu_on_race(platform: &Platform) -> Result<(), Failure> {
    let cpus = platform.cpus();
    if cpus.len() < 3 {
        return Err(Failure::TooFewCpus {
            found: cpus.len(),
            needed: 3,
        });
    }
    let target = cpus.len() - 1;
    let racers = target;
    RACE_TARGET.store(target, Ordering::Release);
    RACE_RACERS.store(racers, Ordering::Release);
    RACE_TARGET_MPIDR.store(cpus[target], Ordering::Release);
    SECONDARY_PART.store(SECONDARY_CPU_ON_RACE, Ordering::Release);
    smp::start_cpus(platform, 1..target)?;
    println!(
        "test-guest: cpu-on-race: {racers} vCPUs race CPU_ON of vcpu{target} (mpidr {:#x}), \
         {CPU_ON_RACE_ROUNDS} rounds",
        cpus[target]
    );
    let outcome = race_rounds(racers, target, cpus[target]);
    RACE_ROUND.store(RACE_STOP, Ordering::Release);
    outcome?;
    smp::wait_secondaries_off(platform)?;
    println!(
        "test-guest: cpu-on-race: {CPU_ON_RACE_ROUNDS} rounds, one SUCCESS and {} ALREADY_ON \
         each",
        racers - 1
    );
    Ok(())
}

fn race_rounds(racers: usize, target: usize, target_mpidr: u64) -> Result<(), Failure> {
    for round in 1..=CPU_ON_RACE_ROUNDS {
        RACE_ROUND.store(round, Ordering::Release);
        race_cpu_on(0);
        let calls = round * racers as u64;
        if !wait_until(|| RACE_CALLS.load(Ordering::Acquire) >= calls) {
            return Err(Failure::CpuTimedOut {
                arrived: (RACE_CALLS.load(Ordering::Acquire) - (calls - racers as u64)) as usize,
                expected: racers,
            });
        }
        let statuses = || (0..racers).map(|cpu| (cpu, RACE_STATUS[cpu].load(Ordering::Relaxed)));
        let successes = statuses().filter(|&(_, s)| s == psci::SUCCESS).count();
        let wrong = statuses().find(|&(_, s)| s != psci::SUCCESS && s != psci::ALREADY_ON);
        if successes != 1 || wrong.is_some() {
            let (cpu, status) =
                wrong.unwrap_or((racers - 1, RACE_STATUS[racers - 1].load(Ordering::Relaxed)));
            return Err(Failure::CpuOnRace {
                round,
                cpu,
                status,
                successes,
            });
        }
        if !wait_until(|| RACE_TARGET_ARRIVALS.load(Ordering::Acquire) >= round) {
            return Err(Failure::CpuNeverArrived { cpu: target });
        }
        if !wait_until(|| psci::affinity_info(target_mpidr) == psci::AFFINITY_OFF) {
            return Err(Failure::CpuStillOn { cpu: target });
        }
    }
    Ok(())
}

fn flood(platform: &Platform) -> Result<(), Failure> {
    if !psci::hypervisor_services() {
        return Err(Failure::NeedsHypervisor);
    }
    for i in 0..FLOOD_HYPERCALLS {
        let id = function::UNKNOWN_FLOOD_BASE + i;
        let returned = psci::call(id, 0, 0, 0);
        expect(id, returned, returned == psci::NOT_SUPPORTED)?;
    }
    println!(
        "test-guest: flood: {FLOOD_HYPERCALLS} distinct unknown hypercalls returned NOT_SUPPORTED"
    );
    for i in 0..FLOOD_ABORTS {
        let address = UNMAPPED_DEVICE_ADDRESS + 8 * i;
        let abort = exceptions::probe(address, Access::Read).ok_or(Failure::NoAbort { address })?;
        check_abort(address, abort, Access::Read)?;
    }
    println!("test-guest: flood: {FLOOD_ABORTS} aborting loads caught");
    let no_register = platform.uart_base + UART_NO_REGISTER_OFFSET;
    for _ in 0..FLOOD_DEVICE_ERRORS {
        match exceptions::load_u32(no_register) {
            Ok(0) => {}
            Ok(found) => {
                return Err(Failure::DeviceValue {
                    address: no_register,
                    expected: 0,
                    found,
                });
            }
            Err(abort) => {
                return Err(Failure::DeviceLoadAborted {
                    address: no_register,
                    esr: abort.esr,
                });
            }
        }
    }
    println!(
        "test-guest: flood: {FLOOD_DEVICE_ERRORS} loads of PL011 offset \
         {UART_NO_REGISTER_OFFSET:#x} read as zero"
    );
    Ok(())
}

/// SPIs the `vgic-scarce` scenario makes active: more than QEMU's four list
/// registers.
const SCARCE_SPIS: core::ops::Range<u32> = 40..45;
/// SGI the `vgic-scarce` scenario sends to itself.
const SCARCE_SGI: u32 = 1;
/// SPI whose priority `vgic-scarce` changes while it is pending.
const REPRIORITISED_SPI: u32 = 41;
/// How long `vgic-scarce` waits for an interrupt.
const INTERRUPT_TIMEOUT_SECONDS: u64 = 5;

fn check_gic(what: &'static str, expected: u64, found: u64) -> Result<(), Failure> {
    if expected == found {
        Ok(())
    } else {
        Err(Failure::GicState {
            what,
            expected,
            found,
        })
    }
}

/// Waits (IRQs unmasked) until `intid` has been taken `count` times.
fn wait_taken(intid: u32, count: u32, while_doing: &'static str) -> Result<(), Failure> {
    let deadline = Deadline::after_seconds(INTERRUPT_TIMEOUT_SECONDS);
    while gic::taken(intid) < count {
        if deadline.passed() {
            return Err(Failure::InterruptNotTaken { intid, while_doing });
        }
        core::hint::spin_loop();
    }
    Ok(())
}

/// The virtual timer's PPI while `vgic-scarce` runs (0 before).
static SCARCE_VTIMER: AtomicU32 = AtomicU32::new(0);

/// One interrupt taken while `vgic-scarce` runs (from
/// `gic::take_interrupts`, which counts and finishes it): the virtual timer's
/// line is a level, so the timer is disabled to drop it.
pub fn vgic_scarce_interrupt(intid: u32) {
    if intid == SCARCE_VTIMER.load(Ordering::Relaxed) {
        // SAFETY: disabling the guest's own virtual timer drops its line.
        unsafe { asm!("msr cntv_ctl_el0, xzr", "isb", options(nostack)) };
    }
}

/// Arms the virtual timer to fire in `ticks` counter ticks (`ENABLE`, not
/// `IMASK`).
fn arm_virtual_timer(ticks: u64) {
    // SAFETY: the EL1 virtual timer is the guest's own.
    unsafe {
        asm!("msr cntv_tval_el0, {}", "msr cntv_ctl_el0, {}", "isb",
             in(reg) ticks, in(reg) 1u64, options(nostack));
    }
}

fn vgic_scarce(platform: &Platform) -> Result<(), Failure> {
    let frames = platform.gic.ok_or(Failure::NoGic)?;
    let cells = platform.timer_cells().ok_or(Failure::NoTimerNode)?;
    let vtimer = TimerPpis::from_cells(cells)
        .map_err(Failure::TimerNode)?
        .virtual_;
    let cpu = smp::current_cpu();
    let mpidr = gic::current_mpidr();
    gic::init_distributor(frames).map_err(|error| Failure::Gic { cpu, error })?;
    gic::init_cpu(&[]).map_err(|error| Failure::Gic { cpu, error })?;
    SCARCE_VTIMER.store(vtimer, Ordering::Relaxed);
    exceptions::take_irqs_for(Scenario::VgicScarce);
    let private = Bank::Redistributor(cpu);
    let spis = Bank::Distributor;
    let spi_mask: u32 = SCARCE_SPIS.fold(0, |mask, intid| mask | 1 << (intid % 32));
    let first = SCARCE_SPIS.start;
    for intid in SCARCE_SPIS {
        gic::set_group1(spis, intid);
        gic::set_priority(spis, intid, 0xa0);
        gic::route_spi(intid, mpidr);
    }
    gic::write_bits(spis, gic::ISENABLER, first, spi_mask);
    for (intid, priority) in [(vtimer, 0x80), (SCARCE_SGI, 0x90)] {
        gic::set_group1(private, intid);
        gic::set_priority(private, intid, priority);
        gic::write_bits(private, gic::ISENABLER, intid, 1 << intid);
    }

    // Active through the distributor, never acknowledged.
    gic::write_bits(spis, gic::ISACTIVER, first, spi_mask);
    let active = gic::read_bits(spis, gic::ISACTIVER, first) & spi_mask;
    check_gic(
        "GICD_ISACTIVER1 (SPIs 40-44)",
        spi_mask.into(),
        active.into(),
    )?;
    println!("test-guest: vgic-scarce: SPIs 40-44 active through GICD_ISACTIVER");

    gic::irqs(true);
    let frequency: u64;
    // SAFETY: reading the counter frequency has no side effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) frequency, options(nomem, nostack)) };
    arm_virtual_timer(frequency / 1000);
    gic::send_sgi_to_self(SCARCE_SGI);
    let taken = wait_taken(vtimer, 1, "virtual timer with 5 SPIs active")
        .and_then(|()| wait_taken(SCARCE_SGI, 1, "SGI with 5 SPIs active"));
    if let Err(failure) = taken {
        gic::irqs(false);
        return Err(failure);
    }
    println!("test-guest: vgic-scarce: took the virtual timer and SGI 1 while 5 SPIs are active");

    gic::write_bits(spis, gic::ICACTIVER, first, spi_mask);
    let active = gic::read_bits(spis, gic::ISACTIVER, first) & spi_mask;
    check_gic("GICD_ISACTIVER1 after ICACTIVER", 0, active.into())?;
    let pending = gic::read_bits(spis, gic::ISPENDR, first) & spi_mask;
    check_gic("GICD_ISPENDR1 (SPIs 40-44)", 0, pending.into())?;
    let private_mask = 1 << vtimer | 1 << SCARCE_SGI;
    let active = gic::read_bits(private, gic::ISACTIVER, 0) & private_mask;
    check_gic("GICR_ISACTIVER0 (timer, SGI 1)", 0, active.into())?;
    for intid in SCARCE_SPIS {
        if gic::taken(intid) != 0 {
            return Err(Failure::GicState {
                what: "deliveries of an SPI that was only made active",
                expected: 0,
                found: gic::taken(intid).into(),
            });
        }
    }
    println!("test-guest: vgic-scarce: SPIs 40-44 deactivated through GICD_ICACTIVER");

    // A pending interrupt below the priority mask, then made more urgent.
    gic::set_priority_mask(0x80);
    let spi = REPRIORITISED_SPI;
    gic::write_bits(spis, gic::ISPENDR, spi, 1 << (spi % 32));
    let masked = Deadline::after_seconds(1);
    while !masked.passed() {
        if gic::taken(spi) != 0 {
            gic::irqs(false);
            return Err(Failure::TakenWhileMasked { intid: spi });
        }
        core::hint::spin_loop();
    }
    let pending = gic::read_bits(spis, gic::ISPENDR, spi) & 1 << (spi % 32);
    check_gic(
        "GICD_ISPENDR1 bit of SPI 41",
        1 << (spi % 32),
        pending.into(),
    )?;
    gic::set_priority(spis, spi, 0x40);
    let taken = wait_taken(spi, 1, "SPI 41 after its priority rose above the mask");
    gic::irqs(false);
    gic::set_priority_mask(0xff);
    taken?;
    check_gic(
        "GICD_IPRIORITYR of SPI 41",
        0x40,
        gic::priority(spis, spi).into(),
    )?;
    let state = gic::read_bits(spis, gic::ISPENDR, spi) | gic::read_bits(spis, gic::ISACTIVER, spi);
    check_gic(
        "SPI 41 pending or active bits",
        0,
        (state & 1 << (spi % 32)).into(),
    )?;
    println!("test-guest: vgic-scarce: took SPI 41 once its priority rose above the mask");
    Ok(())
}
