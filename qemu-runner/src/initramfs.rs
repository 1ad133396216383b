//! A busybox initramfs for Linux guests, built in Rust.
//!
//! The archive is a newc cpio (written with `boot_payload::cpio`, the payload's writer):
//! the usual directories, `/dev/console`, `/bin/busybox` (a static arm64
//! busybox), `/bin/sh` linking to it, and an `/init` script. The script's first
//! act is `busybox --install -s`, which links every applet, so the archive
//! need not know busybox's applet list. Two flavours of `/init`:
//!
//! - [`Init::Shell`]: mounts `proc`, `sysfs` and `devtmpfs`, prints a banner
//!   and starts a shell on the console's real tty (`setsid cttyhack sh`, so job
//!   control works); when the shell exits, `poweroff -f` (PSCI `SYSTEM_OFF`).
//! - [`Init::Test`]: prints [`INIT_MARKER`], checks that `/proc/cpuinfo` and
//!   `/sys/devices/system/cpu/online` both show the expected CPUs, writes
//!   [`TEST_WRITE_MIB`] MiB through a tmpfs (1 MiB random seed, repeated with
//!   a per-block header so no two blocks are alike) and verifies the file's
//!   size and its md5 against a second pass of the same generator, then prints
//!   `RESULT: PASS` or `RESULT: FAIL <why>` and powers off.

use boot_payload::cpio::{FileEntry, write_archive};

/// The line the test init prints first: the kernel has booted and started
/// user space.
pub const INIT_MARKER: &str = "LINUX-INIT: started";
/// How much the test init writes through tmpfs, in MiB.
pub const TEST_WRITE_MIB: u32 = 128;

/// Which `/init` the initramfs carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// An interactive shell on the console.
    Shell,
    /// The unattended check, expecting `cpus` online CPUs.
    Test {
        /// CPUs that must be online.
        cpus: u32,
    },
}

/// Directories every initramfs has.
const DIRECTORIES: &[&str] = &[
    "bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "mnt", "root", "etc",
];

/// The contents of `/sys/devices/system/cpu/online` when CPUs `0..cpus` are
/// online.
pub fn online_cpu_list(cpus: u32) -> String {
    match cpus {
        0 | 1 => "0".to_string(),
        n => format!("0-{}", n - 1),
    }
}

/// Size of the file the test init writes: per 1 MiB block, a header line
/// `block <i>\n` and the seed.
pub fn test_file_bytes() -> u64 {
    (0..TEST_WRITE_MIB)
        .map(|block| format!("block {block}\n").len() as u64 + (1 << 20))
        .sum()
}

const PROLOGUE: &str = r#"#!/bin/sh
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
"#;

/// The `/init` script of `init`.
pub fn init_script(init: Init) -> String {
    match init {
        Init::Shell => format!(
            r#"{PROLOGUE}hostname guest
echo
echo "{INIT_MARKER}"
echo "Linux $(uname -r), $(grep -c '^processor' /proc/cpuinfo) CPU(s), $(free -m | awk '/Mem:/ {{print $2}}') MiB: busybox shell. 'exit' or 'poweroff -f' powers off."
setsid cttyhack sh
echo "shell exited; powering off"
poweroff -f
"#
        ),
        Init::Test { cpus } => {
            let online = online_cpu_list(cpus);
            let bytes = test_file_bytes();
            format!(
                r#"{PROLOGUE}echo "{INIT_MARKER}"
fail() {{
    echo "RESULT: FAIL $*"
    poweroff -f
    exit 1
}}
processors=$(grep -c '^processor' /proc/cpuinfo)
[ "$processors" = "{cpus}" ] || fail "/proc/cpuinfo lists $processors CPUs, expected {cpus}"
online=$(cat /sys/devices/system/cpu/online)
[ "$online" = "{online}" ] || fail "online CPUs are '$online', expected '{online}'"
echo "LINUX-INIT: $processors CPUs online ($online)"
mkdir -p /mnt/tmpfs
mount -t tmpfs -o size={tmpfs_mib}m tmpfs /mnt/tmpfs || fail "cannot mount a tmpfs"
dd if=/dev/urandom of=/mnt/tmpfs/seed bs=4096 count=256 2>/dev/null || fail "cannot make the seed"
pattern() {{
    i=0
    while [ $i -lt {mib} ]; do
        echo "block $i"
        cat /mnt/tmpfs/seed
        i=$((i + 1))
    done
}}
pattern > /mnt/tmpfs/data || fail "writing {mib} MiB to tmpfs failed"
size=$(stat -c %s /mnt/tmpfs/data)
[ "$size" = "{bytes}" ] || fail "tmpfs file has $size bytes, expected {bytes}"
written=$(md5sum < /mnt/tmpfs/data)
expected=$(pattern | md5sum)
[ "$written" = "$expected" ] || fail "tmpfs file reads back as $written, expected $expected"
echo "LINUX-INIT: {mib} MiB written through tmpfs and verified"
rm /mnt/tmpfs/data
echo "RESULT: PASS"
poweroff -f
"#,
                mib = TEST_WRITE_MIB,
                tmpfs_mib = TEST_WRITE_MIB + 32,
            )
        }
    }
}

