//! The `fuzz` scenario: a hostile guest driven by a seed.
//!
//! Every vCPU (secondaries started with PSCI `CPU_ON`) runs `ops` random
//! operations per seed, for `seeds` consecutive seeds from `seed`, all vCPUs
//! finishing a seed before any starts the next. Each operation is a few
//! instruction words the fuzzer writes at run time into its vCPU's code page
//! (cleaned to the point of unification, instruction cache invalidated, then
//! entered with `ERET`), so every access width, pair, exclusive, LSE atomic,
//! cache or address-translation operation, `MRS`/`MSR` of any encoding,
//! `HVC`/`SMC` with any immediate, and random instruction words are all run
//! the same way: registers loaded from a block, the words executed, a `B`
//! back to [`fuzz_return`], which restores the stack and callee-saved
//! registers. A synchronous exception taken in the code page is recorded
//! (vector, ESR, FAR) and the instruction skipped; one taken from EL0 (the
//! code page of the vCPU's EL0 window, AArch64 or, when the CPU has it,
//! AArch32) returns to [`fuzz_return`] at EL1.
//!
//! The operations and the answers checked (anything else is a violation,
//! printed with its seed, vCPU and operation number, and counted):
//! * RAM: store then load back every width, pairs, exclusives, acquire/
//!   release, LSE atomics and CAS (when `ID_AA64ISAR0_EL1.Atomic` says so) in
//!   the vCPU's scratch area: the values must match.
//! * Holes (no RAM, no device, up to the top of the 39-bit identity map but
//!   its last gigabyte, the device alias): loads, stores, pairs, exclusives
//!   and atomics must take a synchronous external data abort (EC 0x25, DFSC
//!   0x10) with FAR in the access and, for plain loads and stores, the right
//!   WnR.
//! * The PL011, distributor and redistributors at every offset and width
//!   (random values; the distributor's `CTLR` keeps group 1 enabled, writes
//!   only to the vCPU's own redistributor): the PL011 and GIC ID registers,
//!   `GICD_TYPER`, `GICR_TYPER` (affinity, processor number, `Last`), and the
//!   RAZ/WI registers of the GICv3 specification with affinity routing and a
//!   single security state (banked words of INTIDs 0..31 in the distributor,
//!   `ITARGETSR`, `IGRPMODR`, `NSACR`, `SGIR`, `C/SPENDSGIR`, reserved
//!   offsets, registers of SPIs beyond `ITLinesNumber`, the redistributor's
//!   `IGRPMODR0`/`NSACR`) must answer as the specification says.
//! * Straddles: 4-, 8- and 16-byte accesses at the last 2 bytes of the
//!   PL011, the distributor or a redistributor frame, through the device
//!   alias (Normal memory, so the unaligned access reaches the hypervisor):
//!   an external abort with FAR in the access and, for plain loads and
//!   stores, the right WnR (kinds that need alignment may take an alignment
//!   fault first).
//! * DC (CIVAC, CVAC, CVAU, IVAC, ZVA), IC IVAU and AT S1E1R/W, S1E0R/W on
//!   every kind of address: `DC ZVA` must zero its block in RAM, `AT` must
//!   agree with the identity map (in another vCPU's window, whose table may
//!   be in a hole, it may take an external abort: the stage-1 walk faults at
//!   stage 2).
//! * `HVC`/`SMC`: the SMCCC and PSCI calls the hypervisor implements with
//!   random arguments (`PSCI_FEATURES`, `AFFINITY_INFO` of bogus MPIDRs and
//!   levels, `CPU_ON` with a bogus target or entry), unknown ids (from a
//!   fixed pool, or any id) must answer `NOT_SUPPORTED`, and `x4..x17` must survive every call (SMCCC 1.1).
//!   `CPU_OFF`, `SYSTEM_OFF`, `SYSTEM_RESET(2)` and `TEST_REPORT` are never
//!   called by accident.
//! * `MRS` of random encodings (then `MSR` of the value read back): EL2/EL3
//!   registers must be UNDEFINED, reserved ID registers must read as zero,
//!   `ID_AA64PFR1_EL1` must show no MTE. Reads that acknowledge interrupts and
//!   the EL1 physical timer are left out unless allowed.
//! * SGIs with random targets and ranges through `ICC_SGI1R/ASGI1R/SGI0R_EL1`
//!   (GICv3; on a GICv2 `GICD_SGIR`, see below).
//! * Random instruction words at EL1 (no branches, system instructions, SVE
//!   or memory copy/set) with registers pointing at the scratch area, devices
//!   and holes, and at EL0 (no branches).
//! * EL0 loads and stores to an EL0 page whose IPA is a hole: an external
//!   data abort from the lower EL (EC 0x24) at that address with the right
//!   WnR.
//! * Through the vCPU's own level-1 window, retargeted per operation: the
//!   device gigabyte as Normal memory (unaligned, exclusive and atomic
//!   accesses reach the emulated devices; holes there must still abort at
//!   the VA), data accesses and instruction fetches to hole gigabytes and to
//!   IPAs above the VM's 40 bits (`TCR_EL1.IPS` is raised to the CPU's size),
//!   and table walks through tables in a device or a hole: each must take an
//!   external abort (data, or instruction EC 0x21) at the VA.
//! * Interrupt delivery: an SGI to itself or the virtual timer, with the
//!   GIC set up again first (its redistributor's configuration of the
//!   INTID; other interrupts left active and group 0 left as it is, as the
//!   default mix has `FuzzOptions::ALLOW_KEEP_ACTIVE` and
//!   `ALLOW_GROUP0_OFF`), must arrive within two seconds (one retry).
//! * Timers (`timers`): with IRQs masked, both EL1 timers (the physical one
//!   only with `ptimer`) armed to fire at once, soon or later, some with
//!   `IMASK`, left to fire for up to 300 us, then each disabled, masked,
//!   pushed a second ahead, re-armed or left, in a random order, sometimes
//!   followed by a hypercall; then IRQs unmasked for 300 us. A timer
//!   interrupt taken while its timer does not assert it (`CTL` not ENABLE
//!   and ISTATUS without IMASK) is a violation: always for the physical
//!   timer, whose registers trap, and for the virtual timer when an exit
//!   (the hypercall, a physical timer access) came after its last write (its
//!   registers do not trap: the hypervisor re-samples its line at exits).
//! * The GIC CPU interface (`icc`): two to five random accesses among
//!   `ICC_BPR0/1_EL1` (any 3-bit value), `ICC_CTLR_EL1.CBPR`, `ICC_PMR_EL1`
//!   (must read back as written, less the unimplemented priority bits),
//!   `ICC_IGRPEN0/1_EL1`, an `ICC_IAR1_EL1` read completed by
//!   `ICC_EOIR1_EL1`, and reads of `RPR`/`HPPIR1`/`BPR`/`CTLR`; with
//!   `icc-wide`, binary point values with bits above the field.
//!
//! * The virtio-console (`virtqueue`, boot vCPU only, not in the default
//!   mix: the VM needs `console=virtio`): random chains, broken chains,
//!   rings in device memory, register abuse, notify storms and resets in
//!   the middle of a request, checked against what the device must do
//!   (see `fuzz_virtqueue`); its `VQ` lines are checked by the campaign.
//! * The ITS (`its`, GICv3 with an ITS in the device tree; one operation
//!   in 16, or every one with `its-only`, not in the default mix): vCPU 0
//!   sends random ITS command batches, `GITS_TRANSLATER` writes and
//!   property-table changes, the others add `GITS_*` noise that cannot
//!   change a mapping. Checked against a model of the mappings (see
//!   `fuzz_its`): every batch completes, `GITS_TYPER`/`PIDR2` stay, and
//!   the LPIs vCPU 0 takes are exactly those the model has pending,
//!   enabled and targeted there (none with `ICC_PMR_EL1` at 0).
//!   Deliveries on the other vCPUs are counted, not checked. Prints
//!   `FUZZ: its lpis=L vcpu0=C required=R`.
//!
//! On a GICv2 host the VM has a GICv2: the distributor emulated by the
//! hypervisor, whose registers of INTIDs 0..31 are banked per vCPU, and the
//! `GICC` window, the hardware's virtual CPU interface (`GICV`) mapped at
//! stage 2, which no access traps. The families adapt (the rest run as
//! above):
//! * Devices: the PL011, the distributor and `GICC` (no redistributors).
//!   The distributor's checks follow the GICv2 specification without
//!   security extensions: `ICPIDR2.ArchRev` 2, `GICD_TYPER` (`CPUNumber`
//!   the vCPUs less one, no `SecurityExtn`), `ITARGETSR0..7` reading as the
//!   vCPU's own bit, `ICFGR0` all edge, the reserved bit of every other
//!   `ICFGR` field and the timer PPIs' edge bits zero, `NSACR`, reserved
//!   offsets, the window past the 4 KiB distributor and the registers of
//!   unimplemented SPIs RAZ/WI. `GICC`: reads of every register without a
//!   side effect (never `GICC_IAR`/`AIAR`) must not abort; writes only to
//!   `PMR`, `BPR`, `ABPR` and `CTLR` (group enables and `CBPR`; `AckCtl`
//!   kept, `FIQEn` and `EOImode` clear, so the handler still acknowledges
//!   every interrupt through `GICC_IAR` and `GICC_EOIR` deactivates);
//!   `GICC_IIDR` must give architecture version 2. Straddles: the PL011 and
//!   the end of the distributor (whose next bytes are `GICC`'s).
//! * `icc` / `icc-wide` work on `GICC` (see [`Ctx::gicc_family`]).
//! * SGIs go through `GICD_SGIR` (any target filter, the reserved one
//!   included); the `ICC_*` system registers do not exist
//!   (`ID_AA64PFR0_EL1.GIC` is 0), so every `MRS`/`MSR` of their encodings,
//!   `ICC_SRE_EL1` and the SGI registers included, must be UNDEFINED.
//! * Interrupt delivery and `timers` set up the banked distributor words and
//!   `GICC` instead of a redistributor and the `ICC` registers;
//!   `gic-active`, `keep-active` and `group0-off` keep their meaning
//!   (group 0 is `GICC_CTLR.EnableGrp0`).
//!
//! Not in the default mix, `gicv2-sgi-pend` checks that writes of an SGI's
//! bit in `GICD_ISPENDR0`/`ICPENDR0` change nothing (WI on a GICv2, see
//! [`Ctx::gicv2_sgi_pend`]). Its check is exact only with one vCPU (another
//! could send the SGI meanwhile), so the default mix leaves those bits
//! unchecked.
//!
//! Left out on a GICv2, having no GICv2 meaning: redistributors
//! (`GICR_TYPER`, `WAKER`, their RAZ/WI registers), affinity routing
//! (`IROUTER` offsets are only checked as RAZ/WI), `IGRPMODR`, group-0 and
//! alias SGIs through system registers, `GICC_DIR` writes (`EOImode`
//! stays 0). Also left out: instruction fetches and table walks through
//! `GICC` (a fetch from a Device mapping is CONSTRAINED UNPREDICTABLE; a
//! walk would read `GICC_IAR`) and straddles at its end (what lies past
//! QEMU's `GICV` registers is QEMU's, not the hypervisor's).
//!
//! At the end the boot vCPU restores the PL011, prints
//! `FUZZ: seeds=K ops=N violations=V` and passes only without violations.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::boot::MAX_CPUS;
use crate::bootargs::{FuzzOptions, Scenario};
use crate::exceptions;
use crate::exceptions::ExceptionFrame;
use crate::fuzz_its::{self, ItsFuzz};
use crate::fuzz_model::{
    self, ICC_SGI1R_EL1, ID_AA64PFR1_EL1, IMPLEMENTED, Layout, NOT_SUPPORTED, Region, Rng,
    SAFE_IMPLEMENTED, SysReg, UNKNOWN_POOL,
};
use crate::fuzz_virtqueue::{self, VirtqueueFuzz};
use crate::gic::{self, Bank, GicError};
use crate::gic_regs;
use crate::gic_regs::{
    GICC_BPR, GICC_CTLR, GICC_CTLR_ACK_CTL, GICC_CTLR_ENABLE_GRP0, GICC_CTLR_ENABLE_GRP1,
    GICC_EOIR, GICC_IAR, GICC_PMR, GICD_CTLR, GICD_CTLR_ARE, GICD_CTLR_ENABLE_GRP0,
    GICD_CTLR_ENABLE_GRP1, GICD_SGIR, GICR_WAKER, ICACTIVER, ICENABLER, ICPENDR, ISENABLER,
    PRIORITY,
};
use crate::platform::Platform;
use crate::println;
use crate::scenarios::Failure;
use crate::smp::{self, Deadline};

/// Most vCPUs that fuzz (the others are not started).
pub const FUZZ_CPUS: usize = 8;
const PAGE: usize = 4096;
/// Scratch area of each vCPU; registers and the stack point at its middle,
/// and every immediate offset of a load or store (at most 65520 bytes up,
/// 1024 down) stays inside it.
const SCRATCH_SIZE: usize = 0x2_1000;
const SCRATCH_MIDDLE: u64 = 0x1_0000;
/// Where RAM operations store (below the middle, above the stack's reach of
/// the exception frames the handler pushes).
const RAM_TARGET: u64 = 0x1000;
/// Virtual window of the EL0 pages (one gigabyte, outside every IPA the
/// fuzzer calls a hole): per vCPU a code page and a data page.
const EL0_WINDOW: u64 = 0xc000_0000;
const EL0_WINDOW_INDEX: usize = 3;
/// Level-3 index (in the EL0 window) of vCPU 0's EL0 page whose IPA is a
/// hole, and that IPA (nothing lives at 0x0b00_0000 in the guest's map; the
/// virtio-mmio windows start at 0x0a00_0000).
const EL0_HOLE_INDEX: usize = 64;
const EL0_HOLE_IPA: u64 = 0x0b00_0000;
/// Level-1 index of vCPU 0's window: one gigabyte of virtual addresses per
/// vCPU that an operation points anywhere (a hole or device gigabyte as
/// Normal executable memory, an IPA beyond the VM's 40 bits, or a table in a
/// hole or a device).
const WINDOW_INDEX: usize = 4;

const _: () = assert!(fuzz_model::DEVICE_ALIAS == crate::mmu::DEVICE_ALIAS_BASE);
/// IPA bits of every VM (the hypervisor's `IPA_BITS`): above them is a hole.
const VM_IPA_BITS: u64 = 40;

/// GICv2 CPU interface registers (offsets in `GICC`) besides the driver's.
const GICC_RPR: u64 = 0x14;
const GICC_HPPIR: u64 = 0x18;
const GICC_ABPR: u64 = 0x1c;
const GICC_APR0: u64 = 0xd0;
const GICC_IIDR: u64 = 0xfc;
/// `GICC_CTLR.CBPR`: `GICC_BPR` serves both groups.
const GICC_CTLR_CBPR: u32 = 1 << 4;
/// `GICC` offsets a read of which has no side effect: every register of the
/// first page but `GICC_IAR` and `GICC_AIAR` (which acknowledge), and the
/// active-priority and ID registers.
const GICC_READABLE: [u64; 16] = [
    0x00, 0x04, 0x08, 0x14, 0x18, 0x1c, 0x28, 0xd0, 0xd4, 0xd8, 0xdc, 0xe0, 0xe4, 0xe8, 0xec, 0xfc,
];

/// Exception vectors the hook handles.
const VECTOR_SYNC_EL1: u64 = 4;
const VECTOR_FIQ_EL1: u64 = 6;
const VECTOR_SYNC_EL0_64: u64 = 8;
const VECTOR_SYNC_EL0_32: u64 = 12;

/// `SPSR_EL1` values: EL1h and EL0t (AArch64), AArch32 User, all with
/// D, A, I and F masked.
const SPSR_EL1H: u64 = 0x3c5;
const SPSR_EL0T: u64 = 0x3c0;
const SPSR_USR32: u64 = 0x1d0;

const EC_UNKNOWN: u64 = 0x00;
const EC_DATA_ABORT_EL1: u64 = 0x25;
const EC_DATA_ABORT_EL0: u64 = 0x24;
const EC_INSTRUCTION_ABORT_EL1: u64 = 0x21;
const DFSC_EXTERNAL: u64 = 0x10;
const DFSC_ALIGNMENT: u64 = 0x21;

