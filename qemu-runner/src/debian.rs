//! Debian's arm64 kernel and static busybox, fetched with apt and cached.
//!
//! Steps: make sure apt knows arm64 packages (`dpkg --add-architecture arm64
//! && apt-get update`, run when root; otherwise the error names those exact
//! commands); resolve the kernel package through the `linux-image-arm64`
//! metapackage (`apt-cache depends` names `linux-image-<abi>-arm64`, so the
//! ABI is never hard-coded); read each package's candidate version
//! (`apt-cache policy`). The cache lives in `<workspace>/target/linux/`, one
//! directory per package and version (`<package>_<version>/`), so a new
//! Debian kernel is fetched once and every later run reuses it. On a miss,
//! `apt-get download` fetches the `.deb` (apt prints its own progress; as
//! root a failed download is retried once after `apt-get update` and a fresh
//! look at the candidate versions), `dpkg-deb
//! --fsys-tarfile | tar -x` extracts only the needed file (`/boot/vmlinuz-*`,
//! `/bin/busybox`), the kernel is checked or decompressed into a raw `Image`
//! ([`crate::linux::kernel_image`]), and the file is renamed into place last,
//! so a half-written cache entry never exists. The guest's kernel modules
//! ([`crate::kernel_modules::GUEST_MODULES`], the
//! [`crate::kernel_modules::OPTIONAL_GUEST_MODULES`] the package has, and
//! what they depend on) come from the same kernel package: on a miss every
//! `./lib/modules/*` file is extracted into a scratch directory, each
//! `.ko`'s `.modinfo` read, the load order worked out
//! ([`crate::kernel_modules::load_order`]; the package has no
//! `modules.dep`), and the needed `.ko` files plus a `load-order` file (one
//! module name per line) and a `wanted` file (the lists asked for) land in
//! `<kernel package>/modules/`, renamed into place as a whole. A cache
//! entry whose `wanted` differs from the lists of this runner (one written
//! before a module was added to them) is a miss, and is replaced. A process-wide mutex plus an
//! `flock` on `target/linux/.lock` keep parallel runs from racing apt.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::kernel_modules::{
    GUEST_MODULES, ModInfo, OPTIONAL_GUEST_MODULES, load_order, module_name,
};
use crate::linux::{KernelImageError, kernel_image};
use crate::scratch::ScratchDir;

/// Debian's name for the architecture.
pub const ARCH: &str = "arm64";
/// The metapackage that depends on the current arm64 kernel.
pub const KERNEL_METAPACKAGE: &str = "linux-image-arm64";
/// The package with a statically linked busybox.
pub const BUSYBOX_PACKAGE: &str = "busybox-static";

/// Why the Debian files could not be had.
#[derive(Debug)]
pub enum DebianError {
    /// apt does not know arm64 packages and we may not teach it.
    NotRoot {
        /// The commands that make it so.
        commands: String,
    },
    /// A command could not be started.
    Spawn {
        /// The command.
        command: String,
        /// The error.
        error: std::io::Error,
    },
    /// A command failed.
    Failed {
        /// The command.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr (empty when it went to the terminal).
        stderr: String,
    },
    /// `apt-cache depends linux-image-arm64:arm64` named no kernel package.
    NoKernelPackage(String),
    /// `apt-get download` failed (an old package list names a version the
    /// archive no longer has, or the archive cannot be reached).
    Download {
        /// `name:arch=version`.
        package: String,
        /// What failed.
        error: Box<DebianError>,
    },
    /// `apt-cache policy` gave no candidate version.
    NoCandidate(String),
    /// The package does not contain the expected file.
    MissingFile {
        /// The package.
        package: String,
        /// The file looked for.
        path: String,
    },
    /// The extracted busybox is not an ELF executable.
    NotElf(PathBuf),
    /// The kernel is not a usable arm64 Image.
    Kernel(KernelImageError),
    /// A file or directory of the cache could not be used.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        error: std::io::Error,
    },
}

