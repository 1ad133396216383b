//! A busybox initramfs for Linux guests, built in Rust.
//!
//! The archive is a newc cpio (written with `boot_payload::cpio`, the payload's writer):
//! the usual directories, `/dev/console`, `/bin/busybox` (a static arm64
//! busybox), `/bin/sh` linking to it, the kernel modules of
//! [`crate::kernel_modules::GUEST_MODULES`] (and of
//! [`crate::kernel_modules::OPTIONAL_GUEST_MODULES`] the kernel package
//! has) under `/lib/modules/` with a
//! `load-order` list, and an `/init` script. The script's first
//! act is `busybox --install -s`, which links every applet, so the archive
//! need not know busybox's applet list. Then it loads the modules with
//! `insmod`, in the listed order (a module that does not load is a
//! `LINUX-INIT: module NAME did not load: WHY` line; Linux's `virtio_mmio`
//! finds the devices in the device tree itself, `virtio_pci` those the
//! kernel found enumerating a PCI bus), and when the command line's
//! last `console=` is a virtio console (`console=hvc0`) it waits for that
//! device and moves its own input and output there. Two flavours of `/init`:
//!
//! - [`Init::Shell`]: mounts `proc`, `sysfs` and `devtmpfs`, prints a banner
//!   and starts a shell on the console's real tty (`setsid cttyhack sh`, so job
//!   control works); when the shell exits, `poweroff -f` (PSCI `SYSTEM_OFF`).
//! - [`Init::Test`]: prints [`INIT_MARKER`], checks that `/proc/cpuinfo` and
//!   `/sys/devices/system/cpu/online` both show the expected CPUs, prints
//!   [`MTE_LINE`] when `/proc/cpuinfo` lists `mte` (memory tagging), copies
//!   the kernel's ITS and LPI messages ([`KERNEL_GIC_PREFIX`]), writes
//!   [`TEST_WRITE_MIB`] MiB through a tmpfs (1 MiB random seed, repeated with
//!   a per-block header so no two blocks are alike) and verifies the file's
//!   size and its md5 against a second pass of the same generator, then prints
//!   `RESULT: PASS` or `RESULT: FAIL <why>` and powers off. With a role on
//!   the command line (`hv.role=`, [`Role`]) it checks the CPUs and then
//!   does the role's work instead of the tmpfs check:
//!   - `net-server` / `net-client` ([`Role::NetServer`], [`Role::NetClient`]):
//!     bring up `eth0` with `hv.ip=` (a /24), ping `hv.peer=` until it
//!     answers (two minutes at most), then the server receives
//!     [`NET_TRANSFER_MIB`] MiB on TCP port [`NET_PORT`] with busybox `nc -l
//!     -p` and the client sends them with `nc PEER PORT`, retrying the
//!     connection for 30 s. The data is deterministic (per MiB a `block <i>`
//!     line and the first MiB of `seq 1 200000`), so both sides know its md5;
//!     the server checks what it received. Busybox's `nc` (1.35) has no
//!     `-q`/`-N`: it half-closes the connection when its standard input ends
//!     and exits when the peer's side ends, so the listener's input is a FIFO
//!     held open (with `/dev/null` it half-closes at once and the sender
//!     stops after a few KiB).
//!   - `disk-write` / `disk-check` ([`Role::DiskWrite`], [`Role::DiskCheck`]):
//!     say where `/dev/vda` sits ([`DISK_BUS_PREFIX`]: the PCI function,
//!     its `vendor:device` and whether it interrupts by MSI or INTx, or the
//!     virtio-mmio transport, from `/sys/block/vda/device`'s parent),
//!     mount `/dev/vda` as ext4 (made on the host, [`crate::disk_image`]),
//!     write [`DISK_CHECK_PATH`] with [`disk_check_contents`], `sync`,
//!     unmount; or mount it and check the file's md5. With
//!     `hv.bench_mib=N hv.bench_skip_mib=S` both then time a sequential
//!     write (when the disk is writable) and read of N MiB of the raw device
//!     from MiB S on (past the file system), `dd bs=1M` with
//!     `oflag=direct`/`iflag=direct`, and print [`BENCH_PREFIX`] lines.
//!   - `console-control` ([`Role::ConsoleControl`]): in two rounds, first
//!     with `/dev/hvc1` (the control VM's port to the monitor) raw and not
//!     echoing, then in the terminal's default mode (which echoes the
//!     answers back to the port), write `vms`, print every line that comes
//!     back within 5 s of the last as `CONTROL (raw|echo): <line>`; fail on
//!     a line holding `error`, pass when a line of each round holds
//!     `hv.expect=`.
//!   - `net-serve` ([`Role::NetServe`]): for a network that hands out
//!     addresses by DHCP (QEMU's user-mode network, whose DHCP server gives
//!     10.0.2.15 with the router 10.0.2.2): bring `eth0` up, take a lease
//!     with busybox `udhcpc -i eth0 -n -q -s SCRIPT` (the script sets the
//!     address and the default route it got), then serve
//!     [`net_serve_reply`] on TCP port `hv.port=`, one connection after
//!     another (busybox `nc -l -p PORT` with the reply file as its input,
//!     restarted after each connection), and print [`NET_SERVE_PREFIX`]
//!     lines: `<address> ready` once something listens on the port (read
//!     from `/proc/net/tcp`), and per connection `served connection <n>,
//!     got: <the first line the client sent>` (letters, digits, `._:-`
//!     only, 80 at most). It serves until the machine is powered off and
//!     prints no `RESULT:` line (a `--vm` running it says
//!     `expect=running`); a missing `eth0`, no lease or no listener is a
//!     `RESULT: FAIL`.
//!   - `console-bench` ([`Role::ConsoleBench`]): make `hv.bench_kib=N` KiB
//!     of [`CONSOLE_BENCH_LINE`] lines in the initramfs, then `cat` them to
//!     the PL011 (`/dev/ttyAMA0`) and to the virtio-console (`/dev/hvc0`),
//!     each timed by `/proc/uptime` as the disk roles time `dd` (closing the
//!     PL011's tty waits until its buffer is sent; virtio-console's
//!     `put_chars` waits until the device has used each buffer), and print
//!     both rates as [`BENCH_PREFIX`] lines on the init's console.

