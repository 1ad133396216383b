//! virtio-console (device id 3), one port, no `MULTIPORT`: Linux's `hvc0`
//! (and, on a control VM, a second device wired to the monitor).
//!
//! # Queues
//!
//! - Queue 0, receiveq: the guest posts device-writable buffers; input
//!   bytes (keys typed at the hypervisor console, the monitor's answers) are
//!   written into them in order, each buffer returned as soon as it holds
//!   what is waiting.
//! - Queue 1, transmitq: the guest posts device-readable buffers of output;
//!   on a notify the device copies them into its output buffer and returns
//!   them at once (used length 0). The runtime takes the output
//!   ([`MmioTransport::console_take_output`]) and merges it into the
//!   hypervisor console or feeds it to the monitor: one exit per buffer,
//!   not per byte.
//!
//! # Bounds
//!
//! - Input that finds no receive buffer (the driver not up yet, or slower
//!   than the typist) waits in a backlog of [`INPUT_BACKLOG`] bytes; bytes
//!   beyond it are dropped and counted ([`ConsoleCounters::input_dropped`]).
//!   The backlog survives a driver reset (typed before the driver is up).
//! - Output is taken from the transmit queue only while the output buffer
//!   holds less than [`OUTPUT_LIMIT`] bytes, and at most
//!   [`MAX_TX_CHAIN`] bytes of one chain are kept (the rest counted as
//!   dropped). Chains left in the ring wait for the runtime to take the
//!   output, which resumes the queue.
//!
//! # Configuration
//!
//! No feature bits: `cols`, `rows`, `max_nr_ports` and `emerg_write` are
//! not offered (`SIZE`, `MULTIPORT`, `EMERG_WRITE`), so the configuration
//! reads as zeros.

use super::mmio_transport::{
    Effects, MmioTransport, QueueContext, SnapshotError, VirtioDevice, read_config_bytes,
};
use super::virtqueue::{ChainWriter, DescriptorChain, RingError};
use crate::devices::guest_memory::GuestMemory;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// Queue 0: input to the guest.
pub const RECEIVE_QUEUE: u16 = 0;
/// Queue 1: output from the guest.
pub const TRANSMIT_QUEUE: u16 = 1;
/// Entries per queue.
pub const QUEUE_SIZE: u16 = 64;
/// Input bytes kept while no receive buffer is posted.
pub const INPUT_BACKLOG: usize = 4096;
/// Output bytes the device holds before it stops taking transmit buffers.
pub const OUTPUT_LIMIT: usize = 16 * 1024;
/// Bytes kept of one transmit chain.
pub const MAX_TX_CHAIN: u32 = 64 * 1024;

const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];

/// What the console counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsoleCounters {
    /// Input bytes written into guest buffers.
    pub input_bytes: u64,
    /// Input bytes dropped (backlog full).
    pub input_dropped: u64,
    /// Output bytes taken from guest buffers.
    pub output_bytes: u64,
    /// Output bytes dropped (a chain above [`MAX_TX_CHAIN`]).
    pub output_dropped: u64,
}

/// The console's migrated state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsoleState {
    /// Input waiting for receive buffers.
    pub backlog: Vec<u8>,
    /// Output not yet taken by the runtime.
    pub output: Vec<u8>,
    /// The counters.
    pub counters: ConsoleCounters,
}

/// A virtio-console device.
#[derive(Debug, Default)]
pub struct Console {
    backlog: VecDeque<u8>,
    output: Vec<u8>,
    counters: ConsoleCounters,
    chain: DescriptorChain,
}

impl Console {
    /// A console with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// What it counted.
    pub fn counters(&self) -> ConsoleCounters {
        self.counters
    }

    /// Input bytes waiting for receive buffers.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// Queues `bytes` for the guest (dropping what exceeds the backlog).
    pub fn queue_input(&mut self, bytes: &[u8]) {
        let room = INPUT_BACKLOG.saturating_sub(self.backlog.len());
        let (kept, dropped) = bytes.split_at(bytes.len().min(room));
        self.backlog.extend(kept);
        self.counters.input_dropped += dropped.len() as u64;
    }

    /// Moves the backlog into the guest's receive buffers.
    fn fill_receive(&mut self, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        let Some(queue) = ctx.queues.get_mut(usize::from(RECEIVE_QUEUE)) else {
            return Ok(());
        };
        while !self.backlog.is_empty() {
            if !queue.pop_into(ctx.mem, &mut self.chain)? {
                break;
            }
            let mut writer = ChainWriter::new(&self.chain);
            while !self.backlog.is_empty() && writer.remaining() > 0 {
                let (front, _) = self.backlog.as_slices();
                let n = writer.write(ctx.mem, front)?;
                if n == 0 {
                    break;
                }
                self.backlog.drain(..n);
                self.counters.input_bytes += n as u64;
            }
            let written = u32::try_from(writer.written()).unwrap_or(u32::MAX);
            queue.push_used(ctx.mem, self.chain.head(), written)?;
        }
        Ok(())
    }

