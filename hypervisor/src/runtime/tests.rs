//! Host tests of the VM runtime against a fake machine: [`FakeHardware`]
//! hands out host allocations as frames (filled with garbage, so a missing
//! zeroing shows), runs a real `pgtable` stage 2 over `pgtable::HostMemory`,
//! records every TLB sequence, cache clean, kick and console line, and has
//! a system counter that advances one tick per read. With memory tagging on
//! ([`FakeHardware::with_tags`]) it keeps an allocation tag per 16-byte
//! granule ([`TagMemory`]): fresh frames carry garbage tags until zeroed.
//!
//! VMs are created from real boot payloads (`boot_payload`) by
//! `create_vm`, exactly as at boot; the tests then drive migration, dirty-log
//! collection, restart and VM creation and check their effects on guest
//! memory, stage 2, memslots and the VMs' states.

use std::collections::BTreeMap;
use std::string::{String, ToString};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::vec;
use std::vec::Vec;

use boot_payload::cpuset::CpuSet;
use boot_payload::vmconf::VmConf;
use boot_payload::{NamedPayload, Payload, VmsRef};
use memslot::{DirtyLogMode, Gfn, PAGE_SHIFT, SlotFlags, SlotId, VcpuSlotCache};
use pgtable::{Attributes, HostMemory, PageCache, Perms, PhysAddr};
use tlb::{Scope, TlbCaps, TlbInvalidate, TlbTarget, TlbiOp};

use super::Hardware;
use super::boot_info::BootInfo;
use super::collector_handles::CollectorHandles;
use super::device_access::{self, AccessingVcpu};
use super::device_hub::DeviceHub;
use super::dirty_log;
use super::guest_call::{self, CallingVcpu};
use super::live_migration::{self, MigrateError};
use super::monitor_target::{MonitorError, MonitorMachine, VmConsoleInputs};
use super::restart;
use super::vcpu_cycle::{self, CpuVcpu};
use super::vm_instance::{Vm, VmError, create_vm};
use super::vm_ops;
use super::vm_table::{MachineError, VmTable};
use crate::control::console::GuestInput;
use crate::control::console_mux::VmId;
use crate::control::monitor::{MonitorTarget, SlotRequest};
use crate::devices::guest_memory::HostSpan;
use crate::devices::vgic::{LockWait, VcpuSet};
use crate::devices::virtio::block_backend::{BlockBackend, BlockError, SECTOR_SIZE};
use crate::exit::esr::DataAccess;
use crate::exit::flow::{Flow, StopReason};
use crate::exit::hypercall::{HV_TEST_REPORT, NOT_SUPPORTED};
use crate::exit::psci;
use crate::platform::cpu_features::CpuFeatures;
use crate::platform::ranges::PhysRange;
use crate::platform::{Platform, PsciConduit};
use crate::stage2::cache_maint::CacheCaps;
use crate::vm::counters::{Counter, VmCounters};
use crate::vm::layout::GUEST_RAM_BASE;
use crate::vm::migration_plan::MigrationOptions;
use crate::vm::power::PowerState;
use crate::vm::run_state::Requested;
use crate::vm::vcpu_state::VectorLengths;

mod boot_sequence;
mod console_cpu;
mod cpu_start;
mod its;
mod memory_tagging;
mod passthrough;
mod vcpu_exits;
mod virtio;

const PAGE: u64 = 1 << PAGE_SHIFT;
/// What fresh frames hold before anyone zeroes them.
const GARBAGE: u8 = 0x5a;

/// The page interval `[first, end)` one TLBI removes (`None`: the whole
/// VMID).
type OpPages = Option<(u64, u64)>;

/// A TLB that records each sequence it is asked to execute, as the page
/// intervals of its operations (`None`: the whole VMID).
#[derive(Default)]
struct FakeTlb {
    sequences: Mutex<Vec<Vec<OpPages>>>,
}

impl TlbInvalidate for FakeTlb {
    fn caps(&self) -> TlbCaps {
        TlbCaps::ALL
    }

    fn execute(&self, _target: &TlbTarget, ops: &mut dyn Iterator<Item = TlbiOp>, _: Scope) {
        let ops: Vec<_> = ops.map(|op| op.pages()).collect();
        if !ops.is_empty() {
            self.sequences.lock().unwrap().push(ops);
        }
    }
}

impl FakeTlb {
    /// The sequences since the last call, each as the IPA interval its
    /// operations cover (`None` for a whole-VMID flush).
    fn take_spans(&self) -> Vec<OpPages> {
        let sequences = core::mem::take(&mut *self.sequences.lock().unwrap());
        sequences
            .iter()
            .map(|ops| {
                ops.iter().try_fold((u64::MAX, 0), |(lo, hi), op| {
                    op.map(|(first, end)| (lo.min(first << PAGE_SHIFT), hi.max(end << PAGE_SHIFT)))
                })
            })
            .collect()
    }
}

/// The fake machine (see the module doc).
struct FakeHardware {
    tables: &'static HostMemory,
    tlb: &'static FakeTlb,
    gicv2: bool,
    /// Live frame allocations: address -> (size, alignment).
    frames: Mutex<BTreeMap<u64, (u64, u64)>>,
    /// Frames given back: (address, size).
    freed: Mutex<Vec<(u64, u64)>>,
    /// The system counter (1 MHz): one tick per read, and the cache
    /// maintenance's time.
    ticks: AtomicU64,
    /// Microseconds a page of cache maintenance takes (the copy rate the
    /// migration measures).
    clean_us_per_page: AtomicU64,
    /// Microseconds a kick takes (until its CPU has left its guest).
    kick_us: AtomicU64,
    dcache_cleans: AtomicUsize,
    icache_invalidations: AtomicUsize,
    kicks: Mutex<Vec<usize>>,
    output: Mutex<Vec<(usize, u8)>>,
    lines: Mutex<Vec<String>>,
    powered_off: AtomicBool,
    /// The host disks, by number.
    disks: Mutex<Vec<&'static VecDisk>>,
    /// What was done to passed devices' SPIs and forwarded windows, in
    /// order.
    spi_ops: Mutex<Vec<String>>,
    /// The switch and the VMs its ports reach.
    hub: &'static DeviceHub<FakeHardware>,
    /// The poll timer PPI of each start of the console and control
    /// interface (`cpu_start::CpuStart::start_services`).
    services: Mutex<Vec<u32>>,
    /// Allocation tags, on a host with memory tagging.
    tags: Option<Mutex<TagMemory>>,
    /// The running CPU, the host UART and the host GIC as the console sees
    /// them (`console_cpu`).
    console_side: Mutex<console_cpu::ConsoleSide>,
}

/// The bytes one allocation tag covers.
const GRANULE: usize = 16;
/// The tag fresh frames carry on the fake.
const GARBAGE_TAG: u8 = 0xa;

/// The fake's allocation tags: the granules whose tag was set, and the
/// ranges of frames handed out and not zeroed since (their tags
/// [`GARBAGE_TAG`]).
#[derive(Default)]
struct TagMemory {
    set: BTreeMap<usize, u8>,
    garbage: Vec<(usize, usize)>,
}

impl TagMemory {
    fn tag(&self, granule: usize) -> u8 {
        match self.set.get(&granule) {
            Some(&tag) => tag,
            None if self
                .garbage
                .iter()
                .any(|&(a, b)| a <= granule && granule < b) =>
            {
                GARBAGE_TAG
            }
            None => 0,
        }
    }

    /// Zeroes the tags of `[from, to)`.
    fn zero(&mut self, from: usize, to: usize) {
        self.set.retain(|&g, _| g < from || g >= to);
        let mut left = Vec::new();
        for &(a, b) in &self.garbage {
            if a < from {
                left.push((a, b.min(from)));
            }
            if b > to {
                left.push((a.max(to), b));
            }
        }
        self.garbage = left;
    }
}

