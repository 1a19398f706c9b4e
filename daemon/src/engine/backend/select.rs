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

/// The resolved choice and why it was made (logged at start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selection {
    #[serde(rename = "name")]
    pub backend: BackendKind,
    pub device: Device,
    #[serde(skip)]
    pub why: String,
}

impl Selection {
    /// What the chosen backend can do.
    pub fn capabilities(&self) -> Capabilities {
        match self.backend {
            BackendKind::LlamaCpp => super::llama::CAPABILITIES,
            BackendKind::Native => super::native::backend::CAPABILITIES,
        }
    }

    /// The backend's name for logs, errors and `/v1/status`.
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }

    /// Refuses a plan the backend cannot allocate: a KV pool smaller than `slots × ctx`
    /// without a shared pool would be admitted by cells that do not exist.
    pub fn check_plan(&self, plan: &EnginePlan) -> Result<(), SelectError> {
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

    /// `inferloop_backend_info{backend="…",device="…"} 1`.
    pub fn render_metrics(&self, w: &mut TextWriter) {
        w.gauge_family(
            "inferloop_backend_info",
            "The backend serving and its device (always 1).",
            |f| {
                f.sample(
                    &[
                        ("backend", self.backend.name()),
                        ("device", self.device.name()),
                    ],
                    1u64,
                );
            },
        );
    }
}

/// A combination that cannot run here; a usage error (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error(
        "--backend llama --device cuda: this build's llama.cpp runs on the CPU only; use \
         --backend native (Q8_0 weights) or --device cpu"
    )]
    LlamaCpuOnly,
    #[error("--backend native --device cuda: {0}; the native backend runs Q8_0 weights")]
    NativeNeedsQ8(String),
    #[error("--device cuda: no CUDA GPU found ({0})")]
    NoGpu(String),
    #[error(
        "--kv-cells {cells} is below slots x ctx ({full}): the {backend} backend keeps a KV \
         stream per sequence and has no shared pool yet; drop --kv-cells or use --backend llama"
    )]
    NoSharedPool {
        backend: &'static str,
        cells: u32,
        full: u64,
    },
}

