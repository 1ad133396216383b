//! Building the synchronous exception the hypervisor injects into a guest.
//!
//! The guest's kernel runs in AArch64 EL1 (`HCR_EL2.RW`); what it runs below
//! it may be AArch64 EL0 or AArch32 EL0 (a 32-bit process). Whatever the
//! guest was doing, the injected exception must look exactly as if the
//! guest's own hardware had taken it to AArch64 EL1h, as Linux KVM's
//! `inject_fault.c` does it:
//!
//! * **Kinds.** A synchronous external abort when a guest touches an address
//!   outside every memslot and device (data: EC 0x24 from a lower EL, 0x25
//!   from EL1, `WnR` as the access; instruction: EC 0x20 / 0x21; fault status
//!   0x10), or an undefined instruction (EC 0x00, unknown reason, ISS 0) for a
//!   trapped instruction the hypervisor does not emulate.
//! * **`ESR_EL1.IL`** is the trapped instruction's length (`ESR_EL2.IL`): 0 for
//!   a 16-bit T32 instruction of an AArch32 EL0.
//! * **`FAR_EL1`** is the faulting virtual address for aborts (only its low 32
//!   bits from AArch32), left alone for an undefined instruction (UNKNOWN).
//! * **`ELR_EL1`** is the PC of the instruction that trapped and **`SPSR_EL1`**
//!   the PSTATE it ran with, unchanged (an AArch32 CPSR, `M[4]` = 1, for a
//!   32-bit process).
//! * **The vector** is `VBAR_EL1` plus the offset of where the exception came
//!   from: 0x000 EL1t (current EL, SP0), 0x200 EL1h (current EL, SPx), 0x400
//!   lower EL in AArch64 (EL0t), 0x600 lower EL in AArch32 (usr); +0 for a
//!   synchronous exception.
//! * **The new PSTATE** is what the architecture gives an exception entry to
//!   EL1h: `M` = EL1h, AArch64; D, A, I, F masked; N, Z, C, V and DIT kept
//!   (DIT is bit 21 of an AArch32 CPSR, bit 24 of an AArch64 PSTATE); PAN kept,
//!   or set when `SCTLR_EL1.SPAN` is 0; SSBS set to `SCTLR_EL1.DSSBS`; TCO
//!   set for a guest with memory tagging (`mte=on`: every exception entry
//!   sets it, so a handler starts with tag checks off), clear otherwise as
//!   KVM leaves it without MTE; SS, IL, UAO and BTYPE zero.
//!
//! Everything here is arithmetic on values: [`compute`] takes the guest state
//! read at the exit and returns the register values that deliver the
//! exception; the vCPU (`runtime::vcpu::injection`) only has the registers read and
//! written.

use crate::exit::esr::ESR_IL;
use tock_registers::register_bitfields;

/// Which exception to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectKind {
    /// A synchronous external data abort; `write` sets `WnR`.
    DataAbort {
        /// The access was a write.
        write: bool,
    },
    /// A synchronous external instruction abort.
    InstructionAbort,
    /// An undefined instruction (EC 0x00, unknown reason).
    Undefined,
}

/// Where the guest was when it trapped, decoded from its PSTATE (`M[4:0]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestMode {
    /// AArch64 EL0 (`EL0t`).
    El0Aarch64,
    /// AArch32 EL0 (User mode).
    El0Aarch32,
    /// AArch64 EL1 on `SP_EL0` (`EL1t`).
    El1t,
    /// AArch64 EL1 on `SP_EL1` (`EL1h`).
    El1h,
}

register_bitfields! {u64,
    /// PSTATE / SPSR fields `aarch64-cpu`'s `SPSR_EL2` does not name.
    PSTATE_EXTRA [
        /// `M[4]` (`nRW`): the state was AArch32.
        NRW OFFSET(4) NUMBITS(1) [],
        /// `SSBS` in an AArch64 PSTATE.
        SSBS OFFSET(12) NUMBITS(1) [],
        /// `DIT` in an AArch32 CPSR.
        AARCH32_DIT OFFSET(21) NUMBITS(1) [],
        /// `PAN` (the same bit in AArch32 and AArch64).
        PAN OFFSET(22) NUMBITS(1) [],
        /// `DIT` in an AArch64 PSTATE.
        DIT OFFSET(24) NUMBITS(1) [],
        /// `TCO` (FEAT_MTE): tag checks are off.
        TCO OFFSET(25) NUMBITS(1) [],
    ],
    /// `SCTLR_EL1` fields the entry to EL1 depends on (not named by `aarch64-cpu`).
    SCTLR_EL1_ENTRY [
        /// `SPAN`: 0 sets PSTATE.PAN on an exception to EL1 (RES1 without PAN).
        SPAN OFFSET(23) NUMBITS(1) [],
        /// `DSSBS`: the value of PSTATE.SSBS on an exception to EL1.
        DSSBS OFFSET(44) NUMBITS(1) [],
    ]
}

