//! The storage behind a virtio-blk device: 512-byte sectors read into and
//! written from host spans (guest buffers translated through the memslots,
//! so a disk can move data straight to and from the guest's pages).
//!
//! On QEMU the backend is QEMU's own virtio-mmio disk, driven at EL2
//! (`arch`); a [`BlockBackend`] may also be a window of sectors of a larger
//! disk, so several VMs share one host disk without seeing each other's
//! parts. Tests use a host vector.

use super::guest_memory::HostSpan;
use core::fmt;

/// Bytes per sector, the unit of every virtio-blk offset.
pub const SECTOR_SIZE: u64 = 512;

/// Why a block request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockError {
    /// The request reaches past the last sector.
    OutOfRange {
        /// Its first sector.
        sector: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A write to a read-only backend.
    ReadOnly,
    /// A length that is not a whole number of sectors.
    Unaligned {
        /// The length in bytes.
        len: u64,
    },
    /// The device behind the backend reported an error.
    Device,
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { sector, len } => {
                write!(f, "{len} bytes at sector {sector} run past the disk's end")
            }
            Self::ReadOnly => f.write_str("the disk is read-only"),
            Self::Unaligned { len } => write!(f, "{len} bytes is not a whole number of sectors"),
            Self::Device => f.write_str("the host disk reported an error"),
        }
    }
}

impl core::error::Error for BlockError {}

/// A disk of 512-byte sectors.
///
/// `read` and `write` move `spans` in order, starting at `sector`: the
/// spans' lengths add up to the transfer, which must be a whole number of
/// sectors (a single span need not be). Calls may come from several CPUs at
/// once; the backend serialises what it must.
pub trait BlockBackend: Send + Sync {
    /// The disk's size in sectors.
    fn capacity_sectors(&self) -> u64;

    /// Whether writes are refused.
    fn read_only(&self) -> bool;

    /// Reads from `sector` on into `spans`.
    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError>;

    /// Writes `spans` to `sector` on.
    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError>;

    /// Makes every completed write durable (virtio-blk `FLUSH`).
    fn flush(&self) -> Result<(), BlockError>;

    /// The disk's identifier for `GET_ID` (up to 20 bytes, zero padded).
    fn id(&self) -> [u8; 20];
}
