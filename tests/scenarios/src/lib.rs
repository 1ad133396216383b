//! The test guest's scenarios (`test=` in its bootargs) and their names:
//! one list for the guest, which runs them (`tests/guest`), and for the
//! runner, which boots the guest with one (`qemu-runner`). What each one
//! checks is in the guest's module of the same name.
//!
//! ```
//! use test_scenarios::Scenario;
//!
//! assert_eq!(Scenario::from_name("vector-regs"), Some(Scenario::VectorRegs));
//! assert_eq!(Scenario::Migrate.name(), "migrate");
//! assert!(!Scenario::Echo.reports_result());
//! ```

#![no_std]

/// The test guest's scenario (`test=` in its bootargs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// SMP memory test with demand-faulted stage-2 memory and a caught abort.
    Memory,
    /// Unmapped device access, device-window straddling loads and an unknown
    /// hypercall; the hypervisor must survive and report them.
    BadGuest,
    /// Aborts and undefined instructions from AArch64 and AArch32 EL0; the
    /// hypervisor must inject the aborts as the architecture takes them.
    Aarch32El0,
    /// Both EL1 timers (physical and virtual) interrupt every vCPU through
    /// the GIC; `CNTPCT_EL0` and `CNTVCT_EL0` agree and are monotonic.
    Timers,
    /// Several vCPUs race PSCI `CPU_ON` for the same target, round after
    /// round: exactly one `SUCCESS`, `ALREADY_ON` for the others.
    CpuOnRace,
    /// 200 000 distinct unknown hypercalls, 20 000 injected aborts and 5 000
    /// refused device accesses: the hypervisor's log stays short.
    Flood,
    /// Interrupt delivery while more SPIs are active (made so through the
    /// distributor) than the CPU interface has list registers.
    VgicScarce,
    /// The hostile-guest fuzzer (`seed=`, `seeds=`, `ops=`, `fuzz-allow=`, `fuzz-deny=`).
    Fuzz,
    /// Prints `echo: tick N` twice a second and `echo: got <line>` for each
    /// line typed on its console, forever (no verdict: `expect=running`).
    Echo,
    /// A control VM (`control=1`) drives the control interface against a
    /// `control-peer` VM: memory reads, memslot create / move / delete,
    /// pause / resume, bogus calls, stop.
    Control,
    /// The peer of `control`: refused by the control interface, writes a
    /// pattern, then touches memory outside its RAM until stopped.
    ControlPeer,
    /// A control VM (`control=1`) checks a `dirty-writer` VM's dirty log
    /// against its memory, round after round (`dirty-mode=`,
    /// `eager-split=`).
    DirtyLog,
    /// The peer of `dirty-log`: writes and reads random pages of a region
    /// until stopped.
    DirtyWriter,
    /// Writes pages for 8 s, to be live-migrated meanwhile, then checks
    /// every page it wrote.
    Migrate,
    /// A control VM (`control=1`) times stage-2 page-table work (map,
    /// write-protect, relax, collapse, split, unmap) on a `toucher` VM.
    PageTable,
    /// A control VM (`control=1`) creates, moves and deletes many slots in a
    /// `toucher` VM while it touches them, timing and checking each change
    /// (`slots=`).
    MemslotPerf,
    /// The peer of `page-table` and `memslot-perf`: stores into guest pages
    /// on command until stopped.
    Toucher,
    /// Checks every FP/SIMD, SVE and SME register starts at zero, then
    /// leaves patterns in them (streaming mode and ZA live with SME): run
    /// again on the same CPU (a restart), it shows the hypervisor cleared
    /// them.
    VectorRegs,
    /// A hostile driver of the VM's virtio-console (`console=virtio`):
    /// descriptor loops, buffers and rings outside RAM and in device
    /// windows, huge lengths, nested and malformed indirect tables, notify
    /// storms, register abuse, resets in the middle of a request; the
    /// device must use each chain or enter `DEVICE_NEEDS_RESET`, and work
    /// again after a reset.
    VirtioBad,
    /// Memory tagging (FEAT_MTE2) in an `mte=on` VM: the CPU shows it, a
    /// region's allocation tags start at zero, tag checks fault, the tag
    /// registers survive exits, an injected abort enters with `PSTATE.TCO`
    /// set; it leaves tags behind so that a restart shows they were cleared.
    Mte,
    /// A GICv3 ITS (`arm,gic-v3-its`) on every vCPU: tables and command
    /// queue set up, events mapped to LPIs and delivered by `INT` and
    /// `GITS_TRANSLATER` writes on their collection's vCPU; `MAPI`, `MOVI`,
    /// `MOVALL`, `DISCARD`, `CLEAR`, `INV`, `INVALL`, property-table
    /// priorities and dropped bad commands.
    Its,
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
        Scenario::Fuzz,
        Scenario::Echo,
        Scenario::Control,
        Scenario::ControlPeer,
        Scenario::DirtyLog,
        Scenario::DirtyWriter,
        Scenario::Migrate,
        Scenario::PageTable,
        Scenario::MemslotPerf,
        Scenario::Toucher,
        Scenario::VectorRegs,
        Scenario::VirtioBad,
        Scenario::Mte,
        Scenario::Its,
    ];

    /// The scenario's name on the command line and in `test=`.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Memory => "memory",
            Scenario::BadGuest => "bad-guest",
            Scenario::Aarch32El0 => "aarch32-el0",
            Scenario::Timers => "timers",
            Scenario::CpuOnRace => "cpu-on-race",
            Scenario::Flood => "flood",
            Scenario::VgicScarce => "vgic-scarce",
            Scenario::Fuzz => "fuzz",
            Scenario::Echo => "echo",
            Scenario::Control => "control",
            Scenario::ControlPeer => "control-peer",
            Scenario::DirtyLog => "dirty-log",
            Scenario::DirtyWriter => "dirty-writer",
            Scenario::Migrate => "migrate",
            Scenario::PageTable => "page-table",
            Scenario::MemslotPerf => "memslot-perf",
            Scenario::Toucher => "toucher",
            Scenario::VectorRegs => "vector-regs",
            Scenario::VirtioBad => "virtio-bad",
            Scenario::Mte => "mte",
            Scenario::Its => "its",
        }
    }

    /// The scenario called `name`.
    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.iter().copied().find(|s| s.name() == name)
    }

    /// Whether the scenario ends with a `RESULT:` line (the echo scenario
    /// runs until it is stopped).
    pub fn reports_result(self) -> bool {
        self != Scenario::Echo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_and_names_differ() {
        for (i, &scenario) in Scenario::ALL.iter().enumerate() {
            assert_eq!(Scenario::from_name(scenario.name()), Some(scenario));
            for &other in &Scenario::ALL[i + 1..] {
                assert_ne!(scenario.name(), other.name());
            }
        }
        assert_eq!(Scenario::from_name("nope"), None);
    }
}
