//! The function ids of the control interface.
//!
//! Every call is an SMCCC fast call of owning entity 6 (vendor-specific
//! hypervisor service). The interface's own calls use the SMC64 convention
//! (`0xC600_xxxx`); the call-UID query follows SMCCC's general service
//! queries and is a SMC32 call (`0x8600_FF01`). Function number 1
//! (`0xC600_0001`) is the hypervisor's test-report call and not part of this
//! interface; number `0xFF` is kept free as well.

/// Owning entity 6 in a fast SMC64 function id.
pub const SMC64_HYPERVISOR_BASE: u32 = 0xC600_0000;
/// Owning entity 6 in a fast SMC32 function id.
pub const SMC32_HYPERVISOR_BASE: u32 = 0x8600_0000;

/// `VERSION`: `x0` = major << 16 | minor.
pub const VERSION: u32 = 0xC600_0000;
/// `CAPABILITIES`: capability bits, transfer limit and record size.
pub const CAPABILITIES: u32 = 0xC600_0010;
/// `LIST_VMS`: writes [`crate::VmInfo`] records into the caller's buffer.
pub const LIST_VMS: u32 = 0xC600_0011;
/// `VM_PAUSE`: stops scheduling the VM's vCPUs until `VM_RESUME`.
pub const VM_PAUSE: u32 = 0xC600_0012;
/// `VM_RESUME`: lets a paused VM run again.
pub const VM_RESUME: u32 = 0xC600_0013;
/// `VM_STOP`: stops the VM for good.
pub const VM_STOP: u32 = 0xC600_0014;
/// `SLOT_CREATE`: a new memslot, backed by fresh zeroed hypervisor memory.
pub const SLOT_CREATE: u32 = 0xC600_0015;
/// `SLOT_DELETE`: removes a memslot.
pub const SLOT_DELETE: u32 = 0xC600_0016;
/// `SLOT_MOVE`: gives a memslot a new guest base address.
pub const SLOT_MOVE: u32 = 0xC600_0017;
/// `SLOT_SET_FLAGS`: turns dirty logging on or off.
pub const SLOT_SET_FLAGS: u32 = 0xC600_0018;
/// `MEMORY_READ`: copies another VM's guest memory into the caller's buffer.
pub const MEMORY_READ: u32 = 0xC600_0019;
/// `MEMORY_WRITE`: copies the caller's buffer into another VM's guest memory.
pub const MEMORY_WRITE: u32 = 0xC600_001A;
/// `VCPU_GET_REGISTER`: one register of a vCPU of a paused VM.
pub const VCPU_GET_REGISTER: u32 = 0xC600_001B;
/// `VCPU_SET_REGISTER`: sets one register of a vCPU of a paused VM.
pub const VCPU_SET_REGISTER: u32 = 0xC600_001C;
/// `DIRTY_LOG_GET`: the dirty bitmap of a slot that logs, into the
/// caller's buffer (taken and re-protected unless manual protection).
pub const DIRTY_LOG_GET: u32 = 0xC600_0020;
/// `DIRTY_LOG_CLEAR`: manual protection: clears and re-protects the pages
/// of a mask in the caller's buffer.
pub const DIRTY_LOG_CLEAR: u32 = 0xC600_0021;
/// `DIRTY_LOG_CONFIG`: a VM's dirty-log mode and eager split chunk size.
pub const DIRTY_LOG_CONFIG: u32 = 0xC600_0022;
/// `VM_MIGRATE`: starts a live migration of a running VM into a VM waiting
/// for one (`start=0`).
pub const VM_MIGRATE: u32 = 0xC600_0030;
/// `CALL_UID`: the interface's UID in `x0..x3` (SMCCC general service query).
pub const CALL_UID: u32 = 0x8600_FF01;

/// The interface's UID, as `CALL_UID` returns it: four 32-bit words in
/// `w0..w3` (SMCCC's layout for UIDs).
pub const UID: [u32; 4] = [0x6b1c_2e0a, 0x4c4f_5254, 0x8e3d_4e4f, 0x43a1_9b57];

