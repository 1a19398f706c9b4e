//! The native model read from a GGUF file: [`Metadata`] and [`TensorSource`] for
//! `inferloop-gguf`'s reader, and [`open_model`], which maps a file and builds a [`Model`].

use std::path::Path;

use inferloop_gguf::{GgmlType, Gguf, GgufFile};

use super::batch::BatchToken;
use super::error::NativeError;
use super::forward::Model;
use super::hparams::{HParams, Metadata};
use super::sampling::argmax;
use super::weights::{TensorKind, TensorRef, TensorSource, Weights};

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
    let diff = check_against_twin(&mut model, &mut twin)?;
    tracing::info!(
        max_abs_logit_diff = diff,
        "CUDA pass checked against the CPU twins"
    );
    Ok(model)
}

/// Feeds the same tokens to `model` (on the GPU) and `twin` (on the CPU) and compares the
/// logits: every row's top token must agree and no logit may differ by more than
/// [`CHECK_TOLERANCE`]. Returns the largest difference; `model`'s sequence 0 is left empty.
pub fn check_against_twin(model: &mut Model<'_>, twin: &mut Model<'_>) -> Result<f32, NativeError> {
    let n_vocab = model.hparams().n_vocab;
    let n = model.kv().n_ctx().min(twin.kv().n_ctx()).min(6) as u32;
    let batch: Vec<BatchToken> = (0..n)
        .map(|pos| BatchToken {
            seq: 0,
            token: ((pos as usize * 7919 + 1) % n_vocab) as i32,
            pos,
        })
        .collect();
    let want = vec![true; batch.len()];
    let gpu = model.forward(&batch, &want)?.to_vec();
    model.kv_mut().clear(0)?;
    let cpu = twin.forward(&batch, &want)?;
    let mut worst = 0f32;
    for (row, (g, c)) in gpu.chunks(n_vocab).zip(cpu.chunks(n_vocab)).enumerate() {
        let diff = g
            .iter()
            .zip(c)
            .map(|(a, b)| (a - b).abs())
            .fold(
                0f32,
                |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
            );
        worst = worst.max(diff);
        if argmax(g) != argmax(c) || diff > CHECK_TOLERANCE {
            return Err(NativeError::Kernel {
                what: "cuda self-check".into(),
                why: format!(
                    "position {row}: the GPU's logits differ from the CPU twins' (top token {} \
                     vs {}, largest difference {diff}); refusing to serve on this GPU",
                    argmax(g),
                    argmax(c)
                ),
            });
        }
    }
    Ok(worst)
}

/// The largest logit difference the self-check accepts. The kernels give their twins'
/// bits, so any difference is a fault; this only leaves room for a driver that contracts
/// differently, not for a wrong kernel.
pub const CHECK_TOLERANCE: f32 = 1e-2;

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
