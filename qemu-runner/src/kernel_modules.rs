//! Which of Debian's kernel modules a Linux guest's initramfs carries, and in
//! which order `/init` loads them.
//!
//! Debian's arm64 kernel builds the virtio transports and devices and ext4 as
//! modules ([`GUEST_MODULES`]), and the virtio PCI transport too
//! ([`OPTIONAL_GUEST_MODULES`]: `virtio_pci`, which needs
//! `virtio_pci_modern_dev` and `virtio_pci_legacy_dev`), loaded when the
//! package has it (a kernel that builds it in has no module to load). Its package ships the `.ko` files (not
//! compressed in bookworm, so busybox's `insmod` loads them as they are) but
//! no `modules.dep`: `depmod` writes that file when the package is
//! installed. So the runner does what `depmod` does: it reads each module's
//! `.modinfo` ELF section ([`ModInfo::read`]): `name=`, `depends=` (the
//! modules whose symbols it uses: what `modules.dep` lists), `softdep=pre:`
//! (modules to load first although no symbol ties them, e.g. ext4 and jbd2
//! need the `crypto-crc32c` algorithm for metadata checksums) and `alias=`
//! (how a soft dependency names a module, `crypto-crc32c` is
//! `crc32c_generic`). [`load_order`] then walks the dependencies depth
//! first and lists every module after all it depends on, each once, the
//! wanted ones in their given order otherwise; a hard dependency that no
//! module provides is an error, a soft one that none provides (built in, or
//! absent) is skipped, as `modprobe` skips it. A dependency cycle is an
//! error.

use std::collections::BTreeMap;

use object::{Object, ObjectSection};

/// The modules a Linux guest loads at init: the virtio-mmio transport, the
/// virtio block, net and console drivers, and ext4 (their dependencies come
/// with them).
pub const GUEST_MODULES: &[&str] = &[
    "virtio_mmio",
    "virtio_blk",
    "virtio_net",
    "virtio_console",
    "ext4",
];

/// The modules a Linux guest loads at init when the kernel package has
/// them: the virtio PCI transport, for a virtio device on a PCI bus (a VM
/// that owns QEMU's PCIe host bridge). Its dependencies
/// (`virtio_pci_modern_dev`, `virtio_pci_legacy_dev` in bookworm) come
/// with it and must be there when it is.
pub const OPTIONAL_GUEST_MODULES: &[&str] = &["virtio_pci"];

/// What a module's `.modinfo` section says about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModInfo {
    /// Its name (`name=`; else the file's, `-` read as `_`).
    pub name: String,
    /// The modules it needs loaded first (`depends=`).
    pub depends: Vec<String>,
    /// Modules or aliases `softdep=pre:` names.
    pub soft_pre: Vec<String>,
    /// Other names it answers to (`alias=`).
    pub aliases: Vec<String>,
}

impl ModInfo {
    /// Reads the `.modinfo` section of the module file `elf` (NUL-separated
    /// `key=value` strings).
    pub fn read(elf: &[u8]) -> Result<ModInfo, String> {
        let file = object::File::parse(elf).map_err(|error| format!("not an ELF file: {error}"))?;
        let section = file
            .section_by_name(".modinfo")
            .ok_or("no .modinfo section (not a kernel module)")?;
        let data = section
            .data()
            .map_err(|error| format!("unreadable .modinfo section: {error}"))?;
        Ok(ModInfo::from_modinfo(data))
    }

