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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Mutex;

    /// Records deliveries; ports in `refuse` do not take frames.
    #[derive(Default)]
    struct Recorder {
        got: Mutex<Vec<(PortId, u64, Vec<u8>)>>,
        refuse: Vec<PortId>,
    }

    impl PortSink for Recorder {
        fn deliver(&self, port: PortId, owner: u64, frame: &[u8]) -> bool {
            self.got.lock().unwrap().push((port, owner, frame.to_vec()));
            !self.refuse.contains(&port)
        }
    }

    impl Recorder {
        fn ports(&self) -> Vec<PortId> {
            let mut p: Vec<PortId> = self
                .got
                .lock()
                .unwrap()
                .drain(..)
                .map(|(p, _, _)| p)
                .collect();
            p.sort();
            p
        }
    }

    fn mac(n: u8) -> [u8; 6] {
        [0x52, 0x54, 0, 0, 0, n]
    }

    const BROADCAST: [u8; 6] = [0xff; 6];

    fn eth(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[0xab; 46]);
        f
    }

    #[test]
    fn broadcast_floods_learning_narrows_and_nothing_echoes() {
        let sw = NetSwitch::new();
        let a = sw.attach("lan", 10).unwrap();
        let b = sw.attach("lan", 11).unwrap();
        let c = sw.attach("lan", 12).unwrap();
        let other = sw.attach("dmz", 13).unwrap();
        let rec = Recorder::default();
        // Broadcast from a: b and c, never a, never the other network.
        let out = sw.forward(a, &eth(BROADCAST, mac(1)), &rec);
        assert_eq!(
            out,
            ForwardOutcome {
                delivered: 2,
                dropped: 0
            }
        );
        assert_eq!(rec.ports(), vec![b, c]);
        assert_eq!(sw.learned_port("lan", mac(1)), Some(a));
        // Unknown unicast floods.
        sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(rec.ports(), vec![b, c]);
        // b answers: learned, and a's MAC is known: only a gets it.
        sw.forward(b, &eth(mac(1), mac(2)), &rec);
        assert_eq!(rec.ports(), vec![a]);
        sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(rec.ports(), vec![b]);
        // Multicast goes to all others.
        sw.forward(c, &eth([0x01, 0, 0x5e, 0, 0, 1], mac(3)), &rec);
        assert_eq!(rec.ports(), vec![a, b]);
        // A frame to a MAC behind the sender itself is dropped.
        let out = sw.forward(a, &eth(mac(1), mac(1)), &rec);
        assert_eq!(
            out,
            ForwardOutcome {
                delivered: 0,
                dropped: 1
            }
        );
        assert!(rec.ports().is_empty());
        // A runt is dropped.
        assert_eq!(sw.forward(a, &[0u8; 13], &rec).dropped, 1);
        assert_eq!(sw.counters(a).unwrap().dropped_sent, 2);
        assert_eq!(sw.counters(other).unwrap(), PortCounters::default());
        assert_eq!(sw.network_of(other).as_deref(), Some("dmz"));
    }

    #[test]
    fn stopped_ports_drop_and_count_detached_ports_are_forgotten() {
        let sw = NetSwitch::new();
        let a = sw.attach("lan", 1).unwrap();
        let b = sw.attach("lan", 2).unwrap();
        let rec = Recorder::default();
        sw.forward(b, &eth(BROADCAST, mac(2)), &rec);
        rec.ports();
        sw.set_stopped(b, true).unwrap();
        let out = sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(
            out,
            ForwardOutcome {
                delivered: 0,
                dropped: 1
            }
        );
        assert!(rec.ports().is_empty());
        assert_eq!(sw.counters(b).unwrap().dropped_stopped, 1);
        sw.set_stopped(b, false).unwrap();
        sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(rec.ports(), vec![b]);
        sw.detach(b).unwrap();
        assert_eq!(sw.learned_port("lan", mac(2)), None);
        assert_eq!(sw.detach(b), Err(SwitchError::NoPort(b)));
        let out = sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(out, ForwardOutcome::default());
    }

    #[test]
    fn a_moved_port_keeps_its_macs_and_delivers_to_its_new_owner() {
        let sw = NetSwitch::new();
        let a = sw.attach("lan", 1).unwrap();
        let b = sw.attach("lan", 2).unwrap();
        let rec = Recorder::default();
        sw.forward(b, &eth(BROADCAST, mac(2)), &rec);
        rec.ports();
        sw.move_port(b, 22).unwrap();
        assert_eq!(sw.owner(b), Some(22));
        sw.forward(a, &eth(mac(2), mac(1)), &rec);
        assert_eq!(
            rec.got.lock().unwrap().as_slice(),
            &[(b, 22, eth(mac(2), mac(1)))]
        );
    }

    #[test]
    fn the_mac_table_is_bounded_and_refusals_are_counted() {
        let sw = NetSwitch::new();
        let a = sw.attach("lan", 1).unwrap();
        let b = sw.attach("lan", 2).unwrap();
        let rec = Recorder {
            refuse: vec![b],
            ..Recorder::default()
        };
        for i in 0..MAC_TABLE_SIZE + 10 {
            let src = [0x52, 0, 0, 0, (i >> 8) as u8, i as u8];
            let out = sw.forward(a, &eth(BROADCAST, src), &rec);
            assert_eq!(
                out,
                ForwardOutcome {
                    delivered: 0,
                    dropped: 1
                }
            );
        }
        assert_eq!(sw.learned_port("lan", [0x52, 0, 0, 0, 0, 0]), None);
        assert_eq!(sw.learned_port("lan", [0x52, 0, 0, 0, 1, 9]), Some(a));
        assert_eq!(
            sw.counters(b).unwrap().dropped_device,
            MAC_TABLE_SIZE as u64 + 10
        );
        let state = sw.state.read();
        assert!(
            state
                .networks
                .iter()
                .all(|n| n.macs.len() <= MAC_TABLE_SIZE)
        );
    }

    #[test]
    fn networks_and_ports_are_bounded() {
        let sw = NetSwitch::new();
        for i in 0..MAX_PORTS_PER_NETWORK {
            sw.attach("lan", i as u64).unwrap();
        }
        assert_eq!(sw.attach("lan", 0), Err(SwitchError::NetworkFull));
        for i in 1..MAX_NETWORKS {
            sw.attach(&format!("n{i}"), 0).unwrap();
        }
        assert_eq!(sw.attach("one-more", 0), Err(SwitchError::TooManyNetworks));
    }

    /// Two VMs' virtio-net devices on one network: a frame one guest
    /// transmits lands in the other guest's receive buffer, through the
    /// transmit batch and the switch, with no lock held across.
    #[test]
    fn a_frame_travels_from_one_guest_to_another() {
        use super::super::fake_guest::{DriverQueue, FakeMemory, SLOT_A, bring_up};
        use super::super::mmio_transport::{MmioTransport, REG_QUEUE_NOTIFY};
        use super::super::net::{DeliverOutcome, FrameBatch, NET_HDR_LEN, Net};

        struct Vm {
            mem: FakeMemory,
            net: Mutex<MmioTransport<Net>>,
            queues: Mutex<[DriverQueue; 2]>,
        }
        fn vm(n: u8) -> Vm {
            let mem = FakeMemory::new();
            let mut net = MmioTransport::new(Net::new(mac(n)));
            let queues = [
                DriverQueue::new(256, SLOT_A.0),
                DriverQueue::new(256, SLOT_A.0 + 0x1_0000),
            ];
            let _ = bring_up(&mut net, &mem, None, &queues);
            Vm {
                mem,
                net: Mutex::new(net),
                queues: Mutex::new(queues),
            }
        }
        struct Vms(Vec<Vm>);
        impl PortSink for Vms {
            fn deliver(&self, _port: PortId, owner: u64, frame: &[u8]) -> bool {
                let vm = &self.0[owner as usize];
                let (outcome, _effects) = vm.net.lock().unwrap().net_deliver(frame, &vm.mem);
                outcome == DeliverOutcome::Delivered
            }
        }

        let vms = Vms(vec![vm(0), vm(1)]);
        let sw = NetSwitch::new();
        let ports = [sw.attach("lan", 0).unwrap(), sw.attach("lan", 1).unwrap()];
        let buf = SLOT_A.0 + 0x4_0000;
        // VM 1 posts a receive buffer.
        {
            let mut q = vms.0[1].queues.lock().unwrap();
            let h = q[0].add_chain(&vms.0[1].mem, &[(buf, 1526, true)]);
            q[0].publish(&vms.0[1].mem, h);
        }
        // VM 0 sends a broadcast.
        let frame = eth(BROADCAST, mac(0));
        {
            let mut q = vms.0[0].queues.lock().unwrap();
            vms.0[0].mem.poke(buf, &[0; NET_HDR_LEN]);
            vms.0[0].mem.poke(buf + NET_HDR_LEN as u64, &frame);
            let h = q[1].add_chain(
                &vms.0[0].mem,
                &[(buf, (NET_HDR_LEN + frame.len()) as u32, false)],
            );
            q[1].publish(&vms.0[0].mem, h);
        }
        let mut batch = FrameBatch::new();
        {
            let mut sender = vms.0[0].net.lock().unwrap();
            let e = sender.write(REG_QUEUE_NOTIFY, 4, 1, &vms.0[0].mem);
            assert!(e.output_ready);
            let _ = sender.net_take_tx(&mut batch, &vms.0[0].mem);
        }
        for f in batch.iter() {
            assert_eq!(sw.forward(ports[0], f, &vms).delivered, 1);
        }
        let got = vms.0[1].mem.peek(buf + NET_HDR_LEN as u64, frame.len());
        assert_eq!(got, frame);
        assert_eq!(
            vms.0[1].queues.lock().unwrap()[0]
                .take_used(&vms.0[1].mem)
                .len(),
            1
        );
        assert_eq!(sw.counters(ports[1]).unwrap().received, 1);
    }

    proptest! {
        /// Random frames between ports of two networks, some stopped: a
        /// frame never reaches its sender, another network or a stopped
        /// port; broadcasts reach every other running port of the network;
        /// a unicast to a MAC last seen behind port P reaches exactly P.
        #[test]
        fn forwarding_invariants(
            frames in proptest::collection::vec((0usize..6, 0u8..8, any::<bool>()), 1..60),
            stopped in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let sw = NetSwitch::new();
            let ports: Vec<PortId> = (0..6).map(|i| sw.attach(if i < 4 { "a" } else { "b" }, i as u64).unwrap()).collect();
            let net_of = |i: usize| if i < 4 { 0 } else { 1 };
            for (i, &s) in stopped.iter().enumerate() {
                sw.set_stopped(ports[i], s).unwrap();
            }
            // Reference learning: MAC n is behind the last port that sent from it, per network.
            let mut learned: std::collections::HashMap<(usize, u8), usize> = Default::default();
            let rec = Recorder::default();
            for (from, dst, broadcast) in frames {
                // Port i sends from MAC i (unicast source).
                let dst_mac = if broadcast { BROADCAST } else { mac(dst) };
                sw.forward(ports[from], &eth(dst_mac, mac(from as u8)), &rec);
                learned.insert((net_of(from), from as u8), from);
                let got = rec.ports();
                let others: Vec<PortId> = (0..6)
                    .filter(|&i| i != from && net_of(i) == net_of(from) && !stopped[i])
                    .map(|i| ports[i])
                    .collect();
                let expected = match (broadcast, learned.get(&(net_of(from), dst))) {
                    (true, _) | (false, None) => others,
                    (false, Some(&p)) if p == from || stopped[p] => vec![],
                    (false, Some(&p)) => vec![ports[p]],
                };
                prop_assert_eq!(got, expected);
            }
        }
    }
}
