//! The host's GIC driver: a GICv3 ([`GicV3`]) or a GICv2 with the
//! virtualization extensions ([`GicV2`]), whichever the device tree has.
//!
//! A driver never touches memory or system registers itself: it reaches the
//! MMIO frames (distributor, redistributors, the GICv2 `GICC` and `GICH`)
//! through a [`GicFrame`], a register bank addressed by byte offset, and the
//! CPU interface's system registers (`ICC_*`, `ICH_*`, and the timers'
//! control registers it turns off) through [`CpuRegisters`]. On the machine
//! those are volatile accesses and `MRS`/`MSR` (`arch::drivers::gic`, which
//! also holds the set-up drivers in statics and the per-CPU frames); on the
//! host, tests give the drivers a mock that records every access in order
//! (`mock`), so each sequence below is checked register by register. Both
//! are static dispatch: the calls the run loop makes on every exit
//! ([`HostGic::acknowledge`], [`HostGic::drop_priority`],
//! [`HostGic::end_of_interrupt`], the kick, the timer's deactivation) inline
//! to the same single access they always were.
//!
//! # GICv3
//!
//! [`GicV3::init_distributor`] (boot CPU, once): affinity routing on, group 1
//! (non-secure) enabled, and the console UART's SPI made group 1, level,
//! routed to the boot CPU and enabled. [`GicV3::init_cpu`] (every CPU): finds
//! the CPU's redistributor by `GICR_TYPER` affinity in the device tree's
//! regions ([`GicV3::redistributor_of`]), wakes it (`GICR_WAKER`), makes its
//! SGIs and PPIs group 1 and enables the kick SGI, the maintenance PPI and
//! the PPIs of the guest's two EL1 timers, virtual and physical (as the
//! device tree names them; all three timers are turned off first, and the
//! EL2 physical timer's PPI stays disabled except on the boot CPU, where the
//! console's poll timer enables it with [`GicV3::set_ppi_enabled`]); then
//! the CPU interface: `ICC_SRE_EL2` (SRE, Enable for EL1), `ICC_PMR_EL1`
//! open, `ICC_CTLR_EL1.EOImode` 1 and `ICC_IGRPEN1_EL1`. EL2 runs with
//! `PSTATE.I` masked; the interrupts arrive as IRQ exits from the guest
//! (`HCR_EL2.IMO`), where the run loop acknowledges them.
//!
//! With `EOImode` 1 the end of an interrupt has two steps: the priority drop
//! (`ICC_EOIR1_EL1`, [`HostGic::drop_priority`]), after which this CPU takes
//! other interrupts again, and the deactivation (`ICC_DIR_EL1`), after which
//! the interrupt itself can fire again. [`HostGic::end_of_interrupt`] does
//! both, for every interrupt the hypervisor handles itself. A guest timer's
//! PPI only has its priority dropped: it stays active, so its level cannot
//! fire again, until the guest deactivates it through the hardware list
//! register that carries INTID 27 or 30 (`ICH_LR<n>_EL2.HW`), or the
//! hypervisor clears its active state (`clear_ppi_active`) when the guest
//! will not (see `crate::devices::timer`). So the guest's `CNTV_CTL_EL0` and
//! `CNTP_CTL_EL0` stay exactly as it wrote them, and a timer interrupt costs
//! one exit. A timer's PPI is masked (`set_ppi_enabled`) only while no vCPU
//! is loaded on the CPU.
//!
//! # GICv2
//!
//! [`GicV2::init_distributor`] (boot CPU, once): the distributor is turned
//! off, the console UART's SPI made level, group 0, targeted at this CPU's
//! interface and enabled, and the distributor turned on (both groups: with
//! one security state, group 0 is signalled as IRQ, since `GICC_CTLR.FIQEn`
//! stays clear). [`GicV2::init_cpu`] then, on every CPU: the three timers
//! off, this CPU's banked SGIs and PPIs disabled but the kick SGI, the
//! maintenance PPI and both EL1 timers' PPIs, its CPU interface mask read
//! from `ITARGETSR0` (for kicks through `GICD_SGIR`), `GICC_PMR` open,
//! `GICC_BPR` 0 and `GICC_CTLR` enabled with `EOImode` 1; `GICH_HCR` 0 until
//! the first fill. Interrupts are acknowledged by `GICC_IAR` and finished by
//! writing the same value to `GICC_EOIR` (the priority drop; an SGI's source
//! CPU bits included) and `GICC_DIR` (the deactivation), as on a GICv3. The
//! virtual CPU interface (`GICV`) is the guest's: the VM maps it at stage 2.
//!
//! # SPIs of passed-through devices
//!
//! [`setup_spi`] takes an SPI at EL2 (disabled, grouped, prioritised,
//! configured, routed, inactive, enabled), [`route_spi`] moves it to another
//! CPU (`GICD_IROUTER` affinity on a GICv3, an `ITARGETSR` byte on a GICv2),
//! [`clear_spi_active`] and [`release_spi`] end it.
//!
//! # A GICv2's list registers
//!
//! [`GichListRegisters`] are this CPU's bank of the `GICH` frame as the
//! vgic model's list registers: `GICH_LR<n>` converted to and from the
//! model's (`ICH_LR<n>_EL2`) format, `GICH_HCR`, `GICH_MISR` and the two
//! `GICH_ELRSR` words as one.
//!
//! # Waits
//!
//! The waits on `GICD_CTLR.RWP` and `GICR_WAKER.ChildrenAsleep` are bounded
//! ([`WAIT_LIMIT`] reads): a GIC that never finishes must not hang the
//! hypervisor, so the sequence goes on (with a warning) after the limit.

