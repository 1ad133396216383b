//! The machine layer: everything that runs only on aarch64 at EL2.
//!
//! Boot order: `entry` (Image header, relocation, early identity map, MMU on)
//! -> `boot::primary_main` (heap, platform, console, memory, per-CPU data,
//! banner, secondary CPUs) -> `vm` (boot payload, guest memory, vCPUs) ->
//! `vcpu` (run loop and exit handling on every CPU).

pub mod boot;
pub mod console;
mod entry;
pub mod exceptions;
pub mod firmware;
pub mod gic;
pub mod memory;
pub mod percpu;
pub mod stage2;
pub mod sysreg;
pub mod vcpu;
pub mod vm;
