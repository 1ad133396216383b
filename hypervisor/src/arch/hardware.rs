//! The machine as the VM runtime sees it: [`El2`] implements
//! `runtime::Hardware` with the frame allocator, the cache and TLB
//! instructions, the system counter, the GIC's kick SGI, the host ITS (passed
//! PCIe devices' MSIs), the host console and the firmware's power calls. [`Vm`] and [`VmTable`] are the runtime's
//! types on this machine.

use crate::arch::boot::firmware;
use crate::arch::boot::memory;
use crate::arch::cpu::{memory_tagging, percpu, sysreg};
use crate::arch::drivers::gic;
use crate::arch::stage2::FrameMemory;
use crate::devices::vgic::LockWait;
use crate::drivers::uart::console;
use crate::read_sysreg;
use crate::runtime::Hardware;
use crate::runtime::host_console::HostConsole;
use crate::stage2::cache_maint::{CacheCaps, IcacheInval};
use crate::vm::counters::VmCounters;
use crate::vm::vcpu_state::VectorLengths;
use tlb::{Aarch64Tlb, TlbCaps};

/// The machine the hypervisor runs on, at EL2.
pub struct El2;

/// The one machine.
pub static EL2: El2 = El2;

/// The console of this machine (`arch::host_console` is what it needs of
/// the machine).
pub static HOST_CONSOLE: HostConsole<El2> = HostConsole::new();

/// A VM on this machine.
pub type Vm = crate::runtime::vm_instance::Vm<El2>;
/// The VM table of this machine.
pub type VmTable = crate::runtime::vm_table::VmTable<El2>;

/// A CPU waiting for a VM's vgic lock sleeps in `WFI` (`gic::wait_for_wakeup`), and the
/// releaser wakes it with a kick (and an event, for a CPU whose GIC is not up yet).
impl LockWait for El2 {
    fn sleeper_cpu(&self) -> usize {
        percpu::current().index()
    }

    fn sleep(&self) {
        gic::wait_for_wakeup();
    }

    fn wake(&self, cpu: usize) {
        sysreg::send_event();
        gic::HOST_GIC.kick(cpu);
    }

    fn ticks(&self) -> u64 {
        read_sysreg!(cntpct_el0)
    }
}

