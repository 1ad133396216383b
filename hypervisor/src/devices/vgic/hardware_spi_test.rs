//! SPIs linked to physical ones (passthrough), against a model of the
//! physical interrupt (host only).
//!
//! One vCPU with two list registers and two linked SPIs, each behind a
//! simulated level-sensitive device line. A deterministic stream drives
//! what happens on a machine: the device raises or drops its line, the
//! physical interrupt fires when the line is high and it is inactive (the
//! hypervisor then injects it and leaves it active), the guest enables,
//! disables, clears the pending state of (`ICPENDR`) or re-prioritises the
//! SPIs, a vCPU entry folds and fills, and the guest acknowledges and
//! completes what its CPU interface signals (a hardware list register's
//! deactivation deactivates the physical interrupt).
//!
//! Checked throughout: the hypervisor never deactivates a physical
//! interrupt that is not active (it would lose or double an interrupt), the
//! model's record of which physical interrupts are active for the guest is
//! exactly the simulated one, and no physical interrupt stays active while
//! the guest has nothing of it pending or active (the device would be cut
//! off for good). After a drain (both SPIs enabled, the lines dropped, the
//! guest taking everything) nothing is active anywhere.

use super::VgicState;
use super::list_regs::ModelListRegisters;
use super::state::tests::two_vcpus;
use alloc::vec::Vec;

const LINKED: [(u32, u32); 2] = [(64, 79), (65, 78)];

struct Machine {
    gic: VgicState,
    lrs: ModelListRegisters,
    line: [bool; 2],
    physical_active: [bool; 2],
    fired: u32,
    taken: u32,
}

fn which(pintid: u32) -> usize {
    LINKED.iter().position(|&(_, p)| p == pintid).unwrap()
}

impl Machine {
    fn new() -> Self {
        let mut gic = two_vcpus();
        gic.distributor_write(0, 4, 0x13).unwrap();
        for &(intid, pintid) in &LINKED {
            gic.link_hardware_spi(intid, pintid).unwrap();
            let word = 4 * u64::from(intid / 32);
            let bit = 1u64 << (intid % 32);
            let group = gic.distributor_read(0x80 + word, 4).unwrap();
            gic.distributor_write(0x80 + word, 4, group | bit).unwrap();
            gic.distributor_write(0x100 + word, 4, bit).unwrap();
            gic.distributor_write(0x6000 + 8 * u64::from(intid), 8, 0)
                .unwrap();
        }
        Self {
            gic,
            lrs: ModelListRegisters::new(2),
            line: [false; 2],
            physical_active: [false; 2],
            fired: 0,
            taken: 0,
        }
    }

    fn deactivate(&mut self, pintid: u32, by: &str) {
        let i = which(pintid);
        assert!(
            self.physical_active[i],
            "{by} deactivated inactive INTID {pintid}"
        );
        self.physical_active[i] = false;
    }

    /// The physical GIC signals each high, inactive line.
    fn fire(&mut self) {
        for (i, &(_, pintid)) in LINKED.iter().enumerate() {
            if self.line[i] && !self.physical_active[i] {
                self.physical_active[i] = true;
                self.fired += 1;
                self.gic.inject_hardware_spi(pintid).unwrap();
            }
        }
    }

    fn entry(&mut self) {
        self.gic.fill(0, &mut self.lrs).unwrap();
        for pintid in self.gic.take_hardware_spi_deactivations() {
            self.deactivate(pintid, "the hypervisor");
        }
        for (i, &(intid, _)) in LINKED.iter().enumerate() {
            let link = self
                .gic
                .hardware_spis
                .iter()
                .find(|h| h.intid == intid)
                .unwrap();
            let irq = self.gic.spis[(intid - 32) as usize];
            if irq.listed_on.is_none() {
                assert_eq!(
                    link.physical_active, self.physical_active[i],
                    "INTID {intid}"
                );
                assert!(
                    !self.physical_active[i] || irq.pending() || irq.active,
                    "INTID {intid}: physical active, but nothing left for the guest to complete"
                );
            }
        }
    }

    /// The guest takes what is signalled and completes it; the driver then
    /// quiets its device (`quiet`).
    fn guest(&mut self, quiet: bool) {
        while let Some(intid) = self.lrs.acknowledge() {
            self.taken += 1;
            if let Some(i) = LINKED.iter().position(|&(v, _)| v == intid)
                && quiet
            {
                self.line[i] = false;
            }
            self.lrs.end_of_interrupt(intid);
            for pintid in self.lrs.take_physical_spi_deactivations() {
                self.deactivate(pintid, "the guest");
            }
        }
    }
}

fn run(seed: u64) {
    let mut m = Machine::new();
    let mut rng = seed | 1;
    let mut next = |n: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    };
    for _ in 0..400 {
        let i = next(2) as usize;
        let (intid, _) = LINKED[i];
        let word = 4 * u64::from(intid / 32);
        let bit = 1u64 << (intid % 32);
        match next(8) {
            0 | 1 => m.line[i] = true,
            2 => m.line[i] = false,
            3 => {
                let register = if next(2) == 0 { 0x100 } else { 0x180 };
                m.gic.distributor_write(register + word, 4, bit).unwrap();
            }
            4 => {
                m.gic.distributor_write(0x280 + word, 4, bit).unwrap();
            }
            5 => {
                let priority = next(256);
                m.gic
                    .distributor_write(0x400 + u64::from(intid), 1, priority)
                    .unwrap();
            }
            _ => {
                let quiet = next(2) == 0;
                m.guest(quiet);
            }
        }
        m.fire();
        m.entry();
    }
    // Drain.
    for &(intid, _) in &LINKED {
        m.gic
            .distributor_write(0x100 + 4 * u64::from(intid / 32), 4, 1 << (intid % 32))
            .unwrap();
    }
    for _ in 0..8 {
        m.line = [false; 2];
        m.entry();
        m.guest(true);
    }
    m.entry();
    assert_eq!(m.physical_active, [false; 2], "seed {seed}");
    assert!(m.gic.hardware_spis.iter().all(|h| !h.physical_active));
    assert!(
        m.taken <= m.fired,
        "seed {seed}: taken more often than fired"
    );
}

#[test]
fn linked_spis_follow_the_physical_interrupt() {
    for seed in 1..200 {
        run(seed);
    }
}

#[test]
fn a_fired_spi_is_listed_as_hardware_and_the_guests_eoi_deactivates_it() {
    let mut m = Machine::new();
    m.line[0] = true;
    m.fire();
    m.entry();
    assert_eq!(m.fired, 1);
    m.guest(true);
    assert_eq!((m.taken, m.physical_active), (1, [false; 2]));
    m.entry();
    assert!(m.gic.hardware_spis.iter().all(|h| !h.physical_active));
    // Not linked: refused.
    assert!(m.gic.inject_hardware_spi(80).is_err());
    assert!(m.gic.link_hardware_spi(64, 90).is_err(), "linked twice");
    assert!(m.gic.link_hardware_spi(200, 90).is_err(), "no such SPI");
    let cleared: Vec<u32> = m.gic.take_hardware_spi_deactivations();
    assert!(cleared.is_empty());
}
