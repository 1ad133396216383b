//! LPIs: the message-based interrupts (INTID 8192 and up) the virtual ITS
//! makes pending, and the redistributor registers that configure them.
//!
//! # Where the state lives
//!
//! The architecture keeps an LPI's configuration in the *property table*
//! (one byte per LPI: priority in \[7:2\], enable in \[0\]) and its pending
//! state in the target redistributor's *pending table*, both in guest
//! memory, at the addresses the guest writes to `GICR_PROPBASER` and
//! `GICR_PENDBASER`. A redistributor may cache both: the guest must issue
//! `INV`/`INVALL` after it changes a property byte, and may not touch the
//! pending table while `GICR_CTLR.EnableLPIs` is set. This model does what
//! that allows:
//!
//! - Each LPI the ITS has mapped (`MAPTI`/`MAPI`) is an `Lpi` record in
//!   `VgicState::lpis`: an `IrqState` (always group 1, edge-triggered)
//!   with the priority and enable read from the property table when it was
//!   mapped and on every `INV`/`INVALL` since, its target vCPU, and the
//!   (DeviceID, EventID, collection) that maps it.
//! - Pending state lives in the record, never in the pending table: once
//!   set, `EnableLPIs` cannot be cleared (the architecture makes that
//!   IMPLEMENTATION DEFINED), so the table is never needed to hand the state
//!   back. Live migration copies the records with the rest of the GIC.
//! - The property table is read through the `PROPBASER` of the
//!   lowest-numbered redistributor with LPIs enabled (vCPU 0's if none has
//!   them yet): the architecture requires every redistributor to hold the
//!   same value.
//!
//! # Delivery
//!
//! An LPI takes part in the list-register fill exactly like an SPI routed
//! to its target (module `list_register_sync`): the fill's candidates are
//! the vCPU's private interrupts, its SPIs and the LPIs whose target it is.
//! A pend request for a redistributor whose `EnableLPIs` is clear is
//! ignored, as the architecture says, and so is pending state moved there.
//!
//! # Unmapping
//!
//! `DISCARD` (or `MAPD` with V = 0) removes the record at once when no list
//! register holds the LPI and the guest is not handling it; otherwise the
//! record stays, unmapped and no longer pending, until the fold that sees
//! the guest finish with it.

use super::irq::{IrqState, PRIORITY_MASK, Trigger};
use super::{VcpuSet, VgicState};
use crate::devices::guest_memory::GuestMemory;

/// The first LPI.
pub const FIRST_LPI: u32 = 8192;
/// INTID bits the virtual GIC implements with LPIs (`GICD_TYPER.IDbits` +
/// 1): LPIs 8192..16384. That bounds the records a guest can make the
/// hypervisor keep (8192 per VM, about half a MiB of heap at most).
pub const LPI_ID_BITS: u32 = 14;

/// `GICR_CTLR.EnableLPIs`.
pub(crate) const GICR_CTLR_ENABLE_LPIS: u64 = 1 << 0;
/// The `GICR_PROPBASER` bits that hold state: IDbits \[4:0\], InnerCache
/// \[9:7\], Shareability \[11:10\], the address \[51:12\], OuterCache
/// \[58:56\].
pub(crate) const PROPBASER_MASK: u64 = 0x0700_ffff_ffff_ff9f;
/// The `GICR_PENDBASER` bits that hold state: InnerCache, Shareability, the
/// address \[51:16\], OuterCache (`PTZ` is write-only, reads 0).
pub(crate) const PENDBASER_MASK: u64 = 0x0700_ffff_ffff_0f80;
/// `GICR_PROPBASER.Physical_Address`.
const PROPBASER_ADDRESS: u64 = 0x000f_ffff_ffff_f000;
/// Property byte: the LPI is enabled.
const PROPERTY_ENABLE: u8 = 1 << 0;

/// One vCPU's redistributor, as far as LPIs go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RedistributorLpis {
    /// `GICR_CTLR.EnableLPIs` (sticky once set).
    pub enabled: bool,
    /// `GICR_PROPBASER` as written (masked by [`PROPBASER_MASK`]).
    pub propbaser: u64,
    /// `GICR_PENDBASER` as written (masked by [`PENDBASER_MASK`]).
    pub pendbaser: u64,
}

