//! The registers of a paused vCPU, as the control interface reads and
//! writes them.
//!
//! A vCPU that finds its VM paused leaves the guest, copies the registers it
//! holds in memory at EL2 (`x0..x30`, the PC and PSTATE) into its slot of
//! the VM, and waits; when the VM resumes it takes the slot's values back
//! before it enters the guest again. `VCPU_GET_REGISTER` and
//! `VCPU_SET_REGISTER` act on that copy, so a change made while the VM is
//! paused is what the vCPU runs with after the resume. The EL1 system
//! registers (`SP_EL1`, `ELR_EL1`, `SPSR_EL1`, the `SysReg` ids) and `SP_EL0`
//! stay loaded in the CPU of a paused vCPU and are not part of the copy:
//! they answer `NOT_SUPPORTED`.

use control_abi::call::RegisterKind;
use control_abi::{Error, RegisterId};

/// The copy of a paused vCPU's registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkedRegisters {
    /// `x0..x30`.
    pub x: [u64; 31],
    /// The guest's PC.
    pub pc: u64,
    /// The guest's PSTATE.
    pub pstate: u64,
}

impl ParkedRegisters {
    /// The place of `reg` in the copy, or `NOT_SUPPORTED`.
    fn slot(&mut self, reg: RegisterId) -> Result<&mut u64, Error> {
        match reg.kind() {
            RegisterKind::X(n) => Ok(&mut self.x[usize::from(n)]),
            RegisterKind::Pc => Ok(&mut self.pc),
            RegisterKind::Pstate => Ok(&mut self.pstate),
            _ => Err(Error::NotSupported),
        }
    }

    /// Reads `reg`.
    pub fn get(&mut self, reg: RegisterId) -> Result<u64, Error> {
        self.slot(reg).map(|r| *r)
    }

    /// Writes `reg`. PSTATE keeps the guest at EL1 or EL0 in AArch64 or
    /// AArch32 as the architecture allows: a value naming EL2 or EL3 (a
    /// guest may never run there) is refused.
    pub fn set(&mut self, reg: RegisterId, value: u64) -> Result<(), Error> {
        if reg.kind() == RegisterKind::Pstate && !guest_pstate(value) {
            return Err(Error::InvalidParameters);
        }
        *self.slot(reg)? = value;
        Ok(())
    }
}

/// Whether `pstate` is a mode a guest may run in: AArch64 EL0t, EL1t or
/// EL1h, or any AArch32 mode (bit 4 set) but Hyp (0x1a) and Monitor (0x16).
fn guest_pstate(pstate: u64) -> bool {
    let mode = pstate & 0x1f;
    if pstate >> 32 != 0 {
        return false;
    }
    if mode & 0x10 == 0 {
        matches!(mode, 0b0000 | 0b0100 | 0b0101)
    } else {
        !matches!(mode, 0x1a | 0x16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn general_registers_pc_and_pstate_round_trip() {
        let mut regs = ParkedRegisters::default();
        for n in 0..=30 {
            let reg = RegisterId::x(n).unwrap();
            regs.set(reg, 0x1000 + u64::from(n)).unwrap();
        }
        regs.set(RegisterId::PC, 0x4008_0000).unwrap();
        regs.set(RegisterId::PSTATE, 0x3c5).unwrap();
        for n in 0..=30 {
            assert_eq!(
                regs.get(RegisterId::x(n).unwrap()),
                Ok(0x1000 + u64::from(n))
            );
        }
        assert_eq!(regs.x[30], 0x101e);
        assert_eq!(regs.get(RegisterId::PC), Ok(0x4008_0000));
        assert_eq!(regs.get(RegisterId::PSTATE), Ok(0x3c5));
    }

    #[test]
    fn el1_system_registers_are_not_in_the_copy() {
        let mut regs = ParkedRegisters::default();
        for reg in [
            RegisterId::SP_EL0,
            RegisterId::SP_EL1,
            RegisterId::ELR_EL1,
            RegisterId::SPSR_EL1,
            RegisterId::sysreg(0, 1, 0, 0).unwrap(),
        ] {
            assert_eq!(regs.get(reg), Err(Error::NotSupported));
            assert_eq!(regs.set(reg, 1), Err(Error::NotSupported));
        }
    }

    #[test]
    fn pstate_may_not_name_el2_or_el3() {
        let mut regs = ParkedRegisters::default();
        for bad in [0x3c9, 0x3cd, 0x3c8, 0x1da, 0x1d6, 1 << 32] {
            assert_eq!(
                regs.set(RegisterId::PSTATE, bad),
                Err(Error::InvalidParameters),
                "{bad:#x}"
            );
        }
        for good in [0x3c5, 0x3c4, 0x0, 0x1d0, 0x1d3, 0x1f] {
            assert_eq!(regs.set(RegisterId::PSTATE, good), Ok(()), "{good:#x}");
        }
    }
}
