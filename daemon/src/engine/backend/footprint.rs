//! What each backend needs in memory for a plan, term by term, from the GGUF header: the
//! ledger adds its margin and decides against the limits. Asked through
//! [`super::select::Selection::footprint`], so the ledger never asks which backend serves.

use serde::Serialize;

use super::llama_embed::EMBED_BATCH;
use super::native::forward::UBATCH;
use super::seam::Device;
use crate::config::{KvType, KvTypes};
use crate::engine::plan::{EnginePlan, MAX_DRAFT};
use inferloop_gguf::ModelShape;

const MIB: f64 = 1024.0 * 1024.0;

/// Process memory that is not weights, KV or compute: binary, allocator, async runtime,
/// llama.cpp's tokenizer tables. Measured with `bench/memory.py` on the default model.
const OVERHEAD_BASE: u64 = 30 << 20;
const OVERHEAD_PER_VOCAB_TOKEN: u64 = 160;
/// Each slot's sampler chain keeps a candidate array over the vocabulary (`llama_token_data`,
/// 12 B) plus its working copy: measured as ~0.8 MiB per slot on a 49,152-token vocabulary.
const OVERHEAD_PER_SLOT_VOCAB_TOKEN: u64 = 16;
/// Constrained decoding (llguidance, llama.cpp backend only): the parser factory built on the
/// first constrained request walks the vocabulary into a token trie and its slices, and each
/// running constrained sequence holds a parser with its lexer caches. Measured on the
/// default model (49,152 tokens): +20.5 MB at the first request (417 B a token), then
/// +4–6 MB for four concurrent ones and ~0.1 MB per further request settling.
const CONSTRAINT_PER_VOCAB_TOKEN: u64 = 448;
const CONSTRAINT_PER_SLOT: u64 = 3 << 20;
/// A second llama.cpp context's fixed allocations (graph and scheduler metadata, its
/// threadpool): measured as ~2.5 MiB on the default model.
const EMBED_CONTEXT_OVERHEAD: u64 = 3 << 20;
/// llama.cpp rounds each sequence's context up to this many cells.
const KV_PAD: u64 = 256;

/// One named line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Term {
    pub name: &'static str,
    pub bytes: u64,
    pub detail: String,
}

/// A backend's terms for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Footprint {
    pub terms: Vec<Term>,
    /// What the backend reserves for computing (llama.cpp's "CPU compute buffer size", the
    /// native forward's scratch); the `compute` term is the part the worst case touches.
    pub compute_reserved_bytes: u64,
}

/// Bytes of one KV cell: a K row and a V row of every layer, in the plan's types. ggml
/// stores a row as whole blocks (f16: 2 B an element; q8_0: 34 B per 32; q4_0: 18 B per
/// 32), with no padding between rows; each layer's K and V are one tensor of `cells` rows
/// whose size is a multiple of the CPU buffer's 32-byte alignment whenever `cells` is a
/// multiple of [`KV_PAD`], so llama.cpp's "KV buffer size" is exactly `cells` times this.
pub fn kv_cell_bytes(shape: &ModelShape, types: KvTypes) -> u64 {
    shape.n_layer
        * (types.k.row_bytes(shape.n_head_kv * shape.head_dim_k)
            + types.v.row_bytes(shape.n_head_kv * shape.head_dim_v))
}

/// The `kv` term's detail: what one cell holds.
fn kv_cell_detail(shape: &ModelShape, types: KvTypes) -> String {
    let row = |t: KvType, dim: u64| {
        let elements = shape.n_head_kv * dim;
        format!("{} {t} = {} B", elements, t.row_bytes(elements))
    };
    format!(
        "{} layers x (K {} + V {})",
        shape.n_layer,
        row(types.k, shape.head_dim_k),
        row(types.v, shape.head_dim_v)
    )
}

