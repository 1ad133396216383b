//! Routing of console bytes between the host UART and the VMs' PL011s.
//!
//! The host has one console; every VM has an emulated PL011. This module
//! decides which terminal bytes a guest's output becomes, and which VM a
//! typed byte goes to. It knows nothing of the monitor's commands: it only
//! reports when the escape key asks for the monitor, and lets the monitor
//! write through it so that monitor text and guest lines never share a line.
//!
//! # Output
//!
//! With one VM its bytes go to the terminal as they come, unchanged and
//! unprefixed (an interactive shell's prompt and echo show at once), except
//! while the monitor's prompt shows: then they are buffered like below.
//!
//! With more than one VM (or the monitor open) each VM has a line buffer of [`LINE_CAPACITY`]
//! bytes. A guest byte is appended to its VM's buffer (`\r` is dropped,
//! `\n` ends the line). The buffer is written, as `[<name>] ` and the bytes,
//! when the line ends, when the buffer fills, or when [`ConsoleMux::poll`]
//! finds that the VM wrote nothing since the previous poll (a prompt waiting
//! for input). Nothing else is stored per VM, so a guest that prints forever
//! without a newline holds at most one buffer.
//!
//! The hypervisor's own lines (its log) go through
//! [`ConsoleMux::write_host_line`], which starts them on a line of their
//! own like any other writer's.
//!
//! The mux remembers who owns the terminal's current line (the cursor):
//! nobody (line start), one VM (its line was written without its `\n`), or
//! the monitor (its prompt is showing). A VM's later bytes continue its own
//! open line without a second prefix; anyone else first ends the open line
//! with `\n` and then writes a line of its own. So the bytes of two VMs are
//! never on one terminal line, and every terminal line that holds guest
//! output starts with exactly one prefix.
//!
//! # Input
//!
//! Typed bytes go to the focused VM (the first VM until the monitor's
//! `focus` changes it). [`ESCAPE`] (Ctrl-], 0x1d, the telnet and virsh
//! escape; QEMU's own escape is Ctrl-A, which passes through) is held back:
//!
//! - a second Ctrl-] right after it sends one literal 0x1d to the guest;
//! - any other byte opens the monitor, and that byte is the monitor's first key;
//! - if no byte follows before the next [`ConsoleMux::poll`], the monitor opens.
//!
//! The escape state survives between reads, so an escape split across two
//! UART reads behaves like one in a single read.

use alloc::string::String;
use alloc::vec::Vec;
use boot_payload::vmname::{VmName, VmNameError};
use core::fmt;

/// The escape key: Ctrl-] (ASCII GS, 0x1d).
pub const ESCAPE: u8 = 0x1d;

/// Bytes of a VM's output line held before it is written without its `\n`.
pub const LINE_CAPACITY: usize = 256;

/// Longest VM name (the payload's rule, `boot_payload::vmname`).
pub use boot_payload::vmname::MAX_NAME_LEN;

/// Most VMs a console serves.
pub const MAX_VMS: usize = 64;

/// A VM, by its index in the list the console was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VmId(pub usize);

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where the console's terminal bytes go (the host UART). Lines end with a
/// bare `\n`; the UART driver adds the `\r`.
pub trait ConsoleOutput {
    /// Writes `bytes` to the terminal.
    fn write_bytes(&mut self, bytes: &[u8]);
}

/// Why a console could not be built or a call was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleError {
    /// No VM names were given.
    NoVms,
    /// More than [`MAX_VMS`] VMs.
    TooManyVms(usize),
    /// A name the payload's rule (`boot_payload::vmname::VmName::new`)
    /// refuses, with why.
    BadName(String, VmNameError),
    /// Two VMs with one name.
    DuplicateName(String),
    /// A VM id the console does not have.
    NoSuchVm(VmId),
}

impl fmt::Display for ConsoleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoVms => write!(f, "a console needs at least one VM"),
            Self::TooManyVms(n) => write!(f, "{n} VMs; a console serves at most {MAX_VMS}"),
            Self::BadName(name, why) => write!(f, "bad VM name {name:?}: {why}"),
            Self::DuplicateName(name) => write!(f, "two VMs are named {name:?}"),
            Self::NoSuchVm(vm) => write!(f, "no VM with id {vm}"),
        }
    }
}

impl core::error::Error for ConsoleError {}

/// Checks a VM name against the payload's rule ([`VmName::new`]).
pub fn check_name(name: &str) -> Result<(), ConsoleError> {
    VmName::new(name)
        .map(|_| ())
        .map_err(|why| ConsoleError::BadName(String::from(name), why))
}

/// What a typed byte (outside the monitor) turned into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxRoute {
    /// Deliver the byte to the VM's PL011.
    Guest(VmId, u8),
    /// The escape key: held until the next byte or poll.
    Held,
    /// Open the monitor; `first` is the key that followed the escape, if any.
    OpenMonitor {
        /// The monitor's first key.
        first: Option<u8>,
    },
}

