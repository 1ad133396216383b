//! Guest cache maintenance on CPUs without FEAT_S2FWB: the decisions.
//!
//! Without FWB a guest running with its stage-1 MMU or data cache off makes
//! non-cacheable accesses, which miss whatever the hypervisor (or the guest
//! itself, caches on) left in the caches. Linux KVM's answer, followed here:
//!
//! - every page mapped at stage 2 is cleaned and invalidated to the point of
//!   coherency before its leaf is published, and the instruction cache is
//!   invalidated for executable mappings (`pgtable` decides when, through its
//!   `PageTableMemory` provider; [`CacheCaps`] says what the CPU needs:
//!   `CTR_EL0.DIC` set means no I-cache invalidation, `IDC` set means no data
//!   clean to the point of unification, `L1Ip` says whether invalidation by
//!   address is enough);
//! - the guest's set/way maintenance (`DC ISW/CSW/CISW`, meaningless inside
//!   a VM: it reaches one CPU's caches only) is trapped with `HCR_EL2.TSW`
//!   and converted, as KVM's `kvm_set_way_flush` does: the first one flushes
//!   all guest memory by address to the point of coherency and starts
//!   trapping the virtual-memory control registers (`HCR_EL2.TVM`); while
//!   they are trapped, a write to `SCTLR_EL1` that turns the MMU and caches on
//!   or off flushes again (KVM's `kvm_toggle_cache`), and turning them on
//!   stops the trapping until the next set/way operation ([`SetWayTracker`]).
//!   With FWB nothing is trapped: stage 2 forces write-back and set/way
//!   operations run natively.
//!
//! Everything here is pure (register values in, decisions out) and tested on
//! the host; `arch` runs the instructions.

use crate::vocabulary::sysreg_encoding::SysRegEncoding;
use aarch64_cpu::registers::{HCR_EL2, SCTLR_EL1};
use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// `CTR_EL0`, the cache type register (the fields the hypervisor uses).
    CTR_EL0 [
        /// Instruction cache invalidation to the PoU is not required for
        /// data-to-instruction coherence.
        DIC OFFSET(29) NUMBITS(1) [],
        /// Data cache clean to the PoU is not required for data-to-instruction
        /// coherence.
        IDC OFFSET(28) NUMBITS(1) [],
        /// Log2 of the words in the smallest data cache line.
        DminLine OFFSET(16) NUMBITS(4) [],
        /// Level 1 instruction cache policy.
        L1Ip OFFSET(14) NUMBITS(2) [
            Vpipt = 0,
            Aivivt = 1,
            Vipt = 2,
            Pipt = 3
        ],
        /// Log2 of the words in the smallest instruction cache line.
        IminLine OFFSET(0) NUMBITS(4) []
    ]
}

/// What the CPU needs for guest cache maintenance, from `CTR_EL0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheCaps {
    /// `CTR_EL0.DIC`: no instruction cache invalidation needed.
    pub dic: bool,
    /// `CTR_EL0.IDC`: no data clean to the PoU needed before executing.
    pub idc: bool,
    /// Smallest data cache line, bytes.
    pub dline: usize,
    /// Smallest instruction cache line, bytes.
    pub iline: usize,
    /// The L1 instruction cache is PIPT: invalidation by address suffices
    /// (otherwise the whole instruction cache is invalidated).
    pub icache_pipt: bool,
}

impl CacheCaps {
    /// Decodes `CTR_EL0`.
    pub fn from_ctr(ctr: u64) -> Self {
        let ctr = LocalRegisterCopy::<u64, CTR_EL0::Register>::new(ctr);
        Self {
            dic: ctr.is_set(CTR_EL0::DIC),
            idc: ctr.is_set(CTR_EL0::IDC),
            dline: 4 << ctr.read(CTR_EL0::DminLine),
            iline: 4 << ctr.read(CTR_EL0::IminLine),
            icache_pipt: ctr.matches_all(CTR_EL0::L1Ip::Pipt),
        }
    }

    /// What making `[pa, pa + size)` coherent for instruction fetches takes.
    pub fn icache_plan(&self) -> IcachePlan {
        IcachePlan {
            clean_to_pou: !self.idc,
            invalidate: if self.dic {
                IcacheInval::None
            } else if self.icache_pipt {
                IcacheInval::ByAddress
            } else {
                IcacheInval::All
            },
        }
    }
}

/// The steps of an instruction cache maintenance for a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcachePlan {
    /// Clean the data cache to the PoU first (`DC CVAU`).
    pub clean_to_pou: bool,
    /// How to invalidate the instruction cache.
    pub invalidate: IcacheInval,
}

impl IcachePlan {
    /// Whether the plan does anything at all.
    pub fn is_needed(&self) -> bool {
        self.clean_to_pou || self.invalidate != IcacheInval::None
    }
}

/// Instruction cache invalidation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcacheInval {
    /// Not needed (`CTR_EL0.DIC`).
    None,
    /// `IC IVAU` over the range (PIPT instruction cache).
    ByAddress,
    /// `IC IALLUIS` (a VIPT or VIVT instruction cache may hold the lines
    /// under other virtual addresses).
    All,
}

