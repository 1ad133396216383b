//! Links the bare-metal build with the hypervisor's linker script as a
//! position-independent executable: the image relocates itself at entry, so a
//! boot loader may place it at any 2 MiB aligned address (Linux `Image` rules).

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=linker.ld");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        println!("cargo:rustc-link-arg-bins=-T{dir}/linker.ld");
        println!("cargo:rustc-link-arg-bins=-pie");
        println!("cargo:rustc-link-arg-bins=--no-dynamic-linker");
        println!("cargo:rustc-link-arg-bins=-znotext");
        println!("cargo:rustc-link-arg-bins=--apply-dynamic-relocs");
        println!("cargo:rustc-link-arg-bins=-znorelro");
    }
}
