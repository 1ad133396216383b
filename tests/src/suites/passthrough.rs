//! `passthrough`: Debian's Linux reading a virtio-blk it owns (passthrough)
//! against the same Linux booted directly by QEMU, in the same run.
//!
//! Every run is the runner's test init with the disk-write role
//! ([`qemu_runner::initramfs::Role::DiskWrite`]) on one fresh image (ext4 on
//! its first 64 MiB, [`TIMED_MIB`] MiB of raw space after it,
//! [`disk_image_with_raw`]): the file written, then a timed sequential `dd
//! bs=1M` of [`TIMED_MIB`] MiB of the raw device past the file system with
//! `oflag=direct`, then one with `iflag=direct`, each timed by
//! `/proc/uptime` (10 ms resolution; the size keeps that under 2 % of the
//! read). All on `-cpu max,pauth=off` with 2 CPUs and 512 MiB for the
//! guest. Three sides:
//!
//! - passed (`passthrough/blk/...`): one Linux VM under the hypervisor
//!   (`--vm linux,cpus=0-1,mem=512,pass-disk=IMG`, `-smp 2`, 1 GiB machine)
//!   owns QEMU's virtio-blk on the virtio-mmio transport
//!   `/virtio_mmio@a003e00`: its RAM at guest-physical == host-physical
//!   addresses, its interrupt hardware-linked, and each of its register
//!   accesses forwarded by the hypervisor (the 0x200-byte window shares its
//!   page with other transports, so it is not mapped). The data moves by
//!   QEMU's DMA into the guest's pages without the hypervisor.
//! - direct (`passthrough/blk/direct_*`): the same kernel, init and role
//!   booted by QEMU alone with QEMU's own virtio-blk on virtio-mmio on the
//!   same image ([`direct`]).
//! - PCIe, for context (`passthrough/pcie/...`): as passed, with the image
//!   as a `virtio-blk-pci` behind QEMU's PCIe host bridge, which the VM
//!   owns (`pass-pcie=IMG`): the VM's Linux places the BARs, the bridge's
//!   windows are mapped at stage 2 (no exit for a register access), and the
//!   device interrupts by INTx. Its ratios are over the same direct
//!   baseline (virtio-mmio).
//!
//! [`RUNS`] rounds of the three, in turn. Figures: the medians of each
//! side's read and write MiB/s and the ratios of the medians, passed over
//! direct (`passthrough/blk/read_ratio`: the goal is at least 0.9). Each
//! passed run is checked to be one: the hypervisor says the VM owns the
//! node, the VM took the device's interrupts (`passthrough_irqs`), and the
//! hypervisor emulated no virtio-blk for it. For the median-read run of
//! each passed side the suite also prints the exits that the passed device
//! and the guest's I/O cost at EL2 (count and time: forwarded register
//! accesses, the device's interrupts, the guest's SGIs and the kicks they
//! cause). A failed run ends the suite, before its figures, with status 1.

use std::fmt::Display;
use std::path::Path;
use std::time::{Duration, Instant};

use qemu_runner::initramfs::Role;
use qemu_runner::qemu::HostDisk;
use qemu_runner::{
    DEFAULT_CPU, LINUX_GUEST_MEM_MIB, LINUX_HOST_MEM_MIB, LINUX_SMP, RunConfig, RunReport,
};

use crate::e2e;
use crate::linux_virtio::{DISK_FS_MIB, direct, disk_image_with_raw, linux_vm_spec};
use crate::measure::{config, hypervisor_features, median, report};
use crate::suites::virtio::{counter_of, figure_of, hypervisor_run, passed, vm_mem};

/// Rounds of the three sides.
pub const RUNS: usize = 5;
/// MiB the role writes and reads timed, past the file system.
pub const TIMED_MIB: u32 = 512;
/// Time limit of one run.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// The disk-write role with [`TIMED_MIB`] MiB timed past the file system.
fn role() -> Role {
    Role::DiskWrite {
        bench_mib: TIMED_MIB,
        bench_skip_mib: DISK_FS_MIB,
        rewrite_seconds: 0,
    }
}

/// How the VM owns the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passing {
    /// On a virtio-mmio transport (`pass-disk=`).
    VirtioMmio,
    /// Behind the PCIe host bridge (`pass-pcie=`).
    Pcie,
}

impl Passing {
    /// The `--vm` item key.
    fn item(self) -> &'static str {
        match self {
            Passing::VirtioMmio => "pass-disk",
            Passing::Pcie => "pass-pcie",
        }
    }

    /// The node the VM owns.
    fn node(self) -> &'static str {
        match self {
            Passing::VirtioMmio => "/virtio_mmio@a003e00",
            Passing::Pcie => qemu_runner::qemu::PCIE_HOST_BRIDGE_NODE,
        }
    }

    /// The QEMU device.
    fn device(self) -> &'static str {
        match self {
            Passing::VirtioMmio => "virtio-blk-device",
            Passing::Pcie => "virtio-blk-pci",
        }
    }

    /// Its figures' prefix.
    fn prefix(self) -> &'static str {
        match self {
            Passing::VirtioMmio => "passthrough/blk",
            Passing::Pcie => "passthrough/pcie",
        }
    }
}

