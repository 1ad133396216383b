//! The vCPU's exit handling (`runtime::vcpu`) against [`FakeMachine`], a
//! CPU whose EL1 registers, timers and host GIC are plain fields and
//! whose list registers are the vgic's model
//! (`devices::vgic::list_regs::ModelListRegisters`): data aborts in and
//! outside RAM, a trapped SGI, a timer's host interrupt, and when
//! `prepare_entry` refills the list registers.

use super::*;
use crate::devices::timer::PhysicalTimerReg;
use crate::devices::vgic::list_regs::{ListRegister, ModelListRegisters};
use crate::exit::inject::InjectedException;
use crate::runtime::vcpu::{ExitKind, GuestRegs, Vcpu, VcpuMachine};
use crate::stage2::cache_maint::VmReg;
use crate::vm::exit_profile::Work;
use crate::vm::power::BootRequest;
use crate::vm::vcpu_state::VcpuState;
use crate::vocabulary::timers::TimerId;
use std::format;

/// The host's maintenance interrupt on the fake.
const MAINTENANCE: u32 = 25;
/// The host PPIs of the guest's virtual and physical timers.
const TIMER_PPIS: [u32; 2] = [27, 30];
/// No interrupt pending.
const SPURIOUS: u32 = 1023;

/// A CPU as the exit handling sees it (see the module doc).
#[derive(Default)]
struct FakeMachine {
    vbar: u64,
    sctlr: u64,
    /// The guest's `CNTV_CTL_EL0`, `CNTP_CTL_EL0`.
    timer_ctl: [u64; 2],
    /// Host interrupts pending at this CPU's interface, first first.
    pending: Vec<u32>,
    /// What was done to the machine, in order.
    ops: Vec<String>,
}

impl VcpuMachine for FakeMachine {
    type Hw = FakeHardware;
    type ListRegisters = ModelListRegisters;
    type Acknowledged = u32;

    fn list_registers(&self, _: &Vm<FakeHardware>) -> Option<ModelListRegisters> {
        Some(ModelListRegisters::new(4))
    }

    fn load(
        &mut self,
        _: &Vm<FakeHardware>,
        index: usize,
        hcr: u64,
        _: Option<&ModelListRegisters>,
    ) {
        self.timer_ctl = [0; 2];
        self.ops.push(format!("load vcpu{index} hcr {hcr:#x}"));
    }

    fn guards_binary_point(&self, _: &ModelListRegisters) -> bool {
        false
    }

    fn migrates_cpu_interface(&self, _: Option<&ModelListRegisters>) -> bool {
        false
    }

    fn capture_registers(&self, _: &Vm<FakeHardware>, _: Option<&ModelListRegisters>) -> VcpuState {
        VcpuState::default()
    }

    fn restore_registers(
        &mut self,
        _: &Vm<FakeHardware>,
        _: usize,
        _: Option<&ModelListRegisters>,
        _: &VcpuState,
    ) -> Result<(), StopReason> {
        Ok(())
    }

    unsafe fn enter(&mut self, _: &mut GuestRegs) -> ExitKind {
        unreachable!("the tests hand exits to the vCPU directly")
    }

    fn write_hcr(&mut self, value: u64) {
        self.ops.push(format!("hcr {value:#x}"));
    }

    fn vbar_el1(&self) -> u64 {
        self.vbar
    }

    fn sctlr_el1(&self) -> u64 {
        self.sctlr
    }

    fn deliver_exception(&mut self, exception: &InjectedException) {
        self.ops.push(format!(
            "exception esr {:#x} far {:?} elr {:#x}",
            exception.esr, exception.far, exception.elr
        ));
    }

    fn write_vm_reg(&mut self, reg: VmReg, value: u64) {
        self.ops.push(format!("{reg:?} {value:#x}"));
    }

    fn id_register(&self, _: u8, _: u8) -> Option<u64> {
        Some(0)
    }

    fn timer_ctl(&self, timer: TimerId) -> u64 {
        self.timer_ctl[timer.index()]
    }

    fn physical_timer_read(&self, _: PhysicalTimerReg) -> u64 {
        self.timer_ctl[TimerId::Physical.index()]
    }

    fn physical_timer_write(&mut self, reg: PhysicalTimerReg, value: u64) {
        self.ops.push(format!("{reg:?} {value:#x}"));
    }

