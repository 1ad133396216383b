//! Building the exception the hypervisor injects into a guest.
//!
//! When a guest touches an address outside every memslot and device, the
//! hypervisor makes the guest take a synchronous external abort as if its own
//! memory system had reported it: `ESR_EL1` gets EC 0x24/0x25 (data) or
//! 0x20/0x21 (instruction) with fault status 0x10, `FAR_EL1` the faulting
//! virtual address, `ELR_EL1`/`SPSR_EL1` the interrupted PC and PSTATE, and the
//! guest resumes at the `VBAR_EL1` vector for its origin (current EL with SP0
//! 0x000, current EL with SPx 0x200, lower EL AArch64 0x400) in EL1h with all
//! of DAIF masked.

use crate::esr::ESR_IL;

/// Which abort to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortKind {
    /// A data abort; `write` sets `WnR`.
    Data {
        /// The access was a write.
        write: bool,
    },
    /// An instruction abort.
    Instruction,
}

/// The guest state before the abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestState {
    /// The guest's PSTATE (`SPSR_EL2` at the exit).
    pub pstate: u64,
    /// The PC of the faulting instruction (`ELR_EL2`).
    pub pc: u64,
    /// The faulting virtual address (`FAR_EL2`).
    pub far: u64,
    /// The guest's `VBAR_EL1`.
    pub vbar: u64,
}

/// The register values that deliver the abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedException {
    /// New `ESR_EL1`.
    pub esr: u64,
    /// New `FAR_EL1`.
    pub far: u64,
    /// New `ELR_EL1`.
    pub elr: u64,
    /// New `SPSR_EL1`.
    pub spsr: u64,
    /// Where the guest resumes.
    pub pc: u64,
    /// The guest's PSTATE when it resumes.
    pub pstate: u64,
}

/// The guest was not in an AArch64 EL0/EL1 state an abort can be delivered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsupportedGuestMode(pub u64);

/// PSTATE of an exception taken to EL1h: D, A, I, F masked, M = EL1h.
pub const PSTATE_EL1H_MASKED: u64 = 0x3c5;
/// Fault status code of a synchronous external abort (not on a table walk).
const FSC_SYNC_EXTERNAL: u64 = 0x10;

/// Computes the injection of `kind` for a guest in `state`.
pub fn synchronous_external_abort(
    kind: AbortKind,
    state: GuestState,
) -> Result<InjectedException, UnsupportedGuestMode> {
    let mode = state.pstate & 0x1f;
    let (from_el0, vector) = match mode {
        0b00000 => (true, 0x400),  // EL0t (AArch64)
        0b00100 => (false, 0x000), // EL1t
        0b00101 => (false, 0x200), // EL1h
        _ => return Err(UnsupportedGuestMode(state.pstate)),
    };
    let (ec, iss) = match kind {
        AbortKind::Data { write } => (
            if from_el0 { 0x24 } else { 0x25 },
            FSC_SYNC_EXTERNAL | (u64::from(write) << 6),
        ),
        AbortKind::Instruction => (if from_el0 { 0x20 } else { 0x21 }, FSC_SYNC_EXTERNAL),
    };
    Ok(InjectedException {
        esr: (ec << 26) | ESR_IL | iss,
        far: state.far,
        elr: state.pc,
        spsr: state.pstate,
        pc: state.vbar + vector,
        pstate: PSTATE_EL1H_MASKED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_abort_from_el1h() {
        let state = GuestState {
            pstate: 0x3c5,
            pc: 0x4008_1234,
            far: 0x1_0000_0000,
            vbar: 0x4008_0800,
        };
        let e = synchronous_external_abort(AbortKind::Data { write: true }, state).expect("EL1h");
        assert_eq!(e.esr >> 26, 0x25);
        assert_eq!(e.esr & ESR_IL, ESR_IL);
        assert_eq!(e.esr & 0x3f, 0x10);
        assert_eq!(e.esr & (1 << 6), 1 << 6);
        assert_eq!(e.far, 0x1_0000_0000);
        assert_eq!(e.elr, 0x4008_1234);
        assert_eq!(e.spsr, 0x3c5);
        assert_eq!(e.pc, 0x4008_0a00);
        assert_eq!(e.pstate, PSTATE_EL1H_MASKED);
    }

    #[test]
    fn vectors_by_origin() {
        let at = |pstate| GuestState {
            pstate,
            pc: 0,
            far: 0,
            vbar: 0x1000,
        };
        let el1t = synchronous_external_abort(AbortKind::Instruction, at(0x4)).expect("EL1t");
        assert_eq!((el1t.pc, el1t.esr >> 26), (0x1000, 0x21));
        let el0 =
            synchronous_external_abort(AbortKind::Data { write: false }, at(0x0)).expect("EL0");
        assert_eq!((el0.pc, el0.esr >> 26), (0x1400, 0x24));
        assert_eq!(el0.esr & (1 << 6), 0);
        assert_eq!(
            synchronous_external_abort(AbortKind::Instruction, at(0x10)),
            Err(UnsupportedGuestMode(0x10)),
            "AArch32 guests are not supported"
        );
    }
}
