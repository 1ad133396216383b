//! Where a stage-2 data abort goes.
//!
//! [`route`] decides from the abort's syndrome, the memslot holding the IPA
//! (if any) and the VM's device windows: a translation, access-flag or
//! permission fault in guest RAM is faulted in (a permission fault: a write
//! to a page write-protected for dirty logging, or a stale entry of a leaf
//! relaxed meanwhile); an access that lies wholly in a device's window and
//! carries an instruction syndrome is emulated by that device; anything else
//! gets an abort injected, with the [`AbortCause`] the log line gives. Any
//! other fault status (address size, external) stops the VM.
//!
//! # Algorithm
//!
//! 1. The fault status must be a translation, access-flag or permission
//!    fault, or the VM stops ([`StopReason::DataAbortStatus`]).
//! 2. In a memslot: fault in.
//! 3. A fault on a stage-1 table walk outside RAM: inject (nothing to emulate).
//! 4. With an access description (`ISV`): the whole access, not only its
//!    first byte, must be in one device window: emulate there; starting in a
//!    window and running past its end: inject; outside every window: inject.
//! 5. Without one: inject, naming the device whose window the address is in.

use crate::exit::esr::{DataAbort, DataAccess, FaultKind};
use crate::exit::flow::StopReason;
use crate::exit::mmio::{DeviceId, MmioBus, MmioMiss};
use crate::stage2::fault::SlotView;
use crate::vm::exit_profile::ExitClass;

/// Why an abort is injected into the guest (the log line says it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortCause {
    /// No memslot and no device window holds the address.
    NoMemoryOrDevice,
    /// The access starts in a device's window and does not end in it.
    Straddles {
        /// The device.
        device: DeviceId,
        /// Access size in bytes.
        size: u8,
        /// End of the device's window.
        window_end: u64,
    },
    /// A device access without an instruction syndrome (e.g. a load/store
    /// pair) cannot be emulated without decoding the instruction.
    NoSyndrome(DeviceId),
}

impl core::fmt::Display for AbortCause {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            AbortCause::NoMemoryOrDevice => write!(f, "is outside every memslot and device"),
            AbortCause::Straddles {
                device,
                size,
                window_end,
            } => write!(
                f,
                "starts an access of {size} bytes that runs past the end of the {} window at \
                 {window_end:#x}",
                device_name(device)
            ),
            AbortCause::NoSyndrome(device) => write!(
                f,
                "is in the {} window, but an access without instruction syndrome cannot be \
                 emulated",
                device_name(device)
            ),
        }
    }
}

/// The device's name in log lines.
pub const fn device_name(device: DeviceId) -> &'static str {
    match device {
        DeviceId::Uart => "UART",
        DeviceId::Gic => "GIC",
        DeviceId::Its => "ITS",
        DeviceId::Virtio(_) => "virtio-mmio",
        DeviceId::Passed => "passed-through device",
    }
}

/// What to do with a data abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataAbortRoute {
    /// Map guest RAM (or set the access flag) at the IPA.
    FaultIn {
        /// The memslot holding the IPA.
        slot: SlotView,
        /// Translation or access flag.
        kind: FaultKind,
    },
    /// Emulate the access in the UART, at `offset` in its window.
    Uart {
        /// The access.
        access: DataAccess,
        /// Offset in the UART's window.
        offset: u64,
    },
    /// Emulate the access in the virtual GIC (which decodes the IPA itself).
    Gic {
        /// The access.
        access: DataAccess,
    },
    /// Emulate the access in the virtual ITS, at `offset` in its frames.
    Its {
        /// The access.
        access: DataAccess,
        /// Offset from the ITS's base.
        offset: u64,
    },
    /// Emulate the access in the VM's virtio-mmio device `device`, at
    /// `offset` in its window.
    Virtio {
        /// The device's index in the VM's device list.
        device: u8,
        /// The access.
        access: DataAccess,
        /// Offset in the device's window.
        offset: u64,
    },
    /// Perform the access on a passed-through device, at the same address
    /// (the window holds the whole access).
    Passed {
        /// The access.
        access: DataAccess,
    },
    /// Inject a data abort.
    InjectAbort(AbortCause),
}

