//! Host tests of the whole console (mux, monitor and commands) against a
//! fake machine: a [`FakeMachine`] that keeps VM states and memslots in
//! plain collections, a terminal that records every byte, and guest inputs
//! that record what each VM received.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use memslot::{DirtyLogMode, SlotFlags, SlotId};
use proptest::prelude::*;

use crate::vm::migration_plan::{DEFAULT_DOWNTIME_LIMIT_US, MigrationOptions};

use super::console::{Console, GuestInput, Mode};
use super::console_mux::{ConsoleOutput, ESCAPE, LINE_CAPACITY, VmId};
use super::monitor::{
    DirtyPages, EDIT_CAPACITY, MonitorTarget, OPEN_BANNER, PROMPT, SlotInfo, SlotRequest, VmInfo,
    VmState,
};

/// Every byte written to the host console.
#[derive(Default)]
struct Terminal(Vec<u8>);

impl ConsoleOutput for Terminal {
    fn write_bytes(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

impl Terminal {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// The text written since the last call.
    fn take(&mut self) -> String {
        let text = self.text();
        self.0.clear();
        text
    }
}

/// What each VM's PL011 received; `full` VMs refuse bytes.
#[derive(Default)]
struct Inputs {
    received: BTreeMap<usize, Vec<u8>>,
    full: Vec<usize>,
}

impl GuestInput for Inputs {
    fn push_rx(&mut self, vm: VmId, byte: u8) -> bool {
        if self.full.contains(&vm.0) {
            return false;
        }
        self.received.entry(vm.0).or_default().push(byte);
        true
    }
}

impl Inputs {
    fn of(&self, vm: usize) -> &[u8] {
        self.received.get(&vm).map_or(&[], Vec::as_slice)
    }
}

/// Why the fake machine refused.
#[derive(Debug, PartialEq, Eq)]
enum FakeError {
    State { vm: usize, state: VmState },
    NoSuchSlot(SlotId),
    SlotInUse(SlotId),
    Overlap(SlotId),
    NotLogging(SlotId),
    ModeWhileLogging,
    PoweredOff,
}

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::State { vm, state } => write!(f, "vm {vm} is {}", state.name()),
            Self::NoSuchSlot(id) => write!(f, "no slot {id}"),
            Self::SlotInUse(id) => write!(f, "slot {id} is in use"),
            Self::Overlap(id) => write!(f, "overlaps slot {id}"),
            Self::NotLogging(id) => write!(f, "slot {id} does not log dirty pages"),
            Self::ModeWhileLogging => write!(f, "a slot logs dirty pages"),
            Self::PoweredOff => write!(f, "the machine is off"),
        }
    }
}

impl core::error::Error for FakeError {}

struct FakeVm {
    info: VmInfo,
    slots: BTreeMap<SlotId, SlotInfo>,
    restarts: u32,
    /// Dirty pages of logging slots, by page index in the slot.
    dirty: BTreeMap<SlotId, Vec<u64>>,
    dirty_mode: (DirtyLogMode, u64),
}

/// A machine whose VMs are rows in a table.
struct FakeMachine {
    vms: Vec<FakeVm>,
    next_backing: u64,
    powered_off: bool,
    migrations: Vec<(usize, usize)>,
    migration_options: Vec<MigrationOptions>,
}

impl FakeMachine {
    fn new(count: usize) -> Self {
        let vms = (0..count)
            .map(|i| {
                let id = SlotId::new(0).unwrap();
                let ram = 256 << 20;
                let mut slots = BTreeMap::new();
                slots.insert(
                    id,
                    SlotInfo {
                        id,
                        ipa: 0x4000_0000,
                        size: ram,
                        backing: 0x1_0000_0000 + (i as u64) * ram,
                        flags: SlotFlags::NONE,
                    },
                );
                FakeVm {
                    info: VmInfo {
                        state: VmState::Running,
                        vcpus: 2,
                        cpus: 0b11 << (2 * i),
                        ram_bytes: ram,
                        memslots: 1,
                    },
                    slots,
                    restarts: 0,
                    dirty: BTreeMap::new(),
                    dirty_mode: (DirtyLogMode::default(), 0),
                }
            })
            .collect();
        Self {
            vms,
            next_backing: 0x8_0000_0000,
            powered_off: false,
            migrations: Vec::new(),
            migration_options: Vec::new(),
        }
    }

    fn vm(&mut self, vm: VmId) -> &mut FakeVm {
        &mut self.vms[vm.0]
    }

    fn slot(&mut self, vm: VmId, id: SlotId) -> Result<&mut SlotInfo, FakeError> {
        self.vm(vm)
            .slots
            .get_mut(&id)
            .ok_or(FakeError::NoSuchSlot(id))
    }

