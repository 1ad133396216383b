//! The monitor's command language: one line of text into a [`Command`].
//!
//! # Grammar
//!
//! A line is words separated by spaces or tabs; the first word names the
//! command (lower case), the rest are its arguments:
//!
//! ```text
//! help | vms | list | poweroff | exit
//! focus|counters|pause|resume|stop|restart|slots VM
//! migrate VM VM
//! slot add VM SLOT IPA SIZE [rw|ro|log]
//! slot delete VM SLOT
//! slot move VM SLOT IPA
//! slot flags VM SLOT rw|ro|log
//! dirty get VM SLOT
//! dirty mode VM auto|manual|all-set [CHUNK]
//! ```
//!
//! `VM` is a VM's id when it is all digits and its name otherwise (names are
//! never all digits). Numbers are decimal or `0x` hexadecimal, may hold `_`
//! between digits and may end in `K`, `M` or `G` (binary multiples). A line
//! of spaces is [`Command::Empty`]. Every refusal is a [`CommandError`]
//! that names the problem and shows the command's usage.

use crate::vm::migration_plan::MigrationOptions;
use core::fmt;

use memslot::{DirtyLogMode, SlotFlags, SlotId};

/// A VM as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmRef<'a> {
    /// All digits: an id.
    Id(usize),
    /// Anything else: a name.
    Name(&'a str),
}

impl fmt::Display for VmRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "{id}"),
            Self::Name(name) => write!(f, "{name}"),
        }
    }
}

