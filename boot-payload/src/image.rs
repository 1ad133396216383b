//! The Linux arm64 `Image` header, for guest kernels in the boot payload.
//!
//! The 64-byte header holds two instruction words, `text_offset`,
//! `image_size`, `flags`, three reserved words, the magic `ARM\x64` at 0x38 and
//! the PE header offset. A kernel is loaded at a 2 MiB aligned base plus
//! `text_offset` and entered at its first byte. `image_size` counts the memory
//! the kernel uses from its load address (including its BSS); an old kernel
//! with `image_size` 0 gets the file size and the historical text offset.
//!
//! A kernel without the header is a raw binary, as QEMU's `-kernel` takes it
//! (many bare-metal test suites ship as such): it is loaded 512 KiB
//! ([`RAW_BINARY_OFFSET`]) above the start of RAM and entered at its first
//! byte with the device tree in `x0`, exactly like an `Image`
//! ([`parse_kernel`]). An ELF file is refused rather than loaded as raw bytes,
//! since its first byte is not code.

/// Size of the header.
pub const HEADER_SIZE: usize = 64;
/// Offset of the magic in the header.
pub const MAGIC_OFFSET: usize = 0x38;
/// The magic, `ARM\x64`.
pub const MAGIC: [u8; 4] = *b"ARM\x64";
/// `text_offset` assumed when `image_size` is 0 (kernels before 3.17).
pub const LEGACY_TEXT_OFFSET: u64 = 0x8_0000;
/// Where a raw binary goes, from the start of guest RAM (QEMU's
/// `KERNEL64_LOAD_ADDR`).
pub const RAW_BINARY_OFFSET: u64 = 0x8_0000;
/// The ELF magic.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// What kind of kernel file the payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// An arm64 `Image`, placed by its header.
    Image,
    /// A raw binary without a header, placed at [`RAW_BINARY_OFFSET`].
    RawBinary,
}

/// Reads the kernel file: an `Image` is placed by its header (and refused
/// when the header is invalid), a raw binary at [`RAW_BINARY_OFFSET`] with
/// its own length as `image_size`; an empty file or an ELF file is refused.
pub fn parse_kernel(file: &[u8]) -> Result<(ImageHeader, KernelFormat), ImageError> {
    if file.is_empty() {
        return Err(ImageError::TooShort(0));
    }
    if file.starts_with(ELF_MAGIC) {
        return Err(ImageError::Elf);
    }
    if has_image_magic(file) {
        return ImageHeader::parse(file).map(|header| (header, KernelFormat::Image));
    }
    let raw = ImageHeader {
        text_offset: RAW_BINARY_OFFSET,
        image_size: file.len() as u64,
        anywhere: false,
    };
    Ok((raw, KernelFormat::RawBinary))
}

/// Whether `file` starts with an `Image` header (its magic).
pub fn has_image_magic(file: &[u8]) -> bool {
    file.len() >= HEADER_SIZE && file[MAGIC_OFFSET..MAGIC_OFFSET + 4] == MAGIC
}

/// Why a kernel image was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageError {
    /// Shorter than the 64-byte header.
    TooShort(usize),
    /// No `ARM\x64` magic at 0x38 (the bytes found).
    BadMagic([u8; 4]),
    /// `flags` bit 0 says big-endian.
    BigEndian,
    /// An ELF file, which is neither an `Image` nor a raw binary.
    Elf,
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

impl core::error::Error for ImageError {}

impl core::fmt::Display for ImageError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TooShort(len) => write!(f, "{len} bytes is shorter than an Image header"),
            Self::BadMagic(found) => write!(
                f,
                "no arm64 Image header: magic at {MAGIC_OFFSET:#x} is {found:02x?}, expected \
                 \"ARM\\x64\""
            ),
            Self::BigEndian => write!(f, "big-endian kernels are not supported"),
            Self::Elf => write!(
                f,
                "the kernel is an ELF file; give an arm64 Image or a raw binary \
                 (objcopy -O binary)"
            ),
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
        if image.len() < HEADER_SIZE {
            return Err(ImageError::TooShort(image.len()));
        }
        let magic: [u8; 4] = image[MAGIC_OFFSET..MAGIC_OFFSET + 4]
            .try_into()
            .expect("4 bytes");
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

    use alloc::vec;
    use alloc::vec::Vec;

    fn header_bytes(text_offset: u64, image_size: u64, flags: u64) -> Vec<u8> {
        let mut h = vec![0u8; 256];
        h[8..16].copy_from_slice(&text_offset.to_le_bytes());
        h[16..24].copy_from_slice(&image_size.to_le_bytes());
        h[24..32].copy_from_slice(&flags.to_le_bytes());
        h[0x38..0x3c].copy_from_slice(b"ARM\x64");
        h
    }

    #[test]
    fn parses_a_modern_header() {
        let h = ImageHeader::parse(&header_bytes(0, 0x20_0000, 0xa)).expect("valid");
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
    fn kernels_without_a_header_are_raw_binaries_and_elf_files_are_refused() {
        let raw = [0x00, 0x00, 0x00, 0x14]; // b .
        assert_eq!(
            parse_kernel(&raw),
            Ok((
                ImageHeader {
                    text_offset: RAW_BINARY_OFFSET,
                    image_size: 4,
                    anywhere: false
                },
                KernelFormat::RawBinary
            ))
        );
        let big_raw = vec![0x5a; 3 << 20];
        let (header, format) = parse_kernel(&big_raw).expect("raw");
        assert_eq!(
            (header.image_size, format),
            (3 << 20, KernelFormat::RawBinary)
        );
        let image = header_bytes(0, 0x20_0000, 0xa);
        assert_eq!(
            parse_kernel(&image).map(|(_, f)| f),
            Ok(KernelFormat::Image)
        );
        let mut bad_image = header_bytes(0, 100, 2);
        assert_eq!(
            parse_kernel(&bad_image).map(|(_, f)| f),
            Err(ImageError::SizeSmallerThanFile {
                image_size: 100,
                file_len: 256
            }),
            "an Image with a bad header is not taken for a raw binary"
        );
        bad_image[0x38] = b'X';
        assert_eq!(
            parse_kernel(&bad_image).map(|(_, f)| f),
            Ok(KernelFormat::RawBinary)
        );
        assert_eq!(parse_kernel(b"\x7fELF\x02\x01\x01"), Err(ImageError::Elf));
        assert_eq!(parse_kernel(&[]), Err(ImageError::TooShort(0)));
    }

    #[test]
    fn legacy_and_errors() {
        let h = ImageHeader::parse(&header_bytes(0x1234, 0, 0)).expect("valid");
        assert_eq!(h.text_offset, LEGACY_TEXT_OFFSET);
        assert_eq!(h.image_size, 256);
        assert_eq!(ImageHeader::parse(&[0; 10]), Err(ImageError::TooShort(10)));
        let mut bad = header_bytes(0, 0x1000, 0);
        bad[0x38] = 0;
        assert!(matches!(
            ImageHeader::parse(&bad),
            Err(ImageError::BadMagic(_))
        ));
        assert_eq!(
            ImageHeader::parse(&header_bytes(0, 0x1000, 1)),
            Err(ImageError::BigEndian)
        );
        assert_eq!(
            ImageHeader::parse(&header_bytes(0, 0x1000, 4)),
            Err(ImageError::UnsupportedPageSize(2))
        );
        assert_eq!(
            ImageHeader::parse(&header_bytes(0, 100, 2)),
            Err(ImageError::SizeSmallerThanFile {
                image_size: 100,
                file_len: 256
            })
        );
    }
}
