//! A strict model of the TLBs of several CPUs: what each CPU may still use
//! after every invalidation the architecture allows it to keep.
//!
//! Tests fill it from the page table (as a hardware walk would), run an
//! operation, and then ask it whether a translation the page table no longer
//! allows is still cached anywhere, whether a CPU could still walk a table
//! that was freed, and whether every break-before-make kept its order.
//!
//! # Per-CPU TLBs
//!
//! The model holds one TLB per CPU. Which CPU a thread runs as is chosen by
//! the test harness ([`ModelTlb::set_cpu`], a thread-local, CPU 0 when never
//! set); every operation a thread issues runs on that CPU. An
//! inner-shareable operation ([`Scope::InnerShareable`]) reaches every CPU, a
//! local one ([`Scope::Local`]) only the issuing CPU, so a flush that should
//! have been broadcast leaves the stale entries of the other CPUs in place.
//!
//! Each CPU caches two kinds of entries, both tagged with a VMID:
//! - leaf translations ([`CachedTranslation`]): a leaf's whole span (4 KiB,
//!   2 MiB or 1 GiB);
//! - walk entries ([`CachedTable`]): a table descriptor at some level and the
//!   table page it pointed at. A CPU holding one keeps translating through
//!   that table (even once it is unlinked) until an invalidation covering it
//!   removes the entry; [`ModelTlb::table_freed`] fails when a table page is
//!   freed while any CPU still holds a walk entry that points at it.
//!
//! An operation removes a leaf entry when its pages intersect the entry's
//! span and, if the operation carries a level hint, when the levels match:
//! the architecture lets hardware keep an entry whose level differs from the
//! hint, so the model keeps it too and a wrong hint shows up as a stale entry.
//! A walk entry goes only with an operation without a level hint (a hint
//! names the level of a leaf, and hardware may keep table entries of other
//! levels) whose pages intersect the table's span, or with a whole-VMID one.
//!
//! # Break / flush / make
//!
//! Replacing a valid entry by another valid one (a different output, a
//! block by a table or back) must go: break (make the old entry invalid),
//! flush (an inner-shareable invalidation of the old entry's whole span,
//! completed by its `DSB`), make (publish the new entry). The page-table
//! engine reports the two ends through [`TlbInvalidate::on_break`] and
//! [`TlbInvalidate::on_make`]. The model records each break as a span that
//! is "broken, not yet flushed"; an inner-shareable sequence whose operations
//! cover the whole span (with a level hint that does not spare it) marks it
//! flushed; and the make panics unless its span was broken and flushed since.
//! Every `execute` call is one complete sequence with its barriers, so a
//! covered span is flushed "with DSB" as soon as the call returns.

use crate::{PAGE_SHIFT, Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::vec::Vec;

std::thread_local! {
    /// The CPU the current thread runs as.
    static CURRENT_CPU: Cell<usize> = const { Cell::new(0) };
}

/// One cached translation: the leaf's whole span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTranslation {
    /// First IPA of the leaf's span.
    pub ipa: u64,
    /// Output address of the span's first byte.
    pub out_pa: u64,
    /// Level of the leaf (1, 2 or 3).
    pub level: u8,
    /// Whether the translation allowed writes.
    pub writable: bool,
}

impl CachedTranslation {
    /// Bytes the leaf spans.
    pub const fn size(&self) -> u64 {
        1 << (PAGE_SHIFT + 9 * (3 - self.level as u32))
    }
}

/// One cached walk entry: the table descriptor at `level` that translates
/// `[ipa, ipa + size)` points at the table page `table`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTable {
    /// First IPA the table descriptor translates.
    pub ipa: u64,
    /// Level of the table descriptor (0, 1 or 2); the table it points at
    /// holds the entries of the next level.
    pub level: u8,
    /// Physical address of the next-level table page.
    pub table: u64,
}

impl CachedTable {
    /// Bytes the table descriptor translates.
    pub const fn size(&self) -> u64 {
        1 << (PAGE_SHIFT + 9 * (3 - self.level as u32))
    }
}

