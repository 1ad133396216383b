//! The guest payload: an uncompressed cpio archive in "newc" format.
//!
//! Each entry is a 110-byte ASCII header (magic `070701` and thirteen 8-digit
//! hex fields: inode, mode, uid, gid, nlink, mtime, file size, dev major/minor,
//! rdev major/minor, name size including the NUL, check), the NUL-terminated
//! name padded to a multiple of 4 bytes, then the data padded likewise. A
//! `TRAILER!!!` entry ends the archive. Entries of the hypervisor's payload:
//! `kernel` (arm64 Image, required), `initrd`, `cmdline`, `vm.conf`. The same
//! file passed with QEMU `-initrd` or loaded by U-Boot as a ramdisk reaches the
//! hypervisor through `/chosen/linux,initrd-{start,end}`.
//!
//! The same writer builds Linux initramfs archives ([`crate::initramfs`]):
//! an [`Entry`] carries its file mode (regular file, directory, symbolic link
//! whose data is the target, character device with its device number).

use std::fmt;

/// Magic of the newc format.
pub const NEWC_MAGIC: &[u8; 6] = b"070701";
/// Name of the entry that ends an archive.
pub const TRAILER: &str = "TRAILER!!!";
/// Size of an entry header.
pub const HEADER_SIZE: usize = 110;
/// Mode of a regular file readable by everyone.
pub const REGULAR_FILE_MODE: u32 = 0o100644;
/// Mode of an executable regular file.
pub const EXECUTABLE_MODE: u32 = 0o100755;
/// Mode of a directory.
pub const DIRECTORY_MODE: u32 = 0o040755;
/// Mode of a symbolic link.
pub const SYMLINK_MODE: u32 = 0o120777;
/// Mode of a character device readable and writable by its owner.
pub const CHAR_DEVICE_MODE: u32 = 0o020600;

/// One file of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path inside the archive, without a leading `/` (no directories in a
    /// payload).
    pub name: String,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    /// Device number (major, minor) of a device node; `(0, 0)` otherwise.
    pub rdev: (u32, u32),
    /// File contents; a symbolic link's target.
    pub data: Vec<u8>,
}

impl Entry {
    /// A regular file readable by everyone.
    pub fn file(name: &str, data: Vec<u8>) -> Entry {
        Entry::with_mode(name, REGULAR_FILE_MODE, data)
    }

    /// An executable regular file.
    pub fn executable(name: &str, data: Vec<u8>) -> Entry {
        Entry::with_mode(name, EXECUTABLE_MODE, data)
    }

    /// A directory.
    pub fn directory(name: &str) -> Entry {
        Entry::with_mode(name, DIRECTORY_MODE, Vec::new())
    }

    /// A symbolic link at `name` pointing to `target`.
    pub fn symlink(name: &str, target: &str) -> Entry {
        Entry::with_mode(name, SYMLINK_MODE, target.as_bytes().to_vec())
    }

    /// A character device node with device number `major:minor`.
    pub fn char_device(name: &str, major: u32, minor: u32) -> Entry {
        Entry {
            rdev: (major, minor),
            ..Entry::with_mode(name, CHAR_DEVICE_MODE, Vec::new())
        }
    }

    fn with_mode(name: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry {
            name: name.to_string(),
            mode,
            rdev: (0, 0),
            data,
        }
    }
}

/// Why an archive could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpioError {
    /// The archive ends inside an entry.
    Truncated {
        /// Offset of the entry.
        offset: usize,
    },
    /// An entry header does not start with `070701`.
    BadMagic {
        /// Offset of the entry.
        offset: usize,
    },
    /// A header field is not 8 hex digits.
    BadField {
        /// Offset of the entry.
        offset: usize,
    },
    /// A name is not NUL terminated UTF-8.
    BadName {
        /// Offset of the entry.
        offset: usize,
    },
    /// No `TRAILER!!!` entry.
    NoTrailer,
}

impl fmt::Display for CpioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpioError::Truncated { offset } => write!(f, "cpio entry at {offset:#x} is truncated"),
            CpioError::BadMagic { offset } => {
                write!(f, "cpio entry at {offset:#x} lacks the newc magic 070701")
            }
            CpioError::BadField { offset } => {
                write!(
                    f,
                    "cpio entry at {offset:#x} has a header field that is not hex"
                )
            }
            CpioError::BadName { offset } => {
                write!(f, "cpio entry at {offset:#x} has a bad file name")
            }
            CpioError::NoTrailer => write!(f, "cpio archive has no TRAILER!!! entry"),
        }
    }
}

impl std::error::Error for CpioError {}

