//! The verification rule keeps the target's law. A toy model with known next-token laws is
//! sampled by the native backend's sampler (the shared chain) through [`verify_rows`] with
//! a fixed draft, as a prompt-lookup draft is, and compared with the exact probabilities
//! (chi-square goodness of fit at [`ALPHA`]) and with plain decoding under the same seed.
//! Print the statistics with `--nocapture`.

use super::{verify_rows, Sampled};
use crate::engine::backend::native::sampling::Sampler;
use crate::engine::types::SamplingParams;
use crate::stats::{goodness_of_fit, ChiSquare};

/// Vocabulary of the toy model.
const V: usize = 6;
/// Tokens generated per trial: two drafted rows and the bonus row.
const LEN: usize = 3;
/// The draft of every trial: the first is accepted 40% of the time, the second (after an
/// accepted first) 20%, so both rows reject often.
const DRAFT: [i32; 2] = [0, 1];
const TRIALS: u32 = 20_000;
/// Significance level of every test; the seeds are fixed, so the outcome is too.
const ALPHA: f64 = 0.001;

/// The toy model: the law of the next token after `context` (only its last token matters;
/// each one gives another law).
fn law(context: &[i32]) -> [f64; V] {
    const FIRST: [f64; V] = [0.40, 0.25, 0.15, 0.10, 0.06, 0.04];
    const BASE: [f64; V] = [0.50, 0.20, 0.12, 0.08, 0.06, 0.04];
    match context.last() {
        None => FIRST,
        Some(&t) => std::array::from_fn(|i| BASE[(i + V - t as usize % V) % V]),
    }
}

/// The logits whose softmax at temperature 1 is [`law`].
fn logits(context: &[i32]) -> Vec<f32> {
    law(context).iter().map(|p| p.ln() as f32).collect()
}

/// The exact probability of a whole continuation.
fn probability(tokens: &[i32]) -> f64 {
    (0..tokens.len())
        .map(|i| law(&tokens[..i])[tokens[i] as usize])
        .product()
}

fn sampler(seed: u32) -> Sampler {
    Sampler::new(&SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    })
}

/// [`LEN`] tokens, one sample per token.
fn plain(seed: u32) -> Vec<i32> {
    let mut s = sampler(seed);
    let mut out = Vec::with_capacity(LEN);
    while out.len() < LEN {
        out.push(s.sample(&logits(&out)));
    }
    out
}

/// A verification rule: drafts and a row sampler in, produced tokens out.
type Rule = fn(&[i32], &mut dyn FnMut(usize) -> Sampled) -> Vec<Sampled>;

fn the_rule(drafts: &[i32], sample: &mut dyn FnMut(usize) -> Sampled) -> Vec<Sampled> {
    let Ok(produced) = verify_rows::<std::convert::Infallible>(drafts, |row| Ok(sample(row)));
    produced
}

/// [`LEN`] tokens: one verification of [`DRAFT`] (row `i` sees the drafts before it),
/// then plain decoding after what it produced.
fn speculative(seed: u32, rule: Rule) -> Vec<i32> {
    let mut s = sampler(seed);
    let mut row = |i: usize| (s.sample(&logits(&DRAFT[..i])), None);
    let mut out: Vec<i32> = rule(&DRAFT, &mut row).into_iter().map(|t| t.0).collect();
    while out.len() < LEN {
        out.push(s.sample(&logits(&out)));
    }
    out
}

/// Counts per token of `tokens`.
fn counts(tokens: impl Iterator<Item = i32>) -> [u64; V] {
    let mut c = [0; V];
    for t in tokens {
        c[t as usize] += 1;
    }
    c
}

/// Counts per whole continuation (`V^LEN` cells, in base-`V` order) and their exact law.
fn joint(runs: &[Vec<i32>]) -> (Vec<u64>, Vec<f64>) {
    let cells = V.pow(LEN as u32);
    let index = |r: &[i32]| r.iter().fold(0, |i, &t| i * V + t as usize);
    let mut observed = vec![0; cells];
    for r in runs {
        observed[index(r)] += 1;
    }
    let probs = (0..cells)
        .map(|mut i| {
            let mut tokens = [0; LEN];
            for t in tokens.iter_mut().rev() {
                *t = (i % V) as i32;
                i /= V;
            }
            probability(&tokens)
        })
        .collect();
    (observed, probs)
}

