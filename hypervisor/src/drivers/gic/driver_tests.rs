//! Host tests of the GIC driver's sequences (`driver`), against the
//! recording mock (`mock`): each test checks every register access a
//! sequence makes, in order.

use super::driver::{
    Acknowledged, CpuRegister as R, GicError, GicV2, GicV3, HostGic, ICC_CTLR_EOIMODE, SpiTarget,
    WAIT_LIMIT, clear_spi_active, discard_pending, release_spi, reset_virtual_interface_v3,
    route_spi, setup_spi, wait_distributor,
};
use super::gicv2::{self as v2regs, gicc, gich};
use super::mock::{Access, Access::*, MockCpu, MockFrame, MockGic};
use super::{HOST_PRIORITY, KICK_SGI, gicd, gicr, sgi1r_value};
use crate::sysreg_values::ICC_SRE_EL2_VALUE;

pub(super) const GICD: usize = 0x0800_0000;
pub(super) const GICR0: usize = 0x080a_0000;
pub(super) const GICR1: usize = 0x0900_0000;
pub(super) const GICC: usize = 0x0801_0000;
pub(super) const GICH: usize = 0x0803_0000;
pub(super) const TIMERS: [u32; 2] = [27, 30];

pub(super) fn v3(gic: &MockGic) -> GicV3<MockFrame, MockCpu> {
    GicV3::new(
        gic.frame(GICD),
        vec![
            (gic.frame(GICR0), 2 * gicr::FRAME_SIZE),
            (gic.frame(GICR1), 4 * gicr::FRAME_SIZE),
        ],
        gic.cpu(),
        Some(25),
        TIMERS,
        false,
    )
}

pub(super) fn v2(gic: &MockGic) -> GicV2<MockFrame, MockCpu> {
    GicV2 {
        distributor: gic.frame(GICD),
        cpu_interface: gic.frame(GICC),
        hyp_interface: gic.frame(GICH),
        cpu: gic.cpu(),
        maintenance: 25,
        timers: TIMERS,
    }
}

fn writes(log: &[Access]) -> Vec<Access> {
    log.iter()
        .copied()
        .filter(|a| !matches!(a, Read32(..) | Read64(..) | ReadSys(..)))
        .collect()
}

#[test]
fn v3_distributor_without_uart_turns_on_affinity_routing_then_group_1() {
    let gic = MockGic::new();
    GicV3::<MockFrame, MockCpu>::init_distributor(&gic.frame(GICD), None, 0);
    let ctlr = GICD + gicd::CTLR;
    assert_eq!(
        gic.log(),
        vec![
            Write32(ctlr, 0),
            Read32(ctlr, 0),
            Write32(ctlr, gicd::CTLR_ARE_NS),
            Read32(ctlr, gicd::CTLR_ARE_NS),
            Write32(ctlr, gicd::CTLR_ARE_NS | gicd::CTLR_ENABLE_GRP1_NS),
            Read32(ctlr, gicd::CTLR_ARE_NS | gicd::CTLR_ENABLE_GRP1_NS),
        ]
    );
}

