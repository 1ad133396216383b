//! Emulated devices on the guest's physical address space, and turning a
//! trapped data abort into a device access and back.
//!
//! [`MmioBus`] maps guest-physical windows to the emulated devices behind
//! them (sorted, non-overlapping; a lookup is a binary search). The data-abort
//! path asks it which device an access belongs to and at what offset: the
//! whole access, `[ipa, ipa + size)`, must lie in one window. An access that
//! starts in a window and runs past its end (an 8-byte load at the window's
//! last 4 bytes) is no device access at all: [`MmioMiss::Straddles`] says so,
//! and the guest gets an abort as for any address without a device.
//!
//! With a valid syndrome (`ISV`), the abort names the transfer register, the
//! size, the direction and sign extension. A store's value is the register
//! truncated to the access size (register 31 is the zero register); a load's
//! raw device value is zero- or sign-extended to 32 or 64 bits before it is
//! written back to the register, exactly as the load instruction would have.

use crate::exit::esr::DataAccess;
use alloc::vec::Vec;

/// An emulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceId {
    /// The PL011 UART.
    Uart,
    /// The virtual GICv3's distributor and redistributors.
    Gic,
    /// The virtual GICv3's ITS (its control and translation frames).
    Its,
    /// The VM's virtio-mmio device with this index (its place in the VM's
    /// device list, `runtime::virtio_devices`).
    Virtio(u8),
    /// A passed-through device's window that is not mapped (it shares its
    /// page with other devices): accesses are performed on the device
    /// (`vm::passthrough`).
    Passed,
}

/// A device's window on the guest-physical address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioRegion {
    /// First IPA of the window.
    pub base: u64,
    /// Size in bytes (nonzero).
    pub size: u64,
    /// The device answering there.
    pub device: DeviceId,
}

/// A region was refused: it is empty, wraps, or overlaps this region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionConflict(pub MmioRegion);

impl core::fmt::Display for RegionConflict {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "device window {:#x}+{:#x} is empty, wraps or overlaps another",
            self.0.base, self.0.size
        )
    }
}

impl core::error::Error for RegionConflict {}

/// Why an access is not a device access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioMiss {
    /// No window holds the access's first byte.
    Outside,
    /// The access starts in this window but does not end in it (or has no
    /// bytes).
    Straddles(MmioRegion),
}

impl core::fmt::Display for MmioMiss {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Outside => f.write_str("outside every device window"),
            Self::Straddles(region) => write!(
                f,
                "runs past the end of the device window {:#x}+{:#x}",
                region.base, region.size
            ),
        }
    }
}

impl core::error::Error for MmioMiss {}

/// The emulated devices of one VM.
#[derive(Clone, Debug, Default)]
pub struct MmioBus {
    regions: Vec<MmioRegion>,
}

impl MmioBus {
    /// A bus with no devices.
    pub const fn new() -> Self {
        Self {
            regions: Vec::new(),
        }
    }

    /// Adds `region`; refused if it is empty, wraps, or overlaps another.
    pub fn add(&mut self, region: MmioRegion) -> Result<(), RegionConflict> {
        let end = region
            .base
            .checked_add(region.size)
            .filter(|_| region.size > 0)
            .ok_or(RegionConflict(region))?;
        let at = self.regions.partition_point(|r| r.base < region.base);
        if let Some(next) = self.regions.get(at).filter(|next| next.base < end) {
            return Err(RegionConflict(*next));
        }
        let prev = at.checked_sub(1).map(|i| self.regions[i]);
        if let Some(prev) = prev.filter(|prev| prev.base + prev.size > region.base) {
            return Err(RegionConflict(prev));
        }
        self.regions.insert(at, region);
        Ok(())
    }

    /// The window holding the byte at `ipa`, if any.
    pub fn region_at(&self, ipa: u64) -> Option<MmioRegion> {
        let at = self
            .regions
            .partition_point(|r| r.base <= ipa)
            .checked_sub(1)?;
        let region = self.regions[at];
        (ipa - region.base < region.size).then_some(region)
    }

