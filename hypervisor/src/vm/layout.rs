//! The guest's physical address map and where the boot path puts things in it.
//!
//! The guest sees RAM at [`GUEST_RAM_BASE`], an emulated PL011 at
//! [`GUEST_UART_BASE`] (its interrupt is SPI [`GUEST_UART_SPI`]) and a
//! virtual GICv3 (distributor at [`GUEST_GICD_BASE`], one 128 KiB
//! redistributor per vCPU from [`GUEST_GICR_BASE`], the ITS at
//! [`GUEST_ITS_BASE`]), or on a GICv2 host a
//! virtual GICv2 (distributor at [`GUEST_GICD_BASE`], the CPU interface at
//! [`GUEST_GICC_BASE`]), and its virtio-mmio devices from
//! [`GUEST_VIRTIO_BASE`] (SPIs from [`GUEST_VIRTIO_FIRST_SPI`]), where QEMU's
//! `virt` board has them; nothing else is mapped. Inside guest RAM the kernel
//! goes at the 2 MiB aligned RAM base plus its `text_offset`; the device tree
//! goes at the first 2 MiB boundary after the kernel's `image_size` (where
//! Linux's early mapping can reach it, and it never shares a block with the
//! kernel), and the initrd at the next 2 MiB boundary after the device tree.

use crate::platform::ranges::PhysRange;

/// IPA of guest RAM.
pub const GUEST_RAM_BASE: u64 = 0x4000_0000;
/// IPA of the emulated PL011.
pub const GUEST_UART_BASE: u64 = 0x0900_0000;
/// Size of the emulated PL011's window.
pub const GUEST_UART_SIZE: u64 = crate::devices::pl011::WINDOW_SIZE;
/// IPA of the virtual GIC distributor.
pub const GUEST_GICD_BASE: u64 = 0x0800_0000;
/// IPA of vCPU 0's redistributor; vCPU n's follows at n * 128 KiB.
pub const GUEST_GICR_BASE: u64 = 0x080a_0000;
/// IPA of the virtual GICv3's ITS (its two 64 KiB frames), where QEMU's
/// `virt` board has its own.
pub const GUEST_ITS_BASE: u64 = 0x0808_0000;
/// IPA of a GICv2 guest's CPU interface (the hardware's `GICV` frame).
pub const GUEST_GICC_BASE: u64 = 0x0801_0000;
/// Size of the GICv2 CPU interface window, as QEMU's `virt` describes it.
pub const GUEST_GICC_SIZE: u64 = 0x1_0000;
/// The PL011's SPI number (INTID 32 + 1 = 33).
pub const GUEST_UART_SPI: u32 = 1;
/// SPIs the virtual GIC implements (INTIDs 32..96).
pub const GUEST_SPI_COUNT: u32 = 64;
/// The guest's timer PPIs as INTIDs: secure physical, non-secure physical,
/// virtual, hypervisor physical.
pub const GUEST_TIMER_INTIDS: [u32; 4] = [29, 30, 27, 26];
/// The GIC maintenance interrupt (INTID 25) as the guest sees it.
pub const GUEST_MAINTENANCE_INTID: u32 = 25;

/// IPA of the first virtio-mmio window (QEMU `virt`'s transports).
pub const GUEST_VIRTIO_BASE: u64 = 0x0a00_0000;
/// Distance between two virtio-mmio windows, and each window's size.
pub const GUEST_VIRTIO_STRIDE: u64 = 0x200;
/// The first virtio-mmio device's SPI number (INTID 48); device `i` has
/// SPI `GUEST_VIRTIO_FIRST_SPI + i`.
pub const GUEST_VIRTIO_FIRST_SPI: u32 = 16;
/// Most virtio-mmio devices a VM can have (SPIs 16..48, inside
/// [`GUEST_SPI_COUNT`]).
pub const GUEST_VIRTIO_MAX: usize = 32;

/// The window and SPI number of a VM's `index`-th virtio-mmio device
/// (`index < GUEST_VIRTIO_MAX`).
pub fn virtio_slot(index: usize) -> (PhysRange, u32) {
    let base = GUEST_VIRTIO_BASE + index as u64 * GUEST_VIRTIO_STRIDE;
    (
        PhysRange::from_start_size(base, GUEST_VIRTIO_STRIDE),
        GUEST_VIRTIO_FIRST_SPI + index as u32,
    )
}

/// Room reserved for the guest device tree.
pub const GUEST_DTB_MAX: u64 = 0x1_0000;

const SZ_2M: u64 = 0x20_0000;

fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// Where each part of the boot payload goes, as guest physical addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestPlacement {
    /// The kernel's load address, which is also its entry point.
    pub kernel: PhysRange,
    /// The device tree.
    pub dtb: PhysRange,
    /// The initrd, when there is one.
    pub initrd: Option<PhysRange>,
    /// Guest RAM from here up is not used by the boot payload.
    pub free_from: u64,
}

/// The payload does not fit in guest RAM; `.0` is the bytes it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoesNotFit(pub u64);

impl core::fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "the payload needs {:#x} bytes of guest RAM", self.0)
    }
}

impl core::error::Error for DoesNotFit {}

