//! VM names, and the console prefix that tells the VMs' output apart.
//!
//! A name is 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `-` and `_`
//! ([`VmName::new`]): it is a directory name in the payload (`vm/<name>/`),
//! a word in log lines and the console prefix. The names `hv` and `u-boot`
//! are taken: `[hv] ` starts the hypervisor's own log lines and `[u-boot] `
//! the runner's U-Boot boot command's. A name of digits only is refused: the
//! hypervisor console's monitor takes a VM by name or by index.
//!
//! # Console prefix
//!
//! When a payload holds more than one VM, the hypervisor starts each line a
//! VM writes to its console with `[<name>] ` ([`VmName::console_prefix`]),
//! and the runner reads the VM back from it with [`split_console_prefix`].
//! With one VM lines carry no prefix, as before there were several.

/// Longest VM name, in bytes.
pub const MAX_NAME_LEN: usize = 16;

/// Names no VM may take (they start other console lines).
pub const RESERVED_NAMES: [&str; 2] = ["hv", "u-boot"];

/// What opens a console prefix.
pub const CONSOLE_PREFIX_OPEN: char = '[';
/// What closes a console prefix (the space belongs to it).
pub const CONSOLE_PREFIX_CLOSE: &str = "] ";

/// A valid VM name (see the module doc), stored in place so that it can be
/// copied around `no_std` code and into errors.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct VmName {
    bytes: [u8; MAX_NAME_LEN],
    len: u8,
}

/// Why a VM name was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmNameError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`MAX_NAME_LEN`] bytes (its length).
    TooLong(usize),
    /// The name holds a character other than ASCII letters, digits, `-`
    /// and `_` (the first such).
    BadCharacter(char),
    /// The name is one of [`RESERVED_NAMES`].
    Reserved,
    /// The name is digits only (it would read as a VM index).
    AllDigits,
}

impl core::fmt::Display for VmNameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Empty => write!(f, "a VM name may not be empty"),
            Self::TooLong(len) => write!(
                f,
                "a VM name has at most {MAX_NAME_LEN} characters, not {len}"
            ),
            Self::BadCharacter(c) => write!(
                f,
                "a VM name is ASCII letters, digits, `-` and `_`, not {c:?}"
            ),
            Self::Reserved => write!(
                f,
                "the VM names {RESERVED_NAMES:?} are taken by other console lines"
            ),
            Self::AllDigits => write!(
                f,
                "a VM name may not be digits only (the console reads that as an index)"
            ),
        }
    }
}

impl core::error::Error for VmNameError {}

impl VmName {
    /// An empty name for unused slots of fixed arrays; never handed out.
    pub(crate) const PLACEHOLDER: VmName = VmName {
        bytes: [0; MAX_NAME_LEN],
        len: 0,
    };

    /// Checks `name` (see the module doc).
    pub fn new(name: &str) -> Result<VmName, VmNameError> {
        if name.is_empty() {
            return Err(VmNameError::Empty);
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(VmNameError::BadCharacter(bad));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(VmNameError::TooLong(name.len()));
        }
        if RESERVED_NAMES.contains(&name) {
            return Err(VmNameError::Reserved);
        }
        if name.bytes().all(|b| b.is_ascii_digit()) {
            return Err(VmNameError::AllDigits);
        }
        let mut bytes = [0; MAX_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(VmName {
            bytes,
            len: name.len() as u8,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Only ASCII was stored (`new`).
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// What starts each console line of this VM when there are several:
    /// `[<name>] `.
    pub fn console_prefix(&self) -> ConsolePrefix<'_> {
        ConsolePrefix(self.as_str())
    }
}

impl core::fmt::Debug for VmName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl core::fmt::Display for VmName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A VM's console prefix, `[<name>] `, written by its `Display`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsolePrefix<'a>(pub &'a str);

impl core::fmt::Display for ConsolePrefix<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{CONSOLE_PREFIX_OPEN}{}{CONSOLE_PREFIX_CLOSE}", self.0)
    }
}

/// The VM name and the rest of a console line that starts with a console
/// prefix `[<name>] ` naming a valid VM name; `None` for any other line
/// (hypervisor log lines, printk timestamps, unprefixed text).
pub fn split_console_prefix(line: &str) -> Option<(VmName, &str)> {
    let rest = line.strip_prefix(CONSOLE_PREFIX_OPEN)?;
    let (name, text) = rest.split_once(CONSOLE_PREFIX_CLOSE)?;
    Some((VmName::new(name).ok()?, text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use proptest::prelude::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(VmName::new("linux-0_a").unwrap().as_str(), "linux-0_a");
        assert_eq!(VmName::new(""), Err(VmNameError::Empty));
        assert_eq!(VmName::new("a/b"), Err(VmNameError::BadCharacter('/')));
        assert_eq!(VmName::new("a b"), Err(VmNameError::BadCharacter(' ')));
        assert_eq!(VmName::new("é"), Err(VmNameError::BadCharacter('é')));
        assert_eq!(
            VmName::new("abcdefghijklmnopq"),
            Err(VmNameError::TooLong(17))
        );
        assert!(VmName::new("abcdefghijklmnop").is_ok());
        assert_eq!(VmName::new("hv"), Err(VmNameError::Reserved));
        assert_eq!(VmName::new("12"), Err(VmNameError::AllDigits));
        assert!(VmName::new("vm12").is_ok());
        assert_eq!(VmName::new("u-boot"), Err(VmNameError::Reserved));
    }

    #[test]
    fn other_console_lines_have_no_vm_prefix() {
        assert_eq!(split_console_prefix("[hv] system off"), None);
        assert_eq!(split_console_prefix("[    1.000000] Booting"), None);
        assert_eq!(split_console_prefix("[a]no space"), None);
        assert_eq!(split_console_prefix("RESULT: PASS"), None);
    }

    proptest! {
        #[test]
        fn prefixed_lines_split_back(name in "[A-Za-z0-9_-]{1,16}", text in "[ -~]{0,40}") {
            prop_assume!(!RESERVED_NAMES.contains(&name.as_str()));
            prop_assume!(!name.bytes().all(|b| b.is_ascii_digit()));
            let vm = VmName::new(&name).unwrap();
            let line = format!("{}{text}", vm.console_prefix());
            prop_assert_eq!(split_console_prefix(&line), Some((vm, text.as_str())));
        }
    }
}
