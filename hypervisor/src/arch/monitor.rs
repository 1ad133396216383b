//! The hypervisor console on the machine: the one [`Console`] (output mux
//! and monitor, `crate::control`) behind a lock, fed by the guests' PL011
//! output, the host UART's receive interrupt and a periodic poll, and the
//! machine behind its traits: the host UART ([`ConsoleOutput`]), the VMs'
//! PL011 receive paths ([`GuestInput`]) and the VM table ([`MonitorTarget`]).
//!
//! # Where it runs
//!
//! Every CPU may run a vCPU, so the console has no CPU of its own. The host
//! UART's receive interrupt is routed to the boot CPU (`drivers::gic`), and
//! the boot CPU also arms the EL2 physical timer (`CNTHP`) every
//! [`POLL_MS`] milliseconds: the *console CPU*. Both interrupts reach it at
//! EL2 whatever it is doing: as IRQ exits while it runs a vCPU of any VM
//! (`HCR_EL2.IMO`), in its wait while its vCPU is off or its VM is paused,
//! and in [`serve_forever`] when it has no vCPU or its VM has stopped (it
//! then keeps serving the console instead of halting). A typed byte is thus
//! handled within one interrupt whatever the VMs do: a busy guest on the
//! console CPU is interrupted, a paused or stopped one does not hold it.
//!
//! # Locks
//!
//! Lock order: the console lock ([`CONSOLE`]), then a VM's UART lock, then
//! its vgic lock; the host UART driver's lock is taken last and alone. The
//! monitor calls the VM table with the console lock held, so nothing it
//! calls may write guest output through the console: pause, resume and
//! stop are requests that return at once, and a VM's unfinished line is
//! flushed ([`flush_vm`]) by the CPU that ends it, not by the monitor. The
//! hypervisor's own `[hv]` log lines go to the UART directly (the logger
//! may run with the console lock held), at a line start only when no guest
//! has a partial line out.
//!
//! # Input
//!
//! Bytes read from the host UART go through [`Console::on_host_rx_byte`]:
//! to the monitor after the escape key, else to the focused VM, whose
//! PL011 backlog takes them ([`VmInputs`]); its receive interrupt line is
//! updated in its vgic and the CPUs of the vCPUs that must see it kicked.

use crate::arch::boot::firmware;
use crate::arch::drivers::{console, gic};
use crate::arch::vm::{GuestUart, Vm, vms};
use crate::control::console::{Console, GuestInput};
use crate::control::console_mux::{ConsoleError, ConsoleOutput, VmId};
use crate::control::monitor::{MonitorTarget, SlotInfo, SlotRequest, VmInfo, VmState};
use crate::read_sysreg;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicU32, Ordering};
use memslot::{Gfn, PAGE_SHIFT, SlotFlags, SlotId};
use spin::{Mutex, Once};

/// Time between two console polls.
pub const POLL_MS: u64 = 50;

/// The console CPU (the host UART's interrupt goes to the boot CPU).
pub const CONSOLE_CPU: usize = 0;

/// The console, once the VMs exist.
static CONSOLE: Once<Mutex<Console>> = Once::new();

/// The EL2 physical timer's INTID (0: no poll timer).
static POLL_INTID: AtomicU32 = AtomicU32::new(0);

/// The host UART as the console's terminal.
pub struct HostUart;

impl ConsoleOutput for HostUart {
    fn write_bytes(&mut self, bytes: &[u8]) {
        console::write_bytes(bytes);
    }
}

/// Builds the console for the VMs of [`vms`] (on the boot CPU, after they
/// were created, before any vCPU runs) and starts the poll timer on this
/// CPU, whose interrupt is `poll_intid` (the EL2 physical timer's PPI).
pub fn start(poll_intid: u32) -> Result<(), ConsoleError> {
    let names: Vec<&str> = vms().iter().map(|vm| vm.name()).collect();
    let console = Console::new(&names)?;
    CONSOLE.call_once(|| Mutex::new(console));
    POLL_INTID.store(poll_intid, Ordering::Release);
    gic::enable_ppi(poll_intid);
    arm_poll_timer();
    Ok(())
}

/// The poll timer's INTID, if the console started one.
pub fn poll_intid() -> Option<u32> {
    match POLL_INTID.load(Ordering::Acquire) {
        0 => None,
        intid => Some(intid),
    }
}

fn arm_poll_timer() {
    let ticks = read_sysreg!(cntfrq_el0) * POLL_MS / 1000;
    // SAFETY: the EL2 physical timer is the console's alone; arming it only
    // makes it raise its PPI on this CPU after `ticks`.
    unsafe {
        crate::write_sysreg!(cnthp_tval_el2, ticks);
        crate::write_sysreg!(cnthp_ctl_el2, 1);
    }
}

