//! The randomised delivery model test of the virtual GIC (host only).
//!
//! Two vCPUs, 96 INTIDs (SGIs, PPIs, 64 SPIs), each vCPU with 1 to 4 list
//! registers, so they are nearly always scarce. A deterministic stream of
//! operations drives the model the way devices, vCPUs and guests do: edge
//! injections (SPIs, PPIs, SGIs between the vCPUs), `ISACTIVER` and
//! `ICACTIVER` writes (interrupts made active through the distributor, never
//! acknowledged), `IPRIORITYR` and `IGROUPR` changes of any interrupt
//! (pending, listed, in service), group 0 enable changes in `GICD_CTLR`, and
//! vCPU entries (fold and fill) after which the guest acknowledges and
//! completes interrupts through [`ModelListRegisters`], which keeps the
//! active priorities as the CPU interface does and signals only what can
//! preempt the running priority.
//!
//! After every fill it checks the GIC's delivery rule: if the highest-priority
//! deliverable pending interrupt of the vCPU can preempt the guest's running
//! priority, the CPU interface signals it (or one at least as urgent) at this
//! entry. It also checks that no INTID is listed twice, that no SPI is in two
//! vCPUs' list registers, that every listed interrupt carries its current
//! priority and group and is listed pending only if it is deliverable, and
//! that no left-out pending interrupt is more urgent than a listed pending
//! one. After a drain (the `ISACTIVER` ones cleared through `ICACTIVER`,
//! group 0 enabled again, the guest taking and completing everything) every
//! injection was taken at least once, none more often than it was sent, and
//! nothing is left pending or active.
//!
//! The run is made three times: the GICv3 front end with GICv3 list
//! registers; the same with list registers that keep only what a GICv2
//! `GICH_LR` holds (every value written goes through that layout and back);
//! and the GICv2 front end on GICv2 list registers (registers banked in the
//! distributor, `ITARGETSR` routes, SGIs from `GICD_SGIR` pending once per
//! source, each source delivered on its own).

use super::list_regs::{ListRegister, LrEncoding, ModelListRegisters};
use super::sgi::SgiGroup;
use super::state::tests::two_vcpus;
use super::{VgicConfig, VgicState, VgicVersion};
use alloc::vec::Vec;

/// INTIDs the test uses: SGIs, PPIs and the 64 SPIs of [`two_vcpus`].
const INTIDS: usize = 96;

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

/// An interrupt made active through `ISACTIVER`: the bank (the vCPU for a
/// private INTID, `None` for an SPI) and the INTID.
type Activated = (Option<usize>, u32);

/// The guest side: what each vCPU was sent, what it took, the interrupts it
/// is handling (innermost last), and what the test made active through the
/// distributor.
struct Guest {
    lrs: [ModelListRegisters; 2],
    injected: [[u32; INTIDS]; 2],
    acked: [[u32; INTIDS]; 2],
    owed: [[bool; INTIDS]; 2],
    running: [Vec<u32>; 2],
    activated: Vec<Activated>,
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
        // Taken by the guest: its active state is the guest's now.
        let bank = (intid < 32).then_some(vcpu);
        self.activated.retain(|&a| a != (bank, intid));
        true
    }

    fn complete_innermost(&mut self, vcpu: usize) -> bool {
        let Some(intid) = self.running[vcpu].pop() else {
            return false;
        };
        self.lrs[vcpu].end_of_interrupt(intid);
        true
    }

    fn handling(&self, bank: Option<usize>, intid: u32) -> bool {
        match bank {
            Some(vcpu) => self.running[vcpu].contains(&intid),
            None => self.running.iter().any(|r| r.contains(&intid)),
        }
    }

    fn enter(&mut self, gic: &mut VgicState, vcpu: usize) {
        let outcome = gic.fill(vcpu, &mut self.lrs[vcpu]).unwrap();
        check_fill(gic, &self.lrs, vcpu, outcome.left_over);
    }
}

/// A register access of the front end under test: `bank` is the vCPU whose
/// private registers are meant (`None`: the distributor's SPI words). On a
/// GICv3 that is the vCPU's `SGI_base` frame or the distributor; on a GICv2
/// the distributor, banked by the accessing vCPU.
fn read_reg(gic: &VgicState, bank: Option<usize>, offset: u64, size: u8) -> u64 {
    match (gic.version(), bank) {
        (VgicVersion::V3, Some(vcpu)) => gic.sgi_base_read(vcpu, offset, size).unwrap(),
        (VgicVersion::V3, None) => gic.distributor_read(offset, size).unwrap(),
        (VgicVersion::V2, bank) => gic
            .distributor_v2_read(bank.unwrap_or(0), offset, size)
            .unwrap(),
    }
}

/// See [`read_reg`].
fn write_reg(gic: &mut VgicState, bank: Option<usize>, offset: u64, size: u8, value: u64) {
    match (gic.version(), bank) {
        (VgicVersion::V3, Some(vcpu)) => gic.sgi_base_write(vcpu, offset, size, value),
        (VgicVersion::V3, None) => gic.distributor_write(offset, size, value),
        (VgicVersion::V2, bank) => gic.distributor_v2_write(bank.unwrap_or(0), offset, size, value),
    }
    .unwrap();
}

