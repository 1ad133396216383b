//! A scripted GIC for the driver's host tests: MMIO frames and system
//! registers that record every access, in order, in one log.
//!
//! Frames are addressed on one flat bus ([`MockFrame::at`] keeps the shared
//! log and adds to the base), so a test names registers by absolute address.
//! A register reads as the next value queued for it, then as its last written
//! or set value (0 by default).

use super::driver::{CpuRegister, CpuRegisters, GicFrame};
use alloc::collections::VecDeque;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::collections::HashMap;

/// One access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A 32-bit read at the address, and what it returned.
    Read32(usize, u32),
    /// A 32-bit write.
    Write32(usize, u32),
    /// A 64-bit read and what it returned.
    Read64(usize, u64),
    /// A 64-bit write.
    Write64(usize, u64),
    /// A byte write.
    Write8(usize, u8),
    /// A system register read and what it returned.
    ReadSys(CpuRegister, u64),
    /// A system register write.
    WriteSys(CpuRegister, u64),
    /// `ISB`.
    Isb,
    /// `DSB ISH`.
    DsbIsh,
}

/// What a register reads as: by address, or by system register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Mmio(usize),
    Sys(CpuRegister),
}

#[derive(Default)]
struct State {
    queued: HashMap<Key, VecDeque<u64>>,
    value: HashMap<Key, u64>,
    log: Vec<Access>,
}

impl State {
    fn read(&mut self, key: Key) -> u64 {
        if let Some(v) = self.queued.get_mut(&key).and_then(VecDeque::pop_front) {
            return v;
        }
        self.value.get(&key).copied().unwrap_or(0)
    }
}

/// The mock GIC: hands out frames and the CPU's registers over one log.
#[derive(Clone, Default)]
pub struct MockGic {
    state: Rc<RefCell<State>>,
}

impl MockGic {
    /// A GIC whose registers all read 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The frame at `base`.
    pub fn frame(&self, base: usize) -> MockFrame {
        MockFrame {
            base,
            gic: self.clone(),
        }
    }

    /// The CPU's system registers.
    pub fn cpu(&self) -> MockCpu {
        MockCpu { gic: self.clone() }
    }

    /// The register at `addr` reads as `value` when nothing is queued.
    pub fn set(&self, addr: usize, value: u64) {
        self.state.borrow_mut().value.insert(Key::Mmio(addr), value);
    }

    /// The register at `addr` reads as each of `values`, in turn, first.
    pub fn queue(&self, addr: usize, values: &[u64]) {
        let mut state = self.state.borrow_mut();
        let queue = state.queued.entry(Key::Mmio(addr)).or_default();
        queue.extend(values.iter().copied());
    }

    /// System register `register` reads as each of `values`, in turn.
    pub fn queue_sys(&self, register: CpuRegister, values: &[u64]) {
        let mut state = self.state.borrow_mut();
        let queue = state.queued.entry(Key::Sys(register)).or_default();
        queue.extend(values.iter().copied());
    }

    /// Every access so far, in order.
    pub fn log(&self) -> Vec<Access> {
        self.state.borrow().log.clone()
    }

    /// Forgets the accesses so far.
    pub fn clear_log(&self) {
        self.state.borrow_mut().log.clear();
    }

    fn read(&self, key: Key) -> u64 {
        self.state.borrow_mut().read(key)
    }

    fn write(&self, key: Key, value: u64, access: Access) {
        let mut state = self.state.borrow_mut();
        state.value.insert(key, value);
        state.log.push(access);
    }

    fn record(&self, access: Access) {
        self.state.borrow_mut().log.push(access);
    }
}

/// One frame of the mock GIC.
#[derive(Clone)]
pub struct MockFrame {
    base: usize,
    gic: MockGic,
}

impl GicFrame for MockFrame {
    fn read32(&self, offset: usize) -> u32 {
        let addr = self.base + offset;
        let value = self.gic.read(Key::Mmio(addr)) as u32;
        self.gic.record(Access::Read32(addr, value));
        value
    }

    fn write32(&self, offset: usize, value: u32) {
        let addr = self.base + offset;
        self.gic
            .write(Key::Mmio(addr), value.into(), Access::Write32(addr, value));
    }

    fn read64(&self, offset: usize) -> u64 {
        let addr = self.base + offset;
        let value = self.gic.read(Key::Mmio(addr));
        self.gic.record(Access::Read64(addr, value));
        value
    }

    fn write64(&self, offset: usize, value: u64) {
        let addr = self.base + offset;
        self.gic
            .write(Key::Mmio(addr), value, Access::Write64(addr, value));
    }

    fn write8(&self, offset: usize, value: u8) {
        let addr = self.base + offset;
        self.gic
            .write(Key::Mmio(addr), value.into(), Access::Write8(addr, value));
    }

    fn at(&self, offset: usize) -> Self {
        self.gic.frame(self.base + offset)
    }
}

/// The CPU's system registers of the mock GIC.
#[derive(Clone)]
pub struct MockCpu {
    gic: MockGic,
}

impl CpuRegisters for MockCpu {
    fn read(&self, register: CpuRegister) -> u64 {
        let value = self.gic.read(Key::Sys(register));
        self.gic.record(Access::ReadSys(register, value));
        value
    }

    fn write(&self, register: CpuRegister, value: u64) {
        self.gic
            .write(Key::Sys(register), value, Access::WriteSys(register, value));
    }

    fn isb(&self) {
        self.gic.record(Access::Isb);
    }

    fn dsb_ish(&self) {
        self.gic.record(Access::DsbIsh);
    }
}
