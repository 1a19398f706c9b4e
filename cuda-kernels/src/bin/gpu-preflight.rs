//! The device check's first step: opens the GPU and loads every kernel module the way the
//! daemon does (`Gpu::open`: cubin, then the shipped PTX, then the device's NVRTC), resolves
//! every kernel entry, and prints the driver, CUDA and NVRTC versions, the device's limits
//! and where each module came from; with `--features thermal`, one reading of NVML and of
//! the board's thermal sources. Any failure exits 1 naming it (no libcuda, no device, a
//! module that does not load). `--json` writes the same as a report, failed or not.
//!
//! `gpu-preflight summary` assembles `scripts/device-check.sh`'s `summary.json` from the
//! preflight report and the steps the script recorded, so a machine without Python or jq
//! can write it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;
use serde_json::{json, Value};

use inferloop_kernels::cuda::cudarc::driver::sys::CUdevice_attribute as A;
use inferloop_kernels::cuda::{driver_present, driver_version, Gpu, KernelsFrom};
use inferloop_kernels::kernels::SOURCES;
use inferloop_kernels::nvrtc;

#[derive(Parser)]
#[command(
    about = "Open the GPU and load every kernel module as the daemon does; exit 1 naming any failure"
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    ordinal: usize,
    /// Write the report here as JSON (also when the check fails).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write `<dir>/summary.json` from `<dir>/preflight.json` and `<dir>/steps.tsv`
    /// (`name<TAB>ok|failed<TAB>detail` per line); exits 1 unless everything passed.
    Summary {
        /// The device check's output folder.
        dir: PathBuf,
        /// GPU tests the test lists name (under a `gpu::` module).
        #[arg(long)]
        gpu_tests_expected: u64,
        /// GPU tests that said they ran on the GPU.
        #[arg(long)]
        gpu_tests_run: u64,
    },
}

#[derive(Serialize, Default)]
struct Report {
    ok: bool,
    error: Option<String>,
    /// cuDriverGetVersion, as `12.2` and as the raw 12020.
    driver: Option<String>,
    driver_raw: Option<i32>,
    /// The driver API version this build targets (cudarc's feature: the oldest supported).
    cuda_api: &'static str,
    nvrtc: Value,
    device: Value,
    kernels: Option<KernelsFrom>,
    entries: usize,
    thermal: Value,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_init();
    if let Some(Cmd::Summary {
        dir,
        gpu_tests_expected,
        gpu_tests_run,
    }) = &args.cmd
    {
        return summary(dir, *gpu_tests_expected, *gpu_tests_run);
    }
    let mut report = Report {
        cuda_api: "12.2",
        nvrtc: match nvrtc::info() {
            Ok(i) => json!({ "version": i.version, "library": i.library }),
            Err(e) => json!({ "absent": e.to_string() }),
        },
        thermal: thermal(),
        ..Default::default()
    };
    let result = check(args.ordinal, &mut report);
    report.ok = result.is_ok();
    report.error = result.as_ref().err().map(|e| e.to_string());
    print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Err(e) = result {
        eprintln!("gpu-preflight: FAILED: {e}");
        std::process::exit(1);
    }
    println!("gpu-preflight: ok");
    Ok(())
}

/// The loader logs where the kernels came from (`info`) and each module (`debug`).
fn tracing_init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn check(ordinal: usize, r: &mut Report) -> Result<()> {
    if !driver_present() {
        anyhow::bail!(inferloop_kernels::cuda::GpuError::NoDriver);
    }
    let v = driver_version()?;
    r.driver = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
    r.driver_raw = Some(v);
    let gpu = Gpu::open(ordinal)?;
    let attr = |a| gpu.ctx.attribute(a).ok();
    let (free, total) = gpu.ctx.mem_get_info()?;
    r.device = json!({
        "name": gpu.name,
        "capability": format!("{}.{}", gpu.capability.0, gpu.capability.1),
        "total_bytes": total,
        "free_bytes": free,
        "sm_count": attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "l2_bytes": attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        "max_threads_per_sm": attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        "shared_per_block_optin": attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        "memory_pools": gpu.ctx.has_async_alloc(),
        "integrated": attr(A::CU_DEVICE_ATTRIBUTE_INTEGRATED),
    });
    r.kernels = Some(gpu.kernels.clone());
    for s in SOURCES {
        for entry in s.entries() {
            gpu.function(s.name, &entry)?;
            r.entries += 1;
        }
    }
    Ok(())
}

fn print(r: &Report) {
    let na = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    println!(
        "driver: CUDA {} (built for the CUDA {} driver API)",
        na(&r.driver),
        r.cuda_api
    );
    println!("nvrtc: {}", r.nvrtc);
    if !r.device.is_null() {
        println!("device: {}", r.device);
    }
    if let Some(k) = &r.kernels {
        println!("kernels: {}", k.summary());
        for m in &k.modules {
            println!("  {:<12} {:<13} {}", m.module, m.origin.as_str(), m.detail);
        }
        println!("entries resolved: {}", r.entries);
    }
    println!("thermal: {}", r.thermal);
}

/// One reading of NVML and of the board's automatic source (Jetson sysfs there), or why not.
#[cfg(feature = "thermal")]
fn thermal() -> Value {
    use inferloop_thermal::{open_auto, NvmlSource, Source};
    let nvml = match NvmlSource::open(0) {
        Ok(mut s) => match s.sample() {
            Ok(snap) => json!({ "snapshot": snap }),
            Err(e) => json!({ "error": e.to_string() }),
        },
        Err(e) => json!({ "absent": e.to_string() }),
    };
    let board = match open_auto(Path::new("/sys"), None).and_then(|mut s| s.sample()) {
        Ok(snap) => json!({ "snapshot": snap }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    json!({ "nvml": nvml, "board": board })
}

#[cfg(not(feature = "thermal"))]
fn thermal() -> Value {
    json!({ "absent": "built without --features thermal" })
}

fn summary(dir: &Path, expected: u64, ran: u64) -> Result<()> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name));
    let preflight: Value = read("preflight.json")
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({ "ok": false, "error": "no preflight.json" }));
    let steps: Vec<Value> = read("steps.tsv")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            let (name, status, detail) = (f.next(), f.next(), f.next());
            json!({ "name": name, "ok": status == Some("ok"), "detail": detail.unwrap_or("") })
        })
        .collect();
    let mut failed: Vec<String> = steps
        .iter()
        .filter(|s| s["ok"] != json!(true))
        .map(|s| s["name"].as_str().unwrap_or("?").to_string())
        .collect();
    if preflight["ok"] != json!(true) && !failed.iter().any(|f| f == "preflight") {
        failed.insert(0, "preflight".into());
    }
    if ran != expected {
        failed.push(format!("gpu tests: {ran} ran of {expected} listed"));
    }
    let ok = failed.is_empty() && expected > 0;
    let s = json!({
        "ok": ok,
        "failed": failed,
        "gpu_tests_run": ran,
        "gpu_tests_expected": expected,
        "driver": preflight["driver"],
        "cuda_api": preflight["cuda_api"],
        "nvrtc": preflight["nvrtc"],
        "device": preflight["device"],
        "kernels": preflight["kernels"],
        "thermal": preflight["thermal"],
        "error": preflight["error"],
        "steps": steps,
    });
    let path = dir.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&s)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "summary: ok={ok} gpu_tests_run={ran}/{expected} -> {}",
        path.display()
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
