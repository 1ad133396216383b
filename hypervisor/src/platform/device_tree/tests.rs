//! Tests of the device-tree parser on QEMU's and real boards' trees and on
//! trees written for each case.

use super::*;
use vm_fdt::FdtWriter;

#[test]
fn qemu_virt_gicv2_dump() {
    // `-machine virt,gic-version=2,virtualization=on -smp 2`.
    let dtb = include_bytes!("../../../testdata/qemu-virt-gicv2-smp2.dtb");
    let p = Platform::from_dtb(dtb).expect("QEMU's tree is valid");
    assert_eq!(p.gic, None);
    let range = PhysRange::from_start_size;
    assert_eq!(
        p.gicv2,
        Some(Gicv2 {
            distributor: range(0x0800_0000, 0x1_0000),
            cpu_interface: range(0x0801_0000, 0x1_0000),
            hyp_interface: Some(range(0x0803_0000, 0x1_0000)),
            virtual_cpu: Some(range(0x0804_0000, 0x1_0000)),
            maintenance_intid: Some(25),
        })
    );
    assert_eq!(p.uart_intid, Some(33));
    assert_eq!(p.timer.map(|t| t.virt), Some(27));
    assert_eq!(p.cpus, vec![0, 1]);
}

#[test]
fn qemu_virt_dump() {
    let dtb = include_bytes!("../../../testdata/qemu-virt-smp4.dtb");
    let p = Platform::from_dtb(dtb).expect("QEMU's tree is valid");
    assert_eq!(
        p.ram,
        vec![PhysRange::from_start_size(0x4000_0000, 0x4000_0000)]
    );
    assert_eq!(p.uart, PhysRange::from_start_size(0x0900_0000, 0x1000));
    assert_eq!(p.uart_kind, UartKind::Pl011);
    assert!(
        p.uart_from_stdout_path,
        "QEMU virt sets stdout-path to its PL011"
    );
    assert_eq!(p.console_note, None);
    assert_eq!(p.uart_intid, Some(33), "QEMU virt's PL011 is SPI 1");
    assert_eq!(p.cpus, vec![0, 1, 2, 3]);
    assert_eq!(p.psci, PsciConduit::Smc);
    let gic = p.gic.clone().expect("gic-v3");
    assert_eq!(
        gic.distributor,
        PhysRange::from_start_size(0x0800_0000, 0x1_0000)
    );
    assert_eq!(
        gic.redistributors,
        vec![PhysRange::from_start_size(0x080a_0000, 0xf6_0000)]
    );
    assert_eq!(gic.maintenance_intid, Some(25), "PPI 9");
    assert!(gic.emulated_by_qemu, "the root is linux,dummy-virt");
    assert_eq!(
        gic.its,
        Some(PhysRange::from_start_size(0x0808_0000, 0x2_0000)),
        "QEMU virt's ITS"
    );
    assert_eq!(p.gicv2, None);
    assert_eq!(
        p.timer,
        Some(TimerIrqs {
            secure_phys: 29,
            phys: 30,
            virt: 27,
            hyp_phys: 26
        })
    );
    assert_eq!(p.initrd, None);
    assert_eq!(p.ram_bytes(), 1 << 30);
    assert_eq!(p.dtb_size, dtb.len() as u64);
}

