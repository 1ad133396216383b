//! The control interface: the hypervisor side of the `control-abi` hypercalls.
//!
//! A VM whose configuration marks it as a control VM may manage the other
//! VMs with the calls of the `control-abi` crate (reference:
//! `docs/control-abi.md`): version and capabilities, list VMs, pause /
//! resume / stop, memslot create / delete / move / flags, guest memory and
//! vCPU registers of another VM. Every other VM gets `NOT_SUPPORTED` from
//! every call of the range.
//!
//! This module is pure and host-tested. It is split in three:
//! - [`server`]: [`dispatch`] decodes and validates a call, applies the
//!   rules (control VMs only, never the caller itself) and drives
//!   - [`target`]: the [`ControlTarget`] trait, which the machine layer
//!     implements over its VM table, scheduler, memslots and host memory;
//!   - [`buffer`]: the translation of the caller's buffers through the
//!     caller's own memslots ([`CallerMemory`]), page by page, never as host
//!     addresses.
//!
//! # Wiring (machine layer)
//!
//! On an `HVC` whose `x0` satisfies [`control_abi::Function::in_range`], the
//! vCPU loop pins its epoch guard, takes the caller's published
//! [`memslot::MemslotSet`] as its [`CallerMemory`], calls [`dispatch`] with
//! `x0..x7` and writes the four results to `x0..x3`.

pub mod buffer;
pub mod registers;
pub mod server;
pub mod target;

pub use buffer::{CallerMemory, CallerPage, HostSpan};
pub use server::{Caller, dispatch};
pub use target::{ControlTarget, NewSlot, VmId, memslot_error};

#[cfg(test)]
mod tests;
