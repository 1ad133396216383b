//! The boot information: what the boot CPU learned about the machine (the
//! platform, the system-wide CPU features, the online CPUs, the boot
//! payload), published once before any VM exists and read-only afterwards.
//!
//! A leaf: it imports only the platform's description (and the
//! passthrough plans read from it), so the boot
//! sequence (`arch::boot`) publishes it and the runtime reads it without an
//! import circle.

use crate::platform::Platform;
use crate::platform::cpu_features::CpuFeatures;
use crate::platform::ranges::PhysRange;
use crate::vm::passthrough::{PassthroughError, PassthroughPlan};
use alloc::vec::Vec;
use spin::Once;

/// What the boot CPU learned, shared with every CPU.
pub struct BootInfo {
    /// The host platform.
    pub platform: Platform,
    /// CPU features: the system-wide minimum over the online CPUs.
    pub features: CpuFeatures,
    /// Number of CPUs that came online (including the boot CPU).
    pub cpus_online: usize,
    /// The boot payload, if the boot loader passed one.
    pub payload: Option<PhysRange>,
    /// TLB invalidation capabilities (from the system-wide features).
    pub tlb_caps: tlb::TlbCaps,
    /// Each VM's passed-through devices (by VM index), read from the host
    /// device tree and checked against the hypervisor and the VMs before
    /// it; empty when no VM names any.
    pub passthrough: Vec<Result<PassthroughPlan, PassthroughError>>,
}

static BOOT_INFO: Once<BootInfo> = Once::new();

/// Publishes the boot information (once, on the boot CPU, after every other
/// CPU came online or was given up on) and returns the published copy.
pub fn publish(info: BootInfo) -> &'static BootInfo {
    BOOT_INFO.call_once(|| info)
}