/// A parsed monitor command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// An empty line.
    Empty,
    /// `help`: list the commands.
    Help,
    /// `vms` or `list`: the VM table.
    Vms,
    /// `focus VM`: send typed bytes to the VM.
    Focus(VmRef<'a>),
    /// `counters VM`: the VM's event counters.
    Counters(VmRef<'a>),
    /// `devices VM`: the VM's virtio devices.
    Devices(VmRef<'a>),
    /// `pause VM`.
    Pause(VmRef<'a>),
    /// `resume VM`.
    Resume(VmRef<'a>),
    /// `stop VM`.
    Stop(VmRef<'a>),
    /// `restart VM`.
    Restart(VmRef<'a>),
    /// `migrate SRC DST [verify] [limit=MS]`: live-migrate SRC into DST (a
    /// VM waiting with `start=0`), with the byte-for-byte check when
    /// `verify` is given, aiming for a downtime of `MS` milliseconds
    /// (`vm::migration_plan::DEFAULT_DOWNTIME_LIMIT_US` when not given).
    Migrate {
        /// The running VM.
        src: VmRef<'a>,
        /// The waiting VM.
        dst: VmRef<'a>,
        /// The check and the downtime limit.
        options: MigrationOptions,
    },
    /// `slots VM`: the VM's memslot table.
    Slots(VmRef<'a>),
    /// `slot add VM SLOT IPA SIZE [FLAGS]`.
    SlotAdd {
        /// The VM.
        vm: VmRef<'a>,
        /// The new slot's id.
        slot: SlotId,
        /// Its first guest physical address.
        ipa: u64,
        /// Its size in bytes.
        size: u64,
        /// Its flags (`rw` when left out).
        flags: SlotFlags,
    },
    /// `slot delete VM SLOT`.
    SlotDelete {
        /// The VM.
        vm: VmRef<'a>,
        /// The slot.
        slot: SlotId,
    },
    /// `slot move VM SLOT IPA`.
    SlotMove {
        /// The VM.
        vm: VmRef<'a>,
        /// The slot.
        slot: SlotId,
        /// Its new first guest physical address.
        ipa: u64,
    },
    /// `slot flags VM SLOT FLAGS`.
    SlotFlags {
        /// The VM.
        vm: VmRef<'a>,
        /// The slot.
        slot: SlotId,
        /// The new flags.
        flags: SlotFlags,
    },
    /// `dirty get VM SLOT`: collect the slot's dirty log (the pages
    /// reported are write-protected again).
    DirtyGet {
        /// The VM.
        vm: VmRef<'a>,
        /// The slot.
        slot: SlotId,
    },
    /// `dirty mode VM MODE [CHUNK]`: the VM's dirty-log mode and eager
    /// split chunk size.
    DirtyMode {
        /// The VM.
        vm: VmRef<'a>,
        /// The mode (`auto`, `manual` or `all-set`).
        mode: DirtyLogMode,
        /// The eager split chunk size in bytes (0 when left out: off).
        chunk: u64,
    },
    /// `poweroff`: power the machine off.
    PowerOff,
    /// `exit`: back to the console.
    Exit,
}

/// Every command with its usage and what it does, in `help` order.
pub const USAGE: &[(&str, &str)] = &[
    ("help", "this list"),
    ("vms", "the VM table (alias: list)"),
    ("focus VM", "typed bytes go to VM"),
    ("counters VM", "VM's event counters"),
    (
        "devices VM",
        "VM's virtio devices: window, SPI, status, features, counters",
    ),
    ("pause VM", "stop running VM's vCPUs"),
    ("resume VM", "run a paused VM again"),
    ("stop VM", "stop VM for good"),
    ("restart VM", "reboot VM from its boot image"),
    (
        "migrate SRC DST [verify] [limit=MS]",
        "live-migrate SRC into DST (waiting, start=0)",
    ),
    ("slots VM", "VM's memslot table"),
    ("slot add VM SLOT IPA SIZE [rw|ro|log]", "add a memslot"),
    ("slot delete VM SLOT", "delete a memslot"),
    ("slot move VM SLOT IPA", "move a memslot to IPA"),
    ("slot flags VM SLOT rw|ro|log", "change a memslot's flags"),
    ("dirty get VM SLOT", "collect a logging slot's dirty pages"),
    (
        "dirty mode VM auto|manual|all-set [CHUNK]",
        "dirty-log mode, eager split chunk",
    ),
    ("poweroff", "power the machine off"),
    ("exit", "back to the console (also Ctrl-] or Ctrl-C)"),
];

/// Why a line is not a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError<'a> {
    /// The first word is no command.
    Unknown(&'a str),
    /// `slot` or `dirty` with a verb it does not have.
    UnknownVerb {
        /// The command (`slot`, `dirty`).
        command: &'static str,
        /// The verb given.
        verb: &'a str,
        /// The verbs it has, as a phrase.
        verbs: &'static str,
    },
    /// An argument is missing.
    Missing {
        /// The command's usage.
        usage: &'static str,
        /// What is missing.
        what: &'static str,
    },
    /// More arguments than the command takes.
    Extra {
        /// The command's usage.
        usage: &'static str,
        /// The first extra word.
        word: &'a str,
    },
    /// A word that should be a number (or a VM id) is not one.
    BadNumber {
        /// The command's usage.
        usage: &'static str,
        /// What the number is.
        what: &'static str,
        /// The word.
        word: &'a str,
    },
    /// A slot id outside the memslot range.
    BadSlot {
        /// The command's usage.
        usage: &'static str,
        /// The word.
        word: &'a str,
    },
    /// Flags other than rw, ro, log.
    BadFlags {
        /// The command's usage.
        usage: &'static str,
        /// The word.
        word: &'a str,
    },
    /// A dirty-log mode other than auto, manual, all-set.
    BadMode {
        /// The command's usage.
        usage: &'static str,
        /// The word.
        word: &'a str,
    },
}

impl fmt::Display for CommandError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(word) => write!(f, "unknown command {word:?}; help lists the commands"),
            Self::UnknownVerb {
                command,
                verb,
                verbs,
            } => write!(f, "unknown {command} command {verb:?}; {verbs}"),
            Self::Missing { usage, what } => write!(f, "{what} missing; usage: {usage}"),
            Self::Extra { usage, word } => write!(f, "unexpected {word:?}; usage: {usage}"),
            Self::BadNumber { usage, what, word } => {
                write!(f, "{what} {word:?} is not a number; usage: {usage}")
            }
            Self::BadSlot { usage, word } => write!(
                f,
                "slot {word:?} is not a slot id (0 to {}); usage: {usage}",
                memslot::MAX_SLOTS - 1
            ),
            Self::BadFlags { usage, word } => {
                write!(f, "flags {word:?} are not rw, ro or log; usage: {usage}")
            }
            Self::BadMode { usage, word } => write!(
                f,
                "mode {word:?} is not auto, manual or all-set; usage: {usage}"
            ),
        }
    }
}

impl core::error::Error for CommandError<'_> {}

/// The words of a line after the command, with the command's usage for errors.
struct Args<'a, I: Iterator<Item = &'a str>> {
    words: I,
    usage: &'static str,
}

impl<'a, I: Iterator<Item = &'a str>> Args<'a, I> {
    fn word(&mut self, what: &'static str) -> Result<&'a str, CommandError<'a>> {
        self.words.next().ok_or(CommandError::Missing {
            usage: self.usage,
            what,
        })
    }

    fn vm(&mut self) -> Result<VmRef<'a>, CommandError<'a>> {
        let word = self.word("VM")?;
        if word.bytes().all(|b| b.is_ascii_digit()) {
            let id = word.parse().map_err(|_| CommandError::BadNumber {
                usage: self.usage,
                what: "VM id",
                word,
            })?;
            Ok(VmRef::Id(id))
        } else {
            Ok(VmRef::Name(word))
        }
    }

    fn slot(&mut self) -> Result<SlotId, CommandError<'a>> {
        let word = self.word("SLOT")?;
        let usage = self.usage;
        let bad = || CommandError::BadSlot { usage, word };
        let id = parse_number(word).ok_or_else(bad)?;
        let id = u32::try_from(id).map_err(|_| bad())?;
        SlotId::new(id).map_err(|_| bad())
    }

    fn number(&mut self, what: &'static str) -> Result<u64, CommandError<'a>> {
        let word = self.word(what)?;
        parse_number(word).ok_or(CommandError::BadNumber {
            usage: self.usage,
            what,
            word,
        })
    }

    fn flags(&mut self, word: &'a str) -> Result<SlotFlags, CommandError<'a>> {
        parse_flags(word).ok_or(CommandError::BadFlags {
            usage: self.usage,
            word,
        })
    }

    /// The rest of `migrate`: `verify` and `limit=MS` (milliseconds, at
    /// least 1), each at most once, in any order.
    fn migration_options(self) -> Result<MigrationOptions, CommandError<'a>> {
        let mut options = MigrationOptions::default();
        let (mut verify, mut limit) = (false, false);
        for word in self.words {
            if word == "verify" && !verify {
                verify = true;
                options.verify = true;
            } else if let Some(ms) = word.strip_prefix("limit=")
                && !limit
            {
                limit = true;
                options.downtime_limit_us = parse_number(ms)
                    .filter(|&ms| ms > 0)
                    .and_then(|ms| ms.checked_mul(1000))
                    .ok_or(CommandError::BadNumber {
                        usage: self.usage,
                        what: "downtime limit (ms)",
                        word,
                    })?;
            } else {
                return Err(CommandError::Extra {
                    usage: self.usage,
                    word,
                });
            }
        }
        Ok(options)
    }

    fn end(mut self) -> Result<(), CommandError<'a>> {
        match self.words.next() {
            None => Ok(()),
            Some(word) => Err(CommandError::Extra {
                usage: self.usage,
                word,
            }),
        }
    }
}

/// The usage line of the command whose usage starts with `name`.
fn usage(name: &str) -> &'static str {
    USAGE
        .iter()
        .map(|(usage, _)| *usage)
        .find(|usage| usage.starts_with(name))
        .unwrap_or("help")
}

/// Parses one line.
pub fn parse(line: &str) -> Result<Command<'_>, CommandError<'_>> {
    let mut words = line.split([' ', '\t']).filter(|w| !w.is_empty());
    let Some(name) = words.next() else {
        return Ok(Command::Empty);
    };
    match name {
        "help" => bare(name, Command::Help, words),
        "vms" | "list" => bare("vms", Command::Vms, words),
        "poweroff" => bare(name, Command::PowerOff, words),
        "exit" => bare(name, Command::Exit, words),
        "focus" => vm_command(name, Command::Focus, words),
        "counters" => vm_command(name, Command::Counters, words),
        "devices" => vm_command(name, Command::Devices, words),
        "pause" => vm_command(name, Command::Pause, words),
        "resume" => vm_command(name, Command::Resume, words),
        "stop" => vm_command(name, Command::Stop, words),
        "restart" => vm_command(name, Command::Restart, words),
        "slots" => vm_command(name, Command::Slots, words),
        "slot" => parse_slot(words),
        "dirty" => parse_dirty(words),
        "migrate" => {
            let mut args = Args {
                words,
                usage: usage(name),
            };
            let src = args.vm()?;
            let dst = args.vm()?;
            let options = args.migration_options()?;
            Ok(Command::Migrate { src, dst, options })
        }
        _ => Err(CommandError::Unknown(name)),
    }
}

/// A command without arguments.
fn bare<'a>(
    name: &str,
    command: Command<'a>,
    words: impl Iterator<Item = &'a str>,
) -> Result<Command<'a>, CommandError<'a>> {
    let args = Args {
        words,
        usage: usage(name),
    };
    args.end().map(|()| command)
}

