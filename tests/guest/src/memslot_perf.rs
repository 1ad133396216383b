//! The `memslot-perf` scenario: a control VM creates, moves and deletes many
//! memslots in a `toucher` peer while the peer touches them, timing each
//! kind of change and checking the peer's view after each (KVM's
//! `memslot_perf_test` is the model).
//!
//! # Steps
//!
//! `slots=N` slots of [`SLOT_PAGES`] pages sit side by side from [`WINDOW`]
//! in the peer (slot ids from [`FIRST_SLOT`]). Each step prints one
//! `memslot-perf: FIGURE VALUE UNIT` line:
//!
//! 1. `setup`: the N slots are created (per slot).
//! 2. `map`: the toucher writes every page once: one fault per page, each
//!    finding its slot among N (per page, toucher's time); `touch`: it writes
//!    them again, now mapped (per page).
//! 3. The toucher loops over the first half of the slots. `move_inactive`:
//!    a slot of the second half (not touched) moves to [`SPARE`] and back;
//!    `move_active`: a slot of the first half (touched all the time) does
//!    the same (per move).
//! 4. Churn, checked: [`CHURN`] times a slot of the touched half moves to
//!    [`SPARE`], back, and is deleted and created anew. After each change the
//!    control VM waits two of the toucher's rounds and reads the slot's
//!    pages: once moved away, no page may hold a store made through its old
//!    address after the move returned (a stale stage-2 entry or TLB entry
//!    would let one through); back home and after the re-creation, every
//!    page must hold a store made after the change (the new mapping works,
//!    and the re-created slot starts from zeroed memory).
//! 5. `delete`: every slot is deleted (per slot), the peer stopped.

use control_abi::{Client, Hvc, SlotFlags, SlotRequest};

use crate::control::ok;
use crate::memory_map::PAGE;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::micros;
use crate::toucher::{self, Toucher, scratch, untag};

/// Where the first slot sits in the peer: outside its RAM, inside the
/// gigabyte its stage-1 map makes normal memory.
pub const WINDOW: u64 = 0x5000_0000;
/// Where moved slots go: above every slot's home.
pub const SPARE: u64 = 0x7000_0000;
/// Pages per slot.
pub const SLOT_PAGES: u64 = 2;
/// The first slot's id (slot 0 is the peer's RAM).
pub const FIRST_SLOT: u32 = 1;
/// Most slots the scenario takes: their homes end below [`SPARE`].
pub const MAX_SLOTS: u32 = 16384;
/// Timed moves of each kind.
const MOVES: usize = 15;
/// Checked churn rounds.
const CHURN: u64 = 12;

fn home(index: u32) -> u64 {
    WINDOW + u64::from(index) * SLOT_PAGES * PAGE
}

fn request(vm: u32, index: u32, base_ipa: u64) -> SlotRequest {
    SlotRequest {
        vm,
        slot: FIRST_SLOT + index,
        base_ipa,
        npages: SLOT_PAGES,
        flags: SlotFlags::NONE,
    }
}

fn figure(name: &str, value: u64, unit: &str) {
    println!("memslot-perf: {name} {value} {unit}");
}

/// The median of `values` (sorted in place).
fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

/// Moves slot `index` to `to`; returns the microseconds the call took.
fn move_slot(client: &Client<Hvc>, vm: u32, index: u32, to: u64) -> Result<u64, Failure> {
    let started = micros();
    ok("SLOT_MOVE", client.move_slot(vm, FIRST_SLOT + index, to))?;
    Ok(micros() - started)
}

/// Checks the first words of slot `index`'s pages, read at `at`: each must
/// hold a store to `home(index)`'s page, made in a round in `rounds` (the
/// toucher goes on while they are read, so a bound above is only set where
/// no later store may land).
fn check_tags(
    toucher: &Toucher,
    index: u32,
    at: u64,
    rounds: core::ops::RangeInclusive<u64>,
    step: &'static str,
) -> Result<(), Failure> {
    toucher.read_tags(at, SLOT_PAGES)?;
    for page in 0..SLOT_PAGES {
        let (round, frame) = untag(scratch(page as usize));
        let address = home(index) + page * PAGE;
        if frame != address / PAGE || !rounds.contains(&round) {
            println!(
                "memslot-perf: {step}: slot {} page {page} holds round {round} frame {frame:#x}, want rounds {rounds:?} frame {:#x}",
                FIRST_SLOT + index,
                address / PAGE
            );
            return Err(Failure::Control {
                step,
                code: address as i64,
            });
        }
    }
    Ok(())
}

