//! The pure half of the fuzz scenario: the random generator, the guest
//! memory map and what an access to each part of it must answer, the A64
//! (and A32) instruction encoders the fuzzer writes into its code pages, the
//! filter that keeps random instruction words from branching away or touching
//! memory the guest lives in, and the system-register oracles.
//!
//! Everything here is plain computation, unit tested on the host; the
//! target-only `fuzz` module executes what it builds.
//!
//! The generator is SplitMix64 seeded from `(seed, vcpu)`, so one seed gives
//! every vCPU its own stream and the same boot options replay the same
//! operations on each vCPU (the interleaving between vCPUs is up to the
//! machine).

/// SplitMix64: tiny, fast, and good enough to pick operations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `vcpu` for `seed`.
    pub fn new(seed: u64, vcpu: u64) -> Rng {
        let mut rng = Rng(seed ^ vcpu.wrapping_mul(0xd1b5_4a32_d192_ed03));
        rng.next();
        rng
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The guest's physical memory map, as its device tree describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Guest RAM `[start, end)`.
    pub ram: (u64, u64),
    /// PL011 base (a 4 KiB window).
    pub uart: u64,
    /// GIC distributor base (a 64 KiB window).
    pub gicd: u64,
    /// First redistributor (128 KiB per vCPU; none on a GICv2).
    pub gicr: u64,
    /// A GICv2's CPU interface window (`GICC`, 64 KiB: the hardware's
    /// `GICV` frame mapped at stage 2), or 0 on a GICv3.
    pub gicc: u64,
    /// vCPUs (so redistributors on a GICv3).
    pub vcpus: u64,
    /// A GICv3 ITS's two 64 KiB frames (its base), or 0 when the device
    /// tree has none: never called a hole.
    pub its: u64,
    /// The virtio-mmio windows `[start, end)` (empty when the VM has no
    /// virtio device): never called holes.
    pub virtio: (u64, u64),
    /// Virtual addresses the guest maps elsewhere than their IPA (the
    /// fuzzer's EL0 window and per-vCPU retargetable windows): never called
    /// holes.
    pub reserved: (u64, u64),
}

/// Size of the PL011 window.
pub const UART_SIZE: u64 = 0x1000;
/// Size of the distributor window.
pub const GICD_SIZE: u64 = 0x1_0000;
/// Size of one redistributor (`RD_base` + `SGI_base`).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// Size of an ITS window (control and translation frames).
pub const ITS_SIZE: u64 = 0x2_0000;
/// Size of a GICv2's CPU interface window.
pub const GICC_SIZE: u64 = 0x1_0000;
/// Top (exclusive) of the 39-bit virtual address space the guest's level-1
/// table translates.
pub const VA_LIMIT: u64 = 1 << 39;
/// Its last gigabyte is not identity mapped: the test guest maps the device
/// gigabyte there again, as normal non-cacheable memory (`mmu`'s
/// `DEVICE_ALIAS_BASE`).
pub const DEVICE_ALIAS: u64 = VA_LIMIT - (1 << 30);
/// Highest address (exclusive) the guest's identity map covers.
pub const IDENTITY_LIMIT: u64 = DEVICE_ALIAS;

/// What lies at a guest physical address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Guest RAM.
    Ram,
    /// The PL011, at this offset.
    Uart(u64),
    /// The distributor, at this offset.
    Gicd(u64),
    /// Redistributor `vcpu`, at this offset in its 128 KiB.
    Gicr(u64, u64),
    /// A GICv2's CPU interface window, at this offset.
    Gicc(u64),
    /// A virtio-mmio window, at this offset from the first.
    Virtio(u64),
    /// The ITS, at this offset.
    Its(u64),
    /// Nothing: an access must abort.
    Hole,
}

impl Layout {
    /// Whether the GIC is a GICv2 (a `GICC` window, no redistributors).
    pub fn is_gicv2(&self) -> bool {
        self.gicc != 0
    }

    /// End of the redistributor region (its start on a GICv2: empty).
    pub fn gicr_end(&self) -> u64 {
        if self.is_gicv2() {
            self.gicr
        } else {
            self.gicr + self.vcpus * GICR_STRIDE
        }
    }

