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
//!    exit. [`TimerForward::fired`]: mask that PPI at the host redistributor
//!    (the level would otherwise fire again at once; the guest's `CNTx_CTL_EL0`
//!    is never touched) and raise the vCPU's virtual PPI line in the vgic
//!    (INTID 27 or 30, [`TimerId::guest_intid`](crate::vocabulary::timers::TimerId::guest_intid)).
//! 2. Before every entry, [`TimerForward::sample`] reads the line again from
//!    the guest's `CNTx_CTL_EL0` ([`timer_line`]: ENABLE and ISTATUS set,
//!    IMASK clear) and tells the vgic only when it moved.
//!    The vgic withdraws a level interrupt whose line dropped before the
//!    guest acknowledged it (a pending list register is taken back at the
//!    refill), so an interrupt pending while the guest had IRQs masked does
//!    not outlive the guest disabling, masking or reprogramming its timer.
//!    Every exit re-samples, and a trapped physical timer access is an exit:
//!    a guest that turns its physical timer off and then unmasks IRQs never
//!    takes its stale INTID 30. The virtual timer's registers cannot trap
//!    without FEAT_ECV (`CNTHCTL_EL2.EL1TVT`): its line is re-sampled at the
//!    next exit of any kind (KVM does the same), so a guest that disables it
//!    and unmasks IRQs with no exit in between may still take INTID 27 once
//!    (spurious to it: the handler finds the timer off).
//! 3. After the list registers are refilled, [`TimerForward::unmask_if_low`]
//!    unmasks the host PPI once the line is low: the guest has handled the
//!    interrupt (disabled, masked or re-armed the timer). The exit that lets
//!    the hypervisor see this is guaranteed: a level interrupt is listed with
//!    EOI maintenance, so the guest's EOI raises the maintenance interrupt.
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

/// What a vCPU's run loop does when the timer's host PPI fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fired {
    /// Mask the host PPI (it was not masked yet).
    pub mask_host: bool,
    /// Drive the guest's virtual PPI line high (the vgic last heard low, or
    /// nothing since the load).
    pub raise_line: bool,
}

/// One timer's forwarding state on one vCPU. See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerForward {
    /// The host PPI is masked at the redistributor.
    host_masked: bool,
    /// The line as last given to the vgic; `None` after a load.
    line: Option<bool>,
}

impl Default for TimerForward {
    fn default() -> Self {
        Self::new()
    }
}

impl TimerForward {
    /// The state after a load: host PPI unmasked, the vgic told nothing.
    pub const fn new() -> Self {
        Self {
            host_masked: false,
            line: None,
        }
    }

    /// Whether the host PPI is masked now.
    pub const fn host_masked(&self) -> bool {
        self.host_masked
    }

    /// The line as the vgic last heard it.
    pub const fn line(&self) -> Option<bool> {
        self.line
    }

    /// The timer's host PPI fired: its line is high.
    pub fn fired(&mut self) -> Fired {
        let fired = Fired {
            mask_host: !self.host_masked,
            raise_line: self.line != Some(true),
        };
        self.host_masked = true;
        self.line = Some(true);
        fired
    }

