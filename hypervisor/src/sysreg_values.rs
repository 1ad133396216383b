//! The values the hypervisor writes into its control system registers, built
//! from named fields.
//!
//! Each value is the OR of named field values: `aarch64-cpu`'s register
//! definitions (`aarch64_cpu::registers::HCR_EL2::VM`, ...) where the crate
//! has the register and the field, and a local tock-registers
//! `register_bitfields!` block below for what it lacks (the RES1 bits of
//! `SCTLR_EL1`/`SCTLR_EL2`/`CPTR_EL2`/`TCR_EL2`, `CPTR_EL2.TSM`/`TZ`/`TFP`,
//! `CNTHCTL_EL2.ECV`, `PMCR_EL0.N`, `ZCR_EL2.LEN`). The values are `const`
//! where they can be (the boot code feeds `MAIR_EL2`/`TCR_EL2`/`SCTLR_EL2` to
//! `global_asm!`), so they OR the fields' `.value`s instead of adding
//! `FieldValue`s. This module is pure: the unit tests pin every
//! composed value to the bits the architecture prescribes for it, so a
//! wrong or missing field fails a test on the host.

use aarch64_cpu::registers::{CNTHCTL_EL2, HCR_EL2, HFGRTR_EL2, ICC_SRE_EL2, MDCR_EL2};
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// `SCTLR_EL1` fields `aarch64-cpu` does not name: the bits that are RES1
    /// without the features that give them a meaning, and that the reset value
    /// sets.
    SCTLR_EL1_EXTRA [
        /// `EOS` (RES1 without FEAT_ExS): exception return is context synchronizing.
        EOS OFFSET(11) NUMBITS(1) [],
        /// `TSCXT` (RES1 without FEAT_CSV2_2/FEAT_CSV2_1p2).
        TSCXT OFFSET(20) NUMBITS(1) [],
        /// `EIS` (RES1 without FEAT_ExS): exception entry is context synchronizing.
        EIS OFFSET(22) NUMBITS(1) [],
        /// `SPAN` (RES1 without FEAT_PAN): PSTATE.PAN is left unchanged on an
        /// exception to EL1.
        SPAN OFFSET(23) NUMBITS(1) [],
        /// `nTLSMD` (RES1 without FEAT_LSMAOC).
        NTLSMD OFFSET(28) NUMBITS(1) [],
        /// `LSMAOE` (RES1 without FEAT_LSMAOC).
        LSMAOE OFFSET(29) NUMBITS(1) [],
    ],
    /// `SCTLR_EL2` (`HCR_EL2.E2H` = 0) fields `aarch64-cpu` does not name: bits
    /// RES1 in the non-VHE layout.
    SCTLR_EL2_EXTRA [
        /// Bit 4 (RES1 without VHE).
        RES1_4 OFFSET(4) NUMBITS(1) [],
        /// Bit 5 (RES1 without VHE).
        RES1_5 OFFSET(5) NUMBITS(1) [],
        /// `EOS` (RES1 without FEAT_ExS).
        EOS OFFSET(11) NUMBITS(1) [],
        /// Bit 16 (RES1 without VHE).
        RES1_16 OFFSET(16) NUMBITS(1) [],
        /// Bit 18 (RES1 without VHE).
        RES1_18 OFFSET(18) NUMBITS(1) [],
        /// `EIS` (RES1 without FEAT_ExS).
        EIS OFFSET(22) NUMBITS(1) [],
        /// Bit 23 (RES1 without VHE).
        RES1_23 OFFSET(23) NUMBITS(1) [],
        /// Bit 28 (RES1 without VHE).
        RES1_28 OFFSET(28) NUMBITS(1) [],
        /// Bit 29 (RES1 without VHE).
        RES1_29 OFFSET(29) NUMBITS(1) [],
    ],
    /// `CPTR_EL2` in its non-VHE layout (`aarch64-cpu` names only `TAM`).
    CPTR_EL2 [
        /// Bits \[7:0\], RES1.
        RES1_LOW OFFSET(0) NUMBITS(8) [],
        /// `TZ`: trap SVE.
        TZ OFFSET(8) NUMBITS(1) [],
        /// Bit 9, RES1.
        RES1_9 OFFSET(9) NUMBITS(1) [],
        /// `TFP`: trap FP/SIMD.
        TFP OFFSET(10) NUMBITS(1) [],
        /// `TSM`: trap SME (RES1 without FEAT_SME).
        TSM OFFSET(12) NUMBITS(1) [],
        /// Bit 13, RES1.
        RES1_13 OFFSET(13) NUMBITS(1) [],
    ],
    /// `CNTHCTL_EL2` fields `aarch64-cpu` does not name.
    CNTHCTL_EL2_EXTRA [
        /// `ECV` (FEAT_ECV): apply `CNTPOFF_EL2` to the EL1 physical counter.
        ECV OFFSET(12) NUMBITS(1) [],
    ],
    /// `ZCR_EL2` and `SMCR_EL2` (same `LEN` field; not in `aarch64-cpu`).
    VECTOR_LENGTH_CONTROL [
        /// `LEN`: the vector length in 128-bit units minus one, capped by the CPU.
        LEN OFFSET(0) NUMBITS(4) [],
    ],
    /// `TCR_EL2` (`HCR_EL2.E2H` = 0) fields `aarch64-cpu` does not name.
    TCR_EL2_EXTRA [
        /// Bit 23, RES1.
        RES1_23 OFFSET(23) NUMBITS(1) [],
        /// Bit 31, RES1.
        RES1_31 OFFSET(31) NUMBITS(1) [],
    ],
    /// `PMCR_EL0` (not in `aarch64-cpu`).
    PMCR_EL0 [
        /// `N`: the number of event counters.
        N OFFSET(11) NUMBITS(5) [],
    ]
}

