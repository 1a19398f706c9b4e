//! The CUDA sources, one NVRTC program per file. Each compiles on its own with no options:
//! no headers (NVRTC from a PyPI wheel has none), every tuning macro has a default.

/// One `.cu` file of `cuda-kernels/kernels/`.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File stem, also the module name the runtime loads it as.
    pub name: &'static str,
    /// The program compiled: the files it builds on (their device functions), then its own.
    pub code: &'static str,
    /// Its own file, whose kernels are the module's entries.
    pub own: &'static str,
}

macro_rules! cu {
    ($name:literal) => {
        include_str!(concat!("../kernels/", $name, ".cu"))
    };
}

macro_rules! sources {
    ($($name:literal $(after [$($dep:literal),*])?),* $(,)?) => {
        &[$(Source {
            name: $name,
            code: concat!($($(cu!($dep), "\n",)*)? cu!($name)),
            own: cu!($name),
        }),*]
    };
}

impl Source {
    /// The names of its `extern "C" __global__` kernels, in file order.
    pub fn entries(&self) -> Vec<String> {
        let mut names = Vec::new();
        for (at, _) in self.own.match_indices("extern \"C\" __global__") {
            let mut rest = self.own[at..]
                .trim_start_matches("extern \"C\" __global__")
                .trim_start();
            rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
            if let Some(after) = rest.strip_prefix("__launch_bounds__") {
                // Skip the parenthesised bounds (no nested parentheses in them).
                rest = after.split_once(')').map_or(after, |(_, r)| r).trim_start();
                rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
        names
    }
}

/// Every kernel source, in a stable order (the compile table follows it).
pub const SOURCES: &[Source] = sources![
    "q8_gemv" after ["q8_layout"],
    "q8_gemm" after ["q8_layout"],
    "quantize",
    "rmsnorm",
    "rope",
    "elementwise",
    "embed" after ["q8_layout"],
    "softmax",
    "attention",
    "fused",
    "layer" after ["q8_layout", "q8_gemv", "fused"],
];

/// The source named `name`.
pub fn source(name: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_the_sources() {
        assert_eq!(
            source("q8_gemv").map(Source::entries).unwrap(),
            ["q8_gemv_f32", "q8_gemv_q8"]
        );
        let attn = source("attention").map(Source::entries).unwrap();
        assert_eq!(attn, ["attn_partial_f16", "attn_combine_f32"]);
        assert!(SOURCES.iter().all(|s| !s.entries().is_empty()));
        let layer = source("layer").unwrap();
        assert_eq!(
            layer.entries(),
            ["layer_qkv", "layer_residual_norm", "layer_gate_up"]
        );
        assert!(layer.code.starts_with(source("q8_gemv").unwrap().code));
    }
}
