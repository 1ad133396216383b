//! A cache of pre-allocated table pages.
//!
//! Walks run with the MMU lock held (and, on the fault path, with the vCPU
//! about to re-enter the guest), where calling the frame allocator is not
//! allowed. The caller therefore tops the cache up before the walk, outside
//! any lock, with as many pages as the walk can need; the walk draws from it
//! and fails with `NoMemory` when it runs dry instead of allocating. The
//! cache's storage is reserved up front, so drawing and returning pages never
//! allocates either. Pages left over stay for the next walk.

use crate::addr::PhysAddr;
use crate::mm::PageTableMemory;
use alloc::vec::Vec;

/// The frame allocator could not provide a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory;

impl core::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("out of page-table memory")
    }
}

impl core::error::Error for OutOfMemory {}

/// Pre-allocated zeroed table pages, drawn from inside walks.
#[derive(Debug, Default)]
pub struct PageCache {
    pages: Vec<PhysAddr>,
}

impl PageCache {
    /// An empty cache that can hold `capacity` pages without growing.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            pages: Vec::with_capacity(capacity),
        }
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Allocates pages from `mm` until the cache holds at least `min`.
    /// Call it outside locks.
    pub fn top_up(&mut self, mm: &impl PageTableMemory, min: usize) -> Result<(), OutOfMemory> {
        self.pages.reserve(min.saturating_sub(self.pages.len()));
        while self.pages.len() < min {
            self.pages
                .push(mm.alloc_zeroed_pages(1).ok_or(OutOfMemory)?);
        }
        Ok(())
    }

    /// Takes one zeroed page; `None` when empty.
    pub(crate) fn pop(&mut self) -> Option<PhysAddr> {
        self.pages.pop()
    }

    /// Gives back a zeroed page taken by [`pop`](Self::pop) and never
    /// published. Returns `false` (keeping nothing) when full.
    pub(crate) fn push_back(&mut self, page: PhysAddr) -> bool {
        if self.pages.len() < self.pages.capacity() {
            self.pages.push(page);
            true
        } else {
            false
        }
    }

    /// Frees every page held back to `mm`.
    pub fn release(&mut self, mm: &impl PageTableMemory) {
        for page in self.pages.drain(..) {
            // SAFETY: the page came from `mm` (one page) and was never published.
            unsafe { mm.free_pages(page, 1) };
        }
    }
}