/// The initramfs (an uncompressed newc cpio archive) with `busybox` and the
/// `/init` of `init`.
pub fn build(busybox: &[u8], init: Init) -> Vec<u8> {
    let mut entries: Vec<FileEntry> = DIRECTORIES
        .iter()
        .map(|d| FileEntry::directory(d))
        .collect();
    entries.push(FileEntry::char_device("dev/console", 5, 1));
    entries.push(FileEntry::executable("bin/busybox", busybox.to_vec()));
    entries.push(FileEntry::symlink("bin/sh", "busybox"));
    entries.push(FileEntry::executable(
        "init",
        init_script(init).into_bytes(),
    ));
    write_archive(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use boot_payload::cpio::{self, DIRECTORY_MODE, EXECUTABLE_MODE, SYMLINK_MODE};

    #[test]
    fn archive_has_busybox_init_and_directories_before_their_files() {
        let archive = build(b"\x7fELF busybox", Init::Test { cpus: 2 });
        let entries: Vec<cpio::Entry> = cpio::entries(&archive).collect::<Result<_, _>>().unwrap();
        let find = |name: &str| {
            entries
                .iter()
                .position(|e| e.name == name)
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert_eq!(entries[find("bin/busybox")].data, b"\x7fELF busybox");
        assert_eq!(entries[find("bin/busybox")].mode, EXECUTABLE_MODE);
        assert_eq!(entries[find("bin/sh")].mode, SYMLINK_MODE);
        assert_eq!(entries[find("init")].mode, EXECUTABLE_MODE);
        assert!(entries[find("init")].data.starts_with(b"#!/bin/sh\n"));
        assert_eq!(entries[find("dev/console")].rdev, (5, 1));
        for entry in &entries {
            if let Some((parent, _)) = entry.name.rsplit_once('/') {
                let parent_at = find(parent);
                assert_eq!(entries[parent_at].mode, DIRECTORY_MODE);
                assert!(
                    parent_at < find(entry.name),
                    "{parent} after {}",
                    entry.name
                );
            }
        }
    }

    #[test]
    fn test_init_checks_the_expected_cpus_and_reports() {
        let script = init_script(Init::Test { cpus: 2 });
        assert!(script.contains(r#"[ "$processors" = "2" ]"#));
        assert!(script.contains(r#"[ "$online" = "0-1" ]"#));
        assert!(script.contains(&format!(r#"[ "$size" = "{}" ]"#, test_file_bytes())));
        let marker = script.find(INIT_MARKER).unwrap();
        let pass = script.find("echo \"RESULT: PASS\"").unwrap();
        assert!(marker < script.find("md5sum").unwrap());
        assert!(pass > script.rfind("fail \"").unwrap());
        assert!(script.trim_end().ends_with("poweroff -f"));
        assert!(init_script(Init::Test { cpus: 1 }).contains(r#"[ "$online" = "0" ]"#));
    }

    #[test]
    fn shell_init_powers_off_after_the_shell() {
        let script = init_script(Init::Shell);
        let shell = script.find("setsid cttyhack sh").unwrap();
        assert!(script[shell..].contains("poweroff -f"));
        assert!(!script.contains("RESULT:"));
    }

    #[test]
    fn cpu_lists_and_file_size() {
        assert_eq!(online_cpu_list(1), "0");
        assert_eq!(online_cpu_list(2), "0-1");
        assert_eq!(online_cpu_list(8), "0-7");
        // "block 0\n".."block 9\n" are 8 bytes, "block 10\n".."block 99\n" 9, the rest 10.
        let headers = 10 * 8 + 90 * 9 + (u64::from(TEST_WRITE_MIB) - 100) * 10;
        assert_eq!(
            test_file_bytes(),
            u64::from(TEST_WRITE_MIB) * (1 << 20) + headers
        );
    }
}
