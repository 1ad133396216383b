//! `linux_boot`: Linux under the hypervisor against Linux booted directly at
//! EL1, in two configurations, and where the hypervisor's time goes.
//!
//! Both boots run the same Debian arm64 kernel and the same busybox
//! initramfs (the runner's test `/init`: `LINUX-INIT: started` first, then
//! the CPU check, 128 MiB written through tmpfs and its md5 checked,
//! `RESULT: PASS`) on the same `-cpu max,pauth=off`; under the hypervisor
//! the machine has twice the guest's RAM to hold it. The kernel logs at
//! `loglevel=5`, so console traffic (a trap per byte under the hypervisor)
//! stays small.
//!
//! - `linux_boot/...`: 2 CPUs, 512 MiB; the figure is the time from QEMU's
//!   start to the marker line (`time_to_marker`).
//! - `linux_boot/4cpu_1g/...`: 4 CPUs, 1 GiB; the figure is the time to
//!   `RESULT: PASS` (`time_to_result`: boot plus the tmpfs md5).
//!
//! `LINUX_BOOT_SETUPS=2cpu` or `=4cpu_1g` runs one of them.
//!
//! Runs alternate between the two boots, three each; a figure counts only
//! from a run that passed (`RESULT: PASS`, QEMU exited 0). The figures are
//! the medians and `overhead`, hypervisor over direct, same run. A failed
//! hypervisor run ends that configuration's hypervisor side: the suite
//! prints the direct figure it has, says why, and exits non-zero at the end.
//!
//! After each configuration the suite prints the exit table of the
//! hypervisor run with the median time, from the `STAT` lines the
//! hypervisor prints at power-off (`vm::exit_profile`): per exit class the
//! count, the time at EL2 (from the exit to the next entry, generic timer
//! ticks converted to ms), the mean per exit and the share of all EL2 time;
//! then the number of list-register refills, how often the vgic's lock was
//! found taken and how long its waiters waited (`vgic_lock_wait`, inside the
//! exits' time), the guest's own time and EL2's share of all vCPU time. These
//! are the whole run's (boot, md5 and power-off).

use std::time::Duration;

use qemu_runner::console::Counters;
use qemu_runner::initramfs::INIT_MARKER;
use qemu_runner::linux::{BusyboxInit, LinuxBoot};
use qemu_runner::{Boot, RunConfig};

use crate::measure::{config as print_config, hypervisor_features, median, report};

/// Runs per boot mode.
const RUNS: usize = 3;

/// One configuration the suite measures.
struct Setup {
    /// The figures' name prefix.
    prefix: &'static str,
    /// CPUs (`-smp`, and the VM's vCPUs).
    cpus: u32,
    /// Guest RAM in MiB.
    guest_mib: u32,
    /// The console line whose arrival is the figure.
    line: &'static str,
    /// The figure's name.
    figure: &'static str,
}

/// The configurations, in the order they run.
const SETUPS: [Setup; 2] = [
    Setup {
        prefix: "linux_boot",
        cpus: 2,
        guest_mib: 512,
        line: INIT_MARKER,
        figure: "time_to_marker",
    },
    Setup {
        prefix: "linux_boot/4cpu_1g",
        cpus: 4,
        guest_mib: 1024,
        line: "RESULT: PASS",
        figure: "time_to_result",
    },
];

fn boot_name(boot: Boot) -> &'static str {
    match boot {
        Boot::Hypervisor => "hypervisor",
        Boot::Direct => "direct",
    }
}

/// The run configuration of `setup` booted with `boot`.
fn config(setup: &Setup, boot: Boot) -> RunConfig {
    let base = RunConfig::linux(boot, LinuxBoot::debian(BusyboxInit::Test));
    let (mem_mib, guest_mem_mib) = match boot {
        Boot::Hypervisor => (2 * setup.guest_mib, Some(setup.guest_mib)),
        Boot::Direct => (setup.guest_mib, None),
    };
    RunConfig {
        echo: false,
        smp: setup.cpus,
        mem_mib,
        guest_mem_mib,
        ..base
    }
}

