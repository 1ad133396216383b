//! The guest's options, read from its bootargs (`/chosen/bootargs`):
//! `test=<scenario>` picks the scenario (`memory` by default, or one of
//! [`Scenario::ALL`]), and `hypercalls=psci` says that only PSCI answers hypercalls
//! (booted by QEMU directly, without the hypervisor), so the hypervisor's own
//! calls (`TEST_REPORT`, SMCCC `VERSION`) must not be made. Other words are
//! ignored, as a kernel ignores parameters it does not know. Pure code, tested
//! on the host.

/// Test scenario chosen by `test=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// SMP memory pattern test plus one caught abort (the default).
    Memory,
    /// Unmapped device access, device-window straddling loads and unknown
    /// hypercall.
    BadGuest,
    /// Aborts and undefined instructions from AArch64 and AArch32 EL0.
    Aarch32El0,
    /// Both EL1 timers' interrupts on every vCPU, counters consistent.
    Timers,
    /// vCPUs racing PSCI `CPU_ON` for the same target, round after round.
    CpuOnRace,
    /// A flood of distinct unknown hypercalls, injected aborts and refused
    /// device accesses.
    Flood,
    /// Interrupt delivery while more SPIs are active (through the
    /// distributor) than there are list registers.
    VgicScarce,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: &[Scenario] = &[
        Scenario::Memory,
        Scenario::BadGuest,
        Scenario::Aarch32El0,
        Scenario::Timers,
        Scenario::CpuOnRace,
        Scenario::Flood,
        Scenario::VgicScarce,
    ];

    /// The name used in `test=`.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Memory => "memory",
            Scenario::BadGuest => "bad-guest",
            Scenario::Aarch32El0 => "aarch32-el0",
            Scenario::Timers => "timers",
            Scenario::CpuOnRace => "cpu-on-race",
            Scenario::Flood => "flood",
            Scenario::VgicScarce => "vgic-scarce",
        }
    }
}

/// Options from the bootargs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The scenario to run.
    pub scenario: Scenario,
    /// Whether the hypervisor's own services exist.
    pub hypervisor_services: bool,
}

impl Options {
    /// Reads the options; an unknown scenario name is returned as the error.
    pub fn parse(bootargs: &str) -> Result<Options, &str> {
        let mut scenario = Scenario::Memory;
        for word in bootargs.split_ascii_whitespace() {
            if let Some(name) = word.strip_prefix("test=") {
                scenario = Scenario::ALL
                    .iter()
                    .copied()
                    .find(|scenario| scenario.name() == name)
                    .ok_or(name)?;
            }
        }
        Ok(Options {
            scenario,
            hypervisor_services: !Options::psci_only(bootargs),
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
        };
        assert_eq!(Options::parse(""), Ok(default));
        assert_eq!(Options::parse("console=ttyAMA0 test=memory"), Ok(default));
        assert_eq!(
            Options::parse("test=bad-guest hypercalls=psci"),
            Ok(Options {
                scenario: Scenario::BadGuest,
                hypervisor_services: false
            })
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
}
