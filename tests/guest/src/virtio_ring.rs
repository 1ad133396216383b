//! The pure half of the guest's virtio-mmio driver: register offsets and
//! bits, the split-ring layout (descriptor table, available ring, used
//! ring) inside one region, descriptor encoding, and the model of what a
//! device must do with a chain the guest hands it ([`judge_chain`]).
//!
//! # Layout
//!
//! A queue of `N` entries takes, from a 16-byte aligned base: the descriptor
//! table (`16 N` bytes), the available ring (`flags`, `idx`, `ring[N]`,
//! `used_event`: `6 + 2 N` bytes) and, 4-byte aligned after it, the used
//! ring (`flags`, `idx`, `N` elements of `id` and `len`, `avail_event`:
//! `6 + 8 N` bytes). Everything is little-endian.
//!
//! # What a device must do with a chain
//!
//! [`judge_chain`] walks a chain the way the virtio 1.x specification
//! bounds it and says what the device must answer:
//!
//! - [`Verdict::Deliver`]: a well-formed chain whose readable bytes all lie
//!   in RAM: the device takes it and returns it on the used ring;
//! - [`Verdict::Reset`]: a chain the device must refuse by entering
//!   `DEVICE_NEEDS_RESET`: a head or `next` outside its table, more
//!   descriptors than the queue size (a loop, or too long), an indirect
//!   descriptor without the feature, with `NEXT`, inside an indirect table,
//!   or with a length that is zero, not a multiple of 16 or more than the
//!   queue size; a descriptor table or indirect table outside RAM; a
//!   readable buffer after a writable one; more than 4 GiB in total; a
//!   readable buffer whose first byte is outside RAM;
//! - [`Verdict::Either`]: a chain a device may serve or refuse (a readable
//!   buffer that starts in RAM and runs out of it, of which a device may
//!   read only a prefix; a buffer the console never reads that lies outside
//!   RAM).
//!
//! The walk counts every descriptor read, the indirect one included, so a
//! loop ends after at most `N + 1` reads. Pure code, tested on the host.
//!
//! # What comes from the `virtio-spec` crate
//!
//! The values of the status, feature, interrupt and descriptor bits and
//! the magic value (named here as the driver code uses them); the
//! console's device id is checked against it. The register offsets and
//! the ring layout are written out:
//! the crate describes the register file and the rings as volatile structs
//! to access in place, not as offsets to compute addresses with.

use virtio_spec::mmio::{InterruptStatus, MAGIC_VALUE};
use virtio_spec::virtq::DescF;
use virtio_spec::{DeviceStatus, F};

/// `MagicValue`: "virt".
pub const MAGIC: u32 = MAGIC_VALUE.to_ne();
/// virtio-mmio registers (offsets in the window).
pub const REG_MAGIC: u64 = 0x000;
/// `Version` (2 for virtio 1.x).
pub const REG_VERSION: u64 = 0x004;
/// `DeviceID`.
pub const REG_DEVICE_ID: u64 = 0x008;
/// `VendorID`.
pub const REG_VENDOR_ID: u64 = 0x00c;
/// `DeviceFeatures`.
pub const REG_DEVICE_FEATURES: u64 = 0x010;
/// `DeviceFeaturesSel`.
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
/// `DriverFeatures`.
pub const REG_DRIVER_FEATURES: u64 = 0x020;
/// `DriverFeaturesSel`.
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
/// `QueueSel`.
pub const REG_QUEUE_SEL: u64 = 0x030;
/// `QueueNumMax`.
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
/// `QueueNum`.
pub const REG_QUEUE_NUM: u64 = 0x038;
/// `QueueReady`.
pub const REG_QUEUE_READY: u64 = 0x044;
/// `QueueNotify`.
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
/// `InterruptStatus`.
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
/// `InterruptACK`.
pub const REG_INTERRUPT_ACK: u64 = 0x064;
/// `Status`.
pub const REG_STATUS: u64 = 0x070;
/// `QueueDescLow` (`High` at +4).
pub const REG_QUEUE_DESC: u64 = 0x080;
/// `QueueDriverLow` (`High` at +4).
pub const REG_QUEUE_DRIVER: u64 = 0x090;
/// `QueueDeviceLow` (`High` at +4).
pub const REG_QUEUE_DEVICE: u64 = 0x0a0;
/// `ConfigGeneration`.
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
/// The device configuration.
pub const REG_CONFIG: u64 = 0x100;
/// Size of a device's register window.
pub const WINDOW_SIZE: u64 = 0x200;