/// What a [`ConsoleMux::poll`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollOutcome {
    /// An escape key waited alone since the previous poll: open the monitor.
    pub open_monitor: bool,
    /// A guest line ended the monitor's line: redraw the prompt.
    pub monitor_line_ended: bool,
}

/// Who owns the terminal's current line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cursor {
    /// At the start of a line.
    LineStart,
    /// In the middle of this VM's line.
    Guest(VmId),
    /// In the middle of a monitor line (its prompt).
    Monitor,
}

/// One VM's console state.
#[derive(Clone, Debug)]
struct VmConsole {
    name: String,
    /// `[<name>] `, or empty with one VM.
    prefix: String,
    /// The unwritten part of the current line; never more than `LINE_CAPACITY`.
    line: Vec<u8>,
    /// A byte arrived since the last poll.
    fresh: bool,
    /// Typed bytes the VM's PL011 refused.
    rx_dropped: u64,
}

/// The console's routing state; see the module documentation.
#[derive(Clone, Debug)]
pub struct ConsoleMux {
    vms: Vec<VmConsole>,
    focus: VmId,
    cursor: Cursor,
    escape_pending: bool,
}

impl ConsoleMux {
    /// A console for VMs named `names` (ids are their indexes); focus on the first.
    pub fn new(names: &[&str]) -> Result<Self, ConsoleError> {
        if names.is_empty() {
            return Err(ConsoleError::NoVms);
        }
        if names.len() > MAX_VMS {
            return Err(ConsoleError::TooManyVms(names.len()));
        }
        let mut vms: Vec<VmConsole> = Vec::with_capacity(names.len());
        for &name in names {
            check_name(name)?;
            if vms.iter().any(|vm| vm.name == name) {
                return Err(ConsoleError::DuplicateName(String::from(name)));
            }
            let prefix = if names.len() > 1 {
                alloc::format!("[{name}] ")
            } else {
                String::new()
            };
            vms.push(VmConsole {
                name: String::from(name),
                prefix,
                line: Vec::with_capacity(LINE_CAPACITY),
                fresh: false,
                rx_dropped: 0,
            });
        }
        Ok(Self {
            vms,
            focus: VmId(0),
            cursor: Cursor::LineStart,
            escape_pending: false,
        })
    }

    /// How many VMs.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// The name of `vm`.
    pub fn name(&self, vm: VmId) -> Result<&str, ConsoleError> {
        Ok(&self.vm(vm)?.name)
    }

    /// The VM named `name`.
    pub fn find(&self, name: &str) -> Option<VmId> {
        self.vms.iter().position(|vm| vm.name == name).map(VmId)
    }

    /// The VM that typed bytes go to.
    pub fn focus(&self) -> VmId {
        self.focus
    }

    /// Sends typed bytes to `vm` from now on.
    pub fn set_focus(&mut self, vm: VmId) -> Result<(), ConsoleError> {
        self.vm(vm)?;
        self.focus = vm;
        Ok(())
    }

    /// Typed bytes `vm`'s PL011 refused.
    pub fn rx_dropped(&self, vm: VmId) -> Result<u64, ConsoleError> {
        Ok(self.vm(vm)?.rx_dropped)
    }

    /// Counts a typed byte that `vm`'s PL011 refused.
    pub fn note_rx_dropped(&mut self, vm: VmId) -> Result<(), ConsoleError> {
        let vm = self.vm_mut(vm)?;
        vm.rx_dropped = vm.rx_dropped.saturating_add(1);
        Ok(())
    }

    /// Bytes of `vm`'s line waiting to be written.
    pub fn buffered(&self, vm: VmId) -> Result<usize, ConsoleError> {
        Ok(self.vm(vm)?.line.len())
    }

    /// Whether an escape key waits for its next byte.
    pub fn escape_pending(&self) -> bool {
        self.escape_pending
    }

    fn vm(&self, vm: VmId) -> Result<&VmConsole, ConsoleError> {
        self.vms.get(vm.0).ok_or(ConsoleError::NoSuchVm(vm))
    }

    fn vm_mut(&mut self, vm: VmId) -> Result<&mut VmConsole, ConsoleError> {
        self.vms.get_mut(vm.0).ok_or(ConsoleError::NoSuchVm(vm))
    }

