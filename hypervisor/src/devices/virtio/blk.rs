//! virtio-blk (device id 2) over a [`BlockBackend`]: one request queue,
//! requests served synchronously on the notify, data moved between the
//! disk and the guest's own pages (no bounce buffer).
//!
//! # Configuration and features
//!
//! `capacity` (le64 at 0, in 512-byte sectors) is the backend's size.
//! Features: `BLK_SIZE` (`blk_size` le32 at 20 = 512), `FLUSH`, `SEG_MAX`
//! (`seg_max` le32 at 12 = queue size - 2, so a request with its header and
//! status fits the chain bound; without it Linux sends one data segment per
//! request), and `RO` when the backend is read-only. No `SIZE_MAX`: a
//! segment may be any length (the backend takes spans of any length).
//!
//! # Requests
//!
//! A chain is: a device-readable header of 16 bytes (`type` le32,
//! `reserved` le32, `sector` le64), the data, and one device-writable
//! status byte, the last byte of the chain. Anything shorter (no header,
//! no writable byte for the status) is a malformed chain: a
//! [`RingError::BadRequest`], and the device needs a reset.
//!
//! - `IN`: the writable bytes before the status are the data. Their host
//!   spans are looked up with `device_writes` (the pages get marked dirty),
//!   the backend reads into them, and [`GuestMemory::device_wrote`] makes
//!   the device's writes visible.
//! - `OUT`: the readable bytes after the header are the data, written from
//!   their host spans; a read-only backend answers `IOERR`.
//! - `FLUSH`: the backend flushes.
//! - `GET_ID`: the backend's 20-byte id, as much as the data part holds.
//! - Anything else: `UNSUPP`.
//!
//! Data not a whole number of sectors, or reaching past the end of the
//! disk, is `IOERR` before the backend sees it; a backend error is `IOERR`.
//! A data buffer outside RAM is a ring error (as any guest address that is
//! not RAM). The used length is what the device wrote into the chain: the
//! data of a successful `IN` or `GET_ID`, plus the status byte.

use super::block_backend::{BlockBackend, SECTOR_SIZE};
use super::mmio_transport::{QueueContext, SnapshotError, VirtioDevice, read_config_bytes};
use super::virtqueue::{ChainReader, DescriptorChain, RingError};
use crate::devices::guest_memory::{GuestMemory, HostSpan};
use alloc::sync::Arc;
use alloc::vec::Vec;
use virtio_spec::blk::{F as BlkF, S as BlkS, T as BlkT};

/// The request queue.
pub const REQUEST_QUEUE: u16 = 0;
/// Entries in the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of a request header.
pub const REQUEST_HEADER_LEN: u32 = 16;
/// Bytes of a `GET_ID` answer.
pub const ID_LEN: usize = 20;

/// `VIRTIO_BLK_F_SEG_MAX`.
pub const F_SEG_MAX: u64 = BlkF::SEG_MAX.bits().to_ne() as u64;
/// `VIRTIO_BLK_F_RO`.
pub const F_RO: u64 = BlkF::RO.bits().to_ne() as u64;
/// `VIRTIO_BLK_F_BLK_SIZE`.
pub const F_BLK_SIZE: u64 = BlkF::BLK_SIZE.bits().to_ne() as u64;
/// `VIRTIO_BLK_F_FLUSH`.
pub const F_FLUSH: u64 = BlkF::FLUSH.bits().to_ne() as u64;

/// `VIRTIO_BLK_T_IN`.
pub const T_IN: u32 = BlkT::In as u32;
/// `VIRTIO_BLK_T_OUT`.
pub const T_OUT: u32 = BlkT::Out as u32;
/// `VIRTIO_BLK_T_FLUSH`.
pub const T_FLUSH: u32 = BlkT::Flush as u32;
/// `VIRTIO_BLK_T_GET_ID`.
pub const T_GET_ID: u32 = BlkT::GetId as u32;
/// `VIRTIO_BLK_S_OK`.
pub const S_OK: u8 = BlkS::Ok as u8;
/// `VIRTIO_BLK_S_IOERR`.
pub const S_IOERR: u8 = BlkS::Ioerr as u8;
/// `VIRTIO_BLK_S_UNSUPP`.
pub const S_UNSUPP: u8 = BlkS::Unsupp as u8;

