//! The host GIC a machine drives, whichever version it is: [`DrivenGic`]
//! holds the one driver set up at boot (a [`GicV3`] or a [`GicV2`]) and
//! what each CPU's part of it gave (its redistributor, its affinity, its
//! GICv2 interface mask), and turns the rest of the hypervisor's requests
//! (acknowledge, kick CPU `n`, enable a PPI of CPU `n`, route an SPI to CPU
//! `n`) into the driver's sequences for that version.
//!
//! # Dispatch
//!
//! Each request picks the driver once: the GICv2, when one was set up, else
//! the GICv3, else none. With none every request does nothing (an
//! acknowledge finds nothing pending): a machine whose GIC is not driven
//! runs its guests without interrupts, which boot reports. The choice is a
//! `match` on a two-variant enum of references, so the hot path (the
//! acknowledge and EOI of every host interrupt) stays statically
//! dispatched.
//!
//! # Per CPU
//!
//! A GICv3 reaches a CPU's PPIs through that CPU's redistributor (its
//! `SGI_base` frame), and targets kicks and SPIs by affinity; a GICv2 banks
//! its PPIs per CPU interface, and targets by interface mask. Both are
//! recorded by [`DrivenGic::init_cpu`], which every CPU runs on itself;
//! later requests name the CPU by its logical index.

use super::DEFAULT_MAINTENANCE_INTID;
use super::driver::{
    self as host_driver, Acknowledged, CpuRegisters, GicError, GicFrame, GicV2, GicV3,
    GichListRegisters, HostGic, SpiTarget,
};
use crate::devices::vgic::ListRegisters;
use crate::vocabulary::timers::TimerId;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use spin::Once;

/// The host GIC of a machine with up to `CPUS` CPUs (see the module doc).
pub struct DrivenGic<F, C, const CPUS: usize> {
    v3: Once<GicV3<F, C>>,
    v2: Once<GicV2<F, C>>,
    /// Each CPU's redistributor: its `RD_base` and `SGI_base` frames
    /// (GICv3, once its [`init_cpu`](Self::init_cpu) found it).
    redistributors: [Once<(F, F)>; CPUS],
    /// Each CPU's affinity (`MPIDR_EL1`), as its `init_cpu` was given it.
    affinities: [AtomicU64; CPUS],
    /// Each CPU's GICv2 CPU interface mask (its bit in `ITARGETSR`/`SGIR`).
    interface_masks: [AtomicU8; CPUS],
}

/// The driver that was set up.
#[derive(Clone, Copy)]
enum Driver<'a, F, C> {
    V3(&'a GicV3<F, C>),
    V2(&'a GicV2<F, C>),
}

impl<F: GicFrame, C: CpuRegisters> HostGic for Driver<'_, F, C> {
    #[inline(always)]
    fn acknowledge(&self) -> Acknowledged {
        match self {
            Self::V3(g) => g.acknowledge(),
            Self::V2(g) => g.acknowledge(),
        }
    }

    #[inline(always)]
    fn drop_priority(&self, ack: Acknowledged) {
        match self {
            Self::V3(g) => g.drop_priority(ack),
            Self::V2(g) => g.drop_priority(ack),
        }
    }

    #[inline(always)]
    fn deactivate(&self, ack: Acknowledged) {
        match self {
            Self::V3(g) => g.deactivate(ack),
            Self::V2(g) => g.deactivate(ack),
        }
    }
}

impl<F, C, const CPUS: usize> Default for DrivenGic<F, C, CPUS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F, C, const CPUS: usize> DrivenGic<F, C, CPUS> {
    /// No GIC driven yet.
    pub const fn new() -> Self {
        Self {
            v3: Once::new(),
            v2: Once::new(),
            redistributors: [const { Once::new() }; CPUS],
            affinities: [const { AtomicU64::new(0) }; CPUS],
            interface_masks: [const { AtomicU8::new(0) }; CPUS],
        }
    }
}

impl<F: GicFrame, C: CpuRegisters, const CPUS: usize> DrivenGic<F, C, CPUS> {
    /// Boot CPU, once, after the distributor's set-up: drives `gic`.
    pub fn drive_v3(&self, gic: GicV3<F, C>) {
        self.v3.call_once(|| gic);
    }

    /// Boot CPU, once, after the distributor's set-up: drives `gic`, which
    /// is then chosen over any GICv3.
    pub fn drive_v2(&self, gic: GicV2<F, C>) {
        self.v2.call_once(|| gic);
    }

