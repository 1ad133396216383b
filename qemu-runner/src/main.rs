//! `qemu-runner`: builds the hypervisor and the test guest (or fetches a
//! Linux guest), boots them under QEMU, streams the console and exits 0 only
//! when the guest passes.
//!
//! Linux options are gathered first and applied last: a Linux guest changes
//! the defaults of the options the command line did not give
//! ([`RunConfig::linux`]).
//!
//! Usage: `cargo run -p qemu-runner -- [options] [-- extra QEMU arguments]`;
//! `--help` lists the options. Exit codes: 0 pass, 1 the run failed (guest
//! failure, hypervisor panic, timeout), 2 the run could not be made (bad
//! options, missing prerequisite, build error).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use qemu_runner::linux::{BusyboxInit, InitrdSource, KernelSource, LinuxBoot};
use qemu_runner::vmspec::{VmGuest, VmSpec, default_smp};
use qemu_runner::{Boot, ConsoleInput, Firmware, RunConfig, Scenario};

const USAGE: &str = "\
usage: qemu-runner [options] [-- extra QEMU arguments]

Builds the hypervisor and the test guest, boots them under
qemu-system-aarch64 -machine virt,virtualization=on,gic-version=3 (or 2), streams the
console and exits 0 only when the guest prints RESULT: PASS.