    /// The guest of `vm` writes page `page` of slot `id` (logged if it logs).
    fn write_page(&mut self, vm: usize, id: SlotId, page: u64) {
        if let Some(pages) = self.vms[vm].dirty.get_mut(&id) {
            pages.push(page);
        }
    }

    fn check_overlap(&self, vm: VmId, id: SlotId, ipa: u64, size: u64) -> Result<(), FakeError> {
        for slot in self.vms[vm.0].slots.values() {
            if slot.id != id && ipa < slot.ipa + slot.size && slot.ipa < ipa + size {
                return Err(FakeError::Overlap(slot.id));
            }
        }
        Ok(())
    }

    fn transition(&mut self, vm: VmId, from: &[VmState], to: VmState) -> Result<(), FakeError> {
        if self.powered_off {
            return Err(FakeError::PoweredOff);
        }
        let state = self.vm(vm).info.state;
        if !from.contains(&state) {
            return Err(FakeError::State { vm: vm.0, state });
        }
        self.vm(vm).info.state = to;
        Ok(())
    }
}

impl MonitorTarget for FakeMachine {
    type Error = FakeError;

    fn vm_info(&self, vm: VmId) -> Result<VmInfo, FakeError> {
        let mut info = self.vms[vm.0].info;
        info.memslots = self.vms[vm.0].slots.len() as u32;
        Ok(info)
    }

    fn counters(&self, vm: VmId, each: &mut dyn FnMut(&str, u64)) -> Result<(), FakeError> {
        each("stage2_faults", 10 + vm.0 as u64);
        each("exits_hvc", 7);
        each("restarts", u64::from(self.vms[vm.0].restarts));
        Ok(())
    }

    fn devices(&self, vm: VmId, each: &mut dyn FnMut(&str)) -> Result<(), FakeError> {
        if vm.0 == 0 {
            each(
                "0   net      0x000000000a000000+0x200 16   DRIVER_OK   VERSION_1   mac=52:54:00:00:00:01",
            );
        }
        Ok(())
    }

    fn pause(&mut self, vm: VmId) -> Result<(), FakeError> {
        self.transition(vm, &[VmState::Running], VmState::Paused)
    }

    fn resume(&mut self, vm: VmId) -> Result<(), FakeError> {
        self.transition(vm, &[VmState::Paused], VmState::Running)
    }

    fn stop(&mut self, vm: VmId) -> Result<(), FakeError> {
        self.transition(vm, &[VmState::Running, VmState::Paused], VmState::Stopped)
    }

    fn restart(&mut self, vm: VmId) -> Result<(), FakeError> {
        let all = [VmState::Running, VmState::Paused, VmState::Stopped];
        self.transition(vm, &all, VmState::Running)?;
        self.vm(vm).restarts += 1;
        Ok(())
    }

    fn migrate(
        &mut self,
        src: VmId,
        dst: VmId,
        options: MigrationOptions,
    ) -> Result<(), FakeError> {
        self.migrations.push((src.0, dst.0));
        self.migration_options.push(options);
        Ok(())
    }

    fn slots(&self, vm: VmId, each: &mut dyn FnMut(SlotInfo)) -> Result<(), FakeError> {
        self.vms[vm.0].slots.values().copied().for_each(each);
        Ok(())
    }

    fn add_slot(&mut self, vm: VmId, request: SlotRequest) -> Result<u64, FakeError> {
        if self.vm(vm).slots.contains_key(&request.id) {
            return Err(FakeError::SlotInUse(request.id));
        }
        self.check_overlap(vm, request.id, request.ipa, request.size)?;
        let backing = self.next_backing;
        self.next_backing += request.size;
        let slot = SlotInfo {
            id: request.id,
            ipa: request.ipa,
            size: request.size,
            backing,
            flags: request.flags,
        };
        self.vm(vm).slots.insert(request.id, slot);
        Ok(backing)
    }

    fn delete_slot(&mut self, vm: VmId, slot: SlotId) -> Result<(), FakeError> {
        self.vm(vm)
            .slots
            .remove(&slot)
            .map(|_| ())
            .ok_or(FakeError::NoSuchSlot(slot))
    }

    fn move_slot(&mut self, vm: VmId, slot: SlotId, ipa: u64) -> Result<(), FakeError> {
        let size = self.slot(vm, slot)?.size;
        self.check_overlap(vm, slot, ipa, size)?;
        self.slot(vm, slot)?.ipa = ipa;
        Ok(())
    }

    fn set_slot_flags(
        &mut self,
        vm: VmId,
        slot: SlotId,
        flags: SlotFlags,
    ) -> Result<(), FakeError> {
        self.slot(vm, slot)?.flags = flags;
        if flags.contains(SlotFlags::LOG_DIRTY) {
            self.vm(vm).dirty.entry(slot).or_default();
        } else {
            self.vm(vm).dirty.remove(&slot);
        }
        Ok(())
    }

