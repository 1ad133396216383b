//! Host tests of the VMs' virtio devices on the fake machine: a small
//! guest driver (registers through `device_access::virtio_access` as a
//! trapped access would reach them, rings and buffers written into the
//! VM's RAM) drives consoles, net devices on the switch and disks, through
//! creation, output, input, stop, restart and migration.

use std::string::String;
use std::sync::atomic::Ordering;
use std::vec;
use std::vec::Vec;

use boot_payload::vmconf::{ConsoleKind, DiskConf, VmConf};
use boot_payload::vmname::VmName;

use super::{FakeAccessingVcpu, FakeHardware, VecDisk, conf, create, options, slot0};
use crate::control::console::GuestInput;
use crate::control::console_mux::VmId;
use crate::control::monitor::MonitorTarget;
use crate::devices::virtio::mmio_transport::{
    REG_DEVICE_FEATURES, REG_DEVICE_FEATURES_SEL, REG_DEVICE_ID, REG_DRIVER_FEATURES,
    REG_DRIVER_FEATURES_SEL, REG_INTERRUPT_STATUS, REG_MAGIC_VALUE, REG_QUEUE_DESC_HIGH,
    REG_QUEUE_DESC_LOW, REG_QUEUE_DEVICE_HIGH, REG_QUEUE_DEVICE_LOW, REG_QUEUE_DRIVER_HIGH,
    REG_QUEUE_DRIVER_LOW, REG_QUEUE_NOTIFY, REG_QUEUE_NUM, REG_QUEUE_READY, REG_QUEUE_SEL,
    REG_STATUS,
};
use crate::exit::esr::DataAccess;
use crate::exit::mmio::DeviceId;
use crate::runtime::device_access::{self, AccessingVcpu};
use crate::runtime::live_migration;
use crate::runtime::monitor_target::{MonitorMachine, VmConsoleInputs};
use crate::runtime::restart;
use crate::runtime::virtio_devices::{DeviceRole, Transport, VirtioError};
use crate::runtime::vm_instance::{Vm, VmError};
use crate::runtime::vm_ops;
use crate::runtime::vm_table::VmTable;
use crate::vm::layout::{GUEST_GICD_BASE, GUEST_RAM_BASE};

const STATUS_ACKNOWLEDGE: u32 = 1;
const STATUS_DRIVER: u32 = 2;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;
const DESC_NEXT: u16 = 1;
const DESC_WRITE: u16 = 2;
/// `virtio_net_hdr` with `VERSION_1`.
const NET_HDR: usize = 12;
/// Entries of every queue the driver sets up.
const QUEUE_SIZE: u16 = 16;
/// Where the driver's rings go (after the kernel and device tree).
const RINGS: u64 = GUEST_RAM_BASE + (3 << 20);
/// Where its buffers go.
const BUFFERS: u64 = GUEST_RAM_BASE + (5 << 20);

/// A VM of 8 MiB on `cpu` with the devices `f` adds.
fn vm_conf(cpu: u32, start: bool, f: impl FnOnce(&mut VmConf)) -> VmConf {
    let mut conf = conf(8, &[cpu], start);
    f(&mut conf);
    conf
}

fn net(name: &str) -> impl FnOnce(&mut VmConf) {
    let name = VmName::new(name).unwrap();
    move |c: &mut VmConf| c.net = Some(name)
}

/// The host address of the `len` bytes at guest address `ipa` (slot 0's
/// backing now), as the guest reaches them: their chunks zeroed first if
/// the guest had not used them (the stage-2 fault that maps them would,
/// `vm::lazy_zero`).
fn host(vm: &Vm<FakeHardware>, ipa: u64, len: usize) -> *mut u8 {
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let addr = spec.backing.0 + (ipa - GUEST_RAM_BASE);
    vm.ensure_zeroed(addr, len as u64);
    addr as *mut u8
}

fn gwrite(vm: &Vm<FakeHardware>, ipa: u64, bytes: &[u8]) {
    // SAFETY: inside the VM's RAM slot's backing, a live host allocation.
    unsafe {
        core::ptr::copy_nonoverlapping(bytes.as_ptr(), host(vm, ipa, bytes.len()), bytes.len())
    };
}

fn gread(vm: &Vm<FakeHardware>, ipa: u64, len: usize) -> Vec<u8> {
    // SAFETY: as in `gwrite`.
    unsafe { core::slice::from_raw_parts(host(vm, ipa, len), len).to_vec() }
}

fn gread_u16(vm: &Vm<FakeHardware>, ipa: u64) -> u16 {
    u16::from_le_bytes(gread(vm, ipa, 2).try_into().unwrap())
}

fn gread_u32(vm: &Vm<FakeHardware>, ipa: u64) -> u32 {
    u32::from_le_bytes(gread(vm, ipa, 4).try_into().unwrap())
}

