//! The GICv3 virtual CPU interface's control registers, behind a trait.
//!
//! [`ListRegisters`] is everything the vGIC needs from the hardware: the
//! number of list registers, `ICH_LR<n>_EL2`, `ICH_HCR_EL2`, `ICH_MISR_EL2`
//! and `ICH_ELRSR_EL2`. The machine layer reaches them with `mrs`/`msr`
//! (`arch::drivers::list_registers`); [`ModelListRegisters`] is a host
//! model of the same registers that also plays the guest's side
//! (acknowledge, EOI) and derives `ELRSR` and `MISR` from the list registers
//! the way the CPU interface does, so the fold/fill logic is tested against
//! the architecture's rules. [`ListRegister`] encodes and decodes one list
//! register value.
//!
//! The model speaks the GICv3 list-register format everywhere. A GICv2
//! host's list registers (`GICH_LR<n>`, 32 bits) hold the same information
//! in another layout: [`LrEncoding`] names the two layouts and converts
//! between them ([`ListRegister::to_v2`], [`ListRegister::from_v2`]); a
//! GICv2 back end converts on every access, so the fold/fill logic is
//! shared. The GICv2 `GICH_HCR`, `GICH_MISR` and `GICH_ELRSR0/1` bits sit
//! where the GICv3 `ICH_HCR_EL2`, `ICH_MISR_EL2` and `ICH_ELRSR_EL2` bits do
//! (En, UIE, LRENPIE, EOIcount; EOI, U, LRENP), so only the list registers
//! need converting. A GICv2 SGI carries its source CPU in the list register
//! (`CPUID`, returned by the guest's `GICC_IAR`); the model keeps it in bits
//! \[34:32\] of its GICv3-format value ([`ListRegister::source`]), which
//! are RES0 in `ICH_LR<n>_EL2` with HW = 0 and only ever set for a GICv2
//! guest.

use aarch64_cpu::registers::{ICH_HCR_EL2, ICH_LR0_EL2};
use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

register_bitfields! {u32,
    /// `GICH_LR<n>` (GICv2 virtual interface control, HW = 0 layout).
    GICH_LR [
        /// The interrupt ID the guest sees.
        VirtualID OFFSET(0) NUMBITS(10) [],
        /// For an SGI: the source CPU the guest's `GICC_IAR` reports.
        CPUID OFFSET(10) NUMBITS(3) [],
        /// Maintenance interrupt when the guest deactivates it (HW = 0).
        EOI OFFSET(19) NUMBITS(1) [],
        /// Priority, upper five bits of the 8-bit priority.
        Priority OFFSET(23) NUMBITS(5) [],
        /// 0 invalid, 1 pending, 2 active, 3 pending and active.
        State OFFSET(28) NUMBITS(2) [],
        /// Group 1.
        Grp1 OFFSET(30) NUMBITS(1) [],
        /// Hardware interrupt.
        HW OFFSET(31) NUMBITS(1) []
    ],
    /// `GICH_LR<n>` fields that differ with HW = 1.
    GICH_LR_HW [
        /// The physical interrupt the guest's deactivation deactivates.
        PhysicalID OFFSET(10) NUMBITS(10) []
    ]
}

/// The layout of the hardware's list registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LrEncoding {
    /// `ICH_LR<n>_EL2`, 64 bits: the model's own format.
    V3,
    /// `GICH_LR<n>`, 32 bits.
    V2,
}

impl LrEncoding {
    /// The hardware value holding `lr`.
    pub fn encode(self, lr: ListRegister) -> u64 {
        match self {
            Self::V3 => lr.0,
            Self::V2 => u64::from(lr.to_v2()),
        }
    }

    /// The list register a hardware value holds.
    pub fn decode(self, raw: u64) -> ListRegister {
        match self {
            Self::V3 => ListRegister(raw),
            Self::V2 => ListRegister::from_v2(raw as u32),
        }
    }
}

