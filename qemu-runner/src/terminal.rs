//! The person's terminal while QEMU runs: raw mode, keys forwarded to QEMU,
//! and the terminal's own mode put back on every way out.
//!
//! When standard input is a terminal, QEMU does not get it: its stdin is a
//! pipe, and [`TerminalSession`] copies every byte typed into that pipe (a
//! forwarding thread that polls standard input every 100 ms, so it stops
//! when the run ends). QEMU's serial multiplexer reads the pipe as it would
//! the terminal (Ctrl-A x still quits QEMU), and the hypervisor's console
//! sees every key, Ctrl-] (0x1d) included. Only this module changes the
//! terminal's mode, so only it has to put it back:
//!
//! - raw mode as QEMU's own stdio backend sets it with `signal=off`: no
//!   echo, no line editing, no input translation, and no signal keys, so
//!   Ctrl-C and Ctrl-Z reach the guest or the monitor as bytes; output
//!   processing stays on, so `\n` still starts a new line;
//! - the mode found at the start is saved once, before raw mode, and put
//!   back (`tcsetattr`) when the session ends normally (the guard's drop:
//!   QEMU exited, the verdicts ended the run, the time limit ran out), from
//!   a panic hook (the runner panics with `panic = "abort"`, which runs no
//!   destructors; the hook also sends QEMU SIGTERM), and from a handler of SIGINT, SIGTERM, SIGHUP and SIGQUIT,
//!   which also sends QEMU SIGTERM and then dies of the same signal with its
//!   default action. `tcsetattr` and `kill` are async-signal-safe; the
//!   handler reads only the saved mode and two atomics.

use std::cell::UnsafeCell;
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::thread::{self, JoinHandle};

/// Standard input.
const STDIN: RawFd = libc::STDIN_FILENO;

/// How long the forwarding thread waits for a key before it looks whether
/// the session has ended.
const POLL_MS: libc::c_int = 100;

/// The terminal mode found when the session started, for the signal
/// handler and the panic hook; valid while [`SAVED_ARMED`] is true.
struct SavedMode(UnsafeCell<Option<libc::termios>>);

// SAFETY: the cell is written only by `TerminalSession::start` while
// `SAVED_ARMED` is false (no reader looks at it then), and read by the
// restorers only after they saw `SAVED_ARMED` true with Acquire ordering,
// which the writer set with Release after the write.
unsafe impl Sync for SavedMode {}

static SAVED: SavedMode = SavedMode(UnsafeCell::new(None));
/// Whether [`SAVED`] holds a mode still to be put back.
static SAVED_ARMED: AtomicBool = AtomicBool::new(false);
/// QEMU's process id while a session runs (0: none), for the signal handler.
static QEMU_PID: AtomicI32 = AtomicI32::new(0);
/// Installs the signal handlers and the panic hook once per process.
static HANDLERS: Once = Once::new();

/// Whether standard input is a terminal.
pub fn stdin_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(STDIN) == 1 }
}

/// Puts the saved mode back, if there is one still to put back. Safe to
/// call from a signal handler: an atomic swap and `tcsetattr`.
fn restore_saved_mode() {
    if SAVED_ARMED.swap(false, Ordering::AcqRel) {
        // SAFETY: SAVED_ARMED was true, so SAVED holds the mode written
        // before it was set (see `SavedMode`); nothing writes it meanwhile.
        if let Some(mode) = unsafe { &*SAVED.0.get() } {
            // SAFETY: `mode` is a valid termios read from this descriptor.
            unsafe { libc::tcsetattr(STDIN, libc::TCSANOW, mode) };
        }
    }
}

/// Tells QEMU to stop, if a session registered it. Safe to call from a
/// signal handler: an atomic swap and `kill`.
fn stop_registered_qemu() {
    let qemu = QEMU_PID.swap(0, Ordering::AcqRel);
    if qemu > 0 {
        // SAFETY: kill is async-signal-safe; `qemu` is our child, registered
        // while it runs and not yet waited for.
        unsafe { libc::kill(qemu, libc::SIGTERM) };
    }
}

/// The handler of SIGINT, SIGTERM, SIGHUP and SIGQUIT while a session may
/// run: terminal back, QEMU told to stop, then the signal's default action.
extern "C" fn on_fatal_signal(signal: libc::c_int) {
    restore_saved_mode();
    stop_registered_qemu();
    let message = b"\r\nqemu-runner: interrupted; QEMU stopped, terminal restored\r\n";
    // SAFETY: write, signal and raise are async-signal-safe; the buffer is a
    // static byte string.
    unsafe {
        libc::write(libc::STDERR_FILENO, message.as_ptr().cast(), message.len());
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

fn install_handlers() {
    HANDLERS.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: a zeroed sigaction is a valid starting point; the
            // handler is an `extern "C" fn(c_int)` that only calls
            // async-signal-safe functions.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fatal_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        let earlier = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_saved_mode();
            stop_registered_qemu();
            earlier(info);
        }));
    });
}