/// Whether SPI INTID `intid` is pending in `vm`'s vgic (`GICD_ISPENDR`).
fn spi_pending(vm: &Vm<FakeHardware>, intid: u32) -> bool {
    let reg = GUEST_GICD_BASE + 0x200 + 4 * u64::from(intid / 32);
    let bits = vm.vgic.lock().mmio_read(reg, 4).unwrap();
    bits & (1 << (intid % 32)) != 0
}

/// The guest enables SPI INTID `intid` in group 1, routed to vCPU 0, as
/// its GIC driver would (so latching it kicks vCPU 0).
fn enable_spi(vm: &Vm<FakeHardware>, intid: u32) {
    let mut gic = vm.vgic.lock();
    let bit = 1u64 << (intid % 32);
    let word = 4 * u64::from(intid / 32);
    gic.mmio_write(GUEST_GICD_BASE, 4, 0x2).unwrap();
    gic.mmio_write(GUEST_GICD_BASE + 0x80 + word, 4, bit)
        .unwrap();
    gic.mmio_write(GUEST_GICD_BASE + 0x6000 + 8 * u64::from(intid), 4, 0)
        .unwrap();
    gic.mmio_write(GUEST_GICD_BASE + 0x100 + word, 4, bit)
        .unwrap();
}

/// A guest driver of one virtio-mmio device of a VM.
struct Driver {
    vcpu: FakeAccessingVcpu,
    device: u8,
    next_desc: [u16; 2],
    avail_idx: [u16; 2],
}

impl Driver {
    fn access(register: u8) -> DataAccess {
        DataAccess {
            size: 4,
            sign_extend: false,
            register,
            sixty_four: false,
        }
    }

    fn write(&mut self, offset: u64, value: u32) {
        self.vcpu.x[1] = u64::from(value);
        device_access::virtio_access(&mut self.vcpu, self.device, true, Self::access(1), offset)
            .unwrap();
    }

    fn read(&mut self, offset: u64) -> u32 {
        device_access::virtio_access(&mut self.vcpu, self.device, false, Self::access(2), offset)
            .unwrap();
        self.vcpu.x[2] as u32
    }

    fn queue_base(&self, queue: u16) -> u64 {
        RINGS + u64::from(self.device) * 0x10000 + u64::from(queue) * 0x4000
    }

