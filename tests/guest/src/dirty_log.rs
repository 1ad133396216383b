//! The `dirty-log` and `dirty-writer` scenarios: a control VM checks the
//! hypervisor's dirty log of a peer against the peer's memory, round after
//! round, as KVM's `dirty_log_test` does.
//!
//! # `dirty-writer` (every vCPU of its VM)
//!
//! The region is shared out: vCPU `i` of `n` owns pages
//! `[i * REGION_PAGES / n, (i + 1) * REGION_PAGES / n)`. Each vCPU writes
//! every page of its share once (so that the RAM is mapped with blocks
//! before logging starts; the boot vCPU times this populate phase from the
//! start of the secondaries until all are done), then, once all have, vCPU 0
//! sets the ready magic in [`MAILBOX`], and each loops forever: a
//! pseudo-random page of its share is written (a word of it gets the vCPU's
//! next sequence number, so its content always changes) or read; every
//! [`PROGRESS_EVERY`] writes a vCPU adds them to the mailbox's write count.
//!
//! With `dirty-pattern=passes` on the control VM, the writer instead works
//! in iterations as KVM's `dirty_log_perf_test` does: when the control VM
//! raises the iteration number in the mailbox, each vCPU writes every page of
//! its share once and records how long its pass took; between iterations the
//! writer stands still.
//!
//! # `dirty-log` (one vCPU, `control=1`)
//!
//! 1. Finds the peer, waits for its ready magic, sets its dirty-log mode and
//!    eager split chunk (`DIRTY_LOG_CONFIG`, from `dirty-mode=` and
//!    `eager-split=`) and turns logging on for its RAM slot (slot 0,
//!    `SLOT_SET_FLAGS`), then reads the region.
//! 2. [`ROUNDS`] rounds while the peer writes (with `dirty-pattern=passes`:
//!    each round is one iteration of the writer, timed by its slowest vCPU): `DIRTY_LOG_GET` (with manual
//!    protection also `DIRTY_LOG_CLEAR` of what it reported), then reads the
//!    region again. A page that changed since the last read must be
//!    reported in this round, or, if it changed after the harvest (the read
//!    follows it), in the next one: a page changed and reported in neither
//!    is a lost write, and fails the scenario with its address.
//! 3. A last round with the peer paused (`VM_PAUSE`): no write can follow
//!    the harvest, so every page that changed must be reported now.
//! 4. With `all-set`, the first harvest must report every page of the slot.
//! 5. Turns logging off, lets the peer write on (its write faults now map
//!    blocks again: the hypervisor's `stage2_collapses` counter shows it),
//!    stops the peer and passes.

use core::sync::atomic::{AtomicU64, Ordering};

use control_abi::{
    Client, DirtyLogClear, DirtyLogGet, Hvc, MAX_TRANSFER, MemoryTransfer, SlotFlags,
};

use crate::bootargs::DirtyOptions;
use crate::control::{code, find_peer, ok};
use crate::memory_map::PAGE;
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{Deadline, micros};

/// The peer's RAM starts here (its slot 0).
const RAM_BASE: u64 = 0x4000_0000;
/// The region the writer changes: 64 MiB into its RAM (two 2 MiB blocks).
pub const REGION: u64 = 0x4400_0000;
/// Pages of the region.
pub const REGION_PAGES: usize = 1024;
const REGION_BYTES: usize = REGION_PAGES * PAGE as usize;
/// The region's first page as a page of slot 0.
const REGION_FIRST: u64 = (REGION - RAM_BASE) / PAGE;
/// Checked rounds while the peer runs.
const ROUNDS: u32 = 6;
/// The writer publishes its sequence number this often.
const PROGRESS_EVERY: u64 = 64;
/// Writes the peer makes between two harvests, at least.
const WRITES_PER_ROUND: u64 = 2048;
/// The writer's ready magic.
const READY: u64 = 0x4449_5254_5952_4459;
/// Words of the largest slot-0 bitmap this scenario handles (512 MiB).
const BITMAP_WORDS: usize = 2048;

/// `[0]` ready magic, `[1]` writes made by all of the writer's vCPUs,
/// `[2]` populate time in microseconds, `[3]` the writer's vCPU count, `[4]`
/// the writer's clock (microseconds) at its latest progress report, so that
/// write rates come from the writer's own clock, whatever delays the
/// control VM.
#[repr(C, align(4096))]
struct Mailbox([AtomicU64; 512]);

static MAILBOX: Mailbox = Mailbox([const { AtomicU64::new(0) }; 512]);

