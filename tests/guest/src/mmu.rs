//! EL1 stage-1 MMU: an identity map of the 39-bit address space in 1 GiB
//! blocks from one level-1 table.
//!
//! With the MMU off every data access is Device-nGnRnE, where exclusives are
//! not guaranteed to work and unaligned accesses fault; the guest therefore
//! maps RAM as normal write-back memory and everything else as device memory
//! (execute-never), identity so that a virtual address is the IPA. Before the
//! device tree is read, the boot map holds two blocks: the first gigabyte
//! (device, where the UART is) and the gigabyte holding the image (normal).
//! Once RAM is known, every still-invalid entry is filled: normal where it
//! overlaps RAM, device elsewhere. Filling invalid entries needs no TLB
//! invalidation (invalid entries are never cached), only a barrier.
//!
//! Scenarios that run code at EL0 replace a gigabyte's block with one EL0 may
//! use ([`map_el0_block`]): normal memory, never executable at EL1, readable
//! (or also writable) and executable at EL0. A valid entry is replaced
//! break-before-make: invalidate it, flush the TLBs, write the new one.
//! The last entry is no identity map: it aliases the first gigabyte (where
//! the devices are) as normal non-cacheable memory at [`DEVICE_ALIAS_BASE`].
//! Device memory faults an unaligned access in the guest itself; through the
//! alias an 8-byte load at a device window's last 4 bytes reaches the
//! hypervisor, which must refuse it.
//!
//! Memory tagging (`mte`, `migrate` with `migrate-tags`) uses a second alias
//! ([`map_tagged_alias`]): the next-to-last entry maps a RAM gigabyte again
//! as Tagged Normal write-back memory (MAIR attribute 3, `0xf0`), so that
//! allocation tags of that memory can be read and written and, with tag
//! checks on, accesses through it are checked, while the identity map
//! stays untagged (never checked). [`enable_tagged_attribute`] puts the
//! attribute into this vCPU's `MAIR_EL1` (per CPU; only on a CPU with
//! FEAT_MTE2, where `0xf0` is defined) and may set `TCR_EL1.TBI0`, so that a
//! logical tag in bits 59:56 of a pointer is ignored by translation.

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::platform::Platform;

const ENTRIES: usize = 512;
const BLOCK_SHIFT: u32 = 30;
/// Virtual address bits (T0SZ = 64 - 39): one level-1 table covers them all.
const VA_BITS: u64 = 39;

/// Level-1 block descriptor bits.
const DESC_VALID_BLOCK: u64 = 0b01;
const DESC_ATTR_DEVICE: u64 = 0; // MAIR attribute 0 in AttrIndx [4:2]
const DESC_ATTR_NORMAL: u64 = 1 << 2; // MAIR attribute 1
const DESC_ATTR_NORMAL_NON_CACHEABLE: u64 = 2 << 2; // MAIR attribute 2
const DESC_ATTR_NORMAL_TAGGED: u64 = 3 << 2; // MAIR attribute 3
const DESC_INNER_SHAREABLE: u64 = 0b11 << 8;
const DESC_ACCESS_FLAG: u64 = 1 << 10;
/// AP\[1\]: EL0 may access the block.
const DESC_AP_EL0: u64 = 1 << 6;
/// AP\[2\]: read-only (at EL1 and, with AP\[1\], at EL0).
const DESC_AP_READ_ONLY: u64 = 1 << 7;
const DESC_PXN: u64 = 1 << 53;
const DESC_UXN: u64 = 1 << 54;

/// MAIR_EL1: attribute 0 Device-nGnRnE, attribute 1 Normal write-back,
/// attribute 2 Normal non-cacheable.
const MAIR: u64 = (0xff << 8) | (0x44 << 16);