fn pad4(length: usize) -> usize {
    length.next_multiple_of(4)
}

fn push_entry(archive: &mut Vec<u8>, inode: u32, entry: &Entry) {
    let (name, data) = (&entry.name, &entry.data);
    let fields = [
        inode,
        entry.mode,
        0, // uid
        0, // gid
        if entry.mode & 0o170000 == 0o040000 {
            2
        } else {
            1
        }, // nlink
        0, // mtime: fixed, so builds are reproducible
        u32::try_from(data.len()).expect("cpio newc entries are below 4 GiB"),
        0, // dev major
        0, // dev minor
        entry.rdev.0,
        entry.rdev.1,
        u32::try_from(name.len() + 1).expect("short name"),
        0, // check
    ];
    let start = archive.len();
    archive.extend_from_slice(NEWC_MAGIC);
    for field in fields {
        archive.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    archive.extend_from_slice(name.as_bytes());
    archive.push(0);
    archive.resize(start + pad4(HEADER_SIZE + name.len() + 1), 0);
    archive.extend_from_slice(data);
    archive.resize(archive.len() + pad4(data.len()) - data.len(), 0);
}

/// Writes `entries` as a newc archive, in the given order, with a trailer.
pub fn write_archive(entries: &[Entry]) -> Vec<u8> {
    let mut archive = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        push_entry(&mut archive, index as u32 + 1, entry);
    }
    push_entry(&mut archive, 0, &Entry::with_mode(TRAILER, 0, Vec::new()));
    archive
}

fn hex_field(archive: &[u8], offset: usize, index: usize) -> Result<usize, CpioError> {
    let at = offset + 6 + index * 8;
    let text =
        std::str::from_utf8(&archive[at..at + 8]).map_err(|_| CpioError::BadField { offset })?;
    usize::from_str_radix(text, 16).map_err(|_| CpioError::BadField { offset })
}

/// Reads a newc archive up to its trailer.
pub fn read_archive(archive: &[u8]) -> Result<Vec<Entry>, CpioError> {
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        if archive.len() < offset + HEADER_SIZE {
            return Err(if offset >= archive.len() {
                CpioError::NoTrailer
            } else {
                CpioError::Truncated { offset }
            });
        }
        if &archive[offset..offset + 6] != NEWC_MAGIC {
            return Err(CpioError::BadMagic { offset });
        }
        let mode = hex_field(archive, offset, 1)? as u32;
        let rdev = (
            hex_field(archive, offset, 9)? as u32,
            hex_field(archive, offset, 10)? as u32,
        );
        let size = hex_field(archive, offset, 6)?;
        let name_size = hex_field(archive, offset, 11)?;
        let name_end = offset + HEADER_SIZE + name_size;
        let data_start = offset + pad4(HEADER_SIZE + name_size);
        let data_end = data_start + size;
        if name_size == 0 || archive.len() < data_end || archive.len() < name_end {
            return Err(CpioError::Truncated { offset });
        }
        let name_bytes = &archive[offset + HEADER_SIZE..name_end];
        let name = name_bytes
            .strip_suffix(&[0])
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .ok_or(CpioError::BadName { offset })?;
        if name == TRAILER {
            return Ok(entries);
        }
        entries.push(Entry {
            name: name.to_string(),
            mode,
            rdev,
            data: archive[data_start..data_end].to_vec(),
        });
        offset = data_start + pad4(size);
    }
}

/// What the hypervisor boots: the guest kernel and what goes with it.
#[derive(Clone, Debug, Default)]
pub struct Payload {
    /// Guest kernel, an arm64 `Image`.
    pub kernel: Vec<u8>,
    /// Guest initrd, placed in guest RAM and announced in the guest DTB.
    pub initrd: Option<Vec<u8>>,
    /// Guest kernel command line (`/chosen/bootargs`).
    pub cmdline: Option<String>,
    /// vCPUs of the VM (`vm.conf` `vcpus=`); default: every host CPU.
    pub vcpus: Option<u32>,
    /// Guest RAM in MiB (`vm.conf` `mem_mib=`); default 128.
    pub mem_mib: Option<u32>,
}