options:
  --guest SCENARIO   test guest scenario (default memory; the list follows)
  --guest-args WORDS more test guest bootargs, e.g. 'seed=5 seeds=10 ops=400'
                     for fuzz (fuzz-deny=a,b takes operation families
                     out of the default mix; fuzz-verbose=1 prints a line
                     before every operation)
  --smp N            emulated CPUs (default 4)
  --mem MIB          machine RAM in MiB (default 1024)
  --guest-mem MIB    guest RAM in MiB (vm.conf mem_mib; hypervisor default 128)
  --vcpus N          vCPUs of the VM (vm.conf vcpus; default every CPU)
  --cpu MODEL        QEMU -cpu (default max,pauth=off; cortex-a57 lacks range TLBI)
  --gic 2|3          the machine's GIC version (default 3; GICv2 allows --smp <= 8)
  --mte              the machine has memory tagging (QEMU's mte=on; needs --cpu
                     max) and the one VM may use it (with --vm: each VM that
                     says mte=on)
  --timeout SECONDS  give up and kill QEMU after this long (default 120; an
                     interactive session has no limit unless this is given)
  --stay             when standard input is a terminal, keep the run open until
                     QEMU exits (`poweroff` in the monitor, a guest powering the
                     machine off, Ctrl-A x) instead of ending it once every VM
                     has its verdict; no time limit unless --timeout is given
  --gdb              start halted with QEMU's gdb stub on localhost:1234 and print
                     the gdb-multiarch command that attaches (no timeout)
  --direct           boot the guest alone at EL1, without the hypervisor
  --emit DIR         build and write hypervisor.img and payload.cpio into DIR
                     (the files a board's U-Boot loads) instead of running QEMU
  --firmware NAME    what starts the hypervisor: none (default: QEMU's -kernel)
                     or u-boot (Debian's u-boot-qemu loads it and the payload
                     from fw_cfg and runs booti, as on a board)

Linux guest (instead of the test guest; defaults become --smp 2, --guest-mem 512,
--mem 1024 under the hypervisor or 512 with --direct, --timeout 300):
  --linux            Debian's arm64 kernel (linux-image-arm64) and a busybox
                     initramfs with an interactive shell; fetched with apt-get
                     download and cached in target/linux/
  --linux-test       the initramfs runs the unattended check instead (marker
                     line, CPUs online, 128 MiB through tmpfs, RESULT line,
                     power off); implies --linux
  --kernel PATH      this kernel (arm64 Image, or gzip-compressed Image)
  --initrd PATH      this initrd (instead of the busybox initramfs)
                     (a shell, or --kernel/--initrd files, pass when QEMU exits 0;
                     they read the terminal when standard input is one, and
                     otherwise get no input and run under --timeout)
  --cmdline TEXT     kernel command line (default: console=ttyAMA0 earlycon
                     rdinit=/init, plus loglevel=5 with --linux-test)

Devices (QEMU's virtio-mmio, modern transport):
  --disk PATH[:ro]   a raw image file as a virtio-blk disk (:ro read-only): a
                     --direct guest sees it itself (repeatable); under the
                     hypervisor its one VM gets it (vm.conf disk=0)
  --net NET          QEMU's own virtio-net for a --direct guest: user
                     (restricted user-mode network), listen:PORT or
                     connect:PORT (two QEMUs on one Ethernet segment over
                     127.0.0.1:PORT; start the listening one first)

Several VMs (instead of the one-VM options --guest, --guest-args, --vcpus,
--guest-mem and the Linux options):
  --vm SPEC          one VM; give it once per VM, e.g.
                       --vm guest=memory,cpus=0-1,mem=256 --vm linux,cpus=2-3
                       --vm kernel=PATH,cpus=4,name=x,control=1
                     SPEC items: SCENARIO or guest=SCENARIO, args=WORDS, linux
                     (the unattended check), linux-shell, kernel=PATH,
                     initrd=PATH, cpus=LIST (one vCPU per CPU; required beside
                     other VMs), mem=MIB, name=NAME (default vm<i>), control=0|1,
                     net=NAME (the hypervisor's network it is on), mac=MAC,
                     disk=PATH[:ro] (a raw image as its virtio-blk),
                     console=virtio (also a virtio-console, Linux hvc0),
                     device=PATH (a host device-tree node it owns, e.g.
                     /virtio_mmio@a003e00; repeatable), ram=identity (RAM at
                     guest-physical == host-physical, for DMA),
                     pass-disk=PATH[:ro] (a raw image as a virtio-blk of
                     QEMU's that it owns), pass-net=PORT (a virtio-net of
                     QEMU's that it owns, on QEMU's restricted user network,
                     127.0.0.1:PORT forwarded to its port PORT),
                     mte=on (the guest may use memory tagging; run with
                     --mte), pass-pcie=PATH[:ro] (a raw image as a virtio-blk PCI
                     device of QEMU's; the VM owns the PCIe host bridge
                     /pcie@10000000; one VM only),
                     expect=pass|stopped|running, cmdline=TEXT (last: takes the
                     rest). The run passes when every VM does what it expects:
                     prints its own RESULT: PASS, is stopped by the hypervisor,
                     or keeps running.
                     Defaults: --smp the highest CPU named + 1, --mem 1024 or the
                     VMs' RAM + 512, --timeout 300 with a Linux VM.
  --spare-cpu        one more CPU in the default --smp that no VM names (the
                     hypervisor's own)
  -h, --help         this text

At a terminal (standard input is one), QEMU reads it in raw mode in every run,
one VM or eight, test guests or Linux: typing goes to the console (the focused
VM), Ctrl-] opens the hypervisor's monitor (help, vms, focus VM, migrate SRC DST,
poweroff, ...; exit or Ctrl-] returns), Ctrl-] Ctrl-] sends one Ctrl-] to the VM,
Ctrl-C goes to the guest or the monitor, Ctrl-A x quits QEMU. A run whose VMs have
verdicts still ends once every VM has its verdict (--stay keeps it open); one
whose guests have none (echo, linux-shell, --linux) lasts until QEMU exits. The
terminal's mode is restored however the run ends (QEMU exits, the verdicts, the
time limit, SIGINT/SIGTERM, a runner panic). Without a terminal QEMU gets no input.";

/// The usage text with the test guest's scenarios.
fn usage() -> String {
    format!(
        "{USAGE}\n\ntest guest scenarios (--guest): {}",
        qemu_runner::scenario_names()
    )
}

