//! The host's GIC: its driver ([`driver`]: the distributor, redistributor
//! and CPU interface sequences, over register-bank traits, host-tested
//! against a recording mock) and, here, the register encodings, as pure
//! functions the driver and the run loop use.
//!
//! - [`sgi1r_value`]: the `ICC_SGI1R_EL1` value that sends an SGI to exactly
//!   one CPU, from its MPIDR affinity (Aff0 goes to the target list, with the
//!   range selector for Aff0 >= 16).
//! - [`find_redistributor`]: which redistributor frame belongs to a CPU, by
//!   walking the `GICR_TYPER` values of a region (frames are 128 KiB, 256 KiB
//!   when `VLPIS` is set, and the last one has `Last` set).
//! - The host interrupts the hypervisor uses and what each one means
//!   ([`HostIrq::classify`]; an LPI is a passed PCIe device's MSI).
//! - A GICv2 host's register maps ([`gicv2`]): the distributor's `SGIR` and
//!   `ITARGETSR`, the CPU interface (`GICC`), the virtual interface control
//!   registers (`GICH`), and the values the driver computes from them:
//!   [`gicv2::sgir_value`] (an SGI to the CPU interfaces of a target mask),
//!   [`gicv2::iar_intid`] (the INTID in a `GICC_IAR` value, whose source-CPU
//!   bits must go back unchanged to `GICC_EOIR`), [`gicv2::list_register_count`]
//!   (`GICH_VTR.ListRegs + 1`).

use crate::vocabulary::timers::TimerId;

pub mod driven;
#[cfg(test)]
mod driven_tests;
pub mod driver;
#[cfg(test)]
mod driver_tests;
#[cfg(test)]
mod mock;

/// GICv2 host registers and the values built from them.
pub mod gicv2 {
    use tock_registers::LocalRegisterCopy;
    use tock_registers::register_bitfields;

    register_bitfields! {u32,
        /// `GICD_SGIR`.
        SGIR [
            /// 0: the CPUs of `CPUTargetList`; 1: all but self; 2: self.
            TargetListFilter OFFSET(24) NUMBITS(2) [],
            /// One bit per CPU interface.
            CPUTargetList OFFSET(16) NUMBITS(8) [],
            /// The SGI.
            SGIINTID OFFSET(0) NUMBITS(4) []
        ],
        /// `GICC_IAR`.
        IAR [
            /// For an SGI: the CPU that sent it.
            CPUID OFFSET(10) NUMBITS(3) [],
            /// The interrupt.
            InterruptID OFFSET(0) NUMBITS(10) []
        ],
        /// `GICH_VTR`.
        VTR [
            /// Number of list registers minus one.
            ListRegs OFFSET(0) NUMBITS(6) []
        ]
    }

    /// Distributor registers only a GICv2 has (the others are at the GICv3
    /// offsets, [`super::gicd`]).
    pub mod gicd {
        /// `GICD_CTLR.EnableGrp0` (`Enable` without security extensions).
        pub const CTLR_ENABLE_GRP0: u32 = 1 << 0;
        /// `GICD_CTLR.EnableGrp1`.
        pub const CTLR_ENABLE_GRP1: u32 = 1 << 1;
        /// `GICD_ITARGETSR<n>` (byte per INTID).
        pub const ITARGETSR: usize = 0x0800;
        /// `GICD_SGIR`.
        pub const SGIR: usize = 0x0f00;
    }

    /// CPU interface registers (`GICC_*`).
    pub mod gicc {
        /// `GICC_CTLR`.
        pub const CTLR: usize = 0x0000;
        /// `GICC_CTLR.EnableGrp0`.
        pub const CTLR_ENABLE_GRP0: u32 = 1 << 0;
        /// `GICC_PMR`.
        pub const PMR: usize = 0x0004;
        /// `GICC_BPR`.
        pub const BPR: usize = 0x0008;
        /// `GICC_IAR`.
        pub const IAR: usize = 0x000c;
        /// `GICC_EOIR`.
        pub const EOIR: usize = 0x0010;
        /// `GICC_CTLR.EOImode` (bit 9 of a GIC without the security
        /// extensions, or of the non-secure view): `GICC_EOIR` only drops the
        /// priority, `GICC_DIR` deactivates.
        pub const CTLR_EOIMODE: u32 = 1 << 9;
        /// `GICC_DIR` (in the interface's second 4 KiB page).
        pub const DIR: usize = 0x1000;
        /// Size of the CPU interface frame, `GICC_DIR` included.
        pub const FRAME_SIZE: u64 = 0x2000;
    }

