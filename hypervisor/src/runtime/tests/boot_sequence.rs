//! The boot sequence (`runtime::boot_sequence`) against a fake boot
//! machine ([`FakeBoot`]) over QEMU's device trees: it records every
//! machine step it is asked for, starts each secondary CPU by deciding, as
//! the real one does, whether its features cover what the boot CPU
//! published, and the log lines of the test's thread are captured
//! ([`captured_log`]) to check their text and order.

use super::*;
use crate::drivers::gic::driver::GicError;
use crate::platform::banner::{self, ListRegisterSource};
use crate::platform::cpu_features::SystemFeatures;
use crate::platform::virtio_mmio::VirtioMmioWindow;
use crate::platform::{Gicv2, Gicv3};
use crate::runtime::boot_sequence::{
    Arrival, BootMachine, Halt, boot_primary, init_secondary_gic, list_register_source,
    secondary_admitted,
};
use core::cell::RefCell;
use smccc::psci;

const QEMU_GICV3_SMP4: &[u8] = include_bytes!("../../../testdata/qemu-virt-smp4.dtb");
const QEMU_GICV2_SMP2: &[u8] = include_bytes!("../../../testdata/qemu-virt-gicv2-smp2.dtb");

std::thread_local! {
    /// The log lines of this thread, once it called [`captured_log`].
    static LOG_LINES: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Keeps the log lines of the thread that asked for them, as
/// `LEVEL message`.
struct CapturingLogger;

impl log::Log for CapturingLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        LOG_LINES.with(|lines| {
            if let Some(lines) = lines.borrow_mut().as_mut() {
                lines.push(format!("{} {}", record.level(), record.args()));
            }
        });
    }

    fn flush(&self) {}
}

static LOGGER: CapturingLogger = CapturingLogger;

/// Starts capturing this thread's log lines.
fn capture_log() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&LOGGER).unwrap();
        log::set_max_level(log::LevelFilter::Info);
    });
    LOG_LINES.with(|lines| *lines.borrow_mut() = Some(Vec::new()));
}

/// This thread's log lines since [`capture_log`].
fn captured_log() -> Vec<String> {
    LOG_LINES.with(|lines| lines.borrow().clone().unwrap_or_default())
}

/// QEMU's `max` CPU: GICv3 system registers, FEAT_TLBIRANGE, 48-bit PA.
fn qemu_max() -> CpuFeatures {
    let isar0 = 2u64 << 56;
    let mmfr0 = 5 | (1 << 56) | (2 << 40);
    let mmfr1 = (2 << 4) | (1 << 8) | (1 << 40);
    let mmfr2 = (1 << 48) | (1 << 40);
    let pfr0 = (1 << 24) | (1 << 32);
    let pfr1 = (1 << 24) | (2 << 8);
    CpuFeatures::from_id_registers(isar0, mmfr0, mmfr1, mmfr2, pfr0, pfr1)
}

/// QEMU's `max` without the GICv3 system-register interface.
fn without_gic_sysregs() -> CpuFeatures {
    CpuFeatures {
        gic_sysregs: false,
        ..qemu_max()
    }
}

/// A Cortex-A57: lacks much of what QEMU's `max` has.
fn cortex_a57() -> CpuFeatures {
    CpuFeatures::from_id_registers(0, 2, 0, 0, 1 << 24, 0)
}

/// The fake boot machine (see the module doc).
struct FakeBoot {
    /// The boot CPU's features.
    boot_features: CpuFeatures,
    /// Each secondary's features by MPIDR (absent: the boot CPU's).
    secondary_features: BTreeMap<u64, CpuFeatures>,
    /// Secondaries whose start ends otherwise than by their features.
    secondary_outcomes: BTreeMap<u64, Result<Arrival, psci::error::Error>>,
    /// What a GICv2 driver makes of the tree's GICv2.
    gicv2_usable: bool,
    /// What a GIC CPU interface's bring-up returns.
    gic_cpu_result: Result<(), GicError>,
    /// Why the ITS fails, if it does.
    its_failure: Option<&'static str>,
    /// The GICv2 `GICH` list registers, when a GICv2 is driven.
    gich_count: usize,
    max_cpus: usize,
    /// What the boot CPU published for the secondaries.
    required: Mutex<Option<CpuFeatures>>,
    gicv2_driven: AtomicBool,
    /// Every machine step, in order.
    steps: Mutex<Vec<String>>,
}

