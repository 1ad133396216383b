//! Model test of run-time memslot changes interleaved with faults.
//!
//! A random sequence of operations on three slot ids and six 2 MiB guest
//! windows: create a slot in a window (with a fresh backing), delete it, move
//! it to another window, start a fault (take the ticket, look the slot up,
//! translate: the first half of the fault path) and finish the oldest
//! started fault (`map_checked`). The model is a map from window to live
//! slot. It predicts every result: a create or move into a busy window is
//! refused, a fault finishes `Ok` exactly when no delete or move ran since
//! it started (creates do not invalidate), `Again` otherwise. After every
//! operation every leaf of the space must lie in a live slot and map its
//! backing at the right offset.

use crossbeam_epoch::Collector;
use memslot::{
    DirtyLogMode, Gfn, HostPhysAddr, MemslotError, Memslots, SlotFlags, SlotId, SlotSpec,
};
use pgtable::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use pgtable::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, FaultTicket, HostMemory, Mmu, PageCache,
    Perms, PhysAddr, SLOT_UNMAP_CACHE_PAGES, SlotSyncError, Stage2Config, Stage2PageTable,
    delete_slot, move_slot,
};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::sync::Arc;
use tlb::{RecordingTlb, TlbCaps};

const PAGE: u64 = 4096;
const WINDOW_PAGES: u64 = 512;
const WINDOW: u64 = WINDOW_PAGES * PAGE;
const WINDOWS: u64 = 6;
const BASE: u64 = 1 << 30;
const BACKING: u64 = 0x40_0000_0000;
const IDS: u32 = 3;

#[derive(Clone, Debug)]
enum Op {
    Create { id: u32, window: u64 },
    Delete { id: u32 },
    Move { id: u32, window: u64 },
    StartFault { window: u64, page: u64 },
    FinishFault,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..IDS, 0..WINDOWS).prop_map(|(id, window)| Op::Create { id, window }),
        1 => (0..IDS).prop_map(|id| Op::Delete { id }),
        1 => (0..IDS, 0..WINDOWS).prop_map(|(id, window)| Op::Move { id, window }),
        4 => (0..WINDOWS, 0..WINDOW_PAGES).prop_map(|(window, page)| Op::StartFault { window, page }),
        3 => Just(Op::FinishFault),
    ]
}

/// A fault between its lookup and its install.
struct Started {
    ticket: FaultTicket,
    leaf: FaultMapping,
    /// Invalidating changes (deletes and moves) the model had seen then.
    invalidations: u64,
}

/// The model's live slot of one id: (window, backing).
type Live = [Option<(u64, u64)>; IDS as usize];

fn window_ipa(window: u64) -> u64 {
    BASE + window * WINDOW
}

