//! PSCI as the hypervisor offers it to guests, and the vCPU power states behind it.
//!
//! [`PsciCall::decode`] turns the function id in `x0` and the arguments in
//! `x1..x3` into a call; [`dispatch`] decides its outcome for a VM.
//! [`PowerStates`] is the per-VM table of vCPU power
//! states that `CPU_ON`, `CPU_OFF` and `AFFINITY_INFO` act on: every state change
//! is a compare-and-swap, so two vCPUs racing to start the same target see
//! exactly one `SUCCESS`, and the target's physical CPU picks up the entry point
//! and context id published with the on-pending state.
//!
//! `CPU_ON` answers as KVM does: `SUCCESS` to the one call that moved the
//! target from off to on-pending, `ALREADY_ON` to every other call for a
//! target that is not off, whether it is already running or an earlier
//! `CPU_ON` for it is still in flight. PSCI's `ON_PENDING` return code is
//! never used (guests written against KVM accept only `SUCCESS` or
//! `ALREADY_ON`); `AFFINITY_INFO` still reports the on-pending state (2).

use crate::platform::ranges::PhysRange;
use crate::vm::layout::vcpu_index;
use core::sync::atomic::{AtomicU8, Ordering};
use spin::Mutex;

/// PSCI_VERSION.
pub const PSCI_VERSION: u32 = 0x8400_0000;
/// CPU_OFF.
pub const PSCI_CPU_OFF: u32 = 0x8400_0002;
/// CPU_ON (SMC64).
pub const PSCI_CPU_ON: u32 = 0xC400_0003;
/// AFFINITY_INFO (SMC64).
pub const PSCI_AFFINITY_INFO: u32 = 0xC400_0004;
/// MIGRATE_INFO_TYPE.
pub const PSCI_MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
/// SYSTEM_OFF.
pub const PSCI_SYSTEM_OFF: u32 = 0x8400_0008;
/// SYSTEM_RESET.
pub const PSCI_SYSTEM_RESET: u32 = 0x8400_0009;
/// PSCI_FEATURES.
pub const PSCI_FEATURES: u32 = 0x8400_000A;

/// The PSCI version offered: 1.1.
pub const VERSION_1_1: u64 = 0x0001_0001;
/// MIGRATE_INFO_TYPE answer: a trusted OS is not present or needs no migration.
pub const MIGRATE_TYPE_NOT_PRESENT: u64 = 2;

/// PSCI return codes, as the guest sees them in `x0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum PsciError {
    /// The function is not implemented.
    NotSupported = -1,
    /// An argument is invalid (for example an unknown target MPIDR).
    InvalidParameters = -2,
    /// The target vCPU is already on, or an earlier `CPU_ON` for it is still
    /// in flight (as KVM answers; PSCI's `ON_PENDING` is never returned).
    AlreadyOn = -4,
    /// The entry point is not a valid guest address.
    InvalidAddress = -9,
}

impl core::fmt::Display for PsciError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::NotSupported => "NOT_SUPPORTED",
            Self::InvalidParameters => "INVALID_PARAMETERS",
            Self::AlreadyOn => "ALREADY_ON",
            Self::InvalidAddress => "INVALID_ADDRESS",
        })
    }
}

impl core::error::Error for PsciError {}

impl PsciError {
    /// The value as written to a 64-bit register (sign-extended).
    pub fn to_register(self) -> u64 {
        self as i32 as i64 as u64
    }
}

/// A decoded PSCI call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsciCall {
    /// PSCI_VERSION.
    Version,
    /// PSCI_FEATURES for the given function id.
    Features {
        /// The function asked about.
        function_id: u32,
    },
    /// CPU_ON.
    CpuOn {
        /// MPIDR of the vCPU to start.
        target_mpidr: u64,
        /// Entry IPA.
        entry: u64,
        /// Delivered to the target in `x0`.
        context_id: u64,
    },
    /// CPU_OFF.
    CpuOff,
    /// AFFINITY_INFO.
    AffinityInfo {
        /// MPIDR of the vCPU asked about.
        target_mpidr: u64,
        /// Lowest affinity level; only 0 is supported.
        lowest_level: u64,
    },
    /// MIGRATE_INFO_TYPE.
    MigrateInfoType,
    /// SYSTEM_OFF.
    SystemOff,
    /// SYSTEM_RESET.
    SystemReset,
}

