//! The device tree the hypervisor generates for a guest.
//!
//! Written with `vm-fdt`: a `linux,dummy-virt` root with 2 address and 2 size
//! cells, the RAM node, one `cpu@N` per vCPU (`reg` = the vCPU's MPIDR,
//! `enable-method = "psci"`), `/psci` (`arm,psci-1.0`, `method = "hvc"`), a 24 MHz
//! fixed clock and the PL011 (`arm,pl011` + `arm,primecell`, clocked by it), and
//! `/chosen` with `bootargs`, `stdout-path` and the initrd. When the guest has a
//! virtual GIC and timer (given in [`GuestDtbConfig`]), their nodes are added
//! and the UART gets its interrupt, and so do the virtio-mmio devices
//! (`virtio,mmio` nodes, one edge-triggered SPI each, `dma-coherent`: the
//! hypervisor reads and writes their rings and buffers through cacheable
//! mappings, so the guest must too). A GICv3 is an `arm,gic-v3` node
//! (distributor, redistributor region, maintenance PPI) with, when the VM
//! has one, its ITS as an `arm,gic-v3-its` child (`msi-controller`,
//! `#msi-cells` 1; the GIC node then has 2 address and size cells and an
//! empty `ranges`); a GICv2 an
//! `arm,cortex-a15-gic` node (distributor, CPU interface), and its PPI
//! specifiers carry the CPU mask of every vCPU in flags bits \[15:8\], as
//! the GICv2 binding asks.
//!
//! Host devices the VM owns (passthrough, `crate::vm::passthrough`) are
//! written at the root as the host tree has them
//! (`crate::platform::host_device::DeviceNode`): their windows as `reg`,
//! their `interrupts` with the guest GIC as `interrupt-parent` (a passed SPI
//! keeps its INTID), an `interrupt-map` with the guest GIC's phandle and a
//! parent unit address of the GIC's `#address-cells` (zeros; none without
//! an ITS). A passed PCI host bridge (`device_type = "pci"`) gets
//! `msi-map = <0 &its 0 0x10000>` (requester ID r is the virtual ITS's
//! DeviceID r; the ITS's `#msi-cells` of 1 rules out a bare `msi-parent`)
//! when [`GuestDtbConfig::pci_msi`] says its MSIs work (the physical ITS
//! sits at the virtual ITS's address and the hypervisor mirrors the guest's
//! device mappings there, `crate::vm::msi_shadow`). Without it, and on
//! every other node, no `msi-map` or `msi-parent`: Linux keeps the device
//! on its wired interrupt. The guest's
//! own phandles sit far above the small numbers device-tree compilers give,
//! so phandles inside a copied subtree cannot collide with them.

use crate::platform::host_device::{DeviceNode, NodeProperty};
use crate::platform::ranges::PhysRange;
use crate::vm::layout::vcpu_mpidr;
use alloc::format;
use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;
use vm_fdt::FdtWriter;

/// Phandle of the fixed clock.
const PHANDLE_CLOCK: u32 = 0x7fff_0001;
/// Phandle of the interrupt controller.
const PHANDLE_GIC: u32 = 0x7fff_0002;
/// Phandle of the GIC's ITS.
const PHANDLE_ITS: u32 = 0x7fff_0003;
/// Requester IDs of one PCI segment (16 bits), all mapped to the ITS.
const PCI_REQUESTER_IDS: u32 = 0x1_0000;
/// GIC interrupt specifier type of an SPI.
const GIC_SPI: u32 = 0;
/// GIC interrupt specifier type of a PPI.
const GIC_PPI: u32 = 1;
/// GIC interrupt specifier flags: level-sensitive, active high.
const IRQ_LEVEL_HIGH: u32 = 4;
/// GIC interrupt specifier flags: edge-triggered, rising.
const IRQ_EDGE_RISING: u32 = 1;

