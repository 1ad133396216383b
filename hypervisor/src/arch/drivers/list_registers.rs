//! The running CPU's GICv3 list registers (`ICH_LR<n>_EL2`, `ICH_HCR_EL2`,
//! `ICH_MISR_EL2`, `ICH_ELRSR_EL2`) behind the vgic's `ListRegisters` trait,
//! read and written with the machine layer's `read_sysreg!` and
//! `write_sysreg!`. The vgic's logic (`devices::vgic`) is tested on the host
//! against `ModelListRegisters`.

use crate::arch::cpu::sysreg;
use crate::devices::vgic::ListRegisters;
use crate::devices::vgic::list_regs::MAX_LIST_REGISTERS;

/// The list registers of the CPU this code runs on, by `mrs`/`msr`.
#[derive(Debug)]
pub struct HardwareListRegisters {
    count: usize,
}

/// Expands `$body!(ich_lr<index>_el2)` for a list register index.
macro_rules! lr_dispatch {
    ($index:expr, $body:ident) => {
        match $index {
            0 => $body!(ich_lr0_el2),
            1 => $body!(ich_lr1_el2),
            2 => $body!(ich_lr2_el2),
            3 => $body!(ich_lr3_el2),
            4 => $body!(ich_lr4_el2),
            5 => $body!(ich_lr5_el2),
            6 => $body!(ich_lr6_el2),
            7 => $body!(ich_lr7_el2),
            8 => $body!(ich_lr8_el2),
            9 => $body!(ich_lr9_el2),
            10 => $body!(ich_lr10_el2),
            11 => $body!(ich_lr11_el2),
            12 => $body!(ich_lr12_el2),
            13 => $body!(ich_lr13_el2),
            14 => $body!(ich_lr14_el2),
            15 => $body!(ich_lr15_el2),
            index => panic!("ICH_LR{index}_EL2 does not exist"),
        }
    };
}

impl HardwareListRegisters {
    /// Reads `ICH_VTR_EL2` to count the list registers.
    ///
    /// # Safety
    ///
    /// Must run at EL2 with `ICC_SRE_EL2.SRE` set (the GICv3 system
    /// register interface), on the CPU whose list registers the caller
    /// means to manage.
    pub unsafe fn new() -> Self {
        let vtr = crate::read_sysreg!(ich_vtr_el2);
        let count = (vtr & 0x1f) as usize + 1;
        Self {
            count: count.min(MAX_LIST_REGISTERS),
        }
    }
}

impl ListRegisters for HardwareListRegisters {
    fn count(&self) -> usize {
        self.count
    }

    fn read_lr(&self, index: usize) -> u64 {
        assert!(index < self.count, "ICH_LR{index}_EL2 is not implemented");
        macro_rules! read_lr {
            ($name:ident) => {
                crate::read_sysreg!($name)
            };
        }
        lr_dispatch!(index, read_lr)
    }

    fn write_lr(&mut self, index: usize, value: u64) {
        assert!(index < self.count, "ICH_LR{index}_EL2 is not implemented");
        macro_rules! write_lr {
            ($name:ident) => {
                // SAFETY: the list registers only shape the virtual CPU
                // interface seen by EL1; the constructor's contract
                // guarantees EL2 with the system register interface enabled.
                unsafe { crate::write_sysreg!($name, value) }
            };
        }
        lr_dispatch!(index, write_lr)
    }

    fn read_hcr(&self) -> u64 {
        crate::read_sysreg!(ich_hcr_el2)
    }

    fn write_hcr(&mut self, value: u64) {
        // SAFETY: as for the list registers.
        unsafe { crate::write_sysreg!(ich_hcr_el2, value) };
        // The new ICH_HCR_EL2 is seen before the next guest entry.
        sysreg::isb();
    }

    fn read_misr(&self) -> u64 {
        crate::read_sysreg!(ich_misr_el2)
    }

    fn read_elrsr(&self) -> u64 {
        crate::read_sysreg!(ich_elrsr_el2)
    }
}
