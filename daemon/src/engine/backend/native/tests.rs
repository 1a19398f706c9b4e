//! The forward pass on a tiny synthetic model, checked against an f64 reference written
//! here from the model's definition (dequantized weights, plain f64 math, exact softmax and
//! RoPE), and the batching, KV and loading rules around it.

use half::f16;
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{BLOCK_BYTES, QK};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::synth::{f32_tensor, synth, Spec, Synth, Val};
use super::*;

// ---------------------------------------------------------------------------------------
// The f64 reference: the model's definition, one sequence at a time, nothing shared with
// the kernels but the weights' bytes.

struct RefLayer {
    attn_norm: Vec<f64>,
    wq: Vec<Vec<f64>>,
    wk: Vec<Vec<f64>>,
    wv: Vec<Vec<f64>>,
    bq: Option<Vec<f64>>,
    bk: Option<Vec<f64>>,
    bv: Option<Vec<f64>>,
    wo: Vec<Vec<f64>>,
    ffn_norm: Vec<f64>,
    gate: Vec<Vec<f64>>,
    up: Vec<Vec<f64>>,
    down: Vec<Vec<f64>>,
}

struct Reference {
    spec: Spec,
    embd: Vec<Vec<f64>>,
    layers: Vec<RefLayer>,
    out_norm: Vec<f64>,
    output: Vec<Vec<f64>>,
}

/// Q8_0 rows: per 34-byte block, an f16 scale times 32 signed bytes.
fn ref_matrix(s: &Synth, name: &str) -> Vec<Vec<f64>> {
    let t = &s.tensors[name];
    let (k, rows) = (t.dims[0] as usize, t.dims[1] as usize);
    let bytes = &t.buf[1..];
    let row_len = k / QK * BLOCK_BYTES;
    (0..rows)
        .map(|r| {
            bytes[r * row_len..(r + 1) * row_len]
                .chunks(BLOCK_BYTES)
                .flat_map(|b| {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
                    b[2..].iter().map(move |&q| d * f64::from(q as i8))
                })
                .collect()
        })
        .collect()
}

