//! The power states of a VM's vCPUs: off, on pending (started, its CPU has
//! not entered it yet) and on, with the entry point each start publishes.
//!
//! # Algorithm
//!
//! Every state change is a compare-and-swap or a release store, so vCPUs
//! racing to start the same target see exactly one winner
//! ([`PowerStates::request_on`]); the request is published under its lock
//! before the state moves to on pending, so the target's physical CPU, which
//! takes it with [`PowerStates::take_pending`], never sees on pending without
//! the entry point and context id. PSCI (`crate::exit::psci`) answers the
//! guest from these states.

use core::sync::atomic::{AtomicU8, Ordering};
use spin::Mutex;

/// [`PowerStates::request_on`] refused: the vCPU is not off (it runs, or an
/// earlier request for it is still pending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotOff;

impl core::fmt::Display for NotOff {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the vCPU is on or already starting")
    }
}

impl core::error::Error for NotOff {}

/// The power state of one vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PowerState {
    /// Not running; CPU_ON may start it.
    Off = 0,
    /// CPU_ON succeeded; its physical CPU has not entered it yet.
    OnPending = 1,
    /// Running guest code.
    On = 2,
}

impl PowerState {
    fn from_raw(raw: u8) -> Self {
        match raw {
            0 => Self::Off,
            1 => Self::OnPending,
            _ => Self::On,
        }
    }

    /// The AFFINITY_INFO answer for this state (0 on, 1 off, 2 on pending).
    pub fn affinity_info(self) -> u64 {
        match self {
            Self::On => 0,
            Self::Off => 1,
            Self::OnPending => 2,
        }
    }
}

/// Where a vCPU starts: entry IPA and the value for `x0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootRequest {
    /// Entry IPA.
    pub entry: u64,
    /// Delivered in `x0`.
    pub context_id: u64,
}

/// The power states of a VM's vCPUs, indexed by vCPU number.
pub struct PowerStates {
    states: alloc::vec::Vec<AtomicU8>,
    requests: alloc::vec::Vec<Mutex<Option<BootRequest>>>,
}

impl PowerStates {
    /// A table for `vcpus` vCPUs, all off.
    pub fn new(vcpus: usize) -> Self {
        Self {
            states: (0..vcpus)
                .map(|_| AtomicU8::new(PowerState::Off as u8))
                .collect(),
            requests: (0..vcpus).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Number of vCPUs.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// True when the table has no vCPUs.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The current state of `vcpu`.
    pub fn state(&self, vcpu: usize) -> PowerState {
        PowerState::from_raw(self.states[vcpu].load(Ordering::Acquire))
    }

    /// CPU_ON: moves `vcpu` from off to on-pending with `request`; any other
    /// state (on, or on-pending for an earlier caller) is refused.
    pub fn request_on(&self, vcpu: usize, request: BootRequest) -> Result<(), NotOff> {
        // Publish the request before the state so the target never sees
        // ON_PENDING without it; the lock also orders racing callers.
        let mut slot = self.requests[vcpu].lock();
        match self.states[vcpu].compare_exchange(
            PowerState::Off as u8,
            PowerState::OnPending as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                *slot = Some(request);
                Ok(())
            }
            Err(_) => Err(NotOff),
        }
    }

    /// Called by the target's physical CPU: takes the pending request and marks
    /// the vCPU on. `None` while nothing is pending.
    pub fn take_pending(&self, vcpu: usize) -> Option<BootRequest> {
        if self.state(vcpu) != PowerState::OnPending {
            return None;
        }
        let mut slot = self.requests[vcpu].lock();
        let request = slot.take()?;
        self.states[vcpu].store(PowerState::On as u8, Ordering::Release);
        Some(request)
    }

    /// The request of `vcpu` while it is on-pending (`CPU_ON` issued, not yet
    /// taken), without taking it.
    pub fn pending_request(&self, vcpu: usize) -> Option<BootRequest> {
        let slot = self.requests[vcpu].lock();
        (self.state(vcpu) == PowerState::OnPending)
            .then_some(*slot)
            .flatten()
    }

    /// Marks `vcpu` on without a request (the boot vCPU).
    pub fn mark_on(&self, vcpu: usize) {
        self.states[vcpu].store(PowerState::On as u8, Ordering::Release);
    }

    /// Every vCPU off with no request pending, as at creation (a restart
    /// of the VM; no vCPU runs meanwhile).
    pub fn reset(&self) {
        for (state, request) in self.states.iter().zip(&self.requests) {
            *request.lock() = None;
            state.store(PowerState::Off as u8, Ordering::Release);
        }
    }

    /// CPU_OFF: marks `vcpu` off.
    pub fn mark_off(&self, vcpu: usize) {
        self.states[vcpu].store(PowerState::Off as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::sync::Arc;
    use alloc::vec::Vec;

    #[test]
    fn cpu_on_life_cycle() {
        let states = PowerStates::new(2);
        let request = BootRequest {
            entry: 0x1000,
            context_id: 9,
        };
        assert_eq!(states.take_pending(1), None);
        assert_eq!(states.request_on(1, request), Ok(()));
        assert_eq!(states.state(1).affinity_info(), 2);
        assert_eq!(states.request_on(1, request), Err(NotOff));
        assert_eq!(states.take_pending(1), Some(request));
        assert_eq!(states.state(1), PowerState::On);
        assert_eq!(states.request_on(1, request), Err(NotOff));
        states.mark_off(1);
        assert_eq!(states.state(1).affinity_info(), 1);
        assert_eq!(states.request_on(1, request), Ok(()));
    }

    #[test]
    fn racing_cpu_on_has_one_winner() {
        for _ in 0..50 {
            let states = Arc::new(PowerStates::new(1));
            let winners: usize = (0..4)
                .map(|i| {
                    let states = Arc::clone(&states);
                    std::thread::spawn(move || {
                        states
                            .request_on(
                                0,
                                BootRequest {
                                    entry: i,
                                    context_id: i,
                                },
                            )
                            .is_ok()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().expect("thread") as usize)
                .sum();
            assert_eq!(winners, 1);
            let taken = states.take_pending(0).expect("one request pending");
            assert_eq!(taken.entry, taken.context_id);
        }
    }
}
