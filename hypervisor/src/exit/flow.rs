//! Exits as values: what an exit handler tells the run loop.
//!
//! Every handler returns `Result<Flow, StopReason>`: [`Flow`] says how the
//! vCPU goes on (enter the guest again, turn off, or the guest powered the
//! machine off or reset it), [`StopReason`] says why the VM cannot go on. The
//! run loop is the one place that acts on either: it stops the VM with the
//! reason's text, so handlers never stop anything themselves and every way a
//! VM can stop is listed here.

use crate::devices::vgic::VgicError;
use crate::exit::esr::{ExceptionClass, FaultKind};
use crate::exit::inject::InjectKind;
use crate::vm::vcpu_state::MigrationBlocker;
use crate::vocabulary::sysreg_encoding::SysRegEncoding;
use crate::vocabulary::timers::TimerId;

/// How the vCPU goes on after an exit it handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Enter the guest again.
    Resume,
    /// The vCPU turned itself off (PSCI `CPU_OFF`).
    Off,
    /// The guest asked to power the machine off (PSCI `SYSTEM_OFF`).
    SystemOff,
    /// The guest asked to reset the machine (PSCI `SYSTEM_RESET`).
    SystemReset,
    /// The VM is ending or restarting (`crate::vm::lifecycle`): the vCPU
    /// leaves the guest for good and halts until a restart.
    Halt,
}

/// An asynchronous exit the hypervisor never expects from a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnexpectedExit {
    /// A physical FIQ (the hypervisor routes none to a guest).
    Fiq,
    /// An SError.
    SError,
}

/// What the list registers were being synchronized with the vgic for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListRegisterOp {
    /// Filling them before an entry.
    Fill,
    /// Folding them back into the vgic before a GIC register access.
    Fold,
    /// Emptying them when the vCPU is loaded.
    Reset,
    /// Emptying them when the vCPU turns off.
    Unload,
}

impl core::fmt::Display for ListRegisterOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Fill => "fill",
            Self::Fold => "fold",
            Self::Reset => "reset",
            Self::Unload => "unload",
        })
    }
}

/// Why a VM stops: an exit, or a step of handling one, that nothing can make
/// sense of. The text is the report the run loop prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The vCPU could not join the stage-2 MMU's readers.
    Stage2Register(pgtable::Error),
    /// The vgic refused a list register operation.
    ListRegisters {
        /// The operation.
        op: ListRegisterOp,
        /// What the vgic said.
        error: VgicError,
    },
    /// The vgic refused a timer's interrupt line level.
    TimerLine {
        /// The timer.
        timer: TimerId,
        /// What the vgic said.
        error: VgicError,
    },
    /// The vgic refused the emulated UART's interrupt line level.
    UartLine(VgicError),
    /// The vgic refused a passed-through device's interrupt.
    PassthroughLine(VgicError),
    /// An FIQ or SError exit.
    UnexpectedExit {
        /// Which.
        kind: UnexpectedExit,
        /// Guest PC.
        pc: u64,
        /// `ESR_EL2`.
        esr: u64,
    },
    /// A synchronous exit of a class the hypervisor neither handles nor
    /// answers with an undefined instruction.
    Undecodable {
        /// The exception class.
        class: ExceptionClass,
        /// `ESR_EL2`.
        esr: u64,
        /// Guest PC.
        pc: u64,
        /// `FAR_EL2`.
        far: u64,
    },
    /// A data abort whose fault status is no translation or access-flag fault.
    DataAbortStatus {
        /// Faulting IPA.
        ipa: u64,
        /// Fault status.
        kind: FaultKind,
        /// Translation level, when the status has one.
        level: Option<u8>,
        /// Guest PC.
        pc: u64,
    },
    /// An instruction abort whose fault status is no translation,
    /// access-flag or permission fault.
    InstructionAbortStatus {
        /// Faulting IPA.
        ipa: u64,
        /// Fault status.
        kind: FaultKind,
        /// Guest PC.
        pc: u64,
    },
    /// Setting a leaf's access flag failed.
    AccessFlag {
        /// Faulting IPA.
        ipa: u64,
        /// What the stage-2 table said.
        error: pgtable::Error,
    },
    /// The faulting IPA was in a memslot and then in none.
    LeftMemslot {
        /// Faulting IPA.
        ipa: u64,
    },
    /// No host memory for the stage-2 tables of a fault.
    OutOfTableMemory,
    /// The stage-2 MMU's read side refused.
    Stage2ReadSide {
        /// Faulting IPA.
        ipa: u64,
        /// What the MMU said.
        error: pgtable::Error,
    },
    /// Widening the permissions of a mapped leaf failed.
    RelaxPermissions {
        /// Faulting IPA.
        ipa: u64,
        /// What the stage-2 table said.
        error: pgtable::Error,
    },
    /// Mapping a leaf at stage 2 failed.
    Stage2Map {
        /// First IPA of the leaf.
        ipa: u64,
        /// Leaf size in bytes.
        size: u64,
        /// What the stage-2 table said.
        error: pgtable::Error,
    },
    /// An exception cannot be injected: the guest's PSTATE is no state an
    /// AArch64 EL1 guest runs in.
    Inject {
        /// What was to be injected.
        kind: InjectKind,
        /// The guest's PSTATE.
        pstate: u64,
    },
    /// The vgic refused an SGI the guest generated.
    Sgi {
        /// The value written to the SGI generation register.
        value: u64,
        /// What the vgic said.
        error: VgicError,
    },
    /// A trapped ID register that the host cannot read.
    IdRegister(SysRegEncoding),
    /// Cleaning guest memory to the point of coherency failed.
    FlushGuestMemory(pgtable::Error),
    /// The hypervisor console's `stop` or a control VM's `VM_STOP` asked for it
    /// (`crate::vm::run_state`).
    StopRequested,
    /// A migrated vCPU's vector state has a vector length (bytes) this CPU
    /// does not give (the migration checked only the migrating CPU; `vcpu`
    /// in the blocker is this vCPU).
    MigratedVectorLength(MigrationBlocker),
}

