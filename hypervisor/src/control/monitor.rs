//! The hypervisor monitor: a line editor and the commands it runs against
//! the machine, through the [`MonitorTarget`] trait.
//!
//! # Line editor
//!
//! Printable ASCII is appended (up to [`EDIT_CAPACITY`] bytes) and echoed;
//! backspace (0x08) and DEL (0x7f) erase the last byte (`\x08 \x08`); Enter
//! (`\r` or `\n`, `\r\n` counts once) runs the line; Ctrl-C (0x03) or
//! Ctrl-] (0x1d) leaves the monitor. An ANSI escape sequence (ESC `[` ...
//! final byte, ESC `O` and one byte, ESC and one byte: arrow and function
//! keys) is skipped. Any other byte, and a byte
//! past the capacity, answers BEL (0x07) and is not stored.
//!
//! # Output
//!
//! Opening prints [`OPEN_BANNER`] and the prompt [`PROMPT`]; leaving prints
//! `-- console: input goes to <name> --`. A command's reply is the lines
//! between the echoed command line and the next prompt; they carry no
//! prefix. Errors are one line `error: <reason>`; successes of actions are one
//! line `ok: <what was done>`. Tables have a header line and one row per
//! item, columns padded to fixed widths and separated by spaces; no field
//! holds a space, so a test splits rows on whitespace:
//!
//! ```text
//! vms:       ID  NAME              STATE     VCPUS  CPUS              RAM  SLOTS  FOCUS
//! counters:  COUNTER                  VALUE
//! devices:   DEV KIND     WINDOW                SPI  STATUS   FEATURES   COUNTERS
//! slots:     SLOT   IPA                 SIZE        BACKING             FLAGS
//! dirty get: IPA                 PAGES
//! ```
//!
//! `CPUS` lists physical CPUs as ranges (`0-1,3`, `-` for none), `RAM` and
//! `SIZE` are sizes as the commands read them (`512M`, `4K`), addresses are
//! `0x` and 16 hex digits. `FOCUS` is `*` for the focused VM and `-`
//! otherwise. `counters` lists the VM's counters (the machine's names, in
//! its order) and then the console's own `console_rx_dropped`. `dirty get`
//! lists runs of consecutive dirty pages (first address, page count), at
//! most [`DIRTY_RUNS_SHOWN`], and ends with an `ok:` line that counts the
//! pages and the runs. `devices` lists the VM's virtio devices (the
//! machine's lines: index, kind, window, SPI, status bits by name joined
//! with `|`, negotiated features, counters as `name=value` joined with `,`),
//! or says it has none.

use crate::vm::migration_plan::MigrationOptions;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use memslot::{DirtyLogMode, PAGE_SHIFT, SlotFlags, SlotId};

use super::command::{self, Command, CommandError, Size, VmRef};
use super::console_mux::{ConsoleMux, ConsoleOutput, VmId};

/// The prompt.
pub const PROMPT: &str = "hv> ";

/// The line printed when the monitor opens.
pub const OPEN_BANNER: &str = "-- monitor: help lists commands; exit, Ctrl-] or Ctrl-C returns --";

/// Longest command line.
pub const EDIT_CAPACITY: usize = 128;

/// A VM's run state as the machine reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Its vCPUs run.
    Running,
    /// Held by `pause`.
    Paused,
    /// Powered off by itself or stopped by `stop`.
    Stopped,
    /// Between `restart` and running again.
    Restarting,
}

impl VmState {
    /// The word the `vms` table uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
            Self::Restarting => "restarting",
        }
    }
}

/// What `vms` shows of one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmInfo {
    /// Run state.
    pub state: VmState,
    /// vCPUs.
    pub vcpus: u32,
    /// Physical CPUs its vCPUs run on, bit `n` for CPU `n`.
    pub cpus: u64,
    /// Guest RAM in bytes.
    pub ram_bytes: u64,
    /// Live memslots.
    pub memslots: u32,
}

/// What `slots` shows of one memslot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    /// The slot's id.
    pub id: SlotId,
    /// First guest physical address.
    pub ipa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host physical address of the backing memory.
    pub backing: u64,
    /// Dirty logging or read-only.
    pub flags: SlotFlags,
}

/// What `dirty get` collected of one slot: a bit per page, from the slot's
/// first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyPages {
    /// The slot's first guest physical address.
    pub ipa: u64,
    /// Bit `i % 64` of word `i / 64` is the slot's page `i`.
    pub bitmap: Vec<u64>,
}