    fn collect_dirty(&mut self, vm: VmId, slot: SlotId) -> Result<DirtyPages, FakeError> {
        let info = *self.slot(vm, slot)?;
        let pages = self
            .vm(vm)
            .dirty
            .get_mut(&slot)
            .ok_or(FakeError::NotLogging(slot))?;
        let mut bitmap = vec![0u64; (info.size >> 12).div_ceil(64) as usize];
        for page in pages.drain(..) {
            bitmap[(page / 64) as usize] |= 1 << (page % 64);
        }
        Ok(DirtyPages {
            ipa: info.ipa,
            bitmap,
        })
    }

    fn set_dirty_mode(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        chunk: u64,
    ) -> Result<(), FakeError> {
        if !self.vm(vm).dirty.is_empty() {
            return Err(FakeError::ModeWhileLogging);
        }
        self.vm(vm).dirty_mode = (mode, chunk);
        Ok(())
    }

    fn power_off(&mut self) -> Result<(), FakeError> {
        self.powered_off = true;
        Ok(())
    }
}

/// A console, its terminal, inputs and machine.
struct Rig {
    console: Console,
    term: Terminal,
    inputs: Inputs,
    machine: FakeMachine,
}

impl Rig {
    fn new(names: &[&str]) -> Self {
        Self {
            console: Console::new(names).unwrap(),
            term: Terminal::default(),
            inputs: Inputs::default(),
            machine: FakeMachine::new(names.len()),
        }
    }

    fn type_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.console
                .on_host_rx_byte(b, &mut self.term, &mut self.inputs, &mut self.machine);
        }
    }

    fn guest(&mut self, vm: usize, bytes: &[u8]) {
        for &b in bytes {
            self.console
                .on_guest_tx_byte(VmId(vm), b, &mut self.term)
                .unwrap();
        }
    }

    fn poll(&mut self) {
        self.console.poll(&mut self.term);
    }

    /// Opens the monitor (if needed) and runs `line`; returns the reply lines
    /// between the echoed command and the next prompt.
    fn command(&mut self, line: &str) -> Vec<String> {
        if self.console.mode() == Mode::Console {
            self.type_bytes(&[ESCAPE]);
            self.poll();
            assert_eq!(self.console.mode(), Mode::Monitor);
        }
        self.term.take();
        self.type_bytes(line.as_bytes());
        self.type_bytes(b"\r");
        let text = self.term.take();
        let reply = text
            .strip_prefix(line)
            .and_then(|t| t.strip_prefix('\n'))
            .unwrap_or_else(|| panic!("no echo of {line:?} in {text:?}"));
        let reply = reply.strip_suffix(PROMPT).unwrap_or(reply);
        reply.lines().map(String::from).collect()
    }
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn one_vm_passes_output_through_unprefixed() {
    let mut rig = Rig::new(&["solo"]);
    rig.guest(0, b"login: ");
    assert_eq!(rig.term.text(), "login: ");
    rig.guest(0, b"root\r\n# ");
    assert_eq!(rig.term.take(), "login: root\r\n# ");
    rig.type_bytes(b"ls\r");
    assert_eq!(rig.inputs.of(0), b"ls\r");
}

#[test]
fn three_vms_prefix_whole_lines() {
    let mut rig = Rig::new(&["a", "bb", "ccc"]);
    rig.guest(0, b"hello ");
    rig.guest(1, b"bonjour ");
    rig.guest(2, b"hallo\r\n");
    rig.guest(1, b"monde\n");
    rig.guest(0, b"world\n");
    assert_eq!(
        rig.term.take(),
        "[ccc] hallo\n[bb] bonjour monde\n[a] hello world\n"
    );
}

#[test]
fn hypervisor_lines_start_a_line_of_their_own() {
    let mut rig = Rig::new(&["a", "b"]);
    // A quiet VM's partial line is out: the log line ends it first, and the
    // VM's later bytes start a prefixed line again.
    rig.guest(0, b"a$ ");
    rig.poll();
    rig.poll();
    rig.console
        .write_host_line(b"[hv] vm1 stopped\n", &mut rig.term);
    rig.guest(0, b"ls\n");
    assert_eq!(rig.term.take(), "[a] a$ \n[hv] vm1 stopped\n[a] ls\n");
    // Over the monitor's prompt: the prompt and the typed text are drawn
    // again below the log line.
    rig.command("vms");
    rig.type_bytes(b"fo");
    rig.term.take();
    rig.console.write_host_line(b"[hv] late", &mut rig.term);
    assert_eq!(rig.term.take(), format!("\n[hv] late\n{PROMPT}fo"));
    rig.type_bytes(b"cus b\r");
    assert_eq!(rig.console.focus(), VmId(1));
}

