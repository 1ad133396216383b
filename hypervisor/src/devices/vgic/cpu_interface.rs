//! The virtual CPU interface's common registers, emulated at EL2 where the
//! host's own virtual CPU interface cannot be trusted with them.
//!
//! # Why
//!
//! A guest normally reaches the virtual CPU interface (`ICV_*`) without
//! exits. QEMU's emulation of it (up to at least 7.2) clamps a binary-point
//! write to its minimum *before* it drops the bits above the 3-bit field:
//! `ICC_BPR1_EL1 = 8` leaves `ICH_VMCR_EL2.VBPR1` at 0, and the next group-1
//! acknowledge asserts (`icv_gprio_mask: Assertion 'bpr > 0'`), killing the
//! whole machine with every VM on it. The write itself cannot be trapped
//! without trapping every group-1 access (`ICH_HCR_EL2.TALL1`: two more exits
//! per interrupt). But with `ICH_VMCR_EL2.VCBPR` set, group 1 uses the
//! group-0 binary point, a `BPR1` write is ignored and `BPR0`, whatever it
//! holds, is never asserted on. So on such a host the hypervisor keeps
//! `VCBPR` set for good and traps the common registers
//! (`ICH_HCR_EL2.TC`: `ICC_CTLR_EL1`, `ICC_PMR_EL1`, `ICC_RPR_EL1`,
//! `ICC_DIR_EL1`; the SGI registers trap anyway), so that a guest's
//! `ICC_CTLR_EL1.CBPR` write cannot clear it. Linux touches those registers
//! at CPU bring-up only (without pseudo-NMIs), so the traps cost nothing
//! per interrupt.
//!
//! # What the guest sees
//!
//! - `ICC_CTLR_EL1`: `CBPR` as the guest last wrote it (kept by the
//!   hypervisor), `EOImode` (`VMCR.VEOIM`), and the read-only `PRIbits`,
//!   `IDbits`, `SEIS` and `A3V` from `ICH_VTR_EL2`, as the CPU interface
//!   reports them.
//! - `ICC_PMR_EL1`: `VMCR.VPMR`, the unimplemented low priority bits
//!   reading as zero.
//! - `ICC_RPR_EL1`: the priority of the most urgent active priority bit in
//!   `ICH_AP0R<n>_EL2` / `ICH_AP1R<n>_EL2`, 0xff when none is set.
//! - `ICC_DIR_EL1` (with `EOImode` 1): deactivates the list register that
//!   holds the interrupt active (and its physical interrupt when it is a
//!   hardware one), or counts in `ICH_HCR_EL2.EOIcount` when none does;
//!   ignored with `EOImode` 0 and for special INTIDs.
//!
//! The one difference from the architecture: with `CBPR` 0 the guest's
//! `ICC_BPR1_EL1` still follows `BPR0` (reads `BPR0 + 1`, writes ignored),
//! since the binary point is the hardware's.

use super::list_regs::{self, Deactivation, ListRegisters};

/// `ICH_HCR_EL2.TC`: trap the common CPU interface registers.
pub const ICH_HCR_TC: u64 = 1 << 10;
/// `ICH_VMCR_EL2.VCBPR`.
pub const VMCR_VCBPR: u64 = 1 << 4;
/// `ICH_VMCR_EL2.VEOIM`.
pub const VMCR_VEOIM: u64 = 1 << 9;
const VMCR_VPMR_SHIFT: u32 = 24;
const VMCR_VPMR_MASK: u64 = 0xff << VMCR_VPMR_SHIFT;

/// `ICC_CTLR_EL1.CBPR`.
const CTLR_CBPR: u64 = 1 << 0;
/// `ICC_CTLR_EL1.EOImode`.
const CTLR_EOIMODE: u64 = 1 << 1;

/// First special INTID (1020..=1023).
const SPECIAL_INTIDS: u64 = 1020;

/// A common CPU interface register, trapped with `ICH_HCR_EL2.TC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommonRegister {
    /// `ICC_CTLR_EL1` (`op0 3, op1 0, CRn 12, CRm 12, op2 4`).
    Ctlr,
    /// `ICC_PMR_EL1` (`3, 0, 4, 6, 0`).
    Pmr,
    /// `ICC_RPR_EL1` (`3, 0, 12, 11, 3`), read-only.
    Rpr,
    /// `ICC_DIR_EL1` (`3, 0, 12, 11, 1`), write-only.
    Dir,
}

impl CommonRegister {
    /// The register an `MRS`/`MSR` encoding names, if it is one of the four.
    pub const fn from_encoding(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> Option<Self> {
        match (op0, op1, crn, crm, op2) {
            (3, 0, 12, 12, 4) => Some(Self::Ctlr),
            (3, 0, 4, 6, 0) => Some(Self::Pmr),
            (3, 0, 12, 11, 3) => Some(Self::Rpr),
            (3, 0, 12, 11, 1) => Some(Self::Dir),
            _ => None,
        }
    }
}

/// What the CPU interface implements, from `ICH_VTR_EL2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterfaceShape {
    vtr: u64,
}

