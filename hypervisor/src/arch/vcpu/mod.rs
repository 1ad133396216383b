//! A vCPU on its physical CPU: EL2 setup, the run loop and exit handling.
//!
//! [`Vcpu::run`] loads the VM's stage-2 and trap configuration into this CPU's
//! EL2 registers, resets the guest's EL1 state (MMU off, as PSCI and the boot
//! protocol require), and then loops: enter the guest, decode the exit by
//! `ESR_EL2` class, handle it, enter again. Handling never lets the guest take
//! the hypervisor down: a RAM access faults memory in, a device access is
//! emulated, anything else gets an abort injected (also an access that starts
//! in a device's window and runs past its end); a trapped instruction the
//! hypervisor does not emulate gets an undefined instruction injected; an
//! unknown hypercall gets `NOT_SUPPORTED`; only an exit nothing can make sense
//! of stops the VM, with a report. Injection works from every state an
//! AArch64 EL1 guest runs in: EL1h, EL1t, AArch64 EL0 and AArch32 EL0. Every
//! log line a guest can cause goes through the VM's rate-limited event log
//! (`Vm::log_event`), so no guest can flood the console or grow the
//! hypervisor's memory.
//!
//! The guest's EL1 system registers (and FP/SIMD state: the hypervisor is
//! soft-float) stay live in the CPU between exits because vCPU `n` never
//! leaves physical CPU `n`; only the general-purpose registers, PC and PSTATE
//! travel through [`GuestRegs`].
//!
//! Interrupts: the virtual GIC (`vgic`) is folded and refilled right before
//! an entry whenever the exit could have changed what the list registers
//! should hold (see `prepare_entry`), and folded before a GIC register
//! access; what an exit made deliverable to another vCPU is signalled with a
//! physical kick SGI to its CPU once the vgic lock is dropped. Physical
//! interrupts taken while the guest runs are IRQ exits (`HCR_EL2.IMO`): the
//! kick SGI and the maintenance interrupt only need the exit (the refill
//! follows), the PPI of either EL1 timer (virtual, physical) raises that
//! timer's vgic line and is masked at the host GIC while the line stays
//! high (the guest's `CNTV_CTL_EL0`/`CNTP_CTL_EL0` are never touched; the
//! lines are re-sampled from them before each entry and a PPI unmasked once
//! its line drops: the guest's EOI of the level interrupt, listed with EOI
//! maintenance, guarantees that exit; see `crate::devices::timer`), and the console
//! UART's interrupt moves the received bytes into the emulated PL011.
//! The host GIC is reached through `gic` only (a GICv3 or a GICv2 behind
//! one interface, the list registers behind `gic::HostListRegisters`), so
//! this run loop is the same for both; GIC register accesses name the
//! accessing vCPU, which a GICv2's banked distributor needs.
//!
//! WFI and WFE are not trapped (`HCR_EL2.TWI`/`TWE` clear): the CPU halts in
//! the guest until a physical interrupt (a kick, a timer, the UART)
//! or a pending virtual interrupt wakes it. Each vCPU owns its CPU, so halting
//! the CPU is exactly what a waiting vCPU should do, with no exit and no
//! wake-up path to get wrong.
//!
//! Stage-2 faults map guest RAM read-write on data accesses and add execute
//! permission on the first instruction fetch (as KVM does), so instruction
//! cache maintenance covers only executed memory. Without FEAT_S2FWB the
//! guest's set/way cache maintenance is trapped (`HCR_EL2.TSW`) and turned
//! into flushes of guest memory by address, and while set/way is tracked the
//! virtual-memory control registers are trapped (`HCR_EL2.TVM`) so that the
//! guest turning its caches off or on flushes again (`cache_maint`).

use crate::arch::boot::exceptions::{ExitKind, GuestRegs, enter_guest};
use crate::arch::cpu::features::local_features;
use crate::arch::cpu::sysreg;
use crate::arch::drivers::console;
use crate::arch::drivers::gic;
use crate::arch::stage2::FrameMemory;
use crate::arch::vm::{GuestUart, Vm};
use crate::devices::timer::{TimerForward, TimerId, timer_line};
use crate::devices::vgic::{SgiGroup, VcpuSet};
use crate::drivers::gic::HostIrq;
use crate::exit::aarch32;
use crate::exit::esr::{
    DataAbort, DataAccess, ExceptionClass, FaultKind, InstructionAbort, SysRegAccess, fault_ipa,
    iss, trapped_instruction_len,
};
use crate::exit::hypercall::{GuestCall, NOT_SUPPORTED, SMCCC_VERSION_1_1};
use crate::exit::inject::{self, GuestState, InjectKind};
use crate::exit::mmio;
use crate::exit::mmio::{DeviceId, MmioMiss};
use crate::exit::psci::{self, BootRequest, PsciCall, PsciOutcome};
use crate::exit::sysreg::{self as sysreg_trap, SysRegPolicy};
use crate::stage2::cache_maint::{self, SetWayTracker, VmReg};
use crate::stage2::fault::{self, SlotView};
use crate::vm::counters::Counter;
use crate::vm::event_log::Event;
use crate::vm::layout::vcpu_mpidr;
use crate::{read_sysreg, write_sysreg};
use alloc::format;
use crossbeam_epoch::LocalHandle;
use memslot::VcpuSlotCache;
use pgtable::{Attributes, FAULT_CACHE_PAGES, FaultMapping, MmuCpu, PageCache, Perms, PhysAddr};