    #[inline(always)]
    fn driver(&self) -> Option<Driver<'_, F, C>> {
        if let Some(v2) = self.v2.get() {
            return Some(Driver::V2(v2));
        }
        self.v3.get().map(Driver::V3)
    }

    /// The GICv3 driver, when it is the one driven.
    pub fn v3(&self) -> Option<&GicV3<F, C>> {
        match self.driver()? {
            Driver::V3(g) => Some(g),
            Driver::V2(_) => None,
        }
    }

    /// CPU `index` (logical), on itself, with affinity `mpidr`: brings up
    /// its part of the GIC and records how to reach it.
    pub fn init_cpu(&self, index: usize, mpidr: u64) -> Result<(), GicError> {
        self.affinities[index].store(mpidr, Ordering::Release);
        match self.driver().ok_or(GicError::NotInitialised)? {
            Driver::V2(g) => {
                self.interface_masks[index].store(g.init_cpu(), Ordering::Release);
            }
            Driver::V3(g) => {
                let frames = g.init_cpu(mpidr)?;
                self.redistributors[index].call_once(|| frames);
            }
        }
        Ok(())
    }

    /// The `RD_base` frame of CPU `index`'s redistributor (GICv3, once
    /// [`init_cpu`](Self::init_cpu) found it).
    pub fn redistributor(&self, index: usize) -> Option<&F> {
        Some(&self.redistributors.get(index)?.get()?.0)
    }

    /// CPU `index`'s `SGI_base` frame.
    #[inline(always)]
    fn sgi_frame(&self, index: usize) -> Option<&F> {
        Some(&self.redistributors.get(index)?.get()?.1)
    }

    /// Whether a GIC is driven.
    pub fn is_up(&self) -> bool {
        self.driver().is_some()
    }

    /// Whether the driven GIC is a GICv2.
    pub fn is_v2(&self) -> bool {
        self.v2.get().is_some()
    }

    /// The GIC maintenance interrupt (the architecture's default when no
    /// GIC is driven).
    pub fn maintenance_intid(&self) -> u32 {
        match self.driver() {
            Some(Driver::V3(g)) => g.maintenance,
            Some(Driver::V2(g)) => g.maintenance,
            None => DEFAULT_MAINTENANCE_INTID,
        }
    }

    /// The host PPIs of the guest's timers, in [`TimerId::index`] order
    /// (the architecture's when no GIC is driven).
    pub fn timer_intids(&self) -> [u32; 2] {
        match self.driver() {
            Some(Driver::V3(g)) => g.timers,
            Some(Driver::V2(g)) => g.timers,
            None => TimerId::ALL.map(|t| t.host_intid(None)),
        }
    }

    /// Whether guests' binary points are guarded (a GICv3 emulated by QEMU,
    /// `crate::devices::vgic::cpu_interface`).
    pub fn guards_binary_point(&self) -> bool {
        self.v3().is_some_and(|g| g.guard_binary_point)
    }

    /// Acknowledges this CPU's highest-priority pending interrupt; INTID
    /// 1020..=1023 when none (or when no GIC is driven).
    #[inline]
    pub fn acknowledge(&self) -> Acknowledged {
        self.driver()
            .map_or(Acknowledged::NONE, |d| d.acknowledge())
    }

    /// Finishes an acknowledged interrupt (priority drop and deactivation).
    #[inline]
    pub fn end_of_interrupt(&self, ack: Acknowledged) {
        if let Some(d) = self.driver() {
            d.end_of_interrupt(ack);
        }
    }

    /// Only drops the priority of an acknowledged interrupt: it stays
    /// active (a guest timer's PPI, until the guest deactivates it through
    /// a hardware list register, or [`deactivate_timer`](Self::deactivate_timer)).
    #[inline]
    pub fn drop_priority(&self, ack: Acknowledged) {
        if let Some(d) = self.driver() {
            d.drop_priority(ack);
        }
    }

    /// Acknowledges and finishes every interrupt pending for this CPU,
    /// handling none.
    pub fn discard_pending(&self) {
        if let Some(d) = self.driver() {
            host_driver::discard_pending(&d);
        }
    }

    /// Clears the active state of PPI `intid` of CPU `cpu` (this CPU; a
    /// no-op when it is not active).
    #[inline]
    pub fn clear_ppi_active(&self, cpu: usize, intid: u32) {
        match self.driver() {
            Some(Driver::V3(_)) => {
                if let Some(sgi) = self.sgi_frame(cpu) {
                    GicV3::<F, C>::clear_ppi_active(sgi, intid);
                }
            }
            Some(Driver::V2(g)) => g.clear_ppi_active(intid),
            None => {}
        }
    }

    /// Clears the active state of `timer`'s PPI on CPU `cpu` (this CPU):
    /// for an interrupt the guest will not deactivate.
    #[inline]
    pub fn deactivate_timer(&self, cpu: usize, timer: TimerId) {
        if self.is_up() {
            self.clear_ppi_active(cpu, self.timer_intids()[timer.index()]);
        }
    }

    /// Enables (at the hypervisor's priority) or disables PPI `intid` of
    /// CPU `cpu` (this CPU).
    pub fn set_ppi_enabled(&self, cpu: usize, intid: u32, enabled: bool) {
        match self.driver() {
            Some(Driver::V3(_)) => {
                if let Some(sgi) = self.sgi_frame(cpu) {
                    GicV3::<F, C>::set_ppi_enabled(sgi, intid, enabled);
                }
            }
            Some(Driver::V2(g)) => g.set_ppi_enabled(intid, enabled),
            None => {}
        }
    }

    /// Masks (`true`) or unmasks `timer`'s PPI of CPU `cpu` (this CPU).
    pub fn set_timer_masked(&self, cpu: usize, timer: TimerId, masked: bool) {
        if self.is_up() {
            self.set_ppi_enabled(cpu, self.timer_intids()[timer.index()], !masked);
        }
    }

    /// Stops this CPU's interface from signalling interrupts.
    pub fn quiesce(&self) {
        match self.driver() {
            Some(Driver::V3(g)) => g.quiesce(),
            Some(Driver::V2(g)) => g.quiesce(),
            None => {}
        }
    }

    /// Sends the kick SGI to CPU `index`.
    #[inline]
    pub fn kick(&self, index: usize) {
        match self.driver() {
            Some(Driver::V3(g)) => g.kick(self.affinities[index].load(Ordering::Acquire)),
            Some(Driver::V2(g)) => g.kick(self.interface_masks[index].load(Ordering::Acquire)),
            None => {}
        }
    }

    /// The distributor and how an SPI to CPU `cpu` names it: its affinity
    /// on a GICv3, its interface mask on a GICv2.
    fn spi_target(&self, cpu: usize) -> Option<(&F, SpiTarget)> {
        match self.driver()? {
            Driver::V3(g) => {
                let mpidr = self.affinities[cpu].load(Ordering::Acquire);
                Some((&g.distributor, SpiTarget::Affinity(mpidr)))
            }
            Driver::V2(g) => {
                let mask = self.interface_masks[cpu].load(Ordering::Acquire);
                Some((&g.distributor, SpiTarget::Interfaces(mask)))
            }
        }
    }

    /// The distributor of the driven GIC.
    fn distributor(&self) -> Option<&F> {
        match self.driver()? {
            Driver::V3(g) => Some(&g.distributor),
            Driver::V2(g) => Some(&g.distributor),
        }
    }

    /// Routes SPI `intid` to CPU `cpu`.
    pub fn route_spi(&self, intid: u32, cpu: usize) {
        if let Some((distributor, target)) = self.spi_target(cpu) {
            host_driver::route_spi(distributor, intid, target);
        }
    }

    /// Takes SPI `intid` (a passed-through device's) at EL2, routed to CPU
    /// `cpu` (`host_driver::setup_spi`).
    pub fn setup_spi(&self, intid: u32, edge: bool, cpu: usize) {
        if let Some((distributor, target)) = self.spi_target(cpu) {
            host_driver::setup_spi(distributor, intid, edge, target);
        }
    }

    /// Deactivates SPI `intid` at the distributor (defined from any CPU; a
    /// no-op when it is not active).
    pub fn clear_spi_active(&self, intid: u32) {
        if let Some(distributor) = self.distributor() {
            host_driver::clear_spi_active(distributor, intid);
        }
    }

    /// Disables SPI `intid` and clears its active state: its VM ended.
    pub fn release_spi(&self, intid: u32) {
        if let Some(distributor) = self.distributor() {
            host_driver::release_spi(distributor, intid);
        }
    }

    /// A GICv2's list registers (the `GICH` frame), when that is the GIC
    /// driven.
    pub fn gich_list_registers(&self) -> Option<GichListRegisters<F>> {
        self.v2.get().map(|g| g.list_registers())
    }

    /// Resets a GICv2's virtual CPU interface (`false`: not a GICv2; a
    /// GICv3's is reset through the system registers).
    pub fn reset_gicv2_virtual_interface(&self) -> bool {
        self.v2.get().map(|g| g.reset_virtual_interface()).is_some()
    }
}