#[test]
fn v3_distributor_takes_the_uart_spi_on_the_boot_cpu() {
    let gic = MockGic::new();
    let ctlr = GICD + gicd::CTLR;
    // The first wait polls RWP twice.
    gic.queue(ctlr, &[u64::from(gicd::CTLR_RWP), 0]);
    gic.set(GICD + gicd::IGROUPR + 4, 0x1);
    gic.set(GICD + gicd::ICFGR + 8, 0xffff_ffff);
    let mpidr = 0x0000_0001_8002_0304;
    GicV3::<MockFrame, MockCpu>::init_distributor(&gic.frame(GICD), Some(33), mpidr);
    let log = gic.log();
    assert_eq!(
        log[..3],
        [
            Write32(ctlr, 0),
            Read32(ctlr, gicd::CTLR_RWP),
            Read32(ctlr, 0)
        ]
    );
    assert_eq!(
        writes(&log),
        vec![
            Write32(ctlr, 0),
            Write32(ctlr, gicd::CTLR_ARE_NS),
            Write32(ctlr, gicd::CTLR_ARE_NS | gicd::CTLR_ENABLE_GRP1_NS),
            Write32(GICD + gicd::ICENABLER + 4, 1 << 1),
            Write32(GICD + gicd::IGROUPR + 4, 0x3),
            Write8(GICD + gicd::IPRIORITYR + 33, HOST_PRIORITY),
            Write32(GICD + gicd::ICFGR + 8, 0xffff_fff3),
            Write64(GICD + gicd::IROUTER + 33 * 8, 0x1_0002_0304),
            Write32(GICD + gicd::ISENABLER + 4, 1 << 1),
        ]
    );
}

#[test]
fn an_spi_number_that_is_no_spi_is_left_alone() {
    let gic = MockGic::new();
    GicV3::<MockFrame, MockCpu>::init_distributor(&gic.frame(GICD), Some(27), 0);
    assert_eq!(writes(&gic.log()).len(), 3);
    gic.clear_log();
    for intid in [5, 1020] {
        let d = gic.frame(GICD);
        setup_spi(&d, intid, true, SpiTarget::Affinity(0));
        route_spi(&d, intid, SpiTarget::Interfaces(1));
        clear_spi_active(&d, intid);
        release_spi(&d, intid);
    }
    assert_eq!(gic.log(), vec![]);
}

#[test]
fn the_distributor_wait_is_bounded() {
    let gic = MockGic::new();
    gic.set(GICD + gicd::CTLR, u64::from(gicd::CTLR_RWP));
    wait_distributor(&gic.frame(GICD));
    assert_eq!(gic.log().len(), WAIT_LIMIT);
}

#[test]
fn the_maintenance_interrupt_defaults_when_the_device_tree_names_none() {
    let gic = MockGic::new();
    let driver = GicV3::new(gic.frame(GICD), vec![], gic.cpu(), None, TIMERS, false);
    assert_eq!(driver.maintenance, super::DEFAULT_MAINTENANCE_INTID);
}

/// `GICR_TYPER` of a frame with affinity `aff` (Aff3.Aff2.Aff1.Aff0 packed).
pub(super) fn typer(aff: u64, last: bool) -> u64 {
    aff << 32 | if last { gicr::TYPER_LAST } else { 0 }
}

