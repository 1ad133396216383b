//! Register operands of the stage-2 `TLBI` instructions.
//!
//! `TLBI IPAS2E1IS, Xt` takes the IPA's page number in `Xt[39:0]` and, with
//! `FEAT_TTL`, a level hint in `Xt[47:44]` (`TG << 2 | level`, TG = 0b01 for a
//! 4 KiB granule). `TLBI RIPAS2E1IS, Xt` takes a base page in `Xt[36:0]`, a
//! level hint in `[38:37]`, NUM in `[43:39]`, SCALE in `[45:44]` and TG in
//! `[47:46]`, and covers `(NUM + 1) * 2^(5 * SCALE + 1)` pages. Both types
//! encode to that `u64` and decode from it, so tests can check a plan by
//! decoding exactly what the hardware would see.

/// TG field value for the 4 KiB granule.
const TG_4K: u64 = 0b01;

/// Why an operand value could not be built or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandError {
    /// The page number does not fit the operand's address field.
    PageOutOfRange {
        /// The page number (IPA >> 12).
        page: u64,
    },
    /// A level hint other than 1, 2 or 3 (leaves exist only there with 4 KiB pages).
    BadLevel(u8),
    /// NUM above 31 or SCALE above 3.
    BadRangeField,
    /// The TG field is not the 4 KiB granule's, or reserved bits are set.
    BadEncoding(u64),
}

impl core::fmt::Display for OperandError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::PageOutOfRange { page } => {
                write!(f, "page number {page:#x} does not fit the TLBI operand")
            }
            Self::BadLevel(level) => write!(f, "level hint {level} is not a leaf level (1..=3)"),
            Self::BadRangeField => f.write_str("range NUM must be 0..=31 and SCALE 0..=3"),
            Self::BadEncoding(raw) => write!(f, "operand {raw:#x} is not a 4 KiB-granule encoding"),
        }
    }
}

fn check_level(level: Option<u8>) -> Result<(), OperandError> {
    match level {
        None | Some(1..=3) => Ok(()),
        Some(other) => Err(OperandError::BadLevel(other)),
    }
}

/// Operand of `TLBI IPAS2E1IS` / `TLBI IPAS2E1`: one page, optional level hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpaOperand {
    page: u64,
    level: Option<u8>,
}

impl IpaOperand {
    /// Largest page number the 40-bit field holds.
    pub const MAX_PAGE: u64 = (1 << 40) - 1;

    /// Builds the operand for the page `page` (IPA >> 12). `level` is the
    /// level of the leaf being removed; pass `None` where it is unknown or the
    /// CPU lacks `FEAT_TTL` (a wrong hint may leave the entry in the TLB).
    pub const fn new(page: u64, level: Option<u8>) -> Result<Self, OperandError> {
        if page > Self::MAX_PAGE {
            return Err(OperandError::PageOutOfRange { page });
        }
        if let Some(l) = level
            && !(l >= 1 && l <= 3)
        {
            return Err(OperandError::BadLevel(l));
        }
        Ok(Self { page, level })
    }

    /// The page number (IPA >> 12).
    pub const fn page(&self) -> u64 {
        self.page
    }

    /// The level hint, if any.
    pub const fn level(&self) -> Option<u8> {
        self.level
    }

    /// The `Xt` register value.
    pub const fn encode(&self) -> u64 {
        let ttl = match self.level {
            Some(l) => (TG_4K << 2) | l as u64,
            None => 0,
        };
        self.page | (ttl << 44)
    }

    /// Decodes an `Xt` value.
    pub fn decode(raw: u64) -> Result<Self, OperandError> {
        if raw & !((1 << 48) - 1) != 0 || raw & (0xf << 40) != 0 {
            return Err(OperandError::BadEncoding(raw));
        }
        let ttl = (raw >> 44) & 0xf;
        let level = match ttl {
            0 => None,
            t if t >> 2 == TG_4K => Some((t & 3) as u8),
            _ => return Err(OperandError::BadEncoding(raw)),
        };
        check_level(level)?;
        Self::new(raw & Self::MAX_PAGE, level)
    }
}

/// Operand of `TLBI RIPAS2E1IS` / `TLBI RIPAS2E1`: a run of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RangeOperand {
    base_page: u64,
    num: u8,
    scale: u8,
    level: Option<u8>,
}

impl RangeOperand {
    /// Largest base page number the 37-bit BaseADDR field holds.
    pub const MAX_BASE_PAGE: u64 = (1 << 37) - 1;

    /// Builds the operand covering `(num + 1) << (5 * scale + 1)` pages from
    /// `base_page`, with an optional level hint (TTL).
    pub const fn new(
        base_page: u64,
        num: u8,
        scale: u8,
        level: Option<u8>,
    ) -> Result<Self, OperandError> {
        if base_page > Self::MAX_BASE_PAGE {
            return Err(OperandError::PageOutOfRange { page: base_page });
        }
        if num > 31 || scale > 3 {
            return Err(OperandError::BadRangeField);
        }
        if let Some(l) = level
            && !(l >= 1 && l <= 3)
        {
            return Err(OperandError::BadLevel(l));
        }
        Ok(Self {
            base_page,
            num,
            scale,
            level,
        })
    }

