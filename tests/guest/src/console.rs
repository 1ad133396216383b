//! Console on the PL011 named by the device tree, shared by all vCPUs.
//!
//! Output is polled (wait while the transmit FIFO is full, write the data
//! register). The hypervisor buffers the guest's UART per VM, not per vCPU, so
//! whole lines are written under one lock. The lock records its owner's CPU
//! index: an exception or panic on a vCPU that already holds it prints anyway
//! instead of deadlocking.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::smp;

/// PL011 data register offset.
const UARTDR: u64 = 0x00;
/// PL011 flag register offset and its "transmit FIFO full" bit.
const UARTFR: u64 = 0x18;
const UARTFR_TXFF: u32 = 1 << 5;
/// The flag register's "receive FIFO empty" bit.
const UARTFR_RXFE: u32 = 1 << 4;

static UART_BASE: AtomicU64 = AtomicU64::new(0);
/// 0 when free, else the owner's CPU index + 1.
static LOCK_OWNER: AtomicUsize = AtomicUsize::new(0);

/// Starts using the PL011 at `base`.
pub fn init(base: u64) {
    UART_BASE.store(base, Ordering::Release);
}

struct Uart(u64);

impl Uart {
    fn put(&self, byte: u8) {
        // SAFETY: `self.0` is the PL011 from the device tree, mapped as device
        // memory; polling FR and writing DR are the documented way to send.
        unsafe {
            while core::ptr::read_volatile((self.0 + UARTFR) as *const u32) & UARTFR_TXFF != 0 {}
            core::ptr::write_volatile((self.0 + UARTDR) as *mut u32, u32::from(byte));
        }
    }
}

impl Write for Uart {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for byte in text.bytes() {
            self.put(byte);
        }
        Ok(())
    }
}

/// Takes one received byte, if the receive FIFO holds one (polled: the
/// receive interrupt is not used).
pub fn read_byte() -> Option<u8> {
    let base = UART_BASE.load(Ordering::Acquire);
    if base == 0 {
        return None;
    }
    // SAFETY: `base` is the PL011 from the device tree, mapped as device
    // memory; reading DR while FR.RXFE is clear takes one received byte.
    unsafe {
        if core::ptr::read_volatile((base + UARTFR) as *const u32) & UARTFR_RXFE != 0 {
            return None;
        }
        Some(core::ptr::read_volatile((base + UARTDR) as *const u32) as u8)
    }
}

/// Writes one line (a newline is added) under the console lock.
pub fn line(args: fmt::Arguments<'_>) {
    let base = UART_BASE.load(Ordering::Acquire);
    if base == 0 {
        return;
    }
    let me = smp::current_cpu() + 1;
    let reentered = LOCK_OWNER.load(Ordering::Relaxed) == me;
    if !reentered {
        while LOCK_OWNER
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
    }
    let mut uart = Uart(base);
    // Writing to the UART cannot fail; a formatting error of an argument only
    // shortens the line.
    let _ = uart.write_fmt(args);
    uart.put(b'\n');
    if !reentered {
        LOCK_OWNER.store(0, Ordering::Release);
    }
}

/// Writes one line from a failure path (exception or panic), after moving to
/// a fresh line in case the failure interrupted one.
pub fn emergency_line(args: fmt::Arguments<'_>) {
    let base = UART_BASE.load(Ordering::Acquire);
    if base != 0 && LOCK_OWNER.load(Ordering::Relaxed) == smp::current_cpu() + 1 {
        Uart(base).put(b'\n');
    }
    line(args);
}

/// Prints one line to the guest console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::console::line(format_args!($($arg)*))
    };
}