    /// The region holding `address`.
    pub fn region(&self, address: u64) -> Region {
        if (self.ram.0..self.ram.1).contains(&address) {
            Region::Ram
        } else if (self.uart..self.uart + UART_SIZE).contains(&address) {
            Region::Uart(address - self.uart)
        } else if (self.gicd..self.gicd + GICD_SIZE).contains(&address) {
            Region::Gicd(address - self.gicd)
        } else if self.gicc != 0 && (self.gicc..self.gicc + GICC_SIZE).contains(&address) {
            Region::Gicc(address - self.gicc)
        } else if (self.gicr..self.gicr_end()).contains(&address) {
            let offset = address - self.gicr;
            Region::Gicr(offset / GICR_STRIDE, offset % GICR_STRIDE)
        } else if (self.virtio.0..self.virtio.1).contains(&address) {
            Region::Virtio(address - self.virtio.0)
        } else if self.its != 0 && (self.its..self.its + ITS_SIZE).contains(&address) {
            Region::Its(address - self.its)
        } else {
            Region::Hole
        }
    }

    /// Whether `[address, address + size)` lies in one hole.
    pub fn is_hole(&self, address: u64, size: u64) -> bool {
        size > 0
            && address
                .checked_add(size)
                .is_some_and(|end| end <= IDENTITY_LIMIT)
            && self.region(address) == Region::Hole
            && self.region(address + size - 1) == Region::Hole
            && !(address..address + size).contains(&self.ram.0)
            && !(address..address + size).contains(&self.uart)
            && !(address..address + size).contains(&self.gicd)
            && (self.is_gicv2() || !(address..address + size).contains(&self.gicr))
            && (!self.is_gicv2() || !(address..address + size).contains(&self.gicc))
            && (self.virtio.0 == self.virtio.1
                || !(address..address + size).contains(&self.virtio.0))
            && (self.its == 0 || !(address..address + size).contains(&self.its))
            && (address + size <= self.reserved.0 || address >= self.reserved.1)
    }

    /// A random address `size`-aligned in a hole: next to a device or RAM,
    /// anywhere below 4 GiB, or high in the identity map.
    pub fn hole(&self, rng: &mut Rng, size: u64) -> u64 {
        loop {
            let near = match rng.below(6) {
                0 => self.ram.1 + rng.below(0x10_0000),
                1 => self.uart + UART_SIZE + rng.below(0x1_0000),
                2 => self.gicd + GICD_SIZE + rng.below(0x1_0000),
                3 if self.is_gicv2() => self.gicc + GICC_SIZE + rng.below(0x10_0000),
                3 => self.gicr_end() + rng.below(0x10_0000),
                4 => rng.below(1 << 32),
                _ => rng.below(IDENTITY_LIMIT),
            };
            let address = near & !(size - 1);
            if self.is_hole(address, size) {
                return address;
            }
        }
    }
}

/// General-purpose register numbers the encoders take.
pub type Reg = u32;

/// Access widths, log2 of the byte count.
pub const SIZES: [u32; 4] = [0, 1, 2, 3];

/// Load or store of `1 << size` bytes, `Rt` at `[Rn]` (unsigned offset 0).
pub fn ldst(load: bool, size: u32, rt: Reg, rn: Reg) -> u32 {
    0x3900_0000 | (size << 30) | (u32::from(load) << 22) | (rn << 5) | rt
}

/// `LDP`/`STP` of two 64-bit (or 32-bit) registers at `[Rn]`.
pub fn pair(load: bool, wide: bool, rt: Reg, rt2: Reg, rn: Reg) -> u32 {
    let base = if wide { 0xa900_0000 } else { 0x2900_0000 };
    base | (u32::from(load) << 22) | (rt2 << 10) | (rn << 5) | rt
}

/// `LDXR` of `1 << size` bytes into `Rt` from `[Rn]`.
pub fn ldxr(size: u32, rt: Reg, rn: Reg) -> u32 {
    0x085f_7c00 | (size << 30) | (rn << 5) | rt
}

/// `STXR Ws, Rt, [Rn]` of `1 << size` bytes.
pub fn stxr(size: u32, rs: Reg, rt: Reg, rn: Reg) -> u32 {
    0x0800_7c00 | (size << 30) | (rs << 16) | (rn << 5) | rt
}

/// `LDAR` (load) or `STLR` (store) of `1 << size` bytes.
pub fn acquire_release(load: bool, size: u32, rt: Reg, rn: Reg) -> u32 {
    if load {
        0x08df_fc00 | (size << 30) | (rn << 5) | rt
    } else {
        0x089f_fc00 | (size << 30) | (rn << 5) | rt
    }
}

/// LSE atomic `LD<op>` (`op` 0..=7: ADD, CLR, EOR, SET, SMAX, SMIN, UMAX,
/// UMIN) or `SWP` (`op` 8): `Rt` = old value, `Rs` the operand.
pub fn lse(op: u32, size: u32, rs: Reg, rt: Reg, rn: Reg) -> u32 {
    let opcode = if op >= 8 { 0x8000 } else { op << 12 };
    0x3820_0000 | (size << 30) | (rs << 16) | opcode | (rn << 5) | rt
}