/// A span broken by [`TlbInvalidate::on_break`] and not yet made again.
#[derive(Clone, Copy, Debug)]
struct Broken {
    vmid: u16,
    first: u64,
    end: u64,
    /// Level of the broken leaf; `None` for a table entry.
    level: Option<u8>,
    /// Whether an inner-shareable sequence covered it since the break.
    flushed: bool,
}

/// One CPU's caches.
#[derive(Debug, Default)]
struct CpuTlb {
    /// `(vmid, span start page)` -> leaf translation.
    leaves: BTreeMap<(u16, u64), CachedTranslation>,
    /// `(vmid, level, span start page)` -> walk entry.
    walks: BTreeMap<(u16, u8, u64), CachedTable>,
}

#[derive(Debug)]
struct State {
    cpus: Vec<CpuTlb>,
    broken: Vec<Broken>,
}

/// The TLBs of `cpus` CPUs, their walk caches, and the break-before-make
/// ledger.
#[derive(Debug)]
pub struct ModelTlb {
    caps: TlbCaps,
    state: Mutex<State>,
}

fn span_pages(level: u8) -> u64 {
    1 << (9 * (3 - level as u32))
}

impl ModelTlb {
    /// The model TLB of one CPU with `caps`.
    pub fn new(caps: TlbCaps) -> Self {
        Self::with_cpus(caps, 1)
    }

    /// The model TLBs of `cpus` CPUs with `caps`.
    pub fn with_cpus(caps: TlbCaps, cpus: usize) -> Self {
        assert!(cpus > 0, "a model needs at least one CPU");
        Self {
            caps,
            state: Mutex::new(State {
                cpus: (0..cpus).map(|_| CpuTlb::default()).collect(),
                broken: Vec::new(),
            }),
        }
    }

    /// Makes the calling thread run as `cpu` from now on: the operations it
    /// issues, and the `fill`/`lookup` calls without a CPU, act there.
    pub fn set_cpu(cpu: usize) {
        CURRENT_CPU.with(|c| c.set(cpu));
    }

    /// The CPU the calling thread runs as.
    pub fn cpu() -> usize {
        CURRENT_CPU.with(Cell::get)
    }

    /// Runs `f` as `cpu`, then returns to the CPU the thread ran as before.
    pub fn on_cpu<R>(cpu: usize, f: impl FnOnce() -> R) -> R {
        let before = Self::cpu();
        Self::set_cpu(cpu);
        let r = f();
        Self::set_cpu(before);
        r
    }

