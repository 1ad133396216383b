//! Moving interrupts between the model and a vCPU's list registers.
//!
//! Fold (after an exit): for each list register the last fill wrote, read
//! its state (an `ELRSR` bit means empty without reading it) and merge it
//! into the interrupt (`IrqState::fold`): an acknowledged interrupt's
//! pending state is consumed and it goes in service, an EOI'd one is no
//! longer active, a level interrupt whose line is still high is pending
//! again. Before that, deactivations of interrupts that had no list register
//! (`ICH_HCR_EL2.EOIcount`) retire that many of the vCPU's in-service
//! interrupts that no list register held active, most urgent first: with
//! EOImode 0 a guest completes nested interrupts innermost first, and the
//! innermost is the most urgent (done before the list registers are read
//! back, so one the guest acknowledged since the last fill is not mistaken
//! for an unlisted one).
//!
//! Fill (before entry): fold first, then choose what the list registers
//! hold, the way the GIC decides what to signal. The *running priority* is
//! the most urgent priority among the vCPU's in-service interrupts (what its
//! active-priority registers hold); an interrupt made active through
//! `ISACTIVER` does not raise it. Candidates are the vCPU's private
//! interrupts, the SPIs routed to it and the LPIs targeting it that are
//! active or deliverable and
//! not held by another vCPU's list registers, ranked:
//!
//! 1. in-service interrupts, and pending ones that can preempt (more urgent
//!    than the running priority), together by priority: a pending interrupt
//!    that can preempt is always listed, even if that leaves an in-service
//!    one out (its EOI is then counted in `EOIcount`);
//! 2. the other pending interrupts, by priority;
//! 3. active interrupts the guest did not take through its CPU interface
//!    (`ISACTIVER`): they only use list registers nothing else needs, and
//!    otherwise stay in the model, where the distributor registers reach
//!    them.
//!
//! Ties go to the lower INTID. Each chosen one goes to one list register
//! (group, priority, state); a level interrupt is listed with EOI
//! maintenance, and while it is active it is listed active only, so the line
//! is re-sampled after its EOI instead of a stale pending state being
//! delivered again. A PPI or SPI linked to a physical one
//! ([`VgicState::link_hardware_ppi`]: the timers;
//! [`VgicState::link_hardware_spi`]: passed-through devices) is listed as a hardware
//! interrupt instead (HW, pINTID, no EOI maintenance): the guest's
//! deactivation deactivates the physical PPI, which fires again if its line
//! is still high. The fold records each hardware list register the guest
//! deactivated ([`VgicState::take_hardware_completions`]), so the caller
//! knows the physical interrupt is inactive again. The unused list registers that an earlier fill wrote
//! are cleared; the others are empty already and are not touched, and
//! `ICH_HCR_EL2` is written only when it changes (read once per fill), so
//! a fill with nothing to list reads one register.
//!
//! When pending interrupts were left out, maintenance interrupts ask for the
//! next fill at the moment one could be taken: `ICH_HCR_EL2.UIE` once at most
//! one list register is still valid (the listed pending ones were taken and
//! completed), and EOI maintenance on each listed in-service interrupt (its
//! EOI lowers the running priority, which may let a left-out one preempt);
//! with a single list register, which would underflow at once, the listed
//! interrupt gets EOI maintenance instead of UIE. When an in-service
//! interrupt was left out, `LRENPIE` asks for maintenance once `EOIcount`
//! counts its EOI. `NPIE` is not needed: a left-out pending interrupt never
//! outranks a listed pending one, so nothing waits for the listed ones to be
//! acknowledged. Everything that changes an interrupt from outside
//! (`I[SC]ACTIVER`, `I[SC]PENDR`, `IPRIORITYR`, `IGROUPR`, enables, routes)
//! kicks the vCPU whose list registers hold it, whose next fill folds the
//! list register and lists it again as the model now says, or takes it out.
//! An interrupt routed elsewhere meanwhile can only be listed by its new
//! target after that fold, so the fold records the target
//! ([`VgicState::take_released`]) for the caller to kick once more.

