//! The native model read from a GGUF file: [`Metadata`] and [`TensorSource`] for
//! `inferloop-gguf`'s reader, and [`open_model`], which maps a file and builds a [`Model`].

use std::path::Path;

use inferloop_gguf::{GgmlType, Gguf, GgufFile};

use super::forward::Model;
use super::hparams::{HParams, Metadata};
use super::weights::{TensorKind, TensorRef, TensorSource, Weights};
use super::NativeError;

impl<B: AsRef<[u8]>> Metadata for Gguf<B> {
    fn get_u64(&self, key: &str) -> Option<u64> {
        Gguf::get_u64(self, key)
    }

    fn get_f32(&self, key: &str) -> Option<f32> {
        Gguf::get_f32(self, key)
    }

    fn get_str(&self, key: &str) -> Option<&str> {
        Gguf::get_str(self, key)
    }

    fn get_array_len(&self, key: &str) -> Option<u64> {
        Gguf::get_array_len(self, key).map(|n| n as u64)
    }
}

impl<B: AsRef<[u8]>> TensorSource for Gguf<B> {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let view = Gguf::tensor(self, name)?;
        Some(TensorRef {
            kind: tensor_kind(view.info.ggml_type()),
            dims: view.info.dims().to_vec(),
            bytes: view.bytes,
        })
    }
}

/// The forward pass's view of a ggml type; the others keep their name (`Q4_1`, `BF16`).
pub fn tensor_kind(ty: GgmlType) -> TensorKind {
    match ty {
        GgmlType::F32 => TensorKind::F32,
        GgmlType::F16 => TensorKind::F16,
        GgmlType::Q8_0 => TensorKind::Q8_0,
        other => TensorKind::Other(other.name().to_uppercase()),
    }
}

/// Maps `path`, reads its hyperparameters and weights, and builds a [`Model`] with a KV
/// cache of `n_seq` sequences of `n_ctx` positions, its matmuls on `threads` threads.
///
/// The map is leaked: the daemon serves one model for its whole life, and the weights
/// borrow the map zero-copy, so it must outlive every [`Model`] built on it. A process that
/// opens models repeatedly (a test loop) keeps each map until it exits.
pub fn open_model(
    path: &Path,
    n_seq: usize,
    n_ctx: usize,
    threads: usize,
) -> Result<Model<'static>, NativeError> {
    let file = GgufFile::open(path).map_err(|e| NativeError::File(e.to_string()))?;
    let file: &'static GgufFile = Box::leak(Box::new(file));
    let hp = HParams::from_metadata(file)?;
    let weights = Weights::load(&hp, file)?;
    Model::new(hp, weights, n_seq, n_ctx, threads)
}

/// [`open_model`] with the pass on `gpu`: the weights are copied to GPU memory. Before it
/// is used, one pass of a few tokens runs on the GPU and on the CPU twins, and the model is
/// refused unless their logits agree (the kernels give their twins' bits, so a difference
/// means a broken driver, compiler or kernel, which must not serve).
pub fn open_model_cuda(
    path: &Path,
    n_seq: usize,
    n_ctx: usize,
    threads: usize,
    gpu: inferloop_kernels::cuda::Gpu,
) -> Result<Model<'static>, NativeError> {
    let file = GgufFile::open(path).map_err(|e| NativeError::File(e.to_string()))?;
    let file: &'static GgufFile = Box::leak(Box::new(file));
    let hp = HParams::from_metadata(file)?;
    let mut model = Model::new_cuda(hp.clone(), Weights::load(&hp, file)?, n_seq, n_ctx, gpu)?;
    let mut twin = Model::new(hp.clone(), Weights::load(&hp, file)?, 1, 16, threads)?;
    let diff = super::cuda::check_against_twin(&mut model, &mut twin)?;
    tracing::info!(
        max_abs_logit_diff = diff,
        "CUDA pass checked against the CPU twins"
    );
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_types_the_forward_pass_reads_map_to_their_kinds_and_others_keep_their_name() {
        assert_eq!(tensor_kind(GgmlType::F32), TensorKind::F32);
        assert_eq!(tensor_kind(GgmlType::F16), TensorKind::F16);
        assert_eq!(tensor_kind(GgmlType::Q8_0), TensorKind::Q8_0);
        assert_eq!(
            tensor_kind(GgmlType::Q4_1),
            TensorKind::Other("Q4_1".into())
        );
        assert_eq!(
            tensor_kind(GgmlType::BF16),
            TensorKind::Other("BF16".into())
        );
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.gguf");
        let err = open_model(&path, 1, 16, 1).err().expect("no model");
        assert!(matches!(err, NativeError::File(_)), "{err}");
        assert!(err.to_string().contains("absent.gguf"), "{err}");
    }
}
