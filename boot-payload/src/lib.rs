//! The hypervisor's boot formats, shared by the hypervisor (which reads them
//! at EL2, `no_std`) and by `qemu-runner` (which writes them on the host).
//!
//! The hypervisor is booted as a Linux arm64 `Image` and finds its guest in
//! the initrd: the *boot payload*, an uncompressed cpio archive in "newc"
//! format ([`cpio`]) with these entries:
//!
//! | entry | | contents |
//! |---|---|---|
//! | [`KERNEL`] | required | the guest kernel: an arm64 `Image` or a raw binary ([`image`]) |
//! | [`INITRD`] | optional | the guest's initrd |
//! | [`CMDLINE`] | optional | the guest's `/chosen/bootargs` |
//! | [`VM_CONF`] | optional | `key=value` settings of the VM ([`vmconf`]) |
//!
//! [`Payload`] writes such an archive and [`PayloadRef::parse`] reads one
//! back without copying; a property test checks that every payload reads back
//! as it was written.
//!
//! ```
//! use boot_payload::{Payload, PayloadRef, vmconf::VmConf};
//!
//! let payload = Payload {
//!     kernel: vec![0x00, 0x00, 0x00, 0x14], // `b .`: a raw binary
//!     cmdline: Some("test=memory".into()),
//!     conf: VmConf { vcpus: Some(2), mem_mib: None },
//!     ..Payload::default()
//! };
//! let archive = payload.to_cpio();
//! let read = PayloadRef::parse(&archive).unwrap();
//! assert_eq!(read.kernel, &payload.kernel[..]);
//! assert_eq!(read.cmdline, Some("test=memory"));
//! assert_eq!(read.conf.vcpus, Some(2));
//! ```

#![no_std]

extern crate alloc;

pub mod cpio;
pub mod image;
pub mod vmconf;

use alloc::string::String;
use alloc::vec::Vec;

use cpio::{CpioError, FileEntry};
use vmconf::{VmConf, VmConfError};

/// Name of the guest kernel's entry.
pub const KERNEL: &str = "kernel";
/// Name of the guest initrd's entry.
pub const INITRD: &str = "initrd";
/// Name of the guest command line's entry.
pub const CMDLINE: &str = "cmdline";
/// Name of the VM settings' entry.
pub const VM_CONF: &str = "vm.conf";

/// A boot payload to write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    /// Guest kernel: an arm64 `Image` or a raw binary.
    pub kernel: Vec<u8>,
    /// Guest initrd, placed in guest RAM and announced in the guest DTB.
    pub initrd: Option<Vec<u8>>,
    /// Guest kernel command line (`/chosen/bootargs`).
    pub cmdline: Option<String>,
    /// VM settings; the `vm.conf` entry is left out when none is set.
    pub conf: VmConf,
}

impl Payload {
    /// The archive's entries, `kernel` first.
    pub fn entries(&self) -> Vec<FileEntry> {
        let mut entries = alloc::vec![FileEntry::file(KERNEL, self.kernel.clone())];
        if let Some(initrd) = &self.initrd {
            entries.push(FileEntry::file(INITRD, initrd.clone()));
        }
        if let Some(cmdline) = &self.cmdline {
            entries.push(FileEntry::file(CMDLINE, cmdline.clone().into_bytes()));
        }
        if self.conf != VmConf::default() {
            entries.push(FileEntry::file(VM_CONF, self.conf.to_text().into_bytes()));
        }
        entries
    }

    /// The payload as a newc cpio archive.
    pub fn to_cpio(&self) -> Vec<u8> {
        cpio::write_archive(&self.entries())
    }
}

/// A boot payload read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadRef<'a> {
    /// Guest kernel.
    pub kernel: &'a [u8],
    /// Guest initrd.
    pub initrd: Option<&'a [u8]>,
    /// Guest command line, without trailing newlines or NULs.
    pub cmdline: Option<&'a str>,
    /// VM settings (all `None` without a `vm.conf` entry).
    pub conf: VmConf,
}

/// Why a boot payload could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayloadError {
    /// The archive is damaged.
    Cpio(CpioError),
    /// The archive has no `kernel` entry.
    NoKernel,
    /// The `cmdline` entry is not UTF-8 text.
    CmdlineNotText,
    /// `vm.conf` is invalid.
    Conf(VmConfError),
}

impl core::fmt::Display for PayloadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Cpio(error) => write!(f, "the payload is not a cpio newc archive: {error}"),
            Self::NoKernel => write!(f, "the payload has no `{KERNEL}` entry"),
            Self::CmdlineNotText => write!(f, "the payload's `{CMDLINE}` is not UTF-8 text"),
            Self::Conf(error) => write!(f, "{error}"),
        }
    }
}

impl core::error::Error for PayloadError {}

impl From<CpioError> for PayloadError {
    fn from(error: CpioError) -> PayloadError {
        PayloadError::Cpio(error)
    }
}

