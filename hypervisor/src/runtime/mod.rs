//! The VM runtime: the VMs of the boot payload as live objects and what is
//! done to them from outside their vCPUs, built and tested on the host.
//!
//! - [`vm_instance`]: one running VM ([`vm_instance::Vm`]) and its creation
//!   from the boot payload ([`vm_instance::create_vm`]).
//! - [`vm_table`]: the table of VMs, which (VM, vCPU) each CPU runs, and how
//!   many VMs still run.
//! - [`vm_ops`]: pause, resume, stop, memslot changes and guest memory
//!   copies from outside a VM.
//! - [`dirty_log`]: dirty logging of a memslot (enable, collect, disable).
//! - [`live_migration`]: pre-copy live migration of a VM into a waiting one
//!   (the plan is `vm::migration_plan`).
//! - [`restart`]: rebuilding a VM in place.
//! - [`vcpu`]: a vCPU on its CPU: the run loop and exit handling (aborts,
//!   system registers, interrupts, injection, the pause) over the trait
//!   [`vcpu::VcpuMachine`] for the CPU's registers and host GIC.
//! - [`cpu_start`]: what each CPU does after boot: the boot CPU creates the
//!   VMs and starts every VM's vCPU 0, every CPU runs its vCPU (over
//!   [`cpu_start::CpuStart`]).
//! - [`vcpu_cycle`]: one vCPU's life on its CPU: running on `CPU_ON`,
//!   acting on how each run ended, halting and restarting its VM.
//! - [`monitor_target`]: the console monitor's machine and the VMs'
//!   console input over the VM table.
//! - [`host_memory_map`]: which RAM the hypervisor allocates from and how
//!   its EL2 map covers RAM and devices, planned at boot.
//! - [`host_console`]: the one console on a machine: its lock, its
//!   terminal, the console CPU's poll timer and typed bytes, and parked
//!   CPUs (over [`host_console::ConsoleMachine`]).
//! - [`control_target`]: the control interface's calls over the VM table.
//! - [`device_access`]: a vCPU's emulated UART and virtual GIC accesses
//!   over the trait [`device_access::AccessingVcpu`].
//! - [`guest_call`]: a vCPU's hypervisor and secure-monitor calls (PSCI,
//!   the control interface, test reports) over the trait
//!   [`guest_call::CallingVcpu`] for the calling vCPU's registers.
//! - [`passed_devices`]: the host devices a VM owns, running: their
//!   physical SPIs (delivery, routes following the guest's, deactivation,
//!   release) and their forwarded windows.
//! - [`boot_info`]: what the boot CPU learned about the machine.
//! - [`boot_sequence`]: the boot sequence's decisions on the boot CPU and
//!   the secondaries (console, memory, features, banner, host GIC,
//!   secondary CPUs) over the trait [`boot_sequence::BootMachine`].
//! - [`virtio_devices`]: a VM's virtio-mmio devices (which, where, their
//!   models behind their locks; a disk is a `devices::virtio::disk_window`
//!   of a host disk), [`device_hub`]: the machine's network switch and the VMs its
//!   ports belong to, [`virtio_io`]: data through the devices (effects,
//!   output drained, frames delivered, typed bytes), [`control_port`]: a
//!   control VM's virtio-console port to the monitor, [`virtio_report`]:
//!   the monitor's `devices VM` lines, [`collector_handles`]: a vCPU's
//!   handles on other VMs' epoch collectors, registered once each (for
//!   the frames it delivers into them).
//!
//! Everything here reaches the machine only through the trait
//! [`Hardware`] (frames, cache and TLB maintenance, the system counter,
//! kicks, the console, power), which `arch` implements at EL2 and the
//! host tests implement with a fake machine over host memory
//! (`runtime::tests`). A host physical address here is a pointer of the
//! hypervisor's identity map; the fake hands out addresses of host
//! allocations, so copies and comparisons run unchanged on the host.
//!
//! # Dependency order
//!
//! `boot_info` (a leaf) -> `vm_instance` -> `vm_ops`, `vm_table` ->
//! `dirty_log` -> `restart`, `live_migration` -> `vcpu_cycle`,
//! `monitor_target` -> `host_console`, `control_target`; `guest_call`, `device_access`,
//! `passed_devices` (over `vm_instance`) -> `vcpu` (over those and
//! `vcpu_cycle`, `live_migration`) -> `cpu_start` (over `vm_table`, `vcpu`,
//! `vcpu_cycle`).

