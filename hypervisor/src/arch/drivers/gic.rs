//! The host's GIC at EL2: the machine side of `crate::drivers::gic::driver`,
//! which holds the distributor, redistributor and CPU interface sequences
//! and describes them.
//!
//! Here: [`MmioFrame`], the driver's `GicFrame` as volatile accesses to the
//! frames the device tree named; [`IccRegisters`], its `CpuRegisters` as
//! `MRS`/`MSR` and barriers; the statics that hold the driver set up at boot
//! (a GICv3 or a GICv2, each CPU's `SGI_base` frame or GICv2 interface
//! mask); this CPU's list registers ([`HostListRegisters`]: the `ICH_*_EL2`
//! system registers, or the driver's `GichListRegisters` over the `GICH`
//! frame);
//! and the free functions the rest of the machine layer calls, which
//! dispatch (statically) to the driver that was set up.

use crate::arch::cpu::percpu::{self, MAX_CPUS};
use crate::arch::drivers::list_registers::HardwareListRegisters;
use crate::devices::vgic::ListRegisters;
use crate::drivers::gic::driver::{
    self as host_driver, CpuRegister, CpuRegisters, GicFrame, GicV2, GicV3, HostGic, SpiTarget,
};
use crate::drivers::gic::{DEFAULT_MAINTENANCE_INTID, gicr};
use crate::platform::{Gicv2, Gicv3};
use crate::vocabulary::timers::TimerId;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use spin::Once;

pub use crate::drivers::gic::driver::{Acknowledged, GicError};

/// One of the GIC's MMIO frames: volatile accesses at `base + offset`.
#[derive(Clone, Copy, Debug)]
pub struct MmioFrame {
    base: usize,
}

impl MmioFrame {
    /// The frame at `base`.
    ///
    /// # Safety
    /// `base` and every register the driver reaches from it must be inside
    /// the GIC frames the device tree named (the ITS's included), which the
    /// EL2 stage-1 maps as device memory.
    pub const unsafe fn new(base: usize) -> Self {
        Self { base }
    }

    /// The frame's address.
    pub fn base(&self) -> usize {
        self.base
    }
}

impl GicFrame for MmioFrame {
    #[inline(always)]
    fn read32(&self, offset: usize) -> u32 {
        // SAFETY: `new`'s contract: the register is in a mapped GIC frame.
        unsafe { read_volatile((self.base + offset) as *const u32) }
    }

    #[inline(always)]
    fn write32(&self, offset: usize, value: u32) {
        // SAFETY: as in `read32`.
        unsafe { write_volatile((self.base + offset) as *mut u32, value) }
    }

    #[inline(always)]
    fn read64(&self, offset: usize) -> u64 {
        // SAFETY: as in `read32`; 64-bit GIC registers take 64-bit accesses.
        unsafe { read_volatile((self.base + offset) as *const u64) }
    }

    #[inline(always)]
    fn write64(&self, offset: usize, value: u64) {
        // SAFETY: as in `read64`.
        unsafe { write_volatile((self.base + offset) as *mut u64, value) }
    }

    #[inline(always)]
    fn write8(&self, offset: usize, value: u8) {
        // SAFETY: as in `read32`; priority and target bytes take byte
        // accesses.
        unsafe { write_volatile((self.base + offset) as *mut u8, value) }
    }

    #[inline(always)]
    fn at(&self, offset: usize) -> Self {
        // SAFETY: the driver only steps to frames inside this one's region
        // (a redistributor in its region, the SGI frame of a redistributor).
        unsafe { Self::new(self.base + offset) }
    }
}

/// The running CPU's GIC system registers, timers' control registers and
/// barriers, as `MRS`, `MSR`, `ISB` and `DSB`.
#[derive(Clone, Copy, Debug)]
pub struct IccRegisters(());

impl IccRegisters {
    /// The registers.
    ///
    /// # Safety
    /// Only the GIC driver's sequences may use them: each write configures
    /// this CPU's physical or virtual GIC interface (EL2 keeps `PSTATE.I`
    /// masked, so nothing is taken at EL2) or turns a timer off; on a CPU
    /// with the GICv3 system-register interface only.
    const unsafe fn new() -> Self {
        Self(())
    }
}

