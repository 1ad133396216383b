//! Measuring kit for the benchmark suites.
//!
//! A figure is a name, a value and a unit, printed as one line. Timings are
//! taken several times and reported as the median, because the machines these
//! run on are shared and noisy; ratios are computed from medians measured in the
//! same run.
//!
//! Every suite also prints, before its figures, the configuration that decides
//! them, one line per setting it compares: `config NAME KEY=VALUE ...`, where
//! `NAME` is the prefix of the figures it covers (`config faults/no_fwb ...`
//! for `faults/no_fwb/...`) and values hold no spaces. The keys every suite
//! uses where they apply:
//!
//! - `engine`: `host` (the engine libraries run on the build machine against
//!   the recording TLB backend and `HostMemory`: no TLBI or cache-maintenance
//!   instruction is executed, their calls are counted) or `qemu` (the
//!   hypervisor on QEMU's TCG, `-cpu` in `cpu`).
//! - `cpu`: QEMU's `-cpu`, or `host` for host runs.
//! - `fwb`: stage 2 forces write-back (`on`: no data cache maintenance) or
//!   not (`off`: every Normal leaf cleaned to PoC when mapped); in QEMU runs
//!   what the hypervisor found on the CPU; `none` without stage 2.
//! - `range_tlbi`: `on` when FEAT_TLBIRANGE is used, `off` without it; in
//!   QEMU runs what the hypervisor found; `none` without stage 2 or TLBI.
//! - `vcpus` (or `threads` for host threads acting as vCPUs): how many run
//!   the measured work.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// Prints one figure as `name value unit`.
pub fn report(name: &str, value: f64, unit: &str) {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        println!("{name} {value:.0} {unit}");
    } else {
        println!("{name} {value:.3} {unit}");
    }
}

/// Prints the configuration that decides the figures under `name`:
/// `config NAME KEY=VALUE ...` (spaces inside a value become `_`).
pub fn config(name: &str, settings: &[(&str, &dyn Display)]) {
    println!("{}", config_line(name, settings));
}

fn config_line(name: &str, settings: &[(&str, &dyn Display)]) -> String {
    let mut line = format!("config {name}");
    for (key, value) in settings {
        let value = value.to_string().replace(' ', "_");
        line.push_str(&format!(" {key}={value}"));
    }
    line
}

/// `on`/`off` for a setting.
pub fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// What the hypervisor of a QEMU run found on the CPU, from its boot line
/// `CPU: ... FEAT_TLBIRANGE yes, ... FEAT_S2FWB no, ...`: `(fwb,
/// range_tlbi)` as `on`/`off`, `unknown` where the line or the feature is
/// missing.
pub fn hypervisor_features(log: &[String]) -> (&'static str, &'static str) {
    let feature = |name: &str| -> &'static str {
        let Some(line) = log.iter().find(|l| l.contains("CPU: PA bits")) else {
            return "unknown";
        };
        match line
            .split(&format!("{name} "))
            .nth(1)
            .and_then(|rest| rest.split([',', ' ']).next())
        {
            Some("yes") => "on",
            Some("no") => "off",
            _ => "unknown",
        }
    };
    (feature("FEAT_S2FWB"), feature("FEAT_TLBIRANGE"))
}

/// Runs `f` `runs` times (after `setup` each time, untimed) and returns the
/// median duration of `f`.
pub fn median_time<S, T>(
    runs: usize,
    mut setup: impl FnMut() -> S,
    mut f: impl FnMut(S) -> T,
) -> Duration {
    assert!(runs > 0, "at least one run is needed for a median");
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let state = setup();
            let start = Instant::now();
            let out = f(state);
            let elapsed = start.elapsed();
            drop(std::hint::black_box(out));
            elapsed
        })
        .collect();
    times.sort();
    times[runs / 2]
}

/// The median of a slice of samples (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    assert!(!samples.is_empty(), "median of no samples");
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_picks_the_middle_sample() {
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn config_line_names_every_setting() {
        let line = config_line(
            "faults/fwb",
            &[("fwb", &"on"), ("threads", &"1,2"), ("cpu", &"a b")],
        );
        assert_eq!(line, "config faults/fwb fwb=on threads=1,2 cpu=a_b");
    }

    #[test]
    fn hypervisor_features_read_the_boot_line() {
        let log = [
            "CPUs: 2 online of 2 in the device tree".to_string(),
            "CPU: PA bits 48, VMID bits 16, FEAT_TLBIRANGE yes, VHE yes, FEAT_TTL yes, \
             FEAT_S2FWB no, list registers 4 (system-wide over 2 CPU(s))"
                .to_string(),
        ];
        assert_eq!(hypervisor_features(&log), ("off", "on"));
        let log = [log[1]
            .replace("FEAT_S2FWB no", "FEAT_S2FWB yes")
            .replace("TLBIRANGE yes", "TLBIRANGE no")];
        assert_eq!(hypervisor_features(&log), ("on", "off"));
        assert_eq!(hypervisor_features(&[]), ("unknown", "unknown"));
    }

    #[test]
    fn median_time_runs_setup_and_body_each_time() {
        let mut setups = 0;
        let mut bodies = 0;
        let _ = median_time(5, || setups += 1, |()| bodies += 1);
        assert_eq!((setups, bodies), (5, 5));
    }
}
