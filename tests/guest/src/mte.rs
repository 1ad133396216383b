//! Memory tagging (FEAT_MTE2) as a guest sees it: the helpers the `mte`
//! and `migrate` (`migrate-tags`) scenarios share, and the `mte` scenario.
//!
//! An allocation tag is 4 bits per 16-byte granule of Tagged memory; `STG`
//! writes one, `LDG` reads one, and with tag checks on
//! (`SCTLR_EL1.TCF` = synchronous) a load or store through Tagged memory
//! whose pointer carries another logical tag (bits 59:56, ignored for
//! translation with `TCR_EL1.TBI0`) takes a synchronous Tag Check Fault. The
//! guest's identity map stays untagged; tagged accesses go through the
//! tagged alias of `mmu` ([`mmu::map_tagged_alias`]), and EL1 may access
//! tags once `SCTLR_EL1.ATA` is set ([`enable_tag_access`]).
//!
//! The `mte` scenario ([`run`], boot vCPU only; the secondaries stay off)
//! picks [`REGION_SIZE`] at the top of the largest free RAM range (the same
//! place in every boot of the same VM) and checks, printing one
//! `test-guest: mte: ...` line each:
//!
//! 1. `ID_AA64PFR1_EL1.MTE` is 2 or more (the hypervisor shows FEAT_MTE2 to
//!    an `mte=on` VM); without it the scenario fails at once.
//! 2. The first granule of every page of the region reads tag 0: memory the
//!    VM touches for the first time carries no earlier owner's tags. Only one
//!    granule per page is read, as QEMU 7.2 keeps some neighbouring granules'
//!    tags in one place (QEMU issue 1416).
//! 3. Tag checks work: after `STG` of tag 3 on a granule (read back with
//!    `LDG`), a load and a store through a pointer with logical tag 3
//!    succeed, while a load and a store with logical tag 5 take a data abort
//!    at EL1 (EC 0x25) with DFSC 0x11 (synchronous Tag Check Fault) and the
//!    address in `FAR_EL1`, entering the handler with `PSTATE.TCO` set; the
//!    faulting store changes nothing.
//!
//!    With asynchronous checks (`TCF` 0b10) a store with logical tag 5
//!    completes without an exception, `TFSR_EL1.TF0` records the fault, and
//!    the record stays through [`ASYNC_EXITS`] hypercalls.
//! 4. `GCR_EL1`, `RGSR_EL1`, `TFSR_EL1` and `TFSRE0_EL1` keep distinctive
//!    values across [`EXITS`] hypercalls (each an exit to the hypervisor).
//! 5. A load from an IPA outside RAM, where the hypervisor injects a
//!    synchronous external abort, enters the handler with `PSTATE.TCO` set
//!    (every exception entry sets it when MTE is implemented, so an
//!    injected one must too), and `ERET` gives back the `TCO` of before.
//! 6. Every granule of the region is left with a non-zero tag (page `p`
//!    gets `1 + p % 15`), read back on each page: when the VM is restarted
//!    and runs the scenario again, check 2 shows that the hypervisor
//!    cleared them.

use core::arch::asm;

use crate::exceptions::{self, EC_DATA_ABORT_SAME_EL};
use crate::memory_map::{MemRange, PAGE};
use crate::mmu;
use crate::platform::Platform;
use crate::println;
use crate::psci::{self, function};
use crate::scenarios::{self, Failure};

/// Bytes one allocation tag covers.
pub const GRANULE: u64 = 16;
/// The region the scenario tests.
pub const REGION_SIZE: u64 = 2 << 20;
/// Hypercalls made between writing and reading back the tag registers.
const EXITS: u32 = 20_000;
/// Hypercalls made while `TFSR_EL1` holds an asynchronous fault.
const ASYNC_EXITS: u32 = 1_000;
/// Data fault status code of a synchronous Tag Check Fault.
const DFSC_TAG_CHECK: u64 = 0x11;
/// `PSTATE.TCO` in the `TCO` register (`S3_3_C4_C2_7`) and in `SPSR_EL1`.
const TCO_BIT: u64 = 1 << 25;
/// `SCTLR_EL1.ATA`: EL1 may access allocation tags.
const SCTLR_ATA: u64 = 1 << 43;
/// `SCTLR_EL1.TCF` (bits 41:40): tag check faults at EL1.
const SCTLR_TCF_MASK: u64 = 0b11 << 40;
/// What a tag check that fails does at EL1 (`SCTLR_EL1.TCF`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TagCheck {
    /// Nothing: tags are not checked (`TCF` 0b00).
    Off,
    /// A synchronous Tag Check Fault (`TCF` 0b01).
    Synchronous,
    /// The access completes and `TFSR_EL1` records the fault (`TCF` 0b10).
    Asynchronous,
}

