//! The Q8_0 linear twins (GEMV, activation quantization, GEMM) against an f64 reference on
//! seeded random data, every ISA this CPU has, one and several threads; then each CUDA
//! kernel against its twin, bit for bit, where a GPU is present.
//!
//! Tolerance on a dot product: |y - ref| <= 1e-5 * sum |w * x| (+ 1e-30). The f32 error of
//! either reduction is at most about (longest chain of roundings) * 2^-24 * sum |w * x|;
//! the longest chain here is < 60 roundings (k = 1536: 48 blocks), i.e. < 4e-6.

use half::f16;
use inferloop_kernels::cpu::gemm::{gemm, gemm_auto};
use inferloop_kernels::cpu::gemv::{gemv, gemv_auto, ShapeError};
use inferloop_kernels::cpu::quantize::{quantize, Q8Act};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{row_bytes, Q8Matrix, BLOCK_BYTES, QK};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REL_TOL: f64 = 1e-5;
const ABS_TOL: f64 = 1e-30;

/// Shapes (rows, k): the default model's, and odd ones that leave partial warps, GEMV
/// blocks, GEMM tiles and k tiles.
const SHAPES: &[(usize, usize)] = &[
    (576, 576),
    (1536, 576),
    (576, 1536),
    (1, 32),
    (7, 64),
    (67, 96),
    (130, 160),
];

/// A random Q8_0 matrix: scales over two decades, quants over the whole int8 range
/// (-128 included, which ggml never writes but a file may hold).
fn random_matrix(rng: &mut StdRng, rows: usize, k: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows * row_bytes(k));
    for _ in 0..rows * k / QK {
        let d = f16::from_f32(rng.gen_range(1e-3f32..1e-1));
        bytes.extend_from_slice(&d.to_le_bytes());
        bytes.extend((0..QK).map(|_| rng.gen::<u8>()));
    }
    bytes
}

fn random_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1f32..1.0) * rng.gen_range(0.1f32..4.0))
        .collect()
}

/// W dequantized exactly (in f64).
fn dequant_f64(w: &Q8Matrix) -> Vec<f64> {
    let mut out = Vec::with_capacity(w.rows * w.k);
    for block in w.bytes.chunks_exact(BLOCK_BYTES) {
        let d = f64::from(f16::from_le_bytes([block[0], block[1]]).to_f32());
        out.extend(block[2..].iter().map(|&q| d * f64::from(q as i8)));
    }
    out
}

/// ref[c][r] = sum W[r] x[c] in f64, with sum |w x| for the bound.
fn reference(wd: &[f64], rows: usize, k: usize, x: &[f64], ncols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; ncols * rows];
    let mut mag = vec![0.0; ncols * rows];
    for c in 0..ncols {
        let xc = &x[c * k..(c + 1) * k];
        for r in 0..rows {
            let wr = &wd[r * k..(r + 1) * k];
            y[c * rows + r] = wr.iter().zip(xc).map(|(a, b)| a * b).sum();
            mag[c * rows + r] = wr.iter().zip(xc).map(|(a, b)| (a * b).abs()).sum();
        }
    }
    (y, mag)
}