impl DirtyPages {
    /// The runs of consecutive dirty pages: (first page, pages), in order.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let bit = |page: u64| self.bitmap[(page / 64) as usize] >> (page % 64) & 1 != 0;
        let total = self.bitmap.len() as u64 * 64;
        let mut page = 0;
        core::iter::from_fn(move || {
            while page < total && !bit(page) {
                page += 1;
            }
            let first = page;
            while page < total && bit(page) {
                page += 1;
            }
            (page > first).then_some((first, page - first))
        })
    }

    /// How many pages are dirty.
    pub fn count(&self) -> u64 {
        self.bitmap.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// Runs `dirty get` lists; more are counted in its `ok:` line.
pub const DIRTY_RUNS_SHOWN: usize = 32;

/// A memslot `slot add` asks for; the machine finds its backing memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRequest {
    /// The new slot's id.
    pub id: SlotId,
    /// First guest physical address.
    pub ipa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Dirty logging or read-only.
    pub flags: SlotFlags,
}

/// The machine as the monitor drives it. VM ids are the console's
/// ([`VmId`], indexes of the names the console was built with). Every call
/// may be made while other VMs run; an `Err` is printed as `error: <Display>`
/// and changes nothing.
pub trait MonitorTarget {
    /// Why the machine refused a request.
    type Error: core::error::Error;

    /// The `vms` row of `vm`.
    fn vm_info(&self, vm: VmId) -> Result<VmInfo, Self::Error>;
    /// Calls `each` with every counter of `vm`, by name, in report order.
    fn counters(&self, vm: VmId, each: &mut dyn FnMut(&str, u64)) -> Result<(), Self::Error>;
    /// Calls `each` with one line per virtio device of `vm`, in guest
    /// order (`devices VM`).
    fn devices(&self, vm: VmId, each: &mut dyn FnMut(&str)) -> Result<(), Self::Error>;
    /// Stops running `vm`'s vCPUs, keeping their state.
    fn pause(&mut self, vm: VmId) -> Result<(), Self::Error>;
    /// Runs a paused `vm` again.
    fn resume(&mut self, vm: VmId) -> Result<(), Self::Error>;
    /// Stops `vm` for good (its CPUs go idle).
    fn stop(&mut self, vm: VmId) -> Result<(), Self::Error>;
    /// Reboots `vm` from its boot image.
    fn restart(&mut self, vm: VmId) -> Result<(), Self::Error>;
    /// Starts a live migration of `src` into `dst` with `options`
    /// (requested, not waited for: the hypervisor reports how it went).
    fn migrate(
        &mut self,
        src: VmId,
        dst: VmId,
        options: MigrationOptions,
    ) -> Result<(), Self::Error>;
    /// Calls `each` with every memslot of `vm`, by ascending id.
    fn slots(&self, vm: VmId, each: &mut dyn FnMut(SlotInfo)) -> Result<(), Self::Error>;
    /// Adds a memslot to `vm`; returns the backing address chosen.
    fn add_slot(&mut self, vm: VmId, request: SlotRequest) -> Result<u64, Self::Error>;
    /// Deletes a memslot of `vm`.
    fn delete_slot(&mut self, vm: VmId, slot: SlotId) -> Result<(), Self::Error>;
    /// Moves a memslot of `vm` to a new guest address.
    fn move_slot(&mut self, vm: VmId, slot: SlotId, ipa: u64) -> Result<(), Self::Error>;
    /// Changes a memslot's flags.
    fn set_slot_flags(
        &mut self,
        vm: VmId,
        slot: SlotId,
        flags: SlotFlags,
    ) -> Result<(), Self::Error>;
    /// Collects the dirty log of a logging slot: the pages written since
    /// the last collection (since logging began, for the first), which are
    /// write-protected again, in any mode (with manual protection the
    /// reported pages are cleared too).
    fn collect_dirty(&mut self, vm: VmId, slot: SlotId) -> Result<DirtyPages, Self::Error>;
    /// Sets `vm`'s dirty-log mode and eager split chunk size (0: off).
    fn set_dirty_mode(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        chunk: u64,
    ) -> Result<(), Self::Error>;
    /// Powers the machine off (may not return on the machine).
    fn power_off(&mut self) -> Result<(), Self::Error>;
}

/// What the monitor wants after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorStep {
    /// Keep the keyboard.
    Stay,
    /// Give the keyboard back to the console.
    Leave,
}