/// One mapped LPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lpi {
    /// Its interrupt state (group 1, edge).
    pub irq: IrqState,
    /// The vCPU whose redistributor it targets.
    pub vcpu: usize,
    /// The DeviceID of the event that maps it.
    pub device: u32,
    /// The EventID that maps it.
    pub event: u32,
    /// The collection the event is mapped to.
    pub collection: u16,
    /// An ITS mapping still names it (false: discarded, kept until the
    /// guest has finished with it).
    pub mapped: bool,
}

impl Lpi {
    /// Nothing refers to it any more: unmapped, unlisted, inactive.
    fn is_dead(&self) -> bool {
        !self.mapped
            && self.irq.listed_on.is_none()
            && !self.irq.active
            && self.irq.in_service.is_none()
    }
}

/// Why an LPI operation was refused (a command error of the ITS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LpiError {
    /// The INTID is not an LPI the property table covers.
    OutOfRange(u32),
    /// The property byte is not in guest RAM.
    PropertyNotInRam(u32),
    /// The INTID is mapped by another event already.
    AlreadyMapped(u32),
}

impl core::fmt::Display for LpiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::OutOfRange(intid) => {
                write!(f, "INTID {intid} is not an LPI the property table covers")
            }
            Self::PropertyNotInRam(intid) => {
                write!(f, "the property byte of LPI {intid} is not in guest RAM")
            }
            Self::AlreadyMapped(intid) => write!(f, "LPI {intid} is mapped by another event"),
        }
    }
}

impl VgicState {
    /// The `PROPBASER` the property table is read through (module docs).
    fn property_table(&self) -> u64 {
        self.vcpus
            .iter()
            .find(|vcpu| vcpu.lpis.enabled)
            .or(self.vcpus.first())
            .map_or(0, |vcpu| vcpu.lpis.propbaser)
    }

    /// Reads LPI `intid`'s property byte: (enabled, priority).
    pub(crate) fn lpi_property(
        &self,
        intid: u32,
        memory: &dyn GuestMemory,
    ) -> Result<(bool, u8), LpiError> {
        let propbaser = self.property_table();
        // PROPBASER.IDbits + 1 INTID bits, never more than the GIC has.
        let bits = ((propbaser & 0x1f) as u32 + 1).min(LPI_ID_BITS);
        if !Self::is_lpi(intid) || bits < 14 || u64::from(intid) >= 1u64 << bits {
            return Err(LpiError::OutOfRange(intid));
        }
        let address = (propbaser & PROPBASER_ADDRESS) + u64::from(intid - FIRST_LPI);
        let mut byte = [0u8];
        memory
            .read(address, &mut byte)
            .map_err(|_| LpiError::PropertyNotInRam(intid))?;
        Ok((
            byte[0] & PROPERTY_ENABLE != 0,
            byte[0] & 0xfc & PRIORITY_MASK,
        ))
    }

    /// Whether `intid` is an LPI the GIC could hold (in the INTID space,
    /// whatever the property table covers).
    pub(crate) const fn is_lpi(intid: u32) -> bool {
        intid >= FIRST_LPI && (intid as u64) < (1u64 << LPI_ID_BITS)
    }

    /// Maps LPI `intid` for (`device`, `event`) through `collection`,
    /// targeting `vcpu` (`None`: the collection is not mapped yet), with its
    /// property read now. An unmapped record the guest still holds is
    /// reused.
    pub(crate) fn map_lpi(
        &mut self,
        intid: u32,
        target: (u16, Option<usize>),
        source: (u32, u32),
        memory: &dyn GuestMemory,
    ) -> Result<(), LpiError> {
        let (enabled, priority) = self.lpi_property(intid, memory)?;
        let (collection, vcpu) = target;
        let (device, event) = source;
        if self.lpis.get(&intid).is_some_and(|lpi| lpi.mapped) {
            return Err(LpiError::AlreadyMapped(intid));
        }
        let mut fresh = IrqState::new(Trigger::Edge);
        fresh.group1 = true;
        let lpi = self.lpis.entry(intid).or_insert(Lpi {
            irq: fresh,
            vcpu: vcpu.unwrap_or(0),
            device,
            event,
            collection,
            mapped: true,
        });
        lpi.irq.enabled = enabled;
        lpi.irq.priority = priority;
        lpi.vcpu = vcpu.unwrap_or(lpi.vcpu);
        lpi.device = device;
        lpi.event = event;
        lpi.collection = collection;
        lpi.mapped = true;
        Ok(())
    }

