//! A spin lock whose waiters, after a spin, sleep until the holder lets
//! go, so that a CPU waiting for it gives its time back to the host.
//!
//! # Why
//!
//! Under an emulator (or a host hypervisor) each of the machine's CPUs is a
//! host thread, and with more CPUs than host cores a thread can lose its
//! core while it holds a lock. A plain spin lock's waiters then spin
//! through their whole time slice while the holder waits for a core. The
//! virtual GIC's lock, taken on every interrupt exit, met exactly that
//! with 4 vCPUs on a 2-core host (QEMU TCG): over half of EL2's time was
//! spent spinning on it, 1.9 ms per contended acquisition on average
//! (`docs/benchmarks.md`, `linux_boot`). On hardware with a core per CPU
//! the holder keeps running and waiters rarely get past the spin.
//!
//! # Algorithm
//!
//! [`SleepingMutex::lock`] tries the lock, spins while it looks taken (for
//! about as long as a holder that keeps its core holds it), then registers
//! its CPU in a bit mask of sleepers, tries once more, and sleeps ([`LockWait::sleep`]: `WFI`, which under emulation
//! gives the host thread up). Letting go ([`SleepingGuard`]'s drop)
//! unlocks, then wakes every registered sleeper ([`LockWait::wake`]: a
//! kick, an interrupt that stays pending until taken). A waiter that
//! wakes tries again.
//!
//! No wake-up is lost: the sleeper's registration and the holder's unlock
//! are each followed by a full fence before the other side's check (the
//! sleeper's second try, the holder's look at the mask), so at least one
//! of them sees the other; and a kick sent before the sleeper reaches
//! `WFI` stays pending, so `WFI` returns at once. A sleep may also end
//! for any other interrupt; the waiter then simply tries again.
//!
//! Before [`SleepingMutex::set_wait`] (and in the runtime's host tests,
//! whose fake machine has nowhere to sleep) the lock spins as a plain spin
//! lock.
//!
//! The host test with threads as CPUs catches a missing second try or a
//! missing wake-up (a sleeper then waits for nothing). A missing fence
//! shows only on a weakly ordered host: on x86 every read-modify-write is
//! a full barrier already.

use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU64, Ordering, fence};

/// How a CPU sleeps until woken, and wakes another.
pub trait LockWait: Sync {
    /// The index of the running CPU (below 64 to sleep; others spin).
    fn sleeper_cpu(&self) -> usize;
    /// Waits until [`LockWait::wake`] for this CPU, or any interrupt.
    fn sleep(&self);
    /// Ends CPU `cpu`'s [`LockWait::sleep`], or its next one.
    fn wake(&self, cpu: usize);
    /// A clock for [`LockStats::wait_ticks`] (the system counter).
    fn ticks(&self) -> u64;
}

/// How often a [`SleepingMutex`] was found taken, and how long its
/// waiters waited (counted once [`SleepingMutex::set_wait`] was called).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Acquisitions that found the lock taken.
    pub contended: u64,
    /// Sleeps of their waiters (each woken by a release or an interrupt).
    pub sleeps: u64,
    /// Their waiting time, in [`LockWait::ticks`].
    pub wait_ticks: u64,
}

/// How many times a waiter looks at the lock before it sleeps: about as
/// long as a holder that keeps its core holds it under QEMU TCG (a
/// list-register refill), so that only a holder without a core costs a
/// sleep and a kick. (With 64, the 4-vCPU Linux boot slept ten times as
/// often, and each kick to a sleeper lengthened the pause of a
/// migration, whose parked vCPUs all take the lock at once.)
const SPINS_BEFORE_SLEEP: u32 = 4096;

/// A spin lock whose waiters sleep (see the module doc).
pub struct SleepingMutex<T> {
    inner: spin::Mutex<T>,
    /// Bit `i`: CPU `i` sleeps waiting for the lock.
    sleepers: AtomicU64,
    wait: spin::Once<&'static dyn LockWait>,
    contended: AtomicU64,
    sleeps: AtomicU64,
    wait_ticks: AtomicU64,
}

impl<T> SleepingMutex<T> {
    /// An unlocked mutex holding `value`; it spins until
    /// [`SleepingMutex::set_wait`].
    pub const fn new(value: T) -> Self {
        Self {
            inner: spin::Mutex::new(value),
            sleepers: AtomicU64::new(0),
            wait: spin::Once::new(),
            contended: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            wait_ticks: AtomicU64::new(0),
        }
    }

    /// What waiting there was so far.
    pub fn stats(&self) -> LockStats {
        LockStats {
            contended: self.contended.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            wait_ticks: self.wait_ticks.load(Ordering::Relaxed),
        }
    }

    /// From now on, waiters sleep with `wait` (the first call counts).
    pub fn set_wait(&self, wait: &'static dyn LockWait) {
        self.wait.call_once(|| wait);
    }