    fn stop_guest_timers(&mut self) {
        self.timer_ctl = [0; 2];
    }

    fn ich_vtr(&self) -> u64 {
        0
    }

    fn ich_vmcr(&self) -> u64 {
        0
    }

    fn write_ich_vmcr(&mut self, value: u64) {
        self.ops.push(format!("vmcr {value:#x}"));
    }

    fn active_priorities(&self) -> ([u32; 4], usize) {
        ([0; 4], 1)
    }

    fn gic_is_up(&self) -> bool {
        true
    }

    fn maintenance_intid(&self) -> u32 {
        MAINTENANCE
    }

    fn timer_intids(&self) -> [u32; 2] {
        TIMER_PPIS
    }

    fn acknowledge(&mut self) -> (u32, u32) {
        let intid = if self.pending.is_empty() {
            SPURIOUS
        } else {
            self.pending.remove(0)
        };
        self.ops.push(format!("ack {intid}"));
        (intid, intid)
    }

    fn end_of_interrupt(&mut self, ack: u32) {
        self.ops.push(format!("eoi {ack}"));
    }

    fn drop_priority(&mut self, ack: u32) {
        self.ops.push(format!("drop {ack}"));
    }

    fn clear_ppi_active(&mut self, intid: u32) {
        self.ops.push(format!("clear active {intid}"));
    }

    fn deactivate_timer(&mut self, timer: TimerId) {
        self.ops.push(format!("deactivate {timer:?}"));
    }

    fn set_timer_masked(&mut self, timer: TimerId, masked: bool) {
        self.ops.push(format!("mask {timer:?} {masked}"));
    }

    fn set_ppi_enabled(&mut self, intid: u32, enabled: bool) {
        self.ops.push(format!("enable {intid} {enabled}"));
    }

    fn console_input(&mut self) {
        self.ops.push(String::from("console input"));
    }

    fn is_console_poll_timer(&self, _: u32) -> bool {
        false
    }

    fn console_poll_tick(&mut self) {}

    fn control_call(
        &mut self,
        _: &'static Vm<FakeHardware>,
        _: &crossbeam_epoch::LocalHandle,
        _: &[u64; 8],
    ) -> [u64; 4] {
        [0; 4]
    }
}

/// `ESR_EL2.IL`: a 32-bit instruction trapped.
const ESR_IL: u64 = 1 << 25;

/// The syndrome of a stage-2 translation fault at level 3 on a load
/// (`write`: a store) without a valid instruction syndrome.
fn data_abort_esr(write: bool) -> u64 {
    0x24 << 26 | ESR_IL | u64::from(write) << 6 | 0b000111
}

/// vCPU `index` of `vm`, loaded to start at the RAM base in EL1h.
fn loaded_vcpu(vm: &'static Vm<FakeHardware>, index: usize) -> Vcpu<FakeMachine> {
    let machine = FakeMachine {
        vbar: GUEST_RAM_BASE + 0x10_0000,
        ..FakeMachine::default()
    };
    let mut vcpu = Vcpu::new(machine, vm, index).unwrap();
    vcpu.load(BootRequest {
        entry: GUEST_RAM_BASE,
        context_id: 0,
    })
    .unwrap();
    vcpu.machine_mut().ops.clear();
    vcpu
}

/// Sets the vCPU's registers as a data abort at `ipa` leaves them (the
/// guest's MMU off: the faulting address is the IPA).
fn abort_at(vcpu: &mut Vcpu<FakeMachine>, ipa: u64, write: bool) {
    let regs = vcpu.regs_mut();
    regs.esr = data_abort_esr(write);
    regs.far = ipa;
    regs.hpfar = (ipa >> 12) << 4;
}

