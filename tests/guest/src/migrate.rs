//! The `migrate` scenario: a guest that is live-migrated while it writes,
//! and then checks that nothing it wrote was lost.
//!
//! For `migrate-seconds=` (default 8; virtual counter) every vCPU writes pseudo-random
//! pages of its share of [`REGION`] (vCPU `i` of `n` owns the pages whose
//! number is `i` modulo `n`): each write gives the page the next sequence
//! number (word 0) and words derived from the page and the sequence (words
//! 1 to [`WORDS`] - 1), and records the sequence in [`RECORD`] (its own
//! memory, migrated with the rest). The boot vCPU prints a progress line
//! now and then, on whichever VM's console it runs. The virtual counter must
//! never go back (a migration carries the timer state).
//!
//! With a GIC and a timer node, every vCPU also takes its virtual timer's
//! interrupt every [`TICK_MS`] ms (the handler re-arms it): at the end each
//! vCPU's last tick must be less than [`TICK_GAP_SECONDS`] old, so a timer or
//! an interrupt lost in the switch (which happens seconds before the end)
//! fails the run. On a CPU with SVE the boot vCPU first loads every SVE
//! register with a pattern (`vector_regs`) and checks them at the end (a
//! migration carries the vector state); on a CPU with SME, vCPU 1 runs in
//! streaming mode with the ZA array live, both holding a pattern it checks
//! at the end.
//!
//! With `migrate-tags` (a CPU with FEAT_MTE2, an `mte=on` VM) the region is
//! also mapped Tagged (`mmu::map_tagged_alias`), and every write of a page
//! gives its first [`TAGGED_GRANULES`] granules the allocation tag
//! [`page_tag`] of the page and sequence (`STG` through the alias; tag
//! checks stay off, `SCTLR_EL1.TCF` 0, so the untagged pointers of the
//! identity map are never checked); the final check compares those tags
//! (`LDG`) too. Without MTE it fails at the start.
//!
//! Then every vCPU checks every page it wrote against the record; the test
//! migrates the guest in the middle (`tests/tests/e2e_migrate.rs`), so the
//! checks run on the destination.

use core::arch::asm;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::boot::MAX_CPUS;
use crate::bootargs::Scenario;
use crate::exceptions;
use crate::gic;
use crate::memory_map::PAGE;
use crate::mmu;
use crate::mte;
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{self, Barrier, Deadline, virtual_counter};
use crate::timer_regs::TimerPpis;
use crate::vector_regs;

/// The region written: 64 MiB into the VM's RAM.
const REGION: u64 = 0x4400_0000;
/// Pages of the region (8 MiB).
const PAGES: usize = 2048;
/// Words of each page the guest writes.
const WORDS: u64 = 8;
/// Writes between two progress lines (boot vCPU).
const PROGRESS_EVERY: u64 = 1 << 17;
/// The virtual timer's period.
const TICK_MS: u64 = 10;
/// The oldest a vCPU's last timer tick may be at the end.
const TICK_GAP_SECONDS: u64 = 2;

/// Granules at the start of each page that get the page's tag with
/// `migrate-tags`.
const TAGGED_GRANULES: u64 = 4;

/// The tagged alias of [`REGION`] (0: `migrate-tags` is off).
static TAGGED_REGION: AtomicU64 = AtomicU64::new(0);

/// The sequence number each page last got (0: never written).
static mut RECORD: [u64; PAGES] = [0; PAGES];

/// The virtual timer's INTID (0: no timer interrupts in this run).
static VTIMER: AtomicU32 = AtomicU32::new(0);
/// The virtual timer's period in counter ticks.
static TICK: AtomicU64 = AtomicU64::new(0);
/// The virtual counter value at which every vCPU stops writing.
static END: AtomicU64 = AtomicU64::new(0);
/// vCPUs writing.
static VCPUS: AtomicU64 = AtomicU64::new(1);
/// Timer interrupts taken per vCPU, and the counter at the last one.
static TICKS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static LAST_TICK: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Pages each vCPU found holding their last write.
static WRITTEN: AtomicU64 = AtomicU64::new(0);
/// A secondary's failure: the page (or 0) and a step index into [`STEPS`],
/// plus one (0: none).
static FAILED_STEP: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static FAILED_PAGE: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static DONE: Barrier = Barrier::new();

/// What a vCPU checks, for a secondary's report.
const STEPS: [&str; 6] = [
    "the virtual counter never goes back",
    "every page holds its last write",
    "timer interrupts keep coming after the switch",
    "the vCPU sets up its timer interrupt",
    "the streaming registers and ZA keep their pattern",
    "every page holds its last allocation tag",
];
/// The step a tag mismatch reports.
const TAG_STEP: usize = 5;
/// The step a streaming vCPU's pattern check reports.
const STREAMING_STEP: usize = 4;
/// The vCPU that runs in SME streaming mode with ZA live, on a CPU with SME.
const STREAMING_VCPU: usize = 1;
/// Its streaming vector length in bytes, once its pattern held (0: none).
static STREAMING_CHECKED: AtomicU64 = AtomicU64::new(0);

