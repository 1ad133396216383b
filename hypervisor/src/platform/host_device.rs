//! A host device-tree node a VM is given (passthrough, `vm.conf`
//! `device=PATH`), read from the host's device tree: what the hypervisor
//! must map, route and copy into the guest's tree.
//!
//! # What is read
//!
//! [`HostDevice::read`] finds the node by its full path and reads:
//!
//! - its `reg` windows, translated up through its buses' `ranges` to CPU
//!   physical addresses (as every device the hypervisor reads,
//!   [`crate::platform::dt_translate`]), and the parent side of its own
//!   `ranges` (a PCIe host bridge's I/O and memory windows, where the BARs
//!   of the devices behind it go): the VM gets them at the same addresses;
//! - its interrupts: the `interrupts` specifiers of the node and of every
//!   node below it, and the parent specifiers of an `interrupt-map` (a PCIe
//!   host bridge's INTx lines). Each must be an SPI of the host GIC
//!   (type 0, number, flags, and on GICs with `#interrupt-cells` 4 a
//!   fourth cell the guest's three-cell copy leaves out), edge rising (flags 1) or level
//!   high (flags 4), the only kinds a GIC takes; a PPI belongs to every
//!   CPU and cannot be given to one VM. An interrupt parent other than the
//!   GIC (a GPIO controller, a second-level interrupt controller) is
//!   refused, since the hypervisor cannot route its lines;
//! - the subtree as [`DeviceNode`]s, for the guest's copy: every property
//!   as it is, except those the guest's tree cannot keep. `interrupt-parent`
//!   becomes the guest GIC's (the writer puts its own), `reg` of the top
//!   node is written from the translated windows, an `interrupt-map`'s
//!   parent entries are rewritten for the guest GIC, and references to host
//!   nodes outside the subtree (`clocks`, `resets`, `power-domains`,
//!   `pinctrl-*`, `phys`, `dmas`, `iommus`, `msi-parent`, `msi-map`) are
//!   left out and listed in [`HostDevice::dropped`]: the guest cannot drive
//!   the host's clock or reset controllers, so firmware must leave the
//!   device's clocks running. `phandle`s inside the subtree are kept, so a
//!   reference from one of its nodes to another (an Ethernet MAC's
//!   `phy-handle` to its MDIO child) still holds; the guest's own phandles
//!   sit far above any a tree compiler hands out.
//!
//! A node whose `status` is not `okay` is refused (the firmware says the
//! device is not there or not usable), and so is a `ranges` below a bus
//! that translates addresses: the guest gets the node at its root, where
//! the child addresses would no longer mean the same.

use super::device_tree::{Located, PlatformError, all_located, device_regs};
use crate::platform::ranges::PhysRange;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use fdt::Fdt;
use fdt::node::FdtNode;

/// Properties naming host nodes outside a passed subtree: left out of the
/// guest's copy (exact names, and `pinctrl-` prefixed ones).
const HOST_REFERENCES: [&str; 8] = [
    "clocks",
    "resets",
    "power-domains",
    "phys",
    "dmas",
    "iommus",
    "msi-parent",
    "msi-map",
];

/// How a GIC interrupt is signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Edge, rising (specifier flags 1).
    Edge,
    /// Level, active high (specifier flags 4).
    Level,
}

/// An SPI a passed device raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostInterrupt {
    /// Its INTID (32 + the specifier's number).
    pub intid: u32,
    /// Edge or level, as the specifier's flags say.
    pub trigger: Trigger,
}

impl HostInterrupt {
    /// Reads a three-cell GIC specifier.
    fn from_specifier(cells: [u32; 3]) -> Result<Self, String> {
        let [kind, number, flags] = cells;
        if kind != 0 {
            return Err(alloc::format!(
                "interrupt <{kind} {number} {flags:#x}> is not an SPI (a PPI belongs to every CPU)"
            ));
        }
        let trigger = match flags & 0xf {
            1 => Trigger::Edge,
            4 => Trigger::Level,
            other => {
                return Err(alloc::format!(
                    "interrupt <{kind} {number} {flags:#x}>: trigger {other} is neither edge rising (1) nor level high (4)"
                ));
            }
        };
        let intid = number
            .checked_add(32)
            .filter(|&intid| intid < 1020)
            .ok_or_else(|| alloc::format!("interrupt <{kind} {number} {flags:#x}>: no such SPI"))?;
        Ok(Self { intid, trigger })
    }
}