use boot_payload::cpio::{FileEntry, write_archive};

/// What the test init prints (after `LINUX-INIT: `) when the kernel found
/// memory tagging: `mte` in `/proc/cpuinfo`'s features.
pub const MTE_LINE: &str = "the CPUs have memory tagging (mte in /proc/cpuinfo)";

/// How the test init's copies of the kernel's ITS and LPI messages start
/// (each `dmesg` line holding `ITS` or `LPI`, without its time stamp): the
/// GICv3 driver's probe of an ITS and its LPI tables, or its complaints.
pub const KERNEL_GIC_PREFIX: &str = "LINUX-INIT: kernel: ";

/// The line the test init prints first: the kernel has booted and started
/// user space.
pub const INIT_MARKER: &str = "LINUX-INIT: started";
/// How much the test init writes through tmpfs, in MiB.
pub const TEST_WRITE_MIB: u32 = 128;

/// TCP port the net roles use.
pub const NET_PORT: u16 = 5000;
/// How much the net roles move, in MiB.
pub const NET_TRANSFER_MIB: u32 = 64;
/// The file the disk roles write and check, on the ext4 file system of
/// `/dev/vda`.
pub const DISK_CHECK_PATH: &str = "/hv/check.txt";
/// The file the disk-write role rewrites in rounds ([`Role::DiskWrite`]'s
/// `rewrite_seconds`), on the same file system.
pub const DISK_ROUNDS_PATH: &str = "/hv/rounds.txt";
/// How the disk roles' line on where `/dev/vda` sits starts: then `PCI
/// device 0000:00:01.0 [1af4:1001], INTx (Linux IRQ N, interrupts so
/// far: M)` (M from `/proc/interrupts`; `MSI (V vectors)` when the function
/// has MSI vectors: its `msi_irqs` directory, which Linux makes as soon as
/// a driver tries MSI, lists some) for a virtio-blk on a PCI bus, `on
/// a003e00.virtio_mmio` for one on a virtio-mmio transport.
pub const DISK_BUS_PREFIX: &str = "LINUX-INIT: /dev/vda is ";
/// How the net-serve role's lines start ([`Role::NetServe`]).
pub const NET_SERVE_PREFIX: &str = "NET-SERVE: ";
/// How the role inits' figures start: `BENCH: <name> <value> <unit>`.
pub const BENCH_PREFIX: &str = "BENCH: ";
/// The line the console bench writes over and over: 63 printable bytes,
/// 64 with its newline, so a KiB is 16 lines.
pub const CONSOLE_BENCH_LINE: &str =
    "console-bench 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJK";
/// [`CONSOLE_BENCH_LINE`] lines in a KiB.
pub const CONSOLE_BENCH_LINES_PER_KIB: u32 = 16;

/// What a test init does besides checking its CPUs, chosen by words on the
/// kernel command line ([`Role::cmdline_words`]); see the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Receive [`NET_TRANSFER_MIB`] MiB from the peer and check their md5.
    NetServer {
        /// Its address on `eth0` (a /24).
        ip: String,
        /// The client's address.
        peer: String,
    },
    /// Send [`NET_TRANSFER_MIB`] MiB to the peer.
    NetClient {
        /// Its address on `eth0` (a /24).
        ip: String,
        /// The server's address.
        peer: String,
    },
    /// Write [`DISK_CHECK_PATH`] on `/dev/vda`'s ext4.
    DiskWrite {
        /// Time this many MiB of raw sequential I/O after it (0: none).
        bench_mib: u32,
        /// Where the timed I/O starts on `/dev/vda`, in MiB.
        bench_skip_mib: u32,
        /// Before the file, rewrite [`DISK_ROUNDS_PATH`] in rounds for at
        /// least this many seconds (0: no rounds); see
        /// [`disk_rounds_contents`].
        rewrite_seconds: u32,
    },
    /// Check [`DISK_CHECK_PATH`] on `/dev/vda`'s ext4.
    DiskCheck {
        /// Time this many MiB of raw sequential I/O after it (0: none).
        bench_mib: u32,
        /// Where the timed I/O starts on `/dev/vda`, in MiB.
        bench_skip_mib: u32,
    },
    /// Ask the monitor `vms` over `/dev/hvc1`; pass when an answer line
    /// holds `expect`.
    ConsoleControl {
        /// Text an answer line must hold.
        expect: String,
    },
    /// Take a DHCP lease on `eth0` and serve [`net_serve_reply`] on TCP
    /// `port` until powered off (no `RESULT:` line).
    NetServe {
        /// The TCP port it listens on.
        port: u16,
    },
    /// Write `kib` KiB of [`CONSOLE_BENCH_LINE`] lines to `/dev/ttyAMA0`,
    /// then to `/dev/hvc0`, each timed: `BENCH:
    /// console_pl011_bytes_per_s` and `console_virtio_bytes_per_s`.
    ConsoleBench {
        /// KiB written to each console (more than 0).
        kib: u32,
    },
}

