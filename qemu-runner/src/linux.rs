//! Linux guests: what to boot, the kernel command line, and the kernel file.
//!
//! A [`LinuxBoot`] names the kernel (Debian's, fetched by [`crate::debian`],
//! or any file), the initrd (a busybox initramfs built by
//! [`crate::initramfs`], any file, or none) and the command line. The
//! runner resolves it into bytes ([`resolve`]) and boots them under the
//! hypervisor (payload `kernel`, `initrd`, `cmdline`, `vm.conf`) or directly
//! with QEMU `-kernel/-initrd/-append`.
//!
//! Kernel files: an arm64 `Image` is used as it is (its header's magic
//! `ARM\x64` at 0x38 is checked); a gzip-compressed one (`vmlinuz` on some
//! releases) is decompressed first, and the result must be an `Image`. A
//! file given with `--kernel` that has no header is a raw binary, which QEMU
//! and the hypervisor both load 512 KiB into RAM and enter with the device
//! tree in `x0` (bare-metal test suites ship so); an ELF file is refused, as
//! neither would start it at its entry point.
//!
//! Command lines: the console is the PL011 (`console=ttyAMA0 earlycon`),
//! `/init` of the initramfs runs as PID 1 (`rdinit=/init`). The test init
//! boots with `loglevel=5`: every console byte costs a trap under the
//! hypervisor, so the kernel's informational lines stay off the console,
//! while warnings, errors, oopses and panics (levels 0 to 4) still show and
//! fail the run.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::initramfs::{self, GuestModule, Init};
use boot_payload::image::{ImageError, ImageHeader, KernelFormat, has_image_magic, parse_kernel};

/// The gzip magic.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Largest decompressed kernel accepted.
const MAX_KERNEL_SIZE: u64 = 512 << 20;

/// Where the guest kernel comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// Debian's current arm64 kernel (`linux-image-arm64`), fetched and cached.
    Debian,
    /// A file: an arm64 `Image`, or a gzip-compressed one.
    File(PathBuf),
}

/// Where the guest's initrd comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitrdSource {
    /// No initrd.
    None,
    /// A busybox initramfs built from Debian's `busybox-static`.
    Busybox(BusyboxInit),
    /// A file, passed through unchanged.
    File(PathBuf),
}

/// Which `/init` a built busybox initramfs runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyboxInit {
    /// An interactive shell on the console.
    Shell,
    /// The unattended check ([`Init::Test`]), expecting every vCPU online.
    Test,
}

/// A Linux guest to boot instead of the test guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxBoot {
    /// The kernel.
    pub kernel: KernelSource,
    /// The initrd.
    pub initrd: InitrdSource,
    /// The kernel command line; [`default_cmdline`] when `None`.
    pub cmdline: Option<String>,
}

impl LinuxBoot {
    /// Debian's kernel with a busybox initramfs running `init`.
    pub fn debian(init: BusyboxInit) -> LinuxBoot {
        LinuxBoot {
            kernel: KernelSource::Debian,
            initrd: InitrdSource::Busybox(init),
            cmdline: None,
        }
    }

    /// Whether the guest prints a `RESULT:` verdict of its own (the test
    /// init); a shell or files given by the user may not.
    pub fn reports_result(&self) -> bool {
        self.initrd == InitrdSource::Busybox(BusyboxInit::Test)
    }

    /// The command line the guest boots with.
    pub fn effective_cmdline(&self) -> String {
        self.cmdline
            .clone()
            .unwrap_or_else(|| default_cmdline(&self.initrd))
    }
}

/// The default kernel command line for a guest with `initrd`.
pub fn default_cmdline(initrd: &InitrdSource) -> String {
    let base = "console=ttyAMA0 earlycon rdinit=/init";
    match initrd {
        InitrdSource::Busybox(BusyboxInit::Test) => format!("{base} loglevel=5"),
        InitrdSource::None | InitrdSource::Busybox(BusyboxInit::Shell) | InitrdSource::File(_) => {
            base.to_string()
        }
    }
}

/// Why a kernel file is not usable.
#[derive(Debug)]
pub enum KernelImageError {
    /// gzip data that does not decompress.
    Gzip(std::io::Error),
    /// Decompressed, it is larger than 512 MiB.
    TooLarge,
    /// Not an arm64 `Image` (no `ARM\x64` at 0x38), compressed or not.
    NotAnImage {
        /// Whether it was gzip-compressed.
        was_gzip: bool,
    },
    /// An ELF file, neither an `Image` nor a raw binary.
    Elf,
    /// An `Image` whose header is invalid.
    Header(ImageError),
    /// An empty file.
    Empty,
}

