//! The host's GIC, driven at EL2: a GICv3 or a GICv2 with the
//! virtualization extensions, whichever the device tree has.
//!
//! The run loop sees one interface whichever GIC it is: [`HostGicOps`]
//! (acknowledge, EOI, enable or mask a PPI of this CPU, kick another CPU,
//! stop signalling this CPU, reset the virtual interface) with a GICv3 and a
//! GICv2 implementation, and [`HostListRegisters`], the list registers
//! of this CPU (`ICH_*_EL2` system registers, or the `GICH` frame converted
//! to the model's format). The free functions below dispatch to the driver
//! that was set up. What follows describes the GICv3 driver; the GICv2 one is
//! described at [`init_gicv2`].
//!
//! [`init_distributor`] (boot CPU, once): affinity routing on, group 1
//! (non-secure) enabled, and the console UART's SPI made group 1, level,
//! routed to the boot CPU and enabled. [`init_cpu`] (every CPU): finds the
//! CPU's redistributor by `GICR_TYPER` affinity in the device tree's regions,
//! wakes it (`GICR_WAKER`), makes its SGIs and PPIs group 1 and enables the
//! kick SGI, the maintenance PPI and the PPIs of the guest's two EL1 timers,
//! virtual and physical (as the device tree names them; all three timers
//! are turned off first, and the EL2 physical timer's PPI stays disabled
//! except on the boot CPU, where the console's poll timer enables it with
//! [`set_ppi_enabled`]); then the CPU
//! interface: `ICC_SRE_EL2` (SRE, Enable for EL1), `ICC_PMR_EL1` open,
//! `ICC_CTLR_EL1.EOImode` 1 and `ICC_IGRPEN1_EL1`. EL2 runs with `PSTATE.I`
//! masked; the interrupts arrive as IRQ exits from the guest
//! (`HCR_EL2.IMO`), where the run loop acknowledges them with
//! [`acknowledge`].
//!
//! With `EOImode` 1 the end of an interrupt has two steps: the priority drop
//! (`ICC_EOIR1_EL1`, [`drop_priority`]), after which this CPU takes other
//! interrupts again, and the deactivation (`ICC_DIR_EL1`), after which the
//! interrupt itself can fire again. [`end_of_interrupt`] does both, for every
//! interrupt the hypervisor handles itself. A guest timer's PPI only has its
//! priority dropped: it stays active, so its level cannot fire again, until
//! the guest deactivates it through the hardware list register that carries
//! INTID 27 or 30 (`ICH_LR<n>_EL2.HW`), or the hypervisor does
//! ([`deactivate_timer`]) when the guest will not (see
//! `crate::devices::timer`). So the guest's `CNTV_CTL_EL0` and
//! `CNTP_CTL_EL0` stay exactly as it wrote them, and a timer interrupt costs
//! one exit. A timer's PPI is masked ([`set_timer_masked`]) only while no
//! vCPU is loaded on the CPU.

use crate::arch::cpu::percpu::{self, MAX_CPUS};
use crate::arch::drivers::list_registers::HardwareListRegisters;
use crate::devices::vgic::cpu_interface;
use crate::devices::vgic::list_regs::MAX_LIST_REGISTERS;
use crate::devices::vgic::{ListRegister, ListRegisters, LrEncoding};
use crate::drivers::gic::gicv2::{self as v2regs, gicc, gich};
use crate::drivers::gic::{
    self as host_gic, DEFAULT_MAINTENANCE_INTID, HOST_PRIORITY, KICK_SGI, gicd, gicr, sgi1r_value,
};
use crate::platform::{Gicv2, Gicv3};
use crate::vocabulary::timers::TimerId;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use spin::Once;

/// `ICC_CTLR_EL1.EOImode`: `ICC_EOIR1_EL1` drops the priority,
/// `ICC_DIR_EL1` deactivates.
const ICC_CTLR_EOIMODE: u64 = 1 << 1;

