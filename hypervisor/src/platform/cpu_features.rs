//! CPU features the hypervisor reports and depends on, decoded from the ID
//! registers, and merged over every CPU into system-wide capabilities.
//!
//! Decoding: the raw `ID_AA64*_EL1` values are read on each CPU as it comes up
//! (by `arch::boot`); [`CpuFeatures::from_id_registers`] reads the named
//! fields (`tock-registers` bitfields below) into one value per CPU, and the
//! TLB maintenance fields (range TLBI, TTL, VMID width) through
//! [`tlb::TlbCaps::from_id_registers`], so they are decoded in one place. The
//! `aarch64-cpu` crate's register definitions are not used for this: they
//! lack fields the hypervisor needs (`ID_AA64PFR0_EL1.GIC`, `ID_AA64PFR1_EL1.SME`, `ID_AA64MMFR0_EL1.FGT`,
//! `ID_AA64MMFR1_EL1.HCX`), and decoding must also run on the host in tests.
//!
//! Merging: on a heterogeneous (big.LITTLE) machine the CPUs may differ, so
//! the hypervisor uses the system-wide minimum: [`CpuFeatures::merge`] takes
//! the smaller PA range and VMID width and a feature only when both sides have
//! it. It is commutative, associative and idempotent, so the result does not
//! depend on the order CPUs come up in.
//!
//! Late CPUs: a few capabilities are relied on before the secondary CPUs
//! start, on the boot CPU's word: the EL2 stage-1 `TCR_EL2.PS` (the boot CPU's
//! `PARange`, at most 48 bits, copied to every secondary), the 4 KiB
//! translation granule, the GICv3 system-register interface (the host GIC
//! is set up through it, and every vCPU uses its list registers), and
//! FEAT_MTE2 (the EL2 map gives RAM the Tagged Normal type, `arch::boot`).
//! [`SystemFeatures::new`] records those as the requirement;
//! [`SystemFeatures::check`] tells whether a secondary covers it
//! ([`CpuFeatures::covers`]), and lists what it lacks otherwise, so that CPU is
//! reported and left offline. Everything else (range TLBI, TTL, VMID width,
//! FWB, the stage-2 PA size) is decided only after every CPU is up, when the
//! VM is built, so a CPU with less of it lowers the system value instead of
//! being refused.

use alloc::vec::Vec;
use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// `ID_AA64MMFR0_EL1`.
    MMFR0 [
        /// FEAT_FGT.
        FGT OFFSET(56) NUMBITS(4) [],
        /// 4 KiB granule at stage 2: 0 as `TGran4`, 1 not supported.
        TGran4_2 OFFSET(40) NUMBITS(4) [],
        /// 4 KiB granule at stage 1: 0 or 1 supported, 0xf not.
        TGran4 OFFSET(28) NUMBITS(4) [],
        /// Physical address range.
        PARange OFFSET(0) NUMBITS(4) []
    ],
    /// `ID_AA64MMFR1_EL1`.
    MMFR1 [
        /// FEAT_HCX.
        HCX OFFSET(40) NUMBITS(4) [],
        /// FEAT_VHE.
        VH OFFSET(8) NUMBITS(4) []
    ],
    /// `ID_AA64MMFR2_EL1`.
    MMFR2 [
        /// FEAT_S2FWB.
        FWB OFFSET(40) NUMBITS(4) []
    ],
    /// `ID_AA64PFR0_EL1`.
    PFR0 [
        /// FEAT_SVE.
        SVE OFFSET(32) NUMBITS(4) [],
        /// GIC system-register interface: 1 GICv3/v4, 3 GICv4.1.
        GIC OFFSET(24) NUMBITS(4) []
    ],
    /// `ID_AA64PFR1_EL1`.
    PFR1 [
        /// FEAT_SME.
        SME OFFSET(24) NUMBITS(4) [],
        /// FEAT_MTE: 1 the instructions only, 2 (FEAT_MTE2) tag memory and
        /// tag checks, 3 (FEAT_MTE3) asymmetric checks too.
        MTE OFFSET(8) NUMBITS(4) []
    ]
}

