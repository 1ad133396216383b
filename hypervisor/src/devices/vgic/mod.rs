//! Virtual GICv3 and GICv2: emulated distributor and redistributors,
//! injection through the list registers.
//!
//! One interrupt model serves both. A GICv2 guest ([`VgicVersion::V2`],
//! module `distributor_v2`) sees one distributor frame whose private
//! registers are banked by the accessing vCPU, SPIs routed by `ITARGETSR`,
//! SGIs sent through `GICD_SGIR` and pending per source CPU, and the
//! hardware's `GICV` frame as its CPU interface (mapped at stage 2, no trap).
//! The list registers are the same model values on both; a GICv2 host
//! converts them to `GICH_LR` ([`LrEncoding`]). The rest of this text
//! describes the GICv3 front end; fold, fill and maintenance are the same.
//!
//! The guest sees a GICv3 with one security state (`GICD_CTLR.DS` = 1),
//! affinity routing always on (`ARE` reads as one) and, when the VM has one
//! ([`VgicState::enable_its`]), an ITS and LPIs (modules [`its`] and
//! [`lpi`]). Its
//! CPU interface is the hardware's virtual CPU interface (`ICV_*` registers);
//! only the distributor and redistributor frames are emulated, on stage-2
//! data aborts, and only the SGI generation registers are trapped.
//!
//! # Shape
//!
//! [`VgicState`] holds everything: the distributor (`GICD_CTLR` and the SPIs
//! with their routes) and, for each vCPU, its redistributor (`GICR_WAKER` and
//! the 32 private interrupts) and a record of what its list registers hold.
//! Each interrupt is an [`irq`] state: group, enable, priority, trigger, a
//! pending latch, a line level and an active bit. The pending interrupts of a
//! vCPU are not kept in a separate queue: the fill step scans the vCPU's 32
//! private interrupts and the SPIs routed to it (`IROUTER`), so routing and
//! enable changes need no queue maintenance.
//!
//! # Locking
//!
//! One [`spin::Mutex`] per VM ([`Vgic::lock`]) guards the whole
//! [`VgicState`], so a vCPU can pend an SGI or route an SPI to another vCPU's
//! state directly. Every operation is short: one register access, one
//! injection, or one fold/fill of at most 16 list registers plus a scan of
//! `32 + spi_count` interrupts. The physical list registers of a vCPU are only
//! touched by the CPU running it, under the lock, through [`ListRegisters`].
//! No other lock is taken while this one is held.
//!
//! # Kicks
//!
//! Every operation that can make an interrupt deliverable to a vCPU, or can
//! make what a vCPU's list registers hold stale (disable, clear-pending,
//! re-route, priority change), returns a [`VcpuSet`]: the vCPUs that must
//! leave the guest (or wake from WFI) and run [`VgicState::fill`] again. The
//! caller drops the lock, then sends a physical SGI to the CPUs running those
//! vCPUs (its own vCPU needs none: it refills before its next entry).
//!
//! # The vCPU run loop
//!
//! - After an exit: [`VgicState::fold`] copies the list registers back
//!   (an interrupt the guest acknowledged and EOI'd leaves its list register
//!   empty, so its active state clears; pending/active states are copied
//!   back; a level interrupt whose line is still high is pending again).
//!   Folding after every exit is simplest; a run loop may instead fold only
//!   before the vCPU's own GIC register accesses and before each fill, and
//!   skip the fill when the exit changed nothing for this vCPU (no IRQ exit,
//!   no GIC access, no returned [`VcpuSet`] naming it): the other operations
//!   work on unfolded state, since another vCPU's list registers are never
//!   folded while it runs either.
//! - Handle the exit: MMIO in [`VgicConfig`]'s frames goes to
//!   [`VgicState::mmio_read`]/[`VgicState::mmio_write`]; a trapped
//!   `ICC_SGI1R_EL1` to [`VgicState::send_sgi`] ([`SgiGroup::from_sysreg`]
//!   tells the SGI registers apart); a fired timer to
//!   [`VgicState::set_ppi_level`] with [`VTIMER_INTID`] or [`PTIMER_INTID`]
//!   (see `crate::devices::timer`); device lines to
//!   [`VgicState::set_spi_level`]/[`VgicState::inject_spi_edge`]. The
//!   maintenance interrupt (PPI 25) needs no handling beyond the exit itself.
//! - Refresh level sources whose line may have moved while the guest ran
//!   (the timers' `ISTATUS`), then [`VgicState::fill`] before `ERET`:
//!   the interrupts the guest is handling and the pending ones that can
//!   preempt it go to the list registers first, by priority, then the other
//!   pending ones, and interrupts made active through `ISACTIVER` only where
//!   room is left (module `sync`); if pending ones did not fit, maintenance
//!   interrupts (`ICH_HCR_EL2.UIE`, EOI maintenance, `LRENPIE` with
//!   `EOIcount`) ask for the next fill when one could be taken. Level
//!   interrupts (both timers' PPIs among them) are listed with EOI
//!   maintenance so their line is re-sampled after the EOI.
//! - When a vCPU stops running on its CPU (`CPU_OFF`, or another vCPU is
//!   scheduled there): [`VgicState::unload`] folds and empties the list
//!   registers, so the SPIs they held can go to other vCPUs. (`ICH_VMCR_EL2`
//!   and `ICH_AP<n>R<m>_EL2` belong to the vCPU context and are saved and
//!   restored by whoever moves a vCPU between CPUs.)
//! - A trapped WFI may block only while [`VgicState::has_deliverable`] is
//!   false; a kicked vCPU that waits in WFI is woken. (With WFI not trapped,
//!   the hardware does this: a pending virtual interrupt or a physical kick
//!   ends the guest's WFI.)

