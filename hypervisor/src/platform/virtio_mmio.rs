//! The host's virtio-mmio transports, read from its device tree: where the
//! disks the hypervisor drives may be (`drivers::host_disk`).
//!
//! # What the tree says and what it does not
//!
//! Every node with `compatible = "virtio,mmio"` (and no `status` other than
//! `okay`/`ok`) is a transport: a register window (`reg`, translated to a
//! CPU address like every device here), an interrupt and, where DMA is
//! coherent, `dma-coherent`. QEMU's `virt` machine always declares 32 of
//! them, 0x200 bytes apart from `0x0a00_0000`, whether a device is plugged
//! in or not: what sits behind a window (nothing: DeviceID 0; a disk:
//! DeviceID 2) is known only by reading its register `0x008` at EL2, so
//! this module only lists the windows and orders them.
//!
//! # Numbering
//!
//! QEMU plugs the first `-device virtio-...-device` of its command line into
//! the transport at the highest address, the next one below it, and so on.
//! So that "host disk 0" is the first disk the runner gave QEMU, windows are
//! listed from the highest address down ([`windows`]) and the host-disk
//! driver (`drivers::host_disk`) numbers the disks it finds in that order (the N-th window whose DeviceID
//! is 2 is host disk N).
//!
//! # Guests never see them
//!
//! A guest's device tree is generated (`vm::device_tree`) and its stage 2
//! maps only its RAM and the emulated devices' pages, so none of these
//! windows reaches a guest; the hypervisor maps them for itself only.

use super::device_tree::{PlatformError, all_located, device_regs, gic_intid, is_compatible};
use crate::platform::ranges::PhysRange;
use alloc::vec::Vec;
use fdt::Fdt;

/// The `compatible` of a virtio-mmio transport.
pub const COMPATIBLE: &str = "virtio,mmio";

/// The size of a virtio-mmio register window the driver needs: the header
/// (`0x000..0x100`) and the device's configuration space after it.
pub const MIN_WINDOW_SIZE: u64 = 0x200;

/// One virtio-mmio transport of the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioMmioWindow {
    /// Its registers (a CPU physical address range).
    pub regs: PhysRange,
    /// Its interrupt as a GIC INTID, when the tree gives one (the driver
    /// polls and does not use it).
    pub intid: Option<u32>,
    /// Whether the node says `dma-coherent`: the device's DMA snoops the
    /// CPUs' caches, so buffers need no cache maintenance around requests.
    pub dma_coherent: bool,
}

/// The host's usable virtio-mmio windows, highest address first (the order
/// in which host disks are numbered, see the module documentation). A node
/// whose `reg` is missing, malformed, untranslatable or smaller than
/// [`MIN_WINDOW_SIZE`] is left out, as is a disabled one.
pub fn windows(dtb: &[u8]) -> Result<Vec<VirtioMmioWindow>, PlatformError> {
    let fdt = Fdt::new(dtb).map_err(|e| PlatformError::BadDeviceTree(alloc::format!("{e:?}")))?;
    let nodes = all_located(&fdt);
    let mut out = Vec::new();
    for located in nodes.iter().copied() {
        let node = located.node;
        if !is_compatible(node, COMPATIBLE) {
            continue;
        }
        if let Some(status) = node.property("status").and_then(|p| p.as_str())
            && status != "okay"
            && status != "ok"
        {
            continue;
        }
        let Ok(regs) = device_regs(&nodes, located) else {
            continue;
        };
        let Some(&regs) = regs.first() else { continue };
        if regs.size() < MIN_WINDOW_SIZE {
            continue;
        }
        out.push(VirtioMmioWindow {
            regs,
            intid: node.property("interrupts").and_then(|p| gic_intid(p.value)),
            dma_coherent: node.property("dma-coherent").is_some(),
        });
    }
    out.sort_by_key(|w| core::cmp::Reverse(w.regs.start));
    out.dedup_by_key(|w| w.regs.start);
    Ok(out)
}