/// A copy of the region, page-aligned.
#[repr(C, align(4096))]
struct RegionCopy([u8; REGION_BYTES]);

static mut COPIES: [RegionCopy; 2] = [RegionCopy([0; REGION_BYTES]), RegionCopy([0; REGION_BYTES])];

#[repr(C, align(4096))]
struct Bitmap([u64; BITMAP_WORDS]);

static mut BITMAP: Bitmap = Bitmap([0; BITMAP_WORDS]);
static mut MASK: Bitmap = Bitmap([0; BITMAP_WORDS]);

fn mailbox_ipa(word: usize) -> u64 {
    MAILBOX.0.as_ptr() as u64 + word as u64 * 8
}

/// Mailbox words beyond the first five.
mod word {
    /// How the writer writes, set by the control VM after the ready magic:
    /// [`super::MODE_RANDOM`] or [`super::MODE_PASSES`].
    pub const MODE: usize = 5;
    /// Passes mode: the iteration the control VM asks for.
    pub const GO: usize = 6;
    /// Passes mode: passes the writer's vCPUs finished, all together.
    pub const DONE: usize = 7;
    /// Passes mode: from here, each vCPU's last pass time in microseconds.
    pub const PASS_US: usize = 8;
}

/// Random writes and reads until stopped.
const MODE_RANDOM: u64 = 1;
/// One pass over each vCPU's share per iteration the control VM starts.
const MODE_PASSES: u64 = 2;

/// The writer's vCPU count (set by the boot vCPU before it starts the others).
static WRITERS: AtomicU64 = AtomicU64::new(1);
/// vCPUs that populated their share.
static POPULATED: AtomicU64 = AtomicU64::new(0);

/// The `dirty-writer` scenario on the boot vCPU; never returns (the control
/// VM stops it).
pub fn writer(platform: &Platform) -> Result<(), Failure> {
    let vcpus = platform.cpus().len();
    WRITERS.store(vcpus as u64, Ordering::Release);
    MAILBOX.0[3].store(vcpus as u64, Ordering::Release);
    let started = micros();
    crate::smp::start_secondaries(platform)?;
    println!("dirty-writer: {vcpus} vCPUs writing {REGION_PAGES} pages at {REGION:#x}");
    write_share(0, Some(started))
}

/// A secondary vCPU's part of `dirty-writer`.
pub fn writer_secondary(cpu: usize) {
    match write_share(cpu, None) {
        Ok(()) => {}
        Err(failure) => println!("dirty-writer: vCPU {cpu}: {failure}"),
    }
}

/// Populates vCPU `cpu`'s share of the region, then writes and reads it
/// forever. The boot vCPU (`started`: when it began) waits for every share
/// and publishes the populate time and the ready magic.
fn write_share(cpu: usize, started: Option<u64>) -> Result<(), Failure> {
    let vcpus = WRITERS.load(Ordering::Acquire);
    let first = cpu as u64 * REGION_PAGES as u64 / vcpus;
    let pages = (cpu as u64 + 1) * REGION_PAGES as u64 / vcpus - first;
    for page in first..first + pages {
        // SAFETY: the region is RAM of this VM that only this vCPU touches
        // in its share.
        unsafe { core::ptr::write_volatile((REGION + page * PAGE) as *mut u64, 1) };
    }
    POPULATED.fetch_add(1, Ordering::AcqRel);
    if let Some(started) = started {
        while POPULATED.load(Ordering::Acquire) < vcpus {
            core::hint::spin_loop();
        }
        MAILBOX.0[2].store(micros() - started, Ordering::Release);
        MAILBOX.0[0].store(READY, Ordering::Release);
    }
    let mode = loop {
        match MAILBOX.0[word::MODE].load(Ordering::Acquire) {
            0 => core::hint::spin_loop(),
            mode => break mode,
        }
    };
    if mode == MODE_PASSES {
        write_passes(cpu, first, pages);
    }
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ ((cpu as u64 + 1) << 32);
    // Each vCPU's numbers differ from every other's, so every write changes
    // its page.
    let mut sequence = ((cpu as u64) << 48) | 2;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let page = first + x % pages;
        let word = (x >> 20) % (PAGE / 8);
        let address = REGION + page * PAGE + word * 8;
        if x & (1 << 40) != 0 {
            // SAFETY: inside this vCPU's share of the region.
            unsafe { core::ptr::write_volatile(address as *mut u64, sequence) };
            sequence += 1;
            if sequence.is_multiple_of(PROGRESS_EVERY) {
                MAILBOX.0[1].fetch_add(PROGRESS_EVERY, Ordering::AcqRel);
                MAILBOX.0[4].fetch_max(micros(), Ordering::AcqRel);
            }
        } else {
            // SAFETY: inside this vCPU's share of the region.
            let _ = unsafe { core::ptr::read_volatile(address as *const u64) };
        }
    }
}

