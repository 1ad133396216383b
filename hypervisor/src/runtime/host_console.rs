//! The one hypervisor [`Console`] (`crate::control::console`: the output
//! mux and the monitor) on a machine: behind its lock, with its terminal
//! (the host UART), the console CPU's poll timer, the typed bytes it takes,
//! and where a CPU goes when it has nothing left to run. The machine's side
//! is [`ConsoleMachine`]; `arch::hardware::HOST_CONSOLE` is the one
//! [`HostConsole`] of the EL2 machine.
//!
//! The VMs write their output through here, below the VM layer, so that
//! `runtime::vm_instance` does not import the monitor; the monitor's
//! commands act on the VM table through `runtime::monitor_target`.
//!
//! # The console CPU
//!
//! Every CPU may run a vCPU, so the console has no CPU of its own. The
//! host UART's receive interrupt is routed to the boot CPU, which installs
//! the console ([`HostConsole::start`]) and arms the EL2 physical timer
//! every [`POLL_MS`] milliseconds for [`Console::poll`]: it is the console
//! CPU. It takes both interrupts at EL2 whatever it does: as IRQ exits
//! while it runs a vCPU of any VM, in its wait while its vCPU is off, and,
//! once it has no vCPU left (none given, or its VM ended), in
//! [`HostConsole::park`], which serves them forever with every other
//! interrupt of the CPU (its former guest's timers, the list registers'
//! maintenance interrupt) disabled. Any other CPU that parks halts. A typed
//! byte is thus handled within one interrupt whatever the VMs do.
//!
//! # Locks
//!
//! Lock order: the console lock, then a VM's UART lock (or a virtio
//! device's lock), then its vgic lock (`runtime::monitor_target`); the host
//! UART driver's lock is taken last and alone. The console records which
//! CPU holds its lock, so that a whole line the hypervisor logs while that
//! CPU runs a monitor command is written to the UART directly instead of
//! waiting for the lock it holds ([`HostConsole::host_line`]).
//!
//! # Before the console
//!
//! Until [`HostConsole::start`], guest output and log lines go to the UART
//! as they come, and typed bytes and the poll timer are ignored.

use crate::control::console::Console;
use crate::control::console_mux::{ConsoleError, ConsoleOutput, VmId};
use crate::drivers::gic::HostIrq;
use crate::drivers::gic::driver::Acknowledged;
use crate::runtime::cpu_start::CpuStart;
use crate::runtime::monitor_target::{MonitorMachine, VmConsoleInputs};
use crate::runtime::vm_instance::Vm;
use crate::runtime::vm_table::VmTable;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use spin::{Mutex, Once};

/// Time between two console polls.
pub const POLL_MS: u64 = 50;

/// No CPU (the console CPU before the start, the lock's holder while free).
const NO_CPU: usize = usize::MAX;

/// What the console needs of the machine besides [`CpuStart`].
pub trait ConsoleMachine: CpuStart {
    /// Writes bytes to the host UART, the console's terminal.
    fn uart_write(&self, bytes: &[u8]);
    /// Reads the bytes the host UART holds into `buf`; how many (0: none).
    fn uart_receive(&self, buf: &mut [u8]) -> usize;
    /// Arms this CPU's poll timer to fire `ticks` system counter ticks from
    /// now (which also lowers its interrupt line).
    fn arm_poll_timer(&self, ticks: u64);
    /// Enables or disables a PPI of this CPU at the host GIC.
    fn set_ppi_enabled(&self, intid: u32, enabled: bool);
    /// Turns off this CPU's guest timers and their interrupts and the list
    /// registers' maintenance interrupt: no vCPU runs here any more.
    fn silence_guest_interrupts(&self);
    /// Whether a host GIC is driven (else nothing can interrupt a wait).
    fn gic_is_up(&self) -> bool;
    /// Acknowledges this CPU's highest-priority pending interrupt.
    fn acknowledge(&self) -> Acknowledged;
    /// Finishes an acknowledged interrupt.
    fn end_of_interrupt(&self, ack: Acknowledged);
    /// The list registers' maintenance interrupt.
    fn maintenance_intid(&self) -> u32;
    /// The guest timers' host PPIs, in `TimerId::index` order.
    fn timer_intids(&self) -> [u32; 2];
    /// Stops this CPU for good.
    fn halt(&self) -> !;
}

/// The host UART as the console's terminal.
struct Terminal<'a, H: ConsoleMachine>(&'a H);

impl<H: ConsoleMachine> ConsoleOutput for Terminal<'_, H> {
    fn write_bytes(&mut self, bytes: &[u8]) {
        self.0.uart_write(bytes);
    }
}

/// The console of a machine whose VMs are [`Vm<H>`] (see the module doc).
pub struct HostConsole<H: ConsoleMachine> {
    /// The console, once the VMs exist.
    console: Once<Mutex<Console>>,
    /// The VMs it serves.
    vms: Once<&'static [&'static Vm<H>]>,
    /// The console CPU's index.
    console_cpu: AtomicUsize,
    /// The poll timer's INTID (0: no poll timer).
    poll_intid: AtomicU32,
    /// The CPU that holds the console lock.
    owner: AtomicUsize,
}

impl<H: ConsoleMachine> Default for HostConsole<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: ConsoleMachine> HostConsole<H> {
    /// A console not started yet.
    pub const fn new() -> Self {
        Self {
            console: Once::new(),
            vms: Once::new(),
            console_cpu: AtomicUsize::new(NO_CPU),
            poll_intid: AtomicU32::new(0),
            owner: AtomicUsize::new(NO_CPU),
        }
    }