    /// Takes the guest's transmit buffers into the output buffer.
    fn drain_transmit(&mut self, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        let Some(queue) = ctx.queues.get_mut(usize::from(TRANSMIT_QUEUE)) else {
            return Ok(());
        };
        // The bytes of the chains taken before a broken one stay output
        // (their chains are used): the error ends the loop, not them.
        let mut result = Ok(());
        while self.output.len() < OUTPUT_LIMIT {
            match queue.pop_into(ctx.mem, &mut self.chain) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            let keep = self.chain.readable_len().min(MAX_TX_CHAIN);
            let start = self.output.len();
            self.output.resize(start + keep as usize, 0);
            let dst = self.output.get_mut(start..).unwrap_or_default();
            let got = match self.chain.read_readable(ctx.mem, 0, dst) {
                Ok(got) => got,
                Err(e) => {
                    // Nothing of a chain whose buffers cannot be read.
                    self.output.truncate(start);
                    result = Err(e.into());
                    break;
                }
            };
            self.output.truncate(start + got);
            self.counters.output_bytes += got as u64;
            self.counters.output_dropped += u64::from(self.chain.readable_len() - keep);
            if let Err(e) = queue.push_used(ctx.mem, self.chain.head(), 0) {
                result = Err(e);
                break;
            }
        }
        ctx.output_ready |= !self.output.is_empty();
        result
    }
}

impl VirtioDevice for Console {
    type State = ConsoleState;

    fn device_id(&self) -> u32 {
        u32::from(u8::from(virtio_spec::Id::Console))
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // No feature that gives it a configuration (`SIZE`, `MULTIPORT`).
        read_config_bytes(&[], offset, data);
    }

    fn activate(&mut self, _features: u64, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        self.fill_receive(ctx)?;
        self.drain_transmit(ctx)
    }

    fn queue_notify(&mut self, queue: u16, ctx: &mut QueueContext<'_>) -> Result<(), RingError> {
        match queue {
            RECEIVE_QUEUE => self.fill_receive(ctx),
            TRANSMIT_QUEUE => self.drain_transmit(ctx),
            _ => Ok(()),
        }
    }

    fn reset(&mut self) {
        self.output.clear();
    }

    fn snapshot(&self) -> ConsoleState {
        ConsoleState {
            backlog: self.backlog.iter().copied().collect(),
            output: self.output.clone(),
            counters: self.counters,
        }
    }

    fn restore(&mut self, state: &ConsoleState) -> Result<(), SnapshotError> {
        if state.backlog.len() > INPUT_BACKLOG {
            return Err(SnapshotError::BadField("console backlog"));
        }
        self.backlog = state.backlog.iter().copied().collect();
        self.output = state.output.clone();
        self.counters = state.counters;
        Ok(())
    }
}

impl MmioTransport<Console> {
    /// Input for the guest (keys, monitor answers): written into receive
    /// buffers now where the driver posted some, else kept in the backlog.
    pub fn console_input(&mut self, bytes: &[u8], mem: &dyn GuestMemory) -> Effects {
        self.device_mut().queue_input(bytes);
        self.run(mem, |console, ctx| console.fill_receive(ctx))
    }

