//! The host console on the fake machine (`runtime::host_console`): output
//! before and after the start, the log line written by the CPU that holds
//! the console lock, typed bytes reaching the monitor, and a parked CPU:
//! the console CPU serving the UART and the poll timer, any other halting.

use super::cpu_start::{payload, table};
use super::*;
use crate::drivers::gic::driver::Acknowledged;
use crate::runtime::cpu_start::{CpuStart, start_vms};
use crate::runtime::host_console::{ConsoleMachine, HostConsole, POLL_MS};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

/// The host UART's INTID on the fake.
const UART_INTID: u32 = 33;
/// The console's poll timer PPI on the fake.
const POLL_INTID: u32 = 26;
/// The list registers' maintenance interrupt on the fake.
const MAINTENANCE_INTID: u32 = 25;
/// The guest timers' PPIs on the fake.
const TIMER_INTIDS: [u32; 2] = [27, 30];

/// The running CPU, the host UART and the host GIC of the fake machine.
#[derive(Default)]
pub(super) struct ConsoleSide {
    /// The running CPU.
    pub(super) cpu: usize,
    /// What the terminal shows.
    uart_out: Vec<u8>,
    /// What each receive interrupt finds in the UART.
    uart_in: VecDeque<Vec<u8>>,
    /// Each arming of the poll timer, in ticks.
    armed: Vec<u64>,
    /// PPIs enabled or disabled, in order.
    ppis: Vec<(u32, bool)>,
    /// The guest interrupts were silenced.
    silenced: bool,
    /// A host GIC is driven.
    gic_up: bool,
    /// The interrupts pending, in acknowledge order.
    pending: VecDeque<u32>,
    /// Interrupts finished, in order.
    finished: Vec<u32>,
    /// A wait for an interrupt ends the test (it would never return).
    pub(super) wait_ends_test: bool,
}

impl FakeHardware {
    fn side(&self) -> std::sync::MutexGuard<'_, ConsoleSide> {
        self.console_side.lock().unwrap()
    }

    fn terminal(&self) -> String {
        String::from_utf8_lossy(&self.side().uart_out).into_owned()
    }
}

impl ConsoleMachine for FakeHardware {
    fn uart_write(&self, bytes: &[u8]) {
        self.side().uart_out.extend_from_slice(bytes);
    }

    fn uart_receive(&self, buf: &mut [u8]) -> usize {
        let Some(bytes) = self.side().uart_in.pop_front() else {
            return 0;
        };
        buf[..bytes.len()].copy_from_slice(&bytes);
        bytes.len()
    }

    fn arm_poll_timer(&self, ticks: u64) {
        self.side().armed.push(ticks);
    }

    fn set_ppi_enabled(&self, intid: u32, enabled: bool) {
        self.side().ppis.push((intid, enabled));
    }

    fn silence_guest_interrupts(&self) {
        self.side().silenced = true;
    }

    fn gic_is_up(&self) -> bool {
        self.side().gic_up
    }

    fn acknowledge(&self) -> Acknowledged {
        match self.side().pending.pop_front() {
            Some(intid) => Acknowledged::for_tests(intid),
            None => Acknowledged::NONE,
        }
    }

    fn end_of_interrupt(&self, ack: Acknowledged) {
        self.side().finished.push(ack.intid);
    }

    fn maintenance_intid(&self) -> u32 {
        MAINTENANCE_INTID
    }

    fn timer_intids(&self) -> [u32; 2] {
        TIMER_INTIDS
    }

    fn halt(&self) -> ! {
        panic!("CPU {} halted", self.current_cpu())
    }
}

/// The fake machine with two VMs, `a` and `b`, created and published, the
/// host UART's interrupt on [`UART_INTID`], and a console not started.
fn machine() -> (&'static FakeHardware, &'static VmTable<FakeHardware>) {
    let hw = FakeHardware::new();
    hw.side().gic_up = true;
    hw.side().wait_ends_test = true;
    let mut info = boot_info(4);
    info.platform.uart_intid = Some(UART_INTID);
    let archive = payload(&[("a", conf(8, &[0], false)), ("b", conf(8, &[1], false))]);
    let started = start_vms(hw, &info, archive, table()).unwrap();
    (hw, started.machine)
}

fn console() -> &'static HostConsole<FakeHardware> {
    Box::leak(Box::new(HostConsole::new()))
}

/// What `f` panicked with.
fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("it returns only by panicking");
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => String::from(*payload.downcast::<&str>().unwrap()),
    }
}

#[test]
fn before_the_start_output_goes_to_the_uart_as_it_comes_and_input_is_dropped() {
    let (hw, _) = machine();
    let console = console();
    console.guest_output(hw, 1, b'x');
    console.guest_output_bytes(hw, 0, b"yz");
    console.host_line(hw, b"[hv] early\n");
    console.flush_vm(hw, 0);
    assert_eq!(hw.terminal(), "xyz[hv] early\n");
    hw.side().uart_in.push_back(b"typed".to_vec());
    console.host_input(hw);
    assert!(hw.side().uart_in.is_empty(), "the bytes were read");
    assert_eq!(hw.terminal(), "xyz[hv] early\n");
    assert!(!console.is_poll_timer(POLL_INTID));
    assert!(!console.is_poll_timer(0));
}

