//! The optional `vm.conf` payload entry: `key=value` lines.
//!
//! Known keys:
//!
//! | key | value | default |
//! |---|---|---|
//! | `vcpus` | number of vCPUs, a positive decimal number | one per CPU of `cpus`, else one per host CPU |
//! | `mem_mib` | guest RAM in MiB, a positive decimal number | [`DEFAULT_MEM_MIB`] |
//! | `cpus` | the physical CPUs that run the vCPUs, a CPU list ([`crate::cpuset`]), one vCPU per CPU | every host CPU |
//! | `control` | `1`: the VM may use the hypervisor's control interface; `0`: it may not | `0` |
//! | `start` | `0`: the VM is created but does not boot: it waits as the destination of a live migration; `1`: it boots | `1` |
//! | `net` | the network (switch) the VM's virtio-net is on, a name by the rules of VM names ([`crate::vmname`]); VMs that name the same network share one L2 segment | no virtio-net |
//! | `mac` | the virtio-net's MAC address, six hex bytes `52:54:00:12:34:56`, unicast (bit 0 of the first byte clear) | [`default_mac`] of the VM's name |
//! | `disk` | `N`, `N@START`, `N@START+SECTORS`, each optionally followed by `:ro`: the VM's virtio-blk serves host disk `N` (0 = the first disk the runner gave QEMU), from 512-byte sector `START` (default 0) for `SECTORS` sectors (default: to the disk's end); `:ro` makes it read-only ([`DiskConf`]) | no virtio-blk |
//! | `console` | `pl011`: the VM's console is the PL011 only; `virtio`: it also gets a virtio-console (Linux `hvc0`), and a `control=1` VM a second one wired to the monitor (`hvc1`) ([`ConsoleKind`]) | `pl011` |
//! | `device` | a host device-tree node the VM owns (passthrough), by its full path, e.g. `/virtio_mmio@a003e00`; repeatable, at most [`MAX_DEVICES`] ([`DevicePath`]) | none |
//! | `ram` | `identity`: the VM's RAM sits at the guest-physical address equal to its host-physical one, for devices that do DMA without an IOMMU ([`RamPlacement`]) | `fixed`: RAM at the guest address `0x4000_0000` |
//! | `mte` | `on`: the guest may use memory tagging (FEAT_MTE2), which the host must have; `off`: the feature is hidden | `off` |
//!
//! Blank lines and lines starting with `#` are skipped; spaces around keys
//! and values are ignored. An unknown key, a repeated key (but `device`) or a bad value is
//! an error, and so is a `vcpus` that disagrees with the size of `cpus`, so a
//! typo never goes unnoticed.
//! [`VmConf::to_text`] writes the keys that are set, one per line, and
//! [`VmConf::parse`] reads them back.

use alloc::format;
use alloc::string::String;

use crate::cpuset::{CpuListError, CpuSet};
use crate::vmname::{VmName, VmNameError};

/// Guest RAM when `vm.conf` does not say.
pub const DEFAULT_MEM_MIB: u64 = 128;

