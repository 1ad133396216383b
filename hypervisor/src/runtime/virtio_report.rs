//! A VM's virtio devices as the monitor's `devices VM` shows them: one line
//! per device, fields without spaces (a test splits on whitespace): index,
//! kind, window, SPI, status bits by name, negotiated features, then the
//! device's counters as `name=value` joined with `,` (for net the MAC,
//! network, switch port and frames in, out and dropped; for blk the host
//! disk, its window, read-only, requests, bytes and errors; for a console
//! bytes in, out and dropped; for every device its ring and access errors).

use crate::runtime::Hardware;
use crate::runtime::virtio_devices::{
    DeviceCounters, Transport, VirtioDevice, feature_names, status_names,
};
use crate::runtime::vm_instance::Vm;
use alloc::format;
use alloc::string::String;
use core::fmt::Write;
use core::sync::atomic::Ordering;

/// `devices VM`'s line of device `index` of `vm`.
pub fn device_line<H: Hardware>(vm: &Vm<H>, index: usize, device: &VirtioDevice) -> String {
    let transport = device.transport.lock();
    let status = transport.status();
    let features = transport.driver_features();
    let counters = transport.counters();
    let ring_errors = transport.ring_errors();
    let access_errors = transport.access_errors();
    let mac = match &*transport {
        Transport::Net(t) => t.device().mac(),
        _ => [0; 6],
    };
    drop(transport);
    let mut fields = String::new();
    match counters {
        DeviceCounters::Net(c) => {
            let port = device.port();
            let switch = vm.device_hub.switch();
            let ports = port.and_then(|p| switch.counters(p)).unwrap_or_default();
            let network = device.net.as_ref().map_or("-", |n| n.network.as_str());
            let _ = write!(
                fields,
                "mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x},network={network},port={},\
                 tx_frames={},tx_bytes={},tx_dropped={},rx_frames={},rx_bytes={},\
                 rx_dropped={},rx_not_running={}",
                mac[0],
                mac[1],
                mac[2],
                mac[3],
                mac[4],
                mac[5],
                port.map_or_else(|| String::from("-"), |p| format!("{p}")),
                c.tx_frames,
                c.tx_bytes,
                c.tx_dropped + ports.dropped_sent,
                c.rx_frames,
                c.rx_bytes,
                c.rx_no_buffer + c.rx_too_big + c.rx_not_ready,
                device.rx_dropped_not_running.load(Ordering::Relaxed) + ports.dropped_stopped,
            );
        }
        DeviceCounters::Blk(c) => {
            let disk = device.disk.unwrap_or_default();
            let _ = write!(
                fields,
                "disk={},start={},sectors={},ro={},reads={},writes={},read_bytes={},\
                 write_bytes={},flushes={},errors={},unsupported={}",
                disk.host,
                disk.start_sector,
                disk.sectors
                    .map_or_else(|| String::from("all"), |s| format!("{s}")),
                u8::from(disk.read_only),
                c.reads,
                c.writes,
                c.read_bytes,
                c.write_bytes,
                c.flushes,
                c.errors,
                c.unsupported,
            );
        }
        DeviceCounters::Console(c) => {
            let _ = write!(
                fields,
                "out_bytes={},in_bytes={},in_dropped={},out_dropped={}",
                c.output_bytes, c.input_bytes, c.input_dropped, c.output_dropped,
            );
        }
    }
    let _ = write!(
        fields,
        ",ring_errors={ring_errors},needs_reset={},access_errors={access_errors}",
        device.needs_reset_count.load(Ordering::Relaxed)
    );
    format!(
        "{index:<3} {:<8} {:<21} {:<4} {:<40} {:<26} {fields}",
        device.role.name(),
        format!("{:#010x}+{:#x}", device.window.start, device.window.size()),
        device.spi,
        status_names(status),
        if features == 0 {
            String::from("-")
        } else {
            feature_names(features)
        },
    )
}
