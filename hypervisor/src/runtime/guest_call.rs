//! Hypervisor and secure-monitor calls (`HVC`, trapped `SMC`): decoded by
//! `crate::exit::hypercall`, PSCI answered by `crate::exit::psci`. A control
//! VM's calls of the control interface's range (`control_abi::Function::in_range`)
//! go to the control interface (`runtime::control_target`); any other VM's
//! calls of that range are unknown hypercalls like every other id, answered
//! `NOT_SUPPORTED` (-1).
//!
//! The running vCPU's registers and list registers are reached through
//! [`CallingVcpu`], which the vCPU (`runtime::vcpu`) implements over its
//! CPU.

use crate::exit::flow::{Flow, StopReason};
use crate::exit::hypercall::{GuestCall, NOT_SUPPORTED, SMCCC_VERSION_1_1};
use crate::exit::psci::{self, PsciCall, PsciOutcome};
use crate::runtime::Hardware;
use crate::runtime::vm_instance::Vm;
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;

/// What a guest call needs of the vCPU that made it.
pub trait CallingVcpu<H: Hardware> {
    /// The vCPU's VM.
    fn vm(&self) -> &'static Vm<H>;
    /// The vCPU's index in its VM.
    fn index(&self) -> usize;
    /// The guest's general-purpose registers `x0..x7`.
    fn call_args(&self) -> [u64; 8];
    /// Sets the guest's `x0..x3` to `out`.
    fn set_results(&mut self, out: &[u64]);
    /// Answers a control call (`regs`: `x0..x7`), returning `x0..x3`.
    fn control_call(&mut self, regs: &[u64; 8]) -> [u64; 4];
    /// Unloads the vCPU's list registers into the vgic as it turns off.
    fn unload_list_registers(&mut self) -> Result<(), StopReason>;
}

/// Handles the guest call of `vcpu`: the answer goes to `x0` and the vCPU
/// resumes, or PSCI turns it (or the machine) off or resets.
pub fn guest_call<H: Hardware>(vcpu: &mut impl CallingVcpu<H>) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    let x = vcpu.call_args();
    if vm.control && control_abi::Function::in_range(x[0]) {
        let out = vcpu.control_call(&x);
        vcpu.set_results(&out);
        return Ok(Flow::Resume);
    }
    let index = vcpu.index();
    let log_event = |event, args: core::fmt::Arguments<'_>| {
        vm.log_event(index, event, log::Level::Info, args);
    };
    let call = GuestCall::decode([x[0], x[1], x[2], x[3]]);
    let result = match call {
        GuestCall::Psci(call) => return psci_call(vcpu, call),
        GuestCall::SmcccVersion => SMCCC_VERSION_1_1,
        GuestCall::TestReport { code } => {
            vm.counters.bump(Counter::TestReports);
            if code == 0 {
                log_event(Event::TestReport, format_args!("test report: pass"));
            } else {
                log_event(
                    Event::TestReport,
                    format_args!("test report: failure code {code:#x}"),
                );
            }
            0
        }
        GuestCall::Unknown(id) => {
            vm.counters.bump(Counter::UnknownHypercalls);
            log_event(
                Event::UnknownHypercall(id),
                format_args!("unknown hypercall {id:#x}: returned NOT_SUPPORTED"),
            );
            NOT_SUPPORTED
        }
    };
    vcpu.set_results(&[result]);
    Ok(Flow::Resume)
}

/// Handles a PSCI call: the answer goes to `x0` and the vCPU resumes,
/// or it turns off, or the guest powers the machine off or resets it.
pub fn psci_call<H: Hardware>(
    vcpu: &mut impl CallingVcpu<H>,
    call: PsciCall,
) -> Result<Flow, StopReason> {
    let vm = vcpu.vm();
    let value = match psci::dispatch(call, vcpu.index(), &vm.power, vm.ram) {
        PsciOutcome::Return(value) => value,
        PsciOutcome::Started(target) => {
            // The target's CPU waits in WFI (WFE without a GIC) for its
            // request.
            vm.hw.send_event();
            vm.kick(target);
            0
        }
        PsciOutcome::CpuOff => {
            vcpu.unload_list_registers()?;
            return Ok(Flow::Off);
        }
        PsciOutcome::SystemOff => return Ok(Flow::SystemOff),
        PsciOutcome::SystemReset => return Ok(Flow::SystemReset),
    };
    vcpu.set_results(&[value]);
    Ok(Flow::Resume)
}