/// Most list registers the architecture allows (`ICH_VTR_EL2.ListRegs` is 4 bits).
pub const MAX_LIST_REGISTERS: usize = 16;

/// `ICH_HCR_EL2.En`: virtual CPU interface enabled.
pub const ICH_HCR_EN: u64 = ICH_HCR_EL2::En::SET.value;
/// `ICH_HCR_EL2.UIE`: maintenance interrupt when at most one list register is valid.
pub const ICH_HCR_UIE: u64 = ICH_HCR_EL2::UIE::SET.value;
/// `ICH_HCR_EL2.LRENPIE`: maintenance interrupt while `EOIcount` is nonzero.
pub const ICH_HCR_LRENPIE: u64 = ICH_HCR_EL2::LRENPIE::SET.value;
/// `ICH_HCR_EL2.EOIcount` shift (bits \[31:27\]).
pub const ICH_HCR_EOICOUNT_SHIFT: u32 = ICH_HCR_EL2::EOIcount.shift as u32;
/// `ICH_HCR_EL2.EOIcount` mask (in place).
pub const ICH_HCR_EOICOUNT_MASK: u64 = ICH_HCR_EL2::EOIcount.mask << ICH_HCR_EL2::EOIcount.shift;

/// `ICH_MISR_EL2.EOI`: a list register with EOI set was deactivated.
pub const ICH_MISR_EOI: u64 = 1 << 0;
/// `ICH_MISR_EL2.U`: underflow (UIE set and at most one valid list register).
pub const ICH_MISR_U: u64 = 1 << 1;
/// `ICH_MISR_EL2.LRENP`: LRENPIE set and EOIcount nonzero.
pub const ICH_MISR_LRENP: u64 = 1 << 2;

const LR_EOI: u64 = ICH_LR0_EL2::EOI::SET.value;
const LR_PINTID_SHIFT: u32 = ICH_LR0_EL2::pINTID.shift as u32;
const LR_PINTID_MASK: u64 = ICH_LR0_EL2::pINTID.mask << ICH_LR0_EL2::pINTID.shift;
const LR_SOURCE_SHIFT: u32 = 32;
const LR_SOURCE_MASK: u64 = 0x7 << LR_SOURCE_SHIFT;
const LR_PRIORITY_SHIFT: u32 = ICH_LR0_EL2::Priority.shift as u32;
const LR_GROUP: u64 = ICH_LR0_EL2::Group::SET.value;
const LR_HW: u64 = ICH_LR0_EL2::HW::SET.value;
const LR_STATE_SHIFT: u32 = ICH_LR0_EL2::State.shift as u32;
const LR_PENDING: u64 = ICH_LR0_EL2::State::Pending.value;
const LR_ACTIVE: u64 = ICH_LR0_EL2::State::Active.value;

/// One `ICH_LR<n>_EL2` value: vINTID \[31:0\], pINTID \[41:32\] (bit 41 is EOI
/// when HW is 0), priority \[55:48\], group \[60\], HW \[61\], state \[63:62\].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListRegister(pub u64);

impl ListRegister {
    /// The empty (invalid) list register.
    pub const EMPTY: Self = Self(0);

    /// A software-injected (HW = 0) interrupt. `eoi_maintenance` asks for an
    /// EOI maintenance interrupt when the guest deactivates it.
    pub const fn virtual_interrupt(
        intid: u32,
        priority: u8,
        group1: bool,
        pending: bool,
        active: bool,
        eoi_maintenance: bool,
    ) -> Self {
        let mut value = intid as u64 | (priority as u64) << LR_PRIORITY_SHIFT;
        if group1 {
            value |= LR_GROUP;
        }
        if pending {
            value |= LR_PENDING;
        }
        if active {
            value |= LR_ACTIVE;
        }
        if eoi_maintenance {
            value |= LR_EOI;
        }
        Self(value)
    }