impl FakeHardware {
    /// A machine with a GICv3.
    fn new() -> &'static Self {
        Self::with_gicv2(false)
    }

    fn with_gicv2(gicv2: bool) -> &'static Self {
        Self::build(gicv2, false)
    }

    /// A machine with a GICv3 and memory tagging.
    fn with_tags() -> &'static Self {
        Self::build(false, true)
    }

    fn build(gicv2: bool, tags: bool) -> &'static Self {
        Box::leak(Box::new(Self {
            tables: Box::leak(Box::new(HostMemory::new())),
            tlb: Box::leak(Box::new(FakeTlb::default())),
            gicv2,
            frames: Mutex::new(BTreeMap::new()),
            freed: Mutex::new(Vec::new()),
            ticks: AtomicU64::new(0),
            clean_us_per_page: AtomicU64::new(1),
            kick_us: AtomicU64::new(0),
            dcache_cleans: AtomicUsize::new(0),
            icache_invalidations: AtomicUsize::new(0),
            kicks: Mutex::new(Vec::new()),
            output: Mutex::new(Vec::new()),
            lines: Mutex::new(Vec::new()),
            powered_off: AtomicBool::new(false),
            disks: Mutex::new(Vec::new()),
            spi_ops: Mutex::new(Vec::new()),
            hub: Box::leak(Box::new(DeviceHub::new())),
            services: Mutex::new(Vec::new()),
            tags: tags.then(|| Mutex::new(TagMemory::default())),
            console_side: Mutex::new(console_cpu::ConsoleSide::default()),
        }))
    }

    /// The allocation tag of the granule at host address `addr`.
    fn tag(&self, addr: usize) -> u8 {
        let tags = self.tags.as_ref().expect("a machine with memory tagging");
        tags.lock().unwrap().tag(addr & !(GRANULE - 1))
    }

    /// A guest's `STG`: sets the tag of the granule at `addr`.
    fn set_tag(&self, addr: usize, tag: u8) {
        let tags = self.tags.as_ref().expect("a machine with memory tagging");
        tags.lock().unwrap().set.insert(addr & !(GRANULE - 1), tag);
    }
}

/// The fake's vCPUs never run at once: its vgic locks spin (a CPU index
/// past the sleepers' mask).
impl LockWait for FakeHardware {
    fn sleeper_cpu(&self) -> usize {
        usize::MAX
    }

    fn sleep(&self) {}

    fn wake(&self, _cpu: usize) {}

    fn ticks(&self) -> u64 {
        self.counter_ticks()
    }
}

impl Hardware for FakeHardware {
    type TableMemory = &'static HostMemory;
    type Tlb = &'static FakeTlb;

    fn alloc_frames(&self, size: u64, align: u64) -> Option<u64> {
        let layout = std::alloc::Layout::from_size_align(size as usize, align as usize).ok()?;
        // SAFETY: the layout has a non-zero size (every caller asks for
        // at least a page).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` is `size` bytes just allocated.
        unsafe { core::ptr::write_bytes(ptr, GARBAGE, size as usize) };
        if let Some(tags) = &self.tags {
            let mut tags = tags.lock().unwrap();
            let range = (ptr as usize, ptr as usize + size as usize);
            tags.zero(range.0, range.1);
            tags.garbage.push(range);
        }
        self.frames
            .lock()
            .unwrap()
            .insert(ptr as u64, (size, align));
        Some(ptr as u64)
    }

    fn free_frames(&self, pa: u64, size: u64, align: u64) {
        let had = self.frames.lock().unwrap().remove(&pa);
        assert_eq!(had, Some((size, align)), "frames freed with another shape");
        // Kept allocated (a test may still look at them); recorded.
        self.freed.lock().unwrap().push((pa, size));
    }

    fn zero_memory(&self, addr: usize, len: usize) {
        // SAFETY: the runtime zeroes only frames it was given.
        unsafe { core::ptr::write_bytes(addr as *mut u8, 0, len) };
        if let Some(tags) = &self.tags {
            tags.lock().unwrap().zero(addr, addr + len);
        }
    }

    fn copy_tags(&self, from: usize, to: usize, len: usize) {
        let tags = self
            .tags
            .as_ref()
            .expect("tags copied on a host without them");
        let mut tags = tags.lock().unwrap();
        for offset in (0..len).step_by(GRANULE) {
            let tag = tags.tag(from + offset);
            tags.set.insert(to + offset, tag);
        }
    }

    fn tags_equal(&self, a: usize, b: usize, len: usize) -> bool {
        let tags = self
            .tags
            .as_ref()
            .expect("tags compared on a host without them");
        let tags = tags.lock().unwrap();
        (0..len)
            .step_by(GRANULE)
            .all(|offset| tags.tag(a + offset) == tags.tag(b + offset))
    }

    fn table_memory(&self) -> &'static HostMemory {
        self.tables
    }

    fn guest_table_memory(&self, _: CacheCaps, _: &'static VmCounters) -> &'static HostMemory {
        self.tables
    }

    fn tlb(&self, _: TlbCaps) -> &'static FakeTlb {
        self.tlb
    }

    fn cache_caps(&self) -> CacheCaps {
        // 64-byte lines, no IDC/DIC: every maintenance is needed.
        CacheCaps::from_ctr(0x8444_c004)
    }

    fn clean_inval_dcache_to_poc(&self, _: usize, len: usize) {
        self.dcache_cleans.fetch_add(1, Ordering::Relaxed);
        let pages = (len as u64).div_ceil(PAGE);
        let cost = self.clean_us_per_page.load(Ordering::Relaxed);
        self.ticks.fetch_add(pages * cost, Ordering::Relaxed);
    }

    fn make_executable(&self, _: usize, _: usize) {}

    fn invalidate_icache_all(&self) {
        self.icache_invalidations.fetch_add(1, Ordering::Relaxed);
    }

    fn counter_ticks(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::Relaxed)
    }

    fn counter_frequency(&self) -> u64 {
        1_000_000
    }

    fn kick(&self, cpu: usize) {
        self.ticks
            .fetch_add(self.kick_us.load(Ordering::Relaxed), Ordering::Relaxed);
        self.kicks.lock().unwrap().push(cpu);
    }

    fn send_event(&self) {}

    fn wait_for_wakeup(&self) {
        if self.console_side.lock().unwrap().wait_ends_test {
            panic!("the fake CPU waits");
        }
    }

    fn gic_is_v2(&self) -> bool {
        self.gicv2
    }

    fn vector_lengths(&self) -> VectorLengths {
        VectorLengths::default()
    }

    fn guest_output(&self, vm: usize, byte: u8) {
        self.output.lock().unwrap().push((vm, byte));
    }

    fn flush_guest_line(&self, _: usize) {}

    fn write_line(&self, args: core::fmt::Arguments<'_>) {
        self.lines.lock().unwrap().push(std::format!("{args}"));
    }

    fn system_off(&self) {
        self.powered_off.store(true, Ordering::Release);
    }

    fn system_reset(&self) -> ! {
        panic!("the fake machine was reset")
    }

    fn park(&self) -> ! {
        panic!("a CPU of the fake machine parked")
    }

    fn host_disk(&self, index: u32) -> Option<&'static dyn BlockBackend> {
        let disks = self.disks.lock().unwrap();
        let disk: &'static VecDisk = disks.get(index as usize)?;
        Some(disk)
    }

    fn passthrough_spi_setup(&self, intid: u32, edge: bool, cpu: usize) {
        self.spi_ops.lock().unwrap().push(format!(
            "setup {intid} {} cpu{cpu}",
            if edge { "edge" } else { "level" }
        ));
    }

    fn passthrough_spi_route(&self, intid: u32, cpu: usize) {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("route {intid} cpu{cpu}"));
    }

    fn passthrough_spi_deactivate(&self, intid: u32) {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("deactivate {intid}"));
    }

    fn passthrough_spi_release(&self, intid: u32) {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("release {intid}"));
    }

    fn host_its_base(&self) -> Option<u64> {
        (!self.gicv2).then_some(crate::vm::layout::GUEST_ITS_BASE)
    }

    fn msi_map_device(&self, device: u32, events: u32, cpu: usize) -> Option<u32> {
        let mut ops = self.spi_ops.lock().unwrap();
        // Each map since the last look its own run of 1024 LPIs.
        let first = 8192 + 1024 * ops.iter().filter(|op| op.starts_with("msi map")).count() as u32;
        ops.push(format!("msi map {device:#x} {events} cpu{cpu} at {first}"));
        Some(first)
    }

    fn msi_unmap_device(&self, device: u32, first: u32, events: u32) {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("msi unmap {device:#x} {events} at {first}"));
    }

    fn device_read(&self, pa: u64, size: u8) -> u64 {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("read {pa:#x} {size}"));
        0x7465_7374
    }

    fn device_write(&self, pa: u64, size: u8, value: u64) {
        self.spi_ops
            .lock()
            .unwrap()
            .push(format!("write {pa:#x} {size} {value:#x}"));
    }
}

