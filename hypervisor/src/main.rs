//! The hypervisor binary.
//!
//! On `aarch64-unknown-none-softfloat` this is the EL2 image: the entry code,
//! the boot sequence and everything else live in the library (`hypervisor::arch`),
//! and this file only pulls them into the link. On any other target the binary
//! exists so that `cargo test` can build the crate; running it explains how to
//! build and boot the real image.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
use hypervisor as _;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "hypervisor: this is the host build, used only for unit tests.\n\
         Build the EL2 image with\n  \
         cargo build -p hypervisor --target aarch64-unknown-none-softfloat --release\n\
         and boot it with `cargo run -p qemu-runner` (it converts the ELF to a raw arm64 Image\n\
         and starts qemu-system-aarch64 -machine virt,virtualization=on,gic-version=3)."
    );
    std::process::exit(2);
}
