//! The hypervisor's boot formats, shared by the hypervisor (which reads them
//! at EL2, `no_std`) and by `qemu-runner` (which writes them on the host).
//!
//! The hypervisor is booted as a Linux arm64 `Image` and finds its guest in
//! the initrd: the *boot payload*, an uncompressed cpio archive in "newc"
//! format ([`cpio`]) with these entries:
//!
//! | entry | | contents |
//! |---|---|---|
//! | [`KERNEL`] | required | the guest kernel: an arm64 `Image` or a raw binary ([`image`]) |
//! | [`INITRD`] | optional | the guest's initrd |
//! | [`CMDLINE`] | optional | the guest's `/chosen/bootargs` |
//! | [`VM_CONF`] | optional | `key=value` settings of the VM ([`vmconf`]) |
//!
//! [`Payload`] writes such an archive and [`PayloadRef::parse`] reads one
//! back without copying; a property test checks that every payload reads back
//! as it was written.
//!
//! ```
//! use boot_payload::{Payload, PayloadRef, vmconf::VmConf};
//!
//! let payload = Payload {
//!     kernel: vec![0x00, 0x00, 0x00, 0x14], // `b .`: a raw binary
//!     cmdline: Some("test=memory".into()),
//!     conf: VmConf { vcpus: Some(2), ..VmConf::default() },
//!     ..Payload::default()
//! };
//! let archive = payload.to_cpio();
//! let read = PayloadRef::parse(&archive).unwrap();
//! assert_eq!(read.kernel, &payload.kernel[..]);
//! assert_eq!(read.cmdline, Some("test=memory"));
//! assert_eq!(read.conf.vcpus, Some(2));
//! ```
//!
//! # Several VMs
//!
//! A payload may describe up to [`MAX_VMS`] VMs, each in its own directory
//! `vm/<name>/` with the same four entries:
//!
//! | entry | | contents |
//! |---|---|---|
//! | `vm/<name>/kernel` | required | the VM's kernel |
//! | `vm/<name>/initrd` | optional | its initrd |
//! | `vm/<name>/cmdline` | optional | its `/chosen/bootargs` |
//! | `vm/<name>/vm.conf` | optional | its settings: `mem_mib`, `cpus` (the physical CPUs that run its vCPUs, one vCPU each), `control=1` (it may use the control interface), `vcpus` |
//!
//! The VMs come in archive order (VM `i` is the hypervisor's `vm<i>`);
//! names follow [`vmname`]. With more than one VM each names its CPUs and no
//! CPU is named twice; CPUs no VM names are the hypervisor's. A payload with
//! top-level entries is the *one-VM layout* of before: one VM,
//! [`SINGLE_VM_NAME`], on every CPU unless its `vm.conf` says otherwise.
//! [`write_several`] writes the several-VM layout (and refuses what the
//! reader would refuse); [`VmsRef::parse`] reads either layout and
//! [`VmsRef::check_cpus`] checks the CPUs against the machine's. When there
//! are several VMs the hypervisor starts each of a VM's console lines with
//! `[<name>] ` ([`vmname::ConsolePrefix`]).
//!
//! ```
//! use boot_payload::cpuset::CpuSet;
//! use boot_payload::{NamedPayload, Payload, VmsRef, vmconf::VmConf, write_several};
//!
//! let vm = |name: &str, cpus: &str| NamedPayload {
//!     name: name.into(),
//!     payload: Payload {
//!         kernel: vec![0x00, 0x00, 0x00, 0x14],
//!         conf: VmConf { cpus: Some(CpuSet::parse(cpus).unwrap()), ..VmConf::default() },
//!         ..Payload::default()
//!     },
//! };
//! let archive = write_several(&[vm("web", "0-1"), vm("db", "2")]).unwrap();
//! let vms = VmsRef::parse(&archive).unwrap();
//! assert_eq!(vms.as_slice()[1].name.as_str(), "db");
//! assert!(vms.check_cpus(3).is_ok());
//! assert!(vms.check_cpus(2).is_err()); // no CPU 2
//! assert!(write_several(&[vm("web", "0-1"), vm("db", "1")]).is_err()); // CPU 1 twice
//! ```

#![no_std]

extern crate alloc;

pub mod cpio;
pub mod cpuset;
pub mod image;
pub mod vmconf;
pub mod vmname;

