//! Judging a run of several VMs from its console.
//!
//! With more than one VM the hypervisor starts each line a VM writes with
//! `[<name>] ` (`boot_payload::vmname::ConsolePrefix`), and its own
//! `[hv] ERROR: vm<V> vcpu<C>: stopping the VM: <why>` line names the VM by
//! its place `V` in the payload. [`VmConsoles::read`] sorts the transcript
//! by VM: each VM's first `RESULT:` line, its first kernel failure report
//! and whether the hypervisor stopped it. [`judge_vms`] then holds each VM
//! to its [`VmExpect`]:
//!
//! - `pass`: its `RESULT: PASS`, no kernel failure report, not stopped;
//! - `stopped`: the hypervisor's stop line for it;
//! - `running`: not stopped, no kernel failure report, no `RESULT: FAIL`.
//!
//! The run passes when every VM met its expectation, no hypervisor panic
//! came, and QEMU exited 0 by itself, or, when a VM is expected to keep
//! running, was stopped by the runner after every other VM had settled
//! ([`VmConsoles::settled`]). A failing run names every VM that failed
//! and why.

use boot_payload::vmname::split_console_prefix;

use crate::console::{GuestResult, Line, Transcript, VM_MIGRATED_MARKER, VM_STOP_MARKER, classify};
use crate::qemu::Ending;
use crate::vmspec::VmExpect;

/// What the console showed of one VM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmConsole {
    /// Its first `RESULT:` line.
    pub result: Option<GuestResult>,
    /// Its kernel's first failure report.
    pub kernel_fault: Option<String>,
    /// The hypervisor's stop line for it (after `[hv] ERROR: `).
    pub stopped: Option<String>,
    /// How many console lines it wrote.
    pub lines: usize,
}

/// The console sorted by VM, in payload order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmConsoles(pub Vec<VmConsole>);

impl VmConsoles {
    /// Sorts `transcript` by the VMs called `names` (payload order).
    pub fn read(transcript: &Transcript, names: &[&str]) -> VmConsoles {
        let mut vms = vec![VmConsole::default(); names.len()];
        for (_, line) in &transcript.timed_lines {
            let Some((name, text)) = split_console_prefix(line) else {
                continue;
            };
            let Some(vm) = names.iter().position(|n| *n == name.as_str()) else {
                continue;
            };
            let vm = &mut vms[vm];
            vm.lines += 1;
            match classify(text) {
                Line::Result(result) if vm.result.is_none() => vm.result = Some(result),
                Line::KernelFault(report) if vm.kernel_fault.is_none() => {
                    vm.kernel_fault = Some(report)
                }
                _ => {}
            }
        }
        for stop in &transcript.vm_stops {
            if let Some(vm) = stopped_vm(stop)
                && let Some(vm) = vms.get_mut(vm)
                && vm.stopped.is_none()
            {
                vm.stopped = Some(stop.clone());
            }
        }
        VmConsoles(vms)
    }

    /// Whether every VM but those expected to keep running has come to its
    /// end: printed a result or was stopped.
    pub fn settled(&self, expects: &[VmExpect]) -> bool {
        self.0.iter().zip(expects).all(|(vm, expect)| {
            *expect == VmExpect::Running || vm.result.is_some() || vm.stopped.is_some()
        })
    }

    /// Why `vm` did not meet `expect` (`None`: it did).
    pub fn failure(&self, vm: usize, expect: VmExpect, timed_out: bool) -> Option<String> {
        let console = self.0.get(vm)?;
        let stopped = console
            .stopped
            .as_ref()
            .map(|line| format!("the hypervisor stopped it: {line}"));
        let fault = console
            .kernel_fault
            .as_ref()
            .map(|report| format!("its kernel reported `{report}`"));
        let reported = match &console.result {
            Some(GuestResult::Fail(why)) => Some(format!("it reported: {why}")),
            Some(GuestResult::Malformed(line)) => Some(format!("unreadable result line `{line}`")),
            _ => None,
        };
        match expect {
            VmExpect::Pass => stopped.or(fault).or(reported).or_else(|| {
                (console.result != Some(GuestResult::Pass)).then(|| {
                    if timed_out {
                        "no RESULT line before the time limit".to_string()
                    } else {
                        "no RESULT line".to_string()
                    }
                })
            }),
            VmExpect::Stopped => console.stopped.is_none().then(|| {
                match &console.result {
                    Some(_) => "expected to be stopped by the hypervisor, it ran to its result",
                    None => "expected to be stopped by the hypervisor, it was not",
                }
                .to_string()
            }),
            VmExpect::Running => stopped.or(fault).or(reported),
        }
    }
}

