//! The seam between the scheduler and whatever computes tokens.
//!
//! A backend only computes: the scheduler decides which sequences run, hands the backend one
//! [`StepPlan`] per step, and gets back one [`SeqOutcome`] per sequence that asked for a
//! token. The backend never calls into the scheduler, never sees a client, a queue or a
//! clock, and owns nothing but its sequences' KV cells and samplers. llama.cpp on the CPU
//! ([`super::llama`]) and the native Q8_0 backend on the CPU or CUDA ([`super::native`]) are
//! the two; what differs between them travels as [`Capabilities`], so nothing outside the
//! engine asks which one serves.

use serde::Serialize;

use super::logprobs::TokenLogprobs;
use crate::engine::embed::Pooling;
use crate::engine::types::SamplingParams;

/// Where a backend computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

/// What a backend can do. Callers outside the engine ask these, never the backend's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Sampling under a grammar: `response_format` schemas and forced tool calls.
    pub constrained_decoding: bool,
    /// Sequences can share one KV pool smaller than `slots × ctx` (`--kv-cells`).
    pub shared_kv_pool: bool,
    /// Log-probabilities of the sampled tokens and their alternatives.
    pub logprobs: bool,
    /// The backend maps the weights itself, so the tokenizer loads the vocabulary only.
    pub own_weights: bool,
    /// Embedding passes: a sequence's pooled final-norm hidden states.
    pub embeddings: bool,
    /// KV cells in a quantized type (`--kv-type q8_0`, `q4_0`), not only f16.
    pub quantized_kv: bool,
    /// The devices it computes on.
    pub devices: &'static [Device],
}

impl Capabilities {
    /// Why `what` (a request part that needs a grammar) cannot be served by `backend`, or
    /// `None` when it can. The one wording, for the HTTP error and the backend alike.
    pub fn refuse_constraint(&self, backend: &str, what: &str) -> Option<String> {
        (!self.constrained_decoding).then(|| {
            format!(
                "{what} needs constrained decoding, which the {backend} backend does not \
                 have; serve with `--backend llama`"
            )
        })
    }
}

/// A backend sequence id. The scheduler uses its slot index, so ids are `0..slots` and an id
/// is reused only after [`Backend::free`].
pub type SeqId = usize;

/// What a backend could not do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The step itself failed (e.g. `llama_decode` returned an error): every sequence in it
    /// is lost, and only those.
    #[error("{0}")]
    Step(String),
    /// This sequence alone failed; the others in the step went on.
    #[error("{0}")]
    Sequence(String),
    /// The backend does not offer this operation (e.g. prefix sharing).
    #[error("{0} is not supported by this backend")]
    Unsupported(&'static str),
}

/// One sequence's work in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work<'a> {
    /// Feed the token sampled last step at position `pos`; sample the next one.
    Decode { seq: SeqId, token: i32, pos: u32 },
    /// Feed prompt tokens at positions `pos..pos + tokens.len()`. When `sample` is set this
    /// chunk ends the prompt and the first generated token is sampled after it.
    Prefill {
        seq: SeqId,
        tokens: &'a [i32],
        pos: u32,
        sample: bool,
    },
    /// Speculative decoding: feed `tokens` at positions `pos..pos + tokens.len()`, the
    /// token sampled last step followed by drafted ones, and sample after each row in turn
    /// with the sequence's own sampler chain, as [`Decode`](Work::Decode) would: a draft is
    /// accepted while the token sampled before it equals it, and verification stops at the
    /// first difference (or after the last draft, with a bonus token). The outcome carries
    /// every token produced ([`SeqOutcome::tokens`]); the backend drops the KV rows of the
    /// rejected drafts, so the sequence then holds `0..pos + produced`. See
    /// [`verify_rows`] for why this keeps the target model's distribution.
    Verify {
        seq: SeqId,
        tokens: &'a [i32],
        pos: u32,
    },
}

impl Work<'_> {
    pub fn seq(&self) -> SeqId {
        match self {
            Work::Decode { seq, .. } | Work::Prefill { seq, .. } | Work::Verify { seq, .. } => *seq,
        }
    }

    /// Whether the backend must return a token for this work.
    pub fn samples(&self) -> bool {
        match self {
            Work::Decode { .. } | Work::Verify { .. } => true,
            Work::Prefill { sample, .. } => *sample,
        }
    }

    /// Tokens this work feeds.
    pub fn n_tokens(&self) -> usize {
        match self {
            Work::Decode { .. } => 1,
            Work::Prefill { tokens, .. } | Work::Verify { tokens, .. } => tokens.len(),
        }
    }
}

