//! [`NativeBackend`]: the scheduler's [`Backend`] on the native forward pass. One
//! [`Model::forward`] per step over the plan's tokens, a Rust [`Sampler`] per sequence.

use std::convert::Infallible;

use super::batch::BatchToken;
use super::forward::Model;
use super::sampling::Sampler;
use super::saved;
use crate::engine::backend::seam::{
    step_split, verify_rows, Backend, BackendError, Capabilities, Device, SeqId, SeqOutcome,
    StepPlan, Work,
};
use crate::engine::embed::{Pooled, Pooling};
use crate::engine::types::SamplingParams;

/// Per-sequence KV streams and Rust samplers: no grammar, no shared pool; the CPU twins or
/// the CUDA kernels.
pub const CAPABILITIES: Capabilities = Capabilities {
    constrained_decoding: false,
    shared_kv_pool: false,
    logprobs: true,
    own_weights: true,
    // On the CPU; the CUDA pass has no `run_hidden` (see `Selection::capabilities`).
    embeddings: true,
    // Its attention kernels read f16 K and V rows (`kv_store.cu`, `decode_attention`).
    quantized_kv: false,
    devices: &[Device::Cpu, Device::Cuda],
};

pub struct NativeBackend<'m> {
    model: Model<'m>,
    samplers: Vec<Option<Sampler>>,
    /// Per sequence opened for an embedding: its pooling so far.
    embeds: Vec<Option<Pooled>>,
    batch: Vec<BatchToken>,
    want: Vec<bool>,
}

impl<'m> NativeBackend<'m> {
    /// A backend over `model`, whose KV cache holds one sequence per backend sequence id.
    pub fn new(model: Model<'m>) -> Self {
        let n_seq = model.kv().n_seq();
        Self {
            model,
            samplers: (0..n_seq).map(|_| None).collect(),
            embeds: (0..n_seq).map(|_| None).collect(),
            batch: Vec::new(),
            want: Vec::new(),
        }
    }

