//! The guest's two EL1 timers and how their interrupts reach it.
//!
//! A vCPU never leaves its physical CPU, and the hypervisor itself uses no
//! timer (the EL2 physical timer, `CNTHP_*`, stays off and its PPI disabled),
//! so the guest owns both of the CPU's EL1 timers outright: its
//! `CNTV_*_EL0` and `CNTP_*_EL0` are the CPU's own. The virtual timer's
//! registers and both counters are untrapped (`CNTHCTL_EL2.EL1PCTEN` set);
//! the physical timer's registers trap (`EL1PCEN` clear,
//! [`PhysicalTimerReg`]) and the hypervisor performs the access on the same
//! register, so nothing drifts. What the hypervisor adds is the delivery of
//! each timer's interrupt through the virtual GIC, the same way for both
//! ([`TimerId`](crate::vocabulary::timers::TimerId)):
//!
//! 1. The timer's host PPI (from the host device tree: 27 virtual, 30
//!    physical on QEMU `virt`) fires while the guest runs and becomes an IRQ
//!    exit. The hypervisor only drops its priority (the host GIC runs with
//!    `EOImode` 1): the PPI stays *active*, so its level cannot fire again,
//!    and [`TimerForward::fired`] raises the vCPU's virtual PPI line in the
//!    vgic (INTID 27 or 30, [`TimerId::guest_intid`](crate::vocabulary::timers::TimerId::guest_intid)).
//!    The guest's `CNTx_CTL_EL0` is never touched.
//! 2. The vgic lists the interrupt as a *hardware* interrupt
//!    (`ICH_LR<n>_EL2.HW` with the host PPI as pINTID): when the guest
//!    deactivates it, the CPU interface deactivates the host PPI as well, with
//!    no exit. If the guest's handler left the line high, the PPI fires again
//!    at once; if it turned the timer off or re-armed it, nothing happens until
//!    it expires again. One exit per timer interrupt, none for its end.
//! 3. Before every entry while the line may be high, [`TimerForward::sample`]
//!    reads the line again from the guest's `CNTx_CTL_EL0` ([`timer_line`]:
//!    ENABLE and ISTATUS set, IMASK clear) and tells the vgic only when it
//!    moved. The vgic withdraws a level interrupt whose line dropped before
//!    the guest acknowledged it (a pending list register is taken back at the
//!    refill), so an interrupt pending while the guest had IRQs masked does
//!    not outlive the guest disabling, masking or reprogramming its timer.
//!    Every exit re-samples, and a trapped physical timer access is an exit:
//!    a guest that turns its physical timer off and then unmasks IRQs never
//!    takes its stale INTID 30. The virtual timer's registers cannot trap
//!    without FEAT_ECV (`CNTHCTL_EL2.EL1TVT`): its line is re-sampled at the
//!    next exit of any kind (KVM does the same), so a guest that disables it
//!    and unmasks IRQs with no exit in between may still take INTID 27 once
//!    (spurious to it: the handler finds the timer off).
//! 4. After each refill, [`TimerForward::after_fill`] settles who deactivates
//!    the host PPI. The refill's fold reports the hardware list registers the
//!    guest deactivated (the host PPI is inactive again). Any other way the
//!    virtual interrupt ends, with the host PPI still active, makes the
//!    hypervisor deactivate it (`GICR_ICACTIVER0`): a withdrawal, a guest's
//!    `ICACTIVER` or `ICPENDR` write, an EOI the guest made while the
//!    interrupt had no list register, or a listing without the HW bit (when
//!    the fill needs EOI maintenance on it). Otherwise the host PPI would
//!    stay active and the timer silent for good.
//!
//! A PPI that fired in the same exit as the fold that reports a completion
//! is a new activation (the old one was deactivated, or the PPI could not
//! have fired), so the completion does not clear it.
//!
//! Offsets: `CNTVOFF_EL2` is zero and `CNTHCTL_EL2.ECV` is clear, so
//! `CNTPOFF_EL2` (FEAT_ECV) is never applied: the guest's `CNTPCT_EL0` and
//! `CNTVCT_EL0` both read the machine's physical count, equal to each other,
//! monotonic, and the same on every vCPU. This holds on CPUs without
//! FEAT_ECV (Cortex-A57, QEMU 7.2 `-cpu max`) as on those with it.

