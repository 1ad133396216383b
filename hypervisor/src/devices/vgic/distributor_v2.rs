//! The emulated GICv2 distributor (`GICD_*`, one 64 KiB window per VM).
//!
//! A GICv2 has no redistributors: the registers of the private interrupts
//! (INTIDs 0..=31: word 0 of the bit registers, the first eight priority and
//! target bytes, `ICFGR0/1`) are banked by the CPU that accesses them, so
//! every access here names the accessing vCPU and those words go to its bank
//! of the shared model (the same bank the GICv3 front end reaches through a
//! redistributor). The rest decodes as follows:
//!
//! - `GICD_CTLR`: `EnableGrp0` (bit 0) and `EnableGrp1` (bit 1), one
//!   security state. `GICD_TYPER`: `ITLinesNumber` for the configured SPIs,
//!   `CPUNumber` = vCPUs - 1, no security extensions.
//! - `GICD_ITARGETSR`: the bytes of INTIDs 0..=31 read as the accessing
//!   vCPU's own bit and ignore writes; an SPI's byte is writable (bits of
//!   vCPUs that do not exist are dropped) and routes it to the lowest vCPU
//!   it names (none while it is zero).
//! - `GICD_ICFGR0` (SGIs) reads as edge and ignores writes.
//! - The SGIs' bits of `GICD_ISPENDR0` and `GICD_ICPENDR0` read their
//!   pending state and ignore writes: a GICv2 SGI is pending per source, set
//!   and cleared only through `GICD_SPENDSGIR`/`GICD_CPENDSGIR` (a GICv3's
//!   `GICR_ISPENDR0` does set them).
//! - `GICD_SGIR` sends SGIs ([`SgirRequest`]), pending on each target from
//!   the sender; `GICD_CPENDSGIR`/`GICD_SPENDSGIR` (one byte per SGI, one bit
//!   per source) read and clear or set the accessing vCPU's sources.
//! - The ID block (`0xFD0..=0xFFC`) identifies a GICv2 (`ICPIDR2.ArchRev` 2);
//!   the other offsets are unknown registers (RAZ/WI).

use super::irq::{FIRST_SPI, PRIVATE_COUNT, SGI_COUNT};
use super::regs::{self, BitRegister, IIDR, Width};
use super::sgi::SgirRequest;
use super::{Frame, VcpuSet, VgicError, VgicState};

const CTLR_ENABLE_GRP0: u64 = 1 << 0;
const CTLR_ENABLE_GRP1: u64 = 1 << 1;
/// `GICD_TYPER.CPUNumber` shift.
const TYPER_CPU_NUMBER_SHIFT: u32 = 5;
/// The SGIs' bits in word 0 of a bit register.
const SGI_BITS: u64 = (1 << SGI_COUNT) - 1;
/// `GICD_ICFGR0`: every SGI edge-triggered.
const ICFGR_SGIS: u64 = 0xaaaa_aaaa;

/// First offset of the GICv2 ID block.
const ID_BLOCK: u64 = 0xfd0;
/// `ICPIDR4..7`, `ICPIDR0..3`, `ICCIDR0..3` of a GIC-400 (ArchRev 2).
const ID_REGISTERS: [u32; 12] = [
    0x04, 0x00, 0x00, 0x00, // PIDR4-7
    0x90, 0xb4, 0x2b, 0x00, // PIDR0-3: part 0x390, JEP106 0x3B, ArchRev 2
    0x0d, 0xf0, 0x05, 0xb1, // CIDR0-3
];

/// A GICv2 distributor register, with the first INTID (or SGI) it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum V2Register {
    Ctlr,
    Typer,
    Iidr,
    Bits(BitRegister, u32),
    Priority(u32),
    Targets(u32),
    Config(u32),
    Sgir,
    ClearSgiPending(u32),
    SetSgiPending(u32),
    Id(u32),
}

