//! The control interface's entry at EL2: the VM table published for the
//! control calls, and the hypercall exit's call into
//! `runtime::control_target`, which implements them over the VMs.

use crate::arch::hardware::{Vm, VmTable};
use crate::runtime::control_target;
use crossbeam_epoch::LocalHandle;
use spin::Once;

/// The VM table, once the boot CPU created it.
static VMS: Once<&'static [&'static Vm]> = Once::new();

/// Publishes `table`'s VMs to the control calls. Once, before any vCPU runs.
pub fn start(table: &'static VmTable) {
    VMS.call_once(|| table.vms());
}

/// Answers the control call in `regs` (`x0..x7`) of a vCPU of `caller`
/// whose handle of the caller's memslot collector is `epoch` (unpinned);
/// returns `x0..x3`. Before [`start`] no vCPU runs, so the table is there.
pub fn handle_call(caller: &'static Vm, epoch: &LocalHandle, regs: &[u64; 8]) -> [u64; 4] {
    let vms = VMS.get().copied().unwrap_or(&[]);
    control_target::handle_call(vms, caller, epoch, regs)
}