use super::irq::{FIRST_SPI, PRIVATE_COUNT, Trigger};
use super::list_regs::{
    ICH_HCR_EN, ICH_HCR_EOICOUNT_MASK, ICH_HCR_EOICOUNT_SHIFT, ICH_HCR_LRENPIE, ICH_HCR_UIE,
    ListRegister, ListRegisters, MAX_LIST_REGISTERS,
};
use super::lpi::FIRST_LPI;
use super::{VcpuSet, VgicError, VgicState};

/// What a fill put in the list registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillOutcome {
    /// List registers written with an interrupt.
    pub listed: usize,
    /// Candidates that did not fit.
    pub left_over: usize,
}

/// Why a candidate wants a list register.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Taken by the guest and not completed.
    #[default]
    InService,
    /// Pending and deliverable (not active).
    Pending,
    /// Active through `ISACTIVER`, not taken by the guest.
    ActiveOnly,
}

/// A candidate for a list register; the derived order is the fill order
/// (rank, then priority, then INTID).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    /// 0: in service or can preempt; 1: other pending; 2: active only.
    rank: u8,
    priority: u8,
    intid: u32,
    kind: Kind,
}

impl VgicState {
    /// Copies the state of `vcpu`'s list registers back into the model. Call
    /// it after every exit of the vCPU, on the CPU that ran it; calling it
    /// again before the next fill changes nothing.
    pub fn fold(&mut self, vcpu: usize, lrs: &mut impl ListRegisters) -> Result<(), VgicError> {
        self.fold_reading_hcr(vcpu, lrs).map(|_| ())
    }

