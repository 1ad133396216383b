//! `--vm SPEC`: one VM of a run with several VMs in one boot payload.
//!
//! A spec is comma-separated items, e.g.
//! `guest=memory,cpus=0-1,mem=256`, `linux,cpus=2-3,mem=512` or
//! `kernel=PATH,cpus=4,name=x,control=1` ([`VmSpec::parse`]):
//!
//! | item | meaning |
//! |---|---|
//! | `SCENARIO` or `guest=SCENARIO` | the test guest running this scenario |
//! | `args=WORDS` | more test guest bootargs (as `--guest-args`); for `linux` and `linux-shell`, words added to the default kernel command line (a role of the test init: [`crate::initramfs::Role::cmdline_words`]) |
//! | `linux` | Debian's kernel with the unattended check initramfs (prints a `RESULT:` line) |
//! | `linux-shell` | Debian's kernel with the busybox shell (no result; `expect=running`) |
//! | `kernel=PATH` | this kernel (arm64 Image, or gzip-compressed); `expect=running` |
//! | `initrd=PATH` | this initrd, with `linux` or `kernel=` |
//! | `cmdline=TEXT` | the kernel command line; must come last and takes the rest of the spec, commas included |
//! | `cpus=LIST` | the physical CPUs that run its vCPUs, one vCPU each (`0-1`, `2,3`); required beside other VMs |
//! | `mem=MIB` | its RAM (default: the hypervisor's 128 MiB; 512 for `linux`) |
//! | `name=NAME` | its name (default `vm<i>`, `i` its place among the `--vm`s) |
//! | `control=0\|1` | whether it may use the hypervisor's control interface |
//! | `start=0\|1` | `0`: the VM does not boot; it waits as the destination of a live migration |
//! | `net=NAME` | its virtio-net is on the hypervisor's network (switch) NAME, a name by the rules of VM names; VMs with the same NAME share one Ethernet segment (`net=` in its `vm.conf`) |
//! | `mac=52:54:00:xx:xx:xx` | its virtio-net's MAC (default: derived from its name, [`boot_payload::vmconf::default_mac`]) |
//! | `disk=PATH[:ro]` | a raw image file as its virtio-blk: the runner gives QEMU the file as the machine's next virtio-mmio disk (`-drive file=PATH,if=none,format=raw,id=diskN[,readonly=on] -device virtio-blk-device,drive=diskN`, disks numbered from 0 in the order of the `--vm`s) and writes `disk=N[:ro]` to its `vm.conf`; the file must exist |
//! | `device=PATH` | a node of the host's device tree the VM owns (passthrough), by its full path, e.g. `/virtio_mmio@a003e00`: the hypervisor gives the VM the node's register window and interrupt and copies the node into the VM's device tree (`device=PATH` in its `vm.conf`); repeatable |
//! | `ram=identity` | its RAM at the guest-physical addresses equal to the host-physical ones of its frames (`ram=identity` in its `vm.conf`), which a passed device that does DMA needs |
//! | `pass-disk=PATH[:ro]` | a raw image file as a virtio-blk the VM owns: the runner gives QEMU the file as a virtio-mmio disk after the host disks (`-drive file=PATH,if=none,format=raw,id=pdiskN[,readonly=on] -device virtio-blk-device,drive=pdiskN`, `N` counting the `pass-disk=`s of every `--vm` from 0) and writes `device=` with the node of the transport it lands on and `ram=identity` to its `vm.conf`; the file must exist; repeatable |
//! | `pass-net=PORT` | a virtio-net the VM owns, on QEMU's user-mode network (restricted: nothing leaves QEMU) with TCP `127.0.0.1:PORT` on the host forwarded to the guest's port PORT (`-netdev user,id=pnetN,restrict=on,hostfwd=tcp:127.0.0.1:PORT-:PORT -device virtio-net-device,netdev=pnetN`), DHCP giving the guest 10.0.2.15; `device=` and `ram=identity` in its `vm.conf` as for `pass-disk=`; repeatable |
//! | `pass-pcie=PATH[:ro]` | a raw image file as a virtio-blk PCI function on QEMU's PCIe host bridge, the VM owning the whole bridge: the runner gives QEMU `-drive file=PATH,if=none,format=raw,id=ppciN[,readonly=on] -device virtio-blk-pci,drive=ppciN` (`N` counting the `pass-pcie=`s from 0; no option ROM) and writes `device=/pcie@10000000` (once) and `ram=identity` to its `vm.conf`; the VM's Linux enumerates the bus itself; only one VM may have `pass-pcie=` (the bridge is one node); it takes no virtio-mmio transport; the file must exist; repeatable |
//! | `mte=on` | the guest may use memory tagging (`mte=on` in its `vm.conf`); the host must have it: run with `--mte` (QEMU's `-machine virt,mte=on`, `-cpu max`), or the hypervisor refuses the VM |
//! | `console=virtio\|pl011` | `virtio`: it also gets a virtio-console, and a `linux` guest without `cmdline=` boots with `console=hvc0` (its init moves there); a `control=1` VM gets a second one wired to the monitor (`/dev/hvc1`) |
//! | `expect=pass\|stopped\|running` | what the run expects of it: its `RESULT: PASS` (default for guests that print one), to be stopped by the hypervisor (a bad guest), or to run without a verdict |
//!
//! A CPU list's own commas are read as part of `cpus=`: `cpus=2,3,mem=64`
//! is CPUs 2 and 3. Each item may come once, but `device=`, `pass-disk=`,
//! `pass-net=` and `pass-pcie=`, which together may name at most
//! [`boot_payload::vmconf::MAX_DEVICES`] device-tree nodes (every
//! `pass-pcie=` is the one bridge node); exactly one guest item.
//!
//! The `pass-disk=` and `pass-net=` devices of every `--vm`, in the order
//! of the `--vm`s and of the items, come on QEMU's command line after the
//! host disks (`disk=`), and QEMU plugs each `-device virtio-*-device` into
//! the highest free virtio-mmio transport: the `k`-th virtio device of the
//! command line lands on `/virtio_mmio@<0xa000000 + (31 - k) * 0x200>`
//! ([`crate::qemu::virtio_mmio_node`], [`crate::passed_devices`]). The
//! `pass-pcie=` devices come among them in the same order but take no
//! transport: QEMU plugs each into the next free slot of the PCIe root bus
//! (`0000:00:01.0` the first; slot 0 is the host bridge itself).

