//! Stage-2 aborts: `crate::exit::data_abort` and
//! `crate::exit::instruction_abort` route them; guest RAM is faulted in here.

use super::Vcpu;
use crate::arch::hardware::Vm;
use crate::arch::stage2::FrameMemory;
use crate::exit::data_abort::{self, DataAbortRoute};
use crate::exit::esr::{DataAbort, FaultKind, InstructionAbort};
use crate::exit::flow::{Flow, StopReason};
use crate::exit::inject::InjectKind;
use crate::exit::instruction_abort::{self, InstructionAbortRoute};
use crate::stage2::fault::{self, Access, MappedFault, MappedLeaf, SlotView};
use crate::vm::counters::Counter;
use crate::vm::exit_profile::ExitClass;
use crossbeam_epoch::LocalHandle;
use memslot::VcpuSlotCache;
use pgtable::{Attributes, FAULT_CACHE_PAGES, FaultMapping, FaultTicket, PhysAddr};

impl Vcpu {
    /// A stage-2 data abort, routed by `exit::data_abort`.
    pub(super) fn data_abort(&mut self, abort: DataAbort) -> Result<Flow, StopReason> {
        let ipa = self.ipa();
        // Before the lookup: a slot deleted or moved meanwhile is not mapped.
        let ticket = self.vm.stage2.fault_ticket();
        let slot = self.vm.slot_for(&self.epoch, ipa, &mut self.slot_cache);
        match data_abort::route(&abort, ipa, self.regs.pc, slot, &self.vm.mmio)? {
            DataAbortRoute::FaultIn { slot, kind } => {
                self.exit_class = ExitClass::Stage2Fault;
                // A stage-1 walk counts as a write (it may set flags).
                let access = if abort.write || abort.stage1_walk {
                    Access::Write
                } else {
                    Access::Read
                };
                self.fault_in(ticket, slot, ipa, kind, access)
            }
            DataAbortRoute::Uart { access, offset } => {
                self.exit_class = ExitClass::MmioUart;
                self.uart_access(abort.write, access, offset)
            }
            DataAbortRoute::Gic { access } => {
                self.exit_class = ExitClass::MmioGic;
                self.gic_access(abort.write, access, ipa)
            }
            DataAbortRoute::InjectAbort(cause) => {
                self.exit_class = ExitClass::AbortInjected;
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
        match instruction_abort::route(&abort, ipa, self.regs.pc, slot)? {
            InstructionAbortRoute::FaultIn { slot, kind } => {
                self.exit_class = ExitClass::Stage2Fault;
                self.fault_in(ticket, slot, ipa, kind, Access::Exec)
            }
            InstructionAbortRoute::InjectAbort(cause) => {
                self.exit_class = ExitClass::AbortInjected;
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
    /// instruction cache first where the CPU needs it). The leaf is installed
    /// only if no slot was deleted or moved since `ticket` was taken, before
    /// the slot lookup (`pgtable::invalidate`); otherwise the guest retries.
    /// While the slot logs dirty pages, faults map pages only, reads map
    /// read-only and a write marks its page dirty inside the same read-side
    /// section (`stage2::fault`, "Dirty logging").
    pub(super) fn fault_in(
        &mut self,
        ticket: FaultTicket,
        slot: SlotView,
        ipa: u64,
        kind: FaultKind,
        access: Access,
    ) -> Result<Flow, StopReason> {
        let logging = slot.logging;
        let dirty = fault::marks_dirty(access, logging);
        self.bump(Counter::Stage2Faults);
        if kind == FaultKind::AccessFlag {
            let result = self
                .vm
                .stage2
                .read(&self.mmu_cpu)
                .and_then(|mmu| mmu.set_young(ipa));
            return match result {
                // Set, or the leaf is gone or busy: a translation fault follows if needed.
                Ok(_) | Err(pgtable::Error::Again) => Ok(Flow::Resume),
                Err(error) => Err(StopReason::AccessFlag { ipa, error }),
            };
        }
        let Some(leaf) = fault::fault_leaf(slot, ipa, fault::max_leaf(logging)) else {
            return Err(StopReason::LeftMemslot { ipa });
        };
        if self
            .page_cache
            .top_up(&FrameMemory::TABLES, FAULT_CACHE_PAGES)
            .is_err()
        {
            return Err(StopReason::OutOfTableMemory);
        }
        let mmu = match self.vm.stage2.read(&self.mmu_cpu) {
            Ok(mmu) => mmu,
            Err(error) => return Err(StopReason::Stage2ReadSide { ipa, error }),
        };
        let mut collapse = false;
        if let Some(mapping) = mmu.lookup(ipa) {
            // Mapped already (a permission fault, or another vCPU mapped or
            // relaxed it since this one faulted): widen the leaf if this
            // access needs it and drop this CPU's stale entry, or map anew.
            let mapped = MappedLeaf {
                perms: mapping.perms(),
                size: mapping.leaf_size(),
            };
            let permission = kind == FaultKind::Permission;
            match fault::on_mapped(permission, access, mapped, logging, leaf.size) {
                MappedFault::Resume => return Ok(Flow::Resume),
                MappedFault::RelaxAndInvalidateLocal(perms) => {
                    return match mmu.relax_perms(ipa, perms, &self.vm.tlb) {
                        Ok(()) => {
                            if dirty {
                                mark_dirty(self.vm, &self.epoch, &mut self.slot_cache, ipa);
                            }
                            Ok(Flow::Resume)
                        }
                        // The leaf is gone or busy: the access faults
                        // again if it still needs to.
                        Err(pgtable::Error::Again) => Ok(Flow::Resume),
                        Err(error) => Err(StopReason::RelaxPermissions { ipa, error }),
                    };
                }
                MappedFault::Remap => collapse = mapped.size < leaf.size,
            }
        }
        let perms = fault::new_leaf_perms(access, logging);
        let result = mmu.map_checked(
            ticket,
            FaultMapping {
                ipa: leaf.ipa,
                size: leaf.size,
                pa: PhysAddr::new(leaf.pa),
                attrs: Attributes::normal(perms),
            },
            &mut self.page_cache,
            &self.vm.tlb,
        );
        if result.is_ok() && dirty {
            mark_dirty(self.vm, &self.epoch, &mut self.slot_cache, ipa);
        }
        drop(mmu);
        match result {
            Ok(()) => {
                if collapse {
                    self.bump(Counter::Stage2Collapses);
                }
                self.bump(match leaf.size {
                    0x4000_0000 => Counter::MappedBlocks1g,
                    0x20_0000 => Counter::MappedBlocks2m,
                    _ => Counter::MappedPages4k,
                });
                Ok(Flow::Resume)
            }
            // Another vCPU is changing this entry, or the slot was deleted
            // or moved since the lookup: the guest faults again.
            Err(pgtable::Error::Again) => Ok(Flow::Resume),
            Err(error) => Err(StopReason::Stage2Map {
                ipa: leaf.ipa,
                size: leaf.size,
                error,
            }),
        }
    }
}

/// Marks the page of `ipa` dirty in its slot's log (called inside the
/// read-side section that made it writable), counting new marks.
fn mark_dirty(vm: &Vm, epoch: &LocalHandle, cache: &mut VcpuSlotCache, ipa: u64) {
    if vm.mark_dirty(epoch, ipa, cache) {
        vm.counters.bump(Counter::DirtyPagesMarked);
    }
}