pub mod cpu_interface;
mod distributor;
mod distributor_v2;
#[cfg(test)]
mod hardware_spi_test;
pub mod irq;
pub mod its;
mod list_register_sync;
pub mod list_regs;
pub mod lpi;
#[cfg(test)]
mod model_test;
mod redistributor;
mod regs;
pub mod sgi;
pub mod sleeping_lock;
mod state;

pub use irq::{IntIdClass, PRIORITY_MASK, PTIMER_INTID, Trigger, VTIMER_INTID};
pub use list_register_sync::FillOutcome;
pub use list_regs::{ListRegister, ListRegisters, LrEncoding, ModelListRegisters};
pub use sgi::{SgiGroup, SgiRequest, SgiTargets};
pub use sleeping_lock::{LockStats, LockWait, SleepingGuard, SleepingMutex};
pub use state::{MAX_VCPUS_V2, VgicConfig, VgicState, VgicVersion};

/// Size of the distributor frame.
pub const DISTRIBUTOR_SIZE: u64 = 0x1_0000;
/// Size of one vCPU's redistributor: `RD_base` then `SGI_base`, 64 KiB each.
pub const REDISTRIBUTOR_STRIDE: u64 = 0x2_0000;
/// Offset of the `SGI_base` frame in a redistributor.
pub const SGI_BASE_OFFSET: u64 = 0x1_0000;
/// Most vCPUs one virtual GIC serves (the width of [`VcpuSet`]).
pub const MAX_VCPUS: usize = 64;
/// Most SPIs (INTIDs 32..=1019).
pub const MAX_SPIS: u32 = 988;

/// A register frame of the virtual GIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The distributor (`GICD_*`).
    Distributor,
    /// A redistributor's `RD_base` frame (`GICR_*` control registers).
    RdBase {
        /// Index of the vCPU it belongs to.
        vcpu: usize,
    },
    /// A redistributor's `SGI_base` frame (SGI and PPI registers).
    SgiBase {
        /// Index of the vCPU it belongs to.
        vcpu: usize,
    },
    /// The ITS's control and translation frames (module [`its`]).
    Its,
}

