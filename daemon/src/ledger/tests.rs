//! Unit tests of the ledger: each backend's terms against llama.cpp's figures and the
//! measured peaks, the margin, the decision and its series.

use super::*;
use crate::engine::plan::PlanSpec;
use crate::engine::select::BackendKind;

/// SmolLM2-135M as its GGUF header describes it.
fn smollm2() -> ModelShape {
    ModelShape {
        architecture: "llama".into(),
        n_layer: 30,
        n_embd: 576,
        n_head: 9,
        n_head_kv: 3,
        head_dim_k: 64,
        head_dim_v: 64,
        n_ff: 1536,
        n_vocab: 49152,
        n_ctx_train: 8192,
        tensor_bytes: 96_576_768,
        file_bytes: 98_362_432,
    }
}

fn spec(slots: usize, ctx: u32) -> PlanSpec {
    PlanSpec {
        prefix_slots: Some(0),
        ..PlanSpec::new(slots, ctx)
    }
}

fn plan(slots: usize, ctx: u32) -> EnginePlan {
    EnginePlan::new(spec(slots, ctx)).expect("valid plan")
}

fn unspeculative(slots: usize, ctx: u32) -> EnginePlan {
    EnginePlan::new(PlanSpec {
        spec: crate::config::Spec::Off,
        ..spec(slots, ctx)
    })
    .expect("valid plan")
}

fn llama() -> Selection {
    Selection {
        backend: BackendKind::LlamaCpp,
        device: Device::Cpu,
        gpu: None,
        why: String::new(),
        gpu_error: None,
    }
}

fn native(device: Device) -> Selection {
    Selection {
        backend: BackendKind::Native,
        device,
        gpu: None,
        why: String::new(),
        gpu_error: None,
    }
}

/// The ledger of `selection` for `plan` with the default margin.
fn ledger_of(selection: &Selection, plan: &EnginePlan) -> Ledger {
    Ledger::new(selection.footprint(&smollm2(), plan), None)
}

fn compute(plan: &EnginePlan) -> Ledger {
    ledger_of(&llama(), plan)
}

#[test]
fn kv_term_matches_llama_cpp_for_the_default_model() {
    // llama.cpp reports "KV buffer size = 45.00 MiB" at n_ctx 2048 and 180 MiB at 8192.
    assert_eq!(compute(&plan(1, 2048)).term("kv"), 45 << 20);
    assert_eq!(compute(&plan(4, 2048)).term("kv"), 180 << 20);
    assert_eq!(compute(&plan(1, 8192)).term("kv"), 180 << 20);
}

fn typed(slots: usize, ctx: u32, kv_type: &str) -> EnginePlan {
    EnginePlan::new(PlanSpec {
        kv_type: kv_type.parse().expect("a KV type"),
        ..spec(slots, ctx)
    })
    .expect("valid plan")
}

#[test]
fn kv_term_matches_llama_cpp_for_each_kv_type() {
    // llama.cpp's "CPU KV buffer size" (two decimals, MiB) on the default model, served
    // with --kv-type at slots x ctx; the exact bytes are cells x 30 layers x (K + V rows):
    // a row of 192 elements is 384 B in f16, 6 q8_0 blocks of 34 B, 6 q4_0 blocks of 18 B.
    for (kv_type, slots, ctx, bytes, reported) in [
        ("f16", 1, 2048, 2048 * 30 * (384 + 384), 45.00),
        ("q8_0", 1, 2048, 2048 * 30 * (204 + 204), 23.91),
        ("q8_0", 4, 1024, 4096 * 30 * (204 + 204), 47.81),
        ("q8_0", 1, 1000, 1024 * 30 * (204 + 204), 11.95),
        ("q4_0", 1, 2048, 2048 * 30 * (108 + 108), 12.66),
        ("q8_0,f16", 1, 2048, 2048 * 30 * (204 + 384), 34.45),
        ("q4_0,q8_0", 2, 512, 1024 * 30 * (108 + 204), 9.14),
    ] {
        let kv = compute(&typed(slots, ctx, kv_type)).term("kv");
        assert_eq!(kv, bytes, "{kv_type} {slots} x {ctx}");
        let mib = kv as f64 / MIB;
        assert!(
            (mib - reported).abs() < 0.005,
            "{kv_type} {slots} x {ctx}: {mib:.3} MiB, llama.cpp says {reported}"
        );
    }
}