/// `HCR_EL2` for a non-VHE hypervisor running AArch64 EL1 guests: stage 2
/// (VM), set/way invalidation as clean+invalidate (SWIO), physical FIQ/IRQ/
/// SError to EL2 (FMO/IMO/AMO), trap the ID registers (TID3: the guest sees
/// them through `sysreg_trap::guest_id_value`), trap SMC (TSC), EL1 is
/// AArch64 (RW), do not
/// trap pointer authentication (APK/API). WFI/WFE run natively (see the
/// module docs). The guest's local TLB and cache maintenance and barriers
/// stay local (no FB, no BSU upgrade): a vCPU never leaves its CPU, so what
/// it cached elsewhere cannot exist, exactly as on real hardware.
const HCR_EL2_GUEST: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 18)
    | (1 << 19)
    | (1 << 31)
    | (1 << 40)
    | (1 << 41);
/// `HCR_EL2.FWB`: stage 2 forces the memory type (FEAT_S2FWB).
const HCR_EL2_FWB: u64 = 1 << 46;
// Without FWB, `HCR_EL2.TSW` traps set/way maintenance and `HCR_EL2.TVM` the
// virtual-memory control registers while set/way is tracked (`cache_maint`).
/// `CPTR_EL2` (non-VHE): RES1 bits only, so FP/SIMD and SVE are not trapped.
const CPTR_EL2_NO_TRAPS: u64 = 0x32ff;
/// `CPTR_EL2.TSM` (bit 12, RES1 without FEAT_SME): trap SME.
const CPTR_EL2_TSM: u64 = 1 << 12;
/// `HFGRTR_EL2`/`HFGWTR_EL2` nSMPRI_EL1 (54) and nTPIDR2_EL0 (55): set means
/// not trapped.
const FGT_SME_NEGATIVE: u64 = (1 << 54) | (1 << 55);
/// `ZCR_EL2`/`SMCR_EL2` `LEN` asking for the longest vector the CPU has.
const VECTOR_LEN_MAX: u64 = 0xf;
/// `CNTHCTL_EL2.EL1PCTEN` (non-VHE): EL1 and EL0 reads of `CNTPCT_EL0` are
/// not trapped.
const CNTHCTL_EL2_EL1PCTEN: u64 = 1 << 0;
/// `CNTHCTL_EL2.EL1PCEN` (non-VHE): EL1 and EL0 accesses to the EL1 physical
/// timer (`CNTP_*_EL0`) are not trapped.
const CNTHCTL_EL2_EL1PCEN: u64 = 1 << 1;
/// `CNTHCTL_EL2` while a guest runs: both timers and both counters belong to
/// the guest, untrapped (see `crate::devices::timer`). Every other field is clear:
/// no event stream, and `ECV` (bit 12) clear so that `CNTPOFF_EL2` is not
/// applied on a CPU with FEAT_ECV: the physical offset is zero, like
/// `CNTVOFF_EL2`, and the guest's two counters read the same value.
const CNTHCTL_EL2_GUEST: u64 = CNTHCTL_EL2_EL1PCTEN | CNTHCTL_EL2_EL1PCEN;
/// `SCTLR_EL1` reset value: RES1 bits, MMU and caches off.
const SCTLR_EL1_RESET: u64 = 0x30d0_0800;

/// The guest's `CNTV_CTL_EL0` or `CNTP_CTL_EL0` (live in this CPU: the
/// vCPU never leaves it).
fn timer_ctl(timer: TimerId) -> u64 {
    match timer {
        TimerId::Virtual => read_sysreg!(cntv_ctl_el0),
        TimerId::Physical => read_sysreg!(cntp_ctl_el0),
    }
}

/// Why an abort is injected into the guest (the log line says it).
#[derive(Clone, Copy)]
enum AbortCause {
    /// No memslot and no device window holds the address.
    NoMemoryOrDevice,
    /// The access starts in a device's window and does not end in it.
    Straddles {
        /// The device.
        device: DeviceId,
        /// Access size in bytes.
        size: u8,
        /// End of the device's window.
        window_end: u64,
    },
    /// A device access without an instruction syndrome (e.g. a load/store
    /// pair) cannot be emulated without decoding the instruction.
    NoSyndrome(DeviceId),
}

impl core::fmt::Display for AbortCause {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            AbortCause::NoMemoryOrDevice => write!(f, "is outside every memslot and device"),
            AbortCause::Straddles {
                device,
                size,
                window_end,
            } => write!(
                f,
                "starts an access of {size} bytes that runs past the end of the {} window at \
                 {window_end:#x}",
                device_name(device)
            ),
            AbortCause::NoSyndrome(device) => write!(
                f,
                "is in the {} window, but an access without instruction syndrome cannot be \
                 emulated",
                device_name(device)
            ),
        }
    }
}

fn device_name(device: DeviceId) -> &'static str {
    match device {
        DeviceId::Uart => "UART",
        DeviceId::Gic => "GIC",
    }
}

/// What the run loop does after an exit.
enum Flow {
    /// Enter the guest again.
    Resume,
    /// The vCPU turned itself off (PSCI `CPU_OFF`).
    Off,
}

/// One vCPU, pinned to the physical CPU that runs it.
pub struct Vcpu {
    vm: &'static Vm,
    index: usize,
    regs: GuestRegs,
    epoch: LocalHandle,
    mmu_cpu: MmuCpu,
    slot_cache: VcpuSlotCache,
    page_cache: PageCache,
    /// This CPU's list registers (none without a GICv3 CPU interface or a
    /// GICv2 with the virtualization extensions).
    lrs: Option<gic::HostListRegisters>,
    /// Forwarding state of each EL1 timer ([`TimerId::index`] order): host
    /// PPI masked, line as last given to the vgic.
    timers: [TimerForward; 2],
    /// vCPUs to kick once the vgic lock is dropped.
    kicks: VcpuSet,
    /// The list registers must be folded and refilled before the next entry.
    needs_fill: bool,
    /// `HCR_EL2` as loaded, without the set/way tracking's `TVM`.
    hcr: u64,
    /// Set/way tracking (no FWB): whether `HCR_EL2.TVM` is set.
    set_way: SetWayTracker,
}

