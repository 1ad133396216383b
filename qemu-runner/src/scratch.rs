//! Scratch directories owned by one runner process, and the sweeping of those
//! whose process is gone.
//!
//! A run writes its boot files into `<parent>/<prefix>-<pid>-<n>` (and a
//! Debian download unpacks into `<parent>/download-<pid>-<n>`), and removes
//! the directory when it is done ([`ScratchDir`]'s `Drop`). A runner that is
//! killed (Ctrl-C, `SIGKILL`, a test harness giving up) never gets to remove
//! it, so creating a scratch directory first sweeps its siblings: an entry
//! named `<prefix>-<pid>-...` whose process no longer exists (`kill(pid, 0)`
//! fails with `ESRCH`) is removed. Entries of live processes (runs going on in
//! parallel) are left alone, as is anything not named that way. A dead
//! runner's process id taken by a new process only delays its sweep until
//! that process ends.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A directory removed when dropped, named after the process that owns it.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Sweeps `parent` of `prefix` directories left by processes that are
    /// gone, then creates a fresh `<parent>/<prefix>-<pid>-<n>`.
    pub fn create(parent: &Path, prefix: &str) -> io::Result<ScratchDir> {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        std::fs::create_dir_all(parent)?;
        sweep_stale(parent, prefix);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let path = parent.join(name);
        // A leftover of an earlier process that had our id goes first.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(ScratchDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // A directory that cannot be removed now is swept by a later run.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the `<prefix>-<pid>-...` entries of `parent` whose process is
/// gone, and returns how many it removed.
pub fn sweep_stale(parent: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = owner(&name.to_string_lossy(), prefix) else {
            continue;
        };
        if !process_exists(pid) && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The process id in a scratch directory's name `<prefix>-<pid>-<rest>`.
fn owner(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok().filter(|&pid| pid > 0)
}

/// Whether a process with id `pid` exists (ours or anyone's).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 delivers nothing; kill only checks that the process
    // exists and that we may signal it.
    let answer = unsafe { libc::kill(pid, 0) };
    answer == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("`true` runs");
        let pid = child.id();
        child.wait().expect("`true` exits");
        pid
    }

    #[test]
    fn names_carry_their_owner() {
        assert_eq!(owner("run-1234-0", "run"), Some(1234));
        assert_eq!(owner("run-1234-17", "run"), Some(1234));
        assert_eq!(owner("download-77-0", "download"), Some(77));
        assert_eq!(owner("run-0-1", "run"), None);
        assert_eq!(owner("run-x-1", "run"), None);
        assert_eq!(owner("runaway-12-1", "run"), None);
        assert_eq!(owner("run-12", "run"), None);
        assert_eq!(owner("hypervisor.img", "run"), None);
    }

    #[test]
    fn a_new_scratch_dir_sweeps_what_dead_runs_left_and_keeps_live_ones() {
        let parent = std::env::temp_dir().join(format!("scratch-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        let dead = parent.join(format!("run-{}-0", dead_pid()));
        let live = parent.join(format!("run-{}-99", std::process::id()));
        let other = parent.join("download-1-0");
        let unrelated = parent.join("keep-me");
        for dir in [&dead, &live, &other, &unrelated] {
            std::fs::create_dir_all(dir.join("inside")).unwrap();
        }
        assert!(process_exists(std::process::id()));

        let scratch = ScratchDir::create(&parent, "run").unwrap();
        assert!(!dead.exists(), "a dead run's directory is swept");
        assert!(live.exists(), "a live run's directory stays");
        assert!(
            other.exists(),
            "another prefix is not this sweep's business"
        );
        assert!(unrelated.exists());
        assert!(scratch.path().is_dir());
        assert_eq!(
            owner(
                &scratch.path().file_name().unwrap().to_string_lossy(),
                "run"
            ),
            Some(std::process::id())
        );
        let path = scratch.path().to_path_buf();
        drop(scratch);
        assert!(!path.exists(), "dropped with its run");
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
