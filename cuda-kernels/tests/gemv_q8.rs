//! The Q8_0 x Q8_0 decode GEMV (`q8_gemv_q8`): its twin against an f64 reference, every
//! ISA and thread count against the scalar twin bit for bit (extreme blocks included), and
//! the CUDA kernel against the twin bit for bit where a GPU (or the emulator) is present,
//! over odd shapes, 1 to 8 columns and every bias / accumulate combination.
//!
//! Tolerance: |y - ref| <= 1e-5 * (sum |w * x| + |bias| + |y0|). The longest chain of f32
//! roundings here is k/32/32 fmas per partial + 5 butterfly adds + 2 epilogue adds (< 20),
//! each at most 2^-24 of the running magnitude.

use half::f16;
use inferloop_kernels::cpu::gemv::ShapeError;
use inferloop_kernels::cpu::gemv_q8::{gemv_q8, gemv_q8_auto};
use inferloop_kernels::cpu::quantize::{quantize, Q8Act};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{row_bytes, Q8Matrix, BLOCK_BYTES, QK};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// (rows, k): rows a multiple of nothing, k one block, the default model's widths, one
/// block short of a warp's 32, exactly 32 (one column: every lane of a half warp takes
/// two blocks), past it, and Llama-3-8B's 4096.
const SHAPES: &[(usize, usize)] = &[
    (1, 32),
    (7, 576),
    (67, 1536),
    (33, 992),
    (10, 1024),
    (13, 1056),
    (19, 4096),
    // Five units, the last short: one column past the activations held in registers, and
    // from 4 columns on activations past what a block stages (read from global).
    (5, 4640),
];

/// Scales over two decades, quants over the whole int8 range (-128 included).
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

