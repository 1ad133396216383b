//! The split virtqueue, device side: taking the guest's descriptor chains
//! off the available ring, handing finished ones back on the used ring, and
//! deciding whether the guest wants an interrupt for them.
//!
//! # Layout (virtio 1.x, "Split Virtqueues")
//!
//! A queue of `N` entries (a power of two) lives in three guest areas:
//!
//! - the descriptor table, `N` descriptors of 16 bytes (`addr` le64, `len`
//!   le32, `flags` le16: `NEXT`, `WRITE`, `INDIRECT`; `next` le16), aligned
//!   to 16;
//! - the available ring (driver area), aligned to 2: `flags` le16, `idx`
//!   le16, `ring[N]` le16 heads, then `used_event` le16;
//! - the used ring (device area), aligned to 4: `flags` le16, `idx` le16,
//!   `ring[N]` of (`id` le32, `len` le32), then `avail_event` le16.
//!
//! Every access goes through [`GuestMemory`]: a ring or buffer outside RAM
//! (unbacked, in a device window) is a [`GuestMemoryError`], never an
//! access. Indices are free-running `u16`s that wrap at 2^16; a slot is the
//! index modulo `N`.
//!
//! # Taking a chain ([`Virtqueue::pop`])
//!
//! The device remembers `next_avail`, the next available index it has not
//! consumed. When the guest's `avail.idx` differs, the head at
//! `ring[next_avail % N]` starts a chain, which is walked:
//!
//! - each descriptor becomes a [`Segment`] (address, length, whether the
//!   device writes it); zero-length descriptors are skipped;
//! - `NEXT` follows `next`, which must be below the table's length;
//! - `INDIRECT` (only with `VIRTIO_F_RING_INDIRECT_DESC`) switches to a
//!   table of `len / 16` descriptors at `addr`: `len` must be a non-zero
//!   multiple of 16, the descriptor must not also carry `NEXT`, and a
//!   descriptor inside an indirect table must not be indirect again (one
//!   level, as the spec requires);
//! - the number of descriptors walked, direct and indirect together, is at
//!   most `N` (the spec's bound on a chain), which is also what stops a
//!   loop: a cycle runs into the bound after at most `N + 1` reads;
//! - device-readable segments come first: a readable one after a writable
//!   one is refused, and so is a total length above `u32::MAX` (the used
//!   ring's `len` could not report it).
//!
//! Anything else is a [`RingError`]; the transport then puts the device in
//! `DEVICE_NEEDS_RESET`. An `avail.idx` more than `N` ahead of
//! `next_avail` is a ring error too (the guest cannot have more than `N`
//! chains outstanding).
//!
//! # Returning a chain and interrupting ([`Virtqueue::push_used`],
//! [`Virtqueue::needs_interrupt`])
//!
//! `push_used` writes (`head`, bytes written) into the next used slot, then
//! (after a release fence, so the guest sees the element before the index)
//! the new `used.idx`. After a batch, `needs_interrupt` says whether to
//! interrupt the guest:
//!
//! - with `VIRTIO_F_RING_EVENT_IDX`, the guest's `used_event` names the used
//!   index it wants to hear about: interrupt when the batch moved `used.idx`
//!   from `old` past it, `vring_need_event(used_event, new, old)`:
//!   `(new - used_event - 1) mod 2^16 < (new - old) mod 2^16`;
//! - without it, interrupt unless the guest set `VIRTQ_AVAIL_F_NO_INTERRUPT`
//!   in `avail.flags`;
//! - never when nothing was used since the last decision.
//!
//! With EVENT_IDX the device also publishes `avail_event` = `next_avail`
//! after each pop and when it finds the ring empty (then re-reading
//! `avail.idx` after a full fence, so a chain the guest added meanwhile is
//! not missed): the guest notifies again only once it adds past what the
//! device has seen.
//!
//! # Migration
//!
//! [`QueueState`] is the queue's whole state as plain data (configuration
//! and the two device indices); the negotiated ring features come back from
//! the transport's own state on restore.

use crate::devices::guest_memory::{GuestMemory, GuestMemoryError, HostSpan};
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{Ordering, fence};
use virtio_spec::virtq::{AvailF, DescF};

