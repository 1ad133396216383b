//! The fault path on one thread: what each shared operation does, and how
//! it answers a locked entry or a handle of another MMU.

extern crate std;

use super::{RANGE_CAPS, VMID};
use crate::walk::{Step, VisitContext, VisitKind, WalkError, WalkFlags};
use crate::{
    Attributes, Error, FAULT_CACHE_PAGES, FaultMapping, HostMemory, Mmu, PageCache, Perms,
    PhysAddr, Stage2Config, Stage2PageTable,
};
use std::sync::Arc;
use tlb::{ModelTlb, RecordingTlb};

const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;

fn mmu(mem: &Arc<HostMemory>) -> Mmu<Arc<HostMemory>> {
    let table =
        Stage2PageTable::new(Stage2Config::new(40).unwrap(), mem.clone(), VMID, true).unwrap();
    Mmu::new(table, 4).expect("CPU count")
}

#[test]
fn faults_map_relax_and_age() {
    let mem = Arc::new(HostMemory::new());
    let mmu = mmu(&mem);
    let cpu = mmu.register().unwrap();
    let tlb = ModelTlb::new(RANGE_CAPS);
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
    let ro = Attributes::normal(Perms::READ);
    mmu.read(&cpu)
        .unwrap()
        .map(
            FaultMapping {
                ipa: MIB2,
                size: MIB2,
                pa: PhysAddr::new(0x8020_0000),
                attrs: ro,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(cache.len(), FAULT_CACHE_PAGES - 1, "one level-2 table");
    let m = mmu.read(&cpu).unwrap().lookup(MIB2 + 0x123).unwrap();
    assert_eq!(
        (m.level, m.output, m.perms()),
        (2, PhysAddr::new(0x8020_0123), Perms::READ)
    );
    // A write fault on it: relax, flushed locally (the model drops it).
    tlb.fill(VMID, MIB2, 0x8020_0000, 2, false);
    mmu.read(&cpu)
        .unwrap()
        .relax_perms(MIB2 + PAGE, Perms::WRITE, &tlb)
        .unwrap();
    assert_eq!(tlb.lookup(VMID, MIB2), None);
    assert_eq!(
        mmu.read(&cpu).unwrap().lookup(MIB2).unwrap().perms(),
        Perms::RW
    );
    // Access flag: cleared on the write side, set by a fault.
    assert_eq!(mmu.write().test_and_clear_young(MIB2, MIB2), Ok(true));
    assert_eq!(mmu.read(&cpu).unwrap().set_young(MIB2), Ok(true));
    assert_eq!(mmu.read(&cpu).unwrap().set_young(MIB2), Ok(false));
    // A page fault inside the block splits it under the fault.
    mmu.read(&cpu)
        .unwrap()
        .map(
            FaultMapping {
                ipa: MIB2 + PAGE,
                size: PAGE,
                pa: PhysAddr::new(0x9000_0000),
                attrs: ro,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(
        mmu.read(&cpu).unwrap().lookup(MIB2 + PAGE).unwrap().output,
        PhysAddr::new(0x9000_0000)
    );
    assert_eq!(
        mmu.read(&cpu).unwrap().lookup(MIB2).unwrap().output,
        PhysAddr::new(0x8020_0000)
    );
    // Nothing mapped: relax and age answer Again (re-enter, fault again).
    assert_eq!(
        mmu.read(&cpu).unwrap().relax_perms(0, Perms::WRITE, &tlb),
        Err(Error::Again)
    );
    assert_eq!(mmu.read(&cpu).unwrap().set_young(0), Err(Error::Again));
    // Misaligned or odd-sized fault maps are refused.
    let bad = mmu.read(&cpu).unwrap().map(
        FaultMapping {
            ipa: PAGE,
            size: MIB2,
            pa: PhysAddr::new(0),
            attrs: ro,
        },
        &mut cache,
        &tlb,
    );
    assert_eq!(bad, Err(Error::Unaligned));
    let bad = mmu.read(&cpu).unwrap().map(
        FaultMapping {
            ipa: 0,
            size: 3 * PAGE,
            pa: PhysAddr::new(0),
            attrs: ro,
        },
        &mut cache,
        &tlb,
    );
    assert_eq!(bad, Err(Error::Unaligned));
    cache.release(&*mem);
}

#[test]
fn a_locked_entry_means_again() {
    let mem = Arc::new(HostMemory::new());
    let mmu = mmu(&mem);
    let cpu = mmu.register().unwrap();
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
    let rw = Attributes::normal(Perms::RW);
    mmu.read(&cpu)
        .unwrap()
        .map(
            FaultMapping {
                ipa: 0,
                size: PAGE,
                pa: PhysAddr::new(0x1000),
                attrs: rw,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    // Park the locked marker in the page's slot, as a break-before-make in
    // flight on another CPU would.
    let mut lock = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        ctx.try_lock()?;
        Ok(Step::Continue)
    };
    mmu.read(&cpu)
        .unwrap()
        .walk(0, PAGE, WalkFlags::LEAF, &mut lock)
        .unwrap();
    let remap = mmu.read(&cpu).unwrap().map(
        FaultMapping {
            ipa: 0,
            size: PAGE,
            pa: PhysAddr::new(0x2000),
            attrs: rw,
        },
        &mut cache,
        &tlb,
    );
    assert_eq!(remap, Err(Error::Again));
    assert_eq!(
        mmu.read(&cpu).unwrap().relax_perms(0, Perms::EXEC, &tlb),
        Err(Error::Again)
    );
    // A range walk steps over it.
    assert_eq!(
        mmu.write().write_protect(0, 2 * PAGE).map(|f| f.size),
        Ok(0)
    );
    // Publishing unlocks it again.
    let mut unlock = |ctx: &mut VisitContext<'_>, _: VisitKind| -> Result<Step, WalkError> {
        assert!(ctx.old.is_locked());
        ctx.publish(crate::Descriptor::leaf(3, PhysAddr::new(0x3000), rw, false));
        Ok(Step::Continue)
    };
    mmu.read(&cpu)
        .unwrap()
        .walk(0, PAGE, WalkFlags::LEAF, &mut unlock)
        .unwrap();
    assert_eq!(
        mmu.read(&cpu).unwrap().lookup(0).unwrap().output,
        PhysAddr::new(0x3000)
    );
    cache.release(&*mem);
}

#[test]
fn a_handle_of_another_mmu_is_refused() {
    let mem = Arc::new(HostMemory::new());
    let (one, two) = (mmu(&mem), mmu(&mem));
    let foreign = two.register().unwrap();
    assert!(matches!(one.read(&foreign), Err(Error::ForeignHandle)));
    assert!(two.read(&foreign).is_ok());
}

#[test]
fn a_collapse_under_a_fault_retires_the_table_to_the_epoch() {
    let mem = Arc::new(HostMemory::new());
    let mmu = mmu(&mem);
    let cpu = mmu.register().unwrap();
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
    let rw = Attributes::normal(Perms::RW);
    mmu.read(&cpu)
        .unwrap()
        .map(
            FaultMapping {
                ipa: 0,
                size: PAGE,
                pa: PhysAddr::new(0x4000_0000),
                attrs: rw,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    cache.release(&*mem);
    assert_eq!(
        mem.live_pages(),
        4,
        "two root pages, level-2 and level-3 tables"
    );
    // Held pinned by another CPU: the table survives the collapse.
    let other = mmu.register().unwrap();
    let pinned = other.epoch().pin();
    mmu.read(&cpu)
        .unwrap()
        .map(
            FaultMapping {
                ipa: 0,
                size: MIB2,
                pa: PhysAddr::new(0x4000_0000),
                attrs: rw,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(mmu.read(&cpu).unwrap().lookup(PAGE).unwrap().level, 2);
    for _ in 0..4 {
        mmu.collect(&cpu);
    }
    assert_eq!(
        mem.live_pages(),
        4,
        "retired, not freed, while another CPU is pinned"
    );
    drop(pinned);
    for _ in 0..4 {
        mmu.collect(&cpu);
    }
    assert_eq!(mem.live_pages(), 3, "freed once nobody is pinned");
    assert_eq!(mem.check_quarantine(), 0);
}

/// What a CPU's access does on the model: the TLB first, else a walk of the
/// table that fills the TLB. `true` when the access is allowed, `false` for
/// a permission fault (or no mapping).
fn access(
    mmu: &Mmu<Arc<HostMemory>>,
    cpu: &crate::MmuCpu,
    tlb: &ModelTlb,
    ipa: u64,
    write: bool,
) -> bool {
    let id = ModelTlb::cpu();
    if let Some(e) = tlb.lookup_on(id, VMID, ipa) {
        return e.writable || !write;
    }
    let Some(m) = mmu.read(cpu).unwrap().lookup(ipa) else {
        return false;
    };
    let writable = m.perms().contains(Perms::WRITE);
    tlb.fill_on(id, VMID, m.leaf_ipa, m.output.as_u64(), m.level, writable);
    writable || !write
}

/// A spurious permission fault: CPU A relaxes a read-only page; CPU B,
/// whose TLB still holds the read-only entry, faults on its own write. The
/// leaf is writable already, so B's relax changes nothing, but it must
/// invalidate the page on B, or B faults on the stale entry forever.
#[test]
fn a_spurious_permission_fault_invalidates_locally() {
    let mem = Arc::new(HostMemory::new());
    let mmu = mmu(&mem);
    let (a, b) = (mmu.register().unwrap(), mmu.register().unwrap());
    let tlb = ModelTlb::with_cpus(RANGE_CAPS, 2);
    let mut cache = PageCache::with_capacity(FAULT_CACHE_PAGES);
    cache.top_up(&*mem, FAULT_CACHE_PAGES).unwrap();
    for (size, ipa) in [(PAGE, MIB2 + 5 * PAGE), (MIB2, 4 * MIB2)] {
        let leaf = FaultMapping {
            ipa: ipa & !(size - 1),
            size,
            pa: PhysAddr::new(0x8000_0000 + (ipa & !(size - 1))),
            attrs: Attributes::normal(Perms::READ),
        };
        ModelTlb::set_cpu(0);
        mmu.read(&a).unwrap().map(leaf, &mut cache, &tlb).unwrap();
        // Both CPUs read the page: both cache the read-only entry.
        for cpu in [0, 1] {
            ModelTlb::set_cpu(cpu);
            let handle = if cpu == 0 { &a } else { &b };
            assert!(access(&mmu, handle, &tlb, ipa, false));
        }
        // A writes, faults, relaxes, and retries: it goes through.
        ModelTlb::set_cpu(0);
        assert!(!access(&mmu, &a, &tlb, ipa, true), "read-only at first");
        mmu.read(&a)
            .unwrap()
            .relax_perms(ipa, Perms::WRITE, &tlb)
            .unwrap();
        assert!(access(&mmu, &a, &tlb, ipa, true), "A's retry");
        // B writes: its TLB still says read-only (A's flush was local).
        ModelTlb::set_cpu(1);
        assert!(!access(&mmu, &b, &tlb, ipa, true), "B's stale entry faults");
        mmu.read(&b)
            .unwrap()
            .relax_perms(ipa, Perms::WRITE, &tlb)
            .unwrap();
        assert!(
            access(&mmu, &b, &tlb, ipa, true),
            "B's retry after a spurious fault must not fault again ({size:#x} leaf)"
        );
    }
    ModelTlb::set_cpu(0);
    cache.release(&*mem);
}
