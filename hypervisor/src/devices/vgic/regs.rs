//! Register plumbing shared by the distributor and redistributor frames.
//!
//! Access rules (GICv3 architecture, "GIC memory-mapped register access"):
//! 32-bit registers take naturally aligned 32-bit accesses; the priority and
//! target registers also take bytes; 64-bit registers take aligned 64-bit
//! accesses or 32-bit accesses to either half. The one-bit-per-interrupt
//! registers (`IGROUPR`, `IS/ICENABLER`, `IS/ICPENDR`, `IS/ICACTIVER`), the
//! priority bytes and the two-bit `ICFGR` fields are implemented once here
//! over a bank of interrupts: the SPIs for the distributor, a vCPU's private
//! interrupts for its `SGI_base` frame. Unimplemented INTIDs read as zero and
//! ignore writes. The PrimeCell-style ID block (`PIDR4..7`, `PIDR0..3`,
//! `CIDR0..3` at `0xFFD0..=0xFFFC`) identifies a GICv3 (`PIDR2.ArchRev` = 3)
//! designed by Arm's JEP106 code `0x43B`, part number `0x048`.

use super::irq::{IntIdClass, PRIORITY_MASK, Trigger};
use super::{Frame, VcpuSet, VgicError, VgicState};

/// `GICD_IIDR`/`GICR_IIDR`: ProductID 0x48 ('H'), variant 0, revision 0,
/// implementer 0x43B.
pub(crate) const IIDR: u32 = 0x48 << 24 | 0x43b;

/// First offset of the ID register block.
const ID_BLOCK: u64 = 0xffd0;
/// `PIDR4..PIDR7`, `PIDR0..PIDR3`, `CIDR0..CIDR3`.
const ID_REGISTERS: [u32; 12] = [
    0x04, 0x00, 0x00, 0x00, // PIDR4: JEP106 continuation 4; PIDR5-7 reserved
    0x48, 0xb0, 0x3b, 0x00, // PIDR0-3: part 0x048, JEP106 0x3B, ArchRev 3
    0x0d, 0xf0, 0x05, 0xb1, // CIDR0-3
];

/// The value of the ID register at `offset`, if it is one.
pub(crate) fn id_register(offset: u64) -> Option<u32> {
    let index = offset.checked_sub(ID_BLOCK)?;
    (index % 4 == 0)
        .then(|| ID_REGISTERS.get((index / 4) as usize).copied())
        .flatten()
}

/// The access sizes a register takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Width {
    /// 32-bit only.
    Word,
    /// 8-bit or 32-bit.
    ByteOrWord,
    /// 64-bit, or 32-bit to either half.
    Double,
}

/// Checks `size` and alignment of an access at `offset` to a register of
/// `width`.
pub(crate) fn check_access(
    frame: Frame,
    offset: u64,
    size: u8,
    width: Width,
) -> Result<(), VgicError> {
    let allowed = match width {
        Width::Word => size == 4,
        Width::ByteOrWord => size == 1 || size == 4,
        Width::Double => size == 4 || size == 8,
    };
    if allowed && offset.is_multiple_of(u64::from(size)) {
        Ok(())
    } else {
        Err(VgicError::BadAccess {
            frame,
            offset,
            size,
        })
    }
}

/// The part of 64-bit register `value` that an access of `size` at `offset`
/// (relative to any 8-byte aligned base) reads.
pub(crate) fn read_part(value: u64, offset: u64, size: u8) -> u64 {
    match (size, offset % 8) {
        (8, _) => value,
        (_, 4) => value >> 32,
        _ => value & 0xffff_ffff,
    }
}

/// 64-bit register `old` after a write of `size` at `offset`.
pub(crate) fn merge_part(old: u64, offset: u64, size: u8, value: u64) -> u64 {
    match (size, offset % 8) {
        (8, _) => value,
        (_, 4) => (old & 0xffff_ffff) | (value & 0xffff_ffff) << 32,
        _ => (old & !0xffff_ffff) | (value & 0xffff_ffff),
    }
}

/// A one-bit-per-interrupt register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BitRegister {
    Group,
    SetEnable,
    ClearEnable,
    SetPending,
    ClearPending,
    SetActive,
    ClearActive,
}

