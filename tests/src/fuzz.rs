//! Host side of the hostile-guest fuzzer: boots the test guest's `fuzz`
//! scenario under the hypervisor for a range of seeds and tallies what went
//! wrong.
//!
//! A campaign is cut into boots of `per_boot` consecutive seeds (the guest
//! runs them one after the other, every vCPU finishing a seed before the next
//! starts). Each boot is judged from its console:
//! * a hypervisor panic (`[hv] PANIC`) or a VM stop (`stopping the VM`) is
//!   charged to the last seed the guest announced (`FUZZ: seed N`);
//! * each `FUZZ: violation seed=N ...` line names its seed, and the summary
//!   line `FUZZ: seeds=K ops=N violations=V` gives the totals;
//! * a boot without `RESULT: PASS` for another reason (a hang, timeout,
//!   guest failure) counts as a failure of its first unfinished seed.
//!
//! # Hangs
//!
//! The time a boot may take is proportional to its work: the runner stops
//! QEMU as hung when the next `FUZZ: seed` line is later than a start-up
//! allowance plus a per-operation allowance for one seed
//! ([`Campaign::seed_deadline`], 16 s for 300 operations on 4 vCPUs), and
//! the whole boot has a limit of the same form ([`Campaign::boot_timeout`]).
//! A hang is a failure of the seed that was running, with its rerun command.
//!
//! Every failure comes with the command that replays its boot up to its seed.
//!
//! # The its family
//!
//! A boot whose `its` family ran (GICv3 with an ITS) prints
//! `FUZZ: its lpis=L vcpu0=C required=R`: the LPIs delivered on any vCPU,
//! those delivered on vCPU 0 (each checked against the family's model) and
//! those the model required there. The tally sums them
//! ([`Tally::its_checked`] and the rest), so that a campaign can insist the
//! delivery check really ran.
//!
//! # The virtqueue family
//!
//! A campaign whose allow list names `virtqueue` boots its VM with
//! `console=virtio` (`--vm fuzz,console=virtio,args=...`). The guest sends
//! self-checking lines through the virtio-console (`VQ <id> <fnv1a> <text>`,
//! the check word over `<id> <text>`) and ends with
//! `FUZZ: virtqueue sent=S guaranteed=G resets=R`. Each boot's console must
//! then show only intact `VQ` lines (the bytes that came out are the ones
//! the chains held), at least `G` of them (those the device used in
//! notifies that did not end in a reset) and at most `S`; anything else is
//! a violation of the boot's last seed.

use std::time::Duration;

use qemu_runner::qemu::{GicVersion, Progress};
use qemu_runner::vmspec::VmSpec;
use qemu_runner::{RunConfig, Scenario};

/// What to run.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// First seed.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u64,
    /// Operations per seed and vCPU.
    pub ops: u64,
    /// Seeds per boot.
    pub per_boot: u64,
    /// QEMU `-cpu` models, used in turn boot by boot.
    pub cpus: Vec<String>,
    /// `fuzz-allow=` list (empty: the default mix).
    pub allow: String,
    /// `fuzz-deny=` list (empty: nothing taken out of the mix).
    pub deny: String,
    /// Emulated CPUs (and vCPUs).
    pub smp: u32,
}

impl Campaign {
    /// The guest bootargs for `count` seeds from `first`; one
    /// `fuzz-allow=`/`fuzz-deny=` word per family, so that the words carry
    /// no comma (a `--vm` spec's `args=` ends at one).
    pub fn guest_args(&self, first: u64, count: u64) -> String {
        let mut args = format!("seed={first} seeds={count} ops={}", self.ops);
        for (key, list) in [("fuzz-allow", &self.allow), ("fuzz-deny", &self.deny)] {
            for name in list.split(',').filter(|n| !n.is_empty()) {
                args.push_str(&format!(" {key}={name}"));
            }
        }
        args
    }

    /// Whether the VM needs a virtio-console (the allow list names the
    /// `virtqueue` family).
    pub fn needs_virtio_console(&self) -> bool {
        self.allow.split(',').any(|name| name == VIRTQUEUE_FAMILY)
    }

