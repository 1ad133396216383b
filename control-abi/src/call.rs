//! The calls of the control interface and their argument registers.
//!
//! [`Call::encode`] writes a call into `x0..x7`; [`Call::decode`] reads it back
//! and checks everything that can be checked without the hypervisor's state:
//! the function id, that every reserved register is zero, that ids fit their
//! width, alignment and bounds of guest addresses, slot sizes, flag bits,
//! register ids, transfer lengths against [`crate::MAX_TRANSFER`], and that
//! no `address + length` wraps or passes [`crate::IPA_LIMIT`]. A decoded call
//! is therefore canonical: `decode(regs) == Ok(c)` implies `c.encode() == regs`.

use crate::error::Error;
use crate::function::Function;
use crate::{IPA_LIMIT, MAX_SLOT_ID, MAX_SLOT_PAGES, MAX_TRANSFER, PAGE_SIZE};

/// Memslot flags as the interface writes them (the same bits as the
/// hypervisor's memslots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotFlags(u32);

impl SlotFlags {
    /// No flags: writable, not logging.
    pub const NONE: Self = Self(0);
    /// Log guest writes in the slot's dirty bitmap.
    pub const LOG_DIRTY: Self = Self(1 << 0);
    /// The guest may only read the slot (only at creation; cannot be toggled).
    pub const READ_ONLY: Self = Self(1 << 1);

    /// Flags from a register, refusing unknown bits and dirty logging on a
    /// read-only slot.
    pub const fn from_register(x: u64) -> Option<Self> {
        let known = Self::LOG_DIRTY.0 | Self::READ_ONLY.0;
        if x & !(known as u64) != 0 || x == known as u64 {
            None
        } else {
            Some(Self(x as u32))
        }
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

/// What a vCPU register id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterKind {
    /// General-purpose register `x0..x30`.
    X(u8),
    /// The program counter (the guest's `ELR_EL2` view).
    Pc,
    /// The guest's `PSTATE` (its `SPSR_EL2` view).
    Pstate,
    /// `SP_EL0`.
    SpEl0,
    /// `SP_EL1`.
    SpEl1,
    /// `ELR_EL1`.
    ElrEl1,
    /// `SPSR_EL1`.
    SpsrEl1,
    /// An EL1 / EL0 system register by its `MRS` encoding (`op0` is 3).
    SysReg {
        /// `op1` (3 bits).
        op1: u8,
        /// `CRn` (4 bits).
        crn: u8,
        /// `CRm` (4 bits).
        crm: u8,
        /// `op2` (3 bits).
        op2: u8,
    },
}

/// A vCPU register id: `0..=30` for `x0..x30`, `0x20..=0x25` for PC, PSTATE,
/// `SP_EL0`, `SP_EL1`, `ELR_EL1`, `SPSR_EL1`, and `0x1_0000 | encoding` for a
/// system register whose 16-bit encoding is `op0:op1:CRn:CRm:op2` with `op0 = 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegisterId(u32);

impl RegisterId {
    /// The program counter.
    pub const PC: Self = Self(0x20);
    /// `PSTATE`.
    pub const PSTATE: Self = Self(0x21);
    /// `SP_EL0`.
    pub const SP_EL0: Self = Self(0x22);
    /// `SP_EL1`.
    pub const SP_EL1: Self = Self(0x23);
    /// `ELR_EL1`.
    pub const ELR_EL1: Self = Self(0x24);
    /// `SPSR_EL1`.
    pub const SPSR_EL1: Self = Self(0x25);
    const SYSREG: u32 = 0x1_0000;

    /// General-purpose register `x<n>`, `n <= 30`.
    pub const fn x(n: u8) -> Option<Self> {
        if n <= 30 { Some(Self(n as u32)) } else { None }
    }

    /// The system register `S3_<op1>_C<crn>_C<crm>_<op2>`, or `None` when a
    /// field is too wide.
    pub const fn sysreg(op1: u8, crn: u8, crm: u8, op2: u8) -> Option<Self> {
        if op1 > 7 || crn > 15 || crm > 15 || op2 > 7 {
            return None;
        }
        let enc = (3 << 14)
            | ((op1 as u32) << 11)
            | ((crn as u32) << 7)
            | ((crm as u32) << 3)
            | op2 as u32;
        Some(Self(Self::SYSREG | enc))
    }

    /// The id a register names, or `None` when it names no register.
    pub const fn from_register(x: u64) -> Option<Self> {
        if x > u32::MAX as u64 {
            return None;
        }
        let id = Self(x as u32);
        if id.kind_checked().is_some() {
            Some(id)
        } else {
            None
        }
    }