#[test]
fn quiet_partial_lines_are_written_at_the_poll_and_continued() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.guest(0, b"a$ ");
    rig.poll();
    // The byte came after the previous poll: not quiet yet.
    assert_eq!(rig.term.text(), "");
    rig.poll();
    assert_eq!(rig.term.text(), "[a] a$ ");
    // The same VM continues its own line without a second prefix.
    rig.guest(0, b"ls");
    rig.poll();
    rig.poll();
    assert_eq!(rig.term.text(), "[a] a$ ls");
    // Another VM's line ends it first.
    rig.guest(1, b"boot\n");
    rig.guest(0, b"\n");
    assert_eq!(rig.term.take(), "[a] a$ ls\n[b] boot\n[a] \n");
}

#[test]
fn a_full_buffer_is_written_and_memory_stays_bounded() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.guest(0, &[b'x'; LINE_CAPACITY - 1]);
    assert_eq!(rig.term.text(), "");
    assert_eq!(
        rig.console.mux().buffered(VmId(0)).unwrap(),
        LINE_CAPACITY - 1
    );
    rig.guest(0, b"x");
    assert_eq!(rig.term.take().len(), "[a] ".len() + LINE_CAPACITY);
    assert_eq!(rig.console.mux().buffered(VmId(0)).unwrap(), 0);
    rig.guest(0, b"\n");
    rig.term.take();
    let long = vec![b'x'; LINE_CAPACITY * 40 + 7];
    rig.guest(0, &long);
    let text = rig.term.take();
    assert!(text.starts_with("[a] "));
    assert_eq!(text.matches('x').count(), LINE_CAPACITY * 40);
    assert_eq!(text.matches("[a]").count(), 1);
    assert_eq!(rig.console.mux().buffered(VmId(0)).unwrap(), 7);
    // B interrupts: A's open line ends, A's rest gets a new prefix.
    rig.guest(1, b"b\n");
    rig.guest(0, b"\n");
    assert_eq!(rig.term.take(), "\n[b] b\n[a] xxxxxxx\n");
}

#[test]
fn bad_names_and_ids_are_refused() {
    use super::console_mux::ConsoleError;
    assert_eq!(Console::new(&[]).unwrap_err(), ConsoleError::NoVms);
    for bad in ["", "12", "has space", "seventeen-chars-x", "a[b]"] {
        assert!(matches!(
            Console::new(&[bad]).unwrap_err(),
            ConsoleError::BadName(..)
        ));
    }
    assert!(matches!(
        Console::new(&["a", "a"]).unwrap_err(),
        ConsoleError::DuplicateName(_)
    ));
    let names = vec!["v"; 65];
    assert!(matches!(
        Console::new(&names).unwrap_err(),
        ConsoleError::TooManyVms(65)
    ));
    let mut rig = Rig::new(&["a", "b"]);
    assert_eq!(
        rig.console.on_guest_tx_byte(VmId(2), b'x', &mut rig.term),
        Err(ConsoleError::NoSuchVm(VmId(2)))
    );
    assert_eq!(
        ConsoleError::NoSuchVm(VmId(2)).to_string(),
        "no VM with id 2"
    );
}

#[test]
fn doubled_escape_sends_one_literal_escape() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.type_bytes(&[b'x', ESCAPE, ESCAPE, b'y']);
    assert_eq!(rig.inputs.of(0), [b'x', ESCAPE, b'y']);
    assert_eq!(rig.console.mode(), Mode::Console);
    assert_eq!(rig.term.text(), "");
}

#[test]
fn escape_split_across_reads() {
    let mut rig = Rig::new(&["a", "b"]);
    // First read ends with the escape; the second starts with the command.
    rig.type_bytes(b"ab");
    rig.type_bytes(&[ESCAPE]);
    assert_eq!(rig.console.mode(), Mode::Console);
    assert!(rig.console.mux().escape_pending());
    rig.type_bytes(b"vms\r");
    assert_eq!(rig.inputs.of(0), b"ab");
    assert_eq!(rig.console.mode(), Mode::Monitor);
    let text = rig.term.take();
    assert!(text.starts_with(&alloc::format!("{OPEN_BANNER}\n{PROMPT}vms\nID ")));
    // A doubled escape split across reads is one literal byte.
    rig.type_bytes(b"exit\r");
    rig.type_bytes(&[ESCAPE]);
    rig.type_bytes(&[ESCAPE]);
    assert_eq!(rig.inputs.of(0), [b'a', b'b', ESCAPE]);
}

#[test]
fn escape_inside_a_line_and_alone_until_the_poll() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.guest(1, b"half a line");
    rig.type_bytes(&[b'l', b's', ESCAPE]);
    rig.poll();
    assert_eq!(rig.console.mode(), Mode::Monitor);
    assert_eq!(rig.inputs.of(0), b"ls");
    // The guest's partial line was not written by the poll that opened the
    // monitor (it was not quiet yet), and later polls hold it.
    rig.poll();
    rig.poll();
    assert_eq!(rig.term.take(), alloc::format!("{OPEN_BANNER}\n{PROMPT}"));
    // Ctrl-C leaves; the focus line names the VM.
    rig.type_bytes(b"vm\x03");
    assert_eq!(rig.console.mode(), Mode::Console);
    assert_eq!(rig.term.take(), "vm\n-- console: input goes to a --\n");
    rig.poll();
    assert_eq!(rig.term.take(), "[b] half a line");
}

