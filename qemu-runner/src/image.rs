//! ELF to raw arm64 `Image` conversion.
//!
//! QEMU passes the device tree in `x0` only to a raw `Image`, not to an ELF,
//! and U-Boot's `booti` only loads raw Images. The conversion copies every
//! loadable segment's file bytes to its physical address (`p_paddr`) relative
//! to the lowest one, into one flat file; gaps are zero. Nothing else is filled
//! in: the program itself carries its 64-byte header (branch, `text_offset`,
//! `image_size`, flags, magic `ARM\x64` at 0x38), and the conversion checks it
//! is there at the start with the `boot-payload` crate's parser, the one the
//! hypervisor reads its guests' headers with.

use std::fmt;

use boot_payload::image::{self as arm64_image, ImageHeader};

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, FileKind};

/// Largest Image accepted (a guard against a bogus `p_paddr` spread).
pub const MAX_IMAGE_SIZE: u64 = 512 << 20;

/// Why an ELF could not become an `Image`, or an `Image` header is bad.
#[derive(Debug)]
pub enum ImageError {
    /// The file is not a 64-bit ELF.
    NotElf64,
    /// The ELF could not be parsed.
    Parse(object::Error),
    /// The ELF is not for AArch64.
    NotAarch64(u16),
    /// No loadable segment has file contents.
    NoLoadableSegment,
    /// A segment's file range lies outside the file.
    SegmentOutsideFile {
        /// Segment's physical address.
        paddr: u64,
    },
    /// The segments spread over more than [`MAX_IMAGE_SIZE`].
    TooLarge(u64),
    /// Two segments overlap in physical memory.
    Overlap {
        /// Physical address where they overlap.
        paddr: u64,
    },
    /// The result does not start with a valid `Image` header (the program
    /// must carry its own).
    Header(arm64_image::ImageError),
    /// The header says `image_size` 0 (then `text_offset` is meaningless).
    ZeroImageSize,
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::NotElf64 => write!(f, "not a 64-bit ELF file"),
            ImageError::Parse(error) => write!(f, "cannot parse the ELF: {error}"),
            ImageError::NotAarch64(machine) => {
                write!(f, "ELF machine is {machine}, not AArch64 (183)")
            }
            ImageError::NoLoadableSegment => write!(f, "no loadable segment with contents"),
            ImageError::SegmentOutsideFile { paddr } => {
                write!(f, "segment at {paddr:#x} reaches past the end of the file")
            }
            ImageError::TooLarge(size) => {
                write!(
                    f,
                    "segments span {size:#x} bytes, more than {MAX_IMAGE_SIZE:#x}"
                )
            }
            ImageError::Overlap { paddr } => write!(f, "segments overlap at {paddr:#x}"),
            ImageError::Header(error) => {
                write!(f, "{error} (the program must start with its Image header)")
            }
            ImageError::ZeroImageSize => write!(f, "Image header has image_size 0"),
        }
    }
}

impl std::error::Error for ImageError {}

/// Reads and checks the `Image` header at the start of a built program: a
/// valid header with a nonzero `image_size` (the legacy form without one is
/// for old Linux kernels, not for programs built here).
pub fn built_image_header(image: &[u8]) -> Result<ImageHeader, ImageError> {
    let (parsed, format) = arm64_image::parse_kernel(image).map_err(ImageError::Header)?;
    if format != arm64_image::KernelFormat::Image {
        let mut found = [0u8; 4];
        if let Some(magic) = image.get(arm64_image::MAGIC_OFFSET..arm64_image::MAGIC_OFFSET + 4) {
            found.copy_from_slice(magic);
        }
        return Err(ImageError::Header(arm64_image::ImageError::BadMagic(found)));
    }
    if u64::from_le_bytes(image[0x10..0x18].try_into().expect("8 bytes")) == 0 {
        return Err(ImageError::ZeroImageSize);
    }
    Ok(parsed)
}

