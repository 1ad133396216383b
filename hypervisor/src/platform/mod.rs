//! The host platform: what the hypervisor knows of the machine it runs on.
//!
//! - [`banner`]: the boot banner's lines that describe the machine.
//! - [`device_tree`]: the device-tree parser ([`Platform::from_dtb`]): RAM,
//!   reserved memory, the console UART, the GIC, the CPUs, PSCI, the boot
//!   payload and the timer's interrupts.
//! - [`dt_translate`]: bus address translation through `ranges`.
//! - [`ranges`]: physical address range arithmetic.
//! - [`cpu_features`]: CPU feature decoding from the ID registers.
//! - [`host_device`]: a node a VM is given (passthrough): its windows,
//!   interrupts and the subtree the guest's tree gets.
//! - [`virtio_mmio`]: the host's virtio-mmio transports (where its disks
//!   may be), highest address first.

pub mod banner;
pub mod cpu_features;
pub mod device_tree;
pub mod dt_translate;
pub mod host_device;
pub mod ranges;
pub mod virtio_mmio;

pub use device_tree::{Gicv2, Gicv3, Platform, PlatformError, PsciConduit};