    /// [`fold`](Self::fold), returning `ICH_HCR_EL2` as it is afterwards
    /// (so that a fill need not read it again). `ELRSR` is read only when
    /// something is listed: each access of a virtual-interface register is
    /// work at EL2 (an exit's worth under emulation, where it serialises).
    fn fold_reading_hcr(
        &mut self,
        vcpu: usize,
        lrs: &mut impl ListRegisters,
    ) -> Result<u64, VgicError> {
        if vcpu >= self.vcpus.len() {
            return Err(VgicError::NoSuchVcpu(vcpu));
        }
        // EOIcount first: the interrupts the guest completed without a list
        // register are told apart from the ones still listed (a list register
        // the guest acknowledged since the last fill is not folded yet).
        let mut hcr = lrs.read_hcr();
        let eoi_count = (hcr & ICH_HCR_EOICOUNT_MASK) >> ICH_HCR_EOICOUNT_SHIFT;
        if eoi_count != 0 {
            for _ in 0..eoi_count {
                if !self.complete_unlisted(vcpu) {
                    break;
                }
            }
            hcr &= !ICH_HCR_EOICOUNT_MASK;
            lrs.write_hcr(hcr);
        }
        if self.vcpus[vcpu].listed.iter().all(Option::is_none) {
            return Ok(hcr);
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
                let hardware_done = irq.listed_hw && lr.is_empty();
                irq.fold(lr.pending(), lr.active(), lr.priority());
                if hardware_done && intid < PRIVATE_COUNT {
                    self.vcpus[vcpu].hardware_completed |= 1 << intid;
                } else if hardware_done {
                    self.hardware_spi_completed(intid);
                }
                // Routed elsewhere while listed here: its new target could
                // not list it until now, so it must fill again.
                if let Some(target) = self.target_of(vcpu, intid)
                    && target != vcpu
                    && self
                        .irq(vcpu, intid)
                        .is_some_and(|irq| self.deliverable(irq))
                {
                    self.released.insert(target);
                }
            }
            if intid >= FIRST_LPI {
                self.forget_lpi_if_dead(intid);
            }
        }
        Ok(hcr)
    }

    /// Takes the vCPUs that folds since the last call found an interrupt
    /// for: one that was re-routed (or moved, for an LPI) while another
    /// vCPU's list registers held it. Its new target's fills skipped it
    /// until that vCPU folded, so the caller kicks these.
    pub fn take_released(&mut self) -> VcpuSet {
        core::mem::take(&mut self.released)
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
        self.vcpus[vcpu].written = 0;
        lrs.write_hcr(0);
        Ok(())
    }

    /// Completes (takes out of service and deactivates) `vcpu`'s most urgent
    /// in-service interrupt that no list register holds active: the guest
    /// EOI'd it and `EOIcount` counted it. Returns whether there was one.
    fn complete_unlisted(&mut self, vcpu: usize) -> bool {
        let mut best: Option<(u8, u32)> = None;
        self.for_each_candidate(
            vcpu,
            |state, intid| {
                let irq = state.irq(vcpu, intid)?;
                let priority = irq.in_service?;
                let listed_active = irq.listed_on.is_some() && irq.listed_active;
                (!listed_active).then_some((priority, intid))
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
                irq.in_service = None;
                irq.taken_on = None;
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
                && self.target_of(vcpu, intid) == Some(vcpu)
            {
                take(key);
            }
        }
        for &intid in self.lpis.keys() {
            if self.target_of(vcpu, intid) == Some(vcpu)
                && let Some(key) = select(self, intid)
            {
                take(key);
            }
        }
    }

    /// `vcpu`'s running priority: the most urgent priority among its
    /// in-service interrupts (`None`: idle, anything may preempt).
    fn running_priority(&self, vcpu: usize) -> Option<u8> {
        let mut running: Option<u8> = None;
        self.for_each_candidate(
            vcpu,
            |state, intid| state.irq(vcpu, intid)?.in_service,
            |priority| running = Some(running.map_or(priority, |r| r.min(priority))),
        );
        running
    }

    /// The rank of `intid` as a list-register candidate of `vcpu` (see the
    /// module docs), or `None` if it needs no list register or another vCPU's
    /// list registers hold it.
    fn candidate(&self, vcpu: usize, intid: u32, running: Option<u8>) -> Option<Candidate> {
        let irq = self.irq(vcpu, intid)?;
        if irq.listed_on.is_some() {
            return None;
        }
        let (rank, priority, kind) = match irq.in_service {
            Some(taken_at) if irq.active => (0, taken_at, Kind::InService),
            _ if irq.active => (2, irq.priority, Kind::ActiveOnly),
            _ if self.deliverable(irq) => {
                let preempts = running.is_none_or(|r| irq.priority < r);
                (u8::from(!preempts), irq.priority, Kind::Pending)
            }
            _ => return None,
        };
        Some(Candidate {
            rank,
            priority,
            intid,
            kind,
        })
    }

    /// Folds `vcpu`'s list registers, then fills them with the interrupts
    /// that need them most and programs `ICH_HCR_EL2` (En, and UIE/LRENPIE
    /// when some did not fit; EOIcount cleared; the other bits kept). Call it
    /// last before entering the vCPU.
    pub fn fill(
        &mut self,
        vcpu: usize,
        lrs: &mut impl ListRegisters,
    ) -> Result<FillOutcome, VgicError> {
        let hcr_now = self.fold_reading_hcr(vcpu, lrs)?;
        let count = lrs.count().min(MAX_LIST_REGISTERS);
        let running = self.running_priority(vcpu);
        let mut best = [Candidate::default(); MAX_LIST_REGISTERS];
        let mut len = 0;
        let mut left_over = 0;
        let mut pending_left_over = false;
        let mut in_service_left_over = false;
        let mut leave_out = |candidate: Candidate| {
            left_over += 1;
            pending_left_over |= candidate.kind == Kind::Pending;
            in_service_left_over |= candidate.kind == Kind::InService;
        };
        self.for_each_candidate(
            vcpu,
            |state, intid| state.candidate(vcpu, intid, running),
            |candidate| {
                let position = best[..len].partition_point(|&b| b <= candidate);
                if position >= count {
                    leave_out(candidate);
                    return;
                }
                if len == count {
                    leave_out(best[count - 1]);
                } else {
                    len += 1;
                }
                best.copy_within(position..len - 1, position + 1);
                best[position] = candidate;
            },
        );

        for (index, candidate) in best[..len].iter().enumerate() {
            let intid = candidate.intid;
            let deliverable = self
                .irq(vcpu, intid)
                .is_some_and(|irq| self.deliverable(irq));
            // Maintenance at this one's EOI when a left-out pending interrupt
            // may be able to preempt after it (or when a single list
            // register has to be refilled behind it).
            let eoi_wake = pending_left_over && (count == 1 || candidate.kind == Kind::InService);
            // A hardware-linked PPI needs no EOI maintenance to re-sample its
            // line: its physical interrupt fires again after the guest's
            // deactivation if the line is still high.
            let hardware = self.hardware_intid(intid).filter(|_| !eoi_wake);
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            let level = irq.trigger == Trigger::Level;
            // A GICv2 SGI in service from one source is listed active only,
            // naming that source (one list register names one source); its
            // EOI maintenance brings the pending sources in after it.
            let active_source = irq.active_source.filter(|_| irq.active);
            let pending = deliverable && !(level && irq.active) && active_source.is_none();
            let mut lr = ListRegister::virtual_interrupt(
                intid,
                irq.priority,
                irq.group1,
                pending,
                irq.active,
                (level && hardware.is_none()) || eoi_wake || active_source.is_some(),
            );
            irq.list(vcpu as u16, pending, irq.active);
            if let Some(pintid) = hardware {
                lr = lr.hardware(pintid);
                irq.listed_hw = true;
            }
            // A GICv2 SGI names one of its sources.
            if let Some(source) = active_source.or(pending.then(|| irq.next_source()).flatten()) {
                lr = lr.with_source(source);
                irq.listed_source = Some(source);
            }
            self.vcpus[vcpu].listed[index] = Some(intid);
            self.vcpus[vcpu].written |= 1 << index;
            lrs.write_lr(index, lr.0);
        }
        // Only the registers a fill wrote can hold anything (load and
        // unload empty them all); the others need no write.
        for index in len..count {
            if self.vcpus[vcpu].written & (1 << index) != 0 {
                lrs.write_lr(index, ListRegister::EMPTY.0);
                self.vcpus[vcpu].written &= !(1 << index);
            }
        }
        // Keep the ICH_HCR_EL2 bits this module does not own (trap controls).
        let owned = ICH_HCR_EN | ICH_HCR_UIE | ICH_HCR_LRENPIE | ICH_HCR_EOICOUNT_MASK;
        let mut hcr = (hcr_now & !owned) | ICH_HCR_EN;
        if pending_left_over && count > 1 {
            hcr |= ICH_HCR_UIE;
        }
        if in_service_left_over {
            hcr |= ICH_HCR_LRENPIE;
        }
        if hcr != hcr_now {
            lrs.write_hcr(hcr);
        }
        Ok(FillOutcome {
            listed: len,
            left_over,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::list_regs::{ICH_MISR_EOI, ICH_MISR_LRENP, ICH_MISR_U, ModelListRegisters};
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

    /// A model that counts the accesses a fill makes.
    struct CountingLrs {
        model: ModelListRegisters,
        reads: core::cell::Cell<usize>,
        writes: usize,
    }

    impl CountingLrs {
        fn new(count: usize) -> Self {
            Self {
                model: ModelListRegisters::new(count),
                reads: core::cell::Cell::new(0),
                writes: 0,
            }
        }

        /// (reads, writes) since the last call.
        fn take(&mut self) -> (usize, usize) {
            let counts = (self.reads.take(), self.writes);
            self.writes = 0;
            counts
        }

        fn read(&self) {
            self.reads.set(self.reads.get() + 1);
        }
    }

    impl ListRegisters for CountingLrs {
        fn count(&self) -> usize {
            self.model.count()
        }
        fn read_lr(&self, index: usize) -> u64 {
            self.read();
            self.model.read_lr(index)
        }
        fn write_lr(&mut self, index: usize, value: u64) {
            self.writes += 1;
            self.model.write_lr(index, value);
        }
        fn read_hcr(&self) -> u64 {
            self.read();
            self.model.read_hcr()
        }
        fn write_hcr(&mut self, value: u64) {
            self.writes += 1;
            self.model.write_hcr(value);
        }
        fn read_misr(&self) -> u64 {
            self.read();
            self.model.read_misr()
        }
        fn read_elrsr(&self) -> u64 {
            self.read();
            self.model.read_elrsr()
        }
    }

    #[test]
    fn a_fill_touches_only_what_changed() {
        let mut gic = ready(&[40]);
        let mut lrs = CountingLrs::new(4);
        gic.unload(0, &mut lrs).unwrap();
        lrs.take();
        // The first fill turns the interface on; the next has nothing to do
        // but read ICH_HCR_EL2.
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.take(), (1, 1));
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.take(), (1, 0));
        // An interrupt: one list register written.
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.take(), (1, 1));
        assert_eq!(listed(&lrs.model).len(), 1);
        // Taken and completed: ICH_HCR_EL2, ELRSR and the list register are
        // read back, and the list register is cleared once.
        let intid = lrs.model.acknowledge().unwrap();
        lrs.model.end_of_interrupt(intid);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.take(), (3, 1));
        assert!(listed(&lrs.model).is_empty());
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.take(), (1, 0));
        // A fold before the fill (a GIC register access) does not lose track
        // of the register to clear.
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        let intid = lrs.model.acknowledge().unwrap();
        lrs.model.end_of_interrupt(intid);
        gic.fold(0, &mut lrs).unwrap();
        lrs.model.write_lr(0, ListRegister::EMPTY.0 | 0xdead);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.model.list_registers()[0], ListRegister::EMPTY.0);
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
    fn preempting_interrupts_are_listed_before_the_one_in_service() {
        let mut gic = ready(&[40, 41, 42, 43, 44]);
        let mut lrs = ModelListRegisters::new(2);
        gic.distributor_write(0x400 + 44, 1, 0xf0).unwrap();
        gic.inject_spi_edge(44).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(44));
        // More urgent ones arrive while 44 is in service: they take the list
        // registers, 44 waits in the model for its EOI (LRENPIE).
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
        assert_eq!(listed(&lrs), vec![(40, 0, 1), (41, 0, 1)]);
        let irq = gic.irq(0, 44).unwrap();
        assert!(irq.active && irq.in_service == Some(0xf0));
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN | ICH_HCR_UIE | ICH_HCR_LRENPIE);
        for expected in [40, 41] {
            assert_eq!(lrs.acknowledge(), Some(expected));
            lrs.end_of_interrupt(expected);
        }
        assert_eq!(lrs.read_misr() & ICH_MISR_U, ICH_MISR_U);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(42, 0, 1), (43, 0, 1)]);
        for expected in [42, 43] {
            assert_eq!(lrs.acknowledge(), Some(expected));
            lrs.end_of_interrupt(expected);
        }
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(44, 0xf0, 2)], "back for its EOI");
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN);
        lrs.end_of_interrupt(44);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![]);
        assert!((40..45).all(|i| {
            let irq = gic.irq(0, i).unwrap();
            !irq.active && !irq.pending() && irq.in_service.is_none()
        }));
    }

    #[test]
    fn eoi_of_an_unlisted_in_service_interrupt_is_counted_and_applied() {
        let mut gic = ready(&[40, 41]);
        let mut lrs = ModelListRegisters::new(1);
        gic.distributor_write(0x400 + 41, 1, 0x10).unwrap();
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(40));
        gic.inject_spi_edge(41).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        // 40 (in service) holds the only LR; 41 cannot preempt it and waits
        // for 40's EOI, which raises EOI maintenance.
        assert_eq!(listed(&lrs), vec![(40, 0, 2)]);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN, "a single LR never uses UIE");
        assert!(ListRegister(lrs.read_lr(0)).eoi_maintenance());
        lrs.end_of_interrupt(40);
        assert_eq!(lrs.read_misr() & ICH_MISR_EOI, ICH_MISR_EOI);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(41, 0x10, 1)]);
        assert_eq!(lrs.acknowledge(), Some(41));
        // 40 again while 41 is in service: 40 is more urgent, so it takes the
        // LR and 41 waits in the model (LRENPIE).
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(40, 0, 1)]);
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN | ICH_HCR_LRENPIE);
        assert_eq!(lrs.acknowledge(), Some(40));
        lrs.end_of_interrupt(40);
        assert_eq!(
            lrs.read_misr() & ICH_MISR_LRENP,
            0,
            "40 completed in its LR"
        );
        // The EOI of 41, which no LR holds, counts in EOIcount: LRENP.
        lrs.end_of_interrupt(41);
        assert_eq!(lrs.read_misr() & ICH_MISR_LRENP, ICH_MISR_LRENP);
        gic.fold(0, &mut lrs).unwrap();
        let irq = gic.irq(0, 41).unwrap();
        assert!(!irq.active && irq.in_service.is_none());
        assert!(!gic.irq(0, 40).unwrap().active);
        assert_eq!(lrs.read_hcr() & ICH_HCR_EOICOUNT_MASK, 0);
        // An EOI count with nothing in service changes nothing.
        gic.distributor_write(0x300 + 4, 4, 1 << 8).unwrap();
        lrs.end_of_interrupt(40);
        gic.fold(0, &mut lrs).unwrap();
        assert!(gic.irq(0, 40).unwrap().active, "ISACTIVER'd, not taken");
    }

    #[test]
    fn distributor_active_interrupts_make_room_for_pending_ones() {
        let spis = [40, 41, 42, 43];
        let mut gic = ready(&[1, 27, 40, 41, 42, 43]);
        let mut lrs = ModelListRegisters::new(4);
        for intid in spis {
            gic.distributor_write(0x400 + intid, 1, 0xa0).unwrap();
        }
        gic.sgi_base_write(0, 0x400 + 27, 1, 0x80).unwrap();
        gic.sgi_base_write(0, 0x400 + 1, 1, 0x90).unwrap();
        // GICD_ISACTIVER1: 40..=43 active, never acknowledged.
        gic.distributor_write(0x304, 4, 0xf << 8).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(
            listed(&lrs),
            vec![(40, 0xa0, 2), (41, 0xa0, 2), (42, 0xa0, 2), (43, 0xa0, 2)],
            "spare list registers may hold them"
        );
        gic.set_ppi_level(0, VTIMER_INTID, true).unwrap();
        gic.send_sgi(0, 1 << 24 | 1, SgiGroup::Group1).unwrap();
        let outcome = gic.fill(0, &mut lrs).unwrap();
        assert_eq!(
            outcome,
            FillOutcome {
                listed: 4,
                left_over: 2
            }
        );
        assert_eq!(
            listed(&lrs),
            vec![(27, 0x80, 1), (1, 0x90, 1), (40, 0xa0, 2), (41, 0xa0, 2)]
        );
        assert_eq!(lrs.read_hcr(), ICH_HCR_EN, "nothing waits to be taken");
        assert_eq!(lrs.acknowledge(), Some(27));
        gic.set_ppi_level(0, VTIMER_INTID, false).unwrap();
        lrs.end_of_interrupt(27);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(1));
        lrs.end_of_interrupt(1);
        // ICACTIVER1 reaches listed and unlisted ones alike.
        gic.fold(0, &mut lrs).unwrap();
        gic.distributor_write(0x384, 4, 0xf << 8).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(gic.distributor_read(0x304, 4), Ok(0));
        assert_eq!(listed(&lrs), vec![]);
    }

    #[test]
    fn priority_and_group_changes_reach_the_list_registers() {
        let mut gic = ready(&[40, 41]);
        gic.distributor_write(0, 4, 0x13).unwrap();
        let mut lrs = ModelListRegisters::new(1);
        gic.distributor_write(0x400 + 40, 1, 0x80).unwrap();
        gic.distributor_write(0x400 + 41, 1, 0x90).unwrap();
        gic.inject_spi_edge(40).unwrap();
        gic.inject_spi_edge(41).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(40, 0x80, 1)]);
        // Listed, and vCPU 1 makes the other one more urgent: vCPU 0 is
        // kicked and its next fill swaps them.
        let kicks = gic.distributor_write(0x400 + 41, 1, 0x10).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![0]);
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(41, 0x10, 1)]);
        // A group change of the listed one reaches its LR.
        let kicks = gic.distributor_write(0x84, 4, !(1 << 9)).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![0]);
        gic.fill(0, &mut lrs).unwrap();
        assert!(!ListRegister(lrs.read_lr(0)).group1());
        // Group 0 disabled: withdrawn, 40 takes its place.
        gic.distributor_write(0, 4, 0x12).unwrap();
        gic.fill(0, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(40, 0x80, 1)]);
        assert!(gic.irq(0, 41).unwrap().pending());
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
    fn timer_lines_dropping_while_the_guest_masks_irqs_withdraw_on_every_vcpu() {
        // Each vCPU's timers fired while the guest had IRQs masked: both
        // INTIDs listed pending, none acknowledged. The guest then disables
        // one timer (the sample before the next entry drops its line): the
        // fill takes that list register back and keeps the other.
        for (stale, kept) in [(PTIMER_INTID, VTIMER_INTID), (VTIMER_INTID, PTIMER_INTID)] {
            let mut gic = ready(&[VTIMER_INTID, PTIMER_INTID]);
            let mut lrs = [ModelListRegisters::new(4), ModelListRegisters::new(4)];
            for (vcpu, lrs) in lrs.iter_mut().enumerate() {
                gic.set_ppi_level(vcpu, VTIMER_INTID, true).unwrap();
                gic.set_ppi_level(vcpu, PTIMER_INTID, true).unwrap();
                gic.fill(vcpu, lrs).unwrap();
                assert_eq!(listed(lrs), vec![(27, 0, 1), (30, 0, 1)]);
            }
            for (vcpu, lrs) in lrs.iter_mut().enumerate() {
                // The holder is told to refill (its own exit does it).
                let kicks = gic.set_ppi_level(vcpu, stale, false).unwrap();
                assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![vcpu]);
                gic.fill(vcpu, lrs).unwrap();
                assert_eq!(listed(lrs), vec![(kept, 0, 1)], "vcpu{vcpu}");
                assert!(!gic.irq(vcpu, stale).unwrap().pending());
            }
        }
    }

    #[test]
    fn timer_line_dropping_after_the_acknowledge_keeps_it_active_until_eoi() {
        // Acknowledged before the line dropped: it stays listed active (the
        // guest owes its EOI) and is not pending again afterwards.
        let mut gic = ready(&[PTIMER_INTID]);
        let mut lrs = ModelListRegisters::new(4);
        gic.set_ppi_level(1, PTIMER_INTID, true).unwrap();
        gic.fill(1, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(30));
        gic.set_ppi_level(1, PTIMER_INTID, false).unwrap();
        gic.fill(1, &mut lrs).unwrap();
        assert_eq!(listed(&lrs), vec![(30, 0, 2)]);
        lrs.end_of_interrupt(30);
        gic.fill(1, &mut lrs).unwrap();
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
        assert_eq!(gic.take_released(), VcpuSet::EMPTY);
        // vCPU 0 took it: it stays there, active, until completed there.
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![(40, 0, 2)], "in service on vCPU 0");
        assert_eq!(gic.take_released(), VcpuSet::EMPTY);
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs1), vec![]);
        // Pended again meanwhile: it waits for vCPU 0's EOI, then goes to
        // vCPU 1, whose fill the fold asks for.
        gic.inject_spi_edge(40).unwrap();
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(
            listed(&lrs0),
            vec![(40, 0, 2)],
            "active; the new edge waits"
        );
        lrs0.end_of_interrupt(40);
        gic.fill(0, &mut lrs0).unwrap();
        assert_eq!(listed(&lrs0), vec![], "completed: vCPU 0 lets it go");
        assert_eq!(gic.take_released().iter().collect::<Vec<_>>(), vec![1]);
        gic.fill(1, &mut lrs1).unwrap();
        assert_eq!(listed(&lrs1), vec![(40, 0, 1)], "pending, now with vCPU 1");
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
}
