//! What a trapped instruction of a guest's AArch32 EL0 needs beyond AArch64:
//! its condition, and the IT state after stepping over it.
//!
//! * **Condition.** A conditional AArch32 instruction may trap to EL2 even
//!   when its condition fails; it must then do nothing. For the exception
//!   classes below 0x10 the syndrome says which condition applied
//!   (`ESR_EL2.CV` = 1: `COND` \[23:20\]); with `CV` = 0 it is the T32 IT
//!   block's current condition (`IT[7:4]`), or always when outside one.
//!   Classes from 0x10 on (aborts among them) are only taken for instructions
//!   that passed. [`condition_passed`] evaluates the condition against the
//!   `N`, `Z`, `C`, `V` flags of the guest's CPSR, as KVM's
//!   `kvm_condition_valid32` does.
//! * **IT state.** Stepping over a T32 instruction inside an IT block must
//!   advance the block (`ITAdvance()`): the condition base `IT[7:5]` stays,
//!   `IT[4:0]` shifts left by one, and the state clears after the last
//!   instruction (`IT[2:0]` = 0). `IT[1:0]` are CPSR bits 26:25 and
//!   `IT[7:2]` bits 15:10. [`it_advance`] returns the CPSR after one step.

use crate::exit::inject::spsr;

/// `CPSR.T`: T32 state.
pub const CPSR_T: u64 = 1 << 5;
/// `CPSR` bits of `IT[1:0]` (26:25).
const CPSR_IT_LOW: u64 = 0b11 << 25;
/// `CPSR` bits of `IT[7:2]` (15:10).
const CPSR_IT_HIGH: u64 = 0x3f << 10;
/// `ESR_ELx.CV`: the `COND` field is valid.
const ESR_CV: u64 = 1 << 24;
/// Shift of `ESR_ELx.COND` \[23:20\].
const ESR_COND_SHIFT: u32 = 20;
/// Shift of the exception class `ESR_ELx.EC` \[31:26\].
const ESR_EC_SHIFT: u32 = 26;
/// Exception classes from this one on carry no condition.
const FIRST_UNCONDITIONAL_EC: u64 = 0x10;
/// The condition "always" (`AL`).
const COND_ALWAYS: u64 = 0xe;

/// Whether the guest's PSTATE (`SPSR_EL2`) is an AArch32 one (`M[4]`).
pub fn is_aarch32(pstate: u64) -> bool {
    pstate & spsr::NRW != 0
}

/// `IT[7:0]` of an AArch32 CPSR.
pub fn it_state(cpsr: u64) -> u64 {
    ((cpsr & CPSR_IT_HIGH) >> 8) | ((cpsr & CPSR_IT_LOW) >> 25)
}

fn with_it_state(cpsr: u64, it: u64) -> u64 {
    (cpsr & !(CPSR_IT_HIGH | CPSR_IT_LOW)) | ((it << 8) & CPSR_IT_HIGH) | ((it & 0b11) << 25)
}

/// Whether condition `cond` (0..=15) holds for the `N`, `Z`, `C`, `V` flags of
/// `cpsr`.
pub fn condition_holds(cond: u64, cpsr: u64) -> bool {
    let n = cpsr & (1 << 31) != 0;
    let z = cpsr & (1 << 30) != 0;
    let c = cpsr & (1 << 29) != 0;
    let v = cpsr & (1 << 28) != 0;
    let base = match cond >> 1 {
        0 => z,            // EQ / NE
        1 => c,            // CS / CC
        2 => n,            // MI / PL
        3 => v,            // VS / VC
        4 => c && !z,      // HI / LS
        5 => n == v,       // GE / LT
        6 => !z && n == v, // GT / LE
        _ => return true,  // AL, and 0b1111 (always)
    };
    // Odd conditions below AL are the inverses of the even ones.
    base != (cond & 1 != 0)
}

/// Whether the trapped AArch32 instruction with syndrome `esr` passed its
/// condition in a guest with CPSR `cpsr` (see the module docs).
pub fn condition_passed(esr: u64, cpsr: u64) -> bool {
    if (esr >> ESR_EC_SHIFT) & 0x3f >= FIRST_UNCONDITIONAL_EC {
        return true;
    }
    let cond = if esr & ESR_CV != 0 {
        (esr >> ESR_COND_SHIFT) & 0xf
    } else {
        let it = it_state(cpsr);
        if it == 0 {
            return true;
        }
        it >> 4
    };
    cond == COND_ALWAYS || condition_holds(cond, cpsr)
}

