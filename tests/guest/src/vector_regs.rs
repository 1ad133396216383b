//! A known pattern in the SVE registers, set before and checked after a
//! live migration (`migrate`): the test guest is soft-float, so nothing it
//! runs touches `z0..z31`, `p0..p15` or `FFR` in between, and whatever they
//! hold afterwards was carried (or lost) by the hypervisor.
//!
//! With SME, [`fill_streaming`] does the same in streaming mode with the ZA
//! array live (another pattern in the streaming `z` and `p` registers, and
//! one in every ZA row), and the vCPU stays in streaming mode until
//! [`check_streaming`] compares and leaves it: the guest's soft-float code
//! runs the same in streaming mode.
//!
//! The `vector-regs` scenario ([`run`]) checks that every register starts
//! at zero (`q`, `FPCR`, `FPSR`, and with SVE `z`, `p`, `FFR` and `ZCR_EL1`,
//! with SME `SVCR` outside streaming mode with ZA off), then leaves patterns
//! in all of them (streaming mode and ZA live with SME) and powers off: run
//! again on the same CPU (the VM restarted), it shows that the hypervisor
//! cleared what the last guest on the CPU left there.

use core::arch::asm;

use crate::println;
use crate::scenarios::Failure;

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
static mut STREAMING_WANT_Z: Vectors = Vectors([0; 32 * MAX_VL]);
static mut STREAMING_WANT_P: Predicates = Predicates([0; 17 * MAX_VL / 8]);
static mut STREAMING_GOT_Z: Vectors = Vectors([0; 32 * MAX_VL]);
static mut STREAMING_GOT_P: Predicates = Predicates([0; 17 * MAX_VL / 8]);

/// One ZA row.
#[repr(C, align(16))]
struct Row([u8; MAX_VL]);

static mut ZA_ROW: Row = Row([0; MAX_VL]);

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

/// Fills `count` registers of `len` bytes at `buffer` with `byte(register,
/// byte)`.
///
/// # Safety
///
/// `buffer` holds `count * len` bytes only this vCPU uses.
unsafe fn fill_pattern(
    buffer: *mut u8,
    count: usize,
    len: usize,
    byte: impl Fn(usize, usize) -> u8,
) {
    for register in 0..count {
        for at in 0..len {
            // SAFETY: the caller's contract.
            unsafe { *buffer.add(register * len + at) = byte(register, at) };
        }
    }
}

/// Compares 32 vectors and then 16 predicates of `vl` bytes, each kept as a
/// (want, got) pair of buffers: `Err((0, register))` for the first vector
/// that differs, `Err((1, register))` for the first predicate.
///
/// # Safety
///
/// The vector buffers hold 32 vectors and the predicate ones 16 predicates
/// of `vl` bytes; nothing writes them meanwhile.
unsafe fn compare_z_p(
    z: (*const u8, *const u8),
    p: (*const u8, *const u8),
    vl: usize,
) -> Result<(), (u8, usize)> {
    for (what, (want, got), count, len) in [(0, z, 32, vl), (1, p, 16, vl / 8)] {
        // SAFETY: the caller's contract.
        let (want, got) = unsafe {
            (
                core::slice::from_raw_parts(want, count * len),
                core::slice::from_raw_parts(got, count * len),
            )
        };
        if let Some(register) =
            (0..count).find(|r| want[r * len..(r + 1) * len] != got[r * len..(r + 1) * len])
        {
            return Err((what, register));
        }
    }
    Ok(())
}

/// Loads `z0..z31` from `z` and `p0..p15` from `p` at the current vector
/// length.
///
/// # Safety
///
/// `z` and `p` hold 32 vectors and 16 predicates of the current length;
/// SVE (or SME in streaming mode) is enabled.
unsafe fn load_z_p(z: u64, p: u64) {
    // SAFETY: the caller's contract; the guest is soft-float, so nothing of
    // its own lives in these registers.
    unsafe {
        asm!(
            ".arch_extension sve",
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
            z = in(reg) z,
            p = in(reg) p,
            options(nostack, readonly)
        );
    }
}