/// Whether every VM but those expected to keep running has come to its
/// end ([`VmConsoles::settled`]), whatever the last line.
pub fn settled(transcript: &Transcript, names: &[&str], expects: &[VmExpect]) -> bool {
    VmConsoles::read(transcript, names).settled(expects)
}

/// Whether the line `transcript` just took settled the last VM that had
/// not settled ([`VmConsoles::settled`]): only a VM's result line or a stop
/// line can, so other lines cost no look at the whole transcript.
pub fn settles(transcript: &Transcript, names: &[&str], expects: &[VmExpect]) -> bool {
    let Some((_, line)) = transcript.timed_lines.last() else {
        return false;
    };
    let result = split_console_prefix(line)
        .is_some_and(|(_, text)| matches!(classify(text), Line::Result(_)));
    let stop = matches!(classify(line), Line::VmStopped(_));
    (result || stop) && VmConsoles::read(transcript, names).settled(expects)
}

/// The VM index of a stop line `vm<V> vcpu<C>: stopping the VM: <why>`
/// or `vm<V> (<name>): stopped: migrated to ...`.
fn stopped_vm(line: &str) -> Option<usize> {
    let (place, _) = line
        .split_once(VM_STOP_MARKER)
        .or_else(|| line.split_once(VM_MIGRATED_MARKER))?;
    place
        .split_ascii_whitespace()
        .next()?
        .strip_prefix("vm")?
        .parse()
        .ok()
}

/// The outcome of a run of several VMs: `Ok` when every VM met its
/// expectation and QEMU ended as it should (see the module doc), else the
/// failing VMs with why (`Err` with no VM: only QEMU's end was wrong, as
/// `clean_exit` said).
pub fn judge_vms(
    transcript: &Transcript,
    ending: &Ending,
    clean_exit: Result<(), String>,
    vms: &[(&str, VmExpect)],
) -> Result<(), VmsVerdict> {
    let names: Vec<&str> = vms.iter().map(|(name, _)| *name).collect();
    let consoles = VmConsoles::read(transcript, &names);
    let timed_out = matches!(ending, Ending::TimedOut | Ending::Stalled(_));
    let failed: Vec<(String, String)> = vms
        .iter()
        .enumerate()
        .filter_map(|(i, (name, expect))| {
            consoles
                .failure(i, *expect, timed_out)
                .map(|why| (name.to_string(), why))
        })
        .collect();
    if !failed.is_empty() {
        return Err(VmsVerdict::VmsFailed(failed));
    }
    let keeps_running = vms.iter().any(|(_, e)| *e == VmExpect::Running);
    match (clean_exit, ending) {
        (Ok(()), _) => Ok(()),
        (Err(_), Ending::StoppedAfterGrace) if keeps_running => Ok(()),
        (Err(how), _) => Err(VmsVerdict::NoCleanExit(how)),
    }
}