fn ref_vector(s: &Synth, name: &str) -> Option<Vec<f64>> {
    s.tensors.get(name).map(|t| {
        t.buf[1..]
            .chunks(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect()
    })
}

fn matvec(w: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    w.iter()
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
}

fn add_bias(x: &mut [f64], b: &Option<Vec<f64>>) {
    if let Some(b) = b {
        x.iter_mut().zip(b).for_each(|(v, c)| *v += c);
    }
}

impl Reference {
    fn new(spec: Spec, s: &Synth) -> Self {
        let v = |n: &str| ref_vector(s, n).unwrap();
        let layers = (0..spec.n_layer)
            .map(|l| {
                let n = |t: &str| format!("blk.{l}.{t}");
                RefLayer {
                    attn_norm: v(&n("attn_norm.weight")),
                    wq: ref_matrix(s, &n("attn_q.weight")),
                    wk: ref_matrix(s, &n("attn_k.weight")),
                    wv: ref_matrix(s, &n("attn_v.weight")),
                    bq: ref_vector(s, &n("attn_q.bias")),
                    bk: ref_vector(s, &n("attn_k.bias")),
                    bv: ref_vector(s, &n("attn_v.bias")),
                    wo: ref_matrix(s, &n("attn_output.weight")),
                    ffn_norm: v(&n("ffn_norm.weight")),
                    gate: ref_matrix(s, &n("ffn_gate.weight")),
                    up: ref_matrix(s, &n("ffn_up.weight")),
                    down: ref_matrix(s, &n("ffn_down.weight")),
                }
            })
            .collect();
        let embd = ref_matrix(s, "token_embd.weight");
        let output = if spec.tied {
            embd.clone()
        } else {
            ref_matrix(s, "output.weight")
        };
        Self {
            spec,
            embd,
            layers,
            out_norm: v("output_norm.weight"),
            output,
        }
    }

    /// Rotates each head of `x` for position `pos`: pair `i` by `pos * base^(-2i/rot)`.
    fn rope(&self, x: &mut [f64], pos: usize) {
        let (hd, rot) = (self.spec.head_dim(), self.spec.rope_dims);
        let half = rot / 2;
        for head in x.chunks_mut(hd) {
            for i in 0..half {
                let theta =
                    pos as f64 * f64::from(self.spec.theta).powf(-2.0 * i as f64 / rot as f64);
                let (s, c) = theta.sin_cos();
                let (i0, i1) = match self.spec.arch {
                    Arch::Llama => (2 * i, 2 * i + 1),
                    Arch::Qwen2 => (i, i + half),
                };
                let (a, b) = (head[i0], head[i1]);
                head[i0] = a * c - b * s;
                head[i1] = a * s + b * c;
            }
        }
    }

    /// Logits after every token of `tokens`, fed at positions 0, 1, ….
    fn logits(&self, tokens: &[i32]) -> Vec<Vec<f64>> {
        let sp = self.spec;
        let (hd, eps) = (sp.head_dim(), f64::from(sp.eps));
        let group = sp.n_head / sp.n_head_kv;
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| self.embd[t as usize].clone())
            .collect();
        for ly in &self.layers {
            let mut keys = Vec::new();
            let mut vals = Vec::new();
            for (p, x) in xs.iter_mut().enumerate() {
                let h = rms_norm(x, &ly.attn_norm, eps);
                let mut q = matvec(&ly.wq, &h);
                let mut k = matvec(&ly.wk, &h);
                let mut v = matvec(&ly.wv, &h);
                add_bias(&mut q, &ly.bq);
                add_bias(&mut k, &ly.bk);
                add_bias(&mut v, &ly.bv);
                self.rope(&mut q, p);
                self.rope(&mut k, p);
                keys.push(k);
                vals.push(v);
                let mut o = vec![0.0; sp.n_head * hd];
                for h in 0..sp.n_head {
                    let (qh, g) = (&q[h * hd..(h + 1) * hd], h / group);
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|k| {
                            let kh = &k[g * hd..(g + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (w, v) in e.iter().zip(&vals) {
                        for d in 0..hd {
                            o[h * hd + d] += w / z * v[g * hd + d];
                        }
                    }
                }
                x.iter_mut()
                    .zip(matvec(&ly.wo, &o))
                    .for_each(|(a, b)| *a += b);
                let h = rms_norm(x, &ly.ffn_norm, eps);
                let act: Vec<f64> = matvec(&ly.gate, &h)
                    .iter()
                    .zip(matvec(&ly.up, &h))
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                x.iter_mut()
                    .zip(matvec(&ly.down, &act))
                    .for_each(|(a, b)| *a += b);
            }
        }
        xs.iter()
            .map(|x| matvec(&self.output, &rms_norm(x, &self.out_norm, eps)))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

const N_CTX: usize = 32;
const THREADS: usize = 2;
/// The f32 forward (f16 KV cache, kernel exp and RoPE) against the f64 reference, per row.
const REL_TOL: f64 = 1e-3;
const ABS_TOL: f64 = 1e-4;
/// With activations quantized to 8 bits (llama.cpp's numerics for Q8_0 weights) the
/// reference, which keeps them exact, is further away: each input is off by up to half a
/// step of its block's `max / 127`.
const REL_TOL_Q8: f64 = 3e-2;

/// Both activation modes, each with the tolerance it is held to against the reference.
const MODES: [(Activations, f64); 2] = [(Activations::F32, REL_TOL), (Activations::Q8, REL_TOL_Q8)];

const PROMPT_A: [i32; 7] = [1, 17, 4, 42, 9, 33, 0];
const PROMPT_B: [i32; 5] = [49, 3, 3, 21, 8];

fn model<'a>(s: &'a Synth, n_seq: usize) -> Model<'a> {
    model_with(s, n_seq, Activations::default())
}

fn model_with<'a>(s: &'a Synth, n_seq: usize, activations: Activations) -> Model<'a> {
    let hp = HParams::from_metadata(s).unwrap();
    let w = Weights::load(&hp, s).unwrap();
    let mut m = Model::new(hp, w, n_seq, N_CTX, THREADS).unwrap();
    m.set_activations(activations).unwrap();
    m
}

fn toks(seq: usize, tokens: &[i32], pos0: u32) -> Vec<BatchToken> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: pos0 + i as u32,
        })
        .collect()
}

