//! GICv3 register offsets and field values the guest's small GIC driver
//! (`gic`) uses, the search for a CPU's redistributor, and the encodings of
//! `GICD_IROUTER` and `ICC_SGI1R_EL1`.
//!
//! The one-bit-per-INTID registers (`IGROUPR`, `IS/ICENABLER`, `ISPENDR`,
//! `IS/ICACTIVER`) and the byte-per-INTID `IPRIORITYR` are at the same
//! offsets in the distributor (SPIs) and in a redistributor's `SGI_base`
//! page (SGIs and PPIs: word 0 only).
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
/// `IGROUPR<n>` (distributor, or `SGI_base` for `n` = 0).
pub const IGROUPR: u64 = 0x0080;
/// `ISENABLER<n>`.
pub const ISENABLER: u64 = 0x0100;
/// `ICENABLER<n>`.
pub const ICENABLER: u64 = 0x0180;
/// `ISPENDR<n>`.
pub const ISPENDR: u64 = 0x0200;
/// `ICPENDR<n>`.
pub const ICPENDR: u64 = 0x0280;
/// `ISACTIVER<n>`.
pub const ISACTIVER: u64 = 0x0300;
/// `ICACTIVER<n>`.
pub const ICACTIVER: u64 = 0x0380;
/// `IPRIORITYR<n>` (one byte per INTID, accessed by words or bytes).
pub const IPRIORITYR: u64 = 0x0400;
/// Distributor: `GICD_IROUTER<n>` (64 bits) is at this offset + 8n.
pub const GICD_IROUTER: u64 = 0x6000;
/// Size of a GICv3 redistributor frame (`RD_base` + `SGI_base`).
pub const GICR_FRAME: u64 = 0x2_0000;
/// Size of a GICv4 frame (with the VLPI pages).
pub const GICR_FRAME_VLPI: u64 = 0x4_0000;

/// GICv2 distributor: `GICD_CTLR.EnableGrp0` (`Enable` with one security state).
pub const GICD_CTLR_ENABLE_GRP0: u32 = 1 << 0;
/// GICv2 distributor: `GICD_ITARGETSR<n>` (one byte per INTID).
pub const GICD_ITARGETSR: u64 = 0x0800;
/// GICv2 distributor: `GICD_SGIR`.
pub const GICD_SGIR: u64 = 0x0f00;
/// `GICD_SGIR.TargetListFilter` = 2: the requesting CPU only.
pub const GICD_SGIR_SELF: u32 = 2 << 24;
/// GICv2 CPU interface: `GICC_CTLR`.
pub const GICC_CTLR: u64 = 0x0000;
/// `GICC_CTLR.EnableGrp0`.
pub const GICC_CTLR_ENABLE_GRP0: u32 = 1 << 0;
/// `GICC_CTLR.EnableGrp1`.
pub const GICC_CTLR_ENABLE_GRP1: u32 = 1 << 1;
/// `GICC_CTLR.AckCtl`: `GICC_IAR` acknowledges group 1 interrupts too.
pub const GICC_CTLR_ACK_CTL: u32 = 1 << 2;
/// `GICC_PMR`.
pub const GICC_PMR: u64 = 0x0004;
/// `GICC_BPR`.
pub const GICC_BPR: u64 = 0x0008;
/// `GICC_IAR` (INTID \[9:0\], an SGI's source CPU \[12:10\]).
pub const GICC_IAR: u64 = 0x000c;
/// `GICC_EOIR` (takes the `GICC_IAR` value back).
pub const GICC_EOIR: u64 = 0x0010;
/// The INTID bits of a GICv2 `GICC_IAR` value.
pub const GICC_IAR_INTID_MASK: u32 = 0x3ff;

/// INTIDs from this one up are special: nothing to acknowledge.
pub const SPURIOUS_FIRST: u32 = 1020;

/// The priority the guest gives its interrupts (any value below the
/// priority mask `0xff` lets them through).
pub const PRIORITY: u8 = 0x80;

/// The offset (in the distributor or `SGI_base`) of the `IPRIORITYR<n>`
/// word holding `intid`'s priority byte.
pub fn priority_offset(intid: u32) -> u64 {
    IPRIORITYR + u64::from(intid / 4) * 4
}

/// The offset of the word of a one-bit-per-INTID `register` (such as
/// [`ISACTIVER`]) that holds `intid`'s bit; the bit is `1 << (intid % 32)`.
pub fn bit_word_offset(register: u64, intid: u32) -> u64 {
    register + 4 * u64::from(intid / 32)
}

/// The offset of `GICD_IROUTER<intid>`.
pub fn irouter_offset(intid: u32) -> u64 {
    GICD_IROUTER + 8 * u64::from(intid)
}

/// `GICD_IROUTER` routing an SPI to the CPU with `mpidr` (`IRM` = 0:
/// Aff3 at bits 39:32, Aff2.Aff1.Aff0 at 23:0).
pub fn irouter(mpidr: u64) -> u64 {
    mpidr & 0xff_00ff_ffff
}

/// `ICC_SGI1R_EL1` sending SGI `intid` to the CPU with `mpidr` alone:
/// Aff3, Aff2 and Aff1 of the target, `RS` = Aff0 / 16 and the target list
/// bit Aff0 % 16.
pub fn sgi1r_to(intid: u32, mpidr: u64) -> u64 {
    let aff0 = mpidr & 0xff;
    let aff1 = (mpidr >> 8) & 0xff;
    let aff2 = (mpidr >> 16) & 0xff;
    let aff3 = (mpidr >> 32) & 0xff;
    aff3 << 48
        | (aff0 / 16) << 44
        | aff2 << 32
        | u64::from(intid & 0xf) << 24
        | aff1 << 16
        | 1 << (aff0 % 16)
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
        assert_eq!(priority_offset(41), 0x428);
    }

    #[test]
    fn bit_words_routing_and_sgis() {
        assert_eq!(bit_word_offset(ISACTIVER, 27), 0x300);
        assert_eq!(bit_word_offset(ISACTIVER, 40), 0x304);
        assert_eq!(bit_word_offset(ICACTIVER, 64), 0x388);
        assert_eq!(irouter_offset(40), 0x6140);
        // MPIDR bit 31 (RES1) and MT/U do not route; Aff3 moves nowhere.
        assert_eq!(irouter(0x8000_0003), 3);
        assert_eq!(irouter(0x12_8102_0304), 0x12_0002_0304);
        assert_eq!(sgi1r_to(1, 0x8000_0000), 1 << 24 | 1);
        assert_eq!(sgi1r_to(15, 0x8000_0003), 15 << 24 | 1 << 3);
        assert_eq!(
            sgi1r_to(2, 0x7_0005_0611),
            7 << 48 | 1 << 44 | 5 << 32 | 2 << 24 | 6 << 16 | 1 << 1
        );
    }
}