/// Registers the driver may only read: (offset, name).
pub const READ_ONLY_REGISTERS: [(u64, &str); 8] = [
    (REG_MAGIC, "MagicValue"),
    (REG_VERSION, "Version"),
    (REG_DEVICE_ID, "DeviceID"),
    (REG_VENDOR_ID, "VendorID"),
    (REG_DEVICE_FEATURES, "DeviceFeatures"),
    (REG_QUEUE_NUM_MAX, "QueueNumMax"),
    (REG_INTERRUPT_STATUS, "InterruptStatus"),
    (REG_CONFIG_GENERATION, "ConfigGeneration"),
];

/// `Status` bits.
pub const STATUS_ACKNOWLEDGE: u32 = status(DeviceStatus::ACKNOWLEDGE);
/// The driver knows the device.
pub const STATUS_DRIVER: u32 = status(DeviceStatus::DRIVER);
/// The driver is ready.
pub const STATUS_DRIVER_OK: u32 = status(DeviceStatus::DRIVER_OK);
/// Feature negotiation is done.
pub const STATUS_FEATURES_OK: u32 = status(DeviceStatus::FEATURES_OK);
/// The device hit an error it cannot recover from without a reset.
pub const STATUS_NEEDS_RESET: u32 = status(DeviceStatus::DEVICE_NEEDS_RESET);
/// The driver gave up.
pub const STATUS_FAILED: u32 = status(DeviceStatus::FAILED);

/// `InterruptStatus` bits: a used buffer, a configuration change.
pub const INTERRUPT_USED_BUFFER: u32 = InterruptStatus::USED_BUFFER_NOTIFICATION.bits() as u32;
/// The configuration changed (or the device needs a reset).
pub const INTERRUPT_CONFIG_CHANGE: u32 =
    InterruptStatus::CONFIGURATION_CHANGE_NOTIFICATION.bits() as u32;

/// `VIRTIO_F_RING_INDIRECT_DESC`.
pub const F_INDIRECT_DESC: u64 = feature(F::INDIRECT_DESC);
/// `VIRTIO_F_RING_EVENT_IDX`.
pub const F_EVENT_IDX: u64 = feature(F::EVENT_IDX);
/// `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = feature(F::VERSION_1);
/// `VIRTIO_F_ACCESS_PLATFORM` (never offered by the hypervisor).
pub const F_ACCESS_PLATFORM: u64 = feature(F::ACCESS_PLATFORM);

/// Device ids. Written out: the crate's `virtio_spec::Id` converts only
/// at run time (a non-exhaustive enum of another crate casts to no integer
/// in a constant); a test holds the number to it.
pub const DEVICE_ID_CONSOLE: u32 = 3;

/// virtio-console queues: receive, transmit.
pub const CONSOLE_RECEIVE_QUEUE: u32 = 0;
/// The console's transmit queue.
pub const CONSOLE_TRANSMIT_QUEUE: u32 = 1;

/// Descriptor flags.
pub const DESC_F_NEXT: u16 = DescF::NEXT.bits().to_ne();
/// The device writes the buffer.
pub const DESC_F_WRITE: u16 = DescF::WRITE.bits().to_ne();
/// The buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = DescF::INDIRECT.bits().to_ne();

/// A `Status` bit as the 32-bit register holds it.
const fn status(bit: DeviceStatus) -> u32 {
    bit.bits() as u32
}

/// The low 64 bits (all a virtio-mmio driver selects) of one of the
/// crate's 128-bit feature masks.
const fn feature(bits: F) -> u64 {
    bits.bits().to_ne() as u64
}

/// Bytes per descriptor.
pub const DESCRIPTOR_SIZE: u64 = 16;