fn assert_close(what: &str, got: &[f32], want: &[f64], mag: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= REL_TOL * m + ABS_TOL,
            "{what}[{i}]: {g} vs {w} (err {err:e}, bound {:e})",
            REL_TOL * m
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn gemv_matches_the_f64_reference_on_every_isa_and_thread_count() {
    let mut rng = StdRng::seed_from_u64(0x5e11);
    for &(rows, k) in SHAPES {
        let bytes = random_matrix(&mut rng, rows, k);
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        let wd = dequant_f64(&w);
        // 8 columns of data; ncols = n uses the first n (the layout is column after column).
        let x = random_vec(&mut rng, 11 * k);
        let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let (want, mag) = reference(&wd, rows, k, &x64, 11);
        for ncols in (1..=8).chain([11]) {
            let mut first: Option<Vec<f32>> = None;
            for isa in Isa::available() {
                for threads in [1, 3] {
                    let mut y = vec![f32::NAN; ncols * rows];
                    gemv(isa, threads, &w, &x[..ncols * k], ncols, &mut y).unwrap();
                    let what = format!("gemv {rows}x{k} ncols {ncols} {isa:?} threads {threads}");
                    assert_close(&what, &y, &want[..ncols * rows], &mag[..ncols * rows]);
                    // Same order everywhere: identical bits, whatever the ISA or threads.
                    match &first {
                        None => first = Some(y),
                        Some(f) => {
                            assert_eq!(bits(f), bits(&y), "{what}: differs from the first run")
                        }
                    }
                }
            }
        }
    }
}

/// Rows long enough for the AVX2 path's k tiles (k > 6144), with a last tile off a multiple
/// of 4 blocks and row counts off its panels of 16: every ISA and thread count equals the
/// scalar twin bit for bit, and the f64 reference within the bound.
#[test]
fn gemv_long_rows_are_bit_identical_across_isas() {
    let mut rng = StdRng::seed_from_u64(0x5e12);
    for (rows, k) in [(37, 14336), (17, 6176), (3, 8224), (16, 6144)] {
        let bytes = random_matrix(&mut rng, rows, k);
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        let x = random_vec(&mut rng, 2 * k);
        let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let (want, mag) = reference(&dequant_f64(&w), rows, k, &x64, 2);
        for ncols in [1, 2] {
            let mut first = vec![f32::NAN; ncols * rows];
            gemv(Isa::Scalar, 1, &w, &x[..ncols * k], ncols, &mut first).unwrap();
            for isa in Isa::available() {
                for threads in [1, 2, 3] {
                    let mut y = vec![f32::NAN; ncols * rows];
                    gemv(isa, threads, &w, &x[..ncols * k], ncols, &mut y).unwrap();
                    let what = format!("gemv {rows}x{k} ncols {ncols} {isa:?} threads {threads}");
                    assert_close(&what, &y, &want[..ncols * rows], &mag[..ncols * rows]);
                    assert_eq!(bits(&first), bits(&y), "{what}: differs from scalar");
                }
            }
        }
    }
}

#[test]
fn gemv_columns_are_independent_of_their_neighbours() {
    // Column c of an ncols call equals a single-column call on x[c]: the kernel's passes
    // and its per-column registers never mix columns.
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, k) = (67, 96);
    let bytes = random_matrix(&mut rng, rows, k);
    let w = Q8Matrix::new(&bytes, rows, k).unwrap();
    let x = random_vec(&mut rng, 11 * k);
    let mut all = vec![0.0; 11 * rows];
    gemv_auto(2, &w, &x, 11, &mut all).unwrap();
    for c in 0..11 {
        let mut one = vec![0.0; rows];
        gemv_auto(1, &w, &x[c * k..(c + 1) * k], 1, &mut one).unwrap();
        assert_eq!(
            bits(&one),
            bits(&all[c * rows..(c + 1) * rows]),
            "column {c}"
        );
    }
}

#[test]
fn gemv_shape_errors_are_errors() {
    let bytes = vec![0u8; 2 * row_bytes(64)];
    let w = Q8Matrix::new(&bytes, 2, 64).unwrap();
    let mut y = vec![0.0; 4];
    assert_eq!(
        gemv(Isa::Scalar, 1, &w, &[0.0; 64], 2, &mut y),
        Err(ShapeError::Len {
            what: "x",
            expected: 128,
            got: 64
        })
    );
    assert!(gemv(Isa::detect(), 4, &w, &[0.0; 128], 2, &mut y[..3]).is_err());
    assert!(gemv(Isa::detect(), 4, &w, &[0.0; 128], 2, &mut y).is_ok());
    assert!(gemv(Isa::detect(), 4, &w, &[], 0, &mut []).is_ok());
}

