//! Restarting one VM in place: who rebuilds it, and when.
//!
//! A VM restarts when its guest calls PSCI `SYSTEM_RESET` while other VMs
//! run, or when the console monitor's `restart VM` asks (for a running,
//! paused, stopped or powered-off VM alike). The VM is rebuilt where it
//! stands (`runtime::vm_instance`: guest RAM, stage 2, devices, power states) and its
//! vCPU 0 boots again; the other VMs never notice.
//!
//! # Protocol
//!
//! Rebuilding touches everything a vCPU touches, so it runs only while every
//! vCPU of the VM is *halted*: out of the guest, holding no lock, no memslot
//! pin and no stage-2 reader, waiting in `runtime::vcpu_cycle` for the restart. The
//! rebuild runs on one of the VM's own CPUs (the console monitor, which
//! asks from interrupt context with the console lock held, must not wait
//! for anything), chosen as follows:
//!
//! 1. A restart is *requested* ([`Lifecycle::request_restart`]): one atomic
//!    state moves from `None` to `Requested`; the VM is marked stopping
//!    and its vCPUs are kicked, so each leaves the guest or its wait.
//! 2. Each vCPU that sees the VM stopping *arrives* ([`Lifecycle::arrive`]):
//!    it reads the generation first, then counts itself halted, then waits
//!    for the generation to change.
//! 3. A halted vCPU that finds every vCPU halted and a restart requested
//!    *claims* the rebuild ([`Lifecycle::claim_rebuild`], a compare-and-swap
//!    from `Requested` to `Rebuilding`): exactly one wins. The last vCPU to
//!    arrive tries at once; the requester kicks every vCPU so that a VM
//!    whose vCPUs halted long ago (it had stopped) is claimed too.
//! 4. The winner rebuilds the VM and *finishes*
//!    ([`Lifecycle::finish`]): the halted count goes back to zero, the state
//!    to `None`, and the generation is bumped last (release), so a vCPU
//!    that sees the new generation sees the rebuilt VM. Every halted vCPU
//!    then goes back to waiting for `CPU_ON`, vCPU 0 with its boot request.
//!
//! The generation is read before the vCPU counts itself halted, and the
//! rebuild cannot start before every vCPU has counted itself: so every
//! waiter holds the old generation and none can miss the bump.
//!
//! # A stop during a restart
//!
//! A stop that arrives while a restart is requested or under way must not
//! be lost, nor race with the rebuild: [`Lifecycle::stop_after_restart`]
//! marks the restart (the state's `…ThenStop` variants, in the same
//! atomic byte), and [`Lifecycle::finish`] hands the mark to the rebuilder,
//! which then stops the fresh VM instead of booting it. A stop that finds
//! no restart pending is an ordinary stop.

use core::fmt;
use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

const NONE: u8 = 0;
const REQUESTED: u8 = 1;
const REQUESTED_THEN_STOP: u8 = 2;
const REBUILDING: u8 = 3;
const REBUILDING_THEN_STOP: u8 = 4;

/// Why a restart was not requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartError {
    /// A restart of this VM is requested or under way already.
    AlreadyRestarting,
}

impl fmt::Display for RestartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyRestarting => f.write_str("a restart of this VM is under way already"),
        }
    }
}

impl core::error::Error for RestartError {}

/// What the rebuilder does once the VM is rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRebuild {
    /// Boot vCPU 0.
    Boot,
    /// A stop arrived during the restart: stop the fresh VM.
    Stop,
}

