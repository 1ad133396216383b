//! The seam between the control dispatcher and the machine layer.
//!
//! [`ControlTarget`] is what the machine layer implements: the VM table, the
//! vCPU scheduler, each VM's [`memslot::Memslots`] and stage-2 tables, and
//! host memory. The dispatcher has already validated every argument's shape
//! and translated the caller's buffers, so an implementation only checks
//! what depends on its state (does the VM exist, is it paused, does the slot
//! exist) and answers with an [`Error`]. Errors of the `memslot` crate map to
//! interface errors through [`memslot_error`].

use crate::vm::migration_plan::MigrationOptions;
use control_abi::{Error, RegisterId, VmInfo};
use memslot::{DirtyLogMode, Gfn, HostPhysAddr, MemslotError, SlotFlags, SlotId};

use crate::control::abi::buffer::HostSpan;

/// A VM's id as the interface names it.
pub type VmId = u32;

/// A validated `SLOT_CREATE` request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewSlot {
    /// The slot's id.
    pub id: SlotId,
    /// Its first guest frame.
    pub base_gfn: Gfn,
    /// Its length in pages (1 to `MAX_SLOT_PAGES`, ending below `GFN_LIMIT`).
    pub npages: u64,
    /// Its flags (known bits, not logging and read-only at once).
    pub flags: SlotFlags,
}

/// What the machine layer does for the control dispatcher. Every method
/// that names a VM answers [`Error::NoSuchVm`] for an id that names none; the
/// dispatcher never passes the caller's own id.
pub trait ControlTarget {
    /// The capability bits (`control_abi::Capabilities`) of the function
    /// groups this machine layer implements; a group it leaves out answers
    /// [`Error::NotSupported`].
    fn capabilities(&self) -> u64;

    /// VMs the hypervisor runs (in any state).
    fn vm_count(&self) -> usize;

    /// The VM at `index` in id order, or `None` past the end.
    fn vm_info(&self, index: usize) -> Option<VmInfo>;

    /// Stops scheduling the VM's vCPUs and returns once none runs
    /// ([`Error::BadState`] when stopped; pausing a paused VM succeeds).
    fn pause(&mut self, vm: VmId) -> Result<(), Error>;

    /// Lets a paused VM run again ([`Error::BadState`] when stopped;
    /// resuming a running VM succeeds).
    fn resume(&mut self, vm: VmId) -> Result<(), Error>;

    /// Stops the VM for good (stopping a stopped VM succeeds).
    fn stop(&mut self, vm: VmId) -> Result<(), Error>;

    /// Creates a slot backed by fresh, zeroed hypervisor memory
    /// ([`Error::NoMemory`] when there is none).
    fn create_slot(&mut self, vm: VmId, slot: NewSlot) -> Result<(), Error>;

    /// Deletes a slot: unmaps it from stage 2, flushes the TLBs, and frees
    /// its backing once no reader can see it.
    fn delete_slot(&mut self, vm: VmId, id: SlotId) -> Result<(), Error>;

    /// Moves a slot to a new guest base (unmap, flush, remap lazily).
    fn move_slot(&mut self, vm: VmId, id: SlotId, base_gfn: Gfn) -> Result<(), Error>;

    /// Changes a slot's flags (dirty logging on or off).
    fn set_slot_flags(&mut self, vm: VmId, id: SlotId, flags: SlotFlags) -> Result<(), Error>;

    /// Copies the VM's guest memory from `ipa` on into the host spans, in
    /// order (their lengths add up to the transfer). [`Error::NotMapped`]
    /// when a byte of the range is not guest RAM of the VM; the
    /// implementation translates the whole range under one epoch guard of
    /// the VM before it copies.
    fn read_memory(&mut self, vm: VmId, ipa: u64, dst: &[HostSpan]) -> Result<(), Error>;

    /// Copies the host spans, in order, into the VM's guest memory from `ipa`
    /// on, marking the pages dirty in logging slots and making the writes
    /// visible to the VM's instruction fetches (cache maintenance).
    /// [`Error::NotMapped`] when a byte of the range is not writable guest
    /// RAM of the VM.
    fn write_memory(&mut self, vm: VmId, ipa: u64, src: &[HostSpan]) -> Result<(), Error>;

