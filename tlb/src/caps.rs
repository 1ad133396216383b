//! What the CPU's TLB maintenance can do.
//!
//! The capabilities are decoded from raw ID register values, so the same code
//! runs on a CPU with range invalidation (QEMU `-cpu max`, Neoverse V1) and on
//! one without (Cortex-A57): the caller reads the registers of every CPU at
//! boot, keeps what all of them have, and hands the result around (the
//! hypervisor does this in its CPU feature discovery). Tests and benchmarks
//! name the usual combinations with the constants [`TlbCaps::ALL`],
//! [`TlbCaps::NO_RANGE`] and [`TlbCaps::BASELINE`], and derive the others with
//! [`TlbCaps::without_range`] and [`TlbCaps::without_ttl`].

/// TLB maintenance features of the running CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbCaps {
    /// `FEAT_TLBIRANGE`: `TLBI RIPAS2E1IS` and friends exist.
    pub range: bool,
    /// `FEAT_TTL`: per-IPA operations may carry a translation-table-level hint.
    pub ttl: bool,
    /// VMID width in bits: 8 or 16.
    pub vmid_bits: u8,
}

impl TlbCaps {
    /// Everything: range invalidation, level hints and 16-bit VMIDs (QEMU
    /// `-cpu max`, Neoverse V1).
    pub const ALL: Self = Self {
        range: true,
        ttl: true,
        vmid_bits: 16,
    };

    /// Neither range invalidation nor level hints, 16-bit VMIDs: one page is
    /// one per-IPA operation and anything larger a whole-VMID invalidation.
    pub const NO_RANGE: Self = Self::ALL.without_range().without_ttl();

    /// A CPU with neither range invalidation nor level hints, 8-bit VMIDs:
    /// the most conservative assumption.
    pub const BASELINE: Self = Self {
        range: false,
        ttl: false,
        vmid_bits: 8,
    };

    /// Decodes the capabilities from `ID_AA64ISAR0_EL1` (TLB field, bits
    /// 59:56: 2 means range instructions), `ID_AA64MMFR1_EL1` (VMIDBits, bits
    /// 7:4: 2 means 16-bit VMIDs) and `ID_AA64MMFR2_EL1` (TTL, bits 51:48).
    pub const fn from_id_registers(
        id_aa64isar0: u64,
        id_aa64mmfr1: u64,
        id_aa64mmfr2: u64,
    ) -> Self {
        let tlb = (id_aa64isar0 >> 56) & 0xf;
        let vmid = (id_aa64mmfr1 >> 4) & 0xf;
        let ttl = (id_aa64mmfr2 >> 48) & 0xf;
        Self {
            range: tlb >= 2,
            ttl: ttl >= 1,
            vmid_bits: if vmid == 2 { 16 } else { 8 },
        }
    }

    /// The same capabilities without `FEAT_TLBIRANGE`.
    pub const fn without_range(self) -> Self {
        Self {
            range: false,
            ..self
        }
    }

    /// The same capabilities without `FEAT_TTL` level hints.
    pub const fn without_ttl(self) -> Self {
        Self { ttl: false, ..self }
    }

    /// The number of VMIDs the CPU distinguishes.
    pub const fn vmid_count(&self) -> u32 {
        1 << self.vmid_bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_max_has_range_and_16_bit_vmids() {
        // QEMU 7.2 `-cpu max`: ISAR0.TLB = 2, MMFR1.VMIDBits = 2, MMFR2.TTL = 1.
        let caps = TlbCaps::from_id_registers(0x0221_1000_0000_0000 | (2 << 56), 2 << 4, 1 << 48);
        assert_eq!(caps, TlbCaps::ALL);
        assert_eq!(caps.vmid_count(), 65536);
    }

    #[test]
    fn cortex_a57_has_neither() {
        let caps = TlbCaps::from_id_registers(0x0000_0000_0001_1120, 0, 0);
        assert_eq!(caps, TlbCaps::BASELINE);
    }

    #[test]
    fn named_combinations() {
        assert_eq!(
            TlbCaps::ALL.without_range().without_ttl(),
            TlbCaps::NO_RANGE
        );
        assert_eq!(
            TlbCaps::NO_RANGE,
            TlbCaps::from_id_registers(0, 2 << 4, 0),
            "16-bit VMIDs and nothing else"
        );
    }

    #[test]
    fn outer_shareable_only_is_not_range() {
        let caps = TlbCaps::from_id_registers(1 << 56, 0, 0);
        assert!(!caps.range);
    }
}
