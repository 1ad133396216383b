//! Booting the hypervisor through U-Boot, as an Arm board does.
//!
//! With `--firmware u-boot` QEMU starts Debian's U-Boot for the `virt`
//! machine (`-bios` [`UBOOT_BIN`], package [`UBOOT_PACKAGE`]) instead of
//! entering the hypervisor itself. Under `virtualization=on` U-Boot runs at
//! EL2, and `booti` enters the hypervisor's `Image` at EL2 with the device
//! tree in `x0`, after writing `/chosen/linux,initrd-start`/`-end` for the
//! payload, exactly as a board's U-Boot does.
//!
//! U-Boot is driven without typing, by its environment, the way a board keeps
//! a `saveenv`d `bootcmd`: the Debian build (`qemu_arm64_defconfig`) keeps its
//! environment in the second flash bank of `virt` (`CONFIG_ENV_IS_IN_FLASH`,
//! `CONFIG_ENV_ADDR=0x4000000`, `CONFIG_ENV_SIZE=0x40000`, not redundant).
//! [`environment_image`] writes that format: a little-endian CRC-32 (IEEE) of
//! the data, then `name=value` strings each ending in NUL, an empty string
//! after the last, NUL padding to the size. The runner gives QEMU a 64 MiB
//! flash image (the bank's size; sparse on disk) holding it, read-only
//! (`-drive if=pflash,unit=1`). U-Boot then boots with [`environment`] instead
//! of its built-in one, which it would only fall back to on a bad CRC.
//!
//! The environment's `bootcmd` ([`BOOT_COMMAND`]) copies the hypervisor and
//! the payload, which QEMU holds in its fw_cfg device from `-kernel` and
//! `-initrd`, into RAM with `qfw load` (on a board: `load mmc ...`), then
//! `booti`s the hypervisor with the payload as initrd (`qfw load` sets
//! `filesize` to the initrd's size) and the device tree QEMU made (at
//! `fdt_addr`, the base of RAM). `fdt_high` and `initrd_high` of all ones
//! keep both where they are: without them `booti` copies them to the top of
//! RAM under U-Boot, where they would split the free RAM the hypervisor hands
//! to guests. The command prints [`START_MARKER`] first, and
//! [`FAILED_MARKER`] when loading or `booti` fails (U-Boot then waits at its
//! prompt; the runner stops QEMU).

use std::io;
use std::path::{Path, PathBuf};

/// Debian's U-Boot for QEMU's arm64 `virt` machine.
pub const UBOOT_BIN: &str = "/usr/lib/u-boot/qemu_arm64/u-boot.bin";
/// The Debian package that provides it.
pub const UBOOT_PACKAGE: &str = "u-boot-qemu";

/// Where the hypervisor `Image` is loaded (2 MiB aligned: `booti` runs an
/// `Image` whose header says "anywhere" at the 2 MiB boundary at or above
/// its load address, plus `text_offset`).
pub const KERNEL_ADDR: u64 = 0x4040_0000;
/// Where the boot payload is loaded: 60 MiB above the hypervisor, room for
/// its `image_size` (`.bss` included).
pub const RAMDISK_ADDR: u64 = 0x4400_0000;
/// Where QEMU puts the device tree when firmware boots the machine (the
/// base of RAM; U-Boot's `fdt_addr`).
pub const FDT_ADDR: u64 = 0x4000_0000;

/// `CONFIG_ENV_SIZE` of Debian's `qemu_arm64` U-Boot.
pub const ENV_SIZE: usize = 0x4_0000;
/// Size of a `virt` flash bank, which QEMU requires of a flash image.
pub const FLASH_BANK_SIZE: u64 = 64 << 20;

/// What U-Boot prints before it loads anything (the start of
/// [`BOOT_COMMAND`]).
pub const START_MARKER: &str = "[u-boot] loading the hypervisor";
/// What U-Boot prints when the boot command failed.
pub const FAILED_MARKER: &str = "[u-boot] ERROR: the boot command failed";
/// How U-Boot's banner line starts.
pub const BANNER_PREFIX: &str = "U-Boot ";
/// Prefix of every line the boot command prints.
pub const UBOOT_PREFIX: &str = "[u-boot] ";

/// U-Boot's `bootcmd`: load both files from fw_cfg, `booti`, and report a
/// failure of either.
pub const BOOT_COMMAND: &str = "echo [u-boot] loading the hypervisor to ${kernel_addr_r} and the \
     payload to ${ramdisk_addr_r}; qfw load ${kernel_addr_r} ${ramdisk_addr_r} && booti \
     ${kernel_addr_r} ${ramdisk_addr_r}:${filesize} ${fdt_addr}; echo [u-boot] ERROR: the boot \
     command failed";

/// The files QEMU needs to start U-Boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UBootFiles {
    /// U-Boot itself (`-bios`).
    pub bios: PathBuf,
    /// The flash image holding its environment (second flash bank).
    pub environment: PathBuf,
}

/// The environment U-Boot boots with: the load addresses, no relocation of
/// the device tree and initrd, no autoboot delay, and [`BOOT_COMMAND`].
pub fn environment() -> Vec<(&'static str, String)> {
    vec![
        ("bootdelay", "0".into()),
        ("kernel_addr_r", format!("{KERNEL_ADDR:#x}")),
        ("ramdisk_addr_r", format!("{RAMDISK_ADDR:#x}")),
        ("fdt_addr", format!("{FDT_ADDR:#x}")),
        ("fdt_high", "0xffffffffffffffff".into()),
        ("initrd_high", "0xffffffffffffffff".into()),
        ("bootcmd", BOOT_COMMAND.into()),
    ]
}