    /// Number of CPUs modelled.
    pub fn cpus(&self) -> usize {
        self.state().cpus.len()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking check must not hide the others behind a poisoned lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cpu_tlb(state: &mut State, cpu: usize) -> &mut CpuTlb {
        let cpus = state.cpus.len();
        state
            .cpus
            .get_mut(cpu)
            .unwrap_or_else(|| panic!("CPU {cpu} is not modelled (the model has {cpus})"))
    }

    /// Caches, on the calling thread's CPU, the translation of the leaf at
    /// `level` that maps `ipa` to `out_pa`, as a hardware walk would. Both
    /// addresses are aligned down to the leaf's span. Panics on a level
    /// other than 1..=3 (a test bug).
    pub fn fill(&self, vmid: u16, ipa: u64, out_pa: u64, level: u8, writable: bool) {
        self.fill_on(Self::cpu(), vmid, ipa, out_pa, level, writable);
    }

    /// [`fill`](Self::fill) on `cpu`.
    pub fn fill_on(&self, cpu: usize, vmid: u16, ipa: u64, out_pa: u64, level: u8, writable: bool) {
        assert!(
            (1..=3).contains(&level),
            "leaf level {level} does not exist"
        );
        let mask = (span_pages(level) << PAGE_SHIFT) - 1;
        let entry = CachedTranslation {
            ipa: ipa & !mask,
            out_pa: out_pa & !mask,
            level,
            writable,
        };
        let mut state = self.state();
        // A real TLB may hold several overlapping entries; the model keeps one per span start.
        Self::cpu_tlb(&mut state, cpu)
            .leaves
            .insert((vmid, entry.ipa >> PAGE_SHIFT), entry);
    }

    /// A hardware walk on the calling thread's CPU: runs `walk`, which reads
    /// the page table and returns the leaf it found as `(ipa, out_pa,
    /// level, writable)`, and caches that leaf, with the model locked
    /// throughout, so that no invalidation can fall between the read and
    /// the fill (a real walk and its fill are one event to the TLB). Returns
    /// whether a leaf was cached. `walk` must not call into the model.
    pub fn walk_and_fill(
        &self,
        vmid: u16,
        walk: impl FnOnce() -> Option<(u64, u64, u8, bool)>,
    ) -> bool {
        let cpu = Self::cpu();
        let mut state = self.state();
        let Some((ipa, out_pa, level, writable)) = walk() else {
            return false;
        };
        assert!(
            (1..=3).contains(&level),
            "leaf level {level} does not exist"
        );
        let mask = (span_pages(level) << PAGE_SHIFT) - 1;
        let entry = CachedTranslation {
            ipa: ipa & !mask,
            out_pa: out_pa & !mask,
            level,
            writable,
        };
        Self::cpu_tlb(&mut state, cpu)
            .leaves
            .insert((vmid, entry.ipa >> PAGE_SHIFT), entry);
        true
    }

    /// Caches on `cpu` the walk entry "the table descriptor at `level`
    /// translating `ipa` points at `table`". Panics on a level above 2.
    pub fn fill_table_on(&self, cpu: usize, vmid: u16, ipa: u64, level: u8, table: u64) {
        assert!(level <= 2, "no table descriptor at level {level}");
        let mask = (span_pages(level) << PAGE_SHIFT) - 1;
        let entry = CachedTable {
            ipa: ipa & !mask,
            level,
            table,
        };
        let mut state = self.state();
        Self::cpu_tlb(&mut state, cpu)
            .walks
            .insert((vmid, level, entry.ipa >> PAGE_SHIFT), entry);
    }

    /// The cached translation of `ipa` on the calling thread's CPU, if any:
    /// `(output address, level)`.
    pub fn lookup(&self, vmid: u16, ipa: u64) -> Option<(u64, u8)> {
        self.lookup_on(Self::cpu(), vmid, ipa)
            .map(|e| (e.out_pa + (ipa - e.ipa), e.level))
    }

    /// The leaf entry `cpu` holds for `ipa`, if any.
    pub fn lookup_on(&self, cpu: usize, vmid: u16, ipa: u64) -> Option<CachedTranslation> {
        let mut state = self.state();
        let tlb = Self::cpu_tlb(&mut state, cpu);
        let page = ipa >> PAGE_SHIFT;
        (1..=3u8).find_map(|level| {
            let start = page & !(span_pages(level) - 1);
            tlb.leaves
                .get(&(vmid, start))
                .filter(|e| e.level == level)
                .copied()
        })
    }

    /// The deepest walk entry `cpu` holds for `ipa`, if any: a hardware
    /// walk that misses the leaf entries starts from its table.
    pub fn walk_lookup_on(&self, cpu: usize, vmid: u16, ipa: u64) -> Option<CachedTable> {
        let mut state = self.state();
        let tlb = Self::cpu_tlb(&mut state, cpu);
        let page = ipa >> PAGE_SHIFT;
        (0..=2u8).rev().find_map(|level| {
            let start = page & !(span_pages(level) - 1);
            tlb.walks.get(&(vmid, level, start)).copied()
        })
    }

    /// Every cached leaf translation of `vmid`, on every CPU.
    pub fn entries(&self, vmid: u16) -> Vec<CachedTranslation> {
        let state = self.state();
        state
            .cpus
            .iter()
            .flat_map(|tlb| tlb.leaves.range((vmid, 0)..=(vmid, u64::MAX)))
            .map(|(_, e)| *e)
            .collect()
    }

    /// The cached leaf translations of `vmid` on `cpu`.
    pub fn entries_on(&self, cpu: usize, vmid: u16) -> Vec<CachedTranslation> {
        let mut state = self.state();
        Self::cpu_tlb(&mut state, cpu)
            .leaves
            .range((vmid, 0)..=(vmid, u64::MAX))
            .map(|(_, e)| *e)
            .collect()
    }

    /// Every cached walk entry of `vmid`, on every CPU, with its CPU.
    pub fn table_entries(&self, vmid: u16) -> Vec<(usize, CachedTable)> {
        let state = self.state();
        state
            .cpus
            .iter()
            .enumerate()
            .flat_map(|(cpu, tlb)| {
                tlb.walks
                    .range((vmid, 0, 0)..=(vmid, u8::MAX, u64::MAX))
                    .map(move |(_, e)| (cpu, *e))
            })
            .collect()
    }

    /// Checks that no CPU can still walk the table page `table`, which is
    /// being freed: panics when a walk entry still points at it (the table
    /// was freed before the flush that makes it unreachable).
    pub fn table_freed(&self, table: u64) {
        let state = self.state();
        for (cpu, tlb) in state.cpus.iter().enumerate() {
            if let Some(e) = tlb.walks.values().find(|e| e.table == table) {
                panic!(
                    "table {table:#x} freed while CPU {cpu} still caches a walk entry to it: \
                     {e:?} (freed before its TLB flush)"
                );
            }
        }
    }

    /// Spans broken and not yet made again: `(vmid, ipa, size, flushed)`.
    pub fn pending_breaks(&self) -> Vec<(u16, u64, u64, bool)> {
        self.state()
            .broken
            .iter()
            .map(|b| {
                (
                    b.vmid,
                    b.first << PAGE_SHIFT,
                    (b.end - b.first) << PAGE_SHIFT,
                    b.flushed,
                )
            })
            .collect()
    }

    /// Number of cached leaf translations over all VMIDs and CPUs.
    pub fn len(&self) -> usize {
        self.state().cpus.iter().map(|t| t.leaves.len()).sum()
    }

    /// Whether no leaf translation is cached anywhere.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Removes from `tlb` what `op` removes for `vmid`. Only entries whose span
/// can reach the operation's pages are looked at (the largest span is a
/// level-1 block, or a level-0 table descriptor), so a flush costs the
/// entries it may hit, not every entry cached.
fn invalidate(tlb: &mut CpuTlb, vmid: u16, op: &TlbiOp) {
    let Some((first, end)) = op.pages() else {
        tlb.leaves.retain(|&(v, _), _| v != vmid);
        tlb.walks.retain(|&(v, _, _), _| v != vmid);
        return;
    };
    let from = first.saturating_sub(span_pages(1) - 1);
    let hits: Vec<(u16, u64)> = tlb
        .leaves
        .range((vmid, from)..(vmid, end))
        .filter(|&(&(_, start), e)| {
            first < start + span_pages(e.level) && op.level().is_none_or(|l| l == e.level)
        })
        .map(|(&k, _)| k)
        .collect();
    for k in hits {
        tlb.leaves.remove(&k);
    }
    if op.level().is_none() {
        for level in 0..=2u8 {
            let from = first & !(span_pages(level) - 1);
            let hits: Vec<(u16, u8, u64)> = tlb
                .walks
                .range((vmid, level, from)..(vmid, level, end))
                .map(|(&k, _)| k)
                .collect();
            for k in hits {
                tlb.walks.remove(&k);
            }
        }
    }
}

/// Whether `ops` (inner-shareable, for `vmid`) together remove the broken
/// entry `b`: a leaf goes with any operation that intersects its span and
/// whose level hint does not spare it; a table entry (and everything cached
/// below it) only when operations without a hint cover its whole span.
fn covers(ops: &[TlbiOp], b: &Broken) -> bool {
    if b.level.is_some() {
        return ops.iter().any(|op| {
            let (first, end) = op.pages().unwrap_or((0, u64::MAX));
            first < b.end && b.first < end && op.level().is_none_or(|l| Some(l) == b.level)
        });
    }
    let mut intervals: Vec<(u64, u64)> = ops
        .iter()
        .filter(|op| op.level().is_none() || op.level() == b.level)
        .map(|op| op.pages().unwrap_or((0, u64::MAX)))
        .collect();
    intervals.sort_unstable();
    let mut next = b.first;
    for (start, end) in intervals {
        if start > next {
            break;
        }
        next = next.max(end);
        if next >= b.end {
            return true;
        }
    }
    next >= b.end
}

impl TlbInvalidate for ModelTlb {
    fn caps(&self) -> TlbCaps {
        self.caps
    }

    fn execute(&self, target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, scope: Scope) {
        let ops: Vec<TlbiOp> = ops.collect();
        for op in &ops {
            assert!(
                !matches!(op, TlbiOp::Range(_)) || self.caps.range,
                "range TLBI issued on a CPU without FEAT_TLBIRANGE"
            );
        }
        let cpu = Self::cpu();
        let mut state = self.state();
        match scope {
            Scope::Local => {
                let tlb = Self::cpu_tlb(&mut state, cpu);
                ops.iter().for_each(|op| invalidate(tlb, target.vmid, op));
            }
            Scope::InnerShareable => {
                Self::cpu_tlb(&mut state, cpu);
                for tlb in &mut state.cpus {
                    ops.iter().for_each(|op| invalidate(tlb, target.vmid, op));
                }
                for b in state.broken.iter_mut() {
                    if b.vmid == target.vmid && covers(&ops, b) {
                        b.flushed = true;
                    }
                }
            }
        }
    }

    fn on_break(&self, target: &TlbTarget, ipa: u64, size: u64, level: Option<u8>) {
        let first = ipa >> PAGE_SHIFT;
        let end = (ipa + size) >> PAGE_SHIFT;
        let mut state = self.state();
        let vmid = target.vmid;
        // No earlier record of the same range is dropped: a walker still in
        // a table another walker unlinked may break an entry of the same
        // range as one in the live table, and each make needs its break.
        state.broken.push(Broken {
            vmid,
            first,
            end,
            level,
            flushed: false,
        });
    }

    fn on_make(&self, target: &TlbTarget, ipa: u64, size: u64) {
        let first = ipa >> PAGE_SHIFT;
        let end = (ipa + size) >> PAGE_SHIFT;
        let mut state = self.state();
        let vmid = target.vmid;
        let matches = |b: &Broken| b.vmid == vmid && b.first == first && b.end == end;
        // Of several breaks of the range, a flushed one answers this make.
        let Some(at) = state
            .broken
            .iter()
            .position(|b| matches(b) && b.flushed)
            .or_else(|| state.broken.iter().position(matches))
        else {
            drop(state);
            panic!(
                "break-before-make: VMID {vmid} {ipa:#x}+{size:#x} published over a valid \
                 entry that was never broken"
            );
        };
        let broken = state.broken.swap_remove(at);
        drop(state);
        assert!(
            broken.flushed,
            "break-before-make: VMID {vmid} {ipa:#x}+{size:#x} published before the old entry \
             was flushed by an inner-shareable TLBI (a local flush, no flush, or the make \
             before the flush)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlushBatch, PAGE_SIZE, plan_flush};

    const RANGE: TlbCaps = TlbCaps::ALL;
    const VM1: TlbTarget = TlbTarget {
        vmid: 1,
        vttbr: 1 << 48,
    };

    #[test]
    fn entry_inside_a_flushed_range_is_gone_one_outside_stays() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4000_0000, 0x8000_0000, 3, true);
        tlb.fill(1, 0x4000_1000, 0x8000_1000, 3, true);
        tlb.fill(1, 0x4000_3000, 0x8000_3000, 3, true);
        tlb.flush_range(
            &VM1,
            0x4000_1000,
            2 * PAGE_SIZE,
            None,
            Scope::InnerShareable,
        );
        assert_eq!(tlb.lookup(1, 0x4000_0010), Some((0x8000_0010, 3)));
        assert_eq!(tlb.lookup(1, 0x4000_1000), None);
        assert_eq!(tlb.lookup(1, 0x4000_3000), Some((0x8000_3000, 3)));
    }

    #[test]
    fn a_block_goes_when_any_of_its_pages_is_flushed() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4020_5000, 0x8020_5000, 2, false);
        assert_eq!(tlb.lookup(1, 0x403f_f000), Some((0x803f_f000, 2)));
        tlb.flush_range(&VM1, 0x4030_0000, PAGE_SIZE, None, Scope::InnerShareable);
        assert_eq!(tlb.lookup(1, 0x4020_0000), None);
    }

