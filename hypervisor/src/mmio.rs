//! Turning a trapped data abort into an emulated device access and back.
//!
//! With a valid syndrome (`ISV`), the abort names the transfer register, the
//! size, the direction and sign extension. A store's value is the register
//! truncated to the access size (register 31 is the zero register); a load's
//! raw device value is zero- or sign-extended to 32 or 64 bits before it is
//! written back to the register, exactly as the load instruction would have.

use crate::esr::DataAccess;

/// The bits an access of `size` bytes transfers.
fn size_mask(size: u8) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * u32::from(size))) - 1
    }
}

/// The value a store of register value `reg` transfers.
pub fn store_value(access: DataAccess, reg: u64) -> u64 {
    if access.register == 31 {
        0
    } else {
        reg & size_mask(access.size)
    }
}

/// The register value a load produces from the device's `raw` value, or `None`
/// when the register is the zero register (the value is discarded).
pub fn load_result(access: DataAccess, raw: u64) -> Option<u64> {
    if access.register == 31 {
        return None;
    }
    let bits = 8 * u32::from(access.size);
    let mut value = raw & size_mask(access.size);
    if access.sign_extend && bits < 64 {
        let shift = 64 - bits;
        value = (((value << shift) as i64) >> shift) as u64;
    }
    if !access.sixty_four {
        value &= 0xffff_ffff;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(size: u8, sign_extend: bool, register: u8, sixty_four: bool) -> DataAccess {
        DataAccess {
            size,
            sign_extend,
            register,
            sixty_four,
        }
    }

    #[test]
    fn stores() {
        assert_eq!(store_value(access(1, false, 2, false), 0x1234_5678), 0x78);
        assert_eq!(
            store_value(access(4, false, 2, false), u64::MAX),
            0xffff_ffff
        );
        assert_eq!(store_value(access(8, false, 2, true), u64::MAX), u64::MAX);
        assert_eq!(
            store_value(access(4, false, 31, false), 0x55),
            0,
            "xzr stores zero"
        );
    }

    #[test]
    fn loads() {
        assert_eq!(load_result(access(1, false, 0, false), 0x1ff), Some(0xff));
        assert_eq!(
            load_result(access(1, true, 0, true), 0x80),
            Some(0xffff_ffff_ffff_ff80)
        );
        assert_eq!(
            load_result(access(2, true, 0, false), 0x8000),
            Some(0xffff_8000)
        );
        assert_eq!(
            load_result(access(4, true, 0, true), 0x7fff_ffff),
            Some(0x7fff_ffff)
        );
        assert_eq!(
            load_result(access(8, false, 0, true), u64::MAX),
            Some(u64::MAX)
        );
        assert_eq!(load_result(access(4, false, 31, false), 1), None);
    }
}
