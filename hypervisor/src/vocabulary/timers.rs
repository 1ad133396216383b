//! The guest's two EL1 timers as every layer names them ([`TimerId`]), the
//! INTIDs the guest sees for them, and the host device tree's timer
//! interrupts ([`TimerIrqs`]). A leaf: it imports nothing of the crate, so
//! the platform parser, the host GIC driver and the timer forwarding
//! (`devices::timer`) share it without depending on each other.

/// First PPI INTID.
const FIRST_PPI: u32 = 16;
/// First SPI INTID (one past the last PPI).
const FIRST_SPI: u32 = 32;
/// Virtual timer PPI (`CNTV_*`).
pub const VTIMER_INTID: u32 = 27;
/// EL1 physical timer PPI (`CNTP_*`).
pub const PTIMER_INTID: u32 = 30;

/// The architected timer's interrupts (PPI numbers as INTIDs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerIrqs {
    /// Secure physical timer.
    pub secure_phys: u32,
    /// Non-secure physical timer.
    pub phys: u32,
    /// Virtual timer.
    pub virt: u32,
    /// Hypervisor (EL2) physical timer.
    pub hyp_phys: u32,
}

/// One of the guest's EL1 timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerId {
    /// The virtual timer (`CNTV_*_EL0`), counting `CNTVCT_EL0`.
    Virtual,
    /// The EL1 physical timer (`CNTP_*_EL0`), counting `CNTPCT_EL0`.
    Physical,
}

impl TimerId {
    /// Both timers, in [`TimerId::index`] order.
    pub const ALL: [TimerId; 2] = [TimerId::Virtual, TimerId::Physical];

    /// Position in per-timer arrays.
    pub const fn index(self) -> usize {
        match self {
            TimerId::Virtual => 0,
            TimerId::Physical => 1,
        }
    }

    /// The INTID the guest gets for this timer (what its device tree names:
    /// PPI 11 and PPI 14).
    pub const fn guest_intid(self) -> u32 {
        match self {
            TimerId::Virtual => VTIMER_INTID,
            TimerId::Physical => PTIMER_INTID,
        }
    }

    /// The timer's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            TimerId::Virtual => "virtual",
            TimerId::Physical => "physical",
        }
    }

    /// The host PPI of this timer: the host device tree's (`virt`, `phys`)
    /// when it is a PPI (16..=31), else the INTID that QEMU `virt` and Arm's
    /// recommendations use (the guest's own).
    pub fn host_intid(self, irqs: Option<TimerIrqs>) -> u32 {
        let named = irqs.map(|irqs| match self {
            TimerId::Virtual => irqs.virt,
            TimerId::Physical => irqs.phys,
        });
        named
            .filter(|intid| (FIRST_PPI..FIRST_SPI).contains(intid))
            .unwrap_or(self.guest_intid())
    }
}