/// Writes one bit of a one-bit-per-interrupt register (`base` is its offset
/// in the distributor, or in `SGI_base` for private INTIDs) by
/// read-modify-write when `keep_others` is set (`IGROUPR`), alone otherwise.
fn write_bit(gic: &mut VgicState, bank: Option<usize>, intid: u32, base: u64, set: bool) {
    let offset = base + 4 * u64::from(intid / 32);
    let bit = 1u64 << (intid % 32);
    let keep_others = base == 0x80;
    let old = if keep_others {
        read_reg(gic, bank, offset, 4)
    } else {
        0
    };
    let value = if set { old | bit } else { old & !bit };
    write_reg(gic, bank, offset, 4, value);
}

fn write_priority(gic: &mut VgicState, bank: Option<usize>, intid: u32, priority: u64) {
    write_reg(gic, bank, 0x400 + u64::from(intid), 1, priority);
}

/// A random INTID and its bank.
fn random_interrupt(rng: &mut Stream) -> Activated {
    let intid = rng.below(INTIDS as u64) as u32;
    let bank = (intid < 32).then(|| rng.below(2) as usize);
    (bank, intid)
}

/// Both groups on, every interrupt group 1, enabled, edge-triggered, with a
/// random priority and (SPIs) a random route (`IROUTER` on a GICv3,
/// `ITARGETSR` on a GICv2).
fn random_gic(rng: &mut Stream, version: VgicVersion) -> VgicState {
    let mut gic = match version {
        VgicVersion::V3 => two_vcpus(),
        VgicVersion::V2 => VgicState::new_v2(VgicConfig {
            distributor_base: 0x0800_0000,
            redistributor_base: 0x080a_0000,
            spi_count: 64,
            vcpu_mpidrs: alloc::vec![0x8000_0000, 0x8000_0001],
        })
        .unwrap(),
    };
    write_reg(&mut gic, None, 0, 4, 0x13);
    for word in 1..3 {
        write_reg(&mut gic, None, 0x80 + 4 * word, 4, 0xffff_ffff);
        write_reg(&mut gic, None, 0x100 + 4 * word, 4, 0xffff_ffff);
    }
    for word in 2..6 {
        write_reg(&mut gic, None, 0xc00 + 4 * word, 4, 0xaaaa_aaaa);
    }
    for vcpu in 0..2 {
        write_reg(&mut gic, Some(vcpu), 0x80, 4, 0xffff_ffff);
        write_reg(&mut gic, Some(vcpu), 0x100, 4, 0xffff_ffff);
        write_reg(&mut gic, Some(vcpu), 0xc04, 4, 0xaaaa_aaaa);
    }
    for intid in 0..INTIDS as u32 {
        if intid < 32 {
            for vcpu in 0..2 {
                write_priority(&mut gic, Some(vcpu), intid, rng.below(256));
            }
        } else {
            write_priority(&mut gic, None, intid, rng.below(256));
            let vcpu = rng.below(2);
            match version {
                VgicVersion::V3 => {
                    write_reg(&mut gic, None, 0x6000 + 8 * u64::from(intid), 8, vcpu)
                }
                VgicVersion::V2 => {
                    write_reg(&mut gic, None, 0x800 + u64::from(intid), 1, 1 << vcpu)
                }
            }
        }
    }
    gic
}

