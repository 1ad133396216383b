//! The machine side of the host devices the hypervisor drives directly: the
//! GIC (its frames, system registers and list registers) and its ITS (for
//! passed PCIe devices' MSIs). The console UART needs nothing here: its
//! driver and register bank are `crate::drivers::uart`.

pub mod gic;
pub mod its;
pub mod list_registers;
