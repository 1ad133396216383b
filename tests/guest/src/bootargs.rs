//! The guest's options, read from its bootargs (`/chosen/bootargs`):
//! `test=<scenario>` picks the scenario (`memory` by default, or one of
//! [`Scenario::ALL`]), and `hypercalls=psci` says that only PSCI answers hypercalls
//! (booted by QEMU directly, without the hypervisor), so the hypervisor's own
//! calls (`TEST_REPORT`, SMCCC `VERSION`) must not be made. The fuzz scenario
//! reads `seed=N` (first seed, default 1), `seeds=K` (consecutive seeds run in
//! one boot, default 1), `ops=M` (operations per seed and vCPU, default 500)
//! `migrate-seconds=N` (how long the migrate scenario writes, default 8),
//! `migrate-tags` (a bare word: the migrate scenario also gives every page
//! it writes an allocation tag and checks the tags after; needs MTE),
//! `passed-window=ADDR` (the memory scenario reads the virtio-mmio magic
//! value of a transport the VM owns there), `probe-ipa=ADDR` (the memory scenario also reads that address and must
//! catch the abort: an isolation check),
//! `fuzz-allow=a,b,...` and `fuzz-deny=a,b,...` (operation families added to
//! or taken out of the default mix, in the order given, see
//! [`FuzzOptions::ALLOW_NAMES`]) and `fuzz-verbose=1` (a progress line
//! before every operation, to find the one a hang is in). The bad guest reads
//! `bad-exit=reset` (end with PSCI `SYSTEM_RESET` after the hostile accesses,
//! instead of printing a result; `bad-exit=result` is the default). The
//! dirty-log scenario reads `dirty-mode=plain|manual|all-set` and
//! `eager-split=SIZE` ([`DirtyOptions`]). Numbers are decimal or `0x` hex. Other
//! words are ignored, as a kernel ignores parameters it does not know. Pure
//! code, tested on the host.

pub use test_scenarios::Scenario;

/// The fuzz scenario's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuzzOptions {
    /// First seed.
    pub seed: u64,
    /// Consecutive seeds to run (`seed..seed + seeds`).
    pub seeds: u64,
    /// Operations per seed on each vCPU.
    pub ops: u64,
    /// Operation families added to the default mix (`ALLOW_*` bits).
    pub allow: u32,
    /// Print one progress line (seed, vCPU, operation index and family)
    /// before every operation: finds the operation a hang is in.
    pub verbose: bool,
}

impl FuzzOptions {
    /// Drops to AArch32 EL0 as well as AArch64 EL0.
    pub const ALLOW_EL0_AARCH32: u32 = 1 << 0;
    /// Hypercalls with any function id (the default draws unknown ids from a
    /// small fixed pool, so the hypervisor's once-per-id log stays short).
    pub const ALLOW_HVC_ANY: u32 = 1 << 1;
    /// Writes to the GIC's `ISACTIVER` registers (many interrupts active at
    /// once) and `ICC_IAR*_EL1` reads among the random system-register
    /// reads (each interrupt they acknowledge is completed at once: left
    /// active, it would hold the vCPU's running priority and block every
    /// later interrupt check there).
    pub const ALLOW_GIC_ACTIVE: u32 = 1 << 2;
    /// Accesses to the EL1 physical timer (`CNTP_*_EL0`, PPI 30).
    pub const ALLOW_PTIMER: u32 = 1 << 3;
    /// Unaligned MMIO accesses that straddle the end of a device window,
    /// through the Normal-memory device alias so that they reach the
    /// hypervisor, which must answer with an external abort.
    pub const ALLOW_STRADDLE: u32 = 1 << 4;

    /// Interrupt checks with the guest's group 0 left disabled
    /// (`ICC_IGRPEN0_EL1` = 0): the hypervisor fills the list registers by
    /// priority whatever the guest's group enables, so pending group-0
    /// interrupts of better priority could hold every list register and
    /// starve group 1 (not seen).
    pub const ALLOW_GROUP0_OFF: u32 = 1 << 5;

    /// Interrupt checks without first deactivating every SPI and private
    /// interrupt, which pile up in the active state (more than the list
    /// registers hold) in long runs; SGIs and the timer must still arrive.
    pub const ALLOW_KEEP_ACTIVE: u32 = 1 << 6;

