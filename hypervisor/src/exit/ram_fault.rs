//! Fixing one stage-2 fault on guest RAM: what a vCPU does once a data or
//! instruction abort has been routed to a memslot. Generic over the
//! page-table memory, so that the host tests run it against a real
//! [`pgtable::Mmu`]; `runtime::vcpu` calls [`resolve`] and counts what it did.
//!
//! # Algorithm
//!
//! Before the slot lookup the vCPU takes a [`FaultTicket`] (the MMU's
//! invalidation sequence, `pgtable::invalidate`); the lookup gives it a
//! [`SlotView`]: the translation, and whether the slot logs dirty pages.
//! [`resolve`] then, under the read side of the MMU lock:
//! - an access-flag fault sets the flag of the leaf there;
//! - on a mapped IPA, [`fault::on_mapped`] decides: nothing, widen the leaf's
//!   permissions (with a local invalidation), or map anew (split a block
//!   while logging, collapse a table once logging stopped);
//! - otherwise it maps the largest leaf the slot allows ([`fault::fault_leaf`]);
//!   while the VM's RAM is zeroed on first use (`vm::lazy_zero`), a leaf
//!   larger than 2 MiB only once all of it is zeroed, else the 2 MiB around
//!   the address, and the leaf's chunks are zeroed before the read side is
//!   taken ([`first_touch`]);
//! - a write to a logging slot marks its page dirty after the change, still
//!   inside the same read-side section.
//!
//! # The ticket gates every change
//!
//! The lookup and the change are not atomic together: between them another
//! vCPU may map the page, and the control path may enable dirty logging (or
//! delete or move the slot). So every change [`resolve`] makes to the table
//! (installing a leaf, the split and the collapse included:
//! `map_checked`; widening permissions: `relax_perms_checked`; the access
//! flag: `set_young_checked`) first checks the ticket under the read side,
//! and a stale ticket answers [`Resolved::Retry`]: the guest re-enters,
//! faults again if it still must, and looks the slot up afresh.
//!
//! Why this closes the dirty log: enabling logging is an invalidation, begun
//! before the slot's `LOG_DIRTY` flag is published and ended under the write
//! side after the slot's range is write-protected. Take a write fault whose
//! view says "not logging". If its read-side section precedes the
//! write-protect's write section, whatever it widens is narrowed again by
//! the write-protect (and the write it allows lands before logging began,
//! which the first full copy of a migration covers). If it follows, the read
//! lock shows it the sequence raised: `Retry`, and the next fault sees the
//! logging slot, maps the page alone and marks it. Without the check on the
//! relax (only the map had one), vCPU A could take its ticket and view (not
//! logging), vCPU B map the page writable, logging write-protect it, and A
//! find the read-only leaf, widen it to writable and mark nothing: a write
//! that no collection reports (the host test
//! `a_stale_write_fault_does_not_unprotect_a_logged_page` replays this).
//!
//! # Why no other path needs the check
//!
//! - A fault that changes nothing ([`Resolved::Nothing`]: the leaf allows the
//!   access already, and this CPU caches no stricter entry) grants nothing:
//!   whoever made the leaf writable while the slot logs marked the page.
//! - Every other change to the table runs under the write side (unmap,
//!   write-protect after a collection, eager split, destroy), so it excludes
//!   every fault's read-side section, and none of them widens a leaf (a split
//!   gives the pages its block's permissions).
//! - A collection takes the bits before it write-protects under the write
//!   side, so a mark made inside a read-side section is either reported, its
//!   page then protected again, or left for the next collection with the page
//!   still writable.
//! - A dirty mark without a change (a stale view marking a slot that stopped
//!   logging finds no bitmap) is harmless: a spurious bit costs one copy.

use crate::exit::esr::FaultKind;
use crate::exit::flow::StopReason;
use crate::stage2::fault::{self, Access, FaultLeaf, MappedFault, MappedLeaf, SlotView};
use crate::vm::counters::Counter;
use crate::vm::lazy_zero::{CHUNK, LazyZeroedRam};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, FaultTicket, Mmu, MmuCpu, PageCache,
    PageTableMemory, PhysAddr,
};
use tlb::TlbInvalidate;

