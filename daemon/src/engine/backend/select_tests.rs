//! The selection and its refusals, with the GPU probe and the weights' types stubbed.

use super::*;
use crate::exit::ExitCode;

fn gpu() -> Result<String, String> {
    Ok("Orin".into())
}

fn none() -> Result<String, String> {
    Err("no CUDA driver found: libcuda.so.1 cannot be loaded".into())
}

fn q8() -> Option<String> {
    None
}

fn q4() -> Option<String> {
    Some("tensor `blk.0.attn_q.weight` is q4_1".into())
}

fn metrics(s: Selection) -> String {
    crate::metrics::text::render(move |w| s.render_metrics(w))
}

#[test]
fn native_runs_on_the_cpu_when_asked_or_without_a_gpu_under_auto() {
    for device in [DeviceChoice::Cpu, DeviceChoice::Auto] {
        let s = select(BackendChoice::Native, device, Some(true), none, q8).unwrap();
        assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cpu));
        assert_eq!(s.gpu, None);
    }
    // --device cpu never probes, whatever the fallback says.
    let s = select(
        BackendChoice::Native,
        DeviceChoice::Cpu,
        Some(false),
        || panic!("no probe"),
        q8,
    )
    .unwrap();
    assert_eq!((s.device, s.gpu_error), (Device::Cpu, None));
}

#[test]
fn native_runs_on_cuda_when_asked_or_found_with_q8_0_weights() {
    let s = select(
        BackendChoice::Native,
        DeviceChoice::Cuda,
        Some(false),
        gpu,
        q8,
    )
    .unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cuda));
    assert_eq!(s.gpu.as_deref(), Some("Orin"));
    assert!(s.why.contains("Orin"), "{}", s.why);
    for backend in [BackendChoice::Auto, BackendChoice::Native] {
        for fallback in [None, Some(false), Some(true)] {
            let s = select(backend, DeviceChoice::Auto, fallback, gpu, q8).unwrap();
            assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cuda));
            assert_eq!(s.gpu_error, None);
        }
    }
    let err = select(
        BackendChoice::Native,
        DeviceChoice::Cuda,
        Some(false),
        gpu,
        q4,
    )
    .unwrap_err();
    assert!(
        matches!(&err, SelectError::NativeNeedsQ8(t) if t.contains("attn_q")),
        "{err}"
    );
    assert_eq!(err.exit_code(), ExitCode::Usage);
    for fallback in [None, Some(false), Some(true)] {
        let err = select(BackendChoice::Llama, DeviceChoice::Cuda, fallback, gpu, q8).unwrap_err();
        assert_eq!(err, SelectError::LlamaCpuOnly);
        assert_eq!(err.exit_code(), ExitCode::Usage);
    }
}

#[test]
fn device_cuda_without_a_gpu_refuses_with_exit_4_naming_the_reason() {
    for backend in [BackendChoice::Auto, BackendChoice::Native] {
        let err = select(backend, DeviceChoice::Cuda, Some(false), none, q8).unwrap_err();
        assert_eq!(
            err,
            SelectError::NoGpu {
                device: "cuda",
                why: none().unwrap_err()
            }
        );
        assert_eq!(err.exit_code(), ExitCode::ModelLoad);
        let text = err.to_string();
        assert!(
            text.starts_with("--device cuda: the CUDA GPU cannot be opened: no CUDA driver")
                && text.contains("libcuda.so.1")
                && text.contains("cpu_fallback = false"),
            "{text}"
        );
    }
    // The llama.cpp refusal is a usage error whether or not a GPU is there.
    assert_eq!(
        select(
            BackendChoice::Llama,
            DeviceChoice::Cuda,
            Some(false),
            || panic!("no probe"),
            q8
        ),
        Err(SelectError::LlamaCpuOnly)
    );
}

#[test]
fn auto_without_cpu_fallback_refuses_only_when_the_gpu_would_serve() {
    let err = select(
        BackendChoice::Auto,
        DeviceChoice::Auto,
        Some(false),
        none,
        q8,
    )
    .unwrap_err();
    assert!(
        matches!(&err, SelectError::NoGpu { device: "auto", .. }),
        "{err}"
    );
    assert_eq!(err.exit_code(), ExitCode::ModelLoad);
    // llama.cpp never wants the GPU; with a GPU, weights that are not Q8_0 decide (no
    // failure to open anything).
    let s = select(
        BackendChoice::Llama,
        DeviceChoice::Auto,
        Some(false),
        none,
        q8,
    )
    .unwrap();
    assert_eq!((s.backend, s.gpu_error), (BackendKind::LlamaCpp, None));
    let s = select(
        BackendChoice::Auto,
        DeviceChoice::Auto,
        Some(false),
        gpu,
        q4,
    )
    .unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
    assert_eq!(s.gpu_error, None);
}

