//! Loom model of the dirty bitmap: vCPUs marking pages of one word while
//! the management path harvests it, in both of KVM's modes.
//!
//! Built with `--cfg loom`, the bitmap's words are loom atomics, so loom
//! explores every interleaving of the marks' test-and-`fetch_or` with the
//! harvest's exchange (or the manual mode's copy and `fetch_and`). No mark
//! may be lost and none reported twice: a non-atomic read-modify-write on
//! either side (a load and a store in place of `fetch_or`, `swap` or
//! `fetch_and`) fails a model.
//!
//! Run: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom-epoch cargo test --release -p memslot --test loom_dirty`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use memslot::DirtyBitmap;

/// Runs `f` under loom, with the preemption bound `LOOM_MAX_PREEMPTIONS`
/// (2 when unset).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

/// Two vCPUs mark pages 1 and 2 (one word) of a bitmap, page 1 marked
/// already by an earlier write.
fn marking(bitmap: &Arc<DirtyBitmap>) -> [thread::JoinHandle<()>; 2] {
    [1, 2].map(|page| {
        let bitmap = bitmap.clone();
        thread::spawn(move || assert!(bitmap.mark(page)))
    })
}

/// Without manual protection: a harvest (exchange with zero) runs beside
/// the marks; with the final harvest, every page is reported exactly once
/// per interval it was dirtied in.
#[test]
fn marks_against_a_harvest_are_each_reported_once() {
    model(|| {
        let bitmap = Arc::new(DirtyBitmap::new(64, false));
        assert!(bitmap.mark(1));
        let markers = marking(&bitmap);
        let mut first = [0u64];
        bitmap.take(&mut first).expect("one word");
        for marker in markers {
            marker.join().expect("vCPU");
        }
        let mut last = [0u64];
        bitmap.take(&mut last).expect("one word");
        // Page 2 was dirtied once: reported by exactly one harvest.
        assert_eq!(
            (first[0] ^ last[0]) & 0b100,
            0b100,
            "page 2 lost or reported twice"
        );
        // Page 1 was dirty before the harvest: the first reports it.
        assert_eq!(first[0] & 0b10, 0b10, "page 1 lost");
        assert_eq!((first[0] | last[0]) & !0b110, 0, "a page never marked");
        assert_eq!(bitmap.count(), 0);
    });
}

/// Manual protection: the management path copies the word and clears what
/// it copied beside the marks; a page is either reported by the clear (to
/// be protected again) or still set, never dropped.
#[test]
fn marks_against_a_manual_clear_are_never_dropped() {
    model(|| {
        let bitmap = Arc::new(DirtyBitmap::new(64, false));
        assert!(bitmap.mark(1));
        let markers = marking(&bitmap);
        let mut copied = [0u64];
        bitmap.snapshot(&mut copied).expect("one word");
        let mut mask = copied;
        bitmap.clear(0, &mut mask).expect("one word");
        assert_eq!(mask[0] & !copied[0], 0, "cleared a page not asked for");
        for marker in markers {
            marker.join().expect("vCPU");
        }
        let mut left = [0u64];
        bitmap.snapshot(&mut left).expect("one word");
        assert_eq!(mask[0] | left[0], 0b110, "a mark was dropped or invented");
        assert_eq!(mask[0] & 0b10, 0b10, "page 1 was dirty before the copy");
    });
}