impl Vcpu {
    /// vCPU `index` of `vm`, to run on the calling CPU.
    pub fn new(vm: &'static Vm, index: usize) -> Self {
        let mmu_cpu = match vm.stage2.register() {
            Ok(cpu) => cpu,
            Err(e) => vm.stop(index, &format!("stage-2 MMU registration: {e}")),
        };
        Self {
            vm,
            index,
            regs: GuestRegs::default(),
            epoch: vm.collector.register(),
            mmu_cpu,
            slot_cache: VcpuSlotCache::new(),
            page_cache: PageCache::with_capacity(FAULT_CACHE_PAGES),
            // This vCPU lives on the calling CPU, whose list registers these are.
            lrs: gic::list_registers(vm.gic_sysregs),
            timers: [TimerForward::new(); 2],
            kicks: VcpuSet::EMPTY,
            needs_fill: true,
            hcr: HCR_EL2_GUEST,
            set_way: SetWayTracker::new(),
        }
    }

    /// Before an entry: re-samples both timer lines (the vgic hears of a
    /// line only when it moved), refills the list registers when something
    /// could have changed what they should hold, then kicks the vCPUs the
    /// exit made something deliverable to.
    ///
    /// A refill is needed after an IRQ exit (a kick, the maintenance
    /// interrupt, the timer), a GIC register access, a vgic change that named
    /// this vCPU, and a load. Otherwise the list registers still hold the
    /// best interrupts: whatever the guest did with them since the last fill
    /// (acknowledge, EOI) is folded back at the next fill, a level interrupt's
    /// EOI raises the maintenance interrupt, and another vCPU that pends
    /// something here kicks this CPU.
    fn prepare_entry(&mut self) {
        if self.lrs.is_none() {
            return;
        }
        for timer in TimerId::ALL {
            let line = timer_line(timer_ctl(timer));
            if let Some(level) = self.timers[timer.index()].sample(line) {
                self.set_timer_line(timer, level);
            }
        }
        if self.needs_fill
            && let Some(lrs) = self.lrs.as_mut()
        {
            let result = self.vm.vgic.lock().fill(self.index, lrs);
            if let Err(e) = result {
                self.stop(&format!("list register fill: {e:?}"));
            }
            self.needs_fill = false;
        }
        for timer in TimerId::ALL {
            if self.timers[timer.index()].unmask_if_low() {
                gic::set_timer_masked(timer, false);
            }
        }
        self.send_kicks();
    }

    /// Gives the vgic `timer`'s line level (its PPI on this vCPU).
    fn set_timer_line(&mut self, timer: TimerId, level: bool) {
        let result = self
            .vm
            .vgic
            .lock()
            .set_ppi_level(self.index, timer.guest_intid(), level);
        match result {
            Ok(kicks) => self.absorb(kicks),
            Err(e) => self.stop(&format!("{} timer line: {e:?}", timer.name())),
        }
    }

    /// Copies the list registers back into the vgic (before a GIC register
    /// access reads or changes the model).
    fn fold(&mut self) {
        let Some(lrs) = self.lrs.as_mut() else {
            return;
        };
        let result = self.vm.vgic.lock().fold(self.index, lrs);
        if let Err(e) = result {
            self.stop(&format!("list register fold: {e:?}"));
        }
    }

    /// Takes the vCPUs a vgic operation says to kick; this vCPU among them
    /// means its own list registers need a refill.
    fn absorb(&mut self, kicks: VcpuSet) {
        if kicks.contains(self.index) {
            self.needs_fill = true;
        }
        self.kicks = self.kicks.union(kicks);
    }

    /// Kicks every CPU whose vCPU has something new (not this one: it
    /// refills before its next entry anyway).
    fn send_kicks(&mut self) {
        let kicks = core::mem::take(&mut self.kicks).without(self.index);
        for vcpu in kicks.iter() {
            gic::kick(vcpu);
        }
    }

    /// Drives the emulated PL011's interrupt line from its state; the vgic
    /// hears of it only when the level moved (the UART lock is held across,
    /// so vCPUs cannot reorder their updates; the vgic lock nests inside it).
    fn update_uart_line(&mut self) {
        let mut uart = self.vm.uart.lock();
        let level = uart.device.interrupt_pending();
        if uart.irq_level == level {
            return;
        }
        uart.irq_level = level;
        let result = self
            .vm
            .vgic
            .lock()
            .set_spi_level(self.vm.uart_intid(), level);
        drop(uart);
        match result {
            Ok(kicks) => self.absorb(kicks),
            Err(e) => self.stop(&format!("UART interrupt line: {e:?}")),
        }
    }

    /// While the vCPU is off: handles what is pending for this CPU (the
    /// console's bytes still reach the PL011; a fired timer is masked until
    /// the next load), so that waiting for a wake-up does not
    /// end at once.
    pub fn handle_interrupts_while_off(&mut self) {
        if gic::is_up() {
            self.host_interrupts();
        }
    }

    /// Runs the vCPU from `boot` until it turns itself off.
    pub fn run(&mut self, boot: BootRequest) {
        self.load(boot);
        loop {
            if self.vm.is_stopping() {
                crate::arch::boot::firmware::halt();
            }
            self.prepare_entry();
            // SAFETY: `load` set this CPU's stage-2 translation and traps for
            // this VM, so the guest reaches only its own memory.
            let kind = unsafe { enter_guest(&mut self.regs) };
            let flow = self.handle_exit(kind);
            self.send_kicks();
            match flow {
                Flow::Resume => {}
                Flow::Off => return,
            }
        }
    }