/// The `PARange` value for 48 bits: the most the EL2 stage-1 tables use
/// (`TCR_EL2.PS = min(PARange, 48 bits)` at entry).
pub const PA_RANGE_48: u8 = 5;

/// The features of one CPU, or the system-wide minimum of several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    /// Physical address bits (`ID_AA64MMFR0_EL1.PARange`).
    pub pa_bits: u8,
    /// The `PARange` field itself (the value for `TCR_EL2.PS`/`VTCR_EL2.PS`);
    /// reserved values read as 48 bits (5).
    pub pa_range: u8,
    /// VMID width: 8 or 16 (`ID_AA64MMFR1_EL1.VMIDBits`).
    pub vmid_bits: u8,
    /// FEAT_TLBIRANGE (`ID_AA64ISAR0_EL1.TLB` = 2).
    pub tlbi_range: bool,
    /// FEAT_VHE (`ID_AA64MMFR1_EL1.VH`); reported, not used (the hypervisor
    /// runs without `HCR_EL2.E2H`).
    pub vhe: bool,
    /// FEAT_TTL (`ID_AA64MMFR2_EL1.TTL`).
    pub ttl: bool,
    /// FEAT_S2FWB (`ID_AA64MMFR2_EL1.FWB`).
    pub fwb: bool,
    /// GICv3+ system-register interface (`ID_AA64PFR0_EL1.GIC`).
    pub gic_sysregs: bool,
    /// The 4 KiB translation granule at stage 1 and stage 2
    /// (`ID_AA64MMFR0_EL1.TGran4`, `TGran4_2`).
    pub granule_4k: bool,
    /// FEAT_SVE (`ID_AA64PFR0_EL1.SVE`).
    pub sve: bool,
    /// FEAT_SME (`ID_AA64PFR1_EL1.SME`).
    pub sme: bool,
    /// FEAT_FGT: fine-grained trap registers exist (`ID_AA64MMFR0_EL1.FGT`).
    pub fgt: bool,
    /// FEAT_HCX: `HCRX_EL2` exists (`ID_AA64MMFR1_EL1.HCX`).
    pub hcx: bool,
    /// FEAT_MTE2: allocation tags in memory and tag checks
    /// (`ID_AA64PFR1_EL1.MTE` at least 2). Instructions-only FEAT_MTE (1)
    /// counts as none: guests get memory tagging only with tag storage.
    pub mte: bool,
}

/// Physical address bits for a `PARange` value (reserved values as 48).
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

/// Something a CPU lacks that the system relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortfall {
    /// Fewer physical address bits than the system uses.
    PaBits {
        /// The CPU's.
        has: u8,
        /// The system's.
        needs: u8,
    },
    /// A narrower VMID than the system uses.
    VmidBits {
        /// The CPU's.
        has: u8,
        /// The system's.
        needs: u8,
    },
    /// A feature the CPU does not have (its name).
    Missing(&'static str),
}

impl core::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::PaBits { has, needs } => write!(f, "PA bits {has} (system uses {needs})"),
            Self::VmidBits { has, needs } => write!(f, "VMID bits {has} (system uses {needs})"),
            Self::Missing(name) => write!(f, "no {name}"),
        }
    }
}

/// Why a CPU is left offline: everything it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection(pub Vec<Shortfall>);

impl core::fmt::Display for Rejection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

impl core::error::Error for Rejection {}

impl CpuFeatures {
    /// The least a CPU can have: 32-bit PA, 8-bit VMIDs, no optional feature.
    /// Every CPU covers it; it is the starting point of a requirement.
    pub const NOTHING: Self = Self {
        pa_bits: 32,
        pa_range: 0,
        vmid_bits: 8,
        tlbi_range: false,
        vhe: false,
        ttl: false,
        fwb: false,
        gic_sysregs: false,
        granule_4k: false,
        sve: false,
        sme: false,
        fgt: false,
        hcx: false,
        mte: false,
    };