/// LSE `CAS Rs, Rt, [Rn]`: compares with `Rs` (which receives the old value),
/// stores `Rt`.
pub fn cas(size: u32, rs: Reg, rt: Reg, rn: Reg) -> u32 {
    0x08a0_7c00 | (size << 30) | (rs << 16) | (rn << 5) | rt
}

/// `SYS #op1, Cn, Cm, #op2, Rt`: DC, IC and AT operations.
pub fn sys(op1: u32, crn: u32, crm: u32, op2: u32, rt: Reg) -> u32 {
    0xd508_0000 | (op1 << 16) | (crn << 12) | (crm << 8) | (op2 << 5) | rt
}

/// A system register encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysReg {
    /// op0 (2 or 3).
    pub op0: u32,
    /// op1.
    pub op1: u32,
    /// CRn.
    pub crn: u32,
    /// CRm.
    pub crm: u32,
    /// op2.
    pub op2: u32,
}

impl SysReg {
    /// `(op0, op1, CRn, CRm, op2)`.
    pub const fn new(op0: u32, op1: u32, crn: u32, crm: u32, op2: u32) -> SysReg {
        SysReg {
            op0,
            op1,
            crn,
            crm,
            op2,
        }
    }

    /// A random encoding with op0 2 or 3.
    pub fn random(rng: &mut Rng) -> SysReg {
        let bits = rng.next();
        SysReg::new(
            2 + (bits & 1) as u32,
            ((bits >> 1) & 7) as u32,
            ((bits >> 4) & 15) as u32,
            ((bits >> 8) & 15) as u32,
            ((bits >> 12) & 7) as u32,
        )
    }

    fn fields(self) -> u32 {
        ((self.op0 - 2) << 19)
            | (self.op1 << 16)
            | (self.crn << 12)
            | (self.crm << 8)
            | (self.op2 << 5)
    }

    /// `MRS Rt, <reg>`.
    pub fn mrs(self, rt: Reg) -> u32 {
        0xd530_0000 | self.fields() | rt
    }

    /// `MSR <reg>, Rt`.
    pub fn msr(self, rt: Reg) -> u32 {
        0xd510_0000 | self.fields() | rt
    }

    /// In the ID register space that `HCR_EL2.TID3` traps (op0 3, op1 0,
    /// CRn 0, CRm 1..=7).
    pub fn is_id_space(self) -> bool {
        self.op0 == 3 && self.op1 == 0 && self.crn == 0 && (1..=7).contains(&self.crm)
    }

    /// A reserved encoding of the AArch64 ID space (CRm 3..=7), which reads as
    /// zero. Encodings allocated by any architecture version up to Armv9.5 are
    /// excluded, so a newer CPU model cannot make this wrong.
    pub fn is_reserved_id(self) -> bool {
        self.is_id_space()
            && matches!(
                (self.crm, self.op2),
                (3, 3)
                    | (3, 7)
                    | (4, 3)
                    | (4, 6)
                    | (5, 3)
                    | (5, 6)
                    | (5, 7)
                    | (6, 4..=7)
                    | (7, 5..=7)
            )
    }

    /// A register of EL2, EL3 or an EL12/EL02 alias (op0 3, op1 4, 5 or 6,
    /// outside the IMPLEMENTATION DEFINED CRn 11 and 15): UNDEFINED at EL1
    /// when nested virtualization is off, as it is for this guest.
    pub fn is_undefined_at_el1(self) -> bool {
        self.op0 == 3 && (4..=6).contains(&self.op1) && self.crn != 11 && self.crn != 15
    }

    /// A register a read of which changes state the fuzzer relies on:
    /// `ICC_IAR0/1_EL1` and `ICC_NMIAR1_EL1` acknowledge an interrupt.
    pub fn read_acknowledges(self) -> bool {
        self.op0 == 3
            && self.op1 == 0
            && self.crn == 12
            && matches!((self.crm, self.op2), (8, 0) | (12, 0) | (9, 5))
    }

    /// The EL1 physical timer (`CNTP_TVAL/CTL/CVAL_EL0`), and the secure one.
    pub fn is_physical_timer(self) -> bool {
        self.op0 == 3 && self.crn == 14 && self.crm == 2 && (self.op1 == 3 || self.op1 == 7)
    }

    /// An EL1 register of the GICv3 CPU interface (`ICC_*_EL1`: `PMR`, the
    /// acknowledge, EOI, binary point, active priority, SGI, control,
    /// `SRE` and group enable registers). Without that interface
    /// (`ID_AA64PFR0_EL1.GIC` 0, as on a GICv2 host) their encodings are
    /// unallocated, so UNDEFINED.
    pub fn is_gicv3_cpu_interface(self) -> bool {
        self.op0 == 3
            && self.op1 == 0
            && match (self.crn, self.crm) {
                (4, 6) => self.op2 == 0,
                (12, 8) | (12, 12) => true,
                (12, 9) => matches!(self.op2, 0..=3 | 5),
                (12, 11) => matches!(self.op2, 1 | 3 | 5..=7),
                _ => false,
            }
    }