/// One fault on guest RAM, as the abort handler routed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRamFault {
    /// Taken before the slot lookup that gave `slot`.
    pub ticket: FaultTicket,
    /// The slot holding `ipa`, as the lookup saw it.
    pub slot: SlotView,
    /// The faulting IPA.
    pub ipa: u64,
    /// The fault status: translation, access flag or permission.
    pub kind: FaultKind,
    /// How the guest used the page.
    pub access: Access,
}

/// What [`resolve`] did; in every case the guest resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// Nothing to change: the leaf allows the access already.
    Nothing,
    /// The ticket was stale (a slot changed, or dirty logging began, since
    /// the lookup), or another vCPU is changing the entry, or the leaf is
    /// gone: nothing changed; the access faults again if it still must.
    Retry,
    /// The leaf's access flag was set.
    AccessFlagSet,
    /// The leaf's permissions were widened (and the page invalidated on
    /// this CPU).
    Relaxed,
    /// A leaf of `size` bytes was installed; `collapsed` when it replaced
    /// smaller leaves (logging stopped).
    Mapped {
        /// Bytes the leaf maps.
        size: u64,
        /// A table was collapsed into the block.
        collapsed: bool,
    },
}

impl Resolved {
    /// The counters a fault that did this bumps, besides `Stage2Faults`.
    pub fn counters(self) -> impl Iterator<Item = Counter> {
        let (collapse, leaf) = match self {
            Self::Mapped { size, collapsed } => (
                collapsed.then_some(Counter::Stage2Collapses),
                Some(match size {
                    0x4000_0000 => Counter::MappedBlocks1g,
                    0x20_0000 => Counter::MappedBlocks2m,
                    _ => Counter::MappedPages4k,
                }),
            ),
            _ => (None, None),
        };
        collapse.into_iter().chain(leaf)
    }
}

/// The leaf a fault in a RAM zeroed on first use (`ram`) maps instead of
/// `leaf`, its memory zeroed with `zero(addr, len)` on return: `leaf`
/// itself where it is at most one chunk or zeroed whole already, else the
/// largest leaf of at most 2 MiB around `ipa` (a 1 GiB block is not zeroed
/// at a fault; the guest's later faults map its other chunks).
pub fn first_touch(
    slot: SlotView,
    ipa: u64,
    leaf: FaultLeaf,
    ram: &LazyZeroedRam,
    zero: impl Fn(usize, usize),
) -> FaultLeaf {
    if ram.is_finished() {
        return leaf;
    }
    let leaf = if leaf.size > CHUNK && !ram.is_ready(leaf.pa, leaf.size) {
        fault::fault_leaf(slot, ipa, CHUNK).unwrap_or(leaf)
    } else {
        leaf
    };
    ram.ensure(leaf.pa, leaf.size, zero);
    leaf
}