    /// Builds the console for `machine`'s VMs and installs it, with this
    /// CPU (the boot CPU) as the console CPU and its poll timer on PPI
    /// `poll_intid`. Once, before any vCPU runs.
    pub fn start(
        &self,
        hw: &H,
        machine: &'static VmTable<H>,
        poll_intid: u32,
    ) -> Result<(), ConsoleError> {
        let vms = machine.vms();
        let names: Vec<&str> = vms.iter().map(|vm| vm.name.as_str()).collect();
        let console = Console::new(&names)?;
        self.console.call_once(|| Mutex::new(console));
        self.vms.call_once(|| vms);
        self.console_cpu.store(hw.current_cpu(), Ordering::Release);
        self.poll_intid.store(poll_intid, Ordering::Release);
        hw.set_ppi_enabled(poll_intid, true);
        self.arm_poll_timer(hw);
        Ok(())
    }

    /// The VMs the console serves (none before [`start`](Self::start)).
    fn vms(&self) -> &'static [&'static Vm<H>] {
        self.vms.get().copied().unwrap_or(&[])
    }

    /// Runs `f` on the console with its lock held (`None`: not started).
    pub fn with_console<R>(&self, hw: &H, f: impl FnOnce(&mut Console) -> R) -> Option<R> {
        let mut console = self.console.get()?.lock();
        self.owner.store(hw.current_cpu(), Ordering::Relaxed);
        let result = f(&mut console);
        self.owner.store(NO_CPU, Ordering::Relaxed);
        Some(result)
    }

    /// A whole line of the hypervisor's own (its log, `STAT` lines): through
    /// the console, which starts it on a terminal line of its own. On the
    /// CPU that holds the console lock (a monitor command logs) it is
    /// written directly: a command runs after its line's `\n`, at a line
    /// start.
    pub fn host_line(&self, hw: &H, line: &[u8]) {
        if self.owner.load(Ordering::Relaxed) == hw.current_cpu() {
            hw.uart_write(line);
            return;
        }
        let written = self.with_console(hw, |console| {
            console.write_host_line(line, &mut Terminal(hw));
        });
        if written.is_none() {
            hw.uart_write(line);
        }
    }

    /// Whether `intid` is the console's poll timer.
    pub fn is_poll_timer(&self, intid: u32) -> bool {
        intid != 0 && self.poll_intid.load(Ordering::Acquire) == intid
    }

    /// Arms the poll timer for [`POLL_MS`] from now.
    fn arm_poll_timer(&self, hw: &H) {
        hw.arm_poll_timer(hw.counter_frequency() * POLL_MS / 1000);
    }

    /// Takes one byte of VM `vm`'s console output (written as it comes
    /// before the console is started).
    pub fn guest_output(&self, hw: &H, vm: usize, byte: u8) {
        // `vm` is an index of the VM table the console was built from.
        let written = self.with_console(hw, |console| {
            console.on_guest_tx_byte(VmId(vm), byte, &mut Terminal(hw))
        });
        if written.is_none() {
            hw.uart_write(&[byte]);
        }
    }

    /// Takes a run of VM `vm`'s console output under one hold of the
    /// console lock, so no other CPU's output of the VM lands inside it.
    pub fn guest_output_bytes(&self, hw: &H, vm: usize, bytes: &[u8]) {
        let written = self.with_console(hw, |console| {
            bytes
                .iter()
                .try_for_each(|&byte| console.on_guest_tx_byte(VmId(vm), byte, &mut Terminal(hw)))
        });
        if written.is_none() {
            hw.uart_write(bytes);
        }
    }

    /// Writes VM `vm`'s unfinished line (it ends). Never called with the
    /// console lock held: the monitor only requests a stop, the VM's own
    /// CPU ends it.
    pub fn flush_vm(&self, hw: &H, vm: usize) {
        self.with_console(hw, |console| console.flush_vm(VmId(vm), &mut Terminal(hw)));
    }

    /// The host UART's receive interrupt: every byte it holds goes through
    /// the console, to the focused VM or to the monitor.
    pub fn host_input(&self, hw: &'static H) {
        let mut buf = [0u8; 64];
        loop {
            let len = hw.uart_receive(&mut buf);
            if len == 0 {
                return;
            }
            let vms = self.vms();
            self.with_console(hw, |console| {
                for &byte in &buf[..len] {
                    console.on_host_rx_byte(
                        byte,
                        &mut Terminal(hw),
                        &mut VmConsoleInputs::new(vms),
                        &mut MonitorMachine::<H>::new(hw, vms),
                    );
                }
            });
        }
    }

    /// The poll timer's interrupt: re-arms it and runs [`Console::poll`].
    pub fn poll_tick(&self, hw: &H) {
        self.arm_poll_timer(hw);
        self.with_console(hw, |console| console.poll(&mut Terminal(hw)));
    }

    /// This CPU has nothing left to run: the console CPU serves the console
    /// forever (see the module doc), any other CPU halts.
    pub fn park(&self, hw: &'static H) -> ! {
        if self.console.get().is_none()
            || self.console_cpu.load(Ordering::Acquire) != hw.current_cpu()
            || !hw.gic_is_up()
        {
            hw.halt()
        }
        hw.silence_guest_interrupts();
        let uart = self.vms().first().and_then(|vm| vm.host_uart_intid);
        loop {
            loop {
                let ack = hw.acknowledge();
                let irq =
                    HostIrq::classify(ack.intid, hw.maintenance_intid(), hw.timer_intids(), uart);
                match irq {
                    HostIrq::Spurious => break,
                    HostIrq::UartReceive => self.host_input(hw),
                    HostIrq::Unexpected(intid) if self.is_poll_timer(intid) => self.poll_tick(hw),
                    // Anything else (a stray kick) is finished unhandled.
                    _ => {}
                }
                hw.end_of_interrupt(ack);
            }
            hw.wait_for_wakeup();
        }
    }
}
