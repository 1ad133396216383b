//! `qemu-runner`: builds the hypervisor and the test guest, boots them under
//! QEMU, streams the console and exits 0 only when the guest passes.
//!
//! Usage: `cargo run -p qemu-runner -- [options] [-- extra QEMU arguments]`;
//! `--help` lists the options. Exit codes: 0 pass, 1 the run failed (guest
//! failure, hypervisor panic, timeout), 2 the run could not be made (bad
//! options, missing prerequisite, build error).

use std::process::ExitCode;
use std::time::Duration;

use qemu_runner::{Boot, RunConfig, Scenario};

const USAGE: &str = "\
usage: qemu-runner [options] [-- extra QEMU arguments]

Builds the hypervisor and the test guest, boots them under
qemu-system-aarch64 -machine virt,virtualization=on,gic-version=3, streams the
console and exits 0 only when the guest prints RESULT: PASS.

options:
  --guest SCENARIO   test guest scenario: memory (default) or bad-guest
  --smp N            emulated CPUs (default 4)
  --mem MIB          machine RAM in MiB (default 1024)
  --guest-mem MIB    guest RAM in MiB (vm.conf mem_mib; hypervisor default 128)
  --vcpus N          vCPUs of the VM (vm.conf vcpus; default every CPU)
  --cpu MODEL        QEMU -cpu (default max,pauth=off; cortex-a57 lacks range TLBI)
  --timeout SECONDS  give up and kill QEMU after this long (default 120)
  --gdb              start halted with QEMU's gdb stub on localhost:1234 and print
                     the gdb-multiarch command that attaches (no timeout)
  --direct           boot the guest alone at EL1, without the hypervisor
  -h, --help         this text";

enum Parsed {
    Run(RunConfig),
    Help,
}

fn value<'a>(
    name: &str,
    inline: Option<&'a str>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a str, String> {
    inline
        .or_else(|| rest.next().map(String::as_str))
        .ok_or_else(|| format!("{name} needs a value"))
}

fn number(name: &str, text: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("{name}: `{text}` is not a number"))
}

fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut config = RunConfig::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            config.extra_qemu_args = rest.cloned().collect();
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, inline)) if name.starts_with("--") => (name, Some(inline)),
            _ => (arg.as_str(), None),
        };
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--gdb" => config.gdb = true,
            "--direct" => config.boot = Boot::Direct,
            "--guest" => {
                let scenario = value(name, inline, &mut rest)?;
                config.scenario = Scenario::from_name(scenario).ok_or_else(|| {
                    format!("--guest: unknown scenario `{scenario}` (memory, bad-guest)")
                })?;
            }
            "--smp" => config.smp = number(name, value(name, inline, &mut rest)?)?,
            "--mem" => config.mem_mib = number(name, value(name, inline, &mut rest)?)?,
            "--guest-mem" => {
                config.guest_mem_mib = Some(number(name, value(name, inline, &mut rest)?)?)
            }
            "--vcpus" => config.vcpus = Some(number(name, value(name, inline, &mut rest)?)?),
            "--cpu" => config.cpu = value(name, inline, &mut rest)?.to_string(),
            "--timeout" => {
                let seconds = number(name, value(name, inline, &mut rest)?)?;
                config.timeout = Duration::from_secs(u64::from(seconds));
            }
            _ => return Err(format!("unknown option `{arg}`")),
        }
    }
    Ok(Parsed::Run(config))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse(&args) {
        Ok(Parsed::Run(config)) => config,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("qemu-runner: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "qemu-runner: building {} for aarch64-unknown-none-softfloat",
        match config.boot {
            Boot::Hypervisor => "the hypervisor and the test guest",
            Boot::Direct => "the test guest",
        }
    );
    let report = match qemu_runner::run(&config) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("qemu-runner: {error}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "qemu-runner: {} ({:.1} s, QEMU {})",
        report.verdict,
        report.elapsed.as_secs_f64(),
        report.qemu_status
    );
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<RunConfig, String> {
        let args: Vec<String> = words.split_whitespace().map(String::from).collect();
        match parse(&args)? {
            Parsed::Run(config) => Ok(config),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn options_parse() {
        let config = parse_words(
            "--smp 2 --mem=512 --cpu cortex-a57 --guest bad-guest --timeout 30 --guest-mem 64 \
             -- -d int",
        )
        .unwrap();
        assert_eq!(config.smp, 2);
        assert_eq!(config.mem_mib, 512);
        assert_eq!(config.cpu, "cortex-a57");
        assert_eq!(config.scenario, Scenario::BadGuest);
        assert_eq!(config.timeout, Duration::from_secs(30));
        assert_eq!(config.guest_mem_mib, Some(64));
        assert_eq!(config.extra_qemu_args, ["-d", "int"]);
        assert_eq!(config.boot, Boot::Hypervisor);
        assert!(!config.gdb);
    }

    #[test]
    fn bad_options_are_errors() {
        assert!(parse_words("--smp").is_err());
        assert!(parse_words("--smp many").is_err());
        assert!(parse_words("--guest nope").is_err());
        assert!(parse_words("--frobnicate").is_err());
        assert_eq!(parse_words("--help").unwrap_err(), "help");
        assert_eq!(parse_words("--direct --gdb").unwrap().boot, Boot::Direct);
    }
}
