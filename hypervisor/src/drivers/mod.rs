//! Host device drivers: the pure, host-tested part of the drivers for the
//! devices the hypervisor itself owns (the console UART and the GIC).
//!
//! The register-level decisions live here and run against mocks in unit
//! tests; `arch::drivers` maps the devices and does the MMIO.

pub mod gic;
pub mod uart;