    /// Loads the VM's EL2 configuration and resets the guest's EL1 state.
    fn load(&mut self, boot: BootRequest) {
        let vm = self.vm;
        let hcr = HCR_EL2_GUEST
            | if vm.fwb { HCR_EL2_FWB } else { 0 }
            | cache_maint::hcr_trap_bits(vm.fwb);
        self.hcr = hcr;
        self.set_way = SetWayTracker::new();
        let dfr0 = read_sysreg!(id_aa64dfr0_el1);
        let pmu = matches!((dfr0 >> 8) & 0xf, 1..=0xe);
        let mdcr = if pmu {
            (read_sysreg!(pmcr_el0) >> 11) & 0x1f
        } else {
            0
        };
        let midr = read_sysreg!(midr_el1);
        // Which EL2 registers exist is this CPU's own business (a big.LITTLE
        // machine may differ), not the system-wide minimum.
        let features = local_features();
        let cptr = if features.sme {
            CPTR_EL2_NO_TRAPS & !CPTR_EL2_TSM
        } else {
            CPTR_EL2_NO_TRAPS
        };
        // ICH_VTR_EL2.PREbits + 1 preemption bits: 5 need one active-priority
        // register per group, 6 two, 7 four.
        let preemption_bits = if matches!(self.lrs, Some(gic::HostListRegisters::V3(_))) {
            ((read_sysreg!(ich_vtr_el2) >> 26) & 7) + 1
        } else {
            5
        };
        // SAFETY: these EL2 registers configure how EL1/EL0 run; nothing runs
        // at EL1 on this CPU now. The stage-2 root is the VM's live table.
        unsafe {
            write_sysreg!(vtcr_el2, vm.vtcr);
            write_sysreg!(vttbr_el2, vm.vttbr);
            write_sysreg!(hcr_el2, hcr);
            write_sysreg!(vpidr_el2, midr);
            write_sysreg!(vmpidr_el2, vcpu_mpidr(self.index));
            write_sysreg!(cptr_el2, cptr);
            core::arch::asm!("isb", options(nostack, preserves_flags));
            // The guest may use SVE and SME at the CPU's longest vector length
            // (their registers stay in the CPU: vCPUs are pinned).
            if features.sve {
                write_sysreg!(s3_4_c1_c2_0, VECTOR_LEN_MAX); // ZCR_EL2
            }
            if features.sme {
                write_sysreg!(s3_4_c1_c2_6, VECTOR_LEN_MAX); // SMCR_EL2
            }
            // Fine-grained traps and HCRX_EL2 reset to UNKNOWN values: trap
            // nothing (the negative bits nSMPRI_EL1/nTPIDR2_EL0 trap when clear).
            if features.fgt {
                let negative = if features.sme { FGT_SME_NEGATIVE } else { 0 };
                write_sysreg!(s3_4_c1_c1_4, negative); // HFGRTR_EL2
                write_sysreg!(s3_4_c1_c1_5, negative); // HFGWTR_EL2
                write_sysreg!(s3_4_c1_c1_6, 0); // HFGITR_EL2
                write_sysreg!(s3_4_c3_c1_4, 0); // HDFGRTR_EL2
                write_sysreg!(s3_4_c3_c1_5, 0); // HDFGWTR_EL2
            }
            if features.hcx {
                write_sysreg!(s3_4_c1_c2_2, 0); // HCRX_EL2
            }
            write_sysreg!(mdcr_el2, mdcr);
            write_sysreg!(cnthctl_el2, CNTHCTL_EL2_GUEST);
            write_sysreg!(cntvoff_el2, 0);
            // EL1 state as after a reset.
            write_sysreg!(sctlr_el1, SCTLR_EL1_RESET);
            write_sysreg!(tcr_el1, 0);
            write_sysreg!(mair_el1, 0);
            write_sysreg!(ttbr0_el1, 0);
            write_sysreg!(ttbr1_el1, 0);
            write_sysreg!(vbar_el1, 0);
            write_sysreg!(cpacr_el1, 0);
            write_sysreg!(sp_el1, 0);
            write_sysreg!(sp_el0, 0);
            write_sysreg!(elr_el1, 0);
            write_sysreg!(spsr_el1, 0);
            write_sysreg!(esr_el1, 0);
            write_sysreg!(far_el1, 0);
            write_sysreg!(tpidr_el1, 0);
            write_sysreg!(tpidr_el0, 0);
            write_sysreg!(tpidrro_el0, 0);
            write_sysreg!(contextidr_el1, 0);
            write_sysreg!(cntkctl_el1, 0);
            write_sysreg!(cntv_ctl_el0, 0);
            write_sysreg!(cntp_ctl_el0, 0);
            if self.lrs.is_some() {
                // The virtual CPU interface as after a reset: nothing listed,
                // no active priorities, the guest's view of its own control
                // registers zero; `fill` sets the HCR's En before entry.
                gic::reset_virtual_interface(preemption_bits);
            }
            core::arch::asm!(
                "isb",
                "tlbi vmalle1",
                "dsb nsh",
                "isb",
                options(nostack, preserves_flags)
            );
        }
        if let Some(lrs) = self.lrs.as_mut() {
            // A previous run of this vCPU unloaded on CPU_OFF; this empties
            // the list registers once more (nothing is listed).
            let result = self.vm.vgic.lock().unload(self.index, lrs);
            if let Err(e) = result {
                self.stop(&format!("list register reset: {e:?}"));
            }
        }
        // A timer may have been masked while the vCPU was off; CNTV_CTL_EL0
        // and CNTP_CTL_EL0 were just cleared, so both lines are low.
        for timer in TimerId::ALL {
            gic::set_timer_masked(timer, false);
        }
        self.timers = [TimerForward::new(); 2];
        self.needs_fill = true;
        self.regs = GuestRegs {
            pc: boot.entry,
            pstate: inject::PSTATE_EL1H_MASKED,
            ..GuestRegs::default()
        };
        self.regs.x[0] = boot.context_id;
    }

