//! The VM table: the VMs the boot payload describes, which
//! (VM, vCPU) each physical CPU runs, and how many VMs still run.
//!
//! # Partitioning
//!
//! The boot CPU creates every VM of the payload (`runtime::vm_instance::create_vm`) and
//! publishes the table once; no entry changes afterwards. Each VM names its
//! CPUs (`cpus=` in its `vm.conf`, else `0..vcpus` for a single VM); the
//! payload reader refuses a CPU named twice, and [`VmTable::new`] checks it
//! again while it fills the per-CPU record, so each CPU runs at most one
//! vCPU of one VM, for the life of the machine. CPUs no VM names stay the
//! hypervisor's: they idle with their GIC CPU interface quiesced.
//!
//! # Ending
//!
//! Every VM counts as running from creation until it ends (powered off or
//! stopped, `runtime::vm_instance`); [`VmTable::vm_ended`] takes one off the count and
//! the CPU that takes the last one powers the machine off. A VM's end never
//! touches another VM: its own vCPUs halt on their own CPUs. A VM that ended
//! and is restarted counts again ([`VmTable::vm_restarted`]); once the
//! machine has powered off nothing restarts.

use crate::runtime::Hardware;
use crate::runtime::vm_instance::Vm;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Which vCPU of which VM a physical CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuAssignment {
    /// The VM's index in the table.
    pub vm: usize,
    /// The vCPU's index in that VM.
    pub vcpu: usize,
}

/// Why the VMs cannot share the machine's CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineError {
    /// Two vCPUs (of one VM or of two) name the same CPU.
    CpuTwice {
        /// The CPU.
        cpu: usize,
        /// The VM that named it first.
        first: usize,
        /// The VM that named it again.
        second: usize,
    },
    /// A VM names a CPU the machine does not have.
    NoSuchCpu {
        /// The CPU.
        cpu: usize,
        /// The VM.
        vm: usize,
    },
}

impl core::fmt::Display for MachineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::CpuTwice { cpu, first, second } => {
                write!(f, "CPU {cpu} is named by vm{first} and vm{second}")
            }
            Self::NoSuchCpu { cpu, vm } => write!(f, "vm{vm} names CPU {cpu}, which is not online"),
        }
    }
}

impl core::error::Error for MachineError {}

/// The VM table and the per-CPU record.
pub struct VmTable<H: Hardware> {
    hw: &'static H,
    vms: Vec<&'static Vm<H>>,
    /// Indexed by physical CPU: what it runs (`None`: the hypervisor's).
    cpus: Vec<Option<CpuAssignment>>,
    running: AtomicUsize,
}

impl<H: Hardware> VmTable<H> {
    /// The machine of `vms` on `cpus_online` CPUs: fills the per-CPU record
    /// from each VM's CPU map.
    pub fn new(
        hw: &'static H,
        vms: Vec<&'static Vm<H>>,
        cpus_online: usize,
    ) -> Result<Self, MachineError> {
        let mut cpus = vec![None; cpus_online];
        for vm in &vms {
            for (vcpu, &cpu) in vm.cpus.iter().enumerate() {
                let slot = cpus
                    .get_mut(cpu)
                    .ok_or(MachineError::NoSuchCpu { cpu, vm: vm.index })?;
                if let Some(CpuAssignment { vm: first, .. }) = *slot {
                    return Err(MachineError::CpuTwice {
                        cpu,
                        first,
                        second: vm.index,
                    });
                }
                *slot = Some(CpuAssignment { vm: vm.index, vcpu });
            }
        }
        let running = AtomicUsize::new(vms.len());
        Ok(Self {
            hw,
            vms,
            cpus,
            running,
        })
    }

    /// The VMs, in payload order.
    pub fn vms(&self) -> &[&'static Vm<H>] {
        &self.vms
    }

    /// What physical CPU `cpu` runs: a VM and its vCPU, or `None`.
    pub fn assignment(&self, cpu: usize) -> Option<(&'static Vm<H>, usize)> {
        let CpuAssignment { vm, vcpu } = (*self.cpus.get(cpu)?)?;
        Some((self.vms[vm], vcpu))
    }

    /// Called once per end of a VM, by the CPU that ended it: powers the
    /// machine off if it was the last VM running, else returns (the CPU
    /// halts in `runtime::vcpu_cycle`, waiting for a restart).
    pub fn vm_ended(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            log::info!("no VM left to run");
            log::info!("system off");
            self.hw.system_off();
        }
    }

    /// A VM that had ended was restarted: it counts as running again.
    pub fn vm_restarted(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }
}
