//! The guest's one GIC driver, shared by the interrupt scenarios (`timers`
//! and `vgic-scarce`): a GICv3, or a GICv2 when the device tree has one.
//!
//! On a GICv2 (`GicFrames::cpu_interface`) the same calls work on the GICv2
//! registers: the distributor's word 0 and first priority bytes are the
//! calling vCPU's bank (what a redistributor's `SGI_base` is on a GICv3),
//! the requested PPIs stay in group 0, the CPU interface is the
//! memory-mapped `GICC` (`PMR` open, `BPR` 0, both groups enabled and
//! acknowledged through `GICC_IAR`: `CTLR.AckCtl`),
//! [`acknowledge`] reads `GICC_IAR` and [`end_of_interrupt`] writes the same
//! value (with an SGI's source CPU) to `GICC_EOIR`; SPIs are routed through
//! `ITARGETSR` and SGIs sent through `GICD_SGIR`.
//!
//! The frames come from the device tree (`platform::GicFrames`); register
//! offsets, field values and encodings are in `gic_regs` (pure, tested on the
//! host). Under the hypervisor these reach the virtual GIC: the distributor
//! and redistributors are emulated, the `ICC_*` registers are the hardware's
//! virtual CPU interface.
//!
//! Setting up:
//! - [`init_distributor`] (boot vCPU, once): records the frames and turns the
//!   distributor on (affinity routing, group 1, one security state), waiting
//!   out `GICD_CTLR.RWP`.
//! - [`init_cpu`] (every vCPU that takes interrupts): wakes the vCPU's own
//!   redistributor, found by MPIDR affinity among the region's frames (clears
//!   `GICR_WAKER.ProcessorSleep`, waits for `ChildrenAsleep` to clear), makes
//!   the requested PPIs group 1 with priority [`PRIORITY`] and enables them,
//!   and enables its CPU interface through the system registers
//!   (`ICC_SRE_EL1.SRE`, `ICC_PMR_EL1` open, `ICC_BPR1_EL1` 0,
//!   `ICC_CTLR_EL1.EOImode` 0, `ICC_IGRPEN1_EL1`). `PSTATE.I` stays set.
//! - Finer control, for scenarios that set up SPIs, SGIs or other priorities
//!   themselves: per-[`Bank`] bit registers ([`read_bits`], [`write_bits`],
//!   [`set_group1`]), priorities ([`priority`], [`set_priority`]),
//!   [`route_spi`], [`set_priority_mask`], [`send_sgi_to_self`], [`irqs`].
//!
//! Taking interrupts: the IRQ vector (`exceptions`) hands the interrupts to
//! the scenario that runs through [`take_interrupts`], which acknowledges
//! from `ICC_IAR1_EL1` until nothing is pending (a special INTID, 1020 and
//! up), gives each INTID to the scenario's handler, counts it ([`taken`]) and
//! finishes it with `ICC_EOIR1_EL1` (`EOImode` 0: priority drop and
//! deactivation in one). [`acknowledge`] and [`end_of_interrupt`] are the two
//! halves on their own.

use core::arch::asm;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::boot::MAX_CPUS;
use crate::gic_regs::{self, *};
use crate::platform::GicFrames;
use crate::smp::{self, Deadline};

pub use crate::gic_regs::{ICACTIVER, ISACTIVER, ISENABLER, ISPENDR};

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
/// A GICv2's CPU interface (0: the GIC is a GICv3).
static CPU_INTERFACE: AtomicU64 = AtomicU64::new(0);
static REDISTRIBUTORS_START: AtomicU64 = AtomicU64::new(0);
static REDISTRIBUTORS_END: AtomicU64 = AtomicU64::new(0);
/// Each vCPU's `SGI_base` page, found by [`init_cpu`] (0 before).
static SGI_BASES: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// INTIDs whose deliveries [`taken`] counts.
const COUNTED: usize = 64;
/// Deliveries per INTID (all vCPUs together).
static TAKEN: [AtomicU32; COUNTED] = [const { AtomicU32::new(0) }; COUNTED];

/// How long a register may stay busy.
const POLL_SECONDS: u64 = 5;

/// Which register frame a banked register lives in.
#[derive(Clone, Copy, Debug)]
pub enum Bank {
    /// The distributor (SPIs).
    Distributor,
    /// The `SGI_base` page of vCPU n's redistributor (its SGIs and PPIs),
    /// after that vCPU's [`init_cpu`]. On a GICv2 the distributor, whose
    /// word 0 is banked: only vCPU n itself reaches its own bank there.
    Redistributor(usize),
}