    /// The same list register linked to physical interrupt `pintid` (HW =
    /// 1): the guest's deactivation of the virtual interrupt deactivates the
    /// physical one, and no EOI maintenance can be asked for (its bit is
    /// part of the physical INTID). `pintid` is a PPI or SPI (below 1020).
    pub const fn hardware(self, pintid: u32) -> Self {
        let value = self.0 & !(LR_PINTID_MASK | LR_SOURCE_MASK);
        Self(value | LR_HW | ((pintid as u64) << LR_PINTID_SHIFT) & LR_PINTID_MASK)
    }

    /// The physical INTID of a hardware interrupt (HW = 1).
    pub const fn pintid(self) -> Option<u32> {
        if self.hw() {
            Some(((self.0 & LR_PINTID_MASK) >> LR_PINTID_SHIFT) as u32)
        } else {
            None
        }
    }

    /// The virtual INTID.
    pub const fn intid(self) -> u32 {
        self.0 as u32
    }

    /// The same list register naming `source` (0..=7) as the SGI's source
    /// CPU (GICv2 guests only).
    pub const fn with_source(self, source: u8) -> Self {
        Self((self.0 & !LR_SOURCE_MASK) | ((source as u64 & 0x7) << LR_SOURCE_SHIFT))
    }

    /// The SGI source CPU (GICv2 guests; 0 otherwise).
    pub const fn source(self) -> u8 {
        ((self.0 & LR_SOURCE_MASK) >> LR_SOURCE_SHIFT) as u8
    }

    /// The `GICH_LR<n>` value holding this list register: INTID (10 bits),
    /// source CPU and EOI (HW = 0) or the physical ID (HW = 1), the
    /// priority's upper five bits, state, group. The model keeps priorities
    /// to five bits ([`crate::devices::vgic::PRIORITY_MASK`]), so nothing it
    /// writes is lost.
    pub fn to_v2(self) -> u32 {
        let mut lr = LocalRegisterCopy::<u32, GICH_LR::Register>::new(0);
        lr.modify(
            GICH_LR::VirtualID.val(self.intid() & 0x3ff)
                + GICH_LR::Priority.val(u32::from(self.priority() >> 3))
                + GICH_LR::State.val(u32::from(self.state()))
                + GICH_LR::Grp1.val(u32::from(self.group1())),
        );
        match self.pintid() {
            Some(pintid) => {
                lr.modify(GICH_LR::HW::SET);
                let mut hw = LocalRegisterCopy::<u32, GICH_LR_HW::Register>::new(lr.get());
                hw.modify(GICH_LR_HW::PhysicalID.val(pintid & 0x3ff));
                hw.get()
            }
            None => {
                lr.modify(
                    GICH_LR::CPUID.val(u32::from(self.source()))
                        + GICH_LR::EOI.val(u32::from(self.eoi_maintenance())),
                );
                lr.get()
            }
        }
    }

    /// The list register a `GICH_LR<n>` value holds (either layout).
    pub fn from_v2(raw: u32) -> Self {
        let lr = LocalRegisterCopy::<u32, GICH_LR::Register>::new(raw);
        let state = lr.read(GICH_LR::State);
        let hw = lr.is_set(GICH_LR::HW);
        let value = Self::virtual_interrupt(
            lr.read(GICH_LR::VirtualID),
            (lr.read(GICH_LR::Priority) << 3) as u8,
            lr.is_set(GICH_LR::Grp1),
            state & 1 != 0,
            state & 2 != 0,
            lr.is_set(GICH_LR::EOI) && !hw,
        );
        if hw {
            let physical = LocalRegisterCopy::<u32, GICH_LR_HW::Register>::new(raw);
            value.hardware(physical.read(GICH_LR_HW::PhysicalID))
        } else {
            value.with_source(lr.read(GICH_LR::CPUID) as u8)
        }
    }

    /// The priority field.
    pub const fn priority(self) -> u8 {
        (self.0 >> LR_PRIORITY_SHIFT) as u8
    }

