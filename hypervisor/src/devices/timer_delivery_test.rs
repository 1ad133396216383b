//! The randomised test of timer interrupt delivery through hardware list
//! registers (host only).
//!
//! One vCPU with both EL1 timers linked to their host PPIs
//! ([`VgicState::link_hardware_ppi`]), 1 to 4 list registers (in the GICv3
//! or the GICv2 layout), and an SPI
//! that devices inject beside them. The test plays every part:
//!
//! - the timers: each one's output line, which the guest raises by letting a
//!   deadline pass (no exit) and lowers by disabling, masking or re-arming
//!   it (a trapped access: an exit right after);
//! - the host GIC: each timer's PPI is pending while its line is high and it
//!   is not active; a pending PPI is taken at once as an IRQ exit;
//! - the hypervisor, as the vCPU's run loop does it (`runtime::vcpu`): on an IRQ
//!   exit the PPI's priority is dropped and it stays active,
//!   [`TimerForward::fired`] raises the vgic line; before the entry the line
//!   is sampled, the list registers refilled and [`TimerForward::after_fill`]
//!   decides whether the hypervisor deactivates the PPI;
//! - the guest, through [`ModelListRegisters`]: masking and unmasking IRQs,
//!   acknowledging and completing interrupts (a hardware list register's
//!   deactivation deactivates the host PPI), deactivating them through
//!   `GICR_ICACTIVER0`, and EOI maintenance exits.
//!
//! After every entry it checks that the hypervisor knows whether each PPI is
//! active, that no PPI is left active while the guest owes it nothing (the
//! timer would be silent for good), that a high line is pending or active in
//! the vgic or its PPI can fire (the guest will get it), and that the guest never acknowledges a
//! timer interrupt whose line is low. At the end the guest turns the timers
//! off and completes everything: no PPI is left active and nothing pending.

use super::timer::TimerForward;
use super::vgic::list_regs::ModelListRegisters;
use super::vgic::{ListRegister, ListRegisters, LrEncoding, VgicConfig, VgicState};
use crate::vocabulary::timers::TimerId;
use alloc::vec::Vec;
use proptest::prelude::*;

const DISTRIBUTOR: u64 = 0x0800_0000;
const REDISTRIBUTOR: u64 = 0x080a_0000;
const SGI_BASE: u64 = REDISTRIBUTOR + 0x1_0000;
const SPI: u32 = 40;

/// What happens next.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A timer's deadline passes: its line rises (no exit).
    Expire(usize),
    /// The guest disables, masks or re-arms a timer (a trapped access).
    Quiet(usize),
    /// A device injects the SPI (its owner kicks the vCPU: an exit).
    Spi,
    /// The guest deactivates a timer's interrupt through `GICR_ICACTIVER0`
    /// (an exit), whether or not it took it.
    Deactivate(usize),
    /// The guest masks (`true`) or unmasks IRQs.
    MaskIrqs(bool),
    /// The guest acknowledges what its CPU interface signals.
    Acknowledge,
    /// The guest completes the innermost interrupt it took.
    Complete,
    /// Any other exit (an IPI sent, an MMIO access).
    Exit,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2usize).prop_map(Step::Expire),
        2 => (0..2usize).prop_map(Step::Quiet),
        1 => Just(Step::Spi),
        1 => (0..2usize).prop_map(Step::Deactivate),
        1 => any::<bool>().prop_map(Step::MaskIrqs),
        3 => Just(Step::Acknowledge),
        3 => Just(Step::Complete),
        1 => Just(Step::Exit),
    ]
}

/// One timer, its host PPI and its forwarding state.
#[derive(Clone, Copy, Debug, Default)]
struct Timer {
    line: bool,
    ppi_active: bool,
    forward: TimerForward,
}

struct System {
    vgic: VgicState,
    lrs: ModelListRegisters,
    timers: [Timer; 2],
    irqs_masked: bool,
    /// INTIDs the guest acknowledged and has not completed, innermost last.
    taken: Vec<u32>,
    /// How many timer interrupts the guest took.
    timer_takes: usize,
}