#[test]
fn v3_cpu_finds_its_redistributor_by_affinity_and_wakes_it() {
    let gic = MockGic::new();
    let driver = v3(&gic);
    // Region 0: affinities 0 and 1 (last); region 1: 2, then 3 (ours).
    gic.set(GICR0 + gicr::TYPER, typer(0, false));
    gic.set(
        GICR0 + gicr::FRAME_SIZE as usize + gicr::TYPER,
        typer(1, true),
    );
    gic.set(GICR1 + gicr::TYPER, typer(2, false));
    let rd = GICR1 + gicr::FRAME_SIZE as usize;
    gic.set(rd + gicr::TYPER, typer(0x0100_0003, false));
    let waker = rd + gicr::WAKER;
    gic.queue(
        waker,
        &[
            u64::from(gicr::WAKER_PROCESSOR_SLEEP | gicr::WAKER_CHILDREN_ASLEEP),
            u64::from(gicr::WAKER_CHILDREN_ASLEEP),
            0,
        ],
    );
    let mpidr = 0x0000_0001_8000_0003;
    let (_rd, sgi) = driver.init_cpu(mpidr).unwrap();
    let sgi_base = rd + gicr::SGI_BASE;
    let ppis = 1 << KICK_SGI | 1 << 25 | 1 << 27 | 1 << 30;
    assert_eq!(
        gic.log(),
        vec![
            Read64(GICR0 + gicr::TYPER, typer(0, false)),
            Read64(
                GICR0 + gicr::FRAME_SIZE as usize + gicr::TYPER,
                typer(1, true)
            ),
            Read64(GICR1 + gicr::TYPER, typer(2, false)),
            Read64(rd + gicr::TYPER, typer(0x0100_0003, false)),
            Read32(
                waker,
                gicr::WAKER_PROCESSOR_SLEEP | gicr::WAKER_CHILDREN_ASLEEP
            ),
            Write32(waker, gicr::WAKER_CHILDREN_ASLEEP),
            Read32(waker, gicr::WAKER_CHILDREN_ASLEEP),
            Read32(waker, 0),
            WriteSys(R::CntvCtlEl0, 0),
            WriteSys(R::CntpCtlEl0, 0),
            WriteSys(R::CnthpCtlEl2, 0),
            Isb,
            Write32(sgi_base + gicr::ICENABLER0, u32::MAX),
            Write32(sgi_base + gicr::IGROUPR0, u32::MAX),
            Write8(sgi_base + gicr::IPRIORITYR + 8, HOST_PRIORITY),
            Write8(sgi_base + gicr::IPRIORITYR + 25, HOST_PRIORITY),
            Write8(sgi_base + gicr::IPRIORITYR + 27, HOST_PRIORITY),
            Write8(sgi_base + gicr::IPRIORITYR + 30, HOST_PRIORITY),
            Write32(sgi_base + gicr::ISENABLER0, ppis),
            WriteSys(R::IccSreEl2, ICC_SRE_EL2_VALUE),
            Isb,
            WriteSys(R::IccPmrEl1, 0xff),
            WriteSys(R::IccBpr1El1, 0),
            WriteSys(R::IccCtlrEl1, ICC_CTLR_EOIMODE),
            WriteSys(R::IccIgrpen1El1, 1),
            Isb,
        ]
    );
    // The returned frame is the SGI frame: a PPI enabled through it lands
    // in this redistributor.
    gic.clear_log();
    GicV3::<MockFrame, MockCpu>::set_ppi_enabled(&sgi, 26, true);
    GicV3::<MockFrame, MockCpu>::set_ppi_enabled(&sgi, 26, false);
    GicV3::<MockFrame, MockCpu>::clear_ppi_active(&sgi, 27);
    GicV3::<MockFrame, MockCpu>::clear_ppi_active(&sgi, 40);
    assert_eq!(
        gic.log(),
        vec![
            Write8(sgi_base + gicr::IPRIORITYR + 26, HOST_PRIORITY),
            Write32(sgi_base + gicr::ISENABLER0, 1 << 26),
            Write32(sgi_base + gicr::ICENABLER0, 1 << 26),
            Write32(sgi_base + gicr::ICACTIVER0, 1 << 27),
        ]
    );
}

#[test]
fn v3_cpu_without_a_redistributor_touches_nothing_else() {
    let gic = MockGic::new();
    let driver = v3(&gic);
    gic.set(GICR0 + gicr::TYPER, typer(0, true));
    gic.set(GICR1 + gicr::TYPER, typer(1, true));
    assert_eq!(driver.init_cpu(7).err(), Some(GicError::NoRedistributor(7)));
    assert_eq!(writes(&gic.log()), vec![]);
}

#[test]
fn v3_acknowledge_and_the_two_step_end_of_interrupt() {
    let gic = MockGic::new();
    let driver = v3(&gic);
    gic.queue_sys(R::IccIar1El1, &[0xff00_0000 | 30, 1023]);
    let ack = driver.acknowledge();
    assert_eq!(ack.intid, 30);
    driver.end_of_interrupt(ack);
    driver.drop_priority(ack);
    assert_eq!(driver.acknowledge(), Acknowledged::NONE);
    assert_eq!(
        gic.log(),
        vec![
            ReadSys(R::IccIar1El1, 0xff00_0000 | 30),
            WriteSys(R::IccEoir1El1, 30),
            WriteSys(R::IccDirEl1, 30),
            WriteSys(R::IccEoir1El1, 30),
            ReadSys(R::IccIar1El1, 1023),
        ]
    );
}