/// Stores `z0..z31` to `z` and `p0..p15` to `p` at the current vector
/// length.
///
/// # Safety
///
/// `z` and `p` have room for 32 vectors and 16 predicates of the current
/// length, used by this vCPU only; SVE (or SME in streaming mode) is
/// enabled.
unsafe fn store_z_p(z: u64, p: u64) {
    // SAFETY: the caller's contract.
    unsafe {
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
            z = in(reg) z,
            p = in(reg) p,
            options(nostack)
        );
    }
}

/// Loads every vector and predicate register and FFR with the pattern.
/// Returns the vector length.
pub fn fill() -> usize {
    enable();
    let vl = vl().min(MAX_VL);
    let plen = vl / 8;
    // SAFETY: only this vCPU uses the buffers; in bounds for `vl <= MAX_VL`;
    // SVE is enabled; FFR goes through `p0` before `p0` is loaded.
    unsafe {
        let (z, p) = (
            (&raw mut WANT_Z).cast::<u8>(),
            (&raw mut WANT_P).cast::<u8>(),
        );
        fill_pattern(z, 32, vl, pattern_byte);
        fill_pattern(p, 16, plen, |register, byte| {
            pattern_byte(register + 32, byte)
        });
        // FFR: a first-fault register holds a true prefix; the first 5 lanes.
        let ffr = p.add(16 * plen);
        for byte in 0..plen {
            *ffr.add(byte) = 0;
        }
        *ffr = 0x1f;
        asm!(
            ".arch_extension sve",
            "ldr p0, [{ffr}]",
            "wrffr p0.b",
            ffr = in(reg) ffr as u64,
            options(nostack, readonly)
        );
        load_z_p(z as u64, p as u64);
    }
    vl
}

/// Stores the registers and compares them with the pattern [`fill`] set:
/// `Err((what, register))` names the first that differs (`what`: 0 `z`,
/// 1 `p`, 2 `FFR`, 3 `ZCR_EL1`).
pub fn check(vl: usize) -> Result<(), (u8, usize)> {
    let plen = vl / 8;
    // SAFETY: only this vCPU uses the buffers; the stores stay within them
    // for `vl <= MAX_VL`; SVE is enabled (`fill`); `p0` is stored before it
    // carries FFR.
    unsafe {
        let (z, p) = ((&raw mut GOT_Z) as u64, (&raw mut GOT_P) as u64);
        store_z_p(z, p);
        asm!(
            ".arch_extension sve",
            "rdffr p0.b",
            "str p0, [{ffr}]",
            ffr = in(reg) p + 16 * plen as u64,
            options(nostack)
        );
        let zcr: u64;
        asm!("mrs {}, s3_0_c1_c2_0", out(reg) zcr, options(nomem, nostack));
        let (want_p, got_p) = (
            (&raw const WANT_P).cast::<u8>(),
            (&raw const GOT_P).cast::<u8>(),
        );
        compare_z_p(
            ((&raw const WANT_Z).cast(), (&raw const GOT_Z).cast()),
            (want_p, got_p),
            vl,
        )?;
        let ffr = |buffer: *const u8| core::slice::from_raw_parts(buffer.add(16 * plen), plen);
        if ffr(want_p) != ffr(got_p) {
            return Err((2, 0));
        }
        if zcr & 0xf != ZCR_EL1 {
            return Err((3, zcr as usize));
        }
    }
    Ok(())
}

/// Whether the CPU has SME (`ID_AA64PFR1_EL1.SME`, bits 27:24).
pub fn sme_present() -> bool {
    let pfr1: u64;
    // SAFETY: reads an ID register.
    unsafe { asm!("mrs {}, id_aa64pfr1_el1", out(reg) pfr1, options(nomem, nostack)) };
    (pfr1 >> 24) & 0xf != 0
}

