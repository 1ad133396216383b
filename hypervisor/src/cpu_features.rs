//! CPU features the hypervisor reports and depends on, decoded from the ID registers.
//!
//! The raw register values are read once at boot on the boot CPU; this module
//! only decodes fields, so it is tested on the host with known register values
//! (QEMU's `max` and `cortex-a57`).

/// The features read at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    /// Physical address bits (`ID_AA64MMFR0_EL1.PARange`).
    pub pa_bits: u8,
    /// The `PARange` field itself (the value for `TCR_EL2.PS`/`VTCR_EL2.PS`).
    pub pa_range: u8,
    /// VMID width: 8 or 16 (`ID_AA64MMFR1_EL1.VMIDBits`).
    pub vmid_bits: u8,
    /// FEAT_TLBIRANGE (`ID_AA64ISAR0_EL1.TLB` = 2).
    pub tlbi_range: bool,
    /// FEAT_VHE (`ID_AA64MMFR1_EL1.VH`).
    pub vhe: bool,
    /// FEAT_TTL (`ID_AA64MMFR2_EL1.TTL`).
    pub ttl: bool,
    /// FEAT_S2FWB (`ID_AA64MMFR2_EL1.FWB`).
    pub fwb: bool,
    /// GICv3+ system-register interface (`ID_AA64PFR0_EL1.GIC`).
    pub gic_sysregs: bool,
    /// FEAT_SVE (`ID_AA64PFR0_EL1.SVE`).
    pub sve: bool,
    /// FEAT_SME (`ID_AA64PFR1_EL1.SME`).
    pub sme: bool,
    /// FEAT_FGT: fine-grained trap registers exist (`ID_AA64MMFR0_EL1.FGT`).
    pub fgt: bool,
    /// FEAT_HCX: `HCRX_EL2` exists (`ID_AA64MMFR1_EL1.HCX`).
    pub hcx: bool,
}

fn field(reg: u64, shift: u32) -> u8 {
    ((reg >> shift) & 0xf) as u8
}

/// Physical address bits for a `PARange` value (unknown values as 48).
pub fn pa_bits(pa_range: u8) -> u8 {
    match pa_range {
        0 => 32,
        1 => 36,
        2 => 40,
        3 => 42,
        4 => 44,
        6 => 52,
        _ => 48,
    }
}

impl CpuFeatures {
    /// Decodes the features from raw ID register values.
    pub fn from_id_registers(
        isar0: u64,
        mmfr0: u64,
        mmfr1: u64,
        mmfr2: u64,
        pfr0: u64,
        pfr1: u64,
    ) -> Self {
        let pa_range = field(mmfr0, 0);
        Self {
            pa_bits: pa_bits(pa_range),
            pa_range,
            vmid_bits: if field(mmfr1, 4) == 2 { 16 } else { 8 },
            tlbi_range: field(isar0, 56) >= 2,
            vhe: field(mmfr1, 8) != 0,
            ttl: field(mmfr2, 48) != 0,
            fwb: field(mmfr2, 40) != 0,
            gic_sysregs: field(pfr0, 24) != 0,
            sve: field(pfr0, 32) != 0,
            sme: field(pfr1, 24) != 0,
            fgt: field(mmfr0, 56) != 0,
            hcx: field(mmfr1, 40) != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_max_like() {
        let isar0 = 2u64 << 56;
        let mmfr0 = 5 | (1 << 56); // 48-bit PA, FGT
        let mmfr1 = (2 << 4) | (1 << 8) | (1 << 40);
        let mmfr2 = (1 << 48) | (1 << 40);
        let pfr0 = (1 << 24) | (1 << 32);
        let pfr1 = 1 << 24;
        let f = CpuFeatures::from_id_registers(isar0, mmfr0, mmfr1, mmfr2, pfr0, pfr1);
        assert_eq!(
            f,
            CpuFeatures {
                pa_bits: 48,
                pa_range: 5,
                vmid_bits: 16,
                tlbi_range: true,
                vhe: true,
                ttl: true,
                fwb: true,
                gic_sysregs: true,
                sve: true,
                sme: true,
                fgt: true,
                hcx: true,
            }
        );
    }

    #[test]
    fn cortex_a57_like() {
        let f = CpuFeatures::from_id_registers(0, 2, 0, 0, 1 << 24, 0);
        assert_eq!(f.pa_bits, 40);
        assert_eq!(f.vmid_bits, 8);
        assert!(!f.tlbi_range && !f.vhe && !f.ttl && !f.fwb && !f.sve && !f.sme);
        assert!(!f.fgt && !f.hcx);
        assert!(f.gic_sysregs);
        assert_eq!(pa_bits(6), 52);
    }
}
