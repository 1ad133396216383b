//! The machine layer: everything that runs only on aarch64 at EL2.
//!
//! Boot order: `boot::entry` (Image header, relocation, early identity map,
//! MMU on) -> `boot::primary_main` (heap, platform, console, memory, per-CPU
//! data, banner, secondary CPUs, then publishes `boot::info`) -> `run` (the
//! VM from the boot payload, one vCPU per CPU) -> `vcpu` (run loop and exit
//! handling on every CPU).
//!
//! Folders: `boot` (the boot sequence, the entry code, exception vectors,
//! firmware calls, host memory and the published boot information), `cpu`
//! (system registers, the running CPU's features, per-CPU data), `drivers`
//! (the host GIC and console), `vcpu` (a vCPU: its state, run loop and the
//! machine side of exit handling); `stage2`, `vm` and `run` are files.
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
//! 4. `stage2` (host memory, system registers).
//! 5. `vm` (boot information, firmware, host memory, drivers, stage 2): the
//!    VM captures what its vCPUs need of the boot information at creation.
//! 6. `vcpu` (the VM, exception entry, firmware, drivers, stage 2, features).
//! 7. `run` (boot information, VM, vCPU): starts them on every CPU.
//! 8. `boot` (the boot sequence itself), which hands over to `run`.

pub mod boot;
pub mod cpu;
pub mod drivers;
pub mod run;
pub mod stage2;
pub mod vcpu;
pub mod vm;
pub mod vm_ops;