/// What the driver learned at boot.
struct HostGic {
    distributor: usize,
    maintenance: u32,
    regions: alloc::vec::Vec<crate::platform::ranges::PhysRange>,
    /// The timers' host PPIs, in [`TimerId::index`] order.
    timers: [u32; 2],
    /// Guests' binary points are guarded (QEMU's CPU interface:
    /// `crate::devices::vgic::cpu_interface`).
    guard_binary_point: bool,
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
        distributor,
        maintenance,
        regions: gic.redistributors.clone(),
        timers,
        guard_binary_point: gic.emulated_by_qemu,
    });
}

/// Every CPU (after [`init_distributor`] or [`init_gicv2`]): brings up this
/// CPU's part of the GIC. `index` is the CPU's logical number.
pub fn init_cpu(index: usize) -> Result<(), GicError> {
    if GICV2.get().is_some() {
        return init_cpu_v2(index);
    }
    init_cpu_v3(index)
}

/// GICv3: wakes this CPU's redistributor and enables its CPU interface.
fn init_cpu_v3(index: usize) -> Result<(), GicError> {
    let gic = GIC.get().ok_or(GicError::NotInitialised)?;
    let mpidr = crate::arch::cpu::sysreg::current_mpidr();
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
    timers_off();
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
        crate::write_sysreg!(icc_sre_el2, crate::sysreg_values::ICC_SRE_EL2_VALUE);
        core::arch::asm!("isb", options(nostack, preserves_flags));
        crate::write_sysreg!(icc_pmr_el1, 0xff);
        crate::write_sysreg!(icc_bpr1_el1, 0);
        crate::write_sysreg!(icc_ctlr_el1, ICC_CTLR_EOIMODE);
        crate::write_sysreg!(icc_igrpen1_el1, 1);
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    Ok(())
}

/// The `RD_base` frame of CPU `index`'s redistributor (GICv3, once
/// [`init_cpu`] found it).
pub fn redistributor(index: usize) -> Option<usize> {
    let sgi = SGI_BASES.get(index)?.load(Ordering::Acquire);
    (sgi != 0).then(|| sgi - gicr::SGI_BASE)
}