/// A host disk of the fake machine: sectors in a host vector.
struct VecDisk {
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
}

impl VecDisk {
    /// A disk of `sectors` sectors, sector `n` filled with byte `n`,
    /// living as long as the test (host disks are `'static`).
    fn new(sectors: u64, read_only: bool) -> &'static Self {
        let bytes = (0..sectors * SECTOR_SIZE)
            .map(|i| (i / SECTOR_SIZE) as u8)
            .collect();
        Box::leak(Box::new(Self {
            bytes: Mutex::new(bytes),
            read_only,
        }))
    }
}

impl BlockBackend for VecDisk {
    fn capacity_sectors(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64 / SECTOR_SIZE
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let bytes = self.bytes.lock().unwrap();
        let mut at = (sector * SECTOR_SIZE) as usize;
        for span in spans {
            let from = bytes
                .get(at..at + span.len as usize)
                .ok_or(BlockError::OutOfRange {
                    sector,
                    len: span.len,
                })?;
            // SAFETY: a span is a translated guest buffer: a live host
            // allocation of the fake machine, `len` bytes long.
            unsafe {
                core::ptr::copy_nonoverlapping(from.as_ptr(), span.addr as *mut u8, from.len())
            };
            at += span.len as usize;
        }
        Ok(())
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        let mut bytes = self.bytes.lock().unwrap();
        let mut at = (sector * SECTOR_SIZE) as usize;
        for span in spans {
            let to = bytes
                .get_mut(at..at + span.len as usize)
                .ok_or(BlockError::OutOfRange {
                    sector,
                    len: span.len,
                })?;
            // SAFETY: as in `read`.
            unsafe {
                core::ptr::copy_nonoverlapping(span.addr as *const u8, to.as_mut_ptr(), to.len())
            };
            at += span.len as usize;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn id(&self) -> [u8; 20] {
        *b"fake-disk\0\0\0\0\0\0\0\0\0\0\0"
    }
}

/// A host with `cpus` CPUs, a GICv3 and no FEAT_S2FWB.
fn boot_info(cpus: usize) -> BootInfo {
    BootInfo {
        platform: Platform {
            model: String::from("fake"),
            ram: vec![PhysRange::from_start_size(0x4000_0000, 1 << 30)],
            cpus: (0..cpus as u64).collect(),
            ..Platform::for_tests()
        },
        features: CpuFeatures {
            pa_bits: 40,
            pa_range: 2,
            vmid_bits: 16,
            gic_sysregs: true,
            granule_4k: true,
            ..CpuFeatures::NOTHING
        },
        cpus_online: cpus,
        payload: None,
        tlb_caps: TlbCaps::ALL,
        passthrough: Vec::new(),
    }
}

/// The test kernel: a raw binary of recognisable bytes.
fn kernel() -> Vec<u8> {
    (0..3 * PAGE as usize + 100)
        .map(|i| (i % 251) as u8)
        .collect()
}

/// A VM's settings: `mem_mib` MiB, one vCPU per CPU of `cpus`.
fn conf(mem_mib: u64, cpus: &[u32], start: bool) -> VmConf {
    let mask = cpus.iter().fold(0, |mask, &cpu| mask | 1 << cpu);
    VmConf {
        vcpus: Some(cpus.len() as u32),
        mem_mib: Some(mem_mib),
        cpus: CpuSet::from_mask(mask),
        control: None,
        start: Some(start),
        ..VmConf::default()
    }
}

/// Creates the VMs of a payload with `vms` (name, settings) on `hw`.
fn create(hw: &'static FakeHardware, vms: &[(&str, VmConf)]) -> Vec<&'static Vm<FakeHardware>> {
    create_with(hw, vms, &boot_info(4))
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// Creates the VMs of a payload with `vms` on `hw` as `info` describes the
/// machine; each VM's creation result.
fn create_with(
    hw: &'static FakeHardware,
    vms: &[(&str, VmConf)],
    info: &BootInfo,
) -> Vec<Result<&'static Vm<FakeHardware>, VmError>> {
    let named: Vec<NamedPayload> = vms
        .iter()
        .map(|(name, conf)| NamedPayload {
            name: String::from(*name),
            payload: Payload {
                kernel: kernel(),
                initrd: None,
                cmdline: Some(String::from("console=ttyAMA0")),
                conf: *conf,
            },
        })
        .collect();
    let archive: &'static [u8] = Vec::leak(boot_payload::write_several(&named).unwrap());
    let parsed = VmsRef::parse(archive).unwrap();
    parsed
        .as_slice()
        .iter()
        .enumerate()
        .map(|(index, vm)| create_vm(hw, info, index, vm, hw.hub).map(|(vm, _)| vm))
        .collect()
}

fn slot0() -> SlotId {
    SlotId::new(0).unwrap()
}

/// The host address of guest page `page` of slot `id` of `vm`, as the
/// guest reaches it: its chunk zeroed first if the guest had not used it
/// (the stage-2 fault that maps it would, `vm::lazy_zero`).
fn host_page<H: Hardware>(vm: &Vm<H>, id: SlotId, page: u64) -> *mut u8 {
    let spec = vm_ops::slot_spec(vm, id).unwrap().unwrap();
    vm.ensure_zeroed(spec.backing.0 + page * PAGE, PAGE);
    (spec.backing.0 + page * PAGE) as *mut u8
}

/// The bytes of guest page `page` of `vm`'s slot 0.
fn read_page<H: Hardware>(vm: &Vm<H>, page: u64) -> Vec<u8> {
    // SAFETY: the page is inside the slot's backing, a live host allocation.
    unsafe { core::slice::from_raw_parts(host_page(vm, slot0(), page), PAGE as usize).to_vec() }
}

/// The guest writes `byte` over page `page` of its RAM: the bytes change
/// and, as the fault path does, the page is marked in the dirty log when
/// `logged`.
fn guest_write<H: Hardware>(vm: &Vm<H>, page: u64, byte: u8, logged: bool) {
    // SAFETY: as in `read_page`.
    unsafe { core::ptr::write_bytes(host_page(vm, slot0(), page), byte, PAGE as usize) };
    if logged {
        let handle = vm.collector.register();
        vm.mark_dirty(
            &handle,
            GUEST_RAM_BASE + page * PAGE,
            &mut VcpuSlotCache::new(),
        );
    }
}

// ---------------------------------------------------------------------------
// Live migration

/// A source (CPU 0, running) and a waiting destination (CPU 1) of 8 MiB.
fn migration_pair() -> (
    &'static FakeHardware,
    VmTable<FakeHardware>,
    &'static Vm<FakeHardware>,
    &'static Vm<FakeHardware>,
) {
    migration_pair_on(&[0], &[1])
}

/// A running source with a vCPU on each of `src_cpus` and a waiting
/// destination with one on each of `dst_cpus`, 8 MiB each.
fn migration_pair_on(
    src_cpus: &[u32],
    dst_cpus: &[u32],
) -> (
    &'static FakeHardware,
    VmTable<FakeHardware>,
    &'static Vm<FakeHardware>,
    &'static Vm<FakeHardware>,
) {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[
            ("src", conf(8, src_cpus, true)),
            ("dst", conf(8, dst_cpus, false)),
        ],
    );
    let table = VmTable::new(hw, vms.clone(), 4).unwrap();
    (hw, table, vms[0], vms[1])
}

/// Migration options: with or without the check, a limit in microseconds.
fn options(verify: bool, downtime_limit_us: u64) -> MigrationOptions {
    MigrationOptions {
        verify,
        downtime_limit_us,
    }
}

#[test]
fn precopy_ends_when_the_rest_fits_and_the_stop_copies_it() {
    let (hw, table, src, dst) = migration_pair();
    let npages = src.ram.size() / PAGE;
    let dirty = [3u64, 70, 500];
    let mut rounds = Vec::new();
    let report = live_migration::migrate(src, dst, options(true, 30_000), &mut |round| {
        rounds.push(round);
        for &page in &dirty {
            guest_write(src, page, 0xd0 + page as u8, true);
        }
    })
    .unwrap();
    // Round 0 copies everything (2 us a page on the fake); the three pages
    // dirtied meanwhile fit 30 ms at once, so the stop copies them.
    assert_eq!(report.pages_per_iteration, vec![npages, 3]);
    assert_eq!(rounds, vec![0]);
    assert!(report.expected_stop_copy_us <= 30_000);
    assert!(report.verified);
    assert_eq!(report.differences, 0);
    assert_eq!(report.throttle_percent, 0);
    for page in 0..npages {
        assert_eq!(read_page(dst, page), read_page(src, page), "page {page}");
    }
    // The destination runs; the source is stopping, its end reported by
    // the first of its vCPUs to halt (once), not by the migration; the
    // machine still runs the destination.
    assert!(!dst.awaiting_migration.load(Ordering::Acquire));
    assert!(src.is_stopping() && !src.has_ended());
    // The migration's dirty logging is turned off by that vCPU too, not
    // while the destination waits.
    let logging = || {
        let spec = vm_ops::slot_spec(src, slot0()).unwrap().unwrap();
        spec.flags.contains(SlotFlags::LOG_DIRTY)
    };
    assert!(logging());
    assert!(src.report_end_left_to_vcpus());
    assert!(!logging());
    table.vm_ended();
    assert!(src.has_ended());
    assert!(!src.report_end_left_to_vcpus(), "reported twice");
    assert!(!hw.powered_off.load(Ordering::Acquire));
}

/// The stop's end: the destination's vCPUs are released first, then the
/// source's are woken to halt (and report its end), so that the source's
/// halting does not delay the destination.
#[test]
fn the_source_is_woken_to_end_only_after_the_destination_is_released() {
    let (hw, _table, src, dst) = migration_pair_on(&[0, 3], &[1, 2]);
    hw.kicks.lock().unwrap().clear();
    live_migration::migrate(src, dst, options(false, 30_000), &mut |_| {}).unwrap();
    let kicks = hw.kicks.lock().unwrap().clone();
    // Destination vCPU 1 (CPU 2), then the source's CPUs 0 and 3.
    assert!(kicks.ends_with(&[2, 0, 3]), "{kicks:?}");
    assert!(src.is_stopping());
}

/// The stop's copy wakes the source's vCPUs to help only when this CPU
/// alone would take longer than the pause took to bring them out (about
/// what waking them again costs): a few pages are copied alone, with no
/// kicks between the pause's and the destination's release.
#[test]
fn the_source_helps_with_the_stop_copy_only_when_it_is_long() {
    for (pages, helped) in [(20u64, false), (400, true)] {
        let (hw, _table, src, dst) = migration_pair_on(&[0, 3], &[1, 2]);
        hw.kicks.lock().unwrap().clear();
        // The pause's two kicks take 200 us; a page's copy 2 us.
        hw.kick_us.store(100, Ordering::Relaxed);
        let report = live_migration::migrate(src, dst, options(false, 100_000_000), &mut |round| {
            if round == 0 {
                for page in 0..pages {
                    guest_write(src, page, 0x77, true);
                }
            }
        })
        .unwrap();
        assert_eq!(
            report.pages_per_iteration,
            vec![src.ram.size() / PAGE, pages]
        );
        assert_eq!(report.stop_copy_helped, helped, "{report}");
        let kicks = hw.kicks.lock().unwrap().clone();
        // The pause's kicks, the helpers' (when they help), destination
        // vCPU 1's release, the source's wake to end.
        let expected: Vec<usize> = if helped {
            vec![0, 3, 0, 3, 2, 0, 3]
        } else {
            vec![0, 3, 2, 0, 3]
        };
        assert_eq!(kicks, expected, "{report}");
        for page in 0..pages {
            assert_eq!(read_page(dst, page), read_page(src, page), "page {page}");
        }
    }
}

/// Verification off (the default): nothing compares, so a page changed
/// behind the log's back (as no real write can) stays as it was copied;
/// the report says the copy was not checked.
#[test]
fn without_verification_only_the_reported_pages_are_copied_and_nothing_compares() {
    let (_hw, table, src, dst) = migration_pair();
    let unlogged = 900u64;
    let before = read_page(src, unlogged);
    let report = live_migration::migrate(src, dst, MigrationOptions::default(), &mut |round| {
        if round == 0 {
            guest_write(src, 5, 0x55, true);
            guest_write(src, unlogged, 0xee, false);
        }
    })
    .unwrap();
    assert_eq!(read_page(dst, 5), read_page(src, 5));
    assert_eq!(
        read_page(dst, unlogged),
        before,
        "an unreported page was copied"
    );
    assert_ne!(read_page(src, unlogged), before);
    assert!(!report.verified);
    assert_eq!(report.verify_us, 0);
    assert_eq!(report.differences, 0);
    assert!(src.report_end_left_to_vcpus());
    table.vm_ended();
    assert!(src.has_ended());
    assert!(!report.to_string().contains("differences"), "{report}");
}

#[test]
fn precopy_iterates_until_the_rest_fits_the_limit_and_the_downtime_honours_it() {
    let (_hw, _table, src, dst) = migration_pair();
    let npages = src.ram.size() / PAGE;
    // Half a limit of 100 us is 25 pages at 2 us a page. The rounds leave
    // 400, 150 and 60 dirty pages (each less than half the one before: no
    // throttle), then 10 (20 us), which fit.
    let limit = 100;
    let report = live_migration::migrate(src, dst, options(true, limit), &mut |round| {
        let count = match round {
            0 => 400,
            1 => 150,
            2 => 60,
            3 => 10,
            _ => 0,
        };
        for page in 0..count {
            guest_write(src, page * 3, round as u8 + 1, true);
        }
    })
    .unwrap();
    assert_eq!(report.pages_per_iteration, vec![npages, 400, 150, 60, 10]);
    assert!(report.expected_stop_copy_us <= limit, "{report}");
    assert!(report.downtime_us <= limit, "{report}");
    // The writer slows down by more than half a round: never throttled.
    assert_eq!(report.throttle_percent, 0);
    for page in 0..npages {
        assert_eq!(read_page(dst, page), read_page(src, page), "page {page}");
    }
}

/// A writer that dirties a page every microsecond of its time (twice the
/// fake's copy rate of a page every 2 us), over all 2048 pages, never fits
/// 100 us unthrottled; the throttle grows a step a round (30, 50, ...
/// percent) until it dirties at most half as fast as the copy (90 %: 0.1
/// pages per us against 0.5), and pre-copy ends once the rest fits.
#[test]
fn a_writer_faster_than_the_copy_is_throttled_until_the_rest_fits() {
    let (hw, _table, src, dst) = migration_pair();
    let npages = src.ram.size() / PAGE;
    let limit = 100;
    let mut throttles = Vec::new();
    let mut last = hw.ticks.load(Ordering::Relaxed);
    let report = live_migration::migrate(src, dst, options(true, limit), &mut |round| {
        let throttle = u64::from(src.migration_throttle.load(Ordering::Acquire));
        throttles.push(throttle);
        let now = hw.ticks.load(Ordering::Relaxed);
        // The guest ran (100 - throttle) % of the time since the last round.
        let pages = (now - last) * (100 - throttle) / 100;
        last = now;
        for page in 0..pages.min(npages) {
            guest_write(src, page, round as u8 + 1, true);
        }
    })
    .unwrap();
    assert_eq!(throttles[..5], [0, 30, 50, 70, 90], "{throttles:?}");
    assert!(throttles[5..].iter().all(|&t| t == 90), "{throttles:?}");
    assert_eq!(report.throttle_percent, 90);
    assert!(report.expected_stop_copy_us <= limit, "{report}");
    assert!(report.downtime_us <= limit, "{report}");
    assert_eq!(report.differences, 0);
    // The throttle ends with the migration.
    assert_eq!(src.migration_throttle.load(Ordering::Acquire), 0);
    for page in 0..npages {
        assert_eq!(read_page(dst, page), read_page(src, page), "page {page}");
    }
}

#[test]
fn a_copy_that_differs_fails_and_the_source_runs_on() {
    let (hw, _table, src, dst) = migration_pair();
    let err = live_migration::migrate(src, dst, options(true, 30_000), &mut |round| {
        if round == 0 {
            guest_write(src, 42, 0x11, false);
        }
    })
    .unwrap_err();
    assert_eq!(err, MigrateError::Differences(1));
    // The source runs on, not captured, its logging off; the destination
    // still waits and nothing of it started.
    assert_eq!(src.requested_state(), Requested::Running);
    assert!(!src.capture_requested());
    assert!(!src.has_ended());
    assert_eq!(src.migration_throttle.load(Ordering::Acquire), 0);
    let spec = vm_ops::slot_spec(src, slot0()).unwrap().unwrap();
    assert!(!spec.flags.contains(SlotFlags::LOG_DIRTY));
    assert!(dst.awaiting_migration.load(Ordering::Acquire));
    assert_eq!(dst.power.state(0), PowerState::Off);
    assert!(!hw.powered_off.load(Ordering::Acquire));
}

#[test]
fn refused_migrations_leave_both_vms_as_they_were() {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[
            ("src", conf(8, &[0], true)),
            ("dst", conf(8, &[1], false)),
            ("small", conf(4, &[2], false)),
            ("running", conf(8, &[3], true)),
        ],
    );
    let (src, dst, small, running) = (vms[0], vms[1], vms[2], vms[3]);
    let cases = [
        (src, src, MigrateError::SameVm),
        (src, running, MigrateError::NotWaiting),
        (dst, small, MigrateError::SourceNotRunning),
        (src, small, MigrateError::Shape("RAM size")),
    ];
    for (from, to, expected) in cases {
        assert_eq!(
            live_migration::request(from, to, MigrationOptions::default()),
            Err(expected)
        );
    }
    for vm in &vms {
        assert!(vm.migration_job.lock().is_none());
    }
    assert!(hw.kicks.lock().unwrap().is_empty());
    // A second request while one is posted is refused and keeps the first.
    live_migration::request(src, dst, options(true, 7_000)).unwrap();
    assert_eq!(
        live_migration::request(running, dst, MigrationOptions::default()),
        Err(MigrateError::Busy)
    );
    let (posted, with) = dst.migration_job.lock().unwrap();
    assert!(core::ptr::eq(posted, src));
    assert_eq!(with, options(true, 7_000));
    assert_eq!(*hw.kicks.lock().unwrap(), vec![1]);
    assert!(dst.awaiting_migration.load(Ordering::Acquire));
    assert_eq!(src.requested_state(), Requested::Running);
}

#[test]
fn a_gicv2_host_refuses_migration() {
    let hw = FakeHardware::with_gicv2(true);
    let vms = create(
        hw,
        &[("src", conf(8, &[0], true)), ("dst", conf(8, &[1], false))],
    );
    assert_eq!(
        live_migration::request(vms[0], vms[1], MigrationOptions::default()),
        Err(MigrateError::Blocked(
            crate::vm::vcpu_state::MigrationBlocker::Gicv2
        ))
    );
    assert!(vms[1].migration_job.lock().is_none());
}

// ---------------------------------------------------------------------------
// Dirty-log collection

/// A VM of 4 MiB whose first `pages` pages are mapped writable at stage 2,
/// 4 KiB each, as faults would have left them.
fn mapped_vm(pages: u64) -> (&'static FakeHardware, &'static Vm<FakeHardware>) {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0], true))])[0];
    map_pages(vm, slot0(), pages);
    (hw, vm)
}

