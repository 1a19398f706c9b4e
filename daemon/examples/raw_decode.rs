//! In-process llama.cpp reference: greedy decode straight through llama-cpp-2, no HTTP,
//! no scheduler, `PARALLEL` sequences decoded one token each per `llama_decode`.
//! `cargo run --release -p inferloopd --example raw_decode -- MODEL [THREADS] [TOKENS] [PARALLEL]`
//! The gap between this and the daemon's own `timings` (and `make bench`) is what the serving
//! layer costs.

use std::num::NonZeroU32;
use std::time::Instant;

use anyhow::{Context, Result};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args
        .next()
        .context("usage: raw_decode MODEL [THREADS] [TOKENS]")?;
    let threads: i32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let tokens: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(128);
    let parallel: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);

    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, &model_path, &LlamaModelParams::default())?;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(2048 * parallel as u32))
        .with_n_seq_max(parallel as u32)
        // Like the daemon by default: each sequence owns its cells.
        .with_kv_unified(false)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(&backend, params)?;
    let prompt =
        "<|im_start|>user\nWrite a long story about a dragon.<|im_end|>\n<|im_start|>assistant\n";
    let toks = model.vocab().tokenize(prompt.as_bytes(), true, true);
    let mut batch = LlamaBatch::new(512, parallel as i32);
    let last = toks.len() - 1;
    let started = Instant::now();
    let mut idx = Vec::new();
    // Each sequence's prompt in its own decode, like a server admitting requests one by one.
    for seq in 0..parallel {
        batch.clear();
        for (i, t) in toks.iter().enumerate() {
            batch.add(*t, i as i32, &[seq as i32], i == last)?;
        }
        ctx.decode(&mut batch)?;
        idx.push(batch.n_tokens() - 1);
    }
    let prompt_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut sampler = LlamaSampler::greedy();
    // Sequence 0's text, so a broken reference shows itself.
    let mut text = Vec::new();
    let decode_start = Instant::now();
    for pos in (toks.len() as i32..).take(tokens) {
        let next: Vec<_> = idx.iter().map(|&i| sampler.sample(&ctx, i)).collect();
        model
            .vocab()
            .token_to_piece_into(next[0], &mut text, false, None);
        batch.clear();
        idx.clear();
        for (seq, t) in next.into_iter().enumerate() {
            batch.add(t, pos, &[seq as i32], true)?;
            idx.push(batch.n_tokens() - 1);
        }
        ctx.decode(&mut batch)?;
    }
    let secs = decode_start.elapsed().as_secs_f64();
    let aggregate = (tokens * parallel) as f64 / secs;
    eprintln!("{:?}", String::from_utf8_lossy(&text));
    eprintln!(
        "prompt {} tokens x{parallel} in {prompt_ms:.1} ms; decode {tokens} steps x{parallel}: \
         {aggregate:.1} tok/s aggregate, {:.1} tok/s per sequence ({threads} threads)",
        toks.len(),
        aggregate / parallel as f64
    );
    // One JSON line on stdout for bench/bench.py.
    println!(
        "{}",
        serde_json::json!({
            "threads": threads,
            "parallel": parallel,
            "prompt_tokens": toks.len(),
            "prompt_ms": prompt_ms,
            "tokens": tokens,
            "aggregate_tok_s": aggregate,
            "per_sequence_tok_s": aggregate / parallel as f64,
        })
    );
    Ok(())
}
