//! The non-matmul ops: each CPU twin, on every ISA this CPU runs, against an f64 reference
//! written here (tolerances stated per test), the ISAs against each other bit for bit, the
//! split attention against the unsplit one, and, when a GPU is present, each CUDA kernel
//! against its twin bit for bit (they compute the same correctly rounded operations in the
//! same order). Shapes: SmolLM2-135M (n_embd 576, 9 q heads, 3 kv heads, head_dim 64, rope
//! base 100000) and a Llama-3-8B-like attention (32 q heads, 8 kv heads, head_dim 128).

use half::f16;
use inferloop_kernels::cpu::attention::{attention_decode, AttnShape, CHUNK};
use inferloop_kernels::cpu::elementwise::{add, kv_store_f16, silu_mul};
use inferloop_kernels::cpu::embed::embed;
use inferloop_kernels::cpu::rmsnorm::rmsnorm;
use inferloop_kernels::cpu::rope::{rope_inplace, Rope, RopeMode};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::cpu::softmax::softmax_inplace;
use inferloop_kernels::cpu::vector::ShapeError;
use inferloop_kernels::q8::{quantize_row, Q8Matrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const N_EMBD: usize = 576;
const SMOL: (usize, usize, usize) = (9, 3, 64);
const LLAMA: (usize, usize, usize) = (32, 8, 128);

fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn f16_bits(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
        .collect()
}

fn h(b: u16) -> f64 {
    f16::from_bits(b).to_f64()
}

/// Every `|got - want| <= rel * |want| + abs`.
fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= rel * w.abs() + abs,
            "{what}[{i}]: {g} vs {w} (error {err:e}, allowed {:e})",
            rel * w.abs() + abs
        );
        if err > worst.0 {
            worst = (err, i);
        }
    }
    eprintln!("{what}: worst error {:e} at {}", worst.0, worst.1);
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let diff = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    if diff > 0 {
        let (i, (a, b)) = got
            .iter()
            .zip(want)
            .enumerate()
            .find(|(_, (a, b))| a.to_bits() != b.to_bits())
            .unwrap();
        let ulps = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs())
            .max()
            .unwrap_or(0);
        panic!("{what}: {diff} values differ, first [{i}] {a} vs {b}; at most {ulps} ulps apart");
    }
}

// ---------- f64 references ----------

fn ref_rmsnorm(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|r| {
            let ms = r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / r.len() as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &g)| v as f64 * inv * g as f64)
        })
        .collect()
}

fn ref_softmax(x: &[f32], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let m = r.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let e: Vec<f64> = r.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

fn ref_rope(rope: &Rope, x: &[f32], pos: &[i32]) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = rope.rot_dims / 2;
    let tok = rope.n_head * rope.head_dim;
    for (t, &p) in pos.iter().enumerate() {
        for i in 0..half {
            let a =
                p as f64 * (rope.theta_base as f64).powf(-2.0 * i as f64 / rope.rot_dims as f64);
            let (s, c) = a.sin_cos();
            let (i0, i1) = match rope.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            for hd in 0..rope.n_head {
                let b = t * tok + hd * rope.head_dim;
                let (x0, x1) = (y[b + i0], y[b + i1]);
                y[b + i0] = x0 * c - x1 * s;
                y[b + i1] = x0 * s + x1 * c;
            }
        }
    }
    y
}

