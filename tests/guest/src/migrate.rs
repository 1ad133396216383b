//! The `migrate` scenario: a guest that is live-migrated while it writes,
//! and then checks that nothing it wrote was lost.
//!
//! For [`RUN_SECONDS`] (virtual counter) the guest writes pseudo-random
//! pages of [`REGION`]: each write gives the page the next sequence number
//! (word 0) and words derived from the page and the sequence (words 1 to
//! [`WORDS`] - 1), and records the sequence in [`RECORD`] (its own memory,
//! migrated with the rest). It prints a progress line now and then, on
//! whichever VM's console it runs. The virtual counter must never go back
//! (a migration carries the timer state). On a CPU with SVE it first loads
//! every SVE register with a pattern (`vector_regs`) and checks them at the
//! end (a migration carries the vector state). Then it checks every page it
//! wrote against the record and passes; the test migrates it in the middle
//! (`tests/tests/e2e_migrate.rs`), so the check runs on the destination.

use crate::memory_map::PAGE;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::virtual_counter;
use crate::vector_regs;

/// The region written: 64 MiB into the VM's RAM.
const REGION: u64 = 0x4400_0000;
/// Pages of the region (8 MiB).
const PAGES: usize = 2048;
/// Words of each page the guest writes.
const WORDS: u64 = 8;
/// How long the guest writes before it checks.
const RUN_SECONDS: u64 = 8;
/// Writes between two progress lines.
const PROGRESS_EVERY: u64 = 1 << 17;

/// The sequence number each page last got (0: never written).
static mut RECORD: [u64; PAGES] = [0; PAGES];

fn word(page: u64, sequence: u64, index: u64) -> u64 {
    (page << 40 ^ sequence ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// The scenario.
pub fn run() -> Result<(), Failure> {
    let (start, frequency) = virtual_counter();
    let end = start + RUN_SECONDS * frequency;
    println!("migrate: writing {PAGES} pages at {REGION:#x} for {RUN_SECONDS} s");
    let sve_vl = vector_regs::sve_present().then(vector_regs::fill);
    if let Some(vl) = sve_vl {
        println!("migrate: SVE registers hold a pattern ({vl}-byte vectors)");
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sequence = 0u64;
    let mut last = start;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let page = x % PAGES as u64;
        sequence += 1;
        let base = REGION + page * PAGE;
        for index in 0..WORDS {
            let value = if index == 0 {
                sequence
            } else {
                word(page, sequence, index)
            };
            // SAFETY: inside the region, RAM of this VM that nothing else uses.
            unsafe { core::ptr::write_volatile((base + index * 8) as *mut u64, value) };
        }
        // SAFETY: only this vCPU uses the record.
        unsafe {
            (&raw mut RECORD)
                .cast::<u64>()
                .add(page as usize)
                .write(sequence)
        };
        if sequence.is_multiple_of(1024) {
            let (now, _) = virtual_counter();
            if now < last {
                println!("migrate: the virtual counter went back from {last:#x} to {now:#x}");
                return Err(Failure::Migrate {
                    step: "the virtual counter never goes back",
                    page: 0,
                });
            }
            last = now;
            if now >= end {
                break;
            }
        }
        if sequence.is_multiple_of(PROGRESS_EVERY) {
            println!("migrate: {sequence} writes");
        }
    }
    println!("migrate: {sequence} writes done, checking");
    if let Some(vl) = sve_vl {
        if let Err((what, register)) = vector_regs::check(vl) {
            let name = ["z", "p", "ffr", "zcr_el1 "][usize::from(what)];
            println!("migrate: SVE register {name}{register} lost its pattern");
            return Err(Failure::Migrate {
                step: "the SVE registers keep their pattern",
                page: register as u64,
            });
        }
        println!("migrate: the SVE registers kept their pattern");
    }
    let mut written = 0;
    for page in 0..PAGES as u64 {
        // SAFETY: only this vCPU uses the record.
        let expected = unsafe { (&raw const RECORD).cast::<u64>().add(page as usize).read() };
        if expected == 0 {
            continue;
        }
        written += 1;
        let base = REGION + page * PAGE;
        for index in 0..WORDS {
            let want = if index == 0 {
                expected
            } else {
                word(page, expected, index)
            };
            // SAFETY: inside the region.
            let got = unsafe { core::ptr::read_volatile((base + index * 8) as *const u64) };
            if got != want {
                println!(
                    "migrate: page {:#x} word {index}: {got:#x}, expected {want:#x} (sequence {expected})",
                    base
                );
                return Err(Failure::Migrate {
                    step: "every page holds its last write",
                    page: base,
                });
            }
        }
    }
    println!("migrate: all {written} written pages hold their last write");
    Ok(())
}
