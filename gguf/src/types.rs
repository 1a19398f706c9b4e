//! ggml tensor types: ids as stored in GGUF, block sizes and bytes per block.

use std::fmt;

/// A ggml tensor type, with the id `ggml.h` gives it (ids 4, 5 and 31–33, 36–38 were
/// removed from ggml and are unknown here, as they are to llama.cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// A row length ggml cannot store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("{n} elements is not a whole number of {ty} blocks of {}", ty.block_size())]
    PartialBlock { ty: GgmlType, n: u64 },
    #[error("{n} elements of {ty} take more than 2^64 bytes")]
    TooLarge { ty: GgmlType, n: u64 },
}

const QK_K: u64 = 256;

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 35] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// The type with this id, `None` for ids ggml does not (or no longer) define.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (`blck_size` in ggml's `type_traits`).
    pub fn block_size(self) -> u64 {
        self.layout().0
    }

    /// Bytes per block (`type_size` in ggml's `type_traits`, the `sizeof` of its block).
    pub fn type_size(self) -> u64 {
        self.layout().1
    }

    /// ggml's `type_name`, e.g. `q4_1`, `q6_K`.
    pub fn name(self) -> &'static str {
        self.layout().2
    }

    /// Bytes of a row of `n` elements; a row must be whole blocks, as ggml requires.
    pub fn row_bytes(self, n: u64) -> Result<u64, RowError> {
        let (block, size, _) = self.layout();
        if n % block != 0 {
            return Err(RowError::PartialBlock { ty: self, n });
        }
        (n / block)
            .checked_mul(size)
            .ok_or(RowError::TooLarge { ty: self, n })
    }

    /// (elements per block, bytes per block, name), from ggml.c and the block structs'
    /// `static_assert`s in ggml-common.h.
    fn layout(self) -> (u64, u64, &'static str) {
        use GgmlType::*;
        match self {
            F32 => (1, 4, "f32"),
            F16 => (1, 2, "f16"),
            Q4_0 => (32, 18, "q4_0"),
            Q4_1 => (32, 20, "q4_1"),
            Q5_0 => (32, 22, "q5_0"),
            Q5_1 => (32, 24, "q5_1"),
            Q8_0 => (32, 34, "q8_0"),
            Q8_1 => (32, 36, "q8_1"),
            Q2_K => (QK_K, 84, "q2_K"),
            Q3_K => (QK_K, 110, "q3_K"),
            Q4_K => (QK_K, 144, "q4_K"),
            Q5_K => (QK_K, 176, "q5_K"),
            Q6_K => (QK_K, 210, "q6_K"),
            Q8_K => (QK_K, 292, "q8_K"),
            IQ2_XXS => (QK_K, 66, "iq2_xxs"),
            IQ2_XS => (QK_K, 74, "iq2_xs"),
            IQ3_XXS => (QK_K, 98, "iq3_xxs"),
            IQ1_S => (QK_K, 50, "iq1_s"),
            IQ4_NL => (32, 18, "iq4_nl"),
            IQ3_S => (QK_K, 110, "iq3_s"),
            IQ2_S => (QK_K, 82, "iq2_s"),
            IQ4_XS => (QK_K, 136, "iq4_xs"),
            I8 => (1, 1, "i8"),
            I16 => (1, 2, "i16"),
            I32 => (1, 4, "i32"),
            I64 => (1, 8, "i64"),
            F64 => (1, 8, "f64"),
            IQ1_M => (QK_K, 56, "iq1_m"),
            BF16 => (1, 2, "bf16"),
            TQ1_0 => (QK_K, 54, "tq1_0"),
            TQ2_0 => (QK_K, 66, "tq2_0"),
            MXFP4 => (32, 17, "mxfp4"),
            NVFP4 => (64, 36, "nvfp4"),
            Q1_0 => (128, 18, "q1_0"),
            Q2_0 => (64, 18, "q2_0"),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
        let ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ALL is in id order");
    }

    #[test]
    fn block_layouts_match_ggml() {
        let cases = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::IQ4_XS, 256, 136),
            (GgmlType::TQ1_0, 256, 54),
            (GgmlType::MXFP4, 32, 17),
        ];
        for (t, block, size) in cases {
            assert_eq!((t.block_size(), t.type_size()), (block, size), "{t}");
        }
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Ok(18 * 20));
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Ok(68));
        assert_eq!(GgmlType::F32.row_bytes(3), Ok(12));
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Ok(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(0), Ok(0));
        let err = GgmlType::Q8_0.row_bytes(33).unwrap_err();
        assert_eq!(
            err,
            RowError::PartialBlock {
                ty: GgmlType::Q8_0,
                n: 33
            }
        );
        assert!(matches!(
            GgmlType::I64.row_bytes(u64::MAX),
            Err(RowError::TooLarge { .. })
        ));
        assert_eq!(
            err.to_string(),
            "33 elements is not a whole number of q8_0 blocks of 32"
        );
    }
}
