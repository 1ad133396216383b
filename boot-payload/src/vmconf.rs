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
//!
//! Blank lines and lines starting with `#` are skipped; spaces around keys
//! and values are ignored. An unknown key, a repeated key or a bad value is
//! an error, and so is a `vcpus` that disagrees with the size of `cpus`, so a
//! typo never goes unnoticed.
//! [`VmConf::to_text`] writes the keys that are set, one per line, and
//! [`VmConf::parse`] reads them back.

use alloc::format;
use alloc::string::String;

use crate::cpuset::{CpuListError, CpuSet};

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
                    "vm.conf line {l}: unknown key (known: vcpus, mem_mib, cpus, control, start)"
                )
            }
            Self::RepeatedKey(l) => write!(f, "vm.conf line {l}: the key is set twice"),
            Self::BadCpus(l, error) => write!(f, "vm.conf line {l}: cpus: {error}"),
            Self::BadFlag(l) => write!(f, "vm.conf line {l}: control and start are 0 or 1"),
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
        text
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

    proptest::proptest! {
        #[test]
        fn written_settings_read_back(
            vcpus in proptest::option::of(1u32..),
            mem_mib in proptest::option::of(1u64..),
            cpus in proptest::option::of(1u64..),
            control in proptest::option::of(proptest::bool::ANY),
            start in proptest::option::of(proptest::bool::ANY),
        ) {
            let cpus = cpus.and_then(CpuSet::from_mask);
            let vcpus = if cpus.is_some() { vcpus.and(cpus.map(CpuSet::len)) } else { vcpus };
            let conf = VmConf { vcpus, mem_mib, cpus, control, start };
            proptest::prop_assert_eq!(VmConf::parse(conf.to_text().as_bytes()), Ok(conf));
        }
    }
}