/// Exits of one kind: how many, and milliseconds at EL2 in them.
#[derive(Clone, Copy, Debug, Default)]
struct Exits {
    count: u64,
    ms: f64,
}

impl Exits {
    /// VM 0's `exit_<kind>_count` and `_ticks` in `run`.
    fn of(run: &RunReport, kind: &str) -> Result<Exits, String> {
        let hz = counter_of(run, 0, "ticks_per_second")?.max(1);
        let ticks = counter_of(run, 0, &format!("exit_{kind}_ticks"))?;
        Ok(Exits {
            count: counter_of(run, 0, &format!("exit_{kind}_count"))?,
            ms: ticks as f64 * 1000.0 / hz as f64,
        })
    }
}

impl std::fmt::Display for Exits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:.0} ms)", self.count, self.ms)
    }
}

/// What one run measured.
struct Sample {
    write: f64,
    read: f64,
    /// The GIC version of the machine.
    gic: u32,
    /// Under the hypervisor: the stage-2 features it found `(fwb,
    /// range_tlbi)`, and the exits of the forwarded register accesses, the
    /// device's interrupts, the guest's SGIs and the kicks.
    hypervisor: Option<((&'static str, &'static str), [Exits; 4])>,
}

/// One run of the VM owning `image` as `passing`, checked to be one (see
/// the module doc).
fn passed_once(image: &Path, passing: Passing) -> Result<Sample, String> {
    let disk = format!("{}={}", passing.item(), image.display());
    let spec = linux_vm_spec("blk", "0-1", &[&disk, &vm_mem()], &role());
    let config = hypervisor_run(LINUX_SMP, LINUX_HOST_MEM_MIB, &[&spec], RUN_TIMEOUT);
    let run = passed(e2e::run(&config))?;
    let owns = format!("vm0: owns {}:", passing.node());
    if !run.hypervisor_log().iter().any(|line| line.contains(&owns)) {
        return Err(format!("no `{owns}` line in the hypervisor's log"));
    }
    if counter_of(&run, 0, "passthrough_irqs")? == 0 {
        return Err("the VM took none of the passed disk's interrupts".into());
    }
    if run.counters().get(0, "virtio_blk_read_bytes").is_some() {
        return Err("the hypervisor emulated a virtio-blk for the VM".into());
    }
    let exits = [
        Exits::of(&run, "mmio_passed")?,
        Exits::of(&run, "irq_passthrough")?,
        Exits::of(&run, "sysreg_sgi")?,
        Exits::of(&run, "irq_kick")?,
    ];
    Ok(Sample {
        write: figure_of(&run, None, "blk_seq_write_mib_per_s")?,
        read: figure_of(&run, None, "blk_seq_read_mib_per_s")?,
        gic: config.gic.number(),
        hypervisor: Some((hypervisor_features(run.hypervisor_log()), exits)),
    })
}

/// One run of the same Linux and role directly on QEMU with QEMU's own
/// virtio-blk on `image`.
fn direct_once(image: &Path) -> Result<Sample, String> {
    let config = RunConfig {
        cpu: DEFAULT_CPU.to_string(),
        ..direct(
            &role(),
            &[HostDisk {
                path: image.to_path_buf(),
                read_only: false,
            }],
            None,
        )
    };
    let run = passed(e2e::run(&config))?;
    Ok(Sample {
        write: figure_of(&run, None, "blk_seq_write_mib_per_s")?,
        read: figure_of(&run, None, "blk_seq_read_mib_per_s")?,
        gic: config.gic.number(),
        hypervisor: None,
    })
}

/// The medians of `samples`: (write, read).
fn medians(samples: &[Sample]) -> (f64, f64) {
    (
        median(&mut samples.iter().map(|s| s.write).collect::<Vec<_>>()),
        median(&mut samples.iter().map(|s| s.read).collect::<Vec<_>>()),
    )
}

/// The settings every side shares, for its `config` line.
fn common_settings() -> Vec<(&'static str, String)> {
    vec![
        ("engine", "qemu".into()),
        ("cpu", DEFAULT_CPU.into()),
        ("vcpus", LINUX_SMP.to_string()),
        ("guest_mem_mib", LINUX_GUEST_MEM_MIB.to_string()),
        ("image_mib", (DISK_FS_MIB + TIMED_MIB).to_string()),
        ("timed_mib", TIMED_MIB.to_string()),
        ("dd", "bs=1M,direct".into()),
        ("runs", RUNS.to_string()),
    ]
}

