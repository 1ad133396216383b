//! A VM's view of a host disk: the sectors `disk=N[@START+SECTORS][:ro]`
//! in its `vm.conf` names, as a [`BlockBackend`] of its own.
//!
//! The window is checked against the host disk once, when the VM is
//! created ([`DiskWindow::new`]): it must start inside the disk and end at
//! or before its last sector (a window with no length runs to the disk's
//! end). Every request is then checked against the window (a request past
//! its end fails with `OutOfRange`, whatever lies behind it on the host
//! disk) and moved by `START` sectors. `:ro`, or a read-only host disk,
//! refuses every write.

use crate::devices::virtio::block_backend::{BlockBackend, BlockError, SECTOR_SIZE};
use crate::devices::virtio::guest_memory::HostSpan;
use alloc::sync::Arc;
use boot_payload::vmconf::DiskConf;
use core::fmt;

/// Why a VM's disk window does not fit its host disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskWindowError {
    /// The window has no sectors (an empty disk, or `+0`).
    Empty,
    /// The window ends past the host disk's last sector.
    PastEnd {
        /// The window's first sector.
        start: u64,
        /// Its sectors.
        sectors: u64,
        /// The host disk's sectors.
        capacity: u64,
    },
}

impl fmt::Display for DiskWindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("the disk window has no sectors"),
            Self::PastEnd {
                start,
                sectors,
                capacity,
            } => write!(
                f,
                "sectors {start}..{} run past the host disk's end ({capacity} sectors)",
                u128::from(*start) + u128::from(*sectors)
            ),
        }
    }
}

impl core::error::Error for DiskWindowError {}

/// Sectors `start..start + sectors` of a host disk.
pub struct DiskWindow {
    disk: Arc<dyn BlockBackend>,
    start: u64,
    sectors: u64,
    read_only: bool,
}

impl DiskWindow {
    /// The window `conf` names on `disk`, checked against its size.
    pub fn new(disk: Arc<dyn BlockBackend>, conf: &DiskConf) -> Result<Self, DiskWindowError> {
        let capacity = disk.capacity_sectors();
        let start = conf.start_sector;
        let sectors = match conf.sectors {
            Some(sectors) => sectors,
            None => capacity
                .checked_sub(start)
                .ok_or(DiskWindowError::PastEnd {
                    start,
                    sectors: 0,
                    capacity,
                })?,
        };
        if start.checked_add(sectors).is_none_or(|end| end > capacity) {
            return Err(DiskWindowError::PastEnd {
                start,
                sectors,
                capacity,
            });
        }
        if sectors == 0 {
            return Err(DiskWindowError::Empty);
        }
        Ok(Self {
            read_only: conf.read_only || disk.read_only(),
            disk,
            start,
            sectors,
        })
    }

    /// The host sector of window sector `sector` for a transfer of
    /// `spans`, if the whole transfer lies inside the window.
    fn host_sector(&self, sector: u64, spans: &[HostSpan]) -> Result<u64, BlockError> {
        let len: u64 = spans.iter().map(|s| s.len).sum();
        let count = len.div_ceil(SECTOR_SIZE);
        match sector.checked_add(count) {
            Some(end) if end <= self.sectors => Ok(self.start + sector),
            _ => Err(BlockError::OutOfRange { sector, len }),
        }
    }
}

impl BlockBackend for DiskWindow {
    fn capacity_sectors(&self) -> u64 {
        self.sectors
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let at = self.host_sector(sector, spans)?;
        self.disk.read(at, spans)
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        let at = self.host_sector(sector, spans)?;
        self.disk.write(at, spans)
    }

    fn flush(&self) -> Result<(), BlockError> {
        self.disk.flush()
    }

    fn id(&self) -> [u8; 20] {
        self.disk.id()
    }
}