/// One boot: the seconds to `setup`'s line and the run's `STAT` counters,
/// or why there is no figure.
fn time_to_line(setup: &Setup, boot: Boot) -> Result<Sample, String> {
    let config = config(setup, boot);
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
    let seconds = run
        .time_to(setup.line)
        .map(|at: Duration| at.as_secs_f64())
        .ok_or_else(|| format!("passed without a `{}` line: {}", setup.line, context()))?;
    Ok(Sample {
        seconds,
        settings,
        counters: run.counters().clone(),
        vm_built: run.time_to(VM_BUILT_LINE),
        hypervisor_started: run.time_to(HYPERVISOR_LINE),
    })
}

/// The start of every line of the hypervisor's log.
const HYPERVISOR_LINE: &str = "[hv] ";
/// The hypervisor's line saying VM 0 is built (`runtime::vm_instance`).
const VM_BUILT_LINE: &str = "[hv] vm0: ";

/// What one passed run measured.
struct Sample {
    /// Seconds to the setup's line.
    seconds: f64,
    /// The boot's configuration, for its `config` line: `(key, value)`.
    settings: Vec<(&'static str, String)>,
    /// The hypervisor's `STAT` counters (none for a direct boot).
    counters: Counters,
    /// When the hypervisor had VM 0 built (the boot image copied in; its
    /// RAM is zeroed on first use), after QEMU started.
    vm_built: Option<Duration>,
    /// When the hypervisor printed its first line (the firmware had loaded
    /// and started it).
    hypervisor_started: Option<Duration>,
}

/// One row of the exit table: a name, a count and its ticks.
struct Row {
    name: String,
    count: u64,
    ticks: u64,
}

/// The exit classes of `counters` (VM 0), as the hypervisor named them
/// (`exit_<class>_count` and `_ticks`), most time first.
fn exit_rows(counters: &Counters) -> Vec<Row> {
    let mut rows: Vec<Row> = counters
        .iter()
        .filter_map(|((vm, name), &count)| {
            let class = name.strip_prefix("exit_")?.strip_suffix("_count")?;
            let ticks = counters.get(*vm, &format!("exit_{class}_ticks"))?;
            (*vm == 0).then(|| Row {
                name: class.to_string(),
                count,
                ticks,
            })
        })
        .collect();
    rows.sort_by(|a, b| b.ticks.cmp(&a.ticks).then(a.name.cmp(&b.name)));
    rows
}

/// Prints the exit table of one hypervisor run (see the module doc).
fn print_exit_table(prefix: &str, sample: &Sample) {
    let counters = &sample.counters;
    let Some(hz) = counters.get(0, "ticks_per_second").filter(|&hz| hz > 0) else {
        println!("{prefix}: no exit profile in the hypervisor's STAT lines");
        return;
    };
    let ms = |ticks: u64| ticks as f64 * 1000.0 / hz as f64;
    let rows = exit_rows(counters);
    let el2: u64 = rows.iter().map(|r| r.ticks).sum();
    let exits: u64 = rows.iter().map(|r| r.count).sum();
    println!("{prefix}: exits of the median hypervisor run (all vCPUs, timer at {hz} Hz)");
    println!(
        "  {:<18} {:>9} {:>11} {:>11} {:>7}",
        "class", "count", "total ms", "mean us", "share"
    );
    for row in rows.iter().filter(|r| r.count > 0) {
        println!(
            "  {:<18} {:>9} {:>11.1} {:>11.2} {:>6.1}%",
            row.name,
            row.count,
            ms(row.ticks),
            ms(row.ticks) * 1000.0 / row.count as f64,
            100.0 * row.ticks as f64 / el2.max(1) as f64
        );
    }
    println!(
        "  {:<18} {:>9} {:>11.1} {:>11.2} {:>6.1}%",
        "all",
        exits,
        ms(el2),
        ms(el2) * 1000.0 / exits.max(1) as f64,
        100.0
    );
    let fills = counters
        .get(0, "work_list_register_fill_count")
        .unwrap_or(0);
    println!("  list-register refills (inside the exits above): {fills}");
    let lock = |name: &str| counters.get(0, name).unwrap_or(0);
    let (contended, sleeps, waited) = (
        lock("vgic_lock_contended"),
        lock("vgic_lock_sleeps"),
        lock("vgic_lock_wait_ticks"),
    );
    println!(
        "  vgic lock (inside the exits above): found taken {contended} times, {sleeps} sleeps, \
         {:.1} ms waited ({:.1} us each)",
        ms(waited),
        ms(waited) * 1000.0 / contended.max(1) as f64
    );
    let guest = counters.get(0, "guest_ticks").unwrap_or(0);
    let share = 100.0 * el2 as f64 / (el2 + guest).max(1) as f64;
    println!(
        "  guest {:.1} ms, EL2 {:.1} ms: EL2 is {share:.1}% of all vCPU time",
        ms(guest),
        ms(el2)
    );
    if let (Some(started), Some(built)) = (sample.hypervisor_started, sample.vm_built) {
        println!(
            "  hypervisor's first line {} ms after QEMU started, VM 0 built (boot image \
             copied) at {} ms",
            started.as_millis(),
            built.as_millis()
        );
    }
    report(&format!("{prefix}/hypervisor/exits"), exits as f64, "exits");
    report(&format!("{prefix}/hypervisor/el2_share"), share, "%");
    report(
        &format!("{prefix}/hypervisor/vgic_lock_wait"),
        ms(waited),
        "ms",
    );
}

/// Measures `setup`; false when its hypervisor boot failed (reported).
fn measure(setup: &Setup) -> bool {
    let mut samples: [(Boot, Vec<Sample>); 2] =
        [(Boot::Hypervisor, Vec::new()), (Boot::Direct, Vec::new())];
    let mut hypervisor_failure: Option<String> = None;
    println!(
        "{}: -cpu max,pauth=off, {} CPUs, {} MiB guest RAM, figure: time to `{}`",
        setup.prefix, setup.cpus, setup.guest_mib, setup.line
    );
    for round in 1..=RUNS {
        for (boot, runs) in &mut samples {
            if *boot == Boot::Hypervisor && hypervisor_failure.is_some() {
                continue;
            }
            eprintln!("{}: {} run {round}/{RUNS}", setup.prefix, boot_name(*boot));
            match time_to_line(setup, *boot) {
                Ok(run) => runs.push(run),
                Err(why) if *boot == Boot::Hypervisor => hypervisor_failure = Some(why),
                Err(why) => {
                    eprintln!("{}: the direct boot failed: {why}", setup.prefix);
                    std::process::exit(1);
                }
            }
        }
    }
    let mut medians = Vec::new();
    for (boot, runs) in &mut samples {
        if runs.len() == RUNS {
            let mut times: Vec<f64> = runs.iter().map(|run| run.seconds).collect();
            let seconds = median(&mut times);
            let settings: Vec<(&str, &dyn std::fmt::Display)> = runs[0]
                .settings
                .iter()
                .map(|(key, value)| (*key, value as &dyn std::fmt::Display))
                .collect();
            print_config(&format!("{}/{}", setup.prefix, boot_name(*boot)), &settings);
            report(
                &format!("{}/{}/{}", setup.prefix, boot_name(*boot), setup.figure),
                seconds,
                "s",
            );
            medians.push(seconds);
            if *boot == Boot::Hypervisor
                && let Some(sample) = runs.iter().find(|run| run.seconds == seconds)
            {
                print_exit_table(setup.prefix, sample);
            }
        }
    }
    if let Some(why) = hypervisor_failure {
        eprintln!(
            "{}: Linux did not boot under the hypervisor, so there is no hypervisor \
             figure and no overhead: {why}",
            setup.prefix
        );
        return false;
    }
    if let [hypervisor, direct] = medians[..] {
        report(
            &format!("{}/overhead", setup.prefix),
            hypervisor / direct,
            "x",
        );
    }
    true
}

/// Prints the figures of every configuration; exits the process with status
/// 1 when a hypervisor boot failed.
pub fn run() {
    let mut failed = false;
    // `LINUX_BOOT_SETUPS=4cpu_1g` (or `2cpu`, or both comma-separated)
    // runs only those configurations.
    let only = std::env::var("LINUX_BOOT_SETUPS").ok();
    let name = |setup: &Setup| {
        setup
            .prefix
            .strip_prefix("linux_boot/")
            .unwrap_or("2cpu")
            .to_string()
    };
    for setup in &SETUPS {
        if let Some(only) = &only
            && !only.split(',').any(|n| n.trim() == name(setup))
        {
            continue;
        }
        failed |= !measure(setup);
    }
    if failed {
        std::process::exit(1);
    }
}