/// One sampled token and, when the sequence asked for them, its log-probabilities.
pub type Sampled = (i32, Option<TokenLogprobs>);

/// The acceptance rule of a [`Work::Verify`] whose `tokens[1..]` are `drafts`: `sample(i)`
/// samples, with the sequence's chain, from the logits of row `i` (the row fed `tokens[i]`),
/// and is called for rows `0, 1, …` in turn until a sampled token differs from the draft
/// after its row, or for every row. Returns the tokens produced: the accepted drafts and
/// then the token sampled where verification stopped (a bonus token when every draft was
/// accepted). Rows past `produced.len() - 1` hold rejected drafts; the caller drops them.
///
/// Why the output keeps the target's distribution exactly: the standard rule for a draft
/// `d` from a draft distribution `q` accepts with probability `min(1, p(d)/q(d))` and
/// otherwise samples from `norm(max(0, p − q))`. A prompt-lookup draft is deterministic,
/// `q = δ(d)`: it is accepted with probability `p(d)`, and on rejection the residual
/// `max(0, p − δ(d))` is `p` with `d` removed, normalised. "Sample `x ~ p`; accept if
/// `x == d`, else emit `x`" has exactly that law: `x == d` with probability `p(d)`, and
/// given `x ≠ d`, `x` follows `p` without `d`. Sampling this way also consumes the chain
/// exactly as plain decoding does: one sample (one draw of its random stream, one token
/// into its penalty window and grammar) per emitted token, and none for a rejected draft,
/// so no sampler state has to be rolled back. At temperature 0 every sample is the
/// target's argmax at its position, so the accepted tokens are the target's own.
pub fn verify_rows<E>(
    drafts: &[i32],
    mut sample: impl FnMut(usize) -> Result<Sampled, E>,
) -> Result<Vec<Sampled>, E> {
    let mut produced = Vec::with_capacity(drafts.len() + 1);
    for row in 0..=drafts.len() {
        let (token, logprobs) = sample(row)?;
        produced.push((token, logprobs));
        if drafts.get(row) != Some(&token) {
            break;
        }
    }
    Ok(produced)
}

/// Everything one step computes, one work per sequence, in sequence-id order. A backend
/// fills its batch in this order, so the same plan gives the same batch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepPlan<'a> {
    pub work: Vec<Work<'a>>,
}

impl StepPlan<'_> {
    pub fn is_empty(&self) -> bool {
        self.work.is_empty()
    }

    /// Tokens fed in this step: what a backend's batch must hold.
    pub fn tokens(&self) -> usize {
        self.work.iter().map(Work::n_tokens).sum()
    }
}

/// A step whose plan may hold embedding passes beside generation: the generation work shares
/// one `generate` call, each embedding runs through `embed` apart (every token's hidden
/// state, no logits), and the outcomes come back in the plan's order. Shared by the backends
/// so they split and reassemble a mixed step the same way.
pub fn step_split<'a, B: ?Sized>(
    backend: &mut B,
    plan: &StepPlan<'a>,
    is_embedding: impl Fn(&B, SeqId) -> bool,
    generate: impl FnOnce(&mut B, &StepPlan<'a>) -> Vec<SeqOutcome>,
    mut embed: impl FnMut(&mut B, &Work<'a>) -> SeqOutcome,
) -> Vec<SeqOutcome> {
    if !plan.work.iter().any(|w| is_embedding(backend, w.seq())) {
        return generate(backend, plan);
    }
    let generation = StepPlan {
        work: (plan.work.iter())
            .filter(|w| !is_embedding(backend, w.seq()))
            .cloned()
            .collect(),
    };
    let mut generated = if generation.is_empty() {
        Vec::new()
    } else {
        generate(backend, &generation)
    }
    .into_iter();
    plan.work
        .iter()
        .map(|w| {
            if is_embedding(backend, w.seq()) {
                embed(backend, w)
            } else {
                generated.next().unwrap_or_else(|| {
                    SeqOutcome::new(w.seq(), Err(BackendError::Step("no outcome".into())))
                })
            }
        })
        .collect()
}

/// The result of one work: the sampled token when the work [`samples`](Work::samples),
/// `None` for a prompt chunk that does not end its prompt, or why it failed; with the
/// sampled token's log-probabilities when the sequence was opened with
/// [`SamplingParams::logprobs`]. A [`Work::Verify`] may produce more than one token: the
/// first is in `result` and `logprobs` like any other, the rest in `more`.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqOutcome {
    pub seq: SeqId,
    pub result: Result<Option<i32>, BackendError>,
    pub logprobs: Option<TokenLogprobs>,
    /// Tokens produced after the first by a verification, in order.
    pub more: Vec<Sampled>,
    /// An embedding sequence's pooled, normalised vector, on the work that ends its prompt.
    pub embedding: Option<Vec<f32>>,
}

