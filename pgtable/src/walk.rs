//! The generic walker: one traversal every operation is built on.
//!
//! A walk visits, in address order, every entry that intersects
//! `[addr, end)`. For each entry it reads the slot once and calls the visitor
//! with a [`VisitContext`] (the slot, that value, level, cursor, end, flags):
//! as a [`VisitKind::TablePre`] visit when the entry is a table (before its
//! children), as a [`VisitKind::Leaf`] visit otherwise (block, page, empty or
//! locked), and as a [`VisitKind::TablePost`] visit after a table's children.
//! After a callback the slot is read again, so the walker descends into a
//! table the visitor just installed and steps over a table it just replaced
//! with a block. The visitor answers with a [`Step`]: continue, skip this
//! entry's children, or skip the rest of this table (its siblings), or with a
//! [`WalkError`]. `Again` (a lost race) stops a fault-handling walk
//! ([`WalkFlags::HANDLE_FAULT`]); any other walk steps over that entry and
//! carries on, as KVM does. Every change to a slot goes through
//! [`VisitContext::try_set`], [`VisitContext::try_lock`] and
//! [`VisitContext::publish`]: plain stores in an exclusive walk,
//! compare-and-swap against the value read in a shared one.

use crate::addr::PhysAddr;
use crate::descriptor::{Descriptor, ENTRIES_PER_TABLE, level_shift, level_size};
use crate::mm::PageTableMemory;
use crate::sync_primitives::{AtomicU64, Ordering};

/// Which visits a walk makes, and how it behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkFlags(u8);

impl WalkFlags {
    /// Visit leaves (blocks, pages, empty and locked entries).
    pub const LEAF: Self = Self(1);
    /// Visit tables before their children.
    pub const TABLE_PRE: Self = Self(2);
    /// Visit tables after their children.
    pub const TABLE_POST: Self = Self(4);
    /// A shared walk: other walkers run at the same time, so every change is
    /// a compare-and-swap against the value read.
    pub const SHARED: Self = Self(8);
    /// A fault-handling walk: `Again` stops it.
    pub const HANDLE_FAULT: Self = Self(16);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of flags.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl core::ops::BitOr for WalkFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// Why a visitor is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisitKind {
    /// The entry is not a table: a block, a page, empty or locked.
    Leaf,
    /// The entry is a table; its children come next.
    TablePre,
    /// The entry is a table whose children have been visited.
    TablePost,
}

/// A visitor's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Go on: descend if the entry (re-read) is a table, else go to the next.
    Continue,
    /// Do not descend into this entry; go to the next one.
    SkipChildren,
    /// Skip the rest of the table this entry is in.
    SkipSiblings,
}

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkError {
    /// Another walker holds or changed the entry: retry (re-enter the guest).
    Again,
    /// The page cache ran dry.
    NoMemory,
}

/// What a visitor sees of one entry.
pub struct VisitContext<'w> {
    slot: &'w AtomicU64,
    /// The entry's value, read once before the callback.
    pub old: Descriptor,
    /// Level of the entry.
    pub level: u8,
    /// The walk's cursor: the first address of the range inside this entry.
    pub addr: u64,
    /// End of the walk's range (exclusive).
    pub end: u64,
    /// The walk's flags.
    pub flags: WalkFlags,
}