#[test]
fn escape_as_a_monitor_key_leaves() {
    let mut rig = Rig::new(&["a"]);
    rig.command("help");
    rig.type_bytes(&[ESCAPE]);
    assert_eq!(rig.console.mode(), Mode::Console);
    rig.type_bytes(b"q");
    assert_eq!(rig.inputs.of(0), b"q");
}

#[test]
fn help_lists_every_command() {
    let mut rig = Rig::new(&["a"]);
    let reply = rig.command("help");
    let text = reply.join("\n");
    for cmd in [
        "help",
        "vms",
        "focus",
        "counters",
        "devices",
        "pause",
        "resume",
        "stop",
        "restart",
        "slots",
        "slot add",
        "slot delete",
        "slot move",
        "slot flags",
        "poweroff",
        "exit",
    ] {
        assert!(
            reply.iter().any(|l| l.starts_with(cmd)),
            "{cmd} missing from {text}"
        );
    }
}

#[test]
fn vms_table() {
    let mut rig = Rig::new(&["linux", "test-2", "c"]);
    rig.machine.vms[2].info.state = VmState::Stopped;
    rig.machine.vms[1].info.cpus = 0b1011;
    let reply = rig.command("vms");
    assert_eq!(
        reply,
        [
            "ID  NAME              STATE      VCPUS  CPUS                RAM  SLOTS  FOCUS",
            "0   linux             running        2  0-1                256M      1  *",
            "1   test-2            running        2  0-1,3              256M      1  -",
            "2   c                 stopped        2  4-5                256M      1  -",
        ]
    );
    assert_eq!(rig.command("list"), reply);
    let row = words(&reply[3]);
    assert_eq!(row, ["2", "c", "stopped", "2", "4-5", "256M", "1", "-"]);
}

#[test]
fn focus_switches_the_input() {
    let mut rig = Rig::new(&["a", "b", "c"]);
    rig.type_bytes(b"1");
    assert_eq!(rig.command("focus c"), ["ok: input goes to c (id 2)"]);
    rig.type_bytes(b"exit\r");
    assert_eq!(rig.term.take(), "exit\n-- console: input goes to c --\n");
    rig.type_bytes(b"2");
    assert_eq!(rig.command("focus 1"), ["ok: input goes to b (id 1)"]);
    assert_eq!(words(&rig.command("vms")[2])[7], "*");
    rig.type_bytes(b"exit\r3");
    assert_eq!(rig.inputs.of(0), b"1");
    assert_eq!(rig.inputs.of(1), b"3");
    assert_eq!(rig.inputs.of(2), b"2");
    assert_eq!(
        rig.command("focus d"),
        ["error: no VM named \"d\"; vms lists them"]
    );
    assert_eq!(
        rig.command("focus 3"),
        ["error: no VM with id 3; vms lists them"]
    );
    assert_eq!(rig.console.focus(), VmId(1));
}

#[test]
fn counters_include_dropped_input() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.inputs.full.push(1);
    rig.command("focus b");
    rig.type_bytes(b"exit\rxyz");
    assert_eq!(
        rig.command("counters b"),
        [
            "COUNTER                  VALUE",
            "stage2_faults            11",
            "exits_hvc                7",
            "restarts                 0",
            "console_rx_dropped       3",
        ]
    );
    assert_eq!(rig.command("counters 0")[4], "console_rx_dropped       0");
}

#[test]
fn devices_lists_the_machines_lines_under_a_header_or_says_none() {
    let mut rig = Rig::new(&["a", "b"]);
    let reply = rig.command("devices a");
    assert_eq!(reply.len(), 2);
    let header: Vec<&str> = reply[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "DEV", "KIND", "WINDOW", "SPI", "STATUS", "FEATURES", "COUNTERS"
        ]
    );
    assert!(reply[1].starts_with("0   net"));
    assert_eq!(rig.command("devices b"), ["ok: b has no virtio devices"]);
    assert_eq!(
        rig.command("devices c"),
        ["error: no VM named \"c\"; vms lists them"]
    );
}

