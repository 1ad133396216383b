//! The machine layer: everything that runs only on aarch64 at EL2.
//!
//! Boot order: `boot::entry` (Image header, relocation, early identity map,
//! MMU on) -> `boot::primary_main` (heap, platform, console, memory, per-CPU
//! data, banner, secondary CPUs, then publishes `runtime::boot_info`) ->
//! `run` -> `runtime::cpu_start` (the VMs from the boot payload, each vCPU
//! pinned to one CPU of its VM's partition, `runtime::vm_table`) ->
//! `runtime::vcpu_cycle` (each vCPU's life on its CPU, halts and restarts)
//! -> `runtime::vcpu` (run loop and exit handling on every CPU, over
//! `vcpu::El2Vcpu`).
//!
//! The VM runtime (the VMs, their table, memslot and dirty-log operations,
//! migration, restart, each vCPU's cycle of runs and halts, its run loop and
//! exit handling) is `crate::runtime`, host-tested; [`hardware`] is the
//! machine it runs on here and [`vcpu`] the CPU a vCPU runs on.
//!
//! Folders: `boot` (the boot sequence, the entry code, exception vectors,
//! firmware calls, host memory), `cpu` (system registers, the running CPU's
//! features, per-CPU data), `drivers` (the host GIC's frames, system
//! registers and set-up, its ITS, the list registers), `vcpu` (the CPU's registers as a vCPU's exit handling reaches
//! them, `runtime::vcpu::VcpuMachine`; loading a vCPU, its state for a
//! migration, its vector registers);
//! `stage2`, `host_disk`, `hardware`, `host_console`, `control_target` and
//! `run` are files.
//!
//! # Dependency order
//!
//! Each file imports only from the files before it; there is no import
//! circle (the folder-level check is `tests/module_graph.rs` in this
//! crate):
//!
//! 1. `cpu::sysreg`, `cpu::percpu`, `cpu::features`: leaves.
//! 2. `drivers::gic` (per-CPU data, system registers);
//!    `drivers::its` (per-CPU data, system registers, `drivers::gic`'s MMIO
//!    frame; host frames are handed to it by `boot`).
//! 3. `boot::entry`, `boot::exceptions`, `boot::memory` (per-CPU data,
//!    system registers), `boot::firmware` (console, GIC).
//! 4. `stage2` (host memory, system registers); `host_disk` (host memory): the
//!    machine side of the host's virtio-mmio disks (`drivers::host_disk`),
//!    `host_disk::host_disk(n)` for the VMs.
//! 5. `hardware` (host memory, stage 2, drivers, firmware, per-CPU data):
//!    the runtime's `Hardware` at EL2 and the one
//!    `runtime::host_console::HostConsole`.
//! 6. `host_console` (the machine, drivers, firmware): the console's UART,
//!    poll timer and host GIC (`runtime::host_console::ConsoleMachine`) and
//!    its start; `control_target` (the VM table): the machine behind
//!    `control::abi`.
//! 7. `vcpu` (the VM, monitor, control, host console, exception entry,
//!    drivers, features): `runtime::vcpu::VcpuMachine` at EL2.
//! 8. `run` (the VM table, monitor, vCPU): each CPU's start,
//!    `runtime::cpu_start` (the VMs created, their vCPUs run on every CPU in
//!    `runtime::vcpu_cycle`, which halts and restarts VMs) on this machine.
//! 9. `boot` (the boot sequence itself), which hands over to `run`.

pub mod boot;
pub mod control_target;
pub mod cpu;
pub mod drivers;
pub mod hardware;
pub mod host_console;
pub mod host_disk;
pub mod run;
pub mod stage2;
pub mod vcpu;