/// `p` without `token`, renormalised: the residual law after `token` is rejected.
fn without(p: [f64; V], token: i32) -> Vec<f64> {
    let rest = 1.0 - p[token as usize];
    (0..V)
        .map(|i| {
            if i == token as usize {
                0.0
            } else {
                p[i] / rest
            }
        })
        .collect()
}

fn check(what: &str, fit: ChiSquare) {
    println!("{what}: {fit}");
    assert!(fit.p_value > ALPHA, "{what}: {fit}");
}

#[test]
fn a_verification_draws_the_tokens_plain_decoding_draws_with_the_same_seed() {
    // One sample per emitted token and none for a rejected draft: the random stream is
    // consumed exactly as without speculation, so a seed reproduces its text either way.
    let differ = (0..2_000)
        .filter(|&seed| speculative(seed, the_rule) != plain(seed))
        .count();
    assert_eq!(differ, 0, "seeds whose tokens differ");
}

#[test]
fn emitted_tokens_follow_the_model_first_after_a_rejection_and_jointly() {
    let runs: Vec<Vec<i32>> = (0..TRIALS).map(|s| speculative(s, the_rule)).collect();
    // Both rows rejected often enough to test what follows a rejection.
    let rejected_first: Vec<&Vec<i32>> = runs.iter().filter(|r| r[0] != DRAFT[0]).collect();
    let rejected_second: Vec<&Vec<i32>> = runs
        .iter()
        .filter(|r| r[0] == DRAFT[0] && r[1] != DRAFT[1])
        .collect();
    assert!(rejected_first.len() > 5_000 && rejected_second.len() > 2_000);

    check(
        "first token",
        goodness_of_fit(&counts(runs.iter().map(|r| r[0])), &law(&[])),
    );
    // Where the first draft was rejected, the token emitted instead follows the model's
    // law without the draft.
    check(
        "token emitted where the first draft is rejected",
        goodness_of_fit(
            &counts(rejected_first.iter().map(|r| r[0])),
            &without(law(&[]), DRAFT[0]),
        ),
    );
    check(
        "token emitted where the second draft is rejected",
        goodness_of_fit(
            &counts(rejected_second.iter().map(|r| r[1])),
            &without(law(&DRAFT[..1]), DRAFT[1]),
        ),
    );
    // After a rejection decoding goes on from the emitted token: the next one follows the
    // model's law after it. Pooled over every first token (each a different law), this is
    // the second token's law given that the first was not the draft.
    let after: Vec<f64> = (0..V)
        .map(|t| {
            let first = law(&[]);
            let rest = 1.0 - first[DRAFT[0] as usize];
            (0..V as i32)
                .filter(|&x| x != DRAFT[0])
                .map(|x| first[x as usize] / rest * law(&[x])[t])
                .sum()
        })
        .collect();
    check(
        "token after a rejected first draft",
        goodness_of_fit(&counts(rejected_first.iter().map(|r| r[1])), &after),
    );
    let (observed, probs) = joint(&runs);
    check(
        "whole continuation (216 cells, small ones pooled)",
        goodness_of_fit(&observed, &probs),
    );
}

#[test]
fn a_rule_that_draws_again_after_a_rejection_is_caught() {
    // A plausible mistake: on rejection, emit a fresh draw, which may be the draft itself.
    // The draft then comes out with probability p + (1 − p)·p (0.64, not 0.40): the same
    // test must see it, or its passes above mean nothing.
    fn redraw(drafts: &[i32], sample: &mut dyn FnMut(usize) -> Sampled) -> Vec<Sampled> {
        let mut produced = Vec::new();
        for (row, &d) in drafts.iter().enumerate() {
            let (token, _) = sample(row);
            if token != d {
                produced.push(sample(row));
                return produced;
            }
            produced.push((token, None));
        }
        produced.push(sample(drafts.len()));
        produced
    }
    let runs: Vec<Vec<i32>> = (0..TRIALS).map(|s| speculative(s, redraw)).collect();
    let fit = goodness_of_fit(&counts(runs.iter().map(|r| r[0])), &law(&[]));
    println!("first token under the redrawing rule: {fit}");
    assert!(fit.p_value < ALPHA, "{fit}");
}