fn decode(offset: u64) -> Option<V2Register> {
    use V2Register as R;
    Some(match offset {
        0x000 => R::Ctlr,
        0x004 => R::Typer,
        0x008 => R::Iidr,
        0x080..0x400 => {
            let (register, word) = regs::bit_register(offset)?;
            R::Bits(register, 32 * word)
        }
        0x400..0x800 => R::Priority((offset - 0x400) as u32),
        0x800..0xc00 => R::Targets((offset - 0x800) as u32),
        0xc00..0xd00 => R::Config(((offset - 0xc00) / 4 * 16) as u32),
        0xf00 => R::Sgir,
        0xf10..0xf20 => R::ClearSgiPending((offset - 0xf10) as u32),
        0xf20..0xf30 => R::SetSgiPending((offset - 0xf20) as u32),
        ID_BLOCK..0x1000 if offset.is_multiple_of(4) => {
            R::Id(ID_REGISTERS[((offset - ID_BLOCK) / 4) as usize])
        }
        _ => return None,
    })
}

fn width(register: V2Register) -> Width {
    match register {
        V2Register::Priority(_)
        | V2Register::Targets(_)
        | V2Register::ClearSgiPending(_)
        | V2Register::SetSgiPending(_) => Width::ByteOrWord,
        _ => Width::Word,
    }
}

impl VgicState {
    fn decode_distributor_v2(&self, offset: u64, size: u8) -> Result<V2Register, VgicError> {
        let frame = Frame::Distributor;
        let register = decode(offset).ok_or(VgicError::UnknownRegister { frame, offset })?;
        regs::check_access(frame, offset, size, width(register))?;
        Ok(register)
    }

    /// The `ITARGETSR` bits naming existing vCPUs.
    fn existing_cpus(&self) -> u8 {
        ((1u16 << self.vcpus.len().min(8)) - 1) as u8
    }

    /// A load by `vcpu` of `size` bytes at `offset` in the GICv2 distributor.
    pub fn distributor_v2_read(
        &self,
        vcpu: usize,
        offset: u64,
        size: u8,
    ) -> Result<u64, VgicError> {
        use V2Register as R;
        let bytes = |first: u32, byte: &dyn Fn(u32) -> u8| {
            (0..u32::from(size)).fold(0u64, |acc, i| acc | u64::from(byte(first + i)) << (8 * i))
        };
        Ok(match self.decode_distributor_v2(offset, size)? {
            R::Ctlr => {
                (u64::from(self.enable_grp0) * CTLR_ENABLE_GRP0)
                    | (u64::from(self.enable_grp1) * CTLR_ENABLE_GRP1)
            }
            R::Typer => {
                let it_lines = u64::from((FIRST_SPI + self.spi_count).div_ceil(32) - 1);
                it_lines | ((self.vcpus.len() as u64 - 1) << TYPER_CPU_NUMBER_SHIFT)
            }
            R::Iidr => u64::from(IIDR),
            R::Bits(register, first) => self.read_bits(vcpu, register, first),
            R::Priority(first) => self.read_priorities(vcpu, first, size),
            R::Targets(first) => bytes(first, &|intid| {
                if intid < PRIVATE_COUNT {
                    1 << vcpu
                } else {
                    self.targets
                        .get((intid - FIRST_SPI) as usize)
                        .copied()
                        .unwrap_or(0)
                }
            }),
            R::Config(0) => ICFGR_SGIS,
            R::Config(first) => self.read_config(vcpu, first),
            R::Sgir => 0,
            R::ClearSgiPending(first) | R::SetSgiPending(first) => bytes(first, &|sgi| {
                self.vcpus[vcpu].private[sgi as usize].sgi_sources
            }),
            R::Id(value) => u64::from(value),
        })
    }

