//! Per-CPU data and stacks.
//!
//! Each physical CPU owns one [`PerCpu`] slot and one stack; the lowest page of
//! every stack is a guard page left out of the EL2 translation, so an overflow
//! faults instead of corrupting the neighbour. A fault at EL2 switches to the
//! CPU's small trap stack before it reports. `TPIDR_EL2` holds
//! the address of the running CPU's slot. The first fields are read by
//! assembly (the guest entry/exit path and the secondary entry), so the layout
//! is `repr(C)` with offsets exported as constants. A secondary CPU starts with
//! its MMU off and reads its [`SecondaryBoot`] block (cleaned to the point of
//! coherency by the CPU that starts it) to turn the MMU on with the boot CPU's
//! translation tables. It also records its decoded ID registers in its slot
//! and raises `online`, or `rejected` when it lacks what the system relies on
//! (see `boot`).

use crate::platform::cpu_features::CpuFeatures;
use crate::vm::vcpu_state::VectorLengths;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most physical CPUs the hypervisor drives.
pub const MAX_CPUS: usize = 32;
/// Stack size per CPU, including its guard page.
pub const STACK_SIZE: usize = 64 * 1024;
/// The unmapped page at the bottom of each stack.
pub const GUARD_SIZE: usize = 4096;
/// Stack used to report a fault taken at EL2.
pub const TRAP_STACK_SIZE: usize = 16 * 1024;

/// What a secondary CPU needs to turn its MMU on (read with the MMU off).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SecondaryBoot {
    /// Initial stack pointer.
    pub stack_top: u64,
    /// `MAIR_EL2`.
    pub mair: u64,
    /// `TCR_EL2`.
    pub tcr: u64,
    /// `TTBR0_EL2`.
    pub ttbr0: u64,
    /// `SCTLR_EL2`.
    pub sctlr: u64,
    /// Address of the CPU's [`PerCpu`] (goes to `TPIDR_EL2`).
    pub percpu: u64,
}

/// One CPU's data.
#[repr(C)]
pub struct PerCpu {
    /// Host stack pointer saved while a guest runs (assembly, offset 0).
    pub host_sp: AtomicU64,
    /// The running vCPU's register context (assembly, offset 8).
    pub guest_context: AtomicU64,
    /// Boot block for a secondary CPU (assembly, offset 16).
    pub boot: UnsafeCell<SecondaryBoot>,
    /// Top of the trap stack (assembly, offset 64).
    pub trap_sp: AtomicU64,
    /// Logical CPU number (0 = boot CPU).
    pub index: AtomicU64,
    /// MPIDR affinity of this CPU.
    pub mpidr: AtomicU64,
    /// Set once the CPU runs Rust code with its MMU on.
    pub online: AtomicBool,
    /// Set instead of `online` by a CPU that lacks what the system relies on
    /// and has parked for good.
    pub rejected: AtomicBool,
    /// The CPU's own features, written by the CPU before it raises `online`
    /// or `rejected`.
    pub features: spin::Mutex<Option<CpuFeatures>>,
    /// The CPU's vector lengths, measured by the CPU with its features,
    /// before any guest runs on it (`arch::vcpu::measure_lengths`).
    pub vector_lengths: spin::Mutex<VectorLengths>,
}

// SAFETY: `boot` is written only by the boot CPU before it starts the owner,
// and read only by the owner's entry code; everything else is atomic.
unsafe impl Sync for PerCpu {}

/// Offset of `host_sp`.
pub const OFFSET_HOST_SP: usize = 0;
/// Offset of `guest_context`.
pub const OFFSET_GUEST_CONTEXT: usize = 8;
const _: () = assert!(core::mem::offset_of!(PerCpu, host_sp) == OFFSET_HOST_SP);
const _: () = assert!(core::mem::offset_of!(PerCpu, guest_context) == OFFSET_GUEST_CONTEXT);
/// Offset of `trap_sp`.
pub const OFFSET_TRAP_SP: usize = 64;
const _: () = assert!(core::mem::offset_of!(PerCpu, boot) == 16);
const _: () = assert!(core::mem::offset_of!(PerCpu, trap_sp) == OFFSET_TRAP_SP);
const _: () = assert!(core::mem::size_of::<SecondaryBoot>() == 48);

