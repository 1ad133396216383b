//! Scripted console input: bytes sent to the guest's console (QEMU's stdin)
//! when given text appears on it, e.g. "after `monitor> ` appears, send
//! `vms\r`".
//!
//! A [`ConsoleScript`] is a list of [`ConsoleStep`]s, each a text to wait
//! for and the bytes to send then. Give it to a run as
//! [`crate::ConsoleInput::Script`] (or to [`crate::qemu::run_with`]); the
//! run fails with [`crate::Verdict::ScriptUnfinished`] when the console
//! never showed a step's text.
//!
//! # Matching
//!
//! [`ScriptProgress`] reads the console as a stream, not as lines, so a
//! prompt that ends without a newline is seen as soon as it arrives. Steps
//! run in order: step `i + 1` only looks at text that came after the text
//! step `i` matched, so a prompt printed twice answers two steps and one
//! print answers one. A step with an empty text fires as soon as the step
//! before it did (at the start for the first step). Carriage returns are
//! ignored in the console text (a `\r\n` console reads as `\n`). Matching is
//! on text decoded chunk by chunk as UTF-8 (invalid bytes read as U+FFFD),
//! so waited-for text should be ASCII.

/// One step: wait until `wait_for` appears, then send `send`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleStep {
    /// The text to wait for (empty: do not wait).
    pub wait_for: String,
    /// The bytes to send once it appeared.
    pub send: Vec<u8>,
}

/// Steps run in order (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsoleScript {
    /// The steps.
    pub steps: Vec<ConsoleStep>,
}

impl ConsoleScript {
    /// An empty script.
    pub fn new() -> ConsoleScript {
        ConsoleScript::default()
    }

    /// The script with one more step: after `wait_for` appears, send
    /// `send`.
    pub fn then(mut self, wait_for: &str, send: impl AsRef<[u8]>) -> ConsoleScript {
        self.steps.push(ConsoleStep {
            wait_for: wait_for.to_string(),
            send: send.as_ref().to_vec(),
        });
        self
    }
}

/// How far a script has got on a console.
#[derive(Clone, Debug)]
pub struct ScriptProgress<'a> {
    script: &'a ConsoleScript,
    /// Steps already sent.
    done: usize,
    /// Console text after the last match, where the next step looks.
    unmatched: String,
}

impl<'a> ScriptProgress<'a> {
    /// At the start of `script`.
    pub fn new(script: &'a ConsoleScript) -> ScriptProgress<'a> {
        ScriptProgress {
            script,
            done: 0,
            unmatched: String::new(),
        }
    }

    /// Takes console text as it arrives and returns the bytes to send now,
    /// in order (one entry per step that fired). Call it with `""` at the
    /// start so that steps without a text fire.
    pub fn feed(&mut self, text: &str) -> Vec<&'a [u8]> {
        self.unmatched.extend(text.chars().filter(|&c| c != '\r'));
        let mut send = Vec::new();
        while let Some(step) = self.script.steps.get(self.done) {
            let Some(at) = self.unmatched.find(&step.wait_for) else {
                break;
            };
            self.unmatched.drain(..at + step.wait_for.len());
            send.push(step.send.as_slice());
            self.done += 1;
        }
        // Keep only what a future match could still start in.
        if let Some(step) = self.script.steps.get(self.done) {
            let keep = step.wait_for.len().saturating_sub(1);
            if self.unmatched.len() > keep {
                let mut cut = self.unmatched.len() - keep;
                while !self.unmatched.is_char_boundary(cut) {
                    cut -= 1;
                }
                self.unmatched.drain(..cut);
            }
        } else {
            self.unmatched.clear();
        }
        send
    }

    /// How many steps have fired.
    pub fn steps_done(&self) -> usize {
        self.done
    }

    /// The step the script waits at, if it has not finished.
    pub fn waiting_at(&self) -> Option<&'a ConsoleStep> {
        self.script.steps.get(self.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn steps_fire_in_order_on_text_across_chunks() {
        let script = ConsoleScript::new()
            .then("", "\r")
            .then("monitor> ", "vms\r")
            .then("monitor> ", "quit\r");
        let mut progress = ScriptProgress::new(&script);
        assert_eq!(progress.feed(""), [b"\r".as_slice()]);
        assert_eq!(progress.feed("booting\r\nmoni"), Vec::<&[u8]>::new());
        assert_eq!(progress.feed("tor> "), [b"vms\r".as_slice()]);
        assert_eq!(progress.steps_done(), 2);
        // The prompt that fired step 2 does not also fire step 3.
        assert_eq!(progress.feed("vms\r\nvm0 running\r\n"), Vec::<&[u8]>::new());
        assert_eq!(progress.waiting_at().unwrap().wait_for, "monitor> ");
        assert_eq!(progress.feed("monitor> "), [b"quit\r".as_slice()]);
        assert_eq!(progress.waiting_at(), None);
        assert_eq!(progress.feed("monitor> "), Vec::<&[u8]>::new());
    }

    #[test]
    fn one_chunk_can_fire_several_steps_and_a_prompt_twice_fires_two() {
        let script = ConsoleScript::new().then("> ", "a").then("> ", "b");
        let mut progress = ScriptProgress::new(&script);
        assert_eq!(progress.feed("> x\n> "), [b"a".as_slice(), b"b".as_slice()]);
        let mut once = ScriptProgress::new(&script);
        assert_eq!(once.feed("> x\n"), [b"a".as_slice()]);
        assert_eq!(once.steps_done(), 1);
    }

    proptest! {
        #[test]
        fn a_text_split_anywhere_fires_its_step_once(
            before in "[a-z \n]{0,30}",
            after in "[a-z \n]{0,30}",
            cut in 0usize..80,
        ) {
            let console = format!("{before}PROMPT>{after}");
            let cut = cut.min(console.len());
            let script = ConsoleScript::new().then("PROMPT>", "go");
            let mut progress = ScriptProgress::new(&script);
            let mut sent = progress.feed(&console[..cut]);
            sent.extend(progress.feed(&console[cut..]));
            prop_assert_eq!(sent, vec![b"go".as_slice()]);
        }
    }
}
