//! `--backend native`: the Q8_0 model served by the native forward pass on the CPU (chat,
//! streaming, two requests at once, reported in `/v1/status` and `/metrics`), and the
//! refusals: weights that are not Q8_0 (exit 4, naming a tensor), `--device cuda` where no
//! libcuda can be loaded (exit 4, naming why; the CPU with `--cpu-fallback`), and
//! combinations the GPU cannot run (exit 2).

use std::path::PathBuf;
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use inferloopd::quantize::GgufTypes;
use serde_json::{json, Value};

use crate::harness::{
    chat_body, counting_body, find_model, stream_finish_reason, stream_text, text_of, Daemon,
};

/// `make model-q8` writes it; built here from the test model when missing.
const Q8_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../models/SmolLM2-135M-Instruct.Q8_0.gguf"
);

/// The Q8_0 model, quantized once per test run if it is not there (`inferloopd quantize`
/// writes a temporary file and renames it, so a concurrent reader never sees half a file).
static Q8: LazyLock<Result<PathBuf, String>> = LazyLock::new(|| {
    let path = PathBuf::from(Q8_PATH);
    if path.is_file() {
        return Ok(path);
    }
    let source = find_model()?;
    let out = Command::new(env!("CARGO_BIN_EXE_inferloopd"))
        .args(["quantize", "--type", "q8_0", "--threads", "1", "--in"])
        .arg(&source)
        .arg("--out")
        .arg(&path)
        .output()
        .map_err(|e| format!("cannot run inferloopd quantize: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "quantizing {} to Q8_0 failed ({}):\n{}",
            source.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(path)
});

fn q8() -> String {
    match &*Q8 {
        Ok(p) => p.to_str().expect("UTF-8 path").to_string(),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn native_backend_answers_streams_and_runs_two_requests_at_once() {
    let model = q8();
    let d = Daemon::start(&[
        "--model",
        &model,
        "--backend",
        "native",
        "--device",
        "cpu",
        "--slots",
        "2",
        "--ctx",
        "512",
    ]);
    let status = d.status().await;
    assert_eq!(
        status["backend"],
        json!({"name": "native", "device": "cpu", "reason": "--backend native on the CPU (--device cpu)"}),
        "{status}"
    );
    assert!(
        status["llama"].is_null(),
        "llama.cpp does not serve: {status}"
    );
    assert_eq!(status["native"]["device"], "cpu", "{status}");
    let isa = status["native"]["cpu_isa"].as_str().unwrap_or_default();
    assert!(["avx2", "neon", "scalar"].contains(&isa), "{status}");
    let metrics = d.metrics().await;
    assert!(
        metrics.contains("inferloop_backend_info{backend=\"native\",device=\"cpu\"} 1\n"),
        "{metrics}"
    );
    assert!(d.log().contains("scratchMB="), "{}", d.log_tail());

    let v = d
        .chat(&chat_body("Name the capital city of France.", 24))
        .await;
    let text = text_of(&v);
    eprintln!(
        "native answer: {text:?}, decode {:.1} tok/s",
        v["timings"]["predicted_per_second"].as_f64().unwrap_or(0.0)
    );
    assert!(text.contains("Paris"), "{text:?}");

    let mut body = chat_body("Name the capital city of France.", 24);
    body["stream"] = json!(true);
    let chunks = d.stream("/v1/chat/completions", &body).await;
    let streamed = stream_text(&chunks);
    assert_eq!(
        streamed, text,
        "streamed and whole answers differ at temperature 0"
    );
    assert!(!stream_finish_reason(&chunks).is_empty());

    // logprobs and logit_bias: the native sampler reports the same shape as llama.cpp's.
    let mut body = chat_body("Name the capital city of France.", 6);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = d.chat(&body).await;
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs: {v}"))
        .clone();
    assert!(!content.is_empty(), "{v}");
    for e in &content {
        let lp = e["logprob"].as_f64().expect("logprob");
        assert!(lp <= 0.0, "{e}");
        assert_eq!(e["top_logprobs"][0]["token"], e["token"], "{e}");
    }
    let first = content[0]["token"].as_str().expect("token");
    let t = d
        .post_ok(
            "/tokenize",
            &json!({"content": first, "parse_special": false}),
        )
        .await;
    let id = t["tokens"][0].as_i64().expect("id");
    body["logit_bias"] = json!({ id.to_string(): -100 });
    let banned = d.chat(&body).await;
    assert_ne!(
        banned["choices"][0]["logprobs"]["content"][0]["token"], content[0]["token"],
        "{banned}"
    );

    let counting = counting_body(32, false);
    let t0 = Instant::now();
    let (a, b) = tokio::join!(d.complete(&counting), d.complete(&counting));
    let took = t0.elapsed();
    for v in [&a, &b] {
        assert_eq!(v["usage"]["completion_tokens"], 32, "{v}");
    }
    assert_eq!(text_of(&a), text_of(&b), "same prompt, same greedy tokens");
    eprintln!(
        "two concurrent 32-token completions in {took:?} ({:.1} tok/s together)",
        64.0 / took.as_secs_f64()
    );

    // No grammar sampler on this backend: constrained output is refused by name.
    let mut body = crate::harness::chat_body("x", 4);
    body["response_format"] = json!({"type": "json_object"});
    let resp = d.post("/v1/chat/completions", &body).await;
    crate::harness::assert_error(resp, 400, Some("response_format"), None).await;
    // llama-server's grammar fields too, each named by itself.
    let mut body = crate::harness::chat_body("x", 4);
    body["json_schema"] = json!({"type": "object"});
    let resp = d.post("/v1/chat/completions", &body).await;
    crate::harness::assert_error(resp, 400, Some("json_schema"), None).await;
    // The penalties are in this backend's chain too: llama-server's repeat penalty acts,
    // and a zero window turns it off.
    let ask = |extra: Value| {
        let mut b = crate::harness::chat_body("List the numbers from one to twenty, in words.", 48);
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    let text = |v: Value| crate::harness::text_of(&v);
    let plain = text(d.chat(&ask(json!({}))).await);
    let penalized = text(d.chat(&ask(json!({"repeat_penalty": 1.8}))).await);
    let windowless = text(
        d.chat(&ask(json!({"repeat_penalty": 1.8, "repeat_last_n": 0})))
            .await,
    );
    assert_ne!(penalized, plain, "the penalty acted");
    assert_eq!(windowless, plain);
}

#[test]
fn native_backend_refuses_weights_that_are_not_q8_0_naming_a_tensor() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let types = GgufTypes::read(&model).unwrap_or_else(|e| panic!("{e}"));
    if types.file_type == "q8_0" {
        eprintln!(
            "skipped: the test model {} is already Q8_0 (set INFERLOOP_TEST_MODEL to Q4_1)",
            model.display()
        );
        return;
    }
    let model = model.to_str().expect("UTF-8 path").to_string();
    let (status, log) = Daemon::run_to_exit(
        &["--model", &model, "--backend", "native", "--device", "cpu"],
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(4), "{log}");
    // The first tensor the loader meets may be another type than the file's (an
    // embedding kept at Q6_K, say); the message names that tensor and its type.
    assert!(
        log.contains("native backend: tensor `") && log.contains("; the native backend needs"),
        "the error must name a tensor and its type:\n{log}"
    );
}

#[test]
fn native_backend_with_a_shared_kv_pool_is_a_usage_error() {
    let model = q8();
    let (status, log) = Daemon::run_to_exit(
        &[
            "--model",
            &model,
            "--backend",
            "native",
            "--device",
            "cpu",
            "--slots",
            "2",
            "--ctx",
            "512",
            "--kv-cells",
            "700",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("no shared pool yet"), "{log}");
}

/// True when a libcuda is installed system-wide (in the loader's cache), where no
/// LD_LIBRARY_PATH can hide it; the tests that need its absence then say so and check nothing.
fn system_libcuda() -> bool {
    let cached = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
        .unwrap_or(false);
    if cached {
        eprintln!("libcuda.so.1 is installed system-wide here: its absence cannot be tested");
    }
    cached
}

/// An empty directory as the whole library path: the CUDA emulator a CI run exports is not
/// found either.
fn no_libcuda() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn device_cuda_without_libcuda_refuses_to_start_with_exit_4_naming_the_reason() {
    if system_libcuda() {
        return;
    }
    let empty = no_libcuda();
    let path = empty.path().to_str().expect("UTF-8 path");
    let model = q8();
    for (backend, fallback) in [("native", None), ("auto", Some("false"))] {
        let mut args = vec!["--model", &model, "--backend", backend, "--device", "cuda"];
        if let Some(f) = fallback {
            args.extend(["--cpu-fallback", f]);
        }
        let (status, log) = Daemon::run_to_exit_with_env(
            &args,
            &[("LD_LIBRARY_PATH", path)],
            Duration::from_secs(60),
        );
        assert_eq!(status.code(), Some(4), "{backend}: {log}");
        let want = format!(
            "--device cuda: the CUDA GPU cannot be opened: no CUDA driver found: libcuda.so.1 \
             cannot be loaded (no NVIDIA driver on this machine, or not on the library path); \
             LD_LIBRARY_PATH is \"{path}\"; refusing to start (cpu_fallback = false"
        );
        assert!(log.contains(&want), "{backend}: want {want:?} in\n{log}");
        assert!(!log.contains("listening on"), "{backend}: {log}");
    }
}

#[tokio::test]
async fn device_cuda_with_cpu_fallback_serves_on_the_cpu_and_says_so() {
    if system_libcuda() {
        return;
    }
    let empty = no_libcuda();
    let path = empty.path().to_str().expect("UTF-8 path");
    let d = Daemon::try_start_with_env(
        &[
            "--device",
            "cuda",
            "--cpu-fallback",
            "--slots",
            "1",
            "--ctx",
            "256",
        ],
        &[("LD_LIBRARY_PATH", path)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (status, metrics) = (d.status().await, d.metrics().await);
    let backend = &status["backend"];
    assert_eq!(
        (&backend["name"], &backend["device"], &backend["gpu"]),
        (&json!("llama.cpp"), &json!("cpu"), &json!(null)),
        "{status}"
    );
    let reason = backend["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("--device cuda: the CUDA GPU cannot be opened (no CUDA driver found")
            && reason.contains("cpu_fallback = true"),
        "{status}"
    );
    assert!(
        backend["gpu_error"]
            .as_str()
            .is_some_and(|e| e.contains("libcuda.so.1")),
        "{status}"
    );
    assert!(
        metrics.contains("\ninferloop_cpu_fallback 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("inferloop_backend_info{backend=\"llama.cpp\",device=\"cpu\"} 1\n"),
        "{metrics}"
    );
    let log = d.log();
    assert!(
        log.contains("WARN") && log.contains("backend selected: CPU fallback"),
        "{}",
        d.log_tail()
    );
}

#[test]
fn llama_on_cuda_or_native_on_cuda_with_weights_not_q8_0_is_a_usage_error() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let model = model.to_str().expect("UTF-8 path").to_string();
    let (status, log) = Daemon::run_to_exit(
        &["--model", &model, "--backend", "llama", "--device", "cuda"],
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("CPU only"), "{log}");
    // The test model is Q4_1: exit 2 on a GPU; here, without one, the GPU is refused first.
    let (status, log) = Daemon::run_to_exit(
        &["--model", &model, "--backend", "native", "--device", "cuda"],
        Duration::from_secs(60),
    );
    let gpu_here = !log.contains("the CUDA GPU cannot be opened");
    match gpu_here {
        true => {
            assert_eq!(status.code(), Some(2), "{log}");
            assert!(log.contains("runs Q8_0 weights"), "{log}");
        }
        false => assert_eq!(status.code(), Some(4), "{log}"),
    }
}