/// Resolves the choice. `gpu` finds a CUDA GPU (its name, or why none); `not_q8_0` names a
/// weight tensor that is not Q8_0 (`None` when all are). Each is asked only when it matters.
pub fn select(
    backend: BackendChoice,
    device: DeviceChoice,
    gpu: impl FnOnce() -> Result<String, String>,
    not_q8_0: impl FnOnce() -> Option<String>,
) -> Result<Selection, SelectError> {
    let found = match device {
        DeviceChoice::Cpu => None,
        DeviceChoice::Auto | DeviceChoice::Cuda => Some(gpu()),
    };
    let cuda = |why: String| Selection {
        backend: BackendKind::Native,
        device: Device::Cuda,
        why,
    };
    if device == DeviceChoice::Cuda {
        return match (&found, backend) {
            (Some(Err(why)), _) => Err(SelectError::NoGpu(why.clone())),
            (_, BackendChoice::Llama) => Err(SelectError::LlamaCpuOnly),
            (Some(Ok(name)), _) => match not_q8_0() {
                None => Ok(cuda(format!("--device cuda: the native backend on {name}"))),
                Some(t) => Err(SelectError::NativeNeedsQ8(t)),
            },
            (None, _) => Err(SelectError::NoGpu("not probed".into())),
        };
    }
    let pick = |backend, why: String| Selection {
        backend,
        device: Device::Cpu,
        why,
    };
    let gpu_note = match &found {
        Some(Ok(name)) => format!("CUDA GPU {name} found"),
        Some(Err(why)) => format!("no CUDA GPU ({why})"),
        None => "--device cpu".to_string(),
    };
    Ok(match backend {
        BackendChoice::Llama => pick(BackendKind::LlamaCpp, "--backend llama".into()),
        BackendChoice::Native => match &found {
            // With --device auto the GPU is used when the weights allow it; otherwise the
            // load refuses the weights by name, as on the CPU.
            Some(Ok(_)) if not_q8_0().is_none() => {
                cuda(format!("--backend native and {gpu_note}: on CUDA"))
            }
            _ => pick(
                BackendKind::Native,
                format!("--backend native on the CPU ({gpu_note})"),
            ),
        },
        BackendChoice::Auto => match &found {
            Some(Ok(_)) => match not_q8_0() {
                None => cuda(format!(
                    "weights are Q8_0 and {gpu_note}: the native backend on CUDA"
                )),
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

/// The first CUDA GPU's name, or why there is none.
pub fn probe_gpu() -> Result<String, String> {
    if !inferloop_kernels::cuda::driver_present() {
        return Err("libcuda cannot be loaded".into());
    }
    // Only the device's presence: the kernels are compiled once, when the model loads.
    inferloop_kernels::cuda::probe(0).map_err(|e| e.to_string())
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
mod tests {
    use super::*;

    fn gpu() -> Result<String, String> {
        Ok("Orin".into())
    }

    fn none() -> Result<String, String> {
        Err("libcuda cannot be loaded".into())
    }

    fn q8() -> Option<String> {
        None
    }

    fn q4() -> Option<String> {
        Some("tensor `blk.0.attn_q.weight` is q4_1".into())
    }

    #[test]
    fn native_runs_on_the_cpu_when_asked_or_without_a_gpu() {
        for device in [DeviceChoice::Cpu, DeviceChoice::Auto] {
            let s = select(BackendChoice::Native, device, none, q8).unwrap();
            assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cpu));
        }
    }

    #[test]
    fn native_runs_on_cuda_when_asked_or_found_with_q8_0_weights() {
        let s = select(BackendChoice::Native, DeviceChoice::Cuda, gpu, q8).unwrap();
        assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cuda));
        assert!(s.why.contains("Orin"), "{}", s.why);
        for backend in [BackendChoice::Auto, BackendChoice::Native] {
            let s = select(backend, DeviceChoice::Auto, gpu, q8).unwrap();
            assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cuda));
        }
        assert!(matches!(
            select(BackendChoice::Native, DeviceChoice::Cuda, none, q8),
            Err(SelectError::NoGpu(_))
        ));
        assert!(matches!(
            select(BackendChoice::Native, DeviceChoice::Cuda, gpu, q4),
            Err(SelectError::NativeNeedsQ8(t)) if t.contains("attn_q")
        ));
        assert_eq!(
            select(BackendChoice::Llama, DeviceChoice::Cuda, gpu, q8),
            Err(SelectError::LlamaCpuOnly)
        );
    }

    #[test]
    fn auto_is_llama_cpp_on_the_cpu_and_says_why() {
        let s = select(BackendChoice::Auto, DeviceChoice::Auto, none, q8).unwrap();
        assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
        assert!(s.why.contains("no CUDA GPU"), "{}", s.why);
        let s = select(BackendChoice::Auto, DeviceChoice::Auto, gpu, q4).unwrap();
        assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
        assert!(s.why.contains("blk.0.attn_q.weight"), "{}", s.why);
        let s = select(
            BackendChoice::Auto,
            DeviceChoice::Cpu,
            || panic!("no probe"),
            q4,
        )
        .unwrap();
        assert_eq!(s.backend, BackendKind::LlamaCpp);
    }

    #[test]
    fn the_backend_is_exported_as_an_info_gauge() {
        let s = Selection {
            backend: BackendKind::Native,
            device: Device::Cpu,
            why: String::new(),
        };
        let text = crate::metrics::text::render(move |w| s.render_metrics(w));
        assert!(
            text.contains("inferloop_backend_info{backend=\"native\",device=\"cpu\"} 1\n"),
            "{text}"
        );
    }
}
