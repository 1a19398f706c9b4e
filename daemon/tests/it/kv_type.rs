//! `--kv-type` on the real model: a q8_0 KV cache serves sensible answers, reuses prompt
//! prefixes, its ledger term is llama.cpp's own KV buffer and the resident set follows it;
//! the prompt cache's disk tier never restores an f16 run's entries into a q8_0 run; the
//! native backend refuses a quantized type before it loads anything.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{metric_or_zero as series, text_of, Daemon, SETTLE};
use crate::tiers::{start_on, stop};

const MIB: f64 = 1024.0 * 1024.0;

/// A system prompt over 64 tokens (long enough to be reused and saved) and a question the
/// default model answers with one word.
fn paris() -> Value {
    let mut system = String::from("You are a helpful assistant. Answer in one short sentence. ");
    for i in 0..12 {
        system.push_str(&format!("Rule {}: be accurate and brief. ", i + 1));
    }
    json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Name the capital city of France."},
        ],
        "max_tokens": 24,
        "temperature": 0,
    })
}

fn term(status: &Value, name: &str) -> u64 {
    status["memory"]["terms"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .and_then(|t| t["bytes"].as_u64())
        .unwrap_or_else(|| panic!("no {name} term in {}", status["memory"]))
}

/// llama.cpp's "CPU KV buffer size = N MiB" line (info level), in MiB.
fn llama_kv_buffer_mib(log: &str) -> f64 {
    log.lines()
        .find_map(|l| {
            let rest = l.split("KV buffer size =").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no KV buffer line in the log:\n{log}"))
}

/// Peak RSS after answering [`paris`] twice, and the status.
async fn serve_twice(kv_type: &str) -> (f64, Value, Vec<(String, u64)>) {
    let d = Daemon::try_start_with_env(
        &["--slots", "2", "--ctx", "2048", "--kv-type", kv_type],
        &[("RUST_LOG", "info")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut answers = Vec::new();
    for _ in 0..2 {
        let v = d.chat(&paris()).await;
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens");
        answers.push((text_of(&v), cached));
    }
    let status = d.status().await;
    let peak = status["memory"]["peak_rss_bytes"].as_u64().expect("peak") as f64 / MIB;
    let buffer = llama_kv_buffer_mib(&d.log());
    let kv = term(&status, "kv") as f64 / MIB;
    assert!(
        (buffer - kv).abs() < 0.005,
        "{kv_type}: llama.cpp's KV buffer {buffer} MiB, the ledger's kv term {kv:.3} MiB"
    );
    if kv_type != "f16" {
        assert!(
            d.log().contains("flash_attn            = enabled"),
            "a quantized V runs under flash attention:\n{}",
            d.log_tail()
        );
    }
    (peak, status, answers)
}

#[tokio::test]
async fn q8_0_kv_serves_reuses_prefixes_and_its_ledger_and_rss_follow_the_smaller_cells() {
    let (peak_q8, status, answers) = serve_twice("q8_0").await;
    assert_eq!(status["kv"]["type"], json!({"k": "q8_0", "v": "q8_0"}));
    // 30 layers x (K + V): 192 elements a row, 6 blocks of 34 B each.
    assert_eq!(status["kv"]["cell_bytes"], 30 * 2 * 204);
    assert_eq!(term(&status, "kv"), 4096 * 30 * 2 * 204);
    for (text, _) in &answers {
        assert!(text.contains("Paris"), "{answers:?}");
    }
    assert!(
        answers[1].1 > 64,
        "the second request reused the quantized prefix: {answers:?}"
    );

    // The same daemon with f16 cells: the resident sets differ by what the ledger's KV
    // terms (the slots' cells and the embeddings context's, which stays unmade) say the
    // cells take. llama.cpp clears its KV buffer at start, so every page of it is resident.
    let (peak_f16, f16, _) = serve_twice("f16").await;
    let ledger_diff = (term(&f16, "kv") - term(&status, "kv")) as f64 / MIB;
    let measured_diff = peak_f16 - peak_q8;
    eprintln!(
        "peak RSS f16 {peak_f16:.1} MiB, q8_0 {peak_q8:.1} MiB: {measured_diff:.1} MiB apart, \
         the ledger's kv terms {ledger_diff:.1} MiB"
    );
    assert!(
        (measured_diff - ledger_diff).abs() < 4.0,
        "peak RSS f16 {peak_f16:.1} vs q8_0 {peak_q8:.1} MiB: {measured_diff:.1} MiB apart, \
         the ledger says {ledger_diff:.1}"
    );
    // Everything the run touched is within the ledger's expected peak.
    for (name, s, peak) in [("q8_0", &status, peak_q8), ("f16", &f16, peak_f16)] {
        let expected = s["memory"]["expected_peak_bytes"]
            .as_u64()
            .expect("expected") as f64;
        assert!(
            peak <= expected / MIB,
            "{name}: peak {peak:.1} MiB over the expected {:.1}",
            expected / MIB
        );
    }
}

#[test]
fn the_native_backend_refuses_a_quantized_kv_type_with_exit_2_before_binding() {
    let (status, log) = Daemon::run_to_exit(
        &[
            "--backend",
            "native",
            "--device",
            "cpu",
            "--kv-type",
            "q8_0",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("--kv-type q8_0: the native backend keeps its KV cache in f16 only"),
        "{log}"
    );
    assert!(!log.contains("listening on"), "{log}");
}

async fn ask(d: &Daemon) -> (String, u64) {
    let v = d.chat(&paris()).await;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    (text_of(&v), cached)
}

async fn saved_and_stopped(d: Daemon) {
    d.wait_metrics(SETTLE, "the idle slot saved to disk", |m| {
        series(m, "inferloop_prompt_cache_entries{tier=\"disk\"}") >= 1.0
    })
    .await;
    stop(d).await;
}

#[tokio::test]
async fn disk_entries_of_an_f16_run_are_never_restored_into_a_q8_0_run() {
    let state = tempfile::tempdir().expect("tmp");
    let d = start_on(state.path(), &["--kv-type", "f16"]).await;
    let (_, cached) = ask(&d).await;
    assert_eq!(cached, 0);
    saved_and_stopped(d).await;

    // q8_0 on the same directory: the f16 entry is another layout, dropped at the scan.
    let d = start_on(state.path(), &["--kv-type", "q8_0"]).await;
    let m = d.metrics().await;
    assert!(
        series(
            &m,
            "inferloop_prompt_cache_dropped_total{tier=\"disk\",reason=\"mismatch\"}"
        ) >= 1.0,
        "{m}"
    );
    let (first, cached) = ask(&d).await;
    assert_eq!(cached, 0, "nothing of the f16 run is restored");
    assert!(first.contains("Paris"), "{first:?}");
    saved_and_stopped(d).await;

    // Its own q8_0 entry comes back after a restart, and gives the same text.
    let d = start_on(state.path(), &["--kv-type", "q8_0"]).await;
    let (again, cached) = ask(&d).await;
    assert!(
        cached > 64,
        "quantized rows restored from disk: {cached} cached"
    );
    assert_eq!(
        again, first,
        "exact mode: restored q8_0 rows give the same text"
    );
    let m = d.metrics().await;
    assert_eq!(
        series(&m, "inferloop_prompt_cache_hit_tokens_total{tier=\"disk\"}"),
        cached as f64
    );
}

#[test]
fn golden_compares_q8_0_kv_with_f16_kv_on_weights_the_native_pass_cannot_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "Explain in two sentences why the sky is blue.\nList three uses of copper.\n",
    )
    .expect("write prompts");
    let model = crate::harness::find_model().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferloopd"))
        .args(["golden", "--model"])
        .arg(&model)
        .arg("--prompts")
        .arg(&prompts)
        .args([
            "--kv-type",
            "q8_0",
            "--continue",
            "8",
            "--threads",
            "1",
            "--json",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run inferloopd golden");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}:\n{stderr}", out.status);
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(
        report["candidate"],
        "llama.cpp with q8_0 KV (reference: f16 KV)"
    );
    let positions = report["positions"].as_u64().expect("positions");
    assert!(positions > 40, "{report}");
    // On all of bench/golden-prompts.txt q8_0's mean KL is 4.2e-3 and its top-1
    // agreement 96.8% (docs/benchmarks.md); two prompts stay well inside ten times that.
    let mean_kl = report["mean_kl"].as_f64().expect("mean_kl");
    assert!(mean_kl > 0.0 && mean_kl < 0.04, "{report}");
    assert!(
        report["top1_agreement"].as_f64().expect("top1") >= 0.85,
        "{report}"
    );
}
