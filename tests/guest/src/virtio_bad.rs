//! The `virtio-bad` scenario (boot vCPU only, on a VM with
//! `console=virtio`): a hostile driver of the VM's virtio-console.
//!
//! It first sets the console up properly and sends
//! `virtio-console: hello` through its transmit queue (the hypervisor
//! merges it into the console; the end-to-end test looks for the line).
//! Then it runs one hostile case after another, each from a fresh setup
//! (reset, status sequence, queues of [`QUEUE_SIZE`] entries, `DRIVER_OK`):
//!
//! - **broken chains** on the transmit queue: descriptor loops (two
//!   descriptors pointing at each other, one pointing at itself, a loop
//!   inside an indirect table), a chain longer than the queue (a full
//!   indirect table chained end to end), `next` and a head outside the
//!   table, buffers outside RAM and in the GIC distributor's, the PL011's
//!   and the device's own window, a `0xffffffff`-byte buffer at the end of
//!   RAM and outside it, two of them (over 4 GiB), an indirect table inside
//!   an indirect table, indirect tables of length 0, 24 bytes, longer than
//!   the queue, outside RAM and in the GIC, an indirect descriptor with
//!   `NEXT`, a readable buffer after a writable one, an available index
//!   more than a queue ahead. The device must either use the chain or
//!   enter `DEVICE_NEEDS_RESET` (then with the configuration-change bit in
//!   `InterruptStatus`, as the spec requires after `DRIVER_OK`), never
//!   stall or stop the VM;
//! - **rings the device must refuse**: a descriptor table in the GIC, an
//!   available ring in the PL011, a used ring in the device's own window or
//!   outside RAM, a misaligned table, queue sizes 0, 12 and above
//!   `QueueNumMax`: `QueueReady` = 1 must not take (it reads 0) or the
//!   device enters `DEVICE_NEEDS_RESET`;
//! - **register abuse** the device must shrug off and stay live (a good
//!   request then works without a reset): 10 000 notifies of an empty queue
//!   and of queues that do not exist, writes to every read-only register
//!   (which must read back unchanged), 1-, 2- and 8-byte and unaligned
//!   accesses to registers (through the normal non-cacheable alias, so that
//!   they reach the hypervisor: each reads 0 or aborts, and no store
//!   changes the device), configuration-space accesses, queue registers
//!   written after `DRIVER_OK`, acknowledges of interrupts never raised;
//! - **protocol abuse**: a reset in the middle of a request (published,
//!   not notified; then a fresh setup must find an empty used ring) and in
//!   the middle of the setup, `FEATURES_OK` with a feature not offered and
//!   without `VERSION_1` (must not stick), `DRIVER_OK` without
//!   `FEATURES_OK`, status bits cleared without a reset.
//!
//! After every case the console is reset and set up again and a good
//! request (`virtio-bad: recovered after <case>`) must be used. Each case
//! prints `test-guest: virtio-bad: <case>: <outcome>`; the scenario passes
//! when every check held. The hypervisor logs each ring error once per
//! entry into `DEVICE_NEEDS_RESET`, through the VM's rate-limited log.

use core::fmt::{self, Write};

use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::virtio::{self, Console, Mmio, Outcome, RequestError};
use crate::virtio_ring::{
    CONSOLE_TRANSMIT_QUEUE, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, Descriptor,
    F_ACCESS_PLATFORM, F_INDIRECT_DESC, F_VERSION_1, INTERRUPT_CONFIG_CHANGE,
    INTERRUPT_USED_BUFFER, MAGIC, READ_ONLY_REGISTERS, REG_CONFIG, REG_DEVICE_ID,
    REG_INTERRUPT_ACK, REG_MAGIC, REG_QUEUE_DESC, REG_QUEUE_DEVICE, REG_QUEUE_DRIVER,
    REG_QUEUE_NUM, REG_QUEUE_NUM_MAX, REG_QUEUE_READY, REG_QUEUE_SEL, REG_STATUS, REG_VERSION,
    STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET,
    WINDOW_SIZE,
};

/// Entries of each queue the scenario sets up.
pub const QUEUE_SIZE: u16 = 16;
/// Features the scenario asks for (with `VERSION_1`).
const FEATURES: u64 = F_INDIRECT_DESC;
/// Notifies of each storm.
const STORM: u32 = 10_000;

