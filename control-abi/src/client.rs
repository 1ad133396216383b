//! The guest side: one method per call over a [`Conduit`].
//!
//! [`Client`] encodes a [`Call`], hands the registers to its conduit and
//! decodes the result registers into a typed reply or a [`CallError`]. It
//! checks nothing itself (the hypervisor validates every argument); buffer
//! addresses are guest physical addresses of the caller's own memory.
//! `Hvc` is the conduit of a guest: `hvc #0`. Tests use their own conduit.

use crate::call::{
    Call, DirtyLogClear, DirtyLogGet, MemoryTransfer, SlotFlags, SlotRequest, VcpuRegister,
};
use crate::error::{CallError, status};
use crate::reply::{Capabilities, ListVmsReply, Version, results};

/// How registers reach the hypervisor and come back.
pub trait Conduit {
    /// Issues a call with `x0..x7` = `regs` and returns `x0..x3`.
    fn call(&self, regs: [u64; 8]) -> [u64; 4];
}

/// The `hvc #0` conduit of a guest at EL1.
#[cfg(target_arch = "aarch64")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Hvc;

#[cfg(target_arch = "aarch64")]
impl Conduit for Hvc {
    fn call(&self, regs: [u64; 8]) -> [u64; 4] {
        let out: [u64; 4];
        // SAFETY: `hvc #0` traps to the hypervisor, which reads x0..x7 and
        // writes x0..x3; every register SMCCC lets it change (x0..x17) is
        // declared as an output, and no memory of this program is touched
        // except through buffers the caller passed by guest address.
        unsafe {
            let (r0, r1, r2, r3);
            core::arch::asm!(
                "hvc #0",
                inout("x0") regs[0] => r0,
                inout("x1") regs[1] => r1,
                inout("x2") regs[2] => r2,
                inout("x3") regs[3] => r3,
                inout("x4") regs[4] => _,
                inout("x5") regs[5] => _,
                inout("x6") regs[6] => _,
                inout("x7") regs[7] => _,
                lateout("x8") _, lateout("x9") _, lateout("x10") _, lateout("x11") _,
                lateout("x12") _, lateout("x13") _, lateout("x14") _, lateout("x15") _,
                lateout("x16") _, lateout("x17") _,
                options(nostack),
            );
            out = [r0, r1, r2, r3];
        }
        out
    }
}

/// A control-interface client over conduit `C`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Client<C> {
    conduit: C,
}

impl<C: Conduit> Client<C> {
    /// A client that calls through `conduit`.
    pub const fn new(conduit: C) -> Self {
        Self { conduit }
    }

    /// The conduit.
    pub fn conduit(&self) -> &C {
        &self.conduit
    }

    fn call(&self, call: Call) -> [u64; 4] {
        self.conduit.call(call.encode())
    }

    fn unit(&self, call: Call) -> Result<(), CallError> {
        results(self.call(call)).map(|_| ())
    }

    fn value(&self, call: Call) -> Result<u64, CallError> {
        results(self.call(call)).map(|[x1, _, _]| x1)
    }

    /// `VERSION`.
    pub fn version(&self) -> Result<Version, CallError> {
        Version::from_regs(self.call(Call::Version))
    }

    /// `CALL_UID`: the interface's UID (compare with [`crate::function::UID`]).
    pub fn call_uid(&self) -> Result<[u32; 4], CallError> {
        let regs = self.call(Call::CallUid);
        status(regs[0])?;
        Ok(regs.map(|r| r as u32))
    }

    /// `CAPABILITIES`.
    pub fn capabilities(&self) -> Result<Capabilities, CallError> {
        Capabilities::from_regs(self.call(Call::Capabilities))
    }

    /// `LIST_VMS`: writes records of the VMs from index `first` into the
    /// `len`-byte buffer at guest address `buffer`.
    pub fn list_vms(&self, buffer: u64, len: u64, first: u32) -> Result<ListVmsReply, CallError> {
        ListVmsReply::from_regs(self.call(Call::ListVms { buffer, len, first }))
    }

    /// `VM_PAUSE`.
    pub fn pause(&self, vm: u32) -> Result<(), CallError> {
        self.unit(Call::VmPause { vm })
    }

    /// `VM_RESUME`.
    pub fn resume(&self, vm: u32) -> Result<(), CallError> {
        self.unit(Call::VmResume { vm })
    }

    /// `VM_STOP`.
    pub fn stop(&self, vm: u32) -> Result<(), CallError> {
        self.unit(Call::VmStop { vm })
    }

    /// `SLOT_CREATE`.
    pub fn create_slot(&self, request: SlotRequest) -> Result<(), CallError> {
        self.unit(Call::SlotCreate(request))
    }

    /// `SLOT_DELETE`.
    pub fn delete_slot(&self, vm: u32, slot: u32) -> Result<(), CallError> {
        self.unit(Call::SlotDelete { vm, slot })
    }

    /// `SLOT_MOVE`.
    pub fn move_slot(&self, vm: u32, slot: u32, base_ipa: u64) -> Result<(), CallError> {
        self.unit(Call::SlotMove { vm, slot, base_ipa })
    }

    /// `SLOT_SET_FLAGS`.
    pub fn set_slot_flags(&self, vm: u32, slot: u32, flags: SlotFlags) -> Result<(), CallError> {
        self.unit(Call::SlotSetFlags { vm, slot, flags })
    }

