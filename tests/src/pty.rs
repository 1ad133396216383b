//! A person at a terminal, for end-to-end tests: a program run on a
//! pseudo-terminal, keys typed into it one by one, its screen read back.
//!
//! [`Terminal::spawn`] opens a pseudo-terminal pair (`openpty`, 200 columns
//! by 50 rows, the kernel's default cooked mode), and starts the program as
//! the leader of a new session whose controlling terminal is the pair's
//! terminal side (`setsid`, `TIOCSCTTY`), standard input, output and error
//! all on it: what a shell in a terminal emulator does. The test holds the
//! other side: a thread reads it into a buffer (so the program never blocks
//! on a full terminal), [`Terminal::expect`] waits for text with a time limit
//! and fails with the screen so far when it does not come, [`Terminal::type_keys`]
//! writes keys a few milliseconds apart, as typed. The test also keeps the
//! terminal side open, so [`Terminal::mode`] reads its mode (`tcgetattr`)
//! whenever it likes, during the run and after the program exited, and
//! [`Terminal::signal_foreground`] sends a signal to the program's process
//! group, as the terminal does for Ctrl-C in cooked mode. Dropping a
//! [`Terminal`] kills the program's process group if it still runs.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Pause between two typed keys.
const KEY_INTERVAL: Duration = Duration::from_millis(15);

/// What the program wrote so far, and whether its side closed.
#[derive(Default)]
struct Screen {
    bytes: Vec<u8>,
    closed: bool,
}

/// A program running on a pseudo-terminal.
pub struct Terminal {
    child: Child,
    /// The test's side: keys are written to it, output read from it.
    master: File,
    /// The program's side, kept open to read its mode.
    slave: OwnedFd,
    screen: Arc<(Mutex<Screen>, Condvar)>,
    /// How far [`Terminal::expect`] has read.
    cursor: usize,
    started: Instant,
}

/// A terminal's mode: the four flag words and the control characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// Input flags (`c_iflag`).
    pub input: libc::tcflag_t,
    /// Output flags (`c_oflag`).
    pub output: libc::tcflag_t,
    /// Control flags (`c_cflag`).
    pub control: libc::tcflag_t,
    /// Local flags (`c_lflag`): echo, line editing, signal keys.
    pub local: libc::tcflag_t,
    /// Control characters (`c_cc`).
    pub chars: [libc::cc_t; libc::NCCS],
}

impl Mode {
    /// Whether the terminal is in raw mode: no line editing, no echo, no
    /// signal keys (Ctrl-C is a byte).
    pub fn is_raw(&self) -> bool {
        self.local & (libc::ICANON | libc::ECHO | libc::ISIG) == 0
    }
}