    /// Group 1.
    pub const fn group1(self) -> bool {
        self.0 & LR_GROUP != 0
    }

    /// Hardware interrupt (deactivation forwarded to a physical INTID).
    pub const fn hw(self) -> bool {
        self.0 & LR_HW != 0
    }

    /// EOI maintenance requested (meaningful when HW is 0).
    pub const fn eoi_maintenance(self) -> bool {
        !self.hw() && self.0 & LR_EOI != 0
    }

    /// Pending bit of the state field.
    pub const fn pending(self) -> bool {
        self.0 & LR_PENDING != 0
    }

    /// Active bit of the state field.
    pub const fn active(self) -> bool {
        self.0 & LR_ACTIVE != 0
    }

    /// The same list register with its active state cleared (a
    /// deactivation).
    #[must_use]
    pub const fn deactivated(self) -> Self {
        Self(self.0 & !LR_ACTIVE)
    }

    /// State field \[63:62\]: 0 invalid, 1 pending, 2 active, 3 both.
    pub const fn state(self) -> u8 {
        (self.0 >> LR_STATE_SHIFT) as u8
    }

    /// Whether the list register holds no interrupt.
    pub const fn is_empty(self) -> bool {
        self.state() == 0
    }
}

/// Access to the list registers and the virtual interface control registers
/// of the physical CPU that runs the vCPU.
pub trait ListRegisters {
    /// Number of implemented list registers (`ICH_VTR_EL2.ListRegs + 1`).
    fn count(&self) -> usize;
    /// Reads `ICH_LR<index>_EL2`; `index < count()`.
    fn read_lr(&self, index: usize) -> u64;
    /// Writes `ICH_LR<index>_EL2`; `index < count()`.
    fn write_lr(&mut self, index: usize, value: u64);
    /// Reads `ICH_HCR_EL2`.
    fn read_hcr(&self) -> u64;
    /// Writes `ICH_HCR_EL2`.
    fn write_hcr(&mut self, value: u64);
    /// Reads `ICH_MISR_EL2`.
    fn read_misr(&self) -> u64;
    /// Reads `ICH_ELRSR_EL2`: bit n set when list register n is empty.
    fn read_elrsr(&self) -> u64;
}

/// What a deactivation of a virtual interrupt did to the list registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deactivation {
    /// `EOImode` 0 or a special INTID: nothing (only for `ICC_DIR_EL1`).
    Ignored,
    /// The list register holding it active was deactivated; for a hardware
    /// interrupt, its physical INTID, which the CPU interface deactivates
    /// as well.
    Listed {
        /// The hardware interrupt's physical INTID.
        physical: Option<u32>,
    },
    /// No list register holds it active: `ICH_HCR_EL2.EOIcount` counted it
    /// (the vgic completes it at the next fold).
    Counted,
}

/// Deactivates virtual INTID `intid` as the CPU interface does for an
/// `EOIR` with `EOImode` 0 or a `DIR`: the list register holding it active
/// loses its active state, or, when none does, `ICH_HCR_EL2.EOIcount` counts
/// up (5 bits, wrapping).
pub fn deactivate(lrs: &mut impl ListRegisters, intid: u32) -> Deactivation {
    for index in 0..lrs.count() {
        let lr = ListRegister(lrs.read_lr(index));
        if lr.active() && lr.intid() == intid {
            lrs.write_lr(index, lr.deactivated().0);
            return Deactivation::Listed {
                physical: lr.pintid(),
            };
        }
    }
    let hcr = lrs.read_hcr();
    let count = ((hcr & ICH_HCR_EOICOUNT_MASK) >> ICH_HCR_EOICOUNT_SHIFT) + 1;
    lrs.write_hcr(
        (hcr & !ICH_HCR_EOICOUNT_MASK)
            | ((count << ICH_HCR_EOICOUNT_SHIFT) & ICH_HCR_EOICOUNT_MASK),
    );
    Deactivation::Counted
}

