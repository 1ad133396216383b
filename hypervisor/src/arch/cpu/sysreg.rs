//! Access to system registers by name.
//!
//! One macro family reaches every system register: `read_sysreg!(name)` and
//! `write_sysreg!(name, value)` expand to a single `mrs`/`msr`; callers state
//! in their `// SAFETY:` comment why a write is sound. `read_sysreg!(name,
//! FIELDS)` reads into a `tock_registers::LocalRegisterCopy` typed by a
//! tock-registers field set (`aarch64_cpu::registers::ICH_VTR_EL2`, ...), so
//! the caller reads named fields instead of shifting and masking; the values
//! written are built from named fields in `crate::sysreg_values`. Barriers
//! are explicit functions.
//!
//! `aarch64-cpu`'s own accessors (`Readable::get`, `Writeable::set`) are not
//! used: its `set` is a safe method whose `asm!` is `nomem`, so the compiler
//! may move memory accesses across a write to `VTTBR_EL2`, `HCR_EL2`,
//! `SCTLR_EL1` or `VBAR_EL2`, and no `unsafe` block asks the writer why the
//! write is sound; `write_sysreg!`'s `msr` is a compiler memory barrier and
//! must sit in an `unsafe` block. Reads go through the same macro so that
//! there is one way to name a register (its assembler name, which also covers
//! the `s3_<op1>_c<n>_c<m>_<op2>` encodings `aarch64-cpu` lacks).

use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// `CTR_EL0` (not in `aarch64-cpu`).
    CTR_EL0 [
        /// `DminLine`: log2 of the smallest data cache line, in 4-byte words.
        DMINLINE OFFSET(16) NUMBITS(4) [],
    ],
    /// `DCZID_EL0` (not in `aarch64-cpu`).
    DCZID_EL0 [
        /// `BS`: log2 of the `DC ZVA` block size, in 4-byte words.
        BS OFFSET(0) NUMBITS(4) [],
        /// `DZP`: `DC ZVA` is prohibited.
        DZP OFFSET(4) NUMBITS(1) [],
    ]
}

/// Reads a system register: `read_sysreg!(name)` gives its `u64` value,
/// `read_sysreg!(name, FIELDS)` a `LocalRegisterCopy<u64, FIELDS::Register>`.
#[macro_export]
macro_rules! read_sysreg {
    ($name:ident) => {{
        let value: u64;
        // SAFETY: reading a system register has no memory side effects.
        unsafe {
            core::arch::asm!(concat!("mrs {}, ", stringify!($name)), out(reg) value, options(nomem, nostack, preserves_flags));
        }
        value
    }};
    ($name:ident, $fields:ident) => {
        tock_registers::LocalRegisterCopy::<u64, $fields::Register>::new($crate::read_sysreg!($name))
    };
}

/// Writes a system register. Must be used inside an `unsafe` block whose
/// `// SAFETY:` comment justifies the write.
#[macro_export]
macro_rules! write_sysreg {
    ($name:ident, $value:expr) => {{
        let value: u64 = $value;
        core::arch::asm!(concat!("msr ", stringify!($name), ", {}"), in(reg) value, options(nostack, preserves_flags));
    }};
}

/// `ISB`.
pub fn isb() {
    // SAFETY: a barrier has no effect besides ordering.
    unsafe { core::arch::asm!("isb", options(nostack, preserves_flags)) }
}

/// `DSB ISH`.
pub fn dsb_ish() {
    // SAFETY: a barrier has no effect besides ordering.
    unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) }
}

/// Cleans the data cache lines covering `[addr, addr + len)` to the point of
/// coherency, so a CPU running with its MMU off sees the data.
pub fn clean_dcache_to_poc(addr: usize, len: usize) {
    let ctr = read_sysreg!(ctr_el0, CTR_EL0);
    let line = 4usize << ctr.read(CTR_EL0::DMINLINE);
    let mut p = addr & !(line - 1);
    while p < addr + len {
        // SAFETY: cleaning a cache line does not change memory contents.
        unsafe { core::arch::asm!("dc cvac, {}", in(reg) p, options(nostack, preserves_flags)) }
        p += line;
    }
    dsb_ish();
}