/// `HCR_EL2` for a non-VHE hypervisor running AArch64 EL1 guests: stage 2
/// (VM), set/way invalidation as clean+invalidate (SWIO), physical FIQ/IRQ/
/// SError to EL2 (FMO/IMO/AMO), trap the ID registers (TID3: the guest sees
/// them through `crate::exit::sysreg::guest_id_value`), trap SMC (TSC), EL1 is
/// AArch64 (RW), do not trap pointer authentication (APK/API). WFI/WFE run
/// natively (TWI/TWE clear). The guest's local TLB and cache maintenance and
/// barriers stay local (no FB, no BSU upgrade): a vCPU never leaves its CPU,
/// so what it cached elsewhere cannot exist, exactly as on real hardware.
/// `FWB`, `TSW` and `TVM` are added per VM ([`hcr_el2_guest`] and
/// `crate::stage2::cache_maint`).
pub const HCR_EL2_GUEST: u64 = HCR_EL2::VM::Enable.value
    | HCR_EL2::SWIO::SET.value
    | HCR_EL2::FMO::EnableVirtualFIQ.value
    | HCR_EL2::IMO::EnableVirtualIRQ.value
    | HCR_EL2::AMO::SET.value
    | HCR_EL2::TID3::SET.value
    | HCR_EL2::TSC::EnableTrapEl1SmcToEl2.value
    | HCR_EL2::RW::EL1IsAarch64.value
    | HCR_EL2::APK::DisableTrapPointerAuthKeyRegsToEl2.value
    | HCR_EL2::API::DisableTrapPointerAuthInstToEl2.value;

/// `HCR_EL2` of a VM: [`HCR_EL2_GUEST`], `FWB` when stage 2 forces the memory
/// type (FEAT_S2FWB), the set/way trap without it, and `ATA` for a VM with
/// memory tagging (`mte`): its EL1 and EL0 may access allocation tags and
/// `GCR_EL1`, `RGSR_EL1`, `TFSR_EL1` and `TFSRE0_EL1` without a trap.
pub fn hcr_el2_guest(fwb: bool, mte: bool) -> u64 {
    let fwb_bit = if fwb { HCR_EL2::FWB::SET.value } else { 0 };
    let ata = if mte { HCR_EL2::ATA::SET.value } else { 0 };
    HCR_EL2_GUEST | fwb_bit | ata | crate::stage2::cache_maint::hcr_trap_bits(fwb)
}