    /// Virtual interface control registers (`GICH_*`, this CPU's bank).
    pub mod gich {
        /// `GICH_HCR` (same bits as `ICH_HCR_EL2`).
        pub const HCR: usize = 0x000;
        /// `GICH_VTR`.
        pub const VTR: usize = 0x004;
        /// `GICH_VMCR`.
        pub const VMCR: usize = 0x008;
        /// `GICH_MISR` (same bits as `ICH_MISR_EL2`).
        pub const MISR: usize = 0x010;
        /// `GICH_ELRSR0` (list registers 0..=31).
        pub const ELRSR0: usize = 0x030;
        /// `GICH_ELRSR1` (list registers 32..=63).
        pub const ELRSR1: usize = 0x034;
        /// `GICH_APR`.
        pub const APR: usize = 0x0f0;
        /// `GICH_LR0`; `GICH_LR<n>` at `LR0 + 4 n`.
        pub const LR0: usize = 0x100;
    }

    /// The `GICD_SGIR` value sending SGI `intid` to the CPU interfaces in
    /// `targets` (bit n = interface n).
    pub fn sgir_value(targets: u8, intid: u32) -> u32 {
        let mut sgir = LocalRegisterCopy::<u32, SGIR::Register>::new(0);
        sgir.modify(
            SGIR::TargetListFilter.val(0)
                + SGIR::CPUTargetList.val(u32::from(targets))
                + SGIR::SGIINTID.val(intid & 0xf),
        );
        sgir.get()
    }

    /// The INTID of a `GICC_IAR` value (1023: none pending).
    pub fn iar_intid(iar: u32) -> u32 {
        LocalRegisterCopy::<u32, IAR::Register>::new(iar).read(IAR::InterruptID)
    }

    /// The number of list registers a `GICH_VTR` value announces.
    pub fn list_register_count(vtr: u32) -> usize {
        LocalRegisterCopy::<u32, VTR::Register>::new(vtr).read(VTR::ListRegs) as usize + 1
    }
}

/// Distributor registers.
pub mod gicd {
    /// `GICD_CTLR`.
    pub const CTLR: usize = 0x0000;
    /// `GICD_CTLR.RWP`: a write is still being applied.
    pub const CTLR_RWP: u32 = 1 << 31;
    /// `GICD_CTLR.ARE_NS` (`ARE` with one security state).
    pub const CTLR_ARE_NS: u32 = 1 << 4;
    /// `GICD_CTLR.EnableGrp1NS` (`EnableGrp1` with one security state).
    pub const CTLR_ENABLE_GRP1_NS: u32 = 1 << 1;
    /// `GICD_IGROUPR<n>`.
    pub const IGROUPR: usize = 0x0080;
    /// `GICD_ISENABLER<n>`.
    pub const ISENABLER: usize = 0x0100;
    /// `GICD_ICENABLER<n>`.
    pub const ICENABLER: usize = 0x0180;
    /// `GICD_ICACTIVER<n>` (on a GICv2, word 0 is banked per CPU).
    pub const ICACTIVER: usize = 0x0380;
    /// `GICD_IPRIORITYR<n>` (byte per INTID).
    pub const IPRIORITYR: usize = 0x0400;
    /// `GICD_ICFGR<n>` (two bits per INTID).
    pub const ICFGR: usize = 0x0c00;
    /// `GICD_IROUTER<n>` (64 bits per INTID).
    pub const IROUTER: usize = 0x6000;
}

/// Redistributor registers (`RD_base` frame, then `SGI_base` at +64 KiB).
pub mod gicr {
    /// `GICR_TYPER` (64-bit).
    pub const TYPER: usize = 0x0008;
    /// `GICR_TYPER.VLPIS`: the redistributor has virtual LPI frames (256 KiB).
    pub const TYPER_VLPIS: u64 = 1 << 1;
    /// `GICR_TYPER.Last`: the last redistributor of its region.
    pub const TYPER_LAST: u64 = 1 << 4;
    /// `GICR_WAKER`.
    pub const WAKER: usize = 0x0014;
    /// `GICR_WAKER.ProcessorSleep`.
    pub const WAKER_PROCESSOR_SLEEP: u32 = 1 << 1;
    /// `GICR_WAKER.ChildrenAsleep`.
    pub const WAKER_CHILDREN_ASLEEP: u32 = 1 << 2;
    /// Offset of the `SGI_base` frame.
    pub const SGI_BASE: usize = 0x1_0000;
    /// `GICR_IGROUPR0` (in `SGI_base`).
    pub const IGROUPR0: usize = 0x0080;
    /// `GICR_ISENABLER0` (in `SGI_base`).
    pub const ISENABLER0: usize = 0x0100;
    /// `GICR_ICENABLER0` (in `SGI_base`).
    pub const ICENABLER0: usize = 0x0180;
    /// `GICR_ICACTIVER0` (in `SGI_base`).
    pub const ICACTIVER0: usize = 0x0380;
    /// `GICR_IPRIORITYR<n>` (in `SGI_base`).
    pub const IPRIORITYR: usize = 0x0400;
    /// Size of a GICv3 redistributor (`RD_base` + `SGI_base`).
    pub const FRAME_SIZE: u64 = 0x2_0000;
    /// Size of a GICv4 redistributor (with the VLPI frames).
    pub const FRAME_SIZE_VLPI: u64 = 0x4_0000;
}

