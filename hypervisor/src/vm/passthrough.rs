//! Which host devices a VM owns, checked: the passthrough plan of one VM.
//!
//! A VM's `vm.conf` names host device-tree nodes (`device=PATH`); each is
//! read from the host tree (`crate::platform::host_device`) and checked
//! here against everything else that claims an address or an interrupt
//! ([`Claims`]). A node passes only if:
//!
//! - the hypervisor does not use it: its windows miss the console UART, the
//!   GIC's frames, the host disks the hypervisor drives and host RAM, and it
//!   is not the architected timer;
//! - no other VM was given it, or a window or an interrupt of it;
//! - its windows miss the VM's RAM and its emulated devices (UART, GIC,
//!   virtio-mmio windows), and its SPIs are not ones the VM's emulated
//!   devices raise;
//! - it has at least one window or interrupt (else there is nothing to give).
//!
//! # Mapped and forwarded windows
//!
//! Stage 2 maps whole 4 KiB pages. A window that starts and ends on page
//! boundaries is mapped into the VM at its own address (device memory,
//! `Device-nGnRE`): the guest reaches the device with no exit at all. A
//! window that shares a page with other devices (QEMU's virtio-mmio
//! transports are 0x200 bytes, eight to a page) is not mapped: mapping its
//! page would hand the VM its neighbours too. Each access to it traps, and
//! the hypervisor performs exactly that access on the device when it lies
//! inside the window ([`PassedDevice::forwarded`]). Only register accesses
//! exit; the device's DMA, its data path, never does. Where everything
//! else in the page has nothing behind it (empty virtio-mmio transports
//! nobody owns), the page is mapped whole after all
//! ([`PassthroughPlan::map_whole_pages`]): no exit at all.
//!
//! # Interrupts
//!
//! A passed SPI keeps its INTID in the guest (the copied node's specifiers
//! stay true), so the VM's virtual GIC gets enough SPIs to hold the highest
//! one ([`PassthroughPlan::spi_count`]).

use crate::platform::Platform;
use crate::platform::host_device::{DeviceNode, HostDevice, HostInterrupt, NodeProperty};
use crate::platform::ranges::PhysRange;
use crate::platform::virtio_mmio::VirtioMmioWindow;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The page size stage 2 maps.
const PAGE: u64 = 0x1000;

/// A device given to a VM, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassedDevice {
    /// Its host device-tree path.
    pub path: String,
    /// Windows mapped into the VM at their own addresses.
    pub mapped: Vec<PhysRange>,
    /// Windows whose accesses trap and are performed by the hypervisor.
    pub forwarded: Vec<PhysRange>,
    /// Its SPIs.
    pub interrupts: Vec<HostInterrupt>,
    /// The subtree for the guest's device tree.
    pub node: DeviceNode,
    /// Properties left out of the guest's copy (`node/property`).
    pub dropped: Vec<String>,
}

/// Something that already holds addresses or interrupts, named for errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// What it is (`its console UART`, `vm0 (a)`).
    pub owner: String,
    /// Its windows.
    pub windows: Vec<PhysRange>,
    /// Its SPIs (INTIDs).
    pub intids: Vec<u32>,
    /// The device-tree path it was given by, for a device another VM owns.
    pub path: Option<String>,
}

/// What a VM's devices are checked against.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    /// The hypervisor's own (console UART, GIC, host disks, host RAM).
    pub hypervisor: Vec<Claim>,
    /// Devices other VMs were given.
    pub other_vms: Vec<Claim>,
    /// This VM's RAM and emulated devices.
    pub this_vm: Vec<Claim>,
}

/// A node that cannot be given to the VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassthroughError {
    /// The node's path.
    pub path: String,
    /// Why.
    pub why: String,
}

impl core::fmt::Display for PassthroughError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "device {}: {}", self.path, self.why)
    }
}

impl core::error::Error for PassthroughError {}

/// The devices one VM owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassthroughPlan {
    /// In `vm.conf` order.
    pub devices: Vec<PassedDevice>,
}

fn window_text(w: PhysRange) -> String {
    format!("{:#x}+{:#x}", w.start, w.size())
}

fn overlaps(a: PhysRange, b: PhysRange) -> bool {
    a.start < b.end && b.start < a.end
}

