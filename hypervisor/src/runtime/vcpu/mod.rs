//! A vCPU on its physical CPU: the run loop and exit handling, over the
//! trait [`VcpuMachine`] for the CPU's registers (`arch` implements it at
//! EL2, the host tests with a fake).
//!
//! [`Vcpu::run`] has the machine load the VM's stage-2 and trap
//! configuration into this CPU's EL2 registers and reset the guest's EL1
//! state (MMU off, as PSCI and the boot protocol require), and then loops:
//! enter the guest, decode the exit by `ESR_EL2` class, handle it, enter
//! again. Handling never lets the guest take the hypervisor down: a RAM
//! access faults memory in, a device access is emulated, anything else gets
//! an abort injected (also an access that starts in a device's window and
//! runs past its end); a trapped instruction the hypervisor does not
//! emulate gets an undefined instruction injected; an unknown hypercall
//! gets `NOT_SUPPORTED`; only an exit nothing can make sense of stops the
//! VM, with a report. Injection works from every state an AArch64 EL1 guest
//! runs in: EL1h, EL1t, AArch64 EL0 and AArch32 EL0. Every log line a guest
//! can cause goes through the VM's rate-limited event log
//! (`Vm::log_event`), so no guest can flood the console or grow the
//! hypervisor's memory.
//!
//! The guest's EL1 system registers (and FP/SIMD state: the hypervisor is
//! soft-float) stay live in the CPU between exits because vCPU `n` never
//! leaves physical CPU `n`; only the general-purpose registers, PC and
//! PSTATE travel through [`GuestRegs`].
//!
//! Interrupts: the virtual GIC (`vgic`) is folded and refilled right before
//! an entry whenever the exit could have changed what the list registers
//! should hold (see `prepare_entry`), and folded before a GIC register
//! access; what an exit made deliverable to another vCPU is signalled with
//! a physical kick SGI to its CPU once the vgic lock is dropped. Physical
//! interrupts taken while the guest runs are IRQ exits (`HCR_EL2.IMO`): the
//! kick SGI and the maintenance interrupt only need the exit (the refill
//! follows), the PPI of either EL1 timer (virtual, physical) raises that
//! timer's vgic line and stays active at the host GIC (only its priority is
//! dropped) until the guest deactivates it through the hardware list
//! register that carries it (the guest's `CNTV_CTL_EL0`/`CNTP_CTL_EL0` are
//! never touched; the lines are re-sampled from them before each entry, and
//! the hypervisor deactivates a PPI the guest will not; see
//! `crate::devices::timer`), and the console UART's interrupt moves the
//! received bytes into the emulated PL011. The machine's GIC (a GICv3 or a
//! GICv2) is one interface to this code; GIC register accesses name the
//! accessing vCPU, which a GICv2's banked distributor needs.
//!
//! WFI and WFE are not trapped (`HCR_EL2.TWI`/`TWE` clear): the CPU halts
//! in the guest until a physical interrupt (a kick, a timer, the UART) or a
//! pending virtual interrupt wakes it. Each vCPU owns its CPU, so halting
//! the CPU is exactly what a waiting vCPU should do, with no exit and no
//! wake-up path to get wrong.
//!
//! Stage-2 faults map guest RAM read-write on data accesses and add execute
//! permission on the first instruction fetch (as KVM does), so instruction
//! cache maintenance covers only executed memory; in a slot that logs dirty
//! pages they map 4 KiB pages, reads read-only, and a write marks its page
//! (`stage2::fault`, `runtime::dirty_log`). Without FEAT_S2FWB the guest's
//! set/way cache maintenance is trapped (`HCR_EL2.TSW`) and turned into
//! flushes of guest memory by address, and while set/way is tracked the
//! virtual-memory control registers are trapped (`HCR_EL2.TVM`) so that the
//! guest turning its caches off or on flushes again (`cache_maint`).
//!
//! # Files
//!
//! This file holds the vCPU's state, its registers, and its halves of
//! `runtime::device_access` and `runtime::guest_call`; the rest is by
//! concern, each the orchestration around a pure decision in `crate::exit`:
//! `machine` (the trait and the register context), `load` (a start, and the
//! whole state captured and restored for a live migration), `run_loop`
//! (entry, exit dispatch, the migration throttle), `interrupts` (list registers, timers,
//! kicks, the host's interrupts, the pause), `aborts` (stage-2 data and
//! instruction aborts, fault in), `sysreg_access` (trapped system
//! registers, set/way and virtual-memory control register traps),
//! `injection` (exceptions delivered to the guest). Every handler returns
//! `Result<Flow, StopReason>` (or `Result<(), StopReason>`); nothing here
//! stops the VM: [`Vcpu::run`] returns the reason and
//! `runtime::vcpu_cycle` acts on it.

mod aborts;
mod injection;
mod interrupts;
mod load;
pub mod machine;
mod run_loop;
mod sysreg_access;

