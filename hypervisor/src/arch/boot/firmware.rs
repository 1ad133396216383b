//! Calls from the hypervisor to the platform firmware over PSCI.
//!
//! The conduit (`SMC` or `HVC`) comes from the device tree. At EL2 only `SMC`
//! reaches the firmware; `HVC` would trap to the hypervisor itself, so the boot
//! path refuses it before any call is made.

use crate::platform::PsciConduit;
use core::sync::atomic::{AtomicU8, Ordering};
use smccc::psci;
use smccc::{Hvc, Smc};

/// 0 = SMC, 1 = HVC.
static CONDUIT: AtomicU8 = AtomicU8::new(0);

/// Records the conduit for later calls.
pub fn set_conduit(conduit: PsciConduit) {
    CONDUIT.store(matches!(conduit, PsciConduit::Hvc) as u8, Ordering::Release);
}

fn conduit() -> PsciConduit {
    if CONDUIT.load(Ordering::Acquire) == 1 {
        PsciConduit::Hvc
    } else {
        PsciConduit::Smc
    }
}

/// Starts the CPU `mpidr` at physical address `entry` with `x0 = context`.
pub fn cpu_on(mpidr: u64, entry: u64, context: u64) -> Result<(), psci::error::Error> {
    match conduit() {
        PsciConduit::Smc => psci::cpu_on::<Smc>(mpidr, entry, context),
        PsciConduit::Hvc => psci::cpu_on::<Hvc>(mpidr, entry, context),
    }
}

/// The firmware's PSCI version.
pub fn version() -> Result<psci::Version, psci::error::Error> {
    match conduit() {
        PsciConduit::Smc => psci::version::<Smc>(),
        PsciConduit::Hvc => psci::version::<Hvc>(),
    }
}

/// Powers the machine off (after the console has sent its last bytes);
/// waits forever if the firmware returns.
pub fn system_off() -> ! {
    crate::drivers::uart::console::flush();
    let _ = match conduit() {
        PsciConduit::Smc => psci::system_off::<Smc>(),
        PsciConduit::Hvc => psci::system_off::<Hvc>(),
    };
    halt()
}

/// Resets the machine (after the console has sent its last bytes); waits
/// forever if the firmware returns.
pub fn system_reset() -> ! {
    crate::drivers::uart::console::flush();
    let _ = match conduit() {
        PsciConduit::Smc => psci::system_reset::<Smc>(),
        PsciConduit::Hvc => psci::system_reset::<Hvc>(),
    };
    halt()
}

/// Stops this CPU for good.
pub fn halt() -> ! {
    crate::arch::drivers::gic::HOST_GIC.quiesce();
    loop {
        crate::arch::drivers::gic::wait_for_wakeup();
    }
}
