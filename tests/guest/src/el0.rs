//! Running small programs at EL0, in AArch64 and in AArch32, and recording
//! the exceptions they take to EL1.
//!
//! The programs live in the image (section `.text.el0`): an AArch64 one in
//! A64 mnemonics, an AArch32 one as raw A32/T32 instruction words (the
//! assembler only speaks A64). EL0 reaches them through an alias of the
//! image's gigabyte that EL0 may read and execute ([`crate::mmu::map_el0_block`]),
//! and touches a "hole": a gigabyte that is neither RAM nor a device in the
//! guest's memory map, mapped at stage 1 for EL0 (read, write, execute), so
//! that every access to it goes through stage 1 and faults at stage 2, where
//! the hypervisor must inject a synchronous external abort.
//!
//! [`run`] saves the callee-saved registers on the EL1 stack, `ERET`s to the
//! program with the requested `SPSR_EL1`, and returns once the program ends
//! with `SVC #0`. Each exception from EL0 arrives at a lower-EL vector
//! (`VBAR_EL1` + 0x400 AArch64, + 0x600 AArch32); the vector code saves the
//! frame and [`on_lower_el_exception`] records vector, `ESR_EL1`, `FAR_EL1`,
//! `ELR_EL1`, `SPSR_EL1` and the `DAIF` it runs with, then resumes EL0: after
//! the instruction (by `ESR_EL1.IL`: 2 or 4 bytes) for an abort or an
//! undefined instruction, at the link register for an instruction abort (the
//! program branched to the hole with a link; AArch64 `BTYPE` cleared, as a
//! return leaves it), and at `el0_return` in EL1h for
//! the final `SVC` (or anything unexpected), which pops the saved registers
//! and returns from [`run`].

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::exceptions::ExceptionFrame;

/// Most exceptions one program run records.
pub const MAX_EVENTS: usize = 8;

/// Vector entry number (0..16) of "lower EL using AArch64, synchronous".
pub const VECTOR_SYNC_LOWER_AARCH64: u64 = 8;
/// Vector entry number of "lower EL using AArch32, synchronous".
pub const VECTOR_SYNC_LOWER_AARCH32: u64 = 12;

/// ESR exception classes the programs provoke.
pub mod ec {
    /// Unknown reason: an undefined instruction.
    pub const UNKNOWN: u64 = 0x00;
    /// `SVC` from AArch32.
    pub const SVC32: u64 = 0x11;
    /// `SVC` from AArch64.
    pub const SVC64: u64 = 0x15;
    /// Instruction abort from a lower exception level.
    pub const IABT_LOWER: u64 = 0x20;
    /// Data abort from a lower exception level.
    pub const DABT_LOWER: u64 = 0x24;
}

/// `ESR_ELx.IL`: the instruction was 32 bits long.
pub const ESR_IL: u64 = 1 << 25;

/// `SPSR` of AArch32 User mode (`M[4:0]` = 0b10000) with A, I, F masked: what
/// the bug report shows an AArch32 process running with.
pub const SPSR_AARCH32_USR_MASKED: u64 = 0x1d0;
/// `SPSR` of AArch64 EL0t with D, A, I, F masked.
pub const SPSR_EL0T_MASKED: u64 = 0x3c0;
/// `SPSR.BTYPE` \[11:10\] = 0b10: what `BLR` leaves for its target with
/// FEAT_BTI.
pub const SPSR_BTYPE_BLR: u64 = 0b10 << 10;
/// `SPSR.BTYPE` \[11:10\] of AArch64.
pub const SPSR_BTYPE_MASK: u64 = 0b11 << 10;
/// `CPSR.T`: T32 state.
pub const SPSR_T32: u64 = 1 << 5;
/// PSTATE.{D, A, I, F} as `DAIF` reads them.
pub const DAIF_ALL: u64 = 0xf << 6;