    /// Brings device `device` of `vm` up with both its queues (without
    /// EVENT_IDX and indirect descriptors: every used buffer interrupts).
    fn start(vm: &'static Vm<FakeHardware>, device: u8) -> Self {
        let mut d = Self {
            vcpu: FakeAccessingVcpu::of(vm),
            device,
            next_desc: [0; 2],
            avail_idx: [0; 2],
        };
        assert_eq!(d.read(REG_MAGIC_VALUE), 0x7472_6976);
        d.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        d.write(REG_DEVICE_FEATURES_SEL, 0);
        let low = d.read(REG_DEVICE_FEATURES) & !(1 << 28 | 1 << 29);
        d.write(REG_DRIVER_FEATURES_SEL, 0);
        d.write(REG_DRIVER_FEATURES, low);
        d.write(REG_DRIVER_FEATURES_SEL, 1);
        d.write(REG_DRIVER_FEATURES, 1); // VERSION_1
        d.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        let queues = if d.read(REG_DEVICE_ID) == 2 { 1 } else { 2 };
        for queue in 0..queues {
            let base = d.queue_base(queue);
            gwrite(vm, base, &[0; 0x3000]);
            d.write(REG_QUEUE_SEL, u32::from(queue));
            d.write(REG_QUEUE_NUM, u32::from(QUEUE_SIZE));
            d.write(REG_QUEUE_DESC_LOW, base as u32);
            d.write(REG_QUEUE_DESC_HIGH, (base >> 32) as u32);
            d.write(REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
            d.write(REG_QUEUE_DRIVER_HIGH, 0);
            d.write(REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
            d.write(REG_QUEUE_DEVICE_HIGH, 0);
            d.write(REG_QUEUE_READY, 1);
        }
        d.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        d
    }

    /// Posts the chain `buffers` (address, length, device-writable) on
    /// `queue`; notifies when `notify`.
    fn post(&mut self, queue: u16, buffers: &[(u64, u32, bool)], notify: bool) {
        let vm = self.vcpu.vm;
        let base = self.queue_base(queue);
        let q = usize::from(queue);
        let head = self.next_desc[q];
        for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
            let index = (head + i as u16) % QUEUE_SIZE;
            let last = i + 1 == buffers.len();
            let mut desc = Vec::new();
            desc.extend_from_slice(&addr.to_le_bytes());
            desc.extend_from_slice(&len.to_le_bytes());
            let flags = if last { 0 } else { DESC_NEXT } | if writable { DESC_WRITE } else { 0 };
            desc.extend_from_slice(&flags.to_le_bytes());
            desc.extend_from_slice(&((index + 1) % QUEUE_SIZE).to_le_bytes());
            gwrite(vm, base + 16 * u64::from(index), &desc);
        }
        self.next_desc[q] = (head + buffers.len() as u16) % QUEUE_SIZE;
        let slot = self.avail_idx[q] % QUEUE_SIZE;
        gwrite(
            vm,
            base + 0x1000 + 4 + 2 * u64::from(slot),
            &head.to_le_bytes(),
        );
        self.avail_idx[q] = self.avail_idx[q].wrapping_add(1);
        gwrite(vm, base + 0x1000 + 2, &self.avail_idx[q].to_le_bytes());
        if notify {
            self.write(REG_QUEUE_NOTIFY, u32::from(queue));
        }
    }

    /// The used ring's index of `queue`.
    fn used_idx(&self, queue: u16) -> u16 {
        gread_u16(self.vcpu.vm, self.queue_base(queue) + 0x2000 + 2)
    }

    /// The length the device wrote in used entry `n` of `queue`.
    fn used_len(&self, queue: u16, n: u16) -> u32 {
        let at = self.queue_base(queue) + 0x2000 + 4 + 8 * u64::from(n % QUEUE_SIZE) + 4;
        gread_u32(self.vcpu.vm, at)
    }
}

/// An Ethernet frame from `src` to `dst` with `payload`.
fn frame(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.extend_from_slice(payload);
    f
}

fn mac_of(vm: &Vm<FakeHardware>) -> [u8; 6] {
    let (_, device) = vm.virtio.find(DeviceRole::Net).unwrap();
    match &*device.transport.lock() {
        Transport::Net(t) => t.device().mac(),
        _ => panic!("not a net device"),
    }
}

/// Driver `d` writes `bytes` at `at` and hands them to its device as one
/// device-readable buffer on `queue` (a console's or net device's transmit
/// queue 1), with a notify.
fn transmit(d: &mut Driver, queue: u16, at: u64, bytes: &[u8]) {
    gwrite(d.vcpu.vm, at, bytes);
    d.post(queue, &[(at, bytes.len() as u32, false)], true);
}

/// `vm` sends `f` on its net device (driver `d`, tx queue 1), behind a
/// zero `virtio_net_hdr`, from `at`.
fn send(d: &mut Driver, f: &[u8], at: u64) {
    let mut buf = vec![0u8; NET_HDR];
    buf.extend_from_slice(f);
    transmit(d, 1, at, &buf);
}

/// Driver `d`'s VM broadcasts a frame of `payload` from its own MAC (from
/// `at`); the frame.
fn broadcast(d: &mut Driver, payload: &[u8], at: u64) -> Vec<u8> {
    let f = frame([0xff; 6], mac_of(d.vcpu.vm), payload);
    send(d, &f, at);
    f
}

/// `VIRTIO_BLK_T_IN` and `VIRTIO_BLK_T_OUT`.
const BLK_T_IN: u32 = 0;
const BLK_T_OUT: u32 = 1;

/// Driver `d` of a virtio-blk device (queue 0) moves one sector at
/// `sector` from (`BLK_T_IN`) or to (`BLK_T_OUT`) its buffer at `data`:
/// the request header at `BUFFERS`, the status byte at `status`. The
/// status the device wrote (0xff: none).
fn blk_request(d: &mut Driver, kind: u32, sector: u64, data: u64, status: u64) -> u8 {
    let mut header = Vec::new();
    header.extend_from_slice(&kind.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&sector.to_le_bytes());
    gwrite(d.vcpu.vm, BUFFERS, &header);
    gwrite(d.vcpu.vm, status, &[0xff]);
    d.post(
        0,
        &[
            (BUFFERS, 16, false),
            (data, 512, kind == BLK_T_IN),
            (status, 1, true),
        ],
        true,
    );
    gread(d.vcpu.vm, status, 1)[0]
}

/// Posts one receive buffer of 2 KiB at `at` on `d`'s rx queue.
fn post_rx(d: &mut Driver, at: u64) {
    d.post(0, &[(at, 2048, true)], true);
}

#[test]
fn devices_come_from_vm_conf_in_order_with_windows_spis_and_device_tree_nodes() {
    let hw = FakeHardware::new();
    hw.disks.lock().unwrap().push(VecDisk::new(64, false));
    hw.disks.lock().unwrap().push(VecDisk::new(4096, false));
    let all = vm_conf(0, true, |c| {
        c.console = Some(ConsoleKind::Virtio);
        c.control = Some(true);
        c.net = Some(VmName::new("lan").unwrap());
        c.disk = Some(DiskConf {
            host: 1,
            start_sector: 2048,
            sectors: Some(1024),
            read_only: true,
        });
    });
    let vms = create(
        hw,
        &[
            ("all", all),
            ("plain", conf(8, &[1], true)),
            (
                "noctl",
                vm_conf(2, true, |c| c.console = Some(ConsoleKind::Virtio)),
            ),
        ],
    );
    let roles: Vec<DeviceRole> = vms[0].virtio.iter().map(|d| d.role).collect();
    assert_eq!(
        roles,
        [
            DeviceRole::Console,
            DeviceRole::ControlConsole,
            DeviceRole::Net,
            DeviceRole::Blk
        ]
    );
    for (i, d) in vms[0].virtio.iter().enumerate() {
        assert_eq!(d.window.start, 0x0a00_0000 + 0x200 * i as u64);
        assert_eq!(d.spi, 16 + i as u32);
        assert_eq!(
            vms[0].mmio.find(d.window.start + 0x70, 4),
            Ok((DeviceId::Virtio(i as u8), 0x70))
        );
    }
    let dtb = &vms[0].boot.dtb;
    let nodes = dtb.windows(11).filter(|w| w == b"virtio,mmio").count();
    assert_eq!(nodes, 4);
    assert!(vms[1].virtio.is_empty());
    assert!(!vms[1].boot.dtb.windows(11).any(|w| w == b"virtio,mmio"));
    assert_eq!(vms[2].virtio.len(), 1, "no control port without control=1");
    // The disk window: 1024 sectors, read-only by `:ro`; the net device on
    // its network with the MAC derived from the name.
    let (_, blk) = vms[0].virtio.find(DeviceRole::Blk).unwrap();
    let mut d = Driver::start(vms[0], 3);
    assert_eq!(d.read(0x100), 1024, "capacity (low word)");
    assert_eq!(d.read(REG_DEVICE_FEATURES_SEL), 0);
    d.write(REG_DEVICE_FEATURES_SEL, 0);
    assert_ne!(d.read(REG_DEVICE_FEATURES) & (1 << 5), 0, "VIRTIO_BLK_F_RO");
    assert!(blk.disk.unwrap().read_only);
    let (_, net) = vms[0].virtio.find(DeviceRole::Net).unwrap();
    assert!(net.port().is_some());
    assert_eq!(
        mac_of(vms[0]),
        VmConf::default().mac_for("all"),
        "the MAC derived from the VM's name"
    );
}

#[test]
fn a_missing_disk_or_a_window_past_its_end_refuses_the_vm() {
    let hw = FakeHardware::new();
    hw.disks.lock().unwrap().push(VecDisk::new(100, false));
    let try_disk = |disk: DiskConf| {
        let named = [boot_payload::NamedPayload {
            name: String::from("d"),
            payload: boot_payload::Payload {
                kernel: super::kernel(),
                conf: vm_conf(0, true, |c| c.disk = Some(disk)),
                ..boot_payload::Payload::default()
            },
        }];
        let archive: &'static [u8] = Vec::leak(boot_payload::write_several(&named).unwrap());
        let parsed = boot_payload::VmsRef::parse(archive).unwrap();
        crate::runtime::vm_instance::create_vm(
            hw,
            &super::boot_info(4),
            0,
            &parsed.as_slice()[0],
            hw.hub,
        )
        .err()
    };
    let err = try_disk(DiskConf {
        host: 1,
        ..DiskConf::default()
    });
    assert!(matches!(
        err,
        Some(VmError::Virtio(VirtioError::NoHostDisk(1)))
    ));
    let err = try_disk(DiskConf {
        host: 0,
        start_sector: 50,
        sectors: Some(51),
        read_only: false,
    });
    let Some(err) = err else {
        panic!("a window past the disk's end was accepted")
    };
    assert!(matches!(
        err,
        VmError::Virtio(VirtioError::DiskWindow { disk: 0, .. })
    ));
    assert!(
        std::format!("{err}")
            .contains("disk=0: 51 sectors from sector 50 do not fit a disk of 100 sectors"),
        "{err}"
    );
    assert!(
        try_disk(DiskConf {
            host: 0,
            start_sector: 50,
            sectors: Some(50),
            read_only: false,
        })
        .is_none()
    );
}

#[test]
fn console_output_reaches_the_vms_console_and_interrupts() {
    let hw = FakeHardware::new();
    let vm = create(
        hw,
        &[(
            "c",
            vm_conf(0, true, |c| c.console = Some(ConsoleKind::Virtio)),
        )],
    )[0];
    let mut d = Driver::start(vm, 0);
    hw.output.lock().unwrap().clear();
    transmit(&mut d, 1, BUFFERS, b"hello hvc0\n");
    let out: Vec<u8> = hw
        .output
        .lock()
        .unwrap()
        .iter()
        .filter(|(v, _)| *v == 0)
        .map(|&(_, b)| b)
        .collect();
    assert_eq!(out, b"hello hvc0\n");
    assert_eq!(d.used_idx(1), 1);
    assert!(
        spi_pending(vm, 32 + 16),
        "the console's SPI was not latched"
    );
    assert!(d.vcpu.calls.contains(&"absorb"), "{:?}", d.vcpu.calls);
    assert_eq!(d.read(REG_INTERRUPT_STATUS), 1);
}

#[test]
fn typed_bytes_go_to_a_live_virtio_console_else_to_the_pl011() {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[(
            "c",
            vm_conf(0, true, |c| c.console = Some(ConsoleKind::Virtio)),
        )],
    );
    let vm = vms[0];
    let vms: &'static [&'static Vm<FakeHardware>] = Vec::leak(vms);
    let mut inputs = VmConsoleInputs::new(vms);
    // Before the driver runs the console: the PL011 takes it.
    assert!(inputs.push_rx(VmId(0), b'a'));
    assert_eq!(
        vm.uart.lock().device.read(0).unwrap() & 0xff,
        u32::from(b'a')
    );
    let mut d = Driver::start(vm, 0);
    d.post(0, &[(BUFFERS, 64, true)], true);
    enable_spi(vm, 32 + 16);
    hw.kicks.lock().unwrap().clear();
    assert!(inputs.push_rx(VmId(0), b'k'));
    assert_eq!(d.used_idx(0), 1);
    assert_eq!(d.used_len(0, 0), 1);
    assert_eq!(gread(vm, BUFFERS, 1), b"k");
    assert!(spi_pending(vm, 32 + 16));
    assert!(
        hw.kicks.lock().unwrap().contains(&0),
        "vCPU 0's CPU not kicked"
    );
    // Paused: the key waits in the backlog, the guest's memory is untouched.
    vm.request_pause().unwrap();
    d.post(0, &[(BUFFERS + 64, 64, true)], false);
    assert!(inputs.push_rx(VmId(0), b'p'));
    assert_eq!(d.used_idx(0), 1);
    vm.resume().unwrap();
}

