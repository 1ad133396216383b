//! What a vCPU's exit handling needs of the CPU it runs on: the
//! registers the entry and exit path moves ([`GuestRegs`]), why the guest
//! stopped ([`ExitKind`]), and [`VcpuMachine`], the guest's EL1 and EL2
//! registers, the host GIC's CPU interface and the guest entry itself,
//! which `arch` implements with `mrs`/`msr` and its exception vectors and
//! the host tests with a fake (`runtime::tests::vcpu_exits`).
//!
//! Every method is one access (or a short fixed sequence) of the machine;
//! the decisions stay in `runtime::vcpu`, and the trait is used by static
//! dispatch only, so the exit path costs the same register accesses as if
//! it named them itself.

use crate::control::abi::registers::ParkedRegisters;
use crate::devices::timer::PhysicalTimerReg;
use crate::devices::vgic::ListRegisters;
use crate::exit::flow::StopReason;
use crate::exit::inject::InjectedException;
use crate::runtime::Hardware;
use crate::runtime::vm_instance::Vm;
use crate::stage2::cache_maint::VmReg;
use crate::vm::vcpu_state::VcpuState;
use crate::vocabulary::timers::TimerId;
use crossbeam_epoch::LocalHandle;

/// The register state of a vCPU that the entry/exit path moves (the
/// exception vectors address its fields by offset: `repr(C)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GuestRegs {
    /// `x0..x30`.
    pub x: [u64; 31],
    /// Guest PC (`ELR_EL2`).
    pub pc: u64,
    /// Guest PSTATE (`SPSR_EL2`).
    pub pstate: u64,
    /// `ESR_EL2` at the last exit.
    pub esr: u64,
    /// `FAR_EL2` at the last exit.
    pub far: u64,
    /// `HPFAR_EL2` at the last exit.
    pub hpfar: u64,
}

impl GuestRegs {
    /// The registers the control interface may read and write while the
    /// vCPU is parked.
    pub fn parked(&self) -> ParkedRegisters {
        ParkedRegisters {
            x: self.x,
            pc: self.pc,
            pstate: self.pstate,
        }
    }

    /// Takes back the parked registers (as the control interface left them).
    pub fn unpark(&mut self, parked: &ParkedRegisters) {
        self.x = parked.x;
        self.pc = parked.pc;
        self.pstate = parked.pstate;
    }
}

/// Why the guest stopped running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// A synchronous exception (trap or abort): see `esr`.
    Sync,
    /// A physical IRQ.
    Irq,
    /// A physical FIQ.
    Fiq,
    /// An SError.
    SError,
}

impl ExitKind {
    /// The exit of the exception vectors' code 0..=3.
    pub fn from_code(code: u64) -> Self {
        match code {
            0 => Self::Sync,
            1 => Self::Irq,
            2 => Self::Fiq,
            3 => Self::SError,
            _ => unreachable!("the vectors pass exit codes 0..=3, not {code}"),
        }
    }
}

/// The CPU a vCPU runs on, as its exit handling reaches it. The vCPU
/// never leaves its CPU, so the guest's EL1 registers read and written here
/// are live in the CPU between exits.
pub trait VcpuMachine: Sized {
    /// The machine the VM runtime runs on.
    type Hw: Hardware;
    /// This CPU's list registers.
    type ListRegisters: ListRegisters;
    /// An acknowledged host interrupt, as its end of interrupt needs it.
    type Acknowledged: Copy;

    /// This CPU's list registers for a vCPU of `vm` (none without a usable
    /// virtual CPU interface).
    fn list_registers(&self, vm: &Vm<Self::Hw>) -> Option<Self::ListRegisters>;
    /// Loads vCPU `index` of `vm`'s EL2 configuration (`HCR_EL2` = `hcr`)
    /// into this CPU and resets the guest's EL1 state there, its timers
    /// off; with list registers (`lrs`), the virtual CPU interface too.
    fn load(
        &mut self,
        vm: &Vm<Self::Hw>,
        index: usize,
        hcr: u64,
        lrs: Option<&Self::ListRegisters>,
    );
    /// Whether the common CPU interface registers trap (`ICH_HCR_EL2.TC`)
    /// with `lrs`: the binary point is guarded
    /// (`crate::devices::vgic::cpu_interface`).
    fn guards_binary_point(&self, lrs: &Self::ListRegisters) -> bool;
    /// Whether the virtual CPU interface's state behind `lrs` (GICv3:
    /// `ICH_VMCR_EL2`, the active priorities) travels with a migrated vCPU.
    fn migrates_cpu_interface(&self, lrs: Option<&Self::ListRegisters>) -> bool;
    /// The state of a parked vCPU of `vm` that lives in this CPU (EL1
    /// registers, timers, vector and tag registers, the virtual CPU
    /// interface where it travels); not the general-purpose registers.
    fn capture_registers(&self, vm: &Vm<Self::Hw>, lrs: Option<&Self::ListRegisters>) -> VcpuState;
    /// Restores what [`VcpuMachine::capture_registers`] took of `state` for
    /// vCPU `index` of `vm`, right after [`VcpuMachine::load`]; a vector
    /// length the state cannot be restored at stops the VM.
    fn restore_registers(
        &mut self,
        vm: &Vm<Self::Hw>,
        index: usize,
        lrs: Option<&Self::ListRegisters>,
        state: &VcpuState,
    ) -> Result<(), StopReason>;
    /// Runs the guest from `regs` until it exits, leaving the exit's state in
    /// `regs`.
    ///
    /// # Safety
    ///
    /// [`VcpuMachine::load`] set up this CPU for the vCPU (stage 2, traps),
    /// so the guest reaches only its own memory.
    unsafe fn enter(&mut self, regs: &mut GuestRegs) -> ExitKind;
    /// Writes `HCR_EL2`.
    fn write_hcr(&mut self, value: u64);

