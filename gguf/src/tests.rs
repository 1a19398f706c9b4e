//! Unit tests on GGUF files written by a small builder, one behaviour each.

use crate::*;

/// Writes GGUF bytes: metadata as raw (type, bytes) pairs, tensors laid out in order.
struct Builder {
    version: u32,
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
    alignment: u64,
}

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

fn array(elem: u32, len: u64, items: &[u8]) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(items);
    b
}

impl Builder {
    fn new() -> Self {
        Self {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    fn kv(mut self, key: &str, ty: u32, value: impl Into<Vec<u8>>) -> Self {
        self.kv.push((key.into(), ty, value.into()));
        self
    }

    fn llama(self) -> Self {
        self.kv("general.architecture", 8, string("llama"))
            .kv("llama.block_count", 4, 30u32.to_le_bytes())
            .kv("llama.embedding_length", 4, 576u32.to_le_bytes())
            .kv("llama.attention.head_count", 4, 9u32.to_le_bytes())
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty.id()));
        self
    }

    /// The header alone, with tensor offsets laid out in order and aligned, and where the
    /// last tensor's data ends (from the data section's start).
    fn header(&self) -> (Vec<u8>, u64) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (key, ty, value) in &self.kv {
            b.extend_from_slice(&string(key));
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(value);
        }
        let (mut offset, mut end) = (0u64, 0u64);
        for (name, dims, ty) in &self.tensors {
            b.extend_from_slice(&string(name));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            let n: u64 = dims.iter().product();
            let bytes = GgmlType::from_id(*ty)
                .and_then(|t| t.row_bytes(n).ok())
                .unwrap_or(0);
            end = offset + bytes;
            offset += bytes.div_ceil(self.alignment) * self.alignment;
        }
        (b, end)
    }

    /// Header, padding and zeroed data, without padding after the last tensor.
    fn build(&self) -> Vec<u8> {
        let (mut b, data) = self.header();
        let start = (b.len() as u64).div_ceil(self.alignment) * self.alignment;
        b.resize((start + data) as usize, 0);
        b
    }
}

fn parse(b: &[u8]) -> Result<Gguf<&[u8]>, FormatError> {
    Gguf::from_bytes(b)
}

/// The error inside a metadata value, unwrapped from its key.
fn value_error(e: FormatError) -> (String, FormatError) {
    match e {
        FormatError::Value { key, error, .. } => (key, *error),
        other => panic!("not a value error: {other:?}"),
    }
}

fn tensor_problem(e: FormatError) -> (String, u64, TensorProblem) {
    match e {
        FormatError::Tensor {
            name,
            offset,
            problem,
        } => (name, offset, problem),
        other => panic!("not a tensor error: {other:?}"),
    }
}

#[test]
fn every_scalar_value_type_reads_back() {
    let b = Builder::new()
        .kv("u8", 0, [200])
        .kv("i8", 1, (-5i8).to_le_bytes())
        .kv("u16", 2, 60000u16.to_le_bytes())
        .kv("i16", 3, (-300i16).to_le_bytes())
        .kv("u32", 4, 4_000_000_000u32.to_le_bytes())
        .kv("i32", 5, (-70000i32).to_le_bytes())
        .kv("f32", 6, 1.5f32.to_le_bytes())
        .kv("bool", 7, [1])
        .kv("string", 8, string("héllo"))
        .kv("u64", 10, u64::MAX.to_le_bytes())
        .kv("i64", 11, i64::MIN.to_le_bytes())
        .kv("f64", 12, (-2.25f64).to_le_bytes())
        .build();
    let g = parse(&b).expect("parses");
    assert_eq!(g.metadata("u8"), Some(Value::U8(200)));
    assert_eq!(g.metadata("i8"), Some(Value::I8(-5)));
    assert_eq!(g.metadata("u16"), Some(Value::U16(60000)));
    assert_eq!(g.metadata("i16"), Some(Value::I16(-300)));
    assert_eq!(g.metadata("u32"), Some(Value::U32(4_000_000_000)));
    assert_eq!(g.metadata("i32"), Some(Value::I32(-70000)));
    assert_eq!(g.metadata("f32"), Some(Value::F32(1.5)));
    assert_eq!(g.metadata("bool"), Some(Value::Bool(true)));
    assert_eq!(g.metadata("string"), Some(Value::String("héllo")));
    assert_eq!(g.metadata("u64"), Some(Value::U64(u64::MAX)));
    assert_eq!(g.metadata("i64"), Some(Value::I64(i64::MIN)));
    assert_eq!(g.metadata("f64"), Some(Value::F64(-2.25)));
    assert_eq!(g.metadata("absent"), None);
    let keys: Vec<&str> = g.metadata_entries().map(|(k, _)| k).collect();
    assert_eq!(keys[0], "u8", "file order");
    assert_eq!(keys.len(), 12);
}