    /// Decodes the features from raw ID register values.
    pub fn from_id_registers(
        isar0: u64,
        mmfr0: u64,
        mmfr1: u64,
        mmfr2: u64,
        pfr0: u64,
        pfr1: u64,
    ) -> Self {
        // The TLB fields (range, TTL, VMID width) are decoded by the `tlb` crate.
        let tlb = tlb::TlbCaps::from_id_registers(isar0, mmfr1, mmfr2);
        let mmfr0 = LocalRegisterCopy::<u64, MMFR0::Register>::new(mmfr0);
        let mmfr1 = LocalRegisterCopy::<u64, MMFR1::Register>::new(mmfr1);
        let mmfr2 = LocalRegisterCopy::<u64, MMFR2::Register>::new(mmfr2);
        let pfr0 = LocalRegisterCopy::<u64, PFR0::Register>::new(pfr0);
        let pfr1 = LocalRegisterCopy::<u64, PFR1::Register>::new(pfr1);
        let pa_range = match mmfr0.read(MMFR0::PARange) as u8 {
            r @ 0..=6 => r,
            _ => PA_RANGE_48,
        };
        let tgran4 = mmfr0.read(MMFR0::TGran4);
        let tgran4_2 = mmfr0.read(MMFR0::TGran4_2);
        Self {
            pa_bits: pa_bits(pa_range),
            pa_range,
            vmid_bits: tlb.vmid_bits,
            tlbi_range: tlb.range,
            vhe: mmfr1.read(MMFR1::VH) != 0,
            ttl: tlb.ttl,
            fwb: mmfr2.read(MMFR2::FWB) != 0,
            gic_sysregs: pfr0.read(PFR0::GIC) != 0,
            granule_4k: tgran4 <= 1 && (tgran4_2 >= 2 || tgran4_2 == 0),
            sve: pfr0.read(PFR0::SVE) != 0,
            sme: pfr1.read(PFR1::SME) != 0,
            fgt: mmfr0.read(MMFR0::FGT) != 0,
            hcx: mmfr1.read(MMFR1::HCX) != 0,
            mte: pfr1.read(PFR1::MTE) >= 2,
        }
    }

    /// The optional features by name, in banner order.
    fn flags(&self) -> [(&'static str, bool); 11] {
        [
            ("FEAT_TLBIRANGE", self.tlbi_range),
            ("VHE", self.vhe),
            ("FEAT_TTL", self.ttl),
            ("FEAT_S2FWB", self.fwb),
            ("GICv3 system registers", self.gic_sysregs),
            ("4 KiB granule", self.granule_4k),
            ("SVE", self.sve),
            ("SME", self.sme),
            ("FEAT_FGT", self.fgt),
            ("FEAT_HCX", self.hcx),
            ("FEAT_MTE2", self.mte),
        ]
    }

    /// The system-wide minimum of two CPUs: the smaller PA range and VMID
    /// width, each feature only when both have it.
    #[must_use]
    pub fn merge(self, other: Self) -> Self {
        let pa_range = self.pa_range.min(other.pa_range);
        Self {
            pa_bits: pa_bits(pa_range),
            pa_range,
            vmid_bits: self.vmid_bits.min(other.vmid_bits),
            tlbi_range: self.tlbi_range && other.tlbi_range,
            vhe: self.vhe && other.vhe,
            ttl: self.ttl && other.ttl,
            fwb: self.fwb && other.fwb,
            gic_sysregs: self.gic_sysregs && other.gic_sysregs,
            granule_4k: self.granule_4k && other.granule_4k,
            sve: self.sve && other.sve,
            sme: self.sme && other.sme,
            fgt: self.fgt && other.fgt,
            hcx: self.hcx && other.hcx,
            mte: self.mte && other.mte,
        }
    }

    /// Whether this CPU has at least everything `required` has, field by
    /// field (equivalently: merging it into `required` changes nothing).
    pub fn covers(&self, required: &Self) -> bool {
        self.shortfalls(required).is_empty()
    }

    /// What this CPU lacks of `required`, field by field.
    pub fn shortfalls(&self, required: &Self) -> Vec<Shortfall> {
        let mut out = Vec::new();
        if self.pa_range < required.pa_range {
            out.push(Shortfall::PaBits {
                has: self.pa_bits,
                needs: required.pa_bits,
            });
        }
        if self.vmid_bits < required.vmid_bits {
            out.push(Shortfall::VmidBits {
                has: self.vmid_bits,
                needs: required.vmid_bits,
            });
        }
        for ((name, has), (_, needs)) in self.flags().into_iter().zip(required.flags()) {
            if needs && !has {
                out.push(Shortfall::Missing(name));
            }
        }
        out
    }

    /// The TLB maintenance these features allow.
    pub fn tlb_caps(&self) -> tlb::TlbCaps {
        tlb::TlbCaps {
            range: self.tlbi_range,
            ttl: self.ttl,
            vmid_bits: self.vmid_bits,
        }
    }
}

/// The system-wide capabilities: the minimum over every CPU admitted so far,
/// and what any further CPU must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemFeatures {
    merged: CpuFeatures,
    required: CpuFeatures,
}

