//! A VM's run state as the hypervisor console's monitor changes it: running,
//! paused, or asked to stop.
//!
//! # Protocol
//!
//! One atomic byte per VM. The monitor (any CPU) moves it with
//! [`RunState::request_pause`], [`RunState::resume`] and
//! [`RunState::request_stop`], each a compare-and-swap from the states it
//! is allowed from, and then kicks the VM's vCPUs; none waits. Each vCPU
//! reads it with [`RunState::get`] before every guest entry (and while it
//! is off): `Paused` makes it wait at EL2 (still handling its host
//! interrupts) until the state moves on; `StopRequested` makes it stop the
//! VM as a [`crate::exit::flow::StopReason::StopRequested`], which the VM's
//! own CPU carries out (report, console flush, CPUs halted). The state
//! leaves `StopRequested` only when the VM restarts ([`RunState::reset`]). A VM that ends by itself (power-off, a
//! stop for an exit) is `Stopped` through its own stopping flag, which the
//! machine layer combines with this state for the monitor.
//!
//! # Waiting for a pause
//!
//! The control interface's `VM_PAUSE` returns only once no vCPU of the VM
//! runs guest code. Each vCPU announces an entry with [`RunState::enter`]
//! (count up, then read the state; if it is no longer running, count down
//! and do not enter) and its exit with [`RunState::leave`]; the pauser
//! stores `Paused`, kicks every vCPU and waits until
//! [`RunState::in_guest`] reads zero. All four accesses are sequentially
//! consistent, so either the vCPU's read sees `Paused`, or the pauser's
//! read of the count sees the vCPU in the guest, and waits for the exit its
//! kick forces.

use core::fmt;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// What the monitor asked of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    /// Run.
    Running,
    /// Hold every vCPU at EL2.
    Paused,
    /// Stop for good.
    StopRequested,
}

impl Requested {
    const fn code(self) -> u8 {
        match self {
            Self::Running => 0,
            Self::Paused => 1,
            Self::StopRequested => 2,
        }
    }

    const fn from_code(code: u8) -> Self {
        match code {
            0 => Self::Running,
            1 => Self::Paused,
            _ => Self::StopRequested,
        }
    }
}

/// Why a change of run state was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStateError {
    /// `pause` of a VM that is not running.
    NotRunning(Requested),
    /// `resume` of a VM that is not paused.
    NotPaused(Requested),
    /// The VM is stopping or stopped already.
    Stopped,
}

impl fmt::Display for RunStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRunning(state) => write!(f, "the VM is not running ({})", name(*state)),
            Self::NotPaused(state) => write!(f, "the VM is not paused ({})", name(*state)),
            Self::Stopped => write!(f, "the VM is stopped"),
        }
    }
}

impl core::error::Error for RunStateError {}

fn name(state: Requested) -> &'static str {
    match state {
        Requested::Running => "running",
        Requested::Paused => "paused",
        Requested::StopRequested => "stopped",
    }
}

/// One VM's run state; see the module documentation.
#[derive(Debug)]
pub struct RunState {
    state: AtomicU8,
    in_guest: AtomicUsize,
}

impl Default for RunState {
    fn default() -> Self {
        Self::new()
    }
}

impl RunState {
    /// A running VM.
    pub const fn new() -> Self {
        Self {
            state: AtomicU8::new(Requested::Running.code()),
            in_guest: AtomicUsize::new(0),
        }
    }

    /// Running again, as at creation: a restart of the VM (no vCPU is in
    /// the guest meanwhile).
    pub fn reset(&self) {
        debug_assert_eq!(self.in_guest(), 0);
        self.state
            .store(Requested::Running.code(), Ordering::SeqCst);
    }

    /// The state now.
    pub fn get(&self) -> Requested {
        Requested::from_code(self.state.load(Ordering::SeqCst))
    }

    /// A vCPU is about to enter the guest: counts it in and says whether it
    /// may (the VM is running); when it may not, it is counted out again.
    pub fn enter(&self) -> bool {
        self.in_guest.fetch_add(1, Ordering::SeqCst);
        if self.get() == Requested::Running {
            true
        } else {
            self.leave();
            false
        }
    }

