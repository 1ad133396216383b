//! Where a vCPU's time at EL2 goes: exits counted and timed by class.
//!
//! The run loop reads the generic timer's physical count when the guest
//! exits and again right before it enters the guest next, and adds the
//! difference to the class of the exit that started it (the handling, the
//! kicks and the refill of the list registers before the entry all count
//! to the exit that made them necessary). The time between an entry and the
//! next exit is the guest's own, kept as [`ExitProfile::guest_ticks`]. The
//! list-register refills are counted on their own ([`Work::ListRegisterFill`],
//! their time is inside their exits'; not timed separately, since under
//! QEMU's emulation every read of the counter takes QEMU's global lock).
//!
//! Each vCPU has its own [`ExitProfile`], written only by the CPU that runs
//! the vCPU (vCPUs are pinned), so a record is a relaxed load and store of
//! that CPU's own cache line: no lock and no read-modify-write on the hot
//! path. Readers (the power-off report) sum the profiles with relaxed loads;
//! a record that races with the report is either in it or not.
//!
//! The report ([`report`]) names each line `exit_<class>_count` and
//! `exit_<class>_ticks`, then `work_<name>_count`, `guest_ticks` and
//! `ticks_per_second` (the counter's frequency), for the `STAT` lines.

use crate::drivers::gic::HostIrq;
use core::sync::atomic::{AtomicU64, Ordering};

/// What an exit was, for the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum ExitClass {
    /// A trapped WFI or WFE.
    Wfx,
    /// A trapped write (or read) of an SGI generation register: an IPI.
    SysregSgi,
    /// A trapped ID register read (`HCR_EL2.TID3`).
    SysregId,
    /// A trapped set/way cache maintenance instruction (no FWB).
    SysregSetWay,
    /// A trapped write of a virtual-memory control register (`HCR_EL2.TVM`).
    SysregVmReg,
    /// A trapped access to the EL1 physical timer (`CNTP_*_EL0`).
    SysregTimer,
    /// Any other trapped system register (read as zero, write ignored).
    SysregOther,
    /// A stage-2 fault that mapped guest RAM (data or instruction).
    Stage2Fault,
    /// An access to the emulated PL011.
    MmioUart,
    /// An access to the emulated GIC distributor or redistributors.
    MmioGic,
    /// An access to a virtio-mmio device's registers.
    MmioVirtio,
    /// An access to a passed-through device's forwarded window.
    MmioPassed,
    /// An abort injected into the guest (outside RAM and devices).
    AbortInjected,
    /// An HVC (PSCI, the hypervisor's own calls).
    Hvc,
    /// A trapped SMC.
    Smc,
    /// A physical interrupt: a kick SGI from another CPU.
    IrqKick,
    /// A physical interrupt: the vgic maintenance interrupt.
    IrqMaintenance,
    /// A physical interrupt: an EL1 timer's PPI.
    IrqTimer,
    /// A physical interrupt: the console UART.
    IrqUart,
    /// A physical interrupt: a passed-through device's SPI.
    IrqPassthrough,
    /// A physical interrupt of another kind, or a spurious one.
    IrqOther,
    /// Anything else (a failed AArch32 condition, an undefined instruction).
    Other,
}

impl ExitClass {
    /// The class of an IRQ exit whose first acknowledged interrupt is
    /// `irq`; `passed` says that an unexpected SPI belongs to a device
    /// passed to the VM. A spurious acknowledge (the interrupt went away)
    /// leaves it [`ExitClass::IrqOther`].
    pub const fn of_host_irq(irq: HostIrq, passed: bool) -> Self {
        match irq {
            HostIrq::Kick => Self::IrqKick,
            HostIrq::Maintenance => Self::IrqMaintenance,
            HostIrq::Timer(_) => Self::IrqTimer,
            HostIrq::UartReceive => Self::IrqUart,
            HostIrq::Unexpected(_) if passed => Self::IrqPassthrough,
            HostIrq::Lpi(_) => Self::IrqPassthrough,
            HostIrq::Spurious | HostIrq::Unexpected(_) => Self::IrqOther,
        }
    }

    /// Every class, in report order.
    pub const ALL: [ExitClass; 22] = [
        ExitClass::Wfx,
        ExitClass::SysregSgi,
        ExitClass::SysregId,
        ExitClass::SysregSetWay,
        ExitClass::SysregVmReg,
        ExitClass::SysregTimer,
        ExitClass::SysregOther,
        ExitClass::Stage2Fault,
        ExitClass::MmioUart,
        ExitClass::MmioGic,
        ExitClass::MmioVirtio,
        ExitClass::MmioPassed,
        ExitClass::AbortInjected,
        ExitClass::Hvc,
        ExitClass::Smc,
        ExitClass::IrqKick,
        ExitClass::IrqMaintenance,
        ExitClass::IrqTimer,
        ExitClass::IrqUart,
        ExitClass::IrqPassthrough,
        ExitClass::IrqOther,
        ExitClass::Other,
    ];