    /// The raw id.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// What the id names.
    pub const fn kind(self) -> RegisterKind {
        match self.kind_checked() {
            Some(k) => k,
            // Every constructor checks the id.
            None => unreachable!(),
        }
    }

    const fn kind_checked(self) -> Option<RegisterKind> {
        let x = self.0;
        match x {
            0..=30 => Some(RegisterKind::X(x as u8)),
            0x20 => Some(RegisterKind::Pc),
            0x21 => Some(RegisterKind::Pstate),
            0x22 => Some(RegisterKind::SpEl0),
            0x23 => Some(RegisterKind::SpEl1),
            0x24 => Some(RegisterKind::ElrEl1),
            0x25 => Some(RegisterKind::SpsrEl1),
            _ if x & !0xFFFF == Self::SYSREG && (x >> 14) & 3 == 3 => Some(RegisterKind::SysReg {
                op1: ((x >> 11) & 7) as u8,
                crn: ((x >> 7) & 15) as u8,
                crm: ((x >> 3) & 15) as u8,
                op2: (x & 7) as u8,
            }),
            _ => None,
        }
    }
}

/// `SLOT_CREATE`'s arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotRequest {
    /// The VM (`x1`).
    pub vm: u32,
    /// The slot id, `0..=MAX_SLOT_ID` (`x2`).
    pub slot: u32,
    /// Guest base address, page-aligned (`x3`).
    pub base_ipa: u64,
    /// Length in pages, `1..=MAX_SLOT_PAGES`, ending at or below `IPA_LIMIT` (`x4`).
    pub npages: u64,
    /// Flags (`x5`).
    pub flags: SlotFlags,
}

/// `MEMORY_READ` / `MEMORY_WRITE`'s arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryTransfer {
    /// The target VM (`x1`).
    pub vm: u32,
    /// Guest address in the target VM (`x2`).
    pub ipa: u64,
    /// Guest address of the buffer in the caller's own memory (`x3`).
    pub buffer: u64,
    /// Bytes, at most `MAX_TRANSFER` (`x4`).
    pub len: u64,
}

/// `DIRTY_LOG_GET`'s arguments: `x1` VM, `x2` slot, `x3` buffer (caller
/// guest address), `x4` buffer length in bytes (a multiple of 8, at most
/// `MAX_TRANSFER`; it must hold the slot's whole bitmap, one bit per page).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirtyLogGet {
    /// The VM.
    pub vm: u32,
    /// The slot.
    pub slot: u32,
    /// Guest address of the buffer in the caller's memory.
    pub buffer: u64,
    /// Buffer length in bytes.
    pub len: u64,
}

/// `DIRTY_LOG_CLEAR`'s arguments: `x1` VM, `x2` slot, `x3` first page of
/// the mask (a multiple of 64), `x4` buffer, `x5` length in bytes (a
/// multiple of 8, at most `MAX_TRANSFER`). Bit `i` of the mask is page
/// `first_page + i` of the slot; on return the buffer holds the pages that
/// were dirty (and are now write-protected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirtyLogClear {
    /// The VM.
    pub vm: u32,
    /// The slot.
    pub slot: u32,
    /// The mask's first page, a multiple of 64.
    pub first_page: u64,
    /// Guest address of the mask in the caller's memory.
    pub buffer: u64,
    /// Mask length in bytes.
    pub len: u64,
}

/// A vCPU register of a VM (`x1` VM, `x2` vCPU index, `x3` register id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VcpuRegister {
    /// The VM.
    pub vm: u32,
    /// The vCPU's index in the VM.
    pub vcpu: u32,
    /// The register.
    pub reg: RegisterId,
}

