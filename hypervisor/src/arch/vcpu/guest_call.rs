//! Hypervisor and secure-monitor calls (`HVC`, trapped `SMC`): decoded by
//! `crate::exit::hypercall`, PSCI answered by `crate::exit::psci`. A control
//! VM's calls of the control interface's range (`control_abi::Function::in_range`)
//! go to `arch::control_target`; any other VM's calls of that range are unknown
//! hypercalls like every other id, answered `NOT_SUPPORTED` (-1).

use super::Vcpu;
use crate::arch::control_target;
use crate::arch::cpu::sysreg;
use crate::exit::flow::{Flow, ListRegisterOp, StopReason};
use crate::exit::hypercall::{GuestCall, NOT_SUPPORTED, SMCCC_VERSION_1_1};
use crate::exit::psci::{self, PsciCall, PsciOutcome};
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;

impl Vcpu {
    pub(super) fn guest_call(&mut self) -> Result<Flow, StopReason> {
        let x = &self.regs.x;
        if self.vm.control && control_abi::Function::in_range(x[0]) {
            let regs = [x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]];
            let out = control_target::handle_call(self.vm, &self.epoch, &regs);
            self.regs.x[..4].copy_from_slice(&out);
            return Ok(Flow::Resume);
        }
        let call = GuestCall::decode([x[0], x[1], x[2], x[3]]);
        let result = match call {
            GuestCall::Psci(psci) => return self.psci(psci),
            GuestCall::SmcccVersion => SMCCC_VERSION_1_1,
            GuestCall::TestReport { code } => {
                self.bump(Counter::TestReports);
                if code == 0 {
                    self.log_event(
                        Event::TestReport,
                        log::Level::Info,
                        format_args!("test report: pass"),
                    );
                } else {
                    self.log_event(
                        Event::TestReport,
                        log::Level::Info,
                        format_args!("test report: failure code {code:#x}"),
                    );
                }
                0
            }
            GuestCall::Unknown(id) => {
                self.bump(Counter::UnknownHypercalls);
                self.log_event(
                    Event::UnknownHypercall(id),
                    log::Level::Info,
                    format_args!("unknown hypercall {id:#x}: returned NOT_SUPPORTED"),
                );
                NOT_SUPPORTED
            }
        };
        self.regs.x[0] = result;
        Ok(Flow::Resume)
    }

    /// Handles a PSCI call: the answer goes to `x0` and the vCPU resumes,
    /// or it turns off, or the guest powers the machine off or resets it.
    pub(super) fn psci(&mut self, call: PsciCall) -> Result<Flow, StopReason> {
        let vm = self.vm;
        let value = match psci::dispatch(call, self.index, &vm.power, vm.ram) {
            PsciOutcome::Return(value) => value,
            PsciOutcome::Started(target) => {
                // The target's CPU waits in WFI (WFE without a GIC) for its
                // request.
                sysreg::send_event();
                vm.kick(target);
                0
            }
            PsciOutcome::CpuOff => {
                if let Some(lrs) = self.lrs.as_mut() {
                    let result = vm.vgic.lock().unload(self.index, lrs);
                    if let Err(error) = result {
                        return Err(StopReason::ListRegisters {
                            op: ListRegisterOp::Unload,
                            error,
                        });
                    }
                }
                return Ok(Flow::Off);
            }
            PsciOutcome::SystemOff => return Ok(Flow::SystemOff),
            PsciOutcome::SystemReset => return Ok(Flow::SystemReset),
        };
        self.regs.x[0] = value;
        Ok(Flow::Resume)
    }
}