/// Takes one byte of guest console output from VM `vm`.
pub fn guest_output(vm: usize, byte: u8) {
    match CONSOLE.get() {
        Some(console) => {
            // `vm` is an index of the VM table the console was built from.
            let _ = console
                .lock()
                .on_guest_tx_byte(VmId(vm), byte, &mut HostUart);
        }
        None => console::write_bytes(&[byte]),
    }
}

/// Writes VM `vm`'s unfinished line (it stopped); never call it with the
/// console lock held (from the monitor).
pub fn flush_vm(vm: usize) {
    if let Some(console) = CONSOLE.get() {
        let _ = console.lock().flush_vm(VmId(vm), &mut HostUart);
    }
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
        let Some(console) = CONSOLE.get() else {
            continue;
        };
        let mut console = console.lock();
        for &byte in &buf[..len] {
            console.on_host_rx_byte(byte, &mut HostUart, &mut VmInputs, &mut Machine);
        }
    }
}

/// The poll timer's interrupt: re-arms it and runs [`Console::poll`].
pub fn poll_tick() {
    arm_poll_timer();
    if let Some(console) = CONSOLE.get() {
        console.lock().poll(&mut HostUart);
    }
}

/// Handles one acknowledged host interrupt if it is the console's (the
/// UART's receive interrupt or the poll timer); returns whether it was.
pub fn handle_interrupt(intid: u32, uart_intid: Option<u32>) -> bool {
    if Some(intid) == uart_intid {
        host_input();
        true
    } else if Some(intid) == poll_intid() {
        poll_tick();
        true
    } else {
        false
    }
}

/// The console CPU with no vCPU to run (none of a VM, or its VM stopped):
/// serves the console's interrupts forever; every other interrupt (a stray
/// kick) is finished unhandled.
pub fn serve_forever(uart_intid: Option<u32>) -> ! {
    if !gic::is_up() || CONSOLE.get().is_none() {
        firmware::halt();
    }
    loop {
        loop {
            let ack = gic::acknowledge();
            if ack.intid >= crate::drivers::gic::SPURIOUS_FIRST {
                break;
            }
            handle_interrupt(ack.intid, uart_intid);
            gic::end_of_interrupt(ack);
        }
        gic::wait_for_wakeup();
    }
}

/// The VMs' PL011 receive paths.
pub struct VmInputs;

impl GuestInput for VmInputs {
    fn push_rx(&mut self, vm: VmId, byte: u8) -> bool {
        let Some(vm) = vms().get(vm.0) else {
            return false;
        };
        let mut uart = vm.uart.lock();
        let GuestUart {
            device, backlog, ..
        } = &mut *uart;
        let taken = backlog.push(byte);
        backlog.drain_into(device);
        drop(uart);
        update_uart_line(vm);
        taken
    }
}

/// Gives `vm`'s vgic its PL011's interrupt level when it moved, from outside
/// the VM's vCPUs, and kicks the CPUs of the vCPUs that must see it. A vgic
/// refusal (it never refuses the UART's own SPI) is logged.
fn update_uart_line(vm: &Vm) {
    let mut uart = vm.uart.lock();
    let level = uart.device.interrupt_pending();
    if uart.irq_level == level {
        return;
    }
    uart.irq_level = level;
    let result = vm.vgic.lock().set_spi_level(vm.uart_intid(), level);
    drop(uart);
    match result {
        Ok(kicks) => {
            for vcpu in kicks.iter() {
                gic::kick(vm.cpu_of(vcpu));
            }
        }
        Err(error) => log::warn!("{}: UART line not updated: {error:?}", vm.name()),
    }
}

/// Why the machine refused a monitor command.
#[derive(Debug)]
pub enum MonitorError {
    /// No VM with this index.
    NoSuchVm(usize),
    /// The VM's state does not allow it (`pause` of a stopped VM, ...).
    State(crate::arch::vm::StateError),
    /// `restart` is not supported: a VM is created once, from the boot
    /// payload, and cannot be rebuilt.
    RestartNotSupported,
    /// A memslot change failed.
    Slot(crate::arch::vm_ops::VmOpError),
    /// The slot's size or address is not a whole number of pages.
    Unaligned {
        /// The address or size.
        value: u64,
    },
}

impl fmt::Display for MonitorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSuchVm(vm) => write!(f, "no VM with id {vm}"),
            Self::State(e) => write!(f, "{e}"),
            Self::RestartNotSupported => write!(
                f,
                "restart is not supported: a VM is built once from the boot payload (stop it instead)"
            ),
            Self::Slot(e) => write!(f, "{e}"),
            Self::Unaligned { value } => {
                write!(f, "{value:#x} is not a multiple of the 4 KiB page size")
            }
        }
    }
}

impl core::error::Error for MonitorError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::State(e) => Some(e),
            Self::Slot(e) => Some(e),
            _ => None,
        }
    }
}

