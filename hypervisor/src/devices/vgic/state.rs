//! The virtual GIC's state, routing and injection.
//!
//! [`VgicState`] owns every interrupt of the VM: the SPIs with their
//! `IROUTER` values, and per vCPU the 32 private interrupts and the
//! redistributor's `WAKER` handshake. An SPI's target is computed when it is
//! needed: with `IROUTER.IRM` = 0 it is the vCPU whose MPIDR affinity equals
//! the route (none if no vCPU matches), with `IRM` = 1 the lowest-numbered
//! vCPU whose redistributor is awake (vCPU 0 if none is). An SPI or LPI a
//! vCPU has taken stays with that vCPU until the guest completes it there,
//! however it is routed meanwhile (only that CPU interface can deactivate
//! it); then it goes where it is routed. Every change that
//! can make an interrupt deliverable, or that makes a list register stale,
//! reports the vCPUs to kick: the interrupt's target if it is now
//! deliverable, and the vCPU whose list registers hold it.

use super::irq::{FIRST_SPI, IntIdClass, IrqState, PRIVATE_COUNT, SGI_COUNT, Trigger};
use super::its::ItsState;
use super::list_regs::MAX_LIST_REGISTERS;
use super::lpi::{FIRST_LPI, Lpi, RedistributorLpis};
use super::sgi::{SgiGroup, SgiRequest};
use super::{
    DISTRIBUTOR_SIZE, Frame, MAX_SPIS, MAX_VCPUS, REDISTRIBUTOR_STRIDE, SGI_BASE_OFFSET, VcpuSet,
    VgicError, affinity_of,
};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// `IROUTER.Interrupt_Routing_Mode`: any participating PE.
pub(crate) const IROUTER_IRM: u64 = 1 << 31;
/// The `IROUTER` bits that hold state: Aff3, IRM, Aff2, Aff1, Aff0.
pub(crate) const IROUTER_MASK: u64 = 0xff_80ff_ffff;

/// Where the guest sees the virtual GIC and what it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VgicConfig {
    /// Guest physical address of the distributor (64 KiB aligned).
    pub distributor_base: u64,
    /// Guest physical address of the first redistributor (64 KiB aligned);
    /// vCPU n's is at `redistributor_base + n * 128 KiB`.
    pub redistributor_base: u64,
    /// Number of SPIs (INTIDs 32..32 + spi_count), at most [`MAX_SPIS`].
    pub spi_count: u32,
    /// `MPIDR_EL1` of each vCPU, in vCPU index order. Aff0 must be below 16
    /// (`GICD_TYPER.RSS` = 0) and affinities must be distinct.
    pub vcpu_mpidrs: Vec<u64>,
}

/// Which GIC the guest sees: the register maps and SGI rules differ, the
/// interrupt model and the list-register logic are shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VgicVersion {
    /// GICv2: one distributor frame with banked private registers,
    /// `ITARGETSR` routing, SGIs through `GICD_SGIR` with a source CPU; the
    /// CPU interface is the hardware's `GICV` frame. At most 8 vCPUs.
    V2,
    /// GICv3: distributor and redistributors, affinity routing, SGIs
    /// through the trapped `ICC_SGI*R_EL1`.
    #[default]
    V3,
}

/// Most vCPUs a GICv2 serves (8 CPU interfaces).
pub const MAX_VCPUS_V2: usize = 8;

/// One vCPU's redistributor and list-register bookkeeping.
#[derive(Clone, Debug)]
pub(crate) struct VcpuState {
    /// MPIDR affinity fields.
    pub affinity: u64,
    /// SGIs 0..=15 and PPIs 16..=31.
    pub private: [IrqState; PRIVATE_COUNT as usize],
    /// `GICR_WAKER.ProcessorSleep` (`ChildrenAsleep` follows it at once).
    pub processor_sleep: bool,
    /// The INTID written to each list register by the last fill.
    pub listed: [Option<u32>; MAX_LIST_REGISTERS],
    /// Bit n: list register n was written with an interrupt and not cleared
    /// since (a fold leaves the hardware register as it is), so a fill that
    /// puts nothing there must clear it. The others are empty already.
    pub written: u32,
    /// Bit n: hardware-linked PPI n came back from a hardware list register
    /// deactivated by the guest since the last
    /// [`take_hardware_completions`](VgicState::take_hardware_completions),
    /// which deactivated its physical interrupt as well.
    pub hardware_completed: u32,
    /// The redistributor's LPI registers.
    pub lpis: RedistributorLpis,
}

