//! EL1 exception vectors and the probes that provoke aborts on purpose.
//!
//! Every vector entry saves `x0..x30`, `ELR_EL1` and `SPSR_EL1` in a frame on
//! the current stack and calls [`handle_exception`] with the entry's number.
//! The fuzz scenario's hook ([`crate::fuzz::handle`]) sees every exception
//! but an IRQ it takes through the GIC driver first, and takes those of the
//! code it runs and the group-0 interrupts (FIQ) it arms.
//! A probe arms its CPU's slot, performs one load or store (a single
//! instruction in inline assembly) and disarms it. A synchronous data abort
//! (EC 0x25) taken while armed is recorded (ESR, FAR) and the faulting
//! instruction is skipped by advancing `ELR_EL1` by 4, as the hypervisor's
//! injected abort enters exactly like a real one at `VBAR_EL1 + 0x200`.
//! Once a scenario asked for it ([`record_tco`], only on a CPU with
//! FEAT_MTE), the handler also records `PSTATE.TCO` as the exception entry
//! left it (every entry sets it when MTE is implemented, an injected one
//! too).
//! Synchronous exceptions from EL0 (lower EL, AArch64 or AArch32) while an
//! EL0 program runs go to `el0`, which records them. An IRQ at EL1 goes to
//! the scenario that said it takes interrupts ([`take_irqs_for`]: `timers`,
//! `vgic-scarce` or `fuzz`) through the one GIC driver (`gic::take_interrupts`),
//! which acknowledges, hands over and finishes every pending interrupt;
//! before any scenario does, an IRQ is unexpected. Any other exception is a
//! failure: it is printed as the `RESULT` and the guest powers off.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::boot::MAX_CPUS;
use crate::bootargs::Scenario;
use crate::{console, el0, gic, psci, scenarios, smp, timers};

/// ESR exception class of a data abort taken without a change in EL.
pub const EC_DATA_ABORT_SAME_EL: u64 = 0x25;
/// Data fault status code of a synchronous external abort.
pub const DFSC_EXTERNAL_ABORT: u64 = 0x10;

/// Vector entry number of "current EL with SPx, synchronous".
const VECTOR_SYNC_CURRENT_SPX: u64 = 4;
/// Vector entry number of "current EL with SPx, IRQ".
const VECTOR_IRQ_CURRENT_SPX: u64 = 5;

const VECTOR_NAMES: [&str; 16] = [
    "sync, current EL, SP0",
    "IRQ, current EL, SP0",
    "FIQ, current EL, SP0",
    "SError, current EL, SP0",
    "sync, current EL, SPx",
    "IRQ, current EL, SPx",
    "FIQ, current EL, SPx",
    "SError, current EL, SPx",
    "sync, lower EL AArch64",
    "IRQ, lower EL AArch64",
    "FIQ, lower EL AArch64",
    "SError, lower EL AArch64",
    "sync, lower EL AArch32",
    "IRQ, lower EL AArch32",
    "FIQ, lower EL AArch32",
    "SError, lower EL AArch32",
];

/// Registers saved by the vector entry, in the order the assembly stores them.
#[repr(C)]
pub struct ExceptionFrame {
    /// `x0..x30` (for an AArch32 EL0, `r0..r14` in `x0..x14`).
    pub x: [u64; 31],
    /// `ELR_EL1`: where the `ERET` at the end of the entry returns.
    pub elr: u64,
    /// `SPSR_EL1`: the PSTATE the `ERET` restores.
    pub spsr: u64,
    _pad: u64,
}

