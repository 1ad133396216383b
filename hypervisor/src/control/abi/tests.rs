//! Tests of the control dispatcher against a fake machine layer: fake host
//! memory, real memslots for the caller and the target VMs.

use std::collections::HashMap;
use std::vec::Vec;

use control_abi::reply::{self, Capabilities, ListVmsReply, Version};
use control_abi::vm_info::RECORD_SIZE;
use control_abi::{
    Call, Error, Function, MAX_TRANSFER, MemoryTransfer, RegisterId, SlotRequest, VcpuRegister,
    VmInfo, VmState, function,
};
use crossbeam_epoch::{Collector, LocalHandle};
use memslot::{
    DirtyLogMode, Gfn, HostPhysAddr, MemslotError, MemslotSet, Memslots, SlotFlags, SlotId,
    SlotSpec,
};
use proptest::prelude::*;

use crate::vm::migration_plan::{DEFAULT_DOWNTIME_LIMIT_US, MigrationOptions};

use super::buffer::{Access, Buffer, CallerMemory, HostSpan, MAX_SPANS};
use super::server::{Caller, dispatch};
use super::target::{ControlTarget, NewSlot, VmId, memslot_error};

const HOST_BASE: u64 = 0x8000_0000;
const HOST_SIZE: u64 = 16 << 20;
const BUMP_START: u64 = 0x8080_0000;
const PAGE: u64 = 4096;

/// The caller (VM 0)'s layout: guest-adjacent slots 0 and 1 with distant
/// backings, a hole, a read-only slot and a logging slot.
const CALLER_RAM: u64 = 0x4000_0000;
const CALLER_SLOT1: u64 = 0x4000_4000;
const CALLER_HOLE: u64 = 0x4000_5000;
const CALLER_RO: u64 = 0x4000_6000;
const CALLER_LOG: u64 = 0x4001_0000;

struct Vm {
    info: VmInfo,
    _collector: Collector,
    handle: LocalHandle,
    slots: Memslots,
    regs: HashMap<(u32, u32), u64>,
}

impl Vm {
    fn new(id: u32, state: VmState, vcpus: u32, control: bool) -> Self {
        let collector = Collector::new();
        let handle = collector.register();
        let slots = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
        Self {
            info: VmInfo {
                id,
                state,
                vcpus,
                control,
                ram_pages: 0,
                slots: 0,
            },
            _collector: collector,
            handle,
            slots,
            regs: HashMap::new(),
        }
    }

    fn add(&self, id: u32, ipa: u64, npages: u64, backing: u64, flags: SlotFlags) {
        let spec = SlotSpec {
            id: SlotId::new(id).unwrap(),
            base_gfn: Gfn::from_ipa(ipa),
            npages,
            backing: HostPhysAddr(backing),
            flags,
        };
        self.slots.create(&self.handle, spec).unwrap();
    }

    /// Host spans of `[ipa, ipa + len)`, or `NotMapped`.
    fn translate(&self, ipa: u64, len: u64, write: bool) -> Result<Vec<(u64, u64, Gfn)>, Error> {
        let guard = self.handle.pin();
        let set = self.slots.slots(&guard).map_err(memslot_error)?;
        let mut out = Vec::new();
        let end = ipa.checked_add(len).ok_or(Error::NotMapped)?;
        let mut at = ipa;
        while at < end {
            let piece = (PAGE - at % PAGE).min(end - at);
            let gfn = Gfn::from_ipa(at);
            let slot = set.find(gfn).ok_or(Error::NotMapped)?;
            if write && slot.is_read_only() {
                return Err(Error::NotMapped);
            }
            out.push((slot.translate(gfn).unwrap().0 + at % PAGE, piece, gfn));
            at += piece;
        }
        Ok(out)
    }
}

/// The fake machine layer.
struct Fake {
    ram: Vec<u8>,
    bump: u64,
    vms: Vec<Vm>,
    /// Every call the dispatcher made, by name.
    log: Vec<&'static str>,
    migrations: Vec<MigrationOptions>,
}

impl Fake {
    fn new() -> Self {
        let vm1 = Vm::new(1, VmState::Running, 2, false);
        vm1.add(0, 0, 4, 0x8040_0000, SlotFlags::NONE);
        vm1.add(1, 0x10_0000, 1, 0x8044_0000, SlotFlags::READ_ONLY);
        vm1.add(2, 0x20_0000, 2, 0x8048_0000, SlotFlags::LOG_DIRTY);
        let mut fake = Self {
            ram: vec![0; HOST_SIZE as usize],
            bump: BUMP_START,
            vms: vec![
                Vm::new(0, VmState::Running, 1, true),
                vm1,
                Vm::new(2, VmState::Stopped, 1, false),
            ],
            log: Vec::new(),
            migrations: Vec::new(),
        };
        for i in 0..4 * PAGE {
            fake.ram[(0x8040_0000 - HOST_BASE + i) as usize] = (i % 251) as u8;
        }
        fake
    }

    fn vm(&mut self, id: VmId) -> Result<&mut Vm, Error> {
        self.vms
            .iter_mut()
            .find(|vm| vm.info.id == id)
            .ok_or(Error::NoSuchVm)
    }