/// Where the line editor is in an ANSI escape sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AnsiState {
    None,
    /// After ESC.
    Escape,
    /// After ESC `[`, until a final byte.
    Csi,
    /// After ESC `O`: one more byte.
    Ss3,
}

/// The monitor's line editor and command runner.
#[derive(Clone, Debug)]
pub struct Monitor {
    line: String,
    after_cr: bool,
    ansi: AnsiState,
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a command's reply goes and how it names VMs: the console (its
/// mux knows the names and the focus) or a control VM's monitor port
/// (`runtime::control_port`, which has no focus).
pub trait ReplySink: Write {
    /// How many VMs there are (ids `0..count`).
    fn vm_count(&self) -> usize;
    /// VM `vm`'s name.
    fn vm_name(&self, vm: VmId) -> Option<&str>;
    /// The VM named `name`.
    fn find_vm(&self, name: &str) -> Option<VmId>;
    /// The VM typed bytes go to, if this side has a keyboard.
    fn focus(&self) -> Option<VmId>;
    /// Sends typed bytes to `vm`; false when this side has no keyboard.
    fn set_focus(&mut self, vm: VmId) -> bool;
    /// Typed bytes for `vm` the console dropped, if it counts them.
    fn rx_dropped(&self, vm: VmId) -> Option<u64>;
}

/// Formats monitor text straight to the console.
struct MonitorWriter<'a, O: ConsoleOutput> {
    mux: &'a mut ConsoleMux,
    out: &'a mut O,
}

impl<O: ConsoleOutput> Write for MonitorWriter<'_, O> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.mux.write_monitor(s.as_bytes(), self.out);
        Ok(())
    }
}

impl<O: ConsoleOutput> ReplySink for MonitorWriter<'_, O> {
    fn vm_count(&self) -> usize {
        self.mux.vm_count()
    }

    fn vm_name(&self, vm: VmId) -> Option<&str> {
        self.mux.name(vm).ok()
    }

    fn find_vm(&self, name: &str) -> Option<VmId> {
        self.mux.find(name)
    }

    fn focus(&self) -> Option<VmId> {
        Some(self.mux.focus())
    }

    fn set_focus(&mut self, vm: VmId) -> bool {
        self.mux.set_focus(vm).is_ok()
    }

    fn rx_dropped(&self, vm: VmId) -> Option<u64> {
        self.mux.rx_dropped(vm).ok()
    }
}

/// Why a command failed: the line, the VM lookup or the machine.
enum Failure<'a, E> {
    Parse(CommandError<'a>),
    NoVm(VmRef<'a>),
    Target(E),
}

impl<E: fmt::Display> fmt::Display for Failure<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse(error) => write!(f, "{error}"),
            Self::NoVm(VmRef::Id(id)) => write!(f, "no VM with id {id}; vms lists them"),
            Self::NoVm(VmRef::Name(name)) => write!(f, "no VM named {name:?}; vms lists them"),
            Self::Target(error) => write!(f, "{error}"),
        }
    }
}

/// Physical CPUs as ranges: `0-3,5`, `-` for none.
struct CpuList(u64);

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        let mut cpu = 0;
        while cpu < 64 {
            if self.0 & (1 << cpu) == 0 {
                cpu += 1;
                continue;
            }
            let first = cpu;
            while cpu < 64 && self.0 & (1 << cpu) != 0 {
                cpu += 1;
            }
            if !text.is_empty() {
                text.push(',');
            }
            let _ = match cpu - 1 - first {
                0 => write!(text, "{first}"),
                _ => write!(text, "{first}-{}", cpu - 1),
            };
        }
        if text.is_empty() {
            text.push('-');
        }
        f.pad(&text)
    }
}

impl Monitor {
    /// A monitor with an empty line.
    pub const fn new() -> Self {
        Self {
            line: String::new(),
            after_cr: false,
            ansi: AnsiState::None,
        }
    }

    /// The line typed so far.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// Prints the banner and the prompt.
    pub fn open(&mut self, mux: &mut ConsoleMux, out: &mut impl ConsoleOutput) {
        self.line.clear();
        self.after_cr = false;
        self.ansi = AnsiState::None;
        mux.write_monitor(OPEN_BANNER.as_bytes(), out);
        mux.write_monitor(b"\n", out);
        mux.write_monitor(PROMPT.as_bytes(), out);
    }

