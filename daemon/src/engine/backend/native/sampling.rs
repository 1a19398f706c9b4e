//! Per-sequence token sampling for the native backend: the stages of the shared chain
//! ([`sampling_chain::stages`], which the llama.cpp backend builds its sampler from), applied
//! in Rust in the same order, with log-probabilities from the biased logits as the llama.cpp
//! backend reports them.
//!
//! A sampler is deterministic: the same seed and the same logits give the same tokens.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::engine::backend::logprobs::{apply_bias, Distribution, TokenLogprobs};
use crate::engine::backend::sampling_chain::{self, Stage};
use crate::engine::types::SamplingParams;

/// The penalty window, where it lived before the chain had its own module.
pub use crate::engine::backend::sampling_chain::PENALTY_LAST_N;

/// One sequence's sampler: its settings, its chain, its random stream and the tokens it
/// produced.
pub struct Sampler {
    p: SamplingParams,
    /// `p`'s stages, in order.
    stages: Vec<Stage>,
    rng: StdRng,
    /// The last `penalty_last_n` sampled tokens, oldest first.
    history: VecDeque<i32>,
    /// Working copies, kept to avoid an allocation per token.
    logits: Vec<f32>,
    cand: Candidates,
}

/// The tokens still in the running once a truncating stage has begun: (logit, id).
#[derive(Default)]
struct Candidates {
    list: Vec<(f32, u32)>,
    /// `list` holds this token's candidates (built by the first stage that needs them).
    listed: bool,
    /// `list` is in [`order`].
    sorted: bool,
}

/// Highest logit first, the lowest id first among equals: the same order every run.
fn order(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl Candidates {
    fn reset(&mut self) {
        self.list.clear();
        self.listed = false;
        self.sorted = false;
    }

    /// The candidates: every token with a logit that is a number.
    fn of(&mut self, logits: &[f32]) -> &mut Vec<(f32, u32)> {
        if !self.listed {
            self.list.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_nan())
                    .map(|(i, &l)| (l, i as u32)),
            );
            self.listed = true;
        }
        &mut self.list
    }

    fn sorted(&mut self, logits: &[f32]) -> &mut Vec<(f32, u32)> {
        self.of(logits);
        if !self.sorted {
            self.list.sort_unstable_by(order);
            self.sorted = true;
        }
        &mut self.list
    }
}

impl Sampler {
    pub fn new(p: &SamplingParams) -> Self {
        Self {
            p: p.clone(),
            stages: sampling_chain::stages(p),
            rng: StdRng::seed_from_u64(u64::from(p.seed)),
            // Only a window the chain reads is kept (a penalty stage's own).
            history: VecDeque::with_capacity(window(p) as usize),
            logits: Vec::new(),
            cand: Candidates::default(),
        }
    }

    /// The stages this sampler applies, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Picks the next token from one row of logits and remembers it for the penalties.
    pub fn sample(&mut self, row: &[f32]) -> i32 {
        self.sample_reporting(row).0
    }

    /// [`sample`](Sampler::sample), with the token's log-probabilities when the settings ask
    /// for them: from the biased logits, before the penalties (see [`crate::engine::logprobs`]).
    pub fn sample_reporting(&mut self, row: &[f32]) -> (i32, Option<TokenLogprobs>) {
        self.logits.clear();
        self.logits.extend_from_slice(row);
        self.cand.reset();
        // Out of `self` while the stages borrow it mutably; put back below.
        let stages = std::mem::take(&mut self.stages);
        let mut snapshot = self.p.logprobs;
        let mut dist = None;
        let mut temperature = 1.0;
        let mut token = 0;
        for &stage in &stages {
            // The log-probabilities see the logits as the bias left them, before any later
            // stage (the bias, when on, is always the first).
            if stage != Stage::LogitBias {
                if let Some(n) = snapshot.take() {
                    dist = Some(Distribution::of(&self.logits, usize::from(n)));
                }
            }
            match stage {
                Stage::LogitBias => apply_bias(&mut self.logits, &self.p.logit_bias),
                Stage::Penalties {
                    frequency,
                    presence,
                    repeat,
                    last_n: _,
                } => self.penalize(frequency, presence, repeat),
                // The native backend refuses constrained requests when it opens them.
                Stage::Grammar => {}
                Stage::Greedy => token = argmax(&self.logits),
                Stage::TopK(k) => {
                    let cand = self.cand.of(&self.logits);
                    let k = usize::try_from(k).unwrap_or(0);
                    if k > 0 && k < cand.len() {
                        cand.select_nth_unstable_by(k - 1, order);
                        cand.truncate(k);
                    }
                }
                Stage::TopP(top_p) => {
                    let cand = self.cand.sorted(&self.logits);
                    let probs = softmax(cand, 1.0);
                    let mut cum = 0.0;
                    let mut keep = cand.len();
                    for (i, q) in probs.iter().enumerate() {
                        cum += q;
                        if cum >= f64::from(top_p) {
                            keep = i + 1;
                            break;
                        }
                    }
                    cand.truncate(keep.max(1));
                }
                Stage::MinP(min_p) => {
                    let cand = self.cand.sorted(&self.logits);
                    // p_i ≥ min_p × p_max  ⇔  logit_i ≥ max + ln(min_p); the list is sorted.
                    if let Some(&(max, _)) = cand.first() {
                        let floor = max + min_p.ln();
                        let keep = cand.iter().take_while(|c| c.0 >= floor).count();
                        cand.truncate(keep.max(1));
                    }
                }
                // Applied in the draw's softmax (in f64), not to the logits.
                Stage::Temperature(t) => temperature = t,
                // The random stream was seeded with `seed` when the sampler was made.
                Stage::Dist { .. } => token = self.draw(temperature),
            }
        }
        self.stages = stages;
        let keep = window(&self.p) as usize;
        if keep > 0 {
            if self.history.len() == keep {
                self.history.pop_front();
            }
            self.history.push_back(token);
        }
        // The penalties changed the working row: the chosen logit comes from the input's.
        let report = dist.map(|d| {
            let logit = usize::try_from(token)
                .ok()
                .and_then(|t| row.get(t))
                .map_or(f32::NEG_INFINITY, |l| {
                    l + bias_of(&self.p.logit_bias, token)
                });
            d.report_logit(logit)
        });
        (token, report)
    }