/// One split-ring descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Buffer address (guest-physical).
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// `DESC_F_*` bits.
    pub flags: u16,
    /// The next descriptor when `NEXT` is set.
    pub next: u16,
}

impl Descriptor {
    /// A device-readable buffer, last of its chain.
    pub const fn readable(addr: u64, len: u32) -> Descriptor {
        Descriptor {
            addr,
            len,
            flags: 0,
            next: 0,
        }
    }

    /// The same descriptor continuing at `next`.
    pub const fn then(self, next: u16) -> Descriptor {
        Descriptor {
            flags: self.flags | DESC_F_NEXT,
            next,
            ..self
        }
    }

    /// Its 16 bytes as they lie in a table.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..14].copy_from_slice(&self.flags.to_le_bytes());
        out[14..].copy_from_slice(&self.next.to_le_bytes());
        out
    }

    /// The descriptor in 16 bytes of a table.
    pub fn from_bytes(bytes: [u8; 16]) -> Descriptor {
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
        ] = bytes;
        Descriptor {
            addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            len: u32::from_le_bytes([l0, l1, l2, l3]),
            flags: u16::from_le_bytes([f0, f1]),
            next: u16::from_le_bytes([n0, n1]),
        }
    }
}

/// Where a queue of `size` entries keeps its three areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    /// Entries (a power of two).
    pub size: u16,
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
}

impl QueueLayout {
    /// The three areas packed from `base` (16-byte aligned).
    pub fn packed(base: u64, size: u16) -> QueueLayout {
        let n = u64::from(size);
        let avail = base + DESCRIPTOR_SIZE * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        QueueLayout {
            size,
            desc: base,
            avail,
            used,
        }
    }

    /// Bytes from the descriptor table to the end of the used ring.
    pub fn span(&self) -> u64 {
        self.used + 6 + 8 * u64::from(self.size) - self.desc
    }

    /// Address of descriptor `index`.
    pub fn descriptor(&self, index: u16) -> u64 {
        self.desc + DESCRIPTOR_SIZE * u64::from(index)
    }

    /// Address of the available ring's `idx`.
    pub fn avail_idx(&self) -> u64 {
        self.avail + 2
    }

    /// Address of the available ring's entry for index `idx`.
    pub fn avail_entry(&self, idx: u16) -> u64 {
        self.avail + 4 + 2 * u64::from(idx % self.size)
    }

    /// Address of the used ring's `idx`.
    pub fn used_idx(&self) -> u64 {
        self.used + 2
    }

    /// Address of the used element for index `idx` (`id` le32, `len` le32).
    pub fn used_entry(&self, idx: u16) -> u64 {
        self.used + 4 + 8 * u64::from(idx % self.size)
    }
}

/// What a device must do with a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take it and return it on the used ring.
    Deliver {
        /// Readable bytes of the chain (what a console prints).
        readable: u64,
    },
    /// Enter `DEVICE_NEEDS_RESET`, for this reason.
    Reset(&'static str),
    /// Either is correct.
    Either(&'static str),
}

/// The device's rules for one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRules {
    /// The queue's size.
    pub size: u16,
    /// Whether `RING_INDIRECT_DESC` was negotiated.
    pub indirect: bool,
    /// How many readable bytes of one chain the device reads at most (the
    /// console keeps 64 KiB); beyond them a buffer outside RAM may go
    /// unnoticed.
    pub read_limit: u64,
}

