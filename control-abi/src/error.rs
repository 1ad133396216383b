//! The errors of the control interface: negative numbers in `x0`.
//!
//! `-1` is SMCCC's `NOT_SUPPORTED` and means "no such function here": the
//! answer to every call from a VM that is not a control VM, to ids of the
//! range that name no function, and to calls of a later major version. The
//! other codes are this interface's own.

use core::fmt;

/// A refused control call. Nothing was changed unless the function's
/// documentation says otherwise (`MEMORY_WRITE` and `MEMORY_READ` on a racing
/// target, see `docs/control-abi.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// `-1`: the function does not exist, or the caller may not use the interface.
    NotSupported,
    /// `-2`: an argument is out of range, misaligned, or a reserved register is not zero.
    InvalidParameters,
    /// `-3`: the call is well formed but not allowed (e.g. naming the caller itself).
    Denied,
    /// `-4`: no VM has the given id.
    NoSuchVm,
    /// `-5`: the VM is busy with another change; try again.
    Busy,
    /// `-6`: the hypervisor has no memory for the request.
    NoMemory,
    /// `-7`: the caller's buffer is not (writable, for results) RAM of the caller.
    BadAddress,
    /// `-8`: the VM has no slot with the given id.
    NoSuchSlot,
    /// `-9`: the slot id is in use, or the guest range overlaps another slot.
    Conflict,
    /// `-10`: the VM is not in a state that allows the call (registers of a
    /// running VM, resuming a stopped VM, ...).
    BadState,
    /// `-11`: the VM has no vCPU with the given index.
    NoSuchVcpu,
    /// `-12`: the target range is not guest RAM of the target VM.
    NotMapped,
    /// `-13`: the hypervisor broke one of its own rules; the call did nothing.
    Internal,
}

impl Error {
    /// Every error, in code order (`-1` first).
    pub const ALL: [Self; 13] = [
        Self::NotSupported,
        Self::InvalidParameters,
        Self::Denied,
        Self::NoSuchVm,
        Self::Busy,
        Self::NoMemory,
        Self::BadAddress,
        Self::NoSuchSlot,
        Self::Conflict,
        Self::BadState,
        Self::NoSuchVcpu,
        Self::NotMapped,
        Self::Internal,
    ];

    /// The code written to `x0`, as a signed number.
    pub const fn code(self) -> i64 {
        match self {
            Self::NotSupported => -1,
            Self::InvalidParameters => -2,
            Self::Denied => -3,
            Self::NoSuchVm => -4,
            Self::Busy => -5,
            Self::NoMemory => -6,
            Self::BadAddress => -7,
            Self::NoSuchSlot => -8,
            Self::Conflict => -9,
            Self::BadState => -10,
            Self::NoSuchVcpu => -11,
            Self::NotMapped => -12,
            Self::Internal => -13,
        }
    }

    /// The value of `x0`.
    pub const fn x0(self) -> u64 {
        self.code() as u64
    }

    /// The error a code names, or `None` for codes this version does not know.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.code() == code)
    }

    /// The SMCCC-style name of the code.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NotSupported => "NOT_SUPPORTED",
            Self::InvalidParameters => "INVALID_PARAMETERS",
            Self::Denied => "DENIED",
            Self::NoSuchVm => "NO_SUCH_VM",
            Self::Busy => "BUSY",
            Self::NoMemory => "NO_MEMORY",
            Self::BadAddress => "BAD_ADDRESS",
            Self::NoSuchSlot => "NO_SUCH_SLOT",
            Self::Conflict => "CONFLICT",
            Self::BadState => "BAD_STATE",
            Self::NoSuchVcpu => "NO_SUCH_VCPU",
            Self::NotMapped => "NOT_MAPPED",
            Self::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Self::NotSupported => "the function is not supported for this caller",
            Self::InvalidParameters => "an argument is invalid or a reserved register is not zero",
            Self::Denied => "the call is not allowed",
            Self::NoSuchVm => "no VM has this id",
            Self::Busy => "the VM is busy, try again",
            Self::NoMemory => "the hypervisor is out of memory",
            Self::BadAddress => "the buffer is not RAM of the caller",
            Self::NoSuchSlot => "the VM has no memslot with this id",
            Self::Conflict => "the slot id is in use or the range overlaps another slot",
            Self::BadState => "the VM is not in a state that allows this call",
            Self::NoSuchVcpu => "the VM has no vCPU with this index",
            Self::NotMapped => "the range is not guest RAM of the target VM",
            Self::Internal => "internal hypervisor error",
        };
        write!(f, "{} ({}): {what}", self.name(), self.code())
    }
}

impl core::error::Error for Error {}

/// What a client gets back from a refused call: an [`Error`] this version
/// knows, or a negative code it does not (from a hypervisor of a later
/// version), reported as it came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallError {
    /// A known error code.
    Refused(Error),
    /// A negative `x0` that names no [`Error`] of this version.
    UnknownCode(i64),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(e) => e.fmt(f),
            Self::UnknownCode(code) => write!(f, "unknown error code {code}"),
        }
    }
}

impl core::error::Error for CallError {}

impl From<Error> for CallError {
    fn from(e: Error) -> Self {
        Self::Refused(e)
    }
}

/// Reads a status `x0`: `Ok(x0)` when zero or positive, the error otherwise.
pub fn status(x0: u64) -> Result<u64, CallError> {
    let signed = x0 as i64;
    if signed >= 0 {
        Ok(x0)
    } else {
        Err(Error::from_code(signed).map_or(CallError::UnknownCode(signed), CallError::Refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_negative_and_round_trip() {
        for (i, e) in Error::ALL.into_iter().enumerate() {
            assert_eq!(e.code(), -(i as i64) - 1);
            assert_eq!(Error::from_code(e.code()), Some(e));
            assert_eq!(status(e.x0()), Err(CallError::Refused(e)));
        }
        assert_eq!(Error::NotSupported.x0(), u64::MAX, "SMCCC NOT_SUPPORTED");
        assert_eq!(Error::from_code(0), None);
        assert_eq!(Error::from_code(-14), None);
        assert_eq!(status(-14i64 as u64), Err(CallError::UnknownCode(-14)));
        assert_eq!(status(0), Ok(0));
        assert_eq!(status(i64::MAX as u64), Ok(i64::MAX as u64));
    }

    #[test]
    fn every_error_displays_its_name_code_and_meaning() {
        extern crate std;
        use std::string::ToString;
        let mut seen = std::vec::Vec::new();
        for e in Error::ALL {
            let text = e.to_string();
            assert!(text.starts_with(e.name()), "{text}");
            assert!(text.contains(&std::format!("({})", e.code())), "{text}");
            assert!(text.len() > e.name().len() + 8, "{text} explains itself");
            assert!(!seen.contains(&text));
            seen.push(text);
        }
        assert_eq!(
            CallError::UnknownCode(-99).to_string(),
            "unknown error code -99"
        );
        assert_eq!(
            CallError::Refused(Error::Denied).to_string(),
            Error::Denied.to_string()
        );
    }
}
