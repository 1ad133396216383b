//! Typed physical addresses.
//!
//! Table pages and leaf outputs are physical addresses; keeping them in their
//! own type stops them from being mixed up with guest IPAs (plain `u64`) or
//! with the host pointers the memory provider hands out.

/// A physical (output) address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysAddr(u64);

impl PhysAddr {
    /// The address `raw`.
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw address.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// The address `offset` bytes further.
    pub const fn add(self, offset: u64) -> Self {
        Self(self.0 + offset)
    }

    /// Whether the address is a multiple of `align` (a power of two).
    pub const fn is_aligned(self, align: u64) -> bool {
        self.0 & (align - 1) == 0
    }
}

impl core::fmt::Display for PhysAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
