//! Drivers for the host UART that carries the hypervisor's console: an Arm
//! PL011 and 8250/16550-compatible UARTs, behind one [`Uart`] trait.
//!
//! A driver never touches memory itself: it reads and writes registers by
//! index through a [`RegisterBank`]. On the machine that is an [`MmioBank`]:
//! register `i` is at `base + (i << reg_shift)` and is accessed with the
//! device tree's `reg-io-width` (1, 2 or 4 bytes); the PL011 is the bank with
//! shift 2 and 4-byte access. On the host, tests give the drivers a mock bank
//! that scripts what each register reads as and records every access, so the
//! register logic (what is written where for a string, the waits on the
//! status bits, the receive path) is checked without hardware.
//!
//! Both drivers keep the firmware's line settings (baud rate, framing): the
//! boot loader set them up for its own console, and the hypervisor uses the
//! same one. Register fields are named with `tock-registers` bitfields and
//! decoded from local copies (`LocalRegisterCopy`); the register blocks are not
//! `tock-registers` structs because the 16550's stride and access width are
//! only known at run time (`reg-shift`, `reg-io-width`).
//!
//! Transmit waits are bounded ([`TX_SPIN_LIMIT`] status reads): a UART whose
//! clock is gated or that never drains must not hang the hypervisor, so the
//! byte is written anyway (and may be lost) after the limit.

pub mod console;
pub mod ns16550;
pub mod pl011;

#[cfg(test)]
pub(crate) mod mock;

use crate::vocabulary::uart_kind::{IoWidth, UartKind};
use core::ptr::{read_volatile, write_volatile};

/// Status reads a transmit waits for room before it writes anyway.
pub const TX_SPIN_LIMIT: usize = 1_000_000;

/// Access to a UART's registers by register index.
pub trait RegisterBank {
    /// Reads register `index`.
    fn read(&mut self, index: usize) -> u32;
    /// Writes `value` to register `index`.
    fn write(&mut self, index: usize, value: u32);
}

/// A polled console UART.
pub trait Uart {
    /// Sends one byte, waiting (a bounded time) for room to send it.
    fn put(&mut self, byte: u8);
    /// Enables the receiver and its receive interrupts.
    fn enable_receive_interrupt(&mut self);
    /// Moves the received bytes waiting in the UART into `buf` (at most its
    /// length) and returns the count; bytes left raise the interrupt again.
    fn receive(&mut self, buf: &mut [u8]) -> usize;
    /// Waits (a bounded time) until everything written has left the UART.
    fn flush(&mut self);

    /// Sends `bytes`, turning `\n` into `\r\n`.
    fn write_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.put(b'\r');
            }
            self.put(b);
        }
    }
}

/// A UART's registers in memory: register `index` at `base + (index << shift)`,
/// accessed `width` wide with volatile loads and stores.
#[derive(Clone, Copy, Debug)]
pub struct MmioBank {
    base: usize,
    shift: u8,
    width: IoWidth,
}

impl MmioBank {
    /// The bank at `base`.
    ///
    /// # Safety
    /// Every register the driver uses (`base + (index << shift)`, `width`
    /// bytes, naturally aligned) must be a UART's register mapped as device
    /// memory (or the MMU off), and nothing else may drive that UART while the
    /// bank is used.
    pub unsafe fn new(base: usize, shift: u8, width: IoWidth) -> Self {
        Self { base, shift, width }
    }

    /// The bank for a UART of `kind` at `base`.
    ///
    /// # Safety
    /// As [`MmioBank::new`].
    pub unsafe fn for_kind(base: usize, kind: UartKind) -> Self {
        let (shift, width) = match kind {
            UartKind::Pl011 => (2, IoWidth::U32),
            UartKind::Ns16550 {
                reg_shift,
                io_width,
            } => (reg_shift, io_width),
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::new(base, shift, width) }
    }

    /// The address of register `index`.
    pub fn address(&self, index: usize) -> usize {
        self.base + (index << self.shift)
    }
}

impl RegisterBank for MmioBank {
    fn read(&mut self, index: usize) -> u32 {
        let addr = self.address(index);
        // SAFETY: `new`'s contract: the register is mapped device memory of
        // this UART, aligned for `width`.
        unsafe {
            match self.width {
                IoWidth::U8 => u32::from(read_volatile(addr as *const u8)),
                IoWidth::U16 => u32::from(read_volatile(addr as *const u16)),
                IoWidth::U32 => read_volatile(addr as *const u32),
            }
        }
    }

    fn write(&mut self, index: usize, value: u32) {
        let addr = self.address(index);
        // SAFETY: as in `read`; the narrower widths write the low bits only.
        unsafe {
            match self.width {
                IoWidth::U8 => write_volatile(addr as *mut u8, value as u8),
                IoWidth::U16 => write_volatile(addr as *mut u16, value as u16),
                IoWidth::U32 => write_volatile(addr as *mut u32, value),
            }
        }
    }
}

