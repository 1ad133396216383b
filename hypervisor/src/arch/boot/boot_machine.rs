//! The boot sequence's machine at EL2: [`El2Boot`] implements
//! `runtime::boot_sequence::BootMachine` with the console, the firmware's
//! PSCI calls, the memory setup, this CPU's ID registers and GIC system
//! registers, the GIC and ITS drivers, the host disks, and the start of a
//! secondary CPU (its boot block written and cleaned to the point of
//! coherency, `CPU_ON`, then a bounded spin until its slot says online or
//! rejected). Every decision is the portable sequence's.

use super::{REQUIRED, entry, firmware, memory};
use crate::arch::cpu::features::local_features;
use crate::arch::cpu::percpu::{self, MAX_CPUS};
use crate::arch::cpu::sysreg;
use crate::arch::drivers::{gic, its};
use crate::devices::vgic::ListRegisters;
use crate::drivers::gic::driver::GicError;
use crate::drivers::uart::console;
use crate::platform::cpu_features::CpuFeatures;
use crate::platform::ranges::PhysRange;
use crate::platform::virtio_mmio::VirtioMmioWindow;
use crate::platform::{Gicv2, Gicv3, Platform, PsciConduit};
use crate::runtime::boot_sequence::{Arrival, BootMachine};
use aarch64_cpu::registers::ICH_VTR_EL2;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;
use smccc::psci;

/// The boot sequence's machine at EL2 (`runtime::boot_sequence`).
pub struct El2Boot;

impl BootMachine for El2Boot {
    type ItsError = its::ItsError;

    fn start_console(&self, platform: &Platform) {
        // SAFETY: the device tree names this UART, of this kind, as the
        // console; the early map covers all of the low 512 GiB as device
        // memory outside RAM.
        unsafe { console::init(platform.uart.start as usize, platform.uart_kind) };
    }

    fn set_psci_conduit(&self, conduit: PsciConduit) {
        firmware::set_conduit(conduit);
    }

    fn image_range(&self) -> PhysRange {
        memory::image_range()
    }

    fn init_memory(
        &self,
        platform: &Platform,
        in_use: Vec<PhysRange>,
        devices: &[PhysRange],
    ) -> u64 {
        match memory::init(platform, in_use, devices) {
            Ok(summary) => summary.free_bytes,
            Err(e) => panic!("memory setup failed: {e}"),
        }
    }

    fn mark_boot_cpu_online(&self) {
        percpu::slot(0).online.store(true, Ordering::Release);
    }

    fn local_features(&self) -> CpuFeatures {
        local_features()
    }

    fn enable_memory_tagging(&self) {
        crate::arch::cpu::memory_tagging::enable();
    }

    fn record_boot_features(&self, features: &CpuFeatures) {
        *percpu::slot(0).features.lock() = Some(*features);
        *percpu::slot(0).vector_lengths.lock() = crate::arch::vcpu::measure_lengths(features);
    }

    fn publish_required(&self, required: CpuFeatures) {
        REQUIRED.call_once(|| required);
    }

    fn enable_gic_sysregs(&self) {
        // SAFETY: enabling the system-register interface at EL2 (SRE) and
        // allowing EL1 to use it (Enable) changes no memory; this CPU's GIC
        // interface is not in use yet.
        unsafe { crate::write_sysreg!(icc_sre_el2, crate::sysreg_values::ICC_SRE_EL2_VALUE) };
        sysreg::isb();
    }

    fn ich_list_registers(&self) -> u64 {
        crate::read_sysreg!(ich_vtr_el2, ICH_VTR_EL2).read(ICH_VTR_EL2::ListRegs) + 1
    }

    fn psci_version(&self) -> Result<psci::Version, psci::error::Error> {
        firmware::version()
    }

    fn payload(&self, range: PhysRange) -> &[u8] {
        // SAFETY: the boot loader placed the payload there; it was excluded
        // from the frame allocator and is covered by the identity map.
        unsafe { core::slice::from_raw_parts(range.start as *const u8, range.size() as usize) }
    }

    fn virtio_transport_empty(&self, base: u64) -> bool {
        // SAFETY: `base` is a virtio-mmio window of the device tree, which
        // `memory::init` mapped as device memory at EL2; reading the magic
        // and DeviceID registers has no side effect.
        let (magic, device_id) = unsafe {
            (
                core::ptr::read_volatile(base as *const u32),
                core::ptr::read_volatile((base + 8) as *const u32),
            )
        };
        magic == 0x7472_6976 && device_id == 0
    }

    fn probe_host_disks(&self, windows: &[VirtioMmioWindow]) {
        crate::arch::host_disk::probe(windows);
    }

    fn init_gicv3(&self, gic: &Gicv3, timers: [u32; 2], uart_intid: Option<u32>, boot_mpidr: u64) {
        gic::init_distributor(gic, timers, uart_intid, boot_mpidr);
    }

    fn init_gicv2(&self, host_gic: &Gicv2, timers: [u32; 2], uart_intid: Option<u32>) -> bool {
        gic::init_gicv2(host_gic, timers, uart_intid)
    }

    fn gic_is_v2(&self) -> bool {
        gic::HOST_GIC.is_v2()
    }

    fn init_gic_cpu(&self, index: usize) -> Result<(), GicError> {
        gic::init_cpu(index)
    }

    fn enable_uart_receive_interrupt(&self) {
        console::enable_receive_interrupt();
    }

    fn init_its(&self, frames: PhysRange, pool: u32) -> Result<u32, its::ItsError> {
        let memory = its::Frames {
            alloc: memory::alloc_frames,
            free: memory::free_frames,
        };
        its::init(frames, pool, memory)
    }

    fn init_its_cpu(&self, index: usize) {
        let Some(rd) = its::base().and_then(|_| gic::redistributor(index)) else {
            return;
        };
        if let Err(e) = its::init_cpu(index, rd) {
            log::warn!("CPU {index}: host LPIs: {e}");
        }
    }

    fn max_cpus(&self) -> usize {
        MAX_CPUS
    }

    fn start_secondary(&self, index: usize, mpidr: u64) -> Result<Arrival, psci::error::Error> {
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
        let size = core::mem::size_of::<percpu::SecondaryBoot>();
        sysreg::clean_dcache_to_poc(slot.boot.get() as usize, size);
        let entry = entry::secondary_entry as *const () as u64;
        firmware::cpu_on(mpidr, entry, slot.boot.get() as u64)?;
        let mut spins = 0u64;
        let arrived =
            || slot.online.load(Ordering::Acquire) || slot.rejected.load(Ordering::Acquire);
        while !arrived() && spins < 100_000_000 {
            core::hint::spin_loop();
            spins += 1;
        }
        let features = *slot.features.lock();
        Ok(if slot.online.load(Ordering::Acquire) {
            Arrival::Online(features)
        } else if slot.rejected.load(Ordering::Acquire) {
            Arrival::Rejected(features)
        } else {
            Arrival::NeverArrived
        })
    }

    fn gich_list_registers(&self) -> Option<usize> {
        gic::list_registers(false).map(|lrs| lrs.count())
    }
}