/// A property of a copied node, as the guest's tree gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeProperty {
    /// Copied byte for byte.
    Verbatim {
        /// Its name.
        name: String,
        /// Its value.
        value: Vec<u8>,
    },
    /// The top node's `reg`: its windows as CPU addresses (the guest's root
    /// has two address and two size cells).
    Windows(Vec<PhysRange>),
    /// `interrupts`: GIC specifiers, three cells each.
    Interrupts(Vec<[u32; 3]>),
    /// `interrupt-map`: each entry's child unit address and interrupt
    /// (`child_cells` cells) and its GIC specifier; the writer puts the
    /// guest GIC's phandle between them.
    InterruptMap {
        /// Cells of the child side of each entry.
        child_cells: usize,
        /// The entries.
        entries: Vec<(Vec<u32>, [u32; 3])>,
    },
}

/// A node of a passed subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNode {
    /// Its name with unit address (`virtio_mmio@a003e00`).
    pub name: String,
    /// Its properties, in tree order.
    pub properties: Vec<NodeProperty>,
    /// Its children.
    pub children: Vec<DeviceNode>,
}

/// A host device-tree node a VM is given, read (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDevice {
    /// The path it was asked for by.
    pub path: String,
    /// Its register windows, CPU physical addresses.
    pub windows: Vec<PhysRange>,
    /// The SPIs it raises, each once, in INTID order.
    pub interrupts: Vec<HostInterrupt>,
    /// The subtree for the guest's tree.
    pub node: DeviceNode,
    /// Properties left out of the copy (`node/property`).
    pub dropped: Vec<String>,
    /// The `compatible` strings of the top node.
    pub compatible: Vec<String>,
    /// Why an interrupt of the subtree cannot be routed, if one cannot (the
    /// node is then refused, after the checks of who holds it).
    pub unroutable: Option<String>,
}

/// Why a node cannot be passed (the text goes after the node's path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDeviceError(pub String);

impl core::fmt::Display for HostDeviceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for HostDeviceError {}

fn refuse(why: impl Into<String>) -> HostDeviceError {
    HostDeviceError(why.into())
}

/// Big-endian 32-bit cells of a property value.
fn cells(value: &[u8]) -> Vec<u32> {
    value
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn u32_property(node: FdtNode<'_, '_>, name: &str) -> Option<u32> {
    node.property(name)
        .and_then(|p| cells(p.value).first().copied())
}

/// Whether the node says it is usable (`status` absent, `okay` or `ok`).
fn enabled(node: FdtNode<'_, '_>) -> bool {
    node.property("status")
        .and_then(|p| p.as_str())
        .is_none_or(|s| s == "okay" || s == "ok")
}

impl HostDevice {
    /// Reads the node at `path` of the host tree `dtb`; `gic_distributor`
    /// is the host GIC's distributor address (an interrupt parent must be
    /// that GIC).
    pub fn read(dtb: &[u8], path: &str, gic_distributor: u64) -> Result<Self, HostDeviceError> {
        let fdt =
            Fdt::new(dtb).map_err(|e| refuse(alloc::format!("invalid device tree: {e:?}")))?;
        let found = fdt
            .find_node(path)
            .filter(|node| node.name == path.rsplit('/').next().unwrap_or(""))
            .ok_or_else(|| refuse("no such node in the host device tree"))?;
        let nodes = all_located(&fdt);
        let located = nodes
            .iter()
            .copied()
            .find(|l| core::ptr::eq(l.node.name, found.name))
            .ok_or_else(|| refuse("no such node in the host device tree"))?;
        if !enabled(found) {
            return Err(refuse("its status is not \"okay\""));
        }
        let mut windows =
            device_regs(&nodes, located).map_err(|e: PlatformError| refuse(e.to_string()))?;
        let mut reader = SubtreeReader {
            fdt: &fdt,
            nodes: &nodes,
            gic_distributor,
            interrupts: Vec::new(),
            dropped: Vec::new(),
            translating_bus: located.parent_has_translation(&nodes),
            unroutable: None,
        };
        let node = reader.copy(located, true)?;
        // A bridge's `ranges` (a PCIe host bridge's I/O and memory windows,
        // where its devices' BARs go) are windows of the device too; the
        // copy kept the property, and its parent side is a CPU address
        // (a translating bus refused it above).
        windows.extend(bridge_windows(found, located.address_cells())?);
        let mut interrupts = reader.interrupts;
        interrupts.sort_by_key(|i| i.intid);
        interrupts.dedup_by_key(|i| i.intid);
        let compatible = found
            .compatible()
            .map(|c| c.all().map(ToString::to_string).collect())
            .unwrap_or_default();
        Ok(Self {
            path: path.to_string(),
            windows,
            interrupts,
            node,
            dropped: reader.dropped,
            compatible,
            unroutable: reader.unroutable,
        })
    }

    /// Whether the top node is compatible with `name`.
    pub fn is_compatible(&self, name: &str) -> bool {
        self.compatible.iter().any(|c| c == name)
    }
}

/// The translated `reg` windows of every node of the host tree `dtb` that
/// overlap `range` (the neighbours of a passed window in its page).
pub fn windows_overlapping(dtb: &[u8], range: PhysRange) -> Vec<PhysRange> {
    let Ok(fdt) = Fdt::new(dtb) else {
        return Vec::new();
    };
    let nodes = all_located(&fdt);
    nodes
        .iter()
        .filter_map(|l| device_regs(&nodes, *l).ok())
        .flatten()
        .filter(|w| w.start < range.end && range.start < w.end)
        .collect()
}

/// The parent-side windows of a node's own `ranges`: entries of the
/// node's `#address-cells` child address, `parent_cells` parent address
/// and the node's `#size-cells` size.
fn bridge_windows(
    node: FdtNode<'_, '_>,
    parent_cells: usize,
) -> Result<Vec<PhysRange>, HostDeviceError> {
    let Some(ranges) = node.property("ranges").filter(|r| !r.value.is_empty()) else {
        return Ok(Vec::new());
    };
    let child = u32_property(node, "#address-cells").unwrap_or(2) as usize;
    let size = u32_property(node, "#size-cells").unwrap_or(1) as usize;
    let entry = child + parent_cells + size;
    let all = cells(ranges.value);
    let bad = || refuse(alloc::format!("{}/ranges: malformed", node.name));
    if !(1..=2).contains(&parent_cells)
        || !(1..=2).contains(&size)
        || !all.len().is_multiple_of(entry)
    {
        return Err(bad());
    }
    let number = |c: &[u32]| c.iter().fold(0u64, |n, &cell| n << 32 | u64::from(cell));
    let mut out = Vec::new();
    for e in all.chunks_exact(entry) {
        let start = number(&e[child..child + parent_cells]);
        let length = number(&e[child + parent_cells..]);
        if length == 0 || start.checked_add(length).is_none() {
            return Err(bad());
        }
        out.push(PhysRange::from_start_size(start, length));
    }
    Ok(out)
}

/// Walks a passed subtree (see the module doc).
struct SubtreeReader<'f, 'b, 'a> {
    fdt: &'b Fdt<'a>,
    nodes: &'f [Located<'b, 'a>],
    gic_distributor: u64,
    interrupts: Vec<HostInterrupt>,
    dropped: Vec<String>,
    translating_bus: bool,
    unroutable: Option<String>,
}

