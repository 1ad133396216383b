//! Page-table memory: where table pages come from and how they are reached.
//!
//! [`PageTableMemory`] is the whole contract between the engine and its
//! caller's frame allocator: allocate zeroed, naturally aligned, physically
//! contiguous 4 KiB pages (one for a table, up to 16 for a concatenated root),
//! free them, and turn a physical address into a pointer the engine can use.
//! [`HostMemory`] (feature `host`) implements it on the host for tests and
//! benchmarks, with identity "physical" addresses, and checks its callers:
//! it counts live pages, panics on a double free, fills freed pages with a
//! poison pattern and keeps them quarantined for a while, verifying on release
//! that nobody wrote to them after the free.
//!
//! The same trait carries the cache maintenance that guest memory needs when
//! stage 2 cannot force write-back (no `FEAT_S2FWB`), as KVM's memory ops do:
//! [`clean_inval_dcache`](PageTableMemory::clean_inval_dcache) (to the point
//! of coherency, before a leaf is published or after it is unmapped) and
//! [`invalidate_icache`](PageTableMemory::invalidate_icache) (before an
//! executable leaf is published). Both default to nothing; the engine decides
//! when they are due, the implementation how (and whether the CPU needs them
//! at all). `HostMemory` records every call as a [`CacheOp`], in order, in
//! one list behind its lock (tests check which ranges were maintained and
//! when), or, built with [`CacheOpLog::PerThreadCount`], only counts them in
//! a counter of the calling thread, so that vCPU threads faulting in parallel
//! share nothing there (benchmarks).

use crate::addr::PhysAddr;
use core::ptr::NonNull;

/// Provider of page-table pages.
///
/// # Safety
///
/// Implementations must return pages that are zeroed, aligned to their total
/// size, exclusively owned by the caller until freed, and reachable through
/// [`phys_to_virt`](Self::phys_to_virt) for as long as they are allocated.
pub unsafe trait PageTableMemory: Sync {
    /// Allocates `count` (a power of two, at most 16) zeroed, contiguous pages
    /// aligned to `count * 4096`; `None` when memory is exhausted.
    fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr>;

    /// Frees `count` pages at `pa` returned by one `alloc_zeroed_pages(count)`.
    ///
    /// # Safety
    ///
    /// The pages must have come from this provider with the same `count`, must
    /// not be freed twice, and nothing (software or hardware walker) may use
    /// them afterwards.
    unsafe fn free_pages(&self, pa: PhysAddr, count: usize);

    /// A pointer through which the engine reads and writes the page at `pa`.
    fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64>;

    /// Cleans and invalidates the data cache for the guest memory
    /// `[pa, pa + size)` to the point of coherency, so that a guest running
    /// with its stage-1 MMU or caches off (non-cacheable accesses) sees what
    /// was written through the caches, and no stale line hides what it writes.
    /// Called only for configurations without FWB, before a Normal leaf is
    /// published and after one is unmapped (and flushed). Default: nothing.
    fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
        let _ = (pa, size);
    }

    /// Invalidates the instruction cache for the guest memory
    /// `[pa, pa + size)` to the point of unification (cleaning the data
    /// cache to it first where the CPU needs that), before an executable
    /// leaf is published or a leaf gains execute permission. Implementations
    /// skip what the CPU says is not needed (`CTR_EL0.DIC`/`IDC`). Default:
    /// nothing.
    fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
        let _ = (pa, size);
    }
}

/// One cache-maintenance call, as [`HostMemory`] records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOp {
    /// [`PageTableMemory::clean_inval_dcache`] of `[pa, pa + size)`.
    CleanInvalDcache {
        /// First byte.
        pa: PhysAddr,
        /// Length in bytes.
        size: u64,
    },
    /// [`PageTableMemory::invalidate_icache`] of `[pa, pa + size)`.
    InvalidateIcache {
        /// First byte.
        pa: PhysAddr,
        /// Length in bytes.
        size: u64,
    },
}

// SAFETY: forwards to an implementation that upholds the contract.
unsafe impl<T: PageTableMemory + ?Sized> PageTableMemory for &T {
    fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr> {
        (**self).alloc_zeroed_pages(count)
    }
    unsafe fn free_pages(&self, pa: PhysAddr, count: usize) {
        // SAFETY: the caller upholds the contract of `free_pages`.
        unsafe { (**self).free_pages(pa, count) }
    }
    fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64> {
        (**self).phys_to_virt(pa)
    }
    fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
        (**self).clean_inval_dcache(pa, size)
    }
    fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
        (**self).invalidate_icache(pa, size)
    }
}

