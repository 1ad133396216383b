//! The boot sequence's machine side, on the boot CPU and on secondary CPUs.
//!
//! `primary_main` runs with the early identity map: it installs the boot
//! CPU's per-CPU data and vectors, starts the boot heap and parses the
//! device tree (none: it halts, with no console to say so), then runs the
//! portable sequence `runtime::boot_sequence` over `El2Boot` (console,
//! memory, features, banner, passed devices, host disks, the GIC, the
//! secondaries), publishes the boot information (`runtime::boot_info`) and
//! hands over to `arch::run`. `secondary_main` is where the other CPUs
//! arrive. `wrong_el_main` reports that the image was entered outside EL2.
//!
//! CPU features: every CPU reads its own ID registers as it comes up. The
//! boot CPU publishes what the system already relies on (`REQUIRED`)
//! before it starts any secondary; a secondary that does not cover it
//! records its features, raises `rejected` and parks without touching
//! memory again (so its per-CPU slot and stack are reused), and the boot
//! CPU reports it and gives it no vCPU.

mod boot_machine;
mod entry;
pub mod exceptions;
pub mod firmware;
pub mod memory;

use crate::arch::cpu::features::local_features;
use crate::arch::cpu::percpu;
use crate::arch::cpu::sysreg;
use crate::arch::run;
use crate::drivers::uart::console;
use crate::platform::Platform;
use crate::platform::cpu_features::CpuFeatures;
use crate::runtime::boot_info;
use crate::runtime::boot_sequence;
use boot_machine::El2Boot;
use core::sync::atomic::Ordering;
use spin::Once;

/// What a secondary CPU must have, published by the boot CPU before it starts
/// any.
static REQUIRED: Once<CpuFeatures> = Once::new();

/// Size of the device tree blob at `dtb`, from its header (big-endian `totalsize`).
///
/// # Safety
/// `dtb` must point at readable memory holding at least a device tree header.
unsafe fn dtb_total_size(dtb: usize) -> usize {
    // SAFETY: the caller guarantees the header is readable; `totalsize` is the
    // second 32-bit word and the header is 8-byte aligned by the boot protocol.
    let raw = unsafe { core::ptr::read_volatile((dtb + 4) as *const u32) };
    u32::from_be(raw) as usize
}

/// Entry of the boot CPU, with the MMU on (called from `entry`).
#[unsafe(no_mangle)]
extern "C" fn primary_main(dtb: usize, load_address: usize) -> ! {
    let boot_mpidr = sysreg::current_mpidr();
    percpu::install(0, boot_mpidr);
    exceptions::install_vectors();
    memory::init_boot_heap();
    // SAFETY: the boot protocol passes a device tree in x0 and the early map
    // covers it as normal memory.
    let dtb_size = unsafe { dtb_total_size(dtb) };
    // SAFETY: as above; the blob stays untouched (it is excluded from the
    // frame allocator by the boot sequence).
    let dtb_bytes = unsafe { core::slice::from_raw_parts(dtb as *const u8, dtb_size) };
    let Ok(platform) = Platform::from_dtb(dtb_bytes) else {
        // Without a device tree there is no console to report on.
        firmware::halt()
    };
    match boot_sequence::boot_primary(&El2Boot, dtb_bytes, platform, boot_mpidr, load_address) {
        Ok(info) => run::run_boot_cpu(boot_info::publish(info)),
        Err(boot_sequence::Halt) => firmware::halt(),
    }
}

/// Entry of a secondary CPU, with the MMU on and `TPIDR_EL2` set.
#[unsafe(no_mangle)]
extern "C" fn secondary_main() -> ! {
    exceptions::install_vectors();
    let cpu = percpu::current();
    let features = local_features();
    *cpu.features.lock() = Some(features);
    *cpu.vector_lengths.lock() = crate::arch::vcpu::measure_lengths(&features);
    if !boot_sequence::secondary_admitted(&features, REQUIRED.get()) {
        park_rejected(&cpu.rejected);
    }
    boot_sequence::init_secondary_gic(&El2Boot, cpu.index(), &features);
    cpu.online.store(true, Ordering::Release);
    run::run_secondary_cpu(cpu.index())
}

/// Parks a secondary CPU that the system cannot use: masks its interrupts,
/// raises `rejected` (release: its features are visible first) and waits for
/// events forever, using no stack or memory after the flag, since the boot CPU
/// then hands its slot and stack to the next CPU.
fn park_rejected(rejected: &core::sync::atomic::AtomicBool) -> ! {
    // SAFETY: the store-release writes 1 to the AtomicBool (a byte holding 0 or
    // 1); afterwards the CPU only executes WFE in a loop with interrupts
    // masked, touching no memory, so reusing its stack and slot is harmless.
    unsafe {
        core::arch::asm!(
            "msr daifset, #0xf",
            "stlrb {one:w}, [{flag}]",
            "2: wfe",
            "b 2b",
            flag = in(reg) rejected.as_ptr(),
            one = in(reg) 1u32,
            options(noreturn, nostack)
        )
    }
}

/// Entered instead of `primary_main` when the image does not run at EL2: says
/// so on the console and stops (powering off where the firmware allows).
#[unsafe(no_mangle)]
extern "C" fn wrong_el_main(dtb: usize, current_el: u64) -> ! {
    memory::init_boot_heap();
    // SAFETY: the boot protocol passes a device tree in x0.
    let size = unsafe { dtb_total_size(dtb) };
    // SAFETY: as above.
    let bytes = unsafe { core::slice::from_raw_parts(dtb as *const u8, size) };
    let Ok(platform) = Platform::from_dtb(bytes) else {
        firmware::halt()
    };
    // SAFETY: the device tree names this UART, of this kind, as the console;
    // the MMU is off, so its registers are accessed as device memory.
    unsafe { console::init(platform.uart.start as usize, platform.uart_kind) };
    log::error!(
        "entered at EL{current_el}, but the hypervisor must be started at EL2 \
         (QEMU: -machine virt,virtualization=on); stopping"
    );
    if current_el == 1 {
        firmware::set_conduit(platform.psci);
        firmware::system_off();
    }
    firmware::halt()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(l) => console::write_panic_line(format_args!(
            "[hv] PANIC: {} ({}:{})",
            info.message(),
            l.file(),
            l.line()
        )),
        None => console::write_panic_line(format_args!("[hv] PANIC: {}", info.message())),
    }
    firmware::system_off()
}
