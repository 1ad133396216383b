//! Model-based property test of the exclusive operations.
//!
//! Random sequences of map / unmap / write-protect / relax / split / collapse
//! and fault fixes (shared and exclusive)
//! over an 8 GiB window that straddles the two concatenated root pages of a
//! 40-bit table, with 4 KiB, 2 MiB and 1 GiB sizes, unaligned ranges and
//! misaligned outputs, and some operations starved of cache pages. After every
//! operation:
//! - the table's leaves over the touched region (the range widened to 1 GiB)
//!   translate every page exactly as a reference map (page -> output page and
//!   permissions) says, and `lookup` agrees at the range's edges;
//! - live pages == table pages reachable from the root + pages in the cache;
//! - a per-CPU model TLB of two CPUs, filled before the operation with
//!   translations and walk entries (table descriptors) the table held, on
//!   both CPUs, while the operation runs on CPU 0: once the operation (and,
//!   for write-protect, the flush it owes) is done, no CPU keeps a
//!   translation the reference no longer allows, and every cached walk entry
//!   still points at the table the table tree links there (a CPU could
//!   otherwise translate through an unlinked table);
//! - the model TLB checks, as it happens, that every replaced entry was
//!   broken, flushed on every CPU and only then made again, and the host
//!   memory asks it, at every free, whether a CPU can still walk the page.

extern crate std;

use super::{Harness, NO_RANGE_CAPS, RANGE_CAPS, VMID};
use crate::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use crate::{Attributes, Error, Perms, PhysAddr, SkipHints};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::vec::Vec;
use tlb::{ModelTlb, TlbInvalidate, TlbTarget};

const PAGE: u64 = 4096;
const PAGES_2M: u64 = 512;
const PAGES_1G: u64 = 512 * 512;
/// First page of the window: 4 GiB below the second root page.
const WINDOW: u64 = (512 << 18) - 4 * PAGES_1G;
const WINDOW_PAGES: u64 = 8 * PAGES_1G;
/// Output pages live from 1 TiB on.
const OUT_BASE: u64 = 1 << 28;

/// A run of pages mapped linearly with one set of permissions:
/// `[first, end)` -> `[out, ..)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: u64,
    end: u64,
    out: u64,
    perms: Perms,
}

/// Reference map: first page -> run; runs never overlap.
#[derive(Default)]
struct Reference {
    runs: BTreeMap<u64, Run>,
}

impl Reference {
    /// Cuts runs at `page` so no run straddles it.
    fn cut(&mut self, page: u64) {
        let Some((_, &run)) = self.runs.range(..page).next_back() else {
            return;
        };
        if run.end > page {
            self.runs.insert(run.first, Run { end: page, ..run });
            self.runs.insert(
                page,
                Run {
                    first: page,
                    out: run.out + (page - run.first),
                    ..run
                },
            );
        }
    }

    fn remove(&mut self, first: u64, end: u64) {
        self.cut(first);
        self.cut(end);
        let keys: Vec<u64> = self.runs.range(first..end).map(|(&k, _)| k).collect();
        for k in keys {
            self.runs.remove(&k);
        }
    }

    fn set(&mut self, first: u64, end: u64, out: u64, perms: Perms) {
        self.remove(first, end);
        self.runs.insert(
            first,
            Run {
                first,
                end,
                out,
                perms,
            },
        );
    }

    fn update_perms(&mut self, first: u64, end: u64, f: impl Fn(Perms) -> Perms) {
        self.cut(first);
        self.cut(end);
        for run in self.runs.range_mut(first..end).map(|(_, r)| r) {
            run.perms = f(run.perms);
        }
    }

    /// Runs clipped to `[first, end)`, merged where contiguous.
    fn runs_in(&self, first: u64, end: u64) -> Vec<Run> {
        let mut out = Vec::new();
        let start = self
            .runs
            .range(..=first)
            .next_back()
            .map_or(first, |(&k, _)| k);
        for (_, &r) in self.runs.range(start..end) {
            if r.end <= first {
                continue;
            }
            let f = r.first.max(first);
            push_merged(
                &mut out,
                Run {
                    first: f,
                    end: r.end.min(end),
                    out: r.out + (f - r.first),
                    perms: r.perms,
                },
            );
        }
        out
    }
}

