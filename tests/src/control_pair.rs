//! The two-VM layout every control scenario boots: a control VM `ctl`
//! (`control=1`, CPU 0) and its peer `peer` on CPUs `1..=peer_vcpus`, which
//! the control VM stops (`expect=stopped`). Used by the end-to-end tests of
//! the control, dirty-log, page-table and memslot-perf scenarios and by the
//! benchmark suites that time them.

use std::time::Duration;

use qemu_runner::vmspec::VmSpec;
use qemu_runner::{Boot, RunConfig, RunReport};

/// One control VM and its peer.
#[derive(Clone, Debug)]
pub struct ControlPair<'a> {
    /// QEMU `-cpu`.
    pub cpu: &'a str,
    /// The control VM's scenario (`test=`).
    pub control: &'a str,
    /// The control VM's bootargs beside `test=` (may be empty).
    pub args: &'a str,
    /// The peer's scenario.
    pub peer: &'a str,
    /// The peer's vCPU count.
    pub peer_vcpus: u32,
    /// The run's time limit.
    pub timeout: Duration,
}

impl<'a> ControlPair<'a> {
    /// `control` against `peer` (one vCPU) on `-cpu max`, no bootargs,
    /// five minutes.
    pub fn new(control: &'a str, peer: &'a str) -> Self {
        Self {
            cpu: "max",
            control,
            args: "",
            peer,
            peer_vcpus: 1,
            timeout: Duration::from_secs(300),
        }
    }

    /// The run configuration of the pair; `Err` when a VM spec built from
    /// the fields does not parse.
    pub fn config(&self) -> Result<RunConfig, String> {
        let args = if self.args.is_empty() {
            String::new()
        } else {
            format!(",args={}", self.args)
        };
        let control = format!("guest={},cpus=0,control=1,name=ctl{args}", self.control);
        let peer = format!(
            "guest={},cpus=1-{},name=peer,expect=stopped",
            self.peer, self.peer_vcpus
        );
        Ok(RunConfig {
            boot: Boot::Hypervisor,
            smp: self.peer_vcpus + 1,
            cpu: self.cpu.to_string(),
            timeout: self.timeout,
            echo: false,
            vms: vec![
                VmSpec::parse(&control, 0).map_err(|e| e.to_string())?,
                VmSpec::parse(&peer, 1).map_err(|e| e.to_string())?,
            ],
            ..RunConfig::default()
        })
    }

    /// Boots the pair; `Err` when QEMU could not run (a run that ran but
    /// failed is an `Ok` report whose verdict says so).
    pub fn run(&self) -> Result<RunReport, String> {
        qemu_runner::run(&self.config()?).map_err(|e| format!("could not run QEMU: {e}"))
    }

    /// Boots the pair for an end-to-end test ([`crate::e2e::run`]): panics
    /// when QEMU could not run or the configuration could not be made.
    pub fn boot(&self) -> RunReport {
        crate::e2e::run(&self.config().unwrap_or_else(|error| panic!("{error}")))
    }

    /// Prints the benchmark `config` line for figures under `name` that
    /// come from a passed run of this pair: QEMU's CPU and CPU count, the
    /// stage-2 features the hypervisor found (from `run`'s log), the
    /// peer's vCPUs and the control VM's bootargs, then `extra`.
    pub fn print_config(
        &self,
        name: &str,
        run: &RunReport,
        extra: &[(&str, &dyn std::fmt::Display)],
    ) {
        let (fwb, range_tlbi) = crate::measure::hypervisor_features(run.hypervisor_log());
        let smp = self.peer_vcpus + 1;
        let args = if self.args.is_empty() {
            "none"
        } else {
            self.args
        };
        let mut settings: Vec<(&str, &dyn std::fmt::Display)> = vec![
            ("engine", &"qemu"),
            ("cpu", &self.cpu),
            ("fwb", &fwb),
            ("range_tlbi", &range_tlbi),
            ("vcpus", &self.peer_vcpus),
            ("smp", &smp),
            ("control", &self.control),
            ("peer", &self.peer),
            ("args", &args),
        ];
        settings.extend_from_slice(extra);
        crate::measure::config(name, &settings);
    }

    /// [`ControlPair::run`] for a benchmark: `Err` also when the run failed.
    pub fn run_passed(&self) -> Result<RunReport, String> {
        let run = self.run()?;
        if run.passed() {
            Ok(run)
        } else {
            Err(run.explain())
        }
    }
}

/// The peer's counter `name` (`STAT vm1 NAME VALUE`); panics with the run's
/// story when it is missing.
pub fn peer_counter(report: &RunReport, name: &str) -> u64 {
    crate::e2e::counter(report, 1, name)
}