impl PsciCall {
    /// The PSCI functions the hypervisor implements, in id order.
    pub const IMPLEMENTED: [u32; 8] = [
        PSCI_VERSION,
        PSCI_CPU_OFF,
        PSCI_MIGRATE_INFO_TYPE,
        PSCI_SYSTEM_OFF,
        PSCI_SYSTEM_RESET,
        PSCI_FEATURES,
        PSCI_CPU_ON,
        PSCI_AFFINITY_INFO,
    ];

    /// Decodes a PSCI call from the function id and `x1..x3`; `None` when the
    /// id is not one of the implemented PSCI functions.
    pub fn decode(function_id: u32, args: [u64; 3]) -> Option<Self> {
        Some(match function_id {
            PSCI_VERSION => Self::Version,
            PSCI_FEATURES => Self::Features {
                function_id: args[0] as u32,
            },
            PSCI_CPU_ON => Self::CpuOn {
                target_mpidr: args[0],
                entry: args[1],
                context_id: args[2],
            },
            PSCI_CPU_OFF => Self::CpuOff,
            PSCI_AFFINITY_INFO => Self::AffinityInfo {
                target_mpidr: args[0],
                lowest_level: args[1],
            },
            PSCI_MIGRATE_INFO_TYPE => Self::MigrateInfoType,
            PSCI_SYSTEM_OFF => Self::SystemOff,
            PSCI_SYSTEM_RESET => Self::SystemReset,
            _ => return None,
        })
    }
}

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
    /// state (on, or on-pending for an earlier caller) is `ALREADY_ON`.
    pub fn request_on(&self, vcpu: usize, request: BootRequest) -> Result<(), PsciError> {
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
            Err(_) => Err(PsciError::AlreadyOn),
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

    /// Marks `vcpu` on without a request (the boot vCPU).
    pub fn mark_on(&self, vcpu: usize) {
        self.states[vcpu].store(PowerState::On as u8, Ordering::Release);
    }

    /// CPU_OFF: marks `vcpu` off.
    pub fn mark_off(&self, vcpu: usize) {
        self.states[vcpu].store(PowerState::Off as u8, Ordering::Release);
    }
}

/// What a PSCI call does, as decided by [`dispatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsciOutcome {
    /// Resume the caller with this value in `x0`.
    Return(u64),
    /// CPU_ON succeeded for vCPU `.0`: wake its physical CPU, return SUCCESS.
    Started(usize),
    /// The caller turned itself off (already marked off).
    CpuOff,
    /// Power the system off.
    SystemOff,
    /// Reset the system.
    SystemReset,
}