impl TagCheck {
    /// The `SCTLR_EL1.TCF` bits.
    fn sctlr_bits(self) -> u64 {
        let tcf: u64 = match self {
            TagCheck::Off => 0b00,
            TagCheck::Synchronous => 0b01,
            TagCheck::Asynchronous => 0b10,
        };
        tcf << 40
    }
}

/// `TFSR_EL1.TF0`: an asynchronous tag check fault on a `TTBR0_EL1`
/// address was recorded.
const TFSR_TF0: u64 = 1 << 0;
/// Mask of the address bits below the top byte.
const ADDRESS_BITS: u64 = (1 << 56) - 1;

/// `ID_AA64PFR1_EL1`.
fn pfr1() -> u64 {
    let pfr1: u64;
    // SAFETY: reading an ID register has no side effects.
    unsafe { asm!("mrs {}, id_aa64pfr1_el1", out(reg) pfr1, options(nomem, nostack)) };
    pfr1
}

/// `ID_AA64PFR1_EL1.MTE` (bits 11:8) when it is 2 or more (FEAT_MTE2,
/// allocation tags in memory), else [`Failure::NoMte`].
pub fn require() -> Result<u64, Failure> {
    let pfr1 = pfr1();
    let field = (pfr1 >> 8) & 0xf;
    if field >= 2 {
        Ok(field)
    } else {
        Err(Failure::NoMte { pfr1 })
    }
}

/// Lets EL1 access allocation tags (`SCTLR_EL1.ATA`) on this vCPU, with
/// tag checks at EL1 as `check` says. Only on a CPU with FEAT_MTE2.
pub fn enable_tag_access(check: TagCheck) {
    let tcf = check.sctlr_bits();
    // SAFETY: only the guest's untagged identity map and the tagged alias
    // are in use; with TCF 0 nothing is checked, otherwise only accesses
    // through the alias are (the caller's pointers carry their tags).
    unsafe {
        asm!(
            "mrs {t}, sctlr_el1",
            "bic {t}, {t}, {mask}",
            "orr {t}, {t}, {set}",
            "msr sctlr_el1, {t}",
            "isb",
            t = out(reg) _,
            mask = in(reg) SCTLR_TCF_MASK,
            set = in(reg) SCTLR_ATA | tcf,
            options(nostack),
        );
    }
}

/// Sets `PSTATE.TCO` (`true`: tag checks off) on this vCPU.
fn set_tco(on: bool) {
    // SAFETY: writes PSTATE.TCO (FEAT_MTE): it only turns tag checking of
    // this vCPU's own accesses off or on.
    unsafe {
        asm!("msr s3_3_c4_c2_7, {}", "isb", in(reg) if on { TCO_BIT } else { 0 },
             options(nostack))
    };
}

/// `PSTATE.TCO` of this vCPU.
fn tco() -> bool {
    let tco: u64;
    // SAFETY: reads PSTATE.TCO (FEAT_MTE).
    unsafe { asm!("mrs {}, s3_3_c4_c2_7", out(reg) tco, options(nomem, nostack)) };
    tco & TCO_BIT != 0
}

/// `pointer` with logical tag `tag` in bits 59:56.
pub fn with_tag(pointer: u64, tag: u8) -> u64 {
    (pointer & !(0xf << 56)) | (u64::from(tag & 0xf) << 56)
}

/// Gives the granule at `address` (granule aligned, in Tagged memory: the
/// tagged alias) allocation tag `tag`.
pub fn set_tag(address: u64, tag: u8) {
    // SAFETY: STG writes one granule's tag, not its data; the caller names
    // a granule of memory its scenario owns, mapped through the alias.
    unsafe {
        asm!(".arch_extension memtag", "stg {t}, [{a}]",
             t = in(reg) with_tag(0, tag), a = in(reg) address, options(nostack));
    }
}