const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// What the device counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkCounters {
    /// `IN` requests served.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// `OUT` requests served.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// `FLUSH` requests served.
    pub flushes: u64,
    /// Requests answered `IOERR`.
    pub errors: u64,
    /// Requests answered `UNSUPP`.
    pub unsupported: u64,
}

/// The device's migrated state: what it checks the destination's backend
/// against, and its counters (requests complete within a notify, so none is
/// in flight between accesses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkState {
    /// The disk's size in sectors.
    pub capacity: u64,
    /// Whether it is read-only.
    pub read_only: bool,
    /// The counters.
    pub counters: BlkCounters,
}

/// A virtio-blk device.
pub struct Blk {
    backend: Arc<dyn BlockBackend>,
    counters: BlkCounters,
    chain: DescriptorChain,
    spans: Vec<HostSpan>,
}

impl Blk {
    /// A device serving `backend`.
    pub fn new(backend: Arc<dyn BlockBackend>) -> Self {
        Self {
            backend,
            counters: BlkCounters::default(),
            chain: DescriptorChain::default(),
            spans: Vec::new(),
        }
    }

    /// What it counted.
    pub fn counters(&self) -> BlkCounters {
        self.counters
    }

    /// Serves every available request.
    fn serve(&mut self, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        let Some(queue) = ctx.queues.get_mut(usize::from(REQUEST_QUEUE)) else {
            return Ok(());
        };
        while queue.pop_into(ctx.mem, &mut self.chain)? {
            let written = self.serve_one(ctx.mem)?;
            queue.push_used(ctx.mem, self.chain.head(), written)?;
        }
        Ok(())
    }

    /// Serves the request in `self.chain`; returns the used length.
    fn serve_one(&mut self, mem: &dyn GuestMemory) -> Result<u32, RingError> {
        let head = self.chain.head();
        if self.chain.readable_len() < REQUEST_HEADER_LEN {
            return Err(RingError::BadRequest {
                head,
                why: "request header shorter than 16 bytes",
            });
        }
        let Some(status_at) = self.chain.writable_len().checked_sub(1) else {
            return Err(RingError::BadRequest {
                head,
                why: "no device-writable status byte",
            });
        };
        let mut header = [0u8; REQUEST_HEADER_LEN as usize];
        ChainReader::new(&self.chain).read(mem, &mut header)?;
        let [t0, t1, t2, t3, _, _, _, _, s0, s1, s2, s3, s4, s5, s6, s7] = header;
        let request = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
        let (status, data_written) = match request {
            T_IN => self.transfer(mem, sector, true, status_at)?,
            T_OUT => {
                let len = self.chain.readable_len() - REQUEST_HEADER_LEN;
                self.transfer(mem, sector, false, len)?
            }
            T_FLUSH => {
                self.counters.flushes += 1;
                match self.backend.flush() {
                    Ok(()) => (S_OK, 0),
                    Err(_) => (S_IOERR, 0),
                }
            }
            T_GET_ID => {
                let id = self.backend.id();
                let n = ID_LEN.min(status_at as usize);
                let part = id.get(..n).unwrap_or_default();
                let n = self.chain.write_writable(mem, 0, part)?;
                (S_OK, n as u32)
            }
            _ => (S_UNSUPP, 0),
        };
        match status {
            S_IOERR => self.counters.errors += 1,
            S_UNSUPP => self.counters.unsupported += 1,
            _ => {}
        }
        self.chain
            .write_writable(mem, u64::from(status_at), &[status])?;
        Ok(data_written + 1)
    }

    /// An `IN` (`to_guest`) or `OUT` of `len` bytes at `sector`: the status
    /// and the bytes written into the chain.
    fn transfer(
        &mut self,
        mem: &dyn GuestMemory,
        sector: u64,
        to_guest: bool,
        len: u32,
    ) -> Result<(u8, u32), RingError> {
        let len64 = u64::from(len);
        let sectors = len64 / SECTOR_SIZE;
        let in_range = sector
            .checked_add(sectors)
            .is_some_and(|end| end <= self.backend.capacity_sectors());
        if len64 % SECTOR_SIZE != 0 || !in_range || (!to_guest && self.backend.read_only()) {
            return Ok((S_IOERR, 0));
        }
        self.spans.clear();
        // IN: the writable part from its start; OUT: the readable part
        // after the header.
        let offset = if to_guest {
            0
        } else {
            u64::from(REQUEST_HEADER_LEN)
        };
        self.chain
            .host_spans(mem, to_guest, offset, len64, &mut self.spans)?;
        let result = if to_guest {
            let r = self.backend.read(sector, &self.spans);
            mem.device_wrote(&self.spans);
            r
        } else {
            self.backend.write(sector, &self.spans)
        };
        match (result, to_guest) {
            (Ok(()), true) => {
                self.counters.reads += 1;
                self.counters.read_bytes += len64;
                Ok((S_OK, len))
            }
            (Ok(()), false) => {
                self.counters.writes += 1;
                self.counters.write_bytes += len64;
                Ok((S_OK, 0))
            }
            (Err(_), _) => Ok((S_IOERR, 0)),
        }
    }
}