/// The first of `windows` that overlaps one of `others`.
fn first_overlap(windows: &[PhysRange], others: &[PhysRange]) -> Option<PhysRange> {
    windows
        .iter()
        .copied()
        .find(|w| others.iter().any(|o| overlaps(*w, *o)))
}

/// Why a device at `path` with `windows` and `intids` cannot sit beside
/// `claim`, if it cannot.
fn conflict(path: &str, windows: &[PhysRange], intids: &[u32], claim: &Claim) -> Option<String> {
    if claim.path.as_deref() == Some(path) {
        return Some(format!("also given to {}", claim.owner));
    }
    if let Some(w) = first_overlap(windows, &claim.windows) {
        return Some(format!(
            "window {} overlaps {}",
            window_text(w),
            claim.owner
        ));
    }
    intids
        .iter()
        .find(|i| claim.intids.contains(i))
        .map(|i| format!("interrupt {i} is also {}'s", claim.owner))
}

impl PassedDevice {
    /// Checks `device` against `claims` and against the devices already in
    /// the plan (`earlier`).
    pub fn check(
        device: HostDevice,
        claims: &Claims,
        earlier: &[PassedDevice],
    ) -> Result<Self, PassthroughError> {
        let fail = |why: String| PassthroughError {
            path: device.path.clone(),
            why,
        };
        if device.is_compatible("arm,armv8-timer") || device.is_compatible("arm,armv7-timer") {
            return Err(fail("the hypervisor uses it (the timers)".into()));
        }
        if device.windows.is_empty() && device.interrupts.is_empty() {
            return Err(fail(
                "it has no register window and no interrupt to give".into(),
            ));
        }
        let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
        for claim in &claims.hypervisor {
            if let Some(w) = first_overlap(&device.windows, &claim.windows) {
                return Err(fail(format!(
                    "the hypervisor uses it ({}: window {})",
                    claim.owner,
                    window_text(w)
                )));
            }
            if let Some(i) = intids.iter().find(|i| claim.intids.contains(i)) {
                return Err(fail(format!(
                    "the hypervisor uses its interrupt {i} ({})",
                    claim.owner
                )));
            }
        }
        for claim in claims.other_vms.iter().chain(claims.this_vm.iter()) {
            if let Some(why) = conflict(&device.path, &device.windows, &intids, claim) {
                return Err(fail(why));
            }
        }
        for other in earlier {
            if other.path == device.path {
                return Err(fail("named twice in vm.conf".into()));
            }
            let theirs: Vec<PhysRange> = other.windows().collect();
            if let Some(w) = first_overlap(&device.windows, &theirs) {
                return Err(fail(format!(
                    "window {} overlaps {}'s",
                    window_text(w),
                    other.path
                )));
            }
        }
        if let Some(why) = device.unroutable.clone() {
            return Err(fail(why));
        }
        let (mapped, forwarded) = device
            .windows
            .iter()
            .partition(|w| w.start % PAGE == 0 && w.size() % PAGE == 0);
        Ok(Self {
            path: device.path,
            mapped,
            forwarded,
            interrupts: device.interrupts,
            node: device.node,
            dropped: device.dropped,
        })
    }

    /// Its windows, mapped and forwarded.
    pub fn windows(&self) -> impl Iterator<Item = PhysRange> + '_ {
        self.mapped.iter().chain(self.forwarded.iter()).copied()
    }

    /// The buses of a PCI host bridge (`device_type = "pci"`): its
    /// `bus-range`, all 256 buses without one; `None` for another node.
    pub fn pci_buses(&self) -> Option<(u8, u8)> {
        let verbatim = |wanted: &str| {
            self.node.properties.iter().find_map(|p| match p {
                NodeProperty::Verbatim { name, value } if name == wanted => Some(value.as_slice()),
                _ => None,
            })
        };
        if verbatim("device_type")? != b"pci\0" {
            return None;
        }
        Some(match verbatim("bus-range") {
            Some([a0, a1, a2, a3, b0, b1, b2, b3]) => {
                let first = u32::from_be_bytes([*a0, *a1, *a2, *a3]).min(255) as u8;
                let last = u32::from_be_bytes([*b0, *b1, *b2, *b3]).min(255) as u8;
                (first, last)
            }
            _ => (0, 255),
        })
    }

    /// What another VM's check sees of it.
    pub fn claim(&self, owner: String) -> Claim {
        Claim {
            owner,
            windows: self.windows().collect(),
            intids: self.interrupts.iter().map(|i| i.intid).collect(),
            path: Some(self.path.clone()),
        }
    }
}

