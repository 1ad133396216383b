//! virtio-net (device id 1): one receive and one transmit queue, a MAC and
//! a link that is always up, no offloads; its frames go to and come from
//! the in-hypervisor switch ([`super::net_switch`]).
//!
//! # Features
//!
//! `MAC` (configuration `mac[6]`), `STATUS` (configuration `status` =
//! `LINK_UP`), `MTU` (configuration `mtu`, default [`DEFAULT_MTU`]: it bounds
//! the frames either side sends). No checksum or segmentation offloads, so
//! every frame is a plain Ethernet frame and the 12-byte `virtio_net_hdr`
//! (with `VERSION_1`: `flags`, `gso_type`, `hdr_len`, `gso_size`,
//! `csum_start`, `csum_offset`, `num_buffers`) is all zeros but
//! `num_buffers` = 1 on receive.
//!
//! No `MRG_RXBUF`: a received frame goes into one receive chain, never
//! spread over several. That keeps delivery one pop, one copy, one used
//! element; Linux, seeing neither `MRG_RXBUF` nor offloads, posts receive
//! chains that hold a whole frame of the MTU (and with a bigger MTU
//! switches to big multi-page buffers), so nothing is lost by it.
//!
//! # Transmit
//!
//! On a notify of queue 1 the device pops transmit chains, skips the
//! header and copies each frame into its transmit batch ([`FrameBatch`],
//! at most [`TX_BATCH_FRAMES`] frames or [`TX_BATCH_BYTES`] bytes), and
//! returns the chain (used length 0). Frames shorter than an Ethernet
//! header or longer than the MTU allows are dropped and counted. The
//! runtime swaps the batch out ([`MmioTransport::net_take_tx`], which also
//! resumes a queue the full batch stopped), drops the device's lock and
//! hands each frame to the switch. The batch is the one intermediate
//! buffer of a frame's trip: sender guest memory → batch → receiver guest
//! memory. Swapping two batches keeps their allocations, so a running
//! network allocates nothing per frame. Forwarding outside the sender's
//! lock is what lets two VMs send to each other at once without a lock
//! cycle.
//!
//! # Receive
//!
//! [`MmioTransport::net_deliver`] pops the next receive chain and writes the
//! header and the frame into its writable part (one copy from the batch
//! into the receiver's RAM, pages marked dirty by [`GuestMemory`]). No
//! posted chain: [`DeliverOutcome::NoBuffer`] (the chain is not consumed).
//! A chain too small for header and frame is returned empty (used length
//! 0, which Linux counts as a length error and reposts) and the frame
//! dropped: [`DeliverOutcome::TooBig`]. A device the driver has not started
//! drops: [`DeliverOutcome::NotReady`]. All are counted.

use super::mmio_transport::{
    Effects, MmioTransport, QueueContext, SnapshotError, VirtioDevice, read_config_bytes,
};
use super::virtqueue::{DescriptorChain, RingError};
use crate::devices::guest_memory::GuestMemory;
use alloc::vec::Vec;
use virtio_spec::net::F as NetF;

/// Queue 0: frames to the guest.
pub const RECEIVE_QUEUE: u16 = 0;
/// Queue 1: frames from the guest.
pub const TRANSMIT_QUEUE: u16 = 1;
/// Entries per queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of `virtio_net_hdr` with `VERSION_1`.
pub const NET_HDR_LEN: usize = 12;
/// Bytes of an Ethernet header (destination, source, type).
pub const ETH_HDR_LEN: usize = 14;
/// The MTU offered unless the configuration says otherwise.
pub const DEFAULT_MTU: u16 = 1500;
/// Frames held in the transmit batch before the queue waits.
pub const TX_BATCH_FRAMES: usize = 64;
/// Bytes held in the transmit batch before the queue waits.
pub const TX_BATCH_BYTES: usize = 256 * 1024;

/// `VIRTIO_NET_F_MTU`.
pub const F_MTU: u64 = NetF::MTU.bits().to_ne() as u64;
/// `VIRTIO_NET_F_MAC`.
pub const F_MAC: u64 = NetF::MAC.bits().to_ne() as u64;
/// `VIRTIO_NET_F_STATUS`.
pub const F_STATUS: u64 = NetF::STATUS.bits().to_ne() as u64;
/// `VIRTIO_NET_S_LINK_UP`.
pub const S_LINK_UP: u16 = virtio_spec::net::S::LINK_UP.bits().to_ne();

