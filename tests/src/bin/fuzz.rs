//! Long fuzz campaigns: `cargo run --release -p tests --bin fuzz -- --seeds N`.
//!
//! Boots the test guest's `fuzz` scenario under the hypervisor for seeds
//! `first..first + N`, `--per-boot` seeds per boot, alternating the `-cpu`
//! models given (and the hosts' GICs given with `--gic`: after each round of
//! models, the next GIC), and prints the campaign's figures as `fuzz/NAME VALUE UNIT`
//! lines (seeds, ops, hv_panics, vm_stops, violations). `--allow virtqueue`
//! adds the virtio-console family (the VM gets `console=virtio`). Every failure is
//! printed with its seed and the command that replays it; the exit status is
//! 0 only for a clean campaign.

use std::process::ExitCode;
use std::time::Instant;

use qemu_runner::qemu::GicVersion;
use tests::fuzz::{self, Campaign};

const USAGE: &str = "\
usage: fuzz --seeds N [--first-seed S] [--ops M] [--per-boot K] [--cpu MODEL]... [--gic 2|3]...
            [--allow LIST] [--smp N]

  --seeds N        seeds to run (required)
  --first-seed S   first seed (default 1)
  --ops M          operations per seed and vCPU (default 300)
  --per-boot K     seeds per boot (default 50)
  --cpu MODEL      QEMU -cpu; repeat to alternate boots between models
                   (default: max,pauth=off and cortex-a57)
  --gic 2|3        the host's GIC (QEMU gic-version; a GICv2 host gives the
                   VM a GICv2, at most 8 CPUs); repeat to alternate: each
                   round of --cpu models on one GIC, then the next
                   (default: 3)
  --allow LIST     fuzz-allow list (the default mix has every family but
                   virtqueue and gicv2-sgi-pend; the guest also takes
                   fuzz-deny=LIST to leave some out) (default: none);
                   `virtqueue` boots the VM with console=virtio and checks
                   the lines its chains bring out
  --smp N          emulated CPUs and vCPUs (default 4)";

fn parse(args: &[String]) -> Result<(Campaign, Vec<GicVersion>), String> {
    let mut gics = Vec::new();
    let mut campaign = Campaign {
        first_seed: 1,
        seeds: 0,
        ops: 300,
        per_boot: 50,
        cpus: Vec::new(),
        allow: String::new(),
        deny: String::new(),
        smp: 4,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| rest.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let mut number = |name: &str| -> Result<u64, String> {
            let text = value()?;
            text.parse()
                .map_err(|_| format!("{name}: `{text}` is not a number"))
        };
        match name {
            "--seeds" => campaign.seeds = number(name)?,
            "--first-seed" => campaign.first_seed = number(name)?,
            "--ops" => campaign.ops = number(name)?,
            "--per-boot" => campaign.per_boot = number(name)?.max(1),
            "--smp" => campaign.smp = number(name)?.clamp(1, 8) as u32,
            "--cpu" => campaign.cpus.push(value()?),
            "--allow" => campaign.allow = value()?,
            "--gic" => {
                let text = value()?;
                gics.push(
                    GicVersion::parse(&text)
                        .ok_or_else(|| format!("--gic: `{text}` is not 2 or 3"))?,
                );
            }
            _ => return Err(format!("unknown option `{arg}`")),
        }
    }
    if campaign.seeds == 0 {
        return Err("--seeds N is required".into());
    }
    if campaign.cpus.is_empty() {
        campaign.cpus = vec![qemu_runner::DEFAULT_CPU.to_string(), "cortex-a57".into()];
    }
    if gics.is_empty() {
        gics.push(GicVersion::V3);
    }
    Ok((campaign, gics))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let (campaign, gics) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("fuzz: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let tally = fuzz::run_on(&campaign, &gics, |boot, tally| {
        let (first, count) = boot.seeds;
        eprintln!(
            "fuzz: seeds {first}..{} on {} GICv{}: {} ({} seeds, {} ops, {} violations so far, \
             {:.0} s)",
            first + count,
            boot.cpu,
            boot.gic.number(),
            match &boot.report {
                Some(report) => report.verdict.to_string(),
                None => boot.error.clone().unwrap_or_default(),
            },
            tally.seeds,
            tally.ops,
            tally.violations,
            started.elapsed().as_secs_f64()
        );
        let s = &boot.summary;
        for line in s.violation_lines.iter().chain(&s.panics).chain(&s.vm_stops) {
            eprintln!("fuzz:   {line}");
        }
    });
    for failure in &tally.failures {
        println!(
            "fuzz: FAIL seed {} on {}: {}\n  rerun: {}",
            failure.seed, failure.cpu, failure.what, failure.rerun
        );
    }
    print!("{}", tally.figures());
    println!(
        "fuzz/interrupts {} interrupts\nfuzz/time {:.0} s",
        tally.interrupts,
        started.elapsed().as_secs_f64()
    );
    if tally.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