    /// For each recent token, as llama.cpp does it: the logit divided by `repeat` when
    /// positive and multiplied when not, then `logit -= count × frequency + presence`.
    fn penalize(&mut self, freq: f32, presence: f32, repeat: f32) {
        if self.history.is_empty() {
            return;
        }
        let mut seen: Vec<i32> = self.history.iter().copied().collect();
        seen.sort_unstable();
        for run in seen.chunk_by(|a, b| a == b) {
            if let Some(l) = usize::try_from(run[0])
                .ok()
                .and_then(|t| self.logits.get_mut(t))
            {
                if *l <= 0.0 {
                    *l *= repeat;
                } else {
                    *l /= repeat;
                }
                *l -= run.len() as f32 * freq + presence;
            }
        }
    }

    /// A draw from the softmax at `temperature` of the candidates left (all tokens when no
    /// stage truncated).
    fn draw(&mut self, temperature: f32) -> i32 {
        let cand = self.cand.of(&self.logits);
        if cand.is_empty() {
            return 0;
        }
        let probs = softmax(cand, temperature);
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.gen::<f64>() * total;
        for (q, c) in probs.iter().zip(cand.iter()) {
            if u < *q {
                return c.1 as i32;
            }
            u -= q;
        }
        cand[cand.len() - 1].1 as i32
    }
}

/// The tokens a sampler must remember: its penalty stage's window, none without one.
fn window(p: &SamplingParams) -> u32 {
    sampling_chain::stages(p)
        .iter()
        .find_map(|s| match s {
            Stage::Penalties { last_n, .. } => Some(*last_n),
            _ => None,
        })
        .unwrap_or(0)
}

fn bias_of(bias: &[(i32, f32)], token: i32) -> f32 {
    bias.iter().filter(|b| b.0 == token).map(|b| b.1).sum()
}

/// The highest logit's index, the lowest index among equals (llama.cpp's greedy).
pub fn argmax(row: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &l) in row.iter().enumerate() {
        if l > row[best] || row[best].is_nan() {
            best = i;
        }
    }
    best as i32
}

