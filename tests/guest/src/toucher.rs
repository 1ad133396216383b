//! The `toucher` scenario: a peer VM that touches guest memory on command,
//! for the control scenarios that time the hypervisor's stage-2 work
//! (`page-table`, `memslot-perf`).
//!
//! # Protocol
//!
//! Both VMs run this image, so the peer's [`MAILBOX`] has the same IPA in
//! both. The control VM writes a command's arguments (`MEMORY_WRITE`), then,
//! in a second call, its sequence number; the toucher polls the sequence
//! number and runs the command:
//!
//! - [`Op::Write`]: stores a tag (see [`tag`]) into the first word of every
//!   page of `[base, base + pages * 4 KiB)` once, then publishes the time it
//!   took and marks the command done.
//! - [`Op::Loop`]: marks the command done at once, then stores the tag of
//!   the current round into every page of the range, round after round,
//!   until a new command arrives; a store that aborts (the page is in no
//!   slot) is caught and counted. Each finished round is published.
//!
//! The tag of a store names the round and the page's frame, so the control
//! VM can tell, reading a slot's memory, which address and which round wrote
//! each page: a store that reached a slot through an address the slot had
//! already left shows up as a too-recent round with the old frame.

use core::sync::atomic::{AtomicU64, Ordering};

use control_abi::{Client, Hvc, MemoryTransfer};

use crate::control::{find_peer, ok};
use crate::exceptions;
use crate::memory_map::PAGE;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{Deadline, micros};

/// The toucher's ready magic.
const READY: u64 = 0x544f_5543_4845_5252;

/// Mailbox words.
mod word {
    /// Ready magic.
    pub const READY: usize = 0;
    /// Sequence number of the current command (written by the control VM).
    pub const SEQUENCE: usize = 1;
    /// The command's [`super::Op`].
    pub const OP: usize = 2;
    /// First address of the range.
    pub const BASE: usize = 3;
    /// Pages of the range.
    pub const PAGES: usize = 4;
    /// Sequence number of the last command done (or, for a loop, started).
    pub const DONE: usize = 8;
    /// Microseconds the last `Write` took.
    pub const ELAPSED_US: usize = 9;
    /// Rounds a loop finished.
    pub const ROUNDS: usize = 10;
    /// Stores that aborted, over the toucher's life.
    pub const ABORTS: usize = 11;
}

/// What a command asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Op {
    /// Store into every page once; time it.
    Write = 1,
    /// Store into every page round after round until the next command,
    /// catching aborts.
    Loop = 2,
}

/// The word stored into a page's first word in round `round` at `address`.
pub fn tag(round: u64, address: u64) -> u64 {
    (round << 32) | (address / PAGE)
}

/// The round and frame a tag names.
pub fn untag(tag: u64) -> (u64, u64) {
    (tag >> 32, tag & 0xffff_ffff)
}

#[repr(C, align(4096))]
struct Mailbox([AtomicU64; 512]);

static MAILBOX: Mailbox = Mailbox([const { AtomicU64::new(0) }; 512]);

/// The `toucher` scenario; never returns (the control VM stops it).
pub fn run() -> Result<(), Failure> {
    let mailbox = &MAILBOX.0;
    mailbox[word::READY].store(READY, Ordering::Release);
    println!("toucher: ready, mailbox at {:#x}", mailbox.as_ptr() as u64);
    let mut done = 0;
    let mut aborts = 0u64;
    loop {
        let sequence = mailbox[word::SEQUENCE].load(Ordering::Acquire);
        if sequence == done {
            core::hint::spin_loop();
            continue;
        }
        let op = mailbox[word::OP].load(Ordering::Acquire);
        let base = mailbox[word::BASE].load(Ordering::Acquire);
        let pages = mailbox[word::PAGES].load(Ordering::Acquire);
        done = sequence;
        if op == Op::Write as u64 {
            let started = micros();
            for page in 0..pages {
                let address = base + page * PAGE;
                if exceptions::probe_store(address, tag(sequence, address)).is_some() {
                    aborts += 1;
                }
            }
            mailbox[word::ELAPSED_US].store(micros() - started, Ordering::Release);
            mailbox[word::ABORTS].store(aborts, Ordering::Release);
            mailbox[word::DONE].store(sequence, Ordering::Release);
        } else if op == Op::Loop as u64 {
            mailbox[word::ROUNDS].store(0, Ordering::Release);
            mailbox[word::DONE].store(sequence, Ordering::Release);
            let mut round = 0;
            while mailbox[word::SEQUENCE].load(Ordering::Acquire) == sequence {
                round += 1;
                for page in 0..pages {
                    let address = base + page * PAGE;
                    if exceptions::probe_store(address, tag(round, address)).is_some() {
                        aborts += 1;
                    }
                }
                mailbox[word::ABORTS].store(aborts, Ordering::Release);
                mailbox[word::ROUNDS].store(round, Ordering::Release);
            }
        } else {
            println!("toucher: unknown op {op}");
            mailbox[word::DONE].store(sequence, Ordering::Release);
        }
    }
}

/// Finds the toucher peer, runs `steps` against it, then stops it, also when
/// a step failed (so that a failed run ends at once, not at the runner's
/// timeout).
pub fn drive(
    steps: impl FnOnce(&Client<Hvc>, u32, &mut Toucher) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let client = Client::new(Hvc);
    let vm = find_peer(&client)?.id;
    let mut toucher = Toucher::attach(&client, vm)?;
    let result = steps(&client, vm, &mut toucher);
    let stopped = ok("VM_STOP", client.stop(vm));
    result.and(stopped)
}