    fn host(&mut self, addr: u64, len: u64) -> &mut [u8] {
        let start = (addr - HOST_BASE) as usize;
        &mut self.ram[start..start + len as usize]
    }

    fn copy(&mut self, from: u64, to: u64, len: u64) {
        let from = (from - HOST_BASE) as usize;
        let to = (to - HOST_BASE) as usize;
        self.ram.copy_within(from..from + len as usize, to);
    }
}

impl ControlTarget for Fake {
    fn capabilities(&self) -> u64 {
        Capabilities::ALL_1_1
    }

    fn vm_count(&self) -> usize {
        self.vms.len()
    }

    fn vm_info(&self, index: usize) -> Option<VmInfo> {
        self.vms.get(index).map(|vm| vm.info)
    }

    fn pause(&mut self, vm: VmId) -> Result<(), Error> {
        self.log.push("pause");
        let vm = self.vm(vm)?;
        match vm.info.state {
            VmState::Stopped => Err(Error::BadState),
            _ => {
                vm.info.state = VmState::Paused;
                Ok(())
            }
        }
    }

    fn resume(&mut self, vm: VmId) -> Result<(), Error> {
        self.log.push("resume");
        let vm = self.vm(vm)?;
        match vm.info.state {
            VmState::Stopped => Err(Error::BadState),
            _ => {
                vm.info.state = VmState::Running;
                Ok(())
            }
        }
    }

    fn stop(&mut self, vm: VmId) -> Result<(), Error> {
        self.log.push("stop");
        self.vm(vm)?.info.state = VmState::Stopped;
        Ok(())
    }

    fn create_slot(&mut self, vm: VmId, slot: NewSlot) -> Result<(), Error> {
        self.log.push("create_slot");
        self.vm(vm)?;
        let bytes = slot.npages * PAGE;
        if HOST_BASE + HOST_SIZE - self.bump < bytes {
            return Err(Error::NoMemory);
        }
        let backing = self.bump;
        let spec = SlotSpec {
            id: slot.id,
            base_gfn: slot.base_gfn,
            npages: slot.npages,
            backing: HostPhysAddr(backing),
            flags: slot.flags,
        };
        let target = self.vm(vm)?;
        target
            .slots
            .create(&target.handle, spec)
            .map_err(memslot_error)?;
        self.bump += bytes;
        self.host(backing, bytes).fill(0);
        Ok(())
    }

    fn delete_slot(&mut self, vm: VmId, id: SlotId) -> Result<(), Error> {
        self.log.push("delete_slot");
        let vm = self.vm(vm)?;
        vm.slots.delete(&vm.handle, id).map_err(memslot_error)?;
        Ok(())
    }

    fn move_slot(&mut self, vm: VmId, id: SlotId, base_gfn: Gfn) -> Result<(), Error> {
        self.log.push("move_slot");
        let vm = self.vm(vm)?;
        vm.slots
            .move_slot(&vm.handle, id, base_gfn)
            .map_err(memslot_error)?;
        Ok(())
    }

    fn set_slot_flags(&mut self, vm: VmId, id: SlotId, flags: SlotFlags) -> Result<(), Error> {
        self.log.push("set_slot_flags");
        let vm = self.vm(vm)?;
        vm.slots
            .set_flags(&vm.handle, id, flags)
            .map_err(memslot_error)?;
        Ok(())
    }

    fn read_memory(&mut self, vm: VmId, ipa: u64, dst: &[HostSpan]) -> Result<(), Error> {
        self.log.push("read_memory");
        let len = dst.iter().map(|s| s.len).sum();
        let src = self.vm(vm)?.translate(ipa, len, false)?;
        copy_spans(self, src.iter().map(|&(a, l, _)| (a, l)), dst, true);
        Ok(())
    }

    fn write_memory(&mut self, vm: VmId, ipa: u64, src: &[HostSpan]) -> Result<(), Error> {
        self.log.push("write_memory");
        let len = src.iter().map(|s| s.len).sum();
        let target = self.vm(vm)?;
        let dst = target.translate(ipa, len, true)?;
        {
            let guard = target.handle.pin();
            let set = target.slots.slots(&guard).unwrap();
            for &(_, _, gfn) in &dst {
                set.find(gfn).unwrap().mark_dirty(gfn);
            }
        }
        copy_spans(self, dst.iter().map(|&(a, l, _)| (a, l)), src, false);
        Ok(())
    }

    fn write_host(&mut self, dst: HostPhysAddr, bytes: &[u8]) {
        self.log.push("write_host");
        self.host(dst.0, bytes.len() as u64).copy_from_slice(bytes);
    }

    fn migrate(&mut self, src: VmId, dst: VmId, options: MigrationOptions) -> Result<(), Error> {
        self.log.push("migrate");
        self.migrations.push(options);
        self.vm(src)?;
        self.vm(dst)?;
        Ok(())
    }

    fn read_host(&mut self, src: HostPhysAddr, out: &mut [u8]) {
        self.log.push("read_host");
        out.copy_from_slice(self.host(src.0, out.len() as u64));
    }