/// One control call with its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// `VERSION`, no arguments.
    Version,
    /// `CAPABILITIES`, no arguments.
    Capabilities,
    /// `LIST_VMS`: `x1` buffer (caller guest address), `x2` length in bytes
    /// (at most `MAX_TRANSFER`), `x3` index of the first VM to list.
    ListVms {
        /// Guest address of the buffer in the caller's memory.
        buffer: u64,
        /// Buffer length in bytes.
        len: u64,
        /// Index (in VM id order) of the first VM to write.
        first: u32,
    },
    /// `VM_PAUSE`: `x1` VM.
    VmPause {
        /// The VM.
        vm: u32,
    },
    /// `VM_RESUME`: `x1` VM.
    VmResume {
        /// The VM.
        vm: u32,
    },
    /// `VM_STOP`: `x1` VM.
    VmStop {
        /// The VM.
        vm: u32,
    },
    /// `SLOT_CREATE`: `x1..x5`, see [`SlotRequest`].
    SlotCreate(SlotRequest),
    /// `SLOT_DELETE`: `x1` VM, `x2` slot.
    SlotDelete {
        /// The VM.
        vm: u32,
        /// The slot id.
        slot: u32,
    },
    /// `SLOT_MOVE`: `x1` VM, `x2` slot, `x3` new page-aligned guest base.
    SlotMove {
        /// The VM.
        vm: u32,
        /// The slot id.
        slot: u32,
        /// The new guest base address.
        base_ipa: u64,
    },
    /// `SLOT_SET_FLAGS`: `x1` VM, `x2` slot, `x3` flags.
    SlotSetFlags {
        /// The VM.
        vm: u32,
        /// The slot id.
        slot: u32,
        /// The new flags.
        flags: SlotFlags,
    },
    /// `MEMORY_READ`: `x1..x4`, see [`MemoryTransfer`].
    MemoryRead(MemoryTransfer),
    /// `MEMORY_WRITE`: `x1..x4`, see [`MemoryTransfer`].
    MemoryWrite(MemoryTransfer),
    /// `VCPU_GET_REGISTER`: `x1..x3`, see [`VcpuRegister`].
    VcpuGetRegister(VcpuRegister),
    /// `VCPU_SET_REGISTER`: `x1..x3` as [`VcpuRegister`], `x4` the value.
    VcpuSetRegister {
        /// The register.
        reg: VcpuRegister,
        /// The value to write.
        value: u64,
    },
    /// `DIRTY_LOG_GET`: `x1..x4`, see [`DirtyLogGet`].
    DirtyLogGet(DirtyLogGet),
    /// `DIRTY_LOG_CLEAR`: `x1..x5`, see [`DirtyLogClear`].
    DirtyLogClear(DirtyLogClear),
    /// `DIRTY_LOG_CONFIG`: `x1` VM, `x2` mode (bit 0 manual protection, bit
    /// 1 initially all set, which needs bit 0), `x3` eager split chunk size
    /// in bytes (0: off; a multiple of 4 KiB).
    DirtyLogConfig {
        /// The VM.
        vm: u32,
        /// The mode bits.
        mode: u8,
        /// Eager split chunk size in bytes.
        eager_chunk: u64,
    },
    /// `VM_MIGRATE`: `x1` the running VM, `x2` the VM waiting for it; since
    /// 1.2 `x3` options ([`MIGRATE_VERIFY`]) and `x4` the downtime limit in
    /// microseconds (0: the hypervisor's default).
    VmMigrate {
        /// The source.
        src: u32,
        /// The destination.
        dst: u32,
        /// Compare the destination's memory with the source's byte for byte
        /// after the copy (`x3` bit 0).
        verify: bool,
        /// The downtime to aim for, microseconds; 0: the hypervisor's
        /// default.
        downtime_limit_us: u64,
    },
    /// `CALL_UID`, no arguments.
    CallUid,
}

/// `VM_MIGRATE` `x3` bit 0 (1.2): check the destination's memory against
/// the source's byte for byte before it starts. The other bits are
/// reserved (zero).
pub const MIGRATE_VERIFY: u64 = 1 << 0;

fn vm_id(x: u64) -> Result<u32, Error> {
    u32::try_from(x).map_err(|_| Error::InvalidParameters)
}

fn slot_id(x: u64) -> Result<u32, Error> {
    match u32::try_from(x) {
        Ok(id) if id <= MAX_SLOT_ID => Ok(id),
        _ => Err(Error::InvalidParameters),
    }
}

fn page_base(x: u64) -> Result<u64, Error> {
    if x.is_multiple_of(PAGE_SIZE) && x < IPA_LIMIT {
        Ok(x)
    } else {
        Err(Error::InvalidParameters)
    }
}

/// A guest range `[start, start + len)` that must end at or below `IPA_LIMIT`.
fn guest_range(start: u64, len: u64) -> Result<(), Error> {
    match start.checked_add(len) {
        Some(end) if end <= IPA_LIMIT => Ok(()),
        _ => Err(Error::InvalidParameters),
    }
}

fn transfer_len(x: u64) -> Result<u64, Error> {
    if x <= MAX_TRANSFER {
        Ok(x)
    } else {
        Err(Error::InvalidParameters)
    }
}