#[test]
fn typed_getters_convert_integers_losslessly() {
    let b = Builder::new()
        .kv("u8", 0, [7])
        .kv("neg", 5, (-1i32).to_le_bytes())
        .kv("big", 10, (1u64 << 40).to_le_bytes())
        .kv("f", 6, 0.5f32.to_le_bytes())
        .kv("s", 8, string("x"))
        .build();
    let g = parse(&b).expect("parses");
    assert_eq!(g.get_u32("u8"), Some(7));
    assert_eq!(g.get_usize("u8"), Some(7));
    assert_eq!(g.get_u64("neg"), None, "negative is not a u64");
    assert_eq!(g.get_u32("big"), None, "2^40 is not a u32");
    assert_eq!(g.get_u64("big"), Some(1 << 40));
    assert_eq!(g.get_f32("f"), Some(0.5));
    assert_eq!(g.get_f32("u8"), None);
    assert_eq!(g.get_str("s"), Some("x"));
    assert_eq!(g.get_str("u8"), None);
}

#[test]
fn arrays_of_every_kind_iterate_including_nested() {
    let mut strings = Vec::new();
    for s in ["a", "", "ccc"] {
        strings.extend(string(s));
    }
    let inner1 = array(4, 2, &[1, 0, 0, 0, 2, 0, 0, 0]);
    let inner2 = array(8, 1, &string("z"));
    let nested = array(9, 2, &[inner1, inner2].concat());
    let b = Builder::new()
        .kv(
            "ints",
            9,
            array(5, 3, &[1i32, -2, 3].map(i32::to_le_bytes).concat()),
        )
        .kv("strs", 9, array(8, 3, &strings))
        .kv("bools", 9, array(7, 2, &[0, 1]))
        .kv("f64s", 9, array(12, 1, &1.25f64.to_le_bytes()))
        .kv("nested", 9, nested)
        .kv("empty", 9, array(8, 0, &[]))
        .build();
    let g = parse(&b).expect("parses");
    let ints: Vec<i64> = g
        .get_array("ints")
        .expect("array")
        .iter()
        .filter_map(|v| v.as_i64())
        .collect();
    assert_eq!(ints, [1, -2, 3]);
    let strs: Vec<&str> = g
        .get_array("strs")
        .expect("array")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(strs, ["a", "", "ccc"]);
    assert_eq!(g.get_array_len("strs"), Some(3));
    let bools: Vec<Value> = g.get_array("bools").expect("array").iter().collect();
    assert_eq!(bools, [Value::Bool(false), Value::Bool(true)]);
    assert_eq!(
        g.get_array("f64s").and_then(|a| a.iter().next()),
        Some(Value::F64(1.25))
    );
    let nested = g.get_array("nested").expect("array");
    assert_eq!(nested.elem_type(), ValueType::Array);
    let inner: Vec<Array> = nested.iter().filter_map(|v| v.as_array()).collect();
    assert_eq!(inner.len(), 2);
    assert_eq!(
        inner[0].iter().collect::<Vec<_>>(),
        [Value::U32(1), Value::U32(2)]
    );
    assert_eq!(inner[1].iter().collect::<Vec<_>>(), [Value::String("z")]);
    assert_eq!(g.get_array_len("empty"), Some(0));
}

