//! Shared vocabulary: small types that several folders name (a system
//! register's encoding, the guest timers and their interrupts, the console
//! UART's kind). Leaves: nothing here imports from the rest of the crate, so
//! the folders that share them depend on each other one way only (checked
//! by `tests/module_graph.rs`).

pub mod sysreg_encoding;
pub mod timers;
pub mod uart_kind;