    /// Prints the prompt and the line typed so far again (after a guest line
    /// ended the prompt's line).
    pub fn redraw(&self, mux: &mut ConsoleMux, out: &mut impl ConsoleOutput) {
        mux.write_monitor(PROMPT.as_bytes(), out);
        mux.write_monitor(self.line.as_bytes(), out);
    }

    /// Takes one typed byte.
    pub fn on_byte<T: MonitorTarget>(
        &mut self,
        byte: u8,
        mux: &mut ConsoleMux,
        out: &mut impl ConsoleOutput,
        target: &mut T,
    ) -> MonitorStep {
        let after_cr = core::mem::replace(&mut self.after_cr, byte == b'\r');
        match self.ansi {
            AnsiState::Escape => {
                self.ansi = match byte {
                    b'[' => AnsiState::Csi,
                    b'O' => AnsiState::Ss3,
                    _ => AnsiState::None,
                };
                return MonitorStep::Stay;
            }
            AnsiState::Ss3 => {
                self.ansi = AnsiState::None;
                return MonitorStep::Stay;
            }
            AnsiState::Csi => {
                if (0x40..=0x7e).contains(&byte) {
                    self.ansi = AnsiState::None;
                }
                return MonitorStep::Stay;
            }
            AnsiState::None => {}
        }
        match byte {
            0x03 | super::console_mux::ESCAPE => {
                self.leave(mux, out);
                MonitorStep::Leave
            }
            0x1b => {
                self.ansi = AnsiState::Escape;
                MonitorStep::Stay
            }
            b'\n' if after_cr => MonitorStep::Stay,
            b'\r' | b'\n' => {
                mux.write_monitor(b"\n", out);
                let line = core::mem::take(&mut self.line);
                let step = self.run(&line, mux, out, target);
                self.line = line;
                self.line.clear();
                match step {
                    MonitorStep::Stay => mux.write_monitor(PROMPT.as_bytes(), out),
                    MonitorStep::Leave => self.leave(mux, out),
                }
                step
            }
            0x08 | 0x7f => {
                if self.line.pop().is_some() {
                    mux.write_monitor(b"\x08 \x08", out);
                } else {
                    mux.write_monitor(b"\x07", out);
                }
                MonitorStep::Stay
            }
            0x20..=0x7e if self.line.len() < EDIT_CAPACITY => {
                self.line.push(char::from(byte));
                mux.write_monitor(&[byte], out);
                MonitorStep::Stay
            }
            _ => {
                mux.write_monitor(b"\x07", out);
                MonitorStep::Stay
            }
        }
    }

    fn leave(&mut self, mux: &mut ConsoleMux, out: &mut impl ConsoleOutput) {
        self.line.clear();
        let focus = mux.focus();
        let name = String::from(mux.name(focus).unwrap_or("?"));
        mux.end_line(out);
        let mut w = MonitorWriter { mux, out };
        let _ = writeln!(w, "-- console: input goes to {name} --");
    }

    /// Runs one command line; its reply goes to the console.
    pub fn run<T: MonitorTarget>(
        &mut self,
        line: &str,
        mux: &mut ConsoleMux,
        out: &mut impl ConsoleOutput,
        target: &mut T,
    ) -> MonitorStep {
        run_command(line, &mut MonitorWriter { mux, out }, target)
    }
}

/// Runs one command line with its reply going to `w` (the console, or a
/// control VM's monitor port): the same commands and answers everywhere.
pub fn run_command<T: MonitorTarget>(
    line: &str,
    w: &mut impl ReplySink,
    target: &mut T,
) -> MonitorStep {
    match execute(line, w, target) {
        Ok(step) => step,
        Err(failure) => {
            let _ = writeln!(w, "error: {failure}");
            MonitorStep::Stay
        }
    }
}

/// Finds the VM the user named.
fn resolve<'a>(w: &impl ReplySink, vm: VmRef<'a>) -> Result<VmId, VmRef<'a>> {
    match vm {
        VmRef::Id(id) if id < w.vm_count() => Ok(VmId(id)),
        VmRef::Id(_) => Err(vm),
        VmRef::Name(name) => w.find_vm(name).ok_or(vm),
    }
}

