//! The `page-table` scenario: a control VM times the hypervisor's stage-2
//! page-table work on a `toucher` peer, stage by stage, as KVM's
//! `kvm_page_table_test` does.
//!
//! # Stages
//!
//! The control VM creates slot [`SLOT`] of [`PAGES`] pages (64 MiB, backed by
//! 2 MiB-aligned memory) at [`WINDOW`] in the peer, outside the peer's RAM,
//! and prints one `page-table: FIGURE VALUE us` line per stage:
//!
//! 1. `create_4k`: logging on (plain mode, no eager split), then the toucher
//!    writes every page: one translation fault per page, each mapping a
//!    4 KiB page (toucher's time).
//! 2. `write_protect`: `DIRTY_LOG_GET` reports every page and write-protects
//!    them again, with one range flush (control VM's time).
//! 3. `update_4k`: the toucher writes every page again: one permission fault
//!    per page, relaxed on the read side.
//! 4. `collapse`: the log is harvested once more (every page protected
//!    again) and logging turned off (`log_off`); the toucher writes every
//!    page: the first write into each 2 MiB range faults and maps a block
//!    over the range's 512 pages (the table of pages goes).
//! 5. `split`: logging on with eager splitting in 2 MiB chunks: the slot is
//!    write-protected and its 32 blocks split to pages (control VM's time).
//! 6. `unmap`: the slot is deleted: its 16,384 pages are unmapped with one
//!    range flush and the backing freed (control VM's time).
//!
//! Every stage checks what it can see: the harvests report every page, the
//! toucher's stores never abort, and its tags read back through the control
//! interface. The TLB invalidations by kind are the peer's hypervisor
//! counters (`bench -- page_table` compares `-cpu max` with FEAT_TLBIRANGE
//! against `cortex-a57` without it).

use control_abi::{Client, DirtyLogGet, Hvc, SlotFlags, SlotRequest};

use crate::control::ok;
use crate::memory_map::PAGE;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::micros;
use crate::toucher::{self, Toucher, scratch, tag};

/// Where the slot sits in the peer: outside its RAM, inside the gigabyte its
/// stage-1 map makes normal memory, 2 MiB-aligned.
pub const WINDOW: u64 = 0x5000_0000;
/// Pages of the slot: 64 MiB.
pub const PAGES: u64 = 16384;
/// The slot's id.
pub const SLOT: u32 = 1;
/// Eager split chunk of stage 5.
const SPLIT_CHUNK: u64 = 2 << 20;

#[repr(C, align(4096))]
struct Bitmap([u64; (PAGES / 64) as usize]);

static mut BITMAP: Bitmap = Bitmap([0; (PAGES / 64) as usize]);

fn bitmap_ipa() -> u64 {
    (&raw const BITMAP) as u64
}

fn figure(name: &str, us: u64) {
    println!("page-table: {name} {us} us");
}

/// Runs `f` and returns its result and the microseconds it took.
fn timed<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<(T, u64), Failure> {
    let started = micros();
    let value = f()?;
    Ok((value, micros() - started))
}

/// Harvests the slot's log; every page must be reported.
fn harvest_all(client: &Client<Hvc>, vm: u32) -> Result<u64, Failure> {
    let (count, us) = timed(|| {
        ok(
            "DIRTY_LOG_GET",
            client.dirty_log_get(DirtyLogGet {
                vm,
                slot: SLOT,
                buffer: bitmap_ipa(),
                len: PAGES / 8,
            }),
        )
    })?;
    if count != PAGES {
        return Err(Failure::Control {
            step: "a harvest after a full write reports every page",
            code: count as i64,
        });
    }
    Ok(us)
}

/// The toucher writes every page; none may abort.
fn write_all(toucher: &mut Toucher, name: &str) -> Result<(), Failure> {
    let aborts = toucher.aborts()?;
    let us = toucher.write_all(WINDOW, PAGES)?;
    if toucher.aborts()? != aborts {
        return Err(Failure::Control {
            step: "the toucher's stores into the slot land",
            code: (toucher.aborts()? - aborts) as i64,
        });
    }
    figure(name, us);
    Ok(())
}

/// The `page-table` scenario.
pub fn control() -> Result<(), Failure> {
    toucher::drive(stages)
}

fn stages(client: &Client<Hvc>, vm: u32, toucher: &mut Toucher) -> Result<(), Failure> {
    ok("DIRTY_LOG_CONFIG", client.dirty_log_config(vm, 0, 0))?;
    let ((), us) = timed(|| {
        ok(
            "SLOT_CREATE",
            client.create_slot(SlotRequest {
                vm,
                slot: SLOT,
                base_ipa: WINDOW,
                npages: PAGES,
                flags: SlotFlags::NONE,
            }),
        )
    })?;
    figure("slot_create", us);
    ok(
        "SLOT_SET_FLAGS LOG_DIRTY",
        client.set_slot_flags(vm, SLOT, SlotFlags::LOG_DIRTY),
    )?;
    write_all(toucher, "create_4k")?;
    figure("write_protect", harvest_all(client, vm)?);
    write_all(toucher, "update_4k")?;
    harvest_all(client, vm)?;
    let ((), us) = timed(|| {
        ok(
            "SLOT_SET_FLAGS off",
            client.set_slot_flags(vm, SLOT, SlotFlags::NONE),
        )
    })?;
    figure("log_off", us);
    write_all(toucher, "collapse")?;
    // The last write's tags read back through the control interface.
    let last = toucher.sequence();
    toucher.read_tags(WINDOW, 64)?;
    for page in 0..64 {
        let want = tag(last, WINDOW + page * PAGE);
        if scratch(page as usize) != want {
            return Err(Failure::Control {
                step: "the toucher's last stores read back",
                code: page as i64,
            });
        }
    }
    ok(
        "DIRTY_LOG_CONFIG eager split",
        client.dirty_log_config(vm, 0, SPLIT_CHUNK),
    )?;
    let ((), us) = timed(|| {
        ok(
            "SLOT_SET_FLAGS LOG_DIRTY",
            client.set_slot_flags(vm, SLOT, SlotFlags::LOG_DIRTY),
        )
    })?;
    figure("split", us);
    write_all(toucher, "update_split")?;
    let ((), us) = timed(|| ok("SLOT_DELETE", client.delete_slot(vm, SLOT)))?;
    figure("unmap", us);
    println!("page-table: every stage done");
    Ok(())
}
