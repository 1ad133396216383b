//! The stage-2 page table: its root, its memory, its VM, and the read-only
//! and whole-table operations (walk, lookup, accounting, destroy).
//!
//! Exclusive operations take `&mut self`, which is how the type system states
//! "the write side of the MMU lock is held": no other walker can run. Shared
//! (fault-path) operations take `&self` and only change slots by
//! compare-and-swap (see [`crate::mmu`]). A range is checked against the
//! configured IPA size before any walk: an address past the end is an
//! [`Error::OutOfRange`], never a wrap-around.

use crate::addr::PhysAddr;
use crate::config::{ConfigError, Stage2Config};
use crate::descriptor::{
    Attributes, Descriptor, ENTRIES_PER_TABLE, LAST_LEVEL, PAGE_SIZE, level_shift,
};
use crate::mm::PageTableMemory;
use crate::sync_primitives::{Ordering, owned_slots, read_owned};
use crate::walk::{
    Step, VisitContext, VisitKind, Visitor, WalkError, WalkFlags, Walker, table_slots,
};
use tlb::{TlbInvalidate, TlbTarget};

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The range reaches past the configured IPA space (or wraps).
    OutOfRange {
        /// First IPA of the range.
        ipa: u64,
        /// Size of the range.
        size: u64,
    },
    /// An address or size is not a multiple of 4 KiB.
    Unaligned,
    /// The page cache holds fewer pages than the operation needs.
    NoMemory,
    /// A concurrent walker holds or changed an entry: retry.
    Again,
    /// The configuration is unusable.
    Config(ConfigError),
    /// The epoch handle given to a shared operation belongs to another
    /// MMU's collector, so pinning it would protect nothing.
    ForeignHandle,
    /// More CPUs registered with an MMU than it was made for.
    TooManyCpus,
}

impl From<WalkError> for Error {
    fn from(e: WalkError) -> Self {
        match e {
            WalkError::Again => Self::Again,
            WalkError::NoMemory => Self::NoMemory,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::OutOfRange { ipa, size } => {
                write!(f, "range {ipa:#x}+{size:#x} is outside the IPA space")
            }
            Self::Unaligned => f.write_str("address or size not 4 KiB aligned"),
            Self::NoMemory => f.write_str("page cache exhausted"),
            Self::Again => f.write_str("entry busy, retry"),
            Self::Config(e) => write!(f, "configuration: {e}"),
            Self::ForeignHandle => f.write_str("epoch handle of another MMU"),
            Self::TooManyCpus => f.write_str("more CPUs than the MMU was made for"),
        }
    }
}

impl core::error::Error for Error {}

/// A leaf found by [`Stage2PageTable::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Output address of the looked-up IPA (offset inside the page kept).
    pub output: PhysAddr,
    /// Level of the leaf (1, 2 or 3).
    pub level: u8,
    /// First IPA the leaf maps.
    pub leaf_ipa: u64,
    /// The leaf itself.
    pub descriptor: Descriptor,
}

impl Mapping {
    /// Bytes the leaf maps.
    pub const fn leaf_size(&self) -> u64 {
        1 << level_shift(self.level)
    }

    /// The leaf's permissions.
    pub const fn perms(&self) -> crate::Perms {
        self.descriptor.perms()
    }
}

/// A stage-2 page table of one VM.
pub struct Stage2PageTable<M: PageTableMemory> {
    pub(crate) config: Stage2Config,
    pub(crate) root: PhysAddr,
    pub(crate) mm: M,
    pub(crate) target: TlbTarget,
}

