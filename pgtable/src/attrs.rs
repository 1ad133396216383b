//! Attribute updates in place: write-protect, relax permissions, access flag.
//!
//! These change permission or access-flag bits of existing leaves, which needs
//! no break-before-make: each is a single-slot update through
//! [`VisitContext::try_set`]. Like KVM, they act on every leaf the range
//! touches, whole (a block the range covers in part changes entirely).
//! Write-protect issues no TLBI inside the walk; it returns a
//! [`FlushNeeded`] for the span of the leaves it changed, which the caller
//! flushes once (e.g. one range flush per memslot). Relaxing permissions ends
//! with one local flush: a stale stricter entry on another CPU only causes a
//! spurious fault there. Clearing the access flag needs no flush at all (the
//! flag is a hint to the ageing code). A leaf that gains execute permission
//! has its instruction cache invalidated before the update, as KVM's
//! `stage2_attr_walker` does ([`gains_exec`]).

use crate::descriptor::{Descriptor, Perms};
use crate::mm::PageTableMemory;
use crate::table::{Error, Stage2PageTable};
use crate::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use tlb::{Scope, TlbInvalidate, TlbTarget};

/// A TLB flush the caller still owes after an operation that did not flush.
#[must_use = "the changed translations stay cached until this is flushed"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushNeeded {
    /// First IPA to invalidate.
    pub ipa: u64,
    /// Bytes to invalidate (zero: nothing changed).
    pub size: u64,
    target: TlbTarget,
}

impl FlushNeeded {
    /// Invalidates the span on every CPU.
    pub fn flush(self, tlb: &impl TlbInvalidate) {
        if self.size != 0 {
            tlb.flush_range(
                &self.target,
                self.ipa,
                self.size,
                None,
                Scope::InnerShareable,
            );
        }
    }

    /// Merges two owed flushes into one covering both.
    pub fn merge(self, other: Self) -> Self {
        if self.size == 0 {
            return other;
        }
        if other.size == 0 {
            return self;
        }
        let start = self.ipa.min(other.ipa);
        let end = (self.ipa + self.size).max(other.ipa + other.size);
        Self {
            ipa: start,
            size: end - start,
            target: self.target,
        }
    }
}

/// Invalidates the instruction cache for the leaf `old` at `level` when the
/// update to `new` adds execute permission (before `new` is stored).
pub(crate) fn gains_exec<M: PageTableMemory>(mm: &M, level: u8, old: Descriptor, new: Descriptor) {
    if new.perms().contains(Perms::EXEC) && !old.perms().contains(Perms::EXEC) {
        mm.invalidate_icache(old.output(), crate::descriptor::level_size(level));
    }
}

/// The span of the leaves an update changed.
#[derive(Default)]
struct Changed {
    start: u64,
    end: u64,
}

impl Changed {
    fn add(&mut self, ctx: &VisitContext<'_>) {
        let (start, end) = (ctx.base(), ctx.base() + ctx.size());
        if self.end == self.start {
            (self.start, self.end) = (start, end);
        } else {
            self.start = self.start.min(start);
            self.end = self.end.max(end);
        }
    }
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// Applies `update` to every valid leaf touching `[ipa, ipa + size)` and
    /// returns the span of the leaves it changed.
    fn update_leaves(
        &mut self,
        ipa: u64,
        size: u64,
        update: impl Fn(Descriptor) -> Descriptor,
    ) -> Result<Changed, Error> {
        let end = self.check_range(ipa, size)?;
        let mut changed = Changed::default();
        let mm = &self.mm;
        let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            if ctx.old.is_valid() {
                let new = update(ctx.old);
                if new != ctx.old {
                    gains_exec(mm, ctx.level, ctx.old, new);
                    ctx.try_set(new)?;
                    changed.add(ctx);
                }
            }
            Ok(Step::Continue)
        };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut visitor)?;
        Ok(changed)
    }

    /// Removes write permission from every leaf touching the range. Exclusive.
    /// Issues no TLBI: flush the returned span once.
    pub fn write_protect(&mut self, ipa: u64, size: u64) -> Result<FlushNeeded, Error> {
        let changed = self.update_leaves(ipa, size, |d| {
            d.with_perms(d.perms().difference(Perms::WRITE))
        })?;
        Ok(FlushNeeded {
            ipa: changed.start,
            size: changed.end - changed.start,
            target: self.target,
        })
    }

    /// Adds `perms` to every leaf touching the range, then flushes the
    /// changed span on this CPU only. Exclusive.
    pub fn relax_perms(
        &mut self,
        ipa: u64,
        size: u64,
        perms: Perms,
        tlb: &impl TlbInvalidate,
    ) -> Result<(), Error> {
        let changed = self.update_leaves(ipa, size, |d| d.with_perms(d.perms().union(perms)))?;
        if changed.end > changed.start {
            tlb.flush_range(
                &self.target,
                changed.start,
                changed.end - changed.start,
                None,
                Scope::Local,
            );
        }
        Ok(())
    }

    /// Clears the access flag of every leaf touching the range; returns
    /// whether any was set. No TLBI. Exclusive.
    pub fn test_and_clear_young(&mut self, ipa: u64, size: u64) -> Result<bool, Error> {
        let changed = self.update_leaves(ipa, size, |d| d.with_young(false))?;
        Ok(changed.end > changed.start)
    }

    /// Sets the access flag of the leaf mapping `ipa`; returns whether it
    /// was clear. Exclusive.
    pub fn set_young(&mut self, ipa: u64) -> Result<bool, Error> {
        let changed = self.update_leaves(
            ipa & !(crate::descriptor::PAGE_SIZE - 1),
            crate::descriptor::PAGE_SIZE,
            |d| d.with_young(true),
        )?;
        Ok(changed.end > changed.start)
    }

    /// Whether any leaf touching the range has its access flag set.
    pub fn is_young(&self, ipa: u64, size: u64) -> Result<bool, Error> {
        let end = self.check_range(ipa, size)?;
        let mut young = false;
        let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            young |= ctx.old.is_valid() && ctx.old.is_young();
            Ok(Step::Continue)
        };
        self.walk_range(ipa, end, WalkFlags::LEAF, &mut visitor)?;
        Ok(young)
    }
}
