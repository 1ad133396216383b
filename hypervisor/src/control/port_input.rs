//! The input side of a control port: command lines out of a byte stream,
//! with a terminal's echo of the answers recognised and dropped.
//!
//! A control VM writes monitor commands to a port (Linux `hvc1`) and reads
//! the answers there. [`PortInput`] collects the bytes, cuts them into
//! lines (`\r` and `\n` both end one, blank lines are ignored, a line past
//! [`MAX_LINE`] bytes is kept as a too-long mark) and hands out the lines
//! that are commands.
//!
//! # Terminal echo
//!
//! Linux resets an `hvc` port's terminal mode at its last close, and a
//! terminal in its default mode echoes what it receives. Without a guard,
//! each answer line comes back as a new "command", whose error answer comes
//! back again, for ever. So [`PortInput`] keeps the lines of its answers in
//! order ([`PortInput::answered`]), the last [`MAX_ECHO_LINES`] of them: an
//! incoming line equal to one of them (blanks at either end aside) is an
//! echo, and is dropped together with the kept lines before it (an echo
//! keeps their order). Any other line is a command. Commands written ahead
//! of the answers' echo (several in one write) interleave with it and keep
//! the guard: the kept lines are not forgotten at a command, only dropped
//! once echoed or pushed out by newer ones. A command that repeats, word for
//! word, a kept answer line would be taken for an echo; the monitor answers
//! with tables and messages, never with a command line.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// Longest command line a port takes.
pub const MAX_LINE: usize = 256;

/// Most answer lines kept as a possible echo.
pub const MAX_ECHO_LINES: usize = 256;

/// What a control port has received and not yet run: the guest's
/// unfinished command text, and the answer lines that a terminal's echo
/// may still send back.
#[derive(Debug, Default)]
pub struct PortInput {
    /// Complete lines (each ended by `\n`) and the open one.
    text: Vec<u8>,
    /// The answers' lines not echoed yet, trimmed, oldest first.
    echo: VecDeque<Vec<u8>>,
}

impl PortInput {
    /// Adds the guest's `bytes`. `\r` and `\n` both end a line; a line past
    /// [`MAX_LINE`] bytes keeps one byte past the limit as its mark.
    pub fn push(&mut self, bytes: &[u8]) {
        let mut open = self
            .text
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        for &byte in bytes {
            if byte == b'\n' || byte == b'\r' {
                self.text.push(b'\n');
                open = self.text.len();
            } else if self.text.len() - open <= MAX_LINE {
                self.text.push(byte);
            }
        }
    }

    /// The next complete line to run as a command, passing over blank lines
    /// and echoed answer lines; `None` when no complete line is left.
    pub fn next_command(&mut self) -> Option<Vec<u8>> {
        loop {
            let end = self.text.iter().position(|&b| b == b'\n')?;
            let line: Vec<u8> = self.text.drain(..=end).take(end).collect();
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            if let Some(at) = self.echo.iter().position(|l| l.as_slice() == trimmed) {
                self.echo.drain(..=at);
                continue;
            }
            return Some(line);
        }
    }

