//! Metadata values: their types, and decoding them from bytes the parser has checked.

use std::fmt;

/// A metadata value's type, with its id in the file (`gguf_type` in gguf.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes a value of this type takes: what bounds a count read from the file.
    pub(crate) fn min_size(self) -> usize {
        match self {
            // A length; an element type and a count.
            ValueType::String => 8,
            ValueType::Array => 12,
            fixed => fixed.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value, borrowed from the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type, as a signed number (`None` for a u64 above `i64::MAX`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any integer type whose value is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            other => other.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<Array<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array value: its element type, its length and its elements' bytes, decoded on
/// iteration (a vocabulary stays in the map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Array<'a> {
    elem: ValueType,
    len: usize,
    bytes: &'a [u8],
}

impl<'a> Array<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            elem: self.elem,
            left: self.len,
            rest: self.bytes,
        }
    }
}

impl<'a> IntoIterator for Array<'a> {
    type Item = Value<'a>;
    type IntoIter = ArrayIter<'a>;
    fn into_iter(self) -> ArrayIter<'a> {
        self.iter()
    }
}

/// The elements of an [`Array`], in file order.
#[derive(Debug, Clone)]
pub struct ArrayIter<'a> {
    elem: ValueType,
    left: usize,
    rest: &'a [u8],
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        let (value, used) = decode(self.rest, self.elem)?;
        self.rest = self.rest.get(used..)?;
        self.left -= 1;
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

fn le<const N: usize>(b: &[u8]) -> Option<[u8; N]> {
    b.get(..N)?.try_into().ok()
}

/// Decodes the value of type `ty` at the start of `b` and says how many bytes it took.
/// `b` was checked by the parser, so `None` never happens in practice; it stands in for a
/// panic on bytes that somehow were not.
pub(crate) fn decode(b: &[u8], ty: ValueType) -> Option<(Value<'_>, usize)> {
    Some(match ty {
        ValueType::U8 => (Value::U8(*b.first()?), 1),
        ValueType::I8 => (Value::I8(i8::from_le_bytes(le(b)?)), 1),
        ValueType::U16 => (Value::U16(u16::from_le_bytes(le(b)?)), 2),
        ValueType::I16 => (Value::I16(i16::from_le_bytes(le(b)?)), 2),
        ValueType::U32 => (Value::U32(u32::from_le_bytes(le(b)?)), 4),
        ValueType::I32 => (Value::I32(i32::from_le_bytes(le(b)?)), 4),
        ValueType::F32 => (Value::F32(f32::from_le_bytes(le(b)?)), 4),
        ValueType::Bool => (Value::Bool(*b.first()? != 0), 1),
        ValueType::U64 => (Value::U64(u64::from_le_bytes(le(b)?)), 8),
        ValueType::I64 => (Value::I64(i64::from_le_bytes(le(b)?)), 8),
        ValueType::F64 => (Value::F64(f64::from_le_bytes(le(b)?)), 8),
        ValueType::String => {
            let len = usize::try_from(u64::from_le_bytes(le(b)?)).ok()?;
            let end = len.checked_add(8)?;
            (
                Value::String(std::str::from_utf8(b.get(8..end)?).ok()?),
                end,
            )
        }
        ValueType::Array => {
            let elem = ValueType::from_id(u32::from_le_bytes(le(b)?))?;
            let len = usize::try_from(u64::from_le_bytes(le(b.get(4..)?)?)).ok()?;
            let items = b.get(12..)?;
            let extent = match elem.fixed_size() {
                Some(size) => len.checked_mul(size)?,
                None => {
                    let mut at = 0;
                    for _ in 0..len {
                        at += decode(items.get(at..)?, elem)?.1;
                    }
                    at
                }
            };
            let bytes = items.get(..extent)?;
            (Value::Array(Array { elem, len, bytes }), 12 + extent)
        }
    })
}