#[test]
fn q8_0_kv_holds_nearly_twice_the_cells_of_f16_in_the_same_bytes() {
    let shape = smollm2();
    let f16 = crate::engine::footprint::kv_cell_bytes(&shape, "f16".parse().expect("type"));
    let q8 = crate::engine::footprint::kv_cell_bytes(&shape, "q8_0".parse().expect("type"));
    let q4 = crate::engine::footprint::kv_cell_bytes(&shape, "q4_0".parse().expect("type"));
    assert_eq!((f16, q8, q4), (23_040, 12_240, 6_480));
    // 32 elements: 64 B in f16, 34 in q8_0, 18 in q4_0.
    assert!((f16 as f64 / q8 as f64 - 64.0 / 34.0).abs() < 1e-12);
    assert!((f16 as f64 / q4 as f64 - 64.0 / 18.0).abs() < 1e-12);
}

#[test]
fn a_saved_prefix_is_sized_in_the_kv_type() {
    let shape = smollm2();
    // A full context of cells, each with llama.cpp's 16 B of position and sequence.
    for (kv_type, per_cell) in [("f16", 23_040), ("q8_0", 12_240), ("q4_0", 6_480)] {
        let p = typed(1, 1024, kv_type);
        assert_eq!(
            prompt_cache_entry_bytes(&shape, &p),
            1024 * (per_cell + 16),
            "{kv_type}"
        );
    }
}

#[test]
fn the_embeddings_context_keeps_its_cells_in_the_kv_type() {
    let f16 = compute(&typed(1, 2048, "f16")).term("embeddings");
    let q8 = compute(&typed(1, 2048, "q8_0")).term("embeddings");
    assert_eq!(f16 - q8, 2048 * 30 * 2 * (384 - 204));
}

#[test]
fn weights_are_counted_once_however_many_slots() {
    let one = compute(&plan(1, 1024));
    let eight = compute(&plan(8, 1024));
    assert_eq!(one.term("weights"), eight.term("weights"));
    assert_eq!(eight.term("kv"), 8 * one.term("kv"));
}

#[test]
fn oversubscribed_kv_is_sized_by_its_cells() {
    let pooled = |prefix_slots| {
        EnginePlan::new(PlanSpec {
            kv_cells: Some(2048),
            prefix_slots: Some(prefix_slots),
            ..spec(4, 2048)
        })
        .expect("valid plan")
    };
    let p = pooled(0);
    assert!(p.shared_kv);
    assert_eq!(compute(&p).term("kv"), 45 << 20);
    let p = pooled(4);
    assert_eq!(
        compute(&p).term("kv"),
        45 << 20,
        "prefix slots hold cells of the pool"
    );
}

#[test]
fn each_prefix_slot_is_a_stream_more_without_a_shared_pool() {
    let p = EnginePlan::new(PlanSpec {
        prefix_slots: Some(2),
        ..spec(4, 2048)
    })
    .expect("valid plan");
    assert_eq!(compute(&p).term("kv"), 6 * (45 << 20));
}

#[test]
fn reserved_compute_is_close_to_llama_cpp_figure() {
    // llama.cpp's "CPU compute buffer size" for slots x ctx (n_ubatch 512, flash attention,
    // non-unified KV: the reservation follows each sequence's context, not the slots).
    for (slots, ctx, reported) in [
        (1, 512, 102.14),
        (1, 2048, 104.77),
        (4, 1024, 103.77),
        (2, 2048, 104.77),
        (4, 2048, 104.77),
        (1, 8192, 109.64),
    ] {
        let l = compute(&plan(slots, ctx));
        let mib = l.compute_reserved_bytes as f64 / MIB;
        assert!(
            (mib - reported).abs() / reported < 0.03,
            "{slots} x {ctx}: {mib} vs {reported}"
        );
    }
}

