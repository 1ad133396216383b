//! How a block transfer over host spans becomes requests to a host disk
//! (`blk_io` sends the requests to the virtio-mmio disk).
//!
//! # The algorithm
//!
//! A transfer starts at a sector and moves the bytes of its spans in order
//! (the spans are a guest buffer translated through the memslots; only
//! their total is a whole number of sectors, a single span need not be).
//! [`check_transfer`] (the check every block backend makes) refuses,
//! before any request, a total
//! that is not a whole number of sectors, a transfer past the disk's end
//! and a write to a read-only disk.
//!
//! A virtio-blk request carries its data in any number of buffers (header,
//! data buffers, status byte), so [`plan`] turns the transfer into as few
//! requests as the disk's [`Limits`] allow, each a list of [`Segment`]s,
//! one data descriptor each. The spans are walked with the position in
//! the transfer:
//!
//! - **Zero copy.** Where the position is on a sector boundary, the whole
//!   sectors the current span still holds are one [`Segment::Direct`]
//!   straight from (or into) the span's own memory.
//! - **Bounce.** A sector that straddles spans (a span ending inside a
//!   sector, the next one carrying on) is a [`Segment::Bounce`]: one
//!   512-byte bounce buffer, with the [`BouncePiece`]s saying which bytes
//!   of which spans share it. For a write the pieces are gathered into it
//!   before the request is sent; for a read they are copied out of it
//!   after it completed. A straddling piece is always shorter than a
//!   sector, so every whole sector after it goes back to zero copy. A
//!   request holds at most one bounce sector, so one bounce buffer serves
//!   every request (requests go one at a time).
//! - **Limits.** A request ends where adding the next segment would pass
//!   [`Limits::max_segments`] (the device's `seg_max` and its queue's free
//!   descriptors) or [`Limits::max_bytes`] ([`MAX_REQUEST_BYTES`]), or
//!   before a second bounce sector; only then does a transfer become
//!   several requests, and always on a sector boundary.
//!
//! Spans that follow each other in host memory are joined first
//! ([`coalesced`]), so that they are one segment. A transfer whose spans
//! are each a multiple of 512 bytes (what Linux gives: pages and
//! sector-sized pieces) never bounces, and a Linux request of up to
//! `seg_max` pages is one host request.

use crate::devices::guest_memory::HostSpan;
#[cfg(doc)]
use crate::devices::virtio::block_backend::check_transfer;
use crate::devices::virtio::block_backend::{BlockError, SECTOR_SIZE};
use alloc::vec::Vec;

/// The most data bytes of one request: a longer transfer is split. It
/// bounds how long one request holds its disk (so that requests from other
/// CPUs interleave) and keeps every descriptor length far below the 32 bits
/// virtio gives it; QEMU's virtio-blk accepts any size without
/// `VIRTIO_BLK_F_SIZE_MAX`, which the driver does not negotiate.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

const SECTOR: usize = SECTOR_SIZE as usize;

/// `spans` with each run of host-contiguous spans (one ending where the
/// next begins) joined into one, so that a guest request whose buffers
/// follow each other in host memory becomes one data buffer.
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

/// What one request to a disk may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Data buffers (descriptors between the header and the status byte).
    pub max_segments: usize,
    /// Data bytes, a whole number of sectors.
    pub max_bytes: usize,
}

impl Limits {
    /// At most `max_segments` data buffers and `max_bytes` bytes (rounded
    /// down to whole sectors) per request; at least one buffer and one
    /// sector, the least a request can move.
    pub fn new(max_segments: usize, max_bytes: usize) -> Self {
        Self {
            max_segments: max_segments.max(1),
            max_bytes: (max_bytes / SECTOR * SECTOR).max(SECTOR),
        }
    }
}

/// One data buffer of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Whole sectors straight from or into a span's memory.
    Direct(HostSpan),
    /// The one sector of the bounce buffer (see [`Request::bounce_pieces`]).
    Bounce,
}