/// A bitmap buffer: a multiple of 8 bytes, at most `MAX_TRANSFER`, inside
/// the IPA space.
fn bitmap_buffer(buffer: u64, len: u64) -> Result<u64, Error> {
    let len = transfer_len(len)?;
    if len == 0 || !len.is_multiple_of(8) {
        return Err(Error::InvalidParameters);
    }
    guest_range(buffer, len)?;
    Ok(len)
}

fn vcpu_register(x1: u64, x2: u64, x3: u64) -> Result<VcpuRegister, Error> {
    Ok(VcpuRegister {
        vm: vm_id(x1)?,
        vcpu: u32::try_from(x2).map_err(|_| Error::InvalidParameters)?,
        reg: RegisterId::from_register(x3).ok_or(Error::InvalidParameters)?,
    })
}

fn memory_transfer(x1: u64, x2: u64, x3: u64, x4: u64) -> Result<MemoryTransfer, Error> {
    let t = MemoryTransfer {
        vm: vm_id(x1)?,
        ipa: x2,
        buffer: x3,
        len: transfer_len(x4)?,
    };
    guest_range(t.ipa, t.len)?;
    guest_range(t.buffer, t.len)?;
    Ok(t)
}

impl Call {
    /// The function this call invokes.
    pub const fn function(&self) -> Function {
        match self {
            Self::Version => Function::Version,
            Self::Capabilities => Function::Capabilities,
            Self::ListVms { .. } => Function::ListVms,
            Self::VmPause { .. } => Function::VmPause,
            Self::VmResume { .. } => Function::VmResume,
            Self::VmStop { .. } => Function::VmStop,
            Self::SlotCreate(_) => Function::SlotCreate,
            Self::SlotDelete { .. } => Function::SlotDelete,
            Self::SlotMove { .. } => Function::SlotMove,
            Self::SlotSetFlags { .. } => Function::SlotSetFlags,
            Self::MemoryRead(_) => Function::MemoryRead,
            Self::MemoryWrite(_) => Function::MemoryWrite,
            Self::VcpuGetRegister(_) => Function::VcpuGetRegister,
            Self::VcpuSetRegister { .. } => Function::VcpuSetRegister,
            Self::DirtyLogGet(_) => Function::DirtyLogGet,
            Self::DirtyLogClear(_) => Function::DirtyLogClear,
            Self::DirtyLogConfig { .. } => Function::DirtyLogConfig,
            Self::VmMigrate { .. } => Function::VmMigrate,
            Self::CallUid => Function::CallUid,
        }
    }

    /// The VM the call acts on, if it names one.
    pub const fn target_vm(&self) -> Option<u32> {
        match *self {
            Self::Version | Self::Capabilities | Self::ListVms { .. } | Self::CallUid => None,
            Self::VmPause { vm }
            | Self::VmResume { vm }
            | Self::VmStop { vm }
            | Self::SlotDelete { vm, .. }
            | Self::SlotMove { vm, .. }
            | Self::SlotSetFlags { vm, .. }
            | Self::DirtyLogConfig { vm, .. } => Some(vm),
            Self::DirtyLogGet(g) => Some(g.vm),
            Self::VmMigrate { src, .. } => Some(src),
            Self::DirtyLogClear(c) => Some(c.vm),
            Self::SlotCreate(r) => Some(r.vm),
            Self::MemoryRead(t) | Self::MemoryWrite(t) => Some(t.vm),
            Self::VcpuGetRegister(r) | Self::VcpuSetRegister { reg: r, .. } => Some(r.vm),
        }
    }

