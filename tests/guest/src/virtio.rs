//! The guest's virtio-mmio driver, just enough to drive a virtio-console
//! well and badly: find a device (its `virtio,mmio` node, or the QEMU
//! `virt` windows at 0x0a00_0000 + 0x200 i probed for the magic value),
//! reset it, go through the status sequence (`ACKNOWLEDGE`, `DRIVER`,
//! features, `FEATURES_OK`, queues, `DRIVER_OK`), and send bytes through
//! the console's transmit queue.
//!
//! # Memory
//!
//! The guest has no heap: every ring and buffer lives in one static arena
//! of normal write-back memory (the devices are `dma-coherent`, so the
//! guest and the hypervisor see the same bytes without cache maintenance).
//! The arena holds, page by page: the receive queue's rings, the transmit
//! queue's rings, indirect descriptor tables, and transmit buffers. A
//! fresh setup zeroes the rings.
//!
//! # Requests
//!
//! A request writes its descriptors, then the available ring entry, then
//! (after a store barrier, so the device never sees the index before the
//! entry) the available index, then (after a full barrier) notifies. The
//! hypervisor serves a notify before the store returns, but the driver
//! still polls the used index with a deadline, as a driver on hardware
//! would. Only the boot vCPU drives the device.

use core::arch::asm;

use crate::mmu::DEVICE_ALIAS_BASE;
use crate::platform::Platform;
use crate::smp::Deadline;
use crate::virtio_ring::{
    CONSOLE_RECEIVE_QUEUE, CONSOLE_TRANSMIT_QUEUE, DEVICE_ID_CONSOLE, Descriptor, F_VERSION_1,
    MAGIC, QueueLayout, REG_DEVICE_FEATURES, REG_DEVICE_FEATURES_SEL, REG_DEVICE_ID,
    REG_DRIVER_FEATURES, REG_DRIVER_FEATURES_SEL, REG_INTERRUPT_ACK, REG_INTERRUPT_STATUS,
    REG_MAGIC, REG_QUEUE_DESC, REG_QUEUE_DEVICE, REG_QUEUE_DRIVER, REG_QUEUE_NOTIFY, REG_QUEUE_NUM,
    REG_QUEUE_NUM_MAX, REG_QUEUE_READY, REG_QUEUE_SEL, REG_STATUS, REG_VERSION, STATUS_ACKNOWLEDGE,
    STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET, WINDOW_SIZE,
};

/// Where QEMU `virt` (and the hypervisor) put the first virtio-mmio window.
pub const PROBE_BASE: u64 = 0x0a00_0000;
/// Windows probed when the device tree names none.
const PROBE_WINDOWS: u64 = 32;

/// Bytes of the arena.
pub const ARENA_SIZE: u64 = 0x1_0000;
/// Arena offsets: the receive queue's rings, the transmit queue's rings,
/// indirect tables (two pages), transmit buffers (the rest).
const RX_RINGS: u64 = 0x0000;
const TX_RINGS: u64 = 0x1000;
/// Offset of the indirect tables.
pub const INDIRECT_TABLES: u64 = 0x2000;
/// Offset of the transmit buffers.
pub const TX_BUFFERS: u64 = 0x4000;

/// How long the driver waits for the device to use a buffer.
const USED_TIMEOUT_MILLIS: u64 = 500;

#[repr(C, align(4096))]
struct Arena([u8; ARENA_SIZE as usize]);

/// The rings and buffers (see the module doc). Only the boot vCPU touches
/// it, through [`arena`] addresses.
static mut ARENA: Arena = Arena([0; ARENA_SIZE as usize]);

/// Address of the arena's byte at `offset`.
pub fn arena(offset: u64) -> u64 {
    (&raw const ARENA) as u64 + offset
}

/// Writes `bytes` at `address` in the arena.
pub fn poke(address: u64, bytes: &[u8]) {
    let base = arena(0);
    assert!(address >= base && address + bytes.len() as u64 <= base + ARENA_SIZE);
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: inside the arena (checked above), which only the boot
        // vCPU writes; the device reads it through the hypervisor.
        unsafe { core::ptr::write_volatile((address + i as u64) as *mut u8, b) };
    }
}

