//! The control dispatcher: one control call, from registers to registers.
//!
//! # Algorithm
//!
//! 1. A caller that is not a control VM gets `NOT_SUPPORTED` for every id,
//!    before anything is decoded (it cannot even learn the version).
//! 2. [`Call::decode`] checks the function id (`NOT_SUPPORTED` for ids of the
//!    range that name no function) and the shape of every argument
//!    (`INVALID_PARAMETERS`, reserved registers included).
//! 3. A call that names the caller itself is `DENIED`: a VM cannot pause,
//!    stop or change the slots of the VM that is executing the call, nor read
//!    its own registers while they are live; its own memory it reads directly.
//! 4. Arguments become the hypervisor's types (`SlotId`, `Gfn`, memslot
//!    flags); buffers are translated through the caller's memslots
//!    ([`crate::control::abi::buffer`]) before anything is copied.
//! 5. The [`ControlTarget`] does the work; its error, if any, is the result.
//!    Pages of the caller written by the hypervisor are then marked dirty.

use crate::vm::migration_plan::MigrationOptions;
use alloc::vec;
use alloc::vec::Vec;
use control_abi::reply::{self, Capabilities, ListVmsReply, Version};
use control_abi::vm_info::RECORD_SIZE;
use control_abi::{Call, Error, MAX_TRANSFER, MemoryTransfer, SlotRequest, function};
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, SlotFlags, SlotId};

use crate::control::abi::buffer::{Access, Buffer, CallerMemory};
use crate::control::abi::target::{ControlTarget, NewSlot, VmId};

/// The VM that issued the call.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a, M: CallerMemory + ?Sized> {
    /// Its id.
    pub vm: VmId,
    /// Whether its configuration marks it as a control VM.
    pub control: bool,
    /// Its memory, read through one stable view for the whole call.
    pub memory: &'a M,
}

/// Answers one control call: `regs` are the caller's `x0..x7`, the result is
/// its `x0..x3`. Never panics, whatever the registers.
pub fn dispatch<M: CallerMemory + ?Sized>(
    caller: &Caller<'_, M>,
    regs: &[u64; 8],
    target: &mut impl ControlTarget,
) -> [u64; 4] {
    if !caller.control {
        return reply::error(Error::NotSupported);
    }
    match run(caller, regs, target) {
        Ok(out) => out,
        Err(e) => reply::error(e),
    }
}

fn run<M: CallerMemory + ?Sized>(
    caller: &Caller<'_, M>,
    regs: &[u64; 8],
    target: &mut impl ControlTarget,
) -> Result<[u64; 4], Error> {
    let call = Call::decode(regs)?;
    if call.target_vm() == Some(caller.vm) {
        return Err(Error::Denied);
    }
    let done = reply::success(0, 0, 0);
    Ok(match call {
        Call::Version => Version::CURRENT.to_regs(),
        Call::CallUid => function::UID.map(u64::from),
        Call::Capabilities => Capabilities {
            bits: target.capabilities(),
            max_transfer: MAX_TRANSFER,
            record_size: RECORD_SIZE as u64,
        }
        .to_regs(),
        Call::ListVms { buffer, len, first } => {
            list_vms(caller.memory, buffer, len, first, target)?.to_regs()
        }
        Call::VmPause { vm } => target.pause(vm).map(|()| done)?,
        Call::VmResume { vm } => target.resume(vm).map(|()| done)?,
        Call::VmStop { vm } => target.stop(vm).map(|()| done)?,
        Call::SlotCreate(request) => target
            .create_slot(request.vm, new_slot(&request)?)
            .map(|()| done)?,
        Call::SlotDelete { vm, slot } => target.delete_slot(vm, slot_id(slot)?).map(|()| done)?,
        Call::SlotMove { vm, slot, base_ipa } => target
            .move_slot(vm, slot_id(slot)?, Gfn::from_ipa(base_ipa))
            .map(|()| done)?,
        Call::SlotSetFlags { vm, slot, flags } => target
            .set_slot_flags(vm, slot_id(slot)?, slot_flags(flags)?)
            .map(|()| done)?,
        Call::MemoryRead(t) => {
            let buffer = Buffer::translate(caller.memory, t.buffer, t.len, Access::Write)?;
            target.read_memory(t.vm, t.ipa, buffer.spans())?;
            buffer.mark_written(caller.memory);
            transferred(&t)
        }
        Call::MemoryWrite(t) => {
            let buffer = Buffer::translate(caller.memory, t.buffer, t.len, Access::Read)?;
            target.write_memory(t.vm, t.ipa, buffer.spans())?;
            transferred(&t)
        }
        Call::VcpuGetRegister(r) => {
            let value = target.get_register(r.vm, r.vcpu, r.reg)?;
            reply::success(value, 0, 0)
        }
        Call::VcpuSetRegister { reg: r, value } => target
            .set_register(r.vm, r.vcpu, r.reg, value)
            .map(|()| done)?,
        Call::DirtyLogGet(g) => {
            let buffer = Buffer::translate(caller.memory, g.buffer, g.len, Access::Write)?;
            let mut words = vec![0u64; (g.len / 8) as usize];
            let count = target.dirty_log_get(g.vm, slot_id(g.slot)?, &mut words)?;
            write_words(target, &buffer, &words);
            buffer.mark_written(caller.memory);
            reply::success(count, 0, 0)
        }
        Call::DirtyLogClear(c) => {
            // Read, then written back: the pages that were dirty.
            let buffer = Buffer::translate(caller.memory, c.buffer, c.len, Access::Write)?;
            let mut words = read_words(target, &buffer);
            let count = target.dirty_log_clear(c.vm, slot_id(c.slot)?, c.first_page, &mut words)?;
            write_words(target, &buffer, &words);
            buffer.mark_written(caller.memory);
            reply::success(count, 0, 0)
        }
        Call::VmMigrate {
            src,
            dst,
            verify,
            downtime_limit_us,
        } => {
            // Neither end may be the caller.
            if dst == caller.vm {
                return Err(Error::Denied);
            }
            let mut options = MigrationOptions {
                verify,
                ..MigrationOptions::default()
            };
            if downtime_limit_us != 0 {
                options.downtime_limit_us = downtime_limit_us;
            }
            target.migrate(src, dst, options).map(|()| done)?
        }
        Call::DirtyLogConfig {
            vm,
            mode,
            eager_chunk,
        } => target
            .dirty_log_config(vm, DirtyLogMode::from_bits(mode), eager_chunk)
            .map(|()| done)?,
    })
}

