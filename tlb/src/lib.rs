//! Stage-2 TLB invalidation for arm64 hypervisors.
//!
//! Every stage-2 change that makes a cached translation stale must be followed
//! by a TLB invalidation. This crate decides which `TLBI` instructions to issue
//! and issues them:
//!
//! - [`TlbCaps`] says what the CPU can do (`FEAT_TLBIRANGE`, `FEAT_TTL`, VMID
//!   width), decoded from raw ID register values so nothing is assumed at
//!   compile time.
//! - [`IpaOperand`] and [`RangeOperand`] encode and decode the register operands
//!   of `TLBI IPAS2E1IS` and `TLBI RIPAS2E1IS`.
//! - [`plan_flush`] turns "invalidate `pages` pages from `ipa`" into a short
//!   [`Plan`] of operations: range operations largest scale first, a single
//!   leftover page as a per-IPA operation, and one whole-VMID invalidation when
//!   the CPU has no range instructions or the plan would be too long.
//! - [`FlushBatch`] gathers ranges during a page-table walk, merges neighbours,
//!   and flushes once at the end.
//! - [`TlbInvalidate`] is the one backend interface: the real instructions with
//!   their barrier sequences (`Aarch64Tlb`, on aarch64), and with the `model`
//!   feature a `RecordingTlb` that counts operations and a `ModelTlb` that
//!   models one TLB and walk cache per CPU, drops exactly what each operation
//!   would drop on the CPUs it reaches, and checks the break / flush / make
//!   order of every replaced entry ([`TlbInvalidate::on_break`],
//!   [`TlbInvalidate::on_make`]).
//! - [`CountingTlb`] wraps any backend and counts what it issues, by kind;
//!   [`SequenceShape`] holds the one rule for the trailing `TLBI VMALLE1(IS)`.
//!
//! ```
//! use tlb::{plan_flush, TlbCaps, TlbiOp};
//!
//! // A CPU with FEAT_TLBIRANGE (ID_AA64ISAR0_EL1.TLB = 2).
//! let caps = TlbCaps::from_id_registers(2 << 56, 2 << 4, 0);
//! // 1 GiB of 4 KiB pages is one range operation (SCALE 3, NUM 3).
//! let plan = plan_flush(0x4000_0000, 1 << 18, None, caps);
//! assert_eq!(plan.len(), 1);
//! let ops: Vec<TlbiOp> = plan.collect();
//! assert!(matches!(ops[0], TlbiOp::Range(r) if r.pages() == 1 << 18));
//! ```
#![no_std]

#[cfg(any(test, feature = "model"))]
extern crate std;

mod backend;
mod batch;
mod caps;
mod counting;
mod operand;
mod plan;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod aarch64;
#[cfg(any(test, feature = "model"))]
mod model;
#[cfg(any(test, feature = "model"))]
mod recording;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub use aarch64::Aarch64Tlb;
pub use backend::{Scope, SequenceShape, TlbInvalidate, TlbTarget};
pub use batch::{FLUSH_BATCH_CAPACITY, FlushBatch};
pub use caps::TlbCaps;
pub use counting::{CountingTlb, TlbiCounts};
#[cfg(any(test, feature = "model"))]
pub use model::{CachedTable, CachedTranslation, ModelTlb};
pub use operand::{IpaOperand, OperandError, RangeOperand, TlbiOp};
pub use plan::{MAX_PLAN_OPS, MAX_TLBI_RANGE_PAGES, PAGE_SHIFT, PAGE_SIZE, Plan, plan_flush};
#[cfg(any(test, feature = "model"))]
pub use recording::RecordingTlb;