/// Two VMs on network `lan` (CPUs 0 and 1), each driver running its net
/// device (device 0) with a receive buffer posted.
fn lan_pair() -> (
    &'static FakeHardware,
    Vec<&'static Vm<FakeHardware>>,
    Driver,
    Driver,
) {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[
            ("a", vm_conf(0, true, net("lan"))),
            ("b", vm_conf(1, true, net("lan"))),
        ],
    );
    let mut a = Driver::start(vms[0], 0);
    let mut b = Driver::start(vms[1], 0);
    post_rx(&mut a, BUFFERS);
    post_rx(&mut b, BUFFERS);
    (hw, vms, a, b)
}

#[test]
fn a_frame_crosses_the_switch_into_the_other_vm_and_interrupts_it() {
    let (hw, vms, mut a, mut b) = lan_pair();
    enable_spi(vms[1], 32 + 16);
    hw.kicks.lock().unwrap().clear();
    let f = broadcast(&mut a, b"ping", BUFFERS + 0x1000);
    assert_eq!(a.used_idx(1), 1, "the sender's buffer came back");
    assert_eq!(b.used_idx(0), 1, "the frame did not reach b");
    assert_eq!(b.used_len(0, 0) as usize, NET_HDR + f.len());
    assert_eq!(gread(vms[1], BUFFERS + NET_HDR as u64, f.len()), f);
    assert!(spi_pending(vms[1], 32 + 16), "b's SPI was not latched");
    assert!(hw.kicks.lock().unwrap().contains(&1), "b's CPU not kicked");
    // a's vCPU pinned b's memory with a handle it keeps: one registration
    // on b's collector, however many frames follow.
    let handles = a.vcpu.collector_handles();
    assert_eq!(handles.registered(), 1);
    let on_b = handles.handle(vms[1].collector);
    assert_eq!(handles.registered(), 1, "no handle on b's collector kept");
    post_rx(&mut b, BUFFERS + 0x800);
    broadcast(&mut a, b"again", BUFFERS + 0x1400);
    assert_eq!(b.used_idx(0), 2, "the second frame did not reach b");
    assert!(std::rc::Rc::ptr_eq(
        &on_b,
        &a.vcpu.collector_handles().handle(vms[1].collector)
    ));
    assert_eq!(a.vcpu.collector_handles().registered(), 1);
    // The switch learned a's MAC behind a's port.
    let switch = hw.hub.switch();
    let (_, dev_a) = vms[0].virtio.find(DeviceRole::Net).unwrap();
    assert_eq!(
        switch.learned_port("lan", mac_of(vms[0])),
        dev_a.port(),
        "MAC not learned"
    );
    // Unicast back to a.
    let reply = frame(mac_of(vms[0]), mac_of(vms[1]), b"pong");
    send(&mut b, &reply, BUFFERS + 0x1000);
    assert_eq!(a.used_idx(0), 1);
    assert_eq!(gread(vms[0], BUFFERS + NET_HDR as u64, reply.len()), reply);
}

