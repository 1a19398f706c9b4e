//! The forward pass on a CUDA GPU: the same pass as [`super::cpu::CpuPass`], on
//! `inferloop-kernels`' CUDA kernels, which give their twins' bits. Weights are copied to
//! GPU memory once ([`memory`]), the KV cache lives there ([`DeviceKv`]), and each pass
//! uploads its tokens, positions, cells and wanted rows in one copy, runs its kernels
//! ([`step`]: four per layer, those of `layer.cu`) as one CUDA graph ([`graph`]),
//! and downloads only the logits rows asked for.
//!
//! On a Jetson, GPU memory is the same DRAM as the CPU's: the ledger counts the copy as
//! device memory, and the file's pages, read once to upload, can be dropped by the kernel.

mod graph;
mod kv;
mod memory;
mod step;

use inferloop_kernels::cuda::Gpu;

use super::batch::{Activations, BatchToken, UBATCH};
use super::error::NativeError;
use super::hparams::HParams;
use super::kv::{Kv, KvCache};
use super::pass::{check_micro_batch, check_open, Pass};
use super::weights::Weights;
use graph::Graphs;
use memory::{alloc_scratch, op, upload_weights, DevScratch, DevWeights, Input};
use step::Shape;

pub use graph::GRAPHS_ENV;
pub use kv::DeviceKv;

/// The CUDA pass: the GPU, the weights and scratch in its memory, and the KV cache there.
pub struct CudaPass {
    gpu: Gpu,
    hp: HParams,
    w: DevWeights,
    s: DevScratch,
    kv: KvCache<DeviceKv>,
    graphs: Graphs,
    /// The inputs of a pass as uploaded: [`Input`] parts of [`UBATCH`] each.
    inputs: Vec<i32>,
    /// Bytes of GPU memory the weights and scratch take (the KV cache is counted apart).
    bytes: usize,
}

impl CudaPass {
    /// Uploads `weights` (loaded for `hp`) to `gpu` and allocates the pass's scratch and a
    /// KV cache of `n_seq` sequences × `n_ctx` cells there. The pass runs on a stream of its
    /// own (CUDA cannot capture the legacy default stream), and in that stream's order
    /// alone: cudarc's events between streams are turned off for the GPU's context.
    pub fn new(
        mut gpu: Gpu,
        hp: &HParams,
        weights: &Weights<'_>,
        n_seq: usize,
        n_ctx: usize,
    ) -> Result<Self, NativeError> {
        check_open(hp, weights, n_seq, n_ctx)?;
        // SAFETY: every allocation, copy and launch of this context's objects below and in
        // the pass goes to this one stream, so its order is all the synchronisation needed.
        unsafe { gpu.ctx.disable_event_tracking() };
        gpu.stream = gpu.ctx.new_stream().map_err(op(None, "stream"))?;
        let st = gpu.stream.clone();
        let (w, weight_bytes) = upload_weights(&st, weights)?;
        let (s, scratch_bytes) = alloc_scratch(&st, hp, n_ctx)?;
        let cells = DeviceKv::new(&st, hp.n_layer, n_seq, n_ctx, hp.kv_dim())?;
        st.synchronize().map_err(op(None, "upload"))?;
        Ok(Self {
            gpu,
            hp: hp.clone(),
            w,
            s,
            kv: KvCache::new(hp.n_layer, n_seq, n_ctx, hp.kv_dim(), cells),
            graphs: Graphs::from_env(),
            inputs: vec![0; Input::COUNT * UBATCH],
            bytes: weight_bytes + scratch_bytes,
        })
    }

    /// Turns CUDA graphs on or off (on unless [`GRAPHS_ENV`] is `0`); both give the same bits.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set(on);
    }

    /// Whether passes replay CUDA graphs (off after a capture the driver refused).
    pub fn graphs(&self) -> bool {
        self.graphs.on()
    }
}

impl Pass for CudaPass {
    fn run(
        &mut self,
        toks: &[BatchToken],
        want: &[bool],
        logits: &mut [f32],
    ) -> Result<(), NativeError> {
        check_micro_batch(toks, want)?;
        let Self {
            gpu,
            w,
            s,
            hp,
            kv,
            graphs,
            inputs,
            ..
        } = self;
        let n_ctx = kv.n_ctx();
        let st = gpu.stream.clone();
        let n = toks.len();
        let mut m = 0;
        for (i, (t, &wanted)) in toks.iter().zip(want).enumerate() {
            let at = |part: Input| part as usize * UBATCH + i;
            inputs[at(Input::Tokens)] = t.token;
            inputs[at(Input::Pos)] = t.pos as i32;
            inputs[at(Input::Cells)] = (t.seq * n_ctx) as i32 + t.pos as i32;
            if wanted {
                inputs[Input::Rows as usize * UBATCH + m] = i as i32;
                m += 1;
            }
        }
        st.memcpy_htod(&inputs[..], &mut s.inputs)
            .map_err(op(None, "upload batch"))?;
        let g = &*gpu;
        let cells = kv.cells_mut();
        graphs.run(&st, Shape { n, m }, || {
            step::launch(g, hp, w, s, cells, n_ctx, Shape { n, m })
        })?;
        if m > 0 {
            let nv = hp.n_vocab;
            st.memcpy_dtoh(&s.logits.slice(..m * nv), &mut logits[..m * nv])
                .map_err(op(None, "download logits"))?;
        }
        st.synchronize().map_err(op(None, "sync"))?;
        kv.hold(toks);
        Ok(())
    }

    fn kv(&self) -> &dyn Kv {
        &self.kv
    }

    fn kv_mut(&mut self) -> &mut dyn Kv {
        &mut self.kv
    }

    fn set_activations(&mut self, activations: Activations) -> Result<(), NativeError> {
        match activations {
            Activations::Q8 => Ok(()),
            Activations::F32 => Err(NativeError::Unsupported(
                "the CUDA pass multiplies Q8 activations only (--activations q8)".into(),
            )),
        }
    }

    fn gpu(&self) -> Option<(&str, usize)> {
        Some((&self.gpu.name, self.bytes))
    }
}

#[cfg(test)]
mod tests;