fn rows(logits: &[f32], n_vocab: usize) -> Vec<Vec<f32>> {
    logits.chunks(n_vocab).map(<[f32]>::to_vec).collect()
}

/// Checks each row against the reference to `max|diff| <= rel * max|logit| + ABS_TOL`;
/// returns the worst `max|diff| / max|logit|`.
fn check_rows(got: &[Vec<f32>], want: &[Vec<f64>], rel: f64, what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    let mut worst: f64 = 0.0;
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let diff = g
            .iter()
            .zip(w)
            .fold(0.0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs()));
        assert!(
            diff <= rel * scale + ABS_TOL,
            "{what}: token {t}: max |diff| {diff:e} with max |logit| {scale}"
        );
        worst = worst.max(diff / scale);
    }
    worst
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// The prompt fed whole, one token at a time, and interleaved with another sequence (its
/// first chunk beside a decode): every way matches the reference, and gives the same bits,
/// in both activation modes.
fn three_ways_agree(spec: Spec, seed: u64) {
    for (activations, rel) in MODES {
        three_ways_agree_with(spec, seed, activations, rel);
    }
}

fn three_ways_agree_with(spec: Spec, seed: u64, activations: Activations, rel: f64) {
    let s = synth(spec, seed);
    let reference = Reference::new(spec, &s);
    let (want_a, want_b) = (reference.logits(&PROMPT_A), reference.logits(&PROMPT_B));
    let nv = spec.n_vocab;

    // (a) One chunk.
    let mut m = model_with(&s, 2, activations);
    let chunk = rows(m.forward(&toks(0, &PROMPT_A, 0), &[true; 7]).unwrap(), nv);
    let worst_a = check_rows(&chunk, &want_a, rel, "one chunk");

    // (b) Token by token.
    let mut m = model_with(&s, 2, activations);
    let single: Vec<Vec<f32>> = (0..PROMPT_A.len())
        .map(|i| {
            m.forward(&toks(0, &PROMPT_A[i..=i], i as u32), &[true])
                .unwrap()
                .to_vec()
        })
        .collect();
    let worst_b = check_rows(&single, &want_a, rel, "token by token");

    // (c) Interleaved: sequence 1's first three prompt tokens beside sequence 0's first
    // token, then one token of each per step (sequence 1 ahead), until both are done.
    let mut m = model_with(&s, 2, activations);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut batch = toks(1, &PROMPT_B[..3], 0);
    batch.extend(toks(0, &PROMPT_A[..1], 0));
    let out = rows(m.forward(&batch, &[true; 4]).unwrap(), nv);
    got_b.extend_from_slice(&out[..3]);
    got_a.push(out[3].clone());
    for i in 1..PROMPT_A.len() {
        let mut batch = toks(0, &PROMPT_A[i..=i], i as u32);
        let j = i + 2;
        if j < PROMPT_B.len() {
            // Sequence 1 first: the batch need not be in sequence order.
            batch.insert(0, toks(1, &PROMPT_B[j..=j], j as u32)[0]);
        }
        let out = rows(m.forward(&batch, &vec![true; batch.len()]).unwrap(), nv);
        if out.len() == 2 {
            got_b.push(out[0].clone());
        }
        got_a.push(out.last().unwrap().clone());
    }
    let worst_c = check_rows(&got_a, &want_a, rel, "interleaved, sequence 0");
    let worst_cb = check_rows(&got_b, &want_b, rel, "interleaved, sequence 1");
    eprintln!(
        "{:?} {activations:?}: worst max|diff|/max|logit|: chunk {worst_a:.2e}, single {worst_b:.2e}, \
         interleaved {worst_c:.2e} / {worst_cb:.2e}",
        spec.arch
    );

    for t in 0..PROMPT_A.len() {
        let top = argmax(&chunk[t]);
        assert_eq!(
            argmax(&single[t]),
            top,
            "top-1 of token {t}, token by token"
        );
        assert_eq!(argmax(&got_a[t]), top, "top-1 of token {t}, interleaved");
    }
    // Stronger: a column's arithmetic never depends on the other columns.
    assert_eq!(chunk, single, "one chunk vs token by token");
    assert_eq!(chunk, got_a, "one chunk vs interleaved");
}

