//! A known pattern in the SVE registers, set before and checked after a
//! live migration (`migrate`): the test guest is soft-float, so nothing it
//! runs touches `z0..z31`, `p0..p15` or `FFR` in between, and whatever they
//! hold afterwards was carried (or lost) by the hypervisor.

use core::arch::asm;

/// Longest SVE vector, in bytes (2048 bits).
const MAX_VL: usize = 256;

#[repr(C, align(16))]
struct Vectors([u8; 32 * MAX_VL]);

#[repr(C, align(16))]
struct Predicates([u8; 17 * MAX_VL / 8]);

static mut WANT_Z: Vectors = Vectors([0; 32 * MAX_VL]);
static mut WANT_P: Predicates = Predicates([0; 17 * MAX_VL / 8]);
static mut GOT_Z: Vectors = Vectors([0; 32 * MAX_VL]);
static mut GOT_P: Predicates = Predicates([0; 17 * MAX_VL / 8]);

/// `ZCR_EL1` the pattern sets: the longest vector the hypervisor allows.
const ZCR_EL1: u64 = 0xf;

/// Whether the CPU has SVE (`ID_AA64PFR0_EL1.SVE`).
pub fn sve_present() -> bool {
    let pfr0: u64;
    // SAFETY: reads an ID register.
    unsafe { asm!("mrs {}, id_aa64pfr0_el1", out(reg) pfr0, options(nomem, nostack)) };
    (pfr0 >> 32) & 0xf != 0
}

/// The vector length in bytes.
fn vl() -> usize {
    let vl: u64;
    // SAFETY: SVE is enabled (`enable`) before this runs.
    unsafe { asm!(".arch_extension sve", "rdvl {}, #1", out(reg) vl, options(nomem, nostack)) };
    vl as usize
}

/// Turns on FP/SIMD and SVE at EL1 and EL0 and asks for the longest vectors.
fn enable() {
    // SAFETY: CPACR_EL1.FPEN (21:20) and ZEN (17:16) = 0b11 stop trapping
    // FP/SIMD and SVE; ZCR_EL1 picks the vector length. Nothing of the guest
    // lives in these registers yet.
    unsafe {
        asm!(
            "mrs {t}, cpacr_el1",
            "orr {t}, {t}, #(3 << 20)",
            "orr {t}, {t}, #(3 << 16)",
            "msr cpacr_el1, {t}",
            "isb",
            "msr s3_0_c1_c2_0, {zcr}",
            "isb",
            t = out(reg) _,
            zcr = in(reg) ZCR_EL1,
            options(nostack)
        );
    }
}

fn pattern_byte(register: usize, byte: usize) -> u8 {
    (register.wrapping_mul(31) ^ byte.wrapping_mul(7) ^ 0x5a) as u8
}

