//! INTID classes and the state of one virtual interrupt.
//!
//! Every interrupt the virtual GIC knows (16 SGIs and 16 PPIs per vCPU, the
//! configured SPIs) has one `IrqState`. Its pending state is the OR of a
//! latch (set by an edge, `ISPENDR` or an SGI) and, for level-sensitive
//! interrupts, the input line. While an interrupt sits in a list register the
//! list register is the authoritative copy of its pending and active state; the
//! changes made meanwhile by other agents (a new edge, `ICPENDR`, `ISACTIVER`)
//! are recorded beside the state and merged when the list register is folded
//! back, so nothing a guest or a device does while the interrupt is listed is
//! lost.
//!
//! The fold also tells apart the two ways an interrupt becomes active: the
//! guest acknowledging it through its CPU interface (the list register was
//! written pending and comes back active only) puts it *in service*, and the
//! priority it was taken at is recorded, because the guest's active-priority
//! registers now hold that priority until its EOI; an `ISACTIVER` write only
//! sets the active bit. An in-service interrupt leaves service when a list
//! register that held it active comes back inactive (the guest's EOI or
//! deactivation) or when `ICH_HCR_EL2.EOIcount` counts an EOI of it while it
//! was not listed.
//!
//! A GICv2 guest's SGIs are pending once per source CPU (`GICD_SPENDSGIR`):
//! `sgi_sources` holds the sources, the list register carries one of them
//! (`listed_source`), and its acknowledgement retires only that one; the
//! latch stays set while other sources remain. A GICv3 guest's SGIs have no
//! sources (`sgi_sources` stays 0).

/// Number of software-generated interrupts (INTIDs 0..=15).
pub const SGI_COUNT: u32 = 16;
/// Number of private interrupts per vCPU: SGIs and PPIs (INTIDs 0..=31).
pub const PRIVATE_COUNT: u32 = 32;
/// First shared peripheral interrupt.
pub const FIRST_SPI: u32 = 32;
/// Largest INTID an SPI may have (1020..=1023 are special).
pub const MAX_SPI_INTID: u32 = 1019;
pub use crate::vocabulary::timers::{PTIMER_INTID, VTIMER_INTID};
/// Priority bits kept by the priority registers: five, the minimum every
/// virtual CPU interface implements, so a priority the guest reads back is one
/// the list registers can carry unchanged.
pub const PRIORITY_MASK: u8 = 0xf8;

/// The class of an INTID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntIdClass {
    /// Software-generated interrupt, 0..=15, private to a vCPU.
    Sgi,
    /// Private peripheral interrupt, 16..=31.
    Ppi,
    /// Shared peripheral interrupt, 32..=1019.
    Spi,
}

impl IntIdClass {
    /// The class of `intid`, or `None` for special and LPI INTIDs.
    pub const fn of(intid: u32) -> Option<Self> {
        match intid {
            0..SGI_COUNT => Some(Self::Sgi),
            SGI_COUNT..PRIVATE_COUNT => Some(Self::Ppi),
            FIRST_SPI..=MAX_SPI_INTID => Some(Self::Spi),
            _ => None,
        }
    }
}

/// How the interrupt's input is sampled (`ICFGR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Pending while the line is high (or the latch is set).
    Level,
    /// A rising edge latches the pending state.
    Edge,
}

/// State of one virtual interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IrqState {
    /// Group 1 (`IGROUPR` bit set) or group 0.
    pub group1: bool,
    /// Forwarding enabled (`ISENABLER`).
    pub enabled: bool,
    /// Latched pending state: edges, `ISPENDR`, SGIs.
    pub pending_latch: bool,
    /// The input line of a level-sensitive source.
    pub line_level: bool,
    /// Active state as last known outside the list registers.
    pub active: bool,
    /// Priority, lower is more urgent, masked by [`PRIORITY_MASK`].
    pub priority: u8,
    /// Level or edge.
    pub trigger: Trigger,
    /// The vCPU whose list registers hold this interrupt, if any.
    pub listed_on: Option<u16>,
    /// The list register was written with the pending bit set.
    pub listed_pending: bool,
    /// The interrupt was made pending while listed.
    pub pended_while_listed: bool,
    /// The list register was written with the active bit set.
    pub listed_active: bool,
    /// The list register was written as a hardware interrupt (HW = 1): the
    /// guest's deactivation through it also deactivates the physical one.
    pub listed_hw: bool,
    /// `ISACTIVER`/`ICACTIVER` wrote `active` while listed: it wins over the
    /// list register's active bit at fold time.
    pub active_written_while_listed: bool,
    /// The guest acknowledged it through the CPU interface and has not
    /// completed it: the priority it was taken at (what the guest's
    /// active-priority registers hold for it). `ICACTIVER` clears `active`
    /// but not this: the guest still owes the EOI that drops the priority.
    pub in_service: Option<u8>,
    /// The vCPU that took it (while `in_service`): a shared interrupt
    /// stays with that vCPU until the guest completes it there, however it
    /// is routed meanwhile, as on a GIC (only that CPU interface can
    /// deactivate it; KVM's `vgic_target_oracle` does the same).
    pub taken_on: Option<u16>,
    /// GICv2 SGIs: the CPUs it is pending from (bit n = vCPU n).
    pub sgi_sources: u8,
    /// GICv2 SGIs: sources added while listed (an acknowledgement of the
    /// listed source does not retire these).
    pub sources_while_listed: u8,
    /// GICv2 SGIs: the source the list register names.
    pub listed_source: Option<u8>,
    /// GICv2 SGIs: the source of the instance the guest acknowledged and has
    /// not completed (its list register must name it again, or the guest's
    /// EOI would not match).
    pub active_source: Option<u8>,
}