use std::fmt;
use std::path::PathBuf;

use boot_payload::cpuset::CpuSet;
use boot_payload::vmconf::{ConsoleKind, DevicePath, MAX_DEVICES, RamPlacement, parse_mac};
use boot_payload::vmname::VmName;

use crate::Scenario;
use crate::linux::{BusyboxInit, InitrdSource, KernelSource, LinuxBoot, default_cmdline};
use crate::qemu::{HostDisk, PCIE_HOST_BRIDGE_NODE, PassedDevice};

/// What a VM runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmGuest {
    /// The test guest.
    Test {
        /// Its scenario.
        scenario: Scenario,
        /// More bootargs after `test=<scenario>`.
        args: String,
    },
    /// A Linux kernel.
    Linux(LinuxBoot),
}

/// What a run expects of one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmExpect {
    /// Its `RESULT: PASS`, and no stop by the hypervisor.
    Pass,
    /// The hypervisor stops it (its `stopping the VM` line).
    Stopped,
    /// Nothing: it runs without a verdict; it must not fail or be stopped.
    Running,
}

impl VmExpect {
    /// The name in a spec (`expect=`).
    pub fn name(self) -> &'static str {
        match self {
            VmExpect::Pass => "pass",
            VmExpect::Stopped => "stopped",
            VmExpect::Running => "running",
        }
    }
}

