//! `logit_bias` and log-probabilities, shared by both backends so that they report the same
//! numbers for the same logits.
//!
//! What is reported is the distribution the sampler starts from: the model's logits plus
//! `logit_bias`, log-softmaxed over the whole vocabulary, before penalties, temperature,
//! top-k, top-p and min-p. At temperature 0 without penalties the sampled token is therefore
//! the first entry of the top list.

/// Most alternatives a request may ask for per token (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// The log-probability of one sampled token and the `top` most likely tokens at its
/// position, most likely first (the lowest id first among equals, as greedy picks).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(i32, f32)>,
}

/// Adds each bias to its token's logit. Ids were checked against the vocabulary when the
/// request was validated; one out of range is skipped rather than trusted.
pub fn apply_bias(row: &mut [f32], bias: &[(i32, f32)]) {
    for &(token, b) in bias {
        if let Some(l) = usize::try_from(token).ok().and_then(|t| row.get_mut(t)) {
            *l += b;
        }
    }
}

/// The normalizer and the best `n` entries of one row of (biased) logits.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    /// `ln Σ exp(logit)`, in f64: a vocabulary of 10⁵ logits loses digits in f32.
    log_sum_exp: f64,
    top: Vec<(i32, f32)>,
}

impl Distribution {
    pub fn of(row: &[f32], n: usize) -> Self {
        let max = row
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let max = f64::from(max);
        let sum: f64 = row
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - max).exp())
            .sum();
        let log_sum_exp = max + sum.ln();
        // A short sorted list beats sorting the vocabulary: n ≤ 20.
        let mut best: Vec<(f32, i32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (i, &l) in row.iter().enumerate() {
                if l.is_nan() || (best.len() == n && l <= best[n - 1].0) {
                    continue;
                }
                let at = best.partition_point(|b| b.0 >= l);
                best.insert(at, (l, i as i32));
                best.truncate(n);
            }
        }
        let top = best
            .into_iter()
            .map(|(l, i)| (i, (f64::from(l) - log_sum_exp) as f32))
            .collect();
        Self { log_sum_exp, top }
    }

    /// The log-probability of a token whose (biased) logit is `logit`.
    fn logprob(&self, logit: f32) -> f32 {
        (f64::from(logit) - self.log_sum_exp) as f32
    }

    /// The report for the sampled token `chosen` of `row`, the row this was computed from.
    pub fn report(self, row: &[f32], chosen: i32) -> TokenLogprobs {
        let logit = usize::try_from(chosen)
            .ok()
            .and_then(|t| row.get(t))
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        self.report_logit(logit)
    }

    /// The report for a sampled token whose (biased) logit is `logit`.
    pub fn report_logit(self, logit: f32) -> TokenLogprobs {
        TokenLogprobs {
            logprob: self.logprob(logit),
            top: self.top,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_matches_the_definition_and_sums_to_one() {
        let row = [1.0f32, 2.0, 3.0, 0.5];
        let d = Distribution::of(&row, 4);
        let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        for (id, lp) in &d.top {
            let want = (f64::from(row[*id as usize]).exp() / z).ln();
            assert!((f64::from(*lp) - want).abs() < 1e-6, "{id}: {lp} vs {want}");
        }
        let total: f64 = d.top.iter().map(|(_, lp)| f64::from(*lp).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(
            d.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![2, 1, 0, 3]
        );
    }

    #[test]
    fn top_list_is_sorted_cut_to_n_and_breaks_ties_by_lowest_id() {
        let row = [0.0f32, 5.0, 5.0, f32::NAN, 4.0];
        let d = Distribution::of(&row, 2);
        assert_eq!(d.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(d.top.iter().all(|t| t.1 <= 0.0));
        assert!(Distribution::of(&row, 0).top.is_empty());
    }

    #[test]
    fn the_chosen_token_is_reported_even_outside_the_top_list() {
        let row = [3.0f32, 1.0, -2.0];
        let r = Distribution::of(&row, 1).report(&row, 2);
        assert_eq!(r.top.len(), 1);
        let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(r.logprob) - ((-2f64).exp() / z).ln()).abs() < 1e-6);
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let row = vec![1000.0f32; 50_000];
        let r = Distribution::of(&row, 3).report(&row, 7);
        assert!(
            (r.logprob - -(50_000f32).ln()).abs() < 1e-3,
            "{}",
            r.logprob
        );
    }

    #[test]
    fn bias_moves_the_argmax_and_minus_100_buries_a_token() {
        let mut row = [2.0f32, 1.0, 0.0];
        apply_bias(&mut row, &[(0, -100.0), (2, 1.5), (7, 100.0), (-1, 5.0)]);
        assert_eq!(row, [-98.0, 1.0, 1.5]);
        let d = Distribution::of(&row, 3);
        assert_eq!(d.top[0].0, 2);
        assert!(d.top[2].1 < -90.0);
    }
}