impl IrqState {
    /// Reset state: group 0, disabled, idle, priority 0.
    pub const fn new(trigger: Trigger) -> Self {
        Self {
            group1: false,
            enabled: false,
            pending_latch: false,
            line_level: false,
            active: false,
            priority: 0,
            trigger,
            listed_on: None,
            listed_pending: false,
            pended_while_listed: false,
            listed_active: false,
            listed_hw: false,
            active_written_while_listed: false,
            in_service: None,
            taken_on: None,
            sgi_sources: 0,
            sources_while_listed: 0,
            listed_source: None,
            active_source: None,
        }
    }

    /// A GICv2 SGI from vCPU `source` (0..=7): pending from that source.
    pub fn pend_from(&mut self, source: u8) {
        let bit = 1 << (source & 7);
        self.sgi_sources |= bit;
        if self.listed_on.is_some() {
            self.sources_while_listed |= bit;
        }
        self.set_pending();
    }

    /// `GICD_CPENDSGIR`: no longer pending from the sources in `mask`;
    /// the latch clears with the last source.
    pub fn clear_sources(&mut self, mask: u8) {
        self.sgi_sources &= !mask;
        self.sources_while_listed &= !mask;
        if self.sgi_sources == 0 {
            self.clear_pending();
        }
    }

    /// The source a list register should name now (the lowest).
    pub fn next_source(&self) -> Option<u8> {
        (self.sgi_sources != 0).then(|| self.sgi_sources.trailing_zeros() as u8)
    }

    /// Pending as the architecture defines it (latch, or line for level).
    pub const fn pending(&self) -> bool {
        self.pending_latch || (matches!(self.trigger, Trigger::Level) && self.line_level)
    }

    /// Latches the pending state (edge, `ISPENDR`, SGI).
    pub fn set_pending(&mut self) {
        self.pending_latch = true;
        if self.listed_on.is_some() {
            self.pended_while_listed = true;
        }
    }

    /// `ICPENDR`: clears the latch; a level interrupt whose line is high stays
    /// pending.
    pub fn clear_pending(&mut self) {
        self.pending_latch = false;
        self.pended_while_listed = false;
        self.sgi_sources = 0;
        self.sources_while_listed = 0;
    }

    /// Drives the input line. A rising edge latches an edge-triggered
    /// interrupt. Returns whether the interrupt became pending.
    pub fn set_line(&mut self, level: bool) -> bool {
        let was_pending = self.pending();
        let rising = level && !self.line_level;
        self.line_level = level;
        if rising && self.trigger == Trigger::Edge {
            self.set_pending();
        }
        !was_pending && self.pending()
    }

    /// `ISACTIVER`/`ICACTIVER`.
    pub fn write_active(&mut self, active: bool) {
        self.active = active;
        if self.listed_on.is_some() {
            self.active_written_while_listed = true;
        }
    }

    /// Records that a list register now holds the interrupt, with the
    /// pending and active bits as written.
    pub fn list(&mut self, vcpu: u16, pending: bool, active: bool) {
        self.listed_on = Some(vcpu);
        self.listed_pending = pending;
        self.listed_active = active;
    }