#[test]
fn huge_array_length_is_an_error_not_an_allocation() {
    let b = Builder::new().kv("strs", 9, array(8, 1 << 60, &[])).build();
    let (key, e) = value_error(parse(&b).unwrap_err());
    assert_eq!(key, "strs");
    assert!(
        matches!(e, FormatError::Count { count, what: "array length", .. } if count == 1 << 60),
        "{e:?}"
    );
    // u64 elements: count × 8 overflows u64 itself.
    let b = Builder::new()
        .kv("u64s", 9, array(10, u64::MAX, &[]))
        .build();
    assert!(matches!(
        value_error(parse(&b).unwrap_err()).1,
        FormatError::Count { .. }
    ));
}

#[test]
fn nesting_beyond_the_limit_is_rejected() {
    let mut v = array(0, 0, &[]);
    for _ in 1..MAX_ARRAY_DEPTH {
        v = array(9, 1, &v);
    }
    let b = Builder::new().kv("deepest", 9, v.clone()).build();
    assert!(parse(&b).is_ok(), "{MAX_ARRAY_DEPTH} levels are allowed");
    v = array(9, 1, &v);
    let b = Builder::new().kv("deep", 9, v).build();
    let (_, e) = value_error(parse(&b).unwrap_err());
    assert!(
        matches!(
            e,
            FormatError::TooDeep {
                max: MAX_ARRAY_DEPTH,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn bad_values_are_named_with_their_key_and_offset() {
    let b = Builder::new().kv("flag", 7, [2]).build();
    let e = parse(&b).unwrap_err();
    let FormatError::Value { key, offset, error } = &e else {
        panic!("{e:?}")
    };
    assert_eq!((key.as_str(), *offset), ("flag", 24));
    assert_eq!(
        **error,
        FormatError::BadBool {
            offset: 24 + 8 + 4 + 4,
            value: 2
        }
    );
    assert_eq!(
        e.to_string(),
        "metadata `flag` at offset 24: at offset 40: a bool of 2, not 0 or 1"
    );

    let b = Builder::new().kv("t", 13, [0]).build();
    assert!(matches!(
        value_error(parse(&b).unwrap_err()).1,
        FormatError::UnknownValueType { id: 13, .. }
    ));

    let mut bad = 2u64.to_le_bytes().to_vec();
    bad.extend_from_slice(&[0xC3, 0x28]);
    let b = Builder::new().kv("s", 8, bad).build();
    assert!(matches!(
        value_error(parse(&b).unwrap_err()).1,
        FormatError::NotUtf8 { .. }
    ));
}

#[test]
fn duplicate_and_empty_keys_are_rejected() {
    let b = Builder::new().kv("a", 0, [1]).kv("a", 0, [2]).build();
    assert!(matches!(parse(&b).unwrap_err(), FormatError::DuplicateKey { key, .. } if key == "a"));
    let b = Builder::new().kv("", 0, [1]).build();
    assert_eq!(parse(&b).unwrap_err(), FormatError::EmptyKey { offset: 24 });
}

#[test]
fn not_a_gguf_file_is_named() {
    let e = parse(b"PK\x03\x04rest").unwrap_err();
    assert_eq!(
        e,
        FormatError::NotGguf {
            magic: *b"PK\x03\x04"
        }
    );
    let mut b = Builder::new().build();
    b[4] = 1;
    assert_eq!(parse(&b).unwrap_err(), FormatError::Version { version: 1 });
}

#[test]
fn truncated_header_is_an_error_not_a_panic() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&5u64.to_le_bytes());
    bytes.extend_from_slice(b"gen");
    assert!(parse(&bytes).is_err());
    let full = Builder::new()
        .llama()
        .tensor("w", &[32, 2], GgmlType::Q8_0)
        .build();
    for n in 0..full.len() {
        assert!(parse(&full[..n]).is_err(), "prefix of {n} bytes");
    }
    assert!(parse(&full).is_ok());
}

#[test]
fn absurd_counts_are_rejected() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    let e = parse(&bytes).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::Count {
                offset: 8,
                what: "tensor count",
                ..
            }
        ),
        "{e:?}"
    );
    let mut b = Builder::new().kv("a", 0, [1]).build();
    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = parse(&b).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::Count {
                offset: 16,
                what: "metadata count",
                ..
            }
        ),
        "{e:?}"
    );
    let mut b = Builder::new().kv("a", 8, string("x")).build();
    b[24 + 9 + 4..24 + 9 + 4 + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let (_, e) = value_error(parse(&b).unwrap_err());
    assert!(
        matches!(e, FormatError::Truncated { need, .. } if need == 1 << 60),
        "{e:?}"
    );
}

