//! The boot sequence in Rust, on the boot CPU and on secondary CPUs.
//!
//! `primary_main` runs with the early identity map: it starts the heap, reads
//! the platform from the device tree, starts the console, carves host memory
//! and switches to the final EL2 tables, installs the vectors and per-CPU data,
//! prints the banner, finds the host's disks (`host_disk::probe`), starts every other CPU with PSCI `CPU_ON`, publishes the
//! boot information (`runtime::boot_info`) and hands over to `arch::run`. `secondary_main` is where the other CPUs arrive.
//! `wrong_el_main` reports that the image was entered outside EL2.
//!
//! CPU features: every CPU reads its own ID registers as it comes up. The boot
//! CPU publishes what the system already relies on (`SystemFeatures::new`,
//! pure, in `cpu_features`) before it starts any secondary; a secondary that
//! does not cover it records its features, raises `rejected` and parks
//! without touching memory again (so its per-CPU slot and stack are reused),
//! and the boot CPU reports it and gives it no vCPU. The boot CPU merges the
//! features of every CPU that comes online into the system-wide minimum,
//! which the banner prints and the VM's stage 2 and TLB maintenance use.

mod entry;
pub mod exceptions;
pub mod firmware;
pub mod memory;

use crate::arch::cpu::features::local_features;
use crate::arch::cpu::percpu::{self, MAX_CPUS};
use crate::arch::cpu::sysreg;
use crate::arch::drivers::console;
use crate::arch::drivers::gic;
use crate::arch::run;
use crate::devices::vgic::ListRegisters;
use crate::platform::banner::{self, ListRegisterSource};
use crate::platform::cpu_features::{CpuFeatures, SystemFeatures};
use crate::platform::ranges::PhysRange;
use crate::platform::{Platform, PsciConduit};
use crate::runtime::boot_info::{self, BootInfo};
use crate::vm::passthrough::{self, PassthroughError, PassthroughPlan};
use aarch64_cpu::registers::ICH_VTR_EL2;
use core::sync::atomic::Ordering;
use spin::Once;

/// What a secondary CPU must have, published by the boot CPU before it starts
/// any.
static REQUIRED: Once<CpuFeatures> = Once::new();

/// Size of the device tree blob at `dtb`, from its header (big-endian `totalsize`).
///
/// # Safety
/// `dtb` must point at readable memory holding at least a device tree header.
unsafe fn dtb_total_size(dtb: usize) -> usize {
    // SAFETY: the caller guarantees the header is readable; `totalsize` is the
    // second 32-bit word and the header is 8-byte aligned by the boot protocol.
    let raw = unsafe { core::ptr::read_volatile((dtb + 4) as *const u32) };
    u32::from_be(raw) as usize
}

/// The GIC list registers (`ICH_VTR_EL2.ListRegs + 1`), when the CPU has the
/// GICv3 system-register interface. Enables that interface at EL2 and lets
/// EL1 use it (`ICC_SRE_EL2.SRE | Enable`).
fn list_registers(features: &CpuFeatures) -> Option<u64> {
    if !features.gic_sysregs {
        return None;
    }
    // SAFETY: enabling the system-register interface at EL2 (SRE) and allowing
    // EL1 to use it (Enable) changes no memory; the GIC is not in use yet.
    unsafe { crate::write_sysreg!(icc_sre_el2, crate::sysreg_values::ICC_SRE_EL2_VALUE) };
    sysreg::isb();
    Some(crate::read_sysreg!(ich_vtr_el2, ICH_VTR_EL2).read(ICH_VTR_EL2::ListRegs) + 1)
}

