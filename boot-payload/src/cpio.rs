//! cpio archives in the "newc" format: a reader that borrows from the archive
//! and a writer.
//!
//! # Format
//!
//! Each entry is a 110-byte ASCII header: the magic `070701` (or `070702`,
//! the same layout with a checksum field) and thirteen 8-digit hex fields
//! (inode, mode, uid, gid, nlink, mtime, file size, dev major, dev minor,
//! rdev major, rdev minor, name size including the NUL, check). The
//! NUL-terminated name follows, padded so that header plus name is a
//! multiple of 4 bytes, then the data, padded to a multiple of 4. The entry
//! named `TRAILER!!!` ends the archive.
//!
//! # Reading and writing
//!
//! [`entries`] walks an archive in place and yields [`Entry`] values that
//! point into it; names lose a leading `./`, so archives made by
//! `find . | cpio -o -H newc` read the same as ours. [`write_archive`] writes
//! [`FileEntry`] values in order with inode numbers counting from 1, `mtime`
//! 0 (reproducible builds) and a trailer; it also builds Linux initramfs
//! archives, so an entry carries its file mode and device number.

use alloc::string::String;
use alloc::vec::Vec;

/// Magic of the newc format.
pub const NEWC_MAGIC: &[u8; 6] = b"070701";
/// Magic of the newc format with checksums (read only).
pub const NEWC_CRC_MAGIC: &[u8; 6] = b"070702";
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
/// The file-type bits of a mode.
const FILE_TYPE_MASK: u32 = 0o170000;
/// The file type of a directory.
const DIRECTORY_TYPE: u32 = 0o040000;

/// Why an archive could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpioError {
    /// The archive ends inside a header, name or data (at this offset).
    Truncated(usize),
    /// The header at this offset has no newc magic.
    BadMagic(usize),
    /// A field of the header at this offset is not 8 hex digits.
    BadField(usize),
    /// The name at this offset is not NUL-terminated UTF-8.
    BadName(usize),
    /// The archive ended without a `TRAILER!!!` entry.
    NoTrailer,
}

impl core::fmt::Display for CpioError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Truncated(at) => write!(f, "cpio archive truncated at offset {at:#x}"),
            Self::BadMagic(at) => write!(f, "no cpio newc magic 070701 at offset {at:#x}"),
            Self::BadField(at) => write!(f, "cpio header at offset {at:#x} has a non-hex field"),
            Self::BadName(at) => write!(f, "bad cpio entry name at offset {at:#x}"),
            Self::NoTrailer => write!(f, "cpio archive has no TRAILER!!! entry"),
        }
    }
}

impl core::error::Error for CpioError {}

/// One member of an archive being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The name, without a leading `./`.
    pub name: &'a str,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    /// Device number (major, minor) of a device node.
    pub rdev: (u32, u32),
    /// The contents; a symbolic link's target.
    pub data: &'a [u8],
}

/// One file of an archive to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Path inside the archive, without a leading `/`.
    pub name: String,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    /// Device number (major, minor) of a device node; `(0, 0)` otherwise.
    pub rdev: (u32, u32),
    /// File contents; a symbolic link's target.
    pub data: Vec<u8>,
}

impl FileEntry {
    /// A regular file readable by everyone.
    pub fn file(name: &str, data: Vec<u8>) -> FileEntry {
        FileEntry::with_mode(name, REGULAR_FILE_MODE, data)
    }

    /// An executable regular file.
    pub fn executable(name: &str, data: Vec<u8>) -> FileEntry {
        FileEntry::with_mode(name, EXECUTABLE_MODE, data)
    }

    /// A directory.
    pub fn directory(name: &str) -> FileEntry {
        FileEntry::with_mode(name, DIRECTORY_MODE, Vec::new())
    }

    /// A symbolic link at `name` pointing to `target`.
    pub fn symlink(name: &str, target: &str) -> FileEntry {
        FileEntry::with_mode(name, SYMLINK_MODE, target.as_bytes().to_vec())
    }

    /// A character device node with device number `major:minor`.
    pub fn char_device(name: &str, major: u32, minor: u32) -> FileEntry {
        FileEntry {
            rdev: (major, minor),
            ..FileEntry::with_mode(name, CHAR_DEVICE_MODE, Vec::new())
        }
    }

    /// A file of any mode.
    pub fn with_mode(name: &str, mode: u32, data: Vec<u8>) -> FileEntry {
        FileEntry {
            name: String::from(name),
            mode,
            rdev: (0, 0),
            data,
        }
    }
}

fn pad4(length: usize) -> usize {
    length.next_multiple_of(4)
}

fn push_hex_field(archive: &mut Vec<u8>, value: u32) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..8).rev() {
        archive.push(DIGITS[(value >> (shift * 4)) as usize & 0xf]);
    }
}