impl fmt::Display for KernelImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelImageError::Gzip(error) => write!(f, "gzip-compressed but corrupt: {error}"),
            KernelImageError::TooLarge => write!(f, "decompresses to more than 512 MiB"),
            KernelImageError::NotAnImage { was_gzip } => write!(
                f,
                "{}not an arm64 Image (no \"ARM\\x64\" magic at 0x38)",
                if *was_gzip {
                    "decompressed, it is "
                } else {
                    ""
                }
            ),
            KernelImageError::Elf => write!(
                f,
                "an ELF file; give an arm64 Image or a raw binary (objcopy -O binary)"
            ),
            KernelImageError::Empty => write!(f, "the file is empty"),
            KernelImageError::Header(error) => write!(f, "bad Image header: {error}"),
        }
    }
}

impl std::error::Error for KernelImageError {}

/// The raw arm64 `Image` in `bytes`: itself, or decompressed when it is gzip.
pub fn kernel_image(bytes: Vec<u8>) -> Result<Vec<u8>, KernelImageError> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return if has_image_magic(&bytes) {
            Ok(bytes)
        } else {
            Err(KernelImageError::NotAnImage { was_gzip: false })
        };
    }
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(MAX_KERNEL_SIZE + 1)
        .read_to_end(&mut image)
        .map_err(KernelImageError::Gzip)?;
    if image.len() as u64 > MAX_KERNEL_SIZE {
        return Err(KernelImageError::TooLarge);
    }
    if has_image_magic(&image) {
        Ok(image)
    } else {
        Err(KernelImageError::NotAnImage { was_gzip: true })
    }
}

/// A kernel file given by the user: an `Image` (decompressed when gzip) or
/// a raw binary; an ELF or empty file is refused. The hypervisor reads it
/// with the same parser ([`parse_kernel`]).
pub fn user_kernel(bytes: Vec<u8>) -> Result<(Vec<u8>, KernelFormat), KernelImageError> {
    let bytes = if bytes.starts_with(&GZIP_MAGIC) {
        kernel_image(bytes)?
    } else {
        bytes
    };
    match parse_kernel(&bytes) {
        Ok((_, format)) => Ok((bytes, format)),
        Err(ImageError::Elf) => Err(KernelImageError::Elf),
        Err(ImageError::TooShort(0)) => Err(KernelImageError::Empty),
        Err(error) => Err(KernelImageError::Header(error)),
    }
}

/// Why a Linux guest's files could not be had.
#[derive(Debug)]
pub enum LinuxError {
    /// Fetching from Debian failed.
    Debian(crate::debian::DebianError),
    /// A given file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The kernel file is not usable.
    Kernel {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: KernelImageError,
    },
    /// The kernel's header is malformed.
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: ImageError,
    },
}

