//! Emulated devices the guest sees: the PL011 UART, the virtual GIC (with its
//! ITS) and the forwarding of the guest timers' interrupts, and the virtio
//! devices; and the guest RAM as the devices that read it see it
//! ([`guest_memory`]).

pub mod guest_memory;
pub mod pl011;
pub mod timer;
#[cfg(test)]
mod timer_delivery_test;
pub mod vgic;
pub mod virtio;