    fn dirty_log_get(&mut self, vm: VmId, id: SlotId, out: &mut [u64]) -> Result<u64, Error> {
        self.log.push("dirty_log_get");
        let vm = self.vm(vm)?;
        vm.slots
            .get_dirty_log(&vm.handle, id, out)
            .map_err(memslot_error)
    }

    fn dirty_log_clear(
        &mut self,
        vm: VmId,
        id: SlotId,
        first_page: u64,
        mask: &mut [u64],
    ) -> Result<u64, Error> {
        self.log.push("dirty_log_clear");
        let vm = self.vm(vm)?;
        vm.slots
            .clear_dirty_log(&vm.handle, id, first_page, mask)
            .map_err(memslot_error)
    }

    fn dirty_log_config(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        _eager_chunk: u64,
    ) -> Result<(), Error> {
        self.log.push("dirty_log_config");
        let vm = self.vm(vm)?;
        vm.slots
            .set_dirty_log_mode(&vm.handle, mode)
            .map_err(memslot_error)
    }

    fn get_register(&mut self, vm: VmId, vcpu: u32, reg: RegisterId) -> Result<u64, Error> {
        self.log.push("get_register");
        let vm = self.vm(vm)?;
        check_register(vm, vcpu, reg)?;
        Ok(vm.regs.get(&(vcpu, reg.get())).copied().unwrap_or(0))
    }

    fn set_register(
        &mut self,
        vm: VmId,
        vcpu: u32,
        reg: RegisterId,
        value: u64,
    ) -> Result<(), Error> {
        self.log.push("set_register");
        let vm = self.vm(vm)?;
        check_register(vm, vcpu, reg)?;
        vm.regs.insert((vcpu, reg.get()), value);
        Ok(())
    }
}

fn check_register(vm: &Vm, vcpu: u32, reg: RegisterId) -> Result<(), Error> {
    if vm.info.state != VmState::Paused {
        return Err(Error::BadState);
    }
    if vcpu >= vm.info.vcpus {
        return Err(Error::NoSuchVcpu);
    }
    // The fake keeps core registers and SCTLR_EL1 only.
    if reg.get() >= 0x1_0000 && reg != RegisterId::sysreg(0, 1, 0, 0).unwrap() {
        return Err(Error::InvalidParameters);
    }
    Ok(())
}

/// Copies between a list of target pieces and the caller's spans, in order.
fn copy_spans(
    fake: &mut Fake,
    target: impl Iterator<Item = (u64, u64)>,
    caller: &[HostSpan],
    to_caller: bool,
) {
    let mut caller = caller.iter().map(|s| (s.host.0, s.len)).collect::<Vec<_>>();
    caller.reverse();
    for (mut addr, mut len) in target {
        while len > 0 {
            let (c_addr, c_len) = caller.pop().unwrap();
            let n = len.min(c_len);
            if to_caller {
                fake.copy(addr, c_addr, n);
            } else {
                fake.copy(c_addr, addr, n);
            }
            if n < c_len {
                caller.push((c_addr + n, c_len - n));
            }
            addr += n;
            len -= n;
        }
    }
}

/// The caller's memory: real memslots over the fake host memory.
struct CallerVm {
    _collector: Collector,
    handle: LocalHandle,
    slots: Memslots,
}

impl CallerVm {
    fn new() -> Self {
        let collector = Collector::new();
        let handle = collector.register();
        let slots = Memslots::new(&collector, DirtyLogMode::default()).unwrap();
        let add = |id, ipa: u64, npages, backing, flags| {
            let spec = SlotSpec {
                id: SlotId::new(id).unwrap(),
                base_gfn: Gfn::from_ipa(ipa),
                npages,
                backing: HostPhysAddr(backing),
                flags,
            };
            slots.create(&handle, spec).unwrap();
        };
        add(0, CALLER_RAM, 4, 0x8000_0000, SlotFlags::NONE);
        add(1, CALLER_SLOT1, 1, 0x8010_0000, SlotFlags::NONE);
        add(2, CALLER_RO, 1, 0x8020_0000, SlotFlags::READ_ONLY);
        add(3, CALLER_LOG, 20, 0x8030_0000, SlotFlags::LOG_DIRTY);
        Self {
            _collector: collector,
            handle,
            slots,
        }
    }

    /// Runs `f` with the caller's published slot set, as the machine layer
    /// does for the length of one call.
    fn with<R>(&self, f: impl FnOnce(&MemslotSet) -> R) -> R {
        let guard = self.handle.pin();
        f(self.slots.slots(&guard).unwrap())
    }

    fn dirty(&self, slot: u32) -> Vec<u64> {
        let mut bits = vec![0u64; 1];
        self.slots
            .get_dirty_log(&self.handle, SlotId::new(slot).unwrap(), &mut bits)
            .unwrap();
        bits
    }
}

/// One call by the control VM 0.
fn call(caller: &CallerVm, fake: &mut Fake, c: Call) -> [u64; 4] {
    call_regs(caller, fake, &c.encode(), true)
}

fn call_regs(caller: &CallerVm, fake: &mut Fake, regs: &[u64; 8], control: bool) -> [u64; 4] {
    caller.with(|memory| {
        let who = Caller {
            vm: 0,
            control,
            memory,
        };
        dispatch(&who, regs, fake)
    })
}

