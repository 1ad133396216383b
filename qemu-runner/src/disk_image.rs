//! Raw disk image files for Linux guests' virtio-blk: made and read on the
//! host with e2fsprogs.
//!
//! [`make_ext4`] writes a sparse file of the asked size and puts an ext4 file
//! system on its first part (`mkfs.ext4 -F -q IMG SIZE`), so the rest of the
//! disk stays free for raw timed I/O past the file system
//! ([`crate::initramfs::Role::DiskWrite`]'s `bench_skip_mib`).
//! [`read_ext4_file`] reads one file back out of an image without mounting it
//! (`debugfs -R "cat PATH" IMG`), which is how a test checks what a guest
//! wrote. The tools come from Debian's `e2fsprogs` (installed on every Debian
//! system; `.ci/run` installs it where it is missing) and live in `/sbin`,
//! which a user's `PATH` may lack, so they are looked for there too.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why an image could not be made or read.
#[derive(Debug)]
pub enum DiskImageError {
    /// A tool is not installed.
    MissingTool(&'static str),
    /// Writing the file failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        error: std::io::Error,
    },
    /// A tool failed.
    Failed {
        /// The command.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

impl fmt::Display for DiskImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskImageError::MissingTool(tool) => write!(
                f,
                "{tool} is not installed (Debian package e2fsprogs: apt-get install e2fsprogs)"
            ),
            DiskImageError::Io { what, error } => write!(f, "{what}: {error}"),
            DiskImageError::Failed { command, stderr } => {
                write!(f, "{command} failed: {}", stderr.trim())
            }
        }
    }
}

impl std::error::Error for DiskImageError {}

/// Where `tool` is: on `PATH`, else in `/usr/sbin` or `/sbin`.
fn find_tool(tool: &'static str) -> Result<PathBuf, DiskImageError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
        .ok_or(DiskImageError::MissingTool(tool))
}

/// Runs `tool` with `args`; its standard output on success.
fn run_tool(tool: &'static str, args: &[&str]) -> Result<Vec<u8>, DiskImageError> {
    let program = find_tool(tool)?;
    let command = format!("{tool} {}", args.join(" "));
    let output = Command::new(&program)
        .args(args)
        .output()
        .map_err(|error| DiskImageError::Io {
            what: format!("starting {}", program.display()),
            error,
        })?;
    if !output.status.success() {
        return Err(DiskImageError::Failed {
            command,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(output.stdout)
}

/// Writes `path` as a sparse raw image of `size_mib` MiB with an ext4 file
/// system on its first `fs_mib` MiB (replacing a file that was there).
pub fn make_ext4(path: &Path, size_mib: u32, fs_mib: u32) -> Result<(), DiskImageError> {
    let io = |what: String| move |error| DiskImageError::Io { what, error };
    let file = std::fs::File::create(path).map_err(io(format!("creating {}", path.display())))?;
    file.set_len(u64::from(size_mib) << 20)
        .map_err(io(format!("sizing {}", path.display())))?;
    drop(file);
    let image = path.display().to_string();
    run_tool(
        "mkfs.ext4",
        &["-F", "-q", "-L", "hv-virtio", &image, &format!("{fs_mib}M")],
    )?;
    Ok(())
}

/// The file at `file` (an absolute path inside the file system) of the ext4
/// image `image`, read with `debugfs`.
pub fn read_ext4_file(image: &Path, file: &str) -> Result<Vec<u8>, DiskImageError> {
    // debugfs prints its version banner on stderr and says nothing but an
    // empty output when the file is missing: ask for the inode first.
    let image_text = image.display().to_string();
    let stat = run_tool("debugfs", &["-R", &format!("stat {file}"), &image_text])?;
    if stat.is_empty() {
        return Err(DiskImageError::Failed {
            command: format!("debugfs -R 'stat {file}' {image_text}"),
            stderr: format!("{file} is not in the file system"),
        });
    }
    run_tool("debugfs", &["-R", &format!("cat {file}"), &image_text])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_made_here_reads_back_and_a_missing_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("disk-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("disk.img");
        make_ext4(&image, 16, 8).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 16 << 20);
        let root = read_ext4_file(&image, "/lost+found");
        assert!(root.is_ok(), "{root:?}");
        let missing = read_ext4_file(&image, "/hv/check.txt").unwrap_err();
        assert!(
            missing.to_string().contains("not in the file system"),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
