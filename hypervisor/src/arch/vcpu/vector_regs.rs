//! The vector register files a vCPU leaves live in its CPU (vCPUs are
//! pinned, and the hypervisor is soft-float, so nothing of its own lives
//! there): FP/SIMD, SVE and SME. Stored for a live migration's capture,
//! loaded for its restore, and reset when a vCPU starts, so that nothing an
//! earlier guest on the CPU left in them shows through.
//!
//! # One register file, two modes
//!
//! The FP/SIMD `q` registers are the low 128 bits of the SVE `z` registers.
//! In SME streaming mode (`SVCR.SM`) the same `z` and `p` registers are `SVL`
//! bytes long, `FFR` does not exist (without FEAT_SME_FA64, which the
//! hypervisor leaves off in `SMCR_EL2`) and the Advanced SIMD instructions
//! that move `q` registers may trap: a streaming vCPU's `q` registers are read
//! out of its `z` registers, never with `STP q`. Entering or leaving
//! streaming mode sets `z`, `p` and `FFR` to zero and `FPSR` to a fixed value,
//! so a restore first enters the captured mode (one `MSR SVCR`), then loads
//! the registers, then `FPSR`. The reset uses the same rule: entering and
//! leaving streaming mode clears the whole file.
//!
//! # ZA
//!
//! The ZA array is `SVL` rows of `SVL` bytes, stored and loaded a row at a
//! time (`STR`/`LDR ZA[w12, 0]`, one row per step, the address advanced by
//! `ADDSVL`). Setting `SVCR.ZA` gives a zeroed array; clearing it makes the
//! array inaccessible until the next set zeroes it again.
//!
//! # Lengths
//!
//! The hypervisor's `ZCR_EL2` and `SMCR_EL2` give a guest the CPU's longest
//! vectors. Each CPU measures its lengths once, when it comes up
//! ([`measure_lengths`]): `RDVL` run while a guest's streaming mode is live
//! would return the streaming length instead.

use alloc::vec::Vec;

use crate::arch::cpu::percpu;
use crate::platform::cpu_features::CpuFeatures;
use crate::vm::vcpu_state::{SVCR_SM, SVCR_ZA, SmeState, SveState, VectorLengths};
use crate::{read_sysreg, sysreg_values, write_sysreg};

/// Stores `q0..q31`. FP/SIMD is not trapped at EL2 while a vCPU is loaded
/// (`CPTR_EL2` of the guest); not in streaming mode (see the module doc).
pub(super) fn read_q(fp: &mut [u128; 32]) {
    let base = fp.as_mut_ptr();
    // SAFETY: stores 512 bytes into `fp` (32 registers of 16 bytes), which
    // it borrows mutably; FP/SIMD access is enabled at EL2 on this CPU.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            ".arch_extension simd",
            "stp q0, q1, [{base}, #0]",
            "stp q2, q3, [{base}, #32]",
            "stp q4, q5, [{base}, #64]",
            "stp q6, q7, [{base}, #96]",
            "stp q8, q9, [{base}, #128]",
            "stp q10, q11, [{base}, #160]",
            "stp q12, q13, [{base}, #192]",
            "stp q14, q15, [{base}, #224]",
            "stp q16, q17, [{base}, #256]",
            "stp q18, q19, [{base}, #288]",
            "stp q20, q21, [{base}, #320]",
            "stp q22, q23, [{base}, #352]",
            "stp q24, q25, [{base}, #384]",
            "stp q26, q27, [{base}, #416]",
            "stp q28, q29, [{base}, #448]",
            "stp q30, q31, [{base}, #480]",
            base = in(reg) base,
            options(nostack, preserves_flags)
        );
    }
}

