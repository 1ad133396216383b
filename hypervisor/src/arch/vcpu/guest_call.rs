//! The machine side of hypervisor and secure-monitor calls (`HVC`, trapped
//! `SMC`), handled by `runtime::guest_call`: the calling vCPU's registers,
//! its list registers as it turns off, and the control interface's entry
//! (`arch::control_target`).

use super::Vcpu;
use crate::arch::control_target;
use crate::arch::hardware::{El2, Vm};
use crate::exit::flow::{Flow, ListRegisterOp, StopReason};
use crate::runtime::guest_call::{self, CallingVcpu};

impl Vcpu {
    pub(super) fn guest_call(&mut self) -> Result<Flow, StopReason> {
        guest_call::guest_call(self)
    }
}

impl CallingVcpu<El2> for Vcpu {
    fn vm(&self) -> &'static Vm {
        self.vm
    }

    fn index(&self) -> usize {
        self.index
    }

    fn call_args(&self) -> [u64; 8] {
        let x = &self.regs.x;
        [x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]
    }

    fn set_results(&mut self, out: &[u64]) {
        self.regs.x[..out.len()].copy_from_slice(out);
    }

    fn control_call(&mut self, regs: &[u64; 8]) -> [u64; 4] {
        control_target::handle_call(self.vm, &self.epoch, regs)
    }

    fn unload_list_registers(&mut self) -> Result<(), StopReason> {
        self.unload(ListRegisterOp::Unload)
    }
}