/// Cleans and invalidates the data cache lines (`line` bytes each) covering
/// `[addr, addr + len)` to the point of coherency (`DC CIVAC`), then waits
/// for them to complete (`DSB SY`): non-cacheable observers see the data and
/// no stale line survives.
pub fn clean_inval_dcache_to_poc(addr: usize, len: usize, line: usize) {
    let mut p = addr & !(line - 1);
    while p < addr + len {
        // SAFETY: clean and invalidate write dirty data back first: memory
        // contents do not change.
        unsafe { core::arch::asm!("dc civac, {}", in(reg) p, options(nostack, preserves_flags)) }
        p += line;
    }
    // SAFETY: a barrier has no effect besides ordering.
    unsafe { core::arch::asm!("dsb sy", options(nostack, preserves_flags)) }
}

/// Cleans the data cache lines covering `[addr, addr + len)` to the point of
/// unification (`DC CVAU`), then `DSB ISH`.
pub fn clean_dcache_to_pou(addr: usize, len: usize, line: usize) {
    let mut p = addr & !(line - 1);
    while p < addr + len {
        // SAFETY: cleaning a cache line does not change memory contents.
        unsafe { core::arch::asm!("dc cvau, {}", in(reg) p, options(nostack, preserves_flags)) }
        p += line;
    }
    dsb_ish();
}

/// Invalidates the instruction cache lines covering `[addr, addr + len)` to
/// the point of unification (`IC IVAU`), then `DSB ISH; ISB`.
pub fn invalidate_icache_range(addr: usize, len: usize, line: usize) {
    let mut p = addr & !(line - 1);
    while p < addr + len {
        // SAFETY: invalidating instruction cache lines only discards cached
        // instructions.
        unsafe { core::arch::asm!("ic ivau, {}", in(reg) p, options(nostack, preserves_flags)) }
        p += line;
    }
    dsb_ish();
    isb();
}

/// Invalidates all instruction caches of the inner shareable domain to the
/// point of unification (`IC IALLUIS`), then `DSB ISH; ISB`.
pub fn invalidate_icache_all() {
    // SAFETY: invalidating instruction caches only discards cached instructions.
    unsafe {
        core::arch::asm!(
            "ic ialluis",
            "dsb ish",
            "isb",
            options(nostack, preserves_flags)
        )
    };
}

/// Zeroes `[addr, addr + len)` (normal cacheable memory), with `DC ZVA`
/// where the CPU permits it (`DCZID_EL0.DZP` clear) for the whole blocks,
/// and plain stores for the unaligned ends.
///
/// With allocation tags on (`memory_tagging::enabled`) the range's tags are
/// zeroed too (`DC GZVA`, see `memory_tagging`): a guest page never carries
/// the tags of an earlier owner.
pub fn zero_memory(addr: usize, len: usize) {
    let dczid = read_sysreg!(dczid_el0, DCZID_EL0);
    let block = 4usize << dczid.read(DCZID_EL0::BS);
    let permitted = !dczid.is_set(DCZID_EL0::DZP);
    if super::memory_tagging::enabled() {
        // DZP prohibits DC GZVA as well: granule by granule then.
        super::memory_tagging::zero_with_tags(addr, len, permitted.then_some(block));
        dsb_ish();
        return;
    }
    let end = addr + len;
    let first = addr.next_multiple_of(block).min(end);
    let last = if permitted { end & !(block - 1) } else { first };
    let zero_bytes = |from: usize, to: usize| {
        if to > from {
            // SAFETY: the caller owns the range; it is mapped as normal memory.
            unsafe { core::ptr::write_bytes(from as *mut u8, 0, to - from) }
        }
    };
    zero_bytes(addr, first);
    if last > first {
        let mut p = first;
        while p < last {
            // SAFETY: DC ZVA zeroes one aligned block inside the caller's range.
            unsafe { core::arch::asm!("dc zva, {}", in(reg) p, options(nostack, preserves_flags)) }
            p += block;
        }
        zero_bytes(last, end);
    } else {
        zero_bytes(first, end);
    }
    dsb_ish();
}