/// PSTATE / SPSR fields, in their AArch64 positions unless named `AARCH32_`,
/// from `aarch64-cpu`'s `SPSR_EL2` and the local `PSTATE_EXTRA`.
pub mod spsr {
    use super::PSTATE_EXTRA;
    use aarch64_cpu::registers::SPSR_EL2;

    /// `M[3:0]` together with `M[4]` (`nRW`): the mode field.
    pub const MODE_MASK: u64 = SPSR_EL2::M.mask | NRW;
    /// `M[4]` (`nRW`): the state was AArch32.
    pub const NRW: u64 = PSTATE_EXTRA::NRW::SET.value;
    /// AArch64 `M[3:0]` of EL0t.
    pub const MODE_EL0T: u64 = SPSR_EL2::M::EL0t.value;
    /// AArch64 `M[3:0]` of EL1t.
    pub const MODE_EL1T: u64 = SPSR_EL2::M::EL1t.value;
    /// AArch64 `M[3:0]` of EL1h.
    pub const MODE_EL1H: u64 = SPSR_EL2::M::EL1h.value;
    /// AArch32 `M[4:0]` of User mode (EL0): `nRW` with `M[3:0]` = 0.
    pub const AARCH32_MODE_USR: u64 = NRW;
    /// `F`: FIQ masked.
    pub const F: u64 = SPSR_EL2::F::Masked.value;
    /// `I`: IRQ masked.
    pub const I: u64 = SPSR_EL2::I::Masked.value;
    /// `A`: SError masked.
    pub const A: u64 = SPSR_EL2::A::Masked.value;
    /// `D`: debug exceptions masked (AArch64 only).
    pub const D: u64 = SPSR_EL2::D::Masked.value;
    /// `SSBS` in an AArch64 PSTATE.
    pub const SSBS: u64 = PSTATE_EXTRA::SSBS::SET.value;
    /// `PAN` (the same bit in AArch32 and AArch64).
    pub const PAN: u64 = PSTATE_EXTRA::PAN::SET.value;
    /// `DIT` in an AArch32 CPSR.
    pub const AARCH32_DIT: u64 = PSTATE_EXTRA::AARCH32_DIT::SET.value;
    /// `DIT` in an AArch64 PSTATE.
    pub const DIT: u64 = PSTATE_EXTRA::DIT::SET.value;
    /// `TCO` (AArch64).
    pub const TCO: u64 = PSTATE_EXTRA::TCO::SET.value;
    /// `N`, `Z`, `C`, `V` (the same bits in AArch32 and AArch64).
    pub const NZCV: u64 = SPSR_EL2::N::SET.value
        | SPSR_EL2::Z::SET.value
        | SPSR_EL2::C::SET.value
        | SPSR_EL2::V::SET.value;
}

/// `SCTLR_EL1` fields the entry to EL1 depends on.
pub mod sctlr {
    use super::SCTLR_EL1_ENTRY;

    /// `SPAN`: 0 sets PSTATE.PAN on an exception to EL1 (RES1 without PAN).
    pub const SPAN: u64 = SCTLR_EL1_ENTRY::SPAN::SET.value;
    /// `DSSBS`: the value of PSTATE.SSBS on an exception to EL1.
    pub const DSSBS: u64 = SCTLR_EL1_ENTRY::DSSBS::SET.value;
}

