//! Ending every thread of a multi-threaded test when one of them fails.
//!
//! A thread that waits for another one's progress (a pace counter, a stop
//! flag, a count of faults) waits for ever once that thread has panicked,
//! and a scope joins its threads before it propagates any panic: a failed
//! check would show as a hung test. So each thread holds a [`Watch`] of the
//! test's [`FailureFlag`] for its whole body; a thread that unwinds raises
//! the flag as the watch drops, and every waiting loop calls
//! [`FailureFlag::check`], which panics once the flag is up. All threads then
//! end within one loop iteration, the scope's join returns, and the test
//! fails with the first thread's message (printed when it panicked).
//!
//! (`pgtable/tests/thread_failure/mod.rs` is the same file: the two crates'
//! tests share no code.)

use std::sync::atomic::{AtomicBool, Ordering};

/// Raised when any watched thread of a test panics.
#[derive(Debug, Default)]
pub struct FailureFlag(AtomicBool);

/// Raises its flag if dropped while its thread unwinds.
#[must_use = "the watch raises the flag only while it is held"]
pub struct Watch<'a>(&'a FailureFlag);

impl FailureFlag {
    /// Watches the calling thread until the returned guard drops.
    pub fn watch(&self) -> Watch<'_> {
        Watch(self)
    }

    /// Whether a watched thread panicked.
    pub fn raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Ends the calling thread (a panic) if a watched thread panicked:
    /// call it in every loop that waits for another thread.
    pub fn check(&self) {
        assert!(!self.raised(), "another thread of this test failed");
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.0.store(true, Ordering::SeqCst);
        }
    }
}