/// Reads a little-endian `u16` in the arena.
pub fn peek_u16(address: u64) -> u16 {
    let base = arena(0);
    assert!(address >= base && address + 2 <= base + ARENA_SIZE && address.is_multiple_of(2));
    // SAFETY: an aligned location inside the arena (checked above); the
    // device may write it (used ring), hence the volatile read.
    unsafe { core::ptr::read_volatile(address as *const u16) }
}

/// Reads a little-endian `u32` in the arena.
pub fn peek_u32(address: u64) -> u32 {
    let base = arena(0);
    assert!(address >= base && address + 4 <= base + ARENA_SIZE && address.is_multiple_of(4));
    // SAFETY: as in `peek_u16`.
    unsafe { core::ptr::read_volatile(address as *const u32) }
}

/// Zeroes `len` bytes of the arena at `offset`.
fn zero(offset: u64, len: u64) {
    for at in (offset..offset + len).step_by(8) {
        // SAFETY: inside the arena (the callers pass its own areas), 8-byte
        // aligned since the areas are.
        unsafe { core::ptr::write_volatile(arena(at) as *mut u64, 0) };
    }
}

/// Orders the guest's ring stores before what follows (the available index,
/// a notify).
fn store_barrier() {
    // SAFETY: a barrier only orders memory accesses.
    unsafe { asm!("dsb ishst", options(nostack)) };
}

/// Orders everything before a device register access.
fn full_barrier() {
    // SAFETY: as above.
    unsafe { asm!("dsb sy", options(nostack)) };
}

/// One virtio-mmio register window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mmio {
    /// The window's base (identity mapped as device memory).
    pub base: u64,
}

impl Mmio {
    /// A 32-bit register read.
    pub fn read(self, offset: u64) -> u32 {
        // SAFETY: a register of the device's window, device memory; reads of
        // virtio-mmio registers have no side effects.
        unsafe { core::ptr::read_volatile((self.base + offset) as *const u32) }
    }

    /// A 32-bit register write.
    pub fn write(self, offset: u64, value: u32) {
        // SAFETY: a register of the device's window, device memory; the
        // device's rings and buffers are all in the arena, so nothing the
        // device does writes elsewhere in the guest.
        unsafe { core::ptr::write_volatile((self.base + offset) as *mut u32, value) }
    }

    /// The same window through the normal non-cacheable alias, where an
    /// unaligned access reaches the hypervisor instead of faulting in the
    /// guest.
    pub fn alias(self) -> u64 {
        DEVICE_ALIAS_BASE + self.base
    }

    /// `Status`.
    pub fn status(self) -> u32 {
        self.read(REG_STATUS)
    }

    /// Writes 0 to `Status`.
    pub fn reset(self) {
        self.write(REG_STATUS, 0);
    }

    /// Writes a 64-bit address into a low/high register pair.
    pub fn write_address(self, low: u64, address: u64) {
        self.write(low, address as u32);
        self.write(low + 4, (address >> 32) as u32);
    }

    /// The features the device offers.
    pub fn device_features(self) -> u64 {
        self.write(REG_DEVICE_FEATURES_SEL, 0);
        let low = self.read(REG_DEVICE_FEATURES);
        self.write(REG_DEVICE_FEATURES_SEL, 1);
        let high = self.read(REG_DEVICE_FEATURES);
        u64::from(high) << 32 | u64::from(low)
    }

    /// Writes the driver's features.
    pub fn write_driver_features(self, features: u64) {
        self.write(REG_DRIVER_FEATURES_SEL, 0);
        self.write(REG_DRIVER_FEATURES, features as u32);
        self.write(REG_DRIVER_FEATURES_SEL, 1);
        self.write(REG_DRIVER_FEATURES, (features >> 32) as u32);
    }

    /// Notifies `queue`.
    pub fn notify(self, queue: u32) {
        full_barrier();
        self.write(REG_QUEUE_NOTIFY, queue);
    }

    /// Acknowledges every pending interrupt bit; returns them.
    pub fn take_interrupts(self) -> u32 {
        let pending = self.read(REG_INTERRUPT_STATUS);
        self.write(REG_INTERRUPT_ACK, pending);
        pending
    }
}

