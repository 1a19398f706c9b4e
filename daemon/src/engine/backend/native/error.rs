//! [`NativeError`]: what the native model could not load or compute.

/// What the native model could not load or compute. Each message names the key, tensor or
/// batch entry at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NativeError {
    /// The file could not be read or is not a valid GGUF; the reader's message names the
    /// path (and the offset).
    #[error("{0}")]
    File(String),
    #[error("unsupported architecture `{0}`: the native backend runs llama and qwen2")]
    UnsupportedArch(String),
    #[error("metadata key `{key}` is missing (or not {expected})")]
    MissingKey { key: String, expected: &'static str },
    #[error("metadata: {0}")]
    BadMetadata(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` is {kind}; the native backend needs {expected}")]
    TensorType {
        name: String,
        kind: String,
        expected: &'static str,
    },
    #[error("tensor `{name}` has dims {dims:?}, {expected:?} expected")]
    TensorShape {
        name: String,
        dims: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor `{name}` holds {got} bytes, {need} expected for its type and dims")]
    TensorSize {
        name: String,
        got: usize,
        need: usize,
    },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("KV cache: {0}")]
    Kv(String),
    #[error("batch entry {index}: {why}")]
    Batch { index: usize, why: String },
    #[error("{what}: {why}")]
    Kernel { what: String, why: String },
}

impl NativeError {
    /// Stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::File(_) => "model_file",
            Self::UnsupportedArch(_) => "unsupported_arch",
            Self::MissingKey { .. } => "missing_key",
            Self::BadMetadata(_) => "bad_metadata",
            Self::MissingTensor(_) => "missing_tensor",
            Self::TensorType { .. } => "tensor_type",
            Self::TensorShape { .. } => "tensor_shape",
            Self::TensorSize { .. } => "tensor_size",
            Self::Unsupported(_) => "unsupported_model",
            Self::Kv(_) => "kv_cache",
            Self::Batch { .. } => "bad_batch",
            Self::Kernel { .. } => "kernel_failed",
        }
    }
}