    /// The `--vm` spec of a boot with a virtio-console.
    pub fn vm_spec(&self, first: u64, count: u64) -> String {
        format!("fuzz,console=virtio,args={}", self.guest_args(first, count))
    }

    /// The command that replays a boot's seeds from `first` through `seed`
    /// on `cpu` (state left by earlier seeds of the boot can matter; the
    /// seed alone is `--guest-args 'seed=S seeds=1 ...'`).
    pub fn rerun_command(&self, cpu: &str, first: u64, seed: u64) -> String {
        self.rerun_command_on(cpu, GicVersion::V3, first, seed)
    }

    /// [`Campaign::rerun_command`] on a host with `gic` (`--gic 2` for a
    /// GICv2).
    pub fn rerun_command_on(&self, cpu: &str, gic: GicVersion, first: u64, seed: u64) -> String {
        let count = seed.saturating_sub(first) + 1;
        let gic = match gic {
            GicVersion::V3 => String::new(),
            other => format!("--gic {} ", other.number()),
        };
        if self.needs_virtio_console() {
            return format!(
                "cargo run --release -p qemu-runner -- {gic}--smp {} --cpu {cpu} --vm '{}'",
                self.smp,
                self.vm_spec(first, count)
            );
        }
        format!(
            "cargo run --release -p qemu-runner -- {gic}--guest fuzz --smp {} --cpu {cpu} \
             --guest-args '{}'",
            self.smp,
            self.guest_args(first, count)
        )
    }

    /// Operations of one seed, all vCPUs together.
    fn seed_ops(&self) -> u64 {
        self.ops * u64::from(self.smp)
    }

    /// Longest wait for the guest's next `FUZZ: seed` line (the first from
    /// QEMU's start; the last is the `FUZZ: seeds=` summary): the start-up
    /// allowance plus [`PER_OP_ALLOWANCE`] per operation of one seed. A hang
    /// is reported this long after the last seed began: 16 s for 300
    /// operations on 4 vCPUs, 30 s for 1000.
    pub fn seed_deadline(&self) -> Duration {
        START_UP_ALLOWANCE + PER_OP_ALLOWANCE * self.seed_ops() as u32
    }

    /// Time limit of a whole boot of `count` seeds, the backstop behind
    /// [`Campaign::seed_deadline`] (and longer than it, so that a hang is
    /// reported as one): one seed's deadline plus [`BOOT_PER_OP_ALLOWANCE`]
    /// per operation.
    pub fn boot_timeout(&self, count: u64) -> Duration {
        let ops = count * self.seed_ops();
        self.seed_deadline() + BOOT_PER_OP_ALLOWANCE * u32::try_from(ops).unwrap_or(u32::MAX)
    }

    /// The progress the runner watches for: a `FUZZ: seed` line within
    /// [`Campaign::seed_deadline`] of the one before.
    pub fn progress(&self) -> Progress {
        Progress {
            marker: SEED_MARKER,
            within: self.seed_deadline(),
        }
    }
}

/// The fuzz family that drives the VM's virtio-console.
pub const VIRTQUEUE_FAMILY: &str = "virtqueue";

/// What the guest prints as each seed starts (and its closing summary,
/// `FUZZ: seeds=...`, contains too).
pub const SEED_MARKER: &str = "FUZZ: seed";

/// QEMU start, hypervisor boot, guest set-up and the first seed line (about
/// 1 s on an idle host).
pub const START_UP_ALLOWANCE: Duration = Duration::from_secs(10);

/// Time per operation (all vCPUs) before the next seed line is late: about
/// nine times the 0.58 ms measured with two 4-vCPU campaigns sharing two host
/// cores (`e2e_fuzz`: 240 000 operations per boot in 139 s).
pub const PER_OP_ALLOWANCE: Duration = Duration::from_millis(5);

/// Time per operation of the whole boot's limit: about five times the rate
/// measured as above (a boot whose seeds each just make their deadline still
/// ends).
pub const BOOT_PER_OP_ALLOWANCE: Duration = Duration::from_millis(3);

/// One failure, with how to replay it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed it is charged to.
    pub seed: u64,
    /// The `-cpu` model.
    pub cpu: String,
    /// What happened.
    pub what: String,
    /// Command that replays the seed alone.
    pub rerun: String,
}

