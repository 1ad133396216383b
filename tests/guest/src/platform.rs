//! What the guest learns from the device tree it is given in `x0`: RAM
//! ranges, the CPUs' MPIDRs, the PL011 base, the GICv3 frames and the
//! architected timer's `interrupts` cells (when present), the GICv3 ITS
//! (`arm,gic-v3-its` node: its `reg` base), the virtio-mmio
//! devices (`virtio,mmio` nodes: window and SPI), the initrd and the
//! bootargs (read by [`crate::bootargs`]), plus the ranges that are not free
//! RAM (image, device tree, initrd, `/memreserve/` entries).
//!
//! Everything is kept in fixed-size arrays: the guest has no heap.

use fdt::Fdt;

use crate::boot::{self, MAX_CPUS};
use crate::memory_map::{self, MemRange};

/// Most RAM ranges and reserved ranges the guest keeps track of.
const MAX_RANGES: usize = 8;
/// Most `interrupts` cells kept from the timer node (four 3-cell entries).
const MAX_TIMER_CELLS: usize = 12;
/// Most virtio-mmio devices the guest keeps track of (QEMU `virt` and the
/// hypervisor have at most 32 windows).
pub const MAX_VIRTIO: usize = 32;

/// A `virtio,mmio` node: the device's register window and its interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioWindow {
    /// The register window.
    pub window: MemRange,
    /// Its INTID (an SPI: 32 + the specifier's number), when the node has
    /// `interrupts`.
    pub intid: Option<u32>,
}

/// Where the GIC is: a GICv3 (`arm,gic-v3`: `reg` = distributor,
/// redistributors) or a GICv2 (`arm,cortex-a15-gic`, `arm,gic-400`: `reg` =
/// distributor, CPU interface).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GicFrames {
    /// Distributor base.
    pub distributor: u64,
    /// The (first) redistributor region (empty on a GICv2).
    pub redistributors: MemRange,
    /// A GICv2's CPU interface base (`None`: a GICv3).
    pub cpu_interface: Option<u64>,
}

/// Why the device tree could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlatformError {
    /// The blob in `x0` is not a valid flattened device tree.
    BadDeviceTree,
    /// No RAM range in `/memory`.
    NoMemory,
    /// More RAM ranges than the guest keeps.
    TooManyRamRanges,
    /// No CPU in `/cpus`.
    NoCpus,
    /// No PL011 (`arm,pl011`) with a `reg`.
    NoUart,
}

impl PlatformError {
    /// Failure code for `TEST_REPORT` (the console may be unknown).
    pub fn code(self) -> u64 {
        0xbad1_0000
            + match self {
                PlatformError::BadDeviceTree => 1,
                PlatformError::NoMemory => 2,
                PlatformError::TooManyRamRanges => 3,
                PlatformError::NoCpus => 4,
                PlatformError::NoUart => 6,
            }
    }
}

/// The machine as the device tree describes it.
pub struct Platform {
    ram: [MemRange; MAX_RANGES],
    ram_count: usize,
    reserved: [MemRange; MAX_RANGES],
    reserved_count: usize,
    cpus: [u64; MAX_CPUS],
    cpu_count: usize,
    /// CPUs in the device tree, counting those beyond [`MAX_CPUS`].
    pub cpus_in_tree: usize,
    /// Base address of the PL011 used as console.
    pub uart_base: u64,
    /// Where the device tree itself lies.
    pub dtb: MemRange,
    /// The bootargs (`/chosen/bootargs`), empty when absent.
    pub bootargs: &'static str,
    /// The GICv3, when the tree has one with both regions.
    pub gic: Option<GicFrames>,
    /// The base of the (first) GICv3 ITS, from an `arm,gic-v3-its` node's
    /// `reg` (QEMU `virt`: a child of the GIC node at 0x0808_0000).
    pub its: Option<u64>,
    timer_cells: [u32; MAX_TIMER_CELLS],
    /// `None` without an `arm,armv8-timer` node with `interrupts`.
    timer_cell_count: Option<usize>,
    virtio: [VirtioWindow; MAX_VIRTIO],
    virtio_count: usize,
}