fn push_merged(runs: &mut Vec<Run>, run: Run) {
    if let Some(last) = runs.last_mut()
        && last.end == run.first
        && last.out + (last.end - last.first) == run.out
        && last.perms == run.perms
    {
        last.end = run.end;
        return;
    }
    runs.push(run);
}

/// A leaf of the real table: `(first IPA of the leaf, level, descriptor)`.
type Leaf = (u64, u8, crate::Descriptor);

/// Valid leaves of the table touching `[first, end)` pages.
fn leaves(h: &mut Harness, first: u64, end: u64) -> Vec<Leaf> {
    let mut found = Vec::new();
    let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        if ctx.old.is_valid() {
            found.push((ctx.base(), ctx.level, ctx.old));
        }
        Ok(Step::Continue)
    };
    h.table
        .walk(
            first * PAGE,
            (end - first) * PAGE,
            WalkFlags::LEAF,
            &mut visitor,
        )
        .expect("read-only walk");
    found
}

/// The table's translation of `[first, end)` as merged runs.
fn table_runs(h: &mut Harness, first: u64, end: u64) -> Vec<Run> {
    let mut runs = Vec::new();
    for (base, level, d) in leaves(h, first, end) {
        let leaf_first = base / PAGE;
        let leaf_end = leaf_first + (crate::level_size(level) / PAGE);
        let f = leaf_first.max(first);
        let run = Run {
            first: f,
            end: leaf_end.min(end),
            out: d.output().as_u64() / PAGE + (f - leaf_first),
            perms: d.perms(),
        };
        push_merged(&mut runs, run);
    }
    runs
}

#[derive(Clone, Debug)]
enum Op {
    Map {
        first: u64,
        pages: u64,
        out: u64,
        perms: Perms,
        starve: bool,
    },
    Unmap {
        first: u64,
        pages: u64,
        starve: bool,
    },
    WriteProtect {
        first: u64,
        pages: u64,
    },
    Relax {
        first: u64,
        pages: u64,
        perms: Perms,
    },
    Split {
        first: u64,
        pages: u64,
        starve: bool,
        batched: bool,
    },
    /// A fault fix: one leaf of `pages` (1, 512 or 512 * 512), by the shared
    /// walk (single-threaded here) or the exclusive one.
    Fault {
        first: u64,
        pages: u64,
        out: u64,
        perms: Perms,
        shared: bool,
    },
}

fn clamp(first: u64, pages: u64) -> (u64, u64) {
    let first = first.min(WINDOW_PAGES - 1);
    (WINDOW + first, pages.clamp(1, WINDOW_PAGES - first))
}

/// A range in the window: small and unaligned, 2 MiB-ish, or 1 GiB-ish.
fn range() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        3 => (0..WINDOW_PAGES, 1..=700u64).prop_map(|(f, n)| clamp(f, n)),
        3 => (0..WINDOW_PAGES / PAGES_2M, 1..=5u64, -3i64..=3, -3i64..=3).prop_map(|(b, n, js, je)| {
            let first = (b * PAGES_2M).saturating_add_signed(js);
            clamp(first, (n * PAGES_2M).saturating_add_signed(je - js))
        }),
        2 => (0..8u64, 1..=2u64, -2i64..=2).prop_map(|(g, n, j)| clamp((g * PAGES_1G).saturating_add_signed(j), n * PAGES_1G)),
    ]
}