/// `ESR_ELx` fields of the injected syndromes.
pub mod esr {
    /// Shift of the exception class `EC` \[31:26\].
    pub const EC_SHIFT: u32 = 26;
    /// EC 0x00: unknown reason (an undefined instruction).
    pub const EC_UNKNOWN: u64 = 0x00;
    /// EC 0x20: instruction abort from a lower exception level.
    pub const EC_IABT_LOWER: u64 = 0x20;
    /// EC 0x21: instruction abort without a change of exception level.
    pub const EC_IABT_CURRENT: u64 = 0x21;
    /// EC 0x24: data abort from a lower exception level.
    pub const EC_DABT_LOWER: u64 = 0x24;
    /// EC 0x25: data abort without a change of exception level.
    pub const EC_DABT_CURRENT: u64 = 0x25;
    /// `WnR` of a data abort: the access was a write.
    pub const WNR: u64 = 1 << 6;
    /// `DFSC`/`IFSC` of a synchronous external abort, not on a table walk.
    pub const FSC_SYNC_EXTERNAL: u64 = 0x10;
}

/// Vector offsets from `VBAR_EL1` by where the exception came from
/// (synchronous exceptions are at +0 of each group).
pub mod vector {
    /// Current EL with `SP_EL0`.
    pub const CURRENT_SP0: u64 = 0x000;
    /// Current EL with `SP_ELx`.
    pub const CURRENT_SPX: u64 = 0x200;
    /// Lower EL using AArch64.
    pub const LOWER_AARCH64: u64 = 0x400;
    /// Lower EL using AArch32.
    pub const LOWER_AARCH32: u64 = 0x600;
}

/// PSTATE of an exception taken to EL1h with nothing carried over: D, A, I, F
/// masked, M = EL1h.
pub const PSTATE_EL1H_MASKED: u64 = spsr::D | spsr::A | spsr::I | spsr::F | spsr::MODE_EL1H;

/// The guest state when it trapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestState {
    /// The guest's PSTATE (`SPSR_EL2` at the exit).
    pub pstate: u64,
    /// The PC of the instruction that trapped (`ELR_EL2`).
    pub pc: u64,
    /// The faulting virtual address (`FAR_EL2`; only meaningful for aborts).
    pub far: u64,
    /// The syndrome of the exit (`ESR_EL2`): its `IL` becomes `ESR_EL1.IL`.
    pub trap_esr: u64,
    /// The guest's `VBAR_EL1`.
    pub vbar: u64,
    /// The guest's `SCTLR_EL1`.
    pub sctlr: u64,
    /// The guest may use memory tagging (its VM has `mte=on`).
    pub mte: bool,
}

/// The register values that deliver the exception.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedException {
    /// New `ESR_EL1`.
    pub esr: u64,
    /// New `FAR_EL1`, or `None` to leave it (UNKNOWN for EC 0x00).
    pub far: Option<u64>,
    /// New `ELR_EL1`.
    pub elr: u64,
    /// New `SPSR_EL1`.
    pub spsr: u64,
    /// Where the guest resumes.
    pub pc: u64,
    /// The guest's PSTATE when it resumes.
    pub pstate: u64,
}

/// The guest's PSTATE names no state an EL1 guest can trap from (an EL2/EL3
/// mode, or an AArch32 mode other than User while EL1 is AArch64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsupportedGuestMode(pub u64);

impl core::fmt::Display for UnsupportedGuestMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "PSTATE {:#x} is no EL0/EL1 state an AArch64 EL1 guest runs in",
            self.0
        )
    }
}

impl core::error::Error for UnsupportedGuestMode {}

impl GuestMode {
    /// Decodes `M[4:0]` of `pstate`.
    pub fn from_pstate(pstate: u64) -> Result<Self, UnsupportedGuestMode> {
        match pstate & spsr::MODE_MASK {
            spsr::MODE_EL0T => Ok(Self::El0Aarch64),
            spsr::MODE_EL1T => Ok(Self::El1t),
            spsr::MODE_EL1H => Ok(Self::El1h),
            spsr::AARCH32_MODE_USR => Ok(Self::El0Aarch32),
            _ => Err(UnsupportedGuestMode(pstate)),
        }
    }

    /// The exception came from EL0 (a lower EL than the EL1 it is taken to).
    pub fn is_el0(self) -> bool {
        matches!(self, Self::El0Aarch64 | Self::El0Aarch32)
    }

    /// The guest ran in AArch32.
    pub fn is_aarch32(self) -> bool {
        self == Self::El0Aarch32
    }

