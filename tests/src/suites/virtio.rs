//! `virtio`: Debian's Linux on the hypervisor's virtio devices, each figure
//! against a baseline measured in the same run.
//!
//! Every Linux here is the runner's test init with a role (`hv.role=`,
//! [`qemu_runner::initramfs::Role`]) on `-cpu max,pauth=off`; the roles
//! time their own work with `/proc/uptime` and print `BENCH: NAME VALUE
//! UNIT` lines, which the suite reads from the console.
//!
//! - Net (`virtio/net/...`): two Linux VMs (2 vCPUs, 512 MiB each) on one
//!   network of the hypervisor's switch (`net=lan`), the net-server and
//!   net-client roles: the client's average of 10 pings (`ping_us`) and its
//!   64 MiB TCP send with busybox `nc`, md5-checked by the server
//!   (`tcp_mib_per_s`). As context, the same two roles on two QEMUs running
//!   Linux directly, with QEMU's own virtio-net joined by a socket netdev
//!   (`virtio/net/direct_socket/...`), and the ratios hypervisor over direct.
//!   One run each: the transfer alone takes a minute or more under TCG.
//! - Blk (`virtio/blk/...`): on one fresh image ([`disk_image`]: ext4 on its
//!   first 64 MiB, 128 MiB of raw space after), the disk-write role with its
//!   timed sequential `dd bs=1M` of 128 MiB past the file system
//!   (`oflag=direct`, then `iflag=direct`), alternately under the hypervisor
//!   (the image is QEMU's virtio-blk, the hypervisor drives it at EL2 and
//!   serves it to the VM as the VM's virtio-blk) and directly on QEMU with
//!   QEMU's own virtio-blk on the same image ([`direct_blk_baseline`]),
//!   [`BLK_RUNS`] times each. Figures: both sides' median MiB/s and the
//!   ratios of the medians, hypervisor over direct (`read_ratio`,
//!   `write_ratio`; the goal is at least 0.8).
//! - Console (`virtio/console/...`): one Linux VM with `console=virtio` (its
//!   console is `hvc0`; its PL011 still reaches the hypervisor's console)
//!   writes [`CONSOLE_KIB`] KiB of printable 64-byte lines to `/dev/ttyAMA0`
//!   and then to `/dev/hvc0` ([`Role::ConsoleBench`]). Each PL011 byte traps
//!   to EL2 (the driver also reads the flag register per byte); a
//!   virtio-console buffer of up to a page is one notification. Both reach
//!   the host through the hypervisor's console, a byte at a time into the
//!   host's UART. `speedup` is the virtio rate over the PL011 rate of the
//!   same run, median of [`CONSOLE_RUNS`] runs. The suite checks that the
//!   runner saw every line of both writes.
//!
//! Hypervisor runs also check the `STAT` counters the hypervisor prints at
//! power-off: the frames, sectors and console bytes went through its
//! devices. A failed hypervisor run ends that part's hypervisor side: the
//! suite prints the direct figures it has, says why, and exits non-zero at
//! the end. The whole suite takes about 7 minutes on QEMU 7.2 TCG on a
//! shared 2-core machine (the runs per part are chosen to stay well under
//! 15).

use std::time::{Duration, Instant};

use qemu_runner::initramfs::{
    CONSOLE_BENCH_LINE, CONSOLE_BENCH_LINES_PER_KIB, NET_TRANSFER_MIB, Role, bench_figures,
};
use qemu_runner::{DEFAULT_CPU, LINUX_GUEST_MEM_MIB, LINUX_SMP, RunConfig, RunReport};

use crate::e2e;
use crate::linux_virtio::{
    DISK_BENCH_MIB, DISK_FS_MIB, direct_blk_baseline, disk_image, disk_write_role, linux_vm_spec,
    net_client_role, net_server_role, run_net_pair,
};
use crate::measure::{config, hypervisor_features, median, report};

/// Runs per side of the blk comparison (alternating).
pub const BLK_RUNS: usize = 5;
/// The environment variable that picks parts (`VIRTIO_PARTS=blk` or
/// `net,console`); all three when it is not set.
pub const PARTS_VARIABLE: &str = "VIRTIO_PARTS";
/// Runs of the console comparison.
pub const CONSOLE_RUNS: usize = 5;
/// KiB written to each console per run.
pub const CONSOLE_KIB: u32 = 256;
/// The `-cpu` of every run.
const CPU: &str = DEFAULT_CPU;
/// Machine RAM of the two-VM net run, MiB.
const NET_MACHINE_MIB: u32 = 2048;
/// Time limit of a net run (boot, the ping wait, 64 MiB at about 1 MiB/s).
const NET_TIMEOUT: Duration = Duration::from_secs(600);
/// Time limit of a blk or console run.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// The net pair's VM names under the hypervisor: server, client.
const NET_VMS: [&str; 2] = ["a", "b"];