fn tree(psci_method: &str, initrd: Option<(u64, u64)>, with_uart: bool) -> Vec<u8> {
    let mut w =
        FdtWriter::new_with_mem_reserv(&[
            vm_fdt::FdtReserveEntry::new(0x8000_0000, 0x1000).expect("entry")
        ])
        .expect("writer");
    let root = w.begin_node("").expect("root");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 2).expect("p");
    w.property_string("model", "test board").expect("p");
    for (name, base) in [
        ("memory@80000000", 0x8000_0000u64),
        ("memory@100000000", 0x1_0000_0000),
    ] {
        let m = w.begin_node(name).expect("node");
        w.property_string("device_type", "memory").expect("p");
        w.property_array_u64("reg", &[base, 0x1000_0000])
            .expect("p");
        w.end_node(m).expect("end");
    }
    let rm = w.begin_node("reserved-memory").expect("node");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 2).expect("p");
    let fw = w.begin_node("fw@88000000").expect("node");
    w.property_array_u64("reg", &[0x8800_0000, 0x10_0000])
        .expect("p");
    w.property_null("no-map").expect("p");
    w.end_node(fw).expect("end");
    let pool = w.begin_node("pool@89000000").expect("node");
    w.property_array_u64("reg", &[0x8900_0000, 0x1000])
        .expect("p");
    w.end_node(pool).expect("end");
    w.end_node(rm).expect("end");
    let chosen = w.begin_node("chosen").expect("node");
    if with_uart {
        w.property_string("stdout-path", "/serial@2000:115200n8")
            .expect("p");
    }
    if let Some((start, end)) = initrd {
        w.property_u64("linux,initrd-start", start).expect("p");
        w.property_u32("linux,initrd-end", end as u32).expect("p");
    }
    w.end_node(chosen).expect("end");
    for (name, base) in [("serial@1000", 0x1000u64), ("serial@2000", 0x2000)] {
        if !with_uart {
            break;
        }
        let s = w.begin_node(name).expect("node");
        w.property_string_list(
            "compatible",
            vec!["arm,pl011".into(), "arm,primecell".into()],
        )
        .expect("p");
        w.property_array_u64("reg", &[base, 0x1000]).expect("p");
        w.end_node(s).expect("end");
    }
    let cpus = w.begin_node("cpus").expect("node");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 0).expect("p");
    for mpidr in [0x0u64, 0x100] {
        let c = w.begin_node(&format!("cpu@{mpidr:x}")).expect("node");
        w.property_string("device_type", "cpu").expect("p");
        w.property_u64("reg", mpidr).expect("p");
        w.end_node(c).expect("end");
    }
    w.end_node(cpus).expect("end");
    let psci = w.begin_node("psci").expect("node");
    w.property_string("method", psci_method).expect("p");
    w.end_node(psci).expect("end");
    w.end_node(root).expect("end");
    w.finish().expect("finish")
}

/// Writes `/cpus` with one CPU (MPIDR 0) and a `/psci` node with the
/// `smc` method, which every test board tree needs.
fn one_cpu_and_smc_psci(w: &mut FdtWriter) {
    let cpus = w.begin_node("cpus").expect("node");
    w.property_u32("#address-cells", 1).expect("p");
    w.property_u32("#size-cells", 0).expect("p");
    let c = w.begin_node("cpu@0").expect("node");
    w.property_string("device_type", "cpu").expect("p");
    w.property_u32("reg", 0).expect("p");
    w.end_node(c).expect("end");
    w.end_node(cpus).expect("end");
    let psci = w.begin_node("psci").expect("node");
    w.property_string("method", "smc").expect("p");
    w.end_node(psci).expect("end");
}

/// A board tree whose GIC has `cells` interrupt cells, named as the
/// interrupt parent by the root, and a timer node using them.
fn timer_tree(cells: u32) -> Vec<u8> {
    let mut w = FdtWriter::new().expect("writer");
    let root = w.begin_node("").expect("root");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 2).expect("p");
    w.property_u32("interrupt-parent", 1).expect("p");
    let m = w.begin_node("memory@80000000").expect("node");
    w.property_string("device_type", "memory").expect("p");
    w.property_array_u64("reg", &[0x8000_0000, 0x1000_0000])
        .expect("p");
    w.end_node(m).expect("end");
    let gic = w.begin_node("interrupt-controller@fe600000").expect("node");
    w.property_string("compatible", "arm,gic-v3").expect("p");
    w.property_null("interrupt-controller").expect("p");
    w.property_u32("#interrupt-cells", cells).expect("p");
    w.property_u32("phandle", 1).expect("p");
    w.property_array_u64("reg", &[0xfe60_0000, 0x1_0000, 0xfe68_0000, 0x10_0000])
        .expect("p");
    w.end_node(gic).expect("end");
    let timer = w.begin_node("timer").expect("node");
    w.property_string("compatible", "arm,armv8-timer")
        .expect("p");
    let mut interrupts = Vec::new();
    for ppi in [13, 14, 11, 10] {
        interrupts.extend([1, ppi, 4]);
        if cells == 4 {
            interrupts.push(0); // the PPI partition: all CPUs
        }
    }
    w.property_array_u32("interrupts", &interrupts).expect("p");
    w.end_node(timer).expect("end");
    let serial = w.begin_node("serial@1000").expect("node");
    w.property_string("compatible", "arm,pl011").expect("p");
    w.property_array_u64("reg", &[0x1000, 0x1000]).expect("p");
    w.end_node(serial).expect("end");
    one_cpu_and_smc_psci(&mut w);
    w.end_node(root).expect("end");
    w.finish().expect("finish")
}

