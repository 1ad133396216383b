//! The L2 switch between VMs' virtio-net devices: named networks, one port
//! per device, MAC learning, broadcast and flooding, never an echo.
//!
//! # Model
//!
//! A [`NetSwitch`] holds networks by name, each with its ports and its MAC
//! table. A port is a [`PortId`] plus an opaque owner (the runtime's VM
//! handle); the switch never touches a device: it hands frames to a
//! [`PortSink`] the runtime implements (which locks the receiving device and
//! calls [`super::mmio_transport::MmioTransport::net_deliver`]).
//!
//! # Forwarding ([`NetSwitch::forward`])
//!
//! 1. A frame shorter than an Ethernet header is dropped (counted on the
//!    sending port).
//! 2. Learning: a unicast source MAC is recorded as behind the sending
//!    port. The table holds at most [`MAC_TABLE_SIZE`] entries per network;
//!    when full, the oldest entry is replaced (a guest inventing MACs only
//!    makes frames flood, it cannot grow the table).
//! 3. The destination: a broadcast or multicast MAC (bit 0 of the first
//!    byte) goes to every other port of the network; a learned unicast MAC
//!    to its port, unless that is the sender (dropped: never back to the
//!    sender); an unknown unicast MAC is flooded to every other port.
//! 4. A stopped port (its VM stopped) drops what is sent to it, counted.
//!
//! The destinations are collected under the switch's read lock into an
//! array on the stack (a network has at most [`MAX_PORTS_PER_NETWORK`]
//! ports), the lock is dropped, then the sink is called: delivery never
//! holds the switch's lock, so the runtime may attach, stop or detach
//! ports from inside a device's lock without a lock cycle. Forwarding a
//! frame allocates nothing; only learning a new MAC takes the write lock.
//!
//! # Port life ([`NetSwitch::attach`], [`NetSwitch::set_stopped`],
//! [`NetSwitch::detach`], [`NetSwitch::move_port`])
//!
//! A VM's start attaches its port; stop and restart detach it (its learned
//! MACs go with it) or just mark it stopped. Migration moves the port to
//! the destination VM: the port and the MACs learned behind it stay, only
//! the owner changes.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use spin::RwLock;

/// A port's number, unique in its switch.
pub type PortId = u32;

/// Ports one network may have.
pub const MAX_PORTS_PER_NETWORK: usize = 64;
/// Learned MACs per network.
pub const MAC_TABLE_SIZE: usize = 256;
/// Networks one switch may have.
pub const MAX_NETWORKS: usize = 64;

const ETH_HDR_LEN: usize = 14;

/// Where the switch hands frames: the runtime's delivery into a VM.
pub trait PortSink {
    /// Delivers `frame` to `port`, which belongs to `owner`; returns
    /// whether the receiving device took it.
    fn deliver(&self, port: PortId, owner: u64, frame: &[u8]) -> bool;
}

/// Why a port operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchError {
    /// The network already has [`MAX_PORTS_PER_NETWORK`] ports.
    NetworkFull,
    /// The switch already has [`MAX_NETWORKS`] networks.
    TooManyNetworks,
    /// No such port.
    NoPort(PortId),
}

impl fmt::Display for SwitchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NetworkFull => write!(f, "network has {MAX_PORTS_PER_NETWORK} ports already"),
            Self::TooManyNetworks => write!(f, "switch has {MAX_NETWORKS} networks already"),
            Self::NoPort(p) => write!(f, "no switch port {p}"),
        }
    }
}

impl core::error::Error for SwitchError {}

/// What became of one frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardOutcome {
    /// Ports that took it.
    pub delivered: u32,
    /// Ports (or the switch) that dropped it.
    pub dropped: u32,
}

/// A port's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames the port sent into the switch.
    pub sent: u64,
    /// Frames delivered to the port's device.
    pub received: u64,
    /// Frames for the port dropped because it was stopped.
    pub dropped_stopped: u64,
    /// Frames for the port its device did not take (no buffer, too big).
    pub dropped_device: u64,
    /// Frames from the port dropped by the switch (runt, or addressed back
    /// to the sender).
    pub dropped_sent: u64,
}

#[derive(Debug, Default)]
struct AtomicCounters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped_stopped: AtomicU64,
    dropped_device: AtomicU64,
    dropped_sent: AtomicU64,
}

