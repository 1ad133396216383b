#!/usr/bin/env bash
# The project's test command. On a fresh Debian machine it installs what is
# missing (the pinned toolchain, its aarch64 targets and components), then
# runs, in order: formatting, lint and documentation checks, the cross builds
# of the libraries and the hypervisor, every host test (unit, property, stress
# and QEMU end-to-end tests; qemu-runner installs QEMU, and U-Boot for the
# U-Boot boot tests, when they are missing and we are root), and the loom
# models of the lock-free protocols.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup toolchain list | grep -q "^${toolchain}"; then
    echo "test.sh: installing Rust ${toolchain}"
    rustup toolchain install "${toolchain}" --profile minimal
fi
installed_targets=$(rustup target list --installed --toolchain "${toolchain}")
for target in aarch64-unknown-none aarch64-unknown-none-softfloat; do
    if ! grep -qx "${target}" <<<"${installed_targets}"; then
        echo "test.sh: installing Rust target ${target}"
        rustup target add --toolchain "${toolchain}" "${target}"
    fi
done
installed_components=$(rustup component list --installed --toolchain "${toolchain}")
for component in clippy rustfmt; do
    if ! grep -q "^${component}" <<<"${installed_components}"; then
        echo "test.sh: installing Rust component ${component}"
        rustup component add --toolchain "${toolchain}" "${component}"
    fi
done

step() { printf '\n=== %s\n' "$*"; }

step "format"
cargo fmt --all --check

step "clippy (host)"
cargo clippy --workspace --all-targets -- -D warnings

step "clippy (aarch64-unknown-none-softfloat: the EL2 and EL1 code the host build leaves out)"
cargo clippy -p hypervisor -p test-guest -p tlb -p pgtable -p memslot -p boot-payload -p control-abi -p test-scenarios \
    --target aarch64-unknown-none-softfloat -- -D warnings

step "documentation (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p hypervisor -p test-guest -p control-abi \
    --target aarch64-unknown-none-softfloat

step "libraries build for aarch64-unknown-none-softfloat"
cargo build --release -p tlb -p pgtable -p memslot -p boot-payload -p control-abi -p test-scenarios \
    --target aarch64-unknown-none-softfloat

step "tests"
cargo test --workspace --release

step "loom models of the lock-free protocols"
# Break-before-make and reclamation in the shared walks (the epoch collector
# runs natively: the models check the tables, not the epochs).
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test --release -p pgtable --test loom_bbm
# The memslots' publication and grace period, the dirty bitmap against a
# harvest, the MMU lock and the invalidation ticket against a run-time slot
# delete: the epoch collector runs on loom too (crossbeam_loom), so the grace
# period's happens-before chain is checked end to end.
RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom-epoch \
    cargo test --release -p memslot --test loom_memslots --test loom_dirty
RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom-epoch \
    cargo test --release -p pgtable --test loom_slot_sync