/// `NOP`.
const NOP: u32 = 0xd503_201f;
/// Virtual timer PPI.
const TIMER_INTID: u32 = 27;
/// EL1 physical timer PPI.
const PTIMER_INTID: u32 = 30;
/// `TIMER_WATCH` bits: the timers family runs on this vCPU; a physical or
/// virtual timer interrupt taken with its line low is stale.
const WATCH_ACTIVE: u32 = 1 << 0;
const WATCH_PHYSICAL: u32 = 1 << 1;
const WATCH_VIRTUAL: u32 = 1 << 2;

#[repr(C, align(4096))]
struct Pages<const N: usize>([[u8; PAGE]; N]);

#[repr(C, align(4096))]
struct Scratch([[u8; SCRATCH_SIZE]; FUZZ_CPUS]);

#[repr(C, align(4096))]
struct Table([u64; 512]);

/// EL1 code pages, one per vCPU.
static mut CODE: Pages<FUZZ_CPUS> = Pages([[0; PAGE]; FUZZ_CPUS]);
/// EL0 pages: code then data, per vCPU.
static mut EL0_PAGES: Pages<{ 2 * FUZZ_CPUS }> = Pages([[0; PAGE]; 2 * FUZZ_CPUS]);
static mut SCRATCH: Scratch = Scratch([[0; SCRATCH_SIZE]; FUZZ_CPUS]);
static mut EL0_L2: Table = Table([0; 512]);
static mut EL0_L3: Table = Table([0; 512]);

/// Stack pointer of each vCPU while it runs fuzzed code (read by
/// `fuzz_return`, indexed by `TPIDR_EL1`).
#[unsafe(no_mangle)]
static FUZZ_SAVED_SP: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Registers loaded before the code page runs: `x0..x30`, `SP_EL1`, `SP_EL0`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RegBlock {
    x: [u64; 31],
    sp: u64,
    sp_el0: u64,
}

