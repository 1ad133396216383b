//! The device-tree parser: the host platform ([`Platform`]) read from the
//! device tree the boot loader passes in `x0`.
//!
//! Everything the hypervisor needs to know about the machine comes from here:
//! RAM banks, reserved memory (the header's reservation block and
//! `/reserved-memory`), the console UART, the GICv3 distributor and redistributor regions, the CPUs'
//! MPIDRs, the PSCI conduit (`/psci` `method`), the boot payload
//! (`/chosen` `linux,initrd-start`/`-end`) and the timer's interrupts. Only
//! properties are read, never guessed: a missing required node is an error.
//!
//! The console: `/chosen/stdout-path` (or the older `linux,stdout-path`) names
//! it as a path or an alias, optionally followed by `:options` (e.g.
//! `serial2:1500000n8`; the options are ignored, the firmware's line settings
//! are kept). The node it names is used when it is usable: `status` absent,
//! `okay` or `ok`; a compatible the hypervisor drives (`arm,pl011`; `ns16550a`,
//! `ns16550` or `snps,dw-apb-uart`, with `reg-shift` 0 to 2 and `reg-io-width`
//! 1, 2 or 4; `brcm,bcm2835-aux-uart`, the Raspberry Pi's mini UART, as a
//! 16550 with `reg-shift` 2 and 4-byte access); a `reg` that translates to a
//! CPU address. Otherwise, or without `stdout-path`, the first usable
//! UART in tree order is the console, and the reason the named one was passed
//! over is kept for the banner ([`Platform::console_note`]).
//!
//! Device addresses: the `reg` of every device read here (UARTs, GIC frames)
//! is translated up through its ancestors' `ranges` to a CPU physical address
//! ([`crate::platform::dt_translate`]; e.g. the Raspberry Pi 4's `/soc` maps bus address
//! `0x7e20_1000` to `0xfe20_1000`). A UART whose `reg` does not translate is
//! passed over with that reason; a GIC whose `reg` does not is an error
//! ([`PlatformError::Untranslatable`]). `/memory` and `/reserved-memory` are
//! read as they are (CPU addresses at the root).

use crate::platform::dt_translate::{self, Bus};
use crate::platform::ranges::PhysRange;
use crate::vocabulary::timers::TimerIrqs;
use crate::vocabulary::uart_kind::{IoWidth, UartKind};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use fdt::Fdt;
use fdt::node::FdtNode;

/// How PSCI calls reach the firmware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsciConduit {
    /// `SMC #0` (what QEMU's `virtualization=on` provides).
    Smc,
    /// `HVC #0` (only usable by an EL1 kernel under a hypervisor).
    Hvc,
}

/// A GICv3 as the device tree describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gicv3 {
    /// The distributor's registers.
    pub distributor: PhysRange,
    /// The redistributor regions.
    pub redistributors: Vec<PhysRange>,
    /// The virtual CPU interface's maintenance interrupt (its `interrupts`
    /// property), when the tree gives it.
    pub maintenance_intid: Option<u32>,
    /// The GIC is QEMU's emulation (the root is `linux,dummy-virt`), whose
    /// virtual CPU interface mishandles a binary point written with bits
    /// above its field (`crate::devices::vgic::cpu_interface`).
    pub emulated_by_qemu: bool,
    /// The first ITS (`arm,gic-v3-its`, its control and translation frames),
    /// when the tree has one.
    pub its: Option<PhysRange>,
}

/// A GICv2 as the device tree describes it (`arm,cortex-a15-gic`,
/// `arm,gic-400`): `reg` is the distributor, the CPU interface, and with the
/// virtualization extensions the virtual interface control (`GICH`) and the
/// virtual CPU interface (`GICV`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gicv2 {
    /// The distributor's registers (`GICD`).
    pub distributor: PhysRange,
    /// The CPU interface (`GICC`).
    pub cpu_interface: PhysRange,
    /// The virtual interface control registers (`GICH`), when present.
    pub hyp_interface: Option<PhysRange>,
    /// The virtual CPU interface (`GICV`), when present.
    pub virtual_cpu: Option<PhysRange>,
    /// The maintenance interrupt (its `interrupts` property), when given.
    pub maintenance_intid: Option<u32>,
}