enum Parsed {
    Run(RunConfig),
    /// `--emit DIR`: build and write the boot files, run nothing.
    Emit(RunConfig, std::path::PathBuf),
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

/// The Linux options as given.
#[derive(Default)]
struct LinuxOptions {
    debian: bool,
    test: bool,
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
}

impl LinuxOptions {
    /// The Linux guest they name, if any.
    fn boot(self) -> Result<Option<LinuxBoot>, String> {
        let debian = self.debian || self.test;
        if self.test && self.initrd.is_some() {
            return Err("--linux-test builds its own initramfs; it takes no --initrd".into());
        }
        let kernel = match (self.kernel, debian) {
            (Some(path), _) => KernelSource::File(path.into()),
            (None, true) => KernelSource::Debian,
            (None, false) if self.initrd.is_some() => {
                return Err("--initrd needs --kernel or --linux".into());
            }
            (None, false) if self.cmdline.is_some() => {
                return Err("--cmdline needs --kernel or --linux".into());
            }
            (None, false) => return Ok(None),
        };
        let initrd = match (self.initrd, debian, self.test) {
            (Some(path), _, _) => InitrdSource::File(path.into()),
            (None, true, true) => InitrdSource::Busybox(BusyboxInit::Test),
            (None, true, false) => InitrdSource::Busybox(BusyboxInit::Shell),
            (None, false, _) => InitrdSource::None,
        };
        Ok(Some(LinuxBoot {
            kernel,
            initrd,
            cmdline: self.cmdline,
        }))
    }
}

fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut config = RunConfig::default();
    let mut linux = LinuxOptions::default();
    let mut emit = None;
    let mut spare_cpu = false;
    let mut given: Vec<&str> = Vec::new();
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
        given.push(name);
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--gdb" => config.gdb = true,
            "--stay" => config.stay = true,
            "--mte" => config.mte = true,
            "--direct" => config.boot = Boot::Direct,
            "--emit" => emit = Some(std::path::PathBuf::from(value(name, inline, &mut rest)?)),
            "--firmware" => {
                let name = value(name, inline, &mut rest)?;
                config.firmware = Firmware::from_name(name).ok_or_else(|| {
                    format!("--firmware: unknown firmware `{name}` (none, u-boot)")
                })?;
            }
            "--guest" => {
                let scenario = value(name, inline, &mut rest)?;
                config.scenario = Scenario::from_name(scenario).ok_or_else(|| {
                    format!(
                        "--guest: unknown scenario `{scenario}` ({})",
                        qemu_runner::scenario_names()
                    )
                })?;
            }
            "--guest-args" => config.guest_args = value(name, inline, &mut rest)?.to_string(),
            "--smp" => config.smp = number(name, value(name, inline, &mut rest)?)?,
            "--mem" => config.mem_mib = number(name, value(name, inline, &mut rest)?)?,
            "--guest-mem" => {
                config.guest_mem_mib = Some(number(name, value(name, inline, &mut rest)?)?)
            }
            "--vcpus" => config.vcpus = Some(number(name, value(name, inline, &mut rest)?)?),
            "--cpu" => config.cpu = value(name, inline, &mut rest)?.to_string(),
            "--gic" => {
                let text = value(name, inline, &mut rest)?;
                config.gic = qemu_runner::qemu::GicVersion::parse(text)
                    .ok_or_else(|| format!("--gic: `{text}` is not 2 or 3"))?;
            }
            "--timeout" => {
                let seconds = number(name, value(name, inline, &mut rest)?)?;
                config.timeout = Duration::from_secs(u64::from(seconds));
                config.session_timeout = Some(config.timeout);
            }
            "--vm" => {
                let spec = value(name, inline, &mut rest)?;
                let index = config.vms.len();
                config
                    .vms
                    .push(VmSpec::parse(spec, index).map_err(|error| error.to_string())?);
            }
            "--spare-cpu" => spare_cpu = true,
            "--linux" => linux.debian = true,
            "--linux-test" => linux.test = true,
            "--disk" => config.disks.push(
                qemu_runner::qemu::HostDisk::parse(value(name, inline, &mut rest)?)
                    .map_err(|why| format!("--disk {why}"))?,
            ),
            "--net" => {
                config.net = Some(
                    qemu_runner::qemu::QemuNet::parse(value(name, inline, &mut rest)?)
                        .map_err(|why| format!("--net {why}"))?,
                )
            }
            "--kernel" => linux.kernel = Some(value(name, inline, &mut rest)?.to_string()),
            "--initrd" => linux.initrd = Some(value(name, inline, &mut rest)?.to_string()),
            "--cmdline" => linux.cmdline = Some(value(name, inline, &mut rest)?.to_string()),
            _ => return Err(format!("unknown option `{arg}`")),
        }
    }
    if !config.vms.is_empty() {
        return several_vms(config, linux, &given, spare_cpu, emit);
    }
    if spare_cpu {
        return Err("--spare-cpu adds a CPU beside the --vm VMs' CPUs; it goes with --vm".into());
    }
    let Some(linux) = linux.boot()? else {
        config.validate().map_err(|error| error.to_string())?;
        return Ok(run_or_emit(config, emit));
    };
    if given.contains(&"--guest") {
        return Err("--guest picks a test guest scenario; a Linux guest has none".into());
    }
    let defaults = RunConfig::linux(config.boot, linux);
    let keep = |option: &str| given.contains(&option);
    let config = RunConfig {
        smp: if keep("--smp") {
            config.smp
        } else {
            defaults.smp
        },
        mem_mib: if keep("--mem") {
            config.mem_mib
        } else {
            defaults.mem_mib
        },
        guest_mem_mib: if keep("--guest-mem") {
            config.guest_mem_mib
        } else {
            defaults.guest_mem_mib
        },
        timeout: if keep("--timeout") {
            config.timeout
        } else {
            defaults.timeout
        },
        ..RunConfig {
            linux: defaults.linux,
            ..config
        }
    };
    config.validate().map_err(|error| error.to_string())?;
    Ok(run_or_emit(config, emit))
}

