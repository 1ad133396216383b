//! The storage behind a virtio-blk device: 512-byte sectors read into and
//! written from host spans (guest buffers translated through the memslots,
//! so a disk can move data straight to and from the guest's pages).
//!
//! On QEMU the backend is QEMU's own virtio-mmio disk, driven at EL2
//! (`arch`); a [`BlockBackend`] may also be a window of sectors of a larger
//! disk, so several VMs share one host disk without seeing each other's
//! parts. Tests use a host vector.
//!
//! Every backend checks a transfer the same way before it moves a byte
//! ([`check_transfer`]): the spans' total must be a whole number of
//! sectors (else `Unaligned`), the sectors it covers must lie inside the
//! disk (else `OutOfRange`, also when the numbers overflow), and a write
//! needs a disk that takes writes (else `ReadOnly`), in that order.

use crate::devices::guest_memory::HostSpan;
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

/// The length in bytes of a transfer of `spans` from `sector` on (a write
/// when `write`), once it is known to be a whole number of sectors inside a
/// disk of `capacity` sectors and, for a write, that the disk is not
/// `read_only`; the first refusal otherwise (see the module
/// documentation).
pub fn check_transfer(
    capacity: u64,
    read_only: bool,
    write: bool,
    sector: u64,
    spans: &[HostSpan],
) -> Result<u64, BlockError> {
    let len = spans
        .iter()
        .try_fold(0u64, |sum, s| sum.checked_add(s.len))
        .ok_or(BlockError::OutOfRange {
            sector,
            len: u64::MAX,
        })?;
    if len % SECTOR_SIZE != 0 {
        return Err(BlockError::Unaligned { len });
    }
    let end = sector.checked_add(len / SECTOR_SIZE);
    if end.is_none_or(|end| end > capacity) {
        return Err(BlockError::OutOfRange { sector, len });
    }
    if write && read_only {
        return Err(BlockError::ReadOnly);
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spans(lens: &[u64]) -> Vec<HostSpan> {
        lens.iter().map(|&len| HostSpan { addr: 0, len }).collect()
    }

    #[test]
    fn whole_sectors_inside_the_disk_pass() {
        assert_eq!(
            check_transfer(8, false, false, 0, &spans(&[4096])),
            Ok(4096)
        );
        assert_eq!(check_transfer(8, false, true, 7, &spans(&[512])), Ok(512));
        // Spans need not be whole sectors, their total must.
        assert_eq!(
            check_transfer(8, false, true, 0, &spans(&[100, 0, 412, 512])),
            Ok(1024)
        );
        assert_eq!(check_transfer(8, true, false, 0, &spans(&[512])), Ok(512));
    }

    #[test]
    fn a_ragged_total_is_unaligned() {
        assert_eq!(
            check_transfer(8, false, false, 0, &spans(&[100])),
            Err(BlockError::Unaligned { len: 100 })
        );
        assert_eq!(
            check_transfer(8, false, true, 0, &spans(&[512, 1])),
            Err(BlockError::Unaligned { len: 513 })
        );
    }

    #[test]
    fn past_the_end_is_out_of_range_even_when_the_numbers_overflow() {
        assert_eq!(
            check_transfer(8, false, false, 1, &spans(&[4096])),
            Err(BlockError::OutOfRange {
                sector: 1,
                len: 4096
            })
        );
        assert_eq!(
            check_transfer(8, false, false, u64::MAX, &spans(&[512])),
            Err(BlockError::OutOfRange {
                sector: u64::MAX,
                len: 512
            })
        );
        assert_eq!(
            check_transfer(8, false, false, 0, &spans(&[u64::MAX, 1])),
            Err(BlockError::OutOfRange {
                sector: 0,
                len: u64::MAX
            })
        );
    }

    #[test]
    fn a_read_only_disk_refuses_writes_after_the_range_checks() {
        assert_eq!(
            check_transfer(8, true, true, 0, &spans(&[512])),
            Err(BlockError::ReadOnly)
        );
        assert_eq!(
            check_transfer(8, true, true, 8, &spans(&[512])),
            Err(BlockError::OutOfRange {
                sector: 8,
                len: 512
            })
        );
        assert_eq!(
            check_transfer(8, true, true, 0, &spans(&[511])),
            Err(BlockError::Unaligned { len: 511 })
        );
    }

    proptest! {
        /// A transfer passes exactly when it is whole sectors that end at
        /// or before the disk's last sector, and a write on a writable
        /// disk; then its length is the spans' total.
        #[test]
        fn a_transfer_passes_exactly_when_it_fits(
            capacity in 0u64..64,
            sector in 0u64..70,
            whole in 0u64..40,
            ragged in prop_oneof![Just(0u64), 1u64..512],
            read_only in any::<bool>(),
            write in any::<bool>(),
        ) {
            let len = whole * SECTOR_SIZE + ragged;
            let result = check_transfer(capacity, read_only, write, sector, &spans(&[len]));
            let expected = if ragged != 0 {
                Err(BlockError::Unaligned { len })
            } else if sector + whole > capacity {
                Err(BlockError::OutOfRange { sector, len })
            } else if write && read_only {
                Err(BlockError::ReadOnly)
            } else {
                Ok(len)
            };
            prop_assert_eq!(result, expected);
        }
    }
}