impl VcpuState {
    fn new(affinity: u64) -> Self {
        let mut private = [IrqState::new(Trigger::Level); PRIVATE_COUNT as usize];
        for sgi in &mut private[..SGI_COUNT as usize] {
            sgi.trigger = Trigger::Edge;
        }
        Self {
            affinity,
            private,
            processor_sleep: true,
            listed: [None; MAX_LIST_REGISTERS],
            written: 0,
            hardware_completed: 0,
            lpis: RedistributorLpis::default(),
        }
    }
}

/// All state of one VM's virtual GIC. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct VgicState {
    pub(crate) version: VgicVersion,
    pub(crate) distributor_base: u64,
    pub(crate) redistributor_base: u64,
    /// `GICD_CTLR.EnableGrp0`.
    pub(crate) enable_grp0: bool,
    /// `GICD_CTLR.EnableGrp1`.
    pub(crate) enable_grp1: bool,
    pub(crate) spi_count: u32,
    /// SPI n at index n - 32.
    pub(crate) spis: Vec<IrqState>,
    /// `IROUTER` of SPI n at index n - 32.
    pub(crate) routes: Vec<u64>,
    /// GICv2: `ITARGETSR` byte of SPI n at index n - 32 (bit n = vCPU n).
    pub(crate) targets: Vec<u8>,
    pub(crate) vcpus: Vec<VcpuState>,
    /// The physical PPI each of the PPIs 16..=31 (index n - 16) is linked
    /// to on every vCPU's CPU (0: not linked): listed as a hardware
    /// interrupt, so the guest's deactivation deactivates the physical one.
    pub(crate) hardware_ppis: [u8; 16],
    /// SPIs linked to physical SPIs (passthrough), see
    /// [`link_hardware_spi`](VgicState::link_hardware_spi).
    pub(crate) hardware_spis: Vec<HardwareSpi>,
    /// The ITS, when the VM has one.
    pub(crate) its: Option<ItsState>,
    /// The mapped LPIs, by INTID (module `lpi`).
    pub(crate) lpis: BTreeMap<u32, Lpi>,
    /// vCPUs a fold released an interrupt to ([`VgicState::take_released`]).
    pub(crate) released: VcpuSet,
}

/// A virtual SPI linked to a physical one (a passed-through device's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HardwareSpi {
    /// The guest's INTID.
    pub intid: u32,
    /// The physical INTID.
    pub pintid: u32,
    /// The physical interrupt fired and was left active for the guest
    /// ([`VgicState::inject_hardware_spi`]), and the guest has not
    /// deactivated it through a hardware list register yet.
    pub physical_active: bool,
}

impl VgicState {
    /// A virtual GIC in its reset state: distributor disabled, every
    /// interrupt group 0, disabled, idle, priority 0, SPIs level-sensitive and
    /// routed to affinity 0.0.0.0, redistributors asleep.
    pub fn new(config: VgicConfig) -> Result<Self, VgicError> {
        let count = config.vcpu_mpidrs.len();
        if count == 0 || count > MAX_VCPUS {
            return Err(VgicError::VcpuCount(count));
        }
        if config.spi_count > MAX_SPIS {
            return Err(VgicError::SpiCount(config.spi_count));
        }
        let redistributors_end = count as u64 * REDISTRIBUTOR_STRIDE;
        let disjoint = config
            .distributor_base
            .checked_add(DISTRIBUTOR_SIZE)
            .is_some_and(|end| {
                end <= config.redistributor_base
                    || config
                        .redistributor_base
                        .checked_add(redistributors_end)
                        .is_some_and(|r_end| r_end <= config.distributor_base)
            });
        let aligned =
            (config.distributor_base | config.redistributor_base).is_multiple_of(DISTRIBUTOR_SIZE);
        if !disjoint
            || !aligned
            || config
                .redistributor_base
                .checked_add(redistributors_end)
                .is_none()
        {
            return Err(VgicError::Layout);
        }
        let mut vcpus: Vec<VcpuState> = Vec::with_capacity(count);
        for &mpidr in &config.vcpu_mpidrs {
            let affinity = affinity_of(mpidr);
            if affinity & 0xff >= 16 {
                return Err(VgicError::UnsupportedAffinity(mpidr));
            }
            if vcpus.iter().any(|vcpu| vcpu.affinity == affinity) {
                return Err(VgicError::DuplicateAffinity(mpidr));
            }
            vcpus.push(VcpuState::new(affinity));
        }
        Ok(Self {
            version: VgicVersion::V3,
            distributor_base: config.distributor_base,
            redistributor_base: config.redistributor_base,
            enable_grp0: false,
            enable_grp1: false,
            spi_count: config.spi_count,
            spis: alloc::vec![IrqState::new(Trigger::Level); config.spi_count as usize],
            routes: alloc::vec![0; config.spi_count as usize],
            targets: alloc::vec![0; config.spi_count as usize],
            vcpus,
            hardware_ppis: [0; 16],
            hardware_spis: Vec::new(),
            its: None,
            lpis: BTreeMap::new(),
            released: VcpuSet::EMPTY,
        })
    }

