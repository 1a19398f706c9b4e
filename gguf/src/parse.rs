//! The header parser: every length and count is checked against the bytes left before it is
//! used, so a hostile header costs no more memory than its own size.

use std::ops::Range;

use crate::error::{FormatError, TensorProblem};
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::value::{decode, Value, ValueType};

/// `general.alignment` when the key is absent (GGUF_DEFAULT_ALIGNMENT).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays of arrays are legal GGUF but unused; the limit keeps recursion off the stack's edge.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest metadata entry: key length, a one-byte key, value type, a one-byte value.
const MIN_KV_BYTES: usize = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_BYTES: usize = 8 + 4 + 4 + 8;

/// One metadata entry: where its key and its value (as `decode` reads it) lie.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: Range<usize>,
    pub ty: ValueType,
    pub value: Range<usize>,
    pub offset: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    /// File order.
    pub entries: Vec<Entry>,
    /// Indices into `entries`, sorted by key.
    pub by_key: Vec<usize>,
    pub tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    pub by_name: Vec<usize>,
}

impl Header {
    pub fn entry(&self, b: &[u8], key: &str) -> Option<&Entry> {
        let i = self
            .by_key
            .binary_search_by(|&i| key_of(b, &self.entries[i]).cmp(key.as_bytes()))
            .ok()?;
        self.entries.get(self.by_key[i])
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = self
            .by_name
            .binary_search_by(|&i| self.tensors[i].name.as_str().cmp(name))
            .ok()?;
        self.tensors.get(self.by_name[i])
    }
}

pub(crate) fn key_of<'a>(b: &'a [u8], e: &Entry) -> &'a [u8] {
    b.get(e.key.clone()).unwrap_or_default()
}

