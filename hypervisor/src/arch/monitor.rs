//! The hypervisor console's input side and the monitor's machine: typed
//! bytes from the host UART go through the one [`Console`]
//! (`arch::host_console`) to the focused VM's PL011 ([`VmInputs`]) or to the
//! monitor, whose commands act on the VM table ([`MachineTarget`]).
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
//! Lock order: the console lock, then a VM's UART lock, then its vgic lock;
//! the host UART driver's lock is taken last and alone. The monitor calls
//! the VM table with the console lock held, so nothing it calls writes guest
//! output through the console: a stop is requested, and the VM's own CPU
//! ends the VM (and flushes its line). The hypervisor's `[hv]` log lines go
//! to the UART directly (the logger may run with the console lock held).
//!
//! # Input
//!
//! Bytes read from the host UART go through [`Console::on_host_rx_byte`]:
//! to the monitor after the escape key, else to the focused VM, whose PL011
//! backlog takes them; its receive interrupt line is updated in its vgic and
//! the CPUs of the vCPUs that must see it are kicked.

use crate::arch::boot::firmware;
use crate::arch::drivers::{console, gic};
use crate::arch::hardware::Vm;
use crate::arch::hardware::VmTable;
use crate::arch::host_console::{self, HostUart};
use crate::control::console::{Console, GuestInput};
use crate::control::console_mux::{ConsoleError, VmId};
use crate::control::monitor::{DirtyPages, MonitorTarget, SlotInfo, SlotRequest, VmInfo, VmState};
use crate::drivers::gic::HostIrq;
use crate::runtime::dirty_log;
use crate::runtime::live_migration::{self, MigrateError};
use crate::runtime::vm_instance::GuestUart;
use crate::runtime::vm_ops::{self, VmOpError};
use crate::vm::lifecycle::RestartError;
use crate::vm::migration::MigrationOptions;
use crate::vm::run_state::{Requested, RunStateError};
use alloc::vec::Vec;
use core::fmt;
use memslot::{DirtyLogMode, Gfn, PAGE_SHIFT, SlotFlags, SlotId};
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
                console.on_host_rx_byte(byte, &mut HostUart, &mut VmInputs, &mut MachineTarget);
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
        Err(error) => log::warn!("vm{}: UART line not updated: {error:?}", vm.index),
    }
}

/// Why the machine refused a monitor command.
#[derive(Debug)]
pub enum MonitorError {
    /// No VM with this index.
    NoSuchVm(usize),
    /// The VM's run state does not allow it (`resume` of a running VM, ...).
    State(RunStateError),
    /// A restart of the VM is under way already.
    Restart(RestartError),
    /// A migration was refused.
    Migrate(MigrateError),
    /// A memslot change failed.
    Slot(VmOpError),
    /// The slot's address or size is not a whole number of pages.
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
            Self::Restart(e) => write!(f, "{e}"),
            Self::Migrate(e) => write!(f, "{e}"),
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
            Self::Restart(e) => Some(e),
            Self::Migrate(e) => Some(e),
            _ => None,
        }
    }
}

/// The VM table as the monitor drives it.
pub struct MachineTarget;

fn vm_at(vm: VmId) -> Result<&'static Vm, MonitorError> {
    vms().get(vm.0).copied().ok_or(MonitorError::NoSuchVm(vm.0))
}

fn pages(value: u64) -> Result<u64, MonitorError> {
    if value.is_multiple_of(1 << PAGE_SHIFT) {
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
        .map_err(|e| MonitorError::Slot(VmOpError::Memslot(e)))?;
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

impl MonitorTarget for MachineTarget {
    type Error = MonitorError;

    fn vm_info(&self, vm: VmId) -> Result<VmInfo, MonitorError> {
        let vm = vm_at(vm)?;
        let mut memslots = 0;
        each_slot(vm, &mut |_| memslots += 1)?;
        let cpus = vm.cpus.iter().fold(0u64, |mask, &cpu| mask | 1 << cpu);
        Ok(VmInfo {
            state: match vm.requested_state() {
                _ if vm.is_restarting() => VmState::Restarting,
                Requested::Running => VmState::Running,
                Requested::Paused => VmState::Paused,
                Requested::StopRequested => VmState::Stopped,
            },
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
        vm_at(vm)?.request_stop().map_err(MonitorError::State)
    }

    /// Requested, not waited for: the VM's own CPUs halt and rebuild it
    /// (`arch::run`), and say so on the console.
    fn restart(&mut self, vm: VmId) -> Result<(), MonitorError> {
        vm_at(vm)?
            .request_restart(&"monitor restart")
            .map_err(MonitorError::Restart)
    }

    /// Posted to the destination's vCPU 0 (`runtime::live_migration`), which reports.
    fn migrate(
        &mut self,
        src: VmId,
        dst: VmId,
        options: MigrationOptions,
    ) -> Result<(), MonitorError> {
        live_migration::request(vm_at(src)?, vm_at(dst)?, options).map_err(MonitorError::Migrate)
    }

    fn slots(&self, vm: VmId, each: &mut dyn FnMut(SlotInfo)) -> Result<(), MonitorError> {
        each_slot(vm_at(vm)?, each)
    }

    fn add_slot(&mut self, vm: VmId, request: SlotRequest) -> Result<u64, MonitorError> {
        let vm = vm_at(vm)?;
        let base = Gfn(pages(request.ipa)?);
        let npages = pages(request.size)?;
        vm_ops::create_slot(vm, request.id, base, npages, request.flags)
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
        vm_ops::delete_slot(vm_at(vm)?, slot)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn move_slot(&mut self, vm: VmId, slot: SlotId, ipa: u64) -> Result<(), MonitorError> {
        let base = Gfn(pages(ipa)?);
        vm_ops::move_slot(vm_at(vm)?, slot, base)
            .map(|_| ())
            .map_err(MonitorError::Slot)
    }

    fn set_slot_flags(
        &mut self,
        vm: VmId,
        slot: SlotId,
        flags: SlotFlags,
    ) -> Result<(), MonitorError> {
        dirty_log::set_slot_flags(vm_at(vm)?, slot, flags).map_err(MonitorError::Slot)
    }

    fn collect_dirty(&mut self, vm: VmId, slot: SlotId) -> Result<DirtyPages, MonitorError> {
        let (ipa, bitmap) = dirty_log::collect(vm_at(vm)?, slot).map_err(MonitorError::Slot)?;
        Ok(DirtyPages { ipa, bitmap })
    }

    fn set_dirty_mode(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        chunk: u64,
    ) -> Result<(), MonitorError> {
        dirty_log::configure(vm_at(vm)?, mode, chunk).map_err(MonitorError::Slot)
    }

    fn power_off(&mut self) -> Result<(), MonitorError> {
        log::info!("monitor: power off");
        log::info!("system off");
        firmware::system_off()
    }
}
