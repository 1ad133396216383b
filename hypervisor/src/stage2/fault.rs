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

use pgtable::{LEAF_SIZES, PAGE_SIZE, Perms};

/// A memslot as the fault path sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView {
    /// First IPA of the slot.
    pub ipa: u64,
    /// Size of the slot in bytes.
    pub size: u64,
    /// Host physical address backing the slot's first byte.
    pub backing: u64,
    /// The slot logs dirty pages (`SlotFlags::LOG_DIRTY`).
    pub logging: bool,
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

/// How the faulting access uses the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A data read (or a cache maintenance operation that only reads).
    Read,
    /// A data write, or a stage-1 table walk (KVM treats both as writes: the
    /// walk may update access and dirty flags).
    Write,
    /// An instruction fetch.
    Exec,
}

impl Access {
    /// The permissions the access needs.
    pub const fn needs(self) -> Perms {
        match self {
            Self::Read => Perms::READ,
            Self::Write => Perms::RW,
            Self::Exec => Perms::EXEC,
        }
    }
}

/// The largest leaf a fault may map: 4 KiB while the slot logs dirty pages
/// (so that one write marks one page), else 1 GiB.
pub const fn max_leaf(logging: bool) -> u64 {
    if logging { PAGE_SIZE } else { 1 << 30 }
}

/// The permissions of a new leaf for `access`. Without logging a data
/// access maps read-write and a fetch read-write-execute (as before: data
/// is executable only once fetched from). While the slot logs, a read maps
/// read-only and a fetch read-execute, so that the first write to the page
/// faults and is logged.
pub const fn new_leaf_perms(access: Access, logging: bool) -> Perms {
    match (access, logging) {
        (Access::Read, true) => Perms::READ,
        (Access::Exec, true) => Perms::READ.union(Perms::EXEC),
        (Access::Read | Access::Write, _) => Perms::RW,
        (Access::Exec, false) => Perms::RWX,
    }
}

/// Whether the access marks its page dirty: a write to a logging slot.
pub const fn marks_dirty(access: Access, logging: bool) -> bool {
    logging && matches!(access, Access::Write)
}

/// What to do with a fault on an IPA that a leaf maps already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappedFault {
    /// Resume the guest: nothing this CPU caches can be stale.
    Resume,
    /// Add these permissions to the leaf (nothing if it has them) and
    /// invalidate the faulting page in this CPU's TLB, then resume.
    RelaxAndInvalidateLocal(Perms),
    /// Map a new leaf over the present one, as for a translation fault:
    /// a write to a write-protected block while the slot logs (the block
    /// is split, the written page mapped alone), or a permission fault on a
    /// leaf smaller than what the slot allows once logging stopped (the
    /// table collapses back into a block).
    Remap,
}

/// A fault on a page mapped already, as [`on_mapped`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappedLeaf {
    /// Its permissions.
    pub perms: Perms,
    /// Its size.
    pub size: u64,
}

