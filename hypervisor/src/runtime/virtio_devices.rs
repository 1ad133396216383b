//! A VM's virtio-mmio devices: which it has, where the guest finds them,
//! and the models behind them (`devices::virtio`), each behind its own lock.
//!
//! # Which devices, where
//!
//! From the VM's `vm.conf`, in this order (the plan's fixed order, so a
//! Linux guest numbers them the same way every boot): a virtio-console when
//! `console=virtio` (Linux `hvc0`); a second one wired to the monitor when
//! the VM is also `control=1` (`hvc1`, `runtime::control_port`); a
//! virtio-net when `net=NAME` (its MAC from `mac=` or derived from the VM's
//! name); a virtio-blk when `disk=N[@START+SECTORS][:ro]` (a
//! `devices::virtio::disk_window::DiskWindow` of host disk `N`). Device `i` has the
//! window and SPI `vm::layout::virtio_slot(i)`, an `MmioBus` region
//! `DeviceId::Virtio(i)`, and a `virtio,mmio` node in the guest's device
//! tree.
//!
//! # Locks
//!
//! One lock per device (the transport is `Send`, not `Sync`). Nothing that
//! takes another lock runs under it except the guest-memory accesses of the
//! model: output is taken out under the lock and handed on (console bytes
//! to the hypervisor console, frames to the switch) after it is dropped, so
//! two VMs sending to each other never hold each other's locks, and the
//! console lock (taken before a device lock by the input path) is never
//! taken under one.

use crate::control::port_input::PortInput;
use crate::devices::guest_memory::GuestMemory;
use crate::devices::virtio::blk::{Blk, BlkCounters, BlkState};
use crate::devices::virtio::block_backend::BlockBackend;
use crate::devices::virtio::console::{Console, ConsoleCounters, ConsoleState};
use crate::devices::virtio::disk_window::{DiskWindow, WindowOutside};
use crate::devices::virtio::mmio_transport::{
    AccessError, Effects, F_RING_EVENT_IDX, F_RING_INDIRECT_DESC, F_VERSION_1, MmioTransport,
    SnapshotError, TransportState,
};
use crate::devices::virtio::net::{FrameBatch, Net, NetCounters, NetState};
use crate::devices::virtio::net_switch::{NetSwitch, PortId, SwitchError};
use crate::exit::mmio::{DeviceId, MmioBus, MmioRegion, RegionConflict};
use crate::platform::ranges::PhysRange;
use crate::vm::device_tree::GuestVirtio;
use crate::vm::layout::{GUEST_VIRTIO_MAX, virtio_slot};
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use boot_payload::vmconf::{ConsoleKind, DiskConf, VmConf};
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use spin::Mutex;

/// What a device is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRole {
    /// The VM's console (`hvc0`), merged into the hypervisor console.
    Console,
    /// A control VM's port to the monitor (`hvc1`).
    ControlConsole,
    /// Its network interface on the switch.
    Net,
    /// Its disk.
    Blk,
}

impl DeviceRole {
    /// The role's name in `devices VM` and the log.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Console => "console",
            Self::ControlConsole => "control",
            Self::Net => "net",
            Self::Blk => "blk",
        }
    }
}

/// The transport of one device with its model (the transport is generic,
/// so each kind has its own variant).
pub enum Transport {
    /// A virtio-console.
    Console(MmioTransport<Console>),
    /// A virtio-net.
    Net(MmioTransport<Net>),
    /// A virtio-blk.
    Blk(MmioTransport<Blk>),
}

/// Runs `$body` with `$t` bound to the transport whatever its kind.
macro_rules! each_kind {
    ($transport:expr, $t:ident => $body:expr) => {
        match $transport {
            Transport::Console($t) => $body,
            Transport::Net($t) => $body,
            Transport::Blk($t) => $body,
        }
    };
}

impl Transport {
    /// A register read (`Err`: answer 0).
    pub fn read(&mut self, offset: u64, size: u8) -> Result<u64, AccessError> {
        each_kind!(self, t => t.read(offset, size))
    }

    /// A register write.
    pub fn write(&mut self, offset: u64, size: u8, value: u64, mem: &dyn GuestMemory) -> Effects {
        each_kind!(self, t => t.write(offset, size, value, mem))
    }

