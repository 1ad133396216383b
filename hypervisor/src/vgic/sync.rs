//! Moving interrupts between the model and a vCPU's list registers.
//!
//! Fold (after an exit): for each list register the last fill wrote, read
//! its state (an `ELRSR` bit means empty without reading it) and merge it
//! into the interrupt (`IrqState::fold`): an acknowledged
//! interrupt's pending state is consumed, an EOI'd one is no longer active,
//! a level interrupt whose line is still high is pending again. Deactivations
//! of interrupts that had no list register (`ICH_HCR_EL2.EOIcount`) retire
//! that many of the vCPU's unlisted active interrupts, highest priority first.
//!
//! Fill (before entry): fold first, then choose the best interrupts for the
//! vCPU among its private ones and the SPIs routed to it that are active or
//! deliverable and not held by another vCPU's list registers: active ones
//! first (the guest must be able to deactivate them), then by priority, then
//! by INTID. Each goes to one list register (group, priority, state); a level
//! interrupt is listed with EOI maintenance, and while it is active it is
//! listed active only, so the line is re-sampled after its EOI instead of a
//! stale pending state being delivered again. The unused list registers are
//! cleared. If candidates were left over, `ICH_HCR_EL2.UIE` requests a
//! maintenance interrupt once at most one list register is still valid (with
//! a single list register, which would underflow at once, the listed
//! interrupt gets EOI maintenance instead), and `LRENPIE` is set if an active
//! interrupt was left over.

use super::irq::{FIRST_SPI, PRIVATE_COUNT, Trigger};
use super::list_regs::{
    ICH_HCR_EN, ICH_HCR_EOICOUNT_MASK, ICH_HCR_EOICOUNT_SHIFT, ICH_HCR_LRENPIE, ICH_HCR_UIE,
    ListRegister, ListRegisters, MAX_LIST_REGISTERS,
};
use super::{VgicError, VgicState};

/// What a fill put in the list registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillOutcome {
    /// List registers written with an interrupt.
    pub listed: usize,
    /// Candidates that did not fit (the underflow interrupt was requested).
    pub left_over: usize,
}

/// Sort key of a candidate: active first, then priority, then INTID.
type Key = (bool, u8, u32);

impl VgicState {
    /// Copies the state of `vcpu`'s list registers back into the model. Call
    /// it after every exit of the vCPU, on the CPU that ran it; calling it
    /// again before the next fill changes nothing.
    pub fn fold(&mut self, vcpu: usize, lrs: &mut impl ListRegisters) -> Result<(), VgicError> {
        if vcpu >= self.vcpus.len() {
            return Err(VgicError::NoSuchVcpu(vcpu));
        }
        let elrsr = lrs.read_elrsr();
        for index in 0..lrs.count().min(MAX_LIST_REGISTERS) {
            let Some(intid) = self.vcpus[vcpu].listed[index].take() else {
                continue;
            };
            let lr = if elrsr & (1 << index) != 0 {
                ListRegister::EMPTY
            } else {
                ListRegister(lrs.read_lr(index))
            };
            if let Some(irq) = self.irq_mut(vcpu, intid) {
                irq.fold(lr.pending(), lr.active());
            }
        }
        let hcr = lrs.read_hcr();
        let eoi_count = (hcr & ICH_HCR_EOICOUNT_MASK) >> ICH_HCR_EOICOUNT_SHIFT;
        if eoi_count != 0 {
            for _ in 0..eoi_count {
                if !self.deactivate_unlisted(vcpu) {
                    break;
                }
            }
            lrs.write_hcr(hcr & !ICH_HCR_EOICOUNT_MASK);
        }
        Ok(())
    }

    /// Folds `vcpu`'s list registers, empties them and disables the virtual
    /// CPU interface (`ICH_HCR_EL2` = 0): for a vCPU that stops running on
    /// this CPU (`CPU_OFF`, or another vCPU is scheduled here). Until then an
    /// SPI in its list registers could not be listed by any other vCPU.
    pub fn unload(&mut self, vcpu: usize, lrs: &mut impl ListRegisters) -> Result<(), VgicError> {
        self.fold(vcpu, lrs)?;
        for index in 0..lrs.count().min(MAX_LIST_REGISTERS) {
            lrs.write_lr(index, ListRegister::EMPTY.0);
        }
        lrs.write_hcr(0);
        Ok(())
    }