    /// Writes `bytes` to host memory at `dst`: a span the dispatcher
    /// translated from the caller's buffer (for `LIST_VMS` records).
    fn write_host(&mut self, dst: HostPhysAddr, bytes: &[u8]);

    /// A register of a vCPU of a paused VM ([`Error::BadState`] when the VM
    /// runs, [`Error::NoSuchVcpu`], [`Error::InvalidParameters`] for a system
    /// register the hypervisor does not keep).
    fn get_register(&mut self, vm: VmId, vcpu: u32, reg: RegisterId) -> Result<u64, Error>;

    /// Sets a register of a vCPU of a paused VM (errors as `get_register`,
    /// plus [`Error::InvalidParameters`] for a value the register cannot hold).
    fn set_register(
        &mut self,
        vm: VmId,
        vcpu: u32,
        reg: RegisterId,
        value: u64,
    ) -> Result<(), Error>;

    /// Starts a live migration of `src` into `dst` (a VM waiting for one)
    /// with `options`;
    /// returns once it is posted ([`Error::BadState`] when `dst` is not
    /// waiting or `src` not running, [`Error::Busy`] when a migration into
    /// `dst` is posted already, [`Error::InvalidParameters`] when the VMs
    /// differ, [`Error::NotSupported`] when the source's state cannot be
    /// carried).
    fn migrate(&mut self, src: VmId, dst: VmId, options: MigrationOptions) -> Result<(), Error>;

    /// Reads `out.len()` bytes of host memory at `src`: a span the
    /// dispatcher translated from the caller's buffer (`DIRTY_LOG_CLEAR`'s
    /// mask).
    fn read_host(&mut self, src: HostPhysAddr, out: &mut [u8]);

    /// `DIRTY_LOG_GET`: the slot's dirty bitmap into `out` (bit `i` is page
    /// `i` of the slot); returns the pages reported. Without manual
    /// protection the reported pages are taken and write-protected again.
    /// [`Error::InvalidParameters`] when the slot does not log or `out` is
    /// shorter than the bitmap.
    fn dirty_log_get(&mut self, vm: VmId, id: SlotId, out: &mut [u64]) -> Result<u64, Error>;

    /// `DIRTY_LOG_CLEAR` (manual protection): clears the pages of `mask`
    /// (bit `i` is page `first_page + i`) from the slot's log and
    /// write-protects those that were dirty, which `mask` holds on return;
    /// returns how many.
    fn dirty_log_clear(
        &mut self,
        vm: VmId,
        id: SlotId,
        first_page: u64,
        mask: &mut [u64],
    ) -> Result<u64, Error>;

    /// `DIRTY_LOG_CONFIG`: the VM's dirty-log mode (refused while one of its
    /// slots logs) and eager split chunk size in bytes (0: off).
    fn dirty_log_config(
        &mut self,
        vm: VmId,
        mode: DirtyLogMode,
        eager_chunk: u64,
    ) -> Result<(), Error>;
}

/// The interface error for a refused memslot operation.
pub fn memslot_error(e: MemslotError) -> Error {
    match e {
        MemslotError::NoSuchSlot(_) => Error::NoSuchSlot,
        MemslotError::IdInUse(_) | MemslotError::GuestOverlap { .. } => Error::Conflict,
        MemslotError::IdOutOfRange(_)
        | MemslotError::ZeroSize
        | MemslotError::TooManyPages(_)
        | MemslotError::MisalignedBacking(_)
        | MemslotError::GfnRangeOutOfBounds { .. }
        | MemslotError::BackingRangeOverflow { .. }
        | MemslotError::UnknownFlags(_)
        | MemslotError::DirtyLogOnReadOnly(_)
        | MemslotError::SizeChange { .. }
        | MemslotError::BackingChange(_)
        | MemslotError::ReadOnlyChange(_)
        | MemslotError::NotLogging(_)
        | MemslotError::ManualProtectDisabled
        | MemslotError::InitiallySetNeedsManualProtect
        | MemslotError::LoggingActive(_)
        | MemslotError::DirtyBufferTooSmall { .. }
        | MemslotError::DirtyClearUnaligned(_)
        | MemslotError::DirtyClearOutOfRange { .. }
        | MemslotError::NotAMove(_) => Error::InvalidParameters,
        // The machine layer's own mistakes, not the caller's.
        MemslotError::ForeignCollector | MemslotError::WriterPinned => Error::Internal,
    }
}