/// One VM's restart state; see the module documentation.
#[derive(Debug)]
pub struct Lifecycle {
    restart: AtomicU8,
    halted: AtomicUsize,
    generation: AtomicU64,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// No restart requested, nobody halted, generation 0.
    pub const fn new() -> Self {
        Self {
            restart: AtomicU8::new(NONE),
            halted: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// Asks for a restart (step 1).
    pub fn request_restart(&self) -> Result<(), RestartError> {
        self.restart
            .compare_exchange(NONE, REQUESTED, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| RestartError::AlreadyRestarting)
    }

    /// Whether a restart is requested or under way.
    pub fn restart_pending(&self) -> bool {
        self.restart.load(Ordering::Acquire) != NONE
    }

    /// How many restarts have finished: changes once per rebuild.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A vCPU halts (step 2): returns the generation to wait on.
    pub fn arrive(&self) -> u64 {
        let generation = self.generation();
        self.halted.fetch_add(1, Ordering::AcqRel);
        generation
    }

    /// vCPUs halted now.
    pub fn halted(&self) -> usize {
        self.halted.load(Ordering::Acquire)
    }

    /// A halted vCPU of a VM of `vcpus` vCPUs tries to claim the rebuild
    /// (step 3): true for exactly one caller once all are halted and a
    /// restart is requested.
    pub fn claim_rebuild(&self, vcpus: usize) -> bool {
        if self.halted() != vcpus {
            return false;
        }
        [
            (REQUESTED, REBUILDING),
            (REQUESTED_THEN_STOP, REBUILDING_THEN_STOP),
        ]
        .into_iter()
        .any(|(from, to)| {
            self.restart
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// The rebuild is done (step 4): releases every halted vCPU and says
    /// what to do with the fresh VM.
    pub fn finish(&self) -> AfterRebuild {
        self.halted.store(0, Ordering::Release);
        let was = self.restart.swap(NONE, Ordering::AcqRel);
        debug_assert!(matches!(was, REBUILDING | REBUILDING_THEN_STOP));
        self.generation.fetch_add(1, Ordering::Release);
        if was == REBUILDING_THEN_STOP {
            AfterRebuild::Stop
        } else {
            AfterRebuild::Boot
        }
    }

    /// The rebuild failed: the restart is dropped, the vCPUs stay halted
    /// and the generation does not change (a later restart may try again).
    pub fn abandon(&self) {
        self.restart.store(NONE, Ordering::Release);
    }

    /// A stop arrives: if a restart is pending, marks it to end in a stop
    /// and returns true (the rebuilder carries the stop out); false when no
    /// restart is pending (an ordinary stop).
    pub fn stop_after_restart(&self) -> bool {
        let mut now = self.restart.load(Ordering::Acquire);
        loop {
            let marked = match now {
                REQUESTED => REQUESTED_THEN_STOP,
                REBUILDING => REBUILDING_THEN_STOP,
                REQUESTED_THEN_STOP | REBUILDING_THEN_STOP => return true,
                _ => return false,
            };
            match self
                .restart
                .compare_exchange(now, marked, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(seen) => now = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::vec::Vec;

    #[test]
    fn one_restart_at_a_time() {
        let life = Lifecycle::new();
        assert!(!life.restart_pending());
        life.request_restart().unwrap();
        assert!(life.restart_pending());
        assert_eq!(life.request_restart(), Err(RestartError::AlreadyRestarting));
    }

    #[test]
    fn no_claim_until_every_vcpu_is_halted() {
        let life = Lifecycle::new();
        life.request_restart().unwrap();
        assert_eq!(life.arrive(), 0);
        assert!(!life.claim_rebuild(2));
        assert_eq!(life.arrive(), 0);
        assert!(life.claim_rebuild(2));
        // Claimed once only.
        assert!(!life.claim_rebuild(2));
        assert_eq!(life.finish(), AfterRebuild::Boot);
        assert_eq!(life.generation(), 1);
        assert_eq!(life.halted(), 0);
        assert!(!life.restart_pending());
    }

    #[test]
    fn no_claim_without_a_request() {
        let life = Lifecycle::new();
        life.arrive();
        assert!(!life.claim_rebuild(1));
    }

    #[test]
    fn a_stop_during_a_restart_ends_it_in_a_stop() {
        for claim_first in [false, true] {
            let life = Lifecycle::new();
            assert!(!life.stop_after_restart(), "nothing pending: ordinary stop");
            life.request_restart().unwrap();
            life.arrive();
            if claim_first {
                assert!(life.claim_rebuild(1));
            }
            assert!(life.stop_after_restart());
            assert!(life.stop_after_restart(), "marked twice is still marked");
            if !claim_first {
                assert!(life.claim_rebuild(1));
            }
            assert_eq!(life.finish(), AfterRebuild::Stop);
            assert!(!life.stop_after_restart());
        }
    }

    #[test]
    fn an_abandoned_restart_can_be_asked_again() {
        let life = Lifecycle::new();
        life.request_restart().unwrap();
        life.arrive();
        assert!(life.claim_rebuild(1));
        life.abandon();
        assert_eq!(life.generation(), 0);
        life.request_restart().unwrap();
        assert!(life.claim_rebuild(1));
    }

    /// Threads play vCPUs: each halts, the one that claims rebuilds (counts
    /// a rebuild while checking that nobody else is released), the others
    /// wait for the generation. Exactly one rebuild per restart, every vCPU
    /// released, over many rounds. A thread that panics raises `failed`,
    /// which every waiting loop checks, so a failed check ends all threads
    /// instead of leaving them waiting for the one that died.
    #[test]
    fn exactly_one_rebuilder_and_every_vcpu_released() {
        const VCPUS: usize = 4;
        const ROUNDS: u64 = 200;
        /// Raises the flag if its thread unwinds.
        struct RaiseOnPanic(Arc<AtomicBool>);
        impl Drop for RaiseOnPanic {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
        }
        let life = Arc::new(Lifecycle::new());
        let rebuilds = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..VCPUS)
            .map(|_| {
                let (life, rebuilds, released) = (life.clone(), rebuilds.clone(), released.clone());
                let failed = failed.clone();
                std::thread::spawn(move || {
                    let _raise = RaiseOnPanic(failed.clone());
                    let other_failed = || {
                        assert!(!failed.load(Ordering::SeqCst), "another vCPU thread failed");
                    };
                    for round in 0..ROUNDS {
                        // Every vCPU asks; only one request is taken.
                        let _ = life.request_restart();
                        let generation = life.arrive();
                        assert_eq!(generation, round);
                        loop {
                            if life.generation() != generation {
                                break;
                            }
                            if life.claim_rebuild(VCPUS) {
                                // Everyone is halted and nobody released yet.
                                assert_eq!(released.load(Ordering::SeqCst), round as usize * VCPUS);
                                rebuilds.fetch_add(1, Ordering::SeqCst);
                                life.finish();
                                break;
                            }
                            other_failed();
                            std::thread::yield_now();
                        }
                        released.fetch_add(1, Ordering::SeqCst);
                        // Wait for the others before the next round, as
                        // vCPUs of a running VM would.
                        while released.load(Ordering::SeqCst) < (round as usize + 1) * VCPUS {
                            other_failed();
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(rebuilds.load(Ordering::SeqCst), ROUNDS as usize);
        assert_eq!(life.generation(), ROUNDS);
    }
}
