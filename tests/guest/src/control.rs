//! The `control` and `control-peer` scenarios: a control VM drives the
//! hypervisor's control interface (`control-abi`) against a second VM.
//!
//! Both VMs run this same image at the same guest address, so the peer's
//! [`MAILBOX`] has the same IPA in both: the control VM reads the peer's
//! memory there without any other agreement.
//!
//! # `control-peer` (one vCPU)
//!
//! 1. Calls `VERSION`: a VM without `control=1` must get `NOT_SUPPORTED`
//!    (prints `control-peer: VERSION refused: NOT_SUPPORTED`).
//! 2. Writes [`PATTERN_WORDS`] words of a known pattern across the page
//!    boundary of [`MAILBOX`], then the ready magic.
//! 3. Loops forever: in each round it stores the round number into the first
//!    word of every page of two windows ([`WINDOW_A`], [`WINDOW_B`], outside
//!    its RAM, where the control VM creates and moves a memslot), catching
//!    the data abort of a page that is in no slot (documented: an access
//!    outside the VM's memslots and devices gets an external abort), counts
//!    rounds in [`MAILBOX`] and prints progress every [`PEER_REPORT_ROUNDS`]
//!    rounds, until the hypervisor stops it.
//!
//! # `control` (one vCPU, `control=1`)
//!
//! 1. `VERSION` (major 1), `CALL_UID`, `CAPABILITIES`.
//! 2. `LIST_VMS` into a buffer that crosses a page boundary; the peer is the
//!    VM without the control flag.
//! 3. Waits for the peer's ready magic (`MEMORY_READ`), then reads the
//!    pattern (a target range and a buffer that both cross a page boundary)
//!    and checks it.
//! 4. Creates slot [`SLOT`] in the peer at [`WINDOW_A`], waits until the
//!    peer's stores show up in it, writes a marker with `MEMORY_WRITE`; moves
//!    it to [`WINDOW_B`], checks that the marker moved with it, that
//!    [`WINDOW_A`] is no longer mapped (`NOT_MAPPED`) and that the peer
//!    writes at the new place; deletes it and checks [`WINDOW_B`] is gone,
//!    for the interface (`NOT_MAPPED`) and for the peer (every access to
//!    both windows aborts from then on).
//! 5. Pauses the peer: its round counter stands still; while paused, its
//!    vCPU 0's PC is read (in RAM), `x9` written, read back and restored,
//!    `SP_EL1` is `NOT_SUPPORTED` and vCPU 7 `NO_SUCH_VCPU`; resumes it: it
//!    moves.
//! 6. Bogus calls: unknown VM, unknown slot, the caller itself, a slot that
//!    overlaps the peer's RAM, a reserved register, a buffer outside the
//!    caller's RAM (`BAD_ADDRESS`), an oversized transfer; `VCPU_GET_REGISTER`
//!    of the running peer is `BAD_STATE`.
//! 7. Stops the peer, checks `LIST_VMS` reports it stopped, and passes.

use core::sync::atomic::{AtomicU64, Ordering};

use control_abi::vm_info::{RECORD_SIZE, VmInfo, VmState};
use control_abi::{
    CallError, Client, Conduit, Error, Hvc, MemoryTransfer, RegisterId, SlotFlags, SlotRequest,
    VcpuRegister,
};

use crate::exceptions::{self, Access};
use crate::memory_map::PAGE;
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::Deadline;

/// Words of the pattern the peer writes.
pub const PATTERN_WORDS: usize = 64;
/// The peer's ready magic, written after the pattern.
const READY: u64 = 0x5045_4552_5245_4144;
/// Where the control VM creates the slot in the peer: outside the peer's RAM,
/// inside the gigabyte its stage-1 map makes normal memory.
pub const WINDOW_A: u64 = 0x5000_0000;
/// Where the control VM moves the slot.
pub const WINDOW_B: u64 = 0x5800_0000;
/// Pages of the slot (and of each window the peer touches).
pub const WINDOW_PAGES: u64 = 16;
/// The slot id the control VM uses.
pub const SLOT: u32 = 7;
/// The peer prints progress every this many rounds.
const PEER_REPORT_ROUNDS: u64 = 2000;
/// The marker the control VM writes into the slot.
const MARKER: u64 = 0x4d41_524b_4552_2121;

