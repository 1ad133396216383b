//! Register encodings of the host's GICv3, as pure functions the EL2 driver
//! (`arch::gic`) and the run loop use.
//!
//! - [`sgi1r_value`]: the `ICC_SGI1R_EL1` value that sends an SGI to exactly
//!   one CPU, from its MPIDR affinity (Aff0 goes to the target list, with the
//!   range selector for Aff0 >= 16).
//! - [`find_redistributor`]: which redistributor frame belongs to a CPU, by
//!   walking the `GICR_TYPER` values of a region (frames are 128 KiB, 256 KiB
//!   when `VLPIS` is set, and the last one has `Last` set).
//! - The host interrupts the hypervisor uses and what each one means
//!   ([`HostIrq::classify`]).

use crate::timer::TimerId;

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