/// Judges the chain at `head` (see the module doc). `descriptor(table,
/// index)` reads a descriptor of the table at `table` (`None`: that entry
/// is not in RAM); `in_ram(addr, len)` says whether `len` bytes at `addr`
/// are RAM.
pub fn judge_chain(
    rules: QueueRules,
    desc_table: u64,
    head: u16,
    descriptor: impl Fn(u64, u16) -> Option<Descriptor>,
    in_ram: impl Fn(u64, u64) -> bool,
) -> Verdict {
    let size = rules.size;
    if head >= size {
        return Verdict::Reset("head outside the table");
    }
    let (mut table, mut table_len, mut index) = (desc_table, u32::from(size), head);
    let mut in_indirect = false;
    let (mut walked, mut readable, mut total) = (0u32, 0u64, 0u64);
    let mut seen_writable = false;
    let mut either: Option<&'static str> = None;
    loop {
        walked += 1;
        if walked > u32::from(size) {
            return Verdict::Reset("chain longer than the queue");
        }
        let Some(d) = descriptor(table, index) else {
            return Verdict::Reset("descriptor table outside RAM");
        };
        if d.flags & DESC_F_INDIRECT != 0 {
            if !rules.indirect {
                return Verdict::Reset("indirect without the feature");
            }
            if in_indirect {
                return Verdict::Reset("indirect inside an indirect table");
            }
            if d.flags & DESC_F_NEXT != 0 {
                return Verdict::Reset("indirect with NEXT");
            }
            let len = u64::from(d.len);
            if len == 0 || len % DESCRIPTOR_SIZE != 0 || len / DESCRIPTOR_SIZE > u64::from(size) {
                return Verdict::Reset("bad indirect table length");
            }
            table = d.addr;
            table_len = (len / DESCRIPTOR_SIZE) as u32;
            in_indirect = true;
            index = 0;
            continue;
        }
        let writable = d.flags & DESC_F_WRITE != 0;
        let len = u64::from(d.len);
        if len != 0 {
            if !writable && seen_writable {
                return Verdict::Reset("readable after writable");
            }
            total += len;
            if total > u64::from(u32::MAX) {
                return Verdict::Reset("chain above 4 GiB");
            }
            if writable {
                seen_writable = true;
                if !in_ram(d.addr, len) {
                    either.get_or_insert("writable buffer outside RAM");
                }
            } else {
                let read = len.min(rules.read_limit.saturating_sub(readable));
                if read > 0 && !in_ram(d.addr, 1) {
                    return Verdict::Reset("readable buffer outside RAM");
                }
                if !in_ram(d.addr, len) {
                    either.get_or_insert("readable buffer running out of RAM");
                }
                readable += len;
            }
        } else if !in_ram(d.addr, 1) {
            either.get_or_insert("empty buffer outside RAM");
        }
        if d.flags & DESC_F_NEXT == 0 {
            break;
        }
        if u32::from(d.next) >= table_len {
            return Verdict::Reset("next outside the table");
        }
        index = d.next;
    }
    match either {
        Some(why) => Verdict::Either(why),
        None => Verdict::Deliver { readable },
    }
}