/// The virtio-console to drive: the first `virtio,mmio` node whose device
/// is a console, or, without such nodes, the first console among the QEMU
/// `virt` windows.
pub fn find_console(platform: &Platform) -> Option<Mmio> {
    let is_console = |mmio: Mmio| {
        mmio.read(REG_MAGIC) == MAGIC
            && mmio.read(REG_VERSION) == 2
            && mmio.read(REG_DEVICE_ID) == DEVICE_ID_CONSOLE
    };
    if !platform.virtio().is_empty() {
        return platform
            .virtio()
            .iter()
            .map(|node| Mmio {
                base: node.window.start,
            })
            .find(|&mmio| is_console(mmio));
    }
    (0..PROBE_WINDOWS)
        .map(|i| Mmio {
            base: PROBE_BASE + i * WINDOW_SIZE,
        })
        .find(|&mmio| {
            // Without nodes the windows may be holes: a load that aborts is
            // no device.
            crate::exceptions::load_u32(mmio.base + REG_MAGIC).is_ok_and(|magic| magic == MAGIC)
                && is_console(mmio)
        })
}

/// Why setting a device up failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupError {
    /// `Status` did not read 0 after a reset.
    NotReset {
        /// What it read.
        status: u32,
    },
    /// The device does not offer `VERSION_1`.
    NoVersion1 {
        /// Its offer.
        offered: u64,
    },
    /// `FEATURES_OK` did not stick.
    FeaturesRefused {
        /// The features written.
        features: u64,
    },
    /// A queue is smaller than the driver wants, or missing.
    QueueTooSmall {
        /// The queue.
        queue: u32,
        /// Its `QueueNumMax`.
        max: u32,
    },
    /// `QueueReady` did not read back 1.
    QueueNotReady {
        /// The queue.
        queue: u32,
        /// `Status` then.
        status: u32,
    },
    /// `DRIVER_OK` did not stick, or the device needs a reset.
    NotLive {
        /// `Status`.
        status: u32,
    },
}

/// The transmit side of a set-up console.
#[derive(Clone, Copy, Debug)]
pub struct Console {
    /// Its registers.
    pub mmio: Mmio,
    /// The features negotiated.
    pub features: u64,
    /// The transmit queue's rings.
    pub tx: QueueLayout,
    /// The next available index the driver publishes.
    pub next_avail: u16,
    /// The used index the driver has seen.
    pub used_seen: u16,
    /// Where the next buffer goes, from [`TX_BUFFERS`].
    buffer_at: u64,
}

/// What the device did with published chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It used them all: `used.idx` reached the available index.
    Used,
    /// It entered `DEVICE_NEEDS_RESET`.
    NeedsReset,
    /// Neither before the deadline.
    Stalled {
        /// `used.idx`.
        used: u16,
        /// `Status`.
        status: u32,
    },
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The device did not use the chain (or broke).
    Outcome(Outcome),
    /// The used element is not the chain's.
    WrongUsed {
        /// The element's `id`.
        id: u32,
        /// Its `len`.
        len: u32,
        /// The chain's head.
        head: u16,
    },
}

impl Console {
    /// Resets the console at `mmio` and sets it up from scratch: features
    /// `wanted` (with `VERSION_1`) as far as offered, both queues of
    /// `size` entries (rings zeroed), `DRIVER_OK`.
    pub fn setup(mmio: Mmio, wanted: u64, size: u16) -> Result<Console, SetupError> {
        mmio.reset();
        let status = mmio.status();
        if status != 0 {
            return Err(SetupError::NotReset { status });
        }
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        let offered = mmio.device_features();
        if offered & F_VERSION_1 == 0 {
            return Err(SetupError::NoVersion1 { offered });
        }
        let features = (wanted | F_VERSION_1) & offered;
        mmio.write_driver_features(features);
        let features_ok = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        mmio.write(REG_STATUS, features_ok);
        if mmio.status() & STATUS_FEATURES_OK == 0 {
            return Err(SetupError::FeaturesRefused { features });
        }
        let rx = QueueLayout::packed(arena(RX_RINGS), size);
        let tx = QueueLayout::packed(arena(TX_RINGS), size);
        for (queue, layout, offset) in [
            (CONSOLE_RECEIVE_QUEUE, rx, RX_RINGS),
            (CONSOLE_TRANSMIT_QUEUE, tx, TX_RINGS),
        ] {
            zero(offset, layout.span().next_multiple_of(8));
            configure_queue(mmio, queue, layout)?;
        }
        mmio.write(REG_STATUS, features_ok | STATUS_DRIVER_OK);
        let status = mmio.status();
        if status & STATUS_DRIVER_OK == 0 || status & STATUS_NEEDS_RESET != 0 {
            return Err(SetupError::NotLive { status });
        }
        Ok(Console {
            mmio,
            features,
            tx,
            next_avail: 0,
            used_seen: 0,
            buffer_at: TX_BUFFERS,
        })
    }

