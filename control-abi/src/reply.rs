//! The results of the control interface in `x0..x3`.
//!
//! `x0` is the status: zero (or, for `VERSION`, the positive version number)
//! on success, a negative [`Error`] code otherwise, with `x1..x3` zero. On
//! success `x1..x3` carry the function's results; registers a function does
//! not define are zero. Each typed reply has `to_regs` for the hypervisor and
//! `from_regs` for the client.

use crate::error::{CallError, Error, status};

/// The registers of a refused call.
pub const fn error(e: Error) -> [u64; 4] {
    [e.x0(), 0, 0, 0]
}

/// The registers of a successful call with results `x1..x3`.
pub const fn success(x1: u64, x2: u64, x3: u64) -> [u64; 4] {
    [0, x1, x2, x3]
}

/// Reads `x0` as a status that must be zero on success, and returns `x1..x3`.
pub fn results(regs: [u64; 4]) -> Result<[u64; 3], CallError> {
    match status(regs[0])? {
        0 => Ok([regs[1], regs[2], regs[3]]),
        // A positive status where this version defines zero.
        other => Err(CallError::UnknownCode(other as i64)),
    }
}

/// `VERSION`'s result: `x0 = major << 16 | minor` (bit 31 clear, SMCCC style).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    /// Major version: a caller refuses a major version it does not know.
    pub major: u16,
    /// Minor version: additions only.
    pub minor: u16,
}

impl Version {
    /// The version of this crate.
    pub const CURRENT: Self = Self {
        major: crate::VERSION_MAJOR,
        minor: crate::VERSION_MINOR,
    };

    /// The registers that carry it. The major version is at most `0x7FFF`.
    pub const fn to_regs(self) -> [u64; 4] {
        [
            ((self.major as u64 & 0x7FFF) << 16) | self.minor as u64,
            0,
            0,
            0,
        ]
    }

    /// Reads it back.
    pub fn from_regs(regs: [u64; 4]) -> Result<Self, CallError> {
        let x0 = status(regs[0])?;
        Ok(Self {
            major: (x0 >> 16) as u16,
            minor: x0 as u16,
        })
    }
}

/// `CAPABILITIES`'s result: `x1` capability bits, `x2` the most bytes one
/// transfer moves, `x3` the size of a [`crate::VmInfo`] record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// `CAP_*` bits.
    pub bits: u64,
    /// [`crate::MAX_TRANSFER`] of the hypervisor.
    pub max_transfer: u64,
    /// [`crate::vm_info::RECORD_SIZE`] of the hypervisor.
    pub record_size: u64,
}

impl Capabilities {
    /// `LIST_VMS`.
    pub const LIST_VMS: u64 = 1 << 0;
    /// `VM_PAUSE`, `VM_RESUME`, `VM_STOP`.
    pub const LIFECYCLE: u64 = 1 << 1;
    /// `SLOT_CREATE`, `SLOT_DELETE`, `SLOT_MOVE`, `SLOT_SET_FLAGS`.
    pub const MEMSLOTS: u64 = 1 << 2;
    /// `MEMORY_READ`, `MEMORY_WRITE`.
    pub const MEMORY: u64 = 1 << 3;
    /// `VCPU_GET_REGISTER`, `VCPU_SET_REGISTER`.
    pub const REGISTERS: u64 = 1 << 4;
    /// `DIRTY_LOG_GET`, `DIRTY_LOG_CLEAR`, `DIRTY_LOG_CONFIG` (1.1).
    pub const DIRTY_LOG: u64 = 1 << 5;
    /// `VM_MIGRATE` (1.1).
    pub const MIGRATE: u64 = 1 << 6;
    /// Every capability of version 1.0.
    pub const ALL_1_0: u64 =
        Self::LIST_VMS | Self::LIFECYCLE | Self::MEMSLOTS | Self::MEMORY | Self::REGISTERS;
    /// Every capability of version 1.1.
    pub const ALL_1_1: u64 = Self::ALL_1_0 | Self::DIRTY_LOG | Self::MIGRATE;

    /// The registers that carry it.
    pub const fn to_regs(self) -> [u64; 4] {
        success(self.bits, self.max_transfer, self.record_size)
    }

    /// Reads it back.
    pub fn from_regs(regs: [u64; 4]) -> Result<Self, CallError> {
        let [bits, max_transfer, record_size] = results(regs)?;
        Ok(Self {
            bits,
            max_transfer,
            record_size,
        })
    }
}

/// `LIST_VMS`'s result: `x1` records written, `x2` VMs in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ListVmsReply {
    /// Records written to the buffer.
    pub written: u64,
    /// VMs the hypervisor runs (listed or not) at the time of the call.
    pub total: u64,
}

impl ListVmsReply {
    /// The registers that carry it.
    pub const fn to_regs(self) -> [u64; 4] {
        success(self.written, self.total, 0)
    }

    /// Reads it back.
    pub fn from_regs(regs: [u64; 4]) -> Result<Self, CallError> {
        let [written, total, _] = results(regs)?;
        Ok(Self { written, total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn replies_round_trip(major in 0u16..0x8000, minor: u16, a: u64, b: u64, c: u64) {
            let v = Version { major, minor };
            prop_assert_eq!(Version::from_regs(v.to_regs()), Ok(v));
            let caps = Capabilities { bits: a, max_transfer: b, record_size: c };
            prop_assert_eq!(Capabilities::from_regs(caps.to_regs()), Ok(caps));
            let list = ListVmsReply { written: a, total: b };
            prop_assert_eq!(ListVmsReply::from_regs(list.to_regs()), Ok(list));
            prop_assert_eq!(results(success(a, b, c)), Ok([a, b, c]));
        }
    }

    #[test]
    fn errors_come_back_as_errors() {
        for e in Error::ALL {
            assert_eq!(results(error(e)), Err(CallError::Refused(e)));
            assert_eq!(Version::from_regs(error(e)), Err(CallError::Refused(e)));
            assert_eq!(
                Capabilities::from_regs(error(e)),
                Err(CallError::Refused(e))
            );
        }
        assert_eq!(results([5, 0, 0, 0]), Err(CallError::UnknownCode(5)));
        assert_eq!(Version::CURRENT.to_regs()[0], 0x1_0002);
    }
}
