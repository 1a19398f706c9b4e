//! What one `llama_decode` of `r` rows of one sequence costs at a given context length, every
//! row with its logits: the price of verifying `r - 1` drafted tokens, against one decoded
//! token (`r = 1`). Speculative decoding gains only where `cost(r) / cost(1)` grows slower
//! than the tokens a verification yields (docs/benchmarks.md#speculative-decoding-make-bench-speed).
//! `cargo run --release --workspace --example verify_cost -- MODEL [THREADS] [CONTEXTS] [MAX_ROWS] [REPS]`
//! CONTEXTS is comma-separated (default 300,1200); one JSON line per (context, rows).

use std::num::NonZeroU32;
use std::time::Instant;

use anyhow::{Context, Result};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: verify_cost MODEL [THREADS] [CONTEXTS] [MAX_ROWS] [REPS]";
    let model_path = args.next().context(usage)?;
    let threads: i32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let contexts: Vec<u32> = args
        .next()
        .unwrap_or_else(|| "300,1200".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context(usage)?;
    let max_rows: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(16);
    let reps: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(12);
    // One batch holds the widest step; a median needs one time at least.
    anyhow::ensure!((1..=512).contains(&max_rows), "MAX_ROWS must be 1 to 512");
    anyhow::ensure!(reps >= 1, "REPS must be at least 1");

    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, &model_path, &LlamaModelParams::default())?;
    let longest = contexts.iter().max().copied().unwrap_or(0) + max_rows;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(longest.next_multiple_of(256)))
        .with_n_batch(512)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(&backend, params)?;
    // Any tokens do: the cost depends on how many rows attend over how many cells.
    let token = |i: u32| LlamaToken(1000 + (u64::from(i) * 7919 % 20000) as i32);
    let mut batch = LlamaBatch::new(512, 1);
    for &context in &contexts {
        ctx.clear_kv_cache();
        for start in (0..context).step_by(512) {
            batch.clear();
            for i in start..(start + 512).min(context) {
                batch.add(token(i), i as i32, &[0], false)?;
            }
            ctx.decode(&mut batch)?;
        }
        let mut one = 0.0;
        for rows in 1..=max_rows {
            let mut times = Vec::with_capacity(reps as usize);
            for _ in 0..reps {
                batch.clear();
                for i in 0..rows {
                    batch.add(token(context + i), (context + i) as i32, &[0], true)?;
                }
                let started = Instant::now();
                ctx.decode(&mut batch)?;
                times.push(started.elapsed().as_secs_f64() * 1000.0);
                // The rows go again, like a rejected draft's.
                ctx.clear_kv_cache_seq(Some(0), Some(context), None)?;
            }
            times.sort_by(f64::total_cmp);
            let ms = times[times.len() / 2];
            if rows == 1 {
                one = ms;
            }
            println!(
                "{}",
                serde_json::json!({
                    "threads": threads,
                    "context": context,
                    "rows": rows,
                    "median_ms": ms,
                    "relative_to_one_row": ms / one,
                })
            );
        }
    }
    Ok(())
}
