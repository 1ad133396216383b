//! Dirty-log tests: harvesting with and without manual protection, masks,
//! initially-all-set bitmaps, and vCPU threads marking while the log is read.

use std::sync::Arc;
use std::thread;

use crossbeam_epoch::Collector;
use memslot::{
    DirtyLogMode, Gfn, HostPhysAddr, MemslotError, Memslots, SlotFlags, SlotId, SlotSpec,
};

const BASE: u64 = 0x40000;

fn spec(id: u32, npages: u64, flags: SlotFlags) -> SlotSpec {
    SlotSpec {
        id: SlotId::new(id).unwrap(),
        base_gfn: Gfn(BASE + u64::from(id) * 0x10000),
        npages,
        backing: HostPhysAddr(0x8000_0000 + u64::from(id) * 0x1000_0000),
        flags,
    }
}

/// Marks every page of slot `id` once, `threads` vCPUs sharing the pages
/// round-robin, each vCPU pinning and looking the slot up for every page as
/// the fault path does.
fn spawn_markers(
    vm: &Arc<Memslots>,
    collector: &Collector,
    id: u32,
    npages: u64,
    threads: u64,
) -> Vec<thread::JoinHandle<()>> {
    (0..threads)
        .map(|t| {
            let vm = vm.clone();
            let collector = collector.clone();
            thread::spawn(move || {
                let handle = collector.register();
                let base = spec(id, npages, SlotFlags::NONE).base_gfn.0;
                // A scrambled order, so words are hit from all sides.
                let mut pages: Vec<u64> = (0..npages).filter(|p| p % threads == t).collect();
                pages.sort_by_key(|p| p.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                for page in pages {
                    let guard = handle.pin();
                    let slot = vm.slots(&guard).unwrap().find(Gfn(base + page)).unwrap();
                    assert!(slot.mark_dirty(Gfn(base + page)));
                }
            })
        })
        .collect()
}

fn bits_of(words: &[u64]) -> Vec<u64> {
    let mut pages = Vec::new();
    for (w, &word) in words.iter().enumerate() {
        for b in 0..64 {
            if word & (1 << b) != 0 {
                pages.push(w as u64 * 64 + b);
            }
        }
    }
    pages
}

#[test]
fn concurrent_marks_are_each_harvested_exactly_once() {
    let collector = Collector::new();
    let handle = collector.register();
    let vm = Arc::new(Memslots::new(&collector, DirtyLogMode::default()).unwrap());
    let npages = 1 << 16;
    vm.create(&handle, spec(3, npages, SlotFlags::LOG_DIRTY))
        .unwrap();
    let id = SlotId::new(3).unwrap();
    let markers = spawn_markers(&vm, &collector, 3, npages, 3);
    let mut seen = vec![0u32; npages as usize];
    let mut words = vec![0u64; (npages / 64) as usize];
    let mut harvest = |seen: &mut Vec<u32>| {
        let n = vm.get_dirty_log(&handle, id, &mut words).unwrap();
        let pages = bits_of(&words);
        assert_eq!(pages.len() as u64, n);
        for p in pages {
            seen[p as usize] += 1;
        }
    };
    while !markers.iter().all(|m| m.is_finished()) {
        harvest(&mut seen);
    }
    for m in markers {
        m.join().unwrap();
    }
    harvest(&mut seen);
    assert!(
        seen.iter().all(|&c| c == 1),
        "a page was lost or reported twice"
    );
    harvest(&mut seen);
    assert!(seen.iter().all(|&c| c == 1), "a harvest cleared nothing");
}

#[test]
fn manual_protect_copies_and_clears_with_masks() {
    let collector = Collector::new();
    let handle = collector.register();
    let mode = DirtyLogMode {
        manual_protect: true,
        initially_all_set: false,
    };
    let vm = Arc::new(Memslots::new(&collector, mode).unwrap());
    let npages = 1 << 14;
    vm.create(&handle, spec(0, npages, SlotFlags::LOG_DIRTY))
        .unwrap();
    let id = SlotId::new(0).unwrap();
    let markers = spawn_markers(&vm, &collector, 0, npages, 2);
    let mut protected = vec![0u32; npages as usize];
    let mut words = vec![0u64; (npages / 64) as usize];
    let mut round = |protected: &mut Vec<u32>| {
        vm.get_dirty_log(&handle, id, &mut words).unwrap();
        // Clear the second half of the words first, then the first half, in
        // two calls with masks that also name pages not (yet) dirty.
        let half = words.len() / 2;
        for (first_word, range) in [(half, half..words.len()), (0, 0..half)] {
            let mut mask: Vec<u64> = words[range.clone()]
                .iter()
                .map(|w| w | 0x8000_0000_0000_0001)
                .collect();
            let asked = mask.clone();
            let n = vm
                .clear_dirty_log(&handle, id, first_word as u64 * 64, &mut mask)
                .unwrap();
            assert!(
                mask.iter().zip(&asked).all(|(got, ask)| got & !ask == 0),
                "reported a page not asked for"
            );
            assert_eq!(bits_of(&mask).len() as u64, n);
            for p in bits_of(&mask) {
                protected[first_word * 64 + p as usize] += 1;
            }
        }
    };
    while !markers.iter().all(|m| m.is_finished()) {
        round(&mut protected);
    }
    for m in markers {
        m.join().unwrap();
    }
    round(&mut protected);
    assert!(
        protected.iter().all(|&c| c == 1),
        "each page is re-protected exactly once"
    );

    // A copy does not clear.
    let slot_gfn = Gfn(spec(0, npages, SlotFlags::NONE).base_gfn.0 + 100);
    {
        let guard = handle.pin();
        vm.slots(&guard)
            .unwrap()
            .find(slot_gfn)
            .unwrap()
            .mark_dirty(slot_gfn);
    }
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(1));
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(1));
    assert_eq!(
        vm.clear_dirty_log(&handle, id, 3, &mut [1]),
        Err(MemslotError::DirtyClearUnaligned(3))
    );
    assert_eq!(
        vm.clear_dirty_log(&handle, id, npages, &mut [1]),
        Err(MemslotError::DirtyClearOutOfRange {
            first_page: npages,
            npages: 64
        })
    );
    assert_eq!(vm.clear_dirty_log(&handle, id, 64, &mut [1 << 36]), Ok(1));
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(0));
}