// SAFETY: forwards to an implementation that upholds the contract.
unsafe impl<T: PageTableMemory + Send + ?Sized> PageTableMemory for alloc::sync::Arc<T> {
    fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr> {
        (**self).alloc_zeroed_pages(count)
    }
    unsafe fn free_pages(&self, pa: PhysAddr, count: usize) {
        // SAFETY: the caller upholds the contract of `free_pages`.
        unsafe { (**self).free_pages(pa, count) }
    }
    fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64> {
        (**self).phys_to_virt(pa)
    }
    fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
        (**self).clean_inval_dcache(pa, size)
    }
    fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
        (**self).invalidate_icache(pa, size)
    }
}

#[cfg(any(test, feature = "host"))]
pub use host::{CacheOpLog, HostMemory, POISON};

#[cfg(any(test, feature = "host"))]
mod host {
    extern crate std;

    use super::{CacheOp, PageTableMemory, PhysAddr};
    use core::ptr::NonNull;
    use std::collections::{HashMap, VecDeque};
    use std::sync::Mutex;
    use std::vec::Vec;

    /// The 64-bit pattern freed pages are filled with. Bit 0 is clear, so a
    /// walker that reads it sees an invalid entry, and it is neither empty
    /// nor the locked marker, so it is recognisable.
    pub const POISON: u64 = 0x5a5a_5a5a_5a5a_5a5a;

    /// How many freed allocations stay quarantined (poisoned, unreleased).
    const QUARANTINE: usize = 4096;

