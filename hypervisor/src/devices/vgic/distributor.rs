//! The emulated distributor (`GICD_*`, one 64 KiB frame per VM).
//!
//! An offset decodes to one [`DistributorRegister`], whose width decides the
//! access sizes allowed; then the register is read or written. With affinity
//! routing always on, the SGI/PPI words of the banked registers (INTIDs
//! 0..=31), `ITARGETSR`, `SGIR`, `C/SPENDSGIR` are RAZ/WI here (the
//! redistributors own private interrupts), and so are `IGRPMODR`, `NSACR`
//! and `STATUSR` (one security state, no error reporting). `GICD_CTLR` keeps
//! `EnableGrp0` and `EnableGrp1`; `ARE` and `DS` read as one, `RWP` as zero
//! (every write takes effect at once).

use super::irq::FIRST_SPI;
use super::regs::{self, BitRegister, IIDR, Width};
use super::state::IROUTER_MASK;
use super::{Frame, VcpuSet, VgicError, VgicState};

const CTLR_ENABLE_GRP0: u64 = 1 << 0;
const CTLR_ENABLE_GRP1: u64 = 1 << 1;
const CTLR_ARE: u64 = 1 << 4;
const CTLR_DS: u64 = 1 << 6;
/// `GICD_TYPER.IDbits`: 10 INTID bits (encoded as bits - 1).
const TYPER_IDBITS: u64 = 9 << 19;
/// `GICD_TYPER.A3V`: Aff3 is supported in `IROUTER`.
const TYPER_A3V: u64 = 1 << 24;
/// `GICD_TYPER.LPIS`: LPIs are supported.
const TYPER_LPIS: u64 = 1 << 17;
/// `GICD_TYPER.IDbits` with LPIs.
const TYPER_IDBITS_LPIS: u64 = ((super::lpi::LPI_ID_BITS - 1) as u64) << 19;

/// A distributor register, with the INTIDs a banked one covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DistributorRegister {
    Ctlr,
    Typer,
    Iidr,
    Typer2,
    /// A register that exists but reads as zero and ignores writes.
    RazWi(Width),
    Bits(BitRegister, u32),
    Priority(u32),
    Config(u32),
    Router(u32),
    Id(u32),
}

fn decode(offset: u64) -> Option<DistributorRegister> {
    use DistributorRegister as R;
    Some(match offset {
        0x0000 => R::Ctlr,
        0x0004 => R::Typer,
        0x0008 => R::Iidr,
        0x000c => R::Typer2,
        0x0010 => R::RazWi(Width::Word), // STATUSR
        0x0080..0x0400 => {
            let (register, word) = regs::bit_register(offset)?;
            R::Bits(register, 32 * word)
        }
        0x0400..0x0800 => R::Priority((offset - 0x400) as u32),
        0x0800..0x0c00 => R::RazWi(Width::ByteOrWord), // ITARGETSR
        0x0c00..0x0d00 => R::Config(((offset - 0xc00) / 4 * 16) as u32),
        0x0d00..0x0d80 => R::RazWi(Width::Word), // IGRPMODR
        0x0e00..0x0f00 => R::RazWi(Width::Word), // NSACR
        0x0f00 => R::RazWi(Width::Word),         // SGIR
        0x0f10..0x0f30 => R::RazWi(Width::ByteOrWord), // CPENDSGIR, SPENDSGIR
        0x6100..0x7fe0 => R::Router(((offset - 0x6000) / 8) as u32),
        _ => R::Id(regs::id_register(offset)?),
    })
}

fn width(register: DistributorRegister) -> Width {
    match register {
        DistributorRegister::RazWi(width) => width,
        DistributorRegister::Priority(_) => Width::ByteOrWord,
        DistributorRegister::Router(_) => Width::Double,
        _ => Width::Word,
    }
}

impl VgicState {
    fn decode_distributor(&self, offset: u64, size: u8) -> Result<DistributorRegister, VgicError> {
        let frame = Frame::Distributor;
        let register = decode(offset).ok_or(VgicError::UnknownRegister { frame, offset })?;
        regs::check_access(frame, offset, size, width(register))?;
        Ok(register)
    }