    /// Reads the `key=value` strings of a `.modinfo` section.
    pub fn from_modinfo(data: &[u8]) -> ModInfo {
        let mut info = ModInfo::default();
        for entry in data.split(|byte| *byte == 0) {
            let Ok(entry) = std::str::from_utf8(entry) else {
                continue;
            };
            let Some((key, value)) = entry.split_once('=') else {
                continue;
            };
            match key {
                "name" => info.name = value.to_string(),
                "depends" => info.depends.extend(
                    value
                        .split(',')
                        .filter(|name| !name.is_empty())
                        .map(module_name),
                ),
                "softdep" => {
                    // `pre: a b post: c`: the words after `pre:` up to `post:`.
                    let mut in_pre = false;
                    for word in value.split_whitespace() {
                        match word {
                            "pre:" => in_pre = true,
                            "post:" => in_pre = false,
                            name if in_pre => info.soft_pre.push(name.to_string()),
                            _ => {}
                        }
                    }
                }
                "alias" => info.aliases.push(value.to_string()),
                _ => {}
            }
        }
        info
    }
}

/// A module's name as the kernel spells it: `-` in file names is `_`.
pub fn module_name(file_stem: &str) -> String {
    file_stem.replace('-', "_")
}

/// Every module of `modules` in an order `insmod` can load them, starting
/// from `wanted`, then `optional` where `modules` has them (see the module
/// doc). `modules` maps each module's name to what it says about itself.
pub fn load_order(
    wanted: &[&str],
    optional: &[&str],
    modules: &BTreeMap<String, ModInfo>,
) -> Result<Vec<String>, String> {
    let mut order = Vec::new();
    let mut visiting = Vec::new();
    for name in wanted {
        visit(name, true, modules, &mut visiting, &mut order)?;
    }
    for name in optional {
        visit(name, false, modules, &mut visiting, &mut order)?;
    }
    Ok(order)
}