/// Decodes an offset in `0x080..0x400` into the register and the word index
/// (word n covers INTIDs 32n..32n+31).
pub(crate) fn bit_register(offset: u64) -> Option<(BitRegister, u32)> {
    let register = match offset {
        0x080..0x100 => BitRegister::Group,
        0x100..0x180 => BitRegister::SetEnable,
        0x180..0x200 => BitRegister::ClearEnable,
        0x200..0x280 => BitRegister::SetPending,
        0x280..0x300 => BitRegister::ClearPending,
        0x300..0x380 => BitRegister::SetActive,
        0x380..0x400 => BitRegister::ClearActive,
        _ => return None,
    };
    Some((register, ((offset % 0x80) / 4) as u32))
}

impl VgicState {
    /// Reads 32 bits of `register` for INTIDs `first..first + 32`, private
    /// ones from `vcpu`'s bank.
    pub(crate) fn read_bits(&self, vcpu: usize, register: BitRegister, first: u32) -> u64 {
        (0..32).fold(0, |acc, bit| {
            let set = self
                .irq(vcpu, first + bit)
                .is_some_and(|irq| match register {
                    BitRegister::Group => irq.group1,
                    BitRegister::SetEnable | BitRegister::ClearEnable => irq.enabled,
                    BitRegister::SetPending | BitRegister::ClearPending => irq.pending(),
                    BitRegister::SetActive | BitRegister::ClearActive => irq.active,
                });
            acc | u64::from(set) << bit
        })
    }

    /// Writes 32 bits of `register` for INTIDs `first..first + 32`. Returns
    /// the vCPUs to kick.
    pub(crate) fn write_bits(
        &mut self,
        vcpu: usize,
        register: BitRegister,
        first: u32,
        value: u64,
    ) -> VcpuSet {
        let mut kicks = VcpuSet::EMPTY;
        for bit in 0..32 {
            let intid = first + bit;
            let one = value & (1 << bit) != 0;
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            let before = *irq;
            match (register, one) {
                (BitRegister::Group, _) => irq.group1 = one,
                (_, false) => continue,
                (BitRegister::SetEnable, true) => irq.enabled = true,
                (BitRegister::ClearEnable, true) => irq.enabled = false,
                (BitRegister::SetPending, true) => irq.set_pending(),
                (BitRegister::ClearPending, true) => irq.clear_pending(),
                (BitRegister::SetActive, true) => irq.write_active(true),
                (BitRegister::ClearActive, true) => irq.write_active(false),
            }
            if *irq != before {
                kicks = kicks.union(self.kicks_for(vcpu, intid));
            }
        }
        kicks
    }

    /// Reads `size` (1 or 4) priority bytes starting at INTID `first`.
    pub(crate) fn read_priorities(&self, vcpu: usize, first: u32, size: u8) -> u64 {
        (0..u32::from(size)).fold(0, |acc, byte| {
            let priority = self.irq(vcpu, first + byte).map_or(0, |irq| irq.priority);
            acc | u64::from(priority) << (8 * byte)
        })
    }

    /// Writes `size` (1 or 4) priority bytes starting at INTID `first`.
    pub(crate) fn write_priorities(
        &mut self,
        vcpu: usize,
        first: u32,
        size: u8,
        value: u64,
    ) -> VcpuSet {
        let mut kicks = VcpuSet::EMPTY;
        for byte in 0..u32::from(size) {
            let intid = first + byte;
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            let priority = (value >> (8 * byte)) as u8 & PRIORITY_MASK;
            if irq.priority != priority {
                irq.priority = priority;
                kicks = kicks.union(self.kicks_for(vcpu, intid));
            }
        }
        kicks
    }

    /// Reads the `ICFGR` word for INTIDs `first..first + 16`: field bit 1 set
    /// for edge-triggered.
    pub(crate) fn read_config(&self, vcpu: usize, first: u32) -> u64 {
        (0..16).fold(0, |acc, field| {
            let edge = self
                .irq(vcpu, first + field)
                .is_some_and(|irq| irq.trigger == Trigger::Edge);
            acc | u64::from(edge) << (2 * field + 1)
        })
    }