fn err(e: Error) -> [u64; 4] {
    [e.x0(), 0, 0, 0]
}

const OK: [u64; 4] = [0; 4];

/// Caller guest address -> host address, for the test layout.
fn caller_host(ipa: u64) -> u64 {
    match ipa {
        CALLER_RAM..CALLER_SLOT1 => 0x8000_0000 + ipa - CALLER_RAM,
        CALLER_SLOT1..CALLER_HOLE => 0x8010_0000 + ipa - CALLER_SLOT1,
        CALLER_LOG.. => 0x8030_0000 + ipa - CALLER_LOG,
        _ => panic!("not caller RAM: {ipa:#x}"),
    }
}

fn read_caller(fake: &mut Fake, ipa: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| fake.host(caller_host(ipa + i), 1)[0])
        .collect()
}

fn every_function_regs() -> Vec<[u64; 8]> {
    let mut all: Vec<[u64; 8]> = Function::ALL
        .iter()
        .map(|f| [u64::from(f.id()), 1, 0, 0, 1, 0, 0, 0])
        .collect();
    all.push([0xC600_0042, 0, 0, 0, 0, 0, 0, 0]);
    all
}

#[test]
fn a_vm_that_is_not_a_control_vm_gets_not_supported_from_every_call() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    for regs in every_function_regs() {
        assert_eq!(
            call_regs(&caller, &mut fake, &regs, false),
            err(Error::NotSupported),
            "{regs:x?}"
        );
    }
    assert!(
        fake.log.is_empty(),
        "the machine layer was not asked anything"
    );
}

#[test]
fn version_uid_and_capabilities() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let v = Version::from_regs(call(&caller, &mut fake, Call::Version)).unwrap();
    assert_eq!(v, Version::CURRENT);
    assert_eq!(
        call(&caller, &mut fake, Call::CallUid),
        function::UID.map(u64::from)
    );
    let caps = Capabilities::from_regs(call(&caller, &mut fake, Call::Capabilities)).unwrap();
    assert_eq!(caps.bits, Capabilities::ALL_1_1);
    assert_eq!(caps.max_transfer, MAX_TRANSFER);
    assert_eq!(caps.record_size, RECORD_SIZE as u64);
}

#[test]
fn unknown_ids_and_bad_registers() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    for id in [
        0xC600_0002u64,
        0xC600_001D,
        0xC600_FFFF,
        0x8600_0000,
        0x8600_FF03,
    ] {
        assert_eq!(
            call_regs(&caller, &mut fake, &[id, 0, 0, 0, 0, 0, 0, 0], true),
            err(Error::NotSupported),
            "{id:#x}"
        );
    }
    let version = u64::from(function::VERSION);
    assert_eq!(
        call_regs(&caller, &mut fake, &[version, 0, 0, 0, 0, 0, 0, 9], true),
        err(Error::InvalidParameters),
        "reserved x7"
    );
    assert!(fake.log.is_empty());
}

#[test]
fn a_caller_may_not_name_itself() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let me = VcpuRegister {
        vm: 0,
        vcpu: 0,
        reg: RegisterId::PC,
    };
    let transfer = MemoryTransfer {
        vm: 0,
        ipa: CALLER_RAM,
        buffer: CALLER_RAM,
        len: 8,
    };
    for c in [
        Call::VmPause { vm: 0 },
        Call::VmResume { vm: 0 },
        Call::VmStop { vm: 0 },
        Call::SlotDelete { vm: 0, slot: 0 },
        Call::SlotMove {
            vm: 0,
            slot: 0,
            base_ipa: 0,
        },
        Call::SlotSetFlags {
            vm: 0,
            slot: 0,
            flags: control_abi::SlotFlags::NONE,
        },
        Call::SlotCreate(SlotRequest {
            vm: 0,
            slot: 9,
            base_ipa: 0,
            npages: 1,
            flags: control_abi::SlotFlags::NONE,
        }),
        Call::MemoryRead(transfer),
        Call::MemoryWrite(transfer),
        Call::VcpuGetRegister(me),
        Call::VcpuSetRegister { reg: me, value: 1 },
        Call::VmMigrate {
            src: 0,
            dst: 1,
            verify: false,
            downtime_limit_us: 0,
        },
        Call::VmMigrate {
            src: 1,
            dst: 0,
            verify: true,
            downtime_limit_us: 0,
        },
    ] {
        assert_eq!(call(&caller, &mut fake, c), err(Error::Denied), "{c:?}");
    }
    assert!(fake.log.is_empty());
}