    /// Keeps the lines of `answer`, just written to the port, as what an
    /// echo would send back (the oldest kept lines go past
    /// [`MAX_ECHO_LINES`]).
    pub fn answered(&mut self, answer: &str) {
        for line in answer.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if self.echo.len() == MAX_ECHO_LINES {
                self.echo.pop_front();
            }
            self.echo.push_back(line.as_bytes().to_vec());
        }
    }

    /// Forgets everything (a device reset).
    pub fn clear(&mut self) {
        self.text.clear();
        self.echo.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec;
    use proptest::prelude::*;

    fn commands(input: &mut PortInput) -> Vec<String> {
        core::iter::from_fn(|| input.next_command())
            .map(|line| String::from_utf8(line).unwrap())
            .collect()
    }

    /// What a Linux terminal in its default mode sends back for `answer`:
    /// each byte, with `\n` turned into `\r\n` (`ONLCR`).
    fn echo_of(answer: &str) -> Vec<u8> {
        answer.replace('\n', "\r\n").into_bytes()
    }

    #[test]
    fn lines_end_at_cr_or_lf_and_blank_lines_are_no_commands() {
        let mut input = PortInput::default();
        input.push(b"vms\r\n\n  \r");
        input.push(b"pause ");
        assert_eq!(commands(&mut input), ["vms"]);
        input.push(b"web\r");
        assert_eq!(commands(&mut input), ["pause web"]);
    }

    #[test]
    fn an_overlong_line_keeps_one_byte_past_the_limit() {
        let mut input = PortInput::default();
        input.push(&[b'x'; MAX_LINE + 40]);
        input.push(b"\nvms\n");
        let lines = commands(&mut input);
        assert_eq!(lines[0].len(), MAX_LINE + 1);
        assert_eq!(lines[1], "vms");
    }

    #[test]
    fn an_echoed_answer_is_dropped_and_the_next_command_runs() {
        let mut input = PortInput::default();
        input.push(b"vms\n");
        assert_eq!(commands(&mut input), ["vms"]);
        let answer = "ID  NAME   STATE\n0   ctl    running\n1   other  running\n";
        input.answered(answer);
        input.push(&echo_of(answer));
        assert_eq!(commands(&mut input), Vec::<String>::new());
        input.push(b"devices other\n");
        assert_eq!(commands(&mut input), ["devices other"]);
    }

    #[test]
    fn answer_lines_are_kept_up_to_the_limit() {
        let mut input = PortInput::default();
        input.answered("ok: other paused\n");
        input.push(b"vms\nok: other paused\n");
        assert_eq!(
            commands(&mut input),
            ["vms"],
            "the echo came after a command"
        );
        input.answered("ok: other paused\n");
        for n in 0..MAX_ECHO_LINES {
            input.answered(&alloc::format!("row {n}\n"));
        }
        input.push(b"ok: other paused\nrow 0\n");
        assert_eq!(
            commands(&mut input),
            ["ok: other paused"],
            "the oldest line went past the limit"
        );
    }

    #[test]
    fn a_partial_echo_drops_the_lines_before_it() {
        let mut input = PortInput::default();
        input.answered("a\nb\nc\n");
        input.push(b"b\na\n");
        // `b` is the echo (and `a` before it went missing); the `a` after
        // it is no longer a remembered line, so it is a command.
        assert_eq!(commands(&mut input), ["a"]);
    }

    /// The loop the guard exists for: a terminal echoing every answer, and
    /// a monitor that answers every unknown line with an error; the
    /// commands come in one write, so their answers' echo interleaves with
    /// the later commands.
    #[test]
    fn an_echoing_terminal_runs_each_command_once() {
        let mut input = PortInput::default();
        input.push(b"vms\ncounters ctl\npause other\n");
        let mut ran = vec![];
        for _ in 0..100 {
            let Some(line) = input.next_command() else {
                break;
            };
            let line = String::from_utf8(line).unwrap();
            let answer = match line.as_str() {
                "vms" => String::from("ID  NAME\n0   ctl\n"),
                "pause other" => String::from("ok: other paused\n"),
                _ => alloc::format!("error: unknown command \"{line}\"\n"),
            };
            ran.push(line);
            input.answered(&answer);
            input.push(&echo_of(&answer));
        }
        assert_eq!(ran, ["vms", "counters ctl", "pause other"]);
    }

    fn command() -> impl Strategy<Value = String> {
        "[a-z]{1,6}( [a-z0-9]{1,6}){0,2}"
    }

    fn answer() -> impl Strategy<Value = String> {
        prop::collection::vec("[A-Z][a-z: ]{0,12}", 0..4)
            .prop_map(|lines| lines.iter().map(|l| alloc::format!("{l}\n")).collect())
    }

    proptest! {
        /// Commands written in any pieces, all ahead of the answers or one
        /// at a time, answered with lines that are not commands, through a
        /// terminal that echoes or one that does not: exactly the commands
        /// run, in order.
        #[test]
        fn exactly_the_commands_run(
            script in prop::collection::vec((command(), answer()), 1..8),
            echo in any::<bool>(),
            ahead in any::<bool>(),
            cut in 1usize..5,
        ) {
            let mut input = PortInput::default();
            let text: Vec<String> = script.iter().map(|(c, _)| alloc::format!("{c}\r\n")).collect();
            if ahead {
                for piece in text.concat().as_bytes().chunks(cut) {
                    input.push(piece);
                }
            }
            let mut ran: Vec<String> = vec![];
            let mut answers = script.iter().map(|(_, a)| a);
            for command in &text {
                if !ahead {
                    for piece in command.as_bytes().chunks(cut) {
                        input.push(piece);
                    }
                }
                while let Some(line) = input.next_command() {
                    ran.push(String::from_utf8(line).unwrap());
                    // An answered echo would loop for ever.
                    prop_assert!(ran.len() <= script.len(), "ran {:?}", ran);
                    let answer = answers.next().unwrap();
                    input.answered(answer);
                    if echo {
                        input.push(&echo_of(answer));
                    }
                }
            }
            let expected: Vec<&String> = script.iter().map(|(c, _)| c).collect();
            prop_assert_eq!(ran.iter().collect::<Vec<_>>(), expected);
        }
    }
}
