//! A standalone type-1 hypervisor for arm64 that runs at EL2.
//!
//! The crate is split in two layers. The pure layer (every module at the top
//! level) holds the decisions: decoding exception syndromes, PSCI and the
//! hypervisor-call interface, the PL011 register model, the host console UART
//! drivers (PL011, 16550), the host platform read from the device tree, the
//! guest device tree, memory-range arithmetic, guest cache maintenance without
//! FEAT_S2FWB, per-VM counters, the forwarding of the guest timers'
//! interrupts and the host console's VM multiplexing and monitor (`control`). It builds and is unit-tested on the host. The machine layer
//! (`arch`, only on `aarch64` bare metal) touches system registers and runs the boot path, exception
//! vectors, CPUs, memory management and the vCPU run loop, and calls into the
//! pure layer for every decision. The boot payload's formats (cpio newc
//! archive, arm64 `Image` header, `vm.conf`) come from the `boot-payload`
//! crate, which `qemu-runner` writes them with.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod control;
pub mod devices;
pub mod drivers;
pub mod exit;
pub mod platform;
pub mod stage2;
pub mod vm;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;