    /// A store by `vcpu` of `size` bytes of `value` at `offset` in the GICv2
    /// distributor. Returns the vCPUs to kick.
    pub fn distributor_v2_write(
        &mut self,
        vcpu: usize,
        offset: u64,
        size: u8,
        value: u64,
    ) -> Result<VcpuSet, VgicError> {
        use V2Register as R;
        let mut kicks = VcpuSet::EMPTY;
        match self.decode_distributor_v2(offset, size)? {
            R::Ctlr => {
                let grp0 = value & CTLR_ENABLE_GRP0 != 0;
                let grp1 = value & CTLR_ENABLE_GRP1 != 0;
                if grp0 != self.enable_grp0 || grp1 != self.enable_grp1 {
                    self.enable_grp0 = grp0;
                    self.enable_grp1 = grp1;
                    for index in 0..self.vcpus.len() {
                        kicks.insert(index);
                    }
                }
            }
            R::Typer | R::Iidr | R::Id(_) | R::Config(0) => {}
            R::Bits(register, first) => {
                let value = if first == 0
                    && matches!(
                        register,
                        BitRegister::SetPending | BitRegister::ClearPending
                    ) {
                    value & !SGI_BITS
                } else {
                    value
                };
                kicks = self.write_bits(vcpu, register, first, value)
            }
            R::Priority(first) => kicks = self.write_priorities(vcpu, first, size, value),
            R::Config(first) => kicks = self.write_config(vcpu, first, value),
            R::Targets(first) => {
                for i in 0..u32::from(size) {
                    let intid = first + i;
                    let Some(index) = intid.checked_sub(FIRST_SPI).map(|n| n as usize) else {
                        continue;
                    };
                    let new = (value >> (8 * i)) as u8 & self.existing_cpus();
                    if self.targets.get(index).is_none_or(|&old| old == new) {
                        continue;
                    }
                    kicks = kicks.union(self.kicks_for(0, intid));
                    self.targets[index] = new;
                    kicks = kicks.union(self.kicks_for(0, intid));
                }
            }
            R::Sgir => kicks = self.send_sgi_v2(vcpu, value as u32)?,
            R::ClearSgiPending(first) | R::SetSgiPending(first) => {
                let set = matches!(
                    self.decode_distributor_v2(offset, size)?,
                    R::SetSgiPending(_)
                );
                for i in 0..u32::from(size) {
                    let sgi = first + i;
                    let mask = (value >> (8 * i)) as u8 & self.existing_cpus();
                    if mask == 0 || sgi >= SGI_COUNT {
                        continue;
                    }
                    let irq = &mut self.vcpus[vcpu].private[sgi as usize];
                    if set {
                        for source in 0..8 {
                            if mask & (1 << source) != 0 {
                                irq.pend_from(source);
                            }
                        }
                    } else {
                        irq.clear_sources(mask);
                    }
                    kicks = kicks.union(self.kicks_for(vcpu, sgi));
                }
            }
        }
        Ok(kicks)
    }

    /// A `GICD_SGIR` write by `sender`: the SGI becomes pending from the
    /// sender on each target (GICv2 without security extensions forwards it
    /// whatever its group). Returns the targets (the vCPUs to kick).
    pub fn send_sgi_v2(&mut self, sender: usize, value: u32) -> Result<VcpuSet, VgicError> {
        self.check_vcpu(sender)?;
        let request = SgirRequest::decode(value);
        let targets = request.resolve(self.vcpus.len(), sender);
        for target in targets.iter() {
            self.vcpus[target].private[request.intid as usize].pend_from(sender as u8);
        }
        Ok(targets)
    }
}

#[cfg(test)]
mod tests {
    use super::super::list_regs::{ListRegister, ListRegisters, LrEncoding, ModelListRegisters};
    use super::super::{VgicConfig, VgicVersion};
    use super::*;

    const CTLR: u64 = 0x000;
    const TYPER: u64 = 0x004;
    const ISENABLER: u64 = 0x100;
    const ISPENDR: u64 = 0x200;
    const ICPENDR: u64 = 0x280;
    const IPRIORITYR: u64 = 0x400;
    const ITARGETSR: u64 = 0x800;
    const ICFGR: u64 = 0xc00;
    const SGIR: u64 = 0xf00;
    const CPENDSGIR: u64 = 0xf10;
    const SPENDSGIR: u64 = 0xf20;

    fn gic(vcpus: usize) -> VgicState {
        VgicState::new_v2(VgicConfig {
            distributor_base: 0x0800_0000,
            redistributor_base: 0x080a_0000,
            spi_count: 64,
            vcpu_mpidrs: (0..vcpus as u64).collect(),
        })
        .unwrap()
    }

    fn kicks(list: &[usize]) -> VcpuSet {
        list.iter().fold(VcpuSet::EMPTY, |mut set, &index| {
            set.insert(index);
            set
        })
    }