/// Appends one entry. Names and files are below 4 GiB (the format's limit).
fn push_entry(
    archive: &mut Vec<u8>,
    inode: u32,
    name: &str,
    mode: u32,
    rdev: (u32, u32),
    data: &[u8],
) {
    let size = u32::try_from(data.len()).expect("cpio newc files are below 4 GiB");
    let name_size = u32::try_from(name.len() + 1).expect("cpio newc names are below 4 GiB");
    let nlink = if mode & FILE_TYPE_MASK == DIRECTORY_TYPE {
        2
    } else {
        1
    };
    let start = archive.len();
    archive.extend_from_slice(NEWC_MAGIC);
    for field in [
        inode, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
    ] {
        push_hex_field(archive, field);
    }
    archive.extend_from_slice(name.as_bytes());
    archive.push(0);
    archive.resize(start + pad4(HEADER_SIZE + name.len() + 1), 0);
    archive.extend_from_slice(data);
    archive.resize(archive.len() + pad4(data.len()) - data.len(), 0);
}

/// Writes `entries` as a newc archive, in the given order, with a trailer.
pub fn write_archive(entries: &[FileEntry]) -> Vec<u8> {
    let mut archive = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let inode = u32::try_from(index + 1).expect("fewer than 4 G entries");
        push_entry(
            &mut archive,
            inode,
            &entry.name,
            entry.mode,
            entry.rdev,
            &entry.data,
        );
    }
    push_entry(&mut archive, 0, TRAILER, 0, (0, 0), &[]);
    archive
}

fn hex_field(bytes: &[u8], at: usize) -> Result<u32, CpioError> {
    bytes.iter().try_fold(0u32, |value, &byte| {
        let digit = char::from(byte)
            .to_digit(16)
            .ok_or(CpioError::BadField(at))?;
        Ok((value << 4) | digit)
    })
}

/// Iterates over the entries of an archive, stopping at the trailer; after
/// an error it yields nothing more.
#[derive(Clone, Debug)]
pub struct Entries<'a> {
    archive: &'a [u8],
    offset: usize,
    done: bool,
}

/// Reads `archive`.
pub fn entries(archive: &[u8]) -> Entries<'_> {
    Entries {
        archive,
        offset: 0,
        done: false,
    }
}