impl SeqOutcome {
    pub fn new(seq: SeqId, result: Result<Option<i32>, BackendError>) -> Self {
        Self {
            seq,
            result,
            logprobs: None,
            more: Vec::new(),
            embedding: None,
        }
    }

    /// One sampled token with its log-probabilities.
    pub fn sampled(seq: SeqId, (token, logprobs): Sampled) -> Self {
        Self {
            logprobs,
            ..Self::new(seq, Ok(Some(token)))
        }
    }

    /// Every token a verification produced, in order (at least one).
    pub fn produced(seq: SeqId, produced: Vec<Sampled>) -> Self {
        let mut rest = produced.into_iter();
        match rest.next() {
            None => Self::new(
                seq,
                Err(BackendError::Sequence(
                    "a verification produced no token".into(),
                )),
            ),
            Some(first) => Self {
                more: rest.collect(),
                ..Self::sampled(seq, first)
            },
        }
    }

    /// Tokens this outcome carries: 0, 1, or more after a verification.
    pub fn n_tokens(&self) -> usize {
        match self.result {
            Ok(Some(_)) => 1 + self.more.len(),
            _ => 0,
        }
    }
}

/// What the scheduler needs of the tokenizer to turn sampled tokens into text.
pub trait Vocab {
    /// End of generation (EOS, EOT, …).
    fn is_end(&self, token: i32) -> bool;
    /// The bytes a token stands for (maybe part of a UTF-8 character).
    fn piece(&self, token: i32) -> Vec<u8>;
    /// A token as `logprobs` shows it: like [`piece`](Vocab::piece), but control tokens
    /// (`<|im_end|>`) are spelled out rather than empty.
    fn token_text(&self, token: i32) -> Vec<u8> {
        self.piece(token)
    }
}

/// What the scheduler computes with.
///
/// Contract:
/// - [`open`](Backend::open) before a sequence's first step; [`close`](Backend::close) after
///   its last. The id may then be opened again, reusing (after `truncate` or
///   `share_prefix`) or dropping (`free`) the KV cells it holds.
/// - [`step`](Backend::step) runs every [`Work`] of the plan and returns exactly one outcome
///   per work, in plan order. A step-wide failure is reported as [`BackendError::Step`] on
///   every work of the step; a sequence's own failure only on its work.
/// - Positions are the scheduler's: a backend trusts `pos` and keeps no cursor of its own.
pub trait Backend {
    /// A short name for logs and `/v1/status` (`llama.cpp`, `native-cuda`, …).
    fn name(&self) -> &'static str;

    /// Prepares sequence `seq` to be fed from position 0 with these sampling settings.
    fn open(&mut self, seq: SeqId, sampling: &SamplingParams) -> Result<(), BackendError>;

    /// Prepares sequence `seq` for an embedding pass: its prompt chunks are fed as usual
    /// (`sample` set on the last), nothing is sampled, and the outcome of the last chunk
    /// carries the pooled vector in [`SeqOutcome::embedding`].
    fn open_embedding(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        let _ = (seq, pooling);
        Err(BackendError::Unsupported("embeddings"))
    }

    /// Runs one step.
    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome>;

    /// Ends a sequence's generation: its sampler goes, its KV cells stay resident (prompt
    /// reuse) until [`truncate`](Backend::truncate) or [`free`](Backend::free).
    fn close(&mut self, seq: SeqId);

    /// Keeps positions `0..len` of `seq`'s KV cells and frees the rest (`len` 0 frees all).
    fn truncate(&mut self, seq: SeqId, len: u32);

    /// Forgets a sequence: sampler and KV cells.
    fn free(&mut self, seq: SeqId) {
        self.close(seq);
        self.truncate(seq, 0);
    }

    /// Replaces what `dst` holds with positions `0..len` of `src`, without recomputing them
    /// (prompt reuse). A unified KV pool shares the cells; per-sequence buffers copy them.
    fn share_prefix(&mut self, src: SeqId, dst: SeqId, len: u32) -> Result<(), BackendError> {
        let _ = (src, dst, len);
        Err(BackendError::Unsupported("prefix sharing"))
    }

    /// What saved prefixes depend on besides the weights: the backend, its KV cells' type
    /// and geometry. `None`: this backend cannot save prefixes (the prompt cache's RAM and
    /// disk tiers stay off). Part of a disk entry's key, so an entry saved under another
    /// layout is never restored.
    fn kv_layout(&self) -> Option<String> {
        None
    }