/// The windows of a virtual GIC besides its distributor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestGicFrames {
    /// GICv3: the redistributor region (one 128 KiB frame pair per vCPU).
    V3 {
        /// Redistributor region.
        redistributors: PhysRange,
        /// The ITS's frames, when the GIC has one.
        its: Option<PhysRange>,
    },
    /// GICv2: the CPU interface window.
    V2 {
        /// `GICC` window (the hardware's `GICV` behind it).
        cpu_interface: PhysRange,
    },
}

/// A virtual GIC as the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestGic {
    /// Distributor window.
    pub distributor: PhysRange,
    /// The other windows, which also say the version.
    pub frames: GuestGicFrames,
    /// The maintenance interrupt (a PPI, as an INTID).
    pub maintenance_intid: u32,
    /// The PL011's SPI number (INTID - 32).
    pub uart_spi: u32,
}

/// A virtio-mmio device as the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestVirtio {
    /// Its register window.
    pub window: PhysRange,
    /// Its SPI number (INTID - 32), edge-triggered.
    pub spi: u32,
}

/// The guest's architected timer PPIs (INTIDs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestTimer {
    /// Secure physical, non-secure physical, virtual and hypervisor timer INTIDs.
    pub intids: [u32; 4],
}

/// What goes into the guest's device tree.
#[derive(Clone, Copy, Debug)]
pub struct GuestDtbConfig<'a> {
    /// Guest RAM.
    pub ram: PhysRange,
    /// Number of vCPUs.
    pub vcpus: usize,
    /// The emulated PL011.
    pub uart: PhysRange,
    /// Kernel command line.
    pub bootargs: &'a str,
    /// The initrd in guest memory.
    pub initrd: Option<PhysRange>,
    /// The virtual GICv3, once the guest has one.
    pub gic: Option<GuestGic>,
    /// The architected timer's PPIs (the guest gets its virtual and EL1
    /// physical timers' interrupts), once the guest has a GIC.
    pub timer: Option<GuestTimer>,
    /// The virtio-mmio devices (they need the GIC for their interrupts).
    pub virtio: &'a [GuestVirtio],
    /// The host devices the VM owns, copied from the host tree.
    pub passed: &'a [&'a DeviceNode],
    /// A passed PCI host bridge gets an `msi-map` onto the virtual ITS (its
    /// MSIs reach the physical ITS the hypervisor mirrors, module doc).
    pub pci_msi: bool,
}

/// The device tree could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestDtbError(pub alloc::string::String);

impl core::fmt::Display for GuestDtbError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for GuestDtbError {}

impl From<vm_fdt::Error> for GuestDtbError {
    fn from(e: vm_fdt::Error) -> Self {
        Self(e.to_string())
    }
}

