//! The control interface over the running VMs: [`ControlTarget`] over the
//! VM table, and the entry the hypercall exit calls (through
//! `arch::control_target`, which holds the published table).
//!
//! A control call runs on the CPU of the calling vCPU, inside its `HVC`
//! exit. [`handle_call`] pins the caller's memslots for the calls that name
//! a buffer (`LIST_VMS`, `MEMORY_READ`, `MEMORY_WRITE`) and hands the
//! published set to the pure dispatcher (`crate::control::abi::dispatch`) as
//! the caller's memory (each buffer page's chunk zeroed first where the
//! caller had not used it, `vm::lazy_zero`); every other call gets an empty caller memory and
//! pins nothing of the caller, so a control VM that deletes another control
//! VM's slot while that one deletes one of its own cannot wait on each
//! other's grace periods.
//!
//! [`ControlMachine`] implements the calls:
//! - VM ids are indices in the VM table (`runtime::vm_table`); pause, resume
//!   and stop are `runtime::vm_ops` over the VM's run state
//!   (`vm::run_state`): `VM_PAUSE` returns once no vCPU of the VM runs
//!   guest code, `VM_STOP` once the VM's own CPU carried the stop out and
//!   reported it (bounded: `vm_ops::STOP_WAIT_SECONDS`);
//! - memslot changes and guest memory copies are `runtime::vm_ops` (shared
//!   with the console monitor), run here, on a CPU that runs none of the
//!   target's vCPUs and holds none of its locks or pins;
//! - vCPU registers of a paused VM: each vCPU parks a copy of `x0..x30`, PC
//!   and PSTATE in `Vm::parked` and takes it back when the VM resumes
//!   (`control::abi::registers`); the EL1 system registers stay live in the
//!   vCPU's own CPU, which no other CPU can read, and answer
//!   `NOT_SUPPORTED`.

use crate::control::abi::registers::ParkedRegisters;
use crate::control::abi::{
    Caller, CallerMemory, CallerPage, ControlTarget, HostSpan, NewSlot, VmId, buffer::MAX_SPANS,
    dispatch, memslot_error,
};
use crate::runtime::Hardware;
use crate::runtime::dirty_log;
use crate::runtime::live_migration::{self, MigrateError};
use crate::runtime::vm_instance::Vm;
use crate::runtime::vm_ops::{self, HostPiece, VmOpError};
use crate::vm::migration_plan::MigrationOptions;
use crate::vm::run_state::Requested;
use control_abi::reply::Capabilities;
use control_abi::vm_info::{VmInfo, VmState};
use control_abi::{Error, Function, RegisterId};
use crossbeam_epoch::LocalHandle;
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, MemslotSet, SlotFlags, SlotId};

/// The capability bits this hypervisor offers: all of 1.0 but vCPU
/// registers.
pub const CAPABILITIES: u64 = Capabilities::ALL_1_1;

/// Caller memory with no pages: the calls that name no buffer.
struct NoBuffer;

impl CallerMemory for NoBuffer {
    fn page(&self, _gfn: Gfn) -> Option<CallerPage> {
        None
    }

    fn mark_written(&self, _gfn: Gfn) {}
}

/// The caller's memslots as its buffers' memory: each page is zeroed first
/// if the caller had not used its chunk yet (`vm::lazy_zero`), so the call
/// never reads an earlier owner's bytes and what it writes is not zeroed
/// later by the caller's first fault there.
struct CallerRam<'a, H: Hardware> {
    vm: &'a Vm<H>,
    slots: &'a MemslotSet,
}

impl<H: Hardware> CallerMemory for CallerRam<'_, H> {
    fn page(&self, gfn: Gfn) -> Option<CallerPage> {
        let page = self.slots.page(gfn)?;
        self.vm.ensure_zeroed(page.host.0, control_abi::PAGE_SIZE);
        Some(page)
    }

    fn mark_written(&self, gfn: Gfn) {
        self.slots.mark_written(gfn);
    }
}

