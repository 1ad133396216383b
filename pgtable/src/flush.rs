//! Cleaning the data cache of mapped guest memory by range.
//!
//! [`Stage2PageTable::flush_dcache`] is KVM's `kvm_pgtable_stage2_flush`: a
//! read-only walk over the leaves of a range that cleans and invalidates the
//! memory of every valid Normal leaf, whole, to the point of coherency. It is
//! what a hypervisor without FWB does when the guest's view of memory may
//! disagree with the caches: set/way maintenance emulated as a flush of the
//! VM, and the guest turning its caches on or off. With FWB stage 2 forces
//! write-back and the walk does nothing. Descriptors are not changed, so no
//! TLB invalidation is owed; the walk is exclusive (write side) so that no
//! break-before-make is in flight and every mapped leaf is seen.

use crate::descriptor::{Descriptor, MemType, level_size};
use crate::mm::PageTableMemory;
use crate::table::{Error, Stage2PageTable};
use crate::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// Cleans and invalidates to the point of coherency the memory of every
    /// valid Normal leaf touching `[ipa, ipa + size)` (whole leaves), and
    /// returns the bytes cleaned. Nothing with FWB. Exclusive; no TLBI.
    pub fn flush_dcache(&mut self, ipa: u64, size: u64) -> Result<u64, Error> {
        let end = self.check_range(ipa, size)?;
        if self.config.fwb() {
            return Ok(0);
        }
        let mm = &self.mm;
        let mut cleaned = 0;
        let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            let leaf: Descriptor = ctx.old;
            if leaf.is_leaf(ctx.level) && leaf.mem_type(false) == Some(MemType::Normal) {
                let bytes = level_size(ctx.level);
                mm.clean_inval_dcache(leaf.output(), bytes);
                cleaned += bytes;
            }
            Ok(Step::Continue)
        };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut visitor)?;
        Ok(cleaned)
    }
}