impl Bank {
    fn base(self) -> u64 {
        let base = match self {
            Bank::Distributor => DISTRIBUTOR.load(Ordering::Acquire),
            Bank::Redistributor(cpu) => SGI_BASES[cpu].load(Ordering::Acquire),
        };
        assert!(base != 0, "gic: {self:?} used before it was set up");
        base
    }
}

/// A 32-bit load from a GIC register (distributor, redistributor or ITS).
pub(crate) fn read32(address: u64) -> u32 {
    // SAFETY: callers pass addresses inside the GIC or ITS frames of the
    // device tree, identity mapped as device memory.
    unsafe { read_volatile(address as *const u32) }
}

/// A 32-bit store to a GIC register.
pub(crate) fn write32(address: u64, value: u32) {
    // SAFETY: as in `read32`.
    unsafe { write_volatile(address as *mut u32, value) }
}

/// A 64-bit load from a GIC register that takes them (`GICR_TYPER`, the
/// ITS's `GITS_*` doubleword registers).
pub(crate) fn read64(address: u64) -> u64 {
    // SAFETY: as in `read32`; the register takes 64-bit reads.
    unsafe { read_volatile(address as *const u64) }
}

/// A 64-bit store to a GIC register that takes them.
pub(crate) fn write64(address: u64, value: u64) {
    // SAFETY: as in `read64`.
    unsafe { write_volatile(address as *mut u64, value) }
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

/// vCPU `cpu`'s redistributor `RD_base` frame, after that vCPU's
/// [`init_cpu`] on a GICv3 (`None` before).
pub fn redistributor(cpu: usize) -> Option<u64> {
    let sgi = SGI_BASES[cpu].load(Ordering::Acquire);
    (sgi != 0 && gicv2_cpu_interface().is_none()).then(|| sgi - GICR_SGI_BASE)
}

/// The GICv2 CPU interface, if the GIC is a GICv2.
pub fn gicv2_cpu_interface() -> Option<u64> {
    let base = CPU_INTERFACE.load(Ordering::Acquire);
    (base != 0).then_some(base)
}

/// Boot vCPU, once: records the frames and turns the distributor on.
pub fn init_distributor(frames: GicFrames) -> Result<(), GicError> {
    if let Some(cpu_interface) = frames.cpu_interface {
        CPU_INTERFACE.store(cpu_interface, Ordering::Release);
        DISTRIBUTOR.store(frames.distributor, Ordering::Release);
        write32(
            frames.distributor + GICD_CTLR,
            GICD_CTLR_ENABLE_GRP0 | GICD_CTLR_ENABLE_GRP1,
        );
        return Ok(());
    }
    REDISTRIBUTORS_START.store(frames.redistributors.start, Ordering::Relaxed);
    REDISTRIBUTORS_END.store(frames.redistributors.end, Ordering::Relaxed);
    DISTRIBUTOR.store(frames.distributor, Ordering::Release);
    let ctlr = frames.distributor + GICD_CTLR;
    write32(ctlr, GICD_CTLR_ARE);
    wait_clear(ctlr, GICD_CTLR_RWP, "GICD_CTLR.RWP")?;
    write32(ctlr, GICD_CTLR_ARE | GICD_CTLR_ENABLE_GRP1);
    wait_clear(ctlr, GICD_CTLR_RWP, "GICD_CTLR.RWP")
}

/// The calling vCPU's MPIDR.
pub fn current_mpidr() -> u64 {
    let mpidr: u64;
    // SAFETY: reading MPIDR_EL1 has no side effects.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) mpidr, options(nomem, nostack)) };
    mpidr
}

/// Every vCPU, after [`init_distributor`]: wakes its redistributor, enables
/// the PPIs `ppis` (group 1, priority [`PRIORITY`]) and the CPU interface.
/// Interrupts stay masked in `PSTATE` until the caller unmasks them.
pub fn init_cpu(ppis: &[u32]) -> Result<(), GicError> {
    if let Some(cpu_interface) = gicv2_cpu_interface() {
        init_cpu_v2(cpu_interface, ppis);
        return Ok(());
    }
    let mpidr = current_mpidr();
    let start = REDISTRIBUTORS_START.load(Ordering::Relaxed);
    let end = REDISTRIBUTORS_END.load(Ordering::Relaxed);
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
    SGI_BASES[smp::current_cpu()].store(sgi, Ordering::Release);
    let bits = ppis.iter().fold(0u32, |bits, &intid| bits | 1 << intid);
    write32(sgi + ICENABLER, bits);
    write32(sgi + IGROUPR, read32(sgi + IGROUPR) | bits);
    for &intid in ppis {
        let word = sgi + gic_regs::priority_offset(intid);
        write32(word, gic_regs::with_priority(read32(word), intid, PRIORITY));
    }
    write32(sgi + ISENABLER, bits);
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

/// GICv2: the calling vCPU's banked distributor words stand for its
/// redistributor; the requested PPIs stay group 0 (signalled as IRQ).
fn init_cpu_v2(cpu_interface: u64, ppis: &[u32]) {
    let distributor = DISTRIBUTOR.load(Ordering::Acquire);
    SGI_BASES[smp::current_cpu()].store(distributor, Ordering::Release);
    let bits = ppis.iter().fold(0u32, |bits, &intid| bits | 1 << intid);
    write32(distributor + ICENABLER, bits);
    write32(distributor + IGROUPR, read32(distributor + IGROUPR) & !bits);
    for &intid in ppis {
        let word = distributor + gic_regs::priority_offset(intid);
        write32(word, gic_regs::with_priority(read32(word), intid, PRIORITY));
    }
    write32(distributor + ISENABLER, bits);
    write32(cpu_interface + GICC_PMR, 0xff);
    write32(cpu_interface + GICC_BPR, 0);
    // Both groups, both signalled as IRQ and acknowledged by GICC_IAR (the
    // scenarios that put interrupts in group 1 work as on a GICv3).
    write32(
        cpu_interface + GICC_CTLR,
        GICC_CTLR_ENABLE_GRP0 | GICC_CTLR_ENABLE_GRP1 | GICC_CTLR_ACK_CTL,
    );
}

/// Reads the word of a one-bit-per-INTID `register` ([`ISENABLER`],
/// [`ISPENDR`], [`ISACTIVER`], ...) that holds `intid`'s bit.
pub fn read_bits(bank: Bank, register: u64, intid: u32) -> u32 {
    read32(bank.base() + gic_regs::bit_word_offset(register, intid))
}

/// Writes `mask` to the word of `register` that holds `intid`'s bit (any
/// INTID of that word).
pub fn write_bits(bank: Bank, register: u64, intid: u32, mask: u32) {
    write32(
        bank.base() + gic_regs::bit_word_offset(register, intid),
        mask,
    );
}

/// Puts `intid` in group 1 (read-modify-write of its `IGROUPR` word).
pub fn set_group1(bank: Bank, intid: u32) {
    let word = read_bits(bank, IGROUPR, intid);
    write_bits(bank, IGROUPR, intid, word | 1 << (intid % 32));
}

/// Reads `intid`'s priority byte.
pub fn priority(bank: Bank, intid: u32) -> u8 {
    let word = read32(bank.base() + gic_regs::priority_offset(intid));
    (word >> ((intid % 4) * 8)) as u8
}

/// Writes `intid`'s priority byte (read-modify-write of its word).
pub fn set_priority(bank: Bank, intid: u32, priority: u8) {
    let word = bank.base() + gic_regs::priority_offset(intid);
    write32(word, gic_regs::with_priority(read32(word), intid, priority));
}

/// Routes SPI `intid` to the CPU with `mpidr` (`GICD_IROUTER`, `IRM` = 0).
/// On a GICv2 `ITARGETSR` names CPU interfaces, not affinities: the SPI goes
/// to the calling vCPU's interface, so `mpidr` must be the caller's own.
pub fn route_spi(intid: u32, mpidr: u64) {
    if gicv2_cpu_interface().is_some() {
        debug_assert_eq!(mpidr, current_mpidr(), "GICv2: route to the caller only");
        let distributor = Bank::Distributor.base();
        // The first target byte is banked and names the reading CPU.
        let own = read32(distributor + GICD_ITARGETSR) as u8;
        // SAFETY: a byte access to GICD_ITARGETSR<intid>, in the distributor
        // frame, identity mapped as device memory.
        unsafe {
            write_volatile(
                (distributor + GICD_ITARGETSR + u64::from(intid)) as *mut u8,
                own,
            )
        };
        return;
    }
    let at = Bank::Distributor.base() + gic_regs::irouter_offset(intid);
    // SAFETY: a 64-bit access to GICD_IROUTER<intid>, in the distributor
    // frame, identity mapped as device memory.
    unsafe { write_volatile(at as *mut u64, gic_regs::irouter(mpidr)) };
}

/// Writes `ICC_PMR_EL1`: only interrupts more urgent than `mask` are
/// signalled.
pub fn set_priority_mask(mask: u8) {
    if let Some(cpu_interface) = gicv2_cpu_interface() {
        write32(cpu_interface + GICC_PMR, u32::from(mask));
        return;
    }
    // SAFETY: the priority mask only filters this vCPU's interrupts.
    unsafe { asm!("msr icc_pmr_el1, {}", "isb", in(reg) u64::from(mask), options(nostack)) };
}

/// Sends SGI `intid` (group 1) to the calling vCPU.
pub fn send_sgi_to_self(intid: u32) {
    if gicv2_cpu_interface().is_some() {
        write32(
            Bank::Distributor.base() + GICD_SGIR,
            GICD_SGIR_SELF | (intid & 0xf),
        );
        return;
    }
    let value = gic_regs::sgi1r_to(intid, current_mpidr());
    // SAFETY: generating an SGI has no effect on memory.
    unsafe { asm!("msr icc_sgi1r_el1, {}", "isb", in(reg) value, options(nostack)) };
}

/// Unmasks (`true`) or masks IRQs in `PSTATE`.
pub fn irqs(enabled: bool) {
    // SAFETY: the IRQ vector hands every interrupt to the scenario that
    // enabled it (`take_interrupts`).
    unsafe {
        if enabled {
            asm!("msr daifclr, #2", "isb", options(nostack));
        } else {
            asm!("msr daifset, #2", "isb", options(nostack));
        }
    }
}

/// Acknowledges the highest-priority pending group 1 interrupt (GICv2:
/// group 0); 1020..=1023 when there is none. On a GICv2 the value keeps an
/// SGI's source CPU bits, which [`end_of_interrupt`] needs back
/// ([`interrupt_id`] strips them).
pub fn acknowledge() -> u32 {
    if let Some(cpu_interface) = gicv2_cpu_interface() {
        return read32(cpu_interface + GICC_IAR);
    }
    let iar: u64;
    // SAFETY: reading ICC_IAR1_EL1 acknowledges an interrupt, which the
    // caller finishes with `end_of_interrupt`.
    unsafe { asm!("mrs {}, icc_iar1_el1", out(reg) iar, options(nostack)) };
    (iar & 0xff_ffff) as u32
}

/// The INTID of an [`acknowledge`] value.
pub fn interrupt_id(acknowledged: u32) -> u32 {
    if gicv2_cpu_interface().is_some() {
        acknowledged & GICC_IAR_INTID_MASK
    } else {
        acknowledged
    }
}

/// Finishes `intid` (priority drop and deactivation), given as
/// [`acknowledge`] returned it.
pub fn end_of_interrupt(intid: u32) {
    if let Some(cpu_interface) = gicv2_cpu_interface() {
        write32(cpu_interface + GICC_EOIR, intid);
        return;
    }
    // SAFETY: writing an acknowledged INTID to ICC_EOIR1_EL1 finishes it.
    unsafe {
        asm!("msr icc_eoir1_el1, {}", "isb", in(reg) u64::from(intid), options(nostack));
    }
}

/// Whether `intid` is a real interrupt rather than a special INTID.
pub fn is_interrupt(intid: u32) -> bool {
    !(SPURIOUS_FIRST..8192).contains(&intid)
}

/// The IRQ vector's work for the scenario that runs: acknowledges until
/// nothing is pending; for each interrupt calls `handler` (which silences a
/// level source), counts it and finishes it.
pub fn take_interrupts(mut handler: impl FnMut(u32)) {
    loop {
        let acknowledged = acknowledge();
        let intid = interrupt_id(acknowledged);
        if !is_interrupt(intid) {
            return;
        }
        handler(intid);
        if let Some(count) = TAKEN.get(intid as usize) {
            count.fetch_add(1, Ordering::AcqRel);
        }
        end_of_interrupt(acknowledged);
    }
}

/// How often `intid` was taken since boot, on all vCPUs together (INTIDs
/// below 64).
pub fn taken(intid: u32) -> u32 {
    TAKEN
        .get(intid as usize)
        .map_or(0, |count| count.load(Ordering::Acquire))
}