/// The value of VM `vm`'s `BENCH: name` figure in `console`: from a line
/// `[vm] BENCH: name VALUE UNIT` (the hypervisor prefixes each VM's lines
/// when it runs several), or from any `BENCH: name` line when `vm` is
/// `None`.
pub fn vm_figure(console: &str, vm: Option<&str>, name: &str) -> Option<f64> {
    let prefix = vm.map(|vm| format!("[{vm}] "));
    console
        .lines()
        .filter(|line| prefix.as_ref().is_none_or(|p| line.starts_with(p.as_str())))
        .flat_map(bench_figures)
        .find(|(found, _, _)| found == name)
        .map(|(_, value, _)| value)
}

/// How many console lines are the console bench's line (with or without
/// a VM prefix, `\r` already dropped by the runner).
pub fn console_bench_lines(console: &str) -> usize {
    console
        .lines()
        .filter(|line| {
            let line = line.trim_end();
            line == CONSOLE_BENCH_LINE
                || line
                    .strip_suffix(CONSOLE_BENCH_LINE)
                    .is_some_and(|head| head.starts_with('[') && head.ends_with("] "))
        })
        .count()
}

/// A figure of `report`, or why there is none.
pub(crate) fn figure_of(report: &RunReport, vm: Option<&str>, name: &str) -> Result<f64, String> {
    vm_figure(report.console(), vm, name).ok_or_else(|| {
        let whose = vm.map_or_else(String::new, |vm| format!(" from VM {vm}"));
        format!("no `BENCH: {name}` line{whose}: {}", context(report))
    })
}

/// A `STAT` counter of VM `vm`, or why there is none.
pub(crate) fn counter_of(report: &RunReport, vm: u32, name: &str) -> Result<u64, String> {
    report
        .counters()
        .get(vm, name)
        .ok_or_else(|| format!("no `STAT vm{vm} {name}` line: {}", context(report)))
}

