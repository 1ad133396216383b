//! Polled driver for the host's Arm PL011 (`arm,pl011`).
//!
//! Registers are numbered by word (byte offset / 4; the bank has shift 2 and
//! 4-byte access). Start: the UART and its transmitter are enabled
//! (`CR.UARTEN | TXE`) if they are not yet; the firmware's baud rate is kept.
//! Transmit: wait while the TX FIFO is full (`FR.TXFF`), then write `DR`.
//! Flush: wait while `FR.BUSY`. Receive: the receive and receive-timeout
//! interrupts can be enabled (`IMSC.RXIM | RTIM`, with `CR.RXE`);
//! [`Pl011::receive`] first clears both interrupts (`ICR`), then reads `DR`
//! while the RX FIFO is not empty (`FR.RXFE` clear).
//!
//! # Why the clear comes first
//!
//! A byte can arrive at any moment of the receive. Cleared after the reads, an
//! interrupt raised by a byte that arrived between the last `FR` read (which
//! said empty) and the `ICR` write is lost, and the byte with it: a UART whose
//! receive interrupt fires on reaching its trigger level (QEMU's does, at one
//! byte) stays quiet while that byte waits, and every byte behind it waits
//! too. Cleared before, every byte in the FIFO at the clear is read by the
//! loop, which stops only on an empty FIFO, and a byte arriving after its
//! last `FR` read raises the interrupt afresh.

use super::{RegisterBank, TX_SPIN_LIMIT, Uart};
use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

/// Data register (offset 0x00).
pub const DR: usize = 0x00 >> 2;
/// Flag register (offset 0x18).
pub const FR: usize = 0x18 >> 2;
/// Control register (offset 0x30).
pub const CR: usize = 0x30 >> 2;
/// Interrupt mask set/clear (offset 0x38).
pub const IMSC: usize = 0x38 >> 2;
/// Interrupt clear (offset 0x44).
pub const ICR: usize = 0x44 >> 2;

register_bitfields! {u32,
    /// Flag register.
    FR_BITS [
        /// Busy transmitting.
        BUSY OFFSET(3) NUMBITS(1) [],
        /// RX FIFO empty.
        RXFE OFFSET(4) NUMBITS(1) [],
        /// TX FIFO full.
        TXFF OFFSET(5) NUMBITS(1) []
    ],
    /// Control register.
    CR_BITS [
        /// UART enable.
        UARTEN OFFSET(0) NUMBITS(1) [],
        /// Transmit enable.
        TXE OFFSET(8) NUMBITS(1) [],
        /// Receive enable.
        RXE OFFSET(9) NUMBITS(1) []
    ],
    /// Interrupt mask, raw/masked status and clear registers.
    INT_BITS [
        /// Receive.
        RXIM OFFSET(4) NUMBITS(1) [],
        /// Receive timeout.
        RTIM OFFSET(6) NUMBITS(1) []
    ]
}

/// A PL011 on a register bank.
pub struct Pl011<B> {
    bank: B,
}

impl<B: RegisterBank> Pl011<B> {
    /// Takes over the PL011 on `bank`, enabling it and its transmitter if they
    /// are not yet.
    pub fn new(mut bank: B) -> Self {
        let mut cr = LocalRegisterCopy::<u32, CR_BITS::Register>::new(bank.read(CR));
        if !cr.matches_all(CR_BITS::UARTEN::SET + CR_BITS::TXE::SET) {
            cr.modify(CR_BITS::UARTEN::SET + CR_BITS::TXE::SET);
            bank.write(CR, cr.get());
        }
        Self { bank }
    }

    fn flags(&mut self) -> LocalRegisterCopy<u32, FR_BITS::Register> {
        LocalRegisterCopy::new(self.bank.read(FR))
    }

    /// The register bank (for tests).
    #[cfg(test)]
    pub(crate) fn bank(&self) -> &B {
        &self.bank
    }
}

impl<B: RegisterBank> Uart for Pl011<B> {
    fn put(&mut self, byte: u8) {
        for _ in 0..TX_SPIN_LIMIT {
            if !self.flags().is_set(FR_BITS::TXFF) {
                break;
            }
            core::hint::spin_loop();
        }
        self.bank.write(DR, u32::from(byte));
    }

    fn enable_receive_interrupt(&mut self) {
        let rx = INT_BITS::RXIM::SET + INT_BITS::RTIM::SET;
        let mut cr = LocalRegisterCopy::<u32, CR_BITS::Register>::new(self.bank.read(CR));
        cr.modify(CR_BITS::RXE::SET);
        self.bank.write(CR, cr.get());
        self.bank.write(ICR, rx.value);
        let mut imsc = LocalRegisterCopy::<u32, INT_BITS::Register>::new(self.bank.read(IMSC));
        imsc.modify(rx);
        self.bank.write(IMSC, imsc.get());
    }

    fn receive(&mut self, buf: &mut [u8]) -> usize {
        // Clear first: see the module's "Why the clear comes first".
        self.bank
            .write(ICR, (INT_BITS::RXIM::SET + INT_BITS::RTIM::SET).value);
        let mut len = 0;
        while len < buf.len() && !self.flags().is_set(FR_BITS::RXFE) {
            buf[len] = self.bank.read(DR) as u8;
            len += 1;
        }
        len
    }