impl core::fmt::Display for StopReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Stage2Register(e) => write!(f, "stage-2 MMU registration: {e}"),
            Self::ListRegisters { op, error } => write!(f, "list register {op}: {error:?}"),
            Self::TimerLine { timer, error } => {
                write!(f, "{} timer line: {error:?}", timer.name())
            }
            Self::UartLine(e) => write!(f, "UART interrupt line: {e:?}"),
            Self::PassthroughLine(e) => write!(f, "passed-through device's interrupt: {e:?}"),
            Self::MigratedVectorLength(blocker) => write!(f, "migrated state: {blocker}"),
            Self::StopRequested => write!(
                f,
                "stopped on request (hypervisor console or control interface)"
            ),
            Self::UnexpectedExit { kind, pc, esr } => write!(
                f,
                "unexpected {kind:?} exit at PC {pc:#x} (ESR_EL2 {esr:#x})"
            ),
            Self::Undecodable {
                class,
                esr,
                pc,
                far,
            } => write!(
                f,
                "undecodable exit: EC {:#x} ({class:?}), ESR_EL2 {esr:#x}, PC {pc:#x}, FAR {far:#x}",
                class.code()
            ),
            Self::DataAbortStatus {
                ipa,
                kind,
                level,
                pc,
            } => write!(
                f,
                "data abort at IPA {ipa:#x} with fault status {kind:?} (level {level:?}), PC {pc:#x}"
            ),
            Self::InstructionAbortStatus { ipa, kind, pc } => write!(
                f,
                "instruction abort at IPA {ipa:#x} with fault status {kind:?}, PC {pc:#x}"
            ),
            Self::AccessFlag { ipa, error } => {
                write!(f, "setting the access flag of IPA {ipa:#x} failed: {error}")
            }
            Self::LeftMemslot { ipa } => {
                write!(f, "IPA {ipa:#x} left its memslot during the fault")
            }
            Self::OutOfTableMemory => f.write_str("out of memory for stage-2 tables"),
            Self::Stage2ReadSide { ipa, error } => {
                write!(f, "stage-2 read side for IPA {ipa:#x}: {error}")
            }
            Self::RelaxPermissions { ipa, error } => {
                write!(
                    f,
                    "widening the permissions of IPA {ipa:#x} failed: {error}"
                )
            }
            Self::Stage2Map { ipa, size, error } => {
                write!(f, "stage-2 map of IPA {ipa:#x}+{size:#x} failed: {error}")
            }
            Self::Inject { kind, pstate } => write!(
                f,
                "cannot inject {kind:?}: guest PSTATE {pstate:#x} is no EL0/EL1 state an AArch64 EL1 guest runs in"
            ),
            Self::Sgi { value, error } => write!(f, "SGI {value:#x}: {error:?}"),
            Self::IdRegister(r) => write!(f, "ID register {r} outside the ID space"),
            Self::FlushGuestMemory(e) => write!(f, "flushing guest memory: {e}"),
        }
    }
}

