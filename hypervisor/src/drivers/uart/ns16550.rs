//! Polled driver for 8250/16550-compatible UARTs (`ns16550a`, `ns16550`,
//! `snps,dw-apb-uart` as on Rockchip RK3588).
//!
//! Registers are numbered as in the 16550 datasheet; the bank places them
//! (`reg-shift`, `reg-io-width`). Start: the firmware's divisor and line
//! settings are kept; only `LCR.DLAB` is cleared if it was left set, since
//! registers 0 and 1 are the divisor latch while it is. Transmit: wait until
//! `LSR.THRE` says the holding register (or, with FIFOs on, the whole TX FIFO)
//! is empty, then write `THR`. Flush: wait for `LSR.TEMT` (holding and shift
//! registers empty). Receive: `IER.ERBFI` enables the received-data interrupt
//! (which covers the FIFO timeout) and `MCR.OUT2` routes it on 8250s that gate
//! the line with it; [`Ns16550::receive`] reads `RBR` while `LSR.DR` is set.
//! The driver never writes `LCR` otherwise, so the DesignWare UART's
//! busy-detect rule (no `LCR` write while it is busy) does not apply.

use super::{RegisterBank, TX_SPIN_LIMIT, Uart};
use tock_registers::LocalRegisterCopy;
use tock_registers::register_bitfields;

/// Receiver buffer (read) and transmitter holding register (write).
pub const RBR_THR: usize = 0;
/// Interrupt enable register.
pub const IER: usize = 1;
/// Interrupt identification (read) and FIFO control (write).
pub const IIR_FCR: usize = 2;
/// Line control register.
pub const LCR: usize = 3;
/// Modem control register.
pub const MCR: usize = 4;
/// Line status register.
pub const LSR: usize = 5;

register_bitfields! {u8,
    /// Interrupt enable register.
    IER_BITS [
        /// Received data available (and FIFO timeout).
        ERBFI OFFSET(0) NUMBITS(1) [],
        /// Transmitter holding register empty.
        ETBEI OFFSET(1) NUMBITS(1) [],
        /// Receiver line status.
        ELSI OFFSET(2) NUMBITS(1) []
    ],
    /// Line control register.
    LCR_BITS [
        /// Word length: 3 is 8 bits.
        WLS OFFSET(0) NUMBITS(2) [],
        /// Divisor latch access: registers 0 and 1 are the divisor.
        DLAB OFFSET(7) NUMBITS(1) []
    ],
    /// Modem control register.
    MCR_BITS [
        /// Output 2: gates the interrupt line on PC-style 8250s.
        OUT2 OFFSET(3) NUMBITS(1) []
    ],
    /// Line status register.
    LSR_BITS [
        /// Data ready: a received byte waits in `RBR`.
        DR OFFSET(0) NUMBITS(1) [],
        /// Overrun error.
        OE OFFSET(1) NUMBITS(1) [],
        /// Transmitter holding register (TX FIFO) empty.
        THRE OFFSET(5) NUMBITS(1) [],
        /// Transmitter empty: holding and shift registers both empty.
        TEMT OFFSET(6) NUMBITS(1) []
    ]
}

fn lsr<B: RegisterBank>(bank: &mut B) -> LocalRegisterCopy<u8, LSR_BITS::Register> {
    LocalRegisterCopy::new(bank.read(LSR) as u8)
}

/// A 16550-compatible UART on a register bank.
pub struct Ns16550<B> {
    bank: B,
}

impl<B: RegisterBank> Ns16550<B> {
    /// Takes over the UART on `bank`, keeping the firmware's line settings
    /// (clears `LCR.DLAB` only if it was left set).
    pub fn new(mut bank: B) -> Self {
        let mut lcr = LocalRegisterCopy::<u8, LCR_BITS::Register>::new(bank.read(LCR) as u8);
        if lcr.is_set(LCR_BITS::DLAB) {
            lcr.modify(LCR_BITS::DLAB::CLEAR);
            bank.write(LCR, u32::from(lcr.get()));
        }
        Self { bank }
    }

