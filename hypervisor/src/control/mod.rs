//! Control of the running machine from the host console.
//!
//! With several VMs sharing the host UART, [`console_mux`] prefixes each
//! VM's output lines with its name and routes typed bytes to the focused VM.
//! The escape key Ctrl-] opens the [`monitor`], whose commands ([`command`])
//! list VMs, show their counters, pause, resume, stop and restart them,
//! change their memslots and power the machine off. [`console`] ties them
//! together behind the calls the machine layer makes; everything here is
//! pure and reaches the machine only through the traits
//! [`console_mux::ConsoleOutput`], [`console::GuestInput`] and
//! [`monitor::MonitorTarget`]. [`port_input`] cuts a control VM's port
//! input into commands.
//!
//! [`abi`] is the other way in: the hypercalls (crate `control-abi`) through
//! which a control VM manages the other VMs, behind the trait
//! [`abi::ControlTarget`].

pub mod abi;
pub mod command;
pub mod console;
pub mod console_mux;
pub mod monitor;
pub mod port_input;

#[cfg(test)]
mod tests;
