use super::*;
use alloc::vec;
use vm_fdt::FdtWriter;

const GICD: u64 = 0x0800_0000;
const GIC_PHANDLE: u32 = 0x8001;
const GPIO_PHANDLE: u32 = 0x8002;

/// A small `virt`-like tree: the GIC, a virtio-mmio node, a PCIe bridge
/// with an `interrupt-map`, a node behind a GPIO controller, a PPI user, an
/// Ethernet MAC with an MDIO child, and a bus that translates addresses.
fn tree() -> Vec<u8> {
    let mut w = FdtWriter::new().unwrap();
    let root = w.begin_node("").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    w.property_u32("interrupt-parent", GIC_PHANDLE).unwrap();

    let gic = w.begin_node("intc@8000000").unwrap();
    w.property_string("compatible", "arm,gic-v3").unwrap();
    w.property_array_u64("reg", &[GICD, 0x1_0000, 0x080a_0000, 0xf6_0000])
        .unwrap();
    w.property_u32("#interrupt-cells", 3).unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_null("interrupt-controller").unwrap();
    w.property_phandle(GIC_PHANDLE).unwrap();
    w.end_node(gic).unwrap();

    let gpio = w.begin_node("gpio@9030000").unwrap();
    w.property_array_u64("reg", &[0x0903_0000, 0x1000]).unwrap();
    w.property_u32("#interrupt-cells", 2).unwrap();
    w.property_null("interrupt-controller").unwrap();
    w.property_phandle(GPIO_PHANDLE).unwrap();
    w.end_node(gpio).unwrap();

    let virtio = w.begin_node("virtio_mmio@a003e00").unwrap();
    w.property_null("dma-coherent").unwrap();
    w.property_array_u32("interrupts", &[0, 47, 1]).unwrap();
    w.property_array_u64("reg", &[0x0a00_3e00, 0x200]).unwrap();
    w.property_string("compatible", "virtio,mmio").unwrap();
    w.end_node(virtio).unwrap();

    let off = w.begin_node("virtio_mmio@a003c00").unwrap();
    w.property_string("compatible", "virtio,mmio").unwrap();
    w.property_array_u64("reg", &[0x0a00_3c00, 0x200]).unwrap();
    w.property_string("status", "disabled").unwrap();
    w.end_node(off).unwrap();

    let pcie = w.begin_node("pcie@10000000").unwrap();
    w.property_string("compatible", "pci-host-ecam-generic")
        .unwrap();
    w.property_u32("#address-cells", 3).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    w.property_u32("#interrupt-cells", 1).unwrap();
    w.property_array_u64("reg", &[0x40_1000_0000, 0x1000_0000])
        .unwrap();
    w.property_array_u32("ranges", &[0x0100_0000, 0, 0, 0, 0x3eff_0000, 0, 0x1_0000])
        .unwrap();
    let mut map = Vec::new();
    for (slot, pin, spi) in [(0u32, 1u32, 3u32), (0, 2, 4), (0x800, 1, 4)] {
        map.extend_from_slice(&[slot, 0, 0, pin, GIC_PHANDLE, 0, 0, 0, spi, 4]);
    }
    w.property_array_u32("interrupt-map", &map).unwrap();
    w.property_array_u32("interrupt-map-mask", &[0x1800, 0, 0, 7])
        .unwrap();
    w.property_u32("msi-parent", 0x8003).unwrap();
    w.end_node(pcie).unwrap();

    let keys = w.begin_node("gpio-keys").unwrap();
    w.property_u32("interrupt-parent", GPIO_PHANDLE).unwrap();
    w.property_array_u32("interrupts", &[3, 1]).unwrap();
    w.end_node(keys).unwrap();

    let pmu = w.begin_node("pmu").unwrap();
    w.property_array_u32("interrupts", &[1, 7, 4]).unwrap();
    w.end_node(pmu).unwrap();

    let eth = w.begin_node("ethernet@7d580000").unwrap();
    w.property_array_u64("reg", &[0x7d58_0000, 0x1_0000])
        .unwrap();
    w.property_array_u32("interrupts", &[0, 157, 4, 0, 158, 4])
        .unwrap();
    w.property_array_u32("clocks", &[0x10, 3]).unwrap();
    w.property_u32("pinctrl-0", 0x11).unwrap();
    w.property_u32("phy-handle", 0x20).unwrap();
    w.property_u32("#address-cells", 1).unwrap();
    w.property_u32("#size-cells", 1).unwrap();
    let mdio = w.begin_node("mdio@e14").unwrap();
    w.property_array_u32("reg", &[0xe14, 8]).unwrap();
    let phy = w.begin_node("ethernet-phy@1").unwrap();
    w.property_phandle(0x20).unwrap();
    w.end_node(phy).unwrap();
    w.end_node(mdio).unwrap();
    w.end_node(eth).unwrap();

    let soc = w.begin_node("soc").unwrap();
    w.property_u32("#address-cells", 1).unwrap();
    w.property_u32("#size-cells", 1).unwrap();
    w.property_array_u32("ranges", &[0x7e00_0000, 0, 0xfe00_0000, 0x0180_0000])
        .unwrap();
    let mmc = w.begin_node("mmc@7e340000").unwrap();
    w.property_array_u32("reg", &[0x7e34_0000, 0x100]).unwrap();
    w.property_array_u32("interrupts", &[0, 126, 4]).unwrap();
    w.end_node(mmc).unwrap();
    let bus = w.begin_node("bus@7e500000").unwrap();
    w.property_array_u32("reg", &[0x7e50_0000, 0x100]).unwrap();
    w.property_array_u32("ranges", &[0, 0x7e50_0000, 0x100])
        .unwrap();
    w.end_node(bus).unwrap();
    w.end_node(soc).unwrap();

    w.end_node(root).unwrap();
    w.finish().unwrap()
}

