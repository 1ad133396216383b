//! The virtio-mmio (version 2) register file of one device: feature
//! negotiation, the driver's status sequence, queue configuration, notifies
//! and interrupts, in front of a [`VirtioDevice`] model and its
//! [`Virtqueue`]s.
//!
//! # Accesses
//!
//! The runtime forwards every guest access to the device's window as
//! [`MmioTransport::read`] / [`MmioTransport::write`] with the offset in the
//! window and the access size. Registers below 0x100 are 32-bit and must be
//! accessed as aligned 4-byte words; the device configuration at 0x100 on
//! takes aligned 1, 2 and 4-byte accesses. Anything else (another size, an
//! offset with no register, a write to a read-only register, a register
//! write the status forbids) reads as 0 or is ignored, and comes back as an
//! [`AccessError`] the runtime logs (once per device is enough).
//!
//! # Status sequence
//!
//! Writing 0 to `Status` resets the device: features, selectors, queues,
//! interrupt status and the device model go back to their initial state.
//! Otherwise the driver may only add bits, in the spec's order:
//! `ACKNOWLEDGE`, then `DRIVER`, then `FEATURES_OK`, then `DRIVER_OK`
//! (`FAILED` at any time); a write that clears a bit, skips a step or sets
//! a bit we do not offer (`SUSPEND`, reserved bits) is ignored. `FEATURES_OK` is accepted only when the driver's
//! features are a subset of the offer and include `VERSION_1`; otherwise the
//! bit stays clear (the driver reads `Status` back and gives up).
//! `DEVICE_NEEDS_RESET` is the device's bit: the driver cannot set or clear
//! it except by a reset.
//!
//! The offer is `VERSION_1 | RING_EVENT_IDX | RING_INDIRECT_DESC` plus the
//! device's own features. `DriverFeatures` is writable until `FEATURES_OK`.
//!
//! # Queue configuration rules
//!
//! `QueueNum`, `QueueDesc*`, `QueueDriver*`, `QueueDevice*` and
//! `QueueReady` = 1 are accepted only while the selected queue exists and is
//! not ready, `FEATURES_OK` is set (so the ring features are settled) and
//! `DRIVER_OK` and `DEVICE_NEEDS_RESET` are not. `QueueReady` = 1 checks the
//! queue ([`Virtqueue::enable`]: size, alignment, rings in RAM); a refused
//! queue puts the device in `DEVICE_NEEDS_RESET`. `QueueReady` = 0 is
//! accepted at any time and stops the queue.
//!
//! # Notifies, interrupts, broken rings
//!
//! A `QueueNotify` after `DRIVER_OK` runs the device on that queue. After
//! any device work the transport asks each queue whether the guest wants an
//! interrupt ([`Virtqueue::needs_interrupt`]); if one does, bit 0 of
//! `InterruptStatus` is set and the returned [`Effects`] say to raise the
//! device's interrupt. A [`RingError`] from the device sets
//! `DEVICE_NEEDS_RESET`, raises bit 1 (configuration change) with an
//! interrupt when `DRIVER_OK` was set (the spec forbids the notification
//! before), and is reported in [`Effects::needs_reset`] once; the device
//! then ignores notifies until the driver resets it.
//!
//! # What comes from the `virtio-spec` crate
//!
//! Status bits ([`virtio_spec::DeviceStatus`]), feature bits
//! ([`virtio_spec::F`] and the devices' own), device ids, the magic value
//! and interrupt status bits, descriptor and ring flags, block request
//! types and statuses. The register offsets are ours: the crate describes
//! the register file as a volatile struct for a driver to access, not as
//! offsets a device decodes; likewise the devices lay out their
//! configuration bytes themselves (the crate's configuration structs are
//! volatile views with private fields).

use super::virtqueue::{QueueState, RingError, Virtqueue};
use crate::devices::guest_memory::GuestMemory;
use alloc::vec::Vec;
use core::fmt;
use virtio_spec::DeviceStatus;
use virtio_spec::mmio::{InterruptStatus, MAGIC_VALUE};

/// `MagicValue` (read only): "virt".
pub const REG_MAGIC_VALUE: u64 = 0x000;
/// `Version` (read only): 2.
pub const REG_VERSION: u64 = 0x004;
/// `DeviceID` (read only).
pub const REG_DEVICE_ID: u64 = 0x008;
/// `VendorID` (read only).
pub const REG_VENDOR_ID: u64 = 0x00c;
/// `DeviceFeatures` (read only): the half of the offer `DeviceFeaturesSel`
/// selects.
pub const REG_DEVICE_FEATURES: u64 = 0x010;
/// `DeviceFeaturesSel` (write only).
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
/// `DriverFeatures` (write only).
pub const REG_DRIVER_FEATURES: u64 = 0x020;
/// `DriverFeaturesSel` (write only).
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
/// `QueueSel` (write only).
pub const REG_QUEUE_SEL: u64 = 0x030;
/// `QueueNumMax` (read only).
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
/// `QueueNum` (write only).
pub const REG_QUEUE_NUM: u64 = 0x038;
/// `QueueReady` (read/write).
pub const REG_QUEUE_READY: u64 = 0x044;
/// `QueueNotify` (write only).
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
/// `InterruptStatus` (read only).
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
/// `InterruptACK` (write only).
pub const REG_INTERRUPT_ACK: u64 = 0x064;
/// `Status` (read/write).
pub const REG_STATUS: u64 = 0x070;
/// `QueueDescLow` (write only).
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
/// `QueueDescHigh` (write only).
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
/// `QueueDriverLow` (write only).
pub const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
/// `QueueDriverHigh` (write only).
pub const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
/// `QueueDeviceLow` (write only).
pub const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
/// `QueueDeviceHigh` (write only).
pub const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
/// `ConfigGeneration` (read only).
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
/// The device configuration starts here.
pub const REG_CONFIG: u64 = 0x100;
/// The size of a device's register window.
pub const WINDOW_SIZE: u64 = 0x200;