/// `SVCR` (`S3_3_C4_C2_2`): streaming mode and ZA live.
const SVCR_SM_ZA: u64 = 3;

fn streaming_byte(register: usize, byte: usize) -> u8 {
    pattern_byte(register + 48, byte) ^ 0xa5
}

/// ZA row `row`'s pattern: distinct for each of up to 256 rows.
fn za_byte(row: usize, byte: usize) -> u8 {
    pattern_byte(row + 64, byte)
}

/// Stores or loads ZA row `row` at [`ZA_ROW`].
///
/// # Safety
///
/// ZA is live with more than `row` rows; only this vCPU uses [`ZA_ROW`].
unsafe fn za_row(row: usize, load: bool) {
    let buffer = (&raw mut ZA_ROW) as u64;
    // SAFETY: the caller's contract; one row of at most `MAX_VL` bytes.
    unsafe {
        if load {
            asm!(".arch_extension sme", "ldr za[w12, 0], [{b}]",
                 b = in(reg) buffer, in("x12") row as u64, options(nostack, readonly));
        } else {
            asm!(".arch_extension sme", "str za[w12, 0], [{b}]",
                 b = in(reg) buffer, in("x12") row as u64, options(nostack));
        }
    }
}

/// Turns on SME at EL1 and EL0 (with FP/SIMD), asks for the longest
/// streaming vectors, enters streaming mode with ZA live and loads the
/// streaming `z` and `p` registers and every ZA row with their patterns.
/// Returns the streaming vector length; the vCPU stays in streaming mode.
pub fn fill_streaming() -> usize {
    let svl: u64;
    // SAFETY: CPACR_EL1.FPEN (21:20) and SMEN (25:24) = 0b11 stop trapping
    // FP/SIMD and SME; SMCR_EL1 (S3_0_C1_C2_6) LEN asks for the longest
    // streaming vectors. Nothing of the guest lives in these registers.
    unsafe {
        asm!(
            "mrs {t}, cpacr_el1",
            "orr {t}, {t}, #(3 << 20)",
            "orr {t}, {t}, #(3 << 24)",
            "msr cpacr_el1, {t}",
            "isb",
            "mov {t}, #0xf",
            "msr s3_0_c1_c2_6, {t}",
            "isb",
            ".arch_extension sme",
            "rdsvl {svl}, #1",
            t = out(reg) _,
            svl = out(reg) svl,
            options(nostack)
        );
    }
    let svl = (svl as usize).min(MAX_VL);
    let plen = svl / 8;
    // SAFETY: only this vCPU uses the buffers; in bounds for `svl <= MAX_VL`;
    // in streaming mode the loads move `svl`-byte vectors and rows; the
    // guest is soft-float, so streaming mode changes nothing it runs.
    unsafe {
        let z = (&raw mut STREAMING_WANT_Z).cast::<u8>();
        let p = (&raw mut STREAMING_WANT_P).cast::<u8>();
        fill_pattern(z, 32, svl, streaming_byte);
        fill_pattern(p, 16, plen, |register, byte| {
            streaming_byte(register + 32, byte)
        });
        asm!(
            "msr s3_3_c4_c2_2, {svcr}",
            "isb",
            svcr = in(reg) SVCR_SM_ZA,
            options(nostack)
        );
        load_z_p(z as u64, p as u64);
        let row_buffer = (&raw mut ZA_ROW).cast::<u8>();
        for row in 0..svl {
            fill_pattern(row_buffer, 1, svl, |_, byte| za_byte(row, byte));
            za_row(row, true);
        }
    }
    svl
}