/// `VIRTQ_DESC_F_NEXT`: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = DescF::NEXT.bits().to_ne();
/// `VIRTQ_DESC_F_WRITE`: the device writes this buffer.
pub const DESC_F_WRITE: u16 = DescF::WRITE.bits().to_ne();
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = DescF::INDIRECT.bits().to_ne();
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`: the guest asks not to be interrupted
/// (without EVENT_IDX).
pub const AVAIL_F_NO_INTERRUPT: u16 = AvailF::NO_INTERRUPT.bits().to_ne();

/// Bytes per descriptor.
pub const DESCRIPTOR_SIZE: u64 = 16;
/// Required alignment of the descriptor table.
pub const DESC_TABLE_ALIGN: u64 = 16;
/// Required alignment of the available ring.
pub const AVAIL_RING_ALIGN: u64 = 2;
/// Required alignment of the used ring.
pub const USED_RING_ALIGN: u64 = 4;

/// Why a queue's configuration or contents were refused. Any of these puts
/// the device in `DEVICE_NEEDS_RESET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// A ring or buffer access outside the VM's RAM.
    Memory(GuestMemoryError),
    /// `QueueReady` was written with a size that is zero, not a power of
    /// two or above the maximum.
    BadSize {
        /// The size the driver wrote.
        size: u16,
        /// The device's maximum.
        max: u16,
    },
    /// `QueueReady` was written with a ring address not aligned as the spec
    /// requires.
    Misaligned {
        /// Which area: "descriptor table", "available ring", "used ring".
        area: &'static str,
        /// Its address.
        ipa: u64,
    },
    /// `avail.idx` is more than the queue size ahead of the device.
    AvailIndexJump {
        /// The device's next available index.
        next_avail: u16,
        /// The index the guest published.
        avail_idx: u16,
    },
    /// A head index at or beyond the queue size.
    HeadOutOfRange {
        /// The head.
        head: u16,
    },
    /// A `next` at or beyond the length of its table.
    NextOutOfRange {
        /// The descriptor's `next`.
        next: u16,
        /// The table's length in descriptors.
        table_len: u32,
    },
    /// More descriptors than the queue size in one chain (a loop, or
    /// simply too long).
    ChainTooLong,
    /// An indirect descriptor without `VIRTIO_F_RING_INDIRECT_DESC`.
    IndirectNotNegotiated,
    /// An indirect descriptor inside an indirect table.
    NestedIndirect,
    /// An indirect descriptor that also has `NEXT`.
    IndirectWithNext,
    /// An indirect table whose length is zero, not a multiple of 16, or
    /// longer than the queue size allows.
    BadIndirectLength {
        /// The descriptor's `len`.
        len: u32,
    },
    /// A device-readable descriptor after a device-writable one.
    ReadableAfterWritable,
    /// The chain's total length exceeds `u32::MAX`.
    LengthOverflow,
    /// A chain the device cannot serve as a request (e.g. a virtio-blk
    /// request without its status byte).
    BadRequest {
        /// The chain's head.
        head: u16,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl From<GuestMemoryError> for RingError {
    fn from(e: GuestMemoryError) -> Self {
        Self::Memory(e)
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(e) => write!(f, "virtqueue access refused: {e}"),
            Self::BadSize { size, max } => {
                write!(f, "queue size {size} is not a power of two in 1..={max}")
            }
            Self::Misaligned { area, ipa } => write!(f, "{area} at IPA {ipa:#x} is misaligned"),
            Self::AvailIndexJump {
                next_avail,
                avail_idx,
            } => write!(
                f,
                "available index {avail_idx} is more than a queue ahead of {next_avail}"
            ),
            Self::HeadOutOfRange { head } => write!(f, "chain head {head} is out of range"),
            Self::NextOutOfRange { next, table_len } => {
                write!(
                    f,
                    "next {next} is outside a table of {table_len} descriptors"
                )
            }
            Self::ChainTooLong => f.write_str("descriptor chain longer than the queue (a loop?)"),
            Self::IndirectNotNegotiated => {
                f.write_str("indirect descriptor without RING_INDIRECT_DESC")
            }
            Self::NestedIndirect => f.write_str("indirect descriptor inside an indirect table"),
            Self::IndirectWithNext => f.write_str("indirect descriptor with NEXT set"),
            Self::BadIndirectLength { len } => write!(f, "indirect table of {len} bytes"),
            Self::ReadableAfterWritable => {
                f.write_str("device-readable descriptor after a device-writable one")
            }
            Self::LengthOverflow => f.write_str("chain length exceeds 4 GiB"),
            Self::BadRequest { head, why } => write!(f, "chain {head}: {why}"),
        }
    }
}

impl core::error::Error for RingError {}

/// One guest buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its guest-physical address (not yet checked against RAM: every
    /// access through [`GuestMemory`] checks).
    pub ipa: u64,
    /// Its length in bytes (never zero).
    pub len: u32,
    /// Whether the device writes it (else it reads it).
    pub device_writable: bool,
}

/// A descriptor chain taken off the available ring: its head (to return on
/// the used ring) and its buffers, device-readable ones first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescriptorChain {
    head: u16,
    segments: Vec<Segment>,
    readable_len: u32,
    writable_len: u32,
}

impl DescriptorChain {
    /// The head descriptor's index (the id for [`Virtqueue::push_used`]).
    pub fn head(&self) -> u16 {
        self.head
    }

    /// All buffers, device-readable ones first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Total bytes the device may read.
    pub fn readable_len(&self) -> u32 {
        self.readable_len
    }

    /// Total bytes the device may write.
    pub fn writable_len(&self) -> u32 {
        self.writable_len
    }

    fn part(&self, writable: bool) -> impl Iterator<Item = &Segment> {
        self.segments
            .iter()
            .filter(move |s| s.device_writable == writable)
    }