/// The settings of a run with `--vm`s: no one-VM options, and defaults
/// that fit the VMs (see the usage).
fn several_vms(
    mut config: RunConfig,
    linux: LinuxOptions,
    given: &[&str],
    spare_cpu: bool,
    emit: Option<std::path::PathBuf>,
) -> Result<Parsed, String> {
    let one_vm = [
        "--guest",
        "--guest-args",
        "--vcpus",
        "--guest-mem",
        "--linux",
        "--linux-test",
        "--kernel",
        "--initrd",
        "--cmdline",
    ];
    if let Some(option) = one_vm.iter().find(|option| given.contains(option)) {
        return Err(format!(
            "{option} describes the one VM of a run without --vm; with --vm, say it in the \
             VM's spec"
        ));
    }
    drop(linux);
    if given.contains(&"--smp") {
        if spare_cpu {
            return Err("--spare-cpu adds a CPU to the default --smp; give --smp or it".into());
        }
    } else {
        config.smp = default_smp(&config.vms, spare_cpu);
    }
    if !given.contains(&"--mem") {
        let vms_mem: u32 = config.vms.iter().map(VmSpec::mem_mib_or_default).sum();
        config.mem_mib = config.mem_mib.max(vms_mem.saturating_add(512));
    }
    let any_linux = config
        .vms
        .iter()
        .any(|vm| matches!(vm.guest, VmGuest::Linux(_)));
    if any_linux && !given.contains(&"--timeout") {
        config.timeout = qemu_runner::LINUX_TIMEOUT;
    }
    config.validate().map_err(|error| error.to_string())?;
    Ok(run_or_emit(config, emit))
}

fn run_or_emit(config: RunConfig, emit: Option<std::path::PathBuf>) -> Parsed {
    match emit {
        Some(dir) => Parsed::Emit(config, dir),
        None => Parsed::Run(config),
    }
}

