//! Cross-crate integration tests and benchmarks.
//!
//! The library half holds the benchmark suites (one module each) and the small
//! measuring kit they share; `src/bin/bench.rs` is the single entry point
//! (`cargo run --release -p tests --bin bench -- SUITE`) and `tests/` holds the
//! integration tests. Every figure is printed as one `SUITE/CASE/FIGURE VALUE
//! UNIT` line. [`fuzz`] drives the test guest's fuzz scenario, for the
//! `e2e_fuzz` test and the long campaigns of `src/bin/fuzz.rs`; [`control_pair`]
//! boots a control VM beside its peer for the control scenarios' tests and
//! benchmarks; [`e2e`] is the end-to-end tests' kit (boot, find lines, assert
//! a clean power-off); [`pty`] runs a program on a pseudo-terminal, as a
//! person would, for the `e2e_terminal` test; [`linux_virtio`] boots Linux
//! guests with virtio disks and networks (disk images, role command lines,
//! direct QEMU pairs).

pub mod control_pair;
pub mod e2e;
pub mod fuzz;
pub mod linux_virtio;
pub mod measure;
pub mod pty;
pub mod suites;