/// A host model of the virtual CPU interface's list registers.
///
/// `ELRSR` and `MISR` are computed from the list registers and `HCR` as the
/// architecture defines them; [`acknowledge`](Self::acknowledge) and
/// [`end_of_interrupt`](Self::end_of_interrupt) do what the guest's
/// `ICC_IAR1_EL1` and `ICC_EOIR1_EL1` (EOImode 0) do to the list registers
/// and the active priorities: an interrupt is signalled only if it is more
/// urgent than the running priority (whole priorities are compared, as with
/// the smallest binary point; the priority mask is left open), and an EOI
/// drops the running priority and deactivates the interrupt in its list
/// register, or counts in `EOIcount` when no list register holds it active.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelListRegisters {
    lrs: [u64; MAX_LIST_REGISTERS],
    /// The layout the values pass through on their way in and out (a GICv2
    /// model keeps exactly what a `GICH_LR` could hold).
    encoding: LrEncoding,
    count: usize,
    hcr: u64,
    /// The active priorities (`ICH_AP1R<n>_EL2`): the priority of each
    /// acknowledged interrupt not yet EOI'd, innermost (most urgent) last.
    active_priorities: [u8; MAX_ACTIVE_PRIORITIES],
    nested: usize,
    /// Physical PPIs (bit n = INTID n) that the guest's deactivation of a
    /// hardware list register deactivated, as the CPU interface forwards it
    /// to the physical GIC.
    physical_deactivations: u32,
    /// Physical SPIs deactivated the same way, in order.
    physical_spi_deactivations: alloc::vec::Vec<u32>,
}

/// Most nested acknowledgements the model tracks (one per priority value
/// with five priority bits).
const MAX_ACTIVE_PRIORITIES: usize = 32;

impl ModelListRegisters {
    /// A CPU interface with `count` list registers (1..=16), all empty.
    pub fn new(count: usize) -> Self {
        assert!(
            (1..=MAX_LIST_REGISTERS).contains(&count),
            "a GICv3 CPU interface has 1 to 16 list registers"
        );
        Self {
            lrs: [0; MAX_LIST_REGISTERS],
            encoding: LrEncoding::V3,
            count,
            hcr: 0,
            active_priorities: [0; MAX_ACTIVE_PRIORITIES],
            nested: 0,
            physical_deactivations: 0,
            physical_spi_deactivations: alloc::vec::Vec::new(),
        }
    }

    /// Takes the set of physical PPIs (bit n = INTID n) deactivated through
    /// hardware list registers since the last call.
    pub fn take_physical_deactivations(&mut self) -> u32 {
        core::mem::take(&mut self.physical_deactivations)
    }

    /// Takes the physical SPIs deactivated through hardware list registers
    /// since the last call, in order.
    pub fn take_physical_spi_deactivations(&mut self) -> alloc::vec::Vec<u32> {
        core::mem::take(&mut self.physical_spi_deactivations)
    }