/// Fixes `fault` (see the module documentation): under the read side of
/// `mmu` on `cpu`, with `cache` topped up from `memory` beforehand, outside
/// the lock, and the leaf's memory zeroed first where `ram` says it is not
/// yet (with `zero(addr, len)`, [`first_touch`]). `mark_dirty(ipa)` marks
/// the page of `ipa` in the slot's dirty log; it is called inside the
/// read-side section that made the page writable, only for a write to a
/// slot that logs.
#[allow(clippy::too_many_arguments)]
pub fn resolve<M: PageTableMemory + Clone + Send + 'static>(
    fault: GuestRamFault,
    mmu: &Mmu<M>,
    cpu: &MmuCpu,
    memory: &M,
    cache: &mut PageCache,
    tlb: &impl TlbInvalidate,
    (ram, zero): (&LazyZeroedRam, impl Fn(usize, usize)),
    mark_dirty: impl FnOnce(u64),
) -> Result<Resolved, StopReason> {
    let GuestRamFault {
        ticket,
        slot,
        ipa,
        kind,
        access,
    } = fault;
    let logging = slot.logging;
    if kind == FaultKind::AccessFlag {
        let result = mmu
            .read(cpu)
            .and_then(|reader| reader.set_young_checked(ticket, ipa));
        return match result {
            Ok(_) => Ok(Resolved::AccessFlagSet),
            // Stale, or the leaf is gone or busy: a translation fault
            // follows if needed.
            Err(Error::Again) => Ok(Resolved::Retry),
            Err(error) => Err(StopReason::AccessFlag { ipa, error }),
        };
    }
    let Some(leaf) = fault::fault_leaf(slot, ipa, fault::max_leaf(logging)) else {
        return Err(StopReason::LeftMemslot { ipa });
    };
    let leaf = first_touch(slot, ipa, leaf, ram, zero);
    if cache.top_up(memory, FAULT_CACHE_PAGES).is_err() {
        return Err(StopReason::OutOfTableMemory);
    }
    let reader = mmu
        .read(cpu)
        .map_err(|error| StopReason::Stage2ReadSide { ipa, error })?;
    let dirty = fault::marks_dirty(access, logging);
    let mut collapse = false;
    if let Some(mapping) = reader.lookup(ipa) {
        // Mapped already (a permission fault, or another vCPU mapped or
        // relaxed it since this one faulted): widen the leaf if this access
        // needs it and drop this CPU's stale entry, or map anew.
        let mapped = MappedLeaf {
            perms: mapping.perms(),
            size: mapping.leaf_size(),
        };
        let permission = kind == FaultKind::Permission;
        match fault::on_mapped(permission, access, mapped, logging, leaf.size) {
            MappedFault::Resume => return Ok(Resolved::Nothing),
            MappedFault::RelaxAndInvalidateLocal(perms) => {
                return match reader.relax_perms_checked(ticket, ipa, perms, tlb) {
                    Ok(()) => {
                        if dirty {
                            mark_dirty(ipa);
                        }
                        Ok(Resolved::Relaxed)
                    }
                    Err(Error::Again) => Ok(Resolved::Retry),
                    Err(error) => Err(StopReason::RelaxPermissions { ipa, error }),
                };
            }
            MappedFault::Remap => collapse = mapped.size < leaf.size,
        }
    }
    let result = reader.map_checked(
        ticket,
        FaultMapping {
            ipa: leaf.ipa,
            size: leaf.size,
            pa: PhysAddr::new(leaf.pa),
            attrs: Attributes::normal(fault::new_leaf_perms(access, logging)),
        },
        cache,
        tlb,
    );
    match result {
        Ok(()) => {
            if dirty {
                mark_dirty(ipa);
            }
            Ok(Resolved::Mapped {
                size: leaf.size,
                collapsed: collapse,
            })
        }
        // Another vCPU is changing this entry, or the ticket is stale.
        Err(Error::Again) => Ok(Resolved::Retry),
        Err(error) => Err(StopReason::Stage2Map {
            ipa: leaf.ipa,
            size: leaf.size,
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgtable::{HostMemory, Perms, Stage2Config, Stage2PageTable};
    use std::sync::Arc;
    use std::vec::Vec;
    use tlb::{RecordingTlb, TlbCaps};

    const MIB: u64 = 1 << 20;
    const PAGE: u64 = 4096;
    /// A 2 MiB slot whose backing allows a 2 MiB block.
    const SLOT: SlotView = SlotView {
        ipa: 0x4000_0000,
        size: 2 * MIB,
        backing: 0x8000_0000,
        logging: false,
    };
    const LOGGING: SlotView = SlotView {
        logging: true,
        ..SLOT
    };

    type Memory = Arc<HostMemory>;

    /// A VM's MMU with two vCPUs, and the pages each vCPU marked dirty.
    struct World {
        memory: Memory,
        mmu: Mmu<Memory>,
        tlb: RecordingTlb,
        cpus: [MmuCpu; 2],
        caches: [PageCache; 2],
        marked: Vec<u64>,
        /// The RAM's first-use zeroing (nothing left to zero unless a test
        /// says otherwise), and the ranges the faults zeroed.
        ram: LazyZeroedRam,
        zeroed: std::sync::Mutex<Vec<(u64, u64)>>,
    }

    impl World {
        fn new() -> Self {
            let memory: Memory = Arc::new(HostMemory::new());
            let table = Stage2PageTable::new(
                Stage2Config::new(40).expect("IPA size"),
                memory.clone(),
                1,
                true,
            )
            .expect("root table");
            let mmu = Mmu::new(table, 2).expect("CPU count");
            let cpus = [mmu.register().unwrap(), mmu.register().unwrap()];
            Self {
                memory,
                mmu,
                tlb: RecordingTlb::new(TlbCaps::ALL),
                cpus,
                caches: [PageCache::with_capacity(4), PageCache::with_capacity(4)],
                marked: Vec::new(),
                ram: LazyZeroedRam::finished(),
                zeroed: std::sync::Mutex::new(Vec::new()),
            }
        }

        /// vCPU `cpu` fixes `fault`.
        fn fault(&mut self, cpu: usize, fault: GuestRamFault) -> Resolved {
            let marked = &mut self.marked;
            let zeroed = &self.zeroed;
            resolve(
                fault,
                &self.mmu,
                &self.cpus[cpu],
                &self.memory,
                &mut self.caches[cpu],
                &self.tlb,
                (&self.ram, |addr: usize, len: usize| {
                    zeroed.lock().unwrap().push((addr as u64, len as u64))
                }),
                |ipa| marked.push(ipa & !(PAGE - 1)),
            )
            .expect("fault fixed")
        }

        /// A fault's first step: the ticket, then the slot lookup.
        fn look_up(
            &self,
            slot: SlotView,
            ipa: u64,
            kind: FaultKind,
            access: Access,
        ) -> GuestRamFault {
            GuestRamFault {
                ticket: self.mmu.fault_ticket(),
                slot,
                ipa,
                kind,
                access,
            }
        }

        /// The control path enables dirty logging for the slot, as
        /// `arch::dirty_log::enable` does: an invalidation around the flag's
        /// publication and the write-protect of the slot's range.
        fn enable_logging(&self) {
            let token = self.mmu.begin_invalidate();
            // (The memslots publish `LOG_DIRTY` here: later lookups see
            // `LOGGING`.)
            let mut writer = self.mmu.write();
            writer
                .write_protect(SLOT.ipa, SLOT.size)
                .expect("write-protect")
                .flush(&self.tlb);
            writer.end_invalidate(token);
        }

        fn perms(&self, ipa: u64) -> Option<Perms> {
            self.mmu
                .read(&self.cpus[0])
                .unwrap()
                .lookup(ipa)
                .map(|m| m.perms())
        }
    }

    /// Issue 26, item 1: A takes its ticket and slot view (not logging); B
    /// maps the page writable; logging is enabled (write-protect, sequence
    /// raised); A then must not make the page writable without marking it.
    #[test]
    fn a_stale_write_fault_does_not_unprotect_a_logged_page() {
        let mut world = World::new();
        let ipa = SLOT.ipa + 5 * PAGE;
        let a = world.look_up(SLOT, ipa, FaultKind::Translation, Access::Write);
        let b = world.look_up(SLOT, ipa + PAGE, FaultKind::Translation, Access::Write);
        assert!(matches!(world.fault(1, b), Resolved::Mapped { .. }));
        assert_eq!(world.perms(ipa), Some(Perms::RW));
        world.enable_logging();
        assert_eq!(world.perms(ipa), Some(Perms::READ));

        let resolved = world.fault(0, a);
        let writable = world.perms(ipa).is_some_and(|p| p.contains(Perms::WRITE));
        assert!(
            !writable || world.marked.contains(&(ipa & !(PAGE - 1))),
            "A's stale fault ({resolved:?}) made the page writable without marking it dirty"
        );
        assert_eq!(resolved, Resolved::Retry);

        // The guest writes again: a permission fault, looked up afresh in the
        // logging slot, splits the block, maps the page alone and marks it.
        let again = world.look_up(LOGGING, ipa, FaultKind::Permission, Access::Write);
        assert_eq!(
            world.fault(0, again),
            Resolved::Mapped {
                size: PAGE,
                collapsed: false
            }
        );
        assert_eq!(world.perms(ipa), Some(Perms::RW));
        assert_eq!(world.perms(ipa + PAGE), Some(Perms::READ));
        assert_eq!(world.marked, [ipa]);
    }

    /// A permission fault on a logging slot's page whose lookup predates an
    /// invalidation (the slot moved and back, say) retries rather than
    /// relaxing on its stale view.
    #[test]
    fn a_stale_permission_fault_retries_instead_of_relaxing() {
        let mut world = World::new();
        world.enable_logging();
        let ipa = SLOT.ipa + 7 * PAGE;
        let read = world.look_up(LOGGING, ipa, FaultKind::Translation, Access::Read);
        assert!(matches!(
            world.fault(0, read),
            Resolved::Mapped { size: PAGE, .. }
        ));
        assert_eq!(world.perms(ipa), Some(Perms::READ));
        let write = world.look_up(LOGGING, ipa, FaultKind::Permission, Access::Write);
        let token = world.mmu.begin_invalidate();
        world.mmu.write().end_invalidate(token);
        assert_eq!(world.fault(0, write), Resolved::Retry);
        assert_eq!(world.perms(ipa), Some(Perms::READ));
        assert!(world.marked.is_empty());
        // With a fresh ticket and view the write relaxes the page and marks it.
        let write = world.look_up(LOGGING, ipa, FaultKind::Permission, Access::Write);
        assert_eq!(world.fault(0, write), Resolved::Relaxed);
        assert_eq!(world.perms(ipa), Some(Perms::RW));
        assert_eq!(world.marked, [ipa]);
    }

    /// Access-flag and translation faults with a stale ticket change nothing.
    #[test]
    fn every_change_is_gated_by_the_ticket() {
        let mut world = World::new();
        let ipa = SLOT.ipa;
        let map = world.look_up(SLOT, ipa, FaultKind::Translation, Access::Read);
        let young = world.look_up(SLOT, ipa, FaultKind::AccessFlag, Access::Read);
        world.enable_logging();
        assert_eq!(world.fault(0, map), Resolved::Retry);
        assert_eq!(world.perms(ipa), None);

        let map = world.look_up(LOGGING, ipa, FaultKind::Translation, Access::Read);
        assert!(matches!(world.fault(0, map), Resolved::Mapped { .. }));
        world
            .mmu
            .write()
            .test_and_clear_young(ipa, PAGE)
            .expect("age");
        assert_eq!(world.fault(0, young), Resolved::Retry);
        assert!(!world.mmu.write().is_young(ipa, PAGE).unwrap());
        let young = world.look_up(LOGGING, ipa, FaultKind::AccessFlag, Access::Read);
        assert_eq!(world.fault(0, young), Resolved::AccessFlagSet);
        assert!(world.mmu.write().is_young(ipa, PAGE).unwrap());
    }

    /// Logging stopped: a permission fault on a page collapses the table
    /// back into the block, and counts it.
    #[test]
    fn a_fault_after_logging_collapses_and_counts() {
        let mut world = World::new();
        world.enable_logging();
        let ipa = SLOT.ipa + 3 * PAGE;
        let write = world.look_up(LOGGING, ipa, FaultKind::Translation, Access::Write);
        let resolved = world.fault(0, write);
        assert_eq!(
            resolved.counters().collect::<Vec<_>>(),
            [Counter::MappedPages4k]
        );
        let write = world.look_up(SLOT, ipa, FaultKind::Permission, Access::Write);
        let resolved = world.fault(1, write);
        assert_eq!(
            resolved,
            Resolved::Mapped {
                size: 2 * MIB,
                collapsed: true
            }
        );
        assert_eq!(
            resolved.counters().collect::<Vec<_>>(),
            [Counter::Stage2Collapses, Counter::MappedBlocks2m]
        );
        assert_eq!(world.perms(ipa), Some(Perms::RW));
        assert_eq!(world.marked, [ipa]);
    }

    /// A 1 GiB slot whose backing allows a 1 GiB block.
    const GIB_SLOT: SlotView = SlotView {
        ipa: 0x4000_0000,
        size: 1024 * MIB,
        backing: 0x8000_0000,
        logging: false,
    };

    /// While the RAM is zeroed on first use, a fault maps the 2 MiB around
    /// its address and zeroes exactly that chunk before the leaf exists; a
    /// second fault there zeroes nothing; once every chunk of the 1 GiB is
    /// zeroed, a fault maps the whole block again.
    #[test]
    fn a_first_touch_zeroes_its_chunk_and_maps_no_more_than_it() {
        let mut world = World::new();
        world.ram = LazyZeroedRam::new(GIB_SLOT.backing, GIB_SLOT.size);
        let ipa = GIB_SLOT.ipa + 7 * MIB + 5 * PAGE;
        let write = world.look_up(GIB_SLOT, ipa, FaultKind::Translation, Access::Write);
        assert_eq!(
            world.fault(0, write),
            Resolved::Mapped {
                size: 2 * MIB,
                collapsed: false
            }
        );
        assert_eq!(
            *world.zeroed.lock().unwrap(),
            [(GIB_SLOT.backing + 6 * MIB, 2 * MIB)]
        );
        assert!(world.ram.is_ready(GIB_SLOT.backing + 6 * MIB, 2 * MIB));
        assert_eq!(world.perms(ipa), Some(Perms::RW));
        // The other vCPU faults in the same chunk: mapped, nothing zeroed.
        let read = world.look_up(
            GIB_SLOT,
            ipa - 3 * PAGE,
            FaultKind::Translation,
            Access::Read,
        );
        assert_eq!(world.fault(1, read), Resolved::Nothing);
        assert_eq!(world.zeroed.lock().unwrap().len(), 1);
        assert_eq!(world.ram.pending_chunks(), 511);

        // Every chunk zeroed (by other means): the next fault elsewhere in
        // the 1 GiB maps all of it, zeroing nothing.
        let mut world = World::new();
        world.ram = LazyZeroedRam::new(GIB_SLOT.backing, GIB_SLOT.size);
        world.ram.finish(|_, _| ());
        let read = world.look_up(GIB_SLOT, ipa, FaultKind::Translation, Access::Read);
        assert_eq!(
            world.fault(0, read),
            Resolved::Mapped {
                size: 1024 * MIB,
                collapsed: false
            }
        );
        assert_eq!(*world.zeroed.lock().unwrap(), []);
    }

    /// While the slot logs, a fault maps one page but zeroes its whole
    /// chunk first (the chunk is the unit of the record).
    #[test]
    fn a_first_touch_of_a_logged_page_zeroes_its_chunk() {
        let mut world = World::new();
        world.ram = LazyZeroedRam::new(SLOT.backing, SLOT.size);
        world.enable_logging();
        let ipa = SLOT.ipa + 9 * PAGE;
        let write = world.look_up(LOGGING, ipa, FaultKind::Translation, Access::Write);
        assert_eq!(
            world.fault(0, write),
            Resolved::Mapped {
                size: PAGE,
                collapsed: false
            }
        );
        assert_eq!(*world.zeroed.lock().unwrap(), [(SLOT.backing, 2 * MIB)]);
        assert_eq!(world.marked, [ipa]);
        assert!(world.ram.is_finished());
    }
}
