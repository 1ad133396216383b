//! Per-VM event counters, printed when the guest powers off.
//!
//! Every counter is an `AtomicU64` bumped with relaxed ordering from whichever
//! physical CPU handles the event; [`VmCounters::snapshot`] lists them by name
//! in the fixed order the console report uses (`STAT vm<V> <name> <value>`).
//! The `TLBI` counts are not kept here: the VM's TLB backend is a
//! [`tlb::CountingTlb`], which counts what it issues, and the snapshot places
//! its [`TlbiCounts`] after the mapping counters.

use core::sync::atomic::{AtomicU64, Ordering};
use tlb::TlbiCounts;

/// One countable event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Stage-2 faults handled by mapping guest memory.
    Stage2Faults,
    /// 4 KiB pages mapped at stage 2.
    MappedPages4k,
    /// 2 MiB blocks mapped at stage 2.
    MappedBlocks2m,
    /// 1 GiB blocks mapped at stage 2.
    MappedBlocks1g,
    /// Data-abort exits.
    ExitsDabt,
    /// Instruction-abort exits.
    ExitsIabt,
    /// HVC exits.
    ExitsHvc,
    /// SMC exits.
    ExitsSmc,
    /// Trapped system-register exits.
    ExitsSysreg,
    /// WFI/WFE exits.
    ExitsWfx,
    /// Physical-interrupt exits.
    ExitsIrq,
    /// Aborts injected into the guest.
    InjectedAborts,
    /// Undefined instructions injected into the guest (trapped instructions
    /// the hypervisor does not emulate).
    InjectedUndefs,
    /// Hypercalls answered with NOT_SUPPORTED.
    UnknownHypercalls,
    /// TEST_REPORT hypercalls.
    TestReports,
    /// 4 KiB pages of guest memory cleaned to the point of coherency (no
    /// FWB): mapped, unmapped or flushed.
    CmoDcacheCleanPages,
    /// Instruction cache maintenance operations done for guest mappings
    /// (none where `CTR_EL0.DIC` and `IDC` say the CPU needs none).
    CmoIcacheInval,
    /// Guest set/way cache maintenance instructions trapped (no FWB).
    CmoSetwayTraps,
    /// Flushes of all mapped guest memory (set/way conversion, caches
    /// turned on or off while set/way is tracked).
    CmoFullFlushes,
    /// Trapped writes to the virtual-memory control registers (`HCR_EL2.TVM`,
    /// set while set/way operations are tracked).
    CmoVmRegTraps,
    /// Guest-driven log lines dropped by the VM's rate limit (`event_log`).
    LogLinesSuppressed,
    /// Times the VM was restarted in place (`vm::lifecycle`).
    Restarts,
    /// Pages a fault marked dirty in a logging slot (new marks only).
    DirtyPagesMarked,
    /// Tables collapsed back into a block by a fault after dirty logging.
    Stage2Collapses,
    /// Interrupts of passed-through devices delivered to the guest.
    PassthroughIrqs,
    /// MSIs of passed PCIe devices (host LPIs) replayed through the
    /// virtual ITS (`crate::vm::msi_shadow`).
    PassthroughMsis,
}

impl Counter {
    /// Every counter, in report order.
    pub const ALL: [Counter; 26] = [
        Counter::Stage2Faults,
        Counter::MappedPages4k,
        Counter::MappedBlocks2m,
        Counter::MappedBlocks1g,
        Counter::ExitsDabt,
        Counter::ExitsIabt,
        Counter::ExitsHvc,
        Counter::ExitsSmc,
        Counter::ExitsSysreg,
        Counter::ExitsWfx,
        Counter::ExitsIrq,
        Counter::InjectedAborts,
        Counter::InjectedUndefs,
        Counter::UnknownHypercalls,
        Counter::TestReports,
        Counter::CmoDcacheCleanPages,
        Counter::CmoIcacheInval,
        Counter::CmoSetwayTraps,
        Counter::CmoFullFlushes,
        Counter::CmoVmRegTraps,
        Counter::LogLinesSuppressed,
        Counter::Restarts,
        Counter::DirtyPagesMarked,
        Counter::Stage2Collapses,
        Counter::PassthroughIrqs,
        Counter::PassthroughMsis,
    ];