#[test]
fn alignment_defaults_to_32_and_must_be_a_u32_power_of_two() {
    let b = Builder::new().tensor("a", &[3], GgmlType::F32).build();
    let g = parse(&b).expect("parses");
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset() % 32, 0);
    assert!(g.data_offset() >= 24);

    let mut builder = Builder::new()
        .kv("general.alignment", 4, 64u32.to_le_bytes())
        .tensor("a", &[3], GgmlType::F32)
        .tensor("b", &[5], GgmlType::F32);
    builder.alignment = 64;
    let b = builder.build();
    let g = parse(&b).expect("parses");
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    let t = g.tensor("b").expect("tensor b");
    assert_eq!(t.info.offset(), 64);
    assert_eq!(t.info.file_range().start as u64, g.data_offset() + 64);

    let b = Builder::new()
        .kv("general.alignment", 4, 48u32.to_le_bytes())
        .build();
    assert_eq!(parse(&b).unwrap_err(), FormatError::Alignment { value: 48 });
    let b = Builder::new()
        .kv("general.alignment", 4, 0u32.to_le_bytes())
        .build();
    assert_eq!(parse(&b).unwrap_err(), FormatError::Alignment { value: 0 });
    let b = Builder::new()
        .kv("general.alignment", 10, 32u64.to_le_bytes())
        .build();
    assert_eq!(
        parse(&b).unwrap_err(),
        FormatError::AlignmentType {
            found: ValueType::U64
        }
    );
}