// ---------------------------------------------------------------------------------------
// Tests.

#[test]
fn llama_prompt_matches_the_reference_in_one_chunk_token_by_token_and_interleaved() {
    three_ways_agree(Spec::llama(), 1);
}

#[test]
fn qwen2_with_biases_neox_partial_rotation_and_tied_output_matches_the_reference() {
    let s = synth(Spec::qwen2(), 2);
    let hp = HParams::from_metadata(&s).unwrap();
    let w = Weights::load(&hp, &s).unwrap();
    assert!(w.tied_output);
    assert!(w
        .layers
        .iter()
        .all(|l| l.bq.is_some() && l.bk.is_some() && l.bv.is_some()));
    three_ways_agree(Spec::qwen2(), 2);
}

#[test]
fn a_prompt_longer_than_one_pass_matches_the_reference() {
    let spec = Spec::llama();
    let s = synth(spec, 3);
    let prompt: Vec<i32> = (0..19).map(|i| (i * 7 + 3) % spec.n_vocab as i32).collect();
    let want = Reference::new(spec, &s).logits(&prompt);
    // Logits for a few tokens only: across the passes of 8, 8 and 3 tokens.
    let pick = [2, 8, 15, 18];
    let wanted: Vec<bool> = (0..prompt.len()).map(|i| pick.contains(&i)).collect();
    let want: Vec<Vec<f64>> = pick.iter().map(|&i| want[i].clone()).collect();
    for (activations, rel) in MODES {
        let mut m = model_with(&s, 1, activations);
        let got = rows(
            m.forward(&toks(0, &prompt, 0), &wanted).unwrap(),
            spec.n_vocab,
        );
        check_rows(&got, &want, rel, "19 tokens in one batch");
        assert_eq!(m.kv().seq_len(0), 19);
    }
}

#[test]
fn every_isa_and_thread_count_gives_the_same_logits() {
    let s = synth(Spec::llama(), 4);
    let mut base = None;
    for isa in Isa::available() {
        for threads in [1, 3] {
            let hp = HParams::from_metadata(&s).unwrap();
            let w = Weights::load(&hp, &s).unwrap();
            let mut pass = CpuPass::new(hp.clone(), w, 1, N_CTX, THREADS).unwrap();
            pass.set_isa(isa);
            pass.set_threads(threads);
            let mut m = Model::with_pass(hp, Box::new(pass));
            let out = m
                .forward(&toks(0, &PROMPT_A, 0), &[true; 7])
                .unwrap()
                .to_vec();
            match &base {
                None => base = Some(out),
                Some(b) => assert_eq!(&out, b, "{isa:?} with {threads} threads"),
            }
        }
    }
}

