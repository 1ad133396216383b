//! The hypervisor console: the [`ConsoleMux`] and the [`Monitor`] behind
//! the entry points the machine layer calls.
//!
//! The machine layer holds one [`Console`] behind a lock and calls:
//!
//! - [`Console::on_guest_tx_byte`] for every byte a guest writes to its
//!   PL011 data register;
//! - [`Console::on_host_rx_byte`] for every byte read from the host UART;
//! - [`Console::poll`] periodically (every 10 to 100 ms), which writes the
//!   partial lines of quiet VMs and opens the monitor after a lone escape;
//! - [`Console::flush_vm`] when a VM stops or restarts;
//! - [`Console::write_host_line`] for each line of the hypervisor's own
//!   log, so that it starts a terminal line whoever had the cursor.
//!
//! It provides a [`ConsoleOutput`] (the host UART), a [`GuestInput`] (the
//! VMs' PL011 receive paths) and a [`MonitorTarget`] (VM and memslot control).
//!
//! The monitor calls the [`MonitorTarget`] and the [`GuestInput`] while the
//! caller holds the console's lock, so neither may take that lock (a
//! `restart` that wants the VM's partial line written asks for
//! [`Console::flush_vm`] later, from its own context). Every call returns
//! after a bounded amount of work: a pause, stop or restart is requested,
//! not waited for.
//!
//! # Modes
//!
//! In console mode typed bytes go through [`ConsoleMux::route_input`]: to
//! the focused VM, or, after the escape key, to the monitor. In monitor mode
//! every typed byte goes to [`Monitor::on_byte`] until it leaves. Guest
//! output keeps flowing in both modes: a complete guest line that arrives
//! while the monitor prompt shows ends the prompt's line, and the prompt and
//! the typed text are drawn again below it. While the monitor is open the
//! partial lines of quiet VMs are held (up to their buffer's size) instead of
//! being written by the poll.

use super::console_mux::{ConsoleError, ConsoleMux, ConsoleOutput, RxRoute, VmId};
use super::monitor::{Monitor, MonitorStep, MonitorTarget};

/// The VMs' console inputs (their PL011 receive FIFOs and backlogs).
pub trait GuestInput {
    /// Queues `byte` for `vm`'s PL011; false if it has no room (the byte is
    /// counted as dropped).
    fn push_rx(&mut self, vm: VmId, byte: u8) -> bool;
}

/// Which side has the keyboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Typed bytes go to the focused VM.
    Console,
    /// Typed bytes go to the monitor.
    Monitor,
}

/// The hypervisor console; see the module documentation.
#[derive(Clone, Debug)]
pub struct Console {
    mux: ConsoleMux,
    monitor: Monitor,
    mode: Mode,
}

impl Console {
    /// A console for VMs named `names`; ids are their indexes.
    pub fn new(names: &[&str]) -> Result<Self, ConsoleError> {
        Ok(Self {
            mux: ConsoleMux::new(names)?,
            monitor: Monitor::new(),
            mode: Mode::Console,
        })
    }

    /// The routing state.
    pub fn mux(&self) -> &ConsoleMux {
        &self.mux
    }

    /// Which side has the keyboard.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The VM that typed bytes go to.
    pub fn focus(&self) -> VmId {
        self.mux.focus()
    }

    /// Takes one byte of `vm`'s console output.
    pub fn on_guest_tx_byte(
        &mut self,
        vm: VmId,
        byte: u8,
        out: &mut impl ConsoleOutput,
    ) -> Result<(), ConsoleError> {
        let interrupted = self.mux.guest_byte(vm, byte, out)?;
        self.redraw_if(interrupted, out);
        Ok(())
    }

    /// Writes `vm`'s unfinished line (the VM stops or restarts).
    pub fn flush_vm(&mut self, vm: VmId, out: &mut impl ConsoleOutput) -> Result<(), ConsoleError> {
        let interrupted = self.mux.flush_vm(vm, out)?;
        self.redraw_if(interrupted, out);
        Ok(())
    }

    /// Writes a line of the hypervisor's own (its log) at a line start; the
    /// monitor's prompt, if that line was its, is drawn again below it.
    pub fn write_host_line(&mut self, line: &[u8], out: &mut impl ConsoleOutput) {
        let interrupted = self.mux.write_host_line(line, out);
        self.redraw_if(interrupted, out);
    }

    /// Takes one byte typed on the host console.
    pub fn on_host_rx_byte<T: MonitorTarget>(
        &mut self,
        byte: u8,
        out: &mut impl ConsoleOutput,
        input: &mut impl GuestInput,
        target: &mut T,
    ) {
        match self.mode {
            Mode::Monitor => {
                if self.monitor.on_byte(byte, &mut self.mux, out, target) == MonitorStep::Leave {
                    self.mode = Mode::Console;
                }
            }
            Mode::Console => match self.mux.route_input(byte) {
                RxRoute::Guest(vm, byte) => {
                    if !input.push_rx(vm, byte) {
                        // `vm` is the mux's focus: the call cannot fail.
                        let _ = self.mux.note_rx_dropped(vm);
                    }
                }
                RxRoute::Held => {}
                RxRoute::OpenMonitor { first } => {
                    self.open_monitor(out);
                    if let Some(first) = first {
                        self.on_host_rx_byte(first, out, input, target);
                    }
                }
            },
        }
    }

    /// The periodic tick: writes quiet VMs' partial lines (not while the
    /// monitor is open) and opens the monitor after a lone escape key.
    pub fn poll(&mut self, out: &mut impl ConsoleOutput) {
        let outcome = self.mux.poll(self.mode == Mode::Monitor, out);
        self.redraw_if(outcome.monitor_line_ended, out);
        if outcome.open_monitor && self.mode == Mode::Console {
            self.open_monitor(out);
        }
    }

    fn open_monitor(&mut self, out: &mut impl ConsoleOutput) {
        self.mode = Mode::Monitor;
        self.monitor.open(&mut self.mux, out);
    }

    fn redraw_if(&mut self, interrupted: bool, out: &mut impl ConsoleOutput) {
        if interrupted && self.mode == Mode::Monitor {
            self.monitor.redraw(&mut self.mux, out);
        }
    }
}