impl DataAbortRoute {
    /// The exit's class in the VM's exit profile.
    pub const fn exit_class(&self) -> ExitClass {
        match self {
            Self::FaultIn { .. } => ExitClass::Stage2Fault,
            Self::Uart { .. } => ExitClass::MmioUart,
            Self::Gic { .. } | Self::Its { .. } => ExitClass::MmioGic,
            Self::Virtio { .. } => ExitClass::MmioVirtio,
            Self::Passed { .. } => ExitClass::MmioPassed,
            Self::InjectAbort(_) => ExitClass::AbortInjected,
        }
    }
}

/// Routes `abort` at `ipa` (guest PC `pc`, for a report); `slot` is the
/// memslot holding `ipa`, if any, and `mmio` the VM's device windows.
pub fn route(
    abort: &DataAbort,
    ipa: u64,
    pc: u64,
    slot: Option<SlotView>,
    mmio: &MmioBus,
) -> Result<DataAbortRoute, StopReason> {
    let kind = abort.status.kind;
    match kind {
        // Permission: a write to a page write-protected for dirty logging
        // (or a leaf another vCPU relaxed meanwhile): the fault path fixes it.
        FaultKind::Translation | FaultKind::AccessFlag | FaultKind::Permission => {}
        other => {
            return Err(StopReason::DataAbortStatus {
                ipa,
                kind: other,
                level: abort.status.level,
                pc,
            });
        }
    }
    if let Some(slot) = slot {
        return Ok(DataAbortRoute::FaultIn { slot, kind });
    }
    if abort.stage1_walk {
        return Ok(DataAbortRoute::InjectAbort(AbortCause::NoMemoryOrDevice));
    }
    Ok(match abort.access {
        Some(access) => match mmio.find(ipa, u64::from(access.size)) {
            Ok((DeviceId::Uart, offset)) => DataAbortRoute::Uart { access, offset },
            Ok((DeviceId::Gic, _)) => DataAbortRoute::Gic { access },
            Ok((DeviceId::Its, offset)) => DataAbortRoute::Its { access, offset },
            Ok((DeviceId::Virtio(device), offset)) => DataAbortRoute::Virtio {
                device,
                access,
                offset,
            },
            Ok((DeviceId::Passed, _)) => DataAbortRoute::Passed { access },
            Err(MmioMiss::Outside) => DataAbortRoute::InjectAbort(AbortCause::NoMemoryOrDevice),
            Err(MmioMiss::Straddles(region)) => {
                DataAbortRoute::InjectAbort(AbortCause::Straddles {
                    device: region.device,
                    size: access.size,
                    window_end: region.base + region.size,
                })
            }
        },
        None => DataAbortRoute::InjectAbort(match mmio.region_at(ipa) {
            Some(region) => AbortCause::NoSyndrome(region.device),
            None => AbortCause::NoMemoryOrDevice,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_names_its_exit_class() {
        use crate::exit::instruction_abort::InstructionAbortRoute;
        use crate::vm::exit_profile::ExitClass;
        let slot = SlotView {
            ipa: 0x4000_0000,
            size: 0x1000,
            backing: 0x8000_0000,
            logging: false,
        };
        let access = DataAccess {
            size: 4,
            sign_extend: false,
            register: 0,
            sixty_four: false,
        };
        let kind = FaultKind::Translation;
        let cause = AbortCause::NoMemoryOrDevice;
        let cases = [
            (
                DataAbortRoute::FaultIn { slot, kind },
                ExitClass::Stage2Fault,
            ),
            (
                DataAbortRoute::Uart { access, offset: 0 },
                ExitClass::MmioUart,
            ),
            (DataAbortRoute::Gic { access }, ExitClass::MmioGic),
            (
                DataAbortRoute::Its { access, offset: 0 },
                ExitClass::MmioGic,
            ),
            (
                DataAbortRoute::Virtio {
                    device: 0,
                    access,
                    offset: 0,
                },
                ExitClass::MmioVirtio,
            ),
            (DataAbortRoute::Passed { access }, ExitClass::MmioPassed),
            (DataAbortRoute::InjectAbort(cause), ExitClass::AbortInjected),
        ];
        for (route, class) in cases {
            assert_eq!(route.exit_class(), class, "{route:?}");
        }
        assert_eq!(
            InstructionAbortRoute::FaultIn { slot, kind }.exit_class(),
            ExitClass::Stage2Fault
        );
        assert_eq!(
            InstructionAbortRoute::InjectAbort(cause).exit_class(),
            ExitClass::AbortInjected
        );
    }
    use crate::exit::esr::FaultStatus;
    use crate::exit::mmio::MmioRegion;
    use alloc::string::ToString;

    const UART: u64 = 0x0900_0000;
    const GICD: u64 = 0x0800_0000;
    const RAM: SlotView = SlotView {
        ipa: 0x4000_0000,
        size: 0x1000_0000,
        backing: 0x8000_0000,
        logging: false,
    };

    fn bus() -> MmioBus {
        let mut bus = MmioBus::new();
        bus.add(MmioRegion {
            base: UART,
            size: 0x1000,
            device: DeviceId::Uart,
        })
        .unwrap();
        bus.add(MmioRegion {
            base: GICD,
            size: 0x1_0000,
            device: DeviceId::Gic,
        })
        .unwrap();
        bus
    }

    fn access(size: u8) -> DataAccess {
        DataAccess {
            size,
            sign_extend: false,
            register: 1,
            sixty_four: false,
        }
    }

    fn abort(kind: FaultKind, access: Option<DataAccess>) -> DataAbort {
        DataAbort {
            status: FaultStatus {
                kind,
                level: Some(3),
            },
            write: false,
            stage1_walk: false,
            access,
        }
    }

    #[test]
    fn ram_faults_in() {
        let a = abort(FaultKind::AccessFlag, None);
        assert_eq!(
            route(&a, RAM.ipa, 0, Some(RAM), &bus()),
            Ok(DataAbortRoute::FaultIn {
                slot: RAM,
                kind: FaultKind::AccessFlag
            })
        );
    }

    #[test]
    fn a_permission_fault_in_ram_is_faulted_in() {
        let a = abort(FaultKind::Permission, None);
        assert_eq!(
            route(&a, RAM.ipa, 0x80, Some(RAM), &bus()),
            Ok(DataAbortRoute::FaultIn {
                slot: RAM,
                kind: FaultKind::Permission
            })
        );
    }

    #[test]
    fn other_fault_status_stops() {
        let a = abort(FaultKind::AddressSize, None);
        assert_eq!(
            route(&a, RAM.ipa, 0x80, Some(RAM), &bus()),
            Err(StopReason::DataAbortStatus {
                ipa: RAM.ipa,
                kind: FaultKind::AddressSize,
                level: Some(3),
                pc: 0x80
            })
        );
    }

    #[test]
    fn devices_emulate_whole_accesses_only() {
        let a = abort(FaultKind::Translation, Some(access(4)));
        assert_eq!(
            route(&a, UART + 0x18, 0, None, &bus()),
            Ok(DataAbortRoute::Uart {
                access: access(4),
                offset: 0x18
            })
        );
        assert_eq!(
            route(&a, GICD + 4, 0, None, &bus()),
            Ok(DataAbortRoute::Gic { access: access(4) })
        );
        let cause = AbortCause::Straddles {
            device: DeviceId::Uart,
            size: 4,
            window_end: UART + 0x1000,
        };
        assert_eq!(
            route(&a, UART + 0xffe, 0, None, &bus()),
            Ok(DataAbortRoute::InjectAbort(cause))
        );
        assert_eq!(
            cause.to_string(),
            "starts an access of 4 bytes that runs past the end of the UART window at 0x9001000"
        );
        assert_eq!(
            route(&a, 0x1000, 0, None, &bus()),
            Ok(DataAbortRoute::InjectAbort(AbortCause::NoMemoryOrDevice))
        );
    }

    #[test]
    fn no_syndrome_or_table_walk_injects() {
        let a = abort(FaultKind::Translation, None);
        assert_eq!(
            route(&a, GICD, 0, None, &bus()),
            Ok(DataAbortRoute::InjectAbort(AbortCause::NoSyndrome(
                DeviceId::Gic
            )))
        );
        let walk = DataAbort {
            stage1_walk: true,
            ..abort(FaultKind::Translation, Some(access(8)))
        };
        assert_eq!(
            route(&walk, UART, 0, None, &bus()),
            Ok(DataAbortRoute::InjectAbort(AbortCause::NoMemoryOrDevice))
        );
    }
}