/// `CPTR_EL2` (non-VHE) trapping nothing the CPU has: the RES1 bits, `TZ` and
/// `TFP` clear (SVE and FP/SIMD run natively), and `TSM` set (trap SME) unless
/// the CPU has SME (where it is a trap control, not RES1).
pub fn cptr_el2_guest(sme: bool) -> u64 {
    let res1 = CPTR_EL2::RES1_LOW.mask << CPTR_EL2::RES1_LOW.shift
        | CPTR_EL2::RES1_9::SET.value
        | CPTR_EL2::RES1_13::SET.value;
    let tsm = if sme { 0 } else { CPTR_EL2::TSM::SET.value };
    res1 | tsm
}

/// `CNTHCTL_EL2` while a guest runs: both counters and the virtual timer
/// belong to the guest, untrapped (`EL1PCTEN`); the EL1 physical timer's
/// registers trap (`EL1PCEN` clear) so that a write that drops its line
/// withdraws its pending interrupt at once (see `crate::devices::timer`).
/// Every other field is clear: no event stream, and `ECV` clear so that
/// `CNTPOFF_EL2` is not applied on a CPU with FEAT_ECV: the physical offset is
/// zero, like `CNTVOFF_EL2`, and the guest's two counters read the same value.
pub const CNTHCTL_EL2_GUEST: u64 = CNTHCTL_EL2::EL1PCTEN::SET.value;

/// `SCTLR_EL1` as after a reset: the RES1 bits, MMU and caches off.
pub const SCTLR_EL1_RESET: u64 = SCTLR_EL1_EXTRA::EOS::SET.value
    | SCTLR_EL1_EXTRA::TSCXT::SET.value
    | SCTLR_EL1_EXTRA::EIS::SET.value
    | SCTLR_EL1_EXTRA::SPAN::SET.value
    | SCTLR_EL1_EXTRA::NTLSMD::SET.value
    | SCTLR_EL1_EXTRA::LSMAOE::SET.value;

/// `SCTLR_EL2` of the hypervisor: the non-VHE RES1 bits, `M` (MMU), `C` (data
/// cache), `SA` (stack alignment check), `I` (instruction cache).
pub const SCTLR_EL2_VALUE: u64 = {
    use aarch64_cpu::registers::SCTLR_EL2;
    SCTLR_EL2_EXTRA::RES1_4::SET.value
        | SCTLR_EL2_EXTRA::RES1_5::SET.value
        | SCTLR_EL2_EXTRA::EOS::SET.value
        | SCTLR_EL2_EXTRA::RES1_16::SET.value
        | SCTLR_EL2_EXTRA::RES1_18::SET.value
        | SCTLR_EL2_EXTRA::EIS::SET.value
        | SCTLR_EL2_EXTRA::RES1_23::SET.value
        | SCTLR_EL2_EXTRA::RES1_28::SET.value
        | SCTLR_EL2_EXTRA::RES1_29::SET.value
        | SCTLR_EL2::M::Enable.value
        | SCTLR_EL2::C::Cacheable.value
        | SCTLR_EL2::SA::Enable.value
        | SCTLR_EL2::I::Cacheable.value
};

/// `MAIR_EL2` of the hypervisor: index 0 Device-nGnRE, index 1 Normal
/// write-back non-transient read/write-allocate (inner and outer).
pub const MAIR_EL2_VALUE: u64 = {
    use aarch64_cpu::registers::MAIR_EL2;
    MAIR_EL2::Attr0_Device::nonGathering_nonReordering_EarlyWriteAck.value
        | MAIR_EL2::Attr1_Normal_Outer::WriteBack_NonTransient_ReadWriteAlloc.value
        | MAIR_EL2::Attr1_Normal_Inner::WriteBack_NonTransient_ReadWriteAlloc.value
};