    /// `Status`.
    pub fn status(&self) -> u8 {
        each_kind!(self, t => t.status())
    }

    /// The features the driver chose.
    pub fn driver_features(&self) -> u64 {
        each_kind!(self, t => t.driver_features())
    }

    /// `InterruptStatus`.
    pub fn interrupt_status(&self) -> u32 {
        each_kind!(self, t => t.interrupt_status())
    }

    /// Whether the driver runs the device.
    pub fn is_live(&self) -> bool {
        each_kind!(self, t => t.is_live())
    }

    /// Ring errors since creation.
    pub fn ring_errors(&self) -> u64 {
        each_kind!(self, t => t.ring_errors())
    }

    /// Refused register accesses since creation.
    pub fn access_errors(&self) -> u64 {
        each_kind!(self, t => t.access_errors())
    }

    /// Back to the power-on state (a restart; the model keeps its backend,
    /// MAC and input backlog).
    pub fn reset(&mut self) {
        each_kind!(self, t => t.reset())
    }

    /// The whole state as plain data (a migration).
    pub fn snapshot(&self) -> DeviceSnapshot {
        match self {
            Self::Console(t) => DeviceSnapshot::Console(t.snapshot()),
            Self::Net(t) => DeviceSnapshot::Net(t.snapshot()),
            Self::Blk(t) => DeviceSnapshot::Blk(t.snapshot()),
        }
    }

    /// Takes a snapshot's state; refused whole when it is of another kind
    /// or does not fit this device.
    pub fn restore(&mut self, snapshot: &DeviceSnapshot) -> Result<(), SnapshotError> {
        match (self, snapshot) {
            (Self::Console(t), DeviceSnapshot::Console(s)) => t.restore(s),
            (Self::Net(t), DeviceSnapshot::Net(s)) => t.restore(s),
            (Self::Blk(t), DeviceSnapshot::Blk(s)) => t.restore(s),
            _ => Err(SnapshotError::Mismatch),
        }
    }
}

/// A device's state carried by a migration.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSnapshot {
    /// A console's.
    Console(TransportState<ConsoleState>),
    /// A net's.
    Net(TransportState<NetState>),
    /// A blk's.
    Blk(TransportState<BlkState>),
}

impl DeviceSnapshot {
    /// `InterruptStatus` at the snapshot.
    pub fn interrupt_status(&self) -> u32 {
        match self {
            Self::Console(s) => s.interrupt_status,
            Self::Net(s) => s.interrupt_status,
            Self::Blk(s) => s.interrupt_status,
        }
    }
}

/// What a net device adds: its network, its switch port, the batch its
/// frames are taken into.
pub struct NetPortState {
    /// The network's name (`net=`).
    pub network: String,
    /// Its port on the switch while attached.
    pub port: Mutex<Option<PortId>>,
    /// Frames taken from the guest, forwarded outside the device lock (one
    /// per device: swapping keeps the allocations).
    pub batch: Mutex<FrameBatch>,
}

/// One virtio-mmio device of a VM.
pub struct VirtioDevice {
    /// What it is for.
    pub role: DeviceRole,
    /// Its register window.
    pub window: PhysRange,
    /// Its SPI number (INTID `32 + spi`).
    pub spi: u32,
    /// The register file, queues and model.
    pub transport: Mutex<Transport>,
    /// The network side of a net device.
    pub net: Option<NetPortState>,
    /// The disk a blk device serves (`disk=`).
    pub disk: Option<DiskConf>,
    /// A control console's received command text and echo guard.
    pub control_input: Mutex<PortInput>,
    /// Times the device entered `DEVICE_NEEDS_RESET`.
    pub needs_reset_count: AtomicU64,
    /// Frames for it dropped because its VM was not running (stopped,
    /// paused, migrating).
    pub rx_dropped_not_running: AtomicU64,
    /// Console bytes for it dropped (a stopped VM).
    pub input_dropped_not_running: AtomicU64,
    access_error_logged: AtomicBool,
}

