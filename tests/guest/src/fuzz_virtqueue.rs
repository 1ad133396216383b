//! The fuzzer's `virtqueue` family (`fuzz-allow=virtqueue`, boot vCPU
//! only, on a VM with `console=virtio`): random descriptor tables,
//! available-ring entries and register accesses against the VM's
//! virtio-console, each checked against what the device must do.
//!
//! Operations (one per call, on a console the family keeps set up between
//! operations, with random ring features and queue size):
//!
//! - **batch**: one to four chains on the transmit queue, each one to three
//!   direct descriptors or an indirect table, carrying one self-checking
//!   line `VQ <seed>.<op>.<i> <fnv1a> <text>` cut at random points; with
//!   probability 1/3 the batch's last chain is broken by one mutation (a
//!   loop, `next` or the head outside the table, a buffer outside RAM or in
//!   a device window, `0xffffffff` bytes, over 4 GiB in total, a malformed,
//!   misplaced or nested indirect table, a readable buffer after a writable
//!   one) or the available index jumps more than a queue ahead. Each chain
//!   is judged by [`judge_chain`] reading the tables as they lie in memory;
//!   the device must use every chain before the first one that is not
//!   [`Verdict::Deliver`] (ids in order, length 0), then enter
//!   `DEVICE_NEEDS_RESET` (with the configuration-change interrupt bit) for
//!   a [`Verdict::Reset`] chain, and may do either for a
//!   [`Verdict::Either`] one; it must never stall.
//! - **bad rings**: a fresh setup whose transmit queue has a ring in a
//!   device window or outside RAM, a misaligned table or a bad size:
//!   `QueueReady` must read 0 or the device need a reset.
//! - **registers**: two to eight accesses at random offsets, widths and
//!   alignments (through the normal non-cacheable alias) with random values
//!   (queue address registers only ever get device, hole or arena
//!   addresses, so the device never writes the guest's own memory); then
//!   the identification registers must read as before, and if the device
//!   is still live with its transmit queue ready, a good request must be
//!   used without a reset.
//! - **notify storm**: 100 to 1000 notifies of random queue indices with
//!   nothing new available: no used entry may appear, the status must not
//!   change.
//! - **reset mid-request**: a chain published (and maybe notified), then a
//!   reset; the next setup must start from an empty used ring.
//!
//! After a reset (needed or not) the family sets the console up again and
//! sends a good line. Lines of chains the device used in a notify that did
//! not end in a reset are guaranteed to come out; the others may be lost
//! with the device's state. At the end the boot vCPU prints
//! `FUZZ: virtqueue sent=S guaranteed=G resets=R`; the campaign checks the
//! console: every `VQ` line intact (its check word matches), at least `G`
//! and at most `S` of them.

use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::fuzz_model::Rng;
use crate::virtio::{self, Console, Mmio, Outcome};
use crate::virtio_ring::{
    CONSOLE_TRANSMIT_QUEUE, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, Descriptor, F_EVENT_IDX,
    F_INDIRECT_DESC, F_VERSION_1, INTERRUPT_CONFIG_CHANGE, QueueLayout, QueueRules, REG_DEVICE_ID,
    REG_INTERRUPT_STATUS, REG_MAGIC, REG_QUEUE_DESC, REG_QUEUE_DEVICE, REG_QUEUE_DRIVER,
    REG_QUEUE_NUM, REG_QUEUE_READY, REG_QUEUE_SEL, REG_STATUS, REG_VENDOR_ID, REG_VERSION,
    STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FAILED, STATUS_FEATURES_OK,
    STATUS_NEEDS_RESET, Verdict, WINDOW_SIZE, fnv1a, judge_chain,
};

/// Lines sent in chains the device used.
pub static SENT: AtomicU64 = AtomicU64::new(0);
/// Of them, lines used in notifies that did not end in a reset.
pub static GUARANTEED: AtomicU64 = AtomicU64::new(0);
/// Times the device entered `DEVICE_NEEDS_RESET`.
pub static RESETS: AtomicU64 = AtomicU64::new(0);

/// How many readable bytes of a chain the console reads at most.
const READ_LIMIT: u64 = 64 * 1024;
/// Room for one chain's indirect table in the indirect area.
const INDIRECT_STRIDE: u64 = 0x400;