/// The control VM's handle on a toucher.
pub struct Toucher<'a> {
    client: &'a Client<Hvc>,
    vm: u32,
    sequence: u64,
}

/// One page of scratch for the control side's transfers.
#[repr(C, align(4096))]
struct Scratch([u64; 512]);

static mut SCRATCH: Scratch = Scratch([0; 512]);

fn scratch_ipa() -> u64 {
    (&raw const SCRATCH) as u64
}

/// Word `i` of the scratch page, as the last transfer left it.
pub fn scratch(i: usize) -> u64 {
    // SAFETY: in bounds; written by a call that returned.
    unsafe { core::ptr::read_volatile(&raw const SCRATCH.0[i]) }
}

fn mailbox_ipa(word: usize) -> u64 {
    MAILBOX.0.as_ptr() as u64 + word as u64 * 8
}

impl<'a> Toucher<'a> {
    /// Waits for the toucher in VM `vm` to be ready.
    pub fn attach(client: &'a Client<Hvc>, vm: u32) -> Result<Self, Failure> {
        let mut toucher = Toucher {
            client,
            vm,
            sequence: 0,
        };
        let deadline = Deadline::after_seconds(60);
        while toucher.word(word::READY)? != READY {
            if deadline.passed() {
                return Err(Failure::ControlTimeout {
                    step: "the toucher is ready",
                    last: 0,
                });
            }
        }
        toucher.sequence = toucher.word(word::SEQUENCE)?;
        Ok(toucher)
    }

    /// The sequence number of the last command sent: the round of the tags a
    /// `write_all` stored.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Reads one word of the toucher's mailbox.
    pub fn word(&self, word: usize) -> Result<u64, Failure> {
        ok(
            "MEMORY_READ of the toucher's mailbox",
            self.client.read_memory(MemoryTransfer {
                vm: self.vm,
                ipa: mailbox_ipa(word),
                buffer: scratch_ipa(),
                len: 8,
            }),
        )?;
        Ok(scratch(0))
    }

    fn write_words(&self, first: usize, words: &[u64]) -> Result<(), Failure> {
        for (i, w) in words.iter().enumerate() {
            // SAFETY: in bounds; only this vCPU uses the scratch page.
            unsafe { core::ptr::write_volatile(&raw mut SCRATCH.0[i], *w) };
        }
        ok(
            "MEMORY_WRITE of the toucher's mailbox",
            self.client.write_memory(MemoryTransfer {
                vm: self.vm,
                ipa: mailbox_ipa(first),
                buffer: scratch_ipa(),
                len: words.len() as u64 * 8,
            }),
        )?;
        Ok(())
    }

    /// Sends a command; returns its sequence number.
    fn send(&mut self, op: Op, base: u64, pages: u64) -> Result<u64, Failure> {
        self.write_words(word::OP, &[op as u64, base, pages])?;
        self.sequence += 1;
        self.write_words(word::SEQUENCE, &[self.sequence])?;
        Ok(self.sequence)
    }

    /// Waits until command `sequence` is done (or its loop started).
    fn wait_done(&self, sequence: u64) -> Result<(), Failure> {
        let deadline = Deadline::after_seconds(120);
        loop {
            let done = self.word(word::DONE)?;
            if done == sequence {
                return Ok(());
            }
            if deadline.passed() {
                return Err(Failure::ControlTimeout {
                    step: "the toucher finishes its command",
                    last: done,
                });
            }
        }
    }

    /// Has the toucher store into every page of the range once; returns the
    /// microseconds it took, as the toucher measured them.
    pub fn write_all(&mut self, base: u64, pages: u64) -> Result<u64, Failure> {
        let sequence = self.send(Op::Write, base, pages)?;
        self.wait_done(sequence)?;
        self.word(word::ELAPSED_US)
    }

    /// Has the toucher store into the range round after round until the
    /// next command.
    pub fn start_loop(&mut self, base: u64, pages: u64) -> Result<(), Failure> {
        let sequence = self.send(Op::Loop, base, pages)?;
        self.wait_done(sequence)
    }

    /// Rounds the current loop finished.
    pub fn rounds(&self) -> Result<u64, Failure> {
        self.word(word::ROUNDS)
    }

    /// Stores that aborted so far.
    pub fn aborts(&self) -> Result<u64, Failure> {
        self.word(word::ABORTS)
    }

    /// Waits until the current loop has finished `rounds` more rounds than
    /// it had; returns the round count then.
    pub fn wait_rounds(&self, rounds: u64) -> Result<u64, Failure> {
        let start = self.rounds()?;
        let deadline = Deadline::after_seconds(60);
        loop {
            let now = self.rounds()?;
            if now >= start + rounds {
                return Ok(now);
            }
            if deadline.passed() {
                return Err(Failure::ControlTimeout {
                    step: "the toucher's loop makes progress",
                    last: now,
                });
            }
        }
    }

    /// Reads the first word of each of `pages` pages from `base` in the
    /// toucher's memory (at most 512 pages), into [`scratch`].
    pub fn read_tags(&self, base: u64, pages: u64) -> Result<(), Failure> {
        for page in 0..pages.min(512) {
            ok(
                "MEMORY_READ of a touched page",
                self.client.read_memory(MemoryTransfer {
                    vm: self.vm,
                    ipa: base + page * PAGE,
                    buffer: scratch_ipa() + page * 8,
                    len: 8,
                }),
            )?;
        }
        Ok(())
    }
}