/// Bytes of a span that share the bounce sector with other spans' bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BouncePiece {
    /// The bytes in host memory.
    pub span: HostSpan,
    /// Where they sit in the bounce sector.
    pub offset: usize,
}

/// One planned request: its data buffers in order, from `sector` on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The first sector.
    pub sector: u64,
    /// The data buffers, at most [`Limits::max_segments`], at most one
    /// [`Segment::Bounce`].
    pub segments: Vec<Segment>,
    /// The pieces of the bounce sector in order, covering it exactly
    /// (empty without a bounce sector).
    pub bounce_pieces: Vec<BouncePiece>,
}

impl Request {
    /// Its data bytes.
    pub fn len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Direct(span) => span.len as usize,
                Segment::Bounce => SECTOR,
            })
            .sum()
    }

    /// Whether it moves no data (never, for a planned request).
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

/// The requests of one transfer, made one at a time by [`Plan::next_into`].
pub struct Plan<I> {
    /// The coalesced spans not yet started.
    spans: I,
    /// What is left of the span being planned.
    current: HostSpan,
    /// The sector the next request starts at.
    next_sector: u64,
    /// Bytes of the open bounce sector already planned (0: none open).
    bounce_used: usize,
    limits: Limits,
}

/// Plans the transfer of `spans` (already checked by
/// [`check_transfer`]) from `sector` on in
/// requests within `limits` (see the module documentation).
pub fn plan(
    sector: u64,
    spans: &[HostSpan],
    limits: Limits,
) -> Plan<impl Iterator<Item = HostSpan> + '_> {
    Plan {
        spans: coalesced(spans),
        current: HostSpan { addr: 0, len: 0 },
        next_sector: sector,
        bounce_used: 0,
        limits,
    }
}

impl<I: Iterator<Item = HostSpan>> Plan<I> {
    /// Fills `request` (its vectors reused) with the next request; `false`
    /// once the transfer is planned.
    pub fn next_into(&mut self, request: &mut Request) -> bool {
        let Limits {
            max_segments,
            max_bytes,
        } = self.limits;
        request.sector = self.next_sector;
        request.segments.clear();
        request.bounce_pieces.clear();
        let mut bytes = 0;
        loop {
            if self.current.len == 0 {
                match self.spans.next() {
                    Some(span) => self.current = span,
                    None => break,
                }
            }
            let left = self.current.len as usize;
            let here = self.current.addr;
            if self.bounce_used == 0 {
                let full = request.segments.len() == max_segments || bytes + SECTOR > max_bytes;
                if left >= SECTOR {
                    if full {
                        break;
                    }
                    let chunk = (left / SECTOR * SECTOR).min(max_bytes - bytes);
                    request.segments.push(Segment::Direct(HostSpan {
                        addr: here,
                        len: chunk as u64,
                    }));
                    bytes += chunk;
                    self.next_sector += (chunk / SECTOR) as u64;
                    self.advance(chunk);
                    continue;
                }
                // A sector straddling spans begins: one bounce per request.
                if full || !request.bounce_pieces.is_empty() {
                    break;
                }
                request.segments.push(Segment::Bounce);
                bytes += SECTOR;
                self.next_sector += 1;
            }
            let n = left.min(SECTOR - self.bounce_used);
            request.bounce_pieces.push(BouncePiece {
                span: HostSpan {
                    addr: here,
                    len: n as u64,
                },
                offset: self.bounce_used,
            });
            self.bounce_used = (self.bounce_used + n) % SECTOR;
            self.advance(n);
        }
        !request.segments.is_empty()
    }

    /// Moves past `n` bytes of the current span.
    fn advance(&mut self, n: usize) {
        self.current.addr += n as u64;
        self.current.len -= n as u64;
    }
}

/// A disk that moves whole sectors between itself and several buffers in
/// one request.
pub trait SegmentIo {
    /// What one request may carry now.
    fn limits(&self) -> Limits;

