//! The host's GIC at EL2: the machine side of `crate::drivers::gic::driver`,
//! which holds the distributor, redistributor and CPU interface sequences
//! and describes them.
//!
//! Here: [`MmioFrame`], the driver's `GicFrame` as volatile accesses to the
//! frames the device tree named; [`IccRegisters`], its `CpuRegisters` as
//! `MRS`/`MSR` and barriers; [`HOST_GIC`], the one
//! `crate::drivers::gic::driven::DrivenGic` over them, which holds the
//! driver set up at boot and dispatches every request to it; the set-up
//! from the device tree's frames; this CPU's list registers
//! ([`HostListRegisters`]: the `ICH_*_EL2` system registers, or the
//! driver's `GichListRegisters` over the `GICH` frame); and the wait for
//! an interrupt.

use crate::arch::cpu::percpu::{self, MAX_CPUS};
use crate::arch::drivers::list_registers::HardwareListRegisters;
use crate::drivers::gic::DEFAULT_MAINTENANCE_INTID;
use crate::drivers::gic::driven::{self, DrivenGic};
use crate::drivers::gic::driver::{
    self as host_driver, CpuRegister, CpuRegisters, GicFrame, GicV2, GicV3,
};
use crate::platform::{Gicv2, Gicv3};
#[cfg(doc)]
use crate::vocabulary::timers::TimerId;
use core::ptr::{read_volatile, write_volatile};

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

/// The host GIC of this machine.
pub static HOST_GIC: DrivenGic<MmioFrame, IccRegisters, MAX_CPUS> = DrivenGic::new();

/// Boot CPU, once: sets up the distributor, routes `uart_intid` (an SPI)
/// to the CPU with affinity `boot_mpidr` and drives the GICv3. `timers` are
/// the host PPIs of the virtual and the EL1 physical timer
/// ([`TimerId::index`] order).
pub fn init_distributor(gic: &Gicv3, timers: [u32; 2], uart_intid: Option<u32>, boot_mpidr: u64) {
    // SAFETY: the device tree names these frames; the EL2 stage-1 maps them
    // as device memory.
    let distributor = unsafe { MmioFrame::new(gic.distributor.start as usize) };
    GicV3::<MmioFrame, IccRegisters>::init_distributor(&distributor, uart_intid, boot_mpidr);
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
    HOST_GIC.drive_v3(GicV3::new(
        distributor,
        regions,
        cpu,
        gic.maintenance_intid,
        timers,
        gic.emulated_by_qemu,
    ));
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
    GicV2::<MmioFrame, IccRegisters>::init_distributor(&distributor, uart_intid);
    // SAFETY: only the driver uses them, for the timers' control registers
    // (a GICv2 host has no GIC system registers, and the driver writes none).
    let cpu = unsafe { IccRegisters::new() };
    HOST_GIC.drive_v2(GicV2 {
        distributor,
        cpu_interface,
        hyp_interface,
        cpu,
        maintenance: gic.maintenance_intid.unwrap_or(DEFAULT_MAINTENANCE_INTID),
        timers,
    });
    true
}

/// Every CPU, on itself (after [`init_distributor`] or [`init_gicv2`]):
/// brings up this CPU's part of the GIC. `index` is the CPU's logical
/// number.
pub fn init_cpu(index: usize) -> Result<(), GicError> {
    HOST_GIC.init_cpu(index, crate::arch::cpu::sysreg::current_mpidr())
}

/// The address of CPU `index`'s redistributor `RD_base` frame (GICv3, once
/// [`init_cpu`] found it).
pub fn redistributor(index: usize) -> Option<usize> {
    HOST_GIC.redistributor(index).map(MmioFrame::base)
}

/// The list registers of a GICv2 host on this machine.
pub type GichListRegisters = host_driver::GichListRegisters<MmioFrame>;

/// This CPU's list registers, on either kind of host GIC.
pub type HostListRegisters = driven::HostListRegisters<HardwareListRegisters, GichListRegisters>;

/// This CPU's list registers: the GICv2 `GICH` frame when that driver is up,
/// else the GICv3 system registers when the CPU has them (`has_sysregs`).
pub fn list_registers(has_sysregs: bool) -> Option<HostListRegisters> {
    if let Some(v2) = HOST_GIC.gich_list_registers() {
        return Some(HostListRegisters::V2(v2));
    }
    // SAFETY: the boot path set ICC_SRE_EL2.SRE on every CPU with the
    // GICv3 system-register interface; the caller manages this CPU's list
    // registers.
    has_sysregs.then(|| HostListRegisters::V3(unsafe { HardwareListRegisters::new() }))
}

/// The virtual CPU interface's guest-owned state as after a reset.
pub fn reset_virtual_interface(preemption_bits: u64) {
    if !HOST_GIC.reset_gicv2_virtual_interface() {
        // SAFETY: only the driver's reset uses them; without a GICv2 the
        // caller has the GICv3 list registers, so the system registers.
        let cpu = unsafe { IccRegisters::new() };
        let guard = HOST_GIC.guards_binary_point();
        host_driver::reset_virtual_interface_v3(&cpu, guard, preemption_bits);
    }
}

/// This CPU's logical number, for the requests about its own PPIs.
pub fn this_cpu() -> usize {
    percpu::current().index()
}

/// Waits at EL2 until another CPU wakes this one: with the GIC up, `WFI`
/// (a kick SGI wakes it although `PSTATE.I` masks it), else `WFE` (an
/// event). Callers first discard or handle what is already pending, since a
/// pending interrupt ends `WFI` at once.
pub fn wait_for_wakeup() {
    if HOST_GIC.is_up() {
        // SAFETY: WFI only suspends the CPU until an interrupt or event.
        unsafe { core::arch::asm!("dsb sy", "wfi", options(nostack, preserves_flags)) }
    } else {
        crate::arch::cpu::sysreg::wait_for_event();
    }
}