    /// Copies `bytes` into the next free transmit buffer; its address.
    pub fn buffer(&mut self, bytes: &[u8]) -> u64 {
        let len = bytes.len() as u64;
        if self.buffer_at + len > ARENA_SIZE {
            self.buffer_at = TX_BUFFERS;
        }
        let address = arena(self.buffer_at);
        poke(address, bytes);
        self.buffer_at = (self.buffer_at + len).next_multiple_of(16);
        address
    }

    /// Writes descriptor `index` of the transmit table (any index the
    /// table holds: the caller's chains).
    pub fn set_descriptor(&self, index: u16, descriptor: Descriptor) {
        poke(
            self.tx.descriptor(index % self.tx.size),
            &descriptor.to_bytes(),
        );
    }

    /// Adds `head` to the available ring without publishing it.
    pub fn post(&mut self, head: u16) {
        poke(self.tx.avail_entry(self.next_avail), &head.to_le_bytes());
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publishes `idx` as the available index (normally [`Self::next_avail`]).
    pub fn publish(&self, idx: u16) {
        store_barrier();
        poke(self.tx.avail_idx(), &idx.to_le_bytes());
    }

    /// The device's used index.
    pub fn used_idx(&self) -> u16 {
        peek_u16(self.tx.used_idx())
    }

    /// The used element for index `idx`: (`id`, `len`).
    pub fn used_element(&self, idx: u16) -> (u32, u32) {
        let at = self.tx.used_entry(idx);
        (peek_u32(at), peek_u32(at + 4))
    }

    /// Notifies the transmit queue and waits until the device has used
    /// everything published up to `target` or needs a reset.
    pub fn notify_and_wait(&mut self, target: u16) -> Outcome {
        self.mmio.notify(CONSOLE_TRANSMIT_QUEUE);
        self.wait(target)
    }

    /// Waits until `used.idx` reaches `target` or the device needs a reset.
    pub fn wait(&mut self, target: u16) -> Outcome {
        let deadline = Deadline::after_millis(USED_TIMEOUT_MILLIS);
        loop {
            if self.used_idx() == target {
                return Outcome::Used;
            }
            let status = self.mmio.status();
            if status & STATUS_NEEDS_RESET != 0 {
                return Outcome::NeedsReset;
            }
            if deadline.passed() {
                return Outcome::Stalled {
                    used: self.used_idx(),
                    status,
                };
            }
            core::hint::spin_loop();
        }
    }

    /// Sends `bytes` as one chain of one descriptor and checks the device
    /// used it (its head, length 0: a console writes nothing back).
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), RequestError> {
        let address = self.buffer(bytes);
        let head = self.next_avail % self.tx.size;
        self.set_descriptor(head, Descriptor::readable(address, bytes.len() as u32));
        self.post(head);
        self.publish(self.next_avail);
        let outcome = self.notify_and_wait(self.next_avail);
        if outcome != Outcome::Used {
            return Err(RequestError::Outcome(outcome));
        }
        let (id, len) = self.used_element(self.next_avail.wrapping_sub(1));
        self.used_seen = self.next_avail;
        if id != u32::from(head) || len != 0 {
            return Err(RequestError::WrongUsed { id, len, head });
        }
        Ok(())
    }
}

/// Selects `queue` and configures it with `layout`, then `QueueReady`.
fn configure_queue(mmio: Mmio, queue: u32, layout: QueueLayout) -> Result<(), SetupError> {
    mmio.write(REG_QUEUE_SEL, queue);
    let max = mmio.read(REG_QUEUE_NUM_MAX);
    if max < u32::from(layout.size) {
        return Err(SetupError::QueueTooSmall { queue, max });
    }
    mmio.write(REG_QUEUE_NUM, u32::from(layout.size));
    mmio.write_address(REG_QUEUE_DESC, layout.desc);
    mmio.write_address(REG_QUEUE_DRIVER, layout.avail);
    mmio.write_address(REG_QUEUE_DEVICE, layout.used);
    full_barrier();
    mmio.write(REG_QUEUE_READY, 1);
    if mmio.read(REG_QUEUE_READY) != 1 {
        return Err(SetupError::QueueNotReady {
            queue,
            status: mmio.status(),
        });
    }
    Ok(())
}