/// Loads `q0..q31` (the low bits of the `z` registers; the bits above are
/// zeroed).
///
/// # Safety
///
/// No guest runs on this CPU, which is not in streaming mode.
pub(super) unsafe fn write_q(fp: &[u128; 32]) {
    let base = fp.as_ptr();
    // SAFETY: loads 512 bytes from `fp`; the caller's contract covers the
    // registers written.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            ".arch_extension simd",
            "ldp q0, q1, [{base}, #0]",
            "ldp q2, q3, [{base}, #32]",
            "ldp q4, q5, [{base}, #64]",
            "ldp q6, q7, [{base}, #96]",
            "ldp q8, q9, [{base}, #128]",
            "ldp q10, q11, [{base}, #160]",
            "ldp q12, q13, [{base}, #192]",
            "ldp q14, q15, [{base}, #224]",
            "ldp q16, q17, [{base}, #256]",
            "ldp q18, q19, [{base}, #288]",
            "ldp q20, q21, [{base}, #320]",
            "ldp q22, q23, [{base}, #352]",
            "ldp q24, q25, [{base}, #384]",
            "ldp q26, q27, [{base}, #416]",
            "ldp q28, q29, [{base}, #448]",
            "ldp q30, q31, [{base}, #480]",
            base = in(reg) base,
            options(nostack, preserves_flags)
        );
    }
}

/// `FPCR` and `FPSR`.
pub(super) fn read_fpcr_fpsr() -> (u64, u64) {
    let (fpcr, fpsr): (u64, u64);
    // SAFETY: reads the FP control and status registers.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            "mrs {0}, fpcr",
            "mrs {1}, fpsr",
            out(reg) fpcr,
            out(reg) fpsr,
            options(nomem, nostack, preserves_flags)
        );
    }
    (fpcr, fpsr)
}

/// Writes `FPCR` and `FPSR`.
///
/// # Safety
///
/// No guest runs on this CPU.
pub(super) unsafe fn write_fpcr_fpsr(fpcr: u64, fpsr: u64) {
    // SAFETY: the caller's contract; the hypervisor does no floating point.
    unsafe {
        core::arch::asm!(
            ".arch_extension fp",
            "msr fpcr, {fpcr}",
            "msr fpsr, {fpsr}",
            fpcr = in(reg) fpcr,
            fpsr = in(reg) fpsr,
            options(nostack, preserves_flags)
        );
    }
}

/// Measures this CPU's vector lengths, setting `CPTR_EL2`, `ZCR_EL2` and
/// `SMCR_EL2` as [`Vcpu::load`](super::Vcpu) does (no trap, the longest
/// vectors) and leaving streaming mode. Run once per CPU as it comes up,
/// before any guest.
pub fn measure_lengths(features: &CpuFeatures) -> VectorLengths {
    if !features.sve && !features.sme {
        return VectorLengths::default();
    }
    // SAFETY: no guest has run on this CPU yet; these are the values `load`
    // writes before every guest entry, and the hypervisor is soft-float, so
    // untrapping FP/SVE/SME and leaving streaming mode change nothing of its
    // own.
    unsafe {
        write_sysreg!(cptr_el2, sysreg_values::cptr_el2_guest(features.sme));
        core::arch::asm!("isb", options(nostack, preserves_flags));
        if features.sve {
            write_sysreg!(s3_4_c1_c2_0, sysreg_values::VECTOR_LEN_MAX); // ZCR_EL2
        }
        if features.sme {
            write_sysreg!(s3_4_c1_c2_6, sysreg_values::VECTOR_LEN_MAX); // SMCR_EL2
            write_sysreg!(s3_3_c4_c2_2, 0); // SVCR
        }
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
    let mut lengths = VectorLengths::default();
    if features.sve {
        let vl: u64;
        // SAFETY: reads the SVE vector length; SVE is not trapped.
        unsafe {
            core::arch::asm!(
                ".arch_extension sve",
                "rdvl {vl}, #1",
                vl = out(reg) vl,
                options(nomem, nostack, preserves_flags)
            );
        }
        lengths.sve = Some(vl as usize);
    }
    if features.sme {
        let svl: u64;
        // SAFETY: reads the streaming vector length; SME is not trapped.
        unsafe {
            core::arch::asm!(
                ".arch_extension sme",
                "rdsvl {svl}, #1",
                svl = out(reg) svl,
                options(nomem, nostack, preserves_flags)
            );
        }
        lengths.sme = Some(svl as usize);
    }
    lengths
}

/// The running CPU's vector lengths, measured when it came up.
pub fn vector_lengths() -> VectorLengths {
    *percpu::current().vector_lengths.lock()
}

/// Stores `z0..z31` and `p0..p15` at the current vector length.
///
/// # Safety
///
/// `z` has room for 32 vectors and `p` for 16 predicates of the current
/// length; SVE (or, in streaming mode, SME) is not trapped at EL2.
unsafe fn store_z_p(z: *mut u8, p: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!(
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
            options(nostack, preserves_flags)
        );
    }
}