fn read(path: &str) -> Result<HostDevice, HostDeviceError> {
    HostDevice::read(&tree(), path, GICD)
}

fn why(path: &str) -> String {
    match read(path) {
        Ok(device) => device.unroutable.expect("refused"),
        Err(e) => e.0,
    }
}

#[test]
fn a_virtio_mmio_node_gives_its_window_its_spi_and_its_properties() {
    let device = read("/virtio_mmio@a003e00").unwrap();
    assert_eq!(
        device.windows,
        [PhysRange::from_start_size(0x0a00_3e00, 0x200)]
    );
    assert_eq!(
        device.interrupts,
        [HostInterrupt {
            intid: 79,
            trigger: Trigger::Edge
        }]
    );
    assert!(device.is_compatible("virtio,mmio"));
    assert_eq!(device.node.name, "virtio_mmio@a003e00");
    assert_eq!(
        device.node.properties[0],
        NodeProperty::Windows(device.windows.clone()),
        "reg comes first, from the translated windows"
    );
    assert!(
        device
            .node
            .properties
            .contains(&NodeProperty::Interrupts(vec![[0, 47, 1]]))
    );
    assert!(device.node.properties.contains(&NodeProperty::Verbatim {
        name: "dma-coherent".into(),
        value: Vec::new()
    }));
    assert!(device.dropped.is_empty());
}