/// The `Attr<n>` encoding of Tagged Normal memory (FEAT_MTE2): inner and
/// outer write-back non-transient read/write-allocate, with allocation tags.
/// A reserved encoding without FEAT_MTE2.
const MAIR_ATTR_TAGGED_NORMAL: u64 = 0xf0;

/// `MAIR_EL2` on a host with memory tagging: [`MAIR_EL2_VALUE`] with index 1
/// (all of RAM) Tagged Normal, so that the hypervisor can clear and copy
/// the allocation tags of guest pages (`arch::cpu::memory_tagging`).
pub const MAIR_EL2_TAGGED: u64 = (MAIR_EL2_VALUE & !(0xff << 8)) | MAIR_ATTR_TAGGED_NORMAL << 8;

/// `SCTLR_EL2.ATA` (FEAT_MTE2, non-VHE layout, bit 43): EL2 may access
/// allocation tags. `SCTLR_EL2.TCF` stays 0: the hypervisor's own accesses
/// are never tag checked.
pub const SCTLR_EL2_ATA: u64 = 1 << 43;

/// `TCR_EL2` of the hypervisor without `PS` (the boot code adds the CPU's
/// physical address size): `T0SZ` = 16 (48-bit VA, start level 0), inner and
/// outer write-back read/write-allocate walks, inner shareable, 4 KiB
/// granule, and the RES1 bits 23 and 31.
pub const TCR_EL2_BASE: u64 = {
    use aarch64_cpu::registers::TCR_EL2;
    TCR_EL2::T0SZ.val(16).value
        | TCR_EL2::IRGN0::WriteBack_ReadAlloc_WriteAlloc_Cacheable.value
        | TCR_EL2::ORGN0::WriteBack_ReadAlloc_WriteAlloc_Cacheable.value
        | TCR_EL2::SH0::Inner.value
        | TCR_EL2::TG0::KiB_4.value
        | TCR_EL2_EXTRA::RES1_23::SET.value
        | TCR_EL2_EXTRA::RES1_31::SET.value
};

/// `ICC_SRE_EL2`: the system-register interface at EL2 (`SRE`) and for EL1
/// (`Enable`).
pub const ICC_SRE_EL2_VALUE: u64 = ICC_SRE_EL2::SRE::SET.value | ICC_SRE_EL2::ENABLE::SET.value;

/// `MDCR_EL2` giving the guest all event counters of the PMU (`HPMN` =
/// `PMCR_EL0.N` of `pmcr`; no other trap), or 0 without a PMU (`pmcr` `None`).
pub fn mdcr_el2_guest(pmcr: Option<u64>) -> u64 {
    let counters = pmcr.map_or(0, |pmcr| PMCR_EL0::N.read(pmcr));
    MDCR_EL2::HPMN.val(counters).value
}

/// `HFGRTR_EL2` and `HFGWTR_EL2` trapping nothing: their negative fields
/// `nSMPRI_EL1` and `nTPIDR2_EL0` (FEAT_SME) trap when clear, so they are set
/// on a CPU with SME (RES0 without it).
pub fn fine_grained_read_write_traps_none(sme: bool) -> u64 {
    if sme {
        HFGRTR_EL2::nSMPRI_EL1::SET.value | HFGRTR_EL2::nTPIDR2_EL0::SET.value
    } else {
        0
    }
}

/// `ZCR_EL2`/`SMCR_EL2` `LEN` asking for the longest vector the CPU has (the
/// CPU caps it).
pub const VECTOR_LEN_MAX: u64 = VECTOR_LENGTH_CONTROL::LEN.mask;

#[cfg(test)]
mod tests {
    use super::*;
    use aarch64_cpu::registers::HFGWTR_EL2;

    /// Bit numbers to a value.
    fn bits(list: &[u32]) -> u64 {
        list.iter().fold(0, |acc, bit| acc | 1 << bit)
    }