    /// Both EL1 timers armed, left to fire with IRQs masked, then disabled,
    /// masked or reprogrammed before IRQs are unmasked: a timer interrupt
    /// taken while its timer no longer asserts it is a violation.
    pub const ALLOW_TIMERS: u32 = 1 << 7;

    /// Random values in the guest's GIC CPU interface registers
    /// (`ICC_BPR0/1_EL1`, `ICC_CTLR_EL1.CBPR`, `ICC_PMR_EL1`, the group
    /// enables, `ICC_IAR1_EL1`/`ICC_EOIR1_EL1` pairs), each field within
    /// its architectural width.
    pub const ALLOW_ICC: u32 = 1 << 8;

    /// With `icc`: binary point writes with bits set above the 3-bit field
    /// (`RES0`). QEMU 7.2 clamps such a value to the minimum before it drops
    /// the high bits, so `ICC_BPR1_EL1 = 8` would leave the virtual group-1
    /// binary point at 0 and its next group-1 acknowledge abort QEMU
    /// (`icv_gprio_mask: Assertion 'bpr > 0' failed`); the hypervisor keeps
    /// it from doing so (`hypervisor::devices::vgic::cpu_interface`).
    pub const ALLOW_ICC_WIDE: u32 = 1 << 9;

    /// Random descriptor tables, available-ring entries and register
    /// accesses against the VM's virtio-console, on the boot vCPU (see
    /// `fuzz_virtqueue`). Needs a VM with `console=virtio`, so not in the
    /// default mix.
    pub const ALLOW_VIRTQUEUE: u32 = 1 << 10;

    /// GICv2 hosts: `GICD_ISPENDR0` and `GICD_ICPENDR0` writes to an SGI's
    /// bit, which the GICv2 specification makes WI (an SGI's pending state
    /// is per source, set and cleared through `GICD_SPENDSGIR` and
    /// `GICD_CPENDSGIR`): an `ISPENDR0` write must not make the SGI pending,
    /// an `ICPENDR0` write must not clear it. Not in the default mix: the
    /// hypervisor does both (an `ISPENDR0` write leaves the SGI pending with
    /// no source); meaningful with one vCPU (others may send the SGI
    /// meanwhile).
    pub const ALLOW_GICV2_SGI_PEND: u32 = 1 << 11;

    /// `its`: random ITS commands, `GITS_*` accesses and LPIs checked
    /// against a model of the mappings (GICv3 hosts whose device tree has
    /// an ITS; see `fuzz_its`), one operation in 16.
    pub const ALLOW_ITS: u32 = 1 << 12;
    /// `its-only`: every operation is the `its` family's (vCPU 0) or its
    /// noise (the others); implies `its`. Not in the default mix.
    pub const ALLOW_ITS_ONLY: u32 = 1 << 13;

