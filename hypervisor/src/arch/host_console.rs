//! The hypervisor console on this machine: what the one
//! `runtime::host_console::HostConsole` (`arch::hardware::HOST_CONSOLE`)
//! needs of it ([`ConsoleMachine`] for [`El2`]): the host UART, the EL2
//! physical timer (`CNTHP`) as the console CPU's poll timer, and the host
//! GIC's PPIs and acknowledge; and the console's start. The console itself,
//! the console CPU and the lock order are described in
//! `runtime::host_console`.

use crate::arch::boot::firmware;
use crate::arch::drivers::gic;
use crate::arch::hardware::{EL2, El2, HOST_CONSOLE, VmTable};
use crate::control::console_mux::ConsoleError;
use crate::drivers::gic::driver::Acknowledged;
use crate::drivers::uart::console;
use crate::runtime::host_console::ConsoleMachine;
use crate::vocabulary::timers::TimerId;

/// Starts the console for `machine`'s VMs on this CPU (the boot CPU), its
/// poll timer on PPI `poll_intid`, and routes the hypervisor's log lines
/// through it. Once, before any vCPU runs.
pub fn start(machine: &'static VmTable, poll_intid: u32) -> Result<(), ConsoleError> {
    HOST_CONSOLE.start(&EL2, machine, poll_intid)?;
    console::route_lines(host_line);
    Ok(())
}

/// A whole line of the hypervisor's log, through the console.
fn host_line(line: &[u8]) {
    HOST_CONSOLE.host_line(&EL2, line);
}

impl ConsoleMachine for El2 {
    fn uart_write(&self, bytes: &[u8]) {
        console::write_bytes(bytes);
    }

    fn uart_receive(&self, buf: &mut [u8]) -> usize {
        console::receive(buf)
    }

    fn arm_poll_timer(&self, ticks: u64) {
        // SAFETY: the EL2 physical timer is the console's alone; arming it
        // only makes it raise its PPI on this CPU after `ticks`.
        unsafe {
            crate::write_sysreg!(cnthp_tval_el2, ticks);
            crate::write_sysreg!(cnthp_ctl_el2, 1);
        }
    }

    fn set_ppi_enabled(&self, intid: u32, enabled: bool) {
        gic::HOST_GIC.set_ppi_enabled(gic::this_cpu(), intid, enabled);
    }

    fn silence_guest_interrupts(&self) {
        // SAFETY: turning the guest timers off only stops their interrupts;
        // no vCPU runs on this CPU any more.
        unsafe {
            crate::write_sysreg!(cntv_ctl_el0, 0);
            crate::write_sysreg!(cntp_ctl_el0, 0);
        }
        for timer in TimerId::ALL {
            gic::HOST_GIC.set_timer_masked(gic::this_cpu(), timer, true);
            gic::HOST_GIC.deactivate_timer(gic::this_cpu(), timer);
        }
        gic::HOST_GIC.set_ppi_enabled(gic::this_cpu(), gic::HOST_GIC.maintenance_intid(), false);
    }

    fn gic_is_up(&self) -> bool {
        gic::HOST_GIC.is_up()
    }

    fn acknowledge(&self) -> Acknowledged {
        gic::HOST_GIC.acknowledge()
    }

    fn end_of_interrupt(&self, ack: Acknowledged) {
        gic::HOST_GIC.end_of_interrupt(ack);
    }

    fn maintenance_intid(&self) -> u32 {
        gic::HOST_GIC.maintenance_intid()
    }

    fn timer_intids(&self) -> [u32; 2] {
        gic::HOST_GIC.timer_intids()
    }

    fn halt(&self) -> ! {
        firmware::halt()
    }
}