/// A command whose one argument is a VM.
fn vm_command<'a>(
    name: &str,
    make: fn(VmRef<'a>) -> Command<'a>,
    words: impl Iterator<Item = &'a str>,
) -> Result<Command<'a>, CommandError<'a>> {
    let mut args = Args {
        words,
        usage: usage(name),
    };
    let vm = args.vm()?;
    args.end()?;
    Ok(make(vm))
}

fn parse_slot<'a>(
    mut words: impl Iterator<Item = &'a str>,
) -> Result<Command<'a>, CommandError<'a>> {
    let Some(verb) = words.next() else {
        return Err(CommandError::Missing {
            usage: "slot add|delete|move|flags ...",
            what: "slot command",
        });
    };
    let usage = match verb {
        "add" => usage("slot add"),
        "delete" => usage("slot delete"),
        "move" => usage("slot move"),
        "flags" => usage("slot flags"),
        _ => {
            return Err(CommandError::UnknownVerb {
                command: "slot",
                verb,
                verbs: "slot add, slot delete, slot move or slot flags",
            });
        }
    };
    let mut args = Args { words, usage };
    let vm = args.vm()?;
    let slot = args.slot()?;
    let command = match verb {
        "add" => {
            let ipa = args.number("IPA")?;
            let size = args.number("SIZE")?;
            let flags = match args.words.next() {
                Some(word) => args.flags(word)?,
                None => SlotFlags::NONE,
            };
            Command::SlotAdd {
                vm,
                slot,
                ipa,
                size,
                flags,
            }
        }
        "delete" => Command::SlotDelete { vm, slot },
        "move" => {
            let ipa = args.number("IPA")?;
            Command::SlotMove { vm, slot, ipa }
        }
        _ => {
            let word = args.word("flags")?;
            let flags = args.flags(word)?;
            Command::SlotFlags { vm, slot, flags }
        }
    };
    args.end()?;
    Ok(command)
}

