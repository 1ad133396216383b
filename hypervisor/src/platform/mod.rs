//! The host platform, read from the device tree the boot loader passes in `x0`.
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

pub mod cpu_features;
pub mod dt_translate;
pub mod ranges;

use crate::platform::ranges::PhysRange;
use crate::vocabulary::timers::TimerIrqs;
use crate::vocabulary::uart_kind::{IoWidth, UartKind};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use dt_translate::Bus;
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
struct Located<'b, 'a> {
    node: FdtNode<'b, 'a>,
    address_cells: usize,
    size_cells: usize,
    /// The parent's index in the list; `None` for children of the root.
    parent: Option<usize>,
}

/// Every node of the tree with its parent's cell sizes, in tree order. Nodes
/// are told apart by the address of their name inside the blob, which is
/// unique per node.
fn all_located<'b, 'a>(fdt: &'b Fdt<'a>) -> Vec<Located<'b, 'a>> {
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
fn device_regs(
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

fn is_compatible(node: FdtNode<'_, '_>, name: &str) -> bool {
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
fn gic_intid(cells: &[u8]) -> Option<u32> {
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
                regs.split_first().map(|(distributor, rest)| Gicv3 {
                    distributor: *distributor,
                    redistributors: rest.iter().take(redist_regions).copied().collect(),
                    maintenance_intid,
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
mod tests {
    use super::*;
    use vm_fdt::FdtWriter;

    #[test]
    fn qemu_virt_gicv2_dump() {
        // `-machine virt,gic-version=2,virtualization=on -smp 2`.
        let dtb = include_bytes!("../../testdata/qemu-virt-gicv2-smp2.dtb");
        let p = Platform::from_dtb(dtb).expect("QEMU's tree is valid");
        assert_eq!(p.gic, None);
        let range = PhysRange::from_start_size;
        assert_eq!(
            p.gicv2,
            Some(Gicv2 {
                distributor: range(0x0800_0000, 0x1_0000),
                cpu_interface: range(0x0801_0000, 0x1_0000),
                hyp_interface: Some(range(0x0803_0000, 0x1_0000)),
                virtual_cpu: Some(range(0x0804_0000, 0x1_0000)),
                maintenance_intid: Some(25),
            })
        );
        assert_eq!(p.uart_intid, Some(33));
        assert_eq!(p.timer.map(|t| t.virt), Some(27));
        assert_eq!(p.cpus, vec![0, 1]);
    }

    #[test]
    fn qemu_virt_dump() {
        let dtb = include_bytes!("../../testdata/qemu-virt-smp4.dtb");
        let p = Platform::from_dtb(dtb).expect("QEMU's tree is valid");
        assert_eq!(
            p.ram,
            vec![PhysRange::from_start_size(0x4000_0000, 0x4000_0000)]
        );
        assert_eq!(p.uart, PhysRange::from_start_size(0x0900_0000, 0x1000));
        assert_eq!(p.uart_kind, UartKind::Pl011);
        assert!(
            p.uart_from_stdout_path,
            "QEMU virt sets stdout-path to its PL011"
        );
        assert_eq!(p.console_note, None);
        assert_eq!(p.uart_intid, Some(33), "QEMU virt's PL011 is SPI 1");
        assert_eq!(p.cpus, vec![0, 1, 2, 3]);
        assert_eq!(p.psci, PsciConduit::Smc);
        let gic = p.gic.clone().expect("gic-v3");
        assert_eq!(
            gic.distributor,
            PhysRange::from_start_size(0x0800_0000, 0x1_0000)
        );
        assert_eq!(
            gic.redistributors,
            vec![PhysRange::from_start_size(0x080a_0000, 0xf6_0000)]
        );
        assert_eq!(gic.maintenance_intid, Some(25), "PPI 9");
        assert_eq!(p.gicv2, None);
        assert_eq!(
            p.timer,
            Some(TimerIrqs {
                secure_phys: 29,
                phys: 30,
                virt: 27,
                hyp_phys: 26
            })
        );
        assert_eq!(p.initrd, None);
        assert_eq!(p.ram_bytes(), 1 << 30);
        assert_eq!(p.dtb_size, dtb.len() as u64);
    }

    fn tree(psci_method: &str, initrd: Option<(u64, u64)>, with_uart: bool) -> Vec<u8> {
        let mut w =
            FdtWriter::new_with_mem_reserv(&[
                vm_fdt::FdtReserveEntry::new(0x8000_0000, 0x1000).expect("entry")
            ])
            .expect("writer");
        let root = w.begin_node("").expect("root");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 2).expect("p");
        w.property_string("model", "test board").expect("p");
        for (name, base) in [
            ("memory@80000000", 0x8000_0000u64),
            ("memory@100000000", 0x1_0000_0000),
        ] {
            let m = w.begin_node(name).expect("node");
            w.property_string("device_type", "memory").expect("p");
            w.property_array_u64("reg", &[base, 0x1000_0000])
                .expect("p");
            w.end_node(m).expect("end");
        }
        let rm = w.begin_node("reserved-memory").expect("node");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 2).expect("p");
        let fw = w.begin_node("fw@88000000").expect("node");
        w.property_array_u64("reg", &[0x8800_0000, 0x10_0000])
            .expect("p");
        w.property_null("no-map").expect("p");
        w.end_node(fw).expect("end");
        let pool = w.begin_node("pool@89000000").expect("node");
        w.property_array_u64("reg", &[0x8900_0000, 0x1000])
            .expect("p");
        w.end_node(pool).expect("end");
        w.end_node(rm).expect("end");
        let chosen = w.begin_node("chosen").expect("node");
        if with_uart {
            w.property_string("stdout-path", "/serial@2000:115200n8")
                .expect("p");
        }
        if let Some((start, end)) = initrd {
            w.property_u64("linux,initrd-start", start).expect("p");
            w.property_u32("linux,initrd-end", end as u32).expect("p");
        }
        w.end_node(chosen).expect("end");
        for (name, base) in [("serial@1000", 0x1000u64), ("serial@2000", 0x2000)] {
            if !with_uart {
                break;
            }
            let s = w.begin_node(name).expect("node");
            w.property_string_list(
                "compatible",
                vec!["arm,pl011".into(), "arm,primecell".into()],
            )
            .expect("p");
            w.property_array_u64("reg", &[base, 0x1000]).expect("p");
            w.end_node(s).expect("end");
        }
        let cpus = w.begin_node("cpus").expect("node");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 0).expect("p");
        for mpidr in [0x0u64, 0x100] {
            let c = w.begin_node(&format!("cpu@{mpidr:x}")).expect("node");
            w.property_string("device_type", "cpu").expect("p");
            w.property_u64("reg", mpidr).expect("p");
            w.end_node(c).expect("end");
        }
        w.end_node(cpus).expect("end");
        let psci = w.begin_node("psci").expect("node");
        w.property_string("method", psci_method).expect("p");
        w.end_node(psci).expect("end");
        w.end_node(root).expect("end");
        w.finish().expect("finish")
    }

    /// Writes `/cpus` with one CPU (MPIDR 0) and a `/psci` node with the
    /// `smc` method, which every test board tree needs.
    fn one_cpu_and_smc_psci(w: &mut FdtWriter) {
        let cpus = w.begin_node("cpus").expect("node");
        w.property_u32("#address-cells", 1).expect("p");
        w.property_u32("#size-cells", 0).expect("p");
        let c = w.begin_node("cpu@0").expect("node");
        w.property_string("device_type", "cpu").expect("p");
        w.property_u32("reg", 0).expect("p");
        w.end_node(c).expect("end");
        w.end_node(cpus).expect("end");
        let psci = w.begin_node("psci").expect("node");
        w.property_string("method", "smc").expect("p");
        w.end_node(psci).expect("end");
    }

    /// A board tree whose GIC has `cells` interrupt cells, named as the
    /// interrupt parent by the root, and a timer node using them.
    fn timer_tree(cells: u32) -> Vec<u8> {
        let mut w = FdtWriter::new().expect("writer");
        let root = w.begin_node("").expect("root");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 2).expect("p");
        w.property_u32("interrupt-parent", 1).expect("p");
        let m = w.begin_node("memory@80000000").expect("node");
        w.property_string("device_type", "memory").expect("p");
        w.property_array_u64("reg", &[0x8000_0000, 0x1000_0000])
            .expect("p");
        w.end_node(m).expect("end");
        let gic = w.begin_node("interrupt-controller@fe600000").expect("node");
        w.property_string("compatible", "arm,gic-v3").expect("p");
        w.property_null("interrupt-controller").expect("p");
        w.property_u32("#interrupt-cells", cells).expect("p");
        w.property_u32("phandle", 1).expect("p");
        w.property_array_u64("reg", &[0xfe60_0000, 0x1_0000, 0xfe68_0000, 0x10_0000])
            .expect("p");
        w.end_node(gic).expect("end");
        let timer = w.begin_node("timer").expect("node");
        w.property_string("compatible", "arm,armv8-timer")
            .expect("p");
        let mut interrupts = Vec::new();
        for ppi in [13, 14, 11, 10] {
            interrupts.extend([1, ppi, 4]);
            if cells == 4 {
                interrupts.push(0); // the PPI partition: all CPUs
            }
        }
        w.property_array_u32("interrupts", &interrupts).expect("p");
        w.end_node(timer).expect("end");
        let serial = w.begin_node("serial@1000").expect("node");
        w.property_string("compatible", "arm,pl011").expect("p");
        w.property_array_u64("reg", &[0x1000, 0x1000]).expect("p");
        w.end_node(serial).expect("end");
        one_cpu_and_smc_psci(&mut w);
        w.end_node(root).expect("end");
        w.finish().expect("finish")
    }

    #[test]
    fn timer_ppis_are_read_with_the_interrupt_parents_cell_count() {
        for cells in [3, 4] {
            let p = Platform::from_dtb(&timer_tree(cells)).expect("valid");
            let timer = p.timer.expect("timer node read");
            assert_eq!(
                (timer.secure_phys, timer.phys, timer.virt, timer.hyp_phys),
                (29, 30, 27, 26),
                "#interrupt-cells {cells}"
            );
        }
    }

    #[test]
    fn board_tree() {
        let p = Platform::from_dtb(&tree("smc", Some((0x9000_0000, 0x9010_0000)), true))
            .expect("valid");
        assert_eq!(p.model, "test board");
        assert_eq!(p.ram.len(), 2);
        assert_eq!(
            p.reserved,
            vec![
                PhysRange::from_start_size(0x8000_0000, 0x1000),
                PhysRange::from_start_size(0x8800_0000, 0x10_0000),
                PhysRange::from_start_size(0x8900_0000, 0x1000)
            ]
        );
        assert_eq!(
            p.no_map,
            vec![PhysRange::from_start_size(0x8800_0000, 0x10_0000)]
        );
        assert_eq!(
            p.uart.start, 0x2000,
            "stdout-path wins over the first PL011"
        );
        assert_eq!(p.cpus, vec![0, 0x100]);
        assert_eq!(
            p.initrd,
            Some(PhysRange {
                start: 0x9000_0000,
                end: 0x9010_0000
            })
        );
        assert_eq!(p.gic, None);
    }

    #[test]
    fn errors() {
        assert_eq!(
            Platform::from_dtb(&tree("hvc", None, true)).map(|p| p.psci),
            Ok(PsciConduit::Hvc)
        );
        assert_eq!(
            Platform::from_dtb(&tree("spi", None, true)),
            Err(PlatformError::BadPsciMethod("spi".into()))
        );
        assert_eq!(
            Platform::from_dtb(&tree("smc", None, false)),
            Err(PlatformError::NoUart)
        );
        assert!(matches!(
            Platform::from_dtb(&[0u8; 64]),
            Err(PlatformError::BadDeviceTree(_))
        ));
    }

    /// A UART node for [`console_tree`].
    struct UartNode {
        name: &'static str,
        compatible: &'static [&'static str],
        status: Option<&'static str>,
        reg_shift: Option<u32>,
        reg_io_width: Option<u32>,
    }

    fn uart(name: &'static str, compatible: &'static [&'static str]) -> UartNode {
        UartNode {
            name,
            compatible,
            status: None,
            reg_shift: None,
            reg_io_width: None,
        }
    }

    /// A minimal board: RAM, one CPU, PSCI, `/aliases`, `/chosen` with the
    /// given stdout property, and the UARTs (each at its unit address, SPI 7).
    fn console_tree(
        stdout: Option<(&str, &str)>,
        aliases: &[(&str, &str)],
        uarts: &[UartNode],
    ) -> Vec<u8> {
        let mut w = FdtWriter::new().expect("writer");
        let root = w.begin_node("").expect("root");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 2).expect("p");
        let m = w.begin_node("memory@80000000").expect("node");
        w.property_string("device_type", "memory").expect("p");
        w.property_array_u64("reg", &[0x8000_0000, 0x1000_0000])
            .expect("p");
        w.end_node(m).expect("end");
        let a = w.begin_node("aliases").expect("node");
        for (alias, path) in aliases {
            w.property_string(alias, path).expect("p");
        }
        w.end_node(a).expect("end");
        let chosen = w.begin_node("chosen").expect("node");
        if let Some((prop, value)) = stdout {
            w.property_string(prop, value).expect("p");
        }
        w.end_node(chosen).expect("end");
        for u in uarts {
            let base = u64::from_str_radix(u.name.split('@').nth(1).expect("unit"), 16)
                .expect("hex unit address");
            let n = w.begin_node(u.name).expect("node");
            w.property_string_list(
                "compatible",
                u.compatible.iter().map(|c| c.to_string()).collect(),
            )
            .expect("p");
            w.property_array_u64("reg", &[base, 0x100]).expect("p");
            w.property_array_u32("interrupts", &[0, 7, 4]).expect("p");
            if let Some(status) = u.status {
                w.property_string("status", status).expect("p");
            }
            if let Some(shift) = u.reg_shift {
                w.property_u32("reg-shift", shift).expect("p");
            }
            if let Some(width) = u.reg_io_width {
                w.property_u32("reg-io-width", width).expect("p");
            }
            w.end_node(n).expect("end");
        }
        one_cpu_and_smc_psci(&mut w);
        w.end_node(root).expect("end");
        w.finish().expect("finish")
    }

    const DW: UartKind = UartKind::Ns16550 {
        reg_shift: 2,
        io_width: IoWidth::U32,
    };

    fn rk3588_uart2() -> UartNode {
        UartNode {
            reg_shift: Some(2),
            reg_io_width: Some(4),
            ..uart(
                "serial@feb50000",
                &["rockchip,rk3588-uart", "snps,dw-apb-uart"],
            )
        }
    }

    #[test]
    fn stdout_path_alias_with_options_picks_a_designware_uart() {
        let dtb = console_tree(
            Some(("stdout-path", "serial2:1500000n8")),
            &[("serial2", "/serial@feb50000")],
            &[
                uart("serial@9000000", &["arm,pl011", "arm,primecell"]),
                rk3588_uart2(),
            ],
        );
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart, PhysRange::from_start_size(0xfeb5_0000, 0x100));
        assert_eq!(p.uart_kind, DW);
        assert!(p.uart_from_stdout_path);
        assert_eq!(p.console_note, None);
        assert_eq!(p.uart_intid, Some(39));
    }

    #[test]
    fn stdout_path_absolute_and_legacy_property() {
        let uarts = [uart("serial@1000", &["ns16550a"]), rk3588_uart2()];
        let absolute = console_tree(Some(("stdout-path", "/serial@feb50000")), &[], &uarts);
        assert_eq!(Platform::from_dtb(&absolute).expect("valid").uart_kind, DW);
        let legacy = console_tree(Some(("linux,stdout-path", "/serial@feb50000")), &[], &uarts);
        let p = Platform::from_dtb(&legacy).expect("valid");
        assert_eq!((p.uart.start, p.uart_from_stdout_path), (0xfeb5_0000, true));
    }

    #[test]
    fn no_stdout_path_takes_the_first_usable_uart() {
        let dtb = console_tree(
            None,
            &[],
            &[
                uart("serial@1000", &["vendor,unknown-uart"]),
                UartNode {
                    status: Some("disabled"),
                    ..uart("serial@2000", &["arm,pl011"])
                },
                UartNode {
                    status: Some("okay"),
                    ..uart("serial@3000", &["ns16550a"])
                },
                uart("serial@4000", &["arm,pl011"]),
            ],
        );
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart.start, 0x3000);
        assert_eq!(
            p.uart_kind,
            UartKind::Ns16550 {
                reg_shift: 0,
                io_width: IoWidth::U8
            },
            "reg-shift 0 and 1-byte access without the properties"
        );
        assert!(!p.uart_from_stdout_path);
        assert_eq!(p.console_note, None);
    }

    #[test]
    fn unusable_stdout_path_falls_back_with_a_note() {
        let fallback = uart("serial@4000", &["ns16550"]);
        let cases: [(&str, UartNode, &str); 4] = [
            (
                "serial0:115200n8",
                UartNode {
                    status: Some("disabled"),
                    ..rk3588_uart2()
                },
                "stdout-path \"serial0:115200n8\" is not usable: status \"disabled\"",
            ),
            (
                "serial0",
                uart("serial@feb50000", &["vendor,unknown-uart"]),
                "stdout-path \"serial0\" is not usable: no supported compatible in [\"vendor,unknown-uart\"]",
            ),
            (
                "serial0",
                UartNode {
                    reg_io_width: Some(3),
                    ..rk3588_uart2()
                },
                "stdout-path \"serial0\" is not usable: reg-io-width other than 1, 2 or 4",
            ),
            (
                "serial9",
                rk3588_uart2(),
                "stdout-path \"serial9\" names no node",
            ),
        ];
        for (stdout, named, note) in cases {
            let dtb = console_tree(
                Some(("stdout-path", stdout)),
                &[("serial0", "/serial@feb50000")],
                &[uart(fallback.name, fallback.compatible), named],
            );
            let p = Platform::from_dtb(&dtb).expect("valid");
            assert_eq!(p.uart.start, 0x4000, "{stdout}");
            assert!(!p.uart_from_stdout_path);
            assert_eq!(p.console_note.as_deref(), Some(note));
        }
    }

    #[test]
    fn no_usable_uart_is_an_error() {
        let dtb = console_tree(
            Some(("stdout-path", "serial0")),
            &[("serial0", "/serial@1000")],
            &[
                UartNode {
                    status: Some("disabled"),
                    ..uart("serial@1000", &["arm,pl011"])
                },
                UartNode {
                    reg_shift: Some(3),
                    ..uart("serial@2000", &["snps,dw-apb-uart"])
                },
                uart("serial@3000", &["vendor,unknown-uart"]),
            ],
        );
        assert_eq!(Platform::from_dtb(&dtb), Err(PlatformError::NoUart));
    }

    use crate::platform::dt_translate::tests::PI4_SOC_RANGES;

    /// A tree shaped like the Raspberry Pi 4's (values from bcm2711.dtsi and
    /// bcm2711-rpi-4-b.dts): root `#address-cells = <2>`, `#size-cells =
    /// <1>`; `/soc` with `#address-cells = <1>` and `soc_ranges` (`None`: no
    /// `ranges` property, `Some(&[])`: `ranges;`) holding the PL011 (uart0),
    /// the mini UART (uart1) and the GIC-400, plus what `extra` adds inside
    /// `/soc`; aliases `serial0`/`serial1` and `stdout-path = stdout`.
    fn pi4_tree(
        stdout: &str,
        soc_ranges: Option<&[u32]>,
        extra: impl FnOnce(&mut FdtWriter),
    ) -> Vec<u8> {
        let mut w = FdtWriter::new().expect("writer");
        let root = w.begin_node("").expect("root");
        w.property_string("model", "Raspberry Pi 4 Model B")
            .expect("p");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 1).expect("p");
        w.property_u32("interrupt-parent", 1).expect("p");
        let m = w.begin_node("memory@0").expect("node");
        w.property_string("device_type", "memory").expect("p");
        w.property_array_u32("reg", &[0, 0, 0x3b40_0000])
            .expect("p");
        w.end_node(m).expect("end");
        let a = w.begin_node("aliases").expect("node");
        w.property_string("serial0", "/soc/serial@7e201000")
            .expect("p");
        w.property_string("serial1", "/soc/serial@7e215040")
            .expect("p");
        w.end_node(a).expect("end");
        let chosen = w.begin_node("chosen").expect("node");
        w.property_string("stdout-path", stdout).expect("p");
        w.end_node(chosen).expect("end");
        let soc = w.begin_node("soc").expect("node");
        w.property_string("compatible", "simple-bus").expect("p");
        w.property_u32("#address-cells", 1).expect("p");
        w.property_u32("#size-cells", 1).expect("p");
        match soc_ranges {
            Some([]) => w.property_null("ranges").expect("p"),
            Some(r) => w.property_array_u32("ranges", r).expect("p"),
            None => {}
        }
        let pl011 = w.begin_node("serial@7e201000").expect("node");
        w.property_string_list(
            "compatible",
            vec!["arm,pl011".into(), "arm,primecell".into()],
        )
        .expect("p");
        w.property_array_u32("reg", &[0x7e20_1000, 0x200])
            .expect("p");
        w.property_array_u32("interrupts", &[0, 121, 4]).expect("p");
        w.end_node(pl011).expect("end");
        let aux = w.begin_node("serial@7e215040").expect("node");
        w.property_string("compatible", "brcm,bcm2835-aux-uart")
            .expect("p");
        w.property_array_u32("reg", &[0x7e21_5040, 0x40])
            .expect("p");
        w.property_array_u32("interrupts", &[0, 93, 4]).expect("p");
        w.end_node(aux).expect("end");
        let gic = w.begin_node("interrupt-controller@40041000").expect("node");
        w.property_string("compatible", "arm,gic-400").expect("p");
        w.property_null("interrupt-controller").expect("p");
        w.property_u32("#interrupt-cells", 3).expect("p");
        w.property_u32("phandle", 1).expect("p");
        w.property_array_u32(
            "reg",
            &[
                0x4004_1000,
                0x1000,
                0x4004_2000,
                0x2000,
                0x4004_4000,
                0x2000,
                0x4004_6000,
                0x2000,
            ],
        )
        .expect("p");
        w.property_array_u32("interrupts", &[1, 9, 0xf04])
            .expect("p");
        w.end_node(gic).expect("end");
        extra(&mut w);
        w.end_node(soc).expect("end");
        let cpus = w.begin_node("cpus").expect("node");
        w.property_u32("#address-cells", 1).expect("p");
        w.property_u32("#size-cells", 0).expect("p");
        for mpidr in 0..4 {
            let c = w.begin_node(&format!("cpu@{mpidr}")).expect("node");
            w.property_string("device_type", "cpu").expect("p");
            w.property_u32("reg", mpidr).expect("p");
            w.end_node(c).expect("end");
        }
        w.end_node(cpus).expect("end");
        let psci = w.begin_node("psci").expect("node");
        w.property_string("method", "smc").expect("p");
        w.end_node(psci).expect("end");
        w.end_node(root).expect("end");
        w.finish().expect("finish")
    }

    const MINI_UART: UartKind = UartKind::Ns16550 {
        reg_shift: 2,
        io_width: IoWidth::U32,
    };

    #[test]
    fn pi4_mini_uart_and_gic400_through_soc_ranges() {
        let dtb = pi4_tree("serial1:115200n8", Some(&PI4_SOC_RANGES), |_| {});
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart, PhysRange::from_start_size(0xfe21_5040, 0x40));
        assert_eq!(p.uart_kind, MINI_UART);
        assert!(p.uart_from_stdout_path);
        assert_eq!(p.console_note, None);
        assert_eq!(p.uart_intid, Some(32 + 93));
        let range = PhysRange::from_start_size;
        assert_eq!(
            p.gicv2,
            Some(Gicv2 {
                distributor: range(0xff84_1000, 0x1000),
                cpu_interface: range(0xff84_2000, 0x2000),
                hyp_interface: Some(range(0xff84_4000, 0x2000)),
                virtual_cpu: Some(range(0xff84_6000, 0x2000)),
                maintenance_intid: Some(25),
            })
        );
        assert_eq!(
            p.ram,
            vec![range(0, 0x3b40_0000)],
            "memory is not translated"
        );
        assert_eq!(p.cpus, vec![0, 1, 2, 3]);
    }

    #[test]
    fn pi4_pl011_with_disable_bt() {
        let dtb = pi4_tree("serial0:115200n8", Some(&PI4_SOC_RANGES), |_| {});
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart, PhysRange::from_start_size(0xfe20_1000, 0x200));
        assert_eq!(p.uart_kind, UartKind::Pl011);
        assert_eq!(p.uart_intid, Some(32 + 121));
    }

    #[test]
    fn identity_ranges_keeps_bus_addresses() {
        let dtb = pi4_tree("serial1", Some(&[]), |_| {});
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart.start, 0x7e21_5040);
        assert_eq!(p.gicv2.map(|g| g.distributor.start), Some(0x4004_1000));
    }

    #[test]
    fn nested_bus_translates_through_both_ranges() {
        // A bus inside /soc mapping its 0x0 to the soc's 0x7e21_5000, with a
        // mini UART at its 0x40 that stdout-path names by path.
        let dtb = pi4_tree("/soc/aux@7e215000/serial@40", Some(&PI4_SOC_RANGES), |w| {
            let bus = w.begin_node("aux@7e215000").expect("node");
            w.property_u32("#address-cells", 1).expect("p");
            w.property_u32("#size-cells", 1).expect("p");
            w.property_array_u32("ranges", &[0x0, 0x7e21_5000, 0x100])
                .expect("p");
            let s = w.begin_node("serial@40").expect("node");
            w.property_string("compatible", "brcm,bcm2835-aux-uart")
                .expect("p");
            w.property_array_u32("reg", &[0x40, 0x40]).expect("p");
            w.end_node(s).expect("end");
            w.end_node(bus).expect("end");
        });
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert!(p.uart_from_stdout_path);
        assert_eq!(p.uart, PhysRange::from_start_size(0xfe21_5040, 0x40));
    }

    #[test]
    fn untranslatable_uart_is_passed_over_with_the_reason() {
        // A mini UART at a bus address no /soc range holds: the console falls
        // back to the PL011 and says why.
        let dtb = pi4_tree("/soc/serial@1000", Some(&PI4_SOC_RANGES), |w| {
            let s = w.begin_node("serial@1000").expect("node");
            w.property_string("compatible", "brcm,bcm2835-aux-uart")
                .expect("p");
            w.property_array_u32("reg", &[0x1000, 0x40]).expect("p");
            w.end_node(s).expect("end");
        });
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart.start, 0xfe20_1000);
        assert!(!p.uart_from_stdout_path);
        assert_eq!(
            p.console_note.as_deref(),
            Some(
                "stdout-path \"/soc/serial@1000\" is not usable: device address not \
                 translatable: serial@1000/reg: 0x1000 is outside every range of bus soc"
            )
        );
    }

    #[test]
    fn soc_without_ranges_is_an_error_for_the_gic() {
        let dtb = pi4_tree("serial1", None, |_| {});
        assert_eq!(
            Platform::from_dtb(&dtb),
            Err(PlatformError::NoUart),
            "no UART under /soc translates"
        );
        // With a UART at the root the GIC is what fails, with a clear error.
        let dtb = console_tree_with_closed_bus_gic();
        assert_eq!(
            Platform::from_dtb(&dtb),
            Err(PlatformError::Untranslatable(
                "interrupt-controller@40041000/reg: bus soc has no ranges (not translatable)"
                    .into()
            ))
        );
    }

    /// A board with a PL011 at the root and a GIC-400 under a `/soc` that has
    /// no `ranges`.
    fn console_tree_with_closed_bus_gic() -> Vec<u8> {
        let mut w = FdtWriter::new().expect("writer");
        let root = w.begin_node("").expect("root");
        w.property_u32("#address-cells", 2).expect("p");
        w.property_u32("#size-cells", 1).expect("p");
        let m = w.begin_node("memory@0").expect("node");
        w.property_string("device_type", "memory").expect("p");
        w.property_array_u32("reg", &[0, 0, 0x3b40_0000])
            .expect("p");
        w.end_node(m).expect("end");
        let s = w.begin_node("serial@fe201000").expect("node");
        w.property_string("compatible", "arm,pl011").expect("p");
        w.property_array_u32("reg", &[0, 0xfe20_1000, 0x200])
            .expect("p");
        w.end_node(s).expect("end");
        let soc = w.begin_node("soc").expect("node");
        w.property_u32("#address-cells", 1).expect("p");
        w.property_u32("#size-cells", 1).expect("p");
        let gic = w.begin_node("interrupt-controller@40041000").expect("node");
        w.property_string("compatible", "arm,gic-400").expect("p");
        w.property_array_u32("reg", &[0x4004_1000, 0x1000, 0x4004_2000, 0x2000])
            .expect("p");
        w.end_node(gic).expect("end");
        w.end_node(soc).expect("end");
        one_cpu_and_smc_psci(&mut w);
        w.end_node(root).expect("end");
        w.finish().expect("finish")
    }
}
