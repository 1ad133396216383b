//! Exceptions delivered to the guest: `crate::exit::inject` computes the
//! registers, the machine writes them (`VcpuMachine::deliver_exception`).

use super::{Vcpu, VcpuMachine};
use crate::exit::data_abort::AbortCause;
use crate::exit::esr::ExceptionClass;
use crate::exit::flow::StopReason;
use crate::exit::inject::{self, GuestState, InjectKind};
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;

impl<M: VcpuMachine> Vcpu<M> {
    /// Delivers `kind` to the guest as its own hardware would take it to
    /// EL1h: `inject::compute` decides every value from the exit's state, this
    /// only reads the guest's `VBAR_EL1`/`SCTLR_EL1` and has the result written.
    pub(super) fn deliver(&mut self, kind: InjectKind) -> Result<(), StopReason> {
        let state = GuestState {
            pstate: self.regs.pstate,
            pc: self.regs.pc,
            far: self.regs.far,
            trap_esr: self.regs.esr,
            vbar: self.machine.vbar_el1(),
            sctlr: self.machine.sctlr_el1(),
            mte: self.vm.mte,
        };
        let exception = match inject::compute(kind, state) {
            Ok(e) => e,
            Err(e) => return Err(StopReason::Inject { kind, pstate: e.0 }),
        };
        self.machine.deliver_exception(&exception);
        self.regs.pc = exception.pc;
        self.regs.pstate = exception.pstate;
        Ok(())
    }

    /// Injects a synchronous external abort for an access to `ipa`, outside
    /// every memslot and device (or not emulable there, as `cause` says).
    pub(super) fn inject_abort(
        &mut self,
        kind: InjectKind,
        ipa: u64,
        cause: AbortCause,
    ) -> Result<(), StopReason> {
        self.deliver(kind)?;
        self.bump(Counter::InjectedAborts);
        let what = match kind {
            InjectKind::InstructionAbort => "instruction",
            _ => "data",
        };
        self.log_event(
            Event::InjectedAbort,
            log::Level::Info,
            format_args!("injected {what} abort: IPA {ipa:#x} {cause}"),
        );
        Ok(())
    }

    /// Injects an undefined instruction for a trapped instruction the
    /// hypervisor does not emulate.
    pub(super) fn inject_undefined(&mut self) -> Result<(), StopReason> {
        let (esr, pc, pstate) = (self.regs.esr, self.regs.pc, self.regs.pstate);
        self.deliver(InjectKind::Undefined)?;
        self.bump(Counter::InjectedUndefs);
        self.log_event(
            Event::InjectedUndefined,
            log::Level::Info,
            format_args!(
                "injected undefined instruction: trapped EC {:#x} (ESR_EL2 {esr:#x}) at PC {pc:#x}, PSTATE {pstate:#x}",
                ExceptionClass::from_esr(esr).code()
            ),
        );
        Ok(())
    }
}
