//! Choosing what a stage-2 fault maps.
//!
//! A guest's first touch of a RAM page faults; the hypervisor then maps the
//! largest naturally aligned leaf (1 GiB, 2 MiB, else 4 KiB) that contains the
//! faulting IPA, lies entirely inside the memslot, and whose backing address
//! has the same alignment as its IPA (a block maps an aligned IPA range onto
//! an equally aligned physical range). Fewer, larger leaves mean fewer faults
//! and fewer TLB entries; guest RAM is backed 2 MiB aligned so that 2 MiB
//! blocks are always possible away from the slot's edges.
//!
//! # A fault on a page that is mapped already
//!
//! Another vCPU may have mapped or relaxed the leaf between this vCPU's fault
//! and its walk, or won the compare-and-swap this vCPU lost. The fault then
//! changes nothing in the table, but it is not harmless: a permission fault
//! means this CPU's TLB may still hold the old, narrower entry, and resuming
//! without invalidating it makes the guest fault again, for ever, on hardware
//! that keeps the entry. As KVM does, [`on_mapped`] answers a permission
//! fault by relaxing the leaf (a no-op in the table if it already allows the
//! access) with a local invalidation of the faulting page. A translation
//! fault needs no invalidation (no TLB holds an invalid entry).

use pgtable::{LEAF_SIZES, Perms};

/// A memslot as the fault path sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView {
    /// First IPA of the slot.
    pub ipa: u64,
    /// Size of the slot in bytes.
    pub size: u64,
    /// Host physical address backing the slot's first byte.
    pub backing: u64,
}

impl SlotView {
    /// True when `ipa` is inside the slot.
    pub fn contains(&self, ipa: u64) -> bool {
        ipa >= self.ipa && ipa - self.ipa < self.size
    }
}

/// One leaf to install for a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultLeaf {
    /// First IPA of the leaf.
    pub ipa: u64,
    /// Host physical address it maps to.
    pub pa: u64,
    /// Size of the leaf: one of [`pgtable::LEAF_SIZES`].
    pub size: u64,
}

/// The leaf to map for a fault at `ipa` in `slot`, no larger than `max_leaf`;
/// `None` when `ipa` is outside the slot.
pub fn fault_leaf(slot: SlotView, ipa: u64, max_leaf: u64) -> Option<FaultLeaf> {
    if !slot.contains(ipa) {
        return None;
    }
    // Largest first: `LEAF_SIZES` lists them smallest first.
    LEAF_SIZES
        .iter()
        .rev()
        .copied()
        .filter(|&size| size <= max_leaf)
        .find_map(|size| {
            let leaf_ipa = ipa & !(size - 1);
            if leaf_ipa < slot.ipa || leaf_ipa - slot.ipa + size > slot.size {
                return None;
            }
            let pa = slot.backing + (leaf_ipa - slot.ipa);
            pa.is_multiple_of(size).then_some(FaultLeaf {
                ipa: leaf_ipa,
                pa,
                size,
            })
        })
}

/// What to do with a fault on an IPA that a leaf with `perms` maps already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappedFault {
    /// Resume the guest: nothing this CPU caches can be stale.
    Resume,
    /// Add these permissions to the leaf (nothing if it has them) and
    /// invalidate the faulting page in this CPU's TLB, then resume.
    RelaxAndInvalidateLocal(Perms),
}