    fn stop(&self, reason: &str) -> ! {
        self.vm.stop(self.index, reason)
    }

    fn bump(&self, counter: Counter) {
        self.vm.counters.bump(counter);
    }

    fn reg(&self, r: u8) -> u64 {
        if r == 31 { 0 } else { self.regs.x[r as usize] }
    }

    fn set_reg(&mut self, r: u8, value: u64) {
        if r != 31 {
            self.regs.x[r as usize] = value;
        }
    }

    fn handle_exit(&mut self, kind: ExitKind) -> Flow {
        match kind {
            ExitKind::Sync => self.handle_sync(),
            ExitKind::Irq => {
                self.bump(Counter::ExitsIrq);
                self.needs_fill = true;
                self.host_interrupts();
                Flow::Resume
            }
            ExitKind::Fiq | ExitKind::SError => self.stop(&format!(
                "unexpected {kind:?} exit at PC {:#x} (ESR_EL2 {:#x})",
                self.regs.pc, self.regs.esr
            )),
        }
    }

    /// Acknowledges and handles the pending host interrupts. The maintenance
    /// interrupt is a level that stays high until the list registers are
    /// refilled, so it ends the loop: the refill comes before the next entry,
    /// and anything else still pending exits again right after it.
    fn host_interrupts(&mut self) {
        let maintenance = gic::maintenance_intid();
        let timers = gic::timer_intids();
        let uart = self.vm.host_uart_intid;
        loop {
            let ack = gic::acknowledge();
            match HostIrq::classify(ack.intid, maintenance, timers, uart) {
                HostIrq::Spurious => return,
                HostIrq::Maintenance => {
                    gic::end_of_interrupt(ack);
                    return;
                }
                // The refill before the next entry is all it needs.
                HostIrq::Kick => {}
                HostIrq::Timer(timer) => {
                    let fired = self.timers[timer.index()].fired();
                    if fired.mask_host {
                        gic::set_timer_masked(timer, true);
                    }
                    if fired.raise_line {
                        self.set_timer_line(timer, true);
                    }
                }
                HostIrq::UartReceive => self.console_input(),
                HostIrq::Unexpected(other) => log::warn!(
                    "vm{} vcpu{}: unexpected host interrupt {other}",
                    self.vm.index,
                    self.index
                ),
            }
            gic::end_of_interrupt(ack);
        }
    }

