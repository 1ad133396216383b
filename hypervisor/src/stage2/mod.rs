//! Stage-2 translation decisions: classifying stage-2 faults, fixing a fault on guest RAM under the MMU's read side, and guest cache maintenance without FEAT_S2FWB.

pub mod cache_maint;
pub mod fault;