/// The allocation tag of the granule at `address` (in the tagged alias).
pub fn tag(address: u64) -> u8 {
    let mut tagged = 0u64;
    // SAFETY: LDG reads one granule's tag into bits 59:56 of the register;
    // the caller names memory of the guest mapped through the alias.
    unsafe {
        asm!(".arch_extension memtag", "ldg {t}, [{a}]",
             t = inout(reg) tagged, a = in(reg) address, options(nostack, readonly));
    }
    ((tagged >> 56) & 0xf) as u8
}

fn fail(check: &'static str, address: u64, value: u64) -> Failure {
    Failure::Mte {
        check,
        address,
        value,
    }
}

/// The tag registers check 4 writes, with the values it leaves.
const TAG_REGISTERS: [(&str, u64); 4] = [
    // Exclude tags 0, 1, 6, 7, 8, 10, 13 and 15 from random tags.
    ("GCR_EL1", 0xa5c3),
    // SEED 0xbeef, TAG 7.
    ("RGSR_EL1", 0x00be_ef07),
    // TF0 and TF1.
    ("TFSR_EL1", 0x3),
    // TF0.
    ("TFSRE0_EL1", 0x1),
];

/// Reads (`value` `None`) or writes tag register `index` of
/// [`TAG_REGISTERS`]; returns what it holds after.
fn tag_register(index: usize, value: Option<u64>) -> u64 {
    macro_rules! access {
        ($register:literal) => {{
            if let Some(value) = value {
                // SAFETY: the guest's own tag control and status registers
                // (FEAT_MTE2); nothing of the guest depends on them (no IRG;
                // the asynchronous check reads TFSR_EL1 itself).
                unsafe {
                    asm!(concat!("msr ", $register, ", {}"), "isb", in(reg) value,
                         options(nostack))
                };
            }
            let read: u64;
            // SAFETY: as above; a read has no side effects.
            unsafe {
                asm!(concat!("mrs {}, ", $register), out(reg) read, options(nomem, nostack))
            };
            read
        }};
    }
    match index {
        0 => access!("s3_0_c1_c0_6"),
        1 => access!("s3_0_c1_c0_5"),
        2 => access!("s3_0_c5_c6_0"),
        _ => access!("s3_0_c5_c6_1"),
    }
}

/// The region: [`REGION_SIZE`] at the top of the largest free RAM range,
/// aligned to its size.
fn region(platform: &Platform) -> Result<MemRange, Failure> {
    let free = platform.largest_free_range().ok_or(Failure::NoFreeRam)?;
    let start = free.end.saturating_sub(REGION_SIZE) & !(REGION_SIZE - 1);
    if start < free.start {
        return Err(Failure::NoFreeRam);
    }
    Ok(MemRange {
        start,
        end: start + REGION_SIZE,
    })
}

/// A tag check fault must have been caught: data abort at EL1, DFSC 0x11,
/// `FAR_EL1` the address (bits 55:0), the handler entered with TCO set.
fn check_tag_fault(
    what: &'static str,
    pointer: u64,
    abort: Option<exceptions::Abort>,
    write: bool,
) -> Result<exceptions::Abort, Failure> {
    let abort = abort.ok_or(fail(what, pointer, 0))?;
    let ok = abort.class() == EC_DATA_ABORT_SAME_EL
        && abort.status() == DFSC_TAG_CHECK
        && abort.far & ADDRESS_BITS == pointer & ADDRESS_BITS
        && abort.is_write() == write;
    if !ok {
        println!(
            "test-guest: mte: {what}: ESR {:#x} FAR {:#x}, expected EC 0x25 DFSC 0x11 at {pointer:#x}",
            abort.esr, abort.far
        );
        return Err(fail(what, pointer, abort.esr));
    }
    if abort.tco != Some(true) {
        return Err(fail(
            "the tag check fault's handler runs with PSTATE.TCO set",
            pointer,
            0,
        ));
    }
    Ok(abort)
}