/// Worst case measured with `bench/memory.py` on SmolLM2-135M Q4_1, 2 threads: every slot
/// holding a prompt that nearly fills its context, prefilled in 512-token micro-batches
/// next to the other slots' decode steps. `touched`: anonymous pages that appeared in
/// llama.cpp's compute buffer during the run (from /proc/PID/pagemap); `peak`: VmHWM.
/// Measured before speculation existed: the plans below leave it off.
const MEASURED: [(usize, u32, f64, f64); 5] = [
    (1, 512, 11.4, 148.5),
    (4, 1024, 13.4, 234.1),
    (2, 2048, 14.2, 232.9),
    (4, 2048, 14.4, 325.9),
    (1, 8192, 18.9, 328.2),
];

#[test]
fn compute_term_bounds_what_the_worst_case_touches_within_the_reservation() {
    for (slots, ctx, touched, _) in MEASURED {
        let l = compute(&unspeculative(slots, ctx));
        let mib = l.term("compute") as f64 / MIB;
        assert!(
            touched <= mib,
            "{slots} x {ctx}: {touched} MiB touched, {mib:.1} charged"
        );
        assert!(
            touched / mib > 0.6,
            "{slots} x {ctx}: {mib:.1} MiB charged for {touched} touched"
        );
        assert!(l.term("compute") <= l.compute_reserved_bytes);
    }
}

#[test]
fn speculation_charges_a_verifications_logits_rows() {
    // A verification outputs 1 + MAX_DRAFT rows per slot; the touched compute holds them
    // in both of the graph allocator's layouts.
    let rows = u64::from(crate::engine::plan::MAX_DRAFT);
    let row = 4 * smollm2().n_vocab;
    for slots in [1, 4] {
        let (on, off) = (
            compute(&plan(slots, 1024)),
            compute(&unspeculative(slots, 1024)),
        );
        assert_eq!(
            on.term("compute") - off.term("compute"),
            2 * row * rows * slots as u64
        );
        assert_eq!(on.compute_reserved_bytes, off.compute_reserved_bytes);
    }
}

#[test]
fn expected_peak_without_the_margin_bounds_the_measured_worst_case() {
    for (slots, ctx, _, peak) in MEASURED {
        let l = compute(&unspeculative(slots, ctx));
        // MEASURED drove no constrained requests and no embeddings: those terms stay
        // untouched.
        let untouched = l.term("constraint") + l.term("embeddings");
        let expected = (l.expected_peak() - untouched) as f64 / MIB;
        let ratio = peak / expected;
        assert!(
            (0.9..=1.0).contains(&ratio),
            "{slots} x {ctx}: peak {peak} MiB, expected {expected:.1} MiB ({ratio:.3})"
        );
    }
}

#[test]
fn margin_defaults_to_five_percent() {
    let l = compute(&plan(4, 2048));
    let rest = l.expected_peak();
    assert_eq!(l.term("margin"), (rest / 20).max(16 << 20));
    assert_eq!(l.total(), rest + l.term("margin"));
}

fn limit(source: LimitSource, mb: u64) -> Limit {
    Limit {
        source,
        bytes: mb << 20,
        from: "test".into(),
    }
}

#[test]
fn tightest_limit_decides_and_is_named() {
    let d = Decision::new(
        smollm2(),
        None,
        &plan(4, 2048),
        &llama(),
        0,
        None,
        vec![
            limit(LimitSource::MemAvailable, 20_000),
            limit(LimitSource::CgroupV1, 200),
        ],
    );
    assert!(!d.fits);
    let line = d.accounting();
    assert!(
        line.starts_with("reason=cgroup-limit requiredMB="),
        "{line}"
    );
    for key in [
        "limitMB=200.0",
        "weightsMB=",
        "kvMB=180.0",
        "computeMB=",
        "overheadMB=",
        "marginMB=",
    ] {
        assert!(line.contains(key), "{key} missing in {line}");
    }
}

