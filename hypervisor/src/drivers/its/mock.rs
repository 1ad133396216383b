//! A scripted ITS for the driver's host tests: MMIO frames, table memory
//! and an LPI pool that record every access, in order, in one log.
//!
//! Frames sit on one flat bus (a test names registers by absolute address).
//! A register reads as the next value queued for it, then as its last
//! written or set value (0 by default); while the ITS "follows", a write of
//! `GITS_CWRITER` makes `GITS_CREADR` read the same (the ITS ran every
//! command at once). Memory is a bump allocator over fake physical
//! addresses that remembers what is allocated, each byte written and the
//! commands, and can be told to run out.

use super::driver::{ItsMemory, LpiRuns};
use super::gits;
use crate::drivers::gic::driver::GicFrame;
use alloc::collections::VecDeque;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::collections::HashMap;

/// Where the ITS's frame is.
pub const ITS: usize = 0x0808_0000;
/// Where the bump allocator starts.
pub const RAM: u64 = 0x4000_0000;

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
    /// An allocation: address, size, alignment.
    Alloc(u64, u64, u64),
    /// A free: address, size, alignment.
    Free(u64, u64, u64),
    /// Zeroing: address, length.
    Zero(u64, u64),
    /// A fill: address, length, byte.
    Fill(u64, u64, u8),
    /// A command written at the address.
    Command(u64, [u64; 4]),
    /// A clean to the point of coherency: address, length.
    Clean(u64, u64),
    /// `DSB ISH`.
    DsbIsh,
}

#[derive(Default)]
struct State {
    queued: HashMap<usize, VecDeque<u64>>,
    value: HashMap<usize, u64>,
    log: Vec<Access>,
    /// `GITS_CREADR` follows `GITS_CWRITER`.
    follows: bool,
    /// The next free address.
    next: u64,
    /// Allocations left before `alloc` fails (`None`: no limit).
    allocs_left: Option<usize>,
    /// Live allocations: address to size.
    live: HashMap<u64, u64>,
    /// `GITS_CWRITER` when the log was last cleared.
    cwriter_at_clear: u64,
}

/// The mock ITS: hands out frames and memory over one log.
#[derive(Clone)]
pub struct MockIts {
    state: Rc<RefCell<State>>,
}

impl MockIts {
    /// An ITS whose registers all read 0 and that runs commands at once.
    pub fn new() -> Self {
        let state = State {
            follows: true,
            next: RAM,
            ..State::default()
        };
        Self {
            state: Rc::new(RefCell::new(state)),
        }
    }

    /// The frame at `base`.
    pub fn frame(&self, base: usize) -> MockFrame {
        MockFrame {
            base,
            its: self.clone(),
        }
    }

    /// The table memory.
    pub fn memory(&self) -> MockMemory {
        MockMemory { its: self.clone() }
    }

    /// The register at `addr` reads as `value` when nothing is queued.
    pub fn set(&self, addr: usize, value: u64) {
        self.state.borrow_mut().value.insert(addr, value);
    }

    /// The register at `addr` reads as each of `values`, in turn, first.
    pub fn queue(&self, addr: usize, values: &[u64]) {
        let mut state = self.state.borrow_mut();
        let queue = state.queued.entry(addr).or_default();
        queue.extend(values.iter().copied());
    }

    /// Whether `GITS_CREADR` follows `GITS_CWRITER` from now on.
    pub fn set_follows(&self, follows: bool) {
        self.state.borrow_mut().follows = follows;
    }

    /// `alloc` gives `count` more allocations, then fails.
    pub fn set_allocs_left(&self, count: usize) {
        self.state.borrow_mut().allocs_left = Some(count);
    }

    /// Live allocations.
    pub fn live(&self) -> usize {
        self.state.borrow().live.len()
    }

    /// Every access so far, in order.
    pub fn log(&self) -> Vec<Access> {
        self.state.borrow().log.clone()
    }

    /// Forgets the accesses so far.
    pub fn clear_log(&self) {
        let mut state = self.state.borrow_mut();
        state.log.clear();
        state.cwriter_at_clear = state
            .value
            .get(&(ITS + gits::CWRITER))
            .copied()
            .unwrap_or(0);
    }

    /// `GITS_CWRITER` as it was when the log starts.
    pub fn cwriter_at_clear(&self) -> u64 {
        self.state.borrow().cwriter_at_clear
    }

    fn read(&self, addr: usize) -> u64 {
        let mut state = self.state.borrow_mut();
        if let Some(v) = state.queued.get_mut(&addr).and_then(VecDeque::pop_front) {
            return v;
        }
        state.value.get(&addr).copied().unwrap_or(0)
    }