/// A line built on the stack (the guest has no heap).
struct Line {
    bytes: [u8; 128],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            bytes: [0; 128],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.bytes.len() - self.len;
        let n = s.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// What a case ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CaseEnd {
    /// The device used the chain(s).
    Used,
    /// The device entered `DEVICE_NEEDS_RESET`.
    NeedsReset,
    /// `QueueReady` = 1 did not take.
    QueueRefused,
    /// The device stayed live and a good request worked without a reset.
    Live,
}

impl CaseEnd {
    fn name(self) -> &'static str {
        match self {
            CaseEnd::Used => "used",
            CaseEnd::NeedsReset => "needs reset",
            CaseEnd::QueueRefused => "queue refused",
            CaseEnd::Live => "live",
        }
    }
}

/// The scenario's view of the machine.
struct Bad {
    mmio: Mmio,
    /// First byte after RAM.
    ram_top: u64,
    /// An address outside RAM and every device.
    outside: u64,
    uart: u64,
    gicd: u64,
    /// Cases that ended in `DEVICE_NEEDS_RESET`.
    resets: u32,
    cases: u32,
}

fn fail(case: &'static str, what: &'static str, value: u64) -> Failure {
    Failure::Virtio { case, what, value }
}

/// Runs the scenario.
pub fn run(platform: &Platform) -> Result<(), Failure> {
    let mmio = virtio::find_console(platform).ok_or(Failure::NoVirtioConsole)?;
    let ram_top = platform.ram().iter().map(|r| r.end).max().unwrap_or(0);
    let mut bad = Bad {
        mmio,
        ram_top,
        outside: ram_top.next_multiple_of(1 << 30) + 0x1000,
        uart: platform.uart_base,
        gicd: platform.gic.map_or(0x0800_0000, |g| g.distributor),
        resets: 0,
        cases: 0,
    };
    let offered = mmio.device_features();
    println!(
        "test-guest: virtio-bad: virtio-console at {:#x}, vendor {:#x}, features {offered:#x}",
        mmio.base,
        mmio.read(crate::virtio_ring::REG_VENDOR_ID)
    );
    let mut con = bad.setup("first setup")?;
    con.send(b"virtio-console: hello\n")
        .map_err(|e| Failure::VirtioRequest {
            case: "hello",
            error: e,
        })?;
    // Without EVENT_IDX and with interrupts not suppressed, a used buffer
    // raises InterruptStatus bit 0.
    let pending = mmio.take_interrupts();
    if pending & INTERRUPT_USED_BUFFER == 0 {
        return Err(fail(
            "hello",
            "no used-buffer bit in InterruptStatus",
            pending.into(),
        ));
    }
    println!("test-guest: virtio-bad: sent `virtio-console: hello` through the transmit queue");

    bad.chain_cases()?;
    bad.ring_cases()?;
    bad.register_cases()?;
    bad.protocol_cases()?;
    println!(
        "test-guest: virtio-bad: {} cases, {} ended in DEVICE_NEEDS_RESET, the console \
         recovered after each",
        bad.cases, bad.resets
    );
    Ok(())
}

/// A broken chain: what to write, given the console and the scenario.
type ChainBuilder = fn(&Bad, &mut Console) -> Result<(), Failure>;
/// A refused ring: what to change in a good queue configuration.
type RingBend = fn(&Bad, Mmio);

impl Bad {
    fn setup(&self, case: &'static str) -> Result<Console, Failure> {
        Console::setup(self.mmio, FEATURES, QUEUE_SIZE)
            .map_err(|error| Failure::VirtioSetup { case, error })
    }

    /// The check after every case: reset, fresh setup, a good request.
    fn recover(&mut self, case: &'static str, result: CaseEnd) -> Result<(), Failure> {
        self.cases += 1;
        if result == CaseEnd::NeedsReset {
            self.resets += 1;
        }
        println!("test-guest: virtio-bad: {case}: {}", result.name());
        let mut con = self.setup(case)?;
        let mut line = Line::new();
        let _ = writeln!(line, "virtio-bad: recovered after {case}");
        con.send(line.as_bytes())
            .map_err(|error| Failure::VirtioRequest { case, error })
    }