/// Loads every vector and predicate register and FFR with the pattern.
/// Returns the vector length.
pub fn fill() -> usize {
    enable();
    let vl = vl().min(MAX_VL);
    let plen = vl / 8;
    // SAFETY: only this vCPU uses the buffers; in bounds for `vl <= MAX_VL`.
    unsafe {
        let z = &raw mut WANT_Z.0;
        let p = &raw mut WANT_P.0;
        for register in 0..32 {
            for byte in 0..vl {
                (*z)[register * vl + byte] = pattern_byte(register, byte);
            }
        }
        for register in 0..16 {
            for byte in 0..plen {
                (*p)[register * plen + byte] = pattern_byte(register + 32, byte);
            }
        }
        // FFR: a first-fault register holds a true prefix; the first 5 lanes.
        for byte in 0..plen {
            (*p)[16 * plen + byte] = 0;
        }
        (*p)[16 * plen] = 0x1f;
        let (zb, pb) = ((&raw const WANT_Z) as u64, (&raw const WANT_P) as u64);
        asm!(
            ".arch_extension sve",
            "add {ffr}, {p}, {plen}, lsl #4",
            "ldr p0, [{ffr}]",
            "wrffr p0.b",
            "ldr p0, [{p}, #0, MUL VL]", "ldr p1, [{p}, #1, MUL VL]",
            "ldr p2, [{p}, #2, MUL VL]", "ldr p3, [{p}, #3, MUL VL]",
            "ldr p4, [{p}, #4, MUL VL]", "ldr p5, [{p}, #5, MUL VL]",
            "ldr p6, [{p}, #6, MUL VL]", "ldr p7, [{p}, #7, MUL VL]",
            "ldr p8, [{p}, #8, MUL VL]", "ldr p9, [{p}, #9, MUL VL]",
            "ldr p10, [{p}, #10, MUL VL]", "ldr p11, [{p}, #11, MUL VL]",
            "ldr p12, [{p}, #12, MUL VL]", "ldr p13, [{p}, #13, MUL VL]",
            "ldr p14, [{p}, #14, MUL VL]", "ldr p15, [{p}, #15, MUL VL]",
            "ldr z0, [{z}, #0, MUL VL]", "ldr z1, [{z}, #1, MUL VL]",
            "ldr z2, [{z}, #2, MUL VL]", "ldr z3, [{z}, #3, MUL VL]",
            "ldr z4, [{z}, #4, MUL VL]", "ldr z5, [{z}, #5, MUL VL]",
            "ldr z6, [{z}, #6, MUL VL]", "ldr z7, [{z}, #7, MUL VL]",
            "ldr z8, [{z}, #8, MUL VL]", "ldr z9, [{z}, #9, MUL VL]",
            "ldr z10, [{z}, #10, MUL VL]", "ldr z11, [{z}, #11, MUL VL]",
            "ldr z12, [{z}, #12, MUL VL]", "ldr z13, [{z}, #13, MUL VL]",
            "ldr z14, [{z}, #14, MUL VL]", "ldr z15, [{z}, #15, MUL VL]",
            "ldr z16, [{z}, #16, MUL VL]", "ldr z17, [{z}, #17, MUL VL]",
            "ldr z18, [{z}, #18, MUL VL]", "ldr z19, [{z}, #19, MUL VL]",
            "ldr z20, [{z}, #20, MUL VL]", "ldr z21, [{z}, #21, MUL VL]",
            "ldr z22, [{z}, #22, MUL VL]", "ldr z23, [{z}, #23, MUL VL]",
            "ldr z24, [{z}, #24, MUL VL]", "ldr z25, [{z}, #25, MUL VL]",
            "ldr z26, [{z}, #26, MUL VL]", "ldr z27, [{z}, #27, MUL VL]",
            "ldr z28, [{z}, #28, MUL VL]", "ldr z29, [{z}, #29, MUL VL]",
            "ldr z30, [{z}, #30, MUL VL]", "ldr z31, [{z}, #31, MUL VL]",
            z = in(reg) zb,
            p = in(reg) pb,
            plen = in(reg) plen as u64,
            ffr = out(reg) _,
            options(nostack, readonly)
        );
    }
    vl
}

