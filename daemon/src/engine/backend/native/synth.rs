//! A synthetic model in memory: GGUF-style metadata and tensors (Q8_0 linear weights, f32
//! norms and biases) of any shape, for the native forward's tests and for benchmarks that
//! need a model's shape but not its weights (`examples/native_decode.rs` on Llama-3-8B's).

use std::collections::HashMap;

use inferloop_kernels::q8::quantize_row;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::hparams::{Arch, Metadata};
use super::weights::{TensorKind, TensorRef, TensorSource};

/// A metadata value.
pub enum Val {
    U(u64),
    F(f32),
    S(String),
}

pub struct Tensor {
    pub kind: TensorKind,
    pub dims: Vec<u64>,
    /// The data starts at `buf[1]`: a misaligned start, as GGUF data may be for f32.
    pub buf: Vec<u8>,
}

pub struct Synth {
    pub meta: HashMap<String, Val>,
    pub tensors: HashMap<String, Tensor>,
}

impl Metadata for Synth {
    fn get_u64(&self, key: &str) -> Option<u64> {
        match self.meta.get(key)? {
            Val::U(v) => Some(*v),
            _ => None,
        }
    }
    fn get_f32(&self, key: &str) -> Option<f32> {
        match self.meta.get(key)? {
            Val::F(v) => Some(*v),
            _ => None,
        }
    }
    fn get_str(&self, key: &str) -> Option<&str> {
        match self.meta.get(key)? {
            Val::S(v) => Some(v),
            _ => None,
        }
    }
}