#[test]
fn timer_ppis_are_read_with_the_interrupt_parents_cell_count() {
    for cells in [3, 4] {
        let p = Platform::from_dtb(&timer_tree(cells)).expect("valid");
        let timer = p.timer.expect("timer node read");
        assert_eq!(
            (timer.secure_phys, timer.phys, timer.virt, timer.hyp_phys),
            (29, 30, 27, 26),
            "#interrupt-cells {cells}"
        );
        let gic = p.gic.expect("gic-v3");
        assert!(!gic.emulated_by_qemu, "a board's GICv3 is not QEMU's");
    }
}

#[test]
fn board_tree() {
    let p =
        Platform::from_dtb(&tree("smc", Some((0x9000_0000, 0x9010_0000)), true)).expect("valid");
    assert_eq!(p.model, "test board");
    assert_eq!(p.ram.len(), 2);
    assert_eq!(
        p.reserved,
        vec![
            PhysRange::from_start_size(0x8000_0000, 0x1000),
            PhysRange::from_start_size(0x8800_0000, 0x10_0000),
            PhysRange::from_start_size(0x8900_0000, 0x1000)
        ]
    );
    assert_eq!(
        p.no_map,
        vec![PhysRange::from_start_size(0x8800_0000, 0x10_0000)]
    );
    assert_eq!(
        p.uart.start, 0x2000,
        "stdout-path wins over the first PL011"
    );
    assert_eq!(p.cpus, vec![0, 0x100]);
    assert_eq!(
        p.initrd,
        Some(PhysRange {
            start: 0x9000_0000,
            end: 0x9010_0000
        })
    );
    assert_eq!(p.gic, None);
}

#[test]
fn errors() {
    assert_eq!(
        Platform::from_dtb(&tree("hvc", None, true)).map(|p| p.psci),
        Ok(PsciConduit::Hvc)
    );
    assert_eq!(
        Platform::from_dtb(&tree("spi", None, true)),
        Err(PlatformError::BadPsciMethod("spi".into()))
    );
    assert_eq!(
        Platform::from_dtb(&tree("smc", None, false)),
        Err(PlatformError::NoUart)
    );
    assert!(matches!(
        Platform::from_dtb(&[0u8; 64]),
        Err(PlatformError::BadDeviceTree(_))
    ));
}

/// A UART node for [`console_tree`].
struct UartNode {
    name: &'static str,
    compatible: &'static [&'static str],
    status: Option<&'static str>,
    reg_shift: Option<u32>,
    reg_io_width: Option<u32>,
}