/// Every page the windows occupy, 4 KiB aligned and merged: what the
/// hypervisor maps as device memory for itself at EL2.
pub fn pages(windows: &[VirtioMmioWindow]) -> Vec<PhysRange> {
    crate::platform::ranges::normalize(windows.iter().map(|w| w.regs.align_out(0x1000)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_fdt::FdtWriter;

    /// A tree with `/soc` (identity `ranges`) holding virtio-mmio nodes at
    /// `addrs` in the order given, each `size` bytes; `extra` adds
    /// properties to the node at that index.
    fn tree(addrs: &[u64], size: u64, extra: &dyn Fn(usize, &mut FdtWriter)) -> Vec<u8> {
        let mut w = FdtWriter::new().unwrap();
        let root = w.begin_node("").unwrap();
        w.property_u32("#address-cells", 2).unwrap();
        w.property_u32("#size-cells", 2).unwrap();
        let soc = w.begin_node("soc").unwrap();
        w.property_u32("#address-cells", 2).unwrap();
        w.property_u32("#size-cells", 2).unwrap();
        w.property_null("ranges").unwrap();
        for (i, &addr) in addrs.iter().enumerate() {
            let node = w.begin_node(&format!("virtio_mmio@{addr:x}")).unwrap();
            w.property_string("compatible", COMPATIBLE).unwrap();
            w.property_array_u64("reg", &[addr, size]).unwrap();
            w.property_array_u32("interrupts", &[0, 16 + i as u32, 1])
                .unwrap();
            extra(i, &mut w);
            w.end_node(node).unwrap();
        }
        let uart = w.begin_node("pl011@9000000").unwrap();
        w.property_string("compatible", "arm,pl011").unwrap();
        w.property_array_u64("reg", &[0x0900_0000, 0x1000]).unwrap();
        w.end_node(uart).unwrap();
        w.end_node(soc).unwrap();
        w.end_node(root).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn windows_come_highest_address_first() {
        let dtb = tree(&[0x0a00_0000, 0x0a00_0400, 0x0a00_0200], 0x200, &|i, w| {
            if i != 1 {
                w.property_null("dma-coherent").unwrap();
            }
        });
        let found = windows(&dtb).unwrap();
        let starts: Vec<u64> = found.iter().map(|w| w.regs.start).collect();
        assert_eq!(starts, [0x0a00_0400, 0x0a00_0200, 0x0a00_0000]);
        assert_eq!(found[0].intid, Some(32 + 17));
        assert!(!found[0].dma_coherent);
        assert!(found[1].dma_coherent && found[2].dma_coherent);
        assert_eq!(
            found[2].regs,
            PhysRange::from_start_size(0x0a00_0000, 0x200)
        );
    }

    #[test]
    fn disabled_small_and_other_nodes_are_left_out() {
        let dtb = tree(&[0x0a00_0000, 0x0a00_0200, 0x0a00_0400], 0x200, &|i, w| {
            if i == 0 {
                w.property_string("status", "disabled").unwrap();
            }
            if i == 2 {
                w.property_string("status", "okay").unwrap();
            }
        });
        let starts: Vec<u64> = windows(&dtb)
            .unwrap()
            .iter()
            .map(|w| w.regs.start)
            .collect();
        assert_eq!(starts, [0x0a00_0400, 0x0a00_0200]);
        let small = tree(&[0x0a00_0000], 0x100, &|_, _| {});
        assert!(windows(&small).unwrap().is_empty());
    }

    #[test]
    fn qemu_virt_has_32_transports_0x200_apart() {
        let dtb = include_bytes!("../../testdata/qemu-virt-smp4.dtb");
        let found = windows(dtb).unwrap();
        assert_eq!(found.len(), 32);
        for (i, w) in found.iter().enumerate() {
            let start = 0x0a00_0000 + 0x200 * (31 - i as u64);
            assert_eq!(w.regs, PhysRange::from_start_size(start, 0x200));
            assert_eq!(w.intid, Some(32 + 16 + 31 - i as u32));
            assert!(w.dma_coherent);
        }
        assert_eq!(
            pages(&found),
            [PhysRange::from_start_size(0x0a00_0000, 0x4000)]
        );
    }

    #[test]
    fn a_tree_without_transports_has_none() {
        let dtb = tree(&[], 0x200, &|_, _| {});
        assert!(windows(&dtb).unwrap().is_empty());
        assert!(pages(&[]).is_empty());
    }
}