/// The console UART, whichever kind the device tree names.
pub enum AnyUart<B> {
    /// A PL011.
    Pl011(pl011::Pl011<B>),
    /// A 16550-compatible UART.
    Ns16550(ns16550::Ns16550<B>),
}

impl<B: RegisterBank> AnyUart<B> {
    /// Starts the driver for `kind` on `bank` (see each driver's `new`).
    pub fn new(kind: UartKind, bank: B) -> Self {
        match kind {
            UartKind::Pl011 => Self::Pl011(pl011::Pl011::new(bank)),
            UartKind::Ns16550 { .. } => Self::Ns16550(ns16550::Ns16550::new(bank)),
        }
    }

    fn inner(&mut self) -> &mut dyn Uart {
        match self {
            Self::Pl011(u) => u,
            Self::Ns16550(u) => u,
        }
    }
}

impl<B: RegisterBank> Uart for AnyUart<B> {
    fn put(&mut self, byte: u8) {
        self.inner().put(byte);
    }

    fn enable_receive_interrupt(&mut self) {
        self.inner().enable_receive_interrupt();
    }

    fn receive(&mut self, buf: &mut [u8]) -> usize {
        self.inner().receive(buf)
    }

    fn flush(&mut self) {
        self.inner().flush();
    }
}

impl<B: RegisterBank> core::fmt::Write for AnyUart<B> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmio_bank_strides_and_widths() {
        // Plain memory stands in for the registers: the bank's volatile
        // accesses land where reg-shift and reg-io-width say.
        let mut mem = [0u32; 16];
        let base = mem.as_mut_ptr() as usize;
        // SAFETY: `mem` is 64 bytes of live, 4-byte aligned memory that only
        // this bank touches, and every index used below stays inside it.
        let mut bank = unsafe { MmioBank::new(base, 2, IoWidth::U32) };
        assert_eq!(bank.address(5), base + 20);
        bank.write(5, 0x1234_5678);
        assert_eq!(mem[5], 0x1234_5678);
        assert_eq!(bank.read(5), 0x1234_5678);

        mem = [0xffff_ffff; 16];
        // SAFETY: as above.
        let mut bytes = unsafe { MmioBank::new(base, 2, IoWidth::U8) };
        bytes.write(5, 0xab);
        assert_eq!(
            mem[5].to_ne_bytes()[0],
            0xab,
            "1-byte access at the register's first byte"
        );
        assert_eq!(
            &mem[5].to_ne_bytes()[1..],
            &[0xff; 3],
            "the other bytes are untouched"
        );
        assert_eq!(bytes.read(5), 0xab, "a 1-byte read returns one byte");

        // SAFETY: as above.
        let mut packed = unsafe { MmioBank::new(base, 0, IoWidth::U8) };
        assert_eq!(packed.address(5), base + 5);
        packed.write(1, 0x11);
        assert_eq!(mem[0].to_ne_bytes()[1], 0x11);
    }

    #[test]
    fn any_uart_drives_the_kind_it_was_given() {
        let mut bank = mock::MockBank::new();
        bank.set(ns16550::LSR, 0x60); // THRE | TEMT
        let kind = UartKind::Ns16550 {
            reg_shift: 0,
            io_width: IoWidth::U8,
        };
        let mut uart = AnyUart::new(kind, bank);
        uart.write_bytes(b"ok\n");
        let AnyUart::Ns16550(inner) = &uart else {
            panic!("a 16550 kind gives the 16550 driver");
        };
        assert_eq!(
            inner.bank().written_to(ns16550::RBR_THR),
            vec![0x6f, 0x6b, 0x0d, 0x0a]
        );

        let mut bank = mock::MockBank::new();
        bank.set(pl011::CR, 0x301);
        let mut uart = AnyUart::new(UartKind::Pl011, bank);
        uart.write_bytes(b"ok");
        let AnyUart::Pl011(inner) = &uart else {
            panic!("the PL011 kind gives the PL011 driver");
        };
        assert_eq!(inner.bank().written_to(pl011::DR), vec![0x6f, 0x6b]);
        assert_eq!(inner.bank().reads_of(pl011::FR), 2);
    }

    #[test]
    fn bank_for_each_kind() {
        // SAFETY: the banks are only asked for addresses, never accessed.
        let pl011 = unsafe { MmioBank::for_kind(0x900_0000, UartKind::Pl011) };
        assert_eq!(pl011.address(0x18 >> 2), 0x900_0018);
        let dw = UartKind::Ns16550 {
            reg_shift: 2,
            io_width: IoWidth::U32,
        };
        // SAFETY: as above.
        let bank = unsafe { MmioBank::for_kind(0xfeb5_0000, dw) };
        assert_eq!(bank.address(5), 0xfeb5_0014, "LSR of a DesignWare UART");
        assert_eq!(IoWidth::from_bytes(4), Some(IoWidth::U32));
        assert_eq!(IoWidth::from_bytes(3), None);
        assert_eq!(
            dw.to_string(),
            "16550 (reg-shift 2, 4-byte access)",
            "banner text"
        );
    }
}