fn perms() -> impl Strategy<Value = Perms> {
    prop_oneof![
        Just(Perms::READ),
        Just(Perms::RW),
        Just(Perms::RWX),
        Just(Perms::READ | Perms::EXEC)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let map = (
        range(),
        0..64u64,
        prop::bool::weighted(0.2),
        perms(),
        prop::bool::weighted(0.1),
    )
        .prop_map(|((first, pages), gib, misalign, perms, starve)| {
            // Outputs congruent to the IPA modulo 1 GiB allow blocks; a page
            // offset forces pages (kept to small ranges: they are slow).
            let shift = if misalign { 1 + (gib % 7) } else { 0 };
            let pages = if misalign {
                pages.min(8 * PAGES_2M)
            } else {
                pages
            };
            let out = OUT_BASE + gib * PAGES_1G + (first % PAGES_1G) + shift;
            Op::Map {
                first,
                pages,
                out,
                perms,
                starve,
            }
        });
    // Collapse: an aligned block-sized map over whatever is there.
    let collapse = (
        0..WINDOW_PAGES / PAGES_2M,
        prop::bool::weighted(0.3),
        0..64u64,
        perms(),
    )
        .prop_map(|(b, big, gib, perms)| {
            let unit = if big { PAGES_1G } else { PAGES_2M };
            let first = WINDOW + (b * PAGES_2M) / unit * unit;
            Op::Map {
                first,
                pages: unit,
                out: OUT_BASE + gib * PAGES_1G + (first % PAGES_1G),
                perms,
                starve: false,
            }
        });
    // A fault: a page, a 2 MiB or a 1 GiB leaf at an aligned IPA, its
    // output congruent to it (as a memslot's backing is).
    let fault = (0..WINDOW_PAGES, 0..3usize, 0..64u64, perms(), any::<bool>()).prop_map(
        |(page, size, gib, perms, shared)| {
            let pages = [1, PAGES_2M, PAGES_1G][size];
            let first = WINDOW + page / pages * pages;
            let out = OUT_BASE + gib * PAGES_1G + (first % PAGES_1G);
            Op::Fault {
                first,
                pages,
                out,
                perms,
                shared,
            }
        },
    );
    prop_oneof![
        4 => map,
        2 => collapse,
        3 => (range(), prop::bool::weighted(0.1)).prop_map(|((first, pages), starve)| Op::Unmap { first, pages, starve }),
        2 => range().prop_map(|(first, pages)| Op::WriteProtect { first, pages }),
        1 => (range(), perms()).prop_map(|((first, pages), perms)| Op::Relax { first, pages, perms }),
        2 => (range(), prop::bool::weighted(0.15), any::<bool>()).prop_map(|((first, pages), starve, batched)| Op::Split { first, pages, starve, batched }),
        3 => fault,
    ]
}

impl Op {
    fn range(&self) -> (u64, u64) {
        match *self {
            Op::Map { first, pages, .. }
            | Op::Unmap { first, pages, .. }
            | Op::WriteProtect { first, pages }
            | Op::Relax { first, pages, .. }
            | Op::Split { first, pages, .. }
            | Op::Fault { first, pages, .. } => (first, first + pages),
        }
    }
}

/// Tops the cache up to `needed`, or to one less when starving.
fn provision(h: &mut Harness, needed: usize, starve: bool) -> bool {
    let starved = starve && needed > 0;
    h.cache.release(&*h.mem);
    h.fill_cache(if starved { needed - 1 } else { needed });
    starved
}

/// Table descriptors of the table touching `[first, end)` pages:
/// `(first IPA, level, next-level table)`.
fn tables(h: &mut Harness, first: u64, end: u64) -> Vec<(u64, u8, u64)> {
    let mut found = Vec::new();
    let mut visitor = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        found.push((ctx.base(), ctx.level, ctx.old.output().as_u64()));
        Ok(Step::Continue)
    };
    h.table
        .walk(
            first * PAGE,
            (end - first) * PAGE,
            WalkFlags::TABLE_PRE,
            &mut visitor,
        )
        .expect("read-only walk");
    found
}

/// CPUs of the model: operations run on CPU 0, CPU 1 only caches.
const CPUS: usize = 2;

