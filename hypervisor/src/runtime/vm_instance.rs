//! One running VM of the boot payload (`runtime::vm_table` holds the table
//! of them, `runtime::cpu_start` starts them): the live object whose model is `vm/`.
//!
//! The boot CPU reads the payload (a cpio newc archive the boot loader passed
//! as an initrd: `kernel`, optional `initrd`, `cmdline`, `vm.conf`, or the
//! same per VM under `vm/<name>/`) and creates each VM it describes
//! ([`create_vm`]). A VM owns a name, a VMID (its index + 1), guest RAM
//! allocated for it alone from host frames (zeroed 2 MiB at a time on first
//! use, `vm::lazy_zero`; all at once for a VM with passed-through devices,
//! whose DMA bypasses stage 2), a stage-2 table from
//! `pgtable` behind its `Mmu` (empty at start: guest memory is mapped on first
//! touch, by shared walks, so vCPUs fault in parallel), one
//! memslot from `memslot` for its RAM (host frames, 2 MiB aligned), the
//! emulated PL011 (its receive side fed from the host console), the virtual
//! GIC (`vgic`: a GICv3, or on a GICv2 host a GICv2 whose CPU interface is
//! the hardware's `GICV` frame, mapped at stage 2 at the guest's `GICC`),
//! its virtio-mmio devices (`runtime::virtio_devices`: a console, a control
//! VM's monitor port, a net device on the machine's switch, a disk, as its
//! `vm.conf` asks; a missing host disk refuses the VM), the vCPU power
//! states and its counters. Without FEAT_S2FWB the stage-2
//! table's page provider cleans each page to the point of coherency as it is
//! mapped (`cache_maint`), so a guest that starts with its MMU off reads the
//! kernel and device tree the hypervisor wrote. vCPU `n` is pinned to
//! physical CPU `cpus[n]` ([`Vm::cpu_of`]; every kick of a vCPU goes through
//! it): that CPU waits (`WFI`, woken by a kick SGI; `WFE` without a GIC)
//! until the guest starts its vCPU with PSCI `CPU_ON`, runs it until
//! `CPU_OFF`, and waits again.
//!
//! # Ending a VM
//!
//! Guest `SYSTEM_OFF` ([`Vm::system_off`]) and a stop (an exit the hypervisor
//! cannot handle, [`Vm::stop`]) end this VM only: the VM is marked stopping,
//! its other vCPUs are kicked (each leaves the guest or its wait, sees the
//! mark and halts its CPU), its console line is flushed, its counters are
//! printed and a line says how it ended. The caller (`runtime::vcpu_cycle`) then tells
//! the machine, which powers off when no VM is left. The VM's CPUs do not
//! power off: they halt in `runtime::vcpu_cycle`, waiting for a restart.
//!
//! # Restarting
//!
//! Guest `SYSTEM_RESET` while other VMs run, and the monitor's `restart`,
//! rebuild the VM in place ([`Vm::request_restart`], `vm::lifecycle` for
//! the protocol, `runtime::restart` for the rebuild). The VM keeps what a
//! rebuild needs from its creation ([`BootImage`]: the kernel and initrd as
//! the payload holds them, which stays in memory, and the device tree it
//! built).
//! Every log line a guest can cause goes through [`Vm::log_event`], which asks
//! the VM's `event_log::EventLog` (fixed size, rate-limited per kind, timed by
//! the system counter) whether to print it.

use crate::control::abi::registers::ParkedRegisters;
use crate::devices::pl011::{Pl011, RxBacklog};
use crate::devices::vgic::{self, Vgic, VgicConfig};
use crate::exit::mmio::{DeviceId, MmioBus, MmioRegion};
use crate::platform::host_device::Trigger as HostTrigger;
use crate::platform::ranges::PhysRange;
use crate::runtime::Hardware;
use crate::runtime::boot_info::BootInfo;
use crate::runtime::device_hub::DeviceHub;
use crate::runtime::virtio_devices::{DeviceCounters, VirtioDevices, VirtioError};
use crate::stage2::cache_maint::IcacheInval;
use crate::stage2::fault::SlotView;
use crate::vm::counters::{Counter, VmCounters};
use crate::vm::device_tree::{self, GuestDtbConfig, GuestGic, GuestGicFrames, GuestTimer};
use crate::vm::event_log::{Event, EventKind, EventLog, LogDecision, RatePolicy};
use crate::vm::exit_profile::{self, ExitProfile};
use crate::vm::layout::{
    self, GUEST_GICC_BASE, GUEST_GICC_SIZE, GUEST_GICD_BASE, GUEST_GICR_BASE, GUEST_ITS_BASE,
    GUEST_MAINTENANCE_INTID, GUEST_RAM_BASE, GUEST_SPI_COUNT, GUEST_TIMER_INTIDS, GUEST_UART_BASE,
    GUEST_UART_SIZE, GUEST_UART_SPI, vcpu_mpidr,
};
use crate::vm::lazy_zero::LazyZeroedRam;
use crate::vm::lifecycle::{Lifecycle, RestartError};
use crate::vm::migration_plan::{CopyBoard, MigrationOptions};
use crate::vm::msi_shadow::MsiShadow;
use crate::vm::passthrough::{Claim, PassthroughError, PassthroughPlan};
use crate::vm::power::{BootRequest, PowerStates};
use crate::vm::run_state::{Requested, RunState, RunStateError};
use crate::vm::vcpu_state::VcpuState;
use crate::vocabulary::timers::TimerId;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use boot_payload::image::{self, KernelFormat};
use boot_payload::vmconf::DEFAULT_MEM_MIB;
use boot_payload::vmconf::RamPlacement;
use boot_payload::vmname::VmName;
use boot_payload::{PayloadError, PayloadRef, VmRef};
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crossbeam_epoch::Collector;
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, Memslots, SlotFlags, SlotId, SlotSpec};
use pgtable::{
    Attributes, MemType, Mmu, PageCache, Perms, PhysAddr, Stage2Config, Stage2PageTable,
};
use spin::Mutex;
use tlb::CountingTlb;

/// Guest RAM backing is aligned to this, so 2 MiB blocks line up.
const BACKING_ALIGN: u64 = 2 << 20;
/// IPA size of every VM.
const IPA_BITS: u32 = 40;

/// The emulated UART (its output goes to the hypervisor console,
/// `runtime::host_console`, byte by byte).
pub struct GuestUart {
    /// Register model.
    pub device: Pl011,
    /// Typed bytes waiting for room in the RX FIFO.
    pub backlog: RxBacklog,
    /// The interrupt line level last given to the vgic.
    pub irq_level: bool,
}

/// What the VM boots from, kept for its restarts.
pub struct BootImage {
    /// The kernel as the payload holds it.
    pub kernel: &'static [u8],
    /// The initrd as the payload holds it.
    pub initrd: Option<&'static [u8]>,
    /// The device tree built for the VM.
    pub dtb: Vec<u8>,
    /// Where the kernel goes in guest RAM.
    pub kernel_ipa: u64,
    /// Where the initrd goes.
    pub initrd_ipa: Option<u64>,
    /// Where the device tree goes.
    pub dtb_ipa: u64,
    /// vCPU 0's boot request: the kernel's entry, the device tree in `x0`.
    pub request: BootRequest,
}