/// One VM of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// Its name (a valid [`VmName`]).
    pub name: String,
    /// What it runs.
    pub guest: VmGuest,
    /// The physical CPUs of its vCPUs (`None`: every CPU; one VM only).
    pub cpus: Option<CpuSet>,
    /// Its RAM in MiB (`None`: the default).
    pub mem_mib: Option<u32>,
    /// Whether it may use the control interface.
    pub control: bool,
    /// Whether it boots (`false`: it waits as a migration destination).
    pub start: bool,
    /// What the run expects of it.
    pub expect: VmExpect,
    /// The network of its virtio-net (a valid [`VmName`]); `None`: none.
    pub net: Option<String>,
    /// Its virtio-net's MAC; `None`: derived from its name.
    pub mac: Option<[u8; 6]>,
    /// The image file of its virtio-blk; `None`: none.
    pub disk: Option<HostDisk>,
    /// Its console; `None`: the PL011 only.
    pub console: Option<ConsoleKind>,
    /// The host device-tree nodes it owns by path (`device=`), in order.
    pub devices: Vec<DevicePath>,
    /// Where its RAM sits (`ram=`); `None`: the hypervisor's default, or
    /// [`RamPlacement::Identity`] when it has passed devices.
    pub ram: Option<RamPlacement>,
    /// The devices QEMU serves for it to own (`pass-disk=`, `pass-net=`),
    /// in order.
    pub passed: Vec<PassedDevice>,
    /// The guest may use memory tagging (`mte=on`).
    pub mte: bool,
}

/// Why a `--vm` spec was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpecError {
    /// The spec.
    pub spec: String,
    /// What is wrong.
    pub why: String,
}

impl fmt::Display for VmSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--vm {}: {}", self.spec, self.why)
    }
}

impl std::error::Error for VmSpecError {}

/// RAM of a `linux` VM when its spec does not say, in MiB.
pub const LINUX_VM_MEM_MIB: u32 = crate::LINUX_GUEST_MEM_MIB;
/// RAM of a test guest VM when its spec does not say (the hypervisor's
/// default), in MiB.
pub const TEST_VM_MEM_MIB: u32 = boot_payload::vmconf::DEFAULT_MEM_MIB as u32;

