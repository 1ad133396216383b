//! The start of the VMs on the fake machine (`runtime::cpu_start`): the
//! boot CPU creates the VMs, publishes their table, starts the console,
//! kicks the other CPUs and starts every VM's vCPU 0, here or on its CPU.

use super::*;
use crate::control::console_mux::ConsoleError;
use crate::runtime::cpu_start::{CpuStart, DEFAULT_EL2_TIMER_INTID, start_vms, wait_for_machine};
use crate::vm::power::PowerState;
use spin::Once;

impl CpuStart for FakeHardware {
    /// The fake's code runs on CPU 0, the boot CPU, unless a test says
    /// otherwise.
    fn current_cpu(&self) -> usize {
        self.console_side.lock().unwrap().cpu
    }

    fn discard_pending(&self) {}

    fn start_services(
        &self,
        _machine: &'static VmTable<Self>,
        poll_intid: u32,
    ) -> Result<(), ConsoleError> {
        self.services.lock().unwrap().push(poll_intid);
        Ok(())
    }
}

/// A payload archive with `vms` (name, settings).
pub(super) fn payload(vms: &[(&str, VmConf)]) -> &'static [u8] {
    let named: Vec<NamedPayload> = vms
        .iter()
        .map(|(name, conf)| NamedPayload {
            name: String::from(*name),
            payload: Payload {
                kernel: kernel(),
                initrd: None,
                cmdline: None,
                conf: *conf,
            },
        })
        .collect();
    Vec::leak(boot_payload::write_several(&named).unwrap())
}

pub(super) fn table() -> &'static Once<VmTable<FakeHardware>> {
    Box::leak(Box::new(Once::new()))
}

#[test]
fn the_boot_cpu_runs_its_vcpu_0_and_starts_the_others_on_their_cpus() {
    let hw = FakeHardware::new();
    let vms = payload(&[
        ("here", conf(8, &[0, 1], true)),
        ("there", conf(8, &[2], true)),
        ("waiting", conf(8, &[3], false)),
    ]);
    let table = table();
    let started = start_vms(hw, &boot_info(4), vms, table).unwrap();
    assert!(core::ptr::eq(table.get().unwrap(), started.machine));
    let [here, there, waiting] = started.machine.vms() else {
        panic!("three VMs");
    };
    let (vm, vcpu, first) = started.here.unwrap();
    assert!(core::ptr::eq(vm, *here));
    assert_eq!(vcpu, 0);
    assert!(first.is_some());
    assert_eq!(here.power.state(0), PowerState::On);
    assert_eq!(there.power.state(0), PowerState::OnPending);
    assert_eq!(waiting.power.state(0), PowerState::Off);
    // Every other CPU is kicked out of its wait for the table, then the
    // CPU of the vCPU 0 started elsewhere.
    assert_eq!(*hw.kicks.lock().unwrap(), vec![1, 2, 3, 2]);
    assert_eq!(*hw.services.lock().unwrap(), vec![DEFAULT_EL2_TIMER_INTID]);
    assert!(core::ptr::eq(wait_for_machine(hw, table), started.machine));
}

#[test]
fn a_boot_cpu_no_vm_names_runs_nothing() {
    let hw = FakeHardware::new();
    let vms = payload(&[("other", conf(8, &[1, 2], true))]);
    let started = start_vms(hw, &boot_info(3), vms, table()).unwrap();
    assert!(started.here.is_none());
    let vm = started.machine.vms()[0];
    assert_eq!(vm.power.state(0), PowerState::OnPending);
    assert_eq!(vm.power.state(1), PowerState::Off);
    assert_eq!(*hw.kicks.lock().unwrap(), vec![1, 2, 1]);
}

#[test]
fn vms_that_do_not_fit_the_cpus_do_not_start() {
    let hw = FakeHardware::new();
    let vms = payload(&[("big", conf(8, &[0, 5], true))]);
    let table = table();
    let error = start_vms(hw, &boot_info(2), vms, table).err().unwrap();
    assert!(!error.to_string().is_empty());
    assert!(table.get().is_none());
    assert!(hw.kicks.lock().unwrap().is_empty());
    assert!(hw.services.lock().unwrap().is_empty());
}