#[test]
fn discard_pending_finishes_every_pending_interrupt() {
    let gic = MockGic::new();
    let driver = v3(&gic);
    gic.queue_sys(R::IccIar1El1, &[8, 25, 1022]);
    discard_pending(&driver);
    assert_eq!(
        gic.log(),
        vec![
            ReadSys(R::IccIar1El1, 8),
            WriteSys(R::IccEoir1El1, 8),
            WriteSys(R::IccDirEl1, 8),
            ReadSys(R::IccIar1El1, 25),
            WriteSys(R::IccEoir1El1, 25),
            WriteSys(R::IccDirEl1, 25),
            ReadSys(R::IccIar1El1, 1022),
        ]
    );
}

#[test]
fn v3_kick_orders_memory_before_the_sgi() {
    let gic = MockGic::new();
    let driver = v3(&gic);
    let mpidr = 0x0000_0001_0002_0311;
    driver.kick(mpidr);
    driver.quiesce();
    assert_eq!(
        gic.log(),
        vec![
            DsbIsh,
            WriteSys(R::IccSgi1rEl1, sgi1r_value(mpidr, KICK_SGI)),
            Isb,
            WriteSys(R::IccIgrpen1El1, 0),
            Isb,
        ]
    );
}

#[test]
fn v3_virtual_interface_reset_clears_the_active_priorities_it_has() {
    for (bits, registers) in [(5, 1), (6, 2), (7, 4)] {
        let gic = MockGic::new();
        reset_virtual_interface_v3(&gic.cpu(), bits == 7, bits);
        let mut expected = vec![WriteSys(
            R::IchVmcrEl2,
            if bits == 7 {
                crate::devices::vgic::cpu_interface::VMCR_VCBPR
            } else {
                0
            },
        )];
        for n in 0..registers {
            expected.push(WriteSys(R::IchAp0rEl2(n), 0));
            expected.push(WriteSys(R::IchAp1rEl2(n), 0));
        }
        assert_eq!(gic.log(), expected, "{bits} preemption bits");
    }
}

#[test]
fn v3_spi_setup_groups_prioritises_configures_routes_and_enables() {
    let gic = MockGic::new();
    let d = gic.frame(GICD);
    gic.set(GICD + gicd::ICFGR + 4 * 4, 0b01 << 2);
    setup_spi(&d, 65, true, SpiTarget::Affinity(0x0000_0002_0000_0101));
    assert_eq!(
        gic.log(),
        vec![
            Write32(GICD + gicd::ICENABLER + 8, 1 << 1),
            Read32(GICD + gicd::CTLR, 0),
            Read32(GICD + gicd::IGROUPR + 8, 0),
            Write32(GICD + gicd::IGROUPR + 8, 1 << 1),
            Write8(GICD + gicd::IPRIORITYR + 65, HOST_PRIORITY),
            Read32(GICD + gicd::ICFGR + 4 * 4, 0b01 << 2),
            Write32(GICD + gicd::ICFGR + 4 * 4, 0b10 << 2),
            Write64(GICD + gicd::IROUTER + 65 * 8, 0x2_0000_0101),
            Write32(GICD + gicd::ICACTIVER + 8, 1 << 1),
            Write32(GICD + gicd::ISENABLER + 8, 1 << 1),
        ]
    );
    gic.clear_log();
    clear_spi_active(&d, 65);
    release_spi(&d, 66);
    assert_eq!(
        gic.log(),
        vec![
            Write32(GICD + gicd::ICACTIVER + 8, 1 << 1),
            Write32(GICD + gicd::ICENABLER + 8, 1 << 2),
            Write32(GICD + gicd::ICACTIVER + 8, 1 << 2),
        ]
    );
}