fn random_act(rng: &mut StdRng, ncols: usize, k: usize) -> Q8Act {
    quantize(Isa::Scalar, &random_vec(rng, ncols * k), k).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// The bias / accumulate combinations, with what `y` holds before the call.
fn epilogues(rng: &mut StdRng, rows: usize, n: usize) -> Vec<(Option<Vec<f32>>, bool, Vec<f32>)> {
    let bias = random_vec(rng, rows);
    let y0 = random_vec(rng, n);
    vec![
        (None, false, vec![f32::NAN; n]),
        (Some(bias.clone()), false, vec![f32::NAN; n]),
        (None, true, y0.clone()),
        (Some(bias), true, y0),
    ]
}

#[test]
fn gemv_q8_matches_the_f64_reference() {
    let mut rng = StdRng::seed_from_u64(0x9a01);
    for &(rows, k) in SHAPES {
        let bytes = random_matrix(&mut rng, rows, k);
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        for ncols in 1..=8 {
            let act = random_act(&mut rng, ncols, k);
            for (bias, acc, y0) in epilogues(&mut rng, rows, ncols * rows) {
                let mut y = y0.clone();
                gemv_q8_auto(2, &w, &act, bias.as_deref(), acc, &mut y).unwrap();
                for c in 0..ncols {
                    for r in 0..rows {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for (b, block) in w.row(r).chunks_exact(BLOCK_BYTES).enumerate() {
                            let dw = f64::from(f16::from_le_bytes([block[0], block[1]]).to_f32());
                            let dx = f64::from(act.d[c * k / QK + b]);
                            for (j, &q) in block[2..].iter().enumerate() {
                                let p = dw
                                    * f64::from(q as i8)
                                    * dx
                                    * f64::from(act.q[c * k + b * QK + j]);
                                want += p;
                                mag += p.abs();
                            }
                        }
                        let i = c * rows + r;
                        if let Some(b) = &bias {
                            want += f64::from(b[r]);
                            mag += f64::from(b[r]).abs();
                        }
                        if acc {
                            want += f64::from(y0[i]);
                            mag += f64::from(y0[i]).abs();
                        }
                        let err = (f64::from(y[i]) - want).abs();
                        assert!(
                            err <= 1e-5 * mag + 1e-30,
                            "{rows}x{k} ncols {ncols} bias {} acc {acc} [{c}][{r}]: {} vs {want}",
                            bias.is_some(),
                            y[i]
                        );
                    }
                }
            }
        }
    }
}

/// Every ISA and thread count against the scalar twin, bit for bit, on values random data
/// rarely hits: -128 and 127 quants, zero, -0, subnormal and huge scales, block
/// counts around the AVX2 path's groups of 8 and the 32 partials.
#[test]
fn gemv_q8_is_bit_identical_across_isas_and_threads() {
    let mut rng = StdRng::seed_from_u64(0x9a02);
    let scales = [0.0f32, -0.0, 1.0, -0.5, 6.0e-8, 3.0e-5, 0.0999, 65504.0];
    for (rows, k) in [
        (8, 32),
        (15, 256),
        (17, 288),
        (9, 576),
        (67, 1056),
        (5, 4096),
    ] {
        let mut bytes = Vec::with_capacity(rows * row_bytes(k));
        for i in 0..rows * k / QK {
            let d = if i % 3 == 0 {
                f16::from_f32(scales[rng.gen_range(0..scales.len())])
            } else {
                f16::from_f32(rng.gen_range(-1e-1f32..1e-1))
            };
            bytes.extend_from_slice(&d.to_le_bytes());
            let q: u8 = if i % 4 == 0 { 0x80 } else { rng.gen() };
            bytes.extend((0..QK).map(|j| if j % 5 == 0 { rng.gen() } else { q }));
        }
        let w = Q8Matrix::new(&bytes, rows, k).unwrap();
        for ncols in [1, 2, 5, 8, 11] {
            // -128 activations (which the quantizer never writes) with odd column counts
            // only: the others take the AVX2 path's byte products against -128 weights.
            let min = if ncols % 2 == 1 { -128 } else { -127 };
            let q: Vec<i8> = (0..ncols * k)
                .map(|i| {
                    if i % 7 == 0 {
                        min
                    } else {
                        rng.gen_range(-127..=127)
                    }
                })
                .collect();
            let d: Vec<f32> = (0..ncols * k / QK)
                .map(|i| {
                    if i % 4 == 0 {
                        scales[rng.gen_range(0..scales.len())]
                    } else {
                        f16::from_f32(rng.gen_range(-1e-1f32..1e-1)).to_f32()
                    }
                })
                .collect();
            let act = Q8Act::new(q, d, ncols, k).unwrap();
            for (bias, acc, y0) in epilogues(&mut rng, rows, ncols * rows) {
                let mut want = y0.clone();
                gemv_q8(Isa::Scalar, 1, &w, &act, bias.as_deref(), acc, &mut want).unwrap();
                for isa in Isa::available() {
                    for threads in [1, 2, 3] {
                        let mut y = y0.clone();
                        gemv_q8(isa, threads, &w, &act, bias.as_deref(), acc, &mut y).unwrap();
                        assert_eq!(
                            bits(&want),
                            bits(&y),
                            "{rows}x{k} ncols {ncols} {isa:?} threads {threads} acc {acc}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gemv_q8_shape_errors_are_errors() {
    let bytes = vec![0u8; 2 * row_bytes(64)];
    let w = Q8Matrix::new(&bytes, 2, 64).unwrap();
    let act = quantize(Isa::Scalar, &[0.5; 3 * 32], 32).unwrap();
    assert!(matches!(
        gemv_q8_auto(1, &w, &act, None, false, &mut [0.0; 6]),
        Err(ShapeError::Len {
            what: "an activation row",
            ..
        })
    ));
    let act = quantize(Isa::Scalar, &[0.5; 3 * 64], 64).unwrap();
    assert!(gemv_q8_auto(1, &w, &act, None, false, &mut [0.0; 5]).is_err());
    assert!(matches!(
        gemv_q8_auto(1, &w, &act, Some(&[0.0; 3]), false, &mut [0.0; 6]),
        Err(ShapeError::Len { what: "bias", .. })
    ));
    assert!(gemv_q8_auto(1, &w, &act, Some(&[0.0; 2]), true, &mut [0.0; 6]).is_ok());
}

mod gpu {
    use super::*;
    use inferloop_kernels::cuda::cudarc::driver::{CudaView, CudaViewMut};
    use inferloop_kernels::cuda::q8::{gemv_q8_into, Q8Error};
    use inferloop_kernels::cuda::test_gpu;

    #[test]
    fn gemv_q8_kernel_equals_its_twin() {
        let Some(gpu) = test_gpu() else { return };
        let st = &gpu.stream;
        let mut rng = StdRng::seed_from_u64(0x9a03);
        for &(rows, k) in SHAPES {
            let bytes = random_matrix(&mut rng, rows, k);
            let w = Q8Matrix::new(&bytes, rows, k).unwrap();
            let dw = inferloop_kernels::cuda::q8::upload_weights(st, &w).unwrap();
            for ncols in 1..=8 {
                let act = random_act(&mut rng, ncols, k);
                let (dq, dd) = (
                    st.clone_htod(&act.q).unwrap(),
                    st.clone_htod(&act.d).unwrap(),
                );
                for (bias, acc, y0) in epilogues(&mut rng, rows, ncols * rows) {
                    let db = bias.as_ref().map(|b| st.clone_htod(b).unwrap());
                    let mut dy = st.clone_htod(&y0).unwrap();
                    gemv_q8_into(
                        &gpu,
                        &dw,
                        rows,
                        k,
                        &dq.slice(..),
                        &dd.slice(..),
                        ncols,
                        db.as_ref().map(|b| b.slice(..)).as_ref(),
                        acc,
                        &mut dy.slice_mut(..),
                    )
                    .unwrap();
                    let got = st.clone_dtoh(&dy).unwrap();
                    let mut want = y0.clone();
                    gemv_q8_auto(2, &w, &act, bias.as_deref(), acc, &mut want).unwrap();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "gemv_q8 {rows}x{k} ncols {ncols} bias {} acc {acc}",
                        bias.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn gemv_q8_launch_refuses_bad_arguments_on_gpu() {
        let Some(gpu) = test_gpu() else { return };
        let st = &gpu.stream;
        let (rows, k) = (3, 64);
        let dw = st.alloc_zeros::<u8>(rows * row_bytes(k)).unwrap();
        let dq = st.alloc_zeros::<i8>(9 * k + 8).unwrap();
        let dd = st.alloc_zeros::<f32>(9 * k / QK).unwrap();
        let mut dy = st.alloc_zeros::<f32>(9 * rows).unwrap();
        let run = |dy: &mut CudaViewMut<f32>, q: &CudaView<i8>, d: &CudaView<f32>, n| {
            gemv_q8_into(&gpu, &dw, rows, k, q, d, n, None, false, dy)
        };
        assert!(matches!(
            run(
                &mut dy.slice_mut(..9 * rows),
                &dq.slice(..9 * k),
                &dd.slice(..),
                9
            ),
            Err(Q8Error::Cols(9))
        ));
        assert!(matches!(
            run(&mut dy.slice_mut(..0), &dq.slice(..0), &dd.slice(..0), 0),
            Err(Q8Error::Cols(0))
        ));
        assert!(matches!(
            run(
                &mut dy.slice_mut(..rows),
                &dq.slice(8..8 + k),
                &dd.slice(..k / QK),
                1
            ),
            Err(Q8Error::Misaligned { what: "x.q", .. })
        ));
        assert!(matches!(
            run(&mut dy.slice_mut(..rows), &dq.slice(..k), &dd.slice(..1), 1),
            Err(Q8Error::Shape(_))
        ));
        assert!(run(
            &mut dy.slice_mut(..rows),
            &dq.slice(..k),
            &dd.slice(..k / QK),
            1
        )
        .is_ok());
    }
}