impl FakeBoot {
    fn new(boot_features: CpuFeatures) -> Self {
        Self {
            boot_features,
            secondary_features: BTreeMap::new(),
            secondary_outcomes: BTreeMap::new(),
            gicv2_usable: true,
            gic_cpu_result: Ok(()),
            its_failure: None,
            gich_count: 4,
            max_cpus: 8,
            required: Mutex::new(None),
            gicv2_driven: AtomicBool::new(false),
            steps: Mutex::new(Vec::new()),
        }
    }

    fn step(&self, step: String) {
        self.steps.lock().unwrap().push(step);
    }

    fn steps(&self) -> Vec<String> {
        self.steps.lock().unwrap().clone()
    }

    fn took(&self, step: &str) -> bool {
        self.steps().iter().any(|s| s == step)
    }
}

impl BootMachine for FakeBoot {
    type ItsError = &'static str;

    fn start_console(&self, _: &Platform) {
        self.step("console".into());
    }

    fn set_psci_conduit(&self, conduit: PsciConduit) {
        self.step(format!("conduit {conduit:?}"));
    }

    fn image_range(&self) -> PhysRange {
        PhysRange::from_start_size(0x4008_0000, 0x20_0000)
    }

    fn init_memory(&self, _: &Platform, in_use: Vec<PhysRange>, _: &[PhysRange]) -> u64 {
        self.step(format!("memory, {} range(s) in use", in_use.len()));
        512 << 20
    }

    fn mark_boot_cpu_online(&self) {
        self.step("boot CPU online".into());
    }

    fn local_features(&self) -> CpuFeatures {
        self.boot_features
    }

    fn enable_memory_tagging(&self) {
        self.step("memory tagging".into());
    }

    fn record_boot_features(&self, _: &CpuFeatures) {
        self.step("boot features".into());
    }

    fn publish_required(&self, required: CpuFeatures) {
        *self.required.lock().unwrap() = Some(required);
    }

    fn enable_gic_sysregs(&self) {
        self.step("GIC sysregs".into());
    }

    fn ich_list_registers(&self) -> u64 {
        4
    }

    fn psci_version(&self) -> Result<psci::Version, psci::error::Error> {
        Ok(psci::Version { major: 1, minor: 1 })
    }

    fn payload(&self, _: PhysRange) -> &[u8] {
        &[]
    }

    fn virtio_transport_empty(&self, _: u64) -> bool {
        true
    }

    fn probe_host_disks(&self, _: &[VirtioMmioWindow]) {
        self.step("host disks".into());
    }

    fn init_gicv3(&self, _: &Gicv3, _: [u32; 2], _: Option<u32>, boot_mpidr: u64) {
        self.step(format!("GICv3 for {boot_mpidr:#x}"));
    }

    fn init_gicv2(&self, _: &Gicv2, _: [u32; 2], _: Option<u32>) -> bool {
        self.step("GICv2".into());
        self.gicv2_driven
            .store(self.gicv2_usable, Ordering::Relaxed);
        self.gicv2_usable
    }

    fn gic_is_v2(&self) -> bool {
        self.gicv2_driven.load(Ordering::Relaxed)
    }

    fn init_gic_cpu(&self, index: usize) -> Result<(), GicError> {
        self.step(format!("GIC CPU {index}"));
        self.gic_cpu_result
    }

    fn enable_uart_receive_interrupt(&self) {
        self.step("UART receive".into());
    }

    fn init_its(&self, frames: PhysRange, pool: u32) -> Result<u32, &'static str> {
        self.step(format!("ITS at {:#x}, {pool} LPIs", frames.start));
        self.its_failure.map_or(Ok(16), Err)
    }

    fn init_its_cpu(&self, index: usize) {
        self.step(format!("ITS CPU {index}"));
    }

    fn max_cpus(&self) -> usize {
        self.max_cpus
    }

    fn start_secondary(&self, index: usize, mpidr: u64) -> Result<Arrival, psci::error::Error> {
        self.step(format!("start {mpidr:#x} in slot {index}"));
        if let Some(outcome) = self.secondary_outcomes.get(&mpidr) {
            return *outcome;
        }
        let features = *self
            .secondary_features
            .get(&mpidr)
            .unwrap_or(&self.boot_features);
        let required = *self.required.lock().unwrap();
        Ok(if secondary_admitted(&features, required.as_ref()) {
            Arrival::Online(Some(features))
        } else {
            Arrival::Rejected(Some(features))
        })
    }

    fn gich_list_registers(&self) -> Option<usize> {
        self.gic_is_v2().then_some(self.gich_count)
    }
}