/// Fills the model TLB with up to 48 translations and 16 walk entries the
/// table holds in the region, spread over both CPUs.
fn fill_tlb(h: &mut Harness, tlb: &ModelTlb, first: u64, end: u64) {
    let found = leaves(h, first, end);
    let step = found.len().div_ceil(48).max(1);
    for (i, &(base, level, d)) in found.iter().step_by(step).chain(found.last()).enumerate() {
        tlb.fill_on(
            i % CPUS,
            VMID,
            base,
            d.output().as_u64(),
            level,
            d.perms().contains(Perms::WRITE),
        );
    }
    let found = tables(h, first, end);
    let step = found.len().div_ceil(16).max(1);
    for (i, &(base, level, table)) in found.iter().step_by(step).chain(found.last()).enumerate() {
        tlb.fill_table_on((i + 1) % CPUS, VMID, base, level, table);
    }
}

/// Every cached walk entry must point at the table linked there now.
fn check_walks(h: &mut Harness, tlb: &ModelTlb) -> Result<(), TestCaseError> {
    for (cpu, e) in tlb.table_entries(VMID) {
        let first = e.ipa / PAGE;
        let linked = tables(h, first, first + 1)
            .into_iter()
            .find(|&(base, level, _)| base == e.ipa && level == e.level)
            .map(|(_, _, table)| table);
        prop_assert_eq!(
            linked,
            Some(e.table),
            "CPU {} still walks through an unlinked table: {:?}",
            cpu,
            e
        );
    }
    Ok(())
}

/// Empties the model TLB when dropped (before the table it caches is
/// freed), so that a failing case reports its own failure, not the free.
struct ForgetOnDrop<'a>(&'a ModelTlb, TlbTarget);

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.flush_vmid(&self.1);
    }
}

/// Every cached translation must still be allowed by the reference.
fn check_tlb(reference: &Reference, tlb: &ModelTlb) -> Result<(), TestCaseError> {
    for e in tlb.entries(VMID) {
        let (first, end) = (e.ipa / PAGE, (e.ipa + e.size()) / PAGE);
        let runs = reference.runs_in(first, end);
        let mut page = first;
        for run in &runs {
            prop_assert_eq!(
                run.first,
                page,
                "stale TLB entry {:?}: page {:#x} unmapped",
                e,
                page * PAGE
            );
            prop_assert_eq!(
                run.out,
                e.out_pa / PAGE + (page - first),
                "stale TLB entry {:?}: output changed",
                e
            );
            prop_assert!(
                !e.writable || run.perms.contains(Perms::WRITE),
                "stale writable TLB entry {:?}",
                e
            );
            page = run.end;
        }
        prop_assert_eq!(page, end, "stale TLB entry {:?}: tail unmapped", e);
    }
    Ok(())
}

