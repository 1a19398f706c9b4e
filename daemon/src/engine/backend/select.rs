//! Which backend serves, on which device: `--backend` and `--device` resolved once at boot
//! against the machine (a CUDA GPU or not), the weights (Q8_0 or not) and the plan (a shared
//! KV pool or not). The ledger, the engine start, `/v1/status` and `/metrics` all read the
//! one [`Selection`], and ask it for capabilities, never for its kind.

use std::path::Path;

use serde::Serialize;

use super::footprint::{self, Footprint};
pub use super::seam::{Capabilities, Device};
use crate::config::{BackendChoice, DeviceChoice};
use crate::engine::plan::EnginePlan;
use crate::metrics::text::TextWriter;
use inferloop_gguf::ModelShape;

/// The engine that computes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BackendKind {
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    #[serde(rename = "native")]
    Native,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::LlamaCpp => "llama.cpp",
            Self::Native => "native",
        }
    }
}

/// The resolved choice and why it was made: logged at start, shown in `/v1/status` as
/// `{"name", "device", "gpu", "reason", "gpu_error"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selection {
    #[serde(rename = "name")]
    pub backend: BackendKind,
    pub device: Device,
    /// The CUDA GPU that serves (its name), when the device is CUDA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(rename = "reason")]
    pub why: String,
    /// Why the GPU could not be opened, when `cpu_fallback` let the CPU serve in its place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_error: Option<String>,
}

impl Selection {
    /// What the chosen backend can do.
    pub fn capabilities(&self) -> Capabilities {
        match self.backend {
            BackendKind::LlamaCpp => super::llama::CAPABILITIES,
            // Embedding passes run on the CPU twins only (`Pass::run_hidden`).
            BackendKind::Native => Capabilities {
                embeddings: self.device == Device::Cpu,
                ..super::native::backend::CAPABILITIES
            },
        }
    }

    /// The backend's name for logs, errors and `/v1/status`.
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }

    /// Refuses a plan the backend cannot allocate: a KV pool smaller than `slots × ctx`
    /// without a shared pool would be admitted by cells that do not exist; a KV type the
    /// backend does not keep would be served, and counted by the ledger, as something else.
    pub fn check_plan(&self, plan: &EnginePlan) -> Result<(), SelectError> {
        if !plan.kv_type.is_f16() && !self.capabilities().quantized_kv {
            return Err(SelectError::KvTypeF16Only {
                backend: self.name(),
                kv_type: plan.kv_type,
            });
        }
        if plan.shared_kv && !self.capabilities().shared_kv_pool {
            return Err(SelectError::NoSharedPool {
                backend: self.name(),
                cells: plan.kv_cells,
                full: plan.full_cells(),
            });
        }
        Ok(())
    }

    /// The memory the backend will need for `plan` on this model, term by term (the ledger
    /// adds its margin and decides).
    pub fn footprint(&self, shape: &ModelShape, plan: &EnginePlan) -> Footprint {
        match self.backend {
            BackendKind::LlamaCpp => footprint::llama_cpp(shape, plan),
            BackendKind::Native => footprint::native(shape, plan, self.device),
        }
    }

    /// What `/v1/status` shows of the backend's build, one entry per backend (null for those
    /// not serving): llama.cpp's system info, the native device and CPU instruction set.
    pub fn status_details(&self) -> [(&'static str, serde_json::Value); 2] {
        let (llama, native) = match self.backend {
            BackendKind::LlamaCpp => (
                serde_json::json!({ "system_info": crate::engine::chat::model::llama_system_info() }),
                serde_json::Value::Null,
            ),
            BackendKind::Native => (
                serde_json::Value::Null,
                serde_json::json!({
                    "device": self.device,
                    "cpu_isa": format!("{:?}", inferloop_kernels::cpu::simd::Isa::detect())
                        .to_lowercase(),
                }),
            ),
        };
        [("llama", llama), ("native", native)]
    }

    /// `inferloop_backend_info{backend="…",device="…"} 1`, plus `gpu="…"` on CUDA; and
    /// `inferloop_cpu_fallback` (1 when the GPU could not be opened and the CPU serves).
    pub fn render_metrics(&self, w: &mut TextWriter) {
        w.gauge_family(
            "inferloop_backend_info",
            "The backend serving, its device and the CUDA GPU's name (always 1).",
            |f| {
                let mut labels = vec![
                    ("backend", self.backend.name()),
                    ("device", self.device.name()),
                ];
                if let Some(gpu) = &self.gpu {
                    labels.push(("gpu", gpu.as_str()));
                }
                f.sample(&labels, 1u64);
            },
        );
        w.gauge(
            "inferloop_cpu_fallback",
            "1 when the GPU could not be opened and cpu_fallback let the CPU serve, else 0.",
            u64::from(self.gpu_error.is_some()),
        );
    }
}

