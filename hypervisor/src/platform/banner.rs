//! The boot banner's lines that describe the machine, formatted from what
//! the boot CPU learned (the device tree's GIC, the system-wide CPU
//! features, where the list registers are, the TLB maintenance in use).
//! The boot sequence logs each line as it is; only the text is made here.

use super::Platform;
use super::cpu_features::CpuFeatures;
use alloc::format;
use alloc::string::String;

/// Where the GIC's list registers are, as the banner says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListRegisterSource {
    /// This many `ICH_LR<n>_EL2` (the GICv3 system-register interface).
    SystemRegisters(u64),
    /// This many `GICH_LR<n>` of a GICv2's `GICH` frame.
    Gich(usize),
    /// None: no GICv3 CPU interface and no GICv2 driven.
    None,
}

/// `yes` or `no`.
fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The GIC the device tree describes: a GICv3's distributor and
/// redistributor regions, a GICv2's frames, or that there is none.
pub fn gic_line(platform: &Platform) -> String {
    match &platform.gic {
        Some(gic) => format!(
            "GICv3: distributor {:#x}, {} redistributor region(s) from {:#x}",
            gic.distributor.start,
            gic.redistributors.len(),
            gic.redistributors.first().map_or(0, |r| r.start)
        ),
        None => match &platform.gicv2 {
            Some(gic) => format!(
                "GICv2: distributor {:#x}, CPU interface {:#x}, GICH {}, GICV {}",
                gic.distributor.start,
                gic.cpu_interface.start,
                gic.hyp_interface
                    .map_or_else(|| "none".into(), |r| format!("{:#x}", r.start)),
                gic.virtual_cpu
                    .map_or_else(|| "none".into(), |r| format!("{:#x}", r.start)),
            ),
            None => String::from("GIC: no GICv3 or GICv2 in the device tree"),
        },
    }
}

/// The system-wide CPU features over `cpus_online` CPUs and the list
/// registers.
pub fn features_line(
    features: &CpuFeatures,
    cpus_online: usize,
    list_registers: ListRegisterSource,
) -> String {
    format!(
        "CPU: PA bits {}, VMID bits {}, FEAT_TLBIRANGE {}, VHE {}, FEAT_TTL {}, FEAT_S2FWB {}, FEAT_MTE2 {}, list registers {} (system-wide over {cpus_online} CPU(s))",
        features.pa_bits,
        features.vmid_bits,
        yes_no(features.tlbi_range),
        yes_no(features.vhe),
        yes_no(features.ttl),
        yes_no(features.fwb),
        yes_no(features.mte),
        match list_registers {
            ListRegisterSource::SystemRegisters(n) => format!("{n}"),
            ListRegisterSource::Gich(n) => format!("{n} (GICv2 GICH)"),
            ListRegisterSource::None => String::from("none (no GICv3 CPU interface)"),
        },
    )
}

/// How ranges of a VM's stage 2 are invalidated.
pub fn tlb_line(caps: tlb::TlbCaps) -> String {
    format!(
        "TLB maintenance: {}",
        if caps.range {
            "range invalidation (RIPAS2E1IS)"
        } else {
            "per-IPA, whole-VMID invalidation for ranges"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::ranges::PhysRange;
    use crate::platform::{Gicv2, Gicv3};
    use alloc::vec;

    fn platform(gic: Option<Gicv3>, gicv2: Option<Gicv2>) -> Platform {
        Platform {
            ram: vec![PhysRange::from_start_size(0x4000_0000, 1 << 30)],
            gic,
            gicv2,
            ..Platform::for_tests()
        }
    }

    #[test]
    fn the_gic_line_names_the_frames_of_either_gic() {
        let v3 = Gicv3 {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            redistributors: vec![PhysRange::from_start_size(0x080a_0000, 0xf6_0000)],
            maintenance_intid: Some(25),
            emulated_by_qemu: true,
            its: None,
        };
        assert_eq!(
            gic_line(&platform(Some(v3), None)),
            "GICv3: distributor 0x8000000, 1 redistributor region(s) from 0x80a0000"
        );
        let v2 = Gicv2 {
            distributor: PhysRange::from_start_size(0x0800_0000, 0x1_0000),
            cpu_interface: PhysRange::from_start_size(0x0801_0000, 0x1_0000),
            hyp_interface: Some(PhysRange::from_start_size(0x0803_0000, 0x1_0000)),
            virtual_cpu: None,
            maintenance_intid: None,
        };
        assert_eq!(
            gic_line(&platform(None, Some(v2))),
            "GICv2: distributor 0x8000000, CPU interface 0x8010000, GICH 0x8030000, GICV none"
        );
        assert_eq!(
            gic_line(&platform(None, None)),
            "GIC: no GICv3 or GICv2 in the device tree"
        );
    }

    #[test]
    fn the_features_line_says_where_the_list_registers_are() {
        let features = CpuFeatures {
            pa_bits: 40,
            vmid_bits: 16,
            vhe: true,
            ..CpuFeatures::NOTHING
        };
        let line = |lrs| features_line(&features, 4, lrs);
        assert_eq!(
            line(ListRegisterSource::SystemRegisters(4)),
            "CPU: PA bits 40, VMID bits 16, FEAT_TLBIRANGE no, VHE yes, FEAT_TTL no, FEAT_S2FWB no, FEAT_MTE2 no, list registers 4 (system-wide over 4 CPU(s))"
        );
        assert!(line(ListRegisterSource::Gich(4)).contains("list registers 4 (GICv2 GICH) ("));
        assert!(
            line(ListRegisterSource::None)
                .contains("list registers none (no GICv3 CPU interface) (")
        );
        assert_eq!(
            tlb_line(tlb::TlbCaps::ALL),
            "TLB maintenance: range invalidation (RIPAS2E1IS)"
        );
    }
}
