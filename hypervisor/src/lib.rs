//! A standalone type-1 hypervisor for arm64 that runs at EL2.
//!
//! The crate is split in two layers. The pure layer holds the decisions and
//! the VM runtime, and builds and is unit-tested on the host; the machine
//! layer (`arch`, only on `aarch64` bare metal) touches system registers and
//! devices, runs the boot path, exception vectors, CPUs and the vCPU run
//! loop, and calls into the pure layer for every decision. The pure layer's
//! folders:
//!
//! - `vocabulary`: leaf types several folders name (a system register's
//!   encoding, the guest timers and their interrupts, the console UART's
//!   kind), so that the folders depend on each other one way.
//! - `platform`: the host platform read from the device tree, bus address
//!   translation, memory-range arithmetic, CPU feature decoding.
//! - `drivers`: the register logic of the host console UARTs (PL011, 16550)
//!   and the host GIC.
//! - `vm`: the guest's memory layout and device tree, the vCPUs' power states,
//!   per-VM counters and the rate-limited event log.
//! - `exit`: exit handling decisions, one file per exit kind (syndromes,
//!   aborts and MMIO, hypercalls and PSCI, system register traps, exception
//!   injection), and what a handler returns (`exit::flow`).
//! - `sysreg_values`: the values of the EL2 control registers and the
//!   guest's reset registers, built from named fields.
//! - `devices`: the emulated PL011, the virtual GIC and the forwarding of the
//!   guest timers' interrupts.
//! - `stage2`: stage-2 fault leaves and guest cache maintenance without
//!   FEAT_S2FWB.
//! - `control`: the control plane: the host console's VM multiplexing and
//!   monitor, and the hypercall interface of control VMs (`control::abi`).
//! - `runtime`: the running VMs and what is done to them from outside
//!   (creation, the VM table, memslot changes, dirty-log collection, live
//!   migration, restart), over the trait `runtime::Hardware` that `arch`
//!   implements and the host tests fake.
//!
//! The boot payload's formats (cpio newc archive, arm64 `Image` header,
//! `vm.conf`) come from the `boot-payload` crate, which `qemu-runner` writes
//! them with.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod control;
pub mod devices;
pub mod drivers;
pub mod exit;
pub mod platform;
pub mod runtime;
pub mod stage2;
pub mod sysreg_values;
pub mod vm;
pub mod vocabulary;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;