impl PerCpu {
    const fn new() -> Self {
        Self {
            host_sp: AtomicU64::new(0),
            guest_context: AtomicU64::new(0),
            boot: UnsafeCell::new(SecondaryBoot {
                stack_top: 0,
                mair: 0,
                tcr: 0,
                ttbr0: 0,
                sctlr: 0,
                percpu: 0,
            }),
            trap_sp: AtomicU64::new(0),
            index: AtomicU64::new(0),
            mpidr: AtomicU64::new(0),
            online: AtomicBool::new(false),
            rejected: AtomicBool::new(false),
            features: spin::Mutex::new(None),
            vector_lengths: spin::Mutex::new(VectorLengths {
                sve: None,
                sme: None,
            }),
        }
    }

    /// Logical number of this CPU.
    pub fn index(&self) -> usize {
        self.index.load(Ordering::Relaxed) as usize
    }
}

static PER_CPU: [PerCpu; MAX_CPUS] = [const { PerCpu::new() }; MAX_CPUS];

#[repr(C, align(4096))]
struct Stacks(UnsafeCell<[[u8; STACK_SIZE]; MAX_CPUS]>);

// SAFETY: each stack is used by exactly one CPU.
unsafe impl Sync for Stacks {}

#[unsafe(no_mangle)]
static HV_STACKS: Stacks = Stacks(UnsafeCell::new([[0; STACK_SIZE]; MAX_CPUS]));

#[repr(C, align(16))]
struct TrapStacks(UnsafeCell<[[u8; TRAP_STACK_SIZE]; MAX_CPUS]>);

// SAFETY: each trap stack is used by exactly one CPU.
unsafe impl Sync for TrapStacks {}

static TRAP_STACKS: TrapStacks = TrapStacks(UnsafeCell::new([[0; TRAP_STACK_SIZE]; MAX_CPUS]));

/// The top of CPU `index`'s stack.
pub fn stack_top(index: usize) -> u64 {
    HV_STACKS.0.get() as u64 + ((index + 1) * STACK_SIZE) as u64
}

/// The guard pages at the bottom of every stack (to leave unmapped).
pub fn guard_pages() -> impl Iterator<Item = crate::platform::ranges::PhysRange> {
    let base = HV_STACKS.0.get() as u64;
    (0..MAX_CPUS).map(move |i| {
        crate::platform::ranges::PhysRange::from_start_size(
            base + (i * STACK_SIZE) as u64,
            GUARD_SIZE as u64,
        )
    })
}

/// The slot of logical CPU `index`.
pub fn slot(index: usize) -> &'static PerCpu {
    &PER_CPU[index]
}

/// Makes `TPIDR_EL2` point at slot `index` and records its identity.
pub fn install(index: usize, mpidr: u64) -> &'static PerCpu {
    let slot = prepare(index, mpidr);
    // SAFETY: TPIDR_EL2 is reserved for the per-CPU pointer; the slot is static.
    unsafe { crate::write_sysreg!(tpidr_el2, slot as *const PerCpu as u64) };
    slot
}

/// Fills in slot `index` for the CPU `mpidr` (before that CPU runs; a slot
/// whose CPU was rejected and parked is filled in again for the next one).
pub fn prepare(index: usize, mpidr: u64) -> &'static PerCpu {
    let slot = &PER_CPU[index];
    slot.index.store(index as u64, Ordering::Relaxed);
    slot.mpidr.store(mpidr, Ordering::Relaxed);
    slot.online.store(false, Ordering::Relaxed);
    slot.rejected.store(false, Ordering::Relaxed);
    *slot.features.lock() = None;
    *slot.vector_lengths.lock() = VectorLengths::default();
    let trap_top = TRAP_STACKS.0.get() as u64 + ((index + 1) * TRAP_STACK_SIZE) as u64;
    slot.trap_sp.store(trap_top, Ordering::Release);
    slot
}

/// The running CPU's slot.
pub fn current() -> &'static PerCpu {
    let ptr = crate::read_sysreg!(tpidr_el2) as *const PerCpu;
    // SAFETY: `install` stored the address of a static slot before any caller runs.
    unsafe { &*ptr }
}
