//! Emulated devices the guest sees: the PL011 UART, the virtual GIC and the
//! forwarding of the guest timers' interrupts, and the virtio devices.

pub mod pl011;
pub mod timer;
#[cfg(test)]
mod timer_delivery_test;
pub mod vgic;
pub mod virtio;