#[test]
fn quantize_round_trips_within_half_a_step_on_every_isa() {
    let mut rng = StdRng::seed_from_u64(0x0a11);
    let k = 576;
    let mut x = random_vec(&mut rng, 5 * k);
    x[32..64].fill(0.0); // an all-zero block: scale 0, quants 0
    x[100] = -7.5; // a block whose amax is negative
    let reference = quantize(Isa::Scalar, &x, k).unwrap();
    assert_eq!(
        (reference.rows, reference.k, reference.d.len()),
        (5, k, 5 * k / QK)
    );
    assert!(reference.d[1] == 0.0 && reference.q[32..64].iter().all(|&q| q == 0));
    assert_eq!(reference.q[100], -127);
    for isa in Isa::available() {
        let a = quantize(isa, &x, k).unwrap();
        assert_eq!(a.q, reference.q, "{isa:?} quants");
        assert_eq!(bits(&a.d), bits(&reference.d), "{isa:?} scales");
    }
    let y = reference.dequantize();
    for (b, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate() {
        let amax = xb.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        // The scale is stored as f16 (ggml's block_q8_0); the quants used the exact one.
        let d = half::f16::from_f32(amax as f32 / 127.0).to_f32();
        assert_eq!(f64::from(reference.d[b]), f64::from(d));
        let step = amax / 127.0;
        // Half a step from rounding the quant, plus up to 127 quants times the scale's
        // f16 rounding (at most 2^-11 of it).
        let bound = step * (0.5 + 127.0 * 2f64.powi(-11)) * (1.0 + 1e-5) + 1e-30;
        for (a, q) in xb.iter().zip(yb) {
            let err = (f64::from(*a) - f64::from(*q)).abs();
            assert!(err <= bound, "block {b}: {a} -> {q}");
        }
    }
    assert!(reference.q.iter().all(|&q| q != -128));
    assert!(quantize(Isa::Scalar, &x[..k - 1], k).is_err());
    assert!(quantize(Isa::Scalar, &x, 48).is_err());
}

/// Random activations for `tokens` tokens, quantized by the scalar twin.
fn random_act(rng: &mut StdRng, tokens: usize, k: usize) -> Q8Act {
    quantize(Isa::Scalar, &random_vec(rng, tokens * k), k).unwrap()
}

#[test]
fn gemm_matches_the_f64_reference_on_every_isa_and_thread_count() {
    let mut rng = StdRng::seed_from_u64(0x6e33);
    for &(rows, k) in SHAPES {
        let bytes = random_matrix(&mut rng, rows, k);
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        let wd = dequant_f64(&w);
        // 1 to 9: decode and small batches (the AVX2 row-group path and its edge); 16, 37:
        // prefill.
        for tokens in [1, 2, 3, 4, 5, 8, 9, 16, 37] {
            let act = random_act(&mut rng, tokens, k);
            // The reference sees exactly the quantized activations: any difference is the
            // kernel's own f32 rounding.
            let x64: Vec<f64> = act
                .q
                .chunks_exact(QK)
                .zip(&act.d)
                .flat_map(|(q, &d)| q.iter().map(move |&v| f64::from(d) * f64::from(v)))
                .collect();
            let (want, mag) = reference(&wd, rows, k, &x64, tokens);
            let mut first: Option<Vec<f32>> = None;
            for isa in Isa::available() {
                for threads in [1, 3] {
                    let mut y = vec![f32::NAN; tokens * rows];
                    gemm(isa, threads, &w, &act, &mut y).unwrap();
                    let what = format!("gemm {rows}x{k} tokens {tokens} {isa:?} threads {threads}");
                    assert_close(&what, &y, &want, &mag);
                    match &first {
                        None => first = Some(y),
                        Some(f) => {
                            assert_eq!(bits(f), bits(&y), "{what}: differs from the first run")
                        }
                    }
                }
            }
        }
    }
}

/// Every ISA and thread count against the scalar twin, bit for bit, on the values random
/// data rarely hits: quants of -128 on both sides (ggml never writes them, a file or a
/// caller may), every row and block at full scale, zero, negative, -0 and subnormal f16
/// scales, and row counts around the AVX2 path's groups of 8.
#[test]
fn gemm_is_bit_identical_across_isas_on_extreme_blocks() {
    let mut rng = StdRng::seed_from_u64(0x6e34);
    let scales = [0.0f32, -0.0, 1.0, -0.5, 6.0e-8, 3.0e-5, 0.0999, 65504.0];
    for (rows, k) in [(8, 32), (15, 64), (16, 96), (17, 576), (67, 160)] {
        let mut bytes = Vec::with_capacity(rows * row_bytes(k));
        for i in 0..rows * k / QK {
            let d = if i % 3 == 0 {
                f16::from_f32(scales[rng.gen_range(0..scales.len())])
            } else {
                f16::from_f32(rng.gen_range(-1e-1f32..1e-1))
            };
            bytes.extend_from_slice(&d.to_le_bytes());
            let q: u8 = match i % 4 {
                0 => 0x80,
                1 => 0x7f,
                _ => rng.gen(),
            };
            bytes.extend((0..QK).map(|j| if j % 5 == 0 { rng.gen() } else { q }));
        }
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        for tokens in 1..=9 {
            let q: Vec<i8> = (0..tokens * k)
                .map(|i| match i % 7 {
                    0 => -128,
                    1 => 127,
                    _ => rng.gen(),
                })
                .collect();
            let d: Vec<f32> = (0..tokens * k / QK)
                .map(|i| {
                    if i % 4 == 0 {
                        scales[rng.gen_range(0..scales.len())]
                    } else {
                        f16::from_f32(rng.gen_range(-1e-1f32..1e-1)).to_f32()
                    }
                })
                .collect();
            let act = Q8Act::new(q, d, tokens, k).unwrap();
            let mut want = vec![f32::NAN; tokens * rows];
            gemm(Isa::Scalar, 1, &w, &act, &mut want).unwrap();
            for isa in Isa::available() {
                for threads in [1, 2, 3] {
                    let mut y = vec![f32::NAN; tokens * rows];
                    gemm(isa, threads, &w, &act, &mut y).unwrap();
                    assert_eq!(
                        bits(&want),
                        bits(&y),
                        "gemm {rows}x{k} tokens {tokens} {isa:?} threads {threads}"
                    );
                }
            }
        }
    }
}

#[test]
fn gemm_shape_errors_are_errors() {
    let bytes = vec![0u8; 2 * row_bytes(64)];
    let w = Q8Matrix::new(&bytes, 2, 64).unwrap();
    let act = quantize(Isa::Scalar, &[0.5; 3 * 32], 32).unwrap();
    assert!(matches!(
        gemm_auto(1, &w, &act, &mut [0.0; 6]),
        Err(ShapeError::Len {
            what: "an activation row",
            ..
        })
    ));
    let act = quantize(Isa::Scalar, &[0.5; 3 * 64], 64).unwrap();
    assert!(gemm_auto(1, &w, &act, &mut [0.0; 5]).is_err());
    assert!(gemm_auto(1, &w, &act, &mut [0.0; 6]).is_ok());
    assert!(Q8Act::new(vec![0; 64], vec![0.0; 1], 1, 64).is_err());
}

mod gpu {
    use super::*;
    use inferloop_kernels::cuda::q8;
    use inferloop_kernels::cuda::test_gpu;

    #[test]
    fn gemv_kernel_equals_its_twin() {
        let Some(gpu) = test_gpu() else { return };
        let mut rng = StdRng::seed_from_u64(0x9e1);
        for &(rows, k) in SHAPES {
            let bytes = random_matrix(&mut rng, rows, k);
            let w = Q8Matrix::new(&bytes, rows, k).unwrap();
            let x = random_vec(&mut rng, 11 * k);
            let dw = q8::upload_weights(&gpu.stream, &w).unwrap();
            for ncols in (1..=8).chain([11]) {
                let dx = gpu.stream.clone_htod(&x[..ncols * k]).unwrap();
                let dy = q8::gemv(&gpu, &dw, rows, k, &dx, ncols).unwrap();
                let got = gpu.stream.clone_dtoh(&dy).unwrap();
                let mut want = vec![0.0; ncols * rows];
                gemv_auto(2, &w, &x[..ncols * k], ncols, &mut want).unwrap();
                assert_eq!(bits(&got), bits(&want), "gemv {rows}x{k} ncols {ncols}");
            }
        }
    }

    #[test]
    fn quantize_and_gemm_kernels_equal_their_twins() {
        let Some(gpu) = test_gpu() else { return };
        let mut rng = StdRng::seed_from_u64(0x9e2);
        for &(rows, k) in SHAPES {
            let bytes = random_matrix(&mut rng, rows, k);
            let w = Q8Matrix::new(&bytes, rows, k).unwrap();
            let dw = q8::upload_weights(&gpu.stream, &w).unwrap();
            for tokens in [16, 37, 130] {
                let x = random_vec(&mut rng, tokens * k);
                let dx = gpu.stream.clone_htod(&x).unwrap();
                let dact = q8::quantize(&gpu, &dx, tokens, k).unwrap();
                let act = Q8Act::new(
                    gpu.stream.clone_dtoh(&dact.q).unwrap(),
                    gpu.stream.clone_dtoh(&dact.d).unwrap(),
                    tokens,
                    k,
                )
                .unwrap();
                let want_act = quantize(Isa::detect(), &x, k).unwrap();
                assert_eq!(act.q, want_act.q, "quantize {tokens}x{k}: quants");
                assert_eq!(
                    bits(&act.d),
                    bits(&want_act.d),
                    "quantize {tokens}x{k}: scales"
                );

                let dy = q8::gemm(&gpu, &dw, rows, k, &dact).unwrap();
                let got = gpu.stream.clone_dtoh(&dy).unwrap();
                let mut want = vec![0.0; tokens * rows];
                gemm_auto(2, &w, &act, &mut want).unwrap();
                assert_eq!(bits(&got), bits(&want), "gemm {rows}x{k} tokens {tokens}");
            }
        }
    }
}