/// Check 3 on the granule at `granule` (in the alias).
fn tag_checks(granule: u64) -> Result<(), Failure> {
    const TAG: u8 = 3;
    const WRONG: u8 = 5;
    set_tag(granule, TAG);
    let read = tag(granule);
    if read != TAG {
        return Err(fail(
            "STG of tag 3 reads back with LDG",
            granule,
            read.into(),
        ));
    }
    let (good, bad) = (with_tag(granule, TAG), with_tag(granule, WRONG));
    tag_register(2, Some(0));
    set_tco(false);
    enable_tag_access(TagCheck::Synchronous);
    let outcome = (|| {
        const VALUE: u64 = 0x7a66_ed00_c0ff_ee03;
        if let Some(abort) = exceptions::store_sized(good, 3, VALUE) {
            return Err(fail("store with the matching tag", good, abort.esr));
        }
        match exceptions::load_sized(good, 3) {
            Ok(VALUE) => {}
            Ok(value) => return Err(fail("load with the matching tag reads", good, value)),
            Err(abort) => return Err(fail("load with the matching tag", good, abort.esr)),
        }
        let load = exceptions::load_sized(bad, 3).err();
        let load = check_tag_fault("load with tag 5 from a tag-3 granule", bad, load, false)?;
        let store = exceptions::store_sized(bad, 3, !VALUE);
        let store = check_tag_fault("store with tag 5 to a tag-3 granule", bad, store, true)?;
        match exceptions::load_sized(good, 3) {
            Ok(VALUE) => {}
            Ok(value) => return Err(fail("the faulting store changed memory", good, value)),
            Err(abort) => return Err(fail("load with the matching tag", good, abort.esr)),
        }
        Ok((load, store))
    })();
    enable_tag_access(TagCheck::Off);
    let (load, store) = outcome?;
    println!(
        "test-guest: mte: tag check: tag 3 accesses pass, tag 5 load and store fault \
         (ESR {:#x} FAR {:#x}, ESR {:#x} FAR {:#x}) with PSTATE.TCO set in the handler",
        load.esr, load.far, store.esr, store.far
    );
    Ok(())
}

/// Check 3 with asynchronous tag checks, on the granule at `granule` (in
/// the alias), tagged 3 by [`tag_checks`]: a store with tag 5 completes
/// without an exception and `TFSR_EL1.TF0` records the fault; the record
/// stays through [`ASYNC_EXITS`] exits to the hypervisor.
fn asynchronous_tag_check(granule: u64) -> Result<(), Failure> {
    const VALUE: u64 = 0x0a5f_c0de_0000_0005;
    let bad = with_tag(granule, 5);
    tag_register(2, Some(0));
    set_tco(false);
    enable_tag_access(TagCheck::Asynchronous);
    let store = exceptions::store_sized(bad, 3, VALUE);
    // SAFETY: barriers only: a pending asynchronous fault is recorded in
    // TFSR_EL1 once the store completes.
    unsafe { asm!("dsb nsh", "isb", options(nostack)) };
    enable_tag_access(TagCheck::Off);
    if let Some(abort) = store {
        return Err(fail(
            "an asynchronous tag check takes no exception",
            bad,
            abort.esr,
        ));
    }
    let recorded = tag_register(2, None);
    if recorded & TFSR_TF0 == 0 {
        return Err(fail(
            "TFSR_EL1.TF0 records the asynchronous tag check fault",
            bad,
            recorded,
        ));
    }
    exits(ASYNC_EXITS)?;
    let kept = tag_register(2, None);
    if kept != recorded {
        return Err(fail(
            "TFSR_EL1 keeps the asynchronous fault across exits",
            bad,
            kept,
        ));
    }
    match exceptions::load_sized(granule, 3) {
        Ok(VALUE) => {}
        Ok(value) => return Err(fail("the unchecked store reached memory", granule, value)),
        Err(abort) => return Err(fail("load of the stored value", granule, abort.esr)),
    }
    tag_register(2, Some(0));
    println!(
        "test-guest: mte: asynchronous tag check: a tag 5 store completed and TFSR_EL1 \
         recorded it ({recorded:#x}), kept across {ASYNC_EXITS} exits"
    );
    Ok(())
}

