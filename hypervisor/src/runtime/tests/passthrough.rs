//! A VM that owns a host device, on the fake machine: what its creation
//! sets up (the physical SPI, the forwarded window, the hardware link, the
//! guest's node), a delivered interrupt, the migration it refuses, and
//! what a restart and its end do to the physical SPI.

use super::*;
use crate::exit::mmio::DeviceId;
use crate::platform::host_device::{
    DeviceNode, HostDevice, HostInterrupt, NodeProperty, Trigger as HostTrigger,
};
use crate::runtime::passed_devices;
use crate::vm::passthrough::{Claims, PassedDevice, PassthroughError, PassthroughPlan};
use boot_payload::vmconf::ConsoleKind;

/// A plan with QEMU's last virtio-mmio transport: a 0x200-byte window
/// (forwarded) at `base` and edge SPI `intid`.
fn plan(base: u64, intid: u32) -> PassthroughPlan {
    let window = PhysRange::from_start_size(base, 0x200);
    let device = HostDevice {
        path: format!("/virtio_mmio@{base:x}"),
        windows: vec![window],
        interrupts: vec![HostInterrupt {
            intid,
            trigger: HostTrigger::Edge,
        }],
        node: DeviceNode {
            name: format!("virtio_mmio@{base:x}"),
            properties: vec![
                NodeProperty::Windows(vec![window]),
                NodeProperty::Interrupts(vec![[0, intid - 32, 1]]),
            ],
            children: Vec::new(),
        },
        dropped: Vec::new(),
        compatible: vec!["virtio,mmio".into()],
        unroutable: None,
    };
    PassthroughPlan {
        devices: vec![PassedDevice::check(device, &Claims::default(), &[]).unwrap()],
    }
}

fn info_with(plans: Vec<Result<PassthroughPlan, PassthroughError>>) -> BootInfo {
    BootInfo {
        passthrough: plans,
        ..boot_info(4)
    }
}

fn ops(hw: &FakeHardware) -> Vec<String> {
    core::mem::take(&mut *hw.spi_ops.lock().unwrap())
}

#[test]
fn a_vm_owning_a_device_gets_its_window_its_spi_and_its_node() {
    let hw = FakeHardware::new();
    let info = info_with(vec![
        Ok(plan(0x0a00_3e00, 79)),
        Ok(PassthroughPlan::default()),
    ]);
    let vms: Vec<_> = create_with(
        hw,
        &[
            ("a", conf(8, &[0, 1], true)),
            ("dst", conf(8, &[2, 3], false)),
        ],
        &info,
    )
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let vm = vms[0];
    assert_eq!(ops(hw), ["setup 79 edge cpu0"]);
    assert_eq!(
        vm.mmio.find(0x0a00_3e00, 4).map(|(device, _)| device),
        Ok(DeviceId::Passed)
    );
    assert!(vm.mmio.find(0x0a00_3c00, 4).is_err(), "only the window");
    assert_eq!(vm.vgic.lock().hardware_intid(79), Some(79));
    let fdt = fdt::Fdt::new(&vm.boot.dtb).unwrap();
    assert!(fdt.find_node("/virtio_mmio@a003e00").is_some());
    assert_eq!(
        live_migration::request(vm, vms[1], MigrationOptions::default()),
        Err(MigrateError::Blocked(
            crate::vm::vcpu_state::MigrationBlocker::Passthrough
        ))
    );

    // The physical SPI fired: the virtual one pends on vCPU 0, counted.
    let kicks = passed_devices::deliver(vm, 79).unwrap();
    assert!(kicks.is_empty() || kicks.contains(0));
    assert_eq!(vm.counters.get(Counter::PassthroughIrqs), 1);
    assert!(passed_devices::deliver(vms[1], 79).is_err(), "not dst's");

    // Routed by the guest to vCPU 1: the physical SPI follows.
    {
        let mut vgic = vm.vgic.lock();
        vgic.distributor_write(0x6000 + 8 * 79, 8, 1).unwrap();
    }
    passed_devices::sync_routes(vm);
    assert_eq!(ops(hw), ["route 79 cpu1"]);
    passed_devices::sync_routes(vm);
    assert!(ops(hw).is_empty(), "no change, no write");

    // A restart: inactive, back on vCPU 0's CPU.
    restart::rebuild(vm).unwrap();
    assert_eq!(ops(hw), ["deactivate 79", "route 79 cpu0"]);
    assert_eq!(vm.vgic.lock().hardware_intid(79), Some(79), "still linked");

    // Its end: disabled.
    assert!(vm.stop(0, &"test"));
    assert_eq!(ops(hw), ["release 79"]);
}

