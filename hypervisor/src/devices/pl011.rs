//! Register model of an emulated Arm PL011 UART.
//!
//! The guest's loads and stores to the device's 4 KiB window arrive here as
//! (offset, value) pairs. Transmission is instantaneous: a byte written to
//! `DR` goes to the hypervisor console at once (`crate::control::console`),
//! so the FIFO is always empty and `FR` reports TXFE; received bytes wait in a small FIFO. The raw interrupt state
//! (`RIS`) follows the FIFOs and `MIS = RIS & IMSC`, which is what a virtual
//! interrupt controller will sample. The PrimeCell peripheral and cell ID
//! registers answer like a real PL011 (r1p5), because Linux's AMBA bus matches
//! drivers on them.
//!
//! Bytes typed on the host console arrive in bursts larger than the FIFO;
//! [`RxBacklog`] holds them and moves them into the FIFO as the guest reads
//! it empty, so a paste is not cut short by the 32-byte FIFO.

use alloc::collections::VecDeque;

/// Size of the register window.
pub const WINDOW_SIZE: u64 = 0x1000;

const DR: u64 = 0x000;
const RSR_ECR: u64 = 0x004;
const FR: u64 = 0x018;
const ILPR: u64 = 0x020;
const IBRD: u64 = 0x024;
const FBRD: u64 = 0x028;
const LCR_H: u64 = 0x02c;
const CR: u64 = 0x030;
const IFLS: u64 = 0x034;
const IMSC: u64 = 0x038;
const RIS: u64 = 0x03c;
const MIS: u64 = 0x040;
const ICR: u64 = 0x044;
const DMACR: u64 = 0x048;
const ID_BASE: u64 = 0xfe0;

/// PeriphID0..3 then PCellID0..3 of an Arm PL011 r1p5.
const ID_REGISTERS: [u8; 8] = [0x11, 0x10, 0x34, 0x00, 0x0d, 0xf0, 0x05, 0xb1];

const FR_RXFE: u32 = 1 << 4;
const FR_TXFE: u32 = 1 << 7;
const FR_RXFF: u32 = 1 << 6;
const INT_RX: u32 = 1 << 4;
const INT_TX: u32 = 1 << 5;
const INT_RT: u32 = 1 << 6;
const INT_MASK: u32 = 0x7ff;
const RX_FIFO_DEPTH: usize = 32;

/// An access the model refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pl011Error {
    /// The offset is outside the window or not a register.
    NoRegister(u64),
}

impl core::fmt::Display for Pl011Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoRegister(offset) => write!(f, "no PL011 register at offset {offset:#x}"),
        }
    }
}

impl core::error::Error for Pl011Error {}

/// The state of one emulated PL011.
#[derive(Clone, Debug)]
pub struct Pl011 {
    ilpr: u32,
    ibrd: u32,
    fbrd: u32,
    lcr_h: u32,
    cr: u32,
    ifls: u32,
    imsc: u32,
    dmacr: u32,
    rx: [u8; RX_FIFO_DEPTH],
    rx_head: usize,
    rx_len: usize,
}

impl Default for Pl011 {
    fn default() -> Self {
        Self::new()
    }
}

impl Pl011 {
    /// A UART in its reset state (UARTEN off, TXE and RXE on, FIFO level 1/2).
    pub const fn new() -> Self {
        Self {
            ilpr: 0,
            ibrd: 0,
            fbrd: 0,
            lcr_h: 0,
            cr: 0x300,
            ifls: 0x12,
            imsc: 0,
            dmacr: 0,
            rx: [0; RX_FIFO_DEPTH],
            rx_head: 0,
            rx_len: 0,
        }
    }

    /// The raw interrupt status: TX always (the FIFO is always drained), RX
    /// and receive-timeout while bytes wait.
    pub fn raw_interrupts(&self) -> u32 {
        let mut ris = INT_TX;
        if self.rx_len > 0 {
            ris |= INT_RX | INT_RT;
        }
        ris
    }

    /// True when the interrupt line is asserted (`MIS != 0`).
    pub fn interrupt_pending(&self) -> bool {
        self.raw_interrupts() & self.imsc != 0
    }

