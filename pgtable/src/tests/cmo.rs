//! Cache maintenance for stage 2 without FWB: which ranges every operation
//! cleans or invalidates, and when.
//!
//! The page provider here ([`Probing`]) forwards to `HostMemory` (which
//! records every call) and, at each call, looks the leaf up in the live table
//! with a software walk of its own and reads the TLB recorder. That shows the
//! order: a map's maintenance must run while no valid descriptor maps the
//! memory yet (before the make), a relax's while the leaf is not yet
//! executable, and an unmap's after every TLB invalidation.

extern crate std;

use super::{RANGE_CAPS, VMID};
use crate::{
    Attributes, CacheOp, Descriptor, ENTRIES_PER_TABLE, FaultMapping, HostMemory, MemType, Mmu,
    PageCache, PageTableMemory, Perms, PhysAddr, Stage2Config, Stage2PageTable, level_shift,
};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::vec::Vec;
use tlb::RecordingTlb;

const MIB2: u64 = 2 << 20;
const PAGE: u64 = 4096;
/// Guest memory sits at IPA = PA - `OFFSET` in these tests.
const OFFSET: u64 = 0x40_0000_0000;

/// What the table and the TLB looked like when a maintenance call came.
#[derive(Clone, Copy, Debug)]
struct Seen {
    op: CacheOp,
    /// The valid leaf mapping the first byte's IPA then, if any.
    leaf: Option<Descriptor>,
    /// TLBI operations issued by then.
    tlbi: u64,
}

/// Host memory that probes the table at every maintenance call.
struct Probing {
    mem: HostMemory,
    /// Root, start level and root entries, once the table exists.
    root: OnceLock<(PhysAddr, u8, usize)>,
    tlb: Arc<RecordingTlb>,
    seen: Mutex<Vec<Seen>>,
    /// The IPA to look up instead of `PA - OFFSET`, when set.
    watch: Mutex<Option<u64>>,
}

impl Probing {
    fn new(tlb: Arc<RecordingTlb>) -> Arc<Self> {
        Arc::new(Self {
            mem: HostMemory::new(),
            root: OnceLock::new(),
            tlb,
            seen: Mutex::new(Vec::new()),
            watch: Mutex::new(None),
        })
    }

    /// The valid leaf mapping `ipa` now, read slot by slot.
    fn leaf_of(&self, ipa: u64) -> Option<Descriptor> {
        let &(mut table, mut level, mut entries) = self.root.get()?;
        loop {
            let slots = self.mem.phys_to_virt(table).as_ptr().cast::<AtomicU64>();
            let index = ((ipa >> level_shift(level)) as usize) & (entries - 1);
            // SAFETY: `table` is the root or a table reachable from it, with
            // `entries` slots, live while the operation under test runs.
            let d = Descriptor::from_raw(unsafe { (*slots.add(index)).load(Ordering::Acquire) });
            if d.is_table(level) {
                (table, level, entries) = (d.output(), level + 1, ENTRIES_PER_TABLE);
                continue;
            }
            return d.is_valid().then_some(d);
        }
    }

    fn record(&self, op: CacheOp, pa: PhysAddr) {
        let ipa = self.watch.lock().unwrap().unwrap_or(pa.as_u64() - OFFSET);
        let seen = Seen {
            op,
            leaf: self.leaf_of(ipa),
            tlbi: self.tlb.counts().total(),
        };
        self.seen.lock().unwrap().push(seen);
    }

    fn take(&self) -> Vec<Seen> {
        core::mem::take(&mut *self.seen.lock().unwrap())
    }
}

// SAFETY: forwards page management to `HostMemory`, which upholds the contract.
unsafe impl PageTableMemory for Probing {
    fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr> {
        self.mem.alloc_zeroed_pages(count)
    }
    unsafe fn free_pages(&self, pa: PhysAddr, count: usize) {
        // SAFETY: the caller upholds the contract of `free_pages`.
        unsafe { self.mem.free_pages(pa, count) }
    }
    fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64> {
        self.mem.phys_to_virt(pa)
    }
    fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
        self.record(CacheOp::CleanInvalDcache { pa, size }, pa);
        self.mem.clean_inval_dcache(pa, size);
    }
    fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
        self.record(CacheOp::InvalidateIcache { pa, size }, pa);
        self.mem.invalidate_icache(pa, size);
    }
}

struct Setup {
    mem: Arc<Probing>,
    tlb: Arc<RecordingTlb>,
    table: Stage2PageTable<Arc<Probing>>,
    cache: PageCache,
}

impl Setup {
    fn new(fwb: bool) -> Self {
        let tlb = Arc::new(RecordingTlb::new(RANGE_CAPS));
        let mem = Probing::new(tlb.clone());
        let config = Stage2Config::new(40).unwrap().with_fwb(fwb);
        let table = Stage2PageTable::new(config, mem.clone(), VMID, true).unwrap();
        mem.root
            .set((table.root(), config.start_level(), config.root_entries()))
            .unwrap();
        let mut cache = PageCache::with_capacity(64);
        cache.top_up(&*mem, 64).unwrap();
        Self {
            mem,
            tlb,
            table,
            cache,
        }
    }