use crate::vocabulary::sysreg_encoding::SysRegEncoding;

/// `CNTV_CTL_EL0` / `CNTP_CTL_EL0` fields (one layout for both timers).
pub mod ctl {
    /// `ENABLE`: the timer is on.
    pub const ENABLE: u64 = 1 << 0;
    /// `IMASK`: the timer's interrupt output is masked.
    pub const IMASK: u64 = 1 << 1;
    /// `ISTATUS` (read-only): the timer condition is met.
    pub const ISTATUS: u64 = 1 << 2;
}

/// An EL1 physical timer register, trapped to EL2 (`CNTHCTL_EL2.EL1PCEN`
/// clear) and accessed there on the guest's behalf: at EL2 without VHE the
/// same instruction reaches the same EL1 physical timer, and `TVAL` keeps
/// its meaning (relative to `CNTPCT_EL0`, whose offset is zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhysicalTimerReg {
    /// `CNTP_TVAL_EL0` (`op0 3, op1 3, CRn 14, CRm 2, op2 0`).
    Tval,
    /// `CNTP_CTL_EL0` (`op2 1`).
    Ctl,
    /// `CNTP_CVAL_EL0` (`op2 2`).
    Cval,
}

impl PhysicalTimerReg {
    /// The register `reg` names, if it is one of the three.
    pub const fn from_encoding(reg: SysRegEncoding) -> Option<Self> {
        if reg.op0 != 3 || reg.op1 != 3 || reg.crn != 14 || reg.crm != 2 {
            return None;
        }
        match reg.op2 {
            0 => Some(Self::Tval),
            1 => Some(Self::Ctl),
            2 => Some(Self::Cval),
            _ => None,
        }
    }
}

/// The timer's interrupt output: high while the timer is enabled, its
/// condition is met and the guest has not masked it.
pub const fn timer_line(ctl_value: u64) -> bool {
    ctl_value & (ctl::ENABLE | ctl::IMASK | ctl::ISTATUS) == ctl::ENABLE | ctl::ISTATUS
}

/// One timer's forwarding state on one vCPU. See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerForward {
    /// The host PPI is active: acknowledged and its priority dropped here,
    /// not deactivated since (by the guest or the hypervisor).
    host_active: bool,
    /// `host_active` was set by [`fired`](Self::fired) after the last
    /// [`after_fill`](Self::after_fill).
    fired_since_fill: bool,
    /// The line as last given to the vgic; `None` after a load.
    line: Option<bool>,
}

impl Default for TimerForward {
    fn default() -> Self {
        Self::new()
    }
}

impl TimerForward {
    /// The state after a load: host PPI inactive, the vgic told nothing.
    pub const fn new() -> Self {
        Self {
            host_active: false,
            fired_since_fill: false,
            line: None,
        }
    }

    /// Whether the host PPI is active now (as far as the hypervisor knows).
    pub const fn host_active(&self) -> bool {
        self.host_active
    }

    /// The line as the vgic last heard it.
    pub const fn line(&self) -> Option<bool> {
        self.line
    }

    /// The timer's host PPI fired (and its priority was dropped): it is
    /// active and its line is high. Returns whether to drive the guest's
    /// virtual PPI line high (the vgic last heard low, or nothing since the
    /// load).
    pub fn fired(&mut self) -> bool {
        let raise = self.line != Some(true);
        self.host_active = true;
        self.fired_since_fill = true;
        self.line = Some(true);
        raise
    }

    /// Whether the line must be re-sampled before an entry: unless it is
    /// known low. A rise needs no sampling: the PPI itself fires (before or
    /// right after the entry, or once the guest deactivated its previous
    /// interrupt) and [`fired`](Self::fired) raises the line, so the entry
    /// saves reading the guest's timer control.
    pub fn needs_sample(&self) -> bool {
        self.line != Some(false)
    }

    /// Before an entry, with `line` read from the guest's `CNTx_CTL_EL0`:
    /// the level to give the vgic, when it differs from what it last heard.
    pub fn sample(&mut self, line: bool) -> Option<bool> {
        if self.line == Some(line) {
            None
        } else {
            self.line = Some(line);
            Some(line)
        }
    }