impl fmt::Display for DebianError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DebianError::NotRoot { commands } => write!(
                f,
                "apt does not know Debian's {ARCH} packages yet and this is not root; run:\n    \
                 {commands}\nthen run qemu-runner again"
            ),
            DebianError::Spawn { command, error } => write!(f, "cannot run `{command}`: {error}"),
            DebianError::Failed {
                command,
                status,
                stderr,
            } => {
                write!(f, "`{command}` failed ({status})")?;
                if !stderr.trim().is_empty() {
                    write!(f, ": {}", stderr.trim())?;
                }
                Ok(())
            }
            DebianError::NoKernelPackage(output) => write!(
                f,
                "`apt-cache depends {KERNEL_METAPACKAGE}:{ARCH}` names no linux-image-*-{ARCH} \
                 package:\n{output}"
            ),
            DebianError::Download { package, error } => {
                write!(f, "cannot download {package}: {error}")
            }
            DebianError::NoCandidate(package) => write!(
                f,
                "apt has no installable version of {package} (try `apt-get update`)"
            ),
            DebianError::MissingFile { package, path } => {
                write!(f, "{package} contains no {path}")
            }
            DebianError::NotElf(path) => write!(f, "{} is not an ELF executable", path.display()),
            DebianError::Kernel(error) => write!(f, "Debian's kernel: {error}"),
            DebianError::Io { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for DebianError {}

/// A Debian binary package at one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    /// Package name, without the architecture.
    pub name: String,
    /// Version, as apt prints it (`1:1.35.0-4+deb12u1+b1`).
    pub version: String,
}

impl Package {
    /// The cache directory's name: `<name>_<version>`, with characters that
    /// are awkward in paths (the epoch's `:`) replaced by `_`.
    pub fn cache_name(&self) -> String {
        let version: String = self
            .version
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "+.~-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{}_{version}", self.name)
    }
}

/// The fetched files.
#[derive(Clone, Debug)]
pub struct DebianFiles {
    /// The kernel package.
    pub kernel_package: Package,
    /// Its kernel as a raw arm64 `Image`.
    pub kernel_image: PathBuf,
    /// The busybox package.
    pub busybox_package: Package,
    /// Its static busybox executable.
    pub busybox: PathBuf,
    /// The guest's kernel modules (`.ko` files of the kernel package), in
    /// the order they load.
    pub modules: Vec<PathBuf>,
}

/// Where the downloads are cached.
pub fn cache_dir() -> PathBuf {
    crate::artifacts::workspace_root()
        .join("target")
        .join("linux")
}