fn uart(name: &'static str, compatible: &'static [&'static str]) -> UartNode {
    UartNode {
        name,
        compatible,
        status: None,
        reg_shift: None,
        reg_io_width: None,
    }
}

/// A minimal board: RAM, one CPU, PSCI, `/aliases`, `/chosen` with the
/// given stdout property, and the UARTs (each at its unit address, SPI 7).
fn console_tree(
    stdout: Option<(&str, &str)>,
    aliases: &[(&str, &str)],
    uarts: &[UartNode],
) -> Vec<u8> {
    let mut w = FdtWriter::new().expect("writer");
    let root = w.begin_node("").expect("root");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 2).expect("p");
    let m = w.begin_node("memory@80000000").expect("node");
    w.property_string("device_type", "memory").expect("p");
    w.property_array_u64("reg", &[0x8000_0000, 0x1000_0000])
        .expect("p");
    w.end_node(m).expect("end");
    let a = w.begin_node("aliases").expect("node");
    for (alias, path) in aliases {
        w.property_string(alias, path).expect("p");
    }
    w.end_node(a).expect("end");
    let chosen = w.begin_node("chosen").expect("node");
    if let Some((prop, value)) = stdout {
        w.property_string(prop, value).expect("p");
    }
    w.end_node(chosen).expect("end");
    for u in uarts {
        let base = u64::from_str_radix(u.name.split('@').nth(1).expect("unit"), 16)
            .expect("hex unit address");
        let n = w.begin_node(u.name).expect("node");
        w.property_string_list(
            "compatible",
            u.compatible.iter().map(|c| c.to_string()).collect(),
        )
        .expect("p");
        w.property_array_u64("reg", &[base, 0x100]).expect("p");
        w.property_array_u32("interrupts", &[0, 7, 4]).expect("p");
        if let Some(status) = u.status {
            w.property_string("status", status).expect("p");
        }
        if let Some(shift) = u.reg_shift {
            w.property_u32("reg-shift", shift).expect("p");
        }
        if let Some(width) = u.reg_io_width {
            w.property_u32("reg-io-width", width).expect("p");
        }
        w.end_node(n).expect("end");
    }
    one_cpu_and_smc_psci(&mut w);
    w.end_node(root).expect("end");
    w.finish().expect("finish")
}

const DW: UartKind = UartKind::Ns16550 {
    reg_shift: 2,
    io_width: IoWidth::U32,
};

fn rk3588_uart2() -> UartNode {
    UartNode {
        reg_shift: Some(2),
        reg_io_width: Some(4),
        ..uart(
            "serial@feb50000",
            &["rockchip,rk3588-uart", "snps,dw-apb-uart"],
        )
    }
}

#[test]
fn stdout_path_alias_with_options_picks_a_designware_uart() {
    let dtb = console_tree(
        Some(("stdout-path", "serial2:1500000n8")),
        &[("serial2", "/serial@feb50000")],
        &[
            uart("serial@9000000", &["arm,pl011", "arm,primecell"]),
            rk3588_uart2(),
        ],
    );
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart, PhysRange::from_start_size(0xfeb5_0000, 0x100));
    assert_eq!(p.uart_kind, DW);
    assert!(p.uart_from_stdout_path);
    assert_eq!(p.console_note, None);
    assert_eq!(p.uart_intid, Some(39));
}

#[test]
fn stdout_path_absolute_and_legacy_property() {
    let uarts = [uart("serial@1000", &["ns16550a"]), rk3588_uart2()];
    let absolute = console_tree(Some(("stdout-path", "/serial@feb50000")), &[], &uarts);
    assert_eq!(Platform::from_dtb(&absolute).expect("valid").uart_kind, DW);
    let legacy = console_tree(Some(("linux,stdout-path", "/serial@feb50000")), &[], &uarts);
    let p = Platform::from_dtb(&legacy).expect("valid");
    assert_eq!((p.uart.start, p.uart_from_stdout_path), (0xfeb5_0000, true));
}

#[test]
fn no_stdout_path_takes_the_first_usable_uart() {
    let dtb = console_tree(
        None,
        &[],
        &[
            uart("serial@1000", &["vendor,unknown-uart"]),
            UartNode {
                status: Some("disabled"),
                ..uart("serial@2000", &["arm,pl011"])
            },
            UartNode {
                status: Some("okay"),
                ..uart("serial@3000", &["ns16550a"])
            },
            uart("serial@4000", &["arm,pl011"]),
        ],
    );
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart.start, 0x3000);
    assert_eq!(
        p.uart_kind,
        UartKind::Ns16550 {
            reg_shift: 0,
            io_width: IoWidth::U8
        },
        "reg-shift 0 and 1-byte access without the properties"
    );
    assert!(!p.uart_from_stdout_path);
    assert_eq!(p.console_note, None);
}