/// Totals of a campaign.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Seeds run to the end.
    pub seeds: u64,
    /// Operations run (all vCPUs).
    pub ops: u64,
    /// Hypervisor panics.
    pub hv_panics: u64,
    /// VM stops.
    pub vm_stops: u64,
    /// Violations the guest counted.
    pub violations: u64,
    /// Boots that failed for another reason (timeout, guest failure).
    pub other_failures: u64,
    /// Interrupts the guest took.
    pub interrupts: u64,
    /// Intact lines the virtqueue family's chains brought out.
    pub vq_lines: u64,
    /// LPIs the `its` family saw delivered (any vCPU).
    pub its_lpis: u64,
    /// LPIs delivered on vCPU 0, each checked against the family's model.
    pub its_checked: u64,
    /// LPIs the model required on vCPU 0 (exactly one delivery each).
    pub its_required: u64,
    /// Every failure.
    pub failures: Vec<Failure>,
}

impl Tally {
    /// True when nothing went wrong.
    pub fn clean(&self) -> bool {
        self.hv_panics == 0
            && self.vm_stops == 0
            && self.violations == 0
            && self.other_failures == 0
    }

    /// The figures, one `name value unit` line each.
    pub fn figures(&self) -> String {
        format!(
            "fuzz/seeds {} seeds\nfuzz/ops {} ops\nfuzz/hv_panics {} panics\n\
             fuzz/vm_stops {} stops\nfuzz/violations {} violations\n",
            self.seeds, self.ops, self.hv_panics, self.vm_stops, self.violations
        )
    }
}

/// What one boot's console says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootSummary {
    /// The `FUZZ: seeds=K ops=N violations=V interrupts=I` totals, if printed.
    pub totals: Option<(u64, u64, u64, u64)>,
    /// Seeds named by violation lines.
    pub violation_seeds: Vec<u64>,
    /// The violation lines themselves.
    pub violation_lines: Vec<String>,
    /// The last `FUZZ: seed N` line.
    pub last_seed: Option<u64>,
    /// `[hv] PANIC` lines.
    pub panics: Vec<String>,
    /// `stopping the VM` lines.
    pub vm_stops: Vec<String>,
    /// The `FUZZ: virtqueue sent=S guaranteed=G resets=R` totals, if printed.
    pub virtqueue: Option<(u64, u64, u64)>,
    /// The `FUZZ: its lpis=L vcpu0=C required=R` totals, if printed.
    pub its: Option<(u64, u64, u64)>,
    /// Intact `VQ` lines (their check word matches).
    pub vq_lines: u64,
    /// `VQ` lines whose check word does not match (bytes changed on the way).
    pub vq_broken: Vec<String>,
}

/// FNV-1a, the check word of a `VQ` line (as the guest computes it).
pub fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash = 0x811c_9dc5u32;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// Whether the text after `VQ ` is an intact line: `<id> <fnv1a hex> <text>`
/// with the check word over `<id> <text>`.
pub fn vq_line_intact(rest: &str) -> bool {
    let mut words = rest.splitn(3, ' ');
    let (Some(id), Some(hash), Some(text)) = (words.next(), words.next(), words.next()) else {
        return false;
    };
    u32::from_str_radix(hash, 16).is_ok_and(|h| h == fnv1a(format!("{id} {text}").as_bytes()))
}

fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
}