/// `count` hypercalls, each an exit to the hypervisor.
fn exits(count: u32) -> Result<(), Failure> {
    for _ in 0..count {
        let version = psci::call(function::PSCI_VERSION, 0, 0, 0);
        if version < 0x1_0000 {
            return Err(Failure::Hypercall {
                function: function::PSCI_VERSION,
                returned: version,
            });
        }
    }
    Ok(())
}

/// Check 4.
fn tag_registers() -> Result<(), Failure> {
    let mut written = [0u64; TAG_REGISTERS.len()];
    for (index, (name, value)) in TAG_REGISTERS.iter().enumerate() {
        written[index] = tag_register(index, Some(*value));
        if written[index] != *value {
            println!(
                "test-guest: mte: {name} reads {:#x} after writing {value:#x}",
                written[index]
            );
            return Err(fail(
                "a tag register reads back what was written",
                0,
                *value,
            ));
        }
    }
    exits(EXITS)?;
    for (index, (name, value)) in TAG_REGISTERS.iter().enumerate() {
        let read = tag_register(index, None);
        if read != *value {
            println!("test-guest: mte: {name} reads {read:#x} after {EXITS} exits, was {value:#x}");
            return Err(fail("a tag register keeps its value across exits", 0, read));
        }
    }
    println!(
        "test-guest: mte: GCR_EL1 {:#x}, RGSR_EL1 {:#x}, TFSR_EL1 {:#x}, TFSRE0_EL1 {:#x} kept \
         across {EXITS} exits",
        written[0], written[1], written[2], written[3]
    );
    tag_register(2, Some(0));
    tag_register(3, Some(0));
    Ok(())
}

/// Check 5.
fn injected_abort(platform: &Platform) -> Result<(), Failure> {
    let address = scenarios::outside_ram(platform);
    set_tco(false);
    let abort =
        exceptions::probe(address, exceptions::Access::Read).ok_or(Failure::NoAbort { address })?;
    let after = tco();
    if abort.class() != EC_DATA_ABORT_SAME_EL
        || abort.status() != exceptions::DFSC_EXTERNAL_ABORT
        || abort.far != address
    {
        return Err(Failure::WrongAbort {
            address,
            esr: abort.esr,
            far: abort.far,
        });
    }
    if abort.tco != Some(true) {
        return Err(fail(
            "the injected abort's handler runs with PSTATE.TCO set",
            address,
            0,
        ));
    }
    if after {
        return Err(fail(
            "ERET from the injected abort gives back PSTATE.TCO 0",
            address,
            1,
        ));
    }
    println!(
        "test-guest: mte: injected abort at {address:#x} (ESR {:#x}) entered with PSTATE.TCO set",
        abort.esr
    );
    Ok(())
}

/// The tag check 6 gives every granule of page `page` of the region.
fn left_tag(page: u64) -> u8 {
    1 + (page % 15) as u8
}

/// The `mte` scenario (see the module doc).
pub fn run(platform: &Platform) -> Result<(), Failure> {
    let field = require()?;
    println!("test-guest: mte: ID_AA64PFR1_EL1.MTE is {field}: FEAT_MTE2 present");
    exceptions::record_tco();
    mmu::enable_tagged_attribute(true);
    enable_tag_access(TagCheck::Off);
    let region = region(platform)?;
    let alias = mmu::map_tagged_alias(region.start);
    let pages = REGION_SIZE / PAGE;

    for page in 0..pages {
        let read = tag(alias + page * PAGE);
        if read != 0 {
            return Err(fail(
                "tag 0 on first touch",
                region.start + page * PAGE,
                read.into(),
            ));
        }
    }
    println!("test-guest: mte: tags start at zero on all {pages} pages of {region}");

    tag_checks(alias)?;
    asynchronous_tag_check(alias)?;
    tag_registers()?;
    injected_abort(platform)?;

    for page in 0..pages {
        let base = alias + page * PAGE;
        for granule in (base..base + PAGE).step_by(GRANULE as usize) {
            set_tag(granule, left_tag(page));
        }
    }
    for page in 0..pages {
        let read = tag(alias + page * PAGE);
        if read != left_tag(page) {
            return Err(fail(
                "STG of the tags left behind reads back",
                region.start + page * PAGE,
                read.into(),
            ));
        }
    }
    println!(
        "test-guest: mte: left non-zero tags on all {pages} pages of {region} (a restart must \
         clear them)"
    );
    Ok(())
}
