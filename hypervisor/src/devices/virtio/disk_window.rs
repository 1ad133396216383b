//! A window of sectors of another disk: sectors `start..start + sectors`
//! of a [`BlockBackend`] seen as a disk of its own (`vm.conf`
//! `disk=N@START+SECTORS`), so several VMs share one host disk without
//! reaching each other's parts.
//!
//! Sector `s` of the window is sector `start + s` of the disk behind it.
//! Every request is checked against the window, not the disk, before it
//! goes on ([`check_transfer`] with the window's size and sector numbers:
//! `Unaligned`, `OutOfRange`, `ReadOnly`); nothing reaches the disk behind
//! it then. A window is read-only when it is made so or when its disk is.

use super::block_backend::{BlockBackend, BlockError, check_transfer};
use crate::devices::guest_memory::HostSpan;
use core::fmt;

/// Why a window cannot be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowOutside {
    /// The window's first sector on the disk.
    pub start: u64,
    /// Its length in sectors.
    pub sectors: u64,
    /// The disk's size in sectors.
    pub capacity: u64,
}

impl fmt::Display for WindowOutside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sectors from sector {} do not fit a disk of {} sectors",
            self.sectors, self.start, self.capacity
        )
    }
}

impl core::error::Error for WindowOutside {}

/// Sectors `start..start + sectors` of `disk`.
pub struct DiskWindow<'a> {
    disk: &'a dyn BlockBackend,
    start: u64,
    sectors: u64,
    read_only: bool,
}

impl<'a> DiskWindow<'a> {
    /// The window of `sectors` sectors (all the rest of the disk when
    /// `None`) from sector `start` of `disk`; read-only when `read_only` or
    /// when the disk is. Refused when it does not fit inside the disk or is
    /// empty.
    pub fn new(
        disk: &'a dyn BlockBackend,
        start: u64,
        sectors: Option<u64>,
        read_only: bool,
    ) -> Result<Self, WindowOutside> {
        let capacity = disk.capacity_sectors();
        let sectors = sectors.unwrap_or(capacity.saturating_sub(start));
        let fits = start
            .checked_add(sectors)
            .is_some_and(|end| end <= capacity);
        if !fits || sectors == 0 {
            return Err(WindowOutside {
                start,
                sectors,
                capacity,
            });
        }
        Ok(Self {
            disk,
            start,
            sectors,
            read_only: read_only || disk.read_only(),
        })
    }

    /// The window's first sector on its disk.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Where a transfer of `spans` at window sector `sector` (a write when
    /// `write`) lands on the disk, once [`check_transfer`] passed it
    /// against the window.
    fn disk_sector(&self, write: bool, sector: u64, spans: &[HostSpan]) -> Result<u64, BlockError> {
        check_transfer(self.sectors, self.read_only, write, sector, spans)?;
        Ok(self.start + sector)
    }
}