impl InterfaceShape {
    /// From an `ICH_VTR_EL2` value.
    pub const fn from_vtr(vtr: u64) -> Self {
        Self { vtr }
    }

    /// Implemented priority bits (`PRIbits + 1`).
    pub const fn priority_bits(self) -> u32 {
        ((self.vtr >> 29) & 0x7) as u32 + 1
    }

    /// Implemented preemption bits (`PREbits + 1`).
    pub const fn preemption_bits(self) -> u32 {
        ((self.vtr >> 26) & 0x7) as u32 + 1
    }

    /// The `ICC_CTLR_EL1` read-only fields: `PRIbits` \[10:8\], `IDbits`
    /// \[13:11\], `SEIS` \[14\] and `A3V` \[15\].
    const fn ctlr_fixed(self) -> u64 {
        let pribits = (self.vtr >> 29) & 0x7;
        let idbits = (self.vtr >> 23) & 0x7;
        let seis = (self.vtr >> 22) & 1;
        let a3v = (self.vtr >> 21) & 1;
        pribits << 8 | idbits << 11 | seis << 14 | a3v << 15
    }
}

/// The guest's `ICC_CTLR_EL1`: its own `CBPR` (`guest_cbpr`), `EOImode`
/// from `vmcr`, the read-only fields from the interface.
pub const fn read_ctlr(vmcr: u64, shape: InterfaceShape, guest_cbpr: bool) -> u64 {
    let mut value = shape.ctlr_fixed();
    if guest_cbpr {
        value |= CTLR_CBPR;
    }
    if vmcr & VMCR_VEOIM != 0 {
        value |= CTLR_EOIMODE;
    }
    value
}

/// A guest write of `ICC_CTLR_EL1`: the new `ICH_VMCR_EL2` (`VEOIM` from
/// `EOImode`, `VCBPR` kept set) and the guest's `CBPR`.
pub const fn write_ctlr(vmcr: u64, value: u64) -> (u64, bool) {
    let mut vmcr = (vmcr & !VMCR_VEOIM) | VMCR_VCBPR;
    if value & CTLR_EOIMODE != 0 {
        vmcr |= VMCR_VEOIM;
    }
    (vmcr, value & CTLR_CBPR != 0)
}

/// The guest's `ICC_PMR_EL1`.
pub const fn read_pmr(vmcr: u64) -> u64 {
    (vmcr & VMCR_VPMR_MASK) >> VMCR_VPMR_SHIFT
}

/// A guest write of `ICC_PMR_EL1`: the new `ICH_VMCR_EL2`, the priority's
/// unimplemented low bits dropped.
pub const fn write_pmr(vmcr: u64, value: u64, shape: InterfaceShape) -> u64 {
    let implemented = (0xff << (8 - shape.priority_bits())) & 0xff;
    (vmcr & !VMCR_VPMR_MASK) | ((value & implemented) << VMCR_VPMR_SHIFT)
}

/// The guest's `ICC_RPR_EL1` from its active-priority registers (`aprs`:
/// each `ICH_AP0R<n>_EL2 | ICH_AP1R<n>_EL2`, n ascending): the most urgent
/// active priority, 0xff when nothing is active.
pub fn read_rpr(aprs: &[u32], shape: InterfaceShape) -> u64 {
    let shift = 8 - shape.preemption_bits();
    aprs.iter()
        .enumerate()
        .find(|(_, apr)| **apr != 0)
        .map_or(0xff, |(n, apr)| {
            ((n as u64 * 32 + u64::from(apr.trailing_zeros())) << shift) & 0xff
        })
}

/// A guest write of `ICC_DIR_EL1` with `value`, as the CPU interface does it.
pub fn write_dir(lrs: &mut impl ListRegisters, vmcr: u64, value: u64) -> Deactivation {
    let intid = value & 0xff_ffff;
    if vmcr & VMCR_VEOIM == 0 || intid >= SPECIAL_INTIDS {
        return Deactivation::Ignored;
    }
    list_regs::deactivate(lrs, intid as u32)
}

#[cfg(test)]
mod tests {
    use super::super::list_regs::{
        ICH_HCR_EOICOUNT_MASK, ICH_HCR_EOICOUNT_SHIFT, ListRegister, ModelListRegisters,
    };
    use super::*;

    /// QEMU 7.2's `max`: 5 priority and 5 preemption bits, 16-bit INTIDs,
    /// A3V, 4 list registers.
    const QEMU_VTR: u64 = 4 << 29 | 4 << 26 | 1 << 21 | 3;