impl SystemFeatures {
    /// The system as the boot CPU starts it: its features, and the
    /// requirement it fixes before secondaries start (the EL2 stage-1 PA
    /// size, at most 48 bits; the 4 KiB granule; the GICv3 system-register
    /// interface if the boot CPU uses it; FEAT_MTE2 if the boot CPU has it,
    /// since the EL2 stage-1 map then gives RAM the Tagged Normal memory
    /// type, which a CPU without it does not know).
    pub fn new(boot: CpuFeatures) -> Self {
        let pa_range = boot.pa_range.min(PA_RANGE_48);
        let required = CpuFeatures {
            pa_bits: pa_bits(pa_range),
            pa_range,
            granule_4k: boot.granule_4k,
            gic_sysregs: boot.gic_sysregs,
            mte: boot.mte,
            ..CpuFeatures::NOTHING
        };
        Self {
            merged: boot,
            required,
        }
    }

    /// What a late CPU must have.
    pub fn required(&self) -> CpuFeatures {
        self.required
    }

    /// The system-wide capabilities of the CPUs admitted so far.
    pub fn features(&self) -> CpuFeatures {
        self.merged
    }

    /// Whether a CPU with `cpu`'s features may join (see [`Self::admit`]).
    pub fn check(required: &CpuFeatures, cpu: &CpuFeatures) -> Result<(), Rejection> {
        let shortfalls = cpu.shortfalls(required);
        if shortfalls.is_empty() {
            Ok(())
        } else {
            Err(Rejection(shortfalls))
        }
    }

