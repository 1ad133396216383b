//! The boot sequence's decisions, on the boot CPU and on the secondaries,
//! over the machine's [`BootMachine`] (implemented at EL2 by `arch::boot`,
//! on the host by a fake that records what it is asked).
//!
//! # The boot CPU ([`boot_primary`])
//!
//! With the device tree parsed and the per-CPU data, vectors and boot heap
//! in place: start the console and log the first line; refuse a PSCI `hvc`
//! conduit (it would trap to the hypervisor itself) by returning
//! [`Halt`]; carve host memory around the image, the device tree, the
//! payload and the virtio-mmio windows; read this CPU's features, publish
//! what every other CPU must cover, and enable the GICv3 system-register
//! interface when the CPU has it (which gives the list-register count);
//! log the banner; plan the passed-through devices before the host's disks
//! are probed (a passed node is its VM's); then bring up the host GIC:
//!
//! - GICv3 when the tree has one and this CPU has list registers: its
//!   distributor, this CPU's interface (then the UART's receive interrupt),
//!   and its ITS when the tree has one (a failure is a warning: passed
//!   PCIe devices then get no MSIs);
//! - else GICv2 when the tree has one with virtualization extensions;
//! - else none.
//!
//! Then every other CPU of the tree is started ([`start_secondaries`]):
//! each one that comes online merges its features into the system-wide
//! minimum and takes the next per-CPU slot; one that does not cover what
//! the system relies on parks, is reported, and its slot goes to the next
//! CPU. The list registers the banner names are the system registers'
//! when the boot CPU has them, else a GICv2's `GICH` ones, else none. The
//! result is the [`BootInfo`] the caller publishes before running the VMs.
//!
//! # A secondary CPU ([`secondary_admitted`], [`init_secondary_gic`])
//!
//! It is admitted when its features cover what the boot CPU published
//! (nothing published: not admitted); an admitted CPU brings up its GIC
//! interface of the GIC the boot CPU chose, and its ITS part.
//!
//! Every log line and its order are the boot log's, which the end-to-end
//! tests read.

use super::boot_info::BootInfo;
use crate::drivers::gic::driver::GicError;
use crate::platform::banner::{self, ListRegisterSource};
use crate::platform::cpu_features::{CpuFeatures, SystemFeatures};
use crate::platform::ranges::PhysRange;
use crate::platform::virtio_mmio::{self, VirtioMmioWindow};
use crate::platform::{Gicv2, Gicv3, Platform, PsciConduit};
use crate::vm::passthrough::{self, PassthroughError, PassthroughPlan};
use alloc::vec::Vec;
use smccc::psci;

/// LPIs in the host's pool: every LPI its property table covers.
pub const HOST_LPI_POOL: u32 = crate::drivers::its::PROPERTY_TABLE_BYTES as u32;

/// How a started secondary CPU ended its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Online, with the features it recorded (if it recorded any).
    Online(Option<CpuFeatures>),
    /// Parked: it does not cover what the system relies on.
    Rejected(Option<CpuFeatures>),
    /// `CPU_ON` succeeded but the CPU never said either.
    NeverArrived,
}

/// The boot stops here: the caller halts the CPU (the reason is logged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Halt;

/// What the boot sequence needs of the machine.
pub trait BootMachine {
    /// Why the host ITS was not brought up.
    type ItsError: core::fmt::Display;