#[test]
fn migrate_takes_verify_and_a_downtime_limit() {
    let mut rig = Rig::new(&["a", "b", "c"]);
    assert_eq!(rig.command("migrate a c"), ["ok: migrating a to c"]);
    assert_eq!(
        rig.command("migrate a c limit=12 verify"),
        ["ok: migrating a to c"]
    );
    assert_eq!(rig.command("migrate a c verify"), ["ok: migrating a to c"]);
    assert_eq!(
        rig.machine.migration_options,
        [
            MigrationOptions::default(),
            MigrationOptions {
                verify: true,
                downtime_limit_us: 12_000
            },
            MigrationOptions {
                verify: true,
                downtime_limit_us: DEFAULT_DOWNTIME_LIMIT_US
            },
        ]
    );
    for bad in [
        "migrate a c limit=0",
        "migrate a c limit=ms",
        "migrate a c verify verify",
        "migrate a c limit=1 limit=2",
        "migrate a c fast",
    ] {
        assert!(rig.command(bad)[0].starts_with("error:"), "{bad}");
    }
    assert_eq!(rig.machine.migration_options.len(), 3);
}

#[test]
fn migrate_names_both_vms() {
    let mut rig = Rig::new(&["a", "b", "c"]);
    assert_eq!(rig.command("migrate a c"), ["ok: migrating a to c"]);
    assert_eq!(rig.machine.migrations, [(0, 2)]);
    assert!(rig.command("migrate a")[0].starts_with("error:"));
    assert!(rig.command("migrate a nosuch")[0].starts_with("error:"));
    assert_eq!(rig.machine.migrations.len(), 1);
}

#[test]
fn pause_resume_stop_restart() {
    let mut rig = Rig::new(&["a", "b"]);
    let state = |rig: &mut Rig, vm: usize| words(&rig.command("vms")[vm + 1])[2].to_string();
    assert_eq!(rig.command("pause b"), ["ok: b paused"]);
    assert_eq!(state(&mut rig, 1), "paused");
    assert_eq!(state(&mut rig, 0), "running");
    assert_eq!(rig.command("pause b"), ["error: vm 1 is paused"]);
    assert_eq!(rig.command("resume 1"), ["ok: b resumed"]);
    assert_eq!(rig.command("resume 1"), ["error: vm 1 is running"]);
    assert_eq!(rig.command("stop b"), ["ok: b stopped"]);
    assert_eq!(state(&mut rig, 1), "stopped");
    assert_eq!(rig.command("restart b"), ["ok: b restarting"]);
    assert_eq!(state(&mut rig, 1), "running");
    assert_eq!(rig.machine.vms[1].restarts, 1);
    assert_eq!(rig.machine.vms[0].restarts, 0);
    assert_eq!(rig.command("stop"), ["error: VM missing; usage: stop VM"]);
}

#[test]
fn slot_commands() {
    let mut rig = Rig::new(&["a", "b"]);
    let header = "SLOT   IPA                 SIZE        BACKING             FLAGS";
    assert_eq!(
        rig.command("slots a"),
        [
            header,
            "0      0x0000000040000000  256M        0x0000000100000000  rw",
        ]
    );
    assert_eq!(
        rig.command("slot add a 5 0x8000_0000 2M log"),
        ["ok: a slot 5 added at 0x80000000, 2M, backing 0x800000000, log"]
    );
    assert_eq!(
        rig.command("slot add a 6 0x4100_0000 4K"),
        ["error: overlaps slot 0"]
    );
    assert_eq!(
        rig.command("slot add a 5 0x9000_0000 4K"),
        ["error: slot 5 is in use"]
    );
    assert_eq!(
        rig.command("slot move a 5 0xc000_0000"),
        ["ok: a slot 5 moved to 0xc0000000"]
    );
    assert_eq!(rig.command("slot flags a 5 ro"), ["ok: a slot 5 flags ro"]);
    assert_eq!(
        rig.command("slots 0"),
        [
            header,
            "0      0x0000000040000000  256M        0x0000000100000000  rw",
            "5      0x00000000c0000000  2M          0x0000000800000000  ro",
        ]
    );
    assert_eq!(words(&rig.command("vms")[1])[6], "2");
    assert_eq!(rig.command("slot delete a 0"), ["ok: a slot 0 deleted"]);
    assert_eq!(rig.command("slot delete a 0"), ["error: no slot 0"]);
    assert_eq!(rig.command("slots b").len(), 2);
    assert_eq!(rig.command("slots a").len(), 2);
    assert_eq!(
        rig.command("slot move a 5"),
        ["error: IPA missing; usage: slot move VM SLOT IPA"]
    );
    assert_eq!(
        rig.command("slot delete z 1"),
        ["error: no VM named \"z\"; vms lists them"]
    );
}