    /// The class's name in the report.
    pub const fn name(self) -> &'static str {
        match self {
            ExitClass::Wfx => "wfx",
            ExitClass::SysregSgi => "sysreg_sgi",
            ExitClass::SysregId => "sysreg_id",
            ExitClass::SysregSetWay => "sysreg_setway",
            ExitClass::SysregVmReg => "sysreg_vmreg",
            ExitClass::SysregTimer => "sysreg_timer",
            ExitClass::SysregOther => "sysreg_other",
            ExitClass::Stage2Fault => "stage2_fault",
            ExitClass::MmioUart => "mmio_uart",
            ExitClass::MmioGic => "mmio_gic",
            ExitClass::MmioVirtio => "mmio_virtio",
            ExitClass::MmioPassed => "mmio_passed",
            ExitClass::AbortInjected => "abort_injected",
            ExitClass::Hvc => "hvc",
            ExitClass::Smc => "smc",
            ExitClass::IrqKick => "irq_kick",
            ExitClass::IrqMaintenance => "irq_maintenance",
            ExitClass::IrqTimer => "irq_timer",
            ExitClass::IrqUart => "irq_uart",
            ExitClass::IrqPassthrough => "irq_passthrough",
            ExitClass::IrqOther => "irq_other",
            ExitClass::Other => "other",
        }
    }
}

/// Work done inside exits, counted on its own as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Work {
    /// Folding and refilling the list registers before an entry.
    ListRegisterFill,
}

impl Work {
    /// Every kind of work, in report order.
    pub const ALL: [Work; 1] = [Work::ListRegisterFill];

    /// The work's name in the report.
    pub const fn name(self) -> &'static str {
        match self {
            Work::ListRegisterFill => "list_register_fill",
        }
    }
}

/// A count and the ticks they took.
struct Tally {
    count: AtomicU64,
    ticks: AtomicU64,
}

impl Tally {
    const fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
        }
    }

    /// One more, taking `ticks`. Only the owning CPU writes, so a load and a
    /// store suffice.
    fn add(&self, ticks: u64) {
        bump(&self.count, 1);
        bump(&self.ticks, ticks);
    }
}

/// Adds `n` to a counter only this CPU writes.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// One vCPU's profile, on its own cache line(s).
#[repr(align(64))]
pub struct ExitProfile {
    exits: [Tally; ExitClass::ALL.len()],
    work: [AtomicU64; Work::ALL.len()],
    guest: AtomicU64,
}

impl Default for ExitProfile {
    fn default() -> Self {
        Self::new()
    }
}

impl ExitProfile {
    /// Nothing recorded.
    pub const fn new() -> Self {
        Self {
            exits: [const { Tally::new() }; ExitClass::ALL.len()],
            work: [const { AtomicU64::new(0) }; Work::ALL.len()],
            guest: AtomicU64::new(0),
        }
    }

    /// An exit of `class` that kept the vCPU at EL2 for `ticks`.
    pub fn exit(&self, class: ExitClass, ticks: u64) {
        self.exits[class as usize].add(ticks);
    }

    /// `work` done once more.
    pub fn work(&self, work: Work) {
        bump(&self.work[work as usize], 1);
    }

    /// `ticks` more in the guest.
    pub fn guest(&self, ticks: u64) {
        bump(&self.guest, ticks);
    }

    /// Exits of `class` so far and their ticks.
    pub fn exits(&self, class: ExitClass) -> (u64, u64) {
        let tally = &self.exits[class as usize];
        (
            tally.count.load(Ordering::Relaxed),
            tally.ticks.load(Ordering::Relaxed),
        )
    }

    /// Times `work` was done.
    pub fn work_done(&self, work: Work) -> u64 {
        self.work[work as usize].load(Ordering::Relaxed)
    }

    /// Ticks spent in the guest.
    pub fn guest_ticks(&self) -> u64 {
        self.guest.load(Ordering::Relaxed)
    }
}