/// A violation: what, and two values that show it.
pub type Violation = (&'static str, u64, u64);

/// A line of text on the stack.
struct Line {
    bytes: [u8; 96],
    len: usize,
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The family's state on the boot vCPU.
pub struct VirtqueueFuzz {
    mmio: Mmio,
    ram: (u64, u64),
    /// Addresses outside RAM: device windows and holes.
    outside: [u64; 5],
    con: Option<Console>,
    /// Identification registers as first read.
    ids: [u32; 4],
}

/// Where a chain entry continues.
#[derive(Clone, Copy, Default)]
enum Next {
    /// The last entry.
    #[default]
    End,
    /// At this entry of the same chain.
    Relative(u16),
    /// At this index of the table, whatever it holds.
    Absolute(u16),
}

/// One descriptor of a chain being built.
#[derive(Clone, Copy, Default)]
struct Entry {
    descriptor: Descriptor,
    next: Next,
    /// An indirect descriptor to the inner table (inside an indirect table:
    /// nested).
    nested: bool,
}

/// One chain of a batch: its head, and whether it carries a line.
#[derive(Clone, Copy)]
struct Posted {
    head: u16,
    line: bool,
}

impl VirtqueueFuzz {
    /// The family against the console at `mmio` in a VM whose RAM is
    /// `ram`, with the PL011 and distributor at `uart` and `gicd`.
    pub fn new(mmio: Mmio, ram: (u64, u64), uart: u64, gicd: u64) -> VirtqueueFuzz {
        let top = ram.1.next_multiple_of(1 << 30);
        VirtqueueFuzz {
            mmio,
            ram,
            outside: [gicd, uart, mmio.base, top + 0x2000, 0x0b00_0000],
            con: None,
            ids: [REG_MAGIC, REG_VERSION, REG_DEVICE_ID, REG_VENDOR_ID].map(|r| mmio.read(r)),
        }
    }

    fn in_ram(&self, addr: u64, len: u64) -> bool {
        addr >= self.ram.0 && addr.checked_add(len).is_some_and(|end| end <= self.ram.1)
    }

    /// A fresh setup with random features and size, or a violation.
    fn setup(&mut self, rng: &mut Rng) -> Result<Console, Violation> {
        let features = [
            0,
            F_INDIRECT_DESC,
            F_EVENT_IDX,
            F_INDIRECT_DESC | F_EVENT_IDX,
        ][rng.below(4) as usize];
        let size = 4u16 << rng.below(5);
        let con = Console::setup(self.mmio, features, size).map_err(|_| {
            (
                "virtqueue: a fresh setup failed, Status",
                u64::from(self.mmio.status()),
                size.into(),
            )
        })?;
        self.con = Some(con);
        Ok(con)
    }

    /// The console, set up if it is not.
    fn console(&mut self, rng: &mut Rng) -> Result<Console, Violation> {
        match self.con {
            Some(con) => Ok(con),
            None => self.setup(rng),
        }
    }

    /// Resets, sets up and sends a good line that must come out.
    fn recover(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        let mut con = self.setup(rng)?;
        let result = self.send_line(&mut con, rng, seed, op, 99);
        self.con = Some(con);
        result
    }

    /// Sends one good line in one descriptor; it must be used.
    fn send_line(
        &mut self,
        con: &mut Console,
        rng: &mut Rng,
        seed: u64,
        op: u64,
        index: u32,
    ) -> Result<(), Violation> {
        let line = make_line(rng, seed, op, index);
        con.send(&line.bytes[..line.len]).map_err(|_| {
            (
                "virtqueue: a good request was not used, Status",
                u64::from(self.mmio.status()),
                u64::from(con.used_idx()),
            )
        })?;
        SENT.fetch_add(1, Ordering::Relaxed);
        GUARANTEED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One operation.
    pub fn op(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        match rng.below(20) {
            0..10 => self.batch(rng, seed, op),
            10..13 => self.bad_ring(rng, seed, op),
            13..16 => self.registers(rng, seed, op),
            16..18 => self.storm(rng),
            _ => self.reset_mid_request(rng, seed, op),
        }
    }

    fn batch(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        let mut con = self.console(rng)?;
        let size = con.tx.size;
        let chains = (1 + rng.below(4) as u16).min(size);
        let span = size / chains;
        let broken = rng.one_in(3);
        let jump = broken && rng.one_in(12);
        let mut posted = [Posted {
            head: 0,
            line: false,
        }; 4];
        for i in 0..chains {
            let last = i + 1 == chains;
            posted[i as usize] =
                self.build_chain(&mut con, rng, seed, op, i, span, broken && last && !jump);
        }
        let used_before = con.used_idx();
        let rules = QueueRules {
            size,
            indirect: con.features & F_INDIRECT_DESC != 0,
            read_limit: READ_LIMIT,
        };
        // The first chain that is not delivered, and whether it must reset.
        let mut first_bad: Option<(u16, bool)> = None;
        for (i, p) in posted[..chains as usize].iter().enumerate() {
            let verdict = judge_chain(
                rules,
                con.tx.desc,
                p.head,
                |table, index| {
                    let at = table.wrapping_add(16 * u64::from(index));
                    self.in_ram(at, 16).then(|| read_descriptor(at))
                },
                |addr, len| self.in_ram(addr, len),
            );
            match verdict {
                Verdict::Deliver { .. } => {}
                Verdict::Reset(_) => {
                    first_bad = Some((i as u16, true));
                    break;
                }
                Verdict::Either(_) => {
                    first_bad = Some((i as u16, false));
                    break;
                }
            }
        }
        let target = if jump {
            first_bad = Some((0, true));
            con.next_avail
                .wrapping_add(size)
                .wrapping_add(1 + rng.below(100) as u16)
        } else {
            con.next_avail
        };
        con.publish(target);
        self.mmio.take_interrupts();
        let outcome = con.notify_and_wait(target);
        let used = con.used_idx().wrapping_sub(used_before);
        // Used elements: the posted heads, in order, length 0.
        for k in 0..used.min(chains) {
            let (id, len) = con.used_element(used_before.wrapping_add(k));
            if id != u32::from(posted[k as usize].head) || len != 0 {
                self.con = None;
                return Err((
                    "virtqueue: used element is not the posted chain (id, len)",
                    id.into(),
                    len.into(),
                ));
            }
        }
        if used > chains {
            self.con = None;
            return Err((
                "virtqueue: more used elements than chains",
                used.into(),
                chains.into(),
            ));
        }
        let lines = posted[..used as usize].iter().filter(|p| p.line).count() as u64;
        SENT.fetch_add(lines, Ordering::Relaxed);
        match (outcome, first_bad) {
            (Outcome::Used, None) => {
                GUARANTEED.fetch_add(lines, Ordering::Relaxed);
                con.used_seen = con.used_idx();
                self.con = Some(con);
                Ok(())
            }
            (Outcome::Used, Some((_, false))) => {
                GUARANTEED.fetch_add(lines, Ordering::Relaxed);
                self.con = Some(con);
                Ok(())
            }
            (Outcome::NeedsReset, Some((k, _))) => {
                RESETS.fetch_add(1, Ordering::Relaxed);
                let pending = self.mmio.read(REG_INTERRUPT_STATUS);
                if pending & INTERRUPT_CONFIG_CHANGE == 0 {
                    self.con = None;
                    return Err((
                        "virtqueue: DEVICE_NEEDS_RESET without the configuration-change bit",
                        pending.into(),
                        0,
                    ));
                }
                if used > k {
                    self.con = None;
                    return Err((
                        "virtqueue: chains used past the broken one (used, broken)",
                        used.into(),
                        k.into(),
                    ));
                }
                self.recover(rng, seed, op)
            }
            (Outcome::Used, Some((k, true))) => {
                self.con = None;
                Err((
                    "virtqueue: a chain that needs a reset was used (chain, used)",
                    k.into(),
                    used.into(),
                ))
            }
            (Outcome::NeedsReset, None) => {
                RESETS.fetch_add(1, Ordering::Relaxed);
                self.con = None;
                Err((
                    "virtqueue: good chains put the device in DEVICE_NEEDS_RESET (chains, used)",
                    chains.into(),
                    used.into(),
                ))
            }
            (Outcome::Stalled { used, status }, _) => {
                self.con = None;
                Err((
                    "virtqueue: the device stalled (used idx, Status)",
                    used.into(),
                    status.into(),
                ))
            }
        }
    }

    /// Writes chain `i` of a batch in table slots `[i * span, (i + 1) *
    /// span)` (or indirect table `i`), posts it, and says what it holds. A
    /// `broken` chain gets one mutation.
    #[allow(clippy::too_many_arguments)]
    fn build_chain(
        &self,
        con: &mut Console,
        rng: &mut Rng,
        seed: u64,
        op: u64,
        i: u16,
        span: u16,
        broken: bool,
    ) -> Posted {
        let line = make_line(rng, seed, op, u32::from(i));
        let text = &line.bytes[..line.len];
        let address = con.buffer(text);
        let size = con.tx.size;
        let negotiated = con.features & F_INDIRECT_DESC != 0;
        let indirect = negotiated && rng.one_in(3);
        let room = if indirect { 4 } else { u64::from(span.min(4)) };
        let mut n = 1 + rng.below(room.min(3)) as usize;
        // Cut the line into `n` non-empty parts.
        let mut cuts = [0usize; 5];
        cuts[n] = text.len();
        for k in 1..n {
            let left = text.len() - cuts[k - 1] - (n - k);
            cuts[k] = cuts[k - 1] + 1 + rng.below(left as u64 / 2) as usize;
        }
        let mut entries = [Entry::default(); 4];
        for k in 0..n {
            entries[k] = Entry {
                descriptor: Descriptor::readable(
                    address + cuts[k] as u64,
                    (cuts[k + 1] - cuts[k]) as u32,
                ),
                next: if k + 1 < n {
                    Next::Relative(k as u16 + 1)
                } else {
                    Next::End
                },
                nested: false,
            };
        }
        let mut avail_head = i * span;
        let mut indirect_len = 16 * n as u32;
        let mut indirect_flags = DESC_F_INDIRECT;
        let mut table_outside = false;
        if broken {
            let k = rng.below(n as u64) as usize;
            let outside = self.outside[rng.below(self.outside.len() as u64) as usize];
            let mut mutation = rng.below(12);
            // Indirect-table mutations need one; growing a chain by an
            // entry needs room in its slots (a direct chain must not spill
            // into the next chain's).
            let can_grow = n > 1 || indirect || span > 1;
            if (!indirect && matches!(mutation, 8..=10)) || (!can_grow && matches!(mutation, 6 | 7))
            {
                mutation = 3;
            }
            match mutation {
                0 => entries[n - 1].next = Next::Relative(rng.below(n as u64) as u16),
                1 => entries[k].next = Next::Absolute(size.max(4) + rng.below(1000) as u16),
                2 => avail_head = size + rng.below(u64::from(u16::MAX - size)) as u16,
                3 => entries[k].descriptor.addr = outside + rng.below(0x100),
                4 => entries[k].descriptor = Descriptor::readable(outside, u32::MAX),
                5 => entries[k].descriptor = Descriptor::readable(self.ram.1 - 0x100, u32::MAX),
                6 => {
                    if n == 1 {
                        entries[0].next = Next::Relative(1);
                        entries[1] = Entry {
                            descriptor: Descriptor::readable(address, 1),
                            next: Next::End,
                            nested: false,
                        };
                        n = 2;
                    }
                    entries[0].descriptor.len = 0x8000_0000 | rng.below(0x8000_0000) as u32;
                    entries[n - 1].descriptor.len = 0x8000_0000 | rng.below(0x8000_0000) as u32;
                }
                7 => {
                    if n == 1 {
                        entries[0].next = Next::Relative(1);
                        entries[1] = Entry {
                            descriptor: Descriptor::readable(address, 1),
                            next: Next::End,
                            nested: false,
                        };
                        n = 2;
                    }
                    let k = rng.below(n as u64 - 1) as usize;
                    entries[k].descriptor.flags |= DESC_F_WRITE;
                }
                8 => indirect_len = [0, 8, 24, 16 * (u32::from(size) + 1)][rng.below(4) as usize],
                9 => indirect_flags |= DESC_F_NEXT,
                10 => {
                    // The last entry (without NEXT, which is refused for
                    // itself): an indirect table inside the indirect table.
                    entries[n - 1].descriptor = Descriptor {
                        addr: 0,
                        len: 16,
                        flags: DESC_F_INDIRECT,
                        next: 0,
                    };
                    entries[n - 1].nested = true;
                }
                _ => table_outside = true,
            }
        }
        let table = virtio::arena(virtio::INDIRECT_TABLES + INDIRECT_STRIDE * u64::from(i));
        let inner = table + 0x200;
        virtio::poke(inner, &Descriptor::readable(address, 1).to_bytes());
        let base = i * span;
        // Where entry `k` goes, and what a `next` becomes.
        let (first, place) = if indirect { (0, 0) } else { (base, base) };
        for (k, entry) in entries[..n].iter().enumerate() {
            let mut d = entry.descriptor;
            if entry.nested {
                d.addr = inner;
            }
            match entry.next {
                Next::End => {}
                Next::Relative(r) => d = d.then(place + r),
                Next::Absolute(a) => d = d.then(a),
            }
            if indirect {
                virtio::poke(table + 16 * k as u64, &d.to_bytes());
            } else {
                con.set_descriptor(first + k as u16, d);
            }
        }
        if indirect || table_outside {
            let addr = if table_outside {
                self.outside[3]
            } else {
                table
            };
            let len = if table_outside { 32 } else { indirect_len };
            con.set_descriptor(
                base,
                Descriptor {
                    addr,
                    len,
                    flags: indirect_flags,
                    next: base,
                },
            );
        }
        con.post(avail_head);
        Posted {
            head: avail_head,
            line: !broken,
        }
    }

    fn bad_ring(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        self.con = None;
        let mmio = self.mmio;
        mmio.reset();
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        mmio.write_driver_features(F_VERSION_1);
        mmio.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        let layout = QueueLayout::packed(virtio::arena(virtio::TX_BUFFERS), 16);
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        mmio.write(REG_QUEUE_NUM, 16);
        mmio.write_address(REG_QUEUE_DESC, layout.desc);
        mmio.write_address(REG_QUEUE_DRIVER, layout.avail);
        mmio.write_address(REG_QUEUE_DEVICE, layout.used);
        let outside =
            self.outside[rng.below(self.outside.len() as u64) as usize] + 8 * rng.below(32);
        match rng.below(6) {
            0 => mmio.write_address(REG_QUEUE_DESC, outside),
            1 => mmio.write_address(REG_QUEUE_DRIVER, outside),
            2 => mmio.write_address(REG_QUEUE_DEVICE, outside),
            3 => mmio.write_address(REG_QUEUE_DESC, layout.desc + 8),
            4 => mmio.write_address(REG_QUEUE_DEVICE, layout.used + 2),
            _ => mmio.write(
                REG_QUEUE_NUM,
                [0, 3, 12, 128, 0x1_0000][rng.below(5) as usize],
            ),
        }
        mmio.write(REG_QUEUE_READY, 1);
        let (ready, status) = (mmio.read(REG_QUEUE_READY), mmio.status());
        if status & STATUS_NEEDS_RESET != 0 {
            RESETS.fetch_add(1, Ordering::Relaxed);
        } else if ready != 0 {
            return Err((
                "virtqueue: QueueReady took a ring the device must refuse (Status, ready)",
                status.into(),
                ready.into(),
            ));
        }
        self.recover(rng, seed, op)
    }

    fn registers(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        let mut con = self.console(rng)?;
        let mmio = self.mmio;
        for _ in 0..2 + rng.below(7) {
            let size_log2 = rng.below(4) as u32;
            let offset = if rng.one_in(2) {
                rng.below(WINDOW_SIZE / 4) * 4
            } else {
                rng.below(WINDOW_SIZE)
            };
            let mut value = rng.next();
            let aligned_reg = offset & !3;
            if (REG_QUEUE_DESC..REG_QUEUE_DEVICE + 8).contains(&aligned_reg)
                || offset >= WINDOW_SIZE - 8
            {
                // Queue addresses: only device, hole or arena addresses.
                let pick = self.outside[rng.below(self.outside.len() as u64) as usize];
                value = if rng.one_in(4) {
                    virtio::arena(virtio::TX_BUFFERS)
                } else {
                    pick
                };
                if offset & 4 != 0 {
                    value >>= 32;
                }
            }
            if rng.one_in(2) {
                let _ = crate::exceptions::load_sized(mmio.alias() + offset, size_log2);
            } else {
                let _ = crate::exceptions::store_sized(mmio.alias() + offset, size_log2, value);
            }
        }
        let ids = [REG_MAGIC, REG_VERSION, REG_DEVICE_ID, REG_VENDOR_ID].map(|r| mmio.read(r));
        if ids != self.ids {
            self.con = None;
            return Err((
                "virtqueue: identification registers changed (DeviceID, MagicValue)",
                ids[2].into(),
                ids[0].into(),
            ));
        }
        let status = mmio.status();
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        let live = status & (STATUS_DRIVER_OK | STATUS_NEEDS_RESET | STATUS_FAILED)
            == STATUS_DRIVER_OK
            && mmio.read(REG_QUEUE_READY) == 1;
        if live {
            // The rings cannot have moved (locked after DRIVER_OK).
            con.used_seen = con.used_idx();
            con.next_avail = con.used_idx();
            let result = self.send_line(&mut con, rng, seed, op, 98);
            self.con = Some(con);
            if result.is_err() {
                self.con = None;
            }
            return result;
        }
        if status & STATUS_NEEDS_RESET != 0 {
            RESETS.fetch_add(1, Ordering::Relaxed);
        }
        self.recover(rng, seed, op)
    }

    fn storm(&mut self, rng: &mut Rng) -> Result<(), Violation> {
        let con = self.console(rng)?;
        let (used, status) = (con.used_idx(), self.mmio.status());
        for _ in 0..100 + rng.below(900) {
            let queue = [0, 1, 2, 0xffff, rng.next() as u32][rng.below(5) as usize];
            self.mmio.notify(queue);
        }
        let (used_after, status_after) = (con.used_idx(), self.mmio.status());
        if used_after != used || status_after != status {
            self.con = None;
            return Err((
                "virtqueue: notifies of nothing changed the device (used idx, Status)",
                used_after.into(),
                status_after.into(),
            ));
        }
        Ok(())
    }

    fn reset_mid_request(&mut self, rng: &mut Rng, seed: u64, op: u64) -> Result<(), Violation> {
        let mut con = self.console(rng)?;
        let line = make_line(rng, seed, op, 97);
        let address = con.buffer(&line.bytes[..line.len]);
        let head = con.next_avail % con.tx.size;
        con.set_descriptor(head, Descriptor::readable(address, line.len as u32));
        con.post(head);
        con.publish(con.next_avail);
        if rng.one_in(2) {
            self.mmio.notify(CONSOLE_TRANSMIT_QUEUE);
            if con.wait(con.next_avail) == Outcome::Used {
                SENT.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.mmio.reset();
        self.con = None;
        let fresh = self.setup(rng)?;
        if fresh.used_idx() != 0 {
            return Err((
                "virtqueue: a fresh setup found used entries",
                fresh.used_idx().into(),
                0,
            ));
        }
        self.recover(rng, seed, op)
    }
}

/// Reads a descriptor in RAM (the caller checked the address).
fn read_descriptor(at: u64) -> Descriptor {
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        // SAFETY: `at..at + 16` is guest RAM (the caller checked), identity
        // mapped as normal memory; reading it has no side effect.
        *b = unsafe { core::ptr::read_volatile((at + i as u64) as *const u8) };
    }
    Descriptor::from_bytes(bytes)
}

/// `VQ <seed>.<op>.<index> <fnv1a of "<seed>.<op>.<index> <text>"> <text>\n`
/// with 8 to 40 random printable characters.
fn make_line(rng: &mut Rng, seed: u64, op: u64, index: u32) -> Line {
    let mut body = Line {
        bytes: [0; 96],
        len: 0,
    };
    let _ = write!(body, "{seed}.{op}.{index} ");
    let id_len = body.len;
    for _ in 0..8 + rng.below(33) {
        let c = b'a' + rng.below(26) as u8;
        body.bytes[body.len] = if rng.one_in(6) { b'_' } else { c };
        body.len += 1;
    }
    let hash = fnv1a(&body.bytes[..body.len]);
    let mut line = Line {
        bytes: [0; 96],
        len: 0,
    };
    let _ = write!(
        line,
        "VQ {} {hash:08x} ",
        core::str::from_utf8(&body.bytes[..id_len - 1]).unwrap_or("?")
    );
    let text = &body.bytes[id_len..body.len];
    line.bytes[line.len..line.len + text.len()].copy_from_slice(text);
    line.len += text.len();
    line.bytes[line.len] = b'\n';
    line.len += 1;
    line
}