/// Writes the guest device tree blob.
pub fn build(config: &GuestDtbConfig<'_>) -> Result<Vec<u8>, GuestDtbError> {
    let mut fdt = FdtWriter::new()?;
    let root = fdt.begin_node("")?;
    fdt.property_string("compatible", "linux,dummy-virt")?;
    fdt.property_string("model", "hypervisor guest")?;
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 2)?;
    if config.gic.is_some() {
        fdt.property_u32("interrupt-parent", PHANDLE_GIC)?;
    }

    let uart_path = format!("/pl011@{:x}", config.uart.start);
    let chosen = fdt.begin_node("chosen")?;
    fdt.property_string("bootargs", config.bootargs)?;
    fdt.property_string("stdout-path", &uart_path)?;
    if let Some(initrd) = config.initrd {
        fdt.property_u64("linux,initrd-start", initrd.start)?;
        fdt.property_u64("linux,initrd-end", initrd.end)?;
    }
    fdt.end_node(chosen)?;

    let memory = fdt.begin_node(&format!("memory@{:x}", config.ram.start))?;
    fdt.property_string("device_type", "memory")?;
    fdt.property_array_u64("reg", &[config.ram.start, config.ram.size()])?;
    fdt.end_node(memory)?;

    let cpus = fdt.begin_node("cpus")?;
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 0)?;
    for index in 0..config.vcpus {
        let mpidr = vcpu_mpidr(index) & 0xff_00ff_ffff;
        let cpu = fdt.begin_node(&format!("cpu@{mpidr:x}"))?;
        fdt.property_string("device_type", "cpu")?;
        fdt.property_string("compatible", "arm,armv8")?;
        fdt.property_u64("reg", mpidr)?;
        fdt.property_string("enable-method", "psci")?;
        fdt.end_node(cpu)?;
    }
    fdt.end_node(cpus)?;

    let psci = fdt.begin_node("psci")?;
    fdt.property_string_list(
        "compatible",
        vec!["arm,psci-1.0".into(), "arm,psci-0.2".into()],
    )?;
    fdt.property_string("method", "hvc")?;
    fdt.end_node(psci)?;

    let clock = fdt.begin_node("apb-pclk")?;
    fdt.property_string("compatible", "fixed-clock")?;
    fdt.property_u32("#clock-cells", 0)?;
    fdt.property_u32("clock-frequency", 24_000_000)?;
    fdt.property_string("clock-output-names", "clk24mhz")?;
    fdt.property_phandle(PHANDLE_CLOCK)?;
    fdt.end_node(clock)?;

    if let Some(gic) = config.gic {
        let node = fdt.begin_node(&format!("intc@{:x}", gic.distributor.start))?;
        let (compatible, second) = match gic.frames {
            GuestGicFrames::V3 { redistributors, .. } => ("arm,gic-v3", redistributors),
            GuestGicFrames::V2 { cpu_interface } => ("arm,cortex-a15-gic", cpu_interface),
        };
        fdt.property_string("compatible", compatible)?;
        fdt.property_u32("#interrupt-cells", 3)?;
        // An ITS is a child node, addressed like the root's; without one,
        // dtc still wants the cell count on interrupt providers.
        let its = match gic.frames {
            GuestGicFrames::V3 { its, .. } => its,
            GuestGicFrames::V2 { .. } => None,
        };
        if its.is_some() {
            fdt.property_u32("#address-cells", 2)?;
            fdt.property_u32("#size-cells", 2)?;
            fdt.property_null("ranges")?;
        } else {
            fdt.property_u32("#address-cells", 0)?;
        }
        fdt.property_null("interrupt-controller")?;
        if let GuestGicFrames::V3 { .. } = gic.frames {
            fdt.property_u32("#redistributor-regions", 1)?;
        }
        fdt.property_array_u64(
            "reg",
            &[
                gic.distributor.start,
                gic.distributor.size(),
                second.start,
                second.size(),
            ],
        )?;
        // A GICv2 guest has no virtualization extensions: no maintenance
        // interrupt to describe.
        if let GuestGicFrames::V3 { .. } = gic.frames {
            fdt.property_array_u32(
                "interrupts",
                &[GIC_PPI, gic.maintenance_intid - 16, IRQ_LEVEL_HIGH],
            )?;
        }
        fdt.property_phandle(PHANDLE_GIC)?;
        if let Some(its) = its {
            let child = fdt.begin_node(&format!("its@{:x}", its.start))?;
            fdt.property_string("compatible", "arm,gic-v3-its")?;
            fdt.property_null("msi-controller")?;
            fdt.property_u32("#msi-cells", 1)?;
            fdt.property_array_u64("reg", &[its.start, its.size()])?;
            fdt.property_phandle(PHANDLE_ITS)?;
            fdt.end_node(child)?;
        }
        fdt.end_node(node)?;
    }

    if let Some(timer) = config.timer {
        let node = fdt.begin_node("timer")?;
        fdt.property_string_list(
            "compatible",
            vec!["arm,armv8-timer".into(), "arm,armv7-timer".into()],
        )?;
        fdt.property_null("always-on")?;
        // GICv2: the PPI reaches every vCPU's interface (flags [15:8]).
        let cpu_mask = match config.gic.map(|g| g.frames) {
            Some(GuestGicFrames::V2 { .. }) => ((1u32 << config.vcpus.min(8)) - 1) << 8,
            _ => 0,
        };
        let mut cells = Vec::new();
        for intid in timer.intids {
            // PPI, number relative to 16, level-high.
            cells.extend_from_slice(&[GIC_PPI, intid - 16, cpu_mask | IRQ_LEVEL_HIGH]);
        }
        fdt.property_array_u32("interrupts", &cells)?;
        fdt.end_node(node)?;
    }

    let uart = fdt.begin_node(&uart_path[1..])?;
    fdt.property_string_list(
        "compatible",
        vec!["arm,pl011".into(), "arm,primecell".into()],
    )?;
    fdt.property_array_u64("reg", &[config.uart.start, config.uart.size()])?;
    fdt.property_array_u32("clocks", &[PHANDLE_CLOCK, PHANDLE_CLOCK])?;
    fdt.property_string_list("clock-names", vec!["uartclk".into(), "apb_pclk".into()])?;
    if let Some(gic) = config.gic {
        fdt.property_array_u32("interrupts", &[GIC_SPI, gic.uart_spi, IRQ_LEVEL_HIGH])?;
        fdt.property_u32("interrupt-parent", PHANDLE_GIC)?;
    }
    fdt.end_node(uart)?;

    if config.gic.is_some() {
        for device in config.virtio {
            let node = fdt.begin_node(&format!("virtio_mmio@{:x}", device.window.start))?;
            fdt.property_string("compatible", "virtio,mmio")?;
            fdt.property_array_u64("reg", &[device.window.start, device.window.size()])?;
            fdt.property_array_u32("interrupts", &[GIC_SPI, device.spi, IRQ_EDGE_RISING])?;
            fdt.property_u32("interrupt-parent", PHANDLE_GIC)?;
            fdt.property_null("dma-coherent")?;
            fdt.end_node(node)?;
        }
    }

    // An `interrupt-map`'s parent unit address has the GIC's
    // `#address-cells`: 2 with an ITS child, else 0.
    let gic_address_cells = match config.gic.map(|gic| gic.frames) {
        Some(GuestGicFrames::V3 { its: Some(_), .. }) => 2,
        _ => 0,
    };
    for node in config.passed {
        write_passed(&mut fdt, node, gic_address_cells, config.pci_msi)?;
    }

    fdt.end_node(root)?;
    Ok(fdt.finish()?)
}