    /// The name printed in the report.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Stage2Faults => "stage2_faults",
            Counter::MappedPages4k => "mapped_pages_4k",
            Counter::MappedBlocks2m => "mapped_blocks_2m",
            Counter::MappedBlocks1g => "mapped_blocks_1g",
            Counter::ExitsDabt => "exits_dabt",
            Counter::ExitsIabt => "exits_iabt",
            Counter::ExitsHvc => "exits_hvc",
            Counter::ExitsSmc => "exits_smc",
            Counter::ExitsSysreg => "exits_sysreg",
            Counter::ExitsWfx => "exits_wfx",
            Counter::ExitsIrq => "exits_irq",
            Counter::InjectedAborts => "injected_aborts",
            Counter::InjectedUndefs => "injected_undefs",
            Counter::UnknownHypercalls => "unknown_hypercalls",
            Counter::TestReports => "test_reports",
            Counter::CmoDcacheCleanPages => "cmo_dcache_clean_pages",
            Counter::CmoIcacheInval => "cmo_icache_inval",
            Counter::CmoSetwayTraps => "cmo_setway_traps",
            Counter::CmoFullFlushes => "cmo_full_flushes",
            Counter::CmoVmRegTraps => "cmo_vmreg_traps",
            Counter::LogLinesSuppressed => "log_lines_suppressed",
            Counter::Restarts => "restarts",
            Counter::DirtyPagesMarked => "dirty_pages_marked",
            Counter::Stage2Collapses => "stage2_collapses",
            Counter::PassthroughIrqs => "passthrough_irqs",
            Counter::PassthroughMsis => "passthrough_msis",
        }
    }
}

/// Lines in the report: every [`Counter`] and the four `TLBI` counts.
pub const REPORT_LEN: usize = Counter::ALL.len() + 4;

/// The counters of one VM.
pub struct VmCounters {
    values: [AtomicU64; Counter::ALL.len()],
}

impl Default for VmCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl VmCounters {
    /// All counters at zero.
    pub const fn new() -> Self {
        Self {
            values: [const { AtomicU64::new(0) }; Counter::ALL.len()],
        }
    }

    /// Adds one to `counter`.
    pub fn bump(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: Counter, n: u64) {
        self.values[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The current value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize].load(Ordering::Relaxed)
    }

    /// Every counter with its name, in report order, with the `TLBI` counts
    /// `tlb` of the VM's TLB backend after the mapping counters.
    pub fn snapshot(&self, tlb: &TlbiCounts) -> [(&'static str, u64); REPORT_LEN] {
        let tlbi = [
            ("tlbi_ipa", tlb.ipa),
            ("tlbi_range", tlb.range),
            ("tlbi_vmalle1", tlb.vmalle1),
            ("tlbi_vmalls12", tlb.vmalls12),
        ];
        let (mapping, rest) = Counter::ALL.split_at(Counter::MappedBlocks1g as usize + 1);
        let named = |c: &Counter| (c.name(), self.get(*c));
        let mut report = [("", 0); REPORT_LEN];
        for (line, value) in report.iter_mut().zip(
            mapping
                .iter()
                .map(named)
                .chain(tlbi)
                .chain(rest.iter().map(named)),
        ) {
            *line = value;
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_order_and_values() {
        let counters = VmCounters::new();
        counters.bump(Counter::Stage2Faults);
        counters.add(Counter::MappedBlocks2m, 5);
        counters.bump(Counter::TestReports);
        let tlb = TlbiCounts {
            range: 3,
            vmalle1: 4,
            ..Default::default()
        };
        let snap = counters.snapshot(&tlb);
        let names: Vec<&str> = snap.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "stage2_faults",
                "mapped_pages_4k",
                "mapped_blocks_2m",
                "mapped_blocks_1g",
                "tlbi_ipa",
                "tlbi_range",
                "tlbi_vmalle1",
                "tlbi_vmalls12",
                "exits_dabt",
                "exits_iabt",
                "exits_hvc",
                "exits_smc",
                "exits_sysreg",
                "exits_wfx",
                "exits_irq",
                "injected_aborts",
                "injected_undefs",
                "unknown_hypercalls",
                "test_reports",
                "cmo_dcache_clean_pages",
                "cmo_icache_inval",
                "cmo_setway_traps",
                "cmo_full_flushes",
                "cmo_vmreg_traps",
                "log_lines_suppressed",
                "restarts",
                "dirty_pages_marked",
                "stage2_collapses",
                "passthrough_irqs",
                "passthrough_msis",
            ]
        );
        assert_eq!(snap[0], ("stage2_faults", 1));
        assert_eq!(snap[2], ("mapped_blocks_2m", 5));
        assert_eq!(snap[5], ("tlbi_range", 3));
        assert_eq!(snap[6], ("tlbi_vmalle1", 4));
        assert_eq!(snap[18], ("test_reports", 1));
        assert_eq!(snap.iter().map(|(_, v)| v).sum::<u64>(), 14);
    }

    #[test]
    fn index_matches_position() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
