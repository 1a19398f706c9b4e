//! One way from a [`Selection`] to the backend that serves it: llama.cpp around the loaded
//! model, or the native forward pass on the device the selection names. Serving and
//! `inferloopd golden` open the native model through [`open_native`] alike.

use std::path::Path;
use std::time::Instant;

use super::llama::LlamaCpp;
use super::native::{self, NativeBackend, NativeError};
use super::seam::{Backend, Device};
use super::select::{BackendKind, Selection};
use crate::engine::chat::model::LoadedModel;
use crate::engine::plan::EnginePlan;
use crate::engine::types::EngineError;

/// The backend `selection` names, sized by `plan`, over `model` (which holds the weights for
/// llama.cpp and the vocabulary for the native backend, see `Capabilities::own_weights`).
/// Called on the scheduler thread: a llama.cpp context must live where it is used.
pub fn open<'m>(
    selection: &Selection,
    plan: &EnginePlan,
    model: &'m LoadedModel,
) -> Result<Box<dyn Backend + 'm>, EngineError> {
    match selection.backend {
        BackendKind::LlamaCpp => Ok(Box::new(LlamaCpp::new(model, plan)?)),
        BackendKind::Native => {
            let t0 = Instant::now();
            let path = &model.info().path;
            let threads = usize::try_from(plan.threads.max(1)).unwrap_or(1);
            let native = open_native(
                path,
                selection.device,
                plan.sequences(),
                plan.ctx as usize,
                threads,
            )
            .map_err(|e| EngineError::ModelLoad {
                path: path.display().to_string(),
                reason: format!("native backend: {e}"),
            })?;
            tracing::info!(
                path = %path.display(),
                ms = t0.elapsed().as_millis() as u64,
                kv_bytes = native.kv().bytes() as u64,
                device = selection.device.name(),
                gpu = native.cuda().map(|(name, _)| name.to_string()),
                gpu_weights_and_scratch_bytes = native.cuda().map(|(_, b)| b as u64),
                "model loaded (native backend)"
            );
            Ok(Box::new(NativeBackend::new(native)))
        }
    }
}

/// The draft model's llama.cpp context (`--spec draft`), sized by
/// [`EnginePlan::draft_plan`]. Called on the scheduler thread, like [`open`].
pub fn open_draft<'m>(
    draft: &'m LoadedModel,
    plan: &EnginePlan,
) -> Result<Box<dyn Backend + 'm>, EngineError> {
    Ok(Box::new(LlamaCpp::new(draft, &plan.draft_plan())?))
}

/// The native model at `path` on `device` (the kernels' CPU twins, or the first CUDA GPU),
/// with a KV cache of `n_seq` sequences of `n_ctx` positions.
pub fn open_native(
    path: &Path,
    device: Device,
    n_seq: usize,
    n_ctx: usize,
    threads: usize,
) -> Result<native::Model<'static>, NativeError> {
    match device {
        Device::Cpu => native::open_model(path, n_seq, n_ctx, threads),
        Device::Cuda => {
            let gpu =
                inferloop_kernels::cuda::Gpu::open_default(0).map_err(|e| NativeError::Kernel {
                    what: "cuda".into(),
                    why: e.to_string(),
                })?;
            native::open_model_cuda(path, n_seq, n_ctx, threads, gpu)
        }
    }
}
