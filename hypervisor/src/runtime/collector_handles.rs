//! The handles one CPU context keeps on the VMs' epoch collectors, each
//! registered once: what lets a vCPU write into another VM's memory (a
//! frame it sends over the switch) without registering a handle per frame.
//!
//! # Why
//!
//! Every VM has its own collector for its memslot sets (`Vm::collector`);
//! a device write into a VM pins that VM's memslots with a handle on that
//! collector. A vCPU holds one on its own VM's collector (its `epoch`),
//! but a frame it sends is written into the receiving VM. Registering a
//! handle there for each frame allocates the handle's local state (with
//! its garbage bag) from the heap, under the heap's lock, links it into
//! the collector's list and unlinks it when it drops: work on the hottest
//! path of a network transfer.
//!
//! # How
//!
//! [`CollectorHandles::handle`] looks the collector up among the handles
//! already registered (a short list: one per VM the context wrote into,
//! so bounded by the machine's VMs) and registers one only the first
//! time; the handles live as long as the cache. A `LocalHandle` must stay
//! on the CPU context that registered it (it is neither `Send` nor
//! `Sync`), and so does the cache, which holds them: the vCPU keeps one
//! (a vCPU runs on one CPU for its life) and lends it down the call chain
//! of a device access by reference. A context without a long-lived one
//! (the monitor's typed bytes, a migration's drain) makes one for its
//! call and registers as often as it delivers into a new VM during it.
//!
//! Handles are shared out as `Rc`s and the list is borrowed only while
//! looked up, so a nested delivery (a frame delivered into a VM whose
//! draining sends another) takes its handle while an outer one is pinned;
//! should the list ever be borrowed already, a fresh handle is registered
//! for that call instead (never a panic).

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use crossbeam_epoch::{Collector, LocalHandle};

/// Handles on epoch collectors, registered once each (see the module
/// documentation).
#[derive(Default)]
pub struct CollectorHandles {
    handles: RefCell<Vec<(&'static Collector, Rc<LocalHandle>)>>,
}

impl CollectorHandles {
    /// A cache with no handle yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle on `collector`: the one registered before, or a new one,
    /// kept from now on.
    pub fn handle(&self, collector: &'static Collector) -> Rc<LocalHandle> {
        let Ok(mut handles) = self.handles.try_borrow_mut() else {
            return Rc::new(collector.register());
        };
        if let Some((_, handle)) = handles.iter().find(|(c, _)| *c == collector) {
            return Rc::clone(handle);
        }
        let handle = Rc::new(collector.register());
        handles.push((collector, Rc::clone(&handle)));
        handle
    }

    /// How many collectors it holds a handle on.
    pub fn registered(&self) -> usize {
        self.handles.try_borrow().map_or(0, |handles| handles.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::boxed::Box;

    fn collector() -> &'static Collector {
        Box::leak(Box::new(Collector::new()))
    }

    #[test]
    fn one_handle_per_collector_registered_on_first_use() {
        let (a, b) = (collector(), collector());
        let handles = CollectorHandles::new();
        assert_eq!(handles.registered(), 0);
        let first = handles.handle(a);
        assert!(first.collector() == a);
        assert!(Rc::ptr_eq(&first, &handles.handle(a)), "registered twice");
        assert_eq!(handles.registered(), 1);
        let other = handles.handle(b);
        assert!(other.collector() == b);
        assert!(!Rc::ptr_eq(&first, &other));
        assert_eq!(handles.registered(), 2);
        assert!(Rc::ptr_eq(&other, &handles.handle(b)));
        assert_eq!(handles.registered(), 2);
    }

    #[test]
    fn handles_pin_while_others_are_taken_and_pinned() {
        let (a, b) = (collector(), collector());
        let handles = CollectorHandles::new();
        let outer = handles.handle(a);
        let outer_guard = outer.pin();
        let inner = handles.handle(b);
        let inner_guard = inner.pin();
        // The same handle pinned again while pinned: a nested delivery
        // into the VM being delivered into.
        let again = handles.handle(a);
        let again_guard = again.pin();
        assert!(outer.is_pinned() && inner.is_pinned());
        drop((again_guard, inner_guard, outer_guard));
        assert!(!outer.is_pinned() && !inner.is_pinned());
    }
}