/// Answers the control call in `regs` (`x0..x7`) of a vCPU of `caller`
/// whose handle of the caller's memslot collector is `epoch` (unpinned);
/// `vms` are the VMs in id order. Returns `x0..x3`.
pub fn handle_call<H: Hardware>(
    vms: &'static [&'static Vm<H>],
    caller: &'static Vm<H>,
    epoch: &LocalHandle,
    regs: &[u64; 8],
) -> [u64; 4] {
    let id = caller.index as VmId;
    let mut machine = ControlMachine {
        hw: caller.hw,
        vms,
        fwb: caller.fwb,
    };
    let needs_buffer = matches!(
        Function::from_x0(regs[0]),
        Some(
            Function::ListVms
                | Function::MemoryRead
                | Function::MemoryWrite
                | Function::DirtyLogGet
                | Function::DirtyLogClear
        )
    );
    if !(caller.control && needs_buffer) {
        let call = Caller {
            vm: id,
            control: caller.control,
            memory: &NoBuffer,
        };
        return dispatch(&call, regs, &mut machine);
    }
    let guard = epoch.pin();
    match caller.memslots.slots(&guard) {
        Ok(slots) => {
            let memory = CallerRam { vm: caller, slots };
            let call = Caller {
                vm: id,
                control: true,
                memory: &memory,
            };
            dispatch(&call, regs, &mut machine)
        }
        Err(_) => control_abi::reply::error(Error::Internal),
    }
}

/// The machine side of the control calls.
pub struct ControlMachine<H: Hardware> {
    /// The machine the VMs run on.
    hw: &'static H,
    /// The VMs, in id order.
    vms: &'static [&'static Vm<H>],
    /// Stage 2 forces write-back (FEAT_S2FWB): no cache maintenance.
    fwb: bool,
}

/// Runs `f` on the registers of `vm`'s paused vCPU `vcpu`: `NO_SUCH_VCPU`
/// for a vCPU the VM lacks, `BAD_STATE` unless the VM is paused, `BUSY` while
/// the vCPU has not parked yet (it is on its way out of the guest, or it is
/// off and never will: the caller retries a bounded number of times).
fn with_parked<H: Hardware, T>(
    vm: &Vm<H>,
    vcpu: u32,
    f: impl FnOnce(&mut ParkedRegisters) -> Result<T, Error>,
) -> Result<T, Error> {
    let slot = vm.parked.get(vcpu as usize).ok_or(Error::NoSuchVcpu)?;
    if vm.run_state.get() != Requested::Paused {
        return Err(Error::BadState);
    }
    let mut parked = slot.lock();
    f(parked.as_mut().ok_or(Error::Busy)?)
}

impl<H: Hardware> ControlMachine<H> {
    fn vm(&self, id: VmId) -> Result<&'static Vm<H>, Error> {
        usize::try_from(id)
            .ok()
            .and_then(|index| self.vms.get(index))
            .copied()
            .ok_or(Error::NoSuchVm)
    }
}

fn op_error(e: VmOpError) -> Error {
    match e {
        VmOpError::Memslot(e) => memslot_error(e),
        VmOpError::NoMemory => Error::NoMemory,
        VmOpError::Unmap(_) => Error::Internal,
        VmOpError::NotMapped { .. } => Error::NotMapped,
        VmOpError::BadRange | VmOpError::BadChunk(_) => Error::InvalidParameters,
        VmOpError::Stage2(pgtable::Error::NoMemory) => Error::NoMemory,
        VmOpError::Stage2(_) => Error::Internal,
    }
}

/// The host spans as `vm_ops` pieces.
fn pieces(spans: &[HostSpan]) -> Result<([HostPiece; MAX_SPANS], usize), Error> {
    let mut out = [HostPiece {
        host: HostPhysAddr(0),
        len: 0,
    }; MAX_SPANS];
    for (slot, span) in out.iter_mut().zip(spans) {
        *slot = HostPiece {
            host: span.host,
            len: span.len,
        };
    }
    if spans.len() > MAX_SPANS {
        return Err(Error::Internal);
    }
    Ok((out, spans.len()))
}

impl<H: Hardware> ControlTarget for ControlMachine<H> {
    fn capabilities(&self) -> u64 {
        CAPABILITIES
    }

    fn vm_count(&self) -> usize {
        self.vms.len()
    }

    fn vm_info(&self, index: usize) -> Option<VmInfo> {
        let vm = *self.vms.get(index)?;
        // Cannot fail: the handle is of the VM's own collector.
        let (ram_pages, slots) = vm_ops::slot_totals(vm).ok()?;
        Some(VmInfo {
            id: index as u32,
            state: match vm.requested_state() {
                Requested::Running => VmState::Running,
                Requested::Paused => VmState::Paused,
                Requested::StopRequested => VmState::Stopped,
            },
            vcpus: vm.vcpus as u32,
            control: vm.control,
            ram_pages,
            slots,
        })
    }

    fn pause(&mut self, id: VmId) -> Result<(), Error> {
        vm_ops::pause(self.vm(id)?).map_err(|_| Error::BadState)
    }

    fn resume(&mut self, id: VmId) -> Result<(), Error> {
        vm_ops::resume(self.vm(id)?).map_err(|_| Error::BadState)
    }

