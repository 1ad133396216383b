//! A control VM's monitor port: its second virtio-console (Linux `hvc1`)
//! runs the monitor's commands.
//!
//! What the guest writes is collected per port; each complete line (ended
//! by `\n` or `\r`) is one monitor command, run with the same parser, the
//! same command set and the same answers as the console monitor
//! (`control::monitor::run_command` over `runtime::monitor_target::MonitorMachine`
//! and the machine's VMs from the `DeviceHub`), and the answer lines are
//! written back into the port's receive side, so `echo vms > /dev/hvc1;
//! cat /dev/hvc1` works from a shell. The port has no keyboard: `focus`
//! answers an error, and the `vms` table marks no VM focused.
//!
//! # Where commands run
//!
//! On the control VM's vCPU that wrote the line, after its device access is
//! done (no device lock, no epoch guard held: a command may change memslots
//! of any VM, its own included). Every command returns at once: the
//! long ones are requests (`migrate` posts the job to the destination's
//! vCPU 0, which reports on the console as for the console monitor;
//! `stop`, `restart`, `pause` are requested and carried out by the VM's own
//! CPUs), so a command never holds the calling vCPU for longer than the
//! monitor holds the console.
//!
//! A line longer than [`MAX_LINE`] bytes is answered with an error and
//! dropped. Blank lines are ignored (`\r\n` is two line ends).
//!
//! # Terminal echo
//!
//! A terminal in its default mode echoes the answers back as commands;
//! [`PortInput`](crate::control::port_input::PortInput) recognises the
//! echo and drops it (see its module).
//!
use crate::control::console_mux::VmId;
use crate::control::monitor::{self, ReplySink};
use crate::control::port_input::MAX_LINE;
use crate::runtime::Hardware;
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::monitor_target::MonitorMachine;
use crate::runtime::virtio_devices::{DeviceRole, VirtioDevice};
use crate::runtime::virtio_io;
use crate::runtime::vm_instance::Vm;
use alloc::string::String;
use core::fmt;

/// Adds the guest's `bytes` to `device`'s received text (run by
/// [`run_pending`] once the access is over).
pub fn take_output(device: &VirtioDevice, bytes: &[u8]) {
    device.control_input.lock().push(bytes);
}

/// The answer of one command, and how it names VMs.
struct PortReply<'a, H: Hardware> {
    vms: &'a [&'static Vm<H>],
    text: String,
}

impl<H: Hardware> fmt::Write for PortReply<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.text.push_str(s);
        Ok(())
    }
}

impl<H: Hardware> ReplySink for PortReply<'_, H> {
    fn vm_count(&self) -> usize {
        self.vms.len()
    }

    fn vm_name(&self, vm: VmId) -> Option<&str> {
        self.vms.get(vm.0).map(|vm| vm.name.as_str())
    }

    fn find_vm(&self, name: &str) -> Option<VmId> {
        self.vms
            .iter()
            .position(|vm| vm.name.as_str() == name)
            .map(VmId)
    }

    fn focus(&self) -> Option<VmId> {
        None
    }

    fn set_focus(&mut self, _: VmId) -> bool {
        false
    }

    fn rx_dropped(&self, _: VmId) -> Option<u64> {
        None
    }
}

/// Runs every complete command line device `index` of `vm` (its control
/// console) holds, and writes each answer back into the port (pinned with
/// `handles`, the accessing vCPU's).
pub fn run_pending<H: Hardware>(vm: &Vm<H>, index: usize, handles: &CollectorHandles) {
    let Some(device) = vm.virtio.get(index) else {
        return;
    };
    if device.role != DeviceRole::ControlConsole {
        return;
    }
    loop {
        let Some(line) = device.control_input.lock().next_command() else {
            return;
        };
        let answer = answer(vm, &line);
        device.control_input.lock().answered(&answer);
        virtio_io::port_input(vm, index, device, answer.as_bytes(), handles);
    }
}

/// The monitor's answer to `line` from `vm`'s port.
fn answer<H: Hardware>(vm: &Vm<H>, line: &[u8]) -> String {
    if line.len() > MAX_LINE {
        return alloc::format!("error: command longer than {MAX_LINE} bytes\n");
    }
    let Ok(text) = core::str::from_utf8(line) else {
        return String::from("error: command is not text\n");
    };
    let vms = vm.device_hub.vms();
    let mut reply = PortReply {
        vms: &vms,
        text: String::new(),
    };
    let mut machine = MonitorMachine::new(vm.hw, &vms);
    log::info!(
        "vm{} ({}): control port: {}",
        vm.index,
        vm.name,
        text.trim()
    );
    // `exit` leaves nothing here: the port stays a port.
    let _ = monitor::run_command(text.trim(), &mut reply, &mut machine);
    reply.text
}