    /// A virtual GICv2 in its reset state (as [`new`](Self::new), SPIs
    /// targeting no CPU). `redistributor_base` is not used, but must not
    /// overlap the distributor. At most [`MAX_VCPUS_V2`] vCPUs.
    pub fn new_v2(config: VgicConfig) -> Result<Self, VgicError> {
        let count = config.vcpu_mpidrs.len();
        if count > MAX_VCPUS_V2 {
            return Err(VgicError::VcpuCount(count));
        }
        let mut state = Self::new(config)?;
        state.version = VgicVersion::V2;
        Ok(state)
    }

    /// Links PPI `intid` (16..=31) of every vCPU to physical PPI `pintid`
    /// (16..=31) of the CPU that runs it: from now on it is listed as a
    /// hardware interrupt (`ICH_LR<n>_EL2.HW`, `GICH_LR<n>.HW`), whose
    /// deactivation by the guest deactivates the physical interrupt, so that
    /// the hypervisor can leave the physical one active (its priority
    /// dropped) until the guest has handled it, with no maintenance
    /// interrupt. A hardware list register cannot ask for EOI maintenance:
    /// when a fill needs that, it lists the interrupt as a software one and
    /// the caller deactivates the physical interrupt itself (see
    /// [`hardware_ppi_idle`](Self::hardware_ppi_idle)).
    pub fn link_hardware_ppi(&mut self, intid: u32, pintid: u32) -> Result<(), VgicError> {
        if IntIdClass::of(intid) != Some(IntIdClass::Ppi) {
            return Err(VgicError::NoSuchInterrupt(intid));
        }
        if IntIdClass::of(pintid) != Some(IntIdClass::Ppi) {
            return Err(VgicError::NoSuchInterrupt(pintid));
        }
        self.hardware_ppis[(intid - SGI_COUNT) as usize] = pintid as u8;
        Ok(())
    }

    /// The physical PPI `intid` is linked to, if any.
    pub fn hardware_ppi(&self, intid: u32) -> Option<u32> {
        let index = intid.checked_sub(SGI_COUNT)?;
        match self.hardware_ppis.get(index as usize) {
            Some(&pintid) if pintid != 0 && intid < PRIVATE_COUNT => Some(u32::from(pintid)),
            _ => None,
        }
    }

    /// Links SPI `intid` to physical SPI `pintid` (a passed-through
    /// device's). The hypervisor takes the physical interrupt, drops its
    /// priority and leaves it active ([`inject_hardware_spi`](Self::inject_hardware_spi));
    /// the virtual one is listed as a hardware interrupt, so the guest's
    /// deactivation deactivates the physical one, which fires again if the
    /// device still asserts it. Where the guest will not deactivate it
    /// (listed as a software interrupt for EOI maintenance, or its pending
    /// state cleared through `ICPENDR`), the hypervisor must
    /// ([`take_hardware_spi_deactivations`](Self::take_hardware_spi_deactivations)).
    pub fn link_hardware_spi(&mut self, intid: u32, pintid: u32) -> Result<(), VgicError> {
        self.check_spi(intid)?;
        if IntIdClass::of(pintid) != Some(IntIdClass::Spi) {
            return Err(VgicError::NoSuchInterrupt(pintid));
        }
        if self.hardware_spis.iter().any(|h| h.intid == intid) {
            return Err(VgicError::NoSuchInterrupt(intid));
        }
        self.hardware_spis.push(HardwareSpi {
            intid,
            pintid,
            physical_active: false,
        });
        Ok(())
    }

    /// The physical interrupt `intid` is linked to, if any (a PPI's or an
    /// SPI's): what a fill lists as a hardware interrupt.
    pub fn hardware_intid(&self, intid: u32) -> Option<u32> {
        if intid < PRIVATE_COUNT {
            return self.hardware_ppi(intid);
        }
        self.hardware_spis
            .iter()
            .find(|h| h.intid == intid)
            .map(|h| h.pintid)
    }

    /// The virtual SPI linked to physical SPI `pintid`, if any.
    pub fn linked_spi(&self, pintid: u32) -> Option<u32> {
        self.hardware_spis
            .iter()
            .find(|h| h.pintid == pintid)
            .map(|h| h.intid)
    }