impl Role {
    /// The kernel command line words that select it.
    pub fn cmdline_words(&self) -> String {
        match self {
            Role::NetServer { ip, peer } => {
                format!("hv.role=net-server hv.ip={ip} hv.peer={peer}")
            }
            Role::NetClient { ip, peer } => {
                format!("hv.role=net-client hv.ip={ip} hv.peer={peer}")
            }
            Role::DiskWrite {
                bench_mib,
                bench_skip_mib,
                rewrite_seconds,
            } => format!(
                "hv.role=disk-write hv.bench_mib={bench_mib} hv.bench_skip_mib={bench_skip_mib} \
                 hv.disk_seconds={rewrite_seconds}"
            ),
            Role::DiskCheck {
                bench_mib,
                bench_skip_mib,
            } => format!(
                "hv.role=disk-check hv.bench_mib={bench_mib} hv.bench_skip_mib={bench_skip_mib}"
            ),
            Role::ConsoleControl { expect } => {
                format!("hv.role=console-control hv.expect={expect}")
            }
            Role::ConsoleBench { kib } => format!("hv.role=console-bench hv.bench_kib={kib}"),
            Role::NetServe { port } => format!("hv.role=net-serve hv.port={port}"),
        }
    }

    /// Whether the init prints a `RESULT:` line after the role (all but
    /// net-serve, which serves until the machine is powered off).
    pub fn reports_result(&self) -> bool {
        !matches!(self, Role::NetServe { .. })
    }
}

/// What the net-serve role sends each connection: a title line and
/// `seq 1 20000` (108,910 bytes: some 75 full-size frames).
pub fn net_serve_reply() -> String {
    let mut text = String::from("net-serve reply\n");
    for i in 1..=20000 {
        text.push_str(&format!("{i}\n"));
    }
    text
}

/// The contents of [`DISK_CHECK_PATH`] as the disk roles write it: a title
/// line and `seq 1 20000`.
pub fn disk_check_contents() -> String {
    let mut text = String::from("virtio-blk persistence check\n");
    for i in 1..=20000 {
        text.push_str(&format!("{i}\n"));
    }
    text
}

/// The contents of [`DISK_ROUNDS_PATH`] after round `round` of the
/// disk-write role: a `round <n>` line and `seq 1 20000`.
pub fn disk_rounds_contents(round: u32) -> String {
    let mut text = format!("round {round}\n");
    for i in 1..=20000 {
        text.push_str(&format!("{i}\n"));
    }
    text
}

/// The last round the disk-write role reports in `console` (its `disk
/// rounds done: <n>` line), if any.
pub fn disk_rounds_done(console: &str) -> Option<u32> {
    console
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find(DISK_ROUNDS_DONE)? + DISK_ROUNDS_DONE.len()..];
            rest.trim().parse().ok()
        })
        .next_back()
}

/// What the disk-write role prints, followed by the number of its last
/// round, when its rounds are done.
pub const DISK_ROUNDS_DONE: &str = "LINUX-INIT: disk rounds done: ";

/// The figures of `BENCH: <name> <value> <unit>` lines in `console`, in order.
pub fn bench_figures(console: &str) -> Vec<(String, f64, String)> {
    console
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find(BENCH_PREFIX)? + BENCH_PREFIX.len()..];
            let mut words = rest.split_whitespace();
            let name = words.next()?.to_string();
            let value = words.next()?.parse().ok()?;
            let unit = words.next()?.to_string();
            Some((name, value, unit))
        })
        .collect()
}

/// A kernel module the initramfs carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestModule {
    /// Its name (`/lib/modules/<name>.ko`).
    pub name: String,
    /// The `.ko` file.
    pub bytes: Vec<u8>,
}

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
if [ -f /lib/modules/load-order ]; then
    while read module; do
        insmod "/lib/modules/$module.ko" 2>/tmp/insmod ||
            echo "LINUX-INIT: module $module did not load: $(cat /tmp/insmod)"
    done < /lib/modules/load-order
