//! The image header and the first instructions on every CPU.
//!
//! `_start` is a Linux arm64 `Image` header (so QEMU `-kernel` and U-Boot
//! `booti` load the hypervisor and pass the device tree in `x0`), followed by
//! the boot CPU's entry:
//! 1. apply the `R_AARCH64_RELATIVE` relocations for the load address (the
//!    image is linked at 0 as a position-independent executable);
//! 2. zero `.bss` and take CPU 0's stack;
//! 3. if not at EL2, call `wrong_el_main` (which reports and stops);
//! 4. build an early identity map with 1 GiB blocks (device memory, except
//!    the blocks holding the image and the device tree, which are normal
//!    write-back memory), load `MAIR_EL2`/`TCR_EL2`/`TTBR0_EL2`, turn the MMU
//!    and caches on and call `primary_main(dtb, load_address)`.
//!
//! Secondary CPUs enter at `secondary_entry` through PSCI `CPU_ON` with `x0` =
//! their `SecondaryBoot` block, load the final tables from it and call
//! `secondary_main`.

use crate::arch::cpu::percpu::{STACK_SIZE, SecondaryBoot};
use core::arch::global_asm;
use core::mem::offset_of;

/// Early block: valid, AttrIdx 1, AP[1] (RES1 at EL2), inner shareable, AF.
const EARLY_NORMAL_BLOCK: u64 = 0x1 | (1 << 2) | (1 << 6) | (3 << 8) | (1 << 10);
/// Early block: valid, AttrIdx 0, AP[1], AF, XN.
const EARLY_DEVICE_BLOCK: u64 = 0x1 | (1 << 6) | (1 << 10) | (1 << 54);

#[repr(C, align(4096))]
struct EarlyTable([u64; 512]);

#[unsafe(no_mangle)]
static mut HV_EARLY_L0: EarlyTable = EarlyTable([0; 512]);
#[unsafe(no_mangle)]
static mut HV_EARLY_L1: EarlyTable = EarlyTable([0; 512]);

