//! The emulated redistributors (`GICR_*`): per vCPU an `RD_base` frame and
//! an `SGI_base` frame of 64 KiB each.
//!
//! `RD_base` identifies the redistributor: `GICR_TYPER` carries the vCPU's
//! MPIDR affinity in \[63:32\], its index as the processor number and `Last`
//! on the highest-numbered one, so a guest walking the redistributor region
//! finds its own and knows where the region ends. `GICR_WAKER` implements the
//! wake handshake: `ChildrenAsleep` follows `ProcessorSleep` immediately.
//! With an ITS (module `lpi`), `GICR_TYPER.PLPIS` is set and `GICR_CTLR`
//! holds `EnableLPIs` (which cannot be cleared once set), and
//! `GICR_PROPBASER`/`GICR_PENDBASER` keep what the guest writes while LPIs
//! are disabled (writes are ignored afterwards); without one they are
//! RAZ/WI. `STATUSR`, `SETLPIR`/`CLRLPIR`, the invalidation registers and
//! `SYNCR` are RAZ/WI either way (`DirectLPI` is 0: LPIs come only through
//! the ITS).
//! `SGI_base` holds the banked SGI/PPI registers of INTIDs 0..=31; `ICFGR0`
//! (SGIs) reads as all edge-triggered and ignores writes.

use super::irq::PRIVATE_COUNT;
use super::lpi::{GICR_CTLR_ENABLE_LPIS, PENDBASER_MASK, PROPBASER_MASK};
use super::regs::{self, BitRegister, IIDR, Width};
use super::{Frame, VcpuSet, VgicError, VgicState};

const WAKER_PROCESSOR_SLEEP: u64 = 1 << 1;
const WAKER_CHILDREN_ASLEEP: u64 = 1 << 2;
const TYPER_LAST: u64 = 1 << 4;
/// `GICR_TYPER.PLPIS`: physical LPIs are supported.
const TYPER_PLPIS: u64 = 1 << 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RdRegister {
    Ctlr,
    Iidr,
    Typer,
    Waker,
    Propbaser,
    Pendbaser,
    RazWi(Width),
    Id(u32),
}