    /// Physical SPI `pintid` fired; the caller dropped its priority and
    /// leaves it active until the guest deactivates it. Latches the linked
    /// SPI pending. Returns the vCPUs to kick.
    pub fn inject_hardware_spi(&mut self, pintid: u32) -> Result<VcpuSet, VgicError> {
        let link = self
            .hardware_spis
            .iter_mut()
            .find(|h| h.pintid == pintid)
            .ok_or(VgicError::NoSuchInterrupt(pintid))?;
        link.physical_active = true;
        let intid = link.intid;
        // Fired again: a hardware list register that still names it was
        // deactivated by the guest already (the physical interrupt could
        // not fire while active), so its fold must not report this
        // firing's deactivation. Folded as a software one, it completes.
        if let Some(irq) = self.spis.get_mut((intid - FIRST_SPI) as usize) {
            irq.listed_hw = false;
        }
        self.latch(0, intid)
    }

    /// The physical SPIs left active for the guest that it will no longer
    /// deactivate: the linked interrupt is in no list register and neither
    /// pending nor active. The caller deactivates them. Call it after a
    /// fill, when the model is up to date.
    pub fn take_hardware_spi_deactivations(&mut self) -> Vec<u32> {
        if self.hardware_spis.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for index in 0..self.hardware_spis.len() {
            let link = self.hardware_spis[index];
            if !link.physical_active {
                continue;
            }
            let idle = self
                .spis
                .get((link.intid - FIRST_SPI) as usize)
                .is_none_or(|irq| irq.listed_on.is_none() && !irq.pending() && !irq.active);
            if idle {
                self.hardware_spis[index].physical_active = false;
                out.push(link.pintid);
            }
        }
        out
    }

    /// The guest deactivated linked SPI `intid` through a hardware list
    /// register: its physical interrupt is inactive.
    pub(crate) fn hardware_spi_completed(&mut self, intid: u32) {
        if let Some(link) = self.hardware_spis.iter_mut().find(|h| h.intid == intid) {
            link.physical_active = false;
        }
    }

    /// The vCPU SPI `intid` is routed to now, if any.
    pub fn spi_target_of(&self, intid: u32) -> Option<usize> {
        self.spi_target(intid)
    }

    /// Takes the hardware-linked PPIs of `vcpu` (bit n = INTID n) that the
    /// guest deactivated through a hardware list register since the last
    /// call (found by the folds in between): their physical interrupts are
    /// inactive again.
    pub fn take_hardware_completions(&mut self, vcpu: usize) -> u32 {
        self.vcpus
            .get_mut(vcpu)
            .map_or(0, |v| core::mem::take(&mut v.hardware_completed))
    }

    /// Whether `vcpu`'s PPI `intid` is neither pending nor active: the guest
    /// will not deactivate it, so a physical interrupt the hypervisor left
    /// active for it must be deactivated by the hypervisor. (One the guest
    /// took and then deactivated through `ICACTIVER` is still in service
    /// until its EOI, which only drops the priority: it is idle.) Call it
    /// after a fill, when the model is up to date.
    pub fn hardware_ppi_idle(&self, vcpu: usize, intid: u32) -> bool {
        self.irq(vcpu, intid)
            .is_none_or(|irq| !irq.pending() && !irq.active)
    }

    /// The GIC the guest sees.
    pub fn version(&self) -> VgicVersion {
        self.version
    }

    /// Number of vCPUs.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    /// Whether `ipa` is in the distributor or a redistributor frame.
    pub fn contains(&self, ipa: u64) -> bool {
        self.frame_of(ipa).is_some()
    }

    /// The frame holding `ipa` and the offset in it.
    pub fn frame_of(&self, ipa: u64) -> Option<(Frame, u64)> {
        if let Some(offset) = ipa.checked_sub(self.distributor_base)
            && offset < DISTRIBUTOR_SIZE
        {
            return Some((Frame::Distributor, offset));
        }
        if self.version == VgicVersion::V2 {
            return None;
        }
        let offset = ipa.checked_sub(self.redistributor_base)?;
        let vcpu = usize::try_from(offset / REDISTRIBUTOR_STRIDE).ok()?;
        if vcpu >= self.vcpus.len() {
            return None;
        }
        let offset = offset % REDISTRIBUTOR_STRIDE;
        Some(if offset < SGI_BASE_OFFSET {
            (Frame::RdBase { vcpu }, offset)
        } else {
            (Frame::SgiBase { vcpu }, offset - SGI_BASE_OFFSET)
        })
    }