fn parse_dirty<'a>(
    mut words: impl Iterator<Item = &'a str>,
) -> Result<Command<'a>, CommandError<'a>> {
    let Some(verb) = words.next() else {
        return Err(CommandError::Missing {
            usage: "dirty get|mode ...",
            what: "dirty command",
        });
    };
    let command = match verb {
        "get" => {
            let mut args = Args {
                words,
                usage: usage("dirty get"),
            };
            let vm = args.vm()?;
            let slot = args.slot()?;
            args.end()?;
            Command::DirtyGet { vm, slot }
        }
        "mode" => {
            let mut args = Args {
                words,
                usage: usage("dirty mode"),
            };
            let vm = args.vm()?;
            let word = args.word("mode")?;
            let mode = parse_mode(word).ok_or(CommandError::BadMode {
                usage: args.usage,
                word,
            })?;
            let chunk = match args.words.next() {
                Some(word) => parse_number(word).ok_or(CommandError::BadNumber {
                    usage: args.usage,
                    what: "CHUNK",
                    word,
                })?,
                None => 0,
            };
            args.end()?;
            Command::DirtyMode { vm, mode, chunk }
        }
        _ => {
            return Err(CommandError::UnknownVerb {
                command: "dirty",
                verb,
                verbs: "dirty get or dirty mode",
            });
        }
    };
    Ok(command)
}

/// Parses a dirty-log mode: `auto` (a collection re-protects what it
/// reports), `manual` (manual protection) or `all-set` (manual, bitmaps
/// start all set).
pub fn parse_mode(word: &str) -> Option<DirtyLogMode> {
    let (manual_protect, initially_all_set) = match word {
        "auto" => (false, false),
        "manual" => (true, false),
        "all-set" => (true, true),
        _ => return None,
    };
    Some(DirtyLogMode {
        manual_protect,
        initially_all_set,
    })
}

/// The name [`parse_mode`] reads for `mode`.
pub fn mode_name(mode: DirtyLogMode) -> &'static str {
    match (mode.manual_protect, mode.initially_all_set) {
        (false, _) => "auto",
        (true, false) => "manual",
        (true, true) => "all-set",
    }
}

