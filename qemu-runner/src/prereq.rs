//! Prerequisites: the Rust target, QEMU, and U-Boot for `--firmware u-boot`.
//!
//! The aarch64 target is added with `rustup target add` when rustup lists it
//! as missing. When `qemu-system-aarch64` is not on `PATH`, Debian's
//! `qemu-system-arm` package (which provides it) is installed with `apt-get`
//! if we are root; otherwise the error names the exact command to run. U-Boot
//! ([`UBOOT_BIN`], only for runs that boot through it) comes the same way from
//! Debian's `u-boot-qemu` (U-Boot builds for QEMU's machines, no dependencies).
//! Each check runs at most once per process, and apt runs one at a time, so
//! parallel tests do not race apt.

use std::fmt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::artifacts::TARGET;
use crate::uboot::{UBOOT_BIN, UBOOT_PACKAGE};

/// The QEMU binary.
pub const QEMU: &str = "qemu-system-aarch64";
/// The Debian package that provides it.
pub const QEMU_PACKAGE: &str = "qemu-system-arm";

/// A missing prerequisite.
#[derive(Debug, Clone)]
pub enum PrereqError {
    /// QEMU is missing and we may not install it.
    QemuMissing {
        /// The command that installs it.
        install_command: String,
    },
    /// Installing QEMU failed.
    QemuInstallFailed(String),
    /// U-Boot is missing and we may not install it.
    UBootMissing {
        /// The command that installs it.
        install_command: String,
    },
    /// Installing U-Boot failed.
    UBootInstallFailed(String),
    /// The Rust target is missing and could not be added.
    RustTarget(String),
}

impl fmt::Display for PrereqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrereqError::QemuMissing { install_command } => write!(
                f,
                "{QEMU} is not installed; install it with:\n    {install_command}"
            ),
            PrereqError::QemuInstallFailed(why) => {
                write!(f, "installing {QEMU_PACKAGE} failed: {why}")
            }
            PrereqError::UBootMissing { install_command } => write!(
                f,
                "U-Boot for QEMU ({UBOOT_BIN}) is not installed; install it with:\n    \
                 {install_command}"
            ),
            PrereqError::UBootInstallFailed(why) => {
                write!(f, "installing {UBOOT_PACKAGE} failed: {why}")
            }
            PrereqError::RustTarget(why) => write!(f, "Rust target {TARGET} unavailable: {why}"),
        }
    }
}

impl std::error::Error for PrereqError {}

/// Finds `program` on `PATH`.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
}

/// Whether this process runs as root (may install packages).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

static QEMU_CHECK: Mutex<Option<Result<PathBuf, PrereqError>>> = Mutex::new(None);
static TARGET_CHECK: Mutex<Option<Result<(), PrereqError>>> = Mutex::new(None);

/// Returns QEMU's path, installing it first when missing and root.
pub fn ensure_qemu() -> Result<PathBuf, PrereqError> {
    let mut check = QEMU_CHECK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    check.get_or_insert_with(find_or_install_qemu).clone()
}

fn find_or_install_qemu() -> Result<PathBuf, PrereqError> {
    if let Some(path) = find_on_path(QEMU) {
        return Ok(path);
    }
    if !is_root() {
        return Err(PrereqError::QemuMissing {
            install_command: install_command(QEMU_PACKAGE),
        });
    }
    eprintln!("qemu-runner: {QEMU} missing; installing Debian's {QEMU_PACKAGE} with apt-get");
    apt_install(QEMU_PACKAGE).map_err(PrereqError::QemuInstallFailed)?;
    find_on_path(QEMU).ok_or_else(|| {
        PrereqError::QemuInstallFailed(format!(
            "{QEMU_PACKAGE} installed but {QEMU} is not on PATH"
        ))
    })
}

static UBOOT_CHECK: Mutex<Option<Result<PathBuf, PrereqError>>> = Mutex::new(None);

/// Returns the path of U-Boot for QEMU's arm64 `virt` machine, installing
/// Debian's `u-boot-qemu` first when it is missing and we are root.
pub fn ensure_uboot() -> Result<PathBuf, PrereqError> {
    let mut check = UBOOT_CHECK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    check.get_or_insert_with(find_or_install_uboot).clone()
}

fn find_or_install_uboot() -> Result<PathBuf, PrereqError> {
    let path = PathBuf::from(UBOOT_BIN);
    if path.is_file() {
        return Ok(path);
    }
    if !is_root() {
        return Err(PrereqError::UBootMissing {
            install_command: install_command(UBOOT_PACKAGE),
        });
    }
    eprintln!("qemu-runner: {UBOOT_BIN} missing; installing Debian's {UBOOT_PACKAGE} with apt-get");
    apt_install(UBOOT_PACKAGE).map_err(PrereqError::UBootInstallFailed)?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(PrereqError::UBootInstallFailed(format!(
            "{UBOOT_PACKAGE} installed but {UBOOT_BIN} is not there"
        )))
    }
}

/// The command a user without root runs to install `package`.
fn install_command(package: &str) -> String {
    format!("sudo apt-get update && sudo apt-get install -y {package}")
}

/// Serialises apt runs of this process (two packages installed by parallel
/// tests would otherwise contend for apt's locks).
static APT: Mutex<()> = Mutex::new(());

/// `apt-get update`, then `apt-get install` of `package` without its
/// recommended packages, non-interactively; waits up to 5 minutes for apt's
/// lock held by someone else.
fn apt_install(package: &str) -> Result<(), String> {
    let _apt = APT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for args in [
        vec!["-o", "DPkg::Lock::Timeout=300", "update", "-q"],
        vec![
            "-o",
            "DPkg::Lock::Timeout=300",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            package,
        ],
    ] {
        let status = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !status.success() {
            return Err(format!("`apt-get {}` exited with {status}", args.join(" ")));
        }
    }
    Ok(())
}

/// Adds the aarch64 Rust target when rustup says it is missing.
pub fn ensure_rust_target() -> Result<(), PrereqError> {
    let mut check = TARGET_CHECK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    check.get_or_insert_with(add_rust_target_if_missing).clone()
}

fn add_rust_target_if_missing() -> Result<(), PrereqError> {
    let rustup = |args: &[&str]| {
        Command::new("rustup")
            .current_dir(crate::artifacts::workspace_root())
            .args(args)
            .output()
            .map_err(|e| PrereqError::RustTarget(format!("cannot run rustup: {e}")))
    };
    let listed = rustup(&["target", "list", "--installed"])?;
    if !listed.status.success() {
        return Err(PrereqError::RustTarget(format!(
            "`rustup target list --installed` failed: {}",
            String::from_utf8_lossy(&listed.stderr).trim()
        )));
    }
    if String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|line| line.trim() == TARGET)
    {
        return Ok(());
    }
    eprintln!("qemu-runner: adding Rust target {TARGET}");
    let added = rustup(&["target", "add", TARGET])?;
    if !added.status.success() {
        return Err(PrereqError::RustTarget(format!(
            "`rustup target add {TARGET}` failed: {}",
            String::from_utf8_lossy(&added.stderr).trim()
        )));
    }
    Ok(())
}