/// Two pages the peer writes and the control VM reads: `[0]` ready magic,
/// `[1]` rounds done, `[2]` aborts taken, the pattern from the last
/// [`PATTERN_WORDS`] / 2 words of the first page on, crossing into the second.
#[repr(C, align(4096))]
pub struct Mailbox([AtomicU64; 1024]);

/// The peer's mailbox (the same IPA in both VMs).
pub static MAILBOX: Mailbox = Mailbox([const { AtomicU64::new(0) }; 1024]);

/// First pattern word's index: half the pattern in each page.
const PATTERN_START: usize = 512 - PATTERN_WORDS / 2;

/// The control VM's buffer: two pages, so that a buffer can cross a page.
#[repr(C, align(4096))]
struct Buffer([u8; 2 * PAGE as usize]);

static mut BUFFER: Buffer = Buffer([0; 2 * PAGE as usize]);

fn pattern(i: usize) -> u64 {
    0x0123_4567_89ab_cdef ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn mailbox_ipa(word: usize) -> u64 {
    MAILBOX.0.as_ptr() as u64 + (word as u64) * 8
}

/// The `control-peer` scenario; never returns (the control VM stops it).
pub fn peer(_platform: &Platform) -> Result<(), Failure> {
    let client = Client::new(Hvc);
    match client.version() {
        Err(CallError::Refused(Error::NotSupported)) => {
            println!("control-peer: VERSION refused: NOT_SUPPORTED");
        }
        other => {
            println!("control-peer: VERSION answered {other:?}, expected NOT_SUPPORTED");
            return Err(Failure::Control {
                step: "VERSION from a VM without control=1",
                code: code(other.map(|_| ())),
            });
        }
    }
    for i in 0..PATTERN_WORDS {
        MAILBOX.0[PATTERN_START + i].store(pattern(i), Ordering::Relaxed);
    }
    MAILBOX.0[0].store(READY, Ordering::Release);
    println!(
        "control-peer: pattern at {:#x}, touching {:#x} and {:#x}",
        mailbox_ipa(PATTERN_START),
        WINDOW_A,
        WINDOW_B
    );
    let mut round = 0u64;
    let mut aborts = 0u64;
    loop {
        round += 1;
        for window in [WINDOW_A, WINDOW_B] {
            for page in 0..WINDOW_PAGES {
                let address = window + page * PAGE;
                // Word 0 of each page: the round; word 1 holds what the
                // control VM writes and is left alone.
                if exceptions::probe_store(address, round).is_some() {
                    aborts += 1;
                }
                // Read back through the same path: also faults it in.
                let _ = exceptions::probe(address + 8, Access::Read);
            }
        }
        MAILBOX.0[1].store(round, Ordering::Release);
        MAILBOX.0[2].store(aborts, Ordering::Release);
        if round.is_multiple_of(PEER_REPORT_ROUNDS) {
            println!("control-peer: round {round}, {aborts} aborts caught");
        }
    }
}

/// An outcome as a number for a failure report: 0 or the error code.
pub(crate) fn code<T>(result: Result<T, CallError>) -> i64 {
    match result {
        Ok(_) => 0,
        Err(CallError::Refused(e)) => e.code(),
        Err(CallError::UnknownCode(c)) => c,
    }
}

/// `result` must be `Ok`.
pub(crate) fn ok<T>(step: &'static str, result: Result<T, CallError>) -> Result<T, Failure> {
    result.map_err(|e| Failure::Control {
        step,
        code: code::<()>(Err(e)),
    })
}

/// The registers of the paused peer's vCPU 0: its PC is in guest RAM, a
/// general register written reads back and is restored, `SP_EL1` is not
/// kept and a vCPU the peer lacks is refused.
fn paused_registers(client: &Client<Hvc>, vm: u32) -> Result<(), Failure> {
    let reg = |reg| VcpuRegister { vm, vcpu: 0, reg };
    // The vCPU parks right after it leaves the guest: BUSY until then.
    let mut pc = Err(CallError::Refused(Error::Busy));
    for _ in 0..1000 {
        pc = client.get_register(reg(RegisterId::PC));
        if !matches!(pc, Err(CallError::Refused(Error::Busy))) {
            break;
        }
    }
    let pc = ok("VCPU_GET_REGISTER PC", pc)?;
    if pc < 0x4000_0000 {
        return Err(Failure::ControlTimeout {
            step: "the paused peer's PC is in its RAM",
            last: pc,
        });
    }
    let x9 = RegisterId::x(9).expect("x9");
    let old = ok("VCPU_GET_REGISTER x9", client.get_register(reg(x9)))?;
    let new = old ^ 0x5a5a_0000_1234;
    ok("VCPU_SET_REGISTER x9", client.set_register(reg(x9), new))?;
    let back = ok("VCPU_GET_REGISTER x9", client.get_register(reg(x9)))?;
    ok("VCPU_SET_REGISTER x9", client.set_register(reg(x9), old))?;
    if back != new {
        return Err(Failure::ControlTimeout {
            step: "a written register reads back",
            last: back,
        });
    }
    refused(
        "VCPU_GET_REGISTER SP_EL1",
        client.get_register(reg(RegisterId::SP_EL1)),
        Error::NotSupported,
    )?;
    refused(
        "VCPU_GET_REGISTER of vCPU 7",
        client.get_register(VcpuRegister {
            vm,
            vcpu: 7,
            reg: RegisterId::PC,
        }),
        Error::NoSuchVcpu,
    )?;
    println!("control: the paused peer's PC {pc:#x}; x9 written and read back");
    Ok(())
}

/// `result` must be the refusal `expected`.
fn refused<T>(
    step: &'static str,
    result: Result<T, CallError>,
    expected: Error,
) -> Result<(), Failure> {
    match result {
        Err(CallError::Refused(e)) if e == expected => {
            println!("control: {step}: {} as expected", e.name());
            Ok(())
        }
        other => Err(Failure::Control {
            step,
            code: code(other),
        }),
    }
}

fn buffer_ipa() -> u64 {
    (&raw const BUFFER) as u64
}

fn buffer_word(offset: u64) -> u64 {
    // SAFETY: `offset + 8` lies within the two-page buffer; the hypervisor
    // wrote it during the call that returned before this read, and only this
    // vCPU uses the buffer.
    unsafe { core::ptr::read_volatile((buffer_ipa() + offset) as *const u64) }
}

fn set_buffer_word(offset: u64, value: u64) {
    // SAFETY: as in `buffer_word`.
    unsafe { core::ptr::write_volatile((buffer_ipa() + offset) as *mut u64, value) }
}

/// Reads one word of the peer at `ipa` through the buffer's first word.
fn peer_word(client: &Client<Hvc>, vm: u32, ipa: u64) -> Result<u64, CallError> {
    client.read_memory(MemoryTransfer {
        vm,
        ipa,
        buffer: buffer_ipa(),
        len: 8,
    })?;
    Ok(buffer_word(0))
}

/// The peer's rounds done and aborts caught, read in one call.
fn peer_progress(client: &Client<Hvc>, vm: u32) -> Result<(u64, u64), Failure> {
    ok(
        "MEMORY_READ peer progress",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(1),
            buffer: buffer_ipa(),
            len: 16,
        }),
    )?;
    Ok((buffer_word(0), buffer_word(8)))
}