/// This CPU's list registers on either kind of host GIC: a GICv3's system
/// registers (`S`) or a GICv2's `GICH` frame (`G`).
#[derive(Debug)]
pub enum HostListRegisters<S, G> {
    /// `ICH_LR<n>_EL2` and friends.
    V3(S),
    /// The `GICH` frame.
    V2(G),
}

impl<S: ListRegisters, G: ListRegisters> ListRegisters for HostListRegisters<S, G> {
    fn count(&self) -> usize {
        match self {
            Self::V3(l) => l.count(),
            Self::V2(l) => l.count(),
        }
    }

    fn read_lr(&self, index: usize) -> u64 {
        match self {
            Self::V3(l) => l.read_lr(index),
            Self::V2(l) => l.read_lr(index),
        }
    }

    fn write_lr(&mut self, index: usize, value: u64) {
        match self {
            Self::V3(l) => l.write_lr(index, value),
            Self::V2(l) => l.write_lr(index, value),
        }
    }

    fn read_hcr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_hcr(),
            Self::V2(l) => l.read_hcr(),
        }
    }

    fn write_hcr(&mut self, value: u64) {
        match self {
            Self::V3(l) => l.write_hcr(value),
            Self::V2(l) => l.write_hcr(value),
        }
    }

    fn read_misr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_misr(),
            Self::V2(l) => l.read_misr(),
        }
    }

    fn read_elrsr(&self) -> u64 {
        match self {
            Self::V3(l) => l.read_elrsr(),
            Self::V2(l) => l.read_elrsr(),
        }
    }
}