/// The lowest virtual address of an ELF's loadable segments (where its
/// symbols start; the Image's first byte corresponds to it).
pub fn elf_link_base(elf_bytes: &[u8]) -> Result<u64, ImageError> {
    let file = ElfFile64::<Endianness>::parse(elf_bytes).map_err(ImageError::Parse)?;
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|header| header.p_type(endian) == elf::PT_LOAD && header.p_filesz(endian) > 0)
        .map(|header| header.p_vaddr(endian))
        .min()
        .ok_or(ImageError::NoLoadableSegment)
}

/// Converts an AArch64 ELF executable into a raw `Image` and checks its header.
pub fn elf_to_image(elf_bytes: &[u8]) -> Result<Vec<u8>, ImageError> {
    if FileKind::parse(elf_bytes).map_err(ImageError::Parse)? != FileKind::Elf64 {
        return Err(ImageError::NotElf64);
    }
    let file = ElfFile64::<Endianness>::parse(elf_bytes).map_err(ImageError::Parse)?;
    let endian = file.endian();
    let machine = file.elf_header().e_machine(endian);
    if machine != elf::EM_AARCH64 {
        return Err(ImageError::NotAarch64(machine.0));
    }
    let mut segments: Vec<(u64, &[u8])> = Vec::new();
    for header in file.elf_program_headers() {
        if header.p_type(endian) != elf::PT_LOAD || header.p_filesz(endian) == 0 {
            continue;
        }
        let paddr = header.p_paddr(endian);
        let data = header
            .data(endian, elf_bytes)
            .map_err(|()| ImageError::SegmentOutsideFile { paddr })?;
        segments.push((paddr, data));
    }
    segments.sort_by_key(|&(paddr, _)| paddr);
    let base = segments.first().ok_or(ImageError::NoLoadableSegment)?.0;
    let end = segments
        .iter()
        .map(|&(paddr, data)| paddr + data.len() as u64)
        .max()
        .unwrap_or(base);
    if end - base > MAX_IMAGE_SIZE {
        return Err(ImageError::TooLarge(end - base));
    }
    let mut image = vec![0u8; (end - base) as usize];
    let mut filled_to = base;
    for (paddr, data) in segments {
        if paddr < filled_to {
            return Err(ImageError::Overlap { paddr });
        }
        let offset = (paddr - base) as usize;
        image[offset..offset + data.len()].copy_from_slice(data);
        filled_to = paddr + data.len() as u64;
    }
    built_image_header(&image)?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loadable segment of a test ELF: physical address, contents, and
    /// extra zero bytes in memory only (`.bss`).
    struct Segment {
        paddr: u64,
        data: Vec<u8>,
        bss: u64,
    }

    /// Writes a minimal little-endian ELF64 executable with `segments`.
    fn elf(machine: u16, segments: &[Segment]) -> Vec<u8> {
        const EHDR: usize = 64;
        const PHDR: usize = 56;
        let mut file = vec![0u8; EHDR + PHDR * segments.len()];
        file[..4].copy_from_slice(b"\x7fELF");
        file[4] = 2; // 64-bit
        file[5] = 1; // little endian
        file[6] = 1; // version
        file[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        file[18..20].copy_from_slice(&machine.to_le_bytes());
        file[20..24].copy_from_slice(&1u32.to_le_bytes());
        file[32..40].copy_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
        file[52..54].copy_from_slice(&(EHDR as u16).to_le_bytes());
        file[54..56].copy_from_slice(&(PHDR as u16).to_le_bytes());
        file[56..58].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        for (index, segment) in segments.iter().enumerate() {
            let offset = file.len() as u64;
            file.extend_from_slice(&segment.data);
            let header = EHDR + index * PHDR;
            let fields: [u64; 6] = [
                offset,
                segment.paddr + 0xffff_0000_0000_0000, // p_vaddr differs from p_paddr
                segment.paddr,
                segment.data.len() as u64,
                segment.data.len() as u64 + segment.bss,
                0x1000,
            ];
            file[header..header + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
            file[header + 4..header + 8].copy_from_slice(&5u32.to_le_bytes());
            for (i, field) in fields.iter().enumerate() {
                let at = header + 8 + i * 8;
                file[at..at + 8].copy_from_slice(&field.to_le_bytes());
            }
        }
        file
    }

    fn header(text_offset: u64, image_size: u64) -> Vec<u8> {
        let mut header = vec![0u8; arm64_image::HEADER_SIZE];
        header[..4].copy_from_slice(&0x1400_0010u32.to_le_bytes()); // b +0x40
        header[8..16].copy_from_slice(&text_offset.to_le_bytes());
        header[16..24].copy_from_slice(&image_size.to_le_bytes());
        header[24..32].copy_from_slice(&2u64.to_le_bytes());
        header[arm64_image::MAGIC_OFFSET..arm64_image::MAGIC_OFFSET + 4]
            .copy_from_slice(&arm64_image::MAGIC);
        header
    }

    #[test]
    fn segments_land_at_physical_offsets_with_zero_gaps() {
        let mut text = header(0x8_0000, 0x3000);
        text.extend_from_slice(&[0xaa; 16]);
        let elf = elf(
            183,
            &[
                Segment {
                    paddr: 0x4008_2000,
                    data: vec![0xcc; 8],
                    bss: 0x100,
                },
                Segment {
                    paddr: 0x4008_0000,
                    data: text.clone(),
                    bss: 0,
                },
                Segment {
                    paddr: 0x4009_0000,
                    data: vec![],
                    bss: 0x1000,
                },
            ],
        );
        let image = elf_to_image(&elf).unwrap();
        assert_eq!(
            image.len(),
            0x2008,
            "ends at the last file byte, .bss not filled in"
        );
        assert_eq!(&image[..text.len()], &text[..]);
        assert!(image[text.len()..0x2000].iter().all(|&b| b == 0));
        assert_eq!(&image[0x2000..], &[0xcc; 8]);
        assert_eq!(
            built_image_header(&image).unwrap(),
            ImageHeader {
                text_offset: 0x8_0000,
                image_size: 0x3000,
                anywhere: false
            }
        );
    }

    #[test]
    fn missing_header_wrong_machine_and_overlaps_are_errors() {
        let plain = elf(
            183,
            &[Segment {
                paddr: 0x4000_0000,
                data: vec![1; 128],
                bss: 0,
            }],
        );
        assert!(matches!(
            elf_to_image(&plain),
            Err(ImageError::Header(arm64_image::ImageError::BadMagic(_)))
        ));
        let x86 = elf(
            62,
            &[Segment {
                paddr: 0,
                data: header(0, 64),
                bss: 0,
            }],
        );
        assert!(matches!(
            elf_to_image(&x86),
            Err(ImageError::NotAarch64(62))
        ));
        let empty = elf(
            183,
            &[Segment {
                paddr: 0,
                data: vec![],
                bss: 64,
            }],
        );
        assert!(matches!(
            elf_to_image(&empty),
            Err(ImageError::NoLoadableSegment)
        ));
        let overlapping = elf(
            183,
            &[
                Segment {
                    paddr: 0x1000,
                    data: header(0, 0x100),
                    bss: 0,
                },
                Segment {
                    paddr: 0x1020,
                    data: vec![2; 8],
                    bss: 0,
                },
            ],
        );
        assert!(matches!(
            elf_to_image(&overlapping),
            Err(ImageError::Overlap { paddr: 0x1020 })
        ));
        assert!(matches!(
            elf_to_image(b"not an elf at all"),
            Err(ImageError::Parse(_))
        ));
        let mut zero_size = header(0, 0);
        zero_size.resize(100, 0);
        assert!(matches!(
            built_image_header(&zero_size),
            Err(ImageError::ZeroImageSize)
        ));
        assert!(matches!(
            built_image_header(&[0; 10]),
            Err(ImageError::Header(arm64_image::ImageError::BadMagic(_)))
        ));
    }
}