pub use machine::{ExitKind, GuestRegs, VcpuMachine};

use crate::devices::timer::TimerForward;
use crate::devices::vgic::VcpuSet;
use crate::exit::aarch32;
use crate::exit::esr::{DataAccess, fault_ipa, trapped_instruction_len};
use crate::exit::flow::{Flow, ListRegisterOp, StopReason};
use crate::runtime::collector_handles::CollectorHandles;
use crate::runtime::device_access::{self, AccessingVcpu};
use crate::runtime::guest_call::{self, CallingVcpu};
use crate::runtime::vcpu_cycle::CpuVcpu;
use crate::runtime::vm_instance::Vm;
use crate::stage2::cache_maint::SetWayTracker;
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;
use crate::vm::exit_profile::ExitClass;
use crate::vm::power::BootRequest;
use crossbeam_epoch::LocalHandle;
use memslot::VcpuSlotCache;
use pgtable::{FAULT_CACHE_PAGES, MmuCpu, PageCache};

/// One vCPU, pinned to the physical CPU that runs it.
pub struct Vcpu<M: VcpuMachine> {
    /// The CPU's registers and GIC interface.
    machine: M,
    vm: &'static Vm<M::Hw>,
    index: usize,
    /// The registers the guest entry and exit move.
    regs: GuestRegs,
    epoch: LocalHandle,
    /// Handles on the collectors of the VMs its devices write into (the
    /// frames it sends), registered once each.
    collector_handles: CollectorHandles,
    mmu_cpu: MmuCpu,
    slot_cache: VcpuSlotCache,
    page_cache: PageCache,
    /// This CPU's list registers (none without a GICv3 CPU interface or a
    /// GICv2 with the virtualization extensions).
    lrs: Option<M::ListRegisters>,
    /// Forwarding state of each EL1 timer (`TimerId::index` order): host
    /// PPI active, line as last given to the vgic.
    timers: [TimerForward; 2],
    /// The guest's `ICC_CTLR_EL1.CBPR` where the hypervisor guards the
    /// binary point (`VCBPR` itself stays set).
    guest_cbpr: bool,
    /// vCPUs to kick once the vgic lock is dropped.
    kicks: VcpuSet,
    /// The list registers must be folded and refilled before the next entry.
    needs_fill: bool,
    /// `HCR_EL2` as loaded, without the set/way tracking's `TVM`.
    hcr: u64,
    /// Set/way tracking (no FWB): whether `HCR_EL2.TVM` is set.
    set_way: SetWayTracker,
    /// The class of the exit being handled, for the VM's exit profile.
    exit_class: ExitClass,
    /// While a migration throttles its VM: the counter when this vCPU
    /// last went back to the guest after a hold (0: not throttled).
    throttle_since: u64,
}

impl<M: VcpuMachine> Vcpu<M> {
    /// vCPU `index` of `vm`, to run on the CPU `machine` is.
    pub fn new(machine: M, vm: &'static Vm<M::Hw>, index: usize) -> Result<Self, StopReason> {
        let mmu_cpu = match vm.stage2.register() {
            Ok(cpu) => cpu,
            Err(e) => return Err(StopReason::Stage2Register(e)),
        };
        // This vCPU lives on the calling CPU, whose list registers these are.
        let lrs = machine.list_registers(vm);
        Ok(Self {
            machine,
            vm,
            index,
            regs: GuestRegs::default(),
            epoch: vm.collector.register(),
            collector_handles: CollectorHandles::new(),
            mmu_cpu,
            slot_cache: VcpuSlotCache::new(),
            page_cache: PageCache::with_capacity(FAULT_CACHE_PAGES),
            lrs,
            timers: [TimerForward::new(); 2],
            guest_cbpr: false,
            kicks: VcpuSet::EMPTY,
            needs_fill: true,
            hcr: crate::sysreg_values::HCR_EL2_GUEST,
            set_way: SetWayTracker::new(),
            exit_class: ExitClass::Other,
            throttle_since: 0,
        })
    }

    /// The vCPU's index in its VM.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The registers as the last exit left them.
    pub fn regs(&self) -> &GuestRegs {
        &self.regs
    }

    /// The registers, to set before an entry.
    pub fn regs_mut(&mut self) -> &mut GuestRegs {
        &mut self.regs
    }

    /// The CPU the vCPU runs on.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// The CPU the vCPU runs on, to change.
    pub fn machine_mut(&mut self) -> &mut M {
        &mut self.machine
    }

    /// This CPU's list registers, if it has any.
    pub fn list_registers(&self) -> Option<&M::ListRegisters> {
        self.lrs.as_ref()
    }

    /// Adds one to the VM's `counter`.
    fn bump(&self, counter: Counter) {
        self.vm.counters.bump(counter);
    }

