//! The CPU itself: system register access, the running CPU's features and
//! per-CPU data.

pub mod features;
pub mod memory_tagging;
pub mod percpu;
pub mod sysreg;