    /// A guest load of `size` bytes (1, 2, 4 or 8) at `ipa`. (A GICv2's
    /// banked registers read as vCPU 0's here: see
    /// [`mmio_read_from`](Self::mmio_read_from).)
    pub fn mmio_read(&self, ipa: u64, size: u8) -> Result<u64, VgicError> {
        if self.version == VgicVersion::V2 {
            return self.mmio_read_from(0, ipa, size);
        }
        match self.frame_of(ipa).ok_or(VgicError::NotInGic { ipa })? {
            (Frame::Distributor, offset) => self.distributor_read(offset, size),
            (Frame::RdBase { vcpu }, offset) => self.rd_base_read(vcpu, offset, size),
            (Frame::SgiBase { vcpu }, offset) => self.sgi_base_read(vcpu, offset, size),
            // The ITS is a device of its own (`its_read`, `its_write`).
            (Frame::Its, _) => Err(VgicError::NotInGic { ipa }),
        }
    }

    /// A guest store of the low `size` bytes of `value` at `ipa`. Returns the
    /// vCPUs to kick.
    pub fn mmio_write(&mut self, ipa: u64, size: u8, value: u64) -> Result<VcpuSet, VgicError> {
        if self.version == VgicVersion::V2 {
            return self.mmio_write_from(0, ipa, size, value);
        }
        match self.frame_of(ipa).ok_or(VgicError::NotInGic { ipa })? {
            (Frame::Distributor, offset) => self.distributor_write(offset, size, value),
            (Frame::RdBase { vcpu }, offset) => self.rd_base_write(vcpu, offset, size, value),
            (Frame::SgiBase { vcpu }, offset) => self.sgi_base_write(vcpu, offset, size, value),
            (Frame::Its, _) => Err(VgicError::NotInGic { ipa }),
        }
    }

    /// A load by `vcpu` (GICv2's distributor banks the private interrupts'
    /// registers by the accessing CPU).
    pub fn mmio_read_from(&self, vcpu: usize, ipa: u64, size: u8) -> Result<u64, VgicError> {
        match self.version {
            VgicVersion::V3 => self.mmio_read(ipa, size),
            VgicVersion::V2 => {
                self.check_vcpu(vcpu)?;
                let (_, offset) = self.frame_of(ipa).ok_or(VgicError::NotInGic { ipa })?;
                self.distributor_v2_read(vcpu, offset, size)
            }
        }
    }

    /// A store by `vcpu`; see [`mmio_read_from`](Self::mmio_read_from).
    /// Returns the vCPUs to kick.
    pub fn mmio_write_from(
        &mut self,
        vcpu: usize,
        ipa: u64,
        size: u8,
        value: u64,
    ) -> Result<VcpuSet, VgicError> {
        match self.version {
            VgicVersion::V3 => self.mmio_write(ipa, size, value),
            VgicVersion::V2 => {
                self.check_vcpu(vcpu)?;
                let (_, offset) = self.frame_of(ipa).ok_or(VgicError::NotInGic { ipa })?;
                self.distributor_v2_write(vcpu, offset, size, value)
            }
        }
    }

    /// The state of `intid`, taking private INTIDs from `vcpu`'s bank.
    /// `None` for unimplemented INTIDs (and for a bad `vcpu` with a private one).
    pub(crate) fn irq(&self, vcpu: usize, intid: u32) -> Option<&IrqState> {
        if intid >= FIRST_LPI {
            self.lpis.get(&intid).map(|lpi| &lpi.irq)
        } else if intid < PRIVATE_COUNT {
            self.vcpus.get(vcpu)?.private.get(intid as usize)
        } else {
            self.spis.get(intid.checked_sub(FIRST_SPI)? as usize)
        }
    }

    /// Mutable form of [`irq`](Self::irq).
    pub(crate) fn irq_mut(&mut self, vcpu: usize, intid: u32) -> Option<&mut IrqState> {
        if intid >= FIRST_LPI {
            self.lpis.get_mut(&intid).map(|lpi| &mut lpi.irq)
        } else if intid < PRIVATE_COUNT {
            self.vcpus.get_mut(vcpu)?.private.get_mut(intid as usize)
        } else {
            self.spis.get_mut(intid.checked_sub(FIRST_SPI)? as usize)
        }
    }

    /// Whether the distributor forwards interrupts of `irq`'s group.
    pub(crate) fn group_enabled(&self, irq: &IrqState) -> bool {
        if irq.group1 {
            self.enable_grp1
        } else {
            self.enable_grp0
        }
    }

    /// Pending, enabled, and its group enabled.
    pub(crate) fn deliverable(&self, irq: &IrqState) -> bool {
        irq.pending() && irq.enabled && self.group_enabled(irq)
    }

