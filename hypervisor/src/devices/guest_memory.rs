//! A VM's RAM as a virtio device sees it: reads and writes at
//! guest-physical addresses, and the host spans behind a guest buffer for
//! copies without a bounce buffer.
//!
//! The runtime implements [`GuestMemory`] over the VM's published memslots
//! (the translation of every page is looked up, never trusted from the
//! guest; a write marks each page it touches dirty when its slot logs);
//! tests implement it over a host vector. An address outside every RAM slot
//! (unbacked, in a device window, past the end) is an error, never an
//! access: a buffer that crosses from one slot into the next is served
//! piecewise, one that runs out of RAM is refused whole before any byte
//! moves.

use alloc::vec::Vec;
use core::fmt;

/// `len` bytes of host memory at `addr` (a pointer of the hypervisor's
/// identity map at EL2; of a host allocation in tests) backing a piece of a
/// guest buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSpan {
    /// Its first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// Why a guest-memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestMemoryError {
    /// The byte at `ipa` is in no RAM slot of the VM.
    NotRam {
        /// The first refused guest-physical address.
        ipa: u64,
    },
    /// The byte at `ipa` is in a read-only slot and the access writes.
    ReadOnly {
        /// The first refused guest-physical address.
        ipa: u64,
    },
    /// `ipa + len` overflows the address space.
    Wraps {
        /// Where the access starts.
        ipa: u64,
        /// Its length.
        len: u64,
    },
}

impl fmt::Display for GuestMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRam { ipa } => write!(f, "IPA {ipa:#x} is not guest RAM"),
            Self::ReadOnly { ipa } => write!(f, "IPA {ipa:#x} is read-only guest memory"),
            Self::Wraps { ipa, len } => {
                write!(f, "{len:#x} bytes at IPA {ipa:#x} wrap the address space")
            }
        }
    }
}

impl core::error::Error for GuestMemoryError {}

/// A VM's RAM, as a device reads and writes it.
///
/// Every method checks the whole range first and moves nothing when any
/// byte of it is refused. The `u16`/`u32`/`u64` accessors read and write
/// ring indices the guest changes concurrently: an implementation over
/// memory another CPU writes must make an aligned one a single access
/// (the defaults copy bytes, which suits memories no one else writes).
pub trait GuestMemory {
    /// Copies `buf.len()` bytes at `ipa` into `buf`.
    fn read(&self, ipa: u64, buf: &mut [u8]) -> Result<(), GuestMemoryError>;

    /// Copies `buf` to guest memory at `ipa`, marking the pages dirty where
    /// their slot logs.
    fn write(&self, ipa: u64, buf: &[u8]) -> Result<(), GuestMemoryError>;

    /// Appends to `out` the host spans backing `len` bytes at `ipa`, in
    /// order (one per stretch of host-contiguous backing: at least one per
    /// slot the range crosses). With `device_writes`, the range must be
    /// writable and its pages are marked dirty (the caller is about to
    /// write them, e.g. a disk read straight into the buffer).
    fn host_spans(
        &self,
        ipa: u64,
        len: u64,
        device_writes: bool,
        out: &mut Vec<HostSpan>,
    ) -> Result<(), GuestMemoryError>;

    /// Records that a device has finished writing host spans (as
    /// [`Self::host_spans`] returned them with `device_writes`): their pages
    /// are marked dirty again, after the data landed, so a dirty-log
    /// harvest that ran between `host_spans` and the write cannot leave a
    /// page clean that holds new data. Call it once the write completed.
    /// The default does nothing, for memories that log nothing.
    fn device_wrote(&self, _spans: &[HostSpan]) {}

    /// Reads a little-endian `u16` at `ipa`.
    fn read_u16(&self, ipa: u64) -> Result<u16, GuestMemoryError> {
        let mut b = [0; 2];
        self.read(ipa, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Reads a little-endian `u32` at `ipa`.
    fn read_u32(&self, ipa: u64) -> Result<u32, GuestMemoryError> {
        let mut b = [0; 4];
        self.read(ipa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Reads a little-endian `u64` at `ipa`.
    fn read_u64(&self, ipa: u64) -> Result<u64, GuestMemoryError> {
        let mut b = [0; 8];
        self.read(ipa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `value` little-endian at `ipa`.
    fn write_u16(&self, ipa: u64, value: u16) -> Result<(), GuestMemoryError> {
        self.write(ipa, &value.to_le_bytes())
    }

    /// Writes `value` little-endian at `ipa`.
    fn write_u32(&self, ipa: u64, value: u32) -> Result<(), GuestMemoryError> {
        self.write(ipa, &value.to_le_bytes())
    }
}