/// The vendor id the devices report ("EL2H", any value is allowed).
pub const VENDOR_ID: u32 = u32::from_le_bytes(*b"EL2H");

/// `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = feature(virtio_spec::F::VERSION_1);
/// `VIRTIO_F_RING_EVENT_IDX`.
pub const F_RING_EVENT_IDX: u64 = feature(virtio_spec::F::EVENT_IDX);
/// `VIRTIO_F_RING_INDIRECT_DESC`.
pub const F_RING_INDIRECT_DESC: u64 = feature(virtio_spec::F::INDIRECT_DESC);
/// What the transport offers on top of the device's own features.
pub const TRANSPORT_FEATURES: u64 = F_VERSION_1 | F_RING_EVENT_IDX | F_RING_INDIRECT_DESC;

const STATUS_ACKNOWLEDGE: u8 = DeviceStatus::ACKNOWLEDGE.bits();
const STATUS_DRIVER: u8 = DeviceStatus::DRIVER.bits();
const STATUS_FEATURES_OK: u8 = DeviceStatus::FEATURES_OK.bits();
const STATUS_DRIVER_OK: u8 = DeviceStatus::DRIVER_OK.bits();
const STATUS_NEEDS_RESET: u8 = DeviceStatus::DEVICE_NEEDS_RESET.bits();
/// The bits a driver may write (no `SUSPEND`: not offered).
const STATUS_DRIVER_BITS: u8 = STATUS_ACKNOWLEDGE
    | STATUS_DRIVER
    | STATUS_FEATURES_OK
    | STATUS_DRIVER_OK
    | DeviceStatus::FAILED.bits();
const INT_USED_BUFFER: u32 = InterruptStatus::USED_BUFFER_NOTIFICATION.bits() as u32;
const INT_CONFIG_CHANGE: u32 = InterruptStatus::CONFIGURATION_CHANGE_NOTIFICATION.bits() as u32;

/// The low 64 bits of one of the spec crate's 128-bit feature masks.
pub const fn feature(bits: virtio_spec::F) -> u64 {
    bits.bits().to_ne() as u64
}

/// Fills `data` with the bytes of `config` (a device's configuration laid
/// out as the spec gives it) from `offset` on; bytes past its end, and all
/// of them when `offset` is past it, read as 0: what
/// [`VirtioDevice::read_config`] returns.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let from = config.get(start..).unwrap_or_default();
    let n = from.len().min(data.len());
    let (copied, past_end) = data.split_at_mut(n);
    copied.copy_from_slice(&from[..n]);
    past_end.fill(0);
}

/// Where a device's queues, guest memory and pending work meet while the
/// device runs: what [`VirtioDevice`] methods get.
pub struct QueueContext<'a> {
    /// The device's queues, by index.
    pub queues: &'a mut [Virtqueue],
    /// The VM's RAM.
    pub mem: &'a dyn GuestMemory,
    /// Set by the device when it has output for the runtime to take
    /// (console bytes, net frames).
    pub output_ready: bool,
}

/// A device model behind the transport.
pub trait VirtioDevice: Send {
    /// Its plain-data state for migration.
    type State: Clone + fmt::Debug + PartialEq;

    /// Its virtio device id (1 net, 2 block, 3 console).
    fn device_id(&self) -> u32;

    /// Its own feature bits (the transport adds [`TRANSPORT_FEATURES`]).
    fn features(&self) -> u64;

    /// The maximum size of each of its queues; the length is the number of
    /// queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// Fills `data` from its configuration at `offset` (bytes beyond the
    /// configuration read as 0): the device lays its configuration out and
    /// hands it to [`read_config_bytes`].
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// A driver write to its configuration; returns whether it was
    /// accepted. The default refuses (every field read-only).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) -> bool {
        false
    }

    /// The driver set `DRIVER_OK` with `features`; the queues are set up.
    fn activate(&mut self, features: u64, ctx: &mut QueueContext<'_>) -> Result<(), RingError>;

    /// The driver notified `queue`.
    fn queue_notify(&mut self, queue: u16, ctx: &mut QueueContext<'_>) -> Result<(), RingError>;

    /// Back to the state before the driver's first access (keeping what
    /// the configuration gave it: backend, MAC, counters).
    fn reset(&mut self);

    /// Its state for migration.
    fn snapshot(&self) -> Self::State;

    /// Takes over a migrated state.
    fn restore(&mut self, state: &Self::State) -> Result<(), SnapshotError>;
}

/// What a refused access was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessErrorKind {
    /// Not a size the register takes (registers: aligned 4 bytes; device
    /// configuration: aligned 1, 2 or 4 bytes).
    BadSize,
    /// No register at this offset.
    NoRegister,
    /// A write to a read-only register.
    ReadOnly,
    /// A read of a write-only register (answered 0).
    WriteOnly,
    /// A queue register written while the queue is ready, before
    /// `FEATURES_OK`, after `DRIVER_OK` or with `DEVICE_NEEDS_RESET`.
    QueueLocked,
    /// `QueueSel` names no queue of this device.
    NoQueue,
    /// `DriverFeatures` written after `FEATURES_OK`, or a selector above 1
    /// with a non-zero value.
    FeaturesLocked,
    /// `FEATURES_OK` refused: features not offered or without `VERSION_1`.
    FeaturesRefused,
    /// A status write that clears bits or skips a step of the sequence.
    BadStatus,
    /// A device configuration write the device refused.
    ConfigReadOnly,
}

