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

/// Blocks in one unit of the device layout: a warp's 32 lanes take one block each.
const UNIT: usize = 32;

/// Byte offset in a row of the device layout of quant `i` (0..32) of block `b`, `nb` blocks
/// a row (`q8m_qoff` in `kernels/q8_layout.cu`).
fn device_quant_offset(b: usize, i: usize, nb: usize) -> usize {
    let u = b / UNIT;
    let m = (nb - UNIT * u).min(UNIT);
    UNIT * QK * u + (i / 16) * 16 * m + 16 * (b % UNIT) + i % 16
}

impl Q8Matrix<'_> {
    /// The matrix in the kernels' device layout (`kernels/q8_layout.cu`), the same size:
    /// every row's quants, unit by unit of 32 blocks the blocks' first 16 quants and then
    /// their last 16, followed by every block's f16 scale in row order. Every CUDA kernel
    /// that reads weights reads this layout, so weights are converted once, at upload.
    pub fn to_device_layout(&self) -> Vec<u8> {
        device_layout(&[self])
    }
}

/// The matrices `parts` (rows of the same `k`) joined row after row, in the device layout
/// of [`Q8Matrix::to_device_layout`], without a joined copy in the GGUF layout first.
///
/// # Panics
/// If the parts' rows differ in length.
pub fn device_layout(parts: &[&Q8Matrix<'_>]) -> Vec<u8> {
    let k = parts.first().map_or(QK, |m| m.k);
    assert!(
        parts.iter().all(|m| m.k == k),
        "joined rows differ in length"
    );
    let nb = k / QK;
    let rows: usize = parts.iter().map(|m| m.rows).sum();
    let mut out = vec![0u8; rows * row_bytes(k)];
    let (quants, scales) = out.split_at_mut(rows * k);
    let all_rows = parts.iter().flat_map(|m| (0..m.rows).map(|r| m.row(r)));
    let dests = quants
        .chunks_exact_mut(k)
        .zip(scales.chunks_exact_mut(2 * nb));
    for (row, (dst, scales)) in all_rows.zip(dests) {
        for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
            for half in 0..2 {
                let at = device_quant_offset(b, 16 * half, nb);
                dst[at..at + 16].copy_from_slice(&block[2 + 16 * half..18 + 16 * half]);
            }
            scales[2 * b..2 * b + 2].copy_from_slice(&block[..2]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every quant and scale lands where the kernels read it, for a row of whole units and
    /// one with a short last unit (k = 1536: 48 blocks, units of 32 and 16).
    #[test]
    fn the_device_layout_puts_each_byte_where_the_kernels_read_it() {
        for (rows, k) in [(3, 1024), (2, 1536), (5, 576)] {
            let nb = k / QK;
            let bytes: Vec<u8> = (0..rows * row_bytes(k))
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let m = Q8Matrix::new(&bytes, rows, k).unwrap();
            let dev = m.to_device_layout();
            assert_eq!(dev.len(), bytes.len());
            for r in 0..rows {
                for b in 0..nb {
                    let block = &m.row(r)[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
                    for i in 0..QK {
                        assert_eq!(dev[r * k + device_quant_offset(b, i, nb)], block[2 + i]);
                    }
                    let s = rows * k + 2 * (r * nb + b);
                    assert_eq!(&dev[s..s + 2], &block[..2]);
                }
            }
            // A unit's first halves are 16 * m contiguous bytes: the lanes' loads cover them.
            assert_eq!(device_quant_offset(nb - 1, 31, nb) + 1, k);
            // Parts joined row after row lay out as the matrix they make.
            let (top, bottom) = bytes.split_at(row_bytes(k));
            let parts = [
                Q8Matrix::new(top, 1, k).unwrap(),
                Q8Matrix::new(bottom, rows - 1, k).unwrap(),
            ];
            assert_eq!(device_layout(&[&parts[0], &parts[1]]), dev);
        }
    }

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