const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];

/// Frames one after another in one buffer, reused between batches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameBatch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl FrameBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties it, keeping its allocation.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Frames in it.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds no frame.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of all its frames.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Appends a frame.
    pub fn push(&mut self, frame: &[u8]) {
        self.bytes.extend_from_slice(frame);
        self.ends.push(self.bytes.len());
    }

    /// Its frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let frame = self.bytes.get(start..end).unwrap_or_default();
            start = end;
            frame
        })
    }

    /// Appends a frame of `len` bytes filled by `fill`; it is removed
    /// again when `fill` fails.
    fn push_with<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), E> {
        let start = self.bytes.len();
        self.bytes.resize(start + len, 0);
        match fill(self.bytes.get_mut(start..).unwrap_or_default()) {
            Ok(got) => {
                self.bytes.truncate(start + got);
                self.ends.push(self.bytes.len());
                Ok(())
            }
            Err(e) => {
                self.bytes.truncate(start);
                Err(e)
            }
        }
    }
}

/// What became of a frame handed to [`MmioTransport::net_deliver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliverOutcome {
    /// Written into a receive chain.
    Delivered,
    /// No receive chain posted: dropped.
    NoBuffer,
    /// The receive chain was too small: dropped.
    TooBig,
    /// The driver has not started the device (or it needs a reset):
    /// dropped.
    NotReady,
}

/// What the device counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// Frames taken from the guest.
    pub tx_frames: u64,
    /// Their bytes (without the header).
    pub tx_bytes: u64,
    /// Transmit chains dropped (too short, above the MTU).
    pub tx_dropped: u64,
    /// Frames written into the guest.
    pub rx_frames: u64,
    /// Their bytes (without the header).
    pub rx_bytes: u64,
    /// Frames dropped for want of a receive chain.
    pub rx_no_buffer: u64,
    /// Frames dropped because the receive chain was too small.
    pub rx_too_big: u64,
    /// Frames dropped because the device was not running.
    pub rx_not_ready: u64,
}

/// The device's migrated state (the transmit batch is drained before a
/// snapshot; what is left in it is carried too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetState {
    /// The MAC.
    pub mac: [u8; 6],
    /// The MTU.
    pub mtu: u16,
    /// Frames taken from the guest but not yet forwarded.
    pub tx_batch: FrameBatch,
    /// The counters.
    pub counters: NetCounters,
}

/// A virtio-net device.
#[derive(Debug)]
pub struct Net {
    mac: [u8; 6],
    mtu: u16,
    tx_batch: FrameBatch,
    counters: NetCounters,
    chain: DescriptorChain,
}

impl Net {
    /// A device with `mac` and the default MTU.
    pub fn new(mac: [u8; 6]) -> Self {
        Self::with_mtu(mac, DEFAULT_MTU)
    }

    /// A device with `mac` and `mtu` (at least 68, the IPv4 minimum).
    pub fn with_mtu(mac: [u8; 6], mtu: u16) -> Self {
        Self {
            mac,
            mtu: mtu.max(68),
            tx_batch: FrameBatch::new(),
            counters: NetCounters::default(),
            chain: DescriptorChain::default(),
        }
    }

    /// Its MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// What it counted.
    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// The largest frame either side may send: the MTU, the Ethernet
    /// header and a VLAN tag.
    pub fn max_frame_len(&self) -> usize {
        usize::from(self.mtu) + ETH_HDR_LEN + 4
    }