/// Level-1 entry of the normal non-cacheable alias of the first gigabyte.
const DEVICE_ALIAS_INDEX: usize = ENTRIES - 1;
/// Virtual address of the alias: `DEVICE_ALIAS_BASE + pa` reaches physical
/// address `pa` (below 1 GiB) as normal non-cacheable memory.
pub const DEVICE_ALIAS_BASE: u64 = (DEVICE_ALIAS_INDEX as u64) << BLOCK_SHIFT;
/// MAIR_EL1 attribute 3 (bits 31:24): Tagged Normal write-back (FEAT_MTE2),
/// set only by [`enable_tagged_attribute`].
const MAIR_ATTR3_TAGGED: u64 = 0xf0 << 24;
/// `TCR_EL1.TBI0`: the top byte of a TTBR0 address is ignored.
const TCR_TBI0: u64 = 1 << 37;
/// Level-1 entry of the tagged alias ([`map_tagged_alias`]).
const TAGGED_ALIAS_INDEX: usize = ENTRIES - 2;
/// Virtual address of the tagged alias: `TAGGED_ALIAS_BASE + offset` reaches
/// `offset` into the gigabyte [`map_tagged_alias`] mapped.
pub const TAGGED_ALIAS_BASE: u64 = (TAGGED_ALIAS_INDEX as u64) << BLOCK_SHIFT;
/// SCTLR_EL1: RES1 bits of Armv8.0 plus M, C, SA and I.
const SCTLR: u64 = 0x30d0_0800 | (1 << 0) | (1 << 2) | (1 << 3) | (1 << 12);

#[repr(C, align(4096))]
struct Level1Table([AtomicU64; ENTRIES]);

static LEVEL1: Level1Table = Level1Table([const { AtomicU64::new(0) }; ENTRIES]);

fn device_block(index: usize) -> u64 {
    ((index as u64) << BLOCK_SHIFT)
        | DESC_VALID_BLOCK
        | DESC_ATTR_DEVICE
        | DESC_ACCESS_FLAG
        | DESC_PXN
        | DESC_UXN
}

fn normal_block(index: usize) -> u64 {
    ((index as u64) << BLOCK_SHIFT)
        | DESC_VALID_BLOCK
        | DESC_ATTR_NORMAL
        | DESC_INNER_SHAREABLE
        | DESC_ACCESS_FLAG
        | DESC_UXN
}

/// The alias entry: physical gigabyte 0, normal non-cacheable, never
/// executable.
fn device_alias_block() -> u64 {
    DESC_VALID_BLOCK | DESC_ATTR_NORMAL_NON_CACHEABLE | DESC_ACCESS_FLAG | DESC_PXN | DESC_UXN
}

/// Physical address bits the table may use: the CPU's, capped at 40 (IPS 2),
/// which covers the 39-bit identity map.
fn ips_field() -> (u64, u64) {
    let mmfr0: u64;
    // SAFETY: reading an ID register has no side effects.
    unsafe { asm!("mrs {}, id_aa64mmfr0_el1", out(reg) mmfr0, options(nomem, nostack)) };
    let parange = (mmfr0 & 0xf).min(2);
    let bits = [32, 36, 40][parange as usize];
    (parange, bits)
}

/// Cleans and invalidates the table's cache lines, so the walker (which
/// reads it as cacheable memory) never sees lines older than what the MMU-off
/// stores wrote to memory.
fn clean_invalidate_table() {
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack)) };
    let line = 4usize << ((ctr >> 16) & 0xf);
    let start = LEVEL1.0.as_ptr() as usize;
    for address in (start..start + ENTRIES * 8).step_by(line) {
        // SAFETY: DC CIVAC on memory the guest owns only moves data between
        // cache and memory; it changes no value.
        unsafe { asm!("dc civac, {}", in(reg) address, options(nostack)) };
    }
    // SAFETY: barriers only order memory accesses.
    unsafe { asm!("dsb sy", options(nostack)) };
}

/// The shared level-1 table, for scenarios that map more (the fuzzer's EL0
/// window).
pub fn level1() -> &'static [AtomicU64; ENTRIES] {
    &LEVEL1.0
}

/// Builds the boot map (first gigabyte device, the image's gigabyte normal)
/// and turns on the MMU of the boot vCPU. Runs with the MMU off.
pub fn enable_boot_map(image_start: u64) {
    clean_invalidate_table();
    LEVEL1.0[0].store(device_block(0), Ordering::Relaxed);
    let image_index = (image_start >> BLOCK_SHIFT) as usize;
    LEVEL1.0[image_index].store(normal_block(image_index), Ordering::Relaxed);
    clean_invalidate_table();
    enable_current_map();
}