/// The verdict, the command line and the last console lines of `report`.
pub(crate) fn context(report: &RunReport) -> String {
    let console = report.console();
    let tail: Vec<&str> = console.lines().rev().take(20).collect();
    format!(
        "{}\ncommand: {}\nlast console lines:\n{}",
        report.verdict,
        report.command_line,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// `Ok(report)` when it passed, its context when not.
pub(crate) fn passed(report: RunReport) -> Result<RunReport, String> {
    if report.passed() {
        Ok(report)
    } else {
        Err(context(&report))
    }
}

/// A hypervisor run of Linux VMs from `specs` on `smp` CPUs with
/// `mem_mib` of machine RAM.
pub(crate) fn hypervisor_run(
    smp: u32,
    mem_mib: u32,
    specs: &[&str],
    timeout: Duration,
) -> RunConfig {
    RunConfig {
        cpu: CPU.to_string(),
        mem_mib,
        ..e2e::vms(smp, specs, timeout)
    }
}

/// The `mem=` item of a Linux VM with the direct boots' RAM.
pub(crate) fn vm_mem() -> String {
    format!("mem={LINUX_GUEST_MEM_MIB}")
}

/// Net figures of the direct pair: (TCP MiB/s, ping us).
fn net_direct() -> Result<(f64, f64), String> {
    eprintln!("virtio/net: two direct QEMUs joined by a socket");
    let (server, client) = run_net_pair();
    let server = passed(server).map_err(|why| format!("the direct server failed: {why}"))?;
    let client = passed(client).map_err(|why| format!("the direct client failed: {why}"))?;
    drop(server);
    Ok((
        figure_of(&client, None, "net_tcp_mib_per_s")?,
        figure_of(&client, None, "net_ping_us")?,
    ))
}

/// Net figures of the two VMs under the hypervisor: (TCP MiB/s, ping us,
/// the features the hypervisor found).
fn net_hypervisor() -> Result<(f64, f64, (&'static str, &'static str)), String> {
    eprintln!("virtio/net: two VMs on the hypervisor's network");
    let mem = vm_mem();
    let [server_name, client_name] = NET_VMS;
    let server = linux_vm_spec(server_name, "0-1", &["net=lan", &mem], &net_server_role());
    let client = linux_vm_spec(client_name, "2-3", &["net=lan", &mem], &net_client_role());
    let run = e2e::run(&hypervisor_run(
        4,
        NET_MACHINE_MIB,
        &[&server, &client],
        NET_TIMEOUT,
    ));
    let run = passed(run)?;
    let frames = u64::from(NET_TRANSFER_MIB) * (1 << 20) / 1500;
    let sent = counter_of(&run, 1, "virtio_net_tx_frames")?;
    let received = counter_of(&run, 0, "virtio_net_rx_frames")?;
    if sent < frames || received < frames {
        return Err(format!(
            "the switch moved {sent} frames from the client and {received} to the server, \
             fewer than {frames} for {NET_TRANSFER_MIB} MiB"
        ));
    }
    Ok((
        figure_of(&run, Some(client_name), "net_tcp_mib_per_s")?,
        figure_of(&run, Some(client_name), "net_ping_us")?,
        hypervisor_features(run.hypervisor_log()),
    ))
}

/// The net part; `Err` when a run failed (its figures then missing).
fn net() -> Result<(), String> {
    let (direct_tcp, direct_ping) = net_direct()?;
    config(
        "virtio/net/direct_socket",
        &[
            ("engine", &"qemu"),
            ("cpu", &CPU),
            ("qemus", &2),
            ("vcpus", &LINUX_SMP),
            ("guest_mem_mib", &LINUX_GUEST_MEM_MIB),
            ("netdev", &"socket"),
            ("transfer_mib", &NET_TRANSFER_MIB),
            ("runs", &1),
        ],
    );
    report(
        "virtio/net/direct_socket/tcp_mib_per_s",
        direct_tcp,
        "MiB/s",
    );
    report("virtio/net/direct_socket/ping_us", direct_ping, "us");
    let (tcp, ping, (fwb, range_tlbi)) = net_hypervisor()?;
    config(
        "virtio/net",
        &[
            ("engine", &"qemu"),
            ("cpu", &CPU),
            ("fwb", &fwb),
            ("range_tlbi", &range_tlbi),
            ("smp", &4),
            ("machine_mem_mib", &NET_MACHINE_MIB),
            ("vms", &2),
            ("vcpus", &LINUX_SMP),
            ("guest_mem_mib", &LINUX_GUEST_MEM_MIB),
            ("net", &"lan"),
            ("transfer_mib", &NET_TRANSFER_MIB),
            ("runs", &1),
        ],
    );
    report("virtio/net/tcp_mib_per_s", tcp, "MiB/s");
    report("virtio/net/ping_us", ping, "us");
    report("virtio/net/tcp_ratio", tcp / direct_tcp, "x");
    report("virtio/net/ping_ratio", ping / direct_ping, "x");
    Ok(())
}

/// What one blk run under the hypervisor measured.
struct BlkSample {
    write: f64,
    read: f64,
    /// The stage-2 features the hypervisor found: `(fwb, range_tlbi)`.
    features: (&'static str, &'static str),
    /// Where its EL2 time went: the virtio-mmio exits (count, ms at EL2),
    /// the requests (reads, writes).
    exits: Option<(u64, f64)>,
    requests: (u64, u64),
}

/// The virtio-mmio exits of VM 0 in `run`: (count, milliseconds at EL2).
fn virtio_exits(run: &RunReport) -> Option<(u64, f64)> {
    let counters = run.counters();
    let hz = counters.get(0, "ticks_per_second").filter(|&hz| hz > 0)?;
    let count = counters.get(0, "exit_mmio_virtio_count")?;
    let ticks = counters.get(0, "exit_mmio_virtio_ticks")?;
    Some((count, ticks as f64 * 1000.0 / hz as f64))
}

/// One blk run under the hypervisor on `image`.
fn blk_hypervisor(image: &std::path::Path) -> Result<BlkSample, String> {
    let disk = format!("disk={}", image.display());
    let spec = linux_vm_spec("blk", "0-1", &[&disk, &vm_mem()], &disk_write_role(true));
    let run = passed(e2e::run(&hypervisor_run(
        LINUX_SMP,
        qemu_runner::LINUX_HOST_MEM_MIB,
        &[&spec],
        RUN_TIMEOUT,
    )))?;
    let bench_bytes = u64::from(DISK_BENCH_MIB) << 20;
    for name in ["virtio_blk_write_bytes", "virtio_blk_read_bytes"] {
        let bytes = counter_of(&run, 0, name)?;
        if bytes < bench_bytes {
            return Err(format!(
                "{name} is {bytes}, less than the {DISK_BENCH_MIB} MiB timed"
            ));
        }
    }
    Ok(BlkSample {
        write: figure_of(&run, None, "blk_seq_write_mib_per_s")?,
        read: figure_of(&run, None, "blk_seq_read_mib_per_s")?,
        features: hypervisor_features(run.hypervisor_log()),
        exits: virtio_exits(&run),
        requests: (
            counter_of(&run, 0, "virtio_blk_reads")?,
            counter_of(&run, 0, "virtio_blk_writes")?,
        ),
    })
}

/// The blk part; `Err` when a hypervisor run failed (the direct figures
/// are printed still).
fn blk() -> Result<(), String> {
    let image = disk_image("bench-virtio-blk");
    let mut hypervisor: Vec<BlkSample> = Vec::new();
    let mut direct: Vec<(f64, f64)> = Vec::new();
    let mut failure: Option<String> = None;
    for round in 1..=BLK_RUNS {
        if failure.is_none() {
            eprintln!("virtio/blk: hypervisor run {round}/{BLK_RUNS}");
            match blk_hypervisor(&image) {
                Ok(sample) => hypervisor.push(sample),
                Err(why) => failure = Some(why),
            }
        }
        eprintln!("virtio/blk: direct run {round}/{BLK_RUNS}");
        direct.push(direct_blk_baseline(&image));
    }
    let _ = std::fs::remove_file(&image);
    let medians = |samples: &[(f64, f64)]| {
        (
            median(&mut samples.iter().map(|s| s.0).collect::<Vec<_>>()),
            median(&mut samples.iter().map(|s| s.1).collect::<Vec<_>>()),
        )
    };
    let common = |name: &str, fwb: &str, range_tlbi: &str| {
        config(
            name,
            &[
                ("engine", &"qemu"),
                ("cpu", &CPU),
                ("fwb", &fwb),
                ("range_tlbi", &range_tlbi),
                ("vcpus", &LINUX_SMP),
                ("guest_mem_mib", &LINUX_GUEST_MEM_MIB),
                ("image_mib", &(DISK_FS_MIB + DISK_BENCH_MIB)),
                ("timed_mib", &DISK_BENCH_MIB),
                ("dd", &"bs=1M,direct"),
                ("runs", &BLK_RUNS),
            ],
        )
    };
    let (direct_write, direct_read) = medians(&direct);
    common("virtio/blk/direct", "none", "none");
    report("virtio/blk/direct/write_mib_per_s", direct_write, "MiB/s");
    report("virtio/blk/direct/read_mib_per_s", direct_read, "MiB/s");
    if let Some(why) = failure {
        return Err(format!("a hypervisor blk run failed: {why}"));
    }
    let pairs: Vec<(f64, f64)> = hypervisor.iter().map(|s| (s.write, s.read)).collect();
    let (write, read) = medians(&pairs);
    let (fwb, range_tlbi) = hypervisor[0].features;
    common("virtio/blk/hypervisor", fwb, range_tlbi);
    report("virtio/blk/hypervisor/write_mib_per_s", write, "MiB/s");
    report("virtio/blk/hypervisor/read_mib_per_s", read, "MiB/s");
    report("virtio/blk/read_ratio", read / direct_read, "x");
    report("virtio/blk/write_ratio", write / direct_write, "x");
    if let Some(sample) = hypervisor.iter().find(|s| s.read == read)
        && let Some((count, ms)) = sample.exits
    {
        println!(
            "virtio/blk: the median-read hypervisor run: {} read and {} write requests, \
             {count} virtio-mmio exits, {ms:.1} ms at EL2 in them (mean {:.0} us)",
            sample.requests.0,
            sample.requests.1,
            ms * 1000.0 / count.max(1) as f64
        );
    }
    Ok(())
}

/// One console run: (PL011 B/s, virtio-console B/s, the features the
/// hypervisor found).
fn console_once() -> Result<(f64, f64, (&'static str, &'static str)), String> {
    let spec = linux_vm_spec(
        "con",
        "0-1",
        &["console=virtio", &vm_mem()],
        &Role::ConsoleBench { kib: CONSOLE_KIB },
    );
    let run = passed(e2e::run(&hypervisor_run(
        LINUX_SMP,
        qemu_runner::LINUX_HOST_MEM_MIB,
        &[&spec],
        RUN_TIMEOUT,
    )))?;
    let lines = console_bench_lines(run.console());
    let written = 2 * (CONSOLE_KIB * CONSOLE_BENCH_LINES_PER_KIB) as usize;
    if lines != written {
        return Err(format!(
            "the console shows {lines} bench lines, the guest wrote {written}: {}",
            context(&run)
        ));
    }
    let out = counter_of(&run, 0, "virtio_console_out_bytes")?;
    let dropped = counter_of(&run, 0, "virtio_console_dropped_bytes")?;
    if out < u64::from(CONSOLE_KIB) << 10 || dropped != 0 {
        return Err(format!(
            "the virtio-console sent {out} bytes and dropped {dropped}, for {CONSOLE_KIB} KiB \
             written"
        ));
    }
    Ok((
        figure_of(&run, None, "console_pl011_bytes_per_s")?,
        figure_of(&run, None, "console_virtio_bytes_per_s")?,
        hypervisor_features(run.hypervisor_log()),
    ))
}

/// The console part.
fn console() -> Result<(), String> {
    let mut samples = Vec::new();
    for round in 1..=CONSOLE_RUNS {
        eprintln!("virtio/console: run {round}/{CONSOLE_RUNS}");
        samples.push(console_once()?);
    }
    let (fwb, range_tlbi) = samples[0].2;
    config(
        "virtio/console",
        &[
            ("engine", &"qemu"),
            ("cpu", &CPU),
            ("fwb", &fwb),
            ("range_tlbi", &range_tlbi),
            ("vcpus", &LINUX_SMP),
            ("guest_mem_mib", &LINUX_GUEST_MEM_MIB),
            ("kib", &CONSOLE_KIB),
            ("line_bytes", &(CONSOLE_BENCH_LINE.len() + 1)),
            ("runs", &CONSOLE_RUNS),
        ],
    );
    let pl011 = median(&mut samples.iter().map(|s| s.0).collect::<Vec<_>>());
    let virtio = median(&mut samples.iter().map(|s| s.1).collect::<Vec<_>>());
    let speedup = median(&mut samples.iter().map(|s| s.1 / s.0).collect::<Vec<_>>());
    report("virtio/console/pl011_bytes_per_s", pl011, "B/s");
    report("virtio/console/virtio_bytes_per_s", virtio, "B/s");
    report("virtio/console/speedup", speedup, "x");
    Ok(())
}

/// Prints every part's figures; exits the process with status 1 when a
/// run failed (after the figures it has).
pub fn run() {
    let started = Instant::now();
    let mut failed = false;
    let chosen = std::env::var(PARTS_VARIABLE).ok();
    let parts = [
        ("net", net as fn() -> Result<(), String>),
        ("blk", blk),
        ("console", console),
    ];
    if let Some(unknown) = chosen.as_deref().and_then(|list| {
        list.split(',')
            .find(|name| !parts.iter().any(|(part, _)| part == name))
    }) {
        eprintln!("virtio: {PARTS_VARIABLE} names `{unknown}`; the parts are net, blk, console");
        std::process::exit(2);
    }
    for (part, measure) in parts {
        if chosen
            .as_deref()
            .is_some_and(|list| !list.split(',').any(|name| name == part))
        {
            continue;
        }
        if let Err(why) = measure() {
            eprintln!("virtio/{part}: {why}");
            failed = true;
        }
    }
    eprintln!("virtio: {:.0} s in all", started.elapsed().as_secs_f64());
    if failed {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_per_vm_or_from_any_line() {
        let console = "\
[a] BENCH: net_ping_us 900 us
[b] LINUX-INIT: 10.0.0.1 answers ping
[b] BENCH: net_ping_us 1200 us
[b] BENCH: net_tcp_mib_per_s 2.5 MiB/s
[ab] BENCH: net_ping_us 7 us
[ab] BENCH: net_tcp_mib_per_s 9 MiB/s
";
        assert_eq!(vm_figure(console, Some("b"), "net_ping_us"), Some(1200.0));
        assert_eq!(vm_figure(console, Some("a"), "net_ping_us"), Some(900.0));
        assert_eq!(vm_figure(console, Some("a"), "net_tcp_mib_per_s"), None);
        assert_eq!(vm_figure(console, None, "net_tcp_mib_per_s"), Some(2.5));
        assert_eq!(vm_figure(console, None, "net_ping_us"), Some(900.0));
        assert_eq!(vm_figure(console, Some("c"), "net_ping_us"), None);
    }

    #[test]
    fn console_bench_lines_are_counted_with_or_without_a_prefix() {
        let line = CONSOLE_BENCH_LINE;
        let console = format!(
            "{line}\n[con] {line}\n{line}  \nx{line}\n[con] {line}x\n{}\n[con] LINUX-INIT: {line}\n",
            &line[1..]
        );
        assert_eq!(console_bench_lines(&console), 3);
        assert_eq!(console_bench_lines(""), 0);
    }
}