    /// The guest's `VBAR_EL1`.
    fn vbar_el1(&self) -> u64;
    /// The guest's `SCTLR_EL1`.
    fn sctlr_el1(&self) -> u64;
    /// Writes the guest's `ESR_EL1`, `FAR_EL1` (when given), `ELR_EL1` and
    /// `SPSR_EL1` for `exception`.
    fn deliver_exception(&mut self, exception: &InjectedException);
    /// A trapped write of `value` to virtual-memory control register `reg`.
    fn write_vm_reg(&mut self, reg: VmReg, value: u64);
    /// The CPU's ID register `op0=3, op1=0, CRn=0, crm, op2`; `None` for
    /// one outside the ID space.
    fn id_register(&self, crm: u8, op2: u8) -> Option<u64>;
    /// The guest's `CNTV_CTL_EL0` or `CNTP_CTL_EL0`.
    fn timer_ctl(&self, timer: TimerId) -> u64;
    /// Reads the guest's EL1 physical timer register `reg`.
    fn physical_timer_read(&self, reg: PhysicalTimerReg) -> u64;
    /// Writes the guest's EL1 physical timer register `reg` (then a
    /// context synchronization).
    fn physical_timer_write(&mut self, reg: PhysicalTimerReg, value: u64);
    /// Turns both of the guest's timers off (`CNT*_CTL_EL0` = 0).
    fn stop_guest_timers(&mut self);

    /// `ICH_VTR_EL2`.
    fn ich_vtr(&self) -> u64;
    /// `ICH_VMCR_EL2`.
    fn ich_vmcr(&self) -> u64;
    /// Writes `ICH_VMCR_EL2`.
    fn write_ich_vmcr(&mut self, value: u64);
    /// The active-priority registers of both groups OR-ed together, and
    /// how many of them are implemented.
    fn active_priorities(&self) -> ([u32; 4], usize);

    /// Whether the host GIC is driven.
    fn gic_is_up(&self) -> bool;
    /// The host GIC's maintenance interrupt.
    fn maintenance_intid(&self) -> u32;
    /// The host PPIs of the guest's timers, in [`TimerId::index`] order.
    fn timer_intids(&self) -> [u32; 2];
    /// Acknowledges this CPU's highest-priority pending interrupt: its
    /// INTID (1020..=1023: none) and what its end needs.
    fn acknowledge(&mut self) -> (u32, Self::Acknowledged);
    /// Drops the priority of and deactivates an acknowledged interrupt.
    fn end_of_interrupt(&mut self, ack: Self::Acknowledged);
    /// Only drops the priority of an acknowledged interrupt.
    fn drop_priority(&mut self, ack: Self::Acknowledged);
    /// Clears the active state of this CPU's PPI `intid`.
    fn clear_ppi_active(&mut self, intid: u32);
    /// Clears the active state of `timer`'s host PPI.
    fn deactivate_timer(&mut self, timer: TimerId);
    /// Masks or unmasks `timer`'s host PPI.
    fn set_timer_masked(&mut self, timer: TimerId, masked: bool);
    /// Enables or disables this CPU's PPI `intid`.
    fn set_ppi_enabled(&mut self, intid: u32, enabled: bool);

    /// The host console UART's received bytes (its interrupt).
    fn console_input(&mut self);
    /// Whether `intid` is the hypervisor console's poll timer.
    fn is_console_poll_timer(&self, intid: u32) -> bool;
    /// The hypervisor console's poll timer fired.
    fn console_poll_tick(&mut self);

    /// Answers a control VM's control call (`regs`: `x0..x7`) from `vm`,
    /// returning `x0..x3`.
    fn control_call(
        &mut self,
        vm: &'static Vm<Self::Hw>,
        epoch: &LocalHandle,
        regs: &[u64; 8],
    ) -> [u64; 4];
}