    /// The offset of this origin's vector group from `VBAR_EL1`.
    pub fn vector_offset(self) -> u64 {
        match self {
            Self::El1t => vector::CURRENT_SP0,
            Self::El1h => vector::CURRENT_SPX,
            Self::El0Aarch64 => vector::LOWER_AARCH64,
            Self::El0Aarch32 => vector::LOWER_AARCH32,
        }
    }
}

/// `ESR_EL1` of `kind` taken from `mode`, with `IL` from the exit's syndrome.
pub fn syndrome(kind: InjectKind, mode: GuestMode, trap_esr: u64) -> u64 {
    let lower = mode.is_el0();
    let (ec, iss) = match kind {
        InjectKind::DataAbort { write } => (
            if lower {
                esr::EC_DABT_LOWER
            } else {
                esr::EC_DABT_CURRENT
            },
            esr::FSC_SYNC_EXTERNAL | if write { esr::WNR } else { 0 },
        ),
        InjectKind::InstructionAbort => (
            if lower {
                esr::EC_IABT_LOWER
            } else {
                esr::EC_IABT_CURRENT
            },
            esr::FSC_SYNC_EXTERNAL,
        ),
        InjectKind::Undefined => (esr::EC_UNKNOWN, 0),
    };
    (ec << esr::EC_SHIFT) | (trap_esr & ESR_IL) | iss
}

/// PSTATE on entry to EL1h from a guest whose PSTATE was `old` (in `mode`),
/// with `SCTLR_EL1` = `sctlr`.
pub fn entry_pstate(old: u64, mode: GuestMode, sctlr: u64) -> u64 {
    let mut new = PSTATE_EL1H_MASKED | (old & spsr::NZCV);
    let dit = if mode.is_aarch32() {
        spsr::AARCH32_DIT
    } else {
        spsr::DIT
    };
    if old & dit != 0 {
        new |= spsr::DIT;
    }
    if old & spsr::PAN != 0 || sctlr & sctlr::SPAN == 0 {
        new |= spsr::PAN;
    }
    if sctlr & sctlr::DSSBS != 0 {
        new |= spsr::SSBS;
    }
    new
}

