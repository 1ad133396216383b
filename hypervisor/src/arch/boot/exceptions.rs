//! EL2 exception vectors, guest entry and exit.
//!
//! [`enter_guest`] saves the hypervisor's callee-saved registers and stack
//! pointer, loads the vCPU's general-purpose registers, `ELR_EL2` and
//! `SPSR_EL2` from its [`GuestRegs`] and `ERET`s. Any exception from the guest
//! (lower EL vectors) saves all 31 general-purpose registers, PC, PSTATE,
//! `ESR_EL2`, `FAR_EL2` and `HPFAR_EL2` into the same context, restores the
//! hypervisor's registers and returns from `enter_guest` with the
//! [`ExitKind`]: the run loop is ordinary Rust that handles the exit and calls
//! `enter_guest` again. Exceptions taken at EL2 itself are hypervisor bugs:
//! they panic with the syndrome.
//!
//! The guest's stack pointers (`SP_EL0`, `SP_EL1`) and other EL1 state are banked
//! and stay in the CPU while the vCPU is pinned to it.

use crate::arch::cpu::percpu::{OFFSET_GUEST_CONTEXT, OFFSET_HOST_SP, OFFSET_TRAP_SP};
use core::arch::global_asm;
use core::mem::offset_of;

pub use crate::runtime::vcpu::{ExitKind, GuestRegs};