impl VirtioDevice {
    fn new(role: DeviceRole, index: usize, transport: Transport) -> Self {
        let (window, spi) = virtio_slot(index);
        Self {
            role,
            window,
            spi,
            transport: Mutex::new(transport),
            net: None,
            disk: None,
            control_input: Mutex::new(PortInput::default()),
            needs_reset_count: AtomicU64::new(0),
            rx_dropped_not_running: AtomicU64::new(0),
            input_dropped_not_running: AtomicU64::new(0),
            access_error_logged: AtomicBool::new(false),
        }
    }

    /// The guest INTID of its SPI.
    pub const fn intid(&self) -> u32 {
        32 + self.spi
    }

    /// True the first time only: an access error of this device is logged
    /// once.
    pub fn first_access_error(&self) -> bool {
        !self.access_error_logged.swap(true, Ordering::Relaxed)
    }

    /// Its switch port, if it is a net device attached to the switch.
    pub fn port(&self) -> Option<PortId> {
        self.net.as_ref().and_then(|net| *net.port.lock())
    }
}

/// Why a VM's devices could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VirtioError {
    /// `disk=N` names a host disk the machine does not have.
    NoHostDisk(u32),
    /// The disk window does not fit the host disk.
    DiskWindow {
        /// The host disk.
        disk: u32,
        /// What is wrong.
        error: WindowOutside,
    },
    /// The switch refused the VM's port.
    Switch(SwitchError),
    /// A window overlaps another device.
    Window(RegionConflict),
}