impl PassthroughPlan {
    /// Reads and checks the nodes `paths` of the host tree `dtb` for one
    /// VM, against the hypervisor's claims and the other VMs' in `claims`
    /// (this VM's own are checked once it is laid out,
    /// [`check_vm`](Self::check_vm)).
    pub fn read<'p>(
        dtb: &[u8],
        gic_distributor: u64,
        paths: impl Iterator<Item = &'p str>,
        claims: &Claims,
    ) -> Result<Self, PassthroughError> {
        let mut devices: Vec<PassedDevice> = Vec::new();
        for path in paths {
            let device =
                HostDevice::read(dtb, path, gic_distributor).map_err(|e| PassthroughError {
                    path: path.into(),
                    why: e.0,
                })?;
            let passed = PassedDevice::check(device, claims, &devices)?;
            devices.push(passed);
        }
        Ok(Self { devices })
    }

    /// Checks every device against the VM's own RAM and emulated devices.
    pub fn check_vm(&self, this_vm: &[Claim]) -> Result<(), PassthroughError> {
        for device in &self.devices {
            let windows: Vec<PhysRange> = device.windows().collect();
            let intids: Vec<u32> = device.interrupts.iter().map(|i| i.intid).collect();
            for claim in this_vm {
                if let Some(why) = conflict(&device.path, &windows, &intids, claim) {
                    return Err(PassthroughError {
                        path: device.path.clone(),
                        why,
                    });
                }
            }
        }
        Ok(())
    }

    /// What the other VMs' checks see of this VM's devices.
    pub fn claims(&self, owner: &str) -> impl Iterator<Item = Claim> + '_ {
        let owner = String::from(owner);
        self.devices.iter().map(move |d| d.claim(owner.clone()))
    }

    /// Maps whole pages instead of forwarding where nothing else lives in
    /// them: a forwarded window's page(s) go to `mapped` when every window
    /// `in_page` lists for them (the host tree's nodes there) lies inside
    /// one of this plan's windows or is `unused` (an empty virtio-mmio
    /// transport nobody owns). The guest then reaches the device with no
    /// exit; what else it can reach there has nothing behind it.
    pub fn map_whole_pages(
        &mut self,
        in_page: impl Fn(PhysRange) -> Vec<PhysRange>,
        unused: impl Fn(PhysRange) -> bool,
    ) {
        let owned: Vec<PhysRange> = self.devices.iter().flat_map(|d| d.windows()).collect();
        let ours = |w: &PhysRange| owned.iter().any(|o| o.start <= w.start && w.end <= o.end);
        let mut pages: Vec<PhysRange> = Vec::new();
        for device in &mut self.devices {
            let mut kept = Vec::new();
            for window in core::mem::take(&mut device.forwarded) {
                let page = window.align_out(PAGE);
                let free = in_page(page).iter().all(|w| ours(w) || unused(*w));
                if !free {
                    kept.push(window);
                } else if !pages.contains(&page) {
                    pages.push(page);
                    device.mapped.push(page);
                }
            }
            device.forwarded = kept;
        }
    }

    /// Whether the VM owns no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// SPIs the VM's virtual GIC needs: `emulated` (what its own devices
    /// need), raised to hold every passed SPI, in steps of 32.
    pub fn spi_count(&self, emulated: u32) -> u32 {
        let highest = self
            .devices
            .iter()
            .flat_map(|d| d.interrupts.iter())
            .map(|i| i.intid - 31)
            .max()
            .unwrap_or(0);
        // A GIC has at most 988 SPIs (INTIDs 32..=1019).
        emulated.max((highest.div_ceil(32) * 32).min(988))
    }

    /// Every passed SPI with the device it belongs to.
    pub fn interrupts(&self) -> impl Iterator<Item = HostInterrupt> + '_ {
        self.devices
            .iter()
            .flat_map(|d| d.interrupts.iter().copied())
    }

    /// Whether the VM owns a PCI host bridge.
    pub fn has_pci_bridge(&self) -> bool {
        self.devices.iter().any(|d| d.pci_buses().is_some())
    }

    /// Whether DeviceID `device`, a PCI requester ID, is on a bus of a PCI
    /// host bridge the VM owns (its MSIs are the VM's,
    /// `crate::vm::msi_shadow`).
    pub fn owns_requester(&self, device: u32) -> bool {
        let Some(bus) = crate::vm::msi_shadow::pci_bus_of(device) else {
            return false;
        };
        self.devices
            .iter()
            .filter_map(PassedDevice::pci_buses)
            .any(|(first, last)| (first..=last).contains(&bus))
    }

    /// The forwarded window holding `[pa, pa + size)`, if any.
    pub fn forwarded_window(&self, pa: u64, size: u64) -> Option<PhysRange> {
        self.devices
            .iter()
            .flat_map(|d| d.forwarded.iter().copied())
            .find(|w| pa >= w.start && pa.checked_add(size).is_some_and(|end| end <= w.end))
    }
}