/// Entry of the boot CPU, with the MMU on (called from `entry`).
#[unsafe(no_mangle)]
extern "C" fn primary_main(dtb: usize, load_address: usize) -> ! {
    let boot_mpidr = sysreg::current_mpidr();
    percpu::install(0, boot_mpidr);
    exceptions::install_vectors();
    memory::init_boot_heap();
    // SAFETY: the boot protocol passes a device tree in x0 and the early map
    // covers it as normal memory.
    let dtb_size = unsafe { dtb_total_size(dtb) };
    // SAFETY: as above; the blob stays untouched (it is excluded from the
    // frame allocator below).
    let dtb_bytes = unsafe { core::slice::from_raw_parts(dtb as *const u8, dtb_size) };
    let platform = match Platform::from_dtb(dtb_bytes) {
        Ok(p) => p,
        // Without a device tree there is no console to report on.
        Err(_) => firmware::halt(),
    };
    // SAFETY: the device tree names this UART, of this kind, as the console;
    // the early map covers all of the low 512 GiB as device memory outside RAM.
    unsafe { console::init(platform.uart.start as usize, platform.uart_kind) };
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
        firmware::halt();
    }
    firmware::set_conduit(platform.psci);

    let virtio_windows = crate::platform::virtio_mmio::windows(dtb_bytes).unwrap_or_else(|e| {
        log::warn!("virtio-mmio windows not read from the device tree: {e}");
        alloc::vec::Vec::new()
    });
    let mut in_use = alloc::vec![
        memory::image_range(),
        PhysRange::from_start_size(dtb as u64, dtb_size as u64)
    ];
    in_use.extend(platform.initrd);
    let virtio_pages = crate::platform::virtio_mmio::pages(&virtio_windows);
    let summary = match memory::init(&platform, in_use, &virtio_pages) {
        Ok(s) => s,
        Err(e) => panic!("memory setup failed: {e}"),
    };
    percpu::slot(0).online.store(true, Ordering::Release);

    let boot_features = local_features();
    if boot_features.mte {
        // Before any guest page is zeroed and before the secondaries copy
        // MAIR_EL2 and SCTLR_EL2.
        crate::arch::cpu::memory_tagging::enable();
    }
    *percpu::slot(0).features.lock() = Some(boot_features);
    *percpu::slot(0).vector_lengths.lock() = crate::arch::vcpu::measure_lengths(&boot_features);
    let mut system = SystemFeatures::new(boot_features);
    REQUIRED.call_once(|| system.required());
    let list_regs = list_registers(&boot_features);
    let psci_version = firmware::version();
    log::info!("platform: {}", platform.model);
    log::info!(
        "RAM: {} MiB in {} bank(s), {} MiB free for guests and tables",
        platform.ram_bytes() >> 20,
        platform.ram.len(),
        summary.free_bytes >> 20
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
    let mut passthrough = passthrough_plans(dtb_bytes, &platform);
    let host_windows = passthrough::host_disk_windows(&virtio_windows, &passthrough);
    passthrough::map_passed_pages(
        &mut passthrough,
        dtb_bytes,
        &virtio_windows,
        empty_transport,
    );
    crate::arch::host_disk::probe(&host_windows);

    if let Some(host_gic) = platform.gic.as_ref().filter(|_| list_regs.is_some()) {
        let timers = crate::vocabulary::timers::TimerId::ALL.map(|t| t.host_intid(platform.timer));
        gic::init_distributor(host_gic, timers, platform.uart_intid, boot_mpidr);
        match gic::init_cpu(0) {
            Ok(()) => {
                if platform.uart_intid.is_some() {
                    console::enable_receive_interrupt();
                }
            }
            Err(e) => log::warn!("GICv3 CPU interface: {e:?}"),
        }
        // The host's ITS carries passed PCIe devices' MSIs
        // (`arch::drivers::its`), with LPIs on every CPU.
        if let Some(frames) = host_gic.its {
            let memory = crate::arch::drivers::its::Frames {
                alloc: memory::alloc_frames,
                free: memory::free_frames,
            };
            match crate::arch::drivers::its::init(frames, HOST_LPI_POOL, memory) {
                Ok(bits) => {
                    log::info!(
                        "host ITS at {:#x}: {bits} DeviceID bits, {HOST_LPI_POOL} LPIs for passed PCIe devices' MSIs",
                        frames.start
                    );
                    its_cpu_init(0);
                }
                Err(e) => log::warn!("host ITS at {:#x}: not used: {e}", frames.start),
            }
        }
    } else if let Some(host_gic) = platform.gicv2.as_ref() {
        let timers = crate::vocabulary::timers::TimerId::ALL.map(|t| t.host_intid(platform.timer));
        if gic::init_gicv2(host_gic, timers, platform.uart_intid) {
            match gic::init_cpu(0) {
                Ok(()) => {
                    if platform.uart_intid.is_some() {
                        console::enable_receive_interrupt();
                    }
                }
                Err(e) => log::warn!("GICv2 CPU interface: {e:?}"),
            }
        }
    }

    let cpus_online = start_secondaries(&platform, boot_mpidr, &mut system);
    log::info!(
        "CPUs: {cpus_online} online of {} in the device tree",
        platform.cpus.len()
    );
    let features = system.features();
    // Read first, as the banner always did: a GICv2's `GICH_VTR`.
    let gich = gic::list_registers(false);
    let list_registers = match (list_regs, gich) {
        (Some(n), _) => ListRegisterSource::SystemRegisters(n),
        (None, Some(v2)) => ListRegisterSource::Gich(v2.count()),
        (None, None) => ListRegisterSource::None,
    };
    log::info!(
        "{}",
        banner::features_line(&features, cpus_online, list_registers)
    );
    let payload = platform.initrd;
    let tlb_caps = features.tlb_caps();
    log::info!("{}", banner::tlb_line(tlb_caps));
    let info = boot_info::publish(BootInfo {
        platform,
        features,
        cpus_online,
        payload,
        tlb_caps,
        passthrough,
    });
    run::run_boot_cpu(info)
}