    /// Moves transmit chains into the batch (see the module doc).
    fn transmit(&mut self, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        let max_frame = self.max_frame_len();
        let Some(queue) = ctx.queues.get_mut(usize::from(TRANSMIT_QUEUE)) else {
            return Ok(());
        };
        while self.tx_batch.len() < TX_BATCH_FRAMES && self.tx_batch.bytes() < TX_BATCH_BYTES {
            if !queue.pop_into(ctx.mem, &mut self.chain)? {
                break;
            }
            let frame_len = (self.chain.readable_len() as usize).saturating_sub(NET_HDR_LEN);
            if (ETH_HDR_LEN..=max_frame).contains(&frame_len) {
                let chain = &self.chain;
                let mem = ctx.mem;
                self.tx_batch.push_with(frame_len, |buf| {
                    chain.read_readable(mem, NET_HDR_LEN as u64, buf)
                })?;
                self.counters.tx_frames += 1;
                self.counters.tx_bytes += frame_len as u64;
            } else {
                self.counters.tx_dropped += 1;
            }
            queue.push_used(ctx.mem, self.chain.head(), 0)?;
        }
        ctx.output_ready |= !self.tx_batch.is_empty();
        Ok(())
    }

    /// Writes `frame` into the next receive chain.
    fn receive(
        &mut self,
        frame: &[u8],
        ctx: &mut QueueContext<'_>,
    ) -> Result<DeliverOutcome, RingError> {
        let Some(queue) = ctx.queues.get_mut(usize::from(RECEIVE_QUEUE)) else {
            return Ok(DeliverOutcome::NotReady);
        };
        if !queue.pop_into(ctx.mem, &mut self.chain)? {
            self.counters.rx_no_buffer += 1;
            return Ok(DeliverOutcome::NoBuffer);
        }
        let needed = NET_HDR_LEN + frame.len();
        if (self.chain.writable_len() as usize) < needed {
            queue.push_used(ctx.mem, self.chain.head(), 0)?;
            self.counters.rx_too_big += 1;
            return Ok(DeliverOutcome::TooBig);
        }
        let mut header = [0u8; NET_HDR_LEN];
        if let Some(num_buffers) = header.get_mut(10..12) {
            num_buffers.copy_from_slice(&1u16.to_le_bytes());
        }
        self.chain.write_writable(ctx.mem, 0, &header)?;
        self.chain
            .write_writable(ctx.mem, NET_HDR_LEN as u64, frame)?;
        // `needed` fits: it is at most the chain's writable length.
        queue.push_used(ctx.mem, self.chain.head(), needed as u32)?;
        self.counters.rx_frames += 1;
        self.counters.rx_bytes += frame.len() as u64;
        Ok(DeliverOutcome::Delivered)
    }
}

impl VirtioDevice for Net {
    type State = NetState;

    fn device_id(&self) -> u32 {
        u32::from(u8::from(virtio_spec::Id::Net))
    }

    fn features(&self) -> u64 {
        F_MAC | F_STATUS | F_MTU
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // mac[6] at 0, status le16 at 6, max_virtqueue_pairs le16 at 8
        // (only with MQ: 0), mtu le16 at 10.
        let [m0, m1, m2, m3, m4, m5] = self.mac;
        let [s0, s1] = S_LINK_UP.to_le_bytes();
        let [t0, t1] = self.mtu.to_le_bytes();
        let config = [m0, m1, m2, m3, m4, m5, s0, s1, 0, 0, t0, t1];
        read_config_bytes(&config, offset, data);
    }

    fn activate(&mut self, _features: u64, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        self.transmit(ctx)
    }

    fn queue_notify(&mut self, queue: u16, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        match queue {
            TRANSMIT_QUEUE => self.transmit(ctx),
            _ => Ok(()),
        }
    }

    fn reset(&mut self) {
        self.tx_batch.clear();
    }

    fn snapshot(&self) -> NetState {
        NetState {
            mac: self.mac,
            mtu: self.mtu,
            tx_batch: self.tx_batch.clone(),
            counters: self.counters,
        }
    }

    fn restore(&mut self, state: &NetState) -> Result<(), SnapshotError> {
        if state.mtu < 68 {
            return Err(SnapshotError::BadField("net mtu"));
        }
        self.mac = state.mac;
        self.mtu = state.mtu;
        self.tx_batch = state.tx_batch.clone();
        self.counters = state.counters;
        Ok(())
    }
}