/// Whatever ran here before (firmware, a boot loader) may have left a timer
/// on: the guest's two timers belong to no guest until a vCPU is loaded, and
/// the EL2 physical timer to nobody, so all three go off before their PPIs
/// (the EL1 ones) are enabled, and no level is left asserting while this CPU
/// waits at EL2.
fn timers_off() {
    // SAFETY: turning timers off only stops their interrupt outputs; no
    // guest runs on this CPU yet and the console's poll timer is armed
    // only later.
    unsafe {
        crate::write_sysreg!(cntv_ctl_el0, 0);
        crate::write_sysreg!(cntp_ctl_el0, 0);
        crate::write_sysreg!(cnthp_ctl_el2, 0);
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
}

/// What the GICv2 driver learned at boot.
struct HostGicV2 {
    distributor: usize,
    cpu_interface: usize,
    hyp_interface: usize,
    maintenance: u32,
    timers: [u32; 2],
}

static GICV2: Once<HostGicV2> = Once::new();
/// Each CPU's GICv2 CPU interface mask (its bit in `ITARGETSR`/`SGIR`).
static CPU_MASKS: [AtomicU8; MAX_CPUS] = [const { AtomicU8::new(0) }; MAX_CPUS];

/// Boot CPU, once, on a GICv2 host with the virtualization extensions: the
/// distributor is turned off, the console UART's SPI made level,
/// group 0, targeted at this CPU's interface and enabled, and the distributor
/// turned on (both groups: with one security state, group 0 is signalled as
/// IRQ, since `GICC_CTLR.FIQEn` stays clear). [`init_cpu`] then, on every
/// CPU: the three timers off, this CPU's banked SGIs and PPIs disabled but
/// the kick SGI, the maintenance PPI and both EL1 timers' PPIs, its CPU
/// interface mask read from `ITARGETSR0` (for kicks through `GICD_SGIR`),
/// `GICC_PMR` open, `GICC_BPR` 0 and `GICC_CTLR` enabled with `EOImode` 1;
/// `GICH_HCR` 0 until the first fill. Interrupts are acknowledged by
/// `GICC_IAR` and finished by writing the same value to `GICC_EOIR` (the
/// priority drop; an SGI's source CPU bits included) and `GICC_DIR` (the
/// deactivation), as on a GICv3. The virtual CPU interface (`GICV`) is
/// the guest's: the VM maps it at stage 2. Returns `false` (and drives
/// nothing) without a `GICH` frame.
pub fn init_gicv2(gic: &Gicv2, timers: [u32; 2], uart_intid: Option<u32>) -> bool {
    let Some(hyp) = gic.hyp_interface else {
        log::warn!("the device tree's GICv2 has no virtualization extensions (no GICH frame)");
        return false;
    };
    let distributor = gic.distributor.start as usize;
    write32(distributor + gicd::CTLR, 0);
    if let Some(intid) = uart_intid.filter(|&i| (32..1020).contains(&i)) {
        let word = (intid / 32) as usize * 4;
        let bit = 1 << (intid % 32);
        write32(distributor + gicd::ICENABLER + word, bit);
        let group = read32(distributor + gicd::IGROUPR + word);
        write32(distributor + gicd::IGROUPR + word, group & !bit);
        let cfg = distributor + gicd::ICFGR + (intid / 16) as usize * 4;
        write32(cfg, read32(cfg) & !(0b11 << ((intid % 16) * 2)));
        let own = own_cpu_mask(distributor);
        // SAFETY: byte accesses to the interrupt's priority and target
        // bytes, in the distributor frame.
        unsafe {
            write_volatile(
                (distributor + gicd::IPRIORITYR + intid as usize) as *mut u8,
                HOST_PRIORITY,
            );
            write_volatile(
                (distributor + v2regs::gicd::ITARGETSR + intid as usize) as *mut u8,
                own,
            );
        }
        write32(distributor + gicd::ISENABLER + word, bit);
    }
    write32(
        distributor + gicd::CTLR,
        v2regs::gicd::CTLR_ENABLE_GRP0 | v2regs::gicd::CTLR_ENABLE_GRP1,
    );
    let maintenance = gic.maintenance_intid.unwrap_or(DEFAULT_MAINTENANCE_INTID);
    GICV2.call_once(|| HostGicV2 {
        distributor,
        cpu_interface: gic.cpu_interface.start as usize,
        hyp_interface: hyp.start as usize,
        maintenance,
        timers,
    });
    true
}

/// This CPU's GICv2 interface mask: `ITARGETSR0`'s first byte is banked and
/// names the reading CPU (a uniprocessor GIC may read zero: interface 0).
fn own_cpu_mask(distributor: usize) -> u8 {
    let own = read32(distributor + v2regs::gicd::ITARGETSR) as u8;
    if own == 0 { 1 } else { own }
}

fn init_cpu_v2(index: usize) -> Result<(), GicError> {
    let gic = GICV2.get().ok_or(GicError::NotInitialised)?;
    timers_off();
    let distributor = gic.distributor;
    write32(distributor + gicd::ICENABLER, u32::MAX);
    write32(distributor + gicd::IGROUPR, 0);
    let [vtimer, ptimer] = gic.timers;
    for intid in [KICK_SGI, gic.maintenance, vtimer, ptimer] {
        // SAFETY: byte access to the banked priority byte, in the frame.
        unsafe {
            write_volatile(
                (distributor + gicd::IPRIORITYR + intid as usize) as *mut u8,
                HOST_PRIORITY,
            );
        }
    }
    write32(
        distributor + gicd::ISENABLER,
        1 << KICK_SGI | 1 << gic.maintenance | 1 << vtimer | 1 << ptimer,
    );
    CPU_MASKS[index].store(own_cpu_mask(distributor), Ordering::Release);
    let cpu = gic.cpu_interface;
    write32(cpu + gicc::PMR, 0xff);
    write32(cpu + gicc::BPR, 0);
    write32(
        cpu + gicc::CTLR,
        gicc::CTLR_ENABLE_GRP0 | gicc::CTLR_EOIMODE,
    );
    write32(gic.hyp_interface + gich::HCR, 0);
    Ok(())
}

/// An acknowledged host interrupt: its INTID and the value the
/// acknowledge register returned (what the EOI must write back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    /// The interrupt (1020..=1023: none).
    pub intid: u32,
    raw: u32,
}