/// One virtual machine on the machine `H`.
pub struct Vm<H: Hardware> {
    /// The machine it runs on.
    pub hw: &'static H,
    /// VM number in reports (`vm<V>`): its place in the payload.
    pub index: usize,
    /// Its name from the payload.
    pub name: VmName,
    /// The physical CPU of each vCPU: vCPU `i` runs only on `cpus[i]`.
    pub cpus: Vec<usize>,
    /// Number of vCPUs.
    pub vcpus: usize,
    /// It may use the control interface (`control=1` in its `vm.conf`).
    pub control: bool,
    /// Stage-2 translation: shared walks for faults (read side), range
    /// operations behind the write side.
    pub stage2: Mmu<H::TableMemory>,
    /// `VTCR_EL2` for this VM.
    pub vtcr: u64,
    /// `VTTBR_EL2` for this VM.
    pub vttbr: u64,
    /// Stage 2 uses FEAT_S2FWB: no guest cache maintenance, no set/way traps.
    pub fwb: bool,
    /// The guest may use memory tagging (`mte=on`): `HCR_EL2.ATA`, the MTE
    /// fields of `ID_AA64PFR1_EL1` shown, its tag registers kept per vCPU,
    /// its pages' allocation tags carried by a live migration.
    pub mte: bool,
    /// TLB backend, counting what it issues for the power-off report.
    pub tlb: CountingTlb<H::Tlb>,
    /// Epoch collector for the memslot sets.
    pub collector: &'static Collector,
    /// Guest memory slots.
    pub memslots: Memslots,
    /// Guest RAM as an IPA range.
    pub ram: PhysRange,
    /// Its RAM is at IPA == PA (`ram=identity`).
    pub identity_ram: bool,
    /// Which emulated device answers at which IPA.
    pub mmio: MmioBus,
    /// The emulated PL011.
    pub uart: Mutex<GuestUart>,
    /// The virtual GICv3.
    pub vgic: Vgic,
    /// Its virtio-mmio devices (`runtime::virtio_devices`).
    pub virtio: VirtioDevices,
    /// The host devices it owns (`vm::passthrough`).
    pub passthrough: PassthroughPlan,
    /// Per passed SPI: the CPU its physical interrupt is routed to now,
    /// following the guest's routing of the virtual one.
    pub passthrough_routes: Mutex<Vec<(u32, usize)>>,
    /// Its passed PCIe devices signal MSIs through the virtual ITS, the
    /// physical ITS mirroring their DeviceIDs (`vm::msi_shadow`).
    pub msi_passthrough: bool,
    /// The DeviceIDs mirrored on the physical ITS.
    pub msi_shadow: Mutex<MsiShadow>,
    /// The machine's switch and VMs its devices reach
    /// (`runtime::device_hub`).
    pub device_hub: &'static DeviceHub<H>,
    /// vCPU power states.
    pub power: PowerStates,
    /// Running, paused or asked to stop by the console monitor.
    pub run_state: RunState,
    /// Per vCPU: its registers while it waits paused (`Some` from the time
    /// it parks until it resumes), which the control interface reads and
    /// writes (`control::abi::registers`).
    pub parked: Box<[Mutex<Option<ParkedRegisters>>]>,
    /// Event counters.
    pub counters: &'static VmCounters,
    /// Per vCPU: its exits counted and timed by class (`vm::exit_profile`),
    /// written only by the vCPU's CPU.
    pub exit_profiles: Box<[ExitProfile]>,
    /// What it boots from.
    pub boot: BootImage,
    /// Its restarts (`vm::lifecycle`).
    pub lifecycle: Lifecycle,
    /// Eager split chunk size for dirty logging in bytes; 0: off
    /// (`runtime::dirty_log`).
    pub eager_split_chunk: core::sync::atomic::AtomicU64,
    /// Which 2 MiB chunks of its boot RAM are zeroed (`vm::lazy_zero`):
    /// every path to the RAM zeroes a chunk before the guest can see it.
    pub ram_zeroing: LazyZeroedRam,
    /// It boots (`start=1`, the default); else it waits as a migration
    /// destination until one arrives.
    pub start: bool,
    /// A migration destination that has not received one yet.
    pub awaiting_migration: AtomicBool,
    /// Per vCPU: the whole state captured for a migration (source) or to
    /// restore at its start (destination) (`runtime::live_migration`).
    pub vcpu_states: Box<[Mutex<Option<Box<VcpuState>>>]>,
    /// The source VM of a migration this VM's vCPU 0 is to carry out, and
    /// how it was asked for.
    pub migration_job: Mutex<Option<(&'static Vm<H>, MigrationOptions)>>,
    /// Percent of their time its vCPUs are held out of the guest while a
    /// migration pre-copies (`vm::migration_plan`, auto-converge); 0: none.
    pub migration_throttle: AtomicU8,
    /// The stop's copy of a migration out of this VM, which its paused
    /// vCPUs help with (`runtime::live_migration`).
    pub stop_copy: CopyBoard,
    capture_requested: AtomicBool,
    /// The CPUs have the GICv3 system-register CPU interface (system-wide).
    pub gic_sysregs: bool,
    /// The host console UART's interrupt, if it has one.
    pub host_uart_intid: Option<u32>,
    /// What the guest made the hypervisor log: per-kind rate limits and the
    /// unknown ids already logged, all of fixed size.
    event_log: Mutex<EventLog>,
    stopping: AtomicBool,
    /// The end a migration out of it left for the first of its vCPUs to
    /// halt to report ([`Vm::end_migrated`]), so that the report's console
    /// lines are not part of the migration's downtime.
    end_to_report: Mutex<Option<EndToReport>>,
    /// Set once its end is reported (after `stopping`): nothing of it runs
    /// or prints any more.
    ended: AtomicBool,
}

/// An end left to a VM's vCPUs to report (see [`Vm::end_migrated`]).
struct EndToReport {
    /// Why it ended.
    reason: String,
    /// Log lines to print before the end's report (the migration's own).
    lines_before: Vec<String>,
    /// Slots whose dirty logging the migration turned on, turned off
    /// before the report.
    slots_to_unlog: Vec<SlotId>,
}

/// Why a VM could not be created from the payload.
#[derive(Debug)]
pub enum VmError {
    /// The payload is not a valid archive, has no kernel, or has a bad
    /// `cmdline` or `vm.conf`.
    Payload(PayloadError),
    /// The kernel is neither an arm64 Image nor a raw binary.
    Kernel(image::ImageError),
    /// More vCPUs than the CPUs the VM names.
    MoreVcpusThanCpus {
        /// vCPUs asked for.
        vcpus: u32,
        /// CPUs named in `cpus=`.
        cpus: u32,
    },
    /// More vCPUs than online CPUs.
    TooManyVcpus {
        /// vCPUs asked for.
        asked: u32,
        /// CPUs online.
        online: usize,
    },
    /// The kernel, device tree and initrd do not fit in guest RAM.
    DoesNotFit(u64),
    /// Not enough host memory for guest RAM.
    NoHostMemory(u64),
    /// The guest device tree could not be written.
    Dtb(device_tree::GuestDtbError),
    /// Two emulated devices claim the same addresses.
    Devices(crate::exit::mmio::RegionConflict),
    /// The stage-2 table could not be created.
    Stage2(pgtable::Error),
    /// The memslot could not be created.
    Memslot(memslot::MemslotError),
    /// The virtual GIC refused the configuration.
    Vgic(vgic::VgicError),
    /// Its virtio devices could not be made (a host disk missing, a disk
    /// window past the disk's end, the switch full).
    Virtio(VirtioError),
    /// A host device it names cannot be given to it.
    Passthrough(PassthroughError),
    /// `mte=on` on a host without memory tagging (FEAT_MTE2 on every CPU).
    NoMemoryTagging,
    /// Its identity RAM (`ram=identity`) landed on one of its emulated
    /// devices' windows.
    IdentityRam {
        /// Where the RAM landed.
        ram: PhysRange,
        /// The device.
        owner: String,
    },
}

impl core::fmt::Display for VmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Payload(e) => write!(f, "{e}"),
            Self::Kernel(e) => write!(f, "kernel: {e}"),
            Self::TooManyVcpus { asked, online } => {
                write!(
                    f,
                    "vm.conf asks for {asked} vCPUs but only {online} CPUs are online"
                )
            }
            Self::MoreVcpusThanCpus { vcpus, cpus } => write!(
                f,
                "vm.conf asks for {vcpus} vCPUs but names only {cpus} CPUs to run them"
            ),
            Self::DoesNotFit(n) => write!(
                f,
                "kernel, device tree and initrd need {n:#x} bytes of guest RAM"
            ),
            Self::NoHostMemory(n) => write!(f, "no {} MiB of host memory for guest RAM", n >> 20),
            Self::Dtb(e) => write!(f, "guest device tree: {}", e.0),
            Self::Devices(e) => write!(f, "device window conflict at {:#x}", e.0.base),
            Self::Stage2(e) => write!(f, "stage-2 table: {e}"),
            Self::Memslot(e) => write!(f, "memslot: {e}"),
            Self::Vgic(e) => write!(f, "virtual GIC: {e:?}"),
            Self::Virtio(e) => write!(f, "virtio devices: {e}"),
            Self::Passthrough(e) => write!(f, "{e}"),
            Self::NoMemoryTagging => write!(
                f,
                "mte=on, but the host has no memory tagging (FEAT_MTE2 with tag storage on every CPU; QEMU: -machine virt,mte=on -cpu max)"
            ),
            Self::IdentityRam { ram, owner } => write!(
                f,
                "ram=identity: its RAM at {:#x}+{:#x} (where host RAM is free) overlaps {owner}",
                ram.start,
                ram.size()
            ),
        }
    }
}