    /// `fuzz-allow=` names and their bits.
    pub const ALLOW_NAMES: [(&'static str, u32); 14] = [
        ("el0-aarch32", Self::ALLOW_EL0_AARCH32),
        ("hvc-any", Self::ALLOW_HVC_ANY),
        ("gic-active", Self::ALLOW_GIC_ACTIVE),
        ("ptimer", Self::ALLOW_PTIMER),
        ("straddle", Self::ALLOW_STRADDLE),
        ("group0-off", Self::ALLOW_GROUP0_OFF),
        ("keep-active", Self::ALLOW_KEEP_ACTIVE),
        ("timers", Self::ALLOW_TIMERS),
        ("icc", Self::ALLOW_ICC),
        ("icc-wide", Self::ALLOW_ICC_WIDE),
        ("virtqueue", Self::ALLOW_VIRTQUEUE),
        ("gicv2-sgi-pend", Self::ALLOW_GICV2_SGI_PEND),
        ("its", Self::ALLOW_ITS),
        ("its-only", Self::ALLOW_ITS_ONLY),
    ];

    /// The default mix: every family but `virtqueue`, `gicv2-sgi-pend` and
    /// `its-only`.
    pub const DEFAULT_MIX: u32 = Self::ALLOW_EL0_AARCH32
        | Self::ALLOW_HVC_ANY
        | Self::ALLOW_GIC_ACTIVE
        | Self::ALLOW_PTIMER
        | Self::ALLOW_STRADDLE
        | Self::ALLOW_GROUP0_OFF
        | Self::ALLOW_KEEP_ACTIVE
        | Self::ALLOW_TIMERS
        | Self::ALLOW_ICC
        | Self::ALLOW_ICC_WIDE
        | Self::ALLOW_ITS;

    /// The defaults: seed 1, one seed, 500 operations, the default mix.
    pub const DEFAULT: FuzzOptions = FuzzOptions {
        seed: 1,
        seeds: 1,
        ops: 500,
        allow: Self::DEFAULT_MIX,
        verbose: false,
    };

    /// Whether `bit` was allowed.
    pub fn allows(&self, bit: u32) -> bool {
        self.allow & bit != 0
    }
}

fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Options from the bootargs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The scenario to run.
    pub scenario: Scenario,
    /// Whether the hypervisor's own services exist.
    pub hypervisor_services: bool,
    /// Options of the fuzz scenario.
    pub fuzz: FuzzOptions,
    /// `bad-exit=reset`: the bad guest ends with PSCI `SYSTEM_RESET` after its
    /// hostile accesses instead of printing its result.
    pub bad_exit_reset: bool,
    /// `probe-ipa=ADDR`: the memory scenario also reads this address,
    /// which must be a hole of this VM (an isolation check: the test passes
    /// the host address that backs another VM's RAM), and must catch the
    /// abort.
    pub probe_ipa: Option<u64>,
    /// `passed-window=ADDR` (up to four): the memory scenario also reads
    /// the virtio-mmio magic value at each address, a transport the VM was
    /// given (passthrough) or one in the same page, and must find it.
    pub passed_windows: [Option<u64>; 4],
    /// The dirty-log scenario's settings.
    pub dirty: DirtyOptions,
    /// `slots=N`: how many slots the memslot-perf scenario creates.
    pub slots: u32,
    /// `migrate-seconds=N`: how long the migrate scenario writes before it
    /// checks (long enough for a person to type `migrate` at the monitor).
    pub migrate_seconds: u64,
    /// `migrate-tags`: the migrate scenario also sets an allocation tag on
    /// every page it writes and checks it at the end (MTE).
    pub migrate_tags: bool,
}

/// The memslot-perf scenario's slot count when `slots=` is absent.
pub const DEFAULT_SLOTS: u32 = 256;

/// The migrate scenario's writing time when `migrate-seconds=` is absent.
pub const DEFAULT_MIGRATE_SECONDS: u64 = 8;

/// The `dirty-log` scenario's settings: `dirty-mode=plain|manual|all-set`
/// (the peer's dirty-log mode: harvest clears, manual protection, manual
/// protection with bitmaps that start all set) and `eager-split=SIZE`
/// (eager split chunk size in bytes, 0: off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtyOptions {
    /// Mode bits as `DIRTY_LOG_CONFIG` takes them (bit 0 manual
    /// protection, bit 1 initially all set).
    pub mode: u8,
    /// Eager split chunk size in bytes.
    pub eager_split: u64,
    /// `dirty-pattern=passes`: the writer writes each page of its share once
    /// per round, when told (KVM's iterations), instead of at random all
    /// the time (`random`, the default).
    pub passes: bool,
}

