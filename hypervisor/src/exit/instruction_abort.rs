//! Where a stage-2 instruction abort goes.
//!
//! A translation, access-flag or permission fault in guest RAM is faulted in
//! (permission: the guest executes from memory a data access mapped without
//! execute permission, which the fault path adds); a fetch outside RAM gets an
//! abort injected (devices are never executed from); any other fault status
//! stops the VM.

use crate::exit::data_abort::AbortCause;
use crate::exit::esr::{FaultKind, InstructionAbort};
use crate::exit::flow::StopReason;
use crate::stage2::fault::SlotView;
use crate::vm::exit_profile::ExitClass;

/// What to do with an instruction abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstructionAbortRoute {
    /// Map guest RAM executable (or set the access flag) at the IPA.
    FaultIn {
        /// The memslot holding the IPA.
        slot: SlotView,
        /// Translation, access flag or permission.
        kind: FaultKind,
    },
    /// Inject an instruction abort.
    InjectAbort(AbortCause),
}

impl InstructionAbortRoute {
    /// The exit's class in the VM's exit profile.
    pub const fn exit_class(&self) -> ExitClass {
        match self {
            Self::FaultIn { .. } => ExitClass::Stage2Fault,
            Self::InjectAbort(_) => ExitClass::AbortInjected,
        }
    }
}

/// Routes `abort` at `ipa` (guest PC `pc`, for a report); `slot` is the
/// memslot holding `ipa`, if any.
pub fn route(
    abort: &InstructionAbort,
    ipa: u64,
    pc: u64,
    slot: Option<SlotView>,
) -> Result<InstructionAbortRoute, StopReason> {
    let kind = abort.status.kind;
    match kind {
        FaultKind::Translation | FaultKind::AccessFlag | FaultKind::Permission => {}
        other => {
            return Err(StopReason::InstructionAbortStatus {
                ipa,
                kind: other,
                pc,
            });
        }
    }
    Ok(match slot {
        Some(slot) => InstructionAbortRoute::FaultIn { slot, kind },
        None => InstructionAbortRoute::InjectAbort(AbortCause::NoMemoryOrDevice),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::esr::FaultStatus;

    const RAM: SlotView = SlotView {
        ipa: 0x4000_0000,
        size: 0x1000_0000,
        backing: 0x8000_0000,
        logging: false,
    };

    fn abort(kind: FaultKind) -> InstructionAbort {
        InstructionAbort {
            status: FaultStatus {
                kind,
                level: Some(3),
            },
            stage1_walk: false,
        }
    }

    #[test]
    fn permission_faults_in_ram() {
        assert_eq!(
            route(&abort(FaultKind::Permission), RAM.ipa, 0, Some(RAM)),
            Ok(InstructionAbortRoute::FaultIn {
                slot: RAM,
                kind: FaultKind::Permission
            })
        );
    }

    #[test]
    fn outside_ram_injects() {
        assert_eq!(
            route(&abort(FaultKind::Translation), 0x0900_0000, 0, None),
            Ok(InstructionAbortRoute::InjectAbort(
                AbortCause::NoMemoryOrDevice
            ))
        );
    }

    #[test]
    fn other_status_stops() {
        assert_eq!(
            route(&abort(FaultKind::AddressSize), RAM.ipa, 0x40, Some(RAM)),
            Err(StopReason::InstructionAbortStatus {
                ipa: RAM.ipa,
                kind: FaultKind::AddressSize,
                pc: 0x40
            })
        );
    }
}