/// What the run loop needs from the host GIC, whichever version it is.
pub trait HostGicOps: Sync {
    /// Acknowledges the highest-priority pending interrupt of this CPU.
    fn acknowledge(&self) -> Acknowledged;
    /// Drops the priority of an acknowledged interrupt (`EOImode` 1: it
    /// stays active until [`deactivate`](Self::deactivate)).
    fn drop_priority(&self, ack: Acknowledged);
    /// Deactivates an interrupt whose priority was dropped.
    fn deactivate(&self, ack: Acknowledged);
    /// Clears this CPU's PPI `intid`'s active state at the distributor or
    /// redistributor (`I[C]ACTIVER`): unlike [`deactivate`](Self::deactivate)
    /// it is defined, and does nothing, for an interrupt that is not active.
    fn clear_ppi_active(&self, intid: u32);
    /// Finishes an acknowledged interrupt: priority drop and deactivation.
    fn end_of_interrupt(&self, ack: Acknowledged) {
        self.drop_priority(ack);
        self.deactivate(ack);
    }
    /// Enables (`true`) or disables this CPU's PPI `intid`.
    fn set_ppi_enabled(&self, intid: u32, enabled: bool);
    /// Sends the kick SGI to logical CPU `index`.
    fn kick(&self, index: usize);
    /// Stops this CPU's interface from signalling interrupts.
    fn quiesce(&self);
    /// This CPU's list registers.
    fn list_registers(&self) -> HostListRegisters;
    /// The virtual CPU interface's guest-owned state as after a reset
    /// (`VMCR`, active priorities), for a vCPU that (re)starts here.
    /// `preemption_bits` is the number of preemption bits the interface has.
    fn reset_virtual_interface(&self, preemption_bits: u64);
}

/// The GICv3 driver (system-register CPU interface).
struct V3Driver;

impl HostGicOps for V3Driver {
    fn acknowledge(&self) -> Acknowledged {
        let intid = (crate::read_sysreg!(icc_iar1_el1) & 0xff_ffff) as u32;
        Acknowledged { intid, raw: intid }
    }

    fn drop_priority(&self, ack: Acknowledged) {
        // SAFETY: writing an acknowledged INTID to ICC_EOIR1_EL1 drops the
        // running priority it raised (EOImode 1).
        unsafe { crate::write_sysreg!(icc_eoir1_el1, u64::from(ack.raw)) };
    }

    fn deactivate(&self, ack: Acknowledged) {
        // SAFETY: writing an INTID whose priority was dropped to ICC_DIR_EL1
        // deactivates it.
        unsafe { crate::write_sysreg!(icc_dir_el1, u64::from(ack.raw)) };
    }

    fn clear_ppi_active(&self, intid: u32) {
        let index = percpu::current().index();
        let sgi = SGI_BASES[index].load(Ordering::Acquire);
        if sgi != 0 && intid < 32 {
            write32(sgi + gicr::ICACTIVER0, 1 << intid);
        }
    }

    fn set_ppi_enabled(&self, intid: u32, enabled: bool) {
        let index = percpu::current().index();
        let sgi = SGI_BASES[index].load(Ordering::Acquire);
        if sgi == 0 {
            return;
        }
        let bit = 1 << intid;
        if enabled {
            // SAFETY: byte access to the PPI's priority byte, in this CPU's
            // SGI frame (`intid` < 32).
            unsafe {
                write_volatile(
                    (sgi + gicr::IPRIORITYR + intid as usize) as *mut u8,
                    HOST_PRIORITY,
                );
            }
            write32(sgi + gicr::ISENABLER0, bit);
        } else {
            write32(sgi + gicr::ICENABLER0, bit);
        }
    }

    fn kick(&self, index: usize) {
        let mpidr = percpu::slot(index).mpidr.load(Ordering::Relaxed);
        // SAFETY: the barrier orders the caller's memory writes (the interrupt
        // state the target will read) before the SGI; the SGI only interrupts.
        unsafe {
            core::arch::asm!("dsb ish", options(nostack, preserves_flags));
            crate::write_sysreg!(icc_sgi1r_el1, sgi1r_value(mpidr, KICK_SGI));
            core::arch::asm!("isb", options(nostack, preserves_flags));
        }
    }