/// What the hypervisor learned about the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// Model string of the root node.
    pub model: String,
    /// RAM banks, sorted and merged.
    pub ram: Vec<PhysRange>,
    /// Memory that must not be used (reservation block and `/reserved-memory`).
    pub reserved: Vec<PhysRange>,
    /// The `/reserved-memory` regions marked `no-map`: not even mapped, since
    /// speculative accesses to them may fault (secure firmware memory).
    pub no_map: Vec<PhysRange>,
    /// The console UART's registers.
    pub uart: PhysRange,
    /// Which driver the console UART needs, and its register layout.
    pub uart_kind: UartKind,
    /// Whether `/chosen/stdout-path` named the console (else it is the first
    /// usable UART).
    pub uart_from_stdout_path: bool,
    /// Why the UART that `stdout-path` names was passed over, if it was.
    pub console_note: Option<String>,
    /// The console UART's interrupt as a GIC INTID (its `interrupts`
    /// property: an SPI `<0 n flags>` is INTID 32 + n), when the tree gives one.
    pub uart_intid: Option<u32>,
    /// The interrupt controller, when it is a GICv3.
    pub gic: Option<Gicv3>,
    /// The interrupt controller, when it is a GICv2 (and no GICv3 was found).
    pub gicv2: Option<Gicv2>,
    /// The timer interrupts, when the tree describes them.
    pub timer: Option<TimerIrqs>,
    /// MPIDR of each CPU, in device-tree order.
    pub cpus: Vec<u64>,
    /// PSCI conduit.
    pub psci: PsciConduit,
    /// The boot payload (`linux,initrd-start`..`linux,initrd-end`), if any.
    pub initrd: Option<PhysRange>,
    /// The device tree blob itself.
    pub dtb_size: u64,
}

/// Why the device tree could not describe a usable platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlatformError {
    /// The blob is not a valid flattened device tree.
    BadDeviceTree(String),
    /// No `memory` node with a `reg`.
    NoMemory,
    /// No UART the hypervisor can drive.
    NoUart,
    /// No CPU nodes with a readable `reg`.
    NoCpus,
    /// No `/psci` node with a `method`.
    NoPsci,
    /// `/psci` `method` is neither `smc` nor `hvc`.
    BadPsciMethod(String),
    /// A property does not have the size its cells say (node/property).
    BadProperty(String),
    /// A device's `reg` cannot be translated to a CPU address through its
    /// buses' `ranges` (node/reg: why).
    Untranslatable(String),
}

impl core::fmt::Display for PlatformError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadDeviceTree(e) => write!(f, "invalid device tree: {e}"),
            Self::NoMemory => write!(f, "device tree has no memory node"),
            Self::NoUart => write!(
                f,
                "device tree has no usable UART (arm,pl011, ns16550a, ns16550, snps,dw-apb-uart or brcm,bcm2835-aux-uart, not disabled)"
            ),
            Self::NoCpus => write!(f, "device tree has no CPU nodes"),
            Self::NoPsci => write!(f, "device tree has no /psci node with a method"),
            Self::BadPsciMethod(m) => write!(f, "unknown PSCI method {m:?}"),
            Self::BadProperty(p) => write!(f, "malformed property {p}"),
            Self::Untranslatable(r) => write!(f, "device address not translatable: {r}"),
        }
    }
}

impl core::error::Error for PlatformError {}

/// Reads big-endian cells: 1 or 2 cells per number.
fn read_cells(bytes: &[u8], cells: usize) -> Option<u64> {
    match cells {
        1 => Some(u64::from(u32::from_be_bytes(
            bytes.get(..4)?.try_into().ok()?,
        ))),
        2 => Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?)),
        _ => None,
    }
}

/// A node with the `#address-cells`/`#size-cells` of its parent, which say how
/// its `reg` is encoded, and where its parent is in [`all_located`]'s list.
#[derive(Clone, Copy)]
pub(super) struct Located<'b, 'a> {
    pub(super) node: FdtNode<'b, 'a>,
    address_cells: usize,
    size_cells: usize,
    /// The parent's index in the list; `None` for children of the root.
    pub(super) parent: Option<usize>,
}

impl Located<'_, '_> {
    /// The `#address-cells` of the node's parent (how its `reg` and the
    /// parent side of its `ranges` write addresses).
    pub(super) fn address_cells(&self) -> usize {
        self.address_cells
    }

    /// Whether an address in this node's own address space (its `ranges`'
    /// parent side) differs from a CPU address written with two cells at
    /// the root: an ancestor translates (a non-empty `ranges`), or the
    /// parent does not use two address cells.
    pub(super) fn parent_has_translation(&self, nodes: &[Located<'_, '_>]) -> bool {
        if self.address_cells != 2 {
            return true;
        }
        let mut parent = self.parent;
        while let Some(index) = parent {
            let Some(bus) = nodes.get(index) else {
                return true;
            };
            if bus
                .node
                .property("ranges")
                .is_some_and(|r| !r.value.is_empty())
            {
                return true;
            }
            parent = bus.parent;
        }
        false
    }
}

