//! How a block transfer over host spans becomes requests to a host disk:
//! the pure part of the host-disk driver (`arch::host_disk` issues the
//! requests to the virtio-mmio disk).
//!
//! # The algorithm
//!
//! A transfer starts at a sector and moves the bytes of its spans in order
//! (the spans are a guest buffer translated through the memslots; only
//! their total is a whole number of sectors, a single span need not be).
//! [`check`] refuses, before any request, a total that is not a whole
//! number of sectors, a transfer past the disk's end and a write to a
//! read-only disk. Then the spans are walked with the position in the
//! transfer:
//!
//! - **Zero copy.** Where the position is on a sector boundary, the whole
//!   sectors the current span still holds go to the disk straight from (or
//!   into) the span's own memory, in requests of at most
//!   [`MAX_REQUEST_BYTES`].
//! - **Bounce.** A sector that straddles spans (a span ending inside a
//!   sector, the next one carrying on) goes through one 512-byte bounce
//!   buffer: for a read, the sector is read into it and its bytes are
//!   copied out to the spans that share it; for a write, the spans' bytes
//!   are gathered into it and it is written once full. Since a straddling
//!   piece is always shorter than a sector, one sector of bounce buffer
//!   is all a transfer ever needs, and every whole sector after it goes
//!   back to zero copy.
//!
//! Spans that follow each other in host memory are joined first
//! ([`coalesced`]), so a guest request whose buffers are host-contiguous
//! is one device request. A transfer whose spans are each a multiple of 512
//! bytes (what Linux gives: pages and sector-sized pieces) never bounces.

use crate::devices::virtio::block_backend::{BlockError, SECTOR_SIZE};
use crate::devices::virtio::guest_memory::HostSpan;

/// The largest single request: a longer run of whole sectors is split.
/// It bounds how long one request holds its disk (so that requests from
/// other CPUs interleave) and keeps every descriptor length far below the
/// 32 bits virtio gives it; QEMU's virtio-blk accepts any size without
/// `VIRTIO_BLK_F_SIZE_MAX`, which the driver does not negotiate.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

const SECTOR: usize = SECTOR_SIZE as usize;

/// `spans` with each run of host-contiguous spans (one ending where the
/// next begins) joined into one, so that a guest request whose buffers
/// follow each other in host memory becomes one device request.
pub fn coalesced(spans: &[HostSpan]) -> impl Iterator<Item = HostSpan> + '_ {
    let mut rest = spans.iter().copied().filter(|s| s.len > 0).peekable();
    core::iter::from_fn(move || {
        let mut run = rest.next()?;
        while let Some(next) = rest.next_if(|n| run.addr.checked_add(run.len) == Some(n.addr)) {
            run.len += next.len;
        }
        Some(run)
    })
}

/// A disk that reads and writes whole sectors from and to memory.
pub trait SectorIo {
    /// Reads `buf.len() / 512` sectors from `sector` on into `buf` (a
    /// non-empty whole number of sectors).
    fn read_sectors(&mut self, sector: u64, buf: &mut [u8]) -> Result<(), BlockError>;

    /// Writes `buf` (a non-empty whole number of sectors) to `sector` on.
    fn write_sectors(&mut self, sector: u64, buf: &[u8]) -> Result<(), BlockError>;
}