/// Turns on this vCPU's MMU with the shared table (secondaries call it once the
/// boot vCPU has completed the map).
pub fn enable_current_map() {
    let (ips, _) = ips_field();
    let t0sz = 64 - VA_BITS;
    // T0SZ, IRGN0/ORGN0 write-back, SH0 inner shareable, TG0 4 KiB, EPD1 (no
    // TTBR1 walks), IPS.
    let tcr = t0sz | (1 << 8) | (1 << 10) | (0b11 << 12) | (1 << 23) | (ips << 32);
    let table = LEVEL1.0.as_ptr() as u64;
    // SAFETY: the table identity-maps the code, stack and data in use, so
    // execution continues at the same addresses once the MMU is on; TLBs are
    // invalidated before enabling.
    unsafe {
        asm!(
            "msr mair_el1, {mair}",
            "msr tcr_el1, {tcr}",
            "msr ttbr0_el1, {ttbr}",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            "msr sctlr_el1, {sctlr}",
            "isb",
            mair = in(reg) MAIR,
            tcr = in(reg) tcr,
            ttbr = in(reg) table,
            sctlr = in(reg) SCTLR,
            options(nostack),
        );
    }
}

/// Maps the gigabytes that may hold the device tree (at most 2 MiB from
/// `dtb`) as normal memory, when the boot map does not cover them yet: the
/// device tree lies in RAM, and RAM is only known once it is read.
pub fn map_device_tree(dtb: u64) {
    const MAX_DTB_SIZE: u64 = 2 << 20;
    for address in [dtb, dtb + MAX_DTB_SIZE - 1] {
        let index = (address >> BLOCK_SHIFT) as usize;
        if index < ENTRIES && LEVEL1.0[index].load(Ordering::Relaxed) == 0 {
            LEVEL1.0[index].store(normal_block(index), Ordering::Relaxed);
        }
    }
    // SAFETY: barriers only order the table stores before later accesses.
    unsafe { asm!("dsb ishst", "isb", options(nostack)) };
}

/// Fills every invalid entry: normal memory where the gigabyte overlaps RAM,
/// device memory elsewhere (up to the physical address size in use), and the
/// last entry with the device alias.
pub fn map_everything(platform: &Platform) {
    if LEVEL1.0[DEVICE_ALIAS_INDEX].load(Ordering::Relaxed) == 0 {
        LEVEL1.0[DEVICE_ALIAS_INDEX].store(device_alias_block(), Ordering::Relaxed);
    }
    let (_, pa_bits) = ips_field();
    let entries = (1usize << (pa_bits.min(VA_BITS) - u64::from(BLOCK_SHIFT))).min(ENTRIES);
    for index in 0..entries {
        if LEVEL1.0[index].load(Ordering::Relaxed) != 0 {
            continue;
        }
        let start = (index as u64) << BLOCK_SHIFT;
        let end = start + (1 << BLOCK_SHIFT);
        let is_ram = platform
            .ram()
            .iter()
            .any(|r| r.start < end && start < r.end);
        let entry = if is_ram {
            normal_block(index)
        } else {
            device_block(index)
        };
        LEVEL1.0[index].store(entry, Ordering::Relaxed);
    }
    // SAFETY: barriers only order the table stores before later accesses.
    unsafe { asm!("dsb ishst", "isb", options(nostack)) };
}

/// Set/way cache maintenance the way boot firmware does it, around turning
/// the MMU and data cache off and on again: `DC CISW` with the caches on,
/// `SCTLR_EL1` without M and C, `DC CISW` again, `SCTLR_EL1` restored.
/// Under a hypervisor without FEAT_S2FWB each step traps (the set/way
/// operations, and the `SCTLR_EL1` writes once set/way has been used) and the
/// hypervisor flushes guest memory as KVM does; natively, or with FWB, they
/// simply run. Returns `SCTLR_EL1` before and after, which must be equal.
pub fn set_way_round_trip() -> (u64, u64) {
    let (before, after): (u64, u64);
    // SAFETY: code, stack and data are identity mapped, so execution goes on
    // at the same addresses with the MMU off; nothing touches memory between
    // the two SCTLR_EL1 writes, and interrupts are masked across them.
    // Set/way operations by level 1, set 0, way 0 only move one line's data
    // between cache and memory.
    unsafe {
        asm!(
            "mrs {daif}, daif",
            "msr daifset, #0xf",
            "mrs {before}, sctlr_el1",
            "dc cisw, xzr",
            "bic {off}, {before}, #1",
            "bic {off}, {off}, #4",
            "msr sctlr_el1, {off}",
            "isb",
            "dc cisw, xzr",
            "msr sctlr_el1, {before}",
            "isb",
            "mrs {after}, sctlr_el1",
            "msr daif, {daif}",
            daif = out(reg) _,
            before = out(reg) before,
            off = out(reg) _,
            after = out(reg) after,
            options(nostack),
        );
    }
    (before, after)
}