/// Maps the first `pages` pages of slot `id` writable at stage 2, 4 KiB
/// each, as faults would (the flushes are not kept).
fn map_pages(vm: &Vm<FakeHardware>, id: SlotId, pages: u64) {
    let hw = vm.hw;
    let spec = vm_ops::slot_spec(vm, id).unwrap().unwrap();
    let mut cache = PageCache::with_capacity(64);
    cache.top_up(&hw.table_memory(), 64).unwrap();
    let mut writer = vm.stage2.write();
    for page in 0..pages {
        writer
            .map(
                (spec.base_gfn.0 << PAGE_SHIFT) + page * PAGE,
                PAGE,
                PhysAddr::new(spec.backing.0 + page * PAGE),
                Attributes::normal(Perms::RW),
                &mut cache,
                &vm.tlb,
            )
            .unwrap();
    }
    drop(writer);
    cache.release(&hw.table_memory());
    hw.tlb.take_spans();
}

/// Which of the first `pages` pages are writable at stage 2.
fn writable(vm: &Vm<FakeHardware>, pages: u64) -> Vec<u64> {
    let writer = vm.stage2.write();
    (0..pages)
        .filter(|&page| {
            writer
                .lookup(GUEST_RAM_BASE + page * PAGE)
                .expect("mapped")
                .perms()
                .contains(Perms::WRITE)
        })
        .collect()
}