impl CpuRegisters for IccRegisters {
    #[inline(always)]
    fn read(&self, register: CpuRegister) -> u64 {
        match register {
            CpuRegister::IccIar1El1 => crate::read_sysreg!(icc_iar1_el1),
            CpuRegister::IccSreEl2 => crate::read_sysreg!(icc_sre_el2),
            CpuRegister::IccPmrEl1 => crate::read_sysreg!(icc_pmr_el1),
            CpuRegister::IccBpr1El1 => crate::read_sysreg!(icc_bpr1_el1),
            CpuRegister::IccCtlrEl1 => crate::read_sysreg!(icc_ctlr_el1),
            CpuRegister::IccIgrpen1El1 => crate::read_sysreg!(icc_igrpen1_el1),
            CpuRegister::IchVmcrEl2 => crate::read_sysreg!(ich_vmcr_el2),
            CpuRegister::CntvCtlEl0 => crate::read_sysreg!(cntv_ctl_el0),
            CpuRegister::CntpCtlEl0 => crate::read_sysreg!(cntp_ctl_el0),
            CpuRegister::CnthpCtlEl2 => crate::read_sysreg!(cnthp_ctl_el2),
            CpuRegister::IchAp0rEl2(_)
            | CpuRegister::IchAp1rEl2(_)
            | CpuRegister::IccEoir1El1
            | CpuRegister::IccDirEl1
            | CpuRegister::IccSgi1rEl1 => unreachable!("the GIC driver never reads {register:?}"),
        }
    }

    #[inline(always)]
    fn write(&self, register: CpuRegister, value: u64) {
        // SAFETY: `new`'s contract: the driver's sequences write these
        // registers of this CPU, which only configure its GIC interface or
        // turn a timer off.
        unsafe {
            match register {
                CpuRegister::IccSreEl2 => crate::write_sysreg!(icc_sre_el2, value),
                CpuRegister::IccPmrEl1 => crate::write_sysreg!(icc_pmr_el1, value),
                CpuRegister::IccBpr1El1 => crate::write_sysreg!(icc_bpr1_el1, value),
                CpuRegister::IccCtlrEl1 => crate::write_sysreg!(icc_ctlr_el1, value),
                CpuRegister::IccIgrpen1El1 => crate::write_sysreg!(icc_igrpen1_el1, value),
                CpuRegister::IccIar1El1 => unreachable!("ICC_IAR1_EL1 is read-only"),
                CpuRegister::IccEoir1El1 => crate::write_sysreg!(icc_eoir1_el1, value),
                CpuRegister::IccDirEl1 => crate::write_sysreg!(icc_dir_el1, value),
                CpuRegister::IccSgi1rEl1 => crate::write_sysreg!(icc_sgi1r_el1, value),
                CpuRegister::IchVmcrEl2 => crate::write_sysreg!(ich_vmcr_el2, value),
                CpuRegister::IchAp0rEl2(0) => crate::write_sysreg!(ich_ap0r0_el2, value),
                CpuRegister::IchAp0rEl2(1) => crate::write_sysreg!(ich_ap0r1_el2, value),
                CpuRegister::IchAp0rEl2(2) => crate::write_sysreg!(ich_ap0r2_el2, value),
                CpuRegister::IchAp0rEl2(_) => crate::write_sysreg!(ich_ap0r3_el2, value),
                CpuRegister::IchAp1rEl2(0) => crate::write_sysreg!(ich_ap1r0_el2, value),
                CpuRegister::IchAp1rEl2(1) => crate::write_sysreg!(ich_ap1r1_el2, value),
                CpuRegister::IchAp1rEl2(2) => crate::write_sysreg!(ich_ap1r2_el2, value),
                CpuRegister::IchAp1rEl2(_) => crate::write_sysreg!(ich_ap1r3_el2, value),
                CpuRegister::CntvCtlEl0 => crate::write_sysreg!(cntv_ctl_el0, value),
                CpuRegister::CntpCtlEl0 => crate::write_sysreg!(cntp_ctl_el0, value),
                CpuRegister::CnthpCtlEl2 => crate::write_sysreg!(cnthp_ctl_el2, value),
            }
        }
    }