/// What the hypervisor itself holds on `platform`: its console UART (and
/// its interrupt), the GIC's frames and host RAM (where the hypervisor, its
/// tables and every VM's RAM live).
pub fn hypervisor_claims(platform: &Platform) -> Vec<Claim> {
    let mut claims = alloc::vec![
        Claim {
            owner: "its console UART".into(),
            windows: alloc::vec![platform.uart],
            intids: platform.uart_intid.into_iter().collect(),
            path: None,
        },
        Claim {
            owner: "host RAM".into(),
            windows: platform.ram.clone(),
            intids: Vec::new(),
            path: None,
        },
    ];
    let mut gic = Vec::new();
    if let Some(v3) = &platform.gic {
        gic.push(v3.distributor);
        gic.extend(v3.redistributors.iter().copied());
        gic.extend(v3.its);
    }
    if let Some(v2) = &platform.gicv2 {
        gic.extend([v2.distributor, v2.cpu_interface]);
        gic.extend(v2.hyp_interface);
        gic.extend(v2.virtual_cpu);
    }
    claims.push(Claim {
        owner: "the GIC".into(),
        windows: gic,
        intids: Vec::new(),
        path: None,
    });
    claims
}

/// The host GIC's distributor address (what an interrupt parent must be).
pub fn gic_distributor(platform: &Platform) -> Option<u64> {
    platform
        .gic
        .as_ref()
        .map(|g| g.distributor.start)
        .or(platform.gicv2.as_ref().map(|g| g.distributor.start))
}

/// Every VM's devices (`vms`: each VM's name and `device=` paths, in
/// payload order), read from the host tree `dtb` and checked against the
/// hypervisor and the VMs before it. One entry per VM.
pub fn plan_machine<'p>(
    dtb: &[u8],
    platform: &Platform,
    vms: impl Iterator<Item = (&'p str, Vec<&'p str>)>,
) -> Vec<Result<PassthroughPlan, PassthroughError>> {
    let mut claims = Claims {
        hypervisor: hypervisor_claims(platform),
        ..Claims::default()
    };
    let mut out = Vec::new();
    for (index, (name, paths)) in vms.enumerate() {
        if paths.is_empty() {
            out.push(Ok(PassthroughPlan::default()));
            continue;
        }
        let plan = match gic_distributor(platform) {
            Some(gicd) => PassthroughPlan::read(dtb, gicd, paths.iter().copied(), &claims),
            None => Err(PassthroughError {
                path: paths[0].into(),
                why: "the host has no GIC to route its interrupts".into(),
            }),
        };
        if let Ok(plan) = &plan {
            let owner = format!("vm{index} ({name})");
            claims.other_vms.extend(plan.claims(&owner));
        }
        out.push(plan);
    }
    out
}

/// Every VM's plan for the boot payload `payload` (`plan_machine` over its
/// VMs' `device=` lines); none when the payload does not parse (the VMs'
/// start reports why) or no VM names a device.
pub fn plan_payload(
    dtb: &[u8],
    platform: &Platform,
    payload: &[u8],
) -> Vec<Result<PassthroughPlan, PassthroughError>> {
    let Ok(vms) = boot_payload::VmsRef::parse(payload) else {
        return Vec::new();
    };
    if vms
        .as_slice()
        .iter()
        .all(|vm| vm.payload.conf.devices.is_empty())
    {
        return Vec::new();
    }
    plan_machine(
        dtb,
        platform,
        vms.as_slice().iter().map(|vm| {
            (
                vm.name.as_str(),
                vm.payload.conf.devices.iter().map(|d| d.as_str()).collect(),
            )
        }),
    )
}

