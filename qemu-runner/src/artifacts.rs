//! Building the aarch64 programs with a nested cargo.
//!
//! The hypervisor and the test guest are workspace members built for
//! `aarch64-unknown-none-softfloat` in release mode. The nested cargo gets its
//! own target directory (`$CARGO_TARGET_DIR/cross`, or `<workspace>/target/cross`),
//! so it never waits for the lock of the cargo that runs the tests or the
//! runner. Executables are found from cargo's JSON messages rather than
//! guessed paths; compiler diagnostics are rendered to stderr as usual.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Target triple of the hypervisor and the test guest.
pub const TARGET: &str = "aarch64-unknown-none-softfloat";
/// Package (and binary) name of the hypervisor.
pub const HYPERVISOR: &str = "hypervisor";
/// Package (and binary) name of the test guest.
pub const TEST_GUEST: &str = "test-guest";

/// Why a build failed.
#[derive(Debug)]
pub enum BuildError {
    /// cargo could not be started.
    Spawn(std::io::Error),
    /// cargo exited with an error (its diagnostics went to stderr).
    Failed {
        /// The command line run.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// The build succeeded but produced no executable for a package.
    NoExecutable {
        /// The package.
        package: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Spawn(error) => write!(f, "cannot run cargo: {error}"),
            BuildError::Failed { command, status } => {
                write!(
                    f,
                    "`{command}` failed ({status}); see the compiler output above"
                )
            }
            BuildError::NoExecutable { package } => write!(
                f,
                "building `{package}` for {TARGET} produced no executable (does the package \
                 have a binary target?)"
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// The workspace root (where the top `Cargo.toml` is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("qemu-runner lives inside the workspace")
        .to_path_buf()
}

/// Target directory of the nested builds.
pub fn cross_target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_relative() {
                workspace_root().join(dir)
            } else {
                dir
            };
            dir.join("cross")
        }
        _ => workspace_root().join("target").join("cross"),
    }
}

/// Builds `packages` for [`TARGET`] in release mode and returns each one's
/// executable, keyed by package name. `quiet` hides cargo's progress lines
/// (compiler errors still show).
pub fn build(packages: &[&str], quiet: bool) -> Result<BTreeMap<String, PathBuf>, BuildError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = cross_target_dir();
    let mut command = Command::new(&cargo);
    command
        .current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for package in packages {
        command.args(["-p", package]);
    }
    if quiet {
        command.arg("--quiet");
    }
    let description = format!(
        "cargo build --release --target {TARGET} --target-dir {} -p {}",
        target_dir.display(),
        packages.join(" -p ")
    );
    let mut child = command.spawn().map_err(BuildError::Spawn)?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut executables = BTreeMap::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(BuildError::Spawn)?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(executable), Some(name)) = (
            message["executable"].as_str(),
            message["target"]["name"].as_str(),
        ) else {
            continue;
        };
        executables.insert(name.to_string(), PathBuf::from(executable));
    }
    let status = child.wait().map_err(BuildError::Spawn)?;
    if !status.success() {
        return Err(BuildError::Failed {
            command: description,
            status,
        });
    }
    for package in packages {
        if !executables.contains_key(*package) {
            return Err(BuildError::NoExecutable {
                package: package.to_string(),
            });
        }
    }
    Ok(executables)
}
