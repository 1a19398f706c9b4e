//! Finding a CUDA GPU through NVML, loaded at run time; an absent library is a miss, not an error.

use nvml_wrapper::Nvml;
use serde::Serialize;

use crate::ComputeCapability;

/// What NVML says about the first GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuInfo {
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// How many GPUs NVML sees.
    pub count: u32,
    pub compute_capability: Option<ComputeCapability>,
    /// Total device memory in bytes.
    pub memory_bytes: Option<u64>,
}

/// Why no GPU was found; goes into the detection notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoGpu {
    pub reason: String,
}

/// Looks for a CUDA GPU. Injectable so detection tests need no NVML.
pub trait GpuProbe: Send + Sync {
    fn probe(&self) -> Result<GpuInfo, NoGpu>;
}

/// The real probe: loads `libnvidia-ml` and asks for device 0.
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmlProbe;

/// A probe that never finds a GPU, for tests and for `--no-gpu` style callers.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoGpuProbe;

impl GpuProbe for NoGpuProbe {
    fn probe(&self) -> Result<GpuInfo, NoGpu> {
        Err(NoGpu {
            reason: "GPU probing disabled".into(),
        })
    }
}

/// Loads NVML. Driver installs ship the versioned `libnvidia-ml.so.1`; the unversioned name
/// (nvml-wrapper's default) only comes with development packages, so try both.
pub fn load_nvml() -> Result<Nvml, String> {
    let versioned = Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init();
    match versioned {
        Ok(nvml) => Ok(nvml),
        Err(first) => Nvml::init()
            .map_err(|second| format!("libnvidia-ml.so.1: {first}; libnvidia-ml.so: {second}")),
    }
}

impl GpuProbe for NvmlProbe {
    fn probe(&self) -> Result<GpuInfo, NoGpu> {
        let nvml = load_nvml().map_err(|e| {
            tracing::debug!(error = %e, "NVML not loadable; no CUDA dGPU detection");
            NoGpu {
                reason: format!("NVML not available ({e})"),
            }
        })?;
        let count = nvml.device_count().map_err(|e| NoGpu {
            reason: format!("NVML device count failed: {e}"),
        })?;
        if count == 0 {
            return Err(NoGpu {
                reason: "NVML loaded but reports no GPU".into(),
            });
        }
        let device = nvml.device_by_index(0).map_err(|e| NoGpu {
            reason: format!("NVML device 0: {e}"),
        })?;
        let name = device.name().map_err(|e| NoGpu {
            reason: format!("NVML device 0 name: {e}"),
        })?;
        let compute_capability = device.cuda_compute_capability().ok().and_then(|cc| {
            Some(ComputeCapability {
                major: u32::try_from(cc.major).ok()?,
                minor: u32::try_from(cc.minor).ok()?,
            })
        });
        let memory_bytes = device.memory_info().ok().map(|m| m.total);
        Ok(GpuInfo {
            name,
            count,
            compute_capability,
            memory_bytes,
        })
    }
}