/// Passes mode: on each new iteration number, vCPU `cpu` writes every page
/// of its share once (a new sequence number into a word that moves from
/// pass to pass), then records how long that took and counts itself done.
fn write_passes(cpu: usize, first: u64, pages: u64) -> ! {
    let mut iteration = 0;
    let mut sequence = ((cpu as u64) << 48) | 2;
    loop {
        let go = MAILBOX.0[word::GO].load(Ordering::Acquire);
        if go == iteration {
            core::hint::spin_loop();
            continue;
        }
        iteration = go;
        let started = micros();
        for page in first..first + pages {
            let word = (sequence ^ page).wrapping_mul(0x9e37_79b9) % (PAGE / 8);
            // SAFETY: inside this vCPU's share of the region.
            unsafe {
                core::ptr::write_volatile((REGION + page * PAGE + word * 8) as *mut u64, sequence)
            };
            sequence += 1;
        }
        if let Some(slot) = MAILBOX.0.get(word::PASS_US + cpu) {
            slot.store(micros() - started, Ordering::Release);
        }
        MAILBOX.0[1].fetch_add(pages, Ordering::AcqRel);
        MAILBOX.0[word::DONE].fetch_add(1, Ordering::AcqRel);
    }
}

fn copy_ipa(which: usize) -> u64 {
    // SAFETY: only the address is taken.
    unsafe { (&raw const COPIES[which]) as u64 }
}

fn copy_page(which: usize, page: usize) -> &'static [u8] {
    let start = copy_ipa(which) + page as u64 * PAGE;
    // SAFETY: the page lies inside copy `which`, which the hypervisor wrote
    // in calls that returned before; only this vCPU uses it and nothing
    // writes it while the slice lives (the next read goes to the other copy).
    unsafe { core::slice::from_raw_parts(start as *const u8, PAGE as usize) }
}

fn bitmap_ipa() -> u64 {
    (&raw const BITMAP) as u64
}

fn mask_ipa() -> u64 {
    (&raw const MASK) as u64
}

fn bit(bitmap: *const Bitmap, page: u64) -> bool {
    // SAFETY: `page / 64` is inside the bitmap (checked against the slot's
    // size by the caller); the hypervisor wrote it in a call that returned.
    let word = unsafe { core::ptr::read_volatile(&raw const (*bitmap).0[(page / 64) as usize]) };
    word & (1 << (page % 64)) != 0
}

/// Reads the peer's region into copy `which`.
fn read_region(client: &Client<Hvc>, vm: u32, which: usize) -> Result<(), Failure> {
    let mut done = 0;
    while done < REGION_BYTES as u64 {
        let len = MAX_TRANSFER.min(REGION_BYTES as u64 - done);
        ok(
            "MEMORY_READ of the peer's region",
            client.read_memory(MemoryTransfer {
                vm,
                ipa: REGION + done,
                buffer: copy_ipa(which) + done,
                len,
            }),
        )?;
        done += len;
    }
    Ok(())
}

fn peer_word(client: &Client<Hvc>, vm: u32, word: usize) -> Result<u64, Failure> {
    // The first word of the mask buffer is scratch here.
    ok(
        "MEMORY_READ of the peer's mailbox",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(word),
            buffer: mask_ipa(),
            len: 8,
        }),
    )?;
    // SAFETY: written by the call that just returned.
    Ok(unsafe { core::ptr::read_volatile(&raw const MASK.0[0]) })
}

/// Writes `value` into word `word` of the peer's mailbox.
fn poke_word(client: &Client<Hvc>, vm: u32, word: usize, value: u64) -> Result<(), Failure> {
    // SAFETY: the first word of the mask buffer is this vCPU's scratch here.
    unsafe { core::ptr::write_volatile(&raw mut MASK.0[0], value) };
    ok(
        "MEMORY_WRITE of the peer's mailbox",
        client.write_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(word),
            buffer: mask_ipa(),
            len: 8,
        }),
    )?;
    Ok(())
}