/// Polls until `done(word at ipa)` or the step deadline.
fn wait_for(
    client: &Client<Hvc>,
    vm: u32,
    ipa: u64,
    step: &'static str,
    done: impl Fn(u64) -> bool,
) -> Result<u64, Failure> {
    let deadline = Deadline::after_seconds(60);
    loop {
        let word = ok(step, peer_word(client, vm, ipa))?;
        if done(word) {
            return Ok(word);
        }
        if deadline.passed() {
            return Err(Failure::ControlTimeout { step, last: word });
        }
    }
}

/// The peer's record from `LIST_VMS` (the VM without the control flag).
pub(crate) fn find_peer(client: &Client<Hvc>) -> Result<VmInfo, Failure> {
    // The records straddle the buffer's page boundary.
    let start = buffer_ipa() + PAGE - RECORD_SIZE as u64;
    let reply = ok(
        "LIST_VMS",
        client.list_vms(start, 4 * RECORD_SIZE as u64, 0),
    )?;
    println!(
        "control: LIST_VMS wrote {} of {} records",
        reply.written, reply.total
    );
    let mut peer = None;
    for i in 0..reply.written {
        let mut bytes = [0u8; RECORD_SIZE];
        for (j, byte) in bytes.iter_mut().enumerate() {
            // SAFETY: within the buffer the hypervisor just wrote.
            *byte = unsafe {
                core::ptr::read_volatile((start + i * RECORD_SIZE as u64 + j as u64) as *const u8)
            };
        }
        let info = VmInfo::decode(&bytes).ok_or(Failure::Control {
            step: "LIST_VMS record",
            code: 0,
        })?;
        println!(
            "control: vm {} {:?}, {} vCPUs, control {}, {} pages in {} slots",
            info.id, info.state, info.vcpus, info.control, info.ram_pages, info.slots
        );
        if !info.control && peer.is_none() {
            peer = Some(info);
        }
    }
    peer.ok_or(Failure::Control {
        step: "LIST_VMS: no peer",
        code: 0,
    })
}