    /// First page covered.
    pub const fn base_page(&self) -> u64 {
        self.base_page
    }

    /// NUM field.
    pub const fn num(&self) -> u8 {
        self.num
    }

    /// SCALE field.
    pub const fn scale(&self) -> u8 {
        self.scale
    }

    /// Level hint (TTL), if any.
    pub const fn level(&self) -> Option<u8> {
        self.level
    }

    /// Number of pages covered: `(NUM + 1) * 2^(5 * SCALE + 1)`.
    pub const fn pages(&self) -> u64 {
        (self.num as u64 + 1) << (5 * self.scale as u64 + 1)
    }

    /// The `Xt` register value.
    pub const fn encode(&self) -> u64 {
        let ttl = match self.level {
            Some(l) => l as u64,
            None => 0,
        };
        self.base_page
            | (ttl << 37)
            | ((self.num as u64) << 39)
            | ((self.scale as u64) << 44)
            | (TG_4K << 46)
    }

    /// Decodes an `Xt` value.
    pub fn decode(raw: u64) -> Result<Self, OperandError> {
        if raw >> 48 != 0 || (raw >> 46) & 3 != TG_4K {
            return Err(OperandError::BadEncoding(raw));
        }
        let ttl = ((raw >> 37) & 3) as u8;
        let level = if ttl == 0 { None } else { Some(ttl) };
        Self::new(
            raw & Self::MAX_BASE_PAGE,
            ((raw >> 39) & 31) as u8,
            ((raw >> 44) & 3) as u8,
            level,
        )
    }
}

/// One stage-2 TLB invalidation instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlbiOp {
    /// `TLBI IPAS2E1IS` (or `IPAS2E1` locally): one page.
    Ipa(IpaOperand),
    /// `TLBI RIPAS2E1IS` (or `RIPAS2E1` locally): a run of pages.
    Range(RangeOperand),
    /// `TLBI VMALLS12E1IS` (or `VMALLS12E1` locally): every stage-1 and
    /// stage-2 entry of the current VMID.
    WholeVmid,
}

impl TlbiOp {
    /// The page interval `[first, end)` this operation removes, or `None` for
    /// a whole-VMID operation.
    pub const fn pages(&self) -> Option<(u64, u64)> {
        match self {
            Self::Ipa(op) => Some((op.page(), op.page() + 1)),
            Self::Range(op) => Some((op.base_page(), op.base_page() + op.pages())),
            Self::WholeVmid => None,
        }
    }

    /// The level hint the operation carries, if any.
    pub const fn level(&self) -> Option<u8> {
        match self {
            Self::Ipa(op) => op.level(),
            Self::Range(op) => op.level(),
            Self::WholeVmid => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ipa_operand_places_page_and_ttl() {
        let op = IpaOperand::new(0x12_3456_789a, Some(3)).unwrap();
        assert_eq!(op.encode(), 0x12_3456_789a | (0b0111 << 44));
        assert_eq!(IpaOperand::new(5, None).unwrap().encode(), 5);
        assert_eq!(
            IpaOperand::new(1 << 40, None),
            Err(OperandError::PageOutOfRange { page: 1 << 40 })
        );
        assert_eq!(IpaOperand::new(1, Some(0)), Err(OperandError::BadLevel(0)));
    }

    #[test]
    fn range_operand_fields_land_where_the_architecture_says() {
        let op = RangeOperand::new(0x1_2345, 31, 3, Some(2)).unwrap();
        let raw = op.encode();
        assert_eq!(raw & ((1 << 37) - 1), 0x1_2345);
        assert_eq!((raw >> 37) & 3, 2);
        assert_eq!((raw >> 39) & 31, 31);
        assert_eq!((raw >> 44) & 3, 3);
        assert_eq!((raw >> 46) & 3, 1);
        assert_eq!(op.pages(), 32 << 16);
        // 512 pages = SCALE 1, NUM 7.
        assert_eq!(RangeOperand::new(0, 7, 1, None).unwrap().pages(), 512);
    }

    #[test]
    fn range_decode_rejects_other_granules() {
        let raw = RangeOperand::new(1, 0, 0, None).unwrap().encode();
        assert!(RangeOperand::decode(raw ^ (0b11 << 46)).is_err());
        assert!(RangeOperand::decode(raw | (1 << 50)).is_err());
    }

    proptest! {
        #[test]
        fn ipa_round_trips(page in 0..=IpaOperand::MAX_PAGE, level in proptest::option::of(1u8..=3)) {
            let op = IpaOperand::new(page, level).unwrap();
            prop_assert_eq!(IpaOperand::decode(op.encode()).unwrap(), op);
        }

        #[test]
        fn range_round_trips(base in 0..=RangeOperand::MAX_BASE_PAGE, num in 0u8..32, scale in 0u8..4,
                             level in proptest::option::of(1u8..=3)) {
            let op = RangeOperand::new(base, num, scale, level).unwrap();
            prop_assert_eq!(RangeOperand::decode(op.encode()).unwrap(), op);
        }
    }
}