impl System {
    fn new(list_registers: usize, encoding: LrEncoding) -> Self {
        let mut vgic = VgicState::new(VgicConfig {
            distributor_base: DISTRIBUTOR,
            redistributor_base: REDISTRIBUTOR,
            spi_count: 32,
            vcpu_mpidrs: alloc::vec![0],
        })
        .unwrap();
        // Distributor on (ARE, group 1), everything group 1 and enabled.
        vgic.mmio_write(DISTRIBUTOR, 4, 0x12).unwrap();
        vgic.mmio_write(DISTRIBUTOR + 0x84, 4, u64::from(u32::MAX))
            .unwrap();
        vgic.mmio_write(DISTRIBUTOR + 0x104, 4, 1 << (SPI - 32))
            .unwrap();
        vgic.mmio_write(SGI_BASE + 0x80, 4, u64::from(u32::MAX))
            .unwrap();
        for timer in TimerId::ALL {
            let intid = timer.guest_intid();
            vgic.mmio_write(SGI_BASE + 0x100, 4, 1 << intid).unwrap();
            vgic.link_hardware_ppi(intid, timer.host_intid(None))
                .unwrap();
        }
        // The SPI's priority is less urgent than the timers' (0).
        vgic.mmio_write(DISTRIBUTOR + 0x400 + u64::from(SPI), 1, 0x80)
            .unwrap();
        Self {
            vgic,
            lrs: ModelListRegisters::new(list_registers).with_encoding(encoding),
            timers: [Timer::default(); 2],
            irqs_masked: false,
            taken: Vec::new(),
            timer_takes: 0,
        }
    }

    fn timer_of(intid: u32) -> Option<usize> {
        TimerId::ALL
            .into_iter()
            .find(|t| t.guest_intid() == intid)
            .map(TimerId::index)
    }

    /// An exit, its handling and the next entry. `irq`: taken because a
    /// host interrupt is pending (the timers' PPIs, maintenance, a kick).
    fn exit(&mut self) {
        // The IRQ exit: every pending PPI is acknowledged, its priority
        // dropped, and left active.
        for (index, timer) in self.timers.iter_mut().enumerate() {
            if timer.line && !timer.ppi_active {
                timer.ppi_active = true;
                if timer.forward.fired() {
                    self.vgic
                        .set_ppi_level(0, TimerId::ALL[index].guest_intid(), true)
                        .unwrap();
                }
            }
        }
        // Before the entry: sample, refill, settle the PPIs.
        for (index, timer) in self.timers.iter_mut().enumerate() {
            if timer.forward.needs_sample()
                && let Some(level) = timer.forward.sample(timer.line)
            {
                self.vgic
                    .set_ppi_level(0, TimerId::ALL[index].guest_intid(), level)
                    .unwrap();
            }
        }
        self.vgic.fill(0, &mut self.lrs).unwrap();
        let completed = self.vgic.take_hardware_completions(0);
        for (index, timer) in self.timers.iter_mut().enumerate() {
            let intid = TimerId::ALL[index].guest_intid();
            let idle = self.vgic.hardware_ppi_idle(0, intid);
            if timer
                .forward
                .after_fill(completed & (1 << intid) != 0, idle)
            {
                timer.ppi_active = false;
            }
        }
        self.check();
    }

    fn check(&self) {
        for (index, timer) in self.timers.iter().enumerate() {
            let intid = TimerId::ALL[index].guest_intid();
            // Neither pending nor active: the guest will not deactivate it
            // (one it took and deactivated through `ICACTIVER` only owes the
            // priority drop of its EOI).
            let irq = self.vgic.irq(0, intid).unwrap();
            let idle = !irq.pending() && !irq.active;
            assert_eq!(
                timer.forward.host_active(),
                timer.ppi_active,
                "INTID {intid}: the hypervisor's idea of the PPI's active state"
            );
            assert!(
                !(timer.ppi_active && idle),
                "INTID {intid}: PPI left active while the guest owes nothing"
            );
            // A rise the vgic has not heard of is reported by the PPI
            // itself, which fires at once if it is not active.
            assert!(
                !timer.line || !idle || !timer.ppi_active,
                "INTID {intid}: line high, neither pending nor active, PPI active"
            );
        }
        for &v in self.lrs.list_registers() {
            let lr = ListRegister(v);
            if let Some(pintid) = lr.pintid() {
                assert!(!lr.eoi_maintenance(), "HW and EOI maintenance");
                assert_eq!(pintid, lr.intid(), "the host PPI is the guest's INTID here");
            }
        }
    }