    /// Unmaps LPI `intid` (`DISCARD`, `MAPD` V = 0): no longer pending; the
    /// record goes once nothing refers to it. Returns the vCPUs to kick.
    pub(crate) fn unmap_lpi(&mut self, intid: u32) -> VcpuSet {
        let Some(lpi) = self.lpis.get_mut(&intid) else {
            return VcpuSet::EMPTY;
        };
        lpi.mapped = false;
        lpi.irq.clear_pending();
        let mut kicks = VcpuSet::EMPTY;
        if let Some(holder) = lpi.irq.listed_on {
            kicks.insert(usize::from(holder));
        }
        if lpi.is_dead() {
            self.lpis.remove(&intid);
        }
        kicks
    }

    /// Drops LPI `intid`'s record if nothing refers to it any more (after a
    /// fold took it out of a list register).
    pub(crate) fn forget_lpi_if_dead(&mut self, intid: u32) {
        if self.lpis.get(&intid).is_some_and(Lpi::is_dead) {
            self.lpis.remove(&intid);
        }
    }

    /// Makes mapped LPI `intid` pending (`INT`, a `GITS_TRANSLATER` write),
    /// unless its target's LPIs are disabled. Returns the vCPUs to kick.
    pub(crate) fn pend_lpi(&mut self, intid: u32) -> VcpuSet {
        let Some(lpi) = self.lpis.get(&intid) else {
            return VcpuSet::EMPTY;
        };
        if !lpi.mapped || !self.vcpus[lpi.vcpu].lpis.enabled {
            return VcpuSet::EMPTY;
        }
        if let Some(lpi) = self.lpis.get_mut(&intid) {
            lpi.irq.set_pending();
        }
        self.kicks_for(0, intid)
    }

    /// Clears LPI `intid`'s pending state (`CLEAR`). Returns the vCPUs to
    /// kick.
    pub(crate) fn clear_lpi(&mut self, intid: u32) -> VcpuSet {
        let kicks = self.kicks_for(0, intid);
        if let Some(lpi) = self.lpis.get_mut(&intid) {
            lpi.irq.clear_pending();
        }
        kicks
    }

    /// Re-reads LPI `intid`'s property byte (`INV`, `INVALL`). A byte no
    /// longer in RAM leaves the cached values. Returns the vCPUs to kick.
    pub(crate) fn reload_lpi(&mut self, intid: u32, memory: &dyn GuestMemory) -> VcpuSet {
        let Ok((enabled, priority)) = self.lpi_property(intid, memory) else {
            return VcpuSet::EMPTY;
        };
        let before = self.kicks_for(0, intid);
        if let Some(lpi) = self.lpis.get_mut(&intid) {
            lpi.irq.enabled = enabled;
            lpi.irq.priority = priority;
        }
        before.union(self.kicks_for(0, intid))
    }

    /// Sends LPI `intid` to `vcpu` (and records `collection` as its
    /// collection): `MOVI`, `MAPC` of its collection, `MOVALL`. Pending
    /// state moves with it, unless `vcpu` has its LPIs disabled. Returns the
    /// vCPUs to kick.
    pub(crate) fn retarget_lpi(&mut self, intid: u32, vcpu: usize, collection: u16) -> VcpuSet {
        let before = self.kicks_for(0, intid);
        let enabled = self.vcpus.get(vcpu).is_some_and(|v| v.lpis.enabled);
        let Some(lpi) = self.lpis.get_mut(&intid) else {
            return VcpuSet::EMPTY;
        };
        lpi.vcpu = vcpu;
        lpi.collection = collection;
        if !enabled {
            lpi.irq.clear_pending();
        }
        before.union(self.kicks_for(0, intid))
    }

    /// The mapped LPIs matching `filter`, by INTID.
    pub(crate) fn lpis_where(&self, filter: impl Fn(&Lpi) -> bool) -> alloc::vec::Vec<u32> {
        self.lpis
            .iter()
            .filter(|(_, lpi)| lpi.mapped && filter(lpi))
            .map(|(&intid, _)| intid)
            .collect()
    }
}
