//! The MMU lock's write side excludes the read side of every CPU.
//!
//! For each registered CPU in turn, a reader thread registered as that CPU
//! takes its read side and stays inside until the writer has returned from
//! `Mmu::write` or a deadline has passed; the writer records whether that
//! reader was still inside when it got the lock. A write side that takes
//! every CPU's lock gets it only once the reader has left (at the deadline),
//! so it never is. A write side that skips some CPU's lock gets in at once
//! while that CPU's reader is inside, and the reader, waiting for the writer
//! to return before it leaves, is still inside whatever the timing: the
//! check does not depend on the scheduler, except that a writer thread that
//! could not start before the deadline would hide the bug (never fail a
//! correct lock).
//!
//! Run: `cargo test --release -p pgtable --test mmu_lock`.

mod thread_failure;

use pgtable::{HostMemory, Mmu, Stage2Config, Stage2PageTable};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use thread_failure::FailureFlag;

const CPUS: usize = 4;
/// How long a reader stays inside when the writer (rightly) waits for it.
const DEADLINE: Duration = Duration::from_millis(200);

fn mmu() -> Mmu<Arc<HostMemory>> {
    let memory = Arc::new(HostMemory::new());
    let config = Stage2Config::new(40).expect("IPA size");
    let table = Stage2PageTable::new(config, memory, 1, true).expect("root table");
    Mmu::new(table, CPUS).expect("CPU count")
}

/// Whether the writer got the write side while the reader registered as CPU
/// `cpu` was inside its read section.
fn writer_overlaps_reader_on(cpu: usize) -> bool {
    let mmu = mmu();
    // CPU slots are handed out in order: the reader thread's is `cpu`.
    let _others: Vec<_> = (0..cpu)
        .map(|_| mmu.register().expect("CPU slot"))
        .collect();
    let inside = AtomicBool::new(false);
    let writer_done = AtomicBool::new(false);
    let failure = FailureFlag::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _watch = failure.watch();
            let handle = mmu.register().expect("CPU slot");
            let reader = mmu.read(&handle).expect("own handle");
            inside.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + DEADLINE;
            while !writer_done.load(Ordering::SeqCst) && Instant::now() < deadline {
                failure.check();
                std::thread::yield_now();
            }
            inside.store(false, Ordering::SeqCst);
            drop(reader);
        });
        let writer = s.spawn(|| {
            let _watch = failure.watch();
            while !inside.load(Ordering::SeqCst) {
                failure.check();
                std::thread::yield_now();
            }
            let write_side = mmu.write();
            let overlapped = inside.load(Ordering::SeqCst);
            writer_done.store(true, Ordering::SeqCst);
            drop(write_side);
            overlapped
        });
        writer.join().expect("writer thread")
    })
}

#[test]
fn the_writer_waits_for_a_reader_on_every_cpu() {
    for cpu in 0..CPUS {
        assert!(
            !writer_overlaps_reader_on(cpu),
            "the write side was taken while CPU {cpu}'s reader was inside its read section"
        );
    }
}
