//! Host device drivers: the pure, host-tested part of the drivers for the
//! devices the hypervisor itself owns (the console UART, the GIC and its ITS,
//! and how a
//! block transfer over guest buffers becomes requests to a host disk).
//!
//! The register-level decisions live here and run against mocks in unit
//! tests; `arch::drivers` maps the devices and does the MMIO.

pub mod gic;
pub mod host_disk;
pub mod its;
pub mod uart;