/// A refused access, for the runtime's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessError {
    /// Offset in the device window.
    pub offset: u64,
    /// Access size in bytes.
    pub size: u8,
    /// Whether it was a write.
    pub write: bool,
    /// What was wrong.
    pub kind: AccessErrorKind,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = if self.write { "write" } else { "read" };
        write!(
            f,
            "virtio-mmio {}-byte {dir} at {:#x} refused: {:?}",
            self.size, self.offset, self.kind
        )
    }
}

/// What the runtime must do after a call into the transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Effects {
    /// Raise the device's interrupt (an edge on its SPI) now.
    pub interrupt: bool,
    /// The device just entered `DEVICE_NEEDS_RESET` for this reason (log it
    /// once; it stays in that state until the driver resets it).
    pub needs_reset: Option<RingError>,
    /// The device holds output to take (console bytes, net frames).
    pub output_ready: bool,
    /// The access was refused (read as 0 / ignored).
    pub access_error: Option<AccessError>,
    /// The driver reset the device (writing 0 to `Status`).
    pub device_reset: bool,
}

impl Effects {
    /// Both effects together (the first error of each kind kept).
    pub fn merge(self, other: Effects) -> Effects {
        Effects {
            interrupt: self.interrupt || other.interrupt,
            needs_reset: self.needs_reset.or(other.needs_reset),
            output_ready: self.output_ready || other.output_ready,
            access_error: self.access_error.or(other.access_error),
            device_reset: self.device_reset || other.device_reset,
        }
    }
}

/// Why a migrated state was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// The state is of another device type or queue count.
    Mismatch,
    /// A ready queue's configuration is invalid.
    Ring(RingError),
    /// A device-specific field is out of range.
    BadField(&'static str),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mismatch => f.write_str("device state of another device"),
            Self::Ring(e) => write!(f, "queue state refused: {e}"),
            Self::BadField(field) => write!(f, "device state field {field} out of range"),
        }
    }
}

impl core::error::Error for SnapshotError {}

/// The transport's whole state with its device's, as plain data.
#[derive(Clone, Debug, PartialEq)]
pub struct TransportState<S> {
    /// The device id (checked on restore).
    pub device_id: u32,
    /// `Status`.
    pub status: u8,
    /// The features the driver wrote.
    pub driver_features: u64,
    /// `DeviceFeaturesSel`.
    pub device_features_sel: u32,
    /// `DriverFeaturesSel`.
    pub driver_features_sel: u32,
    /// `QueueSel`.
    pub queue_sel: u32,
    /// `InterruptStatus`.
    pub interrupt_status: u32,
    /// `ConfigGeneration`.
    pub config_generation: u32,
    /// Each queue's state.
    pub queues: Vec<QueueState>,
    /// The device model's state.
    pub device: S,
}

/// One virtio-mmio device: its register file, its queues and its model.
pub struct MmioTransport<D: VirtioDevice> {
    device: D,
    queues: Vec<Virtqueue>,
    status: u8,
    driver_features: u64,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    interrupt_status: u32,
    config_generation: u32,
    ring_errors: u64,
    access_errors: u64,
}