    /// Admits a CPU that covers the requirement, lowering the system-wide
    /// capabilities to what it has; refuses one that does not, unchanged.
    pub fn admit(&mut self, cpu: CpuFeatures) -> Result<(), Rejection> {
        Self::check(&self.required, &cpu)?;
        self.merged = self.merged.merge(cpu);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn qemu_max() -> CpuFeatures {
        let isar0 = 2u64 << 56;
        let mmfr0 = 5 | (1 << 56) | (2 << 40); // 48-bit PA, FGT, 4 KiB at stage 2
        let mmfr1 = (2 << 4) | (1 << 8) | (1 << 40);
        let mmfr2 = (1 << 48) | (1 << 40);
        let pfr0 = (1 << 24) | (1 << 32);
        let pfr1 = (1 << 24) | (2 << 8);
        CpuFeatures::from_id_registers(isar0, mmfr0, mmfr1, mmfr2, pfr0, pfr1)
    }

    fn cortex_a57() -> CpuFeatures {
        CpuFeatures::from_id_registers(0, 2, 0, 0, 1 << 24, 0)
    }

    #[test]
    fn qemu_max_like() {
        assert_eq!(
            qemu_max(),
            CpuFeatures {
                pa_bits: 48,
                pa_range: 5,
                vmid_bits: 16,
                tlbi_range: true,
                vhe: true,
                ttl: true,
                fwb: true,
                gic_sysregs: true,
                granule_4k: true,
                sve: true,
                sme: true,
                fgt: true,
                hcx: true,
                mte: true,
            }
        );
    }

    #[test]
    fn cortex_a57_like() {
        let f = cortex_a57();
        assert_eq!(f.pa_bits, 40);
        assert_eq!(f.vmid_bits, 8);
        assert!(!f.tlbi_range && !f.vhe && !f.ttl && !f.fwb && !f.sve && !f.sme);
        assert!(!f.fgt && !f.hcx && !f.mte);
        assert!(f.gic_sysregs && f.granule_4k);
        // Instructions-only FEAT_MTE is no memory tagging.
        assert!(!CpuFeatures::from_id_registers(0, 2, 0, 0, 0, 1 << 8).mte);
        assert!(CpuFeatures::from_id_registers(0, 2, 0, 0, 0, 3 << 8).mte);
        assert_eq!(pa_bits(6), 52);
    }

    #[test]
    fn granule_and_reserved_pa_range() {
        let no_4k = CpuFeatures::from_id_registers(0, 0xf << 28, 0, 0, 0, 0);
        assert!(!no_4k.granule_4k);
        let no_4k_s2 = CpuFeatures::from_id_registers(0, 1 << 40, 0, 0, 0, 0);
        assert!(!no_4k_s2.granule_4k);
        let reserved = CpuFeatures::from_id_registers(0, 0xe, 0, 0, 0, 0);
        assert_eq!((reserved.pa_range, reserved.pa_bits), (5, 48));
    }

    #[test]
    fn big_little_merge() {
        let merged = qemu_max().merge(cortex_a57());
        assert_eq!(merged, cortex_a57().merge(qemu_max()));
        assert_eq!(
            (merged.pa_bits, merged.pa_range, merged.vmid_bits),
            (40, 2, 8)
        );
        assert!(!merged.tlbi_range && !merged.ttl && !merged.fwb);
        assert!(merged.gic_sysregs);
        assert_eq!(merged.tlb_caps(), tlb::TlbCaps::BASELINE);
    }

    #[test]
    fn little_core_lowers_the_system_but_joins() {
        let mut system = SystemFeatures::new(cortex_a57());
        // The boot CPU fixes its 40-bit EL2 PA size; a big core covers it.
        assert_eq!(system.admit(qemu_max()), Ok(()));
        assert_eq!(system.features(), cortex_a57());

        let mut system = SystemFeatures::new(qemu_max());
        assert_eq!(
            system.required().pa_bits,
            48,
            "the EL2 tables use at most 48 bits"
        );
        // A core without range TLBI, TTL, FWB or 16-bit VMIDs, but with the
        // boot CPU's PA size and GIC interface, lowers the system values.
        let little = CpuFeatures {
            tlbi_range: false,
            ttl: false,
            fwb: false,
            vmid_bits: 8,
            ..qemu_max()
        };
        assert_eq!(system.admit(little), Ok(()));
        assert!(!system.features().tlbi_range);
        assert_eq!(system.features().vmid_bits, 8);
        assert!(!system.features().tlb_caps().range);
    }

    #[test]
    fn late_cpu_without_what_the_boot_cpu_fixed_is_refused() {
        let mut system = SystemFeatures::new(qemu_max());
        let before = system;
        // Cortex-A57-like: 40-bit PA below the 48 bits TCR_EL2 uses.
        assert_eq!(
            system.admit(cortex_a57()),
            Err(Rejection(vec![
                Shortfall::PaBits { has: 40, needs: 48 },
                Shortfall::Missing("FEAT_MTE2")
            ]))
        );
        let no_gic = CpuFeatures {
            gic_sysregs: false,
            granule_4k: false,
            ..qemu_max()
        };
        let err = system.admit(no_gic).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "no GICv3 system registers, no 4 KiB granule"
        );
        assert_eq!(system, before, "a refused CPU changes nothing");
        // A boot CPU without the GIC interface does not require it.
        let mut system = SystemFeatures::new(no_gic);
        assert_eq!(system.admit(qemu_max()), Ok(()));
    }

