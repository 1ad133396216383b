//! Exit handling decisions, one file per exit kind, all pure and unit-tested
//! on the host; the vCPU's exit handling (`runtime::vcpu`) reads the exit's
//! registers, asks here what to do, and carries it out through its CPU.
//!
//! - `sync_exit`: which handler a synchronous exit goes to (by `ESR_EL2` class).
//! - `data_abort`, `instruction_abort`: stage-2 aborts: fault in guest RAM,
//!   emulate a device access (`mmio`: the device windows), or inject an abort;
//!   `ram_fault`: fixing a stage-2 fault on guest RAM once it is routed there
//!   (the leaf, the ticket check, the dirty mark).
//! - `hypercall`, `psci`: the `HVC`/`SMC` interface and PSCI power states.
//! - `sysreg`: trapped system register accesses.
//! - `inject`: exceptions delivered to the guest; `aarch32`: AArch32
//!   conditions and IT blocks; `esr`: syndrome decoding.
//! - `flow`: what a handler tells the run loop, `Flow` or `StopReason`.
//!
//! A trapped WFI/WFE needs no decision (it completes at once) and has no file.

pub mod aarch32;
pub mod data_abort;
pub mod esr;
pub mod flow;
pub mod hypercall;
pub mod inject;
pub mod instruction_abort;
pub mod mmio;
pub mod psci;
pub mod ram_fault;
pub mod sync_exit;
pub mod sysreg;