    /// `ICC_SGI1R_EL1`, `ICC_ASGI1R_EL1`, `ICC_SGI0R_EL1`.
    pub fn is_sgi(self) -> bool {
        self.op0 == 3
            && self.op1 == 0
            && self.crn == 12
            && self.crm == 11
            && matches!(self.op2, 5..=7)
    }
}

/// `ID_AA64PFR1_EL1`, whose MTE fields guests must see as zero.
pub const ID_AA64PFR1_EL1: SysReg = SysReg::new(3, 0, 0, 4, 1);
/// `ICC_SGI1R_EL1`.
pub const ICC_SGI1R_EL1: SysReg = SysReg::new(3, 0, 12, 11, 5);

/// `HVC #imm`.
pub fn hvc(imm: u32) -> u32 {
    0xd400_0002 | ((imm & 0xffff) << 5)
}

/// `SMC #imm`.
pub fn smc(imm: u32) -> u32 {
    0xd400_0003 | ((imm & 0xffff) << 5)
}

/// `SVC #0`.
pub const SVC0: u32 = 0xd400_0001;
/// A32 `SVC #0` (condition always).
pub const A32_SVC0: u32 = 0xef00_0000;

/// `B` from `from` to `to` (within 128 MiB).
pub fn branch(from: u64, to: u64) -> u32 {
    let delta = (to.wrapping_sub(from) as i64) >> 2;
    0x1400_0000 | (delta as u32 & 0x03ff_ffff)
}

/// Whether a random A64 word may run at EL1 in the guest's code page:
/// everything but the branch, exception-generating and system group (op0
/// `x101x`: it could jump away, call the hypervisor outside the op that
/// checks the answer, or rewrite the guest's own system registers), and SVE
/// (vector-addressed gathers and scatters could reach the guest's own RAM),
/// and the FEAT_MOPS memory copy and set instructions (a random length
/// register would sweep over the guest). Every other load or store is based on a register the fuzzer set, with
/// offsets that stay in the scratch area or reach a hole or device.
pub fn el1_word_allowed(word: u32) -> bool {
    let op0 = (word >> 25) & 0xf;
    let mops = word & 0x3b20_0c00 == 0x1900_0400;
    op0 & 0b1110 != 0b1010 && op0 != 0b0010 && !mops && !aborts_qemu(word)
}

/// Whether QEMU 7.2's A64 translator aborts the whole machine on `word`
/// instead of taking an undefined-instruction exception: the AdvSIMD
/// two-register miscellaneous FP16 class, vector and scalar (`0 Q U 0111x a
/// 111100 opcode 10 Rn Rd`). Its decoder accepts some unallocated
/// operations there (the vector `FRECPX`, `0x0ef9fa96`, was seen) and then
/// reaches `g_assert_not_reached` (`disas_simd_two_reg_misc_fp16`). No
/// hypervisor can intercept a guest's instruction decode, so the fuzzer
/// leaves the class out, at EL1 and EL0.
pub fn aborts_qemu(word: u32) -> bool {
    word & 0x8f7e_0c00 == 0x0e78_0800
}

/// Whether a random A64 word may run at EL0: anything but branches (an
/// endless loop would hang the vCPU with interrupts masked). EL0 reaches
/// only its own two pages, so system instructions and exception generation
/// are fair game there.
pub fn el0_word_allowed(word: u32) -> bool {
    let branch_imm = word & 0x7c00_0000 == 0x1400_0000; // B, BL
    let compare_branch = word & 0x7e00_0000 == 0x3400_0000; // CBZ, CBNZ
    let test_branch = word & 0x7e00_0000 == 0x3600_0000; // TBZ, TBNZ
    let conditional = word & 0xff00_0000 == 0x5400_0000; // B.cond, BC.cond
    let register = word & 0xfe00_0000 == 0xd600_0000; // BR, BLR, RET, ERET...
    !(branch_imm || compare_branch || test_branch || conditional || register || aborts_qemu(word))
}