impl AtomicCounters {
    fn load(&self) -> PortCounters {
        PortCounters {
            sent: self.sent.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            dropped_stopped: self.dropped_stopped.load(Ordering::Relaxed),
            dropped_device: self.dropped_device.load(Ordering::Relaxed),
            dropped_sent: self.dropped_sent.load(Ordering::Relaxed),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug)]
struct Port {
    id: PortId,
    owner: u64,
    stopped: bool,
    counters: AtomicCounters,
}

#[derive(Clone, Copy, Debug)]
struct MacEntry {
    mac: [u8; 6],
    port: PortId,
    learned: u64,
}

#[derive(Debug)]
struct Network {
    name: String,
    ports: Vec<Port>,
    macs: Vec<MacEntry>,
}

impl Network {
    fn port(&self, id: PortId) -> Option<&Port> {
        self.ports.iter().find(|p| p.id == id)
    }

    fn lookup(&self, mac: &[u8; 6]) -> Option<PortId> {
        self.macs.iter().find(|e| &e.mac == mac).map(|e| e.port)
    }
}

#[derive(Debug, Default)]
struct SwitchState {
    networks: Vec<Network>,
    next_port: PortId,
    learn_clock: u64,
}

impl SwitchState {
    fn find(&self, port: PortId) -> Option<(usize, &Network, &Port)> {
        self.networks
            .iter()
            .enumerate()
            .find_map(|(i, n)| n.port(port).map(|p| (i, n, p)))
    }

    fn find_mut(&mut self, port: PortId) -> Option<&mut Port> {
        self.networks
            .iter_mut()
            .find_map(|n| n.ports.iter_mut().find(|p| p.id == port))
    }
}

/// The switch: every network of the hypervisor.
#[derive(Debug, Default)]
pub struct NetSwitch {
    state: RwLock<SwitchState>,
}

impl NetSwitch {
    /// A switch with no network.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches a new port for `owner` to `network` (created on first
    /// use).
    pub fn attach(&self, network: &str, owner: u64) -> Result<PortId, SwitchError> {
        let mut state = self.state.write();
        let index = match state.networks.iter().position(|n| n.name == network) {
            Some(i) => i,
            None => {
                if state.networks.len() >= MAX_NETWORKS {
                    return Err(SwitchError::TooManyNetworks);
                }
                state.networks.push(Network {
                    name: String::from(network),
                    ports: Vec::with_capacity(MAX_PORTS_PER_NETWORK),
                    macs: Vec::with_capacity(MAC_TABLE_SIZE),
                });
                state.networks.len() - 1
            }
        };
        let id = state.next_port;
        let net = state
            .networks
            .get_mut(index)
            .ok_or(SwitchError::TooManyNetworks)?;
        if net.ports.len() >= MAX_PORTS_PER_NETWORK {
            return Err(SwitchError::NetworkFull);
        }
        net.ports.push(Port {
            id,
            owner,
            stopped: false,
            counters: AtomicCounters::default(),
        });
        state.next_port = id.wrapping_add(1);
        Ok(id)
    }

    /// Removes `port` and the MACs learned behind it.
    pub fn detach(&self, port: PortId) -> Result<(), SwitchError> {
        let mut state = self.state.write();
        for net in &mut state.networks {
            if let Some(i) = net.ports.iter().position(|p| p.id == port) {
                net.ports.swap_remove(i);
                net.macs.retain(|e| e.port != port);
                return Ok(());
            }
        }
        Err(SwitchError::NoPort(port))
    }

    /// Stops (frames to it dropped and counted) or restarts `port`.
    pub fn set_stopped(&self, port: PortId, stopped: bool) -> Result<(), SwitchError> {
        let mut state = self.state.write();
        let p = state.find_mut(port).ok_or(SwitchError::NoPort(port))?;
        p.stopped = stopped;
        Ok(())
    }

    /// Moves `port` to `owner` (migration): its MACs stay learned.
    pub fn move_port(&self, port: PortId, owner: u64) -> Result<(), SwitchError> {
        let mut state = self.state.write();
        let p = state.find_mut(port).ok_or(SwitchError::NoPort(port))?;
        p.owner = owner;
        Ok(())
    }

    /// `port`'s owner.
    pub fn owner(&self, port: PortId) -> Option<u64> {
        self.state.read().find(port).map(|(_, _, p)| p.owner)
    }

    /// `port`'s network name.
    pub fn network_of(&self, port: PortId) -> Option<String> {
        self.state.read().find(port).map(|(_, n, _)| n.name.clone())
    }