/// What EL0 may do in a block mapped by [`map_el0_block`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum El0Access {
    /// Read and execute (EL1 may only read).
    ReadExecute,
    /// Read, write and execute (EL1 may read and write).
    ReadWriteExecute,
}

/// Makes virtual gigabyte `va_index` map physical gigabyte `pa_index` for EL0
/// code: normal write-back memory that EL1 never executes (PXN). Replaces
/// the entry break-before-make, so it may be called on a live table, but no
/// other vCPU may be using that gigabyte.
pub fn map_el0_block(va_index: usize, pa_index: usize, access: El0Access) {
    let entry = ((pa_index as u64) << BLOCK_SHIFT)
        | DESC_VALID_BLOCK
        | DESC_ATTR_NORMAL
        | DESC_INNER_SHAREABLE
        | DESC_ACCESS_FLAG
        | DESC_AP_EL0
        | DESC_PXN
        | match access {
            El0Access::ReadExecute => DESC_AP_READ_ONLY,
            El0Access::ReadWriteExecute => 0,
        };
    replace_block(va_index, entry);
}

/// Replaces level-1 entry `index` with `entry`, break-before-make: the old
/// entry is cleared and its translations flushed on every vCPU before the
/// new one is stored.
fn replace_block(index: usize, entry: u64) {
    LEVEL1.0[index].store(0, Ordering::Relaxed);
    // SAFETY: barriers and TLB invalidation change no memory; the old entry
    // is gone from the table before its translations are flushed.
    unsafe {
        asm!(
            "dsb ishst",
            "tlbi vmalle1is",
            "dsb ish",
            "isb",
            options(nostack)
        )
    };
    LEVEL1.0[index].store(entry, Ordering::Relaxed);
    // SAFETY: barriers only order the table store before later accesses.
    unsafe { asm!("dsb ishst", "isb", options(nostack)) };
}

/// The gigabyte index of `address` in the level-1 table.
pub const fn block_index(address: u64) -> usize {
    (address >> BLOCK_SHIFT) as usize
}

/// Adds Tagged Normal write-back (`0xf0`) as attribute 3 of this vCPU's
/// `MAIR_EL1` and, with `tbi`, sets `TCR_EL1.TBI0`; then flushes this vCPU's
/// TLB, which may hold both. Only on a CPU with FEAT_MTE2.
pub fn enable_tagged_attribute(tbi: bool) {
    // SAFETY: attribute 3 is used by no mapping before this call (only the
    // tagged alias, mapped by `map_tagged_alias`); TBI0 changes nothing for
    // the guest's pointers, whose top byte is zero; the TLB flush drops
    // translations cached with the old values.
    unsafe {
        asm!(
            "mrs {t}, mair_el1",
            "orr {t}, {t}, {attr}",
            "msr mair_el1, {t}",
            "mrs {t}, tcr_el1",
            "orr {t}, {t}, {tbi}",
            "msr tcr_el1, {t}",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            t = out(reg) _,
            attr = in(reg) MAIR_ATTR3_TAGGED,
            tbi = in(reg) if tbi { TCR_TBI0 } else { 0 },
            options(nostack),
        );
    }
}

/// Maps the gigabyte holding physical address `address` at
/// [`TAGGED_ALIAS_BASE`] as Tagged Normal write-back memory, read-write at
/// EL1, never executable, and returns the alias of `address`. Replaces the
/// entry break-before-make (the alias may have mapped another gigabyte
/// before); every vCPU that uses it calls [`enable_tagged_attribute`].
pub fn map_tagged_alias(address: u64) -> u64 {
    let index = block_index(address);
    let entry = ((index as u64) << BLOCK_SHIFT)
        | DESC_VALID_BLOCK
        | DESC_ATTR_NORMAL_TAGGED
        | DESC_INNER_SHAREABLE
        | DESC_ACCESS_FLAG
        | DESC_PXN
        | DESC_UXN;
    replace_block(TAGGED_ALIAS_INDEX, entry);
    TAGGED_ALIAS_BASE + (address & ((1 << BLOCK_SHIFT) - 1))
}
