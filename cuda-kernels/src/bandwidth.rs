//! The ceilings a kernel's throughput is read against, measured in the same run: a plain
//! streaming copy and a streaming read on the CPU (device-to-device copy on the GPU lives
//! with the CUDA code). Copy bandwidth counts bytes read plus bytes written, as STREAM and
//! CUDA's bandwidth tests do; read bandwidth counts bytes read.

use std::hint::black_box;
use std::time::Instant;

/// Best-of-`reps` copy bandwidth in GB/s (10^9 B/s) over `bytes`, split across `threads`.
pub fn cpu_copy_gbps(bytes: usize, threads: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let chunk = bytes.div_ceil(threads.max(1));
    best(reps, 2 * bytes, || {
        std::thread::scope(|s| {
            for (d, src) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(src));
            }
        });
        black_box(&dst);
    })
}

/// Best-of-`reps` read bandwidth in GB/s over `bytes`, split across `threads`.
pub fn cpu_read_gbps(bytes: usize, threads: usize, reps: usize) -> f64 {
    let words = vec![1u64; bytes / 8];
    let chunk = words.len().div_ceil(threads.max(1));
    best(reps, words.len() * 8, || {
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = words
                .chunks(chunk)
                .map(|c| s.spawn(move || sum(c)))
                .collect();
            parts.into_iter().map(|p| p.join().unwrap_or(0)).sum()
        });
        black_box(total);
    })
}

/// Eight independent sums so the loop is bound by loads, not by one add chain.
fn sum(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = words.chunks_exact(8);
    for b in &mut blocks {
        for (a, w) in acc.iter_mut().zip(b) {
            *a = a.wrapping_add(*w);
        }
    }
    let tail: u64 = blocks.remainder().iter().fold(0, |a, w| a.wrapping_add(*w));
    acc.iter().fold(tail, |a, w| a.wrapping_add(*w))
}

fn best(reps: usize, bytes: usize, mut run: impl FnMut()) -> f64 {
    run(); // warm-up: first touch of the pages
    let mut fastest = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run();
        fastest = fastest.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / fastest / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_are_measured_and_plausible() {
        // 16 MiB: beyond most L2 caches, quick enough for a unit test.
        let copy = cpu_copy_gbps(16 << 20, 2, 3);
        let read = cpu_read_gbps(16 << 20, 2, 3);
        for v in [copy, read] {
            assert!(v.is_finite() && v > 0.1 && v < 10_000.0, "{v} GB/s");
        }
    }

    #[test]
    fn the_read_sum_adds_every_word() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(sum(&words), 231);
    }
}