/// `HCR_EL2` bits for cache maintenance: `TSW` (trap set/way) without FWB.
pub fn hcr_trap_bits(fwb: bool) -> u64 {
    if fwb { 0 } else { HCR_EL2::TSW::SET.value }
}

/// `HCR_EL2.TVM`: trap writes to the virtual-memory control registers.
pub fn hcr_tvm() -> u64 {
    HCR_EL2::TVM::SET.value
}

/// Whether the guest's stage 1 runs with the MMU and data cache on
/// (`SCTLR_EL1.M` and `C`), as KVM's `vcpu_has_cache_enabled`.
pub fn caches_enabled(sctlr: u64) -> bool {
    let sctlr = LocalRegisterCopy::<u64, SCTLR_EL1::Register>::new(sctlr);
    sctlr.is_set(SCTLR_EL1::M) && sctlr.is_set(SCTLR_EL1::C)
}

/// A data cache maintenance instruction by set/way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetWayOp {
    /// `DC ISW`: invalidate.
    Invalidate,
    /// `DC CSW`: clean.
    Clean,
    /// `DC CISW`: clean and invalidate.
    CleanInvalidate,
}

/// The set/way instruction `reg` encodes (`SYS` space: op0 1, op1 0, CRn 7,
/// op2 2; CRm 6, 10 or 14), if any.
pub fn set_way_op(reg: SysRegEncoding) -> Option<SetWayOp> {
    if reg.op0 != 1 || reg.op1 != 0 || reg.crn != 7 || reg.op2 != 2 {
        return None;
    }
    match reg.crm {
        6 => Some(SetWayOp::Invalidate),
        10 => Some(SetWayOp::Clean),
        14 => Some(SetWayOp::CleanInvalidate),
        _ => None,
    }
}

/// An EL1 register whose writes `HCR_EL2.TVM` traps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmReg {
    /// `SCTLR_EL1`.
    Sctlr,
    /// `TTBR0_EL1`.
    Ttbr0,
    /// `TTBR1_EL1`.
    Ttbr1,
    /// `TCR_EL1`.
    Tcr,
    /// `ESR_EL1`.
    Esr,
    /// `FAR_EL1`.
    Far,
    /// `AFSR0_EL1`.
    Afsr0,
    /// `AFSR1_EL1`.
    Afsr1,
    /// `MAIR_EL1`.
    Mair,
    /// `AMAIR_EL1`.
    Amair,
    /// `CONTEXTIDR_EL1`.
    Contextidr,
}

/// The TVM-trapped register `reg` is, if any (AArch64 encodings, `op0 3,
/// op1 0`).
pub fn vm_reg(reg: SysRegEncoding) -> Option<VmReg> {
    if reg.op0 != 3 || reg.op1 != 0 {
        return None;
    }
    Some(match (reg.crn, reg.crm, reg.op2) {
        (1, 0, 0) => VmReg::Sctlr,
        (2, 0, 0) => VmReg::Ttbr0,
        (2, 0, 1) => VmReg::Ttbr1,
        (2, 0, 2) => VmReg::Tcr,
        (5, 1, 0) => VmReg::Afsr0,
        (5, 1, 1) => VmReg::Afsr1,
        (5, 2, 0) => VmReg::Esr,
        (6, 0, 0) => VmReg::Far,
        (10, 2, 0) => VmReg::Mair,
        (10, 3, 0) => VmReg::Amair,
        (13, 0, 1) => VmReg::Contextidr,
        _ => return None,
    })
}

/// One vCPU's set/way state: whether the virtual-memory control registers
/// are trapped because a set/way operation was seen (KVM keeps this as
/// `HCR_EL2.TVM` in the vCPU's HCR).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetWayTracker {
    tvm: bool,
}

impl SetWayTracker {
    /// No set/way operation seen: nothing trapped.
    pub const fn new() -> Self {
        Self { tvm: false }
    }

    /// Whether `HCR_EL2.TVM` must be set now.
    pub const fn traps_vm_regs(&self) -> bool {
        self.tvm
    }

    /// A trapped set/way operation (KVM's `kvm_set_way_flush`): the first
    /// one (TVM not yet set) flushes the VM and starts trapping; later ones
    /// rely on the trap to catch the caches being turned off or on.
    /// Returns whether to flush the VM now.
    pub fn on_set_way(&mut self) -> bool {
        !core::mem::replace(&mut self.tvm, true)
    }

