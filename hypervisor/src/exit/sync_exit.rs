//! Which handler a synchronous exit goes to.
//!
//! [`classify`] reads `ESR_EL2` (and the guest's PSTATE, for AArch32
//! conditional instructions) and names the exit: an abort, a hypervisor or
//! secure-monitor call, a trapped system register access, a trapped WFI/WFE,
//! an instruction to answer with an undefined instruction, or a class nothing
//! handles, which stops the VM. The run loop only carries out the answer.

use crate::exit::aarch32;
use crate::exit::esr::{DataAbort, ExceptionClass, InstructionAbort, SysRegAccess, iss};
use crate::exit::flow::StopReason;
use crate::vm::counters::Counter;
use crate::vm::exit_profile::ExitClass;

/// A synchronous exit, by what handles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncExit {
    /// A conditional AArch32 instruction that failed its condition trapped
    /// anyway: it does nothing, the guest steps over it.
    ConditionFailed,
    /// A stage-2 data abort.
    DataAbort(DataAbort),
    /// A stage-2 instruction abort.
    InstructionAbort(InstructionAbort),
    /// `HVC` (the return address already points after it).
    Hvc,
    /// A trapped `SMC` (the return address points at it).
    Smc,
    /// A trapped `MSR`/`MRS` or system instruction.
    SysReg(SysRegAccess),
    /// A trapped `WFI`/`WFE`.
    Wfx,
    /// A trapped instruction the hypervisor does not emulate: the guest gets
    /// an undefined instruction.
    Unemulated,
}

impl SyncExit {
    /// The counter the exit adds to, if any.
    pub const fn counter(&self) -> Option<Counter> {
        match self {
            Self::DataAbort(_) => Some(Counter::ExitsDabt),
            Self::InstructionAbort(_) => Some(Counter::ExitsIabt),
            Self::Hvc => Some(Counter::ExitsHvc),
            Self::Smc => Some(Counter::ExitsSmc),
            Self::SysReg(_) => Some(Counter::ExitsSysreg),
            Self::Wfx => Some(Counter::ExitsWfx),
            Self::ConditionFailed | Self::Unemulated => None,
        }
    }

    /// The exit's class in the VM's exit profile, as far as the syndrome
    /// tells it: aborts and system registers are named more closely once
    /// routed (`DataAbortRoute::exit_class`, `SysRegTrap::exit_class`).
    pub const fn exit_class(&self) -> ExitClass {
        match self {
            Self::Hvc => ExitClass::Hvc,
            Self::Smc => ExitClass::Smc,
            Self::Wfx => ExitClass::Wfx,
            _ => ExitClass::Other,
        }
    }
}

/// Names the synchronous exit with syndrome `esr`, taken from a guest in
/// `pstate` at `pc` (`far`: the faulting address, for the report).
pub fn classify(esr: u64, pstate: u64, pc: u64, far: u64) -> Result<SyncExit, StopReason> {
    if aarch32::is_aarch32(pstate) && !aarch32::condition_passed(esr, pstate) {
        return Ok(SyncExit::ConditionFailed);
    }
    Ok(match ExceptionClass::from_esr(esr) {
        ExceptionClass::DataAbortLower => SyncExit::DataAbort(DataAbort::from_iss(iss(esr))),
        ExceptionClass::InstructionAbortLower => {
            SyncExit::InstructionAbort(InstructionAbort::from_iss(iss(esr)))
        }
        ExceptionClass::Hvc64 => SyncExit::Hvc,
        ExceptionClass::Smc64 => SyncExit::Smc,
        ExceptionClass::SysReg64 => SyncExit::SysReg(SysRegAccess::from_iss(iss(esr))),
        ExceptionClass::WfiWfe => SyncExit::Wfx,
        class if class.is_unemulated_instruction() => SyncExit::Unemulated,
        class => {
            return Err(StopReason::Undecodable {
                class,
                esr,
                pc,
                far,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_waits_name_their_exit_class_and_the_rest_wait_for_their_route() {
        use crate::vm::exit_profile::ExitClass;
        assert_eq!(SyncExit::Hvc.exit_class(), ExitClass::Hvc);
        assert_eq!(SyncExit::Smc.exit_class(), ExitClass::Smc);
        assert_eq!(SyncExit::Wfx.exit_class(), ExitClass::Wfx);
        assert_eq!(SyncExit::ConditionFailed.exit_class(), ExitClass::Other);
        assert_eq!(SyncExit::Unemulated.exit_class(), ExitClass::Other);
    }
    use crate::exit::inject::PSTATE_EL1H_MASKED;

    const fn esr(ec: u64, iss: u64) -> u64 {
        (ec << 26) | (1 << 25) | iss
    }

    #[test]
    fn classes_go_to_their_handlers() {
        let el1 = PSTATE_EL1H_MASKED;
        assert_eq!(classify(esr(0x16, 0), el1, 0, 0), Ok(SyncExit::Hvc));
        assert_eq!(classify(esr(0x17, 0), el1, 0, 0), Ok(SyncExit::Smc));
        assert_eq!(classify(esr(0x01, 0), el1, 0, 0), Ok(SyncExit::Wfx));
        assert_eq!(classify(esr(0x00, 0), el1, 0, 0), Ok(SyncExit::Unemulated));
        assert!(matches!(
            classify(esr(0x24, 0x07), el1, 0, 0),
            Ok(SyncExit::DataAbort(_))
        ));
        assert!(matches!(
            classify(esr(0x20, 0x07), el1, 0, 0),
            Ok(SyncExit::InstructionAbort(_))
        ));
        assert!(matches!(
            classify(esr(0x18, 1), el1, 0, 0),
            Ok(SyncExit::SysReg(SysRegAccess { read: true, .. }))
        ));
    }

    #[test]
    fn a_failed_aarch32_condition_does_nothing() {
        // MCR (EC 0x03) with a valid condition (CV) EQ (0), from AArch32 User.
        let mcr_eq = esr(0x03, 1 << 24);
        let usr = 0x10;
        let z = 1 << 30;
        assert_eq!(classify(mcr_eq, usr, 0, 0), Ok(SyncExit::ConditionFailed));
        assert_eq!(classify(mcr_eq, usr | z, 0, 0), Ok(SyncExit::Unemulated));
        // The same syndrome from AArch64 has no condition.
        assert_eq!(
            classify(mcr_eq, PSTATE_EL1H_MASKED, 0, 0),
            Ok(SyncExit::Unemulated)
        );
    }

    #[test]
    fn an_unhandled_class_stops_with_its_state() {
        // 0x25: a data abort taken at EL2 itself never comes from a guest.
        let e = esr(0x25, 0);
        assert_eq!(
            classify(e, PSTATE_EL1H_MASKED, 0x1234, 0x5678),
            Err(StopReason::Undecodable {
                class: ExceptionClass::DataAbortSame,
                esr: e,
                pc: 0x1234,
                far: 0x5678,
            })
        );
    }

    #[test]
    fn counters_follow_the_class() {
        assert_eq!(SyncExit::Hvc.counter(), Some(Counter::ExitsHvc));
        assert_eq!(SyncExit::Wfx.counter(), Some(Counter::ExitsWfx));
        assert_eq!(SyncExit::Unemulated.counter(), None);
        assert_eq!(SyncExit::ConditionFailed.counter(), None);
    }
}
