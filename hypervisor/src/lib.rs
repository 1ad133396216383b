//! A standalone type-1 hypervisor for arm64 that runs at EL2.
//!
//! The crate is split in two layers. The pure layer (every module at the top
//! level) holds the decisions: decoding exception syndromes, PSCI and the
//! hypervisor-call interface, the PL011 register model, the host console UART
//! drivers (PL011, 16550), the host platform read from the device tree, the
//! guest device tree, the control interface for control VMs
//! ([`control`]), memory-range arithmetic, guest cache maintenance without
//! FEAT_S2FWB, per-VM counters and the forwarding of the guest timers'
//! interrupts. It builds and is unit-tested on the host. The machine layer
//! (`arch`, only on `aarch64` bare metal) touches system registers and runs the boot path, exception
//! vectors, CPUs, memory management and the vCPU run loop, and calls into the
//! pure layer for every decision. The boot payload's formats (cpio newc
//! archive, arm64 `Image` header, `vm.conf`) come from the `boot-payload`
//! crate, which `qemu-runner` writes them with.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod aarch32;
pub mod cache_maint;
pub mod control;
pub mod counters;
pub mod cpu_features;
pub mod dt_translate;
pub mod esr;
pub mod event_log;
pub mod fault;
pub mod guest_dtb;
pub mod guest_layout;
pub mod host_gic;
pub mod host_uart;
pub mod hypercall;
pub mod inject;
pub mod mmio;
pub mod pl011;
pub mod platform;
pub mod psci;
pub mod ranges;
pub mod sysreg_trap;
pub mod timer;
pub mod tlb_count;
pub mod vgic;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;