/// The CPSR after stepping over one instruction: the IT block advanced when
/// in T32 state inside one, otherwise `cpsr` unchanged.
pub fn it_advance(cpsr: u64) -> u64 {
    let it = it_state(cpsr);
    if cpsr & CPSR_T == 0 || it == 0 {
        return cpsr;
    }
    let next = if it & 0b111 == 0 {
        0
    } else {
        (it & 0xe0) | ((it << 1) & 0x1f)
    };
    with_it_state(cpsr, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const N: u64 = 1 << 31;
    const Z: u64 = 1 << 30;
    const C: u64 = 1 << 29;
    const V: u64 = 1 << 28;
    const USR: u64 = 0x10;

    #[test]
    fn aarch32_states() {
        assert!(is_aarch32(0x1d0));
        assert!(is_aarch32(0x10));
        assert!(!is_aarch32(0x3c5));
        assert!(!is_aarch32(0x0));
    }

    #[test]
    fn conditions() {
        // (cond, flags, holds)
        let table = [
            (0x0, Z, true),
            (0x0, 0, false),
            (0x1, 0, true),
            (0x2, C, true),
            (0x3, C, false),
            (0x4, N, true),
            (0x5, N, false),
            (0x6, V, true),
            (0x7, 0, true),
            (0x8, C, true),
            (0x8, C | Z, false),
            (0x9, C | Z, true),
            (0xa, N | V, true),
            (0xa, N, false),
            (0xb, N, true),
            (0xc, 0, true),
            (0xc, Z, false),
            (0xd, Z, true),
            (0xd, N, true),
            (0xd, N | V, false),
            (0xe, 0, true),
            (0xf, 0, true),
        ];
        for (cond, flags, holds) in table {
            assert_eq!(
                condition_holds(cond, flags | USR),
                holds,
                "cond {cond:#x} flags {flags:#x}"
            );
        }
    }

    #[test]
    fn condition_of_trapped_instructions() {
        let mcr = 0x03 << 26;
        // CV with COND = EQ: fails without Z, passes with it.
        let eq = mcr | ESR_CV | (0x0 << ESR_COND_SHIFT);
        assert!(!condition_passed(eq, USR));
        assert!(condition_passed(eq, USR | Z));
        // COND = AL passes whatever the flags.
        assert!(condition_passed(
            mcr | ESR_CV | (0xe << ESR_COND_SHIFT),
            USR
        ));
        // No CV and no IT block: unconditional.
        assert!(condition_passed(mcr, USR | CPSR_T));
        // No CV inside an IT block: the block's condition (IT = 0x08: EQ, one
        // instruction left).
        let in_eq_block = with_it_state(USR | CPSR_T, 0x08);
        assert!(!condition_passed(mcr, in_eq_block));
        assert!(condition_passed(mcr, in_eq_block | Z));
        // Aborts (EC >= 0x10) are never condition-failed.
        assert!(condition_passed(0x24 << 26, in_eq_block));
        assert!(condition_passed((0x24 << 26) | ESR_CV, USR));
    }

    #[test]
    fn it_block_advances_and_ends() {
        // ITTT EQ: firstcond EQ (0000), mask 0010 (three instructions):
        // IT[7:0] = 0x02, then 0x04, 0x08, and clear after the third.
        let cpsr = with_it_state(USR | CPSR_T | Z, 0x02);
        let one = it_advance(cpsr);
        assert_eq!(it_state(one), 0x04);
        let two = it_advance(one);
        assert_eq!(it_state(two), 0x08);
        let three = it_advance(two);
        assert_eq!(it_state(three), 0);
        assert_eq!(three, USR | CPSR_T | Z, "everything but IT kept");
        // A32 state and T32 outside a block: unchanged.
        assert_eq!(it_advance(USR | N), USR | N);
        assert_eq!(it_advance(USR | CPSR_T), USR | CPSR_T);
    }

    #[test]
    fn it_bits_positions() {
        let cpsr = with_it_state(USR, 0xff);
        assert_eq!(cpsr, USR | CPSR_IT_HIGH | CPSR_IT_LOW);
        assert_eq!(it_state(cpsr), 0xff);
    }

    proptest! {
        /// An IT block of any length ends after at most four steps, keeps
        /// its base condition while it lasts, and never touches other bits.
        #[test]
        fn it_advance_ends_blocks(it in 1u64..256, other in any::<u64>()) {
            let other = other & !(CPSR_IT_HIGH | CPSR_IT_LOW) | CPSR_T;
            let mut cpsr = with_it_state(other, it);
            for _ in 0..5 {
                let next = it_advance(cpsr);
                prop_assert_eq!(next & !(CPSR_IT_HIGH | CPSR_IT_LOW), other);
                if it_state(next) != 0 {
                    prop_assert_eq!(it_state(next) >> 5, it_state(cpsr) >> 5);
                }
                cpsr = next;
            }
            prop_assert_eq!(it_state(cpsr), 0);
        }
    }
}
