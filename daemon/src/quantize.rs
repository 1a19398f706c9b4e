//! `inferloopd quantize`: rewrites a GGUF model at another weight type with llama.cpp's own
//! quantizer, so the daemon and the tests can make the Q8_0 model the native engine reads.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::exit::ExitCode;

/// The weight types `quantize` writes (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`): the bulk of the
/// 2-D weights get this type; 1-D tensors (norms) stay F32, as llama.cpp decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantType {
    #[value(name = "q8_0")]
    Q8_0,
    /// Dequantized to f32: the exact reference `inferloopd golden --reference` compares with.
    #[value(name = "f32")]
    F32,
    #[value(name = "f16")]
    F16,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
}

impl QuantType {
    fn ftype(self) -> sys::llama_ftype {
        match self {
            Self::Q8_0 => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
            Self::F32 => sys::LLAMA_FTYPE_ALL_F32,
            Self::F16 => sys::LLAMA_FTYPE_MOSTLY_F16,
            Self::Q4_0 => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
            Self::Q4_1 => sys::LLAMA_FTYPE_MOSTLY_Q4_1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
        }
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One `quantize` run.
#[derive(Debug, Clone)]
pub struct Request {
    pub input: PathBuf,
    pub output: PathBuf,
    pub to: QuantType,
    /// llama.cpp's worker threads; `None`: one per available CPU.
    pub threads: Option<u32>,
}

/// What a successful run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub input: GgufTypes,
    pub output: GgufTypes,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub seconds: f64,
    pub threads: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("input model {}: no such file", .0.display())]
    InputMissing(PathBuf),
    #[error("output {}: directory {} does not exist", .path.display(), .dir.display())]
    OutputDirMissing { path: PathBuf, dir: PathBuf },
    #[error("output {} is a directory; name the file to write", .0.display())]
    OutputIsDir(PathBuf),
    #[error("output {} is the input file; write the quantized model to another path", .0.display())]
    OutputIsInput(PathBuf),
    #[error("cannot read the GGUF header of {}: {reason}", .path.display())]
    Header { path: PathBuf, reason: String },
    #[error("cannot start llama.cpp: {0}")]
    Backend(String),
    #[error(
        "llama.cpp could not quantize {} to {} ({to}), return code {code}; its reason is logged \
         above",
        .input.display(), .output.display()
    )]
    Llama {
        input: PathBuf,
        output: PathBuf,
        to: QuantType,
        code: u32,
    },
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl QuantizeError {
    /// A stable name for the failure.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InputMissing(_) => "input_missing",
            Self::OutputDirMissing { .. } => "output_dir_missing",
            Self::OutputIsDir(_) => "output_is_dir",
            Self::OutputIsInput(_) => "output_is_input",
            Self::Header { .. } => "not_gguf",
            Self::Backend(_) => "backend",
            Self::Llama { .. } => "llama",
            Self::Io { .. } => "io",
        }
    }

    /// Wrong paths are usage errors (2), found before any work; a model llama.cpp cannot
    /// read or quantize, and a failed write, are load failures (4).
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::InputMissing(_)
            | Self::OutputDirMissing { .. }
            | Self::OutputIsDir(_)
            | Self::OutputIsInput(_) => ExitCode::Usage,
            Self::Header { .. } | Self::Backend(_) | Self::Llama { .. } | Self::Io { .. } => {
                ExitCode::ModelLoad
            }
        }
    }
}

