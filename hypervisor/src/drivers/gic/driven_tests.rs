//! Host tests of the driven host GIC (`driven`): which driver a request
//! reaches, and how a CPU named by its logical index is reached through
//! what its `init_cpu` recorded, checked access by access against the
//! recording mock.

use super::driven::DrivenGic;
use super::driver::{Acknowledged, CpuRegister as R, GicError};
use super::driver_tests::{GICD, GICH, GICR0, GICR1, TIMERS, typer, v2, v3};
use super::gicv2::{self as v2regs, gich};
use super::mock::{Access::*, MockCpu, MockFrame, MockGic};
use super::{DEFAULT_MAINTENANCE_INTID, HOST_PRIORITY, KICK_SGI, gicd, gicr, sgi1r_value};
use crate::vocabulary::timers::TimerId;

type Gic = DrivenGic<MockFrame, MockCpu, 4>;

/// Affinity of the CPU with logical index 1 (its redistributor is the
/// second frame of region 1).
const CPU1_MPIDR: u64 = 0x0000_0001_8000_0003;

/// A GICv3 whose redistributors are affinities 0, 1 (region 0) and 2,
/// [`CPU1_MPIDR`] (region 1), all awake.
fn redistributors(gic: &MockGic) {
    gic.set(GICR0 + gicr::TYPER, typer(0, false));
    gic.set(
        GICR0 + gicr::FRAME_SIZE as usize + gicr::TYPER,
        typer(1, true),
    );
    gic.set(GICR1 + gicr::TYPER, typer(2, false));
    gic.set(
        GICR1 + gicr::FRAME_SIZE as usize + gicr::TYPER,
        typer(0x0100_0003, false),
    );
}

#[test]
fn with_nothing_driven_every_request_is_a_no_op() {
    let gic = MockGic::new();
    let driven = Gic::new();
    assert!(!driven.is_up() && !driven.is_v2());
    assert_eq!(driven.acknowledge(), Acknowledged::NONE);
    assert_eq!(driven.init_cpu(0, 0), Err(GicError::NotInitialised));
    assert_eq!(driven.maintenance_intid(), DEFAULT_MAINTENANCE_INTID);
    assert_eq!(
        driven.timer_intids(),
        TimerId::ALL.map(|t| t.host_intid(None))
    );
    driven.kick(1);
    driven.route_spi(40, 1);
    driven.set_ppi_enabled(0, 26, true);
    driven.set_timer_masked(0, TimerId::Virtual, true);
    driven.end_of_interrupt(Acknowledged::NONE);
    driven.discard_pending();
    driven.quiesce();
    assert!(driven.redistributor(0).is_none());
    assert!(driven.gich_list_registers().is_none());
    assert!(!driven.reset_gicv2_virtual_interface());
    assert_eq!(gic.log(), vec![]);
}

#[test]
fn a_gicv3_reaches_each_cpu_through_what_its_init_recorded() {
    let gic = MockGic::new();
    redistributors(&gic);
    let driven = Gic::new();
    driven.drive_v3(v3(&gic));
    assert!(driven.is_up() && !driven.is_v2());
    assert_eq!(driven.maintenance_intid(), 25);
    assert_eq!(driven.timer_intids(), TIMERS);
    driven.init_cpu(1, CPU1_MPIDR).unwrap();
    let rd = GICR1 + gicr::FRAME_SIZE as usize;
    let sgi = rd + gicr::SGI_BASE;
    // CPU 0 has not run its init: its PPIs cannot be reached yet.
    assert!(driven.redistributor(0).is_none());
    assert!(driven.redistributor(1).is_some());
    gic.clear_log();
    driven.set_ppi_enabled(0, 26, true);
    assert_eq!(gic.log(), vec![]);
    driven.set_ppi_enabled(1, 26, true);
    driven.set_timer_masked(1, TimerId::Physical, true);
    driven.deactivate_timer(1, TimerId::Virtual);
    driven.clear_ppi_active(1, 40);
    driven.kick(1);
    driven.route_spi(40, 1);
    assert_eq!(
        gic.log(),
        vec![
            Write8(sgi + gicr::IPRIORITYR + 26, HOST_PRIORITY),
            Write32(sgi + gicr::ISENABLER0, 1 << 26),
            Write32(sgi + gicr::ICENABLER0, 1 << TIMERS[1]),
            Write32(sgi + gicr::ICACTIVER0, 1 << TIMERS[0]),
            DsbIsh,
            WriteSys(R::IccSgi1rEl1, sgi1r_value(CPU1_MPIDR, KICK_SGI)),
            Isb,
            Write64(GICD + gicd::IROUTER + 8 * 40, CPU1_MPIDR & 0xff_00ff_ffff),
        ]
    );
}

#[test]
fn a_cpu_without_a_redistributor_is_still_kicked_by_its_affinity() {
    let gic = MockGic::new();
    redistributors(&gic);
    gic.set(
        GICR1 + gicr::FRAME_SIZE as usize + gicr::TYPER,
        typer(0x0100_0003, true),
    );
    let driven = Gic::new();
    driven.drive_v3(v3(&gic));
    assert_eq!(
        driven.init_cpu(2, 0x77),
        Err(GicError::NoRedistributor(0x77))
    );
    gic.clear_log();
    driven.kick(2);
    assert_eq!(
        gic.log(),
        vec![
            DsbIsh,
            WriteSys(R::IccSgi1rEl1, sgi1r_value(0x77, KICK_SGI)),
            Isb
        ]
    );
}

#[test]
fn a_gicv2_is_chosen_over_a_gicv3_and_targets_cpus_by_interface_mask() {
    let gic = MockGic::new();
    let driven = Gic::new();
    driven.drive_v3(v3(&gic));
    driven.drive_v2(v2(&gic));
    assert!(driven.is_v2());
    assert!(!driven.guards_binary_point());
    gic.set(GICD + v2regs::gicd::ITARGETSR, 0x04);
    driven.init_cpu(3, 0x3).unwrap();
    assert!(driven.redistributor(3).is_none());
    gic.clear_log();
    driven.kick(3);
    driven.route_spi(48, 3);
    driven.set_ppi_enabled(3, 26, false);
    assert!(driven.gich_list_registers().is_some());
    assert!(driven.reset_gicv2_virtual_interface());
    let log = gic.log();
    assert_eq!(
        log[..4],
        [
            DsbIsh,
            Write32(GICD + v2regs::gicd::SGIR, 0x04 << 16 | KICK_SGI),
            Write8(GICD + v2regs::gicd::ITARGETSR + 48, 0x04),
            Write32(GICD + gicd::ICENABLER, 1 << 26),
        ]
    );
    assert!(log[4..].iter().any(
        |a| matches!(a, Write32(addr, _) if *addr >= GICH && *addr < GICH + gich::LR0 + 0x100)
    ));
}