/// Prints a `config` line of `settings`.
fn print_config(name: &str, settings: &[(&str, String)]) {
    let settings: Vec<(&str, &dyn Display)> = settings
        .iter()
        .map(|(key, value)| (*key, value as &dyn Display))
        .collect();
    config(name, &settings);
}

/// Prints the figures of the `passing` side against the direct medians.
fn print_passed(passing: Passing, samples: &[Sample], direct: (f64, f64)) {
    let Some(((fwb, range_tlbi), _)) = samples[0].hypervisor else {
        return;
    };
    let mut settings = common_settings();
    settings.extend([
        ("gic", samples[0].gic.to_string()),
        ("fwb", fwb.to_string()),
        ("range_tlbi", range_tlbi.to_string()),
        ("smp", LINUX_SMP.to_string()),
        ("machine_mem_mib", LINUX_HOST_MEM_MIB.to_string()),
        ("item", passing.item().to_string()),
        ("device", passing.device().to_string()),
        ("node", passing.node().to_string()),
        ("ram", "identity".into()),
        ("baseline", "direct,virtio-blk-device".into()),
    ]);
    let prefix = passing.prefix();
    print_config(prefix, &settings);
    let (write, read) = medians(samples);
    let (direct_write, direct_read) = direct;
    report(&format!("{prefix}/read_mibs"), read, "MiB/s");
    if passing == Passing::VirtioMmio {
        report(&format!("{prefix}/direct_read_mibs"), direct_read, "MiB/s");
    }
    report(&format!("{prefix}/read_ratio"), read / direct_read, "x");
    report(&format!("{prefix}/write_mibs"), write, "MiB/s");
    if passing == Passing::VirtioMmio {
        report(
            &format!("{prefix}/direct_write_mibs"),
            direct_write,
            "MiB/s",
        );
    }
    report(&format!("{prefix}/write_ratio"), write / direct_write, "x");
    if let Some(Sample {
        hypervisor: Some((_, [forwarded, irqs, sgis, kicks])),
        ..
    }) = samples.iter().find(|s| s.read == read)
    {
        println!(
            "{prefix}: the median-read run's exits (count, time at EL2): forwarded register \
             accesses {forwarded}, device interrupts {irqs}, guest SGIs {sgis}, kicks {kicks}"
        );
    }
}

/// The host's 1-minute load average (`/proc/loadavg`), `unknown` when it
/// cannot be read: the runs share the host's cores with whatever else runs.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Measures the three sides and prints the figures; `Err` when a run
/// failed.
fn measure() -> Result<(), String> {
    let load_before = load_average();
    let image = disk_image_with_raw("bench-passthrough-blk", TIMED_MIB);
    let mut mmio = Vec::new();
    let mut pcie = Vec::new();
    let mut direct = Vec::new();
    let mut rounds = || -> Result<(), String> {
        for round in 1..=RUNS {
            for (side, samples, passing) in [
                ("passed", &mut mmio, Some(Passing::VirtioMmio)),
                ("direct", &mut direct, None),
                ("pcie", &mut pcie, Some(Passing::Pcie)),
            ] {
                eprintln!("passthrough: {side} run {round}/{RUNS}");
                let sample = match passing {
                    Some(passing) => passed_once(&image, passing),
                    None => direct_once(&image),
                }
                .map_err(|why| format!("{side} run {round}: {why}"))?;
                samples.push(sample);
            }
        }
        Ok(())
    };
    let result = rounds();
    let _ = std::fs::remove_file(&image);
    result?;
    let (direct_write, direct_read) = medians(&direct);
    let mut settings = common_settings();
    settings.extend([
        ("gic", direct[0].gic.to_string()),
        ("fwb", "none".into()),
        ("range_tlbi", "none".into()),
        ("boot", "direct".into()),
        ("device", "virtio-blk-device".into()),
    ]);
    print_config("passthrough/blk/direct_*", &settings);
    print_passed(Passing::VirtioMmio, &mmio, (direct_write, direct_read));
    print_passed(Passing::Pcie, &pcie, (direct_write, direct_read));
    println!(
        "passthrough: the host's load average (1 min) {load_before} at the start, {} at the end",
        load_average()
    );
    let reads = |samples: &[Sample]| samples.iter().map(|s| s.read).collect::<Vec<_>>();
    eprintln!(
        "passthrough: read MiB/s per round: passed {:?}, direct {:?}, pcie {:?}",
        reads(&mmio),
        reads(&direct),
        reads(&pcie)
    );
    Ok(())
}

/// Prints the figures; exits the process with status 1 when a run failed.
pub fn run() {
    let started = Instant::now();
    let result = measure();
    eprintln!(
        "passthrough: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    if let Err(why) = result {
        eprintln!("passthrough: {why}");
        std::process::exit(1);
    }
}