#[test]
fn cpu_fallback_serves_on_the_cpu_and_says_why() {
    let s = select(
        BackendChoice::Auto,
        DeviceChoice::Cuda,
        Some(true),
        none,
        q8,
    )
    .unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
    assert_eq!(s.gpu, None);
    assert_eq!(s.gpu_error, Some(none().unwrap_err()));
    assert!(
        s.why
            .starts_with("--device cuda: the CUDA GPU cannot be opened (no CUDA driver")
            && s.why.contains("cpu_fallback = true"),
        "{}",
        s.why
    );
    let s = select(
        BackendChoice::Native,
        DeviceChoice::Cuda,
        Some(true),
        none,
        q8,
    )
    .unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::Native, Device::Cpu));
    let text = metrics(s);
    assert!(text.contains("\ninferloop_cpu_fallback 1\n"), "{text}");
    assert!(
        text.contains("inferloop_backend_info{backend=\"native\",device=\"cpu\"} 1\n"),
        "{text}"
    );
    // Auto without a GPU and nothing said: the CPU, as on any machine without one, and no
    // fallback flagged. `cpu_fallback = true` said explicitly flags it.
    let s = select(BackendChoice::Auto, DeviceChoice::Auto, None, none, q8).unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
    assert_eq!(s.gpu_error, None);
    assert!(s.why.starts_with("no CUDA GPU"), "{}", s.why);
    let s = select(
        BackendChoice::Auto,
        DeviceChoice::Auto,
        Some(true),
        none,
        q8,
    )
    .unwrap();
    assert_eq!(
        (s.backend, s.gpu_error),
        (BackendKind::LlamaCpp, Some(none().unwrap_err()))
    );
    // And `--device cuda` with nothing said refuses, as `cpu_fallback = false` does.
    assert!(matches!(
        select(BackendChoice::Native, DeviceChoice::Cuda, None, none, q8),
        Err(SelectError::NoGpu { device: "cuda", .. })
    ));
}

#[test]
fn auto_is_llama_cpp_on_the_cpu_and_says_why() {
    let s = select(BackendChoice::Auto, DeviceChoice::Auto, Some(true), gpu, q4).unwrap();
    assert_eq!((s.backend, s.device), (BackendKind::LlamaCpp, Device::Cpu));
    assert!(s.why.contains("blk.0.attn_q.weight"), "{}", s.why);
    let s = select(
        BackendChoice::Auto,
        DeviceChoice::Cpu,
        Some(false),
        || panic!("no probe"),
        q4,
    )
    .unwrap();
    assert_eq!(s.backend, BackendKind::LlamaCpp);
}

#[test]
fn the_backend_device_and_gpu_are_exported_and_shown() {
    let s = select(
        BackendChoice::Auto,
        DeviceChoice::Cuda,
        Some(false),
        gpu,
        q8,
    )
    .unwrap();
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        serde_json::json!({
            "name": "native",
            "device": "cuda",
            "gpu": "Orin",
            "reason": "--device cuda: the native backend on Orin",
        })
    );
    let text = metrics(s);
    assert!(
        text.contains(
            "inferloop_backend_info{backend=\"native\",device=\"cuda\",gpu=\"Orin\"} 1\n"
        ),
        "{text}"
    );
    assert!(text.contains("\ninferloop_cpu_fallback 0\n"), "{text}");
}

#[test]
fn embeddings_are_offered_by_llama_cpp_and_native_on_the_cpu_but_not_on_cuda() {
    let llama = select(BackendChoice::Llama, DeviceChoice::Auto, None, none, q4).unwrap();
    assert!(llama.capabilities().embeddings);
    let cpu = select(BackendChoice::Native, DeviceChoice::Cpu, None, none, q8).unwrap();
    assert!(cpu.capabilities().embeddings);
    let cuda = select(
        BackendChoice::Native,
        DeviceChoice::Cuda,
        Some(false),
        gpu,
        q8,
    )
    .unwrap();
    assert_eq!(cuda.device, Device::Cuda);
    assert!(!cuda.capabilities().embeddings);
    // The rest of the native capabilities do not depend on the device.
    assert_eq!(
        (
            cuda.capabilities().logprobs,
            cuda.capabilities().own_weights
        ),
        (true, true)
    );
}

#[test]
fn native_refuses_a_quantized_kv_type_as_a_usage_error_and_llama_cpp_takes_it() {
    use crate::config::{KvType, KvTypes};
    use crate::engine::plan::{EnginePlan, PlanSpec};
    let plan = |kv_type| {
        EnginePlan::new(PlanSpec {
            kv_type,
            ..PlanSpec::new(2, 1024)
        })
        .expect("valid plan")
    };
    let native = select(BackendChoice::Native, DeviceChoice::Cpu, None, none, q8).unwrap();
    let llama = select(BackendChoice::Llama, DeviceChoice::Auto, None, none, q4).unwrap();
    assert_eq!(native.check_plan(&plan(KvTypes::F16)), Ok(()));
    let q8_v_f16 = KvTypes {
        k: KvType::Q8_0,
        v: KvType::F16,
    };
    for kv_type in [
        KvTypes::both(KvType::Q8_0),
        KvTypes::both(KvType::Q4_0),
        q8_v_f16,
    ] {
        let err = native.check_plan(&plan(kv_type)).unwrap_err();
        assert_eq!(
            err,
            SelectError::KvTypeF16Only {
                backend: "native",
                kv_type
            }
        );
        assert_eq!(err.exit_code(), ExitCode::Usage);
        assert!(
            err.to_string()
                .contains(&format!("--kv-type {kv_type}: the native backend")),
            "{err}"
        );
        assert_eq!(llama.check_plan(&plan(kv_type)), Ok(()));
    }
}