#[test]
fn the_start_makes_this_cpu_the_console_cpu_with_its_poll_timer_armed() {
    let (hw, machine) = machine();
    let console = console();
    hw.side().cpu = 2;
    console.start(hw, machine, POLL_INTID).unwrap();
    let side = hw.side();
    assert_eq!(side.ppis, vec![(POLL_INTID, true)]);
    // The fake's counter runs at 1 MHz.
    assert_eq!(side.armed, vec![1_000_000 * POLL_MS / 1000]);
    drop(side);
    assert!(console.is_poll_timer(POLL_INTID));
    assert!(!console.is_poll_timer(0), "0 is never the poll timer");
    assert!(!console.is_poll_timer(UART_INTID));
    // CPU 2 serves the console when it parks; CPU 0 halts.
    hw.side().cpu = 0;
    assert_eq!(panic_message(|| console.park(hw)), "CPU 0 halted");
    assert!(!hw.side().silenced, "a halting CPU leaves its interrupts");
    hw.side().cpu = 2;
    assert_eq!(panic_message(|| console.park(hw)), "the fake CPU waits");
    assert!(hw.side().silenced);
}

#[test]
fn a_vm_line_is_kept_whole_and_a_log_line_starts_a_line_of_its_own() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    console.guest_output_bytes(hw, 0, b"hello ");
    console.guest_output_bytes(hw, 1, b"other\n");
    console.guest_output_bytes(hw, 0, b"world\n");
    let terminal = hw.terminal();
    assert!(terminal.contains("hello world\n"), "{terminal:?}");
    assert!(terminal.contains("other\n"), "{terminal:?}");
    assert!(!terminal.contains("hello other"), "{terminal:?}");
    // An unfinished line is written when its VM ends.
    console.guest_output(hw, 1, b'!');
    assert!(!hw.terminal().ends_with('!'));
    console.flush_vm(hw, 1);
    assert!(hw.terminal().contains('!'));
}

#[test]
fn a_log_line_after_this_cpu_let_the_console_go_goes_through_it() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    // A half-typed monitor command (its input holds the console).
    hw.side().uart_in.push_back(b"\x1dfoc".to_vec());
    console.host_input(hw);
    let before = hw.terminal().len();
    console.host_line(hw, b"[hv] logged\n");
    let terminal = hw.terminal();
    let after = &terminal[before..];
    // The console writes the line and then the prompt with what was typed.
    assert!(
        after.starts_with("[hv] logged\n") || after.contains("\n[hv] logged\n"),
        "{after:?}"
    );
    assert!(after.ends_with("foc"), "{after:?}");
}

#[test]
fn a_line_logged_while_this_cpu_holds_the_console_is_written_directly() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        console.with_console(hw, |_| console.host_line(hw, b"[hv] from a command\n"));
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(Duration::from_secs(10))
        .expect("a log line from the console's holder waits for itself");
    assert!(hw.terminal().ends_with("[hv] from a command\n"));
    // Another CPU's line goes through the console once it is free.
    hw.side().cpu = 1;
    console.host_line(hw, b"[hv] elsewhere\n");
    assert!(hw.terminal().ends_with("[hv] elsewhere\n"));
}

#[test]
fn typed_bytes_reach_the_monitor_and_its_commands_see_the_vms() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    // Ctrl-] and a command split over two reads of the UART.
    hw.side().uart_in.push_back(b"\x1dv".to_vec());
    hw.side().uart_in.push_back(b"ms\r".to_vec());
    console.host_input(hw);
    assert!(hw.side().uart_in.is_empty());
    let terminal = hw.terminal();
    assert!(terminal.contains("vms"), "the monitor echoes: {terminal:?}");
    let listing = &terminal[terminal.find("vms").unwrap()..];
    assert!(
        listing.contains('a') && listing.contains('b'),
        "{terminal:?}"
    );
}

#[test]
fn the_parked_console_cpu_serves_the_uart_and_the_poll_timer_and_finishes_the_rest() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    {
        let mut side = hw.side();
        side.uart_in.push_back(b"\x1d".to_vec());
        side.pending
            .extend([UART_INTID, POLL_INTID, 0, MAINTENANCE_INTID, 9000]);
    }
    assert_eq!(panic_message(|| console.park(hw)), "the fake CPU waits");
    let side = hw.side();
    assert!(side.silenced);
    assert_eq!(
        side.finished,
        vec![UART_INTID, POLL_INTID, 0, MAINTENANCE_INTID, 9000]
    );
    // Armed at the start and again by the poll timer's interrupt.
    assert_eq!(side.armed.len(), 2);
    assert!(side.uart_in.is_empty(), "the UART was read");
    drop(side);
    // The escape alone opens the monitor at the next poll.
    assert!(hw.terminal().contains("monitor"), "{:?}", hw.terminal());
}

#[test]
fn a_parked_cpu_without_a_driven_gic_halts_even_the_console_cpu() {
    let (hw, machine) = machine();
    let console = console();
    console.start(hw, machine, POLL_INTID).unwrap();
    hw.side().gic_up = false;
    assert_eq!(panic_message(|| console.park(hw)), "CPU 0 halted");
}
