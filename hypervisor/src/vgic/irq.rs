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

/// Number of software-generated interrupts (INTIDs 0..=15).
pub const SGI_COUNT: u32 = 16;
/// Number of private interrupts per vCPU: SGIs and PPIs (INTIDs 0..=31).
pub const PRIVATE_COUNT: u32 = 32;
/// First shared peripheral interrupt.
pub const FIRST_SPI: u32 = 32;
/// Largest INTID an SPI may have (1020..=1023 are special).
pub const MAX_SPI_INTID: u32 = 1019;
/// Virtual timer PPI (`CNTV_*`).
pub const VTIMER_INTID: u32 = 27;
/// EL1 physical timer PPI (`CNTP_*`).
pub const PTIMER_INTID: u32 = 30;
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
    /// `ISACTIVER`/`ICACTIVER` wrote `active` while listed: it wins over the
    /// list register's active bit at fold time.
    pub active_written_while_listed: bool,
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
            active_written_while_listed: false,
        }
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
    /// pending bit set or not.
    pub fn list(&mut self, vcpu: u16, pending: bool) {
        self.listed_on = Some(vcpu);
        self.listed_pending = pending;
    }

    /// Merges the state a list register reports back and marks the interrupt
    /// unlisted. The latch is consumed when the guest acknowledged the
    /// interrupt (listed pending, no longer pending), unless it was set again
    /// while listed; a level interrupt's line is untouched, so one whose line
    /// is still high is pending again after its EOI.
    pub fn fold(&mut self, lr_pending: bool, lr_active: bool) {
        let acknowledged = self.listed_pending && !lr_pending;
        self.pending_latch = (self.pending_latch && !acknowledged) || self.pended_while_listed;
        if !self.active_written_while_listed {
            self.active = lr_active;
        }
        self.listed_on = None;
        self.listed_pending = false;
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
        irq.list(0, true);
        irq.set_pending();
        irq.fold(false, true);
        assert!(irq.pending() && irq.active && irq.listed_on.is_none());

        // Edge acknowledged, nothing new: latch consumed.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true);
        irq.fold(false, true);
        assert!(!irq.pending() && irq.active);

        // ICPENDR while listed and not yet acknowledged: cancelled.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, true);
        irq.clear_pending();
        irq.fold(true, false);
        assert!(!irq.pending());

        // ICACTIVER while listed wins over the list register.
        let mut irq = IrqState::new(Trigger::Edge);
        irq.active = true;
        irq.list(0, true);
        irq.write_active(false);
        irq.fold(false, true);
        assert!(!irq.active);

        // Latched while listed active only (not pending): the empty list
        // register did not consume it.
        let mut irq = IrqState::new(Trigger::Level);
        irq.active = true;
        irq.list(0, false);
        irq.set_pending();
        irq.fold(false, false);
        assert!(irq.pending() && !irq.active);
        let mut irq = IrqState::new(Trigger::Edge);
        irq.set_pending();
        irq.list(0, false);
        irq.fold(false, false);
        assert!(irq.pending(), "listed without pending: latch kept");

        // Level, EOI'd with the line still high: pending again.
        let mut irq = IrqState::new(Trigger::Level);
        irq.set_line(true);
        irq.list(0, true);
        irq.fold(false, false);
        assert!(irq.pending() && !irq.active);
    }
}