/// Loads `z0..z31` and `p0..p15` at the current vector length.
///
/// # Safety
///
/// No guest runs on this CPU; `z` and `p` hold 32 vectors and 16 predicates
/// of the current length; SVE (or SME in streaming mode) is not trapped.
unsafe fn load_z_p(z: *const u8, p: *const u8) {
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!(
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
            options(nostack, preserves_flags)
        );
    }
}

/// Stores `z0..z31`, `p0..p15`, `FFR` and `ZCR_EL1` (`S3_0_C1_C2_0`)
/// outside streaming mode, at this CPU's SVE length `vl`.
pub(super) fn read_sve(vl: usize) -> SveState {
    let mut sve = SveState::with_vl(vl);
    let (p, ffr) = (sve.p.as_mut_ptr(), sve.ffr.as_mut_ptr());
    // SAFETY: the buffers hold 32 vectors, 16 predicates and one predicate
    // at `vl`, the length `ZCR_EL2` gives EL2 here; `p0` is stored before it
    // carries FFR and loaded again after; SVE is not trapped at EL2.
    unsafe {
        store_z_p(sve.z.as_mut_ptr(), p);
        core::arch::asm!(
            ".arch_extension sve",
            "rdffr p0.b",
            "str p0, [{ffr}]",
            "ldr p0, [{p}, #0, MUL VL]",
            p = in(reg) p,
            ffr = in(reg) ffr,
            options(nostack, preserves_flags)
        );
    }
    sve.zcr_el1 = read_sysreg!(s3_0_c1_c2_0);
    sve
}

/// Stores the streaming `z0..z31` and `p0..p15` (no `FFR`) and `ZCR_EL1`,
/// in streaming mode, at this CPU's streaming length `svl`.
pub(super) fn read_streaming(svl: usize) -> SveState {
    let mut sve = SveState::streaming(svl);
    // SAFETY: the buffers hold 32 vectors and 16 predicates at `svl`, the
    // length `SMCR_EL2` gives EL2 here; SME is not trapped at EL2.
    unsafe { store_z_p(sve.z.as_mut_ptr(), sve.p.as_mut_ptr()) };
    sve.zcr_el1 = read_sysreg!(s3_0_c1_c2_0);
    sve
}

/// Loads `ZCR_EL1`, `FFR` (unless `sve` has none: streaming), `p0..p15` and
/// `z0..z31`.
///
/// # Safety
///
/// No guest runs on this CPU. `sve` was captured at this CPU's current
/// vector length: the SVE one, or in streaming mode (with no `FFR`) the
/// streaming one.
pub(super) unsafe fn write_sve(sve: &SveState) {
    // SAFETY: the caller's contract: the buffers match the current length,
    // and a streaming capture has no FFR to load (`WRFFR` would trap).
    unsafe {
        write_sysreg!(s3_0_c1_c2_0, sve.zcr_el1);
        if !sve.ffr.is_empty() {
            core::arch::asm!(
                ".arch_extension sve",
                "ldr p0, [{ffr}]",
                "wrffr p0.b",
                ffr = in(reg) sve.ffr.as_ptr(),
                options(nostack, preserves_flags)
            );
        }
        load_z_p(sve.z.as_ptr(), sve.p.as_ptr());
    }
}