    #[inline(always)]
    fn isb(&self) {
        // SAFETY: a barrier has no effect besides ordering.
        unsafe { core::arch::asm!("isb", options(nostack, preserves_flags)) }
    }

    #[inline(always)]
    fn dsb_ish(&self) {
        // SAFETY: the barrier orders the caller's memory writes (the
        // interrupt state the target will read) before the SGI; it has no
        // other effect.
        unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) }
    }
}

/// The GICv3 driver on this machine.
type HostGicV3 = GicV3<MmioFrame, IccRegisters>;
/// The GICv2 driver on this machine.
type HostGicV2 = GicV2<MmioFrame, IccRegisters>;

static GIC: Once<HostGicV3> = Once::new();
/// Each CPU's `SGI_base` frame address (0 until `init_cpu`).
static SGI_BASES: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];

static GICV2: Once<HostGicV2> = Once::new();
/// Each CPU's GICv2 CPU interface mask (its bit in `ITARGETSR`/`SGIR`).
static CPU_MASKS: [AtomicU8; MAX_CPUS] = [const { AtomicU8::new(0) }; MAX_CPUS];

/// Boot CPU, once: sets up the distributor and routes `uart_intid` (an SPI)
/// to the CPU with affinity `boot_mpidr`. `timers` are the host PPIs of the
/// virtual and the EL1 physical timer ([`TimerId::index`] order).
pub fn init_distributor(gic: &Gicv3, timers: [u32; 2], uart_intid: Option<u32>, boot_mpidr: u64) {
    // SAFETY: the device tree names these frames; the EL2 stage-1 maps them
    // as device memory.
    let distributor = unsafe { MmioFrame::new(gic.distributor.start as usize) };
    HostGicV3::init_distributor(&distributor, uart_intid, boot_mpidr);
    let regions = gic
        .redistributors
        .iter()
        .map(|region| {
            // SAFETY: as above: a redistributor region of the device tree.
            let frame = unsafe { MmioFrame::new(region.start as usize) };
            (frame, region.size())
        })
        .collect();
    // SAFETY: only the driver uses them; a GICv3 host has the
    // system-register interface.
    let cpu = unsafe { IccRegisters::new() };
    GIC.call_once(|| {
        GicV3::new(
            distributor,
            regions,
            cpu,
            gic.maintenance_intid,
            timers,
            gic.emulated_by_qemu,
        )
    });
}

/// Every CPU (after [`init_distributor`] or [`init_gicv2`]): brings up this
/// CPU's part of the GIC. `index` is the CPU's logical number.
pub fn init_cpu(index: usize) -> Result<(), GicError> {
    if let Some(gic) = GICV2.get() {
        let mask = gic.init_cpu();
        CPU_MASKS[index].store(mask, Ordering::Release);
        return Ok(());
    }
    let gic = GIC.get().ok_or(GicError::NotInitialised)?;
    let sgi = gic.init_cpu(crate::arch::cpu::sysreg::current_mpidr())?;
    SGI_BASES[index].store(sgi.base(), Ordering::Release);
    Ok(())
}

/// The `RD_base` frame of CPU `index`'s redistributor (GICv3, once
/// [`init_cpu`] found it).
pub fn redistributor(index: usize) -> Option<usize> {
    let sgi = SGI_BASES.get(index)?.load(Ordering::Acquire);
    (sgi != 0).then(|| sgi - gicr::SGI_BASE)
}