use super::gicv2::{self as v2regs, gicc, gich};
use super::{
    DEFAULT_MAINTENANCE_INTID, HOST_PRIORITY, KICK_SGI, SPURIOUS_FIRST, gicd, gicr, sgi1r_value,
};
use crate::devices::vgic::cpu_interface;
use crate::devices::vgic::list_regs::MAX_LIST_REGISTERS;
use crate::devices::vgic::{ListRegister, ListRegisters, LrEncoding};
use alloc::vec::Vec;

/// Status reads a wait makes before it goes on anyway.
pub const WAIT_LIMIT: usize = 1_000_000;

/// `ICC_CTLR_EL1.EOImode`: `ICC_EOIR1_EL1` drops the priority,
/// `ICC_DIR_EL1` deactivates.
pub const ICC_CTLR_EOIMODE: u64 = 1 << 1;

/// Access to one of the GIC's MMIO frames, by byte offset.
pub trait GicFrame: Sized {
    /// Reads the 32-bit register at `offset`.
    fn read32(&self, offset: usize) -> u32;
    /// Writes the 32-bit register at `offset`.
    fn write32(&self, offset: usize, value: u32);
    /// Reads the 64-bit register at `offset`.
    fn read64(&self, offset: usize) -> u64;
    /// Writes the 64-bit register at `offset`.
    fn write64(&self, offset: usize, value: u64);
    /// Writes the byte at `offset` (priority and target bytes).
    fn write8(&self, offset: usize, value: u8);
    /// The frame that starts `offset` bytes into this one.
    fn at(&self, offset: usize) -> Self;
}

/// The CPU's system registers the driver reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuRegister {
    /// `ICC_SRE_EL2`.
    IccSreEl2,
    /// `ICC_PMR_EL1`.
    IccPmrEl1,
    /// `ICC_BPR1_EL1`.
    IccBpr1El1,
    /// `ICC_CTLR_EL1`.
    IccCtlrEl1,
    /// `ICC_IGRPEN1_EL1`.
    IccIgrpen1El1,
    /// `ICC_IAR1_EL1`.
    IccIar1El1,
    /// `ICC_EOIR1_EL1`.
    IccEoir1El1,
    /// `ICC_DIR_EL1`.
    IccDirEl1,
    /// `ICC_SGI1R_EL1`.
    IccSgi1rEl1,
    /// `ICH_VMCR_EL2`.
    IchVmcrEl2,
    /// `ICH_AP0R<n>_EL2` (n < 4).
    IchAp0rEl2(u8),
    /// `ICH_AP1R<n>_EL2` (n < 4).
    IchAp1rEl2(u8),
    /// `CNTV_CTL_EL0`.
    CntvCtlEl0,
    /// `CNTP_CTL_EL0`.
    CntpCtlEl0,
    /// `CNTHP_CTL_EL2`.
    CnthpCtlEl2,
}