use alloc::string::String;
use alloc::vec::Vec;

use cpio::{CpioError, FileEntry};
use vmconf::{VmConf, VmConfError};
use vmname::{VmName, VmNameError};

/// Name of the guest kernel's entry.
pub const KERNEL: &str = "kernel";
/// Name of the guest initrd's entry.
pub const INITRD: &str = "initrd";
/// Name of the guest command line's entry.
pub const CMDLINE: &str = "cmdline";
/// Name of the VM settings' entry.
pub const VM_CONF: &str = "vm.conf";

/// A boot payload to write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    /// Guest kernel: an arm64 `Image` or a raw binary.
    pub kernel: Vec<u8>,
    /// Guest initrd, placed in guest RAM and announced in the guest DTB.
    pub initrd: Option<Vec<u8>>,
    /// Guest kernel command line (`/chosen/bootargs`).
    pub cmdline: Option<String>,
    /// VM settings; the `vm.conf` entry is left out when none is set.
    pub conf: VmConf,
}

impl Payload {
    /// The archive's entries, `kernel` first.
    pub fn entries(&self) -> Vec<FileEntry> {
        let mut entries = alloc::vec![FileEntry::file(KERNEL, self.kernel.clone())];
        if let Some(initrd) = &self.initrd {
            entries.push(FileEntry::file(INITRD, initrd.clone()));
        }
        if let Some(cmdline) = &self.cmdline {
            entries.push(FileEntry::file(CMDLINE, cmdline.clone().into_bytes()));
        }
        if self.conf != VmConf::default() {
            entries.push(FileEntry::file(VM_CONF, self.conf.to_text().into_bytes()));
        }
        entries
    }

    /// The payload as a newc cpio archive.
    pub fn to_cpio(&self) -> Vec<u8> {
        cpio::write_archive(&self.entries())
    }
}

/// Writes the payload of `vms` in the several-VM layout
/// (`vm/<name>/<entry>`, VMs in the given order), and checks it reads back:
/// a payload the hypervisor would refuse is never written.
pub fn write_several(vms: &[NamedPayload]) -> Result<Vec<u8>, PayloadError> {
    let mut entries = Vec::new();
    for vm in vms {
        let name = VmName::new(&vm.name).map_err(PayloadError::BadVmName)?;
        if vms.iter().filter(|other| other.name == vm.name).count() > 1 {
            return Err(PayloadError::DuplicateName(name));
        }
        for entry in vm.payload.entries() {
            entries.push(FileEntry {
                name: alloc::format!("{VM_DIR}/{}/{}", vm.name, entry.name),
                ..entry
            });
        }
    }
    let archive = cpio::write_archive(&entries);
    VmsRef::parse(&archive)?;
    Ok(archive)
}

/// A boot payload read in place: one VM's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadRef<'a> {
    /// Guest kernel.
    pub kernel: &'a [u8],
    /// Guest initrd.
    pub initrd: Option<&'a [u8]>,
    /// Guest command line, without trailing newlines or NULs.
    pub cmdline: Option<&'a str>,
    /// VM settings (all `None` without a `vm.conf` entry).
    pub conf: VmConf,
}

/// What is wrong with one VM of a payload in the several-VM layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmEntryError {
    /// The VM has no `kernel` entry.
    NoKernel,
    /// Its `cmdline` entry is not UTF-8 text.
    CmdlineNotText,
    /// Its `vm.conf` is invalid.
    Conf(VmConfError),
    /// One of its entries appears twice.
    RepeatedEntry,
    /// It has an entry other than `kernel`, `initrd`, `cmdline`, `vm.conf`.
    UnknownEntry,
    /// Beside other VMs, it does not say which CPUs run it (`cpus`).
    NoCpus,
}

impl core::fmt::Display for VmEntryError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoKernel => write!(f, "no `{KERNEL}` entry"),
            Self::CmdlineNotText => write!(f, "`{CMDLINE}` is not UTF-8 text"),
            Self::Conf(error) => write!(f, "{error}"),
            Self::RepeatedEntry => write!(f, "an entry appears twice"),
            Self::UnknownEntry => write!(
                f,
                "an entry other than {KERNEL}, {INITRD}, {CMDLINE}, {VM_CONF}"
            ),
            Self::NoCpus => write!(
                f,
                "beside other VMs a VM must name its CPUs (`cpus=` in {VM_CONF})"
            ),
        }
    }
}

