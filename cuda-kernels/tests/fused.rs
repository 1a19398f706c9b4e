//! The decode step's fused kernels (`fused.cu`): each twin equals the unfused twins it
//! composes, and, where a GPU (or the emulator) is present, each kernel gives its twin's bits
//! and the bits of the unfused kernels run one after the other. Shapes: SmolLM2-135M (9 q
//! heads, 3 kv heads, head_dim 64) and Llama-3-8B's attention (32, 8, 128).

use std::error::Error;

use half::f16;
use inferloop_kernels::cpu::attention::{attention_decode, AttnShape, CHUNK};
use inferloop_kernels::cpu::elementwise::silu_mul;
use inferloop_kernels::cpu::fused;
use inferloop_kernels::cpu::quantize::quantize_into;
use inferloop_kernels::cpu::rmsnorm::rmsnorm;
use inferloop_kernels::cpu::rope::{rope_inplace, Rope, RopeMode};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::cuda::cudarc::driver::CudaSlice;
use inferloop_kernels::cuda::fused::{self as gf, AttnOut};
use inferloop_kernels::cuda::{ops, q8 as gq8, test_gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type R = Result<(), Box<dyn Error>>;

fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: {a} vs {b}");
    }
}

fn quantized(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; x.len() / 32]);
    quantize_into(Isa::detect(), x, &mut q, &mut d).unwrap();
    (q, d)
}

const E: usize = 576;

fn rope(n_head: usize, head_dim: usize, rot_dims: usize, mode: RopeMode) -> Rope {
    Rope {
        n_head,
        head_dim,
        rot_dims,
        theta_base: 100_000.0,
        mode,
    }
}

/// Fused q|k|v rows for `n_tok` tokens and the caches of `n_cells` cells.
struct Step {
    qkv: Vec<f32>,
    kc: Vec<u16>,
    vc: Vec<u16>,
}

fn step(rng: &mut StdRng, n_tok: usize, heads: (usize, usize, usize), n_cells: usize) -> Step {
    let (nh, nkv, hd) = heads;
    let kvd = nkv * hd;
    let f16s = |rng: &mut StdRng, n| -> Vec<u16> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
            .collect()
    };
    Step {
        qkv: uniform(rng, n_tok * (nh + 2 * nkv) * hd, -2.0, 2.0),
        kc: f16s(rng, n_cells * kvd),
        vc: f16s(rng, n_cells * kvd),
    }
}

#[test]
fn fused_twins_equal_the_unfused_twins() {
    let isa = Isa::detect();
    let mut rng = StdRng::seed_from_u64(41);
    // rmsnorm then quantize, rows gathered.
    let x = uniform(&mut rng, 3 * E, -4.0, 4.0);
    let w = uniform(&mut rng, E, 0.5, 1.5);
    let (mut q, mut d) = (vec![0i8; 2 * E], vec![0f32; 2 * E / 32]);
    fused::rmsnorm_quantize(isa, &x, &[2, 0], &w, 1e-5, &mut q, &mut d).unwrap();
    let mut y = vec![0f32; 2 * E];
    rmsnorm(isa, &x[2 * E..], &w, 1e-5, &mut y[..E]).unwrap();
    rmsnorm(isa, &x[..E], &w, 1e-5, &mut y[E..]).unwrap();
    assert_eq!((q, d), quantized(&y));

    // silu_mul then quantize on gate|up rows.
    let ff = 96;
    let gu = uniform(&mut rng, 2 * 2 * ff, -6.0, 6.0);
    let (mut q, mut d) = (vec![0i8; 2 * ff], vec![0f32; 2 * ff / 32]);
    fused::silu_mul_quantize(isa, &gu, ff, &mut q, &mut d).unwrap();
    let mut a = vec![0f32; 2 * ff];
    for t in 0..2 {
        let row = &gu[t * 2 * ff..(t + 1) * 2 * ff];
        silu_mul(&row[..ff], &row[ff..], &mut a[t * ff..(t + 1) * ff]).unwrap();
    }
    assert_eq!((q, d), quantized(&a));

    // RoPE of q and k, then the stores.
    let (nh, nkv, hd) = (9, 3, 64);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let mut s = step(&mut rng, 2, (nh, nkv, hd), 4);
    let (pos, cells) = ([5i32, 0], [3usize, 0]);
    let r = rope(nh, hd, 64, RopeMode::Normal);
    let mut want = s.qkv.clone();
    for (t, &p) in pos.iter().enumerate() {
        let row = &mut want[t * (qd + 2 * kvd)..];
        rope_inplace(&r, &mut row[..qd], &[p]).unwrap();
        rope_inplace(
            &rope(nkv, hd, 64, RopeMode::Normal),
            &mut row[qd..qd + kvd],
            &[p],
        )
        .unwrap();
    }
    let (mut kc, mut vc) = (s.kc.clone(), s.vc.clone());
    fused::rope_store(&r, nkv, &mut s.qkv, &pos, &cells, &mut kc, &mut vc).unwrap();
    assert_bits("rope_store qkv", &s.qkv, &want);
    for (t, &c) in cells.iter().enumerate() {
        let row = &want[t * (qd + 2 * kvd)..];
        for i in 0..kvd {
            assert_eq!(kc[c * kvd + i], f16::from_f32(row[qd + i]).to_bits());
            assert_eq!(vc[c * kvd + i], f16::from_f32(row[qd + kvd + i]).to_bits());
        }
    }
}