/// Access to the running CPU's system registers and barriers.
pub trait CpuRegisters {
    /// Reads `register`.
    fn read(&self, register: CpuRegister) -> u64;
    /// Writes `value` to `register`.
    fn write(&self, register: CpuRegister, value: u64);
    /// `ISB`.
    fn isb(&self);
    /// `DSB ISH`: orders the caller's memory writes before an SGI.
    fn dsb_ish(&self);
}

/// Why the GIC could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicError {
    /// `init_cpu` before `init_distributor`.
    NotInitialised,
    /// No redistributor has this CPU's affinity.
    NoRedistributor(u64),
}

impl core::fmt::Display for GicError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotInitialised => f.write_str("CPU interface set up before the distributor"),
            Self::NoRedistributor(mpidr) => {
                write!(f, "no redistributor has the affinity of MPIDR {mpidr:#x}")
            }
        }
    }
}

impl core::error::Error for GicError {}

/// An acknowledged host interrupt: its INTID and the value the
/// acknowledge register returned (what the EOI must write back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    /// The interrupt (1020..=1023: none).
    pub intid: u32,
    raw: u32,
}

impl Acknowledged {
    /// Nothing pending (INTID 1023), as when no GIC is driven.
    pub const NONE: Self = Self {
        intid: SPURIOUS_FIRST + 3,
        raw: 1023,
    };

    /// An acknowledge that returned `intid` (a GICv3's `ICC_IAR1_EL1`), for
    /// the host tests' fake machines.
    #[cfg(test)]
    pub const fn for_tests(intid: u32) -> Self {
        Self { intid, raw: intid }
    }
}

/// What the run loop needs from the host GIC, whichever version it is.
pub trait HostGic {
    /// Acknowledges the highest-priority pending interrupt of this CPU.
    fn acknowledge(&self) -> Acknowledged;
    /// Drops the priority of an acknowledged interrupt (`EOImode` 1: it
    /// stays active until [`deactivate`](Self::deactivate)).
    fn drop_priority(&self, ack: Acknowledged);
    /// Deactivates an interrupt whose priority was dropped.
    fn deactivate(&self, ack: Acknowledged);
    /// Finishes an acknowledged interrupt: priority drop and deactivation.
    #[inline]
    fn end_of_interrupt(&self, ack: Acknowledged) {
        self.drop_priority(ack);
        self.deactivate(ack);
    }
}

/// Acknowledges and finishes every interrupt pending for this CPU, handling
/// none (for a CPU that waits at EL2 and only needs to be woken).
pub fn discard_pending(gic: &impl HostGic) {
    loop {
        let ack = gic.acknowledge();
        if ack.intid >= SPURIOUS_FIRST {
            return;
        }
        gic.end_of_interrupt(ack);
    }
}