    /// The guest's general-purpose register `r` (31: the zero register).
    fn reg(&self, r: u8) -> u64 {
        if r == 31 { 0 } else { self.regs.x[r as usize] }
    }

    /// Sets the guest's general-purpose register `r` (31: discarded).
    fn set_reg(&mut self, r: u8, value: u64) {
        if r != 31 {
            self.regs.x[r as usize] = value;
        }
    }

    /// The IPA of the abort being handled (`HPFAR_EL2` and `FAR_EL2`).
    fn ipa(&self) -> u64 {
        fault_ipa(self.regs.hpfar, self.regs.far)
    }

    /// Logs a line about a guest-driven event through the VM's rate limit.
    fn log_event(&self, event: Event, level: log::Level, args: core::fmt::Arguments<'_>) {
        self.vm.log_event(self.index, event, level, args);
    }

    /// Steps the guest over the instruction that trapped (2 or 4 bytes, from
    /// `ESR_EL2.IL`: a guest's AArch32 T32 code has 16-bit instructions); in
    /// AArch32 the PC stays 32 bits wide and an IT block advances.
    fn skip_trapped_instruction(&mut self) {
        let pc = self.regs.pc + trapped_instruction_len(self.regs.esr);
        if aarch32::is_aarch32(self.regs.pstate) {
            self.regs.pc = pc & u64::from(u32::MAX);
            self.regs.pstate = aarch32::it_advance(self.regs.pstate);
        } else {
            self.regs.pc = pc;
        }
    }

    /// A guest access to the emulated UART at `offset` in its window.
    fn uart_access(
        &mut self,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::uart_access(self, write, access, offset)
    }

    /// A guest access to the VM's virtio-mmio device `device`.
    fn virtio_access(
        &mut self,
        device: u8,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::virtio_access(self, device, write, access, offset)
    }

    /// A guest access to a passed-through device's forwarded window.
    fn passed_access(
        &mut self,
        write: bool,
        access: DataAccess,
        ipa: u64,
    ) -> Result<Flow, StopReason> {
        crate::runtime::passed_devices::forwarded_access(self, write, access, ipa)
    }

    /// A guest access to the virtual GIC's distributor or redistributors.
    fn gic_access(
        &mut self,
        write: bool,
        access: DataAccess,
        ipa: u64,
    ) -> Result<Flow, StopReason> {
        device_access::gic_access(self, write, access, ipa)
    }

    /// A guest access to the virtual GIC's ITS, at `offset` in its frames.
    fn its_access(
        &mut self,
        write: bool,
        access: DataAccess,
        offset: u64,
    ) -> Result<Flow, StopReason> {
        device_access::its_access(self, write, access, offset)
    }

    /// A hypervisor or secure-monitor call.
    fn guest_call(&mut self) -> Result<Flow, StopReason> {
        guest_call::guest_call(self)
    }
}

impl<M: VcpuMachine> AccessingVcpu<M::Hw> for Vcpu<M> {
    fn vm(&self) -> &'static Vm<M::Hw> {
        self.vm
    }

    fn index(&self) -> usize {
        self.index
    }

    fn epoch(&self) -> &LocalHandle {
        &self.epoch
    }

    fn collector_handles(&self) -> &CollectorHandles {
        &self.collector_handles
    }

    fn reg(&self, r: u8) -> u64 {
        Vcpu::reg(self, r)
    }

    fn set_reg(&mut self, r: u8, value: u64) {
        Vcpu::set_reg(self, r, value);
    }

    fn fold_for_refill(&mut self) -> Result<(), StopReason> {
        self.fold()?;
        self.needs_fill = true;
        Ok(())
    }

    fn absorb(&mut self, kicks: VcpuSet) {
        Vcpu::absorb(self, kicks);
    }

    fn update_uart_line(&mut self) -> Result<(), StopReason> {
        Vcpu::update_uart_line(self)
    }

    fn skip_trapped_instruction(&mut self) {
        Vcpu::skip_trapped_instruction(self);
    }
}

impl<M: VcpuMachine> CallingVcpu<M::Hw> for Vcpu<M> {
    fn vm(&self) -> &'static Vm<M::Hw> {
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
        self.machine.control_call(self.vm, &self.epoch, regs)
    }

    fn unload_list_registers(&mut self) -> Result<(), StopReason> {
        self.unload(ListRegisterOp::Unload)
    }
}

impl<M: VcpuMachine> CpuVcpu for Vcpu<M> {
    fn run(&mut self, boot: BootRequest) -> Result<Flow, StopReason> {
        Vcpu::run(self, boot)
    }

    fn handle_interrupts_while_off(&mut self) -> Result<(), StopReason> {
        Vcpu::handle_interrupts_while_off(self)
    }

    fn quiesce_for_halt(&mut self) {
        Vcpu::quiesce_for_halt(self);
    }

    fn end_halt(&mut self) {
        Vcpu::end_halt(self);
    }
}