/// A function of the control interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Function {
    /// [`VERSION`].
    Version,
    /// [`CAPABILITIES`].
    Capabilities,
    /// [`LIST_VMS`].
    ListVms,
    /// [`VM_PAUSE`].
    VmPause,
    /// [`VM_RESUME`].
    VmResume,
    /// [`VM_STOP`].
    VmStop,
    /// [`SLOT_CREATE`].
    SlotCreate,
    /// [`SLOT_DELETE`].
    SlotDelete,
    /// [`SLOT_MOVE`].
    SlotMove,
    /// [`SLOT_SET_FLAGS`].
    SlotSetFlags,
    /// [`MEMORY_READ`].
    MemoryRead,
    /// [`MEMORY_WRITE`].
    MemoryWrite,
    /// [`VCPU_GET_REGISTER`].
    VcpuGetRegister,
    /// [`VCPU_SET_REGISTER`].
    VcpuSetRegister,
    /// [`DIRTY_LOG_GET`].
    DirtyLogGet,
    /// [`DIRTY_LOG_CLEAR`].
    DirtyLogClear,
    /// [`DIRTY_LOG_CONFIG`].
    DirtyLogConfig,
    /// [`VM_MIGRATE`].
    VmMigrate,
    /// [`CALL_UID`].
    CallUid,
}

impl Function {
    /// Every function, in id order.
    pub const ALL: [Self; 19] = [
        Self::Version,
        Self::Capabilities,
        Self::ListVms,
        Self::VmPause,
        Self::VmResume,
        Self::VmStop,
        Self::SlotCreate,
        Self::SlotDelete,
        Self::SlotMove,
        Self::SlotSetFlags,
        Self::MemoryRead,
        Self::MemoryWrite,
        Self::VcpuGetRegister,
        Self::VcpuSetRegister,
        Self::DirtyLogGet,
        Self::DirtyLogClear,
        Self::DirtyLogConfig,
        Self::VmMigrate,
        Self::CallUid,
    ];

    /// The function's id, as written to `w0`.
    pub const fn id(self) -> u32 {
        match self {
            Self::Version => VERSION,
            Self::Capabilities => CAPABILITIES,
            Self::ListVms => LIST_VMS,
            Self::VmPause => VM_PAUSE,
            Self::VmResume => VM_RESUME,
            Self::VmStop => VM_STOP,
            Self::SlotCreate => SLOT_CREATE,
            Self::SlotDelete => SLOT_DELETE,
            Self::SlotMove => SLOT_MOVE,
            Self::SlotSetFlags => SLOT_SET_FLAGS,
            Self::MemoryRead => MEMORY_READ,
            Self::MemoryWrite => MEMORY_WRITE,
            Self::VcpuGetRegister => VCPU_GET_REGISTER,
            Self::VcpuSetRegister => VCPU_SET_REGISTER,
            Self::DirtyLogGet => DIRTY_LOG_GET,
            Self::DirtyLogClear => DIRTY_LOG_CLEAR,
            Self::DirtyLogConfig => DIRTY_LOG_CONFIG,
            Self::VmMigrate => VM_MIGRATE,
            Self::CallUid => CALL_UID,
        }
    }

    /// The function a 64-bit `x0` names, or `None` (bits 63..32 must be zero).
    pub fn from_x0(x0: u64) -> Option<Self> {
        let id = u32::try_from(x0).ok()?;
        Self::ALL.into_iter().find(|f| f.id() == id)
    }

    /// Whether `x0` is a function id the control interface owns: any fast
    /// call of owning entity 6 except the hypervisor's other services
    /// (`0xC600_0001` test report, `0xC600_00FF`, kept free). The machine
    /// layer sends these to the control dispatcher, which answers the ones
    /// that [`Function::from_x0`] does not know with `NOT_SUPPORTED`.
    pub fn in_range(x0: u64) -> bool {
        let Ok(id) = u32::try_from(x0) else {
            return false;
        };
        let owner_range = id & 0xFFFF_0000;
        (owner_range == SMC64_HYPERVISOR_BASE || owner_range == SMC32_HYPERVISOR_BASE)
            && id != 0xC600_0001
            && id != 0xC600_00FF
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_in_range() {
        for f in Function::ALL {
            assert_eq!(Function::from_x0(u64::from(f.id())), Some(f));
            assert!(Function::in_range(u64::from(f.id())), "{f:?}");
        }
        let mut ids: [u32; 19] = Function::ALL.map(Function::id);
        ids.sort_unstable();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids are distinct");
    }

    #[test]
    fn other_services_are_out_of_range() {
        assert!(!Function::in_range(0xC600_0001));
        assert!(!Function::in_range(0xC600_00FF));
        assert!(!Function::in_range(0x8400_0000), "PSCI");
        assert!(!Function::in_range(0x1_C600_0000), "upper bits set");
        assert!(Function::in_range(0xC600_0042));
        assert_eq!(Function::from_x0(0xC600_0042), None);
        assert_eq!(Function::from_x0(0x1_C600_0000), None);
    }
}