#[test]
fn dirty_log_commands() {
    let mut rig = Rig::new(&["a", "b"]);
    let slot = SlotId::new(0).unwrap();
    assert_eq!(
        rig.command("dirty get a 0"),
        ["error: slot 0 does not log dirty pages"]
    );
    assert_eq!(
        rig.command("dirty mode b manual 2M"),
        ["ok: b dirty log mode manual, eager split in 2M chunks"]
    );
    let manual = DirtyLogMode {
        manual_protect: true,
        initially_all_set: false,
    };
    assert_eq!(rig.machine.vms[1].dirty_mode, (manual, 2 << 20));
    assert_eq!(
        rig.command("slot flags a 0 log"),
        ["ok: a slot 0 flags log"]
    );
    assert_eq!(
        rig.command("dirty mode a all-set"),
        ["error: a slot logs dirty pages"]
    );
    for page in [0, 1, 2, 63, 64, 300] {
        rig.machine.write_page(0, slot, page);
    }
    assert_eq!(
        rig.command("dirty get a 0"),
        [
            "IPA                 PAGES",
            "0x0000000040000000  3",
            "0x000000004003f000  2",
            "0x000000004012c000  1",
            "ok: a slot 0: 6 dirty pages in 3 runs, write-protected again",
        ]
    );
    assert_eq!(
        rig.command("dirty get 0 0"),
        [
            "IPA                 PAGES",
            "ok: a slot 0: 0 dirty pages in 0 runs, write-protected again",
        ]
    );
    // Every other page of 80: 40 runs, the first 32 listed.
    for page in (0..80).step_by(2) {
        rig.machine.write_page(0, slot, page);
    }
    let reply = rig.command("dirty get a 0");
    assert_eq!(reply.len(), 1 + 32 + 1);
    assert_eq!(reply[32], "0x000000004003e000  1");
    assert_eq!(
        reply[33],
        "ok: a slot 0: 40 dirty pages in 40 runs (the first 32 shown), write-protected again"
    );
    assert_eq!(rig.command("slot flags a 0 rw"), ["ok: a slot 0 flags rw"]);
    assert_eq!(
        rig.command("dirty mode a auto"),
        ["ok: a dirty log mode auto, eager split off"]
    );
    assert_eq!(
        rig.command("dirty get a"),
        ["error: SLOT missing; usage: dirty get VM SLOT"]
    );
}

#[test]
fn poweroff_and_exit() {
    let mut rig = Rig::new(&["a"]);
    assert_eq!(rig.command("poweroff"), ["powering off"]);
    assert!(rig.machine.powered_off);
    assert_eq!(rig.command("pause a"), ["error: the machine is off"]);
    rig.type_bytes(b"exit\r");
    assert_eq!(rig.console.mode(), Mode::Console);
}

#[test]
fn unknown_commands_and_bad_arguments() {
    let mut rig = Rig::new(&["a"]);
    assert_eq!(
        rig.command("reboot"),
        ["error: unknown command \"reboot\"; help lists the commands"]
    );
    assert_eq!(
        rig.command("vms all"),
        ["error: unexpected \"all\"; usage: vms"]
    );
    assert_eq!(
        rig.command("list all"),
        ["error: unexpected \"all\"; usage: vms"]
    );
    assert_eq!(rig.command(""), Vec::<String>::new());
}

#[test]
fn line_editing() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.command("");
    // Backspace and DEL erase; erasing an empty line rings.
    rig.type_bytes(b"vmx\x08s");
    assert_eq!(rig.term.take(), "vmx\x08 \x08s");
    rig.type_bytes(b"\x7f\x7f\x7f\x7f");
    assert_eq!(rig.term.take(), "\x08 \x08\x08 \x08\x08 \x08\x07");
    // An arrow key is skipped; other control bytes ring.
    rig.type_bytes(b"\x1b[Ahelp\x01\x1bOx");
    assert_eq!(rig.term.take(), "help\x07");
    // `\r\n` runs the line once.
    rig.type_bytes(b"\r\n");
    let text = rig.term.take();
    assert_eq!(text.matches(PROMPT).count(), 1);
    assert!(text.starts_with("\nhelp "));
    // A line stops at its capacity.
    rig.type_bytes(&[b'y'; EDIT_CAPACITY + 3]);
    let text = rig.term.take();
    assert_eq!(text.matches('y').count(), EDIT_CAPACITY);
    assert_eq!(text.matches('\x07').count(), 3);
}

#[test]
fn guest_lines_during_the_monitor_redraw_the_prompt() {
    let mut rig = Rig::new(&["a", "b"]);
    rig.command("");
    rig.type_bytes(b"paus");
    rig.term.take();
    rig.guest(1, b"tick\n");
    assert_eq!(rig.term.take(), alloc::format!("\n[b] tick\n{PROMPT}paus"));
    rig.type_bytes(b"e a\r");
    assert_eq!(
        rig.term.take(),
        alloc::format!("e a\nok: a paused\n{PROMPT}")
    );
    // A VM that stops flushes its partial line even with the monitor open.
    rig.guest(0, b"bye");
    rig.console.flush_vm(VmId(0), &mut rig.term).unwrap();
    assert_eq!(rig.term.take(), alloc::format!("\n[a] bye\n{PROMPT}"));
}

