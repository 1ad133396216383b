//! The virtual ITS in a VM of the fake machine: its tables live in the
//! VM's RAM (written through the memslots, so dirty logging sees them) and
//! a live migration carries the ITS's registers, its mapped LPIs and their
//! pending state.

use super::*;
use crate::devices::guest_memory::GuestMemory;
use crate::devices::vgic::its::{CommandError, ItsWriteOutcome};
use crate::runtime::virtio_io;
use crate::vm::layout::GUEST_ITS_BASE;

/// Guest RAM addresses of the tables (the VMs have 8 MiB at 1 GiB).
const DEVICES: u64 = GUEST_RAM_BASE + 0x40_0000;
const COLLECTIONS: u64 = DEVICES + 0x8_0000;
const QUEUE: u64 = COLLECTIONS + 0x1000;
const PROPERTIES: u64 = QUEUE + 0x1000;
const PENDING: u64 = DEVICES + 0x10_0000;
pub(super) const ITT: u64 = PENDING + 0x1_0000;

/// A guest driving `vm`'s ITS through its MMIO accesses, with RAM as the
/// ITS sees it.
pub(super) struct ItsDriver {
    vm: &'static Vm<FakeHardware>,
    pub(super) handle: crossbeam_epoch::LocalHandle,
    next: u64,
}

impl ItsDriver {
    pub(super) fn new(vm: &'static Vm<FakeHardware>) -> Self {
        Self {
            vm,
            handle: vm.collector.register(),
            next: 0,
        }
    }

    fn memory<R>(&self, f: impl FnOnce(&dyn GuestMemory) -> R) -> R {
        virtio_io::with_memory(self.vm, &self.handle, f).unwrap()
    }

    fn its_write(&self, offset: u64, value: u64) -> ItsWriteOutcome {
        let size = if offset == 0 { 4 } else { 8 };
        let outcome = self.memory(|memory| {
            self.vm
                .vgic
                .lock()
                .its_write(offset, size, value, memory)
                .unwrap()
        });
        assert_eq!(outcome.dropped, 0, "{outcome:?}");
        assert_eq!(outcome.stall, None);
        outcome
    }

    /// What a guest driver does: tables, queue, property table (LPIs
    /// 8192.. enabled at priority 0x80), LPIs and group 1 enabled.
    pub(super) fn set_up(&mut self) {
        self.memory(|memory| memory.write(PROPERTIES, &[0x81; 64]).unwrap());
        self.its_write(0x100, 1 << 63 | DEVICES | 127);
        self.its_write(0x108, 1 << 63 | COLLECTIONS);
        self.its_write(0x80, 1 << 63 | QUEUE);
        let mut vgic = self.vm.vgic.lock();
        vgic.rd_base_write(0, 0x70, 8, PROPERTIES | 13).unwrap();
        vgic.rd_base_write(0, 0x78, 8, PENDING).unwrap();
        vgic.rd_base_write(0, 0, 4, 1).unwrap();
        vgic.distributor_write(0, 4, 0x12).unwrap();
        drop(vgic);
        self.its_write(0, 1);
    }

    /// Queues `commands` and runs them.
    pub(super) fn run(&mut self, commands: &[[u64; 4]]) -> ItsWriteOutcome {
        for command in commands {
            self.memory(|memory| {
                for (i, dw) in command.iter().enumerate() {
                    memory
                        .write(QUEUE + self.next + 8 * i as u64, &dw.to_le_bytes())
                        .unwrap();
                }
            });
            self.next += 32;
        }
        self.its_write(0x88, self.next)
    }
}

/// MAPD of device 0 (4 events), MAPC of collection 0 to vCPU 0, MAPTI of
/// event `event` to LPI 8192 + `event`.
fn map(event: u64) -> [[u64; 4]; 1] {
    [[0x0a, (8192 + event) << 32 | event, 0, 0]]
}

fn int(event: u64) -> [u64; 4] {
    [0x03, event, 0, 0]
}

#[test]
fn the_its_is_in_the_vm_and_its_tables_in_its_ram() {
    let (_hw, _table, src, _dst) = migration_pair();
    assert_eq!(src.vgic.lock().its_base(), Some(GUEST_ITS_BASE));
    let mut its = ItsDriver::new(src);
    its.set_up();
    its.run(&[[0x08, 1, 1 << 63 | ITT, 0], [0x09, 0, 1 << 63, 0]]);
    its.run(&map(2));
    let entry = |ipa| its.memory(|memory| memory.read_u64(ipa).unwrap());
    assert_ne!(entry(DEVICES), 0, "device 0's entry");
    assert_ne!(entry(COLLECTIONS), 0, "collection 0's entry");
    assert_ne!(entry(ITT + 2 * 8), 0, "event 2's entry");
}

#[test]
fn a_migration_carries_the_its_its_tables_and_pending_lpis() {
    let (_hw, _table, src, dst) = migration_pair();
    let mut its = ItsDriver::new(src);
    its.set_up();
    its.run(&[[0x08, 1, 1 << 63 | ITT, 0], [0x09, 0, 1 << 63, 0]]);
    its.run(&map(0));
    its.run(&[int(0)]);
    // While pre-copy runs, the guest maps another event and pends it: the
    // ITS's write of its ITT entry is logged like a vCPU's and copied again.
    let registers = |vm: &Vm<FakeHardware>| {
        let vgic = vm.vgic.lock();
        [0x80u64, 0x88, 0x90, 0x100, 0x108]
            .map(|offset| vgic.its_read(offset, 8).unwrap())
            .into_iter()
            .chain([vgic.its_read(0, 4).unwrap()])
            .collect::<Vec<_>>()
    };
    // The source's registers as the stop finds them (its vgic state moves
    // to the destination).
    let mut at_stop = Vec::new();
    let report = live_migration::migrate(src, dst, options(true, 30_000), &mut |round| {
        if round == 0 {
            its.run(&map(1));
            its.run(&[int(1)]);
        }
        at_stop = registers(src);
    })
    .unwrap();
    assert_eq!(report.differences, 0);
    assert_eq!(registers(dst), at_stop);
    // Both LPIs are pending on the destination's vCPU 0, and its ITS
    // translates from the copied tables: event 1 pends again after its
    // delivery, event 3 is not mapped.
    {
        let vgic = dst.vgic.lock();
        assert!(vgic.has_deliverable(0));
        assert_eq!(vgic.lpis.len(), 2);
        assert!(vgic.lpis.values().all(|lpi| lpi.irq.pending_latch));
    }
    let mut dst_its = ItsDriver::new(dst);
    dst_its.next = its.next;
    dst.vgic
        .lock()
        .lpis
        .get_mut(&8193)
        .unwrap()
        .irq
        .clear_pending();
    dst_its.run(&[int(1)]);
    assert!(dst.vgic.lock().lpis[&8193].irq.pending_latch);
    dst_its.memory(|memory| {
        memory
            .write(QUEUE + dst_its.next, &int(3)[0].to_le_bytes())
            .unwrap();
        memory
            .write(QUEUE + dst_its.next + 8, &int(3)[1].to_le_bytes())
            .unwrap();
    });
    let outcome = dst_its.memory(|memory| {
        dst.vgic
            .lock()
            .its_write(0x88, 8, dst_its.next + 32, memory)
            .unwrap()
    });
    assert_eq!(
        outcome.first_drop.map(|(_, e)| e),
        Some(CommandError::EventNotMapped {
            device: 0,
            event: 3
        })
    );
}
