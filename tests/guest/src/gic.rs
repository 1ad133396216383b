//! A minimal GICv3 driver for the guest: enough to take private interrupts
//! (the timers' PPIs) on every vCPU.
//!
//! The boot vCPU turns the distributor on ([`init_distributor`]: affinity
//! routing, group 1, waiting out `GICD_CTLR.RWP`). Every vCPU then wakes its
//! own redistributor, found by MPIDR affinity among the region's frames
//! ([`init_cpu`]: clear `GICR_WAKER.ProcessorSleep`, wait for
//! `ChildrenAsleep` to clear), makes the requested PPIs group 1 with a
//! middle priority and enables them, and enables its CPU interface through
//! the system registers (`ICC_SRE_EL1.SRE`, `ICC_PMR_EL1` open,
//! `ICC_BPR1_EL1` 0, `ICC_CTLR_EL1.EOImode` 0, `ICC_IGRPEN1_EL1`). Under the
//! hypervisor these reach the virtual GIC: the distributor and
//! redistributors are emulated, the `ICC_*` registers are the hardware's
//! virtual CPU interface. Interrupts are taken with [`acknowledge`] (group 1
//! `ICC_IAR1_EL1`) and finished with [`end_of_interrupt`] (priority drop and
//! deactivation in one, `EOImode` 0).

use core::arch::asm;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::gic_regs::{self, *};
use crate::platform::GicFrames;
use crate::smp::Deadline;

/// Why the GIC could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicError {
    /// No redistributor frame has this vCPU's affinity.
    NoRedistributor {
        /// The vCPU's MPIDR.
        mpidr: u64,
    },
    /// A `GICD_CTLR` write or the redistributor's wake-up never completed.
    Stuck {
        /// The register polled.
        register: &'static str,
    },
}

static DISTRIBUTOR: AtomicU64 = AtomicU64::new(0);
static REDISTRIBUTORS_START: AtomicU64 = AtomicU64::new(0);
static REDISTRIBUTORS_END: AtomicU64 = AtomicU64::new(0);

/// How long a register may stay busy.
const POLL_SECONDS: u64 = 5;

fn read32(address: u64) -> u32 {
    // SAFETY: callers pass addresses inside the GIC frames of the device
    // tree, identity mapped as device memory.
    unsafe { read_volatile(address as *const u32) }
}

fn write32(address: u64, value: u32) {
    // SAFETY: as in `read32`.
    unsafe { write_volatile(address as *mut u32, value) }
}

fn read64(address: u64) -> u64 {
    // SAFETY: as in `read32`; `GICR_TYPER` takes 64-bit reads.
    unsafe { read_volatile(address as *const u64) }
}

/// Polls `address` until `mask` reads clear.
fn wait_clear(address: u64, mask: u32, register: &'static str) -> Result<(), GicError> {
    let deadline = Deadline::after_seconds(POLL_SECONDS);
    while read32(address) & mask != 0 {
        if deadline.passed() {
            return Err(GicError::Stuck { register });
        }
        core::hint::spin_loop();
    }
    Ok(())
}

/// Boot vCPU, once: records the frames and turns the distributor on.
pub fn init_distributor(frames: GicFrames) -> Result<(), GicError> {
    DISTRIBUTOR.store(frames.distributor, Ordering::Relaxed);
    REDISTRIBUTORS_START.store(frames.redistributors.start, Ordering::Relaxed);
    REDISTRIBUTORS_END.store(frames.redistributors.end, Ordering::Release);
    let ctlr = frames.distributor + GICD_CTLR;
    write32(ctlr, GICD_CTLR_ARE);
    wait_clear(ctlr, GICD_CTLR_RWP, "GICD_CTLR.RWP")?;
    write32(ctlr, GICD_CTLR_ARE | GICD_CTLR_ENABLE_GRP1);
    wait_clear(ctlr, GICD_CTLR_RWP, "GICD_CTLR.RWP")
}

/// The calling vCPU's MPIDR.
fn current_mpidr() -> u64 {
    let mpidr: u64;
    // SAFETY: reading MPIDR_EL1 has no side effects.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) mpidr, options(nomem, nostack)) };
    mpidr
}

/// Every vCPU, after [`init_distributor`]: wakes its redistributor, enables
/// the PPIs `ppis` (group 1, priority [`PRIORITY`]) and the CPU interface.
/// Interrupts stay masked in `PSTATE` until the caller unmasks them.
pub fn init_cpu(ppis: &[u32]) -> Result<(), GicError> {
    let mpidr = current_mpidr();
    let start = REDISTRIBUTORS_START.load(Ordering::Relaxed);
    let end = REDISTRIBUTORS_END.load(Ordering::Acquire);
    let offset = gic_regs::find_redistributor(mpidr, end.saturating_sub(start), |offset| {
        read64(start + offset + GICR_TYPER)
    })
    .ok_or(GicError::NoRedistributor { mpidr })?;
    let rd = start + offset;
    let waker = read32(rd + GICR_WAKER);
    write32(rd + GICR_WAKER, waker & !GICR_WAKER_PROCESSOR_SLEEP);
    wait_clear(
        rd + GICR_WAKER,
        GICR_WAKER_CHILDREN_ASLEEP,
        "GICR_WAKER.ChildrenAsleep",
    )?;
    let sgi = rd + GICR_SGI_BASE;
    let bits = ppis.iter().fold(0u32, |bits, &intid| bits | 1 << intid);
    write32(sgi + GICR_ICENABLER0, bits);
    write32(sgi + GICR_IGROUPR0, read32(sgi + GICR_IGROUPR0) | bits);
    for &intid in ppis {
        let word = sgi + gic_regs::priority_offset(intid);
        write32(word, gic_regs::with_priority(read32(word), intid, PRIORITY));
    }
    write32(sgi + GICR_ISENABLER0, bits);
    // SAFETY: these ICC registers configure this vCPU's own CPU interface;
    // PSTATE.I stays set, so no interrupt is taken before the caller wants.
    unsafe {
        let sre: u64;
        asm!("mrs {}, icc_sre_el1", out(reg) sre, options(nomem, nostack));
        asm!("msr icc_sre_el1, {}", "isb", in(reg) sre | 1, options(nostack));
        asm!(
            "msr icc_pmr_el1, {pmr}",
            "msr icc_bpr1_el1, xzr",
            "msr icc_ctlr_el1, xzr",
            "msr icc_igrpen1_el1, {on}",
            "isb",
            pmr = in(reg) 0xffu64,
            on = in(reg) 1u64,
            options(nostack)
        );
    }
    Ok(())
}

/// Acknowledges the highest-priority pending group 1 interrupt; 1020..=1023
/// when there is none.
pub fn acknowledge() -> u32 {
    let iar: u64;
    // SAFETY: reading ICC_IAR1_EL1 acknowledges an interrupt, which the
    // caller finishes with `end_of_interrupt`.
    unsafe { asm!("mrs {}, icc_iar1_el1", out(reg) iar, options(nostack)) };
    (iar & 0xff_ffff) as u32
}

/// Finishes `intid` (priority drop and deactivation).
pub fn end_of_interrupt(intid: u32) {
    // SAFETY: writing an acknowledged INTID to ICC_EOIR1_EL1 finishes it.
    unsafe {
        asm!("msr icc_eoir1_el1, {}", "isb", in(reg) u64::from(intid), options(nostack));
    }
}

/// Whether `intid` is a real interrupt rather than a special INTID.
pub fn is_interrupt(intid: u32) -> bool {
    intid < SPURIOUS_FIRST
}
