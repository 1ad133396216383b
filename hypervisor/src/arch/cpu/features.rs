//! The running CPU's own features, read from its ID registers (the decoding
//! is pure, in `crate::platform::cpu_features`).

use crate::platform::cpu_features::CpuFeatures;
use crate::read_sysreg;

/// The running CPU's own features, from its ID registers.
pub fn local_features() -> CpuFeatures {
    CpuFeatures::from_id_registers(
        read_sysreg!(id_aa64isar0_el1),
        read_sysreg!(id_aa64mmfr0_el1),
        read_sysreg!(id_aa64mmfr1_el1),
        read_sysreg!(id_aa64mmfr2_el1),
        read_sysreg!(id_aa64pfr0_el1),
        read_sysreg!(id_aa64pfr1_el1),
    )
}