    /// Waits until `field` reads set in `LSR` (at most [`TX_SPIN_LIMIT`]
    /// reads); returns whether it did.
    fn wait_lsr(&mut self, field: tock_registers::fields::Field<u8, LSR_BITS::Register>) -> bool {
        for _ in 0..TX_SPIN_LIMIT {
            if lsr(&mut self.bank).is_set(field) {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// The register bank (for tests).
    #[cfg(test)]
    pub(crate) fn bank(&self) -> &B {
        &self.bank
    }
}

impl<B: RegisterBank> Uart for Ns16550<B> {
    fn put(&mut self, byte: u8) {
        self.wait_lsr(LSR_BITS::THRE);
        self.bank.write(RBR_THR, u32::from(byte));
    }

    fn enable_receive_interrupt(&mut self) {
        let mut ier = LocalRegisterCopy::<u8, IER_BITS::Register>::new(self.bank.read(IER) as u8);
        ier.modify(IER_BITS::ERBFI::SET);
        self.bank.write(IER, u32::from(ier.get()));
        let mut mcr = LocalRegisterCopy::<u8, MCR_BITS::Register>::new(self.bank.read(MCR) as u8);
        mcr.modify(MCR_BITS::OUT2::SET);
        self.bank.write(MCR, u32::from(mcr.get()));
    }

    fn receive(&mut self, buf: &mut [u8]) -> usize {
        let mut len = 0;
        while len < buf.len() && lsr(&mut self.bank).is_set(LSR_BITS::DR) {
            buf[len] = self.bank.read(RBR_THR) as u8;
            len += 1;
        }
        len
    }

    fn flush(&mut self) {
        self.wait_lsr(LSR_BITS::TEMT);
    }
}

impl<B: RegisterBank> core::fmt::Write for Ns16550<B> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::uart::mock::{Access, MockBank};

    const THRE: u32 = 1 << 5;
    const TEMT: u32 = 1 << 6;
    const DR: u32 = 1;

    fn idle_bank() -> MockBank {
        let mut bank = MockBank::new();
        bank.set(LSR, THRE | TEMT);
        bank.set(LCR, 0x03); // 8N1, as firmware leaves it
        bank
    }

    #[test]
    fn string_goes_to_thr_with_crlf() {
        let mut uart = Ns16550::new(idle_bank());
        core::fmt::Write::write_str(&mut uart, "hi\n").expect("infallible");
        let bank = uart.bank();
        assert_eq!(
            bank.written_to(RBR_THR),
            vec![u32::from(b'h'), u32::from(b'i'), 0x0d, 0x0a]
        );
        assert_eq!(
            bank.writes().len(),
            4,
            "nothing but THR is written (LCR kept)"
        );
        assert_eq!(bank.reads_of(LSR), 4, "LSR is checked before every byte");
    }

    #[test]
    fn put_waits_for_thre() {
        let mut bank = idle_bank();
        bank.queue(LSR, &[0, 0, 0x01, THRE]);
        let mut uart = Ns16550::new(bank);
        uart.put(b'A');
        let log = &uart.bank().log;
        let lsr_reads: Vec<u32> = log
            .iter()
            .filter_map(|a| match *a {
                Access::Read(LSR, v) => Some(v),
                _ => None,
            })
            .collect();
        assert_eq!(lsr_reads, vec![0, 0, 0x01, THRE]);
        assert_eq!(
            log.last(),
            Some(&Access::Write(RBR_THR, u32::from(b'A'))),
            "THR is written only after THRE reads set"
        );
    }

    #[test]
    fn put_gives_up_waiting_after_the_limit() {
        let mut bank = idle_bank();
        bank.set(LSR, 0);
        let mut uart = Ns16550::new(bank);
        uart.put(b'x');
        assert_eq!(uart.bank().reads_of(LSR), TX_SPIN_LIMIT);
        assert_eq!(uart.bank().written_to(RBR_THR), vec![u32::from(b'x')]);
    }

    #[test]
    fn flush_waits_for_temt_not_thre() {
        let mut bank = idle_bank();
        bank.queue(LSR, &[THRE, THRE, THRE | TEMT]);
        let mut uart = Ns16550::new(bank);
        uart.flush();
        assert_eq!(uart.bank().reads_of(LSR), 3);
    }

    #[test]
    fn dlab_left_set_is_cleared() {
        let mut bank = idle_bank();
        bank.set(LCR, 0x83);
        let uart = Ns16550::new(bank);
        assert_eq!(uart.bank().writes(), vec![(LCR, 0x03)]);
    }

    #[test]
    fn receive_reads_rbr_while_data_ready() {
        let mut bank = idle_bank();
        bank.queue(LSR, &[DR | THRE, DR | THRE, DR | THRE, THRE]);
        bank.queue(RBR_THR, &[b'a'.into(), b'b'.into(), b'c'.into()]);
        let mut uart = Ns16550::new(bank);
        let mut buf = [0u8; 8];
        assert_eq!(uart.receive(&mut buf), 3);
        assert_eq!(&buf[..3], b"abc");

        // A short buffer leaves the rest in the FIFO.
        let mut bank = idle_bank();
        bank.set(LSR, DR);
        bank.queue(RBR_THR, &[1, 2, 3]);
        let mut uart = Ns16550::new(bank);
        let mut two = [0u8; 2];
        assert_eq!(uart.receive(&mut two), 2);
        assert_eq!(uart.bank().reads_of(RBR_THR), 2);
    }

    #[test]
    fn receive_interrupt_sets_erbfi_and_out2() {
        let mut bank = idle_bank();
        bank.set(IER, 0x04);
        let mut uart = Ns16550::new(bank);
        uart.enable_receive_interrupt();
        assert_eq!(uart.bank().writes(), vec![(IER, 0x05), (MCR, 0x08)]);
    }

    #[test]
    fn through_an_mmio_bank_with_shift_and_width() {
        // A 16550 with reg-shift 2 and 1-byte access, in plain memory: THR at
        // byte 0, LSR at byte 20.
        let mut mem = [0u32; 8];
        mem[LSR] = u32::from_ne_bytes([(THRE | TEMT) as u8, 0, 0, 0]);
        let base = mem.as_mut_ptr() as usize;
        // SAFETY: `mem` is live, aligned and only touched through this bank;
        // registers 0 to 5 at stride 4 stay inside it.
        let bank = unsafe {
            crate::drivers::uart::MmioBank::new(base, 2, crate::vocabulary::uart_kind::IoWidth::U8)
        };
        let mut uart = Ns16550::new(bank);
        uart.put(b'Z');
        assert_eq!(mem[0].to_ne_bytes(), [b'Z', 0, 0, 0]);
    }

    #[test]
    fn bcm2835_mini_uart_register_offsets() {
        // The mini UART (`brcm,bcm2835-aux-uart`) as the platform sets it up:
        // reg-shift 2, 4-byte access, in plain memory. The BCM2835 register
        // map from the UART's base: IO 0x00, IER 0x04, IIR 0x08, LCR 0x0c,
        // MCR 0x10, LSR 0x14 (bit 5 = can take a byte, bit 6 = idle).
        let mut mem = [0u32; 8];
        mem[0x14 / 4] = THRE | TEMT | DR;
        mem[0x0c / 4] = 0x83; // DLAB left set, 8-bit mode
        mem[0] = u32::from(b'q');
        let base = mem.as_mut_ptr() as usize;
        // SAFETY: `mem` is live, aligned and only touched through this bank
        // while the driver runs; registers 0 to 5 at stride 4 stay inside it.
        let bank = unsafe {
            crate::drivers::uart::MmioBank::new(base, 2, crate::vocabulary::uart_kind::IoWidth::U32)
        };
        let mut uart = Ns16550::new(bank);
        // Plain memory keeps LSR.DR set, so receive fills the buffer from IO.
        let mut buf = [0u8; 4];
        assert_eq!(uart.receive(&mut buf), 4, "LSR at 0x14 says data ready");
        assert_eq!(&buf, b"qqqq", "received bytes come from IO at 0x00");
        uart.put(b'Z');
        uart.enable_receive_interrupt();
        uart.flush();
        assert_eq!(mem[0], u32::from(b'Z'), "IO at 0x00");
        assert_eq!(mem[0x04 / 4], 0x01, "IER at 0x04: receive interrupt");
        assert_eq!(mem[0x08 / 4], 0, "IIR/FCR at 0x08 untouched");
        assert_eq!(
            mem[0x0c / 4],
            0x03,
            "LCR at 0x0c: DLAB cleared, 8 bits kept"
        );
        assert_eq!(mem[0x10 / 4], 0x08, "MCR at 0x10: OUT2");
        assert_eq!(mem[0x14 / 4], THRE | TEMT | DR, "LSR at 0x14 only read");
    }
}
