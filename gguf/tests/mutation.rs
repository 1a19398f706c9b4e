//! The real default model's header, opened as it is and then mutated at random: every
//! mutation must come back as `Ok` or `Err`, never a panic, and parsing must never allocate
//! more than the input's size (a counting global allocator watches).
//!
//! `INFERLOOP_TEST_MODEL` names the model (skipped with a reason when unset or missing);
//! `GGUF_MUTATIONS` sets the number of cases (10,000 by default; `make fuzz-gguf` runs
//! 1,000,000) and `GGUF_SEED` the seed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use inferloop_gguf::{FormatError, GgmlType, Gguf, GgufFile, ModelShape, TensorProblem, Value};

/// Counts the allocations of the thread that asked, so tests on other threads do not blur
/// the figures.
struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
}
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn tracking() -> bool {
    TRACKING.try_with(Cell::get).unwrap_or(false)
}

fn grew(by: isize, size: usize) {
    let live = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
}

// SAFETY: every call is passed to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if tracking() {
            grew(layout.size() as isize, layout.size());
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if tracking() {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if tracking() {
            grew(new_size as isize - layout.size() as isize, new_size);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live bytes and largest single allocation while `f` runs on this thread.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    LARGEST.store(0, Relaxed);
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (
        out,
        PEAK.load(Relaxed).max(0) as usize,
        LARGEST.load(Relaxed),
    )
}

fn model() -> Option<PathBuf> {
    let Some(path) = std::env::var_os("INFERLOOP_TEST_MODEL").map(PathBuf::from) else {
        eprintln!("skipped: INFERLOOP_TEST_MODEL is not set (make test sets it)");
        return None;
    };
    if !path.is_file() {
        eprintln!("skipped: {} does not exist (make model)", path.display());
        return None;
    }
    Some(path)
}

#[test]
fn real_model_opens_with_every_tensor_in_place() {
    let Some(path) = model() else { return };
    let g = GgufFile::open(&path).expect("the default model opens");
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.metadata_entries().count(), 33);
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset(), 1_785_664);

    let embd = g.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(embd.info.ggml_type(), GgmlType::Q8_0);
    assert_eq!(embd.info.dims(), [576, 49152]);
    assert_eq!(embd.info.n_bytes(), 49152 * 18 * 34);
    assert_eq!(embd.bytes.len() as u64, embd.info.n_bytes());
    assert_eq!(embd.info.row_bytes(), 18 * 34);
    let q = g.tensor("blk.0.attn_q.weight").expect("attn_q");
    assert_eq!(q.info.ggml_type(), GgmlType::Q4_1);
    assert_eq!(q.bytes.len(), 576 / 32 * 20 * 576);

    // Laid out in order, without overlaps, and ending inside the file.
    let mut end = g.data_offset() as usize;
    for t in g.tensors() {
        assert!(t.file_range().start >= end, "{} overlaps", t.name());
        end = t.file_range().end;
    }
    assert!(end as u64 <= g.file_len());

    assert_eq!(g.get_array_len("tokenizer.ggml.tokens"), Some(49152));
    let tokens = g.get_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.iter().nth(1), Some(Value::String("<|im_start|>")));
    assert_eq!(tokens.iter().count(), 49152);
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id"), Some(2));
    assert!(g.get_f32("llama.rope.freq_base").is_some());

    let shape = ModelShape::from_gguf(&g).expect("shape");
    assert_eq!(shape.tensor_bytes, 96_576_768, "llama.cpp's model size");
    assert_eq!(
        (shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv),
        (30, 576, 9, 3)
    );
    assert_eq!(
        (shape.n_vocab, shape.n_ctx_train, shape.n_ff),
        (49152, 8192, 1536)
    );
}

