//! Why `golden` could not compare, with the exit code each failure maps to.

use std::path::PathBuf;

use crate::engine::native::NativeError;
use crate::engine::EngineError;
use crate::exit::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    #[error("prompts file {}: {source}", .path.display())]
    Prompts {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("prompts file {} holds no prompt (blank lines and `#` lines are skipped)", .0.display())]
    NoPrompts(PathBuf),
    #[error("prompt {line} of {}: {why}", .path.display())]
    Tokenize {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error(transparent)]
    Llama(#[from] EngineError),
    #[error("llama.cpp decode at prompt line {line}: {why}")]
    Decode { line: usize, why: String },
    #[error("native model {}: {source}", .path.display())]
    NativeLoad { path: PathBuf, source: NativeError },
    #[error("native forward pass at prompt line {line}: {source}")]
    Native { line: usize, source: NativeError },
}

impl GoldenError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Prompts { .. } => "prompts_file",
            Self::NoPrompts(_) => "no_prompts",
            Self::Tokenize { .. } => "tokenize",
            Self::Llama(_) => "llama_load",
            Self::Decode { .. } => "llama_decode",
            Self::NativeLoad { .. } => "native_load",
            Self::Native { .. } => "native_forward",
        }
    }

    /// A prompts file that cannot be read or used is a usage error (2); a model either side
    /// cannot load or run (not Q8_0, say) is a load failure (4).
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Prompts { .. } | Self::NoPrompts(_) | Self::Tokenize { .. } => ExitCode::Usage,
            Self::Llama(_)
            | Self::Decode { .. }
            | Self::NativeLoad { .. }
            | Self::Native { .. } => ExitCode::ModelLoad,
        }
    }
}
