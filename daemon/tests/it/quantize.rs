//! `inferloopd quantize`: the test model requantized to Q8_0 by llama.cpp, checked tensor by
//! tensor and served; and the refusals, with their exit codes, that leave no output behind.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use inferloopd::quantize::GgufTypes;

use crate::harness::{chat_body, find_model, text_of, Daemon};

/// Q8_0 stores 34 bytes per 32 weights; SmolLM2-135M has 134.5 M parameters (about 144 MB).
/// The bounds leave room for the header and the F32 norms, not for a wrong type (F16 would be
/// 270 MB, Q4_1 98 MB).
const Q8_BYTES: std::ops::RangeInclusive<u64> = 130_000_000..=160_000_000;

/// `inferloopd quantize --in input --out output --type ty`.
fn quantize(input: &Path, output: &Path, ty: &str) -> Output {
    let (input, output) = (path_str(input), path_str(output));
    Command::new(env!("CARGO_BIN_EXE_inferloopd"))
        .arg("quantize")
        .args(["--in", input, "--out", output, "--type", ty])
        // The harness's rule: one llama.cpp thread per test process on a 2-core box.
        .args(["--threads", "1"])
        .env("RUST_LOG", "info,llama-cpp-2=warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot run inferloopd quantize: {e}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The files in `dir`, sorted: a failed run must not leave a partial file.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the temp dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn q8_0_requantization_keeps_norms_f32_and_serves_a_sensible_answer() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("model.Q8_0.gguf");

    let started = Instant::now();
    let out = quantize(&model, &out_path, "q8_0");
    let took = started.elapsed();
    let log = stderr(&out);
    assert!(out.status.success(), "{}:\n{log}", out.status);
    assert!(log.contains("quantized"), "no summary line:\n{log}");
    assert_eq!(
        files_in(dir.path()),
        ["model.Q8_0.gguf"],
        "a partial file stayed"
    );
    eprintln!("quantized in {took:?}");

    let size = std::fs::metadata(&out_path).expect("output").len();
    assert!(
        Q8_BYTES.contains(&size),
        "{size} bytes is not a Q8_0 135M model"
    );

    // llama.cpp quantizes every 2-D weight at the file's type and leaves 1-D tensors F32.
    let types = GgufTypes::read(&out_path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(types.file_type, "q8_0");
    assert!(!types.tensors.is_empty());
    for t in &types.tensors {
        let want = if t.n_dims >= 2 { "q8_0" } else { "f32" };
        assert_eq!(t.ggml_type, want, "{} ({}-D)", t.name, t.n_dims);
    }
    assert!(
        types.tensors.iter().any(|t| t.n_dims == 1),
        "no norms found: {}",
        types.histogram()
    );

    let out_arg = path_str(&out_path).to_string();
    let d = Daemon::start(&["--model", &out_arg, "--slots", "1", "--ctx", "512"]);
    let v = d
        .chat(&chat_body("What is the capital of France?", 24))
        .await;
    let text = text_of(&v);
    eprintln!("Q8_0 answer: {text:?}");
    let letters = text.chars().filter(|c| c.is_ascii_alphabetic()).count();
    assert!(
        letters * 2 > text.chars().count(),
        "mostly letters expected: {text:?}"
    );
    let lower = text.to_lowercase();
    assert!(
        ["paris", "france", "capital"]
            .iter()
            .any(|w| lower.contains(w)),
        "not an answer to the question: {text:?}"
    );
}

#[test]
fn quantize_a_missing_input_exits_2_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("absent.gguf");
    let out_path = dir.path().join("out.gguf");
    let out = quantize(&missing, &out_path, "q8_0");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("absent.gguf"),
        "the message must name the input:\n{log}"
    );
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn quantize_refuses_to_overwrite_its_input_with_exit_2() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("temp dir");
    // A link to the model, so the refusal is shown without touching the shared model file.
    let input = dir.path().join("model.gguf");
    std::os::unix::fs::symlink(&model, &input).expect("symlink");
    let before = std::fs::metadata(&model).expect("model").modified().ok();
    let out = quantize(&input, &model, "q8_0");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(log.contains("is the input"), "{log}");
    assert_eq!(
        std::fs::metadata(&model).expect("model").modified().ok(),
        before
    );
    assert_eq!(files_in(dir.path()), ["model.gguf"]);
}

#[test]
fn quantize_into_a_missing_directory_exits_2() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("no/such/dir/out.gguf");
    let out = quantize(&model, &out_path, "q8_0");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(log.contains("does not exist"), "{log}");
}

#[test]
fn quantize_an_unknown_type_is_a_usage_error_listing_the_types() {
    let model = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("out.gguf");
    let out = quantize(&model, &out_path, "q3_k");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(log.contains("q8_0"), "clap must list the types:\n{log}");
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn quantize_a_gguf_that_is_no_model_exits_4_and_leaves_no_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("broken.gguf");
    // A valid GGUF v3 header with no tensors and no keys: it parses, but llama.cpp finds no
    // architecture to load, so its quantizer fails.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(&input, bytes).expect("write");
    let out_path = dir.path().join("out.gguf");
    let out = quantize(&input, &out_path, "q8_0");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{log}");
    assert!(log.contains("could not quantize"), "{log}");
    assert!(
        log.contains("broken.gguf") && log.contains("out.gguf"),
        "{log}"
    );
    assert_eq!(files_in(dir.path()), ["broken.gguf"]);
}