#[test]
fn frames_for_a_paused_or_stopped_vm_are_dropped_and_counted() {
    let (hw, vms, mut a, b) = lan_pair();
    let (_, dev_b) = vms[1].virtio.find(DeviceRole::Net).unwrap();
    // Paused (as in a migration's stop-and-copy): its memory must not change.
    vms[1].request_pause().unwrap();
    let before = gread(vms[1], BUFFERS, 64);
    broadcast(&mut a, b"1", BUFFERS + 0x1000);
    assert_eq!(b.used_idx(0), 0);
    assert_eq!(gread(vms[1], BUFFERS, 64), before);
    assert_eq!(dev_b.rx_dropped_not_running.load(Ordering::Relaxed), 1);
    vms[1].resume().unwrap();
    // Asked to stop, not yet ended: dropped and counted too.
    vms[1].request_stop().unwrap();
    broadcast(&mut a, b"s", BUFFERS + 0x1400);
    assert_eq!(b.used_idx(0), 0);
    assert_eq!(dev_b.rx_dropped_not_running.load(Ordering::Relaxed), 2);
    // Stopped: its port leaves the switch.
    assert!(vms[1].stop(0, &"test stop"));
    assert_eq!(dev_b.port(), None, "the stopped VM kept its port");
    broadcast(&mut a, b"2", BUFFERS + 0x1800);
    assert_eq!(b.used_idx(0), 0);
    let (_, dev_a) = vms[0].virtio.find(DeviceRole::Net).unwrap();
    let sent = hw.hub.switch().counters(dev_a.port().unwrap()).unwrap();
    assert_eq!(sent.sent, 3);
    // STAT lines at the end count the device.
    let lines = hw.lines.lock().unwrap().clone();
    assert!(
        lines.contains(&String::from("STAT vm1 virtio_net_rx_dropped 2")),
        "{lines:?}"
    );
    assert!(lines.contains(&String::from("STAT vm1 virtio_net_tx_frames 0")));
}

