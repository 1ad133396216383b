//! The guest-facing description of a VM: its physical address layout, the
//! device tree it boots with, its vCPUs' power states, its run state (the
//! console monitor's pause and stop), its restart protocol (`lifecycle`),
//! its counters and its event log, the MSIs of its passed PCIe devices
//! (`msi_shadow`), and its RAM zeroed on first use (`lazy_zero`).

pub mod counters;
pub mod device_tree;
pub mod event_log;
pub mod exit_profile;
pub mod layout;
pub mod lazy_zero;
pub mod lifecycle;
pub mod migration_plan;
pub mod msi_shadow;
pub mod passthrough;
pub mod power;
pub mod run_state;
pub mod vcpu_state;