impl core::error::Error for VmError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Stage2(e) => Some(e),
            Self::Memslot(e) => Some(e),
            Self::Vgic(e) => Some(e),
            Self::Dtb(e) => Some(e),
            Self::Devices(e) => Some(e),
            Self::Virtio(e) => Some(e),
            Self::Passthrough(e) => Some(e),
            _ => None,
        }
    }
}

impl<H: Hardware> Vm<H> {
    /// Zeroes the chunks of its boot RAM under `len` bytes at host address
    /// `host` that are not zeroed yet (`vm::lazy_zero`); bytes outside its
    /// boot RAM are left alone.
    pub fn ensure_zeroed(&self, host: u64, len: u64) {
        self.ram_zeroing
            .ensure(host, len, |addr, len| self.hw.zero_memory(addr, len));
    }

    /// Zeroes all of its boot RAM not zeroed yet: before its RAM's slot
    /// changes and before a live migration copies or compares it.
    pub fn finish_zeroing(&self) {
        self.ram_zeroing
            .finish(|addr, len| self.hw.zero_memory(addr, len));
    }

    /// The VM's RAM slot as the fault path needs it, if `ipa` is in one.
    pub fn slot_for(
        &self,
        handle: &crossbeam_epoch::LocalHandle,
        ipa: u64,
        cache: &mut memslot::VcpuSlotCache,
    ) -> Option<SlotView> {
        let guard = handle.pin();
        let slots = self.memslots.slots(&guard).ok()?;
        let slot = slots.find_cached(Gfn::from_ipa(ipa), cache)?;
        Some(SlotView {
            ipa: slot.base_gfn().0 << memslot::PAGE_SHIFT,
            size: slot.npages() << memslot::PAGE_SHIFT,
            backing: slot.backing().0,
            logging: slot.flags().contains(SlotFlags::LOG_DIRTY),
        })
    }

    /// Marks the page of `ipa` dirty in the log of the slot that holds it;
    /// true when the mark is new (false also when the slot does not log).
    pub fn mark_dirty(
        &self,
        handle: &crossbeam_epoch::LocalHandle,
        ipa: u64,
        cache: &mut memslot::VcpuSlotCache,
    ) -> bool {
        let guard = handle.pin();
        let Ok(slots) = self.memslots.slots(&guard) else {
            return false;
        };
        let gfn = Gfn::from_ipa(ipa);
        slots
            .find_cached(gfn, cache)
            .is_some_and(|slot| slot.mark_dirty(gfn))
    }

    /// Logs `args` at `level` as a line of vCPU `vcpu` about the
    /// guest-driven `event`, if the VM's event log admits it: a line after
    /// suppressed ones says how many were dropped; a suppressed line is
    /// counted (`log_lines_suppressed`). Bounded in time and memory whatever
    /// the guest does.
    pub fn log_event(
        &self,
        vcpu: usize,
        event: Event,
        level: log::Level,
        args: core::fmt::Arguments<'_>,
    ) {
        let now = self.hw.counter_ticks();
        let decision = self.event_log.lock().admit(event, now);
        match decision {
            LogDecision::Log { suppressed: 0 } => {
                log::log!(level, "vm{} vcpu{vcpu}: {args}", self.index);
            }
            LogDecision::Log { suppressed } => log::log!(
                level,
                "vm{} vcpu{vcpu}: {args} ({suppressed} earlier {} lines suppressed)",
                self.index,
                event.kind().name()
            ),
            LogDecision::Suppress => self.counters.bump(Counter::LogLinesSuppressed),
            LogDecision::Repeat => {}
        }
    }

    /// Logs a guest-driven line about a virtio device through the VM's
    /// event log ([`Vm::log_event`]): as vCPU `vcpu`'s line when its access
    /// caused it, else as the VM's.
    pub fn log_device_event(
        &self,
        vcpu: Option<usize>,
        level: log::Level,
        args: core::fmt::Arguments<'_>,
    ) {
        match vcpu {
            Some(vcpu) => self.log_event(vcpu, Event::DeviceAccess, level, args),
            None => {
                let now = self.hw.counter_ticks();
                let decision = self.event_log.lock().admit(Event::DeviceAccess, now);
                match decision {
                    LogDecision::Log { .. } => log::log!(level, "vm{}: {args}", self.index),
                    LogDecision::Suppress => self.counters.bump(Counter::LogLinesSuppressed),
                    LogDecision::Repeat => {}
                }
            }
        }
    }

    /// Says how many guest-driven lines of each kind were suppressed since the
    /// last one printed (at power-off, so that no count goes unreported).
    fn report_suppressed_lines(&self) {
        for kind in EventKind::ALL {
            let suppressed = self.event_log.lock().take_suppressed(kind);
            if suppressed > 0 {
                log::info!(
                    "vm{}: {suppressed} more {} lines suppressed by the rate limit",
                    self.index,
                    kind.name()
                );
            }
        }
    }

    /// The guest INTID of the emulated PL011.
    pub const fn uart_intid(&self) -> u32 {
        32 + GUEST_UART_SPI
    }

