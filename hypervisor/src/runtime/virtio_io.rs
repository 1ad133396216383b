//! Data through a VM's virtio devices: acting on what a device call asks
//! for ([`settle`]), the guest's output handed on, frames delivered into a
//! VM ([`deliver_frame`]), typed bytes into its virtio-console
//! ([`console_input`]).
//!
//! # Effects
//!
//! Every mutating call into a device returns `Effects`; [`settle`] acts on
//! them after the device lock is dropped: `interrupt` latches the device's
//! SPI in the vgic (an edge) and yields the vCPUs to kick (a vCPU absorbs
//! them itself, other contexts kick at once); `needs_reset` logs one line
//! through the VM's event log and counts; `access_error` is logged once per
//! device; `output_ready` drains the device: console bytes go to the
//! hypervisor console like PL011 bytes (prefix, focus; one console call per
//! byte, no trap per byte), a control console's to the monitor
//! (`runtime::control_port`), net frames to the switch. Draining repeats
//! while the device says more is ready.
//!
//! # Whose epoch handle
//!
//! A device access pins its own VM's memslots with the vCPU's handle. A
//! frame it sends is written into the receiving VM, pinned with a handle
//! on that VM's collector from the [`CollectorHandles`] the caller lends
//! (a vCPU's own, kept across frames: one registration per receiving VM,
//! not one per frame); so are the answers a control port writes back.
//!
//! # Who may write a VM's memory
//!
//! A frame or a typed byte is written into a VM only while it runs
//! ([`accepts_input`]: not stopping, not paused, not waiting as a migration
//! destination), checked under the device's lock: a migration pauses the
//! source and then takes every device lock for its snapshot, so no device
//! write lands in the source's memory after its last copy. Frames for a VM
//! that does not run are dropped and counted; typed bytes for a paused VM
//! wait in the console's backlog (no memory write).

use crate::devices::guest_memory::GuestMemory;
use crate::devices::vgic::VcpuSet;
use crate::devices::virtio::mmio_transport::Effects;
use crate::devices::virtio::net::DeliverOutcome;
use crate::runtime::Hardware;
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::control_port;
use crate::runtime::device_hub::HubDelivery;
use crate::runtime::slot_memory::SlotMemory;
use crate::runtime::virtio_devices::{DeviceRole, Transport, VirtioDevice};
use crate::runtime::vm_instance::Vm;
use crate::vm::run_state::Requested;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;
use crossbeam_epoch::LocalHandle;

/// Runs `f` with `vm`'s RAM as its devices see it, pinned by `handle`
/// (registered on `vm`'s collector) for the whole call; `None` when the
/// memslots cannot be read.
pub fn with_memory<H: Hardware, R>(
    vm: &Vm<H>,
    handle: &LocalHandle,
    f: impl FnOnce(&dyn GuestMemory) -> R,
) -> Option<R> {
    let guard = handle.pin();
    let slots = vm.memslots.slots(&guard).ok()?;
    let ensure_zeroed = |host, len| vm.ensure_zeroed(host, len);
    Some(f(&SlotMemory::new(slots, &ensure_zeroed)))
}

/// Whether a device may write `vm`'s memory on its own (see the module
/// doc).
pub fn accepts_input<H: Hardware>(vm: &Vm<H>) -> bool {
    vm.requested_state() == Requested::Running
        && !vm.awaiting_migration.load(Ordering::Acquire)
        && !vm.is_restarting()
}

/// Acts on `effects` of device `index` of `vm` (see the module doc), with
/// the device lock not held; `vcpu` is the vCPU whose access caused them,
/// if any (for the log); frames drained go into their VMs with `handles`.
/// Returns the vCPUs to kick.
pub fn settle<H: Hardware>(
    vm: &Vm<H>,
    index: usize,
    vcpu: Option<usize>,
    mem: &dyn GuestMemory,
    effects: Effects,
    handles: &CollectorHandles,
) -> VcpuSet {
    let Some(device) = vm.virtio.get(index) else {
        return VcpuSet::EMPTY;
    };
    let mut kicks = VcpuSet::EMPTY;
    let mut effects = effects;
    // Bounded: each round takes what the device holds, and a guest cannot
    // refill it while this CPU drains; a guest on another vCPU could, so the
    // rounds are capped and the rest waits for the next notify.
    for _ in 0..64 {
        if let Some(error) = effects.access_error
            && device.first_access_error()
        {
            vm.log_device_event(
                vcpu,
                log::Level::Warn,
                format_args!(
                    "virtio {} {index}: {error} (logged once per device)",
                    device.role.name()
                ),
            );
        }
        if let Some(error) = effects.needs_reset {
            device.needs_reset_count.fetch_add(1, Ordering::Relaxed);
            vm.log_device_event(
                vcpu,
                log::Level::Warn,
                format_args!(
                    "virtio {} {index}: device needs reset: {error}",
                    device.role.name()
                ),
            );
        }
        if effects.interrupt {
            kicks = kicks.union(inject(vm, device));
        }
        if !effects.output_ready {
            break;
        }
        effects = drain(vm, device, mem, handles);
    }
    kicks
}

