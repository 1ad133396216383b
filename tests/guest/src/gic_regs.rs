//! GICv3 register offsets and field values the guest's small GIC driver
//! (`gic`) uses, and the search for a CPU's redistributor.
//!
//! A redistributor region is a run of frames, 128 KiB each (256 KiB when
//! `GICR_TYPER.VLPIS` is set), the last one flagged by `GICR_TYPER.Last`;
//! the frame of a CPU is the one whose `GICR_TYPER` affinity (bits 63:32:
//! Aff3.Aff2.Aff1.Aff0) equals the CPU's MPIDR affinity. Pure code, tested
//! on the host.

/// Distributor: `GICD_CTLR`.
pub const GICD_CTLR: u64 = 0x0000;
/// `GICD_CTLR.EnableGrp1` (one security state, `DS` = 1).
pub const GICD_CTLR_ENABLE_GRP1: u32 = 1 << 1;
/// `GICD_CTLR.ARE` (affinity routing).
pub const GICD_CTLR_ARE: u32 = 1 << 4;
/// `GICD_CTLR.RWP`: a write is still being applied.
pub const GICD_CTLR_RWP: u32 = 1 << 31;

/// Redistributor `RD_base`: `GICR_TYPER` (64 bits).
pub const GICR_TYPER: u64 = 0x0008;
/// `GICR_TYPER.VLPIS`: the frame has the two virtual LPI pages.
pub const GICR_TYPER_VLPIS: u64 = 1 << 1;
/// `GICR_TYPER.Last`: the last frame of its region.
pub const GICR_TYPER_LAST: u64 = 1 << 4;
/// `GICR_WAKER`.
pub const GICR_WAKER: u64 = 0x0014;
/// `GICR_WAKER.ProcessorSleep`.
pub const GICR_WAKER_PROCESSOR_SLEEP: u32 = 1 << 1;
/// `GICR_WAKER.ChildrenAsleep`.
pub const GICR_WAKER_CHILDREN_ASLEEP: u32 = 1 << 2;
/// Offset of the `SGI_base` page in a redistributor frame.
pub const GICR_SGI_BASE: u64 = 0x1_0000;
/// `SGI_base`: `GICR_IGROUPR0`.
pub const GICR_IGROUPR0: u64 = 0x0080;
/// `SGI_base`: `GICR_ISENABLER0`.
pub const GICR_ISENABLER0: u64 = 0x0100;
/// `SGI_base`: `GICR_ICENABLER0`.
pub const GICR_ICENABLER0: u64 = 0x0180;
/// `SGI_base`: `GICR_IPRIORITYR0` (one byte per INTID, accessed by words).
pub const GICR_IPRIORITYR: u64 = 0x0400;
/// Size of a GICv3 redistributor frame (`RD_base` + `SGI_base`).
pub const GICR_FRAME: u64 = 0x2_0000;
/// Size of a GICv4 frame (with the VLPI pages).
pub const GICR_FRAME_VLPI: u64 = 0x4_0000;

/// INTIDs from this one up are special: nothing to acknowledge.
pub const SPURIOUS_FIRST: u32 = 1020;

/// The priority the guest gives its interrupts (any value below the
/// priority mask `0xff` lets them through).
pub const PRIORITY: u8 = 0x80;

/// The offset (in `SGI_base`) of the `GICR_IPRIORITYR<n>` word holding
/// `intid`'s priority byte.
pub fn priority_offset(intid: u32) -> u64 {
    GICR_IPRIORITYR + u64::from(intid / 4) * 4
}

/// `word` (read at [`priority_offset`]) with `intid`'s byte set to `priority`.
pub fn with_priority(word: u32, intid: u32, priority: u8) -> u32 {
    let shift = (intid % 4) * 8;
    (word & !(0xff << shift)) | (u32::from(priority) << shift)
}

/// The MPIDR affinity as `GICR_TYPER[63:32]` holds it (Aff3.Aff2.Aff1.Aff0).
pub fn typer_affinity(mpidr: u64) -> u64 {
    ((mpidr >> 32) & 0xff) << 24 | (mpidr & 0xff_ffff)
}

/// The offset, in a redistributor region of `region_size` bytes, of the frame
/// that belongs to the CPU with `mpidr`; `typer_at(offset)` reads that
/// frame's `GICR_TYPER` and is only called below `region_size`.
pub fn find_redistributor(
    mpidr: u64,
    region_size: u64,
    mut typer_at: impl FnMut(u64) -> u64,
) -> Option<u64> {
    let wanted = typer_affinity(mpidr);
    let mut offset = 0;
    while offset + GICR_FRAME <= region_size {
        let typer = typer_at(offset);
        if typer >> 32 == wanted {
            return Some(offset);
        }
        if typer & GICR_TYPER_LAST != 0 {
            return None;
        }
        offset += if typer & GICR_TYPER_VLPIS != 0 {
            GICR_FRAME_VLPI
        } else {
            GICR_FRAME
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_frame_by_affinity() {
        let typers = |offset: u64| {
            let n = offset / GICR_FRAME;
            (n << 32) | if n == 3 { GICR_TYPER_LAST } else { 0 }
        };
        assert_eq!(find_redistributor(0, 0x80_0000, typers), Some(0));
        assert_eq!(find_redistributor(3, 0x80_0000, typers), Some(0x6_0000));
        assert_eq!(find_redistributor(4, 0x80_0000, typers), None, "past Last");
        assert_eq!(find_redistributor(3, 0x6_0000, typers), None, "region ends");
        let v4 = |offset: u64| ((offset / GICR_FRAME_VLPI) << 32) | GICR_TYPER_VLPIS;
        assert_eq!(find_redistributor(2, 0x10_0000, v4), Some(0x8_0000));
        // MPIDR bit 31 (RES1) and the MT/U bits do not take part.
        assert_eq!(
            find_redistributor(0x8000_0001, 0x80_0000, typers),
            Some(0x2_0000)
        );
        assert_eq!(typer_affinity(0x1_0002_0304), 0x0102_0304);
    }

    #[test]
    fn priority_bytes_in_words() {
        assert_eq!(priority_offset(30), 0x41c);
        assert_eq!(priority_offset(27), 0x418);
        assert_eq!(with_priority(0, 30, 0x80), 0x0080_0000);
        assert_eq!(with_priority(0xffff_ffff, 27, 0x80), 0x80ff_ffff);
        assert_eq!(with_priority(0x1122_3344, 16, 0xa0), 0x1122_33a0);
    }
}
