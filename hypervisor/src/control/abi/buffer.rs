//! The caller's buffers: guest addresses of the control VM, translated page
//! by page through the caller's own memslots.
//!
//! A control call names its buffer by guest physical address and length.
//! The hypervisor never treats those numbers as host addresses: it looks up
//! every page the buffer touches in the caller's memslots ([`CallerMemory`])
//! and builds a list of host spans, one per page (a page-crossing buffer is
//! translated piecewise, so its pages may lie in different slots and far
//! apart in host memory).
//!
//! # Rules
//!
//! - The whole buffer is translated before anything is copied. A page that is
//!   in no slot (a hole), or, for a buffer the hypervisor writes, a page of a
//!   read-only slot, refuses the call with `BAD_ADDRESS`, and nothing is read
//!   or written.
//! - Lengths are at most [`control_abi::MAX_TRANSFER`] (checked when the call
//!   is decoded), so a buffer has at most [`MAX_SPANS`] pages and the span
//!   list is a fixed array; all address arithmetic is checked.
//! - Racing changes of the caller's slots: the dispatcher reads the slots
//!   through one `&`[`CallerMemory`] for the whole call, which for
//!   [`MemslotSet`] is the set published when the machine layer pinned its
//!   epoch guard. A concurrent delete or move (by another control VM)
//!   publishes a new set but cannot change or free the pinned one; the
//!   machine layer frees a deleted slot's backing only after the epoch has
//!   passed, so the copy lands in memory that is still the caller's (or was,
//!   at the start of the call) and never in memory given to someone else.
//! - Pages the hypervisor wrote are reported to [`CallerMemory::mark_written`]
//!   after the copy, so the caller's dirty log sees them.

use control_abi::{Error, MAX_TRANSFER, PAGE_SIZE};
use memslot::{Gfn, HostPhysAddr, MemslotSet};

/// The most pages a buffer of [`MAX_TRANSFER`] bytes can touch.
pub const MAX_SPANS: usize = (MAX_TRANSFER / PAGE_SIZE) as usize + 1;

/// One page of caller memory as the caller's memslots map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerPage {
    /// The host address of the first byte of the page.
    pub host: HostPhysAddr,
    /// Whether the caller may write it (its slot is not read-only).
    pub writable: bool,
}

/// The caller's guest memory, as the dispatcher may see it.
pub trait CallerMemory {
    /// The page behind guest frame `gfn`, or `None` when it is not caller RAM.
    fn page(&self, gfn: Gfn) -> Option<CallerPage>;

    /// Records that the hypervisor wrote guest frame `gfn` (dirty logging).
    fn mark_written(&self, gfn: Gfn);
}

impl CallerMemory for MemslotSet {
    fn page(&self, gfn: Gfn) -> Option<CallerPage> {
        let slot = self.find(gfn)?;
        Some(CallerPage {
            host: slot.translate(gfn)?,
            writable: !slot.is_read_only(),
        })
    }

    fn mark_written(&self, gfn: Gfn) {
        if let Some(slot) = self.find(gfn) {
            slot.mark_dirty(gfn);
        }
    }
}

/// A piece of a buffer that lies in one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSpan {
    /// The caller's guest frame it came from.
    pub gfn: Gfn,
    /// Its first byte in host memory.
    pub host: HostPhysAddr,
    /// Its length in bytes (1 to [`PAGE_SIZE`]).
    pub len: u64,
}

/// Whether the hypervisor reads or writes the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The hypervisor reads the buffer (`MEMORY_WRITE`).
    Read,
    /// The hypervisor writes the buffer (`MEMORY_READ`, `LIST_VMS`).
    Write,
}

/// A translated buffer: its spans in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    spans: [HostSpan; MAX_SPANS],
    count: usize,
}

impl Buffer {
    /// Translates the `len` bytes at caller guest address `start`. Fails with
    /// `INVALID_PARAMETERS` for a length over [`MAX_TRANSFER`] or a range
    /// that wraps, and with `BAD_ADDRESS` when a page is not caller RAM (or
    /// not writable, for [`Access::Write`]).
    pub fn translate(
        memory: &(impl CallerMemory + ?Sized),
        start: u64,
        len: u64,
        access: Access,
    ) -> Result<Self, Error> {
        if len > MAX_TRANSFER {
            return Err(Error::InvalidParameters);
        }
        let end = start.checked_add(len).ok_or(Error::InvalidParameters)?;
        let empty = HostSpan {
            gfn: Gfn(0),
            host: HostPhysAddr(0),
            len: 0,
        };
        let mut buffer = Self {
            spans: [empty; MAX_SPANS],
            count: 0,
        };
        let mut at = start;
        while at < end {
            let offset = at % PAGE_SIZE;
            let piece = (PAGE_SIZE - offset).min(end - at);
            let gfn = Gfn::from_ipa(at);
            let page = memory.page(gfn).ok_or(Error::BadAddress)?;
            if access == Access::Write && !page.writable {
                return Err(Error::BadAddress);
            }
            let host = page.host.0.checked_add(offset).ok_or(Error::Internal)?;
            // At most MAX_SPANS pieces: len <= MAX_TRANSFER touches at most
            // MAX_TRANSFER / PAGE_SIZE + 1 pages.
            let slot = buffer.spans.get_mut(buffer.count).ok_or(Error::Internal)?;
            *slot = HostSpan {
                gfn,
                host: HostPhysAddr(host),
                len: piece,
            };
            buffer.count += 1;
            at += piece;
        }
        Ok(buffer)
    }

    /// The spans, in buffer order.
    pub fn spans(&self) -> &[HostSpan] {
        &self.spans[..self.count]
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> u64 {
        self.spans().iter().map(|s| s.len).sum()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Reports every page of the buffer as written.
    pub fn mark_written(&self, memory: &(impl CallerMemory + ?Sized)) {
        for span in self.spans() {
            memory.mark_written(span.gfn);
        }
    }
}
