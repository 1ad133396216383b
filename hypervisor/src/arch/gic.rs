//! The host's GICv3, driven at EL2.
//!
//! [`init_distributor`] (boot CPU, once): affinity routing on, group 1
//! (non-secure) enabled, and the console UART's SPI made group 1, level,
//! routed to the boot CPU and enabled. [`init_cpu`] (every CPU): finds the
//! CPU's redistributor by `GICR_TYPER` affinity in the device tree's regions,
//! wakes it (`GICR_WAKER`), makes its SGIs and PPIs group 1 and enables the
//! kick SGI, the maintenance PPI and the PPIs of the guest's two EL1 timers,
//! virtual and physical (as the device tree names them; the EL2 physical
//! timer's PPI stays disabled: the hypervisor uses no timer, and all three
//! timers are turned off first); then the CPU
//! interface: `ICC_SRE_EL2` (SRE, Enable for EL1), `ICC_PMR_EL1` open,
//! `ICC_CTLR_EL1.EOImode` 0 (an EOI at EL2 drops priority and deactivates:
//! no list register is hardware-linked, every interrupt is finished here) and
//! `ICC_IGRPEN1_EL1`. EL2 runs with `PSTATE.I` masked; the interrupts arrive
//! as IRQ exits from the guest (`HCR_EL2.IMO`), where the run loop
//! acknowledges them with [`acknowledge`] and finishes them with
//! [`end_of_interrupt`].
//!
//! A timer's PPI is masked here ([`set_timer_masked`]) while its line is
//! high, so the guest's `CNTV_CTL_EL0` and `CNTP_CTL_EL0` stay exactly as it
//! wrote them (see `crate::timer`).

use super::percpu::{self, MAX_CPUS};
use crate::host_gic::{
    self, DEFAULT_MAINTENANCE_INTID, HOST_PRIORITY, KICK_SGI, gicd, gicr, sgi1r_value,
};
use crate::platform::Gicv3;
use crate::timer::TimerId;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicUsize, Ordering};
use spin::Once;

/// What the driver learned at boot.
struct HostGic {
    maintenance: u32,
    regions: alloc::vec::Vec<crate::ranges::PhysRange>,
    /// The timers' host PPIs, in [`TimerId::index`] order.
    timers: [u32; 2],
}

static GIC: Once<HostGic> = Once::new();
/// Each CPU's `SGI_base` frame address (0 until `init_cpu`).
static SGI_BASES: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];

/// Why the GIC could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicError {
    /// `init_cpu` before `init_distributor`.
    NotInitialised,
    /// No redistributor has this CPU's affinity.
    NoRedistributor(u64),
}

fn read32(addr: usize) -> u32 {
    // SAFETY: callers pass addresses inside the GIC frames the device tree
    // named, which the EL2 stage-1 maps as device memory.
    unsafe { read_volatile(addr as *const u32) }
}