#[test]
fn a_data_abort_in_ram_faults_the_page_in_zeroed_and_resumes() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(8, &[0], true))])[0];
    let mut vcpu = loaded_vcpu(vm, 0);
    // 6 MiB in: a 2 MiB chunk the boot image left untouched.
    let ipa = GUEST_RAM_BASE + (6 << 20) + 0x10;
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let host = (spec.backing.0 + (6 << 20)) as *const u8;
    // SAFETY: inside the slot's backing, a live host allocation.
    assert_eq!(unsafe { *host }, GARBAGE);
    abort_at(&mut vcpu, ipa, true);
    assert_eq!(vcpu.handle_exit(ExitKind::Sync), Ok(Flow::Resume));
    // SAFETY: as above.
    let first = unsafe { *host };
    assert_eq!(first, 0, "the chunk was zeroed before it was mapped");
    let leaf = vm.stage2.write().lookup(ipa).expect("mapped");
    assert!(leaf.perms().contains(Perms::WRITE));
    assert_eq!(vm.counters.get(Counter::Stage2Faults), 1);
    assert_eq!(vcpu.regs().pc, GUEST_RAM_BASE, "the access is retried");
    assert!(vcpu.machine().ops.is_empty(), "{:?}", vcpu.machine().ops);
}

#[test]
fn a_data_abort_outside_ram_and_devices_injects_an_abort_at_the_guests_vector() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    let mut vcpu = loaded_vcpu(vm, 0);
    let ipa = 0x2000_0040;
    abort_at(&mut vcpu, ipa, false);
    assert_eq!(vcpu.handle_exit(ExitKind::Sync), Ok(Flow::Resume));
    // EL1h with SP_EL1: the current-EL synchronous vector, + 0x200.
    let vbar = vcpu.machine().vbar;
    assert_eq!(vcpu.regs().pc, vbar + 0x200);
    // A data abort from the current EL (EC 0x25), FAR the address, ELR the
    // faulting instruction.
    let esr_el1 = 0x25 << 26 | ESR_IL | 0x10;
    assert_eq!(
        vcpu.machine().ops,
        [format!(
            "exception esr {esr_el1:#x} far Some({ipa}) elr {GUEST_RAM_BASE:#x}"
        )]
    );
    assert_eq!(vm.counters.get(Counter::InjectedAborts), 1);
    assert_eq!(vm.counters.get(Counter::Stage2Faults), 0);
}

#[test]
fn a_trapped_sgi_write_kicks_the_target_vcpus_cpu() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[1, 2], true))])[0];
    // The guest puts SGI 3 in group 1 on vCPU 1 (GICR_IGROUPR0).
    vm.vgic.lock().sgi_base_write(1, 0x80, 4, 1 << 3).unwrap();
    let mut vcpu = loaded_vcpu(vm, 0);
    // MSR ICC_SGI1R_EL1 (S3_0_C12_C11_5), x2: INTID 3 to Aff0 1.
    let iss = 3 << 20 | 5 << 17 | 12 << 10 | 2 << 5 | 11 << 1;
    vcpu.regs_mut().esr = 0x18 << 26 | ESR_IL | iss;
    vcpu.regs_mut().x[2] = 3 << 24 | 1 << 1;
    assert_eq!(vcpu.handle_exit(ExitKind::Sync), Ok(Flow::Resume));
    assert_eq!(vcpu.regs().pc, GUEST_RAM_BASE + 4, "stepped over");
    // The kicks wait until the handler is done, then go to vCPU 1's CPU.
    assert!(hw.kicks.lock().unwrap().is_empty());
    vcpu.send_kicks();
    assert_eq!(*hw.kicks.lock().unwrap(), [2]);
}

/// The guest's distributor on, group 1 everywhere, `intid` (a PPI) enabled
/// on vCPU 0.
fn enable_ppi(vm: &Vm<FakeHardware>, intid: u32) {
    let mut vgic = vm.vgic.lock();
    vgic.distributor_write(0, 4, 0x12).unwrap();
    vgic.sgi_base_write(0, 0x80, 4, 0xffff_ffff).unwrap();
    vgic.sgi_base_write(0, 0x100, 4, 1 << intid).unwrap();
}

/// The INTIDs the list registers hold.
fn listed(vcpu: &Vcpu<FakeMachine>) -> Vec<u32> {
    vcpu.list_registers()
        .unwrap()
        .list_registers()
        .iter()
        .map(|&value| ListRegister(value))
        .filter(|lr| !lr.is_empty())
        .map(|lr| lr.intid())
        .collect()
}

