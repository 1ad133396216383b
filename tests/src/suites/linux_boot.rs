//! `linux_boot`: time from QEMU's start to the Linux guest's first user-space
//! line, under the hypervisor and booted directly at EL1.
//!
//! Both boot the same Debian arm64 kernel and the same busybox initramfs (the
//! runner's test `/init`, which prints `LINUX-INIT: started` first) on the
//! same `-cpu max,pauth=off`, 2 CPUs, 512 MiB of guest RAM; the hypervisor's
//! machine has 1024 MiB to hold the guest's. The kernel logs at
//! `loglevel=5`, so console traffic (a trap per byte under the hypervisor)
//! stays small. Runs alternate between the two boots, three each; a figure
//! counts only from a run that passed (`RESULT: PASS`, QEMU exited 0), and is
//! the time the marker line arrived on the console. The figures are the
//! medians and `overhead`, hypervisor over direct. A failed hypervisor run
//! ends the hypervisor side: the suite prints the direct figure it has, says
//! why, and exits non-zero.

use std::time::Duration;

use qemu_runner::initramfs::INIT_MARKER;
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::{Boot, RunConfig};

use crate::measure::{config, hypervisor_features, median, report};

/// Runs per boot mode.
const RUNS: usize = 3;

fn boot_name(boot: Boot) -> &'static str {
    match boot {
        Boot::Hypervisor => "hypervisor",
        Boot::Direct => "direct",
    }
}

/// The configuration of a boot, for its `config` line: `(key, value)`.
type Settings = Vec<(&'static str, String)>;

/// One boot: the seconds to the marker and the boot's configuration, or why
/// there is no figure.
fn time_to_marker(boot: Boot) -> Result<(f64, Settings), String> {
    let config = RunConfig {
        echo: false,
        ..RunConfig::linux(boot, LinuxBoot::debian(BusyboxInit::Test))
    };
    let run = qemu_runner::run(&config).map_err(|error| format!("could not run: {error}"))?;
    let (fwb, range_tlbi) = match boot {
        Boot::Hypervisor => hypervisor_features(run.hypervisor_log()),
        Boot::Direct => ("none", "none"),
    };
    let settings = vec![
        ("engine", "qemu".to_string()),
        ("cpu", config.cpu.clone()),
        ("fwb", fwb.to_string()),
        ("range_tlbi", range_tlbi.to_string()),
        ("vcpus", config.smp.to_string()),
        ("machine_mem_mib", config.mem_mib.to_string()),
        (
            "guest_mem_mib",
            config
                .guest_mem_mib
                .map_or_else(|| "default".to_string(), |m| m.to_string()),
        ),
        ("runs", RUNS.to_string()),
    ];
    let tail: Vec<&str> = run.console().lines().rev().take(15).collect();
    let context = || {
        format!(
            "{}\ncommand: {}\nlast console lines:\n{}",
            run.verdict,
            run.command_line,
            tail.iter().rev().copied().collect::<Vec<_>>().join("\n")
        )
    };
    if !run.passed() {
        return Err(context());
    }
    run.time_to(INIT_MARKER)
        .map(|at: Duration| (at.as_secs_f64(), settings))
        .ok_or_else(|| format!("passed without a `{INIT_MARKER}` line: {}", context()))
}

/// Prints the figures; exits the process with status 1 when the hypervisor
/// boot failed.
pub fn run() {
    let mut samples: [(Boot, Vec<f64>, Settings); 2] = [
        (Boot::Hypervisor, Vec::new(), Vec::new()),
        (Boot::Direct, Vec::new(), Vec::new()),
    ];
    let mut hypervisor_failure: Option<String> = None;
    for round in 1..=RUNS {
        for (boot, times, settings) in &mut samples {
            if *boot == Boot::Hypervisor && hypervisor_failure.is_some() {
                continue;
            }
            eprintln!("linux_boot: {} run {round}/{RUNS}", boot_name(*boot));
            match time_to_marker(*boot) {
                Ok((seconds, of_run)) => {
                    times.push(seconds);
                    *settings = of_run;
                }
                Err(why) if *boot == Boot::Hypervisor => hypervisor_failure = Some(why),
                Err(why) => {
                    eprintln!("linux_boot: the direct boot failed: {why}");
                    std::process::exit(1);
                }
            }
        }
    }
    let mut medians = Vec::new();
    for (boot, times, settings) in &mut samples {
        if times.len() == RUNS {
            let settings: Vec<(&str, &dyn std::fmt::Display)> = settings
                .iter()
                .map(|(key, value)| (*key, value as &dyn std::fmt::Display))
                .collect();
            config(&format!("linux_boot/{}", boot_name(*boot)), &settings);
            let seconds = median(times);
            report(
                &format!("linux_boot/{}/time_to_marker", boot_name(*boot)),
                seconds,
                "s",
            );
            medians.push(seconds);
        }
    }
    if let Some(why) = hypervisor_failure {
        eprintln!(
            "linux_boot: Linux did not boot under the hypervisor, so there is no hypervisor \
             figure and no overhead: {why}"
        );
        std::process::exit(1);
    }
    if let [hypervisor, direct] = medians[..] {
        report("linux_boot/overhead", hypervisor / direct, "x");
    }
}