global_asm!(
    r#"
    .section .text.fuzz, "ax"
    .global fuzz_exec
// x0: register block, x1: entry, x2: SPSR. Returns through fuzz_return.
fuzz_exec:
    sub     sp, sp, #96
    stp     x19, x20, [sp, #0]
    stp     x21, x22, [sp, #16]
    stp     x23, x24, [sp, #32]
    stp     x25, x26, [sp, #48]
    stp     x27, x28, [sp, #64]
    stp     x29, x30, [sp, #80]
    mrs     x3, tpidr_el1
    adrp    x4, FUZZ_SAVED_SP
    add     x4, x4, :lo12:FUZZ_SAVED_SP
    mov     x5, sp
    str     x5, [x4, x3, lsl #3]
    msr     elr_el1, x1
    msr     spsr_el1, x2
    ldr     x1, [x0, #256]
    msr     sp_el0, x1
    ldr     x1, [x0, #248]
    mov     sp, x1
    ldp     x2, x3, [x0, #16]
    ldp     x4, x5, [x0, #32]
    ldp     x6, x7, [x0, #48]
    ldp     x8, x9, [x0, #64]
    ldp     x10, x11, [x0, #80]
    ldp     x12, x13, [x0, #96]
    ldp     x14, x15, [x0, #112]
    ldp     x16, x17, [x0, #128]
    ldp     x18, x19, [x0, #144]
    ldp     x20, x21, [x0, #160]
    ldp     x22, x23, [x0, #176]
    ldp     x24, x25, [x0, #192]
    ldp     x26, x27, [x0, #208]
    ldp     x28, x29, [x0, #224]
    ldr     x30, [x0, #240]
    ldp     x0, x1, [x0, #0]
    eret

    .global fuzz_return
fuzz_return:
    mrs     x0, tpidr_el1
    adrp    x1, FUZZ_SAVED_SP
    add     x1, x1, :lo12:FUZZ_SAVED_SP
    ldr     x1, [x1, x0, lsl #3]
    mov     sp, x1
    ldp     x19, x20, [sp, #0]
    ldp     x21, x22, [sp, #16]
    ldp     x23, x24, [sp, #32]
    ldp     x25, x26, [sp, #48]
    ldp     x27, x28, [sp, #64]
    ldp     x29, x30, [sp, #80]
    add     sp, sp, #96
    ret
"#
);

unsafe extern "C" {
    fn fuzz_exec(block: *const RegBlock, entry: u64, spsr: u64);
    fn fuzz_return();
}

/// Whether the hook handles exceptions (set while the scenario runs).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Per vCPU: an instruction abort at EL1 outside the code page returns to
/// `x30` (an operation branched into its window).
static FETCH_ARMED: [AtomicBool; FUZZ_CPUS] = [const { AtomicBool::new(false) }; FUZZ_CPUS];
/// Output address bits the fuzzer's stage 1 uses (`TCR_EL1.IPS`).
static OA_BITS: AtomicU64 = AtomicU64::new(40);
/// Per vCPU: running EL0 code now.
static IN_EL0: [AtomicBool; FUZZ_CPUS] = [const { AtomicBool::new(false) }; FUZZ_CPUS];
/// Per vCPU: exceptions taken by the current operation, and the first two.
static TAKEN: [AtomicU32; FUZZ_CPUS] = [const { AtomicU32::new(0) }; FUZZ_CPUS];
static TAKEN_ESR: [[AtomicU64; 2]; FUZZ_CPUS] =
    [const { [const { AtomicU64::new(0) }; 2] }; FUZZ_CPUS];
static TAKEN_FAR: [[AtomicU64; 2]; FUZZ_CPUS] =
    [const { [const { AtomicU64::new(0) }; 2] }; FUZZ_CPUS];
/// Per vCPU and private INTID: interrupts taken. `OTHER_IRQS`: SPIs.
static IRQS: [[AtomicU32; 32]; FUZZ_CPUS] =
    [const { [const { AtomicU32::new(0) }; 32] }; FUZZ_CPUS];
static OTHER_IRQS: AtomicU64 = AtomicU64::new(0);
/// What the timers family watches on each vCPU (`WATCH_*` bits).
static TIMER_WATCH: [AtomicU32; FUZZ_CPUS] = [const { AtomicU32::new(0) }; FUZZ_CPUS];
/// A stale timer interrupt the handler saw: `intid << 32 | CTL`, 0 if none.
static STALE_TIMER: [AtomicU64; FUZZ_CPUS] = [const { AtomicU64::new(0) }; FUZZ_CPUS];

/// What the run found, per vCPU.
static OPS: [AtomicU64; FUZZ_CPUS] = [const { AtomicU64::new(0) }; FUZZ_CPUS];
static VIOLATIONS: [AtomicU64; FUZZ_CPUS] = [const { AtomicU64::new(0) }; FUZZ_CPUS];
static SEEDS_DONE: AtomicUsize = AtomicUsize::new(0);
static WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Shared settings, written by the boot vCPU before the secondaries start.
static SETTINGS: Settings = Settings {
    seed: AtomicU64::new(0),
    seeds: AtomicU64::new(0),
    ops: AtomicU64::new(0),
    allow: AtomicU32::new(0),
    verbose: AtomicBool::new(false),
    ram_start: AtomicU64::new(0),
    ram_end: AtomicU64::new(0),
    uart: AtomicU64::new(0),
    gicd: AtomicU64::new(0),
    gicr: AtomicU64::new(0),
    gicc: AtomicU64::new(0),
    its: AtomicU64::new(0),
    its_family: AtomicBool::new(false),
    gic_sysregs: AtomicBool::new(false),
    vcpus: AtomicU64::new(0),
    lse: AtomicBool::new(false),
    el0_aarch32: AtomicBool::new(false),
    gicd_typer: AtomicU64::new(0),
    dczid: AtomicU64::new(0),
    virtio_start: AtomicU64::new(0),
    virtio_end: AtomicU64::new(0),
    virtio_console: AtomicU64::new(0),
};

static MPIDRS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

struct Settings {
    seed: AtomicU64,
    seeds: AtomicU64,
    ops: AtomicU64,
    allow: AtomicU32,
    verbose: AtomicBool,
    ram_start: AtomicU64,
    ram_end: AtomicU64,
    uart: AtomicU64,
    gicd: AtomicU64,
    gicr: AtomicU64,
    /// A GICv2's CPU interface (0: GICv3).
    gicc: AtomicU64,
    /// The ITS the device tree names (0: none).
    its: AtomicU64,
    /// The `its` family is set up (the others add noise).
    its_family: AtomicBool,
    /// `ID_AA64PFR0_EL1.GIC` is not 0: the GICv3 system registers exist.
    gic_sysregs: AtomicBool,
    vcpus: AtomicU64,
    lse: AtomicBool,
    el0_aarch32: AtomicBool,
    gicd_typer: AtomicU64,
    dczid: AtomicU64,
    /// The virtio-mmio windows (empty: none).
    virtio_start: AtomicU64,
    virtio_end: AtomicU64,
    /// The virtio-console the `virtqueue` family drives (0: not allowed).
    virtio_console: AtomicU64,
}

macro_rules! read_sysreg {
    ($name:literal) => {{
        let value: u64;
        // SAFETY: reading this system register has no side effect the guest
        // depends on.
        unsafe { asm!(concat!("mrs {}, ", $name), out(reg) value, options(nomem, nostack)) };
        value
    }};
}

macro_rules! write_sysreg {
    ($name:literal, $value:expr) => {{
        let value: u64 = $value;
        // SAFETY: the callers write GIC CPU-interface, timer and CPACR
        // settings of this vCPU only; none of them moves memory.
        unsafe { asm!(concat!("msr ", $name, ", {}"), "isb", in(reg) value, options(nostack)) };
    }};
}

/// One vCPU's view while it fuzzes.
struct Ctx {
    cpu: usize,
    layout: Layout,
    allow: u32,
    /// Print a progress line before every operation.
    verbose: bool,
    lse: bool,
    el0_aarch32: bool,
    /// The GICv3 CPU interface's system registers exist.
    gic_sysregs: bool,
    seed: u64,
    op: u64,
    rng: Rng,
    scratch: u64,
    code: u64,
    el0_code_va: u64,
    el0_data_va: u64,
    el0_code: u64,
    /// What the current operation does, for violation reports.
    note: &'static str,
    /// The `virtqueue` family (boot vCPU, when allowed).
    virtqueue: Option<VirtqueueFuzz>,
    /// The `its` family (boot vCPU, when allowed and set up).
    its: Option<ItsFuzz>,
    /// The ITS base the other vCPUs add noise to (0: family off).
    its_base: u64,
}

/// The exceptions an executed sequence took.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    taken: u32,
    esr: u64,
    far: u64,
    /// `x0..x17` after the words ran (EL1 sequences with the result
    /// epilogue only).
    out: [u64; 18],
}

impl Outcome {
    fn class(&self) -> u64 {
        (self.esr >> 26) & 0x3f
    }
    fn is_external_abort(&self) -> bool {
        self.taken >= 1 && self.class() == EC_DATA_ABORT_EL1 && self.esr & 0x3f == DFSC_EXTERNAL
    }
    fn is_undef(&self) -> bool {
        self.taken >= 1 && self.class() == EC_UNKNOWN
    }
}

/// Called first by the guest's exception handler; true when it handled the
/// exception.
pub fn handle(vector: u64, esr: u64, far: u64, frame: &mut ExceptionFrame) -> bool {
    if !ACTIVE.load(Ordering::Relaxed) {
        return false;
    }
    let cpu = smp::current_cpu();
    if cpu >= FUZZ_CPUS {
        return false;
    }
    match vector {
        VECTOR_FIQ_EL1 => {
            take_fiq(cpu);
            true
        }
        VECTOR_SYNC_EL1 => {
            let code = code_page(cpu);
            if !(code..code + PAGE as u64).contains(&frame.elr) {
                if (esr >> 26) & 0x3f == EC_INSTRUCTION_ABORT_EL1
                    && FETCH_ARMED[cpu].swap(false, Ordering::Relaxed)
                {
                    record(cpu, esr, far);
                    frame.elr = frame.x[30];
                    return true;
                }
                return false;
            }
            record(cpu, esr, far);
            frame.elr += 4;
            true
        }
        VECTOR_SYNC_EL0_64 | VECTOR_SYNC_EL0_32 if IN_EL0[cpu].load(Ordering::Relaxed) => {
            record(cpu, esr, far);
            frame.elr = fuzz_return as *const () as u64;
            frame.spsr = SPSR_EL1H;
            true
        }
        _ => false,
    }
}

fn record(cpu: usize, esr: u64, far: u64) {
    let n = TAKEN[cpu].fetch_add(1, Ordering::Relaxed) as usize;
    if n < 2 {
        TAKEN_ESR[cpu][n].store(esr, Ordering::Relaxed);
        TAKEN_FAR[cpu][n].store(far, Ordering::Relaxed);
    }
}

/// The fuzz scenario's IRQ handler (through [`gic::take_interrupts`], which
/// acknowledges and completes): counts `intid` and silences its source.
pub fn interrupt(intid: u32) {
    let cpu = smp::current_cpu();
    if cpu >= FUZZ_CPUS {
        return;
    }
    count_and_silence(cpu, intid);
}

/// Counts `intid` on `cpu` and silences its source: the virtual timer is
/// turned off, any other interrupt disabled (random GIC writes may have
/// enabled and pended it).
fn count_and_silence(cpu: usize, intid: u32) {
    if intid >= gic_its_lpi_base() {
        // An LPI: edge-triggered, nothing to silence.
        fuzz_its::count(cpu, intid);
        return;
    }
    if intid < 32 {
        IRQS[cpu][intid as usize].fetch_add(1, Ordering::Relaxed);
    } else {
        OTHER_IRQS.fetch_add(1, Ordering::Relaxed);
    }
    let watch = TIMER_WATCH[cpu].load(Ordering::Relaxed);
    if intid == TIMER_INTID || intid == PTIMER_INTID {
        let (ctl, bit) = if intid == PTIMER_INTID {
            (read_sysreg!("cntp_ctl_el0"), WATCH_PHYSICAL)
        } else {
            (read_sysreg!("cntv_ctl_el0"), WATCH_VIRTUAL)
        };
        // ENABLE and ISTATUS set, IMASK clear: the line is high.
        if watch & bit != 0 && ctl & 0b111 != 0b101 {
            STALE_TIMER[cpu].store(u64::from(intid) << 32 | ctl, Ordering::Relaxed);
        }
    }
    if intid == TIMER_INTID {
        write_sysreg!("cntv_ctl_el0", 0);
    } else if intid == PTIMER_INTID && watch & WATCH_ACTIVE != 0 {
        write_sysreg!("cntp_ctl_el0", 0);
    } else if intid < 32 {
        gic::write_bits(Bank::Redistributor(cpu), ICENABLER, intid, 1 << intid);
    } else {
        gic::write_bits(Bank::Distributor, ICENABLER, intid, 1 << (intid % 32));
    }
}

fn gic_its_lpi_base() -> u32 {
    crate::gic_its::LPI_BASE
}

/// Acknowledges, counts, silences the source of and completes one group-0
/// interrupt (FIQ; the shared GIC driver only takes group 1).
fn take_fiq(cpu: usize) {
    if gic::gicv2_cpu_interface().is_some() {
        // GICv2: group 0 is signalled as IRQ (`GICC_CTLR.FIQEn` stays 0);
        // take one anyway through `GICC_IAR`.
        let acknowledged = gic::acknowledge();
        let intid = gic::interrupt_id(acknowledged);
        if gic::is_interrupt(intid) {
            count_and_silence(cpu, intid);
            gic::end_of_interrupt(acknowledged);
        }
        return;
    }
    let intid = (read_sysreg!("icc_iar0_el1") & 0xff_ffff) as u32;
    if !gic::is_interrupt(intid) {
        return;
    }
    count_and_silence(cpu, intid);
    write_sysreg!("icc_eoir0_el1", u64::from(intid));
}

/// A 32-bit store to a GIC register, always a plain `STR` (an access with
/// base writeback has no instruction syndrome and cannot be emulated).
fn mmio_write32(address: u64, value: u32) {
    // SAFETY: the GIC registers the fuzzer configures, mapped as device
    // memory; the write only changes interrupt state.
    unsafe { asm!("str {v:w}, [{a}]", a = in(reg) address, v = in(reg) value, options(nostack)) };
}

/// A 32-bit load from a GIC register, always a plain `LDR`.
fn mmio_read32(address: u64) -> u32 {
    let value: u32;
    // SAFETY: as above; GIC reads have no side effects.
    unsafe { asm!("ldr {v:w}, [{a}]", a = in(reg) address, v = out(reg) value, options(nostack)) };
    value
}

fn code_page(cpu: usize) -> u64 {
    (&raw const CODE) as u64 + (cpu * PAGE) as u64
}

fn el0_page(index: usize) -> u64 {
    (&raw const EL0_PAGES) as u64 + (index * PAGE) as u64
}

/// Writes `words` at `at` and makes them visible to instruction fetch.
fn write_code(at: u64, words: &[u32]) {
    for (i, &word) in words.iter().enumerate() {
        // SAFETY: `at` is this vCPU's own code page (EL1 or EL0), which only
        // it writes and runs; `words` fits in it.
        unsafe { core::ptr::write_volatile((at + 4 * i as u64) as *mut u32, word) };
    }
    let end = at + 4 * words.len() as u64;
    let mut line = at & !15;
    while line < end {
        // SAFETY: cache maintenance of the code page by address changes no
        // data.
        unsafe { asm!("dc cvau, {}", in(reg) line, options(nostack)) };
        line += 16;
    }
    // SAFETY: barriers and a local instruction-cache invalidation.
    unsafe { asm!("dsb ish", "ic iallu", "dsb ish", "isb", options(nostack)) };
}

impl Ctx {
    fn violation(&mut self, what: &str, a: u64, b: u64) {
        let n = VIOLATIONS[self.cpu].fetch_add(1, Ordering::Relaxed);
        if n < 8 {
            println!(
                "FUZZ: violation seed={} vcpu={} op={} ({}): {what} ({a:#x}, {b:#x})",
                self.seed, self.cpu, self.op, self.note
            );
        }
    }

    fn allows(&self, bit: u32) -> bool {
        self.allow & bit != 0
    }

    /// Registers for explicit operations: `x0..x7` point into the scratch
    /// area, `x4..x17` carry a pattern the SMCCC check compares.
    fn block(&self) -> RegBlock {
        let middle = self.scratch + SCRATCH_MIDDLE;
        let mut x = [0u64; 31];
        for (i, r) in x.iter_mut().enumerate() {
            *r = 0x5a5a_0000_0000_0000 | (i as u64) << 8;
        }
        x[29] = middle;
        x[30] = middle;
        RegBlock {
            x,
            sp: middle,
            sp_el0: 0,
        }
    }

    /// Runs `words` at EL1 followed by the epilogue that stores `x0..x17`
    /// below the stack pointer, and returns what happened.
    fn run(&mut self, words: &[u32], block: &RegBlock) -> Outcome {
        let mut page = [0u32; 24];
        let n = words.len();
        page[..n].copy_from_slice(words);
        // stp x0, x1, [sp, #-144] ... stp x16, x17, [sp, #-16]
        for pair in 0..9u32 {
            let offset = (-(144i32) + 16 * pair as i32) / 8;
            page[n + pair as usize] = 0xa900_0000
                | ((offset as u32 & 0x7f) << 15)
                | ((2 * pair + 1) << 10)
                | (31 << 5)
                | (2 * pair);
        }
        let back = self.code + 4 * (n as u64 + 9);
        page[n + 9] = fuzz_model::branch(back, fuzz_return as *const () as u64);
        write_code(self.code, &page[..n + 10]);
        let outcome = self.enter(self.code, SPSR_EL1H, block);
        let mut out = [0u64; 18];
        let base = block.sp - 144;
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: the epilogue just wrote these 18 words in the scratch
            // area below the block's stack pointer.
            *o = unsafe { core::ptr::read_volatile((base + 8 * i as u64) as *const u64) };
        }
        Outcome { out, ..outcome }
    }

    /// The `its` family: on vCPU 0 one operation (or, with `reset`, the
    /// family's set-up of a seed); elsewhere noise (see `fuzz_its`).
    fn its_op(&mut self, reset: bool) {
        let Some(mut family) = self.its.take() else {
            if !reset {
                fuzz_its::noise(&mut self.rng, self.its_base);
            }
            return;
        };
        let mut rng = self.rng.clone();
        let outcome = {
            let mut open = || self.cpu_interface_on();
            if reset {
                family.reset(&mut rng, &mut open)
            } else {
                family.op(&mut rng, &mut open)
            }
        };
        self.rng = rng;
        self.its = Some(family);
        if let Err((what, a, b)) = outcome {
            self.violation(what, a, b);
        }
    }

    /// Runs one random word at EL1 with no epilogue (it may move the stack).
    fn run_bare(&mut self, word: u32, block: &RegBlock) -> Outcome {
        let back = fuzz_model::branch(self.code + 4, fuzz_return as *const () as u64);
        write_code(self.code, &[word, back]);
        self.enter(self.code, SPSR_EL1H, block)
    }

    fn enter(&mut self, entry: u64, spsr: u64, block: &RegBlock) -> Outcome {
        TAKEN[self.cpu].store(0, Ordering::Relaxed);
        let el0 = spsr & 0xf == 0 || spsr & 0x10 != 0;
        IN_EL0[self.cpu].store(el0, Ordering::Relaxed);
        // SAFETY: the code at `entry` is this vCPU's code page, just written:
        // the words end in a branch to `fuzz_return` (or an SVC from EL0,
        // which the hook turns into a return there); every exception they
        // take in between is recorded and skipped by the hook. `block` sets
        // registers that point only at the scratch area, devices, holes or
        // the EL0 pages, so the words cannot reach the guest's own memory.
        unsafe { fuzz_exec(block, entry, spsr) };
        IN_EL0[self.cpu].store(false, Ordering::Relaxed);
        let taken = TAKEN[self.cpu].load(Ordering::Relaxed);
        Outcome {
            taken,
            esr: TAKEN_ESR[self.cpu][0].load(Ordering::Relaxed),
            far: TAKEN_FAR[self.cpu][0].load(Ordering::Relaxed),
            out: [0; 18],
        }
    }

    /// One random operation.
    fn step(&mut self) {
        // Only when the family is on, so that other seeds replay as before.
        if self.virtqueue.is_some() && self.rng.one_in(4) {
            self.note = "virtqueue";
            if self.verbose {
                println!(
                    "FUZZ: seed={} vcpu={} op={} (virtqueue)",
                    self.seed, self.cpu, self.op
                );
            }
            if let Some(mut family) = self.virtqueue.take() {
                let outcome = family.op(&mut self.rng, self.seed, self.op);
                self.virtqueue = Some(family);
                if let Err((what, a, b)) = outcome {
                    self.violation(what, a, b);
                }
            }
            return;
        }
        // Only when the family is on, so that other seeds replay as before.
        if self.its_base != 0 && (self.allows(FuzzOptions::ALLOW_ITS_ONLY) || self.rng.one_in(16)) {
            self.note = "its";
            if self.verbose {
                println!(
                    "FUZZ: seed={} vcpu={} op={} (its)",
                    self.seed, self.cpu, self.op
                );
            }
            return self.its_op(false);
        }
        let (note, op): (&'static str, fn(&mut Ctx)) = match self.rng.below(100) {
            0..10 => ("ram", Ctx::ram_op),
            10..22 => ("hole", Ctx::hole_op),
            22..44 => ("device", Ctx::device_op),
            44..50 => ("cache/at", Ctx::cache_op),
            50..60 => ("call", Ctx::call_op),
            60..74 => ("sysreg", Ctx::sysreg_op),
            74..77 => ("sgi", Ctx::sgi_op),
            77..86 => ("random EL1 word", Ctx::random_el1),
            86..90 => ("window", Ctx::window_op),
            90..96 => ("EL0", Ctx::el0_op),
            96..98 => ("interrupt", Ctx::interrupt_op),
            98 => ("timers", Ctx::timer_op),
            _ => ("icc", Ctx::icc_op),
        };
        self.note = note;
        if self.verbose {
            println!(
                "FUZZ: seed={} vcpu={} op={} ({note})",
                self.seed, self.cpu, self.op
            );
        }
        op(self);
    }

    /// A memory instruction on `[x2]` with `x0`, `x1`, `x3` as data: the
    /// kind, its size and whether it writes.
    fn memory_words(&mut self, size: u32) -> ([u32; 1], &'static str, bool) {
        let kinds: &[&str] = if self.lse {
            &[
                "ldr", "str", "ldp", "stp", "ldxr", "stxr", "ldar", "stlr", "ldadd", "swp", "cas",
            ]
        } else {
            &["ldr", "str", "ldp", "stp", "ldxr", "stxr", "ldar", "stlr"]
        };
        let kind = self.rng.pick(kinds);
        let word = match kind {
            "ldr" => fuzz_model::ldst(true, size, 0, 2),
            "str" => fuzz_model::ldst(false, size, 0, 2),
            "ldp" => fuzz_model::pair(true, size == 3, 0, 1, 2),
            "stp" => fuzz_model::pair(false, size == 3, 0, 1, 2),
            "ldxr" => fuzz_model::ldxr(size, 0, 2),
            "stxr" => fuzz_model::stxr(size, 1, 0, 2),
            "ldar" => fuzz_model::acquire_release(true, size, 0, 2),
            "stlr" => fuzz_model::acquire_release(false, size, 0, 2),
            "ldadd" => fuzz_model::lse(self.rng.below(8) as u32, size, 3, 0, 2),
            "swp" => fuzz_model::lse(8, size, 3, 0, 2),
            _ => fuzz_model::cas(size, 0, 3, 2),
        };
        let writes = !matches!(kind, "ldr" | "ldp" | "ldxr" | "ldar");
        self.note = kind;
        ([word], kind, writes)
    }

    fn ram_op(&mut self) {
        let size = self.rng.pick(&fuzz_model::SIZES);
        let bytes = 1u64 << size;
        let target = self.scratch + RAM_TARGET + self.rng.below(0x800) * 8;
        let value = self.rng.next();
        let mask = if size == 3 {
            u64::MAX
        } else {
            (1 << (8 * bytes)) - 1
        };
        let mut block = self.block();
        block.x[2] = target;
        block.x[0] = value;
        block.x[1] = !value;
        block.x[3] = value.rotate_left(17);
        let kind = self.rng.below(if self.lse { 5 } else { 4 });
        let words: [u32; 3] = match kind {
            0 => [
                fuzz_model::ldst(false, size, 0, 2),
                fuzz_model::ldst(true, size, 1, 2),
                NOP,
            ],
            1 => [
                fuzz_model::pair(false, true, 0, 1, 2),
                fuzz_model::pair(true, true, 3, 4, 2),
                NOP,
            ],
            2 => [
                fuzz_model::ldxr(size, 5, 2),
                fuzz_model::stxr(size, 4, 0, 2),
                fuzz_model::ldst(true, size, 1, 2),
            ],
            3 => [
                fuzz_model::acquire_release(false, size, 0, 2),
                fuzz_model::acquire_release(true, size, 1, 2),
                NOP,
            ],
            _ => [
                fuzz_model::lse(8, size, 0, 1, 2),
                fuzz_model::ldst(true, size, 4, 2),
                NOP,
            ],
        };
        let outcome = self.run(&words, &block);
        if outcome.taken != 0 {
            self.violation("exception on a RAM access", outcome.esr, target);
            return;
        }
        let o = outcome.out;
        let (ok, found) = match kind {
            0 | 3 => (o[1] == value & mask, o[1]),
            1 => (o[3] == value && o[4] == !value, o[3]),
            // A failed store-exclusive (status 1) is allowed.
            2 => (o[4] == 1 || o[1] == value & mask, o[1]),
            _ => (o[4] == value & mask, o[4]),
        };
        if !ok {
            self.violation("RAM read back a different value", target, found);
        }
    }

    fn hole_op(&mut self) {
        let size = self.rng.pick(&fuzz_model::SIZES);
        let (words, kind, writes) = self.memory_words(size);
        let span = match kind {
            "ldp" | "stp" if size == 3 => 16,
            "ldp" | "stp" => 8,
            _ => 1u64 << size,
        };
        let address = self.layout.hole(&mut self.rng, span);
        let mut block = self.block();
        block.x[2] = address;
        let outcome = self.run(&words, &block);
        if kind == "stxr" && outcome.taken == 0 && outcome.out[1] == 1 {
            // A store-exclusive without a monitor fails without an access.
            return;
        }
        if !outcome.is_external_abort() {
            let esr = if outcome.taken == 0 {
                u64::MAX
            } else {
                outcome.esr
            };
            self.violation("hole access did not take an external abort", address, esr);
            return;
        }
        if !(address..address + span).contains(&outcome.far) {
            self.violation("hole abort has the wrong FAR", address, outcome.far);
        }
        if matches!(kind, "ldr" | "str") && (outcome.esr >> 6) & 1 != u64::from(writes) {
            self.violation("hole abort has the wrong WnR", address, outcome.esr);
        }
    }

    /// A random offset in a device window, and whether the fuzzer may write it.
    fn device_target(&mut self, size: u32) -> (u64, Region, bool) {
        let l = self.layout;
        let align = !((1u64 << size) - 1);
        let (address, region) = match self.rng.below(3) {
            0 => {
                let offset = self.rng.below(fuzz_model::UART_SIZE - 16) & align;
                (l.uart + offset, Region::Uart(offset))
            }
            1 => {
                let offset = self.rng.below(fuzz_model::GICD_SIZE - 16) & align;
                (l.gicd + offset, Region::Gicd(offset))
            }
            _ if l.is_gicv2() => {
                // Registers whose reads have no side effect, far enough
                // from the acknowledge registers for any width.
                let offset = (0x28 + self.rng.below(0xb8)) & align;
                (l.gicc + offset, Region::Gicc(offset))
            }
            _ => {
                let vcpu = if self.rng.one_in(2) {
                    self.cpu as u64
                } else {
                    self.rng.below(l.vcpus)
                };
                let offset = self.rng.below(fuzz_model::GICR_STRIDE - 16) & align;
                (
                    l.gicr + vcpu * fuzz_model::GICR_STRIDE + offset,
                    Region::Gicr(vcpu, offset),
                )
            }
        };
        let writable = match region {
            Region::Gicd(offset) => {
                (offset >= 0x10)
                    && (self.allows(FuzzOptions::ALLOW_GIC_ACTIVE)
                        || !(0x2f0..0x380).contains(&offset))
            }
            Region::Gicr(vcpu, offset) => {
                vcpu == self.cpu as u64
                    // GICR_PROPBASER/PENDBASER: the `its` family's tables.
                    && (self.its_base == 0 || !(0x70..0x80).contains(&offset))
                    && (self.allows(FuzzOptions::ALLOW_GIC_ACTIVE)
                        || !(0x1_02f0..0x1_0380).contains(&offset))
            }
            // Writes go through `gicc_op`, which keeps the guest's own
            // interrupt handling working.
            Region::Gicc(_) => false,
            _ => true,
        };
        (address, region, writable)
    }

    fn device_op(&mut self) {
        match self.rng.below(8) {
            0 => return self.gic_razwi(),
            1 => return self.id_registers(),
            _ => {}
        }
        if self.allows(FuzzOptions::ALLOW_STRADDLE) && self.rng.one_in(16) {
            return self.straddle_op();
        }
        let size = self.rng.pick(&fuzz_model::SIZES);
        let (address, region, writable) = self.device_target(size);
        if let Region::Gicc(_) = region {
            return self.gicc_op();
        }
        let mut block = self.block();
        block.x[2] = address;
        let mut value = self.rng.next();
        if let Region::Uart(0) = region {
            // Printable bytes only on the console.
            value = b'a' as u64 + value % 26;
        }
        if let Region::Gicd(0..4) = region {
            // CTLR: keep ARE (GICv3; a GICv2 has no such bit) and both
            // groups enabled.
            value |= if self.layout.is_gicv2() { 0x3 } else { 0x13 };
        }
        block.x[0] = value;
        block.x[1] = value.rotate_left(32);
        block.x[3] = value;
        let (word, writes) = if self.rng.below(4) == 0 {
            let (words, _, writes) = self.memory_words(size);
            if writes && !writable {
                (fuzz_model::ldst(true, size, 0, 2), false)
            } else {
                (words[0], writes)
            }
        } else {
            // A load, or a store where the target may be written.
            let load = !(writable && self.rng.one_in(2));
            let word = fuzz_model::ldst(load, size, 0, 2);
            // Bit 22 of LDR/STR (unsigned offset) is L: clear for a store.
            (word, word & (1 << 22) == 0)
        };
        // The fuzzer's own rule: what another vCPU owns is only read (a
        // store there would change its state under its checks).
        if writes && !writable {
            self.violation(
                "fuzzer stored to a target it may only read",
                address,
                word.into(),
            );
        }
        self.run(&[word], &block);
    }

    /// GICv2: one access to the `GICC` window (the hardware's virtual CPU
    /// interface, not trapped): a 32-bit read of a register without side
    /// effects (never `GICC_IAR`/`AIAR`), which must not abort, or a write
    /// of `PMR`, `BPR`, `ABPR` (any value) or `CTLR` (group enables and
    /// `CBPR` at random, `AckCtl` kept, `FIQEn` and `EOImode` clear: the
    /// guest's handler keeps acknowledging every group through `GICC_IAR`).
    fn gicc_op(&mut self) {
        let gicc = self.layout.gicc;
        let mut block = self.block();
        let (offset, value, load) = if self.rng.one_in(2) {
            (self.rng.pick(&GICC_READABLE), 0, true)
        } else {
            match self.rng.below(4) {
                0 => (GICC_PMR, self.rng.next() & 0xff, false),
                1 => (GICC_BPR, self.rng.below(8), false),
                2 => (GICC_ABPR, self.rng.below(8), false),
                _ => {
                    let bits = u64::from(GICC_CTLR_ENABLE_GRP0 | GICC_CTLR_ENABLE_GRP1)
                        | u64::from(GICC_CTLR_CBPR);
                    (
                        GICC_CTLR,
                        (self.rng.next() & bits) | u64::from(GICC_CTLR_ACK_CTL),
                        false,
                    )
                }
            }
        };
        self.note = "device: GICC";
        block.x[2] = gicc + offset;
        block.x[0] = value;
        let outcome = self.run(&[fuzz_model::ldst(load, 2, 0, 2)], &block);
        if outcome.taken != 0 {
            self.violation("GICC register access aborted", offset, outcome.esr);
        }
    }

    /// A 4-, 8- or 16-byte access at the last 2 bytes of a device window (the
    /// PL011, the distributor, or a redistributor's `RD_base` or `SGI_base`
    /// frame, each a window of its own), made through the device alias:
    /// Normal memory, so the unaligned access is no alignment fault in the
    /// guest but reaches the hypervisor, which must not emulate it. The bytes
    /// past the window are in a hole or in the next frame: the access must
    /// take a synchronous external abort with FAR in the access. Exclusives,
    /// acquire/release and atomics need alignment, so they may take an
    /// alignment fault first; a store-exclusive without a monitor may fail
    /// without an access.
    fn straddle_op(&mut self) {
        let l = self.layout;
        let end = match self.rng.below(3) {
            0 => l.uart + fuzz_model::UART_SIZE,
            // GICv2: the bytes past the distributor are the GICC window's
            // (mapped, not trapped); the distributor half must still abort.
            _ if l.is_gicv2() => l.gicd + fuzz_model::GICD_SIZE,
            1 => l.gicd + fuzz_model::GICD_SIZE,
            _ => l.gicr + (1 + self.rng.below(2 * l.vcpus)) * (fuzz_model::GICR_STRIDE / 2),
        };
        let size = self.rng.pick(&[2u32, 3]);
        let (words, kind, writes) = self.memory_words(size);
        let span = match kind {
            "ldp" | "stp" if size == 3 => 16,
            "ldp" | "stp" => 8,
            _ => 1u64 << size,
        };
        self.note = "straddle";
        let address = fuzz_model::DEVICE_ALIAS + end - 2;
        let mut block = self.block();
        block.x[2] = address;
        block.x[0] = self.rng.next();
        block.x[1] = block.x[0].rotate_left(32);
        block.x[3] = block.x[0];
        let outcome = self.run(&words, &block);
        if self.verbose {
            println!(
                "FUZZ: straddle {kind} of {span} bytes at {address:#x}: {} taken, ESR {:#x}, \
                 FAR {:#x}",
                outcome.taken, outcome.esr, outcome.far
            );
        }
        if kind == "stxr" && outcome.taken == 0 && outcome.out[1] == 1 {
            return;
        }
        let aligned_only = !matches!(kind, "ldr" | "str" | "ldp" | "stp");
        let alignment_fault = outcome.taken >= 1
            && outcome.class() == EC_DATA_ABORT_EL1
            && outcome.esr & 0x3f == DFSC_ALIGNMENT;
        if aligned_only && alignment_fault {
            return;
        }
        if !outcome.is_external_abort() {
            let esr = if outcome.taken == 0 {
                u64::MAX
            } else {
                outcome.esr
            };
            self.violation("device-window straddle did not abort", address, esr);
            return;
        }
        if !(address..address + span).contains(&outcome.far) {
            self.violation("straddle abort has the wrong FAR", address, outcome.far);
        }
        if matches!(kind, "ldr" | "str") && (outcome.esr >> 6) & 1 != u64::from(writes) {
            self.violation("straddle abort has the wrong WnR", address, outcome.esr);
        }
    }

    /// Writes random values to a register the GIC specification makes RAZ/WI
    /// A random register of an SPI beyond `ITLinesNumber` (`spis_end`, the
    /// first INTID past the implemented ones) in the distributor at `gicd`:
    /// a bit register's word, or with `priority` an `IPRIORITYR` word. Both
    /// GIC versions lay these out alike.
    fn unimplemented_spi_register(
        &mut self,
        gicd: u64,
        spis_end: u64,
        priority: bool,
    ) -> (u64, &'static str) {
        if priority {
            let intid = spis_end + self.rng.below(1020 - spis_end);
            (
                gicd + 0x400 + (intid & !3),
                "GICD_IPRIORITYR of an unimplemented SPI",
            )
        } else {
            let word = spis_end / 32 + self.rng.below(32 - spis_end / 32);
            (
                gicd + 0x80 * (1 + self.rng.below(6)) + 4 * word,
                "GICD register of an unimplemented SPI",
            )
        }
    }

    /// (affinity routing on, one security state) and reads it back.
    fn gic_razwi(&mut self) {
        if self.layout.is_gicv2() {
            return self.gicv2_razwi();
        }
        let l = self.layout;
        let typer = SETTINGS.gicd_typer.load(Ordering::Relaxed);
        let spis_end = 32 * ((typer & 0x1f) + 1);
        let (address, what) = match self.rng.below(9) {
            0 => (
                l.gicd
                    + self
                        .rng
                        .pick(&[0x080, 0x100, 0x180, 0x200, 0x280, 0x380u64]),
                "GICD bank 0 word",
            ),
            1 => (
                l.gicd + 0x400 + 4 * self.rng.below(8),
                "GICD_IPRIORITYR of INTIDs 0..31",
            ),
            2 => (l.gicd + 0x800 + 4 * self.rng.below(0x100), "GICD_ITARGETSR"),
            3 => (
                l.gicd
                    + self
                        .rng
                        .pick(&[0xc00, 0xc04, 0xf00, 0xd00, 0xe00, 0xf10, 0xf20, 0xf2c]),
                "GICD RAZ/WI register",
            ),
            4 => (
                l.gicd
                    + self.rng.pick(&[
                        0x14, 0x18, 0x1c, 0x44, 0x4c, 0x54, 0x5c, 0x7c, 0xf30, 0x1000, 0x5ffc,
                        0x6000, 0x60f8, 0x8000, 0xa000,
                    ]),
                "GICD reserved offset",
            ),
            5 => self.unimplemented_spi_register(l.gicd, spis_end, false),
            6 => self.unimplemented_spi_register(l.gicd, spis_end, true),
            7 => (
                l.gicr
                    + self.cpu as u64 * fuzz_model::GICR_STRIDE
                    + 0x1_0000
                    + self.rng.pick(&[0x0d00, 0x0e00u64]),
                "GICR_IGRPMODR0/NSACR",
            ),
            _ => (
                l.gicr
                    + self.cpu as u64 * fuzz_model::GICR_STRIDE
                    + 0x1_0000
                    + 0x84
                    + 4 * self.rng.below(31),
                "GICR SGI_base reserved word",
            ),
        };
        let mut block = self.block();
        block.x[2] = address;
        block.x[0] = self.rng.next() & 0xffff_ffff;
        let outcome = self.run(
            &[
                fuzz_model::ldst(false, 2, 0, 2),
                fuzz_model::ldst(true, 2, 1, 2),
            ],
            &block,
        );
        if outcome.taken != 0 {
            self.violation("RAZ/WI GIC register access aborted", address, outcome.esr);
        } else if outcome.out[1] != 0 {
            self.violation(what, address, outcome.out[1]);
        }
    }

    /// GICv2 (no security extensions): writes random values to a register
    /// the GICv2 specification makes read-only or RAZ/WI, reads it back.
    /// `ITARGETSR0..7` read as the reading CPU's own bit in every byte,
    /// `ICFGR0` (SGIs, always edge-triggered) as `0xaaaaaaaa`; in the other
    /// `ICFGR` words the reserved bit of every field (`Int_config[0]`)
    /// reads as zero, and in `ICFGR1` so do the fields of the timer PPIs
    /// (level-sensitive, like the lines behind them); `NSACR`, the
    /// reserved offsets of the 4 KiB distributor, the rest of the 64 KiB
    /// window (where a GICv3 has `IROUTER`) and the registers of SPIs beyond
    /// `ITLinesNumber` read as zero.
    fn gicv2_razwi(&mut self) {
        if self.allows(FuzzOptions::ALLOW_GICV2_SGI_PEND) && self.rng.one_in(4) {
            return self.gicv2_sgi_pend();
        }
        let l = self.layout;
        let typer = SETTINGS.gicd_typer.load(Ordering::Relaxed);
        let spis_end = 32 * ((typer & 0x1f) + 1);
        let own = 0x0101_0101u64 << self.cpu;
        let mut mask = u64::from(u32::MAX);
        let choice = self.rng.below(8);
        let (address, what, expect) = match choice {
            7 => {
                // ICFGR1 (PPIs, banked) or an implemented SPI's word.
                let word = 1 + self.rng.below(spis_end / 16 - 1);
                mask = 0x5555_5555;
                if word == 1 {
                    mask |= 1 << (2 * (TIMER_INTID - 16) + 1) | 1 << (2 * (PTIMER_INTID - 16) + 1);
                }
                (
                    l.gicd + 0xc00 + 4 * word,
                    "GICD_ICFGR: a reserved bit or a timer PPI's edge bit is set",
                    0,
                )
            }
            0 => (
                l.gicd + 0x800 + 4 * self.rng.below(8),
                "GICD_ITARGETSR0..7 does not name the reading CPU",
                own,
            ),
            1 => (l.gicd + 0xc00, "GICD_ICFGR0 is not all edge", 0xaaaa_aaaa),
            2 => (
                l.gicd + 0xe00 + 4 * self.rng.below(64),
                "GICD_NSACR is not RAZ/WI",
                0,
            ),
            3 => (
                l.gicd
                    + self.rng.pick(&[
                        0x0c, 0x10, 0x1c, 0x40, 0x5c, 0x7c, 0xf04, 0xf0c, 0xf30, 0xfcc, 0x1000,
                        0x6000, 0x6100, 0x8000, 0xfffc,
                    ]),
                "GICD reserved offset is not RAZ/WI",
                0,
            ),
            4 | 5 => {
                let priority = choice == 5;
                let (address, what) = self.unimplemented_spi_register(l.gicd, spis_end, priority);
                (address, what, 0)
            }
            _ => {
                let intid = spis_end + self.rng.below(1020 - spis_end);
                (
                    l.gicd + 0x800 + (intid & !3),
                    "GICD_ITARGETSR of an unimplemented SPI",
                    0,
                )
            }
        };
        let mut block = self.block();
        block.x[2] = address;
        block.x[0] = self.rng.next() & 0xffff_ffff;
        let outcome = self.run(
            &[
                fuzz_model::ldst(false, 2, 0, 2),
                fuzz_model::ldst(true, 2, 1, 2),
            ],
            &block,
        );
        if outcome.taken != 0 {
            self.violation("RAZ/WI GIC register access aborted", address, outcome.esr);
        } else if outcome.out[1] & mask != expect {
            self.violation(what, address, outcome.out[1]);
        }
    }

    /// `gicv2-sgi-pend`: an SGI's bits in `GICD_ISPENDR0` and
    /// `GICD_ICPENDR0` are WI on a GICv2. The SGI is disabled in the vCPU's
    /// bank and its sources cleared (`GICD_CPENDSGIR`), then its `ISPENDR0`
    /// bit written: it must not read as pending; then it is sent to the
    /// vCPU itself (`GICD_SGIR`) and its `ICPENDR0` bit written: it must
    /// still be pending from that source (with one vCPU nobody else sends
    /// or clears it meanwhile).
    fn gicv2_sgi_pend(&mut self) {
        let gicd = self.layout.gicd;
        let sgi = self.rng.below(16) as u32;
        let bit = 1u32 << sgi;
        let own = Bank::Redistributor(self.cpu);
        gic::write_bits(own, ICENABLER, sgi, bit);
        // SAFETY: a byte store to GICD_CPENDSGIR<sgi>, in the distributor
        // frame mapped as device memory: clears the SGI's sources on this
        // vCPU.
        unsafe { core::ptr::write_volatile((gicd + 0xf10 + u64::from(sgi)) as *mut u8, 0xff) };
        gic::write_bits(own, ICPENDR, sgi, bit);
        let before = gic::read_bits(own, gic_regs::ISPENDR, sgi) & bit;
        gic::write_bits(own, gic_regs::ISPENDR, sgi, bit);
        let after = gic::read_bits(own, gic_regs::ISPENDR, sgi) & bit;
        let sources = (mmio_read32(gicd + 0xf20 + u64::from(sgi & !3)) >> (8 * (sgi % 4))) & 0xff;
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile((gicd + 0xf10 + u64::from(sgi)) as *mut u8, 0xff) };
        gic::send_sgi_to_self(sgi);
        let sent = gic::read_bits(own, gic_regs::ISPENDR, sgi) & bit;
        gic::write_bits(own, ICPENDR, sgi, bit);
        let kept = gic::read_bits(own, gic_regs::ISPENDR, sgi) & bit;
        if sent != 0 && kept == 0 {
            self.violation(
                "GICD_ICPENDR0 write cleared a pending SGI (WI on a GICv2)",
                sgi.into(),
                0,
            );
        }
        // SAFETY: as above; leaves no source behind.
        unsafe { core::ptr::write_volatile((gicd + 0xf10 + u64::from(sgi)) as *mut u8, 0xff) };
        gic::write_bits(own, ICPENDR, sgi, bit);
        if before == 0 && after != 0 {
            self.violation(
                "GICD_ISPENDR0 write made an SGI pending (WI on a GICv2)",
                sgi.into(),
                sources.into(),
            );
        }
    }

    /// GICv2: the distributor's `ICPIDR2.ArchRev` (2), `GICD_TYPER`
    /// (stable, `CPUNumber` the vCPUs less one, no security extensions) and
    /// `GICC_IIDR`'s architecture version (2).
    fn gicv2_id_registers(&mut self, which: u64) {
        let l = self.layout;
        let mut block = self.block();
        let (address, what) = match which {
            1 => (l.gicd + 0xfe8, "GICD_ICPIDR2 does not say GICv2"),
            2 => (l.gicd + 4, "GICD_TYPER"),
            _ => (l.gicc + GICC_IIDR, "GICC_IIDR does not say GICv2"),
        };
        block.x[2] = address;
        let o = self.run(&[fuzz_model::ldst(true, 2, 0, 2)], &block);
        let value = o.out[0];
        let typer = SETTINGS.gicd_typer.load(Ordering::Relaxed);
        let ok = o.taken == 0
            && match which {
                1 => (value >> 4) & 0xf == 2,
                2 => value == typer && (value >> 5) & 7 == l.vcpus - 1 && value & (1 << 10) == 0,
                _ => (value >> 16) & 0xf == 2,
            };
        if !ok {
            self.violation(what, address, value);
        }
    }

    /// ID and type registers: PL011 PrimeCell IDs, GIC architecture revision,
    /// `GICD_TYPER` stability, `GICR_TYPER` of a random redistributor.
    fn id_registers(&mut self) {
        let l = self.layout;
        let mut block = self.block();
        match self.rng.below(4) {
            which @ 1..4 if l.is_gicv2() => self.gicv2_id_registers(which),
            0 => {
                const PL011_ID: [u64; 8] = [0x11, 0x10, 0x34, 0x00, 0x0d, 0xf0, 0x05, 0xb1];
                let i = self.rng.below(8);
                block.x[2] = l.uart + 0xfe0 + 4 * i;
                let o = self.run(&[fuzz_model::ldst(true, 2, 0, 2)], &block);
                // PeriphID2 carries the revision: only its designer bits are fixed.
                let mask = if i == 2 { 0xf } else { 0xff };
                if o.taken != 0 || o.out[0] & mask != PL011_ID[i as usize] & mask {
                    self.violation("PL011 ID register", 0xfe0 + 4 * i, o.out[0]);
                }
            }
            1 => {
                let gicr = l.gicr + self.rng.below(l.vcpus) * fuzz_model::GICR_STRIDE;
                block.x[2] = if self.rng.one_in(2) {
                    l.gicd + 0xffe8
                } else {
                    gicr + 0xffe8
                };
                let o = self.run(&[fuzz_model::ldst(true, 2, 0, 2)], &block);
                if o.taken != 0 || (o.out[0] >> 4) & 0xf != 3 {
                    self.violation("GIC PIDR2 does not say GICv3", block.x[2], o.out[0]);
                }
            }
            2 => {
                block.x[2] = l.gicd + 4;
                let o = self.run(&[fuzz_model::ldst(true, 2, 0, 2)], &block);
                let typer = SETTINGS.gicd_typer.load(Ordering::Relaxed);
                if o.taken != 0 || o.out[0] != typer {
                    self.violation("GICD_TYPER changed", typer, o.out[0]);
                }
            }
            _ => {
                let vcpu = self.rng.below(l.vcpus);
                block.x[2] = l.gicr + vcpu * fuzz_model::GICR_STRIDE + 8;
                let o = self.run(&[fuzz_model::ldst(true, 3, 0, 2)], &block);
                let typer = o.out[0];
                let mpidr = MPIDRS[vcpu as usize].load(Ordering::Relaxed);
                let affinity = (mpidr & 0xff_ffff) | ((mpidr >> 8) & 0xff00_0000);
                let last = vcpu == l.vcpus - 1;
                if o.taken != 0
                    || typer >> 32 != affinity
                    || (typer >> 8) & 0xffff != vcpu
                    || (typer >> 4) & 1 != u64::from(last)
                {
                    self.violation("GICR_TYPER", vcpu, typer);
                }
            }
        }
    }

    /// A cache maintenance or address translation operation on RAM, a hole
    /// or a device: only `DC ZVA` in RAM and `AT` have answers to check.
    fn cache_op(&mut self) {
        let (address, ram) = match self.rng.below(4) {
            0 => (self.scratch + RAM_TARGET + self.rng.below(0x400) * 16, true),
            1 => (self.layout.hole(&mut self.rng, 64), false),
            _ => (self.device_target(3).0, false),
        };
        let word = match self.rng.below(9) {
            0 => fuzz_model::sys(3, 7, 14, 1, 2), // DC CIVAC
            1 => fuzz_model::sys(3, 7, 10, 1, 2), // DC CVAC
            2 => fuzz_model::sys(3, 7, 11, 1, 2), // DC CVAU
            3 => fuzz_model::sys(0, 7, 6, 1, 2),  // DC IVAC
            4 => fuzz_model::sys(3, 7, 12, 1, 2), // DC CVAP
            5 => fuzz_model::sys(3, 7, 5, 1, 2),  // IC IVAU
            6 if ram => return self.dc_zva(address),
            6 => fuzz_model::sys(3, 7, 4, 1, 2), // DC ZVA
            _ => return self.at_op(),
        };
        let mut block = self.block();
        block.x[2] = address;
        self.run(&[word], &block);
    }

    fn dc_zva(&mut self, address: u64) {
        let dczid = SETTINGS.dczid.load(Ordering::Relaxed);
        if dczid & 0x10 != 0 {
            return;
        }
        let block_size = 4u64 << (dczid & 0xf);
        let address = address & !(block_size - 1);
        let mut block = self.block();
        block.x[2] = address;
        block.x[0] = self.rng.next() | 1;
        // Fill a word first so that the zeroing is seen.
        let outcome = self.run(
            &[
                fuzz_model::ldst(false, 3, 0, 2),
                fuzz_model::sys(3, 7, 4, 1, 2), // DC ZVA
                fuzz_model::ldst(true, 3, 1, 2),
            ],
            &block,
        );
        if outcome.taken != 0 || outcome.out[1] != 0 {
            self.violation("DC ZVA in RAM", address, outcome.out[1]);
        }
    }

    fn at_op(&mut self) {
        let (va, el0) = match self.rng.below(3) {
            0 => (self.scratch + self.rng.below(SCRATCH_SIZE as u64), false),
            1 => (self.layout.hole(&mut self.rng, 8), false),
            _ => (self.rng.below(1 << 40), self.rng.one_in(2)),
        };
        let op2 = if el0 { 2 } else { 0 } + self.rng.below(2) as u32;
        let mut block = self.block();
        block.x[2] = va;
        let outcome = self.run(&[fuzz_model::sys(0, 7, 8, op2, 2)], &block);
        let par = read_sysreg!("par_el1");
        // Another vCPU may have pointed its window at a table in a hole: the
        // stage-1 walk's stage-2 fault goes to the hypervisor, which answers
        // with an external abort (AT reports only stage-1 faults in PAR).
        let windows = window_va(0)..window_va(FUZZ_CPUS);
        if outcome.is_external_abort() && windows.contains(&va) {
            return;
        }
        if outcome.taken != 0 {
            self.violation("AT took an exception", va, outcome.esr);
            return;
        }
        // The EL0 window and the vCPUs' windows map other IPAs, or nothing.
        if (self.layout.reserved.0..self.layout.reserved.1).contains(&va) {
            return;
        }
        // The identity map covers 2^39 bytes for EL1 only, but for its last
        // gigabyte: the device alias, which maps the first gigabyte.
        let expect_fault = va >= fuzz_model::VA_LIMIT || el0;
        let pa = if va >= fuzz_model::DEVICE_ALIAS {
            va - fuzz_model::DEVICE_ALIAS
        } else {
            va
        };
        let fault = par & 1 != 0;
        if fault != expect_fault || (!fault && (par & 0xf_ffff_ffff_f000) != (pa & !0xfff)) {
            self.violation("AT disagrees with the identity map", va, par);
        }
    }

    /// `HVC`/`SMC` calls.
    fn call_op(&mut self) {
        let smc = self.rng.one_in(3);
        let imm = if self.rng.one_in(8) {
            self.rng.next() as u32 & 0xffff
        } else {
            0
        };
        let mut block = self.block();
        let me = MPIDRS[self.cpu].load(Ordering::Relaxed);
        let vcpus = self.layout.vcpus as usize;
        enum Expect {
            Exactly(u64),
            OneOf(&'static [i64]),
            Anything,
        }
        let (id, expect) = match self.rng.below(6) {
            0 | 1 => {
                let id = if self.allows(FuzzOptions::ALLOW_HVC_ANY) && self.rng.one_in(2) {
                    let mut id = self.rng.next();
                    if self.rng.one_in(2) {
                        id &= 0xffff_ffff;
                    }
                    if fuzz_model::id_is_dangerous(id)
                        || (id >> 32 == 0 && IMPLEMENTED.contains(&(id as u32)))
                    {
                        id = UNKNOWN_POOL[0];
                    }
                    id
                } else {
                    self.rng.pick(&UNKNOWN_POOL)
                };
                block.x[1] = self.rng.next();
                block.x[2] = self.rng.next();
                block.x[3] = self.rng.next();
                (id, Expect::Exactly(NOT_SUPPORTED))
            }
            2 => {
                let id = self.rng.pick(&SAFE_IMPLEMENTED);
                let mut expect = Expect::Exactly(0x1_0001);
                match id {
                    0x8400_000a => {
                        let function = match self.rng.below(3) {
                            0 => self.rng.pick(&IMPLEMENTED),
                            1 => self.rng.pick(&UNKNOWN_POOL) as u32,
                            _ => self.rng.next() as u32,
                        };
                        block.x[1] = u64::from(function);
                        expect = Expect::Exactly(if IMPLEMENTED.contains(&function) {
                            0
                        } else {
                            NOT_SUPPORTED
                        });
                    }
                    0xc400_0004 => {
                        let (mpidr, level) = self.random_mpidr(me);
                        block.x[1] = mpidr;
                        block.x[2] = level;
                        let valid = level == 0 && self.mpidr_index(mpidr, vcpus).is_some();
                        expect = if !valid {
                            Expect::Exactly(-2i64 as u64)
                        } else if self.mpidr_index(mpidr, vcpus) == Some(self.cpu) {
                            Expect::Exactly(0)
                        } else {
                            Expect::OneOf(&[0, 1, 2])
                        };
                    }
                    0x8400_0006 => expect = Expect::Exactly(2),
                    _ => {}
                }
                (u64::from(id), expect)
            }
            3 => {
                // CPU_ON with a bogus target or entry, or of itself.
                let (mpidr, _) = self.random_mpidr(me);
                block.x[1] = mpidr;
                let entry_in_ram =
                    self.mpidr_index(mpidr, vcpus) == Some(self.cpu) && self.rng.one_in(2);
                block.x[2] = if entry_in_ram {
                    self.layout.ram.0 + self.rng.below(self.layout.ram.1 - self.layout.ram.0)
                } else {
                    self.layout.hole(&mut self.rng, 4)
                };
                block.x[3] = self.rng.next();
                let expect = match self.mpidr_index(mpidr, vcpus) {
                    None => Expect::Exactly(-2i64 as u64),
                    Some(cpu) if cpu == self.cpu && entry_in_ram => Expect::Exactly(-4i64 as u64),
                    Some(_) => Expect::OneOf(&[-9, -4]),
                };
                (0xc400_0003, expect)
            }
            _ => {
                // The fast calls again, with the 64-bit id convention's upper
                // bits or random arguments; answers are not pinned.
                block.x[1] = self.rng.next();
                (
                    u64::from(self.rng.pick(&SAFE_IMPLEMENTED)),
                    Expect::Anything,
                )
            }
        };
        if fuzz_model::id_is_dangerous(id) && id != 0xc400_0003 {
            return;
        }
        block.x[0] = id;
        let word = if smc {
            fuzz_model::smc(imm)
        } else {
            fuzz_model::hvc(imm)
        };
        let outcome = self.run(&[word], &block);
        if outcome.taken != 0 {
            self.violation("hypercall took an exception", id, outcome.esr);
            return;
        }
        if imm != 0 {
            return;
        }
        let x0 = outcome.out[0];
        let ok = match expect {
            Expect::Exactly(v) => x0 == v,
            Expect::OneOf(set) => set.contains(&(x0 as i64)),
            Expect::Anything => true,
        };
        if !ok {
            self.violation(if smc { "SMC answer" } else { "HVC answer" }, id, x0);
        }
        for r in 4..18 {
            if outcome.out[r] != block.x[r] {
                self.violation(
                    "hypercall changed a register the caller owns (x4..x17)",
                    id,
                    r as u64,
                );
                break;
            }
        }
    }

    /// An MPIDR (valid, the caller's, or bogus) and an affinity level.
    fn random_mpidr(&mut self, me: u64) -> (u64, u64) {
        let vcpus = self.layout.vcpus;
        let mpidr = match self.rng.below(4) {
            0 => me,
            1 => MPIDRS[self.rng.below(vcpus) as usize].load(Ordering::Relaxed),
            2 => me ^ (1 << self.rng.pick(&[0u64, 4, 8, 16, 32, 39])),
            _ => self.rng.next(),
        };
        let level = if self.rng.one_in(4) {
            self.rng.below(5)
        } else {
            0
        };
        (mpidr, level)
    }

    /// The vCPU a PSCI MPIDR argument names (affinity fields only).
    fn mpidr_index(&self, mpidr: u64, vcpus: usize) -> Option<usize> {
        let affinity = |m: u64| m & 0xff_00ff_ffff;
        (0..vcpus).find(|&i| affinity(MPIDRS[i].load(Ordering::Relaxed)) == affinity(mpidr))
    }

    fn sysreg_op(&mut self) {
        let reg = match self.rng.below(10) {
            0..3 => SysReg::new(
                3,
                0,
                0,
                1 + self.rng.below(7) as u32,
                self.rng.below(8) as u32,
            ),
            3 => SysReg::new(
                3,
                self.rng.pick(&[0u32, 3]),
                12,
                self.rng.below(16) as u32,
                self.rng.below(8) as u32,
            ),
            4 => SysReg::new(
                3,
                self.rng.pick(&[4u32, 5, 6]),
                self.rng.below(16) as u32,
                self.rng.below(16) as u32,
                self.rng.below(8) as u32,
            ),
            5 => SysReg::new(
                2,
                0,
                self.rng.below(2) as u32,
                self.rng.below(16) as u32,
                self.rng.below(8) as u32,
            ),
            _ => SysReg::random(&mut self.rng),
        };
        // Without the GICv3 system-register interface (a GICv2 host), the
        // ICC encodings are unallocated: every access is UNDEFINED, so none
        // acknowledges or sends anything.
        let icc_undefined = !self.gic_sysregs && reg.is_gicv3_cpu_interface();
        if (reg.is_sgi() && !icc_undefined)
            || (reg.read_acknowledges()
                && !icc_undefined
                && !self.allows(FuzzOptions::ALLOW_GIC_ACTIVE))
            || (reg.is_physical_timer() && !self.allows(FuzzOptions::ALLOW_PTIMER))
        {
            return;
        }
        let block = self.block();
        let read = self.run(&[reg.mrs(0)], &block);
        let value = read.out[0];
        if reg.read_acknowledges()
            && read.taken == 0
            && gic::is_interrupt((value & 0xff_ffff) as u32)
        {
            // Completed at once: an acknowledged interrupt holds this vCPU's
            // running priority until its EOI, and left so it would block
            // every later interrupt check here (LPIs pending on a vCPU made
            // that a matter of time).
            if reg.crm == 8 {
                write_sysreg!("icc_eoir0_el1", value);
            } else {
                write_sysreg!("icc_eoir1_el1", value);
            }
            return;
        }
        if icc_undefined {
            let mut block = self.block();
            block.x[0] = self.rng.next();
            let write = self.run(&[reg.msr(0)], &block);
            if !read.is_undef() || !write.is_undef() {
                self.violation(
                    "ICC register did not UNDEF without the GICv3 system registers",
                    encoding(reg),
                    if read.is_undef() { write.esr } else { value },
                );
            }
            return;
        }
        if reg.is_undefined_at_el1() && !read.is_undef() {
            self.violation(
                "EL2/EL3 register did not UNDEF at EL1",
                encoding(reg),
                value,
            );
        }
        if reg.is_id_space() && read.taken != 0 {
            self.violation(
                "ID register read took an exception",
                encoding(reg),
                read.esr,
            );
        }
        if reg.is_reserved_id() && read.taken == 0 && value != 0 {
            self.violation("reserved ID register is not RAZ", encoding(reg), value);
        }
        if reg == ID_AA64PFR1_EL1 && read.taken == 0 && (value >> 8) & 0xf != 0 {
            self.violation("ID_AA64PFR1_EL1 shows MTE", encoding(reg), value);
        }
        if read.taken == 0 && self.rng.one_in(2) {
            let mut block = self.block();
            block.x[0] = value;
            let write = self.run(&[reg.msr(0)], &block);
            if reg.is_id_space() && !write.is_undef() {
                // Writing an allocated read-only ID register is UNDEFINED.
                self.violation(
                    "write to an ID register did not UNDEF",
                    encoding(reg),
                    write.esr,
                );
            }
        }
    }

    fn sgi_op(&mut self) {
        if self.layout.is_gicv2() {
            return self.sgir_op();
        }
        let mut value = self.rng.next();
        // Mostly plausible: few clusters, no range selector.
        if !self.rng.one_in(4) {
            value &= 0x0000_0000_0f03_ffff | (1 << 40);
        }
        let reg = match self.rng.below(6) {
            0 => SysReg::new(3, 0, 12, 11, 6), // ASGI1R
            1 => SysReg::new(3, 0, 12, 11, 7), // SGI0R
            _ => ICC_SGI1R_EL1,
        };
        let mut block = self.block();
        block.x[0] = value;
        let outcome = self.run(&[reg.msr(0)], &block);
        if outcome.taken != 0 {
            self.violation("SGI register write took an exception", value, outcome.esr);
        }
    }

    /// GICv2: SGIs through `GICD_SGIR` (mostly a target list, all but
    /// self, or self; sometimes any value, the reserved filter included),
    /// which must not abort; and now and then an `ICC_SGI*R_EL1` write,
    /// which without the GICv3 system registers must be UNDEFINED.
    fn sgir_op(&mut self) {
        if !self.gic_sysregs && self.rng.one_in(6) {
            let reg = match self.rng.below(3) {
                0 => SysReg::new(3, 0, 12, 11, 6), // ASGI1R
                1 => SysReg::new(3, 0, 12, 11, 7), // SGI0R
                _ => ICC_SGI1R_EL1,
            };
            let mut block = self.block();
            block.x[0] = self.rng.next();
            let outcome = self.run(&[reg.msr(0)], &block);
            if !outcome.is_undef() {
                self.violation(
                    "ICC SGI register did not UNDEF without the GICv3 system registers",
                    encoding(reg),
                    outcome.esr,
                );
            }
            return;
        }
        let mut value = self.rng.next() & 0xffff_ffff;
        if !self.rng.one_in(4) {
            // TargetListFilter 0..=2, CPUTargetList, NSATT, INTID.
            value &= 0x03ff_800f;
            if value >> 24 == 3 {
                value &= !(1 << 24);
            }
        }
        let mut block = self.block();
        block.x[0] = value;
        block.x[2] = self.layout.gicd + GICD_SGIR;
        let outcome = self.run(&[fuzz_model::ldst(false, 2, 0, 2)], &block);
        if outcome.taken != 0 {
            self.violation("GICD_SGIR write took an exception", value, outcome.esr);
        }
    }

    /// GICv3: turns the distributor and the CPU interface on for the
    /// interrupt checks (`PMR` open, binary point 0, `CBPR` and `EOImode` 0,
    /// group 1 on, group 0 left as it is). GICv2: the same through `GICC`
    /// (`AckCtl` set).
    fn cpu_interface_on(&mut self) {
        if self.layout.is_gicv2() {
            let gicc = self.layout.gicc;
            mmio_write32(
                self.layout.gicd + GICD_CTLR,
                GICD_CTLR_ENABLE_GRP1 | GICD_CTLR_ENABLE_GRP0,
            );
            gic::set_priority_mask(0xff);
            mmio_write32(gicc + GICC_BPR, 0);
            let ctlr = mmio_read32(gicc + GICC_CTLR) & GICC_CTLR_ENABLE_GRP0;
            mmio_write32(
                gicc + GICC_CTLR,
                ctlr | GICC_CTLR_ENABLE_GRP1 | GICC_CTLR_ACK_CTL,
            );
            return;
        }
        mmio_write32(
            self.layout.gicd + GICD_CTLR,
            GICD_CTLR_ARE | GICD_CTLR_ENABLE_GRP1 | GICD_CTLR_ENABLE_GRP0,
        );
        gic::set_priority_mask(0xff);
        write_sysreg!("icc_bpr1_el1", 0);
        write_sysreg!("icc_ctlr_el1", 0);
        write_sysreg!("icc_igrpen1_el1", 1);
    }

    /// Enables group 0 in the CPU interface (`ICC_IGRPEN0_EL1`, or
    /// `GICC_CTLR.EnableGrp0` on a GICv2).
    fn group0_on(&mut self) {
        if self.layout.is_gicv2() {
            let gicc = self.layout.gicc;
            let ctlr = mmio_read32(gicc + GICC_CTLR);
            mmio_write32(gicc + GICC_CTLR, ctlr | GICC_CTLR_ENABLE_GRP0);
        } else {
            write_sysreg!("icc_igrpen0_el1", 1);
        }
    }

    fn random_el1(&mut self) {
        let word = loop {
            let word = self.rng.next() as u32;
            if fuzz_model::el1_word_allowed(word) {
                break word;
            }
        };
        let l = self.layout;
        let mut block = self.block();
        let middle = self.scratch + SCRATCH_MIDDLE;
        for i in 0..8 {
            block.x[i] = middle + 8 * i as u64;
        }
        let own_gicr = l.gicr + self.cpu as u64 * fuzz_model::GICR_STRIDE;
        for i in 8..16 {
            block.x[i] = match self.rng.below(4) {
                0 => l.uart + self.rng.below(fuzz_model::UART_SIZE),
                1 => l.gicd + 0x800 + self.rng.below(0x400),
                // GICv2: the vCPU's banked priorities (random words must
                // not write the GICC, whose registers drive the handler).
                2 if l.is_gicv2() => l.gicd + 0x400 + self.rng.below(0x20),
                2 => own_gicr + self.rng.below(0x300),
                _ => l.hole(&mut self.rng, 8),
            };
        }
        for r in block.x.iter_mut().take(29).skip(16) {
            *r = (self.rng.next() << 32) | self.rng.below(64);
        }
        self.run_bare(word, &block);
    }

    fn el0_op(&mut self) {
        let aarch32 = self.el0_aarch32 && self.rng.one_in(2);
        let hole_va = EL0_WINDOW + ((EL0_HOLE_INDEX + self.cpu) * PAGE) as u64;
        // EL0 reaches every vCPU's EL0 pages (PC-relative literal loads go
        // 1 MiB either way): any of the hole pages may abort.
        let holes_start = EL0_WINDOW + (EL0_HOLE_INDEX * PAGE) as u64;
        let holes_end = holes_start + (FUZZ_CPUS * PAGE) as u64;
        // One in three: a load or store to the EL0 page whose IPA is a hole.
        let directed = self.rng.one_in(3);
        let size = self.rng.pick(&[0u32, 2]);
        let store = self.rng.one_in(2);
        let target = hole_va + (self.rng.below(PAGE as u64 / 4) * 4);
        let mut block = self.block();
        let (words, spsr) = if aarch32 {
            let word = if directed {
                self.note = "EL0 AArch32 access to a hole";
                // LDR/STR{B} r0, [r1]
                0xe581_0000 | (u32::from(size == 0) << 22) | (u32::from(!store) << 20)
            } else {
                loop {
                    let word = self.rng.next() as u32;
                    if fuzz_model::a32_word_allowed(word) {
                        break word;
                    }
                }
            };
            for i in 0..13 {
                block.x[i] = self.el0_data_va + 0x400 + 8 * i as u64;
            }
            block.x[13] = self.el0_data_va + 0x800;
            block.x[14] = self.el0_code_va;
            ([word, fuzz_model::A32_SVC0], SPSR_USR32)
        } else {
            let word = if directed {
                self.note = "EL0 access to a hole";
                fuzz_model::ldst(!store, size, 0, 1)
            } else {
                loop {
                    let word = self.rng.next() as u32;
                    if fuzz_model::el0_word_allowed(word) {
                        break word;
                    }
                }
            };
            for (i, r) in block.x.iter_mut().enumerate() {
                *r = if i < 16 {
                    self.el0_data_va + 0x400 + 8 * i as u64
                } else {
                    self.rng.next()
                };
            }
            ([word, fuzz_model::SVC0], SPSR_EL0T)
        };
        if directed {
            block.x[1] = target;
        }
        block.sp_el0 = self.el0_data_va + 0x800;
        if self.verbose {
            println!(
                "FUZZ: EL0 words {:#010x} {:#010x}, SPSR {spsr:#x}",
                words[0], words[1]
            );
        }
        write_code(self.el0_code, &words);
        let outcome = self.enter(self.el0_code_va, spsr, &block);
        let external = outcome.taken >= 1
            && outcome.class() == EC_DATA_ABORT_EL0
            && outcome.esr & 0x3f == DFSC_EXTERNAL;
        if directed {
            if !external || outcome.far != target {
                self.violation(
                    "EL0 access to a hole: no external abort at its address",
                    target,
                    outcome.esr,
                );
            } else if (outcome.esr >> 6) & 1 != u64::from(store) {
                self.violation("EL0 access to a hole: wrong WnR", target, outcome.esr);
            }
        } else if outcome.taken == 0 {
            self.violation(
                "EL0 code returned without an exception",
                u64::from(words[0]),
                0,
            );
        } else if external
            && !(holes_start..holes_end).contains(&outcome.far)
            // Other vCPUs point their windows at tables in holes, whose
            // walks abort whatever the permissions.
            && !(window_va(0)..window_va(FUZZ_CPUS)).contains(&outcome.far)
        {
            self.violation(
                "external abort injected into EL0 away from the hole pages",
                u64::from(words[0]),
                outcome.far,
            );
        }
    }

    /// The timers family (see the module docs); without `timers`, an
    /// interrupt operation.
    fn timer_op(&mut self) {
        if !self.allows(FuzzOptions::ALLOW_TIMERS) {
            return self.interrupt_op();
        }
        let physical = self.allows(FuzzOptions::ALLOW_PTIMER);
        let own = Bank::Redistributor(self.cpu);
        if !self.layout.is_gicv2() {
            mmio_write32(
                self.layout.gicr + self.cpu as u64 * fuzz_model::GICR_STRIDE + GICR_WAKER,
                0,
            );
        }
        for intid in [TIMER_INTID, PTIMER_INTID] {
            if intid == PTIMER_INTID && !physical {
                continue;
            }
            gic::set_group1(own, intid);
            gic::set_priority(own, intid, PRIORITY);
            gic::write_bits(own, ICACTIVER, intid, 1 << intid);
            // A random `GICR_ISPENDR0` write (the device family) may have
            // latched it pending: only the timer's line may pend it now.
            gic::write_bits(own, ICPENDR, intid, 1 << intid);
            gic::write_bits(own, ISENABLER, intid, 1 << intid);
        }
        self.cpu_interface_on();
        // SAFETY: masking IRQ and FIQ only defers interrupts.
        unsafe { asm!("msr daifset, #3", options(nostack)) };
        let frequency = read_sysreg!("cntfrq_el0");
        let now = read_sysreg!("cntvct_el0");
        let timers: &[bool] = if physical { &[true, false] } else { &[false] };
        for &is_physical in timers {
            let cval = match self.rng.below(3) {
                0 => now.saturating_sub(self.rng.below(frequency / 1000)),
                1 => now + self.rng.below(frequency / 5000),
                _ => now + frequency / 100,
            };
            let ctl = if self.rng.one_in(4) { 0b11 } else { 0b01 };
            set_timer(is_physical, Some(cval), None, ctl);
        }
        // Let them fire while masked: until the CPU interface signals one,
        // or a random while.
        let until = read_sysreg!("cntvct_el0") + self.rng.below(frequency / 3333);
        while read_sysreg!("cntvct_el0") < until && read_sysreg!("isr_el1") & (1 << 7) == 0 {
            core::hint::spin_loop();
        }
        // Reprogram each, in a random order: the virtual timer's stale
        // interrupt counts only when an exit follows its last write.
        let order: &[bool] = match (physical, self.rng.one_in(2)) {
            (false, _) => &[false],
            (true, true) => &[true, false],
            (true, false) => &[false, true],
        };
        let mut virtual_exited = false;
        for &is_physical in order {
            let now = read_sysreg!("cntvct_el0");
            let ctl = if is_physical {
                read_sysreg!("cntp_ctl_el0")
            } else {
                read_sysreg!("cntv_ctl_el0")
            };
            match self.rng.below(5) {
                0 => set_timer(is_physical, None, None, 0),
                1 => set_timer(is_physical, None, None, (ctl & 0b11) | 0b10),
                2 => set_timer(is_physical, Some(now + frequency), None, ctl & 0b11),
                3 => set_timer(
                    is_physical,
                    None,
                    Some(self.rng.below(frequency / 5000)),
                    0b01,
                ),
                _ => {}
            }
            // A physical timer access traps: an exit after the virtual
            // timer's writes.
            virtual_exited = is_physical;
        }
        if self.rng.one_in(2) {
            crate::psci::call(0x8400_0000, 0, 0, 0);
            virtual_exited = true;
        }
        let mut watch = WATCH_ACTIVE;
        if physical {
            watch |= WATCH_PHYSICAL;
        }
        if virtual_exited {
            watch |= WATCH_VIRTUAL;
        }
        STALE_TIMER[self.cpu].store(0, Ordering::Relaxed);
        TIMER_WATCH[self.cpu].store(watch, Ordering::Relaxed);
        let until = read_sysreg!("cntvct_el0") + frequency / 3333;
        // SAFETY: unmasking IRQ and FIQ: the hook acknowledges and completes
        // every interrupt and silences its source.
        unsafe { asm!("msr daifclr, #3", options(nostack)) };
        while read_sysreg!("cntvct_el0") < until {
            core::hint::spin_loop();
        }
        // SAFETY: masking interrupts again.
        unsafe { asm!("msr daifset, #3", options(nostack)) };
        TIMER_WATCH[self.cpu].store(0, Ordering::Relaxed);
        write_sysreg!("cntv_ctl_el0", 0);
        if physical {
            write_sysreg!("cntp_ctl_el0", 0);
        }
        let stale = STALE_TIMER[self.cpu].swap(0, Ordering::Relaxed);
        if stale != 0 {
            self.violation(
                "timer interrupt taken while its timer did not assert it",
                stale >> 32,
                stale & 0xffff_ffff,
            );
        }
    }

    /// The GIC CPU interface family (see the module docs); without `icc`,
    /// an interrupt operation.
    fn icc_op(&mut self) {
        if !self.allows(FuzzOptions::ALLOW_ICC) {
            return self.interrupt_op();
        }
        if self.layout.is_gicv2() {
            return self.gicc_family();
        }
        let wide = self.allows(FuzzOptions::ALLOW_ICC_WIDE);
        for _ in 0..2 + self.rng.below(4) {
            let binary_point = if wide && self.rng.one_in(2) {
                self.rng.next() | 8
            } else {
                self.rng.below(8)
            };
            match self.rng.below(7) {
                0 => write_sysreg!("icc_bpr0_el1", binary_point),
                1 => write_sysreg!("icc_bpr1_el1", binary_point),
                // CBPR only: EOImode 1 would need ICC_DIR_EL1 in the hook.
                2 => write_sysreg!("icc_ctlr_el1", self.rng.below(2)),
                3 => {
                    write_sysreg!("icc_pmr_el1", 0xff);
                    let implemented = read_sysreg!("icc_pmr_el1");
                    let value = self.rng.below(256);
                    write_sysreg!("icc_pmr_el1", value);
                    let read = read_sysreg!("icc_pmr_el1");
                    if read != value & implemented {
                        self.violation("ICC_PMR_EL1 did not read back as written", value, read);
                    }
                }
                4 => {
                    write_sysreg!("icc_igrpen1_el1", self.rng.below(2));
                    write_sysreg!("icc_igrpen0_el1", self.rng.below(2));
                }
                5 => {
                    let ack = read_sysreg!("icc_iar1_el1");
                    if gic::is_interrupt((ack & 0xff_ffff) as u32) {
                        write_sysreg!("icc_eoir1_el1", ack);
                    }
                }
                _ => {
                    let _ = read_sysreg!("icc_rpr_el1");
                    let _ = read_sysreg!("icc_hppir1_el1");
                    let _ = read_sysreg!("icc_bpr0_el1");
                    let _ = read_sysreg!("icc_bpr1_el1");
                    let _ = read_sysreg!("icc_ctlr_el1");
                }
            }
        }
        // The interrupt operations set the interface up again; the mask
        // goes back now so that other vCPUs' SGIs still reach this one.
        gic::set_priority_mask(0xff);
    }

    /// The `icc` family on a GICv2: two to five random accesses to the
    /// memory-mapped `GICC`: `BPR` and `ABPR` (3-bit values; with
    /// `icc-wide` also values with the reserved bits above the field set),
    /// `CTLR.CBPR`, `PMR` (must read back as written, less the
    /// unimplemented priority bits), the `CTLR` group enables, a `GICC_IAR`
    /// read completed by `GICC_EOIR`, and reads of `RPR`, `HPPIR`, `BPR`,
    /// `ABPR` and `CTLR`. `AckCtl` stays set, `FIQEn` and `EOImode` clear.
    fn gicc_family(&mut self) {
        let gicc = self.layout.gicc;
        let wide = self.allows(FuzzOptions::ALLOW_ICC_WIDE);
        let keep = GICC_CTLR_ENABLE_GRP0 | GICC_CTLR_ENABLE_GRP1 | GICC_CTLR_CBPR;
        for _ in 0..2 + self.rng.below(4) {
            let binary_point = if wide && self.rng.one_in(2) {
                (self.rng.next() as u32) | 8
            } else {
                self.rng.below(8) as u32
            };
            let ctlr = mmio_read32(gicc + GICC_CTLR) & keep;
            match self.rng.below(7) {
                0 => mmio_write32(gicc + GICC_BPR, binary_point),
                1 => mmio_write32(gicc + GICC_ABPR, binary_point),
                2 => {
                    let cbpr = if self.rng.one_in(2) {
                        GICC_CTLR_CBPR
                    } else {
                        0
                    };
                    mmio_write32(
                        gicc + GICC_CTLR,
                        (ctlr & !GICC_CTLR_CBPR) | cbpr | GICC_CTLR_ACK_CTL,
                    );
                }
                3 => {
                    mmio_write32(gicc + GICC_PMR, 0xff);
                    let implemented = mmio_read32(gicc + GICC_PMR);
                    let value = self.rng.below(256) as u32;
                    mmio_write32(gicc + GICC_PMR, value);
                    let read = mmio_read32(gicc + GICC_PMR);
                    if read != value & implemented {
                        self.violation(
                            "GICC_PMR did not read back as written",
                            value.into(),
                            read.into(),
                        );
                    }
                }
                4 => {
                    let groups = (self.rng.below(4) as u32)
                        & (GICC_CTLR_ENABLE_GRP0 | GICC_CTLR_ENABLE_GRP1);
                    mmio_write32(
                        gicc + GICC_CTLR,
                        (ctlr & GICC_CTLR_CBPR) | groups | GICC_CTLR_ACK_CTL,
                    );
                }
                5 => {
                    let ack = mmio_read32(gicc + GICC_IAR);
                    if gic::is_interrupt(ack & 0x3ff) {
                        mmio_write32(gicc + GICC_EOIR, ack);
                    }
                }
                _ => {
                    for offset in [GICC_RPR, GICC_HPPIR, GICC_BPR, GICC_ABPR, GICC_CTLR] {
                        let _ = mmio_read32(gicc + offset);
                    }
                }
            }
        }
        gic::set_priority_mask(0xff);
    }

    /// Sets up the GIC for an SGI or the timer on this vCPU, raises it and
    /// waits for it; one retry before a violation.
    fn interrupt_op(&mut self) {
        let intid = if self.rng.one_in(3) {
            TIMER_INTID
        } else {
            self.rng.below(16) as u32
        };
        for attempt in 0..2 {
            if self.raise_and_wait(intid) {
                return;
            }
            if attempt == 1 {
                self.violation("interrupt not delivered", u64::from(intid), 0);
                self.dump_interrupt_state(intid);
            }
        }
    }

    /// Prints the CPU interface and redistributor state behind an interrupt
    /// that did not arrive (the first two times per vCPU).
    fn dump_interrupt_state(&mut self, intid: u32) {
        static DUMPS: [AtomicU32; FUZZ_CPUS] = [const { AtomicU32::new(0) }; FUZZ_CPUS];
        if DUMPS[self.cpu].fetch_add(1, Ordering::Relaxed) >= 2 {
            return;
        }
        if self.layout.is_gicv2() {
            let (gicc, gicd) = (self.layout.gicc, self.layout.gicd);
            println!(
                "FUZZ: vcpu{} INTID {intid}: GICC RPR {:#x} HPPIR {:#x} APR0 {:#x} PMR {:#x} \
                 CTLR {:#x} BPR {:#x} | GICD bank ISENABLER0 {:#x} ISPENDR0 {:#x} ISACTIVER0 \
                 {:#x} IGROUPR0 {:#x} | GICD_CTLR {:#x} SPI ISACTIVER {:#x} ISPENDR {:#x} \
                 ISENABLER {:#x}",
                self.cpu,
                mmio_read32(gicc + GICC_RPR),
                mmio_read32(gicc + GICC_HPPIR),
                mmio_read32(gicc + GICC_APR0),
                mmio_read32(gicc + GICC_PMR),
                mmio_read32(gicc + GICC_CTLR),
                mmio_read32(gicc + GICC_BPR),
                mmio_read32(gicd + 0x100),
                mmio_read32(gicd + 0x200),
                mmio_read32(gicd + 0x300),
                mmio_read32(gicd + 0x080),
                mmio_read32(gicd),
                mmio_read32(gicd + 0x304),
                mmio_read32(gicd + 0x204),
                mmio_read32(gicd + 0x104),
            );
            return;
        }
        let sgi_base = self.layout.gicr + self.cpu as u64 * fuzz_model::GICR_STRIDE + 0x1_0000;
        println!(
            "FUZZ: vcpu{} INTID {intid}: RPR {:#x} HPPIR1 {:#x} AP1R0 {:#x} PMR {:#x} IGRPEN1 {:#x} \
             CTLR {:#x} | GICR ISENABLER0 {:#x} ISPENDR0 {:#x} ISACTIVER0 {:#x} IGROUPR0 {:#x} \
             WAKER {:#x} | GICD_CTLR {:#x} SPI ISACTIVER {:#x} {:#x} ISPENDR {:#x} {:#x} \
             ISENABLER {:#x} {:#x} IGROUPR {:#x} {:#x} | HPPIR0 {:#x}",
            self.cpu,
            read_sysreg!("icc_rpr_el1"),
            read_sysreg!("icc_hppir1_el1"),
            read_sysreg!("icc_ap1r0_el1"),
            read_sysreg!("icc_pmr_el1"),
            read_sysreg!("icc_igrpen1_el1"),
            read_sysreg!("icc_ctlr_el1"),
            mmio_read32(sgi_base + 0x100),
            mmio_read32(sgi_base + 0x200),
            mmio_read32(sgi_base + 0x300),
            mmio_read32(sgi_base + 0x080),
            mmio_read32(sgi_base - 0x1_0000 + 0x14),
            mmio_read32(self.layout.gicd),
            mmio_read32(self.layout.gicd + 0x304),
            mmio_read32(self.layout.gicd + 0x308),
            mmio_read32(self.layout.gicd + 0x204),
            mmio_read32(self.layout.gicd + 0x208),
            mmio_read32(self.layout.gicd + 0x104),
            mmio_read32(self.layout.gicd + 0x108),
            mmio_read32(self.layout.gicd + 0x084),
            mmio_read32(self.layout.gicd + 0x088),
            read_sysreg!("icc_hppir0_el1"),
        );
    }

    fn raise_and_wait(&mut self, intid: u32) -> bool {
        let l = self.layout;
        let rd = l.gicr + self.cpu as u64 * fuzz_model::GICR_STRIDE;
        let own = Bank::Redistributor(self.cpu);
        let bit = 1u32 << intid;
        if !l.is_gicv2() {
            mmio_write32(rd + GICR_WAKER, 0); // awake
        }
        gic::set_group1(own, intid);
        // ICACTIVER0: the INTID, or (see ALLOW_KEEP_ACTIVE) every private
        // interrupt, which pile up in the active state like SPIs.
        let keep = self.allows(FuzzOptions::ALLOW_KEEP_ACTIVE);
        gic::write_bits(own, ICACTIVER, intid, if keep { bit } else { u32::MAX });
        gic::set_priority(own, intid, PRIORITY);
        if intid == TIMER_INTID {
            gic::write_bits(own, ICPENDR, intid, bit); // no stale edge state
        }
        gic::write_bits(own, ISENABLER, intid, bit);
        self.cpu_interface_on();
        if !self.allows(FuzzOptions::ALLOW_KEEP_ACTIVE) {
            // SPIs pile up in the active state over a long run (see
            // ALLOW_KEEP_ACTIVE): deactivate them all, as a guest may.
            let typer = SETTINGS.gicd_typer.load(Ordering::Relaxed);
            for word in 1..=(typer & 0x1f) as u32 {
                gic::write_bits(Bank::Distributor, ICACTIVER, 32 * word, u32::MAX);
            }
        }
        if !self.allows(FuzzOptions::ALLOW_GROUP0_OFF) {
            // Random distributor writes leave group-0 SPIs pending here; the
            // hypervisor lists them by priority even while group 0 is off,
            // which could starve group 1 (see ALLOW_GROUP0_OFF).
            self.group0_on();
        }
        let before = IRQS[self.cpu][intid as usize].load(Ordering::Relaxed);
        if intid == TIMER_INTID {
            let now = read_sysreg!("cntvct_el0");
            let frequency = read_sysreg!("cntfrq_el0");
            write_sysreg!("cntv_cval_el0", now + frequency / 1000);
            write_sysreg!("cntv_ctl_el0", 1);
        } else {
            gic::send_sgi_to_self(intid);
        }
        let deadline = Deadline::after_seconds(2);
        // SAFETY: unmasking IRQ and FIQ: the hook acknowledges and completes
        // every interrupt and silences its source.
        unsafe { asm!("msr daifclr, #3", options(nostack)) };
        let delivered = loop {
            if IRQS[self.cpu][intid as usize].load(Ordering::Relaxed) != before {
                break true;
            }
            if deadline.passed() {
                break false;
            }
            core::hint::spin_loop();
        };
        // SAFETY: masking interrupts again.
        unsafe { asm!("msr daifset, #3", options(nostack)) };
        write_sysreg!("cntv_ctl_el0", 0);
        delivered
    }
}

/// Writes the physical (`CNTP_*`) or virtual (`CNTV_*`) timer: `CVAL` or
/// `TVAL` when given, then `CTL`.
fn set_timer(physical: bool, cval: Option<u64>, tval: Option<u64>, ctl: u64) {
    if physical {
        if let Some(cval) = cval {
            write_sysreg!("cntp_cval_el0", cval);
        }
        if let Some(tval) = tval {
            write_sysreg!("cntp_tval_el0", tval);
        }
        write_sysreg!("cntp_ctl_el0", ctl);
    } else {
        if let Some(cval) = cval {
            write_sysreg!("cntv_cval_el0", cval);
        }
        if let Some(tval) = tval {
            write_sysreg!("cntv_tval_el0", tval);
        }
        write_sysreg!("cntv_ctl_el0", ctl);
    }
}

/// First virtual address of `cpu`'s window.
fn window_va(cpu: usize) -> u64 {
    ((WINDOW_INDEX + cpu) as u64) << 30
}

impl Ctx {
    /// Points this vCPU's window at `descriptor` (a level-1 block or table).
    fn set_window(&self, descriptor: u64) {
        crate::mmu::level1()[WINDOW_INDEX + self.cpu].store(descriptor, Ordering::Relaxed);
        let page = window_va(self.cpu) >> 12;
        // SAFETY: only this vCPU uses its window, so a local invalidation of
        // the window's translations (walk caches included) suffices.
        unsafe {
            asm!("dsb ishst", "tlbi vaae1, {}", "dsb nsh", "isb", in(reg) page, options(nostack))
        };
    }

    /// A gigabyte-aligned IPA that is a hole: above the VM's IPA bits when
    /// the stage 1 can output it, else a gigabyte of the 39-bit map without
    /// RAM, devices or the fuzzer's windows.
    fn hole_gigabyte(&mut self) -> u64 {
        let oa = OA_BITS.load(Ordering::Relaxed);
        if oa > VM_IPA_BITS && self.rng.one_in(2) {
            let first = 1u64 << (VM_IPA_BITS - 30);
            let count = (1u64 << (oa - 30)) - first;
            return (first + self.rng.below(count)) << 30;
        }
        let first = (window_va(FUZZ_CPUS) >> 30).max(2);
        (first + self.rng.below(512 - first)) << 30
    }

    /// Accesses through the window: data, instruction fetch, or a walk
    /// through a table that lies in a hole or a device.
    fn window_op(&mut self) {
        const NORMAL_BLOCK: u64 = 0b01 | (1 << 2) | (0b11 << 8) | (1 << 10) | (1 << 54);
        let va = window_va(self.cpu);
        let l = self.layout;
        match self.rng.below(4) {
            0 => {
                // Device gigabyte as Normal memory: unaligned, exclusive and
                // atomic accesses reach the emulated devices.
                self.note = "window: devices as Normal memory";
                self.set_window(NORMAL_BLOCK);
                let size = self.rng.pick(&fuzz_model::SIZES);
                let (address, region, writable) = if self.rng.one_in(3) {
                    // A hole in the device gigabyte (never a device register).
                    let hole = loop {
                        let address = self.rng.below(1 << 30) & !15;
                        if l.is_hole(address, 16) {
                            break address;
                        }
                    };
                    (hole, Region::Hole, true)
                } else {
                    self.device_target(size)
                };
                let address = address
                    + if self.rng.one_in(2) {
                        self.rng.below(4)
                    } else {
                        0
                    };
                let (words, kind, writes) = self.memory_words(size);
                let word = if writes && !writable {
                    fuzz_model::ldst(true, size, 0, 2)
                } else {
                    words[0]
                };
                let mut block = self.block();
                block.x[2] = va + address;
                block.x[0] = b'a' as u64 + self.rng.below(26);
                block.x[1] = block.x[0];
                block.x[3] = block.x[0];
                let outcome = self.run(&[word], &block);
                // Acquire/release and exclusives must be aligned (else an
                // alignment fault comes first).
                let aligned = address.is_multiple_of(1 << size);
                let single = matches!(kind, "ldr" | "str")
                    || (aligned && matches!(kind, "ldar" | "stlr" | "ldxr"));
                if region == Region::Hole
                    && single
                    && !(outcome.is_external_abort() && outcome.far == va + address)
                {
                    self.violation(
                        "hole behind a Normal mapping: no external abort at the VA",
                        va + address,
                        outcome.esr,
                    );
                }
            }
            1 => {
                self.note = "window: data in a hole gigabyte";
                let target = self.hole_gigabyte();
                self.set_window(target | NORMAL_BLOCK);
                let size = self.rng.pick(&fuzz_model::SIZES);
                let (words, _, _) = self.memory_words(size);
                let offset = self.rng.below(1 << 30) & !15;
                let mut block = self.block();
                block.x[2] = va + offset;
                let outcome = self.run(&words, &block);
                let done = self.note == "stxr" && outcome.taken == 0 && outcome.out[1] == 1;
                let aborted = outcome.is_external_abort()
                    && (va + offset..va + offset + 16).contains(&outcome.far);
                if !(done || aborted) {
                    self.violation(
                        "access to a hole IPA took no external abort",
                        target + offset,
                        outcome.esr,
                    );
                }
            }
            2 => {
                self.note = "window: instruction fetch";
                let target = if self.rng.one_in(3) {
                    0
                } else {
                    self.hole_gigabyte()
                };
                self.set_window(target | NORMAL_BLOCK);
                let offset = if target == 0 && self.rng.one_in(2) {
                    // Not the GICC window: mapped at stage 2 as Device
                    // memory, a fetch from it is CONSTRAINED UNPREDICTABLE.
                    loop {
                        let (address, region, _) = self.device_target(2);
                        if !matches!(region, Region::Gicc(_)) {
                            break address;
                        }
                    }
                } else {
                    self.rng.below(1 << 30) & !3
                };
                let mut block = self.block();
                block.x[2] = va + offset;
                FETCH_ARMED[self.cpu].store(true, Ordering::Relaxed);
                let outcome = self.run(&[0xd63f_0040], &block); // blr x2
                FETCH_ARMED[self.cpu].store(false, Ordering::Relaxed);
                let ok = outcome.taken == 1
                    && outcome.class() == EC_INSTRUCTION_ABORT_EL1
                    && outcome.esr & 0x3f == DFSC_EXTERNAL
                    && outcome.far == va + offset;
                if !ok {
                    self.violation(
                        "fetch from a hole or device took no external instruction abort",
                        target + offset,
                        outcome.esr,
                    );
                }
            }
            _ => {
                self.note = "window: table walk through a hole or device";
                let table = match self.rng.below(4) {
                    0 => l.uart,
                    1 => l.gicd + (self.rng.below(16) << 12),
                    // GICv2: no redistributor; never the GICC (a walk
                    // would read GICC_IAR).
                    2 if l.is_gicv2() => l.gicd + (self.rng.below(16) << 12),
                    2 => {
                        l.gicr
                            + ((self.cpu as u64 * fuzz_model::GICR_STRIDE)
                                | (self.rng.below(32) << 12))
                    }
                    _ => self.hole_gigabyte() + (self.rng.below(1 << 18) << 12),
                };
                self.set_window(table | 0b11);
                let offset = self.rng.below(1 << 30) & !7;
                let mut block = self.block();
                block.x[2] = va + offset;
                let outcome = self.run(&[fuzz_model::ldst(true, 3, 0, 2)], &block);
                let status = outcome.esr & 0x3f;
                let ok = outcome.taken == 1
                    && outcome.class() == EC_DATA_ABORT_EL1
                    && (status == DFSC_EXTERNAL || (0x14..=0x17).contains(&status))
                    && outcome.far == va + offset;
                if !ok {
                    self.violation(
                        "walk through a hole or device took no external abort",
                        table,
                        outcome.esr,
                    );
                }
            }
        }
        self.set_window(0);
    }
}

fn encoding(reg: SysReg) -> u64 {
    u64::from(reg.op0) << 16
        | u64::from(reg.op1) << 12
        | u64::from(reg.crn) << 8
        | u64::from(reg.crm) << 4
        | u64::from(reg.op2)
}

/// Maps the EL0 window: a level-2 and a level-3 table under level-1 entry
/// `EL0_WINDOW_INDEX`, per vCPU an EL0 read-only executable code page and an
/// EL0 read-write data page (both never executable at EL1).
fn map_el0_window(l1: &[AtomicU64; 512], cpus: usize) {
    const VALID_TABLE: u64 = 0b11;
    const PAGE_DESC: u64 = 0b11 | (1 << 2) | (0b11 << 8) | (1 << 10) | (1 << 53);
    const AP_EL0_RW: u64 = 0b01 << 6;
    const AP_RO: u64 = 0b11 << 6;
    const UXN: u64 = 1 << 54;
    let l2 = (&raw mut EL0_L2) as u64;
    let l3 = (&raw mut EL0_L3) as u64;
    for cpu in 0..cpus {
        let code = el0_page(2 * cpu);
        let data = el0_page(2 * cpu + 1);
        let hole = EL0_HOLE_IPA + (cpu * PAGE) as u64;
        let entries = (&raw mut EL0_L3).cast::<u64>();
        // SAFETY: the tables are this module's statics, not yet in use (the
        // window's entry still points elsewhere) and written only here; the
        // indexes are below 2 * FUZZ_CPUS < 512.
        unsafe {
            entries.add(2 * cpu).write(code | PAGE_DESC | AP_RO);
            entries
                .add(2 * cpu + 1)
                .write(data | PAGE_DESC | AP_EL0_RW | UXN);
            entries
                .add(EL0_HOLE_INDEX + cpu)
                .write(hole | PAGE_DESC | AP_EL0_RW | UXN);
        }
    }
    // SAFETY: as above.
    unsafe { (&raw mut EL0_L2).cast::<u64>().write(l3 | VALID_TABLE) };
    l1[EL0_WINDOW_INDEX].store(l2 | VALID_TABLE, Ordering::Relaxed);
    // SAFETY: publishing a changed level-1 entry: barrier, invalidate the
    // old block from every vCPU's TLB (only the boot vCPU runs yet).
    unsafe {
        asm!(
            "dsb ishst",
            "tlbi vmalle1is",
            "dsb ish",
            "isb",
            options(nostack)
        )
    };
}

/// Per-vCPU setup: FP/SIMD enabled (random words may be SIMD loads and
/// stores), the redistributor awake and the GIC CPU interface on (the shared
/// driver's `init_cpu`).
fn setup_cpu() -> Result<(), GicError> {
    // Stage-1 output up to the CPU's physical address size (48 bits at
    // most), so the window can name IPAs beyond the VM's.
    let parange = read_sysreg!("id_aa64mmfr0_el1") & 0xf;
    let ips = parange.min(5);
    OA_BITS.store([32, 36, 40, 42, 44, 48][ips as usize], Ordering::Relaxed);
    let tcr = read_sysreg!("tcr_el1");
    write_sysreg!("tcr_el1", (tcr & !(7 << 32)) | (ips << 32));
    // SAFETY: dropping translations made under the old output size.
    unsafe { asm!("tlbi vmalle1", "dsb nsh", "isb", options(nostack)) };
    let cpacr = read_sysreg!("cpacr_el1");
    write_sysreg!("cpacr_el1", cpacr | (0b11 << 20));
    gic::init_cpu(&[])
}

/// Runs the scenario on the boot vCPU.
pub fn run(platform: &Platform, options: FuzzOptions) -> Result<(), Failure> {
    // A GICv3 (distributor and redistributors) or a GICv2 (distributor and
    // CPU interface).
    let Some(frames) = platform.gic else {
        return Err(Failure::NoGic);
    };
    let (gicd, gicr) = (frames.distributor, frames.redistributors);
    let gicc = frames.cpu_interface.unwrap_or(0);
    gic::init_distributor(frames).map_err(|error| Failure::Gic { cpu: 0, error })?;
    let workers = platform.cpus().len().min(FUZZ_CPUS);
    let s = &SETTINGS;
    let ram = platform.ram()[0];
    s.seed.store(options.seed, Ordering::Relaxed);
    s.seeds.store(options.seeds, Ordering::Relaxed);
    s.ops.store(options.ops, Ordering::Relaxed);
    s.allow.store(options.allow, Ordering::Relaxed);
    s.verbose.store(options.verbose, Ordering::Relaxed);
    s.ram_start.store(ram.start, Ordering::Relaxed);
    s.ram_end.store(ram.end, Ordering::Relaxed);
    s.uart.store(platform.uart_base, Ordering::Relaxed);
    s.gicd.store(gicd, Ordering::Relaxed);
    s.gicc.store(gicc, Ordering::Relaxed);
    s.its.store(
        if gicc == 0 {
            platform.its.unwrap_or(0)
        } else {
            0
        },
        Ordering::Relaxed,
    );
    if gicc != 0 {
        s.gicr.store(0, Ordering::Relaxed);
        s.vcpus
            .store(platform.cpus().len() as u64, Ordering::Relaxed);
    } else {
        s.gicr.store(gicr.start, Ordering::Relaxed);
        s.vcpus.store(
            (gicr.len() / fuzz_model::GICR_STRIDE).min(platform.cpus().len() as u64),
            Ordering::Relaxed,
        );
    }
    for (slot, &mpidr) in MPIDRS.iter().zip(platform.cpus()) {
        slot.store(mpidr, Ordering::Relaxed);
    }
    let isar0 = read_sysreg!("id_aa64isar0_el1");
    s.lse.store((isar0 >> 20) & 0xf >= 2, Ordering::Relaxed);
    let pfr0 = read_sysreg!("id_aa64pfr0_el1");
    s.gic_sysregs
        .store((pfr0 >> 24) & 0xf != 0, Ordering::Relaxed);
    let aarch32 = options.allows(FuzzOptions::ALLOW_EL0_AARCH32) && pfr0 & 0xf == 2;
    s.el0_aarch32.store(aarch32, Ordering::Relaxed);
    s.dczid.store(read_sysreg!("dczid_el0"), Ordering::Relaxed);
    s.gicd_typer
        .store(u64::from(mmio_read32(gicd + 4)), Ordering::Relaxed);
    let windows = platform.virtio();
    s.virtio_start.store(
        windows.iter().map(|w| w.window.start).min().unwrap_or(0),
        Ordering::Relaxed,
    );
    s.virtio_end.store(
        windows.iter().map(|w| w.window.end).max().unwrap_or(0),
        Ordering::Relaxed,
    );
    if options.allows(FuzzOptions::ALLOW_VIRTQUEUE) {
        let console = crate::virtio::find_console(platform).ok_or(Failure::NoVirtioConsole)?;
        s.virtio_console.store(console.base, Ordering::Relaxed);
    }
    WORKERS.store(workers, Ordering::Relaxed);
    let mut its = None;
    let its_base = s.its.load(Ordering::Relaxed);
    if (options.allows(FuzzOptions::ALLOW_ITS) || options.allows(FuzzOptions::ALLOW_ITS_ONLY))
        && its_base != 0
        && s.gic_sysregs.load(Ordering::Relaxed)
    {
        // With `its-only` the other vCPUs never unmask IRQs.
        let others_take = !options.allows(FuzzOptions::ALLOW_ITS_ONLY);
        match fuzz_its::setup(platform, its_base, gicr.start, workers, others_take) {
            Ok(family) => its = Some(family),
            Err(what) => {
                println!(
                    "FUZZ: violation seed={} vcpu=0 op=0 (its): {what}",
                    options.seed
                );
                VIOLATIONS[0].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if its.is_none() {
        s.its_family.store(false, Ordering::Relaxed);
    } else {
        s.its_family.store(true, Ordering::Relaxed);
    }
    map_el0_window(crate::mmu::level1(), workers);
    println!(
        "test-guest: fuzz: seeds {}..{} ({} ops per seed and vCPU), {workers} vCPUs, GICv{} \
         (ICC system registers {}), LSE {}, AArch32 EL0 {}, allow {:#x}",
        options.seed,
        options.seed + options.seeds,
        options.ops,
        if gicc != 0 { 2 } else { 3 },
        if s.gic_sysregs.load(Ordering::Relaxed) {
            "yes"
        } else {
            "no"
        },
        if s.lse.load(Ordering::Relaxed) {
            "yes"
        } else {
            "no"
        },
        if aarch32 { "yes" } else { "no" },
        options.allow
    );
    exceptions::take_irqs_for(Scenario::Fuzz);
    ACTIVE.store(true, Ordering::Release);
    smp::start_cpus(platform, 1..workers.min(platform.cpus().len()))?;
    let finished = worker(0, true, its);
    let deadline = Deadline::step();
    let wanted = workers * options.seeds as usize;
    while SEEDS_DONE.load(Ordering::Acquire) < wanted && !deadline.passed() {
        core::hint::spin_loop();
    }
    ACTIVE.store(false, Ordering::Release);
    restore_uart(platform.uart_base);
    let ops: u64 = OPS.iter().map(|o| o.load(Ordering::Relaxed)).sum();
    let violations: u64 = VIOLATIONS.iter().map(|v| v.load(Ordering::Relaxed)).sum();
    if options.allows(FuzzOptions::ALLOW_VIRTQUEUE) {
        println!(
            "FUZZ: virtqueue sent={} guaranteed={} resets={}",
            fuzz_virtqueue::SENT.load(Ordering::Relaxed),
            fuzz_virtqueue::GUARANTEED.load(Ordering::Relaxed),
            fuzz_virtqueue::RESETS.load(Ordering::Relaxed)
        );
    }
    if s.its_family.load(Ordering::Relaxed) {
        println!(
            "FUZZ: its lpis={} vcpu0={} required={}",
            fuzz_its::delivered(),
            fuzz_its::delivered_on(0),
            fuzz_its::REQUIRED.load(Ordering::Relaxed)
        );
    }
    println!(
        "FUZZ: seeds={} ops={ops} violations={violations} interrupts={}",
        options.seeds,
        IRQS.iter()
            .flatten()
            .map(|n| u64::from(n.load(Ordering::Relaxed)))
            .sum::<u64>()
            + OTHER_IRQS.load(Ordering::Relaxed)
    );
    let done = SEEDS_DONE.load(Ordering::Acquire);
    if !finished || done < wanted {
        return Err(Failure::CpuTimedOut {
            arrived: done,
            expected: wanted,
        });
    }
    smp::wait_secondaries_off_up_to(platform, workers)?;
    if violations > 0 {
        return Err(Failure::FuzzViolations { violations });
    }
    Ok(())
}

/// A secondary's part.
pub fn secondary(cpu: usize) {
    if cpu < FUZZ_CPUS {
        worker(cpu, false, None);
    }
}

/// Runs every seed on this vCPU, meeting the others after each; false when
/// the boot vCPU gave up waiting for the others.
fn worker(cpu: usize, boot: bool, its: Option<ItsFuzz>) -> bool {
    if let Err(error) = setup_cpu() {
        println!("FUZZ: vcpu{cpu}: GIC set-up failed: {error:?}");
        VIOLATIONS[cpu].fetch_add(1, Ordering::Relaxed);
    }
    let s = &SETTINGS;
    let workers = WORKERS.load(Ordering::Relaxed);
    let layout = Layout {
        ram: (
            s.ram_start.load(Ordering::Relaxed),
            s.ram_end.load(Ordering::Relaxed),
        ),
        uart: s.uart.load(Ordering::Relaxed),
        gicd: s.gicd.load(Ordering::Relaxed),
        gicr: s.gicr.load(Ordering::Relaxed),
        gicc: s.gicc.load(Ordering::Relaxed),
        vcpus: s.vcpus.load(Ordering::Relaxed),
        its: s.its.load(Ordering::Relaxed),
        virtio: (
            s.virtio_start.load(Ordering::Relaxed),
            s.virtio_end.load(Ordering::Relaxed),
        ),
        reserved: (EL0_WINDOW, window_va(FUZZ_CPUS)),
    };
    let console = s.virtio_console.load(Ordering::Relaxed);
    let virtqueue = (cpu == 0 && console != 0).then(|| {
        VirtqueueFuzz::new(
            crate::virtio::Mmio { base: console },
            layout.ram,
            layout.uart,
            layout.gicd,
        )
    });
    let first = s.seed.load(Ordering::Relaxed);
    let seeds = s.seeds.load(Ordering::Relaxed);
    let ops = s.ops.load(Ordering::Relaxed);
    let mut ctx = Ctx {
        cpu,
        layout,
        allow: s.allow.load(Ordering::Relaxed),
        verbose: s.verbose.load(Ordering::Relaxed),
        lse: s.lse.load(Ordering::Relaxed),
        el0_aarch32: s.el0_aarch32.load(Ordering::Relaxed),
        gic_sysregs: s.gic_sysregs.load(Ordering::Relaxed),
        seed: first,
        op: 0,
        rng: Rng::new(first, cpu as u64),
        scratch: (&raw const SCRATCH) as u64 + (cpu * SCRATCH_SIZE) as u64,
        code: code_page(cpu),
        el0_code_va: EL0_WINDOW + (2 * cpu * PAGE) as u64,
        el0_data_va: EL0_WINDOW + ((2 * cpu + 1) * PAGE) as u64,
        el0_code: el0_page(2 * cpu),
        note: "",
        virtqueue,
        its,
        its_base: if s.its_family.load(Ordering::Relaxed) {
            layout.its
        } else {
            0
        },
    };
    for (index, seed) in (first..first + seeds).enumerate() {
        if boot {
            println!("FUZZ: seed {seed}");
        }
        ctx.seed = seed;
        ctx.rng = Rng::new(seed, cpu as u64);
        if ctx.its.is_some() {
            ctx.note = "its set-up";
            ctx.its_op(true);
        }
        for op in 0..ops {
            ctx.op = op;
            ctx.step();
            OPS[cpu].fetch_add(1, Ordering::Relaxed);
        }
        SEEDS_DONE.fetch_add(1, Ordering::AcqRel);
        let wanted = (index + 1) * workers;
        let deadline = boot.then(Deadline::step);
        while SEEDS_DONE.load(Ordering::Acquire) < wanted {
            if deadline.is_some_and(Deadline::passed) {
                println!("FUZZ: vCPUs did not finish seed {seed} in time");
                return false;
            }
            core::hint::spin_loop();
        }
    }
    true
}

/// Puts the PL011 back the way the console needs it (the fuzzer wrote its
/// control registers) and starts a fresh line.
fn restore_uart(base: u64) {
    const LCR_H: u64 = 0x2c;
    const CR: u64 = 0x30;
    const IMSC: u64 = 0x38;
    mmio_write32(base + IMSC, 0);
    mmio_write32(base + LCR_H, 0x70);
    mmio_write32(base + CR, 0x301);
    println!("test-guest: fuzz: PL011 restored");
}
