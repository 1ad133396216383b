//! Benchmark entry point: `cargo run --release -p tests --bin bench -- SUITE...`.
//!
//! Runs the named suites (or `all`), each printing `SUITE/CASE/FIGURE VALUE
//! UNIT` lines; `--list` names the suites.

use std::process::ExitCode;
use tests::suites::SUITES;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty()
        || args
            .iter()
            .any(|a| a == "--list" || a == "-h" || a == "--help")
    {
        eprintln!("usage: bench SUITE... | all | --list\nsuites:");
        for suite in SUITES {
            eprintln!("  {:<12} {}", suite.name, suite.about);
        }
        return if args.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    let mut chosen = Vec::new();
    for arg in &args {
        if arg == "all" {
            chosen.extend(SUITES.iter());
        } else if let Some(suite) = SUITES.iter().find(|s| s.name == arg) {
            chosen.push(suite);
        } else {
            eprintln!("bench: no suite named `{arg}` (try --list)");
            return ExitCode::FAILURE;
        }
    }
    for suite in chosen {
        (suite.run)();
    }
    ExitCode::SUCCESS
}