impl Options {
    /// Reads the options; an unknown scenario name, a malformed number or an
    /// unknown `fuzz-allow` name is returned as the error (the offending word).
    pub fn parse(bootargs: &str) -> Result<Options, &str> {
        let mut scenario = Scenario::Memory;
        let mut fuzz = FuzzOptions::DEFAULT;
        let mut bad_exit_reset = false;
        let mut probe_ipa = None;
        let mut passed_windows = [None; 4];
        let mut dirty = DirtyOptions::default();
        let mut slots = DEFAULT_SLOTS;
        let mut migrate_seconds = DEFAULT_MIGRATE_SECONDS;
        let mut migrate_tags = false;
        for word in bootargs.split_ascii_whitespace() {
            if word == "migrate-tags" {
                migrate_tags = true;
                continue;
            }
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            match key {
                "test" => {
                    scenario = Scenario::from_name(value).ok_or(value)?;
                }
                "bad-exit" => {
                    bad_exit_reset = match value {
                        "reset" => true,
                        "result" => false,
                        _ => return Err(word),
                    }
                }
                "seed" => fuzz.seed = number(value).ok_or(word)?,
                "seeds" => fuzz.seeds = number(value).ok_or(word)?,
                "ops" => fuzz.ops = number(value).ok_or(word)?,
                "probe-ipa" => probe_ipa = Some(number(value).ok_or(word)?),
                "passed-window" => {
                    let slot = passed_windows
                        .iter_mut()
                        .find(|slot| slot.is_none())
                        .ok_or(word)?;
                    *slot = Some(number(value).ok_or(word)?);
                }
                "dirty-mode" => {
                    dirty.mode = match value {
                        "plain" => 0,
                        "manual" => 1,
                        "all-set" => 3,
                        _ => return Err(word),
                    }
                }
                "eager-split" => dirty.eager_split = number(value).ok_or(word)?,
                "dirty-pattern" => {
                    dirty.passes = match value {
                        "random" => false,
                        "passes" => true,
                        _ => return Err(word),
                    }
                }
                "slots" => {
                    slots = number(value)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or(word)?
                }
                "migrate-seconds" => {
                    migrate_seconds = number(value).filter(|&n| n > 0).ok_or(word)?
                }
                "fuzz-verbose" => fuzz.verbose = number(value).ok_or(word)? != 0,
                "fuzz-allow" | "fuzz-deny" => {
                    for name in value.split(',').filter(|n| !n.is_empty()) {
                        let (_, bit) = FuzzOptions::ALLOW_NAMES
                            .iter()
                            .find(|(known, _)| *known == name)
                            .ok_or(name)?;
                        if key == "fuzz-allow" {
                            fuzz.allow |= bit;
                        } else {
                            fuzz.allow &= !bit;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Options {
            scenario,
            hypervisor_services: !Options::psci_only(bootargs),
            fuzz,
            bad_exit_reset,
            probe_ipa,
            passed_windows,
            dirty,
            slots,
            migrate_seconds,
            migrate_tags,
        })
    }

    /// Whether the bootargs say only PSCI answers hypercalls.
    pub fn psci_only(bootargs: &str) -> bool {
        bootargs
            .split_ascii_whitespace()
            .any(|word| word == "hypercalls=psci")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootargs_pick_scenario_and_services() {
        let default = Options {
            scenario: Scenario::Memory,
            hypervisor_services: true,
            fuzz: FuzzOptions::DEFAULT,
            bad_exit_reset: false,
            probe_ipa: None,
            passed_windows: [None; 4],
            dirty: DirtyOptions::default(),
            slots: DEFAULT_SLOTS,
            migrate_seconds: DEFAULT_MIGRATE_SECONDS,
            migrate_tags: false,
        };
        assert_eq!(Options::parse(""), Ok(default));
        assert_eq!(Options::parse("console=ttyAMA0 test=memory"), Ok(default));
        assert_eq!(
            Options::parse("test=bad-guest hypercalls=psci"),
            Ok(Options {
                scenario: Scenario::BadGuest,
                hypervisor_services: false,
                fuzz: FuzzOptions::DEFAULT,
                bad_exit_reset: false,
                probe_ipa: None,
                passed_windows: [None; 4],
                dirty: DirtyOptions::default(),
                slots: DEFAULT_SLOTS,
                migrate_seconds: DEFAULT_MIGRATE_SECONDS,
                migrate_tags: false,
            })
        );
        assert!(
            Options::parse("test=bad-guest bad-exit=reset")
                .unwrap()
                .bad_exit_reset
        );
        assert!(!Options::parse("bad-exit=result").unwrap().bad_exit_reset);
        assert_eq!(Options::parse("bad-exit=crash"), Err("bad-exit=crash"));
        assert_eq!(
            Options::parse("probe-ipa=0x4c000000").unwrap().probe_ipa,
            Some(0x4c00_0000)
        );
        assert_eq!(Options::parse("probe-ipa=x"), Err("probe-ipa=x"));
        assert_eq!(
            Options::parse("passed-window=0xa003e00 passed-window=0xa003c00")
                .unwrap()
                .passed_windows,
            [Some(0xa003e00), Some(0xa003c00), None, None]
        );
        let five =
            "passed-window=1 passed-window=2 passed-window=3 passed-window=4 passed-window=5";
        assert_eq!(Options::parse(five), Err("passed-window=5"));
        let dirty =
            Options::parse("test=dirty-log dirty-mode=all-set eager-split=0x200000").unwrap();
        assert_eq!(dirty.scenario, Scenario::DirtyLog);
        assert_eq!(
            dirty.dirty,
            DirtyOptions {
                mode: 3,
                eager_split: 0x20_0000,
                passes: false,
            }
        );
        assert_eq!(Options::parse("dirty-mode=x"), Err("dirty-mode=x"));
        assert!(Options::parse("dirty-pattern=passes").unwrap().dirty.passes);
        assert_eq!(Options::parse("dirty-pattern=x"), Err("dirty-pattern=x"));
        let migrate = Options::parse("test=migrate migrate-seconds=60").unwrap();
        assert_eq!(migrate.migrate_seconds, 60);
        assert!(!migrate.migrate_tags);
        let tags = Options::parse("test=migrate migrate-tags migrate-seconds=20").unwrap();
        assert!(tags.migrate_tags && tags.migrate_seconds == 20);
        assert!(!Options::parse("migrate-tagsx").unwrap().migrate_tags);
        assert_eq!(
            Options::parse("migrate-seconds=0"),
            Err("migrate-seconds=0")
        );
        let perf = Options::parse("test=memslot-perf slots=4096").unwrap();
        assert_eq!((perf.scenario, perf.slots), (Scenario::MemslotPerf, 4096));
        assert_eq!(
            Options::parse("slots=0x1_0000_0000"),
            Err("slots=0x1_0000_0000")
        );
        assert_eq!(
            Options::parse("test=memory test=bad-guest")
                .unwrap()
                .scenario,
            Scenario::BadGuest
        );
        assert_eq!(Options::parse("test=fly hypercalls=psci"), Err("fly"));
        assert!(!Options::psci_only("hypercalls=psci-ish"));
        for &scenario in Scenario::ALL {
            let bootargs = format!("test={}", scenario.name());
            assert_eq!(Options::parse(&bootargs).unwrap().scenario, scenario);
        }
    }

    #[test]
    fn fuzz_options() {
        let options = Options::parse(
            "test=fuzz seed=0x10 seeds=7 ops=300 fuzz-deny=straddle,ptimer fuzz-allow=ptimer",
        )
        .unwrap();
        assert_eq!(options.scenario, Scenario::Fuzz);
        assert_eq!(
            options.fuzz,
            FuzzOptions {
                seed: 16,
                seeds: 7,
                ops: 300,
                allow: FuzzOptions::DEFAULT_MIX & !FuzzOptions::ALLOW_STRADDLE,
                verbose: false,
            }
        );
        assert!(options.fuzz.allows(FuzzOptions::ALLOW_PTIMER));
        assert!(!options.fuzz.allows(FuzzOptions::ALLOW_STRADDLE));
        let default = Options::parse("test=fuzz").unwrap().fuzz;
        for (name, bit) in FuzzOptions::ALLOW_NAMES {
            let wanted = bit != FuzzOptions::ALLOW_VIRTQUEUE
                && bit != FuzzOptions::ALLOW_GICV2_SGI_PEND
                && bit != FuzzOptions::ALLOW_ITS_ONLY;
            assert_eq!(default.allows(bit), wanted, "{name} in the default mix");
        }
        assert_eq!(Options::parse("test=fuzz fuzz-deny=fly"), Err("fly"));
        assert_eq!(Options::parse("test=fuzz seed=x1"), Err("seed=x1"));
        assert!(Options::parse("fuzz-verbose=1").unwrap().fuzz.verbose);
        assert!(!Options::parse("fuzz-verbose=0").unwrap().fuzz.verbose);
        assert_eq!(Options::parse("fuzz-verbose=on"), Err("fuzz-verbose=on"));
        assert_eq!(Options::parse("test=fuzz fuzz-allow=fly"), Err("fly"));
        let repeated =
            Options::parse("test=fuzz fuzz-allow=virtqueue fuzz-deny=timers fuzz-deny=icc")
                .unwrap()
                .fuzz;
        assert!(repeated.allows(FuzzOptions::ALLOW_VIRTQUEUE));
        assert!(!repeated.allows(FuzzOptions::ALLOW_TIMERS));
        assert!(!repeated.allows(FuzzOptions::ALLOW_ICC));
        assert_eq!(
            Options::parse("test=fuzz").unwrap().fuzz,
            FuzzOptions::DEFAULT
        );
    }
}