fn run_captured(program: &str, args: &[&str]) -> Result<String, DebianError> {
    let command = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| DebianError::Spawn {
            command: command.clone(),
            error,
        })?;
    if !output.status.success() {
        return Err(DebianError::Failed {
            command,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs a command with its output on our stderr (apt's progress shows).
fn run_visible(program: &str, args: &[&str], dir: Option<&Path>) -> Result<(), DebianError> {
    let command = format!("{program} {}", args.join(" "));
    eprintln!("qemu-runner: $ {command}");
    let mut child = Command::new(program);
    child
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(std::io::stderr());
    if let Some(dir) = dir {
        child.current_dir(dir);
    }
    let status = child.status().map_err(|error| DebianError::Spawn {
        command: command.clone(),
        error,
    })?;
    if !status.success() {
        return Err(DebianError::Failed {
            command,
            status,
            stderr: String::new(),
        });
    }
    Ok(())
}

/// The kernel package named in `apt-cache depends` output
/// (`  Depends: linux-image-6.1.0-56-arm64:arm64`).
pub fn parse_kernel_dependency(depends_output: &str) -> Option<String> {
    depends_output.lines().find_map(|line| {
        let name = line.trim().strip_prefix("Depends:")?.trim();
        let name = name.strip_suffix(&format!(":{ARCH}")).unwrap_or(name);
        let abi = name.strip_prefix("linux-image-")?;
        (abi.ends_with(&format!("-{ARCH}")) && !name.contains(['<', '|', ' ']))
            .then(|| name.to_string())
    })
}

/// The candidate version in `apt-cache policy` output (`  Candidate: 6.1.192-2`).
pub fn parse_candidate(policy_output: &str) -> Option<String> {
    policy_output.lines().find_map(|line| {
        let version = line.trim().strip_prefix("Candidate:")?.trim();
        (!version.is_empty() && version != "(none)").then(|| version.to_string())
    })
}

fn foreign_architectures() -> Result<String, DebianError> {
    run_captured("dpkg", &["--print-foreign-architectures"])
}

/// The kernel package, after making sure apt knows arm64 packages.
fn resolve_kernel_package() -> Result<String, DebianError> {
    let metapackage = format!("{KERNEL_METAPACKAGE}:{ARCH}");
    let known = || -> Result<Option<String>, DebianError> {
        if !foreign_architectures()?.lines().any(|a| a.trim() == ARCH) {
            return Ok(None);
        }
        match run_captured("apt-cache", &["depends", &metapackage]) {
            Ok(output) => Ok(Some(
                parse_kernel_dependency(&output).ok_or(DebianError::NoKernelPackage(output))?,
            )),
            Err(DebianError::Failed { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    };
    if let Some(kernel) = known()? {
        return Ok(kernel);
    }
    if !crate::prereq::is_root() {
        return Err(DebianError::NotRoot {
            commands: format!("sudo dpkg --add-architecture {ARCH} && sudo apt-get update"),
        });
    }
    eprintln!("qemu-runner: teaching apt about {ARCH} packages");
    run_visible("dpkg", &["--add-architecture", ARCH], None)?;
    run_visible("apt-get", &["update"], None)?;
    known()?.ok_or_else(|| {
        DebianError::NoKernelPackage(format!("(apt-get update did not make {metapackage} known)"))
    })
}

fn candidate(name: &str) -> Result<Package, DebianError> {
    let qualified = format!("{name}:{ARCH}");
    let output = run_captured("apt-cache", &["policy", &qualified])?;
    let version = parse_candidate(&output).ok_or(DebianError::NoCandidate(qualified))?;
    Ok(Package {
        name: name.to_string(),
        version,
    })
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> DebianError {
    move |error| DebianError::Io { what, error }
}

/// Downloads `package` into `dir` and returns the `.deb`'s path.
fn download(package: &Package, dir: &Path) -> Result<PathBuf, DebianError> {
    let spec = format!("{}:{ARCH}={}", package.name, package.version);
    run_visible("apt-get", &["download", spec.as_str()], Some(dir)).map_err(|error| {
        DebianError::Download {
            package: spec.clone(),
            error: Box::new(error),
        }
    })?;
    let entries = std::fs::read_dir(dir).map_err(io(format!("listing {}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(io(format!("listing {}", dir.display())))?
            .path();
        let is_deb = path.extension().is_some_and(|e| e == "deb");
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        if is_deb && file_name.starts_with(&format!("{}_", package.name)) {
            return Ok(path);
        }
    }
    Err(DebianError::MissingFile {
        package: spec,
        path: format!("{}_*.deb after apt-get download", package.name),
    })
}

/// Extracts the files of `deb` matching the tar wildcard `pattern` into `dir`
/// and returns them.
fn extract(deb: &Path, pattern: &str, dir: &Path) -> Result<Vec<PathBuf>, DebianError> {
    let deb_command = format!("dpkg-deb --fsys-tarfile {}", deb.display());
    eprintln!("qemu-runner: extracting {pattern} from {}", deb.display());
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| DebianError::Spawn {
            command: deb_command.clone(),
            error,
        })?;
    let tar_command = format!("tar -x --wildcards {pattern}");
    let tar_status = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dir)
        .args(["--wildcards", pattern])
        .stdin(dpkg.stdout.take().expect("stdout is piped"))
        .status()
        .map_err(|error| DebianError::Spawn {
            command: tar_command.clone(),
            error,
        })?;
    let dpkg_status = dpkg.wait().map_err(|error| DebianError::Spawn {
        command: deb_command.clone(),
        error,
    })?;
    for (command, status) in [(deb_command, dpkg_status), (tar_command, tar_status)] {
        if !status.success() {
            return Err(DebianError::Failed {
                command,
                status,
                stderr: String::new(),
            });
        }
    }
    let (parent, wildcard) = pattern.rsplit_once('/').unwrap_or((".", pattern));
    let prefix = wildcard.trim_end_matches('*');
    let parent = dir.join(parent);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&parent).map_err(io(format!("listing {}", parent.display())))? {
        let path = entry
            .map_err(io(format!("listing {}", parent.display())))?
            .path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        {
            found.push(path);
        }
    }
    Ok(found)
}

/// Returns the cached `file_name` of `package`, producing it on a miss:
/// download, extract `member` (a tar wildcard), turn the bytes into the cached
/// file with `convert`.
fn cached(
    package: &Package,
    file_name: &str,
    member: &str,
    convert: impl FnOnce(Vec<u8>, &Path) -> Result<Vec<u8>, DebianError>,
) -> Result<PathBuf, DebianError> {
    let dir = cache_dir().join(package.cache_name());
    let path = dir.join(file_name);
    if path.is_file() {
        eprintln!(
            "qemu-runner: using cached {} {} ({})",
            package.name,
            package.version,
            path.display()
        );
        return Ok(path);
    }
    eprintln!(
        "qemu-runner: fetching {} {} for {ARCH} (cached in {} for later runs)",
        package.name,
        package.version,
        dir.display()
    );
    let scratch = ScratchDir::create(&cache_dir(), "download").map_err(io(format!(
        "creating a download directory in {}",
        cache_dir().display()
    )))?;
    let unpacked = scratch.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).map_err(io(format!("creating {}", unpacked.display())))?;
    let deb = download(package, scratch.path())?;
    let members = extract(&deb, member, &unpacked)?;
    let [source] = members.as_slice() else {
        return Err(DebianError::MissingFile {
            package: package.name.clone(),
            path: format!("exactly one {member} (found {})", members.len()),
        });
    };
    let bytes = std::fs::read(source).map_err(io(format!("reading {}", source.display())))?;
    let bytes = convert(bytes, source)?;
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let partial = dir.join(format!("{file_name}.partial"));
    std::fs::write(&partial, bytes).map_err(io(format!("writing {}", partial.display())))?;
    std::fs::rename(&partial, &path).map_err(io(format!("renaming to {}", path.display())))?;
    eprintln!("qemu-runner: cached {}", path.display());
    Ok(path)
}

static FETCH: Mutex<()> = Mutex::new(());

/// An exclusive `flock` on a file, released when dropped (the file closes).
struct FileLock {
    _held_open: File,
}

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock, DebianError> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io(format!("opening {}", path.display())))?;
        // SAFETY: flock only reads the descriptor, which `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(DebianError::Io {
                what: format!("locking {}", path.display()),
                error: std::io::Error::last_os_error(),
            });
        }
        Ok(FileLock { _held_open: file })
    }
}