fn decode_rd(offset: u64) -> Option<RdRegister> {
    use RdRegister as R;
    Some(match offset {
        0x0000 => R::Ctlr,
        0x0004 => R::Iidr,
        0x0008 | 0x000c => R::Typer,
        0x0010 => R::RazWi(Width::Word), // STATUSR
        0x0014 => R::Waker,
        0x0040 | 0x0048 => R::RazWi(Width::Double), // SETLPIR, CLRLPIR
        0x0070 | 0x0074 => R::Propbaser,
        0x0078 | 0x007c => R::Pendbaser,
        0x00a0 | 0x00b0 => R::RazWi(Width::Double), // INVLPIR, INVALLR
        0x00c0 => R::RazWi(Width::Word),            // SYNCR
        _ => R::Id(regs::id_register(offset)?),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SgiRegister {
    Bits(BitRegister),
    Priority(u32),
    Config(u32),
    RazWi(Width),
}

fn decode_sgi(offset: u64) -> Option<SgiRegister> {
    use SgiRegister as R;
    Some(match offset {
        0x0080..0x0400 => match regs::bit_register(offset)? {
            (register, 0) => R::Bits(register),
            _ => return None,
        },
        0x0400..0x0420 => R::Priority((offset - 0x400) as u32),
        0x0c00 => R::Config(0),
        0x0c04 => R::Config(16),
        0x0d00 | 0x0e00 => R::RazWi(Width::Word), // IGRPMODR0, NSACR
        _ => return None,
    })
}

impl VgicState {
    fn check_redistributor(&self, vcpu: usize) -> Result<(), VgicError> {
        if vcpu < self.vcpus.len() {
            Ok(())
        } else {
            Err(VgicError::NoSuchVcpu(vcpu))
        }
    }

    fn decode_rd_base(&self, vcpu: usize, offset: u64, size: u8) -> Result<RdRegister, VgicError> {
        self.check_redistributor(vcpu)?;
        let frame = Frame::RdBase { vcpu };
        let register = decode_rd(offset).ok_or(VgicError::UnknownRegister { frame, offset })?;
        let width = match register {
            RdRegister::Typer | RdRegister::Propbaser | RdRegister::Pendbaser => Width::Double,
            RdRegister::RazWi(width) => width,
            _ => Width::Word,
        };
        regs::check_access(frame, offset, size, width)?;
        Ok(register)
    }

    fn decode_sgi_base(
        &self,
        vcpu: usize,
        offset: u64,
        size: u8,
    ) -> Result<SgiRegister, VgicError> {
        self.check_redistributor(vcpu)?;
        let frame = Frame::SgiBase { vcpu };
        let register = decode_sgi(offset).ok_or(VgicError::UnknownRegister { frame, offset })?;
        let width = match register {
            SgiRegister::Priority(_) => Width::ByteOrWord,
            SgiRegister::RazWi(width) => width,
            _ => Width::Word,
        };
        regs::check_access(frame, offset, size, width)?;
        Ok(register)
    }

    /// `GICR_TYPER` of `vcpu`'s redistributor.
    pub(crate) fn redistributor_typer(&self, vcpu: usize) -> u64 {
        let state = &self.vcpus[vcpu];
        let affinity = state.affinity;
        // Aff3 moves from MPIDR bits [39:32] to [31:24] of Affinity_Value.
        let packed = ((affinity >> 8) & 0xff00_0000) | (affinity & 0xff_ffff);
        let last = if vcpu + 1 == self.vcpus.len() {
            TYPER_LAST
        } else {
            0
        };
        let plpis = if self.has_its() { TYPER_PLPIS } else { 0 };
        packed << 32 | (vcpu as u64) << 8 | last | plpis
    }

    /// A guest load of `size` bytes at `offset` in `vcpu`'s `RD_base` frame.
    pub fn rd_base_read(&self, vcpu: usize, offset: u64, size: u8) -> Result<u64, VgicError> {
        Ok(match self.decode_rd_base(vcpu, offset, size)? {
            RdRegister::Iidr => u64::from(IIDR),
            RdRegister::Typer => regs::read_part(self.redistributor_typer(vcpu), offset, size),
            RdRegister::Waker => {
                if self.vcpus[vcpu].processor_sleep {
                    WAKER_PROCESSOR_SLEEP | WAKER_CHILDREN_ASLEEP
                } else {
                    0
                }
            }
            RdRegister::Ctlr => u64::from(self.vcpus[vcpu].lpis.enabled) * GICR_CTLR_ENABLE_LPIS,
            RdRegister::Propbaser => regs::read_part(self.vcpus[vcpu].lpis.propbaser, offset, size),
            RdRegister::Pendbaser => regs::read_part(self.vcpus[vcpu].lpis.pendbaser, offset, size),
            RdRegister::RazWi(_) => 0,
            RdRegister::Id(value) => u64::from(value),
        })
    }

    /// A guest store of `size` bytes of `value` at `offset` in `vcpu`'s
    /// `RD_base` frame. Returns the vCPUs to kick.
    pub fn rd_base_write(
        &mut self,
        vcpu: usize,
        offset: u64,
        size: u8,
        value: u64,
    ) -> Result<VcpuSet, VgicError> {
        let register = self.decode_rd_base(vcpu, offset, size)?;
        let its = self.has_its();
        let lpis = &mut self.vcpus[vcpu].lpis;
        match register {
            RdRegister::Waker => {
                self.vcpus[vcpu].processor_sleep = value & WAKER_PROCESSOR_SLEEP != 0;
            }
            RdRegister::Ctlr if its => lpis.enabled |= value & GICR_CTLR_ENABLE_LPIS != 0,
            RdRegister::Propbaser if its && !lpis.enabled => {
                lpis.propbaser =
                    regs::merge_part(lpis.propbaser, offset, size, value) & PROPBASER_MASK;
            }
            RdRegister::Pendbaser if its && !lpis.enabled => {
                lpis.pendbaser =
                    regs::merge_part(lpis.pendbaser, offset, size, value) & PENDBASER_MASK;
            }
            _ => {}
        }
        Ok(VcpuSet::EMPTY)
    }

    /// A guest load of `size` bytes at `offset` in `vcpu`'s `SGI_base` frame.
    pub fn sgi_base_read(&self, vcpu: usize, offset: u64, size: u8) -> Result<u64, VgicError> {
        Ok(match self.decode_sgi_base(vcpu, offset, size)? {
            SgiRegister::Bits(register) => self.read_bits(vcpu, register, 0),
            SgiRegister::Priority(first) => self.read_priorities(vcpu, first, size),
            SgiRegister::Config(first) => self.read_config(vcpu, first),
            SgiRegister::RazWi(_) => 0,
        })
    }

    /// A guest store of `size` bytes of `value` at `offset` in `vcpu`'s
    /// `SGI_base` frame. Returns the vCPUs to kick.
    pub fn sgi_base_write(
        &mut self,
        vcpu: usize,
        offset: u64,
        size: u8,
        value: u64,
    ) -> Result<VcpuSet, VgicError> {
        Ok(match self.decode_sgi_base(vcpu, offset, size)? {
            SgiRegister::Bits(register) => self.write_bits(vcpu, register, 0, value),
            SgiRegister::Priority(first) => self.write_priorities(vcpu, first, size, value),
            SgiRegister::Config(first) => self.write_config(vcpu, first, value),
            SgiRegister::RazWi(_) => VcpuSet::EMPTY,
        })
    }
}

const _: () = assert!(
    PRIVATE_COUNT == 32,
    "SGI_base banks exactly one word of INTIDs"
);

#[cfg(test)]
mod tests {
    use super::super::VTIMER_INTID;
    use super::super::state::tests::two_vcpus;
    use super::super::{Trigger, VgicConfig};
    use super::*;

    const GICR_BASE: u64 = 0x080a_0000;
    const SGI: u64 = 0x1_0000;

    #[test]
    fn typer_identifies_each_redistributor() {
        let gic = VgicState::new(VgicConfig {
            distributor_base: 0,
            redistributor_base: 0x10_0000,
            spi_count: 32,
            vcpu_mpidrs: vec![0x8000_0000, 0x8000_0001, 0x80_0102_0304],
        })
        .unwrap();
        let typer = |vcpu| gic.rd_base_read(vcpu, 0x8, 8).unwrap();
        assert_eq!(typer(0), 0);
        assert_eq!(typer(1), 1 << 32 | 1 << 8);
        assert_eq!(
            typer(2),
            0x8002_0304 << 32 | 2 << 8 | 1 << 4,
            "Aff3.Aff2.Aff1.Aff0, Last"
        );
        assert_eq!(gic.rd_base_read(2, 0x8, 4), Ok(2 << 8 | 1 << 4));
        assert_eq!(gic.rd_base_read(2, 0xc, 4), Ok(0x8002_0304));
        assert!(gic.rd_base_read(2, 0xc, 8).is_err());
        assert_eq!(gic.rd_base_read(3, 0x8, 8), Err(VgicError::NoSuchVcpu(3)));
    }

    #[test]
    fn waker_handshake() {
        let mut gic = two_vcpus();
        let waker = GICR_BASE + 0x20000 + 0x14;
        assert_eq!(gic.mmio_read(waker, 4), Ok(0b110));
        gic.mmio_write(waker, 4, 0).unwrap();
        assert_eq!(
            gic.mmio_read(waker, 4),
            Ok(0),
            "ChildrenAsleep clears with ProcessorSleep"
        );
        assert_eq!(
            gic.mmio_read(GICR_BASE + 0x14, 4),
            Ok(0b110),
            "vCPU 0 untouched"
        );
        gic.mmio_write(waker, 4, 0b110).unwrap();
        assert_eq!(gic.mmio_read(waker, 4), Ok(0b110));
        assert!(gic.mmio_write(waker, 8, 0).is_err());
    }

    #[test]
    fn rd_base_identification_and_raz_wi() {
        let mut gic = two_vcpus();
        assert_eq!(gic.mmio_read(GICR_BASE + 0x4, 4), Ok(0x4800_043b));
        assert_eq!(gic.mmio_read(GICR_BASE + 0xffe8, 4).unwrap() >> 4 & 0xf, 3);
        for (offset, size) in [
            (0x0u64, 4u8),
            (0x10, 4),
            (0x70, 8),
            (0x78, 8),
            (0x78, 4),
            (0xc0, 4),
        ] {
            assert_eq!(
                gic.mmio_write(GICR_BASE + offset, size, u64::MAX),
                Ok(VcpuSet::EMPTY)
            );
            assert_eq!(gic.mmio_read(GICR_BASE + offset, size), Ok(0));
        }
        assert_eq!(
            gic.mmio_read(GICR_BASE + 0x18, 4),
            Err(VgicError::UnknownRegister {
                frame: Frame::RdBase { vcpu: 0 },
                offset: 0x18
            })
        );
    }

    #[test]
    fn sgi_base_banked_registers() {
        let mut gic = two_vcpus();
        let sgi1 = GICR_BASE + 0x20000 + SGI;
        gic.mmio_write(sgi1 + 0x80, 4, 0xffff_ffff).unwrap();
        gic.mmio_write(sgi1 + 0x100, 4, 1 << 27 | 1 << 1).unwrap();
        gic.mmio_write(sgi1 + 0x200, 4, 1 << 5).unwrap();
        gic.mmio_write(sgi1 + 0x300, 4, 1 << 6).unwrap();
        assert_eq!(gic.mmio_read(sgi1 + 0x80, 4), Ok(0xffff_ffff));
        assert_eq!(gic.mmio_read(sgi1 + 0x180, 4), Ok(1 << 27 | 1 << 1));
        assert_eq!(gic.mmio_read(sgi1 + 0x280, 4), Ok(1 << 5));
        assert_eq!(gic.mmio_read(sgi1 + 0x380, 4), Ok(1 << 6));
        // vCPU 0's bank is separate.
        let sgi0 = GICR_BASE + SGI;
        for offset in [0x80u64, 0x100, 0x200, 0x300] {
            assert_eq!(gic.mmio_read(sgi0 + offset, 4), Ok(0));
        }
        gic.mmio_write(sgi1 + 0x180, 4, 1 << 1).unwrap();
        gic.mmio_write(sgi1 + 0x280, 4, 1 << 5).unwrap();
        gic.mmio_write(sgi1 + 0x380, 4, 1 << 6).unwrap();
        assert_eq!(gic.mmio_read(sgi1 + 0x100, 4), Ok(1 << 27));
        assert_eq!(gic.mmio_read(sgi1 + 0x200, 4), Ok(0));
        assert_eq!(gic.mmio_read(sgi1 + 0x300, 4), Ok(0));
        // Word 1 of the banked registers does not exist in SGI_base.
        assert!(gic.mmio_read(sgi1 + 0x104, 4).unwrap_err().is_raz_wi());
    }

    #[test]
    fn sgi_base_priorities_and_config() {
        let mut gic = two_vcpus();
        let sgi0 = GICR_BASE + SGI;
        gic.mmio_write(sgi0 + 0x400 + 27, 1, 0xa0).unwrap();
        gic.mmio_write(sgi0 + 0x400, 4, 0x1020_3040).unwrap();
        assert_eq!(gic.mmio_read(sgi0 + 0x418, 4), Ok(0xa0 << 24));
        assert_eq!(gic.mmio_read(sgi0 + 0x400, 4), Ok(0x1020_3040));
        assert_eq!(gic.mmio_read(sgi0 + 0x401, 1), Ok(0x30));
        assert!(gic.mmio_read(sgi0 + 0x420, 4).unwrap_err().is_raz_wi());
        assert_eq!(
            gic.mmio_read(sgi0 + 0xc00, 4),
            Ok(0xaaaa_aaaa),
            "SGIs are edge"
        );
        gic.mmio_write(sgi0 + 0xc00, 4, 0).unwrap();
        assert_eq!(gic.mmio_read(sgi0 + 0xc00, 4), Ok(0xaaaa_aaaa), "read-only");
        assert_eq!(gic.mmio_read(sgi0 + 0xc04, 4), Ok(0), "PPIs reset level");
        gic.mmio_write(sgi0 + 0xc04, 4, 0x2 << 22).unwrap();
        assert_eq!(gic.mmio_read(sgi0 + 0xc04, 4), Ok(0x2 << 22));
        assert_eq!(gic.irq(0, 27).unwrap().trigger, Trigger::Edge);
        assert_eq!(gic.irq(1, 27).unwrap().trigger, Trigger::Level);
        assert!(gic.mmio_read(sgi0 + 0xc00, 1).is_err());
        assert_eq!(gic.mmio_read(sgi0 + 0xd00, 4), Ok(0));
    }

    #[test]
    fn enabling_a_pending_ppi_kicks_its_vcpu() {
        let mut gic = two_vcpus();
        gic.distributor_write(0, 4, 0x2).unwrap();
        let sgi1 = GICR_BASE + 0x20000 + SGI;
        gic.mmio_write(sgi1 + 0x80, 4, 0xffff_ffff).unwrap();
        gic.set_ppi_level(1, VTIMER_INTID, true).unwrap();
        let kicks = gic.mmio_write(sgi1 + 0x100, 4, 1 << 27).unwrap();
        assert_eq!(kicks.iter().collect::<Vec<_>>(), vec![1]);
    }
}