fn write32(addr: usize, value: u32) {
    // SAFETY: as in `read32`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

fn read64(addr: usize) -> u64 {
    // SAFETY: as in `read32`; 64-bit GIC registers take 64-bit accesses.
    unsafe { read_volatile(addr as *const u64) }
}

fn write64(addr: usize, value: u64) {
    // SAFETY: as in `read64`.
    unsafe { write_volatile(addr as *mut u64, value) }
}

fn wait_distributor(distributor: usize) {
    while read32(distributor + gicd::CTLR) & gicd::CTLR_RWP != 0 {
        core::hint::spin_loop();
    }
}

/// Boot CPU, once: sets up the distributor and routes `uart_intid` (an SPI)
/// to the CPU with affinity `boot_mpidr`. `timers` are the host PPIs of the
/// virtual and the EL1 physical timer ([`TimerId::index`] order).
pub fn init_distributor(gic: &Gicv3, timers: [u32; 2], uart_intid: Option<u32>, boot_mpidr: u64) {
    let distributor = gic.distributor.start as usize;
    // Groups off, then affinity routing on, then group 1 on.
    write32(distributor + gicd::CTLR, 0);
    wait_distributor(distributor);
    write32(distributor + gicd::CTLR, gicd::CTLR_ARE_NS);
    wait_distributor(distributor);
    write32(
        distributor + gicd::CTLR,
        gicd::CTLR_ARE_NS | gicd::CTLR_ENABLE_GRP1_NS,
    );
    wait_distributor(distributor);
    if let Some(intid) = uart_intid.filter(|&i| (32..1020).contains(&i)) {
        let word = (intid / 32) as usize * 4;
        let bit = 1 << (intid % 32);
        write32(distributor + gicd::ICENABLER + word, bit);
        wait_distributor(distributor);
        let group = read32(distributor + gicd::IGROUPR + word);
        write32(distributor + gicd::IGROUPR + word, group | bit);
        // SAFETY: byte access to the interrupt's priority byte, in the frame.
        unsafe {
            write_volatile(
                (distributor + gicd::IPRIORITYR + intid as usize) as *mut u8,
                HOST_PRIORITY,
            );
        }
        let cfg = distributor + gicd::ICFGR + (intid / 16) as usize * 4;
        write32(cfg, read32(cfg) & !(0b11 << ((intid % 16) * 2)));
        let route = ((boot_mpidr >> 32) & 0xff) << 32 | (boot_mpidr & 0xff_ffff);
        write64(distributor + gicd::IROUTER + intid as usize * 8, route);
        write32(distributor + gicd::ISENABLER + word, bit);
    }
    let maintenance = gic.maintenance_intid.unwrap_or_else(|| {
        log::warn!(
            "the device tree's GICv3 names no maintenance interrupt: using INTID {DEFAULT_MAINTENANCE_INTID}"
        );
        DEFAULT_MAINTENANCE_INTID
    });
    GIC.call_once(|| HostGic {
        maintenance,
        regions: gic.redistributors.clone(),
        timers,
    });
}

/// Every CPU (after `init_distributor`): wakes this CPU's redistributor and
/// enables its CPU interface. `index` is the CPU's logical number.
pub fn init_cpu(index: usize) -> Result<(), GicError> {
    let gic = GIC.get().ok_or(GicError::NotInitialised)?;
    let mpidr = super::sysreg::current_mpidr();
    let rd = gic
        .regions
        .iter()
        .find_map(|region| {
            let base = region.start as usize;
            host_gic::find_redistributor(mpidr, region.size(), |offset| {
                read64(base + offset as usize + gicr::TYPER)
            })
            .map(|offset| base + offset as usize)
        })
        .ok_or(GicError::NoRedistributor(mpidr))?;
    let waker = read32(rd + gicr::WAKER);
    write32(rd + gicr::WAKER, waker & !gicr::WAKER_PROCESSOR_SLEEP);
    while read32(rd + gicr::WAKER) & gicr::WAKER_CHILDREN_ASLEEP != 0 {
        core::hint::spin_loop();
    }
    // Whatever ran here before (firmware, a boot loader) may have left a
    // timer on: the guest's two timers belong to no guest until a vCPU is
    // loaded, and the EL2 physical timer to nobody, so all three go off
    // before their PPIs (the EL1 ones) are enabled, and no level is left
    // asserting while this CPU waits at EL2.
    // SAFETY: turning timers off only stops their interrupt outputs; no
    // guest runs on this CPU yet and the hypervisor uses no timer.
    unsafe {
        crate::write_sysreg!(cntv_ctl_el0, 0);
        crate::write_sysreg!(cntp_ctl_el0, 0);
        crate::write_sysreg!(cnthp_ctl_el2, 0);
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    let sgi = rd + gicr::SGI_BASE;
    write32(sgi + gicr::ICENABLER0, u32::MAX);
    write32(sgi + gicr::IGROUPR0, u32::MAX);
    let [vtimer, ptimer] = gic.timers;
    for intid in [KICK_SGI, gic.maintenance, vtimer, ptimer] {
        // SAFETY: byte access to the interrupt's priority byte, in the frame.
        unsafe {
            write_volatile(
                (sgi + gicr::IPRIORITYR + intid as usize) as *mut u8,
                HOST_PRIORITY,
            );
        }
    }
    write32(
        sgi + gicr::ISENABLER0,
        1 << KICK_SGI | 1 << gic.maintenance | 1 << vtimer | 1 << ptimer,
    );
    SGI_BASES[index].store(sgi, Ordering::Release);
    // SAFETY: these ICC registers configure this CPU's physical interface;
    // EL2 keeps PSTATE.I masked, so nothing is taken at EL2.
    unsafe {
        crate::write_sysreg!(icc_sre_el2, 0x9);
        core::arch::asm!("isb", options(nostack, preserves_flags));
        crate::write_sysreg!(icc_pmr_el1, 0xff);
        crate::write_sysreg!(icc_bpr1_el1, 0);
        crate::write_sysreg!(icc_ctlr_el1, 0);
        crate::write_sysreg!(icc_igrpen1_el1, 1);
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    Ok(())
}

/// The GIC maintenance interrupt of this machine.
pub fn maintenance_intid() -> u32 {
    GIC.get()
        .map_or(DEFAULT_MAINTENANCE_INTID, |g| g.maintenance)
}

/// The host PPIs of the guest's timers, in [`TimerId::index`] order.
pub fn timer_intids() -> [u32; 2] {
    GIC.get()
        .map_or(TimerId::ALL.map(|t| t.host_intid(None)), |g| g.timers)
}

/// Acknowledges the highest-priority pending group 1 interrupt
/// (`ICC_IAR1_EL1`); 1020..=1023 when none.
pub fn acknowledge() -> u32 {
    (crate::read_sysreg!(icc_iar1_el1) & 0xff_ffff) as u32
}

/// Finishes `intid` (priority drop and deactivation, `EOImode` 0).
pub fn end_of_interrupt(intid: u32) {
    // SAFETY: writing an acknowledged INTID to ICC_EOIR1_EL1 finishes it.
    unsafe { crate::write_sysreg!(icc_eoir1_el1, u64::from(intid)) };
}

/// Masks (`true`) or unmasks this CPU's PPI of `timer` at its
/// redistributor.
pub fn set_timer_masked(timer: TimerId, masked: bool) {
    let index = percpu::current().index();
    let sgi = SGI_BASES[index].load(Ordering::Acquire);
    if sgi == 0 {
        return;
    }
    let bit = 1 << timer_intids()[timer.index()];
    if masked {
        write32(sgi + gicr::ICENABLER0, bit);
    } else {
        write32(sgi + gicr::ISENABLER0, bit);
    }
}

/// Whether the host GIC is driven (a GICv3 was found and set up).
pub fn is_up() -> bool {
    GIC.get().is_some()
}

/// Acknowledges and finishes every interrupt pending for this CPU, handling
/// none (for a CPU that waits at EL2 and only needs to be woken).
pub fn discard_pending() {
    if !is_up() {
        return;
    }
    loop {
        let intid = acknowledge();
        if intid >= host_gic::SPURIOUS_FIRST {
            return;
        }
        end_of_interrupt(intid);
    }
}

/// Waits at EL2 until another CPU wakes this one: with the GIC up, `WFI`
/// (a kick SGI wakes it although `PSTATE.I` masks it), else `WFE` (an
/// event). Callers first discard or handle what is already pending, since a
/// pending interrupt ends `WFI` at once.
pub fn wait_for_wakeup() {
    if is_up() {
        // SAFETY: WFI only suspends the CPU until an interrupt or event.
        unsafe { core::arch::asm!("dsb sy", "wfi", options(nostack, preserves_flags)) }
    } else {
        super::sysreg::wait_for_event();
    }
}

/// Stops this CPU from being signalled any interrupt (group 1 disabled at
/// its CPU interface), for a CPU that halts for good.
pub fn quiesce() {
    if is_up() {
        // SAFETY: disabling group 1 at this CPU's interface only stops
        // interrupts from being signalled to it.
        unsafe {
            crate::write_sysreg!(icc_igrpen1_el1, 0);
            core::arch::asm!("isb", options(nostack, preserves_flags));
        }
    }
}

/// Sends the kick SGI to logical CPU `index`. Without a host GICv3 (the VM
/// was created with a warning that its guest gets no interrupts) there is
/// nothing to send.
pub fn kick(index: usize) {
    if !is_up() {
        return;
    }
    let mpidr = percpu::slot(index).mpidr.load(Ordering::Relaxed);
    // SAFETY: the barrier orders the caller's memory writes (the interrupt
    // state the target will read) before the SGI; the SGI only interrupts.
    unsafe {
        core::arch::asm!("dsb ish", options(nostack, preserves_flags));
        crate::write_sysreg!(icc_sgi1r_el1, sgi1r_value(mpidr, KICK_SGI));
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
}