    /// True once the VM is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// True once the VM's end (power-off or stop) is reported.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The physical CPU that runs vCPU `vcpu`.
    pub fn cpu_of(&self, vcpu: usize) -> usize {
        self.cpus[vcpu]
    }

    /// Sends the kick SGI to the CPU of vCPU `vcpu`.
    pub fn kick(&self, vcpu: usize) {
        self.hw.kick(self.cpu_of(vcpu));
    }

    /// Writes a byte of guest console output (the hypervisor console
    /// prefixes and routes it).
    pub fn console_byte(&self, byte: u8) {
        self.hw.guest_output(self.index, byte);
    }

    /// A run of console output bytes of the VM, kept together.
    pub fn console_bytes(&self, bytes: &[u8]) {
        self.hw.guest_output_bytes(self.index, bytes);
    }

    /// The monitor's `pause`: holds every vCPU at EL2 from its next exit
    /// (requested, not waited for).
    pub fn request_pause(&self) -> Result<(), RunStateError> {
        if self.is_stopping() {
            return Err(RunStateError::Stopped);
        }
        self.run_state.request_pause()?;
        self.kick_all();
        Ok(())
    }

    /// The monitor's `resume` of a paused VM.
    pub fn resume(&self) -> Result<(), RunStateError> {
        self.run_state.resume()?;
        self.hw.send_event();
        self.kick_all();
        Ok(())
    }

    /// The monitor's `stop`: the vCPU that next sees it stops the VM
    /// (`StopReason::StopRequested`); requested, not waited for.
    pub fn request_stop(&self) -> Result<(), RunStateError> {
        // A restart under way ends in this stop instead of a boot.
        if self.lifecycle.stop_after_restart() {
            self.hw.send_event();
            self.kick_all();
            return Ok(());
        }
        if self.is_stopping() {
            return Err(RunStateError::Stopped);
        }
        self.run_state.request_stop()?;
        self.hw.send_event();
        self.kick_all();
        Ok(())
    }

    /// Whether the VM is paused, running or stopped, as the monitor shows it.
    pub fn requested_state(&self) -> Requested {
        if self.is_stopping() {
            Requested::StopRequested
        } else {
            self.run_state.get()
        }
    }

    /// Asks for a restart of the VM (see the module doc): from a running or
    /// paused VM its vCPUs halt first; a VM that ended is rebuilt at once.
    /// Requested, not waited for: the rebuild runs on one of the VM's own
    /// CPUs. `why` is logged.
    pub fn request_restart(&self, why: &dyn core::fmt::Display) -> Result<(), RestartError> {
        self.lifecycle.request_restart()?;
        if self.stopping.swap(true, Ordering::AcqRel) {
            log::info!(
                "vm{} ({}): restart requested ({why})",
                self.index,
                self.name
            );
        } else {
            log::info!("vm{} ({}): restarting ({why})", self.index, self.name);
        }
        self.hw.send_event();
        self.kick_all();
        Ok(())
    }

    /// Asks (or stops asking) the VM's parked vCPUs to capture their whole
    /// state into [`Vm::vcpu_states`] (a migration; see `runtime::live_migration`).
    pub fn set_capture_requested(&self, on: bool) {
        self.capture_requested.store(on, Ordering::Release);
        if on {
            self.hw.send_event();
            self.kick_all();
        }
    }

    /// Asks the VM's vCPUs to capture their whole state as they park for
    /// the pause that follows, without kicking them: that pause's kick
    /// brings each one out of its guest once, to park and capture in one
    /// go (a migration's stop, `runtime::live_migration`).
    pub fn request_capture_at_pause(&self) {
        self.capture_requested.store(true, Ordering::Release);
    }

    /// Whether a migration asks for the vCPUs' whole state.
    pub fn capture_requested(&self) -> bool {
        self.capture_requested.load(Ordering::Acquire)
    }

    /// Whether the VM is ending or restarting, as the monitor shows it.
    pub fn is_restarting(&self) -> bool {
        self.lifecycle.restart_pending()
    }

    /// Called by the rebuilder (`runtime::restart`) with every vCPU halted:
    /// the VM runs again from here (not stopping, not ended, running, no
    /// registers parked).
    pub fn reset_run_flags(&self) {
        self.run_state.reset();
        self.power.reset();
        for parked in self.parked.iter() {
            *parked.lock() = None;
        }
        for state in self.vcpu_states.iter() {
            *state.lock() = None;
        }
        self.capture_requested.store(false, Ordering::Release);
        // It boots now: a destination that waited (`start=0`) waits no more,
        // so no migration can land on the running VM.
        self.awaiting_migration.store(false, Ordering::Release);
        *self.migration_job.lock() = None;
        self.migration_throttle.store(0, Ordering::Release);
        self.ended.store(false, Ordering::Release);
        self.stopping.store(false, Ordering::Release);
    }

    /// Writes out the VM's unfinished console line (before a restart).
    pub fn flush_console_line(&self) {
        self.flush_console();
    }

    /// Wakes every vCPU of a VM marked ending ([`Vm::end_migrated`]) out of
    /// its wait, to halt.
    pub fn wake_to_end(&self) {
        self.hw.send_event();
        self.kick_all();
    }

    fn kick_all(&self) {
        for vcpu in 0..self.vcpus {
            self.kick(vcpu);
        }
    }

    /// Marks the VM as stopping and kicks its other vCPUs out of the guest
    /// (or their wait): each sees the mark and halts. False when it was
    /// stopping already (another vCPU got there first and reports, or a
    /// restart is under way): the caller reports nothing.
    fn begin_stop(&self, vcpu: usize) -> bool {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.hw.send_event();
        for other in (0..self.vcpus).filter(|&other| other != vcpu) {
            self.kick(other);
        }
        true
    }

    fn flush_console(&self) {
        self.hw.flush_guest_line(self.index);
    }

    fn print_counters(&self) {
        self.report_suppressed_lines();
        log::info!("vm{} ({}): counters", self.index, self.name);
        for (name, value) in self.counters.snapshot(&self.tlb.counts()) {
            self.hw
                .write_line(format_args!("STAT vm{} {name} {value}", self.index));
        }
        for (name, value) in self.virtio_counters() {
            self.hw
                .write_line(format_args!("STAT vm{} {name} {value}", self.index));
        }
        let lock = self.vgic.lock_stats();
        for (name, value) in [
            ("vgic_lock_contended", lock.contended),
            ("vgic_lock_sleeps", lock.sleeps),
            ("vgic_lock_wait_ticks", lock.wait_ticks),
        ] {
            self.hw
                .write_line(format_args!("STAT vm{} {name} {value}", self.index));
        }
        exit_profile::report(
            &self.exit_profiles,
            self.hw.counter_frequency(),
            |name, value| {
                self.hw
                    .write_line(format_args!("STAT vm{} {name} {value}", self.index));
            },
        );
    }