    /// Reads `buffers` (each a non-empty whole number of sectors, within
    /// [`SegmentIo::limits`]) in order from `sector` on, in one request.
    fn read_segments(&mut self, sector: u64, buffers: &mut [&mut [u8]]) -> Result<(), BlockError>;

    /// Writes `buffers` (as for reads) in order to `sector` on, in one
    /// request.
    fn write_segments(&mut self, sector: u64, buffers: &[&[u8]]) -> Result<(), BlockError>;
}

/// Reads from `sector` on into `spans` (already checked by
/// [`check_transfer`]), in as few
/// requests as the disk's limits allow, zero copy where the spans allow
/// and through `bounce` where a sector straddles spans (see the module
/// documentation).
///
/// # Safety
///
/// Each span must be memory the caller may write for the whole call and
/// that nothing else in the hypervisor reads or writes meanwhile (a guest
/// buffer lent to the device; the guest touching it meanwhile, or giving
/// overlapping buffers, gets unspecified bytes, as with real hardware).
pub unsafe fn read_spans(
    disk: &mut impl SegmentIo,
    bounce: &mut [u8; SECTOR],
    sector: u64,
    spans: &[HostSpan],
) -> Result<(), BlockError> {
    let mut plan = plan(sector, spans, disk.limits());
    let mut request = Request::default();
    while plan.next_into(&mut request) {
        let mut buffers: Vec<&mut [u8]> = Vec::with_capacity(request.segments.len());
        let mut bounce_sector = Some(&mut bounce[..]);
        for segment in &request.segments {
            match segment {
                // SAFETY: a direct segment lies in a span, which the
                // caller lends for writing, exclusively, for the call; the
                // device writes it by DMA, the CPU does not touch it.
                Segment::Direct(span) => buffers.push(unsafe {
                    core::slice::from_raw_parts_mut(span.addr as *mut u8, span.len as usize)
                }),
                // A planned request holds at most one bounce sector.
                Segment::Bounce => match bounce_sector.take() {
                    Some(sector) => buffers.push(sector),
                    None => return Err(BlockError::Device),
                },
            }
        }
        disk.read_segments(request.sector, &mut buffers)?;
        drop(buffers);
        for piece in &request.bounce_pieces {
            let n = piece.span.len as usize;
            // SAFETY: the piece lies in a span, lent for writing; the
            // bounce buffer is a distinct allocation, and the request
            // that filled it has completed.
            let dst = unsafe { core::slice::from_raw_parts_mut(piece.span.addr as *mut u8, n) };
            dst.copy_from_slice(&bounce[piece.offset..piece.offset + n]);
        }
    }
    Ok(())
}