    fn map(&mut self, ipa: u64, size: u64, attrs: Attributes) {
        let pa = PhysAddr::new(ipa + OFFSET);
        self.table
            .map(ipa, size, pa, attrs, &mut self.cache, &*self.tlb)
            .unwrap();
    }

    fn ops(&self) -> Vec<CacheOp> {
        self.mem.mem.cache_ops()
    }
}

fn clean(ipa: u64, size: u64) -> CacheOp {
    CacheOp::CleanInvalDcache {
        pa: PhysAddr::new(ipa + OFFSET),
        size,
    }
}

fn inval_i(ipa: u64, size: u64) -> CacheOp {
    CacheOp::InvalidateIcache {
        pa: PhysAddr::new(ipa + OFFSET),
        size,
    }
}

#[test]
fn no_fwb_map_cleans_each_new_leaf_before_it_is_published() {
    let mut s = Setup::new(false);
    // A 2 MiB block and one page, not executable.
    s.map(MIB2, MIB2 + PAGE, Attributes::normal(Perms::RW));
    assert_eq!(s.ops(), [clean(MIB2, MIB2), clean(2 * MIB2, PAGE)]);
    for seen in s.mem.take() {
        assert_eq!(
            seen.leaf, None,
            "{:?} ran after the leaf was published",
            seen.op
        );
    }
    assert!(s.table.lookup(2 * MIB2).is_some(), "and then it is mapped");
    // Mapping the same again changes nothing and maintains nothing.
    s.mem.mem.take_cache_ops();
    s.map(MIB2, MIB2 + PAGE, Attributes::normal(Perms::RW));
    assert_eq!(s.ops(), []);
    // Device memory is not cacheable: no cleaning.
    s.map(
        0x1000_0000,
        PAGE,
        Attributes {
            perms: Perms::RW,
            mem: MemType::Device,
        },
    );
    assert_eq!(s.ops(), []);
}

#[test]
fn no_fwb_map_of_executable_memory_also_invalidates_the_icache() {
    let mut s = Setup::new(false);
    s.map(0, PAGE, Attributes::normal(Perms::RWX));
    assert_eq!(s.ops(), [clean(0, PAGE), inval_i(0, PAGE)]);
    assert!(s.mem.take().iter().all(|seen| seen.leaf.is_none()));
}

#[test]
fn no_fwb_replacing_a_leaf_cleans_the_new_memory_after_the_break() {
    let mut s = Setup::new(false);
    s.map(0, PAGE, Attributes::normal(Perms::RW));
    s.mem.mem.take_cache_ops();
    s.mem.take();
    // Same IPA, another output: break-before-make.
    *s.mem.watch.lock().unwrap() = Some(0);
    let pa = PhysAddr::new(0x10_0000 + OFFSET);
    s.table
        .map(
            0,
            PAGE,
            pa,
            Attributes::normal(Perms::RW),
            &mut s.cache,
            &*s.tlb,
        )
        .unwrap();
    assert_eq!(
        s.ops(),
        [CacheOp::CleanInvalDcache { pa, size: PAGE }],
        "the new output, whole"
    );
    let seen = s.mem.take();
    assert_eq!(seen[0].leaf, None, "the slot was broken when the clean ran");
    assert!(seen[0].tlbi > 0, "and the old translation invalidated");
    assert_eq!(s.table.lookup(0).unwrap().output, pa);
}

#[test]
fn shared_fault_map_cleans_before_publishing() {
    let s = Setup::new(false);
    let Setup {
        mem,
        tlb,
        table,
        mut cache,
    } = s;
    let mmu = Mmu::new(table, 1).unwrap();
    let cpu = mmu.register().unwrap();
    let leaf = FaultMapping {
        ipa: MIB2,
        size: MIB2,
        pa: PhysAddr::new(MIB2 + OFFSET),
        attrs: Attributes::normal(Perms::RWX),
    };
    mmu.read(&cpu)
        .unwrap()
        .map(leaf, &mut cache, &*tlb)
        .unwrap();
    assert_eq!(
        mem.mem.cache_ops(),
        [clean(MIB2, MIB2), inval_i(MIB2, MIB2)]
    );
    assert!(mem.take().iter().all(|seen| seen.leaf.is_none()));
    assert!(mmu.read(&cpu).unwrap().lookup(MIB2).is_some());
    cache.release(&*mem);
}