/// A combination that cannot run here: a usage error (exit 2), except a GPU that cannot be
/// opened (exit 4, see [`SelectError::exit_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error(
        "--backend llama --device cuda: this build's llama.cpp runs on the CPU only; use \
         --backend native (Q8_0 weights) or --device cpu"
    )]
    LlamaCpuOnly,
    #[error("--backend native --device cuda: {0}; the native backend runs Q8_0 weights")]
    NativeNeedsQ8(String),
    /// The GPU is wanted (`--device cuda`, or `auto` for a backend that would use it) and
    /// cannot be opened, and `cpu_fallback` is false.
    #[error(
        "--device {device}: the CUDA GPU cannot be opened: {why}; refusing to start \
         (cpu_fallback = false; cpu_fallback = true, --cpu-fallback or \
         INFERLOOP_CPU_FALLBACK=true serves on the CPU instead)"
    )]
    NoGpu { device: &'static str, why: String },
    #[error(
        "--kv-cells {cells} is below slots x ctx ({full}): the {backend} backend keeps a KV \
         stream per sequence and has no shared pool yet; drop --kv-cells or use --backend llama"
    )]
    NoSharedPool {
        backend: &'static str,
        cells: u32,
        full: u64,
    },
    #[error(
        "--kv-type {kv_type}: the {backend} backend keeps its KV cache in f16 only; drop \
         --kv-type (or set it to f16), or use --backend llama"
    )]
    KvTypeF16Only {
        backend: &'static str,
        kv_type: crate::config::KvTypes,
    },
}

impl SelectError {
    /// A GPU that cannot be opened is the model failing to load where it was asked to (4:
    /// the unit retries it, as a driver may come up late); the rest are usage errors (2).
    pub fn exit_code(&self) -> crate::exit::ExitCode {
        match self {
            Self::NoGpu { .. } => crate::exit::ExitCode::ModelLoad,
            _ => crate::exit::ExitCode::Usage,
        }
    }
}

fn device_name(device: DeviceChoice) -> &'static str {
    match device {
        DeviceChoice::Auto => "auto",
        DeviceChoice::Cpu => "cpu",
        DeviceChoice::Cuda => "cuda",
    }
}

/// Resolves the choice. `gpu` opens the first CUDA GPU (its name, or why it cannot);
/// `not_q8_0` names a weight tensor that is not Q8_0 (`None` when all are). Each is asked
/// only when it matters.
///
/// A wanted GPU that cannot be opened: `cpu_fallback` `Some(false)` refuses the start
/// ([`SelectError::NoGpu`]); `Some(true)` resolves as on a machine without a GPU and flags
/// the fallback (`gpu_error`); `None` refuses with `--device cuda` and, with `auto`, uses the
/// CPU unflagged, as on any machine that has no GPU.
pub fn select(
    backend: BackendChoice,
    device: DeviceChoice,
    cpu_fallback: Option<bool>,
    gpu: impl FnOnce() -> Result<String, String>,
    not_q8_0: impl FnOnce() -> Option<String>,
) -> Result<Selection, SelectError> {
    // A usage error whatever the machine has: no need to open a GPU to say so.
    if (backend, device) == (BackendChoice::Llama, DeviceChoice::Cuda) {
        return Err(SelectError::LlamaCpuOnly);
    }
    let found = match device {
        DeviceChoice::Cpu => None,
        DeviceChoice::Auto | DeviceChoice::Cuda => Some(gpu()),
    };
    // This build's llama.cpp is CPU-only: `auto` with it never wants the GPU.
    let wants_gpu = match device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Cuda => true,
        DeviceChoice::Auto => backend != BackendChoice::Llama,
    };
    let gpu_error = match &found {
        Some(Err(why)) if wants_gpu => Some(why.clone()),
        _ => None,
    };
    let fallback = cpu_fallback.unwrap_or(device == DeviceChoice::Auto);
    if let (Some(why), false) = (&gpu_error, fallback) {
        return Err(SelectError::NoGpu {
            device: device_name(device),
            why: why.clone(),
        });
    }
    // Auto on a machine without a GPU is no fallback, unless the settings asked for one.
    let flagged = gpu_error.filter(|_| cpu_fallback == Some(true));
    // The reason says why the GPU failed once, in front (an empty error: "no CUDA GPU").
    let found = match (&flagged, found) {
        (Some(_), _) => Some(Err(String::new())),
        (None, found) => found,
    };
    let mut selection = resolve(backend, device, found, not_q8_0)?;
    if let Some(why) = flagged {
        selection.why = format!(
            "--device {}: the CUDA GPU cannot be opened ({why}); cpu_fallback = true: {}",
            device_name(device),
            selection.why
        );
        selection.gpu_error = Some(why);
    }
    Ok(selection)
}