/// The guest writes page `page` of a logging slot, as the fault path lets
/// it: the leaf becomes writable and the page is marked dirty.
fn guest_write_fault(vm: &Vm<FakeHardware>, cpu: &pgtable::MmuCpu, page: u64) {
    let ipa = GUEST_RAM_BASE + page * PAGE;
    vm.stage2
        .read(cpu)
        .unwrap()
        .relax_perms(ipa, Perms::WRITE, &vm.tlb)
        .unwrap();
    guest_write(vm, page, 0x77, true);
}

/// The pages whose bits are set.
fn set_bits(bitmap: &[u64]) -> Vec<u64> {
    (0..bitmap.len() as u64 * 64)
        .filter(|&page| bitmap[(page / 64) as usize] & 1 << (page % 64) != 0)
        .collect()
}

#[test]
fn enabling_write_protects_the_slot_with_one_flush() {
    let (hw, vm) = mapped_vm(16);
    let report = dirty_log::enable(vm, slot0()).unwrap();
    assert_eq!(report.protected, 16 * PAGE);
    assert!(writable(vm, 16).is_empty());
    let spans = hw.tlb.take_spans();
    assert_eq!(
        spans,
        vec![Some((GUEST_RAM_BASE, GUEST_RAM_BASE + 16 * PAGE))]
    );
}

#[test]
fn collection_reports_and_reprotects_exactly_the_written_pages() {
    let (hw, vm) = mapped_vm(200);
    dirty_log::enable(vm, slot0()).unwrap();
    let cpu = vm.stage2.register().unwrap();
    let written = [1u64, 2, 3, 9, 130];
    for &page in &written {
        guest_write_fault(vm, &cpu, page);
    }
    assert_eq!(writable(vm, 200), written);
    hw.tlb.take_spans();
    let (ipa, bitmap) = dirty_log::collect(vm, slot0()).unwrap();
    assert_eq!(ipa, GUEST_RAM_BASE);
    assert_eq!(set_bits(&bitmap), written);
    // Exactly those pages are read-only again, with one flush over their
    // span.
    assert!(writable(vm, 200).is_empty());
    assert_eq!(
        hw.tlb.take_spans(),
        vec![Some((GUEST_RAM_BASE + PAGE, GUEST_RAM_BASE + 131 * PAGE))]
    );
    // The next interval starts empty and costs no flush.
    let (_, bitmap) = dirty_log::collect(vm, slot0()).unwrap();
    assert!(set_bits(&bitmap).is_empty());
    assert!(hw.tlb.take_spans().is_empty());
    // A page written again is reported again.
    guest_write_fault(vm, &cpu, 9);
    let (_, bitmap) = dirty_log::collect(vm, slot0()).unwrap();
    assert_eq!(set_bits(&bitmap), vec![9]);
}

#[test]
fn manual_protection_get_copies_and_clear_protects() {
    let (hw, vm) = mapped_vm(64);
    let mode = DirtyLogMode {
        manual_protect: true,
        initially_all_set: false,
    };
    dirty_log::configure(vm, mode, 0).unwrap();
    dirty_log::enable(vm, slot0()).unwrap();
    let cpu = vm.stage2.register().unwrap();
    for page in [5u64, 6, 40] {
        guest_write_fault(vm, &cpu, page);
    }
    hw.tlb.take_spans();
    let words = (vm.ram.size() / PAGE).div_ceil(64) as usize;
    let mut bits = vec![0u64; words];
    assert_eq!(dirty_log::get(vm, slot0(), &mut bits).unwrap(), 3);
    assert_eq!(set_bits(&bits), vec![5, 6, 40]);
    // `get` only copies: the pages stay writable, the bits stay set.
    assert_eq!(writable(vm, 64), vec![5, 6, 40]);
    assert!(hw.tlb.take_spans().is_empty());
    // Clearing 5 and 6 protects those two only.
    let mut mask = vec![0u64; words];
    mask[0] = 1 << 5 | 1 << 6;
    assert_eq!(dirty_log::clear(vm, slot0(), 0, &mut mask).unwrap(), 2);
    assert_eq!(writable(vm, 64), vec![40]);
    assert_eq!(
        hw.tlb.take_spans(),
        vec![Some((GUEST_RAM_BASE + 5 * PAGE, GUEST_RAM_BASE + 7 * PAGE))]
    );
    // `collect` takes the rest in one go.
    let (_, bitmap) = dirty_log::collect(vm, slot0()).unwrap();
    assert_eq!(set_bits(&bitmap), vec![40]);
    assert!(writable(vm, 64).is_empty());
}