/// Whether the virtio-mmio transport at `base` has nothing behind it: its
/// magic value reads back and its DeviceID is 0.
fn empty_transport(base: u64) -> bool {
    // SAFETY: `base` is a virtio-mmio window of the device tree, which
    // `memory::init` mapped as device memory at EL2; reading the magic and
    // DeviceID registers has no side effect.
    let (magic, device_id) = unsafe {
        (
            core::ptr::read_volatile(base as *const u32),
            core::ptr::read_volatile((base + 8) as *const u32),
        )
    };
    magic == 0x7472_6976 && device_id == 0
}

/// Each VM's passed-through devices, read from the host tree before the
/// host disks are probed (a passed node is the VM's, not a host disk). The
/// payload is parsed here for its `device=` lines only
/// (`vm::passthrough::plan_payload`); `runtime::cpu_start` parses it again
/// and reports what is wrong with it.
fn passthrough_plans(
    dtb: &[u8],
    platform: &Platform,
) -> alloc::vec::Vec<Result<PassthroughPlan, PassthroughError>> {
    let Some(payload) = platform.initrd else {
        return alloc::vec::Vec::new();
    };
    // SAFETY: the boot loader placed the payload there; it was excluded from
    // the frame allocator and is covered by the identity map.
    let bytes =
        unsafe { core::slice::from_raw_parts(payload.start as *const u8, payload.size() as usize) };
    passthrough::plan_payload(dtb, platform, bytes)
}

/// Starts every CPU of the device tree but the boot CPU and merges the
/// features of each one that comes online into `system`; returns how many CPUs
/// are online in total. A CPU that parks as rejected is reported, and its slot
/// goes to the next CPU.
fn start_secondaries(platform: &Platform, boot_mpidr: u64, system: &mut SystemFeatures) -> usize {
    let mut online = 1;
    let mut index = 1;
    for &mpidr in &platform.cpus {
        if mpidr == boot_mpidr {
            continue;
        }
        if index >= MAX_CPUS {
            log::warn!("CPU {mpidr:#x} not started: the hypervisor drives at most {MAX_CPUS} CPUs");
            continue;
        }
        let slot = percpu::prepare(index, mpidr);
        let boot = percpu::SecondaryBoot {
            stack_top: percpu::stack_top(index),
            mair: crate::read_sysreg!(mair_el2),
            tcr: crate::read_sysreg!(tcr_el2),
            ttbr0: memory::stage1_root(),
            sctlr: crate::read_sysreg!(sctlr_el2),
            percpu: slot as *const _ as u64,
        };
        // SAFETY: the slot's boot block is written only here, before its CPU
        // starts; nothing else reads it concurrently.
        unsafe { *slot.boot.get() = boot };
        sysreg::clean_dcache_to_poc(
            slot.boot.get() as usize,
            core::mem::size_of::<percpu::SecondaryBoot>(),
        );
        let entry = crate::arch::boot::entry::secondary_entry as *const () as u64;
        match firmware::cpu_on(mpidr, entry, slot.boot.get() as u64) {
            Ok(()) => {
                let mut spins = 0u64;
                let arrived =
                    || slot.online.load(Ordering::Acquire) || slot.rejected.load(Ordering::Acquire);
                while !arrived() && spins < 100_000_000 {
                    core::hint::spin_loop();
                    spins += 1;
                }
                let features = *slot.features.lock();
                if slot.online.load(Ordering::Acquire) {
                    match features.map(|f| system.admit(f)) {
                        Some(Ok(())) => {}
                        Some(Err(e)) => log::error!(
                            "CPU {mpidr:#x} came online although it lacks {e}; the system relies on it"
                        ),
                        None => log::error!("CPU {mpidr:#x} came online without its features"),
                    }
                    online += 1;
                    index += 1;
                } else if slot.rejected.load(Ordering::Acquire) {
                    let why = match features.map(|f| SystemFeatures::check(&system.required(), &f))
                    {
                        Some(Err(e)) => alloc::format!("{e}"),
                        _ => alloc::string::String::from("its features were not recorded"),
                    };
                    log::warn!(
                        "CPU {mpidr:#x} left offline: it lacks what the system relies on ({why})"
                    );
                } else {
                    log::warn!("CPU {mpidr:#x} accepted CPU_ON but never came online");
                }
            }
            Err(e) => log::warn!("CPU_ON for CPU {mpidr:#x} failed: {e:?}"),
        }
    }
    online
}

