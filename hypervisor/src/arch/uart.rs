//! Polled driver for the host's PL011, the hypervisor's console.
//!
//! Transmit: wait while the TX FIFO is full (`FR.TXFF`), then write `DR`.
//! Receive: the receive and receive-timeout interrupts can be enabled
//! (`IMSC.RXIM | RTIM`); [`Pl011Uart::receive`] reads `DR` while the RX FIFO is
//! not empty (`FR.RXFE` clear), then clears both interrupts (`ICR`).
//! The firmware's baud-rate setup is kept; the UART and its transmitter and
//! receiver are enabled if they are not yet.

use core::ptr::{read_volatile, write_volatile};

const DR: usize = 0x00;
const FR: usize = 0x18;
const CR: usize = 0x30;
const IMSC: usize = 0x38;
const ICR: usize = 0x44;
const FR_TXFF: u32 = 1 << 5;
const FR_RXFE: u32 = 1 << 4;
const CR_UARTEN_TXE: u32 = 0x101;
const CR_RXE: u32 = 0x200;
/// `RXIM | RTIM` in `IMSC`/`ICR`.
const INT_RX_RT: u32 = (1 << 4) | (1 << 6);

/// A PL011 at a fixed MMIO address.
pub struct Pl011Uart {
    base: usize,
}

impl Pl011Uart {
    /// A driver for the PL011 whose registers are at `base`.
    ///
    /// # Safety
    /// `base` must be the address of a PL011's registers, mapped as device
    /// memory (or the MMU off), and nothing else may drive that UART.
    pub unsafe fn new(base: usize) -> Self {
        let uart = Self { base };
        // SAFETY: the caller guarantees `base` is a PL011; CR is at +0x30.
        unsafe {
            let cr = read_volatile((base + CR) as *const u32);
            if cr & CR_UARTEN_TXE != CR_UARTEN_TXE {
                write_volatile((base + CR) as *mut u32, cr | CR_UARTEN_TXE);
            }
        }
        uart
    }

    /// Sends one byte, waiting for room in the FIFO.
    pub fn put(&mut self, byte: u8) {
        // SAFETY: `new`'s contract: `base` maps a PL011's FR and DR registers.
        unsafe {
            while read_volatile((self.base + FR) as *const u32) & FR_TXFF != 0 {
                core::hint::spin_loop();
            }
            write_volatile((self.base + DR) as *mut u32, u32::from(byte));
        }
    }

    /// Enables the receiver and its receive and receive-timeout interrupts.
    pub fn enable_receive_interrupt(&mut self) {
        // SAFETY: `new`'s contract: `base` maps a PL011's CR, IMSC and ICR.
        unsafe {
            let cr = read_volatile((self.base + CR) as *const u32);
            write_volatile((self.base + CR) as *mut u32, cr | CR_RXE);
            write_volatile((self.base + ICR) as *mut u32, INT_RX_RT);
            let imsc = read_volatile((self.base + IMSC) as *const u32);
            write_volatile((self.base + IMSC) as *mut u32, imsc | INT_RX_RT);
        }
    }

    /// Moves the bytes waiting in the RX FIFO into `buf` (at most its
    /// length), clears the receive interrupts and returns the count. Bytes
    /// left in the FIFO raise the interrupt again.
    pub fn receive(&mut self, buf: &mut [u8]) -> usize {
        let mut len = 0;
        // SAFETY: `new`'s contract: `base` maps a PL011's FR, DR and ICR.
        unsafe {
            while len < buf.len() && read_volatile((self.base + FR) as *const u32) & FR_RXFE == 0 {
                buf[len] = read_volatile((self.base + DR) as *const u32) as u8;
                len += 1;
            }
            write_volatile((self.base + ICR) as *mut u32, INT_RX_RT);
        }
        len
    }

    /// Sends `bytes`, turning `\n` into `\r\n`.
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.put(b'\r');
            }
            self.put(b);
        }
    }
}

impl core::fmt::Write for Pl011Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}