impl<'b, 'a> SubtreeReader<'_, 'b, 'a> {
    /// Whether `node`'s interrupt parent is the host GIC, and its
    /// `#address-cells` (for `interrupt-map` entries that name it).
    fn is_gic(&self, parent: FdtNode<'b, 'a>) -> bool {
        self.nodes
            .iter()
            .copied()
            .find(|l| core::ptr::eq(l.node.name, parent.name))
            .and_then(|l| device_regs(self.nodes, l).ok())
            .and_then(|regs| regs.first().copied())
            .is_some_and(|regs| regs.start == self.gic_distributor)
    }

    /// The node's interrupt parent: its own `interrupt-parent`, else the
    /// nearest ancestor's.
    fn interrupt_parent(&self, located: Located<'b, 'a>) -> Option<FdtNode<'b, 'a>> {
        let mut current = Some(located);
        while let Some(l) = current {
            if l.node.property("interrupt-parent").is_some() {
                return l.node.interrupt_parent();
            }
            current = l.parent.and_then(|i| self.nodes.get(i).copied());
        }
        self.fdt
            .find_node("/")
            .and_then(|root| root.interrupt_parent())
    }

    /// `interrupts` of a node whose parent is the GIC, `size` cells per
    /// specifier (3; 4 where the GIC's fourth cell names a PPI partition,
    /// always 0 for an SPI): the first three cells of each.
    fn gic_specifiers(
        &mut self,
        node: &str,
        values: &[u32],
        size: usize,
    ) -> Result<Vec<[u32; 3]>, HostDeviceError> {
        if !(3..=4).contains(&size) || !values.len().is_multiple_of(size) {
            return Err(refuse(alloc::format!(
                "{node}/interrupts: not GIC specifiers of three or four cells"
            )));
        }
        let mut out = Vec::new();
        for spec in values.chunks_exact(size) {
            let spec = [spec[0], spec[1], spec[2]];
            self.interrupts
                .push(HostInterrupt::from_specifier(spec).map_err(refuse)?);
            out.push(spec);
        }
        Ok(out)
    }

    fn interrupt_map(
        &mut self,
        located: Located<'b, 'a>,
        value: &[u8],
    ) -> Result<NodeProperty, HostDeviceError> {
        let node = located.node;
        let bad = |why: &str| refuse(alloc::format!("{}/interrupt-map: {why}", node.name));
        let child_cells = (u32_property(node, "#address-cells").unwrap_or(2)
            + u32_property(node, "#interrupt-cells").unwrap_or(1))
            as usize;
        let all = cells(value);
        let mut entries = Vec::new();
        let mut at = 0;
        while at < all.len() {
            let child = all
                .get(at..at + child_cells)
                .ok_or_else(|| bad("truncated entry"))?
                .to_vec();
            let phandle = *all
                .get(at + child_cells)
                .ok_or_else(|| bad("truncated entry"))?;
            let parent = self
                .fdt
                .find_phandle(phandle)
                .ok_or_else(|| bad("names no node"))?;
            if !self.is_gic(parent) {
                return Err(bad("maps to an interrupt controller other than the GIC"));
            }
            let parent_address = u32_property(parent, "#address-cells").unwrap_or(0) as usize;
            let size = u32_property(parent, "#interrupt-cells").unwrap_or(3) as usize;
            if !(3..=4).contains(&size) {
                return Err(bad("the GIC's specifiers are not of three or four cells"));
            }
            let start = at + child_cells + 1 + parent_address;
            let spec = all
                .get(start..start + size)
                .ok_or_else(|| bad("truncated entry"))?;
            let spec = [spec[0], spec[1], spec[2]];
            self.interrupts
                .push(HostInterrupt::from_specifier(spec).map_err(refuse)?);
            entries.push((child, spec));
            at = start + size;
        }
        Ok(NodeProperty::InterruptMap {
            child_cells,
            entries,
        })
    }

    /// Keeps the first reason an interrupt cannot be routed: reported
    /// after the checks of what holds the node (the GIC's own node has
    /// PPIs, and "the hypervisor uses it" is the better answer).
    fn unroutable(&mut self, why: HostDeviceError) {
        self.unroutable.get_or_insert(why.0);
    }

    fn interrupts(
        &mut self,
        located: Located<'b, 'a>,
        value: &[u8],
    ) -> Result<Vec<[u32; 3]>, HostDeviceError> {
        let node = located.node;
        let parent = self
            .interrupt_parent(located)
            .filter(|p| self.is_gic(*p))
            .ok_or_else(|| {
                refuse(alloc::format!(
                    "{}/interrupts: its interrupt parent is not the GIC, so the hypervisor cannot route them",
                    node.name
                ))
            })?;
        let size = u32_property(parent, "#interrupt-cells").unwrap_or(3) as usize;
        self.gic_specifiers(node.name, &cells(value), size)
    }

    fn copy(&mut self, located: Located<'b, 'a>, top: bool) -> Result<DeviceNode, HostDeviceError> {
        let node = located.node;
        let mut properties = Vec::new();
        for property in node.properties() {
            let name = property.name;
            match name {
                "interrupts-extended" => self.unroutable(refuse(alloc::format!(
                    "{}/interrupts-extended: interrupts of several controllers cannot be routed",
                    node.name
                ))),
                "interrupt-parent" => {}
                "reg" if top => {}
                "interrupts" => match self.interrupts(located, property.value) {
                    Ok(specs) => properties.push(NodeProperty::Interrupts(specs)),
                    Err(e) => self.unroutable(e),
                },
                "interrupt-map" => match self.interrupt_map(located, property.value) {
                    Ok(map) => properties.push(map),
                    Err(e) => self.unroutable(e),
                },
                "ranges" | "dma-ranges" if self.translating_bus => {
                    return Err(refuse(alloc::format!(
                        "{}/{name}: its bus translates addresses, and the guest gets the node at its root",
                        node.name
                    )));
                }
                _ if HOST_REFERENCES.contains(&name) || name.starts_with("pinctrl-") => {
                    self.dropped.push(alloc::format!("{}/{name}", node.name));
                }
                _ => properties.push(NodeProperty::Verbatim {
                    name: name.to_string(),
                    value: property.value.to_vec(),
                }),
            }
        }
        if top {
            let windows = device_regs(self.nodes, located).map_err(|e| refuse(e.to_string()))?;
            if !windows.is_empty() {
                properties.insert(0, NodeProperty::Windows(windows));
            }
        }
        let mut children = Vec::new();
        let index = self
            .nodes
            .iter()
            .position(|l| core::ptr::eq(l.node.name, node.name));
        for child in self
            .nodes
            .iter()
            .copied()
            .filter(|l| l.parent.is_some() && l.parent == index)
        {
            if enabled(child.node) {
                children.push(self.copy(child, false)?);
            }
        }
        Ok(DeviceNode {
            name: node.name.to_string(),
            properties,
            children,
        })
    }
}

#[cfg(test)]
mod tests;