    #[test]
    fn a_wrong_level_hint_leaves_the_entry() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4020_0000, 0x8020_0000, 2, true);
        tlb.execute(
            &VM1,
            &mut plan_flush(0x4020_0000, 1, Some(3), RANGE),
            Scope::InnerShareable,
        );
        assert!(
            tlb.lookup(1, 0x4020_0000).is_some(),
            "level-3 hint must not remove a level-2 entry"
        );
        tlb.execute(
            &VM1,
            &mut plan_flush(0x4020_0000, 1, Some(2), RANGE),
            Scope::InnerShareable,
        );
        assert!(tlb.lookup(1, 0x4020_0000).is_none());
    }

    #[test]
    fn whole_vmid_flush_leaves_other_vmids_alone() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0x4000_0000, 0x8000_0000, 1, true);
        tlb.fill(2, 0x4000_0000, 0x9000_0000, 3, true);
        tlb.flush_vmid(&VM1);
        assert!(tlb.entries(1).is_empty());
        assert_eq!(tlb.entries(2).len(), 1);
        assert_eq!(tlb.lookup(2, 0x4000_0000), Some((0x9000_0000, 3)));
    }

    #[test]
    fn a_range_flush_leaves_other_vmids_alone() {
        let tlb = ModelTlb::new(RANGE);
        tlb.fill(1, 0, 0x8000_0000, 3, true);
        tlb.fill(2, 0, 0x9000_0000, 3, true);
        let mut batch = FlushBatch::new();
        batch.add(0, 1 << 30, None);
        batch.flush(&tlb, &VM1, Scope::InnerShareable);
        assert!(tlb.lookup(1, 0).is_none());
        assert!(tlb.lookup(2, 0).is_some());
    }

    #[test]
    #[should_panic(expected = "without FEAT_TLBIRANGE")]
    fn a_range_op_on_a_cpu_without_range_is_a_bug() {
        let tlb = ModelTlb::new(TlbCaps::BASELINE);
        let mut ops = plan_flush(0, 512, None, RANGE);
        tlb.execute(&VM1, &mut ops, Scope::InnerShareable);
    }

    #[test]
    fn a_local_flush_reaches_only_its_cpu_a_broadcast_every_cpu() {
        let tlb = ModelTlb::with_cpus(RANGE, 3);
        for cpu in 0..3 {
            tlb.fill_on(cpu, 1, 0x4000_0000, 0x8000_0000, 3, false);
        }
        ModelTlb::on_cpu(1, || {
            tlb.flush_range(&VM1, 0x4000_0000, PAGE_SIZE, Some(3), Scope::Local)
        });
        assert!(tlb.lookup_on(0, 1, 0x4000_0000).is_some());
        assert!(tlb.lookup_on(1, 1, 0x4000_0000).is_none(), "local: own CPU");
        assert!(tlb.lookup_on(2, 1, 0x4000_0000).is_some());
        ModelTlb::on_cpu(2, || {
            tlb.flush_range(&VM1, 0x4000_0000, PAGE_SIZE, None, Scope::InnerShareable)
        });
        assert!(tlb.is_empty(), "broadcast: every CPU");
    }

    #[test]
    fn walk_entries_go_only_with_unhinted_flushes_of_their_span() {
        let tlb = ModelTlb::with_cpus(RANGE, 2);
        // The level-2 entry for [2 MiB, 4 MiB) points at a level-3 table.
        tlb.fill_table_on(1, 1, 0x20_0000, 2, 0xabc000);
        let hinted = || tlb.flush_range(&VM1, 0x20_1000, PAGE_SIZE, Some(3), Scope::InnerShareable);
        hinted();
        assert_eq!(
            tlb.walk_lookup_on(1, 1, 0x20_5000).map(|e| e.table),
            Some(0xabc000),
            "a leaf-level hint keeps table entries"
        );
        tlb.flush_range(&VM1, 0x40_0000, PAGE_SIZE, None, Scope::InnerShareable);
        assert!(
            tlb.walk_lookup_on(1, 1, 0x20_0000).is_some(),
            "outside the span"
        );
        tlb.flush_range(&VM1, 0x20_0000, 0x20_0000, None, Scope::InnerShareable);
        assert_eq!(tlb.walk_lookup_on(1, 1, 0x20_0000), None);
        tlb.table_freed(0xabc000);
    }

    #[test]
    #[should_panic(expected = "freed before its TLB flush")]
    fn freeing_a_table_a_cpu_still_walks_is_caught() {
        let tlb = ModelTlb::with_cpus(RANGE, 2);
        tlb.fill_table_on(1, 1, 0, 1, 0x5000);
        ModelTlb::on_cpu(0, || tlb.flush_range(&VM1, 0, 1 << 30, None, Scope::Local));
        tlb.table_freed(0x5000);
    }

    #[test]
    fn break_flush_make_in_order_passes() {
        let tlb = ModelTlb::with_cpus(RANGE, 2);
        tlb.on_break(&VM1, 0x20_0000, 0x20_0000, Some(2));
        tlb.flush_range(&VM1, 0x20_0000, PAGE_SIZE, Some(2), Scope::InnerShareable);
        tlb.on_make(&VM1, 0x20_0000, 0x20_0000);
        assert!(tlb.pending_breaks().is_empty());
        // A table entry is flushed by its whole span without a hint.
        tlb.on_break(&VM1, 0, 1 << 30, None);
        tlb.flush_range(&VM1, 0, 1 << 30, None, Scope::InnerShareable);
        tlb.on_make(&VM1, 0, 1 << 30);
    }

    #[test]
    #[should_panic(expected = "published before the old entry was flushed")]
    fn make_before_flush_is_caught() {
        let tlb = ModelTlb::new(RANGE);
        tlb.on_break(&VM1, 0x20_0000, 0x20_0000, Some(2));
        tlb.on_make(&VM1, 0x20_0000, 0x20_0000);
    }

    #[test]
    #[should_panic(expected = "published before the old entry was flushed")]
    fn a_local_flush_between_break_and_make_is_caught() {
        let tlb = ModelTlb::new(RANGE);
        tlb.on_break(&VM1, 0x20_0000, 0x20_0000, Some(2));
        tlb.flush_range(&VM1, 0x20_0000, PAGE_SIZE, Some(2), Scope::Local);
        tlb.on_make(&VM1, 0x20_0000, 0x20_0000);
    }

    #[test]
    #[should_panic(expected = "published before the old entry was flushed")]
    fn a_partial_flush_of_a_table_span_is_caught() {
        let tlb = ModelTlb::new(RANGE);
        tlb.on_break(&VM1, 0, 1 << 30, None);
        tlb.flush_range(&VM1, 0, 1 << 29, None, Scope::InnerShareable);
        tlb.on_make(&VM1, 0, 1 << 30);
    }

    #[test]
    #[should_panic(expected = "never broken")]
    fn a_make_without_a_break_is_caught() {
        let tlb = ModelTlb::new(RANGE);
        tlb.on_make(&VM1, 0, PAGE_SIZE);
    }
}