/// Debian's current arm64 kernel (as an `Image`) and static busybox, from
/// the cache or fetched into it. When a download fails and we are root,
/// apt's package lists are refreshed and the packages' versions resolved
/// again before the one retry: lists from an earlier `apt-get update` may
/// name versions the archive has since replaced.
pub fn fetch() -> Result<DebianFiles, DebianError> {
    let _in_process = FETCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let _across_processes = FileLock::acquire(&dir.join(".lock"))?;
    match fetch_current() {
        Err(error @ DebianError::Download { .. }) if crate::prereq::is_root() => {
            eprintln!("qemu-runner: {error}; refreshing apt's lists and retrying");
            run_visible("apt-get", &["update"], None)?;
            fetch_current()
        }
        other => other,
    }
}

/// The candidate versions of the kernel and busybox, from the cache or
/// downloaded.
fn fetch_current() -> Result<DebianFiles, DebianError> {
    let kernel_package = candidate(&resolve_kernel_package()?)?;
    let busybox_package = candidate(BUSYBOX_PACKAGE)?;
    let kernel_image = cached(&kernel_package, "Image", "./boot/vmlinuz-*", |bytes, _| {
        kernel_image(bytes).map_err(DebianError::Kernel)
    })?;
    let busybox = cached(
        &busybox_package,
        "busybox",
        "./bin/busybox",
        |bytes, source| {
            if bytes.starts_with(b"\x7fELF") {
                Ok(bytes)
            } else {
                Err(DebianError::NotElf(source.to_path_buf()))
            }
        },
    )?;
    let modules = cached_modules(&kernel_package)?;
    Ok(DebianFiles {
        kernel_package,
        kernel_image,
        busybox_package,
        busybox,
        modules,
    })
}