/// [`select`] once a wanted GPU is known to be there, or allowed to be missing.
fn resolve(
    backend: BackendChoice,
    device: DeviceChoice,
    found: Option<Result<String, String>>,
    not_q8_0: impl FnOnce() -> Option<String>,
) -> Result<Selection, SelectError> {
    let cuda = |name: &str, why: String| Selection {
        backend: BackendKind::Native,
        device: Device::Cuda,
        gpu: Some(name.to_string()),
        why,
        gpu_error: None,
    };
    // `--device cuda` with a GPU: the native backend or nothing (llama.cpp was refused in
    // `select`). Without one (the fallback allowed it), resolved below as on a CPU box.
    if let (DeviceChoice::Cuda, Some(Ok(name))) = (device, &found) {
        return match not_q8_0() {
            None => Ok(cuda(
                name,
                format!("--device cuda: the native backend on {name}"),
            )),
            Some(t) => Err(SelectError::NativeNeedsQ8(t)),
        };
    }
    let pick = |backend, why: String| Selection {
        backend,
        device: Device::Cpu,
        gpu: None,
        why,
        gpu_error: None,
    };
    let gpu_note = match &found {
        Some(Ok(name)) => format!("CUDA GPU {name} found"),
        Some(Err(why)) if why.is_empty() => "no CUDA GPU".to_string(),
        Some(Err(why)) => format!("no CUDA GPU ({why})"),
        None => "--device cpu".to_string(),
    };
    Ok(match backend {
        BackendChoice::Llama => pick(BackendKind::LlamaCpp, "--backend llama".into()),
        BackendChoice::Native => match &found {
            // With --device auto the GPU is used when the weights allow it; otherwise the
            // load refuses the weights by name, as on the CPU.
            Some(Ok(name)) if not_q8_0().is_none() => {
                cuda(name, format!("--backend native and {gpu_note}: on CUDA"))
            }
            _ => pick(
                BackendKind::Native,
                format!("--backend native on the CPU ({gpu_note})"),
            ),
        },
        BackendChoice::Auto => match &found {
            Some(Ok(name)) => match not_q8_0() {
                None => cuda(
                    name,
                    format!("weights are Q8_0 and {gpu_note}: the native backend on CUDA"),
                ),
                Some(t) => pick(
                    BackendKind::LlamaCpp,
                    format!("{gpu_note}, but {t}: the native backend needs Q8_0 weights"),
                ),
            },
            _ => pick(
                BackendKind::LlamaCpp,
                format!("{gpu_note}: auto picks the native backend only on a CUDA GPU"),
            ),
        },
    })
}

/// The first CUDA GPU's name (a context is created on it, so it can be opened), or why not.
pub fn probe_gpu() -> Result<String, String> {
    // Only the device: the kernels are loaded once, when the model loads.
    inferloop_kernels::cuda::probe(0).map_err(|e| match e {
        // Where the loader looked is what a box's operator needs to fix this one.
        inferloop_kernels::cuda::GpuError::NoDriver => format!(
            "{e}; LD_LIBRARY_PATH is {}",
            std::env::var("LD_LIBRARY_PATH")
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|_| "unset".into())
        ),
        e => e.to_string(),
    })
}

/// The first weight matrix of the GGUF at `path` that is not Q8_0 (`name is TYPE`), or the
/// reason the file cannot be read; `None` when every matrix is Q8_0.
pub fn first_non_q8_0(path: &Path) -> Option<String> {
    use inferloop_gguf::{GgmlType, GgufFile};
    match GgufFile::open(path) {
        Err(e) => Some(e.to_string()),
        Ok(file) => file
            .tensors()
            .iter()
            .find(|t| t.dims().len() >= 2 && t.ggml_type() != GgmlType::Q8_0)
            .map(|t| {
                format!(
                    "tensor `{}` is {}",
                    t.name(),
                    t.ggml_type().name().to_uppercase()
                )
            }),
    }
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