/// Parses `rw`, `ro` or `log`.
pub fn parse_flags(word: &str) -> Option<SlotFlags> {
    match word {
        "rw" => Some(SlotFlags::NONE),
        "ro" => Some(SlotFlags::READ_ONLY),
        "log" => Some(SlotFlags::LOG_DIRTY),
        _ => None,
    }
}

/// The name `parse_flags` reads for `flags`; `?` for a combination it has
/// no name for.
pub fn flags_name(flags: SlotFlags) -> &'static str {
    if flags == SlotFlags::NONE {
        "rw"
    } else if flags == SlotFlags::READ_ONLY {
        "ro"
    } else if flags == SlotFlags::LOG_DIRTY {
        "log"
    } else {
        "?"
    }
}

/// Parses a decimal or `0x` hexadecimal number with `_` between digits and
/// an optional `K`, `M` or `G` suffix; `None` on anything else or overflow.
pub fn parse_number(word: &str) -> Option<u64> {
    let (digits, shift) = match word.as_bytes().last()? {
        b'K' | b'k' => (&word[..word.len() - 1], 10),
        b'M' | b'm' => (&word[..word.len() - 1], 20),
        b'G' | b'g' => (&word[..word.len() - 1], 30),
        _ => (word, 0),
    };
    let (digits, radix) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') {
        return None;
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        if c == '_' {
            continue;
        }
        let digit = c.to_digit(radix)?;
        value = value.checked_mul(radix.into())?.checked_add(digit.into())?;
    }
    let scaled = value.checked_shl(shift)?;
    (scaled >> shift == value).then_some(scaled)
}