/// Whether a random A32 word may run at AArch32 EL0: no branches and nothing
/// that can write the PC (a PC write can land on the word itself and loop
/// forever with interrupts masked: `ldrcc r7, [pc], -pc, lsr #29` writes back
/// `pc + 8 - 6`, word-aligned to the word's own address).
///
/// # Which words write the PC
///
/// A32 names a written register in one of three fields: bits 15..12 (`Rd` of
/// data processing, `Rt` of loads, `RdLo`), bits 19..16 (`Rn` written back by
/// loads and stores, single, multiple, extra and coprocessor; `Rd` of `MUL`,
/// `MLA`, `SDIV`, `UDIV`, `SMLAD` and friends; `RdHi`; `Rt2` of `VMOV`/`MRRC`)
/// and the register list of `LDM`. A word with 15 in either field, or `PC` in
/// an `LDM` list, is refused (which also refuses harmless PC-relative loads).
/// The doubleword loads (`LDRD`, `LDREXD`, `LDAEXD`) write `Rt` and `Rt + 1`:
/// `Rt` 14 writes the PC. `BX`/`BLX` and the unconditional space (`BLX`
/// immediate, `RFE`) are refused outright.
pub fn a32_word_allowed(word: u32) -> bool {
    let branch = word & 0x0e00_0000 == 0x0a00_0000; // B, BL
    let unconditional = word >> 28 == 0xf;
    let rd_pc = (word >> 12) & 0xf == 0xf;
    let rn_pc = (word >> 16) & 0xf == 0xf;
    let load_multiple_pc = word & 0x0e10_8000 == 0x0810_8000; // LDM with PC
    let ldrd = word & 0x0e10_00f0 == 0x0000_00d0;
    let ldrexd = word & 0x0ff0_0eff == 0x01b0_0e9f; // LDREXD, LDAEXD
    let pair_into_pc = (ldrd || ldrexd) && (word >> 12) & 0xf == 14;
    let bx = word & 0x0ff0_00f0 & !0x0000_0020 == 0x0120_0010; // BX, BLX (reg)
    !(branch || unconditional || rd_pc || rn_pc || load_multiple_pc || pair_into_pc || bx)
}

/// SMCCC `NOT_SUPPORTED`.
pub const NOT_SUPPORTED: u64 = u64::MAX;

/// PSCI and SMCCC ids the hypervisor implements and the fuzzer may call with
/// any arguments, and their checks: `PSCI_VERSION`, `PSCI_FEATURES`,
/// `AFFINITY_INFO`, `MIGRATE_INFO_TYPE`, `SMCCC_VERSION`.
pub const SAFE_IMPLEMENTED: [u32; 5] = [
    0x8400_0000,
    0x8400_000a,
    0xc400_0004,
    0x8400_0006,
    0x8000_0000,
];

/// Every function id the hypervisor implements (for `PSCI_FEATURES`).
pub const IMPLEMENTED: [u32; 10] = [
    0x8400_0000,
    0x8400_0002,
    0xc400_0003,
    0xc400_0004,
    0x8400_0006,
    0x8400_0008,
    0x8400_0009,
    0x8400_000a,
    0x8000_0000,
    0xc600_0001,
];

/// Ids the fuzzer never calls by accident: `CPU_OFF`, `CPU_ON` (only with
/// bogus arguments, on purpose), `SYSTEM_OFF`, `SYSTEM_RESET`,
/// `SYSTEM_RESET2` (both conventions), `TEST_REPORT`.
pub fn id_is_dangerous(id: u64) -> bool {
    matches!(
        id as u32,
        0x8400_0002
            | 0xc400_0003
            | 0x8400_0008
            | 0x8400_0009
            | 0x8400_0012
            | 0xc400_0012
            | 0xc600_0001
    ) && id >> 32 == 0
}

