//! The hypervisor's console UART: the `log` facade and guest output on the
//! host UART the device tree chose (a PL011 or a 16550-compatible, one of
//! this folder's drivers over an [`MmioBank`]).
//!
//! Log records become lines `[hv] <message>` (warnings and errors say so after
//! the prefix; the `virtio-drivers` crate's are shown from warnings up); once the hypervisor console runs, they and the other whole
//! lines of [`write_line`] go through it ([`route_lines`]), so that they
//! start a terminal line of their own. Guest output is written as the
//! hypervisor console (`crate::runtime::host_console`) passes it on. One lock
//! serialises writes so output from several CPUs never interleaves. The panic path
//! writes without the lock (another CPU may hold it forever) after giving it a
//! moment to come free.

use super::{AnyUart, MmioBank, Uart};
use crate::vocabulary::uart_kind::UartKind;
use core::fmt::Write;
use spin::{Mutex, Once};

static CONSOLE: Mutex<Option<AnyUart<MmioBank>>> = Mutex::new(None);
/// Where whole hypervisor lines go once the hypervisor console runs
/// ([`route_lines`]).
static LINE_ROUTE: Once<fn(&[u8])> = Once::new();
/// The console UART's base and kind, for the panic path.
static UART: Once<(usize, UartKind)> = Once::new();

struct Logger;

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        // The virtio driver crate's own info lines ("found a block device
        // of size ...") repeat what `drivers::host_disk` logs; its warnings
        // and errors still show.
        let limit = if metadata.target().starts_with("virtio_drivers") {
            log::Level::Warn
        } else {
            log::Level::Info
        };
        metadata.level() <= limit
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        write_line(format_args!(
            "[hv] {}{}",
            level_prefix(record.level()),
            record.args()
        ));
    }

    fn flush(&self) {}
}

static LOGGER: Logger = Logger;

/// What a log line of `level` says after the `[hv] ` prefix.
fn level_prefix(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "ERROR: ",
        log::Level::Warn => "WARNING: ",
        _ => "",
    }
}

/// Starts the console on the UART of `kind` at `base` and installs the logger.
///
/// # Safety
/// `base` must be the console UART's registers, of `kind`, accessible as
/// device memory, and nothing else may drive that UART.
pub unsafe fn init(base: usize, kind: UartKind) {
    // SAFETY: forwarded from the caller.
    let bank = unsafe { MmioBank::for_kind(base, kind) };
    *CONSOLE.lock() = Some(AnyUart::new(kind, bank));
    UART.call_once(|| (base, kind));
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Enables the console UART's receive interrupts.
pub fn enable_receive_interrupt() {
    if let Some(uart) = CONSOLE.lock().as_mut() {
        uart.enable_receive_interrupt();
    }
}

/// Reads received bytes into `buf` (up to its length; the rest stays in the
/// UART's FIFO) and returns how many were read.
pub fn receive(buf: &mut [u8]) -> usize {
    CONSOLE.lock().as_mut().map_or(0, |uart| uart.receive(buf))
}

/// Writes `bytes` as they are (`\n` becomes `\r\n`): the hypervisor
/// console's terminal output (`crate::arch::host_console`).
pub fn write_bytes(bytes: &[u8]) {
    let mut guard = CONSOLE.lock();
    if let Some(uart) = guard.as_mut() {
        uart.write_bytes(bytes);
    }
}

/// Writes `args` as one line on the console (without the `[hv] ` prefix):
/// through the route [`route_lines`] set, else straight to the UART.
pub fn write_line(args: core::fmt::Arguments<'_>) {
    if let Some(route) = LINE_ROUTE.get() {
        let mut line = alloc::string::String::new();
        // Formatting into a string only fails if an argument's `Display` does.
        let _ = writeln!(line, "{args}");
        route(line.as_bytes());
        return;
    }
    let mut guard = CONSOLE.lock();
    if let Some(uart) = guard.as_mut() {
        let _ = writeln!(uart, "{args}");
    }
}

/// From now on every line of [`write_line`] and of the logger goes to
/// `route` (the hypervisor console, which starts it on a terminal line of
/// its own), as whole bytes ending with `\n`. Once.
pub fn route_lines(route: fn(&[u8])) {
    LINE_ROUTE.call_once(|| route);
}

/// Waits (a bounded time) until the console UART has sent everything, e.g.
/// before the machine powers off. Gives up if the lock does not come free
/// within a short spin (the panic path powers off, and another CPU may hold
/// the lock forever).
pub fn flush() {
    for _ in 0..1_000_000 {
        if let Some(mut guard) = CONSOLE.try_lock() {
            if let Some(uart) = guard.as_mut() {
                uart.flush();
            }
            return;
        }
        core::hint::spin_loop();
    }
}

/// Writes a line for the panic path: takes the lock if it comes free within a
/// short spin, otherwise writes around it.
pub fn write_panic_line(args: core::fmt::Arguments<'_>) {
    for _ in 0..1_000_000 {
        if let Some(mut guard) = CONSOLE.try_lock() {
            if let Some(uart) = guard.as_mut() {
                let _ = writeln!(uart, "{args}");
            }
            return;
        }
        core::hint::spin_loop();
    }
    if let Some(&(base, kind)) = UART.get() {
        // SAFETY: `base` was the console UART of `kind` when the console
        // started; the lock holder is stuck, so this is the only writer that
        // makes progress.
        let bank = unsafe { MmioBank::for_kind(base, kind) };
        let mut uart = AnyUart::new(kind, bank);
        let _ = writeln!(uart, "{args}");
        uart.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;

    fn shown(target: &str, level: log::Level) -> bool {
        let metadata = log::Metadata::builder().target(target).level(level).build();
        Logger.enabled(&metadata)
    }

    #[test]
    fn the_hypervisor_logs_from_info_and_the_virtio_crate_from_warnings() {
        assert!(shown("hypervisor::runtime", log::Level::Info));
        assert!(!shown("hypervisor::runtime", log::Level::Debug));
        assert!(!shown("virtio_drivers::device::blk", log::Level::Info));
        assert!(shown("virtio_drivers::device::blk", log::Level::Warn));
        assert!(shown("virtio_drivers", log::Level::Error));
    }

    #[test]
    fn warnings_and_errors_say_so_after_the_prefix() {
        assert_eq!(level_prefix(log::Level::Error), "ERROR: ");
        assert_eq!(level_prefix(log::Level::Warn), "WARNING: ");
        assert_eq!(level_prefix(log::Level::Info), "");
    }
}