impl core::error::Error for StopReason {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Stage2Register(e)
            | Self::AccessFlag { error: e, .. }
            | Self::Stage2ReadSide { error: e, .. }
            | Self::RelaxPermissions { error: e, .. }
            | Self::Stage2Map { error: e, .. }
            | Self::FlushGuestMemory(e) => Some(e),
            Self::ListRegisters { error: e, .. }
            | Self::TimerLine { error: e, .. }
            | Self::UartLine(e)
            | Self::PassthroughLine(e)
            | Self::Sgi { error: e, .. } => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    /// The reports read exactly as the run loop printed them before exits
    /// became values (the end-to-end tests and users match on them).
    #[test]
    fn reports_keep_their_text() {
        let cases = [
            (
                StopReason::UnexpectedExit {
                    kind: UnexpectedExit::SError,
                    pc: 0x4008_0000,
                    esr: 0xbe00_0000,
                },
                "unexpected SError exit at PC 0x40080000 (ESR_EL2 0xbe000000)",
            ),
            (
                StopReason::Undecodable {
                    class: ExceptionClass::from_esr(0x3c << 26),
                    esr: 0x3c << 26,
                    pc: 0x1000,
                    far: 0,
                },
                "undecodable exit: EC 0x3c (Other(60)), ESR_EL2 0xf0000000, PC 0x1000, FAR 0x0",
            ),
            (
                StopReason::DataAbortStatus {
                    ipa: 0x4000_0000,
                    kind: FaultKind::Permission,
                    level: Some(3),
                    pc: 0x8,
                },
                "data abort at IPA 0x40000000 with fault status Permission (level Some(3)), PC 0x8",
            ),
            (
                StopReason::InstructionAbortStatus {
                    ipa: 0x10,
                    kind: FaultKind::Other(0x21),
                    pc: 0x20,
                },
                "instruction abort at IPA 0x10 with fault status Other(33), PC 0x20",
            ),
            (
                StopReason::ListRegisters {
                    op: ListRegisterOp::Unload,
                    error: VgicError::NoSuchVcpu(3),
                },
                "list register unload: NoSuchVcpu(3)",
            ),
            (
                StopReason::TimerLine {
                    timer: TimerId::Physical,
                    error: VgicError::NoSuchVcpu(1),
                },
                "physical timer line: NoSuchVcpu(1)",
            ),
            (
                StopReason::Stage2Map {
                    ipa: 0x4020_0000,
                    size: 0x20_0000,
                    error: pgtable::Error::NoMemory,
                },
                "stage-2 map of IPA 0x40200000+0x200000 failed: page cache exhausted",
            ),
            (
                StopReason::Inject {
                    kind: InjectKind::Undefined,
                    pstate: 0x9,
                },
                "cannot inject Undefined: guest PSTATE 0x9 is no EL0/EL1 state an AArch64 EL1 guest runs in",
            ),
            (
                StopReason::OutOfTableMemory,
                "out of memory for stage-2 tables",
            ),
        ];
        for (reason, text) in cases {
            assert_eq!(reason.to_string(), text);
        }
    }

    #[test]
    fn stage2_and_vgic_errors_are_sources() {
        use core::error::Error;
        assert!(
            StopReason::FlushGuestMemory(pgtable::Error::NoMemory)
                .source()
                .is_some()
        );
        assert!(
            StopReason::UartLine(VgicError::NoSuchVcpu(0))
                .source()
                .is_some()
        );
        assert!(StopReason::OutOfTableMemory.source().is_none());
    }
}