    #[test]
    fn the_four_registers_by_encoding() {
        assert_eq!(
            CommonRegister::from_encoding(3, 0, 12, 12, 4),
            Some(CommonRegister::Ctlr)
        );
        assert_eq!(
            CommonRegister::from_encoding(3, 0, 4, 6, 0),
            Some(CommonRegister::Pmr)
        );
        assert_eq!(
            CommonRegister::from_encoding(3, 0, 12, 11, 3),
            Some(CommonRegister::Rpr)
        );
        assert_eq!(
            CommonRegister::from_encoding(3, 0, 12, 11, 1),
            Some(CommonRegister::Dir)
        );
        // BPR1 and IAR1 are not trapped by TC.
        assert_eq!(CommonRegister::from_encoding(3, 0, 12, 12, 3), None);
        assert_eq!(CommonRegister::from_encoding(3, 0, 12, 12, 0), None);
    }

    #[test]
    fn ctlr_keeps_vcbpr_set_and_reports_the_guests_cbpr() {
        let shape = InterfaceShape::from_vtr(QEMU_VTR);
        let (vmcr, cbpr) = write_ctlr(0, 0);
        assert_eq!(vmcr & VMCR_VCBPR, VMCR_VCBPR, "a CBPR 0 write keeps VCBPR");
        assert!(!cbpr);
        // PRIbits 4, IDbits 0, A3V: what QEMU's ICV_CTLR_EL1 reads.
        assert_eq!(read_ctlr(vmcr, shape, cbpr), 4 << 8 | 1 << 15);
        let (vmcr, cbpr) = write_ctlr(vmcr, CTLR_CBPR | CTLR_EOIMODE | 0xffff_0000);
        assert!(cbpr && vmcr & VMCR_VEOIM != 0);
        assert_eq!(read_ctlr(vmcr, shape, cbpr), 4 << 8 | 1 << 15 | 0b11);
        let (vmcr, _) = write_ctlr(vmcr, 0);
        assert_eq!(vmcr & (VMCR_VEOIM | VMCR_VCBPR), VMCR_VCBPR);
    }

    #[test]
    fn pmr_drops_unimplemented_bits_and_leaves_the_rest_of_vmcr() {
        let shape = InterfaceShape::from_vtr(QEMU_VTR);
        let vmcr = VMCR_VCBPR | 0b11 | 3 << 18;
        let vmcr = write_pmr(vmcr, 0xff, shape);
        assert_eq!(read_pmr(vmcr), 0xf8);
        assert_eq!(vmcr & 0xff_ffff, VMCR_VCBPR | 0b11 | 3 << 18);
        assert_eq!(read_pmr(write_pmr(vmcr, 0x1_0087, shape)), 0x80);
    }

    #[test]
    fn rpr_is_the_most_urgent_active_priority() {
        let shape = InterfaceShape::from_vtr(QEMU_VTR);
        assert_eq!(read_rpr(&[0], shape), 0xff);
        // Bit 20 of AP0R: priority 20 << 3.
        assert_eq!(read_rpr(&[1 << 20 | 1 << 31], shape), 0xa0);
        assert_eq!(read_rpr(&[1], shape), 0);
        // 7 preemption bits: the second register's bits are priorities
        // 64..127, shifted by one.
        let seven = InterfaceShape::from_vtr(6 << 29 | 6 << 26);
        assert_eq!(read_rpr(&[0, 1 << 3, 0, 0], seven), (32 + 3) << 1);
    }

    #[test]
    fn dir_deactivates_the_listed_interrupt_or_counts() {
        let mut lrs = ModelListRegisters::new(4);
        lrs.write_lr(
            1,
            ListRegister::virtual_interrupt(27, 0, true, false, true, false)
                .hardware(27)
                .0,
        );
        lrs.write_lr(
            2,
            ListRegister::virtual_interrupt(40, 0, true, true, true, false).0,
        );
        // EOImode 0: ignored.
        assert_eq!(write_dir(&mut lrs, 0, 27), Deactivation::Ignored);
        assert!(ListRegister(lrs.read_lr(1)).active());
        assert_eq!(
            write_dir(&mut lrs, VMCR_VEOIM, 27),
            Deactivation::Listed { physical: Some(27) }
        );
        assert!(ListRegister(lrs.read_lr(1)).is_empty());
        // Active and pending: only the active bit goes.
        assert_eq!(
            write_dir(&mut lrs, VMCR_VEOIM, 40),
            Deactivation::Listed { physical: None }
        );
        assert_eq!(ListRegister(lrs.read_lr(2)).state(), 1);
        assert_eq!(write_dir(&mut lrs, VMCR_VEOIM, 33), Deactivation::Counted);
        assert_eq!(write_dir(&mut lrs, VMCR_VEOIM, 33), Deactivation::Counted);
        assert_eq!(
            lrs.read_hcr() & ICH_HCR_EOICOUNT_MASK,
            2 << ICH_HCR_EOICOUNT_SHIFT
        );
        assert_eq!(write_dir(&mut lrs, VMCR_VEOIM, 1023), Deactivation::Ignored);
    }
}
