//! The host platform: what the hypervisor knows of the machine it runs on.
//!
//! - [`device_tree`]: the device-tree parser ([`Platform::from_dtb`]): RAM,
//!   reserved memory, the console UART, the GIC, the CPUs, PSCI, the boot
//!   payload and the timer's interrupts.
//! - [`dt_translate`]: bus address translation through `ranges`.
//! - [`ranges`]: physical address range arithmetic.
//! - [`cpu_features`]: CPU feature decoding from the ID registers.
//! - [`virtio_mmio`]: the host's virtio-mmio transports (where its disks
//!   may be), highest address first.

pub mod cpu_features;
pub mod device_tree;
pub mod dt_translate;
pub mod ranges;
pub mod virtio_mmio;

pub use device_tree::{Gicv2, Gicv3, Platform, PlatformError, PsciConduit};