fn ref_attention(shape: &AttnShape, q: &[f32], k: &[u16], v: &[u16], kv_len: &[usize]) -> Vec<f64> {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let mut out = vec![0f64; shape.q_len()];
    for s in 0..shape.n_seq {
        for hq in 0..shape.n_head {
            let qh = &q[(s * shape.n_head + hq) * hd..][..hd];
            let at = |p: usize| ((s * shape.n_ctx + p) * shape.n_head_kv + hq / group) * hd;
            let n = kv_len[s];
            if n == 0 {
                continue;
            }
            let sc: Vec<f64> = (0..n)
                .map(|p| {
                    let kp = &k[at(p)..][..hd];
                    qh.iter()
                        .zip(kp)
                        .map(|(&a, &b)| a as f64 * h(b))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = sc.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f64> = sc.iter().map(|&x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[(s * shape.n_head + hq) * hd..][..hd];
            for (p, &ep) in e.iter().enumerate() {
                for (d, od) in o.iter_mut().enumerate() {
                    *od += ep / sum * h(v[at(p) + d]);
                }
            }
        }
    }
    out
}

// ---------- twins against the references ----------

#[test]
fn rmsnorm_twin_matches_f64_within_1e_5_relative() {
    let mut rng = StdRng::seed_from_u64(1);
    let x = uniform(&mut rng, 3 * N_EMBD, -4.0, 4.0);
    let w = uniform(&mut rng, N_EMBD, 0.5, 1.5);
    let want = ref_rmsnorm(&x, &w, 1e-5);
    let mut scalar = vec![0f32; x.len()];
    rmsnorm(Isa::Scalar, &x, &w, 1e-5, &mut scalar).unwrap();
    for isa in Isa::available() {
        let mut y = vec![0f32; x.len()];
        rmsnorm(isa, &x, &w, 1e-5, &mut y).unwrap();
        assert_close(&format!("rmsnorm {isa:?}"), &y, &want, 1e-5, 1e-6);
        assert_bits(&format!("rmsnorm {isa:?} vs scalar"), &y, &scalar);
    }
    let mut y = vec![0f32; 10];
    assert!(matches!(
        rmsnorm(Isa::Scalar, &x[..10], &w, 1e-5, &mut y),
        Err(ShapeError::NotMultiple { .. })
    ));
}

#[test]
fn softmax_twin_matches_f64_within_2e_6_relative() {
    let mut rng = StdRng::seed_from_u64(2);
    for n in [1, 37, N_EMBD, 2048] {
        let x = uniform(&mut rng, 2 * n, -12.0, 12.0);
        let want = ref_softmax(&x, n);
        let mut scalar = x.clone();
        softmax_inplace(Isa::Scalar, &mut scalar, n).unwrap();
        for isa in Isa::available() {
            let mut y = x.clone();
            softmax_inplace(isa, &mut y, n).unwrap();
            assert_close(&format!("softmax n={n} {isa:?}"), &y, &want, 2e-6, 1e-12);
            assert_bits(&format!("softmax n={n} {isa:?} vs scalar"), &y, &scalar);
        }
    }
    // Far below the max: flushed to zero, not NaN.
    let mut y = vec![0.0, -200.0, f32::NEG_INFINITY];
    softmax_inplace(Isa::detect(), &mut y, 3).unwrap();
    assert_eq!(y, [1.0, 0.0, 0.0]);
}

fn smol_rope(n_head: usize, mode: RopeMode, rot_dims: usize) -> Rope {
    Rope {
        n_head,
        head_dim: SMOL.2,
        rot_dims,
        theta_base: 100_000.0,
        mode,
    }
}

#[test]
fn rope_twin_matches_f64_within_2e_6() {
    let mut rng = StdRng::seed_from_u64(3);
    let pos = [0, 1, 17, 4095, 8191, 131_071];
    for rope in [
        smol_rope(SMOL.0, RopeMode::Normal, 64),
        smol_rope(SMOL.1, RopeMode::Normal, 64),
        smol_rope(SMOL.0, RopeMode::Neox, 64),
        smol_rope(SMOL.1, RopeMode::Neox, 32),
        Rope {
            n_head: 8,
            head_dim: 128,
            rot_dims: 128,
            theta_base: 500_000.0,
            mode: RopeMode::Normal,
        },
    ] {
        let x = uniform(&mut rng, pos.len() * rope.n_head * rope.head_dim, -2.0, 2.0);
        let want = ref_rope(&rope, &x, &pos);
        let mut y = x.clone();
        rope_inplace(&rope, &mut y, &pos).unwrap();
        // Values up to 2 * sqrt(2): a few f32 ulps, plus the f32 angle's rounding.
        assert_close(&format!("rope {rope:?}"), &y, &want, 0.0, 2e-6);
        if rope.rot_dims < rope.head_dim {
            for (a, b) in x.chunks(rope.head_dim).zip(y.chunks(rope.head_dim)) {
                assert_eq!(
                    a[rope.rot_dims..],
                    b[rope.rot_dims..],
                    "dims past rot_dims move"
                );
            }
        }
    }
    let bad = smol_rope(3, RopeMode::Normal, 63);
    assert!(rope_inplace(&bad, &mut [0.0; 192], &[0]).is_err());
    assert!(rope_inplace(
        &smol_rope(3, RopeMode::Normal, 64),
        &mut [0.0; 192],
        &[0, 1]
    )
    .is_err());
}

#[test]
fn elementwise_twins_match_f64() {
    let mut rng = StdRng::seed_from_u64(4);
    let n = 1536;
    let mut gate = uniform(&mut rng, n, -20.0, 20.0);
    gate[..6].copy_from_slice(&[-200.0, -88.5, -0.0, 0.0, 88.5, 200.0]);
    let up = uniform(&mut rng, n, -3.0, 3.0);
    let mut out = vec![0f32; n];
    silu_mul(&gate, &up, &mut out).unwrap();
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| {
            let g = g as f64;
            g / (1.0 + (-g).exp()) * u as f64
        })
        .collect();
    // expf is within about 1 ulp; the rest is four roundings.
    assert_close("silu_mul", &out, &want, 1e-6, 1e-30);

    let a = uniform(&mut rng, n, -10.0, 10.0);
    let mut sum = vec![0f32; n];
    add(&a, &up, &mut sum).unwrap();
    // One correctly rounded addition: exactly the f64 sum rounded.
    let want: Vec<f32> = a
        .iter()
        .zip(&up)
        .map(|(&x, &y)| (x as f64 + y as f64) as f32)
        .collect();
    assert_bits("add", &sum, &want);
    assert!(add(&a, &up[1..], &mut sum).is_err());
}

#[test]
fn kv_store_twin_rounds_to_nearest_even_into_its_cells() {
    let mut rng = StdRng::seed_from_u64(6);
    let width = 3 * 64;
    let mut x = uniform(&mut rng, 3 * width, -70_000.0, 70_000.0);
    // Ties (to even), subnormals, overflow to infinity, signed zero.
    x[..6].copy_from_slice(&[
        1.0 + f32::EPSILON * 2048.0,
        6.0e-8,
        1.0e-7,
        65_520.0,
        -0.0,
        65_504.0,
    ]);
    let cells = [4usize, 0, 2];
    let mut cache = vec![0xFFFFu16; 5 * width];
    kv_store_f16(&x, width, &cells, &mut cache).unwrap();
    for (t, &cell) in cells.iter().enumerate() {
        for i in 0..width {
            // f64 -> f16 is the same single rounding as f32 -> f16 for f32 inputs.
            let want = f16::from_f64(x[t * width + i] as f64).to_bits();
            assert_eq!(cache[cell * width + i], want, "token {t} value {i}");
        }
    }
    assert!(
        cache[width..2 * width].iter().all(|&b| b == 0xFFFF),
        "untouched cell"
    );
    assert_eq!(f16::from_bits(cache[4 * width + 3]), f16::INFINITY);
    assert!(kv_store_f16(&x, width, &[5, 0, 0], &mut cache).is_err());
    assert!(kv_store_f16(&x[1..], width, &cells, &mut cache).is_err());
}

#[test]
fn embed_twin_is_exact_and_rejects_bad_tokens() {
    let mut rng = StdRng::seed_from_u64(5);
    let n_vocab = 300;
    let weights = uniform(&mut rng, n_vocab * N_EMBD, -0.2, 0.2);
    let mut bytes = Vec::new();
    for row in weights.chunks(N_EMBD) {
        quantize_row(row, &mut bytes);
    }
    let w = Q8Matrix::new(&bytes, n_vocab, N_EMBD).unwrap();
    let tokens = [0, 299, 17, 17, 150];
    let mut out = vec![0f32; tokens.len() * N_EMBD];
    embed(&w, &tokens, &mut out).unwrap();
    for (&t, o) in tokens.iter().zip(out.chunks(N_EMBD)) {
        let row = w.row(t as usize);
        let want: Vec<f32> = row
            .chunks(34)
            .flat_map(|b| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
                b[2..].iter().map(move |&q| (d * q as i8 as f64) as f32)
            })
            .collect();
        assert_bits(&format!("embed token {t}"), o, &want);
    }
    for bad in [-1, 300] {
        assert!(matches!(
            embed(&w, &[1, bad], &mut out[..2 * N_EMBD]),
            Err(ShapeError::Token { index: 1, .. })
        ));
    }
}

struct AttnCase {
    shape: AttnShape,
    q: Vec<f32>,
    k: Vec<u16>,
    v: Vec<u16>,
    kv_len: Vec<usize>,
}

fn attn_case(
    seed: u64,
    (n_head, n_head_kv, head_dim): (usize, usize, usize),
    kv_len: &[usize],
) -> AttnCase {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_ctx = kv_len.iter().copied().max().unwrap_or(1).max(1) + 3;
    let shape = AttnShape {
        n_seq: kv_len.len(),
        n_head,
        n_head_kv,
        head_dim,
        n_ctx,
    };
    // Scores spread over several units, so the max subtraction and the weights matter.
    let q = uniform(&mut rng, shape.q_len(), -3.0, 3.0);
    AttnCase {
        q,
        k: f16_bits(&mut rng, shape.kv_len()),
        v: f16_bits(&mut rng, shape.kv_len()),
        kv_len: kv_len.to_vec(),
        shape,
    }
}

fn run_attn(c: &AttnCase, isa: Isa, chunk: usize) -> Vec<f32> {
    let mut out = vec![0f32; c.shape.q_len()];
    attention_decode(isa, &c.shape, &c.q, &c.k, &c.v, &c.kv_len, chunk, &mut out).unwrap();
    out
}

#[test]
fn attention_twin_matches_f64_and_split_matches_unsplit() {
    let cases = [
        (SMOL, vec![1]),
        (SMOL, vec![37]),
        (SMOL, vec![700, 0, 256, 257]),
        (LLAMA, vec![1]),
        (LLAMA, vec![37]),
        (LLAMA, vec![700]),
        (LLAMA, vec![2048]),
    ];
    for (seed, (heads, kv)) in cases.iter().enumerate() {
        let c = attn_case(10 + seed as u64, *heads, kv);
        let what = format!("attention {heads:?} kv {kv:?}");
        let want = ref_attention(&c.shape, &c.q, &c.k, &c.v, &c.kv_len);
        let split = run_attn(&c, Isa::Scalar, CHUNK);
        for isa in Isa::available() {
            let got = run_attn(&c, isa, CHUNK);
            // Outputs are convex mixes of values in [-1, 1]: absolute error.
            assert_close(&format!("{what} {isa:?}"), &got, &want, 0.0, 1e-6);
            assert_bits(&format!("{what} {isa:?} vs scalar"), &got, &split);
        }
        // One chunk over everything, and a small odd chunk: only the rounding differs.
        let unsplit = run_attn(&c, Isa::detect(), c.shape.n_ctx);
        let small = run_attn(&c, Isa::detect(), 61);
        for (name, other) in [("unsplit", &unsplit), ("chunk 61", &small)] {
            let o: Vec<f64> = other.iter().map(|&v| v as f64).collect();
            assert_close(&format!("{what} split vs {name}"), &split, &o, 0.0, 1e-6);
        }
        if kv.len() == 1 && kv[0] <= CHUNK {
            assert_bits(&format!("{what} one chunk either way"), &split, &unsplit);
        }
    }
}

#[test]
fn attention_rejects_bad_shapes() {
    let c = attn_case(1, SMOL, &[5]);
    let mut out = vec![0f32; c.shape.q_len()];
    let run = |shape: &AttnShape, kv: &[usize], chunk: usize, out: &mut [f32]| {
        attention_decode(Isa::Scalar, shape, &c.q, &c.k, &c.v, kv, chunk, out)
    };
    assert!(run(&c.shape, &[c.shape.n_ctx + 1], CHUNK, &mut out).is_err());
    assert!(run(&c.shape, &[5], 0, &mut out).is_err());
    assert!(run(&c.shape, &[5], CHUNK, &mut out[1..]).is_err());
    let odd = AttnShape {
        head_dim: 48,
        ..c.shape
    };
    assert!(run(&odd, &[5], CHUNK, &mut out).is_err());
    let gqa = AttnShape {
        n_head_kv: 2,
        ..c.shape
    };
    assert!(run(&gqa, &[5], CHUNK, &mut out).is_err());
}

// ---------- NVRTC (where libnvrtc is on the library path: `make kernels-check`) ----------

/// Every source compiles for the shipped PTX's baseline (compute_75, the lowest CUDA 13
/// still targets) and for Orin and H200, with the loaded NVRTC's own option set.
#[test]
fn every_source_compiles_with_nvrtc_for_the_shipped_targets() {
    use inferloop_kernels::kernels::SOURCES;
    use inferloop_kernels::nvrtc;
    let Ok(info) = nvrtc::info() else {
        eprintln!("NVRTC compile test skipped: no libnvrtc on the library path");
        return;
    };
    let (bm, bn) = nvrtc::BASELINE_ARCH;
    for arch in [
        nvrtc::arch_name(bm, bn),
        nvrtc::arch_name(8, 7),
        nvrtc::arch_name(9, 0),
    ] {
        assert!(
            info.archs
                .contains(&arch["compute_".len()..].parse().unwrap()),
            "NVRTC {} has no {arch}",
            info.version
        );
        for s in SOURCES {
            let ptx = nvrtc::compile(s.name, s.code, &arch, &[]).unwrap().to_src();
            assert!(ptx.contains(".entry"), "{} for {arch}: no entry", s.name);
            // Nothing left for ptxas or the driver to resolve (NVRTC 12.2's bare __dp4a).
            assert!(
                !ptx.contains(".extern .func"),
                "{} for {arch}: an unresolved call",
                s.name
            );
        }
    }
}

// ---------- GPU kernels against the twins ----------
// Every test in a `gpu` module takes its device from `test_gpu()`: the device check counts
// the tests listed under `gpu::` against those that say they ran on the GPU.

mod gpu {
    use std::error::Error;

    use super::*;
    use inferloop_kernels::cpu::{attention, elementwise, embed, rmsnorm, rope, softmax};
    use inferloop_kernels::cuda::{ops, test_gpu, Gpu};

    type R = Result<(), Box<dyn Error>>;

    fn gpu() -> Option<Gpu> {
        test_gpu()
    }

    #[test]
    fn rmsnorm_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(21);
        let x = uniform(&mut rng, 5 * N_EMBD, -4.0, 4.0);
        let w = uniform(&mut rng, N_EMBD, 0.5, 1.5);
        let mut want = vec![0f32; x.len()];
        rmsnorm::rmsnorm(Isa::detect(), &x, &w, 1e-5, &mut want)?;
        let (dx, dw) = (g.stream.clone_htod(&x)?, g.stream.clone_htod(&w)?);
        let mut dy = g.stream.alloc_zeros::<f32>(x.len())?;
        ops::rmsnorm(&g, &dx, &dw, 1e-5, &mut dy)?;
        assert_bits("rmsnorm gpu", &g.stream.clone_dtoh(&dy)?, &want);
        let mut dx = dx;
        ops::rmsnorm_inplace(&g, &mut dx, &dw, 1e-5)?;
        assert_bits("rmsnorm gpu in place", &g.stream.clone_dtoh(&dx)?, &want);
        Ok(())
    }

    #[test]
    fn softmax_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(22);
        for n in [1, 37, N_EMBD, 2048] {
            let x = uniform(&mut rng, 3 * n, -12.0, 12.0);
            let mut want = x.clone();
            softmax::softmax_inplace(Isa::detect(), &mut want, n)?;
            let mut dx = g.stream.clone_htod(&x)?;
            ops::softmax_inplace(&g, &mut dx, n)?;
            assert_bits(
                &format!("softmax gpu n={n}"),
                &g.stream.clone_dtoh(&dx)?,
                &want,
            );
        }
        Ok(())
    }

    #[test]
    fn rope_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(23);
        let pos = [0i32, 1, 17, 4095, 131_071];
        for r in [
            smol_rope(SMOL.0, RopeMode::Normal, 64),
            smol_rope(SMOL.1, RopeMode::Neox, 64),
            smol_rope(SMOL.1, RopeMode::Neox, 32),
        ] {
            let x = uniform(&mut rng, pos.len() * r.n_head * r.head_dim, -2.0, 2.0);
            let mut want = x.clone();
            rope::rope_inplace(&r, &mut want, &pos)?;
            let mut dx = g.stream.clone_htod(&x)?;
            let dp = g.stream.clone_htod(&pos)?;
            ops::rope_inplace(&g, &r, &mut dx, &dp)?;
            assert_bits(
                &format!("rope gpu {r:?}"),
                &g.stream.clone_dtoh(&dx)?,
                &want,
            );
        }
        Ok(())
    }

    #[test]
    fn elementwise_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(24);
        let n = 1536 * 3 + 5;
        let mut gate = uniform(&mut rng, n, -20.0, 20.0);
        gate[..6].copy_from_slice(&[-200.0, -88.5, -0.0, 0.0, 88.5, 200.0]);
        let up = uniform(&mut rng, n, -3.0, 3.0);
        let mut want = vec![0f32; n];
        elementwise::silu_mul(&gate, &up, &mut want)?;
        let (dg, du) = (g.stream.clone_htod(&gate)?, g.stream.clone_htod(&up)?);
        let mut dout = g.stream.alloc_zeros::<f32>(n)?;
        ops::silu_mul(&g, &dg, &du, &mut dout)?;
        assert_bits("silu_mul gpu", &g.stream.clone_dtoh(&dout)?, &want);
        let mut sum = vec![0f32; n];
        elementwise::add(&gate, &up, &mut sum)?;
        let mut dg = dg;
        ops::add_inplace(&g, &mut dg, &du)?;
        assert_bits("add gpu", &g.stream.clone_dtoh(&dg)?, &sum);
        Ok(())
    }

    #[test]
    fn kv_store_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(25);
        let width = 8 * 128;
        let x = uniform(&mut rng, 5 * width, -70_000.0, 70_000.0);
        let cells = [9usize, 0, 3, 4, 7];
        let mut want = vec![0u16; 10 * width];
        elementwise::kv_store_f16(&x, width, &cells, &mut want)?;
        let cells_i: Vec<i32> = cells.iter().map(|&c| c as i32).collect();
        let (dx, dc) = (g.stream.clone_htod(&x)?, g.stream.clone_htod(&cells_i)?);
        let mut dcache = g.stream.alloc_zeros::<u16>(10 * width)?;
        ops::kv_store_f16(&g, &dx, width, &dc, &mut dcache)?;
        assert_eq!(g.stream.clone_dtoh(&dcache)?, want, "kv_store gpu");
        Ok(())
    }

    #[test]
    fn embed_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(25);
        let n_vocab = 300;
        let weights = uniform(&mut rng, n_vocab * N_EMBD, -0.2, 0.2);
        let mut bytes = Vec::new();
        for row in weights.chunks(N_EMBD) {
            quantize_row(row, &mut bytes);
        }
        let w = Q8Matrix::new(&bytes, n_vocab, N_EMBD)?;
        let tokens = [0i32, 299, 17, 150];
        let mut want = vec![0f32; tokens.len() * N_EMBD];
        embed::embed(&w, &tokens, &mut want)?;
        // A bad token gives a zero row on the GPU.
        let dev_tokens = [0i32, 299, 17, 150, -1, 300];
        want.extend(std::iter::repeat_n(0.0, 2 * N_EMBD));
        let (dw, dt) = (
            inferloop_kernels::cuda::q8::upload_weights(&g.stream, &w)?,
            g.stream.clone_htod(&dev_tokens)?,
        );
        let mut dout = g.stream.alloc_zeros::<f32>(want.len())?;
        ops::embed(&g, &dw, n_vocab, N_EMBD, &dt, &mut dout)?;
        assert_bits("embed gpu", &g.stream.clone_dtoh(&dout)?, &want);
        Ok(())
    }

    #[test]
    fn attention_gpu_equals_twin() -> R {
        let Some(g) = gpu() else { return Ok(()) };
        let cases = [
            (SMOL, vec![1]),
            (SMOL, vec![700, 0, 256, 257]),
            (LLAMA, vec![37]),
            (LLAMA, vec![2048]),
        ];
        for (seed, (heads, kv)) in cases.iter().enumerate() {
            let c = attn_case(30 + seed as u64, *heads, kv);
            let max_kv = kv.iter().copied().max().unwrap_or(0);
            let lens: Vec<i32> = kv.iter().map(|&n| n as i32).collect();
            let (dq, dk, dv) = (
                g.stream.clone_htod(&c.q)?,
                g.stream.clone_htod(&c.k)?,
                g.stream.clone_htod(&c.v)?,
            );
            let dl = g.stream.clone_htod(&lens)?;
            for chunk in [attention::CHUNK, 61] {
                let want = run_attn(&c, Isa::detect(), chunk);
                let mut ws = g
                    .stream
                    .alloc_zeros::<f32>(c.shape.workspace_len(max_kv, chunk))?;
                let mut dout = g.stream.alloc_zeros::<f32>(c.shape.q_len())?;
                ops::attention_decode(
                    &g, &c.shape, &dq, &dk, &dv, &dl, max_kv, chunk, &mut ws, &mut dout,
                )?;
                let got = g.stream.clone_dtoh(&dout)?;
                assert_bits(
                    &format!("attention gpu {heads:?} kv {kv:?} chunk {chunk}"),
                    &got,
                    &want,
                );
            }
        }
        Ok(())
    }
}
