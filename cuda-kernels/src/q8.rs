//! ggml's Q8_0: blocks of 32 signed bytes after one f16 scale, 34 bytes, 2-byte aligned.
//! A row of `k` weights is `k / 32` consecutive blocks; a matrix is its rows in order.

use half::f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block: the f16 scale, then the 32 quants.
pub const BLOCK_BYTES: usize = 34;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("a Q8_0 row of {k} weights is not a whole number of {QK}-weight blocks")]
    RowNotBlocks { k: usize },
    #[error("a {rows} x {k} Q8_0 matrix needs {need} bytes, got {got}")]
    Size {
        rows: usize,
        k: usize,
        need: usize,
        got: usize,
    },
}

/// A Q8_0 matrix borrowed from wherever it lies (a mapped GGUF file, a test buffer).
#[derive(Debug, Clone, Copy)]
pub struct Q8Matrix<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    /// Weights per row (a multiple of [`QK`]).
    pub k: usize,
}

impl<'a> Q8Matrix<'a> {
    pub fn new(bytes: &'a [u8], rows: usize, k: usize) -> Result<Self, LayoutError> {
        if k == 0 || k % QK != 0 {
            return Err(LayoutError::RowNotBlocks { k });
        }
        let need = rows * row_bytes(k);
        if bytes.len() != need {
            return Err(LayoutError::Size {
                rows,
                k,
                need,
                got: bytes.len(),
            });
        }
        Ok(Self { bytes, rows, k })
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = row_bytes(self.k);
        &self.bytes[r * n..(r + 1) * n]
    }
}

/// Bytes of one Q8_0 row of `k` weights.
pub fn row_bytes(k: usize) -> usize {
    k / QK * BLOCK_BYTES
}

/// The scale of the block starting at `block[0]`.
pub fn scale(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[0], block[1]]).to_f32()
}

/// Quantizes `x` (a multiple of [`QK`] long) into Q8_0 as ggml does: scale = max|x| / 127,
/// quants rounded to nearest.
pub fn quantize_row(x: &[f32], out: &mut Vec<u8>) {
    for chunk in x.chunks(QK) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(chunk.iter().map(|v| ((v * id).round() as i8) as u8));
    }
}

/// Dequantizes one Q8_0 row into f32.
pub fn dequantize_row(row: &[u8], out: &mut [f32]) {
    for (block, y) in row.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = scale(block);
        for (q, v) in block[2..].iter().zip(y) {
            *v = d * f32::from(*q as i8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        let mut q = Vec::new();
        quantize_row(&x, &mut q);
        assert_eq!(q.len(), 2 * BLOCK_BYTES);
        let mut y = vec![0.0; 64];
        dequantize_row(&q, &mut y);
        for (chunk, ychunk) in x.chunks(QK).zip(y.chunks(QK)) {
            let step = chunk.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in chunk.iter().zip(ychunk) {
                assert!((a - b).abs() <= step * 0.51, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        assert_eq!(
            Q8Matrix::new(&[0; 34], 1, 30).err(),
            Some(LayoutError::RowNotBlocks { k: 30 })
        );
        assert!(matches!(
            Q8Matrix::new(&[0; 33], 1, 32),
            Err(LayoutError::Size { need: 34, .. })
        ));
        assert!(Q8Matrix::new(&[0; 68], 2, 32).is_ok());
    }
}