/// What the virtual GIC refuses or reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VgicError {
    /// No register at this offset. The access was completed as RAZ/WI
    /// (a read returns zero, a write changes nothing); the caller completes
    /// the guest's access that way and may log it.
    UnknownRegister {
        /// The frame accessed.
        frame: Frame,
        /// Offset in the frame.
        offset: u64,
    },
    /// The register exists but not for this access size or alignment
    /// (32-bit registers take 32-bit accesses, priority and target registers
    /// also bytes, 64-bit registers 64-bit accesses or 32-bit halves).
    /// Nothing was done.
    BadAccess {
        /// The frame accessed.
        frame: Frame,
        /// Offset in the frame.
        offset: u64,
        /// Access size in bytes.
        size: u8,
    },
    /// The address is in no frame of this virtual GIC.
    NotInGic {
        /// The guest physical address.
        ipa: u64,
    },
    /// No vCPU with this index.
    NoSuchVcpu(usize),
    /// The INTID is not implemented, or not of the class the call needs
    /// (an SPI where a PPI is expected, an SGI for a line).
    NoSuchInterrupt(u32),
    /// A configuration with no vCPU or more than [`MAX_VCPUS`].
    VcpuCount(usize),
    /// A configuration with more than [`MAX_SPIS`] SPIs.
    SpiCount(u32),
    /// Two vCPUs with the same MPIDR affinity.
    DuplicateAffinity(u64),
    /// A vCPU MPIDR with Aff0 of 16 or more, which an SGI cannot target
    /// without range selectors (`GICD_TYPER.RSS` is 0).
    UnsupportedAffinity(u64),
    /// The frames overlap or are not 64 KiB aligned.
    Layout,
}

impl core::fmt::Display for VgicError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::UnknownRegister { frame, offset } => {
                write!(f, "no register at offset {offset:#x} of {frame:?}")
            }
            Self::BadAccess {
                frame,
                offset,
                size,
            } => write!(
                f,
                "an access of {size} bytes at offset {offset:#x} of {frame:?} fits no register"
            ),
            Self::NotInGic { ipa } => write!(f, "IPA {ipa:#x} is in no frame of the virtual GIC"),
            Self::NoSuchVcpu(vcpu) => write!(f, "no vCPU {vcpu}"),
            Self::NoSuchInterrupt(intid) => {
                write!(f, "INTID {intid} is not implemented or of the wrong class")
            }
            Self::VcpuCount(n) => write!(f, "{n} vCPUs (1 to {MAX_VCPUS} supported)"),
            Self::SpiCount(n) => write!(f, "{n} SPIs (at most {MAX_SPIS} supported)"),
            Self::DuplicateAffinity(mpidr) => {
                write!(f, "two vCPUs with the MPIDR affinity {mpidr:#x}")
            }
            Self::UnsupportedAffinity(mpidr) => write!(
                f,
                "vCPU MPIDR {mpidr:#x} has Aff0 of 16 or more, which an SGI cannot target"
            ),
            Self::Layout => f.write_str("the frames overlap or are not 64 KiB aligned"),
        }
    }
}

impl core::error::Error for VgicError {}

impl VgicError {
    /// Whether the guest's access should complete as RAZ/WI (after logging).
    pub const fn is_raz_wi(&self) -> bool {
        matches!(self, Self::UnknownRegister { .. })
    }
}

/// A set of vCPU indices (bit n = vCPU n).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuSet(pub u64);

impl VcpuSet {
    /// No vCPU.
    pub const EMPTY: Self = Self(0);

    /// Adds vCPU `index` (< [`MAX_VCPUS`]).
    pub fn insert(&mut self, index: usize) {
        self.0 |= 1 << index;
    }

    /// Whether vCPU `index` is in the set.
    pub const fn contains(self, index: usize) -> bool {
        index < MAX_VCPUS && self.0 & (1 << index) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The union of both sets.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The set without vCPU `index` (the caller's own vCPU needs no kick).
    pub const fn without(self, index: usize) -> Self {
        if index < MAX_VCPUS {
            Self(self.0 & !(1 << index))
        } else {
            self
        }
    }

    /// The indices in ascending order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..MAX_VCPUS).filter(move |&index| self.contains(index))
    }
}

/// The virtual GIC of one VM: its state behind one lock, whose waiters
/// sleep once the machine's way to sleep is set ([`Vgic::set_lock_wait`],
/// [`sleeping_lock`]).
#[derive(Debug)]
pub struct Vgic {
    state: SleepingMutex<VgicState>,
    /// What it was created with, for [`Vgic::reset`].
    config: VgicConfig,
}

impl Vgic {
    /// Gives the GIC an ITS at `base` ([`VgicState::enable_its`]); a
    /// [`reset`](Self::reset) keeps it, in its reset state.
    pub fn enable_its(&self, base: u64) -> Result<(), VgicError> {
        self.state.lock().enable_its(base)
    }
}

impl Vgic {
    /// A virtual GIC in its reset state.
    pub fn new(config: VgicConfig) -> Result<Self, VgicError> {
        Ok(Self {
            state: SleepingMutex::new(VgicState::new(config.clone())?),
            config,
        })
    }