/// The virtio-mmio transports of `windows` that no planned device's window
/// overlaps: the host's disks (a node a VM owns is the VM's).
pub fn host_disk_windows(
    windows: &[VirtioMmioWindow],
    plans: &[Result<PassthroughPlan, PassthroughError>],
) -> Vec<VirtioMmioWindow> {
    windows
        .iter()
        .copied()
        .filter(|w| {
            !plans.iter().flatten().any(|plan| {
                plan.devices
                    .iter()
                    .flat_map(|d| d.windows())
                    .any(|p| overlaps(p, w.regs))
            })
        })
        .collect()
}

/// Maps a passed transport's page whole in every plan
/// ([`PassthroughPlan::map_whole_pages`]) where everything else in it is a
/// virtio-mmio transport of `windows` that no plan owns and that
/// `empty_transport` (its base) says has nothing behind it; `dtb` tells
/// what else is in a page.
pub fn map_passed_pages(
    plans: &mut [Result<PassthroughPlan, PassthroughError>],
    dtb: &[u8],
    windows: &[VirtioMmioWindow],
    empty_transport: impl Fn(u64) -> bool,
) {
    let owned: Vec<PhysRange> = plans
        .iter()
        .flatten()
        .flat_map(|plan| plan.devices.iter().flat_map(|d| d.windows()))
        .collect();
    let unused = |w: PhysRange| {
        !owned.iter().any(|&o| overlaps(o, w))
            && windows.iter().any(|v| v.regs == w)
            && empty_transport(w.start)
    };
    for plan in plans.iter_mut().flatten() {
        plan.map_whole_pages(
            |page| crate::platform::host_device::windows_overlapping(dtb, page),
            unused,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::host_device::{NodeProperty, Trigger};
    use alloc::string::ToString;
    use alloc::vec;

    fn device(path: &str, windows: &[(u64, u64)], intids: &[u32]) -> HostDevice {
        HostDevice {
            path: path.to_string(),
            windows: windows
                .iter()
                .map(|&(s, n)| PhysRange::from_start_size(s, n))
                .collect(),
            interrupts: intids
                .iter()
                .map(|&intid| HostInterrupt {
                    intid,
                    trigger: Trigger::Level,
                })
                .collect(),
            node: DeviceNode {
                name: path.trim_start_matches('/').to_string(),
                properties: vec![NodeProperty::Interrupts(Vec::new())],
                children: Vec::new(),
            },
            dropped: Vec::new(),
            compatible: Vec::new(),
            unroutable: None,
        }
    }

    fn claim(owner: &str, windows: &[(u64, u64)], intids: &[u32], path: Option<&str>) -> Claim {
        Claim {
            owner: owner.to_string(),
            windows: windows
                .iter()
                .map(|&(s, n)| PhysRange::from_start_size(s, n))
                .collect(),
            intids: intids.to_vec(),
            path: path.map(ToString::to_string),
        }
    }

    fn claims() -> Claims {
        Claims {
            hypervisor: vec![
                claim("its console UART", &[(0x0900_0000, 0x1000)], &[33], None),
                claim("the GIC", &[(0x0800_0000, 0x1_0000)], &[], None),
                claim("host disk 0", &[(0x0a00_3e00, 0x200)], &[79], None),
                claim("host RAM", &[(0x4000_0000, 0x4000_0000)], &[], None),
            ],
            other_vms: vec![claim(
                "vm0 (a)",
                &[(0x0a00_3c00, 0x200)],
                &[78],
                Some("/virtio_mmio@a003c00"),
            )],
            this_vm: vec![
                claim("the VM's RAM", &[(0x4000_0000, 0x800_0000)], &[], None),
                claim(
                    "the VM's emulated virtio-mmio devices",
                    &[(0x0a00_0000, 0x200)],
                    &[48],
                    None,
                ),
            ],
        }
    }

    fn why(device: HostDevice, earlier: &[PassedDevice]) -> String {
        PassedDevice::check(device, &claims(), earlier)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn windows_in_whole_pages_are_mapped_and_the_others_forwarded() {
        let passed = PassedDevice::check(
            device(
                "/pcie@10000000",
                &[(0x10_0000_0000, 0x1000_0000), (0x0a00_3a00, 0x200)],
                &[35, 36],
            ),
            &claims(),
            &[],
        )
        .unwrap();
        assert_eq!(
            passed.mapped,
            [PhysRange::from_start_size(0x10_0000_0000, 0x1000_0000)]
        );
        assert_eq!(
            passed.forwarded,
            [PhysRange::from_start_size(0x0a00_3a00, 0x200)]
        );
        let plan = PassthroughPlan {
            devices: vec![passed],
        };
        assert_eq!(
            plan.forwarded_window(0x0a00_3bfc, 4),
            Some(PhysRange::from_start_size(0x0a00_3a00, 0x200))
        );
        assert_eq!(
            plan.forwarded_window(0x0a00_3bfc, 8),
            None,
            "straddles the end"
        );
        assert_eq!(
            plan.forwarded_window(0x0a00_39fc, 4),
            None,
            "below the start"
        );
        assert_eq!(plan.forwarded_window(u64::MAX - 1, 4), None);
    }

    #[test]
    fn what_others_hold_is_refused_naming_the_holder() {
        assert_eq!(
            why(
                device("/pl011@9000000", &[(0x0900_0000, 0x1000)], &[33]),
                &[]
            ),
            "device /pl011@9000000: the hypervisor uses it (its console UART: window 0x9000000+0x1000)"
        );
        assert_eq!(
            why(
                device("/virtio_mmio@a003e00", &[(0x0a00_3e00, 0x200)], &[79]),
                &[]
            ),
            "device /virtio_mmio@a003e00: the hypervisor uses it (host disk 0: window 0xa003e00+0x200)"
        );
        assert_eq!(
            why(device("/x", &[], &[33]), &[]),
            "device /x: the hypervisor uses its interrupt 33 (its console UART)"
        );
        assert_eq!(
            why(
                device("/virtio_mmio@a003c00", &[(0x0a00_3c00, 0x200)], &[78]),
                &[]
            ),
            "device /virtio_mmio@a003c00: also given to vm0 (a)"
        );
        assert_eq!(
            why(device("/other", &[(0x0a00_3d00, 0x100)], &[]), &[]),
            "device /other: window 0xa003d00+0x100 overlaps vm0 (a)"
        );
        assert_eq!(
            why(
                device("/virtio_mmio@a000000", &[(0x0a00_0000, 0x200)], &[48]),
                &[]
            ),
            "device /virtio_mmio@a000000: window 0xa000000+0x200 overlaps the VM's emulated virtio-mmio devices"
        );
        assert_eq!(
            why(device("/y", &[(0x0c00_0000, 0x1000)], &[48]), &[]),
            "device /y: interrupt 48 is also the VM's emulated virtio-mmio devices's"
        );
        assert_eq!(
            why(device("/ram", &[(0x4800_0000, 0x1000)], &[]), &[]),
            "device /ram: the hypervisor uses it (host RAM: window 0x48000000+0x1000)"
        );
        assert_eq!(
            why(device("/empty", &[], &[]), &[]),
            "device /empty: it has no register window and no interrupt to give"
        );
        let mut timer = device("/timer", &[], &[]);
        timer.compatible = vec!["arm,armv8-timer".into()];
        assert_eq!(
            why(timer, &[]),
            "device /timer: the hypervisor uses it (the timers)"
        );
        let first = PassedDevice::check(
            device("/z@c000000", &[(0x0c00_0000, 0x2000)], &[40]),
            &claims(),
            &[],
        )
        .unwrap();
        assert_eq!(
            why(
                device("/z@c000000", &[(0x0d00_0000, 0x1000)], &[]),
                core::slice::from_ref(&first)
            ),
            "device /z@c000000: named twice in vm.conf"
        );
        assert_eq!(
            why(device("/w", &[(0x0c00_1000, 0x1000)], &[]), &[first]),
            "device /w: window 0xc001000+0x1000 overlaps /z@c000000's"
        );
    }

    #[test]
    fn a_page_with_nothing_else_in_it_is_mapped_whole() {
        let transport = |i: u64| PhysRange::from_start_size(0x0a00_3000 + i * 0x200, 0x200);
        let mut plan = PassthroughPlan {
            devices: vec![
                PassedDevice::check(
                    device("/virtio_mmio@a003e00", &[(0x0a00_3e00, 0x200)], &[79]),
                    &Claims::default(),
                    &[],
                )
                .unwrap(),
                PassedDevice::check(
                    device("/virtio_mmio@a003c00", &[(0x0a00_3c00, 0x200)], &[78]),
                    &Claims::default(),
                    &[],
                )
                .unwrap(),
            ],
        };
        let in_page = |_| (0..8).map(transport).collect::<Vec<_>>();
        // Transport 0 has a device behind it: the page stays forwarded.
        let mut busy = plan.clone();
        busy.map_whole_pages(in_page, |w| w != transport(0));
        assert_eq!(busy, plan, "nothing changes");
        // Every other transport is empty: one page, mapped once.
        plan.map_whole_pages(in_page, |_| true);
        let page = PhysRange::from_start_size(0x0a00_3000, 0x1000);
        assert_eq!(plan.devices[0].mapped, [page]);
        assert!(plan.devices[1].mapped.is_empty(), "mapped by the first");
        assert!(plan.devices.iter().all(|d| d.forwarded.is_empty()));
        assert_eq!(plan.forwarded_window(0x0a00_3e00, 4), None);
    }

    #[test]
    fn the_virtual_gic_grows_to_hold_the_highest_passed_spi() {
        let plan = |intids: &[u32]| PassthroughPlan {
            devices: vec![
                PassedDevice::check(device("/d", &[], intids), &Claims::default(), &[]).unwrap(),
            ],
        };
        assert_eq!(PassthroughPlan::default().spi_count(64), 64);
        assert_eq!(plan(&[79]).spi_count(64), 64);
        assert_eq!(plan(&[95]).spi_count(64), 64, "INTID 95 is SPI 63");
        assert_eq!(plan(&[96]).spi_count(64), 96);
        assert_eq!(plan(&[259]).spi_count(64), 256);
        assert_eq!(plan(&[1019]).spi_count(64), 988);
    }

    #[test]
    fn a_pci_bridge_owns_the_requester_ids_of_its_buses() {
        let mut bridge = device("/pcie@10000000", &[(0x1000_0000, 0x1000)], &[]);
        let verbatim = |name: &str, value: &[u8]| NodeProperty::Verbatim {
            name: name.to_string(),
            value: value.to_vec(),
        };
        bridge
            .node
            .properties
            .push(verbatim("device_type", b"pci\0"));
        bridge
            .node
            .properties
            .push(verbatim("bus-range", &[0, 0, 0, 0, 0, 0, 0, 1]));
        let other = device("/virtio_mmio@a003e00", &[(0x0a00_3000, 0x1000)], &[]);
        let read_checked = |devices: Vec<HostDevice>| PassthroughPlan {
            devices: devices
                .into_iter()
                .map(|d| PassedDevice::check(d, &Claims::default(), &[]).unwrap())
                .collect(),
        };
        let plan = read_checked(vec![bridge.clone(), other.clone()]);
        assert!(plan.has_pci_bridge());
        assert_eq!(plan.devices[0].pci_buses(), Some((0, 1)));
        assert_eq!(plan.devices[1].pci_buses(), None);
        assert!(plan.owns_requester(0x0008));
        assert!(plan.owns_requester(0x01ff));
        assert!(!plan.owns_requester(0x0200), "bus 2 is not the bridge's");
        assert!(!plan.owns_requester(0x1_0000));
        bridge.node.properties.pop();
        let plan = read_checked(vec![bridge]);
        assert!(plan.owns_requester(0xff00), "no bus-range: every bus");
        let plan = read_checked(vec![other]);
        assert!(!plan.has_pci_bridge());
        assert!(!plan.owns_requester(0));
    }

    #[test]
    fn the_host_keeps_the_transports_no_vm_owns_as_disks() {
        let window = |start| VirtioMmioWindow {
            regs: PhysRange::from_start_size(start, 0x200),
            intid: None,
            dma_coherent: false,
        };
        let windows = [window(0x0a00_3e00), window(0x0a00_3c00)];
        let plans = [
            Ok(PassthroughPlan {
                devices: vec![
                    PassedDevice::check(
                        device("/virtio_mmio@a003e00", &[(0x0a00_3e00, 0x200)], &[79]),
                        &Claims::default(),
                        &[],
                    )
                    .unwrap(),
                ],
            }),
            Err(PassthroughError {
                path: "/virtio_mmio@a003c00".into(),
                why: "refused".into(),
            }),
        ];
        assert_eq!(host_disk_windows(&windows, &plans), [windows[1]]);
        assert_eq!(host_disk_windows(&windows, &[]), windows);
    }
}