    /// The device that an access of `size` bytes at `ipa` reaches, and the
    /// offset of `ipa` into its window: every byte of `[ipa, ipa + size)` must
    /// lie in that one window.
    pub fn find(&self, ipa: u64, size: u64) -> Result<(DeviceId, u64), MmioMiss> {
        let region = self.region_at(ipa).ok_or(MmioMiss::Outside)?;
        let offset = ipa - region.base;
        if size == 0 || size > region.size - offset {
            return Err(MmioMiss::Straddles(region));
        }
        Ok((region.device, offset))
    }
}

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
    fn bus() {
        let mut bus = MmioBus::new();
        let uart = MmioRegion {
            base: 0x0900_0000,
            size: 0x1000,
            device: DeviceId::Uart,
        };
        bus.add(uart).expect("free");
        assert_eq!(bus.find(0x0900_0000, 4), Ok((DeviceId::Uart, 0)));
        assert_eq!(bus.find(0x0900_0ffc, 4), Ok((DeviceId::Uart, 0xffc)));
        assert_eq!(bus.find(0x0900_1000, 4), Err(MmioMiss::Outside));
        assert_eq!(bus.find(0x08ff_ffff, 1), Err(MmioMiss::Outside));
        assert_eq!(
            bus.add(MmioRegion {
                base: 0x0900_0800,
                ..uart
            }),
            Err(RegionConflict(uart))
        );
        assert_eq!(
            bus.add(MmioRegion {
                base: 0x08ff_f800,
                ..uart
            }),
            Err(RegionConflict(uart))
        );
        assert!(bus.add(MmioRegion { size: 0, ..uart }).is_err());
        assert!(
            bus.add(MmioRegion {
                base: u64::MAX,
                ..uart
            })
            .is_err()
        );
        bus.add(MmioRegion {
            base: 0x0800_0000,
            size: 0x1_0000,
            device: DeviceId::Uart,
        })
        .expect("free");
        assert_eq!(bus.find(0x0800_0010, 8), Ok((DeviceId::Uart, 0x10)));
        assert_eq!(bus.find(0x0900_0004, 4), Ok((DeviceId::Uart, 4)));
    }

    #[test]
    fn an_access_must_fit_in_its_window() {
        let mut bus = MmioBus::new();
        let uart = MmioRegion {
            base: 0x0900_0000,
            size: 0x1000,
            device: DeviceId::Uart,
        };
        let gicd = MmioRegion {
            base: 0x0800_0000,
            size: 0x1_0000,
            device: DeviceId::Gic,
        };
        bus.add(uart).expect("free");
        bus.add(gicd).expect("free");
        // The last 4 bytes of a window: 4 bytes fit, 8 run into the hole.
        assert_eq!(bus.find(0x0900_0ffc, 4), Ok((DeviceId::Uart, 0xffc)));
        assert_eq!(bus.find(0x0900_0ffc, 8), Err(MmioMiss::Straddles(uart)));
        assert_eq!(bus.find(0x0800_fffc, 8), Err(MmioMiss::Straddles(gicd)));
        assert_eq!(bus.find(0x0800_fff8, 8), Ok((DeviceId::Gic, 0xfff8)));
        assert_eq!(bus.find(0x0900_0fff, 2), Err(MmioMiss::Straddles(uart)));
        assert_eq!(bus.find(0x0900_0000, 0), Err(MmioMiss::Straddles(uart)));
        // Two adjacent windows: an access across the seam fits in neither.
        let next = MmioRegion {
            base: 0x0900_1000,
            size: 0x1000,
            device: DeviceId::Gic,
        };
        bus.add(next).expect("free");
        assert_eq!(bus.find(0x0900_0ffc, 8), Err(MmioMiss::Straddles(uart)));
        assert_eq!(bus.find(0x0900_1000, 8), Ok((DeviceId::Gic, 0)));
    }

    proptest::proptest! {
        /// `find` accepts an access exactly when all its bytes are in one
        /// window, and then names that window's device and offset.
        #[test]
        fn find_accepts_exactly_the_accesses_inside_a_window(
            anywhere in 0x0800_0000u64..0x0a00_0000,
            before_an_end in 1u64..24,
            near_an_end in proptest::bool::ANY,
            end in proptest::sample::select(vec![0x0801_0000u64, 0x080e_0000, 0x0900_1000]),
            size in proptest::sample::select(vec![1u64, 2, 4, 8, 16]),
        ) {
            // Half the accesses start in the last bytes of a window.
            let ipa = if near_an_end { end - before_an_end } else { anywhere };
            let regions = [
                MmioRegion { base: 0x0800_0000, size: 0x1_0000, device: DeviceId::Gic },
                MmioRegion { base: 0x080a_0000, size: 0x4_0000, device: DeviceId::Gic },
                MmioRegion { base: 0x0900_0000, size: 0x1000, device: DeviceId::Uart },
            ];
            let mut bus = MmioBus::new();
            for region in regions {
                bus.add(region).expect("disjoint");
            }
            let holder = regions
                .iter()
                .find(|r| ipa >= r.base && ipa + size <= r.base + r.size);
            match holder {
                Some(r) => proptest::prop_assert_eq!(
                    bus.find(ipa, size),
                    Ok((r.device, ipa - r.base))
                ),
                None => proptest::prop_assert!(bus.find(ipa, size).is_err()),
            }
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