impl core::error::Error for VmEntryError {}

/// Why a boot payload could not be read, or does not fit the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayloadError {
    /// The archive is damaged.
    Cpio(CpioError),
    /// The archive has no `kernel` entry (and no `vm/` entries).
    NoKernel,
    /// The `cmdline` entry is not UTF-8 text.
    CmdlineNotText,
    /// `vm.conf` is invalid.
    Conf(VmConfError),
    /// A `vm/<name>/` entry names a VM badly.
    BadVmName(VmNameError),
    /// One VM of the several-VM layout is wrong.
    Vm {
        /// The VM.
        vm: VmName,
        /// What is wrong with it.
        error: VmEntryError,
    },
    /// The archive has both top-level VM entries and `vm/` entries.
    MixedLayouts,
    /// The archive describes more than [`MAX_VMS`] VMs.
    TooManyVms,
    /// Two VMs to write have this name ([`write_several`]).
    DuplicateName(VmName),
    /// Two VMs name the same CPU.
    CpusOverlap {
        /// The earlier VM.
        first: VmName,
        /// The later VM.
        second: VmName,
        /// The lowest CPU both name.
        cpu: u32,
    },
    /// A VM names a CPU the machine lacks ([`VmsRef::check_cpus`]).
    NoSuchCpu {
        /// The VM.
        vm: VmName,
        /// The CPU.
        cpu: u32,
        /// How many CPUs the machine has.
        host_cpus: u32,
    },
    /// A VM asks for more vCPUs than the machine has CPUs
    /// ([`VmsRef::check_cpus`]).
    TooManyVcpus {
        /// The VM.
        vm: VmName,
        /// Its vCPUs.
        vcpus: u32,
        /// How many CPUs the machine has.
        host_cpus: u32,
    },
    /// [`PayloadRef::parse`] reads payloads of one VM; this one holds more.
    SeveralVms(usize),
}

impl core::fmt::Display for PayloadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Cpio(error) => write!(f, "the payload is not a cpio newc archive: {error}"),
            Self::NoKernel => write!(f, "the payload has no `{KERNEL}` entry"),
            Self::CmdlineNotText => write!(f, "the payload's `{CMDLINE}` is not UTF-8 text"),
            Self::Conf(error) => write!(f, "{error}"),
            Self::BadVmName(error) => write!(f, "a `{VM_DIR}/<name>/` entry: {error}"),
            Self::Vm { vm, error } => write!(f, "VM `{vm}` ({VM_DIR}/{vm}/): {error}"),
            Self::MixedLayouts => write!(
                f,
                "the payload has both top-level {KERNEL}/{INITRD}/{CMDLINE}/{VM_CONF} entries \
                 and `{VM_DIR}/` entries; use one layout"
            ),
            Self::TooManyVms => write!(f, "the payload describes more than {MAX_VMS} VMs"),
            Self::DuplicateName(vm) => write!(f, "two VMs are called `{vm}`"),
            Self::CpusOverlap { first, second, cpu } => write!(
                f,
                "VMs `{first}` and `{second}` both name CPU {cpu}; a CPU runs one VM"
            ),
            Self::NoSuchCpu { vm, cpu, host_cpus } => write!(
                f,
                "VM `{vm}` names CPU {cpu}, but the machine has {host_cpus} CPUs (0-{})",
                host_cpus.saturating_sub(1)
            ),
            Self::TooManyVcpus {
                vm,
                vcpus,
                host_cpus,
            } => write!(
                f,
                "VM `{vm}` asks for {vcpus} vCPUs, but the machine has {host_cpus} CPUs"
            ),
            Self::SeveralVms(count) => write!(
                f,
                "the payload describes {count} VMs; this path runs one (read it with VmsRef)"
            ),
        }
    }
}

impl core::error::Error for PayloadError {}

impl From<CpioError> for PayloadError {
    fn from(error: CpioError) -> PayloadError {
        PayloadError::Cpio(error)
    }
}

