//! A scripted register bank for the UART drivers' host tests.
//!
//! Each register reads as the next value queued for it, then as its last
//! written or default value once the queue is empty; every access is recorded
//! in order, so a test can check what was written where and how often a
//! status register was polled before a write.

use super::RegisterBank;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// One register access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A read of the register, and what it returned.
    Read(usize, u32),
    /// A write of the value to the register.
    Write(usize, u32),
}

/// The mock bank.
#[derive(Default)]
pub struct MockBank {
    /// Values each register reads as next (by index).
    queued: Vec<VecDeque<u32>>,
    /// What each register reads as when nothing is queued.
    value: Vec<u32>,
    /// Every access, in order.
    pub log: Vec<Access>,
}

impl MockBank {
    /// A bank of 32 registers, all reading 0.
    pub fn new() -> Self {
        Self {
            queued: (0..32).map(|_| VecDeque::new()).collect(),
            value: alloc::vec![0; 32],
            log: Vec::new(),
        }
    }

    /// Register `index` reads as `value` when nothing is queued.
    pub fn set(&mut self, index: usize, value: u32) {
        self.value[index] = value;
    }

    /// Register `index` reads as each of `values`, in turn, first.
    pub fn queue(&mut self, index: usize, values: &[u32]) {
        self.queued[index].extend(values.iter().copied());
    }

    /// The writes, in order.
    pub fn writes(&self) -> Vec<(usize, u32)> {
        self.log
            .iter()
            .filter_map(|a| match *a {
                Access::Write(i, v) => Some((i, v)),
                Access::Read(..) => None,
            })
            .collect()
    }

    /// The values written to register `index`, in order.
    pub fn written_to(&self, index: usize) -> Vec<u32> {
        self.writes()
            .into_iter()
            .filter(|&(i, _)| i == index)
            .map(|(_, v)| v)
            .collect()
    }

    /// How many times register `index` was read.
    pub fn reads_of(&self, index: usize) -> usize {
        self.log
            .iter()
            .filter(|a| matches!(a, Access::Read(i, _) if *i == index))
            .count()
    }
}

impl RegisterBank for MockBank {
    fn read(&mut self, index: usize) -> u32 {
        let value = self.queued[index].pop_front().unwrap_or(self.value[index]);
        self.log.push(Access::Read(index, value));
        value
    }

    fn write(&mut self, index: usize, value: u32) {
        self.value[index] = value;
        self.log.push(Access::Write(index, value));
    }
}