    pub fn model(&self) -> &Model<'m> {
        &self.model
    }

    /// Why this work cannot go into the batch, checked per work so that one bad sequence
    /// does not fail the others (the forward pass refuses a whole batch).
    fn refuse(&self, work: &Work<'_>) -> Option<String> {
        let (seq, n_vocab) = (work.seq(), self.model.hparams().n_vocab);
        let (n_seq, n_ctx) = (self.model.kv().n_seq(), self.model.kv().n_ctx());
        if seq >= n_seq {
            return Some(format!("no sequence {seq} (the cache holds {n_seq})"));
        }
        let (tokens, pos): (&[i32], u32) = match work {
            Work::Decode { token, pos, .. } => (std::slice::from_ref(token), *pos),
            Work::Prefill { tokens, pos, .. } | Work::Verify { tokens, pos, .. } => (tokens, *pos),
        };
        if pos as usize + tokens.len() > n_ctx {
            return Some(format!(
                "positions {pos}..{} of sequence {seq} exceed its context of {n_ctx}",
                pos as usize + tokens.len()
            ));
        }
        if pos as usize > self.model.kv().seq_len(seq) {
            return Some(format!(
                "position {pos} of sequence {seq} leaves a gap (it holds {})",
                self.model.kv().seq_len(seq)
            ));
        }
        if let Some(t) = tokens
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= n_vocab))
        {
            return Some(format!("token {t} outside the vocabulary of {n_vocab}"));
        }
        if work.samples() && self.samplers[seq].is_none() && !self.is_embedding(seq) {
            return Some(format!("sequence {seq} was not opened"));
        }
        None
    }

    fn is_embedding(&self, seq: SeqId) -> bool {
        self.embeds.get(seq).is_some_and(Option::is_some)
    }

    /// One embedding sequence's prompt chunk: every token's hidden state pooled; the last
    /// chunk's outcome carries the vector.
    fn embed_work(&mut self, work: &Work<'_>) -> SeqOutcome {
        let seq = work.seq();
        if let Some(why) = self.refuse(work) {
            return SeqOutcome::new(seq, Err(BackendError::Sequence(why)));
        }
        let Work::Prefill {
            tokens,
            pos,
            sample,
            ..
        } = *work
        else {
            return SeqOutcome::new(
                seq,
                Err(BackendError::Sequence(format!(
                    "sequence {seq} is an embedding pass: it decodes nothing"
                ))),
            );
        };
        self.batch.clear();
        self.batch
            .extend(tokens.iter().enumerate().map(|(i, &token)| BatchToken {
                seq,
                token,
                pos: pos + i as u32,
            }));
        let e = self.model.hparams().n_embd;
        let hidden = match self.model.hidden(&self.batch) {
            Ok(h) => h,
            Err(err) => return SeqOutcome::new(seq, Err(BackendError::Sequence(err.to_string()))),
        };
        let Some(pooled) = self.embeds[seq].as_mut() else {
            return SeqOutcome::new(
                seq,
                Err(BackendError::Sequence(format!("no sequence {seq}"))),
            );
        };
        hidden.chunks_exact(e).for_each(|row| pooled.push(row));
        SeqOutcome {
            embedding: if sample { pooled.finish() } else { None },
            ..SeqOutcome::new(seq, Ok(None))
        }
    }

    /// A step of generation sequences only: one forward over the plan, then sampling.
    fn step_generation(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        // Per work: `Err` when refused, else whether it has a logits row.
        let mut fed: Vec<Result<bool, String>> = Vec::with_capacity(plan.work.len());
        self.batch.clear();
        self.want.clear();
        for work in &plan.work {
            if let Some(why) = self.refuse(work) {
                fed.push(Err(why));
                continue;
            }
            let seq = work.seq();
            match *work {
                Work::Decode { token, pos, .. } => {
                    self.batch.push(BatchToken { seq, token, pos });
                    self.want.push(true);
                }
                Work::Prefill {
                    tokens,
                    pos,
                    sample,
                    ..
                } => {
                    for (i, &token) in tokens.iter().enumerate() {
                        self.batch.push(BatchToken {
                            seq,
                            token,
                            pos: pos + i as u32,
                        });
                        self.want.push(sample && i + 1 == tokens.len());
                    }
                }
                // Logits for every row: each is sampled in turn until a draft is rejected.
                Work::Verify { tokens, pos, .. } => {
                    for (i, &token) in tokens.iter().enumerate() {
                        self.batch.push(BatchToken {
                            seq,
                            token,
                            pos: pos + i as u32,
                        });
                        self.want.push(true);
                    }
                }
            }
            fed.push(Ok(work.samples()));
        }
        let n_vocab = self.model.hparams().n_vocab;
        let logits = if self.batch.is_empty() {
            &[][..]
        } else {
            match self.model.forward(&self.batch, &self.want) {
                Ok(l) => l,
                Err(e) => {
                    let reason = e.to_string();
                    tracing::error!(
                        reason,
                        kind = e.kind(),
                        "native forward failed; failing the sequences in this step"
                    );
                    return plan
                        .work
                        .iter()
                        .map(|w| SeqOutcome::new(w.seq(), Err(BackendError::Step(reason.clone()))))
                        .collect();
                }
            }
        };
        let mut rows = logits.chunks_exact(n_vocab);
        let mut outcomes = Vec::with_capacity(plan.work.len());
        let mut truncate = Vec::new();
        for (work, fed) in plan.work.iter().zip(fed) {
            let seq = work.seq();
            let no_row = || {
                SeqOutcome::new(
                    seq,
                    Err(BackendError::Step(format!(
                        "the forward pass returned no logits row for sequence {seq}"
                    ))),
                )
            };
            let outcome = match fed {
                Err(why) => SeqOutcome::new(seq, Err(BackendError::Sequence(why))),
                Ok(false) => SeqOutcome::new(seq, Ok(None)),
                Ok(true) => {
                    // A verification asked for every row of its tokens, the rest for one.
                    let n_rows = match *work {
                        Work::Verify { tokens, .. } => tokens.len(),
                        _ => 1,
                    };
                    let mine: Vec<&[f32]> = rows.by_ref().take(n_rows).collect();
                    match (self.samplers[seq].as_mut(), work) {
                        (None, _) => no_row(),
                        _ if mine.len() < n_rows => no_row(),
                        (Some(sampler), &Work::Verify { tokens, pos, .. }) => {
                            let Ok(produced) = verify_rows::<Infallible>(&tokens[1..], |i| {
                                Ok(sampler.sample_reporting(mine[i]))
                            });
                            truncate.push((seq, pos + produced.len() as u32));
                            SeqOutcome::produced(seq, produced)
                        }
                        (Some(sampler), _) => {
                            SeqOutcome::sampled(seq, sampler.sample_reporting(mine[0]))
                        }
                    }
                }
            };
            outcomes.push(outcome);
        }
        // The rejected drafts' rows go; each sequence holds what it produced.
        for (seq, len) in truncate {
            self.truncate(seq, len);
        }
        outcomes
    }
}