#[test]
fn initially_all_set_reports_every_page_first() {
    let collector = Collector::new();
    let handle = collector.register();
    assert_eq!(
        Memslots::new(
            &collector,
            DirtyLogMode {
                manual_protect: false,
                initially_all_set: true
            }
        )
        .err(),
        Some(MemslotError::InitiallySetNeedsManualProtect)
    );
    let mode = DirtyLogMode {
        manual_protect: true,
        initially_all_set: true,
    };
    let vm = Memslots::new(&collector, mode).unwrap();
    let id = SlotId::new(1).unwrap();
    vm.create(&handle, spec(1, 100, SlotFlags::NONE)).unwrap();
    let mut words = [0u64; 2];
    assert_eq!(
        vm.get_dirty_log(&handle, id, &mut words),
        Err(MemslotError::NotLogging(id))
    );
    // Enabling logging on a live slot starts all-set.
    vm.set_flags(&handle, id, SlotFlags::LOG_DIRTY).unwrap();
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(100));
    assert_eq!(words, [u64::MAX, (1 << 36) - 1]);
    let mut mask = [0x5555_5555_5555_5555u64, 0];
    assert_eq!(vm.clear_dirty_log(&handle, id, 0, &mut mask), Ok(32));
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(68));
    assert_eq!(
        vm.get_dirty_log(&handle, id, &mut [0]),
        Err(MemslotError::DirtyBufferTooSmall {
            needed: 2,
            given: 1
        })
    );
}