    /// `GICD_TYPER`: ITLinesNumber for the configured SPIs, A3V, and 10
    /// INTID bits without an ITS, LPIs and 14 INTID bits with one; no MBIS,
    /// no RSS, one security state.
    pub(crate) fn distributor_typer(&self) -> u64 {
        let it_lines = u64::from((FIRST_SPI + self.spi_count).div_ceil(32) - 1);
        if self.has_its() {
            it_lines | TYPER_IDBITS_LPIS | TYPER_LPIS | TYPER_A3V
        } else {
            it_lines | TYPER_IDBITS | TYPER_A3V
        }
    }

    /// A guest load of `size` bytes at `offset` in the distributor frame.
    pub fn distributor_read(&self, offset: u64, size: u8) -> Result<u64, VgicError> {
        use DistributorRegister as R;
        Ok(match self.decode_distributor(offset, size)? {
            R::Ctlr => {
                CTLR_ARE
                    | CTLR_DS
                    | if self.enable_grp0 {
                        CTLR_ENABLE_GRP0
                    } else {
                        0
                    }
                    | if self.enable_grp1 {
                        CTLR_ENABLE_GRP1
                    } else {
                        0
                    }
            }
            R::Typer => self.distributor_typer(),
            R::Iidr => u64::from(IIDR),
            R::Typer2 | R::RazWi(_) => 0,
            R::Bits(_, first) if first < FIRST_SPI => 0,
            R::Bits(register, first) => self.read_bits(0, register, first),
            R::Priority(first) if first < FIRST_SPI => 0,
            R::Priority(first) => self.read_priorities(0, first, size),
            R::Config(first) if first < FIRST_SPI => 0,
            R::Config(first) => self.read_config(0, first),
            R::Router(intid) => {
                let route = self
                    .routes
                    .get((intid - FIRST_SPI) as usize)
                    .copied()
                    .unwrap_or(0);
                regs::read_part(route, offset, size)
            }
            R::Id(value) => u64::from(value),
        })
    }

    /// A guest store of `size` bytes of `value` at `offset` in the
    /// distributor frame. Returns the vCPUs to kick.
    pub fn distributor_write(
        &mut self,
        offset: u64,
        size: u8,
        value: u64,
    ) -> Result<VcpuSet, VgicError> {
        use DistributorRegister as R;
        Ok(match self.decode_distributor(offset, size)? {
            R::Ctlr => {
                let grp0 = value & CTLR_ENABLE_GRP0 != 0;
                let grp1 = value & CTLR_ENABLE_GRP1 != 0;
                let changed = grp0 != self.enable_grp0 || grp1 != self.enable_grp1;
                self.enable_grp0 = grp0;
                self.enable_grp1 = grp1;
                if changed {
                    self.all_vcpus()
                } else {
                    VcpuSet::EMPTY
                }
            }
            R::Typer | R::Iidr | R::Typer2 | R::RazWi(_) | R::Id(_) => VcpuSet::EMPTY,
            R::Bits(_, first) | R::Priority(first) | R::Config(first) if first < FIRST_SPI => {
                VcpuSet::EMPTY
            }
            R::Bits(register, first) => self.write_bits(0, register, first, value),
            R::Priority(first) => self.write_priorities(0, first, size, value),
            R::Config(first) => self.write_config(0, first, value),
            R::Router(intid) => {
                let Some(route) = self.routes.get((intid - FIRST_SPI) as usize).copied() else {
                    return Ok(VcpuSet::EMPTY);
                };
                let new = regs::merge_part(route, offset, size, value) & IROUTER_MASK;
                if new == route {
                    return Ok(VcpuSet::EMPTY);
                }
                let before = self.kicks_for(0, intid);
                self.routes[(intid - FIRST_SPI) as usize] = new;
                before.union(self.kicks_for(0, intid))
            }
        })
    }

