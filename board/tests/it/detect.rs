//! Detection rules on fixture trees, with a fake GPU probe.

use inferloop_board::{
    BoardError, Detector, GpuInfo, GpuProbe, NoGpu, NoGpuProbe, NvmlProbe, Reason, Roots,
};

use crate::fixture;

struct FakeGpu;

impl GpuProbe for FakeGpu {
    fn probe(&self) -> Result<GpuInfo, NoGpu> {
        Ok(GpuInfo {
            name: "NVIDIA H200".into(),
            count: 1,
            compute_capability: None,
            memory_bytes: Some(150_000_000_000),
        })
    }
}

fn detector(name: &str) -> Detector {
    Detector::new(fixture(name))
        .with_gpu_probe(NoGpuProbe)
        .with_arch("aarch64")
}

#[test]
fn orin_nx_16gb_is_found_by_its_module_compatible_string() {
    let d = detector("orin-nx-16gb").detect().expect("detected");
    assert_eq!(d.profile.name, "jetson-orin-nx-16gb");
    match &d.reason {
        Reason::DeviceTree { file, compatible } => {
            assert!(
                file.ends_with("proc/device-tree/compatible"),
                "{}",
                file.display()
            );
            assert_eq!(compatible, "nvidia,p3767-0000");
        }
        other => panic!("expected DeviceTree, got {other:?}"),
    }
    assert_eq!(
        d.compatible,
        [
            "nvidia,p3768-0000+p3767-0000",
            "nvidia,p3767-0000",
            "nvidia,tegra234"
        ]
    );
    assert_eq!(
        d.model.as_deref(),
        Some("NVIDIA Jetson Orin NX Engineering Reference Developer Kit")
    );
    assert_eq!(d.host.cpus_online, Some(8));
    assert_eq!(d.host.mem_total_bytes, Some(15_655_232 * 1024));
}

#[test]
fn orin_nano_devkit_module_is_the_nano_profile() {
    let d = detector("orin-nano").detect().expect("detected");
    assert_eq!(d.profile.name, "jetson-orin-nano-8gb");
    assert_eq!(d.reason.kind(), "device_tree");
}

#[test]
fn agx_orin_is_the_agx_profile() {
    let d = detector("agx-orin").detect().expect("detected");
    assert_eq!(d.profile.name, "jetson-agx-orin-64gb");
    assert!(
        matches!(d.reason, Reason::DeviceTree { ref compatible, .. } if compatible == "nvidia,p3701-0005")
    );
}

#[test]
fn device_tree_wins_over_a_gpu_probe() {
    let d = Detector::new(fixture("orin-nx-16gb"))
        .with_gpu_probe(FakeGpu)
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "jetson-orin-nx-16gb");
    assert!(
        d.gpu.is_none(),
        "NVML is not asked once the device tree matched"
    );
}

#[test]
fn override_wins_over_the_device_tree() {
    let d = detector("orin-nx-16gb")
        .with_override(Some("jetson-orin-nano-8gb".into()))
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "jetson-orin-nano-8gb");
    assert_eq!(
        d.reason,
        Reason::Override {
            name: "jetson-orin-nano-8gb".into()
        }
    );
    assert!(d.reason.to_string().contains("override"));
    // The evidence is still reported.
    assert_eq!(d.compatible.len(), 3);
}

#[test]
fn unknown_override_is_an_error_listing_known_boards() {
    let err = detector("x86")
        .with_override(Some("jetson-tx2".into()))
        .detect()
        .expect_err("unknown board");
    match err {
        BoardError::UnknownBoard { name, known } => {
            assert_eq!(name, "jetson-tx2");
            assert_eq!(known.len(), 9);
        }
        other => panic!("expected UnknownBoard, got {other:?}"),
    }
}

#[test]
fn x86_without_device_tree_or_gpu_falls_back_to_the_cpu_architecture() {
    let d = Detector::new(fixture("x86"))
        .with_gpu_probe(NoGpuProbe)
        .with_arch("x86_64")
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "x86_64-cpu");
    assert_eq!(
        d.reason,
        Reason::CpuArch {
            arch: "x86_64".into()
        }
    );
    assert!(d.reason.to_string().contains("cpu architecture fallback"));
    assert!(d.model.is_none() && d.compatible.is_empty());
    assert!(
        d.notes.iter().any(|n| n.contains("device-tree/compatible")),
        "{:?}",
        d.notes
    );
    assert!(d.notes.iter().any(|n| n.contains("GPU probing disabled")));
    assert_eq!(d.host.cpus_online, Some(2));
}

#[test]
fn x86_with_a_cuda_gpu_is_the_dgpu_profile() {
    let d = Detector::new(fixture("x86"))
        .with_gpu_probe(FakeGpu)
        .with_arch("x86_64")
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "cuda-dgpu");
    assert_eq!(
        d.reason,
        Reason::CudaGpu {
            gpu: "NVIDIA H200".into()
        }
    );
    assert_eq!(d.gpu.as_ref().map(|g| g.count), Some(1));
}

#[test]
fn unknown_tegra234_module_falls_back_with_a_note_naming_the_soc() {
    let d = detector("tegra234-unknown-module")
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "aarch64-cpu");
    assert_eq!(d.reason.kind(), "cpu_arch");
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("nvidia,tegra234") && n.contains("--board")),
        "{:?}",
        d.notes
    );
}

#[test]
fn architecture_without_a_profile_is_an_error() {
    let err = Detector::new(fixture("x86"))
        .with_gpu_probe(NoGpuProbe)
        .with_arch("riscv64")
        .detect()
        .expect_err("no profile");
    assert!(matches!(err, BoardError::UnsupportedArch { ref arch, .. } if arch == "riscv64"));
    assert_eq!(err.kind(), "unsupported_arch");
}

#[test]
fn missing_roots_are_not_an_error() {
    let d = Detector::new(Roots::under("/nonexistent/inferloop"))
        .with_gpu_probe(NoGpuProbe)
        .with_arch("x86_64")
        .detect()
        .expect("detected");
    assert_eq!(d.profile.name, "x86_64-cpu");
    assert_eq!(d.host, Default::default());
}

#[test]
fn absent_nvml_library_is_a_logged_miss_not_an_error() {
    // On machines without libnvidia-ml (CI) this is the fallback path; on a GPU machine the
    // probe finds the GPU. Both are fine: the probe never fails detection.
    match NvmlProbe.probe() {
        Ok(gpu) => assert!(gpu.count >= 1, "NVML found {gpu:?}"),
        Err(miss) => assert!(!miss.reason.is_empty()),
    }
}

#[test]
fn this_machine_is_detected_without_error() {
    let d = Detector::new(Roots::default())
        .detect()
        .expect("real /proc and /sys");
    eprintln!("this machine: {} because {}", d.profile.name, d.reason);
}

#[test]
fn detection_serializes_with_the_rule_name() {
    let d = detector("orin-nx-16gb").detect().expect("detected");
    let json = serde_json::to_value(&d).expect("serializes");
    assert_eq!(json["reason"]["rule"], "device_tree");
    assert_eq!(json["profile"]["gpu"]["compute_capability"], "8.7");
}
