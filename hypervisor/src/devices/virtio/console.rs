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

use super::guest_memory::GuestMemory;
use super::mmio_transport::{Effects, MmioTransport, QueueContext, SnapshotError, VirtioDevice};
use super::virtqueue::{ChainWriter, DescriptorChain, RingError};
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
        while self.output.len() < OUTPUT_LIMIT {
            if !queue.pop_into(ctx.mem, &mut self.chain)? {
                break;
            }
            let keep = self.chain.readable_len().min(MAX_TX_CHAIN);
            let start = self.output.len();
            self.output.resize(start + keep as usize, 0);
            let dst = self.output.get_mut(start..).unwrap_or_default();
            let got = self.chain.read_readable(ctx.mem, 0, dst)?;
            self.output.truncate(start + got);
            self.counters.output_bytes += got as u64;
            self.counters.output_dropped += u64::from(self.chain.readable_len() - keep);
            queue.push_used(ctx.mem, self.chain.head(), 0)?;
        }
        ctx.output_ready |= !self.output.is_empty();
        Ok(())
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

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
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