global_asm!(
    r#"
    .section .text.el0, "ax"
    .balign 4096
    .global el0_a64_program
el0_a64_program:            // x1 = address in the hole, x2 = the hole's base
    ldr     x0, [x1]        // stage-2 fault: injected data abort, skipped
    udf     #0              // undefined at EL1 directly, skipped
    blr     x2              // instruction abort in the hole: resumes at x30
    svc     #0              // done

    .balign 64
    .global el0_a32_program
el0_a32_program:            // r1 = address in the hole, r2 = the hole's base,
                            // r3 = el0_t32_routine | 1
    .word   0xe5910000      // ldr  r0, [r1]: injected data abort, skipped
    .word   0xe7f000f0      // udf  #0: undefined, skipped
    .word   0xe12fff33      // blx  r3: to the T32 routine
    .word   0xe12fff32      // blx  r2: instruction abort, resumes at lr
    .word   0xef000000      // svc  #0: done

    .balign 64
    .global el0_t32_routine
el0_t32_routine:
    .hword  0x6808          // ldr  r0, [r1] (16-bit): data abort with IL = 0
    .hword  0x4770          // bx   lr

    .balign 4096
    .text
    .global el0_enter
el0_enter:                  // x0 = EL0 PC, x1 = SPSR, x2..x4 = EL0 x1..x3
    stp     x29, x30, [sp, #-96]!
    stp     x19, x20, [sp, #16]
    stp     x21, x22, [sp, #32]
    stp     x23, x24, [sp, #48]
    stp     x25, x26, [sp, #64]
    stp     x27, x28, [sp, #80]
    msr     elr_el1, x0
    msr     spsr_el1, x1
    msr     sp_el0, xzr
    mov     x1, x2
    mov     x2, x3
    mov     x3, x4
    mov     x0, xzr
    mov     x4, xzr
    mov     x14, xzr
    mov     x30, xzr
    eret

    .global el0_return
el0_return:
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #96
    ret
"#
);

unsafe extern "C" {
    static el0_a64_program: u8;
    static el0_a32_program: u8;
    static el0_t32_routine: u8;
    fn el0_enter(pc: u64, spsr: u64, x1: u64, x2: u64, x3: u64);
    fn el0_return();
}

/// Which program to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The AArch64 EL0 program.
    Aarch64,
    /// The AArch32 EL0 program (A32, calling a T32 routine).
    Aarch32,
}

/// Where the programs see their code and the hole.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Virtual address EL0 sees the image's gigabyte at.
    pub alias_base: u64,
    /// Physical (and EL1 virtual) base of the image's gigabyte.
    pub image_gigabyte: u64,
    /// The hole's base (virtual = IPA).
    pub hole: u64,
}

impl Layout {
    /// EL0's virtual address of an image address.
    pub fn el0_address(&self, address: u64) -> u64 {
        self.alias_base + (address - self.image_gigabyte)
    }

    /// EL0 addresses of the AArch64 program, the AArch32 program and the T32
    /// routine.
    pub fn programs(&self) -> (u64, u64, u64) {
        (
            self.el0_address(&raw const el0_a64_program as u64),
            self.el0_address(&raw const el0_a32_program as u64),
            self.el0_address(&raw const el0_t32_routine as u64),
        )
    }
}

/// One exception taken from EL0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Vector entry number (0..16).
    pub vector: u64,
    /// `ESR_EL1`.
    pub esr: u64,
    /// `FAR_EL1`.
    pub far: u64,
    /// `ELR_EL1`.
    pub elr: u64,
    /// `SPSR_EL1`.
    pub spsr: u64,
    /// `DAIF` the handler ran with.
    pub daif: u64,
}

impl Event {
    /// The exception class.
    pub fn class(&self) -> u64 {
        (self.esr >> 26) & 0x3f
    }
}

/// A run is in progress: lower-EL exceptions belong to it.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// `SPSR` that returns to EL1h at `el0_return` (DAIF as [`run`] found it).
static RETURN_SPSR: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static EVENTS: [[AtomicU64; 6]; MAX_EVENTS] =
    [const { [const { AtomicU64::new(0) }; 6] }; MAX_EVENTS];

/// Runs `program` at EL0 with `SPSR_EL1` = `spsr` and returns the exceptions
/// it took, in order. Only one vCPU may run EL0 programs.
pub fn run(layout: &Layout, program: Program, spsr: u64) -> ([Event; MAX_EVENTS], usize) {
    let (a64, a32, t32) = layout.programs();
    let pc = match program {
        Program::Aarch64 => a64,
        Program::Aarch32 => a32,
    };
    let daif: u64;
    // SAFETY: reading DAIF has no side effects.
    unsafe { asm!("mrs {}, daif", out(reg) daif, options(nomem, nostack)) };
    RETURN_SPSR.store((daif & DAIF_ALL) | 0b0101, Ordering::Relaxed);
    COUNT.store(0, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::SeqCst);
    // SAFETY: `el0_enter` saves the callee-saved registers on this stack and
    // erets to a program in the EL0 alias of the image; the program ends with
    // SVC (or any unexpected exception), whose handler resumes at
    // `el0_return` in EL1h on this same stack, which restores them and
    // returns here. The caller-saved registers are clobbered per the C ABI.
    unsafe { el0_enter(pc, spsr, layout.hole + 0x100, layout.hole, t32 | 1) };
    ACTIVE.store(false, Ordering::SeqCst);
    let count = COUNT.load(Ordering::Relaxed).min(MAX_EVENTS);
    let mut events = [Event::default(); MAX_EVENTS];
    for (event, slot) in events.iter_mut().zip(&EVENTS).take(count) {
        let [vector, esr, far, elr, spsr, daif] =
            slot.each_ref().map(|v| v.load(Ordering::Relaxed));
        *event = Event {
            vector,
            esr,
            far,
            elr,
            spsr,
            daif,
        };
    }
    (events, count)
}

/// Records an exception from EL0 during [`run`] and decides where EL0
/// resumes. Returns false when no run is active (the exception is not EL0's).
pub fn on_lower_el_exception(vector: u64, esr: u64, far: u64, frame: &mut ExceptionFrame) -> bool {
    if !ACTIVE.load(Ordering::SeqCst) {
        return false;
    }
    let daif: u64;
    // SAFETY: reading DAIF has no side effects.
    unsafe { asm!("mrs {}, daif", out(reg) daif, options(nomem, nostack)) };
    let index = COUNT.fetch_add(1, Ordering::Relaxed);
    if let Some(slot) = EVENTS.get(index) {
        for (cell, value) in slot
            .iter()
            .zip([vector, esr, far, frame.elr, frame.spsr, daif])
        {
            cell.store(value, Ordering::Relaxed);
        }
    }
    let class = (esr >> 26) & 0x3f;
    let length = if esr & ESR_IL != 0 { 4 } else { 2 };
    let aarch32 = vector == VECTOR_SYNC_LOWER_AARCH32;
    let full = index + 1 >= MAX_EVENTS;
    match class {
        ec::DABT_LOWER | ec::UNKNOWN if !full => frame.elr += length,
        ec::IABT_LOWER if !full && aarch32 => frame.elr = frame.x[14],
        ec::IABT_LOWER if !full => {
            // Return as if the branch had: no BTYPE left for the link target.
            frame.elr = frame.x[30];
            frame.spsr &= !SPSR_BTYPE_MASK;
        }
        _ => {
            // SVC, or anything the programs do not provoke: back to EL1.
            ACTIVE.store(false, Ordering::SeqCst);
            frame.elr = el0_return as *const () as u64;
            frame.spsr = RETURN_SPSR.load(Ordering::Relaxed);
        }
    }
    true
}