    #[test]
    fn identification_and_limits() {
        let g = gic(4);
        assert_eq!(g.version(), VgicVersion::V2);
        let typer = g.distributor_v2_read(0, TYPER, 4).unwrap();
        assert_eq!(typer & 0x1f, 2, "ITLinesNumber for 64 SPIs");
        assert_eq!(typer >> 5 & 0x7, 3, "CPUNumber: 4 CPUs");
        assert_eq!(typer & 1 << 10, 0, "no security extensions");
        assert_eq!(g.distributor_v2_read(0, 0xfe8, 4).unwrap() >> 4 & 0xf, 2);
        assert_eq!(g.distributor_v2_read(0, 0xff0, 4), Ok(0x0d));
        // No redistributors, and no GICv3 registers.
        assert!(!g.contains(0x080a_0000));
        assert!(g.distributor_v2_read(0, 0x6100, 8).is_err());
        assert!(matches!(
            g.distributor_v2_read(0, 0x6100, 4),
            Err(VgicError::UnknownRegister { .. })
        ));
        let nine = VgicState::new_v2(VgicConfig {
            distributor_base: 0x0800_0000,
            redistributor_base: 0x080a_0000,
            spi_count: 64,
            vcpu_mpidrs: (0..9).collect(),
        });
        assert_eq!(nine.err(), Some(VgicError::VcpuCount(9)));
    }

    #[test]
    fn ctlr_keeps_both_enables() {
        let mut g = gic(2);
        assert_eq!(g.distributor_v2_read(0, CTLR, 4), Ok(0));
        assert_eq!(g.distributor_v2_write(0, CTLR, 4, 0x3), Ok(kicks(&[0, 1])));
        assert_eq!(g.distributor_v2_read(1, CTLR, 4), Ok(0x3));
        assert_eq!(g.distributor_v2_write(0, CTLR, 4, 0x3), Ok(VcpuSet::EMPTY));
        assert!(g.distributor_v2_write(0, CTLR, 1, 0).is_err());
    }

    #[test]
    fn private_words_are_banked_by_the_accessing_vcpu() {
        let mut g = gic(2);
        // vCPU 1 enables its PPI 27 and gives it a priority.
        g.distributor_v2_write(1, ISENABLER, 4, 1 << 27).unwrap();
        g.distributor_v2_write(1, IPRIORITYR + 27, 1, 0xa0).unwrap();
        assert_eq!(g.distributor_v2_read(1, ISENABLER, 4), Ok(1 << 27));
        assert_eq!(g.distributor_v2_read(0, ISENABLER, 4), Ok(0));
        assert_eq!(g.distributor_v2_read(1, IPRIORITYR + 27, 1), Ok(0xa0));
        assert_eq!(g.distributor_v2_read(0, IPRIORITYR + 27, 1), Ok(0));
        assert!(g.irq(1, 27).unwrap().enabled && !g.irq(0, 27).unwrap().enabled);
        // Through the guest's addresses: the same bank.
        assert_eq!(g.mmio_read_from(1, 0x0800_0100, 4), Ok(1 << 27));
        assert_eq!(g.mmio_read_from(0, 0x0800_0100, 4), Ok(0));
        assert_eq!(g.mmio_read(0x0800_0100, 4), Ok(0), "vCPU 0's bank");
        assert_eq!(
            g.mmio_read_from(2, 0x0800_0100, 4),
            Err(VgicError::NoSuchVcpu(2))
        );
        assert_eq!(
            g.mmio_read_from(0, 0x080a_0000, 4),
            Err(VgicError::NotInGic { ipa: 0x080a_0000 })
        );
        // SPI words are shared.
        g.distributor_v2_write(0, ISENABLER + 4, 4, 0b10).unwrap();
        assert_eq!(g.distributor_v2_read(1, ISENABLER + 4, 4), Ok(0b10));
        // SGIs are edge, read-only.
        g.distributor_v2_write(0, ICFGR, 4, 0).unwrap();
        assert_eq!(g.distributor_v2_read(0, ICFGR, 4), Ok(0xaaaa_aaaa));
        // Level PPIs by default (the timers).
        assert_eq!(g.distributor_v2_read(0, ICFGR + 4, 4), Ok(0));
    }