/// Why `vm.conf` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmConfError {
    /// The file is not UTF-8.
    NotText,
    /// Line `.0` has no `=`.
    NoEquals(usize),
    /// Line `.0` names an unknown key.
    UnknownKey(usize),
    /// Line `.0` has a value that is not a positive number.
    BadValue(usize),
    /// Line `.0` sets a key an earlier line set.
    RepeatedKey(usize),
    /// Line `.0` has a `cpus` value that is not a CPU list.
    BadCpus(usize, CpuListError),
    /// Line `.0` has a `control` or `start` value other than `0` or `1`.
    BadFlag(usize),
    /// Line `.0` has a `net` value that is not a valid name.
    BadNet(usize, VmNameError),
    /// Line `.0` has a `mac` value that is not six hex bytes of a unicast
    /// address.
    BadMac(usize),
    /// Line `.0` has a `disk` value that does not parse (what is wrong).
    BadDisk(usize, &'static str),
    /// Line `.0` has a `console` value other than `pl011` or `virtio`.
    BadConsole(usize),
    /// Line `.0` has a `device` value that is not a device-tree path (why).
    BadDevice(usize, &'static str),
    /// Line `.0` is a `device` line past the [`MAX_DEVICES`]th.
    TooManyDevices(usize),
    /// Line `.0` has a `ram` value other than `identity` or `fixed`.
    BadRam(usize),
    /// Line `.0` has an `mte` value other than `on` or `off`.
    BadMte(usize),
    /// `vcpus` is not the number of CPUs `cpus` names.
    VcpusDisagree {
        /// The `vcpus` value.
        vcpus: u32,
        /// How many CPUs `cpus` names.
        cpus: u32,
    },
}

impl core::error::Error for VmConfError {}

impl core::fmt::Display for VmConfError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotText => write!(f, "vm.conf is not UTF-8 text"),
            Self::NoEquals(l) => write!(f, "vm.conf line {l}: expected key=value"),
            Self::UnknownKey(l) => {
                write!(
                    f,
                    "vm.conf line {l}: unknown key (known: vcpus, mem_mib, cpus, control, start, net, mac, disk, console, device, ram, mte)"
                )
            }
            Self::RepeatedKey(l) => write!(f, "vm.conf line {l}: the key is set twice"),
            Self::BadCpus(l, error) => write!(f, "vm.conf line {l}: cpus: {error}"),
            Self::BadFlag(l) => write!(f, "vm.conf line {l}: control and start are 0 or 1"),
            Self::BadNet(l, error) => write!(f, "vm.conf line {l}: net: {error}"),
            Self::BadMac(l) => write!(
                f,
                "vm.conf line {l}: mac is six hex bytes of a unicast address, like 52:54:00:12:34:56"
            ),
            Self::BadDisk(l, why) => write!(
                f,
                "vm.conf line {l}: disk is N[@START[+SECTORS]][:ro]: {why}"
            ),
            Self::BadConsole(l) => write!(f, "vm.conf line {l}: console is pl011 or virtio"),
            Self::BadDevice(l, why) => write!(
                f,
                "vm.conf line {l}: device is a host device-tree path like /virtio_mmio@a003e00: {why}"
            ),
            Self::TooManyDevices(l) => write!(
                f,
                "vm.conf line {l}: a VM owns at most {MAX_DEVICES} devices"
            ),
            Self::BadRam(l) => write!(f, "vm.conf line {l}: ram is identity or fixed"),
            Self::BadMte(l) => write!(f, "vm.conf line {l}: mte is on or off"),
            Self::VcpusDisagree { vcpus, cpus } => write!(
                f,
                "vm.conf: vcpus={vcpus} but cpus names {cpus} CPUs (one vCPU runs on each)"
            ),
            Self::BadValue(l) => write!(
                f,
                "vm.conf line {l}: value must be a positive decimal number"
            ),
        }
    }
}

/// Which host disk, and which part of it, a VM's virtio-blk serves
/// (`disk=N[@START[+SECTORS]][:ro]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskConf {
    /// The host disk: 0 is the first disk the runner gave QEMU.
    pub host: u32,
    /// The first 512-byte sector of the host disk the VM sees (its sector 0).
    pub start_sector: u64,
    /// How many sectors the VM sees; `None`: up to the host disk's end.
    pub sectors: Option<u64>,
    /// The VM may not write (writes fail with `VIRTIO_BLK_S_IOERR`).
    pub read_only: bool,
}

impl DiskConf {
    /// Reads a `disk` value; the error says what is wrong.
    pub fn parse(value: &str) -> Result<Self, &'static str> {
        let (value, read_only) = match value.strip_suffix(":ro") {
            Some(rest) => (rest, true),
            None => (value, false),
        };
        let (host, range) = match value.split_once('@') {
            Some((host, range)) => (host, Some(range)),
            None => (value, None),
        };
        let host = decimal(host).ok_or("N, the host disk, is not a decimal number")?;
        let host = u32::try_from(host).map_err(|_| "N, the host disk, is too large")?;
        let (start_sector, sectors) = match range {
            None => (0, None),
            Some(range) => {
                let (start, sectors) = match range.split_once('+') {
                    Some((start, sectors)) => (start, Some(sectors)),
                    None => (range, None),
                };
                let start = decimal(start).ok_or("START is not a decimal number")?;
                let sectors = sectors
                    .map(|sectors| {
                        decimal(sectors)
                            .filter(|sectors| *sectors > 0)
                            .ok_or("SECTORS is not a positive decimal number")
                    })
                    .transpose()?;
                if let Some(sectors) = sectors
                    && start.checked_add(sectors).is_none()
                {
                    return Err("START+SECTORS overflows");
                }
                (start, sectors)
            }
        };
        Ok(DiskConf {
            host,
            start_sector,
            sectors,
            read_only,
        })
    }
}