#[test]
fn v2_distributor_targets_the_uart_spi_at_this_cpu_interface() {
    let gic = MockGic::new();
    gic.set(GICD + gicd::IGROUPR + 4, 0xffff_ffff);
    gic.set(GICD + v2regs::gicd::ITARGETSR, 0x0404_0404);
    GicV2::<MockFrame, MockCpu>::init_distributor(&gic.frame(GICD), Some(33));
    assert_eq!(
        gic.log(),
        vec![
            Write32(GICD + gicd::CTLR, 0),
            Write32(GICD + gicd::ICENABLER + 4, 1 << 1),
            Read32(GICD + gicd::IGROUPR + 4, 0xffff_ffff),
            Write32(GICD + gicd::IGROUPR + 4, 0xffff_fffd),
            Read32(GICD + gicd::ICFGR + 8, 0),
            Write32(GICD + gicd::ICFGR + 8, 0),
            Read32(GICD + v2regs::gicd::ITARGETSR, 0x0404_0404),
            Write8(GICD + gicd::IPRIORITYR + 33, HOST_PRIORITY),
            Write8(GICD + v2regs::gicd::ITARGETSR + 33, 0x04),
            Write32(GICD + gicd::ISENABLER + 4, 1 << 1),
            Write32(
                GICD + gicd::CTLR,
                v2regs::gicd::CTLR_ENABLE_GRP0 | v2regs::gicd::CTLR_ENABLE_GRP1
            ),
        ]
    );
}

#[test]
fn v2_cpu_enables_its_ppis_and_interface_and_reads_its_mask() {
    let gic = MockGic::new();
    let driver = v2(&gic);
    // A uniprocessor GIC reads ITARGETSR0 as zero: interface 0.
    assert_eq!(driver.init_cpu(), 1);
    let ppis = 1 << KICK_SGI | 1 << 25 | 1 << 27 | 1 << 30;
    assert_eq!(
        gic.log(),
        vec![
            WriteSys(R::CntvCtlEl0, 0),
            WriteSys(R::CntpCtlEl0, 0),
            WriteSys(R::CnthpCtlEl2, 0),
            Isb,
            Write32(GICD + gicd::ICENABLER, u32::MAX),
            Write32(GICD + gicd::IGROUPR, 0),
            Write8(GICD + gicd::IPRIORITYR + 8, HOST_PRIORITY),
            Write8(GICD + gicd::IPRIORITYR + 25, HOST_PRIORITY),
            Write8(GICD + gicd::IPRIORITYR + 27, HOST_PRIORITY),
            Write8(GICD + gicd::IPRIORITYR + 30, HOST_PRIORITY),
            Write32(GICD + gicd::ISENABLER, ppis),
            Read32(GICD + v2regs::gicd::ITARGETSR, 0),
            Write32(GICC + gicc::PMR, 0xff),
            Write32(GICC + gicc::BPR, 0),
            Write32(
                GICC + gicc::CTLR,
                gicc::CTLR_ENABLE_GRP0 | gicc::CTLR_EOIMODE
            ),
            Write32(GICH + gich::HCR, 0),
        ]
    );
    gic.set(GICD + v2regs::gicd::ITARGETSR, 0x02);
    assert_eq!(driver.init_cpu(), 2);
}

#[test]
fn v2_interrupts_write_the_acknowledged_value_back() {
    let gic = MockGic::new();
    let driver = v2(&gic);
    // An SGI from CPU 3: the source bits go back to EOIR and DIR.
    let iar = 3 << 10 | KICK_SGI;
    gic.queue(GICC + gicc::IAR, &[u64::from(iar), 1023]);
    discard_pending(&driver);
    assert_eq!(
        gic.log(),
        vec![
            Read32(GICC + gicc::IAR, iar),
            Write32(GICC + gicc::EOIR, iar),
            Write32(GICC + gicc::DIR, iar),
            Read32(GICC + gicc::IAR, 1023),
        ]
    );
}

