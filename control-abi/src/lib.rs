//! The hypervisor's control interface, as seen from both sides of `HVC #0`.
//!
//! A VM marked as a control VM may manage the other VMs through a small,
//! versioned hypercall ABI in SMCCC's vendor-specific hypervisor service range
//! (owning entity 6, fast SMC64 calls `0xC600_xxxx`): version and
//! capabilities, listing VMs, pause / resume / stop, memslot create / delete /
//! move / flags, and reading and writing another VM's guest memory and vCPU
//! registers. `docs/control-abi.md` in the repository is the reference page.
//!
//! This crate is the shared vocabulary and the guest-side client; it has no
//! dependencies and is `no_std`:
//! - [`function`]: the function ids and the [`Function`] they name;
//! - [`error`]: the negative result codes in `x0` ([`Error`]);
//! - [`call`]: one typed [`Call`] per function with the exact register layout
//!   of `x0..x7` ([`Call::encode`], [`Call::decode`]; decoding validates every
//!   register the layout defines and refuses nonzero reserved registers);
//! - [`reply`]: the typed results in `x0..x3`;
//! - [`vm_info`]: the fixed little-endian record that `LIST_VMS` writes;
//! - [`client`]: [`Client`], one method per call over a [`Conduit`], and the
//!   `Hvc` conduit (`hvc #0`, on `aarch64` only).
//!
//! # Conventions
//!
//! Arguments travel in `x1..x7`, results come back in `x0..x3`. `x0` is a
//! status: zero or positive is success, negative is an [`Error`]. Every
//! argument register a function does not define must be zero, so that later
//! minor versions can give it a meaning without changing old callers.
//!
//! # Example
//!
//! A guest uses `Client::new(Hvc)`; here a conduit stands in for the
//! hypervisor and answers `VERSION` and `VM_PAUSE`.
//!
//! ```
//! use control_abi::{CallError, Client, Conduit, Error, function};
//!
//! struct Hypervisor;
//! impl Conduit for Hypervisor {
//!     fn call(&self, regs: [u64; 8]) -> [u64; 4] {
//!         match (regs[0] as u32, regs[1]) {
//!             (function::VERSION, _) => [0x1_0000, 0, 0, 0],
//!             (function::VM_PAUSE, 1) => [0, 0, 0, 0],
//!             _ => [Error::NoSuchVm.x0(), 0, 0, 0],
//!         }
//!     }
//! }
//!
//! let client = Client::new(Hypervisor);
//! assert_eq!(client.version()?.major, control_abi::VERSION_MAJOR);
//! client.pause(1)?;
//! assert_eq!(client.pause(7), Err(CallError::Refused(Error::NoSuchVm)));
//! # Ok::<(), CallError>(())
//! ```
#![cfg_attr(not(test), no_std)]

pub mod call;
pub mod client;
pub mod error;
pub mod function;
pub mod reply;
pub mod vm_info;

pub use call::{
    Call, DirtyLogClear, DirtyLogGet, MIGRATE_VERIFY, MemoryTransfer, RegisterId, SlotFlags,
    SlotRequest, VcpuRegister,
};
#[cfg(target_arch = "aarch64")]
pub use client::Hvc;
pub use client::{Client, Conduit};
pub use error::{CallError, Error};
pub use function::Function;
pub use reply::{Capabilities, ListVmsReply, Version};
pub use vm_info::{VmInfo, VmState};

/// The major version of the interface this crate speaks. A change of major
/// version may change or remove calls; callers check it first.
pub const VERSION_MAJOR: u16 = 1;
/// The minor version: new calls or new meanings for registers that were
/// reserved (zero) before; everything of an older minor version still works.
pub const VERSION_MINOR: u16 = 2;

/// The page size the interface counts in (buffers are translated page by page).
pub const PAGE_SIZE: u64 = 4096;
/// The most bytes one `MEMORY_READ`, `MEMORY_WRITE` or `LIST_VMS` call moves.
pub const MAX_TRANSFER: u64 = 64 * 1024;
/// Slot ids run from 0 to `MAX_SLOT_ID`.
pub const MAX_SLOT_ID: u32 = 32766;
/// A slot holds at most this many pages.
pub const MAX_SLOT_PAGES: u64 = (1 << 31) - 1;
/// Guest intermediate physical addresses lie below this (52 bits).
pub const IPA_LIMIT: u64 = 1 << 52;