impl core::fmt::Display for DiskConf {
    /// The `disk` value: the shortest form that reads back the same.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.host)?;
        match self.sectors {
            Some(sectors) => write!(f, "@{}+{sectors}", self.start_sector)?,
            None if self.start_sector != 0 => write!(f, "@{}", self.start_sector)?,
            None => {}
        }
        if self.read_only {
            write!(f, ":ro")?;
        }
        Ok(())
    }
}

/// A decimal number of digits only (no sign, no spaces).
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// What the VM's console is (`console=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsoleKind {
    /// The PL011 UART only.
    Pl011,
    /// The PL011 and a virtio-console (Linux `hvc0`); a control VM gets a
    /// second virtio-console wired to the monitor (`hvc1`).
    Virtio,
}

impl ConsoleKind {
    /// The `console` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pl011 => "pl011",
            Self::Virtio => "virtio",
        }
    }
}

/// Reads `52:54:00:12:34:56` (hex digits in either case); `None` unless it
/// is six bytes of a unicast address.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    if parts.next().is_some() || mac[0] & 1 != 0 {
        return None;
    }
    Some(mac)
}

/// Writes a MAC address as `vm.conf` takes it (lower-case hex).
pub fn format_mac(mac: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

/// The MAC of a VM without `mac=`: `52:54:00` (QEMU's prefix: locally
/// administered, unicast) and the low three bytes of the 32-bit FNV-1a hash
/// of the VM's name, so that it is the same on every boot and on both ends of
/// a migration.
pub fn default_mac(vm_name: &str) -> [u8; 6] {
    let hash = vm_name.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    let [_, a, b, c] = hash.to_be_bytes();
    [0x52, 0x54, 0x00, a, b, c]
}

/// Most `device` lines one `vm.conf` may hold.
pub const MAX_DEVICES: usize = 8;
/// Longest `device` path, in bytes.
pub const MAX_DEVICE_PATH: usize = 96;

/// A host device-tree node's full path (`device=`), kept in place so that
/// [`VmConf`] stays `Copy`: starts with `/`, printable ASCII without spaces,
/// at most [`MAX_DEVICE_PATH`] bytes, no empty component (`//`) and no
/// trailing `/`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePath {
    bytes: [u8; MAX_DEVICE_PATH],
    len: u8,
}

impl DevicePath {
    /// Reads a `device` value; the error says what is wrong.
    pub fn new(path: &str) -> Result<Self, &'static str> {
        if !path.starts_with('/') {
            return Err("the path starts at the root, /");
        }
        if path.len() == 1 {
            return Err("the root node is not a device");
        }
        if path.len() > MAX_DEVICE_PATH {
            return Err("the path is longer than 96 bytes");
        }
        if !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the path holds a space or a character that is not printable ASCII");
        }
        if path.contains("//") || path.ends_with('/') {
            return Err("the path has an empty component");
        }
        let mut bytes = [0; MAX_DEVICE_PATH];
        bytes[..path.len()].copy_from_slice(path.as_bytes());
        Ok(Self {
            bytes,
            len: path.len() as u8,
        })
    }

    /// The path's text.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (`new`).
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl core::fmt::Debug for DevicePath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl core::fmt::Display for DevicePath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `device` lines of a `vm.conf`, in order, at most [`MAX_DEVICES`].
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceList {
    paths: [Option<DevicePath>; MAX_DEVICES],
}