/// FNV-1a over `bytes`: the check word of a line the guest sends through
/// the console, so the test can tell a line that came out whole.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash = 0x811c_9dc5u32;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const RAM: (u64, u64) = (0x4000_0000, 0x4800_0000);
    const TABLE: u64 = 0x4010_0000;
    const INDIRECT: u64 = 0x4020_0000;
    const BUF: u64 = 0x4030_0000;

    fn in_ram(addr: u64, len: u64) -> bool {
        addr >= RAM.0 && addr.checked_add(len).is_some_and(|end| end <= RAM.1)
    }

    fn rules(size: u16) -> QueueRules {
        QueueRules {
            size,
            indirect: true,
            read_limit: 64 * 1024,
        }
    }

    /// A guest memory of descriptor tables: (table address, index) -> descriptor.
    struct Tables(HashMap<(u64, u16), Descriptor>);

    impl Tables {
        fn new(entries: &[(u64, u16, Descriptor)]) -> Tables {
            Tables(entries.iter().map(|&(t, i, d)| ((t, i), d)).collect())
        }
        fn judge(&self, rules: QueueRules, head: u16) -> Verdict {
            judge_chain(
                rules,
                TABLE,
                head,
                |table, index| {
                    in_ram(table + 16 * u64::from(index), 16)
                        .then(|| self.0.get(&(table, index)).copied().unwrap_or_default())
                },
                in_ram,
            )
        }
    }

    #[test]
    fn descriptors_round_trip_and_layouts_align() {
        let d = Descriptor {
            addr: 0x1122_3344_5566_7788,
            len: 0x99aa_bbcc,
            flags: 7,
            next: 0xdead,
        };
        assert_eq!(Descriptor::from_bytes(d.to_bytes()), d);
        assert_eq!(d.to_bytes()[0], 0x88);
        let q = QueueLayout::packed(0x4000_1000, 64);
        assert_eq!(q.avail, 0x4000_1400);
        assert_eq!(q.used % 4, 0);
        // `used_event` (after the available ring) fits before the used ring.
        assert!(q.used >= q.avail + 4 + 2 * 64 + 2);
        assert_eq!(q.avail_entry(65), q.avail + 4 + 2);
        assert_eq!(q.used_entry(64), q.used + 4);
        assert_eq!(q.span(), q.used + 6 + 512 - q.desc);
        let odd = QueueLayout::packed(0, 1);
        assert_eq!((odd.avail, odd.used), (16, 24));
    }

    #[test]
    fn good_chains_are_delivered() {
        let t = Tables::new(&[
            (TABLE, 0, Descriptor::readable(BUF, 10).then(1)),
            (TABLE, 1, Descriptor::readable(BUF + 10, 5)),
            (
                TABLE,
                2,
                Descriptor {
                    addr: INDIRECT,
                    len: 32,
                    flags: DESC_F_INDIRECT,
                    next: 0,
                },
            ),
            (INDIRECT, 0, Descriptor::readable(BUF, 3).then(1)),
            (INDIRECT, 1, Descriptor::readable(BUF, 4)),
        ]);
        assert_eq!(t.judge(rules(8), 0), Verdict::Deliver { readable: 15 });
        assert_eq!(t.judge(rules(8), 2), Verdict::Deliver { readable: 7 });
    }

    #[test]
    fn broken_chains_need_a_reset() {
        let loop_back = Tables::new(&[
            (TABLE, 0, Descriptor::readable(BUF, 1).then(1)),
            (TABLE, 1, Descriptor::readable(BUF, 1).then(0)),
        ]);
        assert_eq!(
            loop_back.judge(rules(8), 0),
            Verdict::Reset("chain longer than the queue")
        );
        assert_eq!(
            loop_back.judge(rules(8), 8),
            Verdict::Reset("head outside the table")
        );
        let indirect = |addr, len, flags| Descriptor {
            addr,
            len,
            flags: DESC_F_INDIRECT | flags,
            next: 1,
        };
        let cases = [
            (indirect(INDIRECT, 0, 0), "bad indirect table length"),
            (indirect(INDIRECT, 24, 0), "bad indirect table length"),
            (indirect(INDIRECT, 16 * 9, 0), "bad indirect table length"),
            (indirect(INDIRECT, 16, DESC_F_NEXT), "indirect with NEXT"),
            (indirect(0x0800_0000, 16, 0), "descriptor table outside RAM"),
            (
                Descriptor::readable(0x0900_0000, 4),
                "readable buffer outside RAM",
            ),
            (
                Descriptor::readable(BUF, 4).then(8),
                "next outside the table",
            ),
        ];
        for (d, why) in cases {
            let t = Tables::new(&[(TABLE, 0, d)]);
            assert_eq!(t.judge(rules(8), 0), Verdict::Reset(why), "{d:?}");
        }
        let nested = Tables::new(&[
            (TABLE, 0, indirect(INDIRECT, 16, 0)),
            (INDIRECT, 0, indirect(INDIRECT, 16, 0)),
        ]);
        assert_eq!(
            nested.judge(rules(8), 0),
            Verdict::Reset("indirect inside an indirect table")
        );
        let mut no_indirect = rules(8);
        no_indirect.indirect = false;
        let t = Tables::new(&[(TABLE, 0, indirect(INDIRECT, 16, 0))]);
        assert_eq!(
            t.judge(no_indirect, 0),
            Verdict::Reset("indirect without the feature")
        );
        // A full indirect table chained end to end plus the head: one more
        // descriptor than the queue holds.
        let mut long = vec![(TABLE, 0, indirect(INDIRECT, 16 * 8, 0))];
        long.extend((0..8).map(|i| (INDIRECT, i, Descriptor::readable(BUF, 1).then(i + 1))));
        long[8].2 = Descriptor::readable(BUF, 1);
        assert_eq!(
            Tables::new(&long).judge(rules(8), 0),
            Verdict::Reset("chain longer than the queue")
        );
        let huge = Tables::new(&[
            (TABLE, 0, Descriptor::readable(BUF, u32::MAX).then(1)),
            (TABLE, 1, Descriptor::readable(BUF, 1)),
        ]);
        assert_eq!(huge.judge(rules(8), 0), Verdict::Reset("chain above 4 GiB"));
        let writable_first = Tables::new(&[
            (
                TABLE,
                0,
                Descriptor {
                    flags: DESC_F_WRITE | DESC_F_NEXT,
                    next: 1,
                    ..Descriptor::readable(BUF, 4)
                },
            ),
            (TABLE, 1, Descriptor::readable(BUF, 1)),
        ]);
        assert_eq!(
            writable_first.judge(rules(8), 0),
            Verdict::Reset("readable after writable")
        );
    }

    #[test]
    fn buffers_that_leave_ram_late_may_go_either_way() {
        let t = Tables::new(&[(TABLE, 0, Descriptor::readable(RAM.1 - 16, u32::MAX))]);
        assert_eq!(
            t.judge(rules(8), 0),
            Verdict::Either("readable buffer running out of RAM")
        );
        let empty = Tables::new(&[(TABLE, 0, Descriptor::readable(0x0900_0000, 0))]);
        assert_eq!(
            empty.judge(rules(8), 0),
            Verdict::Either("empty buffer outside RAM")
        );
    }

    #[test]
    fn spec_values_are_the_spec_numbers() {
        assert_eq!(MAGIC, u32::from_le_bytes(*b"virt"));
        let status = [
            STATUS_ACKNOWLEDGE,
            STATUS_DRIVER,
            STATUS_DRIVER_OK,
            STATUS_FEATURES_OK,
            STATUS_NEEDS_RESET,
            STATUS_FAILED,
        ];
        assert_eq!(status, [1, 2, 4, 8, 64, 128]);
        assert_eq!((INTERRUPT_USED_BUFFER, INTERRUPT_CONFIG_CHANGE), (1, 2));
        let features = [F_INDIRECT_DESC, F_EVENT_IDX, F_VERSION_1, F_ACCESS_PLATFORM];
        assert_eq!(features, [1 << 28, 1 << 29, 1 << 32, 1 << 33]);
        assert_eq!(
            DEVICE_ID_CONSOLE,
            u32::from(u8::from(virtio_spec::Id::Console))
        );
        assert_eq!((DESC_F_NEXT, DESC_F_WRITE, DESC_F_INDIRECT), (1, 2, 4));
    }

    #[test]
    fn check_words_differ() {
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_ne!(fnv1a(b"ab"), fnv1a(b"ba"));
    }

    proptest! {
        /// Any table: the walk ends, and a delivered chain is one the
        /// device can follow: every `next` inside its table, at most `size`
        /// descriptors, readable bytes in RAM.
        #[test]
        fn any_table_gets_a_verdict(
            size_log in 0u32..4,
            head in 0u16..20,
            entries in proptest::collection::vec(
                (0u16..10, any::<bool>(), 0u16..8, 0u32..64, 0u8..4), 0..24),
        ) {
            let size = 1u16 << size_log;
            let mut map = Vec::new();
            for (i, &(next, has_next, flags, len, at)) in entries.iter().enumerate() {
                let table = if i < 12 { TABLE } else { INDIRECT };
                let addr = [BUF, INDIRECT, 0x0900_0000, RAM.1 - 8][usize::from(at)];
                let flags = (flags & !DESC_F_NEXT) | if has_next { DESC_F_NEXT } else { 0 };
                map.push((table, (i % 12) as u16, Descriptor { addr, len, flags, next }));
            }
            let t = Tables::new(&map);
            match t.judge(rules(size), head) {
                Verdict::Deliver { readable } => {
                    prop_assert!(head < size);
                    prop_assert!(readable <= u64::from(size) * 64);
                }
                Verdict::Reset(_) | Verdict::Either(_) => {}
            }
        }
    }
}
