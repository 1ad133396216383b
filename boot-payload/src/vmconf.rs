//! The optional `vm.conf` payload entry: `key=value` lines.
//!
//! Known keys: `vcpus` (default: one per host CPU) and `mem_mib` (guest RAM in
//! MiB, default 128). Blank lines and lines starting with `#` are skipped;
//! spaces around keys and values are ignored. An unknown key or a value that is
//! not a positive decimal number is an error, so a typo never goes unnoticed.
//! [`VmConf::to_text`] writes the keys that are set, one per line, and
//! [`VmConf::parse`] reads them back.

use alloc::format;
use alloc::string::String;

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
}

impl core::error::Error for VmConfError {}

impl core::fmt::Display for VmConfError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotText => write!(f, "vm.conf is not UTF-8 text"),
            Self::NoEquals(l) => write!(f, "vm.conf line {l}: expected key=value"),
            Self::UnknownKey(l) => {
                write!(f, "vm.conf line {l}: unknown key (known: vcpus, mem_mib)")
            }
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
            let value: u64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v| *v > 0)
                .ok_or(VmConfError::BadValue(number))?;
            match key.trim() {
                "vcpus" => {
                    conf.vcpus =
                        Some(u32::try_from(value).map_err(|_| VmConfError::BadValue(number))?)
                }
                "mem_mib" => conf.mem_mib = Some(value),
                _ => return Err(VmConfError::UnknownKey(number)),
            }
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
        text
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
                mem_mib: Some(256)
            }
        );
        assert_eq!(VmConf::parse(b""), Ok(VmConf::default()));
    }

    #[test]
    fn errors() {
        assert_eq!(VmConf::parse(b"vcpus 2"), Err(VmConfError::NoEquals(1)));
        assert_eq!(VmConf::parse(b"\ncpus=2"), Err(VmConfError::UnknownKey(2)));
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
        ) {
            let conf = VmConf { vcpus, mem_mib };
            proptest::prop_assert_eq!(VmConf::parse(conf.to_text().as_bytes()), Ok(conf));
        }
    }
}