#[test]
fn dirty_log_get_writes_the_bitmap_into_the_callers_buffer() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    {
        let vm = &fake.vms[1];
        let guard = vm.handle.pin();
        let gfn = Gfn::from_ipa(0x20_1000);
        let set = vm.slots.slots(&guard).unwrap();
        assert!(set.find(gfn).unwrap().mark_dirty(gfn));
    }
    // The 8-byte buffer straddles the caller's slot 0 / slot 1 boundary.
    let buffer = CALLER_SLOT1 - 4;
    let get = |slot| {
        Call::DirtyLogGet(control_abi::DirtyLogGet {
            vm: 1,
            slot,
            buffer,
            len: 8,
        })
    };
    assert_eq!(call(&caller, &mut fake, get(2)), reply::success(1, 0, 0));
    let bytes = read_caller(&mut fake, buffer, 8);
    assert_eq!(u64::from_le_bytes(bytes.try_into().unwrap()), 0b10);
    // Taken: the next harvest reports nothing.
    assert_eq!(call(&caller, &mut fake, get(2)), reply::success(0, 0, 0));
    // A slot that does not log is refused.
    assert_eq!(
        call(&caller, &mut fake, get(0)),
        err(Error::InvalidParameters)
    );
    // The caller's written buffer pages are marked in its own dirty log only
    // where they log (slots 0 and 1 do not).
    assert_eq!(caller.dirty(3), vec![0]);
}

#[test]
fn list_vms_writes_records_across_a_page_and_slot_boundary() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    // 16 bytes before the end of slot 0; the rest lies in slot 1, whose
    // backing is far away in host memory.
    let buffer = CALLER_SLOT1 - 16;
    let regs = call(
        &caller,
        &mut fake,
        Call::ListVms {
            buffer,
            len: 3 * RECORD_SIZE as u64,
            first: 0,
        },
    );
    assert_eq!(
        ListVmsReply::from_regs(regs),
        Ok(ListVmsReply {
            written: 3,
            total: 3
        })
    );
    let bytes = read_caller(&mut fake, buffer, 3 * RECORD_SIZE as u64);
    for (i, record) in bytes.chunks(RECORD_SIZE).enumerate() {
        let info = VmInfo::decode(record.try_into().unwrap()).unwrap();
        assert_eq!(info, fake.vms[i].info);
    }
    // From index 2, room for 2: one written; a buffer smaller than a record.
    let regs = call(
        &caller,
        &mut fake,
        Call::ListVms {
            buffer: CALLER_RAM,
            len: 2 * RECORD_SIZE as u64,
            first: 2,
        },
    );
    assert_eq!(regs, [0, 1, 3, 0]);
    let regs = call(
        &caller,
        &mut fake,
        Call::ListVms {
            buffer: CALLER_RAM,
            len: RECORD_SIZE as u64 - 1,
            first: 0,
        },
    );
    assert_eq!(regs, [0, 0, 3, 0]);
    let regs = call(
        &caller,
        &mut fake,
        Call::ListVms {
            buffer: CALLER_RAM,
            len: 64,
            first: u32::MAX,
        },
    );
    assert_eq!(regs, [0, 0, 3, 0]);
}

#[test]
fn list_vms_refuses_holes_and_read_only_buffers_before_writing() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    for buffer in [CALLER_HOLE - 16, CALLER_HOLE, CALLER_RO] {
        let regs = call(
            &caller,
            &mut fake,
            Call::ListVms {
                buffer,
                len: 64,
                first: 0,
            },
        );
        assert_eq!(regs, err(Error::BadAddress), "{buffer:#x}");
    }
    assert!(!fake.log.contains(&"write_host"), "nothing was written");
}

#[test]
fn list_vms_marks_the_callers_pages_dirty() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let regs = call(
        &caller,
        &mut fake,
        Call::ListVms {
            buffer: CALLER_LOG + 2 * PAGE - 40,
            len: 64,
            first: 0,
        },
    );
    assert_eq!(regs[0], 0);
    assert_eq!(caller.dirty(3), vec![0b110]);
}

#[test]
fn lifecycle() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    assert_eq!(call(&caller, &mut fake, Call::VmPause { vm: 1 }), OK);
    assert_eq!(fake.vms[1].info.state, VmState::Paused);
    assert_eq!(call(&caller, &mut fake, Call::VmResume { vm: 1 }), OK);
    assert_eq!(fake.vms[1].info.state, VmState::Running);
    assert_eq!(
        call(&caller, &mut fake, Call::VmPause { vm: 7 }),
        err(Error::NoSuchVm)
    );
    assert_eq!(
        call(&caller, &mut fake, Call::VmResume { vm: 2 }),
        err(Error::BadState)
    );
    assert_eq!(call(&caller, &mut fake, Call::VmStop { vm: 1 }), OK);
    assert_eq!(fake.vms[1].info.state, VmState::Stopped);
    assert_eq!(
        call(&caller, &mut fake, Call::VmStop { vm: u32::MAX }),
        err(Error::NoSuchVm)
    );
}

fn slot_request(slot: u32, base_ipa: u64, npages: u64) -> Call {
    Call::SlotCreate(SlotRequest {
        vm: 1,
        slot,
        base_ipa,
        npages,
        flags: control_abi::SlotFlags::NONE,
    })
}

fn target_slots(fake: &Fake, vm: usize) -> Vec<SlotSpec> {
    let vm = &fake.vms[vm];
    let guard = vm.handle.pin();
    vm.slots
        .slots(&guard)
        .unwrap()
        .iter()
        .map(|s| s.spec())
        .collect()
}

