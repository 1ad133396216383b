//! Trapped system register accesses, sorted by `crate::exit::sysreg`: set/way
//! cache maintenance and virtual-memory control registers (no FEAT_S2FWB),
//! SGI generation, ID registers, and the rest by policy.

use super::{Vcpu, VcpuMachine};
use crate::devices::timer::PhysicalTimerReg;
use crate::devices::vgic::cpu_interface::{self, CommonRegister, InterfaceShape};
use crate::devices::vgic::list_regs::Deactivation;
use crate::exit::esr::SysRegAccess;
use crate::exit::flow::StopReason;
use crate::exit::sysreg::{self as sysreg_trap, SysRegPolicy, SysRegTrap};
use crate::stage2::cache_maint::VmReg;
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;

impl<M: VcpuMachine> Vcpu<M> {
    /// A trapped system register access, sorted by `exit::sysreg::classify`.
    pub(super) fn sysreg(&mut self, access: SysRegAccess) -> Result<(), StopReason> {
        let trap = sysreg_trap::classify(&access);
        self.exit_class = trap.exit_class();
        match trap {
            SysRegTrap::SetWay => self.set_way_trap()?,
            SysRegTrap::VmRegWrite(reg) => {
                let value = self.reg(access.rt);
                self.vm_reg_write(reg, value)?;
            }
            SysRegTrap::Sgi(group) => {
                if access.read {
                    // The SGI generation registers are write-only.
                    self.set_reg(access.rt, 0);
                } else {
                    let value = self.reg(access.rt);
                    let result = self.vm.vgic.lock().send_sgi(self.index, value, group);
                    match result {
                        Ok(kicks) => self.absorb(kicks),
                        Err(error) => return Err(StopReason::Sgi { value, error }),
                    }
                }
            }
            SysRegTrap::PhysicalTimer(reg) => self.physical_timer_access(reg, &access),
            SysRegTrap::CpuInterface(reg) => self.cpu_interface_access(reg, &access),
            SysRegTrap::IdRegister => {
                if access.read {
                    let r = access.reg;
                    let Some(host) = self.machine.id_register(r.crm, r.op2) else {
                        return Err(StopReason::IdRegister(r));
                    };
                    self.set_reg(access.rt, sysreg_trap::guest_id_value(r, host, self.vm.mte));
                }
            }
            SysRegTrap::Other(policy) => {
                match policy {
                    SysRegPolicy::ReadAsZeroWriteIgnored(_) => {}
                    SysRegPolicy::Unknown => self.log_event(
                        Event::UnknownSysReg(access.reg),
                        log::Level::Warn,
                        format_args!(
                            "trapped {} of unknown system register {}: reads as zero, writes ignored",
                            if access.read { "read" } else { "write" },
                            access.reg
                        ),
                    ),
                }
                if access.read {
                    self.set_reg(access.rt, 0);
                }
            }
        }
        self.skip_trapped_instruction();
        Ok(())
    }

    /// A trapped access to the EL1 physical timer (`CNTHCTL_EL2.EL1PCEN`
    /// clear): done here on the same register. The exit is the point: the
    /// sample before the next entry sees the line the access left
    /// (`crate::devices::timer`), so a disabled, masked or reprogrammed
    /// timer's pending interrupt is withdrawn before the guest can take it.
    fn physical_timer_access(&mut self, reg: PhysicalTimerReg, access: &SysRegAccess) {
        if access.read {
            let value = self.machine.physical_timer_read(reg);
            self.set_reg(access.rt, value);
        } else {
            let value = self.reg(access.rt);
            self.machine.physical_timer_write(reg, value);
        }
    }