/// Stores the registers and compares them with the pattern [`fill`] set:
/// `Err((what, register))` names the first that differs (`what`: 0 `z`,
/// 1 `p`, 2 `FFR`, 3 `ZCR_EL1`).
pub fn check(vl: usize) -> Result<(), (u8, usize)> {
    let plen = vl / 8;
    // SAFETY: only this vCPU uses the buffers; the stores stay within them
    // for `vl <= MAX_VL`; SVE is enabled (`fill`).
    unsafe {
        let (zb, pb) = ((&raw mut GOT_Z) as u64, (&raw mut GOT_P) as u64);
        asm!(
            ".arch_extension sve",
            "str z0, [{z}, #0, MUL VL]", "str z1, [{z}, #1, MUL VL]",
            "str z2, [{z}, #2, MUL VL]", "str z3, [{z}, #3, MUL VL]",
            "str z4, [{z}, #4, MUL VL]", "str z5, [{z}, #5, MUL VL]",
            "str z6, [{z}, #6, MUL VL]", "str z7, [{z}, #7, MUL VL]",
            "str z8, [{z}, #8, MUL VL]", "str z9, [{z}, #9, MUL VL]",
            "str z10, [{z}, #10, MUL VL]", "str z11, [{z}, #11, MUL VL]",
            "str z12, [{z}, #12, MUL VL]", "str z13, [{z}, #13, MUL VL]",
            "str z14, [{z}, #14, MUL VL]", "str z15, [{z}, #15, MUL VL]",
            "str z16, [{z}, #16, MUL VL]", "str z17, [{z}, #17, MUL VL]",
            "str z18, [{z}, #18, MUL VL]", "str z19, [{z}, #19, MUL VL]",
            "str z20, [{z}, #20, MUL VL]", "str z21, [{z}, #21, MUL VL]",
            "str z22, [{z}, #22, MUL VL]", "str z23, [{z}, #23, MUL VL]",
            "str z24, [{z}, #24, MUL VL]", "str z25, [{z}, #25, MUL VL]",
            "str z26, [{z}, #26, MUL VL]", "str z27, [{z}, #27, MUL VL]",
            "str z28, [{z}, #28, MUL VL]", "str z29, [{z}, #29, MUL VL]",
            "str z30, [{z}, #30, MUL VL]", "str z31, [{z}, #31, MUL VL]",
            "str p0, [{p}, #0, MUL VL]", "str p1, [{p}, #1, MUL VL]",
            "str p2, [{p}, #2, MUL VL]", "str p3, [{p}, #3, MUL VL]",
            "str p4, [{p}, #4, MUL VL]", "str p5, [{p}, #5, MUL VL]",
            "str p6, [{p}, #6, MUL VL]", "str p7, [{p}, #7, MUL VL]",
            "str p8, [{p}, #8, MUL VL]", "str p9, [{p}, #9, MUL VL]",
            "str p10, [{p}, #10, MUL VL]", "str p11, [{p}, #11, MUL VL]",
            "str p12, [{p}, #12, MUL VL]", "str p13, [{p}, #13, MUL VL]",
            "str p14, [{p}, #14, MUL VL]", "str p15, [{p}, #15, MUL VL]",
            "add {ffr}, {p}, {plen}, lsl #4",
            "rdffr p0.b",
            "str p0, [{ffr}]",
            z = in(reg) zb,
            p = in(reg) pb,
            plen = in(reg) plen as u64,
            ffr = out(reg) _,
            options(nostack)
        );
        let zcr: u64;
        asm!("mrs {}, s3_0_c1_c2_0", out(reg) zcr, options(nomem, nostack));
        let bytes = |start: *const u8, len: usize| core::slice::from_raw_parts(start, len);
        let want_z = bytes((&raw const WANT_Z).cast(), 32 * MAX_VL);
        let got_z = bytes((&raw const GOT_Z).cast(), 32 * MAX_VL);
        let want_p = bytes((&raw const WANT_P).cast(), 17 * MAX_VL / 8);
        let got_p = bytes((&raw const GOT_P).cast(), 17 * MAX_VL / 8);
        if let Some(register) =
            (0..32).find(|r| want_z[r * vl..(r + 1) * vl] != got_z[r * vl..(r + 1) * vl])
        {
            return Err((0, register));
        }
        if let Some(register) =
            (0..16).find(|r| want_p[r * plen..(r + 1) * plen] != got_p[r * plen..(r + 1) * plen])
        {
            return Err((1, register));
        }
        if want_p[16 * plen..17 * plen] != got_p[16 * plen..17 * plen] {
            return Err((2, 0));
        }
        if zcr & 0xf != ZCR_EL1 {
            return Err((3, zcr as usize));
        }
    }
    Ok(())
}
