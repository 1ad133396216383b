//! The VM layer: boot payload, the VM, and what each CPU does after boot.
//!
//! The boot CPU reads the payload (a cpio archive the boot loader passed as an
//! initrd), creates the VM it describes and runs vCPU 0. Every other CPU waits
//! for its vCPU to be started by the guest's PSCI `CPU_ON`.

use super::boot::boot_info;
use super::firmware;

/// After boot, on the boot CPU.
pub fn run_boot_cpu() -> ! {
    let info = boot_info();
    let Some(payload) = info.payload else {
        log::info!("no guest payload found (pass a cpio archive with -initrd); nothing to run");
        log::info!("system off");
        firmware::system_off();
    };
    log::info!("payload at {:#x}..{:#x}", payload.start, payload.end);
    firmware::system_off()
}

/// After boot, on a secondary CPU.
pub fn run_secondary_cpu(_index: usize) -> ! {
    firmware::halt()
}