    #[test]
    fn itargetsr_banks_private_bytes_and_routes_spis() {
        let mut g = gic(4);
        // Private bytes: the accessing vCPU's own bit, writes ignored.
        for vcpu in 0..4 {
            let mine = 0x0101_0101u64 << vcpu;
            assert_eq!(g.distributor_v2_read(vcpu, ITARGETSR, 4), Ok(mine));
            assert_eq!(g.distributor_v2_read(vcpu, ITARGETSR + 28, 4), Ok(mine));
            assert_eq!(
                g.distributor_v2_read(vcpu, ITARGETSR + 27, 1),
                Ok(1 << vcpu)
            );
            g.distributor_v2_write(vcpu, ITARGETSR + 16, 4, 0xffff_ffff)
                .unwrap();
            assert_eq!(g.distributor_v2_read(vcpu, ITARGETSR + 16, 4), Ok(mine));
        }
        // SPIs: writable, masked to existing CPUs, routed to the lowest.
        assert_eq!(g.spi_target(33), None, "reset: no target");
        g.distributor_v2_write(0, ITARGETSR + 33, 1, 0xf4).unwrap();
        assert_eq!(g.distributor_v2_read(1, ITARGETSR + 33, 1), Ok(0x04));
        assert_eq!(g.spi_target(33), Some(2));
        g.distributor_v2_write(0, ITARGETSR + 32, 4, 0x0a00_0300)
            .unwrap();
        assert_eq!(g.distributor_v2_read(3, ITARGETSR + 32, 4), Ok(0x0a00_0300));
        assert_eq!(g.spi_target(33), Some(0));
        assert_eq!(g.spi_target(35), Some(1));
        // Re-routing a pending, enabled SPI kicks the old and new targets.
        g.distributor_v2_write(0, CTLR, 4, 1).unwrap();
        g.distributor_v2_write(0, ISENABLER + 4, 4, 1 << 3).unwrap();
        g.inject_spi_edge(35).unwrap();
        assert_eq!(
            g.distributor_v2_write(0, ITARGETSR + 35, 1, 0x4),
            Ok(kicks(&[1, 2]))
        );
        // Unimplemented SPIs read as zero.
        assert_eq!(g.distributor_v2_read(0, ITARGETSR + 200, 1), Ok(0));
    }

    /// An SGI's bits in `ISPENDR0`/`ICPENDR0` show whether it is pending but
    /// ignore writes; a PPI's bits in the same words are writable.
    #[test]
    fn sgi_pending_bits_of_the_bit_registers_ignore_writes() {
        let mut g = gic(2);
        g.distributor_v2_write(1, ISPENDR, 4, 1 << 3 | 1 << 27)
            .unwrap();
        assert!(
            !g.irq(1, 3).unwrap().pending(),
            "SGI 3 set through ISPENDR0"
        );
        assert!(
            g.irq(1, 27).unwrap().pending(),
            "PPI 27 set through ISPENDR0"
        );
        g.distributor_v2_write(0, SGIR, 4, 0b10 << 16 | 3).unwrap();
        assert_eq!(
            g.distributor_v2_read(1, ISPENDR, 4),
            Ok(1 << 3 | 1 << 27),
            "reads show the SGI pending"
        );
        g.distributor_v2_write(1, ICPENDR, 4, 0xffff_ffff).unwrap();
        assert!(
            g.irq(1, 3).unwrap().pending(),
            "SGI 3 cleared through ICPENDR0"
        );
        assert_eq!(g.irq(1, 3).unwrap().sgi_sources, 0b1);
        assert!(!g.irq(1, 27).unwrap().pending(), "PPI 27 stays pending");
    }