    /// Moves the bytes typed on the host console into the emulated PL011's
    /// backlog and FIFO (the backlog refills the FIFO as the guest reads it)
    /// and updates its interrupt line.
    fn console_input(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            let len = console::receive(&mut buf);
            if len == 0 {
                break;
            }
            let mut uart = self.vm.uart.lock();
            let GuestUart {
                device, backlog, ..
            } = &mut *uart;
            for &byte in &buf[..len] {
                backlog.push(byte);
            }
            backlog.drain_into(device);
        }
        self.update_uart_line();
    }

    fn handle_sync(&mut self) -> Flow {
        let esr = self.regs.esr;
        if aarch32::is_aarch32(self.regs.pstate)
            && !aarch32::condition_passed(esr, self.regs.pstate)
        {
            // A conditional AArch32 instruction that failed its condition
            // trapped anyway: it does nothing.
            self.skip_trapped_instruction();
            return Flow::Resume;
        }
        match ExceptionClass::from_esr(esr) {
            ExceptionClass::DataAbortLower => {
                self.bump(Counter::ExitsDabt);
                self.data_abort(DataAbort::from_iss(iss(esr)))
            }
            ExceptionClass::InstructionAbortLower => {
                self.bump(Counter::ExitsIabt);
                self.instruction_abort(InstructionAbort::from_iss(iss(esr)))
            }
            ExceptionClass::Hvc64 => {
                self.bump(Counter::ExitsHvc);
                // ELR_EL2 already points after the HVC.
                self.guest_call()
            }
            ExceptionClass::Smc64 => {
                self.bump(Counter::ExitsSmc);
                // A trapped SMC returns to the SMC itself: step over it.
                self.skip_trapped_instruction();
                self.guest_call()
            }
            ExceptionClass::SysReg64 => {
                self.bump(Counter::ExitsSysreg);
                self.sysreg(SysRegAccess::from_iss(iss(esr)));
                Flow::Resume
            }
            ExceptionClass::WfiWfe => {
                self.bump(Counter::ExitsWfx);
                // Nothing can be pending for the guest yet: WFI completes at once.
                self.skip_trapped_instruction();
                Flow::Resume
            }
            class if class.is_unemulated_instruction() => {
                self.inject_undefined();
                Flow::Resume
            }
            class => self.stop(&format!(
                "undecodable exit: EC {:#x} ({class:?}), ESR_EL2 {esr:#x}, PC {:#x}, FAR {:#x}",
                class.code(),
                self.regs.pc,
                self.regs.far
            )),
        }
    }

    fn ipa(&self) -> u64 {
        fault_ipa(self.regs.hpfar, self.regs.far)
    }

    fn data_abort(&mut self, abort: DataAbort) -> Flow {
        let ipa = self.ipa();
        match abort.status.kind {
            FaultKind::Translation | FaultKind::AccessFlag => {}
            other => self.stop(&format!(
                "data abort at IPA {ipa:#x} with fault status {other:?} (level {:?}), PC {:#x}",
                abort.status.level, self.regs.pc
            )),
        }
        if let Some(slot) = self.vm.slot_for(&self.epoch, ipa, &mut self.slot_cache) {
            return self.fault_in(slot, ipa, abort.status.kind, false);
        }
        let cause = if abort.stage1_walk {
            AbortCause::NoMemoryOrDevice
        } else {
            match abort.access {
                // The whole access, not only its first byte, must be in the
                // device's window.
                Some(access) => match self.vm.mmio.find(ipa, u64::from(access.size)) {
                    Ok((DeviceId::Uart, offset)) => {
                        return self.uart_access(abort.write, access, offset);
                    }
                    Ok((DeviceId::Gic, _)) => return self.gic_access(abort.write, access, ipa),
                    Err(MmioMiss::Outside) => AbortCause::NoMemoryOrDevice,
                    Err(MmioMiss::Straddles(region)) => AbortCause::Straddles {
                        device: region.device,
                        size: access.size,
                        window_end: region.base + region.size,
                    },
                },
                None => match self.vm.mmio.region_at(ipa) {
                    Some(region) => AbortCause::NoSyndrome(region.device),
                    None => AbortCause::NoMemoryOrDevice,
                },
            }
        };
        self.inject_abort(InjectKind::DataAbort { write: abort.write }, ipa, cause);
        Flow::Resume
    }

    fn instruction_abort(&mut self, abort: InstructionAbort) -> Flow {
        let ipa = self.ipa();
        match abort.status.kind {
            // Permission: executing from memory a data access mapped.
            FaultKind::Translation | FaultKind::AccessFlag | FaultKind::Permission => {}
            other => self.stop(&format!(
                "instruction abort at IPA {ipa:#x} with fault status {other:?}, PC {:#x}",
                self.regs.pc
            )),
        }
        if let Some(slot) = self.vm.slot_for(&self.epoch, ipa, &mut self.slot_cache) {
            return self.fault_in(slot, ipa, abort.status.kind, true);
        }
        self.inject_abort(
            InjectKind::InstructionAbort,
            ipa,
            AbortCause::NoMemoryOrDevice,
        );
        Flow::Resume
    }

    /// Maps the leaf around `ipa` with a shared walk (the read side of the
    /// VM's MMU lock: other vCPUs fault at the same time); an access-flag
    /// fault only sets the flag of the leaf already there. As KVM does, a
    /// leaf is executable only once the guest executes from it (`exec`: an
    /// instruction abort): a data fault maps it read-write, and a later
    /// instruction fetch adds execute permission (`pgtable` invalidates the
    /// instruction cache first where the CPU needs it).
    fn fault_in(&mut self, slot: SlotView, ipa: u64, kind: FaultKind, exec: bool) -> Flow {
        self.bump(Counter::Stage2Faults);
        if kind == FaultKind::AccessFlag {
            let result = self
                .vm
                .stage2
                .read(&self.mmu_cpu)
                .and_then(|mmu| mmu.set_young(ipa));
            return match result {
                // Set, or the leaf is gone or busy: a translation fault follows if needed.
                Ok(_) | Err(pgtable::Error::Again) => Flow::Resume,
                Err(e) => self.stop(&format!(
                    "setting the access flag of IPA {ipa:#x} failed: {e}"
                )),
            };
        }
        let Some(leaf) = fault::fault_leaf(slot, ipa, 1 << 30) else {
            self.stop(&format!("IPA {ipa:#x} left its memslot during the fault"));
        };
        if self
            .page_cache
            .top_up(&FrameMemory::TABLES, FAULT_CACHE_PAGES)
            .is_err()
        {
            self.stop("out of memory for stage-2 tables");
        }
        let mmu = match self.vm.stage2.read(&self.mmu_cpu) {
            Ok(mmu) => mmu,
            Err(e) => self.stop(&format!("stage-2 read side for IPA {ipa:#x}: {e}")),
        };
        if let Some(mapping) = mmu.lookup(ipa) {
            // Mapped already (a permission fault, or another vCPU mapped it
            // since this one faulted): add execute if this fetch needs it.
            if !exec || mapping.perms().contains(Perms::EXEC) {
                return Flow::Resume;
            }
            return match mmu.relax_perms(ipa, Perms::EXEC, &self.vm.tlb) {
                // Relaxed, or the leaf is gone or busy: the fetch faults
                // again if it still needs to.
                Ok(()) | Err(pgtable::Error::Again) => Flow::Resume,
                Err(e) => {
                    drop(mmu);
                    self.stop(&format!("making IPA {ipa:#x} executable failed: {e}"))
                }
            };
        }
        let perms = if exec { Perms::RWX } else { Perms::RW };
        let result = mmu.map(
            FaultMapping {
                ipa: leaf.ipa,
                size: leaf.size,
                pa: PhysAddr::new(leaf.pa),
                attrs: Attributes::normal(perms),
            },
            &mut self.page_cache,
            &self.vm.tlb,
        );
        drop(mmu);
        match result {
            Ok(()) => {
                self.bump(match leaf.size {
                    0x4000_0000 => Counter::MappedBlocks1g,
                    0x20_0000 => Counter::MappedBlocks2m,
                    _ => Counter::MappedPages4k,
                });
                Flow::Resume
            }
            // Another vCPU is changing this entry: the guest faults again.
            Err(pgtable::Error::Again) => Flow::Resume,
            Err(e) => self.stop(&format!(
                "stage-2 map of IPA {:#x}+{:#x} failed: {e}",
                leaf.ipa, leaf.size
            )),
        }
    }

    /// Logs a line about a guest-driven event through the VM's rate limit.
    fn log_event(&self, event: Event, level: log::Level, args: core::fmt::Arguments<'_>) {
        self.vm.log_event(self.index, event, level, args);
    }

    fn uart_access(&mut self, write: bool, access: DataAccess, offset: u64) -> Flow {
        if write {
            let value = mmio::store_value(access, self.reg(access.register)) as u32;
            let result = self.vm.uart.lock().device.write(offset, value);
            match result {
                Ok(Some(byte)) => self.vm.console_byte(byte),
                Ok(None) => {}
                Err(e) => self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("UART write ignored: {e:?}"),
                ),
            }
        } else {
            let result = {
                let mut uart = self.vm.uart.lock();
                let GuestUart {
                    device, backlog, ..
                } = &mut *uart;
                let result = device.read(offset);
                backlog.drain_into(device);
                result
            };
            let raw = match result {
                Ok(v) => u64::from(v),
                Err(e) => {
                    self.log_event(
                        Event::DeviceAccess,
                        log::Level::Warn,
                        format_args!("UART read as zero: {e:?}"),
                    );
                    0
                }
            };
            if let Some(value) = mmio::load_result(access, raw) {
                self.set_reg(access.register, value);
            }
        }
        self.update_uart_line();
        self.skip_trapped_instruction();
        Flow::Resume
    }

    /// A guest access to the virtual GIC's distributor or redistributors.
    fn gic_access(&mut self, write: bool, access: DataAccess, ipa: u64) -> Flow {
        self.fold();
        self.needs_fill = true;
        if write {
            let value = mmio::store_value(access, self.reg(access.register));
            let result = self
                .vm
                .vgic
                .lock()
                .mmio_write_from(self.index, ipa, access.size, value);
            match result {
                Ok(kicks) => self.absorb(kicks),
                Err(e) => self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("GIC write of {value:#x} at IPA {ipa:#x} ignored: {e:?}"),
                ),
            }
        } else {
            let result = self
                .vm
                .vgic
                .lock()
                .mmio_read_from(self.index, ipa, access.size);
            let raw = result.unwrap_or_else(|e| {
                self.log_event(
                    Event::DeviceAccess,
                    log::Level::Warn,
                    format_args!("GIC read at IPA {ipa:#x} as zero: {e:?}"),
                );
                0
            });
            if let Some(value) = mmio::load_result(access, raw) {
                self.set_reg(access.register, value);
            }
        }
        self.skip_trapped_instruction();
        Flow::Resume
    }

    /// Delivers `kind` to the guest as its own hardware would take it to
    /// EL1h: `inject::compute` decides every value from the exit's state, this
    /// only reads the guest's `VBAR_EL1`/`SCTLR_EL1` and writes the result.
    fn deliver(&mut self, kind: InjectKind) {
        let state = GuestState {
            pstate: self.regs.pstate,
            pc: self.regs.pc,
            far: self.regs.far,
            trap_esr: self.regs.esr,
            vbar: read_sysreg!(vbar_el1),
            sctlr: read_sysreg!(sctlr_el1),
        };
        let exception = match inject::compute(kind, state) {
            Ok(e) => e,
            Err(e) => self.stop(&format!(
                "cannot inject {kind:?}: guest PSTATE {:#x} is no EL0/EL1 state an AArch64 EL1 guest runs in",
                e.0
            )),
        };
        // SAFETY: the EL1 exception registers belong to the guest running on
        // this CPU; writing them is how the exception is delivered.
        unsafe {
            write_sysreg!(esr_el1, exception.esr);
            if let Some(far) = exception.far {
                write_sysreg!(far_el1, far);
            }
            write_sysreg!(elr_el1, exception.elr);
            write_sysreg!(spsr_el1, exception.spsr);
        }
        self.regs.pc = exception.pc;
        self.regs.pstate = exception.pstate;
    }

    /// Injects a synchronous external abort for an access to `ipa`, outside
    /// every memslot and device (or not emulable there, as `cause` says).
    fn inject_abort(&mut self, kind: InjectKind, ipa: u64, cause: AbortCause) {
        self.deliver(kind);
        self.bump(Counter::InjectedAborts);
        let what = match kind {
            InjectKind::InstructionAbort => "instruction",
            _ => "data",
        };
        self.log_event(
            Event::InjectedAbort,
            log::Level::Info,
            format_args!("injected {what} abort: IPA {ipa:#x} {cause}"),
        );
    }

    /// Injects an undefined instruction for a trapped instruction the
    /// hypervisor does not emulate.
    fn inject_undefined(&mut self) {
        let (esr, pc, pstate) = (self.regs.esr, self.regs.pc, self.regs.pstate);
        self.deliver(InjectKind::Undefined);
        self.bump(Counter::InjectedUndefs);
        self.log_event(
            Event::InjectedUndefined,
            log::Level::Info,
            format_args!(
                "injected undefined instruction: trapped EC {:#x} (ESR_EL2 {esr:#x}) at PC {pc:#x}, PSTATE {pstate:#x}",
                ExceptionClass::from_esr(esr).code()
            ),
        );
    }

    fn sysreg(&mut self, access: SysRegAccess) {
        let r = access.reg;
        if cache_maint::set_way_op(r).is_some() {
            self.set_way_trap();
            self.skip_trapped_instruction();
            return;
        }
        if !access.read
            && let Some(reg) = cache_maint::vm_reg(r)
        {
            let value = self.reg(access.rt);
            self.vm_reg_write(reg, value);
            self.skip_trapped_instruction();
            return;
        }
        if let Some(group) = SgiGroup::from_sysreg(r.op0, r.op1, r.crn, r.crm, r.op2) {
            if !access.read {
                let value = self.reg(access.rt);
                let result = self.vm.vgic.lock().send_sgi(self.index, value, group);
                match result {
                    Ok(kicks) => self.absorb(kicks),
                    Err(e) => self.stop(&format!("SGI {value:#x}: {e:?}")),
                }
            } else {
                // The SGI generation registers are write-only.
                self.set_reg(access.rt, 0);
            }
            self.skip_trapped_instruction();
            return;
        }
        if sysreg_trap::is_id_register(r) {
            if access.read {
                let Some(host) = sysreg::read_id_register(r.crm, r.op2) else {
                    self.stop(&format!("ID register {r} outside the ID space"));
                };
                self.set_reg(access.rt, sysreg_trap::guest_id_value(r, host));
            }
            self.skip_trapped_instruction();
            return;
        }
        match sysreg_trap::policy(access.reg) {
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
        self.skip_trapped_instruction();
    }

    /// A trapped set/way cache maintenance instruction (`HCR_EL2.TSW`, no
    /// FWB), converted as KVM's `kvm_set_way_flush`: the first one flushes
    /// all guest memory by address and traps the virtual-memory control
    /// registers, so turning the caches on or off flushes again.
    fn set_way_trap(&mut self) {
        self.bump(Counter::CmoSetwayTraps);
        if self.vm.fwb {
            // Not trapped with FWB; nothing to convert if it were.
            return;
        }
        if self.set_way.on_set_way() {
            self.flush_vm();
        }
        self.write_hcr();
    }

    /// A trapped write to a virtual-memory control register (`HCR_EL2.TVM`):
    /// the value goes to the register; a write to `SCTLR_EL1` that turns the
    /// MMU and caches on or off flushes guest memory (KVM's
    /// `kvm_toggle_cache`) and, caches on, stops the trapping.
    fn vm_reg_write(&mut self, reg: VmReg, value: u64) {
        self.bump(Counter::CmoVmRegTraps);
        let old_sctlr = read_sysreg!(sctlr_el1);
        // SAFETY: these EL1 registers belong to the guest running on this
        // CPU; the trap only delayed the guest's own write, done here.
        unsafe {
            match reg {
                VmReg::Sctlr => write_sysreg!(sctlr_el1, value),
                VmReg::Ttbr0 => write_sysreg!(ttbr0_el1, value),
                VmReg::Ttbr1 => write_sysreg!(ttbr1_el1, value),
                VmReg::Tcr => write_sysreg!(tcr_el1, value),
                VmReg::Esr => write_sysreg!(esr_el1, value),
                VmReg::Far => write_sysreg!(far_el1, value),
                VmReg::Afsr0 => write_sysreg!(afsr0_el1, value),
                VmReg::Afsr1 => write_sysreg!(afsr1_el1, value),
                VmReg::Mair => write_sysreg!(mair_el1, value),
                VmReg::Amair => write_sysreg!(amair_el1, value),
                VmReg::Contextidr => write_sysreg!(contextidr_el1, value),
            }
        }
        if reg == VmReg::Sctlr {
            if self.set_way.on_sctlr_write(old_sctlr, value) {
                self.flush_vm();
            }
            self.write_hcr();
        }
    }

    /// Cleans and invalidates every mapped page of guest RAM to the point of
    /// coherency, under the write side of the MMU lock (no break-before-make
    /// in flight, no unmap between a leaf's TLB flush and its cleaning; the
    /// walk changes no descriptor, so it owes no TLBI).
    fn flush_vm(&mut self) {
        let ram = self.vm.ram;
        let result = self.vm.stage2.write().flush_dcache(ram.start, ram.size());
        match result {
            Ok(_) => self.bump(Counter::CmoFullFlushes),
            Err(e) => self.stop(&format!("flushing guest memory: {e}")),
        }
    }

    /// Loads `HCR_EL2` with the set/way tracking's `TVM`.
    fn write_hcr(&self) {
        let tvm = if self.set_way.traps_vm_regs() {
            cache_maint::hcr_tvm()
        } else {
            0
        };
        // SAFETY: the same configuration as `load` wrote, with or without the
        // trap of the guest's virtual-memory control registers; the guest is
        // not running (the write takes effect by the ERET).
        unsafe { write_sysreg!(hcr_el2, self.hcr | tvm) };
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

    fn guest_call(&mut self) -> Flow {
        let x = &self.regs.x;
        let call = GuestCall::decode([x[0], x[1], x[2], x[3]]);
        let result = match call {
            GuestCall::Psci(psci) => match self.psci(psci) {
                Ok(value) => value,
                Err(flow) => return flow,
            },
            GuestCall::SmcccVersion => SMCCC_VERSION_1_1,
            GuestCall::TestReport { code } => {
                self.bump(Counter::TestReports);
                if code == 0 {
                    self.log_event(
                        Event::TestReport,
                        log::Level::Info,
                        format_args!("test report: pass"),
                    );
                } else {
                    self.log_event(
                        Event::TestReport,
                        log::Level::Info,
                        format_args!("test report: failure code {code:#x}"),
                    );
                }
                0
            }
            GuestCall::Unknown(id) => {
                self.bump(Counter::UnknownHypercalls);
                self.log_event(
                    Event::UnknownHypercall(id),
                    log::Level::Info,
                    format_args!("unknown hypercall {id:#x}: returned NOT_SUPPORTED"),
                );
                NOT_SUPPORTED
            }
        };
        self.regs.x[0] = result;
        Flow::Resume
    }

    /// Handles a PSCI call: `Ok(x0)` to resume with, or the flow when the vCPU
    /// does not resume.
    fn psci(&mut self, call: PsciCall) -> Result<u64, Flow> {
        let vm = self.vm;
        match psci::dispatch(call, self.index, &vm.power, vm.ram) {
            PsciOutcome::Return(value) => Ok(value),
            PsciOutcome::Started(target) => {
                // The target's CPU waits in WFI (WFE without a GIC) for its
                // request.
                sysreg::send_event();
                gic::kick(target);
                Ok(0)
            }
            PsciOutcome::CpuOff => {
                if let Some(lrs) = self.lrs.as_mut() {
                    let result = vm.vgic.lock().unload(self.index, lrs);
                    if let Err(e) = result {
                        self.stop(&format!("list register unload: {e:?}"));
                    }
                }
                Err(Flow::Off)
            }
            PsciOutcome::SystemOff => vm.system_off(self.index),
            PsciOutcome::SystemReset => vm.system_reset(self.index),
        }
    }
}