/// Computes the injection of `kind` into a guest in `state`.
pub fn compute(
    kind: InjectKind,
    state: GuestState,
) -> Result<InjectedException, UnsupportedGuestMode> {
    let mode = GuestMode::from_pstate(state.pstate)?;
    let far = match kind {
        InjectKind::Undefined => None,
        InjectKind::DataAbort { .. } | InjectKind::InstructionAbort if mode.is_aarch32() => {
            Some(state.far & u64::from(u32::MAX))
        }
        InjectKind::DataAbort { .. } | InjectKind::InstructionAbort => Some(state.far),
    };
    Ok(InjectedException {
        esr: syndrome(kind, mode, state.trap_esr),
        far,
        elr: state.pc,
        spsr: state.pstate,
        pc: state.vbar + mode.vector_offset(),
        pstate: entry_pstate(state.pstate, mode, state.sctlr)
            | if state.mte { spsr::TCO } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pstate_and_sctlr_fields_sit_where_the_architecture_puts_them() {
        assert_eq!(PSTATE_EL1H_MASKED, 0x3c5);
        assert_eq!(spsr::MODE_MASK, 0x1f);
        assert_eq!(spsr::NRW, 1 << 4);
        assert_eq!(
            (spsr::MODE_EL0T, spsr::MODE_EL1T, spsr::MODE_EL1H),
            (0b0000, 0b0100, 0b0101)
        );
        assert_eq!(spsr::AARCH32_MODE_USR, 0b1_0000);
        assert_eq!(
            (spsr::F, spsr::I, spsr::A, spsr::D),
            (1 << 6, 1 << 7, 1 << 8, 1 << 9)
        );
        assert_eq!(spsr::SSBS, 1 << 12);
        assert_eq!(spsr::AARCH32_DIT, 1 << 21);
        assert_eq!(spsr::PAN, 1 << 22);
        assert_eq!(spsr::DIT, 1 << 24);
        assert_eq!(spsr::TCO, 1 << 25);
        assert_eq!(spsr::NZCV, 0xf000_0000);
        assert_eq!((sctlr::SPAN, sctlr::DSSBS), (1 << 23, 1 << 44));
    }

    const VBAR: u64 = 0x4008_0800;
    /// `SCTLR_EL1` of a guest with SPAN set and DSSBS clear.
    const SCTLR_SPAN: u64 = 0x30d0_0800 | sctlr::SPAN;
    const DABT_TRAP_32: u64 = (0x24 << 26) | ESR_IL | 0x4;
    const DABT_TRAP_16: u64 = (0x24 << 26) | 0x4;

    fn state(pstate: u64, trap_esr: u64) -> GuestState {
        GuestState {
            pstate,
            pc: 0x1_2345_6788,
            far: 0xffff_0000_dead_b000,
            trap_esr,
            vbar: VBAR,
            sctlr: SCTLR_SPAN,
            mte: false,
        }
    }

    /// One row: guest PSTATE, kind, the exit's syndrome; expected `ESR_EL1`,
    /// vector offset and `FAR_EL1`.
    struct Row {
        pstate: u64,
        kind: InjectKind,
        trap_esr: u64,
        esr: u64,
        vector: u64,
        far: Option<u64>,
    }

    #[test]
    fn table_of_sources_and_kinds() {
        let far64 = Some(0xffff_0000_dead_b000);
        let far32 = Some(0xdead_b000);
        let read = InjectKind::DataAbort { write: false };
        let write = InjectKind::DataAbort { write: true };
        let iabt = InjectKind::InstructionAbort;
        let undef = InjectKind::Undefined;
        let iabt_trap = (0x20 << 26) | ESR_IL | 0x4;
        let sys_trap = (0x18 << 26) | ESR_IL | 0x1234;
        let cp15_trap_16 = 0x03 << 26;
        #[rustfmt::skip]
        let rows = [
            // AArch64 EL1h (SPx): current EL.
            Row { pstate: 0x3c5, kind: write, trap_esr: DABT_TRAP_32, esr: 0x9600_0050, vector: 0x200, far: far64 },
            Row { pstate: 0x005, kind: read, trap_esr: DABT_TRAP_32, esr: 0x9600_0010, vector: 0x200, far: far64 },
            Row { pstate: 0x3c5, kind: iabt, trap_esr: iabt_trap, esr: 0x8600_0010, vector: 0x200, far: far64 },
            Row { pstate: 0x3c5, kind: undef, trap_esr: sys_trap, esr: 0x0200_0000, vector: 0x200, far: None },
            // AArch64 EL1t (SP0): current EL, SP0 group.
            Row { pstate: 0x3c4, kind: read, trap_esr: DABT_TRAP_32, esr: 0x9600_0010, vector: 0x000, far: far64 },
            Row { pstate: 0x004, kind: iabt, trap_esr: iabt_trap, esr: 0x8600_0010, vector: 0x000, far: far64 },
            Row { pstate: 0x3c4, kind: undef, trap_esr: sys_trap, esr: 0x0200_0000, vector: 0x000, far: None },
            // AArch64 EL0t: lower EL, AArch64.
            Row { pstate: 0x000, kind: read, trap_esr: DABT_TRAP_32, esr: 0x9200_0010, vector: 0x400, far: far64 },
            Row { pstate: 0x3c0, kind: write, trap_esr: DABT_TRAP_32, esr: 0x9200_0050, vector: 0x400, far: far64 },
            Row { pstate: 0x000, kind: iabt, trap_esr: iabt_trap, esr: 0x8200_0010, vector: 0x400, far: far64 },
            Row { pstate: 0x000, kind: undef, trap_esr: sys_trap, esr: 0x0200_0000, vector: 0x400, far: None },
            // AArch32 EL0 (usr): lower EL, AArch32; FAR is the 32-bit address.
            Row { pstate: 0x1d0, kind: read, trap_esr: DABT_TRAP_32, esr: 0x9200_0010, vector: 0x600, far: far32 },
            Row { pstate: 0x010, kind: write, trap_esr: DABT_TRAP_32, esr: 0x9200_0050, vector: 0x600, far: far32 },
            Row { pstate: 0x1d0, kind: iabt, trap_esr: iabt_trap, esr: 0x8200_0010, vector: 0x600, far: far32 },
            Row { pstate: 0x010, kind: undef, trap_esr: (0x03 << 26) | ESR_IL, esr: 0x0200_0000, vector: 0x600, far: None },
            // A 16-bit T32 instruction (T = bit 5): IL clear.
            Row { pstate: 0x030, kind: read, trap_esr: DABT_TRAP_16, esr: 0x9000_0010, vector: 0x600, far: far32 },
            Row { pstate: 0x030, kind: undef, trap_esr: cp15_trap_16, esr: 0x0000_0000, vector: 0x600, far: None },
        ];
        for (i, row) in rows.iter().enumerate() {
            let e = compute(row.kind, state(row.pstate, row.trap_esr))
                .unwrap_or_else(|e| panic!("row {i}: {e:?}"));
            assert_eq!(e.esr, row.esr, "row {i}: ESR {:#x}", e.esr);
            assert_eq!(e.pc, VBAR + row.vector, "row {i}: vector");
            assert_eq!(e.far, row.far, "row {i}: FAR");
            assert_eq!(e.elr, 0x1_2345_6788, "row {i}: ELR is the trapping PC");
            assert_eq!(e.spsr, row.pstate, "row {i}: SPSR is the old PSTATE");
            assert_eq!(e.pstate, PSTATE_EL1H_MASKED, "row {i}: PSTATE");
        }
    }

    #[test]
    fn bug_report_state_is_injectable() {
        // `cannot inject an abort into guest mode 0x1d0`: AArch32 usr, A/I/F masked.
        let e = compute(
            InjectKind::DataAbort { write: false },
            state(0x1d0, DABT_TRAP_32),
        )
        .expect("AArch32 EL0");
        assert_eq!(e.pc, VBAR + vector::LOWER_AARCH32);
        assert_eq!(e.esr >> esr::EC_SHIFT, esr::EC_DABT_LOWER);
        assert_eq!(e.spsr, 0x1d0);
    }

    #[test]
    fn modes_an_el1_guest_cannot_trap_from_are_refused() {
        // EL2t, EL2h, EL3h, and AArch32 fiq, irq, svc, abt, hyp, und, sys.
        for mode in [0x8, 0x9, 0xd, 0x11, 0x12, 0x13, 0x17, 0x1a, 0x1b, 0x1f] {
            assert_eq!(
                compute(InjectKind::Undefined, state(mode, 0)),
                Err(UnsupportedGuestMode(mode)),
                "mode {mode:#x}"
            );
        }
    }

    #[test]
    fn entry_pstate_fields() {
        let span_clear = SCTLR_SPAN & !sctlr::SPAN;
        // NZCV kept, everything else from a bare entry.
        assert_eq!(
            entry_pstate(0xf000_0000, GuestMode::El0Aarch64, SCTLR_SPAN),
            0xf000_0000 | PSTATE_EL1H_MASKED
        );
        // PAN set by SPAN = 0, kept by SPAN = 1.
        assert_eq!(
            entry_pstate(0, GuestMode::El1h, span_clear),
            PSTATE_EL1H_MASKED | spsr::PAN
        );
        assert_eq!(
            entry_pstate(spsr::PAN, GuestMode::El0Aarch32, SCTLR_SPAN),
            PSTATE_EL1H_MASKED | spsr::PAN
        );
        assert_eq!(
            entry_pstate(0, GuestMode::El0Aarch32, SCTLR_SPAN),
            PSTATE_EL1H_MASKED
        );
        // DIT moves from bit 21 of a CPSR to bit 24; bit 21 of AArch64 (SS) is dropped.
        assert_eq!(
            entry_pstate(spsr::AARCH32_DIT, GuestMode::El0Aarch32, SCTLR_SPAN),
            PSTATE_EL1H_MASKED | spsr::DIT
        );
        assert_eq!(
            entry_pstate(spsr::AARCH32_DIT, GuestMode::El1h, SCTLR_SPAN),
            PSTATE_EL1H_MASKED
        );
        assert_eq!(
            entry_pstate(spsr::DIT, GuestMode::El0Aarch64, SCTLR_SPAN),
            PSTATE_EL1H_MASKED | spsr::DIT
        );
        // SSBS comes from DSSBS, not from the old state.
        assert_eq!(
            entry_pstate(spsr::SSBS, GuestMode::El0Aarch64, SCTLR_SPAN),
            PSTATE_EL1H_MASKED
        );
        assert_eq!(
            entry_pstate(0, GuestMode::El1t, SCTLR_SPAN | sctlr::DSSBS),
            PSTATE_EL1H_MASKED | spsr::SSBS
        );
    }

    fn legal_mode() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(spsr::MODE_EL0T),
            Just(spsr::MODE_EL1T),
            Just(spsr::MODE_EL1H),
            Just(spsr::AARCH32_MODE_USR)
        ]
    }

    fn kind() -> impl Strategy<Value = InjectKind> {
        prop_oneof![
            any::<bool>().prop_map(|write| InjectKind::DataAbort { write }),
            Just(InjectKind::InstructionAbort),
            Just(InjectKind::Undefined)
        ]
    }

    proptest! {
        /// Whatever the rest of PSTATE holds, every legal origin is injectable
        /// and the result obeys the entry rules: EL1h AArch64 with DAIF
        /// masked, only NZCV/DIT/PAN/SSBS possibly set, TCO set exactly
        /// for a guest with memory tagging, the old PSTATE and PC saved,
        /// the vector of the origin, IL from the exit, EC by kind and level.
        #[test]
        fn entry_rules_hold(
            mode in legal_mode(),
            rest in any::<u64>(),
            kind in kind(),
            pc in any::<u32>(),
            far in any::<u64>(),
            trap_esr in any::<u64>(),
            vbar_page in 0u64..(1 << 36),
            sctlr in any::<u64>(),
            mte in any::<bool>(),
        ) {
            let pstate = (rest & !spsr::MODE_MASK) | mode;
            let vbar = vbar_page << 11;
            let st = GuestState { pstate, pc: u64::from(pc), far, trap_esr, vbar, sctlr, mte };
            let e = compute(kind, st).expect("legal mode");
            let origin = GuestMode::from_pstate(pstate).expect("legal mode");
            prop_assert_eq!(e.pstate & spsr::MODE_MASK, spsr::MODE_EL1H);
            prop_assert_eq!(e.pstate & PSTATE_EL1H_MASKED, PSTATE_EL1H_MASKED);
            let allowed =
                PSTATE_EL1H_MASKED | spsr::NZCV | spsr::DIT | spsr::PAN | spsr::SSBS | spsr::TCO;
            prop_assert_eq!(e.pstate & !allowed, 0);
            prop_assert_eq!(e.pstate & spsr::TCO != 0, mte);
            prop_assert_eq!(e.pstate & spsr::NZCV, pstate & spsr::NZCV);
            prop_assert_eq!(e.pstate & spsr::SSBS != 0, sctlr & sctlr::DSSBS != 0);
            prop_assert_eq!(
                e.pstate & spsr::PAN != 0,
                pstate & spsr::PAN != 0 || sctlr & sctlr::SPAN == 0
            );
            prop_assert_eq!(e.spsr, pstate);
            prop_assert_eq!(e.elr, u64::from(pc));
            prop_assert_eq!(e.pc, vbar + origin.vector_offset());
            prop_assert_eq!(e.esr & ESR_IL, trap_esr & ESR_IL);
            let ec = e.esr >> esr::EC_SHIFT;
            let lower = mode == spsr::MODE_EL0T || mode == spsr::AARCH32_MODE_USR;
            match kind {
                InjectKind::DataAbort { write } => {
                    prop_assert_eq!(ec, if lower { 0x24 } else { 0x25 });
                    prop_assert_eq!(e.esr & 0x3f, esr::FSC_SYNC_EXTERNAL);
                    prop_assert_eq!(e.esr & esr::WNR != 0, write);
                }
                InjectKind::InstructionAbort => {
                    prop_assert_eq!(ec, if lower { 0x20 } else { 0x21 });
                    prop_assert_eq!(e.esr & 0x3f, esr::FSC_SYNC_EXTERNAL);
                }
                InjectKind::Undefined => {
                    prop_assert_eq!(e.esr & !ESR_IL, 0);
                    prop_assert_eq!(e.far, None);
                }
            }
            if kind != InjectKind::Undefined {
                let expected = if mode == spsr::AARCH32_MODE_USR { far & 0xffff_ffff } else { far };
                prop_assert_eq!(e.far, Some(expected));
            }
        }
    }
}