#[test]
fn disabling_stops_the_marks() {
    let (_hw, vm) = mapped_vm(8);
    dirty_log::enable(vm, slot0()).unwrap();
    dirty_log::disable(vm, slot0()).unwrap();
    guest_write(vm, 2, 1, true);
    assert!(dirty_log::collect(vm, slot0()).is_err());
}

// ---------------------------------------------------------------------------
// Restart

#[test]
fn restart_rebuilds_memory_slots_and_devices_from_the_boot_image() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[0, 1], true))])[0];
    let old_ram = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let kernel_page = (vm.boot.kernel_ipa - GUEST_RAM_BASE) / PAGE;
    // A run that changed everything: memory, an extra slot, dirty logging,
    // the run state and the power states.
    let extra = SlotId::new(3).unwrap();
    vm_ops::create_slot(vm, extra, Gfn::from_ipa(0x8000_0000), 16, SlotFlags::NONE).unwrap();
    let extra_spec = vm_ops::slot_spec(vm, extra).unwrap().unwrap();
    map_pages(vm, slot0(), 4);
    map_pages(vm, extra, 2);
    dirty_log::enable(vm, slot0()).unwrap();
    for page in [0, kernel_page, 700] {
        guest_write(vm, page, 0xab, true);
    }
    vm.request_pause().unwrap();
    vm.power
        .request_on(
            1,
            crate::vm::power::BootRequest {
                entry: 0,
                context_id: 0,
            },
        )
        .unwrap();
    vm.set_capture_requested(true);
    hw.tlb.take_spans();
    let icache_before = hw.icache_invalidations.load(Ordering::Relaxed);

    let request = restart::rebuild(vm).unwrap();

    assert_eq!(request, vm.boot.request);
    // Only the RAM slot, at its place, not logging, on fresh frames; both
    // old backings went back to the allocator.
    let specs = vm_ops::slot_specs(vm).unwrap();
    assert_eq!(specs.len(), 1);
    let ram = specs[0];
    assert_eq!(
        (ram.id, ram.base_gfn, ram.npages),
        (slot0(), old_ram.base_gfn, old_ram.npages)
    );
    assert_eq!(ram.flags, SlotFlags::NONE);
    let freed = hw.freed.lock().unwrap().clone();
    assert!(freed.contains(&(old_ram.backing.0, old_ram.npages * PAGE)));
    assert!(freed.contains(&(extra_spec.backing.0, 16 * PAGE)));
    // Memory as at boot: the kernel and device tree in place, zeros
    // elsewhere (the fresh frames held garbage).
    let kernel = kernel();
    let at = |ipa: u64| (ram.backing.0 + (ipa - GUEST_RAM_BASE)) as *const u8;
    // SAFETY: inside the new RAM slot's backing.
    let loaded = unsafe { core::slice::from_raw_parts(at(vm.boot.kernel_ipa), kernel.len()) };
    assert_eq!(loaded, &kernel[..]);
    // SAFETY: as above.
    let dtb = unsafe { core::slice::from_raw_parts(at(vm.boot.dtb_ipa), vm.boot.dtb.len()) };
    assert_eq!(dtb, &vm.boot.dtb[..]);
    assert_eq!(read_page(vm, 700), vec![0; PAGE as usize]);
    assert!(hw.icache_invalidations.load(Ordering::Relaxed) > icache_before);
    // Each slot's mappings went with one flush over them (the engine may
    // widen it to the table it freed), and nothing is mapped now.
    let spans = hw.tlb.take_spans();
    assert_eq!(spans.len(), 2, "{spans:x?}");
    let covers = |span: Option<(u64, u64)>, start: u64, end: u64| {
        span.is_some_and(|(lo, hi)| lo <= start && end <= hi)
    };
    assert!(covers(spans[0], GUEST_RAM_BASE, GUEST_RAM_BASE + 4 * PAGE));
    assert!(covers(spans[1], 0x8000_0000, 0x8000_0000 + 2 * PAGE));
    let writer = vm.stage2.write();
    assert!(writer.lookup(GUEST_RAM_BASE).is_none());
    assert!(writer.lookup(0x8000_0000).is_none());
    drop(writer);
    // Running again, nothing pending.
    assert_eq!(vm.requested_state(), Requested::Running);
    assert_eq!(vm.power.state(1), PowerState::Off);
    assert!(!vm.capture_requested());
    assert!(!vm.is_stopping());
    assert_eq!(vm.counters.get(Counter::Restarts), 1);
}

/// A vCPU that records what the cycle asks of it (it never runs a guest).
#[derive(Default)]
struct FakeVcpu {
    calls: Vec<&'static str>,
}

impl CpuVcpu for FakeVcpu {
    fn run(&mut self, _: crate::vm::power::BootRequest) -> Result<Flow, StopReason> {
        self.calls.push("run");
        Ok(Flow::Off)
    }

    fn handle_interrupts_while_off(&mut self) -> Result<(), StopReason> {
        self.calls.push("interrupts");
        Ok(())
    }

    fn quiesce_for_halt(&mut self) {
        self.calls.push("quiesce");
    }

    fn end_halt(&mut self) {
        self.calls.push("end_halt");
    }
}

#[test]
fn a_reset_of_one_vm_of_two_restarts_it_alone_and_boots_its_vcpu0_again() {
    let hw = FakeHardware::new();
    let vms = create(
        hw,
        &[("a", conf(4, &[0], true)), ("b", conf(4, &[1], true))],
    );
    let table: &'static VmTable<FakeHardware> =
        Box::leak(Box::new(VmTable::new(hw, vms.clone(), 2).unwrap()));
    let (a, b) = (vms[0], vms[1]);
    a.power.mark_on(0);

    vcpu_cycle::after_run(table, a, 0, Ok(Flow::SystemReset));

    // A restart of `a` alone: it halts, `b` runs on, the machine stays on.
    assert!(a.is_stopping() && !a.has_ended());
    assert!(!b.is_stopping());
    assert!(!hw.powered_off.load(Ordering::Acquire));

    // Its only vCPU halts, finds itself the last and rebuilds the VM.
    let mut vcpu = FakeVcpu::default();
    hw.kicks.lock().unwrap().clear();
    vcpu_cycle::halt(table, a, &mut vcpu);

    assert_eq!(vcpu.calls.first(), Some(&"quiesce"));
    assert_eq!(vcpu.calls.last(), Some(&"end_halt"));
    assert!(!a.is_stopping());
    assert_eq!(a.counters.get(Counter::Restarts), 1);
    assert_eq!(a.power.take_pending(0), Some(a.boot.request));
    assert!(hw.kicks.lock().unwrap().contains(&0));
    assert_eq!(b.counters.get(Counter::Restarts), 0);

    // A stop of `b` ends it; with `a` still running the machine stays on.
    vcpu_cycle::after_run(table, b, 0, Err(StopReason::StopRequested));
    assert!(b.has_ended());
    assert!(!hw.powered_off.load(Ordering::Acquire));
}

// ---------------------------------------------------------------------------
// VM creation and the VM table

