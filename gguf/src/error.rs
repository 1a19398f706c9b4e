//! What can be wrong with a GGUF file, each error saying where and what was expected.

use std::fmt;
use std::path::PathBuf;

use crate::types::RowError;
use crate::value::ValueType;

/// Opening a GGUF file: the file could not be read, or its bytes are not a valid GGUF.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The OS error is in the message too: `inferloopd check` prints errors without their
    /// chain, and the ledger's reader always said why a file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {error}", path.display())]
    Format { path: PathBuf, error: FormatError },
}

impl GgufError {
    /// The format error, when the file was read but its contents are wrong.
    pub fn format(&self) -> Option<&FormatError> {
        match self {
            Self::Format { error, .. } => Some(error),
            Self::Io { .. } => None,
        }
    }
}

/// Bytes that are not a GGUF this reader accepts. Offsets are from the start of the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error("not a GGUF file (it starts with \"{}\", not \"GGUF\")", magic.escape_ascii())]
    NotGguf { magic: [u8; 4] },
    #[error("GGUF version {version} is not supported (2 and 3 are)")]
    Version { version: u32 },
    #[error("at offset {offset}: {what} needs {need} bytes, {left} are left")]
    Truncated {
        offset: u64,
        what: &'static str,
        need: u64,
        left: u64,
    },
    #[error(
        "at offset {offset}: {what} {count} cannot fit in the {left} bytes left \
         (each takes at least {min_each})"
    )]
    Count {
        offset: u64,
        what: &'static str,
        count: u64,
        left: u64,
        min_each: u64,
    },
    #[error("at offset {offset}: {what} is not UTF-8")]
    NotUtf8 { offset: u64, what: &'static str },
    #[error("at offset {offset}: a metadata key is empty")]
    EmptyKey { offset: u64 },
    #[error("at offset {offset}: unknown value type {id}")]
    UnknownValueType { offset: u64, id: u32 },
    #[error("at offset {offset}: a bool of {value}, not 0 or 1")]
    BadBool { offset: u64, value: u8 },
    #[error("at offset {offset}: arrays nested deeper than {max}")]
    TooDeep { offset: u64, max: usize },
    /// An error inside the value of `key`, whose entry starts at `offset`.
    #[error("metadata `{key}` at offset {offset}: {error}")]
    Value {
        key: String,
        offset: u64,
        error: Box<FormatError>,
    },
    #[error("at offset {offset}: metadata `{key}` appears twice")]
    DuplicateKey { offset: u64, key: String },
    #[error("`general.alignment` must be a u32, not a {found}")]
    AlignmentType { found: ValueType },
    #[error("`general.alignment` {value} is not a power of two")]
    Alignment { value: u32 },
    /// A problem with one tensor, whose info starts at `offset` in the header.
    #[error("tensor '{name}' at offset {offset}: {problem}")]
    Tensor {
        name: String,
        offset: u64,
        problem: TensorProblem,
    },
    /// A key a reader of the metadata needs (e.g. [`crate::ModelShape`]) is absent or has
    /// the wrong type.
    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },
}

impl FormatError {
    /// A stable name for the variant (`tensor.out_of_bounds`), for logs and tallies.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotGguf { .. } => "not_gguf",
            Self::Version { .. } => "version",
            Self::Truncated { .. } => "truncated",
            Self::Count { .. } => "count",
            Self::NotUtf8 { .. } => "not_utf8",
            Self::EmptyKey { .. } => "empty_key",
            Self::UnknownValueType { .. } => "unknown_value_type",
            Self::BadBool { .. } => "bad_bool",
            Self::TooDeep { .. } => "too_deep",
            Self::Value { error, .. } => match error.kind() {
                "truncated" => "value.truncated",
                "count" => "value.count",
                "not_utf8" => "value.not_utf8",
                "unknown_value_type" => "value.unknown_value_type",
                "bad_bool" => "value.bad_bool",
                "too_deep" => "value.too_deep",
                _ => "value",
            },
            Self::DuplicateKey { .. } => "duplicate_key",
            Self::AlignmentType { .. } => "alignment_type",
            Self::Alignment { .. } => "alignment",
            Self::Tensor { problem, .. } => match problem {
                TensorProblem::Dims(_) => "tensor.dims",
                TensorProblem::Shape(_) => "tensor.shape",
                TensorProblem::UnknownType(_) => "tensor.unknown_type",
                TensorProblem::Row(_) => "tensor.row",
                TensorProblem::Misaligned { .. } => "tensor.misaligned",
                TensorProblem::OutOfBounds { .. } => "tensor.out_of_bounds",
                TensorProblem::Duplicate => "tensor.duplicate",
            },
            Self::MissingKey { .. } => "missing_key",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorProblem {
    #[error("{0} dimensions, ggml allows at most 4")]
    Dims(u32),
    #[error("dimensions {0:?} hold more than 2^63 - 1 elements")]
    Shape(Vec<u64>),
    #[error("unknown ggml type {0}")]
    UnknownType(u32),
    #[error("rows of {0}")]
    Row(RowError),
    #[error("data offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { offset: u64, alignment: u64 },
    #[error(
        "data range {start}..{end} ({}..{}) beyond the file's {file_len} bytes ({})",
        Size(*start), Size(*end), Size(*file_len)
    )]
    OutOfBounds { start: u64, end: u64, file_len: u64 },
    #[error("the name is used twice")]
    Duplicate,
}

/// A byte count for people: `93.8 MiB`.
struct Size(u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        write!(f, "{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_names_the_range_in_bytes_and_units() {
        let e = FormatError::Tensor {
            name: "blk.0.attn_q.weight".into(),
            offset: 1234,
            problem: TensorProblem::OutOfBounds {
                start: 5 << 30,
                end: 9 << 30,
                file_len: 98_362_432,
            },
        };
        assert_eq!(
            e.to_string(),
            "tensor 'blk.0.attn_q.weight' at offset 1234: data range 5368709120..9663676416 \
             (5.0 GiB..9.0 GiB) beyond the file's 98362432 bytes (93.8 MiB)"
        );
        assert_eq!(Size(1023).to_string(), "1023 B");
    }
}