/// The transfer's length in bytes, once it is known to be a whole number
/// of sectors inside a disk of `capacity` sectors (and, for a write, that
/// the disk takes writes).
pub fn check(
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

/// Reads from `sector` on into `spans` (already [`check`]ed), zero copy
/// where the spans allow and through `bounce` where a sector straddles
/// spans (see the module documentation).
///
/// # Safety
///
/// Each span must be memory the caller may write for the whole call and
/// that nothing else in the hypervisor reads or writes meanwhile (a guest
/// buffer lent to the device; the guest touching it meanwhile gets
/// unspecified bytes, as with real hardware).
pub unsafe fn read_spans(
    disk: &mut impl SectorIo,
    bounce: &mut [u8; SECTOR],
    sector: u64,
    spans: &[HostSpan],
) -> Result<(), BlockError> {
    let mut next = sector;
    // Bytes of `bounce` already handed out (0: no straddling sector open).
    let mut used = 0;
    for span in coalesced(spans) {
        let len = span.len as usize;
        let mut at = 0;
        while at < len {
            let left = len - at;
            let here = span.addr as usize + at;
            if used == 0 && left >= SECTOR {
                let chunk = (left / SECTOR * SECTOR).min(MAX_REQUEST_BYTES);
                // SAFETY: `here..here + chunk` lies in the span, which the
                // caller lends for writing, exclusively, for the call.
                let buf = unsafe { core::slice::from_raw_parts_mut(here as *mut u8, chunk) };
                disk.read_sectors(next, buf)?;
                next += (chunk / SECTOR) as u64;
                at += chunk;
                continue;
            }
            if used == 0 {
                disk.read_sectors(next, bounce)?;
                next += 1;
            }
            let n = left.min(SECTOR - used);
            // SAFETY: as above, `here..here + n` lies in the span; the
            // bounce buffer is a distinct allocation.
            let dst = unsafe { core::slice::from_raw_parts_mut(here as *mut u8, n) };
            dst.copy_from_slice(&bounce[used..used + n]);
            used = (used + n) % SECTOR;
            at += n;
        }
    }
    Ok(())
}

/// Writes `spans` (already [`check`]ed) to `sector` on, zero copy where
/// the spans allow and through `bounce` where a sector straddles spans.
///
/// # Safety
///
/// Each span must be memory the caller may read for the whole call and
/// that nothing else in the hypervisor writes meanwhile.
pub unsafe fn write_spans(
    disk: &mut impl SectorIo,
    bounce: &mut [u8; SECTOR],
    sector: u64,
    spans: &[HostSpan],
) -> Result<(), BlockError> {
    let mut next = sector;
    // Bytes of `bounce` already gathered (0: no straddling sector open).
    let mut used = 0;
    for span in coalesced(spans) {
        let len = span.len as usize;
        let mut at = 0;
        while at < len {
            let left = len - at;
            let here = span.addr as usize + at;
            if used == 0 && left >= SECTOR {
                let chunk = (left / SECTOR * SECTOR).min(MAX_REQUEST_BYTES);
                // SAFETY: `here..here + chunk` lies in the span, which the
                // caller lends for reading for the call.
                let buf = unsafe { core::slice::from_raw_parts(here as *const u8, chunk) };
                disk.write_sectors(next, buf)?;
                next += (chunk / SECTOR) as u64;
                at += chunk;
                continue;
            }
            let n = left.min(SECTOR - used);
            // SAFETY: as above, `here..here + n` lies in the span.
            let src = unsafe { core::slice::from_raw_parts(here as *const u8, n) };
            bounce[used..used + n].copy_from_slice(src);
            used += n;
            at += n;
            if used == SECTOR {
                disk.write_sectors(next, bounce)?;
                next += 1;
                used = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A disk in a vector that records each request's sector and length.
    struct VecDisk {
        bytes: Vec<u8>,
        requests: Vec<(u64, usize)>,
    }

    impl VecDisk {
        fn new(sectors: usize) -> Self {
            Self {
                bytes: (0..sectors * SECTOR)
                    .map(|i| (i * 7 + i / 511) as u8)
                    .collect(),
                requests: Vec::new(),
            }
        }
    }

    impl SectorIo for VecDisk {
        fn read_sectors(&mut self, sector: u64, buf: &mut [u8]) -> Result<(), BlockError> {
            assert!(
                !buf.is_empty()
                    && buf.len().is_multiple_of(SECTOR)
                    && buf.len() <= MAX_REQUEST_BYTES
            );
            self.requests.push((sector, buf.len()));
            let at = sector as usize * SECTOR;
            buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
            Ok(())
        }

        fn write_sectors(&mut self, sector: u64, buf: &[u8]) -> Result<(), BlockError> {
            assert!(
                !buf.is_empty()
                    && buf.len().is_multiple_of(SECTOR)
                    && buf.len() <= MAX_REQUEST_BYTES
            );
            self.requests.push((sector, buf.len()));
            let at = sector as usize * SECTOR;
            self.bytes[at..at + buf.len()].copy_from_slice(buf);
            Ok(())
        }
    }

    /// Cuts `buf` into spans of `lens`, `gap` bytes apart (so that `gap`
    /// 0 makes host-contiguous spans and 1 spans that cannot be joined).
    fn spans_of(buf: &mut [u8], lens: &[usize], gap: usize) -> Vec<HostSpan> {
        let mut at = 0;
        lens.iter()
            .map(|&len| {
                let span = HostSpan {
                    addr: buf[at..].as_mut_ptr() as u64,
                    len: len as u64,
                };
                at += len + gap;
                span
            })
            .collect()
    }

    /// The bytes of `spans` in order.
    fn gathered(spans: &[HostSpan]) -> Vec<u8> {
        spans
            .iter()
            // SAFETY: the tests' spans lie in their own live buffers.
            .flat_map(|s| unsafe {
                core::slice::from_raw_parts(s.addr as *const u8, s.len as usize).to_vec()
            })
            .collect()
    }

    #[test]
    fn check_refuses_ragged_long_and_read_only() {
        let span = |len| [HostSpan { addr: 0, len }];
        assert_eq!(check(8, false, false, 0, &span(4096)), Ok(4096));
        assert_eq!(
            check(8, false, false, 0, &span(100)),
            Err(BlockError::Unaligned { len: 100 })
        );
        assert_eq!(
            check(8, false, false, 1, &span(4096)),
            Err(BlockError::OutOfRange {
                sector: 1,
                len: 4096
            })
        );
        assert!(check(8, false, false, u64::MAX, &span(512)).is_err());
        assert_eq!(
            check(8, true, true, 0, &span(512)),
            Err(BlockError::ReadOnly)
        );
        assert_eq!(check(8, true, false, 0, &span(512)), Ok(512));
    }

    #[test]
    fn whole_sector_spans_never_bounce_and_long_ones_split() {
        let mut disk = VecDisk::new(4096);
        let mut bounce = [0; SECTOR];
        let len = MAX_REQUEST_BYTES + 4096;
        let mut buf = vec![0; len + 512 + 1];
        let spans = spans_of(&mut buf, &[len, 512], 1);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { read_spans(&mut disk, &mut bounce, 3, &spans) }.unwrap();
        assert_eq!(
            disk.requests,
            [
                (3, MAX_REQUEST_BYTES),
                (3 + 2048, 4096),
                (3 + 2048 + 8, 512)
            ]
        );
        assert_eq!(
            gathered(&spans)[..],
            disk.bytes[3 * SECTOR..3 * SECTOR + len + 512]
        );
    }

    #[test]
    fn host_contiguous_spans_become_one_request() {
        let mut disk = VecDisk::new(64);
        let mut bounce = [0; SECTOR];
        let mut buf = vec![0; 8192];
        let mut spans = spans_of(&mut buf, &[4096, 0, 4096], 0);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { read_spans(&mut disk, &mut bounce, 0, &spans) }.unwrap();
        assert_eq!(disk.requests, [(0, 8192)]);
        // Out of order in memory: two requests, second half first.
        spans.swap(0, 2);
        disk.requests.clear();
        // SAFETY: as above.
        unsafe { read_spans(&mut disk, &mut bounce, 0, &spans) }.unwrap();
        assert_eq!(disk.requests, [(0, 4096), (8, 4096)]);
        assert_eq!(buf[4096..], disk.bytes[..4096]);
    }

    #[test]
    fn a_straddling_sector_goes_through_the_bounce_buffer_once() {
        let mut disk = VecDisk::new(16);
        let mut bounce = [0; SECTOR];
        let mut buf = vec![0xaa; 2048 + 4];
        // 700 = 1 sector + 188; 188 + 324 close the second sector; 836 =
        // 1 sector + 324, closed by the last 188.
        let spans = spans_of(&mut buf, &[700, 324, 836, 188], 1);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { write_spans(&mut disk, &mut bounce, 2, &spans) }.unwrap();
        assert_eq!(disk.requests, [(2, 512), (3, 512), (4, 512), (5, 512)]);
        assert!(
            disk.bytes[2 * SECTOR..6 * SECTOR]
                .iter()
                .all(|&b| b == 0xaa)
        );
    }

    proptest! {
        /// Any cut of a transfer into spans, host-contiguous or not, reads
        /// and writes the same bytes as one contiguous buffer would, each
        /// byte once.
        #[test]
        fn any_cut_moves_the_same_bytes(
            sectors in 1usize..12,
            start in 0u64..4,
            cuts in proptest::collection::vec(0usize..6144, 0..8),
            fill in any::<u8>(),
            gap in 0usize..2,
        ) {
            let len = sectors * SECTOR;
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % len).collect();
            cuts.push(0);
            cuts.push(len);
            cuts.sort_unstable();
            cuts.dedup();
            let lens: Vec<usize> = cuts.windows(2).map(|w| w[1] - w[0]).collect();
            let mut disk = VecDisk::new(16);
            let mut bounce = [0; SECTOR];
            let mut buf = vec![0; len + gap * lens.len()];
            let spans = spans_of(&mut buf, &lens, gap);
            prop_assert_eq!(check(16, false, false, start, &spans), Ok(len as u64));
            // SAFETY: the spans cover `buf`, owned here for the call.
            unsafe { read_spans(&mut disk, &mut bounce, start, &spans) }.unwrap();
            let at = start as usize * SECTOR;
            prop_assert_eq!(&gathered(&spans)[..], &disk.bytes[at..at + len]);
            let moved: usize = disk.requests.iter().map(|r| r.1).sum();
            prop_assert_eq!(moved, len);

            buf.fill(fill);
            disk.requests.clear();
            // SAFETY: as above.
            unsafe { write_spans(&mut disk, &mut bounce, start, &spans) }.unwrap();
            prop_assert!(disk.bytes[at..at + len].iter().all(|&b| b == fill));
            let moved: usize = disk.requests.iter().map(|r| r.1).sum();
            prop_assert_eq!(moved, len);
        }
    }
}