    /// Takes one byte of `vm`'s output. Returns whether a line that the
    /// monitor owned was ended to write it (the monitor then redraws its
    /// prompt).
    pub fn guest_byte(
        &mut self,
        vm: VmId,
        byte: u8,
        out: &mut impl ConsoleOutput,
    ) -> Result<bool, ConsoleError> {
        self.vm(vm)?;
        if self.vms.len() == 1 && self.cursor != Cursor::Monitor {
            let interrupted = self.claim_line(vm, out);
            let console = &mut self.vms[vm.0];
            out.write_bytes(&console.line);
            console.line.clear();
            out.write_bytes(&[byte]);
            self.cursor = if byte == b'\n' {
                Cursor::LineStart
            } else {
                Cursor::Guest(vm)
            };
            return Ok(interrupted);
        }
        let console = &mut self.vms[vm.0];
        console.fresh = true;
        match byte {
            b'\r' => Ok(false),
            b'\n' => Ok(self.write_line(vm, true, out)),
            _ => {
                console.line.push(byte);
                if console.line.len() >= LINE_CAPACITY {
                    Ok(self.write_line(vm, false, out))
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// Writes `vm`'s buffered bytes now (a VM that stops or restarts), ending
    /// its line. Returns whether the monitor's line was ended.
    pub fn flush_vm(
        &mut self,
        vm: VmId,
        out: &mut impl ConsoleOutput,
    ) -> Result<bool, ConsoleError> {
        let console = self.vm(vm)?;
        if console.line.is_empty() && self.cursor != Cursor::Guest(vm) {
            return Ok(false);
        }
        Ok(self.write_line(vm, true, out))
    }

    /// The periodic tick. Writes (without ending them) the lines of VMs that
    /// wrote nothing since the previous poll, unless `hold_partial_lines`
    /// (the monitor is open), and ends a pending escape.
    pub fn poll(&mut self, hold_partial_lines: bool, out: &mut impl ConsoleOutput) -> PollOutcome {
        let mut monitor_line_ended = false;
        if !hold_partial_lines {
            for index in 0..self.vms.len() {
                let console = &mut self.vms[index];
                let stale = !console.fresh && !console.line.is_empty();
                console.fresh = false;
                if stale {
                    monitor_line_ended |= self.write_line(VmId(index), false, out);
                }
            }
        }
        PollOutcome {
            open_monitor: core::mem::replace(&mut self.escape_pending, false),
            monitor_line_ended,
        }
    }

    /// Routes one typed byte while the console (not the monitor) has the keyboard.
    pub fn route_input(&mut self, byte: u8) -> RxRoute {
        if self.escape_pending {
            self.escape_pending = false;
            if byte == ESCAPE {
                RxRoute::Guest(self.focus, ESCAPE)
            } else {
                RxRoute::OpenMonitor { first: Some(byte) }
            }
        } else if byte == ESCAPE {
            self.escape_pending = true;
            RxRoute::Held
        } else {
            RxRoute::Guest(self.focus, byte)
        }
    }

    /// Writes monitor text: ends an open guest line first, so the text starts
    /// on a line of its own. Text that does not end with `\n` (a prompt)
    /// leaves the line to the monitor.
    pub fn write_monitor(&mut self, bytes: &[u8], out: &mut impl ConsoleOutput) {
        if bytes.is_empty() {
            return;
        }
        if let Cursor::Guest(_) = self.cursor {
            out.write_bytes(b"\n");
            self.cursor = Cursor::LineStart;
        }
        out.write_bytes(bytes);
        self.cursor = if bytes.ends_with(b"\n") {
            Cursor::LineStart
        } else {
            Cursor::Monitor
        };
    }

    /// Writes a whole line of the hypervisor's own (a log line, ending with
    /// `\n`) on a line of its own: ends an open guest or monitor line first.
    /// Returns whether that line was the monitor's (it redraws its prompt).
    pub fn write_host_line(&mut self, line: &[u8], out: &mut impl ConsoleOutput) -> bool {
        let interrupted = self.cursor == Cursor::Monitor;
        self.end_line(out);
        out.write_bytes(line);
        if !line.ends_with(b"\n") {
            out.write_bytes(b"\n");
        }
        interrupted
    }

    /// Ends whatever line is open (guest or monitor), so the next text starts
    /// a line.
    pub fn end_line(&mut self, out: &mut impl ConsoleOutput) {
        if self.cursor != Cursor::LineStart {
            out.write_bytes(b"\n");
            self.cursor = Cursor::LineStart;
        }
    }

    /// Makes the terminal line `vm`'s: ends someone else's open line. Returns
    /// whether that line was the monitor's.
    fn claim_line(&mut self, vm: VmId, out: &mut impl ConsoleOutput) -> bool {
        match self.cursor {
            Cursor::Guest(owner) if owner == vm => false,
            Cursor::LineStart => {
                out.write_bytes(self.vms[vm.0].prefix.as_bytes());
                false
            }
            Cursor::Guest(_) | Cursor::Monitor => {
                out.write_bytes(b"\n");
                out.write_bytes(self.vms[vm.0].prefix.as_bytes());
                self.cursor == Cursor::Monitor
            }
        }
    }

    /// Writes `vm`'s buffered bytes on its line, and ends the line if `end`.
    fn write_line(&mut self, vm: VmId, end: bool, out: &mut impl ConsoleOutput) -> bool {
        let interrupted = self.claim_line(vm, out);
        let console = &mut self.vms[vm.0];
        out.write_bytes(&console.line);
        console.line.clear();
        if end {
            out.write_bytes(b"\n");
            self.cursor = Cursor::LineStart;
        } else {
            self.cursor = Cursor::Guest(vm);
        }
        interrupted
    }
}
