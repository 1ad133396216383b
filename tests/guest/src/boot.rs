//! Entry points: the arm64 `Image` header, the boot CPU's entry, the entry of
//! secondaries started with PSCI `CPU_ON`, and the Rust main of each.
//!
//! The header makes the ELF-to-Image conversion a plain copy: `code0` branches
//! over it, `text_offset` says where in a 2 MiB aligned RAM window the image
//! wants to sit (0x80000, matching the link address 0x4008_0000 of `link.ld`),
//! `image_size` covers `.bss`. The boot CPU checks it runs at EL1 and at its
//! link address (the guest is not position independent), clears `.bss` and
//! takes stack 0; a secondary receives its CPU index as PSCI context id and
//! takes the stack of that index. Both then continue in Rust: turn on the MMU,
//! install the vectors, and run their part of the scenario.

use core::arch::global_asm;

use crate::bootargs::Options;
use crate::platform::Platform;
use crate::scenarios::Failure;
use crate::{console, exceptions, mmu, psci, scenarios, smp};

/// Most vCPUs the guest drives (stacks and per-CPU slots are sized by it).
pub const MAX_CPUS: usize = 32;
/// Bytes of stack per vCPU.
pub const STACK_SIZE: usize = 16 * 1024;

/// Where the guest expects to run: RAM base of the guest memory map plus the
/// header's `text_offset`.
pub const TEXT_OFFSET: u64 = 0x8_0000;

#[repr(C, align(16))]
struct Stacks([[u8; STACK_SIZE]; MAX_CPUS]);

/// One stack per vCPU, taken by index in the entry code (never referenced
/// from Rust).
#[unsafe(no_mangle)]
static mut GUEST_STACKS: Stacks = Stacks([[0; STACK_SIZE]; MAX_CPUS]);

/// Failure code reported through `TEST_REPORT` when the guest finds itself at
/// the wrong exception level or address, before it has a console.
const EARLY_FAILURE_CODE: u64 = 0xbad0_0001;

global_asm!(
    r#"
    .section .text.head, "ax"
    .global _start
_start:
    b       1f                      // code0: branch over the header
    .long   0                       // code1
    .quad   {text_offset}           // text_offset
    .quad   __image_size            // image_size, .bss included
    .quad   0x2                     // flags: little endian, 4 KiB pages
    .quad   0, 0, 0                 // res2..res4
    .long   0x644d5241              // magic "ARM\x64"
    .long   0                       // no PE header
1:
    mov     x19, x0                 // device tree address
    mrs     x1, CurrentEL
    lsr     x1, x1, #2
    cmp     x1, #1
    b.ne    early_failure
    adr     x1, _start
    ldr     x2, =_start
    cmp     x1, x2
    b.ne    early_failure
    ldr     x1, =__bss_start
    ldr     x2, =__bss_end
2:  cmp     x1, x2
    b.hs    3f
    stp     xzr, xzr, [x1], #16
    b       2b
3:  ldr     x1, ={stacks}
    add     x1, x1, #{stack_size}
    mov     sp, x1
    msr     tpidr_el1, xzr          // CPU index 0
    mov     x0, x19
    bl      {primary_main}
    b       park

    .global secondary_entry
secondary_entry:
    // x0: CPU index, passed as PSCI context id
    cmp     x0, #{max_cpus}
    b.hs    park
    mov     x19, x0
    ldr     x1, ={stacks}
    add     x2, x0, #1
    mov     x3, #{stack_size}
    madd    x1, x2, x3, x1
    mov     sp, x1
    msr     tpidr_el1, x19
    mov     x0, x19
    bl      {secondary_main}
    b       park

early_failure:
    ldr     x0, =0xc6000001         // TEST_REPORT
    ldr     x1, ={early_code}
    hvc     #0
    ldr     x0, =0x84000008         // PSCI SYSTEM_OFF
    hvc     #0
park:
    wfe
    b       park
    .ltorg
"#,
    text_offset = const TEXT_OFFSET,
    stack_size = const STACK_SIZE,
    max_cpus = const MAX_CPUS,
    early_code = const EARLY_FAILURE_CODE,
    stacks = sym GUEST_STACKS,
    primary_main = sym primary_main,
    secondary_main = sym secondary_main,
);

unsafe extern "C" {
    /// Entry of secondaries, defined in the assembly above.
    fn secondary_entry();
}

/// Address handed to PSCI `CPU_ON` (identity mapped, so also the IPA).
pub fn secondary_entry_address() -> u64 {
    secondary_entry as *const () as u64
}

/// First and last+1 address of the loaded image, `.bss` included.
pub fn image_range() -> (u64, u64) {
    unsafe extern "C" {
        static __image_start: u8;
        static __image_end: u8;
    }
    // Only the addresses of the linker symbols are taken, never their contents.
    (
        &raw const __image_start as u64,
        &raw const __image_end as u64,
    )
}

/// The boot vCPU: MMU, vectors, device tree, console, then the scenario.
extern "C" fn primary_main(dtb: u64) -> ! {
    mmu::enable_boot_map(image_range().0);
    exceptions::install();
    mmu::map_device_tree(dtb);
    let platform = match Platform::from_dtb(dtb) {
        Ok(platform) => platform,
        Err(error) => {
            // Without a console all that can be said is the failure code.
            psci::test_report(error.code());
            psci::system_off();
        }
    };
    console::init(platform.uart_base);
    mmu::map_everything(&platform);
    let options = match Options::parse(platform.bootargs) {
        Ok(options) => options,
        Err(name) => {
            psci::set_hypervisor_services(!Options::psci_only(platform.bootargs));
            smp::finish(Err(Failure::UnknownScenario(name)))
        }
    };
    psci::set_hypervisor_services(options.hypervisor_services);
    let outcome = scenarios::run(&platform, options);
    smp::finish(outcome)
}

/// A secondary vCPU: MMU (with the table the boot vCPU built), vectors, then
/// its share of the scenario, then `CPU_OFF`.
extern "C" fn secondary_main(cpu: u64) -> ! {
    mmu::enable_current_map();
    exceptions::install();
    smp::secondary_work(cpu as usize);
    psci::cpu_off()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    match info.location() {
        Some(at) => console::emergency_line(format_args!(
            "RESULT: FAIL panic at {}:{}: {}",
            at.file(),
            at.line(),
            info.message()
        )),
        None => console::emergency_line(format_args!("RESULT: FAIL panic: {}", info.message())),
    }
    psci::test_report(scenarios::PANIC_CODE);
    psci::system_off()
}