    /// The same model, its list registers in `encoding`: every value
    /// written goes through the hardware layout and back, so what a layout
    /// cannot hold is lost as it would be on that hardware.
    pub fn with_encoding(mut self, encoding: LrEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// The running priority: the most urgent active priority (`None`: idle).
    pub fn running_priority(&self) -> Option<u8> {
        self.active_priorities[..self.nested].iter().copied().min()
    }

    /// The list register the CPU interface signals now: the most urgent
    /// pending (not active) one that is more urgent than the running
    /// priority. Returns its index and value.
    pub fn signalled(&self) -> Option<(usize, ListRegister)> {
        let running = self.running_priority();
        self.lrs
            .iter()
            .take(self.count)
            .map(|&v| ListRegister(v))
            .enumerate()
            .filter(|(_, lr)| lr.pending() && !lr.active())
            .filter(|(_, lr)| running.is_none_or(|r| lr.priority() < r))
            .min_by_key(|(_, lr)| (lr.priority(), lr.intid()))
    }

    /// The list registers' current values.
    pub fn list_registers(&self) -> &[u64] {
        &self.lrs[..self.count]
    }

    /// What the guest's acknowledge (`ICC_IAR1_EL1`) would return: the
    /// [signalled](Self::signalled) list register, whose state becomes active
    /// (pending and active for a still-pending edge is not modelled: the list
    /// register's pending bit is consumed) and whose priority becomes the
    /// running priority. Returns the INTID.
    pub fn acknowledge(&mut self) -> Option<u32> {
        let (index, lr) = self.signalled()?;
        if self.nested == MAX_ACTIVE_PRIORITIES {
            return None;
        }
        self.lrs[index] = (lr.0 & !LR_PENDING) | LR_ACTIVE;
        self.active_priorities[self.nested] = lr.priority();
        self.nested += 1;
        Some(lr.intid())
    }

    /// The guest's EOI (priority drop and deactivation) of `intid`. Without a
    /// list register holding it active, `ICH_HCR_EL2.EOIcount` counts up. A
    /// hardware list register's deactivation also deactivates its physical
    /// interrupt ([`take_physical_deactivations`](Self::take_physical_deactivations)).
    pub fn end_of_interrupt(&mut self, intid: u32) {
        if let Some(innermost) = self.active_priorities[..self.nested]
            .iter()
            .enumerate()
            .min_by_key(|&(_, &priority)| priority)
            .map(|(index, _)| index)
        {
            self.active_priorities
                .copy_within(innermost + 1..self.nested, innermost);
            self.nested -= 1;
        }
        if let Deactivation::Listed {
            physical: Some(pintid),
        } = deactivate(self, intid)
        {
            if pintid < 32 {
                self.physical_deactivations |= 1 << pintid;
            } else {
                self.physical_spi_deactivations.push(pintid);
            }
        }
    }
}

impl ListRegisters for ModelListRegisters {
    fn count(&self) -> usize {
        self.count
    }

    fn read_lr(&self, index: usize) -> u64 {
        assert!(index < self.count, "ICH_LR{index}_EL2 is not implemented");
        self.lrs[index]
    }

    fn write_lr(&mut self, index: usize, value: u64) {
        assert!(index < self.count, "ICH_LR{index}_EL2 is not implemented");
        let encoding = self.encoding;
        self.lrs[index] = encoding.decode(encoding.encode(ListRegister(value))).0;
    }

    fn read_hcr(&self) -> u64 {
        self.hcr
    }

    fn write_hcr(&mut self, value: u64) {
        self.hcr = value;
    }

    fn read_misr(&self) -> u64 {
        let valid = self.lrs[..self.count]
            .iter()
            .filter(|&&v| !ListRegister(v).is_empty())
            .count();
        let mut misr = 0;
        if self.lrs[..self.count].iter().any(|&v| {
            let lr = ListRegister(v);
            lr.is_empty() && lr.eoi_maintenance()
        }) {
            misr |= ICH_MISR_EOI;
        }
        if self.hcr & ICH_HCR_UIE != 0 && valid <= 1 {
            misr |= ICH_MISR_U;
        }
        if self.hcr & ICH_HCR_LRENPIE != 0 && self.hcr & ICH_HCR_EOICOUNT_MASK != 0 {
            misr |= ICH_MISR_LRENP;
        }
        misr
    }