/// File in the modules' cache directory that lists them in load order.
const LOAD_ORDER_FILE: &str = "load-order";
/// File in the modules' cache directory that holds [`wanted_modules`] as
/// they were when it was made.
const WANTED_FILE: &str = "wanted";

/// The module lists the cache is made for: the required modules on one
/// line, the optional ones on the next.
fn wanted_modules() -> String {
    format!(
        "{}\n{}\n",
        GUEST_MODULES.join(" "),
        OPTIONAL_GUEST_MODULES.join(" ")
    )
}

/// The guest's modules of the kernel `package`, in load order, from the
/// cache or extracted into it (see the module doc).
fn cached_modules(package: &Package) -> Result<Vec<PathBuf>, DebianError> {
    let dir = cache_dir().join(package.cache_name()).join("modules");
    let listed = |dir: &Path| -> Result<Vec<PathBuf>, DebianError> {
        let list = dir.join(LOAD_ORDER_FILE);
        let text =
            std::fs::read_to_string(&list).map_err(io(format!("reading {}", list.display())))?;
        Ok(text
            .lines()
            .filter(|name| !name.is_empty())
            .map(|name| dir.join(format!("{name}.ko")))
            .collect())
    };
    let wanted = wanted_modules();
    let current = std::fs::read_to_string(dir.join(WANTED_FILE)).is_ok_and(|text| text == wanted);
    if current && dir.join(LOAD_ORDER_FILE).is_file() {
        return listed(&dir);
    }
    eprintln!(
        "qemu-runner: fetching {} {} for its modules (cached in {})",
        package.name,
        package.version,
        dir.display()
    );
    let scratch = ScratchDir::create(&cache_dir(), "download").map_err(io(format!(
        "creating a download directory in {}",
        cache_dir().display()
    )))?;
    let unpacked = scratch.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).map_err(io(format!("creating {}", unpacked.display())))?;
    let deb = download(package, scratch.path())?;
    let versions = extract(&deb, "./lib/modules/*", &unpacked)?;
    let [version] = versions.as_slice() else {
        return Err(DebianError::MissingFile {
            package: package.name.clone(),
            path: format!(
                "exactly one lib/modules/<version> (found {})",
                versions.len()
            ),
        });
    };
    let mut files = BTreeMap::new();
    let mut infos = BTreeMap::new();
    let mut compressed = 0;
    let mut pending = vec![version.join("kernel")];
    while let Some(folder) = pending.pop() {
        let entries =
            std::fs::read_dir(&folder).map_err(io(format!("listing {}", folder.display())))?;
        for entry in entries {
            let path = entry
                .map_err(io(format!("listing {}", folder.display())))?
                .path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let file_name = path.file_name().unwrap_or_default().to_string_lossy();
            let Some(stem) = file_name.strip_suffix(".ko") else {
                if [".ko.xz", ".ko.zst", ".ko.gz"]
                    .iter()
                    .any(|suffix| file_name.ends_with(suffix))
                {
                    compressed += 1;
                }
                continue;
            };
            let bytes = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
            let mut info = ModInfo::read(&bytes).map_err(|why| DebianError::MissingFile {
                package: package.name.clone(),
                path: format!("a readable module at {}: {why}", path.display()),
            })?;
            if info.name.is_empty() {
                info.name = module_name(stem);
            }
            files.insert(info.name.clone(), path.clone());
            infos.insert(info.name.clone(), info);
        }
    }
    let order = load_order(GUEST_MODULES, OPTIONAL_GUEST_MODULES, &infos).map_err(|why| {
        DebianError::MissingFile {
            package: package.name.clone(),
            path: if compressed > 0 {
                format!(
                    "the guest's modules as plain .ko files ({why}); {compressed} modules are \
                 compressed (.ko.xz/.ko.zst/.ko.gz), which the runner does not unpack yet"
                )
            } else {
                format!("the guest's modules: {why}")
            },
        }
    })?;
    let partial = dir.with_file_name("modules.partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(format!("removing {}", partial.display())))?;
    }
    std::fs::create_dir_all(&partial).map_err(io(format!("creating {}", partial.display())))?;
    for name in &order {
        let target = partial.join(format!("{name}.ko"));
        std::fs::copy(&files[name], &target)
            .map_err(io(format!("writing {}", target.display())))?;
    }
    let list = partial.join(LOAD_ORDER_FILE);
    std::fs::write(&list, order.join("\n") + "\n")
        .map_err(io(format!("writing {}", list.display())))?;
    let wanted_file = partial.join(WANTED_FILE);
    std::fs::write(&wanted_file, wanted)
        .map_err(io(format!("writing {}", wanted_file.display())))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(format!("removing {}", dir.display())))?;
    }
    std::fs::rename(&partial, &dir).map_err(io(format!("renaming to {}", dir.display())))?;
    eprintln!(
        "qemu-runner: cached the guest's modules ({}) in {}",
        order.join(" "),
        dir.display()
    );
    listed(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_package_comes_from_the_metapackage() {
        let output = "linux-image-arm64:arm64\n  Depends: linux-image-6.1.0-56-arm64:arm64\n";
        assert_eq!(
            parse_kernel_dependency(output).as_deref(),
            Some("linux-image-6.1.0-56-arm64")
        );
        let newer = "linux-image-arm64\n  Depends: linux-image-6.12.9+deb13-arm64\n";
        assert_eq!(
            parse_kernel_dependency(newer).as_deref(),
            Some("linux-image-6.12.9+deb13-arm64")
        );
        assert_eq!(
            parse_kernel_dependency("linux-image-arm64\n  Depends: <linux-image-x-arm64>\n"),
            None
        );
        assert_eq!(
            parse_kernel_dependency("linux-image-arm64\n  Recommends: firmware\n"),
            None
        );
    }

    #[test]
    fn candidate_versions_are_read() {
        let policy =
            "busybox-static:arm64:\n  Installed: (none)\n  Candidate: 1:1.35.0-4+deb12u1+b1\n";
        assert_eq!(
            parse_candidate(policy).as_deref(),
            Some("1:1.35.0-4+deb12u1+b1")
        );
        assert_eq!(parse_candidate("x:\n  Candidate: (none)\n"), None);
        assert_eq!(parse_candidate(""), None);
    }

    #[test]
    fn cache_names_are_path_safe() {
        let package = Package {
            name: "busybox-static".into(),
            version: "1:1.35.0-4+deb12u1+b1".into(),
        };
        assert_eq!(package.cache_name(), "busybox-static_1_1.35.0-4+deb12u1+b1");
    }
}