impl<D: VirtioDevice> MmioTransport<D> {
    /// The transport of `device`, reset.
    pub fn new(device: D) -> Self {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| Virtqueue::new(max))
            .collect();
        Self {
            device,
            queues,
            status: 0,
            driver_features: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            interrupt_status: 0,
            config_generation: 0,
            ring_errors: 0,
            access_errors: 0,
        }
    }

    /// The device model.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device model, to change.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The queues.
    pub fn queues(&self) -> &[Virtqueue] {
        &self.queues
    }

    /// `Status`.
    pub fn status(&self) -> u8 {
        self.status
    }

    /// `InterruptStatus`.
    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status
    }

    /// The features offered to the driver.
    pub fn offered_features(&self) -> u64 {
        TRANSPORT_FEATURES | self.device.features()
    }

    /// The features the driver chose (meaningful after `FEATURES_OK`).
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// Whether the driver set `DRIVER_OK` and the device is not broken.
    pub fn is_live(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0 && self.status & STATUS_NEEDS_RESET == 0
    }

    /// Whether the device is in `DEVICE_NEEDS_RESET`.
    pub fn needs_reset(&self) -> bool {
        self.status & STATUS_NEEDS_RESET != 0
    }

    /// Ring errors seen since creation (each put the device in
    /// `DEVICE_NEEDS_RESET`).
    pub fn ring_errors(&self) -> u64 {
        self.ring_errors
    }

    /// Refused accesses since creation.
    pub fn access_errors(&self) -> u64 {
        self.access_errors
    }

    fn refuse(&mut self, offset: u64, size: u8, write: bool, kind: AccessErrorKind) -> AccessError {
        self.access_errors += 1;
        AccessError {
            offset,
            size,
            write,
            kind,
        }
    }

    /// A guest read of `size` bytes at `offset` in the window: the value,
    /// or why it reads as 0.
    pub fn read(&mut self, offset: u64, size: u8) -> Result<u64, AccessError> {
        if offset >= REG_CONFIG {
            if !matches!(size, 1 | 2 | 4) || !offset.is_multiple_of(u64::from(size)) {
                return Err(self.refuse(offset, size, false, AccessErrorKind::BadSize));
            }
            let mut buf = [0u8; 4];
            let data = buf.get_mut(..usize::from(size)).unwrap_or_default();
            self.device.read_config(offset - REG_CONFIG, data);
            return Ok(u64::from(u32::from_le_bytes(buf)));
        }
        if size != 4 || !offset.is_multiple_of(4) {
            return Err(self.refuse(offset, size, false, AccessErrorKind::BadSize));
        }
        let queue = self.queues.get(self.queue_sel as usize);
        let value = match offset {
            REG_MAGIC_VALUE => MAGIC_VALUE.to_ne(),
            REG_VERSION => 2,
            REG_DEVICE_ID => self.device.device_id(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.interrupt_status,
            REG_STATUS => u32::from(self.status),
            REG_CONFIG_GENERATION => self.config_generation,
            REG_DEVICE_FEATURES_SEL
            | REG_DRIVER_FEATURES
            | REG_DRIVER_FEATURES_SEL
            | REG_QUEUE_SEL
            | REG_QUEUE_NUM
            | REG_QUEUE_NOTIFY
            | REG_INTERRUPT_ACK
            | REG_QUEUE_DESC_LOW
            | REG_QUEUE_DESC_HIGH
            | REG_QUEUE_DRIVER_LOW
            | REG_QUEUE_DRIVER_HIGH
            | REG_QUEUE_DEVICE_LOW
            | REG_QUEUE_DEVICE_HIGH => {
                return Err(self.refuse(offset, size, false, AccessErrorKind::WriteOnly));
            }
            _ => return Err(self.refuse(offset, size, false, AccessErrorKind::NoRegister)),
        };
        Ok(u64::from(value))
    }

    /// A guest write of `size` bytes of `value` at `offset` in the window.
    pub fn write(&mut self, offset: u64, size: u8, value: u64, mem: &dyn GuestMemory) -> Effects {
        let mut effects = Effects::default();
        let refused = |this: &mut Self, kind| Effects {
            access_error: Some(this.refuse(offset, size, true, kind)),
            ..Effects::default()
        };
        if offset >= REG_CONFIG {
            if !matches!(size, 1 | 2 | 4) || !offset.is_multiple_of(u64::from(size)) {
                return refused(self, AccessErrorKind::BadSize);
            }
            let bytes = (value as u32).to_le_bytes();
            let data = bytes.get(..usize::from(size)).unwrap_or_default();
            if !self.device.write_config(offset - REG_CONFIG, data) {
                return refused(self, AccessErrorKind::ConfigReadOnly);
            }
            return effects;
        }
        if size != 4 || !offset.is_multiple_of(4) {
            return refused(self, AccessErrorKind::BadSize);
        }
        let value = value as u32;
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_DRIVER_FEATURES => {
                if self.status & STATUS_FEATURES_OK != 0 {
                    return refused(self, AccessErrorKind::FeaturesLocked);
                }
                match self.driver_features_sel {
                    0 => {
                        self.driver_features =
                            (self.driver_features & !0xffff_ffff) | u64::from(value)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                    }
                    _ if value == 0 => {}
                    _ => return refused(self, AccessErrorKind::FeaturesLocked),
                }
            }
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NUM
            | REG_QUEUE_DESC_LOW
            | REG_QUEUE_DESC_HIGH
            | REG_QUEUE_DRIVER_LOW
            | REG_QUEUE_DRIVER_HIGH
            | REG_QUEUE_DEVICE_LOW
            | REG_QUEUE_DEVICE_HIGH => {
                if let Err(kind) = self.queue_writable() {
                    return refused(self, kind);
                }
                let Some(queue) = self.queues.get_mut(self.queue_sel as usize) else {
                    return refused(self, AccessErrorKind::NoQueue);
                };
                let low = |old: u64| (old & !0xffff_ffff) | u64::from(value);
                let high = |old: u64| (old & 0xffff_ffff) | (u64::from(value) << 32);
                match offset {
                    REG_QUEUE_NUM => queue.set_size(value.try_into().unwrap_or(0)),
                    REG_QUEUE_DESC_LOW => queue.set_desc_table(low(queue.desc_table())),
                    REG_QUEUE_DESC_HIGH => queue.set_desc_table(high(queue.desc_table())),
                    REG_QUEUE_DRIVER_LOW => queue.set_avail_ring(low(queue.avail_ring())),
                    REG_QUEUE_DRIVER_HIGH => queue.set_avail_ring(high(queue.avail_ring())),
                    REG_QUEUE_DEVICE_LOW => queue.set_used_ring(low(queue.used_ring())),
                    _ => queue.set_used_ring(high(queue.used_ring())),
                }
            }
            REG_QUEUE_READY => {
                if value == 0 {
                    let Some(queue) = self.queues.get_mut(self.queue_sel as usize) else {
                        return refused(self, AccessErrorKind::NoQueue);
                    };
                    queue.disable();
                } else {
                    if let Err(kind) = self.queue_writable() {
                        return refused(self, kind);
                    }
                    let event_idx = self.driver_features & F_RING_EVENT_IDX != 0;
                    let indirect = self.driver_features & F_RING_INDIRECT_DESC != 0;
                    let Some(queue) = self.queues.get_mut(self.queue_sel as usize) else {
                        return refused(self, AccessErrorKind::NoQueue);
                    };
                    if let Err(e) = queue.enable(mem, event_idx, indirect) {
                        effects = self.enter_needs_reset(e);
                    }
                }
            }
            REG_QUEUE_NOTIFY => {
                let queue = value & 0xffff;
                if queue as usize >= self.queues.len() {
                    return refused(self, AccessErrorKind::NoQueue);
                }
                if self.is_live() {
                    effects = self.run(mem, |device, ctx| device.queue_notify(queue as u16, ctx));
                }
            }
            REG_INTERRUPT_ACK => self.interrupt_status &= !value,
            REG_STATUS => effects = self.write_status(value, mem),
            REG_MAGIC_VALUE
            | REG_VERSION
            | REG_DEVICE_ID
            | REG_VENDOR_ID
            | REG_DEVICE_FEATURES
            | REG_QUEUE_NUM_MAX
            | REG_INTERRUPT_STATUS
            | REG_CONFIG_GENERATION => return refused(self, AccessErrorKind::ReadOnly),
            _ => return refused(self, AccessErrorKind::NoRegister),
        }
        effects
    }

    /// Whether the selected queue's registers may be written now (see the
    /// module doc).
    fn queue_writable(&self) -> Result<(), AccessErrorKind> {
        let queue = self
            .queues
            .get(self.queue_sel as usize)
            .ok_or(AccessErrorKind::NoQueue)?;
        let s = self.status;
        if queue.ready()
            || s & STATUS_FEATURES_OK == 0
            || s & (STATUS_DRIVER_OK | STATUS_NEEDS_RESET) != 0
        {
            return Err(AccessErrorKind::QueueLocked);
        }
        Ok(())
    }

    fn write_status(&mut self, value: u32, mem: &dyn GuestMemory) -> Effects {
        let refused = |this: &mut Self, kind| Effects {
            access_error: Some(this.refuse(REG_STATUS, 4, true, kind)),
            ..Effects::default()
        };
        if value == 0 {
            self.reset();
            return Effects {
                device_reset: true,
                ..Effects::default()
            };
        }
        let Ok(value) = u8::try_from(value) else {
            return refused(self, AccessErrorKind::BadStatus);
        };
        let old = self.status & !STATUS_NEEDS_RESET;
        let mut new = value & !STATUS_NEEDS_RESET;
        let added = new & !old;
        let has = |bit: u8| new & bit != 0;
        if new & !STATUS_DRIVER_BITS != 0
            || new & old != old
            || (added & STATUS_DRIVER != 0 && !has(STATUS_ACKNOWLEDGE))
            || (added & STATUS_FEATURES_OK != 0 && !has(STATUS_DRIVER))
            || (added & STATUS_DRIVER_OK != 0 && !has(STATUS_FEATURES_OK))
        {
            return refused(self, AccessErrorKind::BadStatus);
        }
        let mut effects = Effects::default();
        if added & STATUS_FEATURES_OK != 0 {
            let offer = self.offered_features();
            if self.driver_features & !offer != 0 || self.driver_features & F_VERSION_1 == 0 {
                new &= !(STATUS_FEATURES_OK | STATUS_DRIVER_OK);
                effects.access_error =
                    Some(self.refuse(REG_STATUS, 4, true, AccessErrorKind::FeaturesRefused));
            }
        }
        self.status = new | (self.status & STATUS_NEEDS_RESET);
        if added & STATUS_DRIVER_OK != 0 && new & STATUS_DRIVER_OK != 0 && !self.needs_reset() {
            let features = self.driver_features;
            effects = effects.merge(self.run(mem, |device, ctx| device.activate(features, ctx)));
        }
        effects
    }

    /// Back to the power-on state (the driver wrote 0 to `Status`).
    pub fn reset(&mut self) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.status = 0;
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.interrupt_status = 0;
    }

    /// Puts the device in `DEVICE_NEEDS_RESET` because of `error`.
    fn enter_needs_reset(&mut self, error: RingError) -> Effects {
        let mut effects = Effects::default();
        if self.needs_reset() {
            return effects;
        }
        self.ring_errors += 1;
        self.status |= STATUS_NEEDS_RESET;
        effects.needs_reset = Some(error);
        if self.status & STATUS_DRIVER_OK != 0 {
            self.interrupt_status |= INT_CONFIG_CHANGE;
            self.config_generation = self.config_generation.wrapping_add(1);
            effects.interrupt = true;
        }
        effects
    }

    /// Runs the device with its queues (`f`), then decides the interrupt,
    /// turning a ring error into `DEVICE_NEEDS_RESET`. The device-specific
    /// calls of the device modules (console input, net delivery, ...) go
    /// through here. Does nothing unless the device is live.
    pub fn run<R>(
        &mut self,
        mem: &dyn GuestMemory,
        f: impl FnOnce(&mut D, &mut QueueContext<'_>) -> Result<R, RingError>,
    ) -> Effects {
        self.run_for(mem, f).1
    }

    /// [`Self::run`], also returning `f`'s result (`None` when the device
    /// was not live or `f` failed).
    pub fn run_for<R>(
        &mut self,
        mem: &dyn GuestMemory,
        f: impl FnOnce(&mut D, &mut QueueContext<'_>) -> Result<R, RingError>,
    ) -> (Option<R>, Effects) {
        if !self.is_live() {
            return (None, Effects::default());
        }
        let mut ctx = QueueContext {
            queues: &mut self.queues,
            mem,
            output_ready: false,
        };
        let result = f(&mut self.device, &mut ctx);
        let output_ready = ctx.output_ready;
        let mut interrupt = false;
        let mut ring_error = result.as_ref().err().copied();
        for q in &mut self.queues {
            if !q.ready() {
                continue;
            }
            match q.needs_interrupt(mem) {
                Ok(wants) => interrupt |= wants,
                Err(e) => {
                    ring_error.get_or_insert(e);
                }
            }
        }
        let mut effects = Effects {
            output_ready,
            ..Effects::default()
        };
        if interrupt {
            self.interrupt_status |= INT_USED_BUFFER;
            effects.interrupt = true;
        }
        if let Some(e) = ring_error {
            effects = effects.merge(self.enter_needs_reset(e));
        }
        (result.ok(), effects)
    }

    /// The whole state for migration.
    pub fn snapshot(&self) -> TransportState<D::State> {
        TransportState {
            device_id: self.device.device_id(),
            status: self.status,
            driver_features: self.driver_features,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status,
            config_generation: self.config_generation,
            queues: self.queues.iter().map(Virtqueue::state).collect(),
            device: self.device.snapshot(),
        }
    }

    /// Takes over a migrated state (on a transport made for the same
    /// device). Nothing changes when it is refused.
    pub fn restore(&mut self, state: &TransportState<D::State>) -> Result<(), SnapshotError> {
        if state.device_id != self.device.device_id() || state.queues.len() != self.queues.len() {
            return Err(SnapshotError::Mismatch);
        }
        let event_idx = state.driver_features & F_RING_EVENT_IDX != 0;
        let indirect = state.driver_features & F_RING_INDIRECT_DESC != 0;
        let mut queues = self.queues.clone();
        for (q, s) in queues.iter_mut().zip(&state.queues) {
            q.restore(*s, event_idx, indirect)
                .map_err(SnapshotError::Ring)?;
        }
        self.device.restore(&state.device)?;
        self.queues = queues;
        self.status = state.status;
        self.driver_features = state.driver_features;
        self.device_features_sel = state.device_features_sel;
        self.driver_features_sel = state.driver_features_sel;
        self.queue_sel = state.queue_sel;
        self.interrupt_status = state.interrupt_status;
        self.config_generation = state.config_generation;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::console::Console;
    use super::super::fake_guest::{DEVICE_WINDOW, DriverQueue, FakeMemory, SLOT_A, bring_up};
    use super::super::virtqueue::DESC_F_NEXT;
    use super::*;
    use proptest::prelude::*;

    fn queues() -> [DriverQueue; 2] {
        [
            DriverQueue::new(16, SLOT_A.0),
            DriverQueue::new(16, SLOT_A.0 + 0x1_0000),
        ]
    }

    fn console() -> MmioTransport<Console> {
        MmioTransport::new(Console::new())
    }

    #[test]
    fn config_bytes_are_copied_from_the_offset_and_zero_past_the_end() {
        let config = [1, 2, 3, 4, 5, 6];
        let mut data = [0xff; 4];
        read_config_bytes(&config, 0, &mut data);
        assert_eq!(data, [1, 2, 3, 4]);
        read_config_bytes(&config, 2, &mut data[..2]);
        assert_eq!(data, [3, 4, 3, 4]);
        data = [0xff; 4];
        read_config_bytes(&config, 4, &mut data);
        assert_eq!(data, [5, 6, 0, 0]);
        for offset in [6, 7, 0x100, u64::MAX] {
            data = [0xff; 4];
            read_config_bytes(&config, offset, &mut data);
            assert_eq!(data, [0; 4], "offset {offset:#x}");
        }
        data = [0xff; 4];
        read_config_bytes(&[], 0, &mut data);
        assert_eq!(data, [0; 4]);
        read_config_bytes(&config, 1, &mut []);
    }

    #[test]
    fn identity_registers_read_as_the_spec_says() {
        let mut t = console();
        assert_eq!(t.read(REG_MAGIC_VALUE, 4), Ok(0x7472_6976));
        assert_eq!(t.read(REG_VERSION, 4), Ok(2));
        assert_eq!(t.read(REG_DEVICE_ID, 4), Ok(3));
        assert_eq!(t.read(REG_VENDOR_ID, 4), Ok(u64::from(VENDOR_ID)));
        let mem = FakeMemory::new();
        assert_eq!(
            t.write(REG_DEVICE_FEATURES_SEL, 4, 1, &mem),
            Effects::default()
        );
        assert_eq!(t.read(REG_DEVICE_FEATURES, 4), Ok(1)); // VERSION_1 is bit 32
        let _ = t.write(REG_DEVICE_FEATURES_SEL, 4, 0, &mem);
        assert_eq!(t.read(REG_DEVICE_FEATURES, 4), Ok(3 << 28)); // INDIRECT_DESC, EVENT_IDX
        let _ = t.write(REG_DEVICE_FEATURES_SEL, 4, 2, &mem);
        assert_eq!(t.read(REG_DEVICE_FEATURES, 4), Ok(0));
        let _ = t.write(REG_QUEUE_SEL, 4, 1, &mem);
        assert_eq!(t.read(REG_QUEUE_NUM_MAX, 4), Ok(64));
        let _ = t.write(REG_QUEUE_SEL, 4, 2, &mem);
        assert_eq!(t.read(REG_QUEUE_NUM_MAX, 4), Ok(0));
    }

    #[test]
    fn wrong_sizes_offsets_and_directions_are_refused_safely() {
        let mut t = console();
        let mem = FakeMemory::new();
        let kind = |r: Result<u64, AccessError>| r.unwrap_err().kind;
        assert_eq!(kind(t.read(REG_STATUS, 2)), AccessErrorKind::BadSize);
        assert_eq!(kind(t.read(REG_STATUS + 1, 4)), AccessErrorKind::BadSize);
        assert_eq!(kind(t.read(0x0b0, 4)), AccessErrorKind::NoRegister);
        assert_eq!(
            kind(t.read(REG_QUEUE_NOTIFY, 4)),
            AccessErrorKind::WriteOnly
        );
        assert_eq!(kind(t.read(REG_CONFIG + 2, 4)), AccessErrorKind::BadSize);
        assert_eq!(kind(t.read(REG_CONFIG, 8)), AccessErrorKind::BadSize);
        assert_eq!(t.read(REG_CONFIG + 3, 1), Ok(0));
        assert_eq!(t.read(0x1fc, 4), Ok(0));
        let e = t.write(REG_MAGIC_VALUE, 4, 0, &mem);
        assert_eq!(
            e.access_error.map(|a| a.kind),
            Some(AccessErrorKind::ReadOnly)
        );
        let e = t.write(REG_STATUS, 1, 1, &mem);
        assert_eq!(
            e.access_error.map(|a| a.kind),
            Some(AccessErrorKind::BadSize)
        );
        assert_eq!(t.status(), 0);
        let e = t.write(REG_CONFIG, 4, 1, &mem);
        assert_eq!(
            e.access_error.map(|a| a.kind),
            Some(AccessErrorKind::ConfigReadOnly)
        );
        assert_eq!(t.access_errors(), 9);
    }

    #[test]
    fn features_ok_needs_version_1_and_a_subset_of_the_offer() {
        let mem = FakeMemory::new();
        for (features, accepted) in [
            (F_VERSION_1, true),
            (F_VERSION_1 | F_RING_EVENT_IDX | F_RING_INDIRECT_DESC, true),
            (F_RING_EVENT_IDX, false),
            (F_VERSION_1 | 1, false),
            (F_VERSION_1 | 1 << 40, false),
        ] {
            let mut t = console();
            let _ = t.write(REG_STATUS, 4, 1, &mem);
            let _ = t.write(REG_STATUS, 4, 3, &mem);
            let _ = t.write(REG_DRIVER_FEATURES, 4, features & 0xffff_ffff, &mem);
            let _ = t.write(REG_DRIVER_FEATURES_SEL, 4, 1, &mem);
            let _ = t.write(REG_DRIVER_FEATURES, 4, features >> 32, &mem);
            let e = t.write(REG_STATUS, 4, 11, &mem);
            assert_eq!(
                t.read(REG_STATUS, 4),
                Ok(if accepted { 11 } else { 3 }),
                "{features:#x}"
            );
            assert_eq!(e.access_error.is_some(), !accepted);
            if accepted {
                let e = t.write(REG_DRIVER_FEATURES, 4, 0, &mem);
                assert_eq!(
                    e.access_error.map(|a| a.kind),
                    Some(AccessErrorKind::FeaturesLocked)
                );
                assert_eq!(t.driver_features(), features);
            }
        }
    }

    #[test]
    fn queue_registers_are_writable_only_between_features_ok_and_ready() {
        let mem = FakeMemory::new();
        let mut t = console();
        let locked =
            |e: Effects| e.access_error.map(|a| a.kind) == Some(AccessErrorKind::QueueLocked);
        assert!(locked(t.write(REG_QUEUE_NUM, 4, 8, &mem)));
        let _ = t.write(REG_STATUS, 4, 1, &mem);
        let _ = t.write(REG_STATUS, 4, 3, &mem);
        assert!(locked(t.write(REG_QUEUE_NUM, 4, 8, &mem)));
        let _ = t.write(REG_DRIVER_FEATURES_SEL, 4, 1, &mem);
        let _ = t.write(REG_DRIVER_FEATURES, 4, 1, &mem);
        let _ = t.write(REG_STATUS, 4, 11, &mem);
        let q = DriverQueue::new(16, SLOT_A.0);
        for (reg, v) in [
            (REG_QUEUE_NUM, 16),
            (REG_QUEUE_DESC_LOW, q.desc),
            (REG_QUEUE_DRIVER_LOW, q.avail),
            (REG_QUEUE_DEVICE_LOW, q.used),
        ] {
            assert_eq!(t.write(reg, 4, v, &mem), Effects::default());
        }
        assert_eq!(t.write(REG_QUEUE_READY, 4, 1, &mem), Effects::default());
        assert_eq!(t.read(REG_QUEUE_READY, 4), Ok(1));
        assert!(locked(t.write(REG_QUEUE_DESC_LOW, 4, 0, &mem)));
        assert_eq!(t.queues()[0].desc_table(), q.desc);
        // Another queue is still free; after DRIVER_OK none is.
        let _ = t.write(REG_QUEUE_SEL, 4, 1, &mem);
        assert_eq!(t.write(REG_QUEUE_NUM, 4, 16, &mem), Effects::default());
        let _ = t.write(REG_STATUS, 4, 15, &mem);
        assert!(locked(t.write(REG_QUEUE_NUM, 4, 8, &mem)));
        // No such queue.
        let _ = t.write(REG_QUEUE_SEL, 4, 5, &mem);
        let e = t.write(REG_QUEUE_NOTIFY, 4, 5, &mem);
        assert_eq!(
            e.access_error.map(|a| a.kind),
            Some(AccessErrorKind::NoQueue)
        );
        // QueueReady = 0 is always accepted.
        let _ = t.write(REG_QUEUE_SEL, 4, 0, &mem);
        assert_eq!(t.write(REG_QUEUE_READY, 4, 0, &mem), Effects::default());
        assert_eq!(t.read(REG_QUEUE_READY, 4), Ok(0));
    }

    #[test]
    fn a_ring_in_a_device_window_puts_the_device_in_needs_reset() {
        let mem = FakeMemory::new();
        let mut t = console();
        let _ = t.write(REG_STATUS, 4, 1, &mem);
        let _ = t.write(REG_STATUS, 4, 3, &mem);
        let _ = t.write(REG_DRIVER_FEATURES_SEL, 4, 1, &mem);
        let _ = t.write(REG_DRIVER_FEATURES, 4, 1, &mem);
        let _ = t.write(REG_STATUS, 4, 11, &mem);
        let _ = t.write(REG_QUEUE_NUM, 4, 16, &mem);
        let _ = t.write(REG_QUEUE_DESC_LOW, 4, DEVICE_WINDOW, &mem);
        let e = t.write(REG_QUEUE_READY, 4, 1, &mem);
        assert!(matches!(e.needs_reset, Some(RingError::Memory(_))));
        // Before DRIVER_OK: no configuration-change notification.
        assert!(!e.interrupt);
        assert_eq!(t.read(REG_STATUS, 4), Ok(11 | 64));
        assert_eq!(t.read(REG_QUEUE_READY, 4), Ok(0));
    }

    #[test]
    fn a_broken_chain_sets_needs_reset_once_raises_config_change_and_reset_clears_it() {
        let mem = FakeMemory::new();
        let mut t = console();
        let mut qs = queues();
        let e = bring_up(&mut t, &mem, None, &qs);
        assert_eq!(e, Effects::default());
        assert!(t.is_live());
        // A transmit chain that loops.
        qs[1].write_desc(&mem, 0, SLOT_A.0 + 0x4_0000, 4, DESC_F_NEXT, 0);
        qs[1].publish(&mem, 0);
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert_eq!(e.needs_reset, Some(RingError::ChainTooLong));
        assert!(e.interrupt);
        assert_eq!(t.read(REG_INTERRUPT_STATUS, 4), Ok(2));
        assert_eq!(t.read(REG_STATUS, 4), Ok(15 | 64));
        assert_eq!(t.read(REG_CONFIG_GENERATION, 4), Ok(1));
        // Further notifies do nothing and report nothing.
        assert_eq!(t.write(REG_QUEUE_NOTIFY, 4, 1, &mem), Effects::default());
        // The driver cannot clear the bit, only reset.
        let e = t.write(REG_STATUS, 4, 15, &mem);
        assert_eq!(e.access_error, None);
        assert!(t.needs_reset());
        let _ = t.write(REG_INTERRUPT_ACK, 4, 2, &mem);
        assert_eq!(t.interrupt_status(), 0);
        let e = t.write(REG_STATUS, 4, 0, &mem);
        assert!(e.device_reset);
        assert_eq!(t.read(REG_STATUS, 4), Ok(0));
        assert_eq!(t.read(REG_QUEUE_READY, 4), Ok(0));
        assert_eq!(t.driver_features(), 0);
        assert_eq!(t.ring_errors(), 1);
        // And it comes up again.
        let qs = queues();
        mem.poke(SLOT_A.0, &[0u8; 0x2_0000]);
        let _ = bring_up(&mut t, &mem, None, &qs);
        assert!(t.is_live());
    }

    #[test]
    fn a_snapshot_restores_into_a_fresh_transport() {
        let mem = FakeMemory::new();
        let mut t = console();
        let qs = queues();
        let _ = bring_up(&mut t, &mem, None, &qs);
        let _ = t.console_input(b"abc", &mem);
        let state = t.snapshot();
        let mut copy = console();
        copy.restore(&state).unwrap();
        assert_eq!(copy.snapshot(), state);
        assert!(copy.is_live());
        let mut bad = state.clone();
        bad.device_id = 1;
        assert_eq!(console().restore(&bad), Err(SnapshotError::Mismatch));
        let mut bad = state.clone();
        bad.queues[0].desc_table += 8;
        let mut fresh = console();
        assert!(matches!(fresh.restore(&bad), Err(SnapshotError::Ring(_))));
        assert_eq!(fresh.status(), 0);
    }

    /// The transports the runtime shares between CPUs must be `Send`, the
    /// switch `Sync`.
    #[test]
    fn thread_safety_holds() {
        fn send<T: Send>() {}
        fn sync<T: Send + Sync>() {}
        send::<MmioTransport<Console>>();
        send::<MmioTransport<super::super::net::Net>>();
        send::<MmioTransport<super::super::blk::Blk>>();
        sync::<super::super::net_switch::NetSwitch>();
    }

    /// The statuses the sequence allows, without FAILED: each a prefix of
    /// ACKNOWLEDGE, DRIVER, FEATURES_OK, DRIVER_OK.
    const PREFIXES: [u8; 5] = [0, 1, 3, 11, 15];

    proptest! {
        /// Random status and feature writes against a reference: the
        /// status is always a prefix of the sequence (plus FAILED), grows
        /// only, FEATURES_OK only with valid features, 0 resets.
        #[test]
        fn status_writes_follow_the_sequence(
            steps in proptest::collection::vec(
                prop_oneof![
                    prop_oneof![Just(0u32), Just(1), Just(3), Just(11), Just(15), Just(128), Just(0x83), Just(64), Just(7), Just(9), Just(16), Just(0x1ff), any::<u8>().prop_map(u32::from)]
                        .prop_map(|v| (REG_STATUS, v)),
                    prop_oneof![Just(0u32), Just(1), Just(1 << 28 | 1 << 29), any::<u32>()]
                        .prop_map(|v| (REG_DRIVER_FEATURES, v)),
                    (0u32..3).prop_map(|v| (REG_DRIVER_FEATURES_SEL, v)),
                ],
                1..40),
        ) {
            let mem = FakeMemory::new();
            let mut t = console();
            let offer = t.offered_features();
            let (mut status, mut features, mut sel) = (0u8, 0u64, 0u32);
            for (reg, v) in steps {
                let _ = t.write(reg, 4, u64::from(v), &mem);
                match reg {
                    REG_DRIVER_FEATURES_SEL => sel = v,
                    REG_DRIVER_FEATURES if status & 8 == 0 => match sel {
                        0 => features = (features & !0xffff_ffff) | u64::from(v),
                        1 => features = (features & 0xffff_ffff) | u64::from(v) << 32,
                        _ => {}
                    },
                    REG_STATUS if v == 0 => (status, features, sel) = (0, 0, 0),
                    REG_STATUS => {
                        let wanted = v as u8 & !64;
                        let accepted = v <= 0xff
                            && PREFIXES.contains(&(wanted & !128))
                            && wanted & status == status;
                        if accepted {
                            let valid = features & !offer == 0 && features & F_VERSION_1 != 0;
                            status = if wanted & 8 != 0 && status & 8 == 0 && !valid {
                                wanted & !(8 | 4)
                            } else {
                                wanted
                            };
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(t.read(REG_STATUS, 4), Ok(u64::from(status)));
                prop_assert!(PREFIXES.contains(&(t.status() & !128)));
            }
        }
    }
}