fn word(page: u64, sequence: u64, index: u64) -> u64 {
    (page << 40 ^ sequence ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// The allocation tag a page gets with sequence number `sequence`: never
/// 0, so a lost tag always shows.
fn page_tag(page: u64, sequence: u64) -> u8 {
    1 + ((page ^ sequence) % 15) as u8
}

fn fail(step: usize, page: u64) -> Failure {
    Failure::Migrate {
        step: STEPS[step],
        page,
    }
}

/// Arms the virtual timer `TICK` counter ticks from now.
fn arm_tick() {
    let tick = TICK.load(Ordering::Relaxed);
    // SAFETY: the guest's own virtual timer.
    unsafe {
        asm!("msr cntv_tval_el0, {}", "msr cntv_ctl_el0, {}", "isb",
             in(reg) tick, in(reg) 1u64, options(nostack));
    }
}

/// The IRQ handler while the scenario takes interrupts.
pub fn interrupt(intid: u32) {
    if intid != VTIMER.load(Ordering::Relaxed) {
        return;
    }
    let cpu = smp::current_cpu();
    TICKS[cpu].fetch_add(1, Ordering::Relaxed);
    LAST_TICK[cpu].store(virtual_counter().0, Ordering::Relaxed);
    arm_tick();
}

/// One vCPU's part: set up its timer, write, then check its share.
fn work(cpu: usize) -> Result<(), Failure> {
    let vcpus = VCPUS.load(Ordering::Acquire);
    let vtimer = VTIMER.load(Ordering::Acquire);
    let tagged = TAGGED_REGION.load(Ordering::Acquire);
    if tagged != 0 {
        mmu::enable_tagged_attribute(false);
        mte::enable_tag_access(mte::TagCheck::Off);
    }
    if vtimer != 0 {
        gic::init_cpu(&[vtimer]).map_err(|_| fail(3, 0))?;
        arm_tick();
        gic::irqs(true);
    }
    let end = END.load(Ordering::Acquire);
    let mine = PAGES as u64 / vcpus + u64::from((cpu as u64) < PAGES as u64 % vcpus);
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ ((cpu as u64 + 1) << 40);
    let mut sequence = 0u64;
    let mut last = 0;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let page = (x % mine) * vcpus + cpu as u64;
        sequence += 1;
        let base = REGION + page * PAGE;
        for index in 0..WORDS {
            let value = if index == 0 {
                sequence
            } else {
                word(page, sequence, index)
            };
            // SAFETY: inside this vCPU's share of the region, RAM of this VM
            // that nothing else uses.
            unsafe { core::ptr::write_volatile((base + index * 8) as *mut u64, value) };
        }
        if tagged != 0 {
            let alias = tagged + page * PAGE;
            for granule in 0..TAGGED_GRANULES {
                mte::set_tag(alias + granule * mte::GRANULE, page_tag(page, sequence));
            }
        }
        // SAFETY: each vCPU writes only the record entries of its pages.
        unsafe {
            (&raw mut RECORD)
                .cast::<u64>()
                .add(page as usize)
                .write(sequence)
        };
        if sequence.is_multiple_of(1024) {
            let (now, _) = virtual_counter();
            if now < last {
                println!(
                    "migrate: vcpu{cpu}: the virtual counter went back from {last:#x} to {now:#x}"
                );
                return Err(fail(0, 0));
            }
            last = now;
            if now >= end {
                break;
            }
        }
        if cpu == 0 && sequence.is_multiple_of(PROGRESS_EVERY) {
            println!("migrate: {sequence} writes");
        }
    }
    if vtimer != 0 {
        gic::irqs(false);
        // SAFETY: the guest's own virtual timer, off.
        unsafe { asm!("msr cntv_ctl_el0, xzr", "isb", options(nostack)) };
        let (now, frequency) = virtual_counter();
        let age = now.saturating_sub(LAST_TICK[cpu].load(Ordering::Relaxed));
        if TICKS[cpu].load(Ordering::Relaxed) == 0 || age > TICK_GAP_SECONDS * frequency {
            println!(
                "migrate: vcpu{cpu}: {} timer interrupts, the last {} ms before the end",
                TICKS[cpu].load(Ordering::Relaxed),
                age * 1000 / frequency.max(1)
            );
            return Err(fail(2, 0));
        }
    }
    let mut written = 0;
    for page in (cpu..PAGES).step_by(vcpus as usize) {
        let page = page as u64;
        // SAFETY: each vCPU reads only the record entries of its pages.
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
                    "migrate: page {base:#x} word {index}: {got:#x}, expected {want:#x} (sequence {expected})"
                );
                return Err(fail(1, base));
            }
        }
        if tagged != 0 {
            let want = page_tag(page, expected);
            let alias = tagged + page * PAGE;
            for granule in 0..TAGGED_GRANULES {
                let got = mte::tag(alias + granule * mte::GRANULE);
                if got != want {
                    println!(
                        "migrate: page {base:#x} granule {granule}: tag {got:#x}, expected {want:#x} (sequence {expected})"
                    );
                    return Err(fail(TAG_STEP, base));
                }
            }
        }
    }
    WRITTEN.fetch_add(written, Ordering::AcqRel);
    Ok(())
}

