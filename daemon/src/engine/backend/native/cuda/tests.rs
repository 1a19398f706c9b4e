//! The CUDA pass with and without graphs, on a GPU or the emulator: replaying the captured
//! pass gives the logits bits of launching its kernels one by one, over prompts, decode
//! steps of several sequences and a second shape; on the emulator, whose driver counts, a
//! replayed step is one graph launch and the uncaptured one four kernels per layer
//! (`layer.cu`) and three besides (embedding, the first norm, the logits).

use inferloop_kernels::cuda::counters;
use inferloop_kernels::cuda::{test_gpu, Gpu};

use super::super::synth::{synth, Spec};
use super::super::{BatchToken, HParams, Model, Weights};
use super::CudaPass;

fn tok(seq: usize, token: i32, pos: u32) -> BatchToken {
    BatchToken { seq, token, pos }
}

#[test]
fn cuda_graphs_replay_the_uncaptured_pass_bit_for_bit() {
    let Some(first) = test_gpu() else { return };
    let mut first = Some(first);
    for (spec, seed) in [(Spec::llama(), 31), (Spec::qwen2(), 32)] {
        let s = synth(spec, seed);
        let hp = HParams::from_metadata(&s).unwrap();
        let pass = |graphs: bool, gpu: Gpu| {
            let w = Weights::load(&hp, &s).unwrap();
            let mut p = CudaPass::new(gpu, &hp, &w, 3, 32).unwrap();
            p.set_graphs(graphs);
            Model::with_pass(hp.clone(), Box::new(p))
        };
        let gpu = || Gpu::open_default(0).unwrap();
        let mut replayed = pass(true, first.take().unwrap_or_else(gpu));
        let mut direct = pass(false, gpu());
        let nv = spec.n_vocab as i32;
        let mut feed = |batch: &[BatchToken], want: &[bool]| {
            let a = replayed.forward(batch, want).unwrap().to_vec();
            let b = direct.forward(batch, want).unwrap().to_vec();
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "logit {i}: graph {x} vs direct {y}"
                );
            }
            argmaxes(&a, nv as usize)
        };
        // Prompts of two sequences (their last token wanted), then decode steps of three.
        let prompt: Vec<BatchToken> = (0..5).map(|p| tok(0, (p * 7 + 1) % nv, p as u32)).collect();
        let mut want = vec![false; 5];
        want[4] = true;
        let mut next = vec![feed(&prompt, &want)[0], 3, 4];
        feed(&[tok(1, 2, 0), tok(2, 5, 0)], &[false, false]);
        let mut len = [5u32, 1, 1];
        for _ in 0..4 {
            let batch: Vec<BatchToken> = (0..3).map(|q| tok(q, next[q], len[q])).collect();
            next = feed(&batch, &[true; 3]);
            for l in &mut len {
                *l += 1;
            }
        }
        let c0 = counters::read_thread();
        let batch: Vec<BatchToken> = (0..3).map(|q| tok(q, next[q], len[q])).collect();
        replayed.forward(&batch, &[true; 3]).unwrap();
        let c1 = counters::read_thread();
        direct.forward(&batch, &[true; 3]).unwrap();
        let c2 = counters::read_thread();
        if let (Some(c0), Some(c1), Some(c2)) = (c0, c1, c2) {
            let g = c1.since(&c0);
            assert_eq!(
                (g.graph_launches, g.kernel_launches),
                (1, 0),
                "a replayed step"
            );
            let d = c2.since(&c1);
            assert_eq!(d.graph_launches, 0, "an uncaptured step");
            assert_eq!(g.graph_kernels, d.kernel_launches, "the same kernels");
            assert_eq!(
                d.kernel_launches as usize,
                4 * spec.n_layer + 3,
                "kernels per step"
            );
        }
    }
}

fn argmaxes(logits: &[f32], nv: usize) -> Vec<i32> {
    logits
        .chunks(nv)
        .map(|r| {
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                if v > r[best] {
                    best = i;
                }
            }
            best as i32
        })
        .collect()
}
