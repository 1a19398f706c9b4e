//! The decode layer's four-launch kernels (`layer.cu`) against their twins
//! ([`inferloop_kernels::cpu::layer`]), bit for bit, where a GPU (or the emulator) is present:
//! the default model's head layout (9 q heads, 3 kv heads, head_dim 64, with a bias),
//! Llama-3-8B's (32, 8, 128; rows shortened to k = 256 so the emulator stays quick) and a
//! NeoX rotation over part of a head. A step's tokens include one that attends a cell
//! another block of the same launch writes, and every launch is made twice: the counters
//! it leaves must be zeros, so the second gives the first's bits.

use std::error::Error;

use half::f16;
use inferloop_kernels::cpu::attention::AttnShape;
use inferloop_kernels::cpu::layer::{self as twin, Attn, Norm};
use inferloop_kernels::cpu::quantize::{quantize, Q8Act};
use inferloop_kernels::cpu::rope::{Rope, RopeMode};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{row_bytes, Q8Matrix, QK};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type R = Result<(), Box<dyn Error>>;

fn random_matrix(rng: &mut StdRng, rows: usize, k: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows * row_bytes(k));
    for _ in 0..rows * k / QK {
        let d = f16::from_f32(rng.gen_range(1e-3f32..5e-2));
        bytes.extend_from_slice(&d.to_le_bytes());
        bytes.extend((0..QK).map(|_| rng.gen::<u8>()));
    }
    bytes
}

fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn act(rng: &mut StdRng, ncols: usize, k: usize) -> Q8Act {
    quantize(Isa::detect(), &uniform(rng, ncols * k, -2.0, 2.0), k).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn layer_sources_name_their_kernels() {
    let src = inferloop_kernels::kernels::source("layer").unwrap();
    assert_eq!(
        src.entries(),
        ["layer_qkv", "layer_residual_norm", "layer_gate_up"]
    );
}

mod gpu {
    use super::*;
    use inferloop_kernels::cuda::cudarc::driver::CudaSlice;
    use inferloop_kernels::cuda::layer::{self, Act};
    use inferloop_kernels::cuda::q8::upload_weights;
    use inferloop_kernels::cuda::{test_gpu, Gpu};

    fn dev_act<'a>(
        g: &Gpu,
        a: &Q8Act,
        q: &'a mut Option<CudaSlice<i8>>,
        d: &'a mut Option<CudaSlice<f32>>,
    ) -> Act<'a> {
        let q = q.insert(g.stream.clone_htod(&a.q).unwrap());
        let d = d.insert(g.stream.clone_htod(&a.d).unwrap());
        Act {
            q: q.slice(..),
            d: d.slice(..),
            ncols: a.rows,
        }
    }

    #[test]
    fn layer_qkv_gpu_gives_its_twins_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(61);
        // (heads, k, rot_dims, mode, bias)
        for ((nh, nkv, hd), k, rot, mode, with_bias) in [
            ((9, 3, 64), 576, 64, RopeMode::Normal, true),
            ((32, 8, 128), 256, 128, RopeMode::Normal, false),
            ((4, 2, 32), 64, 16, RopeMode::Neox, true),
        ] {
            let (qd, kvd) = (nh * hd, nkv * hd);
            let rows = qd + 2 * kvd;
            let n_ctx = 40;
            let shape = AttnShape {
                n_seq: 1,
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                n_ctx,
            };
            let rope = Rope {
                n_head: nh,
                head_dim: hd,
                rot_dims: rot,
                theta_base: 100_000.0,
                mode,
            };
            let w = random_matrix(&mut rng, rows, k);
            let a = act(&mut rng, 3, k);
            let bias = with_bias.then(|| uniform(&mut rng, rows, -1.0, 1.0));
            let f16s = |rng: &mut StdRng| -> Vec<u16> {
                (0..2 * n_ctx * kvd)
                    .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
                    .collect()
            };
            let (kc0, vc0) = (f16s(&mut rng), f16s(&mut rng));
            // Sequence 0 at its last position; sequence 1's first two positions, the second
            // attending the first, which another block of the same launch stores.
            let pos = [n_ctx as i32 - 1, 0, 1];
            let cells = [n_ctx - 1, n_ctx, n_ctx + 1];
            let cells_i: Vec<i32> = cells.iter().map(|&c| c as i32).collect();
            let chunk = 16;

            let (mut kc, mut vc) = (kc0.clone(), vc0.clone());
            let mut qkv = vec![0f32; 3 * rows];
            let (mut oq, mut od) = (vec![0i8; 3 * qd], vec![0f32; 3 * qd / QK]);
            let at = Attn {
                shape,
                rope,
                pos: &pos,
                cells: &cells,
                k: &mut kc,
                v: &mut vc,
                chunk,
            };
            let wm = Q8Matrix::new(&w, rows, k)?;
            twin::layer_qkv(
                Isa::detect(),
                &wm,
                &a,
                bias.as_deref(),
                at,
                &mut qkv,
                &mut oq,
                &mut od,
            )?;

            let st = &g.stream;
            let dw = upload_weights(st, &wm)?;
            let (mut aq, mut ad) = (None, None);
            let da = dev_act(&g, &a, &mut aq, &mut ad);
            let db = bias.as_ref().map(|b| st.clone_htod(b)).transpose()?;
            let (dp, dc) = (st.clone_htod(&pos)?, st.clone_htod(&cells_i)?);
            let mut counters = st.alloc_zeros::<i32>(layer::COUNTERS)?;
            let ws_len = AttnShape { n_seq: 3, ..shape }.workspace_len(n_ctx, chunk);
            for round in 0..2 {
                let (mut dk, mut dv) = (st.clone_htod(&kc0)?, st.clone_htod(&vc0)?);
                let mut dqkv = st.alloc_zeros::<f32>(3 * rows)?;
                let mut ws = st.alloc_zeros::<f32>(ws_len)?;
                let mut doq = st.alloc_zeros::<i8>(3 * qd)?;
                let mut dod = st.alloc_zeros::<f32>(3 * qd / QK)?;
                let dat = layer::Attn {
                    shape,
                    rope,
                    pos: dp.slice(..),
                    cells: dc.slice(..),
                    k: &mut dk,
                    v: &mut dv,
                    chunk,
                    workspace: ws.slice_mut(..),
                };
                layer::qkv(
                    &g,
                    &dw,
                    &da,
                    db.as_ref(),
                    &mut dqkv.slice_mut(..),
                    dat,
                    &mut doq.slice_mut(..),
                    &mut dod.slice_mut(..),
                    &mut counters,
                )?;
                let what = format!("{nh}/{nkv}/{hd} round {round}");
                assert_eq!(bits(&st.clone_dtoh(&dqkv)?), bits(&qkv), "{what}: qkv");
                assert_eq!(st.clone_dtoh(&dk)?, kc, "{what}: K cache");
                assert_eq!(st.clone_dtoh(&dv)?, vc, "{what}: V cache");
                assert_eq!(st.clone_dtoh(&doq)?, oq, "{what}: attention quants");
                assert_eq!(bits(&st.clone_dtoh(&dod)?), bits(&od), "{what}: scales");
                assert!(
                    st.clone_dtoh(&counters)?.iter().all(|&c| c == 0),
                    "{what}: counters"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn layer_residual_norm_gpu_gives_its_twins_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(62);
        let st = &g.stream;
        // (rows, k, tokens, the norm's rows: None = no norm, Some(empty) = all)
        for (rows, k, n, sel) in [
            (576, 576, 3, Some(vec![])),
            (576, 1536, 8, Some(vec![7usize, 2])),
            (4096, 256, 1, Some(vec![])),
            (96, 64, 2, None),
        ] {
            let w = random_matrix(&mut rng, rows, k);
            let a = act(&mut rng, n, k);
            let x0 = uniform(&mut rng, n * rows, -4.0, 4.0);
            let nw = uniform(&mut rng, rows, 0.5, 1.5);
            let picked: Option<Vec<usize>> =
                sel.map(|s| if s.is_empty() { (0..n).collect() } else { s });
            let n_out = picked.as_ref().map_or(0, Vec::len);
            let mut x = x0.clone();
            let (mut q, mut d) = (vec![0i8; n_out * rows], vec![0f32; n_out * rows / QK]);
            let norm = picked.as_ref().map(|p| Norm {
                w: &nw,
                eps: 1e-5,
                rows: p,
                q: &mut q,
                d: &mut d,
            });
            twin::layer_residual_norm(
                Isa::detect(),
                &Q8Matrix::new(&w, rows, k)?,
                &a,
                &mut x,
                norm,
            )?;

            let dw = upload_weights(st, &Q8Matrix::new(&w, rows, k)?)?;
            let (mut aq, mut ad) = (None, None);
            let da = dev_act(&g, &a, &mut aq, &mut ad);
            let dnw = st.clone_htod(&nw)?;
            // (One entry at least: an empty copy is refused.)
            let mut sel_i: Vec<i32> = picked.iter().flatten().map(|&r| r as i32).collect();
            sel_i.resize(n_out.max(1), 0);
            let dsel = st.clone_htod(&sel_i)?;
            let mut counters = st.alloc_zeros::<i32>(layer::COUNTERS)?;
            for round in 0..2 {
                let mut dx = st.clone_htod(&x0)?;
                let mut dq = st.alloc_zeros::<i8>(n_out.max(1) * rows)?;
                let mut dd = st.alloc_zeros::<f32>(n_out.max(1) * rows / QK)?;
                let norm = picked.as_ref().map(|_| layer::Norm {
                    w: &dnw,
                    eps: 1e-5,
                    sel: Some(dsel.slice(..)),
                    n_out,
                    q: dq.slice_mut(..n_out * rows),
                    d: dd.slice_mut(..n_out * rows / QK),
                });
                layer::residual_norm(
                    &g,
                    &dw,
                    rows,
                    &da,
                    &mut dx.slice_mut(..),
                    norm,
                    &mut counters,
                )?;
                let what = format!("{rows}x{k}, {n} tokens, round {round}");
                assert_eq!(bits(&st.clone_dtoh(&dx)?), bits(&x), "{what}: residual");
                if n_out > 0 {
                    assert_eq!(st.clone_dtoh(&dq)?[..n_out * rows], q[..], "{what}: quants");
                    let got = st.clone_dtoh(&dd)?;
                    assert_eq!(bits(&got[..n_out * rows / QK]), bits(&d), "{what}: scales");
                }
                assert!(
                    st.clone_dtoh(&counters)?.iter().all(|&c| c == 0),
                    "{what}: counters"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn layer_gate_up_gpu_gives_its_twins_bits() -> R {
        let Some(g) = test_gpu() else { return Ok(()) };
        let mut rng = StdRng::seed_from_u64(63);
        let st = &g.stream;
        for (ff, k, n) in [(1536, 576, 3), (96, 4096, 8), (64, 64, 1)] {
            let w = random_matrix(&mut rng, 2 * ff, k);
            let a = act(&mut rng, n, k);
            let mut gu = vec![0f32; n * 2 * ff];
            let (mut q, mut d) = (vec![0i8; n * ff], vec![0f32; n * ff / QK]);
            let wm = Q8Matrix::new(&w, 2 * ff, k)?;
            twin::layer_gate_up(Isa::detect(), &wm, &a, &mut gu, &mut q, &mut d)?;

            let dw = upload_weights(st, &wm)?;
            let (mut aq, mut ad) = (None, None);
            let da = dev_act(&g, &a, &mut aq, &mut ad);
            let mut dgu = st.alloc_zeros::<f32>(n * 2 * ff)?;
            let mut dq = st.alloc_zeros::<i8>(n * ff)?;
            let mut dd = st.alloc_zeros::<f32>(n * ff / QK)?;
            layer::gate_up(
                &g,
                &dw,
                ff,
                &da,
                &mut dgu.slice_mut(..),
                &mut dq.slice_mut(..),
                &mut dd.slice_mut(..),
            )?;
            let what = format!("n_ff {ff}, k {k}, {n} tokens");
            assert_eq!(bits(&st.clone_dtoh(&dgu)?), bits(&gu), "{what}: gate|up");
            assert_eq!(st.clone_dtoh(&dq)?, q, "{what}: quants");
            assert_eq!(bits(&st.clone_dtoh(&dd)?), bits(&d), "{what}: scales");
        }
        Ok(())
    }
}
