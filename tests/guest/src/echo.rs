//! The echo scenario: a ticker and a line echo on the console, for the
//! hypervisor's console monitor to pause, resume, focus and stop.
//!
//! # Loop
//!
//! The boot vCPU alone runs it (no secondaries are started). It prints
//! `echo: ready`, then forever: every [`TICK_MS`] milliseconds of the
//! virtual counter `echo: tick N` (N counting from 1), and between ticks it
//! polls the PL011's receive FIFO. Typed bytes collect into a line of up to
//! [`LINE_CAPACITY`] bytes (more are dropped); `\r` or `\n` ends it and it
//! is printed as `echo: got <line>` (an empty line prints nothing). It never
//! ends by itself: no `RESULT:` line.

use crate::console;
use crate::println;
use crate::smp::Deadline;

/// Time between two ticks.
pub const TICK_MS: u64 = 500;

/// Longest line echoed.
pub const LINE_CAPACITY: usize = 64;

/// Runs the scenario; never returns.
pub fn run() -> ! {
    println!("echo: ready");
    let mut line = [0u8; LINE_CAPACITY];
    let mut len = 0;
    let mut tick: u64 = 0;
    let mut next = Deadline::after_millis(TICK_MS);
    loop {
        if next.passed() {
            tick += 1;
            println!("echo: tick {tick}");
            next = Deadline::after_millis(TICK_MS);
        }
        while let Some(byte) = console::read_byte() {
            match byte {
                b'\r' | b'\n' if len > 0 => {
                    let text = core::str::from_utf8(&line[..len]).unwrap_or("<not UTF-8>");
                    println!("echo: got {text}");
                    len = 0;
                }
                b'\r' | b'\n' => {}
                _ if len < LINE_CAPACITY => {
                    line[len] = byte;
                    len += 1;
                }
                _ => {}
            }
        }
        core::hint::spin_loop();
    }
}