/// The VM table as the monitor drives it.
pub struct Machine;

fn vm_at(vm: VmId) -> Result<&'static Vm, MonitorError> {
    vms().get(vm.0).copied().ok_or(MonitorError::NoSuchVm(vm.0))
}

fn pages(value: u64) -> Result<u64, MonitorError> {
    if value % (1 << PAGE_SHIFT) == 0 {
        Ok(value >> PAGE_SHIFT)
    } else {
        Err(MonitorError::Unaligned { value })
    }
}

/// Calls `each` with every memslot of `vm` by ascending id.
fn each_slot(vm: &Vm, each: &mut dyn FnMut(SlotInfo)) -> Result<(), MonitorError> {
    let handle = vm.collector.register();
    let guard = handle.pin();
    let slots = vm
        .memslots
        .slots(&guard)
        .map_err(|e| MonitorError::Slot(crate::arch::vm_ops::VmOpError::Memslot(e)))?;
    let mut list: Vec<SlotInfo> = slots
        .iter()
        .map(|slot| SlotInfo {
            id: slot.id(),
            ipa: slot.base_gfn().0 << PAGE_SHIFT,
            size: slot.npages() << PAGE_SHIFT,
            backing: slot.backing().0,
            flags: slot.flags(),
        })
        .collect();
    drop(guard);
    list.sort_by_key(|slot| slot.id.get());
    list.into_iter().for_each(each);
    Ok(())
}

impl MonitorTarget for Machine {
    type Error = MonitorError;

    fn vm_info(&self, vm: VmId) -> Result<VmInfo, MonitorError> {
        let vm = vm_at(vm)?;
        let mut memslots = 0;
        each_slot(vm, &mut |_| memslots += 1)?;
        let cpus = (0..vm.vcpus).fold(0u64, |mask, vcpu| mask | 1 << vm.cpu_of(vcpu));
        Ok(VmInfo {
            state: monitor_state(vm),
            vcpus: vm.vcpus as u32,
            cpus,
            ram_bytes: vm.ram.size(),
            memslots,
        })
    }

    fn counters(&self, vm: VmId, each: &mut dyn FnMut(&str, u64)) -> Result<(), MonitorError> {
        let vm = vm_at(vm)?;
        for (name, value) in vm.counters.snapshot(&vm.tlb.counts()) {
            each(name, value);
        }
        Ok(())
    }

    fn pause(&mut self, vm: VmId) -> Result<(), MonitorError> {
        vm_at(vm)?.request_pause().map_err(MonitorError::State)
    }

    fn resume(&mut self, vm: VmId) -> Result<(), MonitorError> {
        vm_at(vm)?.resume().map_err(MonitorError::State)
    }

    fn stop(&mut self, vm: VmId) -> Result<(), MonitorError> {
        vm_at(vm)?
            .request_stop(crate::arch::vm::StopRequest::Monitor)
            .map_err(MonitorError::State)
    }

    fn restart(&mut self, vm: VmId) -> Result<(), MonitorError> {
        vm_at(vm)?;
        Err(MonitorError::RestartNotSupported)
    }

    fn slots(&self, vm: VmId, each: &mut dyn FnMut(SlotInfo)) -> Result<(), MonitorError> {
        each_slot(vm_at(vm)?, each)
    }

    fn add_slot(&mut self, vm: VmId, request: SlotRequest) -> Result<u64, MonitorError> {
        let vm = vm_at(vm)?;
        let base = Gfn(pages(request.ipa)?);
        let npages = pages(request.size)?;
        crate::arch::vm_ops::create_slot(vm, request.id, base, npages, request.flags)
            .map_err(MonitorError::Slot)?;
        let mut backing = 0;
        each_slot(vm, &mut |slot| {
            if slot.id == request.id {
                backing = slot.backing;
            }
        })?;
        Ok(backing)
    }

    fn delete_slot(&mut self, vm: VmId, slot: SlotId) -> Result<(), MonitorError> {
        crate::arch::vm_ops::delete_slot(vm_at(vm)?, slot)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn move_slot(&mut self, vm: VmId, slot: SlotId, ipa: u64) -> Result<(), MonitorError> {
        let base = Gfn(pages(ipa)?);
        crate::arch::vm_ops::move_slot(vm_at(vm)?, slot, base)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn set_slot_flags(
        &mut self,
        vm: VmId,
        slot: SlotId,
        flags: SlotFlags,
    ) -> Result<(), MonitorError> {
        crate::arch::vm_ops::set_slot_flags(vm_at(vm)?, slot, flags).map_err(MonitorError::Slot)
    }

    fn power_off(&mut self) -> Result<(), MonitorError> {
        log::info!("monitor: power off");
        log::info!("system off");
        firmware::system_off()
    }
}