impl<'a> Entries<'a> {
    fn next_entry(&mut self) -> Result<Option<Entry<'a>>, CpioError> {
        let at = self.offset;
        let header = self
            .archive
            .get(at..at + HEADER_SIZE)
            .ok_or(if at >= self.archive.len() {
                CpioError::NoTrailer
            } else {
                CpioError::Truncated(at)
            })?;
        if &header[..6] != NEWC_MAGIC && &header[..6] != NEWC_CRC_MAGIC {
            return Err(CpioError::BadMagic(at));
        }
        let field = |i: usize| hex_field(&header[6 + 8 * i..14 + 8 * i], at);
        let mode = field(1)?;
        let file_size = field(6)? as usize;
        let rdev = (field(9)?, field(10)?);
        let name_size = field(11)? as usize;
        let name_start = at + HEADER_SIZE;
        let name_bytes = self
            .archive
            .get(name_start..name_start + name_size)
            .ok_or(CpioError::Truncated(name_start))?;
        let name = match name_bytes.split_last() {
            Some((0, name)) => {
                core::str::from_utf8(name).map_err(|_| CpioError::BadName(name_start))?
            }
            _ => return Err(CpioError::BadName(name_start)),
        };
        let data_start = pad4(name_start + name_size);
        let data = self
            .archive
            .get(data_start..data_start + file_size)
            .ok_or(CpioError::Truncated(data_start))?;
        self.offset = pad4(data_start + file_size);
        if name == TRAILER {
            return Ok(None);
        }
        let name = name.strip_prefix("./").unwrap_or(name);
        Ok(Some(Entry {
            name,
            mode,
            rdev,
            data,
        }))
    }

    /// The first entry called `name`, or `None` when the archive has none.
    pub fn find(self, name: &str) -> Result<Option<Entry<'a>>, CpioError> {
        for entry in self {
            let entry = entry?;
            if entry.name == name {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, CpioError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_entry() {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    fn read_all(archive: &[u8]) -> Result<Vec<Entry<'_>>, CpioError> {
        entries(archive).collect()
    }

    #[test]
    fn empty_archive_is_only_a_trailer() {
        let archive = write_archive(&[]);
        assert_eq!(archive.len(), pad4(HEADER_SIZE + TRAILER.len() + 1));
        assert!(archive.starts_with(NEWC_MAGIC));
        assert_eq!(read_all(&archive), Ok(vec![]));
    }

    #[test]
    fn header_fields_are_newc() {
        let archive = write_archive(&[FileEntry::file("kernel", vec![7; 5])]);
        let header = core::str::from_utf8(&archive[..HEADER_SIZE]).unwrap();
        // magic, ino 1, mode 100644, uid, gid, nlink 1, mtime, size 5, ..., namesize 7
        assert_eq!(&header[0..6], "070701");
        assert_eq!(&header[6..14], "00000001");
        assert_eq!(&header[14..22], "000081a4");
        assert_eq!(&header[38..46], "00000001");
        assert_eq!(&header[54..62], "00000005");
        assert_eq!(&header[94..102], "00000007");
        assert_eq!(&archive[HEADER_SIZE..HEADER_SIZE + 7], b"kernel\0");
        // 110 + 7 = 117 -> data at 120, 5 bytes padded to 8.
        assert_eq!(&archive[120..125], &[7; 5]);
        assert_eq!(&archive[125..128], &[0; 3]);
        assert_eq!(&archive[128..134], NEWC_MAGIC);
    }

    #[test]
    fn special_files_keep_their_mode_and_device_number() {
        let archive = write_archive(&[
            FileEntry::directory("dev"),
            FileEntry::char_device("dev/console", 5, 1),
            FileEntry::symlink("bin/sh", "busybox"),
            FileEntry::executable("init", b"#!/bin/sh\n".to_vec()),
        ]);
        let header = core::str::from_utf8(&archive[..HEADER_SIZE]).unwrap();
        assert_eq!(&header[14..22], "000041ed");
        assert_eq!(&header[38..46], "00000002", "a directory has two links");
        let read = read_all(&archive).unwrap();
        assert_eq!(read[1].mode, CHAR_DEVICE_MODE);
        assert_eq!(read[1].rdev, (5, 1));
        assert_eq!(read[2].mode, SYMLINK_MODE);
        assert_eq!(read[2].data, b"busybox");
        assert_eq!(read[3].mode, EXECUTABLE_MODE);
    }

    #[test]
    fn names_lose_a_leading_dot_slash_and_find_takes_the_first() {
        let archive = write_archive(&[
            FileEntry::file("./cmdline", b"test=memory".to_vec()),
            FileEntry::file("cmdline", b"second".to_vec()),
        ]);
        let found = entries(&archive).find("cmdline").unwrap().unwrap();
        assert_eq!(found.data, b"test=memory");
        assert_eq!(entries(&archive).find("initrd"), Ok(None));
    }

    #[test]
    fn damaged_archives_are_rejected() {
        let archive = write_archive(&[FileEntry::file("kernel", b"0123456789".to_vec())]);
        assert_eq!(
            entries(&archive[..50]).next(),
            Some(Err(CpioError::Truncated(0)))
        );
        assert_eq!(
            entries(&archive[..120]).next(),
            Some(Err(CpioError::Truncated(120)))
        );
        let mut bad = archive.clone();
        bad[0] = b'X';
        assert_eq!(entries(&bad).next(), Some(Err(CpioError::BadMagic(0))));
        let mut bad = archive.clone();
        bad[20] = b'g';
        assert_eq!(entries(&bad).next(), Some(Err(CpioError::BadField(0))));
        let mut bad = archive.clone();
        bad[HEADER_SIZE + 6] = b'x'; // the name's NUL
        assert_eq!(
            entries(&bad).next(),
            Some(Err(CpioError::BadName(HEADER_SIZE)))
        );
        let trailer_at = archive.len() - pad4(HEADER_SIZE + TRAILER.len() + 1);
        let results: Vec<_> = entries(&archive[..trailer_at]).collect();
        assert_eq!(results.len(), 2);
        assert_eq!(results[1], Err(CpioError::NoTrailer));
    }

    proptest! {
        #[test]
        fn archives_round_trip(files in proptest::collection::vec(
            ("[a-z][a-z./]{0,11}", proptest::collection::vec(any::<u8>(), 0..300),
             prop_oneof![Just(REGULAR_FILE_MODE), Just(EXECUTABLE_MODE), Just(SYMLINK_MODE),
                         Just(DIRECTORY_MODE), Just(CHAR_DEVICE_MODE)],
             (0u32..4096, 0u32..1 << 20)), 0..6)) {
            let written: Vec<FileEntry> = files
                .into_iter()
                .map(|(name, data, mode, rdev)| FileEntry { name, mode, rdev, data })
                .filter(|e| e.name != TRAILER)
                .collect();
            let archive = write_archive(&written);
            prop_assert_eq!(archive.len() % 4, 0);
            let read = read_all(&archive).unwrap();
            prop_assert_eq!(read.len(), written.len());
            for (read, written) in read.iter().zip(&written) {
                prop_assert_eq!(read.name, written.name.as_str());
                prop_assert_eq!(read.mode, written.mode);
                prop_assert_eq!(read.rdev, written.rdev);
                prop_assert_eq!(read.data, written.data.as_slice());
            }
        }
    }
}