    /// The registers `x0..x7` of the call.
    pub fn encode(&self) -> [u64; 8] {
        let args: [u64; 7] = match *self {
            Self::Version | Self::Capabilities | Self::CallUid => [0; 7],
            Self::ListVms { buffer, len, first } => [buffer, len, first.into(), 0, 0, 0, 0],
            Self::VmPause { vm } | Self::VmResume { vm } | Self::VmStop { vm } => {
                [vm.into(), 0, 0, 0, 0, 0, 0]
            }
            Self::SlotCreate(r) => [
                r.vm.into(),
                r.slot.into(),
                r.base_ipa,
                r.npages,
                r.flags.bits().into(),
                0,
                0,
            ],
            Self::SlotDelete { vm, slot } => [vm.into(), slot.into(), 0, 0, 0, 0, 0],
            Self::SlotMove { vm, slot, base_ipa } => [vm.into(), slot.into(), base_ipa, 0, 0, 0, 0],
            Self::SlotSetFlags { vm, slot, flags } => {
                [vm.into(), slot.into(), flags.bits().into(), 0, 0, 0, 0]
            }
            Self::MemoryRead(t) | Self::MemoryWrite(t) => {
                [t.vm.into(), t.ipa, t.buffer, t.len, 0, 0, 0]
            }
            Self::VcpuGetRegister(r) => {
                [r.vm.into(), r.vcpu.into(), r.reg.get().into(), 0, 0, 0, 0]
            }
            Self::DirtyLogGet(g) => [g.vm.into(), g.slot.into(), g.buffer, g.len, 0, 0, 0],
            Self::VmMigrate {
                src,
                dst,
                verify,
                downtime_limit_us,
            } => [
                src.into(),
                dst.into(),
                if verify { MIGRATE_VERIFY } else { 0 },
                downtime_limit_us,
                0,
                0,
                0,
            ],
            Self::DirtyLogClear(c) => [
                c.vm.into(),
                c.slot.into(),
                c.first_page,
                c.buffer,
                c.len,
                0,
                0,
            ],
            Self::DirtyLogConfig {
                vm,
                mode,
                eager_chunk,
            } => [vm.into(), mode.into(), eager_chunk, 0, 0, 0, 0],
            Self::VcpuSetRegister { reg: r, value } => [
                r.vm.into(),
                r.vcpu.into(),
                r.reg.get().into(),
                value,
                0,
                0,
                0,
            ],
        };
        let [a1, a2, a3, a4, a5, a6, a7] = args;
        [self.function().id().into(), a1, a2, a3, a4, a5, a6, a7]
    }