/// The report lines of `profiles` (all vCPUs of a VM, summed), with the
/// counter's frequency `ticks_per_second`, handed to `line` one by one as
/// `(name, value)`.
pub fn report(profiles: &[ExitProfile], ticks_per_second: u64, mut line: impl FnMut(&str, u64)) {
    let mut name = line_name::Name::new();
    for class in ExitClass::ALL {
        let (count, ticks) = profiles.iter().map(|p| p.exits(class)).fold((0, 0), sum);
        line(name.of("exit_", class.name(), "_count"), count);
        line(name.of("exit_", class.name(), "_ticks"), ticks);
    }
    for work in Work::ALL {
        let count = profiles.iter().map(|p| p.work_done(work)).sum();
        line(name.of("work_", work.name(), "_count"), count);
    }
    line(
        "guest_ticks",
        profiles.iter().map(ExitProfile::guest_ticks).sum(),
    );
    line("ticks_per_second", ticks_per_second);
}

fn sum((count, ticks): (u64, u64), (c, t): (u64, u64)) -> (u64, u64) {
    (count + c, ticks + t)
}

/// A report line's name, built in a fixed buffer (no allocation).
mod line_name {
    /// Room for the longest name.
    const CAPACITY: usize = 64;

    pub struct Name {
        bytes: [u8; CAPACITY],
    }

    impl Name {
        pub fn new() -> Self {
            Self {
                bytes: [0; CAPACITY],
            }
        }

        /// `prefix`, `middle` and `suffix` joined (cut at the capacity).
        pub fn of(&mut self, prefix: &str, middle: &str, suffix: &str) -> &str {
            let mut len = 0;
            for part in [prefix, middle, suffix] {
                for &b in part.as_bytes() {
                    if len < CAPACITY {
                        self.bytes[len] = b;
                        len += 1;
                    }
                }
            }
            // Only whole ASCII names are copied in (the class and work names).
            core::str::from_utf8(&self.bytes[..len]).unwrap_or("")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::{String, ToString};
    use std::vec::Vec;

    #[test]
    fn an_irq_exit_is_named_by_its_first_interrupt() {
        use crate::vocabulary::timers::TimerId;
        let class = ExitClass::of_host_irq;
        assert_eq!(class(HostIrq::Kick, false), ExitClass::IrqKick);
        assert_eq!(
            class(HostIrq::Maintenance, false),
            ExitClass::IrqMaintenance
        );
        assert_eq!(
            class(HostIrq::Timer(TimerId::Physical), false),
            ExitClass::IrqTimer
        );
        assert_eq!(class(HostIrq::UartReceive, false), ExitClass::IrqUart);
        assert_eq!(class(HostIrq::Lpi(8192), false), ExitClass::IrqPassthrough);
        assert_eq!(
            class(HostIrq::Unexpected(48), true),
            ExitClass::IrqPassthrough
        );
        assert_eq!(class(HostIrq::Unexpected(48), false), ExitClass::IrqOther);
        assert_eq!(class(HostIrq::Spurious, true), ExitClass::IrqOther);
    }

    fn lines(profiles: &[ExitProfile]) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        report(profiles, 1000, |name, value| {
            out.push((name.to_string(), value))
        });
        out
    }

    fn value(lines: &[(String, u64)], name: &str) -> u64 {
        lines
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
    }

    #[test]
    fn sums_every_vcpu_by_class() {
        let profiles = [ExitProfile::new(), ExitProfile::new()];
        profiles[0].exit(ExitClass::MmioUart, 10);
        profiles[0].exit(ExitClass::MmioUart, 5);
        profiles[1].exit(ExitClass::MmioUart, 7);
        profiles[1].exit(ExitClass::IrqTimer, 3);
        profiles[0].work(Work::ListRegisterFill);
        profiles[0].guest(100);
        profiles[1].guest(50);
        let lines = lines(&profiles);
        assert_eq!(value(&lines, "exit_mmio_uart_count"), 3);
        assert_eq!(value(&lines, "exit_mmio_uart_ticks"), 22);
        assert_eq!(value(&lines, "exit_irq_timer_count"), 1);
        assert_eq!(value(&lines, "exit_irq_timer_ticks"), 3);
        assert_eq!(value(&lines, "exit_wfx_count"), 0);
        assert_eq!(value(&lines, "work_list_register_fill_count"), 1);
        assert_eq!(value(&lines, "guest_ticks"), 150);
        assert_eq!(value(&lines, "ticks_per_second"), 1000);
    }

    #[test]
    fn every_class_and_work_has_two_lines_in_order() {
        let lines = lines(&[ExitProfile::new()]);
        assert_eq!(lines.len(), 2 * ExitClass::ALL.len() + Work::ALL.len() + 2);
        assert_eq!(lines[0].0, "exit_wfx_count");
        assert_eq!(lines[1].0, "exit_wfx_ticks");
        for (i, class) in ExitClass::ALL.iter().enumerate() {
            assert_eq!(*class as usize, i);
            assert_eq!(lines[2 * i].0, format!("exit_{}_count", class.name()));
        }
    }
}
