//! Bare-metal EL1 test guest for the hypervisor.
//!
//! Built for `aarch64-unknown-none-softfloat`, converted to an arm64 `Image`
//! by `qemu-runner` and packed as the `kernel` of the boot payload. It learns
//! the machine from the device tree in `x0` (RAM, CPUs, PL011, bootargs),
//! turns on its MMU with an identity map (RAM normal write-back, everything
//! else device) so that atomics and unaligned accesses behave as on real
//! hardware, installs exception vectors that catch the data aborts it provokes
//! on purpose, and runs the scenario named by `test=` in the bootargs:
//!
//! * `memory` (default): every vCPU (secondaries started with PSCI `CPU_ON`)
//!   writes a pattern over its share of free guest RAM in 4 KiB strides, then
//!   verifies a neighbour's share; vCPU 0 reads an IPA outside RAM and must
//!   catch the abort.
//! * `aarch32-el0`: runs small programs at AArch64 EL0 and AArch32 EL0 that
//!   load from and branch to a hole (the hypervisor must inject the aborts)
//!   and execute undefined instructions, and checks each exception taken to
//!   EL1: vector, ESR, FAR, ELR, SPSR.
//! * `timers`: every vCPU drives its GIC redistributor and CPU interface,
//!   arms the EL1 physical timer alone and then together with the virtual
//!   timer, takes each interrupt in `WFI`, and checks that `CNTPCT_EL0` and
//!   `CNTVCT_EL0` agree and never go backwards.
//! * `bad-guest`: reads and writes an unmapped device address, loads 8 bytes
//!   at the last 4 bytes of two device windows and issues an unknown
//!   hypercall, expecting aborts and `NOT_SUPPORTED`.
//! * `cpu-on-race`: vCPUs race PSCI `CPU_ON` for one target, round after
//!   round, expecting one `SUCCESS` and `ALREADY_ON` for the others.
//! * `flood`: 200 000 distinct unknown hypercalls, 20 000 aborting loads and
//!   5 000 refused device loads, all answered correctly.
//! * `vgic-scarce` (boot vCPU only): makes more SPIs active through
//!   `GICD_ISACTIVER` than the CPU interface has list registers, then must
//!   still take its virtual timer and an SGI to itself, which are more
//!   urgent; deactivates the SPIs and checks the GIC state; moves a pending
//!   interrupt's priority above the priority mask and must take it.
//! * `fuzz`: a hostile guest on every vCPU, reproducible from `seed=`
//!   (`seeds=`, `ops=`, `fuzz-allow=`); it checks the answers a guest may
//!   rely on and counts violations (see `fuzz`).
//! * `echo` (boot vCPU only): prints a tick twice a second and echoes the
//!   lines typed on its console, forever, without a `RESULT:` line (for the
//!   hypervisor's console monitor; see `echo`).
//! * `control` / `control-peer`: a control VM drives the hypervisor's
//!   control interface against its peer (see `control`).
//! * `dirty-log` / `dirty-writer`: a control VM checks a peer's dirty log
//!   against its memory (see `dirty_log`); `migrate` writes pages while it
//!   is live-migrated and checks them after (see `migrate`).
//! * `page-table` / `memslot-perf` with a `toucher` peer: a control VM times
//!   stage-2 page-table work and memslot changes on a peer that touches
//!   memory on command, and checks the peer's view after each change (see
//!   `page_table`, `memslot_perf`, `toucher`).
//! * `vector-regs` (boot vCPU only): checks every FP/SIMD, SVE and SME
//!   register starts at zero, then leaves patterns in them (streaming mode
//!   and ZA live with SME); restarted on its CPU, it shows the hypervisor
//!   cleared them (see `vector_regs`).
//! * `virtio-bad` (boot vCPU only, a VM with `console=virtio`): drives its
//!   virtio-console well (`virtio-console: hello`) and then badly: broken
//!   chains, rings in device memory, notify storms, register abuse; the
//!   device must use each chain or need a reset, and work after a reset
//!   (see `virtio_bad`, the driver in `virtio`).
//! * `mte` (boot vCPU only, a VM with `mte=on`): memory tagging as a guest
//!   sees it: FEAT_MTE2 shown, tags zero on first touch, synchronous tag
//!   check faults, tag registers kept across exits, `PSTATE.TCO` set on an
//!   injected abort; it leaves tags behind for a restart to clear (see
//!   `mte`).
//! * `its` (every vCPU): drives the GICv3 ITS of the device tree through
//!   the `gic_its` driver: tables, command queue, LPIs on every
//!   redistributor; events mapped with `MAPD`/`MAPC`/`MAPTI`/`MAPI` arrive
//!   once on their collection's vCPU after `INT` or a `GITS_TRANSLATER`
//!   write; `MOVI`, `MOVALL`, `DISCARD`, `CLEAR`, `INV`, `INVALL`,
//!   priorities and dropped bad commands (see `its`).
//!
//! Every other scenario ends with one `RESULT: PASS` or `RESULT: FAIL <why>` line, reports the
//! outcome with the `TEST_REPORT` hypercall (unless booted without the
//! hypervisor, bootarg `hypercalls=psci`) and calls PSCI `SYSTEM_OFF`.
//!
//! Built for the host, the crate is only a program that says what it is, so
//! that the workspace builds and tests everywhere.

#![cfg_attr(target_os = "none", no_std)]
#![cfg_attr(target_os = "none", no_main)]

#[cfg(target_os = "none")]
mod boot;
// Pure modules: built (and unit tested) on the host too, used on the target.
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod bootargs;
#[cfg(target_os = "none")]
mod console;
#[cfg(target_os = "none")]
mod control;
#[cfg(target_os = "none")]
mod dirty_log;
#[cfg(target_os = "none")]
mod echo;
#[cfg(target_os = "none")]
mod el0;
#[cfg(target_os = "none")]
mod exceptions;
#[cfg(target_os = "none")]
mod fuzz;
#[cfg(target_os = "none")]
mod fuzz_its;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod fuzz_model;
#[cfg(target_os = "none")]
mod fuzz_virtqueue;
#[cfg(target_os = "none")]
mod gic;
#[cfg(target_os = "none")]
mod gic_its;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod gic_regs;
#[cfg(target_os = "none")]
mod its;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod memory_map;
#[cfg(target_os = "none")]
mod memslot_perf;
#[cfg(target_os = "none")]
mod migrate;
#[cfg(target_os = "none")]
mod mmu;
#[cfg(target_os = "none")]
mod mte;
#[cfg(target_os = "none")]
mod page_table;
#[cfg(target_os = "none")]
mod platform;
#[cfg(target_os = "none")]
mod psci;
#[cfg(target_os = "none")]
mod scenarios;
#[cfg(target_os = "none")]
mod smp;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod timer_regs;
#[cfg(target_os = "none")]
mod timers;
#[cfg(target_os = "none")]
mod toucher;
#[cfg(target_os = "none")]
mod vector_regs;
#[cfg(target_os = "none")]
mod virtio;
#[cfg(target_os = "none")]
mod virtio_bad;
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
mod virtio_ring;

#[cfg(not(target_os = "none"))]
fn main() {
    println!(
        "test-guest: the bare-metal EL1 test guest of the hypervisor. Build it with \
         `--target aarch64-unknown-none-softfloat` (qemu-runner does) and boot it with \
         `cargo run -p qemu-runner`; on the host it does nothing else."
    );
}