impl fmt::Display for VirtioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoHostDisk(disk) => write!(
                f,
                "disk={disk}: the machine has no host disk {disk} (0 is the first disk given to QEMU)"
            ),
            Self::DiskWindow { disk, error } => write!(f, "disk={disk}: {error}"),
            Self::Switch(e) => write!(f, "net: {e}"),
            Self::Window(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for VirtioError {}

/// The virtio devices of one VM, in guest order.
#[derive(Default)]
pub struct VirtioDevices {
    devices: Vec<VirtioDevice>,
}

impl VirtioDevices {
    /// The devices `conf` asks for (see the module doc) for VM `vm_name`,
    /// control VM when `control`; `host_disk` finds host disk `N`.
    pub fn from_conf(
        conf: &VmConf,
        vm_name: &str,
        control: bool,
        host_disk: impl Fn(u32) -> Option<&'static dyn BlockBackend>,
    ) -> Result<Self, VirtioError> {
        let mut devices = Vec::new();
        if conf.console_kind() == ConsoleKind::Virtio {
            let at = devices.len();
            devices.push(VirtioDevice::new(
                DeviceRole::Console,
                at,
                Transport::Console(MmioTransport::new(Console::new())),
            ));
            if control {
                let at = devices.len();
                devices.push(VirtioDevice::new(
                    DeviceRole::ControlConsole,
                    at,
                    Transport::Console(MmioTransport::new(Console::new())),
                ));
            }
        }
        if let Some(network) = conf.net {
            let at = devices.len();
            let mac = conf.mac_for(vm_name);
            let mut device = VirtioDevice::new(
                DeviceRole::Net,
                at,
                Transport::Net(MmioTransport::new(Net::new(mac))),
            );
            device.net = Some(NetPortState {
                network: String::from(network.as_str()),
                port: Mutex::new(None),
                batch: Mutex::new(FrameBatch::new()),
            });
            devices.push(device);
        }
        if let Some(disk) = conf.disk {
            let host = host_disk(disk.host).ok_or(VirtioError::NoHostDisk(disk.host))?;
            let window = DiskWindow::new(host, disk.start_sector, disk.sectors, disk.read_only)
                .map_err(|error| VirtioError::DiskWindow {
                    disk: disk.host,
                    error,
                })?;
            let at = devices.len();
            let mut device = VirtioDevice::new(
                DeviceRole::Blk,
                at,
                Transport::Blk(MmioTransport::new(Blk::new(Arc::new(window)))),
            );
            device.disk = Some(disk);
            devices.push(device);
        }
        debug_assert!(devices.len() <= GUEST_VIRTIO_MAX);
        Ok(Self { devices })
    }

    /// Every device, in guest order.
    pub fn iter(&self) -> impl Iterator<Item = &VirtioDevice> {
        self.devices.iter()
    }

    /// Device `index` (its `DeviceId::Virtio` number).
    pub fn get(&self, index: usize) -> Option<&VirtioDevice> {
        self.devices.get(index)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the VM has none.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The first device with `role`, and its index.
    pub fn find(&self, role: DeviceRole) -> Option<(usize, &VirtioDevice)> {
        self.devices
            .iter()
            .enumerate()
            .find(|(_, d)| d.role == role)
    }

    /// The guest device tree's nodes.
    pub fn guest_nodes(&self) -> Vec<GuestVirtio> {
        self.devices
            .iter()
            .map(|d| GuestVirtio {
                window: d.window,
                spi: d.spi,
            })
            .collect()
    }

    /// Adds every window to the VM's bus.
    pub fn add_regions(&self, mmio: &mut MmioBus) -> Result<(), VirtioError> {
        for (index, d) in self.devices.iter().enumerate() {
            mmio.add(MmioRegion {
                base: d.window.start,
                size: d.window.size(),
                device: DeviceId::Virtio(index as u8),
            })
            .map_err(VirtioError::Window)?;
        }
        Ok(())
    }

    /// Attaches the net device (if any) to `switch` as `owner`'s port.
    pub fn attach(&self, switch: &NetSwitch, owner: u64) -> Result<(), SwitchError> {
        for net in self.devices.iter().filter_map(|d| d.net.as_ref()) {
            let mut port = net.port.lock();
            if port.is_none() {
                *port = Some(switch.attach(&net.network, owner)?);
            }
        }
        Ok(())
    }

    /// Detaches the net device's port (a stop, an end, a restart): frames
    /// for the VM are dropped from here on.
    pub fn detach(&self, switch: &NetSwitch) {
        for net in self.devices.iter().filter_map(|d| d.net.as_ref()) {
            if let Some(port) = net.port.lock().take() {
                // The port is this device's: it cannot be missing.
                let _ = switch.detach(port);
            }
        }
    }

    /// Every device back to its power-on state (a restart).
    pub fn reset(&self) {
        for d in &self.devices {
            d.transport.lock().reset();
            d.control_input.lock().clear();
            if let Some(net) = &d.net {
                net.batch.lock().clear();
            }
        }
    }
}

/// The names of the status bits set in `status`, `|`-separated (`-` for
/// none).
pub fn status_names(status: u8) -> String {
    const NAMES: [(u8, &str); 6] = [
        (1, "ACKNOWLEDGE"),
        (2, "DRIVER"),
        (8, "FEATURES_OK"),
        (4, "DRIVER_OK"),
        (64, "NEEDS_RESET"),
        (128, "FAILED"),
    ];
    let mut text = String::new();
    for (bit, name) in NAMES {
        if status & bit != 0 {
            if !text.is_empty() {
                text.push('|');
            }
            text.push_str(name);
        }
    }
    if text.is_empty() {
        text.push('-');
    }
    text
}

/// The transport features in `features` by name, then the rest in hex.
pub fn feature_names(features: u64) -> String {
    const NAMES: [(u64, &str); 3] = [
        (F_VERSION_1, "VERSION_1"),
        (F_RING_EVENT_IDX, "EVENT_IDX"),
        (F_RING_INDIRECT_DESC, "INDIRECT_DESC"),
    ];
    let mut text = String::new();
    let mut rest = features;
    for (bit, name) in NAMES {
        if features & bit != 0 {
            if !text.is_empty() {
                text.push('|');
            }
            text.push_str(name);
            rest &= !bit;
        }
    }
    if rest != 0 || text.is_empty() {
        if !text.is_empty() {
            text.push('|');
        }
        text.push_str(&alloc::format!("{rest:#x}"));
    }
    text
}

/// A device's counters, whatever its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceCounters {
    /// A console's.
    Console(ConsoleCounters),
    /// A net's.
    Net(NetCounters),
    /// A blk's.
    Blk(BlkCounters),
}

impl Transport {
    /// The model's counters.
    pub fn counters(&self) -> DeviceCounters {
        match self {
            Self::Console(t) => DeviceCounters::Console(t.device().counters()),
            Self::Net(t) => DeviceCounters::Net(t.device().counters()),
            Self::Blk(t) => DeviceCounters::Blk(t.device().counters()),
        }
    }
}
