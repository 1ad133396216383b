//! A system register's encoding (`op0, op1, CRn, CRm, op2`): how a trapped
//! `MSR`/`MRS` names its register (`exit::esr` decodes it), what the event
//! log remembers of unknown ones, and which set/way instructions the cache
//! maintenance converts. A leaf: it imports nothing of the crate.

/// A system register's `op0, op1, CRn, CRm, op2` encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SysRegEncoding {
    /// op0 (2 bits).
    pub op0: u8,
    /// op1 (3 bits).
    pub op1: u8,
    /// CRn (4 bits).
    pub crn: u8,
    /// CRm (4 bits).
    pub crm: u8,
    /// op2 (3 bits).
    pub op2: u8,
}

impl core::fmt::Display for SysRegEncoding {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "S{}_{}_C{}_C{}_{}",
            self.op0, self.op1, self.crn, self.crm, self.op2
        )
    }
}