/// Writes `spans` (already checked by
/// [`check_transfer`]) to `sector` on, in as few requests
/// as the disk's limits allow, zero copy where the spans allow and through
/// `bounce` where a sector straddles spans.
///
/// # Safety
///
/// Each span must be memory the caller may read for the whole call and
/// that nothing else in the hypervisor writes meanwhile.
pub unsafe fn write_spans(
    disk: &mut impl SegmentIo,
    bounce: &mut [u8; SECTOR],
    sector: u64,
    spans: &[HostSpan],
) -> Result<(), BlockError> {
    let mut plan = plan(sector, spans, disk.limits());
    let mut request = Request::default();
    while plan.next_into(&mut request) {
        for piece in &request.bounce_pieces {
            let n = piece.span.len as usize;
            // SAFETY: the piece lies in a span, lent for reading.
            let src = unsafe { core::slice::from_raw_parts(piece.span.addr as *const u8, n) };
            bounce[piece.offset..piece.offset + n].copy_from_slice(src);
        }
        let buffers: Vec<&[u8]> = request
            .segments
            .iter()
            .map(|segment| match segment {
                // SAFETY: a direct segment lies in a span, lent for
                // reading for the call.
                Segment::Direct(span) => unsafe {
                    core::slice::from_raw_parts(span.addr as *const u8, span.len as usize)
                },
                Segment::Bounce => &bounce[..],
            })
            .collect();
        disk.write_segments(request.sector, &buffers)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block_backend::check_transfer;
    use proptest::prelude::*;

    /// A disk in a vector that records each request's sector and buffer
    /// lengths, and refuses requests its limits do not allow.
    struct VecDisk {
        bytes: Vec<u8>,
        limits: Limits,
        requests: Vec<(u64, Vec<usize>)>,
    }

    impl VecDisk {
        fn new(sectors: usize, limits: Limits) -> Self {
            Self {
                bytes: (0..sectors * SECTOR)
                    .map(|i| (i * 7 + i / 511) as u8)
                    .collect(),
                limits,
                requests: Vec::new(),
            }
        }

        /// Checks a request's buffers and records it; its byte offset.
        fn record(&mut self, sector: u64, lens: Vec<usize>) -> usize {
            assert!(!lens.is_empty() && lens.len() <= self.limits.max_segments);
            assert!(lens.iter().all(|&l| l > 0 && l.is_multiple_of(SECTOR)));
            assert!(lens.iter().sum::<usize>() <= self.limits.max_bytes);
            self.requests.push((sector, lens));
            sector as usize * SECTOR
        }
    }

    impl SegmentIo for VecDisk {
        fn limits(&self) -> Limits {
            self.limits
        }

        fn read_segments(
            &mut self,
            sector: u64,
            buffers: &mut [&mut [u8]],
        ) -> Result<(), BlockError> {
            let mut at = self.record(sector, buffers.iter().map(|b| b.len()).collect());
            for buf in buffers {
                buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
                at += buf.len();
            }
            Ok(())
        }

        fn write_segments(&mut self, sector: u64, buffers: &[&[u8]]) -> Result<(), BlockError> {
            let mut at = self.record(sector, buffers.iter().map(|b| b.len()).collect());
            for buf in buffers {
                self.bytes[at..at + buf.len()].copy_from_slice(buf);
                at += buf.len();
            }
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

    /// Every request `plan` makes.
    fn planned(sector: u64, spans: &[HostSpan], limits: Limits) -> Vec<Request> {
        let mut plan = plan(sector, spans, limits);
        let mut requests = Vec::new();
        let mut request = Request::default();
        while plan.next_into(&mut request) {
            requests.push(request.clone());
        }
        requests
    }

    /// `spans` as host byte ranges in order, adjacent ones joined.
    fn joined(spans: impl IntoIterator<Item = HostSpan>) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for s in spans.into_iter().filter(|s| s.len > 0) {
            match ranges.last_mut() {
                Some(last) if last.0 + last.1 == s.addr => last.1 += s.len,
                _ => ranges.push((s.addr, s.len)),
            }
        }
        ranges
    }

    const WIDE: Limits = Limits {
        max_segments: 254,
        max_bytes: MAX_REQUEST_BYTES,
    };

    #[test]
    fn limits_hold_at_least_one_sector_in_one_buffer() {
        assert_eq!(
            Limits::new(0, 100),
            Limits {
                max_segments: 1,
                max_bytes: 512
            }
        );
        assert_eq!(Limits::new(3, 1500).max_bytes, 1024);
    }

    #[test]
    fn scattered_pages_are_one_request_up_to_the_segment_limit() {
        // A Linux `dd bs=1M` request: 256 pages, none host-contiguous.
        let mut disk = VecDisk::new(4096, WIDE);
        let mut bounce = [0; SECTOR];
        let mut buf = vec![0; 256 * 4097];
        let spans = spans_of(&mut buf, &[4096; 256], 1);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { read_spans(&mut disk, &mut bounce, 5, &spans) }.unwrap();
        assert_eq!(
            disk.requests,
            [(5, vec![4096; 254]), (5 + 254 * 8, vec![4096; 2])]
        );
        assert_eq!(
            gathered(&spans)[..],
            disk.bytes[5 * SECTOR..5 * SECTOR + (1 << 20)]
        );
        disk.requests.clear();
        // SAFETY: as above.
        unsafe { read_spans(&mut disk, &mut bounce, 5, &spans[..254]) }.unwrap();
        assert_eq!(disk.requests, [(5, vec![4096; 254])]);
    }

    #[test]
    fn whole_sector_spans_never_bounce_and_long_ones_split() {
        let mut disk = VecDisk::new(4096, WIDE);
        let mut bounce = [0; SECTOR];
        let len = MAX_REQUEST_BYTES + 4096;
        let mut buf = vec![0; len + 512 + 1];
        let spans = spans_of(&mut buf, &[len, 512], 1);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { read_spans(&mut disk, &mut bounce, 3, &spans) }.unwrap();
        assert_eq!(
            disk.requests,
            [(3, vec![MAX_REQUEST_BYTES]), (3 + 2048, vec![4096, 512])]
        );
        assert_eq!(
            gathered(&spans)[..],
            disk.bytes[3 * SECTOR..3 * SECTOR + len + 512]
        );
    }

    #[test]
    fn host_contiguous_spans_become_one_buffer() {
        let mut disk = VecDisk::new(64, WIDE);
        let mut bounce = [0; SECTOR];
        let mut buf = vec![0; 8192];
        let mut spans = spans_of(&mut buf, &[4096, 0, 4096], 0);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { read_spans(&mut disk, &mut bounce, 0, &spans) }.unwrap();
        assert_eq!(disk.requests, [(0, vec![8192])]);
        // Out of order in memory: two buffers of one request, second half
        // first.
        spans.swap(0, 2);
        disk.requests.clear();
        // SAFETY: as above.
        unsafe { read_spans(&mut disk, &mut bounce, 0, &spans) }.unwrap();
        assert_eq!(disk.requests, [(0, vec![4096, 4096])]);
        assert_eq!(buf[4096..], disk.bytes[..4096]);
    }

    #[test]
    fn a_straddling_sector_is_one_bounce_buffer_and_a_second_one_a_second_request() {
        let mut disk = VecDisk::new(16, WIDE);
        let mut bounce = [0; SECTOR];
        let mut buf = vec![0xaa; 2048 + 4];
        // 700 = 1 sector + 188; 188 + 324 close the second sector; 836 =
        // 1 sector + 324, closed by the last 188.
        let spans = spans_of(&mut buf, &[700, 324, 836, 188], 1);
        let requests = planned(2, &spans, WIDE);
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].segments[1], Segment::Bounce);
        assert_eq!(
            requests[0].bounce_pieces,
            [
                BouncePiece {
                    span: HostSpan {
                        addr: spans[0].addr + 512,
                        len: 188
                    },
                    offset: 0
                },
                BouncePiece {
                    span: spans[1],
                    offset: 188
                }
            ]
        );
        assert_eq!(requests[1].segments, [Segment::Bounce]);
        // SAFETY: the spans cover `buf`, owned here for the call.
        unsafe { write_spans(&mut disk, &mut bounce, 2, &spans) }.unwrap();
        assert_eq!(disk.requests, [(2, vec![512, 512, 512]), (5, vec![512])]);
        assert!(
            disk.bytes[2 * SECTOR..6 * SECTOR]
                .iter()
                .all(|&b| b == 0xaa)
        );
    }

    /// A transfer of `sectors` cut at `cuts` into spans `gap` bytes apart.
    fn cut(sectors: usize, cuts: Vec<usize>) -> (usize, Vec<usize>) {
        let len = sectors * SECTOR;
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % len).collect();
        cuts.push(0);
        cuts.push(len);
        cuts.sort_unstable();
        cuts.dedup();
        (len, cuts.windows(2).map(|w| w[1] - w[0]).collect())
    }

    proptest! {
        /// The buffers of the planned requests cover exactly the
        /// transfer's bytes, in order, from consecutive sectors: whole
        /// sectors straight from the spans, except one bounce sector at
        /// most per request whose pieces fill it; no request passes the
        /// limits.
        #[test]
        fn planned_requests_cover_the_transfer_within_the_limits(
            sectors in 1usize..40,
            start in 0u64..4,
            cuts in proptest::collection::vec(0usize..20480, 0..24),
            max_segments in 1usize..6,
            max_sectors in 1usize..10,
            gap in 0usize..2,
        ) {
            let (len, lens) = cut(sectors, cuts);
            let mut buf = vec![0; len + gap * lens.len()];
            let spans = spans_of(&mut buf, &lens, gap);
            let limits = Limits::new(max_segments, max_sectors * SECTOR);
            let requests = planned(start, &spans, limits);
            let mut covered = Vec::new();
            let mut next = start;
            for request in &requests {
                prop_assert_eq!(request.sector, next);
                prop_assert!(!request.is_empty());
                prop_assert!(request.segments.len() <= limits.max_segments);
                prop_assert!(request.len() <= limits.max_bytes);
                let bounces = request.segments.iter().filter(|s| **s == Segment::Bounce).count();
                prop_assert!(bounces <= 1);
                prop_assert_eq!(request.bounce_pieces.is_empty(), bounces == 0);
                let mut offset = 0;
                for piece in &request.bounce_pieces {
                    prop_assert_eq!(piece.offset, offset);
                    prop_assert!(piece.span.len > 0);
                    offset += piece.span.len as usize;
                }
                prop_assert_eq!(offset, bounces * SECTOR);
                for segment in &request.segments {
                    match segment {
                        Segment::Direct(span) => {
                            prop_assert!(span.len > 0 && span.len % SECTOR_SIZE == 0);
                            covered.push(*span);
                        }
                        Segment::Bounce => {
                            covered.extend(request.bounce_pieces.iter().map(|p| p.span));
                        }
                    }
                }
                next += (request.len() / SECTOR) as u64;
            }
            prop_assert_eq!(next, start + sectors as u64);
            prop_assert_eq!(joined(covered), joined(spans.iter().copied()));
        }

        /// Any cut of a transfer into spans, host-contiguous or not, and
        /// any limits read and write the same bytes as one contiguous
        /// buffer would, each byte once.
        #[test]
        fn any_cut_moves_the_same_bytes(
            sectors in 1usize..12,
            start in 0u64..4,
            cuts in proptest::collection::vec(0usize..6144, 0..8),
            max_segments in 1usize..4,
            max_sectors in 1usize..6,
            fill in any::<u8>(),
            gap in 0usize..2,
        ) {
            let (len, lens) = cut(sectors, cuts);
            let mut disk = VecDisk::new(16, Limits::new(max_segments, max_sectors * SECTOR));
            let mut bounce = [0; SECTOR];
            let mut buf = vec![0; len + gap * lens.len()];
            let spans = spans_of(&mut buf, &lens, gap);
            prop_assert_eq!(check_transfer(16, false, false, start, &spans), Ok(len as u64));
            // SAFETY: the spans cover `buf`, owned here for the call.
            unsafe { read_spans(&mut disk, &mut bounce, start, &spans) }.unwrap();
            let at = start as usize * SECTOR;
            prop_assert_eq!(&gathered(&spans)[..], &disk.bytes[at..at + len]);
            let moved: usize = disk.requests.iter().flat_map(|r| &r.1).sum();
            prop_assert_eq!(moved, len);

            buf.fill(fill);
            disk.requests.clear();
            // SAFETY: as above.
            unsafe { write_spans(&mut disk, &mut bounce, start, &spans) }.unwrap();
            prop_assert!(disk.bytes[at..at + len].iter().all(|&b| b == fill));
            let moved: usize = disk.requests.iter().flat_map(|r| &r.1).sum();
            prop_assert_eq!(moved, len);
        }
    }
}