impl BlockBackend for DiskWindow<'_> {
    fn capacity_sectors(&self) -> u64 {
        self.sectors
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let at = self.disk_sector(false, sector, spans)?;
        self.disk.read(at, spans)
    }

    fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
        let at = self.disk_sector(true, sector, spans)?;
        self.disk.write(at, spans)
    }

    fn flush(&self) -> Result<(), BlockError> {
        self.disk.flush()
    }

    /// The disk's identifier: a window is a part of that disk.
    fn id(&self) -> [u8; 20] {
        self.disk.id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block_backend::SECTOR_SIZE;
    use proptest::prelude::*;
    use spin::Mutex;

    /// A disk in a vector: every request is checked against its size.
    struct VecDisk {
        bytes: Mutex<Vec<u8>>,
        read_only: bool,
    }

    impl VecDisk {
        fn new(sectors: u64, read_only: bool) -> Self {
            let bytes = (0..sectors * SECTOR_SIZE)
                .map(|i| (i % 251) as u8)
                .collect();
            Self {
                bytes: Mutex::new(bytes),
                read_only,
            }
        }

        fn range(&self, sector: u64, spans: &[HostSpan]) -> Result<(usize, usize), BlockError> {
            let len: u64 = spans.iter().map(|s| s.len).sum();
            let at = sector * SECTOR_SIZE;
            if at + len > self.bytes.lock().len() as u64 {
                return Err(BlockError::OutOfRange { sector, len });
            }
            Ok((at as usize, len as usize))
        }
    }

    impl BlockBackend for VecDisk {
        fn capacity_sectors(&self) -> u64 {
            self.bytes.lock().len() as u64 / SECTOR_SIZE
        }

        fn read_only(&self) -> bool {
            self.read_only
        }

        fn read(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
            let (mut at, _) = self.range(sector, spans)?;
            let bytes = self.bytes.lock();
            for s in spans {
                // SAFETY: the tests' spans are their own buffers.
                let dst =
                    unsafe { core::slice::from_raw_parts_mut(s.addr as *mut u8, s.len as usize) };
                dst.copy_from_slice(&bytes[at..at + dst.len()]);
                at += dst.len();
            }
            Ok(())
        }

        fn write(&self, sector: u64, spans: &[HostSpan]) -> Result<(), BlockError> {
            let (mut at, _) = self.range(sector, spans)?;
            let mut bytes = self.bytes.lock();
            for s in spans {
                // SAFETY: the tests' spans are their own buffers.
                let src =
                    unsafe { core::slice::from_raw_parts(s.addr as *const u8, s.len as usize) };
                bytes[at..at + src.len()].copy_from_slice(src);
                at += src.len();
            }
            Ok(())
        }

        fn flush(&self) -> Result<(), BlockError> {
            Ok(())
        }

        fn id(&self) -> [u8; 20] {
            *b"vecdisk\0\0\0\0\0\0\0\0\0\0\0\0\0"
        }
    }

    fn span(buf: &mut [u8]) -> [HostSpan; 1] {
        [HostSpan {
            addr: buf.as_mut_ptr() as u64,
            len: buf.len() as u64,
        }]
    }

    #[test]
    fn a_window_must_fit_its_disk() {
        let disk = VecDisk::new(100, false);
        assert!(DiskWindow::new(&disk, 0, Some(100), false).is_ok());
        assert_eq!(
            DiskWindow::new(&disk, 90, Some(11), false).err(),
            Some(WindowOutside {
                start: 90,
                sectors: 11,
                capacity: 100
            })
        );
        assert!(DiskWindow::new(&disk, u64::MAX, Some(2), false).is_err());
        assert!(DiskWindow::new(&disk, 100, None, false).is_err());
        let rest = DiskWindow::new(&disk, 40, None, false).unwrap();
        assert_eq!(rest.capacity_sectors(), 60);
        assert_eq!(rest.start(), 40);
        assert_eq!(rest.id(), disk.id());
    }

    #[test]
    fn reads_and_writes_land_at_the_window_start() {
        let disk = VecDisk::new(64, false);
        let window = DiskWindow::new(&disk, 10, Some(8), false).unwrap();
        let mut buf = [0u8; 1024];
        window.read(2, &span(&mut buf)).unwrap();
        assert_eq!(buf[..], disk.bytes.lock()[12 * 512..14 * 512]);
        let mut ones = [1u8; 512];
        window.write(7, &span(&mut ones)).unwrap();
        assert!(
            disk.bytes.lock()[17 * 512..18 * 512]
                .iter()
                .all(|&b| b == 1)
        );
        assert_ne!(disk.bytes.lock()[18 * 512], 1);
    }

    #[test]
    fn read_only_windows_and_disks_refuse_writes() {
        let disk = VecDisk::new(16, false);
        let window = DiskWindow::new(&disk, 0, Some(16), true).unwrap();
        let mut buf = [7u8; 512];
        assert!(window.read_only());
        assert_eq!(window.write(0, &span(&mut buf)), Err(BlockError::ReadOnly));
        assert_eq!(window.read(0, &span(&mut buf)), Ok(()));
        let ro_disk = VecDisk::new(16, true);
        let window = DiskWindow::new(&ro_disk, 4, None, false).unwrap();
        assert!(window.read_only());
        assert_eq!(window.write(0, &span(&mut buf)), Err(BlockError::ReadOnly));
        assert_eq!(window.flush(), Ok(()));
    }

    proptest! {
        /// A request is served exactly when it lies inside the window (and
        /// is a whole number of sectors), and then touches only the disk's
        /// sectors `start + sector ..`; a refused one, read or write, is
        /// refused as the window's own check says (`block_backend` tests
        /// which refusal) and changes nothing.
        #[test]
        fn requests_stay_inside_the_window(
            start in 0u64..32,
            sectors in 1u64..32,
            sector in 0u64..70,
            whole in 0u64..40,
            ragged in prop_oneof![Just(0u64), 1u64..512],
        ) {
            let len = whole * 512 + ragged;
            let disk = VecDisk::new(64, false);
            let window = DiskWindow::new(&disk, start, Some(sectors), false);
            prop_assume!(window.is_ok());
            let window = window.unwrap();
            let before = disk.bytes.lock().clone();
            let mut buf = vec![0xeeu8; len as usize];
            let result = window.write(sector, &span(&mut buf));
            let inside = len.is_multiple_of(512) && sector + len / 512 <= sectors;
            prop_assert_eq!(result.is_ok(), inside);
            let after = disk.bytes.lock().clone();
            for (i, (a, b)) in before.iter().zip(&after).enumerate() {
                let s = i as u64 / 512;
                let written = inside && s >= start + sector && s < start + sector + len / 512;
                if written {
                    prop_assert_eq!(*b, 0xee);
                } else {
                    prop_assert_eq!(a, b);
                }
            }
            if !inside {
                let refusal = check_transfer(sectors, false, false, sector, &span(&mut buf));
                prop_assert!(refusal.is_err());
                prop_assert_eq!(result, refusal.map(|_| ()));
                prop_assert_eq!(window.read(sector, &span(&mut buf)), refusal.map(|_| ()));
            }
        }
    }
}