    /// Clears the active state of `vcpu`'s most urgent active interrupt that
    /// no list register holds. Returns whether there was one.
    fn deactivate_unlisted(&mut self, vcpu: usize) -> bool {
        let mut best: Option<(u8, u32)> = None;
        self.for_each_candidate(
            vcpu,
            |state, intid| {
                let irq = state.irq(vcpu, intid)?;
                (irq.active && irq.listed_on.is_none()).then_some((irq.priority, intid))
            },
            |key| {
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            },
        );
        match best.and_then(|(_, intid)| self.irq_mut(vcpu, intid)) {
            Some(irq) => {
                irq.active = false;
                true
            }
            None => false,
        }
    }

    /// Calls `select` for each interrupt that can reach `vcpu` (its private
    /// ones, the SPIs routed to it) and `take` for each that it accepts.
    fn for_each_candidate<K>(
        &self,
        vcpu: usize,
        select: impl Fn(&Self, u32) -> Option<K>,
        mut take: impl FnMut(K),
    ) {
        for intid in 0..PRIVATE_COUNT {
            if let Some(key) = select(self, intid) {
                take(key);
            }
        }
        for intid in FIRST_SPI..FIRST_SPI + self.spi_count {
            if let Some(key) = select(self, intid)
                && self.spi_target(intid) == Some(vcpu)
            {
                take(key);
            }
        }
    }