#[test]
fn unusable_stdout_path_falls_back_with_a_note() {
    let fallback = uart("serial@4000", &["ns16550"]);
    let cases: [(&str, UartNode, &str); 4] = [
        (
            "serial0:115200n8",
            UartNode {
                status: Some("disabled"),
                ..rk3588_uart2()
            },
            "stdout-path \"serial0:115200n8\" is not usable: status \"disabled\"",
        ),
        (
            "serial0",
            uart("serial@feb50000", &["vendor,unknown-uart"]),
            "stdout-path \"serial0\" is not usable: no supported compatible in [\"vendor,unknown-uart\"]",
        ),
        (
            "serial0",
            UartNode {
                reg_io_width: Some(3),
                ..rk3588_uart2()
            },
            "stdout-path \"serial0\" is not usable: reg-io-width other than 1, 2 or 4",
        ),
        (
            "serial9",
            rk3588_uart2(),
            "stdout-path \"serial9\" names no node",
        ),
    ];
    for (stdout, named, note) in cases {
        let dtb = console_tree(
            Some(("stdout-path", stdout)),
            &[("serial0", "/serial@feb50000")],
            &[uart(fallback.name, fallback.compatible), named],
        );
        let p = Platform::from_dtb(&dtb).expect("valid");
        assert_eq!(p.uart.start, 0x4000, "{stdout}");
        assert!(!p.uart_from_stdout_path);
        assert_eq!(p.console_note.as_deref(), Some(note));
    }
}

#[test]
fn no_usable_uart_is_an_error() {
    let dtb = console_tree(
        Some(("stdout-path", "serial0")),
        &[("serial0", "/serial@1000")],
        &[
            UartNode {
                status: Some("disabled"),
                ..uart("serial@1000", &["arm,pl011"])
            },
            UartNode {
                reg_shift: Some(3),
                ..uart("serial@2000", &["snps,dw-apb-uart"])
            },
            uart("serial@3000", &["vendor,unknown-uart"]),
        ],
    );
    assert_eq!(Platform::from_dtb(&dtb), Err(PlatformError::NoUart));
}

use crate::platform::dt_translate::tests::PI4_SOC_RANGES;

/// A tree shaped like the Raspberry Pi 4's (values from bcm2711.dtsi and
/// bcm2711-rpi-4-b.dts): root `#address-cells = <2>`, `#size-cells =
/// <1>`; `/soc` with `#address-cells = <1>` and `soc_ranges` (`None`: no
/// `ranges` property, `Some(&[])`: `ranges;`) holding the PL011 (uart0),
/// the mini UART (uart1) and the GIC-400, plus what `extra` adds inside
/// `/soc`; aliases `serial0`/`serial1` and `stdout-path = stdout`.
fn pi4_tree(
    stdout: &str,
    soc_ranges: Option<&[u32]>,
    extra: impl FnOnce(&mut FdtWriter),
) -> Vec<u8> {
    let mut w = FdtWriter::new().expect("writer");
    let root = w.begin_node("").expect("root");
    w.property_string("model", "Raspberry Pi 4 Model B")
        .expect("p");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 1).expect("p");
    w.property_u32("interrupt-parent", 1).expect("p");
    let m = w.begin_node("memory@0").expect("node");
    w.property_string("device_type", "memory").expect("p");
    w.property_array_u32("reg", &[0, 0, 0x3b40_0000])
        .expect("p");
    w.end_node(m).expect("end");
    let a = w.begin_node("aliases").expect("node");
    w.property_string("serial0", "/soc/serial@7e201000")
        .expect("p");
    w.property_string("serial1", "/soc/serial@7e215040")
        .expect("p");
    w.end_node(a).expect("end");
    let chosen = w.begin_node("chosen").expect("node");
    w.property_string("stdout-path", stdout).expect("p");
    w.end_node(chosen).expect("end");
    let soc = w.begin_node("soc").expect("node");
    w.property_string("compatible", "simple-bus").expect("p");
    w.property_u32("#address-cells", 1).expect("p");
    w.property_u32("#size-cells", 1).expect("p");
    match soc_ranges {
        Some([]) => w.property_null("ranges").expect("p"),
        Some(r) => w.property_array_u32("ranges", r).expect("p"),
        None => {}
    }
    let pl011 = w.begin_node("serial@7e201000").expect("node");
    w.property_string_list(
        "compatible",
        vec!["arm,pl011".into(), "arm,primecell".into()],
    )
    .expect("p");
    w.property_array_u32("reg", &[0x7e20_1000, 0x200])
        .expect("p");
    w.property_array_u32("interrupts", &[0, 121, 4]).expect("p");
    w.end_node(pl011).expect("end");
    let aux = w.begin_node("serial@7e215040").expect("node");
    w.property_string("compatible", "brcm,bcm2835-aux-uart")
        .expect("p");
    w.property_array_u32("reg", &[0x7e21_5040, 0x40])
        .expect("p");
    w.property_array_u32("interrupts", &[0, 93, 4]).expect("p");
    w.end_node(aux).expect("end");
    let gic = w.begin_node("interrupt-controller@40041000").expect("node");
    w.property_string("compatible", "arm,gic-400").expect("p");
    w.property_null("interrupt-controller").expect("p");
    w.property_u32("#interrupt-cells", 3).expect("p");
    w.property_u32("phandle", 1).expect("p");
    w.property_array_u32(
        "reg",
        &[
            0x4004_1000,
            0x1000,
            0x4004_2000,
            0x2000,
            0x4004_4000,
            0x2000,
            0x4004_6000,
            0x2000,
        ],
    )
    .expect("p");
    w.property_array_u32("interrupts", &[1, 9, 0xf04])
        .expect("p");
    w.end_node(gic).expect("end");
    extra(&mut w);
    w.end_node(soc).expect("end");
    let cpus = w.begin_node("cpus").expect("node");
    w.property_u32("#address-cells", 1).expect("p");
    w.property_u32("#size-cells", 0).expect("p");
    for mpidr in 0..4 {
        let c = w.begin_node(&format!("cpu@{mpidr}")).expect("node");
        w.property_string("device_type", "cpu").expect("p");
        w.property_u32("reg", mpidr).expect("p");
        w.end_node(c).expect("end");
    }
    w.end_node(cpus).expect("end");
    let psci = w.begin_node("psci").expect("node");
    w.property_string("method", "smc").expect("p");
    w.end_node(psci).expect("end");
    w.end_node(root).expect("end");
    w.finish().expect("finish")
}