pub(crate) fn value_of<'a>(b: &'a [u8], e: &Entry) -> Option<Value<'a>> {
    decode(b.get(e.value.clone())?, e.ty).map(|(v, _)| v)
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], FormatError> {
        let left = self.left();
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let s = &self.b[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(FormatError::Truncated {
                offset: self.pos as u64,
                what,
                need: n,
                left: left as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FormatError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed string; its start offset comes back for error messages.
    fn string(&mut self, what: &'static str) -> Result<(&'a str, usize), FormatError> {
        let at = self.pos;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        let s = std::str::from_utf8(bytes).map_err(|_| FormatError::NotUtf8 {
            offset: at as u64,
            what,
        })?;
        Ok((s, at))
    }

    /// Fails unless `count` items of at least `min_each` bytes fit in what is left.
    fn check_count(
        &self,
        at: usize,
        count: u64,
        min_each: usize,
        what: &'static str,
    ) -> Result<(), FormatError> {
        let fits = count
            .checked_mul(min_each as u64)
            .is_some_and(|n| n <= self.left() as u64);
        if fits {
            Ok(())
        } else {
            Err(FormatError::Count {
                offset: at as u64,
                what,
                count,
                left: self.left() as u64,
                min_each: min_each as u64,
            })
        }
    }

    fn value_type(&mut self) -> Result<ValueType, FormatError> {
        let at = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(FormatError::UnknownValueType { offset: at, id })
    }

    /// Steps over one value, checking it: lengths, UTF-8, bools, nesting.
    fn skip_value(&mut self, ty: ValueType, depth: usize) -> Result<(), FormatError> {
        match ty {
            ValueType::String => self.string("string").map(drop),
            ValueType::Array => self.skip_array(depth),
            ValueType::Bool => self.bools(1),
            fixed => {
                let size = fixed.fixed_size().unwrap_or(1);
                self.take(size as u64, fixed.name()).map(drop)
            }
        }
    }

    fn skip_array(&mut self, depth: usize) -> Result<(), FormatError> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(FormatError::TooDeep {
                offset: at as u64,
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.value_type()?;
        let count_at = self.pos;
        let count = self.u64("array length")?;
        self.check_count(count_at, count, elem.min_size(), "array length")?;
        match elem {
            ValueType::Bool => self.bools(count),
            ValueType::String | ValueType::Array => {
                // Each element takes at least min_size bytes, so the loop ends with the input.
                for _ in 0..count {
                    self.skip_value(elem, depth + 1)?;
                }
                Ok(())
            }
            fixed => {
                let size = fixed.fixed_size().unwrap_or(1) as u64;
                // check_count proved count × size fits.
                self.take(count * size, "array").map(drop)
            }
        }
    }

    fn bools(&mut self, count: u64) -> Result<(), FormatError> {
        let at = self.pos;
        let bytes = self.take(count, "bool")?;
        match bytes.iter().position(|&b| b > 1) {
            None => Ok(()),
            Some(i) => Err(FormatError::BadBool {
                offset: (at + i) as u64,
                value: bytes[i],
            }),
        }
    }
}

pub(crate) fn parse(b: &[u8]) -> Result<Header, FormatError> {
    let mut c = Cursor { b, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(FormatError::NotGguf { magic });
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(FormatError::Version { version });
    }
    let tensors_at = c.pos;
    let n_tensors = c.u64("tensor count")?;
    let kv_at = c.pos;
    let n_kv = c.u64("metadata count")?;
    c.check_count(tensors_at, n_tensors, MIN_TENSOR_BYTES, "tensor count")?;
    c.check_count(kv_at, n_kv, MIN_KV_BYTES, "metadata count")?;

    // Grown entry by entry, never reserved from the count: each entry pushed was read.
    let mut entries = Vec::new();
    for _ in 0..n_kv {
        entries.push(entry(&mut c)?);
    }
    let by_key = sorted(entries.len(), |i, j| {
        key_of(b, &entries[i]).cmp(key_of(b, &entries[j]))
    });
    if let Some(dup) = first_duplicate(&by_key, |i| key_of(b, &entries[i])) {
        let e = &entries[dup];
        return Err(FormatError::DuplicateKey {
            offset: e.offset as u64,
            key: String::from_utf8_lossy(key_of(b, e)).into_owned(),
        });
    }

    let mut header = Header {
        version,
        alignment: DEFAULT_ALIGNMENT,
        data_start: 0,
        entries,
        by_key,
        tensors: Vec::new(),
        by_name: Vec::new(),
    };
    if let Some(e) = header.entry(b, "general.alignment") {
        header.alignment = match value_of(b, e) {
            Some(Value::U32(v)) if v.is_power_of_two() => u64::from(v),
            Some(Value::U32(value)) => return Err(FormatError::Alignment { value }),
            _ => return Err(FormatError::AlignmentType { found: e.ty }),
        };
    }

    for _ in 0..n_tensors {
        header.tensors.push(tensor_info(&mut c)?);
    }
    header.by_name = sorted(header.tensors.len(), |i, j| {
        header.tensors[i].name.cmp(&header.tensors[j].name)
    });
    if let Some(dup) = first_duplicate(&header.by_name, |i| header.tensors[i].name.as_bytes()) {
        let t = &header.tensors[dup];
        return Err(tensor_error(t, TensorProblem::Duplicate));
    }

    // The data section starts at the next multiple of the alignment (from the file's start).
    let alignment = header.alignment;
    header.data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = b.len() as u64;
    for t in &mut header.tensors {
        if t.offset % alignment != 0 {
            let problem = TensorProblem::Misaligned {
                offset: t.offset,
                alignment,
            };
            return Err(tensor_error(t, problem));
        }
        let start = header.data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => {
                // end ≤ the slice's length, so both fit in usize.
                t.data = start as usize..end as usize;
            }
            _ => {
                let start = start.unwrap_or(u64::MAX);
                let problem = TensorProblem::OutOfBounds {
                    start,
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                };
                return Err(tensor_error(t, problem));
            }
        }
    }
    Ok(header)
}

fn entry(c: &mut Cursor<'_>) -> Result<Entry, FormatError> {
    let offset = c.pos;
    let (key, key_at) = c.string("metadata key")?;
    if key.is_empty() {
        return Err(FormatError::EmptyKey {
            offset: offset as u64,
        });
    }
    let key_range = key_at + 8..c.pos;
    let in_value = |error| FormatError::Value {
        key: key.to_owned(),
        offset: offset as u64,
        error: Box::new(error),
    };
    let ty = c.value_type().map_err(in_value)?;
    let start = c.pos;
    c.skip_value(ty, 0).map_err(in_value)?;
    Ok(Entry {
        key: key_range,
        ty,
        value: start..c.pos,
        offset,
    })
}

fn tensor_info(c: &mut Cursor<'_>) -> Result<TensorInfo, FormatError> {
    let header_offset = c.pos as u64;
    let (name, _) = c.string("tensor name")?;
    let mut t = TensorInfo {
        name: name.to_owned(),
        n_dims: 0,
        dims: [1; 4],
        ty: GgmlType::F32,
        offset: 0,
        n_elements: 1,
        n_bytes: 0,
        data: 0..0,
        header_offset,
    };
    t.n_dims = c.u32("tensor dimension count")?;
    if t.n_dims > 4 {
        return Err(tensor_error(&t, TensorProblem::Dims(t.n_dims)));
    }
    for d in 0..t.n_dims as usize {
        t.dims[d] = c.u64("tensor dimension")?;
    }
    // ggml holds dimensions and the element count in i64.
    let n_elements = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| {
            i64::try_from(d).ok()?;
            n.checked_mul(d)
        })
        .filter(|&n| n <= i64::MAX as u64);
    let Some(n_elements) = n_elements else {
        return Err(tensor_error(&t, TensorProblem::Shape(t.dims().to_vec())));
    };
    t.n_elements = n_elements;
    let id = c.u32("tensor type")?;
    t.ty = GgmlType::from_id(id).ok_or_else(|| tensor_error(&t, TensorProblem::UnknownType(id)))?;
    let row =
        t.ty.row_bytes(t.dims[0])
            .map_err(|e| tensor_error(&t, TensorProblem::Row(e)))?;
    // Up to 8 bytes per element: 2^63 elements can overflow u64, hence checked.
    let rows = n_elements.checked_div(t.dims[0]).unwrap_or(0);
    t.n_bytes = row
        .checked_mul(rows)
        .ok_or_else(|| tensor_error(&t, TensorProblem::Shape(t.dims().to_vec())))?;
    t.offset = c.u64("tensor data offset")?;
    Ok(t)
}

fn tensor_error(t: &TensorInfo, problem: TensorProblem) -> FormatError {
    FormatError::Tensor {
        name: t.name.clone(),
        offset: t.header_offset,
        problem,
    }
}

fn sorted(n: usize, cmp: impl Fn(usize, usize) -> std::cmp::Ordering) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by(|&i, &j| cmp(i, j));
    order
}

/// The later of the first two adjacent equal keys in sorted order.
fn first_duplicate<'k>(order: &[usize], key: impl Fn(usize) -> &'k [u8]) -> Option<usize> {
    order
        .windows(2)
        .find(|w| key(w[0]) == key(w[1]))
        .map(|w| w[0].max(w[1]))
}
