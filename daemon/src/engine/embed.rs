//! Embeddings: how a sequence's per-token hidden states (after the final norm) become one
//! vector. Both backends feed rows into a [`Pooled`] and hand the scheduler its
//! [`finish`](Pooled::finish): pooled as the GGUF says (`<arch>.pooling_type`), mean for a
//! model that says nothing (a chat model such as SmolLM2), then L2-normalised as OpenAI's
//! embeddings are.

use serde::Serialize;

/// How the token rows of one input become its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The average of every token's row.
    Mean,
    /// The first token's row (BERT's `[CLS]`).
    Cls,
    /// The last token's row (decoder embedding models).
    Last,
}

/// A `pooling_type` the daemon does not pool by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the model's pooling type {0} ({1}) is not an embedding pooling this server implements")]
pub struct UnknownPooling(pub u32, pub &'static str);

impl Pooling {
    /// From llama.cpp's `enum llama_pooling_type` as the GGUF stores it: 0 none and absent
    /// mean (a generative model's hidden states, averaged), 1 mean, 2 CLS, 3 last; 4
    /// (rank, a reranker's score) is not an embedding.
    pub fn from_gguf(value: Option<u32>) -> Result<Self, UnknownPooling> {
        match value {
            None | Some(0) | Some(1) => Ok(Self::Mean),
            Some(2) => Ok(Self::Cls),
            Some(3) => Ok(Self::Last),
            Some(4) => Err(UnknownPooling(4, "rank")),
            Some(v) => Err(UnknownPooling(v, "unknown")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
        }
    }
}

/// One sequence's pooling in progress: rows go in as the backend computes them, in
/// position order, possibly over several steps.
#[derive(Debug, Clone)]
pub struct Pooled {
    pooling: Pooling,
    /// Mean: the running sum in f64 (so long inputs lose nothing to the order); CLS and
    /// last: the row kept.
    acc: Vec<f64>,
    rows: usize,
}

impl Pooled {
    pub fn new(pooling: Pooling) -> Self {
        Self {
            pooling,
            acc: Vec::new(),
            rows: 0,
        }
    }

    /// Adds the next token's row. Every row of a sequence has the same width.
    pub fn push(&mut self, row: &[f32]) {
        if self.acc.is_empty() {
            self.acc = vec![0.0; row.len()];
        }
        match self.pooling {
            Pooling::Mean => {
                for (a, &x) in self.acc.iter_mut().zip(row) {
                    *a += f64::from(x);
                }
            }
            Pooling::Cls if self.rows > 0 => {}
            Pooling::Cls | Pooling::Last => {
                for (a, &x) in self.acc.iter_mut().zip(row) {
                    *a = f64::from(x);
                }
            }
        }
        self.rows += 1;
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The pooled vector, L2-normalised; `None` when no row came.
    pub fn finish(&self) -> Option<Vec<f32>> {
        if self.rows == 0 {
            return None;
        }
        let scale = match self.pooling {
            Pooling::Mean => 1.0 / self.rows as f64,
            Pooling::Cls | Pooling::Last => 1.0,
        };
        let v: Vec<f64> = self.acc.iter().map(|a| a * scale).collect();
        Some(normalize(&v))
    }
}

/// `v / |v|` in f32; a zero vector stays zero (it has no direction to keep).
pub fn normalize(v: &[f64]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return v.iter().map(|_| 0.0).collect();
    }
    v.iter().map(|x| (x / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[f32]) -> f64 {
        v.iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt()
    }

    #[test]
    fn gguf_pooling_types_map_to_llama_cpp_enum_and_absent_means_mean() {
        assert_eq!(Pooling::from_gguf(None), Ok(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(Some(0)), Ok(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(Some(1)), Ok(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(Some(2)), Ok(Pooling::Cls));
        assert_eq!(Pooling::from_gguf(Some(3)), Ok(Pooling::Last));
        assert_eq!(Pooling::from_gguf(Some(4)), Err(UnknownPooling(4, "rank")));
        assert!(Pooling::from_gguf(Some(9)).is_err());
    }

    #[test]
    fn mean_pooling_averages_rows_then_normalises() {
        let mut p = Pooled::new(Pooling::Mean);
        p.push(&[1.0, 0.0, 2.0]);
        p.push(&[3.0, 4.0, 2.0]);
        let v = p.finish().expect("two rows");
        // Mean (2, 2, 2) → 1/√3 each.
        let e = 1.0 / 3f32.sqrt();
        for x in &v {
            assert!((x - e).abs() < 1e-6, "{v:?}");
        }
        assert!((norm(&v) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn cls_keeps_the_first_row_and_last_the_last() {
        let rows: [&[f32]; 3] = [&[3.0, 4.0], &[0.0, 2.0], &[5.0, 0.0]];
        let mut cls = Pooled::new(Pooling::Cls);
        let mut last = Pooled::new(Pooling::Last);
        for r in rows {
            cls.push(r);
            last.push(r);
        }
        assert_eq!(cls.finish(), Some(vec![0.6, 0.8]));
        assert_eq!(last.finish(), Some(vec![1.0, 0.0]));
        assert_eq!(cls.rows(), 3);
    }

    #[test]
    fn chunked_rows_pool_like_one_pass() {
        // A prompt fed in chunks pushes the same rows in the same order.
        let rows: Vec<Vec<f32>> = (0..7)
            .map(|i| vec![i as f32 * 0.5 - 1.0, (i * i) as f32, 1.0])
            .collect();
        let mut whole = Pooled::new(Pooling::Mean);
        rows.iter().for_each(|r| whole.push(r));
        let mut chunked = Pooled::new(Pooling::Mean);
        for chunk in rows.chunks(3) {
            chunk.iter().for_each(|r| chunked.push(r));
        }
        assert_eq!(whole.finish(), chunked.finish());
    }

    #[test]
    fn nothing_pushed_has_no_embedding_and_zero_stays_zero() {
        assert_eq!(Pooled::new(Pooling::Mean).finish(), None);
        assert_eq!(normalize(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
