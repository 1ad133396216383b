//! Which driver the host console UART needs ([`UartKind`]) and how wide its
//! register accesses are ([`IoWidth`]): what the device-tree parser
//! (`platform`) finds and the UART drivers (`drivers::uart`) take. A leaf: it
//! imports nothing of the crate.

/// How wide each register access is (`reg-io-width`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoWidth {
    /// 8-bit accesses.
    U8,
    /// 16-bit accesses.
    U16,
    /// 32-bit accesses.
    U32,
}

impl IoWidth {
    /// The width for a `reg-io-width` value in bytes, if it is 1, 2 or 4.
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            1 => Some(Self::U8),
            2 => Some(Self::U16),
            4 => Some(Self::U32),
            _ => None,
        }
    }

    /// Bytes per access.
    pub fn bytes(self) -> u8 {
        match self {
            Self::U8 => 1,
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }
}

/// Which driver a UART needs, with its register layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UartKind {
    /// Arm PL011 (`arm,pl011`): 32-bit registers 4 bytes apart.
    Pl011,
    /// 8250/16550-compatible (`ns16550a`, `ns16550`, `snps,dw-apb-uart`).
    Ns16550 {
        /// Register `i` is at `i << reg_shift` (`reg-shift`, 0 to 2).
        reg_shift: u8,
        /// The access width (`reg-io-width`).
        io_width: IoWidth,
    },
}

impl core::fmt::Display for UartKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Pl011 => f.write_str("PL011"),
            Self::Ns16550 {
                reg_shift,
                io_width,
            } => write!(
                f,
                "16550 (reg-shift {reg_shift}, {}-byte access)",
                io_width.bytes()
            ),
        }
    }
}
