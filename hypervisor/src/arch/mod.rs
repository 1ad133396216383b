//! The machine layer: everything that runs only on aarch64 at EL2.
//!
//! Boot order: `boot::entry` (Image header, relocation, early identity map,
//! MMU on) -> `boot::primary_main` (heap, platform, console, memory, per-CPU
//! data, banner, secondary CPUs, then publishes `boot::info`) -> `run` (the
//! VMs from the boot payload, each vCPU pinned to one CPU of its VM's
//! partition, `machine`) -> `vcpu` (run loop and exit handling on every CPU).
//!
//! Folders: `boot` (the boot sequence, the entry code, exception vectors,
//! firmware calls, host memory and the published boot information), `cpu`
//! (system registers, the running CPU's features, per-CPU data), `drivers`
//! (the host GIC and console), `vcpu` (a vCPU: its state, run loop and the
//! machine side of exit handling); `stage2`, `host_console`, `vm`,
//! `vm_ops`, `dirty_log`, `machine`, `migrate`, `monitor`, `restart` and
//! `run` are files.
//!
//! # Dependency order
//!
//! Each file imports only from the files before it (checked by reading the
//! `use crate::arch::` lines of each file); there is no import circle:
//!
//! 1. `cpu::sysreg`, `cpu::percpu`, `cpu::features`: leaves.
//! 2. `drivers::console`; `drivers::gic` (per-CPU data, system registers).
//! 3. `boot::info` (a leaf: platform and features only), `boot::entry`,
//!    `boot::exceptions`, `boot::memory` (per-CPU data, system registers),
//!    `boot::firmware` (console, GIC).
//! 4. `stage2` (host memory, system registers); `host_console` (firmware,
//!    drivers, per-CPU data): the hypervisor console's lock and output, the
//!    poll timer and the parking of CPUs, below the VM so that VMs write to
//!    it without importing the monitor.
//! 5. `vm` (boot information, firmware, host memory, drivers, stage 2, host
//!    console): the VM captures what its vCPUs need of the boot information
//!    at creation.
//! 6. `vm_ops` (the VM, host memory, stage 2): memslot changes and guest
//!    memory copies from outside the VM; `machine` (the VM, firmware, host
//!    console): the VM table and the per-CPU record; `dirty_log` (the VM,
//!    VM operations, stage 2): dirty logging of a slot.
//! 7. `monitor` (machine, VM, VM operations, host console, drivers): the
//!    console's input and the monitor's machine; `control` (machine, VM, VM
//!    operations): the control interface's machine side; `restart` (VM, VM
//!    operations, system registers): rebuilding a VM for a restart;
//!    `migrate` (machine, VM, VM operations, dirty logging, drivers): live
//!    migration.
//! 8. `vcpu` (the VM, monitor, control, host console, exception entry, firmware,
//!    drivers, stage 2, features).
//! 9. `run` (boot information, machine, monitor, restart, VM, vCPU): starts
//!    them on every CPU, halts and restarts VMs.
//! 10. `boot` (the boot sequence itself), which hands over to `run`.

pub mod boot;
pub mod control;
pub mod cpu;
pub mod dirty_log;
pub mod drivers;
pub mod host_console;
pub mod machine;
pub mod migrate;
pub mod monitor;
pub mod restart;
pub mod run;
pub mod stage2;
pub mod vcpu;
pub mod vm;
pub mod vm_ops;