    /// A good request on the console as it is (no reset): the device must
    /// still be live.
    fn still_live(&self, case: &'static str, con: &mut Console) -> Result<(), Failure> {
        let status = self.mmio.status();
        if status & STATUS_DRIVER_OK == 0 || status & STATUS_NEEDS_RESET != 0 {
            return Err(fail(
                case,
                "the device is no longer live, Status",
                status.into(),
            ));
        }
        let mut line = Line::new();
        let _ = writeln!(line, "virtio-bad: still live after {case}");
        con.send(line.as_bytes())
            .map_err(|error| Failure::VirtioRequest { case, error })
    }

    /// Publishes what `build` posted, notifies and judges the outcome.
    fn chain_case(&mut self, case: &'static str, build: ChainBuilder) -> Result<(), Failure> {
        let mut con = self.setup(case)?;
        let used_before = con.used_idx();
        self.mmio.take_interrupts();
        build(self, &mut con)?;
        let target = con.next_avail;
        con.publish(target);
        let result = match con.notify_and_wait(target) {
            Outcome::Used => {
                // Every element must name a head the case posted.
                for idx in used_before..target {
                    let (id, _) = con.used_element(idx);
                    if id >= u32::from(QUEUE_SIZE) {
                        return Err(fail(
                            case,
                            "used element with an id outside the table",
                            id.into(),
                        ));
                    }
                }
                CaseEnd::Used
            }
            Outcome::NeedsReset => {
                let pending = self.mmio.read(crate::virtio_ring::REG_INTERRUPT_STATUS);
                if pending & INTERRUPT_CONFIG_CHANGE == 0 {
                    return Err(fail(
                        case,
                        "DEVICE_NEEDS_RESET after DRIVER_OK without the configuration-change \
                         interrupt bit, InterruptStatus",
                        pending.into(),
                    ));
                }
                CaseEnd::NeedsReset
            }
            Outcome::Stalled { used, status } => {
                return Err(fail(
                    case,
                    "the device neither used the chain nor needs a reset (used idx << 32 | \
                     Status)",
                    u64::from(used) << 32 | u64::from(status),
                ));
            }
        };
        self.recover(case, result)
    }

    /// Writes a one-descriptor chain at head 0 and posts it.
    fn single(con: &mut Console, descriptor: Descriptor) {
        con.set_descriptor(0, descriptor);
        con.post(0);
    }

    /// Head 0 is an indirect descriptor to a table at the indirect area
    /// holding `entries`.
    fn indirect(con: &mut Console, len: u32, flags: u16, entries: &[Descriptor]) -> u64 {
        let table = virtio::arena(virtio::INDIRECT_TABLES);
        for (i, d) in entries.iter().enumerate() {
            virtio::poke(table + 16 * i as u64, &d.to_bytes());
        }
        con.set_descriptor(
            0,
            Descriptor {
                addr: table,
                len,
                flags: DESC_F_INDIRECT | flags,
                next: 1,
            },
        );
        con.post(0);
        table
    }

    fn payload(con: &mut Console) -> u64 {
        con.buffer(b"virtio-bad: payload of a broken chain\n")
    }

