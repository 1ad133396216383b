//! The host's physical ITS at EL2: the machine side of
//! `crate::drivers::its::driver`, which holds and describes the sequences.
//!
//! Here: the driver's `ItsMemory` over the host frame allocator
//! ([`Frames`]) with `DC ZVA` zeroing, volatile writes, `DC CIVAC` cleans
//! and `DSB ISH`; its frames as the GIC's volatile `MmioFrame`; the driver
//! in a static with each CPU's target (its `RDbase` in commands, once its
//! LPIs are on); and the functions the rest of the machine layer calls. A
//! host LPI is acknowledged by the run loop and replayed into the VM by
//! `crate::runtime::passed_devices::deliver_lpi`.

use crate::arch::cpu::percpu::MAX_CPUS;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::gic::MmioFrame;
use crate::drivers::its::driver::{self, ItsMemory, WAIT_POLLS};
use crate::platform::ranges::PhysRange;
use crate::read_sysreg;
use crate::stage2::cache_maint::CacheCaps;
use crate::vm::msi_shadow::LpiPool;
use core::sync::atomic::{AtomicU64, Ordering};
use spin::Once;

pub use crate::drivers::its::driver::{Frames, ItsError};

/// No target yet (`TARGETS`).
const NO_TARGET: u64 = u64::MAX;

impl ItsMemory for Frames {
    fn alloc(&self, size: u64, align: u64) -> Option<u64> {
        (self.alloc)(size, align)
    }

    fn free(&self, pa: u64, size: u64, align: u64) {
        (self.free)(pa, size, align);
    }

    unsafe fn zero(&self, pa: u64, len: u64) {
        sysreg::zero_memory(pa as usize, len as usize);
    }

    unsafe fn fill(&self, pa: u64, len: u64, byte: u8) {
        // SAFETY: the caller's contract: frames the allocator gave, RAM the
        // EL2 map covers and this driver owns.
        unsafe { core::ptr::write_bytes(pa as *mut u8, byte, len as usize) }
    }

    unsafe fn write_command(&self, pa: u64, command: &[u64; 4]) {
        for (i, dw) in command.iter().enumerate() {
            // SAFETY: as in `fill`: a slot of the driver's command ring.
            unsafe { core::ptr::write_volatile((pa + 8 * i as u64) as *mut u64, *dw) };
        }
    }

    fn clean(&self, pa: u64, len: u64) {
        let line = CacheCaps::from_ctr(read_sysreg!(ctr_el0)).dline;
        sysreg::clean_inval_dcache_to_poc(pa as usize, len as usize, line);
    }

    fn dsb_ish(&self) {
        sysreg::dsb_ish();
    }
}

static ITS: Once<driver::HostIts<MmioFrame, Frames, LpiPool>> = Once::new();
/// Each CPU's `RDbase` in commands, once its LPIs are on.
static TARGETS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(NO_TARGET) }; MAX_CPUS];

/// Boot CPU, once: sets up the ITS at `frames` and the host LPI property
/// table for a pool of `pool` LPIs, its memory from `memory`. Returns the
/// DeviceID bits it covers.
pub fn init(frames: PhysRange, pool: u32, memory: Frames) -> Result<u32, ItsError> {
    // SAFETY: the ITS's frame, as the device tree named it.
    let frame = unsafe { MmioFrame::new(frames.start as usize) };
    let its = driver::HostIts::init(frame, memory, pool, MAX_CPUS as u64, WAIT_POLLS)?;
    let bits = its.device_bits();
    ITS.call_once(|| its);
    Ok(bits)
}

/// The ITS's base, once [`init`] succeeded.
pub fn base() -> Option<u64> {
    ITS.get().map(|its| its.frame().base() as u64)
}

/// Every CPU (after its GIC part): LPIs on at its redistributor `rd`, and
/// collection `index` mapped to it.
pub fn init_cpu(index: usize, rd: usize) -> Result<(), ItsError> {
    let its = ITS.get().ok_or(ItsError::NotReady)?;
    // SAFETY: `rd` is this CPU's `RD_base` frame, in the redistributor
    // regions the device tree named.
    let target = its.init_cpu(index as u16, &unsafe { MmioFrame::new(rd) }, rd as u64)?;
    TARGETS[index].store(target, Ordering::Release);
    Ok(())
}

/// Maps DeviceID `device`'s `events` (a power of two) events to a run of
/// host LPIs in CPU `cpu`'s collection: the run's first LPI, or `None` (also
/// when the ITS is not up or the CPU has no LPIs).
pub fn map_device(device: u32, events: u32, cpu: usize) -> Option<u32> {
    let its = ITS.get()?;
    let target = Some(TARGETS.get(cpu)?.load(Ordering::Acquire)).filter(|&t| t != NO_TARGET)?;
    its.map_device(device, events, cpu as u16, target)
}

/// Unmaps DeviceID `device` (mapped by [`map_device`] with LPIs `first..first
/// + events`) and gives its LPIs and ITT back.
pub fn unmap_device(device: u32, first: u32, events: u32) {
    if let Some(its) = ITS.get() {
        let mut targets = TARGETS.iter().map(|t| t.load(Ordering::Acquire));
        let target = targets.find(|&t| t != NO_TARGET).unwrap_or(0);
        its.unmap_device(device, first, events, target);
    }
}
