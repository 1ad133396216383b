//! The Linux arm64 `Image` header, for guest kernels in the boot payload.
//!
//! The 64-byte header holds two instruction words, `text_offset`,
//! `image_size`, `flags`, three reserved words, the magic `ARM\x64` at 0x38 and
//! the PE header offset. A kernel is loaded at a 2 MiB aligned base plus
//! `text_offset` and entered at its first byte. `image_size` counts the memory
//! the kernel uses from its load address (including its BSS); an old kernel
//! with `image_size` 0 gets the file size and the historical text offset.

/// Size of the header.
pub const HEADER_LEN: usize = 64;
/// The magic at offset 0x38.
pub const MAGIC: u32 = 0x644d_5241;
/// `text_offset` assumed when `image_size` is 0 (kernels before 3.17).
pub const LEGACY_TEXT_OFFSET: u64 = 0x8_0000;

/// Why a kernel image was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageError {
    /// Shorter than the 64-byte header.
    TooShort(usize),
    /// No `ARM\x64` magic at 0x38.
    BadMagic(u32),
    /// `flags` bit 0 says big-endian.
    BigEndian,
    /// `flags` bits 2:1 ask for a page size other than 4 KiB (the value).
    UnsupportedPageSize(u64),
    /// `image_size` is smaller than the file.
    SizeSmallerThanFile {
        /// `image_size` from the header.
        image_size: u64,
        /// Length of the file.
        file_len: u64,
    },
}

impl core::fmt::Display for ImageError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TooShort(len) => write!(f, "{len} bytes is shorter than an Image header"),
            Self::BadMagic(m) => write!(f, "no ARM\\x64 magic (found {m:#010x})"),
            Self::BigEndian => write!(f, "big-endian kernels are not supported"),
            Self::UnsupportedPageSize(v) => write!(f, "kernel page-size flag {v} is not 4 KiB"),
            Self::SizeSmallerThanFile {
                image_size,
                file_len,
            } => {
                write!(
                    f,
                    "image_size {image_size:#x} is smaller than the file ({file_len:#x} bytes)"
                )
            }
        }
    }
}

/// A parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// Offset of the load address from a 2 MiB aligned base.
    pub text_offset: u64,
    /// Bytes the kernel occupies from its load address.
    pub image_size: u64,
    /// The kernel may be placed anywhere in memory (flags bit 3).
    pub anywhere: bool,
}

fn le64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

impl ImageHeader {
    /// Parses the header at the start of `image`.
    pub fn parse(image: &[u8]) -> Result<Self, ImageError> {
        if image.len() < HEADER_LEN {
            return Err(ImageError::TooShort(image.len()));
        }
        let magic = u32::from_le_bytes([image[0x38], image[0x39], image[0x3a], image[0x3b]]);
        if magic != MAGIC {
            return Err(ImageError::BadMagic(magic));
        }
        let text_offset = le64(image, 8);
        let image_size = le64(image, 16);
        let flags = le64(image, 24);
        let file_len = image.len() as u64;
        if image_size == 0 {
            return Ok(Self {
                text_offset: LEGACY_TEXT_OFFSET,
                image_size: file_len,
                anywhere: false,
            });
        }
        if flags & 1 != 0 {
            return Err(ImageError::BigEndian);
        }
        let page_size = (flags >> 1) & 3;
        if page_size > 1 {
            return Err(ImageError::UnsupportedPageSize(page_size));
        }
        if image_size < file_len {
            return Err(ImageError::SizeSmallerThanFile {
                image_size,
                file_len,
            });
        }
        Ok(Self {
            text_offset,
            image_size,
            anywhere: flags & 8 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text_offset: u64, image_size: u64, flags: u64) -> Vec<u8> {
        let mut h = vec![0u8; 256];
        h[8..16].copy_from_slice(&text_offset.to_le_bytes());
        h[16..24].copy_from_slice(&image_size.to_le_bytes());
        h[24..32].copy_from_slice(&flags.to_le_bytes());
        h[0x38..0x3c].copy_from_slice(b"ARM\x64");
        h
    }

    #[test]
    fn parses_a_modern_header() {
        let h = ImageHeader::parse(&header(0, 0x20_0000, 0xa)).expect("valid");
        assert_eq!(
            h,
            ImageHeader {
                text_offset: 0,
                image_size: 0x20_0000,
                anywhere: true
            }
        );
    }

    #[test]
    fn legacy_and_errors() {
        let h = ImageHeader::parse(&header(0x1234, 0, 0)).expect("valid");
        assert_eq!(h.text_offset, LEGACY_TEXT_OFFSET);
        assert_eq!(h.image_size, 256);
        assert_eq!(ImageHeader::parse(&[0; 10]), Err(ImageError::TooShort(10)));
        let mut bad = header(0, 0x1000, 0);
        bad[0x38] = 0;
        assert!(matches!(
            ImageHeader::parse(&bad),
            Err(ImageError::BadMagic(_))
        ));
        assert_eq!(
            ImageHeader::parse(&header(0, 0x1000, 1)),
            Err(ImageError::BigEndian)
        );
        assert_eq!(
            ImageHeader::parse(&header(0, 0x1000, 4)),
            Err(ImageError::UnsupportedPageSize(2))
        );
        assert_eq!(
            ImageHeader::parse(&header(0, 100, 2)),
            Err(ImageError::SizeSmallerThanFile {
                image_size: 100,
                file_len: 256
            })
        );
    }
}