impl DeviceList {
    /// Appends a path; `false` when the list is full.
    pub fn push(&mut self, path: DevicePath) -> bool {
        match self.paths.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => {
                *slot = Some(path);
                true
            }
            None => false,
        }
    }

    /// The paths, in `vm.conf` order.
    pub fn iter(&self) -> impl Iterator<Item = &DevicePath> {
        self.paths.iter().map_while(Option::as_ref)
    }

    /// How many paths there are.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.paths[0].is_none()
    }
}

impl core::fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Where a VM's RAM sits in its guest-physical address space (`ram=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RamPlacement {
    /// At the guest address `0x4000_0000`, whatever host frames back it.
    #[default]
    Fixed,
    /// At the guest address equal to the host-physical address of its
    /// frames (IPA == PA), so that a passed-through device's DMA, which
    /// uses the addresses the guest gives it, reaches the guest's RAM.
    Identity,
}

impl RamPlacement {
    /// The `vm.conf` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Identity => "identity",
        }
    }
}

/// The settings of `vm.conf`; `None` where the file did not set a key (the
/// hypervisor's default applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmConf {
    /// Number of vCPUs.
    pub vcpus: Option<u32>,
    /// Guest RAM in MiB.
    pub mem_mib: Option<u64>,
    /// The physical CPUs that run the vCPUs, one vCPU each.
    pub cpus: Option<CpuSet>,
    /// Whether the VM may use the hypervisor's control interface.
    pub control: Option<bool>,
    /// Whether the VM boots (`false`: it waits as a migration destination).
    pub start: Option<bool>,
    /// The network (switch) of the VM's virtio-net; `None`: no virtio-net.
    /// A [`VmName`] (same rules as VM names) so that the settings stay
    /// `Copy` and `no_std` code keeps them without allocating; its text is
    /// [`VmName::as_str`].
    pub net: Option<VmName>,
    /// The virtio-net's MAC; `None`: [`default_mac`] of the VM's name
    /// ([`VmConf::mac_for`]).
    pub mac: Option<[u8; 6]>,
    /// The host disk the VM's virtio-blk serves; `None`: no virtio-blk.
    pub disk: Option<DiskConf>,
    /// The VM's console; `None`: [`ConsoleKind::Pl011`]
    /// ([`VmConf::console_kind`]).
    pub console: Option<ConsoleKind>,
    /// The host device-tree nodes the VM owns (`device=` lines).
    pub devices: DeviceList,
    /// Where its RAM sits; `None`: [`RamPlacement::Fixed`].
    pub ram: Option<RamPlacement>,
    /// Whether the guest may use memory tagging; `None`: it may not.
    pub mte: Option<bool>,
}