    /// After a refill: `completed` when the refill's fold (or one since the
    /// last refill) found a hardware list register of this timer deactivated
    /// by the guest, `idle` when the vgic now holds the interrupt neither
    /// pending nor active. Returns whether the hypervisor must deactivate the
    /// host PPI now (it is active and the guest will not deactivate it).
    pub fn after_fill(&mut self, completed: bool, idle: bool) -> bool {
        let fresh = core::mem::take(&mut self.fired_since_fill);
        if completed && !fresh {
            self.host_active = false;
        }
        if self.host_active && idle {
            self.host_active = false;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::timers::{TimerId, TimerIrqs};

    #[test]
    fn line_needs_enable_and_status_without_mask() {
        assert!(!timer_line(0));
        assert!(!timer_line(ctl::ENABLE));
        assert!(timer_line(ctl::ENABLE | ctl::ISTATUS));
        assert!(!timer_line(ctl::ENABLE | ctl::ISTATUS | ctl::IMASK));
        assert!(!timer_line(ctl::ISTATUS));
        assert!(!timer_line(ctl::ISTATUS | ctl::IMASK));
        // Bits above ISTATUS are RES0 and do not matter.
        assert!(timer_line(ctl::ENABLE | ctl::ISTATUS | 1 << 3));
    }

    #[test]
    fn each_timer_has_its_guest_ppi_and_host_ppi() {
        assert_eq!(TimerId::Virtual.guest_intid(), 27);
        assert_eq!(TimerId::Physical.guest_intid(), 30);
        for (i, timer) in TimerId::ALL.into_iter().enumerate() {
            assert_eq!(timer.index(), i);
        }
        let irqs = TimerIrqs {
            secure_phys: 29,
            phys: 30,
            virt: 27,
            hyp_phys: 26,
        };
        assert_eq!(TimerId::Virtual.host_intid(Some(irqs)), 27);
        assert_eq!(TimerId::Physical.host_intid(Some(irqs)), 30);
        // A host whose PPIs differ: the host's are used on the host side.
        let other = TimerIrqs {
            phys: 23,
            virt: 24,
            ..irqs
        };
        assert_eq!(TimerId::Virtual.host_intid(Some(other)), 24);
        assert_eq!(TimerId::Physical.host_intid(Some(other)), 23);
        assert_eq!(TimerId::Physical.host_intid(None), 30);
        // Not a PPI: the default, never a shift past the 32-bit masks.
        let broken = TimerIrqs {
            phys: 40,
            virt: 3,
            ..irqs
        };
        assert_eq!(TimerId::Physical.host_intid(Some(broken)), 30);
        assert_eq!(TimerId::Virtual.host_intid(Some(broken)), 27);
        assert_eq!(TimerId::Virtual.host_intid(None), 27);
    }

    #[test]
    fn physical_timer_registers_by_encoding() {
        let enc = |op0, op1, crn, crm, op2| SysRegEncoding {
            op0,
            op1,
            crn,
            crm,
            op2,
        };
        assert_eq!(
            PhysicalTimerReg::from_encoding(enc(3, 3, 14, 2, 0)),
            Some(PhysicalTimerReg::Tval)
        );
        assert_eq!(
            PhysicalTimerReg::from_encoding(enc(3, 3, 14, 2, 1)),
            Some(PhysicalTimerReg::Ctl)
        );
        assert_eq!(
            PhysicalTimerReg::from_encoding(enc(3, 3, 14, 2, 2)),
            Some(PhysicalTimerReg::Cval)
        );
        // The virtual timer (CRm 3) and the counters (CRm 0) never trap.
        assert_eq!(PhysicalTimerReg::from_encoding(enc(3, 3, 14, 3, 1)), None);
        assert_eq!(PhysicalTimerReg::from_encoding(enc(3, 3, 14, 0, 1)), None);
        assert_eq!(PhysicalTimerReg::from_encoding(enc(3, 3, 14, 2, 3)), None);
        assert_eq!(PhysicalTimerReg::from_encoding(enc(3, 0, 14, 2, 1)), None);
    }

    #[test]
    fn sampling_is_needed_until_the_line_is_known_low() {
        let mut timer = TimerForward::new();
        assert!(timer.needs_sample(), "after a load the vgic knows nothing");
        assert_eq!(timer.sample(false), Some(false));
        assert!(!timer.needs_sample(), "low: the PPI reports a rise");
        assert!(timer.fired());
        assert!(timer.needs_sample(), "high: only sampling sees it drop");
        assert_eq!(timer.sample(false), Some(false));
        assert!(!timer.needs_sample());
    }

    #[test]
    fn one_exit_per_tick_the_guest_deactivates_through_the_list_register() {
        let mut t = TimerForward::new();
        assert_eq!(t.sample(false), Some(false));
        assert!(!t.after_fill(false, true), "never active: nothing to do");
        // The host PPI fires: active, line high; the fill lists it (HW).
        assert!(t.fired());
        assert!(t.host_active());
        assert_eq!(t.sample(true), None);
        assert!(!t.after_fill(false, false));
        // The guest re-arms the timer and deactivates the list register;
        // the next exit samples the line low and the fold reports the
        // completion: the host PPI is inactive, no deactivation needed.
        assert_eq!(t.sample(false), Some(false));
        assert!(!t.after_fill(true, true));
        assert!(!t.host_active());
    }

    #[test]
    fn a_new_firing_in_the_exit_of_the_old_completion_stays_active() {
        // The guest deactivated tick 1 with the line still high: the PPI
        // fired again at once (tick 2), and the fill of that exit folds
        // tick 1's list register as completed.
        let mut t = TimerForward::new();
        t.sample(false);
        t.fired();
        assert!(!t.after_fill(false, false));
        assert!(!t.fired(), "the line is already high");
        assert!(!t.after_fill(true, false));
        assert!(t.host_active(), "tick 2 is still the guest's to deactivate");
        // Had the guest turned the timer off before the fill (the sample
        // withdraws tick 2), the hypervisor deactivates it.
        let mut t = TimerForward::new();
        t.sample(false);
        t.fired();
        t.after_fill(false, false);
        t.fired();
        assert!(t.after_fill(true, true));
        assert!(!t.host_active());
    }

    #[test]
    fn a_withdrawn_interrupt_is_deactivated_by_the_hypervisor() {
        // The physical timer fired while the guest had IRQs masked: the line
        // is high and the host PPI active. The guest's trapped
        // `CNTP_CTL_EL0 = 0` is an exit; the sample reads the line low, the
        // vgic withdraws the pending interrupt, and with no completion the
        // host PPI must be deactivated here (or it never fires again).
        let mut t = TimerForward::new();
        assert_eq!(t.sample(false), Some(false));
        t.fired();
        assert!(!t.after_fill(false, false));
        let ctl_after_disable = 0;
        assert_eq!(t.sample(timer_line(ctl_after_disable)), Some(false));
        assert!(t.after_fill(false, true));
        assert!(!t.after_fill(false, true), "once");
        // Masked (IMASK) or reprogrammed to a later CVAL (ISTATUS clear):
        // the line is low as well.
        for ctl_value in [ctl::ENABLE | ctl::IMASK | ctl::ISTATUS, ctl::ENABLE] {
            let mut t = TimerForward::new();
            t.sample(false);
            t.fired();
            t.after_fill(false, false);
            assert_eq!(t.sample(timer_line(ctl_value)), Some(false));
            assert!(t.after_fill(false, true));
        }
    }

    #[test]
    fn line_seen_high_before_the_ppi_fires() {
        // The guest armed a timer that expired while the CPU was at EL2: the
        // sample raises the line; the PPI then fires on entry and only makes
        // the host PPI active.
        let mut t = TimerForward::new();
        assert_eq!(t.sample(true), Some(true));
        assert!(!t.after_fill(false, false));
        assert!(!t.host_active());
        assert!(!t.fired());
        assert!(t.host_active());
        assert_eq!(t.line(), Some(true));
    }

    #[test]
    fn reload_forgets_everything() {
        let mut t = TimerForward::new();
        t.fired();
        t = TimerForward::new();
        assert!(!t.host_active());
        assert_eq!(t.line(), None);
        assert_eq!(t.sample(false), Some(false));
    }

    #[test]
    fn timers_are_independent() {
        let mut timers = [TimerForward::new(); 2];
        timers[TimerId::Physical.index()].fired();
        assert!(timers[TimerId::Physical.index()].host_active());
        assert!(!timers[TimerId::Virtual.index()].host_active());
        assert_eq!(timers[TimerId::Virtual.index()].sample(false), Some(false));
        assert_eq!(timers[TimerId::Physical.index()].sample(true), None);
    }
}