    /// Copies readable bytes from `offset` (within the readable part) into
    /// `buf`; returns how many (fewer than `buf.len()` at the part's end).
    pub fn read_readable(
        &self,
        mem: &dyn GuestMemory,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, GuestMemoryError> {
        let mut done = 0usize;
        self.for_each_piece(false, offset, buf.len() as u64, |ipa, at, len| {
            let dst = buf.get_mut(at..at + len).unwrap_or_default();
            mem.read(ipa, dst)?;
            done += len;
            Ok(())
        })?;
        Ok(done)
    }

    /// Copies `data` into the writable part from `offset` on; returns how
    /// many bytes fit.
    pub fn write_writable(
        &self,
        mem: &dyn GuestMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, GuestMemoryError> {
        let mut done = 0usize;
        self.for_each_piece(true, offset, data.len() as u64, |ipa, at, len| {
            let src = data.get(at..at + len).unwrap_or_default();
            mem.write(ipa, src)?;
            done += len;
            Ok(())
        })?;
        Ok(done)
    }

    /// Appends the host spans behind `len` bytes from `offset` of the
    /// writable (`writable`, looked up with `device_writes`, so the pages
    /// are marked dirty) or readable part; returns how many bytes the spans
    /// cover (less than `len` where the part ends first: callers size `len`
    /// from the part's length).
    pub fn host_spans(
        &self,
        mem: &dyn GuestMemory,
        writable: bool,
        offset: u64,
        len: u64,
        out: &mut Vec<HostSpan>,
    ) -> Result<u64, GuestMemoryError> {
        let mut done = 0u64;
        self.for_each_piece(writable, offset, len, |ipa, _, piece| {
            mem.host_spans(ipa, piece as u64, writable, out)?;
            done += piece as u64;
            Ok(())
        })?;
        Ok(done)
    }

    /// Calls `f(ipa, position in the caller's buffer, length)` for each
    /// piece of `len` bytes from `offset` of one part, in order.
    fn for_each_piece(
        &self,
        writable: bool,
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), GuestMemoryError>,
    ) -> Result<(), GuestMemoryError> {
        let mut skip = offset;
        let mut at = 0u64;
        for seg in self.part(writable) {
            if at >= len {
                break;
            }
            let seg_len = u64::from(seg.len);
            if skip >= seg_len {
                skip -= seg_len;
                continue;
            }
            let piece = (seg_len - skip).min(len - at);
            // `at + piece <= len`, which the caller sized from a buffer's
            // length, so both fit in usize.
            f(seg.ipa.wrapping_add(skip), at as usize, piece as usize)?;
            at += piece;
            skip = 0;
        }
        Ok(())
    }
}

/// Reads a chain's readable part front to back.
pub struct ChainReader<'c> {
    chain: &'c DescriptorChain,
    pos: u64,
}

impl<'c> ChainReader<'c> {
    /// A reader at the start of `chain`'s readable part.
    pub fn new(chain: &'c DescriptorChain) -> Self {
        Self { chain, pos: 0 }
    }

    /// Fills as much of `buf` as the part has left; returns how much.
    pub fn read(
        &mut self,
        mem: &dyn GuestMemory,
        buf: &mut [u8],
    ) -> Result<usize, GuestMemoryError> {
        let n = self.chain.read_readable(mem, self.pos, buf)?;
        self.pos += n as u64;
        Ok(n)
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> u64 {
        u64::from(self.chain.readable_len).saturating_sub(self.pos)
    }
}

/// Writes a chain's writable part front to back.
pub struct ChainWriter<'c> {
    chain: &'c DescriptorChain,
    pos: u64,
}

impl<'c> ChainWriter<'c> {
    /// A writer at the start of `chain`'s writable part.
    pub fn new(chain: &'c DescriptorChain) -> Self {
        Self { chain, pos: 0 }
    }

    /// Writes as much of `data` as the part has room for; returns how much.
    pub fn write(&mut self, mem: &dyn GuestMemory, data: &[u8]) -> Result<usize, GuestMemoryError> {
        let n = self.chain.write_writable(mem, self.pos, data)?;
        self.pos += n as u64;
        Ok(n)
    }

    /// Bytes written so far (the used length to report).
    pub fn written(&self) -> u64 {
        self.pos
    }

    /// Room left.
    pub fn remaining(&self) -> u64 {
        u64::from(self.chain.writable_len).saturating_sub(self.pos)
    }
}

/// A queue's state as plain data, for migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    /// The size the driver chose (`QueueNum`).
    pub size: u16,
    /// `QueueReady`.
    pub ready: bool,
    /// Descriptor table IPA.
    pub desc_table: u64,
    /// Available ring IPA.
    pub avail_ring: u64,
    /// Used ring IPA.
    pub used_ring: u64,
    /// The next available index the device will consume.
    pub next_avail: u16,
    /// The next used index the device will publish.
    pub next_used: u16,
    /// `used.idx` at the last interrupt decision.
    pub signalled_used: u16,
}

/// One split virtqueue, device side.
#[derive(Clone, Debug)]
pub struct Virtqueue {
    max_size: u16,
    state: QueueState,
    event_idx: bool,
    indirect: bool,
}

impl Virtqueue {
    /// A queue of at most `max_size` entries (a power of two), not ready,
    /// with the driver's size preset to the maximum.
    pub fn new(max_size: u16) -> Self {
        Self {
            max_size,
            state: QueueState {
                size: max_size,
                ..QueueState::default()
            },
            event_idx: false,
            indirect: false,
        }
    }

    /// The largest size the driver may choose (`QueueNumMax`).
    pub fn max_size(&self) -> u16 {
        self.max_size
    }

    /// Back to the state after [`Self::new`].
    pub fn reset(&mut self) {
        *self = Self::new(self.max_size);
    }

    /// The state for migration.
    pub fn state(&self) -> QueueState {
        self.state
    }

    /// Restores a migrated state, with the ring features the transport
    /// negotiated. A ready queue is checked as [`Self::enable`] checks it.
    pub fn restore(
        &mut self,
        state: QueueState,
        event_idx: bool,
        indirect: bool,
    ) -> Result<(), RingError> {
        self.state = state;
        self.event_idx = event_idx;
        self.indirect = indirect;
        if state.ready {
            self.check_config()?;
        }
        Ok(())
    }

    /// Whether the driver enabled the queue.
    pub fn ready(&self) -> bool {
        self.state.ready
    }

    /// The driver's size (`QueueNum`).
    pub fn size(&self) -> u16 {
        self.state.size
    }

    /// Sets the size (`QueueNum`); checked when the queue is enabled.
    pub fn set_size(&mut self, size: u16) {
        self.state.size = size;
    }

    /// Descriptor table address.
    pub fn desc_table(&self) -> u64 {
        self.state.desc_table
    }

    /// Available ring (driver area) address.
    pub fn avail_ring(&self) -> u64 {
        self.state.avail_ring
    }

    /// Used ring (device area) address.
    pub fn used_ring(&self) -> u64 {
        self.state.used_ring
    }