    /// The virtio devices' counters summed by kind, as `STAT` names (only
    /// the kinds the VM has).
    pub fn virtio_counters(&self) -> Vec<(&'static str, u64)> {
        let mut net = None::<[u64; 5]>;
        let mut blk = None::<[u64; 6]>;
        let mut console = None::<[u64; 3]>;
        let mut ring_errors = 0;
        let mut needs_reset = 0;
        for device in self.virtio.iter() {
            let transport = device.transport.lock();
            ring_errors += transport.ring_errors();
            needs_reset += device.needs_reset_count.load(Ordering::Relaxed);
            match transport.counters() {
                DeviceCounters::Net(c) => {
                    let n = net.get_or_insert([0; 5]);
                    let not_running = device.rx_dropped_not_running.load(Ordering::Relaxed);
                    n[0] += c.tx_frames;
                    n[1] += c.tx_bytes;
                    n[2] += c.rx_frames;
                    n[3] += c.rx_bytes;
                    n[4] += c.rx_no_buffer + c.rx_too_big + c.rx_not_ready + not_running;
                }
                DeviceCounters::Blk(c) => {
                    let b = blk.get_or_insert([0; 6]);
                    b[0] += c.reads;
                    b[1] += c.read_bytes;
                    b[2] += c.writes;
                    b[3] += c.write_bytes;
                    b[4] += c.flushes;
                    b[5] += c.errors;
                }
                DeviceCounters::Console(c) => {
                    let k = console.get_or_insert([0; 3]);
                    k[0] += c.output_bytes;
                    k[1] += c.input_bytes;
                    k[2] += c.input_dropped + c.output_dropped;
                }
            }
        }
        let mut lines = Vec::new();
        if let Some(n) = net {
            lines.extend([
                ("virtio_net_tx_frames", n[0]),
                ("virtio_net_tx_bytes", n[1]),
                ("virtio_net_rx_frames", n[2]),
                ("virtio_net_rx_bytes", n[3]),
                ("virtio_net_rx_dropped", n[4]),
            ]);
        }
        if let Some(b) = blk {
            lines.extend([
                ("virtio_blk_reads", b[0]),
                ("virtio_blk_read_bytes", b[1]),
                ("virtio_blk_writes", b[2]),
                ("virtio_blk_write_bytes", b[3]),
                ("virtio_blk_flushes", b[4]),
                ("virtio_blk_errors", b[5]),
            ]);
        }
        if let Some(k) = console {
            lines.extend([
                ("virtio_console_out_bytes", k[0]),
                ("virtio_console_in_bytes", k[1]),
                ("virtio_console_dropped_bytes", k[2]),
            ]);
        }
        if !self.virtio.is_empty() {
            lines.push(("virtio_ring_errors", ring_errors));
            lines.push(("virtio_needs_reset", needs_reset));
        }
        lines
    }

    /// Guest `SYSTEM_OFF`: ends this VM (see the module doc) and reports;
    /// false when the VM was ending already (nothing reported).
    #[must_use]
    pub fn system_off(&self, vcpu: usize) -> bool {
        if !self.begin_stop(vcpu) {
            return false;
        }
        self.flush_console();
        self.virtio.detach(self.device_hub.switch());
        log::info!("vm{} vcpu{vcpu}: PSCI SYSTEM_OFF", self.index);
        self.print_counters();
        log::info!("vm{} ({}): powered off", self.index, self.name);
        self.ended.store(true, Ordering::Release);
        true
    }

    /// Guest `SYSTEM_RESET` when this is the only VM: reports and resets the
    /// machine.
    pub fn system_reset(&self, vcpu: usize) -> ! {
        if !self.begin_stop(vcpu) {
            self.hw.park();
        }
        self.flush_console();
        log::info!("vm{} vcpu{vcpu}: PSCI SYSTEM_RESET", self.index);
        self.print_counters();
        log::info!("system reset");
        self.hw.system_reset()
    }

    /// Stops the VM because of `reason` (an exit that cannot be handled, or
    /// another cause the hypervisor names): ends this VM (see the module
    /// doc) and reports; false when the VM was ending already (nothing
    /// reported). The hypervisor stays in control.
    #[must_use]
    pub fn stop(&self, vcpu: usize, reason: &dyn core::fmt::Display) -> bool {
        if !self.begin_stop(vcpu) {
            return false;
        }
        log::error!("vm{} vcpu{vcpu}: stopping the VM: {reason}", self.index);
        self.report_end(reason);
        true
    }

    /// Ends the VM after a migration moved it elsewhere: marks it stopping
    /// (nothing resumes it from now on); the first of its vCPUs to halt
    /// reports the end with `reason` ([`Vm::report_end_left_to_vcpus`]),
    /// after the destination started, not on the migration's CPU before
    /// it. Its parked vCPUs are not kicked here: [`Vm::wake_to_end`] does
    /// it once the destination runs, so that their halting and the
    /// report's console lines do not compete with the destination's
    /// release. The same vCPU turns off the dirty logging of
    /// `slots_to_unlog` (the migration's) before it reports. False when it
    /// was ending already (nothing left to report).
    #[must_use]
    pub fn end_migrated(&self, reason: String, slots_to_unlog: Vec<SlotId>) -> bool {
        // Held across the mark: a vCPU that halts at once waits here for
        // the reason instead of finding none.
        let mut to_report = self.end_to_report.lock();
        if self.stopping.swap(true, Ordering::AcqRel) {
            return false;
        }
        *to_report = Some(EndToReport {
            reason,
            lines_before: Vec::new(),
            slots_to_unlog,
        });
        true
    }

    /// Logs `line` with the end left to the vCPUs ([`Vm::end_migrated`]),
    /// before it; at once when that end was reported already (or there is
    /// none).
    pub fn log_before_end_report(&self, line: String) {
        let mut to_report = self.end_to_report.lock();
        match to_report.as_mut() {
            Some(end) => end.lines_before.push(line),
            None => {
                drop(to_report);
                log::info!("{line}");
            }
        }
    }

    /// Reports the end a migration left to the VM's vCPUs, if it is still
    /// to be reported (the first halting vCPU's call does it, later ones
    /// find nothing), after turning off the migration's dirty logging;
    /// true when this call reported it. The caller tells the machine the
    /// VM ended.
    pub fn report_end_left_to_vcpus(&self) -> bool {
        let Some(end) = self.end_to_report.lock().take() else {
            return false;
        };
        crate::runtime::dirty_log::disable_slots(self, &end.slots_to_unlog);
        for line in &end.lines_before {
            log::info!("{line}");
        }
        self.report_end(&end.reason);
        true
    }

    /// Reports the end of a VM already marked stopping (its vCPUs halt):
    /// console line, counters, the line that says why.
    pub fn report_end(&self, reason: &dyn core::fmt::Display) {
        // Its devices' interrupts go quiet (`runtime::passed_devices`).
        for irq in self.passthrough.interrupts() {
            self.hw.passthrough_spi_release(irq.intid);
        }
        crate::runtime::passed_devices::release_msis(self);
        self.flush_console();
        self.virtio.detach(self.device_hub.switch());
        self.print_counters();
        log::info!("vm{} ({}): stopped: {reason}", self.index, self.name);
        self.ended.store(true, Ordering::Release);
    }
}

