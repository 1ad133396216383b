//! The CPU itself: system register access and per-CPU data.

pub mod percpu;
pub mod sysreg;