    /// Folds `vcpu`'s list registers, then fills them with its most urgent
    /// interrupts and programs `ICH_HCR_EL2` (En, and UIE/LRENPIE when some
    /// did not fit; EOIcount cleared; the other bits kept). Call it last
    /// before entering the vCPU.
    pub fn fill(
        &mut self,
        vcpu: usize,
        lrs: &mut impl ListRegisters,
    ) -> Result<FillOutcome, VgicError> {
        self.fold(vcpu, lrs)?;
        let count = lrs.count().min(MAX_LIST_REGISTERS);
        let mut best: [Key; MAX_LIST_REGISTERS] = [(false, 0, 0); MAX_LIST_REGISTERS];
        let mut len = 0;
        let mut left_over = 0;
        let mut active_left_over = false;
        self.for_each_candidate(
            vcpu,
            |state, intid| {
                let irq = state.irq(vcpu, intid)?;
                let wanted = irq.active || state.deliverable(irq);
                (wanted && irq.listed_on.is_none()).then_some((!irq.active, irq.priority, intid))
            },
            |key| {
                let position = best[..len].partition_point(|&b| b <= key);
                if position >= count {
                    left_over += 1;
                    active_left_over |= !key.0;
                    return;
                }
                if len == count {
                    let dropped = best[count - 1];
                    left_over += 1;
                    active_left_over |= !dropped.0;
                } else {
                    len += 1;
                }
                best.copy_within(position..len - 1, position + 1);
                best[position] = key;
            },
        );

        let single_lr_overflow = count == 1 && left_over > 0;
        for (index, &(_, _, intid)) in best[..len].iter().enumerate() {
            let deliverable = self
                .irq(vcpu, intid)
                .is_some_and(|irq| self.deliverable(irq));
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            let level = irq.trigger == Trigger::Level;
            let pending = deliverable && !(level && irq.active);
            let lr = ListRegister::virtual_interrupt(
                intid,
                irq.priority,
                irq.group1,
                pending,
                irq.active,
                level || single_lr_overflow,
            );
            irq.list(vcpu as u16, pending);
            self.vcpus[vcpu].listed[index] = Some(intid);
            lrs.write_lr(index, lr.0);
        }
        for index in len..count {
            lrs.write_lr(index, ListRegister::EMPTY.0);
        }
        // Keep the ICH_HCR_EL2 bits this module does not own (trap controls).
        let owned = ICH_HCR_EN | ICH_HCR_UIE | ICH_HCR_LRENPIE | ICH_HCR_EOICOUNT_MASK;
        let mut hcr = (lrs.read_hcr() & !owned) | ICH_HCR_EN;
        if left_over > 0 && count > 1 {
            hcr |= ICH_HCR_UIE;
        }
        if active_left_over {
            hcr |= ICH_HCR_LRENPIE;
        }
        lrs.write_hcr(hcr);
        Ok(FillOutcome {
            listed: len,
            left_over,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::list_regs::{ICH_MISR_EOI, ICH_MISR_U, ModelListRegisters};
    use super::super::sgi::SgiGroup;
    use super::super::state::tests::two_vcpus;
    use super::super::{PTIMER_INTID, VTIMER_INTID};
    use super::*;

    /// Distributor on with group 1, every interrupt group 1, the given SPIs
    /// and private INTIDs enabled on both vCPUs.
    fn ready(enabled: &[u32]) -> VgicState {
        let mut gic = two_vcpus();
        gic.distributor_write(0, 4, 0x12).unwrap();
        for word in 1..3 {
            gic.distributor_write(0x80 + 4 * word, 4, 0xffff_ffff)
                .unwrap();
        }
        for vcpu in 0..2 {
            gic.sgi_base_write(vcpu, 0x80, 4, 0xffff_ffff).unwrap();
        }
        for &intid in enabled {
            if intid < 32 {
                for vcpu in 0..2 {
                    gic.sgi_base_write(vcpu, 0x100, 4, 1 << intid).unwrap();
                }
            } else {
                gic.distributor_write(0x100 + 4 * u64::from(intid / 32), 4, 1 << (intid % 32))
                    .unwrap();
            }
        }
        gic
    }

    fn listed(lrs: &ModelListRegisters) -> Vec<(u32, u8, u8)> {
        lrs.list_registers()
            .iter()
            .map(|&v| ListRegister(v))
            .filter(|lr| !lr.is_empty())
            .map(|lr| (lr.intid(), lr.priority(), lr.state()))
            .collect()
    }

    #[test]
    fn fills_by_priority_and_spills_with_underflow() {
        let spis: Vec<u32> = (32..40).collect();
        let mut gic = ready(&spis);
        // Priorities: INTID 32 + n gets 0x80 - 8n, so 39 is the most urgent;
        // 36 and 37 share one priority (INTID breaks the tie).
        for (n, &intid) in spis.iter().enumerate() {
            let priority = if intid == 37 {
                0x60
            } else {
                0x80 - 8 * n as u64
            };
            gic.distributor_write(0x400 + u64::from(intid), 1, priority)
                .unwrap();
            gic.inject_spi_edge(intid).unwrap();
        }
        let mut lrs = ModelListRegisters::new(4);
        let outcome = gic.fill(0, &mut lrs).unwrap();
        assert_eq!(
            outcome,
            FillOutcome {
                listed: 4,
                left_over: 4
            }
        );
        assert_eq!(
            listed(&lrs),
            vec![(39, 0x48, 1), (38, 0x50, 1), (36, 0x60, 1), (37, 0x60, 1)]
        );
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN | ICH_HCR_UIE);
        assert_eq!(lrs.read_misr() & ICH_MISR_U, 0);

        // The guest takes and completes three of them: underflow fires.
        for _ in 0..3 {
            let intid = lrs.acknowledge().unwrap();
            lrs.end_of_interrupt(intid);
        }
        assert_eq!(lrs.read_misr() & ICH_MISR_U, ICH_MISR_U);
        let outcome = gic.fill(0, &mut lrs).unwrap();
        assert_eq!(
            outcome,
            FillOutcome {
                listed: 4,
                left_over: 1
            }
        );
        assert_eq!(
            listed(&lrs),
            vec![(37, 0x60, 1), (35, 0x68, 1), (34, 0x70, 1), (33, 0x78, 1)]
        );
        for _ in 0..4 {
            let intid = lrs.acknowledge().unwrap();
            lrs.end_of_interrupt(intid);
        }
        assert_eq!(
            gic.fill(0, &mut lrs).unwrap(),
            FillOutcome {
                listed: 1,
                left_over: 0
            }
        );
        assert_eq!(listed(&lrs), vec![(32, 0x80, 1)]);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN);
        // Trap controls set by the hypervisor survive a fill.
        let tdir = 1 << 14;
        lrs.write_hcr(ICH_HCR_EN | tdir);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN | tdir);
        lrs.write_hcr(ICH_HCR_EN);
        lrs.acknowledge();
        lrs.end_of_interrupt(32);
        assert_eq!(gic.fill(0, &mut lrs).unwrap(), FillOutcome::default());
        assert!(spis.iter().all(|&i| !gic.irq(0, i).unwrap().pending()));
        assert!(spis.iter().all(|&i| !gic.irq(0, i).unwrap().active));
    }

