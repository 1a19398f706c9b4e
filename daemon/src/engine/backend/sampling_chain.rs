//! The sampling chain, defined once: which stages a request's [`SamplingParams`] switch on,
//! in which order, with which constants. The llama.cpp backend builds its sampler from this
//! list and the native backend applies the same list itself, so the two cannot drift.

use crate::engine::types::SamplingParams;

/// Sampled tokens the penalties look back over unless a request sets `repeat_last_n`
/// (llama.cpp's default `penalty_last_n`).
pub const PENALTY_LAST_N: u32 = 64;

/// The longest penalty window a request may set: llama.cpp keeps it as a ring buffer of
/// this many tokens per sequence.
pub const MAX_PENALTY_LAST_N: u32 = 32_768;

/// Fewest candidates top-p and min-p keep.
pub const MIN_KEEP: usize = 1;

/// One stage of the chain, with the settings it runs with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stage {
    /// Adds each `(token, bias)` of `logit_bias` to the logits.
    LogitBias,
    /// For each token among the last `last_n` sampled: its logit divided by `repeat` when
    /// positive, multiplied when not, then `logit -= count × frequency + presence`
    /// (llama.cpp's penalties, in its order).
    Penalties {
        frequency: f32,
        presence: f32,
        repeat: f32,
        last_n: u32,
    },
    /// Masks the tokens a grammar forbids (`response_format`, forced tool calls). After the
    /// bias and penalties, before truncation: top-k and top-p then choose among allowed
    /// tokens, never among ones the grammar would mask afterwards.
    Grammar,
    /// Temperature 0: the highest logit, the lowest id among equals. Ends the chain.
    Greedy,
    TopK(i32),
    TopP(f32),
    MinP(f32),
    Temperature(f32),
    /// A draw from what is left, from a random stream seeded per request. Ends the chain.
    Dist {
        seed: u32,
    },
}

/// The stages `p` switches on, in the order both backends apply them. Settings at their
/// neutral value (no bias, zero penalties or a zero window, top-k 0, top-p 1, min-p 0)
/// add no stage.
pub fn stages(p: &SamplingParams) -> Vec<Stage> {
    let mut chain = Vec::with_capacity(8);
    if !p.logit_bias.is_empty() {
        chain.push(Stage::LogitBias);
    }
    let penalized =
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repeat_penalty != 1.0;
    if penalized && p.penalty_last_n > 0 {
        chain.push(Stage::Penalties {
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
            repeat: p.repeat_penalty,
            last_n: p.penalty_last_n,
        });
    }
    if p.constraint.is_some() {
        chain.push(Stage::Grammar);
    }
    if p.temperature <= 0.0 {
        chain.push(Stage::Greedy);
        return chain;
    }
    if p.top_k > 0 {
        chain.push(Stage::TopK(p.top_k));
    }
    if p.top_p < 1.0 {
        chain.push(Stage::TopP(p.top_p));
    }
    if p.min_p > 0.0 {
        chain.push(Stage::MinP(p.min_p));
    }
    chain.push(Stage::Temperature(p.temperature));
    chain.push(Stage::Dist { seed: p.seed });
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_on_comes_in_one_order() {
        let p = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.05,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            seed: 7,
            logit_bias: vec![(3, 1.0)],
            ..SamplingParams::default()
        };
        assert_eq!(
            stages(&p),
            [
                Stage::LogitBias,
                Stage::Penalties {
                    frequency: 0.25,
                    presence: 0.5,
                    repeat: 1.0,
                    last_n: PENALTY_LAST_N,
                },
                Stage::TopK(40),
                Stage::TopP(0.9),
                Stage::MinP(0.05),
                Stage::Temperature(0.7),
                Stage::Dist { seed: 7 },
            ]
        );
    }

    #[test]
    fn openai_defaults_are_a_plain_draw_and_temperature_zero_is_greedy() {
        let p = SamplingParams::default();
        assert_eq!(
            stages(&p),
            [Stage::Temperature(1.0), Stage::Dist { seed: 0 }]
        );
        let greedy = SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.5,
            ..SamplingParams::default()
        };
        assert_eq!(stages(&greedy), [Stage::Greedy], "truncation is moot");
    }

    #[test]
    fn a_repeat_penalty_alone_is_a_penalty_stage_and_a_zero_window_none() {
        let p = SamplingParams {
            temperature: 0.0,
            repeat_penalty: 1.3,
            penalty_last_n: 16,
            ..SamplingParams::default()
        };
        assert_eq!(
            stages(&p),
            [
                Stage::Penalties {
                    frequency: 0.0,
                    presence: 0.0,
                    repeat: 1.3,
                    last_n: 16
                },
                Stage::Greedy
            ]
        );
        let off = SamplingParams {
            penalty_last_n: 0,
            frequency_penalty: 1.0,
            ..p
        };
        assert_eq!(stages(&off), [Stage::Greedy]);
    }
}
