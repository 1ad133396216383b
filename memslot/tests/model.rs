//! Model-based tests: random management calls and queries against a plain
//! vector of slot specs, which validates requests by re-stating the rules
//! independently. Every answer, every error and every generation must match.

use crossbeam_epoch::{Collector, LocalHandle};
use memslot::{
    ChangeKind, DirtyLogMode, GFN_LIMIT, Gfn, HostPhysAddr, MAX_SLOT_PAGES, MAX_SLOTS,
    MemslotError, Memslots, PAGE_SIZE, SlotFlags, SlotId, SlotSpec, VcpuSlotCache,
};
use proptest::prelude::*;

/// The model: live slots in no particular order.
#[derive(Default)]
struct Model {
    slots: Vec<SlotSpec>,
    generation: u64,
}

impl Model {
    fn get(&self, id: SlotId) -> Option<&SlotSpec> {
        self.slots.iter().find(|s| s.id == id)
    }

    fn by_base(&self) -> Vec<SlotSpec> {
        let mut v = self.slots.clone();
        v.sort_by_key(|s| s.base_gfn);
        v
    }

    fn containing(&self, gfn: u64) -> Option<SlotSpec> {
        self.slots
            .iter()
            .copied()
            .find(|s| s.base_gfn.0 <= gfn && gfn < s.base_gfn.0 + s.npages)
    }

    fn shape_error(spec: &SlotSpec) -> Option<MemslotError> {
        let ro = spec.flags.bits() & 2 != 0;
        let log = spec.flags.bits() & 1 != 0;
        if spec.npages == 0 {
            Some(MemslotError::ZeroSize)
        } else if spec.npages >= 1 << 31 {
            Some(MemslotError::TooManyPages(spec.npages))
        } else if !spec.backing.0.is_multiple_of(4096) {
            Some(MemslotError::MisalignedBacking(spec.backing))
        } else if spec.base_gfn.0 as u128 + spec.npages as u128 > 1 << 40 {
            Some(MemslotError::GfnRangeOutOfBounds {
                base_gfn: spec.base_gfn,
                npages: spec.npages,
            })
        } else if spec.backing.0 as u128 + ((spec.npages as u128) << 12) > u64::MAX as u128 {
            Some(MemslotError::BackingRangeOverflow {
                backing: spec.backing,
                npages: spec.npages,
            })
        } else if ro && log {
            Some(MemslotError::DirtyLogOnReadOnly(spec.id))
        } else {
            None
        }
    }

    fn overlap(&self, spec: &SlotSpec) -> Option<MemslotError> {
        let end = spec.base_gfn.0 + spec.npages;
        self.by_base()
            .into_iter()
            .find(|s| {
                s.id != spec.id && s.base_gfn.0 < end && spec.base_gfn.0 < s.base_gfn.0 + s.npages
            })
            .map(|s| MemslotError::GuestOverlap {
                id: spec.id,
                other: s.id,
            })
    }

    fn commit(&mut self, remove: Option<SlotId>, insert: Option<SlotSpec>) -> u64 {
        if let Some(id) = remove {
            self.slots.retain(|s| s.id != id);
        }
        self.slots.extend(insert);
        self.generation += 1;
        self.generation
    }

    fn create(&mut self, spec: SlotSpec) -> Result<u64, MemslotError> {
        if let Some(e) = Self::shape_error(&spec) {
            return Err(e);
        }
        if self.get(spec.id).is_some() {
            return Err(MemslotError::IdInUse(spec.id));
        }
        if let Some(e) = self.overlap(&spec) {
            return Err(e);
        }
        Ok(self.commit(None, Some(spec)))
    }

    fn delete(&mut self, id: SlotId) -> Result<u64, MemslotError> {
        self.get(id).ok_or(MemslotError::NoSuchSlot(id))?;
        Ok(self.commit(Some(id), None))
    }

    fn update(&mut self, spec: SlotSpec) -> Result<(ChangeKind, u64), MemslotError> {
        let old = *self.get(spec.id).ok_or(MemslotError::NoSuchSlot(spec.id))?;
        if old.npages != spec.npages {
            return Err(MemslotError::SizeChange {
                id: spec.id,
                current: old.npages,
                requested: spec.npages,
            });
        }
        if old.backing != spec.backing {
            return Err(MemslotError::BackingChange(spec.id));
        }
        if (old.flags.bits() ^ spec.flags.bits()) & 2 != 0 {
            return Err(MemslotError::ReadOnlyChange(spec.id));
        }
        if old == spec {
            return Ok((ChangeKind::Unchanged, self.generation));
        }
        let moved = old.base_gfn != spec.base_gfn;
        if moved && let Some(e) = Self::shape_error(&spec).or_else(|| self.overlap(&spec)) {
            return Err(e);
        }
        let generation = self.commit(Some(spec.id), Some(spec));
        Ok((
            if moved {
                ChangeKind::Move
            } else {
                ChangeKind::FlagsOnly
            },
            generation,
        ))
    }