    /// Reads and validates a call from `x0..x7`. An id that names no function
    /// gives [`Error::NotSupported`]; any other problem gives
    /// [`Error::InvalidParameters`].
    pub fn decode(regs: &[u64; 8]) -> Result<Self, Error> {
        let function = Function::from_x0(regs[0]).ok_or(Error::NotSupported)?;
        let [_, x1, x2, x3, x4, x5, ..] = *regs;
        let used = match function {
            Function::Version | Function::Capabilities | Function::CallUid => 0,
            Function::VmPause | Function::VmResume | Function::VmStop => 1,
            Function::SlotDelete => 2,
            Function::ListVms
            | Function::SlotMove
            | Function::SlotSetFlags
            | Function::VcpuGetRegister
            | Function::DirtyLogConfig => 3,
            Function::MemoryRead
            | Function::MemoryWrite
            | Function::VcpuSetRegister
            | Function::DirtyLogGet
            | Function::VmMigrate => 4,
            Function::SlotCreate | Function::DirtyLogClear => 5,
        };
        if regs[1 + used..].iter().any(|&r| r != 0) {
            return Err(Error::InvalidParameters);
        }
        Ok(match function {
            Function::Version => Self::Version,
            Function::Capabilities => Self::Capabilities,
            Function::CallUid => Self::CallUid,
            Function::ListVms => {
                let len = transfer_len(x2)?;
                guest_range(x1, len)?;
                Self::ListVms {
                    buffer: x1,
                    len,
                    first: u32::try_from(x3).map_err(|_| Error::InvalidParameters)?,
                }
            }
            Function::VmPause => Self::VmPause { vm: vm_id(x1)? },
            Function::VmResume => Self::VmResume { vm: vm_id(x1)? },
            Function::VmStop => Self::VmStop { vm: vm_id(x1)? },
            Function::SlotCreate => {
                let base_ipa = page_base(x3)?;
                if x4 == 0 || x4 > MAX_SLOT_PAGES {
                    return Err(Error::InvalidParameters);
                }
                guest_range(base_ipa, x4 * PAGE_SIZE)?;
                Self::SlotCreate(SlotRequest {
                    vm: vm_id(x1)?,
                    slot: slot_id(x2)?,
                    base_ipa,
                    npages: x4,
                    flags: SlotFlags::from_register(x5).ok_or(Error::InvalidParameters)?,
                })
            }
            Function::SlotDelete => Self::SlotDelete {
                vm: vm_id(x1)?,
                slot: slot_id(x2)?,
            },
            Function::SlotMove => Self::SlotMove {
                vm: vm_id(x1)?,
                slot: slot_id(x2)?,
                base_ipa: page_base(x3)?,
            },
            Function::SlotSetFlags => Self::SlotSetFlags {
                vm: vm_id(x1)?,
                slot: slot_id(x2)?,
                flags: SlotFlags::from_register(x3).ok_or(Error::InvalidParameters)?,
            },
            Function::MemoryRead => Self::MemoryRead(memory_transfer(x1, x2, x3, x4)?),
            Function::MemoryWrite => Self::MemoryWrite(memory_transfer(x1, x2, x3, x4)?),
            Function::VcpuGetRegister => Self::VcpuGetRegister(vcpu_register(x1, x2, x3)?),
            Function::VcpuSetRegister => Self::VcpuSetRegister {
                reg: vcpu_register(x1, x2, x3)?,
                value: x4,
            },
            Function::VmMigrate => {
                if x3 & !MIGRATE_VERIFY != 0 {
                    return Err(Error::InvalidParameters);
                }
                Self::VmMigrate {
                    src: vm_id(x1)?,
                    dst: vm_id(x2)?,
                    verify: x3 & MIGRATE_VERIFY != 0,
                    downtime_limit_us: x4,
                }
            }
            Function::DirtyLogGet => Self::DirtyLogGet(DirtyLogGet {
                vm: vm_id(x1)?,
                slot: slot_id(x2)?,
                buffer: x3,
                len: bitmap_buffer(x3, x4)?,
            }),
            Function::DirtyLogClear => {
                if !x3.is_multiple_of(64) || x3 > MAX_SLOT_PAGES {
                    return Err(Error::InvalidParameters);
                }
                Self::DirtyLogClear(DirtyLogClear {
                    vm: vm_id(x1)?,
                    slot: slot_id(x2)?,
                    first_page: x3,
                    buffer: x4,
                    len: bitmap_buffer(x4, x5)?,
                })
            }
            Function::DirtyLogConfig => {
                let mode = u8::try_from(x2).map_err(|_| Error::InvalidParameters)?;
                // Only bits 0 and 1; "initially all set" needs manual protection.
                if mode > 3 || mode == 2 || !x3.is_multiple_of(PAGE_SIZE) {
                    return Err(Error::InvalidParameters);
                }
                Self::DirtyLogConfig {
                    vm: vm_id(x1)?,
                    mode,
                    eager_chunk: x3,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::function;
    use proptest::prelude::*;

    fn flags() -> impl Strategy<Value = SlotFlags> {
        prop_oneof![
            Just(SlotFlags::NONE),
            Just(SlotFlags::LOG_DIRTY),
            Just(SlotFlags::READ_ONLY)
        ]
    }

    fn register_id() -> impl Strategy<Value = RegisterId> {
        prop_oneof![
            (0u8..=30).prop_map(|n| RegisterId::x(n).unwrap()),
            (0x20u64..=0x25).prop_map(|x| RegisterId::from_register(x).unwrap()),
            (0u8..8, 0u8..16, 0u8..16, 0u8..8)
                .prop_map(|(a, b, c, d)| RegisterId::sysreg(a, b, c, d).unwrap()),
        ]
    }

    fn transfer() -> impl Strategy<Value = MemoryTransfer> {
        (any::<u32>(), 0..=MAX_TRANSFER).prop_flat_map(|(vm, len)| {
            (0..=IPA_LIMIT - len, 0..=IPA_LIMIT - len).prop_map(move |(ipa, buffer)| {
                MemoryTransfer {
                    vm,
                    ipa,
                    buffer,
                    len,
                }
            })
        })
    }

    fn vcpu_reg() -> impl Strategy<Value = VcpuRegister> {
        (any::<u32>(), any::<u32>(), register_id()).prop_map(|(vm, vcpu, reg)| VcpuRegister {
            vm,
            vcpu,
            reg,
        })
    }

    fn call() -> impl Strategy<Value = Call> {
        let page = (0..IPA_LIMIT / PAGE_SIZE).prop_map(|p| p * PAGE_SIZE);
        prop_oneof![
            Just(Call::Version),
            Just(Call::Capabilities),
            Just(Call::CallUid),
            (0..=MAX_TRANSFER, any::<u32>()).prop_flat_map(|(len, first)| {
                (0..=IPA_LIMIT - len).prop_map(move |buffer| Call::ListVms { buffer, len, first })
            }),
            any::<u32>().prop_map(|vm| Call::VmPause { vm }),
            any::<u32>().prop_map(|vm| Call::VmResume { vm }),
            any::<u32>().prop_map(|vm| Call::VmStop { vm }),
            (any::<u32>(), 0..=MAX_SLOT_ID, 1..=MAX_SLOT_PAGES, flags()).prop_flat_map(
                |(vm, slot, npages, flags)| {
                    (0..=IPA_LIMIT / PAGE_SIZE - npages).prop_map(move |p| {
                        Call::SlotCreate(SlotRequest {
                            vm,
                            slot,
                            base_ipa: p * PAGE_SIZE,
                            npages,
                            flags,
                        })
                    })
                }
            ),
            (any::<u32>(), 0..=MAX_SLOT_ID).prop_map(|(vm, slot)| Call::SlotDelete { vm, slot }),
            (any::<u32>(), any::<u32>(), any::<bool>(), any::<u64>()).prop_map(
                |(src, dst, verify, downtime_limit_us)| Call::VmMigrate {
                    src,
                    dst,
                    verify,
                    downtime_limit_us
                }
            ),
            (any::<u32>(), 0..=MAX_SLOT_ID, page)
                .prop_map(|(vm, slot, base_ipa)| { Call::SlotMove { vm, slot, base_ipa } }),
            (any::<u32>(), 0..=MAX_SLOT_ID, flags())
                .prop_map(|(vm, slot, flags)| Call::SlotSetFlags { vm, slot, flags }),
            transfer().prop_map(Call::MemoryRead),
            transfer().prop_map(Call::MemoryWrite),
            vcpu_reg().prop_map(Call::VcpuGetRegister),
            (vcpu_reg(), any::<u64>())
                .prop_map(|(reg, value)| Call::VcpuSetRegister { reg, value }),
            (any::<u32>(), 0..=MAX_SLOT_ID, 1..=MAX_TRANSFER / 8).prop_flat_map(
                |(vm, slot, words)| {
                    (0..=IPA_LIMIT - words * 8).prop_map(move |buffer| {
                        Call::DirtyLogGet(DirtyLogGet {
                            vm,
                            slot,
                            buffer,
                            len: words * 8,
                        })
                    })
                }
            ),
            (
                any::<u32>(),
                0..=MAX_SLOT_ID,
                0..=MAX_SLOT_PAGES / 64,
                1..=MAX_TRANSFER / 8
            )
                .prop_flat_map(|(vm, slot, first, words)| {
                    (0..=IPA_LIMIT - words * 8).prop_map(move |buffer| {
                        Call::DirtyLogClear(DirtyLogClear {
                            vm,
                            slot,
                            first_page: first * 64,
                            buffer,
                            len: words * 8,
                        })
                    })
                }),
            (
                any::<u32>(),
                prop::sample::select(vec![0u8, 1, 3]),
                0u64..1 << 30
            )
                .prop_map(|(vm, mode, pages)| Call::DirtyLogConfig {
                    vm,
                    mode,
                    eager_chunk: pages * PAGE_SIZE
                }),
        ]
    }

    #[test]
    fn dirty_log_arguments_are_checked() {
        let get = |len| Call::decode(&[function::DIRTY_LOG_GET.into(), 1, 0, 0x1000, len, 0, 0, 0]);
        assert!(get(8).is_ok());
        assert_eq!(get(0), Err(Error::InvalidParameters));
        assert_eq!(get(12), Err(Error::InvalidParameters));
        assert_eq!(get(MAX_TRANSFER + 8), Err(Error::InvalidParameters));
        let clear = |first| {
            Call::decode(&[
                function::DIRTY_LOG_CLEAR.into(),
                1,
                0,
                first,
                0x1000,
                8,
                0,
                0,
            ])
        };
        assert!(clear(128).is_ok());
        assert_eq!(clear(100), Err(Error::InvalidParameters));
        let config = |mode, chunk| {
            Call::decode(&[
                function::DIRTY_LOG_CONFIG.into(),
                1,
                mode,
                chunk,
                0,
                0,
                0,
                0,
            ])
        };
        assert!(config(3, 2 << 20).is_ok());
        assert_eq!(config(2, 0), Err(Error::InvalidParameters));
        assert_eq!(config(4, 0), Err(Error::InvalidParameters));
        assert_eq!(config(0, 100), Err(Error::InvalidParameters));
    }

    proptest! {
        #[test]
        fn valid_calls_round_trip(c in call()) {
            let regs = c.encode();
            prop_assert_eq!(Call::decode(&regs), Ok(c));
            prop_assert_eq!(c.function().id() as u64, regs[0]);
        }

        #[test]
        fn decoded_calls_are_canonical(
            f in 0usize..Function::ALL.len(),
            args in proptest::array::uniform7(prop_oneof![
                Just(0u64), 0u64..64, any::<u64>(), (0u64..1 << 40).prop_map(|p| p << 12)
            ]),
        ) {
            let [a1, a2, a3, a4, a5, a6, a7] = args;
            let regs = [Function::ALL[f].id().into(), a1, a2, a3, a4, a5, a6, a7];
            if let Ok(c) = Call::decode(&regs) {
                prop_assert_eq!(c.encode(), regs);
            }
        }

        #[test]
        fn reserved_registers_must_be_zero(c in call(), which in 1usize..8, junk in 1u64..) {
            let mut regs = c.encode();
            // Find a register the layout leaves reserved: one that is zero in
            // the encoding and stays reserved whatever the arguments.
            let used = match c.function() {
                Function::Version | Function::Capabilities | Function::CallUid => 0,
                Function::VmPause | Function::VmResume | Function::VmStop => 1,
                Function::SlotDelete => 2,
                Function::ListVms | Function::SlotMove | Function::SlotSetFlags
                | Function::VcpuGetRegister | Function::DirtyLogConfig => 3,
                Function::MemoryRead | Function::MemoryWrite | Function::VcpuSetRegister
                | Function::DirtyLogGet | Function::VmMigrate => 4,
                Function::SlotCreate | Function::DirtyLogClear => 5,
            };
            prop_assume!(which > used);
            regs[which] = junk;
            prop_assert_eq!(Call::decode(&regs), Err(Error::InvalidParameters));
        }
    }

    #[test]
    fn unknown_functions_are_not_supported() {
        assert_eq!(
            Call::decode(&[0xC600_0042, 0, 0, 0, 0, 0, 0, 0]),
            Err(Error::NotSupported)
        );
        assert_eq!(
            Call::decode(&[1 << 32 | u64::from(function::VERSION), 0, 0, 0, 0, 0, 0, 0]),
            Err(Error::NotSupported)
        );
    }

    #[test]
    fn argument_checks() {
        let bad = |regs: [u64; 8]| assert_eq!(Call::decode(&regs), Err(Error::InvalidParameters));
        let pause = u64::from(function::VM_PAUSE);
        bad([pause, 1 << 32, 0, 0, 0, 0, 0, 0]);
        let create = u64::from(function::SLOT_CREATE);
        bad([create, 1, 32767, 0, 1, 0, 0, 0]); // slot id
        bad([create, 1, 0, 0x1001, 1, 0, 0, 0]); // misaligned
        bad([create, 1, 0, 0, 0, 0, 0, 0]); // zero pages
        bad([create, 1, 0, 0, MAX_SLOT_PAGES + 1, 0, 0, 0]);
        bad([create, 1, 0, IPA_LIMIT - PAGE_SIZE, 2, 0, 0, 0]); // past the limit
        bad([create, 1, 0, 0, 1, 3, 0, 0]); // dirty log on read-only
        bad([create, 1, 0, 0, 1, 4, 0, 0]); // unknown flag
        let read = u64::from(function::MEMORY_READ);
        bad([read, 1, 0, 0, MAX_TRANSFER + 1, 0, 0, 0]);
        bad([read, 1, u64::MAX - 1, 0, 16, 0, 0, 0]); // target wraps
        bad([read, 1, 0, u64::MAX - 1, 16, 0, 0, 0]); // buffer wraps
        bad([read, 1, 0, IPA_LIMIT - 8, 16, 0, 0, 0]); // buffer past the limit
        let get = u64::from(function::VCPU_GET_REGISTER);
        bad([get, 1, 0, 31, 0, 0, 0, 0]); // no x31
        bad([get, 1, 0, 0x1_0000, 0, 0, 0, 0]); // op0 = 0
        bad([get, 1, 1 << 32, 0, 0, 0, 0, 0]);
        let list = u64::from(function::LIST_VMS);
        bad([list, 0, MAX_TRANSFER + 1, 0, 0, 0, 0, 0]);
        bad([list, 0, 0, 1 << 32, 0, 0, 0, 0]);
    }

    #[test]
    fn register_kinds() {
        assert_eq!(RegisterId::x(30).unwrap().kind(), RegisterKind::X(30));
        assert_eq!(RegisterId::x(31), None);
        assert_eq!(RegisterId::PC.kind(), RegisterKind::Pc);
        // SCTLR_EL1 is S3_0_C1_C0_0.
        let sctlr = RegisterId::sysreg(0, 1, 0, 0).unwrap();
        assert_eq!(sctlr.get(), 0x1_C080);
        assert_eq!(
            sctlr.kind(),
            RegisterKind::SysReg {
                op1: 0,
                crn: 1,
                crm: 0,
                op2: 0
            }
        );
        assert_eq!(RegisterId::sysreg(8, 0, 0, 0), None);
        assert_eq!(RegisterId::from_register(0x26), None);
    }
}