/// The mode QEMU's stdio backend gives a terminal with `signal=off`: keys
/// come one by one, unechoed and untranslated, signal keys are plain bytes;
/// output is still processed.
fn raw_mode(mut mode: libc::termios) -> libc::termios {
    mode.c_iflag &= !(libc::IGNBRK
        | libc::BRKINT
        | libc::PARMRK
        | libc::ISTRIP
        | libc::INLCR
        | libc::IGNCR
        | libc::ICRNL
        | libc::IXON);
    mode.c_oflag |= libc::OPOST;
    mode.c_lflag &= !(libc::ECHO | libc::ECHONL | libc::ICANON | libc::IEXTEN | libc::ISIG);
    mode.c_cflag &= !(libc::CSIZE | libc::PARENB);
    mode.c_cflag |= libc::CS8;
    mode.c_cc[libc::VMIN] = 1;
    mode.c_cc[libc::VTIME] = 0;
    mode
}

/// The terminal handed to QEMU for one run: raw mode, a thread copying
/// keys into QEMU's stdin. Dropping it stops the thread and puts the
/// terminal's mode back.
pub struct TerminalSession {
    stop: Arc<AtomicBool>,
    forwarder: Option<JoinHandle<()>>,
}

impl TerminalSession {
    /// Saves the terminal's mode, switches it to raw mode and starts
    /// copying keys into `qemu_stdin`; `qemu_pid` is stopped by the signal
    /// handler if the runner is killed meanwhile.
    pub fn start(qemu_stdin: ChildStdin, qemu_pid: u32) -> io::Result<TerminalSession> {
        install_handlers();
        // SAFETY: an all-zero termios is a valid value for tcgetattr to fill.
        let mut mode: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `mode` is a valid, writable termios.
        if unsafe { libc::tcgetattr(STDIN, &mut mode) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // A session left armed (none is: `Drop` disarms) would be put back
        // first, so the mode saved now is the person's.
        restore_saved_mode();
        // SAFETY: SAVED_ARMED is false: no restorer reads SAVED now.
        unsafe { *SAVED.0.get() = Some(mode) };
        SAVED_ARMED.store(true, Ordering::Release);
        QEMU_PID.store(qemu_pid as i32, Ordering::Release);
        let raw = raw_mode(mode);
        // SAFETY: `raw` is a valid termios derived from the current one.
        if unsafe { libc::tcsetattr(STDIN, libc::TCSANOW, &raw) } != 0 {
            let error = io::Error::last_os_error();
            restore_saved_mode();
            QEMU_PID.store(0, Ordering::Release);
            return Err(error);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let forwarder = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || forward_keys(qemu_stdin, &stop))
        };
        Ok(TerminalSession {
            stop,
            forwarder: Some(forwarder),
        })
    }
}

impl Drop for TerminalSession {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(forwarder) = self.forwarder.take() {
            // The thread wakes within POLL_MS; a panic in it is already
            // reported by the hook.
            let _ = forwarder.join();
        }
        QEMU_PID.store(0, Ordering::Release);
        restore_saved_mode();
    }
}

/// Copies keys from standard input into QEMU's stdin until `stop`, the end
/// of input, or QEMU closing its end.
fn forward_keys(mut qemu_stdin: ChildStdin, stop: &AtomicBool) {
    let mut keys = [0u8; 1024];
    while !stop.load(Ordering::Acquire) {
        let mut ready = libc::pollfd {
            fd: STDIN,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the length given.
        let polled = unsafe { libc::poll(&mut ready, 1, POLL_MS) };
        if polled < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if polled == 0 {
            continue;
        }
        if ready.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
            continue;
        }
        // SAFETY: `keys` is a writable buffer of the length given.
        let read = unsafe { libc::read(STDIN, keys.as_mut_ptr().cast(), keys.len()) };
        let read = match read {
            0 => return,
            n if n < 0 => {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            n => n as usize,
        };
        if qemu_stdin
            .write_all(&keys[..read])
            .and_then(|()| qemu_stdin.flush())
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_mode_passes_every_key_and_keeps_output_processing() {
        // SAFETY: an all-zero termios is a valid value.
        let mut cooked: libc::termios = unsafe { std::mem::zeroed() };
        cooked.c_iflag = libc::ICRNL | libc::IXON | libc::BRKINT;
        cooked.c_oflag = libc::OPOST | libc::ONLCR;
        cooked.c_lflag = libc::ECHO | libc::ICANON | libc::ISIG | libc::IEXTEN;
        cooked.c_cflag = libc::CS7 | libc::PARENB;
        let raw = raw_mode(cooked);
        assert_eq!(raw.c_iflag & (libc::ICRNL | libc::IXON | libc::BRKINT), 0);
        assert_eq!(
            raw.c_lflag & (libc::ECHO | libc::ICANON | libc::ISIG | libc::IEXTEN),
            0,
            "Ctrl-C and Ctrl-] are bytes for QEMU, not signals"
        );
        assert_eq!(raw.c_oflag, libc::OPOST | libc::ONLCR);
        assert_eq!(raw.c_cflag & libc::CSIZE, libc::CS8);
        assert_eq!(raw.c_cflag & libc::PARENB, 0);
        assert_eq!((raw.c_cc[libc::VMIN], raw.c_cc[libc::VTIME]), (1, 0));
    }
}