#[test]
fn no_limit_fits() {
    let d = Decision::new(smollm2(), None, &plan(1, 1024), &llama(), 0, None, vec![]);
    assert!(d.fits);
    assert!(d.accounting().starts_with("reason=no-limit"));
}

#[test]
fn metrics_name_every_term_and_limit() {
    let d = Decision::new(
        smollm2(),
        None,
        &plan(1, 1024),
        &llama(),
        1024,
        None,
        vec![limit(LimitSource::CgroupV2, 4096)],
    );
    let out = crate::metrics::text::render(move |w| d.render_metrics(w));
    for t in [
        "weights",
        "kv",
        "compute",
        "overhead",
        "constraint",
        "embeddings",
        "connections",
        "margin",
        "total",
    ] {
        assert!(out.contains(&format!("inferloop_memory_required_bytes{{term=\"{t}\"}}")));
    }
    assert!(out.contains("inferloop_memory_limit_bytes{source=\"cgroup-v2\"} 4294967296"));
    for help in [
        "# HELP inferloop_memory_required_bytes Memory ledger terms computed at cold load.\n",
        "# HELP inferloop_memory_limit_bytes Memory limits that apply to the process.\n",
    ] {
        assert!(out.contains(help), "{out}");
    }
}

#[test]
fn native_terms_are_weights_kv_per_sequence_scratch_and_overhead() {
    let l = ledger_of(&native(Device::Cpu), &plan(2, 1000));
    let names: Vec<&str> = l.terms.iter().map(|t| t.name).collect();
    assert_eq!(names, ["weights", "kv", "scratch", "overhead", "margin"]);
    assert_eq!(l.term("weights"), 96_576_768);
    // 30 layers x 2 sequences x 1000 positions (unpadded) x 3 kv heads x (64+64) x 2 B.
    assert_eq!(l.term("kv"), 30 * 2 * 1000 * 3 * 128 * 2);
    let scratch = l.term("scratch");
    assert!((1 << 20..16 << 20).contains(&scratch), "{scratch}");
    // A limit below the total refuses with the accounting line naming the native terms.
    let d = Decision::new(
        smollm2(),
        None,
        &plan(2, 1000),
        &native(Device::Cpu),
        0,
        None,
        vec![limit(LimitSource::CgroupV2, 100)],
    );
    assert!(!d.fits);
    assert!(d.accounting().contains(" scratchMB="), "{}", d.accounting());
}

#[test]
fn native_on_cuda_counts_the_gpu_copies_in_the_same_memory() {
    let (cpu, gpu) = (
        ledger_of(&native(Device::Cpu), &plan(2, 1000)),
        ledger_of(&native(Device::Cuda), &plan(2, 1000)),
    );
    assert_eq!(gpu.term("weights"), cpu.term("weights"));
    assert_eq!(gpu.term("kv"), cpu.term("kv"));
    // The pass's activations and its logits rows on the GPU besides the host's.
    assert!(gpu.term("scratch") > cpu.term("scratch"));
    let detail = |l: &Ledger, name| {
        l.terms
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.detail.clone())
            .unwrap_or_default()
    };
    assert!(detail(&gpu, "weights").contains("GPU memory"));
    assert!(detail(&gpu, "kv").ends_with("in GPU memory"));
    assert!(!detail(&cpu, "kv").contains("GPU"));
}

/// The connection cap reserves memory for every connection it lets in: counted in what must
/// fit, not in the peak a box serving its clients reaches.
#[test]
fn the_connection_cap_is_reserved_but_not_expected() {
    let none = Decision::new(smollm2(), None, &plan(1, 1024), &llama(), 0, None, vec![]);
    let cap = Decision::new(
        smollm2(),
        None,
        &plan(1, 1024),
        &llama(),
        1024,
        None,
        vec![],
    );
    let reserve = 1024 * crate::http::limits::CONNECTION_BYTES;
    assert_eq!(cap.ledger.term("connections"), reserve);
    assert_eq!(none.ledger.term("connections"), 0);
    assert_eq!(cap.expected_peak_bytes, none.expected_peak_bytes);
    assert!(cap.required_bytes >= none.required_bytes + reserve);
}
