//! The VM record that `LIST_VMS` writes into the caller's buffer.
//!
//! A record is [`RECORD_SIZE`] bytes, little-endian, with no padding the
//! hypervisor leaves undefined:
//!
//! | offset | size | field                                   |
//! |-------:|-----:|-----------------------------------------|
//! | 0      | 4    | VM id                                   |
//! | 4      | 4    | state: 0 running, 1 paused, 2 stopped   |
//! | 8      | 4    | vCPUs                                   |
//! | 12     | 4    | flags: bit 0 control VM                 |
//! | 16     | 8    | guest RAM in pages (all slots)          |
//! | 24     | 4    | memslots                                |
//! | 28     | 4    | reserved, zero                          |

/// Bytes per record.
pub const RECORD_SIZE: usize = 32;

/// What a VM is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmState {
    /// Its vCPUs are scheduled.
    Running,
    /// Paused by a control VM; `VM_RESUME` lets it run again.
    Paused,
    /// Stopped for good (by a control VM, or it powered itself off).
    Stopped,
}

impl VmState {
    /// The state's number in a record.
    pub const fn code(self) -> u32 {
        match self {
            Self::Running => 0,
            Self::Paused => 1,
            Self::Stopped => 2,
        }
    }

    /// The state a number names.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Running),
            1 => Some(Self::Paused),
            2 => Some(Self::Stopped),
            _ => None,
        }
    }
}

/// One VM as `LIST_VMS` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VmInfo {
    /// The VM's id, as the other calls name it.
    pub id: u32,
    /// What it is doing.
    pub state: VmState,
    /// Its vCPUs.
    pub vcpus: u32,
    /// Whether it may use the control interface.
    pub control: bool,
    /// Pages of guest RAM in all its memslots.
    pub ram_pages: u64,
    /// Its memslots.
    pub slots: u32,
}

const FLAG_CONTROL: u32 = 1 << 0;

impl VmInfo {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_SIZE] {
        let mut out = [0u8; RECORD_SIZE];
        out[0..4].copy_from_slice(&self.id.to_le_bytes());
        out[4..8].copy_from_slice(&self.state.code().to_le_bytes());
        out[8..12].copy_from_slice(&self.vcpus.to_le_bytes());
        let flags = if self.control { FLAG_CONTROL } else { 0 };
        out[12..16].copy_from_slice(&flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.ram_pages.to_le_bytes());
        out[24..28].copy_from_slice(&self.slots.to_le_bytes());
        out
    }

    /// Reads a record, or `None` when its state or flags hold values this
    /// version does not know or the reserved word is not zero.
    pub fn decode(bytes: &[u8; RECORD_SIZE]) -> Option<Self> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut ram = [0u8; 8];
        ram.copy_from_slice(&bytes[16..24]);
        let flags = u32_at(12);
        if flags & !FLAG_CONTROL != 0 || u32_at(28) != 0 {
            return None;
        }
        Some(Self {
            id: u32_at(0),
            state: VmState::from_code(u32_at(4))?,
            vcpus: u32_at(8),
            control: flags & FLAG_CONTROL != 0,
            ram_pages: u64::from_le_bytes(ram),
            slots: u32_at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = VmState> {
        prop_oneof![
            Just(VmState::Running),
            Just(VmState::Paused),
            Just(VmState::Stopped)
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip(id: u32, state in state(), vcpus: u32, control: bool, ram_pages: u64, slots: u32) {
            let info = VmInfo { id, state, vcpus, control, ram_pages, slots };
            prop_assert_eq!(VmInfo::decode(&info.encode()), Some(info));
        }

        #[test]
        fn decoded_records_are_canonical(bytes in proptest::array::uniform32(any::<u8>())) {
            if let Some(info) = VmInfo::decode(&bytes) {
                prop_assert_eq!(info.encode(), bytes);
            }
        }
    }

    #[test]
    fn layout_is_fixed() {
        let info = VmInfo {
            id: 0x0403_0201,
            state: VmState::Paused,
            vcpus: 2,
            control: true,
            ram_pages: 0x1_0000_0000,
            slots: 3,
        };
        let b = info.encode();
        assert_eq!(&b[0..4], &[1, 2, 3, 4]);
        assert_eq!(b[4], 1);
        assert_eq!(b[8], 2);
        assert_eq!(b[12], 1);
        assert_eq!(&b[16..24], &[0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(b[24], 3);
        let mut unknown_state = b;
        unknown_state[4] = 3;
        assert_eq!(VmInfo::decode(&unknown_state), None);
        let mut reserved = b;
        reserved[31] = 1;
        assert_eq!(VmInfo::decode(&reserved), None);
    }
}