#[test]
fn a_disk_window_is_read_and_written_and_read_only_refuses_writes() {
    let hw = FakeHardware::new();
    let disk = VecDisk::new(64, false);
    hw.disks.lock().unwrap().push(disk);
    let window = |read_only| {
        move |c: &mut VmConf| {
            c.disk = Some(DiskConf {
                host: 0,
                start_sector: 8,
                sectors: Some(16),
                read_only,
            })
        }
    };
    let vms = create(
        hw,
        &[
            ("rw", vm_conf(0, true, window(false))),
            ("ro", vm_conf(1, true, window(true))),
        ],
    );
    let mut rw = Driver::start(vms[0], 0);
    // Sector 2 of the window is host sector 10.
    assert_eq!(
        blk_request(&mut rw, BLK_T_IN, 2, BUFFERS + 0x1000, BUFFERS + 0x3000),
        0
    );
    assert_eq!(gread(vms[0], BUFFERS + 0x1000, 512), vec![10u8; 512]);
    gwrite(vms[0], BUFFERS + 0x1000, &[0xee; 512]);
    assert_eq!(
        blk_request(&mut rw, BLK_T_OUT, 3, BUFFERS + 0x1000, BUFFERS + 0x3000),
        0
    );
    assert_eq!(disk.bytes.lock().unwrap()[11 * 512..12 * 512], [0xee; 512]);
    // Past the window's end: an error, the host disk behind it untouched.
    assert_ne!(
        blk_request(&mut rw, BLK_T_OUT, 16, BUFFERS + 0x1000, BUFFERS + 0x3000),
        0
    );
    assert_eq!(disk.bytes.lock().unwrap()[24 * 512], 24);
    let mut ro = Driver::start(vms[1], 0);
    assert_eq!(
        blk_request(&mut ro, BLK_T_OUT, 0, BUFFERS + 0x1000, BUFFERS + 0x3000),
        1
    );
    assert_eq!(disk.bytes.lock().unwrap()[8 * 512], 8);
    let machine = MonitorMachine::new(hw, &vms);
    let mut lines = Vec::new();
    machine
        .devices(VmId(0), &mut |l| lines.push(String::from(l)))
        .unwrap();
    assert_eq!(lines.len(), 1);
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(fields[..4], ["0", "blk", "0x0a000000+0x200", "16"]);
    assert_eq!(fields[4], "ACKNOWLEDGE|DRIVER|FEATURES_OK|DRIVER_OK");
    assert!(fields[5].starts_with("VERSION_1"), "{}", fields[5]);
    assert!(
        fields[6].starts_with("disk=0,start=8,sectors=16,ro=0,reads=1,writes=1,read_bytes=512"),
        "{}",
        fields[6]
    );
    assert!(fields[6].contains("errors=1"), "{}", fields[6]);
}

#[test]
fn restart_resets_the_devices_and_gives_a_fresh_port() {
    let (hw, vms, mut a, mut b) = lan_pair();
    let (_, dev_a) = vms[0].virtio.find(DeviceRole::Net).unwrap();
    let old = dev_a.port().unwrap();
    broadcast(&mut a, b"x", BUFFERS + 0x1000);
    assert!(
        hw.hub
            .switch()
            .learned_port("lan", mac_of(vms[0]))
            .is_some()
    );
    restart::rebuild(vms[0]).unwrap();
    assert_eq!(dev_a.transport.lock().status(), 0, "device not reset");
    let new = dev_a.port().expect("no port after the restart");
    assert_ne!(new, old);
    assert!(hw.hub.switch().counters(old).is_none(), "old port kept");
    assert_eq!(hw.hub.switch().learned_port("lan", mac_of(vms[0])), None);
    // It runs again: its driver comes up and receives.
    let mut a = Driver::start(vms[0], 0);
    post_rx(&mut a, BUFFERS);
    broadcast(&mut b, b"y", BUFFERS + 0x1000);
    assert_eq!(a.used_idx(0), 1);
}