/// QEMU's tree `dtb`, parsed.
fn platform(dtb: &[u8]) -> Platform {
    Platform::from_dtb(dtb).unwrap()
}

/// Boots the boot CPU (MPIDR 0) of `platform` on `machine`.
fn boot(machine: &FakeBoot, dtb: &[u8], platform: Platform) -> Result<BootInfo, Halt> {
    capture_log();
    boot_primary(machine, dtb, platform, 0, 0x4008_0000)
}

fn logged(line: &str) -> bool {
    captured_log().iter().any(|l| l == line)
}

#[test]
fn a_psci_hvc_conduit_halts_with_the_error_line_before_memory_is_touched() {
    let machine = FakeBoot::new(qemu_max());
    let mut platform = platform(QEMU_GICV3_SMP4);
    platform.psci = PsciConduit::Hvc;
    assert_eq!(boot(&machine, QEMU_GICV3_SMP4, platform).err(), Some(Halt));
    assert!(logged(
        "ERROR the device tree's PSCI method is \"hvc\", which cannot reach firmware from EL2"
    ));
    assert_eq!(machine.steps(), vec!["console"]);
}

#[test]
fn the_boot_log_of_a_gicv3_machine_is_in_its_order() {
    let machine = FakeBoot::new(qemu_max());
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    let features = qemu_max();
    let expected = vec![
        format!(
            "INFO hypervisor {} starting at EL2, loaded at 0x40080000",
            env!("CARGO_PKG_VERSION")
        ),
        format!("INFO platform: {}", info.platform.model),
        String::from("INFO RAM: 1024 MiB in 1 bank(s), 512 MiB free for guests and tables"),
        format!("INFO {}", banner::gic_line(&info.platform)),
        String::from("INFO console PL011 at 0x9000000 (stdout-path), firmware PSCI 1.1 over SMC"),
        String::from(
            "INFO host ITS at 0x8080000: 16 DeviceID bits, 8192 LPIs for passed PCIe devices' MSIs",
        ),
        String::from("INFO CPUs: 4 online of 4 in the device tree"),
        format!(
            "INFO {}",
            banner::features_line(&features, 4, ListRegisterSource::SystemRegisters(4))
        ),
        format!("INFO {}", banner::tlb_line(features.tlb_caps())),
    ];
    assert_eq!(captured_log(), expected);
    assert_eq!(info.cpus_online, 4);
    assert_eq!(info.features, features);
    assert_eq!(info.payload, None);
}

#[test]
fn gicv3_is_chosen_when_the_boot_cpu_has_list_registers() {
    let machine = FakeBoot::new(qemu_max());
    boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    let steps = machine.steps();
    let gic: Vec<&str> = steps
        .iter()
        .map(String::as_str)
        .skip_while(|s| *s != "host disks")
        .take_while(|s| !s.starts_with("start"))
        .collect();
    assert_eq!(
        gic,
        vec![
            "host disks",
            "GICv3 for 0x0",
            "GIC CPU 0",
            "UART receive",
            "ITS at 0x8080000, 8192 LPIs",
            "ITS CPU 0",
        ]
    );
    assert!(!machine.took("GICv2"));
    // The system registers were enabled before the banner, once.
    assert_eq!(steps.iter().filter(|s| *s == "GIC sysregs").count(), 1);
}

#[test]
fn gicv2_is_chosen_when_the_boot_cpu_has_no_list_registers() {
    let machine = FakeBoot::new(without_gic_sysregs());
    let info = boot(&machine, QEMU_GICV2_SMP2, platform(QEMU_GICV2_SMP2)).unwrap();
    assert!(machine.took("GICv2"));
    assert!(machine.took("GIC CPU 0"));
    assert!(machine.took("UART receive"));
    assert!(!machine.steps().iter().any(|s| s.starts_with("GICv3")));
    assert!(!machine.took("GIC sysregs"));
    assert!(logged(&format!(
        "INFO {}",
        banner::features_line(&info.features, 2, ListRegisterSource::Gich(4))
    )));
}

