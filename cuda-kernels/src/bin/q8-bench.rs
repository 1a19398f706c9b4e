//! Q8_0 GEMV (and, on the CPU, GEMM) throughput against the device's copy bandwidth,
//! measured in the same run.
//!
//! One row per {kernel, shape, batch}: `gbps` counts the weight and activation bytes read
//! per second (`q8_gemv`: f32 activations; `gemv_q8` (the decode GEMV) and `q8_gemm`:
//! activations already quantized to Q8 blocks, as the native backend's Q8 path hands them
//! over: its int8 quants and f32 scales, the quantization itself not timed); `ceiling_gbps` is the copy bandwidth (bytes read + written, as STREAM and
//! CUDA's bandwidth tests count it); `ratio = gbps / ceiling_gbps`. On the CPU, `read_gbps`
//! (a streaming read) is reported too: a GEMV only reads, so that is its own ceiling.
//! On a GPU the launches cycle through copies of the matrix at distinct addresses, more
//! than twice the L2 in all, so that every launch reads its weights from DRAM (re-reading
//! one matrix would be served by a large L2 such as an H200's, and ratios could exceed 1).
//! Built with `--features thermal` (`make kernel-bench`, `make device-bundle`), a CUDA row
//! also carries the GPU clock the board's thermal sources report during the run.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde::Serialize;

use inferloop_kernels::bandwidth;
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{self, Q8Matrix};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    Cpu,
    Cuda,
}

#[derive(Parser)]
#[command(about = "Q8_0 GEMV (and CPU GEMM) bandwidth on the CPU twin or a CUDA GPU")]
struct Args {
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Right-hand columns per GEMV.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    batch: Vec<usize>,
    /// Timed repetitions per row (the best counts).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Only the default model's shapes (a quick run).
    #[arg(long)]
    small: bool,
}

/// A weight matrix the models have: rows x k.
struct Shape {
    name: &'static str,
    rows: usize,
    k: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "smollm2-135m attn 576x576",
        rows: 576,
        k: 576,
    },
    Shape {
        name: "smollm2-135m ffn_up 1536x576",
        rows: 1536,
        k: 576,
    },
    Shape {
        name: "smollm2-135m ffn_down 576x1536",
        rows: 576,
        k: 1536,
    },
    Shape {
        name: "smollm2-135m output 49152x576",
        rows: 49152,
        k: 576,
    },
    Shape {
        name: "llama3-8b attn 4096x4096",
        rows: 4096,
        k: 4096,
    },
    Shape {
        name: "llama3-8b ffn_up 14336x4096",
        rows: 14336,
        k: 4096,
    },
    Shape {
        name: "llama3-8b ffn_down 4096x14336",
        rows: 4096,
        k: 14336,
    },
];