/// Places a kernel (`text_offset`, `image_size`) and an initrd of
/// `initrd_len` bytes in `ram`.
pub fn place(
    ram: PhysRange,
    text_offset: u64,
    image_size: u64,
    initrd_len: Option<u64>,
) -> Result<GuestPlacement, DoesNotFit> {
    let too_big = DoesNotFit(u64::MAX);
    let base = align_up(ram.start, SZ_2M).ok_or(too_big)?;
    let kernel_start = base.checked_add(text_offset).ok_or(too_big)?;
    let kernel = PhysRange {
        start: kernel_start,
        end: kernel_start.checked_add(image_size).ok_or(too_big)?,
    };
    let dtb_start = align_up(kernel.end, SZ_2M).ok_or(too_big)?;
    let dtb = PhysRange::from_start_size(dtb_start, GUEST_DTB_MAX);
    let initrd = match initrd_len {
        Some(len) => {
            let start = align_up(dtb.end, SZ_2M).ok_or(too_big)?;
            Some(PhysRange {
                start,
                end: start.checked_add(len).ok_or(too_big)?,
            })
        }
        None => None,
    };
    let end = initrd.map_or(dtb.end, |r| r.end);
    if end > ram.end {
        return Err(DoesNotFit(end - ram.start));
    }
    Ok(GuestPlacement {
        kernel,
        dtb,
        initrd,
        free_from: align_up(end, SZ_2M).ok_or(too_big)?,
    })
}

/// The MPIDR the guest reads on vCPU `index`: Aff0 counts 0..15 inside a
/// cluster, Aff1 numbers clusters (GICv3 targets 16 CPUs per cluster without
/// range selectors). Bit 31 is RES1.
pub fn vcpu_mpidr(index: usize) -> u64 {
    let index = index as u64;
    (1 << 31) | ((index / 16) << 8) | (index % 16)
}

/// The vCPU index of a guest MPIDR, if it names one of `vcpus` vCPUs.
pub fn vcpu_index(mpidr: u64, vcpus: usize) -> Option<usize> {
    let affinity = mpidr & 0xff_00ff_ffff;
    if affinity >> 16 != 0 {
        return None;
    }
    let index = ((affinity >> 8) & 0xff) * 16 + (affinity & 0xff);
    ((affinity & 0xff) < 16 && (index as usize) < vcpus).then_some(index as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement() {
        let ram = PhysRange::from_start_size(GUEST_RAM_BASE, 128 << 20);
        let p = place(ram, 0, 0x3_0000, Some(0x1000)).expect("fits");
        assert_eq!(
            p.kernel,
            PhysRange {
                start: 0x4000_0000,
                end: 0x4003_0000
            }
        );
        assert_eq!(p.dtb.start, 0x4020_0000);
        assert_eq!(p.initrd.expect("initrd").start, 0x4040_0000);
        assert_eq!(p.free_from, 0x4060_0000);
        let p = place(ram, 0x8_0000, 0x20_0000, None).expect("fits");
        assert_eq!(p.kernel.start, 0x4008_0000);
        assert_eq!(p.dtb.start, 0x4040_0000);
        assert_eq!(p.initrd, None);
        assert!(place(ram, 0, 200 << 20, None).is_err());
    }

    #[test]
    fn debian_kernel_placement() {
        // Debian bookworm's arm64 Image: text_offset 0, image_size 0x2010000
        // (its BSS included), flags 0xa; a 1 MiB initramfs; 512 MiB of RAM.
        let ram = PhysRange::from_start_size(GUEST_RAM_BASE, 512 << 20);
        let p = place(ram, 0, 0x201_0000, Some(1_039_786)).expect("fits");
        assert_eq!(p.kernel.start, GUEST_RAM_BASE);
        // Nothing the kernel occupies (up to image_size) is reused.
        assert!(p.dtb.start >= p.kernel.end);
        assert_eq!(p.dtb.start, 0x4220_0000);
        assert_eq!(p.dtb.start % 8, 0);
        let initrd = p.initrd.expect("initrd");
        assert!(initrd.start >= p.dtb.end);
        assert_eq!(initrd.start % 4096, 0);
        assert!(initrd.end <= ram.end);
        // The DTB lies within one 2 MiB block, as the boot protocol asks.
        assert_eq!(p.dtb.start >> 21, (p.dtb.end - 1) >> 21);
    }

    #[test]
    fn virtio_slots_follow_qemu_virt_and_fit_the_vgic() {
        assert_eq!(
            virtio_slot(0),
            (PhysRange::from_start_size(0x0a00_0000, 0x200), 16)
        );
        let (last, spi) = virtio_slot(GUEST_VIRTIO_MAX - 1);
        assert_eq!(last.end, 0x0a00_4000);
        assert!(spi < GUEST_SPI_COUNT);
        assert!(spi != GUEST_UART_SPI && GUEST_VIRTIO_FIRST_SPI > GUEST_UART_SPI);
    }

    #[test]
    fn mpidrs_round_trip() {
        for i in 0..300 {
            let mpidr = vcpu_mpidr(i);
            assert_eq!(vcpu_index(mpidr, 300), Some(i));
            assert_eq!(
                vcpu_index(mpidr & !(1 << 31), 300),
                Some(i),
                "bit 31 is ignored"
            );
        }
        assert_eq!(vcpu_mpidr(0), 0x8000_0000);
        assert_eq!(vcpu_mpidr(17), 0x8000_0101);
        assert_eq!(vcpu_index(vcpu_mpidr(4), 4), None);
        assert_eq!(vcpu_index(0x1_0000, 4), None);
        assert_eq!(vcpu_index(0x10, 64), None, "Aff0 stays below 16");
    }
}
