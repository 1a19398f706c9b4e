//! Twin of `kernels/embed.cu`: the embedding rows of some tokens, dequantized from a Q8_0
//! matrix `[n_vocab][n_embd]` into f32. Each value is `d * q`, one rounding (exact in fact:
//! an 11-bit scale times an 8-bit quant), so this equals the GPU bit for bit.

use super::vector::{check_len, ShapeError};
use crate::q8::{dequantize_row, Q8Matrix};

/// `out[t] = row tokens[t] of w`, `out` being `[tokens.len()][w.k]`. A token outside the
/// vocabulary is an error here (the kernel, which cannot report it, writes zeros).
pub fn embed(w: &Q8Matrix<'_>, tokens: &[i32], out: &mut [f32]) -> Result<(), ShapeError> {
    check_len("embed out", out.len(), tokens.len() * w.k)?;
    for (index, (&t, o)) in tokens.iter().zip(out.chunks_exact_mut(w.k)).enumerate() {
        let row = usize::try_from(t)
            .ok()
            .filter(|&r| r < w.rows)
            .ok_or(ShapeError::Token {
                index,
                token: t.into(),
                n_vocab: w.rows,
            })?;
        dequantize_row(w.row(row), o);
    }
    Ok(())
}
