//! Edge cases of every operation: level boundaries, the end of the IPA space,
//! concatenated roots, running out of pages, double maps, empty unmaps, the
//! exact TLB maintenance each operation emits.

extern crate std;

use super::{Harness, NO_RANGE_CAPS, RANGE_CAPS, VMID};
use crate::{
    Attributes, Error, MemType, Perms, PhysAddr, SkipHints, Stage2Config, Stage2PageTable,
    level_size,
};
use tlb::{ModelTlb, RecordingTlb, TlbiCounts};

const GIB: u64 = 1 << 30;
const MIB2: u64 = 2 << 20;
const PAGE: u64 = 4096;
const RW: Attributes = Attributes::normal(Perms::RW);

#[test]
fn blocks_land_on_1g_and_2m_boundaries() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    h.fill_cache(16);
    // [1 GiB - 2 MiB, 2 GiB + 2 MiB + 4 KiB): 2 MiB block, 1 GiB block, 2 MiB block, one page.
    let ipa = GIB - MIB2;
    let pa = PhysAddr::new(0x40_0000_0000 - MIB2);
    h.table
        .map(ipa, GIB + 2 * MIB2 + PAGE, pa, RW, &mut h.cache, &tlb)
        .unwrap();
    let level_of = |t: &Stage2PageTable<_>, ipa: u64| t.lookup(ipa).map(|m| m.level);
    assert_eq!(level_of(&h.table, GIB - PAGE), Some(2));
    assert_eq!(level_of(&h.table, GIB), Some(1));
    assert_eq!(level_of(&h.table, 2 * GIB - PAGE), Some(1));
    assert_eq!(level_of(&h.table, 2 * GIB), Some(2));
    assert_eq!(level_of(&h.table, 2 * GIB + MIB2), Some(3));
    assert_eq!(level_of(&h.table, 2 * GIB + MIB2 + PAGE), None);
    assert_eq!(level_of(&h.table, GIB - MIB2 - PAGE), None);
    assert_eq!(
        h.table.lookup(GIB + 0x1234).unwrap().output,
        PhysAddr::new(0x40_0000_0000 + 0x1234)
    );
    assert_eq!(
        tlb.counts(),
        TlbiCounts::default(),
        "mapping into empty slots needs no TLBI"
    );
    h.assert_accounting();
}

#[test]
fn misaligned_output_forces_pages() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let pa = PhysAddr::new(0x8000_1000);
    let needed = h.table.pages_needed_to_map(0, MIB2, pa).unwrap();
    assert_eq!(needed, 2, "one level-2 and one level-3 table");
    h.fill_cache(needed);
    h.table.map(0, MIB2, pa, RW, &mut h.cache, &tlb).unwrap();
    assert_eq!(h.cache.len(), 0);
    assert_eq!(h.table.lookup(MIB2 - PAGE).unwrap().level, 3);
    assert_eq!(
        h.table.lookup(MIB2 - PAGE).unwrap().output,
        PhysAddr::new(0x8000_1000 + MIB2 - PAGE)
    );
    h.assert_accounting();
}

#[test]
fn the_last_page_of_the_ipa_space_and_no_wrap_around() {
    for bits in [32, 36, 40, 48] {
        let mut h = Harness::new(bits);
        let tlb = RecordingTlb::new(RANGE_CAPS);
        let limit = 1u64 << bits;
        h.fill_cache(4);
        h.table
            .map(
                limit - PAGE,
                PAGE,
                PhysAddr::new(0x1000),
                RW,
                &mut h.cache,
                &tlb,
            )
            .unwrap();
        assert_eq!(
            h.table.lookup(limit - PAGE).unwrap().output,
            PhysAddr::new(0x1000)
        );
        assert_eq!(h.table.lookup(limit), None);
        assert_eq!(
            h.table.map(
                limit - PAGE,
                2 * PAGE,
                PhysAddr::new(0),
                RW,
                &mut h.cache,
                &tlb
            ),
            Err(Error::OutOfRange {
                ipa: limit - PAGE,
                size: 2 * PAGE
            })
        );
        assert_eq!(
            h.table.unmap(u64::MAX - PAGE + 1, PAGE, &mut h.cache, &tlb),
            Err(Error::OutOfRange {
                ipa: u64::MAX - PAGE + 1,
                size: PAGE
            })
        );
        assert_eq!(
            h.table
                .write_protect(PAGE, u64::MAX - PAGE + 1)
                .map(|f| f.size),
            Err(Error::OutOfRange {
                ipa: PAGE,
                size: u64::MAX - PAGE + 1
            })
        );
        assert_eq!(
            h.table
                .map(1, PAGE, PhysAddr::new(0), RW, &mut h.cache, &tlb),
            Err(Error::Unaligned)
        );
        h.table
            .unmap(limit - PAGE, PAGE, &mut h.cache, &tlb)
            .unwrap();
        assert_eq!(h.table.lookup(limit - PAGE), None);
        assert_eq!(
            h.table.table_pages(),
            h.table.config().root_pages(),
            "emptied tables are freed"
        );
        h.assert_accounting();
    }
}