/// `vm`'s RAM as its guest sees it (`read_page`): the kernel and the device
/// tree where they were placed, zeroes everywhere else.
fn assert_ram_as_at_boot(vm: &Vm<FakeHardware>) {
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let ram = (0..spec.npages)
        .flat_map(|page| read_page(vm, page))
        .collect::<Vec<u8>>();
    let kernel = kernel();
    let kernel_at = (vm.boot.kernel_ipa - GUEST_RAM_BASE) as usize;
    let dtb_at = (vm.boot.dtb_ipa - GUEST_RAM_BASE) as usize;
    assert_eq!(&ram[kernel_at..kernel_at + kernel.len()], &kernel[..]);
    assert_eq!(&ram[dtb_at..dtb_at + vm.boot.dtb.len()], &vm.boot.dtb[..]);
    let outside = ram
        .iter()
        .enumerate()
        .filter(|&(at, _)| {
            !(kernel_at..kernel_at + kernel.len()).contains(&at)
                && !(dtb_at..dtb_at + vm.boot.dtb.len()).contains(&at)
        })
        .all(|(_, &byte)| byte == 0);
    assert!(outside, "RAM outside the boot image is not zeroed");
}

#[test]
fn a_created_vm_has_zeroed_ram_with_its_kernel_and_device_tree() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(4, &[2, 3], true))])[0];
    assert_eq!(vm.cpus, vec![2, 3]);
    assert_eq!(vm.vcpus, 2);
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    assert_eq!(spec.npages, 1024);
    assert_ram_as_at_boot(vm);
    // Kicks go to the vCPUs' own CPUs.
    vm.kick(1);
    assert_eq!(*hw.kicks.lock().unwrap(), vec![3]);
}

/// RAM is zeroed on first use: the untouched chunks of a fresh VM still
/// hold the allocator's bytes, yet the monitor's copy, a device and the
/// guest each find zeroes there, and the boot image survives its chunks'
/// first use. Deleting the RAM's slot finishes the zeroing first (a later
/// owner of the frames finds nothing left to zero there).
#[test]
fn a_created_vms_ram_is_zeroed_on_first_use_and_keeps_its_boot_image() {
    use crate::vm::lazy_zero::CHUNK;
    let hw = FakeHardware::new();
    let vm = create(hw, &[("vm", conf(16, &[2], true))])[0];
    let spec = vm_ops::slot_spec(vm, slot0()).unwrap().unwrap();
    let chunk_pages = CHUNK / PAGE;
    let untouched: Vec<u64> = (0..spec.npages / chunk_pages)
        .map(|c| c * chunk_pages)
        .filter(|&page| !vm.ram_zeroing.is_ready(spec.backing.0 + page * PAGE, PAGE))
        .collect();
    assert!(untouched.len() >= 3, "{untouched:?}");
    // SAFETY: inside the slot's backing.
    let raw = |page: u64| unsafe { *((spec.backing.0 + page * PAGE + 8) as *const u8) };
    assert!(untouched.iter().all(|&page| raw(page) == GARBAGE));
    // The monitor's copy.
    let mut buf = vec![0xffu8; 64];
    let piece = vm_ops::HostPiece {
        host: memslot::HostPhysAddr(buf.as_mut_ptr() as u64),
        len: 64,
    };
    vm_ops::read_guest(vm, GUEST_RAM_BASE + untouched[0] * PAGE, &[piece]).unwrap();
    assert_eq!(buf, vec![0; 64]);
    // A device.
    let handle = vm.collector.register();
    let word = crate::runtime::virtio_io::with_memory(vm, &handle, |memory| {
        memory.read_u64(GUEST_RAM_BASE + untouched[1] * PAGE + 8)
    });
    assert_eq!(word, Some(Ok(0)));
    assert_eq!(raw(untouched[2]), GARBAGE);
    // The guest, everywhere (`read_page` is its view): zeroes but for the
    // boot image.
    assert_ram_as_at_boot(vm);
    assert!(vm.ram_zeroing.is_finished());

    // A second VM's RAM slot deleted before its guest used it: zeroed whole
    // before the frames go back.
    let vm = create(hw, &[("vm", conf(16, &[2], true))])[0];
    let pending = vm.ram_zeroing.pending_chunks();
    assert!(pending >= 3, "{pending}");
    let spec = vm_ops::delete_slot(vm, slot0()).unwrap();
    assert!(vm.ram_zeroing.is_finished());
    // SAFETY: the fake allocator keeps what it is given back.
    let freed = unsafe {
        core::slice::from_raw_parts(spec.backing.0 as *const u8, (spec.npages * PAGE) as usize)
    };
    assert!(!freed.windows(8).any(|w| w.iter().all(|&b| b == GARBAGE)));
}

/// A control VM's `MEMORY_READ` into a buffer in a chunk it never used:
/// the chunk is zeroed before the copy, so the bytes it gets stay when the
/// caller first touches the buffer (with the zeroing left to that touch,
/// they were wiped).
#[test]
fn a_control_call_zeroes_the_callers_buffer_chunk_before_it_writes() {
    use crate::vm::lazy_zero::CHUNK;
    let hw = FakeHardware::new();
    let mut control = conf(16, &[0], true);
    control.control = Some(true);
    let vms = create(hw, &[("ctl", control), ("target", conf(8, &[1], true))]);
    let (caller, target) = (vms[0], vms[1]);
    let spec = vm_ops::slot_spec(caller, slot0()).unwrap().unwrap();
    let chunk_pages = CHUNK / PAGE;
    let buffer_page = (0..spec.npages / chunk_pages)
        .map(|c| c * chunk_pages + 3)
        .find(|&page| {
            !caller
                .ram_zeroing
                .is_ready(spec.backing.0 + page * PAGE, PAGE)
        })
        .expect("an untouched chunk");
    guest_write(target, 5, 0x77, false);
    let vms_table: &'static [&'static Vm<FakeHardware>] = Box::leak(vms.into_boxed_slice());
    let handle = caller.collector.register();
    let call = control_abi::Call::MemoryRead(control_abi::MemoryTransfer {
        vm: 1,
        ipa: GUEST_RAM_BASE + 5 * PAGE,
        buffer: GUEST_RAM_BASE + buffer_page * PAGE,
        len: PAGE,
    });
    let reply = super::control_target::handle_call(vms_table, caller, &handle, &call.encode());
    assert_eq!(reply[0], 0, "{reply:x?}");
    assert_eq!(read_page(caller, buffer_page), vec![0x77; PAGE as usize]);
}

#[test]
fn vm_creation_refuses_more_vcpus_than_cpus() {
    let hw = FakeHardware::new();
    let named = [NamedPayload {
        name: String::from("big"),
        payload: Payload {
            kernel: kernel(),
            conf: VmConf {
                vcpus: Some(8),
                ..VmConf::default()
            },
            ..Payload::default()
        },
    }];
    let archive: &'static [u8] = Vec::leak(boot_payload::write_several(&named).unwrap());
    let parsed = VmsRef::parse(archive).unwrap();
    let err = create_vm(hw, &boot_info(4), 0, &parsed.as_slice()[0], hw.hub).err();
    assert!(matches!(
        err,
        Some(VmError::TooManyVcpus {
            asked: 8,
            online: 4
        })
    ));
    assert!(
        hw.frames.lock().unwrap().is_empty(),
        "memory taken for a refused VM"
    );
}

#[test]
fn the_table_refuses_a_cpu_named_twice_and_powers_off_after_the_last_vm() {
    let hw = FakeHardware::new();
    // The payload reader refuses this already; the table checks again.
    let mut vms = create(hw, &[("a", conf(4, &[0], true))]);
    vms.extend(create(hw, &[("b", conf(4, &[1, 0], true))]));
    assert!(matches!(
        VmTable::new(hw, vms, 4),
        Err(MachineError::CpuTwice { cpu: 0, .. })
    ));
    let vms = create(
        hw,
        &[("a", conf(4, &[0], true)), ("b", conf(4, &[2], true))],
    );
    let table = VmTable::new(hw, vms.clone(), 4).unwrap();
    let (vm, vcpu) = table.assignment(2).unwrap();
    assert!(core::ptr::eq(vm, vms[1]) && vcpu == 0);
    assert!(table.assignment(1).is_none());
    table.vm_ended();
    assert!(!hw.powered_off.load(Ordering::Acquire));
    table.vm_restarted();
    table.vm_ended();
    assert!(!hw.powered_off.load(Ordering::Acquire));
    table.vm_ended();
    assert!(hw.powered_off.load(Ordering::Acquire));
}

// ---------------------------------------------------------------------------
// The monitor's and the control interface's machines

