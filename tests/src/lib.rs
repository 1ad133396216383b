//! Cross-crate integration tests and benchmarks.
//!
//! The library half holds the benchmark suites (one module each) and the small
//! measuring kit they share; `src/bin/bench.rs` is the single entry point
//! (`cargo run --release -p tests --bin bench -- SUITE`) and `tests/` holds the
//! integration tests. Every figure is printed as one `SUITE/CASE/FIGURE VALUE
//! UNIT` line.

pub mod measure;
pub mod suites;