/// Compares the streaming registers and ZA with the pattern
/// [`fill_streaming`] set, then leaves streaming mode and turns ZA off:
/// `Err((what, index))` names the first that differs (`what`: 0 `z`, 1 `p`,
/// 2 a ZA row, 3 `SVCR` no longer in streaming mode with ZA live, `index`
/// its value).
pub fn check_streaming(svl: usize) -> Result<(), (u8, usize)> {
    let svcr: u64;
    // SAFETY: reads SVCR (SME is enabled at EL1, `fill_streaming`).
    unsafe { asm!("mrs {}, s3_3_c4_c2_2", out(reg) svcr, options(nomem, nostack)) };
    if svcr != SVCR_SM_ZA {
        return Err((3, svcr as usize));
    }
    let result = (|| {
        // SAFETY: only this vCPU uses the buffers; the stores stay within
        // them for `svl <= MAX_VL`; streaming mode with ZA live (checked).
        unsafe {
            store_z_p(
                (&raw mut STREAMING_GOT_Z) as u64,
                (&raw mut STREAMING_GOT_P) as u64,
            );
            compare_z_p(
                (
                    (&raw const STREAMING_WANT_Z).cast(),
                    (&raw const STREAMING_GOT_Z).cast(),
                ),
                (
                    (&raw const STREAMING_WANT_P).cast(),
                    (&raw const STREAMING_GOT_P).cast(),
                ),
                svl,
            )?;
            for row in 0..svl {
                za_row(row, false);
                let got = core::slice::from_raw_parts((&raw const ZA_ROW).cast::<u8>(), MAX_VL);
                if (0..svl).any(|byte| got[byte] != za_byte(row, byte)) {
                    return Err((2, row));
                }
            }
        }
        Ok(())
    })();
    // SAFETY: leaves streaming mode and turns ZA off (the registers are
    // zeroed; the guest is soft-float).
    unsafe { asm!("msr s3_3_c4_c2_2, xzr", "isb", options(nostack)) };
    result
}

/// `FPCR.DN` and `FPSR.QC`: the values [`run`] leaves.
const FPCR_LEFT: u64 = 1 << 25;
const FPSR_LEFT: u64 = 1 << 27;

/// Stores (`load` false) or loads `q0..q31` at the start of [`GOT_Z`] /
/// [`WANT_Z`]. FP/SIMD is enabled and the vCPU is not in streaming mode.
fn q_registers(load: bool) {
    // SAFETY: 512 bytes at the start of a buffer only this vCPU uses;
    // FP/SIMD is enabled at EL1 (`CPACR_EL1.FPEN`).
    unsafe {
        if load {
            let b = (&raw const WANT_Z) as u64;
            asm!(
                ".arch_extension fp",
                ".arch_extension simd",
            "ldp q0, q1, [{b}, #0]",
            "ldp q2, q3, [{b}, #32]",
            "ldp q4, q5, [{b}, #64]",
            "ldp q6, q7, [{b}, #96]",
            "ldp q8, q9, [{b}, #128]",
            "ldp q10, q11, [{b}, #160]",
            "ldp q12, q13, [{b}, #192]",
            "ldp q14, q15, [{b}, #224]",
            "ldp q16, q17, [{b}, #256]",
            "ldp q18, q19, [{b}, #288]",
            "ldp q20, q21, [{b}, #320]",
            "ldp q22, q23, [{b}, #352]",
            "ldp q24, q25, [{b}, #384]",
            "ldp q26, q27, [{b}, #416]",
            "ldp q28, q29, [{b}, #448]",
            "ldp q30, q31, [{b}, #480]",
                b = in(reg) b,
                options(nostack, readonly)
            );
        } else {
            let b = (&raw mut GOT_Z) as u64;
            asm!(
                ".arch_extension fp",
                ".arch_extension simd",
            "stp q0, q1, [{b}, #0]",
            "stp q2, q3, [{b}, #32]",
            "stp q4, q5, [{b}, #64]",
            "stp q6, q7, [{b}, #96]",
            "stp q8, q9, [{b}, #128]",
            "stp q10, q11, [{b}, #160]",
            "stp q12, q13, [{b}, #192]",
            "stp q14, q15, [{b}, #224]",
            "stp q16, q17, [{b}, #256]",
            "stp q18, q19, [{b}, #288]",
            "stp q20, q21, [{b}, #320]",
            "stp q22, q23, [{b}, #352]",
            "stp q24, q25, [{b}, #384]",
            "stp q26, q27, [{b}, #416]",
            "stp q28, q29, [{b}, #448]",
            "stp q30, q31, [{b}, #480]",
                b = in(reg) b,
                options(nostack)
            );
        }
    }
}