impl MmioTransport<Net> {
    /// Writes `frame` (an Ethernet frame, without `virtio_net_hdr`) into the
    /// guest's next receive chain.
    pub fn net_deliver(
        &mut self,
        frame: &[u8],
        mem: &dyn GuestMemory,
    ) -> (DeliverOutcome, Effects) {
        if !self.is_live() {
            self.device_mut().counters.rx_not_ready += 1;
            return (DeliverOutcome::NotReady, Effects::default());
        }
        let (outcome, effects) = self.run_for(mem, |net, ctx| net.receive(frame, ctx));
        (outcome.unwrap_or(DeliverOutcome::NotReady), effects)
    }

    /// Swaps the transmit batch with `batch` (emptied first) and resumes
    /// the transmit queue; forward `batch`'s frames after dropping the
    /// device's lock, and take again while [`Effects::output_ready`].
    pub fn net_take_tx(&mut self, batch: &mut FrameBatch, mem: &dyn GuestMemory) -> Effects {
        batch.clear();
        core::mem::swap(batch, &mut self.device_mut().tx_batch);
        self.run(mem, |net, ctx| net.transmit(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_guest::{DriverQueue, FakeMemory, SLOT_A, SLOT_B, bring_up};
    use super::super::mmio_transport::{REG_CONFIG, REG_QUEUE_NOTIFY};
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0x00, 1, 2, 3];
    const BUF: u64 = SLOT_A.0 + 0x4_0000;

    fn setup(mem: &FakeMemory) -> (MmioTransport<Net>, [DriverQueue; 2]) {
        let mut t = MmioTransport::new(Net::new(MAC));
        let qs = [
            DriverQueue::new(256, SLOT_A.0),
            DriverQueue::new(256, SLOT_A.0 + 0x1_0000),
        ];
        let _ = bring_up(&mut t, mem, None, &qs);
        (t, qs)
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Posts a transmit chain: the header alone, then the frame split in
    /// two buffers (as Linux may).
    fn post_tx(mem: &FakeMemory, q: &mut DriverQueue, at: u64, frame: &[u8]) -> u16 {
        mem.poke(at, &[0u8; NET_HDR_LEN]);
        mem.poke(at + 0x100, frame);
        let half = frame.len() as u32 / 2;
        let head = q.add_chain(
            mem,
            &[
                (at, NET_HDR_LEN as u32, false),
                (at + 0x100, half, false),
                (
                    at + 0x100 + u64::from(half),
                    frame.len() as u32 - half,
                    false,
                ),
            ],
        );
        q.publish(mem, head);
        head
    }

    #[test]
    fn transmitted_frames_come_out_without_their_header() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        let (f1, f2) = (frame(60, 1), frame(1514, 2));
        post_tx(&mem, &mut qs[1], BUF, &f1);
        post_tx(&mem, &mut qs[1], BUF + 0x1000, &f2);
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert!(e.output_ready && e.interrupt);
        let mut batch = FrameBatch::new();
        let e = t.net_take_tx(&mut batch, &mem);
        assert!(!e.output_ready);
        assert_eq!(batch.iter().collect::<Vec<_>>(), vec![&f1[..], &f2[..]]);
        assert_eq!(qs[1].take_used(&mem).len(), 2);
        // Runts and frames above the MTU are dropped, their chains returned.
        post_tx(&mem, &mut qs[1], BUF, &frame(10, 3));
        post_tx(&mem, &mut qs[1], BUF + 0x1000, &frame(1519, 4));
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert!(!e.output_ready);
        assert_eq!(qs[1].take_used(&mem).len(), 2);
        let c = t.device().counters();
        assert_eq!((c.tx_frames, c.tx_bytes, c.tx_dropped), (2, 1574, 2));
    }

    #[test]
    fn a_full_batch_waits_for_the_runtime_then_resumes() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        for i in 0..TX_BATCH_FRAMES + 5 {
            post_tx(
                &mem,
                &mut qs[1],
                BUF + 0x1000 * (i as u64 % 8),
                &frame(64, i as u8),
            );
        }
        let _ = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        let mut batch = FrameBatch::new();
        let e = t.net_take_tx(&mut batch, &mem);
        assert_eq!(batch.len(), TX_BATCH_FRAMES);
        assert!(e.output_ready);
        let e = t.net_take_tx(&mut batch, &mem);
        assert_eq!(batch.len(), 5);
        assert!(!e.output_ready);
    }

    #[test]
    fn a_delivered_frame_lands_after_a_zero_header_with_one_buffer() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        let head = qs[0].add_chain(&mem, &[(SLOT_B.0 - 700, 1526, true)]);
        qs[0].publish(&mem, head);
        mem.poke(SLOT_B.0 - 700, &[0xee; 1526]);
        let f = frame(1000, 9);
        let (outcome, e) = t.net_deliver(&f, &mem);
        assert_eq!(outcome, DeliverOutcome::Delivered);
        assert!(e.interrupt);
        let mut hdr = [0u8; NET_HDR_LEN];
        hdr[10] = 1;
        assert_eq!(mem.peek(SLOT_B.0 - 700, NET_HDR_LEN), hdr);
        assert_eq!(mem.peek(SLOT_B.0 - 700 + NET_HDR_LEN as u64, 1000), f);
        assert_eq!(qs[0].take_used(&mem), vec![(u32::from(head), 1012)]);
        assert!(mem.dirty_pages().contains(&(SLOT_B.0 / 4096)));
    }

