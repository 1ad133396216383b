//! Stage-2 translation decisions: classifying stage-2 faults and guest cache maintenance without FEAT_S2FWB.

pub mod cache_maint;
pub mod fault;
