//! The CUDA sources, one NVRTC program per file. Each compiles on its own with no options:
//! no headers (NVRTC from a PyPI wheel has none), every tuning macro has a default.

/// One `.cu` file of `cuda-kernels/kernels/`.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File stem, also the module name the runtime loads it as.
    pub name: &'static str,
    pub code: &'static str,
}

macro_rules! sources {
    ($($name:literal),* $(,)?) => {
        &[$(Source { name: $name, code: include_str!(concat!("../kernels/", $name, ".cu")) }),*]
    };
}

/// Every kernel source, in a stable order (the compile table follows it).
pub const SOURCES: &[Source] = sources![
    "q8_gemv",
    "q8_gemm",
    "quantize",
    "rmsnorm",
    "rope",
    "elementwise",
    "embed",
    "softmax",
    "attention",
    "fused",
];

/// The source named `name`.
pub fn source(name: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| s.name == name)
}