impl TensorSource for Synth {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.tensors.get(name).map(|t| TensorRef {
            kind: t.kind.clone(),
            dims: t.dims.clone(),
            bytes: &t.buf[1..],
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub rope_dims: usize,
    pub theta: f32,
    pub eps: f32,
    pub tied: bool,
}

impl Spec {
    /// Heads of 32 (the attention kernel's smallest), grouped 2:1.
    pub fn llama() -> Self {
        Self {
            arch: Arch::Llama,
            n_vocab: 50,
            n_embd: 128,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            rope_dims: 32,
            theta: 10000.0,
            eps: 1e-5,
            tied: false,
        }
    }

    /// Biases, NeoX rotation over half of each head, qwen2's base, tied output.
    pub fn qwen2() -> Self {
        Self {
            arch: Arch::Qwen2,
            rope_dims: 16,
            theta: 1_000_000.0,
            eps: 1e-6,
            tied: true,
            ..Self::llama()
        }
    }

    /// SmolLM2-135M's shape (the default model).
    pub fn smollm2() -> Self {
        Self {
            arch: Arch::Llama,
            n_vocab: 49_152,
            n_embd: 576,
            n_layer: 30,
            n_head: 9,
            n_head_kv: 3,
            n_ff: 1536,
            rope_dims: 64,
            theta: 100_000.0,
            eps: 1e-5,
            tied: true,
        }
    }

    /// Llama-3-8B's shape.
    pub fn llama3_8b() -> Self {
        Self {
            arch: Arch::Llama,
            n_vocab: 128_256,
            n_embd: 4096,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            n_ff: 14_336,
            rope_dims: 128,
            theta: 500_000.0,
            eps: 1e-5,
            tied: false,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

pub fn q8_tensor(rng: &mut StdRng, rows: usize, k: usize, amp: f32) -> Tensor {
    let mut buf = vec![0xAA];
    for _ in 0..rows {
        let row: Vec<f32> = (0..k).map(|_| rng.gen_range(-amp..amp)).collect();
        quantize_row(&row, &mut buf);
    }
    Tensor {
        kind: TensorKind::Q8_0,
        dims: vec![k as u64, rows as u64],
        buf,
    }
}

/// Q8_0 rows of random quants under one scale, `amp / 127` (in f16).
pub fn q8_tensor_fast(rng: &mut StdRng, rows: usize, k: usize, amp: f32) -> Tensor {
    let scale = half::f16::from_f32(amp / 127.0).to_bits().to_le_bytes();
    let blocks = rows * k / inferloop_kernels::q8::QK;
    let mut buf = vec![0u8; 1 + blocks * inferloop_kernels::q8::BLOCK_BYTES];
    rng.fill(&mut buf[1..]);
    buf[0] = 0xAA;
    for b in buf[1..].chunks_exact_mut(inferloop_kernels::q8::BLOCK_BYTES) {
        b[..2].copy_from_slice(&scale);
    }
    Tensor {
        kind: TensorKind::Q8_0,
        dims: vec![k as u64, rows as u64],
        buf,
    }
}

pub fn f32_tensor(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Tensor {
    let mut buf = vec![0xAA];
    for _ in 0..n {
        buf.extend_from_slice(&rng.gen_range(lo..hi).to_le_bytes());
    }
    Tensor {
        kind: TensorKind::F32,
        dims: vec![n as u64],
        buf,
    }
}

pub fn synth(spec: Spec, seed: u64) -> Synth {
    build(spec, seed, q8_tensor)
}

/// [`synth`] for benchmarks: Q8_0 blocks written directly (random quants, one scale per
/// matrix), so that a Llama-3-8B-sized model takes seconds, not minutes, to make. The
/// values are meaningless; the shapes and byte counts are the model's.
pub fn synth_for_speed(spec: Spec, seed: u64) -> Synth {
    build(spec, seed, q8_tensor_fast)
}

type Q8Maker = fn(&mut StdRng, usize, usize, f32) -> Tensor;

fn build(spec: Spec, seed: u64, q8_tensor: Q8Maker) -> Synth {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = spec.arch.name();
    let mut meta = HashMap::new();
    let mut put = |k: &str, v: Val| {
        meta.insert(k.replace("{a}", a), v);
    };
    put("general.architecture", Val::S(a.into()));
    put("{a}.vocab_size", Val::U(spec.n_vocab as u64));
    put("{a}.embedding_length", Val::U(spec.n_embd as u64));
    put("{a}.block_count", Val::U(spec.n_layer as u64));
    put("{a}.feed_forward_length", Val::U(spec.n_ff as u64));
    put("{a}.attention.head_count", Val::U(spec.n_head as u64));
    put("{a}.attention.head_count_kv", Val::U(spec.n_head_kv as u64));
    put("{a}.attention.layer_norm_rms_epsilon", Val::F(spec.eps));
    put("{a}.rope.freq_base", Val::F(spec.theta));
    put("{a}.rope.dimension_count", Val::U(spec.rope_dims as u64));
    put("{a}.context_length", Val::U(2048));

    let (e, ff) = (spec.n_embd, spec.n_ff);
    let (qd, kvd) = (
        spec.n_head * spec.head_dim(),
        spec.n_head_kv * spec.head_dim(),
    );
    // Uniform weights of variance 1/k keep activations of order 1 through the layers.
    let amp = |k: usize| (3.0 / k as f32).sqrt();
    let mut t = HashMap::new();
    t.insert(
        "token_embd.weight".to_string(),
        q8_tensor(&mut rng, spec.n_vocab, e, 1.0),
    );
    for l in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        t.insert(n("attn_norm.weight"), f32_tensor(&mut rng, e, 0.5, 1.5));
        t.insert(n("attn_q.weight"), q8_tensor(&mut rng, qd, e, amp(e)));
        t.insert(n("attn_k.weight"), q8_tensor(&mut rng, kvd, e, amp(e)));
        t.insert(n("attn_v.weight"), q8_tensor(&mut rng, kvd, e, amp(e)));
        if spec.arch == Arch::Qwen2 {
            t.insert(n("attn_q.bias"), f32_tensor(&mut rng, qd, -0.5, 0.5));
            t.insert(n("attn_k.bias"), f32_tensor(&mut rng, kvd, -0.5, 0.5));
            t.insert(n("attn_v.bias"), f32_tensor(&mut rng, kvd, -0.5, 0.5));
        }
        t.insert(n("attn_output.weight"), q8_tensor(&mut rng, e, qd, amp(qd)));
        t.insert(n("ffn_norm.weight"), f32_tensor(&mut rng, e, 0.5, 1.5));
        t.insert(n("ffn_gate.weight"), q8_tensor(&mut rng, ff, e, amp(e)));
        t.insert(n("ffn_up.weight"), q8_tensor(&mut rng, ff, e, amp(e)));
        t.insert(n("ffn_down.weight"), q8_tensor(&mut rng, e, ff, amp(ff)));
    }
    t.insert(
        "output_norm.weight".to_string(),
        f32_tensor(&mut rng, e, 0.5, 1.5),
    );
    if !spec.tied {
        t.insert(
            "output.weight".to_string(),
            q8_tensor(&mut rng, spec.n_vocab, e, amp(e)),
        );
    }
    Synth { meta, tensors: t }
}