    /// Sets the descriptor table address.
    pub fn set_desc_table(&mut self, ipa: u64) {
        self.state.desc_table = ipa;
    }

    /// Sets the available ring address.
    pub fn set_avail_ring(&mut self, ipa: u64) {
        self.state.avail_ring = ipa;
    }

    /// Sets the used ring address.
    pub fn set_used_ring(&mut self, ipa: u64) {
        self.state.used_ring = ipa;
    }

    /// The next available index the device will consume.
    pub fn next_avail(&self) -> u16 {
        self.state.next_avail
    }

    /// The next used index the device will publish.
    pub fn next_used(&self) -> u16 {
        self.state.next_used
    }

    /// Enables the queue (`QueueReady` = 1) with the negotiated ring
    /// features, after checking its size, its areas' alignment and that all
    /// three areas are RAM now.
    pub fn enable(
        &mut self,
        mem: &dyn GuestMemory,
        event_idx: bool,
        indirect: bool,
    ) -> Result<(), RingError> {
        self.check_config()?;
        let n = u64::from(self.state.size);
        let areas = [
            (self.state.desc_table, DESCRIPTOR_SIZE * n),
            (self.state.avail_ring, 6 + 2 * n),
            (self.state.used_ring, 6 + 8 * n),
        ];
        let mut probe = [0u8; 64];
        for (ipa, len) in areas {
            let mut at = 0;
            while at < len {
                let chunk = (len - at).min(probe.len() as u64);
                let buf = probe.get_mut(..chunk as usize).unwrap_or_default();
                mem.read(
                    ipa.checked_add(at)
                        .ok_or(GuestMemoryError::Wraps { ipa, len })?,
                    buf,
                )?;
                at += chunk;
            }
        }
        self.event_idx = event_idx;
        self.indirect = indirect;
        self.state.ready = true;
        Ok(())
    }

    /// Disables the queue (`QueueReady` = 0); its configuration stays.
    pub fn disable(&mut self) {
        self.state.ready = false;
    }

    fn check_config(&self) -> Result<(), RingError> {
        let size = self.state.size;
        if size == 0 || !size.is_power_of_two() || size > self.max_size {
            return Err(RingError::BadSize {
                size,
                max: self.max_size,
            });
        }
        for (area, ipa, align) in [
            ("descriptor table", self.state.desc_table, DESC_TABLE_ALIGN),
            ("available ring", self.state.avail_ring, AVAIL_RING_ALIGN),
            ("used ring", self.state.used_ring, USED_RING_ALIGN),
        ] {
            if ipa % align != 0 {
                return Err(RingError::Misaligned { area, ipa });
            }
        }
        Ok(())
    }

    fn used_event_ipa(&self) -> u64 {
        self.state
            .avail_ring
            .wrapping_add(4 + 2 * u64::from(self.state.size))
    }

    fn avail_event_ipa(&self) -> u64 {
        self.state
            .used_ring
            .wrapping_add(4 + 8 * u64::from(self.state.size))
    }

    /// How many chains the guest has made available and the device not yet
    /// taken.
    fn pending(&self, mem: &dyn GuestMemory) -> Result<u16, RingError> {
        let avail_idx = mem.read_u16(self.state.avail_ring.wrapping_add(2))?;
        let pending = avail_idx.wrapping_sub(self.state.next_avail);
        if pending > self.state.size {
            return Err(RingError::AvailIndexJump {
                next_avail: self.state.next_avail,
                avail_idx,
            });
        }
        Ok(pending)
    }

    /// Whether a chain is available (without taking it).
    pub fn has_available(&self, mem: &dyn GuestMemory) -> Result<bool, RingError> {
        if !self.state.ready {
            return Ok(false);
        }
        Ok(self.pending(mem)? != 0)
    }

    /// Takes the next available chain, `None` when the ring is empty or
    /// the queue not ready.
    pub fn pop(&mut self, mem: &dyn GuestMemory) -> Result<Option<DescriptorChain>, RingError> {
        let mut chain = DescriptorChain::default();
        Ok(self.pop_into(mem, &mut chain)?.then_some(chain))
    }

    /// [`Self::pop`] into a chain the caller reuses (its segment list keeps
    /// its allocation); returns whether a chain was taken.
    pub fn pop_into(
        &mut self,
        mem: &dyn GuestMemory,
        chain: &mut DescriptorChain,
    ) -> Result<bool, RingError> {
        if !self.state.ready {
            return Ok(false);
        }
        let mut pending = self.pending(mem)?;
        if pending == 0 && self.event_idx {
            mem.write_u16(self.avail_event_ipa(), self.state.next_avail)?;
            fence(Ordering::SeqCst);
            pending = self.pending(mem)?;
        }
        if pending == 0 {
            return Ok(false);
        }
        // The ring entry is read after the index that published it.
        fence(Ordering::Acquire);
        let slot = u64::from(self.state.next_avail % self.state.size);
        let head = mem.read_u16(self.state.avail_ring.wrapping_add(4 + 2 * slot))?;
        self.walk(mem, head, chain)?;
        self.state.next_avail = self.state.next_avail.wrapping_add(1);
        if self.event_idx {
            mem.write_u16(self.avail_event_ipa(), self.state.next_avail)?;
        }
        Ok(true)
    }