/// Reads the ID register `S3_0_C0_C<crm>_<op2>` (`crm` 1..=7, `op2` 0..=7:
/// the ID space, where unallocated encodings read as zero); `None` outside it.
pub fn read_id_register(crm: u8, op2: u8) -> Option<u64> {
    Some(match (crm, op2) {
        (1, 0) => read_sysreg!(s3_0_c0_c1_0),
        (1, 1) => read_sysreg!(s3_0_c0_c1_1),
        (1, 2) => read_sysreg!(s3_0_c0_c1_2),
        (1, 3) => read_sysreg!(s3_0_c0_c1_3),
        (1, 4) => read_sysreg!(s3_0_c0_c1_4),
        (1, 5) => read_sysreg!(s3_0_c0_c1_5),
        (1, 6) => read_sysreg!(s3_0_c0_c1_6),
        (1, 7) => read_sysreg!(s3_0_c0_c1_7),
        (2, 0) => read_sysreg!(s3_0_c0_c2_0),
        (2, 1) => read_sysreg!(s3_0_c0_c2_1),
        (2, 2) => read_sysreg!(s3_0_c0_c2_2),
        (2, 3) => read_sysreg!(s3_0_c0_c2_3),
        (2, 4) => read_sysreg!(s3_0_c0_c2_4),
        (2, 5) => read_sysreg!(s3_0_c0_c2_5),
        (2, 6) => read_sysreg!(s3_0_c0_c2_6),
        (2, 7) => read_sysreg!(s3_0_c0_c2_7),
        (3, 0) => read_sysreg!(s3_0_c0_c3_0),
        (3, 1) => read_sysreg!(s3_0_c0_c3_1),
        (3, 2) => read_sysreg!(s3_0_c0_c3_2),
        (3, 3) => read_sysreg!(s3_0_c0_c3_3),
        (3, 4) => read_sysreg!(s3_0_c0_c3_4),
        (3, 5) => read_sysreg!(s3_0_c0_c3_5),
        (3, 6) => read_sysreg!(s3_0_c0_c3_6),
        (3, 7) => read_sysreg!(s3_0_c0_c3_7),
        (4, 0) => read_sysreg!(s3_0_c0_c4_0),
        (4, 1) => read_sysreg!(s3_0_c0_c4_1),
        (4, 2) => read_sysreg!(s3_0_c0_c4_2),
        (4, 3) => read_sysreg!(s3_0_c0_c4_3),
        (4, 4) => read_sysreg!(s3_0_c0_c4_4),
        (4, 5) => read_sysreg!(s3_0_c0_c4_5),
        (4, 6) => read_sysreg!(s3_0_c0_c4_6),
        (4, 7) => read_sysreg!(s3_0_c0_c4_7),
        (5, 0) => read_sysreg!(s3_0_c0_c5_0),
        (5, 1) => read_sysreg!(s3_0_c0_c5_1),
        (5, 2) => read_sysreg!(s3_0_c0_c5_2),
        (5, 3) => read_sysreg!(s3_0_c0_c5_3),
        (5, 4) => read_sysreg!(s3_0_c0_c5_4),
        (5, 5) => read_sysreg!(s3_0_c0_c5_5),
        (5, 6) => read_sysreg!(s3_0_c0_c5_6),
        (5, 7) => read_sysreg!(s3_0_c0_c5_7),
        (6, 0) => read_sysreg!(s3_0_c0_c6_0),
        (6, 1) => read_sysreg!(s3_0_c0_c6_1),
        (6, 2) => read_sysreg!(s3_0_c0_c6_2),
        (6, 3) => read_sysreg!(s3_0_c0_c6_3),
        (6, 4) => read_sysreg!(s3_0_c0_c6_4),
        (6, 5) => read_sysreg!(s3_0_c0_c6_5),
        (6, 6) => read_sysreg!(s3_0_c0_c6_6),
        (6, 7) => read_sysreg!(s3_0_c0_c6_7),
        (7, 0) => read_sysreg!(s3_0_c0_c7_0),
        (7, 1) => read_sysreg!(s3_0_c0_c7_1),
        (7, 2) => read_sysreg!(s3_0_c0_c7_2),
        (7, 3) => read_sysreg!(s3_0_c0_c7_3),
        (7, 4) => read_sysreg!(s3_0_c0_c7_4),
        (7, 5) => read_sysreg!(s3_0_c0_c7_5),
        (7, 6) => read_sysreg!(s3_0_c0_c7_6),
        (7, 7) => read_sysreg!(s3_0_c0_c7_7),
        _ => return None,
    })
}

/// Waits for an event (`WFE`).
pub fn wait_for_event() {
    // SAFETY: WFE only suspends the CPU until an event.
    unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) }
}

/// Sends an event to all CPUs (`SEV`).
pub fn send_event() {
    // SAFETY: SEV only signals other CPUs waiting in WFE.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nostack, preserves_flags)) }
}

/// The affinity fields of `MPIDR_EL1` (Aff3..Aff0) of the running CPU.
pub fn current_mpidr() -> u64 {
    read_sysreg!(mpidr_el1) & 0xff_00ff_ffff
}