    fn any_features() -> impl Strategy<Value = CpuFeatures> {
        // Every field of interest drawn from its 4-bit range.
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            any::<u8>(),
            any::<bool>(),
        )
            .prop_map(|(a, b, c, d)| {
                let n = |x: u8| u64::from(x & 0xf);
                let isar0 = n(a[0]) << 56;
                let mmfr0 = n(a[1]) | (n(a[2]) << 56) | (n(a[3]) << 40) | (n(a[4]) << 28);
                let mmfr1 = (n(a[5]) << 4) | (n(b[0]) << 8) | (n(b[1]) << 40);
                let mmfr2 = (n(b[2]) << 48) | (n(b[3]) << 40);
                let pfr0 = (n(b[4]) << 32) | (n(b[5]) << 24);
                let pfr1 = n(c) << 24;
                let f = CpuFeatures::from_id_registers(isar0, mmfr0, mmfr1, mmfr2, pfr0, pfr1);
                // Some draws with 16-bit VMIDs, which the field rarely gives.
                if d {
                    CpuFeatures { vmid_bits: 16, ..f }
                } else {
                    f
                }
            })
    }

    proptest! {
        #[test]
        fn merge_is_the_field_wise_minimum(a in any_features(), b in any_features()) {
            let m = a.merge(b);
            prop_assert_eq!(m.pa_range, a.pa_range.min(b.pa_range));
            prop_assert_eq!(m.pa_bits, a.pa_bits.min(b.pa_bits));
            prop_assert_eq!(m.vmid_bits, a.vmid_bits.min(b.vmid_bits));
            for ((fm, fa), fb) in m.flags().into_iter().zip(a.flags()).zip(b.flags()) {
                prop_assert_eq!(fm.1, fa.1 && fb.1, "{}", fm.0);
            }
            prop_assert!(a.covers(&m) && b.covers(&m), "the merge is a lower bound");
        }

        #[test]
        fn merge_is_commutative_associative_idempotent(
            a in any_features(),
            b in any_features(),
            c in any_features(),
        ) {
            prop_assert_eq!(a.merge(b), b.merge(a));
            prop_assert_eq!(a.merge(b).merge(c), a.merge(b.merge(c)));
            prop_assert_eq!(a.merge(a), a);
            prop_assert_eq!(a.merge(CpuFeatures::NOTHING), CpuFeatures::NOTHING);
        }

        #[test]
        fn covers_means_merging_changes_nothing(a in any_features(), r in any_features()) {
            prop_assert_eq!(a.covers(&r), r.merge(a) == r);
            prop_assert!(a.covers(&CpuFeatures::NOTHING));
            prop_assert!(a.covers(&a));
        }

        #[test]
        fn admitted_cpus_give_the_same_system_in_any_order(
            boot in any_features(),
            cpus in proptest::collection::vec(any_features(), 0..6),
        ) {
            let mut forward = SystemFeatures::new(boot);
            let accepted: Vec<bool> = cpus.iter().map(|c| forward.admit(*c).is_ok()).collect();
            let mut backward = SystemFeatures::new(boot);
            for c in cpus.iter().rev() {
                let _ = backward.admit(*c);
            }
            prop_assert_eq!(forward, backward);
            let mut expected = boot;
            for (c, ok) in cpus.iter().zip(&accepted) {
                prop_assert_eq!(*ok, c.covers(&forward.required()));
                if *ok {
                    expected = expected.merge(*c);
                }
            }
            prop_assert_eq!(forward.features(), expected);
            prop_assert!(boot.covers(&forward.required()), "the boot CPU meets its own requirement");
        }
    }
}