#[test]
fn a_timer_interrupt_is_listed_with_its_host_ppi_left_active() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    enable_ppi(vm, TimerId::Virtual.guest_intid());
    let mut vcpu = loaded_vcpu(vm, 0);
    vcpu.prepare_entry().unwrap();
    assert!(listed(&vcpu).is_empty());
    // The virtual timer fires while the guest runs (enabled, unmasked,
    // condition met).
    vcpu.machine_mut().timer_ctl[TimerId::Virtual.index()] = 0b101;
    vcpu.machine_mut().pending = vec![TIMER_PPIS[0]];
    vcpu.machine_mut().ops.clear();
    assert_eq!(vcpu.handle_exit(ExitKind::Irq), Ok(Flow::Resume));
    // One acknowledge, a priority drop only: the PPI stays active for the
    // guest to deactivate through the hardware list register.
    assert_eq!(vcpu.machine().ops, ["ack 27", "drop 27"]);
    vcpu.prepare_entry().unwrap();
    assert_eq!(listed(&vcpu), [TimerId::Virtual.guest_intid()]);
    assert_eq!(vm.counters.get(Counter::ExitsIrq), 1);
}

#[test]
fn prepare_entry_refills_only_after_an_exit_that_could_change_the_list() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    let mut vcpu = loaded_vcpu(vm, 0);
    let fills = || vm.exit_profiles[0].work_done(Work::ListRegisterFill);
    // After the load.
    vcpu.prepare_entry().unwrap();
    assert_eq!(fills(), 1);
    // A data abort in RAM changes nothing the list registers hold.
    abort_at(&mut vcpu, GUEST_RAM_BASE + (2 << 20), false);
    vcpu.handle_exit(ExitKind::Sync).unwrap();
    vcpu.prepare_entry().unwrap();
    assert_eq!(fills(), 1);
    // An IRQ exit (here a kick) may have.
    vcpu.machine_mut().pending = vec![crate::drivers::gic::KICK_SGI];
    vcpu.handle_exit(ExitKind::Irq).unwrap();
    vcpu.prepare_entry().unwrap();
    assert_eq!(fills(), 2);
    // Nothing since.
    vcpu.prepare_entry().unwrap();
    assert_eq!(fills(), 2);
}

#[test]
fn a_set_way_trap_without_fwb_flushes_the_vm_and_traps_the_vm_registers() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    assert!(!vm.fwb);
    let mut vcpu = loaded_vcpu(vm, 0);
    // DC CISW (op0 1, CRn 7, CRm 14, op2 2), x0.
    let iss = 1 << 20 | 2 << 17 | 7 << 10 | 14 << 1;
    vcpu.regs_mut().esr = 0x18 << 26 | ESR_IL | iss;
    assert_eq!(vcpu.handle_exit(ExitKind::Sync), Ok(Flow::Resume));
    let hcr =
        crate::sysreg_values::hcr_el2_guest(false, false) | crate::stage2::cache_maint::hcr_tvm();
    assert_eq!(vcpu.machine().ops, [format!("hcr {hcr:#x}")]);
    assert_eq!(vm.counters.get(Counter::CmoSetwayTraps), 1);
    assert_eq!(vm.counters.get(Counter::CmoFullFlushes), 1);
    // The second one finds the tracking on: no second flush.
    vcpu.handle_exit(ExitKind::Sync).unwrap();
    assert_eq!(vm.counters.get(Counter::CmoFullFlushes), 1);
}

#[test]
fn a_load_configures_the_cpu_then_unmasks_the_timers_and_starts_at_the_entry() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0, 1], true))])[0];
    let mut vcpu = Vcpu::new(FakeMachine::default(), vm, 1).unwrap();
    vcpu.load(BootRequest {
        entry: GUEST_RAM_BASE + 0x1000,
        context_id: 0x77,
    })
    .unwrap();
    let hcr = crate::sysreg_values::hcr_el2_guest(vm.fwb, vm.mte);
    assert_eq!(
        vcpu.machine().ops,
        [
            format!("load vcpu1 hcr {hcr:#x}"),
            String::from("deactivate Virtual"),
            String::from("mask Virtual false"),
            String::from("deactivate Physical"),
            String::from("mask Physical false"),
        ]
    );
    let regs = vcpu.regs();
    assert_eq!((regs.pc, regs.x[0]), (GUEST_RAM_BASE + 0x1000, 0x77));
    assert_eq!(regs.pstate, crate::exit::inject::PSTATE_EL1H_MASKED);
    // The list registers are filled before the first entry.
    vcpu.prepare_entry().unwrap();
    assert_eq!(vm.exit_profiles[1].work_done(Work::ListRegisterFill), 1);
}