    /// The vCPU SPI `intid` is routed to now.
    pub(crate) fn spi_target(&self, intid: u32) -> Option<usize> {
        if self.version == VgicVersion::V2 {
            // 1-of-N among the CPUs named: the lowest-numbered one.
            let targets = *self.targets.get(intid.checked_sub(FIRST_SPI)? as usize)?;
            let first = targets.trailing_zeros() as usize;
            return (first < self.vcpus.len()).then_some(first);
        }
        let route = *self.routes.get(intid.checked_sub(FIRST_SPI)? as usize)?;
        if route & IROUTER_IRM != 0 {
            Some(
                self.vcpus
                    .iter()
                    .position(|vcpu| !vcpu.processor_sleep)
                    .unwrap_or(0),
            )
        } else {
            self.vcpus
                .iter()
                .position(|vcpu| vcpu.affinity == affinity_of(route))
        }
    }

    /// The vCPU that receives `intid` (private ones belong to `vcpu`): the
    /// one handling it while it is in service there, else the one it is
    /// routed to.
    pub(crate) fn target_of(&self, vcpu: usize, intid: u32) -> Option<usize> {
        if intid >= PRIVATE_COUNT
            && let Some(owner) = self.irq(vcpu, intid).and_then(|irq| irq.taken_on)
        {
            return Some(usize::from(owner));
        }
        if intid >= FIRST_LPI {
            self.lpis.get(&intid).map(|lpi| lpi.vcpu)
        } else if intid < PRIVATE_COUNT {
            Some(vcpu)
        } else {
            self.spi_target(intid)
        }
    }

    /// vCPUs that must refill their list registers after a change to
    /// `intid`: its target if it is deliverable, and its list-register holder.
    pub(crate) fn kicks_for(&self, vcpu: usize, intid: u32) -> VcpuSet {
        let mut kicks = VcpuSet::EMPTY;
        let Some(irq) = self.irq(vcpu, intid) else {
            return kicks;
        };
        if self.deliverable(irq)
            && let Some(target) = self.target_of(vcpu, intid)
        {
            kicks.insert(target);
        }
        if let Some(holder) = irq.listed_on {
            kicks.insert(usize::from(holder));
        }
        kicks
    }

    pub(crate) fn check_vcpu(&self, vcpu: usize) -> Result<(), VgicError> {
        if vcpu < self.vcpus.len() {
            Ok(())
        } else {
            Err(VgicError::NoSuchVcpu(vcpu))
        }
    }

    fn check_spi(&self, intid: u32) -> Result<(), VgicError> {
        if IntIdClass::of(intid) == Some(IntIdClass::Spi) && intid - FIRST_SPI < self.spi_count {
            Ok(())
        } else {
            Err(VgicError::NoSuchInterrupt(intid))
        }
    }

    fn check_ppi(&self, vcpu: usize, intid: u32) -> Result<(), VgicError> {
        self.check_vcpu(vcpu)?;
        if IntIdClass::of(intid) == Some(IntIdClass::Ppi) {
            Ok(())
        } else {
            Err(VgicError::NoSuchInterrupt(intid))
        }
    }

    /// Drives the input line of SPI `intid`. Returns the vCPUs to kick.
    pub fn set_spi_level(&mut self, intid: u32, level: bool) -> Result<VcpuSet, VgicError> {
        self.check_spi(intid)?;
        self.set_line(0, intid, level)
    }

    /// Drives the input line of PPI `intid` of `vcpu`. Returns the vCPUs to kick.
    pub fn set_ppi_level(
        &mut self,
        vcpu: usize,
        intid: u32,
        level: bool,
    ) -> Result<VcpuSet, VgicError> {
        self.check_ppi(vcpu, intid)?;
        self.set_line(vcpu, intid, level)
    }

    /// Latches SPI `intid` pending (an edge, or a message). Returns the vCPUs
    /// to kick.
    pub fn inject_spi_edge(&mut self, intid: u32) -> Result<VcpuSet, VgicError> {
        self.check_spi(intid)?;
        self.latch(0, intid)
    }

    /// Latches PPI `intid` of `vcpu` pending. Returns the vCPUs to kick.
    pub fn inject_ppi_edge(&mut self, vcpu: usize, intid: u32) -> Result<VcpuSet, VgicError> {
        self.check_ppi(vcpu, intid)?;
        self.latch(vcpu, intid)
    }

    fn set_line(&mut self, vcpu: usize, intid: u32, level: bool) -> Result<VcpuSet, VgicError> {
        let irq = self
            .irq_mut(vcpu, intid)
            .ok_or(VgicError::NoSuchInterrupt(intid))?;
        let before = *irq;
        irq.set_line(level);
        let changed =
            irq.pending() != before.pending() || irq.pending_latch != before.pending_latch;
        Ok(if changed {
            self.kicks_for(vcpu, intid)
        } else {
            VcpuSet::EMPTY
        })
    }

    fn latch(&mut self, vcpu: usize, intid: u32) -> Result<VcpuSet, VgicError> {
        self.irq_mut(vcpu, intid)
            .ok_or(VgicError::NoSuchInterrupt(intid))?
            .set_pending();
        Ok(self.kicks_for(vcpu, intid))
    }