    /// Merges the state a list register reports back (its pending and active
    /// bits and the priority it carried) and marks the interrupt unlisted.
    /// The latch is consumed when the guest acknowledged the interrupt
    /// (listed pending, no longer pending), unless it was set again while
    /// listed; a level interrupt's line is untouched, so one whose line is
    /// still high is pending again after its EOI. An acknowledged interrupt
    /// that is still active goes in service at `lr_priority`; one listed
    /// active (or acknowledged) that comes back inactive was completed.
    pub fn fold(&mut self, lr_pending: bool, lr_active: bool, lr_priority: u8) {
        let acknowledged = self.listed_pending && !lr_pending;
        self.pending_latch = (self.pending_latch && !acknowledged) || self.pended_while_listed;
        if let Some(source) = self.listed_source.take() {
            if acknowledged {
                self.sgi_sources &= !(1 << source) | self.sources_while_listed;
                if lr_active {
                    self.active_source = Some(source);
                }
            }
            self.pending_latch = self.sgi_sources != 0;
        }
        self.sources_while_listed = 0;
        if acknowledged && lr_active {
            self.in_service = Some(lr_priority);
            self.taken_on = self.listed_on;
        } else if (self.listed_active || acknowledged) && !lr_active {
            self.in_service = None;
            self.taken_on = None;
        }
        if !self.active_written_while_listed {
            self.active = lr_active;
        }
        if !self.active {
            self.active_source = None;
        }
        self.listed_on = None;
        self.listed_pending = false;
        self.listed_active = false;
        self.listed_hw = false;
        self.pended_while_listed = false;
        self.active_written_while_listed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(IntIdClass::of(0), Some(IntIdClass::Sgi));
        assert_eq!(IntIdClass::of(15), Some(IntIdClass::Sgi));
        assert_eq!(IntIdClass::of(16), Some(IntIdClass::Ppi));
        assert_eq!(IntIdClass::of(31), Some(IntIdClass::Ppi));
        assert_eq!(IntIdClass::of(32), Some(IntIdClass::Spi));
        assert_eq!(IntIdClass::of(1019), Some(IntIdClass::Spi));
        assert_eq!(IntIdClass::of(1020), None);
        assert_eq!(IntIdClass::of(8192), None);
    }

    #[test]
    fn level_pending_follows_line_and_latch() {
        let mut irq = IrqState::new(Trigger::Level);
        assert!(irq.set_line(true));
        assert!(irq.pending());
        irq.clear_pending();
        assert!(irq.pending(), "ICPENDR cannot clear a high level line");
        irq.set_line(false);
        assert!(!irq.pending());
        irq.set_pending();
        assert!(irq.pending());
        irq.clear_pending();
        assert!(!irq.pending());
    }

    #[test]
    fn edge_latches_rising_edges_only() {
        let mut irq = IrqState::new(Trigger::Edge);
        assert!(irq.set_line(true));
        irq.clear_pending();
        assert!(!irq.set_line(true), "no edge while the line stays high");
        assert!(!irq.pending());
        irq.set_line(false);
        assert!(!irq.pending());
        assert!(irq.set_line(true));
    }

    #[test]
    fn fold_merges_changes_made_while_listed() {
        // Edge acknowledged by the guest, a new edge arrived meanwhile.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true, false);
        irq.set_pending();
        irq.fold(false, true, 0x40);
        assert!(irq.pending() && irq.active && irq.listed_on.is_none());
        assert_eq!(irq.in_service, Some(0x40), "acknowledged: in service");

        // Edge acknowledged, nothing new: latch consumed.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true, false);
        irq.fold(false, true, 0);
        assert!(!irq.pending() && irq.active && irq.in_service.is_some());
        // Listed active, completed by the guest: out of service.
        irq.list(0, false, true);
        irq.fold(false, false, 0);
        assert!(!irq.active && irq.in_service.is_none());

        // ICPENDR while listed and not yet acknowledged: cancelled.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true, false);
        irq.clear_pending();
        irq.fold(true, false, 0);
        assert!(!irq.pending() && irq.in_service.is_none());

        // ICACTIVER while listed wins over the list register; the guest
        // still owes the EOI of the instance it took.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true, false);
        irq.write_active(false);
        irq.fold(false, true, 0x10);
        assert!(!irq.active && irq.in_service == Some(0x10));

        // ISACTIVER: active, never in service.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.write_active(true);
        irq.list(0, false, true);
        irq.fold(false, true, 0);
        assert!(irq.active && irq.in_service.is_none());

        // Latched while listed active only (not pending): the empty list
        // register did not consume it.
        let mut irq = IrqState::new(Trigger::Level);
        irq.active = true;
        irq.list(0, false, true);
        irq.set_pending();
        irq.fold(false, false, 0);
        assert!(irq.pending() && !irq.active);
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, false, false);
        irq.fold(false, false, 0);
        assert!(irq.pending(), "listed without pending: latch kept");

        // Level, EOI'd with the line still high: pending again.
        let mut irq = IrqState::new(Trigger::Level);
        irq.set_line(true);
        irq.list(0, true, false);
        irq.fold(false, false, 0);
        assert!(irq.pending() && !irq.active && irq.in_service.is_none());
    }
}