#[test]
fn a_gicv3_tree_without_list_registers_and_no_gicv2_drives_no_gic() {
    let machine = FakeBoot::new(without_gic_sysregs());
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(
        !machine
            .steps()
            .iter()
            .any(|s| s.starts_with("GIC") || s.starts_with("ITS") || s == "UART receive"),
        "{:?}",
        machine.steps()
    );
    assert!(logged(&format!(
        "INFO {}",
        banner::features_line(&info.features, 4, ListRegisterSource::None)
    )));
}

#[test]
fn a_gicv2_without_virtualization_is_not_driven() {
    let mut machine = FakeBoot::new(without_gic_sysregs());
    machine.gicv2_usable = false;
    boot(&machine, QEMU_GICV2_SMP2, platform(QEMU_GICV2_SMP2)).unwrap();
    assert!(machine.took("GICv2"));
    assert!(!machine.took("GIC CPU 0"));
    assert!(!machine.took("UART receive"));
}

#[test]
fn a_failing_gic_cpu_interface_is_a_warning_and_keeps_the_uart_interrupt_off() {
    let mut machine = FakeBoot::new(qemu_max());
    machine.gic_cpu_result = Err(GicError::NoRedistributor(0));
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(logged("WARN GICv3 CPU interface: NoRedistributor(0)"));
    assert!(!machine.took("UART receive"));
    assert_eq!(info.cpus_online, 4);
}

#[test]
fn a_failing_its_is_a_warning_and_the_boot_goes_on() {
    let mut machine = FakeBoot::new(qemu_max());
    machine.its_failure = Some("no physical LPIs");
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(logged(
        "WARN host ITS at 0x8080000: not used: no physical LPIs"
    ));
    assert!(!machine.took("ITS CPU 0"));
    assert!(machine.took("start 0x3 in slot 3"));
    assert_eq!(info.cpus_online, 4);
}

#[test]
fn a_rejected_secondary_is_reported_and_the_next_cpu_takes_its_slot() {
    let mut machine = FakeBoot::new(qemu_max());
    machine.secondary_features.insert(1, cortex_a57());
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    let starts: Vec<String> = machine
        .steps()
        .into_iter()
        .filter(|s| s.starts_with("start"))
        .collect();
    assert_eq!(
        starts,
        vec![
            "start 0x1 in slot 1",
            "start 0x2 in slot 1",
            "start 0x3 in slot 2"
        ]
    );
    let why = SystemFeatures::check(&SystemFeatures::new(qemu_max()).required(), &cortex_a57())
        .unwrap_err();
    assert!(logged(&format!(
        "WARN CPU 0x1 left offline: it lacks what the system relies on ({why})"
    )));
    assert!(logged("INFO CPUs: 3 online of 4 in the device tree"));
    assert_eq!(info.cpus_online, 3);
    // The rejected CPU's features do not lower the system's.
    assert_eq!(info.features, qemu_max());
}

#[test]
fn cpus_that_fail_to_start_are_reported_and_not_counted() {
    let mut machine = FakeBoot::new(qemu_max());
    machine
        .secondary_outcomes
        .insert(1, Err(psci::error::Error::AlreadyOn));
    machine
        .secondary_outcomes
        .insert(2, Ok(Arrival::NeverArrived));
    machine
        .secondary_outcomes
        .insert(3, Ok(Arrival::Rejected(None)));
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(logged("WARN CPU_ON for CPU 0x1 failed: AlreadyOn"));
    assert!(logged("WARN CPU 0x2 accepted CPU_ON but never came online"));
    assert!(logged(
        "WARN CPU 0x3 left offline: it lacks what the system relies on (its features were not recorded)"
    ));
    assert_eq!(info.cpus_online, 1);
    assert!(logged("INFO CPUs: 1 online of 4 in the device tree"));
}