/// Writes `words` (little-endian) into the buffer's spans, in order.
fn write_words(target: &mut impl ControlTarget, buffer: &Buffer, words: &[u64]) {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut at = 0;
    for span in buffer.spans() {
        let len = span.len as usize;
        target.write_host(span.host, &bytes[at..at + len]);
        at += len;
    }
}

/// Reads the buffer's spans, in order, as little-endian words (the buffer
/// is a whole number of words).
fn read_words(target: &mut impl ControlTarget, buffer: &Buffer) -> Vec<u64> {
    let len: u64 = buffer.spans().iter().map(|span| span.len).sum();
    let mut bytes = vec![0u8; len as usize];
    let mut at = 0;
    for span in buffer.spans() {
        let len = span.len as usize;
        target.read_host(span.host, &mut bytes[at..at + len]);
        at += len;
    }
    bytes
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect()
}

fn transferred(t: &MemoryTransfer) -> [u64; 4] {
    reply::success(t.len, 0, 0)
}

fn slot_id(id: u32) -> Result<SlotId, Error> {
    SlotId::new(id).map_err(|_| Error::InvalidParameters)
}

fn slot_flags(flags: control_abi::SlotFlags) -> Result<SlotFlags, Error> {
    SlotFlags::from_bits(flags.bits()).map_err(|_| Error::InvalidParameters)
}

fn new_slot(request: &SlotRequest) -> Result<NewSlot, Error> {
    let base_gfn = Gfn::from_ipa(request.base_ipa);
    let end = base_gfn
        .0
        .checked_add(request.npages)
        .ok_or(Error::InvalidParameters)?;
    if request.npages == 0 || request.npages > memslot::MAX_SLOT_PAGES || end > memslot::GFN_LIMIT {
        return Err(Error::InvalidParameters);
    }
    Ok(NewSlot {
        id: slot_id(request.slot)?,
        base_gfn,
        npages: request.npages,
        flags: slot_flags(request.flags)?,
    })
}

/// `LIST_VMS`: the whole buffer is translated (writable) first; then as
/// many whole records as fit are written from VM index `first` on.
fn list_vms<M: CallerMemory + ?Sized>(
    memory: &M,
    buffer: u64,
    len: u64,
    first: u32,
    target: &mut impl ControlTarget,
) -> Result<ListVmsReply, Error> {
    let translated = Buffer::translate(memory, buffer, len, Access::Write)?;
    let total = target.vm_count();
    let room = usize::try_from(len).map_err(|_| Error::InvalidParameters)? / RECORD_SIZE;
    let first = usize::try_from(first).map_err(|_| Error::InvalidParameters)?;
    let mut written = 0usize;
    let mut cursor = SpanCursor::new(&translated);
    while written < room {
        let Some(info) = first
            .checked_add(written)
            .and_then(|index| target.vm_info(index))
        else {
            break;
        };
        cursor.write(&info.encode(), target)?;
        written += 1;
    }
    if written > 0 {
        translated.mark_written(memory);
    }
    Ok(ListVmsReply {
        written: written as u64,
        total: total as u64,
    })
}

/// Writes a byte stream across a translated buffer's spans.
struct SpanCursor<'a> {
    buffer: &'a Buffer,
    span: usize,
    offset: u64,
}

impl<'a> SpanCursor<'a> {
    fn new(buffer: &'a Buffer) -> Self {
        Self {
            buffer,
            span: 0,
            offset: 0,
        }
    }

    fn write(&mut self, mut bytes: &[u8], target: &mut impl ControlTarget) -> Result<(), Error> {
        while !bytes.is_empty() {
            let span = self.buffer.spans().get(self.span).ok_or(Error::Internal)?;
            let room = span.len - self.offset;
            let piece = bytes
                .len()
                .min(usize::try_from(room).map_err(|_| Error::Internal)?);
            let (now, rest) = bytes.split_at(piece);
            target.write_host(HostPhysAddr(span.host.0 + self.offset), now);
            bytes = rest;
            self.offset += piece as u64;
            if self.offset == span.len {
                self.span += 1;
                self.offset = 0;
            }
        }
        Ok(())
    }
}