/// Passes mode: starts iteration `iteration` and waits until every one of
/// the writer's `vcpus` finished its pass; returns the pages written and the
/// slowest vCPU's pass time.
fn run_iteration(
    client: &Client<Hvc>,
    vm: u32,
    iteration: u64,
    vcpus: u64,
) -> Result<(u64, u64), Failure> {
    poke_word(client, vm, word::GO, iteration)?;
    let deadline = Deadline::after_seconds(60);
    loop {
        let done = peer_word(client, vm, word::DONE)?;
        if done >= iteration * vcpus {
            break;
        }
        if deadline.passed() {
            return Err(Failure::ControlTimeout {
                step: "the dirty writer finishes its pass",
                last: done,
            });
        }
    }
    let mut slowest = 0;
    for cpu in 0..(vcpus as usize).min(MAILBOX.0.len() - word::PASS_US) {
        slowest = slowest.max(peer_word(client, vm, word::PASS_US + cpu)?);
    }
    Ok((REGION_PAGES as u64, slowest))
}

/// The writer's write count and its clock at that count, read together.
fn peer_progress(client: &Client<Hvc>, vm: u32) -> Result<(u64, u64), Failure> {
    // The first words of the mask buffer are scratch here.
    ok(
        "MEMORY_READ of the peer's progress",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(1),
            buffer: mask_ipa(),
            len: 32,
        }),
    )?;
    // SAFETY: written by the call that just returned.
    let word = |i: usize| unsafe { core::ptr::read_volatile(&raw const MASK.0[i]) };
    Ok((word(0), word(3)))
}

/// Waits until the writer made `writes` more writes; returns how many it
/// made and in how many microseconds of its clock.
fn let_peer_write(client: &Client<Hvc>, vm: u32, writes: u64) -> Result<(u64, u64), Failure> {
    let (start, started) = peer_progress(client, vm)?;
    let deadline = Deadline::after_seconds(60);
    loop {
        let (now, at) = peer_progress(client, vm)?;
        if now >= start + writes {
            return Ok((now - start, at.saturating_sub(started)));
        }
        if deadline.passed() {
            return Err(Failure::ControlTimeout {
                step: "the dirty writer makes progress",
                last: now,
            });
        }
    }
}

/// What one harvest reported and took.
struct Harvest {
    /// Pages `DIRTY_LOG_GET` reported.
    count: u64,
    /// Microseconds of `DIRTY_LOG_GET`.
    get_us: u64,
    /// Microseconds of `DIRTY_LOG_CLEAR` (0 without manual protection).
    clear_us: u64,
}

/// Harvests slot 0's log (with manual protection also clears what it
/// reported).
fn harvest(client: &Client<Hvc>, vm: u32, words: usize, manual: bool) -> Result<Harvest, Failure> {
    let len = words as u64 * 8;
    let started = micros();
    let count = ok(
        "DIRTY_LOG_GET",
        client.dirty_log_get(DirtyLogGet {
            vm,
            slot: 0,
            buffer: bitmap_ipa(),
            len,
        }),
    )?;
    let get_us = micros() - started;
    let mut clear_us = 0;
    if manual {
        for i in 0..words {
            // SAFETY: both bitmaps are this vCPU's; BITMAP was written by
            // the call that returned.
            unsafe {
                let word = core::ptr::read_volatile(&raw const BITMAP.0[i]);
                core::ptr::write_volatile(&raw mut MASK.0[i], word);
            }
        }
        let started = micros();
        let cleared = ok(
            "DIRTY_LOG_CLEAR",
            client.dirty_log_clear(DirtyLogClear {
                vm,
                slot: 0,
                first_page: 0,
                buffer: mask_ipa(),
                len,
            }),
        )?;
        clear_us = micros() - started;
        if cleared > count {
            return Err(Failure::ControlTimeout {
                step: "DIRTY_LOG_CLEAR clears no more than DIRTY_LOG_GET reported",
                last: cleared,
            });
        }
    }
    Ok(Harvest {
        count,
        get_us,
        clear_us,
    })
}

/// One checked round: see the module doc. `pending` holds the pages that
/// changed after the last harvest and must be reported now; `strict`: the
/// peer is paused, every change must be reported now.
fn check_round(
    round: u32,
    old: usize,
    pending: &mut [bool; REGION_PAGES],
    strict: bool,
) -> Result<(usize, usize), Failure> {
    let new = 1 - old;
    let (mut changed, mut reported) = (0, 0);
    for (page, pending) in pending.iter_mut().enumerate() {
        let dirty = bit(&raw const BITMAP, REGION_FIRST + page as u64);
        let differs = copy_page(old, page) != copy_page(new, page);
        reported += usize::from(dirty);
        changed += usize::from(differs);
        if (*pending || (strict && differs)) && !dirty {
            println!(
                "dirty-log: round {round}: page {:#x} changed but was not reported",
                REGION + page as u64 * PAGE
            );
            return Err(Failure::Control {
                step: "every changed page is reported dirty",
                code: (REGION + page as u64 * PAGE) as i64,
            });
        }
        *pending = differs && !dirty;
    }
    Ok((changed, reported))
}