fn check_leaves(mmu: &Mmu<Arc<HostMemory>>, live: &Live) -> Result<(), TestCaseError> {
    let mut bad = None;
    let mut check = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        if ctx.old.is_valid() {
            let (ipa, out) = (ctx.base(), ctx.old.output().as_u64());
            let ok = live.iter().flatten().any(|&(window, backing)| {
                let base = window_ipa(window);
                (base..base + WINDOW).contains(&ipa) && out == backing + (ipa - base)
            });
            if !ok {
                bad = Some((ipa, out));
            }
        }
        Ok(Step::Continue)
    };
    mmu.write()
        .walk(BASE, WINDOWS * WINDOW, WalkFlags::LEAF, &mut check)
        .expect("exclusive walk");
    prop_assert!(bad.is_none(), "stale leaf {bad:x?}, live {live:x?}");
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let collector = Collector::new();
    let handle = collector.register();
    let mem = Arc::new(HostMemory::new());
    let table = Stage2PageTable::new(Stage2Config::new(40).unwrap(), mem.clone(), 1, true).unwrap();
    let mmu = Mmu::new(table, 1).unwrap();
    let cpu = mmu.register().unwrap();
    let memslots = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let tlb = RecordingTlb::new(TlbCaps {
        range: true,
        ttl: true,
        vmid_bits: 16,
    });
    let mut cache = PageCache::with_capacity(8);
    let mut live: Live = [None; IDS as usize];
    let mut started = VecDeque::new();
    let mut invalidations = 0;
    let mut next_backing = BACKING;
    let busy = |live: &Live, window: u64, except: u32| {
        live.iter()
            .enumerate()
            .any(|(i, s)| i as u32 != except && matches!(s, Some((w, _)) if *w == window))
    };
    for op in ops {
        cache
            .top_up(&*mem, SLOT_UNMAP_CACHE_PAGES.max(FAULT_CACHE_PAGES))
            .unwrap();
        match op {
            Op::Create { id, window } => {
                let spec = SlotSpec {
                    id: SlotId::new(id).unwrap(),
                    base_gfn: Gfn::from_ipa(window_ipa(window)),
                    npages: WINDOW_PAGES,
                    backing: HostPhysAddr(next_backing),
                    flags: SlotFlags::NONE,
                };
                let result = memslots.create(&handle, spec);
                if live[id as usize].is_some() || busy(&live, window, id) {
                    prop_assert!(result.is_err());
                } else {
                    prop_assert!(result.is_ok());
                    live[id as usize] = Some((window, next_backing));
                    next_backing += WINDOW;
                }
            }
            Op::Delete { id } => {
                let result = delete_slot(
                    &memslots,
                    &handle,
                    &mmu,
                    SlotId::new(id).unwrap(),
                    &mut cache,
                    &tlb,
                );
                match live[id as usize].take() {
                    Some((window, _)) => {
                        prop_assert_eq!(
                            result.map(|s| s.base_gfn),
                            Ok(Gfn::from_ipa(window_ipa(window)))
                        );
                        invalidations += 1;
                    }
                    None => prop_assert_eq!(
                        result,
                        Err(SlotSyncError::Memslot(MemslotError::NoSuchSlot(
                            SlotId::new(id).unwrap()
                        )))
                    ),
                }
            }
            Op::Move { id, window } => {
                let result = move_slot(
                    &memslots,
                    &handle,
                    &mmu,
                    SlotId::new(id).unwrap(),
                    Gfn::from_ipa(window_ipa(window)),
                    &mut cache,
                    &tlb,
                );
                match live[id as usize] {
                    Some((from, backing)) if from != window && !busy(&live, window, id) => {
                        prop_assert!(result.is_ok(), "{result:?}");
                        live[id as usize] = Some((window, backing));
                        invalidations += 1;
                    }
                    _ => prop_assert!(result.is_err()),
                }
            }
            Op::StartFault { window, page } => {
                let ipa = window_ipa(window) + page * PAGE;
                let ticket = mmu.fault_ticket();
                let guard = handle.pin();
                let slots = memslots.slots(&guard).unwrap();
                let found = slots
                    .find(Gfn::from_ipa(ipa))
                    .and_then(|s| s.translate(Gfn::from_ipa(ipa)));
                let expected = live.iter().flatten().find(|(w, _)| *w == window);
                prop_assert_eq!(found.map(|pa| pa.0), expected.map(|(_, b)| b + page * PAGE));
                if let Some(pa) = found {
                    started.push_back(Started {
                        ticket,
                        leaf: FaultMapping {
                            ipa,
                            size: PAGE,
                            pa: PhysAddr::new(pa.0),
                            attrs: Attributes::normal(Perms::RW),
                        },
                        invalidations,
                    });
                }
            }
            Op::FinishFault => {
                if let Some(fault) = started.pop_front() {
                    let result = mmu.read(&cpu).unwrap().map_checked(
                        fault.ticket,
                        fault.leaf,
                        &mut cache,
                        &tlb,
                    );
                    if fault.invalidations == invalidations {
                        prop_assert_eq!(result, Ok(()));
                    } else {
                        prop_assert_eq!(result, Err(Error::Again));
                    }
                }
            }
        }
        check_leaves(&mmu, &live)?;
    }
    cache.release(&*mem);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn slot_changes_and_faults_match_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