/// One random operation of the test.
fn step(gic: &mut VgicState, guest: &mut Guest, rng: &mut Stream) {
    match rng.below(12) {
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
            let targets = match gic.version() {
                VgicVersion::V3 => {
                    let value = intid << 24 | rng.below(4);
                    gic.send_sgi(sender, value, SgiGroup::Group1).unwrap()
                }
                // GICD_SGIR: a target list, or all but self, or self.
                VgicVersion::V2 => {
                    let value = rng.below(3) << 24 | rng.below(4) << 16 | intid;
                    gic.send_sgi_v2(sender, value as u32).unwrap()
                }
            };
            for target in targets.iter() {
                guest.sent(target, intid as u32);
            }
        }
        3 => {
            // ISACTIVER of an interrupt the guest is not handling.
            let (bank, intid) = random_interrupt(rng);
            if !guest.handling(bank, intid) && !guest.activated.contains(&(bank, intid)) {
                write_bit(gic, bank, intid, 0x300, true);
                guest.activated.push((bank, intid));
            }
        }
        4 => {
            if !guest.activated.is_empty() {
                let index = rng.below(guest.activated.len() as u64) as usize;
                let (bank, intid) = guest.activated.swap_remove(index);
                write_bit(gic, bank, intid, 0x380, true);
            }
        }
        5 => {
            let (bank, intid) = random_interrupt(rng);
            write_priority(gic, bank, intid, rng.below(256));
        }
        6 => {
            let (bank, intid) = random_interrupt(rng);
            write_bit(gic, bank, intid, 0x80, rng.below(2) == 0);
        }
        7 => {
            let grp0 = rng.below(2);
            write_reg(gic, None, 0, 4, 0x12 | grp0);
        }
        _ => {
            let vcpu = rng.below(2) as usize;
            guest.enter(gic, vcpu);
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

#[test]
fn randomised_delivery_follows_the_gic_rule_with_scarce_list_registers() {
    randomised_delivery(VgicVersion::V3, LrEncoding::V3);
}

/// The same run with list registers that hold only what a GICv2 `GICH_LR`
/// can: every value the fill writes goes through the 32-bit layout.
#[test]
fn randomised_delivery_through_gicv2_list_registers() {
    randomised_delivery(VgicVersion::V3, LrEncoding::V2);
}

/// The GICv2 front end on GICv2 list registers: banked distributor words,
/// `ITARGETSR` routes, SGIs through `GICD_SGIR`, pending per source.
#[test]
fn randomised_delivery_with_the_gicv2_front_end() {
    randomised_delivery(VgicVersion::V2, LrEncoding::V2);
}

fn randomised_delivery(version: VgicVersion, encoding: LrEncoding) {
    for seed in 1..=60u64 {
        let mut rng = Stream(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut gic = random_gic(&mut rng, version);
        let mut guest = Guest {
            lrs: [
                ModelListRegisters::new(1 + rng.below(4) as usize).with_encoding(encoding),
                ModelListRegisters::new(1 + rng.below(4) as usize).with_encoding(encoding),
            ],
            injected: [[0; INTIDS]; 2],
            acked: [[0; INTIDS]; 2],
            owed: [[false; INTIDS]; 2],
            running: [Vec::new(), Vec::new()],
            activated: Vec::new(),
        };
        for _ in 0..600 {
            step(&mut gic, &mut guest, &mut rng);
        }
        // Drain: the distributor's active states cleared, both groups on,
        // then the guest takes and completes everything.
        for (bank, intid) in core::mem::take(&mut guest.activated) {
            write_bit(&mut gic, bank, intid, 0x380, true);
        }
        write_reg(&mut gic, None, 0, 4, 0x13);
        for _ in 0..2000 {
            for vcpu in 0..2 {
                guest.enter(&mut gic, vcpu);
                while guest.acknowledge(vcpu) {}
                while guest.complete_innermost(vcpu) {}
            }
        }
        for vcpu in 0..2 {
            gic.fold(vcpu, &mut guest.lrs[vcpu]).unwrap();
            for intid in 0..INTIDS {
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

/// Whether `intid` is a candidate of `vcpu`: routed to it and not held by
/// the other vCPU's list registers.
fn reaches(gic: &VgicState, vcpu: usize, intid: u32) -> bool {
    let irq = gic.irq(vcpu, intid).unwrap();
    gic.target_of(vcpu, intid) == Some(vcpu) && irq.listed_on.is_none_or(|v| usize::from(v) == vcpu)
}

fn check_fill(gic: &VgicState, lrs: &[ModelListRegisters; 2], vcpu: usize, left_over: usize) {
    let mine: Vec<ListRegister> = lrs[vcpu]
        .list_registers()
        .iter()
        .map(|&v| ListRegister(v))
        .filter(|lr| !lr.is_empty())
        .collect();
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
        // What the model says now is what the list register says.
        let irq = gic.irq(vcpu, a.intid()).unwrap();
        assert_eq!(a.priority(), irq.priority, "stale priority in an LR");
        assert_eq!(a.group1(), irq.group1, "stale group in an LR");
        assert!(
            !a.pending() || gic.deliverable(irq),
            "INTID {} listed pending but not deliverable",
            a.intid()
        );
    }
    // The GIC rule: the most urgent deliverable pending interrupt that can
    // preempt the running priority is signalled now.
    let best_pending = (0..INTIDS as u32)
        .filter(|&intid| {
            let irq = gic.irq(vcpu, intid).unwrap();
            reaches(gic, vcpu, intid) && !irq.active && gic.deliverable(irq)
        })
        .map(|intid| (gic.irq(vcpu, intid).unwrap().priority, intid))
        .min();
    let running = lrs[vcpu].running_priority();
    if let Some((priority, intid)) = best_pending
        && running.is_none_or(|r| priority < r)
    {
        let signalled = lrs[vcpu].signalled().map(|(_, lr)| lr.priority());
        assert!(
            signalled.is_some_and(|s| s <= priority),
            "vCPU {vcpu}: INTID {intid} (priority {priority:#x}) can preempt the running \
             priority {running:x?} but the CPU interface signals {signalled:x?}; \
             list registers {:x?}",
            lrs[vcpu].list_registers()
        );
    }
    if left_over > 0 {
        let listed_pending_worst = mine
            .iter()
            .filter(|lr| lr.pending() && !lr.active())
            .map(|lr| lr.priority())
            .max();
        let unlisted_best = (0..INTIDS as u32)
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