    /// How a [`HostMemory`] keeps the cache-maintenance calls it receives.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum CacheOpLog {
        /// Every call recorded as a [`CacheOp`], in order, in one list behind
        /// the provider's lock ([`HostMemory::cache_ops`]): for tests that
        /// check which ranges were maintained, and when. Threads calling at
        /// the same time take turns on the lock.
        #[default]
        Ordered,
        /// Calls only counted, in a counter of the calling thread
        /// ([`HostMemory::thread_cache_ops`]); nothing shared is written, so
        /// threads faulting in parallel do not serialise on the provider
        /// (benchmarks). No list is kept: [`HostMemory::cache_ops`] panics.
        PerThreadCount,
    }

    std::thread_local! {
        /// Cache-maintenance calls the current thread made to providers
        /// built with [`CacheOpLog::PerThreadCount`].
        static THREAD_CACHE_OPS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
    }

    #[derive(Default)]
    struct State {
        live: HashMap<u64, usize>,
        live_pages: usize,
        quarantine: VecDeque<(u64, usize)>,
        allocations: u64,
        limit: Option<usize>,
        poison_violations: usize,
        cache_ops: Vec<CacheOp>,
        backing: backing::Backing,
    }

    /// Host page-table memory with checks (feature `host`).
    ///
    /// "Physical" addresses are the host addresses of the pages (under
    /// `--cfg loom`, where slots are loom atomics, they are made-up aligned
    /// addresses of boxed slot arrays). Freed pages are poisoned with
    /// [`POISON`] and quarantined for the next 4096 frees; a page written
    /// after its free is counted as a poison violation when it leaves
    /// quarantine or when [`check_quarantine`](Self::check_quarantine) runs.
    /// Freeing a page that is not live panics. Cache-maintenance calls are
    /// recorded in order ([`cache_ops`](Self::cache_ops)), or counted per
    /// thread ([`CacheOpLog`]).
    #[derive(Default)]
    pub struct HostMemory {
        state: Mutex<State>,
        cache_op_log: CacheOpLog,
        free_hook: std::sync::OnceLock<FreeHook>,
    }

    /// A check run on every page about to be freed.
    type FreeHook = std::boxed::Box<dyn Fn(PhysAddr) + Send + Sync>;

    impl HostMemory {
        /// A provider with no limit.
        pub fn new() -> Self {
            Self::default()
        }

        /// A provider without a limit that keeps cache-maintenance calls as
        /// `log` says.
        pub fn with_cache_op_log(log: CacheOpLog) -> Self {
            let mut memory = Self::default();
            memory.cache_op_log = log;
            memory
        }

        /// A provider that refuses to hold more than `pages` live pages.
        pub fn with_limit(pages: usize) -> Self {
            let memory = Self::default();
            memory.state().limit = Some(pages);
            memory
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Installs `hook`, called with the address of every allocation
        /// about to be freed, before anything else happens to it (tests
        /// check there that no CPU of a model TLB can still walk a freed
        /// table). Panics when a hook is installed already.
        pub fn on_free(&self, hook: impl Fn(PhysAddr) + Send + Sync + 'static) {
            if self.free_hook.set(std::boxed::Box::new(hook)).is_err() {
                panic!("HostMemory already has a free hook");
            }
        }

        /// Pages allocated and not yet freed.
        pub fn live_pages(&self) -> usize {
            self.state().live_pages
        }

        /// Whether `pa` is the start of a live allocation.
        pub fn is_live(&self, pa: PhysAddr) -> bool {
            self.state().live.contains_key(&pa.as_u64())
        }

        /// Allocations made so far.
        pub fn allocations(&self) -> u64 {
            self.state().allocations
        }

        /// Freed pages found written after their free, so far.
        pub fn poison_violations(&self) -> usize {
            self.state().poison_violations
        }

        /// The cache-maintenance calls made so far, in order. Panics when
        /// the provider only counts them ([`CacheOpLog::PerThreadCount`]), so
        /// that no check passes on a list that was never kept.
        pub fn cache_ops(&self) -> Vec<CacheOp> {
            self.assert_ordered("cache_ops");
            self.state().cache_ops.clone()
        }

        /// Returns the cache-maintenance calls made so far and forgets them.
        /// Panics like [`cache_ops`](Self::cache_ops).
        pub fn take_cache_ops(&self) -> Vec<CacheOp> {
            self.assert_ordered("take_cache_ops");
            core::mem::take(&mut self.state().cache_ops)
        }

        fn assert_ordered(&self, what: &str) {
            assert!(
                self.cache_op_log == CacheOpLog::Ordered,
                "HostMemory::{what}: this provider counts cache maintenance per thread \
                 (CacheOpLog::PerThreadCount) and keeps no list"
            );
        }

        /// Cache-maintenance calls the calling thread has made so far to
        /// every provider built with [`CacheOpLog::PerThreadCount`] (a
        /// thread-local counter: take the difference around the work).
        pub fn thread_cache_ops() -> u64 {
            THREAD_CACHE_OPS.with(core::cell::Cell::get)
        }

        /// Keeps one cache-maintenance call as [`CacheOpLog`] says.
        fn log_cache_op(&self, op: CacheOp) {
            match self.cache_op_log {
                CacheOpLog::Ordered => self.state().cache_ops.push(op),
                CacheOpLog::PerThreadCount => THREAD_CACHE_OPS.with(|n| n.set(n.get() + 1)),
            }
        }

        /// Checks every quarantined page for writes after free, releases
        /// them, and returns the number of violations found so far in total.
        pub fn check_quarantine(&self) -> usize {
            let mut guard = self.state();
            let state = &mut *guard;
            while let Some((pa, count)) = state.quarantine.pop_front() {
                if !state.backing.poison_intact(pa, count) {
                    state.poison_violations += 1;
                }
                state.backing.release(pa, count);
            }
            state.poison_violations
        }
    }

    impl Drop for HostMemory {
        fn drop(&mut self) {
            let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
            while let Some((pa, count)) = state.quarantine.pop_front() {
                state.backing.release(pa, count);
            }
            // Live pages are leaked on purpose: a table may still use them.
        }
    }

    // SAFETY: pages come zeroed with an alignment of their size, stay
    // allocated while live (and while quarantined), and `phys_to_virt`
    // returns their address.
    unsafe impl PageTableMemory for HostMemory {
        fn alloc_zeroed_pages(&self, count: usize) -> Option<PhysAddr> {
            assert!(
                count.is_power_of_two() && count <= 16,
                "bad page count {count}"
            );
            let mut state = self.state();
            if state
                .limit
                .is_some_and(|limit| state.live_pages + count > limit)
            {
                return None;
            }
            let pa = state.backing.alloc_zeroed(count)?;
            state.live.insert(pa, count);
            state.live_pages += count;
            state.allocations += 1;
            Some(PhysAddr::new(pa))
        }

        unsafe fn free_pages(&self, pa: PhysAddr, count: usize) {
            if let Some(hook) = self.free_hook.get() {
                hook(pa);
            }
            let mut guard = self.state();
            let state = &mut *guard;
            match state.live.remove(&pa.as_u64()) {
                Some(n) if n == count => {}
                Some(n) => panic!("free of {pa} with {count} pages, allocated with {n}"),
                None => panic!("double free (or free of a page never allocated) at {pa}"),
            }
            state.live_pages -= count;
            state.backing.poison(pa.as_u64(), count);
            state.quarantine.push_back((pa.as_u64(), count));
            if state.quarantine.len() > QUARANTINE {
                let (old, old_count) = state.quarantine.pop_front().expect("non-empty quarantine");
                if !state.backing.poison_intact(old, old_count) {
                    state.poison_violations += 1;
                }
                state.backing.release(old, old_count);
            }
        }

        fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<u64> {
            backing::Backing::pointer(self, pa.as_u64())
        }

        fn clean_inval_dcache(&self, pa: PhysAddr, size: u64) {
            self.log_cache_op(CacheOp::CleanInvalDcache { pa, size });
        }

        fn invalidate_icache(&self, pa: PhysAddr, size: u64) {
            self.log_cache_op(CacheOp::InvalidateIcache { pa, size });
        }
    }

    /// Page storage: raw host memory.
    #[cfg(not(loom))]
    mod backing {
        extern crate std;

        use super::HostMemory;
        use crate::descriptor::PAGE_SIZE;
        use core::ptr::NonNull;
        use std::alloc::{Layout, alloc_zeroed, dealloc};

        #[derive(Default)]
        pub(super) struct Backing;

        fn layout(count: usize) -> Layout {
            let bytes = count * PAGE_SIZE as usize;
            Layout::from_size_align(bytes, bytes).expect("page layout")
        }

        impl Backing {
            pub(super) fn alloc_zeroed(&mut self, count: usize) -> Option<u64> {
                // SAFETY: the layout has a nonzero size.
                let ptr = unsafe { alloc_zeroed(layout(count)) };
                (!ptr.is_null()).then_some(ptr as u64)
            }

            pub(super) fn poison(&mut self, pa: u64, count: usize) {
                let n = count * PAGE_SIZE as usize / 8;
                // SAFETY: the allocation is still ours (quarantined); the
                // caller freed it, so nothing may use it now.
                unsafe { core::slice::from_raw_parts_mut(pa as *mut u64, n) }.fill(super::POISON);
            }

            pub(super) fn poison_intact(&mut self, pa: u64, count: usize) -> bool {
                let n = count * PAGE_SIZE as usize / 8;
                // SAFETY: quarantined pages stay allocated until `release`.
                unsafe { core::slice::from_raw_parts(pa as *mut u64, n) }
                    .iter()
                    .all(|&w| w == super::POISON)
            }

            pub(super) fn release(&mut self, pa: u64, count: usize) {
                // SAFETY: `pa` came from `alloc_zeroed` with this layout and
                // leaves quarantine exactly once.
                unsafe { dealloc(pa as *mut u8, layout(count)) }
            }

            pub(super) fn pointer(_: &HostMemory, pa: u64) -> NonNull<u64> {
                NonNull::new(pa as *mut u64).expect("null physical address")
            }
        }
    }

    /// Page storage under loom: boxed arrays of loom atomics at made-up
    /// physical addresses.
    #[cfg(loom)]
    mod backing {
        extern crate std;

        use super::HostMemory;
        use crate::descriptor::{ENTRIES_PER_TABLE, PAGE_SIZE};
        use crate::sync_primitives::{AtomicU64, read_owned, write_owned};
        use core::ptr::NonNull;
        use std::boxed::Box;
        use std::collections::HashMap;

        #[derive(Default)]
        pub(super) struct Backing {
            pages: HashMap<u64, Box<[AtomicU64]>>,
            next: u64,
        }

        impl Backing {
            pub(super) fn alloc_zeroed(&mut self, count: usize) -> Option<u64> {
                let size = count as u64 * PAGE_SIZE;
                let pa = (self.next.max(1 << 30)).next_multiple_of(size);
                self.next = pa + size;
                let slots = (0..count * ENTRIES_PER_TABLE)
                    .map(|_| AtomicU64::new(0))
                    .collect();
                self.pages.insert(pa, slots);
                Some(pa)
            }

            pub(super) fn poison(&mut self, pa: u64, _: usize) {
                for slot in self.pages.get_mut(&pa).expect("allocated page").iter_mut() {
                    write_owned(slot, super::POISON);
                }
            }

            pub(super) fn poison_intact(&mut self, pa: u64, _: usize) -> bool {
                self.pages
                    .get_mut(&pa)
                    .expect("allocated page")
                    .iter_mut()
                    .all(|s| read_owned(s) == super::POISON)
            }

            pub(super) fn release(&mut self, pa: u64, _: usize) {
                self.pages.remove(&pa);
            }

            pub(super) fn pointer(memory: &HostMemory, pa: u64) -> NonNull<u64> {
                let state = memory.state();
                // Pages inside a concatenated root resolve to their allocation.
                let (&base, slots) = state
                    .backing
                    .pages
                    .iter()
                    .find(|&(&base, slots)| {
                        base <= pa && pa < base + (slots.len() as u64 / 512) * PAGE_SIZE
                    })
                    .expect("physical address of no page");
                let index = ((pa - base) / PAGE_SIZE) as usize * ENTRIES_PER_TABLE;
                NonNull::from(&slots[index]).cast()
            }
        }
    }

    #[cfg(all(test, not(loom)))]
    mod tests {
        use super::*;
        use crate::descriptor::PAGE_SIZE;

        #[test]
        fn counts_poisons_and_checks() {
            let mem = HostMemory::new();
            let a = mem.alloc_zeroed_pages(1).unwrap();
            let b = mem.alloc_zeroed_pages(4).unwrap();
            assert!(b.is_aligned(4 * PAGE_SIZE));
            assert_eq!(mem.live_pages(), 5);
            // SAFETY: `a` is a live page of 512 words.
            unsafe { assert_eq!(*mem.phys_to_virt(a).as_ptr().add(511), 0) };
            // SAFETY: `a` is live and unused.
            unsafe { mem.free_pages(a, 1) };
            assert_eq!(mem.live_pages(), 4);
            // SAFETY: the page is quarantined, still allocated.
            unsafe { assert_eq!(*mem.phys_to_virt(a).as_ptr(), POISON) };
            assert_eq!(mem.check_quarantine(), 0);
            let c = mem.alloc_zeroed_pages(1).unwrap();
            // SAFETY: `c` is live and unused.
            unsafe { mem.free_pages(c, 1) };
            // A write after free.
            // SAFETY: the page is quarantined, still allocated (this is the bug being detected).
            unsafe { *mem.phys_to_virt(c).as_ptr().add(3) = 7 };
            assert_eq!(mem.check_quarantine(), 1);
            // SAFETY: `b` is live.
            unsafe { mem.free_pages(b, 4) };
        }

        #[test]
        #[should_panic(expected = "double free")]
        fn double_free_panics() {
            let mem = HostMemory::new();
            let a = mem.alloc_zeroed_pages(1).unwrap();
            // SAFETY: `a` is live.
            unsafe { mem.free_pages(a, 1) };
            // SAFETY: deliberately wrong: this is what is being detected.
            unsafe { mem.free_pages(a, 1) };
        }

        #[test]
        fn ordered_log_keeps_every_call_in_order() {
            let mem = HostMemory::new();
            let before = HostMemory::thread_cache_ops();
            mem.clean_inval_dcache(PhysAddr::new(0x1000), PAGE_SIZE);
            mem.invalidate_icache(PhysAddr::new(0x2000), PAGE_SIZE);
            assert_eq!(
                mem.take_cache_ops(),
                [
                    CacheOp::CleanInvalDcache {
                        pa: PhysAddr::new(0x1000),
                        size: PAGE_SIZE
                    },
                    CacheOp::InvalidateIcache {
                        pa: PhysAddr::new(0x2000),
                        size: PAGE_SIZE
                    },
                ]
            );
            assert_eq!(mem.cache_ops(), []);
            assert_eq!(HostMemory::thread_cache_ops(), before);
        }

        #[test]
        fn per_thread_count_counts_each_thread_apart_and_keeps_no_list() {
            let mem = HostMemory::with_cache_op_log(CacheOpLog::PerThreadCount);
            let counted = |calls: u64| {
                let before = HostMemory::thread_cache_ops();
                for i in 0..calls {
                    mem.clean_inval_dcache(PhysAddr::new(i * PAGE_SIZE), PAGE_SIZE);
                }
                mem.invalidate_icache(PhysAddr::new(0), PAGE_SIZE);
                HostMemory::thread_cache_ops() - before
            };
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| counted(3));
                let b = s.spawn(|| counted(5));
                (a.join().unwrap(), b.join().unwrap())
            });
            assert_eq!((a, b), (4, 6));
            assert!(mem.state().cache_ops.is_empty());
        }

        #[test]
        #[should_panic(expected = "keeps no list")]
        fn per_thread_count_refuses_to_list() {
            let mem = HostMemory::with_cache_op_log(CacheOpLog::PerThreadCount);
            mem.clean_inval_dcache(PhysAddr::new(0x1000), PAGE_SIZE);
            let _ = mem.cache_ops();
        }

        #[test]
        fn limit_refuses() {
            let mem = HostMemory::with_limit(2);
            assert!(mem.alloc_zeroed_pages(2).is_some());
            assert!(mem.alloc_zeroed_pages(1).is_none());
        }
    }
}