#[test]
fn v2_ppis_kicks_quiesce_and_virtual_interface_reset() {
    let gic = MockGic::new();
    let driver = v2(&gic);
    driver.set_ppi_enabled(26, true);
    driver.set_ppi_enabled(26, false);
    driver.clear_ppi_active(30);
    driver.kick(0);
    driver.kick(0b100);
    driver.quiesce();
    driver.reset_virtual_interface();
    assert_eq!(
        gic.log(),
        vec![
            Write8(GICD + gicd::IPRIORITYR + 26, HOST_PRIORITY),
            Write32(GICD + gicd::ISENABLER, 1 << 26),
            Write32(GICD + gicd::ICENABLER, 1 << 26),
            Write32(GICD + gicd::ICACTIVER, 1 << 30),
            DsbIsh,
            Write32(
                GICD + v2regs::gicd::SGIR,
                v2regs::sgir_value(0b100, KICK_SGI)
            ),
            Write32(GICC + gicc::CTLR, 0),
            Write32(GICH + gich::VMCR, 0),
            Write32(GICH + gich::APR, 0),
        ]
    );
}

#[test]
fn v2_spi_routed_to_a_cpu_sets_its_target_byte() {
    let gic = MockGic::new();
    let d = gic.frame(GICD);
    route_spi(&d, 48, SpiTarget::Interfaces(0b10));
    assert_eq!(
        gic.log(),
        vec![Write8(GICD + v2regs::gicd::ITARGETSR + 48, 0b10)]
    );
    gic.clear_log();
    gic.set(GICD + gicd::IGROUPR + 4, 0xffff_ffff);
    setup_spi(&d, 48, false, SpiTarget::Interfaces(0b1));
    assert_eq!(
        gic.log(),
        vec![
            Write32(GICD + gicd::ICENABLER + 4, 1 << 16),
            Read32(GICD + gicd::IGROUPR + 4, 0xffff_ffff),
            Write32(GICD + gicd::IGROUPR + 4, !(1 << 16)),
            Write8(GICD + gicd::IPRIORITYR + 48, HOST_PRIORITY),
            Read32(GICD + gicd::ICFGR + 12, 0),
            Write32(GICD + gicd::ICFGR + 12, 0),
            Write8(GICD + v2regs::gicd::ITARGETSR + 48, 0b1),
            Write32(GICD + gicd::ICACTIVER + 4, 1 << 16),
            Write32(GICD + gicd::ISENABLER + 4, 1 << 16),
        ]
    );
}

#[test]
fn v2_list_registers_are_the_gich_bank_in_the_model_format() {
    use crate::devices::vgic::{ListRegister, ListRegisters, LrEncoding};
    let gic = MockGic::new();
    let driver = v2(&gic);
    // GICH_VTR.ListRegs 3: four list registers.
    gic.set(GICH + gich::VTR, 3);
    let mut lrs = driver.list_registers();
    assert_eq!(lrs.count(), 4);
    let pending = LrEncoding::V2.decode(0x1000_0000 | 27);
    lrs.write_lr(2, pending.0);
    gic.set(GICH + gich::ELRSR0, 0b1011);
    gic.set(GICH + gich::ELRSR1, 0);
    assert_eq!(lrs.read_elrsr(), 0b1011);
    lrs.write_hcr(1);
    let raw = LrEncoding::V2.encode(ListRegister(pending.0)) as u32;
    assert_eq!(
        gic.log(),
        vec![
            Read32(GICH + gich::VTR, 3),
            Write32(GICH + gich::LR0 + 8, raw),
            Read32(GICH + gich::ELRSR0, 0b1011),
            Read32(GICH + gich::ELRSR1, 0),
            Write32(GICH + gich::HCR, 1),
        ]
    );
    assert_eq!(lrs.read_lr(2), pending.0);
}