fn run_ops(ops: &[Op], range_caps: bool) -> Result<(), TestCaseError> {
    let mut h = Harness::new(40);
    let caps = if range_caps {
        RANGE_CAPS
    } else {
        NO_RANGE_CAPS
    };
    let tlb = Arc::new(ModelTlb::with_cpus(caps, CPUS));
    let model = tlb.clone();
    h.mem.on_free(move |pa| model.table_freed(pa.as_u64()));
    let _forget = ForgetOnDrop(&tlb, *h.table.tlb_target());
    let tlb = &*tlb;
    ModelTlb::set_cpu(0);
    let mut reference = Reference::default();
    for op in ops {
        let (first, end) = op.range();
        let region = (
            first / PAGES_1G * PAGES_1G,
            end.div_ceil(PAGES_1G) * PAGES_1G,
        );
        fill_tlb(&mut h, tlb, region.0, region.1);
        let touched: Vec<Leaf> = leaves(&mut h, first, end);
        let (ipa, size) = (first * PAGE, (end - first) * PAGE);
        match *op {
            Op::Map {
                out, perms, starve, ..
            } => {
                let pa = PhysAddr::new(out * PAGE);
                let needed = h.table.pages_needed_to_map(ipa, size, pa).unwrap();
                let starved = provision(&mut h, needed, starve);
                let r = h
                    .table
                    .map(ipa, size, pa, Attributes::normal(perms), &mut h.cache, tlb);
                if starved {
                    prop_assert_eq!(r, Err(Error::NoMemory));
                } else {
                    prop_assert_eq!(r, Ok(()));
                    reference.set(first, end, out, perms);
                }
            }
            Op::Unmap { starve, .. } => {
                let needed = h.table.pages_needed_to_unmap(ipa, size).unwrap();
                let starved = provision(&mut h, needed, starve);
                let r = h.table.unmap(ipa, size, &mut h.cache, tlb);
                if starved {
                    prop_assert_eq!(r, Err(Error::NoMemory));
                } else {
                    prop_assert_eq!(r, Ok(()));
                    reference.remove(first, end);
                }
            }
            Op::WriteProtect { .. } => {
                h.table.write_protect(ipa, size).unwrap().flush(tlb);
                for &(base, level, _) in &touched {
                    let f = base / PAGE;
                    reference.update_perms(f, f + crate::level_size(level) / PAGE, |p| {
                        p.difference(Perms::WRITE)
                    });
                }
            }
            Op::Relax { perms, .. } => {
                h.table.relax_perms(ipa, size, perms, tlb).unwrap();
                for &(base, level, _) in &touched {
                    let f = base / PAGE;
                    reference
                        .update_perms(f, f + crate::level_size(level) / PAGE, |p| p.union(perms));
                }
            }
            Op::Fault {
                out, perms, shared, ..
            } => {
                provision(&mut h, crate::FAULT_CACHE_PAGES, false);
                let leaf = crate::FaultMapping {
                    ipa,
                    size,
                    pa: PhysAddr::new(out * PAGE),
                    attrs: Attributes::normal(perms),
                };
                let r = if shared {
                    // SAFETY: single-threaded: no other walker can see a
                    // table this walk retires, so freeing it at once is safe.
                    let guard = unsafe { crossbeam_epoch::unprotected() };
                    h.table.map_shared(guard, leaf, &mut h.cache, tlb)
                } else {
                    h.table.map_leaf(leaf, &mut h.cache, tlb)
                };
                prop_assert_eq!(r, Ok(()));
                reference.set(first, end, out, perms);
            }
            Op::Split {
                starve, batched, ..
            } => {
                let needed = h.table.pages_needed_to_split(ipa, size).unwrap();
                let starved = provision(&mut h, needed, starve);
                let r = if batched {
                    h.table
                        .split_to_pages_batched(ipa, size, &mut h.cache, SkipHints::On, tlb)
                } else {
                    h.table
                        .split_to_pages(ipa, size, &mut h.cache, SkipHints::On, tlb)
                };
                prop_assert_eq!(r.is_err(), starved, "{:?}", r);
                if !starved {
                    prop_assert!(
                        leaves(&mut h, first, end)
                            .iter()
                            .all(|&(_, level, _)| level == 3),
                        "split left a block"
                    );
                }
            }
        }
        // Translations of every page in the touched region.
        let expected = reference.runs_in(region.0, region.1);
        let actual = table_runs(&mut h, region.0, region.1);
        prop_assert_eq!(&actual, &expected, "after {:?}", op);
        for page in [first, end - 1, (first + end) / 2] {
            let want = reference
                .runs_in(page, page + 1)
                .first()
                .map(|r| (r.out * PAGE, r.perms));
            let got = h
                .table
                .lookup(page * PAGE)
                .map(|m| (m.output.as_u64(), m.perms()));
            prop_assert_eq!(got, want, "lookup of page {:#x} after {:?}", page, op);
        }
        prop_assert_eq!(
            h.mem.live_pages(),
            h.table.table_pages() + h.cache.len(),
            "page accounting after {:?}",
            op
        );
        check_tlb(&reference, tlb)?;
        check_walks(&mut h, tlb)?;
        prop_assert!(
            tlb.pending_breaks().is_empty(),
            "a break was never made again: {:?}",
            tlb.pending_breaks()
        );
    }
    prop_assert_eq!(h.mem.check_quarantine(), 0, "a freed page was written");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn operations_match_the_reference_model(ops in prop::collection::vec(op(), 1..24), range_caps in any::<bool>()) {
        run_ops(&ops, range_caps)?;
    }
}