/// The `control` scenario.
pub fn control(platform: &Platform) -> Result<(), Failure> {
    let ram_end = platform.ram()[0].end;
    let client = Client::new(Hvc);
    let version = ok("VERSION", client.version())?;
    if version.major != 1 {
        return Err(Failure::Control {
            step: "VERSION major",
            code: i64::from(version.major),
        });
    }
    let uid = ok("CALL_UID", client.call_uid())?;
    if uid != control_abi::function::UID {
        return Err(Failure::Control {
            step: "CALL_UID",
            code: i64::from(uid[0]),
        });
    }
    let caps = ok("CAPABILITIES", client.capabilities())?;
    println!(
        "control: version {}.{}, capabilities {:#x}, max transfer {}",
        version.major, version.minor, caps.bits, caps.max_transfer
    );
    let peer = find_peer(&client)?;
    let vm = peer.id;

    // The pattern, across a page boundary on both sides.
    wait_for(&client, vm, mailbox_ipa(0), "peer ready", |w| w == READY)?;
    let len = (PATTERN_WORDS * 8) as u64;
    let buffer = buffer_ipa() + PAGE - len / 2 - 8;
    ok(
        "MEMORY_READ pattern",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(PATTERN_START),
            buffer,
            len,
        }),
    )?;
    for i in 0..PATTERN_WORDS {
        let found = buffer_word(buffer - buffer_ipa() + i as u64 * 8);
        if found != pattern(i) {
            return Err(Failure::Mismatch {
                cpu: 0,
                address: mailbox_ipa(PATTERN_START + i),
                expected: pattern(i),
                found,
            });
        }
    }
    println!("control: read the peer's pattern ({len} bytes across a page) back");

    // A memslot created, moved and deleted while the peer runs.
    ok(
        "SLOT_CREATE",
        client.create_slot(SlotRequest {
            vm,
            slot: SLOT,
            base_ipa: WINDOW_A,
            npages: WINDOW_PAGES,
            flags: SlotFlags::NONE,
        }),
    )?;
    let last_page = WINDOW_A + (WINDOW_PAGES - 1) * PAGE;
    let seen = wait_for(&client, vm, last_page, "peer writes the new slot", |w| {
        w != 0
    })?;
    println!("control: slot {SLOT} created at {WINDOW_A:#x}; the peer wrote round {seen} into it");
    set_buffer_word(0, MARKER);
    ok(
        "MEMORY_WRITE marker",
        client.write_memory(MemoryTransfer {
            vm,
            ipa: WINDOW_A + 8,
            buffer: buffer_ipa(),
            len: 8,
        }),
    )?;
    ok("SLOT_MOVE", client.move_slot(vm, SLOT, WINDOW_B))?;
    let marker = ok(
        "MEMORY_READ moved marker",
        peer_word(&client, vm, WINDOW_B + 8),
    )?;
    if marker != MARKER {
        return Err(Failure::Mismatch {
            cpu: 0,
            address: WINDOW_B + 8,
            expected: MARKER,
            found: marker,
        });
    }
    refused(
        "MEMORY_READ at the slot's old place",
        peer_word(&client, vm, WINDOW_A),
        Error::NotMapped,
    )?;
    let before = ok("MEMORY_READ peer round", peer_word(&client, vm, WINDOW_B))?;
    wait_for(&client, vm, WINDOW_B, "peer writes the moved slot", |w| {
        w > before
    })?;
    println!("control: slot moved to {WINDOW_B:#x}, marker kept, the peer writes it");
    ok("SLOT_DELETE", client.delete_slot(vm, SLOT))?;
    refused(
        "MEMORY_READ of the deleted slot",
        peer_word(&client, vm, WINDOW_B),
        Error::NotMapped,
    )?;
    refused(
        "SLOT_DELETE twice",
        client.delete_slot(vm, SLOT),
        Error::NoSuchSlot,
    )?;
    // With the slot gone, every page of both windows must abort: the
    // peer's stage 2 keeps no mapping of the deleted slot.
    let (round, aborts) = peer_progress(&client, vm)?;
    wait_for(
        &client,
        vm,
        mailbox_ipa(1),
        "peer runs after the delete",
        |r| r >= round + 4,
    )?;
    let (round_after, aborts_after) = peer_progress(&client, vm)?;
    let per_round = 2 * WINDOW_PAGES;
    // A snapshot may hold a round's number before its aborts: one round slack.
    let least = per_round * (round_after - round) - per_round;
    if aborts_after - aborts < least {
        return Err(Failure::ControlTimeout {
            step: "the peer's accesses to the deleted slot abort",
            last: aborts_after - aborts,
        });
    }
    println!("control: slot deleted; the peer runs on");

    // Pause and resume.
    ok("VM_PAUSE", client.pause(vm))?;
    let paused = ok(
        "MEMORY_READ paused round",
        peer_word(&client, vm, mailbox_ipa(1)),
    )?;
    let deadline = Deadline::after_seconds(1);
    while !deadline.passed() {}
    let still = ok(
        "MEMORY_READ paused round",
        peer_word(&client, vm, mailbox_ipa(1)),
    )?;
    if still != paused {
        return Err(Failure::ControlTimeout {
            step: "paused peer ran",
            last: still,
        });
    }
    ok("VM_PAUSE twice", client.pause(vm))?;
    paused_registers(&client, vm)?;
    ok("VM_RESUME", client.resume(vm))?;
    wait_for(&client, vm, mailbox_ipa(1), "peer runs after resume", |r| {
        r > paused
    })?;
    println!("control: paused the peer (round {paused} held for a second), resumed it");

    // Bogus calls.
    refused("VM_PAUSE of no VM", client.pause(1000), Error::NoSuchVm)?;
    refused(
        "SLOT_DELETE of no slot",
        client.delete_slot(vm, 99),
        Error::NoSuchSlot,
    )?;
    let me = find_self(&client)?;
    refused("VM_PAUSE of the caller", client.pause(me), Error::Denied)?;
    refused(
        "SLOT_CREATE over the peer's RAM",
        client.create_slot(SlotRequest {
            vm,
            slot: SLOT,
            base_ipa: mailbox_ipa(0) & !(PAGE - 1),
            npages: 1,
            flags: SlotFlags::NONE,
        }),
        Error::Conflict,
    )?;
    refused(
        "SLOT_CREATE misaligned",
        client.create_slot(SlotRequest {
            vm,
            slot: SLOT,
            base_ipa: WINDOW_A + 8,
            npages: 1,
            flags: SlotFlags::NONE,
        }),
        Error::InvalidParameters,
    )?;
    refused(
        "MEMORY_READ into a buffer outside the caller's RAM",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(0),
            buffer: 0x1_0000_0000,
            len: 8,
        }),
        Error::BadAddress,
    )?;
    refused(
        "MEMORY_READ into a buffer that runs off the caller's RAM",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(0),
            buffer: ram_end - 8,
            len: 16,
        }),
        Error::BadAddress,
    )?;
    refused(
        "MEMORY_WRITE from the UART",
        client.write_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(0),
            buffer: 0x0900_0000,
            len: 8,
        }),
        Error::BadAddress,
    )?;
    refused(
        "MEMORY_READ over the limit",
        client.read_memory(MemoryTransfer {
            vm,
            ipa: mailbox_ipa(0),
            buffer: buffer_ipa(),
            len: control_abi::MAX_TRANSFER + 1,
        }),
        Error::InvalidParameters,
    )?;
    refused(
        "MEMORY_READ outside the peer's RAM",
        peer_word(&client, vm, WINDOW_A),
        Error::NotMapped,
    )?;
    refused(
        "VCPU_GET_REGISTER of a running VM",
        client.get_register(VcpuRegister {
            vm,
            vcpu: 0,
            reg: RegisterId::PC,
        }),
        Error::BadState,
    )?;
    let reserved = Hvc.call([
        u64::from(control_abi::function::VM_PAUSE),
        u64::from(vm),
        1,
        0,
        0,
        0,
        0,
        0,
    ]);
    if reserved[0] as i64 != Error::InvalidParameters.code() {
        return Err(Failure::Control {
            step: "reserved register",
            code: reserved[0] as i64,
        });
    }

    // Stop the peer.
    ok("VM_STOP", client.stop(vm))?;
    ok("VM_STOP twice", client.stop(vm))?;
    refused(
        "VM_RESUME of a stopped VM",
        client.resume(vm),
        Error::BadState,
    )?;
    let after = find_vm(&client, vm)?;
    if after.state != VmState::Stopped {
        return Err(Failure::Control {
            step: "LIST_VMS after VM_STOP",
            code: after.state as i64,
        });
    }
    println!("control: stopped the peer");
    Ok(())
}