/// Every node of the tree with its parent's cell sizes, in tree order. Nodes
/// are told apart by the address of their name inside the blob, which is
/// unique per node.
pub(super) fn all_located<'b, 'a>(fdt: &'b Fdt<'a>) -> Vec<Located<'b, 'a>> {
    fn visit<'b, 'a>(node: FdtNode<'b, 'a>, index: Option<usize>, out: &mut Vec<Located<'b, 'a>>) {
        let sizes = node.cell_sizes();
        for child in node.children() {
            out.push(Located {
                node: child,
                address_cells: sizes.address_cells,
                size_cells: sizes.size_cells,
                parent: index,
            });
            visit(child, Some(out.len() - 1), out);
        }
    }
    let mut out = Vec::new();
    if let Some(root) = fdt.find_node("/") {
        visit(root, None, &mut out);
    }
    out
}

/// The `reg` entries of a node as ranges, untranslated: addresses in its
/// parent's address space (what `/memory` and `/reserved-memory` give).
fn reg_ranges(located: Located<'_, '_>) -> Result<Vec<PhysRange>, PlatformError> {
    let node = located.node;
    let bad = || PlatformError::BadProperty(alloc::format!("{}/reg", node.name));
    let Some(reg) = node.property("reg") else {
        return Ok(Vec::new());
    };
    let (ac, sc) = (located.address_cells, located.size_cells);
    let entry = 4 * (ac + sc);
    if entry == 0 || reg.value.len() % entry != 0 || sc == 0 {
        return Err(bad());
    }
    reg.value
        .chunks(entry)
        .map(|chunk| {
            let start = read_cells(chunk, ac).ok_or_else(bad)?;
            let size = read_cells(&chunk[4 * ac..], sc).ok_or_else(bad)?;
            Ok(PhysRange::from_start_size(start, size))
        })
        .collect()
}

/// The buses between a node and the root, innermost first, as
/// [`dt_translate::translate`] walks them.
fn buses<'b>(nodes: &[Located<'b, '_>], located: Located<'b, '_>) -> Vec<Bus<'b>> {
    let mut out = Vec::new();
    let mut parent = located.parent;
    while let Some(index) = parent {
        let Some(bus) = nodes.get(index) else { break };
        let sizes = bus.node.cell_sizes();
        out.push(Bus {
            name: bus.node.name,
            ranges: bus.node.property("ranges").map(|p| p.value),
            child_address_cells: sizes.address_cells,
            child_size_cells: sizes.size_cells,
            parent_address_cells: bus.address_cells,
        });
        parent = bus.parent;
    }
    out
}

/// The `reg` entries of a device node as CPU physical addresses: each is
/// translated up through its ancestors' `ranges` (see [`dt_translate`]).
pub(super) fn device_regs(
    nodes: &[Located<'_, '_>],
    located: Located<'_, '_>,
) -> Result<Vec<PhysRange>, PlatformError> {
    let buses = buses(nodes, located);
    reg_ranges(located)?
        .into_iter()
        .map(|r| {
            let start = dt_translate::translate(r.start, r.size(), &buses).map_err(|e| {
                PlatformError::Untranslatable(alloc::format!("{}/reg: {e}", located.node.name))
            })?;
            Ok(PhysRange::from_start_size(start, r.size()))
        })
        .collect()
}

pub(super) fn is_compatible(node: FdtNode<'_, '_>, name: &str) -> bool {
    node.compatible()
        .is_some_and(|c| c.all().any(|c| c == name))
}

/// A `/chosen` property holding one or two cells (initrd addresses).
fn chosen_address(
    chosen: Option<FdtNode<'_, '_>>,
    name: &str,
) -> Result<Option<u64>, PlatformError> {
    let Some(prop) = chosen.and_then(|c| c.property(name)) else {
        return Ok(None);
    };
    match prop.value.len() {
        4 => Ok(read_cells(prop.value, 1)),
        8 => Ok(read_cells(prop.value, 2)),
        _ => Err(PlatformError::BadProperty(alloc::format!("/chosen/{name}"))),
    }
}