global_asm!(
    r#"
.macro GUEST_EXIT code
    .balign 0x80
    stp     x0, x1, [sp, #-16]!
    mov     x0, #\code
    b       hv_guest_exit
.endm

.macro HYP_TRAP code
    .balign 0x80
    mov     x0, #\code
    b       hv_hyp_trap
.endm

.section .text.vectors, "ax"
.balign 0x800
.global hv_vectors
hv_vectors:
    // Current EL with SP_EL0 (never used by the hypervisor).
    HYP_TRAP 0
    HYP_TRAP 1
    HYP_TRAP 2
    HYP_TRAP 3
    // Current EL with SP_ELx: hypervisor faults.
    HYP_TRAP 4
    HYP_TRAP 5
    HYP_TRAP 6
    HYP_TRAP 7
    // Lower EL, AArch64: guest exits.
    GUEST_EXIT 0
    GUEST_EXIT 1
    GUEST_EXIT 2
    GUEST_EXIT 3
    // Lower EL, AArch32: the guest's EL1 is AArch64 (HCR_EL2.RW), but its
    // EL0 may run AArch32 code; its interrupts and aborts exit the same way.
    GUEST_EXIT 0
    GUEST_EXIT 1
    GUEST_EXIT 2
    GUEST_EXIT 3

// x0 = vector number. Reports on the CPU's trap stack (the fault may be a
// stack overflow into the guard page).
hv_hyp_trap:
    mov     x2, sp
    mrs     x1, tpidr_el2
    cbz     x1, 2f
    ldr     x1, [x1, #{percpu_trap_sp}]
    cbz     x1, 2f
    mov     sp, x1
2:  mov     x1, x2
    bl      hv_hyp_exception
1:  wfe
    b       1b

// x0 = exit code, guest x0/x1 pushed on the hypervisor stack.
hv_guest_exit:
    mrs     x1, tpidr_el2
    ldr     x1, [x1, #{percpu_ctx}]
    stp     x2, x3, [x1, #16]
    stp     x4, x5, [x1, #32]
    stp     x6, x7, [x1, #48]
    stp     x8, x9, [x1, #64]
    stp     x10, x11, [x1, #80]
    stp     x12, x13, [x1, #96]
    stp     x14, x15, [x1, #112]
    stp     x16, x17, [x1, #128]
    stp     x18, x19, [x1, #144]
    stp     x20, x21, [x1, #160]
    stp     x22, x23, [x1, #176]
    stp     x24, x25, [x1, #192]
    stp     x26, x27, [x1, #208]
    stp     x28, x29, [x1, #224]
    str     x30, [x1, #240]
    ldp     x2, x3, [sp], #16
    stp     x2, x3, [x1, #0]
    mrs     x2, elr_el2
    str     x2, [x1, #{ctx_pc}]
    mrs     x2, spsr_el2
    str     x2, [x1, #{ctx_pstate}]
    mrs     x2, esr_el2
    str     x2, [x1, #{ctx_esr}]
    mrs     x2, far_el2
    str     x2, [x1, #{ctx_far}]
    mrs     x2, hpfar_el2
    str     x2, [x1, #{ctx_hpfar}]
    mrs     x2, tpidr_el2
    ldr     x2, [x2, #{percpu_sp}]
    mov     sp, x2
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #96
    ret

.section .text
.global hv_enter_guest
// x0 = &mut GuestRegs; returns the exit code.
hv_enter_guest:
    stp     x29, x30, [sp, #-96]!
    stp     x19, x20, [sp, #16]
    stp     x21, x22, [sp, #32]
    stp     x23, x24, [sp, #48]
    stp     x25, x26, [sp, #64]
    stp     x27, x28, [sp, #80]
    mrs     x9, tpidr_el2
    mov     x10, sp
    str     x10, [x9, #{percpu_sp}]
    str     x0, [x9, #{percpu_ctx}]
    ldr     x10, [x0, #{ctx_pc}]
    msr     elr_el2, x10
    ldr     x10, [x0, #{ctx_pstate}]
    msr     spsr_el2, x10
    ldp     x2, x3, [x0, #16]
    ldp     x4, x5, [x0, #32]
    ldp     x6, x7, [x0, #48]
    ldp     x8, x9, [x0, #64]
    ldp     x10, x11, [x0, #80]
    ldp     x12, x13, [x0, #96]
    ldp     x14, x15, [x0, #112]
    ldp     x16, x17, [x0, #128]
    ldp     x18, x19, [x0, #144]
    ldp     x20, x21, [x0, #160]
    ldp     x22, x23, [x0, #176]
    ldp     x24, x25, [x0, #192]
    ldp     x26, x27, [x0, #208]
    ldp     x28, x29, [x0, #224]
    ldr     x30, [x0, #240]
    ldp     x0, x1, [x0, #0]
    eret
"#,
    percpu_ctx = const OFFSET_GUEST_CONTEXT,
    percpu_trap_sp = const OFFSET_TRAP_SP,
    percpu_sp = const OFFSET_HOST_SP,
    ctx_pc = const offset_of!(GuestRegs, pc),
    ctx_pstate = const offset_of!(GuestRegs, pstate),
    ctx_esr = const offset_of!(GuestRegs, esr),
    ctx_far = const offset_of!(GuestRegs, far),
    ctx_hpfar = const offset_of!(GuestRegs, hpfar),
);

const _: () = assert!(offset_of!(GuestRegs, pc) == 248);

unsafe extern "C" {
    static hv_vectors: u8;
    fn hv_enter_guest(regs: *mut GuestRegs) -> u64;
}

/// Points `VBAR_EL2` at the hypervisor's vectors on the running CPU.
pub fn install_vectors() {
    // SAFETY: `hv_vectors` is a 2 KiB aligned vector table in the image's text.
    unsafe {
        crate::write_sysreg!(vbar_el2, &raw const hv_vectors as u64);
    }
    crate::arch::cpu::sysreg::isb();
}

/// Runs the guest described by `regs` (and the EL1/EL2 state already loaded
/// on this CPU) until it exits.
///
/// # Safety
/// The CPU's stage-2 translation, `HCR_EL2` and the guest's EL1 system
/// registers must be set up for this vCPU, so the guest cannot reach
/// hypervisor memory; vectors must be installed.
pub unsafe fn enter_guest(regs: &mut GuestRegs) -> ExitKind {
    // SAFETY: the caller guarantees the guest is confined; the assembly saves
    // and restores every callee-saved register and the stack pointer.
    let code = unsafe { hv_enter_guest(regs) };
    ExitKind::from_code(code)
}

/// An exception taken at EL2: a hypervisor bug. Reports and panics.
#[unsafe(no_mangle)]
extern "C" fn hv_hyp_exception(code: u64, sp: u64) -> ! {
    let esr = crate::read_sysreg!(esr_el2);
    let elr = crate::read_sysreg!(elr_el2);
    let far = crate::read_sysreg!(far_el2);
    let kind = ["sync", "irq", "fiq", "serror"][(code & 3) as usize];
    panic!(
        "hypervisor exception ({kind}{}): ESR_EL2 {esr:#x} (EC {:#x}) ELR_EL2 {elr:#x} FAR_EL2 {far:#x} SP {sp:#x}",
        if code < 4 { ", SP_EL0" } else { "" },
        esr >> 26
    );
}