/// llama.cpp on the CPU: the mapped weights, its KV cache in the plan's types (padded per
/// sequence, or the shared pool), the compute buffer its worst case touches, and the
/// process overhead.
pub fn llama_cpp(shape: &ModelShape, plan: &EnginePlan) -> Footprint {
    let u = u64::from(plan.n_ubatch);
    let slots = plan.slots as u64;
    let per_slot = u64::from(plan.ctx).div_ceil(KV_PAD) * KV_PAD;
    let cells = if plan.shared_kv {
        u64::from(plan.kv_cells).div_ceil(KV_PAD) * KV_PAD
    } else {
        per_slot * plan.sequences() as u64
    };
    let per_cell = kv_cell_bytes(shape, plan.kv_type);
    let kv = cells * per_cell;
    let ctx_seq = per_slot.min(cells);
    // One micro-batch's graph: FFN gate/up (f32) and the residual, and the f16 attention
    // mask over the sequence's context. llama.cpp reserves its compute buffer for that
    // graph plus logits for every token of the micro-batch (n_ubatch × n_vocab).
    let activations = 4 * u * (2 * shape.n_ff + shape.n_embd) + 2 * u * ctx_seq;
    // A decode step outputs one row per slot; a verification one per drafted token too.
    let rows = if plan.spec.enabled() {
        1 + u64::from(MAX_DRAFT)
    } else {
        1
    };
    let logits = 4 * shape.n_vocab * slots * rows;
    let compute_reserved = 4 * u * shape.n_vocab + activations + 4 * shape.n_vocab * slots;
    // What the worst case (every slot full, full prefill micro-batches next to decode
    // steps) touches. inferloopd never asks for prompt logits, so at most one logits row
    // per slot is written (1 + MAX_DRAFT with speculation: a verification's rows), in the
    // graph and in llama.cpp's output buffer. But the graph
    // allocator lays out a prefill step and a decode step differently (it re-plans when
    // the graph changes), and the freed FFN tensors of the reserved layout sit where its
    // logits go: a full micro-batch's activations land at two sets of offsets, and pages
    // once touched stay resident. Charging one layout undercounted the measured peak by
    // 5.7 MiB at 4 slots × 2048 (issue 10); two layouts bound the 11–19 MiB measured
    // from 1 × 512 to 1 × 8192 with 24–38% to spare, and never exceed the reservation.
    let compute = (2 * activations + 2 * logits).min(compute_reserved);
    let overhead = OVERHEAD_BASE
        + OVERHEAD_PER_VOCAB_TOKEN * shape.n_vocab
        + OVERHEAD_PER_SLOT_VOCAB_TOKEN * shape.n_vocab * slots;
    let constraint = CONSTRAINT_PER_VOCAB_TOKEN * shape.n_vocab + CONSTRAINT_PER_SLOT * slots;
    let embeddings = embeddings_context(shape, per_slot, per_cell);
    let weights = shape.tensor_bytes;
    Footprint {
        terms: vec![
            Term {
                name: "weights",
                bytes: weights,
                detail: format!(
                    "{} tensor bytes, mapped once for all slots",
                    shape.architecture
                ),
            },
            Term {
                name: "kv",
                bytes: kv,
                detail: format!("{cells} cells x {}", kv_cell_detail(shape, plan.kv_type)),
            },
            Term {
                name: "compute",
                bytes: compute,
                detail: format!(
                    "micro-batch {u} activations in two layouts + logits for {} slots x {rows} rows (llama.cpp reserves {:.1} MiB)",
                    slots,
                    compute_reserved as f64 / MIB
                ),
            },
            Term {
                name: "overhead",
                bytes: overhead,
                detail: format!(
                    "runtime, allocator, tokenizer tables, samplers for {} slots (measured)",
                    slots
                ),
            },
            Term {
                name: "constraint",
                bytes: constraint,
                detail: format!(
                    "structured output: llguidance's token trie over {} tokens, a parser per slot (measured)",
                    shape.n_vocab
                ),
            },
            Term {
                name: "embeddings",
                bytes: embeddings,
                detail: format!(
                    "/v1/embeddings: its own llama.cpp context, one sequence of {per_slot} cells, {EMBED_BATCH}-token batches whose every token is an output"
                ),
            },
        ],
        compute_reserved_bytes: compute_reserved,
    }
}

/// A draft model's own lines (`--spec draft`): its mapped weights, and its llama.cpp
/// context sized by [`EnginePlan::draft_plan`] (a pool of `slots × ctx` cells in the plan's
/// KV types, its compute buffer as [`llama_cpp`] reckons one, and a context's fixed
/// allocations).
pub fn draft(shape: &ModelShape, plan: &EnginePlan) -> Vec<Term> {
    let plan = plan.draft_plan();
    let own = llama_cpp(shape, &plan);
    let term = |name| {
        own.terms
            .iter()
            .find(|t| t.name == name)
            .map_or(0, |t| t.bytes)
    };
    let context = term("kv") + term("compute") + EMBED_CONTEXT_OVERHEAD;
    vec![
        Term {
            name: "draft_weights",
            bytes: term("weights"),
            detail: format!("{} tensor bytes of the draft model", shape.architecture),
        },
        Term {
            name: "draft_context",
            bytes: context,
            detail: format!(
                "the draft model's llama.cpp context: {} cells x {} B, its compute buffer and fixed allocations",
                u64::from(plan.kv_cells).div_ceil(KV_PAD) * KV_PAD,
                kv_cell_bytes(shape, plan.kv_type)
            ),
        },
    ]
}