    /// `port`'s counters.
    pub fn counters(&self, port: PortId) -> Option<PortCounters> {
        self.state
            .read()
            .find(port)
            .map(|(_, _, p)| p.counters.load())
    }

    /// The port `mac` was learned behind, if any.
    pub fn learned_port(&self, network: &str, mac: [u8; 6]) -> Option<PortId> {
        let state = self.state.read();
        state
            .networks
            .iter()
            .find(|n| n.name == network)
            .and_then(|n| n.lookup(&mac))
    }

    /// Records `mac` behind `port` in network `index` (write lock).
    fn learn(&self, index: usize, mac: [u8; 6], port: PortId) {
        let mut state = self.state.write();
        state.learn_clock += 1;
        let clock = state.learn_clock;
        let Some(net) = state.networks.get_mut(index) else {
            return;
        };
        // The port may have been detached between the locks.
        if net.port(port).is_none() {
            return;
        }
        let entry = MacEntry {
            mac,
            port,
            learned: clock,
        };
        if let Some(e) = net.macs.iter_mut().find(|e| e.mac == mac) {
            *e = entry;
        } else if net.macs.len() < MAC_TABLE_SIZE {
            net.macs.push(entry);
        } else if let Some(oldest) = net.macs.iter_mut().min_by_key(|e| e.learned) {
            *oldest = entry;
        }
    }

    /// Forwards `frame` from port `from` (see the module doc).
    pub fn forward(&self, from: PortId, frame: &[u8], sink: &dyn PortSink) -> ForwardOutcome {
        let mut outcome = ForwardOutcome::default();
        let (Some(dst), Some(src)) = (
            frame.get(0..6).and_then(|b| <[u8; 6]>::try_from(b).ok()),
            frame.get(6..12).and_then(|b| <[u8; 6]>::try_from(b).ok()),
        ) else {
            return self.drop_from(from);
        };
        if frame.len() < ETH_HDR_LEN {
            return self.drop_from(from);
        }
        // Learn first (a separate write-lock pass, only when needed).
        let needs_learning = {
            let state = self.state.read();
            let Some((index, net, port)) = state.find(from) else {
                outcome.dropped = 1;
                return outcome;
            };
            bump(&port.counters.sent);
            (src[0] & 1 == 0 && net.lookup(&src) != Some(from)).then_some(index)
        };
        if let Some(index) = needs_learning {
            self.learn(index, src, from);
        }
        let mut targets = [(0 as PortId, 0u64); MAX_PORTS_PER_NETWORK];
        let mut count = 0usize;
        {
            let state = self.state.read();
            let Some((_, net, sender)) = state.find(from) else {
                outcome.dropped = 1;
                return outcome;
            };
            let known = if dst[0] & 1 == 0 {
                net.lookup(&dst)
            } else {
                None
            };
            if known == Some(from) {
                bump(&sender.counters.dropped_sent);
                outcome.dropped = 1;
                return outcome;
            }
            for port in &net.ports {
                if port.id == from || known.is_some_and(|k| k != port.id) {
                    continue;
                }
                if port.stopped {
                    bump(&port.counters.dropped_stopped);
                    outcome.dropped += 1;
                    continue;
                }
                if let Some(slot) = targets.get_mut(count) {
                    *slot = (port.id, port.owner);
                    count += 1;
                }
            }
        }
        let mut results = [false; MAX_PORTS_PER_NETWORK];
        for (&(port, owner), result) in targets.iter().zip(results.iter_mut()).take(count) {
            *result = sink.deliver(port, owner, frame);
        }
        let state = self.state.read();
        for (&(port, _), &took) in targets.iter().zip(results.iter()).take(count) {
            let counters = state.find(port).map(|(_, _, p)| &p.counters);
            if took {
                outcome.delivered += 1;
                if let Some(c) = counters {
                    bump(&c.received);
                }
            } else {
                outcome.dropped += 1;
                if let Some(c) = counters {
                    bump(&c.dropped_device);
                }
            }
        }
        outcome
    }

    fn drop_from(&self, from: PortId) -> ForwardOutcome {
        if let Some((_, _, p)) = self.state.read().find(from) {
            bump(&p.counters.sent);
            bump(&p.counters.dropped_sent);
        }
        ForwardOutcome {
            delivered: 0,
            dropped: 1,
        }
    }
}
