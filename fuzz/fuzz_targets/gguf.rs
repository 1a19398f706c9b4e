//! Any bytes as a GGUF file through the reader everything else trusts: the header, every
//! metadata value (arrays walked, nested ones too), every tensor's view and the model
//! shape. It must answer `Ok` or `Err`, never panic, and never allocate more than the
//! input's size plus a little (a counting allocator watches, as in `gguf/tests/mutation.rs`,
//! whose seeded mutations of the real header `make fuzz-gguf` still runs).

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use inferloop_gguf::{Gguf, ModelShape, Value};
use libfuzzer_sys::fuzz_target;

/// Allocations beyond the input's size that parsing may make: error messages, small tables
/// (the mutation test's bound).
const SLACK: isize = 64 << 10;

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
}
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn tracking() -> bool {
    TRACKING.try_with(Cell::get).unwrap_or(false)
}

fn grew(by: isize) {
    let live = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(live, Relaxed);
}

// SAFETY: every call goes to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if tracking() {
            grew(layout.size() as isize);
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
            grew(new_size as isize - layout.size() as isize);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fuzz_target!(|bytes: &[u8]| {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    TRACKING.with(|t| t.set(true));
    exercise(bytes);
    TRACKING.with(|t| t.set(false));
    let peak = PEAK.load(Relaxed);
    assert!(
        peak <= bytes.len() as isize + SLACK,
        "{peak} bytes allocated at peak for {} input bytes",
        bytes.len()
    );
});

/// Reads everything a caller could.
fn exercise(bytes: &[u8]) {
    let Ok(g) = Gguf::from_bytes(bytes) else {
        return;
    };
    // A file without tensors may end before its aligned data section starts.
    let _ = (
        g.version(),
        g.alignment(),
        g.architecture(),
        g.data_offset(),
    );
    for (key, v) in g.metadata_entries() {
        assert!(g.metadata(key).is_some(), "{key} is found by name");
        walk(v);
    }
    for t in g.tensors() {
        let view = g.tensor(t.name()).expect("every listed tensor has a view");
        assert_eq!(view.bytes.len() as u64, t.n_bytes());
        let range = t.file_range();
        assert!(range.start <= range.end && range.end <= bytes.len());
        let _ = (t.dims(), t.row_bytes(), t.n_elements());
    }
    let _ = ModelShape::from_gguf(&g);
}

fn walk(v: Value<'_>) {
    if let Value::Array(a) = v {
        for item in a.iter() {
            walk(item);
        }
    }
}