#[test]
fn fused_attention_twin_is_the_decode_twin_per_token() {
    let isa = Isa::detect();
    let mut rng = StdRng::seed_from_u64(42);
    let (nh, nkv, hd, n_ctx) = (9, 3, 64, 40);
    let s = step(&mut rng, 3, (nh, nkv, hd), 2 * n_ctx);
    let shape = AttnShape {
        n_seq: 1,
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        n_ctx,
    };
    let (pos, cells) = ([39i32, 0, 17], [39usize, n_ctx, n_ctx + 17]);
    let qd = nh * hd;
    let mut out = vec![0f32; 3 * qd];
    let (mut q, mut d) = (vec![0i8; 3 * qd], vec![0f32; 3 * qd / 32]);
    let chunk = 16;
    fused::attention_step(
        isa, &shape, &s.qkv, &s.kc, &s.vc, &pos, &cells, chunk, &mut out, &mut q, &mut d,
    )
    .unwrap();
    let w = qd + 2 * nkv * hd;
    let seq = n_ctx * nkv * hd;
    for t in 0..3 {
        let base = (cells[t] - pos[t] as usize) * nkv * hd;
        let mut want = vec![0f32; qd];
        attention_decode(
            isa,
            &shape,
            &s.qkv[t * w..t * w + qd],
            &s.kc[base..base + seq],
            &s.vc[base..base + seq],
            &[pos[t] as usize + 1],
            chunk,
            &mut want,
        )
        .unwrap();
        assert_bits("attention_step", &out[t * qd..(t + 1) * qd], &want);
    }
    assert_eq!((q, d), quantized(&out));
}

// ---------- the kernels on a GPU (or the emulator) ----------

mod gpu {
    use super::*;