/// Writes a passed node and its subtree (see the module doc).
fn write_passed(
    fdt: &mut FdtWriter,
    node: &DeviceNode,
    gic_address_cells: usize,
    pci_msi: bool,
) -> Result<(), GuestDtbError> {
    let handle = fdt.begin_node(&node.name)?;
    let is_pci = node.properties.iter().any(|p| {
        matches!(p, NodeProperty::Verbatim { name, value } if name == "device_type" && value == b"pci\0")
    });
    if pci_msi && is_pci {
        // Requester ID r is DeviceID r of the ITS (`#msi-cells` 1 rules
        // out a bare `msi-parent`).
        fdt.property_array_u32("msi-map", &[0, PHANDLE_ITS, 0, PCI_REQUESTER_IDS])?;
    }
    for property in &node.properties {
        match property {
            NodeProperty::Verbatim { name, value } => fdt.property(name, value)?,
            NodeProperty::Windows(windows) => {
                let cells: Vec<u64> = windows.iter().flat_map(|w| [w.start, w.size()]).collect();
                fdt.property_array_u64("reg", &cells)?;
            }
            NodeProperty::Interrupts(specs) => {
                let cells: Vec<u32> = specs.iter().flatten().copied().collect();
                fdt.property_array_u32("interrupts", &cells)?;
                fdt.property_u32("interrupt-parent", PHANDLE_GIC)?;
            }
            NodeProperty::InterruptMap { entries, .. } => {
                let mut cells = Vec::new();
                for (child, spec) in entries {
                    cells.extend_from_slice(child);
                    cells.push(PHANDLE_GIC);
                    cells.extend(core::iter::repeat_n(0, gic_address_cells));
                    cells.extend_from_slice(spec);
                }
                fdt.property_array_u32("interrupt-map", &cells)?;
            }
        }
    }
    for child in &node.children {
        write_passed(fdt, child, gic_address_cells, false)?;
    }
    fdt.end_node(handle)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::layout::{GUEST_RAM_BASE, GUEST_UART_BASE, GUEST_UART_SIZE};
    use fdt::Fdt;
    use vm_fdt::FdtWriter;

    fn config(vcpus: usize, initrd: Option<PhysRange>) -> GuestDtbConfig<'static> {
        GuestDtbConfig {
            ram: PhysRange::from_start_size(GUEST_RAM_BASE, 128 << 20),
            vcpus,
            uart: PhysRange::from_start_size(GUEST_UART_BASE, GUEST_UART_SIZE),
            bootargs: "test=memory",
            initrd,
            gic: None,
            timer: None,
            virtio: &[],
            passed: &[],
            pci_msi: false,
        }
    }

    #[test]
    fn contract_nodes() {
        let initrd = PhysRange {
            start: 0x4040_0000,
            end: 0x4041_0000,
        };
        let blob = build(&config(4, Some(initrd))).expect("written");
        let fdt = Fdt::new(&blob).expect("parses");
        assert_eq!(fdt.chosen().bootargs(), Some("test=memory"));
        let stdout = fdt.chosen().stdout().expect("stdout-path resolves");
        assert_eq!(stdout.name, "pl011@9000000");
        assert!(
            stdout
                .compatible()
                .expect("compatible")
                .all()
                .any(|c| c == "arm,primecell")
        );
        let uart_reg = stdout.reg().expect("reg").next().expect("one");
        assert_eq!(uart_reg.starting_address as u64, GUEST_UART_BASE);
        let memory = fdt.memory().regions().next().expect("RAM");
        assert_eq!(memory.starting_address as u64, GUEST_RAM_BASE);
        assert_eq!(memory.size, Some(128 << 20));
        let cpus: Vec<usize> = fdt.cpus().map(|c| c.ids().first()).collect();
        assert_eq!(cpus, vec![0, 1, 2, 3]);
        for cpu in fdt.cpus() {
            assert_eq!(
                cpu.property("enable-method").and_then(|p| p.as_str()),
                Some("psci")
            );
        }
        let psci = fdt.find_node("/psci").expect("psci");
        assert_eq!(
            psci.property("method").and_then(|p| p.as_str()),
            Some("hvc")
        );
        assert!(
            psci.compatible()
                .expect("c")
                .all()
                .any(|c| c == "arm,psci-1.0")
        );
        let platform = crate::platform::Platform::from_dtb(&blob);
        assert!(
            platform.is_ok(),
            "the hypervisor's own parser reads it too: {platform:?}"
        );
        let platform = platform.expect("checked");
        assert_eq!(platform.initrd, Some(initrd));
        assert_eq!(platform.cpus.len(), 4);
    }

    #[test]
    fn virtio_nodes_with_edge_spis_when_the_guest_has_a_gic() {
        let devices = [
            GuestVirtio {
                window: PhysRange::from_start_size(0x0a00_0000, 0x200),
                spi: 16,
            },
            GuestVirtio {
                window: PhysRange::from_start_size(0x0a00_0200, 0x200),
                spi: 17,
            },
        ];
        let mut c = config(1, None);
        c.gic = Some(GuestGic {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            frames: GuestGicFrames::V3 {
                redistributors: PhysRange::from_start_size(0x080a_0000, 0x2_0000),
                its: None,
            },
            maintenance_intid: 25,
            uart_spi: 1,
        });
        c.virtio = &devices;
        let blob = build(&c).expect("written");
        let fdt = Fdt::new(&blob).expect("parses");
        let nodes: Vec<_> = fdt.find_all_nodes("/virtio_mmio").collect();
        assert_eq!(nodes.len(), 2);
        for (node, device) in nodes.iter().zip(&devices) {
            assert_eq!(
                node.compatible().expect("compatible").first(),
                "virtio,mmio"
            );
            let reg = node.reg().expect("reg").next().expect("one");
            assert_eq!(reg.starting_address as u64, device.window.start);
            assert_eq!(reg.size, Some(0x200));
            let irq = node.property("interrupts").expect("interrupts").value;
            let cells: Vec<u32> = irq
                .chunks(4)
                .map(|c| u32::from_be_bytes(c.try_into().expect("cell")))
                .collect();
            assert_eq!(cells, [GIC_SPI, device.spi, IRQ_EDGE_RISING]);
            assert!(node.property("dma-coherent").is_some());
        }
        // Without a GIC there is no interrupt to give them: no nodes.
        c.gic = None;
        let blob = build(&c).expect("written");
        let fdt = Fdt::new(&blob).expect("parses");
        assert_eq!(fdt.find_all_nodes("/virtio_mmio").count(), 0);
    }

    #[test]
    fn gic_and_timer_when_present() {
        let mut c = config(2, None);
        c.gic = Some(GuestGic {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            frames: GuestGicFrames::V3 {
                redistributors: PhysRange::from_start_size(0x080a_0000, 2 * 0x2_0000),
                its: None,
            },
            maintenance_intid: 25,
            uart_spi: 1,
        });
        c.timer = Some(GuestTimer {
            intids: [29, 30, 27, 26],
        });
        let blob = build(&c).expect("written");
        let platform = crate::platform::Platform::from_dtb(&blob).expect("parses");
        let gic = platform.gic.expect("gic");
        assert_eq!(gic.distributor.start, 0x0800_0000);
        assert_eq!(gic.redistributors[0].size(), 0x4_0000);
        assert_eq!(gic.maintenance_intid, Some(25));
        assert_eq!(platform.timer.map(|t| t.virt), Some(27));
        let fdt = Fdt::new(&blob).expect("parses");
        let uart = fdt.find_node("/pl011@9000000").expect("uart");
        let irq = uart.property("interrupts").expect("interrupts").value;
        assert_eq!(irq, [0u8, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4]);
        let gic_node = fdt.find_node("/intc@8000000").expect("gic node");
        assert!(gic_node.property("interrupt-controller").is_some());
        assert_eq!(
            gic_node
                .property("#interrupt-cells")
                .and_then(|p| p.as_usize()),
            Some(3)
        );
        let maintenance = gic_node.property("interrupts").expect("maintenance").value;
        assert_eq!(maintenance, [0u8, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 4]);
        let timer = fdt.find_node("/timer").expect("timer");
        let cells: Vec<u32> = timer
            .property("interrupts")
            .expect("timer interrupts")
            .value
            .chunks(4)
            .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(cells, [1, 13, 4, 1, 14, 4, 1, 11, 4, 1, 10, 4]);
        let parent = fdt
            .root()
            .property("interrupt-parent")
            .and_then(|p| p.as_usize())
            .expect("root interrupt-parent");
        assert_eq!(
            gic_node.property("phandle").and_then(|p| p.as_usize()),
            Some(parent)
        );
        let clocks = uart.property("clock-names").expect("clock names").value;
        assert_eq!(clocks, b"uartclk\0apb_pclk\0");
    }

    #[test]
    fn gicv2_node_and_ppi_cpu_masks() {
        let mut c = config(4, None);
        c.gic = Some(GuestGic {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            frames: GuestGicFrames::V2 {
                cpu_interface: PhysRange::from_start_size(0x0801_0000, 0x1_0000),
            },
            maintenance_intid: 25,
            uart_spi: 1,
        });
        c.timer = Some(GuestTimer {
            intids: [29, 30, 27, 26],
        });
        let blob = build(&c).expect("written");
        let platform = crate::platform::Platform::from_dtb(&blob).expect("parses");
        assert_eq!(platform.gic, None);
        let gic = platform.gicv2.expect("a GICv2 node");
        assert_eq!(gic.distributor.start, 0x0800_0000);
        assert_eq!(
            gic.cpu_interface,
            PhysRange::from_start_size(0x0801_0000, 0x1_0000)
        );
        assert_eq!(gic.hyp_interface, None, "the guest gets no GICH");
        assert_eq!(gic.maintenance_intid, None);
        assert_eq!(platform.uart_intid, Some(33));
        let fdt = Fdt::new(&blob).expect("parses");
        let node = fdt.find_node("/intc@8000000").expect("gic node");
        assert!(
            node.compatible()
                .expect("compatible")
                .all()
                .any(|c| c == "arm,cortex-a15-gic")
        );
        assert!(node.property("#redistributor-regions").is_none());
        let timer = fdt.find_node("/timer").expect("timer");
        let cells: Vec<u32> = timer
            .property("interrupts")
            .expect("timer interrupts")
            .value
            .chunks(4)
            .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")))
            .collect();
        // Four vCPUs: CPU mask 0xf in flags [15:8], level-high.
        assert_eq!(
            cells,
            [1, 13, 0xf04, 1, 14, 0xf04, 1, 11, 0xf04, 1, 10, 0xf04]
        );
    }

    /// A host tree with a GICv3 whose `#address-cells` is 2, a virtio-mmio
    /// node and a PCIe bridge with an `interrupt-map`.
    fn host_tree() -> Vec<u8> {
        let mut w = FdtWriter::new().unwrap();
        let root = w.begin_node("").unwrap();
        w.property_u32("#address-cells", 2).unwrap();
        w.property_u32("#size-cells", 2).unwrap();
        w.property_u32("interrupt-parent", 0x8001).unwrap();
        let gic = w.begin_node("intc@8000000").unwrap();
        w.property_array_u64("reg", &[0x0800_0000, 0x1_0000])
            .unwrap();
        w.property_u32("#interrupt-cells", 3).unwrap();
        w.property_u32("#address-cells", 2).unwrap();
        w.property_phandle(0x8001).unwrap();
        w.end_node(gic).unwrap();
        let virtio = w.begin_node("virtio_mmio@a003e00").unwrap();
        w.property_string("compatible", "virtio,mmio").unwrap();
        w.property_array_u64("reg", &[0x0a00_3e00, 0x200]).unwrap();
        w.property_array_u32("interrupts", &[0, 47, 1]).unwrap();
        w.property_null("dma-coherent").unwrap();
        w.end_node(virtio).unwrap();
        let pcie = w.begin_node("pcie@10000000").unwrap();
        w.property_string("compatible", "pci-host-ecam-generic")
            .unwrap();
        w.property_string("device_type", "pci").unwrap();
        w.property_u32("#address-cells", 3).unwrap();
        w.property_u32("#size-cells", 2).unwrap();
        w.property_u32("#interrupt-cells", 1).unwrap();
        w.property_array_u64("reg", &[0x40_1000_0000, 0x1000_0000])
            .unwrap();
        w.property_array_u32(
            "interrupt-map",
            &[
                0, 0, 0, 1, 0x8001, 0, 0, 0, 3, 4, 0x800, 0, 0, 1, 0x8001, 0, 0, 0, 4, 4,
            ],
        )
        .unwrap();
        let child = w.begin_node("bridge@1").unwrap();
        w.property_phandle(1).unwrap();
        w.end_node(child).unwrap();
        w.end_node(pcie).unwrap();
        w.end_node(root).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn passed_nodes_are_copied_for_the_guest_gic() {
        use crate::platform::host_device::HostDevice;
        let host = host_tree();
        let virtio = HostDevice::read(&host, "/virtio_mmio@a003e00", 0x0800_0000).unwrap();
        let pcie = HostDevice::read(&host, "/pcie@10000000", 0x0800_0000).unwrap();
        let mut c = config(2, None);
        c.gic = Some(GuestGic {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            frames: GuestGicFrames::V3 {
                redistributors: PhysRange::from_start_size(0x080a_0000, 0x4_0000),
                its: None,
            },
            maintenance_intid: 25,
            uart_spi: 1,
        });
        let passed = [&virtio.node, &pcie.node];
        c.passed = &passed;
        let blob = build(&c).expect("written");
        // The guest's copy reads back as the same device, through the
        // guest's GIC.
        let again = HostDevice::read(&blob, "/virtio_mmio@a003e00", 0x0800_0000).unwrap();
        assert_eq!(
            (again.windows, again.interrupts),
            (virtio.windows, virtio.interrupts)
        );
        let again = HostDevice::read(&blob, "/pcie@10000000", 0x0800_0000).unwrap();
        assert_eq!(again.interrupts, pcie.interrupts);
        assert_eq!(
            again.node, pcie.node,
            "interrupt-map, reg and the child kept"
        );
        let fdt = Fdt::new(&blob).expect("parses");
        let map: Vec<u32> = fdt
            .find_node("/pcie@10000000")
            .and_then(|n| n.property("interrupt-map"))
            .expect("interrupt-map")
            .value
            .chunks(4)
            .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(
            map,
            [
                0,
                0,
                0,
                1,
                PHANDLE_GIC,
                0,
                3,
                4,
                0x800,
                0,
                0,
                1,
                PHANDLE_GIC,
                0,
                4,
                4
            ],
            "the guest GIC's phandle and no parent unit address"
        );
        let virtio = fdt.find_node("/virtio_mmio@a003e00").expect("copied");
        assert_eq!(
            virtio
                .property("interrupt-parent")
                .and_then(|p| p.as_usize()),
            Some(PHANDLE_GIC as usize)
        );
    }

    #[test]
    fn a_passed_pci_bridge_gets_an_msi_map_onto_the_its_when_msis_work() {
        use crate::platform::host_device::HostDevice;
        let host = host_tree();
        let virtio = HostDevice::read(&host, "/virtio_mmio@a003e00", 0x0800_0000).unwrap();
        let pcie = HostDevice::read(&host, "/pcie@10000000", 0x0800_0000).unwrap();
        let mut c = config(2, None);
        c.gic = Some(GuestGic {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            frames: GuestGicFrames::V3 {
                redistributors: PhysRange::from_start_size(0x080a_0000, 0x4_0000),
                its: Some(PhysRange::from_start_size(0x0808_0000, 0x2_0000)),
            },
            maintenance_intid: 25,
            uart_spi: 1,
        });
        let passed = [&virtio.node, &pcie.node];
        c.passed = &passed;
        let msi_map = |blob: &[u8], path: &str| {
            Fdt::new(blob)
                .expect("parses")
                .find_node(path)
                .expect("copied")
                .property("msi-map")
                .map(|p| {
                    p.value
                        .chunks(4)
                        .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")))
                        .collect::<Vec<_>>()
                })
        };
        c.pci_msi = true;
        let blob = build(&c).expect("written");
        assert_eq!(
            msi_map(&blob, "/pcie@10000000"),
            Some(vec![0, PHANDLE_ITS, 0, 0x1_0000])
        );
        assert_eq!(msi_map(&blob, "/pcie@10000000/bridge@1"), None);
        assert_eq!(msi_map(&blob, "/virtio_mmio@a003e00"), None, "not PCI");
        c.pci_msi = false;
        let blob = build(&c).expect("written");
        assert_eq!(msi_map(&blob, "/pcie@10000000"), None, "INTx only");
    }
}