    /// Writes the `ICFGR` word for INTIDs `first..first + 16`. SGIs are
    /// always edge-triggered and a PPI linked to a physical one (the timers,
    /// [`VgicState::link_hardware_ppi`]) always level-sensitive, as its
    /// source is (read-only fields; whether a PPI's field is programmable is
    /// IMPLEMENTATION DEFINED); the other PPIs and the SPIs are
    /// programmable.
    pub(crate) fn write_config(&mut self, vcpu: usize, first: u32, value: u64) -> VcpuSet {
        let mut kicks = VcpuSet::EMPTY;
        for field in 0..16 {
            let intid = first + field;
            if IntIdClass::of(intid) == Some(IntIdClass::Sgi) || self.hardware_ppi(intid).is_some()
            {
                continue;
            }
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            let trigger = if value & (1 << (2 * field + 1)) != 0 {
                Trigger::Edge
            } else {
                Trigger::Level
            };
            if irq.trigger != trigger {
                irq.trigger = trigger;
                kicks = kicks.union(self.kicks_for(vcpu, intid));
            }
        }
        kicks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        let f = Frame::Distributor;
        assert!(check_access(f, 0x100, 4, Width::Word).is_ok());
        assert!(check_access(f, 0x100, 8, Width::Word).is_err());
        assert!(check_access(f, 0x100, 2, Width::Word).is_err());
        assert!(check_access(f, 0x100, 1, Width::Word).is_err());
        assert!(check_access(f, 0x102, 4, Width::Word).is_err());
        assert!(check_access(f, 0x401, 1, Width::ByteOrWord).is_ok());
        assert!(check_access(f, 0x402, 2, Width::ByteOrWord).is_err());
        assert!(check_access(f, 0x6100, 8, Width::Double).is_ok());
        assert!(check_access(f, 0x6104, 4, Width::Double).is_ok());
        assert!(check_access(f, 0x6104, 8, Width::Double).is_err());
        assert_eq!(
            check_access(f, 0x6102, 4, Width::Double),
            Err(VgicError::BadAccess {
                frame: f,
                offset: 0x6102,
                size: 4
            })
        );
    }

    #[test]
    fn halves_of_64_bit_registers() {
        let v = 0x1122_3344_5566_7788;
        assert_eq!(read_part(v, 0, 8), v);
        assert_eq!(read_part(v, 0, 4), 0x5566_7788);
        assert_eq!(read_part(v, 4, 4), 0x1122_3344);
        assert_eq!(merge_part(v, 4, 4, 0xaaaa_bbbb), 0xaaaa_bbbb_5566_7788);
        assert_eq!(
            merge_part(v, 0, 4, 0xffff_ffff_aaaa_bbbb),
            0x1122_3344_aaaa_bbbb
        );
        assert_eq!(merge_part(v, 0, 8, 1), 1);
    }

    #[test]
    fn id_block() {
        assert_eq!(id_register(0xffe8), Some(0x3b));
        assert_eq!(id_register(0xffe8).unwrap() >> 4 & 0xf, 3, "ArchRev");
        assert_eq!(id_register(0xffd0), Some(0x04));
        assert_eq!(id_register(0xfffc), Some(0xb1));
        assert_eq!(id_register(0xfff0), Some(0x0d));
        assert_eq!(id_register(0xffe9), None);
        assert_eq!(id_register(0xffcc), None);
        assert_eq!(id_register(0x1_0000), None);
    }

    #[test]
    fn bit_register_decoding() {
        assert_eq!(bit_register(0x080), Some((BitRegister::Group, 0)));
        assert_eq!(bit_register(0x104), Some((BitRegister::SetEnable, 1)));
        assert_eq!(bit_register(0x1fc), Some((BitRegister::ClearEnable, 31)));
        assert_eq!(bit_register(0x2a0), Some((BitRegister::ClearPending, 8)));
        assert_eq!(bit_register(0x3fc), Some((BitRegister::ClearActive, 31)));
        assert_eq!(bit_register(0x400), None);
        assert_eq!(bit_register(0x07c), None);
    }
}