    /// A trapped write of `value` by `sender` to `ICC_SGI1R_EL1` (group 1)
    /// or `ICC_SGI0R_EL1`/`ICC_ASGI1R_EL1` (group 0). The SGI becomes pending
    /// on every target whose copy of it is configured in that group. Returns
    /// the targets it was pended on (the vCPUs to kick).
    pub fn send_sgi(
        &mut self,
        sender: usize,
        value: u64,
        group: SgiGroup,
    ) -> Result<VcpuSet, VgicError> {
        self.check_vcpu(sender)?;
        let request = SgiRequest::decode(value);
        let targets = request.resolve(self.vcpus.iter().map(|vcpu| vcpu.affinity), sender);
        let mut pended = VcpuSet::EMPTY;
        for target in targets.iter() {
            let sgi = &mut self.vcpus[target].private[request.intid as usize];
            if sgi.group1 == (group == SgiGroup::Group1) {
                sgi.set_pending();
                pended.insert(target);
            }
        }
        Ok(pended)
    }

    /// Whether `vcpu` has an interrupt it could take now (pending, enabled,
    /// group enabled, routed to it): a WFI should not block.
    pub fn has_deliverable(&self, vcpu: usize) -> bool {
        let Some(state) = self.vcpus.get(vcpu) else {
            return false;
        };
        state.private.iter().any(|irq| self.deliverable(irq))
            || self.spis.iter().enumerate().any(|(index, irq)| {
                self.deliverable(irq)
                    && self.target_of(vcpu, FIRST_SPI + index as u32) == Some(vcpu)
            })
            || self.lpis.iter().any(|(&intid, lpi)| {
                self.deliverable(&lpi.irq) && self.target_of(vcpu, intid) == Some(vcpu)
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::VTIMER_INTID;
    use super::*;

    /// Two vCPUs (MPIDR 0.0.0.0 and 0.0.0.1), 64 SPIs, QEMU virt addresses.
    pub(crate) fn two_vcpus() -> VgicState {
        VgicState::new(VgicConfig {
            distributor_base: 0x0800_0000,
            redistributor_base: 0x080a_0000,
            spi_count: 64,
            vcpu_mpidrs: alloc::vec![0x8000_0000, 0x8000_0001],
        })
        .unwrap()
    }

    #[test]
    fn config_validation() {
        let config = |mpidrs: Vec<u64>, spis, dist, redist| VgicConfig {
            distributor_base: dist,
            redistributor_base: redist,
            spi_count: spis,
            vcpu_mpidrs: mpidrs,
        };
        let ok = |c| VgicState::new(c).map(|_| ());
        assert_eq!(
            ok(config(vec![], 32, 0, 0x10_0000)),
            Err(VgicError::VcpuCount(0))
        );
        assert_eq!(
            ok(config(vec![0; 65], 32, 0, 0x10_0000)),
            Err(VgicError::VcpuCount(65))
        );
        assert_eq!(
            ok(config(vec![0], 989, 0, 0x10_0000)),
            Err(VgicError::SpiCount(989))
        );
        assert_eq!(ok(config(vec![0], 988, 0, 0x10_0000)), Ok(()));
        assert_eq!(ok(config(vec![0, 0x100], 0, 0, 0x10_0000)), Ok(()));
        assert_eq!(
            ok(config(vec![1, 0x8000_0001], 32, 0, 0x10_0000)),
            Err(VgicError::DuplicateAffinity(0x8000_0001))
        );
        assert_eq!(
            ok(config(vec![16], 32, 0, 0x10_0000)),
            Err(VgicError::UnsupportedAffinity(16))
        );
        assert_eq!(ok(config(vec![0], 32, 0, 0x8000)), Err(VgicError::Layout));
        assert_eq!(
            ok(config(vec![0, 1], 32, 0x20000, 0)),
            Err(VgicError::Layout)
        );
        assert_eq!(ok(config(vec![0, 1], 32, 0x40000, 0)), Ok(()));
    }

    #[test]
    fn frames_by_address() {
        let gic = two_vcpus();
        assert_eq!(gic.frame_of(0x0800_0004), Some((Frame::Distributor, 4)));
        assert_eq!(gic.frame_of(0x0801_0000), None);
        assert_eq!(
            gic.frame_of(0x080a_0014),
            Some((Frame::RdBase { vcpu: 0 }, 0x14))
        );
        assert_eq!(
            gic.frame_of(0x080b_0100),
            Some((Frame::SgiBase { vcpu: 0 }, 0x100))
        );
        assert_eq!(
            gic.frame_of(0x080c_0008),
            Some((Frame::RdBase { vcpu: 1 }, 8))
        );
        assert_eq!(
            gic.frame_of(0x080d_fffc),
            Some((Frame::SgiBase { vcpu: 1 }, 0xfffc))
        );
        assert_eq!(gic.frame_of(0x080e_0000), None);
        assert_eq!(
            gic.mmio_read(0x080e_0000, 4),
            Err(VgicError::NotInGic { ipa: 0x080e_0000 })
        );
    }

    #[test]
    fn spi_routing() {
        let mut gic = two_vcpus();
        assert_eq!(gic.spi_target(40), Some(0));
        gic.routes[8] = 1;
        assert_eq!(gic.spi_target(40), Some(1));
        gic.routes[8] = 0x1_0000_0001;
        assert_eq!(gic.spi_target(40), None, "Aff3 = 1 matches no vCPU");
        gic.routes[8] = IROUTER_IRM;
        assert_eq!(gic.spi_target(40), Some(0), "nobody awake: vCPU 0");
        gic.vcpus[1].processor_sleep = false;
        assert_eq!(gic.spi_target(40), Some(1));
        gic.vcpus[0].processor_sleep = false;
        assert_eq!(gic.spi_target(40), Some(0));
    }

    #[test]
    fn injection_checks_classes_and_kicks_targets() {
        let mut gic = two_vcpus();
        assert_eq!(
            gic.set_spi_level(31, true),
            Err(VgicError::NoSuchInterrupt(31))
        );
        assert_eq!(
            gic.set_spi_level(96, true),
            Err(VgicError::NoSuchInterrupt(96))
        );
        assert_eq!(
            gic.set_ppi_level(0, 33, true),
            Err(VgicError::NoSuchInterrupt(33))
        );
        assert_eq!(
            gic.set_ppi_level(2, 27, true),
            Err(VgicError::NoSuchVcpu(2))
        );
        assert_eq!(
            gic.inject_ppi_edge(0, 3),
            Err(VgicError::NoSuchInterrupt(3))
        );

        // Disabled: pending but nobody to kick.
        assert_eq!(gic.set_spi_level(33, true), Ok(VcpuSet::EMPTY));
        assert!(gic.irq(0, 33).unwrap().pending());
        gic.enable_grp0 = true;
        gic.spis[1].enabled = true;
        gic.routes[1] = 1;
        assert_eq!(gic.set_spi_level(33, false), Ok(VcpuSet::EMPTY));
        let mut expected = VcpuSet::EMPTY;
        expected.insert(1);
        assert_eq!(gic.set_spi_level(33, true), Ok(expected));
        assert_eq!(gic.set_spi_level(33, true), Ok(VcpuSet::EMPTY), "no change");
        assert!(gic.has_deliverable(1) && !gic.has_deliverable(0));

        gic.vcpus[0].private[27].enabled = true;
        let mut zero = VcpuSet::EMPTY;
        zero.insert(0);
        assert_eq!(gic.set_ppi_level(0, VTIMER_INTID, true), Ok(zero));
        assert!(gic.has_deliverable(0));
        assert_eq!(
            gic.set_ppi_level(0, VTIMER_INTID, false),
            Ok(VcpuSet::EMPTY)
        );
        assert!(!gic.has_deliverable(0));
    }

    #[test]
    fn sgis_pend_on_targets_of_the_matching_group() {
        let mut gic = two_vcpus();
        for vcpu in &mut gic.vcpus {
            vcpu.private[3].group1 = true;
        }
        // ICC_SGI1R_EL1 from vCPU 0: INTID 3 to Aff0 1.
        let pended = gic.send_sgi(0, 3 << 24 | 0b10, SgiGroup::Group1).unwrap();
        assert_eq!(pended.iter().collect::<Vec<_>>(), vec![1]);
        assert!(gic.vcpus[1].private[3].pending());
        assert!(!gic.vcpus[0].private[3].pending());
        // Group 0 request for a group 1 SGI: dropped.
        let pended = gic.send_sgi(1, 3 << 24 | 0b1, SgiGroup::Group0).unwrap();
        assert!(pended.is_empty());
        assert!(!gic.vcpus[0].private[3].pending());
        // Broadcast (IRM) of group 0 SGI 5 from vCPU 1.
        let pended = gic
            .send_sgi(1, 1 << 40 | 5 << 24, SgiGroup::Group0)
            .unwrap();
        assert_eq!(pended.iter().collect::<Vec<_>>(), vec![0]);
        assert!(gic.vcpus[0].private[5].pending() && !gic.vcpus[1].private[5].pending());
        assert_eq!(
            gic.send_sgi(2, 0, SgiGroup::Group1),
            Err(VgicError::NoSuchVcpu(2))
        );
    }
}