/// `SVCR` (`S3_3_C4_C2_2`), `SMCR_EL1` (`S3_0_C1_C2_6`), `TPIDR2_EL0`
/// (`S3_3_C13_C0_5`) and, while `SVCR.ZA` is set, the ZA array at this
/// CPU's streaming length `svl`.
pub(super) fn read_sme(svl: usize) -> SmeState {
    let mut sme = SmeState {
        svcr: read_sysreg!(s3_3_c4_c2_2),
        smcr_el1: read_sysreg!(s3_0_c1_c2_6),
        tpidr2_el0: read_sysreg!(s3_3_c13_c0_5),
        svl,
        za: Vec::new(),
    };
    if sme.za_live() {
        sme.za = alloc::vec![0; svl * svl];
        // SAFETY: ZA is live (`SVCR.ZA`), `svl` rows of `svl` bytes, the
        // length `SMCR_EL2` gives EL2 here; the buffer holds them all.
        unsafe { za_rows(sme.za.as_mut_ptr(), svl, false) };
    }
    sme
}

/// One pass over ZA's rows with `$op` (`"ldr"` or `"str"`): row `w12` to or
/// from `$at`, which advances by one streaming vector per row.
macro_rules! za_row_loop {
    ($op:literal, $at:expr, $rows:expr) => {
        core::arch::asm!(
            ".arch_extension sme",
            "2:",
            concat!($op, " za[w12, 0], [{at}]"),
            "addsvl {at}, {at}, #1",
            "add w12, w12, #1",
            "cmp x12, {rows}",
            "b.lo 2b",
            at = inout(reg) $at => _,
            rows = in(reg) $rows,
            inout("x12") 0u64 => _,
            options(nostack)
        )
    };
}

/// Stores (`load` false) or loads the `rows` rows of ZA at `buffer`.
///
/// # Safety
///
/// ZA is live and `rows` rows long; `buffer` holds `rows` rows of the
/// current streaming length; loading, no guest runs on this CPU.
unsafe fn za_rows(buffer: *mut u8, rows: usize, load: bool) {
    // SAFETY: the caller's contract; `w12` selects the row, the address
    // advances by one streaming vector per row.
    unsafe {
        if load {
            za_row_loop!("ldr", buffer, rows);
        } else {
            za_row_loop!("str", buffer, rows);
        }
    }
}