/// Decides what a fault does on a page mapped already (a permission fault
/// when `permission`; else another vCPU mapped it since this one faulted):
/// `best` is the leaf size a translation fault would map now. See the
/// module documentation.
pub fn on_mapped(
    permission: bool,
    access: Access,
    leaf: MappedLeaf,
    logging: bool,
    best: u64,
) -> MappedFault {
    let wanted = access.needs();
    if logging && access == Access::Write && leaf.size > PAGE_SIZE {
        return MappedFault::Remap;
    }
    if !logging && permission && leaf.size < best {
        return MappedFault::Remap;
    }
    if permission || !leaf.perms.contains(wanted) {
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

    const PAGE: MappedLeaf = MappedLeaf {
        perms: Perms::RW,
        size: 4096,
    };

    #[test]
    fn a_fault_on_a_mapped_page() {
        use MappedFault::{RelaxAndInvalidateLocal, Remap, Resume};
        let page = |perms| MappedLeaf { perms, ..PAGE };
        let best = 2 * MIB;
        // Another vCPU mapped the page first: nothing is cached, resume.
        assert_eq!(
            on_mapped(false, Access::Write, page(Perms::RW), false, 4096),
            Resume
        );
        assert_eq!(
            on_mapped(false, Access::Exec, page(Perms::RWX), false, 4096),
            Resume
        );
        // A permission fault on a leaf that allows the access already
        // (another vCPU relaxed it): this CPU's old entry must go.
        assert_eq!(
            on_mapped(true, Access::Exec, page(Perms::RWX), false, 4096),
            RelaxAndInvalidateLocal(Perms::EXEC)
        );
        assert_eq!(
            on_mapped(true, Access::Write, page(Perms::RW), true, 4096),
            RelaxAndInvalidateLocal(Perms::RW)
        );
        // A fetch from a leaf without execute permission widens it.
        assert_eq!(
            on_mapped(false, Access::Exec, page(Perms::RW), false, 4096),
            RelaxAndInvalidateLocal(Perms::EXEC)
        );
        // Logging: a read of a read-only page needs nothing; a write to a
        // write-protected page relaxes it alone; a write to a block splits.
        assert_eq!(
            on_mapped(false, Access::Read, page(Perms::READ), true, 4096),
            Resume
        );
        assert_eq!(
            on_mapped(true, Access::Write, page(Perms::READ), true, 4096),
            RelaxAndInvalidateLocal(Perms::RW)
        );
        let block = MappedLeaf {
            perms: Perms::READ,
            size: 2 * MIB,
        };
        assert_eq!(on_mapped(true, Access::Write, block, true, 4096), Remap);
        assert_eq!(
            on_mapped(true, Access::Exec, block, true, 4096),
            RelaxAndInvalidateLocal(Perms::EXEC)
        );
        // Logging stopped: a permission fault on a page where a block fits
        // collapses; on a block it relaxes.
        assert_eq!(
            on_mapped(true, Access::Write, page(Perms::READ), false, best),
            Remap
        );
        assert_eq!(
            on_mapped(true, Access::Write, block, false, best),
            RelaxAndInvalidateLocal(Perms::RW)
        );
    }

    #[test]
    fn new_leaves_while_logging() {
        assert_eq!(max_leaf(true), 4096);
        assert_eq!(max_leaf(false), 1 << 30);
        assert_eq!(new_leaf_perms(Access::Read, true), Perms::READ);
        assert_eq!(new_leaf_perms(Access::Write, true), Perms::RW);
        assert!(!new_leaf_perms(Access::Exec, true).contains(Perms::WRITE));
        assert_eq!(new_leaf_perms(Access::Read, false), Perms::RW);
        assert_eq!(new_leaf_perms(Access::Exec, false), Perms::RWX);
        assert!(marks_dirty(Access::Write, true));
        assert!(!marks_dirty(Access::Write, false));
        assert!(!marks_dirty(Access::Read, true));
    }

    proptest! {
        /// While a slot logs, no fault leaves a page writable without
        /// marking it dirty, and none maps or keeps a writable block.
        #[test]
        fn logging_never_grants_an_unlogged_write(
            permission in any::<bool>(),
            access in prop::sample::select(vec![Access::Read, Access::Write, Access::Exec]),
            perms in prop::sample::select(vec![Perms::READ, Perms::RW, Perms::RWX, Perms::READ.union(Perms::EXEC)]),
            size in prop::sample::select(vec![4096u64, 2 << 20, 1 << 30]),
        ) {
            let leaf = MappedLeaf { perms, size };
            match on_mapped(permission, access, leaf, true, max_leaf(true)) {
                MappedFault::RelaxAndInvalidateLocal(added) if added.contains(Perms::WRITE) => {
                    prop_assert!(marks_dirty(access, true));
                    prop_assert_eq!(size, 4096);
                }
                MappedFault::Remap => {
                    prop_assert_eq!(max_leaf(true), 4096);
                }
                _ => {}
            }
            if new_leaf_perms(access, true).contains(Perms::WRITE) {
                prop_assert!(marks_dirty(access, true));
            }
        }
    }

    #[test]
    fn examples() {
        let slot = SlotView {
            ipa: 0x4000_0000,
            size: 128 * MIB,
            backing: 0x4800_0000,
            logging: false,
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
            logging: false,
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
            logging: false,
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
            logging: false,
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
            let slot = SlotView { ipa: ipa_page << 12, size: pages << 12, backing: backing_page << 12, logging: false };
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