    /// Saves positions `0..len` of what `seq` holds (an idle sequence, `len` no more than
    /// it holds) for the prompt cache. Afterwards, on an error too, `seq` holds exactly
    /// `0..len`: whatever it held past them is dropped (llama.cpp's state API saves all of
    /// a sequence's cells).
    fn save_prefix(&mut self, seq: SeqId, len: u32) -> Result<Vec<u8>, BackendError> {
        self.truncate(seq, len);
        Err(BackendError::Unsupported("prompt cache"))
    }

    /// Replaces what `seq` holds with a prefix [`save_prefix`](Backend::save_prefix) of
    /// this backend and layout wrote; returns the positions it now holds. On an error `seq`
    /// holds nothing.
    fn restore_prefix(&mut self, seq: SeqId, saved: &[u8]) -> Result<u32, BackendError> {
        let _ = (seq, saved);
        Err(BackendError::Unsupported("prompt cache"))
    }
}

/// A boxed backend is a backend: [`super::open`] hands the scheduler one whatever it chose.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn open(&mut self, seq: SeqId, sampling: &SamplingParams) -> Result<(), BackendError> {
        (**self).open(seq, sampling)
    }
    fn open_embedding(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        (**self).open_embedding(seq, pooling)
    }
    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        (**self).step(plan)
    }
    fn close(&mut self, seq: SeqId) {
        (**self).close(seq)
    }
    fn truncate(&mut self, seq: SeqId, len: u32) {
        (**self).truncate(seq, len)
    }
    fn free(&mut self, seq: SeqId) {
        (**self).free(seq)
    }
    fn share_prefix(&mut self, src: SeqId, dst: SeqId, len: u32) -> Result<(), BackendError> {
        (**self).share_prefix(src, dst, len)
    }
    fn kv_layout(&self) -> Option<String> {
        (**self).kv_layout()
    }
    fn save_prefix(&mut self, seq: SeqId, len: u32) -> Result<Vec<u8>, BackendError> {
        (**self).save_prefix(seq, len)
    }
    fn restore_prefix(&mut self, seq: SeqId, saved: &[u8]) -> Result<u32, BackendError> {
        (**self).restore_prefix(seq, saved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_counts_fed_tokens_and_sampling_work() {
        let prompt = [1, 2, 3];
        let plan = StepPlan {
            work: vec![
                Work::Decode {
                    seq: 0,
                    token: 7,
                    pos: 10,
                },
                Work::Prefill {
                    seq: 1,
                    tokens: &prompt,
                    pos: 0,
                    sample: false,
                },
            ],
        };
        assert_eq!(plan.tokens(), 4);
        let sampling: Vec<SeqId> = plan
            .work
            .iter()
            .filter(|w| w.samples())
            .map(Work::seq)
            .collect();
        assert_eq!(sampling, vec![0]);
    }

    /// The target "model" samples `target[row]` from row `row`; returns what was produced
    /// and how many rows were sampled.
    fn verify(drafts: &[i32], target: &[i32]) -> (Vec<i32>, usize) {
        let mut sampled = 0;
        let Ok(produced) = verify_rows::<std::convert::Infallible>(drafts, |row| {
            sampled += 1;
            Ok((target[row], None))
        });
        (produced.into_iter().map(|(t, _)| t).collect(), sampled)
    }

    #[test]
    fn verification_accepts_drafts_up_to_the_first_difference() {
        // Every draft accepted: the row after the last gives a bonus token.
        assert_eq!(verify(&[5, 6, 7], &[5, 6, 7, 8]), (vec![5, 6, 7, 8], 4));
        // Rejected at the third: the target's own token there, and no row sampled after it
        // (its sampler state must not move past what is emitted).
        assert_eq!(verify(&[5, 6, 7], &[5, 6, 9, 8]), (vec![5, 6, 9], 3));
        assert_eq!(verify(&[5, 6, 7], &[4, 6, 7, 8]), (vec![4], 1));
        // No draft: a plain decode.
        assert_eq!(verify(&[], &[3]), (vec![3], 1));
    }

    #[test]
    fn an_outcome_carries_every_produced_token_in_order() {
        let o = SeqOutcome::produced(3, vec![(5, None), (6, None), (9, None)]);
        assert_eq!((o.seq, o.result.clone(), o.n_tokens()), (3, Ok(Some(5)), 3));
        assert_eq!(o.more.iter().map(|t| t.0).collect::<Vec<_>>(), vec![6, 9]);
        assert_eq!(SeqOutcome::new(1, Ok(None)).n_tokens(), 0);
        assert!(SeqOutcome::produced(1, Vec::new()).result.is_err());
    }
}

#[cfg(test)]
#[path = "seam_law_tests.rs"]
mod law_tests;
