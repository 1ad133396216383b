//! The benchmark suites, one module each, and the table that names them.

pub mod dirty_log;
pub mod faults;
pub mod linux_boot;
pub mod memslot_perf;
pub mod memslots;
pub mod migrate;
pub mod page_table;
pub mod passthrough;
pub mod split;
pub mod tlb;
pub mod unmap;
pub mod virtio;

/// A suite: its name on the command line and the function that prints its figures.
pub struct Suite {
    /// Name given to `bench -- NAME`.
    pub name: &'static str,
    /// What the suite measures, for `bench --list`.
    pub about: &'static str,
    /// Runs the suite, printing one figure per line.
    pub run: fn(),
}

/// Every suite, in the order `bench -- all` runs them.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "tlb",
        about: "TLBI operations planned for stage-2 flushes, range vs without FEAT_TLBIRANGE",
        run: tlb::run,
    },
    Suite {
        name: "memslots",
        about: "Memslot setup, lookup, delete, move and backing queries vs a sorted-array baseline",
        run: memslots::run,
    },
    Suite {
        name: "split",
        about: "Eager split of 1 GiB to 4 KiB pages: skip hints on and off, per block vs in chunks",
        run: split::run,
    },
    Suite {
        name: "linux_boot",
        about: "Linux guest: QEMU start to the init's marker line, under the hypervisor vs direct at EL1",
        run: linux_boot::run,
    },
    Suite {
        name: "faults",
        about: "Fault-in throughput of 1 GiB with 1..N threads: shared walks vs one write lock",
        run: faults::run,
    },
    Suite {
        name: "dirty_log",
        about: "Dirty logging in QEMU: enable time, round-1 write rate and harvest time, eager split off vs on",
        run: dirty_log::run,
    },
    Suite {
        name: "page_table",
        about: "Stage-2 work in QEMU on a 64 MiB slot: map, write-protect, relax, collapse, split, unmap; range TLBI vs cortex-a57",
        run: page_table::run,
    },
    Suite {
        name: "memslot_perf",
        about: "Memslots in QEMU: setup, fault-in, moves and deletes with 16..4096 slots while a vCPU touches them",
        run: memslot_perf::run,
    },
    Suite {
        name: "migrate",
        about: "Live migration of the writing test guest in QEMU: total time, downtime, iterations",
        run: migrate::run,
    },
    Suite {
        name: "unmap",
        about: "Unmap of 1 GiB: TLBI operations and time, deferred range flush vs per entry",
        run: unmap::run,
    },
    Suite {
        name: "virtio",
        about: "Linux on the hypervisor's virtio devices: net between two VMs, blk vs QEMU's own virtio-blk, virtio-console vs PL011",
        run: virtio::run,
    },
    Suite {
        name: "passthrough",
        about: "Linux reading a virtio-blk it owns (virtio-mmio; PCIe as context) vs the same Linux booted directly by QEMU",
        run: passthrough::run,
    },
];