impl<M: PageTableMemory> Stage2PageTable<M> {
    /// An empty table for `vmid` (`vmid16`: the CPU has 16-bit VMIDs),
    /// allocating its (concatenated) root from `mm`.
    pub fn new(config: Stage2Config, mm: M, vmid: u16, vmid16: bool) -> Result<Self, Error> {
        let root = mm
            .alloc_zeroed_pages(config.root_pages())
            .ok_or(Error::NoMemory)?;
        match config.vttbr(root, vmid, vmid16) {
            Ok(vttbr) => Ok(Self {
                config,
                root,
                mm,
                target: TlbTarget { vmid, vttbr },
            }),
            Err(e) => {
                // SAFETY: the root was just allocated and never published.
                unsafe { mm.free_pages(root, config.root_pages()) };
                Err(e.into())
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Stage2Config {
        &self.config
    }

    /// Physical address of the root.
    pub fn root(&self) -> PhysAddr {
        self.root
    }

    /// The `VTTBR_EL2` value of this table and VMID.
    pub fn vttbr(&self) -> u64 {
        self.target.vttbr
    }

    /// The VM whose TLB entries this table's operations invalidate.
    pub fn tlb_target(&self) -> &TlbTarget {
        &self.target
    }

    /// The page-table memory provider.
    pub fn memory(&self) -> &M {
        &self.mm
    }

    /// Checks `[ipa, ipa + size)` and returns its end.
    pub(crate) fn check_range(&self, ipa: u64, size: u64) -> Result<u64, Error> {
        if !ipa.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
            return Err(Error::Unaligned);
        }
        match ipa.checked_add(size) {
            Some(end) if end <= self.config.ipa_limit() => Ok(end),
            _ => Err(Error::OutOfRange { ipa, size }),
        }
    }

    /// Runs `visitor` over `[ipa, end)` with `flags` (the caller has checked
    /// the range and holds the access that `flags` implies).
    pub(crate) fn walk_range<V: Visitor + ?Sized>(
        &self,
        ipa: u64,
        end: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<(), WalkError> {
        if ipa >= end {
            return Ok(());
        }
        let mut walker = Walker {
            mm: &self.mm,
            visitor,
            addr: ipa,
            end,
            flags,
        };
        // SAFETY: the root is live for the table's lifetime; exclusive walks
        // hold `&mut self` and shared walks keep unlinked tables alive by
        // epochs, so every reachable table stays live during the walk.
        unsafe {
            walker.walk_table(
                self.root,
                self.config.start_level(),
                self.config.root_entries(),
            )
        }
    }

    /// Walks `[ipa, ipa + size)` with `visitor`, exclusively (write side).
    /// `flags` picks the visits; [`WalkFlags::SHARED`] may be given but is not
    /// needed.
    pub fn walk<V: Visitor>(
        &mut self,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<(), Error> {
        let end = self.check_range(ipa, size)?;
        Ok(self.walk_range(ipa, end, flags, visitor)?)
    }

    /// The leaf that maps `ipa`, if any. Reads only; safe beside shared walks
    /// as long as unlinked tables are reclaimed by epochs.
    pub fn lookup(&self, ipa: u64) -> Option<Mapping> {
        if ipa >= self.config.ipa_limit() {
            return None;
        }
        let mut level = self.config.start_level();
        let mut table = self.root;
        let mut entries = self.config.root_entries();
        loop {
            // SAFETY: `table` is the root or a table reachable from it.
            let slots = unsafe { table_slots(&self.mm, table, entries) };
            let idx = ((ipa >> level_shift(level)) as usize) & (entries - 1);
            let d = Descriptor::from_raw(slots[idx].load(Ordering::Acquire));
            if d.is_table(level) {
                table = d.output();
                level += 1;
                entries = ENTRIES_PER_TABLE;
                continue;
            }
            if !d.is_valid() {
                return None;
            }
            let size = 1u64 << level_shift(level);
            let leaf_ipa = ipa & !(size - 1);
            return Some(Mapping {
                output: d.output().add(ipa - leaf_ipa),
                level,
                leaf_ipa,
                descriptor: d,
            });
        }
    }

    /// The attributes of a leaf under this configuration's MemAttr encoding;
    /// `None` for a MemAttr value the engine never writes.
    pub fn attributes(&self, leaf: Descriptor) -> Option<Attributes> {
        Some(Attributes {
            perms: leaf.perms(),
            mem: leaf.mem_type(self.config.fwb())?,
        })
    }

    /// Table pages reachable from the root, the root pages included.
    pub fn table_pages(&self) -> usize {
        let mut count = self.config.root_pages();
        let mut counter = |_: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
            count += 1;
            Ok(Step::Continue)
        };
        self.walk_range(
            0,
            self.config.ipa_limit(),
            WalkFlags::TABLE_PRE,
            &mut counter,
        )
        .expect("a read-only walk cannot fail");
        count
    }

    /// Invalidates the whole VMID and frees every table page. On hardware the
    /// VM must no longer run on any CPU.
    pub fn destroy(self, tlb: &impl TlbInvalidate) {
        tlb.flush_vmid(&self.target);
        drop(self);
    }

    /// Frees every table below the root.
    fn free_all_tables(&mut self) {
        let mm = &self.mm;
        let mut freer = |ctx: &mut VisitContext<'_>, kind: VisitKind| -> Result<Step, WalkError> {
            if kind == VisitKind::TablePost {
                // SAFETY: the walk has left the child for good, and nothing
                // else can reach the table (`&mut self`, being dropped).
                unsafe { mm.free_pages(ctx.old.output(), 1) };
            }
            Ok(Step::Continue)
        };
        let mut walker = Walker {
            mm,
            visitor: &mut freer,
            addr: 0,
            end: self.config.ipa_limit(),
            flags: WalkFlags::TABLE_POST,
        };
        // SAFETY: exclusive access; each table is freed only after its children.
        unsafe {
            walker.walk_table(
                self.root,
                self.config.start_level(),
                self.config.root_entries(),
            )
        }
        .expect("a freeing walk cannot fail");
    }
}

impl<M: PageTableMemory> Drop for Stage2PageTable<M> {
    /// Frees every table page. Call [`Stage2PageTable::destroy`] to
    /// invalidate the VMID first.
    fn drop(&mut self) {
        self.free_all_tables();
        // SAFETY: the root came from `alloc_zeroed_pages(root_pages)`; nothing
        // references it any more.
        unsafe { self.mm.free_pages(self.root, self.config.root_pages()) };
    }
}

/// Whether the table page `table` holds nothing but empty entries.
pub(crate) fn table_is_empty<M: PageTableMemory + ?Sized>(mm: &M, table: PhysAddr) -> bool {
    // SAFETY: the caller passes a live table page.
    let slots = unsafe { table_slots(mm, table, ENTRIES_PER_TABLE) };
    slots.iter().all(|s| s.load(Ordering::Relaxed) == 0)
}

/// Frees `table` (at `level`) and every table below it.
///
/// # Safety
///
/// The subtree must be unreachable by any walker, software or hardware (the
/// TLB invalidated for its span), and owned by the caller.
pub(crate) unsafe fn free_subtree<M: PageTableMemory + ?Sized>(mm: &M, table: PhysAddr, level: u8) {
    if level < LAST_LEVEL {
        // SAFETY: the caller owns the subtree.
        let slots = unsafe { owned_slots(mm, table) };
        for slot in slots {
            let d = Descriptor::from_raw(read_owned(slot));
            if d.is_table(level) {
                // SAFETY: a child of an owned, unreachable subtree.
                unsafe { free_subtree(mm, d.output(), level + 1) };
            }
        }
    }
    // SAFETY: owned and unreachable (caller's guarantee).
    unsafe { mm.free_pages(table, 1) };
}
