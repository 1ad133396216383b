//! A VM with memory tagging (`mte=on`) on the fake machine: refused on a
//! host without tags; its pages reach it with zero tags, at creation and
//! after a restart; a live migration carries the tags of every page it
//! copies, and its verification compares tags as well as data.

use super::*;

/// `conf` with `mte=on`.
fn tagged(mem_mib: u64, cpus: &[u32], start: bool) -> VmConf {
    VmConf {
        mte: Some(true),
        ..conf(mem_mib, cpus, start)
    }
}

/// A host like [`boot_info`]'s with FEAT_MTE2 on every CPU.
fn tagging_host() -> BootInfo {
    let mut info = boot_info(4);
    info.features.mte = true;
    info
}

/// The host address of byte `offset` of guest page `page` of `vm`'s RAM.
fn at(vm: &Vm<FakeHardware>, page: u64, offset: usize) -> usize {
    host_page(vm, slot0(), page) as usize + offset
}

/// Every granule of `vm`'s RAM whose tag is not zero.
fn tagged_granules(hw: &FakeHardware, vm: &Vm<FakeHardware>) -> Vec<usize> {
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let start = spec.backing.0 as usize;
    (start..start + (spec.npages * PAGE) as usize)
        .step_by(GRANULE)
        .filter(|&g| hw.tag(g) != 0)
        .collect()
}

#[test]
fn mte_is_refused_on_a_host_without_memory_tagging() {
    let hw = FakeHardware::new();
    let results = create_with(hw, &[("vm", tagged(4, &[0], true))], &boot_info(4));
    assert!(
        matches!(results[0], Err(VmError::NoMemoryTagging)),
        "{:?}",
        results[0].as_ref().err()
    );
    let message = results[0].as_ref().err().unwrap().to_string();
    assert!(message.contains("mte=on"), "{message}");
    // Without `mte=on` the same host makes the VM, without tagging.
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    assert!(!vm.mte);
}

#[test]
fn a_tagged_vm_gets_its_pages_with_zero_tags_at_creation_and_after_a_restart() {
    let hw = FakeHardware::with_tags();
    let vm = create_with(hw, &[("vm", tagged(4, &[0], true))], &tagging_host())
        .pop()
        .unwrap()
        .unwrap();
    assert!(vm.mte);
    // The fresh frames carried garbage tags; none is left.
    assert_eq!(tagged_granules(hw, vm), Vec::<usize>::new());
    // The guest tags some granules, then the VM restarts on fresh frames.
    for page in [0, 9, 1023] {
        hw.set_tag(at(vm, page, 32), 0x3);
    }
    assert_eq!(tagged_granules(hw, vm).len(), 3);
    restart::rebuild(vm).unwrap();
    assert_eq!(tagged_granules(hw, vm), Vec::<usize>::new());
}

#[test]
fn an_identity_ram_vm_keeps_its_frames_over_a_restart_with_zero_tags() {
    let hw = FakeHardware::with_tags();
    let conf = VmConf {
        ram: Some(boot_payload::vmconf::RamPlacement::Identity),
        ..tagged(4, &[0], true)
    };
    let vm = create_with(hw, &[("vm", conf)], &tagging_host())
        .pop()
        .unwrap()
        .unwrap();
    let before = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap().backing;
    hw.set_tag(at(vm, 100, 0), 0x7);
    restart::rebuild(vm).unwrap();
    assert_eq!(
        vm_ops::slot_spec(vm, slot0()).unwrap().unwrap().backing,
        before,
        "identity RAM moved"
    );
    assert_eq!(tagged_granules(hw, vm), Vec::<usize>::new());
}

/// A tagged source (CPU 0, running) and a waiting tagged destination (CPU
/// 1) of 8 MiB.
fn tagged_pair() -> (
    &'static FakeHardware,
    VmTable<FakeHardware>,
    &'static Vm<FakeHardware>,
    &'static Vm<FakeHardware>,
) {
    let hw = FakeHardware::with_tags();
    let vms: Vec<_> = create_with(
        hw,
        &[
            ("src", tagged(8, &[0], true)),
            ("dst", tagged(8, &[1], false)),
        ],
        &tagging_host(),
    )
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let table = VmTable::new(hw, vms.clone(), 4).unwrap();
    (hw, table, vms[0], vms[1])
}

#[test]
fn a_migration_carries_the_tags_of_every_page_it_copies() {
    let (hw, _table, src, dst) = tagged_pair();
    // Tags set before the migration (copied by round 0), and tags with new
    // data on pages the guest dirties while pre-copy runs (copied again).
    hw.set_tag(at(src, 1, 0), 0x1);
    hw.set_tag(at(src, 2047, 4080), 0xf);
    let report = live_migration::migrate(src, dst, options(true, 30_000), &mut |round| {
        if round == 0 {
            guest_write(src, 300, 0x33, true);
            hw.set_tag(at(src, 300, 16), 0x9);
            hw.set_tag(at(src, 1, 0), 0x2);
            guest_write(src, 1, 0x44, true);
        }
    })
    .unwrap();
    assert_eq!(report.differences, 0);
    let src_tags = tagged_granules(hw, src);
    assert_eq!(src_tags.len(), 3);
    let offset = |vm: &Vm<FakeHardware>, g: usize| {
        g - vm_ops::slot_spec(vm, slot0()).unwrap().unwrap().backing.0 as usize
    };
    let dst_tags = tagged_granules(hw, dst);
    assert_eq!(
        dst_tags.iter().map(|&g| offset(dst, g)).collect::<Vec<_>>(),
        src_tags.iter().map(|&g| offset(src, g)).collect::<Vec<_>>()
    );
    for (&d, &s) in dst_tags.iter().zip(&src_tags) {
        assert_eq!(hw.tag(d), hw.tag(s));
    }
    assert_eq!(hw.tag(at(dst, 1, 0)), 0x2, "the re-copied page's new tag");
    assert_eq!(hw.tag(at(dst, 300, 16)), 0x9);
    assert_eq!(hw.tag(at(dst, 2047, 4080)), 0xf);
}

/// A tag that changes behind the dirty log's back (as no real `STG`
/// can: it writes, so it faults and is logged) is a difference the
/// verification reports, though every data byte matches.
#[test]
fn verification_compares_tags_too() {
    let (hw, _table, src, dst) = tagged_pair();
    let err = live_migration::migrate(src, dst, options(true, 30_000), &mut |round| {
        if round == 0 {
            hw.set_tag(at(src, 77, 48), 0x5);
        }
    })
    .unwrap_err();
    assert_eq!(err, MigrateError::Differences(1));
    assert!(dst.awaiting_migration.load(Ordering::Acquire));
}

#[test]
fn a_migration_between_a_tagged_and_an_untagged_vm_is_refused() {
    let hw = FakeHardware::with_tags();
    let vms: Vec<_> = create_with(
        hw,
        &[
            ("src", tagged(8, &[0], true)),
            ("dst", conf(8, &[1], false)),
        ],
        &tagging_host(),
    )
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let _table = VmTable::new(hw, vms.clone(), 4).unwrap();
    let err = live_migration::request(vms[0], vms[1], MigrationOptions::default()).unwrap_err();
    assert!(
        matches!(err, MigrateError::Shape(what) if what.contains("mte")),
        "{err:?}"
    );
    assert!(vms[1].migration_job.lock().is_none());
}