#[test]
fn fwb_map_does_no_cleaning() {
    let mut s = Setup::new(true);
    s.map(MIB2, MIB2 + PAGE, Attributes::normal(Perms::RW));
    assert_eq!(s.ops(), [], "FWB: stage 2 forces write-back");
    // Instruction-cache maintenance does not depend on FWB (KVM does it too);
    // the provider skips it when CTR_EL0.DIC says the CPU does not need it.
    s.map(0x1000_0000, PAGE, Attributes::normal(Perms::RWX));
    assert_eq!(s.ops(), [inval_i(0x1000_0000, PAGE)]);
    assert_eq!(s.table.flush_dcache(0, 1 << 30).unwrap(), 0);
    s.mem.mem.take_cache_ops();
    s.table
        .unmap(0, 1 << 30, &mut PageCache::with_capacity(0), &*s.tlb)
        .unwrap();
    assert_eq!(s.ops(), []);
}

#[test]
fn relaxing_to_executable_invalidates_the_icache_first() {
    let mut s = Setup::new(false);
    s.map(MIB2, MIB2, Attributes::normal(Perms::RW));
    s.map(0, PAGE, Attributes::normal(Perms::READ));
    s.mem.mem.take_cache_ops();
    s.mem.take();
    // Exclusive relax, whole block.
    s.table
        .relax_perms(MIB2 + PAGE, PAGE, Perms::EXEC, &*s.tlb)
        .unwrap();
    assert_eq!(s.ops(), [inval_i(MIB2, MIB2)]);
    let seen = s.mem.take();
    let before = seen[0].leaf.expect("mapped");
    assert!(!before.perms().contains(Perms::EXEC), "before the update");
    // Adding write only: no maintenance.
    s.mem.mem.take_cache_ops();
    s.table.relax_perms(0, PAGE, Perms::WRITE, &*s.tlb).unwrap();
    assert_eq!(s.ops(), []);
    // Mapping the same output again with execute (permissions only grow).
    s.map(0, PAGE, Attributes::normal(Perms::RWX));
    assert_eq!(s.ops(), [inval_i(0, PAGE)]);
    assert!(!s.mem.take()[0].leaf.unwrap().perms().contains(Perms::EXEC));

    // Shared relax (a permission fault).
    s.map(4 * MIB2, PAGE, Attributes::normal(Perms::RW));
    s.mem.mem.take_cache_ops();
    s.mem.take();
    let Setup {
        mem,
        tlb,
        table,
        mut cache,
    } = s;
    let mmu = Mmu::new(table, 1).unwrap();
    let cpu = mmu.register().unwrap();
    mmu.read(&cpu)
        .unwrap()
        .relax_perms(4 * MIB2, Perms::EXEC, &*tlb)
        .unwrap();
    assert_eq!(mem.mem.cache_ops(), [inval_i(4 * MIB2, PAGE)]);
    assert!(!mem.take()[0].leaf.unwrap().perms().contains(Perms::EXEC));
    cache.release(&*mem);
}

#[test]
fn unmap_cleans_the_memory_after_the_deferred_flush() {
    let mut s = Setup::new(false);
    s.map(0, 2 * PAGE, Attributes::normal(Perms::RW));
    s.map(MIB2, MIB2, Attributes::normal(Perms::RW));
    s.mem.mem.take_cache_ops();
    s.mem.take();
    s.tlb.reset();
    s.table
        .unmap(0, 2 * MIB2, &mut PageCache::with_capacity(0), &*s.tlb)
        .unwrap();
    let flushes = s.tlb.counts();
    assert_eq!(
        flushes.ipa, 0,
        "one deferred range flush, no per-entry TLBI"
    );
    // The two pages merged into one range, then the block.
    assert_eq!(s.ops(), [clean(0, 2 * PAGE), clean(MIB2, MIB2)]);
    for seen in s.mem.take() {
        assert_eq!(seen.leaf, None);
        assert_eq!(seen.tlbi, flushes.total(), "cleaned after every flush");
    }
}

#[test]
fn flush_dcache_cleans_every_mapped_normal_leaf() {
    let mut s = Setup::new(false);
    s.map(0, PAGE, Attributes::normal(Perms::RW));
    s.map(MIB2, MIB2, Attributes::normal(Perms::RWX));
    s.map(
        0x1000_0000,
        PAGE,
        Attributes {
            perms: Perms::RW,
            mem: MemType::Device,
        },
    );
    s.mem.mem.take_cache_ops();
    s.tlb.reset();
    let before: Vec<u64> = [0, MIB2]
        .iter()
        .map(|&i| s.table.lookup(i).unwrap().descriptor.raw())
        .collect();
    assert_eq!(s.table.flush_dcache(0, 1 << 30).unwrap(), PAGE + MIB2);
    assert_eq!(s.ops(), [clean(0, PAGE), clean(MIB2, MIB2)]);
    assert_eq!(s.tlb.counts().total(), 0, "no descriptor changed: no TLBI");
    let after: Vec<u64> = [0, MIB2]
        .iter()
        .map(|&i| s.table.lookup(i).unwrap().descriptor.raw())
        .collect();
    assert_eq!(before, after);
}