    /// `MEMORY_READ`: returns the bytes copied (all of them on success).
    pub fn read_memory(&self, transfer: MemoryTransfer) -> Result<u64, CallError> {
        self.value(Call::MemoryRead(transfer))
    }

    /// `MEMORY_WRITE`: returns the bytes copied (all of them on success).
    pub fn write_memory(&self, transfer: MemoryTransfer) -> Result<u64, CallError> {
        self.value(Call::MemoryWrite(transfer))
    }

    /// `VCPU_GET_REGISTER`.
    pub fn get_register(&self, reg: VcpuRegister) -> Result<u64, CallError> {
        self.value(Call::VcpuGetRegister(reg))
    }

    /// `VCPU_SET_REGISTER`.
    pub fn set_register(&self, reg: VcpuRegister, value: u64) -> Result<(), CallError> {
        self.unit(Call::VcpuSetRegister { reg, value })
    }

    /// `DIRTY_LOG_GET`: returns the number of dirty pages reported.
    pub fn dirty_log_get(&self, get: DirtyLogGet) -> Result<u64, CallError> {
        self.value(Call::DirtyLogGet(get))
    }

    /// `DIRTY_LOG_CLEAR`: returns the number of pages cleared and
    /// write-protected again.
    pub fn dirty_log_clear(&self, clear: DirtyLogClear) -> Result<u64, CallError> {
        self.value(Call::DirtyLogClear(clear))
    }

    /// `VM_MIGRATE` with the hypervisor's defaults (no byte-for-byte
    /// check, its downtime limit): the migration starts; the hypervisor
    /// reports how it went.
    pub fn migrate(&self, src: u32, dst: u32) -> Result<(), CallError> {
        self.migrate_with(src, dst, false, 0)
    }

    /// `VM_MIGRATE` (1.2 options): with the byte-for-byte check when
    /// `verify`, aiming for `downtime_limit_us` microseconds (0: the
    /// hypervisor's default).
    pub fn migrate_with(
        &self,
        src: u32,
        dst: u32,
        verify: bool,
        downtime_limit_us: u64,
    ) -> Result<(), CallError> {
        self.unit(Call::VmMigrate {
            src,
            dst,
            verify,
            downtime_limit_us,
        })
    }

    /// `DIRTY_LOG_CONFIG`.
    pub fn dirty_log_config(&self, vm: u32, mode: u8, eager_chunk: u64) -> Result<(), CallError> {
        self.unit(Call::DirtyLogConfig {
            vm,
            mode,
            eager_chunk,
        })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::error::Error;
    use crate::function;
    use crate::{RegisterId, VERSION_MAJOR};
    use core::cell::RefCell;
    use std::vec::Vec;

    /// Records every call and answers from a script.
    struct Recorder {
        calls: RefCell<Vec<[u64; 8]>>,
        answer: [u64; 4],
    }

    impl Conduit for Recorder {
        fn call(&self, regs: [u64; 8]) -> [u64; 4] {
            self.calls.borrow_mut().push(regs);
            self.answer
        }
    }

    fn client(answer: [u64; 4]) -> Client<Recorder> {
        Client::new(Recorder {
            calls: RefCell::new(Vec::new()),
            answer,
        })
    }

    #[test]
    fn methods_send_their_layout_and_read_results() {
        let c = client([0, 7, 9, 0]);
        assert_eq!(
            c.list_vms(0x4000_0000, 64, 1),
            Ok(ListVmsReply {
                written: 7,
                total: 9
            })
        );
        c.pause(3).unwrap();
        c.move_slot(3, 2, 0x8000_0000).unwrap();
        let reg = VcpuRegister {
            vm: 3,
            vcpu: 1,
            reg: RegisterId::PC,
        };
        assert_eq!(c.get_register(reg), Ok(7));
        c.set_register(reg, 0xdead).unwrap();
        let calls = c.conduit().calls.borrow();
        assert_eq!(
            calls[0],
            [
                u64::from(function::LIST_VMS),
                0x4000_0000,
                64,
                1,
                0,
                0,
                0,
                0
            ]
        );
        assert_eq!(
            calls[1],
            [u64::from(function::VM_PAUSE), 3, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            calls[2],
            [
                u64::from(function::SLOT_MOVE),
                3,
                2,
                0x8000_0000,
                0,
                0,
                0,
                0
            ]
        );
        assert_eq!(
            calls[4],
            [
                u64::from(function::VCPU_SET_REGISTER),
                3,
                1,
                0x20,
                0xdead,
                0,
                0,
                0
            ]
        );
    }

    #[test]
    fn errors_and_version() {
        let c = client([Error::NoSuchVm.x0(), 0, 0, 0]);
        assert_eq!(c.stop(9), Err(CallError::Refused(Error::NoSuchVm)));
        assert_eq!(c.version(), Err(CallError::Refused(Error::NoSuchVm)));
        let c = client([u64::from(VERSION_MAJOR) << 16, 0, 0, 0]);
        assert_eq!(c.version().unwrap().major, VERSION_MAJOR);
        let uid = function::UID.map(u64::from);
        assert_eq!(client(uid).call_uid(), Ok(function::UID));
    }
}