#[test]
fn a_kv_prefix_copy_gives_the_logits_of_recomputation() {
    let s = synth(Spec::llama(), 5);
    let nv = Spec::llama().n_vocab;
    let mut m = model(&s, 3);
    let full = rows(m.forward(&toks(0, &PROMPT_A, 0), &[true; 7]).unwrap(), nv);
    // Sequence 2 holds another prompt first: the copy replaces it.
    m.forward(&toks(2, &PROMPT_B, 0), &[false; 5]).unwrap();
    for dst in [1, 2] {
        m.kv_mut().copy_prefix(0, dst, 4).unwrap();
        assert_eq!(m.kv().seq_len(dst), 4);
        let rest = rows(
            m.forward(&toks(dst, &PROMPT_A[4..], 4), &[true; 3])
                .unwrap(),
            nv,
        );
        assert_eq!(rest, full[4..], "sequence {dst} after copying 4 positions");
    }
    // Truncating and feeding again recomputes the same.
    m.kv_mut().truncate(0, 2).unwrap();
    assert_eq!(m.kv().seq_len(0), 2);
    let again = rows(
        m.forward(&toks(0, &PROMPT_A[2..], 2), &[true; 5]).unwrap(),
        nv,
    );
    assert_eq!(again, full[2..]);
    // A copy longer than the source holds is refused.
    m.kv_mut().clear(1).unwrap();
    assert!(matches!(
        m.kv_mut().copy_prefix(1, 0, 1),
        Err(NativeError::Kv(_))
    ));
}