impl Terminal {
    /// Starts `program` with `args` on a new pseudo-terminal.
    pub fn spawn(program: &std::path::Path, args: &[&str]) -> std::io::Result<Terminal> {
        let mut master_fd: libc::c_int = -1;
        let mut slave_fd: libc::c_int = -1;
        let size = libc::winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: both descriptors are written by openpty; the name is not
        // asked for, the mode is the default one, and `size` outlives the call.
        let opened = unsafe {
            libc::openpty(
                &mut master_fd,
                &mut slave_fd,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        if opened != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: openpty succeeded: both are open descriptors we own.
        let (master, slave) = unsafe {
            (
                OwnedFd::from_raw_fd(master_fd),
                OwnedFd::from_raw_fd(slave_fd),
            )
        };
        let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?)
            .env("TERM", "xterm");
        // SAFETY: between fork and exec the closure calls only setsid and
        // ioctl, which are async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Standard input is the terminal side: make it the new
                // session's controlling terminal.
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let master = File::from(master);
        let screen = Arc::new((Mutex::new(Screen::default()), Condvar::new()));
        {
            let mut reader = master.try_clone()?;
            let screen = Arc::clone(&screen);
            thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                loop {
                    let read = reader.read(&mut chunk);
                    let (lock, changed) = &*screen;
                    let mut screen = lock.lock().expect("screen lock");
                    match read {
                        Ok(0) | Err(_) => {
                            screen.closed = true;
                            changed.notify_all();
                            return;
                        }
                        Ok(n) => screen.bytes.extend_from_slice(&chunk[..n]),
                    }
                    changed.notify_all();
                }
            });
        }
        Ok(Terminal {
            child,
            master,
            slave,
            screen,
            cursor: 0,
            started: Instant::now(),
        })
    }

    /// Everything the program wrote so far, as text.
    pub fn screen(&self) -> String {
        let (lock, _) = &*self.screen;
        String::from_utf8_lossy(&lock.lock().expect("screen lock").bytes).into_owned()
    }

    /// The end of the screen, for failure messages.
    fn tail(&self) -> String {
        let screen = self.screen();
        let start = screen
            .char_indices()
            .rev()
            .nth(6000)
            .map_or(0, |(at, _)| at);
        screen[start..].to_string()
    }

    /// Waits up to `limit` for `text` after what earlier calls found, moves
    /// past it and returns the screen from where it stood to the end of
    /// `text`; panics with the screen's end when it does not come.
    pub fn expect(&mut self, text: &str, limit: Duration) -> String {
        match self.try_expect(text, limit) {
            Ok(passed) => passed,
            Err(why) => panic!("{why}\n--- screen (end) ---\n{}", self.tail()),
        }
    }

    /// [`Terminal::expect`], returning why it did not come instead of
    /// panicking.
    pub fn try_expect(&mut self, text: &str, limit: Duration) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        let (lock, changed) = &*self.screen;
        let mut screen = lock.lock().expect("screen lock");
        loop {
            if let Some(at) = find(&screen.bytes[self.cursor..], text.as_bytes()) {
                let end = self.cursor + at + text.len();
                let passed = String::from_utf8_lossy(&screen.bytes[self.cursor..end]).into_owned();
                self.cursor = end;
                return Ok(passed);
            }
            if screen.closed {
                return Err(format!(
                    "{text:?} never came: the program closed the terminal"
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "{text:?} did not come within {limit:?} ({:.1} s into the run)",
                    self.started.elapsed().as_secs_f64()
                ));
            }
            // An exited program writes nothing more: one last look, then fail.
            if let Ok(Some(status)) = self.child.try_wait() {
                let seen = screen.bytes.len();
                screen = changed
                    .wait_timeout(screen, Duration::from_millis(300))
                    .expect("screen lock")
                    .0;
                if screen.bytes.len() == seen {
                    return Err(format!(
                        "{text:?} never came: the program exited ({status})"
                    ));
                }
                continue;
            }
            let slice = (deadline - now).min(Duration::from_millis(200));
            screen = changed.wait_timeout(screen, slice).expect("screen lock").0;
        }
    }

    /// Whether `text` came after what [`Terminal::expect`] has read so far.
    pub fn shows_later(&self, text: &str) -> bool {
        let (lock, _) = &*self.screen;
        let screen = lock.lock().expect("screen lock");
        find(&screen.bytes[self.cursor..], text.as_bytes()).is_some()
    }

    /// Types `keys`, one byte at a time, 15 ms apart.
    pub fn type_keys(&mut self, keys: &[u8]) {
        for key in keys {
            self.master
                .write_all(std::slice::from_ref(key))
                .and_then(|()| self.master.flush())
                .expect("typing into the terminal");
            thread::sleep(KEY_INTERVAL);
        }
    }

    /// The terminal's mode now.
    pub fn mode(&self) -> Mode {
        // SAFETY: an all-zero termios is a valid value for tcgetattr to fill.
        let mut mode: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `slave` is an open terminal descriptor, `mode` writable.
        let got = unsafe { libc::tcgetattr(self.slave.as_raw_fd(), &mut mode) };
        assert_eq!(got, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        Mode {
            input: mode.c_iflag,
            output: mode.c_oflag,
            control: mode.c_cflag,
            local: mode.c_lflag,
            chars: mode.c_cc,
        }
    }

    /// Sends `signal` to the program's process group (it leads its
    /// session, so the group is its id): what the terminal does for Ctrl-C
    /// when its mode lets Ctrl-C be a signal.
    pub fn signal_foreground(&self, signal: libc::c_int) {
        let group = self.child.id() as libc::pid_t;
        // SAFETY: the group is the one our child leads; it has not been
        // waited for, so its id is not reused.
        let sent = unsafe { libc::kill(-group, signal) };
        assert_eq!(sent, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Whether the program still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the program to exit; panics with the screen's
    /// end when it does not.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the program") {
                // Let the reader take in the last output.
                thread::sleep(Duration::from_millis(100));
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the program still runs after {limit:?}\n--- screen (end) ---\n{}",
                    self.tail()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let group = self.child.id() as libc::pid_t;
            // SAFETY: our child's group, not yet waited for.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}
