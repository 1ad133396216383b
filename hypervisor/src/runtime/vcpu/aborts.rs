//! Stage-2 aborts: `crate::exit::data_abort` and
//! `crate::exit::instruction_abort` route them; guest RAM is faulted in here.

use super::{Vcpu, VcpuMachine};
use crate::exit::data_abort::{self, DataAbortRoute};
use crate::exit::esr::{DataAbort, FaultKind, InstructionAbort};
use crate::exit::flow::{Flow, StopReason};
use crate::exit::inject::InjectKind;
use crate::exit::instruction_abort::{self, InstructionAbortRoute};
use crate::exit::ram_fault::{self, GuestRamFault};
use crate::runtime::Hardware;
use crate::runtime::vm_instance::Vm;
use crate::stage2::fault::{Access, SlotView};
use crate::vm::counters::Counter;
use crossbeam_epoch::LocalHandle;
use memslot::VcpuSlotCache;
use pgtable::FaultTicket;

impl<M: VcpuMachine> Vcpu<M> {
    /// A stage-2 data abort, routed by `exit::data_abort`.
    pub(super) fn data_abort(&mut self, abort: DataAbort) -> Result<Flow, StopReason> {
        let ipa = self.ipa();
        // Before the lookup: a slot deleted or moved meanwhile is not mapped.
        let ticket = self.vm.stage2.fault_ticket();
        let slot = self.vm.slot_for(&self.epoch, ipa, &mut self.slot_cache);
        let route = data_abort::route(&abort, ipa, self.regs.pc, slot, &self.vm.mmio)?;
        self.exit_class = route.exit_class();
        match route {
            DataAbortRoute::FaultIn { slot, kind } => {
                // A stage-1 walk counts as a write (it may set flags).
                let access = if abort.write || abort.stage1_walk {
                    Access::Write
                } else {
                    Access::Read
                };
                self.fault_in(ticket, slot, ipa, kind, access)
            }
            DataAbortRoute::Uart { access, offset } => {
                self.uart_access(abort.write, access, offset)
            }
            DataAbortRoute::Gic { access } => self.gic_access(abort.write, access, ipa),
            DataAbortRoute::Its { access, offset } => self.its_access(abort.write, access, offset),
            DataAbortRoute::Virtio {
                device,
                access,
                offset,
            } => self.virtio_access(device, abort.write, access, offset),
            DataAbortRoute::Passed { access } => self.passed_access(abort.write, access, ipa),
            DataAbortRoute::InjectAbort(cause) => {
                self.inject_abort(InjectKind::DataAbort { write: abort.write }, ipa, cause)?;
                Ok(Flow::Resume)
            }
        }
    }

    /// A stage-2 instruction abort, routed by `exit::instruction_abort`.
    pub(super) fn instruction_abort(
        &mut self,
        abort: InstructionAbort,
    ) -> Result<Flow, StopReason> {
        let ipa = self.ipa();
        // Before the lookup: a slot deleted or moved meanwhile is not mapped.
        let ticket = self.vm.stage2.fault_ticket();
        let slot = self.vm.slot_for(&self.epoch, ipa, &mut self.slot_cache);
        let route = instruction_abort::route(&abort, ipa, self.regs.pc, slot)?;
        self.exit_class = route.exit_class();
        match route {
            InstructionAbortRoute::FaultIn { slot, kind } => {
                self.fault_in(ticket, slot, ipa, kind, Access::Exec)
            }
            InstructionAbortRoute::InjectAbort(cause) => {
                self.inject_abort(InjectKind::InstructionAbort, ipa, cause)?;
                Ok(Flow::Resume)
            }
        }
    }

    /// Maps the leaf around `ipa` with a shared walk (the read side of the
    /// VM's MMU lock: other vCPUs fault at the same time); an access-flag
    /// fault only sets the flag of the leaf already there. As KVM does, a
    /// leaf is executable only once the guest executes from it (`exec`: an
    /// instruction abort): a data fault maps it read-write, and a later
    /// instruction fetch adds execute permission (`pgtable` invalidates the
    /// instruction cache first where the CPU needs it). Every change is made
    /// only if no invalidation (a slot deleted or moved, dirty logging
    /// enabled) happened since `ticket` was taken, before the slot lookup;
    /// otherwise the guest retries. While the slot logs dirty pages, faults
    /// map pages only, reads map read-only and a write marks its page dirty
    /// inside the same read-side section (`exit::ram_fault`).
    fn fault_in(
        &mut self,
        ticket: FaultTicket,
        slot: SlotView,
        ipa: u64,
        kind: FaultKind,
        access: Access,
    ) -> Result<Flow, StopReason> {
        self.bump(Counter::Stage2Faults);
        let (vm, epoch, slot_cache) = (self.vm, &self.epoch, &mut self.slot_cache);
        let resolved = ram_fault::resolve(
            GuestRamFault {
                ticket,
                slot,
                ipa,
                kind,
                access,
            },
            &vm.stage2,
            &self.mmu_cpu,
            &vm.hw.table_memory(),
            &mut self.page_cache,
            &vm.tlb,
            (&vm.ram_zeroing, |addr, len| vm.hw.zero_memory(addr, len)),
            |ipa| mark_dirty(vm, epoch, slot_cache, ipa),
        )?;
        resolved.counters().for_each(|counter| self.bump(counter));
        Ok(Flow::Resume)
    }
}

/// Marks the page of `ipa` dirty in its slot's log (called inside the
/// read-side section that made it writable), counting new marks.
fn mark_dirty<H: Hardware>(vm: &Vm<H>, epoch: &LocalHandle, cache: &mut VcpuSlotCache, ipa: u64) {
    if vm.mark_dirty(epoch, ipa, cache) {
        vm.counters.bump(Counter::DirtyPagesMarked);
    }
}