fn execute<'a, T: MonitorTarget, W: ReplySink>(
    line: &'a str,
    w: &mut W,
    target: &mut T,
) -> Result<MonitorStep, Failure<'a, T::Error>> {
    let command = command::parse(line).map_err(Failure::Parse)?;
    let vm_of = |w: &W, vm| resolve(w, vm).map_err(Failure::NoVm);
    let name_of = |w: &W, vm| String::from(w.vm_name(vm).unwrap_or("?"));
    match command {
        Command::Empty => {}
        Command::Help => {
            let width = command::USAGE.iter().map(|(u, _)| u.len()).max();
            let width = width.unwrap_or(0);
            for (usage, what) in command::USAGE {
                let _ = writeln!(w, "{usage:<width$} {what}");
            }
            let _ = writeln!(
                w,
                "VM is a name or an id; numbers are decimal or 0x hex, sizes may end in K, M or G"
            );
        }
        Command::Vms => vms(w, target)?,
        Command::Focus(vm) => {
            let vm = vm_of(w, vm)?;
            // `vm` was resolved against this side's VMs: only a side
            // without a keyboard refuses.
            if !w.set_focus(vm) {
                let _ = writeln!(
                    w,
                    "error: focus is the console's; this port has no keyboard"
                );
                return Ok(MonitorStep::Stay);
            }
            let name = name_of(w, vm);
            let _ = writeln!(w, "ok: input goes to {name} (id {vm})");
        }
        Command::Counters(vm) => {
            let vm = vm_of(w, vm)?;
            let dropped = w.rx_dropped(vm).unwrap_or(0);
            let mut rows = String::new();
            target
                .counters(vm, &mut |name, value| {
                    let _ = writeln!(rows, "{name:<24} {value}");
                })
                .map_err(Failure::Target)?;
            let _ = writeln!(w, "{:<24} VALUE", "COUNTER");
            let _ = write!(w, "{rows}");
            let _ = writeln!(w, "{:<24} {dropped}", "console_rx_dropped");
        }
        Command::Devices(vm) => {
            let vm = vm_of(w, vm)?;
            let mut rows = String::new();
            target
                .devices(vm, &mut |line| {
                    let _ = writeln!(rows, "{line}");
                })
                .map_err(Failure::Target)?;
            if rows.is_empty() {
                let name = name_of(w, vm);
                let _ = writeln!(w, "ok: {name} has no virtio devices");
            } else {
                let _ = writeln!(
                    w,
                    "{:<3} {:<8} {:<21} {:<4} {:<40} {:<26} COUNTERS",
                    "DEV", "KIND", "WINDOW", "SPI", "STATUS", "FEATURES"
                );
                let _ = write!(w, "{rows}");
            }
        }
        Command::Pause(vm) => act(w, target, vm, "paused", T::pause)?,
        Command::Resume(vm) => act(w, target, vm, "resumed", T::resume)?,
        Command::Stop(vm) => act(w, target, vm, "stopped", T::stop)?,
        Command::Restart(vm) => act(w, target, vm, "restarting", T::restart)?,
        Command::Migrate { src, dst, options } => {
            let src = vm_of(w, src)?;
            let dst = vm_of(w, dst)?;
            target.migrate(src, dst, options).map_err(Failure::Target)?;
            let (from, to) = (name_of(w, src), name_of(w, dst));
            let _ = writeln!(w, "ok: migrating {from} to {to}");
        }
        Command::Slots(vm) => {
            let vm = vm_of(w, vm)?;
            let mut rows = String::new();
            target
                .slots(vm, &mut |slot| {
                    let _ = writeln!(
                        rows,
                        "{:<6} {:#018x}  {:<11} {:#018x}  {}",
                        slot.id.get(),
                        slot.ipa,
                        Size(slot.size),
                        slot.backing,
                        command::flags_name(slot.flags)
                    );
                })
                .map_err(Failure::Target)?;
            let _ = writeln!(
                w,
                "{:<6} {:<19} {:<11} {:<19} FLAGS",
                "SLOT", "IPA", "SIZE", "BACKING"
            );
            let _ = write!(w, "{rows}");
        }
        Command::SlotAdd {
            vm,
            slot,
            ipa,
            size,
            flags,
        } => {
            let vm = vm_of(w, vm)?;
            let request = SlotRequest {
                id: slot,
                ipa,
                size,
                flags,
            };
            let backing = target.add_slot(vm, request).map_err(Failure::Target)?;
            let name = name_of(w, vm);
            let _ = writeln!(
                w,
                "ok: {name} slot {slot} added at {ipa:#x}, {}, backing {backing:#x}, {}",
                Size(size),
                command::flags_name(flags)
            );
        }
        Command::SlotDelete { vm, slot } => {
            let vm = vm_of(w, vm)?;
            target.delete_slot(vm, slot).map_err(Failure::Target)?;
            let name = name_of(w, vm);
            let _ = writeln!(w, "ok: {name} slot {slot} deleted");
        }
        Command::SlotMove { vm, slot, ipa } => {
            let vm = vm_of(w, vm)?;
            target.move_slot(vm, slot, ipa).map_err(Failure::Target)?;
            let name = name_of(w, vm);
            let _ = writeln!(w, "ok: {name} slot {slot} moved to {ipa:#x}");
        }
        Command::SlotFlags { vm, slot, flags } => {
            let vm = vm_of(w, vm)?;
            target
                .set_slot_flags(vm, slot, flags)
                .map_err(Failure::Target)?;
            let name = name_of(w, vm);
            let _ = writeln!(
                w,
                "ok: {name} slot {slot} flags {}",
                command::flags_name(flags)
            );
        }
        Command::DirtyGet { vm, slot } => {
            let vm = vm_of(w, vm)?;
            let dirty = target.collect_dirty(vm, slot).map_err(Failure::Target)?;
            let mut runs = 0;
            let _ = writeln!(w, "{:<19} PAGES", "IPA");
            for (first, pages) in dirty.runs() {
                if runs < DIRTY_RUNS_SHOWN {
                    let ipa = dirty.ipa + (first << PAGE_SHIFT);
                    let _ = writeln!(w, "{ipa:#018x}  {pages}");
                }
                runs += 1;
            }
            let name = name_of(w, vm);
            let shown = if runs > DIRTY_RUNS_SHOWN {
                alloc::format!(" (the first {DIRTY_RUNS_SHOWN} shown)")
            } else {
                String::new()
            };
            let _ = writeln!(
                w,
                "ok: {name} slot {slot}: {} dirty pages in {runs} runs{shown}, write-protected again",
                dirty.count()
            );
        }
        Command::DirtyMode { vm, mode, chunk } => {
            let vm = vm_of(w, vm)?;
            target
                .set_dirty_mode(vm, mode, chunk)
                .map_err(Failure::Target)?;
            let name = name_of(w, vm);
            let split = if chunk == 0 {
                String::from("eager split off")
            } else {
                alloc::format!("eager split in {} chunks", Size(chunk))
            };
            let _ = writeln!(
                w,
                "ok: {name} dirty log mode {}, {split}",
                command::mode_name(mode)
            );
        }
        Command::PowerOff => {
            let _ = writeln!(w, "powering off");
            target.power_off().map_err(Failure::Target)?;
        }
        Command::Exit => return Ok(MonitorStep::Leave),
    }
    Ok(MonitorStep::Stay)
}