    #[test]
    fn fused_rmsnorm_quantize_gpu_gives_its_twins_and_the_unfused_kernels_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(51);
        for n in [E, 4096] {
            let x = uniform(&mut rng, 3 * n, -4.0, 4.0);
            let w = uniform(&mut rng, n, 0.5, 1.5);
            let rows = [2i32, 0];
            let (mut q, mut d) = (vec![0i8; 2 * n], vec![0f32; 2 * n / 32]);
            fused::rmsnorm_quantize(Isa::detect(), &x, &[2, 0], &w, 1e-5, &mut q, &mut d)?;
            let (dx, dw, dr) = (
                g.stream.clone_htod(&x)?,
                g.stream.clone_htod(&w)?,
                g.stream.clone_htod(&rows)?,
            );
            let mut dq = g.stream.alloc_zeros::<i8>(2 * n)?;
            let mut dd = g.stream.alloc_zeros::<f32>(2 * n / 32)?;
            gf::rmsnorm_quantize(&g, &dx, Some(&dr), 2, &dw, 1e-5, &mut dq, &mut dd)?;
            assert_eq!(g.stream.clone_dtoh(&dq)?, q, "n {n}: quants");
            assert_bits("rmsnorm_quantize d", &g.stream.clone_dtoh(&dd)?, &d);
            // Without a gather, against rmsnorm_f32 then quantize_q8_f32.
            let mut dq3 = g.stream.alloc_zeros::<i8>(3 * n)?;
            let mut dd3 = g.stream.alloc_zeros::<f32>(3 * n / 32)?;
            gf::rmsnorm_quantize(
                &g,
                &dx,
                None::<&CudaSlice<i32>>,
                3,
                &dw,
                1e-5,
                &mut dq3,
                &mut dd3,
            )?;
            let mut dy = g.stream.alloc_zeros::<f32>(3 * n)?;
            ops::rmsnorm(&g, &dx, &dw, 1e-5, &mut dy)?;
            let mut uq = g.stream.alloc_zeros::<i8>(3 * n)?;
            let mut ud = g.stream.alloc_zeros::<f32>(3 * n / 32)?;
            gq8::quantize_into(&g, &dy, &mut uq, &mut ud)?;
            assert_eq!(g.stream.clone_dtoh(&dq3)?, g.stream.clone_dtoh(&uq)?);
            assert_bits(
                "unfused d",
                &g.stream.clone_dtoh(&dd3)?,
                &g.stream.clone_dtoh(&ud)?,
            );
        }
        Ok(())
    }

    #[test]
    fn fused_silu_mul_quantize_gpu_gives_its_twins_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(52);
        let ff = 1536;
        let mut gu = uniform(&mut rng, 3 * 2 * ff, -20.0, 20.0);
        gu[..4].copy_from_slice(&[-200.0, -0.0, 0.0, 200.0]);
        let (mut q, mut d) = (vec![0i8; 3 * ff], vec![0f32; 3 * ff / 32]);
        fused::silu_mul_quantize(Isa::detect(), &gu, ff, &mut q, &mut d)?;
        let dgu = g.stream.clone_htod(&gu)?;
        let mut dq = g.stream.alloc_zeros::<i8>(3 * ff)?;
        let mut dd = g.stream.alloc_zeros::<f32>(3 * ff / 32)?;
        gf::silu_mul_quantize(&g, &dgu, ff, &mut dq, &mut dd)?;
        assert_eq!(g.stream.clone_dtoh(&dq)?, q);
        assert_bits("silu_mul_quantize d", &g.stream.clone_dtoh(&dd)?, &d);
        Ok(())
    }

    #[test]
    fn fused_rope_store_gpu_gives_its_twins_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(53);
        for (heads, r) in [
            ((9, 3, 64), rope(9, 64, 64, RopeMode::Normal)),
            ((4, 2, 32), rope(4, 32, 16, RopeMode::Neox)),
            ((32, 8, 128), rope(32, 128, 128, RopeMode::Normal)),
        ] {
            let n_cells = 6;
            let mut s = step(&mut rng, 3, heads, n_cells);
            let pos = [0i32, 4095, 17];
            let cells = [5usize, 0, 2];
            let cells_i: Vec<i32> = cells.iter().map(|&c| c as i32).collect();
            let mut dqkv = g.stream.clone_htod(&s.qkv)?;
            let mut dk = g.stream.clone_htod(&s.kc)?;
            let mut dv = g.stream.clone_htod(&s.vc)?;
            let (dp, dc) = (g.stream.clone_htod(&pos)?, g.stream.clone_htod(&cells_i)?);
            fused::rope_store(&r, heads.1, &mut s.qkv, &pos, &cells, &mut s.kc, &mut s.vc)?;
            gf::rope_store(&g, &r, heads.1, &mut dqkv, &dp, &dc, &mut dk, &mut dv)?;
            assert_bits("rope_store qkv", &g.stream.clone_dtoh(&dqkv)?, &s.qkv);
            assert_eq!(g.stream.clone_dtoh(&dk)?, s.kc, "{heads:?}: K cache");
            assert_eq!(g.stream.clone_dtoh(&dv)?, s.vc, "{heads:?}: V cache");
        }
        Ok(())
    }

    /// One launch for a step of three tokens of two sequences (one mid-prompt), against the
    /// twin and against the unfused kernels (`attn_partial_f16` + `attn_combine_f32` per token,
    /// then `quantize_q8_f32`).
    #[test]
    fn fused_attention_step_gpu_gives_its_twins_and_the_unfused_kernels_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(54);
        for (heads, n_ctx, chunk) in [((9, 3, 64), 600, CHUNK), ((32, 8, 128), 70, 32)] {
            let (nh, nkv, hd) = heads;
            let (qd, kvd) = (nh * hd, nkv * hd);
            let s = step(&mut rng, 3, heads, 2 * n_ctx);
            let shape = AttnShape {
                n_seq: 1,
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                n_ctx,
            };
            let pos = [n_ctx as i32 - 1, 0, 40];
            let cells = [n_ctx - 1, n_ctx, n_ctx + 40];
            let cells_i: Vec<i32> = cells.iter().map(|&c| c as i32).collect();
            let mut out = vec![0f32; 3 * qd];
            let (mut q, mut d) = (vec![0i8; 3 * qd], vec![0f32; 3 * qd / 32]);
            fused::attention_step(
                Isa::detect(),
                &shape,
                &s.qkv,
                &s.kc,
                &s.vc,
                &pos,
                &cells,
                chunk,
                &mut out,
                &mut q,
                &mut d,
            )?;
            let st = &g.stream;
            let (dqkv, dk, dv) = (
                st.clone_htod(&s.qkv)?,
                st.clone_htod(&s.kc)?,
                st.clone_htod(&s.vc)?,
            );
            let (dp, dc) = (st.clone_htod(&pos)?, st.clone_htod(&cells_i)?);
            let step_shape = AttnShape { n_seq: 3, ..shape };
            let mut ws = st.alloc_zeros::<f32>(step_shape.workspace_len(n_ctx, chunk))?;
            let mut dout = st.alloc_zeros::<f32>(3 * qd)?;
            let mut dq = st.alloc_zeros::<i8>(3 * qd)?;
            let mut dd = st.alloc_zeros::<f32>(3 * qd / 32)?;
            let o = AttnOut {
                out: &mut dout,
                q: &mut dq,
                d: &mut dd,
                workspace: &mut ws,
            };
            gf::attention_step(&g, &shape, &dqkv, &dk, &dv, &dp, &dc, chunk, o)?;
            let got = st.clone_dtoh(&dout)?;
            assert_bits(&format!("attention_step {heads:?}"), &got, &out);
            assert_eq!(st.clone_dtoh(&dq)?, q);
            assert_bits("attention_step d", &st.clone_dtoh(&dd)?, &d);

            // The unfused kernels, token by token, on the same caches.
            let w = qd + 2 * kvd;
            let seq = n_ctx * kvd;
            let mut uws = st.alloc_zeros::<f32>(shape.workspace_len(n_ctx, chunk))?;
            let mut uout = st.alloc_zeros::<f32>(3 * qd)?;
            for t in 0..3 {
                let base = (cells[t] - pos[t] as usize) * kvd;
                let len = st.clone_htod(&[pos[t] + 1])?;
                ops::attention_decode(
                    &g,
                    &shape,
                    &dqkv.slice(t * w..t * w + qd),
                    &dk.slice(base..base + seq),
                    &dv.slice(base..base + seq),
                    &len,
                    pos[t] as usize + 1,
                    chunk,
                    &mut uws,
                    &mut uout.slice_mut(t * qd..(t + 1) * qd),
                )?;
            }
            assert_bits("unfused attention", &st.clone_dtoh(&uout)?, &got);
        }
        Ok(())
    }
}