/// The caller's own id: the control VM in the list (the scenario runs with
/// one control VM).
fn find_self(client: &Client<Hvc>) -> Result<u32, Failure> {
    let reply = ok("LIST_VMS", client.list_vms(buffer_ipa(), PAGE, 0))?;
    (0..reply.written)
        .filter_map(|i| record(i as usize))
        .find(|info| info.control)
        .map(|info| info.id)
        .ok_or(Failure::Control {
            step: "LIST_VMS: no control VM",
            code: 0,
        })
}

/// VM `id`'s record.
fn find_vm(client: &Client<Hvc>, id: u32) -> Result<VmInfo, Failure> {
    let reply = ok("LIST_VMS", client.list_vms(buffer_ipa(), PAGE, 0))?;
    (0..reply.written)
        .filter_map(|i| record(i as usize))
        .find(|info| info.id == id)
        .ok_or(Failure::Control {
            step: "LIST_VMS: VM gone",
            code: i64::from(id),
        })
}

/// Record `i` of a `LIST_VMS` into the start of the buffer.
fn record(i: usize) -> Option<VmInfo> {
    let mut bytes = [0u8; RECORD_SIZE];
    for (j, byte) in bytes.iter_mut().enumerate() {
        // SAFETY: within the buffer the hypervisor just wrote.
        *byte = unsafe {
            core::ptr::read_volatile((buffer_ipa() as usize + i * RECORD_SIZE + j) as *const u8)
        };
    }
    VmInfo::decode(&bytes)
}