    fn move_slot(&mut self, id: SlotId, base_gfn: Gfn) -> Result<u64, MemslotError> {
        let old = *self.get(id).ok_or(MemslotError::NoSuchSlot(id))?;
        self.update(SlotSpec { base_gfn, ..old }).map(|(_, g)| g)
    }

    fn set_flags(&mut self, id: SlotId, flags: SlotFlags) -> Result<u64, MemslotError> {
        let old = *self.get(id).ok_or(MemslotError::NoSuchSlot(id))?;
        let spec = SlotSpec { flags, ..old };
        if let Some(e) = Self::shape_error(&spec) {
            return Err(e);
        }
        self.update(spec).map(|(_, g)| g)
    }

    fn set_region(&mut self, spec: SlotSpec) -> Result<(ChangeKind, u64), MemslotError> {
        if spec.npages == 0 {
            return self.delete(spec.id).map(|g| (ChangeKind::Delete, g));
        }
        if let Some(e) = Self::shape_error(&spec) {
            return Err(e);
        }
        if self.get(spec.id).is_none() {
            return self.create(spec).map(|g| (ChangeKind::Create, g));
        }
        self.update(spec)
    }
}

#[derive(Clone, Debug)]
struct RawSpec {
    id: u32,
    base: u64,
    npages: u64,
    backing: u64,
    flags: u32,
}

#[derive(Clone, Debug)]
enum Op {
    Create(RawSpec),
    SetRegion(RawSpec),
    Delete(u32),
    Move(u32, u64),
    SetFlags(u32, u32),
    Lookup(u64),
    Approx(u64),
    GfnRange(u64, u64),
    BackingQuery(u64, u64),
}

fn raw_id() -> impl Strategy<Value = u32> {
    prop_oneof![20 => 0u32..8, 1 => Just(MAX_SLOTS - 1), 1 => Just(MAX_SLOTS), 1 => MAX_SLOTS..u32::MAX]
}

fn base() -> impl Strategy<Value = u64> {
    prop_oneof![20 => 0u64..256, 1 => Just(GFN_LIMIT - 4), 1 => Just(GFN_LIMIT)]
}

fn npages() -> impl Strategy<Value = u64> {
    prop_oneof![20 => 1u64..48, 1 => Just(0), 1 => Just(MAX_SLOT_PAGES), 1 => Just(MAX_SLOT_PAGES + 1)]
}

fn backing() -> impl Strategy<Value = u64> {
    prop_oneof![
        20 => (0u64..128).prop_map(|p| p * PAGE_SIZE),
        1 => Just(0x10),
        1 => Just(u64::MAX - 3 * PAGE_SIZE + 1),
    ]
}

fn flags() -> impl Strategy<Value = u32> {
    prop_oneof![10 => 0u32..3, 1 => 3u32..9]
}

