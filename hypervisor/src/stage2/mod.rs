//! Stage-2 translation decisions: classifying stage-2 faults, counting TLB
//! maintenance and guest cache maintenance without FEAT_S2FWB.

pub mod cache_maint;
pub mod fault;
pub mod tlb_count;
