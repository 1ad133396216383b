//! Allocation tags (FEAT_MTE2) at EL2: turning tag access on, clearing the
//! tags of guest pages, copying and comparing them for a live migration.
//!
//! # Turning it on
//!
//! On a host whose CPUs have tag storage, the boot CPU ([`enable`]) gives all
//! of RAM the Tagged Normal memory type in its EL2 map (`MAIR_EL2` index 1
//! becomes `0xf0`, still write-back cacheable, so nothing held in the caches
//! changes meaning) and sets `SCTLR_EL2.ATA`. `SCTLR_EL2.TCF` stays 0: the
//! hypervisor's own loads and stores are never tag checked. Secondary CPUs
//! copy both registers from the boot CPU, and a CPU without FEAT_MTE2 is not
//! admitted (`platform::cpu_features`).
//!
//! # Clearing
//!
//! Every guest page comes through `Hardware::zero_memory` before a VM can map
//! it (VM creation, a new memslot, a restart). With tags on, that zeroes
//! whole blocks with `DC GZVA`, which writes zero data *and* zero tags in
//! one operation per `DCZID_EL0` block, so a page reaches a guest with the
//! tags of no earlier owner. Granules at unaligned ends are zeroed with
//! `STZG` (data and tag, 16 bytes), bytes below a granule with plain stores.
//!
//! # Copying and comparing
//!
//! A tag is 4 bits per 16-byte granule. `LDGM`/`STGM` move the tags of one
//! `GMID_EL1` block (up to 256 bytes, 16 tags in one register) at a time:
//! [`copy_tags`] loads a block's tags at the source and stores them at the
//! destination; [`tags_equal`] compares them block by block. Both need
//! block-aligned ranges, which pages are.
//!
//! # Registers
//!
//! A guest with memory tagging owns `GCR_EL1`, `RGSR_EL1`, `TFSR_EL1` and
//! `TFSRE0_EL1` (`HCR_EL2.ATA` set, no trap): [`read_tag_registers`] and
//! [`write_tag_registers`] capture and load them for a migration and a
//! vCPU's reset.
//!
//! The instructions are written with `.arch_extension memtag` so that the
//! image needs no MTE target feature: they run only after [`enabled`] says
//! the CPU has them.

use crate::sysreg_values;
use crate::vm::vcpu_state::TagState;
use crate::{read_sysreg, write_sysreg};
use core::sync::atomic::{AtomicBool, Ordering};

/// A granule: the bytes one allocation tag covers.
pub const GRANULE: usize = 16;

/// Tags are on at EL2 (set once by the boot CPU).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether the hypervisor maps RAM tagged and may access tags.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// Turns tag access on at EL2 on the boot CPU, before any guest page is
/// zeroed and before secondary CPUs copy its `MAIR_EL2`/`SCTLR_EL2`. Only
/// for a CPU with FEAT_MTE2.
pub fn enable() {
    let sctlr = read_sysreg!(sctlr_el2) | sysreg_values::SCTLR_EL2_ATA;
    // SAFETY: index 1 stays write-back cacheable normal memory (Tagged
    // Normal differs only in that tags are accessible), so no data in the
    // caches or the TLBs becomes wrong; the TLBs are invalidated so that no
    // entry keeps the old attribute. ATA only allows EL2 to reach tags.
    unsafe {
        write_sysreg!(mair_el2, sysreg_values::MAIR_EL2_TAGGED);
        write_sysreg!(sctlr_el2, sctlr);
        core::arch::asm!(
            "isb",
            "tlbi alle2",
            "dsb ish",
            "isb",
            options(nostack, preserves_flags)
        );
    }
    ENABLED.store(true, Ordering::Release);
}

/// Bytes whose tags `LDGM`/`STGM` move at once (`GMID_EL1.BS`: log2 of the
/// block in 4-byte words, 2 to 6).
fn tag_block() -> usize {
    4 << (read_sysreg!(s3_1_c0_c0_4) & 0xf) // GMID_EL1
}

/// Zeroes `[addr, addr + len)` and its allocation tags (see the module
/// doc); `dc_gzva_block` is the `DCZID_EL0` block size in bytes, `None`
/// where `DCZID_EL0.DZP` prohibits `DC GZVA` (then `STZG` does it all). Tags
/// must be [`enabled`].
pub fn zero_with_tags(addr: usize, len: usize, dc_gzva_block: Option<usize>) {
    let end = addr + len;
    let Some(dczva_block) = dc_gzva_block else {
        zero_granules(addr, end);
        return;
    };
    let first = addr.next_multiple_of(dczva_block).min(end);
    let last = (end & !(dczva_block - 1)).max(first);
    zero_granules(addr, first);
    let mut p = first;
    while p < last {
        // SAFETY: DC GZVA zeroes one aligned block of the caller's range,
        // data and tags; the caller owns it and it is mapped Tagged Normal.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "dc gzva, {}",
                in(reg) p,
                options(nostack, preserves_flags)
            )
        }
        p += dczva_block;
    }
    zero_granules(last, end);
}