#[test]
fn concatenated_roots_are_walked_as_one_table() {
    // 40 bits: level 1, two root pages; entry 512 lives in the second page.
    let mut h = Harness::new(40);
    assert_eq!(h.table.config().root_pages(), 2);
    assert!(h.table.root().is_aligned(2 * PAGE));
    let tlb = ModelTlb::new(RANGE_CAPS);
    h.fill_cache(8);
    let across = 512 * GIB - GIB;
    h.table
        .map(
            across,
            2 * GIB,
            PhysAddr::new(0x80_0000_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(h.table.lookup(512 * GIB - PAGE).unwrap().level, 1);
    assert_eq!(
        h.table.lookup(512 * GIB).unwrap().output,
        PhysAddr::new(0x80_4000_0000)
    );
    let root = crate::PageTableMemory::phys_to_virt(&*h.mem, h.table.root()).as_ptr();
    // SAFETY: the root is live and two pages long; index 512 is in the second page.
    let second_page_entry = unsafe { *root.add(512) };
    assert_eq!(
        second_page_entry & 0b11,
        0b01,
        "a block in the second root page"
    );
    // 32 bits: level 2, four root pages.
    let mut small = Harness::new(32);
    assert_eq!(
        (
            small.table.config().start_level(),
            small.table.config().root_pages()
        ),
        (2, 4)
    );
    small.fill_cache(4);
    small
        .table
        .map(
            0,
            4 * GIB,
            PhysAddr::new(0x1_0000_0000),
            RW,
            &mut small.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(small.table.lookup(4 * GIB - PAGE).unwrap().level, 2);
    assert_eq!(
        small.table.table_pages(),
        4,
        "2 MiB blocks straight in the root"
    );
    small.assert_accounting();
    let vtcr = small.table.config().vtcr(2, true).unwrap();
    assert_eq!(vtcr & 0x3f, 32);
}

#[test]
fn map_out_of_memory_changes_nothing() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    h.fill_cache(1);
    h.table
        .map(
            0,
            GIB,
            PhysAddr::new(0x40_0000_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    // A page inside the 1 GiB block needs two tables; with one cached, nothing changes.
    let pa = PhysAddr::new(0x1000);
    assert_eq!(h.table.pages_needed_to_map(0x20_0000, PAGE, pa), Ok(2));
    h.fill_cache(1);
    assert_eq!(
        h.table.map(0x20_0000, PAGE, pa, RW, &mut h.cache, &tlb),
        Err(Error::NoMemory)
    );
    assert_eq!(h.table.lookup(0x20_0000).unwrap().level, 1);
    assert_eq!(h.cache.len(), 1);
    assert_eq!(tlb.counts().total(), 0);
    h.fill_cache(2);
    h.table
        .map(0x20_0000, PAGE, pa, RW, &mut h.cache, &tlb)
        .unwrap();
    assert_eq!(h.table.lookup(0x20_0000).unwrap().output, pa);
    assert_eq!(
        h.table.lookup(0x20_1000).unwrap().output,
        PhysAddr::new(0x40_0020_1000),
        "rest of the block kept"
    );
    assert_eq!(
        h.table.lookup(0x40_0000).unwrap().level,
        2,
        "other 2 MiB parts stay blocks"
    );
    h.assert_accounting();
}

#[test]
fn split_out_of_memory_leaves_every_block_whole() {
    let mut h = Harness::new(40);
    let tlb = ModelTlb::new(RANGE_CAPS);
    // Eight 2 MiB blocks (misaligned to 1 GiB on the output side).
    h.fill_cache(1);
    h.table
        .map(
            GIB,
            8 * MIB2,
            PhysAddr::new(0x80_0020_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(h.table.pages_needed_to_split(GIB, 8 * MIB2), Ok(8));
    h.fill_cache(3);
    assert_eq!(
        h.table
            .split_to_pages(GIB, 8 * MIB2, &mut h.cache, SkipHints::On, &tlb),
        Err(Error::NoMemory)
    );
    let levels: std::vec::Vec<u8> = (0..8)
        .map(|i| h.table.lookup(GIB + i * MIB2).unwrap().level)
        .collect();
    assert_eq!(levels, [3, 3, 3, 2, 2, 2, 2, 2]);
    for page in (0..8 * MIB2).step_by(PAGE as usize) {
        assert_eq!(
            h.table.lookup(GIB + page).unwrap().output,
            PhysAddr::new(0x80_0020_0000 + page)
        );
    }
    h.assert_accounting();
    // A 1 GiB block needs 513 pages: with 512 it is left whole.
    let mut g = Harness::new(40);
    g.fill_cache(512);
    g.table
        .map(
            0,
            GIB,
            PhysAddr::new(0x40_0000_0000),
            RW,
            &mut g.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(
        g.table
            .split_to_pages(0, GIB, &mut g.cache, SkipHints::On, &tlb),
        Err(Error::NoMemory)
    );
    assert_eq!(g.table.lookup(GIB - PAGE).unwrap().level, 1);
    assert_eq!(g.cache.len(), 512);
    g.fill_cache(513);
    let stats = g
        .table
        .split_to_pages(0, GIB, &mut g.cache, SkipHints::On, &tlb)
        .unwrap();
    assert_eq!(stats.blocks_split, 1);
    assert_eq!(g.table.lookup(GIB - PAGE).unwrap().level, 3);
    assert_eq!(
        g.table.lookup(GIB - PAGE).unwrap().output,
        PhysAddr::new(0x40_0000_0000 + GIB - PAGE)
    );
    g.assert_accounting();
}

#[test]
fn double_map_is_free_and_a_remap_breaks_before_make() {
    let mut h = Harness::new(40);
    let tlb = ModelTlb::new(RANGE_CAPS);
    let rec = RecordingTlb::new(RANGE_CAPS);
    h.fill_cache(4);
    h.table
        .map(MIB2, MIB2, PhysAddr::new(0x20_0000), RW, &mut h.cache, &rec)
        .unwrap();
    h.table
        .map(MIB2, MIB2, PhysAddr::new(0x20_0000), RW, &mut h.cache, &rec)
        .unwrap();
    assert_eq!(rec.counts().total(), 0, "an identical map changes nothing");
    tlb.fill(VMID, MIB2, 0x20_0000, 2, true);
    h.table
        .map(MIB2, MIB2, PhysAddr::new(0x60_0000), RW, &mut h.cache, &tlb)
        .unwrap();
    assert_eq!(tlb.lookup(VMID, MIB2), None, "the old block is flushed");
    assert_eq!(
        h.table.lookup(MIB2 + 8).unwrap().output,
        PhysAddr::new(0x60_0008)
    );
    // Growing permissions of the same output needs no TLBI.
    h.table
        .map(
            MIB2,
            MIB2,
            PhysAddr::new(0x60_0000),
            Attributes::normal(Perms::RWX),
            &mut h.cache,
            &rec,
        )
        .unwrap();
    assert_eq!(rec.counts().total(), 0);
    // Shrinking them does.
    tlb.fill(VMID, MIB2, 0x60_0000, 2, true);
    h.table
        .map(
            MIB2,
            MIB2,
            PhysAddr::new(0x60_0000),
            Attributes::normal(Perms::READ),
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(tlb.lookup(VMID, MIB2), None);
    assert_eq!(h.table.lookup(MIB2).unwrap().perms(), Perms::READ);
    h.assert_accounting();
}

#[test]
fn unmap_of_nothing_does_nothing() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    h.table.unmap(0, 4 * GIB, &mut h.cache, &tlb).unwrap();
    h.table.unmap(GIB, 0, &mut h.cache, &tlb).unwrap();
    assert_eq!(tlb.counts().total(), 0);
    assert_eq!(h.table.table_pages(), 2);
    h.assert_accounting();
}

#[test]
fn unmap_of_1g_of_pages_is_one_range_op_and_frees_every_table() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let pa = PhysAddr::new(0x80_0000_1000);
    h.fill_cache(h.table.pages_needed_to_map(GIB, GIB, pa).unwrap());
    h.table.map(GIB, GIB, pa, RW, &mut h.cache, &tlb).unwrap();
    assert_eq!(h.table.table_pages(), 2 + 1 + 512);
    h.table.unmap(GIB, GIB, &mut h.cache, &tlb).unwrap();
    let counts = tlb.counts();
    assert_eq!(counts.total(), 2, "{counts:?}");
    assert_eq!((counts.range, counts.vmalle1), (1, 1));
    assert_eq!(h.table.table_pages(), 2);
    assert_eq!(h.mem.live_pages(), 2);
    assert_eq!(h.mem.check_quarantine(), 0, "nothing written after free");
}

#[test]
fn unmap_without_range_flushes_each_leaf() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(NO_RANGE_CAPS);
    h.fill_cache(2);
    h.table
        .map(0, 4 * PAGE, PhysAddr::new(0x1000), RW, &mut h.cache, &tlb)
        .unwrap();
    h.table.unmap(0, 4 * PAGE, &mut h.cache, &tlb).unwrap();
    let counts = tlb.counts();
    assert_eq!(counts.ipa, 4);
    assert_eq!(counts.range, 0);
    assert_eq!(
        counts.vmalls12, 2,
        "two emptied tables, each flushed as a whole-VMID op without range"
    );
    h.assert_accounting();
}

#[test]
fn unmap_of_many_pages_without_range_flushes_the_vmid_once() {
    let mut h = Harness::new(40);
    let pa = PhysAddr::new(0x80_0000_1000);
    for (pages, per_entry) in [
        (crate::PER_ENTRY_FLUSH_PAGES, true),
        (crate::PER_ENTRY_FLUSH_PAGES + 1, false),
        (GIB / PAGE, false),
    ] {
        let tlb = RecordingTlb::new(NO_RANGE_CAPS);
        let size = pages * PAGE;
        h.fill_cache(h.table.pages_needed_to_map(GIB, size, pa).unwrap());
        h.table.map(GIB, size, pa, RW, &mut h.cache, &tlb).unwrap();
        tlb.reset();
        h.table.unmap(GIB, size, &mut h.cache, &tlb).unwrap();
        let counts = tlb.counts();
        if per_entry {
            assert_eq!(counts.ipa, pages, "{pages} pages: {counts:?}");
        } else {
            assert_eq!(counts.total(), 1, "{pages} pages: {counts:?}");
            assert_eq!(counts.vmalls12, 1, "{pages} pages: {counts:?}");
        }
        assert_eq!(h.table.table_pages(), 2);
        assert_eq!(h.mem.check_quarantine(), 0, "nothing written after free");
    }
    // The model TLB: translations cached before the unmap are gone after.
    let tlb = ModelTlb::new(NO_RANGE_CAPS);
    let size = 1024 * PAGE;
    h.fill_cache(h.table.pages_needed_to_map(GIB, size, pa).unwrap());
    h.table.map(GIB, size, pa, RW, &mut h.cache, &tlb).unwrap();
    for page in [0, 1, 511, 512, 1023] {
        tlb.fill(VMID, GIB + page * PAGE, pa.as_u64() + page * PAGE, 3, true);
    }
    h.table.unmap(GIB, size, &mut h.cache, &tlb).unwrap();
    for page in [0, 1, 511, 512, 1023] {
        assert_eq!(tlb.lookup(VMID, GIB + page * PAGE), None, "page {page}");
    }
    h.assert_accounting();
}

#[test]
fn unmap_inside_a_block_splits_it() {
    let mut h = Harness::new(40);
    let tlb = ModelTlb::new(RANGE_CAPS);
    h.fill_cache(2);
    h.table
        .map(
            0,
            GIB,
            PhysAddr::new(0x40_0000_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    tlb.fill(VMID, 0, 0x40_0000_0000, 1, true);
    assert_eq!(h.table.pages_needed_to_unmap(MIB2 + PAGE, PAGE), Ok(2));
    let mut short = crate::PageCache::with_capacity(1);
    short.top_up(&*h.mem, 1).unwrap();
    assert_eq!(
        h.table.unmap(MIB2 + PAGE, PAGE, &mut short, &tlb),
        Err(Error::NoMemory)
    );
    assert_eq!(h.table.lookup(MIB2 + PAGE).unwrap().level, 1);
    short.release(&*h.mem);
    h.table
        .unmap(MIB2 + PAGE, PAGE, &mut h.cache, &tlb)
        .unwrap();
    assert_eq!(h.table.lookup(MIB2 + PAGE), None);
    assert_eq!(
        h.table.lookup(MIB2).unwrap().output,
        PhysAddr::new(0x40_0020_0000)
    );
    assert_eq!(h.table.lookup(MIB2 + 2 * PAGE).unwrap().level, 3);
    assert_eq!(h.table.lookup(GIB - PAGE).unwrap().level, 2);
    assert_eq!(tlb.lookup(VMID, 0), None, "the split block was flushed");
    h.assert_accounting();
}

#[test]
fn collapse_flushes_exactly_the_block_span() {
    let mut h = Harness::new(40);
    let tlb = ModelTlb::new(RANGE_CAPS);
    h.fill_cache(4);
    // 2 MiB of pages at [2 MiB, 4 MiB) and a page next door at 4 MiB.
    h.table
        .map(
            MIB2,
            MIB2 + PAGE,
            PhysAddr::new(0x1000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    tlb.fill(VMID, MIB2 + PAGE, 0x2000, 3, true);
    tlb.fill(VMID, 2 * MIB2, 0x20_1000, 3, true);
    let live = h.mem.live_pages();
    h.table
        .map(
            MIB2,
            MIB2,
            PhysAddr::new(0x4000_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    assert_eq!(h.table.lookup(MIB2).unwrap().level, 2);
    assert_eq!(h.mem.live_pages(), live - 1, "the level-3 table is freed");
    assert_eq!(
        tlb.lookup(VMID, MIB2 + PAGE),
        None,
        "inside the block: flushed"
    );
    assert!(
        tlb.lookup(VMID, 2 * MIB2).is_some(),
        "outside the block: not a whole-VMID flush"
    );
    h.assert_accounting();
    assert_eq!(h.mem.check_quarantine(), 0);
}

#[test]
fn write_protect_owes_one_flush_over_whole_leaves() {
    let mut h = Harness::new(40);
    let tlb = ModelTlb::new(RANGE_CAPS);
    h.fill_cache(4);
    h.table
        .map(
            0,
            2 * MIB2,
            PhysAddr::new(0x4000_0000),
            RW,
            &mut h.cache,
            &tlb,
        )
        .unwrap();
    tlb.fill(VMID, 0, 0x4000_0000, 2, true);
    tlb.fill(VMID, MIB2, 0x4020_0000, 2, true);
    let owed = h.table.write_protect(PAGE, PAGE).unwrap();
    assert_eq!((owed.ipa, owed.size), (0, MIB2), "the whole block touched");
    assert!(tlb.lookup(VMID, 0).is_some(), "no TLBI inside the walk");
    owed.flush(&tlb);
    assert_eq!(tlb.lookup(VMID, 0), None);
    assert!(tlb.lookup(VMID, MIB2).is_some());
    assert_eq!(h.table.lookup(0).unwrap().perms(), Perms::READ);
    assert_eq!(h.table.lookup(MIB2).unwrap().perms(), Perms::RW);
    let rec = RecordingTlb::new(RANGE_CAPS);
    h.table
        .relax_perms(0, MIB2, Perms::WRITE | Perms::EXEC, &rec)
        .unwrap();
    assert_eq!(h.table.lookup(0).unwrap().perms(), Perms::RWX);
    assert_eq!(rec.counts().sequences, 1);
    // Nothing to protect: nothing owed.
    let none = h.table.write_protect(GIB, GIB).unwrap();
    assert_eq!(none.size, 0);
    none.flush(&rec);
}

#[test]
fn access_flag_test_and_clear() {
    let mut h = Harness::new(40);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    h.fill_cache(4);
    h.table
        .map(0, 4 * PAGE, PhysAddr::new(0x1000), RW, &mut h.cache, &tlb)
        .unwrap();
    assert_eq!(h.table.is_young(0, 4 * PAGE), Ok(true));
    assert_eq!(h.table.test_and_clear_young(0, 4 * PAGE), Ok(true));
    assert_eq!(h.table.is_young(0, 4 * PAGE), Ok(false));
    assert_eq!(h.table.test_and_clear_young(0, 4 * PAGE), Ok(false));
    assert_eq!(h.table.set_young(2 * PAGE + 5), Ok(true));
    assert_eq!(h.table.set_young(2 * PAGE), Ok(false));
    assert!(h.table.lookup(2 * PAGE).unwrap().descriptor.is_young());
    assert!(!h.table.lookup(PAGE).unwrap().descriptor.is_young());
    assert_eq!(tlb.counts().total(), 0);
}

#[test]
fn split_with_and_without_hints_agree_and_hints_visit_less() {
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let mut visits = [0u64; 2];
    for (i, hints) in [SkipHints::On, SkipHints::Off].into_iter().enumerate() {
        let mut h = Harness::new(40);
        h.fill_cache(1);
        h.table
            .map(
                0,
                4 * MIB2,
                PhysAddr::new(0x4000_0000),
                RW,
                &mut h.cache,
                &tlb,
            )
            .unwrap();
        h.fill_cache(4);
        let first = h
            .table
            .split_to_pages(0, 4 * MIB2, &mut h.cache, hints, &tlb)
            .unwrap();
        assert_eq!(first.blocks_split, 4);
        for page in (0..4 * MIB2).step_by(PAGE as usize) {
            let m = h.table.lookup(page).unwrap();
            assert_eq!((m.level, m.output), (3, PhysAddr::new(0x4000_0000 + page)));
        }
        let again = h
            .table
            .split_to_pages(0, 4 * MIB2, &mut h.cache, hints, &tlb)
            .unwrap();
        assert_eq!(again.blocks_split, 0);
        visits[i] = again.visits;
        h.assert_accounting();
    }
    assert_eq!(visits, [4, 4 * 512], "hints: one visit per page table");
}

#[test]
fn destroy_frees_every_page() {
    let mem = std::sync::Arc::new(crate::HostMemory::new());
    let tlb = RecordingTlb::new(RANGE_CAPS);
    let mut table =
        Stage2PageTable::new(Stage2Config::new(40).unwrap(), mem.clone(), VMID, true).unwrap();
    let mut cache = crate::PageCache::with_capacity(600);
    let pa = PhysAddr::new(0x1000);
    cache
        .top_up(&*mem, table.pages_needed_to_map(0, GIB + MIB2, pa).unwrap())
        .unwrap();
    table
        .map(
            0,
            GIB + MIB2,
            pa,
            Attributes {
                perms: Perms::READ,
                mem: MemType::Device,
            },
            &mut cache,
            &tlb,
        )
        .unwrap();
    assert!(mem.live_pages() > 500);
    cache.release(&*mem);
    table.destroy(&tlb);
    assert_eq!(mem.live_pages(), 0);
    assert_eq!(tlb.counts().vmalls12, 1);
    assert_eq!(mem.check_quarantine(), 0);
}

#[test]
fn a_leaf_never_lands_at_level_0() {
    let mut h = Harness::new(48);
    let tlb = RecordingTlb::new(RANGE_CAPS);
    h.fill_cache(2);
    h.table
        .map(0, level_size(0), PhysAddr::new(0), RW, &mut h.cache, &tlb)
        .unwrap();
    assert_eq!(h.table.lookup(0).unwrap().level, 1);
    assert_eq!(h.table.lookup(level_size(0) - PAGE).unwrap().level, 1);
    h.assert_accounting();
}
