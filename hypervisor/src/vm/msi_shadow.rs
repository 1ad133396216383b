//! MSIs of passed PCIe devices: which DeviceIDs the physical ITS maps for a
//! VM, and which host LPIs stand for their events.
//!
//! # Why a shadow
//!
//! A passed PCIe device signals an MSI by a DMA write of its EventID to the
//! address Linux programmed: the virtual ITS's `GITS_TRANSLATER`. The VM's
//! RAM is at IPA == PA and the virtual ITS sits where the host's physical
//! ITS is, so the write reaches the *physical* ITS, with the device's PCI
//! requester ID as DeviceID. The hypervisor therefore mirrors every `MAPD`
//! the guest gives its virtual ITS for a DeviceID of a passed bus on the
//! physical ITS: the same DeviceID, an ITT of the same number of events,
//! each event mapped to a host LPI of the hypervisor's own, targeting the
//! host CPU of the VM's vCPU 0. A host LPI that fires is looked up here
//! ([`MsiShadow::event_of`]) and replayed through the virtual ITS as a
//! translation request with that DeviceID and EventID, so the guest's own
//! `MAPTI`/`MOVI`/`DISCARD` decide what it becomes.
//!
//! # The algorithm
//!
//! - [`LpiPool`]: the host LPIs the hypervisor owns, `FIRST_LPI..FIRST_LPI
//!   + size`, handed out as contiguous runs, first fit over a bitmap; a
//!   device's events are the run `first..first + events`.
//! - [`MsiShadow`]: one VM's mapped DeviceIDs, each with its run. Mapping
//!   is eager: a `MAPD` maps every event of the ITT at once, so MSIs need no
//!   further command on the physical ITS; events past
//!   [`MAX_SHADOW_EVENTS`] are not mapped (an ITT that large is not a
//!   passed device's).
//! - [`pci_bus_of`]: the bus number of a requester ID, which says whether a
//!   DeviceID is on a bus the VM owns.

use crate::drivers::its::driver::LpiRuns;
use alloc::vec::Vec;

/// The first LPI INTID.
pub const FIRST_LPI: u32 = 8192;
/// Events of one device mapped on the physical ITS at most.
pub const MAX_SHADOW_EVENTS: u32 = 1024;

/// The host LPIs the hypervisor hands to passed devices' events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LpiPool {
    /// One flag per LPI from [`FIRST_LPI`]: taken.
    taken: Vec<bool>,
}

impl LpiPool {
    /// A pool of `size` LPIs, all free.
    pub fn new(size: u32) -> Self {
        Self {
            taken: alloc::vec![false; size as usize],
        }
    }

    /// Takes `count` (> 0) contiguous LPIs, first fit; the first one's
    /// INTID, or `None` when no run is free.
    pub fn take(&mut self, count: u32) -> Option<u32> {
        let count = count as usize;
        if count == 0 || count > self.taken.len() {
            return None;
        }
        let mut start = 0;
        while start + count <= self.taken.len() {
            match self.taken[start..start + count].iter().rposition(|&t| t) {
                Some(busy) => start += busy + 1,
                None => {
                    self.taken[start..start + count].fill(true);
                    return Some(FIRST_LPI + start as u32);
                }
            }
        }
        None
    }

    /// Gives back the run of `count` LPIs from `first`.
    pub fn give_back(&mut self, first: u32, count: u32) {
        let Some(start) = first.checked_sub(FIRST_LPI) else {
            return;
        };
        let start = start as usize;
        let end = (start + count as usize).min(self.taken.len());
        if start < end {
            self.taken[start..end].fill(false);
        }
    }

    /// LPIs still free.
    pub fn free(&self) -> usize {
        self.taken.iter().filter(|&&t| !t).count()
    }
}

/// The host ITS driver hands out runs of this pool.
impl LpiRuns for LpiPool {
    fn with_size(size: u32) -> Self {
        Self::new(size)
    }

    fn take(&mut self, count: u32) -> Option<u32> {
        LpiPool::take(self, count)
    }

    fn give_back(&mut self, first: u32, count: u32) {
        LpiPool::give_back(self, first, count);
    }
}

/// A DeviceID mapped on the physical ITS for a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowDevice {
    /// The DeviceID (the PCI requester ID).
    pub device: u32,
    /// The host LPI of event 0; event `e` is `first + e`.
    pub first: u32,
    /// Events mapped.
    pub events: u32,
}

/// One VM's DeviceIDs mapped on the physical ITS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MsiShadow {
    devices: Vec<ShadowDevice>,
}

