//! Calls to the hypervisor over `HVC #0` (SMCCC: function id in `x0`,
//! arguments in `x1..x3`, results in `x0..x3`): PSCI, SMCCC `VERSION`, the
//! vendor `TEST_REPORT` call, and raw calls for the unknown-hypercall test.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, Ordering};

/// PSCI and SMCCC function ids used by the guest.
pub mod function {
    /// PSCI_VERSION.
    pub const PSCI_VERSION: u32 = 0x8400_0000;
    /// CPU_OFF.
    pub const CPU_OFF: u32 = 0x8400_0002;
    /// CPU_ON (64-bit).
    pub const CPU_ON: u32 = 0xc400_0003;
    /// AFFINITY_INFO (64-bit).
    pub const AFFINITY_INFO: u32 = 0xc400_0004;
    /// MIGRATE_INFO_TYPE.
    pub const MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
    /// SYSTEM_OFF.
    pub const SYSTEM_OFF: u32 = 0x8400_0008;
    /// `SYSTEM_RESET`.
    pub const SYSTEM_RESET: u32 = 0x8400_0009;
    /// PSCI_FEATURES.
    pub const PSCI_FEATURES: u32 = 0x8400_000a;
    /// SMCCC_VERSION.
    pub const SMCCC_VERSION: u32 = 0x8000_0000;
    /// The hypervisor's vendor call: x1 = 0 pass, else a failure code.
    pub const TEST_REPORT: u32 = 0xc600_0001;
    /// A vendor hypervisor call nobody implements.
    pub const UNKNOWN: u32 = 0xc600_00ff;
    /// First of the flood scenario's distinct unknown ids (vendor hypervisor
    /// service range, none implemented).
    pub const UNKNOWN_FLOOD_BASE: u32 = 0xc600_0100;
}

/// SMCCC `NOT_SUPPORTED`.
pub const NOT_SUPPORTED: i64 = -1;
/// AFFINITY_INFO answer for a CPU that is off.
pub const AFFINITY_OFF: i64 = 1;
/// PSCI `SUCCESS`.
pub const SUCCESS: i64 = 0;
/// PSCI `ALREADY_ON`.
pub const ALREADY_ON: i64 = -4;

static HYPERVISOR_SERVICES: AtomicBool = AtomicBool::new(true);

/// Records whether the hypervisor's own calls exist (`false` when booted
/// directly, where only PSCI answers).
pub fn set_hypervisor_services(available: bool) {
    HYPERVISOR_SERVICES.store(available, Ordering::Relaxed);
}

/// Whether `TEST_REPORT` and SMCCC `VERSION` may be called.
pub fn hypervisor_services() -> bool {
    HYPERVISOR_SERVICES.load(Ordering::Relaxed)
}

/// Issues `HVC #0` with `function` and three arguments; returns `x0`.
pub fn call(function: u32, a1: u64, a2: u64, a3: u64) -> i64 {
    let result: u64;
    // SAFETY: an SMCCC call changes no guest memory; x0..x17 may be clobbered
    // by SMCCC 1.0 callees and are declared so.
    unsafe {
        asm!(
            "hvc #0",
            inout("x0") u64::from(function) => result,
            inout("x1") a1 => _,
            inout("x2") a2 => _,
            inout("x3") a3 => _,
            out("x4") _, out("x5") _, out("x6") _, out("x7") _,
            out("x8") _, out("x9") _, out("x10") _, out("x11") _,
            out("x12") _, out("x13") _, out("x14") _, out("x15") _,
            out("x16") _, out("x17") _,
            options(nostack),
        );
    }
    result as i64
}

/// PSCI `CPU_ON`: starts `mpidr` at `entry` with `context` in its `x0`.
pub fn cpu_on(mpidr: u64, entry: u64, context: u64) -> i64 {
    call(function::CPU_ON, mpidr, entry, context)
}

/// PSCI `AFFINITY_INFO` for one CPU (level 0).
pub fn affinity_info(mpidr: u64) -> i64 {
    call(function::AFFINITY_INFO, mpidr, 0, 0)
}

/// PSCI `CPU_OFF`; parks the CPU should the call return.
pub fn cpu_off() -> ! {
    call(function::CPU_OFF, 0, 0, 0);
    park()
}

/// PSCI `SYSTEM_OFF`; parks the CPU should the call return.
pub fn system_off() -> ! {
    call(function::SYSTEM_OFF, 0, 0, 0);
    park()
}

/// PSCI `SYSTEM_RESET`; parks the CPU should the call return.
pub fn system_reset() -> ! {
    call(function::SYSTEM_RESET, 0, 0, 0);
    park()
}

/// Reports the outcome to the hypervisor (0 pass, else a failure code), when
/// its services exist.
pub fn test_report(code: u64) {
    if hypervisor_services() {
        call(function::TEST_REPORT, code, 0, 0);
    }
}

fn park() -> ! {
    loop {
        // SAFETY: WFE only waits for an event.
        unsafe { asm!("wfe", options(nomem, nostack)) };
    }
}