/// The `dirty-log` scenario.
pub fn control(options: DirtyOptions) -> Result<(), Failure> {
    let client = Client::new(Hvc);
    let peer = find_peer(&client)?;
    let vm = peer.id;
    let words = (peer.ram_pages as usize).div_ceil(64);
    if words > BITMAP_WORDS || REGION_FIRST + REGION_PAGES as u64 > peer.ram_pages {
        return Err(Failure::Control {
            step: "the peer's RAM holds the region and its bitmap fits",
            code: peer.ram_pages as i64,
        });
    }
    let deadline = Deadline::after_seconds(60);
    while peer_word(&client, vm, 0)? != READY {
        if deadline.passed() {
            return Err(Failure::ControlTimeout {
                step: "the dirty writer is ready",
                last: 0,
            });
        }
    }
    let vcpus = peer_word(&client, vm, 3)?;
    println!(
        "dirty-log: the peer's {vcpus} vCPUs populated {REGION_PAGES} pages in {} us",
        peer_word(&client, vm, 2)?
    );
    let mode = if options.passes {
        MODE_PASSES
    } else {
        MODE_RANDOM
    };
    poke_word(&client, vm, word::MODE, mode)?;
    let manual = options.mode & 1 != 0;
    let all_set = options.mode & 2 != 0;
    ok(
        "DIRTY_LOG_CONFIG",
        client.dirty_log_config(vm, options.mode, options.eager_split),
    )?;
    ok(
        "SLOT_SET_FLAGS LOG_DIRTY",
        client.set_slot_flags(vm, 0, SlotFlags::LOG_DIRTY),
    )?;
    println!(
        "dirty-log: logging the peer's slot 0 (mode {}, eager split {:#x})",
        options.mode, options.eager_split
    );
    read_region(&client, vm, 0)?;
    let mut pending = [false; REGION_PAGES];
    let mut old = 0;
    for round in 1..=ROUNDS + 1 {
        let last = round == ROUNDS + 1;
        // Round 1 runs longer: the writes right after enabling, which fault,
        // are what eager splitting speeds up (`bench -- dirty_log`).
        let goal = if round == 1 {
            8 * WRITES_PER_ROUND
        } else {
            WRITES_PER_ROUND
        };
        let (writes, write_us) = if options.passes {
            run_iteration(&client, vm, u64::from(round), vcpus)?
        } else {
            let_peer_write(&client, vm, goal)?
        };
        if last {
            ok("VM_PAUSE", client.pause(vm))?;
        }
        let Harvest {
            count,
            get_us,
            clear_us,
        } = harvest(&client, vm, words, manual)?;
        if all_set && round == 1 && count < peer.ram_pages {
            return Err(Failure::Control {
                step: "an all-set log reports every page first",
                code: count as i64,
            });
        }
        read_region(&client, vm, 1 - old)?;
        let (changed, reported) = check_round(round, old, &mut pending, last)?;
        println!(
            "dirty-log: round {round}: {count} dirty pages reported, {reported} in the region, {changed} changed; peer {writes} writes in {write_us} us; get {get_us} us; clear {clear_us} us{}",
            if last { " (peer paused)" } else { "" }
        );
        if reported == 0 {
            return Err(Failure::Control {
                step: "a round reports the pages the writer wrote",
                code: 0,
            });
        }
        if last {
            ok("VM_RESUME", client.resume(vm))?;
        }
        old = 1 - old;
    }
    ok(
        "SLOT_SET_FLAGS off",
        client.set_slot_flags(vm, 0, SlotFlags::NONE),
    )?;
    if options.passes {
        run_iteration(&client, vm, u64::from(ROUNDS) + 2, vcpus)?;
    } else {
        let_peer_write(&client, vm, WRITES_PER_ROUND)?;
    }
    let refused = client.dirty_log_get(DirtyLogGet {
        vm,
        slot: 0,
        buffer: bitmap_ipa(),
        len: words as u64 * 8,
    });
    if refused.is_ok() {
        return Err(Failure::Control {
            step: "DIRTY_LOG_GET of a slot that stopped logging is refused",
            code: code(refused),
        });
    }
    println!("dirty-log: logging off, the peer writes on");
    ok("VM_STOP", client.stop(vm))?;
    println!("dirty-log: every changed page was reported");
    Ok(())
}