#[test]
fn one_vm_output_ends_the_prompt_line() {
    let mut rig = Rig::new(&["solo"]);
    rig.command("");
    rig.guest(0, b"x");
    rig.guest(0, b"\n");
    assert_eq!(rig.term.take(), alloc::format!("\nx\n{PROMPT}"));
}

/// One event fed to the console.
#[derive(Clone, Debug)]
enum Event {
    Typed(u8),
    Guest(usize, u8),
    Burst(usize, usize),
    Poll,
    Flush(usize),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => prop_oneof![
            any::<u8>(),
            Just(ESCAPE),
            Just(b'\r'),
            Just(0x03),
            prop::sample::select(b"vms focus b counters pause resume stop restart slots slot add delete move flags 0x1 2M exit help poweroff list ".to_vec()),
        ].prop_map(Event::Typed),
        4 => (0usize..3, prop_oneof![any::<u8>(), Just(b'\n'), Just(b'a')]).prop_map(|(v, b)| Event::Guest(v, b)),
        1 => (0usize..3, 1usize..600).prop_map(|(v, n)| Event::Burst(v, n)),
        1 => Just(Event::Poll),
        1 => (0usize..3).prop_map(Event::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `dirty get`'s runs cover exactly the set bits, in order, each run
    /// as long as it can be (a clear bit or the bitmap's end after it).
    #[test]
    fn dirty_runs_are_the_set_bits(bitmap in proptest::collection::vec(any::<u64>(), 0..6)) {
        let dirty = DirtyPages { ipa: 0x4000_0000, bitmap };
        let bit = |page: u64| dirty.bitmap[(page / 64) as usize] >> (page % 64) & 1 != 0;
        let total = dirty.bitmap.len() as u64 * 64;
        let mut covered = Vec::new();
        let mut last_end = None;
        for (first, pages) in dirty.runs() {
            prop_assert!(pages > 0);
            prop_assert!(last_end.is_none_or(|end| first > end), "runs apart and in order");
            prop_assert!(first == 0 || !bit(first - 1), "run starts after a clear bit");
            let end = first + pages;
            prop_assert!(end == total || !bit(end), "run ends at a clear bit");
            covered.extend(first..end);
            last_end = Some(end);
        }
        let set: Vec<u64> = (0..total).filter(|&p| bit(p)).collect();
        prop_assert_eq!(covered.len() as u64, dirty.count());
        prop_assert_eq!(covered, set);
    }

    /// Random keys, guest bytes and polls: nothing panics, every buffer stays
    /// within its bound.
    #[test]
    fn random_streams_stay_bounded(events in prop::collection::vec(event(), 0..600)) {
        let mut rig = Rig::new(&["a", "b", "c"]);
        for event in events {
            match event {
                Event::Typed(b) => rig.type_bytes(&[b]),
                Event::Guest(vm, b) => rig.guest(vm, &[b]),
                Event::Burst(vm, n) => rig.guest(vm, &vec![b'x'; n]),
                Event::Poll => rig.poll(),
                Event::Flush(vm) => rig.console.flush_vm(VmId(vm), &mut rig.term).unwrap(),
            }
            for vm in 0..3 {
                prop_assert!(rig.console.mux().buffered(VmId(vm)).unwrap() < LINE_CAPACITY);
            }
        }
    }

    /// Guest output alone: every terminal line holds one VM's bytes behind
    /// exactly one prefix, and each VM's bytes come out whole and in order.
    #[test]
    fn lines_never_interleave(
        output in prop::collection::vec((0usize..3, prop_oneof![3 => b'a'..=b'z', 1 => Just(b'\n'), 1 => Just(b'\r'), 1 => Just(b'[')]), 0..2000),
        polls in prop::collection::vec(0usize..2000, 0..20),
    ) {
        let names = ["a", "b", "c"];
        let mut rig = Rig::new(&names);
        for (i, &(vm, byte)) in output.iter().enumerate() {
            if polls.contains(&i) {
                rig.poll();
            }
            rig.guest(vm, &[byte]);
        }
        for vm in 0..3 {
            rig.console.flush_vm(VmId(vm), &mut rig.term).unwrap();
        }
        let text = rig.term.text();
        let mut seen: Vec<String> = vec![String::new(); 3];
        for line in text.split_terminator('\n') {
            let vm = names
                .iter()
                .position(|n| line.starts_with(&alloc::format!("[{n}] ")))
                .unwrap_or_else(|| panic!("line without prefix: {line:?}"));
            seen[vm].push_str(&line[4..]);
        }
        for (vm, seen) in seen.iter().enumerate() {
            let sent: String = output
                .iter()
                .filter(|&&(v, b)| v == vm && b != b'\n' && b != b'\r')
                .map(|&(_, b)| char::from(b))
                .collect();
            prop_assert_eq!(seen, &sent);
        }
    }
}