/// Step 4: one slot of the touched half moves away, comes back, and is
/// re-created, each change checked.
fn churn(client: &Client<Hvc>, vm: u32, toucher: &Toucher, index: u32) -> Result<(), Failure> {
    let aborts = toucher.aborts()?;
    move_slot(client, vm, index, SPARE)?;
    let moved = toucher.rounds()?;
    toucher.wait_rounds(2)?;
    // Round `moved + 1` may have stored before the move returned; every
    // later round ran after it and must have aborted.
    check_tags(
        toucher,
        index,
        SPARE,
        1..=moved + 1,
        "no store reaches a slot through the address it left",
    )?;
    if toucher.aborts()? < aborts + SLOT_PAGES {
        return Err(Failure::Control {
            step: "stores to a slot's old address abort",
            code: (toucher.aborts()? - aborts) as i64,
        });
    }
    move_slot(client, vm, index, home(index))?;
    check_fresh_stores(toucher, index, "stores reach a slot moved back")?;
    ok("SLOT_DELETE", client.delete_slot(vm, FIRST_SLOT + index))?;
    ok(
        "SLOT_CREATE",
        client.create_slot(request(vm, index, home(index))),
    )?;
    check_fresh_stores(toucher, index, "stores reach a re-created slot")
}

/// After a change that put slot `index` back at its home: round `r + 1`
/// (`r` read now) may have missed it, every later round must have stored
/// into each of its pages.
fn check_fresh_stores(toucher: &Toucher, index: u32, step: &'static str) -> Result<(), Failure> {
    let changed = toucher.rounds()?;
    toucher.wait_rounds(2)?;
    check_tags(toucher, index, home(index), changed + 2..=u64::MAX, step)
}

/// The `memslot-perf` scenario with `slots` slots.
pub fn control(slots: u32) -> Result<(), Failure> {
    if !(4..=MAX_SLOTS).contains(&slots) {
        return Err(Failure::Control {
            step: "slots= is between 4 and 16384",
            code: i64::from(slots),
        });
    }
    toucher::drive(|client, vm, toucher| steps(client, vm, toucher, slots))
}

fn steps(client: &Client<Hvc>, vm: u32, toucher: &mut Toucher, slots: u32) -> Result<(), Failure> {
    let pages = u64::from(slots) * SLOT_PAGES;

    let started = micros();
    for index in 0..slots {
        ok(
            "SLOT_CREATE",
            client.create_slot(request(vm, index, home(index))),
        )?;
    }
    let setup_ns = (micros() - started) * 1000 / u64::from(slots);
    figure("setup", setup_ns, "ns_per_slot");

    let aborts = toucher.aborts()?;
    let map_us = toucher.write_all(WINDOW, pages)?;
    let touch_us = toucher.write_all(WINDOW, pages)?;
    if toucher.aborts()? != aborts {
        return Err(Failure::Control {
            step: "stores into every slot land",
            code: (toucher.aborts()? - aborts) as i64,
        });
    }
    figure("map", map_us * 1000 / pages, "ns_per_page");
    figure("touch", touch_us * 1000 / pages, "ns_per_page");

    let half = slots / 2;
    toucher.start_loop(WINDOW, u64::from(half) * SLOT_PAGES)?;
    toucher.wait_rounds(1)?;
    for (name, first) in [("move_inactive", half), ("move_active", 0)] {
        let mut times = [0u64; 2 * MOVES];
        for i in 0..MOVES {
            let index = first + (i as u32 * 7919) % half;
            times[2 * i] = move_slot(client, vm, index, SPARE)?;
            times[2 * i + 1] = move_slot(client, vm, index, home(index))?;
        }
        figure(name, median(&mut times), "us");
    }

    for round in 0..CHURN {
        let index = ((round * 104_729) % u64::from(half)) as u32;
        churn(client, vm, toucher, index)?;
    }
    println!("memslot-perf: {CHURN} churn rounds checked");

    let started = micros();
    for index in 0..slots {
        ok("SLOT_DELETE", client.delete_slot(vm, FIRST_SLOT + index))?;
    }
    let delete_ns = (micros() - started) * 1000 / u64::from(slots);
    figure("delete", delete_ns, "ns_per_slot");
    println!("memslot-perf: every change checked");
    Ok(())
}