/// The physical SGI a CPU sends another to make it leave the guest and
/// refill its list registers.
pub const KICK_SGI: u32 = 8;
/// The GIC maintenance interrupt the architecture recommends (PPI 9), used
/// when the device tree does not name one.
pub const DEFAULT_MAINTENANCE_INTID: u32 = 25;
/// Priority of every interrupt the hypervisor enables (all equal: none
/// preempts another, since EL2 runs with interrupts masked anyway).
pub const HOST_PRIORITY: u8 = 0xa0;
/// The first LPI.
pub const FIRST_LPI: u32 = 8192;
/// INTIDs from this one up are special (1020..=1023): nothing to handle.
pub const SPURIOUS_FIRST: u32 = 1020;

/// The `ICC_SGI1R_EL1` value sending `intid` (< 16) to the one CPU whose
/// MPIDR affinity is `mpidr` (Aff3.Aff2.Aff1.Aff0).
pub const fn sgi1r_value(mpidr: u64, intid: u32) -> u64 {
    let aff0 = mpidr & 0xff;
    let aff1 = (mpidr >> 8) & 0xff;
    let aff2 = (mpidr >> 16) & 0xff;
    let aff3 = (mpidr >> 32) & 0xff;
    let range_selector = aff0 >> 4;
    (aff3 << 48)
        | (range_selector << 44)
        | (aff2 << 32)
        | (((intid & 0xf) as u64) << 24)
        | (aff1 << 16)
        | (1 << (aff0 & 0xf))
}

/// The offset, in a redistributor region, of the frame whose `GICR_TYPER`
/// affinity (bits \[63:32\]: Aff3.Aff2.Aff1.Aff0) matches `mpidr`.
/// `typer_at(offset)` reads the `GICR_TYPER` of the frame at `offset`, and is
/// only called for offsets below `region_size`.
pub fn find_redistributor(
    mpidr: u64,
    region_size: u64,
    mut typer_at: impl FnMut(u64) -> u64,
) -> Option<u64> {
    let wanted = ((mpidr >> 32) & 0xff) << 24 | (mpidr & 0xff_ffff);
    let mut offset = 0;
    while offset + gicr::FRAME_SIZE <= region_size {
        let typer = typer_at(offset);
        if typer >> 32 == wanted {
            return Some(offset);
        }
        if typer & gicr::TYPER_LAST != 0 {
            return None;
        }
        offset += if typer & gicr::TYPER_VLPIS != 0 {
            gicr::FRAME_SIZE_VLPI
        } else {
            gicr::FRAME_SIZE
        };
    }
    None
}

/// What an acknowledged host interrupt is to the hypervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostIrq {
    /// Another CPU asks this one to refill its list registers.
    Kick,
    /// The GIC maintenance interrupt (the list registers need a refill).
    Maintenance,
    /// One of the EL1 timers of the guest running here fired.
    Timer(TimerId),
    /// The console UART has received bytes.
    UartReceive,
    /// Nothing pending (1020..=1023).
    Spurious,
    /// An LPI (8192 and up): a passed PCIe device's MSI through the host's
    /// ITS.
    Lpi(u32),
    /// An interrupt the hypervisor never enabled.
    Unexpected(u32),
}

