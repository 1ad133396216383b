//! The host devices the hypervisor drives directly: the GIC (distributor,
//! redistributors, CPU interface, list registers) and the console UART.

pub mod console;
pub mod gic;
pub mod list_registers;