    /// Walks the chain at `head` into `chain` (see the module doc).
    fn walk(
        &self,
        mem: &dyn GuestMemory,
        head: u16,
        chain: &mut DescriptorChain,
    ) -> Result<(), RingError> {
        let size = self.state.size;
        if head >= size {
            return Err(RingError::HeadOutOfRange { head });
        }
        chain.head = head;
        chain.segments.clear();
        chain.readable_len = 0;
        chain.writable_len = 0;
        let mut table = self.state.desc_table;
        let mut table_len = u32::from(size);
        let mut in_indirect = false;
        let mut index = u32::from(head);
        let mut walked = 0u32;
        let mut total = 0u64;
        loop {
            walked += 1;
            if walked > u32::from(size) {
                return Err(RingError::ChainTooLong);
            }
            let mut raw = [0u8; DESCRIPTOR_SIZE as usize];
            mem.read(
                table.wrapping_add(u64::from(index) * DESCRIPTOR_SIZE),
                &mut raw,
            )?;
            let [
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                a7,
                l0,
                l1,
                l2,
                l3,
                f0,
                f1,
                n0,
                n1,
            ] = raw;
            let addr = u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]);
            let len = u32::from_le_bytes([l0, l1, l2, l3]);
            let flags = u16::from_le_bytes([f0, f1]);
            let next = u16::from_le_bytes([n0, n1]);
            if flags & DESC_F_INDIRECT != 0 {
                if !self.indirect {
                    return Err(RingError::IndirectNotNegotiated);
                }
                if in_indirect {
                    return Err(RingError::NestedIndirect);
                }
                if flags & DESC_F_NEXT != 0 {
                    return Err(RingError::IndirectWithNext);
                }
                if len == 0
                    || u64::from(len) % DESCRIPTOR_SIZE != 0
                    || u64::from(len) / DESCRIPTOR_SIZE > u64::from(size)
                {
                    return Err(RingError::BadIndirectLength { len });
                }
                table = addr;
                table_len = len / DESCRIPTOR_SIZE as u32;
                in_indirect = true;
                index = 0;
                continue;
            }
            let device_writable = flags & DESC_F_WRITE != 0;
            if len != 0 {
                if !device_writable && chain.writable_len != 0 {
                    return Err(RingError::ReadableAfterWritable);
                }
                total += u64::from(len);
                if total > u64::from(u32::MAX) {
                    return Err(RingError::LengthOverflow);
                }
                if device_writable {
                    chain.writable_len += len;
                } else {
                    chain.readable_len += len;
                }
                chain.segments.push(Segment {
                    ipa: addr,
                    len,
                    device_writable,
                });
            }
            if flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            if u32::from(next) >= table_len {
                return Err(RingError::NextOutOfRange { next, table_len });
            }
            index = u32::from(next);
        }
    }

    /// Returns the chain at `head` to the guest with `written` bytes
    /// written into it.
    pub fn push_used(
        &mut self,
        mem: &dyn GuestMemory,
        head: u16,
        written: u32,
    ) -> Result<(), RingError> {
        let slot = u64::from(self.state.next_used % self.state.size.max(1));
        let mut elem = [0u8; 8];
        let (id, len) = elem.split_at_mut(4);
        id.copy_from_slice(&u32::from(head).to_le_bytes());
        len.copy_from_slice(&written.to_le_bytes());
        mem.write(self.state.used_ring.wrapping_add(4 + 8 * slot), &elem)?;
        // The element is visible before the index that publishes it.
        fence(Ordering::Release);
        let next = self.state.next_used.wrapping_add(1);
        mem.write_u16(self.state.used_ring.wrapping_add(2), next)?;
        self.state.next_used = next;
        Ok(())
    }

    /// Whether the guest wants an interrupt for the chains used since the
    /// last call (see the module doc); records this decision point.
    pub fn needs_interrupt(&mut self, mem: &dyn GuestMemory) -> Result<bool, RingError> {
        let new = self.state.next_used;
        let old = self.state.signalled_used;
        if new == old {
            return Ok(false);
        }
        self.state.signalled_used = new;
        // The used index is visible before the guest's wish is read.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let used_event = mem.read_u16(self.used_event_ipa())?;
            Ok(vring_need_event(used_event, new, old))
        } else {
            let flags = mem.read_u16(self.state.avail_ring)?;
            Ok(flags & AVAIL_F_NO_INTERRUPT == 0)
        }
    }
}