    /// A virtual GICv2 in its reset state.
    pub fn new_v2(config: VgicConfig) -> Result<Self, VgicError> {
        Ok(Self {
            state: SleepingMutex::new(VgicState::new_v2(config.clone())?),
            config,
        })
    }

    /// Back to the reset state it was created in (a restart of the VM):
    /// every interrupt disabled, inactive and not pending, priorities,
    /// routes and the distributor's control as at creation.
    /// The links of PPIs and SPIs to physical ones
    /// ([`VgicState::link_hardware_ppi`], [`VgicState::link_hardware_spi`])
    /// stay: they describe the host. The caller deactivates the linked
    /// physical SPIs (none is left active for the guest any more).
    pub fn reset(&self) -> Result<(), VgicError> {
        let mut state = self.state.lock();
        let links = state.hardware_ppis;
        let its = state.its_base();
        let mut spi_links = core::mem::take(&mut state.hardware_spis);
        for link in &mut spi_links {
            link.physical_active = false;
        }
        *state = match state.version() {
            VgicVersion::V2 => VgicState::new_v2(self.config.clone())?,
            VgicVersion::V3 => VgicState::new(self.config.clone())?,
        };
        state.hardware_ppis = links;
        state.hardware_spis = spi_links;
        if let Some(base) = its {
            state.enable_its(base)?;
        }
        Ok(())
    }

    /// Locks the state. Keep the guard for one operation; send the kicks it
    /// returns after dropping it.
    pub fn lock(&self) -> SleepingGuard<'_, VgicState> {
        self.state.lock()
    }

    /// Waiters for the lock sleep with `wait` from now on (the VM's
    /// machine; the first call counts).
    pub fn set_lock_wait(&self, wait: &'static dyn LockWait) {
        self.state.set_wait(wait);
    }

    /// How often the lock was found taken, and the waiting.
    pub fn lock_stats(&self) -> LockStats {
        self.state.stats()
    }
}

/// The MPIDR affinity fields (Aff3 \[39:32\], Aff2 \[23:16\], Aff1 \[15:8\],
/// Aff0 \[7:0\]) of an `MPIDR_EL1` or `GICD_IROUTER` value.
pub const fn affinity_of(mpidr: u64) -> u64 {
    mpidr & 0xff_00ff_ffff
}

#[cfg(test)]
mod reset_tests {
    use super::*;

    fn config() -> VgicConfig {
        VgicConfig {
            distributor_base: 0x0800_0000,
            redistributor_base: 0x080a_0000,
            spi_count: 64,
            vcpu_mpidrs: alloc::vec![0, 1],
        }
    }

    /// `GICD_ISENABLER1`: SPIs 32..64.
    const ISENABLER1: u64 = 0x104;
    /// `GICD_CTLR`.
    const CTLR: u64 = 0;

    fn read(state: &VgicState, offset: u64) -> u64 {
        match state.version() {
            VgicVersion::V2 => state.distributor_v2_read(0, offset, 4).unwrap(),
            VgicVersion::V3 => state.distributor_read(offset, 4).unwrap(),
        }
    }

    fn write(state: &mut VgicState, offset: u64, value: u64) {
        match state.version() {
            VgicVersion::V2 => state.distributor_v2_write(0, offset, 4, value).unwrap(),
            VgicVersion::V3 => state.distributor_write(offset, 4, value).unwrap(),
        };
    }

    #[test]
    fn reset_returns_to_the_state_at_creation() {
        for v2 in [false, true] {
            let gic = if v2 {
                Vgic::new_v2(config())
            } else {
                Vgic::new(config())
            }
            .unwrap();
            let fresh_ctlr = read(&gic.lock(), CTLR);
            {
                let mut state = gic.lock();
                write(&mut state, ISENABLER1, 0b1010);
                write(&mut state, CTLR, 0x1);
                assert_eq!(read(&state, ISENABLER1), 0b1010);
                assert_ne!(read(&state, CTLR), fresh_ctlr);
            }
            gic.reset().unwrap();
            let state = gic.lock();
            assert_eq!(read(&state, ISENABLER1), 0);
            assert_eq!(read(&state, CTLR), fresh_ctlr);
            let expected = if v2 { VgicVersion::V2 } else { VgicVersion::V3 };
            assert_eq!(state.version(), expected);
        }
    }
}
