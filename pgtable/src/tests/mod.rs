//! Tests of the operations: edge cases (`edges`), the model-based
//! property test (`model`) and the cache maintenance without FWB (`cmo`),
//! sharing a small harness.

#[cfg(not(loom))]
mod cmo;
mod edges;
mod model;
mod shared;

extern crate std;

use crate::{HostMemory, PageCache, Stage2Config, Stage2PageTable};
use std::sync::Arc;
use tlb::TlbCaps;

pub(crate) const RANGE_CAPS: TlbCaps = TlbCaps::ALL;
pub(crate) const NO_RANGE_CAPS: TlbCaps = TlbCaps::NO_RANGE;
pub(crate) const VMID: u16 = 7;

/// A table over checked host memory, and a cache.
pub(crate) struct Harness {
    pub(crate) mem: Arc<HostMemory>,
    pub(crate) table: Stage2PageTable<Arc<HostMemory>>,
    pub(crate) cache: PageCache,
}

impl Harness {
    pub(crate) fn new(ipa_bits: u32) -> Self {
        let mem = Arc::new(HostMemory::new());
        let config = Stage2Config::new(ipa_bits).expect("valid IPA size");
        let table = Stage2PageTable::new(config, mem.clone(), VMID, true).expect("root allocation");
        Self {
            mem,
            table,
            cache: PageCache::with_capacity(1024),
        }
    }

    pub(crate) fn fill_cache(&mut self, pages: usize) {
        self.cache.top_up(&*self.mem, pages).expect("host memory");
    }

    /// Live pages equal table pages reachable from the root plus the cache.
    pub(crate) fn assert_accounting(&self) {
        assert_eq!(
            self.mem.live_pages(),
            self.table.table_pages() + self.cache.len(),
            "live pages != reachable table pages + cached pages"
        );
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cache.release(&*self.mem);
    }
}