    /// Whether the line must be re-sampled before an entry: unless it is
    /// known low with the host PPI unmasked. Then a rise needs no sampling:
    /// the PPI itself fires (before or right after the entry) and
    /// [`fired`](Self::fired) raises the line, so the entry saves reading
    /// the guest's timer control.
    pub fn needs_sample(&self) -> bool {
        self.host_masked || self.line != Some(false)
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

    /// After the refill: whether to unmask the host PPI now (it is masked
    /// and the line was sampled low).
    pub fn unmask_if_low(&mut self) -> bool {
        if self.host_masked && self.line == Some(false) {
            self.host_masked = false;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::timers::{TimerId, TimerIrqs};

    #[test]
    fn sampling_is_needed_until_the_line_is_low_and_the_ppi_unmasked() {
        let mut timer = TimerForward::new();
        assert!(timer.needs_sample(), "after a load the vgic knows nothing");
        assert_eq!(timer.sample(false), Some(false));
        assert!(
            !timer.needs_sample(),
            "low and unmasked: the PPI reports a rise"
        );
        let fired = timer.fired();
        assert!(fired.mask_host && fired.raise_line);
        assert!(
            timer.needs_sample(),
            "high and masked: only sampling sees it drop"
        );
        assert_eq!(timer.sample(false), Some(false));
        assert!(
            timer.needs_sample(),
            "low but still masked until unmask_if_low"
        );
        assert!(timer.unmask_if_low());
        assert!(!timer.needs_sample());
    }

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
    fn fire_mask_handle_unmask() {
        let mut t = TimerForward::new();
        // First entry: the line is low, the vgic hears it once.
        assert_eq!(t.sample(false), Some(false));
        assert_eq!(t.sample(false), None);
        assert!(!t.unmask_if_low(), "never masked");
        // The host PPI fires: mask it, raise the line.
        assert_eq!(
            t.fired(),
            Fired {
                mask_host: true,
                raise_line: true
            }
        );
        assert!(t.host_masked());
        // Entries while the guest has not handled it: nothing to do.
        assert_eq!(t.sample(true), None);
        assert!(!t.unmask_if_low());
        assert!(t.host_masked());
        // The guest masked or disabled the timer: line low, PPI unmasked.
        assert_eq!(t.sample(false), Some(false));
        assert!(t.unmask_if_low());
        assert!(!t.host_masked());
        assert!(!t.unmask_if_low(), "once");
    }

    #[test]
    fn line_seen_high_before_the_ppi_fires() {
        // The guest armed a timer that expired while the CPU was at EL2: the
        // sample raises the line; the PPI then fires on entry and only masks.
        let mut t = TimerForward::new();
        assert_eq!(t.sample(true), Some(true));
        assert_eq!(
            t.fired(),
            Fired {
                mask_host: true,
                raise_line: false
            }
        );
        // A second PPI cannot come while masked, but if the acknowledge
        // raced with the mask the state stays consistent.
        assert_eq!(
            t.fired(),
            Fired {
                mask_host: false,
                raise_line: false
            }
        );
        assert_eq!(t.line(), Some(true));
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
    fn disabling_a_pending_timer_drops_the_line_at_the_next_sample() {
        // The physical timer fired while the guest had IRQs masked: the line
        // is high and the host PPI masked. The guest's trapped
        // `CNTP_CTL_EL0 = 0` is an exit; the sample before the entry reads
        // the line low and tells the vgic (which withdraws the pending
        // interrupt), and the host PPI is unmasked for the next arming.
        let mut t = TimerForward::new();
        assert_eq!(t.sample(false), Some(false));
        t.fired();
        let ctl_after_disable = 0;
        assert_eq!(t.sample(timer_line(ctl_after_disable)), Some(false));
        assert!(t.unmask_if_low());
        // Masked (IMASK) or reprogrammed to a later CVAL (ISTATUS clear):
        // the line is low as well.
        for ctl_value in [ctl::ENABLE | ctl::IMASK | ctl::ISTATUS, ctl::ENABLE] {
            let mut t = TimerForward::new();
            t.sample(false);
            t.fired();
            assert_eq!(t.sample(timer_line(ctl_value)), Some(false));
            assert!(t.unmask_if_low());
        }
    }

    #[test]
    fn reload_forgets_everything() {
        let mut t = TimerForward::new();
        t.fired();
        t = TimerForward::new();
        assert!(!t.host_masked());
        assert_eq!(t.line(), None);
        assert_eq!(t.sample(false), Some(false));
    }

    #[test]
    fn timers_are_independent() {
        let mut timers = [TimerForward::new(); 2];
        timers[TimerId::Physical.index()].fired();
        assert!(timers[TimerId::Physical.index()].host_masked());
        assert!(!timers[TimerId::Virtual.index()].host_masked());
        assert_eq!(timers[TimerId::Virtual.index()].sample(false), Some(false));
        assert_eq!(timers[TimerId::Physical.index()].sample(true), None);
    }
}