    /// Appends the guest's output to `out` and resumes the transmit queue
    /// (which may leave new output: take it again while
    /// [`Effects::output_ready`]).
    pub fn console_take_output(&mut self, out: &mut Vec<u8>, mem: &dyn GuestMemory) -> Effects {
        out.append(&mut self.device_mut().output);
        self.run(mem, |console, ctx| console.drain_transmit(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_guest::{DriverQueue, FakeMemory, SLOT_A, SLOT_B, bring_up};
    use super::super::mmio_transport::REG_QUEUE_NOTIFY;
    use super::*;

    const BUF: u64 = SLOT_A.0 + 0x4_0000;

    fn setup(mem: &FakeMemory) -> (MmioTransport<Console>, [DriverQueue; 2]) {
        let mut t = MmioTransport::new(Console::new());
        let qs = [
            DriverQueue::new(64, SLOT_A.0),
            DriverQueue::new(64, SLOT_A.0 + 0x1_0000),
        ];
        let _ = bring_up(&mut t, mem, None, &qs);
        (t, qs)
    }

    #[test]
    fn guest_output_comes_out_in_order_across_segments_and_slots() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        mem.poke(SLOT_B.0 - 3, b"hello ");
        mem.poke(BUF, b"world");
        let h1 = qs[1].add_chain(&mem, &[(SLOT_B.0 - 3, 6, false)]);
        qs[1].publish(&mem, h1);
        let h2 = qs[1].add_chain(&mem, &[(BUF, 2, false), (BUF + 2, 3, false)]);
        qs[1].publish(&mem, h2);
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert!(e.output_ready && e.interrupt);
        let mut out = Vec::new();
        let e = t.console_take_output(&mut out, &mem);
        assert!(!e.output_ready);
        assert_eq!(out, b"hello world");
        assert_eq!(
            qs[1].take_used(&mem),
            vec![(u32::from(h1), 0), (u32::from(h2), 0)]
        );
        assert_eq!(t.device().counters().output_bytes, 11);
    }

    #[test]
    fn chains_used_before_a_broken_one_keep_their_bytes() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        mem.poke(BUF, b"kept");
        let good = qs[1].add_chain(&mem, &[(BUF, 4, false)]);
        qs[1].publish(&mem, good);
        // A buffer in a device window (the PL011's): not RAM.
        let bad = qs[1].add_chain(&mem, &[(0x0900_0000, 4, false)]);
        qs[1].publish(&mem, bad);
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert!(e.needs_reset.is_some(), "{e:?}");
        assert!(e.output_ready, "the good chain's bytes wait to be taken");
        let mut out = Vec::new();
        let _ = t.console_take_output(&mut out, &mem);
        assert_eq!(out, b"kept", "no bytes of the broken chain, none lost");
        assert_eq!(qs[1].take_used(&mem), vec![(u32::from(good), 0)]);
    }

    #[test]
    fn input_typed_before_the_driver_waits_and_fills_buffers_at_driver_ok() {
        let mem = FakeMemory::new();
        let mut t = MmioTransport::new(Console::new());
        let e = t.console_input(b"hi!", &mem);
        assert_eq!(e, Effects::default());
        assert_eq!(t.device().backlog_len(), 3);
        let mut qs = [
            DriverQueue::new(64, SLOT_A.0),
            DriverQueue::new(64, SLOT_A.0 + 0x1_0000),
        ];
        let a = qs[0].add_chain(&mem, &[(BUF, 1, true)]);
        qs[0].publish(&mem, a);
        let b = qs[0].add_chain(&mem, &[(BUF + 0x100, 8, true)]);
        qs[0].publish(&mem, b);
        let e = bring_up(&mut t, &mem, None, &qs);
        assert!(e.interrupt);
        assert_eq!(
            qs[0].take_used(&mem),
            vec![(u32::from(a), 1), (u32::from(b), 2)]
        );
        assert_eq!(mem.peek(BUF, 1), b"h");
        assert_eq!(mem.peek(BUF + 0x100, 2), b"i!");
        assert_eq!(t.device().backlog_len(), 0);
        // Later input goes straight into a posted buffer.
        let c = qs[0].add_chain(&mem, &[(BUF + 0x200, 8, true)]);
        qs[0].publish(&mem, c);
        // With EVENT_IDX the driver asks for the next used entry.
        qs[0].set_used_event(&mem, 2);
        let e = t.console_input(b"ok", &mem);
        assert!(e.interrupt);
        assert_eq!(mem.peek(BUF + 0x200, 2), b"ok");
        assert!(mem.dirty_pages().contains(&((BUF + 0x200) / 4096)));
    }

    #[test]
    fn the_backlog_is_bounded_and_what_overflows_is_counted() {
        let mem = FakeMemory::new();
        let mut t = MmioTransport::new(Console::new());
        let _ = t.console_input(&[b'x'; INPUT_BACKLOG + 904], &mem);
        let _ = t.console_input(b"y", &mem);
        assert_eq!(t.device().backlog_len(), INPUT_BACKLOG);
        assert_eq!(t.device().counters().input_dropped, 905);
    }

    #[test]
    fn a_full_output_buffer_stops_the_queue_until_the_runtime_takes_it() {
        let mem = FakeMemory::new();
        let (mut t, mut qs) = setup(&mem);
        let chains = OUTPUT_LIMIT / 1024 + 4;
        for i in 0..chains {
            mem.poke(BUF + 1024 * i as u64, &[i as u8; 1024]);
            let h = qs[1].add_chain(&mem, &[(BUF + 1024 * i as u64, 1024, false)]);
            qs[1].publish(&mem, h);
        }
        let e = t.write(REG_QUEUE_NOTIFY, 4, 1, &mem);
        assert!(e.output_ready);
        assert_eq!(qs[1].take_used(&mem).len(), OUTPUT_LIMIT / 1024);
        let mut out = Vec::new();
        let mut rounds = 0;
        loop {
            rounds += 1;
            let e = t.console_take_output(&mut out, &mem);
            if !e.output_ready {
                break;
            }
        }
        assert_eq!(rounds, 2);
        assert_eq!(out.len(), chains * 1024);
        assert!(
            out.chunks(1024)
                .enumerate()
                .all(|(i, c)| c.iter().all(|&b| b == i as u8))
        );
        assert_eq!(qs[1].take_used(&mem).len(), 4);
    }

    #[test]
    fn console_state_survives_a_snapshot() {
        let mem = FakeMemory::new();
        let mut t = MmioTransport::new(Console::new());
        let _ = t.console_input(b"abc", &mem);
        let s = t.device().snapshot();
        let mut other = Console::new();
        other.restore(&s).unwrap();
        assert_eq!(other.backlog_len(), 3);
        let big = ConsoleState {
            backlog: vec![0; INPUT_BACKLOG + 1],
            ..ConsoleState::default()
        };
        assert!(other.restore(&big).is_err());
    }
}