/// The INTID of the first `(type, number, flags)` GIC interrupt specifier
/// in an `interrupts` value: type 0 is an SPI (INTID 32 + number), type 1 a
/// PPI (INTID 16 + number).
pub(super) fn gic_intid(cells: &[u8]) -> Option<u32> {
    let kind = read_cells(cells.get(..4)?, 1)?;
    let number = read_cells(cells.get(4..8)?, 1)? as u32;
    match kind {
        0 => Some(32 + number),
        1 => Some(16 + number),
        _ => None,
    }
}

/// `#interrupt-cells` of `node`'s interrupt parent: its own
/// `interrupt-parent`, else the one the root names (ancestors in between are
/// not consulted; device trees put it on the root), else 3, the GIC's usual
/// count.
fn interrupt_cells(fdt: &Fdt<'_>, node: FdtNode<'_, '_>) -> usize {
    node.interrupt_parent()
        .or_else(|| fdt.find_node("/").and_then(|root| root.interrupt_parent()))
        .and_then(|parent| parent.interrupt_cells())
        .filter(|&cells| cells >= 3)
        .unwrap_or(3)
}

/// Which driver a UART node needs, or why the hypervisor cannot use it.
fn uart_kind(node: FdtNode<'_, '_>) -> Result<UartKind, String> {
    if let Some(status) = node.property("status").and_then(|p| p.as_str())
        && status != "okay"
        && status != "ok"
    {
        return Err(alloc::format!("status \"{status}\""));
    }
    let u32_prop = |name: &str, default: u32| {
        node.property(name)
            .map_or(Some(default), |p| read_cells(p.value, 1).map(|v| v as u32))
    };
    let Some(compatible) = node.compatible() else {
        return Err("no compatible".to_string());
    };
    for c in compatible.all() {
        match c {
            "arm,pl011" => return Ok(UartKind::Pl011),
            // The BCM2835/BCM2711 mini UART: a 16550 subset with 32-bit
            // registers 4 bytes apart (IO 0x00, IER 0x04, IIR 0x08, LCR 0x0c,
            // MCR 0x10, LSR 0x14); its node has no reg-shift/reg-io-width.
            "brcm,bcm2835-aux-uart" => {
                return Ok(UartKind::Ns16550 {
                    reg_shift: 2,
                    io_width: IoWidth::U32,
                });
            }
            "ns16550a" | "ns16550" | "snps,dw-apb-uart" => {
                let shift = u32_prop("reg-shift", 0)
                    .filter(|&s| s <= 2)
                    .ok_or_else(|| "reg-shift other than 0, 1 or 2".to_string())?;
                let width = u32_prop("reg-io-width", 1)
                    .and_then(IoWidth::from_bytes)
                    .ok_or_else(|| "reg-io-width other than 1, 2 or 4".to_string())?;
                return Ok(UartKind::Ns16550 {
                    reg_shift: shift as u8,
                    io_width: width,
                });
            }
            _ => {}
        }
    }
    let all: Vec<&str> = compatible.all().collect();
    Err(alloc::format!("no supported compatible in {all:?}"))
}

/// The node a `stdout-path` path names: an absolute path, or an alias
/// optionally followed by `/` and a path below it.
fn resolve_path<'b, 'a>(fdt: &'b Fdt<'a>, path: &str) -> Option<FdtNode<'b, 'a>> {
    if path.starts_with('/') {
        return fdt.find_node(path);
    }
    let (alias, rest) = path.split_once('/').unwrap_or((path, ""));
    let target = fdt.aliases()?.resolve(alias)?;
    if rest.is_empty() {
        fdt.find_node(target)
    } else {
        fdt.find_node(&alloc::format!("{}/{rest}", target.trim_end_matches('/')))
    }
}

/// The console UART as the device tree chooses it.
struct ConsoleChoice<'b, 'a> {
    located: Located<'b, 'a>,
    kind: UartKind,
    regs: PhysRange,
    from_stdout_path: bool,
    note: Option<String>,
}