#[test]
fn flag_changes_keep_or_renew_the_bitmap_as_kvm() {
    let collector = Collector::new();
    let handle = collector.register();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let id = SlotId::new(2).unwrap();
    let s = spec(2, 64, SlotFlags::LOG_DIRTY);
    vm.create(&handle, s).unwrap();
    let mark = |gfn: u64| {
        let guard = handle.pin();
        vm.slots(&guard)
            .unwrap()
            .find(Gfn(gfn))
            .map(|slot| slot.mark_dirty(Gfn(gfn)))
    };
    assert_eq!(mark(s.base_gfn.0 + 5), Some(true));
    let mut words = [0u64];
    // Logging off drops the bitmap; back on starts a fresh, clear one.
    vm.set_flags(&handle, id, SlotFlags::NONE).unwrap();
    assert_eq!(mark(s.base_gfn.0 + 6), Some(false));
    assert_eq!(
        vm.get_dirty_log(&handle, id, &mut words),
        Err(MemslotError::NotLogging(id))
    );
    vm.set_flags(&handle, id, SlotFlags::LOG_DIRTY).unwrap();
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(0));
    // A move gets a fresh bitmap too; marks go by the new position.
    assert_eq!(mark(s.base_gfn.0 + 7), Some(true));
    vm.move_slot(&handle, id, Gfn(0x100)).unwrap();
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(0));
    assert_eq!(mark(0x100 + 9), Some(true));
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(1));
    assert_eq!(words, [1 << 9]);
    // Read-only slots cannot log, and read-only cannot be toggled live.
    assert_eq!(
        vm.set_flags(
            &handle,
            id,
            SlotFlags::LOG_DIRTY.union(SlotFlags::READ_ONLY)
        ),
        Err(MemslotError::DirtyLogOnReadOnly(id))
    );
    assert_eq!(
        vm.set_flags(&handle, id, SlotFlags::READ_ONLY),
        Err(MemslotError::ReadOnlyChange(id))
    );
    assert_eq!(
        vm.clear_dirty_log(&handle, id, 0, &mut [1]),
        Err(MemslotError::ManualProtectDisabled)
    );
}

#[test]
fn repeating_a_region_publishes_nothing() {
    let collector = Collector::new();
    let handle = collector.register();
    let vcpu = collector.register();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let id = SlotId::new(4).unwrap();
    let s = spec(4, 64, SlotFlags::LOG_DIRTY);
    vm.create(&handle, s).unwrap();
    let guard = vcpu.pin();
    let before = vm.slots(&guard).unwrap();
    assert_eq!(vm.set_flags(&handle, id, SlotFlags::LOG_DIRTY), Ok(1));
    assert_eq!(
        vm.set_region(&handle, s),
        Ok((memslot::ChangeKind::Unchanged, 1))
    );
    assert_eq!(vm.move_slot(&handle, id, s.base_gfn), Ok(1));
    // The reader's set is still the live one, and its marks are harvested.
    assert!(before.get(id).unwrap().mark_dirty(Gfn(s.base_gfn.0 + 1)));
    drop(guard);
    let mut words = [0u64];
    assert_eq!(vm.get_dirty_log(&handle, id, &mut words), Ok(1));
}

#[test]
fn the_mode_changes_only_while_no_slot_logs() {
    let collector = Collector::new();
    let handle = collector.register();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    vm.create(&handle, spec(1, 128, SlotFlags::NONE)).unwrap();
    let manual = DirtyLogMode {
        manual_protect: true,
        initially_all_set: true,
    };
    assert_eq!(
        vm.set_dirty_log_mode(
            &handle,
            DirtyLogMode {
                manual_protect: false,
                initially_all_set: true
            }
        ),
        Err(MemslotError::InitiallySetNeedsManualProtect)
    );
    vm.set_dirty_log_mode(&handle, manual).unwrap();
    assert_eq!(vm.dirty_log_mode(), manual);
    assert_eq!(DirtyLogMode::from_bits(manual.bits()), manual);
    // Initially all set: the new bitmap reports every page.
    vm.set_flags(&handle, SlotId::new(1).unwrap(), SlotFlags::LOG_DIRTY)
        .unwrap();
    let mut out = [0u64; 2];
    assert_eq!(
        vm.get_dirty_log(&handle, SlotId::new(1).unwrap(), &mut out),
        Ok(128)
    );
    assert_eq!(
        vm.set_dirty_log_mode(&handle, DirtyLogMode::default()),
        Err(MemslotError::LoggingActive(SlotId::new(1).unwrap()))
    );
    vm.set_flags(&handle, SlotId::new(1).unwrap(), SlotFlags::NONE)
        .unwrap();
    vm.set_dirty_log_mode(&handle, DirtyLogMode::default())
        .unwrap();
    assert_eq!(vm.dirty_log_mode(), DirtyLogMode::default());
}