#[test]
fn misaligned_tensor_offset_is_rejected() {
    let mut b = Builder::new().tensor("a", &[8], GgmlType::F32).build();
    // The offset is the last 8 bytes of the info: name (8 + 1), n_dims 4, dims 8, type 4.
    let at = 24 + 9 + 4 + 8 + 4;
    b[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    let (name, offset, problem) = tensor_problem(parse(&b).unwrap_err());
    assert_eq!((name.as_str(), offset), ("a", 24));
    assert_eq!(
        problem,
        TensorProblem::Misaligned {
            offset: 4,
            alignment: 32
        }
    );
}

#[test]
fn tensor_data_beyond_the_file_names_tensor_offset_and_range() {
    let full = Builder::new()
        .tensor("blk.0.attn_q.weight", &[64, 4], GgmlType::Q8_0)
        .build();
    let cut = &full[..full.len() - 1];
    let e = parse(cut).unwrap_err();
    let (name, offset, problem) = tensor_problem(e.clone());
    assert_eq!((name.as_str(), offset), ("blk.0.attn_q.weight", 24));
    let start = 96u64; // header of 90 bytes, aligned to 32
    assert_eq!(
        problem,
        TensorProblem::OutOfBounds {
            start,
            end: start + 4 * 68,
            file_len: cut.len() as u64
        }
    );
    assert!(e.to_string().starts_with(
        "tensor 'blk.0.attn_q.weight' at offset 24: data range 96..368 (96 B..368 B) beyond the file's 367 bytes"
    ), "{e}");

    // An offset near u64::MAX must not wrap around into the file.
    let mut b = Builder::new().tensor("a", &[8], GgmlType::F32).build();
    let at = 24 + 9 + 4 + 8 + 4;
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let (_, _, problem) = tensor_problem(parse(&b).unwrap_err());
    assert!(
        matches!(problem, TensorProblem::OutOfBounds { .. }),
        "{problem:?}"
    );
}

#[test]
fn tensor_sizes_follow_their_type() {
    let b = Builder::new()
        .tensor("q4_1", &[576, 10], GgmlType::Q4_1)
        .tensor("q8_0", &[64, 3, 2], GgmlType::Q8_0)
        .tensor("f32", &[7], GgmlType::F32)
        .tensor("f16", &[5, 3], GgmlType::F16)
        .tensor("q6_k", &[512, 2], GgmlType::Q6_K)
        .tensor("scalar", &[], GgmlType::F32)
        .build();
    let g = parse(&b).expect("parses");
    let sizes: Vec<(&str, u64, u64)> = g
        .tensors()
        .iter()
        .map(|t| (t.name(), t.n_elements(), t.n_bytes()))
        .collect();
    assert_eq!(
        sizes,
        [
            ("q4_1", 5760, 18 * 20 * 10),
            ("q8_0", 384, 2 * 34 * 3 * 2),
            ("f32", 7, 28),
            ("f16", 15, 30),
            ("q6_k", 1024, 2 * 210 * 2),
            ("scalar", 1, 4),
        ]
    );
    let v = g.tensor("q8_0").expect("tensor");
    assert_eq!(v.bytes.len(), 408);
    assert_eq!(v.info.dims(), [64, 3, 2]);
    assert_eq!(v.info.row_bytes(), 68);
    assert_eq!(v.info.ggml_type(), GgmlType::Q8_0);
    assert!(g.tensor("absent").is_none());
    assert_eq!(g.tensor_bytes(), 3600 + 408 + 28 + 30 + 840 + 4);
}

#[test]
fn bad_tensor_infos_are_named() {
    type Expected = fn(&TensorProblem) -> bool;
    let cases: [(Builder, Expected); 5] = [
        (
            Builder::new().tensor("rows", &[33, 2], GgmlType::Q8_0),
            |p| matches!(p, TensorProblem::Row(RowError::PartialBlock { n: 33, .. })),
        ),
        (
            Builder::new().tensor("dims", &[1, 1, 1, 1, 1], GgmlType::F32),
            |p| *p == TensorProblem::Dims(5),
        ),
        (
            Builder::new().tensor("huge", &[1 << 32, 1 << 32], GgmlType::F32),
            |p| matches!(p, TensorProblem::Shape(_)),
        ),
        (
            // Negative in ggml's i64, hidden by a zero dimension.
            Builder::new().tensor("neg", &[0, 1 << 63], GgmlType::F32),
            |p| matches!(p, TensorProblem::Shape(_)),
        ),
        (
            Builder::new()
                .tensor("a", &[8], GgmlType::F32)
                .tensor("a", &[8], GgmlType::F32),
            |p| *p == TensorProblem::Duplicate,
        ),
    ];
    for (builder, expected) in cases {
        let b = builder.build();
        let (name, _, problem) = tensor_problem(parse(&b).unwrap_err());
        assert!(expected(&problem), "{name}: {problem:?}");
    }
    // Type ids are patched in: the builder cannot write an unknown type.
    let mut b = Builder::new().tensor("t", &[8], GgmlType::F32).build();
    let at = 24 + 9 + 4 + 8;
    b[at..at + 4].copy_from_slice(&4u32.to_le_bytes());
    let e = parse(&b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 't' at offset 24: unknown ggml type 4"
    );
}

#[test]
fn version_2_files_parse() {
    let mut builder = Builder::new().llama().tensor("w", &[32], GgmlType::Q4_0);
    builder.version = 2;
    let b = builder.build();
    let g = parse(&b).expect("parses");
    assert_eq!(g.version(), 2);
    assert_eq!(g.architecture(), Some("llama"));
}

#[test]
fn shape_reads_the_ledger_facts() {
    let b = Builder::new()
        .llama()
        .kv(
            "llama.attention.head_count_kv",
            9,
            array(5, 3, &[3i32, 6, -1].map(i32::to_le_bytes).concat()),
        )
        .kv(
            "tokenizer.ggml.tokens",
            9,
            array(8, 2, &[string("a"), string("b")].concat()),
        )
        .tensor("w", &[64], GgmlType::Q8_0)
        .build();
    let g = parse(&b).expect("parses");
    let s = ModelShape::from_gguf(&g).expect("shape");
    assert_eq!(s.architecture, "llama");
    assert_eq!((s.n_layer, s.n_embd, s.n_head), (30, 576, 9));
    assert_eq!(s.n_head_kv, 6, "the largest layer");
    assert_eq!((s.head_dim_k, s.head_dim_v), (64, 64));
    assert_eq!(s.n_ff, 4 * 576);
    assert_eq!(s.n_vocab, 2);
    assert_eq!(s.n_ctx_train, 0);
    assert_eq!(s.tensor_bytes, 68);
    assert_eq!(s.file_bytes, b.len() as u64);

    let b = Builder::new()
        .kv("general.architecture", 8, string("llama"))
        .build();
    assert_eq!(
        ModelShape::from_gguf(&parse(&b).expect("parses")).unwrap_err(),
        FormatError::MissingKey {
            key: "llama.block_count".into()
        }
    );
}

#[test]
fn read_shape_names_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("x.gguf");
    std::fs::write(&p, b"PK\x03\x04rest").expect("write");
    let e = read_shape(&p).unwrap_err();
    assert_eq!(
        e.format(),
        Some(&FormatError::NotGguf {
            magic: *b"PK\x03\x04"
        })
    );
    assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
    let e = read_shape(&dir.path().join("absent.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e:?}");
    let e = read_shape(dir.path()).unwrap_err();
    assert!(e.format().is_none(), "a directory is an I/O error: {e:?}");

    let ok = dir.path().join("ok.gguf");
    std::fs::write(&ok, Builder::new().llama().build()).expect("write");
    assert_eq!(read_shape(&ok).expect("shape").n_layer, 30);
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(matches!(
        read_shape(&empty).unwrap_err().format(),
        Some(FormatError::Truncated { what: "magic", .. })
    ));
}

/// A header with a vocabulary of `tokens` and the given end-of-text id.
fn with_vocab(tokens: &[&str], eos: u32) -> Vec<u8> {
    let items: Vec<u8> = tokens.iter().flat_map(|t| string(t)).collect();
    Builder::new()
        .llama()
        .kv("tokenizer.ggml.model", 8, string("gpt2"))
        .kv("tokenizer.ggml.eos_token_id", 4, eos.to_le_bytes())
        .kv(
            "tokenizer.ggml.tokens",
            9,
            array(8, tokens.len() as u64, &items),
        )
        .build()
}

#[test]
fn a_draft_vocabulary_must_match_id_for_id() {
    let model = with_vocab(&["<s>", "a", "b"], 0);
    let same = with_vocab(&["<s>", "a", "b"], 0);
    assert_eq!(
        same_vocab(&parse(&model).expect("model"), &parse(&same).expect("same")),
        Ok(())
    );
    let check = |other: Vec<u8>| {
        same_vocab(
            &parse(&model).expect("model"),
            &parse(&other).expect("other"),
        )
        .expect_err("differs")
    };
    assert_eq!(
        check(with_vocab(&["<s>", "a", "c"], 0)),
        VocabMismatch::Token {
            id: 2,
            ours: "b".into(),
            theirs: "c".into()
        }
    );
    assert_eq!(
        check(with_vocab(&["<s>", "a"], 0)),
        VocabMismatch::Size { ours: 3, theirs: 2 }
    );
    let eos = check(with_vocab(&["<s>", "a", "b"], 2));
    assert_eq!(
        eos.to_string(),
        "`tokenizer.ggml.eos_token_id` is 2 where the model has 0"
    );
    let none = Builder::new()
        .llama()
        .kv("tokenizer.ggml.model", 8, string("gpt2"));
    let none = none
        .kv("tokenizer.ggml.eos_token_id", 4, 0u32.to_le_bytes())
        .build();
    assert_eq!(check(none), VocabMismatch::NoTokens);
}