/// What a VM's own RAM and emulated devices hold, for the check of the host
/// devices it owns.
fn own_claims(ram: PhysRange, vcpus: usize, gicv2: bool, virtio: &VirtioDevices) -> Vec<Claim> {
    let claim = |owner: &str, windows: Vec<PhysRange>, intids: Vec<u32>| Claim {
        owner: owner.into(),
        windows,
        intids,
        path: None,
    };
    let mut gic_frames = alloc::vec![PhysRange::from_start_size(
        GUEST_GICD_BASE,
        vgic::DISTRIBUTOR_SIZE
    )];
    if gicv2 {
        gic_frames.push(PhysRange::from_start_size(GUEST_GICC_BASE, GUEST_GICC_SIZE));
    } else {
        gic_frames.push(PhysRange::from_start_size(
            GUEST_GICR_BASE,
            vcpus as u64 * vgic::REDISTRIBUTOR_STRIDE,
        ));
        gic_frames.push(PhysRange::from_start_size(
            GUEST_ITS_BASE,
            vgic::its::ITS_SIZE,
        ));
    }
    let nodes = virtio.guest_nodes();
    alloc::vec![
        claim("the VM's RAM", alloc::vec![ram], Vec::new()),
        claim(
            "the VM's emulated UART",
            alloc::vec![PhysRange::from_start_size(GUEST_UART_BASE, GUEST_UART_SIZE)],
            alloc::vec![32 + GUEST_UART_SPI],
        ),
        claim("the VM's virtual GIC", gic_frames, Vec::new(),),
        claim(
            "the VM's emulated virtio-mmio devices",
            nodes.iter().map(|n| n.window).collect(),
            nodes.iter().map(|n| 32 + n.spi).collect(),
        ),
    ]
}

