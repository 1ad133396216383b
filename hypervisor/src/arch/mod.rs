//! The machine layer: everything that runs only on aarch64 at EL2.
//!
//! Boot order: `boot::entry` (Image header, relocation, early identity map,
//! MMU on) -> `boot::primary_main` (heap, platform, console, memory, per-CPU
//! data, banner, secondary CPUs) -> `vm` (boot payload, guest memory, vCPUs)
//! -> `vcpu` (run loop and exit handling on every CPU).
//!
//! Folders: `boot` (entry, exception vectors, firmware calls, host memory and
//! the boot sequence), `cpu` (system registers and per-CPU data), `drivers`
//! (the host GIC and console), `vcpu` (the vCPU and its run loop); `stage2`
//! and `vm` are files.

pub mod boot;
pub mod cpu;
pub mod drivers;
pub mod stage2;
pub mod vcpu;
pub mod vm;