/// Unnormalized-safe softmax of candidate logits at `temperature`, in f64.
fn softmax(cand: &[(f32, u32)], temperature: f32) -> Vec<f64> {
    let max = cand.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
    let t = f64::from(temperature.max(1e-6));
    let mut probs: Vec<f64> = cand
        .iter()
        .map(|c| ((f64::from(c.0) - f64::from(max)) / t).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    if sum > 0.0 && sum.is_finite() {
        for q in &mut probs {
            *q /= sum;
        }
    }
    probs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    const ROW: [f32; 6] = [0.5, 2.0, 1.0, 2.0, -1.0, 1.9];

    #[test]
    fn the_sampler_applies_the_shared_chain() {
        for p in [
            params(0.0),
            SamplingParams {
                top_k: 5,
                top_p: 0.9,
                min_p: 0.1,
                frequency_penalty: 0.5,
                logit_bias: vec![(2, 1.0)],
                ..params(0.8)
            },
        ] {
            assert_eq!(Sampler::new(&p).stages(), sampling_chain::stages(&p));
        }
    }

    #[test]
    fn greedy_takes_the_highest_logit_and_the_lowest_index_on_ties() {
        let mut s = Sampler::new(&params(0.0));
        assert_eq!(s.sample(&ROW), 1);
        assert_eq!(argmax(&[f32::NAN, 3.0, 3.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 7,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(&p);
        for _ in 0..50 {
            assert_eq!(s.sample(&ROW), 1);
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens_and_another_seed_others() {
        let run = |seed| {
            let p = SamplingParams {
                temperature: 1.5,
                seed,
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(&p);
            (0..64).map(|_| s.sample(&ROW)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // Every token with a fair chance shows up: this is a draw, not an argmax.
        let drawn = run(42);
        assert!(
            [0, 1, 2, 3, 5].iter().all(|t| drawn.contains(t)),
            "{drawn:?}"
        );
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Token 0 carries almost all the mass; a tight nucleus or min-p keeps only it.
        let row = [10.0, 0.0, 0.0, 0.0];
        for p in [
            SamplingParams {
                top_p: 0.5,
                ..params(1.0)
            },
            SamplingParams {
                min_p: 0.01,
                ..params(1.0)
            },
        ] {
            let mut s = Sampler::new(&p);
            assert!((0..100).all(|_| s.sample(&row) == 0));
        }
    }

    #[test]
    fn penalties_move_the_argmax_off_a_repeated_token() {
        let row = [1.0, 1.5, 0.0];
        let mut plain = Sampler::new(&params(0.0));
        assert_eq!((plain.sample(&row), plain.sample(&row)), (1, 1));
        let mut freq = Sampler::new(&SamplingParams {
            frequency_penalty: 1.0,
            ..params(0.0)
        });
        assert_eq!((freq.sample(&row), freq.sample(&row)), (1, 0));
        let mut presence = Sampler::new(&SamplingParams {
            presence_penalty: 0.6,
            ..params(0.0)
        });
        assert_eq!((presence.sample(&row), presence.sample(&row)), (1, 0));
        // Frequency grows with the count; presence does not.
        let row = [1.0, 2.2, 0.0];
        let mut presence = Sampler::new(&SamplingParams {
            presence_penalty: 1.0,
            ..params(0.0)
        });
        let tokens: Vec<i32> = (0..3).map(|_| presence.sample(&row)).collect();
        assert_eq!(tokens, vec![1, 1, 1]);
    }

    #[test]
    fn the_repeat_penalty_divides_positive_and_multiplies_negative_logits_within_its_window() {
        // Token 1 leads; divided by 3 it falls below token 0 (1.0).
        let row = [1.0, 1.5, -0.5];
        let p = SamplingParams {
            repeat_penalty: 3.0,
            penalty_last_n: 1,
            ..params(0.0)
        };
        let mut s = Sampler::new(&p);
        // With a window of one token, the penalty only remembers the last pick: the
        // greedy pick alternates.
        let tokens: Vec<i32> = (0..4).map(|_| s.sample(&row)).collect();
        assert_eq!(tokens, vec![1, 0, 1, 0]);
        let mut wide = Sampler::new(&SamplingParams {
            penalty_last_n: 8,
            ..p
        });
        let tokens: Vec<i32> = (0..3).map(|_| wide.sample(&row)).collect();
        // Both penalized: 1.5 / 3 = 0.5 leads 1.0 / 3.
        assert_eq!(tokens, vec![1, 0, 1]);
        // A negative logit is multiplied: -0.5 × 3 falls below -0.6 (divided, it would
        // have risen to -0.17 and been picked again).
        let mut negative = Sampler::new(&SamplingParams {
            penalty_last_n: 8,
            repeat_penalty: 3.0,
            ..params(0.0)
        });
        let tokens: Vec<i32> = (0..3).map(|_| negative.sample(&[-0.5, -0.6])).collect();
        assert_eq!(tokens, vec![0, 1, 0]);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let banned = SamplingParams {
            logit_bias: vec![(1, -100.0), (3, -100.0)],
            ..params(0.0)
        };
        assert_eq!(Sampler::new(&banned).sample(&ROW), 5);
        let forced = SamplingParams {
            logit_bias: vec![(4, 100.0)],
            seed: 3,
            ..params(2.0)
        };
        let mut s = Sampler::new(&forced);
        assert!((0..100).all(|_| s.sample(&ROW) == 4));
    }

    #[test]
    fn logprobs_come_from_the_biased_logits_before_penalties() {
        let p = SamplingParams {
            logprobs: Some(3),
            logit_bias: vec![(5, 0.5)],
            frequency_penalty: 2.0,
            ..params(0.0)
        };
        let mut s = Sampler::new(&p);
        let (token, lp) = s.sample_reporting(&ROW);
        let lp = lp.expect("asked for");
        // Token 5 (1.9 + 0.5) now leads; greedy takes it and it tops the list.
        assert_eq!(token, 5);
        assert_eq!(lp.top[0], (5, lp.logprob));
        assert_eq!(lp.top.len(), 3);
        let mass: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
        assert!(
            lp.top.iter().all(|t| t.1 <= 0.0) && mass <= 1.0 + 1e-6,
            "{lp:?}"
        );
        // The penalty moves the next pick off token 5, but not the reported numbers.
        let (again, lp2) = s.sample_reporting(&ROW);
        assert_ne!(again, 5);
        assert_eq!(lp2.expect("asked for").top, lp.top);
        assert_eq!(Sampler::new(&params(0.0)).sample_reporting(&ROW).1, None);
    }
}