    #[test]
    fn sgir_pends_per_source_and_sgi_registers_show_sources() {
        let mut g = gic(4);
        // vCPU 0 sends SGI 3 to 1 and 2; vCPU 3 sends SGI 3 to everyone else.
        assert_eq!(
            g.distributor_v2_write(0, SGIR, 4, 0b110 << 16 | 3),
            Ok(kicks(&[1, 2]))
        );
        assert_eq!(
            g.distributor_v2_write(3, SGIR, 4, 1 << 24 | 3),
            Ok(kicks(&[0, 1, 2]))
        );
        assert_eq!(g.irq(1, 3).unwrap().sgi_sources, 0b1001);
        assert_eq!(g.irq(0, 3).unwrap().sgi_sources, 0b1000);
        assert_eq!(g.irq(3, 3).unwrap().sgi_sources, 0);
        // SPENDSGIR/CPENDSGIR: byte n is SGI n, bit m source m.
        assert_eq!(g.distributor_v2_read(1, SPENDSGIR, 4), Ok(0x0900_0000));
        assert_eq!(g.distributor_v2_read(1, CPENDSGIR + 3, 1), Ok(0x09));
        g.distributor_v2_write(1, CPENDSGIR + 3, 1, 0x8).unwrap();
        assert_eq!(g.irq(1, 3).unwrap().sgi_sources, 0b1);
        assert!(g.irq(1, 3).unwrap().pending());
        g.distributor_v2_write(1, CPENDSGIR, 4, 0x0100_0000)
            .unwrap();
        assert!(!g.irq(1, 3).unwrap().pending());
        g.distributor_v2_write(2, SPENDSGIR + 4, 4, 0x0000_0600)
            .unwrap();
        assert_eq!(g.irq(2, 5).unwrap().sgi_sources, 0b110);
        // Self only.
        assert_eq!(
            g.distributor_v2_write(2, SGIR, 4, 2 << 24 | 9),
            Ok(kicks(&[2]))
        );
        assert_eq!(g.irq(2, 9).unwrap().sgi_sources, 0b100);
    }

    /// Distributor on, everything group 1 and enabled on every vCPU.
    fn ready(vcpus: usize) -> VgicState {
        let mut g = gic(vcpus);
        g.distributor_v2_write(0, CTLR, 4, 0x3).unwrap();
        for vcpu in 0..vcpus {
            g.distributor_v2_write(vcpu, 0x80, 4, u64::from(u32::MAX))
                .unwrap();
            g.distributor_v2_write(vcpu, ISENABLER, 4, u64::from(u32::MAX))
                .unwrap();
        }
        g
    }

    #[test]
    fn sgi_sources_reach_the_list_registers_one_at_a_time() {
        let mut g = ready(4);
        g.distributor_v2_write(1, SGIR, 4, 1 << 16 | 2).unwrap();
        g.distributor_v2_write(3, SGIR, 4, 1 << 16 | 2).unwrap();
        let mut lrs = ModelListRegisters::new(4).with_encoding(LrEncoding::V2);
        g.fill(0, &mut lrs).unwrap();
        let lr = ListRegister(lrs.read_lr(0));
        assert_eq!((lr.intid(), lr.source(), lr.pending()), (2, 1, true));
        assert_eq!(ListRegister(lr.0).to_v2() >> 10 & 0x7, 1, "GICH_LR.CPUID");
        // The guest takes it: the LR stays active naming source 1 (its EOI
        // must match), source 3 waits behind it with EOI maintenance.
        assert_eq!(lrs.acknowledge(), Some(2));
        g.fill(0, &mut lrs).unwrap();
        let lr = ListRegister(lrs.read_lr(0));
        assert_eq!((lr.source(), lr.pending(), lr.active()), (1, false, true));
        assert!(lr.eoi_maintenance());
        assert_eq!(g.irq(0, 2).unwrap().sgi_sources, 0b1000);
        lrs.end_of_interrupt(2);
        g.fill(0, &mut lrs).unwrap();
        let lr = ListRegister(lrs.read_lr(0));
        assert_eq!((lr.source(), lr.pending(), lr.active()), (3, true, false));
        assert_eq!(lrs.acknowledge(), Some(2));
        lrs.end_of_interrupt(2);
        g.fill(0, &mut lrs).unwrap();
        assert!(ListRegister(lrs.read_lr(0)).is_empty());
        assert!(!g.irq(0, 2).unwrap().pending());
    }

    #[test]
    fn a_source_that_sends_again_while_listed_is_kept() {
        let mut g = ready(2);
        g.distributor_v2_write(1, SGIR, 4, 1 << 16 | 4).unwrap();
        let mut lrs = ModelListRegisters::new(4).with_encoding(LrEncoding::V2);
        g.fill(0, &mut lrs).unwrap();
        assert_eq!(lrs.acknowledge(), Some(4));
        g.distributor_v2_write(1, SGIR, 4, 1 << 16 | 4).unwrap();
        lrs.end_of_interrupt(4);
        g.fill(0, &mut lrs).unwrap();
        let lr = ListRegister(lrs.read_lr(0));
        assert_eq!((lr.intid(), lr.source(), lr.pending()), (4, 1, true));
    }
}
