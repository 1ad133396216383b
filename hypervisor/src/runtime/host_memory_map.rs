//! The hypervisor's own view of host memory, planned at boot from the
//! platform:
//! which RAM the frame allocator may hand out, and how the EL2 stage-1
//! identity map covers each range ([`HostMemoryMap::plan`]). The machine
//! (`arch::boot::memory`) builds the allocator and the tables from the
//! plan; nothing here touches memory.
//!
//! # The plan
//!
//! - **Free RAM**: every RAM bank minus what is in use at boot (the image,
//!   the device tree, the boot payload) and the reserved-memory regions,
//!   each part shrunk to whole frames.
//! - **Normal memory, read-write, execute-never**: all RAM except the
//!   image's text, the stack guard pages (left out so an overflow faults)
//!   and the `no-map` reserved regions (left out entirely, widened to
//!   whole frames).
//! - **The image's text**: read-only and executable.
//! - **Device memory**: the console UART, the GIC's frames (a GICv3's
//!   distributor, redistributors and ITS; a GICv2's distributor, CPU
//!   interface and virtual interface control), and the host's
//!   virtio-mmio windows, each widened to whole frames. A GICv2's CPU
//!   interface is mapped 8 KiB long at least: `GICC_DIR` is in its second
//!   page, which some device trees leave out.

use crate::drivers::gic::gicv2::gicc;
use crate::platform::Platform;
use crate::platform::ranges::{self, PhysRange};
use alloc::vec;
use alloc::vec::Vec;

/// The granule of the frame allocator and of the EL2 map.
pub const FRAME_SIZE: u64 = 4096;

/// Host memory as the hypervisor allocates and maps it (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMemoryMap {
    /// RAM for the frame allocator, in whole frames.
    pub free: Vec<PhysRange>,
    /// Normal memory mapped read-write and execute-never.
    pub data: Vec<PhysRange>,
    /// The image's text, mapped read-only and executable.
    pub text: PhysRange,
    /// Device memory.
    pub devices: Vec<PhysRange>,
}

impl HostMemoryMap {
    /// The plan for `platform`, with `in_use` taken at boot, the image's
    /// `text`, the stack `guard_pages` and `more_devices` (the host's
    /// virtio-mmio windows) to map as devices.
    pub fn plan(
        platform: &Platform,
        in_use: Vec<PhysRange>,
        text: PhysRange,
        guard_pages: &[PhysRange],
        more_devices: &[PhysRange],
    ) -> Self {
        let mut taken = in_use;
        taken.extend(platform.reserved.iter().copied());
        let free = ranges::subtract(platform.ram.clone(), taken)
            .into_iter()
            .map(|r| r.align_in(FRAME_SIZE))
            .filter(|r| !r.is_empty())
            .collect();
        let mut data = Vec::new();
        for bank in &platform.ram {
            let mut holes = vec![text];
            holes.extend_from_slice(guard_pages);
            holes.extend(platform.no_map.iter().map(|r| r.align_out(FRAME_SIZE)));
            data.extend(ranges::subtract(vec![*bank], holes));
        }
        let mut devices = vec![platform.uart];
        if let Some(gic) = &platform.gic {
            devices.push(gic.distributor);
            devices.extend(gic.redistributors.iter().copied());
            devices.extend(gic.its);
        }
        if let Some(gic) = &platform.gicv2 {
            devices.push(gic.distributor);
            let gicc_size = gic.cpu_interface.size().max(gicc::FRAME_SIZE);
            devices.push(PhysRange::from_start_size(
                gic.cpu_interface.start,
                gicc_size,
            ));
            devices.extend(gic.hyp_interface);
        }
        devices.extend(more_devices.iter().copied());
        let devices = devices
            .into_iter()
            .map(|r| r.align_out(FRAME_SIZE))
            .collect();
        Self {
            free,
            data,
            text,
            devices,
        }
    }

    /// Bytes of [`free`](Self::free) RAM.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(PhysRange::size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Gicv2;

    fn range(start: u64, end: u64) -> PhysRange {
        PhysRange { start, end }
    }

    /// 1 GiB of RAM at 1 GiB, a PL011 at 0x0900_0000, nothing else.
    fn platform() -> Platform {
        let mut platform = Platform::for_tests();
        platform.ram = vec![range(0x4000_0000, 0x8000_0000)];
        platform
    }

    #[test]
    fn free_ram_leaves_out_what_is_in_use_and_reserved_in_whole_frames() {
        let mut platform = platform();
        platform.reserved = vec![range(0x5000_0100, 0x5000_0200)];
        let image = range(0x4008_0000, 0x4020_0000);
        let dtb = range(0x4800_0000, 0x4800_1234);
        let plan = HostMemoryMap::plan(&platform, vec![image, dtb], image, &[], &[]);
        assert_eq!(
            plan.free,
            vec![
                range(0x4000_0000, 0x4008_0000),
                range(0x4020_0000, 0x4800_0000),
                range(0x4800_2000, 0x5000_0000),
                range(0x5000_1000, 0x8000_0000),
            ]
        );
        assert_eq!(plan.free_bytes(), 0x4000_0000 - 0x18_0000 - 0x2000 - 0x1000);
    }

    #[test]
    fn ram_is_data_but_the_text_guard_pages_and_no_map_regions() {
        let mut platform = platform();
        platform.no_map = vec![range(0x7000_0010, 0x7000_1010)];
        let text = range(0x4008_0000, 0x4010_0000);
        let guards = [
            range(0x4100_0000, 0x4100_1000),
            range(0x4200_0000, 0x4200_1000),
        ];
        let plan = HostMemoryMap::plan(&platform, vec![], text, &guards, &[]);
        assert_eq!(plan.text, text);
        assert_eq!(
            plan.data,
            vec![
                range(0x4000_0000, 0x4008_0000),
                range(0x4010_0000, 0x4100_0000),
                range(0x4100_1000, 0x4200_0000),
                range(0x4200_1000, 0x7000_0000),
                range(0x7000_2000, 0x8000_0000),
            ]
        );
    }

    #[test]
    fn devices_are_the_uart_the_gic_frames_and_the_virtio_windows_in_whole_frames() {
        let mut platform = platform();
        platform.uart = PhysRange::from_start_size(0x0900_0000, 0x100);
        platform.gicv2 = Some(Gicv2 {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1000),
            // Only the first page of the CPU interface named.
            cpu_interface: PhysRange::from_start_size(0x0801_0000, 0x1000),
            hyp_interface: Some(PhysRange::from_start_size(0x0803_0000, 0x1000)),
            virtual_cpu: None,
            maintenance_intid: None,
        });
        let virtio = [PhysRange::from_start_size(0x0a00_0200, 0x200)];
        let text = range(0x4008_0000, 0x4010_0000);
        let plan = HostMemoryMap::plan(&platform, vec![], text, &[], &virtio);
        assert_eq!(
            plan.devices,
            vec![
                range(0x0900_0000, 0x0900_1000),
                range(0x0800_0000, 0x0800_1000),
                range(0x0801_0000, 0x0801_2000),
                range(0x0803_0000, 0x0803_1000),
                range(0x0a00_0000, 0x0a00_1000),
            ]
        );
    }
}
