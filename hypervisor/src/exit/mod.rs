//! Exit handling decisions: decoding exception syndromes and answering the
//! guest's traps (MMIO, hypervisor and secure-monitor calls, PSCI, system
//! register accesses, AArch32 conditions) and injecting exceptions into it.

pub mod aarch32;
pub mod esr;
pub mod hypercall;
pub mod inject;
pub mod mmio;
pub mod psci;
pub mod sysreg;