/// Picks the console: the UART `stdout-path` names if it is usable, else the
/// first usable UART in tree order (see the module documentation).
fn choose_console<'b, 'a>(
    fdt: &'b Fdt<'a>,
    nodes: &[Located<'b, 'a>],
) -> Result<ConsoleChoice<'b, 'a>, PlatformError> {
    let usable = |located: Located<'b, 'a>| -> Result<(UartKind, PhysRange), String> {
        let kind = uart_kind(located.node)?;
        let regs = device_regs(nodes, located)
            .map_err(|e| e.to_string())?
            .first()
            .copied()
            .ok_or_else(|| "no reg".to_string())?;
        Ok((kind, regs))
    };
    let chosen = fdt.find_node("/chosen");
    let stdout_path = chosen
        .and_then(|c| {
            c.property("stdout-path")
                .or_else(|| c.property("linux,stdout-path"))
        })
        .and_then(|p| p.as_str());
    let mut note = None;
    if let Some(value) = stdout_path {
        let path = value.split(':').next().unwrap_or(value);
        let named = resolve_path(fdt, path).and_then(|n| {
            nodes
                .iter()
                .copied()
                .find(|l| core::ptr::eq(l.node.name, n.name))
        });
        match named.map(|l| (l, usable(l))) {
            Some((located, Ok((kind, regs)))) => {
                return Ok(ConsoleChoice {
                    located,
                    kind,
                    regs,
                    from_stdout_path: true,
                    note: None,
                });
            }
            Some((_, Err(why))) => {
                note = Some(alloc::format!(
                    "stdout-path \"{value}\" is not usable: {why}"
                ));
            }
            None => note = Some(alloc::format!("stdout-path \"{value}\" names no node")),
        }
    }
    nodes
        .iter()
        .copied()
        .find_map(|l| usable(l).ok().map(|(kind, regs)| (l, kind, regs)))
        .map(|(located, kind, regs)| ConsoleChoice {
            located,
            kind,
            regs,
            from_stdout_path: false,
            note,
        })
        .ok_or(PlatformError::NoUart)
}