impl HostIrq {
    /// Sorts `intid` given the maintenance interrupt's, the timers' (host
    /// PPIs in [`TimerId::index`] order) and the UART's INTIDs.
    pub fn classify(intid: u32, maintenance: u32, timers: [u32; 2], uart: Option<u32>) -> Self {
        match intid {
            KICK_SGI => Self::Kick,
            i if i == maintenance => Self::Maintenance,
            i if i == timers[TimerId::Virtual.index()] => Self::Timer(TimerId::Virtual),
            i if i == timers[TimerId::Physical.index()] => Self::Timer(TimerId::Physical),
            i if Some(i) == uart => Self::UartReceive,
            i if i >= FIRST_LPI => Self::Lpi(i),
            i if i >= SPURIOUS_FIRST => Self::Spurious,
            other => Self::Unexpected(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgi1r_targets_one_cpu() {
        assert_eq!(sgi1r_value(0, 8), 8 << 24 | 1);
        assert_eq!(sgi1r_value(3, 8), 8 << 24 | 1 << 3);
        // Aff1 = 2, Aff0 = 5.
        assert_eq!(sgi1r_value(0x205, 1), 1 << 24 | 2 << 16 | 1 << 5);
        // Aff3 = 1, Aff2 = 4, Aff0 = 17: range selector 1, target bit 1.
        assert_eq!(
            sgi1r_value(0x1_0004_0011, 0),
            1 << 48 | 1 << 44 | 4 << 32 | 1 << 1
        );
    }

    #[test]
    fn redistributor_by_affinity() {
        // Three GICv3 frames for MPIDRs 0, 1, 2; the last has Last set.
        let typers = |offset: u64| {
            let n = offset / gicr::FRAME_SIZE;
            (n << 32) | if n == 2 { gicr::TYPER_LAST } else { 0 }
        };
        assert_eq!(find_redistributor(0, 0xf6_0000, typers), Some(0));
        assert_eq!(find_redistributor(2, 0xf6_0000, typers), Some(0x4_0000));
        assert_eq!(find_redistributor(3, 0xf6_0000, typers), None);
        // Region too small to reach the third frame.
        assert_eq!(find_redistributor(2, 0x4_0000, typers), None);
        // GICv4 frames are twice as large.
        let v4 = |offset: u64| ((offset / gicr::FRAME_SIZE_VLPI) << 32) | gicr::TYPER_VLPIS;
        assert_eq!(find_redistributor(1, 0x10_0000, v4), Some(0x4_0000));
        // Aff3 sits at TYPER bit 56.
        let aff3 = |_| 1u64 << 56;
        assert_eq!(find_redistributor(1 << 32, 0x2_0000, aff3), Some(0));
    }

    #[test]
    fn gicv2_values() {
        use super::gicv2::*;
        // Kick SGI 8 to CPU interface 2.
        assert_eq!(sgir_value(1 << 2, 8), 0x0004_0008);
        assert_eq!(sgir_value(0xff, 15), 0x00ff_000f);
        // An SGI 8 from CPU 3: the INTID without the source.
        assert_eq!(iar_intid(3 << 10 | 8), 8);
        assert_eq!(iar_intid(1023), 1023);
        assert_eq!(iar_intid(0x1c00 | 33), 33);
        // QEMU's GICH_VTR: 4 list registers, 5 priority and preemption bits.
        assert_eq!(list_register_count(0x9000_0003), 4);
        assert_eq!(list_register_count(0x3f), 64);
    }

    #[test]
    fn classify() {
        const T: [u32; 2] = [27, 30];
        assert_eq!(HostIrq::classify(8, 25, T, Some(33)), HostIrq::Kick);
        assert_eq!(HostIrq::classify(25, 25, T, Some(33)), HostIrq::Maintenance);
        assert_eq!(
            HostIrq::classify(27, 25, T, Some(33)),
            HostIrq::Timer(TimerId::Virtual)
        );
        assert_eq!(
            HostIrq::classify(30, 25, T, Some(33)),
            HostIrq::Timer(TimerId::Physical)
        );
        assert_eq!(HostIrq::classify(33, 25, T, Some(33)), HostIrq::UartReceive);
        assert_eq!(HostIrq::classify(33, 25, T, None), HostIrq::Unexpected(33));
        assert_eq!(HostIrq::classify(1023, 25, T, None), HostIrq::Spurious);
        assert_eq!(HostIrq::classify(8192, 25, T, None), HostIrq::Lpi(8192));
        assert_eq!(HostIrq::classify(9000, 25, T, None), HostIrq::Lpi(9000));
        assert_eq!(HostIrq::classify(24, 24, T, None), HostIrq::Maintenance);
        assert_eq!(HostIrq::classify(25, 24, T, None), HostIrq::Unexpected(25));
        // The EL2 physical timer (26) is never enabled: unexpected.
        assert_eq!(HostIrq::classify(26, 25, T, None), HostIrq::Unexpected(26));
        // Timers on other PPIs, as a host device tree may say.
        assert_eq!(
            HostIrq::classify(23, 25, [24, 23], None),
            HostIrq::Timer(TimerId::Physical)
        );
    }
}