/// The `vector-regs` scenario (see the module doc).
pub fn run() -> Result<(), Failure> {
    let nonzero = |what, index| Err(Failure::VectorRegs { what, index });
    let (sve, sme) = (sve_present(), sme_present());
    // SAFETY: CPACR_EL1.FPEN (21:20) and, with SVE, ZEN (17:16) and, with
    // SME, SMEN (25:24) stop trapping FP/SIMD, SVE and SME at EL1; nothing
    // of the guest is in them yet.
    unsafe {
        asm!(
            "mrs {t}, cpacr_el1",
            "orr {t}, {t}, #(3 << 20)",
            "orr {t}, {t}, {more}",
            "msr cpacr_el1, {t}",
            "isb",
            t = out(reg) _,
            more = in(reg) (u64::from(sme) * (3 << 24)) | (u64::from(sve) * (3 << 16)),
            options(nostack)
        );
    }
    if sme {
        let svcr: u64;
        // SAFETY: reads SVCR; SME is enabled at EL1.
        unsafe { asm!("mrs {}, s3_3_c4_c2_2", out(reg) svcr, options(nomem, nostack)) };
        if svcr != 0 {
            return nonzero("SVCR ", svcr);
        }
    }
    let (fpcr, fpsr): (u64, u64);
    // SAFETY: reads the FP control and status registers (FP/SIMD enabled).
    unsafe {
        asm!(".arch_extension fp", "mrs {}, fpcr", "mrs {}, fpsr",
             out(reg) fpcr, out(reg) fpsr, options(nomem, nostack));
    }
    if fpcr != 0 {
        return nonzero("FPCR ", fpcr);
    }
    if fpsr != 0 {
        return nonzero("FPSR ", fpsr);
    }
    q_registers(false);
    // SAFETY: only this vCPU uses the buffer.
    let got = unsafe { core::slice::from_raw_parts((&raw const GOT_Z).cast::<u8>(), 512) };
    if let Some(q) = (0..32).find(|q| got[q * 16..(q + 1) * 16].iter().any(|&b| b != 0)) {
        return nonzero("q", q as u64);
    }
    if sve {
        let zcr: u64;
        // SAFETY: reads ZCR_EL1 (the CPU has SVE).
        unsafe { asm!("mrs {}, s3_0_c1_c2_0", out(reg) zcr, options(nomem, nostack)) };
        if zcr != 0 {
            return nonzero("ZCR_EL1 ", zcr);
        }
        // The pattern buffers are still zero: `check` compares with zero.
        enable();
        if let Err((what, register)) = check(vl().min(MAX_VL)) {
            let name = ["z", "p", "FFR ", "ZCR_EL1 "][usize::from(what)];
            return nonzero(name, register as u64);
        }
    }
    println!(
        "vector-regs: every vector register started at zero (SVE {}, SME {})",
        if sve { "on" } else { "off" },
        if sme { "on" } else { "off" }
    );
    if sve {
        fill();
    } else {
        // SAFETY: only this vCPU uses the buffer.
        let want = unsafe { core::slice::from_raw_parts_mut((&raw mut WANT_Z).cast::<u8>(), 512) };
        for (byte, value) in want.iter_mut().enumerate() {
            *value = pattern_byte(byte / 16, byte);
        }
        q_registers(true);
    }
    // SAFETY: the guest's own FP controls; the guest is soft-float.
    unsafe {
        asm!(".arch_extension fp", "msr fpcr, {}", "msr fpsr, {}",
             in(reg) FPCR_LEFT, in(reg) FPSR_LEFT, options(nomem, nostack));
    }
    if sme {
        fill_streaming();
    }
    println!("vector-regs: patterns left in the registers");
    Ok(())
}