/// Reads a boot's console.
pub fn summarize(console: &str) -> BootSummary {
    let mut summary = BootSummary::default();
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if line.contains("[hv] PANIC") {
            summary.panics.push(line.to_string());
        }
        if line.contains("stopping the VM") {
            summary.vm_stops.push(line.to_string());
        }
        if let Some(at) = line.find("VQ ") {
            if vq_line_intact(&line[at + 3..]) {
                summary.vq_lines += 1;
            } else {
                summary.vq_broken.push(line.to_string());
            }
        }
        let Some(rest) = line.find("FUZZ: ").map(|at| &line[at + 6..]) else {
            continue;
        };
        if let Some(seed) = rest.strip_prefix("seed ") {
            summary.last_seed = seed.trim().parse().ok().or(summary.last_seed);
        } else if rest.starts_with("violation ") {
            if let Some(seed) = field(rest, "seed") {
                summary.violation_seeds.push(seed);
            }
            summary.violation_lines.push(rest.to_string());
        } else if rest.starts_with("virtqueue ") {
            summary.virtqueue = Some((
                field(rest, "sent").unwrap_or(0),
                field(rest, "guaranteed").unwrap_or(0),
                field(rest, "resets").unwrap_or(0),
            ));
        } else if rest.starts_with("its ") {
            summary.its = Some((
                field(rest, "lpis").unwrap_or(0),
                field(rest, "vcpu0").unwrap_or(0),
                field(rest, "required").unwrap_or(0),
            ));
        } else if rest.starts_with("seeds=") {
            summary.totals = Some((
                field(rest, "seeds").unwrap_or(0),
                field(rest, "ops").unwrap_or(0),
                field(rest, "violations").unwrap_or(0),
                field(rest, "interrupts").unwrap_or(0),
            ));
        }
    }
    summary
}

/// The outcome of one boot.
#[derive(Debug)]
pub struct Boot {
    /// `-cpu` model.
    pub cpu: String,
    /// The host's GIC.
    pub gic: GicVersion,
    /// First seed and count.
    pub seeds: (u64, u64),
    /// Its console, read.
    pub summary: BootSummary,
    /// The runner's report (`None` when QEMU could not be run at all).
    pub report: Option<qemu_runner::RunReport>,
    /// Why it could not run.
    pub error: Option<String>,
}

/// Boots `count` seeds from `first` on `cpu` (in a VM with a
/// virtio-console when the campaign allows the `virtqueue` family), on a
/// GICv3 host.
pub fn boot(campaign: &Campaign, cpu: &str, first: u64, count: u64) -> Boot {
    boot_on(campaign, cpu, GicVersion::V3, first, count)
}

/// [`boot`] on a host with `gic` (a GICv2 host gives the VM a GICv2).
pub fn boot_on(campaign: &Campaign, cpu: &str, gic: GicVersion, first: u64, count: u64) -> Boot {
    let mut config = RunConfig {
        scenario: Scenario::Fuzz,
        gic,
        guest_args: campaign.guest_args(first, count),
        cpu: cpu.to_string(),
        smp: campaign.smp,
        timeout: campaign.boot_timeout(count),
        progress: Some(campaign.progress()),
        echo: false,
        ..RunConfig::default()
    };
    if campaign.needs_virtio_console() {
        let spec = campaign.vm_spec(first, count);
        match VmSpec::parse(&spec, 0) {
            Ok(vm) => {
                // The spec describes the VM; the one-VM options stay unset.
                config = RunConfig {
                    vms: vec![vm],
                    ..RunConfig {
                        scenario: RunConfig::default().scenario,
                        guest_args: String::new(),
                        ..config
                    }
                };
            }
            Err(error) => {
                return Boot {
                    cpu: cpu.to_string(),
                    gic,
                    seeds: (first, count),
                    summary: BootSummary::default(),
                    report: None,
                    error: Some(error.to_string()),
                };
            }
        }
    }
    let (report, error) = match qemu_runner::run(&config) {
        Ok(report) => (Some(report), None),
        Err(error) => (None, Some(error.to_string())),
    };
    let summary = report
        .as_ref()
        .map(|r| summarize(r.console()))
        .unwrap_or_default();
    Boot {
        cpu: cpu.to_string(),
        gic,
        seeds: (first, count),
        summary,
        report,
        error,
    }
}