    /// Starts the host console on the tree's UART.
    fn start_console(&self, platform: &Platform);
    /// Records the PSCI conduit for every later firmware call.
    fn set_psci_conduit(&self, conduit: PsciConduit);
    /// The hypervisor image in memory.
    fn image_range(&self) -> PhysRange;
    /// Hands host RAM but `in_use` to the frame allocator, maps `devices`
    /// too and switches to the final EL2 tables; returns the free bytes.
    fn init_memory(
        &self,
        platform: &Platform,
        in_use: Vec<PhysRange>,
        devices: &[PhysRange],
    ) -> u64;
    /// Marks the boot CPU's per-CPU slot online.
    fn mark_boot_cpu_online(&self);
    /// This CPU's features, from its ID registers.
    fn local_features(&self) -> CpuFeatures;
    /// Turns memory tagging on at EL2.
    fn enable_memory_tagging(&self);
    /// Records the boot CPU's features (and vector lengths) in its slot.
    fn record_boot_features(&self, features: &CpuFeatures);
    /// Publishes what every secondary CPU must cover.
    fn publish_required(&self, required: CpuFeatures);
    /// Enables the GICv3 system-register interface on this CPU (at EL2,
    /// and for EL1).
    fn enable_gic_sysregs(&self);
    /// This CPU's GICv3 list-register count (`ICH_VTR_EL2.ListRegs + 1`),
    /// once its system-register interface is on.
    fn ich_list_registers(&self) -> u64;
    /// The firmware's PSCI version.
    fn psci_version(&self) -> Result<psci::Version, psci::error::Error>;
    /// The boot payload's bytes, where the boot loader put them.
    fn payload(&self, range: PhysRange) -> &[u8];
    /// Whether the virtio-mmio transport at `base` has nothing behind it.
    fn virtio_transport_empty(&self, base: u64) -> bool;
    /// Finds the host's disks behind `windows`.
    fn probe_host_disks(&self, windows: &[VirtioMmioWindow]);
    /// Brings up a GICv3's distributor (and redistributors).
    fn init_gicv3(&self, gic: &Gicv3, timers: [u32; 2], uart_intid: Option<u32>, boot_mpidr: u64);
    /// Brings up a GICv2; `false` when it cannot be driven.
    fn init_gicv2(&self, gic: &Gicv2, timers: [u32; 2], uart_intid: Option<u32>) -> bool;
    /// Whether the GIC driven is a GICv2.
    fn gic_is_v2(&self) -> bool;
    /// Brings up CPU `index`'s interface of the GIC driven.
    fn init_gic_cpu(&self, index: usize) -> Result<(), GicError>;
    /// Lets the console's UART interrupt in.
    fn enable_uart_receive_interrupt(&self);
    /// Brings up the host ITS at `frames` with `pool` LPIs; returns its
    /// DeviceID bits.
    fn init_its(&self, frames: PhysRange, pool: u32) -> Result<u32, Self::ItsError>;
    /// CPU `index`'s LPIs and ITS collection, when the host ITS is up.
    fn init_its_cpu(&self, index: usize);
    /// How many CPUs the hypervisor drives at most.
    fn max_cpus(&self) -> usize;
    /// Starts CPU `mpidr` in per-CPU slot `index` and waits until it
    /// arrives (or gives up on it).
    fn start_secondary(&self, index: usize, mpidr: u64) -> Result<Arrival, psci::error::Error>;
    /// A GICv2's `GICH` list-register count, when a GICv2 is driven.
    fn gich_list_registers(&self) -> Option<usize>;
}