#[test]
fn a_device_over_the_vms_own_devices_or_refused_at_boot_stops_its_creation() {
    let hw = FakeHardware::new();
    let mut console = conf(8, &[0], true);
    console.console = Some(ConsoleKind::Virtio);
    let info = info_with(vec![Ok(plan(0x0a00_0000, 79))]);
    let result = create_with(hw, &[("a", console)], &info).remove(0);
    let Err(VmError::Passthrough(e)) = result else {
        panic!("created");
    };
    assert_eq!(
        e.to_string(),
        "device /virtio_mmio@a000000: window 0xa000000+0x200 overlaps the VM's emulated virtio-mmio devices"
    );
    let info = info_with(vec![Ok(plan(0x0a00_3e00, 33))]);
    let result = create_with(hw, &[("a", conf(8, &[0], true))], &info).remove(0);
    assert!(
        matches!(&result, Err(VmError::Passthrough(e)) if e.why == "interrupt 33 is also the VM's emulated UART's"),
        "{:?}",
        result.err()
    );
    let refused = PassthroughError {
        path: "/x".into(),
        why: "no such node in the host device tree".into(),
    };
    let result = create_with(
        hw,
        &[("a", conf(8, &[0], true))],
        &info_with(vec![Err(refused)]),
    );
    assert!(matches!(result[0], Err(VmError::Passthrough(_))));
    assert!(ops(hw).is_empty(), "nothing was set up for a refused VM");
}

/// A plan with a PCI host bridge (buses 0..=1), one window, no SPIs.
fn pci_plan() -> PassthroughPlan {
    let window = PhysRange::from_start_size(0x1000_0000, 0x1000);
    let verbatim = |name: &str, value: &[u8]| NodeProperty::Verbatim {
        name: name.into(),
        value: value.to_vec(),
    };
    let device = HostDevice {
        path: "/pcie@10000000".into(),
        windows: vec![window],
        interrupts: Vec::new(),
        node: DeviceNode {
            name: "pcie@10000000".into(),
            properties: vec![
                verbatim("device_type", b"pci\0"),
                verbatim("bus-range", &[0, 0, 0, 0, 0, 0, 0, 1]),
                NodeProperty::Windows(vec![window]),
            ],
            children: Vec::new(),
        },
        dropped: Vec::new(),
        compatible: vec!["pci-host-ecam-generic".into()],
        unroutable: None,
    };
    PassthroughPlan {
        devices: vec![PassedDevice::check(device, &Claims::default(), &[]).unwrap()],
    }
}

