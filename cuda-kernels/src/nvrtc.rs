//! Compiling a kernel source to PTX with NVRTC, loaded at run time (the device's own
//! `libnvrtc.so.12` on a Jetson; a PyPI wheel's in CI, found through `LD_LIBRARY_PATH`).

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("no NVRTC library found: libnvrtc.so.12 is not on the library path (JetPack ships it under /usr/local/cuda/lib64; `make kernels-check` installs one from PyPI)")]
    NoNvrtc,
    #[error("NVRTC could not compile {name}.cu for {arch}: {log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
}

/// Whether libnvrtc can be loaded (cudarc panics on first use when it cannot).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `compute_XY` for a compute capability, e.g. (8, 7) for Orin.
pub fn arch_name(major: i32, minor: i32) -> &'static str {
    // NVRTC wants a &'static str; the set of architectures is small.
    match (major, minor) {
        (7, 0) => "compute_70",
        (7, 2) => "compute_72",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // Older or unknown: the lowest with dp4a and the f16 loads the kernels use.
        _ => "compute_61",
    }
}

/// Compiles `code` (the file `name`.cu) to PTX for `arch` (`compute_87` …). `extra` adds
/// options, e.g. `-DQ8_GEMV_ROWS_PER_BLOCK=4` for tuning.
pub fn compile(
    name: &str,
    code: &str,
    arch: &'static str,
    extra: &[String],
) -> Result<Ptx, CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NoNvrtc);
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: extra.to_vec(),
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    compile_ptx_with_opts(code, opts).map_err(|e| CompileError::Compile {
        name: name.to_string(),
        arch: arch.to_string(),
        log: e.to_string(),
    })
}