    /// Queues a received byte; false (and the byte dropped) when the FIFO is full.
    pub fn push_rx(&mut self, byte: u8) -> bool {
        if self.rx_len == RX_FIFO_DEPTH {
            return false;
        }
        self.rx[(self.rx_head + self.rx_len) % RX_FIFO_DEPTH] = byte;
        self.rx_len += 1;
        true
    }

    fn pop_rx(&mut self) -> Option<u8> {
        if self.rx_len == 0 {
            return None;
        }
        let byte = self.rx[self.rx_head];
        self.rx_head = (self.rx_head + 1) % RX_FIFO_DEPTH;
        self.rx_len -= 1;
        Some(byte)
    }

    /// A guest load from `offset`.
    pub fn read(&mut self, offset: u64) -> Result<u32, Pl011Error> {
        Ok(match offset {
            DR => self.pop_rx().map_or(0, u32::from),
            RSR_ECR => 0,
            FR => {
                let mut fr = FR_TXFE;
                if self.rx_len == 0 {
                    fr |= FR_RXFE;
                }
                if self.rx_len == RX_FIFO_DEPTH {
                    fr |= FR_RXFF;
                }
                fr
            }
            ILPR => self.ilpr,
            IBRD => self.ibrd,
            FBRD => self.fbrd,
            LCR_H => self.lcr_h,
            CR => self.cr,
            IFLS => self.ifls,
            IMSC => self.imsc,
            RIS => self.raw_interrupts(),
            MIS => self.raw_interrupts() & self.imsc,
            ICR => 0,
            DMACR => self.dmacr,
            ID_BASE..=0xffc if offset.is_multiple_of(4) => {
                u32::from(ID_REGISTERS[((offset - ID_BASE) / 4) as usize])
            }
            _ => return Err(Pl011Error::NoRegister(offset)),
        })
    }

    /// A guest store of `value` to `offset`; a byte written to `DR` is returned
    /// for the console.
    pub fn write(&mut self, offset: u64, value: u32) -> Result<Option<u8>, Pl011Error> {
        match offset {
            DR => return Ok(Some(value as u8)),
            RSR_ECR => {}
            ILPR => self.ilpr = value & 0xff,
            IBRD => self.ibrd = value & 0xffff,
            FBRD => self.fbrd = value & 0x3f,
            LCR_H => self.lcr_h = value & 0xff,
            CR => self.cr = value & 0xffff,
            IFLS => self.ifls = value & 0x3f,
            IMSC => self.imsc = value & INT_MASK,
            // TX and RX interrupts follow the FIFO state; clearing them changes nothing.
            ICR => {}
            DMACR => self.dmacr = value & 7,
            _ => return Err(Pl011Error::NoRegister(offset)),
        }
        Ok(None)
    }
}

/// Received bytes waiting for room in the emulated PL011's RX FIFO.
#[derive(Clone, Debug, Default)]
pub struct RxBacklog {
    bytes: VecDeque<u8>,
}

impl RxBacklog {
    /// Most bytes held; more are dropped (the console overran).
    pub const CAPACITY: usize = 4096;

    /// An empty backlog.
    pub const fn new() -> Self {
        Self {
            bytes: VecDeque::new(),
        }
    }