fi
console=
for word in $(cat /proc/cmdline); do
    case "$word" in console=*) console=${word#console=}; console=${console%%,*} ;; esac
done
case "$console" in
hvc*)
    n=0
    while [ ! -e "/dev/$console" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
    if [ -e "/dev/$console" ]; then
        exec <"/dev/$console" >"/dev/$console" 2>&1
        echo "LINUX-INIT: console moved to /dev/$console"
    else
        echo "LINUX-INIT: no /dev/$console after 5 s; staying on this console"
    fi
    ;;
esac
"#;

/// The role part of the test init: reads `hv.*` words, defines the roles and
/// runs the one named (nothing without `hv.role=`).
const ROLES: &str = r#"role=; ip=; peer=; expect=; bench_mib=0; bench_skip_mib=0; bench_kib=0; disk_seconds=0; port=
for word in $(cat /proc/cmdline); do
    case "$word" in
    hv.role=*) role=${word#hv.role=} ;;
    hv.ip=*) ip=${word#hv.ip=} ;;
    hv.peer=*) peer=${word#hv.peer=} ;;
    hv.expect=*) expect=${word#hv.expect=} ;;
    hv.bench_mib=*) bench_mib=${word#hv.bench_mib=} ;;
    hv.bench_skip_mib=*) bench_skip_mib=${word#hv.bench_skip_mib=} ;;
    hv.bench_kib=*) bench_kib=${word#hv.bench_kib=} ;;
    hv.disk_seconds=*) disk_seconds=${word#hv.disk_seconds=} ;;
    hv.port=*) port=${word#hv.port=} ;;
    esac
done
now() { read up idle < /proc/uptime; echo "$up"; }
rate() { awk -v mib="$1" -v t0="$2" -v t1="$3" 'BEGIN { t = t1 - t0; if (t < 0.01) t = 0.01; printf "%.1f", mib / t }'; }
byte_rate() { awk -v n="$1" -v t0="$2" -v t1="$3" 'BEGIN { t = t1 - t0; if (t < 0.01) t = 0.01; printf "%.0f", n / t }'; }
wait_for() {
    n=0
    while [ ! -e "$1" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    [ -e "$1" ]
}
net_up() {
    [ -n "$ip" ] && [ -n "$peer" ] || fail "the net roles need hv.ip= and hv.peer="
    wait_for /sys/class/net/eth0 || fail "no eth0 (virtio_net found no device)"
    ip link set lo up
    ip addr add "$ip/24" dev eth0 || fail "cannot give eth0 the address $ip"
    ip link set eth0 up || fail "cannot bring eth0 up"
    echo "LINUX-INIT: eth0 is $ip ($(cat /sys/class/net/eth0/address))"
    n=0
    until ping -c 1 -W 1 "$peer" >/dev/null 2>&1; do
        n=$((n + 1))
        [ $n -lt 120 ] || fail "$peer did not answer ping for two minutes"
    done
    ping -c 10 -i 0.2 "$peer" > /tmp/ping 2>&1 || fail "ping $peer: $(tail -n 2 /tmp/ping)"
    average=$(sed -n 's|^round-trip .* = [0-9.]*/\([0-9.]*\)/.*|\1|p' /tmp/ping)
    echo "LINUX-INIT: $peer answers ping, $average ms on average"
    echo "BENCH: net_ping_us $(awk -v ms="$average" 'BEGIN { printf "%.0f", ms * 1000 }') us"
}
net_pattern() {
    [ -f /tmp/seed ] || seq 1 200000 | head -c 1048576 > /tmp/seed
    i=0
    while [ $i -lt NET_MIB ]; do
        echo "block $i"
        cat /tmp/seed
        i=$((i + 1))
    done
}
net_server() {
    expected=$(net_pattern | md5sum)
    mkfifo /tmp/hold
    nc -l -p NET_PORT < /tmp/hold | md5sum > /tmp/received &
    exec 3>/tmp/hold
    net_up
    echo "LINUX-INIT: waiting for NET_MIB MiB on port NET_PORT"
    wait $!
    exec 3>&-
    received=$(cat /tmp/received)
    [ "$received" = "$expected" ] || fail "received data has md5 $received, expected $expected"
    echo "LINUX-INIT: received NET_MIB MiB over TCP, md5 $received as expected"
}
net_client() {
    net_pattern > /tmp/net-data
    expected=$(net_pattern | md5sum)
    sent=$(md5sum < /tmp/net-data)
    [ "$sent" = "$expected" ] || fail "the data to send has md5 $sent, expected $expected"
    net_up
    n=0
    start=$(now)
    until nc "$peer" NET_PORT < /tmp/net-data 2>/tmp/nc; do
        n=$((n + 1))
        [ $n -lt 30 ] || fail "cannot send to $peer:NET_PORT: $(cat /tmp/nc)"
        sleep 1
        start=$(now)
    done
    end=$(now)
    rm /tmp/net-data
    echo "LINUX-INIT: sent NET_MIB MiB over TCP, md5 $sent"
    echo "BENCH: net_tcp_mib_per_s $(rate NET_MIB "$start" "$end") MiB/s"
}
disk_contents() {
    echo "virtio-blk persistence check"
    seq 1 20000
}
disk_bus() {
    sys=${1:-/sys}
    proc=${2:-/proc}
    device=$(readlink -f "$sys/block/vda/device")
    parent=${device%/*}
    if [ -f "$parent/vendor" ] && [ -f "$parent/device" ]; then
        vendor=$(cat "$parent/vendor")
        id=$(cat "$parent/device")
        vectors=$(ls "$parent/msi_irqs" 2>/dev/null | wc -l)
        if [ "$vectors" -gt 0 ]; then
            irq="MSI ($vectors vectors)"
        else
            line=$(cat "$parent/irq")
            taken=$(awk -v irq="$line:" '$1 == irq { n = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i; print n }' "$proc/interrupts")
            irq="INTx (Linux IRQ $line, interrupts so far: ${taken:-none})"
        fi
        echo "DISK_BUSPCI device ${parent##*/} [${vendor#0x}:${id#0x}], $irq"
    else
        echo "DISK_BUSon ${parent##*/}"
    fi
}
disk_mount() {
    wait_for /dev/vda || fail "no /dev/vda (virtio_blk found no disk)"
    disk_bus
    mkdir -p /mnt/disk
    mount -t ext4 "$@" /dev/vda /mnt/disk 2>/tmp/mount ||
        fail "cannot mount /dev/vda as ext4: $(cat /tmp/mount)"
}
disk_bench() {
    [ "$bench_mib" -gt 0 ] || return 0
    if [ "$(cat /sys/block/vda/ro)" = 0 ]; then
        start=$(now)
        dd if=/dev/zero of=/dev/vda bs=1M count="$bench_mib" seek="$bench_skip_mib" oflag=direct 2>/tmp/dd ||
            fail "timed write of /dev/vda: $(cat /tmp/dd)"
        end=$(now)
        echo "BENCH: blk_seq_write_mib_per_s $(rate "$bench_mib" "$start" "$end") MiB/s"
    fi
    start=$(now)
    dd if=/dev/vda of=/dev/null bs=1M count="$bench_mib" skip="$bench_skip_mib" iflag=direct 2>/tmp/dd ||
        fail "timed read of /dev/vda: $(cat /tmp/dd)"
    end=$(now)
    echo "BENCH: blk_seq_read_mib_per_s $(rate "$bench_mib" "$start" "$end") MiB/s"
}
disk_round_contents() {
    echo "round $1"
    seq 1 20000
}
disk_rounds() {
    [ "$disk_seconds" -gt 0 ] 2>/dev/null || return 0
    read up idle < /proc/uptime
    until_s=$((${up%%.*} + disk_seconds))
    r=0
    while :; do
        r=$((r + 1))
        disk_round_contents $r > /mnt/disk/ROUNDS_PATH.new || fail "round $r: cannot write ROUNDS_PATH.new"
        sync
        mv /mnt/disk/ROUNDS_PATH.new /mnt/disk/ROUNDS_PATH || fail "round $r: cannot rename ROUNDS_PATH.new"
        sync
        echo 3 > /proc/sys/vm/drop_caches
        found=$(md5sum < /mnt/disk/ROUNDS_PATH)
        expected=$(disk_round_contents $r | md5sum)
        [ "$found" = "$expected" ] || fail "round $r: ROUNDS_PATH reads back with md5 $found, expected $expected"
        echo "LINUX-INIT: disk round $r"
        read up idle < /proc/uptime
        [ "${up%%.*}" -lt "$until_s" ] || break
    done
    echo "ROUNDS_DONE$r"
}
disk_write() {
    disk_mount
    mkdir -p "/mnt/disk$(dirname DISK_PATH)" || fail "cannot make a directory on /dev/vda"
    disk_rounds
    disk_contents > /mnt/disk/DISK_PATH || fail "cannot write DISK_PATH on /dev/vda"
    sync
    written=$(md5sum < /mnt/disk/DISK_PATH)
    umount /mnt/disk || fail "cannot unmount /dev/vda"
    echo "LINUX-INIT: wrote DISK_PATH on /dev/vda, md5 $written"
    disk_bench
}
disk_check() {
    disk_mount -o ro
    [ -f /mnt/disk/DISK_PATH ] || fail "/dev/vda has no DISK_PATH"
    found=$(md5sum < /mnt/disk/DISK_PATH)
    expected=$(disk_contents | md5sum)
    umount /mnt/disk
    [ "$found" = "$expected" ] || fail "DISK_PATH has md5 $found, expected $expected"
    echo "LINUX-INIT: DISK_PATH on /dev/vda reads back, md5 $found"
    disk_bench
}
control_round() {
    echo vms >&4
    answered=
    while read -t 5 line <&4; do
        echo "CONTROL ($1): $line"
        case "$line" in
        *error*) fail "an error on /dev/hvc1 ($1): $line" ;;
        *"$expect"*) answered=yes ;;
        esac
    done
    [ -n "$answered" ] || fail "no answer on /dev/hvc1 ($1) holds '$expect'"
}
console_control() {
    wait_for /dev/hvc1 || fail "no /dev/hvc1 (no control console)"
    exec 4<>/dev/hvc1 || fail "cannot open /dev/hvc1"
    # Set the mode on the open descriptor: hvc resets a port's termios at its
    # last close.
    stty raw -echo <&4 || fail "cannot turn off echo on /dev/hvc1"
    control_round raw
    # A terminal in its default mode echoes each answer back to the port.
    stty sane <&4 || fail "cannot set /dev/hvc1 to its default mode"
    control_round echo
    exec 4<&-
}
net_serve_reply() {
    echo "net-serve reply"
    seq 1 20000
}
net_serve() {
    [ "$port" -gt 0 ] 2>/dev/null || fail "net-serve needs hv.port=PORT"
    wait_for /sys/class/net/eth0 || fail "no eth0 (virtio_net found no device)"
    ip link set lo up
    ip link set eth0 up || fail "cannot bring eth0 up"
    cat > /tmp/udhcpc.script <<'SCRIPT'
#!/bin/sh
case "$1" in
deconfig)
    ip addr flush dev "$interface"
    ;;
bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for gateway in $router; do
        ip route add default via "$gateway" dev "$interface" && break
    done
    echo "$ip" > /tmp/dhcp-address
    ;;
esac
SCRIPT
    chmod +x /tmp/udhcpc.script
    udhcpc -i eth0 -n -q -t 10 -s /tmp/udhcpc.script > /tmp/udhcpc 2>&1 ||
        fail "no DHCP lease on eth0: $(tail -n 3 /tmp/udhcpc)"
    [ -s /tmp/dhcp-address ] || fail "udhcpc set no address: $(tail -n 3 /tmp/udhcpc)"
    address=$(cat /tmp/dhcp-address)
    net_serve_reply > /tmp/reply
    (
        n=0
        while :; do
            if ! nc -l -p "$port" < /tmp/reply > /tmp/got 2>/tmp/nc-serve; then
                echo "NET-SERVE: nc -l -p $port failed: $(cat /tmp/nc-serve)"
                sleep 1
                continue
            fi
            n=$((n + 1))
            echo "NET-SERVE: served connection $n, got: $(head -n 1 /tmp/got | tr -cd 'A-Za-z0-9._:-' | head -c 80)"
        done
    ) &
    server=$!
    hex=$(printf '%04X' "$port")
    n=0
    until cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q ":$hex [0-9A-F]*:0000 0A "; do
        n=$((n + 1))
        [ $n -lt 100 ] || fail "nothing listens on port $port 10 s after nc started"
        sleep 0.1
    done
    echo "NET-SERVE: $address ready on port $port ($(wc -c < /tmp/reply) bytes a connection)"
    wait $server
    fail "the server loop on port $port ended"
}
console_bench() {
    [ "$bench_kib" -gt 0 ] 2>/dev/null || fail "console-bench needs hv.bench_kib=N, N > 0 KiB"
    wait_for /dev/hvc0 || fail "no /dev/hvc0 (no virtio-console)"
    [ -c /dev/ttyAMA0 ] || fail "no /dev/ttyAMA0 (no PL011)"
    bytes=$((bench_kib * 1024))
    yes "CONSOLE_LINE" | head -n $((bench_kib * CONSOLE_LINES_PER_KIB)) > /tmp/console-data
    made=$(stat -c %s /tmp/console-data)
    [ "$made" = "$bytes" ] || fail "the console data has $made bytes, expected $bytes"
    echo "LINUX-INIT: writing $bench_kib KiB to /dev/ttyAMA0, then to /dev/hvc0"
    start=$(now)
    cat /tmp/console-data > /dev/ttyAMA0 || fail "cannot write /dev/ttyAMA0"
    end=$(now)
    pl011=$(byte_rate "$bytes" "$start" "$end")
    start=$(now)
    cat /tmp/console-data > /dev/hvc0 || fail "cannot write /dev/hvc0"
    end=$(now)
    virtio=$(byte_rate "$bytes" "$start" "$end")
    rm /tmp/console-data
    echo "BENCH: console_pl011_bytes_per_s $pl011 B/s"
    echo "BENCH: console_virtio_bytes_per_s $virtio B/s"
}
case "$role" in
"") ;;
net-server) net_server ;;
net-client) net_client ;;
disk-write) disk_write ;;
disk-check) disk_check ;;
console-control) console_control ;;
console-bench) console_bench ;;
net-serve) net_serve ;;
*) fail "unknown hv.role=$role (net-server, net-client, disk-write, disk-check, console-control, console-bench, net-serve)" ;;
esac
if [ -n "$role" ]; then
    echo "RESULT: PASS"
    poweroff -f
    exit 0