global_asm!(
    r#"
    .macro vector_entry number
    .balign 0x80
    sub     sp, sp, #{frame_size}
    stp     x0, x1, [sp, #0]
    mov     x0, #\number
    b       exception_common
    .endm

    .section .text.vectors, "ax"
    .balign 0x800
    .global guest_vectors
guest_vectors:
    vector_entry 0
    vector_entry 1
    vector_entry 2
    vector_entry 3
    vector_entry 4
    vector_entry 5
    vector_entry 6
    vector_entry 7
    vector_entry 8
    vector_entry 9
    vector_entry 10
    vector_entry 11
    vector_entry 12
    vector_entry 13
    vector_entry 14
    vector_entry 15

exception_common:
    stp     x2, x3, [sp, #16]
    stp     x4, x5, [sp, #32]
    stp     x6, x7, [sp, #48]
    stp     x8, x9, [sp, #64]
    stp     x10, x11, [sp, #80]
    stp     x12, x13, [sp, #96]
    stp     x14, x15, [sp, #112]
    stp     x16, x17, [sp, #128]
    stp     x18, x19, [sp, #144]
    stp     x20, x21, [sp, #160]
    stp     x22, x23, [sp, #176]
    stp     x24, x25, [sp, #192]
    stp     x26, x27, [sp, #208]
    stp     x28, x29, [sp, #224]
    mrs     x1, elr_el1
    stp     x30, x1, [sp, #240]
    mrs     x1, spsr_el1
    str     x1, [sp, #256]
    mov     x1, sp
    bl      {handler}
    ldp     x30, x1, [sp, #240]
    msr     elr_el1, x1
    ldr     x1, [sp, #256]
    msr     spsr_el1, x1
    ldp     x2, x3, [sp, #16]
    ldp     x4, x5, [sp, #32]
    ldp     x6, x7, [sp, #48]
    ldp     x8, x9, [sp, #64]
    ldp     x10, x11, [sp, #80]
    ldp     x12, x13, [sp, #96]
    ldp     x14, x15, [sp, #112]
    ldp     x16, x17, [sp, #128]
    ldp     x18, x19, [sp, #144]
    ldp     x20, x21, [sp, #160]
    ldp     x22, x23, [sp, #176]
    ldp     x24, x25, [sp, #192]
    ldp     x26, x27, [sp, #208]
    ldp     x28, x29, [sp, #224]
    ldp     x0, x1, [sp, #0]
    add     sp, sp, #{frame_size}
    eret
"#,
    frame_size = const core::mem::size_of::<ExceptionFrame>(),
    handler = sym handle_exception,
);

unsafe extern "C" {
    static guest_vectors: u8;
}

/// Per-CPU probe slots: armed flag, and the ESR/FAR of the abort taken.
static ARMED: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
static TAKEN: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
static ESR: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static FAR: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// `PSTATE.TCO` in the handler of the abort taken (when [`RECORD_TCO`]).
static TCO: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
/// Whether the handler reads `PSTATE.TCO` (a register only FEAT_MTE has).
static RECORD_TCO: AtomicBool = AtomicBool::new(false);

/// From now on, a caught abort also records `PSTATE.TCO` at the handler's
/// entry ([`Abort::tco`]). Only on a CPU with FEAT_MTE.
pub fn record_tco() {
    RECORD_TCO.store(true, Ordering::Release);
}

/// Points `VBAR_EL1` at the vectors.
pub fn install() {
    let vectors = &raw const guest_vectors as u64;
    // SAFETY: `guest_vectors` is the 2 KiB aligned table above; its entries
    // save and restore all state they touch.
    unsafe { asm!("msr vbar_el1, {}", "isb", in(reg) vectors, options(nostack)) };
}

/// The abort a probe caught.
#[derive(Clone, Copy, Debug)]
pub struct Abort {
    /// `ESR_EL1` at the abort.
    pub esr: u64,
    /// `FAR_EL1` at the abort.
    pub far: u64,
    /// `PSTATE.TCO` in the handler (`None` unless [`record_tco`] was called).
    pub tco: Option<bool>,
}

impl Abort {
    /// Exception class (`ESR_EL1[31:26]`).
    pub fn class(&self) -> u64 {
        (self.esr >> 26) & 0x3f
    }

    /// Fault status code (`ESR_EL1[5:0]`).
    pub fn status(&self) -> u64 {
        self.esr & 0x3f
    }

    /// Whether the access was a write (`ESR_EL1.WnR`).
    pub fn is_write(&self) -> bool {
        self.esr & (1 << 6) != 0
    }
}

/// Kind of access a probe performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A 64-bit load.
    Read,
    /// A 64-bit store.
    Write,
}

/// Arms this CPU's probe slot for one access.
fn arm() -> usize {
    let cpu = smp::current_cpu();
    TAKEN[cpu].store(false, Ordering::Relaxed);
    ARMED[cpu].store(true, Ordering::Relaxed);
    cpu
}

/// Disarms `cpu`'s probe slot and returns the abort taken while armed.
fn disarm(cpu: usize) -> Option<Abort> {
    ARMED[cpu].store(false, Ordering::Relaxed);
    TAKEN[cpu].load(Ordering::Relaxed).then(|| Abort {
        esr: ESR[cpu].load(Ordering::Relaxed),
        far: FAR[cpu].load(Ordering::Relaxed),
        tco: RECORD_TCO
            .load(Ordering::Acquire)
            .then(|| TCO[cpu].load(Ordering::Relaxed)),
    })
}

/// Accesses `address` once and returns the data abort it raised, if any.
pub fn probe(address: u64, access: Access) -> Option<Abort> {
    let cpu = arm();
    match access {
        // SAFETY: the access is expected to abort (outside RAM and every
        // device); when it does not, it reads a device register or unbacked
        // address and the value is discarded.
        Access::Read => unsafe {
            asm!("ldr {tmp}, [{address}]", address = in(reg) address, tmp = out(reg) _,
                 options(nostack));
        },
        // SAFETY: as above; the store is expected to abort, and the address is
        // neither RAM nor a device the guest uses.
        Access::Write => unsafe {
            asm!("str xzr, [{address}]", address = in(reg) address, options(nostack));
        },
    }
    disarm(cpu)
}

/// Stores `value` (64 bits) at `address` once and returns the data abort it
/// raised, if any.
pub fn probe_store(address: u64, value: u64) -> Option<Abort> {
    let cpu = arm();
    // SAFETY: the caller names an address outside the guest's own RAM (a
    // window where the hypervisor may or may not back memory); the store
    // either lands there or aborts, and the abort is caught.
    unsafe {
        asm!("str {value}, [{address}]", address = in(reg) address, value = in(reg) value,
             options(nostack));
    }
    disarm(cpu)
}

/// Loads 32 bits from `address` once: the value, or the data abort raised.
pub fn load_u32(address: u64) -> Result<u32, Abort> {
    let cpu = arm();
    let value: u32;
    // SAFETY: a single load from a device register or an address expected to
    // abort; reading a PL011 ID register has no side effect.
    unsafe {
        asm!("ldr {value:w}, [{address}]", address = in(reg) address, value = out(reg) value,
             options(nostack));
    }
    disarm(cpu).map_or(Ok(value), Err)
}

/// Loads `1 << size_log2` bytes (1, 2, 4 or 8) from `address` once, zero
/// extended: the value, or the data abort raised.
pub fn load_sized(address: u64, size_log2: u32) -> Result<u64, Abort> {
    let cpu = arm();
    let value: u64;
    // SAFETY: a single load from a device window (the caller's hostile
    // access, which the hypervisor answers or refuses with an abort that is
    // caught); the value is only returned.
    unsafe {
        match size_log2 {
            0 => asm!("ldrb {v:w}, [{a}]", a = in(reg) address, v = out(reg) value,
                      options(nostack)),
            1 => asm!("ldrh {v:w}, [{a}]", a = in(reg) address, v = out(reg) value,
                      options(nostack)),
            2 => asm!("ldr {v:w}, [{a}]", a = in(reg) address, v = out(reg) value,
                      options(nostack)),
            _ => asm!("ldr {v}, [{a}]", a = in(reg) address, v = out(reg) value,
                      options(nostack)),
        }
    }
    disarm(cpu).map_or(Ok(value), Err)
}

/// Stores the low `1 << size_log2` bytes (1, 2, 4 or 8) of `value` at
/// `address` once; the data abort raised, if any.
pub fn store_sized(address: u64, size_log2: u32, value: u64) -> Option<Abort> {
    let cpu = arm();
    // SAFETY: a single store into a device window (never the guest's own
    // RAM: the caller's hostile access), answered by the hypervisor or
    // refused with an abort that is caught.
    unsafe {
        match size_log2 {
            0 => asm!("strb {v:w}, [{a}]", a = in(reg) address, v = in(reg) value,
                      options(nostack)),
            1 => asm!("strh {v:w}, [{a}]", a = in(reg) address, v = in(reg) value,
                      options(nostack)),
            2 => asm!("str {v:w}, [{a}]", a = in(reg) address, v = in(reg) value,
                      options(nostack)),
            _ => asm!("str {v}, [{a}]", a = in(reg) address, v = in(reg) value,
                      options(nostack)),
        }
    }
    disarm(cpu)
}

/// Index in [`Scenario::ALL`] of the scenario whose handler IRQs go to;
/// [`NO_IRQ_SCENARIO`] until one says it takes them.
static IRQ_SCENARIO: AtomicUsize = AtomicUsize::new(NO_IRQ_SCENARIO);
const NO_IRQ_SCENARIO: usize = usize::MAX;

/// From now on, IRQs go to `scenario`'s handler (before it unmasks them).
pub fn take_irqs_for(scenario: Scenario) {
    let index = Scenario::ALL
        .iter()
        .position(|&s| s == scenario)
        .unwrap_or(NO_IRQ_SCENARIO);
    IRQ_SCENARIO.store(index, Ordering::Release);
}

/// An IRQ at EL1: the GIC driver takes every pending interrupt and hands
/// each to the scenario that takes them. `false` when none does (the IRQ is
/// then an unexpected exception).
fn handle_irq() -> bool {
    let scenario = Scenario::ALL.get(IRQ_SCENARIO.load(Ordering::Acquire));
    let handler: fn(u32) = match scenario {
        Some(Scenario::Timers) => timers::interrupt,
        Some(Scenario::VgicScarce) => scenarios::vgic_scarce_interrupt,
        Some(Scenario::Fuzz) => crate::fuzz::interrupt,
        Some(Scenario::Migrate) => crate::migrate::interrupt,
        _ => return false,
    };
    gic::take_interrupts(handler);
    true
}

/// Called by the vector entry with the entry number and the saved frame.
extern "C" fn handle_exception(vector: u64, frame: &mut ExceptionFrame) {
    if vector == VECTOR_IRQ_CURRENT_SPX && handle_irq() {
        return;
    }
    let (esr, far): (u64, u64);
    // SAFETY: reading the syndrome registers has no side effects.
    unsafe {
        asm!("mrs {}, esr_el1", "mrs {}, far_el1", out(reg) esr, out(reg) far,
             options(nomem, nostack));
    }
    if crate::fuzz::handle(vector, esr, far, frame) {
        return;
    }
    let cpu = smp::current_cpu();
    let class = (esr >> 26) & 0x3f;
    if vector == VECTOR_SYNC_CURRENT_SPX
        && class == EC_DATA_ABORT_SAME_EL
        && ARMED[cpu].swap(false, Ordering::Relaxed)
    {
        ESR[cpu].store(esr, Ordering::Relaxed);
        FAR[cpu].store(far, Ordering::Relaxed);
        if RECORD_TCO.load(Ordering::Acquire) {
            let tco: u64;
            // SAFETY: reads PSTATE.TCO (`S3_3_C4_C2_7`, FEAT_MTE, which
            // `record_tco`'s caller checked); nothing since the exception
            // entry wrote it.
            unsafe { asm!("mrs {}, s3_3_c4_c2_7", out(reg) tco, options(nomem, nostack)) };
            TCO[cpu].store(tco & (1 << 25) != 0, Ordering::Relaxed);
        }
        TAKEN[cpu].store(true, Ordering::Relaxed);
        frame.elr += 4;
        return;
    }
    if (vector == el0::VECTOR_SYNC_LOWER_AARCH64 || vector == el0::VECTOR_SYNC_LOWER_AARCH32)
        && el0::on_lower_el_exception(vector, esr, far, frame)
    {
        return;
    }
    console::emergency_line(format_args!(
        "RESULT: FAIL unexpected exception on vcpu{cpu}: {} ESR {esr:#x} FAR {far:#x} ELR {:#x} \
         SPSR {:#x}",
        VECTOR_NAMES[(vector & 15) as usize],
        frame.elr,
        frame.spsr,
    ));
    psci::test_report(scenarios::UNEXPECTED_EXCEPTION_CODE);
    psci::system_off();
}
