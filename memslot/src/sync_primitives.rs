//! The synchronisation primitives of the lock-free paths, swappable for
//! `loom`'s.
//!
//! Built normally, these are core's atomics and a plain `UnsafeCell`. Built
//! with `--cfg loom` (the models in `tests/loom_*.rs`), they are loom's, so a
//! model explores every interleaving and every weak-memory outcome of the set
//! publication, the grace-period wait and the dirty bitmap's words, and
//! reports any access to a set that no release/acquire pair orders after its
//! last change (a causality violation) as a failure. Spin loops wait through
//! [`spin_wait`], which under loom yields to the other threads of the model.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU64, AtomicUsize};

/// One pause in a spin loop.
#[inline]
pub(crate) fn spin_wait() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// A cell shared under an external protocol (the set publication): reads
/// through [`ProtocolCell::get`], writes through [`ProtocolCell::get_mut`].
/// Under loom each call is checked against the others for a happens-before
/// order.
#[derive(Debug)]
pub(crate) struct ProtocolCell<T> {
    #[cfg(loom)]
    inner: loom::cell::UnsafeCell<T>,
    #[cfg(not(loom))]
    inner: core::cell::UnsafeCell<T>,
}

impl<T> ProtocolCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(loom)]
            inner: loom::cell::UnsafeCell::new(value),
            #[cfg(not(loom))]
            inner: core::cell::UnsafeCell::new(value),
        }
    }

    /// A shared reference to the value.
    ///
    /// # Safety
    ///
    /// No `&mut` to the value may exist while the returned reference lives.
    pub(crate) unsafe fn get(&self) -> &T {
        #[cfg(loom)]
        // SAFETY: the caller's contract.
        return self.inner.with(|ptr| unsafe { &*ptr });
        #[cfg(not(loom))]
        // SAFETY: the caller's contract.
        unsafe {
            &*self.inner.get()
        }
    }

    /// An exclusive reference to the value.
    ///
    /// # Safety
    ///
    /// No other reference to the value may exist while the returned one
    /// lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get_mut(&self) -> &mut T {
        #[cfg(loom)]
        // SAFETY: the caller's contract.
        return self.inner.with_mut(|ptr| unsafe { &mut *ptr });
        #[cfg(not(loom))]
        // SAFETY: the caller's contract.
        unsafe {
            &mut *self.inner.get()
        }
    }
}