    #[test]
    fn hcr_el2_has_exactly_the_documented_fields() {
        // VM, SWIO, FMO, IMO, AMO, TID3, TSC, RW, APK, API.
        assert_eq!(HCR_EL2_GUEST, bits(&[0, 1, 3, 4, 5, 18, 19, 31, 40, 41]));
        assert_eq!(HCR_EL2_GUEST, 0x0000_0300_800c_003b);
        // WFI/WFE are not trapped, no VHE, no TGE.
        assert_eq!(HCR_EL2_GUEST & bits(&[13, 14, 27, 34]), 0);
    }

    #[test]
    fn hcr_el2_per_vm_adds_fwb_or_the_set_way_trap() {
        // FWB is bit 46; TSW (bit 22) only without it.
        assert_eq!(hcr_el2_guest(true, false), HCR_EL2_GUEST | 1 << 46);
        assert_eq!(hcr_el2_guest(false, false), HCR_EL2_GUEST | 1 << 22);
        assert_eq!(hcr_el2_guest(true, true), HCR_EL2_GUEST | 1 << 46 | 1 << 56);
    }

    #[test]
    fn cptr_el2_traps_only_sme_without_sme() {
        assert_eq!(cptr_el2_guest(false), 0x32ff);
        assert_eq!(cptr_el2_guest(true), 0x22ff);
        // TZ (8) and TFP (10) clear either way.
        assert_eq!(cptr_el2_guest(false) & bits(&[8, 10]), 0);
    }

    #[test]
    fn cnthctl_el2_leaves_counters_to_the_guest_and_traps_the_physical_timer() {
        assert_eq!(CNTHCTL_EL2_GUEST, 0b01);
        assert_eq!(CNTHCTL_EL2_GUEST & CNTHCTL_EL2_EXTRA::ECV::SET.value, 0);
    }

    #[test]
    fn sctlr_el1_reset_is_res1_with_mmu_and_caches_off() {
        assert_eq!(SCTLR_EL1_RESET, 0x30d0_0800);
        assert_eq!(SCTLR_EL1_RESET & bits(&[0, 2, 12]), 0);
    }

    #[test]
    fn sctlr_el2_is_res1_with_mmu_caches_and_stack_alignment() {
        assert_eq!(SCTLR_EL2_VALUE, 0x30c5_0830 | bits(&[0, 2, 3, 12]));
    }

    #[test]
    fn mair_el2_is_device_ngnre_and_normal_write_back() {
        assert_eq!(MAIR_EL2_VALUE, 0x04 | 0xff << 8);
        assert_eq!(MAIR_EL2_TAGGED, 0x04 | 0xf0 << 8);
    }

    #[test]
    fn tcr_el2_is_48_bit_4k_write_back_inner_shareable() {
        assert_eq!(
            TCR_EL2_BASE,
            16 | 1 << 8 | 1 << 10 | 3 << 12 | 1 << 23 | 1 << 31
        );
    }

    #[test]
    fn icc_sre_el2_enables_the_system_register_interface() {
        assert_eq!(ICC_SRE_EL2_VALUE, 0x9);
    }

    #[test]
    fn mdcr_el2_is_hpmn_only() {
        // PMCR_EL0.N is bits [15:11]; HPMN is bits [4:0].
        assert_eq!(mdcr_el2_guest(Some(6 << 11 | 0x41)), 6);
        assert_eq!(mdcr_el2_guest(Some(u64::MAX)), 31);
        assert_eq!(mdcr_el2_guest(None), 0);
    }

    #[test]
    fn fine_grained_traps_set_the_sme_negative_bits_only_with_sme() {
        assert_eq!(fine_grained_read_write_traps_none(true), bits(&[54, 55]));
        assert_eq!(fine_grained_read_write_traps_none(false), 0);
        // HFGWTR_EL2 has the same negative bits in the same places.
        assert_eq!(
            HFGWTR_EL2::nSMPRI_EL1::SET.value | HFGWTR_EL2::nTPIDR2_EL0::SET.value,
            bits(&[54, 55])
        );
    }

    #[test]
    fn vector_length_asks_for_the_longest() {
        assert_eq!(VECTOR_LEN_MAX, 0xf);
    }
}