    /// A trapped common CPU interface register (`ICH_HCR_EL2.TC`, set where
    /// the hypervisor guards the binary point): emulated on the virtual CPU
    /// interface's state as `crate::devices::vgic::cpu_interface` says.
    /// Reads of `ICC_DIR_EL1` and writes of `ICC_RPR_EL1` read zero and do
    /// nothing.
    fn cpu_interface_access(&mut self, reg: CommonRegister, access: &SysRegAccess) {
        let shape = InterfaceShape::from_vtr(self.machine.ich_vtr());
        let vmcr = self.machine.ich_vmcr();
        let value = self.reg(access.rt);
        match (reg, access.read) {
            (CommonRegister::Ctlr, true) => {
                self.set_reg(
                    access.rt,
                    cpu_interface::read_ctlr(vmcr, shape, self.guest_cbpr),
                );
            }
            (CommonRegister::Ctlr, false) => {
                let (new, cbpr) = cpu_interface::write_ctlr(vmcr, value);
                self.machine.write_ich_vmcr(new);
                self.guest_cbpr = cbpr;
            }
            (CommonRegister::Pmr, true) => self.set_reg(access.rt, cpu_interface::read_pmr(vmcr)),
            (CommonRegister::Pmr, false) => self
                .machine
                .write_ich_vmcr(cpu_interface::write_pmr(vmcr, value, shape)),
            (CommonRegister::Rpr, true) => {
                let (aprs, count) = self.machine.active_priorities();
                let rpr = cpu_interface::read_rpr(&aprs[..count.max(1)], shape);
                self.set_reg(access.rt, rpr);
            }
            (CommonRegister::Dir, false) => {
                let Some(lrs) = self.lrs.as_mut() else {
                    return;
                };
                let outcome = cpu_interface::write_dir(lrs, vmcr, value);
                if let Deactivation::Listed {
                    physical: Some(pintid),
                } = outcome
                {
                    self.machine.clear_ppi_active(pintid);
                }
                // The next fold takes in the deactivation (or `EOIcount`).
                if outcome != Deactivation::Ignored {
                    self.needs_fill = true;
                }
            }
            (CommonRegister::Rpr, false) => {}
            (CommonRegister::Dir, true) => self.set_reg(access.rt, 0),
        }
    }

    /// A trapped set/way cache maintenance instruction (`HCR_EL2.TSW`, no
    /// FWB), converted as KVM's `kvm_set_way_flush`: the first one flushes
    /// all guest memory by address and traps the virtual-memory control
    /// registers, so turning the caches on or off flushes again.
    fn set_way_trap(&mut self) -> Result<(), StopReason> {
        self.bump(Counter::CmoSetwayTraps);
        if self.vm.fwb {
            // Not trapped with FWB; nothing to convert if it were.
            return Ok(());
        }
        if self.set_way.on_set_way() {
            self.flush_vm()?;
        }
        self.write_hcr();
        Ok(())
    }

    /// A trapped write to a virtual-memory control register (`HCR_EL2.TVM`):
    /// the value goes to the register; a write to `SCTLR_EL1` that turns the
    /// MMU and caches on or off flushes guest memory (KVM's
    /// `kvm_toggle_cache`) and, caches on, stops the trapping.
    fn vm_reg_write(&mut self, reg: VmReg, value: u64) -> Result<(), StopReason> {
        self.bump(Counter::CmoVmRegTraps);
        let old_sctlr = self.machine.sctlr_el1();
        self.machine.write_vm_reg(reg, value);
        if reg == VmReg::Sctlr {
            if self.set_way.on_sctlr_write(old_sctlr, value) {
                self.flush_vm()?;
            }
            self.write_hcr();
        }
        Ok(())
    }

    /// Cleans and invalidates every mapped page of guest RAM to the point of
    /// coherency, under the write side of the MMU lock (no break-before-make
    /// in flight, no unmap between a leaf's TLB flush and its cleaning; the
    /// walk changes no descriptor, so it owes no TLBI).
    fn flush_vm(&mut self) -> Result<(), StopReason> {
        let ram = self.vm.ram;
        let result = self.vm.stage2.write().flush_dcache(ram.start, ram.size());
        match result {
            Ok(_) => {
                self.bump(Counter::CmoFullFlushes);
                Ok(())
            }
            Err(e) => Err(StopReason::FlushGuestMemory(e)),
        }
    }
}

impl<M: VcpuMachine> Vcpu<M> {
    /// Loads `HCR_EL2` with the set/way tracking's `TVM`.
    pub(super) fn write_hcr(&mut self) {
        let tvm = if self.set_way.traps_vm_regs() {
            crate::stage2::cache_maint::hcr_tvm()
        } else {
            0
        };
        self.machine.write_hcr(self.hcr | tvm);
    }
}