    /// The host interrupts pending while the guest runs: a PPI whose line
    /// is high and that is not active, or the maintenance interrupt.
    fn irq_pending(&mut self) -> bool {
        let ppi = self.timers.iter().any(|t| t.line && !t.ppi_active);
        ppi || self.lrs.read_misr() != 0
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Expire(index) => self.timers[index].line = true,
            Step::Quiet(index) => {
                self.timers[index].line = false;
                self.exit();
            }
            Step::Spi => {
                self.vgic.inject_spi_edge(SPI).unwrap();
                self.exit();
            }
            Step::Deactivate(index) => {
                let intid = TimerId::ALL[index].guest_intid();
                self.vgic
                    .mmio_write(SGI_BASE + 0x380, 4, 1 << intid)
                    .unwrap();
                self.exit();
            }
            Step::MaskIrqs(masked) => self.irqs_masked = masked,
            Step::Acknowledge => {
                if !self.irqs_masked
                    && let Some(intid) = self.lrs.acknowledge()
                {
                    if let Some(index) = Self::timer_of(intid) {
                        assert!(
                            self.timers[index].line,
                            "INTID {intid} taken while its line is low"
                        );
                        self.timer_takes += 1;
                    }
                    self.taken.push(intid);
                }
            }
            Step::Complete => {
                if let Some(intid) = self.taken.pop() {
                    self.lrs.end_of_interrupt(intid);
                    let deactivated = self.lrs.take_physical_deactivations();
                    for (index, timer) in self.timers.iter_mut().enumerate() {
                        let pintid = TimerId::ALL[index].host_intid(None);
                        if deactivated & (1 << pintid) != 0 {
                            timer.ppi_active = false;
                        }
                    }
                }
            }
            Step::Exit => self.exit(),
        }
        // Whatever is pending at the host now is taken at once.
        let mut guard = 0;
        while self.irq_pending() {
            self.exit();
            guard += 1;
            assert!(
                guard < 8,
                "an interrupt storm: the same exit again and again"
            );
        }
    }

    /// The guest turns both timers off, unmasks IRQs and takes and
    /// completes everything.
    fn drain(&mut self) {
        self.irqs_masked = false;
        for index in 0..2 {
            self.run(Step::Quiet(index));
        }
        for _ in 0..64 {
            self.run(Step::Acknowledge);
            self.run(Step::Complete);
            self.run(Step::Exit);
        }
        while !self.taken.is_empty() {
            self.run(Step::Complete);
        }
        self.run(Step::Exit);
        for timer in TimerId::ALL {
            let intid = timer.guest_intid();
            assert!(
                !self.timers[timer.index()].ppi_active,
                "INTID {intid}: PPI still active"
            );
            assert!(
                self.vgic.hardware_ppi_idle(0, intid),
                "INTID {intid} not idle"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn timer_interrupts_through_hardware_list_registers(
        list_registers in 1..=4usize,
        gicv2 in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let encoding = if gicv2 { LrEncoding::V2 } else { LrEncoding::V3 };
        let mut system = System::new(list_registers, encoding);
        for step in steps {
            system.run(step);
        }
        system.drain();
    }
}

#[test]
fn the_timers_stay_level_sensitive_whatever_the_guest_writes_to_icfgr1() {
    // An edge-triggered INTID 30 would latch each rise and be delivered after
    // the guest masked its timer.
    let mut system = System::new(4, LrEncoding::V3);
    system
        .vgic
        .mmio_write(SGI_BASE + 0xc04, 4, u64::from(u32::MAX))
        .unwrap();
    let config = system.vgic.mmio_read(SGI_BASE + 0xc04, 4).unwrap();
    for timer in TimerId::ALL {
        let field = 2 * (timer.guest_intid() - 16) + 1;
        assert_eq!(config >> field & 1, 0, "INTID {} edge", timer.guest_intid());
    }
    assert_eq!(
        config >> (2 * (20 - 16) + 1) & 1,
        1,
        "other PPIs stay programmable"
    );
    system.timers[1].line = true;
    system.exit();
    system.timers[1].line = false;
    system.exit();
    assert!(
        system.vgic.hardware_ppi_idle(0, 30),
        "the rise was not latched"
    );
    assert_eq!(system.lrs.acknowledge(), None);
}

#[test]
fn a_timer_tick_costs_one_exit_and_its_end_none() {
    let mut system = System::new(4, LrEncoding::V3);
    system.exit();
    let mut exits_per_tick = Vec::new();
    for _ in 0..5 {
        // The deadline passes: the PPI fires (one exit); the guest takes the
        // interrupt, re-arms the timer (here without a trap: the virtual
        // timer) and completes it.
        system.timers[0].line = true;
        let mut exits = 0;
        while system.irq_pending() {
            system.exit();
            exits += 1;
        }
        assert_eq!(system.lrs.acknowledge(), Some(27));
        system.timers[0].line = false;
        system.lrs.end_of_interrupt(27);
        let deactivated = system.lrs.take_physical_deactivations();
        assert_eq!(deactivated, 1 << 27, "the guest's EOI deactivated the PPI");
        system.timers[0].ppi_active = false;
        exits += usize::from(system.irq_pending());
        exits_per_tick.push(exits);
    }
    assert_eq!(exits_per_tick, [1; 5]);
}