    /// A vCPU that [`RunState::enter`] let in has left the guest.
    pub fn leave(&self) {
        self.in_guest.fetch_sub(1, Ordering::SeqCst);
    }

    /// vCPUs in the guest (or about to enter it).
    pub fn in_guest(&self) -> usize {
        self.in_guest.load(Ordering::SeqCst)
    }

    fn swap(&self, from: Requested, to: Requested) -> Result<(), Requested> {
        self.state
            .compare_exchange(from.code(), to.code(), Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
            .map_err(Requested::from_code)
    }

    /// Running to paused.
    pub fn request_pause(&self) -> Result<(), RunStateError> {
        self.swap(Requested::Running, Requested::Paused)
            .map_err(|now| match now {
                Requested::StopRequested => RunStateError::Stopped,
                other => RunStateError::NotRunning(other),
            })
    }

    /// Paused to running.
    pub fn resume(&self) -> Result<(), RunStateError> {
        self.swap(Requested::Paused, Requested::Running)
            .map_err(|now| match now {
                Requested::StopRequested => RunStateError::Stopped,
                other => RunStateError::NotPaused(other),
            })
    }

    /// Running or paused to stop requested.
    pub fn request_stop(&self) -> Result<(), RunStateError> {
        let mut now = self.get();
        loop {
            if now == Requested::StopRequested {
                return Err(RunStateError::Stopped);
            }
            match self.swap(now, Requested::StopRequested) {
                Ok(()) => return Ok(()),
                Err(seen) => now = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pause_resume_stop() {
        let state = RunState::new();
        assert_eq!(state.get(), Requested::Running);
        assert_eq!(
            state.resume(),
            Err(RunStateError::NotPaused(Requested::Running))
        );
        state.request_pause().unwrap();
        assert_eq!(state.get(), Requested::Paused);
        assert_eq!(
            state.request_pause(),
            Err(RunStateError::NotRunning(Requested::Paused))
        );
        state.resume().unwrap();
        assert_eq!(state.get(), Requested::Running);
        state.request_pause().unwrap();
        state.request_stop().unwrap();
        assert_eq!(state.get(), Requested::StopRequested);
        assert_eq!(state.request_stop(), Err(RunStateError::Stopped));
        assert_eq!(state.resume(), Err(RunStateError::Stopped));
        assert_eq!(state.request_pause(), Err(RunStateError::Stopped));
        assert_eq!(RunStateError::Stopped.to_string(), "the VM is stopped");
    }

    #[test]
    fn entries_are_refused_while_paused() {
        let state = RunState::new();
        assert!(state.enter());
        assert_eq!(state.in_guest(), 1);
        state.request_pause().unwrap();
        assert!(!state.enter(), "no entry while paused");
        assert_eq!(state.in_guest(), 1, "the refused entry is counted out");
        state.leave();
        assert_eq!(state.in_guest(), 0);
        state.resume().unwrap();
        assert!(state.enter());
        state.leave();
    }

    /// The model: what each call must do from each state.
    fn model(state: Requested, op: u8) -> (Requested, bool) {
        match (op, state) {
            (0, Requested::Running) => (Requested::Paused, true),
            (1, Requested::Paused) => (Requested::Running, true),
            (2, Requested::Running | Requested::Paused) => (Requested::StopRequested, true),
            _ => (state, false),
        }
    }

    proptest! {
        #[test]
        fn follows_the_model(ops in proptest::collection::vec(0u8..3, 0..40)) {
            let state = RunState::new();
            let mut expected = Requested::Running;
            for op in ops {
                let done = match op {
                    0 => state.request_pause(),
                    1 => state.resume(),
                    _ => state.request_stop(),
                }
                .is_ok();
                let (next, ok) = model(expected, op);
                prop_assert_eq!(done, ok);
                expected = next;
                prop_assert_eq!(state.get(), expected);
            }
        }
    }
}