const MINI_UART: UartKind = UartKind::Ns16550 {
    reg_shift: 2,
    io_width: IoWidth::U32,
};

#[test]
fn pi4_mini_uart_and_gic400_through_soc_ranges() {
    let dtb = pi4_tree("serial1:115200n8", Some(&PI4_SOC_RANGES), |_| {});
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart, PhysRange::from_start_size(0xfe21_5040, 0x40));
    assert_eq!(p.uart_kind, MINI_UART);
    assert!(p.uart_from_stdout_path);
    assert_eq!(p.console_note, None);
    assert_eq!(p.uart_intid, Some(32 + 93));
    let range = PhysRange::from_start_size;
    assert_eq!(
        p.gicv2,
        Some(Gicv2 {
            distributor: range(0xff84_1000, 0x1000),
            cpu_interface: range(0xff84_2000, 0x2000),
            hyp_interface: Some(range(0xff84_4000, 0x2000)),
            virtual_cpu: Some(range(0xff84_6000, 0x2000)),
            maintenance_intid: Some(25),
        })
    );
    assert_eq!(
        p.ram,
        vec![range(0, 0x3b40_0000)],
        "memory is not translated"
    );
    assert_eq!(p.cpus, vec![0, 1, 2, 3]);
}

#[test]
fn pi4_pl011_with_disable_bt() {
    let dtb = pi4_tree("serial0:115200n8", Some(&PI4_SOC_RANGES), |_| {});
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart, PhysRange::from_start_size(0xfe20_1000, 0x200));
    assert_eq!(p.uart_kind, UartKind::Pl011);
    assert_eq!(p.uart_intid, Some(32 + 121));
}

#[test]
fn identity_ranges_keeps_bus_addresses() {
    let dtb = pi4_tree("serial1", Some(&[]), |_| {});
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart.start, 0x7e21_5040);
    assert_eq!(p.gicv2.map(|g| g.distributor.start), Some(0x4004_1000));
}