    /// Locks, sleeping while the lock is held elsewhere.
    pub fn lock(&self) -> SleepingGuard<'_, T> {
        if let Some(guard) = self.inner.try_lock() {
            return self.guard(guard);
        }
        let Some(&wait) = self.wait.get() else {
            return self.guard(self.inner.lock());
        };
        self.contended.fetch_add(1, Ordering::Relaxed);
        let since = wait.ticks();
        let guard = self.wait_for(wait);
        self.wait_ticks
            .fetch_add(wait.ticks().wrapping_sub(since), Ordering::Relaxed);
        guard
    }

    /// The contended part of [`SleepingMutex::lock`].
    fn wait_for(&self, wait: &dyn LockWait) -> SleepingGuard<'_, T> {
        loop {
            for _ in 0..SPINS_BEFORE_SLEEP {
                if !self.inner.is_locked() {
                    break;
                }
                core::hint::spin_loop();
            }
            if let Some(guard) = self.inner.try_lock() {
                return self.guard(guard);
            }
            let cpu = wait.sleeper_cpu();
            if cpu >= 64 {
                return self.guard(self.inner.lock());
            }
            let bit = 1u64 << cpu;
            self.sleepers.fetch_or(bit, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if let Some(guard) = self.inner.try_lock() {
                self.sleepers.fetch_and(!bit, Ordering::Relaxed);
                return self.guard(guard);
            }
            self.sleeps.fetch_add(1, Ordering::Relaxed);
            wait.sleep();
            self.sleepers.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    fn guard<'a>(&'a self, guard: spin::MutexGuard<'a, T>) -> SleepingGuard<'a, T> {
        SleepingGuard {
            guard: ManuallyDrop::new(guard),
            lock: self,
        }
    }
}

/// The lock held; dropping it unlocks and wakes the sleepers.
pub struct SleepingGuard<'a, T> {
    guard: ManuallyDrop<spin::MutexGuard<'a, T>>,
    lock: &'a SleepingMutex<T>,
}

impl<T> Deref for SleepingGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for SleepingGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for SleepingGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        fence(Ordering::SeqCst);
        if self.lock.sleepers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let sleepers = self.lock.sleepers.swap(0, Ordering::AcqRel);
        if let Some(&wait) = self.lock.wait.get() {
            for cpu in (0..64).filter(|cpu| sleepers & (1 << cpu) != 0) {
                wait.wake(cpu);
            }
        }
    }
}

impl<T: core::fmt::Debug> core::fmt::Debug for SleepingMutex<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SleepingMutex")
            .field("sleepers", &self.sleepers.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::{LockWait, SleepingMutex};
    use core::cell::Cell;
    use core::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier, Mutex};
    use std::thread::{self, Thread};
    use std::time::{Duration, Instant};
    use std::vec::Vec;

    std::thread_local! {
        static CPU: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    /// Threads as CPUs: a sleep parks the thread (a wake before it makes
    /// the park return at once, as a pending kick ends `WFI`); a sleep that
    /// no wake ends within 2 s is counted as lost. Naming the CPU takes a
    /// while, so that a holder often lets go between a waiter's last try
    /// and its registration.
    struct Parking {
        threads: Mutex<Vec<Option<Thread>>>,
        lost: AtomicU64,
        start: Instant,
    }

    impl LockWait for Parking {
        fn sleeper_cpu(&self) -> usize {
            thread::sleep(Duration::from_micros(20));
            CPU.with(Cell::get)
        }

        fn sleep(&self) {
            let since = Instant::now();
            thread::park_timeout(Duration::from_secs(2));
            if since.elapsed() >= Duration::from_secs(2) {
                self.lost.fetch_add(1, Ordering::Relaxed);
            }
        }

        fn wake(&self, cpu: usize) {
            if let Some(thread) = &self.threads.lock().unwrap()[cpu] {
                thread.unpark();
            }
        }

        fn ticks(&self) -> u64 {
            self.start.elapsed().as_nanos() as u64
        }
    }

    #[test]
    fn waiters_sleep_and_every_one_is_woken() {
        const THREADS: usize = 4;
        const ROUNDS: u64 = 3_000;
        let wait: &'static Parking = std::boxed::Box::leak(std::boxed::Box::new(Parking {
            threads: Mutex::new(std::vec![None; THREADS]),
            lost: AtomicU64::new(0),
            start: Instant::now(),
        }));
        let lock = Arc::new(SleepingMutex::new(0u64));
        lock.set_wait(wait);
        let barrier = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|cpu| {
                let (lock, barrier) = (lock.clone(), barrier.clone());
                thread::spawn(move || {
                    CPU.with(|c| c.set(cpu));
                    wait.threads.lock().unwrap()[cpu] = Some(thread::current());
                    barrier.wait();
                    for round in 0..ROUNDS {
                        let mut count = lock.lock();
                        let seen = *count;
                        // A holder that loses its core now and then, as
                        // under emulation: the waiters get past their spin.
                        if round % 16 == 0 {
                            thread::sleep(Duration::from_micros(50));
                        }
                        *count = seen + 1;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(*lock.lock(), THREADS as u64 * ROUNDS);
        let stats = lock.stats();
        assert!(stats.sleeps > 0, "nothing slept: {stats:?}");
        assert!(stats.contended >= stats.sleeps.min(1), "{stats:?}");
        assert_eq!(
            wait.lost.load(Ordering::Relaxed),
            0,
            "lost wake-ups: {stats:?}"
        );
    }

    #[test]
    fn without_a_way_to_sleep_it_is_a_spin_lock() {
        let lock = Arc::new(SleepingMutex::new(0u64));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let lock = lock.clone();
                thread::spawn(move || {
                    for _ in 0..2_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(*lock.lock(), 6_000);
        assert_eq!(lock.stats(), super::LockStats::default());
    }
}