impl Platform {
    /// A machine with one CPU, no RAM, a PL011 at 0x0900_0000, no GIC and
    /// nothing else, for host tests to fill in.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self {
            model: String::from("test"),
            ram: Vec::new(),
            reserved: Vec::new(),
            no_map: Vec::new(),
            uart: PhysRange::from_start_size(0x0900_0000, 0x1000),
            uart_kind: UartKind::Pl011,
            uart_from_stdout_path: true,
            console_note: None,
            uart_intid: None,
            gic: None,
            gicv2: None,
            timer: None,
            cpus: alloc::vec![0],
            psci: PsciConduit::Smc,
            initrd: None,
            dtb_size: 0,
        }
    }

    /// Reads the platform from a device tree blob.
    pub fn from_dtb(dtb: &[u8]) -> Result<Self, PlatformError> {
        let fdt =
            Fdt::new(dtb).map_err(|e| PlatformError::BadDeviceTree(alloc::format!("{e:?}")))?;
        let model = fdt
            .root()
            .property("model")
            .and_then(|p| p.as_str())
            .unwrap_or("unknown")
            .to_string();

        let nodes = all_located(&fdt);
        let mut ram = Vec::new();
        for located in &nodes {
            let is_memory = located
                .node
                .property("device_type")
                .and_then(|p| p.as_str())
                == Some("memory");
            if is_memory {
                ram.extend(reg_ranges(*located)?);
            }
        }
        let ram = crate::platform::ranges::normalize(ram);
        if ram.is_empty() {
            return Err(PlatformError::NoMemory);
        }

        let mut reserved: Vec<PhysRange> = fdt
            .memory_reservations()
            .map(|r| PhysRange::from_start_size(r.address() as u64, r.size() as u64))
            .collect();
        let mut no_map = Vec::new();
        for located in &nodes {
            let parent_is_reserved = fdt.find_node("/reserved-memory").is_some_and(|rm| {
                rm.children()
                    .any(|c| core::ptr::eq(c.name, located.node.name))
            });
            if parent_is_reserved {
                let regions = reg_ranges(*located)?;
                if located.node.property("no-map").is_some() {
                    no_map.extend(regions.iter().copied());
                }
                reserved.extend(regions);
            }
        }
        let reserved = crate::platform::ranges::normalize(reserved);
        let no_map = crate::platform::ranges::normalize(no_map);

        let chosen = fdt.find_node("/chosen");
        let console = choose_console(&fdt, &nodes)?;
        let uart_intid = console
            .located
            .node
            .property("interrupts")
            .and_then(|p| gic_intid(p.value));

        let gic = match nodes
            .iter()
            .copied()
            .find(|l| is_compatible(l.node, "arm,gic-v3"))
        {
            Some(located) => {
                let node = located.node;
                let regs = device_regs(&nodes, located)?;
                let redist_regions = node
                    .property("#redistributor-regions")
                    .and_then(|p| p.as_usize())
                    .unwrap_or(1);
                let maintenance_intid =
                    node.property("interrupts").and_then(|p| gic_intid(p.value));
                // (`Root::compatible` panics on a root without the property.)
                let emulated_by_qemu = fdt
                    .find_node("/")
                    .is_some_and(|root| is_compatible(root, "linux,dummy-virt"));
                let its = match nodes
                    .iter()
                    .copied()
                    .find(|l| is_compatible(l.node, "arm,gic-v3-its"))
                {
                    Some(its) => device_regs(&nodes, its)?.first().copied(),
                    None => None,
                };
                regs.split_first().map(|(distributor, rest)| Gicv3 {
                    distributor: *distributor,
                    redistributors: rest.iter().take(redist_regions).copied().collect(),
                    maintenance_intid,
                    emulated_by_qemu,
                    its,
                })
            }
            None => None,
        };
        let gicv2 = match nodes.iter().copied().find(|l| {
            ["arm,cortex-a15-gic", "arm,gic-400", "arm,cortex-a7-gic"]
                .iter()
                .any(|c| is_compatible(l.node, c))
        }) {
            Some(located) if gic.is_none() => {
                let regs = device_regs(&nodes, located)?;
                let maintenance_intid = located
                    .node
                    .property("interrupts")
                    .and_then(|p| gic_intid(p.value));
                match regs.as_slice() {
                    [distributor, cpu_interface, rest @ ..] => Some(Gicv2 {
                        distributor: *distributor,
                        cpu_interface: *cpu_interface,
                        hyp_interface: rest.first().copied(),
                        virtual_cpu: rest.get(1).copied(),
                        maintenance_intid,
                    }),
                    _ => None,
                }
            }
            _ => None,
        };

        let timer_node = fdt
            .all_nodes()
            .find(|n| is_compatible(*n, "arm,armv8-timer"));
        let timer = timer_node
            .and_then(|n| Some((n.property("interrupts")?, interrupt_cells(&fdt, n))))
            .and_then(|(p, cells)| {
                // Four PPI specifiers of `cells` cells each (3 on most GICs:
                // type, number, flags; 4 where the GIC node has PPI
                // partitions, as on RK3588); INTID = number + 16.
                let stride = 4 * cells;
                let ppi =
                    |i: usize| read_cells(p.value.get(stride * i + 4..)?, 1).map(|n| n as u32 + 16);
                Some(TimerIrqs {
                    secure_phys: ppi(0)?,
                    phys: ppi(1)?,
                    virt: ppi(2)?,
                    hyp_phys: ppi(3)?,
                })
            });

        let mut cpus = Vec::new();
        if let Some(cpus_node) = fdt.find_node("/cpus") {
            let ac = cpus_node.cell_sizes().address_cells;
            for cpu in cpus_node.children() {
                let is_cpu = cpu.property("device_type").and_then(|p| p.as_str()) == Some("cpu");
                if !is_cpu {
                    continue;
                }
                let reg = cpu
                    .property("reg")
                    .and_then(|p| read_cells(p.value, ac))
                    .ok_or_else(|| {
                        PlatformError::BadProperty(alloc::format!("{}/reg", cpu.name))
                    })?;
                cpus.push(reg);
            }
        }
        if cpus.is_empty() {
            return Err(PlatformError::NoCpus);
        }

        let method = fdt
            .find_node("/psci")
            .and_then(|n| n.property("method"))
            .and_then(|p| p.as_str())
            .ok_or(PlatformError::NoPsci)?;
        let psci = match method {
            "smc" => PsciConduit::Smc,
            "hvc" => PsciConduit::Hvc,
            other => return Err(PlatformError::BadPsciMethod(other.to_string())),
        };

        let initrd = match (
            chosen_address(chosen, "linux,initrd-start")?,
            chosen_address(chosen, "linux,initrd-end")?,
        ) {
            (Some(start), Some(end)) if end > start => Some(PhysRange { start, end }),
            _ => None,
        };

        Ok(Self {
            model,
            ram,
            reserved,
            no_map,
            uart: console.regs,
            uart_kind: console.kind,
            uart_from_stdout_path: console.from_stdout_path,
            console_note: console.note,
            uart_intid,
            gic,
            gicv2,
            timer,
            cpus,
            psci,
            initrd,
            dtb_size: fdt.total_size() as u64,
        })
    }

    /// Total RAM in bytes.
    pub fn ram_bytes(&self) -> u64 {
        self.ram.iter().map(PhysRange::size).sum()
    }
}

#[cfg(test)]
mod tests;