impl VirtioDevice for Blk {
    type State = BlkState;

    fn device_id(&self) -> u32 {
        u32::from(u8::from(virtio_spec::Id::Block))
    }

    fn features(&self) -> u64 {
        let ro = if self.backend.read_only() { F_RO } else { 0 };
        F_SEG_MAX | F_BLK_SIZE | F_FLUSH | ro
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // capacity le64 at 0, size_max le32 at 8 (not offered: 0), seg_max
        // le32 at 12, geometry at 16 (not offered: 0), blk_size le32 at 20.
        let mut config = [0u8; 24];
        let fields: [(usize, &[u8]); 3] = [
            (0, &self.backend.capacity_sectors().to_le_bytes()),
            (12, &u32::from(QUEUE_SIZE - 2).to_le_bytes()),
            (20, &(SECTOR_SIZE as u32).to_le_bytes()),
        ];
        for (at, bytes) in fields {
            if let Some(dst) = config.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
        read_config_bytes(&config, offset, data);
    }

    fn activate(&mut self, _features: u64, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        self.serve(ctx)
    }

    fn queue_notify(&mut self, queue: u16, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        match queue {
            REQUEST_QUEUE => self.serve(ctx),
            _ => Ok(()),
        }
    }

    fn reset(&mut self) {}

    fn snapshot(&self) -> BlkState {
        BlkState {
            capacity: self.backend.capacity_sectors(),
            read_only: self.backend.read_only(),
            counters: self.counters,
        }
    }

    fn restore(&mut self, state: &BlkState) -> Result<(), SnapshotError> {
        if state.capacity != self.backend.capacity_sectors() {
            return Err(SnapshotError::BadField("blk capacity"));
        }
        if state.read_only != self.backend.read_only() {
            return Err(SnapshotError::BadField("blk read_only"));
        }
        self.counters = state.counters;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_guest::{
        DriverQueue, FakeMemory, PAGE, SLOT_A, SLOT_B, VecDisk, bring_up,
    };
    use super::super::mmio_transport::{Effects, MmioTransport, REG_CONFIG, REG_QUEUE_NOTIFY};
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const SECTORS: u64 = 64;
    const HDR: u64 = SLOT_A.0 + 0x4_0000;
    const STATUS: u64 = SLOT_A.0 + 0x4_1000;
    const DATA: u64 = SLOT_A.0 + 0x5_0000;

    struct Rig {
        mem: Arc<FakeMemory>,
        disk: Arc<VecDisk>,
        t: MmioTransport<Blk>,
        q: DriverQueue,
    }

    fn rig(read_only: bool) -> Rig {
        let mem = Arc::new(FakeMemory::new());
        let disk = Arc::new(VecDisk::new(SECTORS, read_only, mem.clone()));
        let mut t = MmioTransport::new(Blk::new(disk.clone()));
        let q = DriverQueue::new(256, SLOT_A.0);
        let _ = bring_up(&mut t, &mem, None, core::slice::from_ref(&q));
        Rig { mem, disk, t, q }
    }

    impl Rig {
        /// Submits a request with `data` buffers; returns the status byte,
        /// the used length and the effects.
        fn request(
            &mut self,
            kind: u32,
            sector: u64,
            data: &[(u64, u32, bool)],
        ) -> (u8, u32, Effects) {
            let mut hdr = Vec::new();
            hdr.extend_from_slice(&kind.to_le_bytes());
            hdr.extend_from_slice(&0u32.to_le_bytes());
            hdr.extend_from_slice(&sector.to_le_bytes());
            self.mem.poke(HDR, &hdr);
            self.mem.poke(STATUS, &[0xff]);
            let mut bufs = vec![(HDR, 16, false)];
            bufs.extend_from_slice(data);
            bufs.push((STATUS, 1, true));
            let head = self.q.add_chain(&self.mem, &bufs);
            self.q.publish(&self.mem, head);
            // The driver wants an interrupt for this request (EVENT_IDX).
            self.q.set_used_event(&self.mem, self.q.used_seen);
            let e = self.t.write(REG_QUEUE_NOTIFY, 4, 0, &*self.mem);
            let used = self.q.take_used(&self.mem);
            let len = used.first().map_or(u32::MAX, |&(id, len)| {
                assert_eq!(id, u32::from(head));
                len
            });
            (self.mem.peek(STATUS, 1)[0], len, e)
        }
    }

    #[test]
    fn what_is_written_reads_back_through_buffers_across_the_slot_boundary() {
        let mut r = rig(false);
        let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        r.mem.poke(SLOT_B.0 - 300, &pattern[..600]);
        r.mem.poke(DATA, &pattern[600..]);
        let (status, len, _) = r.request(
            T_OUT,
            3,
            &[(SLOT_B.0 - 300, 600, false), (DATA, 424, false)],
        );
        assert_eq!((status, len), (S_OK, 1));
        assert_eq!(&r.disk.data.lock().unwrap()[3 * 512..5 * 512], &pattern[..]);
        r.mem.clear_logs();
        let (status, len, e) = r.request(
            T_IN,
            3,
            &[(DATA + 0x1000, 100, true), (SLOT_B.0 - 4, 924, true)],
        );
        assert_eq!((status, len), (S_OK, 1025));
        assert!(e.interrupt);
        let mut back = r.mem.peek(DATA + 0x1000, 100);
        back.extend(r.mem.peek(SLOT_B.0 - 4, 924));
        assert_eq!(back, pattern);
        // The pages the disk wrote are dirty and were reported written.
        let dirty = r.mem.dirty_pages();
        for page in [
            (DATA + 0x1000) / PAGE,
            (SLOT_B.0 - 4) / PAGE,
            SLOT_B.0 / PAGE,
        ] {
            assert!(dirty.contains(&page), "page {page:#x} not dirty");
        }
        assert_eq!(
            r.mem
                .device_wrote_spans()
                .iter()
                .map(|s| s.len)
                .sum::<u64>(),
            1024
        );
        let c = r.t.device().counters();
        assert_eq!(
            (c.reads, c.read_bytes, c.writes, c.write_bytes),
            (1, 1024, 1, 1024)
        );
    }

    #[test]
    fn a_read_only_disk_refuses_writes_and_says_so_in_its_features() {
        let mut r = rig(true);
        assert_ne!(r.t.offered_features() & F_RO, 0);
        r.mem.poke(DATA, &[0xaa; 512]);
        let (status, len, _) = r.request(T_OUT, 0, &[(DATA, 512, false)]);
        assert_eq!((status, len), (S_IOERR, 1));
        assert!(r.disk.data.lock().unwrap().iter().all(|&b| b == 0));
        let (status, _, _) = r.request(T_IN, 0, &[(DATA, 512, true)]);
        assert_eq!(status, S_OK);
        assert_eq!(rig(false).t.offered_features() & F_RO, 0);
    }

    #[test]
    fn out_of_range_and_unaligned_requests_are_io_errors() {
        let mut r = rig(false);
        for (sector, len) in [
            (SECTORS - 1, 1024),
            (SECTORS, 512),
            (u64::MAX, 512),
            (0, 100),
        ] {
            let (status, used, _) = r.request(T_IN, sector, &[(DATA, len, true)]);
            assert_eq!((status, used), (S_IOERR, 1), "sector {sector} len {len}");
        }
        let (status, _, _) = r.request(T_IN, SECTORS - 1, &[(DATA, 512, true)]);
        assert_eq!(status, S_OK);
        assert_eq!(r.t.device().counters().errors, 4);
    }

    #[test]
    fn flush_get_id_and_unknown_requests() {
        let mut r = rig(false);
        assert_eq!(r.request(T_FLUSH, 0, &[]).0, S_OK);
        assert_eq!(*r.disk.flushes.lock().unwrap(), 1);
        let (status, len, _) = r.request(T_GET_ID, 0, &[(DATA, 20, true)]);
        assert_eq!((status, len), (S_OK, 21));
        assert_eq!(r.mem.peek(DATA, 20), b"vecdisk-0123456789ab");
        let (status, len, _) = r.request(T_GET_ID, 0, &[(DATA + 0x100, 8, true)]);
        assert_eq!((status, len), (S_OK, 9));
        assert_eq!(r.mem.peek(DATA + 0x100, 8), b"vecdisk-");
        assert_eq!(r.request(99, 0, &[]).0, S_UNSUPP);
        assert_eq!(r.t.device().counters().unsupported, 1);
    }

    #[test]
    fn malformed_requests_are_ring_errors() {
        let mut r = rig(false);
        // A header of 8 bytes.
        let head = r.q.add_chain(&r.mem, &[(HDR, 8, false), (STATUS, 1, true)]);
        r.q.publish(&r.mem, head);
        let e = r.t.write(REG_QUEUE_NOTIFY, 4, 0, &*r.mem);
        assert!(matches!(e.needs_reset, Some(RingError::BadRequest { .. })));
        // No status byte.
        let mut r = rig(false);
        let head = r.q.add_chain(&r.mem, &[(HDR, 16, false)]);
        r.q.publish(&r.mem, head);
        let e = r.t.write(REG_QUEUE_NOTIFY, 4, 0, &*r.mem);
        assert!(matches!(e.needs_reset, Some(RingError::BadRequest { .. })));
        // A data buffer in no RAM.
        let mut r = rig(false);
        let (_, _, e) = r.request(T_IN, 0, &[(0x0a00_0000, 512, true)]);
        assert!(matches!(e.needs_reset, Some(RingError::Memory(_))));
    }

    #[test]
    fn configuration_holds_capacity_seg_max_and_block_size() {
        let mut r = rig(false);
        assert_eq!(r.t.read(REG_CONFIG, 4), Ok(SECTORS));
        assert_eq!(r.t.read(REG_CONFIG + 4, 4), Ok(0));
        assert_eq!(r.t.read(REG_CONFIG + 12, 4), Ok(254));
        assert_eq!(r.t.read(REG_CONFIG + 20, 4), Ok(512));
        assert_eq!(r.t.read(REG_CONFIG + 21, 1), Ok(2));
        assert_eq!(r.t.read(REG_CONFIG + 0x80, 4), Ok(0));
        let s = r.t.device().snapshot();
        let other = Arc::new(VecDisk::new(SECTORS + 1, false, r.mem.clone()));
        assert!(Blk::new(other).restore(&s).is_err());
    }

    proptest! {
        /// Random reads and writes against a vector model: statuses agree
        /// (in range and whole sectors: OK), reads return what was written.
        #[test]
        fn reads_return_what_was_written(
            ops in proptest::collection::vec((any::<bool>(), 0u64..SECTORS + 4, 0u32..5, any::<u8>(), 0u32..3), 1..24),
        ) {
            let mut r = rig(false);
            let mut model = vec![0u8; (SECTORS * 512) as usize];
            for (write, sector, sectors, fill, split) in ops {
                let len = sectors * 512;
                // Split the data in two buffers, the first `split * 100` long.
                let first = (split * 100).min(len);
                let bufs: Vec<(u64, u32, bool)> = [(DATA, first), (DATA + 0x2_0000, len - first)]
                    .into_iter()
                    .filter(|&(_, l)| l > 0)
                    .map(|(a, l)| (a, l, !write))
                    .collect();
                let ok = sector + u64::from(sectors) <= SECTORS;
                if write {
                    r.mem.poke(DATA, &vec![fill; first as usize]);
                    r.mem.poke(DATA + 0x2_0000, &vec![fill.wrapping_add(1); (len - first) as usize]);
                    let (status, used, _) = r.request(T_OUT, sector, &bufs);
                    prop_assert_eq!((status, used), (if ok { S_OK } else { S_IOERR }, 1));
                    if ok {
                        let at = (sector * 512) as usize;
                        model[at..at + first as usize].fill(fill);
                        model[at + first as usize..at + len as usize].fill(fill.wrapping_add(1));
                    }
                } else {
                    let (status, used, _) = r.request(T_IN, sector, &bufs);
                    prop_assert_eq!((status, used), if ok { (S_OK, len + 1) } else { (S_IOERR, 1) });
                    if ok {
                        let mut got = r.mem.peek(DATA, first as usize);
                        got.extend(r.mem.peek(DATA + 0x2_0000, (len - first) as usize));
                        let at = (sector * 512) as usize;
                        prop_assert_eq!(&got[..], &model[at..at + len as usize]);
                    }
                }
            }
            prop_assert_eq!(&*r.disk.data.lock().unwrap(), &model);
        }
    }
}