/// Decides the outcome of `call` from vCPU `caller` of a VM whose vCPU power
/// states are `power` and whose RAM (valid entry points) is `ram`.
pub fn dispatch(call: PsciCall, caller: usize, power: &PowerStates, ram: PhysRange) -> PsciOutcome {
    let vcpus = power.len();
    let value = match call {
        PsciCall::Version => VERSION_1_1,
        PsciCall::Features { function_id } => {
            if crate::exit::hypercall::GuestCall::is_implemented(function_id) {
                0
            } else {
                PsciError::NotSupported.to_register()
            }
        }
        PsciCall::CpuOn {
            target_mpidr,
            entry,
            context_id,
        } => match vcpu_index(target_mpidr, vcpus) {
            None => PsciError::InvalidParameters.to_register(),
            Some(_) if !ram.contains(entry) => PsciError::InvalidAddress.to_register(),
            Some(target) => match power.request_on(target, BootRequest { entry, context_id }) {
                Ok(()) => return PsciOutcome::Started(target),
                Err(e) => e.to_register(),
            },
        },
        PsciCall::CpuOff => {
            power.mark_off(caller);
            return PsciOutcome::CpuOff;
        }
        PsciCall::AffinityInfo {
            target_mpidr,
            lowest_level,
        } => match vcpu_index(target_mpidr, vcpus) {
            Some(target) if lowest_level == 0 => power.state(target).affinity_info(),
            _ => PsciError::InvalidParameters.to_register(),
        },
        PsciCall::MigrateInfoType => MIGRATE_TYPE_NOT_PRESENT,
        PsciCall::SystemOff => return PsciOutcome::SystemOff,
        PsciCall::SystemReset => return PsciOutcome::SystemReset,
    };
    PsciOutcome::Return(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::layout::vcpu_mpidr;
    use std::sync::Arc;

    fn err(e: PsciError) -> PsciOutcome {
        PsciOutcome::Return(e.to_register())
    }

    #[test]
    fn dispatch_outcomes() {
        let ram = PhysRange::from_start_size(0x4000_0000, 0x800_0000);
        let power = PowerStates::new(2);
        power.mark_on(0);
        let on = |mpidr, entry| PsciCall::CpuOn {
            target_mpidr: mpidr,
            entry,
            context_id: 5,
        };
        let info = |mpidr, level| PsciCall::AffinityInfo {
            target_mpidr: mpidr,
            lowest_level: level,
        };
        assert_eq!(
            dispatch(PsciCall::Version, 0, &power, ram),
            PsciOutcome::Return(0x10001)
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(2), 0x4000_0000), 0, &power, ram),
            err(PsciError::InvalidParameters)
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(1), 0x1000), 0, &power, ram),
            err(PsciError::InvalidAddress)
        );
        assert_eq!(
            dispatch(info(vcpu_mpidr(1), 0), 0, &power, ram),
            PsciOutcome::Return(1)
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(1), 0x4008_0000), 0, &power, ram),
            PsciOutcome::Started(1)
        );
        assert_eq!(
            dispatch(info(vcpu_mpidr(1), 0), 0, &power, ram),
            PsciOutcome::Return(2)
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(1), 0x4008_0000), 0, &power, ram),
            err(PsciError::AlreadyOn),
            "a CPU_ON still in flight answers ALREADY_ON, as KVM does"
        );
        assert_eq!(
            power.take_pending(1),
            Some(BootRequest {
                entry: 0x4008_0000,
                context_id: 5
            })
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(1), 0x4008_0000), 0, &power, ram),
            err(PsciError::AlreadyOn)
        );
        assert_eq!(
            dispatch(on(vcpu_mpidr(0), 0x4008_0000), 1, &power, ram),
            err(PsciError::AlreadyOn)
        );
        assert_eq!(
            dispatch(info(vcpu_mpidr(1), 0), 0, &power, ram),
            PsciOutcome::Return(0)
        );
        assert_eq!(
            dispatch(info(vcpu_mpidr(1), 1), 0, &power, ram),
            err(PsciError::InvalidParameters)
        );
        assert_eq!(
            dispatch(PsciCall::CpuOff, 1, &power, ram),
            PsciOutcome::CpuOff
        );
        assert_eq!(power.state(1), PowerState::Off);
        assert_eq!(
            dispatch(
                PsciCall::Features {
                    function_id: PSCI_CPU_ON
                },
                0,
                &power,
                ram
            ),
            PsciOutcome::Return(0)
        );
        assert_eq!(
            dispatch(
                PsciCall::Features {
                    function_id: 0x8400_0001
                },
                0,
                &power,
                ram
            ),
            err(PsciError::NotSupported)
        );
        assert_eq!(
            dispatch(PsciCall::MigrateInfoType, 0, &power, ram),
            PsciOutcome::Return(2)
        );
        assert_eq!(
            dispatch(PsciCall::SystemOff, 0, &power, ram),
            PsciOutcome::SystemOff
        );
        assert_eq!(
            dispatch(PsciCall::SystemReset, 0, &power, ram),
            PsciOutcome::SystemReset
        );
    }

    #[test]
    fn decode_calls() {
        assert_eq!(
            PsciCall::decode(PSCI_VERSION, [0; 3]),
            Some(PsciCall::Version)
        );
        assert_eq!(
            PsciCall::decode(PSCI_CPU_ON, [0x8000_0001, 0x4008_0000, 7]),
            Some(PsciCall::CpuOn {
                target_mpidr: 0x8000_0001,
                entry: 0x4008_0000,
                context_id: 7
            })
        );
        assert_eq!(
            PsciCall::decode(0x8400_0001, [0; 3]),
            None,
            "CPU_SUSPEND is not offered"
        );
        assert_eq!(
            PsciCall::decode(0x8400_0003, [0; 3]),
            None,
            "only the SMC64 CPU_ON"
        );
        for id in PsciCall::IMPLEMENTED {
            assert!(PsciCall::decode(id, [0; 3]).is_some());
        }
    }

    #[test]
    fn error_codes_are_sign_extended() {
        assert_eq!(PsciError::NotSupported.to_register(), u64::MAX);
        assert_eq!(PsciError::InvalidAddress.to_register() as i64, -9);
    }

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
        assert_eq!(states.request_on(1, request), Err(PsciError::AlreadyOn));
        assert_eq!(states.take_pending(1), Some(request));
        assert_eq!(states.state(1), PowerState::On);
        assert_eq!(states.request_on(1, request), Err(PsciError::AlreadyOn));
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

    /// Several vCPUs call `CPU_ON` for the same off target at once, round
    /// after round (the target is taken and turned off again in between):
    /// each round has exactly one `SUCCESS` and `ALREADY_ON` for every other
    /// caller, never `ON_PENDING`.
    #[test]
    fn racing_cpu_on_through_dispatch_answers_already_on_to_the_losers() {
        const CALLERS: usize = 4;
        let ram = PhysRange::from_start_size(0x4000_0000, 0x800_0000);
        let power = Arc::new(PowerStates::new(CALLERS + 1));
        let target = CALLERS;
        for round in 0..200 {
            let start = Arc::new(std::sync::Barrier::new(CALLERS));
            let outcomes: Vec<PsciOutcome> = (0..CALLERS)
                .map(|caller| {
                    let power = Arc::clone(&power);
                    let start = Arc::clone(&start);
                    std::thread::spawn(move || {
                        start.wait();
                        let call = PsciCall::CpuOn {
                            target_mpidr: vcpu_mpidr(target),
                            entry: 0x4008_0000,
                            context_id: caller as u64,
                        };
                        dispatch(call, caller, &power, ram)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().expect("caller thread"))
                .collect();
            let started = outcomes
                .iter()
                .filter(|o| **o == PsciOutcome::Started(target))
                .count();
            let already_on = outcomes
                .iter()
                .filter(|o| **o == err(PsciError::AlreadyOn))
                .count();
            assert_eq!(
                (started, already_on),
                (1, CALLERS - 1),
                "round {round}: {outcomes:?}"
            );
            assert!(power.take_pending(target).is_some());
            assert_eq!(
                dispatch(PsciCall::CpuOff, target, &power, ram),
                PsciOutcome::CpuOff
            );
        }
    }

    /// One step of a vCPU-power interleaving for the property test.
    #[derive(Clone, Copy, Debug)]
    enum PowerStep {
        /// A vCPU calls `CPU_ON` for the target.
        CpuOn,
        /// The target's physical CPU takes its pending request.
        TakePending,
        /// The target calls `CPU_OFF` (only while it runs).
        CpuOff,
    }

    proptest::proptest! {
        /// In any order of `CPU_ON` calls, the target's CPU picking them up
        /// and `CPU_OFF`, a `CPU_ON` answers `SUCCESS` exactly when the target
        /// was off and `ALREADY_ON` otherwise.
        #[test]
        fn cpu_on_answers_success_only_from_off(
            steps in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(PowerStep::CpuOn),
                    proptest::strategy::Just(PowerStep::TakePending),
                    proptest::strategy::Just(PowerStep::CpuOff),
                ],
                1..64,
            )
        ) {
            let ram = PhysRange::from_start_size(0x4000_0000, 0x800_0000);
            let power = PowerStates::new(2);
            power.mark_on(0);
            for step in steps {
                let before = power.state(1);
                match step {
                    PowerStep::CpuOn => {
                        let call = PsciCall::CpuOn {
                            target_mpidr: vcpu_mpidr(1),
                            entry: 0x4008_0000,
                            context_id: 0,
                        };
                        let expected = if before == PowerState::Off {
                            PsciOutcome::Started(1)
                        } else {
                            err(PsciError::AlreadyOn)
                        };
                        proptest::prop_assert_eq!(dispatch(call, 0, &power, ram), expected);
                    }
                    PowerStep::TakePending => {
                        let taken = power.take_pending(1).is_some();
                        proptest::prop_assert_eq!(taken, before == PowerState::OnPending);
                    }
                    PowerStep::CpuOff if before == PowerState::On => {
                        proptest::prop_assert_eq!(
                            dispatch(PsciCall::CpuOff, 1, &power, ram),
                            PsciOutcome::CpuOff
                        );
                    }
                    PowerStep::CpuOff => {}
                }
            }
        }
    }
}