/// The spec's rule: whether moving an index from `old` to `new` passed
/// `event` (all modulo 2^16).
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::super::fake_guest::{DEVICE_WINDOW, DriverQueue, FakeMemory, SLOT_A, SLOT_B};
    use super::*;
    use proptest::prelude::*;

    const BASE: u64 = SLOT_A.0;
    const BUF: u64 = SLOT_A.0 + 0x2_0000;

    fn queue(
        mem: &FakeMemory,
        size: u16,
        event_idx: bool,
        indirect: bool,
    ) -> (Virtqueue, DriverQueue) {
        let d = DriverQueue::new(size, BASE);
        let mut q = Virtqueue::new(256);
        q.set_size(size);
        q.set_desc_table(d.desc);
        q.set_avail_ring(d.avail);
        q.set_used_ring(d.used);
        q.enable(mem, event_idx, indirect).unwrap();
        (q, d)
    }

    #[test]
    fn a_chain_comes_out_with_its_segments_and_goes_back_used() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, false, false);
        assert_eq!(q.pop(&mem).unwrap(), None);
        let head = d.add_chain(
            &mem,
            &[
                (BUF, 16, false),
                (BUF + 0x100, 100, false),
                (BUF + 0x200, 50, true),
            ],
        );
        d.publish(&mem, head);
        let chain = q.pop(&mem).unwrap().unwrap();
        assert_eq!(chain.head(), head);
        assert_eq!(chain.readable_len(), 116);
        assert_eq!(chain.writable_len(), 50);
        assert_eq!(chain.segments().len(), 3);
        assert_eq!(q.pop(&mem).unwrap(), None);
        q.push_used(&mem, chain.head(), 7).unwrap();
        assert_eq!(d.take_used(&mem), vec![(u32::from(head), 7)]);
    }

    #[test]
    fn readers_and_writers_span_segments_and_the_slot_boundary() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, false, false);
        let boundary = SLOT_B.0;
        let data: Vec<u8> = (0..=255).collect();
        mem.poke(boundary - 100, &data[..200]);
        mem.poke(BUF, &data[200..]);
        let head = d.add_chain(
            &mem,
            &[
                (boundary - 100, 200, false),
                (BUF, 56, false),
                (boundary - 10, 20, true),
                (BUF + 0x1000, 30, true),
            ],
        );
        d.publish(&mem, head);
        let chain = q.pop(&mem).unwrap().unwrap();
        let mut r = ChainReader::new(&chain);
        let mut got = vec![0u8; 300];
        assert_eq!(r.read(&mem, &mut got).unwrap(), 256);
        assert_eq!(&got[..256], &data[..]);
        assert_eq!(r.remaining(), 0);
        let mut w = ChainWriter::new(&chain);
        assert_eq!(w.write(&mem, &[7u8; 45]).unwrap(), 45);
        assert_eq!(w.write(&mem, &[9u8; 10]).unwrap(), 5);
        assert_eq!(mem.peek(boundary - 10, 20), vec![7u8; 20]);
        assert_eq!(
            mem.peek(BUF + 0x1000, 30),
            [vec![7u8; 25], vec![9u8; 5]].concat()
        );
        let mut spans = Vec::new();
        assert_eq!(chain.host_spans(&mem, true, 0, 50, &mut spans).unwrap(), 50);
        // 10 + 10 bytes either side of the boundary, then 30.
        assert_eq!(
            spans.iter().map(|s| s.len).collect::<Vec<_>>(),
            vec![10, 10, 30]
        );
    }

    #[test]
    fn indirect_tables_are_followed_one_level_deep() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, false, true);
        let table = BUF + 0x8000;
        let head = d.add_indirect(
            &mem,
            table,
            &[
                (BUF, 16, false),
                (BUF + 0x100, 512, true),
                (BUF + 0x400, 1, true),
            ],
        );
        d.publish(&mem, head);
        let chain = q.pop(&mem).unwrap().unwrap();
        assert_eq!((chain.readable_len(), chain.writable_len()), (16, 513));
    }

    fn pop_err(mem: &FakeMemory, q: &mut Virtqueue) -> RingError {
        q.pop(mem).unwrap_err()
    }

    #[test]
    fn broken_indirect_tables_are_ring_errors() {
        let mem = FakeMemory::new();
        let table = BUF + 0x8000;
        // Indirect without the feature.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        let head = d.add_indirect(&mem, table, &[(BUF, 16, false)]);
        d.publish(&mem, head);
        assert_eq!(pop_err(&mem, &mut q), RingError::IndirectNotNegotiated);
        // An indirect descriptor inside the table.
        let (mut q, mut d) = queue(&mem, 8, false, true);
        let head = d.add_indirect(&mem, table, &[(BUF, 16, false)]);
        DriverQueue::write_desc_at(&mem, table, 0, table, 16, DESC_F_INDIRECT, 0);
        d.publish(&mem, head);
        assert_eq!(pop_err(&mem, &mut q), RingError::NestedIndirect);
        // Lengths: zero, not a multiple of 16, more entries than the queue.
        for len in [0u32, 17, 16 * 9] {
            let (mut q, mut d) = queue(&mem, 8, false, true);
            d.write_desc(&mem, 0, table, len, DESC_F_INDIRECT, 0);
            d.publish(&mem, 0);
            assert_eq!(pop_err(&mem, &mut q), RingError::BadIndirectLength { len });
        }
        // INDIRECT with NEXT.
        let (mut q, mut d) = queue(&mem, 8, false, true);
        d.write_desc(&mem, 0, table, 16, DESC_F_INDIRECT | DESC_F_NEXT, 1);
        d.publish(&mem, 0);
        assert_eq!(pop_err(&mem, &mut q), RingError::IndirectWithNext);
        // A loop inside the table.
        let (mut q, mut d) = queue(&mem, 8, false, true);
        DriverQueue::write_desc_at(&mem, table, 0, BUF, 16, DESC_F_NEXT, 1);
        DriverQueue::write_desc_at(&mem, table, 1, BUF, 16, DESC_F_NEXT, 0);
        d.write_desc(&mem, 0, table, 32, DESC_F_INDIRECT, 0);
        d.publish(&mem, 0);
        assert_eq!(pop_err(&mem, &mut q), RingError::ChainTooLong);
        // A table outside RAM.
        let (mut q, mut d) = queue(&mem, 8, false, true);
        d.write_desc(&mem, 0, DEVICE_WINDOW, 32, DESC_F_INDIRECT, 0);
        d.publish(&mem, 0);
        assert!(matches!(pop_err(&mem, &mut q), RingError::Memory(_)));
    }

    #[test]
    fn broken_direct_chains_are_ring_errors() {
        let mem = FakeMemory::new();
        // A loop.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        d.write_desc(&mem, 0, BUF, 16, DESC_F_NEXT, 1);
        d.write_desc(&mem, 1, BUF, 16, DESC_F_NEXT, 0);
        d.publish(&mem, 0);
        assert_eq!(pop_err(&mem, &mut q), RingError::ChainTooLong);
        // next out of range.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        d.write_desc(&mem, 0, BUF, 16, DESC_F_NEXT, 8);
        d.publish(&mem, 0);
        assert_eq!(
            pop_err(&mem, &mut q),
            RingError::NextOutOfRange {
                next: 8,
                table_len: 8
            }
        );
        // head out of range.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        d.publish(&mem, 9);
        assert_eq!(pop_err(&mem, &mut q), RingError::HeadOutOfRange { head: 9 });
        // readable after writable.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        let head = d.add_chain(&mem, &[(BUF, 16, true), (BUF, 16, false)]);
        d.publish(&mem, head);
        assert_eq!(pop_err(&mem, &mut q), RingError::ReadableAfterWritable);
        // total length above 4 GiB.
        let (mut q, mut d) = queue(&mem, 8, false, false);
        let head = d.add_chain(&mem, &[(BUF, u32::MAX, false), (BUF, 2, true)]);
        d.publish(&mem, head);
        assert_eq!(pop_err(&mem, &mut q), RingError::LengthOverflow);
        // avail.idx jumping more than a queue ahead.
        let (mut q, d) = queue(&mem, 8, false, false);
        mem.poke_u16(d.avail + 2, 9);
        assert_eq!(
            pop_err(&mem, &mut q),
            RingError::AvailIndexJump {
                next_avail: 0,
                avail_idx: 9
            }
        );
    }

    #[test]
    fn queue_configuration_is_checked_on_enable() {
        let mem = FakeMemory::new();
        let mut q = Virtqueue::new(256);
        let d = DriverQueue::new(8, BASE);
        q.set_desc_table(d.desc);
        q.set_avail_ring(d.avail);
        q.set_used_ring(d.used);
        for size in [0, 3, 512] {
            q.set_size(size);
            assert_eq!(
                q.enable(&mem, false, false),
                Err(RingError::BadSize { size, max: 256 })
            );
        }
        q.set_size(8);
        q.set_used_ring(d.used + 2);
        assert!(matches!(
            q.enable(&mem, false, false),
            Err(RingError::Misaligned {
                area: "used ring",
                ..
            })
        ));
        q.set_used_ring(DEVICE_WINDOW);
        assert!(matches!(
            q.enable(&mem, false, false),
            Err(RingError::Memory(_))
        ));
        // A ring that runs off the end of RAM.
        q.set_used_ring(SLOT_B.0 + SLOT_B.1 - 16);
        assert!(matches!(
            q.enable(&mem, false, false),
            Err(RingError::Memory(_))
        ));
        assert!(!q.ready());
        q.set_used_ring(d.used);
        q.enable(&mem, false, false).unwrap();
        assert!(q.ready());
    }

    #[test]
    fn event_idx_publishes_avail_event_and_interrupts_when_used_event_is_passed() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, true, false);
        assert_eq!(q.pop(&mem).unwrap(), None);
        assert_eq!(d.avail_event(&mem), 0);
        for _ in 0..3 {
            let h = d.add_chain(&mem, &[(BUF, 4, true)]);
            d.publish(&mem, h);
        }
        for _ in 0..3 {
            let c = q.pop(&mem).unwrap().unwrap();
            q.push_used(&mem, c.head(), 4).unwrap();
        }
        assert_eq!(d.avail_event(&mem), 3);
        // The driver wants to hear when used passes 5: not yet.
        d.set_used_event(&mem, 5);
        assert!(!q.needs_interrupt(&mem).unwrap());
        for _ in 0..3 {
            let h = d.add_chain(&mem, &[(BUF, 4, true)]);
            d.publish(&mem, h);
            let c = q.pop(&mem).unwrap().unwrap();
            q.push_used(&mem, c.head(), 4).unwrap();
        }
        assert!(q.needs_interrupt(&mem).unwrap());
        // Nothing new: no interrupt.
        assert!(!q.needs_interrupt(&mem).unwrap());
    }

    #[test]
    fn without_event_idx_no_interrupt_flag_is_honoured() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, false, false);
        let h = d.add_chain(&mem, &[(BUF, 4, true)]);
        d.publish(&mem, h);
        let c = q.pop(&mem).unwrap().unwrap();
        q.push_used(&mem, c.head(), 0).unwrap();
        d.set_avail_flags(&mem, AVAIL_F_NO_INTERRUPT);
        assert!(!q.needs_interrupt(&mem).unwrap());
        d.publish(&mem, h);
        let c = q.pop(&mem).unwrap().unwrap();
        q.push_used(&mem, c.head(), 0).unwrap();
        d.set_avail_flags(&mem, 0);
        assert!(q.needs_interrupt(&mem).unwrap());
    }

    #[test]
    fn indices_wrap_at_2_16() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 4, false, false);
        let mut state = q.state();
        state.next_avail = 0xfffe;
        state.next_used = 0xfffe;
        state.signalled_used = 0xfffe;
        q.restore(state, false, false).unwrap();
        d.avail_idx = 0xfffe;
        d.used_seen = 0xfffe;
        for round in 0..4u32 {
            let h = d.add_chain(&mem, &[(BUF, 4, true)]);
            d.publish(&mem, h);
            let c = q.pop(&mem).unwrap().unwrap();
            q.push_used(&mem, c.head(), round).unwrap();
            assert_eq!(d.take_used(&mem), vec![(u32::from(h), round)]);
        }
        assert_eq!(q.next_avail(), 2);
        assert_eq!(mem.peek_u16(d.used + 2), 2);
    }

    #[test]
    fn a_restored_queue_carries_on_where_the_snapshot_left() {
        let mem = FakeMemory::new();
        let (mut q, mut d) = queue(&mem, 8, true, true);
        for _ in 0..5 {
            let h = d.add_chain(&mem, &[(BUF, 4, true)]);
            d.publish(&mem, h);
        }
        for _ in 0..2 {
            let c = q.pop(&mem).unwrap().unwrap();
            q.push_used(&mem, c.head(), 1).unwrap();
        }
        let mut copy = Virtqueue::new(256);
        copy.restore(q.state(), true, true).unwrap();
        assert_eq!(copy.state(), q.state());
        let mut n = 0;
        while let Some(c) = copy.pop(&mem).unwrap() {
            copy.push_used(&mem, c.head(), 2).unwrap();
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(d.take_used(&mem).len(), 5);
        let mut bad = q.state();
        bad.size = 6;
        assert!(copy.restore(bad, true, true).is_err());
    }

    /// The reference for the event rule: did the used index step onto
    /// `event` while moving from `old` to `new`? (Walks the indices one by
    /// one instead of the spec's subtraction.)
    fn passes(event: u16, new: u16, old: u16) -> bool {
        let mut i = old;
        while i != new {
            if i == event {
                return true;
            }
            i = i.wrapping_add(1);
        }
        false
    }

    proptest! {
        #[test]
        fn vring_need_event_matches_walking_the_indices(
            old in any::<u16>(),
            step in 0u16..600,
            // Mostly near the batch, where the edges are.
            event_offset in prop_oneof![-4i32..610, any::<u16>().prop_map(i32::from)],
        ) {
            let new = old.wrapping_add(step);
            let event = old.wrapping_add(event_offset as u16);
            prop_assert_eq!(vring_need_event(event, new, old), passes(event, new, old));
        }

        /// Batches of used chains with random `used_event`s: the used ring
        /// holds the right elements in order, and the interrupt decision
        /// matches the reference.
        #[test]
        fn used_ring_and_interrupts_match_a_reference(
            start in any::<u16>(),
            // (chains used, used_event relative to the last decision, NO_INTERRUPT)
            batches in proptest::collection::vec((1usize..6, -3i32..9, any::<bool>()), 1..20),
            event_idx in any::<bool>(),
        ) {
            let mem = FakeMemory::new();
            let (mut q, mut d) = queue(&mem, 8, event_idx, false);
            let mut state = q.state();
            state.next_avail = start;
            state.next_used = start;
            state.signalled_used = start;
            q.restore(state, event_idx, false).unwrap();
            d.avail_idx = start;
            d.used_seen = start;
            mem.poke_u16(d.avail + 2, start);
            let mut signalled = start;
            let mut len = 0u32;
            for (count, event_offset, no_interrupt) in batches {
                let event = signalled.wrapping_add(event_offset as u16);
                let mut expected = Vec::new();
                for _ in 0..count {
                    let h = d.add_chain(&mem, &[(BUF, 4, true)]);
                    d.publish(&mem, h);
                    let c = q.pop(&mem).unwrap().unwrap();
                    len += 1;
                    q.push_used(&mem, c.head(), len).unwrap();
                    expected.push((u32::from(h), len));
                }
                d.set_used_event(&mem, event);
                d.set_avail_flags(&mem, if no_interrupt { AVAIL_F_NO_INTERRUPT } else { 0 });
                let new = d.avail_idx;
                let want = if event_idx { passes(event, new, signalled) } else { !no_interrupt };
                prop_assert_eq!(q.needs_interrupt(&mem).unwrap(), want);
                signalled = new;
                prop_assert_eq!(d.take_used(&mem), expected);
            }
        }

        /// Whatever the guest puts in the descriptor table and the
        /// available ring, `pop` ends in a chain or a ring error, reads a
        /// bounded number of times, and writes only the used ring.
        #[test]
        fn arbitrary_rings_end_in_a_chain_or_an_error(
            descs in proptest::collection::vec(
                (prop_oneof![
                    Just(BUF), Just(DEVICE_WINDOW), Just(SLOT_B.0 - 8), Just(BUF + 0x8000), any::<u64>()
                 ], prop_oneof![Just(16u32), Just(32), 0u32..64, any::<u32>()], 0u16..8, 0u16..10),
                8),
            heads in proptest::collection::vec(0u16..10, 1..12),
            avail_idx in prop_oneof![Just(None), any::<u16>().prop_map(Some)],
            indirect in any::<bool>(),
            event_idx in any::<bool>(),
        ) {
            let mem = FakeMemory::new();
            let (mut q, mut d) = queue(&mem, 8, event_idx, indirect);
            // The same descriptors also as an indirect table at BUF + 0x8000.
            for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
                d.write_desc(&mem, i as u16, addr, len, flags, next);
                DriverQueue::write_desc_at(&mem, BUF + 0x8000, i as u16, addr, len, flags, next);
            }
            for &h in &heads {
                d.publish(&mem, h);
            }
            if let Some(idx) = avail_idx {
                mem.poke_u16(d.avail + 2, idx);
            }
            mem.clear_logs();
            let used_area = d.used..d.used + 6 + 8 * 8;
            for _ in 0..heads.len() + 2 {
                let before = mem.accesses().len();
                let popped = q.pop(&mem);
                // idx (twice when empty with EVENT_IDX), head, at most 8
                // descriptors (the queue size), avail_event.
                prop_assert!(mem.accesses().len() - before <= 13, "{} accesses", mem.accesses().len() - before);
                match popped {
                    Ok(Some(chain)) => {
                        prop_assert!(chain.segments().len() <= 8);
                        let total: u64 = chain.segments().iter().map(|s| u64::from(s.len)).sum();
                        prop_assert_eq!(total, u64::from(chain.readable_len()) + u64::from(chain.writable_len()));
                        q.push_used(&mem, chain.head(), 0).unwrap();
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            for a in mem.accesses() {
                if a.write {
                    prop_assert!(used_area.contains(&a.ipa) && used_area.contains(&(a.ipa + a.len - 1)));
                }
            }
        }
    }
}
