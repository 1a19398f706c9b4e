//! Worker threads for the twins: one rayon pool per thread count, built once, so that a
//! forward pass of a few hundred matmuls does not spawn threads for every one of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Pieces per thread when there are several: on a box whose cores other processes also use,
/// a worker that loses its core leaves its later pieces to the others (rayon steals them)
/// instead of holding the whole call back by its static share.
const PIECES_PER_THREAD: usize = 4;

/// Splits rows `0..rows` of every column of `y` (consecutive columns of `rows` values) into
/// pieces and runs `f(first_row, pieces)` for each, in parallel on `threads` workers. With
/// more than one thread there are up to `threads * PIECES_PER_THREAD` pieces, each a
/// multiple of `align` rows (but the last) and at least `min_rows` long. Which rows share a
/// piece, and which worker runs it, must not change a result: `f` computes every row on its
/// own (the GEMV and GEMM twins do).
pub(crate) fn split_rows<F>(
    threads: usize,
    rows: usize,
    align: usize,
    min_rows: usize,
    y: &mut [f32],
    f: F,
) where
    F: Fn(usize, Vec<&mut [f32]>) + Sync,
{
    if rows == 0 {
        return;
    }
    let threads = threads.clamp(1, rows);
    let pieces = if threads == 1 {
        1
    } else {
        threads * PIECES_PER_THREAD
    };
    let chunk = rows
        .div_ceil(pieces)
        .max(min_rows)
        .next_multiple_of(align.max(1))
        .min(rows);
    let mut parts: Vec<Vec<&mut [f32]>> = (0..rows.div_ceil(chunk)).map(|_| Vec::new()).collect();
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
        // One job per piece (`with_max_len(1)`), so an idle worker can take any of them.
        Some(p) => p.install(|| {
            parts
                .into_par_iter()
                .enumerate()
                .with_max_len(1)
                .for_each(run)
        }),
        None => {
            // No pool: scoped threads take the pieces in turn from a shared counter.
            let next = AtomicUsize::new(0);
            let parts: Vec<Mutex<Option<Vec<&mut [f32]>>>> =
                parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
            let work = || loop {
                let t = next.fetch_add(1, Ordering::Relaxed);
                let Some(part) = parts.get(t) else { break };
                let cols = part.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(cols) = cols {
                    run((t, cols));
                }
            };
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(work);
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_every_column_is_handed_out_once_at_its_index() {
        let cases = [
            (1, 10, 1, 0),
            (2, 576, 8, 26),
            (3, 67, 8, 0),
            (2, 7, 8, 0),
            (4, 1000, 1, 3),
            (2, 49152, 8, 26),
            (8, 3, 1, 0),
        ];
        for (threads, rows, align, min_rows) in cases {
            let ncols = 3;
            let mut y = vec![-1f32; rows * ncols];
            let firsts = Mutex::new(Vec::new());
            split_rows(threads, rows, align, min_rows, &mut y, |r0, cols| {
                assert_eq!(cols.len(), ncols);
                firsts.lock().unwrap().push((r0, cols[0].len()));
                for (c, col) in cols.into_iter().enumerate() {
                    for (i, v) in col.iter_mut().enumerate() {
                        assert_eq!(*v, -1.0, "row {} handed out twice", r0 + i);
                        *v = (c * rows + r0 + i) as f32;
                    }
                }
            });
            let what = format!("threads {threads} rows {rows} align {align} min {min_rows}");
            assert!(y.iter().enumerate().all(|(i, &v)| v == i as f32), "{what}");
            let mut pieces = firsts.into_inner().unwrap();
            pieces.sort();
            assert!(
                pieces.len() <= (threads * PIECES_PER_THREAD).max(1),
                "{what}"
            );
            for (r0, n) in &pieces[..pieces.len() - 1] {
                assert!(
                    r0 % align == 0 && n % align == 0 && *n >= min_rows,
                    "{what}"
                );
            }
        }
    }
}