#[test]
fn a_q4_1_linear_weight_is_refused_at_load_naming_the_tensor() {
    let mut s = synth(Spec::llama(), 6);
    s.tensors.get_mut("blk.1.ffn_up.weight").unwrap().kind = TensorKind::Other("Q4_1".into());
    let hp = HParams::from_metadata(&s).unwrap();
    let err = Weights::load(&hp, &s).err().unwrap();
    assert_eq!(
        err,
        NativeError::TensorType {
            name: "blk.1.ffn_up.weight".into(),
            kind: "Q4_1".into(),
            expected: "Q8_0",
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("Q4_1"),
        "{msg}"
    );
}

#[test]
fn a_missing_or_misshapen_tensor_is_named() {
    let mut s = synth(Spec::llama(), 7);
    s.tensors.remove("blk.0.ffn_norm.weight");
    let hp = HParams::from_metadata(&s).unwrap();
    assert_eq!(
        Weights::load(&hp, &s).err(),
        Some(NativeError::MissingTensor("blk.0.ffn_norm.weight".into()))
    );
    let mut s = synth(Spec::llama(), 7);
    s.tensors.get_mut("blk.0.attn_k.weight").unwrap().dims = vec![128, 128];
    assert!(matches!(
        Weights::load(&hp, &s),
        Err(NativeError::TensorShape { name, .. }) if name == "blk.0.attn_k.weight"
    ));
    let mut s = synth(Spec::llama(), 7);
    let bias = f32_tensor(&mut StdRng::seed_from_u64(0), 128, -1.0, 1.0);
    s.tensors.insert("blk.1.attn_output.bias".into(), bias);
    assert!(matches!(
        Weights::load(&hp, &s),
        Err(NativeError::Unsupported(why)) if why.contains("blk.1.attn_output.bias")
    ));
    let mut s = synth(Spec::llama(), 7);
    s.tensors.get_mut("output.weight").unwrap().buf.pop();
    assert!(matches!(
        Weights::load(&hp, &s),
        Err(NativeError::TensorSize { name, .. }) if name == "output.weight"
    ));
}

#[test]
fn hparams_name_a_missing_key_and_refuse_what_the_kernels_cannot_run() {
    let mut s = synth(Spec::llama(), 8);
    let hp = HParams::from_metadata(&s).unwrap();
    assert_eq!((hp.head_dim, hp.q_dim(), hp.kv_dim()), (32, 128, 64));
    assert_eq!(
        hp.arch.rope_mode(),
        inferloop_kernels::cpu::rope::RopeMode::Normal
    );

    // Defaults: rope base 10000, rotation over the whole head.
    s.meta.remove("llama.rope.freq_base");
    s.meta.remove("llama.rope.dimension_count");
    let hp = HParams::from_metadata(&s).unwrap();
    assert_eq!((hp.rope_theta, hp.rope_dims), (10000.0, 32));

    s.meta.remove("llama.block_count");
    assert_eq!(
        HParams::from_metadata(&s).err(),
        Some(NativeError::MissingKey {
            key: "llama.block_count".into(),
            expected: "an integer"
        })
    );

    let mut s = synth(Spec::llama(), 8);
    s.meta
        .insert("general.architecture".into(), Val::S("gpt2".into()));
    let err = HParams::from_metadata(&s).err().unwrap();
    assert_eq!(err, NativeError::UnsupportedArch("gpt2".into()));
    assert_eq!(err.kind(), "unsupported_arch");

    // Heads of 16: the attention kernel takes multiples of 32.
    let mut s = synth(Spec::llama(), 8);
    s.meta
        .insert("llama.attention.head_count".into(), Val::U(8));
    assert!(matches!(
        HParams::from_metadata(&s),
        Err(NativeError::Unsupported(why)) if why.contains("head size 16")
    ));

    let mut s = synth(Spec::llama(), 8);
    s.meta
        .insert("llama.rope.scaling.type".into(), Val::S("yarn".into()));
    s.meta
        .insert("llama.rope.scaling.factor".into(), Val::F(4.0));
    assert!(matches!(
        HParams::from_metadata(&s),
        Err(NativeError::Unsupported(why)) if why.contains("yarn")
    ));
}

#[test]
fn a_bad_batch_is_refused_before_anything_runs() {
    let s = synth(Spec::llama(), 9);
    let mut m = model(&s, 2);
    m.forward(&toks(0, &PROMPT_A[..3], 0), &[false; 3]).unwrap();
    let bt = |seq, token, pos| BatchToken { seq, token, pos };
    let bad: [(&[BatchToken], usize, &str); 6] = [
        (&[bt(0, 1, 4)], 0, "gap"),
        (&[bt(1, 1, 0), bt(0, 50, 3)], 1, "vocabulary"),
        (&[bt(0, -1, 3)], 0, "vocabulary"),
        (&[bt(2, 1, 0)], 0, "outside the cache"),
        (&[bt(1, 1, N_CTX as u32)], 0, "beyond the context"),
        (&[bt(0, 1, 3), bt(0, 1, 5)], 1, "does not follow"),
    ];
    for (batch, at, why) in bad {
        let err = m.forward(batch, &vec![true; batch.len()]).err().unwrap();
        assert!(
            matches!(&err, NativeError::Batch { index, why: w } if *index == at && w.contains(why)),
            "{why}: {err}"
        );
        assert_eq!((m.kv().seq_len(0), m.kv().seq_len(1)), (3, 0));
    }
    assert!(matches!(
        m.forward(&[bt(0, 1, 3)], &[]),
        Err(NativeError::Batch { .. })
    ));
    // A lower position rewrites from there on.
    m.forward(&[bt(0, 5, 1)], &[false]).unwrap();
    assert_eq!(m.kv().seq_len(0), 2);
}

/// A pass that stores nothing and fails any micro-batch holding token 49: the model's
/// batch rules, without a model.
struct FailingPass {
    kv: KvCache<NoCells>,
}

struct NoCells;

impl super::kv::Cells for NoCells {
    fn copy(&mut self, _: usize, _: usize, _: usize) -> Result<(), NativeError> {
        Ok(())
    }

    fn read(&mut self, _: usize, _: usize, _: &mut [u8]) -> Result<(), NativeError> {
        Ok(())
    }

    fn write(&mut self, _: usize, _: usize, _: &[u8]) -> Result<(), NativeError> {
        Ok(())
    }
}

impl Pass for FailingPass {
    fn run(&mut self, toks: &[BatchToken], _: &[bool], _: &mut [f32]) -> Result<(), NativeError> {
        if toks.iter().any(|t| t.token == 49) {
            return Err(NativeError::Kernel {
                what: "fake".into(),
                why: "token 49".into(),
            });
        }
        self.kv.hold(toks);
        Ok(())
    }

    fn kv(&self) -> &dyn Kv {
        &self.kv
    }

    fn kv_mut(&mut self) -> &mut dyn Kv {
        &mut self.kv
    }

    fn set_activations(&mut self, _: Activations) -> Result<(), NativeError> {
        Ok(())
    }

    fn gpu(&self) -> Option<(&str, usize)> {
        None
    }
}

#[test]
fn after_a_failed_micro_batch_the_batch_sequences_keep_what_they_held_before_it() {
    let s = synth(Spec::llama(), 13);
    let hp = HParams::from_metadata(&s).unwrap();
    let pass = FailingPass {
        kv: KvCache::new(hp.n_layer, 2, N_CTX, hp.kv_dim(), NoCells),
    };
    let mut m = Model::with_pass(hp, Box::new(pass));
    m.forward(&toks(0, &[1, 2, 3, 4], 0), &[false; 4]).unwrap();
    assert_eq!(m.kv().seq_len(0), 4);
    // Sequence 1 fills the first micro-batch, which is stored; sequence 0 rewrites from
    // position 2 in the second, which fails: both drop back to their first position here.
    let mut batch = toks(1, &[5; UBATCH], 0);
    batch.extend(toks(0, &[6, 49], 2));
    let err = m.forward(&batch, &vec![false; batch.len()]).unwrap_err();
    assert!(matches!(err, NativeError::Kernel { .. }), "{err}");
    assert_eq!((m.kv().seq_len(0), m.kv().seq_len(1)), (2, 0));
}

/// GPU tests live in a `gpu` module: the device check counts them from `--list`.
mod gpu {
    use super::*;

    /// The CUDA pass against the CPU twins on the same weights: a prompt longer than one pass
    /// and a second sequence interleaved, a prefix copy and a truncation, for both
    /// architectures, bit for bit (each kernel gives its twin's bits). Skipped, saying why,
    /// without a GPU; `scripts/device-check.sh` runs it where there is one.
    #[test]
    fn the_cuda_pass_gives_the_cpu_twins_logits() {
        let Some(gpu) = inferloop_kernels::cuda::test_gpu() else {
            return;
        };
        let mut gpu = Some(gpu);
        for (spec, seed) in [(Spec::llama(), 11), (Spec::qwen2(), 12)] {
            let nv = spec.n_vocab;
            let s = synth(spec, seed);
            let hp = HParams::from_metadata(&s).unwrap();
            let g = match gpu.take() {
                Some(g) => g,
                None => inferloop_kernels::cuda::Gpu::open_default(0).unwrap(),
            };
            let w = Weights::load(&hp, &s).unwrap();
            let mut dev = Model::new_cuda(hp, w, 3, N_CTX, g).unwrap();
            let mut cpu = model(&s, 3);
            let long: Vec<i32> = (0..(2 * super::super::forward::UBATCH as i32 + 3))
                .map(|i| (i * 5 + 1) % nv as i32)
                .collect();
            let feed =
                |dev: &mut Model<'_>, cpu: &mut Model<'_>, batch: &[BatchToken], want: &[bool]| {
                    let d = dev.forward(batch, want).unwrap().to_vec();
                    let c = cpu.forward(batch, want).unwrap().to_vec();
                    assert_eq!(d.len(), c.len());
                    for (i, (a, b)) in d.iter().zip(&c).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "logit {i}: gpu {a} vs cpu {b}");
                    }
                };
            feed(
                &mut dev,
                &mut cpu,
                &toks(0, &long, 0),
                &vec![true; long.len()],
            );
            let mut mixed = toks(1, &PROMPT_B, 0);
            mixed.extend(toks(0, &PROMPT_A[..2], long.len() as u32));
            feed(&mut dev, &mut cpu, &mixed, &[true; 7]);
            for m in [&mut dev, &mut cpu] {
                m.kv_mut().copy_prefix(0, 2, 4).unwrap();
                m.kv_mut().truncate(1, 2).unwrap();
            }
            let mut after = toks(2, &PROMPT_A[..3], 4);
            after.extend(toks(1, &PROMPT_A[..1], 2));
            feed(&mut dev, &mut cpu, &after, &[true; 4]);
        }
    }
}
