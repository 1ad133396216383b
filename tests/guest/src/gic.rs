//! A minimal GICv3 driver for the interrupt scenarios.
//!
//! The guest's GIC is at the QEMU `virt` addresses, which are also the ones
//! the hypervisor gives its guests: the distributor at `0x0800_0000` and one
//! 128 KiB redistributor per CPU from `0x080a_0000` (CPU n's at
//! `+ n * 0x2_0000`, its `SGI_base` frame 64 KiB further). The CPU interface
//! is reached through the `ICC_*` system registers. Affinity routing is on,
//! one security state: `GICD_CTLR` takes `ARE` and `EnableGrp1`.
//!
//! [`handle_irq`] is the IRQ vector's work: acknowledge (`ICC_IAR1_EL1`),
//! count the INTID in [`taken`], silence the virtual timer when it was the
//! timer (its line is a level), and complete (`ICC_EOIR1_EL1`, EOImode 0:
//! priority drop and deactivation together).

use core::arch::asm;
use core::sync::atomic::{AtomicU32, Ordering};

/// Guest physical address of the distributor.
pub const DISTRIBUTOR: u64 = 0x0800_0000;
/// Guest physical address of CPU 0's redistributor.
pub const REDISTRIBUTORS: u64 = 0x080a_0000;
/// Size of one redistributor (`RD_base` and `SGI_base`).
const REDISTRIBUTOR_STRIDE: u64 = 0x2_0000;
/// Offset of `SGI_base` in a redistributor.
const SGI_BASE: u64 = 0x1_0000;

/// `GICD_CTLR`.
pub const GICD_CTLR: u64 = 0x0000;
/// `GICD_CTLR.EnableGrp1` (one security state).
pub const CTLR_ENABLE_GRP1: u32 = 1 << 1;
/// `GICD_CTLR.ARE`.
pub const CTLR_ARE: u32 = 1 << 4;
/// `IGROUPR` (distributor and `SGI_base` alike).
pub const IGROUPR: u64 = 0x0080;
/// `ISENABLER`.
pub const ISENABLER: u64 = 0x0100;
/// `ISPENDR`.
pub const ISPENDR: u64 = 0x0200;
/// `ISACTIVER`.
pub const ISACTIVER: u64 = 0x0300;
/// `ICACTIVER`.
pub const ICACTIVER: u64 = 0x0380;
/// `IPRIORITYR` (one byte per INTID).
pub const IPRIORITYR: u64 = 0x0400;
/// `GICD_IROUTER<n>` is at this offset + 8n.
const GICD_IROUTER: u64 = 0x6000;
/// `GICR_WAKER`.
const GICR_WAKER: u64 = 0x0014;
const WAKER_PROCESSOR_SLEEP: u32 = 1 << 1;
const WAKER_CHILDREN_ASLEEP: u32 = 1 << 2;

/// INTIDs at or above this are special (1023: nothing pending).
const FIRST_SPECIAL_INTID: u32 = 1020;
/// The virtual timer's PPI.
pub const VTIMER_INTID: u32 = 27;
/// INTIDs whose deliveries [`taken`] counts.
const COUNTED: usize = 64;

static TAKEN: [AtomicU32; COUNTED] = [const { AtomicU32::new(0) }; COUNTED];

/// Which register frame a banked register lives in.
#[derive(Clone, Copy, Debug)]
pub enum Bank {
    /// The distributor (SPIs).
    Distributor,
    /// The `SGI_base` frame of this CPU's redistributor (SGIs and PPIs).
    Redistributor(usize),
}

impl Bank {
    fn base(self) -> u64 {
        match self {
            Bank::Distributor => DISTRIBUTOR,
            Bank::Redistributor(cpu) => rd_base(cpu) + SGI_BASE,
        }
    }
}

fn rd_base(cpu: usize) -> u64 {
    REDISTRIBUTORS + cpu as u64 * REDISTRIBUTOR_STRIDE
}

fn read32(address: u64) -> u32 {
    // SAFETY: `address` is a register of the GIC frames above, identity
    // mapped as device memory; a 32-bit aligned load is a valid access.
    unsafe { core::ptr::read_volatile(address as *const u32) }
}

fn write32(address: u64, value: u32) {
    // SAFETY: as in `read32`; a 32-bit aligned store is a valid access.
    unsafe { core::ptr::write_volatile(address as *mut u32, value) }
}

/// Reads the 32-bit word of a one-bit-per-interrupt register (`IGROUPR`,
/// `IS/ICENABLER`, `IS/ICPENDR`, `IS/ICACTIVER`) that holds `intid`.
pub fn read_bits(bank: Bank, register: u64, intid: u32) -> u32 {
    read32(bank.base() + register + 4 * u64::from(intid / 32))
}

/// Writes the word of `register` that holds the INTIDs of `mask`'s word
/// (`first` is any INTID of that word).
pub fn write_bits(bank: Bank, register: u64, first: u32, mask: u32) {
    write32(bank.base() + register + 4 * u64::from(first / 32), mask);
}

/// Puts `intid` in group 1 (read-modify-write of its `IGROUPR` word).
pub fn set_group1(bank: Bank, intid: u32) {
    let word = read_bits(bank, IGROUPR, intid);
    write_bits(bank, IGROUPR, intid, word | 1 << (intid % 32));
}

/// Reads `intid`'s priority byte.
pub fn priority(bank: Bank, intid: u32) -> u8 {
    // SAFETY: a byte access to an IPRIORITYR register of a GIC frame,
    // identity mapped as device memory (priority registers take bytes).
    unsafe { core::ptr::read_volatile((bank.base() + IPRIORITYR + u64::from(intid)) as *const u8) }
}