/// Quantizes `req.input` into `req.output`. llama.cpp writes a temporary file next to the
/// output, renamed over it only on success: a failed run leaves no partial output.
pub fn run(req: &Request) -> Result<Report, QuantizeError> {
    check_paths(&req.input, &req.output)?;
    let input = GgufTypes::read(&req.input)?;
    let input_bytes = file_size(&req.input)?;
    let threads = req.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
    });
    tracing::info!(
        input = %req.input.display(),
        output = %req.output.display(),
        from = %input.file_type,
        to = %req.to,
        threads,
        "quantizing {} tensors ({})",
        input.tensors.len(),
        input.histogram()
    );

    let partial = Partial::next_to(&req.output);
    let start = Instant::now();
    let code = quantize_file(&req.input, partial.path(), req.to, threads)?;
    if code != 0 {
        return Err(QuantizeError::Llama {
            input: req.input.clone(),
            output: req.output.clone(),
            to: req.to,
            code,
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    let output = GgufTypes::read(partial.path())?;
    let output_bytes = file_size(partial.path())?;
    partial.commit(&req.output)?;
    tracing::info!(
        output = %req.output.display(),
        file_type = %output.file_type,
        input_mib = format_args!("{:.1}", mib(input_bytes)),
        output_mib = format_args!("{:.1}", mib(output_bytes)),
        seconds = format_args!("{seconds:.1}"),
        "quantized {} -> {}: {}",
        input.file_type,
        output.file_type,
        output.histogram()
    );
    Ok(Report {
        input,
        output,
        input_bytes,
        output_bytes,
        seconds,
        threads,
    })
}

fn check_paths(input: &Path, output: &Path) -> Result<(), QuantizeError> {
    let in_meta = match std::fs::metadata(input) {
        Ok(m) if m.is_file() => m,
        _ => return Err(QuantizeError::InputMissing(input.to_path_buf())),
    };
    let dir = parent_dir(output);
    if !dir.is_dir() {
        return Err(QuantizeError::OutputDirMissing {
            path: output.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    if let Ok(out_meta) = std::fs::metadata(output) {
        if out_meta.is_dir() {
            return Err(QuantizeError::OutputIsDir(output.to_path_buf()));
        }
        // The same inode however it is spelled: `./m.gguf`, an absolute path, a link.
        if (out_meta.dev(), out_meta.ino()) == (in_meta.dev(), in_meta.ino()) {
            return Err(QuantizeError::OutputIsInput(output.to_path_buf()));
        }
    }
    Ok(())
}

/// The directory a path's file lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn quantize_file(
    input: &Path,
    output: &Path,
    to: QuantType,
    threads: u32,
) -> Result<u32, QuantizeError> {
    // The process's llama.cpp backend (initialised once, shared with any loaded model).
    crate::engine::chat::model::llama_backend().map_err(QuantizeError::Backend)?;
    let c_in = c_path(input)?;
    let c_out = c_path(output)?;
    // SAFETY: returns a plain struct by value.
    let mut params = unsafe { sys::llama_model_quantize_default_params() };
    params.nthread = i32::try_from(threads).unwrap_or(i32::MAX);
    params.ftype = to.ftype();
    // The default model is Q4_1 already; without this llama.cpp refuses quantized input.
    params.allow_requantize = true;
    // SAFETY: both paths are NUL-terminated and outlive the call; `params` is a valid struct
    // from llama.cpp's defaults whose pointers (imatrix, overrides) are all null. The call
    // catches its own C++ exceptions and returns non-zero instead.
    Ok(unsafe { sys::llama_model_quantize(c_in.as_ptr(), c_out.as_ptr(), &params) })
}

fn c_path(path: &Path) -> Result<CString, QuantizeError> {
    use std::os::unix::ffi::OsStrExt as _;
    CString::new(path.as_os_str().as_bytes()).map_err(|e| QuantizeError::Io {
        what: "path",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })
}

fn file_size(path: &Path) -> Result<u64, QuantizeError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| QuantizeError::Io {
            what: "cannot stat",
            path: path.to_path_buf(),
            source,
        })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The temporary file llama.cpp writes, in the output's directory so the final rename
/// stays on one filesystem. Removed on drop unless committed.
struct Partial {
    path: PathBuf,
    committed: bool,
}

impl Partial {
    fn next_to(output: &Path) -> Self {
        let name = output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model.gguf".into());
        let path = parent_dir(output).join(format!(".{name}.partial-{}", std::process::id()));
        Self {
            path,
            committed: false,
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn commit(mut self, output: &Path) -> Result<(), QuantizeError> {
        std::fs::rename(&self.path, output).map_err(|source| QuantizeError::Io {
            what: "cannot rename the quantized model to",
            path: output.to_path_buf(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            // Nothing to remove when llama.cpp failed before creating it.
            std::fs::remove_file(&self.path).ok();
        }
    }
}

/// A GGUF file's declared file type and each tensor's type, read with llama.cpp's own GGUF
/// parser (metadata only, no tensor data).
#[derive(Debug, Clone)]
pub struct GgufTypes {
    /// `general.file_type` as llama.cpp names it (`q8_0`, `q4_1`, …), or `ftype N`.
    pub file_type: String,
    pub tensors: Vec<TensorType>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorType {
    pub name: String,
    /// ggml's name for the type: `f32`, `q8_0`, `q4_1`, …
    pub ggml_type: String,
    /// Dimensions up to the last that is not 1: a norm is 1, a weight matrix 2.
    pub n_dims: usize,
}

impl GgufTypes {
    /// Reads the header with the same reader the ledger and the native backend use.
    pub fn read(path: &Path) -> Result<Self, QuantizeError> {
        let gguf = inferloop_gguf::Gguf::open(path).map_err(|e| QuantizeError::Header {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let file_type = gguf
            .get_u32("general.file_type")
            .map_or_else(|| "unknown".into(), ftype_name);
        let tensors = gguf
            .tensors()
            .iter()
            .map(|t| TensorType {
                name: t.name().to_owned(),
                ggml_type: t.ggml_type().name().to_owned(),
                n_dims: t.dims().iter().rposition(|&d| d != 1).map_or(1, |i| i + 1),
            })
            .collect();
        Ok(Self { file_type, tensors })
    }

    /// `q8_0: 210, f32: 61`: tensors per type, most first.
    pub fn histogram(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.tensors {
            *counts.entry(t.ggml_type.as_str()).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        counts
            .iter()
            .map(|(t, n)| format!("{t}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_*` names for the common types.
fn ftype_name(ftype: u32) -> String {
    let name = match ftype {
        sys::LLAMA_FTYPE_ALL_F32 => "f32",
        sys::LLAMA_FTYPE_MOSTLY_F16 => "f16",
        sys::LLAMA_FTYPE_MOSTLY_Q4_0 => "q4_0",
        sys::LLAMA_FTYPE_MOSTLY_Q4_1 => "q4_1",
        sys::LLAMA_FTYPE_MOSTLY_Q8_0 => "q8_0",
        sys::LLAMA_FTYPE_MOSTLY_Q5_0 => "q5_0",
        sys::LLAMA_FTYPE_MOSTLY_Q5_1 => "q5_1",
        sys::LLAMA_FTYPE_MOSTLY_Q4_K_M => "q4_k_m",
        sys::LLAMA_FTYPE_MOSTLY_Q6_K => "q6_k",
        sys::LLAMA_FTYPE_MOSTLY_BF16 => "bf16",
        n => return format!("ftype {n}"),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(dir: &Path, input: &Path, output: &Path) -> Request {
        Request {
            input: dir.join(input),
            output: dir.join(output),
            to: QuantType::Q8_0,
            threads: Some(1),
        }
    }

    #[test]
    fn a_missing_input_is_a_usage_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(&request(
            dir.path(),
            "none.gguf".as_ref(),
            "out.gguf".as_ref(),
        ))
        .unwrap_err();
        assert!(matches!(err, QuantizeError::InputMissing(_)), "{err}");
        assert_eq!(err.exit_code(), ExitCode::Usage);
        assert!(err.to_string().contains("none.gguf"), "{err}");
    }

    #[test]
    fn an_output_in_a_missing_directory_is_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.gguf"), b"x").unwrap();
        let err = run(&request(
            dir.path(),
            "in.gguf".as_ref(),
            "nowhere/out.gguf".as_ref(),
        ))
        .unwrap_err();
        assert!(
            matches!(err, QuantizeError::OutputDirMissing { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("nowhere"), "{err}");
    }

    #[test]
    fn the_input_spelled_another_way_is_refused_as_output() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.gguf"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("in.gguf"), dir.path().join("link.gguf"))
            .unwrap();
        for output in ["in.gguf", "./in.gguf", "link.gguf"] {
            let err = run(&request(dir.path(), "in.gguf".as_ref(), output.as_ref())).unwrap_err();
            assert!(
                matches!(err, QuantizeError::OutputIsInput(_)),
                "{output}: {err}"
            );
            assert_eq!(err.exit_code(), ExitCode::Usage);
        }
    }

    #[test]
    fn a_file_that_is_not_gguf_fails_as_a_load_error_and_leaves_no_output() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.gguf"), b"not a model").unwrap();
        let err = run(&request(
            dir.path(),
            "in.gguf".as_ref(),
            "out.gguf".as_ref(),
        ))
        .unwrap_err();
        assert!(matches!(err, QuantizeError::Header { .. }), "{err}");
        assert_eq!(err.exit_code(), ExitCode::ModelLoad);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["in.gguf"]);
    }
}