/// What a person at the terminal should know before the run: where typing
/// goes, the keys, and what ends the run (`None`: no terminal, and no
/// `--stay` to warn about).
fn terminal_note(config: &RunConfig) -> Option<String> {
    if !config.reads_terminal() {
        return config.stay.then(|| {
            "standard input is not a terminal: --stay has no effect, the run ends on its \
             verdicts"
                .into()
        });
    }
    let keys = match config.boot {
        Boot::Hypervisor => {
            "your typing goes to the console (the focused VM); Ctrl-] opens the hypervisor's \
             monitor (`help` lists its commands, `exit` or Ctrl-] returns, `poweroff` ends the \
             run); Ctrl-A x quits QEMU"
        }
        Boot::Direct => "your typing goes to the guest's console; Ctrl-A x quits QEMU",
    };
    let limit = match config.time_limit() {
        Some(limit) => format!(", or after {} s (--timeout)", limit.as_secs()),
        None => String::new(),
    };
    let end = if config.is_interactive() {
        format!("the run lasts until QEMU exits (the machine powers off){limit}")
    } else {
        format!(
            "the run ends once every VM has its verdict{limit}; --stay keeps it open until \
             QEMU exits"
        )
    };
    Some(format!("{keys}; {end}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = match parse(&args) {
        Ok(Parsed::Run(config)) => config,
        Ok(Parsed::Emit(config, dir)) => {
            return match qemu_runner::emit_boot_files(&config, &dir) {
                Ok(files) => {
                    for file in files {
                        eprintln!("qemu-runner: wrote {}", file.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("qemu-runner: {error}");
                    ExitCode::from(2)
                }
            };
        }
        Ok(Parsed::Help) => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("qemu-runner: {message}\n\n{}", usage());
            return ExitCode::from(2);
        }
    };
    let building = match (config.boot, &config.linux) {
        (Boot::Hypervisor, None) => Some("the hypervisor and the test guest"),
        (Boot::Direct, None) => Some("the test guest"),
        (Boot::Hypervisor, Some(_)) => Some("the hypervisor"),
        (Boot::Direct, Some(_)) => None,
    };
    if let Some(building) = building {
        eprintln!("qemu-runner: building {building} for aarch64-unknown-none-softfloat");
    }
    if std::io::stdin().is_terminal() {
        config.input = ConsoleInput::Terminal;
    }
    if let Some(note) = terminal_note(&config) {
        eprintln!("qemu-runner: {note}");
    } else if config.guest_is_free_running() {
        eprintln!(
            "qemu-runner: standard input is not a terminal: the guest gets no input; the run \
             passes when it powers off, and ends after {} s otherwise (--timeout)",
            config.timeout.as_secs()
        );
    }
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
            Parsed::Emit(..) => Err("emit".into()),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn the_terminal_note_says_where_typing_goes_and_what_ends_the_run() {
        let at_terminal = |words: &str| {
            let mut config = parse_words(words).unwrap();
            config.input = ConsoleInput::Terminal;
            terminal_note(&config).unwrap()
        };
        let verdicts = at_terminal("--vm memory,cpus=0 --vm echo,cpus=1");
        assert!(verdicts.contains("Ctrl-] opens the hypervisor's monitor"));
        assert!(verdicts.contains("ends once every VM has its verdict, or after 120 s"));
        assert!(verdicts.contains("--stay keeps it open"));
        let stay = at_terminal("--vm memory,cpus=0 --vm echo,cpus=1 --stay");
        assert!(stay.contains("lasts until QEMU exits (the machine powers off)"));
        assert!(!stay.contains("after"), "no time limit: {stay}");
        let limited = at_terminal("--guest echo --timeout 9");
        assert!(limited.contains("lasts until QEMU exits (the machine powers off), or after 9 s"));
        let direct = at_terminal("--direct --guest echo");
        assert!(!direct.contains("monitor") && direct.contains("Ctrl-A x"));
        assert_eq!(terminal_note(&parse_words("--guest echo").unwrap()), None);
        let unheard = terminal_note(&parse_words("--stay").unwrap()).unwrap();
        assert!(unheard.contains("--stay has no effect"));
    }

    #[test]
    fn emit_names_a_directory_and_keeps_the_other_options() {
        let args: Vec<String> = "--linux-test --vcpus 1 --emit /tmp/boot"
            .split_whitespace()
            .map(String::from)
            .collect();
        match parse(&args).unwrap() {
            Parsed::Emit(config, dir) => {
                assert_eq!(dir, std::path::PathBuf::from("/tmp/boot"));
                assert_eq!(config.vcpus, Some(1));
                assert!(config.linux.is_some());
            }
            _ => panic!("--emit is an emit"),
        }
        assert!(parse_words("--emit").is_err());
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
        assert_eq!(config.firmware, Firmware::None);
        assert!(!config.gdb);
        assert!(!config.stay);
        assert!(parse_words("--stay --vm memory,cpus=0").unwrap().stay);
        assert!(!config.mte);
        assert!(parse_words("--mte --guest memory").unwrap().mte);
        let uboot = parse_words("--firmware u-boot --linux-test").unwrap();
        assert_eq!(uboot.firmware, Firmware::UBoot);
        assert_eq!(uboot.smp, 2, "Linux defaults still apply");
        assert_eq!(
            parse_words("--firmware=none").unwrap().firmware,
            Firmware::None
        );
        assert_eq!(config.gic, qemu_runner::qemu::GicVersion::V3);
        let v2 = parse_words("--gic 2 --smp 8").unwrap();
        assert_eq!(v2.gic, qemu_runner::qemu::GicVersion::V2);
        assert_eq!(parse_words("--gic=2 --linux-test").unwrap().smp, 2);
    }

    #[test]
    fn bad_options_are_errors() {
        assert!(parse_words("--smp").is_err());
        assert!(parse_words("--smp many").is_err());
        assert!(parse_words("--gic").is_err());
        assert!(parse_words("--guest nope").is_err());
        assert!(parse_words("--frobnicate").is_err());
        assert_eq!(parse_words("--help").unwrap_err(), "help");
        assert_eq!(parse_words("--direct --gdb").unwrap().boot, Boot::Direct);
        assert!(parse_words("--initrd x").is_err());
        assert!(parse_words("--cmdline quiet").is_err());
        assert!(parse_words("--linux-test --initrd x").is_err());
        assert!(parse_words("--linux --guest memory").is_err());
        assert!(parse_words("--firmware uefi").is_err());
        assert!(parse_words("--firmware").is_err());
        for bad in [
            "--smp 0",
            "--smp 33",
            "--vcpus 0",
            "--smp 2 --vcpus 3",
            "--guest-mem 0",
            "--mem 512 --guest-mem 512",
            "--timeout 0",
            "--linux --smp 0",
            "--linux --direct --guest-mem 64",
            "--direct --firmware u-boot",
            "--gic 4",
            "--gic 2 --smp 9",
        ] {
            let why = parse_words(bad).expect_err(bad);
            let option = bad.split_whitespace().rev().nth(1).unwrap();
            assert!(why.contains(option), "{bad}: {why}");
        }
    }

    #[test]
    fn vm_options_describe_several_vms_and_set_fitting_defaults() {
        let config = parse_words(
            "--vm guest=memory,cpus=0-1,mem=256 --vm linux,cpus=2,3,mem=512 \
             --vm=kernel=/k,cpus=4,name=x,control=1",
        )
        .unwrap();
        let names: Vec<&str> = config.vms.iter().map(|vm| vm.name.as_str()).collect();
        assert_eq!(names, ["vm0", "vm1", "x"]);
        assert_eq!(config.smp, 5);
        assert_eq!(
            config.mem_mib,
            256 + 512 + 512 + 512,
            "kernel= is Linux: 512"
        );
        assert_eq!(config.timeout, qemu_runner::LINUX_TIMEOUT);
        assert!(config.vms[2].control);
        let spare = parse_words("--vm memory,cpus=0 --vm timers,cpus=1 --spare-cpu").unwrap();
        assert_eq!((spare.smp, spare.mem_mib), (3, 1024));
        assert_eq!(spare.timeout, Duration::from_secs(120));
        let given = parse_words("--vm memory,cpus=0 --smp 4 --mem 2048 --timeout 9").unwrap();
        assert_eq!((given.smp, given.mem_mib), (4, 2048));
        assert_eq!(given.timeout, Duration::from_secs(9));
        assert_eq!(parse_words("--vm memory").unwrap().smp, 1);
    }

    #[test]
    fn bad_vm_options_are_errors_that_name_the_problem() {
        for (words, says) in [
            ("--vm", "needs a value"),
            ("--vm nope", "unknown guest"),
            ("--vm memory,cpus=0 --guest timers", "--guest"),
            ("--vm memory,cpus=0 --guest-mem 64", "--guest-mem"),
            ("--vm memory,cpus=0 --linux", "--linux"),
            ("--vm memory,cpus=0 --vcpus 1", "--vcpus"),
            ("--vm memory,cpus=0 --vm timers", "needs cpus="),
            ("--vm memory,cpus=0-1 --vm timers,cpus=1", "both name CPU 1"),
            (
                "--vm memory,cpus=0 --vm timers,cpus=1,name=vm0",
                "two VMs are called `vm0`",
            ),
            ("--vm memory,cpus=0-3 --smp 2", "names CPU 3, but --smp 2"),
            ("--vm memory,cpus=0 --smp 2 --spare-cpu", "--spare-cpu"),
            ("--spare-cpu", "goes with --vm"),
            ("--vm memory,cpus=0 --direct", "--direct"),
            ("--vm memory,mem=900 --mem 512", "adds up to 900 MiB"),
            (
                "--vm memory,cpus=0 --vm memory,cpus=1 --vm memory,cpus=2 --vm memory,cpus=3 \
                 --vm memory,cpus=4 --vm memory,cpus=5 --vm memory,cpus=6 --vm memory,cpus=7 \
                 --vm memory,cpus=8",
                "at most 8 VMs",
            ),
        ] {
            let why = parse_words(words).expect_err(words);
            assert!(why.contains(says), "{words}: {why}");
            assert!(!why.contains("  "), "{words}: a gap in `{why}`");
        }
    }

    #[test]
    fn linux_options_pick_the_guest_and_its_defaults() {
        let shell = parse_words("--linux").unwrap();
        assert_eq!(shell.linux, Some(LinuxBoot::debian(BusyboxInit::Shell)));
        assert_eq!(
            (shell.smp, shell.mem_mib, shell.guest_mem_mib),
            (2, 1024, Some(512))
        );
        assert_eq!(shell.timeout, Duration::from_secs(300));
        let test = parse_words("--linux-test --direct --smp 3 --timeout 60").unwrap();
        assert_eq!(test.linux, Some(LinuxBoot::debian(BusyboxInit::Test)));
        assert_eq!((test.smp, test.mem_mib, test.guest_mem_mib), (3, 512, None));
        assert_eq!(test.timeout, Duration::from_secs(60));
        assert_eq!(test.session_timeout, Some(Duration::from_secs(60)));
        assert_eq!(shell.session_timeout, None);
        let files = parse_words("--kernel /k/Image --initrd /k/initrd.gz --cmdline x=1").unwrap();
        assert_eq!(
            files.linux,
            Some(LinuxBoot {
                kernel: KernelSource::File("/k/Image".into()),
                initrd: InitrdSource::File("/k/initrd.gz".into()),
                cmdline: Some("x=1".into()),
            })
        );
        let kernel_only = parse_words("--kernel /k/Image --guest-mem 256").unwrap();
        assert_eq!(kernel_only.linux.unwrap().initrd, InitrdSource::None);
        assert_eq!(kernel_only.guest_mem_mib, Some(256));
        let debian_kernel_own_initrd = parse_words("--linux --initrd /r").unwrap();
        assert_eq!(
            debian_kernel_own_initrd.linux.unwrap().kernel,
            KernelSource::Debian
        );
        assert_eq!(parse_words("--smp 2").unwrap().linux, None);
    }
}
