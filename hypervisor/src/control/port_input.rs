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
//! back again, for ever. So [`PortInput`] remembers the lines of the last
//! answer ([`PortInput::answered`]); an incoming line equal to one of them
//! (blanks at either end aside) is the echo, and is dropped together with
//! the remembered lines before it (an echo keeps their order). Any other
//! line is a command and makes it forget the answer. Only a command that
//! repeats, word for word, a line of the answer just before it would be
//! taken for an echo; the monitor answers with tables and messages, not
//! commands.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// Longest command line a port takes.
pub const MAX_LINE: usize = 256;

/// Most answer lines remembered as a possible echo.
const MAX_ECHO_LINES: usize = 256;

/// What a control port has received and not yet run: the guest's
/// unfinished command text, and the lines of the last answer that a
/// terminal's echo may still send back.
#[derive(Debug, Default)]
pub struct PortInput {
    /// Complete lines (each ended by `\n`) and the open one.
    text: Vec<u8>,
    /// The last answer's lines, trimmed, oldest first.
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
            self.echo.clear();
            return Some(line);
        }
    }

    /// Notes `answer`, just written to the port, as what an echo would send
    /// back.
    pub fn answered(&mut self, answer: &str) {
        self.echo = answer
            .lines()
            .map(|line| line.trim().as_bytes().to_vec())
            .filter(|line| !line.is_empty())
            .take(MAX_ECHO_LINES)
            .collect();
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
    fn a_command_forgets_the_answer_so_its_lines_run_later() {
        let mut input = PortInput::default();
        input.answered("ok: other paused\n");
        input.push(b"vms\nok: other paused\n");
        assert_eq!(commands(&mut input), ["vms", "ok: other paused"]);
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
    /// a monitor that answers every unknown line with an error.
    #[test]
    fn an_echoing_terminal_runs_each_command_once() {
        let mut input = PortInput::default();
        input.push(b"vms\n");
        let mut ran = vec![];
        for _ in 0..100 {
            let Some(line) = input.next_command() else {
                break;
            };
            let line = String::from_utf8(line).unwrap();
            let answer = if line == "vms" {
                String::from("ID  NAME\n0   ctl\n")
            } else {
                alloc::format!("error: unknown command \"{line}\"\n")
            };
            ran.push(line);
            input.answered(&answer);
            input.push(&echo_of(&answer));
        }
        assert_eq!(ran, ["vms"]);
    }

    fn command() -> impl Strategy<Value = String> {
        "[a-z]{1,6}( [a-z0-9]{1,6}){0,2}"
    }

    fn answer() -> impl Strategy<Value = String> {
        prop::collection::vec("[A-Z][a-z: ]{0,12}", 0..4)
            .prop_map(|lines| lines.iter().map(|l| alloc::format!("{l}\n")).collect())
    }

    proptest! {
        /// Commands written in any pieces, answered with lines that are not
        /// commands, through a terminal that echoes or one that does not:
        /// exactly the commands run, in order.
        #[test]
        fn exactly_the_commands_run(
            script in prop::collection::vec((command(), answer()), 1..8),
            echo in any::<bool>(),
            cut in 1usize..5,
        ) {
            let mut input = PortInput::default();
            let mut ran = vec![];
            for (command, answer) in &script {
                let text = alloc::format!("{command}\r\n");
                for piece in text.as_bytes().chunks(cut) {
                    input.push(piece);
                    while let Some(line) = input.next_command() {
                        ran.push(String::from_utf8(line).unwrap());
                        // An answered echo would loop for ever.
                        prop_assert!(ran.len() <= script.len(), "ran {:?}", ran);
                        input.answered(answer);
                        if echo {
                            input.push(&echo_of(answer));
                        }
                    }
                }
            }
            let expected: Vec<&String> = script.iter().map(|(c, _)| c).collect();
            prop_assert_eq!(ran.iter().collect::<Vec<_>>(), expected);
        }
    }
}