impl VmSpec {
    /// Reads the spec `text` of the `index`-th `--vm` (see the module doc).
    pub fn parse(text: &str, index: usize) -> Result<VmSpec, VmSpecError> {
        let fail = |why: String| VmSpecError {
            spec: text.to_string(),
            why,
        };
        let mut items: Vec<(String, Option<String>)> = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let (item, after) = match rest.split_once(',') {
                Some((item, after)) => (item, after),
                None => (rest, ""),
            };
            if let Some(cmdline) = item.strip_prefix("cmdline=") {
                let whole = if after.is_empty() && !rest.contains(',') {
                    cmdline.to_string()
                } else {
                    format!("{cmdline},{after}")
                };
                items.push(("cmdline".into(), Some(whole)));
                break;
            }
            rest = after;
            let continues_cpus = !item.contains('=')
                && !item.is_empty()
                && item.chars().all(|c| c.is_ascii_digit() || c == '-')
                && items.last().is_some_and(|(key, _)| key == "cpus");
            if continues_cpus {
                if let Some((_, Some(list))) = items.last_mut() {
                    list.push(',');
                    list.push_str(item);
                }
                continue;
            }
            match item.split_once('=') {
                Some((key, value)) => items.push((key.to_string(), Some(value.to_string()))),
                None => items.push((item.to_string(), None)),
            }
        }
        if items.is_empty() {
            return Err(fail("an empty spec; a VM needs at least its guest".into()));
        }
        let mut seen: Vec<&str> = Vec::new();
        let mut guest_items = 0;
        let (mut scenario, mut args, mut linux, mut kernel, mut initrd, mut cmdline) =
            (None, None, None, None, None, None);
        let (mut cpus, mut mem_mib, mut name, mut control, mut expect) =
            (None, None, None, false, None);
        let mut start = true;
        let (mut net, mut mac, mut disk, mut console) = (None, None, None, None);
        let (mut devices, mut ram, mut passed) = (Vec::new(), None, Vec::new());
        let mut mte = false;
        for (key, value) in &items {
            let key = key.as_str();
            let slot = match (key, value) {
                (_, None) => "guest",
                ("guest" | "kernel", Some(_)) => "guest",
                (key, Some(_)) => key,
            };
            let repeatable = matches!(slot, "device" | "pass-disk" | "pass-net" | "pass-pcie");
            if !repeatable && seen.contains(&slot) {
                return Err(fail(match slot {
                    "guest" => {
                        "more than one guest (a scenario, linux, linux-shell or kernel=)".into()
                    }
                    key => format!("`{key}=` is given twice"),
                }));
            }
            seen.push(slot);
            let value = value.as_deref();
            match (key, value) {
                ("linux", None) => linux = Some(BusyboxInit::Test),
                ("linux-shell", None) => linux = Some(BusyboxInit::Shell),
                ("guest", Some(word)) | (word, None) => {
                    scenario = Some(Scenario::from_name(word).ok_or_else(|| {
                        fail(format!(
                            "unknown guest `{word}` (linux, linux-shell, kernel=PATH, or a \
                             scenario: {})",
                            crate::scenario_names()
                        ))
                    })?)
                }
                ("args", Some(words)) => args = Some(words.to_string()),
                ("kernel", Some(path)) => kernel = Some(PathBuf::from(path)),
                ("initrd", Some(path)) => initrd = Some(PathBuf::from(path)),
                ("cmdline", Some(line)) => cmdline = Some(line.to_string()),
                ("cpus", Some(list)) => {
                    cpus = Some(
                        CpuSet::parse(list)
                            .map_err(|error| fail(format!("cpus={list}: {error}")))?,
                    )
                }
                ("mem", Some(mib)) => {
                    mem_mib = Some(
                        mib.parse::<u32>()
                            .ok()
                            .filter(|m| *m > 0)
                            .ok_or_else(|| fail(format!("mem={mib}: a positive number of MiB")))?,
                    )
                }
                ("name", Some(text)) => {
                    VmName::new(text).map_err(|error| fail(format!("name={text}: {error}")))?;
                    name = Some(text.to_string());
                }
                ("control", Some(flag)) => {
                    control = match flag {
                        "0" => false,
                        "1" => true,
                        _ => return Err(fail(format!("control={flag}: 0 or 1"))),
                    }
                }
                ("start", Some(flag)) => {
                    start = match flag {
                        "0" => false,
                        "1" => true,
                        _ => return Err(fail(format!("start={flag}: 0 or 1"))),
                    }
                }
                ("net", Some(network)) => {
                    VmName::new(network).map_err(|error| {
                        fail(format!(
                            "net={network}: {error} (networks are named as VMs are)"
                        ))
                    })?;
                    net = Some(network.to_string());
                }
                ("mac", Some(text)) => {
                    mac = Some(parse_mac(text).ok_or_else(|| {
                        fail(format!(
                            "mac={text}: six hex bytes of a unicast address, like \
                             52:54:00:12:34:56"
                        ))
                    })?)
                }
                ("disk", Some(text)) => {
                    disk = Some(HostDisk::parse(text).map_err(|why| fail(format!("disk={why}")))?)
                }
                ("device", Some(path)) => devices.push(
                    DevicePath::new(path).map_err(|why| fail(format!("device={path}: {why}")))?,
                ),
                ("ram", Some(placement)) => {
                    ram = Some(match placement {
                        "identity" => RamPlacement::Identity,
                        _ => {
                            return Err(fail(format!(
                                "ram={placement}: identity (RAM at guest-physical addresses \
                                 equal to the host-physical ones; without ram= it sits at \
                                 0x40000000)"
                            )));
                        }
                    })
                }
                ("mte", Some(value)) => {
                    mte = match value {
                        "on" => true,
                        "off" => false,
                        _ => {
                            return Err(fail(format!(
                                "mte={value}: on (the guest may use memory tagging; run with \
                                 --mte) or off"
                            )));
                        }
                    }
                }
                ("pass-disk", Some(text)) => passed.push(PassedDevice::Disk(
                    HostDisk::parse(text).map_err(|why| fail(format!("pass-disk={why}")))?,
                )),
                ("pass-pcie", Some(text)) => passed.push(PassedDevice::PcieDisk(
                    HostDisk::parse(text).map_err(|why| fail(format!("pass-pcie={why}")))?,
                )),
                ("pass-net", Some(text)) => passed.push(PassedDevice::Net {
                    port: PassedDevice::parse_port(text)
                        .map_err(|why| fail(format!("pass-net={why}")))?,
                }),
                ("console", Some(kind)) => {
                    console = Some(match kind {
                        "virtio" => ConsoleKind::Virtio,
                        "pl011" => ConsoleKind::Pl011,
                        _ => return Err(fail(format!("console={kind}: virtio or pl011"))),
                    })
                }
                ("expect", Some(what)) => {
                    expect = Some(
                        [VmExpect::Pass, VmExpect::Stopped, VmExpect::Running]
                            .into_iter()
                            .find(|e| e.name() == what)
                            .ok_or_else(|| {
                                fail(format!("expect={what}: pass, stopped or running"))
                            })?,
                    )
                }
                (key, Some(_)) => {
                    return Err(fail(format!(
                        "unknown key `{key}=` (guest, args, kernel, initrd, cmdline, cpus, mem, \
                         name, control, start, net, mac, disk, console, device, ram, mte, \
                         pass-disk, pass-net, pass-pcie, expect)"
                    )));
                }
            }
            if slot == "guest" {
                guest_items += 1;
            }
        }
        let guest = match (scenario, linux, kernel) {
            (Some(scenario), None, None) => {
                if initrd.is_some() || cmdline.is_some() {
                    return Err(fail(
                        "initrd= and cmdline= are for linux or kernel=; the test guest takes \
                         args="
                            .into(),
                    ));
                }
                VmGuest::Test {
                    scenario,
                    args: args.unwrap_or_default(),
                }
            }
            (None, linux, kernel) if guest_items == 1 => {
                if args.is_some() && (linux.is_none() || cmdline.is_some()) {
                    return Err(fail(
                        "args= adds to the default command line of linux or linux-shell; with \
                         kernel= or cmdline=, write the whole line in cmdline="
                            .into(),
                    ));
                }
                let init = linux.unwrap_or(BusyboxInit::Shell);
                if init == BusyboxInit::Test && initrd.is_some() {
                    return Err(fail(
                        "linux builds its own initramfs (the unattended check); it takes no \
                         initrd="
                            .into(),
                    ));
                }
                let initrd = match (initrd, linux) {
                    (Some(path), _) => InitrdSource::File(path),
                    (None, Some(init)) => InitrdSource::Busybox(init),
                    (None, None) => InitrdSource::None,
                };
                let console_words = if console == Some(ConsoleKind::Virtio) {
                    " console=hvc0"
                } else {
                    ""
                };
                let cmdline = match (cmdline, args) {
                    (Some(line), _) => Some(line),
                    (None, None) if console_words.is_empty() => None,
                    (None, args) => Some(format!(
                        "{}{console_words}{}",
                        default_cmdline(&initrd),
                        args.map(|args| format!(" {}", args.trim()))
                            .unwrap_or_default()
                    )),
                };
                VmGuest::Linux(LinuxBoot {
                    kernel: kernel.map_or(KernelSource::Debian, KernelSource::File),
                    initrd,
                    cmdline,
                })
            }
            _ => {
                return Err(fail(
                    "a VM needs one guest: a scenario (or guest=), linux, linux-shell or \
                     kernel=PATH"
                        .into(),
                ));
            }
        };
        let owns_bridge = passed.iter().any(|device| !device.on_virtio_mmio())
            && !devices
                .iter()
                .any(|path| path.as_str() == PCIE_HOST_BRIDGE_NODE);
        let nodes = devices.len()
            + passed
                .iter()
                .filter(|device| device.on_virtio_mmio())
                .count()
            + usize::from(owns_bridge);
        if nodes > MAX_DEVICES {
            return Err(fail(format!(
                "{nodes} device-tree nodes (device=, pass-disk=, pass-net=, pass-pcie=): a VM \
                 owns at most {MAX_DEVICES}"
            )));
        }
        let reports_result = match &guest {
            VmGuest::Test { scenario, .. } => scenario.reports_result(),
            VmGuest::Linux(linux) => linux.reports_result(),
        };
        let expect = expect.unwrap_or(if reports_result {
            VmExpect::Pass
        } else {
            VmExpect::Running
        });
        if expect == VmExpect::Pass && !reports_result {
            return Err(fail(
                "expect=pass: this guest prints no RESULT line (expect=running or stopped)".into(),
            ));
        }
        Ok(VmSpec {
            name: name.unwrap_or_else(|| format!("vm{index}")),
            guest,
            cpus,
            mem_mib,
            control,
            start,
            expect,
            net,
            mac,
            disk,
            console,
            devices,
            ram,
            passed,
            mte,
        })
    }

    /// Its RAM in MiB, with the default filled in.
    pub fn mem_mib_or_default(&self) -> u32 {
        self.mem_mib.unwrap_or(match self.guest {
            VmGuest::Test { .. } => TEST_VM_MEM_MIB,
            VmGuest::Linux(_) => LINUX_VM_MEM_MIB,
        })
    }

    /// Its `ram=` for `vm.conf`: as given, else
    /// [`RamPlacement::Identity`] when QEMU serves it passed devices (their
    /// DMA goes to the addresses its driver gives them, which must then be
    /// the host's).
    pub fn ram_placement(&self) -> Option<RamPlacement> {
        self.ram
            .or((!self.passed.is_empty()).then_some(RamPlacement::Identity))
    }

    /// The test guest's command line (`None` for Linux).
    pub fn test_cmdline(&self) -> Option<String> {
        match &self.guest {
            VmGuest::Test { scenario, args } => {
                let base = crate::guest_cmdline(*scenario, crate::Boot::Hypervisor);
                Some(match args.trim() {
                    "" => base,
                    args => format!("{base} {args}"),
                })
            }
            VmGuest::Linux(_) => None,
        }
    }
}