/// The boot CPU's sequence (see the module doc) for the device tree `dtb`
/// describing `platform`; the image was loaded at `load_address`.
pub fn boot_primary<M: BootMachine>(
    m: &M,
    dtb: &[u8],
    platform: Platform,
    boot_mpidr: u64,
    load_address: usize,
) -> Result<BootInfo, Halt> {
    m.start_console(&platform);
    log::info!(
        "hypervisor {} starting at EL2, loaded at {load_address:#x}",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(note) = &platform.console_note {
        log::warn!("{note}; console on the first usable UART");
    }
    if platform.psci == PsciConduit::Hvc {
        log::error!(
            "the device tree's PSCI method is \"hvc\", which cannot reach firmware from EL2"
        );
        return Err(Halt);
    }
    m.set_psci_conduit(platform.psci);

    let virtio_windows = virtio_mmio::windows(dtb).unwrap_or_else(|e| {
        log::warn!("virtio-mmio windows not read from the device tree: {e}");
        Vec::new()
    });
    let mut in_use = alloc::vec![
        m.image_range(),
        PhysRange::from_start_size(dtb.as_ptr() as u64, dtb.len() as u64)
    ];
    in_use.extend(platform.initrd);
    let virtio_pages = virtio_mmio::pages(&virtio_windows);
    let free_bytes = m.init_memory(&platform, in_use, &virtio_pages);
    m.mark_boot_cpu_online();

    let boot_features = m.local_features();
    if boot_features.mte {
        // Before any guest page is zeroed and before the secondaries copy
        // MAIR_EL2 and SCTLR_EL2.
        m.enable_memory_tagging();
    }
    m.record_boot_features(&boot_features);
    let mut system = SystemFeatures::new(boot_features);
    m.publish_required(system.required());
    let list_regs = boot_features.gic_sysregs.then(|| {
        m.enable_gic_sysregs();
        m.ich_list_registers()
    });
    let psci_version = m.psci_version();
    log::info!("platform: {}", platform.model);
    log::info!(
        "RAM: {} MiB in {} bank(s), {} MiB free for guests and tables",
        platform.ram_bytes() >> 20,
        platform.ram.len(),
        free_bytes >> 20
    );
    log::info!("{}", banner::gic_line(&platform));
    match psci_version {
        Ok(v) => log::info!(
            "console {} at {:#x} ({}), firmware PSCI {}.{} over SMC",
            platform.uart_kind,
            platform.uart.start,
            if platform.uart_from_stdout_path {
                "stdout-path"
            } else {
                "first usable UART"
            },
            v.major,
            v.minor
        ),
        Err(e) => log::warn!("firmware PSCI_VERSION failed: {e:?}"),
    }
    let mut passthrough = passthrough_plans(m, dtb, &platform);
    let host_windows = passthrough::host_disk_windows(&virtio_windows, &passthrough);
    passthrough::map_passed_pages(&mut passthrough, dtb, &virtio_windows, |base| {
        m.virtio_transport_empty(base)
    });
    m.probe_host_disks(&host_windows);

    init_host_gic(m, &platform, list_regs, boot_mpidr);

    let cpus_online = start_secondaries(m, &platform, boot_mpidr, &mut system);
    log::info!(
        "CPUs: {cpus_online} online of {} in the device tree",
        platform.cpus.len()
    );
    let features = system.features();
    // Read first, as the banner always did: a GICv2's `GICH_VTR`.
    let gich = m.gich_list_registers();
    let list_registers = list_register_source(list_regs, gich);
    log::info!(
        "{}",
        banner::features_line(&features, cpus_online, list_registers)
    );
    let payload = platform.initrd;
    let tlb_caps = features.tlb_caps();
    log::info!("{}", banner::tlb_line(tlb_caps));
    Ok(BootInfo {
        platform,
        features,
        cpus_online,
        payload,
        tlb_caps,
        passthrough,
    })
}

/// Where the list registers are: the GICv3 system registers' count when
/// the boot CPU has them, else a GICv2's `GICH` count, else none.
pub fn list_register_source(sysregs: Option<u64>, gich: Option<usize>) -> ListRegisterSource {
    match (sysregs, gich) {
        (Some(n), _) => ListRegisterSource::SystemRegisters(n),
        (None, Some(count)) => ListRegisterSource::Gich(count),
        (None, None) => ListRegisterSource::None,
    }
}

/// Brings up the host GIC the module doc chooses, on the boot CPU.
fn init_host_gic<M: BootMachine>(
    m: &M,
    platform: &Platform,
    list_regs: Option<u64>,
    boot_mpidr: u64,
) {
    let timers = crate::vocabulary::timers::TimerId::ALL.map(|t| t.host_intid(platform.timer));
    if let Some(host_gic) = platform.gic.as_ref().filter(|_| list_regs.is_some()) {
        m.init_gicv3(host_gic, timers, platform.uart_intid, boot_mpidr);
        match m.init_gic_cpu(0) {
            Ok(()) => {
                if platform.uart_intid.is_some() {
                    m.enable_uart_receive_interrupt();
                }
            }
            Err(e) => log::warn!("GICv3 CPU interface: {e:?}"),
        }
        // The host's ITS carries passed PCIe devices' MSIs, with LPIs on
        // every CPU.
        if let Some(frames) = host_gic.its {
            match m.init_its(frames, HOST_LPI_POOL) {
                Ok(bits) => {
                    log::info!(
                        "host ITS at {:#x}: {bits} DeviceID bits, {HOST_LPI_POOL} LPIs for passed PCIe devices' MSIs",
                        frames.start
                    );
                    m.init_its_cpu(0);
                }
                Err(e) => log::warn!("host ITS at {:#x}: not used: {e}", frames.start),
            }
        }
    } else if let Some(host_gic) = platform.gicv2.as_ref()
        && m.init_gicv2(host_gic, timers, platform.uart_intid)
    {
        match m.init_gic_cpu(0) {
            Ok(()) => {
                if platform.uart_intid.is_some() {
                    m.enable_uart_receive_interrupt();
                }
            }
            Err(e) => log::warn!("GICv2 CPU interface: {e:?}"),
        }
    }
}

/// Each VM's passed-through devices, read from the host tree before the
/// host disks are probed (a passed node is the VM's, not a host disk). The
/// payload is parsed here for its `device=` lines only
/// (`vm::passthrough::plan_payload`); `runtime::cpu_start` parses it again
/// and reports what is wrong with it.
fn passthrough_plans<M: BootMachine>(
    m: &M,
    dtb: &[u8],
    platform: &Platform,
) -> Vec<Result<PassthroughPlan, PassthroughError>> {
    let Some(payload) = platform.initrd else {
        return Vec::new();
    };
    passthrough::plan_payload(dtb, platform, m.payload(payload))
}

/// Starts every CPU of the device tree but the boot CPU and merges the
/// features of each one that comes online into `system`; returns how many CPUs
/// are online in total. A CPU that parks as rejected is reported, and its slot
/// goes to the next CPU.
pub fn start_secondaries<M: BootMachine>(
    m: &M,
    platform: &Platform,
    boot_mpidr: u64,
    system: &mut SystemFeatures,
) -> usize {
    let max_cpus = m.max_cpus();
    let mut online = 1;
    let mut index = 1;
    for &mpidr in &platform.cpus {
        if mpidr == boot_mpidr {
            continue;
        }
        if index >= max_cpus {
            log::warn!("CPU {mpidr:#x} not started: the hypervisor drives at most {max_cpus} CPUs");
            continue;
        }
        match m.start_secondary(index, mpidr) {
            Ok(Arrival::Online(features)) => {
                match features.map(|f| system.admit(f)) {
                    Some(Ok(())) => {}
                    Some(Err(e)) => log::error!(
                        "CPU {mpidr:#x} came online although it lacks {e}; the system relies on it"
                    ),
                    None => log::error!("CPU {mpidr:#x} came online without its features"),
                }
                online += 1;
                index += 1;
            }
            Ok(Arrival::Rejected(features)) => {
                let why = match features.map(|f| SystemFeatures::check(&system.required(), &f)) {
                    Some(Err(e)) => alloc::format!("{e}"),
                    _ => alloc::string::String::from("its features were not recorded"),
                };
                log::warn!(
                    "CPU {mpidr:#x} left offline: it lacks what the system relies on ({why})"
                );
            }
            Ok(Arrival::NeverArrived) => {
                log::warn!("CPU {mpidr:#x} accepted CPU_ON but never came online");
            }
            Err(e) => log::warn!("CPU_ON for CPU {mpidr:#x} failed: {e:?}"),
        }
    }
    online
}

/// Whether a secondary CPU with `features` may join: it covers what the
/// boot CPU published (`required`; nothing published, it may not).
pub fn secondary_admitted(features: &CpuFeatures, required: Option<&CpuFeatures>) -> bool {
    required.is_some_and(|required| features.covers(required))
}

/// On admitted secondary CPU `index` with `features`: its interface of the
/// GIC the boot CPU chose (GICv3 when it has the system registers, with
/// its ITS part; else a GICv2's when one is driven).
pub fn init_secondary_gic<M: BootMachine>(m: &M, index: usize, features: &CpuFeatures) {
    if features.gic_sysregs {
        m.enable_gic_sysregs();
        match m.init_gic_cpu(index) {
            Ok(()) => m.init_its_cpu(index),
            Err(e) => log::warn!("CPU {index}: GICv3 CPU interface: {e:?}"),
        }
    } else if m.gic_is_v2()
        && let Err(e) = m.init_gic_cpu(index)
    {
        log::warn!("CPU {index}: GICv2 CPU interface: {e:?}");
    }
}