impl VisitContext<'_> {
    /// First IPA the entry translates.
    pub const fn base(&self) -> u64 {
        self.addr & !(level_size(self.level) - 1)
    }

    /// Bytes the entry translates.
    pub const fn size(&self) -> u64 {
        level_size(self.level)
    }

    /// End of the part of the range inside this entry.
    pub fn range_end(&self) -> u64 {
        self.end.min(self.base() + self.size())
    }

    /// Whether the walk's range covers the whole entry.
    pub fn covers_entry(&self) -> bool {
        self.addr == self.base() && self.base() + self.size() <= self.end
    }

    /// Whether this is a shared walk.
    pub const fn is_shared(&self) -> bool {
        self.flags.contains(WalkFlags::SHARED)
    }

    /// Reads the slot again.
    pub fn reload(&self) -> Descriptor {
        Descriptor::from_raw(self.slot.load(Ordering::Acquire))
    }

    /// Replaces the entry with `new` where no break-before-make is needed
    /// (an empty slot, or a change of permissions or access flag only). In a
    /// shared walk this is a compare-and-swap against [`old`](Self::old) and
    /// fails with `Again` when another walker got there first. On success
    /// `old` becomes `new`.
    pub fn try_set(&mut self, new: Descriptor) -> Result<(), WalkError> {
        if self.is_shared() {
            self.slot
                .compare_exchange(
                    self.old.raw(),
                    new.raw(),
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .map_err(|_| WalkError::Again)?;
        } else {
            self.slot.store(new.raw(), Ordering::Release);
        }
        self.old = new;
        Ok(())
    }

    /// The "break" of break-before-make: swaps the entry for the locked
    /// marker, which only one walker can do. Fails with `Again` when the
    /// entry is already locked or changed. The caller must then invalidate
    /// the TLB for what [`old`](Self::old) covered and
    /// [`publish`](Self::publish) the new entry.
    pub fn try_lock(&mut self) -> Result<(), WalkError> {
        if self.old.is_locked() {
            return Err(WalkError::Again);
        }
        if self.is_shared() {
            self.slot
                .compare_exchange(
                    self.old.raw(),
                    Descriptor::LOCKED.raw(),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .map_err(|_| WalkError::Again)?;
        } else {
            self.slot.store(Descriptor::LOCKED.raw(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// The "make": publishes `new` in a slot this walker locked, with release
    /// ordering so a new table's contents are visible before the table is.
    pub fn publish(&mut self, new: Descriptor) {
        debug_assert!(Descriptor::from_raw(self.slot.load(Ordering::Relaxed)).is_locked());
        self.slot.store(new.raw(), Ordering::Release);
        self.old = new;
    }
}

/// Called for each visit of a walk.
pub trait Visitor {
    /// Visits one entry.
    fn visit(&mut self, ctx: &mut VisitContext<'_>, kind: VisitKind) -> Result<Step, WalkError>;
}

impl<F: FnMut(&mut VisitContext<'_>, VisitKind) -> Result<Step, WalkError>> Visitor for F {
    fn visit(&mut self, ctx: &mut VisitContext<'_>, kind: VisitKind) -> Result<Step, WalkError> {
        self(ctx, kind)
    }
}

/// The slots of the table of `entries` entries at `table`.
///
/// # Safety
///
/// `table` must be a live table page (or concatenated root) of `mm` for `'a`.
pub(crate) unsafe fn table_slots<M: PageTableMemory + ?Sized>(
    mm: &M,
    table: PhysAddr,
    entries: usize,
) -> &[AtomicU64] {
    let ptr = mm.phys_to_virt(table).as_ptr().cast::<AtomicU64>();
    // SAFETY: the caller guarantees a live table of `entries` 8-byte slots;
    // every access to them is atomic.
    unsafe { core::slice::from_raw_parts(ptr, entries) }
}

/// Whether a slot was left or the rest of its table skipped.
#[derive(PartialEq, Eq)]
enum Flow {
    Next,
    SkipSiblings,
}

/// One traversal of `[addr, end)`.
pub(crate) struct Walker<'a, M: PageTableMemory + ?Sized, V: Visitor + ?Sized> {
    pub(crate) mm: &'a M,
    pub(crate) visitor: &'a mut V,
    pub(crate) addr: u64,
    pub(crate) end: u64,
    pub(crate) flags: WalkFlags,
}

impl<M: PageTableMemory + ?Sized, V: Visitor + ?Sized> Walker<'_, M, V> {
    /// Walks the table at `table` (level `level`, `entries` slots).
    ///
    /// # Safety
    ///
    /// `table` must be a live table of the walked page table, and every table
    /// reachable from it must stay live during the walk (exclusive access, or
    /// a pinned epoch for shared walks).
    pub(crate) unsafe fn walk_table(
        &mut self,
        table: PhysAddr,
        level: u8,
        entries: usize,
    ) -> Result<(), WalkError> {
        // SAFETY: guaranteed by the caller.
        let slots = unsafe { table_slots(self.mm, table, entries) };
        let shift = level_shift(level);
        let mut idx = ((self.addr >> shift) as usize) & (entries - 1);
        while idx < entries && self.addr < self.end {
            let entry_addr = self.addr;
            // SAFETY: the children of a live table are live (caller's guarantee).
            if unsafe { self.visit(&slots[idx], level) }? == Flow::SkipSiblings {
                let span = (entries as u64) << shift;
                self.addr = (entry_addr & !(span - 1)) + span;
                break;
            }
            idx += 1;
        }
        Ok(())
    }

    /// Applies the walk's policy to a visitor error: `Again` skips the entry
    /// unless the walk handles a fault.
    fn absorb(flags: WalkFlags, r: Result<Step, WalkError>) -> Result<Step, WalkError> {
        match r {
            Err(WalkError::Again) if !flags.contains(WalkFlags::HANDLE_FAULT) => {
                Ok(Step::SkipChildren)
            }
            other => other,
        }
    }

    /// # Safety
    ///
    /// `slot` is in a live table; see [`walk_table`](Self::walk_table).
    unsafe fn visit(&mut self, slot: &AtomicU64, level: u8) -> Result<Flow, WalkError> {
        let old = Descriptor::from_raw(slot.load(Ordering::Acquire));
        // The engine only ever leaves empty or locked invalid entries in a
        // live table; anything else is a freed (poisoned) or corrupt page.
        debug_assert!(
            old.is_valid() || old == Descriptor::EMPTY || old.is_locked(),
            "corrupt entry {old:?} at level {level}: a freed table read?"
        );
        let mut ctx = VisitContext {
            slot,
            old,
            level,
            addr: self.addr,
            end: self.end,
            flags: self.flags,
        };
        let is_table = old.is_table(level);
        let kind = if is_table {
            VisitKind::TablePre
        } else {
            VisitKind::Leaf
        };
        let wanted = if is_table {
            WalkFlags::TABLE_PRE
        } else {
            WalkFlags::LEAF
        };
        let mut step = Step::Continue;
        if self.flags.contains(wanted) {
            step = Self::absorb(self.flags, self.visitor.visit(&mut ctx, kind))?;
            ctx.old = ctx.reload();
        }
        let entry_end = ctx.base() + ctx.size();
        match step {
            Step::SkipSiblings => return Ok(Flow::SkipSiblings),
            Step::SkipChildren => {
                self.addr = entry_end;
                return Ok(Flow::Next);
            }
            Step::Continue => {}
        }
        if !ctx.old.is_table(level) {
            self.addr = entry_end;
            return Ok(Flow::Next);
        }
        // SAFETY: a table reachable from a live table is live (caller's guarantee).
        unsafe { self.walk_table(ctx.old.output(), level + 1, ENTRIES_PER_TABLE) }?;
        self.addr = self.addr.max(entry_end.min(self.end));
        if self.flags.contains(WalkFlags::TABLE_POST) {
            ctx.addr = ctx.base().max(ctx.addr);
            if Self::absorb(
                self.flags,
                self.visitor.visit(&mut ctx, VisitKind::TablePost),
            )? == Step::SkipSiblings
            {
                return Ok(Flow::SkipSiblings);
            }
        }
        Ok(Flow::Next)
    }
}