fn raw_spec() -> impl Strategy<Value = RawSpec> {
    (raw_id(), base(), npages(), backing(), flags()).prop_map(
        |(id, base, npages, backing, flags)| RawSpec {
            id,
            base,
            npages,
            backing,
            flags,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => raw_spec().prop_map(Op::Create),
        2 => raw_spec().prop_map(Op::SetRegion),
        3 => raw_id().prop_map(Op::Delete),
        3 => (raw_id(), base()).prop_map(|(i, b)| Op::Move(i, b)),
        3 => (raw_id(), flags()).prop_map(|(i, f)| Op::SetFlags(i, f)),
        5 => (0u64..320).prop_map(Op::Lookup),
        2 => (0u64..320).prop_map(Op::Approx),
        2 => (0u64..320, 0u64..64).prop_map(|(s, l)| Op::GfnRange(s, s + l)),
        3 => (0u64..140, 0u64..40).prop_map(|(s, l)| Op::BackingQuery(s * PAGE_SIZE, (s + l) * PAGE_SIZE)),
    ]
}

/// Builds the spec the way a caller must: id and flags are checked first.
fn build(raw: &RawSpec) -> Result<SlotSpec, MemslotError> {
    Ok(SlotSpec {
        id: SlotId::new(raw.id)?,
        base_gfn: Gfn(raw.base),
        npages: raw.npages,
        backing: HostPhysAddr(raw.backing),
        flags: SlotFlags::from_bits(raw.flags)?,
    })
}

fn expect_raw_errors(raw: &RawSpec) -> Option<MemslotError> {
    if raw.id >= 32767 {
        Some(MemslotError::IdOutOfRange(raw.id))
    } else if raw.flags & !3 != 0 {
        Some(MemslotError::UnknownFlags(raw.flags & !3))
    } else {
        None
    }
}

fn check_set(vm: &Memslots, handle: &LocalHandle, model: &Model) -> Result<(), TestCaseError> {
    let guard = handle.pin();
    let set = vm.slots(&guard).unwrap();
    prop_assert_eq!(set.generation(), model.generation);
    prop_assert_eq!(set.len(), model.slots.len());
    let live: Vec<SlotSpec> = set.iter().map(|s| s.spec()).collect();
    prop_assert_eq!(live, model.by_base());
    for spec in &model.slots {
        let slot = set.get(spec.id).expect("model slot present by id");
        prop_assert_eq!(slot.spec(), *spec);
        prop_assert_eq!(
            slot.dirty_bitmap().is_some(),
            spec.flags.contains(SlotFlags::LOG_DIRTY)
        );
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let collector = Collector::new();
    let handle = collector.register();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let mut model = Model::default();
    let mut cache = VcpuSlotCache::new();
    for op in ops {
        match op {
            Op::Create(raw) => match build(&raw) {
                Ok(spec) => prop_assert_eq!(vm.create(&handle, spec), model.create(spec)),
                Err(e) => prop_assert_eq!(Some(e), expect_raw_errors(&raw)),
            },
            Op::SetRegion(raw) => match build(&raw) {
                Ok(spec) => prop_assert_eq!(vm.set_region(&handle, spec), model.set_region(spec)),
                Err(e) => prop_assert_eq!(Some(e), expect_raw_errors(&raw)),
            },
            Op::Delete(raw) => match SlotId::new(raw) {
                Ok(id) => prop_assert_eq!(vm.delete(&handle, id), model.delete(id)),
                Err(e) => prop_assert_eq!(e, MemslotError::IdOutOfRange(raw)),
            },
            Op::Move(raw, base) => match SlotId::new(raw) {
                Ok(id) => prop_assert_eq!(
                    vm.move_slot(&handle, id, Gfn(base)),
                    model.move_slot(id, Gfn(base))
                ),
                Err(e) => prop_assert_eq!(e, MemslotError::IdOutOfRange(raw)),
            },
            Op::SetFlags(raw, bits) => match (SlotId::new(raw), SlotFlags::from_bits(bits)) {
                (Ok(id), Ok(flags)) => {
                    prop_assert_eq!(vm.set_flags(&handle, id, flags), model.set_flags(id, flags))
                }
                (Err(e), _) => prop_assert_eq!(e, MemslotError::IdOutOfRange(raw)),
                (_, Err(e)) => prop_assert_eq!(e, MemslotError::UnknownFlags(bits & !3)),
            },
            Op::Lookup(gfn) => {
                let guard = handle.pin();
                let set = vm.slots(&guard).unwrap();
                let want = model.containing(gfn);
                prop_assert_eq!(set.find(Gfn(gfn)).map(|s| s.spec()), want);
                prop_assert_eq!(
                    set.find_cached(Gfn(gfn), &mut cache).map(|s| s.spec()),
                    want
                );
                // A second time hits the vCPU's cache.
                prop_assert_eq!(
                    set.find_cached(Gfn(gfn), &mut cache).map(|s| s.spec()),
                    want
                );
                prop_assert_eq!(set.find(Gfn(gfn)).map(|s| s.spec()), want);
                if let Some(slot) = set.find(Gfn(gfn)) {
                    let want_pa = slot.backing().0 + (gfn - slot.base_gfn().0) * PAGE_SIZE;
                    prop_assert_eq!(slot.translate(Gfn(gfn)), Some(HostPhysAddr(want_pa)));
                }
            }
            Op::Approx(gfn) => {
                let guard = handle.pin();
                let set = vm.slots(&guard).unwrap();
                let sorted = model.by_base();
                let want = model
                    .containing(gfn)
                    .or_else(|| sorted.iter().copied().find(|s| s.base_gfn.0 > gfn))
                    .or_else(|| sorted.iter().copied().rev().find(|s| s.base_gfn.0 < gfn));
                prop_assert_eq!(set.find_approx(Gfn(gfn)).map(|s| s.spec()), want);
            }
            Op::GfnRange(start, end) => {
                let guard = handle.pin();
                let set = vm.slots(&guard).unwrap();
                let got: Vec<SlotSpec> = set
                    .in_gfn_range(Gfn(start), Gfn(end))
                    .map(|s| s.spec())
                    .collect();
                let want: Vec<SlotSpec> = model
                    .by_base()
                    .into_iter()
                    .filter(|s| {
                        start < end && s.base_gfn.0 < end && start < s.base_gfn.0 + s.npages
                    })
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::BackingQuery(start, end) => {
                let guard = handle.pin();
                let set = vm.slots(&guard).unwrap();
                let got: Vec<SlotSpec> = set
                    .overlapping_backing(HostPhysAddr(start), HostPhysAddr(end))
                    .map(|s| s.spec())
                    .collect();
                prop_assert!(
                    got.windows(2).all(|w| w[0].backing <= w[1].backing),
                    "not in backing order"
                );
                let mut got_ids: Vec<SlotId> = got.iter().map(|s| s.id).collect();
                got_ids.sort();
                let mut want: Vec<SlotId> = model
                    .slots
                    .iter()
                    .filter(|s| {
                        start < end
                            && s.backing.0 < end
                            && start < s.backing.0 + s.npages * PAGE_SIZE
                    })
                    .map(|s| s.id)
                    .collect();
                want.sort();
                prop_assert_eq!(got_ids, want);
            }
        }
        check_set(&vm, &handle, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn memslots_match_the_vector_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

#[test]
fn the_slot_limit_can_be_filled_and_not_passed() {
    let collector = Collector::new();
    let handle = collector.register();
    let vm = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
    let spec = |i: u32| SlotSpec {
        id: SlotId::new(i).unwrap(),
        base_gfn: Gfn(u64::from(i) * 4),
        npages: 3,
        backing: HostPhysAddr(u64::from(i % 1000) * 3 * PAGE_SIZE),
        flags: SlotFlags::NONE,
    };
    // Insert in a scrambled order so the trees see no sorted input.
    let order: Vec<u32> = (0..MAX_SLOTS).map(|i| (i * 7919) % MAX_SLOTS).collect();
    for (n, &i) in order.iter().enumerate() {
        assert_eq!(vm.create(&handle, spec(i)), Ok(n as u64 + 1));
    }
    assert_eq!(
        SlotId::new(MAX_SLOTS),
        Err(MemslotError::IdOutOfRange(MAX_SLOTS))
    );
    let again = spec(123);
    assert_eq!(
        vm.create(&handle, again),
        Err(MemslotError::IdInUse(again.id))
    );
    {
        let guard = handle.pin();
        let set = vm.slots(&guard).unwrap();
        assert_eq!(set.len(), MAX_SLOTS as usize);
        for i in (0..MAX_SLOTS).step_by(97) {
            let slot = set.find(Gfn(u64::from(i) * 4 + 2)).unwrap();
            assert_eq!(slot.id().get(), i);
            assert!(set.find(Gfn(u64::from(i) * 4 + 3)).is_none());
        }
        // Backing ranges repeat every 1000 slots: 33 aliases of each range.
        let aliases = set
            .overlapping_backing(HostPhysAddr(0), HostPhysAddr(PAGE_SIZE))
            .count();
        assert_eq!(aliases, (0..MAX_SLOTS).filter(|i| i % 1000 == 0).count());
        assert_eq!(set.in_gfn_range(Gfn(10), Gfn(21)).count(), 4);
    }
    for i in (0..MAX_SLOTS).step_by(2) {
        vm.delete(&handle, SlotId::new(i).unwrap()).unwrap();
    }
    let guard = handle.pin();
    let set = vm.slots(&guard).unwrap();
    assert_eq!(set.len(), (MAX_SLOTS / 2) as usize);
    assert!(set.iter().all(|s| s.id().get() % 2 == 1));
    assert_eq!(set.find(Gfn(4 * 5 + 1)).map(|s| s.id().get()), Some(5));
    assert!(set.find(Gfn(4 * 6 + 1)).is_none());
}
