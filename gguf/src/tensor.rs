//! Tensor infos from the header, and views of their data.

use std::ops::Range;

use crate::types::GgmlType;

/// One tensor as the header describes it, with its data range already checked to lie in
/// the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) n_dims: u32,
    /// Unused dimensions are 1, as in ggml's `ne`.
    pub(crate) dims: [u64; 4],
    pub(crate) ty: GgmlType,
    pub(crate) offset: u64,
    pub(crate) n_elements: u64,
    pub(crate) n_bytes: u64,
    pub(crate) data: Range<usize>,
    pub(crate) header_offset: u64,
}

impl TensorInfo {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions, innermost first (ggml's `ne[0..n_dims]`).
    pub fn dims(&self) -> &[u64] {
        // n_dims ≤ 4 is checked when parsing.
        &self.dims[..(self.n_dims as usize).min(4)]
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// Bytes of one row (`dims()[0]` elements).
    pub fn row_bytes(&self) -> u64 {
        // Checked when parsing: the first dimension is whole blocks.
        self.ty.row_bytes(self.dims[0]).unwrap_or(0)
    }

    /// Where the data lies in the file.
    pub fn file_range(&self) -> Range<usize> {
        self.data.clone()
    }

    /// Where this tensor's info starts in the header.
    pub fn header_offset(&self) -> u64 {
        self.header_offset
    }
}

/// A tensor's info and its data, borrowed from the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub bytes: &'a [u8],
}