    #[test]
    fn frames_without_room_are_dropped_and_counted() {
        let mem = FakeMemory::new();
        let mut idle = MmioTransport::new(Net::new(MAC));
        assert_eq!(
            idle.net_deliver(&frame(60, 0), &mem).0,
            DeliverOutcome::NotReady
        );
        assert_eq!(idle.device().counters().rx_not_ready, 1);
        let (mut t, mut qs) = setup(&mem);
        assert_eq!(
            t.net_deliver(&frame(60, 0), &mem).0,
            DeliverOutcome::NoBuffer
        );
        let head = qs[0].add_chain(&mem, &[(BUF, 100, true)]);
        qs[0].publish(&mem, head);
        assert_eq!(
            t.net_deliver(&frame(200, 0), &mem).0,
            DeliverOutcome::TooBig
        );
        assert_eq!(qs[0].take_used(&mem), vec![(u32::from(head), 0)]);
        let c = t.device().counters();
        assert_eq!((c.rx_no_buffer, c.rx_too_big, c.rx_frames), (1, 1, 0));
    }

    #[test]
    fn a_migrated_device_carries_on_with_the_same_rings_and_mac() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        for i in 0..3 {
            let h = qs[0].add_chain(&mem, &[(BUF + 0x1000 * i, 1526, true)]);
            qs[0].publish(&mem, h);
        }
        assert_eq!(
            t.net_deliver(&frame(100, 1), &mem).0,
            DeliverOutcome::Delivered
        );
        let state = t.snapshot();
        let mut moved = MmioTransport::new(Net::new([0; 6]));
        moved.restore(&state).unwrap();
        assert_eq!(moved.device().mac(), MAC);
        assert_eq!(moved.read(REG_CONFIG + 5, 1), Ok(3));
        assert_eq!(
            moved.net_deliver(&frame(200, 2), &mem).0,
            DeliverOutcome::Delivered
        );
        assert_eq!(qs[0].take_used(&mem), vec![(0, 112), (1, 212)]);
        assert_eq!(moved.device().counters().rx_frames, 2);
    }

    #[test]
    fn configuration_holds_mac_link_status_and_mtu() {
        let mem = FakeMemory::new();
        let (mut t, _) = setup(&mem);
        let mac: Vec<u8> = (0..6)
            .map(|i| t.read(REG_CONFIG + i, 1).unwrap() as u8)
            .collect();
        assert_eq!(mac, MAC);
        assert_eq!(t.read(REG_CONFIG + 6, 2), Ok(u64::from(S_LINK_UP)));
        assert_eq!(t.read(REG_CONFIG + 10, 2), Ok(1500));
        assert_eq!(t.read(REG_CONFIG + 12, 4), Ok(0));
        let offer = t.offered_features();
        assert_eq!(offer & (F_MAC | F_STATUS | F_MTU), F_MAC | F_STATUS | F_MTU);
        // No offloads, no MRG_RXBUF (bit 15).
        assert_eq!(
            offer & 0xffff_ffff & !(F_MAC | F_STATUS | F_MTU) & !(3 << 28),
            0
        );
    }
}