    /// Queues `byte`; false (and the byte dropped) when the backlog is full.
    pub fn push(&mut self, byte: u8) -> bool {
        if self.bytes.len() >= Self::CAPACITY {
            return false;
        }
        self.bytes.push_back(byte);
        true
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether no byte waits.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Moves bytes, oldest first, into `uart`'s FIFO while it has room;
    /// returns how many moved.
    pub fn drain_into(&mut self, uart: &mut Pl011) -> usize {
        let mut moved = 0;
        while let Some(&byte) = self.bytes.front() {
            if !uart.push_rx(byte) {
                break;
            }
            self.bytes.pop_front();
            moved += 1;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primecell_ids() {
        let mut uart = Pl011::new();
        let ids: Vec<u32> = (0..8)
            .map(|i| uart.read(0xfe0 + 4 * i).expect("id"))
            .collect();
        assert_eq!(ids, [0x11, 0x10, 0x34, 0x00, 0x0d, 0xf0, 0x05, 0xb1]);
        // AMBA periphid as Linux assembles it: 0x00341011, part number 0x011 (PL011).
        let periphid = ids[0] | ids[1] << 8 | ids[2] << 16 | ids[3] << 24;
        assert_eq!(periphid & 0x000f_ffff, 0x4_1011);
        let cellid = ids[4] | ids[5] << 8 | ids[6] << 16 | ids[7] << 24;
        assert_eq!(cellid, 0xb105_f00d);
    }

    #[test]
    fn transmit_and_flags() {
        let mut uart = Pl011::new();
        assert_eq!(uart.write(0, u32::from(b'A')), Ok(Some(b'A')));
        let fr = uart.read(FR).expect("FR");
        assert_ne!(fr & FR_TXFE, 0);
        assert_ne!(fr & FR_RXFE, 0);
        assert_eq!(uart.write(0x1000, 0), Err(Pl011Error::NoRegister(0x1000)));
        assert_eq!(uart.read(0x04c), Err(Pl011Error::NoRegister(0x04c)));
    }

    #[test]
    fn receive_fifo_and_interrupts() {
        let mut uart = Pl011::new();
        assert!(!uart.interrupt_pending());
        uart.write(IMSC, INT_RX).expect("IMSC");
        assert!(!uart.interrupt_pending());
        assert!(uart.push_rx(b'x'));
        assert!(uart.interrupt_pending());
        assert_eq!(uart.read(FR).expect("FR") & FR_RXFE, 0);
        assert_eq!(uart.read(MIS), Ok(INT_RX));
        assert_eq!(uart.read(DR), Ok(u32::from(b'x')));
        assert!(!uart.interrupt_pending());
        for i in 0..RX_FIFO_DEPTH {
            assert!(uart.push_rx(i as u8));
        }
        assert!(!uart.push_rx(0xff));
        assert_ne!(uart.read(FR).expect("FR") & FR_RXFF, 0);
        for i in 0..RX_FIFO_DEPTH {
            assert_eq!(uart.read(DR), Ok(i as u32));
        }
    }

    #[test]
    fn backlog_feeds_the_fifo_in_order_without_loss() {
        let mut uart = Pl011::new();
        uart.write(IMSC, INT_RX | INT_RT).unwrap();
        let mut backlog = RxBacklog::new();
        let typed: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        for &b in &typed {
            assert!(backlog.push(b));
        }
        assert_eq!(backlog.drain_into(&mut uart), RX_FIFO_DEPTH);
        assert_eq!(backlog.len(), 100 - RX_FIFO_DEPTH);
        assert!(uart.interrupt_pending());
        assert_eq!(uart.read(FR).unwrap() & FR_RXFF, FR_RXFF);
        let mut received = Vec::new();
        // The guest reads while RXFE is clear; each read makes room the
        // backlog refills, as the run loop does after every UART access.
        while uart.read(FR).unwrap() & FR_RXFE == 0 {
            received.push(uart.read(DR).unwrap() as u8);
            backlog.drain_into(&mut uart);
        }
        assert_eq!(received, typed);
        assert!(backlog.is_empty());
        assert!(
            !uart.interrupt_pending(),
            "TX interrupt is masked, RX drained"
        );
    }

    #[test]
    fn backlog_drops_beyond_its_capacity() {
        let mut backlog = RxBacklog::new();
        for _ in 0..RxBacklog::CAPACITY {
            assert!(backlog.push(b'x'));
        }
        assert!(!backlog.push(b'y'));
        assert_eq!(backlog.len(), RxBacklog::CAPACITY);
    }

    #[test]
    fn registers_keep_their_bits() {
        let mut uart = Pl011::new();
        uart.write(CR, 0xffff_ffff).expect("CR");
        assert_eq!(uart.read(CR), Ok(0xffff));
        uart.write(LCR_H, 0x70).expect("LCR_H");
        assert_eq!(uart.read(LCR_H), Ok(0x70));
    }
}