/// Writes `intid`'s priority byte.
pub fn set_priority(bank: Bank, intid: u32, priority: u8) {
    // SAFETY: as in `priority`.
    unsafe {
        core::ptr::write_volatile(
            (bank.base() + IPRIORITYR + u64::from(intid)) as *mut u8,
            priority,
        )
    }
}

/// Routes SPI `intid` to the CPU with affinity `mpidr` (`IRM` = 0).
pub fn route_spi(intid: u32, mpidr: u64) {
    let affinity = mpidr & 0xff_00ff_ffff;
    let at = DISTRIBUTOR + GICD_IROUTER + 8 * u64::from(intid);
    // SAFETY: a 64-bit access to GICD_IROUTER<intid>, identity mapped as
    // device memory.
    unsafe { core::ptr::write_volatile(at as *mut u64, affinity) };
}

/// Turns the distributor on (affinity routing, group 1).
pub fn enable_distributor() {
    write32(DISTRIBUTOR + GICD_CTLR, CTLR_ARE | CTLR_ENABLE_GRP1);
}

/// Wakes CPU `cpu`'s redistributor and enables this CPU's interface for
/// group 1 with every priority unmasked. Returns whether the redistributor
/// woke (`ChildrenAsleep` cleared).
pub fn init_cpu(cpu: usize) -> bool {
    let waker = rd_base(cpu) + GICR_WAKER;
    write32(waker, read32(waker) & !WAKER_PROCESSOR_SLEEP);
    let mut woke = false;
    for _ in 0..1_000_000 {
        if read32(waker) & WAKER_CHILDREN_ASLEEP == 0 {
            woke = true;
            break;
        }
        core::hint::spin_loop();
    }
    // SAFETY: the GICv3 CPU interface registers of this CPU; enabling the
    // system register interface and group 1 changes nothing but interrupt
    // delivery, which stays masked in PSTATE until the caller unmasks it.
    unsafe {
        asm!(
            "mrs {tmp}, icc_sre_el1",
            "orr {tmp}, {tmp}, #1",
            "msr icc_sre_el1, {tmp}",
            "isb",
            "msr icc_bpr1_el1, xzr",
            "msr icc_igrpen1_el1, {one}",
            "isb",
            tmp = out(reg) _,
            one = in(reg) 1u64,
            options(nostack),
        );
    }
    set_priority_mask(0xff);
    woke
}

/// Writes `ICC_PMR_EL1`: only interrupts more urgent than `mask` are signalled.
pub fn set_priority_mask(mask: u8) {
    // SAFETY: the priority mask only filters this CPU's interrupts.
    unsafe { asm!("msr icc_pmr_el1, {}", "isb", in(reg) u64::from(mask), options(nostack)) };
}

/// Sends SGI `intid` to the calling CPU, whose `MPIDR_EL1` is `mpidr`
/// (`ICC_SGI1R_EL1`: Aff3.Aff2.Aff1 and the Aff0 bit in the target list).
pub fn send_sgi_to_self(intid: u32, mpidr: u64) {
    let aff0 = mpidr & 0xff;
    let aff1 = (mpidr >> 8) & 0xff;
    let aff2 = (mpidr >> 16) & 0xff;
    let aff3 = (mpidr >> 32) & 0xff;
    let value = aff3 << 48
        | aff2 << 32
        | (aff0 / 16) << 44
        | u64::from(intid & 0xf) << 24
        | aff1 << 16
        | 1 << (aff0 % 16);
    // SAFETY: generating an SGI has no effect on memory.
    unsafe { asm!("msr icc_sgi1r_el1, {}", "isb", in(reg) value, options(nostack)) };
}

/// Unmasks (`true`) or masks IRQs in PSTATE.
pub fn irqs(enabled: bool) {
    // SAFETY: the IRQ vector handles every interrupt this guest enables.
    unsafe {
        if enabled {
            asm!("msr daifclr, #2", "isb", options(nostack));
        } else {
            asm!("msr daifset, #2", "isb", options(nostack));
        }
    }
}

/// How often `intid` was taken since boot.
pub fn taken(intid: u32) -> u32 {
    TAKEN
        .get(intid as usize)
        .map_or(0, |count| count.load(Ordering::Acquire))
}

/// Arms the virtual timer to fire in `ticks` counter ticks.
pub fn arm_virtual_timer(ticks: u64) {
    // SAFETY: the EL1 virtual timer is the guest's own; ENABLE = 1,
    // IMASK = 0.
    unsafe {
        asm!("msr cntv_tval_el0, {}", "msr cntv_ctl_el0, {}", "isb",
             in(reg) ticks, in(reg) 1u64, options(nostack));
    }
}

/// The IRQ vector's work: takes one interrupt, counts it, completes it.
pub fn handle_irq() {
    let iar: u64;
    // SAFETY: acknowledging through the CPU interface; the INTID read is
    // completed below.
    unsafe { asm!("mrs {}, icc_iar1_el1", out(reg) iar, options(nomem, nostack)) };
    let intid = (iar & 0xff_ffff) as u32;
    if intid >= FIRST_SPECIAL_INTID {
        return;
    }
    if intid == VTIMER_INTID {
        // SAFETY: disabling the guest's own virtual timer drops its line.
        unsafe { asm!("msr cntv_ctl_el0, xzr", "isb", options(nostack)) };
    }
    if let Some(count) = TAKEN.get(intid as usize) {
        count.fetch_add(1, Ordering::AcqRel);
    }
    // SAFETY: completes the interrupt acknowledged above (EOImode 0).
    unsafe { asm!("msr icc_eoir1_el1, {}", "isb", in(reg) iar, options(nostack)) };
}