/// LPIs in the host's pool (`arch::drivers::its`): every LPI its property
/// table covers.
const HOST_LPI_POOL: u32 = crate::drivers::its::PROPERTY_TABLE_BYTES as u32;

/// This CPU's LPIs and ITS collection, when the host ITS is up.
fn its_cpu_init(index: usize) {
    let Some(rd) = crate::arch::drivers::its::base().and_then(|_| gic::redistributor(index)) else {
        return;
    };
    if let Err(e) = crate::arch::drivers::its::init_cpu(index, rd) {
        log::warn!("CPU {index}: host LPIs: {e}");
    }
}

/// Entry of a secondary CPU, with the MMU on and `TPIDR_EL2` set.
#[unsafe(no_mangle)]
extern "C" fn secondary_main() -> ! {
    exceptions::install_vectors();
    let cpu = percpu::current();
    let features = local_features();
    *cpu.features.lock() = Some(features);
    *cpu.vector_lengths.lock() = crate::arch::vcpu::measure_lengths(&features);
    let covered = REQUIRED
        .get()
        .is_some_and(|required| features.covers(required));
    if !covered {
        park_rejected(&cpu.rejected);
    }
    if features.gic_sysregs {
        // SAFETY: as on the boot CPU: enables the GIC system-register interface.
        unsafe { crate::write_sysreg!(icc_sre_el2, crate::sysreg_values::ICC_SRE_EL2_VALUE) };
        sysreg::isb();
        match gic::init_cpu(cpu.index()) {
            Ok(()) => its_cpu_init(cpu.index()),
            Err(e) => log::warn!("CPU {}: GICv3 CPU interface: {e:?}", cpu.index()),
        }
    } else if gic::HOST_GIC.is_v2()
        && let Err(e) = gic::init_cpu(cpu.index())
    {
        log::warn!("CPU {}: GICv2 CPU interface: {e:?}", cpu.index());
    }
    cpu.online.store(true, Ordering::Release);
    run::run_secondary_cpu(cpu.index())
}

/// Parks a secondary CPU that the system cannot use: masks its interrupts,
/// raises `rejected` (release: its features are visible first) and waits for
/// events forever, using no stack or memory after the flag, since the boot CPU
/// then hands its slot and stack to the next CPU.
fn park_rejected(rejected: &core::sync::atomic::AtomicBool) -> ! {
    // SAFETY: the store-release writes 1 to the AtomicBool (a byte holding 0 or
    // 1); afterwards the CPU only executes WFE in a loop with interrupts
    // masked, touching no memory, so reusing its stack and slot is harmless.
    unsafe {
        core::arch::asm!(
            "msr daifset, #0xf",
            "stlrb {one:w}, [{flag}]",
            "2: wfe",
            "b 2b",
            flag = in(reg) rejected.as_ptr(),
            one = in(reg) 1u32,
            options(noreturn, nostack)
        )
    }
}

/// Entered instead of `primary_main` when the image does not run at EL2: says
/// so on the console and stops (powering off where the firmware allows).
#[unsafe(no_mangle)]
extern "C" fn wrong_el_main(dtb: usize, current_el: u64) -> ! {
    memory::init_boot_heap();
    // SAFETY: the boot protocol passes a device tree in x0.
    let size = unsafe { dtb_total_size(dtb) };
    // SAFETY: as above.
    let bytes = unsafe { core::slice::from_raw_parts(dtb as *const u8, size) };
    let Ok(platform) = Platform::from_dtb(bytes) else {
        firmware::halt()
    };
    // SAFETY: the device tree names this UART, of this kind, as the console;
    // the MMU is off, so its registers are accessed as device memory.
    unsafe { console::init(platform.uart.start as usize, platform.uart_kind) };
    log::error!(
        "entered at EL{current_el}, but the hypervisor must be started at EL2 \
         (QEMU: -machine virt,virtualization=on); stopping"
    );
    if current_el == 1 {
        firmware::set_conduit(platform.psci);
        firmware::system_off();
    }
    firmware::halt()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(l) => console::write_panic_line(format_args!(
            "[hv] PANIC: {} ({}:{})",
            info.message(),
            l.file(),
            l.line()
        )),
        None => console::write_panic_line(format_args!("[hv] PANIC: {}", info.message())),
    }
    firmware::system_off()
}