#[test]
fn a_pcie_bridge_gives_the_spis_of_its_interrupt_map() {
    let device = read("/pcie@10000000").unwrap();
    let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
    assert_eq!(intids, [35, 36], "each SPI once, in order");
    assert!(
        device
            .interrupts
            .iter()
            .all(|i| i.trigger == Trigger::Level)
    );
    let map = device
        .node
        .properties
        .iter()
        .find_map(|p| match p {
            NodeProperty::InterruptMap {
                child_cells,
                entries,
            } => Some((*child_cells, entries.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(map.0, 4);
    assert_eq!(map.1[2], (vec![0x800, 0, 0, 1], [0, 4, 4]));
    assert_eq!(device.dropped, ["pcie@10000000/msi-parent"]);
    assert_eq!(
        device.windows,
        [
            PhysRange::from_start_size(0x40_1000_0000, 0x1000_0000),
            PhysRange::from_start_size(0x3eff_0000, 0x1_0000)
        ],
        "the ECAM reg, then the I/O window of its ranges"
    );
    assert!(
        device
            .node
            .properties
            .iter()
            .any(|p| matches!(p, NodeProperty::Verbatim { name, .. } if name == "ranges"))
    );
}

#[test]
fn references_outside_the_subtree_are_dropped_and_inside_ones_kept() {
    let device = read("/ethernet@7d580000").unwrap();
    assert_eq!(
        device.dropped,
        ["ethernet@7d580000/clocks", "ethernet@7d580000/pinctrl-0"]
    );
    let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
    assert_eq!(intids, [189, 190]);
    let mdio = &device.node.children[0];
    assert_eq!(mdio.name, "mdio@e14");
    assert_eq!(mdio.children[0].name, "ethernet-phy@1");
    assert!(
        mdio.children[0]
            .properties
            .iter()
            .any(|p| matches!(p, NodeProperty::Verbatim { name, .. } if name == "phandle"))
    );
    assert!(
        device
            .node
            .properties
            .iter()
            .any(|p| matches!(p, NodeProperty::Verbatim { name, .. } if name == "phy-handle"))
    );
}

#[test]
fn a_node_behind_a_translating_bus_gets_cpu_addresses() {
    let device = read("/soc/mmc@7e340000").unwrap();
    assert_eq!(
        device.windows,
        [PhysRange::from_start_size(0xfe34_0000, 0x100)]
    );
    assert_eq!(device.interrupts[0].intid, 158);
    assert_eq!(
        why("/soc/bus@7e500000"),
        "bus@7e500000/ranges: its bus translates addresses, and the guest gets the node at its root"
    );
}

#[test]
fn what_cannot_be_passed_is_refused_with_the_reason() {
    assert_eq!(why("/nothing@0"), "no such node in the host device tree");
    assert_eq!(why("/virtio_mmio"), "no such node in the host device tree");
    assert_eq!(why("/virtio_mmio@a003c00"), "its status is not \"okay\"");
    assert_eq!(
        why("/gpio-keys"),
        "gpio-keys/interrupts: its interrupt parent is not the GIC, so the hypervisor cannot route them"
    );
    assert_eq!(
        why("/pmu"),
        "interrupt <1 7 0x4> is not an SPI (a PPI belongs to every CPU)"
    );
    assert!(HostDevice::read(&[0; 16], "/pmu", GICD).is_err());
}

#[test]
fn specifier_triggers() {
    assert!(
        HostInterrupt::from_specifier([0, 1, 2])
            .unwrap_err()
            .contains("trigger 2")
    );
    assert!(HostInterrupt::from_specifier([0, 1, 8]).is_err());
    assert!(HostInterrupt::from_specifier([0, 988, 4]).is_err());
    assert_eq!(
        HostInterrupt::from_specifier([0, 987, 4]).unwrap().intid,
        1019
    );
}

#[test]
fn four_cell_gic_specifiers_keep_their_first_three_cells() {
    let mut w = FdtWriter::new().unwrap();
    let root = w.begin_node("").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    w.property_u32("interrupt-parent", GIC_PHANDLE).unwrap();
    let gic = w.begin_node("interrupt-controller@fe600000").unwrap();
    w.property_array_u64("reg", &[0xfe60_0000, 0x1_0000])
        .unwrap();
    w.property_u32("#interrupt-cells", 4).unwrap();
    w.property_phandle(GIC_PHANDLE).unwrap();
    w.end_node(gic).unwrap();
    let eth = w.begin_node("ethernet@fe1c0000").unwrap();
    w.property_array_u64("reg", &[0xfe1c_0000, 0x1_0000])
        .unwrap();
    w.property_array_u32("interrupts", &[0, 234, 4, 0, 0, 233, 4, 0])
        .unwrap();
    w.end_node(eth).unwrap();
    w.end_node(root).unwrap();
    let dtb = w.finish().unwrap();
    let device = HostDevice::read(&dtb, "/ethernet@fe1c0000", 0xfe60_0000).unwrap();
    let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
    assert_eq!(intids, [265, 266]);
    assert!(
        device
            .node
            .properties
            .contains(&NodeProperty::Interrupts(vec![[0, 234, 4], [0, 233, 4]]))
    );
}