/// Enters the streaming mode and ZA state `svcr` names (its `SM` and `ZA`
/// bits), from neither: the registers and ZA read zero after.
///
/// # Safety
///
/// No guest runs on this CPU, which has SME; `SMCR_EL2` is set (`load`).
pub(super) unsafe fn enter_mode(svcr: u64) {
    // SAFETY: the caller's contract; the hypervisor is soft-float, so
    // streaming mode changes nothing it runs.
    unsafe {
        write_sysreg!(s3_3_c4_c2_2, svcr & (SVCR_SM | SVCR_ZA));
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
}

/// Writes `SMCR_EL1`, `TPIDR2_EL0` and, if `sme` has it, the ZA array.
///
/// # Safety
///
/// No guest runs on this CPU; [`enter_mode`] entered `sme.svcr`'s state;
/// `sme` was captured at this CPU's streaming length.
pub(super) unsafe fn write_sme(sme: &SmeState) {
    // SAFETY: the caller's contract: the guest's EL1/EL0 SME controls, and
    // ZA live at the captured length when the capture holds it.
    unsafe {
        write_sysreg!(s3_0_c1_c2_6, sme.smcr_el1);
        write_sysreg!(s3_3_c13_c0_5, sme.tpidr2_el0);
        if sme.za_live() {
            za_rows(sme.za.as_ptr().cast_mut(), sme.svl, true);
        }
    }
}

/// Clears every vector register, `FPCR`, `FPSR`, `ZCR_EL1` and the SME
/// controls, and leaves streaming mode and ZA off: the state a guest finds
/// at its start, whatever the last guest on this CPU left.
///
/// # Safety
///
/// No guest runs on this CPU; `load` set `CPTR_EL2`, `ZCR_EL2` and
/// `SMCR_EL2`.
pub(super) unsafe fn reset(features: &CpuFeatures) {
    // SAFETY: the caller's contract; the hypervisor keeps nothing of its own
    // in these registers.
    unsafe {
        if features.sme {
            // Entering and leaving streaming mode zeroes z, p and FFR.
            enter_mode(SVCR_SM);
            enter_mode(0);
            write_sysreg!(s3_0_c1_c2_6, 0); // SMCR_EL1
            write_sysreg!(s3_3_c13_c0_5, 0); // TPIDR2_EL0
        } else if features.sve {
            core::arch::asm!(
                ".arch_extension sve",
                "dup z0.b, #0",
                "dup z1.b, #0",
                "dup z2.b, #0",
                "dup z3.b, #0",
                "dup z4.b, #0",
                "dup z5.b, #0",
                "dup z6.b, #0",
                "dup z7.b, #0",
                "dup z8.b, #0",
                "dup z9.b, #0",
                "dup z10.b, #0",
                "dup z11.b, #0",
                "dup z12.b, #0",
                "dup z13.b, #0",
                "dup z14.b, #0",
                "dup z15.b, #0",
                "dup z16.b, #0",
                "dup z17.b, #0",
                "dup z18.b, #0",
                "dup z19.b, #0",
                "dup z20.b, #0",
                "dup z21.b, #0",
                "dup z22.b, #0",
                "dup z23.b, #0",
                "dup z24.b, #0",
                "dup z25.b, #0",
                "dup z26.b, #0",
                "dup z27.b, #0",
                "dup z28.b, #0",
                "dup z29.b, #0",
                "dup z30.b, #0",
                "dup z31.b, #0",
                "pfalse p0.b",
                "pfalse p1.b",
                "pfalse p2.b",
                "pfalse p3.b",
                "pfalse p4.b",
                "pfalse p5.b",
                "pfalse p6.b",
                "pfalse p7.b",
                "pfalse p8.b",
                "pfalse p9.b",
                "pfalse p10.b",
                "pfalse p11.b",
                "pfalse p12.b",
                "pfalse p13.b",
                "pfalse p14.b",
                "pfalse p15.b",
                "wrffr p0.b",
                options(nomem, nostack, preserves_flags)
            );
        } else {
            core::arch::asm!(
                ".arch_extension fp",
                ".arch_extension simd",
                "movi v0.2d, #0",
                "movi v1.2d, #0",
                "movi v2.2d, #0",
                "movi v3.2d, #0",
                "movi v4.2d, #0",
                "movi v5.2d, #0",
                "movi v6.2d, #0",
                "movi v7.2d, #0",
                "movi v8.2d, #0",
                "movi v9.2d, #0",
                "movi v10.2d, #0",
                "movi v11.2d, #0",
                "movi v12.2d, #0",
                "movi v13.2d, #0",
                "movi v14.2d, #0",
                "movi v15.2d, #0",
                "movi v16.2d, #0",
                "movi v17.2d, #0",
                "movi v18.2d, #0",
                "movi v19.2d, #0",
                "movi v20.2d, #0",
                "movi v21.2d, #0",
                "movi v22.2d, #0",
                "movi v23.2d, #0",
                "movi v24.2d, #0",
                "movi v25.2d, #0",
                "movi v26.2d, #0",
                "movi v27.2d, #0",
                "movi v28.2d, #0",
                "movi v29.2d, #0",
                "movi v30.2d, #0",
                "movi v31.2d, #0",
                options(nomem, nostack, preserves_flags)
            );
        }
        if features.sve {
            write_sysreg!(s3_0_c1_c2_0, 0); // ZCR_EL1
        }
        write_fpcr_fpsr(0, 0);
    }
}
