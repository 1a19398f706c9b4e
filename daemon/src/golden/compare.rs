//! The comparison of two logits rows: top-1 agreement, KL divergence in f64, the largest
//! logit difference, accumulated over positions.

use super::report::{Report, Worst};

/// The first index of the largest value (llama.cpp's greedy sampler keeps the first too).
pub(super) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// One position's comparison, for the trace log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    /// llama.cpp's top-1 token and the native one.
    pub(super) top1: (usize, usize),
    /// How far llama.cpp's top-1 logit is above its second: a small margin is a near tie.
    pub(super) margin: f32,
    pub(super) kl: f64,
    pub(super) max_diff: f64,
}

/// The gap between the largest and the second-largest value.
pub(super) fn top2_margin(row: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    first - second
}

/// Running totals of the comparison.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) positions: usize,
    /// Positions skipped because an earlier prompt began with the same tokens.
    pub(super) repeated: usize,
    pub(super) agree: usize,
    pub(super) kl_sum: f64,
    pub(super) max_kl: f64,
    pub(super) max_abs_diff: f64,
    pub(super) worst: Option<Worst>,
}

impl Stats {
    /// Compares one position: `reference` is llama.cpp's logits row, `native` the native one.
    pub(super) fn add(
        &mut self,
        reference: &[f32],
        native: &[f32],
        prompt: usize,
        pos: usize,
    ) -> Position {
        self.positions += 1;
        let top1 = (argmax(reference), argmax(native));
        if top1.0 == top1.1 {
            self.agree += 1;
        }
        let kl = kl_divergence(reference, native);
        self.kl_sum += kl;
        if self.worst.is_none_or(|w| kl > w.kl) {
            self.worst = Some(Worst { prompt, pos, kl });
        }
        self.max_kl = self.max_kl.max(kl);
        let diff = reference
            .iter()
            .zip(native)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
            .fold(0.0, f64::max);
        self.max_abs_diff = self.max_abs_diff.max(diff);
        Position {
            top1,
            margin: top2_margin(reference),
            kl,
            max_diff: diff,
        }
    }

    pub(super) fn report(&self, prompts: usize, llama_seconds: f64, native_seconds: f64) -> Report {
        let n = self.positions.max(1) as f64;
        Report {
            positions: self.positions,
            top1_agreement: self.agree as f64 / n,
            mean_kl: self.kl_sum / n,
            max_kl: self.max_kl,
            max_abs_logit_diff: self.max_abs_diff,
            prompts,
            top1_disagreements: self.positions - self.agree,
            repeated_positions: self.repeated,
            worst: self.worst,
            llama_seconds,
            native_seconds,
            llama_noise_floor: None,
            candidate: String::new(),
        }
    }
}

/// log-softmax in f64 of a logits row.
pub(super) fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// KL(p ‖ q) in nats between the softmaxes of two logits rows.
pub(super) fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    let kl: f64 = lp.iter().zip(&lq).map(|(&a, &b)| a.exp() * (a - b)).sum();
    // Rounding can leave a tiny negative sum for equal rows.
    kl.max(0.0)
}