impl Backend for NativeBackend<'_> {
    fn name(&self) -> &'static str {
        "native"
    }

    fn open(&mut self, seq: SeqId, sampling: &SamplingParams) -> Result<(), BackendError> {
        let slot = self
            .samplers
            .get_mut(seq)
            .ok_or_else(|| BackendError::Sequence(format!("no sequence {seq}")))?;
        if sampling.constraint.is_some() {
            if let Some(why) = CAPABILITIES.refuse_constraint(
                "native",
                "constrained output (response_format, a forced tool call)",
            ) {
                return Err(BackendError::Sequence(why));
            }
        }
        *slot = Some(Sampler::new(sampling));
        Ok(())
    }

    fn open_embedding(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        if self.model.cuda().is_some() {
            return Err(BackendError::Unsupported("embeddings on CUDA"));
        }
        let slot = self
            .embeds
            .get_mut(seq)
            .ok_or_else(|| BackendError::Sequence(format!("no sequence {seq}")))?;
        *slot = Some(Pooled::new(pooling));
        Ok(())
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        step_split(
            self,
            plan,
            |b, seq| b.is_embedding(seq),
            |b, p| b.step_generation(p),
            |b, w| b.embed_work(w),
        )
    }

    fn close(&mut self, seq: SeqId) {
        if let Some(s) = self.samplers.get_mut(seq) {
            *s = None;
        }
        if let Some(e) = self.embeds.get_mut(seq) {
            *e = None;
        }
    }

    fn truncate(&mut self, seq: SeqId, len: u32) {
        if let Err(e) = self.model.kv_mut().truncate(seq, len as usize) {
            tracing::warn!(seq, len, error = %e, "could not drop the KV cells of a sequence");
        }
    }

    fn free(&mut self, seq: SeqId) {
        self.close(seq);
        if let Err(e) = self.model.kv_mut().clear(seq) {
            tracing::warn!(seq, error = %e, "could not clear a sequence");
        }
    }

    fn share_prefix(&mut self, src: SeqId, dst: SeqId, len: u32) -> Result<(), BackendError> {
        self.model
            .kv_mut()
            .copy_prefix(src, dst, len as usize)
            .map_err(|e| BackendError::Sequence(format!("KV copy from {src} to {dst}: {e}")))
    }

    /// The CPU and the CUDA pass share one layout: their cells hold the same bits.
    fn kv_layout(&self) -> Option<String> {
        let hp = self.model.hparams();
        Some(saved::layout(
            hp.n_layer,
            hp.n_head_kv,
            hp.head_dim,
            self.model.activations(),
        ))
    }

    fn save_prefix(&mut self, seq: SeqId, len: u32) -> Result<Vec<u8>, BackendError> {
        self.model
            .kv_mut()
            .save_prefix(seq, len as usize)
            .map_err(|e| BackendError::Sequence(format!("saving sequence {seq}: {e}")))
    }

    fn restore_prefix(&mut self, seq: SeqId, saved: &[u8]) -> Result<u32, BackendError> {
        let restored = self.model.kv_mut().restore_prefix(seq, saved);
        // The header counts positions in a u32, so a restored length fits.
        restored
            .map(|n| n as u32)
            .map_err(|e| BackendError::Sequence(format!("restoring sequence {seq}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::synth::{synth, Spec, Synth};
    use super::super::{HParams, Weights};
    use super::*;
    use crate::engine::backend::fake::FakeVocab;
    use crate::engine::plan::{EnginePlan, STEP_TOKENS};
    use crate::engine::schedule::thread::spawn;
    use crate::engine::types::{Event, FinishReason, GenerationRequest};
    use crate::metrics::Metrics;
    use crate::thermal::ThermalGate;

    const N_CTX: usize = 64;

    fn model(s: &Synth, n_seq: usize) -> Model<'_> {
        let hp = HParams::from_metadata(s).unwrap();
        let w = Weights::load(&hp, s).unwrap();
        Model::new(hp, w, n_seq, N_CTX, 2).unwrap()
    }

    fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// The greedy next token after `prompt`, from a model of its own.
    fn reference_next(s: &Synth, prompt: &[i32]) -> i32 {
        let mut m = model(s, 1);
        let batch: Vec<BatchToken> = prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                seq: 0,
                token,
                pos: i as u32,
            })
            .collect();
        let mut want = vec![false; prompt.len()];
        want[prompt.len() - 1] = true;
        super::super::sampling::argmax(m.forward(&batch, &want).unwrap())
    }

    #[test]
    fn a_prefill_and_a_decode_step_give_one_outcome_per_work_in_plan_order() {
        let s = synth(Spec::llama(), 7);
        let mut b = NativeBackend::new(model(&s, 3));
        for seq in 0..3 {
            b.open(seq, &greedy()).unwrap();
        }
        let (a, c) = ([1, 17, 4, 42], [49, 3, 3]);
        let plan = StepPlan {
            work: vec![
                Work::Prefill {
                    seq: 0,
                    tokens: &a,
                    pos: 0,
                    sample: true,
                },
                Work::Prefill {
                    seq: 1,
                    tokens: &c,
                    pos: 0,
                    sample: false,
                },
                Work::Prefill {
                    seq: 2,
                    tokens: &c,
                    pos: 0,
                    sample: true,
                },
            ],
        };
        let out = b.step(&plan);
        let seqs: Vec<SeqId> = out.iter().map(|o| o.seq).collect();
        assert_eq!(seqs, vec![0, 1, 2]);
        let first_a = reference_next(&s, &a);
        assert_eq!(out[0].result, Ok(Some(first_a)));
        assert_eq!(out[1].result, Ok(None));
        assert_eq!(out[2].result, Ok(Some(reference_next(&s, &c))));

        // Decode seq 0, finish seq 1's prompt, decode seq 2: still plan order.
        let plan = StepPlan {
            work: vec![
                Work::Decode {
                    seq: 0,
                    token: first_a,
                    pos: 4,
                },
                Work::Prefill {
                    seq: 1,
                    tokens: &[8],
                    pos: 3,
                    sample: true,
                },
            ],
        };
        let out = b.step(&plan);
        assert_eq!(out[0].seq, 0);
        assert_eq!(
            out[0].result,
            Ok(Some(reference_next(&s, &[1, 17, 4, 42, first_a])))
        );
        assert_eq!(out[1].result, Ok(Some(reference_next(&s, &[49, 3, 3, 8]))));
    }

    #[test]
    fn an_embedding_fed_in_chunks_beside_a_generation_equals_one_pass() {
        let s = synth(Spec::llama(), 11);
        let prompt = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2];
        let mut one = NativeBackend::new(model(&s, 2));
        one.open_embedding(0, Pooling::Mean).expect("opens");
        let out = one.step(&StepPlan {
            work: vec![Work::Prefill {
                seq: 0,
                tokens: &prompt,
                pos: 0,
                sample: true,
            }],
        });
        assert_eq!(out[0].result, Ok(None));
        let whole = out[0]
            .embedding
            .clone()
            .expect("a vector on the last chunk");
        assert_eq!(
            whole.len(),
            HParams::from_metadata(&s).expect("hparams").n_embd
        );
        let norm: f64 = whole
            .iter()
            .map(|&x| f64::from(x).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "|v| = {norm}");

        let mut two = NativeBackend::new(model(&s, 2));
        two.open_embedding(0, Pooling::Mean).expect("opens");
        two.open(1, &greedy()).expect("opens");
        let gen = [1, 2, 3];
        let first = two.step(&StepPlan {
            work: vec![
                Work::Prefill {
                    seq: 0,
                    tokens: &prompt[..5],
                    pos: 0,
                    sample: false,
                },
                Work::Prefill {
                    seq: 1,
                    tokens: &gen,
                    pos: 0,
                    sample: true,
                },
            ],
        });
        assert_eq!(
            (first[0].result.clone(), first[0].embedding.is_none()),
            (Ok(None), true)
        );
        assert_eq!(first[1].result, Ok(Some(reference_next(&s, &gen))));
        let last = two.step(&StepPlan {
            work: vec![Work::Prefill {
                seq: 0,
                tokens: &prompt[5..],
                pos: 5,
                sample: true,
            }],
        });
        // Each column's arithmetic is its own: the same bits, chunked or not.
        assert_eq!(last[0].embedding.as_ref(), Some(&whole));
    }

    /// Greedy decoding of `n` tokens after `prompt` on sequence `seq`, one step each.
    fn decode(b: &mut NativeBackend<'_>, seq: SeqId, prompt: &[i32], n: usize) -> Vec<i32> {
        let out = b.step(&StepPlan {
            work: vec![Work::Prefill {
                seq,
                tokens: prompt,
                pos: 0,
                sample: true,
            }],
        });
        let mut tokens = vec![out[0].result.clone().unwrap().unwrap()];
        while tokens.len() < n {
            let pos = (prompt.len() + tokens.len() - 1) as u32;
            let token = tokens[tokens.len() - 1];
            let out = b.step(&StepPlan {
                work: vec![Work::Decode { seq, token, pos }],
            });
            tokens.push(out[0].result.clone().unwrap().unwrap());
        }
        tokens
    }

    #[test]
    fn a_verification_accepts_the_greedy_tokens_and_drops_the_rejected_rows() {
        let s = synth(Spec::llama(), 5);
        let prompt = [4, 8, 15, 16, 23, 42];
        let mut b = NativeBackend::new(model(&s, 2));
        b.open(0, &greedy()).unwrap();
        b.open(1, &greedy()).unwrap();
        let want = decode(&mut b, 0, &prompt, 8);
        // Sequence 1: the same prompt, then its first token and a draft of the next four
        // with the third one wrong.
        decode(&mut b, 1, &prompt, 1);
        let wrong = (want[3] + 1) % 40;
        let verify = [want[0], want[1], want[2], wrong, want[4]];
        let pos = prompt.len() as u32;
        let out = b.step(&StepPlan {
            work: vec![Work::Verify {
                seq: 1,
                tokens: &verify,
                pos,
            }],
        });
        // Two drafts accepted, then the model's own token where the third was wrong.
        let produced: Vec<i32> = std::iter::once(out[0].result.clone().unwrap().unwrap())
            .chain(out[0].more.iter().map(|t| t.0))
            .collect();
        assert_eq!(produced, want[1..4].to_vec());
        // The cache holds the prompt, the token fed and the two accepted drafts.
        assert_eq!(b.model().kv().seq_len(1), prompt.len() + 3);
        // Decoding goes on exactly as without the verification (the native pass computes
        // each row the same way whatever the batch), and a full acceptance gives a bonus.
        let verify = [want[3], want[4], want[5]];
        let out = b.step(&StepPlan {
            work: vec![Work::Verify {
                seq: 1,
                tokens: &verify,
                pos: pos + 3,
            }],
        });
        let produced: Vec<i32> = std::iter::once(out[0].result.clone().unwrap().unwrap())
            .chain(out[0].more.iter().map(|t| t.0))
            .collect();
        assert_eq!(produced, want[4..7].to_vec());
        assert_eq!(b.model().kv().seq_len(1), prompt.len() + 6);
    }

    #[test]
    fn a_bad_work_fails_alone_and_the_kv_calls_reach_the_cache() {
        let s = synth(Spec::llama(), 8);
        let mut b = NativeBackend::new(model(&s, 2));
        b.open(0, &greedy()).unwrap();
        let a = [1, 2, 3];
        let plan = StepPlan {
            work: vec![
                Work::Prefill {
                    seq: 0,
                    tokens: &a,
                    pos: 0,
                    sample: true,
                },
                // Not opened, and a token outside the vocabulary.
                Work::Decode {
                    seq: 1,
                    token: 999,
                    pos: 0,
                },
            ],
        };
        let out = b.step(&plan);
        assert!(matches!(out[0].result, Ok(Some(_))), "{out:?}");
        assert!(
            matches!(&out[1].result, Err(BackendError::Sequence(m)) if m.contains("999")),
            "{out:?}"
        );
        assert_eq!(b.model().kv().seq_len(0), 3);
        b.share_prefix(0, 1, 2).unwrap();
        assert_eq!(b.model().kv().seq_len(1), 2);
        assert!(b.share_prefix(0, 1, 9).is_err());
        b.truncate(0, 1);
        assert_eq!(b.model().kv().seq_len(0), 1);
        b.free(1);
        assert_eq!(b.model().kv().seq_len(1), 0);
    }

    #[tokio::test]
    async fn the_scheduler_serves_two_requests_on_the_native_backend() {
        let slots = 2;
        let plan = EnginePlan {
            slots,
            queue: 4,
            ctx: N_CTX as u32,
            kv_cells: (slots * N_CTX) as u32,
            shared_kv: false,
            kv_type: crate::config::KvTypes::F16,
            prefill_chunk: STEP_TOKENS,
            n_batch: STEP_TOKENS + slots as u32,
            n_ubatch: STEP_TOKENS,
            threads: 1,
            prefix_cache: crate::config::PrefixCache::On,
            prefix_slots: 0,
            prompt_cache: Default::default(),
            spec: crate::config::Spec::Ngram,
            spec_gate: crate::config::SpecGate::Cost,
            queue_timeout: Duration::from_secs(10),
            step_time_limit: None,
            debug_stall_file: None,
        };
        let (_feed, gate) = ThermalGate::test_feed(0.5, 90.0);
        let clock = Arc::new(crate::engine::clock::SystemClock);
        let engine = spawn(
            plan,
            Arc::new(Metrics::default()),
            gate,
            clock,
            Arc::default(),
            move |runner| {
                // Leaked: the model borrows it and lives on the scheduler thread.
                let s: &'static _ = Box::leak(Box::new(synth(Spec::llama(), 9)));
                runner.run(NativeBackend::new(model(s, slots)), &FakeVocab, None)
            },
        )
        .expect("native backend starts");
        let request = |prompt: Vec<i32>| GenerationRequest {
            prompt_tokens: prompt,
            max_tokens: 6,
            stop: Vec::new(),
            sampling: greedy(),
            received_at: Instant::now(),
            embed: None,
            speculative: true,
        };
        let mut rxs = Vec::new();
        for prompt in [vec![1, 17, 4, 42], vec![49, 3, 3, 21, 8]] {
            rxs.push(engine.submit(request(prompt)).await.expect("accepted"));
        }
        for rx in &mut rxs {
            loop {
                let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                    .await
                    .expect("an event in time")
                    .expect("events until the end");
                match event {
                    Event::Admitted { .. } | Event::Text { .. } | Event::Embedding(_) => {}
                    Event::Finished { reason, usage, .. } => {
                        assert!(matches!(reason, FinishReason::Length | FinishReason::Stop));
                        assert!(usage.completion_tokens >= 1);
                        break;
                    }
                    Event::Failed(e) => panic!("request failed: {e}"),
                }
            }
        }
        engine.shutdown();
        assert!(engine.wait_stopped(Duration::from_secs(5)));
    }
}
