//! The one hypervisor [`Console`] (`crate::control::console`: the output mux
//! and the monitor) behind its lock, its terminal (the host UART), the
//! console CPU's poll timer, and where a CPU goes when it has nothing left
//! to run. `arch::monitor_target` feeds it typed bytes and drives the machine; the
//! VMs feed it their output here, below the VM layer, so that `runtime::vm_instance`
//! does not import the monitor.
//!
//! # The console CPU
//!
//! The host UART's receive interrupt is routed to the boot CPU
//! (`drivers::gic`), and the boot CPU arms the EL2 physical timer (`CNTHP`)
//! every [`POLL_MS`] milliseconds for [`Console::poll`]: it is the console
//! CPU. A CPU that would halt for good (its VM stopped, or it has no vCPU)
//! calls [`park`]: the console CPU then serves the console's interrupts
//! forever through the server `arch::monitor_target` registered, with every other
//! interrupt of this CPU (its former guest's timers, the list registers'
//! maintenance interrupt) disabled; any other CPU halts.

use crate::arch::boot::firmware;
use crate::arch::cpu::percpu;
use crate::arch::drivers::{console, gic};
use crate::control::console::Console;
use crate::control::console_mux::{ConsoleOutput, VmId};
use crate::read_sysreg;
use crate::vocabulary::timers::TimerId;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use spin::{Mutex, Once};

/// Time between two console polls.
pub const POLL_MS: u64 = 50;

/// The console CPU's index (the boot CPU's, which installs the console).
static CONSOLE_CPU: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The console, once the VMs exist.
static CONSOLE: Once<Mutex<Console>> = Once::new();

/// The EL2 physical timer's INTID (0: no poll timer).
static POLL_INTID: AtomicU32 = AtomicU32::new(0);

/// The CPU that holds the console lock (`usize::MAX`: none), so that a log
/// line written while it runs the monitor does not wait for itself.
static OWNER: AtomicUsize = AtomicUsize::new(usize::MAX);

/// What the console CPU runs when it parks.
static SERVER: Once<fn() -> !> = Once::new();

/// The host UART as the console's terminal.
pub struct HostUart;

impl ConsoleOutput for HostUart {
    fn write_bytes(&mut self, bytes: &[u8]) {
        console::write_bytes(bytes);
    }
}

/// Installs `console` (once, on the boot CPU, which becomes the console
/// CPU, before any vCPU runs),
/// `server` as what this CPU runs when it parks, and starts the poll timer,
/// whose interrupt is `poll_intid` (the EL2 physical timer's PPI).
pub fn install(console: Console, server: fn() -> !, poll_intid: u32) {
    CONSOLE.call_once(|| Mutex::new(console));
    console::route_lines(host_line);
    CONSOLE_CPU.store(percpu::current().index(), Ordering::Release);
    SERVER.call_once(|| server);
    POLL_INTID.store(poll_intid, Ordering::Release);
    gic::set_ppi_enabled(poll_intid, true);
    arm_poll_timer();
}

/// Runs `f` on the console with its lock held (`None`: not installed).
pub fn with_console<R>(f: impl FnOnce(&mut Console) -> R) -> Option<R> {
    let mut console = CONSOLE.get()?.lock();
    OWNER.store(percpu::current().index(), Ordering::Relaxed);
    let result = f(&mut console);
    OWNER.store(usize::MAX, Ordering::Relaxed);
    Some(result)
}

/// A whole line of the hypervisor's own (its log, `STAT` lines): through
/// the console, which starts it on a terminal line of its own. On the CPU
/// that holds the console lock (a monitor command logs) it is written
/// directly: a command runs after its line's `\n`, at a line start.
fn host_line(line: &[u8]) {
    if OWNER.load(Ordering::Relaxed) == percpu::current().index() {
        console::write_bytes(line);
        return;
    }
    let written = with_console(|console| console.write_host_line(line, &mut HostUart));
    if written.is_none() {
        console::write_bytes(line);
    }
}

/// Whether `intid` is the console's poll timer.
pub fn is_poll_timer(intid: u32) -> bool {
    intid != 0 && POLL_INTID.load(Ordering::Acquire) == intid
}

/// Arms the poll timer for [`POLL_MS`] from now (which also lowers its
/// interrupt line).
pub fn arm_poll_timer() {
    let ticks = read_sysreg!(cntfrq_el0) * POLL_MS / 1000;
    // SAFETY: the EL2 physical timer is the console's alone; arming it only
    // makes it raise its PPI on this CPU after `ticks`.
    unsafe {
        crate::write_sysreg!(cnthp_tval_el2, ticks);
        crate::write_sysreg!(cnthp_ctl_el2, 1);
    }
}

/// Takes one byte of VM `vm`'s console output (written as it comes before
/// the console is installed).
pub fn guest_output(vm: usize, byte: u8) {
    // `vm` is an index of the VM table the console was built from.
    let written = with_console(|console| console.on_guest_tx_byte(VmId(vm), byte, &mut HostUart));
    if written.is_none() {
        console::write_bytes(&[byte]);
    }
}

/// Takes a run of VM `vm`'s console output under one hold of the console
/// lock, so no other CPU's output of the VM lands inside it.
pub fn guest_output_bytes(vm: usize, bytes: &[u8]) {
    let written = with_console(|console| {
        bytes
            .iter()
            .try_for_each(|&byte| console.on_guest_tx_byte(VmId(vm), byte, &mut HostUart))
    });
    if written.is_none() {
        console::write_bytes(bytes);
    }
}

/// Writes VM `vm`'s unfinished line (it ends). Never called with the
/// console lock held: the monitor only requests a stop, the VM's own CPU
/// ends it.
pub fn flush_vm(vm: usize) {
    with_console(|console| console.flush_vm(VmId(vm), &mut HostUart));
}

/// This CPU has nothing left to run: the console CPU serves the console
/// forever (see the module documentation), any other CPU halts.
pub fn park() -> ! {
    let here = percpu::current().index();
    let server = SERVER
        .get()
        .filter(|_| CONSOLE_CPU.load(Ordering::Acquire) == here);
    let Some(server) = server else {
        firmware::halt()
    };
    // SAFETY: turning the guest timers off only stops their interrupts; no
    // vCPU runs on this CPU any more.
    unsafe {
        crate::write_sysreg!(cntv_ctl_el0, 0);
        crate::write_sysreg!(cntp_ctl_el0, 0);
    }
    for timer in TimerId::ALL {
        gic::set_timer_masked(timer, true);
        gic::deactivate_timer(timer);
    }
    gic::set_ppi_enabled(gic::maintenance_intid(), false);
    server()
}
