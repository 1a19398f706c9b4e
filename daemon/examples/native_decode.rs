//! Decode speed of the native forward pass on a model's shape, with synthetic weights (no
//! model file): prefill a prompt, then decode one token at a time, greedy. Reports tokens/s
//! and the weight bytes each decode step reads over its time, against the device's copy
//! bandwidth measured in the same run — the "fraction of the copy bandwidth".
//!
//! `cargo run --release -p inferloopd --example native_decode -- --device cuda --shape llama3-8b`
//! (`scripts/device-check.sh` runs it on a GPU; `--device cpu --shape smollm2` here.)
//!
//! On the CUDA emulator the driver counts launches and copies, and the report adds
//! `launches_per_token`, `launches_per_layer_per_step` (from a second, one-layer model: the
//! difference is per layer), `graph_launches_per_step` and the bytes copied per token.
//! `--layers N` keeps the shape but only N layers (Llama-3-8B whole needs ~17 GB and is far
//! too slow on the emulator).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use inferloop_kernels::cuda::counters::{self, Counters};
use inferloopd::engine::native::sampling::argmax;
use inferloopd::engine::native::synth::{synth_for_speed, Spec};
use inferloopd::engine::native::{BatchToken, HParams, Model, Weights};
use serde_json::json;

#[derive(Clone, Copy, ValueEnum)]
enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
enum Shape {
    Smollm2,
    #[value(name = "llama3-8b")]
    Llama3_8b,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    #[arg(long, value_enum, default_value_t = Shape::Smollm2)]
    shape: Shape,
    /// Prompt tokens fed before decoding.
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    /// Tokens decoded (timed).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Layers of the shape to build (default: all of them).
    #[arg(long)]
    layers: Option<usize>,
    /// CPU threads for the twins.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Write the result as JSON here too.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (mut spec, name) = match args.shape {
        Shape::Smollm2 => (Spec::smollm2(), "smollm2-135m"),
        Shape::Llama3_8b => (Spec::llama3_8b(), "llama3-8b"),
    };
    if let Some(layers) = args.layers {
        if layers == 0 {
            bail!("--layers must be at least 1");
        }
        spec.n_layer = layers;
    }
    let n_ctx = args.prompt + args.tokens + 1;
    if args.prompt == 0 || n_ctx > 2048 {
        bail!("--prompt must be at least 1 and prompt + tokens below 2048");
    }
    let t0 = Instant::now();
    let s = synth_for_speed(spec, 7);
    let hp = HParams::from_metadata(&s)?;
    let weights = Weights::load(&hp, &s)?;
    // Bytes a decode step reads: every linear weight once, the output projection included.
    let per_token: usize = weights
        .layers
        .iter()
        .map(|l| {
            [
                &l.wq,
                &l.wk,
                &l.wv,
                &l.wo,
                &l.ffn_gate,
                &l.ffn_up,
                &l.ffn_down,
            ]
            .iter()
            .map(|m| m.bytes.len())
            .sum::<usize>()
        })
        .sum::<usize>()
        + weights.output.bytes.len();
    eprintln!(
        "{name}: synthetic weights made in {:.1} s ({:.2} GB read per token)",
        t0.elapsed().as_secs_f64(),
        per_token as f64 / 1e9
    );
    let (mut model, device, ceiling) = match args.device {
        Device::Cpu => {
            let ceiling = inferloop_kernels::bandwidth::cpu_read_gbps(256 << 20, args.threads, 5);
            let m = Model::new(hp.clone(), weights, 1, n_ctx, args.threads)?;
            (m, "cpu".to_string(), ("read", ceiling))
        }
        Device::Cuda => {
            let gpu = inferloop_kernels::cuda::Gpu::open_default(0)?;
            let ceiling = inferloop_kernels::cuda::copy_gbps(&gpu, 1 << 30, 10)?;
            let name = format!("cuda {}", gpu.name);
            let m = Model::new_cuda(hp.clone(), weights, 1, n_ctx, gpu)?;
            (m, name, ("copy", ceiling))
        }
    };
    let nv = hp.n_vocab;
    let prompt: Vec<BatchToken> = (0..args.prompt)
        .map(|i| BatchToken {
            seq: 0,
            token: ((i * 7919 + 1) % nv) as i32,
            pos: i as u32,
        })
        .collect();
    let mut want = vec![false; prompt.len()];
    want[prompt.len() - 1] = true;
    let t = Instant::now();
    let logits = model.forward(&prompt, &want).context("prefill")?;
    let mut next = argmax(logits);
    let prefill_s = t.elapsed().as_secs_f64();
    let before = counters::read();
    let t = Instant::now();
    for i in 0..args.tokens {
        let tok = BatchToken {
            seq: 0,
            token: next,
            pos: (args.prompt + i) as u32,
        };
        next = argmax(model.forward(&[tok], &[true]).context("decode")?);
    }
    let per_step = t.elapsed().as_secs_f64() / args.tokens.max(1) as f64;
    let counted = before.zip(counters::read()).map(|(b, a)| a.since(&b));
    drop(model);
    let gbps = per_token as f64 / per_step / 1e9;
    let mut report = json!({
        "shape": name,
        "device": device,
        "prompt_tokens": args.prompt,
        "prefill_ms": prefill_s * 1e3,
        "decode_tokens": args.tokens,
        "decode_tok_s": 1.0 / per_step,
        "weight_bytes_per_token": per_token,
        "weights_gbps": gbps,
        "ceiling": ceiling.0,
        "ceiling_gbps": ceiling.1,
        "ratio": gbps / ceiling.1,
        "layers": spec.n_layer,
    });
    if let Some(c) = counted {
        let steps = args.tokens.max(1) as f64;
        let per = |n: u64| n as f64 / steps;
        // Kernels run per step, launched one by one or replayed by a graph.
        let kernels = per(c.kernel_launches + c.graph_kernels);
        let other = if spec.n_layer == 1 { 2 } else { 1 };
        let other_kernels = one_step_kernels(spec, other)?;
        let per_layer = (kernels - other_kernels) / (spec.n_layer as f64 - other as f64);
        let extra = json!({
            "launches_per_token": per(c.kernel_launches + c.graph_launches),
            "kernels_per_token": kernels,
            "launches_per_layer_per_step": per_layer,
            "launches_outside_layers_per_step": kernels - per_layer * spec.n_layer as f64,
            "graph_launches_per_step": per(c.graph_launches),
            "graph_kernels_per_step": per(c.graph_kernels),
            "htod_bytes_per_token": per(c.htod_bytes),
            "dtoh_bytes_per_token": per(c.dtoh_bytes),
            "dtod_bytes_per_token": per(c.dtod_bytes),
        });
        if let (Some(r), Some(e)) = (report.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
    }
    println!("{report:#}");
    if let Some(path) = args.json {
        std::fs::write(&path, format!("{report:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Kernels run by one decode step (after a one-token prompt) on a CUDA model of `spec`'s
/// shape with `layers` layers: with the main run's count, the kernels per layer.
fn one_step_kernels(mut spec: Spec, layers: usize) -> Result<f64> {
    spec.n_layer = layers;
    let s = synth_for_speed(spec, 8);
    let hp = HParams::from_metadata(&s)?;
    let weights = Weights::load(&hp, &s)?;
    let gpu = inferloop_kernels::cuda::Gpu::open_default(0)?;
    let mut model = Model::new_cuda(hp, weights, 1, 4, gpu)?;
    let tok = |pos| BatchToken {
        seq: 0,
        token: 1,
        pos,
    };
    // The one-token prompt has the decode step's shape: any graph is built by now.
    model.forward(&[tok(0)], &[true]).context("prefill")?;
    let before = counters::read().unwrap_or_default();
    model.forward(&[tok(1)], &[true]).context("decode")?;
    let after: Counters = counters::read().unwrap_or_default();
    let c = after.since(&before);
    Ok((c.kernel_launches + c.graph_kernels) as f64)
}