/// Adds one boot to the tally.
pub fn tally_boot(campaign: &Campaign, tally: &mut Tally, boot: &Boot) {
    let s = &boot.summary;
    let (first, count) = boot.seeds;
    let mut fail = |seed: u64, what: String| {
        tally.failures.push(Failure {
            seed,
            cpu: boot.cpu.clone(),
            what,
            rerun: campaign.rerun_command_on(&boot.cpu, boot.gic, first, seed),
        })
    };
    let current = s.last_seed.unwrap_or(first);
    for line in &s.panics {
        fail(current, line.clone());
    }
    for line in &s.vm_stops {
        fail(current, line.clone());
    }
    let mut seeds = s.violation_seeds.clone();
    seeds.sort_unstable();
    seeds.dedup();
    for seed in seeds {
        fail(
            seed,
            "guest counted violations (FUZZ: violation lines)".into(),
        );
    }
    tally.hv_panics += s.panics.len() as u64;
    tally.vm_stops += s.vm_stops.len() as u64;
    let vq_violations = virtqueue_violations(s);
    for what in &vq_violations {
        fail(current, what.clone());
    }
    tally.violations += vq_violations.len() as u64;
    tally.vq_lines += s.vq_lines;
    if let Some((lpis, checked, required)) = s.its {
        tally.its_lpis += lpis;
        tally.its_checked += checked;
        tally.its_required += required;
    }
    let passed = boot.report.as_ref().is_some_and(|r| r.passed());
    match s.totals {
        Some((seeds, ops, violations, interrupts)) => {
            tally.ops += ops;
            tally.violations += violations;
            tally.interrupts += interrupts;
            if passed || violations > 0 {
                tally.seeds += seeds;
            }
        }
        None => {
            // The guest never finished: count the seeds it completed.
            tally.seeds += current - first;
        }
    }
    let explained = !s.panics.is_empty()
        || !s.vm_stops.is_empty()
        || !vq_violations.is_empty()
        || s.totals.is_some_and(|(_, _, violations, _)| violations > 0);
    if !passed && !explained {
        tally.other_failures += 1;
        let why = match (&boot.error, &boot.report) {
            (Some(error), _) => error.clone(),
            (None, Some(report)) => report.verdict.to_string(),
            (None, None) => "no report".into(),
        };
        fail(
            current,
            format!("boot of seeds {first}..{}: {why}", first + count),
        );
    }
}

/// What the console says against the virtqueue family's totals: broken
/// `VQ` lines, fewer intact ones than guaranteed, more than sent.
pub fn virtqueue_violations(s: &BootSummary) -> Vec<String> {
    let mut found: Vec<String> = s
        .vq_broken
        .iter()
        .map(|line| format!("virtqueue: a line came out changed: {line}"))
        .collect();
    match s.virtqueue {
        Some((sent, guaranteed, _)) => {
            if s.vq_lines < guaranteed {
                found.push(format!(
                    "virtqueue: {} intact VQ lines on the console, {guaranteed} guaranteed",
                    s.vq_lines
                ));
            }
            if s.vq_lines > sent {
                found.push(format!(
                    "virtqueue: {} intact VQ lines on the console, only {sent} sent",
                    s.vq_lines
                ));
            }
        }
        None if s.vq_lines > 0 && s.totals.is_some() => {
            found.push(format!(
                "virtqueue: {} VQ lines without the family's totals",
                s.vq_lines
            ));
        }
        None => {}
    }
    found
}

/// Runs the campaign on GICv3 hosts, calling `progress` after every boot.
pub fn run(campaign: &Campaign, progress: impl FnMut(&Boot, &Tally)) -> Tally {
    run_on(campaign, &[GicVersion::V3], progress)
}