/// Runs a VM action and reports it.
fn act<'a, T: MonitorTarget, W: ReplySink>(
    w: &mut W,
    target: &mut T,
    vm: VmRef<'a>,
    done: &str,
    action: fn(&mut T, VmId) -> Result<(), T::Error>,
) -> Result<(), Failure<'a, T::Error>> {
    let vm = resolve(w, vm).map_err(Failure::NoVm)?;
    action(target, vm).map_err(Failure::Target)?;
    let name = String::from(w.vm_name(vm).unwrap_or("?"));
    let _ = writeln!(w, "ok: {name} {done}");
    Ok(())
}

/// The `vms` table.
fn vms<'a, T: MonitorTarget, W: ReplySink>(
    w: &mut W,
    target: &mut T,
) -> Result<(), Failure<'a, T::Error>> {
    let mut rows = String::new();
    for index in 0..w.vm_count() {
        let vm = VmId(index);
        let info = target.vm_info(vm).map_err(Failure::Target)?;
        let _ = writeln!(
            rows,
            "{:<3} {:<17} {:<10} {:>5}  {:<17} {:>5} {:>6}  {}",
            index,
            w.vm_name(vm).unwrap_or("?"),
            info.state.name(),
            info.vcpus,
            CpuList(info.cpus),
            Size(info.ram_bytes),
            info.memslots,
            if w.focus() == Some(vm) { "*" } else { "-" },
        );
    }
    let _ = writeln!(
        w,
        "{:<3} {:<17} {:<10} {:>5}  {:<17} {:>5} {:>6}  FOCUS",
        "ID", "NAME", "STATE", "VCPUS", "CPUS", "RAM", "SLOTS"
    );
    let _ = write!(w, "{rows}");
    Ok(())
}