impl VmConf {
    /// Parses the file's contents.
    pub fn parse(text: &[u8]) -> Result<Self, VmConfError> {
        let text = core::str::from_utf8(text).map_err(|_| VmConfError::NotText)?;
        let mut conf = Self::default();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once('=').ok_or(VmConfError::NoEquals(number))?;
            let value = value.trim();
            let number_value = || -> Result<u64, VmConfError> {
                value
                    .parse()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or(VmConfError::BadValue(number))
            };
            let repeated = VmConfError::RepeatedKey(number);
            match key.trim() {
                "vcpus" if conf.vcpus.is_some() => return Err(repeated),
                "mem_mib" if conf.mem_mib.is_some() => return Err(repeated),
                "cpus" if conf.cpus.is_some() => return Err(repeated),
                "control" if conf.control.is_some() => return Err(repeated),
                "start" if conf.start.is_some() => return Err(repeated),
                "net" if conf.net.is_some() => return Err(repeated),
                "mac" if conf.mac.is_some() => return Err(repeated),
                "disk" if conf.disk.is_some() => return Err(repeated),
                "console" if conf.console.is_some() => return Err(repeated),
                "ram" if conf.ram.is_some() => return Err(repeated),
                "mte" if conf.mte.is_some() => return Err(repeated),
                "mte" => {
                    conf.mte = Some(match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(VmConfError::BadMte(number)),
                    })
                }
                "device" => {
                    let path = DevicePath::new(value)
                        .map_err(|why| VmConfError::BadDevice(number, why))?;
                    if !conf.devices.push(path) {
                        return Err(VmConfError::TooManyDevices(number));
                    }
                }
                "ram" => {
                    conf.ram = Some(match value {
                        "identity" => RamPlacement::Identity,
                        "fixed" => RamPlacement::Fixed,
                        _ => return Err(VmConfError::BadRam(number)),
                    })
                }
                "net" => {
                    conf.net = Some(
                        VmName::new(value).map_err(|error| VmConfError::BadNet(number, error))?,
                    )
                }
                "mac" => conf.mac = Some(parse_mac(value).ok_or(VmConfError::BadMac(number))?),
                "disk" => {
                    conf.disk = Some(
                        DiskConf::parse(value).map_err(|why| VmConfError::BadDisk(number, why))?,
                    )
                }
                "console" => {
                    conf.console = Some(match value {
                        "pl011" => ConsoleKind::Pl011,
                        "virtio" => ConsoleKind::Virtio,
                        _ => return Err(VmConfError::BadConsole(number)),
                    })
                }
                "vcpus" => {
                    conf.vcpus = Some(
                        u32::try_from(number_value()?)
                            .map_err(|_| VmConfError::BadValue(number))?,
                    )
                }
                "mem_mib" => conf.mem_mib = Some(number_value()?),
                "cpus" => {
                    conf.cpus = Some(
                        CpuSet::parse(value)
                            .map_err(|error| VmConfError::BadCpus(number, error))?,
                    )
                }
                "control" | "start" => {
                    let flag = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(VmConfError::BadFlag(number)),
                    };
                    if key.trim() == "control" {
                        conf.control = Some(flag);
                    } else {
                        conf.start = Some(flag);
                    }
                }
                _ => return Err(VmConfError::UnknownKey(number)),
            }
        }
        if let (Some(vcpus), Some(cpus)) = (conf.vcpus, conf.cpus)
            && vcpus != cpus.len()
        {
            return Err(VmConfError::VcpusDisagree {
                vcpus,
                cpus: cpus.len(),
            });
        }
        Ok(conf)
    }

    /// The file's contents: one `key=value` line per key that is set.
    pub fn to_text(&self) -> String {
        let mut text = String::new();
        if let Some(vcpus) = self.vcpus {
            text.push_str(&format!("vcpus={vcpus}\n"));
        }
        if let Some(mem_mib) = self.mem_mib {
            text.push_str(&format!("mem_mib={mem_mib}\n"));
        }
        if let Some(cpus) = self.cpus {
            text.push_str(&format!("cpus={cpus}\n"));
        }
        if let Some(control) = self.control {
            text.push_str(&format!("control={}\n", u8::from(control)));
        }
        if let Some(start) = self.start {
            text.push_str(&format!("start={}\n", u8::from(start)));
        }
        if let Some(net) = self.net {
            text.push_str(&format!("net={net}\n"));
        }
        if let Some(mac) = self.mac {
            text.push_str(&format!("mac={}\n", format_mac(mac)));
        }
        if let Some(disk) = self.disk {
            text.push_str(&format!("disk={disk}\n"));
        }
        if let Some(console) = self.console {
            text.push_str(&format!("console={}\n", console.as_str()));
        }
        for device in self.devices.iter() {
            text.push_str(&format!("device={device}\n"));
        }
        if let Some(ram) = self.ram {
            text.push_str(&format!("ram={}\n", ram.as_str()));
        }
        if let Some(mte) = self.mte {
            text.push_str(if mte { "mte=on\n" } else { "mte=off\n" });
        }
        text
    }

    /// The MAC of the VM called `vm_name`: `mac`, else [`default_mac`].
    pub fn mac_for(&self, vm_name: &str) -> [u8; 6] {
        self.mac.unwrap_or_else(|| default_mac(vm_name))
    }

    /// The VM's console: `console`, else [`ConsoleKind::Pl011`].
    pub fn console_kind(&self) -> ConsoleKind {
        self.console.unwrap_or(ConsoleKind::Pl011)
    }

    /// How many vCPUs the VM gets on a host with `host_cpus` CPUs: `vcpus`,
    /// else one per CPU of `cpus`, else one per host CPU.
    pub fn vcpu_count(&self, host_cpus: u32) -> u32 {
        self.vcpus
            .or(self.cpus.map(CpuSet::len))
            .unwrap_or(host_cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let conf = VmConf::parse(b"# test\nvcpus = 2\n\nmem_mib=256\n").expect("valid");
        assert_eq!(
            conf,
            VmConf {
                vcpus: Some(2),
                mem_mib: Some(256),
                ..VmConf::default()
            }
        );
        let conf = VmConf::parse(b"cpus = 2-3\ncontrol=1\nvcpus=2").expect("valid");
        assert_eq!(conf.cpus, CpuSet::from_mask(0b1100));
        assert_eq!(conf.control, Some(true));
        assert_eq!(conf.vcpu_count(8), 2);
        let conf = VmConf::parse(b"cpus=0,5,7").expect("valid");
        assert_eq!((conf.vcpus, conf.vcpu_count(8)), (None, 3));
        assert_eq!(VmConf::default().vcpu_count(8), 8);
        assert_eq!(VmConf::parse(b""), Ok(VmConf::default()));
    }

    #[test]
    fn errors() {
        assert_eq!(VmConf::parse(b"vcpus 2"), Err(VmConfError::NoEquals(1)));
        assert_eq!(VmConf::parse(b"\ncpu=2"), Err(VmConfError::UnknownKey(2)));
        assert_eq!(
            VmConf::parse(b"mem_mib=1\nmem_mib=2"),
            Err(VmConfError::RepeatedKey(2))
        );
        assert_eq!(VmConf::parse(b"mem_mib=0"), Err(VmConfError::BadValue(1)));
        assert_eq!(
            VmConf::parse(b"cpus=1-0"),
            Err(VmConfError::BadCpus(
                1,
                CpuListError::Backwards { first: 1, last: 0 }
            ))
        );
        assert_eq!(VmConf::parse(b"control=yes"), Err(VmConfError::BadFlag(1)));
        assert_eq!(
            VmConf::parse(b"vcpus=3\ncpus=0-1"),
            Err(VmConfError::VcpusDisagree { vcpus: 3, cpus: 2 })
        );
        assert_eq!(VmConf::parse(b"vcpus=0"), Err(VmConfError::BadValue(1)));
        assert_eq!(VmConf::parse(b"mem_mib=-1"), Err(VmConfError::BadValue(1)));
        assert_eq!(
            VmConf::parse(b"vcpus=99999999999"),
            Err(VmConfError::BadValue(1))
        );
        assert_eq!(VmConf::parse(&[0xff]), Err(VmConfError::NotText));
    }

    #[test]
    fn parses_devices() {
        let conf = VmConf::parse(
            b"net = lan\nmac=52:54:00:AB:cd:0e\ndisk=1@2048+4096:ro\nconsole=virtio\n",
        )
        .expect("valid");
        assert_eq!(conf.net.map(|net| net.as_str() == "lan"), Some(true));
        assert_eq!(conf.mac, Some([0x52, 0x54, 0x00, 0xab, 0xcd, 0x0e]));
        assert_eq!(
            conf.disk,
            Some(DiskConf {
                host: 1,
                start_sector: 2048,
                sectors: Some(4096),
                read_only: true
            })
        );
        assert_eq!(conf.console_kind(), ConsoleKind::Virtio);
        assert_eq!(conf.mac_for("a"), [0x52, 0x54, 0x00, 0xab, 0xcd, 0x0e]);
        assert_eq!(
            conf.to_text(),
            "net=lan\nmac=52:54:00:ab:cd:0e\ndisk=1@2048+4096:ro\nconsole=virtio\n"
        );
        let disk = |text: &str| DiskConf::parse(text);
        assert_eq!(disk("0"), Ok(DiskConf::default()));
        assert_eq!(
            disk("2:ro"),
            Ok(DiskConf {
                host: 2,
                read_only: true,
                ..DiskConf::default()
            })
        );
        assert_eq!(
            disk("0@8"),
            Ok(DiskConf {
                start_sector: 8,
                ..DiskConf::default()
            })
        );
        assert_eq!(VmConf::default().console_kind(), ConsoleKind::Pl011);
    }

    #[test]
    fn passthrough_devices_and_identity_ram() {
        let conf = VmConf::parse(
            b"device=/virtio_mmio@a003e00\nram = identity\ndevice = /pcie@10000000\n",
        )
        .expect("valid");
        let paths: alloc::vec::Vec<&str> = conf.devices.iter().map(DevicePath::as_str).collect();
        assert_eq!(paths, ["/virtio_mmio@a003e00", "/pcie@10000000"]);
        assert_eq!(conf.ram, Some(RamPlacement::Identity));
        assert_eq!(
            conf.to_text(),
            "device=/virtio_mmio@a003e00\ndevice=/pcie@10000000\nram=identity\n"
        );
        assert!(VmConf::default().devices.is_empty());
        for (bad, why) in [
            ("virtio_mmio@a003e00", "the path starts at the root, /"),
            ("/", "the root node is not a device"),
            ("/soc//uart", "the path has an empty component"),
            ("/soc/", "the path has an empty component"),
            (
                "/a b",
                "the path holds a space or a character that is not printable ASCII",
            ),
        ] {
            assert_eq!(
                VmConf::parse(format!("device={bad}").as_bytes()),
                Err(VmConfError::BadDevice(1, why)),
                "{bad}"
            );
        }
        let long = format!("device=/{}", "x".repeat(MAX_DEVICE_PATH));
        assert_eq!(
            VmConf::parse(long.as_bytes()),
            Err(VmConfError::BadDevice(
                1,
                "the path is longer than 96 bytes"
            ))
        );
        let nine: String = (0..=MAX_DEVICES)
            .map(|i| format!("device=/d@{i}\n"))
            .collect();
        assert_eq!(
            VmConf::parse(nine.as_bytes()),
            Err(VmConfError::TooManyDevices(MAX_DEVICES + 1))
        );
        assert_eq!(VmConf::parse(b"ram=1:1"), Err(VmConfError::BadRam(1)));
        assert_eq!(VmConf::parse(b"mte=on").map(|c| c.mte), Ok(Some(true)));
        assert_eq!(VmConf::parse(b"mte = off").map(|c| c.mte), Ok(Some(false)));
        assert_eq!(VmConf::parse(b"mte=1"), Err(VmConfError::BadMte(1)));
        assert_eq!(
            VmConf::parse(b"mte=on\nmte=on"),
            Err(VmConfError::RepeatedKey(2))
        );
        assert_eq!(
            VmConf::parse(b"ram=identity\nram=fixed"),
            Err(VmConfError::RepeatedKey(2))
        );
    }

    #[test]
    fn default_macs_are_stable_unicast_and_differ_by_name() {
        let a = default_mac("linux-a");
        assert_eq!(a, default_mac("linux-a"));
        assert_ne!(a, default_mac("linux-b"));
        assert_eq!(&a[..3], &[0x52, 0x54, 0x00]);
        // FNV-1a of "a" is 0xe40c292c.
        assert_eq!(default_mac("a"), [0x52, 0x54, 0x00, 0x0c, 0x29, 0x2c]);
        assert_eq!(VmConf::default().mac_for("a"), default_mac("a"));
    }

    #[test]
    fn device_errors_name_the_line() {
        assert_eq!(
            VmConf::parse(b"vcpus=1\nnet=l@n"),
            Err(VmConfError::BadNet(2, VmNameError::BadCharacter('@')))
        );
        assert_eq!(
            VmConf::parse(b"net="),
            Err(VmConfError::BadNet(1, VmNameError::Empty))
        );
        for bad in [
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "52-54-00-12-34-56",
            "52:54:00:12:34:5g",
            "01:00:5e:00:00:01",
            "52:54:00:12:34:5",
        ] {
            assert_eq!(
                VmConf::parse(format!("mac={bad}").as_bytes()),
                Err(VmConfError::BadMac(1)),
                "{bad}"
            );
        }
        for (bad, why) in [
            ("", "N, the host disk, is not a decimal number"),
            ("x", "N, the host disk, is not a decimal number"),
            ("-1", "N, the host disk, is not a decimal number"),
            (":ro", "N, the host disk, is not a decimal number"),
            ("0:rw", "N, the host disk, is not a decimal number"),
            ("99999999999", "N, the host disk, is too large"),
            ("0@", "START is not a decimal number"),
            ("0@+5", "START is not a decimal number"),
            ("0@5+0", "SECTORS is not a positive decimal number"),
            ("0@5+", "SECTORS is not a positive decimal number"),
            ("0@18446744073709551615+1", "START+SECTORS overflows"),
        ] {
            assert_eq!(
                VmConf::parse(format!("\ndisk={bad}").as_bytes()),
                Err(VmConfError::BadDisk(2, why)),
                "{bad}"
            );
        }
        assert_eq!(
            VmConf::parse(b"console=hvc0"),
            Err(VmConfError::BadConsole(1))
        );
        assert_eq!(
            VmConf::parse(b"disk=0\ndisk=1"),
            Err(VmConfError::RepeatedKey(2))
        );
        assert_eq!(
            VmConf::parse(b"net=a\nnet=a"),
            Err(VmConfError::RepeatedKey(2))
        );
        assert_eq!(
            VmConf::parse(b"mac=52:54:00:00:00:01\nmac=52:54:00:00:00:01"),
            Err(VmConfError::RepeatedKey(2))
        );
        assert_eq!(
            VmConf::parse(b"console=virtio\nconsole=pl011"),
            Err(VmConfError::RepeatedKey(2))
        );
        let message = format!(
            "{}",
            VmConfError::BadDisk(3, "START is not a decimal number")
        );
        assert!(
            message.contains("line 3") && message.contains("START"),
            "{message}"
        );
    }

    proptest::proptest! {
        #[test]
        fn written_settings_read_back(
            vcpus in proptest::option::of(1u32..),
            mem_mib in proptest::option::of(1u64..),
            cpus in proptest::option::of(1u64..),
            control in proptest::option::of(proptest::bool::ANY),
            start in proptest::option::of(proptest::bool::ANY),
            net in proptest::option::of("[a-z_-][a-z0-9_-]{0,15}"),
            mac in proptest::option::of(proptest::array::uniform6(proptest::num::u8::ANY)),
            disk in proptest::option::of((
                proptest::num::u32::ANY,
                proptest::num::u64::ANY,
                proptest::option::of(1u64..),
                proptest::bool::ANY,
            )),
            virtio_console in proptest::option::of(proptest::bool::ANY),
            devices in proptest::collection::vec("(/[a-z0-9_,.@-]{1,20}){1,3}", 0..=MAX_DEVICES),
            identity in proptest::option::of(proptest::bool::ANY),
            mte in proptest::option::of(proptest::bool::ANY),
        ) {
            let cpus = cpus.and_then(CpuSet::from_mask);
            let vcpus = if cpus.is_some() { vcpus.and(cpus.map(CpuSet::len)) } else { vcpus };
            let net = net.and_then(|net| VmName::new(&net).ok());
            let mac = mac.map(|mut mac| { mac[0] &= !1; mac });
            let disk = disk.map(|(host, start_sector, sectors, read_only)| DiskConf {
                host,
                start_sector: start_sector / 2,
                sectors: sectors.map(|sectors| sectors / 2 + 1),
                read_only,
            });
            let console = virtio_console
                .map(|virtio| if virtio { ConsoleKind::Virtio } else { ConsoleKind::Pl011 });
            let mut list = DeviceList::default();
            for path in &devices {
                proptest::prop_assert!(list.push(DevicePath::new(path).unwrap()));
            }
            let ram = identity
                .map(|identity| if identity { RamPlacement::Identity } else { RamPlacement::Fixed });
            let conf = VmConf {
                vcpus, mem_mib, cpus, control, start, net, mac, disk, console, devices: list, ram, mte,
            };
            proptest::prop_assert_eq!(VmConf::parse(conf.to_text().as_bytes()), Ok(conf));
        }
    }
}