impl<'a> PayloadRef<'a> {
    /// Reads a payload of one VM, in either layout ([`VmsRef::parse`]); a
    /// payload of several VMs is refused with [`PayloadError::SeveralVms`].
    pub fn parse(archive: &'a [u8]) -> Result<PayloadRef<'a>, PayloadError> {
        let vms = VmsRef::parse(archive)?;
        match vms.as_slice() {
            [only] => Ok(only.payload),
            several => Err(PayloadError::SeveralVms(several.len())),
        }
    }
}

/// Most VMs one payload may describe.
pub const MAX_VMS: usize = 8;
/// The directory of the several-VM layout: `vm/<name>/<entry>`.
pub const VM_DIR: &str = "vm";
/// The name of the VM of a payload in the one-VM layout.
pub const SINGLE_VM_NAME: &str = "vm0";

/// One named VM of a payload to write ([`write_several`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamedPayload {
    /// The VM's name ([`vmname`]).
    pub name: String,
    /// Its files and settings.
    pub payload: Payload,
}

/// One VM of a payload read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmRef<'a> {
    /// Its name: `vm/<name>/`, or [`SINGLE_VM_NAME`] in the one-VM layout.
    pub name: VmName,
    /// Its files and settings.
    pub payload: PayloadRef<'a>,
}

/// The VMs of a payload read in place, in archive order (the order of each
/// VM's first entry); VM `i` is the hypervisor's `vm<i>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmsRef<'a> {
    /// The VMs in their first `len` slots; the rest are placeholders.
    vms: [VmRef<'a>; MAX_VMS],
    len: usize,
}

/// The entries of one VM while the archive is read.
#[derive(Clone, Copy, Default)]
struct VmEntries<'a> {
    kernel: Option<&'a [u8]>,
    initrd: Option<&'a [u8]>,
    cmdline: Option<&'a [u8]>,
    conf: Option<&'a [u8]>,
}

impl<'a> VmEntries<'a> {
    /// The slot of the entry called `file`, if it is one of a VM's.
    fn slot(&mut self, file: &str) -> Option<&mut Option<&'a [u8]>> {
        match file {
            KERNEL => Some(&mut self.kernel),
            INITRD => Some(&mut self.initrd),
            CMDLINE => Some(&mut self.cmdline),
            VM_CONF => Some(&mut self.conf),
            _ => None,
        }
    }

    fn is_empty(&self) -> bool {
        self.kernel.is_none()
            && self.initrd.is_none()
            && self.cmdline.is_none()
            && self.conf.is_none()
    }

    /// The VM's payload; errors as in the one-VM layout.
    fn read(self) -> Result<PayloadRef<'a>, PayloadError> {
        let cmdline = self
            .cmdline
            .map(|bytes| {
                core::str::from_utf8(bytes)
                    .map(|text| text.trim_end_matches(['\n', '\0']))
                    .map_err(|_| PayloadError::CmdlineNotText)
            })
            .transpose()?;
        Ok(PayloadRef {
            kernel: self.kernel.ok_or(PayloadError::NoKernel)?,
            initrd: self.initrd,
            cmdline,
            conf: self
                .conf
                .map(VmConf::parse)
                .transpose()
                .map_err(PayloadError::Conf)?
                .unwrap_or_default(),
        })
    }
}