/// Reads until `done` holds, at most [`WAIT_LIMIT`] times; `false` when it
/// never did.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..WAIT_LIMIT {
        if done() {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Waits for the distributor to apply its last write (`GICD_CTLR.RWP`).
pub fn wait_distributor(distributor: &impl GicFrame) {
    if !wait_until(|| distributor.read32(gicd::CTLR) & gicd::CTLR_RWP == 0) {
        log::warn!("GIC distributor: GICD_CTLR.RWP still set after {WAIT_LIMIT} reads");
    }
}

/// Whatever ran here before (firmware, a boot loader) may have left a timer
/// on: the guest's two timers belong to no guest until a vCPU is loaded, and
/// the EL2 physical timer to nobody, so all three go off before their PPIs
/// (the EL1 ones) are enabled, and no level is left asserting while this CPU
/// waits at EL2.
fn timers_off(cpu: &impl CpuRegisters) {
    cpu.write(CpuRegister::CntvCtlEl0, 0);
    cpu.write(CpuRegister::CntpCtlEl0, 0);
    cpu.write(CpuRegister::CnthpCtlEl2, 0);
    cpu.isb();
}

/// Whether `intid` is an SPI.
fn is_spi(intid: u32) -> bool {
    (32..1020).contains(&intid)
}

/// The `GICD_IROUTER` value routing to the CPU with affinity `mpidr`.
fn irouter_value(mpidr: u64) -> u64 {
    ((mpidr >> 32) & 0xff) << 32 | (mpidr & 0xff_ffff)
}

/// Makes the bits `0b11 << shift` of `GICD_ICFGR<n>` for `intid` zero
/// (level) or `0b10` (edge).
fn configure_trigger(distributor: &impl GicFrame, intid: u32, edge: bool) {
    let cfg = gicd::ICFGR + (intid / 16) as usize * 4;
    let shift = (intid % 16) * 2;
    let edge_bit = u32::from(edge) << 1 << shift;
    distributor.write32(cfg, (distributor.read32(cfg) & !(0b11 << shift)) | edge_bit);
}

/// The GICv3 driver: the distributor, the redistributor regions and the
/// system-register CPU interface.
pub struct GicV3<F, C> {
    /// The distributor frame.
    pub distributor: F,
    /// Each redistributor region and its size.
    pub regions: Vec<(F, u64)>,
    /// The CPU's system registers.
    pub cpu: C,
    /// The maintenance interrupt's PPI.
    pub maintenance: u32,
    /// The timers' host PPIs, in `TimerId::index` order.
    pub timers: [u32; 2],
    /// Guests' binary points are guarded (QEMU's CPU interface:
    /// `crate::devices::vgic::cpu_interface`).
    pub guard_binary_point: bool,
}

impl<F: GicFrame, C: CpuRegisters> GicV3<F, C> {
    /// Boot CPU, once: sets up the distributor and routes `uart_intid` (an
    /// SPI) to the CPU with affinity `boot_mpidr`.
    pub fn init_distributor(distributor: &F, uart_intid: Option<u32>, boot_mpidr: u64) {
        // Groups off, then affinity routing on, then group 1 on.
        distributor.write32(gicd::CTLR, 0);
        wait_distributor(distributor);
        distributor.write32(gicd::CTLR, gicd::CTLR_ARE_NS);
        wait_distributor(distributor);
        distributor.write32(gicd::CTLR, gicd::CTLR_ARE_NS | gicd::CTLR_ENABLE_GRP1_NS);
        wait_distributor(distributor);
        if let Some(intid) = uart_intid.filter(|&i| is_spi(i)) {
            let word = (intid / 32) as usize * 4;
            let bit = 1 << (intid % 32);
            distributor.write32(gicd::ICENABLER + word, bit);
            wait_distributor(distributor);
            let group = distributor.read32(gicd::IGROUPR + word);
            distributor.write32(gicd::IGROUPR + word, group | bit);
            distributor.write8(gicd::IPRIORITYR + intid as usize, HOST_PRIORITY);
            configure_trigger(distributor, intid, false);
            distributor.write64(
                gicd::IROUTER + intid as usize * 8,
                irouter_value(boot_mpidr),
            );
            distributor.write32(gicd::ISENABLER + word, bit);
        }
    }

    /// The driver over a distributor set up by
    /// [`init_distributor`](Self::init_distributor); `maintenance` is the
    /// device tree's maintenance interrupt (the architecture's default when
    /// it names none).
    pub fn new(
        distributor: F,
        regions: Vec<(F, u64)>,
        cpu: C,
        maintenance: Option<u32>,
        timers: [u32; 2],
        guard_binary_point: bool,
    ) -> Self {
        let maintenance = maintenance.unwrap_or_else(|| {
            log::warn!(
                "the device tree's GICv3 names no maintenance interrupt: using INTID {DEFAULT_MAINTENANCE_INTID}"
            );
            DEFAULT_MAINTENANCE_INTID
        });
        Self {
            distributor,
            regions,
            cpu,
            maintenance,
            timers,
            guard_binary_point,
        }
    }

    /// The `RD_base` frame whose `GICR_TYPER` affinity is `mpidr`'s.
    pub fn redistributor_of(&self, mpidr: u64) -> Option<F> {
        self.regions.iter().find_map(|(region, size)| {
            super::find_redistributor(mpidr, *size, |offset| {
                region.read64(offset as usize + gicr::TYPER)
            })
            .map(|offset| region.at(offset as usize))
        })
    }

    /// Every CPU, on the CPU with affinity `mpidr`: wakes its
    /// redistributor and enables its CPU interface. Returns its
    /// redistributor's `RD_base` and `SGI_base` frames.
    pub fn init_cpu(&self, mpidr: u64) -> Result<(F, F), GicError> {
        let rd = self
            .redistributor_of(mpidr)
            .ok_or(GicError::NoRedistributor(mpidr))?;
        let waker = rd.read32(gicr::WAKER);
        rd.write32(gicr::WAKER, waker & !gicr::WAKER_PROCESSOR_SLEEP);
        if !wait_until(|| rd.read32(gicr::WAKER) & gicr::WAKER_CHILDREN_ASLEEP == 0) {
            log::warn!("GIC redistributor of MPIDR {mpidr:#x}: still asleep");
        }
        timers_off(&self.cpu);
        let sgi = rd.at(gicr::SGI_BASE);
        sgi.write32(gicr::ICENABLER0, u32::MAX);
        sgi.write32(gicr::IGROUPR0, u32::MAX);
        let [vtimer, ptimer] = self.timers;
        for intid in [KICK_SGI, self.maintenance, vtimer, ptimer] {
            sgi.write8(gicr::IPRIORITYR + intid as usize, HOST_PRIORITY);
        }
        sgi.write32(
            gicr::ISENABLER0,
            1 << KICK_SGI | 1 << self.maintenance | 1 << vtimer | 1 << ptimer,
        );
        let cpu = &self.cpu;
        cpu.write(
            CpuRegister::IccSreEl2,
            crate::sysreg_values::ICC_SRE_EL2_VALUE,
        );
        cpu.isb();
        cpu.write(CpuRegister::IccPmrEl1, 0xff);
        cpu.write(CpuRegister::IccBpr1El1, 0);
        cpu.write(CpuRegister::IccCtlrEl1, ICC_CTLR_EOIMODE);
        cpu.write(CpuRegister::IccIgrpen1El1, 1);
        cpu.isb();
        Ok((rd, sgi))
    }

    /// Clears the active state of this CPU's PPI `intid` in its `SGI_base`
    /// frame `sgi` (a no-op when it is not active).
    #[inline]
    pub fn clear_ppi_active(sgi: &F, intid: u32) {
        if intid < 32 {
            sgi.write32(gicr::ICACTIVER0, 1 << intid);
        }
    }

    /// Enables (at the hypervisor's priority) or disables this CPU's PPI
    /// `intid` in its `SGI_base` frame `sgi`.
    #[inline]
    pub fn set_ppi_enabled(sgi: &F, intid: u32, enabled: bool) {
        let bit = 1 << intid;
        if enabled {
            sgi.write8(gicr::IPRIORITYR + intid as usize, HOST_PRIORITY);
            sgi.write32(gicr::ISENABLER0, bit);
        } else {
            sgi.write32(gicr::ICENABLER0, bit);
        }
    }

    /// Sends the kick SGI to the CPU with affinity `mpidr`.
    #[inline]
    pub fn kick(&self, mpidr: u64) {
        self.cpu.dsb_ish();
        self.cpu
            .write(CpuRegister::IccSgi1rEl1, sgi1r_value(mpidr, KICK_SGI));
        self.cpu.isb();
    }

    /// Stops this CPU's interface from signalling interrupts.
    pub fn quiesce(&self) {
        self.cpu.write(CpuRegister::IccIgrpen1El1, 0);
        self.cpu.isb();
    }
}

/// A GICv3's virtual CPU interface's guest-owned state as after a reset
/// (`ICH_VMCR_EL2`, the active priorities), for a vCPU that (re)starts on
/// this CPU. `preemption_bits` is the number of preemption bits the
/// interface has; with `guard_binary_point` (QEMU's CPU interface) `VCBPR`
/// stays set (`crate::devices::vgic::cpu_interface`).
pub fn reset_virtual_interface_v3(
    cpu: &impl CpuRegisters,
    guard_binary_point: bool,
    preemption_bits: u64,
) {
    let vmcr = if guard_binary_point {
        cpu_interface::VMCR_VCBPR
    } else {
        0
    };
    cpu.write(CpuRegister::IchVmcrEl2, vmcr);
    cpu.write(CpuRegister::IchAp0rEl2(0), 0);
    cpu.write(CpuRegister::IchAp1rEl2(0), 0);
    if preemption_bits >= 6 {
        cpu.write(CpuRegister::IchAp0rEl2(1), 0);
        cpu.write(CpuRegister::IchAp1rEl2(1), 0);
    }
    if preemption_bits == 7 {
        cpu.write(CpuRegister::IchAp0rEl2(2), 0);
        cpu.write(CpuRegister::IchAp1rEl2(2), 0);
        cpu.write(CpuRegister::IchAp0rEl2(3), 0);
        cpu.write(CpuRegister::IchAp1rEl2(3), 0);
    }
}

impl<F: GicFrame, C: CpuRegisters> HostGic for GicV3<F, C> {
    #[inline]
    fn acknowledge(&self) -> Acknowledged {
        let intid = (self.cpu.read(CpuRegister::IccIar1El1) & 0xff_ffff) as u32;
        Acknowledged { intid, raw: intid }
    }

    #[inline]
    fn drop_priority(&self, ack: Acknowledged) {
        self.cpu.write(CpuRegister::IccEoir1El1, u64::from(ack.raw));
    }

    #[inline]
    fn deactivate(&self, ack: Acknowledged) {
        self.cpu.write(CpuRegister::IccDirEl1, u64::from(ack.raw));
    }
}

/// The GICv2 driver: the distributor, the CPU interface (`GICC`) and the
/// virtual interface control (`GICH`) frames.
pub struct GicV2<F, C> {
    /// The distributor frame.
    pub distributor: F,
    /// The CPU interface frame (`GICC`).
    pub cpu_interface: F,
    /// The virtual interface control frame (`GICH`).
    pub hyp_interface: F,
    /// The CPU's system registers (the timers).
    pub cpu: C,
    /// The maintenance interrupt's PPI.
    pub maintenance: u32,
    /// The timers' host PPIs, in `TimerId::index` order.
    pub timers: [u32; 2],
}

impl<F: GicFrame, C: CpuRegisters> GicV2<F, C> {
    /// Boot CPU, once: the console UART's SPI `uart_intid` taken at this
    /// CPU's interface and the distributor turned on.
    pub fn init_distributor(distributor: &F, uart_intid: Option<u32>) {
        distributor.write32(gicd::CTLR, 0);
        if let Some(intid) = uart_intid.filter(|&i| is_spi(i)) {
            let word = (intid / 32) as usize * 4;
            let bit = 1 << (intid % 32);
            distributor.write32(gicd::ICENABLER + word, bit);
            let group = distributor.read32(gicd::IGROUPR + word);
            distributor.write32(gicd::IGROUPR + word, group & !bit);
            configure_trigger(distributor, intid, false);
            let own = Self::own_cpu_mask(distributor);
            distributor.write8(gicd::IPRIORITYR + intid as usize, HOST_PRIORITY);
            distributor.write8(v2regs::gicd::ITARGETSR + intid as usize, own);
            distributor.write32(gicd::ISENABLER + word, bit);
        }
        distributor.write32(
            gicd::CTLR,
            v2regs::gicd::CTLR_ENABLE_GRP0 | v2regs::gicd::CTLR_ENABLE_GRP1,
        );
    }

    /// This CPU's GICv2 interface mask: `ITARGETSR0`'s first byte is banked
    /// and names the reading CPU (a uniprocessor GIC may read zero:
    /// interface 0).
    pub fn own_cpu_mask(distributor: &F) -> u8 {
        let own = distributor.read32(v2regs::gicd::ITARGETSR) as u8;
        if own == 0 { 1 } else { own }
    }

    /// Every CPU: brings up this CPU's banked distributor registers and its
    /// CPU interface. Returns the CPU's interface mask (its bit in
    /// `ITARGETSR` and `GICD_SGIR`).
    pub fn init_cpu(&self) -> u8 {
        timers_off(&self.cpu);
        let distributor = &self.distributor;
        distributor.write32(gicd::ICENABLER, u32::MAX);
        distributor.write32(gicd::IGROUPR, 0);
        let [vtimer, ptimer] = self.timers;
        for intid in [KICK_SGI, self.maintenance, vtimer, ptimer] {
            distributor.write8(gicd::IPRIORITYR + intid as usize, HOST_PRIORITY);
        }
        distributor.write32(
            gicd::ISENABLER,
            1 << KICK_SGI | 1 << self.maintenance | 1 << vtimer | 1 << ptimer,
        );
        let mask = Self::own_cpu_mask(distributor);
        let cpu = &self.cpu_interface;
        cpu.write32(gicc::PMR, 0xff);
        cpu.write32(gicc::BPR, 0);
        cpu.write32(gicc::CTLR, gicc::CTLR_ENABLE_GRP0 | gicc::CTLR_EOIMODE);
        self.hyp_interface.write32(gich::HCR, 0);
        mask
    }

    /// Clears the active state of this CPU's PPI `intid` (`ICACTIVER0` is
    /// banked: this CPU's own PPIs).
    #[inline]
    pub fn clear_ppi_active(&self, intid: u32) {
        if intid < 32 {
            self.distributor.write32(gicd::ICACTIVER, 1 << intid);
        }
    }

    /// Enables (at the hypervisor's priority) or disables this CPU's PPI
    /// `intid` (`ISENABLER0`/`ICENABLER0` and the PPIs' priority bytes are
    /// banked).
    #[inline]
    pub fn set_ppi_enabled(&self, intid: u32, enabled: bool) {
        if enabled {
            self.distributor
                .write8(gicd::IPRIORITYR + intid as usize, HOST_PRIORITY);
        }
        let register = if enabled {
            gicd::ISENABLER
        } else {
            gicd::ICENABLER
        };
        self.distributor.write32(register, 1 << intid);
    }

    /// Sends the kick SGI to the CPU interfaces in `targets` (none: nothing
    /// sent).
    #[inline]
    pub fn kick(&self, targets: u8) {
        if targets == 0 {
            return;
        }
        self.cpu.dsb_ish();
        self.distributor
            .write32(v2regs::gicd::SGIR, v2regs::sgir_value(targets, KICK_SGI));
    }

    /// Stops this CPU's interface from signalling interrupts.
    pub fn quiesce(&self) {
        self.cpu_interface.write32(gicc::CTLR, 0);
    }

    /// This CPU's list registers: its bank of the `GICH` frame, as many
    /// as `GICH_VTR` says (at most the model's [`MAX_LIST_REGISTERS`]).
    pub fn list_registers(&self) -> GichListRegisters<F> {
        let count = v2regs::list_register_count(self.hyp_interface.read32(gich::VTR));
        GichListRegisters {
            frame: self.hyp_interface.at(0),
            count: count.min(MAX_LIST_REGISTERS),
        }
    }

    /// The virtual CPU interface's guest-owned state as after a reset.
    pub fn reset_virtual_interface(&self) {
        self.hyp_interface.write32(gich::VMCR, 0);
        self.hyp_interface.write32(gich::APR, 0);
    }
}

impl<F: GicFrame, C: CpuRegisters> HostGic for GicV2<F, C> {
    #[inline]
    fn acknowledge(&self) -> Acknowledged {
        let raw = self.cpu_interface.read32(gicc::IAR);
        Acknowledged {
            intid: v2regs::iar_intid(raw),
            raw,
        }
    }

    #[inline]
    fn drop_priority(&self, ack: Acknowledged) {
        self.cpu_interface.write32(gicc::EOIR, ack.raw);
    }

    #[inline]
    fn deactivate(&self, ack: Acknowledged) {
        self.cpu_interface.write32(gicc::DIR, ack.raw);
    }
}

/// The list registers of a GICv2 host: this CPU's bank of the `GICH`
/// frame, each `GICH_LR<n>` converted to and from the model's format.
#[derive(Debug)]
pub struct GichListRegisters<F> {
    frame: F,
    count: usize,
}

impl<F: GicFrame> ListRegisters for GichListRegisters<F> {
    #[inline]
    fn count(&self) -> usize {
        self.count
    }

    #[inline]
    fn read_lr(&self, index: usize) -> u64 {
        let raw = self.frame.read32(gich::LR0 + 4 * index);
        LrEncoding::V2.decode(u64::from(raw)).0
    }

    #[inline]
    fn write_lr(&mut self, index: usize, value: u64) {
        let raw = LrEncoding::V2.encode(ListRegister(value)) as u32;
        self.frame.write32(gich::LR0 + 4 * index, raw);
    }

    #[inline]
    fn read_hcr(&self) -> u64 {
        u64::from(self.frame.read32(gich::HCR))
    }

    #[inline]
    fn write_hcr(&mut self, value: u64) {
        self.frame.write32(gich::HCR, value as u32);
    }

    #[inline]
    fn read_misr(&self) -> u64 {
        u64::from(self.frame.read32(gich::MISR))
    }

    #[inline]
    fn read_elrsr(&self) -> u64 {
        u64::from(self.frame.read32(gich::ELRSR0))
            | u64::from(self.frame.read32(gich::ELRSR1)) << 32
    }
}

/// Where an SPI goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpiTarget {
    /// A GICv3's CPU with this MPIDR affinity (`GICD_IROUTER`).
    Affinity(u64),
    /// A GICv2's CPU interfaces with this mask (`GICD_ITARGETSR`).
    Interfaces(u8),
}