    fn all_vcpus(&self) -> VcpuSet {
        (0..self.vcpus.len()).fold(VcpuSet::EMPTY, |mut set, index| {
            set.insert(index);
            set
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::tests::two_vcpus;
    use super::*;

    const GICD_CTLR: u64 = 0x0;
    const GICD_ISENABLER: u64 = 0x100;
    const GICD_ICENABLER: u64 = 0x180;
    const GICD_ISPENDR: u64 = 0x200;
    const GICD_ICPENDR: u64 = 0x280;
    const GICD_ISACTIVER: u64 = 0x300;
    const GICD_ICACTIVER: u64 = 0x380;
    const GICD_IGROUPR: u64 = 0x80;
    const GICD_IPRIORITYR: u64 = 0x400;
    const GICD_ICFGR: u64 = 0xc00;
    const GICD_IROUTER: u64 = 0x6000;

    fn kicks(list: &[usize]) -> VcpuSet {
        list.iter().fold(VcpuSet::EMPTY, |mut set, &index| {
            set.insert(index);
            set
        })
    }

    #[test]
    fn identification() {
        let gic = two_vcpus();
        let typer = gic.distributor_read(0x4, 4).unwrap();
        assert_eq!(typer & 0x1f, 2, "64 SPIs: INTIDs up to 95, ITLinesNumber 2");
        assert_eq!(typer >> 19 & 0x1f, 9, "IDbits");
        assert_eq!(
            typer & (1 << 17 | 1 << 16 | 1 << 26 | 1 << 10),
            0,
            "no LPIS, MBIS, RSS, SecurityExtn"
        );
        assert_eq!(gic.distributor_read(0x8, 4), Ok(0x4800_043b));
        assert_eq!(gic.distributor_read(0xc, 4), Ok(0));
        assert_eq!(
            gic.distributor_read(0xffe8, 4).unwrap() >> 4 & 0xf,
            3,
            "PIDR2.ArchRev"
        );
        assert_eq!(gic.distributor_read(0xfff4, 4), Ok(0xf0));
        let wide = VgicState::new(super::super::VgicConfig {
            distributor_base: 0,
            redistributor_base: 0x10_0000,
            spi_count: 988,
            vcpu_mpidrs: vec![0],
        })
        .unwrap();
        assert_eq!(wide.distributor_read(0x4, 4).unwrap() & 0x1f, 31);
    }

    #[test]
    fn ctlr_forces_are_and_keeps_enables() {
        let mut gic = two_vcpus();
        assert_eq!(gic.distributor_read(GICD_CTLR, 4), Ok(0x50));
        // What Linux writes: ARE_NS | EnableGrp1A | EnableGrp1.
        assert_eq!(
            gic.distributor_write(GICD_CTLR, 4, 0x13),
            Ok(kicks(&[0, 1]))
        );
        assert_eq!(gic.distributor_read(GICD_CTLR, 4), Ok(0x53));
        assert_eq!(
            gic.distributor_write(GICD_CTLR, 4, 0x13),
            Ok(VcpuSet::EMPTY)
        );
        gic.distributor_write(GICD_CTLR, 4, 0x2).unwrap();
        assert_eq!(gic.distributor_read(GICD_CTLR, 4), Ok(0x52));
        assert_eq!(
            gic.distributor_write(GICD_CTLR, 1, 0),
            Err(VgicError::BadAccess {
                frame: Frame::Distributor,
                offset: 0,
                size: 1
            })
        );
        assert!(gic.distributor_read(GICD_CTLR, 8).is_err());
    }

    #[test]
    fn set_clear_registers() {
        let mut gic = two_vcpus();
        for (set, clear) in [
            (GICD_ISENABLER, GICD_ICENABLER),
            (GICD_ISPENDR, GICD_ICPENDR),
            (GICD_ISACTIVER, GICD_ICACTIVER),
        ] {
            gic.distributor_write(set + 4, 4, 0x8000_0003).unwrap();
            assert_eq!(gic.distributor_read(set + 4, 4), Ok(0x8000_0003));
            assert_eq!(gic.distributor_read(clear + 4, 4), Ok(0x8000_0003));
            gic.distributor_write(clear + 4, 4, 0x1).unwrap();
            assert_eq!(gic.distributor_read(set + 4, 4), Ok(0x8000_0002));
            gic.distributor_write(set + 8, 4, 0xffff_ffff).unwrap();
            assert_eq!(gic.distributor_read(set + 8, 4), Ok(0xffff_ffff));
            // INTIDs 96..: not implemented, RAZ/WI.
            gic.distributor_write(set + 12, 4, 0xffff_ffff).unwrap();
            assert_eq!(gic.distributor_read(set + 12, 4), Ok(0));
            // SGI/PPI word: RAZ/WI with ARE.
            gic.distributor_write(set, 4, 0xffff_ffff).unwrap();
            assert_eq!(gic.distributor_read(set, 4), Ok(0));
            assert!(
                !gic.vcpus[0]
                    .private
                    .iter()
                    .any(|irq| irq.enabled || irq.pending() || irq.active)
            );
        }
        assert!(gic.irq(0, 33).unwrap().enabled);
        assert!(!gic.irq(0, 32).unwrap().enabled);
        assert!(gic.irq(0, 63).unwrap().pending());
        assert!(gic.distributor_write(GICD_ISENABLER + 4, 2, 1).is_err());
    }

    #[test]
    fn group_register() {
        let mut gic = two_vcpus();
        gic.distributor_write(GICD_IGROUPR + 4, 4, 0xffff_ffff)
            .unwrap();
        gic.distributor_write(GICD_IGROUPR + 8, 4, 0x5555_5555)
            .unwrap();
        assert_eq!(gic.distributor_read(GICD_IGROUPR + 4, 4), Ok(0xffff_ffff));
        assert_eq!(gic.distributor_read(GICD_IGROUPR + 8, 4), Ok(0x5555_5555));
        assert_eq!(gic.distributor_read(GICD_IGROUPR, 4), Ok(0));
        assert!(gic.irq(0, 64).unwrap().group1 && !gic.irq(0, 65).unwrap().group1);
    }

    #[test]
    fn priorities_by_byte_and_word() {
        let mut gic = two_vcpus();
        gic.distributor_write(GICD_IPRIORITYR + 32, 4, 0xa0b0_c0d0)
            .unwrap();
        assert_eq!(
            gic.distributor_read(GICD_IPRIORITYR + 32, 4),
            Ok(0xa0b0_c0d0)
        );
        assert_eq!(gic.distributor_read(GICD_IPRIORITYR + 34, 1), Ok(0xb0));
        gic.distributor_write(GICD_IPRIORITYR + 35, 1, 0xff)
            .unwrap();
        assert_eq!(
            gic.distributor_read(GICD_IPRIORITYR + 32, 4),
            Ok(0xf8b0_c0d0),
            "5 priority bits"
        );
        assert_eq!(gic.irq(0, 35).unwrap().priority, 0xf8);
        gic.distributor_write(GICD_IPRIORITYR + 36, 4, 0x0707_0707)
            .unwrap();
        assert_eq!(gic.distributor_read(GICD_IPRIORITYR + 36, 4), Ok(0));
        // Private INTIDs: RAZ/WI; unimplemented ones too.
        gic.distributor_write(GICD_IPRIORITYR + 27, 1, 0x80)
            .unwrap();
        assert_eq!(gic.distributor_read(GICD_IPRIORITYR + 24, 4), Ok(0));
        gic.distributor_write(GICD_IPRIORITYR + 96, 4, 0x8080_8080)
            .unwrap();
        assert_eq!(gic.distributor_read(GICD_IPRIORITYR + 96, 4), Ok(0));
        assert!(gic.distributor_read(GICD_IPRIORITYR + 33, 2).is_err());
        assert!(gic.distributor_read(GICD_IPRIORITYR + 33, 4).is_err());
        assert!(gic.distributor_read(GICD_IPRIORITYR + 32, 8).is_err());
    }

    #[test]
    fn config_register() {
        let mut gic = two_vcpus();
        assert_eq!(
            gic.distributor_read(GICD_ICFGR + 8, 4),
            Ok(0),
            "SPIs reset level"
        );
        gic.distributor_write(GICD_ICFGR + 8, 4, 0x2 << 2 | 0x2 << 30 | 0x1)
            .unwrap();
        assert_eq!(
            gic.distributor_read(GICD_ICFGR + 8, 4),
            Ok(0x2 << 2 | 0x2 << 30)
        );
        assert_eq!(gic.irq(0, 33).unwrap().trigger, super::super::Trigger::Edge);
        assert_eq!(gic.irq(0, 47).unwrap().trigger, super::super::Trigger::Edge);
        assert_eq!(
            gic.irq(0, 32).unwrap().trigger,
            super::super::Trigger::Level
        );
        gic.distributor_write(GICD_ICFGR, 4, 0).unwrap();
        assert_eq!(
            gic.distributor_read(GICD_ICFGR, 4),
            Ok(0),
            "SGI config RAZ/WI in GICD"
        );
    }

    #[test]
    fn router_64_and_32_bit() {
        let mut gic = two_vcpus();
        let spi = 40;
        let at = GICD_IROUTER + 8 * spi;
        assert_eq!(gic.distributor_read(at, 8), Ok(0));
        gic.distributor_write(at, 8, 0xffff_ffff_ffff_ffff).unwrap();
        assert_eq!(gic.distributor_read(at, 8), Ok(0xff_80ff_ffff));
        assert_eq!(gic.distributor_read(at, 4), Ok(0x80ff_ffff));
        assert_eq!(gic.distributor_read(at + 4, 4), Ok(0xff));
        gic.distributor_write(at + 4, 4, 0).unwrap();
        gic.distributor_write(at, 4, 1).unwrap();
        assert_eq!(gic.distributor_read(at, 8), Ok(1));
        assert_eq!(gic.spi_target(spi as u32), Some(1));
        assert!(gic.distributor_read(at + 4, 8).is_err());
        assert!(gic.distributor_read(at, 2).is_err());
        // IROUTER<n> for n < 32 is reserved; beyond the SPIs RAZ/WI.
        assert_eq!(
            gic.distributor_read(GICD_IROUTER + 8 * 31, 8),
            Err(VgicError::UnknownRegister {
                frame: Frame::Distributor,
                offset: GICD_IROUTER + 8 * 31
            })
        );
        gic.distributor_write(GICD_IROUTER + 8 * 100, 8, 1).unwrap();
        assert_eq!(gic.distributor_read(GICD_IROUTER + 8 * 100, 8), Ok(0));
    }

    #[test]
    fn rerouting_a_pending_spi_kicks_old_and_new_target() {
        let mut gic = two_vcpus();
        gic.distributor_write(GICD_CTLR, 4, 0x2).unwrap();
        gic.distributor_write(GICD_IGROUPR + 4, 4, 0xffff_ffff)
            .unwrap();
        assert_eq!(
            gic.distributor_write(GICD_ISENABLER + 4, 4, 1 << 1),
            Ok(VcpuSet::EMPTY)
        );
        assert_eq!(gic.set_spi_level(33, true), Ok(kicks(&[0])));
        assert_eq!(
            gic.distributor_write(GICD_IROUTER + 8 * 33, 8, 1),
            Ok(kicks(&[0, 1]))
        );
        assert_eq!(
            gic.distributor_write(GICD_ICENABLER + 4, 4, 1 << 1),
            Ok(VcpuSet::EMPTY)
        );
        assert_eq!(
            gic.distributor_write(GICD_ISENABLER + 4, 4, 1 << 1),
            Ok(kicks(&[1]))
        );
    }

    #[test]
    fn unknown_and_raz_wi_offsets() {
        let mut gic = two_vcpus();
        for offset in [0x14u64, 0x40, 0x1000, 0x8000, 0xffcc] {
            let error = VgicError::UnknownRegister {
                frame: Frame::Distributor,
                offset,
            };
            assert_eq!(gic.distributor_read(offset, 4), Err(error));
            assert_eq!(gic.distributor_write(offset, 4, 1), Err(error));
            assert!(error.is_raz_wi());
        }
        for offset in [0x10u64, 0x800, 0xd00, 0xe00, 0xf00, 0xf10] {
            assert_eq!(
                gic.distributor_write(offset, 4, 0xffff_ffff),
                Ok(VcpuSet::EMPTY)
            );
            assert_eq!(gic.distributor_read(offset, 4), Ok(0));
        }
        assert_eq!(
            gic.distributor_read(0x801, 1),
            Ok(0),
            "ITARGETSR is byte-accessible"
        );
    }
}