impl Platform {
    /// Reads the device tree at `dtb`.
    pub fn from_dtb(dtb: u64) -> Result<Platform, PlatformError> {
        // The blob stays where the loader put it for the guest's whole life.
        // SAFETY: the boot protocol puts a device tree at `x0`, identity mapped
        // as normal memory when it lies in the image's gigabyte, or as device
        // memory in the first gigabyte; `from_ptr` checks the magic first and
        // reads no further than the header's `totalsize`.
        let fdt: Fdt<'static> =
            unsafe { Fdt::from_ptr(dtb as *const u8) }.map_err(|_| PlatformError::BadDeviceTree)?;
        let mut platform = Platform {
            ram: [MemRange { start: 0, end: 0 }; MAX_RANGES],
            ram_count: 0,
            reserved: [MemRange { start: 0, end: 0 }; MAX_RANGES],
            reserved_count: 0,
            cpus: [0; MAX_CPUS],
            cpu_count: 0,
            cpus_in_tree: 0,
            uart_base: 0,
            dtb: MemRange {
                start: dtb,
                end: dtb + fdt.total_size() as u64,
            },
            bootargs: fdt.chosen().bootargs().unwrap_or(""),
            gic: None,
            its: None,
            timer_cells: [0; MAX_TIMER_CELLS],
            timer_cell_count: None,
            virtio: [VirtioWindow {
                window: MemRange { start: 0, end: 0 },
                intid: None,
            }; MAX_VIRTIO],
            virtio_count: 0,
        };
        for region in fdt.memory().regions() {
            let Some(size) = region.size.filter(|&s| s > 0) else {
                continue;
            };
            let start = region.starting_address as u64;
            if platform.ram_count == MAX_RANGES {
                return Err(PlatformError::TooManyRamRanges);
            }
            platform.ram[platform.ram_count] = MemRange {
                start,
                end: start + size as u64,
            };
            platform.ram_count += 1;
        }
        if platform.ram_count == 0 {
            return Err(PlatformError::NoMemory);
        }
        for cpu in fdt.cpus() {
            platform.cpus_in_tree += 1;
            if platform.cpu_count < MAX_CPUS {
                platform.cpus[platform.cpu_count] = cpu.ids().first() as u64;
                platform.cpu_count += 1;
            }
        }
        if platform.cpu_count == 0 {
            return Err(PlatformError::NoCpus);
        }
        let uart = fdt
            .chosen()
            .stdout()
            .filter(|node| {
                node.compatible()
                    .is_some_and(|c| c.all().any(|name| name == "arm,pl011"))
            })
            .or_else(|| fdt.find_compatible(&["arm,pl011"]))
            .ok_or(PlatformError::NoUart)?;
        platform.uart_base = uart
            .reg()
            .and_then(|mut regs| regs.next())
            .map(|reg| reg.starting_address as u64)
            .ok_or(PlatformError::NoUart)?;

        if let Some(gic) = fdt.find_compatible(&["arm,gic-v3"]) {
            let mut regs = gic.reg().into_iter().flatten();
            if let (Some(distributor), Some(redistributors)) = (regs.next(), regs.next()) {
                let start = redistributors.starting_address as u64;
                platform.gic = Some(GicFrames {
                    distributor: distributor.starting_address as u64,
                    redistributors: MemRange {
                        start,
                        end: start + redistributors.size.unwrap_or(0) as u64,
                    },
                    cpu_interface: None,
                });
            }
        } else if let Some(gic) = fdt.find_compatible(&["arm,cortex-a15-gic", "arm,gic-400"]) {
            let mut regs = gic.reg().into_iter().flatten();
            if let (Some(distributor), Some(cpu)) = (regs.next(), regs.next()) {
                platform.gic = Some(GicFrames {
                    distributor: distributor.starting_address as u64,
                    redistributors: MemRange { start: 0, end: 0 },
                    cpu_interface: Some(cpu.starting_address as u64),
                });
            }
        }
        platform.its = fdt
            .find_compatible(&["arm,gic-v3-its"])
            .and_then(|its| its.reg().and_then(|mut regs| regs.next()))
            .map(|reg| reg.starting_address as u64);
        if let Some(interrupts) = fdt
            .find_compatible(&["arm,armv8-timer"])
            .and_then(|timer| timer.property("interrupts"))
        {
            let mut count = 0;
            for (cell, bytes) in platform
                .timer_cells
                .iter_mut()
                .zip(interrupts.value.chunks_exact(4))
            {
                *cell = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                count += 1;
            }
            platform.timer_cell_count = Some(count);
        }

        for node in fdt.all_nodes() {
            let is_virtio = node
                .compatible()
                .is_some_and(|c| c.all().any(|name| name == "virtio,mmio"));
            let reg = node.reg().and_then(|mut regs| regs.next());
            let (true, Some(reg)) = (is_virtio, reg) else {
                continue;
            };
            if platform.virtio_count == MAX_VIRTIO {
                break;
            }
            let start = reg.starting_address as u64;
            let cell = |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            // `interrupts = <0 (SPI) number flags>`: INTID 32 + number.
            let intid = node
                .property("interrupts")
                .filter(|p| p.value.len() >= 8 && cell(&p.value[..4]) == 0)
                .map(|p| 32 + cell(&p.value[4..8]));
            platform.virtio[platform.virtio_count] = VirtioWindow {
                window: MemRange {
                    start,
                    end: start + reg.size.unwrap_or(0) as u64,
                },
                intid,
            };
            platform.virtio_count += 1;
        }

        let (image_start, image_end) = boot::image_range();
        platform.reserve(MemRange {
            start: image_start,
            end: image_end,
        });
        platform.reserve(platform.dtb);
        if let Some(chosen) = fdt.find_node("/chosen") {
            let start = chosen
                .property("linux,initrd-start")
                .and_then(|p| p.as_usize());
            let end = chosen
                .property("linux,initrd-end")
                .and_then(|p| p.as_usize());
            if let (Some(start), Some(end)) = (start, end) {
                platform.reserve(MemRange {
                    start: start as u64,
                    end: end as u64,
                });
            }
        }
        for reservation in fdt.memory_reservations() {
            let start = reservation.address() as u64;
            platform.reserve(MemRange {
                start,
                end: start + reservation.size() as u64,
            });
        }
        Ok(platform)
    }