impl<'a> VmsRef<'a> {
    /// Reads the VMs of `archive` in one pass over its entries.
    ///
    /// # Layouts
    ///
    /// The *one-VM layout* has top-level `kernel`, `initrd`, `cmdline` and
    /// `vm.conf` entries; the first entry of each name counts and unknown
    /// names are ignored, as they always were. Its VM is called
    /// [`SINGLE_VM_NAME`].
    ///
    /// The *several-VM layout* has entries `vm/<name>/kernel` (and
    /// `initrd`, `cmdline`, `vm.conf`), one directory per VM; directory
    /// entries (`vm`, `vm/<name>`) are allowed, VMs come in the order their
    /// first entry appears, and a repeated or unknown entry under `vm/` is an
    /// error. With more than one VM, each must name its CPUs (`cpus=`) and
    /// no CPU may be named twice. Whether the CPUs exist is the machine's
    /// question: [`VmsRef::check_cpus`].
    pub fn parse(archive: &'a [u8]) -> Result<VmsRef<'a>, PayloadError> {
        let placeholder = VmRef {
            name: VmName::PLACEHOLDER,
            payload: PayloadRef {
                kernel: &[],
                initrd: None,
                cmdline: None,
                conf: VmConf::default(),
            },
        };
        let mut top = VmEntries::default();
        let mut names: [Option<VmName>; MAX_VMS] = [None; MAX_VMS];
        let mut entries = [VmEntries::default(); MAX_VMS];
        let mut len = 0;
        for entry in cpio::entries(archive) {
            let entry = entry?;
            let Some(path) = entry
                .name
                .strip_prefix(VM_DIR)
                .and_then(|rest| rest.strip_prefix('/'))
            else {
                if entry.name == VM_DIR {
                    continue;
                }
                if let Some(slot) = top.slot(entry.name) {
                    slot.get_or_insert(entry.data);
                }
                continue;
            };
            let (name, file) = match path.split_once('/') {
                Some((name, file)) => (name, Some(file)),
                None => (path, None),
            };
            let name = VmName::new(name).map_err(PayloadError::BadVmName)?;
            let index = match names[..len].iter().position(|n| *n == Some(name)) {
                Some(index) => index,
                None if len == MAX_VMS => return Err(PayloadError::TooManyVms),
                None => {
                    names[len] = Some(name);
                    len += 1;
                    len - 1
                }
            };
            let Some(file) = file else { continue };
            let in_vm = |error| PayloadError::Vm { vm: name, error };
            let slot = entries[index]
                .slot(file)
                .ok_or(in_vm(VmEntryError::UnknownEntry))?;
            if slot.replace(entry.data).is_some() {
                return Err(in_vm(VmEntryError::RepeatedEntry));
            }
        }
        let mut vms = VmsRef {
            vms: [placeholder; MAX_VMS],
            len,
        };
        if len == 0 {
            let name = VmName::new(SINGLE_VM_NAME).map_err(PayloadError::BadVmName)?;
            vms.vms[0] = VmRef {
                name,
                payload: top.read()?,
            };
            vms.len = 1;
            return Ok(vms);
        }
        if !top.is_empty() {
            return Err(PayloadError::MixedLayouts);
        }
        for index in 0..len {
            let Some(name) = names[index] else { continue };
            let in_vm = |error| PayloadError::Vm { vm: name, error };
            let payload = entries[index].read().map_err(|error| match error {
                PayloadError::NoKernel => in_vm(VmEntryError::NoKernel),
                PayloadError::CmdlineNotText => in_vm(VmEntryError::CmdlineNotText),
                PayloadError::Conf(error) => in_vm(VmEntryError::Conf(error)),
                other => other,
            })?;
            if len > 1 && payload.conf.cpus.is_none() {
                return Err(in_vm(VmEntryError::NoCpus));
            }
            vms.vms[index] = VmRef { name, payload };
        }
        let vm_list = vms.as_slice();
        for (i, first) in vm_list.iter().enumerate() {
            for second in &vm_list[i + 1..] {
                if let (Some(a), Some(b)) = (first.payload.conf.cpus, second.payload.conf.cpus)
                    && let Some(cpu) = a.first_shared(b)
                {
                    return Err(PayloadError::CpusOverlap {
                        first: first.name,
                        second: second.name,
                        cpu,
                    });
                }
            }
        }
        Ok(vms)
    }

    /// The VMs, in order.
    pub fn as_slice(&self) -> &[VmRef<'a>] {
        &self.vms[..self.len]
    }

    /// How many VMs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a payload holds at least one VM.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the VMs fit a machine of `host_cpus` CPUs: every CPU a VM
    /// names exists, and no VM without a CPU list asks for more vCPUs than
    /// there are CPUs.
    pub fn check_cpus(&self, host_cpus: u32) -> Result<(), PayloadError> {
        for vm in self.as_slice() {
            let conf = &vm.payload.conf;
            match conf.cpus {
                Some(cpus) if cpus.highest() >= host_cpus => {
                    return Err(PayloadError::NoSuchCpu {
                        vm: vm.name,
                        cpu: cpus.iter().find(|&cpu| cpu >= host_cpus).unwrap_or(0),
                        host_cpus,
                    });
                }
                Some(_) => {}
                None if conf.vcpu_count(host_cpus) > host_cpus => {
                    return Err(PayloadError::TooManyVcpus {
                        vm: vm.name,
                        vcpus: conf.vcpu_count(host_cpus),
                        host_cpus,
                    });
                }
                None => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::vec;
    use cpuset::CpuSet;
    use proptest::prelude::*;

    #[test]
    fn payload_lists_kernel_first_and_only_given_entries() {
        let payload = Payload {
            kernel: vec![1, 2, 3],
            cmdline: Some("test=bad-guest".into()),
            conf: VmConf {
                mem_mib: Some(64),
                ..VmConf::default()
            },
            ..Payload::default()
        };
        let archive = payload.to_cpio();
        let names: Vec<&str> = cpio::entries(&archive).map(|e| e.unwrap().name).collect();
        assert_eq!(names, [KERNEL, CMDLINE, VM_CONF]);
        let conf = cpio::entries(&archive).find(VM_CONF).unwrap().unwrap();
        assert_eq!(conf.data, b"mem_mib=64\n");
        let bare = Payload {
            kernel: vec![9],
            ..Payload::default()
        };
        assert_eq!(
            cpio::entries(&bare.to_cpio()).count(),
            1,
            "no empty vm.conf"
        );
    }

    #[test]
    fn damaged_or_incomplete_payloads_are_refused() {
        let no_kernel = cpio::write_archive(&[FileEntry::file(CMDLINE, b"x".to_vec())]);
        assert_eq!(PayloadRef::parse(&no_kernel), Err(PayloadError::NoKernel));
        let bad_conf = cpio::write_archive(&[
            FileEntry::file(KERNEL, vec![1]),
            FileEntry::file(VM_CONF, b"cpu=2\n".to_vec()),
        ]);
        assert_eq!(
            PayloadRef::parse(&bad_conf),
            Err(PayloadError::Conf(VmConfError::UnknownKey(1)))
        );
        let bad_cmdline = cpio::write_archive(&[
            FileEntry::file(KERNEL, vec![1]),
            FileEntry::file(CMDLINE, vec![0xff]),
        ]);
        assert_eq!(
            PayloadRef::parse(&bad_cmdline),
            Err(PayloadError::CmdlineNotText)
        );
        let archive = Payload {
            kernel: vec![1; 10],
            ..Payload::default()
        }
        .to_cpio();
        assert!(matches!(
            PayloadRef::parse(&archive[..archive.len() - 8]),
            Err(PayloadError::Cpio(_))
        ));
    }

    #[test]
    fn entries_written_by_the_cpio_tool_are_read_too() {
        // `find . | cpio -o -H newc` names entries `./kernel`; the first
        // entry of a name wins.
        let archive = cpio::write_archive(&[
            FileEntry::file("./kernel", vec![7]),
            FileEntry::file(KERNEL, vec![8]),
            FileEntry::file("./cmdline", b"quiet\n\0".to_vec()),
            FileEntry::file("notes.txt", vec![1]),
        ]);
        let read = PayloadRef::parse(&archive).unwrap();
        assert_eq!(read.kernel, [7]);
        assert_eq!(read.cmdline, Some("quiet"));
    }

    fn vm(name: &str, cpus: &str, kernel: u8) -> NamedPayload {
        NamedPayload {
            name: name.into(),
            payload: Payload {
                kernel: vec![kernel],
                conf: VmConf {
                    cpus: Some(CpuSet::parse(cpus).unwrap()),
                    ..VmConf::default()
                },
                ..Payload::default()
            },
        }
    }

    fn name(name: &str) -> VmName {
        VmName::new(name).unwrap()
    }

    #[test]
    fn a_one_vm_payload_is_one_vm_on_every_cpu() {
        let archive = Payload {
            kernel: vec![1],
            ..Payload::default()
        }
        .to_cpio();
        let vms = VmsRef::parse(&archive).unwrap();
        assert_eq!(vms.len(), 1);
        assert_eq!(vms.as_slice()[0].name.as_str(), SINGLE_VM_NAME);
        assert_eq!(vms.as_slice()[0].payload.conf.cpus, None);
        assert_eq!(vms.as_slice()[0].payload.conf.vcpu_count(4), 4);
        assert_eq!(vms.check_cpus(4), Ok(()));
        let too_many = Payload {
            kernel: vec![1],
            conf: VmConf {
                vcpus: Some(5),
                ..VmConf::default()
            },
            ..Payload::default()
        }
        .to_cpio();
        assert_eq!(
            VmsRef::parse(&too_many).unwrap().check_cpus(4),
            Err(PayloadError::TooManyVcpus {
                vm: name(SINGLE_VM_NAME),
                vcpus: 5,
                host_cpus: 4
            })
        );
    }

    #[test]
    fn several_vms_read_in_archive_order() {
        let archive = write_several(&[vm("b", "2-3", 2), vm("a", "0,1", 1)]).unwrap();
        let names: Vec<&str> = cpio::entries(&archive).map(|e| e.unwrap().name).collect();
        assert_eq!(
            names,
            ["vm/b/kernel", "vm/b/vm.conf", "vm/a/kernel", "vm/a/vm.conf"]
        );
        let vms = VmsRef::parse(&archive).unwrap();
        let read: Vec<(&str, &[u8], u32)> = vms
            .as_slice()
            .iter()
            .map(|vm| {
                (
                    vm.name.as_str(),
                    vm.payload.kernel,
                    vm.payload.conf.vcpu_count(8),
                )
            })
            .collect();
        assert_eq!(read, [("b", &[2u8][..], 2), ("a", &[1u8][..], 2)]);
        assert_eq!(vms.check_cpus(4), Ok(()));
        assert_eq!(
            vms.check_cpus(3),
            Err(PayloadError::NoSuchCpu {
                vm: name("b"),
                cpu: 3,
                host_cpus: 3
            })
        );
        assert_eq!(
            PayloadRef::parse(&archive),
            Err(PayloadError::SeveralVms(2))
        );
        // One VM in the several-VM layout is what the one-VM path reads.
        let one = write_several(&[vm("x", "1", 7)]).unwrap();
        assert_eq!(PayloadRef::parse(&one).unwrap().kernel, [7]);
    }

    #[test]
    fn entries_of_the_cpio_tool_with_directories_read_too() {
        let archive = cpio::write_archive(&[
            FileEntry::directory("vm"),
            FileEntry::directory("vm/a"),
            FileEntry::file("./vm/a/kernel", vec![3]),
            FileEntry::file("vm/a/cmdline", b"quiet\n".to_vec()),
        ]);
        let vms = VmsRef::parse(&archive).unwrap();
        assert_eq!(vms.len(), 1);
        assert_eq!(vms.as_slice()[0].payload.cmdline, Some("quiet"));
    }

    #[test]
    fn bad_several_vm_payloads_are_refused() {
        let refused = |entries: &[FileEntry]| {
            VmsRef::parse(&cpio::write_archive(entries)).map(|vms| vms.len())
        };
        let conf = |vm: &str, text: &str| FileEntry::file(&format!("vm/{vm}/vm.conf"), text.into());
        let kernel = |vm: &str| FileEntry::file(&format!("vm/{vm}/kernel"), vec![1]);
        assert_eq!(
            refused(&[
                kernel("a"),
                conf("a", "cpus=0-1"),
                kernel("b"),
                conf("b", "cpus=1-2")
            ]),
            Err(PayloadError::CpusOverlap {
                first: name("a"),
                second: name("b"),
                cpu: 1
            })
        );
        assert_eq!(
            refused(&[kernel("a"), conf("a", "cpus=0"), conf("b", "cpus=1")]),
            Err(PayloadError::Vm {
                vm: name("b"),
                error: VmEntryError::NoKernel
            })
        );
        assert_eq!(
            refused(&[kernel("a"), conf("a", "cpus=0\nmem_mib=0")]),
            Err(PayloadError::Vm {
                vm: name("a"),
                error: VmEntryError::Conf(VmConfError::BadValue(2))
            })
        );
        assert_eq!(
            refused(&[kernel("a"), conf("a", "cpus=0"), kernel("b")]),
            Err(PayloadError::Vm {
                vm: name("b"),
                error: VmEntryError::NoCpus
            })
        );
        assert_eq!(
            refused(&[kernel("a"), kernel("a")]),
            Err(PayloadError::Vm {
                vm: name("a"),
                error: VmEntryError::RepeatedEntry
            })
        );
        assert_eq!(
            refused(&[kernel("a"), FileEntry::file("vm/a/kernal", vec![1])]),
            Err(PayloadError::Vm {
                vm: name("a"),
                error: VmEntryError::UnknownEntry
            })
        );
        assert_eq!(
            refused(&[FileEntry::file("vm/a b/kernel", vec![1])]),
            Err(PayloadError::BadVmName(VmNameError::BadCharacter(' ')))
        );
        assert_eq!(
            refused(&[kernel("a"), FileEntry::file(KERNEL, vec![1])]),
            Err(PayloadError::MixedLayouts)
        );
        let nine: Vec<FileEntry> = (0..=MAX_VMS).map(|i| kernel(&format!("v{i}"))).collect();
        assert_eq!(refused(&nine), Err(PayloadError::TooManyVms));
        assert_eq!(
            write_several(&[vm("a", "0", 1), vm("a", "1", 1)]),
            Err(PayloadError::DuplicateName(name("a")))
        );
        assert_eq!(
            write_several(&[vm("hv", "0", 1)]),
            Err(PayloadError::BadVmName(VmNameError::Reserved))
        );
        assert_eq!(
            write_several(&[vm("a", "0", 1), vm("b", "0", 1)]),
            Err(PayloadError::CpusOverlap {
                first: name("a"),
                second: name("b"),
                cpu: 0
            })
        );
    }

    proptest! {
        #[test]
        fn every_several_vm_payload_reads_back_as_written(
            vms in proptest::collection::vec(
                (
                    "[a-z_-]{0,12}",
                    proptest::collection::vec(any::<u8>(), 1..100),
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..50)),
                    proptest::option::of("[ -~]{0,30}"),
                    proptest::option::of(1u64..1 << 20),
                    1u8..,
                    proptest::option::of(proptest::bool::ANY),
                ),
                1..=MAX_VMS,
            )
        ) {
            // Names made distinct by their index; CPU sets disjoint by
            // giving VM `i` CPUs `8 * i..8 * i + 8`.
            let vms: Vec<NamedPayload> = vms
                .into_iter()
                .enumerate()
                .map(|(i, (suffix, kernel, initrd, cmdline, mem_mib, cpus, control))| NamedPayload {
                    name: format!("v{i}{suffix}"),
                    payload: Payload {
                        kernel,
                        initrd,
                        cmdline: cmdline.map(|c| String::from(c.trim_end_matches(['\n', '\0']))),
                        conf: VmConf {
                            cpus: CpuSet::from_mask(u64::from(cpus) << (8 * i)),
                            mem_mib,
                            control,
                            ..VmConf::default()
                        },
                    },
                })
                .collect();
            let archive = write_several(&vms).unwrap();
            let read = VmsRef::parse(&archive).unwrap();
            prop_assert_eq!(read.len(), vms.len());
            for (vm, read) in vms.iter().zip(read.as_slice()) {
                prop_assert_eq!(read.name.as_str(), vm.name.as_str());
                prop_assert_eq!(read.payload.kernel, &vm.payload.kernel[..]);
                prop_assert_eq!(read.payload.initrd, vm.payload.initrd.as_deref());
                prop_assert_eq!(read.payload.cmdline, vm.payload.cmdline.as_deref());
                prop_assert_eq!(read.payload.conf, vm.payload.conf);
            }
        }
    }

    proptest! {
        #[test]
        fn every_payload_reads_back_as_written(
            kernel in proptest::collection::vec(any::<u8>(), 1..600),
            initrd in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            cmdline in proptest::option::of("[ -~]{0,40}"),
            vcpus in proptest::option::of(1u32..64),
            mem_mib in proptest::option::of(1u64..1 << 20),
        ) {
            let cmdline = cmdline.map(|c| String::from(c.trim_end_matches(['\n', '\0'])));
            let payload = Payload {
                kernel, initrd, cmdline, conf: VmConf { vcpus, mem_mib, ..VmConf::default() },
            };
            let archive = payload.to_cpio();
            let read = PayloadRef::parse(&archive).unwrap();
            prop_assert_eq!(read.kernel, &payload.kernel[..]);
            prop_assert_eq!(read.initrd, payload.initrd.as_deref());
            prop_assert_eq!(read.cmdline, payload.cmdline.as_deref());
            prop_assert_eq!(read.conf, payload.conf);
        }
    }
}