/// Boot CPU, once, on a GICv2 host with the virtualization extensions
/// (`crate::drivers::gic::driver` describes the sequence). Returns `false`
/// (and drives nothing) without a `GICH` frame.
pub fn init_gicv2(gic: &Gicv2, timers: [u32; 2], uart_intid: Option<u32>) -> bool {
    let Some(hyp) = gic.hyp_interface else {
        log::warn!("the device tree's GICv2 has no virtualization extensions (no GICH frame)");
        return false;
    };
    // SAFETY: the device tree names these frames; the EL2 stage-1 maps them
    // as device memory.
    let (distributor, cpu_interface, hyp_interface) = unsafe {
        (
            MmioFrame::new(gic.distributor.start as usize),
            MmioFrame::new(gic.cpu_interface.start as usize),
            MmioFrame::new(hyp.start as usize),
        )
    };
    HostGicV2::init_distributor(&distributor, uart_intid);
    // SAFETY: only the driver uses them, for the timers' control registers
    // (a GICv2 host has no GIC system registers, and the driver writes none).
    let cpu = unsafe { IccRegisters::new() };
    GICV2.call_once(|| GicV2 {
        distributor,
        cpu_interface,
        hyp_interface,
        cpu,
        maintenance: gic.maintenance_intid.unwrap_or(DEFAULT_MAINTENANCE_INTID),
        timers,
    });
    true
}

/// The list registers of a GICv2 host on this machine.
pub type GichListRegisters = host_driver::GichListRegisters<MmioFrame>;

/// This CPU's list registers, on either kind of host GIC.
#[derive(Debug)]
pub enum HostListRegisters {
    /// `ICH_LR<n>_EL2` and friends.
    V3(HardwareListRegisters),
    /// The `GICH` frame.
    V2(GichListRegisters),
}

impl ListRegisters for HostListRegisters {
    fn count(&self) -> usize {
        match self {
            Self::V3(l) => l.count(),
            Self::V2(l) => l.count(),
        }
    }

    fn read_lr(&self, index: usize) -> u64 {
        match self {
            Self::V3(l) => l.read_lr(index),
            Self::V2(l) => l.read_lr(index),
        }
    }

    fn write_lr(&mut self, index: usize, value: u64) {
        match self {
            Self::V3(l) => l.write_lr(index, value),
            Self::V2(l) => l.write_lr(index, value),
        }
    }

    fn read_hcr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_hcr(),
            Self::V2(l) => l.read_hcr(),
        }
    }

    fn write_hcr(&mut self, value: u64) {
        match self {
            Self::V3(l) => l.write_hcr(value),
            Self::V2(l) => l.write_hcr(value),
        }
    }

    fn read_misr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_misr(),
            Self::V2(l) => l.read_misr(),
        }
    }

    fn read_elrsr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_elrsr(),
            Self::V2(l) => l.read_elrsr(),
        }
    }
}