/// A secondary vCPU's part of the scenario.
///
/// On a CPU with SME, vCPU [`STREAMING_VCPU`] does its part in streaming
/// mode with ZA live and a pattern in them, and checks the pattern after
/// (a migration carries that state too); a difference is reported as
/// [`STREAMING_STEP`] with `what << 32 | index` for the page
/// (`vector_regs::check_streaming`).
pub fn secondary(cpu: usize) {
    let streaming =
        (cpu == STREAMING_VCPU && vector_regs::sme_present()).then(vector_regs::fill_streaming);
    let mut result = work(cpu);
    if let Some(svl) = streaming {
        match vector_regs::check_streaming(svl) {
            Ok(()) => STREAMING_CHECKED.store(svl as u64, Ordering::Release),
            Err((what, index)) => {
                result = result.and(Err(fail(
                    STREAMING_STEP,
                    u64::from(what) << 32 | index as u64,
                )))
            }
        }
    }
    if let Err(Failure::Migrate { step, page }) = result {
        let index = STEPS.iter().position(|s| *s == step).unwrap_or(0);
        FAILED_PAGE[cpu].store(page, Ordering::Release);
        FAILED_STEP[cpu].store(index as u64 + 1, Ordering::Release);
    }
    DONE.arrive();
}

/// The scenario, on the boot vCPU: every vCPU writes for `run_seconds`,
/// with allocation tags when `tags` (`migrate-tags`).
pub fn run(platform: &Platform, run_seconds: u64, tags: bool) -> Result<(), Failure> {
    if tags {
        mte::require()?;
        TAGGED_REGION.store(mmu::map_tagged_alias(REGION), Ordering::Release);
    }
    let vcpus = platform.cpus().len();
    VCPUS.store(vcpus as u64, Ordering::Release);
    let (start, frequency) = virtual_counter();
    END.store(start + run_seconds * frequency, Ordering::Release);
    TICK.store(frequency * TICK_MS / 1000, Ordering::Release);
    let ppis = platform
        .timer_cells()
        .and_then(|cells| TimerPpis::from_cells(cells).ok());
    if let (Some(frames), Some(ppis)) = (platform.gic, ppis) {
        gic::init_distributor(frames).map_err(|error| Failure::Gic { cpu: 0, error })?;
        VTIMER.store(ppis.virtual_, Ordering::Release);
        exceptions::take_irqs_for(Scenario::Migrate);
    }
    println!(
        "migrate: {vcpus} vCPUs writing {PAGES} pages at {REGION:#x} for {run_seconds} s{}{}",
        if VTIMER.load(Ordering::Relaxed) != 0 {
            ", virtual timer every 10 ms"
        } else {
            ""
        },
        if tags {
            ", each write with an allocation tag"
        } else {
            ""
        }
    );
    let sve_vl = vector_regs::sve_present().then(vector_regs::fill);
    if let Some(vl) = sve_vl {
        println!("migrate: SVE registers hold a pattern ({vl}-byte vectors)");
    }
    smp::start_secondaries(platform)?;
    let mine = work(0);
    let arrived = DONE.wait(vcpus - 1, Some(Deadline::after_seconds(60)));
    mine?;
    if arrived < vcpus - 1 {
        return Err(Failure::CpuTimedOut {
            arrived: arrived + 1,
            expected: vcpus,
        });
    }
    for cpu in 1..vcpus {
        let step = FAILED_STEP[cpu].load(Ordering::Acquire);
        if step as usize == STREAMING_STEP + 1 {
            let at = FAILED_PAGE[cpu].load(Ordering::Acquire);
            let name = ["z", "p", "ZA row ", "SVCR "][(at >> 32) as usize & 3];
            println!(
                "migrate: vcpu{cpu}: streaming register {name}{} lost its pattern",
                at & 0xffff_ffff
            );
        }
        if step != 0 {
            println!("migrate: vcpu{cpu} failed");
            return Err(fail(
                step as usize - 1,
                FAILED_PAGE[cpu].load(Ordering::Acquire),
            ));
        }
    }
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
    let svl = STREAMING_CHECKED.load(Ordering::Acquire);
    if svl != 0 {
        println!(
            "migrate: vcpu{STREAMING_VCPU}'s streaming registers and ZA kept their pattern ({svl}-byte vectors)"
        );
    }
    if VTIMER.load(Ordering::Relaxed) != 0 {
        for (cpu, ticks) in TICKS.iter().enumerate().take(vcpus) {
            println!(
                "migrate: vcpu{cpu}: {} timer interrupts, the last one recent",
                ticks.load(Ordering::Relaxed)
            );
        }
    }
    println!(
        "migrate: all {} written pages hold their last write",
        WRITTEN.load(Ordering::Acquire)
    );
    if tags {
        println!(
            "migrate: all {} written pages hold their last allocation tag",
            WRITTEN.load(Ordering::Acquire)
        );
    }
    smp::wait_secondaries_off(platform)?;
    Ok(())
}