/// A control VM `ctl` (its port is device 1) beside a VM `other`, the
/// port's driver up with one receive buffer posted at `BUFFERS`.
fn control_vm_and_port() -> (
    &'static FakeHardware,
    Vec<&'static Vm<FakeHardware>>,
    Driver,
) {
    let hw = FakeHardware::new();
    let ctl = vm_conf(0, true, |c| {
        c.console = Some(ConsoleKind::Virtio);
        c.control = Some(true);
    });
    let vms = create(hw, &[("ctl", ctl), ("other", conf(8, &[1], true))]);
    let mut port = Driver::start(vms[0], 1);
    port.post(0, &[(BUFFERS, 2048, true)], true);
    (hw, vms, port)
}

#[test]
fn a_control_vms_port_runs_monitor_commands_and_answers_there() {
    let (hw, vms, mut port) = control_vm_and_port();
    transmit(&mut port, 1, BUFFERS + 0x1000, b"vms\n");
    assert_eq!(port.used_idx(0), 1, "no answer written back");
    let len = port.used_len(0, 0) as usize;
    let answer = String::from_utf8(gread(vms[0], BUFFERS, len)).unwrap();
    let rows: Vec<&str> = answer.lines().collect();
    assert!(rows[0].starts_with("ID  NAME"), "{answer}");
    assert!(rows[1].starts_with("0   ctl "), "{answer}");
    assert!(rows[2].starts_with("1   other "), "{answer}");
    assert!(rows[1].ends_with('-'), "no VM is focused on the port");
    // A command in two writes, and one that acts.
    port.post(0, &[(BUFFERS, 2048, true)], true);
    transmit(&mut port, 1, BUFFERS + 0x1000, b"pause oth");
    assert_eq!(port.used_idx(0), 1);
    transmit(&mut port, 1, BUFFERS + 0x1000, b"er\r");
    assert_eq!(port.used_idx(0), 2);
    let len = port.used_len(0, 1) as usize;
    assert_eq!(gread(vms[0], BUFFERS, len), b"ok: other paused\n");
    assert_eq!(
        vms[1].requested_state(),
        crate::vm::run_state::Requested::Paused
    );
    // Nothing of it reached the hypervisor console as guest output.
    assert!(hw.output.lock().unwrap().iter().all(|&(vm, _)| vm != 0));
}

/// A guest terminal in its default mode echoes each answer back; the port
/// takes the echo for what it is instead of answering it as a command.
#[test]
fn a_control_port_does_not_answer_its_answers_echo() {
    let (_hw, vms, mut port) = control_vm_and_port();
    transmit(&mut port, 1, BUFFERS + 0x1000, b"vms\r\n");
    assert_eq!(port.used_idx(0), 1, "no answer written back");
    let len = port.used_len(0, 0) as usize;
    let answer = gread(vms[0], BUFFERS, len);
    // The terminal's echo: the answer with `\r\n` line ends.
    let echo = String::from_utf8(answer).unwrap().replace('\n', "\r\n");
    port.post(0, &[(BUFFERS, 2048, true)], true);
    transmit(&mut port, 1, BUFFERS + 0x1000, echo.as_bytes());
    assert_eq!(port.used_idx(0), 1, "the echo was answered as a command");
    transmit(&mut port, 1, BUFFERS + 0x1000, b"pause other\r\n");
    assert_eq!(port.used_idx(0), 2, "the next command was not answered");
    let len = port.used_len(0, 1) as usize;
    assert_eq!(gread(vms[0], BUFFERS, len), b"ok: other paused\n");
}