#[test]
fn a_passed_pci_bridges_device_mappings_are_mirrored_and_its_msis_replayed() {
    use super::its::{ITT, ItsDriver};
    let hw = FakeHardware::new();
    let info = info_with(vec![Ok(pci_plan()), Ok(PassthroughPlan::default())]);
    let vms: Vec<_> = create_with(
        hw,
        &[("a", conf(8, &[0, 1], true)), ("b", conf(8, &[2, 3], true))],
        &info,
    )
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let vm = vms[0];
    assert!(
        vm.msi_passthrough,
        "the fake host's ITS is at the virtual ITS's address"
    );
    assert!(!vms[1].msi_passthrough, "b owns no PCI bridge");
    let fdt = fdt::Fdt::new(&vm.boot.dtb).unwrap();
    assert!(
        fdt.find_node("/pcie@10000000")
            .and_then(|n| n.property("msi-map"))
            .is_some()
    );
    ops(hw);

    let mut its = ItsDriver::new(vm);
    its.set_up();
    {
        // LPIs on vCPU 1's redistributor too (set_up enables vCPU 0's).
        let mut vgic = vm.vgic.lock();
        let propbaser = vgic.rd_base_read(0, 0x70, 8).unwrap();
        let pendbaser = vgic.rd_base_read(0, 0x78, 8).unwrap();
        vgic.rd_base_write(1, 0x70, 8, propbaser).unwrap();
        vgic.rd_base_write(1, 0x78, 8, pendbaser + 0x1_0000)
            .unwrap();
        vgic.rd_base_write(1, 0, 4, 1).unwrap();
    }
    let mapd = |device: u64, bits: u64, itt: u64, valid: bool| {
        [
            device << 32 | 0x08,
            bits - 1,
            u64::from(valid) << 63 | itt,
            0,
        ]
    };
    // DeviceID 0x8 (00:01.0) with 4 events, event 1 to LPI 8193 on vCPU 1;
    // DeviceID 0x200 is on bus 2, not the bridge's.
    let outcome = its.run(&[
        mapd(0x8, 2, ITT, true),
        mapd(0x200, 1, ITT + 0x100, true),
        [0x09, 0, 1 << 63 | 1 << 16, 0],
        [0x8 << 32 | 0x0a, 8193 << 32 | 1, 0, 0],
    ]);
    passed_devices::sync_msi_devices(vm, &outcome.device_mappings);
    assert_eq!(ops(hw), ["msi map 0x8 4 cpu0 at 8192"]);

    // Host LPI 8193 is DeviceID 0x8's event 1: LPI 8193 pends on vCPU 1.
    let kicks = passed_devices::deliver_lpi(vm, 8193, &its.handle);
    assert!(kicks.contains(1), "{kicks:?}");
    assert_eq!(vm.counters.get(Counter::PassthroughMsis), 1);
    // An unmapped event, and an LPI that is no event, pend nothing.
    assert!(passed_devices::deliver_lpi(vm, 8194, &its.handle).is_empty());
    assert!(passed_devices::deliver_lpi(vm, 8196, &its.handle).is_empty());
    assert_eq!(vm.counters.get(Counter::PassthroughMsis), 2);

    // Remapped: the old mapping goes first; unmapped (V = 0): gone.
    let outcome = its.run(&[mapd(0x8, 1, ITT, true), mapd(0x8, 1, 0, false)]);
    passed_devices::sync_msi_devices(vm, &outcome.device_mappings);
    assert_eq!(
        ops(hw),
        [
            "msi unmap 0x8 4 at 8192",
            "msi map 0x8 2 cpu0 at 8192",
            "msi unmap 0x8 2 at 8192"
        ]
    );
    assert!(vm.msi_shadow.lock().is_empty());

    // A restart and the VM's end unmap what is mapped.
    let outcome = its.run(&[mapd(0x10, 1, ITT, true)]);
    passed_devices::sync_msi_devices(vm, &outcome.device_mappings);
    assert_eq!(ops(hw), ["msi map 0x10 2 cpu0 at 8192"]);
    restart::rebuild(vm).unwrap();
    assert_eq!(ops(hw), ["msi unmap 0x10 2 at 8192"]);
    let mut its = ItsDriver::new(vm);
    its.set_up();
    let outcome = its.run(&[mapd(0x10, 1, ITT, true)]);
    passed_devices::sync_msi_devices(vm, &outcome.device_mappings);
    assert_eq!(ops(hw), ["msi map 0x10 2 cpu0 at 8192"]);
    assert!(vm.stop(0, &"test"));
    assert_eq!(ops(hw), ["msi unmap 0x10 2 at 8192"]);
}