impl MsiShadow {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            devices: Vec::new(),
        }
    }

    /// The events of a `MAPD` with `events` ITT entries worth mapping.
    pub fn events_to_map(events: u64) -> u32 {
        events.min(u64::from(MAX_SHADOW_EVENTS)) as u32
    }

    /// Records `device` mapped (replacing an older record, which the
    /// caller unmapped first).
    pub fn insert(&mut self, entry: ShadowDevice) {
        self.remove(entry.device);
        self.devices.push(entry);
    }

    /// Forgets `device`; its record, for the caller to unmap.
    pub fn remove(&mut self, device: u32) -> Option<ShadowDevice> {
        let at = self.devices.iter().position(|d| d.device == device)?;
        Some(self.devices.swap_remove(at))
    }

    /// Forgets every device; their records.
    pub fn take_all(&mut self) -> Vec<ShadowDevice> {
        core::mem::take(&mut self.devices)
    }

    /// The record of `device`.
    pub fn get(&self, device: u32) -> Option<ShadowDevice> {
        self.devices.iter().copied().find(|d| d.device == device)
    }

    /// The (DeviceID, EventID) host LPI `intid` stands for.
    pub fn event_of(&self, intid: u32) -> Option<(u32, u32)> {
        self.devices.iter().find_map(|d| {
            let event = intid.checked_sub(d.first)?;
            (event < d.events).then_some((d.device, event))
        })
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// The bus number of PCI requester ID `device` (bus\[15:8\], device and
/// function \[7:0\]); `None` for a DeviceID beyond 16 bits.
pub fn pci_bus_of(device: u32) -> Option<u8> {
    (device <= 0xffff).then_some((device >> 8) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_hands_out_contiguous_runs_first_fit() {
        let mut pool = LpiPool::new(16);
        assert_eq!(pool.take(4), Some(FIRST_LPI));
        assert_eq!(pool.take(8), Some(FIRST_LPI + 4));
        assert_eq!(pool.take(8), None, "only 4 left");
        assert_eq!(pool.take(4), Some(FIRST_LPI + 12));
        assert_eq!(pool.free(), 0);
        pool.give_back(FIRST_LPI, 4);
        assert_eq!(pool.take(2), Some(FIRST_LPI));
        assert_eq!(pool.take(3), None, "2 free, then taken ones");
        assert_eq!(pool.take(2), Some(FIRST_LPI + 2));
        pool.give_back(FIRST_LPI + 4, 8);
        assert_eq!(pool.take(8), Some(FIRST_LPI + 4));
        assert_eq!(pool.take(0), None);
        assert_eq!(pool.take(17), None);
        // Out-of-range runs given back change nothing.
        pool.give_back(100, 4);
        pool.give_back(FIRST_LPI + 15, 100);
        assert_eq!(pool.free(), 1);
    }

    #[test]
    fn a_host_lpi_names_its_device_and_event() {
        let mut shadow = MsiShadow::new();
        shadow.insert(ShadowDevice {
            device: 0x8,
            first: FIRST_LPI,
            events: 4,
        });
        shadow.insert(ShadowDevice {
            device: 0x10,
            first: FIRST_LPI + 4,
            events: 2,
        });
        assert_eq!(shadow.event_of(FIRST_LPI + 3), Some((0x8, 3)));
        assert_eq!(shadow.event_of(FIRST_LPI + 5), Some((0x10, 1)));
        assert_eq!(shadow.event_of(FIRST_LPI + 6), None);
        assert_eq!(shadow.event_of(FIRST_LPI - 1), None);
        // A remap replaces the record.
        shadow.insert(ShadowDevice {
            device: 0x8,
            first: FIRST_LPI + 8,
            events: 1,
        });
        assert_eq!(shadow.event_of(FIRST_LPI), None);
        assert_eq!(shadow.event_of(FIRST_LPI + 8), Some((0x8, 0)));
        assert_eq!(shadow.remove(0x10).map(|d| d.events), Some(2));
        assert_eq!(shadow.remove(0x10), None);
        assert_eq!(shadow.take_all().len(), 1);
        assert!(shadow.is_empty());
    }

    #[test]
    fn large_itts_are_capped_and_buses_read_from_requester_ids() {
        assert_eq!(MsiShadow::events_to_map(4), 4);
        assert_eq!(MsiShadow::events_to_map(1 << 16), MAX_SHADOW_EVENTS);
        assert_eq!(pci_bus_of(0x0008), Some(0));
        assert_eq!(pci_bus_of(0x0310), Some(3));
        assert_eq!(pci_bus_of(0x1_0000), None);
    }
}
