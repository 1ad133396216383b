//! Measuring kit for the benchmark suites.
//!
//! A figure is a name, a value and a unit, printed as one line. Timings are
//! taken several times and reported as the median, because the machines these
//! run on are shared and noisy; ratios are computed from medians measured in the
//! same run.

use std::time::{Duration, Instant};

/// Prints one figure as `name value unit`.
pub fn report(name: &str, value: f64, unit: &str) {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        println!("{name} {value:.0} {unit}");
    } else {
        println!("{name} {value:.3} {unit}");
    }
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
    fn median_time_runs_setup_and_body_each_time() {
        let mut setups = 0;
        let mut bodies = 0;
        let _ = median_time(5, || setups += 1, |()| bodies += 1);
        assert_eq!((setups, bodies), (5, 5));
    }
}