    fn quiesce(&self) {
        // SAFETY: disabling group 1 at this CPU's interface only stops
        // interrupts from being signalled to it.
        unsafe {
            crate::write_sysreg!(icc_igrpen1_el1, 0);
            core::arch::asm!("isb", options(nostack, preserves_flags));
        }
    }

    fn list_registers(&self) -> HostListRegisters {
        // SAFETY: the boot path set ICC_SRE_EL2.SRE on every CPU with the
        // GICv3 system-register interface; the caller manages this CPU's
        // list registers.
        HostListRegisters::V3(unsafe { HardwareListRegisters::new() })
    }

    fn reset_virtual_interface(&self, preemption_bits: u64) {
        let vmcr = if guards_binary_point() {
            cpu_interface::VMCR_VCBPR
        } else {
            0
        };
        // SAFETY: these registers only hold the guest's view of its virtual
        // CPU interface; no guest runs on this CPU now.
        unsafe {
            crate::write_sysreg!(ich_vmcr_el2, vmcr);
            crate::write_sysreg!(ich_ap0r0_el2, 0);
            crate::write_sysreg!(ich_ap1r0_el2, 0);
            if preemption_bits >= 6 {
                crate::write_sysreg!(ich_ap0r1_el2, 0);
                crate::write_sysreg!(ich_ap1r1_el2, 0);
            }
            if preemption_bits == 7 {
                crate::write_sysreg!(ich_ap0r2_el2, 0);
                crate::write_sysreg!(ich_ap1r2_el2, 0);
                crate::write_sysreg!(ich_ap0r3_el2, 0);
                crate::write_sysreg!(ich_ap1r3_el2, 0);
            }
        }
    }
}

impl HostGicOps for HostGicV2 {
    fn acknowledge(&self) -> Acknowledged {
        let raw = read32(self.cpu_interface + gicc::IAR);
        Acknowledged {
            intid: v2regs::iar_intid(raw),
            raw,
        }
    }

    fn drop_priority(&self, ack: Acknowledged) {
        write32(self.cpu_interface + gicc::EOIR, ack.raw);
    }

    fn deactivate(&self, ack: Acknowledged) {
        write32(self.cpu_interface + gicc::DIR, ack.raw);
    }

    fn clear_ppi_active(&self, intid: u32) {
        // ICACTIVER0 is banked: this CPU's own PPIs.
        if intid < 32 {
            write32(self.distributor + gicd::ICACTIVER, 1 << intid);
        }
    }

    fn set_ppi_enabled(&self, intid: u32, enabled: bool) {
        // ISENABLER0/ICENABLER0 and the PPIs' priority bytes are banked:
        // this CPU's own PPIs.
        if enabled {
            // SAFETY: byte access to the PPI's priority byte (`intid` < 32).
            unsafe {
                write_volatile(
                    (self.distributor + gicd::IPRIORITYR + intid as usize) as *mut u8,
                    HOST_PRIORITY,
                );
            }
        }
        let register = if enabled {
            gicd::ISENABLER
        } else {
            gicd::ICENABLER
        };
        write32(self.distributor + register, 1 << intid);
    }

    fn kick(&self, index: usize) {
        let targets = CPU_MASKS[index].load(Ordering::Acquire);
        if targets == 0 {
            return;
        }
        // SAFETY: the barrier orders the caller's memory writes before the
        // SGI; it has no other effect.
        unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) };
        write32(
            self.distributor + v2regs::gicd::SGIR,
            v2regs::sgir_value(targets, KICK_SGI),
        );
    }

    fn quiesce(&self) {
        write32(self.cpu_interface + gicc::CTLR, 0);
    }

    fn list_registers(&self) -> HostListRegisters {
        let count = v2regs::list_register_count(read32(self.hyp_interface + gich::VTR));
        HostListRegisters::V2(GichListRegisters {
            base: self.hyp_interface,
            count: count.min(MAX_LIST_REGISTERS),
        })
    }

    fn reset_virtual_interface(&self, _preemption_bits: u64) {
        write32(self.hyp_interface + gich::VMCR, 0);
        write32(self.hyp_interface + gich::APR, 0);
    }
}

/// The list registers of a GICv2 host: this CPU's bank of the `GICH`
/// frame, each `GICH_LR<n>` converted to and from the model's format.
#[derive(Debug)]
pub struct GichListRegisters {
    base: usize,
    count: usize,
}