/// Adds `name` after its dependencies; `required`: a missing module is an
/// error (else a soft dependency nobody provides, skipped).
fn visit(
    name: &str,
    required: bool,
    modules: &BTreeMap<String, ModInfo>,
    visiting: &mut Vec<String>,
    order: &mut Vec<String>,
) -> Result<(), String> {
    let found = modules.get(&module_name(name)).or_else(|| {
        modules
            .values()
            .find(|info| info.aliases.iter().any(|alias| alias == name))
    });
    let Some(info) = found else {
        return if required {
            Err(format!(
                "module {name} is not in the kernel package{}",
                match visiting.last() {
                    Some(parent) => format!(" ({parent} depends on it)"),
                    None => String::new(),
                }
            ))
        } else {
            Ok(())
        };
    };
    if order.contains(&info.name) {
        return Ok(());
    }
    if visiting.contains(&info.name) {
        return Err(format!(
            "modules depend on each other in a circle: {} -> {}",
            visiting.join(" -> "),
            info.name
        ));
    }
    visiting.push(info.name.clone());
    for soft in &info.soft_pre {
        visit(soft, false, modules, visiting, order)?;
    }
    for hard in &info.depends {
        visit(hard, true, modules, visiting, order)?;
    }
    visiting.pop();
    order.push(info.name.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str, depends: &[&str], soft_pre: &[&str], aliases: &[&str]) -> ModInfo {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        ModInfo {
            name: name.into(),
            depends: strings(depends),
            soft_pre: strings(soft_pre),
            aliases: strings(aliases),
        }
    }

    /// Bookworm's modules as their `.modinfo` sections describe them.
    fn debian() -> BTreeMap<String, ModInfo> {
        [
            module("virtio_mmio", &[], &[], &[]),
            module("virtio_blk", &[], &[], &[]),
            module("virtio_net", &["net_failover"], &[], &[]),
            module("net_failover", &["failover"], &[], &[]),
            module("failover", &[], &[], &[]),
            module("virtio_console", &[], &[], &[]),
            module(
                "ext4",
                &["jbd2", "mbcache", "crc16"],
                &["crypto-crc32c"],
                &[],
            ),
            module("jbd2", &[], &["crypto-crc32c"], &[]),
            module("mbcache", &[], &[], &[]),
            module("crc16", &[], &[], &[]),
            module("crc32c_generic", &[], &[], &["crypto-crc32c", "crc32c"]),
            module(
                "virtio_pci",
                &["virtio_pci_modern_dev", "virtio_pci_legacy_dev"],
                &[],
                &[],
            ),
            module("virtio_pci_modern_dev", &[], &[], &[]),
            module("virtio_pci_legacy_dev", &[], &[], &[]),
        ]
        .into_iter()
        .map(|info| (info.name.clone(), info))
        .collect()
    }

    #[test]
    fn modinfo_strings_are_read() {
        let info = ModInfo::from_modinfo(
            b"license=GPL\0softdep=pre: crypto-crc32c post: x\0alias=fs-ext4\0\
              depends=jbd2,mbcache,crc16\0name=ext4\0vermagic=6.1.0 SMP\0",
        );
        assert_eq!(
            info,
            module(
                "ext4",
                &["jbd2", "mbcache", "crc16"],
                &["crypto-crc32c"],
                &["fs-ext4"]
            )
        );
        assert_eq!(
            ModInfo::from_modinfo(b"depends=\0name=virtio_blk\0").depends,
            Vec::<String>::new()
        );
        assert_eq!(
            ModInfo::from_modinfo(b"depends=virtio-rng\0").depends,
            ["virtio_rng"]
        );
    }

    #[test]
    fn dependencies_load_first_and_once() {
        let order = load_order(GUEST_MODULES, OPTIONAL_GUEST_MODULES, &debian()).unwrap();
        assert_eq!(
            order,
            [
                "virtio_mmio",
                "virtio_blk",
                "failover",
                "net_failover",
                "virtio_net",
                "virtio_console",
                "crc32c_generic",
                "jbd2",
                "mbcache",
                "crc16",
                "ext4",
                "virtio_pci_modern_dev",
                "virtio_pci_legacy_dev",
                "virtio_pci",
            ]
        );
        for (at, name) in order.iter().enumerate() {
            let info = &debian()[name];
            for dependency in &info.depends {
                let before = order.iter().position(|n| n == dependency).unwrap();
                assert!(before < at, "{dependency} after {name}");
            }
        }
    }

    #[test]
    fn an_optional_module_loads_when_there_and_needs_its_dependencies() {
        let mut modules = debian();
        assert_eq!(
            load_order(&["virtio_blk"], &["virtio_pci"], &modules).unwrap(),
            [
                "virtio_blk",
                "virtio_pci_modern_dev",
                "virtio_pci_legacy_dev",
                "virtio_pci"
            ]
        );
        modules.remove("virtio_pci_legacy_dev");
        let error = load_order(&["virtio_blk"], &["virtio_pci"], &modules).unwrap_err();
        assert!(
            error.contains("virtio_pci_legacy_dev") && error.contains("virtio_pci depends"),
            "{error}"
        );
        modules.remove("virtio_pci");
        assert_eq!(
            load_order(&["virtio_blk"], &["virtio_pci"], &modules).unwrap(),
            ["virtio_blk"]
        );
    }

    #[test]
    fn missing_hard_dependencies_and_circles_are_errors_missing_soft_ones_are_not() {
        let mut modules = debian();
        modules.remove("crc32c_generic");
        let order = load_order(&["ext4"], &[], &modules).unwrap();
        assert_eq!(order, ["jbd2", "mbcache", "crc16", "ext4"]);
        modules.remove("mbcache");
        let error = load_order(&["ext4"], &[], &modules).unwrap_err();
        assert!(
            error.contains("mbcache") && error.contains("ext4 depends"),
            "{error}"
        );
        let error = load_order(&["nope"], &[], &modules).unwrap_err();
        assert!(
            error.contains("nope is not in the kernel package"),
            "{error}"
        );
        let circle: BTreeMap<String, ModInfo> =
            [module("a", &["b"], &[], &[]), module("b", &["a"], &[], &[])]
                .into_iter()
                .map(|info| (info.name.clone(), info))
                .collect();
        let error = load_order(&["a"], &[], &circle).unwrap_err();
        assert!(error.contains("a -> b -> a"), "{error}");
    }
}