/// Decides what a fault (a permission fault when `permission`, an instruction
/// fetch when `exec`) does on a page mapped with `perms`: see the module
/// documentation.
pub fn on_mapped(permission: bool, exec: bool, perms: Perms) -> MappedFault {
    let wanted = if exec { Perms::EXEC } else { Perms::RW };
    if permission || !perms.contains(wanted) {
        MappedFault::RelaxAndInvalidateLocal(wanted)
    } else {
        MappedFault::Resume
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_fault_on_a_mapped_page() {
        use MappedFault::{RelaxAndInvalidateLocal, Resume};
        // Another vCPU mapped the page first: nothing is cached, resume.
        assert_eq!(on_mapped(false, false, Perms::RW), Resume);
        assert_eq!(on_mapped(false, true, Perms::RWX), Resume);
        // A permission fault on a leaf that allows the access already
        // (another vCPU relaxed it): this CPU's old entry must go.
        assert_eq!(
            on_mapped(true, true, Perms::RWX),
            RelaxAndInvalidateLocal(Perms::EXEC)
        );
        assert_eq!(
            on_mapped(true, false, Perms::RW),
            RelaxAndInvalidateLocal(Perms::RW)
        );
        // A fetch from a leaf without execute permission widens it.
        assert_eq!(
            on_mapped(false, true, Perms::RW),
            RelaxAndInvalidateLocal(Perms::EXEC)
        );
    }

    #[test]
    fn examples() {
        let slot = SlotView {
            ipa: 0x4000_0000,
            size: 128 * MIB,
            backing: 0x4800_0000,
        };
        assert_eq!(
            fault_leaf(slot, 0x4012_3456, 1 << 30),
            Some(FaultLeaf {
                ipa: 0x4000_0000,
                pa: 0x4800_0000,
                size: 2 * MIB
            })
        );
        assert_eq!(fault_leaf(slot, 0x3fff_ffff, 1 << 30), None);
        assert_eq!(fault_leaf(slot, 0x4800_0000, 1 << 30), None);
        assert_eq!(
            fault_leaf(slot, 0x4012_3456, 4096),
            Some(FaultLeaf {
                ipa: 0x4012_3000,
                pa: 0x4812_3000,
                size: 4096
            })
        );
        // Backing only 4 KiB aligned relative to the IPA: pages only.
        let skewed = SlotView {
            ipa: 0x4000_0000,
            size: 128 * MIB,
            backing: 0x4800_1000,
        };
        assert_eq!(
            fault_leaf(skewed, 0x4000_0000, 1 << 30).map(|m| m.size),
            Some(4096)
        );
        // A 1 GiB slot with 1 GiB aligned backing gets a 1 GiB block.
        let big = SlotView {
            ipa: 0x4000_0000,
            size: 1 << 30,
            backing: 0x8000_0000,
        };
        assert_eq!(
            fault_leaf(big, 0x5000_0000, 1 << 30).map(|m| m.size),
            Some(1 << 30)
        );
        // A slot ending mid-block: the tail is mapped with pages.
        let short = SlotView {
            ipa: 0x4000_0000,
            size: 3 * MIB,
            backing: 0x8000_0000,
        };
        assert_eq!(
            fault_leaf(short, 0x4020_0000, 1 << 30).map(|m| m.size),
            Some(4096)
        );
        assert_eq!(
            fault_leaf(short, 0x4000_0000, 1 << 30).map(|m| m.size),
            Some(2 * MIB)
        );
    }

    proptest! {
        #[test]
        fn largest_valid_leaf(
            ipa_page in 0u64..(1 << 20),
            pages in 1u64..(1 << 19),
            backing_page in 0u64..(1 << 22),
            offset in 0u64..(1 << 31),
        ) {
            let slot = SlotView { ipa: ipa_page << 12, size: pages << 12, backing: backing_page << 12 };
            let ipa = slot.ipa + offset % slot.size;
            let m = fault_leaf(slot, ipa, 1 << 30).expect("inside the slot");
            prop_assert!(m.ipa <= ipa && ipa < m.ipa + m.size);
            prop_assert!(m.ipa >= slot.ipa && m.ipa + m.size <= slot.ipa + slot.size);
            prop_assert_eq!(m.ipa % m.size, 0);
            prop_assert_eq!(m.pa % m.size, 0);
            prop_assert_eq!(m.pa, slot.backing + (m.ipa - slot.ipa));
            // No larger leaf would have been valid.
            for &bigger in LEAF_SIZES.iter().filter(|&&s| s > m.size) {
                let leaf = ipa & !(bigger - 1);
                let valid = leaf >= slot.ipa
                    && leaf + bigger <= slot.ipa + slot.size
                    && (slot.backing + (leaf - slot.ipa)).is_multiple_of(bigger);
                prop_assert!(!valid, "a {} leaf was possible", bigger);
            }
        }
    }
}
