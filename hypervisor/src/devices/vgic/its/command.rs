//! The ITS commands: the 32-byte records the guest writes to its command
//! queue, decoded into typed fields.
//!
//! A command is four little-endian doublewords; DW0\[7:0\] is the command
//! number and each command takes its arguments from fixed fields (GICv3
//! architecture, "ITS commands"): DeviceID in DW0\[63:32\], EventID in
//! DW1\[31:0\], pINTID in DW1\[63:32\], the ITT size in DW1\[4:0\], the ITT
//! address in DW2\[51:8\], the valid bit in DW2\[63\], the ICID in
//! DW2\[15:0\] and a target redistributor (`RDbase`) in DW2\[51:16\] (and
//! DW3\[51:16\] for `MOVALL`'s second). With `GITS_TYPER.PTA` = 0, as this
//! ITS reports, `RDbase` is the redistributor's processor number, which is
//! the vCPU index. Decoding never fails: a number this ITS does not
//! implement (the GICv4 commands among them) is [`ItsCommand::Unknown`],
//! which the queue drops as a command error.

/// One decoded command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsCommand {
    /// Moves an event to another collection.
    Movi {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// The new collection.
        collection: u16,
    },
    /// Makes an event's LPI pending, as a `GITS_TRANSLATER` write would.
    Int {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Clears an event's LPI's pending state.
    Clear {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Waits until the effects of earlier commands on a redistributor are
    /// visible.
    Sync {
        /// The redistributor (processor number).
        target: u64,
    },
    /// Maps (or with `valid` clear, unmaps) a device to its ITT.
    Mapd {
        /// DeviceID.
        device: u32,
        /// EventID bits of the ITT, minus one.
        size: u8,
        /// Guest physical address of the ITT (256-byte aligned).
        itt: u64,
        /// Map (set) or unmap (clear).
        valid: bool,
    },
    /// Maps (or unmaps) a collection to a redistributor.
    Mapc {
        /// ICID.
        collection: u16,
        /// The redistributor (processor number).
        target: u64,
        /// Map (set) or unmap (clear).
        valid: bool,
    },
    /// Maps an event to an LPI and a collection.
    Mapti {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
        /// The LPI.
        intid: u32,
        /// ICID.
        collection: u16,
    },
    /// `MAPTI` with the LPI equal to the EventID.
    Mapi {
        /// DeviceID.
        device: u32,
        /// EventID (and LPI).
        event: u32,
        /// ICID.
        collection: u16,
    },
    /// Re-reads an event's LPI's property byte.
    Inv {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// Re-reads the property bytes of every LPI of a collection.
    Invall {
        /// ICID.
        collection: u16,
    },
    /// Moves every LPI of one redistributor to another.
    Movall {
        /// From this redistributor (processor number).
        from: u64,
        /// To this one.
        to: u64,
    },
    /// Removes an event's mapping and its LPI's pending state.
    Discard {
        /// DeviceID.
        device: u32,
        /// EventID.
        event: u32,
    },
    /// A command number this ITS does not implement.
    Unknown(u8),
}

/// Bits \[51:16\] of a doubleword: an `RDbase` field.
const fn rdbase(dw: u64) -> u64 {
    (dw >> 16) & 0xf_ffff_ffff
}

impl ItsCommand {
    /// Size of one command in the queue.
    pub const SIZE: u64 = 32;

    /// Decodes the four doublewords of a command.
    pub const fn decode(dw: [u64; 4]) -> Self {
        let device = (dw[0] >> 32) as u32;
        let event = dw[1] as u32;
        let collection = dw[2] as u16;
        let valid = dw[2] >> 63 != 0;
        match dw[0] as u8 {
            0x01 => Self::Movi {
                device,
                event,
                collection,
            },
            0x03 => Self::Int { device, event },
            0x04 => Self::Clear { device, event },
            0x05 => Self::Sync {
                target: rdbase(dw[2]),
            },
            0x08 => Self::Mapd {
                device,
                size: (dw[1] & 0x1f) as u8,
                itt: dw[2] & 0x000f_ffff_ffff_ff00,
                valid,
            },
            0x09 => Self::Mapc {
                collection,
                target: rdbase(dw[2]),
                valid,
            },
            0x0a => Self::Mapti {
                device,
                event,
                intid: (dw[1] >> 32) as u32,
                collection,
            },
            0x0b => Self::Mapi {
                device,
                event,
                collection,
            },
            0x0c => Self::Inv { device, event },
            0x0d => Self::Invall { collection },
            0x0e => Self::Movall {
                from: rdbase(dw[2]),
                to: rdbase(dw[3]),
            },
            0x0f => Self::Discard { device, event },
            number => Self::Unknown(number),
        }
    }

    /// The command's name as the architecture spells it.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Movi { .. } => "MOVI",
            Self::Int { .. } => "INT",
            Self::Clear { .. } => "CLEAR",
            Self::Sync { .. } => "SYNC",
            Self::Mapd { .. } => "MAPD",
            Self::Mapc { .. } => "MAPC",
            Self::Mapti { .. } => "MAPTI",
            Self::Mapi { .. } => "MAPI",
            Self::Inv { .. } => "INV",
            Self::Invall { .. } => "INVALL",
            Self::Movall { .. } => "MOVALL",
            Self::Discard { .. } => "DISCARD",
            Self::Unknown(_) => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_from_their_architected_bits() {
        // MAPTI DeviceID 0x1234, EventID 7, pINTID 8200, ICID 3.
        let mapti = [0x0000_1234_0000_000a, 8200 << 32 | 7, 3, 0];
        assert_eq!(
            ItsCommand::decode(mapti),
            ItsCommand::Mapti {
                device: 0x1234,
                event: 7,
                intid: 8200,
                collection: 3
            }
        );
        // MAPD with the valid bit, 5 EventID bits, ITT at 0x4010_0100.
        let mapd = [0x0000_0009_0000_0008, 4, 1 << 63 | 0x4010_0100, 0];
        assert_eq!(
            ItsCommand::decode(mapd),
            ItsCommand::Mapd {
                device: 9,
                size: 4,
                itt: 0x4010_0100,
                valid: true
            }
        );
        // MAPC ICID 2 to processor 3, MOVALL 1 -> 2.
        let mapc = [0x09, 0, 1 << 63 | 3 << 16 | 2, 0];
        assert_eq!(
            ItsCommand::decode(mapc),
            ItsCommand::Mapc {
                collection: 2,
                target: 3,
                valid: true
            }
        );
        let movall = [0x0e, 0, 1 << 16, 2 << 16];
        assert_eq!(
            ItsCommand::decode(movall),
            ItsCommand::Movall { from: 1, to: 2 }
        );
        // A GICv4 command (VMAPP, 0x29) is not implemented.
        assert_eq!(
            ItsCommand::decode([0x29, 0, 0, 0]),
            ItsCommand::Unknown(0x29)
        );
    }
}