#[test]
fn migration_carries_queues_backlog_mac_and_the_port() {
    let hw = FakeHardware::new();
    let devices = |c: &mut VmConf| {
        c.console = Some(ConsoleKind::Virtio);
        c.net = Some(VmName::new("lan").unwrap());
        c.mac = Some([0x52, 0x54, 0, 1, 2, 3]);
    };
    let dst_conf = |c: &mut VmConf| {
        c.console = Some(ConsoleKind::Virtio);
        c.net = Some(VmName::new("lan").unwrap());
    };
    let vms = create(
        hw,
        &[
            ("src", vm_conf(0, true, devices)),
            ("dst", vm_conf(1, false, dst_conf)),
            ("peer", vm_conf(2, true, net("lan"))),
            ("bare", conf(8, &[3], false)),
        ],
    );
    let (src, dst, peer) = (vms[0], vms[1], vms[2]);
    let table = VmTable::new(hw, vms.clone(), 4).unwrap();
    // A destination without the same devices is refused.
    assert!(matches!(
        live_migration::request(src, vms[3], options(false, 30_000)),
        Err(live_migration::MigrateError::Shape(_))
    ));
    let _console = Driver::start(src, 0);
    let mut net = Driver::start(src, 1);
    post_rx(&mut net, BUFFERS);
    broadcast(&mut net, b"a", BUFFERS + 0x1000);
    broadcast(&mut net, b"b", BUFFERS + 0x1800);
    // Console backlog: typed bytes with no receive buffer posted.
    let (ci, console) = src.virtio.find(DeviceRole::Console).unwrap();
    crate::runtime::virtio_io::port_input(
        src,
        ci,
        console,
        b"typed",
        &crate::runtime::collector_handles::CollectorHandles::new(),
    );
    assert!(dst.virtio.find(DeviceRole::Net).unwrap().1.port().is_none());
    let (_, src_net) = src.virtio.find(DeviceRole::Net).unwrap();
    let port = src_net.port().unwrap();

    live_migration::migrate(src, dst, options(false, 30_000), &mut |_| {}).unwrap();

    let (_, dst_net) = dst.virtio.find(DeviceRole::Net).unwrap();
    assert_eq!(dst_net.port(), Some(port), "the port did not move");
    assert_eq!(src_net.port(), None);
    assert_eq!(hw.hub.switch().owner(port), Some(1));
    assert_eq!(
        mac_of(dst),
        [0x52, 0x54, 0, 1, 2, 3],
        "the MAC did not move"
    );
    let queue = |vm: &Vm<FakeHardware>, role, q: usize| {
        let (_, d) = vm.virtio.find(role).unwrap();
        let t = d.transport.lock();
        match &*t {
            Transport::Net(t) => t.snapshot().queues[q],
            Transport::Console(t) => t.snapshot().queues[q],
            Transport::Blk(t) => t.snapshot().queues[q],
        }
    };
    assert_eq!(
        queue(dst, DeviceRole::Net, 1),
        queue(src, DeviceRole::Net, 1)
    );
    assert_eq!(queue(dst, DeviceRole::Net, 1).next_avail, 2);
    let (_, dst_con) = dst.virtio.find(DeviceRole::Console).unwrap();
    match &*dst_con.transport.lock() {
        Transport::Console(t) => assert_eq!(t.device().backlog_len(), 5),
        _ => panic!("not a console"),
    }
    assert!(dst_con.transport.lock().is_live());
    // The destination continues: its driver's next tx uses avail index 2,
    // and the peer's frames reach it.
    let mut net = Driver {
        vcpu: FakeAccessingVcpu::of(dst),
        device: 1,
        next_desc: net.next_desc,
        avail_idx: net.avail_idx,
    };
    let mut p = Driver::start(peer, 0);
    post_rx(&mut p, BUFFERS);
    broadcast(&mut net, b"c", BUFFERS + 0x2000);
    assert_eq!(net.used_idx(1), 3);
    assert_eq!(
        p.used_idx(0),
        1,
        "the peer got nothing from the destination"
    );
    send(
        &mut p,
        &frame(mac_of(dst), mac_of(peer), b"d"),
        BUFFERS + 0x1000,
    );
    assert_eq!(
        net.used_idx(0),
        1,
        "the destination got nothing on its port"
    );
    assert!(src.report_end_left_to_vcpus());
    table.vm_ended();
    assert!(src.has_ended());
}

#[test]
fn a_broken_ring_puts_the_device_in_needs_reset_counted_and_shown() {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[(
            "c",
            vm_conf(0, true, |c| c.console = Some(ConsoleKind::Virtio)),
        )],
    );
    let vm = vms[0];
    let mut d = Driver::start(vm, 0);
    // A transmit buffer in the device windows, outside RAM.
    d.post(1, &[(0x0a00_0000, 64, false)], true);
    let (_, console) = vm.virtio.find(DeviceRole::Console).unwrap();
    assert_ne!(
        console.transport.lock().status() & 64,
        0,
        "not in DEVICE_NEEDS_RESET"
    );
    assert_eq!(console.needs_reset_count.load(Ordering::Relaxed), 1);
    // Further notifies change nothing and are not counted again.
    d.write(REG_QUEUE_NOTIFY, 1);
    assert_eq!(console.needs_reset_count.load(Ordering::Relaxed), 1);
    let machine = MonitorMachine::new(hw, &vms);
    let mut lines = Vec::new();
    machine
        .devices(VmId(0), &mut |l| lines.push(String::from(l)))
        .unwrap();
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert!(fields[4].contains("NEEDS_RESET"), "{}", lines[0]);
    assert!(
        fields[6].contains("ring_errors=1,needs_reset=1"),
        "{}",
        lines[0]
    );
    assert!(vm.stop(0, &"test"));
    let stat = hw.lines.lock().unwrap().clone();
    assert!(stat.contains(&String::from("STAT vm0 virtio_ring_errors 1")));
    assert!(stat.contains(&String::from("STAT vm0 virtio_needs_reset 1")));
}