global_asm!(
    r#"
.section .text.head, "ax"
.global _start
_start:
    b       1f                      // code0
    .long   0                       // code1
    .quad   0                       // text_offset
    .quad   __image_size            // image_size
    .quad   0xa                     // flags: little-endian, 4 KiB pages, anywhere
    .quad   0, 0, 0                 // reserved
    .ascii  "ARM\x64"               // magic
    .long   0                       // PE header offset: none
1:
    mov     x19, x0                 // device tree
    adr     x20, _start             // load address

    // 1. Relocate.
    adrp    x10, __rela_start
    add     x10, x10, :lo12:__rela_start
    adrp    x11, __rela_end
    add     x11, x11, :lo12:__rela_end
2:  cmp     x10, x11
    b.hs    4f
    ldp     x12, x13, [x10], #16    // r_offset, r_info
    ldr     x14, [x10], #8          // r_addend
    cmp     x13, #1027              // R_AARCH64_RELATIVE
    b.ne    3f
    add     x14, x14, x20
    str     x14, [x12, x20]
    b       2b
3:  wfe                             // unknown relocation type: cannot run
    b       3b

    // 2. Zero .bss, take CPU 0's stack.
4:  adrp    x10, __bss_start
    add     x10, x10, :lo12:__bss_start
    adrp    x11, __bss_end
    add     x11, x11, :lo12:__bss_end
5:  cmp     x10, x11
    b.hs    6f
    stp     xzr, xzr, [x10], #16
    b       5b
6:  adrp    x9, HV_STACKS
    add     x9, x9, :lo12:HV_STACKS
    mov     x10, #{stack_size}
    add     sp, x9, x10

    // 3. Only EL2 will do.
    mrs     x9, CurrentEL
    ubfx    x9, x9, #2, #2
    cmp     x9, #2
    b.eq    7f
    mov     x0, x19
    mov     x1, x9
    bl      wrong_el_main
    b       3b

    // 4. Early identity map: L0[0] -> L1, 512 x 1 GiB blocks.
7:  adrp    x0, HV_EARLY_L1
    add     x0, x0, :lo12:HV_EARLY_L1
    ldr     x2, ={device}
    mov     x1, #0
8:  orr     x3, x2, x1, lsl #30
    str     x3, [x0, x1, lsl #3]
    add     x1, x1, #1
    cmp     x1, #512
    b.lo    8b
    ldr     x2, ={normal}
    adrp    x4, __image_end
    add     x4, x4, :lo12:__image_end
    sub     x4, x4, #1
    add     x5, x19, #0x200000      // the device tree is at most 2 MiB
    mov     x6, x20
    bl      9f
    mov     x6, x4
    bl      9f
    mov     x6, x19
    bl      9f
    mov     x6, x5
    bl      9f
    adrp    x5, HV_EARLY_L0
    add     x5, x5, :lo12:HV_EARLY_L0
    orr     x6, x0, #3
    str     x6, [x5]

    ldr     x9, ={mair}
    msr     mair_el2, x9
    mrs     x9, id_aa64mmfr0_el1
    and     x9, x9, #0xf
    cmp     x9, #5
    mov     x10, #5
    csel    x9, x9, x10, ls         // PS = min(PARange, 48 bits)
    ldr     x10, ={tcr}
    orr     x10, x10, x9, lsl #16
    msr     tcr_el2, x10
    msr     ttbr0_el2, x5
    dsb     sy
    tlbi    alle2
    ic      iallu
    dsb     sy
    isb
    ldr     x9, ={sctlr}
    msr     sctlr_el2, x9
    isb
    mov     x0, x19
    mov     x1, x20
    bl      primary_main
    b       3b

    // Marks the 1 GiB block holding x6 as normal memory (x0 = L1, x2 = attributes).
9:  lsr     x7, x6, #30
    cmp     x7, #512
    b.hs    10f
    orr     x3, x2, x7, lsl #30
    str     x3, [x0, x7, lsl #3]
10: ret

.section .text
.global secondary_entry
.balign 8
secondary_entry:
    ldr     x1, [x0, #{boot_stack}]
    mov     sp, x1
    ldr     x1, [x0, #{boot_mair}]
    msr     mair_el2, x1
    ldr     x1, [x0, #{boot_tcr}]
    msr     tcr_el2, x1
    ldr     x1, [x0, #{boot_ttbr0}]
    msr     ttbr0_el2, x1
    dsb     sy
    tlbi    alle2
    ic      iallu
    dsb     sy
    isb
    ldr     x1, [x0, #{boot_sctlr}]
    msr     sctlr_el2, x1
    isb
    ldr     x0, [x0, #{boot_percpu}]
    msr     tpidr_el2, x0
    bl      secondary_main
11: wfe
    b       11b
"#,
    stack_size = const STACK_SIZE,
    device = const EARLY_DEVICE_BLOCK,
    normal = const EARLY_NORMAL_BLOCK,
    mair = const crate::sysreg_values::MAIR_EL2_VALUE,
    tcr = const crate::sysreg_values::TCR_EL2_BASE,
    sctlr = const crate::sysreg_values::SCTLR_EL2_VALUE,
    boot_stack = const offset_of!(SecondaryBoot, stack_top),
    boot_mair = const offset_of!(SecondaryBoot, mair),
    boot_tcr = const offset_of!(SecondaryBoot, tcr),
    boot_ttbr0 = const offset_of!(SecondaryBoot, ttbr0),
    boot_sctlr = const offset_of!(SecondaryBoot, sctlr),
    boot_percpu = const offset_of!(SecondaryBoot, percpu),
);

unsafe extern "C" {
    /// Entry point of secondary CPUs (physical address == virtual address).
    pub fn secondary_entry();
}