impl ListRegisters for GichListRegisters {
    fn count(&self) -> usize {
        self.count
    }

    fn read_lr(&self, index: usize) -> u64 {
        let raw = read32(self.base + gich::LR0 + 4 * index);
        LrEncoding::V2.decode(u64::from(raw)).0
    }

    fn write_lr(&mut self, index: usize, value: u64) {
        let raw = LrEncoding::V2.encode(ListRegister(value)) as u32;
        write32(self.base + gich::LR0 + 4 * index, raw);
    }

    fn read_hcr(&self) -> u64 {
        u64::from(read32(self.base + gich::HCR))
    }

    fn write_hcr(&mut self, value: u64) {
        write32(self.base + gich::HCR, value as u32);
    }

    fn read_misr(&self) -> u64 {
        u64::from(read32(self.base + gich::MISR))
    }

    fn read_elrsr(&self) -> u64 {
        u64::from(read32(self.base + gich::ELRSR0))
            | u64::from(read32(self.base + gich::ELRSR1)) << 32
    }
}

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

/// The driver that was set up, if any.
fn driver() -> Option<&'static dyn HostGicOps> {
    if let Some(v2) = GICV2.get() {
        return Some(v2);
    }
    GIC.get().map(|_| &V3Driver as &'static dyn HostGicOps)
}

/// Whether the host GIC is a GICv2 (driven through [`init_gicv2`]).
pub fn is_v2() -> bool {
    GICV2.get().is_some()
}

/// This CPU's list registers: the GICv2 `GICH` frame when that driver is up,
/// else the GICv3 system registers when the CPU has them (`has_sysregs`).
pub fn list_registers(has_sysregs: bool) -> Option<HostListRegisters> {
    if let Some(v2) = GICV2.get() {
        return Some(v2.list_registers());
    }
    has_sysregs.then(|| V3Driver.list_registers())
}

