//! Worker threads for the twins: one rayon pool per thread count, built once, so that a
//! forward pass of a few hundred matmuls does not spawn threads for every one of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;
use rayon::ThreadPool;

/// The pool of `threads` workers, built on first use (`None` if the OS refuses threads).
fn pool(threads: usize) -> Option<Arc<ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Some(p.clone());
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("twin-{i}"))
        .build()
        .ok()?;
    let p = Arc::new(built);
    pools.insert(threads, p.clone());
    Some(p)
}

/// Splits rows `0..rows` of every column of `y` (consecutive columns of `rows` values) into
/// `threads` ranges and runs `f(first_row, pieces)` for each, in parallel. Each range is
/// computed by one call, so results do not depend on the thread count or scheduling.
pub(crate) fn split_rows<F>(threads: usize, rows: usize, y: &mut [f32], f: F)
where
    F: Fn(usize, Vec<&mut [f32]>) + Sync,
{
    if rows == 0 {
        return;
    }
    let threads = threads.clamp(1, rows);
    let chunk = rows.div_ceil(threads);
    let mut parts: Vec<Vec<&mut [f32]>> = (0..threads).map(|_| Vec::new()).collect();
    for col in y.chunks_mut(rows) {
        for (t, piece) in col.chunks_mut(chunk).enumerate() {
            parts[t].push(piece);
        }
    }
    parts.retain(|p| !p.is_empty());
    if parts.len() == 1 {
        if let Some(cols) = parts.pop() {
            f(0, cols);
        }
        return;
    }
    let run = |(t, cols): (usize, Vec<&mut [f32]>)| f(t * chunk, cols);
    match pool(threads) {
        Some(p) => p.install(|| parts.into_par_iter().enumerate().for_each(run)),
        None => std::thread::scope(|s| {
            for part in parts.into_iter().enumerate() {
                let run = &run;
                s.spawn(move || run(part));
            }
        }),
    }
}