/// Runs the campaign, calling `progress` after every boot. Boots take the
/// `-cpu` models in turn, and the hosts' GICs `gics` in turn after each
/// round of models (models `a`, `b` and GICs 3, 2: `a`/v3, `b`/v3, `a`/v2,
/// `b`/v2, ...).
pub fn run_on(
    campaign: &Campaign,
    gics: &[GicVersion],
    mut progress: impl FnMut(&Boot, &Tally),
) -> Tally {
    let gics = if gics.is_empty() {
        &[GicVersion::V3][..]
    } else {
        gics
    };
    let mut tally = Tally::default();
    let per_boot = campaign.per_boot.max(1);
    let mut first = campaign.first_seed;
    let end = campaign.first_seed + campaign.seeds;
    let mut index = 0;
    while first < end {
        let count = per_boot.min(end - first);
        let cpu = &campaign.cpus[index % campaign.cpus.len()];
        let gic = gics[(index / campaign.cpus.len()) % gics.len()];
        let boot = boot_on(campaign, cpu, gic, first, count);
        tally_boot(campaign, &mut tally, &boot);
        progress(&boot, &tally);
        first += count;
        index += 1;
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_is_read() {
        let console = "test-guest: fuzz: seeds 5..7\nFUZZ: seed 5\n\
            FUZZ: violation seed=5 vcpu=1 op=3 (ldr): hole access (0x1, 0x2)\n\
            abcFUZZ: seed 6\n[hv] ERROR: vm0 vcpu2: stopping the VM: undecodable exit\n\
            FUZZ: seeds=2 ops=800 violations=1 interrupts=9\r\n";
        let s = summarize(console);
        assert_eq!(s.its, None);
        assert_eq!(s.totals, Some((2, 800, 1, 9)));
        assert_eq!(s.violation_seeds, vec![5]);
        assert_eq!(s.violation_lines.len(), 1);
        assert_eq!(s.last_seed, Some(6));
        assert_eq!(s.vm_stops.len(), 1);
        assert!(s.panics.is_empty());
    }

    #[test]
    fn its_counts_are_tallied() {
        let console = "FUZZ: seed 1\nFUZZ: its lpis=230 vcpu0=226 required=201\n\
            FUZZ: seeds=1 ops=1200 violations=0 interrupts=0\n";
        let s = summarize(console);
        assert_eq!(s.its, Some((230, 226, 201)));
        let campaign = Campaign {
            first_seed: 1,
            seeds: 1,
            ops: 300,
            per_boot: 1,
            cpus: vec!["max".into()],
            allow: "its-only".into(),
            deny: String::new(),
            smp: 4,
        };
        let boot = Boot {
            cpu: "max".into(),
            gic: GicVersion::V3,
            seeds: (1, 1),
            summary: s,
            report: None,
            error: Some("no report".into()),
        };
        let mut tally = Tally::default();
        tally_boot(&campaign, &mut tally, &boot);
        tally_boot(&campaign, &mut tally, &boot);
        assert_eq!(
            (tally.its_lpis, tally.its_checked, tally.its_required),
            (460, 452, 402)
        );
    }

    #[test]
    fn virtqueue_lines_are_checked() {
        let good = |id: &str, text: &str| {
            format!(
                "VQ {id} {:08x} {text}",
                fnv1a(format!("{id} {text}").as_bytes())
            )
        };
        let console = format!(
            "FUZZ: seed 3\n{}\n[vm0] {}\nVQ 3.2.0 0badc0de garbled\n\
             FUZZ: virtqueue sent=4 guaranteed=2 resets=1\n\
             FUZZ: seeds=1 ops=10 violations=0 interrupts=0\n",
            good("3.1.0", "abc_def"),
            good("3.1.1", "xyz"),
        );
        let s = summarize(&console);
        assert_eq!(s.virtqueue, Some((4, 2, 1)));
        assert_eq!(s.vq_lines, 2);
        assert_eq!(s.vq_broken.len(), 1);
        let found = virtqueue_violations(&s);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("came out changed"));
        let mut lost = s.clone();
        lost.vq_broken.clear();
        lost.vq_lines = 1;
        assert!(virtqueue_violations(&lost)[0].contains("2 guaranteed"));
        lost.vq_lines = 5;
        assert!(virtqueue_violations(&lost)[0].contains("only 4 sent"));
        lost.vq_lines = 3;
        assert!(virtqueue_violations(&lost).is_empty());
        // The guest computes the same check word (`virtio_ring::fnv1a`).
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);

        let campaign = Campaign {
            first_seed: 5,
            seeds: 2,
            ops: 100,
            per_boot: 2,
            cpus: vec!["max".into()],
            allow: "virtqueue".into(),
            deny: "timers,icc".into(),
            smp: 2,
        };
        assert!(campaign.needs_virtio_console());
        assert_eq!(
            campaign.rerun_command("max", 5, 6),
            "cargo run --release -p qemu-runner -- --smp 2 --cpu max --vm 'fuzz,console=virtio,\
             args=seed=5 seeds=2 ops=100 fuzz-allow=virtqueue fuzz-deny=timers fuzz-deny=icc'"
        );
        let boot = Boot {
            cpu: "max".into(),
            gic: GicVersion::V3,
            seeds: (5, 2),
            summary: summarize(&console),
            report: None,
            error: Some("no report".into()),
        };
        let mut tally = Tally::default();
        tally_boot(&campaign, &mut tally, &boot);
        assert_eq!(tally.violations, 1);
        assert_eq!(tally.other_failures, 0, "explained by the broken line");
        assert!(!tally.clean());
    }

    #[test]
    fn time_limits_are_proportional_to_the_work() {
        let mut campaign = Campaign {
            first_seed: 1,
            seeds: 1000,
            ops: 300,
            per_boot: 50,
            cpus: vec!["cortex-a57".into()],
            allow: String::new(),
            deny: String::new(),
            smp: 4,
        };
        // The long campaign: a hang is reported 16 s after its seed began.
        assert_eq!(campaign.seed_deadline(), Duration::from_secs(16));
        assert_eq!(campaign.boot_timeout(50), Duration::from_secs(196));
        assert!(campaign.boot_timeout(1) > campaign.seed_deadline());
        // The CI campaign (`e2e_fuzz`): 60 seeds of 1000 operations a boot.
        campaign.ops = 1000;
        assert_eq!(campaign.seed_deadline(), Duration::from_secs(30));
        assert_eq!(campaign.boot_timeout(60), Duration::from_secs(750));
        assert_eq!(campaign.progress().marker, SEED_MARKER);
        assert!(
            summarize("FUZZ: seeds=1 ops=4 violations=0 interrupts=0")
                .totals
                .is_some()
        );
        assert!("FUZZ: seeds=1 ops=4".contains(SEED_MARKER));
    }

    #[test]
    fn a_hang_is_a_failure_of_the_running_seed() {
        let campaign = Campaign {
            first_seed: 7,
            seeds: 3,
            ops: 300,
            per_boot: 3,
            cpus: vec!["max".into()],
            allow: String::new(),
            deny: String::new(),
            smp: 4,
        };
        let boot = Boot {
            cpu: "max".into(),
            gic: GicVersion::V3,
            seeds: (7, 3),
            summary: summarize("FUZZ: seed 7\nFUZZ: seed 8\n"),
            report: None,
            error: Some(qemu_runner::Verdict::Stalled(campaign.progress()).to_string()),
        };
        let mut tally = Tally::default();
        tally_boot(&campaign, &mut tally, &boot);
        assert_eq!(tally.other_failures, 1);
        assert_eq!(tally.seeds, 1);
        assert_eq!(tally.failures.len(), 1);
        let failure = &tally.failures[0];
        assert_eq!(failure.seed, 8);
        assert!(failure.what.contains("hang"), "{}", failure.what);
        assert_eq!(
            failure.rerun,
            "cargo run --release -p qemu-runner -- --guest fuzz --smp 4 --cpu max \
             --guest-args 'seed=7 seeds=2 ops=300'"
        );
    }

    #[test]
    fn failures_name_their_seed_and_rerun() {
        let campaign = Campaign {
            first_seed: 10,
            seeds: 4,
            ops: 100,
            per_boot: 4,
            cpus: vec!["cortex-a57".into()],
            allow: "ptimer".into(),
            deny: String::new(),
            smp: 4,
        };
        let boot = Boot {
            cpu: "cortex-a57".into(),
            gic: GicVersion::V2,
            seeds: (10, 4),
            summary: summarize("FUZZ: seed 10\nFUZZ: seed 11\n[hv] PANIC: oops\n"),
            report: None,
            error: Some("timed out".into()),
        };
        let mut tally = Tally::default();
        tally_boot(&campaign, &mut tally, &boot);
        assert_eq!(tally.hv_panics, 1);
        assert_eq!(tally.seeds, 1);
        assert!(!tally.clean());
        assert_eq!(tally.failures[0].seed, 11);
        assert_eq!(
            tally.failures[0].rerun,
            "cargo run --release -p qemu-runner -- --gic 2 --guest fuzz --smp 4 --cpu cortex-a57 \
             --guest-args 'seed=10 seeds=2 ops=100 fuzz-allow=ptimer'"
        );
        assert!(tally.figures().contains("fuzz/hv_panics 1 panics\n"));
    }
}