/// Why an environment could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvError {
    /// A name is empty or holds `=` or NUL, or a value holds NUL.
    BadVariable(String),
    /// The variables do not fit in [`ENV_SIZE`].
    TooBig(usize),
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvError::BadVariable(name) => write!(f, "U-Boot variable {name:?} cannot be stored"),
            EnvError::TooBig(bytes) => write!(
                f,
                "U-Boot environment of {bytes} bytes does not fit in {ENV_SIZE} bytes"
            ),
        }
    }
}

impl std::error::Error for EnvError {}

/// The environment as U-Boot stores it: CRC-32 of the data (little-endian),
/// then the data, [`ENV_SIZE`] bytes in all.
pub fn environment_image(vars: &[(&str, String)]) -> Result<Vec<u8>, EnvError> {
    let mut data = Vec::new();
    for (name, value) in vars {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(EnvError::BadVariable(name.to_string()));
        }
        data.extend_from_slice(name.as_bytes());
        data.push(b'=');
        data.extend_from_slice(value.as_bytes());
        data.push(0);
    }
    data.push(0);
    let data_size = ENV_SIZE - 4;
    if data.len() > data_size {
        return Err(EnvError::TooBig(data.len() + 4));
    }
    data.resize(data_size, 0);
    let mut crc = flate2::Crc::new();
    crc.update(&data);
    let mut image = crc.sum().to_le_bytes().to_vec();
    image.extend_from_slice(&data);
    Ok(image)
}

/// Writes the flash image holding [`environment`] to `path`: the
/// environment at its start, the rest of the [`FLASH_BANK_SIZE`] bank a hole.
pub fn write_flash_image(path: &Path) -> io::Result<()> {
    let image = environment_image(&environment())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
    let file = std::fs::File::create(path)?;
    io::Write::write_all(&mut &file, &image)?;
    file.set_len(FLASH_BANK_SIZE)
}

/// Where `booti` (with [`KERNEL_ADDR`]) runs an `Image` whose header says it
/// may be placed anywhere: the next 2 MiB boundary plus `text_offset`.
pub fn load_address(text_offset: u64) -> u64 {
    KERNEL_ADDR.next_multiple_of(2 << 20) + text_offset
}

/// QEMU's `-drive` option value for a flash bank holding `file` (commas in
/// the path are doubled, as QEMU's option syntax wants).
pub fn pflash_drive(file: &Path) -> String {
    format!(
        "if=pflash,unit=1,format=raw,readonly=on,file={}",
        file.display().to_string().replace(',', ",,")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(image: &[u8]) -> Vec<String> {
        image[4..]
            .split(|&b| b == 0)
            .take_while(|s| !s.is_empty())
            .map(|s| String::from_utf8(s.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn the_environment_has_u_boots_layout_and_crc() {
        let image = environment_image(&environment()).unwrap();
        assert_eq!(image.len(), ENV_SIZE);
        let mut crc = flate2::Crc::new();
        crc.update(&image[4..]);
        assert_eq!(image[..4], crc.sum().to_le_bytes());
        let vars = strings(&image);
        assert_eq!(vars[0], "bootdelay=0");
        assert!(vars.contains(&"kernel_addr_r=0x40400000".to_string()));
        assert!(vars.contains(&"ramdisk_addr_r=0x44000000".to_string()));
        assert!(vars.contains(&"fdt_high=0xffffffffffffffff".to_string()));
        assert!(
            vars.last()
                .unwrap()
                .starts_with("bootcmd=echo [u-boot] loading")
        );
    }

    #[test]
    fn a_known_crc() {
        // CRC-32 (IEEE) of "123456789", the usual check value.
        let mut crc = flate2::Crc::new();
        crc.update(b"123456789");
        assert_eq!(crc.sum(), 0xcbf4_3926);
    }

    #[test]
    fn bad_environments_are_refused() {
        assert_eq!(
            environment_image(&[("a=b", "c".into())]),
            Err(EnvError::BadVariable("a=b".into()))
        );
        assert_eq!(
            environment_image(&[("", "c".into())]),
            Err(EnvError::BadVariable(String::new()))
        );
        assert!(matches!(
            environment_image(&[("big", "x".repeat(ENV_SIZE))]),
            Err(EnvError::TooBig(_))
        ));
    }

    #[test]
    fn the_boot_command_loads_boots_and_reports_failure() {
        let load = BOOT_COMMAND.find("qfw load").unwrap();
        let boot = BOOT_COMMAND.find("&& booti").unwrap();
        let failed = BOOT_COMMAND.find(FAILED_MARKER).unwrap();
        assert!(BOOT_COMMAND.starts_with(&format!("echo {START_MARKER}")));
        assert!(load < boot && boot < failed);
        assert!(BOOT_COMMAND.contains("${ramdisk_addr_r}:${filesize} ${fdt_addr}"));
        assert!(START_MARKER.starts_with(UBOOT_PREFIX) && FAILED_MARKER.starts_with(UBOOT_PREFIX));
    }

    #[test]
    fn the_hypervisor_runs_where_it_is_loaded() {
        assert_eq!(load_address(0), KERNEL_ADDR);
        assert_eq!(load_address(0x8_0000), 0x4048_0000);
        const { assert!(RAMDISK_ADDR > KERNEL_ADDR + (32 << 20)) };
    }

    #[test]
    fn the_flash_image_is_a_whole_bank() {
        let dir = std::env::temp_dir().join(format!("uboot-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("env,flash.img");
        write_flash_image(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, FLASH_BANK_SIZE);
        assert_eq!(
            bytes[..ENV_SIZE],
            environment_image(&environment()).unwrap()[..]
        );
        assert!(pflash_drive(&path).ends_with("env,,flash.img"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