#[test]
fn nested_bus_translates_through_both_ranges() {
    // A bus inside /soc mapping its 0x0 to the soc's 0x7e21_5000, with a
    // mini UART at its 0x40 that stdout-path names by path.
    let dtb = pi4_tree("/soc/aux@7e215000/serial@40", Some(&PI4_SOC_RANGES), |w| {
        let bus = w.begin_node("aux@7e215000").expect("node");
        w.property_u32("#address-cells", 1).expect("p");
        w.property_u32("#size-cells", 1).expect("p");
        w.property_array_u32("ranges", &[0x0, 0x7e21_5000, 0x100])
            .expect("p");
        let s = w.begin_node("serial@40").expect("node");
        w.property_string("compatible", "brcm,bcm2835-aux-uart")
            .expect("p");
        w.property_array_u32("reg", &[0x40, 0x40]).expect("p");
        w.end_node(s).expect("end");
        w.end_node(bus).expect("end");
    });
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert!(p.uart_from_stdout_path);
    assert_eq!(p.uart, PhysRange::from_start_size(0xfe21_5040, 0x40));
}

#[test]
fn untranslatable_uart_is_passed_over_with_the_reason() {
    // A mini UART at a bus address no /soc range holds: the console falls
    // back to the PL011 and says why.
    let dtb = pi4_tree("/soc/serial@1000", Some(&PI4_SOC_RANGES), |w| {
        let s = w.begin_node("serial@1000").expect("node");
        w.property_string("compatible", "brcm,bcm2835-aux-uart")
            .expect("p");
        w.property_array_u32("reg", &[0x1000, 0x40]).expect("p");
        w.end_node(s).expect("end");
    });
    let p = Platform::from_dtb(&dtb).expect("valid");
    assert_eq!(p.uart.start, 0xfe20_1000);
    assert!(!p.uart_from_stdout_path);
    assert_eq!(
        p.console_note.as_deref(),
        Some(
            "stdout-path \"/soc/serial@1000\" is not usable: device address not \
             translatable: serial@1000/reg: 0x1000 is outside every range of bus soc"
        )
    );
}

#[test]
fn soc_without_ranges_is_an_error_for_the_gic() {
    let dtb = pi4_tree("serial1", None, |_| {});
    assert_eq!(
        Platform::from_dtb(&dtb),
        Err(PlatformError::NoUart),
        "no UART under /soc translates"
    );
    // With a UART at the root the GIC is what fails, with a clear error.
    let dtb = console_tree_with_closed_bus_gic();
    assert_eq!(
        Platform::from_dtb(&dtb),
        Err(PlatformError::Untranslatable(
            "interrupt-controller@40041000/reg: bus soc has no ranges (not translatable)".into()
        ))
    );
}

/// A board with a PL011 at the root and a GIC-400 under a `/soc` that has
/// no `ranges`.
fn console_tree_with_closed_bus_gic() -> Vec<u8> {
    let mut w = FdtWriter::new().expect("writer");
    let root = w.begin_node("").expect("root");
    w.property_u32("#address-cells", 2).expect("p");
    w.property_u32("#size-cells", 1).expect("p");
    let m = w.begin_node("memory@0").expect("node");
    w.property_string("device_type", "memory").expect("p");
    w.property_array_u32("reg", &[0, 0, 0x3b40_0000])
        .expect("p");
    w.end_node(m).expect("end");
    let s = w.begin_node("serial@fe201000").expect("node");
    w.property_string("compatible", "arm,pl011").expect("p");
    w.property_array_u32("reg", &[0, 0xfe20_1000, 0x200])
        .expect("p");
    w.end_node(s).expect("end");
    let soc = w.begin_node("soc").expect("node");
    w.property_u32("#address-cells", 1).expect("p");
    w.property_u32("#size-cells", 1).expect("p");
    let gic = w.begin_node("interrupt-controller@40041000").expect("node");
    w.property_string("compatible", "arm,gic-400").expect("p");
    w.property_array_u32("reg", &[0x4004_1000, 0x1000, 0x4004_2000, 0x2000])
        .expect("p");
    w.end_node(gic).expect("end");
    w.end_node(soc).expect("end");
    one_cpu_and_smc_psci(&mut w);
    w.end_node(root).expect("end");
    w.finish().expect("finish")
}