/// The `-smp` a run of `vms` needs when none is given: the highest CPU a VM
/// names plus one (CPUs from 0 up), plus one CPU no VM names (the
/// hypervisor's own) when `spare_cpu`. A VM without a CPU list counts as
/// one CPU.
pub fn default_smp(vms: &[VmSpec], spare_cpu: bool) -> u32 {
    let highest = vms
        .iter()
        .map(|vm| vm.cpus.map_or(0, |cpus| cpus.highest()))
        .max()
        .unwrap_or(0);
    highest + 1 + u32::from(spare_cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> VmSpec {
        VmSpec::parse(text, 1).unwrap_or_else(|error| panic!("{error}"))
    }

    fn why(text: &str) -> String {
        VmSpec::parse(text, 0).expect_err(text).to_string()
    }

    #[test]
    fn specs_parse() {
        let memory = spec("guest=memory,cpus=0-1,mem=256");
        assert_eq!(memory.name, "vm1");
        assert_eq!(
            memory.guest,
            VmGuest::Test {
                scenario: Scenario::Memory,
                args: String::new()
            }
        );
        assert_eq!(memory.cpus, CpuSet::from_mask(0b11));
        assert_eq!((memory.mem_mib, memory.expect), (Some(256), VmExpect::Pass));
        assert_eq!(memory.test_cmdline().unwrap(), "test=memory");
        let linux = spec("linux,cpus=2,3,mem=512");
        assert_eq!(
            linux.guest,
            VmGuest::Linux(LinuxBoot::debian(BusyboxInit::Test))
        );
        assert_eq!(linux.cpus, CpuSet::from_mask(0b1100));
        assert_eq!(linux.expect, VmExpect::Pass);
        let files = spec("kernel=/k/Image,cpus=4,name=x,control=1,cmdline=console=ttyAMA0,a=b");
        assert_eq!(files.name, "x");
        assert!(files.control);
        assert_eq!(files.expect, VmExpect::Running);
        assert_eq!(
            files.guest,
            VmGuest::Linux(LinuxBoot {
                kernel: KernelSource::File("/k/Image".into()),
                initrd: InitrdSource::None,
                cmdline: Some("console=ttyAMA0,a=b".into()),
            })
        );
        let bad = spec("bad-guest,cpus=5,expect=stopped,args=x=1 y");
        assert_eq!(bad.expect, VmExpect::Stopped);
        assert_eq!(bad.test_cmdline().unwrap(), "test=bad-guest x=1 y");
        assert_eq!(spec("linux-shell").expect, VmExpect::Running);
        assert_eq!(spec("linux").mem_mib_or_default(), 512);
        assert_eq!(spec("memory").mem_mib_or_default(), 128);
        assert_eq!(spec("memory").cpus, None);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("cpus=0", "one guest"),
            ("memory,linux", "more than one guest"),
            ("guest=memory,kernel=/k", "more than one guest"),
            ("nope", "unknown guest"),
            ("memory,cpus=0,cpus=1", "given twice"),
            ("memory,cpus=1-0", "backwards"),
            ("memory,cpus=0,0", "twice"),
            ("memory,mem=0", "positive"),
            ("memory,name=a b", "name="),
            ("memory,name=hv", "taken"),
            ("memory,control=2", "0 or 1"),
            ("memory,start=yes", "0 or 1"),
            ("memory,expect=maybe", "pass, stopped or running"),
            ("memory,colour=red", "unknown key"),
            ("memory,initrd=/r", "test guest"),
            ("kernel=/k,args=x", "args="),
            ("linux,args=x,cmdline=y", "args="),
            ("memory,net=a b", "net=a b"),
            ("memory,net=lan,net=wan", "given twice"),
            ("memory,mac=01:00:5e:00:00:01", "unicast"),
            ("memory,mac=52:54", "six hex bytes"),
            ("memory,disk=", "PATH or PATH:ro"),
            ("memory,disk=:ro", "PATH or PATH:ro"),
            ("memory,console=hvc0", "virtio or pl011"),
            ("linux,initrd=/r", "its own initramfs"),
            ("kernel=/k,expect=pass", "no RESULT"),
        ] {
            let why = why(text);
            assert!(why.contains(says), "{text}: {why}");
            assert!(why.starts_with(&format!("--vm {text}:")), "{why}");
        }
    }

    #[test]
    fn device_items_parse() {
        let vm = spec("linux,name=a,net=lan,mac=52:54:00:0A:0b:0c,disk=/d/a.img:ro,console=virtio");
        assert_eq!(vm.net.as_deref(), Some("lan"));
        assert_eq!(vm.mac, Some([0x52, 0x54, 0, 0x0a, 0x0b, 0x0c]));
        assert_eq!(
            vm.disk,
            Some(HostDisk {
                path: "/d/a.img".into(),
                read_only: true
            })
        );
        assert_eq!(vm.console, Some(ConsoleKind::Virtio));
        let VmGuest::Linux(linux) = &vm.guest else {
            panic!("{vm:?}");
        };
        assert_eq!(
            linux.effective_cmdline(),
            "console=ttyAMA0 earlycon rdinit=/init loglevel=5 console=hvc0"
        );
        assert!(linux.reports_result());
        let plain = spec("memory");
        assert_eq!(
            (plain.net, plain.mac, plain.disk, plain.console),
            (None, None, None, None)
        );
        assert_eq!(
            spec("linux").guest,
            VmGuest::Linux(LinuxBoot::debian(BusyboxInit::Test))
        );
        let role = spec("linux,args=hv.role=disk-write hv.bench_mib=0,disk=/d/b.img");
        let VmGuest::Linux(linux) = &role.guest else {
            panic!("{role:?}");
        };
        assert_eq!(
            linux.effective_cmdline(),
            "console=ttyAMA0 earlycon rdinit=/init loglevel=5 hv.role=disk-write hv.bench_mib=0"
        );
        assert!(!role.disk.unwrap().read_only);
    }

    #[test]
    fn passthrough_items_parse_and_repeat() {
        let vm = spec(
            "linux,name=a,device=/virtio_mmio@a000200,pass-disk=/d/p.img,pass-net=8080,\
             device=/pcie@10000000,pass-disk=/d/q.img:ro",
        );
        let paths: Vec<&str> = vm.devices.iter().map(DevicePath::as_str).collect();
        assert_eq!(paths, ["/virtio_mmio@a000200", "/pcie@10000000"]);
        assert_eq!(
            vm.passed,
            [
                PassedDevice::Disk(HostDisk {
                    path: "/d/p.img".into(),
                    read_only: false
                }),
                PassedDevice::Net { port: 8080 },
                PassedDevice::Disk(HostDisk {
                    path: "/d/q.img".into(),
                    read_only: true
                }),
            ]
        );
        assert_eq!(vm.ram, None);
        assert_eq!(vm.ram_placement(), Some(RamPlacement::Identity));
        let raw = spec("memory,device=/virtio_mmio@a003e00");
        assert_eq!((raw.ram, raw.ram_placement()), (None, None));
        assert!(raw.passed.is_empty());
        let identity = spec("memory,device=/virtio_mmio@a003e00,ram=identity");
        assert_eq!(identity.ram_placement(), Some(RamPlacement::Identity));
        let plain = spec("memory");
        assert!(plain.devices.is_empty() && plain.passed.is_empty() && plain.ram.is_none());
        let eight = (0..MAX_DEVICES)
            .map(|i| format!(",device=/d@{i}"))
            .collect::<String>();
        assert_eq!(spec(&format!("memory{eight}")).devices.len(), MAX_DEVICES);
    }

    #[test]
    fn a_pcie_disk_is_one_bridge_node_and_no_transport() {
        let vm = spec("linux,name=a,pass-pcie=/d/p.img,pass-pcie=/d/q.img:ro,pass-disk=/d/r.img");
        assert_eq!(
            vm.passed,
            [
                PassedDevice::PcieDisk(HostDisk {
                    path: "/d/p.img".into(),
                    read_only: false
                }),
                PassedDevice::PcieDisk(HostDisk {
                    path: "/d/q.img".into(),
                    read_only: true
                }),
                PassedDevice::Disk(HostDisk {
                    path: "/d/r.img".into(),
                    read_only: false
                }),
            ]
        );
        assert!(!vm.passed[0].on_virtio_mmio() && vm.passed[2].on_virtio_mmio());
        assert_eq!(vm.passed[1].item(), "pass-pcie=/d/q.img:ro");
        assert_eq!(vm.ram_placement(), Some(RamPlacement::Identity));
        // Seven other nodes and any number of PCI disks: eight nodes.
        let seven = (0..MAX_DEVICES - 1)
            .map(|i| format!(",device=/d@{i}"))
            .collect::<String>();
        let full = spec(&format!(
            "memory{seven},pass-pcie=/d/a.img,pass-pcie=/d/b.img"
        ));
        assert_eq!(full.passed.len(), 2);
        let bridge = spec(&format!(
            "memory{seven},device=/pcie@10000000,pass-pcie=/d/a.img"
        ));
        assert_eq!(bridge.devices.len(), MAX_DEVICES);
        let why = why(&format!("memory{seven},pass-pcie=/d/a.img,pass-net=80"));
        assert!(
            why.contains("9 device-tree nodes") && why.contains("at most 8"),
            "{why}"
        );
        assert!(self::why("memory,pass-pcie=").contains("pass-pcie="));
        assert!(self::why("memory,pass-pcie=:ro").contains("PATH or PATH:ro"));
    }

    #[test]
    fn bad_passthrough_items_say_what_is_wrong() {
        let nine = format!(
            "memory{},pass-net=80",
            (0..MAX_DEVICES)
                .map(|i| format!(",device=/d@{i}"))
                .collect::<String>()
        );
        for (text, says) in [
            ("memory,device=virtio_mmio@a003e00", "starts at the root"),
            ("memory,device=/", "root node"),
            ("memory,device=/soc//uart", "empty component"),
            ("memory,ram=fixed", "identity"),
            ("memory,ram=identity,ram=identity", "given twice"),
            ("memory,pass-disk=", "PATH or PATH:ro"),
            ("memory,pass-net=0", "TCP port"),
            ("memory,pass-net=65536", "TCP port"),
            ("memory,pass-net=http", "TCP port"),
            (nine.as_str(), "at most 8"),
        ] {
            let why = why(text);
            assert!(why.contains(says), "{text}: {why}");
            assert!(why.starts_with(&format!("--vm {text}:")), "{why}");
        }
    }

    #[test]
    fn mte_item_reads_on_and_off_and_nothing_else() {
        assert!(spec("memory,mte=on").mte);
        assert!(!spec("memory,mte=off").mte);
        assert!(!spec("memory").mte);
        let why = why("memory,mte=yes");
        assert!(why.contains("mte=yes") && why.contains("--mte"), "{why}");
        assert!(self::why("memory,mte=on,mte=on").contains("given twice"));
    }

    #[test]
    fn default_smp_covers_every_cpu_named() {
        let vms = [spec("memory,cpus=0-1"), spec("linux,cpus=4")];
        assert_eq!(default_smp(&vms, false), 5);
        assert_eq!(default_smp(&vms, true), 6);
        assert_eq!(default_smp(&[spec("memory")], false), 1);
    }

    #[test]
    fn a_waiting_destination() {
        assert!(spec("memory").start);
        assert!(!spec("migrate,start=0").start);
    }
}