/// Unknown function ids the default mix draws from: PSCI ids the hypervisor
/// does not implement, other SMCCC ranges, and ids with bits set above 31.
pub const UNKNOWN_POOL: [u64; 16] = [
    0x8400_0001, // CPU_SUSPEND (32-bit)
    0xc400_0001, // CPU_SUSPEND
    0x8400_0003, // CPU_ON (32-bit)
    0xc400_0005, // MIGRATE
    0x8400_000c, // CPU_DEFAULT_SUSPEND (32-bit)
    0xc400_000e, // SYSTEM_SUSPEND
    0x8400_0013, // MEM_PROTECT
    0x8000_0001, // SMCCC_ARCH_FEATURES
    0x8000_8000, // SMCCC_ARCH_WORKAROUND_1
    0xc200_0000, // SiP
    0xc300_0001, // OEM
    0xc500_0000, // standard secure service (reserved)
    0xc600_00fe, // vendor hypervisor, unimplemented
    0x0100_0000, // fast bit clear
    0x1_8400_0000,
    0xffff_ffff_ffff_ffff,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            ram: (0x4000_0000, 0x4800_0000),
            uart: 0x0900_0000,
            gicd: 0x0800_0000,
            gicr: 0x080a_0000,
            gicc: 0,
            vcpus: 4,
            its: 0,
            virtio: (0, 0),
            reserved: (0xc000_0000, 0x3_0000_0000),
        }
    }

    #[test]
    fn rng_is_reproducible_and_spread() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let first: Vec<u64> = (0..8).map(|_| a.next()).collect();
        assert_eq!(first, (0..8).map(|_| b.next()).collect::<Vec<_>>());
        assert_ne!(first, (0..8).map(|_| c.next()).collect::<Vec<_>>());
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[a.below(4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }

    #[test]
    fn regions_and_holes() {
        let l = layout();
        assert_eq!(l.region(0x4000_0000), Region::Ram);
        assert_eq!(l.region(0x0900_0018), Region::Uart(0x18));
        assert_eq!(l.region(0x0800_ffe8), Region::Gicd(0xffe8));
        assert_eq!(l.region(0x080c_0080), Region::Gicr(1, 0x80));
        assert_eq!(l.region(0x0812_0000), Region::Hole);
        assert_eq!(l.region(0x0a00_0000), Region::Hole);
        assert!(l.is_hole(0x0900_1000, 8));
        assert!(!l.is_hole(0x08ff_fffc, 8), "straddles into the UART");
        assert!(!l.is_hole(VA_LIMIT - 4, 8));
        assert!(!l.is_hole(DEVICE_ALIAS + 0x10_0000, 8), "device alias");
        assert!(l.is_hole(DEVICE_ALIAS - 8, 8));
        assert!(!l.is_hole(0xc000_1000, 8), "EL0 window");
        assert!(!l.is_hole(0x2_0000_0000, 8), "a vCPU's window");
        assert!(!l.is_hole(0xbfff_fffc, 8), "straddles into the EL0 window");
        let mut rng = Rng::new(1, 0);
        for size in [1, 2, 4, 8, 16] {
            for _ in 0..500 {
                let a = l.hole(&mut rng, size);
                assert!(l.is_hole(a, size) && a.is_multiple_of(size), "{a:#x}");
            }
        }
        // A GICv2: the CPU interface window, no redistributors.
        let v2 = Layout {
            gicr: 0,
            gicc: 0x0801_0000,
            ..l
        };
        assert_eq!(v2.region(0x0801_0004), Region::Gicc(4));
        assert_eq!(v2.region(0x080c_0080), Region::Hole);
        assert_eq!(v2.region(0), Region::Hole);
        assert!(!v2.is_hole(0x0801_fffc, 4));
        assert!(
            !v2.is_hole(0x0800_fffc, 8),
            "straddles into the GICC window"
        );
        assert!(v2.is_hole(0x0802_0000, 8));
        for _ in 0..2000 {
            let a = v2.hole(&mut rng, 8);
            assert!(!(0x0800_0000..0x0802_0000).contains(&a), "{a:#x}");
        }
        // With virtio windows, 0x0a00_0000 is a device, not a hole.
        let v = Layout {
            virtio: (0x0a00_0000, 0x0a00_0400),
            ..l
        };
        assert_eq!(v.region(0x0a00_0270), Region::Virtio(0x270));
        assert!(!v.is_hole(0x0a00_0000, 8));
        assert!(!v.is_hole(0x09ff_fffc, 8), "straddles into a virtio window");
        assert!(v.is_hole(0x0a00_0400, 8));
        for _ in 0..2000 {
            let a = v.hole(&mut rng, 8);
            assert!(!(0x0a00_0000..0x0a00_0400).contains(&a), "{a:#x}");
        }
    }

    #[test]
    fn the_its_window_is_no_hole() {
        let l = layout();
        // Without an ITS in the device tree its window is a hole.
        assert_eq!(l.region(0x0808_0040), Region::Hole);
        assert!(l.is_hole(0x0808_0000, 8));
        let its = Layout {
            its: 0x0808_0000,
            ..l
        };
        assert_eq!(its.region(0x0808_0000), Region::Its(0));
        assert_eq!(its.region(0x0809_0040), Region::Its(0x1_0040));
        assert_eq!(its.region(0x0809_fff8), Region::Its(0x1_fff8));
        assert_eq!(its.region(0x080a_0000), Region::Gicr(0, 0));
        assert!(!its.is_hole(0x0808_0000, 8));
        assert!(!its.is_hole(0x0809_fff8, 8));
        assert!(!its.is_hole(0x0807_fffc, 8), "straddles into the ITS");
        assert!(its.is_hole(0x0807_fff8, 8));
        let mut rng = Rng::new(3, 0);
        for _ in 0..5000 {
            let a = its.hole(&mut rng, 8);
            assert!(!(0x0808_0000..0x080a_0000).contains(&a), "{a:#x}");
        }
    }

    #[test]
    fn encoders_match_the_assembler() {
        assert_eq!(ldst(true, 3, 0, 2), 0xf940_0040); // ldr x0, [x2]
        assert_eq!(ldst(false, 0, 1, 3), 0x3900_0061); // strb w1, [x3]
        assert_eq!(ldst(true, 1, 0, 2), 0x7940_0040); // ldrh w0, [x2]
        assert_eq!(pair(false, true, 0, 1, 2), 0xa900_0440); // stp x0, x1, [x2]
        assert_eq!(pair(true, false, 0, 1, 2), 0x2940_0440); // ldp w0, w1, [x2]
        assert_eq!(ldxr(3, 0, 2), 0xc85f_7c40); // ldxr x0, [x2]
        assert_eq!(stxr(2, 1, 0, 2), 0x8801_7c40); // stxr w1, w0, [x2]
        assert_eq!(acquire_release(true, 3, 0, 2), 0xc8df_fc40); // ldar x0, [x2]
        assert_eq!(acquire_release(false, 2, 0, 2), 0x889f_fc40); // stlr w0, [x2]
        assert_eq!(lse(0, 3, 3, 0, 2), 0xf823_0040); // ldadd x3, x0, [x2]
        assert_eq!(lse(8, 3, 3, 0, 2), 0xf823_8040); // swp x3, x0, [x2]
        assert_eq!(cas(3, 0, 3, 2), 0xc8a0_7c43); // cas x0, x3, [x2]
        assert_eq!(sys(3, 7, 14, 1, 2), 0xd50b_7e22); // dc civac, x2
        assert_eq!(sys(0, 7, 8, 0, 2), 0xd508_7802); // at s1e1r, x2
        assert_eq!(ID_AA64PFR1_EL1.mrs(0), 0xd538_0420); // mrs x0, id_aa64pfr1_el1
        assert_eq!(ICC_SGI1R_EL1.msr(1), 0xd518_cba1); // msr icc_sgi1r_el1, x1
        assert_eq!(hvc(0), 0xd400_0002);
        assert_eq!(smc(1), 0xd400_0023);
        assert_eq!(branch(0x1000, 0x1008), 0x1400_0002);
        assert_eq!(branch(0x1008, 0x1000), 0x17ff_fffe);
    }

    #[test]
    fn filters() {
        assert!(el1_word_allowed(0xf940_0040)); // ldr
        assert!(el1_word_allowed(0x8b02_0020)); // add
        assert!(!el1_word_allowed(0x1400_0000)); // b
        assert!(!el1_word_allowed(0xd65f_03c0)); // ret
        assert!(!el1_word_allowed(0xd400_0002)); // hvc
        assert!(!el1_word_allowed(0xd503_207f)); // wfi
        assert!(!el1_word_allowed(0xd518_1000)); // msr sctlr_el1, x0
        assert!(!el1_word_allowed(0x0420_0000)); // SVE
        assert!(!el1_word_allowed(0x1900_0440)); // cpyfp [x0]!, [x2]!, x0!
        // FRECPX (vector, unallocated), which aborts QEMU 7.2, and the
        // scalar FP16 FRECPX beside it.
        assert!(!el1_word_allowed(0x0ef9_fa96));
        assert!(!el0_word_allowed(0x0ef9_fa96));
        assert!(!el1_word_allowed(0x5ef9_f800));
        // FP16 FABS (vector) is in the class; FP32 FABS is not.
        assert!(!el1_word_allowed(0x0ef8_f800));
        assert!(el1_word_allowed(0x0ea0_f800));
        assert!(!el1_word_allowed(0x1dc0_0440)); // setp [x0]!, x2!, x0
        assert!(el0_word_allowed(0xd503_207f)); // wfi traps at EL0
        assert!(el0_word_allowed(0xd400_0001)); // svc
        for word in [
            0x1400_0000,
            0x9400_0000,
            0xb400_0000,
            0x3600_0000,
            0x5400_0000,
            0xd65f_03c0,
            0xd63f_0000,
        ] {
            assert!(!el0_word_allowed(word), "{word:#x}");
        }
        assert!(a32_word_allowed(0xe081_0002)); // add r0, r1, r2
        assert!(!a32_word_allowed(0xeaff_fffe)); // b .
        assert!(!a32_word_allowed(0xe1a0_f00e)); // mov pc, lr
        assert!(!a32_word_allowed(0xe12f_ff1e)); // bx lr
        assert!(!a32_word_allowed(0xe8bd_8000)); // pop {pc}
        assert!(a32_word_allowed(0xe591_0000)); // ldr r0, [r1]
        assert!(a32_word_allowed(0xe1c0_20d0)); // ldrd r2, r3, [r0]
        assert!(a32_word_allowed(0xe000_0291)); // mul r0, r1, r2
    }

    /// A32 encodings that write the PC, as (fixed bits mask, their value);
    /// every other bit is free.
    const A32_PC_WRITERS: [(u32, u32, &str); 14] = [
        (0x0000_f000, 0x0000_f000, "Rd/Rt/RdLo = pc"),
        (0x0e00_0000, 0x0a00_0000, "b, bl"),
        (0x0ff0_00d0, 0x0120_0010, "bx, blx (register)"),
        (0x0e10_8000, 0x0810_8000, "ldm with pc in the list"),
        (0x0d0f_0000, 0x040f_0000, "ldr/str post-indexed on pc"),
        (
            0x0c2f_0000,
            0x042f_0000,
            "ldr/str pre-indexed with writeback on pc",
        ),
        (
            0x0f0f_0090,
            0x000f_0090,
            "extra load/store post-indexed on pc",
        ),
        (0x0e2f_0000, 0x082f_0000, "ldm/stm with writeback on pc"),
        (
            0x0e2f_0000,
            0x0c2f_0000,
            "ldc/vldm/vstm with writeback on pc",
        ),
        (0x0f8f_00f0, 0x000f_0090, "mul/mla pc"),
        (0x0f8f_00f0, 0x008f_0090, "umull/smull with RdHi = pc"),
        (0x0f0f_0010, 0x070f_0010, "sdiv/udiv/smlad pc (media)"),
        (0x0e10_f0f0, 0x0000_e0d0, "ldrd r14, pc"),
        (0x0ff0_feff, 0x01b0_ee9f, "ldrexd/ldaexd r14, pc"),
    ];

    proptest::proptest! {
        /// No word that can write the PC runs at AArch32 EL0, whatever its
        /// condition and free bits.
        #[test]
        fn a32_pc_writers_refused(form in 0..A32_PC_WRITERS.len(), bits: u32) {
            let (mask, value, what) = A32_PC_WRITERS[form];
            let word = (bits & !mask) | value;
            proptest::prop_assert!(!a32_word_allowed(word), "{word:#010x}: {what}");
        }
    }

    #[test]
    fn a32_seed_219_loop_refused() {
        // ldrcc r7, [pc], -pc, lsr #29: writes back its own address (seed 219).
        assert!(!a32_word_allowed(0x361f_7eaf));
    }

    #[test]
    fn sysreg_classes() {
        assert!(ID_AA64PFR1_EL1.is_id_space() && !ID_AA64PFR1_EL1.is_reserved_id());
        assert!(SysReg::new(3, 0, 0, 6, 5).is_reserved_id());
        assert!(
            !SysReg::new(3, 0, 0, 4, 7).is_reserved_id(),
            "ID_AA64FPFR0_EL1"
        );
        assert!(SysReg::new(3, 4, 1, 1, 0).is_undefined_at_el1(), "HCR_EL2");
        assert!(
            !SysReg::new(3, 0, 1, 0, 0).is_undefined_at_el1(),
            "SCTLR_EL1"
        );
        assert!(!SysReg::new(3, 4, 15, 0, 0).is_undefined_at_el1());
        assert!(
            SysReg::new(3, 0, 12, 12, 0).read_acknowledges(),
            "ICC_IAR1_EL1"
        );
        assert!(
            SysReg::new(3, 3, 14, 2, 1).is_physical_timer(),
            "CNTP_CTL_EL0"
        );
        assert!(ICC_SGI1R_EL1.is_sgi());
        assert!(ICC_SGI1R_EL1.is_gicv3_cpu_interface());
        assert!(SysReg::new(3, 0, 4, 6, 0).is_gicv3_cpu_interface(), "PMR");
        assert!(SysReg::new(3, 0, 12, 12, 5).is_gicv3_cpu_interface(), "SRE");
        assert!(!SysReg::new(3, 0, 12, 9, 4).is_gicv3_cpu_interface());
        assert!(
            !SysReg::new(3, 0, 12, 0, 0).is_gicv3_cpu_interface(),
            "VBAR"
        );
        assert!(
            !SysReg::new(3, 4, 12, 12, 5).is_gicv3_cpu_interface(),
            "EL2"
        );
        assert!(id_is_dangerous(0x8400_0008));
        assert!(!id_is_dangerous(0x1_8400_0008));
        assert!(UNKNOWN_POOL.iter().all(|&id| !id_is_dangerous(id)));
        assert!(
            UNKNOWN_POOL
                .iter()
                .all(|&id| !IMPLEMENTED.contains(&(id as u32)) || id >> 32 != 0)
        );
    }
}