/// Zeroes `[from, to)`: whole granules with `STZG`, the bytes outside them
/// with plain stores (their granules' tags are left as they are).
fn zero_granules(from: usize, to: usize) {
    if to <= from {
        return;
    }
    let g_first = from.next_multiple_of(GRANULE).min(to);
    let g_last = (to & !(GRANULE - 1)).max(g_first);
    let plain = |a: usize, b: usize| {
        if b > a {
            // SAFETY: the caller owns the range; it is mapped as normal memory.
            unsafe { core::ptr::write_bytes(a as *mut u8, 0, b - a) }
        }
    };
    plain(from, g_first);
    let mut p = g_first;
    while p < g_last {
        // SAFETY: STZG zeroes the 16-byte granule at `p` and its tag (the
        // tag of the address register, whose top byte is zero); the granule
        // lies in the caller's range.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "stzg {0}, [{0}]",
                in(reg) p,
                options(nostack, preserves_flags)
            )
        }
        p += GRANULE;
    }
    plain(g_last, to);
}

/// Copies the allocation tags of `len` bytes at `from` to `to`. Both
/// addresses and `len` are multiples of the tag block (pages are). Tags
/// must be [`enabled`].
pub fn copy_tags(from: usize, to: usize, len: usize) {
    let block = tag_block();
    debug_assert!(
        from.is_multiple_of(block) && to.is_multiple_of(block) && len.is_multiple_of(block)
    );
    let mut offset = 0;
    while offset < len {
        // SAFETY: LDGM reads the tags of one block of the source and STGM
        // writes them to the destination block; both lie in ranges the
        // caller owns, mapped Tagged Normal. No data bytes change.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "ldgm {tags}, [{src}]",
                "stgm {tags}, [{dst}]",
                tags = out(reg) _,
                src = in(reg) from + offset,
                dst = in(reg) to + offset,
                options(nostack, preserves_flags)
            )
        }
        offset += block;
    }
}

/// Whether the `len` bytes at `a` and at `b` carry the same allocation
/// tags (alignment as for [`copy_tags`]).
pub fn tags_equal(a: usize, b: usize, len: usize) -> bool {
    let block = tag_block();
    let mut offset = 0;
    while offset < len {
        let (x, y): (u64, u64);
        // SAFETY: LDGM only reads the tags of one block of each range, which
        // the caller owns and which is mapped Tagged Normal.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "mov {x}, xzr",
                "mov {y}, xzr",
                "ldgm {x}, [{a}]",
                "ldgm {y}, [{b}]",
                x = out(reg) x,
                y = out(reg) y,
                a = in(reg) a + offset,
                b = in(reg) b + offset,
                options(nostack, preserves_flags, readonly)
            )
        }
        if x != y {
            return false;
        }
        offset += block;
    }
    true
}

/// The running guest's tag registers (its VM has memory tagging; they exist
/// only on a CPU with FEAT_MTE2).
pub fn read_tag_registers() -> TagState {
    TagState {
        gcr_el1: read_sysreg!(s3_0_c1_c0_6),
        rgsr_el1: read_sysreg!(s3_0_c1_c0_5),
        tfsr_el1: read_sysreg!(s3_0_c5_c6_0),
        tfsre0_el1: read_sysreg!(s3_0_c5_c6_1),
    }
}

/// Loads a guest's tag registers (zero: as after a reset).
///
/// # Safety
///
/// No guest runs on this CPU, which has FEAT_MTE2; the values are the
/// guest's own.
pub unsafe fn write_tag_registers(tags: &TagState) {
    // SAFETY: the caller's contract: these EL1 registers belong to the guest
    // about to run here and the CPU has them.
    unsafe {
        write_sysreg!(s3_0_c1_c0_6, tags.gcr_el1); // GCR_EL1
        write_sysreg!(s3_0_c1_c0_5, tags.rgsr_el1); // RGSR_EL1
        write_sysreg!(s3_0_c5_c6_0, tags.tfsr_el1); // TFSR_EL1
        write_sysreg!(s3_0_c5_c6_1, tags.tfsre0_el1); // TFSRE0_EL1
    }
}