/// splitmix64: a seeded generator needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Offsets of the header's count, length and type fields, where a bad value does the most:
/// the entries' and tensors' own fields, then the ~100,000 string lengths inside arrays.
fn fields(b: &[u8]) -> (Vec<usize>, Vec<usize>) {
    let u64_at = |p: usize| {
        b.get(p..p + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_le_bytes) as usize
    };
    let u32_at = |p: usize| {
        b.get(p..p + 4)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let (mut top, mut inner) = (vec![8, 16], Vec::new());
    let (n_tensors, n_kv) = (u64_at(8), u64_at(16));
    let mut p = 24;
    // Walks the seed, which parses, so every step stays in bounds.
    for _ in 0..n_kv {
        top.push(p);
        p += 8 + u64_at(p);
        top.push(p);
        let ty = u32_at(p);
        p += 4;
        let mut stack = vec![(ty, 1usize)];
        let mut depth0 = true;
        while let Some((ty, left)) = stack.pop() {
            if left == 0 {
                continue;
            }
            stack.push((ty, left - 1));
            let out = if depth0 { &mut top } else { &mut inner };
            depth0 = false;
            match ty {
                8 => {
                    out.push(p);
                    p += 8 + u64_at(p);
                }
                9 => {
                    out.push(p);
                    out.push(p + 4);
                    stack.push((u32_at(p), u64_at(p + 4)));
                    p += 12;
                }
                0 | 1 | 7 => p += 1,
                2 | 3 => p += 2,
                4..=6 => p += 4,
                _ => p += 8,
            }
        }
    }
    for _ in 0..n_tensors {
        top.push(p);
        p += 8 + u64_at(p);
        let n_dims = u32_at(p) as usize;
        // n_dims, each dimension, the type, the offset.
        top.push(p);
        top.extend((0..n_dims).map(|i| p + 4 + 8 * i));
        top.push(p + 4 + 8 * n_dims);
        top.push(p + 8 + 8 * n_dims);
        p += 4 + 8 * n_dims + 4 + 8;
    }
    (top, inner)
}

/// The real header with every tensor shrunk to one row of one block and laid out anew, so
/// the seed parses `Ok` in under 2 MB and mutations also reach the tensor views.
fn shrunk_seed(g: &GgufFile) -> Vec<u8> {
    let data = g.data_offset() as usize;
    let mut b = g.bytes()[..data].to_vec();
    let mut offset = 0u64;
    for t in g.tensors() {
        let dims_at = t.header_offset() as usize + 8 + t.name().len() + 4;
        let n_dims = t.dims().len();
        for d in 0..n_dims {
            let v = if d == 0 {
                t.ggml_type().block_size()
            } else {
                1
            };
            b[dims_at + 8 * d..dims_at + 8 * d + 8].copy_from_slice(&v.to_le_bytes());
        }
        let offset_at = dims_at + 8 * n_dims + 4;
        b[offset_at..offset_at + 8].copy_from_slice(&offset.to_le_bytes());
        offset += t.ggml_type().type_size().div_ceil(32) * 32;
    }
    // Data bytes count: a pattern, not zeros, so flips in it change something.
    b.extend((0..offset).map(|i| (i * 37 % 251) as u8));
    b
}

const EXTREMES: [u64; 9] = [
    u64::MAX,
    1 << 60,
    1 << 32,
    u32::MAX as u64,
    i64::MAX as u64,
    1 << 63,
    0,
    0xFFFF_FFFF_0000_0000,
    0x8000_0000,
];

/// Applies one random mutation and says what it did.
fn mutate(
    b: &mut Vec<u8>,
    (top, inner): (&[usize], &[usize]),
    header_end: usize,
    rng: &mut Rng,
) -> String {
    // Most mutations land in the header, half of them near an entry's or a tensor's own
    // fields: the vocabulary is 99% of the header and the data is only checked for length.
    let at = |rng: &mut Rng, len: usize| {
        let p = match rng.below(8) {
            0 => rng.below(len),
            1..=3 => rng.below(header_end),
            _ => (top[rng.below(top.len())] + rng.below(32)).saturating_sub(16),
        };
        p.min(len.saturating_sub(1))
    };
    if b.is_empty() {
        return "nothing left to mutate".into();
    }
    match rng.below(7) {
        0 => {
            let p = at(rng, b.len());
            let bit = rng.below(8);
            if let Some(x) = b.get_mut(p) {
                *x ^= 1 << bit;
            }
            format!("flip bit {bit} at {p}")
        }
        1 | 2 => {
            let fields = if rng.below(2) == 0 { top } else { inner };
            let p = fields[rng.below(fields.len())];
            let v = EXTREMES[rng.below(EXTREMES.len())];
            let width = if rng.below(3) == 0 { 4 } else { 8 };
            let end = (p + width).min(b.len());
            if p < end {
                b[p..end].copy_from_slice(&v.to_le_bytes()[..end - p]);
            }
            format!("field at {p}: {width} bytes of {v:#x}")
        }
        3 => {
            let p = at(rng, b.len());
            let v = [0xFF, 0x00, 0x80, 0x7F][rng.below(4)];
            let n = 1 + rng.below(8);
            for x in b.iter_mut().skip(p).take(n) {
                *x = v;
            }
            format!("{n} bytes of {v:#x} at {p}")
        }
        4 => {
            let n = at(rng, b.len() + 1);
            b.truncate(n);
            format!("truncate to {n}")
        }
        5 => {
            let start = at(rng, b.len());
            let len = 1 + rng.below(256.min(b.len() - start));
            let to = at(rng, b.len());
            let copy = b[start..start + len].to_vec();
            b.splice(to..to, copy);
            format!("duplicate {start}..{} at {to}", start + len)
        }
        _ => {
            let start = at(rng, b.len());
            let len = 1 + rng.below(256.min(b.len() - start));
            b.drain(start..start + len);
            format!("remove {start}..{}", start + len)
        }
    }
}

/// Parses and reads everything a caller could: metadata (arrays walked), every tensor
/// view, the shape. Returns whether it parsed.
fn exercise(bytes: &[u8], walk_arrays: bool) -> Result<usize, FormatError> {
    let g = Gguf::from_bytes(bytes)?;
    let mut seen = 0;
    for (_, v) in g.metadata_entries() {
        if let (Value::Array(a), true) = (v, walk_arrays) {
            seen += a.iter().count();
        }
        seen += 1;
    }
    for t in g.tensors() {
        let view = g.tensor(t.name()).expect("every listed tensor has a view");
        assert_eq!(view.bytes.len() as u64, t.n_bytes());
        seen += view.bytes.len().min(1);
    }
    let _ = ModelShape::from_gguf(&g);
    Ok(seen)
}

/// Allocations beyond the input's size that parsing may make: error messages, small tables.
const SLACK: usize = 64 << 10;

#[test]
fn mutated_headers_never_panic_nor_overallocate() {
    let Some(path) = model() else { return };
    let cases: usize = std::env::var("GGUF_MUTATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("GGUF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6775_6666);
    let g = GgufFile::open(&path).expect("the default model opens");
    let header_end = g.data_offset() as usize;
    let valid = shrunk_seed(&g);
    exercise(&valid, true).expect("the shrunk seed parses");
    // The real bytes cut a little past the header: every tensor but none fits.
    let cut = g.bytes()[..header_end + 4096].to_vec();
    let e = exercise(&cut, true).expect_err("the cut seed lacks data");
    assert!(
        matches!(
            e,
            FormatError::Tensor {
                problem: TensorProblem::OutOfBounds { .. },
                ..
            }
        ),
        "{e}"
    );
    let (top, inner) = fields(&valid);
    assert_eq!(
        top.len(),
        2 + 33 * 2 + 11 + 4 * 2 + 272 * 4 + 61 + 2 * 211,
        "entry and tensor fields"
    );
    assert!(inner.len() > 90_000, "{} fields in arrays", inner.len());

    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut outcomes = std::collections::BTreeMap::new();
    let (mut worst_peak, mut worst_largest) = (0usize, 0usize);
    let mut buf = Vec::with_capacity(valid.len() + (64 << 10));
    for case in 0..cases {
        buf.clear();
        buf.extend_from_slice(if rng.below(4) == 0 { &cut } else { &valid });
        let n = 1 + rng.below(3);
        let what: Vec<String> = (0..n)
            .map(|_| mutate(&mut buf, (&top, &inner), header_end, &mut rng))
            .collect();
        let walk = case % 16 == 0;
        let run = catch_unwind(AssertUnwindSafe(|| {
            measured(|| exercise(&buf, walk).err().map(|e| e.kind()))
        }));
        let Ok((refused, peak, largest)) = run else {
            panic!("case {case} (seed {seed}) panicked: {}", what.join("; "));
        };
        *outcomes.entry(refused.unwrap_or("ok")).or_insert(0usize) += 1;
        assert!(
            largest <= buf.len() + SLACK && peak <= buf.len() + SLACK,
            "case {case} (seed {seed}): {} → largest allocation {largest} B, peak {peak} B for {} input bytes",
            what.join("; "),
            buf.len()
        );
        worst_peak = worst_peak.max(peak);
        worst_largest = worst_largest.max(largest);
    }
    eprintln!(
        "{cases} mutations (seed {seed}) in {:.1?}; peak {worst_peak} B, largest allocation \
         {worst_largest} B (inputs ~{} B); outcomes: {outcomes:?}",
        started.elapsed(),
        valid.len()
    );
}