    /// A trapped `SCTLR_EL1` write from `old` to `new` (KVM's
    /// `kvm_toggle_cache`): the MMU and caches turning on (the caches may hold
    /// stale lines) or off (they may hold dirty ones) flushes the VM; once on,
    /// trapping stops until the next set/way operation. Returns whether to
    /// flush the VM now.
    pub fn on_sctlr_write(&mut self, old: u64, new: u64) -> bool {
        let (was, now) = (caches_enabled(old), caches_enabled(new));
        if now {
            self.tvm = false;
        }
        was != now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn enc(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> SysRegEncoding {
        SysRegEncoding {
            op0,
            op1,
            crn,
            crm,
            op2,
        }
    }

    #[test]
    fn ctr_of_cortex_a72_and_max() {
        // QEMU's cortex-a72: 64-byte lines, PIPT I-cache, no DIC/IDC.
        let a72 = CacheCaps::from_ctr(0x8444_c004);
        assert_eq!(
            a72,
            CacheCaps {
                dic: false,
                idc: false,
                dline: 64,
                iline: 64,
                icache_pipt: true,
            }
        );
        assert_eq!(
            a72.icache_plan(),
            IcachePlan {
                clean_to_pou: true,
                invalidate: IcacheInval::ByAddress,
            }
        );
        // DIC and IDC set: nothing to do.
        let coherent = CacheCaps::from_ctr(0x8444_c004 | (1 << 29) | (1 << 28));
        assert!(!coherent.icache_plan().is_needed());
        // IDC only: invalidation still needed, no clean to PoU.
        let idc = CacheCaps::from_ctr(0x8444_c004 | (1 << 28));
        assert_eq!(
            idc.icache_plan(),
            IcachePlan {
                clean_to_pou: false,
                invalidate: IcacheInval::ByAddress,
            }
        );
        // A VIPT I-cache (L1Ip 0b10) is invalidated whole.
        let vipt = CacheCaps::from_ctr(0x8444_8004);
        assert!(!vipt.icache_pipt);
        assert_eq!(vipt.icache_plan().invalidate, IcacheInval::All);
    }

    #[test]
    fn hcr_bits() {
        assert_eq!(hcr_trap_bits(false), 1 << 22);
        assert_eq!(hcr_trap_bits(true), 0);
        assert_eq!(hcr_tvm(), 1 << 26);
    }

    #[test]
    fn set_way_encodings() {
        assert_eq!(set_way_op(enc(1, 0, 7, 6, 2)), Some(SetWayOp::Invalidate));
        assert_eq!(set_way_op(enc(1, 0, 7, 10, 2)), Some(SetWayOp::Clean));
        assert_eq!(
            set_way_op(enc(1, 0, 7, 14, 2)),
            Some(SetWayOp::CleanInvalidate)
        );
        // DC IVAC (CRm 6, op2 1) and DC CVAC (CRm 10, op2 1) are by address.
        assert_eq!(set_way_op(enc(1, 0, 7, 6, 1)), None);
        assert_eq!(set_way_op(enc(1, 0, 7, 10, 1)), None);
        assert_eq!(set_way_op(enc(3, 0, 7, 14, 2)), None);
    }

    #[test]
    fn vm_register_encodings() {
        assert_eq!(vm_reg(enc(3, 0, 1, 0, 0)), Some(VmReg::Sctlr));
        assert_eq!(vm_reg(enc(3, 0, 2, 0, 2)), Some(VmReg::Tcr));
        assert_eq!(vm_reg(enc(3, 0, 10, 2, 0)), Some(VmReg::Mair));
        assert_eq!(vm_reg(enc(3, 0, 13, 0, 1)), Some(VmReg::Contextidr));
        // ACTLR_EL1 (CRn 1, op2 1) and SCTLR_EL12 (op1 5) are not.
        assert_eq!(vm_reg(enc(3, 0, 1, 0, 1)), None);
        assert_eq!(vm_reg(enc(3, 5, 1, 0, 0)), None);
    }

    const MMU_OFF: u64 = 0x30d0_0800;
    const MMU_ON: u64 = MMU_OFF | 0b101;

    #[test]
    fn caches_enabled_needs_m_and_c() {
        assert!(!caches_enabled(MMU_OFF));
        assert!(!caches_enabled(MMU_OFF | 1));
        assert!(!caches_enabled(MMU_OFF | 4));
        assert!(caches_enabled(MMU_ON));
    }

    #[test]
    fn set_way_flushes_once_then_waits_for_a_toggle() {
        let mut t = SetWayTracker::new();
        assert!(!t.traps_vm_regs());
        // Caches off (firmware-like code): the first op flushes and traps.
        assert!(t.on_set_way());
        assert!(t.traps_vm_regs());
        // Further ops: no flush, the trap waits for the toggle.
        assert!(!t.on_set_way());
        assert!(!t.on_set_way());
        // A write that changes nothing relevant: no flush, still trapping.
        assert!(!t.on_sctlr_write(MMU_OFF, MMU_OFF | (1 << 12)));
        assert!(t.traps_vm_regs());
        // Caches on: flush, and stop trapping.
        assert!(t.on_sctlr_write(MMU_OFF, MMU_ON));
        assert!(!t.traps_vm_regs());
        // The next set/way op flushes again.
        assert!(t.on_set_way());
        // Caches off while trapping: flush, keep trapping.
        assert!(t.on_sctlr_write(MMU_ON, MMU_OFF));
        assert!(t.traps_vm_regs());
    }
}
