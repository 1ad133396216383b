//! Reader for the boot payload: an uncompressed cpio archive in "newc" format.
//!
//! Each entry is a 110-byte ASCII header (magic `070701` or `070702`, then 13
//! eight-digit hex fields), the NUL-terminated name padded so that header plus
//! name is a multiple of 4, then the data padded to a multiple of 4. The entry
//! named `TRAILER!!!` ends the archive. Names are compared without a leading
//! `./`, so archives made by `find . | cpio -o -H newc` work too.

/// Why an archive could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpioError {
    /// The archive ends inside a header, name or data (at this offset).
    Truncated(usize),
    /// The header at this offset has no newc magic.
    BadMagic(usize),
    /// A header field at this offset is not hexadecimal.
    BadNumber(usize),
    /// The name at this offset is not NUL-terminated UTF-8.
    BadName(usize),
    /// The archive ended without a `TRAILER!!!` entry.
    NoTrailer,
}

impl core::fmt::Display for CpioError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Truncated(at) => write!(f, "archive truncated at offset {at:#x}"),
            Self::BadMagic(at) => write!(f, "no cpio newc magic at offset {at:#x}"),
            Self::BadNumber(at) => write!(f, "bad hex field in header at offset {at:#x}"),
            Self::BadName(at) => write!(f, "bad entry name at offset {at:#x}"),
            Self::NoTrailer => write!(f, "archive has no TRAILER!!! entry"),
        }
    }
}

/// One archive member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The name, without a leading `./`.
    pub name: &'a str,
    /// The file mode (type and permission bits).
    pub mode: u32,
    /// The contents.
    pub data: &'a [u8],
}

const HEADER_LEN: usize = 110;
const TRAILER: &str = "TRAILER!!!";

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn hex_field(bytes: &[u8], at: usize) -> Result<u32, CpioError> {
    let mut value = 0u32;
    for &b in bytes {
        let digit = (b as char).to_digit(16).ok_or(CpioError::BadNumber(at))?;
        value = (value << 4) | digit;
    }
    Ok(value)
}

/// Iterates over the entries of an archive, stopping at the trailer.
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
            .get(at..at + HEADER_LEN)
            .ok_or(if at == self.archive.len() {
                CpioError::NoTrailer
            } else {
                CpioError::Truncated(at)
            })?;
        if &header[..6] != b"070701" && &header[..6] != b"070702" {
            return Err(CpioError::BadMagic(at));
        }
        let field = |i: usize| hex_field(&header[6 + 8 * i..14 + 8 * i], at);
        let mode = field(1)?;
        let file_size = field(6)? as usize;
        let name_size = field(11)? as usize;
        let name_start = at + HEADER_LEN;
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
        let data_start = align4(name_start + name_size);
        let data = self
            .archive
            .get(data_start..data_start + file_size)
            .ok_or(CpioError::Truncated(data_start))?;
        self.offset = align4(data_start + file_size);
        if name == TRAILER {
            return Ok(None);
        }
        let name = name.strip_prefix("./").unwrap_or(name);
        Ok(Some(Entry { name, mode, data }))
    }

    /// The entry called `name`, or `None` when the archive has none.
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
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a newc archive the way `cpio -o -H newc` does.
    pub(crate) fn build(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut add = |name: &str, data: &[u8], mode: u32| {
            let header = format!(
                "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
                1,
                mode,
                0,
                0,
                1,
                0,
                data.len(),
                0,
                0,
                0,
                0,
                name.len() + 1,
                0
            );
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            while out.len() % 4 != 0 {
                out.push(0);
            }
            out.extend_from_slice(data);
            while out.len() % 4 != 0 {
                out.push(0);
            }
        };
        for (name, data) in files {
            add(name, data, 0o100644);
        }
        add(TRAILER, &[], 0);
        out
    }

    #[test]
    fn reads_entries_in_order() {
        let archive = build(&[
            ("kernel", b"KERNEL!"),
            ("./cmdline", b"test=memory"),
            ("vm.conf", b""),
        ]);
        let all: Vec<Entry> = entries(&archive).collect::<Result<_, _>>().expect("valid");
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].name, "kernel");
        assert_eq!(all[0].data, b"KERNEL!");
        assert_eq!(all[0].mode, 0o100644);
        assert_eq!(all[1].name, "cmdline");
        assert_eq!(all[1].data, b"test=memory");
        assert_eq!(all[2].data, b"");
        assert_eq!(
            entries(&archive)
                .find("cmdline")
                .expect("ok")
                .expect("present")
                .data,
            b"test=memory"
        );
        assert_eq!(entries(&archive).find("initrd"), Ok(None));
    }

    #[test]
    fn errors() {
        let archive = build(&[("kernel", b"0123456789")]);
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
        assert_eq!(entries(&bad).next(), Some(Err(CpioError::BadNumber(0))));
        // Cut right after the first entry: no trailer.
        let first_len = align4(align4(HEADER_LEN + 7) + 10);
        let cut = &archive[..first_len];
        let results: Vec<_> = entries(cut).collect();
        assert_eq!(results.len(), 2);
        assert_eq!(results[1], Err(CpioError::NoTrailer));
    }

    proptest::proptest! {
        #[test]
        fn round_trip(files in proptest::collection::vec(("[a-z]{1,12}", proptest::collection::vec(0u8.., 0..300)), 0..6)) {
            let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
            let archive = build(&refs);
            let read: Vec<Entry> = entries(&archive).collect::<Result<_, _>>().expect("valid");
            proptest::prop_assert_eq!(read.len(), files.len());
            for (entry, (name, data)) in read.iter().zip(&files) {
                proptest::prop_assert_eq!(entry.name, name.as_str());
                proptest::prop_assert_eq!(entry.data, data.as_slice());
            }
        }
    }
}