pub mod boot_info;
pub mod boot_sequence;
pub mod collector_handles;
pub mod control_port;
pub mod control_target;
pub mod cpu_start;
pub mod device_access;
pub mod device_hub;
pub mod dirty_log;
pub mod guest_call;
pub mod host_console;
pub mod host_memory_map;
pub mod live_migration;
pub mod monitor_target;
pub mod passed_devices;
pub mod restart;
pub mod slot_memory;
pub mod vcpu;
pub mod vcpu_cycle;
pub mod virtio_devices;
pub mod virtio_io;
pub mod virtio_report;
pub mod vm_instance;
pub mod vm_ops;
pub mod vm_table;

#[cfg(test)]
mod tests;

use crate::devices::vgic::LockWait;
use crate::devices::virtio::block_backend::BlockBackend;
use crate::stage2::cache_maint::CacheCaps;
use crate::vm::counters::VmCounters;
use crate::vm::vcpu_state::VectorLengths;
use pgtable::PageTableMemory;
use tlb::TlbInvalidate;

/// What the VM runtime needs of the machine. `arch` implements it with the
/// frame allocator, system registers, the GIC and the host console; the
/// host tests with a fake that records what it is asked.
pub trait Hardware: Sync + 'static + LockWait {
    /// The page provider of a VM's stage-2 table (and of page caches).
    type TableMemory: PageTableMemory + Copy + Send + Sync + 'static;
    /// The TLB maintenance backend of a VM's stage 2.
    type Tlb: TlbInvalidate + Send + Sync + 'static;

    /// `size` bytes of host frames aligned to `align`, not zeroed; `None`
    /// when the memory is exhausted.
    fn alloc_frames(&self, size: u64, align: u64) -> Option<u64>;
    /// Gives back frames from [`Hardware::alloc_frames`] with the same size
    /// and alignment.
    fn free_frames(&self, pa: u64, size: u64, align: u64);
    /// Zeroes `len` bytes of host memory at `addr`, and on a host with
    /// memory tagging their allocation tags: a page reaches a guest with
    /// neither the data nor the tags of an earlier owner.
    fn zero_memory(&self, addr: usize, len: usize);
    /// Copies the allocation tags of `len` bytes (whole pages) at `from` to
    /// `to`; only asked for VMs with memory tagging.
    fn copy_tags(&self, from: usize, to: usize, len: usize);
    /// Whether `len` bytes (whole pages) at `a` and `b` carry the same
    /// allocation tags; only asked for VMs with memory tagging.
    fn tags_equal(&self, a: usize, b: usize, len: usize) -> bool;
    /// Table pages only, without guest cache maintenance (to fill page
    /// caches).
    fn table_memory(&self) -> Self::TableMemory;
    /// The page provider of a VM's stage 2, which runs the guest cache
    /// maintenance `caps` requires when stage 2 cannot force write-back,
    /// counted in `counters`.
    fn guest_table_memory(
        &self,
        caps: CacheCaps,
        counters: &'static VmCounters,
    ) -> Self::TableMemory;
    /// A TLB backend with the capabilities every CPU has.
    fn tlb(&self, caps: tlb::TlbCaps) -> Self::Tlb;

    /// The cache geometry (`CTR_EL0`).
    fn cache_caps(&self) -> CacheCaps;
    /// Cleans and invalidates `len` bytes at `addr` to the point of
    /// coherency.
    fn clean_inval_dcache_to_poc(&self, addr: usize, len: usize);
    /// Makes `len` bytes just written at `addr` visible to instruction
    /// fetches, as `CTR_EL0` requires.
    fn make_executable(&self, addr: usize, len: usize);
    /// Invalidates the whole instruction cache (inner shareable).
    fn invalidate_icache_all(&self);

    /// The system counter now.
    fn counter_ticks(&self) -> u64;
    /// The system counter's frequency in Hz.
    fn counter_frequency(&self) -> u64;

    /// Sends the kick SGI to physical CPU `cpu`.
    fn kick(&self, cpu: usize);
    /// Wakes CPUs waiting in `WFE`.
    fn send_event(&self);
    /// Waits on the running CPU until another CPU wakes it (a kick or an
    /// event); callers first handle what is already pending.
    fn wait_for_wakeup(&self);
    /// The host GIC is a GICv2.
    fn gic_is_v2(&self) -> bool;
    /// The vector lengths (SVE, SME) of the running CPU.
    fn vector_lengths(&self) -> VectorLengths;

    /// A byte of VM `vm`'s console output.
    fn guest_output(&self, vm: usize, byte: u8);
    /// A run of VM `vm`'s console output (a virtio-console's transmit
    /// chains), kept together: no other output of the VM lands inside it.
    /// The default passes the bytes one by one.
    fn guest_output_bytes(&self, vm: usize, bytes: &[u8]) {
        for &byte in bytes {
            self.guest_output(vm, byte);
        }
    }
    /// Writes out VM `vm`'s unfinished console line.
    fn flush_guest_line(&self, vm: usize);
    /// Writes a whole line to the host console (the `STAT` lines).
    fn write_line(&self, args: core::fmt::Arguments<'_>);
    /// Powers the machine off (the last VM ended). Returns only on a fake.
    fn system_off(&self);
    /// Resets the machine.
    fn system_reset(&self) -> !;
    /// Halts the running CPU for good (its VM is ending elsewhere).
    fn park(&self) -> !;

    /// Host disk `index` (0 is the first disk the runner gave QEMU), which
    /// a VM's virtio-blk serves (`disk=` in its `vm.conf`); `None` when the
    /// machine has no such disk.
    fn host_disk(&self, index: u32) -> Option<&'static dyn BlockBackend>;

    /// Takes physical SPI `intid` of a device passed to a VM: edge
    /// (`edge`) or level, routed to CPU `cpu`, inactive, enabled.
    fn passthrough_spi_setup(&self, intid: u32, edge: bool, cpu: usize);
    /// Routes passed SPI `intid` to CPU `cpu`.
    fn passthrough_spi_route(&self, intid: u32, cpu: usize);
    /// Deactivates passed SPI `intid`, left active for a guest that will
    /// not deactivate it.
    fn passthrough_spi_deactivate(&self, intid: u32);
    /// Disables passed SPI `intid` and clears its active state (its VM
    /// ended).
    fn passthrough_spi_release(&self, intid: u32);
    /// The base of the host's physical ITS when the hypervisor drives it
    /// (passed PCIe devices' MSIs, `crate::vm::msi_shadow`).
    fn host_its_base(&self) -> Option<u64>;
    /// Maps DeviceID `device` on the physical ITS with `events` (a power of
    /// two) events, event `e` to host LPI `first + e` on CPU `cpu`; returns
    /// `first`, `None` when it cannot.
    fn msi_map_device(&self, device: u32, events: u32, cpu: usize) -> Option<u32>;
    /// Unmaps DeviceID `device`, mapped by [`Hardware::msi_map_device`] at
    /// `first` with `events` events, and frees its LPIs.
    fn msi_unmap_device(&self, device: u32, first: u32, events: u32);
    /// A `size`-byte (1, 2, 4 or 8) read of a passed device's register at
    /// physical address `pa`, inside a forwarded window.
    fn device_read(&self, pa: u64, size: u8) -> u64;
    /// A `size`-byte write of `value` to a passed device's register.
    fn device_write(&self, pa: u64, size: u8, value: u64);
}

/// Microseconds from counter value `start` to now on `hw`.
pub fn micros_since<H: Hardware>(hw: &H, start: u64) -> u64 {
    let frequency = hw.counter_frequency().max(1);
    let ticks = hw.counter_ticks().wrapping_sub(start);
    (u128::from(ticks) * 1_000_000 / u128::from(frequency)) as u64
}