/// Writes a byte count the way [`parse_number`] reads it back: `G`, `M` or
/// `K` when it is an exact multiple, bytes otherwise.
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self.0 {
            0 => return f.pad("0"),
            n if n % (1 << 30) == 0 => alloc::format!("{}G", n >> 30),
            n if n % (1 << 20) == 0 => alloc::format!("{}M", n >> 20),
            n if n % (1 << 10) == 0 => alloc::format!("{}K", n >> 10),
            n => alloc::format!("{n}"),
        };
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_command() {
        assert_eq!(parse(""), Ok(Command::Empty));
        assert_eq!(parse("  \t "), Ok(Command::Empty));
        assert_eq!(parse("help"), Ok(Command::Help));
        assert_eq!(parse("vms"), Ok(Command::Vms));
        assert_eq!(parse(" list "), Ok(Command::Vms));
        assert_eq!(parse("poweroff"), Ok(Command::PowerOff));
        assert_eq!(parse("exit"), Ok(Command::Exit));
        assert_eq!(parse("focus web"), Ok(Command::Focus(VmRef::Name("web"))));
        assert_eq!(parse("counters 2"), Ok(Command::Counters(VmRef::Id(2))));
        assert_eq!(
            parse("devices web"),
            Ok(Command::Devices(VmRef::Name("web")))
        );
        assert_eq!(parse("pause a"), Ok(Command::Pause(VmRef::Name("a"))));
        assert_eq!(parse("resume a"), Ok(Command::Resume(VmRef::Name("a"))));
        assert_eq!(parse("stop 0"), Ok(Command::Stop(VmRef::Id(0))));
        assert_eq!(parse("restart a"), Ok(Command::Restart(VmRef::Name("a"))));
        assert_eq!(parse("slots a"), Ok(Command::Slots(VmRef::Name("a"))));
        let slot = SlotId::new(3).unwrap();
        assert_eq!(
            parse("slot add a 3 0x8000_0000 2M ro"),
            Ok(Command::SlotAdd {
                vm: VmRef::Name("a"),
                slot,
                ipa: 0x8000_0000,
                size: 2 << 20,
                flags: SlotFlags::READ_ONLY,
            })
        );
        assert_eq!(
            parse("slot add a 3 1G 4096"),
            Ok(Command::SlotAdd {
                vm: VmRef::Name("a"),
                slot,
                ipa: 1 << 30,
                size: 4096,
                flags: SlotFlags::NONE,
            })
        );
        assert_eq!(
            parse("slot delete 1 3"),
            Ok(Command::SlotDelete {
                vm: VmRef::Id(1),
                slot
            })
        );
        assert_eq!(
            parse("slot move a 3 0x1000"),
            Ok(Command::SlotMove {
                vm: VmRef::Name("a"),
                slot,
                ipa: 0x1000
            })
        );
        assert_eq!(
            parse("slot flags a 3 log"),
            Ok(Command::SlotFlags {
                vm: VmRef::Name("a"),
                slot,
                flags: SlotFlags::LOG_DIRTY
            })
        );
        assert_eq!(
            parse("dirty get a 3"),
            Ok(Command::DirtyGet {
                vm: VmRef::Name("a"),
                slot
            })
        );
        assert_eq!(
            parse("dirty mode 1 all-set 2M"),
            Ok(Command::DirtyMode {
                vm: VmRef::Id(1),
                mode: DirtyLogMode {
                    manual_protect: true,
                    initially_all_set: true
                },
                chunk: 2 << 20
            })
        );
        assert_eq!(
            parse("dirty mode a auto"),
            Ok(Command::DirtyMode {
                vm: VmRef::Name("a"),
                mode: DirtyLogMode::default(),
                chunk: 0
            })
        );
        for word in ["auto", "manual", "all-set"] {
            assert_eq!(parse_mode(word).map(mode_name), Some(word));
        }
    }

    #[test]
    fn errors_name_the_problem_and_the_usage() {
        let text = |line| parse(line).unwrap_err().to_string();
        assert_eq!(
            text("frobnicate"),
            "unknown command \"frobnicate\"; help lists the commands"
        );
        assert_eq!(text("focus"), "VM missing; usage: focus VM");
        assert_eq!(text("vms now"), "unexpected \"now\"; usage: vms");
        assert_eq!(text("pause a b"), "unexpected \"b\"; usage: pause VM");
        assert_eq!(
            text("slot move a 1 0xzz"),
            "IPA \"0xzz\" is not a number; usage: slot move VM SLOT IPA"
        );
        assert_eq!(
            text("slot delete a 40000"),
            "slot \"40000\" is not a slot id (0 to 32766); usage: slot delete VM SLOT"
        );
        assert_eq!(
            text("slot flags a 1 rx"),
            "flags \"rx\" are not rw, ro or log; usage: slot flags VM SLOT rw|ro|log"
        );
        assert_eq!(
            text("slot add a 1 0 4K ro extra"),
            "unexpected \"extra\"; usage: slot add VM SLOT IPA SIZE [rw|ro|log]"
        );
        assert!(text("slot").starts_with("slot command missing"));
        assert!(text("slot grow a 1").starts_with("unknown slot command \"grow\""));
        assert_eq!(
            text("dirty show a 1"),
            "unknown dirty command \"show\"; dirty get or dirty mode"
        );
        assert!(text("dirty").starts_with("dirty command missing"));
        assert_eq!(
            text("dirty mode a lazy"),
            "mode \"lazy\" is not auto, manual or all-set; \
             usage: dirty mode VM auto|manual|all-set [CHUNK]"
        );
        assert_eq!(
            text("dirty mode a auto 2Q"),
            "CHUNK \"2Q\" is not a number; usage: dirty mode VM auto|manual|all-set [CHUNK]"
        );
        assert_eq!(
            text("dirty get a 1 2"),
            "unexpected \"2\"; usage: dirty get VM SLOT"
        );
        assert!(text("focus 99999999999999999999999").contains("VM id"));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("42"), Some(42));
        assert_eq!(parse_number("0x2a"), Some(42));
        assert_eq!(parse_number("0X2A"), Some(42));
        assert_eq!(parse_number("1_000"), Some(1000));
        assert_eq!(parse_number("4k"), Some(4096));
        assert_eq!(parse_number("0x10M"), Some(16 << 20));
        assert_eq!(parse_number("16G"), Some(16 << 30));
        assert_eq!(parse_number("0xffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_number("0x10000000000000000"), None);
        assert_eq!(parse_number("0x4000000000G"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("K"), None);
        assert_eq!(parse_number("0x"), None);
        assert_eq!(parse_number("_1"), None);
        assert_eq!(parse_number("-1"), None);
    }

    proptest! {
        #[test]
        fn sizes_read_back(size in any::<u64>(), shift in 0u32..40) {
            let size = size >> shift << (shift % 31);
            let text = Size(size).to_string();
            prop_assert_eq!(parse_number(&text), Some(size));
        }

        #[test]
        fn any_line_parses_or_errs(line in "\\PC{0,60}") {
            let _ = parse(&line).map_err(|e| e.to_string());
        }
    }
}