/// Why a run of several VMs failed ([`judge_vms`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmsVerdict {
    /// These VMs (name, why) did not meet their expectation.
    VmsFailed(Vec<(String, String)>),
    /// Every VM did, but QEMU did not end as it should (how it ended).
    NoCleanExit(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(text: &str) -> Transcript {
        let mut transcript = Transcript::default();
        for line in text.lines() {
            transcript.push_line(line);
        }
        transcript
    }

    const TWO: [(&str, VmExpect); 2] = [("a", VmExpect::Pass), ("web", VmExpect::Pass)];

    #[test]
    fn every_vm_must_print_its_own_pass() {
        let both = transcript(
            "[hv] starting 2 VMs\n[a] memory test\n[web] RESULT: PASS\n[a] RESULT: PASS\n\
             STAT vm0 exits 3\n[hv] system off",
        );
        assert_eq!(judge_vms(&both, &Ending::Exited, Ok(()), &TWO), Ok(()));
        let one = transcript("[a] RESULT: PASS\nRESULT: PASS\n[hv] system off");
        assert_eq!(
            judge_vms(&one, &Ending::Exited, Ok(()), &TWO),
            Err(VmsVerdict::VmsFailed(vec![(
                "web".into(),
                "no RESULT line".into()
            )]))
        );
        let timed_out = transcript("[a] RESULT: PASS");
        assert_eq!(
            judge_vms(&timed_out, &Ending::TimedOut, Err("killed".into()), &TWO),
            Err(VmsVerdict::VmsFailed(vec![(
                "web".into(),
                "no RESULT line before the time limit".into()
            )]))
        );
    }

    #[test]
    fn failures_name_each_failing_vm() {
        let text = transcript(
            "[a] RESULT: FAIL counter 3 != 4\n\
             [web] [    2.5] BUG: kernel NULL pointer dereference\n[web] RESULT: PASS\n\
             [hv] system off",
        );
        assert_eq!(
            judge_vms(&text, &Ending::Exited, Ok(()), &TWO),
            Err(VmsVerdict::VmsFailed(vec![
                ("a".into(), "it reported: counter 3 != 4".into()),
                (
                    "web".into(),
                    "its kernel reported `BUG: kernel NULL pointer dereference`".into()
                ),
            ]))
        );
    }

    #[test]
    fn a_bad_guest_beside_a_good_one_must_be_stopped() {
        let vms = [("good", VmExpect::Pass), ("bad", VmExpect::Stopped)];
        let stopped = transcript(
            "[bad] poking the GIC\n\
             [hv] ERROR: vm1 vcpu0: stopping the VM: unhandled abort at 0x0\n\
             [good] RESULT: PASS\n[hv] system off",
        );
        assert_eq!(judge_vms(&stopped, &Ending::Exited, Ok(()), &vms), Ok(()));
        let consoles = VmConsoles::read(&stopped, &["good", "bad"]);
        assert_eq!(
            consoles.0[1].stopped.as_deref(),
            Some("vm1 vcpu0: stopping the VM: unhandled abort at 0x0")
        );
        assert_eq!(consoles.0[1].lines, 1);
        let survived = transcript("[bad] RESULT: PASS\n[good] RESULT: PASS\n[hv] system off");
        assert_eq!(
            judge_vms(&survived, &Ending::Exited, Ok(()), &vms),
            Err(VmsVerdict::VmsFailed(vec![(
                "bad".into(),
                "expected to be stopped by the hypervisor, it ran to its result".into()
            )]))
        );
        // The good VM stopped instead: it is named, the bad one too.
        let wrong = transcript(
            "[hv] ERROR: vm0 vcpu1: stopping the VM: unknown hypercall\n[hv] system off",
        );
        let Err(VmsVerdict::VmsFailed(failed)) = judge_vms(&wrong, &Ending::Exited, Ok(()), &vms)
        else {
            panic!("the good VM was stopped")
        };
        assert_eq!(failed[0].0, "good");
        assert!(failed[0].1.contains("unknown hypercall"), "{}", failed[0].1);
        assert_eq!(failed[1].0, "bad");
    }

    #[test]
    fn a_running_vm_lets_the_runner_end_the_run() {
        let vms = [("t", VmExpect::Pass), ("shell", VmExpect::Running)];
        let text = transcript("[shell] / # \n[t] RESULT: PASS");
        let consoles = VmConsoles::read(&text, &["t", "shell"]);
        assert!(consoles.settled(&[VmExpect::Pass, VmExpect::Running]));
        assert!(
            !VmConsoles::read(&transcript("[shell] / #"), &["t", "shell"])
                .settled(&[VmExpect::Pass, VmExpect::Running])
        );
        assert_eq!(
            judge_vms(
                &text,
                &Ending::StoppedAfterGrace,
                Err("stopped".into()),
                &vms
            ),
            Ok(())
        );
        // Without a running VM the hypervisor must power off by itself.
        assert_eq!(
            judge_vms(
                &text,
                &Ending::StoppedAfterGrace,
                Err("stopped".into()),
                &[("t", VmExpect::Pass)]
            ),
            Err(VmsVerdict::NoCleanExit("stopped".into()))
        );
    }
}