impl<'a> PayloadRef<'a> {
    /// Reads the payload in `archive`: one pass over the entries; the first
    /// entry of each name counts, unknown names are ignored.
    pub fn parse(archive: &'a [u8]) -> Result<PayloadRef<'a>, PayloadError> {
        let (mut kernel, mut initrd, mut cmdline, mut conf) = (None, None, None, None);
        for entry in cpio::entries(archive) {
            let entry = entry?;
            let slot = match entry.name {
                KERNEL => &mut kernel,
                INITRD => &mut initrd,
                CMDLINE => &mut cmdline,
                VM_CONF => &mut conf,
                _ => continue,
            };
            slot.get_or_insert(entry.data);
        }
        let cmdline = cmdline
            .map(|bytes| {
                core::str::from_utf8(bytes)
                    .map(|text| text.trim_end_matches(['\n', '\0']))
                    .map_err(|_| PayloadError::CmdlineNotText)
            })
            .transpose()?;
        Ok(PayloadRef {
            kernel: kernel.ok_or(PayloadError::NoKernel)?,
            initrd,
            cmdline,
            conf: conf
                .map(VmConf::parse)
                .transpose()
                .map_err(PayloadError::Conf)?
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    #[test]
    fn payload_lists_kernel_first_and_only_given_entries() {
        let payload = Payload {
            kernel: vec![1, 2, 3],
            cmdline: Some("test=bad-guest".into()),
            conf: VmConf {
                vcpus: None,
                mem_mib: Some(64),
            },
            ..Payload::default()
        };
        let archive = payload.to_cpio();
        let names: Vec<&str> = cpio::entries(&archive).map(|e| e.unwrap().name).collect();
        assert_eq!(names, [KERNEL, CMDLINE, VM_CONF]);
        let conf = cpio::entries(&archive).find(VM_CONF).unwrap().unwrap();
        assert_eq!(conf.data, b"mem_mib=64\n");
        let bare = Payload {
            kernel: vec![9],
            ..Payload::default()
        };
        assert_eq!(
            cpio::entries(&bare.to_cpio()).count(),
            1,
            "no empty vm.conf"
        );
    }

    #[test]
    fn damaged_or_incomplete_payloads_are_refused() {
        let no_kernel = cpio::write_archive(&[FileEntry::file(CMDLINE, b"x".to_vec())]);
        assert_eq!(PayloadRef::parse(&no_kernel), Err(PayloadError::NoKernel));
        let bad_conf = cpio::write_archive(&[
            FileEntry::file(KERNEL, vec![1]),
            FileEntry::file(VM_CONF, b"cpus=2\n".to_vec()),
        ]);
        assert_eq!(
            PayloadRef::parse(&bad_conf),
            Err(PayloadError::Conf(VmConfError::UnknownKey(1)))
        );
        let bad_cmdline = cpio::write_archive(&[
            FileEntry::file(KERNEL, vec![1]),
            FileEntry::file(CMDLINE, vec![0xff]),
        ]);
        assert_eq!(
            PayloadRef::parse(&bad_cmdline),
            Err(PayloadError::CmdlineNotText)
        );
        let archive = Payload {
            kernel: vec![1; 10],
            ..Payload::default()
        }
        .to_cpio();
        assert!(matches!(
            PayloadRef::parse(&archive[..archive.len() - 8]),
            Err(PayloadError::Cpio(_))
        ));
    }

    #[test]
    fn entries_written_by_the_cpio_tool_are_read_too() {
        // `find . | cpio -o -H newc` names entries `./kernel`; the first
        // entry of a name wins.
        let archive = cpio::write_archive(&[
            FileEntry::file("./kernel", vec![7]),
            FileEntry::file(KERNEL, vec![8]),
            FileEntry::file("./cmdline", b"quiet\n\0".to_vec()),
            FileEntry::file("notes.txt", vec![1]),
        ]);
        let read = PayloadRef::parse(&archive).unwrap();
        assert_eq!(read.kernel, [7]);
        assert_eq!(read.cmdline, Some("quiet"));
    }

    proptest! {
        #[test]
        fn every_payload_reads_back_as_written(
            kernel in proptest::collection::vec(any::<u8>(), 1..600),
            initrd in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            cmdline in proptest::option::of("[ -~]{0,40}"),
            vcpus in proptest::option::of(1u32..64),
            mem_mib in proptest::option::of(1u64..1 << 20),
        ) {
            let cmdline = cmdline.map(|c| String::from(c.trim_end_matches(['\n', '\0'])));
            let payload = Payload { kernel, initrd, cmdline, conf: VmConf { vcpus, mem_mib } };
            let archive = payload.to_cpio();
            let read = PayloadRef::parse(&archive).unwrap();
            prop_assert_eq!(read.kernel, &payload.kernel[..]);
            prop_assert_eq!(read.initrd, payload.initrd.as_deref());
            prop_assert_eq!(read.cmdline, payload.cmdline.as_deref());
            prop_assert_eq!(read.conf, payload.conf);
        }
    }
}