impl Hardware for El2 {
    /// The host's virtio-mmio disks, probed at boot (`arch::host_disk`).
    fn host_disk(
        &self,
        index: u32,
    ) -> Option<&'static dyn crate::devices::virtio::block_backend::BlockBackend> {
        crate::arch::host_disk::host_disk(index as usize)
    }

    fn passthrough_spi_setup(&self, intid: u32, edge: bool, cpu: usize) {
        gic::HOST_GIC.setup_spi(intid, edge, cpu);
    }

    fn passthrough_spi_route(&self, intid: u32, cpu: usize) {
        gic::HOST_GIC.route_spi(intid, cpu);
    }

    fn passthrough_spi_deactivate(&self, intid: u32) {
        gic::HOST_GIC.clear_spi_active(intid);
    }

    fn passthrough_spi_release(&self, intid: u32) {
        gic::HOST_GIC.release_spi(intid);
    }

    fn host_its_base(&self) -> Option<u64> {
        crate::arch::drivers::its::base()
    }

    fn msi_map_device(&self, device: u32, events: u32, cpu: usize) -> Option<u32> {
        crate::arch::drivers::its::map_device(device, events, cpu)
    }

    fn msi_unmap_device(&self, device: u32, first: u32, events: u32) {
        crate::arch::drivers::its::unmap_device(device, first, events);
    }

    fn device_read(&self, pa: u64, size: u8) -> u64 {
        // SAFETY: `pa` is inside a passed device's window (the VM's MMIO bus
        // holds only those), which the early EL2 map covers as device
        // memory, and the access is naturally sized.
        unsafe {
            match size {
                1 => u64::from(core::ptr::read_volatile(pa as *const u8)),
                2 => u64::from(core::ptr::read_volatile(pa as *const u16)),
                4 => u64::from(core::ptr::read_volatile(pa as *const u32)),
                _ => core::ptr::read_volatile(pa as *const u64),
            }
        }
    }

    fn device_write(&self, pa: u64, size: u8, value: u64) {
        // SAFETY: as in `device_read`.
        unsafe {
            match size {
                1 => core::ptr::write_volatile(pa as *mut u8, value as u8),
                2 => core::ptr::write_volatile(pa as *mut u16, value as u16),
                4 => core::ptr::write_volatile(pa as *mut u32, value as u32),
                _ => core::ptr::write_volatile(pa as *mut u64, value),
            }
        }
    }

    type TableMemory = FrameMemory;
    type Tlb = Aarch64Tlb;

    fn alloc_frames(&self, size: u64, align: u64) -> Option<u64> {
        memory::alloc_frames(size, align)
    }

    fn free_frames(&self, pa: u64, size: u64, align: u64) {
        memory::free_frames(pa, size, align);
    }

    fn zero_memory(&self, addr: usize, len: usize) {
        sysreg::zero_memory(addr, len);
    }

    fn copy_tags(&self, from: usize, to: usize, len: usize) {
        // A VM has memory tagging only where the host has it on.
        if memory_tagging::enabled() {
            memory_tagging::copy_tags(from, to, len);
        }
    }

    fn tags_equal(&self, a: usize, b: usize, len: usize) -> bool {
        !memory_tagging::enabled() || memory_tagging::tags_equal(a, b, len)
    }

    fn table_memory(&self) -> FrameMemory {
        FrameMemory::TABLES
    }

    fn guest_table_memory(&self, caps: CacheCaps, counters: &'static VmCounters) -> FrameMemory {
        FrameMemory::for_guest(caps, counters)
    }

    fn tlb(&self, caps: TlbCaps) -> Aarch64Tlb {
        Aarch64Tlb::new(caps)
    }

    fn cache_caps(&self) -> CacheCaps {
        CacheCaps::from_ctr(read_sysreg!(ctr_el0))
    }

    fn clean_inval_dcache_to_poc(&self, addr: usize, len: usize) {
        sysreg::clean_inval_dcache_to_poc(addr, len, self.cache_caps().dline);
    }

    fn make_executable(&self, addr: usize, len: usize) {
        let caps = self.cache_caps();
        let plan = caps.icache_plan();
        if plan.clean_to_pou {
            sysreg::clean_dcache_to_pou(addr, len, caps.dline);
        }
        match plan.invalidate {
            IcacheInval::None => {}
            IcacheInval::ByAddress => sysreg::invalidate_icache_range(addr, len, caps.iline),
            IcacheInval::All => sysreg::invalidate_icache_all(),
        }
    }

    fn invalidate_icache_all(&self) {
        sysreg::invalidate_icache_all();
    }

    fn counter_ticks(&self) -> u64 {
        read_sysreg!(cntpct_el0)
    }

    fn counter_frequency(&self) -> u64 {
        read_sysreg!(cntfrq_el0)
    }

    fn kick(&self, cpu: usize) {
        gic::HOST_GIC.kick(cpu);
    }

    fn send_event(&self) {
        sysreg::send_event();
    }

    fn wait_for_wakeup(&self) {
        gic::wait_for_wakeup();
    }

    fn gic_is_v2(&self) -> bool {
        gic::HOST_GIC.is_v2()
    }

    fn vector_lengths(&self) -> VectorLengths {
        *percpu::current().vector_lengths.lock()
    }

    fn guest_output(&self, vm: usize, byte: u8) {
        HOST_CONSOLE.guest_output(self, vm, byte);
    }

    fn guest_output_bytes(&self, vm: usize, bytes: &[u8]) {
        HOST_CONSOLE.guest_output_bytes(self, vm, bytes);
    }

    fn flush_guest_line(&self, vm: usize) {
        HOST_CONSOLE.flush_vm(self, vm);
    }

    fn write_line(&self, args: core::fmt::Arguments<'_>) {
        console::write_line(args);
    }

    fn system_off(&self) {
        firmware::system_off()
    }

    fn system_reset(&self) -> ! {
        firmware::system_reset()
    }

    fn park(&self) -> ! {
        HOST_CONSOLE.park(&EL2)
    }
}
