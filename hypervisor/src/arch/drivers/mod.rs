//! The host devices the hypervisor drives directly: the GIC (distributor,
//! redistributors, CPU interface, list registers), its ITS (for passed PCIe
//! devices' MSIs) and the console UART.

pub mod console;
pub mod gic;
pub mod its;
pub mod list_registers;