/// Latches `device`'s SPI; the vCPUs to kick.
fn inject<H: Hardware>(vm: &Vm<H>, device: &VirtioDevice) -> VcpuSet {
    match vm.vgic.lock().inject_spi_edge(device.intid()) {
        Ok(kicks) => kicks,
        Err(error) => {
            log::warn!(
                "vm{}: virtio SPI {} not injected: {error:?}",
                vm.index,
                device.spi
            );
            VcpuSet::EMPTY
        }
    }
}

/// Kicks the CPUs of `kicks` (from outside the VM's vCPUs).
pub fn kick_all<H: Hardware>(vm: &Vm<H>, kicks: VcpuSet) {
    for vcpu in kicks.iter() {
        vm.kick(vcpu);
    }
}

/// Takes one round of `device`'s output and hands it on (frames into their
/// VMs with `handles`); the effects of taking it.
fn drain<H: Hardware>(
    vm: &Vm<H>,
    device: &VirtioDevice,
    mem: &dyn GuestMemory,
    handles: &CollectorHandles,
) -> Effects {
    match device.role {
        DeviceRole::Console | DeviceRole::ControlConsole => {
            let mut out = Vec::new();
            let effects = match &mut *device.transport.lock() {
                Transport::Console(t) => t.console_take_output(&mut out, mem),
                _ => Effects::default(),
            };
            if device.role == DeviceRole::Console {
                vm.console_bytes(&out);
            } else {
                // Run once the access is over (`control_port::run_pending`).
                control_port::take_output(device, &out);
            }
            effects
        }
        DeviceRole::Net => {
            let Some(net) = &device.net else {
                return Effects::default();
            };
            let mut batch = net.batch.lock();
            let effects = match &mut *device.transport.lock() {
                Transport::Net(t) => t.net_take_tx(&mut batch, mem),
                _ => Effects::default(),
            };
            // Outside the device lock: the receiver may be sending to us.
            if let Some(port) = *net.port.lock() {
                let hub = vm.device_hub;
                let delivery = HubDelivery { hub, handles };
                for frame in batch.iter() {
                    hub.switch().forward(port, frame, &delivery);
                }
            }
            batch.clear();
            effects
        }
        DeviceRole::Blk => Effects::default(),
    }
}

/// Delivers `frame` from the switch into `vm`'s virtio-net, its memory
/// pinned with the handle `handles` holds on its collector; whether the
/// device took it. Frames for a VM that does not run are dropped and
/// counted (see the module doc).
pub fn deliver_frame<H: Hardware>(vm: &Vm<H>, frame: &[u8], handles: &CollectorHandles) -> bool {
    let Some((index, device)) = vm.virtio.find(DeviceRole::Net) else {
        return false;
    };
    let handle = handles.handle(vm.collector);
    let delivered = with_memory(vm, &handle, |mem| {
        let mut transport = device.transport.lock();
        if !accepts_input(vm) {
            drop(transport);
            device
                .rx_dropped_not_running
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let Transport::Net(t) = &mut *transport else {
            return false;
        };
        let (outcome, effects) = t.net_deliver(frame, mem);
        drop(transport);
        let kicks = settle(vm, index, None, mem, effects, handles);
        kick_all(vm, kicks);
        outcome == DeliverOutcome::Delivered
    });
    delivered.unwrap_or(false)
}

/// Typed bytes for `vm`: into its virtio-console when the driver runs it
/// (a Linux guest on `console=hvc0` reads there), waiting in the console's
/// backlog while the VM is paused. `None`: the VM has no live
/// virtio-console, the bytes go to the PL011. `Some(false)`: some were
/// dropped (the backlog was full). Typed bytes come one interrupt at a time
/// on the console CPU, which keeps no handles: a handle is registered for
/// the call.
pub fn console_input<H: Hardware>(vm: &Vm<H>, bytes: &[u8]) -> Option<bool> {
    let (index, device) = vm.virtio.find(DeviceRole::Console)?;
    if !device.transport.lock().is_live() || vm.is_stopping() {
        return None;
    }
    Some(port_input(
        vm,
        index,
        device,
        bytes,
        &CollectorHandles::new(),
    ))
}

/// Writes `bytes` into console `device` (device `index` of `vm`): into the
/// guest's receive buffers while the VM runs (pinned with the handle
/// `handles` holds on its collector), else into the backlog. Whether none
/// was dropped.
pub fn port_input<H: Hardware>(
    vm: &Vm<H>,
    index: usize,
    device: &VirtioDevice,
    bytes: &[u8],
    handles: &CollectorHandles,
) -> bool {
    let handle = handles.handle(vm.collector);
    let taken = with_memory(vm, &handle, |mem| {
        let mut transport = device.transport.lock();
        let Transport::Console(t) = &mut *transport else {
            return false;
        };
        let before = t.device().counters().input_dropped;
        let effects = if accepts_input(vm) {
            t.console_input(bytes, mem)
        } else {
            t.device_mut().queue_input(bytes);
            Effects::default()
        };
        let after = t.device().counters().input_dropped;
        drop(transport);
        // Input never makes output; and this may run with the console lock
        // held (typed bytes), which draining console output would take.
        let effects = Effects {
            output_ready: false,
            ..effects
        };
        let kicks = settle(vm, index, None, mem, effects, handles);
        kick_all(vm, kicks);
        after == before
    });
    taken.unwrap_or(false)
}