/// Routes SPI `intid` to `target` (nothing for an INTID that is no SPI).
pub fn route_spi(distributor: &impl GicFrame, intid: u32, target: SpiTarget) {
    if !is_spi(intid) {
        return;
    }
    match target {
        SpiTarget::Interfaces(mask) => {
            distributor.write8(v2regs::gicd::ITARGETSR + intid as usize, mask);
        }
        SpiTarget::Affinity(mpidr) => {
            distributor.write64(gicd::IROUTER + intid as usize * 8, irouter_value(mpidr));
        }
    }
}

/// Takes SPI `intid` (a passed-through device's) at EL2: disabled, made
/// group 1 (GICv3) or group 0 (GICv2, signalled as IRQ), the hypervisor's
/// priority, edge (`edge`) or level, routed to `target`, inactive, enabled.
/// The GIC's version is the target's kind.
pub fn setup_spi(distributor: &impl GicFrame, intid: u32, edge: bool, target: SpiTarget) {
    if !is_spi(intid) {
        return;
    }
    let v2 = matches!(target, SpiTarget::Interfaces(_));
    let word = (intid / 32) as usize * 4;
    let bit = 1 << (intid % 32);
    distributor.write32(gicd::ICENABLER + word, bit);
    if !v2 {
        wait_distributor(distributor);
    }
    let group = distributor.read32(gicd::IGROUPR + word);
    let group = if v2 { group & !bit } else { group | bit };
    distributor.write32(gicd::IGROUPR + word, group);
    distributor.write8(gicd::IPRIORITYR + intid as usize, HOST_PRIORITY);
    configure_trigger(distributor, intid, edge);
    route_spi(distributor, intid, target);
    distributor.write32(gicd::ICACTIVER + word, bit);
    distributor.write32(gicd::ISENABLER + word, bit);
}

/// Deactivates SPI `intid` at the distributor (`GICD_ICACTIVER`: defined
/// from any CPU, and a no-op when it is not active): one left active for a
/// guest that will not deactivate it.
pub fn clear_spi_active(distributor: &impl GicFrame, intid: u32) {
    if is_spi(intid) {
        distributor.write32(
            gicd::ICACTIVER + (intid / 32) as usize * 4,
            1 << (intid % 32),
        );
    }
}

/// Disables SPI `intid` and clears its active state: its VM ended.
pub fn release_spi(distributor: &impl GicFrame, intid: u32) {
    if is_spi(intid) {
        distributor.write32(
            gicd::ICENABLER + (intid / 32) as usize * 4,
            1 << (intid % 32),
        );
        clear_spi_active(distributor, intid);
    }
}