#[derive(Serialize)]
struct Row {
    kernel: &'static str,
    shape: String,
    batch: usize,
    device: String,
    gbps: f64,
    ceiling_gbps: f64,
    ratio: f64,
    /// CPU only: streaming read bandwidth and the ratio against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    read_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read_ratio: Option<f64>,
    /// GPU memory (or SM) clock read during the run, when the platform says.
    clock_mhz: Option<f64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.batch.iter().any(|&b| !(1..=8).contains(&b)) {
        bail!("--batch takes 1 to 8 columns");
    }
    let shapes: Vec<&Shape> = SHAPES
        .iter()
        .filter(|s| !args.small || s.name.starts_with("smollm2"))
        .collect();
    let rows = match args.device {
        Device::Cpu => cpu_rows(&args, &shapes)?,
        Device::Cuda => cuda::rows(&args, &shapes)?,
    };
    println!(
        "{:<8} {:<32} {:>5} {:>9} {:>9} {:>6} {:>9} {:>6}",
        "kernel", "shape", "batch", "GB/s", "ceiling", "ratio", "read", "ratio"
    );
    for r in &rows {
        println!(
            "{:<8} {:<32} {:>5} {:>9.1} {:>9.1} {:>6.2} {:>9} {:>6}",
            r.kernel,
            r.shape,
            r.batch,
            r.gbps,
            r.ceiling_gbps,
            r.ratio,
            r.read_gbps.map_or("-".into(), |v| format!("{v:.1}")),
            r.read_ratio.map_or("-".into(), |v| format!("{v:.2}")),
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A random Q8_0 matrix (scales and quants drawn from a fixed LCG: reproducible, no deps).
fn random_q8(rows: usize, k: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let mut x = Vec::with_capacity(k);
    let mut out = Vec::with_capacity(rows * q8::row_bytes(k));
    for _ in 0..rows {
        x.clear();
        x.extend((0..k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0));
        q8::quantize_row(&x, &mut out);
    }
    out
}

fn activations(k: usize, batch: usize) -> Vec<f32> {
    (0..k * batch)
        .map(|i| ((i % 97) as f32 - 48.0) / 48.0)
        .collect()
}

fn cpu_rows(args: &Args, shapes: &[&Shape]) -> Result<Vec<Row>> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let isa = Isa::detect();
    // 256 MiB: far beyond the caches, like the 8B model's weights.
    let ceiling = bandwidth::cpu_copy_gbps(256 << 20, threads, 5);
    let read = bandwidth::cpu_read_gbps(256 << 20, threads, 5);
    eprintln!("cpu: {isa:?}, {threads} threads, copy {ceiling:.1} GB/s, read {read:.1} GB/s");
    let cpu_row = |kernel, shape: &Shape, batch, gbps| Row {
        kernel,
        shape: shape.name.to_string(),
        batch,
        device: format!("cpu {isa:?} x{threads}"),
        gbps,
        ceiling_gbps: ceiling,
        ratio: gbps / ceiling,
        read_gbps: Some(read),
        read_ratio: Some(gbps / read),
        clock_mhz: None,
    };
    let mut rows = Vec::new();
    for shape in shapes {
        let bytes = random_q8(shape.rows, shape.k);
        let w = Q8Matrix::new(&bytes, shape.rows, shape.k)?;
        for &batch in &args.batch {
            let x = activations(shape.k, batch);
            let mut y = vec![0f32; shape.rows * batch];
            let mut fastest = f64::INFINITY;
            for _ in 0..args.reps.max(1) + 1 {
                let t = Instant::now();
                inferloop_kernels::cpu::gemv::gemv(isa, threads, &w, &x, batch, &mut y)?;
                fastest = fastest.min(t.elapsed().as_secs_f64());
            }
            let moved = bytes.len() + x.len() * 4;
            let gbps = moved as f64 / fastest / 1e9;
            rows.push(cpu_row("q8_gemv", shape, batch, gbps));

            let act = inferloop_kernels::cpu::quantize::quantize(isa, &x, shape.k)?;
            let moved = bytes.len() + act.q.len() + act.d.len() * 4;
            let mut fastest = f64::INFINITY;
            for _ in 0..args.reps.max(1) + 1 {
                let t = Instant::now();
                inferloop_kernels::cpu::gemv_q8::gemv_q8(
                    isa, threads, &w, &act, None, false, &mut y,
                )?;
                fastest = fastest.min(t.elapsed().as_secs_f64());
            }
            rows.push(cpu_row(
                "gemv_q8",
                shape,
                batch,
                moved as f64 / fastest / 1e9,
            ));

            let mut fastest = f64::INFINITY;
            for _ in 0..args.reps.max(1) + 1 {
                let t = Instant::now();
                inferloop_kernels::cpu::gemm::gemm(isa, threads, &w, &act, &mut y)?;
                fastest = fastest.min(t.elapsed().as_secs_f64());
            }
            rows.push(cpu_row(
                "q8_gemm",
                shape,
                batch,
                moved as f64 / fastest / 1e9,
            ));
        }
    }
    Ok(rows)
}

/// The memory (else SM, else GPU) clock the thermal sources report now, in MHz.
#[cfg(feature = "thermal")]
fn gpu_clock_mhz() -> Option<f64> {
    let mut source = inferloop_thermal::open_auto(std::path::Path::new("/sys"), None).ok()?;
    let snapshot = source.sample().ok()?;
    ["memory", "emc", "sm", "gpu"].iter().find_map(|d| {
        snapshot
            .clocks
            .iter()
            .find(|c| c.domain == *d)
            .map(|c| c.hz as f64 / 1e6)
    })
}

/// Built without `--features thermal`: no clock beside the figures.
#[cfg(not(feature = "thermal"))]
fn gpu_clock_mhz() -> Option<f64> {
    None
}

mod cuda {
    use super::*;
    use inferloop_kernels::cuda::cudarc::driver::CudaSlice;
    use inferloop_kernels::cuda::{q8 as gpu_q8, Gpu};

    pub fn rows(args: &Args, shapes: &[&Shape]) -> Result<Vec<Row>> {
        let gpu = Gpu::open_default(0)?;
        let ceiling = inferloop_kernels::cuda::copy_gbps(&gpu, 1 << 30, 10)?;
        eprintln!(
            "cuda: {} (sm_{}{}, {} SMs, L2 {} MiB), device-to-device copy {ceiling:.1} GB/s",
            gpu.name,
            gpu.capability.0,
            gpu.capability.1,
            gpu.sm_count,
            gpu.l2_bytes >> 20
        );
        let mut rows = Vec::new();
        for shape in shapes {
            let bytes = random_q8(shape.rows, shape.k);
            // The kernels read the device layout, as the daemon uploads it.
            let dev = Q8Matrix::new(&bytes, shape.rows, shape.k)?.to_device_layout();
            // Copies at distinct addresses, more than twice the L2 together.
            let copies = (2 * gpu.l2_bytes / bytes.len() + 1).max(1);
            let ws = (0..copies)
                .map(|_| gpu.stream.clone_htod(&dev))
                .collect::<Result<Vec<_>, _>>()?;
            // Enough launches per timing that launch overhead does not dominate, and every
            // copy read at least once.
            let launches = (256usize << 20)
                .div_ceil(bytes.len())
                .clamp(1, 200)
                .max(copies.min(1000));
            for &batch in &args.batch {
                let xf = activations(shape.k, batch);
                let x = gpu.stream.clone_htod(&xf)?;
                let act = gpu_q8::quantize(&gpu, &x, batch, shape.k)?;
                let mut y = gpu.stream.alloc_zeros::<f32>(shape.rows * batch)?;
                let time = |run: &mut dyn FnMut(&CudaSlice<u8>) -> Result<()>| -> Result<_> {
                    let mut fastest = f64::INFINITY;
                    let mut clock = None;
                    for _ in 0..args.reps.max(1) + 1 {
                        gpu.stream.synchronize()?;
                        let t = Instant::now();
                        for i in 0..launches {
                            run(&ws[i % copies])?;
                        }
                        if clock.is_none() {
                            clock = gpu_clock_mhz();
                        }
                        gpu.stream.synchronize()?;
                        fastest = fastest.min(t.elapsed().as_secs_f64() / launches as f64);
                    }
                    Ok((fastest, clock))
                };
                let (f32_s, f32_clock) = time(&mut |w| {
                    gpu_q8::gemv_into(&gpu, w, shape.rows, shape.k, &x, batch, &mut y)?;
                    Ok(())
                })?;
                let (q8_s, q8_clock) = time(&mut |w| {
                    gpu_q8::gemv_q8_into(
                        &gpu,
                        w,
                        shape.rows,
                        shape.k,
                        &act.q.slice(..),
                        &act.d.slice(..),
                        batch,
                        None,
                        false,
                        &mut y.slice_mut(..),
                    )?;
                    Ok(())
                })?;
                let f32_moved = bytes.len() + shape.k * batch * 4;
                let q8_moved = bytes.len() + act.q.len() + act.d.len() * 4;
                for (kernel, moved, secs, clock) in [
                    ("q8_gemv", f32_moved, f32_s, f32_clock),
                    ("gemv_q8", q8_moved, q8_s, q8_clock),
                ] {
                    let gbps = moved as f64 / secs / 1e9;
                    rows.push(Row {
                        kernel,
                        shape: shape.name.to_string(),
                        batch,
                        device: format!("cuda {}", gpu.name),
                        gbps,
                        ceiling_gbps: ceiling,
                        ratio: gbps / ceiling,
                        read_gbps: None,
                        read_ratio: None,
                        clock_mhz: clock,
                    });
                }
            }
        }
        Ok(rows)
    }
}