/// llama.cpp's embeddings context (made at the first embedding request, see
/// `llama_embed`): the KV cells of one sequence of the slots' context, the output buffer
/// (logits and hidden state for every token of a batch: llama.cpp outputs them all when
/// embeddings are on), its compute buffer for a batch of that size (the mask over the
/// context in three layouts), and the context's own allocations. Measured on the default
/// model, RSS after the first embedding of a full context minus before: +37.7, +60.3 and
/// +105.9 MiB at ctx 1024, 2048 and 4096; this gives 38.2, 60.9 and 106.3.
fn embeddings_context(shape: &ModelShape, cells: u64, per_cell: u64) -> u64 {
    let u = u64::from(EMBED_BATCH);
    let kv = cells * per_cell;
    let output = 4 * u * (shape.n_vocab + shape.n_embd);
    let compute = 4 * u * shape.n_vocab + 4 * u * (2 * shape.n_ff + shape.n_embd) + 6 * u * cells;
    kv + output + compute + EMBED_CONTEXT_OVERHEAD
}

/// The native backend: the mapped weights, an f16 KV cache of `ctx` positions for every
/// sequence (no padding, no shared pool), the forward's fixed scratch, and the same
/// process overhead (llama.cpp still holds the tokenizer tables).
pub fn native(shape: &ModelShape, plan: &EnginePlan, device: Device) -> Footprint {
    let sequences = plan.sequences() as u64;
    let ctx = u64::from(plan.ctx);
    let kv_dim2 = shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v);
    // Always f16: the native backend refuses other KV types at boot (`check_plan`).
    let kv = sequences * ctx * kv_cell_bytes(shape, KvTypes::F16);
    let u = UBATCH as u64;
    let q_dim = shape.n_head * shape.head_dim_k;
    // Per pass row: the residual and its normalized copy, the attention output's
    // projection, Q and the attention result, K and V, and the FFN gate, up and product.
    let rows = 4 * u * (3 * shape.n_embd + 2 * q_dim + kv_dim2 + 3 * shape.n_ff);
    // Attention scores for one head over the context, per token of a pass.
    let attention = 4 * u * shape.n_head * ctx.min(256);
    // A logits row per sampling sequence, and each sampler's copies of it.
    let logits = 4 * shape.n_vocab * sequences;
    let samplers = 12 * shape.n_vocab * plan.slots as u64;
    // On CUDA the pass's activations live on the GPU too, with a logits row per pass
    // token to copy back from.
    let gpu = match device {
        Device::Cpu => 0,
        Device::Cuda => rows + 4 * u * shape.n_vocab,
    };
    let scratch = rows + attention + logits + samplers + gpu;
    let overhead = OVERHEAD_BASE + OVERHEAD_PER_VOCAB_TOKEN * shape.n_vocab;
    let weights = shape.tensor_bytes;
    let (weights_where, kv_where) = match device {
        Device::Cpu => ("mapped once by the native backend", ""),
        Device::Cuda => (
            "copied once to GPU memory (on a Jetson the same DRAM; the file's mapped pages \
             are cache the kernel can drop)",
            ", in GPU memory",
        ),
    };
    Footprint {
        terms: vec![
            Term {
                name: "weights",
                bytes: weights,
                detail: format!("{} tensor bytes, {weights_where}", shape.architecture),
            },
            Term {
                name: "kv",
                bytes: kv,
                detail: format!(
                    "{sequences} sequences x {} ctx x {}{kv_where}",
                    plan.ctx,
                    kv_cell_detail(shape, KvTypes::F16)
                ),
            },
            Term {
                name: "scratch",
                bytes: scratch,
                detail: format!(
                    "native forward: {u}-token passes, attention, logits and samplers for {sequences} sequences"
                ),
            },
            Term {
                name: "overhead",
                bytes: overhead,
                detail: "runtime, allocator, tokenizer tables".into(),
            },
        ],
        compute_reserved_bytes: scratch,
    }
}