#[test]
fn memslots_on_another_vm() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    assert_eq!(call(&caller, &mut fake, slot_request(5, 0x100_0000, 8)), OK);
    let created = target_slots(&fake, 1)
        .into_iter()
        .find(|s| s.id.get() == 5)
        .unwrap();
    assert_eq!(created.base_gfn, Gfn::from_ipa(0x100_0000));
    assert_eq!(created.backing, HostPhysAddr(BUMP_START));
    assert_eq!(
        call(&caller, &mut fake, slot_request(5, 0x200_0000, 1)),
        err(Error::Conflict),
        "id in use"
    );
    assert_eq!(
        call(&caller, &mut fake, slot_request(6, 0x100_4000, 8)),
        err(Error::Conflict),
        "overlap"
    );
    assert_eq!(
        call(&caller, &mut fake, slot_request(6, 0x200_0000, 1 << 30)),
        err(Error::NoMemory)
    );
    assert_eq!(
        call(&caller, &mut fake, slot_request(6, 0x1001, 1)),
        err(Error::InvalidParameters)
    );
    let mv = |slot, base_ipa| Call::SlotMove {
        vm: 1,
        slot,
        base_ipa,
    };
    assert_eq!(call(&caller, &mut fake, mv(5, 0x300_0000)), OK);
    assert!(
        target_slots(&fake, 1)
            .iter()
            .any(|s| s.id.get() == 5 && s.base_gfn == Gfn::from_ipa(0x300_0000))
    );
    assert_eq!(
        call(&caller, &mut fake, mv(9, 0x300_0000)),
        err(Error::NoSuchSlot)
    );
    assert_eq!(
        call(&caller, &mut fake, mv(5, 0)),
        err(Error::Conflict),
        "onto slot 0"
    );
    let flags = |slot, flags| Call::SlotSetFlags { vm: 1, slot, flags };
    assert_eq!(
        call(
            &caller,
            &mut fake,
            flags(5, control_abi::SlotFlags::LOG_DIRTY)
        ),
        OK
    );
    assert_eq!(
        call(
            &caller,
            &mut fake,
            flags(5, control_abi::SlotFlags::READ_ONLY)
        ),
        err(Error::InvalidParameters),
        "read-only cannot be toggled"
    );
    assert_eq!(
        call(&caller, &mut fake, Call::SlotDelete { vm: 1, slot: 5 }),
        OK
    );
    assert_eq!(
        call(&caller, &mut fake, Call::SlotDelete { vm: 1, slot: 5 }),
        err(Error::NoSuchSlot)
    );
    assert_eq!(
        call(&caller, &mut fake, Call::SlotDelete { vm: 9, slot: 0 }),
        err(Error::NoSuchVm)
    );
}

fn read(vm: u32, ipa: u64, buffer: u64, len: u64) -> Call {
    Call::MemoryRead(MemoryTransfer {
        vm,
        ipa,
        buffer,
        len,
    })
}

fn write(vm: u32, ipa: u64, buffer: u64, len: u64) -> Call {
    Call::MemoryWrite(MemoryTransfer {
        vm,
        ipa,
        buffer,
        len,
    })
}

fn target_bytes(fake: &mut Fake, vm: usize, ipa: u64, len: u64) -> Vec<u8> {
    let pieces = fake.vms[vm].translate(ipa, len, false).unwrap();
    pieces
        .into_iter()
        .flat_map(|(a, l, _)| fake.host(a, l).to_vec())
        .collect()
}

#[test]
fn memory_read_crosses_pages_and_slots_on_both_sides() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    // Target bytes 0x0ff0..0x3010 (three page boundaries), into a caller
    // buffer that starts in slot 0 and ends in slot 1.
    let len = 0x2020;
    let buffer = CALLER_SLOT1 - 0x1020;
    let regs = call(&caller, &mut fake, read(1, 0xff0, buffer, len));
    assert_eq!(regs, [0, len, 0, 0]);
    let expect = target_bytes(&mut fake, 1, 0xff0, len);
    assert_eq!(read_caller(&mut fake, buffer, len), expect);
    assert_eq!(expect[0x10], ((0x1000u64) % 251) as u8);
}

#[test]
fn memory_read_refuses_bad_buffers_and_unmapped_targets() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    assert_eq!(
        call(&caller, &mut fake, read(1, 0, CALLER_HOLE - 8, 16)),
        err(Error::BadAddress),
        "buffer runs into a hole"
    );
    assert_eq!(
        call(&caller, &mut fake, read(1, 0, CALLER_RO, 16)),
        err(Error::BadAddress),
        "buffer is read-only"
    );
    assert_eq!(
        call(&caller, &mut fake, read(1, 0, 0x1000, 16)),
        err(Error::BadAddress),
        "buffer is not caller RAM"
    );
    assert!(
        !fake.log.contains(&"read_memory"),
        "refused before the copy"
    );
    assert_eq!(
        call(&caller, &mut fake, read(1, 4 * PAGE - 8, CALLER_RAM, 16)),
        err(Error::NotMapped),
        "target range runs past slot 0"
    );
    assert_eq!(
        call(&caller, &mut fake, read(9, 0, CALLER_RAM, 16)),
        err(Error::NoSuchVm)
    );
    assert_eq!(
        call(&caller, &mut fake, read(1, 0, CALLER_RAM, MAX_TRANSFER + 1)),
        err(Error::InvalidParameters)
    );
    assert_eq!(
        call(&caller, &mut fake, read(1, 0, u64::MAX - 4, 16)),
        err(Error::InvalidParameters),
        "buffer wraps"
    );
}