impl Payload {
    /// The archive's entries, `kernel` first.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::file("kernel", self.kernel.clone())];
        if let Some(initrd) = &self.initrd {
            entries.push(Entry::file("initrd", initrd.clone()));
        }
        if let Some(cmdline) = &self.cmdline {
            entries.push(Entry::file("cmdline", cmdline.clone().into_bytes()));
        }
        let mut conf = String::new();
        if let Some(vcpus) = self.vcpus {
            conf.push_str(&format!("vcpus={vcpus}\n"));
        }
        if let Some(mem_mib) = self.mem_mib {
            conf.push_str(&format!("mem_mib={mem_mib}\n"));
        }
        if !conf.is_empty() {
            entries.push(Entry::file("vm.conf", conf.into_bytes()));
        }
        entries
    }

    /// The payload as a newc cpio archive.
    pub fn to_cpio(&self) -> Vec<u8> {
        write_archive(&self.entries())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_archive_is_only_a_trailer() {
        let archive = write_archive(&[]);
        assert_eq!(archive.len(), pad4(HEADER_SIZE + TRAILER.len() + 1));
        assert!(archive.starts_with(b"070701"));
        assert_eq!(read_archive(&archive), Ok(vec![]));
    }

    #[test]
    fn header_fields_are_newc() {
        let archive = write_archive(&[Entry::file("kernel", vec![7; 5])]);
        let header = std::str::from_utf8(&archive[..HEADER_SIZE]).unwrap();
        // magic, ino 1, mode 100644, uid, gid, nlink 1, mtime, size 5, ..., namesize 7
        assert_eq!(&header[0..6], "070701");
        assert_eq!(&header[6..14], "00000001");
        assert_eq!(&header[14..22], "000081a4");
        assert_eq!(&header[54..62], "00000005");
        assert_eq!(&header[94..102], "00000007");
        assert_eq!(&archive[HEADER_SIZE..HEADER_SIZE + 7], b"kernel\0");
        // 110 + 7 = 117 -> data at 120, 5 bytes padded to 8.
        assert_eq!(&archive[120..125], &[7; 5]);
        assert_eq!(&archive[125..128], &[0; 3]);
        assert_eq!(&archive[128..134], b"070701");
    }

    #[test]
    fn payload_lists_kernel_first_and_only_given_entries() {
        let payload = Payload {
            kernel: vec![1, 2, 3],
            cmdline: Some("test=bad-guest".into()),
            mem_mib: Some(64),
            ..Payload::default()
        };
        let entries = read_archive(&payload.to_cpio()).unwrap();
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["kernel", "cmdline", "vm.conf"]);
        assert_eq!(entries[2].data, b"mem_mib=64\n");
    }

    #[test]
    fn damaged_archives_are_rejected() {
        let archive = write_archive(&[Entry::file("kernel", vec![1; 100])]);
        assert_eq!(
            read_archive(&archive[..200]),
            Err(CpioError::Truncated { offset: 0 })
        );
        let mut bad = archive.clone();
        bad[0] = b'1';
        assert_eq!(read_archive(&bad), Err(CpioError::BadMagic { offset: 0 }));
        let trailer_at = archive.len() - pad4(HEADER_SIZE + TRAILER.len() + 1);
        assert_eq!(
            read_archive(&archive[..trailer_at]),
            Err(CpioError::NoTrailer)
        );
    }

    #[test]
    fn special_files_keep_their_mode_and_device_number() {
        let archive = write_archive(&[
            Entry::directory("dev"),
            Entry::char_device("dev/console", 5, 1),
            Entry::symlink("bin/sh", "busybox"),
            Entry::executable("init", b"#!/bin/sh\n".to_vec()),
        ]);
        let header = std::str::from_utf8(&archive[..HEADER_SIZE]).unwrap();
        assert_eq!(&header[14..22], "000041ed");
        assert_eq!(&header[38..46], "00000002", "a directory has two links");
        let entries = read_archive(&archive).unwrap();
        assert_eq!(entries[1].mode, 0o020600);
        assert_eq!(entries[1].rdev, (5, 1));
        assert_eq!(entries[2].mode, 0o120777);
        assert_eq!(entries[2].data, b"busybox");
        assert_eq!(entries[3].mode, 0o100755);
    }

    proptest! {
        #[test]
        fn archives_round_trip(files in proptest::collection::vec(
            ("[a-z./]{1,12}", proptest::collection::vec(any::<u8>(), 0..300),
             prop_oneof![Just(REGULAR_FILE_MODE), Just(EXECUTABLE_MODE), Just(SYMLINK_MODE),
                         Just(DIRECTORY_MODE), Just(CHAR_DEVICE_MODE)],
             (0u32..4096, 0u32..1 << 20)), 0..6)) {
            let entries: Vec<Entry> = files
                .into_iter()
                .map(|(name, data, mode, rdev)| Entry { name, mode, rdev, data })
                .filter(|e| e.name != TRAILER)
                .collect();
            let archive = write_archive(&entries);
            prop_assert_eq!(archive.len() % 4, 0);
            prop_assert_eq!(read_archive(&archive).unwrap(), entries);
        }
    }
}