    fn write(&self, addr: usize, value: u64, access: Access) {
        let mut state = self.state.borrow_mut();
        state.value.insert(addr, value);
        if state.follows && addr == ITS + gits::CWRITER {
            state.value.insert(ITS + gits::CREADR, value);
        }
        state.log.push(access);
    }

    fn record(&self, access: Access) {
        self.state.borrow_mut().log.push(access);
    }

    /// Panics unless `[pa, pa + len)` is inside a live allocation.
    fn check_owned(&self, pa: u64, len: u64) {
        let state = self.state.borrow();
        let owned = state
            .live
            .iter()
            .any(|(&at, &size)| at <= pa && pa + len <= at + size.next_multiple_of(4096));
        assert!(owned, "{pa:#x}+{len:#x} is not allocated");
    }
}

/// One frame of the mock ITS.
#[derive(Clone)]
pub struct MockFrame {
    base: usize,
    its: MockIts,
}

impl GicFrame for MockFrame {
    fn read32(&self, offset: usize) -> u32 {
        let addr = self.base + offset;
        let value = self.its.read(addr) as u32;
        self.its.record(Access::Read32(addr, value));
        value
    }

    fn write32(&self, offset: usize, value: u32) {
        let addr = self.base + offset;
        self.its
            .write(addr, value.into(), Access::Write32(addr, value));
    }

    fn read64(&self, offset: usize) -> u64 {
        let addr = self.base + offset;
        let value = self.its.read(addr);
        self.its.record(Access::Read64(addr, value));
        value
    }

    fn write64(&self, offset: usize, value: u64) {
        let addr = self.base + offset;
        self.its.write(addr, value, Access::Write64(addr, value));
    }

    fn write8(&self, offset: usize, value: u8) {
        let addr = self.base + offset;
        self.its
            .write(addr, value.into(), Access::Write8(addr, value));
    }

    fn at(&self, offset: usize) -> Self {
        self.its.frame(self.base + offset)
    }
}

/// The mock ITS's table memory.
pub struct MockMemory {
    its: MockIts,
}

impl ItsMemory for MockMemory {
    fn alloc(&self, size: u64, align: u64) -> Option<u64> {
        let mut state = self.its.state.borrow_mut();
        if let Some(left) = state.allocs_left.as_mut() {
            if *left == 0 {
                return None;
            }
            *left -= 1;
        }
        let pa = state.next.next_multiple_of(align);
        state.next = pa + size.next_multiple_of(4096);
        state.live.insert(pa, size);
        state.log.push(Access::Alloc(pa, size, align));
        Some(pa)
    }

    fn free(&self, pa: u64, size: u64, align: u64) {
        let mut state = self.its.state.borrow_mut();
        assert_eq!(state.live.remove(&pa), Some(size), "free of {pa:#x}");
        state.log.push(Access::Free(pa, size, align));
    }

    unsafe fn zero(&self, pa: u64, len: u64) {
        self.its.check_owned(pa, len);
        self.its.record(Access::Zero(pa, len));
    }

    unsafe fn fill(&self, pa: u64, len: u64, byte: u8) {
        self.its.check_owned(pa, len);
        self.its.record(Access::Fill(pa, len, byte));
    }

    unsafe fn write_command(&self, pa: u64, command: &[u64; 4]) {
        self.its.check_owned(pa, 32);
        self.its.record(Access::Command(pa, *command));
    }

    fn clean(&self, pa: u64, len: u64) {
        self.its.record(Access::Clean(pa, len));
    }

    fn dsb_ish(&self) {
        self.its.record(Access::DsbIsh);
    }
}

/// A first-fit pool of LPIs from 8192, as `LpiPool` is.
pub struct MockPool {
    taken: Vec<bool>,
}

impl LpiRuns for MockPool {
    fn with_size(size: u32) -> Self {
        Self {
            taken: alloc::vec![false; size as usize],
        }
    }

    fn take(&mut self, count: u32) -> Option<u32> {
        let count = count as usize;
        let start = (0..=self.taken.len().checked_sub(count)?)
            .find(|&s| count > 0 && self.taken[s..s + count].iter().all(|&t| !t))?;
        self.taken[start..start + count].fill(true);
        Some(8192 + start as u32)
    }

    fn give_back(&mut self, first: u32, count: u32) {
        let start = (first - 8192) as usize;
        for t in &mut self.taken[start..start + count as usize] {
            assert!(*t, "LPI {} given back twice", 8192 + start);
            *t = false;
        }
    }
}