#[test]
fn memory_read_marks_the_callers_pages_dirty() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let regs = call(&caller, &mut fake, read(1, 0, CALLER_LOG + PAGE - 8, 16));
    assert_eq!(regs, [0, 16, 0, 0]);
    assert_eq!(caller.dirty(3), vec![0b11]);
}

#[test]
fn memory_write_from_any_caller_ram_into_the_target() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    // Source: the read-only slot is fine for the hypervisor to read.
    fake.host(0x8020_0000, 32).copy_from_slice(&[0xAB; 32]);
    let regs = call(
        &caller,
        &mut fake,
        write(1, 0x20_0000 + PAGE - 16, CALLER_RO, 32),
    );
    assert_eq!(regs, [0, 32, 0, 0]);
    assert_eq!(
        target_bytes(&mut fake, 1, 0x20_0000 + PAGE - 16, 32),
        vec![0xAB; 32]
    );
    assert_eq!(
        call(&caller, &mut fake, write(1, 0x10_0000, CALLER_RAM, 8)),
        err(Error::NotMapped),
        "target slot is read-only"
    );
    assert_eq!(
        call(&caller, &mut fake, write(1, 0, CALLER_HOLE, 8)),
        err(Error::BadAddress)
    );
    // A zero-length transfer touches no page.
    assert_eq!(
        call(&caller, &mut fake, write(1, 0, CALLER_HOLE, 0)),
        [0, 0, 0, 0]
    );
}

#[test]
fn registers_of_a_paused_vm() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let pc = VcpuRegister {
        vm: 1,
        vcpu: 1,
        reg: RegisterId::PC,
    };
    assert_eq!(
        call(&caller, &mut fake, Call::VcpuGetRegister(pc)),
        err(Error::BadState),
        "running"
    );
    assert_eq!(call(&caller, &mut fake, Call::VmPause { vm: 1 }), OK);
    assert_eq!(
        call(
            &caller,
            &mut fake,
            Call::VcpuSetRegister {
                reg: pc,
                value: 0x4008_0000
            }
        ),
        OK
    );
    assert_eq!(
        call(&caller, &mut fake, Call::VcpuGetRegister(pc)),
        [0, 0x4008_0000, 0, 0]
    );
    let vcpu9 = VcpuRegister { vcpu: 9, ..pc };
    assert_eq!(
        call(&caller, &mut fake, Call::VcpuGetRegister(vcpu9)),
        err(Error::NoSuchVcpu)
    );
    let unknown = VcpuRegister {
        reg: RegisterId::sysreg(0, 2, 0, 0).unwrap(),
        ..pc
    };
    assert_eq!(
        call(&caller, &mut fake, Call::VcpuGetRegister(unknown)),
        err(Error::InvalidParameters)
    );
    let get = u64::from(function::VCPU_GET_REGISTER);
    assert_eq!(
        call_regs(&caller, &mut fake, &[get, 1, 1, 31, 0, 0, 0, 0], true),
        err(Error::InvalidParameters),
        "no register 31"
    );
}

#[test]
fn memslot_errors_map_to_interface_errors() {
    let id = SlotId::new(1).unwrap();
    assert_eq!(
        memslot_error(MemslotError::NoSuchSlot(id)),
        Error::NoSuchSlot
    );
    assert_eq!(memslot_error(MemslotError::IdInUse(id)), Error::Conflict);
    assert_eq!(
        memslot_error(MemslotError::GuestOverlap { id, other: id }),
        Error::Conflict
    );
    assert_eq!(
        memslot_error(MemslotError::ReadOnlyChange(id)),
        Error::InvalidParameters
    );
    assert_eq!(memslot_error(MemslotError::WriterPinned), Error::Internal);
}

/// A model of the caller's memory for the translation property: pages of
/// the first 64 frames, present and writable by a bit pattern.
struct ModelMemory {
    present: u64,
    writable: u64,
}

impl CallerMemory for ModelMemory {
    fn page(&self, gfn: Gfn) -> Option<super::CallerPage> {
        let bit = 1u64.checked_shl(u32::try_from(gfn.0).ok()?)?;
        (self.present & bit != 0).then(|| super::CallerPage {
            // Pages in reverse host order, far apart.
            host: HostPhysAddr(0x1_0000_0000 - (gfn.0 + 1) * 0x10_0000),
            writable: self.writable & bit != 0,
        })
    }

    fn mark_written(&self, _gfn: Gfn) {}
}