impl fmt::Display for LinuxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinuxError::Debian(error) => write!(f, "{error}"),
            LinuxError::Read { path, error } => write!(f, "reading {}: {error}", path.display()),
            LinuxError::Kernel { path, error } => write!(f, "kernel {}: {error}", path.display()),
            LinuxError::Header { path, error } => {
                write!(f, "kernel {}: bad Image header: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for LinuxError {}

/// A Linux guest's files, in memory.
#[derive(Clone, Debug)]
pub struct LinuxFiles {
    /// Where the kernel came from.
    pub kernel_path: PathBuf,
    /// The kernel: an arm64 `Image`, or a raw binary.
    pub kernel: Vec<u8>,
    /// Which of the two.
    pub kernel_format: KernelFormat,
    /// The initrd, if any.
    pub initrd: Option<Vec<u8>>,
    /// The kernel command line.
    pub cmdline: String,
}

fn read(path: &Path) -> Result<Vec<u8>, LinuxError> {
    std::fs::read(path).map_err(|error| LinuxError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// Reads, fetches and builds what `boot` names; a test initramfs expects
/// `cpus` CPUs online.
pub fn resolve(boot: &LinuxBoot, cpus: u32) -> Result<LinuxFiles, LinuxError> {
    let needs_debian =
        boot.kernel == KernelSource::Debian || matches!(boot.initrd, InitrdSource::Busybox(_));
    let debian = if needs_debian {
        Some(crate::debian::fetch().map_err(LinuxError::Debian)?)
    } else {
        None
    };
    let kernel_path = match (&boot.kernel, &debian) {
        (KernelSource::File(path), _) => path.clone(),
        (KernelSource::Debian, Some(debian)) => debian.kernel_image.clone(),
        (KernelSource::Debian, None) => unreachable!("fetched above"),
    };
    let kernel_error = |error| LinuxError::Kernel {
        path: kernel_path.clone(),
        error,
    };
    let (kernel, kernel_format) = match boot.kernel {
        KernelSource::File(_) => user_kernel(read(&kernel_path)?).map_err(kernel_error)?,
        KernelSource::Debian => (
            kernel_image(read(&kernel_path)?).map_err(kernel_error)?,
            KernelFormat::Image,
        ),
    };
    match kernel_format {
        KernelFormat::Image => {
            ImageHeader::parse(&kernel).map_err(|error| LinuxError::Header {
                path: kernel_path.clone(),
                error,
            })?;
        }
        KernelFormat::RawBinary => eprintln!(
            "qemu-runner: {} has no arm64 Image header: booting it as a raw binary (loaded \
             512 KiB into RAM, entered at its first byte, device tree in x0)",
            kernel_path.display()
        ),
    }
    let initrd = match (&boot.initrd, &debian) {
        (InitrdSource::None, _) => None,
        (InitrdSource::File(path), _) => Some(read(path)?),
        (InitrdSource::Busybox(init), Some(debian)) => {
            let init = match init {
                BusyboxInit::Shell => Init::Shell,
                BusyboxInit::Test => Init::Test { cpus },
            };
            let mut modules = Vec::new();
            for path in &debian.modules {
                modules.push(GuestModule {
                    name: path
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    bytes: read(path)?,
                });
            }
            Some(initramfs::build(&read(&debian.busybox)?, init, &modules))
        }
        (InitrdSource::Busybox(_), None) => unreachable!("fetched above"),
    };
    Ok(LinuxFiles {
        kernel_path,
        kernel,
        kernel_format,
        initrd,
        cmdline: boot.effective_cmdline(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use boot_payload::image::{MAGIC, MAGIC_OFFSET};
    use std::io::Write;

    fn fake_image() -> Vec<u8> {
        let mut image = vec![0u8; 4096];
        image[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&MAGIC);
        image[100] = 0xAB;
        image
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn images_pass_and_gzip_images_are_decompressed() {
        assert_eq!(kernel_image(fake_image()).unwrap(), fake_image());
        assert_eq!(kernel_image(gzip(&fake_image())).unwrap(), fake_image());
    }

    #[test]
    fn other_files_are_rejected() {
        assert!(matches!(
            kernel_image(vec![0; 4096]),
            Err(KernelImageError::NotAnImage { was_gzip: false })
        ));
        assert!(matches!(
            kernel_image(gzip(&[0; 4096])),
            Err(KernelImageError::NotAnImage { was_gzip: true })
        ));
        let mut corrupt = gzip(&fake_image());
        corrupt.truncate(corrupt.len() / 2);
        assert!(matches!(
            kernel_image(corrupt),
            Err(KernelImageError::Gzip(_))
        ));
        assert!(matches!(
            kernel_image(b"short".to_vec()),
            Err(KernelImageError::NotAnImage { .. })
        ));
    }

    #[test]
    fn user_kernels_may_be_raw_binaries_but_not_elf_or_empty_files() {
        assert_eq!(
            user_kernel(fake_image()).unwrap(),
            (fake_image(), KernelFormat::Image)
        );
        assert_eq!(
            user_kernel(gzip(&fake_image())).unwrap(),
            (fake_image(), KernelFormat::Image)
        );
        let raw = vec![0x00, 0x00, 0x00, 0x14];
        assert_eq!(
            user_kernel(raw.clone()).unwrap(),
            (raw, KernelFormat::RawBinary)
        );
        assert!(matches!(
            user_kernel(b"\x7fELF\x02\x01".to_vec()),
            Err(KernelImageError::Elf)
        ));
        assert!(matches!(
            user_kernel(Vec::new()),
            Err(KernelImageError::Empty)
        ));
        assert!(
            matches!(
                user_kernel(gzip(&[0; 64])),
                Err(KernelImageError::NotAnImage { was_gzip: true })
            ),
            "compressed kernels must be Images"
        );
    }

    #[test]
    fn command_lines_default_per_init() {
        let test = LinuxBoot::debian(BusyboxInit::Test);
        assert_eq!(
            test.effective_cmdline(),
            "console=ttyAMA0 earlycon rdinit=/init loglevel=5"
        );
        assert!(test.reports_result());
        let shell = LinuxBoot::debian(BusyboxInit::Shell);
        assert_eq!(
            shell.effective_cmdline(),
            "console=ttyAMA0 earlycon rdinit=/init"
        );
        assert!(!shell.reports_result());
        let custom = LinuxBoot {
            cmdline: Some("console=ttyAMA0 init=/bin/sh".into()),
            ..shell
        };
        assert_eq!(custom.effective_cmdline(), "console=ttyAMA0 init=/bin/sh");
    }
}