fi
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
if grep -qw mte /proc/cpuinfo; then echo "LINUX-INIT: {MTE_LINE}"; fi
dmesg | grep -E 'ITS|LPI' | sed 's/^\[[^]]*\] *//; s/^/{KERNEL_GIC_PREFIX}/'
{roles}mkdir -p /mnt/tmpfs
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
                roles = ROLES
                    .replace("NET_MIB", &NET_TRANSFER_MIB.to_string())
                    .replace("NET_PORT", &NET_PORT.to_string())
                    .replace("DISK_PATH", DISK_CHECK_PATH)
                    .replace("ROUNDS_PATH", DISK_ROUNDS_PATH)
                    .replace("ROUNDS_DONE", DISK_ROUNDS_DONE)
                    .replace("DISK_BUS", DISK_BUS_PREFIX)
                    .replace(
                        "CONSOLE_LINES_PER_KIB",
                        &CONSOLE_BENCH_LINES_PER_KIB.to_string()
                    )
                    .replace("CONSOLE_LINE", CONSOLE_BENCH_LINE),
            )
        }
    }
}

/// The initramfs (an uncompressed newc cpio archive) with `busybox`, the
/// `modules` (loaded in the given order) and the `/init` of `init`.
pub fn build(busybox: &[u8], init: Init, modules: &[GuestModule]) -> Vec<u8> {
    let mut entries: Vec<FileEntry> = DIRECTORIES
        .iter()
        .map(|d| FileEntry::directory(d))
        .collect();
    if !modules.is_empty() {
        entries.push(FileEntry::directory("lib"));
        entries.push(FileEntry::directory("lib/modules"));
        let mut order = String::new();
        for module in modules {
            entries.push(FileEntry::file(
                &format!("lib/modules/{}.ko", module.name),
                module.bytes.clone(),
            ));
            order.push_str(&module.name);
            order.push('\n');
        }
        entries.push(FileEntry::file(
            "lib/modules/load-order",
            order.into_bytes(),
        ));
    }
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
        let archive = build(
            b"\x7fELF busybox",
            Init::Test { cpus: 2 },
            &[GuestModule {
                name: "virtio_mmio".into(),
                bytes: b"\x7fELF ko".to_vec(),
            }],
        );
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
        let pass = script.rfind("echo \"RESULT: PASS\"").unwrap();
        assert!(marker < script.find("md5sum").unwrap());
        assert!(pass > script.rfind("fail \"").unwrap());
        assert!(script.trim_end().ends_with("poweroff -f"));
        assert!(init_script(Init::Test { cpus: 1 }).contains(r#"[ "$online" = "0" ]"#));
    }

    #[test]
    fn init_scripts_are_valid_shell() {
        for init in [Init::Shell, Init::Test { cpus: 2 }] {
            let script = init_script(init);
            let path = std::env::temp_dir().join(format!(
                "init-script-{}-{}",
                std::process::id(),
                matches!(init, Init::Shell)
            ));
            std::fs::write(&path, &script).unwrap();
            let check = std::process::Command::new("sh")
                .arg("-n")
                .arg(&path)
                .output()
                .unwrap();
            std::fs::remove_file(&path).unwrap();
            assert!(
                check.status.success(),
                "{}\n{script}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }

    #[test]
    fn the_disk_roles_say_which_bus_vda_is_on() {
        let script = init_script(Init::Test { cpus: 1 });
        let start = script.find("disk_bus() {").unwrap();
        let function = &script[start..start + script[start..].find("\n}\n").unwrap() + 3];
        assert!(!function.contains("DISK_BUS"), "{function}");
        let root = std::env::temp_dir().join(format!("disk-bus-{}", std::process::id()));
        let bus = |sys: &std::path::Path| {
            let output = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{function}disk_bus \"$1\" \"$1/proc\""))
                .arg("sh")
                .arg(sys)
                .output()
                .unwrap();
            assert!(output.status.success(), "{output:?}");
            String::from_utf8(output.stdout).unwrap()
        };
        let sysfs = |name: &str, function: &str| {
            let sys = root.join(name);
            let device = sys.join(function);
            std::fs::create_dir_all(device.join("virtio1/block")).unwrap();
            std::fs::create_dir_all(sys.join("block/vda")).unwrap();
            std::os::unix::fs::symlink(
                format!("../../{function}/virtio1"),
                sys.join("block/vda/device"),
            )
            .unwrap();
            (sys, device)
        };
        let (sys, device) = sysfs("pci", "devices/pci0000:00/0000:00:01.0");
        for (file, text) in [
            ("vendor", "0x1af4\n"),
            ("device", "0x1001\n"),
            ("irq", "44\n"),
        ] {
            std::fs::write(device.join(file), text).unwrap();
        }
        std::fs::create_dir(sys.join("proc")).unwrap();
        std::fs::write(
            sys.join("proc/interrupts"),
            "           CPU0       CPU1\n\
             \x20 11:       2279       2209     GICv3  27 Level     arch_timer\n\
             \x20 44:         30          6     GICv3  36 Level     virtio0\n\
             \x20444:          1          1     GICv3  37 Level     other\n",
        )
        .unwrap();
        // Linux makes `msi_irqs` when the driver tries MSI; it stays empty
        // when there is no MSI controller.
        std::fs::create_dir(device.join("msi_irqs")).unwrap();
        assert_eq!(
            bus(&sys),
            format!(
                "{DISK_BUS_PREFIX}PCI device 0000:00:01.0 [1af4:1001], INTx (Linux IRQ 44, \
                 interrupts so far: 36)\n"
            )
        );
        std::fs::write(sys.join("proc/interrupts"), "           CPU0\n").unwrap();
        assert!(bus(&sys).ends_with("INTx (Linux IRQ 44, interrupts so far: none)\n"));
        for vector in ["45", "46"] {
            std::fs::write(device.join("msi_irqs").join(vector), "msix\n").unwrap();
        }
        assert_eq!(
            bus(&sys),
            format!("{DISK_BUS_PREFIX}PCI device 0000:00:01.0 [1af4:1001], MSI (2 vectors)\n")
        );
        let (sys, _) = sysfs("mmio", "devices/platform/a003e00.virtio_mmio");
        assert_eq!(
            bus(&sys),
            format!("{DISK_BUS_PREFIX}on a003e00.virtio_mmio\n")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_last_rounds_done_line_counts() {
        let console = format!(
            "[src] LINUX-INIT: disk round 1\n[src] {DISK_ROUNDS_DONE}7\n\
             [dst] {DISK_ROUNDS_DONE}12\n[dst] RESULT: PASS\n"
        );
        assert_eq!(disk_rounds_done(&console), Some(12));
        assert_eq!(disk_rounds_done("[a] LINUX-INIT: disk round 1\n"), None);
        assert!(disk_rounds_contents(3).starts_with("round 3\n1\n2\n"));
        assert!(disk_rounds_contents(3).ends_with("\n20000\n"));
    }

    #[test]
    fn roles_are_command_line_words_the_test_init_reads() {
        let script = init_script(Init::Test { cpus: 1 });
        for role in [
            Role::NetServer {
                ip: "10.0.0.1".into(),
                peer: "10.0.0.2".into(),
            },
            Role::NetClient {
                ip: "10.0.0.2".into(),
                peer: "10.0.0.1".into(),
            },
            Role::DiskWrite {
                bench_mib: 64,
                bench_skip_mib: 32,
                rewrite_seconds: 90,
            },
            Role::DiskCheck {
                bench_mib: 0,
                bench_skip_mib: 0,
            },
            Role::ConsoleControl {
                expect: "vm0".into(),
            },
            Role::ConsoleBench { kib: 64 },
            Role::NetServe { port: 8080 },
        ] {
            let words = role.cmdline_words();
            let name = words
                .strip_prefix("hv.role=")
                .and_then(|rest| rest.split(' ').next())
                .unwrap();
            assert!(
                script.contains(&format!("\n{name}) ")),
                "{name} has no case"
            );
            for word in words.split(' ') {
                let key = word.split('=').next().unwrap();
                assert!(script.contains(&format!("{key}=*)")), "{key} is not read");
            }
        }
        assert_eq!(
            Role::NetServer {
                ip: "10.0.0.1".into(),
                peer: "10.0.0.2".into()
            }
            .cmdline_words(),
            "hv.role=net-server hv.ip=10.0.0.1 hv.peer=10.0.0.2"
        );
        assert!(script.contains("nc -l -p 5000 < /tmp/hold"));
        assert!(script.contains(DISK_CHECK_PATH));
        assert!(!script.contains("NET_MIB") && !script.contains("DISK_PATH"));
        assert!(!script.contains("ROUNDS_PATH") && !script.contains("ROUNDS_DONE"));
        assert!(script.contains(&format!("echo \"{DISK_ROUNDS_DONE}$r\"")));
        assert!(!script.contains("CONSOLE_LINE"));
        assert_eq!(
            Role::ConsoleBench { kib: 64 }.cmdline_words(),
            "hv.role=console-bench hv.bench_kib=64"
        );
    }

    #[test]
    fn net_serve_leases_an_address_and_serves_its_reply_on_the_port() {
        let role = Role::NetServe { port: 8080 };
        assert_eq!(role.cmdline_words(), "hv.role=net-serve hv.port=8080");
        assert!(!role.reports_result());
        assert!(Role::ConsoleBench { kib: 1 }.reports_result());
        let script = init_script(Init::Test { cpus: 1 });
        assert!(script.contains("udhcpc -i eth0 -n -q -t 10 -s /tmp/udhcpc.script"));
        assert!(script.contains(r#"ip addr add "$ip/${mask:-24}" dev "$interface""#));
        assert!(script.contains(r#"nc -l -p "$port" < /tmp/reply"#));
        assert!(script.contains(&format!("echo \"{NET_SERVE_PREFIX}$address ready on port")));
        assert!(script.contains(&format!(
            "echo \"{NET_SERVE_PREFIX}served connection $n, got: "
        )));
        let serve = script.find("net_serve() {").unwrap();
        let body = &script[serve..script[serve..].find("\n}\n").unwrap() + serve];
        assert!(
            !body.contains("RESULT: PASS"),
            "it serves until powered off"
        );
        let reply = net_serve_reply();
        assert!(reply.starts_with("net-serve reply\n1\n2\n"));
        assert!(reply.ends_with("\n19999\n20000\n"));
        assert_eq!(reply.len(), 108_910);
    }

    #[test]
    fn the_console_bench_line_is_printable_and_a_kib_is_whole_lines() {
        assert_eq!(
            (CONSOLE_BENCH_LINE.len() + 1) * CONSOLE_BENCH_LINES_PER_KIB as usize,
            1024
        );
        assert!(
            CONSOLE_BENCH_LINE
                .bytes()
                .all(|b| b.is_ascii_graphic() || b == b' ')
        );
        let script = init_script(Init::Test { cpus: 2 });
        assert!(script.contains(&format!(
            "yes \"{CONSOLE_BENCH_LINE}\" | head -n $((bench_kib * 16))"
        )));
        assert!(script.contains("cat /tmp/console-data > /dev/ttyAMA0"));
        assert!(script.contains("cat /tmp/console-data > /dev/hvc0"));
    }

    #[test]
    fn modules_are_carried_and_loaded_in_order() {
        let modules = ["failover", "net_failover", "virtio_net"].map(|name| GuestModule {
            name: name.into(),
            bytes: name.as_bytes().to_vec(),
        });
        let archive = build(b"busybox", Init::Shell, &modules);
        let entries: Vec<cpio::Entry> = cpio::entries(&archive).collect::<Result<_, _>>().unwrap();
        let data = |name: &str| {
            entries
                .iter()
                .find(|e| e.name == name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .data
        };
        assert_eq!(data("lib/modules/net_failover.ko"), b"net_failover");
        assert_eq!(
            data("lib/modules/load-order"),
            b"failover\nnet_failover\nvirtio_net\n"
        );
        let script = init_script(Init::Shell);
        assert!(script.contains("insmod \"/lib/modules/$module.ko\""));
        assert!(script.contains("done < /lib/modules/load-order"));
        let without = build(b"busybox", Init::Shell, &[]);
        assert!(
            cpio::entries(&without).all(|e| !e.unwrap().name.starts_with("lib")),
            "no modules, no lib/"
        );
    }

    #[test]
    fn disk_contents_and_bench_lines() {
        let text = disk_check_contents();
        assert!(text.starts_with("virtio-blk persistence check\n1\n2\n"));
        assert!(text.ends_with("\n19999\n20000\n"));
        let console = "x\n[a] BENCH: blk_seq_read_mib_per_s 123.5 MiB/s\nBENCH: net_ping_us 250 us\nBENCH: broken\n";
        assert_eq!(
            bench_figures(console),
            [
                (
                    "blk_seq_read_mib_per_s".to_string(),
                    123.5,
                    "MiB/s".to_string()
                ),
                ("net_ping_us".to_string(), 250.0, "us".to_string())
            ]
        );
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