#[test]
fn a_cpu_online_without_features_is_an_error_but_counted() {
    let mut machine = FakeBoot::new(qemu_max());
    machine
        .secondary_outcomes
        .insert(2, Ok(Arrival::Online(None)));
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(logged("ERROR CPU 0x2 came online without its features"));
    assert_eq!(info.cpus_online, 4);
}

#[test]
fn cpus_beyond_the_slots_are_not_started() {
    let mut machine = FakeBoot::new(qemu_max());
    machine.max_cpus = 2;
    let info = boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(logged(
        "WARN CPU 0x2 not started: the hypervisor drives at most 2 CPUs"
    ));
    assert!(logged(
        "WARN CPU 0x3 not started: the hypervisor drives at most 2 CPUs"
    ));
    assert_eq!(info.cpus_online, 2);
}

#[test]
fn the_boot_cpu_is_not_started_again() {
    let machine = FakeBoot::new(qemu_max());
    capture_log();
    let info = boot_primary(
        &machine,
        QEMU_GICV3_SMP4,
        platform(QEMU_GICV3_SMP4),
        2,
        0x4008_0000,
    )
    .unwrap();
    let starts: Vec<String> = machine
        .steps()
        .into_iter()
        .filter(|s| s.starts_with("start"))
        .collect();
    assert_eq!(
        starts,
        vec![
            "start 0x0 in slot 1",
            "start 0x1 in slot 2",
            "start 0x3 in slot 3"
        ]
    );
    assert!(machine.took("GICv3 for 0x2"));
    assert_eq!(info.cpus_online, 4);
}

#[test]
fn memory_tagging_is_enabled_only_on_a_cpu_with_it() {
    let with_mte = CpuFeatures {
        mte: true,
        ..qemu_max()
    };
    let machine = FakeBoot::new(with_mte);
    boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    let steps = machine.steps();
    let at = |step: &str| steps.iter().position(|s| s == step).unwrap();
    assert!(at("memory tagging") < at("boot features"));
    let machine = FakeBoot::new(CpuFeatures {
        mte: false,
        ..qemu_max()
    });
    boot(&machine, QEMU_GICV3_SMP4, platform(QEMU_GICV3_SMP4)).unwrap();
    assert!(!machine.took("memory tagging"));
}

#[test]
fn the_list_registers_are_the_system_registers_then_gich_then_none() {
    assert_eq!(
        list_register_source(Some(4), Some(8)),
        ListRegisterSource::SystemRegisters(4)
    );
    assert_eq!(
        list_register_source(None, Some(8)),
        ListRegisterSource::Gich(8)
    );
    assert_eq!(list_register_source(None, None), ListRegisterSource::None);
}

#[test]
fn a_secondary_is_admitted_only_when_it_covers_what_was_published() {
    let required = SystemFeatures::new(qemu_max()).required();
    assert!(secondary_admitted(&qemu_max(), Some(&required)));
    assert!(!secondary_admitted(&cortex_a57(), Some(&required)));
    assert!(!secondary_admitted(&qemu_max(), None));
}

#[test]
fn a_secondary_brings_up_the_gic_the_boot_cpu_chose() {
    let machine = FakeBoot::new(qemu_max());
    init_secondary_gic(&machine, 2, &qemu_max());
    assert_eq!(
        machine.steps(),
        vec!["GIC sysregs", "GIC CPU 2", "ITS CPU 2"]
    );

    let machine = FakeBoot::new(without_gic_sysregs());
    machine.gicv2_driven.store(true, Ordering::Relaxed);
    init_secondary_gic(&machine, 1, &without_gic_sysregs());
    assert_eq!(machine.steps(), vec!["GIC CPU 1"]);

    let machine = FakeBoot::new(without_gic_sysregs());
    init_secondary_gic(&machine, 1, &without_gic_sysregs());
    assert!(machine.steps().is_empty());

    let mut machine = FakeBoot::new(qemu_max());
    machine.gic_cpu_result = Err(GicError::NotInitialised);
    capture_log();
    init_secondary_gic(&machine, 3, &qemu_max());
    assert_eq!(machine.steps(), vec!["GIC sysregs", "GIC CPU 3"]);
    assert_eq!(
        captured_log(),
        vec!["WARN CPU 3: GICv3 CPU interface: NotInitialised"]
    );
}