#[test]
fn the_monitor_drives_slots_and_dirty_logging_of_the_vms() {
    let (hw, vm) = mapped_vm(8);
    let vms: &'static [&'static Vm<FakeHardware>] = Vec::leak(vec![vm]);
    let mut monitor = MonitorMachine::new(hw, vms);
    let id = VmId(0);
    monitor
        .set_slot_flags(id, slot0(), SlotFlags::LOG_DIRTY)
        .unwrap();
    let cpu = vm.stage2.register().unwrap();
    guest_write_fault(vm, &cpu, 2);
    let dirty = monitor.collect_dirty(id, slot0()).unwrap();
    assert_eq!(dirty.ipa, GUEST_RAM_BASE);
    assert_eq!(set_bits(&dirty.bitmap), vec![2]);
    let request = |ipa, size| SlotRequest {
        id: SlotId::new(2).unwrap(),
        ipa,
        size,
        flags: SlotFlags::NONE,
    };
    assert!(matches!(
        monitor.add_slot(id, request(0x8000_0123, 0x4000)),
        Err(MonitorError::Unaligned { value: 0x8000_0123 })
    ));
    let backing = monitor.add_slot(id, request(0x8000_0000, 0x4000)).unwrap();
    let spec = vm_ops::slot_spec(vm, SlotId::new(2).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!((backing, spec.npages), (spec.backing.0, 4));
    let mut listed = Vec::new();
    monitor
        .slots(id, &mut |slot| listed.push(slot.id.get()))
        .unwrap();
    assert_eq!(listed, vec![0, 2]);
    assert!(matches!(
        monitor.pause(VmId(5)),
        Err(MonitorError::NoSuchVm(5))
    ));
    monitor.pause(id).unwrap();
    assert_eq!(vm.requested_state(), Requested::Paused);
    monitor.power_off().unwrap();
    assert!(hw.powered_off.load(Ordering::Acquire));
}

#[test]
fn a_byte_typed_for_a_vm_reaches_its_pl011() {
    let hw = FakeHardware::new();
    let vms: &'static [&'static Vm<FakeHardware>] = Vec::leak(create(
        hw,
        &[("a", conf(4, &[0], true)), ("b", conf(4, &[1], true))],
    ));
    let mut inputs = VmConsoleInputs::new(vms);
    assert!(inputs.push_rx(VmId(1), b'x'));
    assert!(!inputs.push_rx(VmId(7), b'y'));
    // Only `b` has a byte received (UARTRIS.RXRIS), which its guest reads
    // from the data register.
    const RXRIS: u32 = 1 << 4;
    assert_eq!(vms[0].uart.lock().device.raw_interrupts() & RXRIS, 0);
    assert_ne!(vms[1].uart.lock().device.raw_interrupts() & RXRIS, 0);
    let data = vms[1].uart.lock().device.read(0).unwrap();
    assert_eq!(data & 0xff, u32::from(b'x'));
}

// ---------------------------------------------------------------------------
// Guest calls

/// A calling vCPU: its `x0..x7`, and what was asked of the machine.
struct FakeCallingVcpu {
    vm: &'static Vm<FakeHardware>,
    x: [u64; 8],
    control_calls: usize,
    unloads: usize,
}

impl FakeCallingVcpu {
    fn calling(vm: &'static Vm<FakeHardware>, x0: u64, x1: u64) -> Self {
        Self {
            vm,
            x: [x0, x1, 0, 0, 0, 0, 0, 0],
            control_calls: 0,
            unloads: 0,
        }
    }
}

impl CallingVcpu<FakeHardware> for FakeCallingVcpu {
    fn vm(&self) -> &'static Vm<FakeHardware> {
        self.vm
    }

    fn index(&self) -> usize {
        0
    }

    fn call_args(&self) -> [u64; 8] {
        self.x
    }

    fn set_results(&mut self, out: &[u64]) {
        self.x[..out.len()].copy_from_slice(out);
    }

    fn control_call(&mut self, _: &[u64; 8]) -> [u64; 4] {
        self.control_calls += 1;
        [0; 4]
    }

    fn unload_list_registers(&mut self) -> Result<(), StopReason> {
        self.unloads += 1;
        Ok(())
    }
}

#[test]
fn guest_calls_answer_in_x0_and_psci_turns_the_vcpu_or_the_machine_off() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("a", conf(4, &[0], true))])[0];
    vm.power.mark_on(0);

    let mut vcpu = FakeCallingVcpu::calling(vm, u64::from(psci::PSCI_VERSION), 0);
    assert_eq!(guest_call::guest_call(&mut vcpu), Ok(Flow::Resume));
    assert_eq!(vcpu.x[0], psci::VERSION_1_1);

    // Not a control VM: the control range is an unknown hypercall.
    let mut vcpu = FakeCallingVcpu::calling(vm, 0xC600_0100, 0);
    assert_eq!(guest_call::guest_call(&mut vcpu), Ok(Flow::Resume));
    assert_eq!(vcpu.x[0], NOT_SUPPORTED);
    assert_eq!(vcpu.control_calls, 0);
    assert_eq!(vm.counters.get(Counter::UnknownHypercalls), 1);

    let mut vcpu = FakeCallingVcpu::calling(vm, u64::from(HV_TEST_REPORT), 0);
    assert_eq!(guest_call::guest_call(&mut vcpu), Ok(Flow::Resume));
    assert_eq!(vcpu.x[0], 0);
    assert_eq!(vm.counters.get(Counter::TestReports), 1);

    let mut vcpu = FakeCallingVcpu::calling(vm, u64::from(psci::PSCI_CPU_OFF), 0);
    assert_eq!(guest_call::guest_call(&mut vcpu), Ok(Flow::Off));
    assert_eq!(vcpu.unloads, 1);

    let mut vcpu = FakeCallingVcpu::calling(vm, u64::from(psci::PSCI_SYSTEM_OFF), 0);
    assert_eq!(guest_call::guest_call(&mut vcpu), Ok(Flow::SystemOff));
}

// ---------------------------------------------------------------------------
// Emulated device accesses

/// An accessing vCPU: its registers, and what was asked of the machine.
struct FakeAccessingVcpu {
    vm: &'static Vm<FakeHardware>,
    x: [u64; 31],
    calls: Vec<&'static str>,
    epoch: crossbeam_epoch::LocalHandle,
    handles: CollectorHandles,
}

impl FakeAccessingVcpu {
    /// vCPU 0 of `vm`, all registers 0.
    fn of(vm: &'static Vm<FakeHardware>) -> Self {
        Self {
            vm,
            x: [0; 31],
            calls: Vec::new(),
            epoch: vm.collector.register(),
            handles: CollectorHandles::new(),
        }
    }
}

impl AccessingVcpu<FakeHardware> for FakeAccessingVcpu {
    fn vm(&self) -> &'static Vm<FakeHardware> {
        self.vm
    }

    fn index(&self) -> usize {
        0
    }

    fn epoch(&self) -> &crossbeam_epoch::LocalHandle {
        &self.epoch
    }

    fn collector_handles(&self) -> &CollectorHandles {
        &self.handles
    }

    fn reg(&self, r: u8) -> u64 {
        if r == 31 { 0 } else { self.x[r as usize] }
    }

    fn set_reg(&mut self, r: u8, value: u64) {
        if r != 31 {
            self.x[r as usize] = value;
        }
    }

    fn fold_for_refill(&mut self) -> Result<(), StopReason> {
        self.calls.push("fold");
        Ok(())
    }

    fn absorb(&mut self, _: VcpuSet) {
        self.calls.push("absorb");
    }

    fn update_uart_line(&mut self) -> Result<(), StopReason> {
        self.calls.push("uart_line");
        Ok(())
    }

    fn skip_trapped_instruction(&mut self) {
        self.calls.push("skip");
    }
}

#[test]
fn a_uart_store_reaches_the_console_and_is_stepped_over() {
    let hw = FakeHardware::new();
    let vm = create(hw, &[("a", conf(4, &[0], true))])[0];
    let mut vcpu = FakeAccessingVcpu::of(vm);
    vcpu.x[3] = u64::from(b'k');
    let access = DataAccess {
        size: 4,
        sign_extend: false,
        register: 3,
        sixty_four: false,
    };
    let flow = device_access::uart_access(&mut vcpu, true, access, 0);
    assert_eq!(flow, Ok(Flow::Resume));
    assert!(hw.output.lock().unwrap().contains(&(0, b'k')));
    assert_eq!(vcpu.calls, ["uart_line", "skip"]);
}
