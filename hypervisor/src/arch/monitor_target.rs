//! The hypervisor console's input side at EL2: typed bytes from the host
//! UART go through the one [`Console`] (`arch::host_console`) to the focused
//! VM's PL011 or to the monitor, whose commands act on the VM table
//! (`runtime::monitor_target`: `VmConsoleInputs`, `MonitorMachine`).
//!
//! # Where it runs
//!
//! Every CPU may run a vCPU, so the console has no CPU of its own: it runs
//! on the console CPU (the boot CPU, `arch::host_console`), which takes the
//! host UART's receive interrupt and the console's poll timer at EL2
//! whatever it is doing: as IRQ exits while it runs a vCPU of any VM
//! (`HCR_EL2.IMO`), in its wait while its vCPU is off, and, once it has no
//! vCPU left (none given, or its VM ended), in `serve_forever`. A typed
//! byte is thus handled within one interrupt whatever the VMs do: a busy
//! guest on the console CPU is interrupted, a stopped one does not hold it.
//!
//! # Locks
//!
//! Lock order: the console lock, then a VM's UART lock, then its vgic lock
//! (`runtime::monitor_target`); the host UART driver's lock is taken last
//! and alone. The hypervisor's `[hv]` log lines go to the UART directly
//! (the logger may run with the console lock held).
//!
//! # Input
//!
//! Bytes read from the host UART go through [`Console::on_host_rx_byte`]:
//! to the monitor after the escape key, else to the focused VM, whose PL011
//! backlog takes them (`runtime::monitor_target::VmConsoleInputs`).

use crate::arch::boot::firmware;
use crate::arch::drivers::{console, gic};
use crate::arch::hardware::{EL2, El2, Vm, VmTable};
use crate::arch::host_console::{self, HostUart};
use crate::control::console::Console;
use crate::control::console_mux::ConsoleError;
use crate::drivers::gic::HostIrq;
use crate::runtime::monitor_target::{MonitorMachine, VmConsoleInputs};
use alloc::vec::Vec;
use spin::Once;

/// The VM table, once the console started.
static VMS: Once<&'static [&'static Vm]> = Once::new();

/// The VMs the console serves (empty before [`start`]).
fn vms() -> &'static [&'static Vm] {
    VMS.get().copied().unwrap_or(&[])
}

/// Builds the console for `machine`'s VMs and installs it, with the poll
/// timer on this CPU (the console CPU, the boot CPU), whose interrupt is
/// `poll_intid`. Once, before any vCPU runs.
pub fn start(machine: &'static VmTable, poll_intid: u32) -> Result<(), ConsoleError> {
    let vms = machine.vms();
    let names: Vec<&str> = vms.iter().map(|vm| vm.name.as_str()).collect();
    let console = Console::new(&names)?;
    VMS.call_once(|| vms);
    host_console::install(console, serve_forever, poll_intid);
    Ok(())
}

/// The host UART's receive interrupt: every byte it holds goes through the
/// console (to the focused VM or the monitor).
pub fn host_input() {
    let mut buf = [0u8; 64];
    loop {
        let len = console::receive(&mut buf);
        if len == 0 {
            return;
        }
        host_console::with_console(|console| {
            for &byte in &buf[..len] {
                console.on_host_rx_byte(
                    byte,
                    &mut HostUart,
                    &mut VmConsoleInputs::new(vms()),
                    &mut MonitorMachine::<El2>::new(&EL2, vms()),
                );
            }
        });
    }
}

/// The poll timer's interrupt: re-arms it and runs [`Console::poll`].
pub fn poll_tick() {
    host_console::arm_poll_timer();
    host_console::with_console(|console| console.poll(&mut HostUart));
}

/// The console CPU once it has no vCPU to run (`host_console::park`):
/// serves the host UART and the poll timer forever; anything else pending
/// (a stray kick) is finished unhandled.
fn serve_forever() -> ! {
    let uart = vms().first().and_then(|vm| vm.host_uart_intid);
    if !gic::is_up() {
        firmware::halt();
    }
    loop {
        loop {
            let ack = gic::acknowledge();
            let irq = HostIrq::classify(
                ack.intid,
                gic::maintenance_intid(),
                gic::timer_intids(),
                uart,
            );
            match irq {
                HostIrq::Spurious => break,
                HostIrq::UartReceive => host_input(),
                HostIrq::Unexpected(intid) if host_console::is_poll_timer(intid) => poll_tick(),
                _ => {}
            }
            gic::end_of_interrupt(ack);
        }
        gic::wait_for_wakeup();
    }
}