proptest! {
    #[test]
    fn buffer_translation_matches_a_model(
        present: u64,
        writable: u64,
        start in 0u64..64 * 4096 + 100,
        len in 0u64..MAX_TRANSFER + 100,
        for_write: bool,
    ) {
        let memory = ModelMemory { present, writable };
        let access = if for_write { Access::Write } else { Access::Read };
        let result = Buffer::translate(&memory, start, len, access);
        if len > MAX_TRANSFER {
            prop_assert_eq!(result, Err(Error::InvalidParameters));
            return Ok(());
        }
        let pages = (start / PAGE..(start + len).div_ceil(PAGE)).collect::<Vec<_>>();
        let ok = pages.iter().all(|&p| {
            memory.page(Gfn(p)).is_some_and(|page| !for_write || page.writable)
        });
        match result {
            Err(e) => {
                prop_assert!(!ok);
                prop_assert_eq!(e, Error::BadAddress);
            }
            Ok(buffer) => {
                prop_assert!(ok);
                prop_assert!(buffer.spans().len() <= MAX_SPANS);
                prop_assert_eq!(buffer.len(), len);
                prop_assert_eq!(buffer.spans().len(), pages.len());
                let mut at = start;
                for (span, &p) in buffer.spans().iter().zip(&pages) {
                    prop_assert_eq!(span.gfn, Gfn(p));
                    prop_assert_eq!(span.host.0, memory.page(Gfn(p)).unwrap().host.0 + at % PAGE);
                    prop_assert!(at % PAGE + span.len <= PAGE);
                    at += span.len;
                }
            }
        }
    }

    #[test]
    fn random_registers_never_panic(
        function in prop_oneof![
            (0usize..Function::ALL.len()).prop_map(|i| u64::from(Function::ALL[i].id())),
            (0u64..0x40).prop_map(|f| 0xC600_0000 + f),
            any::<u64>(),
        ],
        args in proptest::array::uniform7(prop_oneof![
            0u64..4,
            Just(CALLER_RAM),
            Just(CALLER_SLOT1 - 8),
            0u64..0x2_0000,
            any::<u64>(),
        ]),
        control: bool,
    ) {
        let caller = CallerVm::new();
        let mut fake = Fake::new();
        let [a1, a2, a3, a4, a5, a6, a7] = args;
        let regs = [function, a1, a2, a3, a4, a5, a6, a7];
        let out = call_regs(&caller, &mut fake, &regs, control);
        let status = out[0] as i64;
        if !control {
            prop_assert_eq!(out, err(Error::NotSupported));
        } else if status < 0 {
            prop_assert!(Error::from_code(status).is_some());
            prop_assert_eq!(&out[1..], &[0, 0, 0]);
        } else if Function::from_x0(function) == Some(Function::CallUid) {
            prop_assert_eq!(out, function::UID.map(u64::from));
        }
    }
}

/// Caller memory that changes under the call: every page answers its first
/// lookup only, as if another control VM deleted the slot right after. A
/// dispatcher that looked a page up twice (check, then copy) would see the
/// change in the middle of one call.
struct VanishingMemory<'a> {
    inner: &'a MemslotSet,
    seen: std::cell::RefCell<Vec<Gfn>>,
}

impl CallerMemory for VanishingMemory<'_> {
    fn page(&self, gfn: Gfn) -> Option<super::CallerPage> {
        let mut seen = self.seen.borrow_mut();
        if seen.contains(&gfn) {
            return None;
        }
        seen.push(gfn);
        self.inner.page(gfn)
    }

    fn mark_written(&self, gfn: Gfn) {
        self.inner.mark_written(gfn);
    }
}

#[test]
fn a_call_translates_each_caller_page_once() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    for c in [
        read(1, 0xff0, CALLER_SLOT1 - 0x1020, 0x2020),
        write(1, 0x20_0000, CALLER_SLOT1 - 8, 16),
        Call::ListVms {
            buffer: CALLER_SLOT1 - 16,
            len: 96,
            first: 0,
        },
    ] {
        let out = caller.with(|set| {
            let memory = VanishingMemory {
                inner: set,
                seen: std::cell::RefCell::new(Vec::new()),
            };
            let who = Caller {
                vm: 0,
                control: true,
                memory: &memory,
            };
            dispatch(&who, &c.encode(), &mut fake)
        });
        assert_eq!(out[0], 0, "{c:?}");
    }
}

/// `VM_MIGRATE`'s 1.2 options reach the hypervisor: `x3` bit 0 asks for
/// the byte-for-byte check, `x4` the downtime limit (0: the default);
/// other `x3` bits are reserved.
#[test]
fn vm_migrate_carries_verify_and_the_downtime_limit() {
    let caller = CallerVm::new();
    let mut fake = Fake::new();
    let migrate = |verify, downtime_limit_us| Call::VmMigrate {
        src: 1,
        dst: 2,
        verify,
        downtime_limit_us,
    };
    assert_eq!(call(&caller, &mut fake, migrate(false, 0)), OK);
    assert_eq!(call(&caller, &mut fake, migrate(true, 5_000)), OK);
    assert_eq!(
        fake.migrations,
        [
            MigrationOptions::default(),
            MigrationOptions {
                verify: true,
                downtime_limit_us: 5_000
            }
        ]
    );
    assert_eq!(
        MigrationOptions::default().downtime_limit_us,
        DEFAULT_DOWNTIME_LIMIT_US
    );
    let mut regs = migrate(true, 0).encode();
    regs[3] = 0b10;
    assert_eq!(
        call_regs(&caller, &mut fake, &regs, true),
        err(Error::InvalidParameters)
    );
    assert_eq!(fake.migrations.len(), 2);
}