    fn chain_cases(&mut self) -> Result<(), Failure> {
        const CASES: [(&str, ChainBuilder); 22] = [
            ("descriptor loop", |_, con| {
                let p = Bad::payload(con);
                con.set_descriptor(0, Descriptor::readable(p, 4).then(1));
                con.set_descriptor(1, Descriptor::readable(p, 4).then(0));
                con.post(0);
                Ok(())
            }),
            ("descriptor pointing at itself", |_, con| {
                let p = Bad::payload(con);
                Bad::single(con, Descriptor::readable(p, 4).then(0));
                Ok(())
            }),
            ("chain longer than the queue", |_, con| {
                let p = Bad::payload(con);
                let mut table = [Descriptor::readable(p, 1); QUEUE_SIZE as usize];
                for (i, d) in table.iter_mut().enumerate().take(QUEUE_SIZE as usize - 1) {
                    *d = d.then(i as u16 + 1);
                }
                Bad::indirect(con, 16 * u32::from(QUEUE_SIZE), 0, &table);
                Ok(())
            }),
            ("next outside the table", |_, con| {
                let p = Bad::payload(con);
                Bad::single(con, Descriptor::readable(p, 4).then(QUEUE_SIZE + 3));
                Ok(())
            }),
            ("head outside the table", |_, con| {
                let p = Bad::payload(con);
                con.set_descriptor(0, Descriptor::readable(p, 4));
                con.post(0xffff);
                Ok(())
            }),
            ("buffer outside RAM", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.outside, 16));
                Ok(())
            }),
            ("buffer in the GIC distributor", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.gicd, 16));
                Ok(())
            }),
            ("buffer in the PL011", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.uart, 16));
                Ok(())
            }),
            ("buffer in the device's own window", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.mmio.base, 16));
                Ok(())
            }),
            ("0xffffffff bytes at the end of RAM", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.ram_top - 0x100, u32::MAX));
                Ok(())
            }),
            ("0xffffffff bytes outside RAM", |bad, con| {
                Bad::single(con, Descriptor::readable(bad.outside, u32::MAX));
                Ok(())
            }),
            ("two 0xffffffff-byte buffers", |_, con| {
                let p = Bad::payload(con);
                con.set_descriptor(0, Descriptor::readable(p, u32::MAX).then(1));
                con.set_descriptor(1, Descriptor::readable(p, u32::MAX));
                con.post(0);
                Ok(())
            }),
            ("indirect table inside an indirect table", |_, con| {
                let p = Bad::payload(con);
                let inner = virtio::arena(virtio::INDIRECT_TABLES + 0x800);
                virtio::poke(inner, &Descriptor::readable(p, 4).to_bytes());
                let nested = Descriptor {
                    addr: inner,
                    len: 16,
                    flags: DESC_F_INDIRECT,
                    next: 0,
                };
                Bad::indirect(con, 16, 0, &[nested]);
                Ok(())
            }),
            ("loop inside an indirect table", |_, con| {
                let p = Bad::payload(con);
                let table = [
                    Descriptor::readable(p, 4).then(1),
                    Descriptor::readable(p, 4).then(0),
                ];
                Bad::indirect(con, 32, 0, &table);
                Ok(())
            }),
            ("indirect table of length 0", |_, con| {
                let p = Bad::payload(con);
                Bad::indirect(con, 0, 0, &[Descriptor::readable(p, 4)]);
                Ok(())
            }),
            ("indirect table of 24 bytes", |_, con| {
                let p = Bad::payload(con);
                Bad::indirect(con, 24, 0, &[Descriptor::readable(p, 4); 2]);
                Ok(())
            }),
            ("indirect table longer than the queue", |_, con| {
                let p = Bad::payload(con);
                let table = [Descriptor::readable(p, 1); QUEUE_SIZE as usize + 1];
                Bad::indirect(con, 16 * (u32::from(QUEUE_SIZE) + 1), 0, &table);
                Ok(())
            }),
            ("indirect table outside RAM", |bad, con| {
                con.set_descriptor(
                    0,
                    Descriptor {
                        addr: bad.outside,
                        len: 32,
                        flags: DESC_F_INDIRECT,
                        next: 0,
                    },
                );
                con.post(0);
                Ok(())
            }),
            ("indirect table in the GIC distributor", |bad, con| {
                con.set_descriptor(
                    0,
                    Descriptor {
                        addr: bad.gicd,
                        len: 32,
                        flags: DESC_F_INDIRECT,
                        next: 0,
                    },
                );
                con.post(0);
                Ok(())
            }),
            ("indirect descriptor with NEXT", |_, con| {
                let p = Bad::payload(con);
                con.set_descriptor(1, Descriptor::readable(p, 4));
                Bad::indirect(con, 16, DESC_F_NEXT, &[Descriptor::readable(p, 4)]);
                Ok(())
            }),
            ("readable buffer after a writable one", |_, con| {
                let p = Bad::payload(con);
                let writable = Descriptor {
                    flags: DESC_F_WRITE,
                    ..Descriptor::readable(p, 4)
                };
                con.set_descriptor(0, writable.then(1));
                con.set_descriptor(1, Descriptor::readable(p, 4));
                con.post(0);
                Ok(())
            }),
            ("available index more than a queue ahead", |_, con| {
                let p = Bad::payload(con);
                con.set_descriptor(0, Descriptor::readable(p, 4));
                for _ in 0..=QUEUE_SIZE {
                    con.post(0);
                }
                Ok(())
            }),
        ];
        for (case, build) in CASES {
            self.chain_case(case, build)?;
        }
        Ok(())
    }

    /// Sets the device up to `FEATURES_OK`, configures the transmit queue
    /// with the good layout changed by `bend`, writes `QueueReady` = 1 and
    /// checks it did not take or the device needs a reset.
    fn ring_case(&mut self, case: &'static str, bend: RingBend) -> Result<(), Failure> {
        let mmio = self.mmio;
        mmio.reset();
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        mmio.write_driver_features(F_VERSION_1 | FEATURES);
        mmio.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        let layout =
            crate::virtio_ring::QueueLayout::packed(virtio::arena(virtio::TX_BUFFERS), QUEUE_SIZE);
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        mmio.write(REG_QUEUE_NUM, u32::from(QUEUE_SIZE));
        mmio.write_address(REG_QUEUE_DESC, layout.desc);
        mmio.write_address(REG_QUEUE_DRIVER, layout.avail);
        mmio.write_address(REG_QUEUE_DEVICE, layout.used);
        bend(self, mmio);
        mmio.write(REG_QUEUE_READY, 1);
        let ready = mmio.read(REG_QUEUE_READY);
        let status = mmio.status();
        let result = if status & STATUS_NEEDS_RESET != 0 {
            CaseEnd::NeedsReset
        } else if ready == 0 {
            CaseEnd::QueueRefused
        } else {
            return Err(fail(
                case,
                "QueueReady took a queue the device must refuse, Status",
                status.into(),
            ));
        };
        self.recover(case, result)
    }

    fn ring_cases(&mut self) -> Result<(), Failure> {
        const CASES: [(&str, RingBend); 8] = [
            ("descriptor table in the GIC distributor", |bad, mmio| {
                mmio.write_address(REG_QUEUE_DESC, bad.gicd)
            }),
            ("available ring in the PL011", |bad, mmio| {
                mmio.write_address(REG_QUEUE_DRIVER, bad.uart)
            }),
            ("used ring in the device's own window", |bad, mmio| {
                mmio.write_address(REG_QUEUE_DEVICE, bad.mmio.base)
            }),
            ("used ring outside RAM", |bad, mmio| {
                mmio.write_address(REG_QUEUE_DEVICE, bad.outside)
            }),
            ("misaligned descriptor table", |_, mmio| {
                mmio.write_address(REG_QUEUE_DESC, virtio::arena(virtio::TX_BUFFERS) + 8)
            }),
            ("queue size 0", |_, mmio| mmio.write(REG_QUEUE_NUM, 0)),
            ("queue size 12", |_, mmio| mmio.write(REG_QUEUE_NUM, 12)),
            ("queue size above QueueNumMax", |_, mmio| {
                let max = mmio.read(REG_QUEUE_NUM_MAX);
                mmio.write(REG_QUEUE_NUM, (max * 2).max(1 << 15));
            }),
        ];
        for (case, bend) in CASES {
            self.ring_case(case, bend)?;
        }
        Ok(())
    }

    fn register_cases(&mut self) -> Result<(), Failure> {
        let mmio = self.mmio;

        let case = "notify storm on empty queues";
        let mut con = self.setup(case)?;
        for queue in [CONSOLE_TRANSMIT_QUEUE, 0] {
            for _ in 0..STORM {
                mmio.notify(queue);
            }
        }
        if con.used_idx() != 0 {
            return Err(fail(
                case,
                "used entries appeared for an empty queue",
                con.used_idx().into(),
            ));
        }
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "notify storm on queues that do not exist";
        let mut con = self.setup(case)?;
        for i in 0..STORM {
            mmio.notify([2, 3, 0xffff, 0xdead_beef][(i % 4) as usize]);
        }
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "writes to read-only registers";
        let mut con = self.setup(case)?;
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        let before: [u32; READ_ONLY_REGISTERS.len()] =
            core::array::from_fn(|i| mmio.read(READ_ONLY_REGISTERS[i].0));
        for (offset, _) in READ_ONLY_REGISTERS {
            mmio.write(offset, 0xffff_ffff);
            mmio.write(offset, 0);
        }
        for (i, (offset, _)) in READ_ONLY_REGISTERS.iter().enumerate().take(6) {
            let now = mmio.read(*offset);
            if now != before[i] {
                return Err(fail(
                    case,
                    "a read-only register changed (offset << 32 | value)",
                    offset << 32 | u64::from(now),
                ));
            }
        }
        if mmio.read(REG_MAGIC) != MAGIC || mmio.read(REG_VERSION) != 2 {
            return Err(fail(case, "MagicValue or Version changed", 0));
        }
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "odd-sized and unaligned register accesses";
        let mut con = self.setup(case)?;
        let alias = mmio.alias();
        let mut aborts = 0u32;
        for (offset, size_log2) in [
            (REG_MAGIC, 0),
            (REG_MAGIC, 1),
            (REG_MAGIC, 3),
            (REG_STATUS, 0),
            (REG_STATUS, 1),
            (REG_STATUS, 3),
            (REG_MAGIC + 2, 2),
            (REG_STATUS + 1, 2),
            (REG_DEVICE_ID + 3, 0),
            (WINDOW_SIZE - 4, 3),
        ] {
            if crate::exceptions::load_sized(alias + offset, size_log2).is_err() {
                aborts += 1;
            }
        }
        // Zero stores to Status that would reset the device if any of them
        // were taken as a 4-byte write of Status.
        for (offset, size_log2) in [
            (REG_STATUS, 0),
            (REG_STATUS, 1),
            (REG_STATUS, 3),
            (REG_STATUS + 2, 2),
            (REG_STATUS - 4, 3),
            (REG_QUEUE_SEL + 1, 0),
            (WINDOW_SIZE - 4, 3),
        ] {
            if crate::exceptions::store_sized(alias + offset, size_log2, 0).is_some() {
                aborts += 1;
            }
        }
        println!("test-guest: virtio-bad: {case}: {aborts} of 17 aborted, the rest ignored");
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "configuration space accesses";
        let mut con = self.setup(case)?;
        for (offset, size_log2) in [(0, 0), (1, 0), (2, 1), (4, 2), (8, 3), (3, 2), (0xfc, 2)] {
            let _ = crate::exceptions::load_sized(alias + REG_CONFIG + offset, size_log2);
        }
        for (offset, size_log2) in [(0, 2), (0, 0), (6, 1), (0xfc, 2)] {
            let _ =
                crate::exceptions::store_sized(alias + REG_CONFIG + offset, size_log2, u64::MAX);
        }
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "queue registers written after DRIVER_OK";
        let mut con = self.setup(case)?;
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        mmio.write(REG_QUEUE_NUM, 3);
        mmio.write_address(REG_QUEUE_DESC, self.gicd);
        mmio.write_address(REG_QUEUE_DRIVER, self.uart);
        mmio.write_address(REG_QUEUE_DEVICE, self.outside);
        mmio.write(REG_QUEUE_READY, 1);
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)?;

        let case = "acknowledges of interrupts never raised";
        let mut con = self.setup(case)?;
        mmio.take_interrupts();
        for value in [u32::MAX, 0x8000_0000, 4] {
            mmio.write(REG_INTERRUPT_ACK, value);
        }
        self.still_live(case, &mut con)?;
        self.recover(case, CaseEnd::Live)
    }

    fn protocol_cases(&mut self) -> Result<(), Failure> {
        let mmio = self.mmio;

        let case = "reset in the middle of a request";
        let mut con = self.setup(case)?;
        const STALE: &[u8] = b"virtio-bad: STALE request sent before a reset\n";
        let stale = con.buffer(STALE);
        con.set_descriptor(0, Descriptor::readable(stale, STALE.len() as u32));
        con.post(0);
        con.publish(con.next_avail);
        mmio.reset();
        let status = mmio.status();
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        let ready = mmio.read(REG_QUEUE_READY);
        if status != 0 || ready != 0 {
            return Err(fail(
                case,
                "after a reset Status << 32 | QueueReady",
                u64::from(status) << 32 | u64::from(ready),
            ));
        }
        let con = self.setup(case)?;
        if con.used_idx() != 0 {
            return Err(fail(
                case,
                "a fresh setup found used entries",
                con.used_idx().into(),
            ));
        }
        self.recover(case, CaseEnd::Live)?;

        let case = "reset in the middle of the setup";
        mmio.reset();
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        mmio.write_driver_features(F_VERSION_1 | FEATURES);
        mmio.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        mmio.write(REG_QUEUE_NUM, u32::from(QUEUE_SIZE));
        let layout =
            crate::virtio_ring::QueueLayout::packed(virtio::arena(virtio::TX_BUFFERS), QUEUE_SIZE);
        mmio.write_address(REG_QUEUE_DESC, layout.desc);
        mmio.write_address(REG_QUEUE_DRIVER, layout.avail);
        mmio.write_address(REG_QUEUE_DEVICE, layout.used);
        mmio.write(REG_QUEUE_READY, 1);
        mmio.reset();
        mmio.write(REG_QUEUE_SEL, CONSOLE_TRANSMIT_QUEUE);
        let (status, ready) = (mmio.status(), mmio.read(REG_QUEUE_READY));
        if status != 0 || ready != 0 {
            return Err(fail(
                case,
                "after a reset Status << 32 | QueueReady",
                u64::from(status) << 32 | u64::from(ready),
            ));
        }
        self.recover(case, CaseEnd::Live)?;

        for (case, features) in [
            (
                "FEATURES_OK with a feature not offered",
                F_VERSION_1 | F_ACCESS_PLATFORM,
            ),
            ("FEATURES_OK with bit 63", F_VERSION_1 | 1 << 63),
            ("FEATURES_OK without VERSION_1", 0),
        ] {
            mmio.reset();
            mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
            mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
            mmio.write_driver_features(features);
            mmio.write(
                REG_STATUS,
                STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
            );
            let status = mmio.status();
            if status & STATUS_FEATURES_OK != 0 {
                return Err(fail(case, "FEATURES_OK stuck, Status", status.into()));
            }
            mmio.write(
                REG_STATUS,
                STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
            );
            let status = mmio.status();
            if status & (STATUS_FEATURES_OK | STATUS_DRIVER_OK) != 0 {
                return Err(fail(
                    case,
                    "DRIVER_OK or FEATURES_OK stuck after a refusal, Status",
                    status.into(),
                ));
            }
            self.recover(case, CaseEnd::Live)?;
        }

        let case = "DRIVER_OK without FEATURES_OK";
        mmio.reset();
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        mmio.write_driver_features(F_VERSION_1);
        mmio.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK,
        );
        let status = mmio.status();
        if status & STATUS_DRIVER_OK != 0 {
            return Err(fail(
                case,
                "DRIVER_OK stuck without FEATURES_OK, Status",
                status.into(),
            ));
        }
        self.recover(case, CaseEnd::Live)?;

        // The driver must not clear bits without a reset; whatever the
        // device makes of it, a reset must bring it back.
        let case = "status bits cleared without a reset";
        let _con = self.setup(case)?;
        mmio.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        mmio.write(REG_STATUS, STATUS_NEEDS_RESET);
        if mmio.read(REG_DEVICE_ID) != crate::virtio_ring::DEVICE_ID_CONSOLE {
            return Err(fail(case, "DeviceID changed", 0));
        }
        self.recover(case, CaseEnd::Live)
    }
}

/// How a [`RequestError`] reads in the `RESULT` line.
pub fn describe(error: &RequestError, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match error {
        RequestError::Outcome(Outcome::Used) => write!(f, "used"),
        RequestError::Outcome(Outcome::NeedsReset) => {
            write!(f, "the device entered DEVICE_NEEDS_RESET")
        }
        RequestError::Outcome(Outcome::Stalled { used, status }) => write!(
            f,
            "the device did not use the chain in time (used idx {used}, Status {status:#x})"
        ),
        RequestError::WrongUsed { id, len, head } => write!(
            f,
            "used element (id {id}, len {len}) is not the chain's (head {head}, len 0)"
        ),
    }
}