    fn flush(&mut self) {
        for _ in 0..TX_SPIN_LIMIT {
            if !self.flags().is_set(FR_BITS::BUSY) {
                return;
            }
            core::hint::spin_loop();
        }
    }
}

impl<B: RegisterBank> core::fmt::Write for Pl011<B> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::uart::mock::{Access, MockBank};

    const TXFF: u32 = 1 << 5;
    const RXFE: u32 = 1 << 4;
    const ENABLED: u32 = 0x301;

    fn bank() -> MockBank {
        let mut bank = MockBank::new();
        bank.set(CR, ENABLED);
        bank.set(FR, RXFE);
        bank
    }

    #[test]
    fn enables_a_disabled_uart_only() {
        let mut off = bank();
        off.set(CR, 0);
        assert_eq!(Pl011::new(off).bank().writes(), vec![(CR, 0x101)]);
        assert!(Pl011::new(bank()).bank().writes().is_empty());
    }

    #[test]
    fn string_goes_to_dr_with_crlf_after_txff_clears() {
        let mut b = bank();
        b.queue(FR, &[TXFF, TXFF]);
        let mut uart = Pl011::new(b);
        core::fmt::Write::write_str(&mut uart, "a\n").expect("infallible");
        assert_eq!(uart.bank().written_to(DR), vec![0x61, 0x0d, 0x0a]);
        assert_eq!(uart.bank().reads_of(FR), 5, "two full, then one per byte");
        let first_write = uart
            .bank()
            .log
            .iter()
            .position(|a| matches!(a, Access::Write(DR, _)));
        assert_eq!(first_write, Some(4), "CR read, three FR reads, then DR");
    }

    #[test]
    fn receive_path() {
        let mut b = bank();
        b.queue(FR, &[0, 0, RXFE]);
        b.queue(DR, &[0x31, 0x32]);
        let mut uart = Pl011::new(b);
        uart.enable_receive_interrupt();
        let mut buf = [0u8; 4];
        assert_eq!(uart.receive(&mut buf), 2);
        assert_eq!(&buf[..2], b"12");
        assert_eq!(
            uart.bank().writes(),
            vec![(CR, ENABLED), (ICR, 0x50), (IMSC, 0x50), (ICR, 0x50)]
        );
    }

    /// A PL011 receiver as QEMU models it: the receive interrupt is raised
    /// when the FIFO's fill reaches the trigger level (one byte), dropped
    /// when a read empties it or `ICR` clears it; a byte may arrive before
    /// any register access (`arrive_before`, counted from 0).
    struct EdgeReceiver {
        fifo: alloc::collections::VecDeque<u8>,
        rx_interrupt: bool,
        accesses: usize,
        arrive_before: usize,
        next_byte: u8,
    }

    impl EdgeReceiver {
        fn tick(&mut self) {
            if self.accesses == self.arrive_before {
                self.fifo.push_back(self.next_byte);
                self.next_byte += 1;
                if self.fifo.len() == 1 {
                    self.rx_interrupt = true;
                }
            }
            self.accesses += 1;
        }
    }

    impl RegisterBank for EdgeReceiver {
        fn read(&mut self, index: usize) -> u32 {
            self.tick();
            match index {
                CR => ENABLED,
                FR if self.fifo.is_empty() => RXFE,
                DR => {
                    let byte = self.fifo.pop_front().map_or(0, u32::from);
                    if self.fifo.is_empty() {
                        self.rx_interrupt = false;
                    }
                    byte
                }
                _ => 0,
            }
        }

        fn write(&mut self, index: usize, value: u32) {
            self.tick();
            if index == ICR && value & (1 << 4) != 0 {
                self.rx_interrupt = false;
            }
        }
    }

    /// Whatever moment a byte arrives during an interrupt's receive loop (the
    /// host console's: receive until nothing comes), it is either read or
    /// leaves the interrupt raised: a byte is never stranded in the FIFO with
    /// the interrupt quiet.
    #[test]
    fn a_byte_arriving_during_a_receive_is_read_or_raises_the_interrupt() {
        for arrive_before in 0..16 {
            let receiver = EdgeReceiver {
                fifo: [b'a'].into_iter().collect(),
                rx_interrupt: true,
                accesses: 0,
                arrive_before,
                next_byte: b'b',
            };
            let mut uart = Pl011 { bank: receiver };
            let mut got = alloc::vec::Vec::new();
            let mut buf = [0u8; 4];
            loop {
                let len = uart.receive(&mut buf);
                if len == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..len]);
            }
            let receiver = &uart.bank;
            let arrived = receiver.accesses > arrive_before;
            let stranded = !receiver.fifo.is_empty() && !receiver.rx_interrupt;
            assert!(
                !stranded,
                "a byte arriving before access {arrive_before} waits with the interrupt clear \
                 (read {got:?})"
            );
            let expected: &[u8] = if arrived && receiver.fifo.is_empty() {
                b"ab"
            } else {
                b"a"
            };
            assert_eq!(got, expected, "arriving before access {arrive_before}");
        }
    }
}
