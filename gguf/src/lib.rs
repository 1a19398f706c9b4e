//! One GGUF reader for InferLoop: the daemon's memory ledger sizes a model with it, and a
//! native backend reads its weights through it.
//!
//! The file is memory-mapped and its header parsed once, strictly: every count and length is
//! checked against the bytes left before anything is sized from it, every string is UTF-8,
//! and every tensor's data range is computed from its ggml type and checked to lie in the
//! file. Metadata and tensor data are then read in place, without copies.
//!
//! # Layout
//! - [`Gguf`] (here): the parsed file over its bytes; [`GgufFile`] is one over a map.
//! - `parse` (private): the header parser and its bounds checks.
//! - [`value`]: metadata value types and borrowed values ([`Value`], [`Array`]).
//! - [`tensor`]: [`TensorInfo`] and [`TensorView`].
//! - [`types`]: [`GgmlType`] with ggml's block sizes and bytes per block.
//! - [`shape`]: [`ModelShape`], the facts the daemon's memory ledger needs.
//! - [`vocab`]: [`same_vocab`], whether a draft model's token ids mean the model's.
//! - [`error`]: [`GgufError`] (path + cause) and [`FormatError`] (offset + what was expected).

pub mod error;
mod parse;
pub mod shape;
pub mod tensor;
pub mod types;
pub mod value;
pub mod vocab;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use error::{FormatError, GgufError, TensorProblem};
pub use parse::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
pub use shape::{read_shape, ModelShape};
pub use tensor::{TensorInfo, TensorView};
pub use types::{GgmlType, RowError};
pub use value::{Array, ArrayIter, Value, ValueType};
pub use vocab::{same_vocab, VocabMismatch};

use parse::{key_of, value_of, Header};

/// A parsed GGUF over its bytes: a map ([`GgufFile`]), a `Vec<u8>` or a borrowed slice.
#[derive(Debug)]
pub struct Gguf<B> {
    bytes: B,
    header: Header,
}

/// A GGUF file mapped into memory; only the pages that are read are touched.
pub type GgufFile = Gguf<memmap2::Mmap>;

impl Gguf<memmap2::Mmap> {
    /// Maps the file and parses its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Another process
        // truncating the file while it is mapped would fault the reads (SIGBUS), as it does
        // for llama.cpp's own map; weights are read-only where the daemon is deployed.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes(map).map_err(|error| GgufError::Format {
            path: path.to_path_buf(),
            error,
        })
    }
}

impl<B: AsRef<[u8]>> Gguf<B> {
    /// Parses the header of a GGUF held in memory.
    pub fn from_bytes(bytes: B) -> Result<Self, FormatError> {
        let header = parse::parse(bytes.as_ref())?;
        Ok(Self { bytes, header })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    pub fn file_len(&self) -> u64 {
        self.bytes().len() as u64
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Where the data section starts (tensor offsets count from here).
    pub fn data_offset(&self) -> u64 {
        self.header.data_start
    }

    /// The value of a metadata key.
    pub fn metadata(&self, key: &str) -> Option<Value<'_>> {
        let b = self.bytes();
        value_of(b, self.header.entry(b, key)?)
    }

    /// Every metadata entry, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, Value<'_>)> + '_ {
        let b = self.bytes();
        self.header.entries.iter().filter_map(move |e| {
            let key = std::str::from_utf8(key_of(b, e)).ok()?;
            Some((key, value_of(b, e)?))
        })
    }

    /// An integer of any type that fits in a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    /// An integer of any type that is not negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata(key)?.as_u64()
    }

    /// An integer of any type that fits in a usize.
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get_u64(key).and_then(|v| usize::try_from(v).ok())
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.metadata(key)?.as_f32()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<Array<'_>> {
        self.metadata(key)?.as_array()
    }

    pub fn get_array_len(&self, key: &str) -> Option<usize> {
        self.get_array(key).map(|a| a.len())
    }

    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.header.tensor(name)?;
        let bytes = self.bytes().get(info.file_range())?;
        Some(TensorView { info, bytes })
    }

    /// All tensor data together: what a backend maps and touches.
    pub fn tensor_bytes(&self) -> u64 {
        self.header
            .tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_bytes))
    }
}