    fn stop(&mut self, id: VmId) -> Result<(), Error> {
        let target = self.vm(id)?;
        if vm_ops::stop(target) == vm_ops::StopWait::Requested {
            log::warn!(
                "vm{}: stop requested by a control VM; not carried out within {} s",
                target.index,
                vm_ops::STOP_WAIT_SECONDS
            );
        }
        Ok(())
    }

    fn create_slot(&mut self, id: VmId, slot: NewSlot) -> Result<(), Error> {
        vm_ops::create_slot(
            self.vm(id)?,
            slot.id,
            slot.base_gfn,
            slot.npages,
            slot.flags,
        )
        .map_err(op_error)
    }

    fn delete_slot(&mut self, id: VmId, slot: SlotId) -> Result<(), Error> {
        vm_ops::delete_slot(self.vm(id)?, slot)
            .map(|_| ())
            .map_err(op_error)
    }

    fn move_slot(&mut self, id: VmId, slot: SlotId, base_gfn: Gfn) -> Result<(), Error> {
        vm_ops::move_slot(self.vm(id)?, slot, base_gfn)
            .map(|_| ())
            .map_err(op_error)
    }

    fn set_slot_flags(&mut self, id: VmId, slot: SlotId, flags: SlotFlags) -> Result<(), Error> {
        dirty_log::set_slot_flags(self.vm(id)?, slot, flags).map_err(op_error)
    }

    fn read_memory(&mut self, id: VmId, ipa: u64, dst: &[HostSpan]) -> Result<(), Error> {
        let target = self.vm(id)?;
        let (pieces, count) = pieces(dst)?;
        vm_ops::read_guest(target, ipa, &pieces[..count]).map_err(op_error)
    }

    fn write_memory(&mut self, id: VmId, ipa: u64, src: &[HostSpan]) -> Result<(), Error> {
        let target = self.vm(id)?;
        let (pieces, count) = pieces(src)?;
        vm_ops::write_guest(target, ipa, &pieces[..count]).map_err(op_error)
    }

    fn write_host(&mut self, dst: HostPhysAddr, bytes: &[u8]) {
        vm_ops::write_host(self.hw, dst, bytes, self.fwb);
    }

    fn migrate(&mut self, src: VmId, dst: VmId, options: MigrationOptions) -> Result<(), Error> {
        // `request` refuses at once (the VMs' states, shapes, a GICv2 host);
        // what fails later is reported in the hypervisor's log.
        live_migration::request(self.vm(src)?, self.vm(dst)?, options).map_err(|e| match e {
            MigrateError::SameVm | MigrateError::Shape(_) | MigrateError::Device(..) => {
                Error::InvalidParameters
            }
            MigrateError::Busy => Error::Busy,
            MigrateError::Blocked(_) => Error::NotSupported,
            MigrateError::Op(e) => op_error(e),
            MigrateError::NotWaiting
            | MigrateError::SourceNotRunning
            | MigrateError::Pause(_)
            | MigrateError::CaptureTimeout(_)
            | MigrateError::Differences(_) => Error::BadState,
        })
    }

    fn read_host(&mut self, src: HostPhysAddr, out: &mut [u8]) {
        vm_ops::read_host(self.hw, src, out, self.fwb);
    }

    fn dirty_log_get(&mut self, id: VmId, slot: SlotId, out: &mut [u64]) -> Result<u64, Error> {
        dirty_log::get(self.vm(id)?, slot, out).map_err(op_error)
    }

    fn dirty_log_clear(
        &mut self,
        id: VmId,
        slot: SlotId,
        first_page: u64,
        mask: &mut [u64],
    ) -> Result<u64, Error> {
        dirty_log::clear(self.vm(id)?, slot, first_page, mask).map_err(op_error)
    }

    fn dirty_log_config(
        &mut self,
        id: VmId,
        mode: DirtyLogMode,
        eager_chunk: u64,
    ) -> Result<(), Error> {
        dirty_log::configure(self.vm(id)?, mode, eager_chunk).map_err(op_error)
    }

    fn get_register(&mut self, id: VmId, vcpu: u32, reg: RegisterId) -> Result<u64, Error> {
        with_parked(self.vm(id)?, vcpu, |regs| regs.get(reg))
    }

    fn set_register(
        &mut self,
        id: VmId,
        vcpu: u32,
        reg: RegisterId,
        value: u64,
    ) -> Result<(), Error> {
        with_parked(self.vm(id)?, vcpu, |regs| regs.set(reg, value))
    }
}