    fn read_elrsr(&self) -> u64 {
        self.lrs[..self.count]
            .iter()
            .enumerate()
            .filter(|&(_, &v)| {
                let lr = ListRegister(v);
                lr.is_empty() && !lr.eoi_maintenance()
            })
            .fold(0, |acc, (index, _)| acc | 1 << index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ich_hcr_and_list_register_fields_sit_where_the_architecture_puts_them() {
        assert_eq!(ICH_HCR_EN, 1 << 0);
        assert_eq!(ICH_HCR_UIE, 1 << 1);
        assert_eq!(ICH_HCR_LRENPIE, 1 << 2);
        assert_eq!(ICH_HCR_EOICOUNT_SHIFT, 27);
        assert_eq!(ICH_HCR_EOICOUNT_MASK, 0xf800_0000);
        assert_eq!(LR_EOI, 1 << 41);
        assert_eq!(LR_PRIORITY_SHIFT, 48);
        assert_eq!(LR_GROUP, 1 << 60);
        assert_eq!(LR_HW, 1 << 61);
        assert_eq!(LR_STATE_SHIFT, 62);
        assert_eq!(LR_PENDING, 1 << 62);
        assert_eq!(LR_ACTIVE, 1 << 63);
    }

    #[test]
    fn list_register_encoding() {
        let lr = ListRegister::virtual_interrupt(33, 0xa0, true, true, false, true);
        assert_eq!(lr.0, 33 | 0xa0 << 48 | 1 << 60 | 1 << 62 | 1 << 41);
        assert_eq!(lr.intid(), 33);
        assert_eq!(lr.priority(), 0xa0);
        assert!(lr.group1() && lr.pending() && !lr.active() && !lr.hw());
        assert!(lr.eoi_maintenance());
        assert_eq!(lr.state(), 1);
        let both = ListRegister::virtual_interrupt(1, 0, false, true, true, false);
        assert_eq!(both.state(), 3);
        assert_eq!(both.0 >> 62, 3);
        assert!(ListRegister::EMPTY.is_empty());
    }

    #[test]
    fn gicv2_list_register_layout() {
        // SPI 33, priority 0xa0, group 1, pending, EOI maintenance.
        let lr = ListRegister::virtual_interrupt(33, 0xa0, true, true, false, true);
        assert_eq!(
            lr.to_v2(),
            33 | 1 << 19 | (0xa0 >> 3) << 23 | 1 << 28 | 1 << 30
        );
        // SGI 2 from CPU 5, active, group 0, priority 0xf8.
        let sgi =
            ListRegister::virtual_interrupt(2, 0xf8, false, false, true, false).with_source(5);
        assert_eq!(sgi.source(), 5);
        assert_eq!(sgi.to_v2(), 2 | 5 << 10 | 0x1f << 23 | 2 << 28);
        // Pending and active; the empty register.
        let both = ListRegister::virtual_interrupt(1019, 0x08, true, true, true, false);
        assert_eq!(both.to_v2(), 1019 | 1 << 23 | 3 << 28 | 1 << 30);
        assert_eq!(ListRegister::EMPTY.to_v2(), 0);
        // Decoding: HW set means bit 19 is a physical ID bit, not EOI.
        assert!(!ListRegister::from_v2(1 << 31 | 1 << 19 | 1 << 28).eoi_maintenance());
        assert_eq!(ListRegister::from_v2(0x3ff).intid(), 0x3ff);
    }

    #[test]
    fn gicv2_layout_round_trips_what_the_model_writes() {
        for intid in [0, 7, 15, 16, 27, 31, 32, 100, 1019] {
            for priority in (0..=255u8).step_by(8) {
                for bits in 0..32u8 {
                    let source = if intid < 16 { bits % 8 } else { 0 };
                    let lr = ListRegister::virtual_interrupt(
                        intid,
                        priority,
                        bits & 1 != 0,
                        bits & 2 != 0,
                        bits & 4 != 0,
                        bits & 8 != 0,
                    )
                    .with_source(source);
                    assert_eq!(ListRegister::from_v2(lr.to_v2()), lr, "{lr:x?}");
                    assert_eq!(LrEncoding::V2.decode(LrEncoding::V2.encode(lr)), lr);
                    assert_eq!(LrEncoding::V3.decode(LrEncoding::V3.encode(lr)), lr);
                }
            }
        }
    }

    #[test]
    fn hardware_list_registers_carry_the_physical_intid_in_both_layouts() {
        // The virtual timer, pending, linked to host PPI 27.
        let lr = ListRegister::virtual_interrupt(27, 0x20, true, true, false, true).hardware(27);
        assert!(
            lr.hw() && !lr.eoi_maintenance(),
            "HW replaces EOI maintenance"
        );
        assert_eq!(lr.pintid(), Some(27));
        assert_eq!(
            lr.0,
            27 | 27 << 32 | 0x20 << 48 | 1 << 60 | 1 << 61 | 1 << 62
        );
        // GICH_LR: HW bit 31, physical ID in bits [19:10].
        assert_eq!(
            lr.to_v2(),
            27 | 27 << 10 | (0x20 >> 3) << 23 | 1 << 28 | 1 << 30 | 1 << 31
        );
        for encoding in [LrEncoding::V2, LrEncoding::V3] {
            for pintid in [16, 26, 27, 30, 31] {
                for state in [(true, false), (false, true)] {
                    let lr =
                        ListRegister::virtual_interrupt(30, 0xf8, true, state.0, state.1, false)
                            .hardware(pintid);
                    assert_eq!(encoding.decode(encoding.encode(lr)), lr, "{lr:x?}");
                }
            }
        }
        assert_eq!(
            ListRegister::virtual_interrupt(27, 0, true, true, false, true).pintid(),
            None
        );
    }

    #[test]
    fn the_guests_deactivation_of_a_hardware_list_register_deactivates_the_physical_one() {
        for encoding in [LrEncoding::V2, LrEncoding::V3] {
            let mut m = ModelListRegisters::new(4).with_encoding(encoding);
            m.write_lr(
                0,
                ListRegister::virtual_interrupt(30, 0, true, true, false, false)
                    .hardware(30)
                    .0,
            );
            m.write_lr(
                1,
                ListRegister::virtual_interrupt(40, 0x10, true, true, false, true).0,
            );
            m.write_hcr(ICH_HCR_EN);
            assert_eq!(m.acknowledge(), Some(30));
            m.end_of_interrupt(30);
            assert_eq!(m.take_physical_deactivations(), 1 << 30);
            assert_eq!(m.read_misr(), 0, "no EOI maintenance for a HW interrupt");
            assert_eq!(m.read_elrsr() & 1, 1, "empty");
            assert_eq!(m.acknowledge(), Some(40));
            m.end_of_interrupt(40);
            assert_eq!(m.take_physical_deactivations(), 0);
            assert_eq!(m.read_misr(), ICH_MISR_EOI);
        }
    }

    #[test]
    fn model_derives_elrsr_and_misr() {
        let mut m = ModelListRegisters::new(4);
        assert_eq!(m.read_elrsr(), 0b1111);
        m.write_lr(
            1,
            ListRegister::virtual_interrupt(40, 0, true, true, false, true).0,
        );
        m.write_lr(
            2,
            ListRegister::virtual_interrupt(41, 0x10, true, true, false, false).0,
        );
        assert_eq!(m.read_elrsr(), 0b1001);
        m.write_hcr(ICH_HCR_EN | ICH_HCR_UIE);
        assert_eq!(m.read_misr() & ICH_MISR_U, 0);
        assert_eq!(m.acknowledge(), Some(40));
        m.end_of_interrupt(40);
        // Empty but EOI set: not in ELRSR, EOI maintenance asserted, and
        // only one valid LR left: underflow.
        assert_eq!(m.read_elrsr(), 0b1001);
        assert_eq!(m.read_misr(), ICH_MISR_EOI | ICH_MISR_U);
        m.end_of_interrupt(99);
        assert_eq!(
            m.read_hcr() & ICH_HCR_EOICOUNT_MASK,
            1 << ICH_HCR_EOICOUNT_SHIFT
        );
    }
}
