//! Per-slot dirty bitmaps.
//!
//! One bit per page, in `AtomicU64` words. The fault path marks pages with a
//! single `fetch_or`, so any number of vCPUs mark concurrently without locks.
//! Harvesting works as KVM's two modes:
//! - without manual protection, [`DirtyBitmap::take`] exchanges each word with
//!   zero: the returned bits are the pages written since the last take, which
//!   the caller write-protects again;
//! - with manual protection, [`DirtyBitmap::snapshot`] only copies, and
//!   [`DirtyBitmap::clear`] clears the bits of a mask with `fetch_and` and
//!   reports the bits that were set (the pages to write-protect again).
//!
//! A bitmap may start all-set (KVM's `DIRTY_LOG_INITIALLY_SET`): the first
//! harvest then reports every page, and write protection is applied lazily by
//! clears instead of all at once when logging starts. Bits past `npages` are
//! never set.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use crate::error::MemslotError;
use crate::sync_primitives::AtomicU64;

/// A dirty bitmap for one slot.
#[derive(Debug)]
pub struct DirtyBitmap {
    npages: u64,
    words: Box<[AtomicU64]>,
}

impl DirtyBitmap {
    /// A bitmap for `npages` pages, all clear or (with `all_set`) all set.
    pub fn new(npages: u64, all_set: bool) -> Self {
        let nwords = npages.div_ceil(64) as usize;
        let words: Vec<AtomicU64> = (0..nwords)
            .map(|i| {
                AtomicU64::new(if all_set {
                    Self::valid_bits(npages, i)
                } else {
                    0
                })
            })
            .collect();
        Self {
            npages,
            words: words.into_boxed_slice(),
        }
    }

    /// The bits of word `index` that stand for pages of the slot.
    fn valid_bits(npages: u64, index: usize) -> u64 {
        let first = index as u64 * 64;
        let left = npages - first;
        if left >= 64 {
            u64::MAX
        } else {
            (1u64 << left) - 1
        }
    }

    /// Pages covered.
    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// Words a harvesting buffer needs.
    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Marks page `page` (relative to the slot) dirty. Returns false when the
    /// page is outside the slot.
    #[inline]
    pub fn mark(&self, page: u64) -> bool {
        if page >= self.npages {
            return false;
        }
        let bit = 1u64 << (page % 64);
        let word = &self.words[(page / 64) as usize];
        // Test first: a page written over and over stays in the cache line's
        // shared state instead of bouncing it between CPUs.
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
        true
    }

    /// Whether page `page` is marked.
    pub fn is_dirty(&self, page: u64) -> bool {
        page < self.npages
            && self.words[(page / 64) as usize].load(Ordering::Relaxed) & (1u64 << (page % 64)) != 0
    }

    /// Number of marked pages.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    fn check_buffer(&self, out: &[u64]) -> Result<(), MemslotError> {
        if out.len() < self.words.len() {
            return Err(MemslotError::DirtyBufferTooSmall {
                needed: self.words.len(),
                given: out.len(),
            });
        }
        Ok(())
    }

    /// Exchanges every word with zero, writing the old words to `out`; returns
    /// the number of dirty pages reported. Marks racing with the take land
    /// either in this report or in the next one, never nowhere.
    pub fn take(&self, out: &mut [u64]) -> Result<u64, MemslotError> {
        self.check_buffer(out)?;
        let mut dirty = 0;
        for (word, slot) in self.words.iter().zip(out.iter_mut()) {
            // A plain load first: clean words are not written, which keeps
            // their cache lines shared with the vCPUs.
            let bits = if word.load(Ordering::Relaxed) == 0 {
                0
            } else {
                word.swap(0, Ordering::AcqRel)
            };
            *slot = bits;
            dirty += u64::from(bits.count_ones());
        }
        Ok(dirty)
    }

    /// Copies every word to `out` without clearing; returns the number of dirty pages.
    pub fn snapshot(&self, out: &mut [u64]) -> Result<u64, MemslotError> {
        self.check_buffer(out)?;
        let mut dirty = 0;
        for (word, slot) in self.words.iter().zip(out.iter_mut()) {
            let bits = word.load(Ordering::Acquire);
            *slot = bits;
            dirty += u64::from(bits.count_ones());
        }
        Ok(dirty)
    }

    /// Clears the pages of `mask` (bit `i` of `mask[w]` is page
    /// `first_page + 64 * w + i`), with `first_page` a multiple of 64. On
    /// return `mask` holds only the pages that were dirty and are now clean:
    /// those the caller write-protects again. Returns how many there are.
    pub fn clear(&self, first_page: u64, mask: &mut [u64]) -> Result<u64, MemslotError> {
        if !first_page.is_multiple_of(64) {
            return Err(MemslotError::DirtyClearUnaligned(first_page));
        }
        let npages = mask.len() as u64 * 64;
        let first_word = first_page / 64;
        if first_page > self.npages || first_word + mask.len() as u64 > self.words.len() as u64 {
            return Err(MemslotError::DirtyClearOutOfRange { first_page, npages });
        }
        let mut cleared = 0;
        for (offset, bits) in mask.iter_mut().enumerate() {
            let word = &self.words[first_word as usize + offset];
            if *bits != 0 {
                *bits &= word.fetch_and(!*bits, Ordering::AcqRel);
                cleared += u64::from(bits.count_ones());
            }
        }
        Ok(cleared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_set_bitmap_sets_only_pages_of_the_slot() {
        let bitmap = DirtyBitmap::new(70, true);
        assert_eq!(bitmap.count(), 70);
        let mut out = [0u64; 2];
        assert_eq!(bitmap.take(&mut out), Ok(70));
        assert_eq!(out, [u64::MAX, (1 << 6) - 1]);
        assert_eq!(bitmap.count(), 0);
    }

    #[test]
    fn mark_outside_the_slot_is_refused() {
        let bitmap = DirtyBitmap::new(10, false);
        assert!(!bitmap.mark(10));
        assert!(bitmap.mark(9));
        assert!(bitmap.is_dirty(9));
        assert_eq!(bitmap.count(), 1);
    }

    #[test]
    fn clear_reports_only_pages_that_were_dirty() {
        let bitmap = DirtyBitmap::new(128, false);
        bitmap.mark(64);
        bitmap.mark(66);
        let mut mask = [0b11u64];
        assert_eq!(bitmap.clear(64, &mut mask), Ok(1));
        assert_eq!(mask, [0b01]);
        assert!(!bitmap.is_dirty(64));
        assert!(bitmap.is_dirty(66));
        assert_eq!(
            bitmap.clear(1, &mut [1]),
            Err(MemslotError::DirtyClearUnaligned(1))
        );
        assert_eq!(
            bitmap.clear(64, &mut [1, 1]),
            Err(MemslotError::DirtyClearOutOfRange {
                first_page: 64,
                npages: 128
            })
        );
    }

    #[test]
    fn small_buffer_is_refused() {
        let bitmap = DirtyBitmap::new(65, false);
        assert_eq!(
            bitmap.take(&mut [0]),
            Err(MemslotError::DirtyBufferTooSmall {
                needed: 2,
                given: 1
            })
        );
    }
}