    /// Records a range that is not free RAM; past the array's capacity the
    /// range is merged into the last one (which only shrinks free RAM).
    fn reserve(&mut self, range: MemRange) {
        if range.start >= range.end {
            return;
        }
        if self.reserved_count < MAX_RANGES {
            self.reserved[self.reserved_count] = range;
            self.reserved_count += 1;
        } else {
            let last = &mut self.reserved[MAX_RANGES - 1];
            last.start = last.start.min(range.start);
            last.end = last.end.max(range.end);
        }
    }

    /// RAM ranges.
    pub fn ram(&self) -> &[MemRange] {
        &self.ram[..self.ram_count]
    }

    /// MPIDRs of the CPUs, in device-tree order (at most [`MAX_CPUS`]).
    pub fn cpus(&self) -> &[u64] {
        &self.cpus[..self.cpu_count]
    }

    /// The timer node's `interrupts` cells (at most four entries), `None`
    /// without a timer node.
    pub fn timer_cells(&self) -> Option<&[u32]> {
        self.timer_cell_count
            .map(|count| &self.timer_cells[..count])
    }

    /// The `virtio,mmio` devices, in device-tree order.
    pub fn virtio(&self) -> &[VirtioWindow] {
        &self.virtio[..self.virtio_count]
    }

    /// Whether `address` lies in RAM.
    pub fn is_ram(&self, address: u64) -> bool {
        self.ram().iter().any(|r| r.contains(address))
    }

    /// The largest page-aligned range of RAM that overlaps nothing reserved.
    pub fn largest_free_range(&self) -> Option<MemRange> {
        memory_map::largest_free_range(self.ram(), &self.reserved[..self.reserved_count])
    }
}