/// The virtual CPU interface's guest-owned state as after a reset.
pub fn reset_virtual_interface(preemption_bits: u64) {
    if let Some(v2) = GICV2.get() {
        v2.reset_virtual_interface(preemption_bits);
    } else {
        V3Driver.reset_virtual_interface(preemption_bits);
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
pub fn acknowledge() -> Acknowledged {
    driver().map_or(
        Acknowledged {
            intid: host_gic::SPURIOUS_FIRST + 3,
            raw: 1023,
        },
        |d| d.acknowledge(),
    )
}

/// Finishes an acknowledged interrupt (priority drop and deactivation).
pub fn end_of_interrupt(ack: Acknowledged) {
    if let Some(d) = driver() {
        d.end_of_interrupt(ack);
    }
}

/// Only drops the priority of an acknowledged interrupt: it stays active
/// (for a guest timer's PPI, until the guest deactivates it through a
/// hardware list register, or [`deactivate_timer`]).
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
pub fn clear_ppi_active(intid: u32) {
    if let Some(d) = driver() {
        d.clear_ppi_active(intid);
    }
}

/// Clears the active state of this CPU's PPI of `timer` (a no-op when it is
/// not active): for an interrupt the guest will not deactivate.
pub fn deactivate_timer(timer: TimerId) {
    if let Some(d) = driver() {
        d.clear_ppi_active(timer_intids()[timer.index()]);
    }
}

/// Masks (`true`) or unmasks this CPU's PPI of `timer` at the host GIC.
pub fn set_timer_masked(timer: TimerId, masked: bool) {
    if let Some(d) = driver() {
        d.set_ppi_enabled(timer_intids()[timer.index()], !masked);
    }
}

/// Enables (at the hypervisor's priority; group 1 on a GICv3 and group 0 on
/// a GICv2, as every PPI) or disables this CPU's PPI `intid`: the console's
/// poll timer, and what the console CPU turns off when it parks.
pub fn set_ppi_enabled(intid: u32, enabled: bool) {
    if let Some(d) = driver() {
        d.set_ppi_enabled(intid, enabled);
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
    let Some(d) = driver() else {
        return;
    };
    loop {
        let ack = d.acknowledge();
        if ack.intid >= host_gic::SPURIOUS_FIRST {
            return;
        }
        d.end_of_interrupt(ack);
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
    if let Some(d) = driver() {
        d.quiesce();
    }
}

/// Sends the kick SGI to logical CPU `index`. Without a host GIC (the VM
/// was created with a warning that its guest gets no interrupts) there is
/// nothing to send.
pub fn kick(index: usize) {
    if let Some(d) = driver() {
        d.kick(index);
    }
}

/// The distributor of whichever GIC is driven, and whether it is a GICv2.
fn distributor() -> Option<(usize, bool)> {
    if let Some(v2) = GICV2.get() {
        return Some((v2.distributor, true));
    }
    GIC.get().map(|g| (g.distributor, false))
}

/// Routes SPI `intid` to logical CPU `cpu`: `GICD_IROUTER` with the CPU's
/// affinity on a GICv3, its interface bit in `GICD_ITARGETSR` on a GICv2.
pub fn route_spi(intid: u32, cpu: usize) {
    let Some((distributor, v2)) = distributor() else {
        return;
    };
    if !(32..1020).contains(&intid) {
        return;
    }
    if v2 {
        let mask = CPU_MASKS[cpu].load(Ordering::Acquire);
        // SAFETY: byte access to the SPI's target byte, in the frame.
        unsafe {
            write_volatile(
                (distributor + v2regs::gicd::ITARGETSR + intid as usize) as *mut u8,
                mask,
            );
        }
    } else {
        let mpidr = percpu::slot(cpu).mpidr.load(Ordering::Relaxed);
        let route = ((mpidr >> 32) & 0xff) << 32 | (mpidr & 0xff_ffff);
        write64(distributor + gicd::IROUTER + intid as usize * 8, route);
    }
}

/// Takes SPI `intid` (a passed-through device's) at EL2: disabled, made
/// group 1 (GICv3) or group 0 (GICv2, signalled as IRQ), the hypervisor's
/// priority, edge (`edge`) or level, routed to logical CPU `cpu`, inactive,
/// enabled.
pub fn setup_spi(intid: u32, edge: bool, cpu: usize) {
    let Some((distributor, v2)) = distributor() else {
        return;
    };
    if !(32..1020).contains(&intid) {
        return;
    }
    let word = (intid / 32) as usize * 4;
    let bit = 1 << (intid % 32);
    write32(distributor + gicd::ICENABLER + word, bit);
    if !v2 {
        wait_distributor(distributor);
    }
    let group = read32(distributor + gicd::IGROUPR + word);
    let group = if v2 { group & !bit } else { group | bit };
    write32(distributor + gicd::IGROUPR + word, group);
    // SAFETY: byte access to the interrupt's priority byte, in the frame.
    unsafe {
        write_volatile(
            (distributor + gicd::IPRIORITYR + intid as usize) as *mut u8,
            HOST_PRIORITY,
        );
    }
    let cfg = distributor + gicd::ICFGR + (intid / 16) as usize * 4;
    let shift = (intid % 16) * 2;
    let edge_bit = u32::from(edge) << 1 << shift;
    write32(cfg, (read32(cfg) & !(0b11 << shift)) | edge_bit);
    route_spi(intid, cpu);
    write32(distributor + gicd::ICACTIVER + word, bit);
    write32(distributor + gicd::ISENABLER + word, bit);
}

/// Deactivates SPI `intid` at the distributor (`GICD_ICACTIVER`: defined
/// from any CPU, and a no-op when it is not active): one left active for a
/// guest that will not deactivate it.
pub fn clear_spi_active(intid: u32) {
    let Some((distributor, _)) = distributor() else {
        return;
    };
    if (32..1020).contains(&intid) {
        write32(
            distributor + gicd::ICACTIVER + (intid / 32) as usize * 4,
            1 << (intid % 32),
        );
    }
}

/// Disables SPI `intid` and clears its active state: its VM ended.
pub fn release_spi(intid: u32) {
    let Some((distributor, _)) = distributor() else {
        return;
    };
    if (32..1020).contains(&intid) {
        write32(
            distributor + gicd::ICENABLER + (intid / 32) as usize * 4,
            1 << (intid % 32),
        );
        clear_spi_active(intid);
    }
}
