//! Access to system registers by name.
//!
//! `read_sysreg!(NAME)` and `write_sysreg!(NAME, value)` expand to a single
//! `mrs`/`msr`; callers state in their `// SAFETY:` comment why the access is
//! sound where it changes machine state. Barriers are explicit functions.

/// Reads a system register.
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
    let ctr = read_sysreg!(ctr_el0);
    let line = 4usize << ((ctr >> 16) & 0xf);
    let mut p = addr & !(line - 1);
    while p < addr + len {
        // SAFETY: cleaning a cache line does not change memory contents.
        unsafe { core::arch::asm!("dc cvac, {}", in(reg) p, options(nostack, preserves_flags)) }
        p += line;
    }
    dsb_ish();
}

/// Zeroes `[addr, addr + len)` (normal cacheable memory), with `DC ZVA`
/// where the CPU permits it (`DCZID_EL0.DZP` clear) for the whole blocks,
/// and plain stores for the unaligned ends.
pub fn zero_memory(addr: usize, len: usize) {
    let dczid = read_sysreg!(dczid_el0);
    let block = 4usize << (dczid & 0xf);
    let permitted = dczid & (1 << 4) == 0;
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