/// Creates VM `index` of the payload, `vm`, on the machine `info`
/// describes; returns it with the boot request of its vCPU 0. Its vCPUs run
/// on the CPUs its `vm.conf` names (`cpus=`), else on CPUs `0..vcpus`. The
/// VM keeps what its vCPUs need of `info`. Its virtio devices
/// (`runtime::virtio_devices`) serve the host disks `hw` has, and its
/// network port is on `hub`'s switch.
pub fn create_vm<H: Hardware>(
    hw: &'static H,
    info: &BootInfo,
    index: usize,
    vm: &VmRef<'static>,
    hub: &'static DeviceHub<H>,
) -> Result<(&'static Vm<H>, BootRequest), VmError> {
    let name = vm.name;
    let PayloadRef {
        kernel,
        initrd,
        cmdline,
        conf,
    } = vm.payload;
    let (header, kernel_format) = image::parse_kernel(kernel).map_err(VmError::Kernel)?;
    let online = info.cpus_online as u32;
    let vcpu_count = conf.vcpu_count(online);
    if vcpu_count > online {
        return Err(VmError::TooManyVcpus {
            asked: vcpu_count,
            online: info.cpus_online,
        });
    }
    let cpus: Vec<usize> = match conf.cpus {
        Some(set) if set.len() < vcpu_count => {
            return Err(VmError::MoreVcpusThanCpus {
                vcpus: vcpu_count,
                cpus: set.len(),
            });
        }
        Some(set) => set
            .iter()
            .take(vcpu_count as usize)
            .map(|cpu| cpu as usize)
            .collect(),
        None => (0..vcpu_count as usize).collect(),
    };
    if let Some(&cpu) = cpus.iter().find(|&&cpu| cpu >= info.cpus_online) {
        return Err(VmError::Payload(PayloadError::NoSuchCpu {
            vm: name,
            cpu: cpu as u32,
            host_cpus: online,
        }));
    }
    let vcpus = cpus.len();
    let mte = conf.mte == Some(true);
    if mte && !info.features.mte {
        return Err(VmError::NoMemoryTagging);
    }
    let mem_bytes = conf.mem_mib.unwrap_or(DEFAULT_MEM_MIB) << 20;
    let passthrough = match info.passthrough.get(index) {
        Some(Ok(plan)) => plan.clone(),
        Some(Err(e)) => return Err(VmError::Passthrough(e.clone())),
        None => PassthroughPlan::default(),
    };
    // Identity RAM (`ram=identity`): its IPA is the host address of its
    // frames, so a passed device's DMA reaches it.
    let identity = conf.ram == Some(RamPlacement::Identity);
    let backing = hw
        .alloc_frames(mem_bytes, BACKING_ALIGN)
        .ok_or(VmError::NoHostMemory(mem_bytes))?;
    let ram_base = if identity { backing } else { GUEST_RAM_BASE };
    let ram = PhysRange::from_start_size(ram_base, mem_bytes);
    // On a GICv2 host the guest gets a GICv2, its CPU interface the
    // hardware's GICV frame.
    let gicv2 = info
        .platform
        .gicv2
        .as_ref()
        .filter(|_| hw.gic_is_v2())
        .and_then(|g| g.virtual_cpu);
    // A passed PCI bus signals MSIs where its writes to the virtual ITS's
    // `GITS_TRANSLATER` reach a physical ITS the hypervisor drives
    // (`vm::msi_shadow`); elsewhere its devices use INTx.
    let msi_passthrough = gicv2.is_none()
        && passthrough.has_pci_bridge()
        && hw.host_its_base() == Some(GUEST_ITS_BASE);

    let placement = layout::place(
        ram,
        header.text_offset,
        header.image_size,
        initrd.map(|data| data.len() as u64),
    )
    .map_err(|e| VmError::DoesNotFit(e.0))?;
    let bootargs = String::from(cmdline.unwrap_or_default());
    let control = conf.control.unwrap_or(false);
    let virtio = VirtioDevices::from_conf(&conf, name.as_str(), control, |disk| hw.host_disk(disk))
        .map_err(VmError::Virtio)?;
    let own = own_claims(ram, vcpus, gicv2.is_some(), &virtio);
    // Identity RAM lands where host RAM is, which on some boards is below
    // the guest's device windows.
    if let Some(claim) = own.iter().skip(1).find(|c| {
        identity
            && c.windows
                .iter()
                .any(|w| w.start < ram.end && ram.start < w.end)
    }) {
        hw.free_frames(backing, mem_bytes, BACKING_ALIGN);
        return Err(VmError::IdentityRam {
            ram,
            owner: claim.owner.clone(),
        });
    }
    if let Err(e) = passthrough.check_vm(&own) {
        hw.free_frames(backing, mem_bytes, BACKING_ALIGN);
        return Err(VmError::Passthrough(e));
    }

    // No data of an earlier owner may reach the guest: the RAM is zeroed
    // chunk by chunk before anything reaches it (`vm::lazy_zero`), the boot
    // image's chunks right here; all of it now where a passed device's DMA
    // could reach it without a stage-2 fault.
    let zero = |addr: usize, len: usize| hw.zero_memory(addr, len);
    let ram_zeroing = LazyZeroedRam::new(backing, mem_bytes);
    if !passthrough.devices.is_empty() {
        ram_zeroing.finish(zero);
    }
    let host_of = |ipa: u64| backing + (ipa - ram_base);
    ram_zeroing.ensure(host_of(placement.kernel.start), kernel.len() as u64, zero);
    if let (Some(range), Some(initrd)) = (placement.initrd, initrd) {
        ram_zeroing.ensure(host_of(range.start), initrd.len() as u64, zero);
    }
    ram_zeroing.ensure(host_of(placement.dtb.start), placement.dtb.size(), zero);
    // SAFETY: the frames were just allocated for this VM and are identity mapped.
    let guest_ram =
        unsafe { core::slice::from_raw_parts_mut(backing as *mut u8, mem_bytes as usize) };
    let at = |ipa: u64| (ipa - ram_base) as usize;
    guest_ram[at(placement.kernel.start)..][..kernel.len()].copy_from_slice(kernel);
    if let (Some(range), Some(initrd)) = (placement.initrd, initrd) {
        guest_ram[at(range.start)..][..initrd.len()].copy_from_slice(initrd);
    }
    let dtb = device_tree::build(&GuestDtbConfig {
        ram,
        vcpus,
        uart: PhysRange::from_start_size(GUEST_UART_BASE, GUEST_UART_SIZE),
        bootargs: &bootargs,
        initrd: placement.initrd,
        gic: Some(GuestGic {
            distributor: PhysRange::from_start_size(GUEST_GICD_BASE, vgic::DISTRIBUTOR_SIZE),
            frames: if gicv2.is_some() {
                GuestGicFrames::V2 {
                    cpu_interface: PhysRange::from_start_size(GUEST_GICC_BASE, GUEST_GICC_SIZE),
                }
            } else {
                GuestGicFrames::V3 {
                    redistributors: PhysRange::from_start_size(
                        GUEST_GICR_BASE,
                        vcpus as u64 * vgic::REDISTRIBUTOR_STRIDE,
                    ),
                    its: Some(PhysRange::from_start_size(
                        GUEST_ITS_BASE,
                        vgic::its::ITS_SIZE,
                    )),
                }
            },
            maintenance_intid: GUEST_MAINTENANCE_INTID,
            uart_spi: GUEST_UART_SPI,
        }),
        timer: Some(GuestTimer {
            intids: GUEST_TIMER_INTIDS,
        }),
        virtio: &virtio.guest_nodes(),
        passed: &passthrough
            .devices
            .iter()
            .map(|d| &d.node)
            .collect::<Vec<_>>(),
        pci_msi: msi_passthrough,
    })
    .map_err(VmError::Dtb)?;
    if dtb.len() as u64 > placement.dtb.size() {
        return Err(VmError::DoesNotFit(dtb.len() as u64));
    }
    guest_ram[at(placement.dtb.start)..][..dtb.len()].copy_from_slice(&dtb);
    let boot_request = BootRequest {
        entry: placement.kernel.start,
        context_id: placement.dtb.start,
    };
    let boot = BootImage {
        kernel,
        initrd,
        dtb,
        kernel_ipa: placement.kernel.start,
        initrd_ipa: placement.initrd.map(|range| range.start),
        dtb_ipa: placement.dtb.start,
        request: boot_request,
    };
    // The guest starts with its MMU off: its accesses bypass the caches,
    // unless stage 2 forces them write-back cacheable (FEAT_S2FWB). Without
    // FWB each page is cleaned to the point of coherency when it is mapped
    // at stage 2 (as KVM does), not here: see `cache_maint`.
    hw.invalidate_icache_all();

    let features = info.features;
    let vmid16 = features.vmid_bits == 16;
    let vmid = index as u16 + 1;
    let config = Stage2Config::new(IPA_BITS.min(u32::from(features.pa_bits)))
        .map_err(|e| VmError::Stage2(e.into()))?
        .with_fwb(features.fwb);
    let vtcr = config
        .vtcr(features.pa_range, vmid16)
        .map_err(|e| VmError::Stage2(e.into()))?;
    let counters: &'static VmCounters = Box::leak(Box::new(VmCounters::new()));
    let cache_caps = hw.cache_caps();
    let frames = hw.guest_table_memory(cache_caps, counters);
    let mut stage2 = Stage2PageTable::new(config, frames, vmid, vmid16).map_err(VmError::Stage2)?;
    // Device memory mapped once, never trapped: the hardware's virtual CPU
    // interface at the guest's GICC window (GICv2 host), and the passed
    // devices' windows that fill whole pages, at their own addresses.
    let mut device_windows: Vec<(u64, u64, u64)> = Vec::new();
    if let Some(gicv) = gicv2 {
        device_windows.push((
            GUEST_GICC_BASE,
            GUEST_GICC_SIZE.min(gicv.size()),
            gicv.start,
        ));
    }
    for window in passthrough.devices.iter().flat_map(|d| d.mapped.iter()) {
        device_windows.push((window.start, window.size(), window.start));
    }
    for (ipa, size, pa) in device_windows {
        let pa = PhysAddr::new(pa);
        let needed = stage2
            .pages_needed_to_map(ipa, size, pa)
            .map_err(VmError::Stage2)?;
        let mut cache = PageCache::with_capacity(needed);
        cache
            .top_up(&hw.table_memory(), needed)
            .map_err(|_| VmError::Stage2(pgtable::Error::NoMemory))?;
        let attrs = Attributes {
            perms: Perms::RW,
            mem: MemType::Device,
        };
        stage2
            .map(ipa, size, pa, attrs, &mut cache, &hw.tlb(info.tlb_caps))
            .map_err(VmError::Stage2)?;
        cache.release(&hw.table_memory());
    }
    let vttbr = stage2.vttbr();
    // One read-side handle per vCPU (each vCPU registers once, on its CPU).
    let stage2 = Mmu::new(stage2, vcpus).map_err(VmError::Stage2)?;
    let collector: &'static Collector = Box::leak(Box::new(Collector::new()));
    let memslots = Memslots::new(collector, DirtyLogMode::default()).map_err(VmError::Memslot)?;
    {
        let handle = collector.register();
        let spec = SlotSpec {
            id: SlotId::new(0).map_err(VmError::Memslot)?,
            base_gfn: Gfn::from_ipa(ram_base),
            npages: mem_bytes >> memslot::PAGE_SHIFT,
            backing: HostPhysAddr(backing),
            flags: SlotFlags::NONE,
        };
        memslots.create(&handle, spec).map_err(VmError::Memslot)?;
    }
    let mut mmio = MmioBus::new();
    mmio.add(MmioRegion {
        base: GUEST_UART_BASE,
        size: GUEST_UART_SIZE,
        device: DeviceId::Uart,
    })
    .map_err(VmError::Devices)?;
    mmio.add(MmioRegion {
        base: GUEST_GICD_BASE,
        size: vgic::DISTRIBUTOR_SIZE,
        device: DeviceId::Gic,
    })
    .map_err(VmError::Devices)?;
    // Each redistributor's two 64 KiB frames (RD_base, SGI_base) are windows
    // of their own, so an access across a frame boundary is refused like one
    // past the end of a device. A GICv2 has none.
    let frames = if gicv2.is_some() {
        0
    } else {
        vcpus as u64 * (vgic::REDISTRIBUTOR_STRIDE / vgic::SGI_BASE_OFFSET)
    };
    for frame in 0..frames {
        mmio.add(MmioRegion {
            base: GUEST_GICR_BASE + frame * vgic::SGI_BASE_OFFSET,
            size: vgic::SGI_BASE_OFFSET,
            device: DeviceId::Gic,
        })
        .map_err(VmError::Devices)?;
    }
    if gicv2.is_none() {
        mmio.add(MmioRegion {
            base: GUEST_ITS_BASE,
            size: vgic::its::ITS_SIZE,
            device: DeviceId::Its,
        })
        .map_err(VmError::Devices)?;
    }
    virtio.add_regions(&mut mmio).map_err(VmError::Virtio)?;
    // Passed windows that share their pages with other devices: each access
    // traps and is performed on the device (`vm::passthrough`).
    for window in passthrough.devices.iter().flat_map(|d| d.forwarded.iter()) {
        mmio.add(MmioRegion {
            base: window.start,
            size: window.size(),
            device: DeviceId::Passed,
        })
        .map_err(VmError::Devices)?;
    }
    let vgic_config = VgicConfig {
        distributor_base: GUEST_GICD_BASE,
        redistributor_base: GUEST_GICR_BASE,
        spi_count: passthrough.spi_count(GUEST_SPI_COUNT),
        vcpu_mpidrs: (0..vcpus).map(vcpu_mpidr).collect(),
    };
    let vgic = if gicv2.is_some() {
        Vgic::new_v2(vgic_config)
    } else {
        Vgic::new(vgic_config)
    }
    .map_err(VmError::Vgic)?;
    vgic.set_lock_wait(hw);
    if gicv2.is_none() {
        vgic.enable_its(GUEST_ITS_BASE).map_err(VmError::Vgic)?;
    }
    // The timers' interrupts are hardware-linked: the guest's deactivation
    // of INTID 27 or 30 deactivates the host PPI the vCPU's CPU left active
    // (`crate::devices::timer`).
    for timer in TimerId::ALL {
        vgic.lock()
            .link_hardware_ppi(timer.guest_intid(), timer.host_intid(info.platform.timer))
            .map_err(VmError::Vgic)?;
    }
    // A passed SPI keeps its INTID; its physical interrupt goes to vCPU 0's
    // CPU until the guest routes the virtual one elsewhere.
    let mut passthrough_routes = Vec::new();
    for irq in passthrough.interrupts() {
        vgic.lock()
            .link_hardware_spi(irq.intid, irq.intid)
            .map_err(VmError::Vgic)?;
        hw.passthrough_spi_setup(irq.intid, irq.trigger == HostTrigger::Edge, cpus[0]);
        passthrough_routes.push((irq.intid, cpus[0]));
    }
    if gicv2.is_none() && (!features.gic_sysregs || info.platform.gic.is_none()) {
        log::warn!(
            "vm{index}: the host has no GICv3 with a system-register CPU interface and no GICv2 with virtualization extensions: the guest gets no interrupts"
        );
    }
    let vm = Box::leak(Box::new(Vm {
        hw,
        index,
        name,
        cpus,
        vcpus,
        control,
        stage2,
        vtcr,
        vttbr,
        fwb: features.fwb,
        mte,
        tlb: CountingTlb::new(hw.tlb(info.tlb_caps)),
        collector,
        memslots,
        ram,
        identity_ram: identity,
        mmio,
        uart: Mutex::new(GuestUart {
            device: Pl011::new(),
            backlog: RxBacklog::new(),
            irq_level: false,
        }),
        vgic,
        virtio,
        passthrough,
        passthrough_routes: Mutex::new(passthrough_routes),
        msi_passthrough,
        msi_shadow: Mutex::new(MsiShadow::new()),
        device_hub: hub,
        power: PowerStates::new(vcpus),
        run_state: RunState::new(),
        parked: (0..vcpus).map(|_| Mutex::new(None)).collect(),
        exit_profiles: (0..vcpus).map(|_| ExitProfile::new()).collect(),
        counters,
        boot,
        lifecycle: Lifecycle::new(),
        eager_split_chunk: core::sync::atomic::AtomicU64::new(0),
        ram_zeroing,
        start: conf.start.unwrap_or(true),
        awaiting_migration: AtomicBool::new(!conf.start.unwrap_or(true)),
        vcpu_states: (0..vcpus).map(|_| Mutex::new(None)).collect(),
        migration_job: Mutex::new(None),
        migration_throttle: AtomicU8::new(0),
        stop_copy: CopyBoard::new(),
        capture_requested: AtomicBool::new(false),
        gic_sysregs: features.gic_sysregs,
        host_uart_intid: info.platform.uart_intid,
        event_log: Mutex::new(EventLog::new(RatePolicy::for_counter_frequency(
            hw.counter_frequency(),
        ))),
        stopping: AtomicBool::new(false),
        end_to_report: Mutex::new(None),
        ended: AtomicBool::new(false),
    }));
    hub.register(vm);
    // A destination that waits for a migration gets the source's port then.
    if vm.start {
        vm.virtio
            .attach(hub.switch(), DeviceHub::<H>::owner_of(vm))
            .map_err(|e| VmError::Virtio(VirtioError::Switch(e)))?;
    }
    for (i, device) in vm.virtio.iter().enumerate() {
        log::info!(
            "vm{index}: virtio {} {i} at {:#x}, SPI {}{}",
            device.role.name(),
            device.window.start,
            device.spi,
            device
                .net
                .as_ref()
                .map_or_else(String::new, |net| format!(", network {}", net.network)),
        );
    }
    for device in &vm.passthrough.devices {
        let windows = |list: &[PhysRange]| {
            list.iter()
                .map(|w| format!("{:#x}+{:#x}", w.start, w.size()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
        log::info!(
            "vm{index}: owns {}: mapped [{}], forwarded [{}], SPIs (INTIDs) {intids:?}",
            device.path,
            windows(&device.mapped),
            windows(&device.forwarded),
        );
        if !device.dropped.is_empty() {
            log::info!(
                "vm{index}: {}: left out of the guest's copy (host references): {}",
                device.path,
                device.dropped.join(" ")
            );
        }
    }
    if vm.passthrough.has_pci_bridge() {
        if msi_passthrough {
            log::info!(
                "vm{index}: passed PCI bus: MSIs through the virtual ITS at {GUEST_ITS_BASE:#x} (the host's ITS is there)"
            );
        } else {
            log::info!(
                "vm{index}: passed PCI bus: INTx only (no host ITS the hypervisor drives at {GUEST_ITS_BASE:#x}, or a GICv2)"
            );
        }
    }
    log::info!(
        "vm{index}: {vcpus} vCPU(s), name {name}, CPUs {:?}, {} MiB RAM at IPA {ram_base:#x}{} backed by {backing:#x}, VMID {vmid}, \
         kernel {:#x} ({} bytes{}), device tree {:#x}{}{}",
        vm.cpus,
        mem_bytes >> 20,
        if identity { " (identity)" } else { "" },
        placement.kernel.start,
        kernel.len(),
        match kernel_format {
            KernelFormat::Image => "",
            KernelFormat::RawBinary => ", raw binary: no Image header",
        },
        placement.dtb.start,
        placement
            .initrd
            .map_or_else(String::new, |r| format!(", initrd {:#x}", r.start)),
        if bootargs.is_empty() {
            String::new()
        } else {
            format!(", bootargs \"{bootargs}\"")
        },
    );
    let plan = cache_caps.icache_plan();
    log::info!(
        "vm{index}: {}; instruction cache for executable mappings: {}{}",
        if features.fwb {
            "FEAT_S2FWB: stage 2 forces write-back, no data cache maintenance, set/way runs natively"
        } else {
            "no FEAT_S2FWB: pages cleaned to PoC when mapped, set/way trapped and converted"
        },
        match plan.invalidate {
            IcacheInval::None => "no invalidation (CTR_EL0.DIC)",
            IcacheInval::ByAddress => "IC IVAU",
            IcacheInval::All => "IC IALLUIS",
        },
        if plan.clean_to_pou {
            ", DC CVAU first"
        } else {
            ""
        },
    );
    if mte {
        log::info!(
            "vm{index}: memory tagging on: allocation tags accessible (HCR_EL2.ATA), every page's tags zeroed before it is mapped, tags carried by live migration"
        );
    }
    Ok((vm, boot_request))
}