    #[test]
    fn active_interrupts_are_listed_first() {
        let mut gic = ready(&[40, 41, 42, 43, 44]);
        let mut lrs = ModelListRegisters::new(2);
        gic.distributor_write(0x400 + 44, 1, 0xf0).unwrap();
        gic.inject_spi_edge(44).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(44));
        // More urgent ones arrive while 44 is active.
        for intid in 40..44 {
            gic.inject_spi_edge(intid).unwrap();
        }
        let outcome = gic.fill(0, &mut lrs).unwrap();
        assert_eq!(
            outcome,
            FillOutcome {
                listed: 2,
                left_over: 3
            }
        );
        assert_eq!(listed(&lrs), vec![(44, 0xf0, 2), (40, 0, 1)]);
        assert!(gic.irq(0, 44).unwrap().active);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN | ICH_HCR_UIE);
    }

    #[test]
    fn eoi_of_an_unlisted_active_interrupt_is_counted_and_applied() {
        let mut gic = ready(&[40, 41]);
        let mut lrs = ModelListRegisters::new(1);
        gic.distributor_write(0x400 + 41, 1, 0x10).unwrap();
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(40));
        gic.inject_spi_edge(41).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        // 40 (active) holds the only LR; 41 left over while active: LRENPIE.
        assert_eq!(listed(&lrs), vec![(40, 0, 2)]);
        assert_eq!(lrs.read_hcr() & ICH_HCR_LRENPIE, 0);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN, "a single LR never uses UIE");
        assert!(ListRegister(lrs.read_lr(0)).eoi_maintenance());
        lrs.end_of_interrupt(40);
        assert_eq!(lrs.read_misr() & ICH_MISR_EOI, ICH_MISR_EOI);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(41, 0x10, 1)]);
        assert_eq!(lrs.acknowledge(), Some(41));
        // 40 again, acknowledged, then preempted in the LR by active 41 (more urgent).
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(41, 0x10, 2)]);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN);
        // Pretend 40 had been active without a list register: an EOI of it
        // increments EOIcount, and the fold deactivates it.
        gic.spis[8].active = true;
        gic.spis[8].pending_latch = false;
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.read_hcr() & ICH_HCR_LRENPIE, ICH_HCR_LRENPIE);
        lrs.end_of_interrupt(40);
        gic.fold(0, &mut lrs).unwrap();
        assert!(!gic.irq(0, 40).unwrap().active);
        assert!(
            gic.irq(0, 41).unwrap().active,
            "the listed one is untouched"
        );
        assert_eq!(lrs.read_hcr() & ICH_HCR_EOICOUNT_MASK, 0);
    }

    #[test]
    fn level_interrupt_repends_after_eoi_while_line_high() {
        let mut gic = ready(&[33]);
        let mut lrs = ModelListRegisters::new(4);
        gic.set_spi_level(33, true).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        let lr = ListRegister(lrs.read_lr(0));
        assert!(lr.pending() && lr.eoi_maintenance());
        assert_eq!(lrs.acknowledge(), Some(33));
        // Exit while the handler runs: listed active only, not pending+active.
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(33, 0, 2)]);
        lrs.end_of_interrupt(33);
        assert_eq!(lrs.read_misr() & ICH_MISR_EOI, ICH_MISR_EOI);
        // Line still high: pending again.
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(33, 0, 1)]);
        assert_eq!(lrs.read_misr(), 0);
        assert_eq!(lrs.acknowledge(), Some(33));
        gic.set_spi_level(33, false).unwrap();
        lrs.end_of_interrupt(33);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
        assert!(!gic.irq(0, 33).unwrap().pending());
    }

    #[test]
    fn level_line_dropping_before_ack_withdraws_the_interrupt() {
        let mut gic = ready(&[27]);
        let mut lrs = ModelListRegisters::new(4);
        gic.set_ppi_level(0, VTIMER_INTID, true).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(27, 0, 1)]);
        gic.set_ppi_level(0, VTIMER_INTID, false).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
    }

    #[test]
    fn both_timer_lines_are_independent_per_vcpu() {
        let mut gic = ready(&[VTIMER_INTID, PTIMER_INTID]);
        let mut lrs0 = ModelListRegisters::new(4);
        let mut lrs1 = ModelListRegisters::new(4);
        // vCPU 0: both timers fire; vCPU 1: only its physical timer.
        let kicks = gic.set_ppi_level(0, PTIMER_INTID, true).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![0]);
        gic.set_ppi_level(0, VTIMER_INTID, true).unwrap();
        let kicks = gic.set_ppi_level(1, PTIMER_INTID, true).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![1]);
        gic.fill(0, &mut lrs0).unwrap();
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs0), vec![(27, 0, 1), (30, 0, 1)]);
        assert_eq!(listed(&lrs1), vec![(30, 0, 1)]);
        for lr in 0..2 {
            assert!(ListRegister(lrs0.read_lr(lr)).eoi_maintenance());
        }
        // vCPU 0 handles the virtual timer (masks it: line low) and EOIs;
        // the physical one stays pending.
        assert_eq!(lrs0.acknowledge(), Some(27));
        gic.set_ppi_level(0, VTIMER_INTID, false).unwrap();
        lrs0.end_of_interrupt(27);
        assert_eq!(lrs0.read_misr() & ICH_MISR_EOI, ICH_MISR_EOI);
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![(30, 0, 1)]);
        // Then the physical one, still high at its EOI: pending again, as a
        // level interrupt whose line did not drop.
        assert_eq!(lrs0.acknowledge(), Some(30));
        lrs0.end_of_interrupt(30);
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![(30, 0, 1)]);
        assert_eq!(lrs0.acknowledge(), Some(30));
        gic.set_ppi_level(0, PTIMER_INTID, false).unwrap();
        lrs0.end_of_interrupt(30);
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![]);
        // vCPU 1's physical timer was never touched by any of that.
        assert!(gic.irq(1, PTIMER_INTID).unwrap().pending());
        assert!(!gic.irq(1, VTIMER_INTID).unwrap().pending());
    }

    #[test]
    fn edge_arriving_while_active_is_listed_active_and_pending() {
        let mut gic = ready(&[34]);
        gic.distributor_write(0xc08, 4, 0x2 << 4).unwrap(); // INTID 34 edge
        let mut lrs = ModelListRegisters::new(4);
        gic.set_spi_level(34, true).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert!(!ListRegister(lrs.read_lr(0)).eoi_maintenance());
        assert_eq!(lrs.acknowledge(), Some(34));
        gic.set_spi_level(34, false).unwrap();
        gic.set_spi_level(34, true).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(34, 0, 3)]);
    }

    #[test]
    fn disabled_or_group_disabled_interrupts_stay_out() {
        let mut gic = ready(&[35]);
        let mut lrs = ModelListRegisters::new(4);
        gic.inject_spi_edge(36).unwrap();
        gic.distributor_write(0, 4, 0x10).unwrap(); // group 1 off
        gic.inject_spi_edge(35).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
        gic.distributor_write(0, 4, 0x12).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(35, 0, 1)]);
        // Disabled while listed: withdrawn at the next fill, still pending.
        gic.distributor_write(0x180 + 4, 4, 1 << 3).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
        assert!(gic.irq(0, 35).unwrap().pending());
    }

    #[test]
    fn icpendr_while_listed_cancels_the_pending_state() {
        let mut gic = ready(&[35]);
        let mut lrs = ModelListRegisters::new(4);
        gic.inject_spi_edge(35).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        // vCPU 1 clears it while vCPU 0 has it listed: vCPU 0 is kicked.
        let kicks = gic.distributor_write(0x280 + 4, 4, 1 << 3).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![0]);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
        assert!(!gic.irq(0, 35).unwrap().pending());
    }

    #[test]
    fn an_spi_listed_on_one_vcpu_is_not_listed_on_another() {
        let mut gic = ready(&[40]);
        let mut lrs0 = ModelListRegisters::new(4);
        let mut lrs1 = ModelListRegisters::new(4);
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(lrs0.acknowledge(), Some(40));
        // The holder and the new target are kicked.
        let kicks = gic.distributor_write(0x6000 + 8 * 40, 8, 1).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![0, 1]);
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs1), vec![], "still in vCPU 0's list registers");
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![], "re-routed: vCPU 0 lets it go");
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs1), vec![(40, 0, 2)], "active, now with vCPU 1");
    }

    #[test]
    fn sgi_from_one_vcpu_reaches_the_other() {
        let mut gic = ready(&[1]);
        let mut lrs0 = ModelListRegisters::new(4);
        let mut lrs1 = ModelListRegisters::new(4);
        let kicks = gic.send_sgi(0, 1 << 24 | 0b10, SgiGroup::Group1).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![1]);
        gic.fill(0, &mut lrs0).unwrap();
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs0), vec![]);
        assert_eq!(listed(&lrs1), vec![(1, 0, 1)]);
        assert!(ListRegister(lrs1.read_lr(0)).group1());
        assert_eq!(lrs1.acknowledge(), Some(1));
        lrs1.end_of_interrupt(1);
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs1), vec![]);
        assert!(!gic.irq(1, 1).unwrap().pending());
    }

    #[test]
    fn fold_is_idempotent_and_rejects_bad_vcpus() {
        let mut gic = ready(&[35]);
        let mut lrs = ModelListRegisters::new(4);
        gic.inject_spi_edge(35).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(35));
        gic.fold(0, &mut lrs).unwrap();
        let after_one = gic.clone();
        gic.fold(0, &mut lrs).unwrap();
        assert_eq!(format!("{:?}", gic), format!("{:?}", after_one));
        assert!(gic.irq(0, 35).unwrap().active && !gic.irq(0, 35).unwrap().pending());
        assert_eq!(gic.fold(2, &mut lrs), Err(VgicError::NoSuchVcpu(2)));
        assert_eq!(gic.fill(2, &mut lrs), Err(VgicError::NoSuchVcpu(2)));
    }

    /// xorshift64*: a deterministic stream for the randomised model test.
    struct Stream(u64);

    impl Stream {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The guest side of the randomised test: what each vCPU was sent, what
    /// it took, and the interrupts it is handling (innermost last).
    struct Guest {
        lrs: [ModelListRegisters; 2],
        injected: [[u32; 96]; 2],
        acked: [[u32; 96]; 2],
        owed: [[bool; 96]; 2],
        running: [Vec<u32>; 2],
    }

    impl Guest {
        fn sent(&mut self, vcpu: usize, intid: u32) {
            self.injected[vcpu][intid as usize] += 1;
            self.owed[vcpu][intid as usize] = true;
        }

        fn acknowledge(&mut self, vcpu: usize) -> bool {
            let Some(intid) = self.lrs[vcpu].acknowledge() else {
                return false;
            };
            self.acked[vcpu][intid as usize] += 1;
            self.owed[vcpu][intid as usize] = false;
            self.running[vcpu].push(intid);
            true
        }

        fn complete_innermost(&mut self, vcpu: usize) -> bool {
            let Some(intid) = self.running[vcpu].pop() else {
                return false;
            };
            self.lrs[vcpu].end_of_interrupt(intid);
            true
        }

        fn enter(&mut self, gic: &mut VgicState, vcpu: usize) {
            let outcome = gic.fill(vcpu, &mut self.lrs[vcpu]).unwrap();
            check_fill(gic, &self.lrs, vcpu, outcome);
        }
    }

    /// Random edge injections (SPIs, PPIs, SGIs between the two vCPUs),
    /// fills and guest acknowledges/EOIs with 1 to 4 list registers. After
    /// every fill: no INTID twice in a vCPU's list registers, no SPI in both
    /// vCPUs', and when candidates were left over none of them is more
    /// urgent than a listed pending one. Every interrupt is acknowledged at
    /// most as often as it was injected, and after draining every injection
    /// was acknowledged and nothing is left pending or active.
    #[test]
    fn randomised_injection_is_delivered_in_priority_order_and_never_lost() {
        for seed in 1..=40u64 {
            let mut rng = Stream(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let all: Vec<u32> = (0..96).collect();
            let mut gic = ready(&all);
            for word in 2..6 {
                gic.distributor_write(0xc00 + 4 * word, 4, 0xaaaa_aaaa)
                    .unwrap();
            }
            for intid in 0..96u64 {
                let priority = rng.below(256);
                if intid < 32 {
                    for vcpu in 0..2 {
                        gic.sgi_base_write(vcpu, 0x400 + intid, 1, priority)
                            .unwrap();
                    }
                } else {
                    gic.distributor_write(0x400 + intid, 1, priority).unwrap();
                    gic.distributor_write(0x6000 + 8 * intid, 8, rng.below(2))
                        .unwrap();
                }
            }
            let mut guest = Guest {
                lrs: [
                    ModelListRegisters::new(1 + rng.below(4) as usize),
                    ModelListRegisters::new(1 + rng.below(4) as usize),
                ],
                injected: [[0; 96]; 2],
                acked: [[0; 96]; 2],
                owed: [[false; 96]; 2],
                running: [Vec::new(), Vec::new()],
            };
            for _ in 0..400 {
                match rng.below(5) {
                    0 => {
                        let intid = 32 + rng.below(64) as u32;
                        gic.inject_spi_edge(intid).unwrap();
                        guest.sent(gic.spi_target(intid).unwrap(), intid);
                    }
                    1 => {
                        let vcpu = rng.below(2) as usize;
                        let intid = 16 + rng.below(16) as u32;
                        gic.inject_ppi_edge(vcpu, intid).unwrap();
                        guest.sent(vcpu, intid);
                    }
                    2 => {
                        let sender = rng.below(2) as usize;
                        let intid = rng.below(16);
                        let value = intid << 24 | rng.below(4);
                        let targets = gic.send_sgi(sender, value, SgiGroup::Group1).unwrap();
                        for target in targets.iter() {
                            guest.sent(target, intid as u32);
                        }
                    }
                    _ => {
                        let vcpu = rng.below(2) as usize;
                        guest.enter(&mut gic, vcpu);
                        for _ in 0..rng.below(4) {
                            if rng.below(2) == 0 {
                                guest.acknowledge(vcpu);
                            } else {
                                guest.complete_innermost(vcpu);
                            }
                        }
                    }
                }
            }
            // Drain: the guest takes and completes everything.
            for _ in 0..2000 {
                for vcpu in 0..2 {
                    guest.enter(&mut gic, vcpu);
                    while guest.acknowledge(vcpu) {}
                    while guest.complete_innermost(vcpu) {}
                }
            }
            for vcpu in 0..2 {
                gic.fold(vcpu, &mut guest.lrs[vcpu]).unwrap();
                for intid in 0..96 {
                    assert!(
                        !guest.owed[vcpu][intid],
                        "seed {seed}: vCPU {vcpu} never took INTID {intid}"
                    );
                    assert!(
                        guest.acked[vcpu][intid] <= guest.injected[vcpu][intid],
                        "seed {seed}: INTID {intid} taken more often than injected"
                    );
                    let irq = gic.irq(vcpu, intid as u32).unwrap();
                    assert!(
                        !irq.pending() && !irq.active,
                        "seed {seed}: INTID {intid} left over"
                    );
                }
            }
        }
    }

    fn check_fill(
        gic: &VgicState,
        lrs: &[ModelListRegisters; 2],
        vcpu: usize,
        outcome: FillOutcome,
    ) {
        let mine: Vec<ListRegister> = lrs[vcpu]
            .list_registers()
            .iter()
            .map(|&v| ListRegister(v))
            .filter(|lr| !lr.is_empty())
            .collect();
        assert_eq!(mine.len(), outcome.listed);
        for (i, a) in mine.iter().enumerate() {
            assert!(
                mine[i + 1..].iter().all(|b| b.intid() != a.intid()),
                "INTID listed twice"
            );
            if a.intid() >= 32 {
                let other = &lrs[1 - vcpu];
                assert!(
                    other.list_registers().iter().all(|&v| {
                        let lr = ListRegister(v);
                        lr.is_empty() || lr.intid() != a.intid()
                    }),
                    "SPI {} in both vCPUs' list registers",
                    a.intid()
                );
            }
        }
        if outcome.left_over > 0 {
            let listed_pending_worst = mine
                .iter()
                .filter(|lr| lr.pending() && !lr.active())
                .map(|lr| lr.priority())
                .max();
            let unlisted_best = (0..96u32)
                .filter(|&intid| {
                    let irq = gic.irq(vcpu, intid).unwrap();
                    irq.listed_on.is_none()
                        && !irq.active
                        && gic.deliverable(irq)
                        && gic.target_of(vcpu, intid) == Some(vcpu)
                })
                .map(|intid| gic.irq(vcpu, intid).unwrap().priority)
                .min();
            if let (Some(worst), Some(best)) = (listed_pending_worst, unlisted_best) {
                assert!(worst <= best, "a more urgent interrupt was left over");
            }
        }
    }
}