/// The driver that was set up, if any: static dispatch between the two.
#[derive(Clone, Copy)]
enum Driver {
    V3(&'static HostGicV3),
    V2(&'static HostGicV2),
}

impl HostGic for Driver {
    #[inline(always)]
    fn acknowledge(&self) -> Acknowledged {
        match self {
            Self::V3(g) => g.acknowledge(),
            Self::V2(g) => g.acknowledge(),
        }
    }

    #[inline(always)]
    fn drop_priority(&self, ack: Acknowledged) {
        match self {
            Self::V3(g) => g.drop_priority(ack),
            Self::V2(g) => g.drop_priority(ack),
        }
    }

    #[inline(always)]
    fn deactivate(&self, ack: Acknowledged) {
        match self {
            Self::V3(g) => g.deactivate(ack),
            Self::V2(g) => g.deactivate(ack),
        }
    }
}

#[inline(always)]
fn driver() -> Option<Driver> {
    if let Some(v2) = GICV2.get() {
        return Some(Driver::V2(v2));
    }
    GIC.get().map(Driver::V3)
}

/// This CPU's `SGI_base` frame (GICv3, once [`init_cpu`] ran here).
#[inline(always)]
fn own_sgi_frame() -> Option<MmioFrame> {
    let sgi = SGI_BASES[percpu::current().index()].load(Ordering::Acquire);
    // SAFETY: `init_cpu` stored the address of this CPU's SGI frame, inside
    // a redistributor region of the device tree.
    (sgi != 0).then(|| unsafe { MmioFrame::new(sgi) })
}

/// Whether the host GIC is a GICv2 (driven through [`init_gicv2`]).
pub fn is_v2() -> bool {
    GICV2.get().is_some()
}

/// This CPU's list registers: the GICv2 `GICH` frame when that driver is up,
/// else the GICv3 system registers when the CPU has them (`has_sysregs`).
pub fn list_registers(has_sysregs: bool) -> Option<HostListRegisters> {
    if let Some(v2) = GICV2.get() {
        return Some(HostListRegisters::V2(v2.list_registers()));
    }
    // SAFETY: the boot path set ICC_SRE_EL2.SRE on every CPU with the
    // GICv3 system-register interface; the caller manages this CPU's list
    // registers.
    has_sysregs.then(|| HostListRegisters::V3(unsafe { HardwareListRegisters::new() }))
}

/// The virtual CPU interface's guest-owned state as after a reset.
pub fn reset_virtual_interface(preemption_bits: u64) {
    if let Some(v2) = GICV2.get() {
        v2.reset_virtual_interface();
    } else {
        // SAFETY: only the driver's reset uses them; without a GICv2 the
        // caller has the GICv3 list registers, so the system registers.
        let cpu = unsafe { IccRegisters::new() };
        host_driver::reset_virtual_interface_v3(&cpu, guards_binary_point(), preemption_bits);
    }
}

/// The GIC maintenance interrupt of this machine.
pub fn maintenance_intid() -> u32 {
    if let Some(v2) = GICV2.get() {
        return v2.maintenance;
    }
    GIC.get()
        .map_or(DEFAULT_MAINTENANCE_INTID, |g| g.maintenance)
}

/// The host PPIs of the guest's timers, in [`TimerId::index`] order.
pub fn timer_intids() -> [u32; 2] {
    if let Some(v2) = GICV2.get() {
        return v2.timers;
    }
    GIC.get()
        .map_or(TimerId::ALL.map(|t| t.host_intid(None)), |g| g.timers)
}

/// Acknowledges the highest-priority pending interrupt; INTID 1020..=1023
/// when none (or when no GIC is driven).
#[inline]
pub fn acknowledge() -> Acknowledged {
    driver().map_or(Acknowledged::NONE, |d| d.acknowledge())
}

/// Finishes an acknowledged interrupt (priority drop and deactivation).
#[inline]
pub fn end_of_interrupt(ack: Acknowledged) {
    if let Some(d) = driver() {
        d.end_of_interrupt(ack);
    }
}

/// Only drops the priority of an acknowledged interrupt: it stays active
/// (for a guest timer's PPI, until the guest deactivates it through a
/// hardware list register, or [`deactivate_timer`]).
#[inline]
pub fn drop_priority(ack: Acknowledged) {
    if let Some(d) = driver() {
        d.drop_priority(ack);
    }
}

/// Whether guests' binary points are guarded on this host (a GICv3 emulated
/// by QEMU): `ICH_VMCR_EL2.VCBPR` stays set and `ICH_HCR_EL2.TC` traps the
/// common CPU interface registers (`crate::devices::vgic::cpu_interface`).
pub fn guards_binary_point() -> bool {
    GICV2.get().is_none() && GIC.get().is_some_and(|g| g.guard_binary_point)
}

/// Clears the active state of this CPU's PPI `intid` (a no-op when it is
/// not active).
#[inline]
pub fn clear_ppi_active(intid: u32) {
    match driver() {
        Some(Driver::V3(_)) => {
            if let Some(sgi) = own_sgi_frame() {
                HostGicV3::clear_ppi_active(&sgi, intid);
            }
        }
        Some(Driver::V2(g)) => g.clear_ppi_active(intid),
        None => {}
    }
}

/// Clears the active state of this CPU's PPI of `timer` (a no-op when it is
/// not active): for an interrupt the guest will not deactivate.
#[inline]
pub fn deactivate_timer(timer: TimerId) {
    match driver() {
        Some(Driver::V3(g)) => {
            if let Some(sgi) = own_sgi_frame() {
                HostGicV3::clear_ppi_active(&sgi, g.timers[timer.index()]);
            }
        }
        Some(Driver::V2(g)) => g.clear_ppi_active(g.timers[timer.index()]),
        None => {}
    }
}

/// Masks (`true`) or unmasks this CPU's PPI of `timer` at the host GIC.
pub fn set_timer_masked(timer: TimerId, masked: bool) {
    if driver().is_some() {
        set_ppi_enabled(timer_intids()[timer.index()], !masked);
    }
}

/// Enables (at the hypervisor's priority; group 1 on a GICv3 and group 0 on
/// a GICv2, as every PPI) or disables this CPU's PPI `intid`: the console's
/// poll timer, and what the console CPU turns off when it parks.
pub fn set_ppi_enabled(intid: u32, enabled: bool) {
    match driver() {
        Some(Driver::V3(_)) => {
            if let Some(sgi) = own_sgi_frame() {
                HostGicV3::set_ppi_enabled(&sgi, intid, enabled);
            }
        }
        Some(Driver::V2(g)) => g.set_ppi_enabled(intid, enabled),
        None => {}
    }
}

/// Whether the host GIC is driven (a GICv3, or a GICv2 with the
/// virtualization extensions, was found and set up).
pub fn is_up() -> bool {
    driver().is_some()
}

/// Acknowledges and finishes every interrupt pending for this CPU, handling
/// none (for a CPU that waits at EL2 and only needs to be woken).
pub fn discard_pending() {
    if let Some(d) = driver() {
        host_driver::discard_pending(&d);
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
        crate::arch::cpu::sysreg::wait_for_event();
    }
}

/// Stops this CPU from being signalled any interrupt, for a CPU that halts
/// for good.
pub fn quiesce() {
    match driver() {
        Some(Driver::V3(g)) => g.quiesce(),
        Some(Driver::V2(g)) => g.quiesce(),
        None => {}
    }
}

/// Sends the kick SGI to logical CPU `index`. Without a host GIC (the VM
/// was created with a warning that its guest gets no interrupts) there is
/// nothing to send.
#[inline]
pub fn kick(index: usize) {
    match driver() {
        Some(Driver::V3(g)) => g.kick(percpu::slot(index).mpidr.load(Ordering::Relaxed)),
        Some(Driver::V2(g)) => g.kick(CPU_MASKS[index].load(Ordering::Acquire)),
        None => {}
    }
}

/// The distributor of whichever GIC is driven.
fn distributor() -> Option<&'static MmioFrame> {
    match driver()? {
        Driver::V3(g) => Some(&g.distributor),
        Driver::V2(g) => Some(&g.distributor),
    }
}

/// The distributor and where an SPI to logical CPU `cpu` goes: its
/// affinity on a GICv3, its interface mask on a GICv2.
fn spi_target(cpu: usize) -> Option<(&'static MmioFrame, SpiTarget)> {
    match driver()? {
        Driver::V3(g) => {
            let mpidr = percpu::slot(cpu).mpidr.load(Ordering::Relaxed);
            Some((&g.distributor, SpiTarget::Affinity(mpidr)))
        }
        Driver::V2(g) => {
            let mask = CPU_MASKS[cpu].load(Ordering::Acquire);
            Some((&g.distributor, SpiTarget::Interfaces(mask)))
        }
    }
}

/// Routes SPI `intid` to logical CPU `cpu`: `GICD_IROUTER` with the CPU's
/// affinity on a GICv3, its interface bit in `GICD_ITARGETSR` on a GICv2.
pub fn route_spi(intid: u32, cpu: usize) {
    if let Some((distributor, target)) = spi_target(cpu) {
        host_driver::route_spi(distributor, intid, target);
    }
}

/// Takes SPI `intid` (a passed-through device's) at EL2, routed to logical
/// CPU `cpu` (`crate::drivers::gic::driver::setup_spi`).
pub fn setup_spi(intid: u32, edge: bool, cpu: usize) {
    if let Some((distributor, target)) = spi_target(cpu) {
        host_driver::setup_spi(distributor, intid, edge, target);
    }
}

/// Deactivates SPI `intid` at the distributor (`GICD_ICACTIVER`: defined
/// from any CPU, and a no-op when it is not active): one left active for a
/// guest that will not deactivate it.
pub fn clear_spi_active(intid: u32) {
    if let Some(distributor) = distributor() {
        host_driver::clear_spi_active(distributor, intid);
    }
}

/// Disables SPI `intid` and clears its active state: its VM ended.
pub fn release_spi(intid: u32) {
    if let Some(distributor) = distributor() {
        host_driver::release_spi(distributor, intid);
    }
}
